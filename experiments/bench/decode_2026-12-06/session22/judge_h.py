#!/usr/bin/env python3
"""Call 8's rule (README.md): `non-flush read fp8b128` rows of the GDN shapes, mean of the rounds, lib_h and lib_h2
against lib_land. Usage: judge_h.py DIR (the call's results, ab_<lib>_<round>.csv[.xz])."""
import sys

from judge_g import load


def main():
    d = sys.argv[1]
    land, libs = load(d, "lib_land"), {n: load(d, n) for n in ("lib_h", "lib_h2")}
    judged = sorted(k for k in land if k[1].startswith("non-flush read fp8b128"))
    ok, mean256 = {}, {}
    for name, t in libs.items():
        r = {k: t[k] / land[k] for k in judged}
        at256 = [v for k, v in r.items() if k[2] == 256]
        ok[name] = all(v <= 0.97 for v in at256) and max(r.values()) <= 1.02
        mean256[name] = sum(t[k] for k in judged if k[2] == 256) / len(at256)
        print(f"{name}: " + ", ".join(f"{k[0]} B={k[2]} {v:.3f}" for k, v in r.items())
              + f" -> {'qualifies' if ok[name] else 'does not qualify'}")
    lands = "neither"
    if ok["lib_h"] and ok["lib_h2"]:
        lands = "H2" if mean256["lib_h2"] <= 1.01 * mean256["lib_h"] else "H"
    elif ok["lib_h"] or ok["lib_h2"]:
        lands = "H" if ok["lib_h"] else "H2"
    print(f"mean time at B = 256: lib_h {mean256['lib_h']:.2f} us, lib_h2 {mean256['lib_h2']:.2f} us\nlands: {lands}")
    print(f"\n{'model':20s} {'B':>4s} {'land':>8s} {'H':>8s} {'H2':>8s}")
    for k in judged:
        print(f"{k[0]:20s} {k[2]:4d} {land[k]:8.2f} {libs['lib_h'][k]:8.2f} {libs['lib_h2'][k]:8.2f}")


if __name__ == "__main__":
    main()
