#!/usr/bin/env bash
# Session 24, call 2 (about TOTAL = 330 s): pack .device/pack34.tar.xz (make_pack34.sh). No landing rule: ablations.
# lib_land and the four ablated libraries alternating, 3 rounds, the Mamba-2 and GDN shapes at B = 64 and 256,
# --no-check (the ablated kernels compute wrong outputs by design; lib_land is timed the same way).
# -> $OUT/results.tar. Run from the repository root: TOTAL=330 bash experiments/bench/decode_2026-12-06/session24/call2.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-330}
unpack_pack ${PACK:-.device/pack34.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
bench() {  # library name
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 90 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b \
    qwen3.5-122b-a10b --batch 64 256 --window 16 --drafts 8 --no-check --csv $R/$2.csv > $R/$2.txt 2>&1
  echo "$2 rc=$? $((SECONDS-t0))s"
}
for round in 1 2 3; do
  for l in lib_land lib_astream lib_afold lib_arecord lib_aall; do
    [ $((TOTAL - SECONDS)) -lt 40 ] && { echo "$l round $round skipped (time)"; continue; }
    bench $l ab_${l}_$round
  done
done
grep -h "non-flush read" $R/ab_lib_land_1.txt | grep "|  256 |" | cut -c1-130
pack_results
