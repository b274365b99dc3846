"""Summarises ncu_targets_call.sh's profiles (ncu --csv --page raw --print-units base, one CSV per kernel window):
per file the 3 longest launches, with the instance (demangled name, shortened), grid, registers, DRAM traffic and
its rate, the speed-of-light shares, occupancy, shared-memory wavefronts, instructions, and the 4 largest warp
stall reasons (cycles per issued instruction).
Usage: python3 ncu_targets.py r/ncu_*.csv"""
import csv
import pathlib
import re
import sys

STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def short_name(name):
    name = re.sub(r"replayssm::|cuda::|\(anonymous namespace\)::|<?unnamed>::|formats::|decode_detail::|ssm::", "", name)
    return re.sub(r"\(.*\)$", "", name.replace("void ", ""))


def summarise(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    launches = [r for r in rows if r.get("ID", "").strip().isdigit()]  # the units row has no launch ID
    print(f"== {pathlib.Path(path).name}: {len(launches)} launches")
    launches.sort(key=lambda r: -number(r.get("gpu__time_duration.sum", "nan")))
    for r in launches[:3]:
        g = lambda k: number(r.get(k, "nan"))  # noqa: E731
        ns = g("gpu__time_duration.sum")
        rd, wr = g("dram__bytes_read.sum"), g("dram__bytes_write.sum")
        print(f"  {short_name(r.get('Kernel Name', '?'))}  grid {r.get('Grid Size', '?')} block {r.get('Block Size', '?')}")
        print(f"    {ns / 1000:.1f} us; DRAM {rd / 1e6:.1f} MB read + {wr / 1e6:.1f} MB written = "
              f"{(rd + wr) / ns:.0f} GB/s ({g('dram__throughput.avg.pct_of_peak_sustained_elapsed'):.1f}% of peak); "
              f"SM {g('sm__throughput.avg.pct_of_peak_sustained_elapsed'):.1f}%; issue active "
              f"{g('smsp__issue_active.avg.pct_of_peak_sustained_active'):.1f}%")
        print(f"    registers {g('launch__registers_per_thread'):.0f}, occupancy {g('sm__warps_active.avg.pct_of_peak_sustained_active'):.1f}% "
              f"achieved / {g('sm__maximum_warps_per_active_cycle_pct'):.1f}% theoretical; shared wavefronts "
              f"{g('l1tex__data_pipe_lsu_wavefronts_mem_shared.sum') / 1e6:.2f} M "
              f"({g('l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed'):.1f}% of peak); "
              f"warp instructions {g('smsp__inst_executed.sum') / 1e6:.2f} M")
        stalls = sorted(((number(v), STALL.match(k).group(1)) for k, v in r.items() if k and STALL.match(k)), reverse=True)
        stalls = [(v, k) for v, k in stalls if v == v][:4]
        print("    stalls (cycles per issue): " + ", ".join(f"{k} {v:.2f}" for v, k in stalls))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        summarise(p)
