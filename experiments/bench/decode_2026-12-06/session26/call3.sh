#!/usr/bin/env bash
# Session 26, call 3 (about TOTAL = 360 s): pack .device/pack41.tar.xz and .device/peers_slim.tar.xz.
# 1. Ours with flush lists on the Mamba-2 shapes at B = 32-256, then vLLM 0.33.0 and FlashInfer 0.7.2 at the same
#    shapes and B in the same call (scripts/bench_peers.py validates each peer against a float64 evaluation first).
# 2. racecheck on the staggered replay case with the time left (call 2's was cut at 90 s). -> $OUT/results.tar.
# Run from the repository root: TOTAL=360 bash experiments/bench/decode_2026-12-06/session26/call3.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-360}
unpack_pack ${PACK:-.device/pack41.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 90 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b \
  --batch 32 64 128 256 --window 16 --drafts 8 --csv $R/ours.csv > $R/ours.txt 2>&1
echo "ours rc=$? $((SECONDS-t0))s"
run_peers $((TOTAL - 110))
t0=$SECONDS
left=$((TOTAL - SECONDS - 15))
[ $left -gt 30 ] && { LD_LIBRARY_PATH=$(lib lib_land) timeout $left compute-sanitizer --tool racecheck $B/test_decode_cuda \
  -tc="*split low-precision reads*staggered windows" > $R/racecheck_staggered.txt 2>&1
  echo "racecheck rc=$? $((SECONDS-t0))s $(grep 'test cases:' $R/racecheck_staggered.txt | tr -s ' ') $(grep -c -i hazard $R/racecheck_staggered.txt) hazard lines"; }
pack_results
