#!/usr/bin/env python3
"""Calls 2, 3 and 5's tables (README.md): the non-flush read rows of lib_land and of each ablated library at B = 256
(and 64 with --all-batches), the median of the rounds (one round of call 3 had a 1.4x outlier on lib_land), and what
each ablation removes from the step's time.
Usage: ablation_table.py DIR [--all-batches] (the call's results, ab_<lib>_<round>.csv[.xz])."""
import collections
import csv
import glob
import lzma
import os
import re
import statistics
import sys

NAMES = {"lib_astream": "no stream", "lib_afold": "no fold", "lib_arecord": "no record phase",
         "lib_aall": "none of the three", "lib_nflush": "no flush launch", "lib_aall_nf": "none, no flush launch",
         "lib_aall_nf_na": "none, no flush launch, no append", "lib_kda_astream": "no stream (KDA)"}


def load(d, lib, reduce=statistics.median):
    """`reduce` (the median unless given) per (model, kernel, batch) over ab_<lib>_<round>.csv[.xz] (exactly that
    library: not its prefixes)."""
    times = collections.defaultdict(list)
    for path in glob.glob(os.path.join(d, f"ab_{lib}_*.csv*")):
        if not re.fullmatch(rf"ab_{lib}_\d+\.csv(\.xz)?", os.path.basename(path)):
            continue
        with (lzma.open if path.endswith(".xz") else open)(path, "rt") as f:
            for r in csv.DictReader(f):
                times[(r["model"], r["kernel"], int(r["batch"]))].append(float(r["us_per_step"]))
    return {k: reduce(v) for k, v in times.items()}


def main():
    d = sys.argv[1]
    land = load(d, "lib_land")
    libs = {n: t for n in NAMES if (t := load(d, n))}
    batches = (64, 256) if "--all-batches" in sys.argv else (256,)
    rows = sorted(k for k in land if (k[1].startswith("non-flush read") or k[1] == "replay fp32 non-flush step")
                  and k[2] in batches)
    print("median of the rounds, us; in brackets the share of lib_land's time the ablation removes")
    print(f"{'model':20s} {'row':26s} {'B':>4s} {'land':>8s}" + "".join(f" {NAMES[n]:>18.18s}" for n in libs))
    for k in rows:
        print(f"{k[0]:20s} {k[1][:26]:26s} {k[2]:4d} {land[k]:8.2f}"
              + "".join(f" {t[k]:7.2f} ({1 - t[k] / land[k]:+6.1%})" for t in libs.values()))


if __name__ == "__main__":
    main()
