"""Splits a kernel's executed warp instructions (Nsight Compute source page as SASS, `ncu -i REP --page source
--print-source sass --csv`) into runs of consecutive instructions with the same execution count (basic blocks, or
several), and prints each run that holds at least --min-share of the total: its offset, length, executions per warp,
instructions per warp, share, and its commonest opcodes. A loop body shows as a long run executed more than once per
warp. Usage: python3 sass_blocks.py [--warps N] [--min-share 0.004] SASS.csv[.xz]"""
import argparse
import csv
import lzma
from collections import Counter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--warps", type=int, required=True, help="warps of the profiled launch (blocks x warps per block)")
    ap.add_argument("--min-share", type=float, default=0.004)
    a = ap.parse_args()
    opener = lzma.open if a.csv.endswith(".xz") else open
    with opener(a.csv, "rt", newline="") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if "Instructions Executed" in r)
    cols = rows[header]
    executed, source = cols.index("Instructions Executed"), cols.index("Source")
    data = rows[header + 1:]
    base = int(data[0][0], 16)
    runs = []
    for r in data:
        count = int(r[executed])
        words = r[source].split()
        op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
        if runs and runs[-1]["count"] == count:
            runs[-1]["ops"].append(op)
        else:
            runs.append({"offset": int(r[0], 16) - base, "count": count, "ops": [op]})
    total = sum(run["count"] * len(run["ops"]) for run in runs)
    print(f"{total} warp instructions, {total / a.warps:.1f} per warp ({a.warps} warps)")
    print("| offset | instructions | executions / warp | instructions / warp | share | commonest opcodes |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        n = run["count"] * len(run["ops"])
        if run["count"] == 0 or n / total < a.min_share:
            continue
        top = ", ".join(f"{op} {k}" for op, k in Counter(run["ops"]).most_common(6))
        print(f"| {run['offset']:05x} | {len(run['ops'])} | {run['count'] / a.warps:.2f} | {n / a.warps:.1f} | "
              f"{100 * n / total:.1f}% | {top} |")


if __name__ == "__main__":
    main()
