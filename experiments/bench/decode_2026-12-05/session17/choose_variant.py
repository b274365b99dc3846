"""Picks the KDA flush variant and the non-flush staged rows from flush_rows_call.sh's bench CSVs (kimi_v<variant>_
<round>.csv in FOLDER), for record_after_choice.sh on the same warm machine. Prints shell assignments.

Rule (fixed before the run, 2026-12-05): per variant the minimum over rounds of its row. A candidate wins only if
at B = 256 it is at least 3% faster than lib_land (vland) on its own row, and at B = 32 no more than 2% slower.
  - the flush variant from the "replay fp32 flush step" row (variants 1, 2, 3; 0 is the control, main's kernel);
  - the staged rows from the "replay fp32 non-flush step" row: 32 from pairings 1 and 3 (the better of the two),
    64 from pairing 2.
Among winners the fastest at B = 256. No winner: the control (0, 0), which is main's library.
Usage: python3 choose_variant.py FOLDER  ->  REPLAYSSM_KDA_FLUSH_VARIANT=.. REPLAYSSM_KDA_NONFLUSH_STAGED_ROWS=..
"""
import glob
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from bench_csv import read_bench_csv  # noqa: E402

FLUSH, NONFLUSH = "replay fp32 flush step", "replay fp32 non-flush step"
STAGED_OF = {"1": 32, "2": 64, "3": 32}


def best_times(folder):
    best = {}  # (variant, kernel, batch) -> us
    for f in glob.glob(str(pathlib.Path(folder) / "kimi_v*_*.csv*")):
        variant = pathlib.Path(f).name.split("_")[1][1:]
        for r in read_bench_csv(f):
            if r["kernel"] in (FLUSH, NONFLUSH):
                k = (variant, r["kernel"], int(r["batch"]))
                best[k] = min(best.get(k, 1e30), float(r["us_per_step"]))
    return best


def winner(best, kernel, candidates, log):
    base256, base32 = best.get(("land", kernel, 256)), best.get(("land", kernel, 32))
    if base256 is None or base32 is None:
        return None
    wins = []
    for v in candidates:
        t256, t32 = best.get((v, kernel, 256)), best.get((v, kernel, 32))
        if t256 is None or t32 is None:
            continue
        ok = t256 <= 0.97 * base256 and t32 <= 1.02 * base32
        log.append(f"# {kernel}: v{v} {t256:.1f}/{base256:.1f} us at B=256 ({t256 / base256:.3f}), "
                   f"{t32:.1f}/{base32:.1f} at B=32 ({t32 / base32:.3f}) -> {'wins' if ok else 'no'}")
        if ok:
            wins.append((t256, v))
    return min(wins)[1] if wins else None


def main(folder):
    best, log = best_times(folder), []
    if not any(k[0] == "land" for k in best):  # no baseline: refuse rather than fall back to the control silently
        sys.exit(f"choose_variant.py: {folder} has no kimi_vland_<round>.csv with the rows '{FLUSH}' and "
                 f"'{NONFLUSH}' (flush_rows_call.sh's baseline); nothing to choose from")
    flush = winner(best, FLUSH, ["1", "2", "3"], log) or "0"
    staged_variant = winner(best, NONFLUSH, ["1", "2", "3"], log)
    staged = STAGED_OF[staged_variant] if staged_variant else 0
    print("\n".join(log))
    print(f"REPLAYSSM_KDA_FLUSH_VARIANT={flush} REPLAYSSM_KDA_NONFLUSH_STAGED_ROWS={staged}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
