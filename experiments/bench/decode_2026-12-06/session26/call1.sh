#!/usr/bin/env bash
# Session 26, call 1 (about TOTAL = 420 s on an H100, 560 s on an H200): pack .device/pack41.tar.xz
# (session25/make_pack41.sh at 44ab35b: main's kernels with the flush list; later commits change comments and docs).
# 1. compute-sanitizer memcheck on the replay and CUDA Graphs cases (lists, partial lists with device-resident
#    parity), synccheck on the staggered replay cases (the list check's block-wide vote): session 25's call4.sh.
# 2. Two record rounds with flush lists (the bench's default), every paper shape at B = 32 and 256.
# 3. Every paper shape at B = 8, 16, 64 and 128 (one round): the "never below 1.0x at B >= 8" target and our side of
#    the vLLM ratio at B = 64 and 128.
# 4. On an H200 only: the peers (vLLM 0.33.0, FlashInfer 0.7.2) at B = 32-256 from .device/peers_slim.tar.xz, so the
#    run is a run of record with its peers. -> $OUT/results.tar.
# Run from the repository root: TOTAL=560 bash experiments/bench/decode_2026-12-06/session26/call1.sh
TOTAL_ALL=${TOTAL:-420}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "card: $gpu"
# call4.sh ends with pack_results; hold that back until the peers have run.
body=$(mktemp)
sed 's/^pack_results$//' experiments/bench/decode_2026-12-06/session25/call4.sh > "$body"
TOTAL=$((TOTAL_ALL > 330 ? 330 : TOTAL_ALL))
source "$body"
t0=$SECONDS
[ $((TOTAL_ALL - SECONDS)) -gt 100 ] && { LD_LIBRARY_PATH=$(lib lib_land) timeout 120 $B/replayssm-bench bench \
  --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 8 16 64 128 \
  --window 16 --drafts 8 --csv $R/other_batches.csv > $R/other_batches.txt 2>&1; echo "other batches rc=$? $((SECONDS-t0))s"; }
case "$gpu" in
  *H200*) run_peers $((TOTAL_ALL - 10)) ;;
  *) echo "not an H200: peers not run" ;;
esac
pack_results
