#!/usr/bin/env python3
"""Call 5's rule (README.md): GDN's NVFP4 read (`non-flush read nvfp4`) on Qwen3.5-4B and Qwen3.5-122B, mean of the
rounds, lib_n4a and lib_n4b against lib_land; the NVFP4 skip rows at B = 256 as a guard.
Usage: judge_n4.py DIR (the call's results, ab_<lib>_<round>.csv[.xz])."""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/../session22")
from judge_g import load  # noqa: E402

VARIANTS = ("lib_n4a", "lib_n4b")


def main():
    d = sys.argv[1]
    land, libs = load(d, "lib_land"), {n: load(d, n) for n in VARIANTS}
    reads = sorted(k for k in land if k[1].startswith("non-flush read nvfp4"))
    skips = sorted(k for k in land if k[1].startswith("nvfp4 read skip=auto") and k[2] == 256)
    ok, mean256 = {}, {}
    for name, t in libs.items():
        r = {k: t[k] / land[k] for k in reads}
        g = {k: t[k] / land[k] for k in skips}
        ok[name] = all(v <= (1.02 if k[2] == 64 else 0.97) for k, v in r.items()) and all(v <= 1.03 for v in g.values())
        at256 = [k for k in reads if k[2] == 256]
        mean256[name] = sum(t[k] for k in at256) / len(at256)
        print(f"{name}: " + ", ".join(f"{k[0]} B={k[2]} {v:.3f}" for k, v in r.items()))
        print(f"  skip rows at B = 256: " + ", ".join(f"{k[0]} {k[1].split(', ')[1].split(' (')[0]} {v:.3f}" for k, v in g.items())
              + f" -> {'qualifies' if ok[name] else 'does not qualify'}")
    q = [n for n in VARIANTS if ok[n]]
    lands = ("lib_n4a" if mean256["lib_n4a"] <= 1.01 * mean256["lib_n4b"] else "lib_n4b") if len(q) == 2 else (q[0] if q else "neither")
    print("mean time at B = 256: " + ", ".join(f"{n} {mean256[n]:.2f} us" for n in VARIANTS) + f"; lands: {lands}\n")
    print(f"{'model':20s} {'B':>4s} {'land':>8s} {'n4a':>8s} {'n4b':>8s}   (us, mean of rounds)")
    for k in reads:
        print(f"{k[0]:20s} {k[2]:4d} {land[k]:8.2f} {libs['lib_n4a'][k]:8.2f} {libs['lib_n4b'][k]:8.2f}")


if __name__ == "__main__":
    main()
