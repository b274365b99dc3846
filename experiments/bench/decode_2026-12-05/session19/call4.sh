#!/usr/bin/env bash
# Session 19, the short form of call3.sh for the device time left (TOTAL seconds, default 420): pack
# .device/pack19x.tar.xz (lib_land/ = main at bin/COMMIT, lib_exp/ = ./nvfp4_lane_columns.patch on it),
# .device/peers_slim.tar.xz.
# 1. lib_exp: test_decode_cuda whole (the KDA kernels are SASS-identical to main's: its suite is not rerun);
# 2. every paper shape at B = 32 and 256, lib_exp then lib_land; then memcheck of lib_exp on the replay cases and a
#    second round of both, as far as time allows;
# 3. vLLM 0.33.0 at B = 32, 256 in the time left -> $OUT/results.tar.
# Run from the repository root: bash experiments/bench/decode_2026-12-05/session19/call4.sh
here=experiments/bench/decode_2026-12-05
TOTAL=${TOTAL:-420}
source $here/device_common.sh
unpack_pack .device/pack19x.tar.xz lib_land
LAND=$A/lib_land$SYS; EXP=$A/lib_exp$SYS
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$EXP $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
ok=1; t0=$SECONDS
LD_LIBRARY_PATH=$EXP timeout 120 $B/test_decode_cuda > $R/exp_test_decode_cuda.txt 2>&1
echo "exp test_decode_cuda rc=$? $((SECONDS-t0))s $(tail -n 3 $R/exp_test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
grep -q "Status: SUCCESS" $R/exp_test_decode_cuda.txt || { ok=0; grep -B5 -A25 "ERROR" $R/exp_test_decode_cuda.txt | head -40; }
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
for round in 1 2; do
  if [ $round = 2 ] && [ $ok = 1 ] && [ $((TOTAL - SECONDS)) -gt 100 ]; then
    t0=$SECONDS; LD_LIBRARY_PATH=$EXP timeout 70 compute-sanitizer --tool memcheck $B/test_decode_cuda \
      -tc="*ReplaySSM decode kernels equal*" > $R/memcheck_exp.txt 2>&1
    echo "memcheck exp rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_exp.txt)"
  fi
  for lib in exp land; do
    left=$((TOTAL - SECONDS - 15)); [ $left -lt 40 ] && break 2
    [ $lib = land ] && LP=$LAND || LP=$EXP
    [ $lib = exp ] && [ $ok = 0 ] && continue
    t0=$SECONDS; LD_LIBRARY_PATH=$LP timeout $((left < 120 ? left : 120)) $B/replayssm-bench bench --shapes $ALL \
      --batch 32 256 --window 16 --drafts 8 --csv $R/record_${lib}_$round.csv > $R/record_${lib}_$round.txt 2>&1
    echo "record $lib $round rc=$? $((SECONDS-t0))s"
  done
done
grep -H "nvfp4" $R/record_*_1.txt | grep "|  256 |" | cut -c1-150
left=$((TOTAL - SECONDS - 15))
if [ $left -gt 40 ]; then
  tar -C . -xJf .device/peers_slim.tar.xz
  t0=$SECONDS; timeout $left python3 scripts/bench_peers.py --peers vllm --batch 32 256 --window 16 \
    --csv $R/peers_vllm.csv > $R/peers_vllm.log 2>&1
  echo "vllm rc=$? $((SECONDS-t0))s"; tail -n 10 $R/peers_vllm.log
fi
pack_results
