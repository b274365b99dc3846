#!/usr/bin/env bash
# Builds .device/pack52.tar.xz from a configured CUDA build (default build-dev): bin/ (bench, GPU suites with
# REPLAYSSM_TEST_SHARD, COMMIT), sys/, and main's CUDA library (H6 included) as lib_land. Serves a run of record
# (`LIB=lib_land PACK=.device/pack52.tar.xz ... session29/call1.sh`) and the sharded racecheck
# (`CASES=... SHARDS=4 ... session31/sanitize_cases.sh`). Usage: bash .../make_pack.sh [BUILD_DIR]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_main pack52 "${1:-build-dev}" make_pack.sh
