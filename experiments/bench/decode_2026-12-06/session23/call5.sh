#!/usr/bin/env bash
# Session 23, call 5 (about TOTAL = 330 s): pack .device/pack32.tar.xz (make_pack32.sh). Rule in README.md ("Call 5").
# 1. test_decode_cuda on lib_n4a and lib_n4b; memcheck on lib_n4a's replay cases.
# 2. A/B: lib_land, lib_n4a, lib_n4b alternating, 3 rounds, Qwen3.5-4B and Qwen3.5-122B at B = 64, 128, 256.
# -> $OUT/results.tar. Run from the repository root: TOTAL=330 bash experiments/bench/decode_2026-12-06/session23/call5.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-330}
unpack_pack ${PACK:-.device/pack32.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
suite() {  # library test
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 100 $B/$2 > $R/${1}_$2.txt 2>&1
  echo "$1 $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${1}_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/${1}_$2.txt || grep -B5 -A25 "ERROR" $R/${1}_$2.txt | head -40
}
suite lib_n4a test_decode_cuda; suite lib_n4b test_decode_cuda
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_n4a) timeout 90 compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="*ReplaySSM decode kernels equal*" > $R/memcheck_lib_n4a.txt 2>&1
echo "memcheck lib_n4a rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_lib_n4a.txt)"
bench() {  # library shapes batches name
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 120 $B/replayssm-bench bench --shapes $2 --batch $3 --window 16 --drafts 8 \
    --csv $R/$4.csv > $R/$4.txt 2>&1
  echo "$4 rc=$? $((SECONDS-t0))s"
}
for round in 1 2 3; do
  for l in lib_land lib_n4a lib_n4b; do
    [ $((TOTAL - SECONDS)) -lt 30 ] && { echo "$l round $round skipped (time)"; continue; }
    bench $l "qwen3.5-4b qwen3.5-122b-a10b" "64 128 256" ab_${l}_$round
  done
done
grep -h "non-flush read nvfp4" $R/ab_*_1.txt | cut -c1-130
pack_results
