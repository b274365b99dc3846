#!/usr/bin/env bash
# Session 37, call 2: the run of record on main's library with H9b landed (pack58, session32's pack_main at 9f625c1:
# lib_land is main's library), then Nsight Compute on the NVFP4 reads the targets still miss (B = 256), on any card.
# On an H200 Nano's NVFP4 read is profiled first (met on the H100, projected below 3.8x on an H200: docs/BENCHMARKS.md,
# session 34). Carry .device/pack58.tar.xz, .device/peers_slim.tar.xz, .device/formats_v1.json.xz; slim the tree with
# KEEP as for call 1. Run from the repository root on the device: bash experiments/bench/decode_2026-12-07/session37/call2.sh
# -> $OUT/record.tar (session 29's call1.sh: suites, two checked record rounds, B = 8-128, vLLM and FlashInfer
#    graph-timed) and $OUT/ncu_nvfp4.tar (session 33's ncu_read.sh).
set -u
TOTAL=${TOTAL:-560}; PACK=${PACK:-.device/pack58.tar.xz}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "card: $gpu"
SHAPES="qwen3.5-4b qwen3.5-122b-a10b"; [[ $gpu == *H200* ]] && SHAPES="nemotron-3-nano-4b $SHAPES"
LIB=lib_land PACK=$PACK TOTAL=${RECORD_TOTAL:-330} bash experiments/bench/decode_2026-12-06/session29/call1.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/record.tar"
PACK=$PACK LIBS=lib_land SHAPES="$SHAPES" TOTAL=$((TOTAL - SECONDS - 10)) bash experiments/bench/decode_2026-12-07/session33/ncu_read.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/ncu_nvfp4.tar"
ls -la "$OUT"
