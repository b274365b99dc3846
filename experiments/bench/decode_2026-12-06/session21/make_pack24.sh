#!/usr/bin/env bash
# Builds .device/pack24.tar.xz for session 21's third device call, from a configured CUDA build at 75f4e73 or
# later (C, D and F landed): bin/, sys/ and three builds of the CUDA library:
#   lib_land  main;
#   lib_e     main + kda_conventional_split.patch (E: KDA's conventional kernel splits an FP32 head's rows over
#             blocks of 64);
#   lib_e3    main + kda_conventional_split_prefetch_fp32.patch (E3: E, and for FP32 states the next batch's loads
#             issued before the current batch is updated; its FP32 instances are SASS-identical to call 2's lib_e2).
# Then, on the device: TOTAL=450 bash experiments/bench/decode_2026-12-06/session21/call3.sh (README.md has the rules).
# Usage: bash experiments/bench/decode_2026-12-06/session21/make_pack24.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session21
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack24.sh
pack_library lib_land
pack_library lib_e "$here"/kda_conventional_split.patch
pack_library lib_e3 "$here"/kda_conventional_split_prefetch_fp32.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_e lib_e3) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack24.tar.xz
ls -la .device/pack24.tar.xz
