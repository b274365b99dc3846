"""Summarises flush_rows_ncu.sh's CSVs (ncu --csv --page raw): per kernel, the longest launches (the rows in
which every block does the kernel's work) with their DRAM, shared-memory and issue figures.
Usage (results.tar unpacked, its files decompressed with xz -d): python3 ncu_summary.py r/ncu_0_0.csv r/ncu_2_64.csv"""
import csv
import sys

COLUMNS = {
    "gpu__time_duration.sum": "us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": "smem wavefronts",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed": "smem%",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue%",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "warps%",
    "smsp__inst_executed.sum": "warp instr",
}


def number(text):
    return float(text.replace(",", "")) if text not in ("", "n/a") else float("nan")


def main(paths):
    for path in paths:
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(line for line in f if not line.startswith("==")) if r.get("Kernel Name")]
        rows = [r for r in rows if r.get("ID", "").strip().isdigit()]  # the units row has no launch ID
        print(f"== {path}: {len(rows)} launches")
        for kernel in ("kda_flush_kernel", "kda_nonflush_kernel"):
            mine = [r for r in rows if kernel in r["Kernel Name"]]
            if not mine:
                continue
            mine.sort(key=lambda r: -number(r["gpu__time_duration.sum"]))
            print(f"  {kernel}: {len(mine)} launches; the 3 longest:")
            for r in mine[:3]:
                fields = []
                for key, label in COLUMNS.items():
                    value = number(r[key])
                    if key == "gpu__time_duration.sum":
                        value /= 1000.0  # ns -> us
                    fields.append(f"{label} {value:.4g}")
                print("    " + ", ".join(fields))


if __name__ == "__main__":
    main(sys.argv[1:])
