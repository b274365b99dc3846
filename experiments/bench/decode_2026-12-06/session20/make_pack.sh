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
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-06/session20
nvfp4=experiments/bench/decode_2026-12-05/session19/nvfp4_lane_columns.patch
build=${1:-build-dev}
[ -f "$build/CMakeCache.txt" ] || { echo "make_pack.sh: $build: not a configured build folder" >&2; exit 1; }
git diff --quiet -- cuda/ || { echo "make_pack.sh: cuda/ has uncommitted changes; commit or stash them first" >&2; exit 1; }
targets="replayssm_cuda replayssm-bench test_decode_cuda test_decode_kda_cuda test_formats_cuda"
tmp=$(mktemp -d)
trap 'git checkout -- cuda/; rm -rf "$tmp"' EXIT
cmake --build "$build" -j"$(nproc)" --target $targets
mkdir -p "$tmp"/{bin,sys} .device
cp "$build"/replayssm-bench "$build"/tests/test_decode_cuda "$build"/tests/test_decode_kda_cuda \
  "$build"/tests/test_formats_cuda "$tmp"/bin/
# Host libraries the device image may lack: everything ldd resolves except the C/C++ runtimes and our library.
for lib in $(LD_LIBRARY_PATH="$build"/cuda ldd "$tmp"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so* | libm.so* | libstdc++* | libgcc_s* | libresolv* | ld-linux* | libcuda.so* | libreplayssm_cuda.so) ;;
    *) cp -L "$lib" "$tmp"/sys/ ;;
  esac
done
strip "$tmp"/bin/*
git rev-parse --short HEAD > "$tmp"/bin/COMMIT
library() {  # library NAME PATCH...: cuda/ as main plus the patches, built, stripped into $tmp/NAME
  git checkout -- cuda/
  local p; for p in "${@:2}"; do git apply "$p"; done
  cmake --build "$build" -j"$(nproc)" --target replayssm_cuda
  mkdir -p "$tmp/$1" && cp "$build"/cuda/libreplayssm_cuda.so "$tmp/$1"/ && strip "$tmp/$1"/*.so
  (cd "$tmp/$1" && { git -C "$OLDPWD" diff --stat -- cuda/ || true; } > PATCHES.txt)
}
library lib_land
library lib_a "$here"/verify_records_outer.patch
library lib_ab "$here"/verify_streamed.patch
library lib_all "$here"/verify_streamed.patch "$nvfp4"
library lib_exp "$nvfp4"
git checkout -- cuda/
cmake --build "$build" -j"$(nproc)" --target replayssm_cuda
(cd "$tmp" && tar -cf - bin sys lib_land lib_a lib_ab lib_all lib_exp) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack20.tar.xz
ls -la .device/pack20.tar.xz
