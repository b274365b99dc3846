#!/usr/bin/env bash
# Builds .device/pack43.tar.xz for session 27 calls 2 on, from a configured CUDA build at main (the bench's queued
# timer and ReplayConfig::flush_heads_per_block): bin/, sys/, main's CUDA library as lib_land and, as lib_pf, main plus
# l2_prefetch.patch (the experiment: REPLAYSSM_L2_PREFETCH_KIB KiB of each non-flush block's checkpoint prefetched to L2).
# Usage: bash experiments/bench/decode_2026-12-06/session27/make_pack43.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack43.sh
pack_library lib_land
pack_library lib_pf experiments/bench/decode_2026-12-06/session27/l2_prefetch.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_pf) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack43.tar.xz
ls -la .device/pack43.tar.xz
