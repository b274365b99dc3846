#!/usr/bin/env python3
"""Issue 13's decode-kernel targets from one device run: the `replayssm bench` CSVs (one per round) and, where the
peers ran in the same call, their CSVs (scripts/bench_peers.py, scripts/bench_fla.py):

    python3 scripts/decode_targets.py record_1.csv record_2.csv [other_batches.csv] \
        --peers peers_vllm.csv peers_flashinfer.csv [--statistic median] [--csv targets.csv] [--strict]

(--peers-graph for peer CSVs that lack a timer column but were timed in CUDA graphs.)

Each ratio is taken within a round and summarised over the rounds that have its rows (the spread is printed
beside it); a target without rows is "not measured", never met. CSVs may be xz-compressed. A file that cannot
be judged is refused with its name, line and field. Exit 1 with --strict when any target is missed or not
measured. replayssm_py/decode_targets.py lists the targets."""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.decode_targets import (CSV_HEADER, STATISTICS, TargetsInputError, csv_rows,  # noqa: E402
                                         format_markdown, judge, read_bench_csv, read_peer_csv)
from replayssm_py.files import output_refusal, write_csv_atomically  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", nargs="+", help="`replayssm bench --csv` files, one per round (.csv or .csv.xz)")
    ap.add_argument("--peers", nargs="*", default=[], help="peer CSVs of the same call (bench_peers.py, bench_fla.py); "
                    "one without a timer column was timed with events")
    ap.add_argument("--peers-graph", nargs="*", default=[], metavar="PEERS",
                    help="peer CSVs without a timer column that were timed in CUDA graphs")
    ap.add_argument("--statistic", choices=sorted(STATISTICS), default="median",
                    help="how a ratio is summarised over the rounds (median)")
    ap.add_argument("--csv", default=None, help="also write the verdicts as CSV (atomically)")
    ap.add_argument("--force", action="store_true", help="replace --csv if it exists (never done without it)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed or not measured")
    args = ap.parse_args(argv)
    if args.csv and (why := output_refusal(args.csv, args.force, "--csv")):
        ap.error(why)
    try:
        peers = [read_peer_csv(p) for p in args.peers] + [read_peer_csv(p, "graph") for p in args.peers_graph]
        verdicts = judge([read_bench_csv(p) for p in args.bench], peers, args.statistic)
    except TargetsInputError as e:
        print(f"decode_targets.py: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(format_markdown(verdicts))
    if args.csv:
        write_csv_atomically(args.csv, CSV_HEADER, csv_rows(verdicts))
    return 1 if args.strict and any(not v.met for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
