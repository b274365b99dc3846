"""Summarises ncu_targets_call.sh's profiles (ncu --csv --page raw --print-units base, one CSV per kernel window):
per file the 3 longest launches, with the instance (demangled name, shortened), grid, registers, DRAM traffic and
its rate, the speed-of-light shares, occupancy, shared-memory wavefronts, instructions, and the 4 largest warp
stall reasons (cycles per issued instruction). Two floors put the duration in context:
  issue floor: the warp instructions at one per SMSP per cycle (4 per SM) at the kernel's own mean clock;
  DRAM floor:  the DRAM bytes at the copy bandwidth --copy-gbps (the bench's, same card; default 3018, the
               H100 of session 18).
A kernel near its DRAM floor is at the traffic limit; one near its issue floor is bound by instruction issue.
Usage: python3 ncu_targets.py [--copy-gbps G] [--sms N] r/ncu_*.csv[.xz]"""
import argparse
import lzma
import csv
import pathlib
import re

STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def short_name(name):
    name = re.sub(r"replayssm::|cuda::|\(anonymous namespace\)::|<?unnamed>::|formats::|decode_detail::|ssm::", "", name)
    return re.sub(r"\(.*\)$", "", name.replace("void ", ""))


def summarise(path, copy_gbps, sms):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", newline="") as f:
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
              f"{(rd + wr) / ns:.0f} GB/s ({100 * (rd + wr) / ns / copy_gbps:.1f}% of copy); "
              f"SM {g('sm__throughput.avg.pct_of_peak_sustained_elapsed'):.1f}%; issue active "
              f"{g('smsp__issue_active.avg.pct_of_peak_sustained_active'):.1f}%")
        print(f"    registers {g('launch__registers_per_thread'):.0f}, occupancy {g('sm__warps_active.avg.pct_of_peak_sustained_active'):.1f}% "
              f"achieved / {g('sm__maximum_warps_per_active_cycle_pct'):.1f}% theoretical; shared wavefronts "
              f"{g('l1tex__data_pipe_lsu_wavefronts_mem_shared.sum') / 1e6:.2f} M "
              f"({g('l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed'):.1f}% of peak); "
              f"warp instructions {g('smsp__inst_executed.sum') / 1e6:.2f} M")
        clock = g("gpc__cycles_elapsed.avg.per_second")
        issue_floor = g("smsp__inst_executed.sum") / (4 * sms * clock) * 1e6
        dram_floor = (rd + wr) / (copy_gbps * 1e3)
        print(f"    floors: issue {issue_floor:.1f} us ({100 * issue_floor / (ns / 1000):.0f}% of the duration, clock "
              f"{clock / 1e9:.2f} GHz), DRAM {dram_floor:.1f} us ({100 * dram_floor / (ns / 1000):.0f}%)")
        stalls = sorted(((number(v), STALL.match(k).group(1)) for k, v in r.items() if k and STALL.match(k)), reverse=True)
        stalls = [(v, k) for v, k in stalls if v == v][:4]
        print("    stalls (cycles per issue): " + ", ".join(f"{k} {v:.2f}" for v, k in stalls))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--copy-gbps", type=float, default=3018.0)
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args()
    if not a.copy_gbps > 0 or a.sms < 1:
        ap.error(f"--copy-gbps must be above 0 GB/s and --sms at least 1 (got {a.copy_gbps}, {a.sms})")
    for p in a.paths:
        summarise(p, a.copy_gbps, a.sms)
