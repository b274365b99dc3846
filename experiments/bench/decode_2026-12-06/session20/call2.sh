#!/usr/bin/env bash
# Session 20, call 2 (about 250 s): pack .device/pack21.tar.xz (bin/, sys/ as pack20; lib_land = main at e39e803, the
# landed library, = pack20's lib_all; lib_m2 = main + verify_streamed_mamba2.patch) and .device/peers_slim.tar.xz.
# 1. lib_m2: test_decode_cuda's verification cases; memcheck on them.
# 2. Nemotron-3-Super and -Nano at B = 32 and 256, lib_m2 and lib_land alternating, 2 rounds.
# 3. lib_land at B = 32-256 on the Mamba-2 shapes, vLLM and FlashInfer beside it (the peers' same-run figures).
# SHORT=1 (for a budget near 200 s): memcheck limited to 60 s, no step 3.
# -> $OUT/results.tar. Run from the repository root: bash experiments/bench/decode_2026-12-06/session20/call2.sh
source experiments/bench/decode_2026-12-05/device_common.sh
unpack_pack .device/pack21.tar.xz lib_land
lib() { echo "$A/$1$SYS"; }
LD_LIBRARY_PATH=$(lib lib_m2) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
VERIFY="*verification kernels*,*after verification*,*CUDA Graphs*,*launchers refuse*"
t0=$SECONDS; LD_LIBRARY_PATH=$(lib lib_m2) timeout 150 $B/test_decode_cuda -tc="$VERIFY" > $R/m2_test_decode_cuda.txt 2>&1
echo "lib_m2 test_decode_cuda (verification) rc=$? $((SECONDS-t0))s $(tail -n 3 $R/m2_test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
t0=$SECONDS; LD_LIBRARY_PATH=$(lib lib_m2) timeout $([ "${SHORT:-0}" = 1 ] && echo 60 || echo 120) compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="*verification kernels*,*after verification*" > $R/memcheck_m2.txt 2>&1
echo "memcheck lib_m2 rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_m2.txt)"
for round in 1 2; do
  for l in lib_m2 lib_land; do t0=$SECONDS
    LD_LIBRARY_PATH=$(lib $l) timeout 60 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b \
      --batch 32 256 --window 16 --drafts 8 --csv $R/m2ab_${l}_$round.csv > $R/m2ab_${l}_$round.txt 2>&1
    echo "bench $l $round rc=$? $((SECONDS-t0))s"
  done
done
grep -H "verify output-only" $R/m2ab_*_1.txt | cut -c1-150
if [ "${SHORT:-0}" != 1 ]; then
t0=$SECONDS; LD_LIBRARY_PATH=$(lib lib_land) timeout 60 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b \
  --batch 32 64 128 256 --window 16 --drafts 8 --csv $R/ours_peers.csv > $R/ours_peers.txt 2>&1
echo "ours B=32-256 rc=$? $((SECONDS-t0))s"
run_peers $((SECONDS + 230))
fi
pack_results
