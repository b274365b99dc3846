#!/usr/bin/env bash
# Builds .device/pack35.tar.xz for session 24's third device call (ablations of the non-flush read; README.md),
# from a configured CUDA build at main: bin/, sys/ and eight builds of the CUDA library:
#   lib_land         main;
#   lib_astream, lib_afold, lib_arecord, lib_aall: as pack34 (make_pack34.sh), for more rounds;
#   lib_nflush       main + ablate_flush_launch.patch (the step launches no flush kernel: the non-flush kernel alone);
#   lib_aall_nf      main + ablate_all.patch + ablate_flush_launch.patch;
#   lib_aall_nf_na   the same + ablate_append.patch (no append_record either: what is left is the launch, the
#                    window read, the shared-memory carve, the B table and the barriers).
# The ablated libraries compute wrong outputs by design: they are timed with --no-check, never landed.
# Then, on the device: TOTAL=300 bash experiments/bench/decode_2026-12-06/session24/call3.sh
# Usage: bash experiments/bench/decode_2026-12-06/session24/make_pack35.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session24
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack35.sh
pack_library lib_land
for a in stream fold record all; do pack_library lib_a$a "$here"/ablate_$a.patch; done
pack_library lib_nflush "$here"/ablate_flush_launch.patch
pack_library lib_aall_nf "$here"/ablate_all.patch "$here"/ablate_flush_launch.patch
pack_library lib_aall_nf_na "$here"/ablate_all.patch "$here"/ablate_flush_launch.patch "$here"/ablate_append.patch
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_astream lib_afold lib_arecord lib_aall lib_nflush lib_aall_nf lib_aall_nf_na) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack35.tar.xz
ls -la .device/pack35.tar.xz
