#!/usr/bin/env bash
# Session 39's device call, chosen by the card that comes.
# - H200: the run of record on main's library (session 29's call1.sh with LIB=lib_land: the suites, two checked record
#   rounds, B = 8-128, vLLM and FlashInfer graph-timed), then Nsight Compute by row (session 38's ncu_rows.sh) on the
#   rows of rows_h200.txt (the projected H200 misses, most decisive first) in the time left.
# - H100 (the run of record on main's library was made there in session 38): what session 38 left undone on it:
#   compute-sanitizer memcheck (with leak check) on both decode suites, one case per process (session 31's
#   sanitize_cases.sh; SAN_TOTAL seconds), racecheck on the cases that run the NVFP4 read (RACE_TOTAL seconds),
#   then Nsight Compute on Kimi's FP16 read, its FP32 read and its conventional step in the time left.
# Carry .device/pack59.tar.xz, .device/peers_slim.tar.xz, .device/formats_v1.json.xz.
# Run from the repository root on the device: bash experiments/bench/decode_2026-12-07/session39/call.sh
# -> H200: $OUT/record.tar, $OUT/ncu_rows.tar; H100: $OUT/memcheck.tar, $OUT/racecheck.tar, $OUT/ncu_rows.tar
set -u
TOTAL=${TOTAL:-560}; PACK=${PACK:-.device/pack59.tar.xz}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "card: $gpu"
if [[ $gpu == *H200* ]]; then
  LIB=lib_land PACK=$PACK TOTAL=${RECORD_TOTAL:-330} bash experiments/bench/decode_2026-12-06/session29/call1.sh
  [ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/record.tar"
  # Nsight Compute on the rows the projection (README) says an H200 misses, in order of what they would decide.
  ROWS="$(cat experiments/bench/decode_2026-12-07/session39/rows_h200.txt)" PACK=$PACK TOTAL=$((TOTAL - SECONDS - 10)) \
    bash experiments/bench/decode_2026-12-07/session38/ncu_rows.sh
  [ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/ncu_rows.tar"
  ls -la "$OUT"
  exit
fi
TOOL=memcheck LIB=lib_land PACK=$PACK PAR=${PAR:-8} TOTAL=${SAN_TOTAL:-170} \
  bash experiments/bench/decode_2026-12-07/session31/sanitize_cases.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/memcheck.tar"
# racecheck on the cases that run H9b's NVFP4 read (its shape constants and shared layout from the host): the split
# low-precision reads (02), with appendix F skipping (03), the NaN block-scale case (11); 02 and 03 in shards.
CASES="test_decode_cuda|02 test_decode_cuda|03 test_decode_cuda|11" SHARDS=4 TOOL=racecheck LIB=lib_land PACK=$PACK \
  PAR=9 TOTAL=${RACE_TOTAL:-260} bash experiments/bench/decode_2026-12-07/session31/sanitize_cases.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/racecheck.tar"
ROWS="kimi-linear-48b-a3b;non-flush read fp16 (x over fp32 read);kda_nonflush_kernel
kimi-linear-48b-a3b;replay fp32 non-flush step;kda_nonflush_kernel
kimi-linear-48b-a3b;conventional fp32;kda_conventional_kernel" \
  PACK=$PACK TOTAL=$((TOTAL - SECONDS - 10)) bash experiments/bench/decode_2026-12-07/session38/ncu_rows.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/ncu_rows.tar"
ls -la "$OUT"
