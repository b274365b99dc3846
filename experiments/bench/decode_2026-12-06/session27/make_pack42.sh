#!/usr/bin/env bash
# Builds .device/pack42.tar.xz for session 27's device calls, from a configured CUDA build at main (the bench's queued
# timer and ReplayConfig::l2_prefetch_kib landed): bin/, sys/ and main's CUDA library as lib_land.
# Usage: bash experiments/bench/decode_2026-12-06/session27/make_pack42.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack42.sh
pack_library lib_land
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack42.tar.xz
ls -la .device/pack42.tar.xz
