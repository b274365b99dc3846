#!/usr/bin/env bash
# Prepared in session 26, not run (no device time left): Nsight Compute on our staggered step and vLLM's ReplaySSM
# output-only kernel on Nemotron-3-Super at B = 32, where call 4 timed vLLM's kernel (in a CUDA graph) 9% faster than
# our step. Which of our two kernels holds the step's time, and what each kernel's DRAM throughput, occupancy and
# stalls are. Pack .device/pack41.tar.xz and .device/peers_slim.tar.xz. -> $OUT/results.tar.
# Launch windows (bench --repeats 3 --no-check): the staggered row is the first replay row, 6 calls of L = 16 steps;
# at B = 32 every step has B / L = 2 flushing sequences, so both kernels launch 96 times; 80-95 is the last window.
# Run from the repository root: TOTAL=300 bash experiments/bench/decode_2026-12-06/session26/next_ncu_b32.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-300}
unpack_pack ${PACK:-.device/pack41.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats"
EXTRA=dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,gpu__time_duration.sum
for kernel in replay_nonflush_kernel replay_flush_kernel; do
  t0=$SECONDS
  LD_LIBRARY_PATH=$(lib lib_land) timeout 90 ncu --clock-control none --kernel-name-base function -k "regex:^$kernel\$" \
    --launch-skip 80 --launch-count 16 $SECTIONS --metrics $EXTRA --csv --page raw --print-units base \
    $B/replayssm-bench bench --shapes nemotron-3-super --batch 32 --window 16 --drafts 8 --repeats 3 --no-check \
    --arena-gib 8 > $R/ncu_ours_$kernel.csv 2> $R/ncu_ours_$kernel.log
  echo "ncu ours $kernel rc=$? $((SECONDS-t0))s"
done
tar -C . -xJf .device/peers_slim.tar.xz
t0=$SECONDS
timeout $((TOTAL - SECONDS - 20)) ncu --clock-control none -k "regex:_replayssm_output_only" --launch-skip 4 --launch-count 6 \
  $SECTIONS --metrics $EXTRA --csv --page raw --print-units base python3 scripts/bench_peers.py --peers vllm \
  --shapes nemotron-3-super --batch 32 --window 16 --timer events > $R/ncu_vllm.csv 2> $R/ncu_vllm.log
echo "ncu vllm rc=$? $((SECONDS-t0))s"
pack_results
