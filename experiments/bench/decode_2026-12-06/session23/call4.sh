#!/usr/bin/env bash
# Session 23, call 4 (about TOTAL = 300 s): pack .device/pack31.tar.xz (make_pack31.sh; main with GDN's FP8
# tensor-core read). 1. Both suites and memcheck on the replay cases. 2. The run of record: every paper shape at
# B = 32 and 256, 2 rounds. -> $OUT/results.tar.
# Run from the repository root: TOTAL=300 bash experiments/bench/decode_2026-12-06/session23/call4.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-300}
unpack_pack ${PACK:-.device/pack31.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
suite() {  # library test
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 100 $B/$2 > $R/${1}_$2.txt 2>&1
  echo "$1 $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${1}_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/${1}_$2.txt || grep -B5 -A25 "ERROR" $R/${1}_$2.txt | head -40
}
suite lib_land test_decode_cuda; suite lib_land test_decode_kda_cuda
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 90 compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="*ReplaySSM decode kernels equal*" > $R/memcheck_lib_land.txt 2>&1
echo "memcheck lib_land rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_lib_land.txt)"
for round in 1 2; do
  t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "record round $round skipped (time)"; continue; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout 150 $B/replayssm-bench bench \
    --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 32 256 \
    --window 16 --drafts 8 --csv $R/record_$round.csv > $R/record_$round.txt 2>&1
  echo "record round $round rc=$? $((SECONDS-t0))s"
done
grep -h "non-flush read fp8b128" $R/record_1.txt | cut -c1-130
pack_results
