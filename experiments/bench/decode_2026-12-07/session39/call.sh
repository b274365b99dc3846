#!/usr/bin/env bash
# Session 39's device call, chosen by the card that comes.
# - H200: session 38's call.sh (the run of record on main's library, then Nsight Compute by row on the NVFP4 reads and
#   Qwen3.5-4B's FP16 read).
# - H100 (the run of record on main's library was made there in session 38): what session 38 left undone on it:
#   compute-sanitizer memcheck (with leak check) on both decode suites, one case per process (session 31's
#   sanitize_cases.sh), then Nsight Compute on Kimi's FP16 read and the FP32 read it is measured against.
# Carry .device/pack59.tar.xz, .device/peers_slim.tar.xz, .device/formats_v1.json.xz.
# Run from the repository root on the device: bash experiments/bench/decode_2026-12-07/session39/call.sh
# -> H200: $OUT/record.tar, $OUT/ncu_rows.tar; H100: $OUT/memcheck.tar, $OUT/ncu_rows.tar
set -u
TOTAL=${TOTAL:-560}; PACK=${PACK:-.device/pack59.tar.xz}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "card: $gpu"
if [[ $gpu == *H200* ]]; then
  TOTAL=$TOTAL PACK=$PACK bash experiments/bench/decode_2026-12-07/session38/call.sh
  exit
fi
TOOL=memcheck LIB=lib_land PACK=$PACK PAR=${PAR:-8} TOTAL=${SAN_TOTAL:-300} \
  bash experiments/bench/decode_2026-12-07/session31/sanitize_cases.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/memcheck.tar"
ROWS="kimi-linear-48b-a3b;non-flush read fp16 (x over fp32 read);kda_nonflush_kernel
kimi-linear-48b-a3b;replay fp32 non-flush step;kda_nonflush_kernel
kimi-linear-48b-a3b;conventional fp32;kda_conventional_kernel" \
  PACK=$PACK TOTAL=$((TOTAL - SECONDS - 10)) bash experiments/bench/decode_2026-12-07/session38/ncu_rows.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/ncu_rows.tar"
ls -la "$OUT"
