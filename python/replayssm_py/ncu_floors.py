"""What bounds a profiled decode kernel, from Nsight Compute's text report of one launch (`ncu -i REP --page details`,
as experiments/bench/decode_2026-12-07/session38/ncu_rows.sh writes it, `.txt` or `.txt.xz`).

Two floors, each the time the launch would take if one resource alone limited it, at the clock it ran at:
  issue floor   warp instructions executed / (4 schedulers x SMs x SM clock): every scheduler issuing one warp
                instruction every cycle (sm_90 issues at most one per scheduler per cycle);
  DRAM floor    the launch's duration x its DRAM throughput share: the same bytes at the DRAM's peak rate.
The larger floor over the duration says how close the launch is to the resource that bounds it; where both are
far below the duration, latency (too few eligible warps, too few bytes in flight) is what it waits on, and the
scheduler's "no eligible" share says how often. An issue floor above the time a target allows means the kernel
as built cannot meet it on any card with that SM count and clock, whatever its memory (an H200 has the H100's 132
SMs and 1.98 GHz boost clock); only fewer instructions would.
"""
import lzma
import pathlib
import re
from dataclasses import dataclass

SCHEDULERS_PER_SM = 4  # sm_90: four sub-partitions, one warp instruction issued per cycle each

# (section-free) metric name -> (unit the report must use, field). The report's tables list "name unit value".
_METRICS = {
    "smsp__inst_executed.sum": ("inst", "warp_instructions"),
    "dram__bytes_read.sum": (None, "dram_read_bytes"),
    "dram__bytes_write.sum": (None, "dram_write_bytes"),
    "SM Frequency": (None, "sm_hz"),
    "Duration": (None, "duration_s"),
    "DRAM Throughput": ("%", "dram_pct_of_peak"),
    "One or More Eligible": ("%", "issue_active_pct"),
    "No Eligible": ("%", "no_eligible_pct"),
    "Active Warps Per Scheduler": ("warp", "active_warps_per_scheduler"),
    "Eligible Warps Per Scheduler": ("warp", "eligible_warps_per_scheduler"),
    "Registers Per Thread": ("register/thread", "registers"),
    "Achieved Occupancy": ("%", "achieved_occupancy_pct"),
    "Theoretical Occupancy": ("%", "theoretical_occupancy_pct"),
    "# SMs": ("SM", "sms"),
    "Grid Size": (None, "grid"),
    "Block Size": (None, "block"),
    "Issued Warp Per Scheduler": (None, "issued_per_scheduler"),
    "SM Active Cycles": ("cycle", "sm_active_cycles"),
    "Elapsed Cycles": ("cycle", "elapsed_cycles"),
}
_SCALE = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "hz": 1.0, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9,
          "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "usecond": 1e-6, "msecond": 1e-3, "nsecond": 1e-9}
_KERNEL_LINE = re.compile(r"^\s{2}(\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")


class NcuReportError(ValueError):
    """A report this module cannot read: the message names the file and what is missing."""


@dataclass
class Launch:
    """One profiled launch and its floors (seconds)."""
    path: str
    kernel: str
    warp_instructions: float
    dram_read_bytes: float
    dram_write_bytes: float
    sm_hz: float
    duration_s: float
    dram_pct_of_peak: float
    issue_active_pct: float
    no_eligible_pct: float
    active_warps_per_scheduler: float
    eligible_warps_per_scheduler: float
    registers: float
    achieved_occupancy_pct: float
    theoretical_occupancy_pct: float
    sms: float
    grid: float
    block: float
    issued_per_scheduler: float
    sm_active_cycles: float
    elapsed_cycles: float

    @property
    def issue_floor_s(self):
        return self.warp_instructions / (SCHEDULERS_PER_SM * self.sms * self.sm_hz)

    @property
    def dram_floor_s(self):
        return self.duration_s * self.dram_pct_of_peak / 100.0

    @property
    def dram_peak_bytes_per_s(self):
        return (self.dram_read_bytes + self.dram_write_bytes) / self.dram_floor_s


def _number(text, path, name):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        raise NcuReportError(f"{path}: {name}: expected a number, found {text!r}") from None


def read_launch(path):
    """The first launch of an `ncu --page details` text report (plain or xz)."""
    path = pathlib.Path(path)
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt", errors="replace") as f:
        lines = f.read().splitlines()
    kernel = next((m.group(1) for line in lines if (m := _KERNEL_LINE.match(line))), None)
    if kernel is None:
        raise NcuReportError(f"{path}: no profiled launch (a line '  <kernel> (grid)x(block), Context ...')")
    found = {}
    for line in lines:
        parts = line.split()
        for name, (unit, field) in _METRICS.items():
            words = name.split()
            if field in found or parts[:len(words)] != words:
                continue
            rest = parts[len(words):]
            if not rest:
                continue
            value_text = rest[-1]
            unit_text = rest[0] if len(rest) == 2 else None
            if name == "# SMs" and rest[0] != "SM":
                continue
            if unit is not None and unit_text != unit:
                raise NcuReportError(f"{path}: {name}: expected unit {unit!r}, found {unit_text!r}")
            value = _number(value_text, path, name)
            if unit is None and unit_text is not None:
                if unit_text not in _SCALE:
                    raise NcuReportError(f"{path}: {name}: unit {unit_text!r} is not one this reader scales")
                value *= _SCALE[unit_text]
            found[field] = value
    missing = [name for name, (_, field) in _METRICS.items() if field not in found]
    if missing:
        raise NcuReportError(f"{path}: missing {', '.join(missing)} (profile with the sections and metrics of "
                             "session38/ncu_rows.sh)")
    return Launch(path=str(path), kernel=kernel, **found)


def format_table(launches, labels=None):
    """A markdown table, one launch a row; `labels`: text naming each launch's bench row (default: its file)."""
    head = ("| row | kernel | µs | SM GHz | warp instr. (M) | issue floor µs (share) | DRAM floor µs (share) | "
            "DRAM peak TB/s | issue active % | no eligible % | warps / scheduler (eligible) | regs | occupancy % |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    out = [head]
    for i, x in enumerate(launches):
        d = x.duration_s
        label = labels[i] if labels else pathlib.Path(x.path).name
        out.append(f"| {label} | {x.kernel.split('(')[0].split('<')[0].split('::')[-1]} | {d * 1e6:.1f} | "
                   f"{x.sm_hz / 1e9:.2f} | {x.warp_instructions / 1e6:.2f} | "
                   f"{x.issue_floor_s * 1e6:.1f} ({x.issue_floor_s / d:.0%}) | {x.dram_floor_s * 1e6:.1f} "
                   f"({x.dram_floor_s / d:.0%}) | {x.dram_peak_bytes_per_s / 1e12:.2f} | {x.issue_active_pct:.1f} | "
                   f"{x.no_eligible_pct:.1f} | {x.active_warps_per_scheduler:.2f} "
                   f"({x.eligible_warps_per_scheduler:.2f}) | {x.registers:.0f} | "
                   f"{x.achieved_occupancy_pct:.1f} of {x.theoretical_occupancy_pct:.1f} |\n")
    return "".join(out)
