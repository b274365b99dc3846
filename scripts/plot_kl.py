#!/usr/bin/env python3
"""Figures and tables from a `replayssm kl-sweep` result file (schema in docs/KL_SWEEP.md).

    python3 scripts/plot_kl.py results-fig5.h5 -o kl.png                  # KL vs length (paper fig. 5)
    python3 scripts/plot_kl.py model-a.h5 model-b.h5 -o fig12.png         # one panel per model (fig. 12)
    python3 scripts/plot_kl.py model-a.h5 b-table11.h5+b-fig13.h5 -o fig12.png   # a panel from two sweeps of model b
    python3 scripts/plot_kl.py results-fig13.h5 --kind window -o win.png  # window sweep (fig. 13)
    python3 scripts/plot_kl.py results-table11.h5 --kind table            # RTN vs SR (table 11)

KL vs length: mean KL over the positions of each length bucket ((512, 1K], (1K, 2K], ...), pooled
over books, on log axes, with bands of +- 2 standard errors (block bootstrap over positions, stored
in result files of schema version 2; older files are drawn without bands); separate-precision
(split) configurations are solid blue-green lines, shared checkpoints dashed warm colours,
conventional decode dotted grey, and the legend names only the styles drawn. Non-finite positions
(NaN/Inf, e.g. an overflowed RTN state) are left out of the means and counted in the legend. The SR
seeds of one policy are pooled into one curve (mean over seeds; the band also covers their spread);
a double arrow gives shared NVFP4 over the separate NVFP4/FP32 configuration at the longest length
(the paper's arrow); a curve that another hides (within 10% everywhere) has open markers and says so.

A panel argument 'A+B' (when no file has that name) draws the configurations of several result files of
one model as one panel: same model, books, reference, buckets and bootstrap, refused otherwise; a
configuration in more than one file must have the same bucket means in each (results.merge_results).

The work is done by the replayssm_py package (results, plot, tables), which
notebooks/kl_vs_length.ipynb uses too.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.plot import KINDS, write_report  # noqa: E402


def bucket_ends(text):
    """--lengths: comma-separated positive integers."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive bucket ends, e.g. 1024,16384; "
                                         f"got '{text}'")
    return tuple(values)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="result file(s) written by replayssm kl-sweep (several: --kind length "
                    "draws one panel per file; A+B: one panel from the cells of several files of one model)")
    ap.add_argument("-o", "--output", help="image file (png, pdf, svg); --kind table: text file (also printed)")
    ap.add_argument("--kind", choices=KINDS, default="length")
    ap.add_argument("--configs", nargs="*", help="regular expressions selecting configurations (default: all)")
    ap.add_argument("--lengths", type=bucket_ends,
                    help="--kind table: bucket ends, comma-separated (default 1024,16384,65536,131072)")
    ap.add_argument("--title")
    ap.add_argument("--dpi", type=int, default=150)
    args = ap.parse_args(argv)
    try:
        text, out = write_report(args.results, kind=args.kind, output=args.output, configs=args.configs,
                                 lengths=args.lengths, title=args.title, dpi=args.dpi)
    except (OSError, ValueError) as e:  # re.error (a bad --configs pattern) is a ValueError
        print(f"plot_kl.py: {e}", file=sys.stderr)
        return 1
    if text is not None:
        print(text)
    else:
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
