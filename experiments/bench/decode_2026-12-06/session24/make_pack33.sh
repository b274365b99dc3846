#!/usr/bin/env bash
# Builds .device/pack33.tar.xz for session 24's first device call, from a configured CUDA build at main: bin/, sys/
# and three builds of the CUDA library:
#   lib_land  main;
#   lib_p32   main + p32_l2_prefetch_32k.patch (each non-flush block of a low-precision read asks L2 for the
#             first 32 KB of its read checkpoint's rows when it starts; cp.async.bulk.prefetch);
#   lib_p128  the same with 128 KB (every paper shape's whole block).
# Then, on the device: TOTAL=560 bash experiments/bench/decode_2026-12-06/session24/call1.sh (README.md has the rule).
# Usage: bash experiments/bench/decode_2026-12-06/session24/make_pack33.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session24
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack33.sh
pack_library lib_land
pack_library lib_p32 "$here"/p32_l2_prefetch_32k.patch
pack_library lib_p128 "$here"/p128_l2_prefetch_128k.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_p32 lib_p128) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack33.tar.xz
ls -la .device/pack33.tar.xz
