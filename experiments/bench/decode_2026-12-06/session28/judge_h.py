"""Judges session 28's rule for H (README.md, written before call 3 ran) on call 3's alternating rounds.
Per row (model, kernel, B, L/T): the median over rounds of lib_h's time over lib_land's time in the same round.
H lands when (a) Nemotron-3-Super's NVFP4 read takes at most 0.97 of main's time at B = 128 and at B = 256,
(b) no standard-step row of either shape at B = 64-256 (every row but the conventional and verification ones,
whose kernels H does not touch) takes more than 1.02 of main's time, and (c) every round ran (the bench
checks every configuration against the CPU decoders before timing it, and stops on a mismatch).
Usage: python3 judge_h.py [--arm lib_h2] [--a-model nemotron-3-nano-4b] call3/r (the arm: lib_h in call 3, lib_h2 in
call 4; --a-model: the shape whose NVFP4 read (a) judges, Super unless named: session 30's rule for H5 names Nano).
--a-rows skipping (session 31's rule for H6): (a) judges instead the geometric mean of the 12 NVFP4 reads with
appendix F skipping (both shapes; 0, 50 and 100% of heads skipped; B = 128 and 256), which must be at most 0.96.
--a-rows nvfp4 (session 37's rule for H9b): (a) judges every NVFP4 read of the four Mamba-2 and GDN shapes at B = 128
and 256 (the plain non-flush read and the three skipping reads: 32 rows); their geometric mean must be at most 0.97 and
no one of them above 1.00. KDA's rows are left out: its kernels do not run the changed code.
--a-rows kda (session 39's rule for H10): (a) judges Kimi-Linear's three low-precision non-flush reads (FP16, FP8-b128,
NVFP4) at B = 128 and 256 (6 rows); their geometric mean must be at most 0.98 and no one of them above 1.00."""
import argparse
import math
import csv
import lzma
import pathlib
import statistics
import sys


def load(path):
    with lzma.open(path, "rt", newline="") as f:
        return {(r["model"], r["kernel"], r["batch"], r["param"]): float(r["us_per_step"]) for r in csv.DictReader(f)}


# The rules whose (a) judges a group of rows: which rows, how many the rounds must hold (the refusal names them when
# they do not), the most their geometric mean may be, and the most any one row may be (None: no cap).
GROUP_RULES = {
    "skipping": dict(rows=lambda model, kernel: kernel.startswith("nvfp4 read skip="), count=12, mean_max=0.96,
                     row_max=None, found="skipping NVFP4-read rows at B = 128 and 256",
                     mean_of="the 12 skipping NVFP4 reads"),
    "nvfp4": dict(rows=lambda model, kernel: (model != "kimi-linear-48b-a3b"
                                              and kernel.startswith(("nvfp4 read skip=", "non-flush read nvfp4"))),
                  count=32, mean_max=0.97, row_max=1.0,
                  found="NVFP4-read rows of the Mamba-2 and GDN shapes at B = 128 and 256", mean_of="the 32 NVFP4 reads"),
    "kda": dict(rows=lambda model, kernel: (model == "kimi-linear-48b-a3b" and kernel.startswith(
                    ("non-flush read fp16", "non-flush read fp8b128", "non-flush read nvfp4"))),
                count=6, mean_max=0.98, row_max=1.0, found="low-precision reads of Kimi-Linear at B = 128 and 256",
                mean_of="Kimi's 6 low-precision reads"),
}


def main(folder, arm="lib_h", a_model="nemotron-3-super", a_rows="read"):
    r = pathlib.Path(folder)
    rounds = []
    for k in (1, 2, 3):
        h, m = r / f"ab_{arm}_{k}.csv.xz", r / f"ab_lib_land_{k}.csv.xz"
        if not (h.exists() and m.exists()):
            print(f"round {k}: missing ({h.name}, {m.name}): rule (c) fails")
            return 1
        rounds.append((load(h), load(m)))
    keys = sorted(set(rounds[0][0]) & set(rounds[0][1]))
    worst, verdict, judged_a, group = [], True, 0, []
    rule = GROUP_RULES.get(a_rows)
    for key in keys:
        ratios = [h[key] / m[key] for h, m in rounds if key in h and key in m]
        med = statistics.median(ratios)
        model, kernel, B, _ = key
        if rule:
            if B in ("128", "256") and rule["rows"](model, kernel):
                group.append(med)
                cap = rule["row_max"]
                above = cap is not None and med > cap
                print(f"(a) row {model} {kernel} B={B}: {med:.3f} ({' '.join(f'{x:.3f}' for x in ratios)})"
                      + (f" ABOVE {cap:.2f}: FAILS" if above else ""))
                verdict &= not above
        elif model == a_model and kernel.startswith("non-flush read nvfp4") and B in ("128", "256"):
            ok = med <= 0.97
            verdict &= ok
            judged_a += 1
            print(f"(a) {model} {kernel} B={B}: {med:.3f} ({' '.join(f'{x:.3f}' for x in ratios)}) {'ok' if ok else 'FAILS'}")
        worst.append((med, key, ratios))
    if rule:
        if len(group) != rule["count"]:
            sys.exit(f"judge_h.py: {folder}: (a) found {len(group)} {rule['found']}, expected {rule['count']}")
        mean = math.exp(sum(math.log(x) for x in group) / len(group))
        verdict &= mean <= rule["mean_max"]
        print(f"(a) geometric mean of {rule['mean_of']}: {mean:.3f} {'ok' if mean <= rule['mean_max'] else 'FAILS'}")
    elif judged_a != 2:
        # A misspelt --a-model (or rounds without B = 128 / 256) would otherwise pass (a) by judging nothing.
        sys.exit(f"judge_h.py: {folder}: (a) found {judged_a} NVFP4-read rows of {a_model!r} at B = 128 and 256, "
                 f"expected 2 (models in the rounds: {', '.join(sorted({k[0] for k in keys}))})")
    worst.sort(reverse=True)
    for med, key, ratios in worst[:8]:
        print(f"slowest: {key[0]} {key[1]} B={key[2]}: {med:.3f} ({' '.join(f'{x:.3f}' for x in ratios)})")
    over = [(med, key) for med, key, _ in worst
            if med > 1.02 and not key[1].startswith(("conventional", "verify"))]
    for med, key in over:
        print(f"(b) FAILS: {key[0]} {key[1]} B={key[2]}: {med:.3f}")
    verdict &= not over
    print("H LANDS" if verdict else "H does not land")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="the call's results folder (ab_<arm>_<k>.csv.xz, ab_lib_land_<k>.csv.xz)")
    ap.add_argument("--arm", default="lib_h")
    ap.add_argument("--a-model", default=None, help="default nemotron-3-super; with --a-rows read only")
    ap.add_argument("--a-rows", choices=("read", *GROUP_RULES), default="read")
    a = ap.parse_args()
    if a.a_rows != "read" and a.a_model is not None:
        ap.error("--a-model names the shape of the NVFP4 read that --a-rows read judges; --a-rows skipping and nvfp4 "
                 "judge several shapes")
    sys.exit(main(a.folder, a.arm, a.a_model or "nemotron-3-super", a.a_rows))
