#!/usr/bin/env bash
# Session 16: the KDA flush with several rows per lane group, and the KDA non-flush step with part of the head
# staged by cp.async (flush_rows.patch). Pack .device/pack16.tar.xz:
#   bin/, sys/: as pack15b (pack14h's: main's bench and test binaries, the host libraries the image lacks);
#   lib_land/:  main's library (ab9957a's kernels; e6cb1c8 is SASS-identical to it, 308 of 308 functions);
#   lib_exp/:   main + flush_rows.patch, two switches read by its launcher:
#     REPLAYSSM_KDA_FLUSH_VARIANT (rows per lane group / iterations in flight / blocks per SM at dk = 128):
#       0 = 1/2/4 (flush_records.patch's flush, the control), 1 = 2/2/4, 2 = 4/1/3, 3 = 4/2/2, 4 = 2/1/4;
#     REPLAYSSM_KDA_NONFLUSH_STAGED_ROWS: 0 (main's non-flush kernel), 32 or 64 rows staged (FP32 reads, dk = 128);
#     (REPLAYSSM_VERIFY_BATCHED_FOLD: verify_fold_call.sh's, unset here.)
#   Each run sets one of each. The flush-step row measures the flush variant alone, the non-flush-step row
#   the staging alone (in each the other kernel's blocks all return), the staggered row both.
# 1. lib_exp: the KDA ReplaySSM and after-verification cases under every pairing.
# 2. Kimi Linear at B = 32 and 256, 2 interleaved rounds: lib_land, then the pairings 0/0, 1/32, 2/64, 3/32.
# 3. memcheck on the same cases for the flush variant fastest in round 1, with 64 staged rows.
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session16/flush_rows_call.sh
source "$(dirname "$0")/../device_common.sh"
unpack_pack .device/pack16.tar.xz lib_land
LAND=$A/lib_land$SYS; EXP=$A/lib_exp$SYS
LD_LIBRARY_PATH=$EXP $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
staged_of() { case $1 in 1|3) echo 32;; 2|4) echo 64;; *) echo 0;; esac; }
passed=""
for v in 0 1 2 3 4; do t0=$SECONDS
  REPLAYSSM_KDA_FLUSH_VARIANT=$v REPLAYSSM_KDA_NONFLUSH_STAGED_ROWS=$(staged_of $v) LD_LIBRARY_PATH=$EXP timeout 100 \
    $B/test_decode_kda_cuda -tc="*ReplaySSM*,*after verification*" > $R/test_variant$v.txt 2>&1
  rc=$?; echo "test variant $v staged $(staged_of $v) rc=$rc $((SECONDS-t0))s $(tail -n 3 $R/test_variant$v.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/test_variant$v.txt && passed="$passed $v"
done
echo "pairings passing: $passed"
for round in 1 2; do
  [ $round = 2 ] && [ $SECONDS -gt 380 ] && { echo "round 2 skipped (time)"; break; }
  for v in land $passed; do
    [ "$v" = 4 ] && continue
    L=$EXP; [ $v = land ] && L=$LAND; t0=$SECONDS
    REPLAYSSM_KDA_FLUSH_VARIANT=${v/land/0} REPLAYSSM_KDA_NONFLUSH_STAGED_ROWS=$(staged_of ${v/land/0}) LD_LIBRARY_PATH=$L \
      timeout 100 $B/replayssm-bench bench --shapes kimi-linear-48b-a3b \
      --batch 32 256 --window 16 --drafts 8 --csv $R/kimi_v${v}_$round.csv > $R/kimi_v${v}_$round.txt 2>&1
    echo "bench $v $round rc=$? $((SECONDS-t0))s"
  done
done
grep -H "replay fp32 (stag\|replay fp32 non-flush step\|replay fp32 flush step" $R/kimi_v*_1.txt | grep "|  256 |" | cut -c1-150
best=$(for v in $passed; do [ "$v" = 4 ] && continue; f=$R/kimi_v${v}_1.txt
  [ -f $f ] && grep "replay fp32 flush step" $f | grep "|  256 |" | awk -F'|' -v v=$v '{gsub(/ /,"",$6); print $6, v}'; done | sort -g | head -n 1 | cut -d' ' -f2)
echo "fastest flush variant in round 1: ${best:-none}"
if [ -n "$best" ] && [ $SECONDS -lt 500 ]; then t0=$SECONDS
  REPLAYSSM_KDA_FLUSH_VARIANT=$best REPLAYSSM_KDA_NONFLUSH_STAGED_ROWS=64 LD_LIBRARY_PATH=$EXP timeout $((580 - SECONDS)) \
    compute-sanitizer --tool memcheck $B/test_decode_kda_cuda -tc="*ReplaySSM decode kernels equal*,*after verification*" \
    > $R/memcheck_variant$best.txt 2>&1
  echo "memcheck variant $best, 64 staged rows rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_variant$best.txt)"
fi
pack_results
