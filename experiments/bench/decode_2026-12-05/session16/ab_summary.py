"""A/B summary of a call's bench CSVs: <prefix>_<variant>_<round>.csv[.xz] -> per row the minimum over rounds of
each variant (us per step) and its ratio to the first variant named (the baseline). Session 15's ab3.py with the
file prefix as an argument (rows read by ../../bench_csv.py).
Usage:
  python3 ab_summary.py FOLDER kimi vland v0 v1 v2 v3      # flush_rows_call.sh
  python3 ab_summary.py FOLDER m2 land batched             # verify_fold_call.sh
"""
import glob
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from bench_csv import read_bench_csv  # noqa: E402


def main(folder, prefix, variants):
    best = {}
    for v in variants:
        for f in sorted(glob.glob(str(pathlib.Path(folder) / f"{prefix}_{v}_*.csv*"))):
            for r in read_bench_csv(f):
                k = (v, r["model"], r["kernel"], r["batch"], r["param"])
                best[k] = min(best.get(k, 1e30), float(r["us_per_step"]))
    rows = sorted({k[1:] for k in best}, key=lambda k: (k[0], int(k[2]), k[1]))
    print(f"{'model':20s} {'row':46s} {'B':>4s} " + " ".join(f"{v:>9s}" for v in variants) + " " +
          " ".join(f"{v + '/' + variants[0]:>16s}" for v in variants[1:]))
    for k in rows:
        times = [best.get((v,) + k) for v in variants]
        if None in times:
            continue
        print(f"{k[0][:20]:20s} {k[1][:46]:46s} {k[2]:>4s} " + " ".join(f"{x:9.1f}" for x in times) + " " +
              " ".join(f"{x / times[0]:16.3f}" for x in times[1:]))


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
