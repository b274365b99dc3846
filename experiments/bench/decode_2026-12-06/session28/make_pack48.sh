#!/usr/bin/env bash
# Builds .device/pack48.tar.xz for session 28's call 5 from a configured CUDA build: bin/ (bench, GPU suites, COMMIT),
# sys/, main's CUDA library as lib_land and main plus vals_bf16_nvfp4_pad.patch as lib_h3 (H2: Mamba-2's NVFP4-read
# non-flush blocks size their staged records as bf16; and the launcher asks for the fp32-sized room wherever three
# such blocks fit one SM, so that only the wider blocks get the smaller request).
# Usage: bash experiments/bench/decode_2026-12-06/session28/make_pack48.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack48.sh
pack_library lib_land
pack_library lib_h3 experiments/bench/decode_2026-12-06/session28/vals_bf16_nvfp4_pad.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_h3) | xz -T2 --lzma2=preset=6,dict=96MiB > .device/pack48.tar.xz
ls -la .device/pack48.tar.xz
