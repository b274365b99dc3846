#!/usr/bin/env bash
# Builds .device/PACK.tar.xz for an A/B of session 28 from a configured CUDA build: bin/ (bench, GPU suites, COMMIT),
# sys/, main's CUDA library as lib_land and main plus PATCH as ARM. The prepared ones:
#   make_pack_arm.sh pack48 lib_h3 experiments/bench/decode_2026-12-06/session28/vals_bf16_nvfp4_pad.patch
#   make_pack_arm.sh pack49 lib_h4 experiments/bench/decode_2026-12-06/session28/vals_bf16_nvfp4_widen.patch
# (make_pack46.sh and make_pack47.sh call it for calls 3 and 4.) Usage: bash .../make_pack_arm.sh PACK ARM PATCH [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ $# -ge 3 ] || { echo "usage: make_pack_arm.sh PACK ARM PATCH [BUILD_DIR]" >&2; exit 2; }
pack=$1 arm=$2 patch=$3
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${4:-build-dev}" make_pack_arm.sh
pack_library lib_land
pack_library "$arm" "$patch"
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land "$arm") | xz -T2 --lzma2=preset=6,dict=96MiB > ".device/$pack.tar.xz"
ls -la ".device/$pack.tar.xz"
