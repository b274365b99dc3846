#!/usr/bin/env bash
# Builds .device/pack46.tar.xz for session 28's call 3: main's CUDA library as lib_land and main plus vals_bf16.patch
# as lib_h (Mamba-2's non-flush blocks size their staged records as bf16, so that Nemotron-3-Super's NVFP4 read can
# take 16 heads per block at L = 16), with bin/ and sys/ (make_pack_arm.sh).
# Usage: bash experiments/bench/decode_2026-12-06/session28/make_pack46.sh [BUILD_DIR (default build-dev)]
exec bash "$(dirname "$0")/make_pack_arm.sh" pack46 lib_h experiments/bench/decode_2026-12-06/session28/vals_bf16.patch "$@"
