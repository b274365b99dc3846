#!/usr/bin/env bash
# Session 22, call 9 (about TOTAL = 170 s: what was left): pack .device/pack28.tar.xz (make_pack28.sh). Rule in
# README.md ("Call 9").
# 1. lib_epi: test_decode_cuda whole, memcheck on its verification cases.
# 2. A/B: lib_land and lib_epi alternating, 3 rounds, Nemotron-3-Super and Qwen3.5-4B at B = 256 (L = 16, T = 8).
# 3. lib_epi: test_decode_kda_cuda (KDA's split verification goes through the shared epilogue too), if time is left.
# -> $OUT/results.tar. Run from the repository root: TOTAL=170 bash experiments/bench/decode_2026-12-06/session22/call9.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-170}
unpack_pack ${PACK:-.device/pack28.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
suite() {  # library test
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 60 $B/$2 > $R/${1}_$2.txt 2>&1
  echo "$1 $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${1}_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/${1}_$2.txt || grep -B5 -A25 "ERROR" $R/${1}_$2.txt | head -40
}
suite lib_epi test_decode_cuda
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_epi) timeout 40 compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="*verification kernels equal*,*split-precision verification*" > $R/memcheck_lib_epi.txt 2>&1
echo "memcheck lib_epi rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_lib_epi.txt)"
for round in 1 2 3; do
  for l in lib_land lib_epi; do
    [ $((TOTAL - SECONDS)) -lt 25 ] && { echo "$l round $round skipped (time)"; continue; }
    t0=$SECONDS
    LD_LIBRARY_PATH=$(lib $l) timeout 40 $B/replayssm-bench bench --shapes nemotron-3-super qwen3.5-4b --batch 256 \
      --window 16 --drafts 8 --csv $R/ab_${l}_$round.csv > $R/ab_${l}_$round.txt 2>&1
    echo "ab_${l}_$round rc=$? $((SECONDS-t0))s"
  done
done
[ $((TOTAL - SECONDS)) -gt 15 ] && suite lib_epi test_decode_kda_cuda
pack_results
