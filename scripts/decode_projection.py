#!/usr/bin/env python3
"""Project a run's issue 13 targets from the card it ran on to another card, through a pair of runs of one library
on both cards (replayssm_py/decode_projection.py says how, and what the projection assumes):

    python3 scripts/decode_projection.py --pair-from h100_1.csv h100_2.csv --pair-to h200_1.csv h200_2.csv \
        --run record_1.csv record_2.csv [--cards H100 H200] [--statistic median] [--row-factors [B ...]] [--csv out.csv]

Each argument takes a run's `replayssm bench --csv` rounds (.csv or .csv.xz). The output says "projected" on every
value: it is an estimate for the second card, not a measurement. Exit 2 on a file that cannot be judged (its name,
line and field in the message)."""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.decode_projection import (CSV_HEADER, TARGET_ROWS, csv_rows, format_projection,  # noqa: E402
                                            format_row_factors, project, row_factors)
from replayssm_py.decode_targets import STATISTICS, TargetsInputError, read_bench_csv  # noqa: E402
from replayssm_py.files import output_refusal, write_csv_atomically  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair-from", nargs="+", required=True, metavar="CSV",
                    help="the pair's rounds on the first card (the card the run was made on)")
    ap.add_argument("--pair-to", nargs="+", required=True, metavar="CSV",
                    help="the same library's rounds on the second card (the card projected onto)")
    ap.add_argument("--run", nargs="+", required=True, metavar="CSV", help="the run's rounds on the first card")
    ap.add_argument("--cards", nargs=2, default=["first card", "second card"], metavar=("FROM", "TO"),
                    help="the two cards' names for the table (e.g. H100 H200)")
    ap.add_argument("--statistic", choices=sorted(STATISTICS), default="median",
                    help="how a ratio is summarised over each run's rounds (median)")
    ap.add_argument("--row-factors", nargs="*", metavar="BATCH", type=int,
                    help="also print each target row's time factor between the pair's cards (at these batches; 256 "
                    "if none is given)")
    ap.add_argument("--csv", default=None, help="also write the projections as CSV (atomically)")
    ap.add_argument("--force", action="store_true", help="replace --csv if it exists (never done without it)")
    args = ap.parse_args(argv)
    if args.csv and (why := output_refusal(args.csv, args.force, "--csv")):
        ap.error(why)
    try:
        pair_from = [read_bench_csv(p) for p in args.pair_from]
        pair_to = [read_bench_csv(p) for p in args.pair_to]
        projections = project(pair_from, pair_to, [read_bench_csv(p) for p in args.run], args.statistic)
    except TargetsInputError as e:
        print(f"decode_projection.py: {e}", file=sys.stderr)
        return 2
    if not projections:
        print("decode_projection.py: no target is measured in all three runs (the pair's shapes and batches must "
              "overlap the run's)", file=sys.stderr)
        return 2
    sys.stdout.write(format_projection(projections, *args.cards))
    if args.row_factors is not None:
        batches = set(args.row_factors or [256])
        factors = {k: f for k, f in row_factors(pair_from, pair_to, args.statistic).items() if k[2] in batches}
        if not any(k[1] in TARGET_ROWS for k in factors):
            print(f"decode_projection.py: --row-factors: the pair has no target rows at B = "
                  f"{', '.join(map(str, sorted(batches)))}", file=sys.stderr)
            return 2
        sys.stdout.write("\nEach row's time between the pair's cards:\n\n")
        sys.stdout.write(format_row_factors(factors, TARGET_ROWS, *args.cards))
    if args.csv:
        write_csv_atomically(args.csv, CSV_HEADER, csv_rows(projections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
