#!/usr/bin/env bash
# Builds .device/pack34.tar.xz for session 24's second device call (ablations of the non-flush read; README.md),
# from a configured CUDA build at main: bin/, sys/ and five builds of the CUDA library:
#   lib_land     main;
#   lib_astream  main + ablate_stream.patch  (the non-flush block reads no checkpoint row);
#   lib_afold    main + ablate_fold.patch    (no coefficient pass, no fold: no output written);
#   lib_arecord  main + ablate_record.patch  (no record staging, key products, decay weights);
#   lib_aall     main + ablate_all.patch     (all three: what is left is the block's skeleton).
# The ablated libraries compute wrong outputs by design: they are timed with --no-check, never landed.
# Then, on the device: TOTAL=330 bash experiments/bench/decode_2026-12-06/session24/call2.sh
# Usage: bash experiments/bench/decode_2026-12-06/session24/make_pack34.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session24
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack34.sh
pack_library lib_land
for a in stream fold record all; do pack_library lib_a$a "$here"/ablate_$a.patch; done
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_astream lib_afold lib_arecord lib_aall) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack34.tar.xz
ls -la .device/pack34.tar.xz
