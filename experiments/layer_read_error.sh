#!/usr/bin/env bash
# Which SSM layer's low-precision read error grows with the window L (issue 11, figure 13 on long_nemotron_h):
# the split policy on one layer at a time (every other layer FP32 conventional), KL against the FP32 reference
# from the per-position log-probabilities of `replayssm logits`, mean over three position ranges.
#
#   experiments/layer_read_error.sh [MODEL_DIR] [POSITIONS] [POLICY_WITHOUT_L]
#   (defaults: data/models/long_nemotron_h 8192 split:nvfp4+rtn/fp32; L = 4 and 64; the first PG-19 test
#    book in name order; BIN=build/replayssm, REPLAYSSM_TEXT_DIR=../shared/data/pg19/test)
# CPU: about 7 s per pass of 8,192 positions for long_nemotron_h (13 passes).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-data/models/long_nemotron_h}
N=${2:-8192}
POLICY=${3:-split:nvfp4+rtn/fp32}
BIN=${BIN:-build/replayssm}
TEXT_DIR=${REPLAYSSM_TEXT_DIR:-../shared/data/pg19/test}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
book=$(python3 -c "import sys; from replayssm_py.text import list_books; print(list_books(sys.argv[1])[0])" "$TEXT_DIR")
python3 - "$book" "$N" "$W/ids.npy" <<'PY'
import sys, numpy as np
from replayssm_py.text import strip_book
ids = np.frombuffer(strip_book(sys.argv[1]), np.uint8)[: int(sys.argv[2]) + 1].astype(np.int32)
if ids.size < int(sys.argv[2]) + 1:
    sys.exit(f"layer_read_error: {sys.argv[1]} holds {ids.size} bytes after stripping, fewer than {sys.argv[2]} + 1")
np.save(sys.argv[3], ids)
PY
# the SSM layers (M Mamba-2, G Gated DeltaNet, K Kimi Delta Attention) from the pattern `replayssm info` prints
layers=$("$BIN" info "$MODEL" | python3 -c "
import sys
line = next(l for l in sys.stdin if l.startswith('layers'))
print(' '.join(str(i) for i, c in enumerate(line.split(':', 1)[1].split()[0]) if c in 'MGK'))")
echo "model $MODEL, book $book, $N positions, SSM layers: $layers"
"$BIN" logits "$MODEL" --tokens "$W/ids.npy" --out "$W/ref.npy" --policy conv:fp32 --device cpu
for L in 4 64; do
  "$BIN" logits "$MODEL" --tokens "$W/ids.npy" --out "$W/all_L$L.npy" --policy "$POLICY@$L" --device cpu
  for layer in $layers; do
    "$BIN" logits "$MODEL" --tokens "$W/ids.npy" --out "$W/layer${layer}_L$L.npy" --policy conv:fp32 \
      --layer-policy "$layer=$POLICY@$L" --device cpu
  done
done
python3 - "$W" "$N" "$POLICY" $layers <<'PY'
import sys, pathlib, numpy as np
w, n, policy, layers = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
ref = np.load(w / "ref.npy").astype(np.float64)[:n]
p_ref = np.exp(ref)
cuts = [0, n // 16, n // 4, n]
def kl(name):
    k = (p_ref * (ref - np.load(w / f"{name}.npy").astype(np.float64)[:n])).sum(1)
    return [k[a:b].mean() for a, b in zip(cuts, cuts[1:])] + [np.median(k[cuts[2]:])]
head = " ".join(f"({a}, {b}]".rjust(14) for a, b in zip(cuts, cuts[1:]))
print(f"{'quantized (' + policy + ')':34s} {'L':>3s} {head} {'median, last':>14s}")
for who in ["all", *[f"layer{l}" for l in layers]]:
    for L in (4, 64):
        print(f"{who:34s} {L:3d} " + " ".join(f"{v:14.3e}" for v in kl(f"{who}_L{L}")))
PY
