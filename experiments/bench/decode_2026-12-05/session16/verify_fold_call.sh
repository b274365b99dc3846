#!/usr/bin/env bash
# Session 16: verification with a flush, the CUDA-core stream's fold with the batch's rows together (REPLAYSSM_VERIFY_
# BATCHED_FOLD=1 in pack16's experiment library; flush_rows.patch). It serves Mamba-2 at every T, and GDN below
# the tensor-core threshold (T <= 2 at dk = 128).
# 1. test_decode_cuda's verification, after-verification and CUDA Graphs cases with the switch on.
# 2. Nemotron-3-Super and -Nano at B = 32 and 256 (L = 16, T = 8), 2 interleaved rounds: lib_land, then lib_exp with
#    the switch on. The verification-with-flush rows are the ones the switch touches; the rest are controls.
# 3. memcheck on the same test cases with the switch on.
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session16/verify_fold_call.sh
source "$(dirname "$0")/../device_common.sh"
unpack_pack .device/pack16.tar.xz lib_land
LAND=$A/lib_land$SYS; EXP=$A/lib_exp$SYS
CASES="*verification kernels equal*,*after verification*,*CUDA Graphs*"
t0=$SECONDS; REPLAYSSM_VERIFY_BATCHED_FOLD=1 LD_LIBRARY_PATH=$EXP timeout 150 $B/test_decode_cuda -tc="$CASES" > $R/test_batched.txt 2>&1
rc=$?; echo "test batched rc=$rc $((SECONDS-t0))s $(tail -n 3 $R/test_batched.txt | head -n 2 | tr '\n' ' ')"
if grep -q "Status: SUCCESS" $R/test_batched.txt; then
  for round in 1 2; do
    [ $round = 2 ] && [ $SECONDS -gt 380 ] && { echo "round 2 skipped (time)"; break; }
    for v in land batched; do L=$LAND; [ $v = batched ] && L=$EXP; t0=$SECONDS
      REPLAYSSM_VERIFY_BATCHED_FOLD=1 LD_LIBRARY_PATH=$L timeout 150 $B/replayssm-bench bench --shapes nemotron-3-super \
        nemotron-3-nano-4b --batch 32 256 --window 16 --drafts 8 --csv $R/m2_${v}_$round.csv > $R/m2_${v}_$round.txt 2>&1
      echo "bench $v $round rc=$? $((SECONDS-t0))s"
    done
  done
  grep -H "verify output-only" $R/m2_*_1.txt | cut -c1-160
  if [ $SECONDS -lt 480 ]; then t0=$SECONDS
    REPLAYSSM_VERIFY_BATCHED_FOLD=1 LD_LIBRARY_PATH=$EXP timeout $((580 - SECONDS)) compute-sanitizer --tool memcheck \
      $B/test_decode_cuda -tc="*verification kernels equal*,*after verification*" > $R/memcheck_batched.txt 2>&1
    rc=$?; echo "memcheck batched rc=$rc $((SECONDS-t0))s $(tail -n 1 $R/memcheck_batched.txt)"
  fi
fi
pack_results
