#!/usr/bin/env python3
"""Write an FP8 block-scaled or NVFP4 (ModelOpt layout) checkpoint from an FP32 checkpoint with the
independent numpy + ml_dtypes quantizer (python/replayssm_py/quantized_checkpoints.py), and
optionally an FP32 checkpoint holding the dequantized weights (what the C++ loader must reproduce)."""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from replayssm_py.quantized_checkpoints import write_quantized_checkpoint  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("src", help="FP32 checkpoint directory (config.json + model.safetensors)")
    p.add_argument("out", help="new directory for the quantized checkpoint")
    p.add_argument("--format", choices=["fp8", "nvfp4"], required=True)
    p.add_argument("--block", type=int, nargs=2, default=[128, 128], metavar=("ROWS", "COLS"),
                   help="FP8 weight_block_size (default 128 128)")
    p.add_argument("--exclude", nargs="*", default=["lm_head"], help="modules left unquantized (default lm_head)")
    p.add_argument("--dequantized-out", help="new directory for the FP32 checkpoint of the dequantized weights")
    a = p.parse_args()
    try:
        n = len(write_quantized_checkpoint(a.src, a.out, a.format, block=tuple(a.block), exclude=tuple(a.exclude),
                                           dequantized_out=a.dequantized_out))
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"make_quantized_checkpoint: error: {e}", file=sys.stderr)
        return 2
    print(f"{a.out}: {n} matrices quantized ({a.format})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
