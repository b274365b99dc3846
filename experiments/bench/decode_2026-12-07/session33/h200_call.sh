#!/usr/bin/env bash
# Prepared in session 33 for the next device call (meant for an H200; it runs on whatever card comes, which gpu.txt
# names): in one call, main's run of record (session 29's call1.sh with LIB=lib_land: the suites, two checked record
# rounds, B = 8-128, vLLM and FlashInfer graph-timed) and Nsight Compute on the misses that the figures have not ruled
# out (docs/BENCHMARKS.md, session 33's table): the NVFP4 reads of Nano and Qwen3.5-122B and Kimi's FP16 read, B = 256.
# Carry .device/pack52.tar.xz (session32/make_pack.sh), .device/peers_slim.tar.xz, .device/formats_v1.json.xz.
# Run from the repository root on the device: TOTAL=560 bash experiments/bench/decode_2026-12-07/session33/h200_call.sh
# -> $OUT/record.tar (call1.sh's results), $OUT/ncu_nvfp4.tar and $OUT/ncu_kimi_fp16.tar (ncu_read.sh's).
set -u
TOTAL=${TOTAL:-560}; PACK=${PACK:-.device/pack52.tar.xz}
here=experiments/bench/decode_2026-12-07/session33
LIB=lib_land PACK=$PACK TOTAL=${RECORD_TOTAL:-300} bash experiments/bench/decode_2026-12-06/session29/call1.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/record.tar"
PACK=$PACK LIBS=lib_land SHAPES="nemotron-3-nano-4b qwen3.5-122b-a10b" TOTAL=$((TOTAL - SECONDS - 80)) bash $here/ncu_read.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/ncu_nvfp4.tar"
PACK=$PACK LIBS=lib_land SHAPES=kimi-linear-48b-a3b KERNEL=kda_nonflush_kernel SKIP=110 TOTAL=$((TOTAL - SECONDS)) bash $here/ncu_read.sh
[ -f "$OUT/results.tar" ] && mv "$OUT/results.tar" "$OUT/ncu_kimi_fp16.tar"
ls -la "$OUT"
