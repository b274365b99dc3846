#!/usr/bin/env bash
# Builds .device/pack20.tar.xz, what session20/call.sh carries, from a configured CUDA build at HEAD (the build-dev
# configuration of ../../decode_2026-12-05/session18/README.md), on the build machine (nvcc; no GPU needed):
#   bin/ (bench and GPU suites, COMMIT), sys/ (host libraries), and five builds of the CUDA library:
#   lib_land  main;
#   lib_a     main + verify_records_outer.patch (the verification's per-row epilogue, records outermost);
#   lib_ab    main + verify_streamed.patch (that, and GDN's tensor-core verification streamed by cp.async);
#   lib_all   lib_ab's + ../../decode_2026-12-05/session19/nvfp4_lane_columns.patch;
#   lib_exp   main + nvfp4_lane_columns.patch.
# The patches touch disjoint files (the verification: decode_verify.cu, decode_replay_flush.cu, mma_tf32.cuh; the
# NVFP4 read: mma_read.cuh, decode_replay_nonflush.cu). One xz stream with a dictionary larger than a library: each
# build after the first costs about 2 MB of the pack, not 19.
# cuda/ is put back and rebuilt afterwards, so the build folder holds main's library again.
# Usage: bash experiments/bench/decode_2026-12-06/session20/make_pack.sh [BUILD_DIR (default build-dev)]
# The patches apply to 41c3ece (A, B and the lane columns landed in e39e803): run it from a checkout of that commit.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session20
nvfp4=experiments/bench/decode_2026-12-05/session19/nvfp4_lane_columns.patch
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack.sh
pack_library lib_land
pack_library lib_a "$here"/verify_records_outer.patch
pack_library lib_ab "$here"/verify_streamed.patch
pack_library lib_all "$here"/verify_streamed.patch "$nvfp4"
pack_library lib_exp "$nvfp4"
pack_end
(cd "$tmp" && tar -cf - bin sys lib_land lib_a lib_ab lib_all lib_exp) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack20.tar.xz
ls -la .device/pack20.tar.xz
