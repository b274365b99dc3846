#!/usr/bin/env python3
"""Call 1's rule (README.md): the L2 prefetch of the non-flush read's rows, lib_p32 and lib_p128 against lib_land,
mean of the rounds, every paper shape at B = 64, 128, 256.
- Judged rows: `non-flush read fp16 | fp8b128 | nvfp4` and `nvfp4 read skip=auto, *` (the rows whose timed
  non-flush kernel reads a low-precision copy).
- A variant qualifies if every judged row takes <= 1.02x lib_land's time and the geometric mean of the
  `non-flush read` rows at B = 256 (5 shapes x 3 formats) is <= 0.97x.
- If both qualify, the lower geometric mean lands; lib_p32 (less of L2) when within 1% of lib_p128.
Also printed: every other row beyond 1.03x (none is judged: their kernels read no low-precision copy).
Usage: judge_p.py DIR (the call's results, ab_<lib>_<round>.csv[.xz])."""
import math
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/../session22")
from judge_g import load  # noqa: E402

VARIANTS = ("lib_p32", "lib_p128")
READS = ("non-flush read fp16", "non-flush read fp8b128", "non-flush read nvfp4")


def judged(k):
    return k[1].startswith(READS) or k[1].startswith("nvfp4 read skip=auto")


def main():
    d = sys.argv[1]
    land = load(d, "lib_land")
    libs = {n: t for n in VARIANTS if (t := load(d, n))}
    gm, ok = {}, {}
    for name, t in libs.items():
        keys = sorted(k for k in land if judged(k) and k in t)
        worst = max(keys, key=lambda k: t[k] / land[k])
        reads256 = [k for k in keys if k[1].startswith(READS) and k[2] == 256]
        gm[name] = math.exp(sum(math.log(t[k] / land[k]) for k in reads256) / len(reads256))
        ok[name] = t[worst] / land[worst] <= 1.02 and gm[name] <= 0.97
        print(f"{name}: worst judged row {t[worst] / land[worst]:.3f} ({worst[0]}, {worst[1]}, B = {worst[2]}); "
              f"geometric mean of the LP reads at B = 256 {gm[name]:.3f} ({len(reads256)} rows) -> "
              + ("qualifies" if ok[name] else "does not qualify"))
        others = [k for k in land if not judged(k) and k in t and t[k] / land[k] > 1.03]
        for k in sorted(others):
            print(f"   not judged, > 1.03x: {k[0]}, {k[1]}, B = {k[2]}: {t[k] / land[k]:.3f}")
    q = [n for n in libs if ok[n]]
    if len(q) == 2:
        lands = "lib_p32" if gm["lib_p32"] <= 1.01 * gm["lib_p128"] else "lib_p128"
    else:
        lands = q[0] if q else "neither"
    print(f"lands: {lands}\n")
    print(f"{'model':20s} {'row':28s} {'B':>4s} {'land us':>9s}" + "".join(f"{n[4:]:>8s}" for n in libs) + "   (time over land)")
    for k in sorted(k for k in land if judged(k)):
        print(f"{k[0]:20s} {k[1][:28]:28s} {k[2]:4d} {land[k]:9.2f}" + "".join(f"{libs[n][k] / land[k]:8.3f}" for n in libs))


if __name__ == "__main__":
    main()
