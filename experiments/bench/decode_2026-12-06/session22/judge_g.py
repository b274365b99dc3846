#!/usr/bin/env python3
"""Calls 2 and 3's rules (README.md): judged rows (an NVFP4 read or copy), mean of rounds. Call 2: G and G2 against
lib_land, G2 against G. Call 3 (no lib_g in DIR): G2 against lib_land.
Calls 4 and 5: as call 3, judging only the rows that go through replay_step (--replay-step-rows); call 5's variant
is lib_g.
Usage: judge_g.py DIR [--replay-step-rows] (the call's results, ab_<lib>_<round>.csv[.xz])."""
import collections
import csv
import glob
import lzma
import os
import sys


def load(d, lib):
    times = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(d, f"ab_{lib}_*.csv*"))):
        opener = lzma.open if path.endswith(".xz") else open
        with opener(path, "rt") as f:
            for r in csv.DictReader(f):
                times[(r["model"], r["kernel"], int(r["batch"]), r["param"])].append(float(r["us_per_step"]))
    return {k: sum(v) / len(v) for k, v in times.items()}


def main():
    d = sys.argv[1]
    land = load(d, "lib_land")
    libs = {n: t for n in ("lib_g", "lib_g2") if (t := load(d, n))}
    if len(libs) == 1:  # calls 3-5: one variant against lib_land
        name, t = next(iter(libs.items()))
        return confirm(land, t, "--replay-step-rows" in sys.argv, name)
    judged = sorted(k for k in land if "nvfp4" in k[1])
    verdict = {}
    for name, t in libs.items():
        worst = max(judged, key=lambda k: t[k] / land[k])
        reads = {k: t[k] / land[k] for k in judged if k[1].startswith("non-flush read nvfp4") and k[2] == 256}
        ok = t[worst] / land[worst] <= 1.02 and all(v <= 0.97 for v in reads.values())
        verdict[name] = ok
        print(f"{name}: worst judged row {t[worst] / land[worst]:.3f} ({worst}); NVFP4 read at B = 256: "
              + ", ".join(f"{k[0]} {v:.3f}" for k, v in reads.items()) + f" -> {'qualifies' if ok else 'does not qualify'}")
    g, g2 = libs["lib_g"], libs["lib_g2"]
    worst = max((k for k in judged if k[2] >= 64), key=lambda k: g2[k] / g[k])
    print(f"lib_g2 / lib_g, worst judged row at B >= 64: {g2[worst] / g[worst]:.3f} ({worst})")
    lands = "G2" if verdict["lib_g2"] and g2[worst] / g[worst] <= 1.01 else "G" if verdict["lib_g"] else "neither"
    print(f"lands: {lands}")
    print(f"\n{'model':20s} {'kernel':52s} {'B':>4s} {'land':>8s} {'G':>6s} {'G2':>6s}")
    for k in judged:
        print(f"{k[0]:20s} {k[1][:52]:52s} {k[2]:4d} {land[k]:8.2f} {g[k] / land[k]:6.3f} {g2[k] / land[k]:6.3f}")


def confirm(land, g2, rows_replay_step_only, name="lib_g2"):
    # Call 4 judges only the rows whose launches go through replay_step (the verification rows cannot change).
    judged = sorted(k for k in land if "nvfp4" in k[1] and not (rows_replay_step_only and k[1].startswith("verify")))
    worst = max(judged, key=lambda k: g2[k] / land[k])
    reads = {k[0]: g2[k] / land[k] for k in judged if k[1].startswith("non-flush read nvfp4") and k[2] == 256}
    ok = g2[worst] / land[worst] <= 1.02 and min(reads.values()) <= 0.97 and max(reads.values()) <= 1.0
    print(f"{name}: worst judged row {g2[worst] / land[worst]:.3f} ({worst}); NVFP4 read at B = 256: "
          + ", ".join(f"{m} {v:.3f}" for m, v in reads.items()) + f"\nlands: {name[4:].upper() if ok else 'neither'}")
    print(f"\n{'model':20s} {'kernel':52s} {'B':>4s} {'land':>8s} {name[4:].upper():>6s}")
    for k in judged:
        print(f"{k[0]:20s} {k[1][:52]:52s} {k[2]:4d} {land[k]:8.2f} {g2[k] / land[k]:6.3f}")


if __name__ == "__main__":
    main()
