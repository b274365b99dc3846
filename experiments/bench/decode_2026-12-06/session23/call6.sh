#!/usr/bin/env bash
# Session 23, call 6 (about TOTAL = 300 s): pack .device/pack31.tar.xz (make_pack31.sh; main at 3bc254a, GDN's FP8
# tensor-core read). compute-sanitizer racecheck and synccheck on the replay cases of test_decode_cuda: the new read
# stages its block scales by cp.async in a group of its own and waits for it before the barrier ahead of the stream.
# -> $OUT/results.tar. Run from the repository root: TOTAL=300 bash experiments/bench/decode_2026-12-06/session23/call6.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-300}
unpack_pack ${PACK:-.device/pack31.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
for tool in racecheck synccheck; do
  t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 30 ] && { echo "$tool skipped (time)"; continue; }
  if [ $tool = racecheck ]; then tool_limit=$(( (TOTAL - SECONDS) * 2 / 3 )); else tool_limit=$(( TOTAL - SECONDS - 10 )); fi
  LD_LIBRARY_PATH=$(lib lib_land) timeout $tool_limit \
    compute-sanitizer --tool $tool $B/test_decode_cuda -tc="*ReplaySSM decode kernels equal*" > $R/${tool}_lib_land.txt 2>&1
  echo "$tool rc=$? $((SECONDS-t0))s $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|test cases' $R/${tool}_lib_land.txt | tr '\n' ' ')"
done
pack_results
