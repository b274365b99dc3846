#!/usr/bin/env bash
# The next device call after session 39 (prepared, not run). Carry .device/pack60.tar.xz (make_pack_arm.sh pack60
# lib_h10 experiments/bench/decode_2026-12-07/session39/h10_kda_row_sum_scatter.patch: lib_land = main's library,
# lib_h10 = main + H10), .device/peers_slim.tar.xz and .device/formats_v1.json.xz; slim the tree with session 39's KEEP.
# - H200: this session's call.sh H200 branch on main's library: the run of record, then Nsight Compute on the projected
#   H200 misses (rows_h200.txt). H10 waits for an H100.
# - H100: H10's A/B under its rule (README.md, written before any run; judge_h.py --a-rows kda): test_decode_kda_cuda
#   on lib_h10 (the suite that runs the changed kernel), three alternating rounds of Kimi-Linear and Nemotron-3-Super
#   at B = 64-256, then the run of record on the library the rule picks (session 29's call1.sh).
# Run from the repository root on the device: bash experiments/bench/decode_2026-12-07/session39/next_call.sh
set -u
PACK=${PACK:-.device/pack60.tar.xz}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "card: $gpu"
if [[ $gpu == *H200* ]]; then
  PACK=$PACK TOTAL=${TOTAL:-560} bash experiments/bench/decode_2026-12-07/session39/call.sh
else
  ARM=lib_h10 ARM_SUITE=test_decode_kda_cuda A_ROWS=kda PACK=$PACK AB_SHAPES="kimi-linear-48b-a3b nemotron-3-super" \
    AB_TIMEOUT=120 TOTAL=${TOTAL:-480} bash experiments/bench/decode_2026-12-06/session29/call1.sh
fi
