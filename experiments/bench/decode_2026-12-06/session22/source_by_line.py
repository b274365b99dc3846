#!/usr/bin/env python3
"""Warp instructions executed and stall samples per CUDA source line, from Nsight Compute's source page
(`ncu -i REP --page source --print-source cuda,sass --csv`, optionally .xz). Usage: source_by_line.py CSV [TOP]"""
import collections
import csv
import lzma
import sys


def count(text):
    text = text.replace(",", "")
    return int(text) if text.isdigit() else 0


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    instr, samples, source, per_file = collections.Counter(), collections.Counter(), {}, collections.Counter()
    name = None
    for r in rows:
        if not r:
            continue
        if r[0] == "File Path":
            name = r[1].split("/")[-1]
            continue
        if r[0] == "Line No":
            col_instr, col_samples = r.index("Instructions Executed"), r.index("Warp Stall Sampling (All Samples)")
            continue
        if not r[0].isdigit():  # SASS rows (their counts are already in their CUDA line's row)
            continue
        key = (name, int(r[0]))
        instr[key] += count(r[col_instr])
        samples[key] += count(r[col_samples])
        source[key] = r[1].strip()[:80]
        per_file[name] += count(r[col_instr])
    total, total_samples = sum(instr.values()), max(sum(samples.values()), 1)
    print(f"warp instructions over CUDA lines: {total:,}; stall samples: {total_samples:,}")
    for name, n in per_file.most_common():
        print(f"  {name:32s} {n / 1e6:7.2f} M {100 * n / total:5.1f}%")
    print(f"{'file':28s}{'line':>5s} {'instr':>8s} {'share':>6s} {'samples':>8s}  source")
    for key, n in instr.most_common(top):
        print(f"{key[0][:27]:28s}{key[1]:5d} {n / 1e6:7.2f}M {100 * n / total:5.1f}% {100 * samples[key] / total_samples:7.1f}%  {source[key]}")


if __name__ == "__main__":
    main()
