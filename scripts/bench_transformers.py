#!/usr/bin/env python3
"""transformers' side of the GPU sweep benchmark (scripts/bench_gpu_sweep.sh): the validation of
`replayssm logits --device cuda` against transformers' FP32 log-probs, then transformers' own timed
forward at the longest length it holds.

  python3 scripts/bench_transformers.py --ckpt DIR --text-dir DIR --length N --out FILE.json \
      [--validate-positions 512] [--computes fp32,bf16x3] [--replayssm BIN] [--tolerance 1e-3]

The method: python/replayssm_py/transformers_bench.py.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.transformers_bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
