#!/usr/bin/env python3
"""Issue 13's target ratios per arm of an A/B call (median of the rounds per row): conventional % of copy, the
staggered step and the flush step over conventional, the LP reads over the FP32 read, verification T = 8 over
conventional. Usage: targets.py DIR [ARM ...] (default arms: main list)."""
import collections
import csv
import glob
import lzma
import os
import statistics
import sys

SHAPES = ["nemotron-3-super", "nemotron-3-nano-4b", "qwen3.5-4b", "qwen3.5-122b-a10b", "kimi-linear-48b-a3b"]


def load(d, arm):
    t, pct = collections.defaultdict(list), collections.defaultdict(list)
    for p in glob.glob(os.path.join(d, f"ab_{arm}_*.csv*")):
        with (lzma.open if p.endswith(".xz") else open)(p, "rt") as f:
            for r in csv.DictReader(f):
                k = (r["model"], r["kernel"], int(r["batch"]))
                t[k].append(float(r["us_per_step"]))
                pct[k].append(float(r["pct_copy"]))
    return {k: statistics.median(v) for k, v in t.items()}, {k: statistics.median(v) for k, v in pct.items()}


def main():
    d, arms = sys.argv[1], sys.argv[2:] or ["main", "list"]
    for arm in arms:
        t, pct = load(d, arm)
        batches = sorted({k[2] for k in t})
        print(f"## {arm}")
        print("shape | B | conv % copy | staggered | flush | FP16 / FP8 / NVFP4 read | verify T=8 no flush / flush")
        for m in SHAPES:
            for b in batches:
                g = lambda kern: t.get((m, kern, b))
                conv, nf = g("conventional fp32"), g("replay fp32 non-flush step")
                if conv is None:
                    continue
                lp = [nf / g(f"non-flush read {f} (x over fp32 read)") for f in ("fp16", "fp8b128", "nvfp4")]
                v0, v1 = g("verify output-only (no flush)"), g("verify output-only (with flush)")
                ver = f"{v0 / conv:.2f} / {v1 / conv:.2f}" if v0 else "-"
                print(f"{m} | {b} | {pct[(m, 'conventional fp32', b)]:.1f} | {conv / g('replay fp32 (staggered windows)'):.2f} | "
                      f"{g('replay fp32 flush step') / conv:.2f} | {lp[0]:.2f} / {lp[1]:.2f} / {lp[2]:.2f} | {ver}")


if __name__ == "__main__":
    main()
