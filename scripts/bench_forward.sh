#!/usr/bin/env bash
# CPU forward throughput of every bundled model: `replayssm logits` over N byte tokens of the first
# PG-19 test book under conv:fp32 and a split policy; prints the tokens/s the command reports.
#   scripts/bench_forward.sh [N=4096]        (REPLAYSSM_TEXT_DIR as in run_default.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-4096}
BIN=${BIN:-build/replayssm}
TEXT_DIR=${REPLAYSSM_TEXT_DIR:-../shared/data/pg19/test}
book=$(ls "$TEXT_DIR"/*.txt | head -n 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$book" "$N" "$tmp/ids.npy" <<'PY'
import sys, numpy as np
data = open(sys.argv[1], "rb").read()
start = data.find(b"*** START OF")
start = data.find(b"\n", start) + 1 if start >= 0 else 0
np.save(sys.argv[3], np.frombuffer(data[start:start + int(sys.argv[2])], dtype=np.uint8).astype(np.int32))
PY
echo "# replayssm logits throughput, $N tokens, $(nproc) cores, $(git rev-parse --short=12 HEAD), $(date -u +%F)"
for model in data/models/*/; do
  model=${model%/}
  [ -f "$model/config.json" ] || continue
  for policy in conv:fp32 split:nvfp4/fp32@16; do
    line=$("$BIN" logits "$model" --tokens "$tmp/ids.npy" --policy "$policy" --out "$tmp/lp.npy" --force 2>&1 | grep -o '[0-9.]* tokens/s' || echo "failed")
    printf '%-28s %-22s %s\n' "$(basename "$model")" "$policy" "$line"
  done
done
