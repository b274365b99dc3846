#!/usr/bin/env bash
# Session 26, call 1 (about TOTAL = 330 s on an H100, 480 s on an H200): pack .device/pack41.tar.xz
# (session25/make_pack41.sh at 44ab35b: main's kernels with the flush list; later commits change comments and docs).
# 1. compute-sanitizer memcheck on the replay and CUDA Graphs cases (lists, partial lists with device-resident
#    parity), synccheck on the staggered replay cases (the list check's block-wide vote): session 25's call4.sh.
# 2. Two record rounds with flush lists (the bench's default), every paper shape at B = 32 and 256.
# 3. On an H200 only: the peers (vLLM 0.33.0, FlashInfer 0.7.2) at B = 32-256 from .device/peers_slim.tar.xz, so the
#    run is a run of record with its peers. -> $OUT/results.tar.
# Run from the repository root: TOTAL=480 bash experiments/bench/decode_2026-12-06/session26/call1.sh
TOTAL_ALL=${TOTAL:-330}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "card: $gpu"
# call4.sh ends with pack_results; hold that back until the peers have run.
sed 's/^pack_results$//' experiments/bench/decode_2026-12-06/session25/call4.sh > /tmp/call4_body.sh
TOTAL=$((TOTAL_ALL > 330 ? 330 : TOTAL_ALL))
source /tmp/call4_body.sh
case "$gpu" in
  *H200*) run_peers $((TOTAL_ALL - 10)) ;;
  *) echo "not an H200: peers not run" ;;
esac
pack_results
