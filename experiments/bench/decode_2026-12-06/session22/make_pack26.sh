#!/usr/bin/env bash
# Builds .device/pack26.tar.xz for session 22's last device call, from a configured CUDA build at main (G landed):
# bin/, sys/ and main's library as lib_land. Then, on the device:
# TOTAL=360 bash experiments/bench/decode_2026-12-06/session22/call6.sh
# Usage: bash experiments/bench/decode_2026-12-06/session22/make_pack26.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack26.sh
pack_library lib_land
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack26.tar.xz
ls -la .device/pack26.tar.xz
