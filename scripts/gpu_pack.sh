#!/usr/bin/env bash
# Builds the GPU binaries (kernels in one shared library, host code for the x86-64 baseline so it
# runs on any GPU machine's CPU) and packs them with the shared libraries they need that a CUDA
# machine may lack (HDF5, fmt, toml++ and their dependencies; not glibc, not CUDA's own cuBLAS),
# so a GPU machine with only the CUDA toolkit can run the GPU suites and `replayssm --device cuda`:
#
#   scripts/gpu_pack.sh [--with-mpi] [BUILD_DIR] [OUT_TARBALL]   (defaults: build-dev, .device/pack.tar.xz)
#   # on the GPU machine, from the repository root:
#   tar -C .device -xJf .device/pack.tar.xz
#   export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64 REPLAYSSM_SOURCE_DIR=$PWD
#   for t in .device/bin/test_*; do $t; done; .device/bin/replayssm kl-sweep --device cuda ...
#
# --with-mpi: also the Open MPI runtime of this machine's Debian packages (mpirun and its plugins,
# PMIx, hwloc, the fabric libraries; ~20 MB before compression) under mpi/, relocated by OPAL_PREFIX,
# for a GPU machine without MPI (the sharded sweep, docs/MPI_SWEEP.md):
#   export OPAL_PREFIX=$PWD/.device/mpi/usr PMIX_MCA_pcompress=^zlib
#   export PATH=$OPAL_PREFIX/bin:$PATH LD_LIBRARY_PATH=$OPAL_PREFIX/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
#   mpirun -n 2 .device/bin/replayssm kl-sweep ... --device cuda
# (PMIX_MCA_pcompress=^zlib: PMIx looks for its help texts at its build prefix and would print a
# harmless warning about its compression component.)
set -euo pipefail
cd "$(dirname "$0")/.."
with_mpi=0
if [[ ${1:-} == --with-mpi ]]; then with_mpi=1; shift; fi
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
parts=(bin lib)
if (( with_mpi )); then
  # The files of these packages as installed (no documentation), under mpi/ with their paths.
  mpi_packages=(openmpi-bin libopenmpi3 openmpi-common libpmix2 libhwloc15 libhwloc-plugins libevent-core-2.1-7
                libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 libnl-3-200 libnl-route-3-200
                libpsm-infinipath1 libpsm2-2 libnuma1 librdmacm1)
  command -v dpkg >/dev/null || { echo "gpu_pack.sh --with-mpi: needs dpkg (Debian/Ubuntu Open MPI packages)" >&2; exit 2; }
  dpkg -s openmpi-bin >/dev/null 2>&1 || { echo "gpu_pack.sh --with-mpi: openmpi-bin is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
  for p in "${mpi_packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || continue  # optional transports absent here are absent there too
    dpkg -L "$p" | grep -Ev '^/usr/share/(doc|man|lintian)(/|$)' | while read -r f; do
      if [[ -L $f || -f $f ]]; then mkdir -p "$stage/mpi$(dirname "$f")"; cp -a "$f" "$stage/mpi$f"; fi
    done
  done
  parts+=(mpi)
fi
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" "${parts[@]}"
echo "packed $(ls "$stage/bin" | wc -l) binaries and $(ls "$stage/lib" | wc -l) libraries$( ((with_mpi)) && echo " and the Open MPI runtime") into $out ($(du -h "$out" | cut -f1))"
