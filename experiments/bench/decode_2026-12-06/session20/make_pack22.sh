#!/usr/bin/env bash
# Builds .device/pack22.tar.xz for the next device call, from a configured CUDA build at e39e803 or later (changes C
# and D apply to main): bin/, sys/ and four builds of the CUDA library:
#   lib_land  main;
#   lib_c     main + verify_streamed_mamba2.patch (C: Mamba-2's verification at dk = 128, T = 8 on the streamed tensor cores);
#   lib_d     main + verify_split_records_outer.patch (D: Algorithm 3's verification epilogue with the records outermost);
#   lib_cd    both (they touch disjoint files: decode_verify.cu, decode_verify_split.cu).
# Then, on the device (README.md, "Next device call"):
#   PACK=.device/pack22.tar.xz EXP=lib_cd ALONE="lib_c lib_d" PART= \
#   MEMCHECK="*verification kernels*,*after verification*,*split-precision verification*" \
#   TOTAL=585 bash experiments/bench/decode_2026-12-06/session20/call.sh
# Usage: bash experiments/bench/decode_2026-12-06/session20/make_pack22.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session20
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack22.sh
pack_library lib_land
pack_library lib_c "$here"/verify_streamed_mamba2.patch
pack_library lib_d "$here"/verify_split_records_outer.patch
pack_library lib_cd "$here"/verify_streamed_mamba2.patch "$here"/verify_split_records_outer.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_c lib_d lib_cd) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack22.tar.xz
ls -la .device/pack22.tar.xz
