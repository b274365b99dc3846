#!/usr/bin/env bash
# Session 24, call 5 (about TOTAL = 150 s): pack .device/pack36.tar.xz (make_pack36.sh). No landing rule: an ablation.
# lib_land and lib_kda_astream alternating, 5 rounds, Kimi-Linear-48B-A3B at B = 64 and 256, --no-check.
# -> $OUT/results.tar. Run from the repository root: TOTAL=150 bash experiments/bench/decode_2026-12-06/session24/call5.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-150}
unpack_pack ${PACK:-.device/pack36.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
for round in 1 2 3 4 5; do
  for l in lib_land lib_kda_astream; do
    [ $((TOTAL - SECONDS)) -lt 20 ] && { echo "$l round $round skipped (time)"; continue; }
    t0=$SECONDS
    LD_LIBRARY_PATH=$(lib $l) timeout 60 $B/replayssm-bench bench --shapes kimi-linear-48b-a3b --batch 64 256 --window 16 \
      --drafts 8 --no-check --csv $R/ab_${l}_$round.csv > $R/ab_${l}_$round.txt 2>&1
    echo "ab_${l}_$round rc=$? $((SECONDS-t0))s"
  done
done
grep -h "non-flush" $R/ab_lib_*_1.txt | grep "|  256 |" | cut -c1-130
pack_results
