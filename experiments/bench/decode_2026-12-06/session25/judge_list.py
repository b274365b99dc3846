#!/usr/bin/env python3
"""Call 1's rule (README.md): the flush list against main, the median of 3 rounds per row, five shapes, B = 32-256.
Arms: main (lib_main), nolist (lib_list --no-flush-list), list (lib_list, the default).
- LP reads (`non-flush read fp16|fp8b128|nvfp4`) at B = 128 and 256, list / main: geometric mean <= 0.97, no row > 1.02.
- Every other standard-replay row (staggered, FP32 non-flush, flush step, amortised, split flushes, skip rows) at
  B >= 64, list / main: no row > 1.03.
- Callers without a list lose nothing: every standard-replay row at B >= 64, nolist / main: no row > 1.03.
Conventional and verification rows are unchanged code and not judged (printed as a noise check).
Usage: judge_list.py DIR (the call's results, ab_<arm>_<round>.csv[.xz])."""
import collections
import csv
import glob
import lzma
import math
import os
import re
import statistics
import sys


def load(d, arm):
    times = collections.defaultdict(list)
    for path in glob.glob(os.path.join(d, f"ab_{arm}_*.csv*")):
        if not re.fullmatch(rf"ab_{arm}_\d+\.csv(\.xz)?", os.path.basename(path)):
            continue
        with (lzma.open if path.endswith(".xz") else open)(path, "rt") as f:
            for r in csv.DictReader(f):
                times[(r["model"], r["kernel"], int(r["batch"]))].append(float(r["us_per_step"]))
    return {k: statistics.median(v) for k, v in times.items()}


def standard_replay(kernel):
    return not (kernel.startswith("conventional") or kernel.startswith("verify"))


def lp_read(kernel):
    return kernel.startswith("non-flush read")


def main():
    d = sys.argv[1]
    main_, nolist, listed = load(d, "main"), load(d, "nolist"), load(d, "list")
    keys = sorted(k for k in main_ if k in listed and k in nolist)
    verdicts = []

    reads = [k for k in keys if lp_read(k[1]) and k[2] in (128, 256)]
    ratios = {k: listed[k] / main_[k] for k in reads}
    gm = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    worst = max(reads, key=ratios.get)
    verdicts.append(gm <= 0.97 and ratios[worst] <= 1.02)
    print(f"1. LP reads at B = 128, 256 (list / main, {len(reads)} rows): geometric mean {gm:.3f} (<= 0.97), worst "
          f"{ratios[worst]:.3f} ({worst[0]}, {worst[1][:24]}, B = {worst[2]}; <= 1.02) -> {'holds' if verdicts[-1] else 'fails'}")
    for b in (32, 64, 128, 256):
        rs = [listed[k] / main_[k] for k in keys if lp_read(k[1]) and k[2] == b]
        if rs:
            print(f"   B = {b}: geometric mean {math.exp(sum(map(math.log, rs)) / len(rs)):.3f} ({len(rs)} rows)")

    others = [k for k in keys if standard_replay(k[1]) and not lp_read(k[1]) and k[2] >= 64]
    worst = max(others, key=lambda k: listed[k] / main_[k])
    verdicts.append(listed[worst] / main_[worst] <= 1.03)
    print(f"2. other standard-replay rows at B >= 64 (list / main, {len(others)} rows): worst "
          f"{listed[worst] / main_[worst]:.3f} ({worst[0]}, {worst[1][:40]}, B = {worst[2]}; <= 1.03) -> "
          f"{'holds' if verdicts[-1] else 'fails'}")

    every = [k for k in keys if standard_replay(k[1]) and k[2] >= 64]
    worst = max(every, key=lambda k: nolist[k] / main_[k])
    verdicts.append(nolist[worst] / main_[worst] <= 1.03)
    print(f"3. standard-replay rows at B >= 64 without a list (nolist / main, {len(every)} rows): worst "
          f"{nolist[worst] / main_[worst]:.3f} ({worst[0]}, {worst[1][:40]}, B = {worst[2]}; <= 1.03) -> "
          f"{'holds' if verdicts[-1] else 'fails'}")

    unchanged = [k for k in keys if not standard_replay(k[1])]
    rs = [listed[k] / main_[k] for k in unchanged]
    print(f"noise: conventional and verification rows (list / main, unchanged code): {min(rs):.3f} .. {max(rs):.3f}")
    print(f"-> the flush list {'lands' if all(verdicts) else 'does not land'} (the suites and the checked bench judged "
          f"separately)\n")
    print(f"{'model':20s} {'kernel':42s} {'B':>4s} {'main':>9s} {'nolist':>7s} {'list':>7s}  (ratios to main)")
    for k in keys:
        if standard_replay(k[1]):
            print(f"{k[0]:20s} {k[1][:42]:42s} {k[2]:4d} {main_[k]:9.2f} {nolist[k] / main_[k]:7.3f} {listed[k] / main_[k]:7.3f}")


if __name__ == "__main__":
    main()
