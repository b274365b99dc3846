#!/usr/bin/env bash
# Builds .device/pack32.tar.xz for session 23's fifth device call, from a configured CUDA build at main: bin/, sys/
# and three builds of the CUDA library:
#   lib_land  main;
#   lib_n4a   main + n4a_gdn_nvfp4_mma_4blocks_one_tile.patch (GDN's NVFP4 tensor-core read at 4 blocks per SM, one
#             tile in flight beyond the current one);
#   lib_n4b   main + n4b_gdn_nvfp4_mma_4blocks.patch (the same with two tiles in flight, 84 B of spills).
# Then, on the device: TOTAL=330 bash experiments/bench/decode_2026-12-06/session23/call5.sh (README.md has the rule).
# Usage: bash experiments/bench/decode_2026-12-06/session23/make_pack32.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session23
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack32.sh
pack_library lib_land
pack_library lib_n4a "$here"/n4a_gdn_nvfp4_mma_4blocks_one_tile.patch
pack_library lib_n4b "$here"/n4b_gdn_nvfp4_mma_4blocks.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_n4a lib_n4b) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack32.tar.xz
ls -la .device/pack32.tar.xz
