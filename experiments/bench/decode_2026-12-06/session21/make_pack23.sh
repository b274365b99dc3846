#!/usr/bin/env bash
# Builds .device/pack23.tar.xz for session 21's second device call, from a configured CUDA build at 9c953c9 or
# later: bin/, sys/ and four builds of the CUDA library:
#   lib_land  main;
#   lib_e     main + kda_conventional_split.patch (E: KDA's conventional kernel splits an FP32 head's rows
#             over blocks of 64, as the Mamba-2/GDN kernel does);
#   lib_e2    main + kda_conventional_split_prefetch.patch (E2: E, and the next batch's loads issued before
#             the current batch is updated, as the Mamba-2/GDN kernel does);
#   lib_e2f   lib_e2 + f_row_parts_ceil64.patch (F: heads of dv > 64 rows that are not a multiple of 64 split
#             into ceil(dv / 64) equal blocks: Nemotron-3-Nano's 80 rows in two of 40; host code only).
# Then, on the device: TOTAL=480 bash experiments/bench/decode_2026-12-06/session21/call.sh (README.md has the rules).
# Usage: bash experiments/bench/decode_2026-12-06/session21/make_pack23.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session21
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack23.sh
pack_library lib_land
pack_library lib_e "$here"/kda_conventional_split.patch
pack_library lib_e2 "$here"/kda_conventional_split_prefetch.patch
pack_library lib_e2f "$here"/kda_conventional_split_prefetch.patch "$here"/f_row_parts_ceil64.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_e lib_e2 lib_e2f) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack23.tar.xz
ls -la .device/pack23.tar.xz
