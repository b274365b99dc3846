#!/usr/bin/env bash
# Builds what session19/call3.sh and call4.sh carry, on the build machine (nvcc, no GPU needed), from a configured
# CUDA build at HEAD (the build-dev configuration of ../session18/README.md):
#   .device/pack19.tar.xz     bin/ (bench and GPU suites, COMMIT), lib_land/ (main's library), sys/ (host libraries)
#   .device/pack19x.tar.xz    the same plus lib_exp/: the library built with nvfp4_lane_columns.patch applied
#   .device/peers_slim.tar.xz the peers' files bench_peers.py imports, from .peers (scripts/fetch_peers.sh); skipped,
#                             with a message, when .peers lacks them
# cuda/ is put back and rebuilt afterwards, so the build folder holds main's library again.
# Usage: bash experiments/bench/decode_2026-12-05/session19/make_packs.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-05/session19
build=${1:-build-dev}
[ -f "$build/CMakeCache.txt" ] || { echo "make_packs.sh: $build: not a configured build folder" >&2; exit 1; }
git diff --quiet -- cuda/ || { echo "make_packs.sh: cuda/ has uncommitted changes; commit or stash them first" >&2; exit 1; }
targets="replayssm_cuda replayssm-bench test_decode_cuda test_decode_kda_cuda test_formats_cuda"
tmp=$(mktemp -d)
trap 'git checkout -- cuda/; rm -rf "$tmp"' EXIT
cmake --build "$build" -j"$(nproc)" --target $targets
mkdir -p "$tmp"/{bin,lib_land,lib_exp,sys} .device
cp "$build"/replayssm-bench "$build"/tests/test_decode_cuda "$build"/tests/test_decode_kda_cuda \
  "$build"/tests/test_formats_cuda "$tmp"/bin/
cp "$build"/cuda/libreplayssm_cuda.so "$tmp"/lib_land/
# Host libraries the device image may lack: everything ldd resolves except the C/C++ runtimes and our library.
for lib in $(LD_LIBRARY_PATH="$tmp"/lib_land ldd "$tmp"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so* | libm.so* | libstdc++* | libgcc_s* | libresolv* | ld-linux* | libcuda.so* | libreplayssm_cuda.so) ;;
    *) cp -L "$lib" "$tmp"/sys/ ;;
  esac
done
strip "$tmp"/bin/* "$tmp"/lib_land/*.so
git rev-parse --short HEAD > "$tmp"/bin/COMMIT
(cd "$tmp" && tar -cJf - bin lib_land sys) > .device/pack19.tar.xz
git apply "$here"/nvfp4_lane_columns.patch
cmake --build "$build" -j"$(nproc)" --target replayssm_cuda
cp "$build"/cuda/libreplayssm_cuda.so "$tmp"/lib_exp/ && strip "$tmp"/lib_exp/*.so
git checkout -- cuda/
cmake --build "$build" -j"$(nproc)" --target replayssm_cuda
(cd "$tmp" && tar -cJf - bin lib_land lib_exp sys) > .device/pack19x.tar.xz
fi_root=.peers/flashinfer-0.7.2
if [ -d .peers/vllm-0.33.0 ] && [ -d "$fi_root/flashinfer/data/aot" ] && ls .peers/wheels/apache_tvm_ffi-*cp312*.whl >/dev/null 2>&1; then
  # The modules load_flashinfer_checkpointing_ssu imports (python/replayssm_py/peers_flashinfer.py), not the
  # whole 160 MB extract.
  { find .peers/vllm-0.33.0 -type f
    find "$fi_root" -maxdepth 1 -type f
    find "$fi_root"/flashinfer -maxdepth 1 -type f -name '*.py'
    find "$fi_root"/flashinfer/jit "$fi_root"/flashinfer/mamba "$fi_root"/flashinfer/data/aot -type f
    # The module's config template: without it bench_peers.py stopped at Super (session 20's call).
    find "$fi_root"/flashinfer/data/csrc -type f -name '*.jinja'
    [ -d "$fi_root"/flashinfer/autotuner ] && find "$fi_root"/flashinfer/autotuner -type f -name '*.py'
    echo "$fi_root"/flashinfer/fused_moe/utils.py
    ls .peers/wheels/apache_tvm_ffi-*cp312*.whl; } | sort -u > "$tmp"/peers.list
  tar -cJf .device/peers_slim.tar.xz -T "$tmp"/peers.list
else
  echo "make_packs.sh: .peers lacks vLLM, FlashInfer's prebuilt module or the cp312 apache-tvm-ffi wheel:" \
       "run scripts/fetch_peers.sh (PYTHON=<a python with torch>) first; peers_slim.tar.xz not made" >&2
fi
ls -la .device/pack19.tar.xz .device/pack19x.tar.xz .device/peers_slim.tar.xz 2>/dev/null || true
