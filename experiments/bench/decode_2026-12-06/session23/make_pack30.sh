#!/usr/bin/env bash
# Builds .device/pack30.tar.xz for session 23's third device call, from a configured CUDA build at main: bin/, sys/
# and three builds of the CUDA library:
#   lib_land  main;
#   lib_f8c   main + f8c_fp8_mma_one_tile_4blocks.patch (f8a at 4 blocks per SM; Mamba-2 stages the block scales
#             in rows2).
# Then, on the device: TOTAL=560 bash experiments/bench/decode_2026-12-06/session23/call3.sh (README.md has the rule).
# Usage: bash experiments/bench/decode_2026-12-06/session23/make_pack30.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session23
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack30.sh
pack_library lib_land
pack_library lib_f8c "$here"/f8c_fp8_mma_one_tile_4blocks.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_f8c) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack30.tar.xz
ls -la .device/pack30.tar.xz
