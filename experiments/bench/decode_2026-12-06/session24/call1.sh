#!/usr/bin/env bash
# Session 24, call 1 (about TOTAL = 560 s): pack .device/pack33.tar.xz (make_pack33.sh). Rule in README.md ("Call 1").
# 1. Both suites on lib_p128 (the prefetch is a hint: it cannot change a value; the suites check that the
#    kernels still run and match the CPU decoders).
# 2. A/B: lib_land, lib_p32, lib_p128 alternating, 3 rounds, every paper shape at B = 64, 128, 256.
# -> $OUT/results.tar. Run from the repository root: TOTAL=560 bash experiments/bench/decode_2026-12-06/session24/call1.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-560}
unpack_pack ${PACK:-.device/pack33.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
suite() {  # library test
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 100 $B/$2 > $R/${1}_$2.txt 2>&1
  echo "$1 $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${1}_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/${1}_$2.txt || grep -B5 -A25 "ERROR" $R/${1}_$2.txt | head -40
}
suite lib_p128 test_decode_cuda; suite lib_p128 test_decode_kda_cuda
bench() {  # library shapes batches name
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 120 $B/replayssm-bench bench --shapes $2 --batch $3 --window 16 --drafts 8 \
    --csv $R/$4.csv > $R/$4.txt 2>&1
  echo "$4 rc=$? $((SECONDS-t0))s"
}
SHAPES="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
for round in 1 2 3; do
  for l in lib_land lib_p32 lib_p128; do
    [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "$l round $round skipped (time)"; continue; }
    bench $l "$SHAPES" "64 128 256" ab_${l}_$round
  done
done
grep -h "non-flush read" $R/ab_*_1.txt | grep "|  256 |" | cut -c1-130
pack_results
