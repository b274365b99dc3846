#!/usr/bin/env bash
# Session 20, one device call (about TOTAL = 585 s): pack .device/pack20.tar.xz (make_pack.sh) and
# .device/peers_slim.tar.xz (vLLM 0.33.0's Mamba-2 ops; FlashInfer 0.7.2's checkpointing_ssu with its sm_90a build).
# 1. lib_all (every change of sessions 19-20): both decode suites whole; memcheck on the replay and verification
#    cases. If test_decode_cuda fails, it runs again on lib_exp and lib_ab (each change alone) to say which broke it.
# 2. Every paper shape at B = 32 and 256 (L = 16, T = 8), lib_all and lib_land alternating, 2 rounds (the second if
#    time is left): the landing comparison and the run of record.
# 3. lib_a (the epilogue change alone) on the GDN and Mamba-2 shapes' rows, B = 32 and 256 (the streamed stream's
#    own effect is lib_all's verification rows against these).
# 4. ours (lib_all, lib_land) at B = 64, 128 on the Mamba-2 shapes; vLLM and FlashInfer at B = 32-256.
# Parameters (defaults: this call as it ran): PACK (.device/pack20.tar.xz), EXP (lib_all: every change), ALONE
# ("lib_exp lib_ab": libraries with one change each, tested when EXP fails), PART (lib_a: benched on the GDN and
# Mamba-2 shapes; "" for none), MEMCHECK (test_decode_cuda's memcheck cases).
# -> $OUT/results.tar. Run from the repository root: bash experiments/bench/decode_2026-12-06/session20/call.sh
source experiments/bench/decode_2026-12-05/device_common.sh
PACK=${PACK:-.device/pack20.tar.xz}; EXP=${EXP:-lib_all}; ALONE=${ALONE:-lib_exp lib_ab}; PART=${PART-lib_a}
MEMCHECK=${MEMCHECK:-*ReplaySSM decode kernels equal*,*exactly representable*,*verification kernels*,*after verification*}
unpack_pack $PACK lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib $EXP) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
ok=1
for t in test_decode_cuda test_decode_kda_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $EXP) timeout 200 $B/$t > $R/all_$t.txt 2>&1
  echo "$EXP $t rc=$? $((SECONDS-t0))s $(tail -n 3 $R/all_$t.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/all_$t.txt || { ok=0; grep -B5 -A25 "ERROR" $R/all_$t.txt | head -40; }
done
if [ $ok = 0 ]; then
  for l in $ALONE; do t0=$SECONDS
    LD_LIBRARY_PATH=$(lib $l) timeout 150 $B/test_decode_cuda > $R/${l}_test_decode_cuda.txt 2>&1
    echo "$l test_decode_cuda rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${l}_test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
  done
fi
t0=$SECONDS; LD_LIBRARY_PATH=$(lib $EXP) timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="$MEMCHECK" > $R/memcheck_all.txt 2>&1
echo "memcheck $EXP rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_all.txt)"
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
for round in 1 2; do
  [ $round = 2 ] && [ $SECONDS -gt $((${TOTAL:-585} * 56 / 100)) ] && { echo "round 2 skipped (time)"; break; }
  for l in $EXP lib_land; do t0=$SECONDS
    LD_LIBRARY_PATH=$(lib $l) timeout 150 $B/replayssm-bench bench --shapes $ALL --batch 32 256 --window 16 --drafts 8 \
      --csv $R/record_${l}_$round.csv > $R/record_${l}_$round.txt 2>&1
    echo "record $l $round rc=$? $((SECONDS-t0))s"
  done
done
grep -H "nvfp4\|verify" $R/record_*_1.txt | grep "|  256 |" | cut -c1-160
[ -n "$PART" ] && { t0=$SECONDS; LD_LIBRARY_PATH=$(lib $PART) timeout 80 $B/replayssm-bench bench --shapes qwen3.5-4b \
  qwen3.5-122b-a10b nemotron-3-super nemotron-3-nano-4b --batch 32 256 --window 16 --drafts 8 --csv $R/$PART.csv > $R/$PART.txt 2>&1
  echo "$PART rc=$? $((SECONDS-t0))s"; }
for l in $EXP lib_land; do t0=$SECONDS
  [ $SECONDS -gt $((${TOTAL:-585} - 165)) ] && break
  LD_LIBRARY_PATH=$(lib $l) timeout 60 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b --batch 64 128 \
    --window 16 --drafts 8 --csv $R/ours_${l}_b64_128.csv > $R/ours_${l}_b64_128.txt 2>&1
  echo "ours $l B=64,128 rc=$? $((SECONDS-t0))s"
done
run_peers ${TOTAL:-585}  # device_common.sh (after the run the inline block moved there, unchanged)
pack_results
