#!/usr/bin/env bash
# Prepared for the next device call (session 35 had no device time left for it). Carry .device/pack56.tar.xz
# (make_pack_arm.sh pack56 lib_h9 experiments/bench/decode_2026-12-07/session35/h9_per_launch_constants.patch: main's
# library as lib_land and main + H9 as lib_h9), .device/peers_slim.tar.xz and .device/formats_v1.json.xz.
# - On an H200: session 33's h200_call.sh on main's library (the run of record the done-when needs, with Nsight
#   Compute on the NVFP4 reads and Kimi's FP16 read); H9 waits for a later call.
# - Otherwise: H9's A/B under its rule (README.md; judge_h.py --a-model qwen3.5-4b) and the run of record on the
#   library the rule picks (session 29's call1.sh).
# Slim the tree first with KEEP="scripts/ python/ experiments/bench/decode_2026-12-05/device_common.sh
# experiments/bench/decode_2026-12-06/session28/judge_h.py experiments/bench/decode_2026-12-06/session29/
# experiments/bench/decode_2026-12-07/session33/ experiments/bench/decode_2026-12-07/session35/ .gitignore".
# Run from the repository root on the device: bash experiments/bench/decode_2026-12-07/session35/next_call.sh
set -u
PACK=.device/pack56.tar.xz
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "card: $gpu"
if [[ $gpu == *H200* ]]; then
  PACK=$PACK TOTAL=560 bash experiments/bench/decode_2026-12-07/session33/h200_call.sh
else
  ARM=lib_h9 PACK=$PACK A_MODEL=qwen3.5-4b \
    AB_SHAPES="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b" AB_TIMEOUT=120 \
    TOTAL=560 bash experiments/bench/decode_2026-12-06/session29/call1.sh
fi
