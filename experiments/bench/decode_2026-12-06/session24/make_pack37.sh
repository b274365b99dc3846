#!/usr/bin/env bash
# Builds .device/pack37.tar.xz for session 24's seventh device call (variant r: the tensor-core reads' record phase after the stream;
# README.md), from a configured CUDA build at main: bin/, sys/, lib_land (main) and lib_r (main +
# r_record_phase_after_stream.patch).
# Then, on the device: TOTAL=330 bash experiments/bench/decode_2026-12-06/session24/call7.sh
# Usage: bash experiments/bench/decode_2026-12-06/session24/make_pack37.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session24
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack37.sh
pack_library lib_land
pack_library lib_r "$here"/r_record_phase_after_stream.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_r) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack37.tar.xz
ls -la .device/pack37.tar.xz
