#!/usr/bin/env python3
"""Agreement of two result files of the same kl-sweep (e.g. GPU against CPU):

    python3 scripts/compare_results.py experiments/results/kl128k_tiny_mamba2.h5 \
        experiments/results/kl128k_tiny_mamba2_gpu.h5 [--block 1024] [--max-z 4]

Prints, per configuration, both mean KLs, their relative difference, the difference in standard
errors over blocks of positions, the largest relative difference of a length bucket's mean, the
per-position correlation and the fraction of bit-identical positions (replayssm_py/compare.py says
why the comparison is statistical). Exit 1 when a configuration's |z| exceeds --max-z."""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.compare import compare_results, format_comparison  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--block", type=int, default=1024, help="positions per block of the standard error (1024)")
    p.add_argument("--max-z", type=float, default=4.0, help="largest |z| accepted (4)")
    args = p.parse_args()
    try:
        rows = compare_results(args.a, args.b, args.block)
    except (ValueError, OSError, KeyError) as e:
        sys.exit(f"compare_results: {e}")
    print(format_comparison(rows, "A", "B"))
    worst = max(abs(r["z"]) for r in rows)
    print(f"largest |z| {worst:.2f} (limit {args.max_z})")
    return 0 if worst <= args.max_z else 1


if __name__ == "__main__":
    sys.exit(main())
