#!/usr/bin/env python3
"""Generate tiny random Hugging Face checkpoints and their reference log-probabilities.

For each architecture the C++ model loader supports (src/model/): a tiny model built with
transformers' own classes, randomised weights (fixed seed per model), config.json +
model.safetensors, tokens.npy, logprobs.npy (transformers' FP32 forward) and golden.json in
data/models/<name>/. What each model is and how the reference is computed: replayssm_py.goldens.

Run:  python3 scripts/make_goldens.py [--out data/models] [--only NAME ...]   (needs torch and transformers).
The tests read the files only; regenerate when transformers' modelling code changes.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py import goldens  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(goldens.MODELS_DIR), help="folder of the model folders (default data/models)")
    ap.add_argument("--only", nargs="*", default=None, choices=goldens.MODEL_NAMES, help="these models only")
    args = ap.parse_args(argv)
    goldens.write_model_goldens(args.out, args.only or goldens.MODEL_NAMES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
