#!/usr/bin/env bash
# A run of record for the next session, on an H200 (about TOTAL = 560 s; prepared in session 27, not run): pack $PACK
# (default .device/pack43.tar.xz, rebuilt by make_pack43.sh at the commit to be measured: after 52898fc, where call 2's
# pack was built, the launcher's host-side checks were refactored, kernels unchanged), .device/mini44.tar.xz (the fixed
# test_decode_cuda; make_mini44.sh) and .device/peers_slim.tar.xz; the bench's queued timer (its default).
# 0. test_decode_cuda against the CPU decoders.
# 1. Two record rounds, every paper shape at B = 32 and 256, each configuration checked against the CPU decoders
#    before timing.
# 2. Every paper shape at B = 8, 16, 64 and 128 (one round).
# 3. The peers (vLLM 0.33.0, FlashInfer 0.7.2) at B = 32-256, graph-timed (scripts/bench_peers.py's default).
# -> $OUT/results.tar. Judge: python3 scripts/decode_targets.py r/record_*.csv.xz r/other_batches.csv.xz --peers r/peers_*.csv.xz
# Run from the repository root: TOTAL=560 bash experiments/bench/decode_2026-12-06/session27/record.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-560}
unpack_pack ${PACK:-.device/pack43.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
[ -f .device/mini44.tar.xz ] && tar -C $A -xJf .device/mini44.tar.xz
cat $A/bin/COMMIT > $R/pack_commit.txt
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 100 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1
echo "test_decode_cuda rc=$? $((SECONDS-t0))s"; tail -n 3 $R/test_decode_cuda.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
for round in 1 2; do
  t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 200 ] && { echo "record round $round skipped (time)"; continue; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout 150 $B/replayssm-bench bench --shapes $ALL --batch 32 256 \
    --window 16 --drafts 8 ${BENCH_EXTRA:-} --csv $R/record_$round.csv > $R/record_$round.txt 2>&1
  echo "record round $round rc=$? $((SECONDS-t0))s"
done
grep -h "non-flush read\|staggered" $R/record_1.txt | grep "|  256 |" | cut -c1-130
t0=$SECONDS
[ $((TOTAL - SECONDS)) -gt 200 ] && { LD_LIBRARY_PATH=$(lib lib_land) timeout 120 $B/replayssm-bench bench --shapes $ALL \
  --batch 8 16 64 128 --window 16 --drafts 8 ${BENCH_EXTRA:-} --csv $R/other_batches.csv > $R/other_batches.txt 2>&1
  echo "other batches rc=$? $((SECONDS-t0))s"; }
run_peers $((TOTAL - 10))
pack_results
