#!/usr/bin/env bash
# Builds .device/pack41.tar.xz for session 25's fourth device call, from a configured CUDA build at main with the flush
# list landed: bin/, sys/ and main's CUDA library as lib_land.
# Then, on the device: TOTAL=330 bash experiments/bench/decode_2026-12-06/session25/call4.sh
# Usage: bash experiments/bench/decode_2026-12-06/session25/make_pack41.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack41.sh
pack_library lib_land
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack41.tar.xz
ls -la .device/pack41.tar.xz
