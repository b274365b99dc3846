#!/usr/bin/env bash
# Session 24, call 3 (about TOTAL = 300 s): pack .device/pack35.tar.xz (make_pack35.sh). No landing rule: ablations.
# lib_land and the seven ablated libraries alternating, 5 rounds, the Mamba-2 and GDN shapes at B = 64 and 256,
# --no-check (the ablated kernels compute wrong outputs by design; lib_land is timed the same way).
# -> $OUT/results.tar. Run from the repository root: TOTAL=300 bash experiments/bench/decode_2026-12-06/session24/call3.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-300}
unpack_pack ${PACK:-.device/pack35.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
bench() {  # library name
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 90 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b \
    qwen3.5-122b-a10b --batch 64 256 --window 16 --drafts 8 --no-check --csv $R/$2.csv > $R/$2.txt 2>&1
  echo "$2 rc=$? $((SECONDS-t0))s"
}
for round in 1 2 3 4 5; do
  for l in lib_land lib_astream lib_afold lib_arecord lib_aall lib_nflush lib_aall_nf lib_aall_nf_na; do
    [ $((TOTAL - SECONDS)) -lt 20 ] && { echo "$l round $round skipped (time)"; continue; }
    bench $l ab_${l}_$round
  done
done
grep -h "non-flush read" $R/ab_lib_land_1.txt | grep "|  256 |" | cut -c1-130
pack_results
