#!/usr/bin/env bash
# Session 16, optional after flush_rows_call.sh: Nsight Compute metrics of the KDA flush and non-flush kernels on
# Kimi Linear at B = 256, for the shared-memory reading of session16/README.md. Pack .device/pack16.tar.xz.
#   PAIRS="0/0 2/64" (default): flush variant / staged rows, as REPLAYSSM_KDA_FLUSH_VARIANT and
#   REPLAYSSM_KDA_NONFLUSH_STAGED_ROWS of the experiment library.
# The first 160 launches of the two kernels in one bench run are profiled. (Session 18: those are all the
# staggered row's, 6 calls x 16 steps x 2 kernels at --repeats 3, not the flush-step row's as this comment first
# said; session18/ncu_targets_call.sh picks the rows' launches by count.)
# Per launch: duration, DRAM throughput, shared-memory wavefronts (and their share of peak), issue activity,
# active warps. ncu_<pair>.csv per pair; summarise with: python3 ncu_summary.py r/ncu_*.csv
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session16/flush_rows_ncu.sh
source "$(dirname "$0")/../device_common.sh"
unpack_pack .device/pack16.tar.xz lib_land
EXP=$A/lib_exp$SYS
METRICS=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
METRICS=$METRICS,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
for pair in ${PAIRS:-0/0 2/64}; do t0=$SECONDS
  v=${pair%/*}; s=${pair#*/}
  REPLAYSSM_KDA_FLUSH_VARIANT=$v REPLAYSSM_KDA_NONFLUSH_STAGED_ROWS=$s LD_LIBRARY_PATH=$EXP timeout -s INT 200 \
    ncu --clock-control none --kernel-name-base demangled -k "regex:kda_(flush|nonflush)_kernel" -c 160 --metrics $METRICS --print-units base \
    --csv --page raw $B/replayssm-bench bench --shapes kimi-linear-48b-a3b --batch 256 --window 16 --drafts 8 --repeats 3 \
    --no-check --arena-gib 24 > $R/ncu_${v}_$s.csv 2> $R/ncu_${v}_$s.log
  echo "ncu pair $pair rc=$? $((SECONDS-t0))s $(wc -l < $R/ncu_${v}_$s.csv) lines"
done
pack_results
