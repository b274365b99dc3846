#!/usr/bin/env bash
# Session 27, call 3 (about TOTAL = 330 s). Pack .device/pack43.tar.xz, .device/mini44.tar.xz (test_decode_cuda built
# at a08362f, the awkward case's flush heads per block fixed; bin/COMMIT) and .device/peers_slim.tar.xz.
# Rebuild both packs at the commit to be measured first (make_pack43.sh, make_mini44.sh): the launcher's host-side checks
# changed after call 2's pack (aa90499; kernels unchanged).
#  1. test_decode_cuda (main's library) against the CPU decoders.
#  2. A second record round (every paper shape at B = 32 and 256) and a second round at B = 8-128 (queued timer).
#  3. Nsight Compute at B = 32 on Nemotron-3-Super: our staggered step's two kernels and vLLM's ReplaySSM kernel.
#     (bench --timer events under ncu: ncu waits for each kernel before the next, so a hold kernel would only time out.)
# -> $OUT/results.tar. Run from the repository root: TOTAL=330 bash experiments/bench/decode_2026-12-06/session27/call3.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-330}
unpack_pack ${PACK:-.device/pack43.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
tar -C $A -xJf .device/mini44.tar.xz
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 100 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1
echo "test_decode_cuda rc=$? $((SECONDS-t0))s"; tail -n 3 $R/test_decode_cuda.txt
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 90 $B/replayssm-bench bench --shapes $ALL --batch 32 256 --window 16 --drafts 8 \
  --csv $R/record_2.csv > $R/record_2.txt 2>&1; echo "record round 2 rc=$? $((SECONDS-t0))s"
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 90 $B/replayssm-bench bench --shapes $ALL --batch 8 16 64 128 --window 16 \
  --drafts 8 --csv $R/other_batches_2.csv > $R/other_batches_2.txt 2>&1; echo "other batches 2 rc=$? $((SECONDS-t0))s"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats"
EXTRA=dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
for kernel in replay_nonflush_kernel replay_flush_kernel; do
  t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "ncu $kernel skipped (time)"; continue; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout 60 ncu --clock-control none --kernel-name-base function -k "regex:^$kernel\$" \
    --launch-skip 80 --launch-count 16 $SECTIONS --metrics $EXTRA --csv --page raw --print-units base \
    $B/replayssm-bench bench --shapes nemotron-3-super --batch 32 --window 16 --drafts 8 --repeats 3 --no-check --timer events \
    --arena-gib 8 > $R/ncu_ours_$kernel.csv 2> $R/ncu_ours_$kernel.log
  echo "ncu ours $kernel rc=$? $((SECONDS-t0))s"
done
tar -C . -xJf .device/peers_slim.tar.xz
t0=$SECONDS
left=$((TOTAL - SECONDS - 15))
[ $left -gt 40 ] && { timeout $left ncu --clock-control none -k "regex:_replayssm_output_only" --launch-skip 4 --launch-count 6 \
  $SECTIONS --metrics $EXTRA --csv --page raw --print-units base python3 scripts/bench_peers.py --peers vllm \
  --shapes nemotron-3-super --batch 32 --window 16 --timer events > $R/ncu_vllm.csv 2> $R/ncu_vllm.log
  echo "ncu vllm rc=$? $((SECONDS-t0))s"; }
pack_results
