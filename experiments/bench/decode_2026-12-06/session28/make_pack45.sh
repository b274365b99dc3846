#!/usr/bin/env bash
# Builds .device/pack45.tar.xz for session 28's calls from a configured CUDA build: bin/ (bench, GPU suites, COMMIT),
# sys/ and main's CUDA library as lib_land (nothing patched: session 28 measures main).
# Usage: bash experiments/bench/decode_2026-12-06/session28/make_pack45.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_main pack45 "${1:-build-dev}" make_pack45.sh
