#!/usr/bin/env bash
# Session 19, call 2 (pack .device/pack19x.tar.xz: pack19 plus lib_exp/, the library with the tensor-core NVFP4
# read's lane-column layout and per-lane load cursor (mma_read.cuh, decode_replay_nonflush.cu)):
# 1. lib_exp: test_decode_cuda's replay cases (the NVFP4 read at dk = 128 among them) and the exactly representable
#    windows (FP32 tolerance on the LP reads), memcheck on the replay cases;
# 2. A/B, lib_land against lib_exp, Nemotron-3-Super, -Nano (Mamba-2, the changed path) and Qwen3.5-4B (GDN,
#    the loads only), B = 32 and 256, 2 rounds alternating -> $OUT/ab.tar;
# 3. ../session18/hpb_probe.sh (the GDN flush, one value head per block) and ../session18/ncu_targets_call.sh in
#    the time left of TOTAL seconds (default 580) -> $OUT/hpb.tar, $OUT/ncu.tar.
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session19/call2.sh
here=experiments/bench/decode_2026-12-05
export PACK=.device/pack19x.tar.xz
source $here/device_common.sh
unpack_pack $PACK lib_land
LAND=$A/lib_land$SYS; EXP=$A/lib_exp$SYS
ok=1
t0=$SECONDS; LD_LIBRARY_PATH=$EXP timeout 150 $B/test_decode_cuda \
  -tc="*ReplaySSM decode kernels equal*,*stochastically rounded*,*error feedback and appendix F*" > $R/test_exp.txt 2>&1
echo "test exp rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_exp.txt | head -n 2 | tr '\n' ' ')"
grep -q "Status: SUCCESS" $R/test_exp.txt || { ok=0; grep -B5 -A25 "ERROR" $R/test_exp.txt | head -60; }
t0=$SECONDS; LD_LIBRARY_PATH=$EXP timeout 120 compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="*ReplaySSM decode kernels equal*" > $R/memcheck_exp.txt 2>&1
echo "memcheck exp rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_exp.txt)"
if [ $ok = 1 ]; then
  for round in 1 2; do
    for lib in land exp; do t0=$SECONDS
      [ $lib = land ] && LP=$LAND || LP=$EXP
      LD_LIBRARY_PATH=$LP timeout 100 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b \
        --batch 32 256 --window 16 --drafts 8 --csv $R/ab_${lib}_$round.csv > $R/ab_${lib}_$round.txt 2>&1
      echo "ab $lib $round rc=$? $((SECONDS-t0))s"
    done
    [ $SECONDS -gt 300 ] && break
  done
  grep -H "nvfp4" $R/ab_*_1.txt | grep "|  256 |" | cut -c1-150
fi
pack_results && mv "$OUT/results.tar" "$OUT/ab.tar"
left=$((${TOTAL:-580} - SECONDS))
[ $left -gt 150 ] && TOTAL=100 bash $here/session18/hpb_probe.sh && mv "$OUT/results.tar" "$OUT/hpb.tar"
left=$((${TOTAL:-580} - SECONDS))
[ $left -gt 70 ] && LIMIT=$left bash $here/session18/ncu_targets_call.sh && mv "$OUT/results.tar" "$OUT/ncu.tar"
ls -la "$OUT"
