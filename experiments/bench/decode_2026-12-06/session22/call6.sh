#!/usr/bin/env bash
# Session 22, call 6 (about TOTAL = 360 s): pack .device/pack26.tar.xz (make_pack26.sh), main's library with G.
# 1. Both decode suites whole.
# 2. Record rounds (3 if time allows) of every paper shape at B = 32 and 256, L = 16, T = 8: the run of record at this
#    commit on whichever card comes (targets: decode_2026-12-04/call5_flush_mma/call5_final/targets.py "record_*.csv").
# -> $OUT/results.tar. Run from the repository root: TOTAL=360 bash experiments/bench/decode_2026-12-06/session22/call6.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-360}
unpack_pack ${PACK:-.device/pack26.tar.xz} lib_land
LP=$A/lib_land$SYS
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$LP $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
for t in test_decode_cuda test_decode_kda_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$LP timeout 100 $B/$t > $R/$t.txt 2>&1
  echo "$t rc=$? $((SECONDS-t0))s $(tail -n 3 $R/$t.txt | head -n 2 | tr '\n' ' ')"
done
for round in 1 2 3; do
  [ $round -gt 1 ] && [ $((TOTAL - SECONDS)) -lt 90 ] && { echo "round $round skipped (time)"; break; }
  t0=$SECONDS
  LD_LIBRARY_PATH=$LP timeout 85 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b \
    qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 32 256 --window 16 --drafts 8 --csv $R/record_$round.csv \
    > $R/record_$round.txt 2>&1
  echo "record $round rc=$? $((SECONDS-t0))s"
done
pack_results
