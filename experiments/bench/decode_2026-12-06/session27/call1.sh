#!/usr/bin/env bash
# Session 27, call 1 (about TOTAL = 540 s). Pack .device/pack42.tar.xz (main with the bench's queued timer and
# ReplayConfig::l2_prefetch_kib) and .device/peers_slim.tar.xz. -> $OUT/results.tar.
#  1. test_decode_cuda: every replay case, now with l2_prefetch_kib on three of them, against the CPU decoders.
#  2. The bench's two timers on the Mamba-2 shapes at B = 32 and 256: queued (new default: each sample's work queued
#     behind a hold kernel) against events (the events also bracket the host's launch calls, as every earlier run).
#  3. The staggered step at B = 32-128 (queued): the launcher's heads per block against forced 1 and 2, and L2
#     prefetches of 32, 64 and 128 KiB per non-flush block.
#  4. vLLM's ReplaySSM kernel at B = 32-128, graph-timed, in the same run.
# Run from the repository root: TOTAL=540 bash experiments/bench/decode_2026-12-06/session27/call1.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-540}
unpack_pack ${PACK:-.device/pack42.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 150 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1
echo "test_decode_cuda rc=$? $((SECONDS-t0))s"; tail -n 4 $R/test_decode_cuda.txt
bench() {  # name limit [options]
  local name=$1 limit=$2 t0=$SECONDS; shift 2
  [ $((TOTAL - SECONDS)) -lt $((limit + 100)) ] && { echo "$name skipped (time)"; return; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout $limit $B/replayssm-bench bench --window 16 --drafts 8 --csv $R/$name.csv "$@" \
    > $R/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS-t0))s"; grep "staggered\|non-flush read\|non-flush step\|conventional fp32" $R/$name.txt | cut -c1-112
}
bench queued 90 --shapes nemotron-3-super nemotron-3-nano-4b --batch 32 256
bench events 60 --shapes nemotron-3-super nemotron-3-nano-4b --batch 32 256 --timer events --no-check
for shape in nemotron-3-super nemotron-3-nano-4b; do
  bench ${shape}_auto 40 --shapes $shape --batch 32 64 128 --no-check
  for nh in 1 2; do bench ${shape}_hpb$nh 40 --shapes $shape --batch 32 64 128 --no-check --heads-per-block $nh; done
  for kib in 32 64 128; do bench ${shape}_pf$kib 40 --shapes $shape --batch 32 64 128 --no-check --l2-prefetch-kib $kib; done
done
tar -C . -xJf .device/peers_slim.tar.xz
left=$((TOTAL - SECONDS - 10))
[ $left -gt 30 ] && { t0=$SECONDS; timeout $left python3 scripts/bench_peers.py --peers vllm --timer graph --batch 32 64 128 \
  --window 16 --csv $R/peers_vllm_graph.csv > $R/peers_vllm_graph.log 2>&1; echo "vllm rc=$? $((SECONDS-t0))s"
  grep "^| nemotron" $R/peers_vllm_graph.log | cut -c1-110; }
pack_results
