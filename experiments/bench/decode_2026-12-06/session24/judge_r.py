#!/usr/bin/env python3
"""Call 7's rule (README.md): variant r (the tensor-core reads' record phase after the stream) against lib_land,
mean of 3 rounds, the Mamba-2 and GDN shapes at B = 64, 128, 256.
- Judged rows (those whose non-flush kernel r changes): `non-flush read nvfp4` and `nvfp4 read skip=auto, *` on
  every shape, `non-flush read fp8b128` on the GDN shapes (Mamba-2's FP8 read runs on the CUDA cores).
- r lands if every judged row takes <= 1.02x lib_land's time and the geometric mean of the judged `non-flush read`
  rows at B = 256 (6 rows) is <= 0.97x.
Usage: judge_r.py DIR (the call's results, ab_<lib>_<round>.csv[.xz])."""
import math
import statistics
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ablation_table import load  # noqa: E402  (exact library match; the rule takes the mean of the rounds)

GDN = ("qwen3.5-4b", "qwen3.5-122b-a10b")


def judged(k):
    return (k[1].startswith("non-flush read nvfp4") or k[1].startswith("nvfp4 read skip=auto")
            or (k[1].startswith("non-flush read fp8b128") and k[0] in GDN))


def main():
    d = sys.argv[1]
    land, r = load(d, "lib_land", statistics.mean), load(d, "lib_r", statistics.mean)
    keys = sorted(k for k in land if judged(k) and k in r)
    worst = max(keys, key=lambda k: r[k] / land[k])
    reads256 = [k for k in keys if k[1].startswith("non-flush read") and k[2] == 256]
    gm = math.exp(sum(math.log(r[k] / land[k]) for k in reads256) / len(reads256))
    ok = r[worst] / land[worst] <= 1.02 and gm <= 0.97
    print(f"lib_r: worst judged row {r[worst] / land[worst]:.3f} ({worst[0]}, {worst[1]}, B = {worst[2]}); geometric "
          f"mean of the judged reads at B = 256 {gm:.3f} ({len(reads256)} rows) -> {'lands' if ok else 'does not land'}\n")
    for k in keys:
        print(f"{k[0]:20s} {k[1][:34]:34s} {k[2]:4d} {land[k]:9.2f} {r[k]:9.2f} {r[k] / land[k]:7.3f}")


if __name__ == "__main__":
    main()
