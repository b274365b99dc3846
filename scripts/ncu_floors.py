#!/usr/bin/env python3
"""What bounds each profiled decode kernel: the issue floor and the DRAM floor of one launch, from Nsight Compute's
text reports (`ncu -i REP --page details`, plain or .xz; experiments/bench/decode_2026-12-07/session38/ncu_rows.sh
writes them as <shape>_<n>_details.txt beside <shape>_<n>_row.txt, which names the bench row):

    python3 scripts/ncu_floors.py r/*_details.txt.xz

Prints a markdown table; replayssm_py/ncu_floors.py defines the floors. A report it cannot read is refused with its
name and what is missing."""
import argparse
import lzma
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.ncu_floors import NcuReportError, format_table, read_launch  # noqa: E402


def row_label(details):
    """The bench row ncu_rows.sh profiled for this report (its _row.txt: shape;label;kernel), else the file name."""
    name = details.name
    for suffix in (".xz", ".txt"):
        name = name.removesuffix(suffix)
    stem = name.removesuffix("_details")
    for row in (details.parent / f"{stem}_row.txt", details.parent / f"{stem}_row.txt.xz"):
        if row.exists():
            opener = lzma.open if row.suffix == ".xz" else open
            with opener(row, "rt") as f:
                shape, label, _ = (f.read().strip().split(";") + ["", ""])[:3]
            return f"{shape}: {label}"
    return details.name


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", type=pathlib.Path, help="ncu --page details text reports (.txt or .txt.xz)")
    args = ap.parse_args(argv)
    try:
        launches = [read_launch(p) for p in args.reports]
    except (NcuReportError, OSError) as e:
        print(f"ncu_floors.py: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(format_table(launches, [row_label(p) for p in args.reports]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
