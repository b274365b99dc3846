#!/usr/bin/env bash
# Session 29, call 2: the run of record (about TOTAL = 580 s) on pack .device/pack49.tar.xz (session 28's
# make_pack_arm.sh at d0a029d: lib_land = main's library, lib_h4 = main + vals_bf16_nvfp4_widen.patch; bench and
# GPU suites built at that commit) and .device/peers_slim.tar.xz. LIB picks the library (lib_land unless H4 landed).
# 0. The GPU suites against the CPU decoders: test_decode_cuda, test_decode_kda_cuda, test_formats_cuda.
# 1. Two record rounds, every paper shape at B = 32 and 256, each configuration checked against the CPU decoders first.
# 2. Every paper shape at B = 8, 16, 64 and 128 (one round, checked).
# 3. The peers (vLLM 0.33.0, FlashInfer 0.7.2) at B = 32-256, graph-timed (scripts/bench_peers.py's default).
# -> $OUT/results.tar. Judge: python3 scripts/decode_targets.py r/record_*.csv.xz r/other_batches.csv.xz --peers r/peers_*.csv.xz
# Run from the repository root: LIB=lib_land TOTAL=580 bash experiments/bench/decode_2026-12-06/session29/call2.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-580}
LIB=${LIB:-lib_land}
unpack_pack ${PACK:-.device/pack49.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; echo "$LIB" > $R/library.txt
LD_LIBRARY_PATH=$(lib $LIB) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
for suite in test_decode_cuda test_decode_kda_cuda test_formats_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $LIB) timeout 120 $B/$suite > $R/$suite.txt 2>&1
  echo "$suite rc=$? $((SECONDS-t0))s $(grep 'test cases:' $R/$suite.txt | tr -s ' ')"
done
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
for round in 1 2; do
  t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 200 ] && { echo "record round $round skipped (time)"; continue; }
  LD_LIBRARY_PATH=$(lib $LIB) timeout 150 $B/replayssm-bench bench --shapes $ALL --batch 32 256 \
    --window 16 --drafts 8 --csv $R/record_$round.csv > $R/record_$round.txt 2>&1
  echo "record round $round rc=$? $((SECONDS-t0))s"
done
grep -h "non-flush read\|staggered" $R/record_1.txt | grep "|  256 |" | cut -c1-130
t0=$SECONDS
[ $((TOTAL - SECONDS)) -gt 200 ] && { LD_LIBRARY_PATH=$(lib $LIB) timeout 120 $B/replayssm-bench bench --shapes $ALL \
  --batch 8 16 64 128 --window 16 --drafts 8 --csv $R/other_batches.csv > $R/other_batches.txt 2>&1
  echo "other batches rc=$? $((SECONDS-t0))s"; }
run_peers $((TOTAL - 10))
pack_results
