#!/usr/bin/env bash
# Builds .device/pack25.tar.xz for session 22's second device call, from a configured CUDA build at main: bin/, sys/
# and three builds of the CUDA library:
#   lib_land  main;
#   lib_g     main + g_nvfp4_wide_rows.patch (G: an NVFP4 read allows 1,024 rows per non-flush block);
#   lib_g2    main + g2_nvfp4_wide_rows_small_grid.patch (G2: G, and 1 block per SM is grid enough for an NVFP4 read).
# Then, on the device: TOTAL=540 bash experiments/bench/decode_2026-12-06/session22/call2.sh (README.md has the rule).
# Usage: bash experiments/bench/decode_2026-12-06/session22/make_pack25.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session22
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack25.sh
pack_library lib_land
pack_library lib_g "$here"/g_nvfp4_wide_rows.patch
pack_library lib_g2 "$here"/g2_nvfp4_wide_rows_small_grid.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_g lib_g2) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack25.tar.xz
ls -la .device/pack25.tar.xz
