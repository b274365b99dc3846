#!/usr/bin/env bash
# The main job on the bundled default: a teacher-forced KL sweep of the bundled long-memory byte-level
# Mamba-2 model (data/models/long_mamba2, trained by scripts/train_tiny.py; 14 of its 48 heads remember
# >= 1,000 tokens, so stored-state errors accumulate with length as in the paper) on the PG-19 test
# books, a few precision configurations, then the KL-vs-length figure. Installs and builds first
# (idempotent).
#
#   REPLAYSSM_TEXT_DIR   folder of PG-19 .txt books (default: ../shared/data/pg19/test)
#   REPLAYSSM_LENGTH     positions per book (default 8192)
#   OUT                  result file (default results.h5; an existing sweep with the same settings is
#                        reported, not recomputed; a different one is refused: pass FORCE=1)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
TEXT_DIR=${REPLAYSSM_TEXT_DIR:-../shared/data/pg19/test}
if ! compgen -G "$TEXT_DIR/*.txt" >/dev/null; then
  echo "run_default: no text found in '$TEXT_DIR'." >&2
  echo "  Point REPLAYSSM_TEXT_DIR at a folder of PG-19 books (.txt, raw Gutenberg releases are fine)," >&2
  echo "  e.g. REPLAYSSM_TEXT_DIR=/data/pg19/test scripts/run_default.sh" >&2
  exit 2
fi
OUT=${OUT:-results.h5}
FORCE_FLAG=()
[ "${FORCE:-0}" = 1 ] && FORCE_FLAG=(--force)
"$BUILD_DIR/replayssm" kl-sweep data/models/long_mamba2 --text-dir "$TEXT_DIR" --books 4 \
  --length "${REPLAYSSM_LENGTH:-8192}" \
  --policies shared:nvfp4+sr,shared:nvfp4+rtn,shared:fp8b128+sr,split:nvfp4/fp32,split:nvfp4/fp16+sr \
  --windows 16 --seeds 0 --out "$OUT" "${FORCE_FLAG[@]}"
python3 scripts/plot_kl.py "$OUT" -o kl.png
echo "run_default: wrote $OUT and kl.png"
