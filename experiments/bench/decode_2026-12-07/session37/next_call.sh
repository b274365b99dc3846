#!/usr/bin/env bash
# Session 37, call 1. On an H200: session 33's h200_call.sh on main's library (the run of record with Nsight Compute);
# H9b waits. On any other card: H9b's A/B under session 37's rule (README.md, written before this call; judge_h.py
# --a-rows nvfp4) and the run of record on the library the rule picks (session 29's call1.sh).
# Carry .device/pack57.tar.xz (session 28's make_pack_arm.sh pack57 lib_h9b
# experiments/bench/decode_2026-12-07/session36/h9b_nvfp4_host_constants.patch; its lib_land is main's library: cuda/ has
# not changed since), .device/peers_slim.tar.xz and .device/formats_v1.json.xz. Slim the tree first with KEEP as in
# session 36, adding experiments/bench/decode_2026-12-07/session37/.
# Run from the repository root on the device: bash experiments/bench/decode_2026-12-07/session37/next_call.sh
set -u
PACK=.device/pack57.tar.xz
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "card: $gpu"
if [[ $gpu == *H200* ]]; then
  PACK=$PACK TOTAL=${TOTAL:-560} bash experiments/bench/decode_2026-12-07/session33/h200_call.sh
else
  ARM=lib_h9b PACK=$PACK A_ROWS=nvfp4 \
    AB_SHAPES="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b" AB_TIMEOUT=120 \
    TOTAL=${TOTAL:-480} bash experiments/bench/decode_2026-12-06/session29/call1.sh
fi
