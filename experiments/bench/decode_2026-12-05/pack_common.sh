# Sourced by the pack builders (session19/make_packs.sh, ../decode_2026-12-06/session20/make_pack.sh), from the
# repository root, after `set -euo pipefail`; they run on the build machine (nvcc, no GPU needed).
#   pack_begin BUILD_DIR CALLER: checks BUILD_DIR is a configured CUDA build and cuda/ is committed; builds the
#     bench, the GPU suites and the library; fills $tmp/bin (binaries, COMMIT) and $tmp/sys (host libraries the
#     device image may lack). cuda/ is put back and $tmp removed when the caller exits.
#   pack_library NAME [PATCH...]: cuda/ as committed plus the patches, built, stripped into $tmp/NAME.
#   pack_end: cuda/ as committed, rebuilt, so the build folder holds main's library again.
#   pack_main NAME BUILD_DIR CALLER: .device/NAME.tar.xz with bin/, sys/ and main's library as lib_land alone.
pack_begin() {
  build=$1
  [ -f "$build/CMakeCache.txt" ] || { echo "$2: $build: not a configured build folder" >&2; exit 1; }
  git diff --quiet -- cuda/ || { echo "$2: cuda/ has uncommitted changes; commit or stash them first" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'git checkout -- cuda/; rm -rf "$tmp"' EXIT
  cmake --build "$build" -j"$(nproc)" --target replayssm_cuda replayssm-bench test_decode_cuda test_decode_kda_cuda test_formats_cuda
  mkdir -p "$tmp"/{bin,sys} .device
  cp "$build"/replayssm-bench "$build"/tests/test_decode_cuda "$build"/tests/test_decode_kda_cuda \
    "$build"/tests/test_formats_cuda "$tmp"/bin/
  # Everything ldd resolves except the C/C++ runtimes, CUDA's driver and our library.
  local lib
  for lib in $(LD_LIBRARY_PATH="$build"/cuda ldd "$tmp"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
    case $(basename "$lib") in
      libc.so* | libm.so* | libstdc++* | libgcc_s* | libresolv* | ld-linux* | libcuda.so* | libreplayssm_cuda.so) ;;
      *) cp -L "$lib" "$tmp"/sys/ ;;
    esac
  done
  strip "$tmp"/bin/*
  git rev-parse --short HEAD > "$tmp"/bin/COMMIT
}
pack_library() {
  git checkout -- cuda/
  local p; for p in "${@:2}"; do git apply "$p"; done
  cmake --build "$build" -j"$(nproc)" --target replayssm_cuda
  mkdir -p "$tmp/$1" && cp "$build"/cuda/libreplayssm_cuda.so "$tmp/$1"/ && strip "$tmp/$1"/*.so
  git diff --stat -- cuda/ > "$tmp/$1"/PATCHES.txt || true
}
pack_end() {
  git checkout -- cuda/
  cmake --build "$build" -j"$(nproc)" --target replayssm_cuda
}
pack_main() {
  pack_begin "$2" "$3"
  pack_library lib_land
  (cd "$tmp" && tar -cf - bin sys lib_land) | xz -T2 --lzma2=preset=6,dict=96MiB > ".device/$1.tar.xz"
  ls -la ".device/$1.tar.xz"
}
