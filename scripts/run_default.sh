#!/usr/bin/env bash
# The main job on the bundled default. Installs and builds first (idempotent).
# Until the KL sweep lands this is the number-format self-check: definitions, Philox known
# answers, code round trips and the committed numpy/ml_dtypes golden file.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
"$BUILD_DIR/replayssm" formats
