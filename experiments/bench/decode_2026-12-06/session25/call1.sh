#!/usr/bin/env bash
# Session 25, call 1 (about TOTAL = 480 s): pack .device/pack38.tar.xz (make_pack38.sh). Rule in README.md ("Call 1").
# 1. Both GPU suites on lib_list (the flush list's tests: staggered, verify/standard mixes, CUDA Graphs with device
#    parity, the wrong-list child processes).
# 2. The bench with its checks on lib_list, flush lists on: every configuration validated against the CPU decoders.
# 3. A/B, --no-check: lib_main, lib_list --no-flush-list, lib_list, alternating, 3 rounds, five shapes, B = 32-256.
# -> $OUT/results.tar. Run from the repository root: TOTAL=480 bash experiments/bench/decode_2026-12-06/session25/call1.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-480}
unpack_pack ${PACK:-.device/pack38.tar.xz} lib_list
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_list) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
suite() {  # library test
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 170 $B/$2 > $R/${1}_$2.txt 2>&1
  echo "$1 $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${1}_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/${1}_$2.txt || grep -B5 -A25 "ERROR" $R/${1}_$2.txt | head -40
}
suite lib_list test_decode_cuda
suite lib_list test_decode_kda_cuda
grep -h "^flush list\|flush lists" $R/lib_list_test_decode_cuda.txt | head -20
SHAPES="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_list) timeout 150 $B/replayssm-bench bench --shapes $SHAPES --batch 64 128 256 --window 16 \
  --drafts 8 --csv $R/checked_lib_list.csv > $R/checked_lib_list.txt 2>&1
echo "checked lib_list rc=$? $((SECONDS-t0))s"; grep -i "check" $R/checked_lib_list.txt | head -5
bench() {  # library name extra-flags
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 90 $B/replayssm-bench bench --shapes $SHAPES --batch 32 64 128 256 --window 16 \
    --drafts 8 --no-check $3 --csv $R/$2.csv > $R/$2.txt 2>&1
  echo "$2 rc=$? $((SECONDS-t0))s"
}
for round in 1 2 3; do
  [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "round $round skipped (time)"; continue; }
  bench lib_main ab_main_$round ""
  bench lib_list ab_nolist_$round --no-flush-list
  bench lib_list ab_list_$round ""
done
grep -h "non-flush read" $R/ab_list_1.txt | grep "|  256 |" | cut -c1-130
pack_results
