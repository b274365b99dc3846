#!/usr/bin/env bash
# Session 19, one call for everything (if only one device call is left): pack .device/pack19x.tar.xz (main's
# library lib_land/ at bin/COMMIT, and lib_exp/: the tensor-core NVFP4 read with the lane-column layout and a
# per-lane load cursor), .device/peers_slim.tar.xz (vLLM 0.33.0's Mamba-2 ops; the FlashInfer 0.7.2 modules
# checkpointing_ssu imports, with its sm_90a build; apache-tvm-ffi for CPython 3.12).
# 1. lib_exp: both decode suites whole; memcheck on the replay cases;
# 2. every paper shape at B = 32 and 256, lib_exp and lib_land alternating, 2 rounds (the second if time is left);
# 3. ours (lib_exp, lib_land) at B = 64, 128 on the Mamba-2 shapes, vLLM and FlashInfer at B = 32, 64, 128, 256;
# 4. ../session18/hpb_probe.sh in the time left of TOTAL seconds (default 580).
# -> $OUT/main.tar, $OUT/hpb.tar. Run from the repository root: bash experiments/bench/decode_2026-12-05/session19/call3.sh
here=experiments/bench/decode_2026-12-05
export PACK=.device/pack19x.tar.xz
source $here/device_common.sh
unpack_pack $PACK lib_land
LAND=$A/lib_land$SYS; EXP=$A/lib_exp$SYS
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$EXP $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
ok=1
for t in test_decode_cuda test_decode_kda_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$EXP timeout 200 $B/$t > $R/exp_$t.txt 2>&1
  echo "exp $t rc=$? $((SECONDS-t0))s $(tail -n 3 $R/exp_$t.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/exp_$t.txt || { ok=0; grep -B5 -A25 "ERROR" $R/exp_$t.txt | head -40; }
done
t0=$SECONDS; LD_LIBRARY_PATH=$EXP timeout 120 compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="*ReplaySSM decode kernels equal*,*exactly representable*" > $R/memcheck_exp.txt 2>&1
echo "memcheck exp rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_exp.txt)"
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
for round in 1 2; do
  [ $round = 2 ] && [ $SECONDS -gt 300 ] && { echo "round 2 skipped (time)"; break; }
  for lib in exp land; do t0=$SECONDS
    [ $lib = land ] && LP=$LAND || LP=$EXP
    [ $lib = exp ] && [ $ok = 0 ] && continue
    LD_LIBRARY_PATH=$LP timeout 150 $B/replayssm-bench bench --shapes $ALL --batch 32 256 --window 16 --drafts 8 \
      --csv $R/record_${lib}_$round.csv > $R/record_${lib}_$round.txt 2>&1
    echo "record $lib $round rc=$? $((SECONDS-t0))s"
  done
done
grep -H "nvfp4" $R/record_*_1.txt | grep "|  256 |" | cut -c1-150
for lib in exp land; do t0=$SECONDS
  [ $lib = land ] && LP=$LAND || LP=$EXP
  LD_LIBRARY_PATH=$LP timeout 60 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b --batch 64 128 \
    --window 16 --drafts 8 --csv $R/ours_${lib}_b64_128.csv > $R/ours_${lib}_b64_128.txt 2>&1
  echo "ours $lib B=64,128 rc=$? $((SECONDS-t0))s"
done
run_peers ${TOTAL:-580}
pack_results && mv "$OUT/results.tar" "$OUT/main.tar"
left=$((${TOTAL:-580} - SECONDS))
[ $left -gt 100 ] && { TOTAL=$((left - 30)) bash $here/session18/hpb_probe.sh; mv "$OUT/results.tar" "$OUT/hpb.tar"; }
ls -la "$OUT"
