#!/usr/bin/env python3
"""One line per profiled launch from `ncu --csv --page details` logs (device_call.sh targets).

Usage: python3 ncu_targets.py ncu_t_*.csv [--rules]

Per launch: the kernel (template arguments kept, namespaces dropped), grid, duration, DRAM and SM
throughput, achieved / theoretical occupancy and what limits it, registers, waves per SM, the
scheduler's issue rate, the warp cycles per issued instruction and the four largest stall reasons
(when the log has the stall metrics device_call.sh asks for). --rules adds Nsight Compute's own
rule texts (stall reasons, occupancy limiters) under each launch. Lines that are not CSV (ncu's
==PROF== and ==WARNING== lines) are skipped; a file without any launch is reported, not ignored.
"""
import csv
import re
import sys

KEYS = [
    ("Duration", "dur"),
    ("DRAM Throughput", "dram%"),
    ("Compute (SM) Throughput", "sm%"),
    ("Achieved Occupancy", "occ%"),
    ("Theoretical Occupancy", "theo%"),
    ("Block Limit Registers", "lim_reg"),
    ("Block Limit Shared Mem", "lim_smem"),
    ("Registers Per Thread", "regs"),
    ("Waves Per SM", "waves"),
    ("Issued Warp Per Scheduler", "ipc/sched"),
    ("No Eligible", "no_elig%"),
    ("Warp Cycles Per Issued Instruction", "cyc/instr"),
    ("Local Memory Spilling Requests", "spill_req"),
]


# --metrics smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio: warp cycles per issued instruction
STALL = r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def short_kernel(name):
    """`void ns::(anonymous namespace)::k<(ns::E)1, (int)128>(Args)` -> `k<(E)1, (int)128>`."""
    name = name.removeprefix("void ").strip()
    lt = name.find("<")
    head, args = (name, "") if lt < 0 else (name[:lt], name[lt:])
    if not args and "(" in head:
        head = head[: head.index("(")]
    head = re.split(r"::|>::", head)[-1]
    if args:  # drop the parameter list after the template arguments' closing '>'
        depth = 0
        for i, c in enumerate(args):
            depth += c == "<"
            depth -= c == ">"
            if depth == 0:
                args = args[: i + 1]
                break
        args = re.sub(r"\(([A-Za-z_0-9]+::)+", "(", args)
    return head + args


def launches(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    if not lines:
        return None
    rows = list(csv.reader(lines))
    head = rows[0]
    out = {}
    for r in rows[1:]:
        d = dict(zip(head, r))
        key = d["ID"]
        if key not in out:
            out[key] = {"kernel": d["Kernel Name"], "grid": d["Grid Size"], "block": d["Block Size"], "m": {}, "rules": []}
        if d.get("Metric Name"):
            out[key]["m"].setdefault(d["Metric Name"], d["Metric Value"])
        elif d.get("Rule Description"):
            out[key]["rules"].append(f'{d.get("Rule Name", "")}: {d["Rule Description"]}')
    return out


def main(argv):
    rules = "--rules" in argv
    files = [a for a in argv if a != "--rules"]
    if not files:
        sys.exit(__doc__)
    for path in files:
        ls = launches(path)
        if ls is None:
            print(f"{path}: no launch profiled (see the matching ncu_t_bench_*.txt)")
            continue
        # per kernel: launches, mean and largest duration (step_b32 alternates the flush and non-flush kernels)
        per = {}
        for l in ls.values():
            per.setdefault(short_kernel(l["kernel"]), []).append(number(l["m"].get("Duration", "nan")))
        for k, d in per.items():
            print(f"{path.split('/')[-1]} {k}: {len(d)} launches, duration mean {sum(d) / len(d):,.0f} max {max(d):,.0f} "
                  f"(units of the log's Duration)")
        for i, l in ls.items():
            m = l["m"]
            vals = " ".join(f"{label}={m[k]}" for k, label in KEYS if k in m)
            stalls = sorted(((number(v), re.sub(STALL, r"\1", k)) for k, v in m.items() if re.fullmatch(STALL, k)), reverse=True)
            top = " ".join(f"{n}={v:.2f}" for v, n in stalls[:4])
            print(f"{path.split('/')[-1]} #{i} {short_kernel(l['kernel'])} grid{l['grid']}: {vals}" + (f" | stalls {top}" if top else ""))
            if rules:
                for r in l["rules"]:
                    print("    " + r[:400])


if __name__ == "__main__":
    main(sys.argv[1:])
