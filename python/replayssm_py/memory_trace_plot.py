"""Plot the memory trace of `scripts/train_tiny.py` runs (train_log.json `log[]`): per logged step, the median,
90th percentile and largest memory of the heads (KDA: key channels), from the weights alone (`memory`, the
input's share of dt at 0; dashed) and measured on text (`memory_text`, 1/(1 - mean alpha) of the decays the
model applies on the probe windows; solid), with the context schedule's changes marked and the 1,000-token
line where state errors accumulate over 128K. One panel per training log. It shows whether the decay
spectrum settled, and how far the weights alone are from what text gives; the script also prints, per run,
how much the text-measured spectrum still moved over the last 20% of the steps (`settling`).

  python3 scripts/plot_memory_trace.py RUN_DIR_OR_TRAIN_LOG [...] [--out FILE.png]
"""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .train import settling  # noqa: E402  (re-exported: the card's rule, in one place)

TRACES = (("memory", "from the weights (input's share at 0)", "--"),
          ("memory_text", "measured on text", "-"))
STATS = (("median", "median", "C0"), ("p90", "90th percentile", "C1"), ("max", "largest", "C3"))


def load_log(path):
    """A train_log.json document from a path to it or to the run folder holding it."""
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "train_log.json"
    if not p.exists():
        raise FileNotFoundError(f"{p}: no train_log.json (a scripts/train_tiny.py output folder, or the file)")
    return json.loads(p.read_text())


def context_changes(log):
    """[(step, seq_len)] where the context length changes (the first step included), in the steps the trace
    counts (the step that trained on the new length is its number): from the per-step record `seq_len` when
    the log has it, else from the logged entries."""
    per_step = log.get("seq_len")
    if isinstance(per_step, list) and per_step:
        pairs = [(i + 1, n) for i, n in enumerate(per_step)]
    else:
        pairs = [(e["step"], e["seq_len"]) for e in log.get("log") or [] if e.get("seq_len") is not None]
    out = []
    for step, n in pairs:
        if not out or out[-1][1] != n:
            out.append((step, n))
    return out


def settling_table(logs, names, key="memory_text", tail=0.2):
    """A markdown table of settling() for each log (a row saying so where a log has no such trace)."""
    rows = [f"Settling over the last {100 * tail:.0f}% of the steps (`log[].{key}`; change from the reference step "
            "to the end, and the fitted change per 10% of the steps):", "",
            "| run | steps | median | 90th percentile | largest | ≥ 1,000 tokens (range) |", "|---|---|---|---|---|---|"]
    for name, log in zip(names, logs):
        s = settling(log, key, tail)
        if s is None:
            rows.append(f"| {name} | | no `{key}` trace | | | |")
            continue
        cell = lambda v: f"{v['start']:,.0f} → {v['end']:,.0f} ({100 * v['change']:+.1f}%; {100 * v['per_tenth']:+.1f}% per 10%)"
        c = s["at_least_1000"]
        rows.append(f"| {name} | {s['from_step']}–{s['to_step']} | {cell(s['median'])} | {cell(s['p90'])} | "
                    f"{cell(s['max'])} | {c['start']} → {c['end']} ({c['min']}–{c['max']}) |")
    return "\n".join(rows)


def plot_memory_trace(logs, names=None):
    """One panel per train_log.json document (parsed). Raises ValueError when a log has no memory trace."""
    fig, axes = plt.subplots(1, len(logs), figsize=(5.5 * len(logs), 4.5), squeeze=False)
    handles = {}
    for i, (log, ax) in enumerate(zip(logs, axes[0])):
        entries = log.get("log") or []
        drawn = False
        for key, what, dash in TRACES:
            points = [(e["step"], e[key]) for e in entries if e.get(key)]
            if not points:
                continue
            steps = [s for s, _ in points]
            for stat, label, colour in STATS:
                (line,) = ax.plot(steps, [m[stat] for _, m in points], dash, color=colour, lw=1.4)
                handles.setdefault(f"{label}, {what}", line)
            drawn = True
        if not drawn:
            plt.close(fig)
            raise ValueError(f"log {i}: no memory trace (train_log.json log[].memory / memory_text)")
        for step, length in context_changes(log)[1:]:
            ax.axvline(step, color="0.6", lw=0.8, ls=":")
            ax.text(step, 0.03, f" {length:,}-byte context", transform=ax.get_xaxis_transform(), fontsize=7,
                    rotation=90, va="bottom", ha="right", color="0.4")
        handles.setdefault("1,000 tokens", ax.axhline(1000.0, color="k", lw=0.8, ls="-."))
        units = "channels" if log.get("arch") == "kimi_linear" else "heads"
        name = (names[i] if names else None) or log.get("arch", f"log {i}")
        n = next((e[k]["n"] for e in entries for k, _, _ in TRACES if e.get(k)), "?")
        ax.set(yscale="log", xlabel="training step", ylabel=f"memory of the {n} {units} (tokens)",
               title=f"{name}: {units} memory over training")
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", ncol=3, fontsize=7,
               bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="train_tiny output folders or their train_log.json files")
    ap.add_argument("--out", default="memory_trace.png", help="image to write (default memory_trace.png)")
    args = ap.parse_args(argv)
    try:
        logs = [load_log(p) for p in args.logs]
        fig = plot_memory_trace(logs, names=[pathlib.Path(p).name if pathlib.Path(p).is_dir() else
                                              pathlib.Path(p).parent.name for p in args.logs])
    except (FileNotFoundError, ValueError, json.JSONDecodeError) as e:
        print(f"plot_memory_trace: {e}", file=sys.stderr)
        return 2
    fig.savefig(args.out, dpi=130, bbox_inches="tight")
    print(f"wrote {args.out}")
    print(settling_table(logs, [pathlib.Path(p).name if pathlib.Path(p).is_dir() else pathlib.Path(p).parent.name
                                for p in args.logs]))
    return 0
