#!/usr/bin/env python3
"""Calls 1 and 3's rule (README.md): the `non-flush read fp8b128` row, mean of the rounds, each variant in DIR
(call 1: lib_f8a, lib_f8b; call 3: lib_f8c) against lib_land, judged per recurrence (Mamba-2: Super, Nano; GDN:
Qwen3.5-4B, Qwen3.5-122B).
Usage: judge_f8.py DIR (the call's results, ab_<lib>_<round>.csv[.xz])."""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/../session22")
from judge_g import load  # noqa: E402

RECURRENCES = {"Mamba-2": ("nemotron-3-super", "nemotron-3-nano-4b"), "GDN": ("qwen3.5-4b", "qwen3.5-122b-a10b")}
ALL_VARIANTS = ("lib_f8a", "lib_f8b", "lib_f8c")


def main():
    d = sys.argv[1]
    land = load(d, "lib_land")
    libs = {n: t for n in ALL_VARIANTS if (t := load(d, n))}
    VARIANTS = tuple(libs)
    row = lambda k: k[1].startswith("non-flush read fp8b128")  # noqa: E731
    for rec, shapes in RECURRENCES.items():
        judged = sorted(k for k in land if row(k) and k[0] in shapes)
        ok, mean256 = {}, {}
        for name, t in libs.items():
            r = {k: t[k] / land[k] for k in judged}
            ok[name] = all(v <= (1.02 if k[2] == 64 else 0.97) for k, v in r.items())
            at256 = [k for k in judged if k[2] == 256]
            mean256[name] = sum(t[k] for k in at256) / len(at256)
            print(f"{rec} {name}: " + ", ".join(f"{k[0]} B={k[2]} {v:.3f}" for k, v in r.items())
                  + f" -> {'qualifies' if ok[name] else 'does not qualify'}")
        q = [n for n in VARIANTS if ok[n]]
        if len(q) == 2 and VARIANTS == ("lib_f8a", "lib_f8b"):
            lands = "lib_f8a" if mean256["lib_f8a"] <= 1.01 * mean256["lib_f8b"] else "lib_f8b"
        else:
            lands = q[0] if q else "neither"
        print(f"{rec}: mean time at B = 256 " + ", ".join(f"{n} {mean256[n]:.2f} us" for n in VARIANTS)
              + f"; lands: {lands}\n")
    print(f"{'model':20s} {'B':>4s} {'land':>8s}" + "".join(f"{n[4:]:>8s}" for n in VARIANTS) + "   (us, mean of rounds)")
    for k in sorted(k for k in land if row(k)):
        print(f"{k[0]:20s} {k[2]:4d} {land[k]:8.2f}" + "".join(f"{libs[n][k]:8.2f}" for n in VARIANTS))


if __name__ == "__main__":
    main()
