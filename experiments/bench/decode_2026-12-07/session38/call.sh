#!/usr/bin/env bash
# Session 38's device call: the run of record on main's library (pack59 at bbcb403: session 29's call1.sh with
# LIB=lib_land: the suites, test_decode_cuda first, two checked record rounds, B = 8-128, vLLM and FlashInfer
# graph-timed), then Nsight Compute by row label (ncu_rows.sh) on the NVFP4 reads and Qwen3.5-4B's FP16 read at
# B = 256 (Nano's NVFP4 read first on an H200), as long as the time lasts.
# Carry .device/pack59.tar.xz, .device/peers_slim.tar.xz, .device/formats_v1.json.xz; slim the tree with session 37's
# KEEP plus tests/python/conftest.py tests/python/test_cli_bench.py experiments/bench/decode_2026-12-07/session38/.
# Run from the repository root on the device: bash experiments/bench/decode_2026-12-07/session38/call.sh
# -> $OUT/record.tar, $OUT/ncu_rows.tar
set -u
TOTAL=${TOTAL:-560}; PACK=${PACK:-.device/pack59.tar.xz}
here=experiments/bench/decode_2026-12-07/session38
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "card: $gpu"
ROWS="qwen3.5-4b;non-flush read nvfp4 (x over fp32 read);replay_nonflush_kernel
qwen3.5-122b-a10b;non-flush read nvfp4 (x over fp32 read);replay_nonflush_kernel
qwen3.5-4b;non-flush read fp16 (x over fp32 read);replay_nonflush_kernel"
[[ $gpu == *H200* ]] && ROWS="nemotron-3-nano-4b;non-flush read nvfp4 (x over fp32 read);replay_nonflush_kernel
$ROWS"
LIB=lib_land PACK=$PACK TOTAL=${RECORD_TOTAL:-330} bash experiments/bench/decode_2026-12-06/session29/call1.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/record.tar"
ROWS="$ROWS" PACK=$PACK TOTAL=$((TOTAL - SECONDS - 10)) bash $here/ncu_rows.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/ncu_rows.tar"
ls -la "$OUT"
