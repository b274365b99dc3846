#!/usr/bin/env python3
"""Call 2's table (README.md): the non-flush read rows of lib_land and of each ablated library, mean of the rounds,
and what each ablation removes from the step's time (land - ablated, in us and as a share of land's time).
Usage: ablation_table.py DIR (the call's results, ab_<lib>_<round>.csv[.xz])."""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/../session22")
from judge_g import load  # noqa: E402

ABLATIONS = (("lib_astream", "no stream"), ("lib_afold", "no fold"), ("lib_arecord", "no record phase"),
             ("lib_aall", "none of the three"))


def main():
    d = sys.argv[1]
    land = load(d, "lib_land")
    libs = {n: load(d, n) for n, _ in ABLATIONS}
    rows = sorted(k for k in land if k[1].startswith("non-flush read") or k[1] == "replay fp32 non-flush step")
    print(f"{'model':20s} {'row':26s} {'B':>4s} {'land us':>8s}" + "".join(f" {t:>22s}" for _, t in ABLATIONS))
    print("   (each ablation: its time in us, and the share of land's time it removes)")
    for k in rows:
        cells = "".join(f" {libs[n][k]:9.2f} ({1 - libs[n][k] / land[k]:+6.1%})   " for n, _ in ABLATIONS)
        print(f"{k[0]:20s} {k[1][:26]:26s} {k[2]:4d} {land[k]:8.2f}{cells}")


if __name__ == "__main__":
    main()
