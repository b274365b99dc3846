#!/usr/bin/env python3
"""Call 9's rule (README.md): the verification rows (not `verify snapshot`), lib_epi against lib_land, mean of
the rounds. Usage: judge_epi.py DIR (the call's results, ab_<lib>_<round>.csv[.xz])."""
import math
import sys

from judge_g import load


def main():
    d = sys.argv[1]
    land, epi = load(d, "lib_land"), load(d, "lib_epi")
    judged = sorted(k for k in land if k[1].startswith("verify") and not k[1].startswith("verify snapshot") and k in epi)
    ratios = {k: epi[k] / land[k] for k in judged}
    geo = math.exp(sum(math.log(v) for v in ratios.values()) / len(ratios))
    worst = max(ratios, key=ratios.get)
    print(f"{len(judged)} judged rows; geometric mean {geo:.4f}; worst {ratios[worst]:.3f} ({worst[0]}, {worst[1]})")
    print(f"timing part of the rule: {'met' if geo <= 1.01 and ratios[worst] <= 1.04 else 'not met'}")
    for k in judged:
        print(f"{k[0]:20s} {k[1][:60]:60s} {k[2]:4d} {land[k]:9.2f} {epi[k]:9.2f} {ratios[k]:6.3f}")


if __name__ == "__main__":
    main()
