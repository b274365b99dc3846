#!/usr/bin/env bash
# Builds .device/pack29.tar.xz for session 23's first device call, from a configured CUDA build at main: bin/, sys/
# and three builds of the CUDA library:
#   lib_land  main;
#   lib_f8a   main + f8a_fp8_mma_one_tile_3blocks.patch (the FP8-b128 read on the tensor cores, one tile in flight
#             per warp beyond the current one, 3 blocks per SM);
#   lib_f8b   main + f8b_fp8_mma_two_tiles_2blocks.patch (the same, two tiles in flight, 2 blocks per SM).
# Then, on the device: TOTAL=560 bash experiments/bench/decode_2026-12-06/session23/call1.sh (README.md has the rule).
# Usage: bash experiments/bench/decode_2026-12-06/session23/make_pack29.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session23
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack29.sh
pack_library lib_land
pack_library lib_f8a "$here"/f8a_fp8_mma_one_tile_3blocks.patch
pack_library lib_f8b "$here"/f8b_fp8_mma_two_tiles_2blocks.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_f8a lib_f8b) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack29.tar.xz
ls -la .device/pack29.tar.xz
