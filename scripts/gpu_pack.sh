#!/usr/bin/env bash
# Builds the GPU binaries (kernels in one shared library, host code for the x86-64 baseline so it
# runs on any GPU machine's CPU) and packs them with the shared libraries they need that a CUDA
# machine may lack (HDF5, fmt, toml++ and their dependencies; not glibc, not CUDA's own cuBLAS),
# so a GPU machine with only the CUDA toolkit can run the GPU suites and `replayssm --device cuda`:
#
#   scripts/gpu_pack.sh [BUILD_DIR] [OUT_TARBALL]        (defaults: build-dev, .device/pack.tar.xz)
#   # on the GPU machine, from the repository root:
#   tar -C .device -xJf .device/pack.tar.xz
#   export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64 REPLAYSSM_SOURCE_DIR=$PWD
#   for t in .device/bin/test_*; do $t; done; .device/bin/replayssm kl-sweep --device cuda ...
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-dev}
out=${2:-.device/pack.tar.xz}
cmake -S . -B "$build" -DREPLAYSSM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DCMAKE_BUILD_TYPE=Release \
      -DREPLAYSSM_CUDA_SHARED=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DREPLAYSSM_HOST_ISA=portable >/dev/null
mapfile -t suites < <(cd tests/cuda && ls test_*_cuda.cpp test_*_cuda.cu 2>/dev/null | sed 's/\.cu*p*$//' | sort -u)
cmake --build "$build" -j"$(nproc)" --target replayssm replayssm-bench "${suites[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for t in replayssm replayssm-bench; do cp "$build/$t" "$stage/bin/"; done
for s in "${suites[@]}"; do cp "$build/tests/$s" "$stage/bin/"; done
cp "$build/cuda/libreplayssm_cuda.so" "$stage/lib/"
# Every shared library the binaries resolve here, except glibc's own and CUDA's (the GPU machine has those).
for b in "$stage"/bin/* "$stage/lib/libreplayssm_cuda.so"; do
  ldd "$b" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|libutil|libnsl|ld-linux[^/]*|libcublas[^/]*|libcudart[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
strip "$stage"/bin/* "$stage"/lib/*.so* 2>/dev/null || true
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" bin lib
echo "packed $(ls "$stage/bin" | wc -l) binaries and $(ls "$stage/lib" | wc -l) libraries into $out ($(du -h "$out" | cut -f1))"
