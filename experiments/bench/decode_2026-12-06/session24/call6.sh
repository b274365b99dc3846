#!/usr/bin/env bash
# Session 24, call 6 (about TOTAL = 240 s): Nsight Compute on the non-flush kernel of the FP8 and NVFP4 reads,
# main (lib_land) and without the state stream (lib_astream), Qwen3.5-4B and Qwen3.5-122B at B = 256: is the
# no-stream step bound by DRAM or by issue and latency? (No landing rule.) Pack .device/pack35.tar.xz (make_pack35.sh).
# Launch windows as session 18's ncu_targets_call.sh (--repeats 3: each row 6 calls; the staggered row 96 non-flush
# launches, the non-flush step 96-101, the flush step 102-107, the FP16 read 108-113, FP8 114-119, NVFP4 120-125);
# ncu_targets.py prints each profiled instance's name, so a miscount shows.
# Run from the repository root: TOTAL=240 bash experiments/bench/decode_2026-12-06/session24/call6.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-240}
unpack_pack ${PACK:-.device/pack35.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum
profile() {  # name library shape
  local t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 40 ] && { echo "ncu $1 skipped (time)"; return; }
  LD_LIBRARY_PATH=$(lib $2) timeout -s INT $((TOTAL - SECONDS - 15)) ncu --clock-control none --kernel-name-base function \
    --print-kernel-base demangled -k "regex:^replay_nonflush_kernel\$" --launch-skip 114 --launch-count 12 $SECTIONS \
    --metrics $EXTRA --csv --page raw --print-units base $B/replayssm-bench bench --shapes $3 --batch 256 --window 16 \
    --drafts 8 --repeats 3 --no-check --arena-gib 24 > $R/ncu_$1.out 2> $R/ncu_$1.log
  echo "ncu $1 rc=$? $((SECONDS-t0))s"
}
profile qwen4b_astream lib_astream qwen3.5-4b
profile qwen4b_land lib_land qwen3.5-4b
profile qwen122b_astream lib_astream qwen3.5-122b-a10b
profile qwen122b_land lib_land qwen3.5-122b-a10b
for f in $R/ncu_*.out; do [ -f "$f" ] || continue; grep '^"' $f > ${f%.out}.csv; grep '^|\|^#' $f > ${f%.out}_bench.txt; rm $f; done
python3 experiments/bench/decode_2026-12-05/session18/ncu_targets.py --copy-gbps 3000 $R/ncu_*.csv | tee $R/ncu_targets.txt | grep -A4 "^==" | head -80
pack_results
