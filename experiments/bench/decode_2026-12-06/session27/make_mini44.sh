#!/usr/bin/env bash
# Builds .device/mini44.tar.xz (bin/test_decode_cuda and bin/COMMIT) for call3.sh, which unpacks it over pack43's bin/
# (the library is unchanged; only the test's awkward case changed).
# Usage: bash experiments/bench/decode_2026-12-06/session27/make_mini44.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
build=${1:-build-dev}
cmake --build "$build" --target test_decode_cuda
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" .device
cp "$build"/tests/test_decode_cuda "$tmp/bin/" && strip "$tmp/bin/test_decode_cuda"
git rev-parse --short HEAD > "$tmp/bin/COMMIT"
tar -C "$tmp" -cJf .device/mini44.tar.xz bin
ls -la .device/mini44.tar.xz
