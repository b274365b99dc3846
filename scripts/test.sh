#!/usr/bin/env bash
# Runs every test: installs dependencies and builds (scripts/setup.sh), then the C++ suites
# (ctest; GPU suites report SKIPPED without a GPU) and the Python suites (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
echo "[test] ctest"
(cd "$BUILD_DIR" && ctest --output-on-failure -j"$(nproc)" "$@")
echo "[test] pytest"
REPLAYSSM_BIN="$PWD/$BUILD_DIR/replayssm" python3 -m pytest -q tests/python
