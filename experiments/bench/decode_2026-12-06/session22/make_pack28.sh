#!/usr/bin/env bash
# Builds .device/pack28.tar.xz for session 22's ninth device call, from a configured CUDA build at main: bin/, sys/
# and two builds of the CUDA library:
#   lib_land  main;
#   lib_epi   main + verify_epilogue_shared.patch (one verification epilogue for decode_verify.cu and
#             decode_verify_split.cu).
# Then, on the device: TOTAL=170 bash experiments/bench/decode_2026-12-06/session22/call9.sh (README.md has the rule).
# Usage: bash experiments/bench/decode_2026-12-06/session22/make_pack28.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session22
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack28.sh
pack_library lib_land
pack_library lib_epi "$here"/verify_epilogue_shared.patch
rm -f cuda/ssm/decode_verify_epilogue.cuh  # the patch's new file (git checkout leaves untracked files)
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_epi) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack28.tar.xz
ls -la .device/pack28.tar.xz
