#!/usr/bin/env bash
# Builds .device/pack27.tar.xz for session 22's eighth device call, from a configured CUDA build at main: bin/, sys/
# and three builds of the CUDA library:
#   lib_land  main;
#   lib_h     main + h_gdn_fp8_four_blocks.patch (H: GDN FP8 read at 4 blocks per SM);
#   lib_h2    main + h2_gdn_fp8_four_blocks_batch2.patch (H2: H with 2 row iterations per batch).
# Then, on the device: TOTAL=540 bash experiments/bench/decode_2026-12-06/session22/call8.sh (README.md has the rule).
# Usage: bash experiments/bench/decode_2026-12-06/session22/make_pack27.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session22
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack27.sh
pack_library lib_land
pack_library lib_h "$here"/h_gdn_fp8_four_blocks.patch
pack_library lib_h2 "$here"/h2_gdn_fp8_four_blocks_batch2.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_h lib_h2) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack27.tar.xz
ls -la .device/pack27.tar.xz
