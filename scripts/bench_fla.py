#!/usr/bin/env python3
"""Outside peer for `replayssm bench`: flash-linear-attention's Triton decode kernels on the
paper's shapes (one decode step, T = 1, FP32 state read and written), timed with
replayssm_py/peer_timing.py (median, --timer), bytes = state read + state written, as in the C++ bench.
Kernels and shapes: replayssm_py.peers_fla (scripts/bench_peers.py has the upstream peers).

Runs on the device machine (torch + triton there); fla is carried as wheels (docs/BENCHMARKS.md).
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.files import output_refusal  # noqa: E402
from replayssm_py.peer_timing import TIMERS  # noqa: E402
from replayssm_py.peers_fla import DEFAULT_BATCHES, run_fla_bench  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=list(DEFAULT_BATCHES))
    ap.add_argument("--timer", choices=TIMERS, default="events",
                    help="events (default, as every fla run so far; it counts the host's launch path into short "
                         "kernels) or graph (not yet run with fla); replayssm_py/peer_timing.py")
    ap.add_argument("--csv", default=None, help="also write the times as CSV (atomically, at the end)")
    ap.add_argument("--force", action="store_true", help="replace --csv if it exists (never done without it)")
    args = ap.parse_args(argv)
    if args.csv and (why := output_refusal(args.csv, args.force, "--csv")):
        ap.error(why)  # before fla loads or anything runs
    run_fla_bench(args.batch, args.csv, log=lambda line: print(line, flush=True), timer=args.timer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
