#!/usr/bin/env bash
# Session 33, call 2: the decode suites on main's library (pack52 from session32/make_pack.sh: one library, lib_land),
# plain and under compute-sanitizer's memcheck (with leak check), initcheck and synccheck, whole suites, the six
# sanitizer processes at once (session 30: memcheck of both suites took 52 s). Then, until TOTAL, racecheck of the long
# cases in shards (session31/sanitize_cases.sh's way is one call per case; here what time is left).
# Run from the repository root on the device, carrying .device/pack52.tar.xz and .device/formats_v1.json.xz:
#   TOTAL=400 bash experiments/bench/decode_2026-12-07/session33/call2.sh
# -> $OUT/results.tar: r/<suite>.txt (plain), r/<tool>_<suite>.txt, r/summary.txt.
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-400}
LIB=${LIB:-lib_land}  # the pack's library to check (session 34: lib_h8b of pack55)
unpack_pack ${PACK:-.device/pack52.tar.xz} $LIB
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$A/$LIB$SYS; echo "$LIB" > $R/library.txt
for suite in test_decode_cuda test_decode_kda_cuda test_formats_cuda; do t0=$SECONDS
  timeout 150 $B/$suite > $R/$suite.txt 2>&1
  echo "$suite rc=$? $((SECONDS-t0))s $(grep 'test cases:' $R/$suite.txt | tr -s ' ')" | tee -a $R/summary.txt
done
snapshot_results
left=$((TOTAL - SECONDS - 30)); pids=()
for tool in memcheck initcheck synccheck; do
  extra=""; [ $tool = memcheck ] && extra="--leak-check full"
  for suite in test_decode_cuda test_decode_kda_cuda; do
    ( t0=$SECONDS; timeout $left compute-sanitizer --tool $tool $extra $B/$suite > $R/${tool}_$suite.txt 2>&1
      echo "$tool $suite rc=$? $((SECONDS-t0))s | $(grep -h 'ERROR SUMMARY\|LEAK SUMMARY' $R/${tool}_$suite.txt | tr '\n' ' ')| $(grep -h 'test cases:' $R/${tool}_$suite.txt | tr -s ' ')" >> $R/summary.txt ) & pids+=($!)
  done
done
( while sleep 30; do snapshot_results; done ) & snapshots=$!
wait "${pids[@]}"
kill $snapshots 2>/dev/null; wait 2>/dev/null
cat $R/summary.txt
pack_results
