#!/usr/bin/env python3
"""Make a checkpoint with random weights and the published shapes of a 4B-class model (issue 10, Benchmark).

    python3 scripts/make_random_checkpoint.py --shape qwen3.5-4b|nemotron-3-nano-4b --out DIR
        [--seed S] [--layers K] [--tiny] [--vocab V] [--device auto|cuda|cpu] [--force]

The shapes, their sources and the method: python/replayssm_py/random_checkpoint.py.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.random_checkpoint import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
