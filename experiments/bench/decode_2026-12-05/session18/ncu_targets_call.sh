#!/usr/bin/env bash
# Session 18: Nsight Compute on the kernels behind the targets of issue 13 that main misses, one shape per
# recurrence at B = 256, L = 16, T = 8: Nemotron-3-Super (Mamba-2), Qwen3.5-4B (GDN), Kimi Linear (KDA).
# Pack $PACK (default .device/pack18.tar.xz: bin/, sys/ as pack16; lib_land/ = main's library with session 18's landings (the KDA
# flush rows, the batched verification fold)); $LIB (default lib_land) the library folder in it.
# Each profile is of chosen launches of one bench run (--repeats 3 --no-check), found by counting: a row's
# measurement is time_us, repeats + 3 = 6 calls; the staggered row is 6 calls of L = 16 steps; every replay
# step launches the flush kernel, then the non-flush kernel (blocks with nothing to do return). So, per kernel
# (function name), launches counted from 0:
#   conventional fp32 row: conventional kernel 0-5;
#   non-flush step row:    non-flush kernel 96-101;   flush step row: flush kernel 102-107;
#   nvfp4 read row:        non-flush kernel 120-125 (after the flush row's 6, fp16's 6 and fp8's 6);
#   verify with flush:     verify kernel 6-11 (after the no-flush row's 6).
# Each window is taken 6 wider than needed where the neighbour's launches are short (flush: 96-107), and
# ncu_targets.py reports the longest launches with their demangled names, so that a miscount shows (the
# wrong instance, or a duration far from the bench's row; the bench's own table is kept beside each CSV).
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session18/ncu_targets_call.sh
source "$(dirname "$0")/../device_common.sh"
unpack_pack ${PACK:-.device/pack18.tar.xz} ${LIB:-lib_land}
LP=$A/${LIB:-lib_land}$SYS
LD_LIBRARY_PATH=$LP $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum
LIMIT=${LIMIT:-560}  # seconds this script may take (a caller that ran something first passes less)
profile() {  # name shape kernel skip count
  local t0=$SECONDS
  [ $((LIMIT - SECONDS)) -lt 60 ] && { echo "ncu $1 skipped (time)"; return; }
  LD_LIBRARY_PATH=$LP timeout -s INT $((LIMIT - SECONDS - 20)) ncu --clock-control none --kernel-name-base function --print-kernel-base demangled -k "regex:^$3\$" \
    --launch-skip $4 --launch-count $5 $SECTIONS --metrics $EXTRA --csv --page raw --print-units base \
    $B/replayssm-bench bench --shapes $2 --batch 256 --window 16 --drafts 8 --repeats 3 --no-check --arena-gib 24 \
    > $R/ncu_$1.out 2> $R/ncu_$1.log
  echo "ncu $1 ($2, $3, launches $4+$5) rc=$? $((SECONDS-t0))s"
}
for shape in nemotron-3-super qwen3.5-4b; do
  s=${shape%%-*}; s=${s%%.*}
  profile ${s}_conv $shape conventional_kernel 0 6
  profile ${s}_nonflush $shape replay_nonflush_kernel 96 6
  profile ${s}_flush $shape replay_flush_kernel 96 12
  profile ${s}_nvfp4 $shape replay_nonflush_kernel 120 6
  profile ${s}_verify_flush $shape verify_kernel 6 6
done
profile kimi_conv kimi-linear-48b-a3b kda_conventional_kernel 0 6
profile kimi_nonflush kimi-linear-48b-a3b kda_nonflush_kernel 96 6
profile kimi_flush kimi-linear-48b-a3b kda_flush_kernel 96 12
profile kimi_nvfp4 kimi-linear-48b-a3b kda_nonflush_kernel 120 6
for f in $R/ncu_*.out; do [ -f "$f" ] || continue; grep '^"' $f > ${f%.out}.csv; grep '^|\|^#' $f > ${f%.out}_bench.txt; rm $f; done
python3 "$(dirname "$0")/ncu_targets.py" $R/ncu_*.csv | tee $R/ncu_targets.txt
pack_results
