"""The landing comparison of session 20 (README.md, "Rules for landing"): per bench row (model, kernel, B), the
minimum time over the rounds of each library, main's round-to-round spread, lib_all / main, and for the
verification rows lib_all / lib_a. Prints every row and the verdict of each rule on the timings (rule 1, the suites
and memcheck, is read from the call's output).
Usage: python3 compare.py RESULTS_DIR [EXP (default lib_all)] [PART (default lib_a)]   (the folder holding
record_EXP_*.csv[.xz], record_lib_land_*.csv[.xz], PART.csv[.xz]). The rules' verdicts are session 20's (EXP =
lib_all); for another pack read the table against that pack's rules.)"""
import csv, glob, lzma, os, sys
from collections import defaultdict

def rows(path):
    with (lzma.open(path, "rt") if path.endswith(".xz") else open(path)) as f:
        return list(csv.DictReader(f))

def timings(pattern):
    """{(model, kernel, B): [us per round]} over the files matching pattern, in file order."""
    out = defaultdict(list)
    for path in sorted(glob.glob(pattern)):
        for r in rows(path):
            out[(r["model"], r["kernel"], int(r["batch"]))].append(float(r["us_per_step"]))
    return out

d = sys.argv[1]
exp = sys.argv[2] if len(sys.argv) > 2 else "lib_all"
part = sys.argv[3] if len(sys.argv) > 3 else "lib_a"
allx = timings(os.path.join(d, f"record_{exp}_*.csv*"))
land = timings(os.path.join(d, "record_lib_land_*.csv*"))
liba = timings(os.path.join(d, f"{part}.csv*"))
if not allx or not land:
    sys.exit(f"compare.py: no record_{exp}_* / record_lib_land_* CSVs in {d}")

def spread(ts):
    return (max(ts) - min(ts)) / min(ts) if len(ts) > 1 else 0.0

def allowance(key):  # max(2%, main's round-to-round spread)
    return max(0.02, spread(land[key]))

print(f"{'model':22} {'kernel':52} {'B':>4} {'main us':>9} {'all us':>9} {'all/main':>8} {'spread':>6} {'a us':>9} {'all/a':>6}")
for key in sorted(land):
    if key not in allx:
        continue
    m, a = min(land[key]), min(allx[key])
    la = f"{min(liba[key]):9.1f} {a / min(liba[key]):6.3f}" if key in liba else ""
    print(f"{key[0]:22} {key[1][:52]:52} {key[2]:4d} {m:9.1f} {a:9.1f} {a / m:8.3f} {100 * spread(land[key]):5.1f}% {la}")

def slower(key, ref):  # lib_all slower than ref by more than the allowance
    return min(allx[key]) > min(ref[key]) * (1 + allowance(key))

print()
# Rule 2: NVFP4 lane columns (session 19's rule).
nv = [(m, "non-flush read nvfp4 (x over fp32 read)", 256) for m in ("nemotron-3-super", "nemotron-3-nano-4b")]
faster = all(min(allx[k]) < min(land[k]) for k in nv)
worse = [k for k in land if k[0] in ("nemotron-3-super", "nemotron-3-nano-4b") and k in allx and k not in nv
         and not k[1].startswith("verify output-only") and slower(k, land)]
print("rule 2 (NVFP4 lane columns):", "LANDS" if faster and not worse else "does not land",
      f"(NVFP4 rows faster: {faster}; other rows slower beyond the allowance: {worse})")
# Rule 3: A (the epilogue), on every verification row of lib_all against main.
vrows = [k for k in land if k[1].startswith("verify output-only") and k in allx]
worse = [k for k in vrows if slower(k, land)]
gdn_flush = [k for k in vrows if k[0].startswith("qwen3.5") and "with flush" in k[1] and k[2] == 256]
faster = bool(gdn_flush) and all(min(allx[k]) < min(land[k]) for k in gdn_flush)
print("rule 3 (A, records outermost):", "LANDS" if faster and not worse else "does not land",
      f"(GDN verify+flush B=256 faster: {faster}; verification rows slower beyond the allowance: {worse})")
# Rule 4: B (the streamed tensor-core verification), GDN's rows against lib_a.
g = [k for k in vrows if k[0].startswith("qwen3.5") and k in liba]
gf = [k for k in g if "with flush" in k[1] and k[2] == 256]
faster = len(gf) == 2 and all(min(allx[k]) < min(liba[k]) for k in gf)
worse = [k for k in g if slower(k, liba)]
print("rule 4 (B, streamed):", "LANDS (with A)" if faster and not worse else "does not land",
      f"(GDN verify+flush B=256 faster than lib_a on both: {faster}; GDN rows slower than lib_a beyond the allowance: {worse})")
