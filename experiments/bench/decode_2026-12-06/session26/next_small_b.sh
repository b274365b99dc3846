#!/usr/bin/env bash
# Prepared in session 26, not run (no device time left). Our staggered step at B = 32-128 against vLLM's ReplaySSM
# kernel, both timed in one call: is the small-B gap (call 4: vLLM 0.91-0.98x our time on Super) in the launcher's
# heads-per-block choice? The automatic rule at B = 32 gives Super 4 heads per block in both kernels (8 would leave
# the non-flush grid at 512 blocks, just under 4 per SM), and Nano 2 (flush) and 4 (non-flush). The bench's
# --heads-per-block N forces N in both kernels, so this sweeps one knob and changes nothing yet. N must divide the
# heads per key head (Super 16, Nano 12) with N * dv <= 1024, so each shape runs on its own.
# Pack .device/pack41.tar.xz and .device/peers_slim.tar.xz. -> $OUT/results.tar.
# Run from the repository root: TOTAL=360 bash experiments/bench/decode_2026-12-06/session26/next_small_b.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-360}
unpack_pack ${PACK:-.device/pack41.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
bench() {  # shape name [extra options]
  local shape=$1 name=$2 t0=$SECONDS; shift 2
  [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "$shape $name skipped (time)"; return; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout 60 $B/replayssm-bench bench --shapes $shape --batch 32 64 128 --window 16 \
    --drafts 8 --csv $R/ours_${shape}_$name.csv "$@" > $R/ours_${shape}_$name.txt 2>&1
  echo "ours $shape $name rc=$? $((SECONDS-t0))s"; grep "staggered" $R/ours_${shape}_$name.txt | cut -c1-110
}
for shape in nemotron-3-super nemotron-3-nano-4b; do bench $shape auto; done
for nh in 2 8 16; do bench nemotron-3-super hpb$nh --heads-per-block $nh; done
for nh in 2 6 12; do bench nemotron-3-nano-4b hpb$nh --heads-per-block $nh; done
tar -C . -xJf .device/peers_slim.tar.xz
left=$((TOTAL - SECONDS - 10))
[ $left -gt 30 ] && timeout $left python3 scripts/bench_peers.py --peers vllm --timer graph --batch 32 64 128 \
  --window 16 --csv $R/peers_vllm_graph.csv > $R/peers_vllm_graph.log 2>&1
pack_results
