#!/usr/bin/env python3
"""Outside peers of `replayssm bench` that implement this paper upstream: vLLM's Mamba-2 decode
kernels (the tuned conventional `selective_state_update` and `selective_state_update_replayssm_output_only`),
imported from the vllm wheel's files that scripts/fetch_peers.sh extracts, validated against a float64
evaluation of the recurrence on the same inputs, then timed with triton.testing.do_bench (median).
Run it on the GPU machine in the same call as `replayssm-bench bench` so the ratios come from one run.
Kernels and checks: python/replayssm_py/peers_vllm.py.
"""
import argparse
import csv
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.peers_vllm import MAMBA2_SHAPES, run_vllm_bench  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", default=".peers/vllm-0.33.0", help="extracted vllm files (scripts/fetch_peers.sh)")
    ap.add_argument("--shapes", nargs="+", default=list(MAMBA2_SHAPES), choices=list(MAMBA2_SHAPES))
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    if any(b <= 0 for b in args.batch) or args.window < 1:
        ap.error(f"--batch and --window must be positive (got {args.batch}, {args.window})")
    try:
        rows = run_vllm_bench(args.vllm, args.shapes, args.batch, args.window, log=lambda line: print(line, flush=True))
    except FileNotFoundError as e:  # the peer's files were not fetched: say so, not a traceback
        print(f"bench_peers.py: {e}", file=sys.stderr)
        return 2
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "kernel", "batch", "us_per_step"])
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
