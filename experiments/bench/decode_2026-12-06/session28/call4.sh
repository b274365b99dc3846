#!/usr/bin/env bash
# Session 28, call 4 (about TOTAL = 200 s): the A/B of H2 (vals_bf16_nvfp4.patch: H for the NVFP4 read alone). Pack
# .device/pack47.tar.xz (make_pack47.sh: lib_land = main, lib_h2 = main + vals_bf16_nvfp4.patch).
# Also the prepared A/Bs of H3 and H4: ARM=lib_h3 PACK=.device/pack48.tar.xz, ARM=lib_h4 PACK=.device/pack49.tar.xz
# (packs from make_pack_arm.sh); the steps below name lib_h2 for $ARM.
#  1. test_decode_cuda on lib_h2.
#  2. Three rounds, lib_h2 and lib_land alternating (lib_h2 first in odd rounds): Nemotron-3-Super and -Nano at
#     B = 64, 128, 256, every configuration checked against the CPU decoders before timing. Judged by
#     `python3 judge_h.py --arm lib_h2 call4/r` under the rule README.md gives for H2 (written before this run).
#  3. If time is left, one record round on lib_h2 (every paper shape at B = 32 and 256).
# -> $OUT/results.tar. Run from the repository root: TOTAL=200 bash experiments/bench/decode_2026-12-06/session28/call4.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-200}
ARM=${ARM:-lib_h2}
unpack_pack ${PACK:-.device/pack47.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
t0=$SECONDS
LD_LIBRARY_PATH=$(lib $ARM) timeout 100 $B/test_decode_cuda > $R/test_decode_cuda_${ARM#lib_}.txt 2>&1
echo "test_decode_cuda ($ARM) rc=$? $((SECONDS-t0))s"; tail -n 3 $R/test_decode_cuda_${ARM#lib_}.txt
ab_rounds $ARM
grep -H "non-flush read nvfp4" $R/ab_*_1.txt | grep "|  256 |" | cut -c1-160
t0=$SECONDS
[ $((TOTAL - SECONDS)) -gt 45 ] && { LD_LIBRARY_PATH=$(lib $ARM) timeout $((TOTAL - SECONDS - 10)) $B/replayssm-bench bench \
  --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 32 256 --window 16 \
  --drafts 8 --csv $R/record_1.csv > $R/record_1.txt 2>&1; echo "record round 1 ($ARM) rc=$? $((SECONDS-t0))s"; }
pack_results
