#!/usr/bin/env bash
# Builds .device/pack47.tar.xz for session 28's call 4: main's CUDA library as lib_land and main plus
# vals_bf16_nvfp4.patch as lib_h2 (H for Mamba-2's NVFP4 read alone), with bin/ and sys/ (make_pack_arm.sh).
# Usage: bash experiments/bench/decode_2026-12-06/session28/make_pack47.sh [BUILD_DIR (default build-dev)]
exec bash "$(dirname "$0")/make_pack_arm.sh" pack47 lib_h2 experiments/bench/decode_2026-12-06/session28/vals_bf16_nvfp4.patch "$@"
