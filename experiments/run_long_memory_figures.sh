#!/usr/bin/env bash
# Issue 11's figures on the long-memory models (data/models/long_mamba2, long_nemotron_h, long_qwen3_5, long_kimi_linear,
# long_qwen3_5_ctx16k): the paper's
# configuration set at 131,072 positions on all four PG-19 test books with three SR seeds (figures 5/12),
# the window sweep L = 4..64 (figure 13), RTN vs SR with non-finite counts (table 11), then the plots.
# The sweeps read experiments/{fig5,fig13,table11}.toml; options given here replace the file's.
# Resumable: every sweep keeps its finished cells, so run the same command again after an interruption
# (e.g. a time limit); a finished sweep is reported, not recomputed.
#
#   experiments/run_long_memory_figures.sh [MODEL ...]       (default: long_mamba2 long_nemotron_h long_qwen3_5 long_kimi_linear long_qwen3_5_ctx16k)
#   BIN=build/replayssm DEVICE=auto REPLAYSSM_TEXT_DIR=../shared/data/pg19/test   (the defaults)
#
# On one H200 a model's three sweeps are ~230 cells of 128K positions (about 1-2 s each for these
# sizes); on 2 CPU cores about a minute per cell, so this is meant for the GPU (--device auto picks it).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/replayssm}
DEVICE=${DEVICE:-auto}
TEXT_DIR=${REPLAYSSM_TEXT_DIR:-../shared/data/pg19/test}
MODELS=("$@")
[[ ${#MODELS[@]} -gt 0 ]] || MODELS=(long_mamba2 long_nemotron_h long_qwen3_5 long_kimi_linear long_qwen3_5_ctx16k)
R=experiments/results
COMMON=(--text-dir "$TEXT_DIR" --device "$DEVICE" --progress lines)
for m in "${MODELS[@]}"; do
  [[ -f data/models/$m/config.json ]] || { echo "run_long_memory_figures: no model data/models/$m" >&2; exit 2; }
  echo "== $m: figure 5/12 (4 books, seeds 0,1,2)"
  "$BIN" kl-sweep "data/models/$m" --config experiments/fig5.toml --seeds 0,1,2 "${COMMON[@]}" --out "$R/fig12_$m.h5"
  echo "== $m: figure 13 (L = 4, 8, 16, 32, 64)"
  "$BIN" kl-sweep "data/models/$m" --config experiments/fig13.toml "${COMMON[@]}" --out "$R/fig13_$m.h5"
  echo "== $m: table 11 (seeds 0,1,2)"
  "$BIN" kl-sweep "data/models/$m" --config experiments/table11.toml --seeds 0,1,2 "${COMMON[@]}" --out "$R/table11_$m.h5"
  python3 scripts/plot_kl.py "$R/fig13_$m.h5" --kind window -o "$R/fig13_$m.png"
  python3 scripts/plot_kl.py "$R/table11_$m.h5" --kind table -o "$R/table11_$m.txt"
done
panels=()
for m in "${MODELS[@]}"; do panels+=("$R/fig12_$m.h5"); done
python3 scripts/plot_kl.py "${panels[@]}" -o "$R/fig12_long_models.png"
echo "run_long_memory_figures: results and plots in $R"
