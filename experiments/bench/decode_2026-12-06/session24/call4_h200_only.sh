#!/usr/bin/env bash
# Session 24, call 4: session 23's run of record (call4.sh with pack31, main's library: cuda/ is unchanged since
# 3bc254a) only if the machine is an H200; on any other card it runs nothing (the H100 record is session 23's call 4).
# Run from the repository root: TOTAL=300 bash experiments/bench/decode_2026-12-06/session24/call4_h200_only.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "card: $gpu"
case "$gpu" in
  *H200*) TOTAL=${TOTAL:-300} bash experiments/bench/decode_2026-12-06/session23/call4.sh ;;
  *) echo "not an H200: nothing run" ;;
esac
