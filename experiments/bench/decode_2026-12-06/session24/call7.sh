#!/usr/bin/env bash
# Session 24, call 7 (about TOTAL = 330 s): pack .device/pack37.tar.xz (make_pack37.sh). Rule in README.md ("Call 7").
# 1. test_decode_cuda on lib_r (its tensor-core cases run the changed reads).
# 2. A/B: lib_land, lib_r alternating, 3 rounds, the Mamba-2 and GDN shapes at B = 64, 128, 256.
# -> $OUT/results.tar. Run from the repository root: TOTAL=330 bash experiments/bench/decode_2026-12-06/session24/call7.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-330}
unpack_pack ${PACK:-.device/pack37.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
suite() {  # library test
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 100 $B/$2 > $R/${1}_$2.txt 2>&1
  echo "$1 $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${1}_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/${1}_$2.txt || grep -B5 -A25 "ERROR" $R/${1}_$2.txt | head -40
}
suite lib_r test_decode_cuda
bench() {  # library shapes batches name
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 120 $B/replayssm-bench bench --shapes $2 --batch $3 --window 16 --drafts 8 \
    --csv $R/$4.csv > $R/$4.txt 2>&1
  echo "$4 rc=$? $((SECONDS-t0))s"
}
for round in 1 2 3; do
  for l in lib_land lib_r; do
    [ $((TOTAL - SECONDS)) -lt 50 ] && { echo "$l round $round skipped (time)"; continue; }
    bench $l "nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b" "64 128 256" ab_${l}_$round
  done
done
grep -h "non-flush read fp8b128\|non-flush read nvfp4" $R/ab_*_1.txt | grep "|  256 |" | cut -c1-130
pack_results
