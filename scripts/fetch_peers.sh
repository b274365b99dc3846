#!/usr/bin/env bash
# Fetches the outside peers of `replayssm bench` at run time (nothing of them is kept in this
# repository): downloads the vllm 0.33.0 wheel from PyPI and extracts only the Mamba-2 decode kernel
# files (vllm/model_executor/layers/mamba/ops, ~0.5 MB) into .peers/vllm-0.33.0, which
# scripts/bench_peers.py imports. Usage: scripts/fetch_peers.sh [DEST]   (default .peers)
set -euo pipefail
dest=${1:-.peers}
version=0.33.0
mkdir -p "$dest/wheels"
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
