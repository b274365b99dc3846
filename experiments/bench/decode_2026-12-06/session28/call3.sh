#!/usr/bin/env bash
# Session 28, call 3 (about TOTAL = 420 s): the A/B of H (vals_bf16.patch) and, on its library, a run of record. Pack
# .device/pack46.tar.xz (make_pack46.sh: lib_land = main, lib_h = main + vals_bf16.patch) and .device/peers_slim.tar.xz.
#  1. test_decode_cuda on lib_h.
#  2. Three rounds, lib_h and lib_land alternating (lib_h first in odd rounds, second in even ones): Nemotron-3-Super and
#     -Nano at B = 64, 128, 256, every configuration checked against the CPU decoders before timing. The landing rule
#     (README.md, written before this run) is judged on these rounds.
#  3. lib_h: two record rounds (every paper shape at B = 32 and 256), B = 8-128 once.
#  4. Nsight Compute on lib_h's NVFP4 read (Super, B = 256; launches 120-125 of replay_nonflush_kernel).
#  5. The peers graph-timed, with what time is left (call 1 timed them beside main's kernels; H does not change the
#     staggered step they are compared with).
# -> $OUT/results.tar. Run from the repository root: TOTAL=420 bash experiments/bench/decode_2026-12-06/session28/call3.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-420}
unpack_pack ${PACK:-.device/pack46.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_h) timeout 100 $B/test_decode_cuda > $R/test_decode_cuda_h.txt 2>&1
echo "test_decode_cuda (lib_h) rc=$? $((SECONDS-t0))s"; tail -n 3 $R/test_decode_cuda_h.txt
ab_rounds lib_h
grep -H "non-flush read nvfp4" $R/ab_*_1.txt | grep "|  256 |" | cut -c1-160
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
for round in 1 2; do
  t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "record round $round skipped (time)"; continue; }
  LD_LIBRARY_PATH=$(lib lib_h) timeout 60 $B/replayssm-bench bench --shapes $ALL --batch 32 256 \
    --window 16 --drafts 8 --csv $R/record_$round.csv > $R/record_$round.txt 2>&1
  echo "record round $round (lib_h) rc=$? $((SECONDS-t0))s"
done
t0=$SECONDS
[ $((TOTAL - SECONDS)) -gt 90 ] && { LD_LIBRARY_PATH=$(lib lib_h) timeout 60 $B/replayssm-bench bench --shapes $ALL \
  --batch 8 16 64 128 --window 16 --drafts 8 --csv $R/other_batches.csv > $R/other_batches.txt 2>&1
  echo "other batches (lib_h) rc=$? $((SECONDS-t0))s"; }
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
t0=$SECONDS
[ $((TOTAL - SECONDS)) -gt 35 ] && { LD_LIBRARY_PATH=$(lib lib_h) timeout -s INT 60 ncu --clock-control none \
  --kernel-name-base function --print-kernel-base demangled -k "regex:^replay_nonflush_kernel\$" --launch-skip 120 \
  --launch-count 6 $SECTIONS --metrics $EXTRA --csv --page raw --print-units base $B/replayssm-bench bench \
  --shapes nemotron-3-super --batch 256 --window 16 --drafts 1 --repeats 3 --no-check --timer events --arena-gib 24 \
  > $R/ncu_h_super256_nvfp4.out 2> $R/ncu_h_super256_nvfp4.log; echo "ncu lib_h nvfp4 rc=$? $((SECONDS-t0))s"; }
run_peers $((TOTAL - 5))
for f in $R/ncu_*.out; do [ -f "$f" ] || continue; grep '^"' $f > ${f%.out}.csv; grep '^|\|^#' $f > ${f%.out}_bench.txt; rm $f; done
pack_results
