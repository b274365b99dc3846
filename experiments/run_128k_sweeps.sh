#!/usr/bin/env bash
# The paper's configuration set (REPLAYSSM.md section 4, L = 16) on both bundled trained models,
# teacher-forced on PG-19 test books: 128K positions on two books for the Mamba-2 model; for the
# Qwen3.5 hybrid 32K positions on two books and 128K positions on the first book (its two attention
# layers make a 128K pass take 11-17 minutes on 2 cores, ten passes per book; see
# experiments/README.md). Resumable: rerun to continue.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/replayssm}
TEXT_DIR=${REPLAYSSM_TEXT_DIR:-../shared/data/pg19/test}
P=shared:fp16+sr,shared:fp8b128+sr,shared:nvfp4+sr,shared:fp16+rtn,shared:fp8b128+rtn,shared:nvfp4+rtn,split:nvfp4+rtn/fp32,split:nvfp4+rtn/fp16+sr,split:nvfp4+rtn/fp8b128+sr
"$BIN" kl-sweep data/models/tiny_mamba2 --text-dir "$TEXT_DIR" --books 2 --length 131072 --policies $P \
  --windows 16 --seeds 0 --out experiments/results/kl128k_tiny_mamba2.h5 --progress lines
"$BIN" kl-sweep data/models/tiny_qwen3_5 --text-dir "$TEXT_DIR" --books 2 --length 32768 --policies $P \
  --windows 16 --seeds 0 --out experiments/results/kl32k_tiny_qwen3_5.h5 --progress lines
"$BIN" kl-sweep data/models/tiny_qwen3_5 --text-dir "$TEXT_DIR" --books 1 --length 131072 --policies $P \
  --windows 16 --seeds 0 --out experiments/results/kl128k_tiny_qwen3_5.h5 --progress lines
