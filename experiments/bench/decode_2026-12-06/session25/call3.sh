#!/usr/bin/env bash
# Session 25, call 3 (about TOTAL = 300 s): pack .device/pack40.tar.xz (make_pack40.sh). Rule in README.md ("Call 3").
# 1. Both GPU suites on lib_list (the child-process test fixed).
# 2. A/B, --no-check: lib_main, lib_list --no-flush-list, lib_list, alternating, 5 rounds, five shapes, B = 32-256.
# -> $OUT/results.tar. Run from the repository root: TOTAL=300 bash experiments/bench/decode_2026-12-06/session25/call3.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-300}
unpack_pack ${PACK:-.device/pack40.tar.xz} lib_list
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
bench() {  # library name extra-flags
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 90 $B/replayssm-bench bench --shapes $SHAPES --batch 32 64 128 256 --window 16 \
    --drafts 8 --no-check $3 --csv $R/$2.csv > $R/$2.txt 2>&1
  echo "$2 rc=$? $((SECONDS-t0))s"
}
for round in 1 2 3 4 5; do
  [ $((TOTAL - SECONDS)) -lt 30 ] && { echo "round $round skipped (time)"; continue; }
  bench lib_main ab_main_$round ""
  bench lib_list ab_nolist_$round --no-flush-list
  bench lib_list ab_list_$round ""
done
pack_results
