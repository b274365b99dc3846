# ab_summary.txt of a call with several variants: kimi_<variant>_<round>.csv[.xz] -> per row the minimum over
# rounds of each variant (us per step) and its ratio to the first variant named (the baseline).
# Usage: python3 ab3.py FOLDER BASELINE VARIANT...   (rows read by ../../bench_csv.py)
import sys, glob, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from bench_csv import read_bench_csv
folder, variants = pathlib.Path(sys.argv[1]), sys.argv[2:]
best = {}
for v in variants:
    for f in sorted(glob.glob(str(folder / f'kimi_{v}_*.csv*'))):
        for r in read_bench_csv(f):
            k = (r['model'], r['kernel'], r['batch'], r['param'])
            best[(v,) + k] = min(best.get((v,) + k, 1e30), float(r['us_per_step']))
keys = sorted({k[1:] for k in best}, key=lambda k: (int(k[2]), k[1]))
print(f"{'row':46s} {'B':>4s} " + " ".join(f"{v:>9s}" for v in variants) + " " +
      " ".join(f"{v + '/' + variants[0]:>16s}" for v in variants[1:]))
for k in keys:
    vals = [best.get((v,) + k) for v in variants]
    if None in vals: continue
    print(f"{k[1][:46]:46s} {k[2]:>4s} " + " ".join(f"{x:9.1f}" for x in vals) + " " +
          " ".join(f"{x / vals[0]:16.3f}" for x in vals[1:]))
