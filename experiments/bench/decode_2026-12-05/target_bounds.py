#!/usr/bin/env python3
"""Which of issue 13's missed B = 256 targets are bounds, from one run's own CSVs.

For a target "ours <= r x conventional" (or ">= r x faster"), the bench's byte count fixes the
efficiency (share of the copy bandwidth measured in the same run) that our step needs to meet it. A
target is a *bound* only if that efficiency is above what the memory can deliver; the vendor's
datasheet gives the H200's HBM3e 4.8 TB/s (--datasheet-gbps for another card, e.g. 3350 for the H100 SXM's
HBM3), which this prints as a share of the run's copy bandwidth.
Beside it: the highest efficiency any kernel of the run reached, and the highest of the kernels that
read and write the whole state (conventional, flush), as the flush step does.

Usage: target_bounds.py RUN_CSV [RUN_CSV ...] [--vllm PEERS_CSV]
  (RUN_CSV: replayssm-bench --csv output, .csv or .csv.xz; one round per file, each with its own
  copy bandwidth; PEERS_CSV: scripts/bench_peers.py --csv output of the same call)
"""
import argparse
import csv
import lzma
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench_csv import read_bench_csv  # noqa: E402  (mends the rows the bench wrote with bare commas)

DATASHEET_GBPS = 4800.0  # H200 HBM3e, vendor datasheet (the library's H200.md)


def read_peer_rows(path):  # scripts/bench_peers.py writes with Python's csv writer
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def row(rows, model, kernel, batch=256):
    hits = [r for r in rows if r["model"] == model and r["kernel"] == kernel and int(r["batch"]) == batch]
    if len(hits) != 1:
        sys.exit(f"{model} / {kernel} / B={batch}: {len(hits)} rows, expected 1")
    return hits[0]


# (kernel row, reference row, required speed-up over the reference (< 1: at most 1/ratio reference steps), name);
# issue 13's B = 256 targets. "At the reference's efficiency": the ratio if the row ran at the reference row's
# share of the copy bandwidth, i.e. the ratio of their byte counts.
TARGETS = [
    ("replay fp32 (staggered windows)", "conventional fp32", 1.6, "staggered >= 1.6x"),
    ("replay fp32 flush step", "conventional fp32", 1 / 1.1, "flush <= 1.1 steps"),
    ("non-flush read fp16 (x over fp32 read)", "replay fp32 non-flush step", 1.7, "fp16 read >= 1.7x"),
    ("non-flush read fp8b128 (x over fp32 read)", "replay fp32 non-flush step", 2.8, "fp8 read >= 2.8x"),
    ("non-flush read nvfp4 (x over fp32 read)", "replay fp32 non-flush step", 3.8, "nvfp4 read >= 3.8x"),
    ("verify output-only (no flush)", "conventional fp32", 1 / 1.1, "verify <= 1.1 steps"),
    ("verify output-only (with flush)", "conventional fp32", 1 / 1.5, "verify+flush <= 1.5"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--vllm")
    ap.add_argument("--datasheet-gbps", type=float, default=DATASHEET_GBPS,
                    help="the card's datasheet memory bandwidth in GB/s (default: the H200's 4800)")
    a = ap.parse_args()
    if not a.datasheet_gbps > 0:
        ap.error(f"--datasheet-gbps must be a bandwidth in GB/s above 0 (got {a.datasheet_gbps})")
    for path in a.runs:
        rows = read_bench_csv(path)
        big = [r for r in rows if int(r["batch"]) == 256]
        copy = float(big[0]["copy_gbps"])
        best = max(big, key=lambda r: float(r["pct_copy"]))
        rw = [r for r in big if r["kernel"] in ("conventional fp32", "replay fp32 flush step")]
        best_rw = max(rw, key=lambda r: float(r["pct_copy"]))
        print(f"== {path}: copy {copy:.1f} GB/s; datasheet {a.datasheet_gbps / 1000:.2f} TB/s = {100 * a.datasheet_gbps / copy:.1f}% of it")
        print(f"   best of any kernel: {float(best['pct_copy']):.2f}% ({best['model']}, {best['kernel']})")
        print(f"   best that reads and writes the state: {float(best_rw['pct_copy']):.2f}% "
              f"({best_rw['model']}, {best_rw['kernel']})")
        for model in sorted({r["model"] for r in big}):
            for kernel, reference, ratio, name in TARGETS:
                if "verify" in kernel and model.startswith("kimi"):
                    continue  # the verification targets are Mamba-2's and GDN's
                r, ref = row(rows, model, kernel), row(rows, model, reference)
                need_us = float(ref["us_per_step"]) / ratio
                need_pct = 100 * float(r["bytes_per_step"]) / (need_us * 1e-6) / 1e9 / copy
                speedup = float(ref["us_per_step"]) / float(r["us_per_step"])
                equal = float(ref["bytes_per_step"]) / float(r["bytes_per_step"])
                if ratio < 1:  # targets in conventional steps
                    measured, equal = f"{1 / speedup:.3f} steps", f"{1 / equal:.3f} steps"
                else:
                    measured, equal = f"{speedup:.3f}x", f"{equal:.3f}x"
                print(f"   {model:20s} {name:22s} measured {measured} at {float(r['pct_copy']):5.1f}% of copy; "
                      f"needs {need_pct:5.1f}%; at the reference's efficiency {equal}")
        if a.vllm:
            peers = read_peer_rows(a.vllm)
            for p in peers:
                if int(p["batch"]) != 256 or "replayssm_output_only" not in p["kernel"]:
                    continue
                ours = row(rows, p["model"], "replay fp32 (staggered windows)")
                gbps = float(ours["bytes_per_step"]) / (float(p["us_per_step"]) * 1e-6) / 1e9
                print(f"   vLLM {p['model']:20s} {float(p['us_per_step']):.1f} us = {100 * gbps / copy:.1f}% of copy; "
                      f"ours {float(p['us_per_step']) / float(ours['us_per_step']):.3f}x; most any kernel could be: "
                      f"{copy / gbps:.3f}x at the copy rate, {a.datasheet_gbps / gbps:.3f}x at {a.datasheet_gbps / 1000:.2f} TB/s")


if __name__ == "__main__":
    main()
