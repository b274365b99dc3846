#!/usr/bin/env bash
# Builds .device/pack36.tar.xz for session 24's fifth device call (KDA's non-flush read without its state stream;
# README.md), from a configured CUDA build at main: bin/, sys/, lib_land (main) and lib_kda_astream (main +
# ablate_kda_stream.patch: the KDA non-flush block reads no checkpoint row; wrong outputs by design, timed with
# --no-check, never landed).
# Then, on the device: TOTAL=150 bash experiments/bench/decode_2026-12-06/session24/call5.sh
# Usage: bash experiments/bench/decode_2026-12-06/session24/make_pack36.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session24
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack36.sh
pack_library lib_land
pack_library lib_kda_astream "$here"/ablate_kda_stream.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_kda_astream) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack36.tar.xz
ls -la .device/pack36.tar.xz
