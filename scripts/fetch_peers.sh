#!/usr/bin/env bash
# Fetches the outside peers of `replayssm bench` at run time (nothing of them is kept in this
# repository); scripts/bench_peers.py imports them from DEST. Usage: scripts/fetch_peers.sh [DEST]
# (default .peers). Idempotent: wheels are downloaded once, extracts and builds are redone only when
# missing.
#  - vLLM 0.33.0: the vllm wheel from PyPI; only the Mamba-2 decode kernel files
#    (vllm/model_executor/layers/mamba/ops, ~0.5 MB) into DEST/vllm-0.33.0.
#  - FlashInfer 0.7.2 (checkpointing_ssu, python/replayssm_py/peers_flashinfer.py): the
#    flashinfer-python wheel; its Python files, the checkpointing_ssu sources and the headers they
#    compile against (flashinfer/data/{include,csrc/tvm_ffi_utils.h,cutlass,cccl,spdlog}) into
#    DEST/flashinfer-0.7.2; the apache-tvm-ffi wheel it needs, for this python (the build) and for the
#    device image's CPython ($DEVICE_PYTHON, default 3.12) into DEST/wheels; then FlashInfer's own JIT
#    build of checkpointing_ssu for sm_90a (H200), one module per paper Mamba-2 shape at L = 16, installed
#    as its AOT artifacts flashinfer/data/aot/<uri>/<uri>.so (needs nvcc, ninja and torch in $PYTHON,
#    default python3; no GPU). Compiling takes minutes per shape.
set -euo pipefail
dest=${1:-.peers}
py=${PYTHON:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dest/wheels"

# ---- vLLM ----
version=0.33.0
if ! ls "$dest"/wheels/vllm-$version-*.whl >/dev/null 2>&1; then
  python3 -m pip download --no-deps --only-binary=:all: "vllm==$version" -d "$dest/wheels"
fi
out="$dest/vllm-$version"
rm -rf "$out"
mkdir -p "$out"
python3 - "$dest"/wheels/vllm-$version-*.whl "$out" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("vllm/model_executor/layers/mamba/ops/")]
    z.extractall(out, names)
print(f"{wheel}: {len(names)} files -> {out}")
PY
echo "$version" > "$out/VERSION"
du -sh "$out"

# ---- FlashInfer ----
fi_version=0.7.2
tvm_ffi_version=0.1.15.post2
device_python=${DEVICE_PYTHON:-3.12}
if ! ls "$dest"/wheels/flashinfer_python-$fi_version-*.whl >/dev/null 2>&1; then
  python3 -m pip download --no-deps --only-binary=:all: "flashinfer-python==$fi_version" -d "$dest/wheels"
fi
dev_tag=cp${device_python/./}
if ! ls "$dest"/wheels/apache_tvm_ffi-$tvm_ffi_version-$dev_tag-*.whl >/dev/null 2>&1; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version "$device_python" \
    --platform manylinux_2_28_x86_64 "apache-tvm-ffi==$tvm_ffi_version" -d "$dest/wheels"
fi
fi_out="$dest/flashinfer-$fi_version"
if [ "$(cat "$fi_out/VERSION" 2>/dev/null)" != "$fi_version" ]; then
  rm -rf "$fi_out"
  mkdir -p "$fi_out"
  python3 - "$dest"/wheels/flashinfer_python-$fi_version-*.whl "$fi_out" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
headers = ("flashinfer/data/include/", "flashinfer/data/cutlass/include/", "flashinfer/data/cutlass/tools/util/include/",
           "flashinfer/data/spdlog/include/", "flashinfer/data/cccl/")
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist()
             if (n.endswith(".py") and not n.startswith("flashinfer/data/"))
             or n.startswith("flashinfer/data/csrc/checkpointing_ssu") or n == "flashinfer/data/csrc/tvm_ffi_utils.h"
             or n.startswith(headers)]
    z.extractall(out, names)
print(f"{wheel}: {len(names)} files -> {out}")
PY
  echo "$fi_version" > "$fi_out/VERSION"
fi
# apache-tvm-ffi for the build's python, unless it has it.
pylib="$dest/pylib-$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
if ! PYTHONPATH="$pylib" "$py" -c "import tvm_ffi" 2>/dev/null; then
  tmp=$(mktemp -d)
  "$py" -m pip download --no-deps --only-binary=:all: "apache-tvm-ffi==$tvm_ffi_version" -d "$tmp"
  "$py" -m pip install --no-deps --no-index --target "$pylib" "$tmp"/apache_tvm_ffi-*.whl
  rm -rf "$tmp"
fi
if PYTHONPATH="$pylib" "$py" -c "import torch, tvm_ffi, jinja2, filelock, pynvml, tqdm" 2>/dev/null && command -v nvcc >/dev/null && command -v ninja >/dev/null; then
  PYTHONPATH="$repo/python:$pylib${PYTHONPATH:+:$PYTHONPATH}" "$py" -m replayssm_py.peers_flashinfer build-aot "$fi_out"
  rm -rf "$fi_out/.build"
else
  echo "fetch_peers.sh: $py lacks one of torch, tvm_ffi, jinja2, filelock, pynvml (nvidia-ml-py), tqdm, or nvcc/ninja" \
       "are missing: FlashInfer's checkpointing_ssu was NOT prebuilt (PYTHON=... to pick another python)" >&2
fi
du -sh "$fi_out" "$fi_out"/flashinfer/data/aot 2>/dev/null || true
ls -l "$dest"/wheels/apache_tvm_ffi-*.whl
