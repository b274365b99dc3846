#!/usr/bin/env bash
# Builds .device/pack47.tar.xz for session 28's call 4 from a configured CUDA build: bin/ (bench, GPU suites, COMMIT),
# sys/, main's CUDA library as lib_land and main plus vals_bf16_nvfp4.patch as lib_h2 (Mamba-2's NVFP4-read non-flush blocks size their
# staged records as bf16, so that Nemotron-3-Super's NVFP4 read can take 16 heads per block at L = 16).
# Usage: bash experiments/bench/decode_2026-12-06/session28/make_pack47.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack47.sh
pack_library lib_land
pack_library lib_h2 experiments/bench/decode_2026-12-06/session28/vals_bf16_nvfp4.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_h2) | xz -T2 --lzma2=preset=6,dict=96MiB > .device/pack47.tar.xz
ls -la .device/pack47.tar.xz
