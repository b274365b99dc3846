#!/usr/bin/env python3
"""Figures and tables from a `replayssm kl-sweep` result file (schema in docs/KL_SWEEP.md).

    python3 scripts/plot_kl.py results-fig5.h5 -o kl.png                  # KL vs length (paper fig. 5/12)
    python3 scripts/plot_kl.py results-fig13.h5 --kind window -o win.png  # window sweep (fig. 13)
    python3 scripts/plot_kl.py results-table11.h5 --kind table            # RTN vs SR (table 11)

KL vs length: mean KL over the positions of each length bucket ((512, 1K], (1K, 2K], ...), pooled
over books, on log axes; separate-precision (split) configurations are solid blue-green lines,
shared checkpoints dashed warm colours, conventional decode dotted grey. Non-finite positions
(NaN/Inf, e.g. an overflowed RTN state) are left out of the means and counted in the legend.

The functions are importable (notebooks/kl_vs_length.ipynb uses them):
load_results, plot_kl_vs_length, plot_window_sweep, rtn_vs_sr_table, format_table.
"""
import argparse
import json
import re
import sys

import h5py
import numpy as np

SCHEMA = "replayssm-kl-sweep"


# ---- reading ------------------------------------------------------------------------------------

def _s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def load_results(path):
    """Reads a result file into plain Python/numpy objects.

    Returns a dict with: path, attrs (root attributes), edges (int64 [K+1]), books (names),
    n_positions, configs: a list in sweep order of dicts with name (group), policy, config (parsed
    JSON), info (parse_policy), and per-book / aggregate arrays (kl is not loaded: f[...]["kl"]).
    """
    with h5py.File(path, "r") as f:
        schema = _s(f.attrs.get("schema", ""))
        if schema != SCHEMA:
            raise ValueError(f"{path}: not a replayssm kl-sweep result file (schema {schema!r})")
        attrs = {k: (_s(v) if isinstance(v, (bytes, str)) else v.item() if hasattr(v, "item") else v)
                 for k, v in f.attrs.items()}
        edges = f["bucket_edges"][:].astype(np.int64)
        books = [_s(x) for x in f["books/name"][:]]
        order = [_s(x) for x in f["config_order"][:]] if "config_order" in f else list(f["configs"].keys())
        configs = []
        for name in order:
            g = f["configs"][name]
            a = g["aggregate"]
            policy = _s(g.attrs["policy"])
            c = {
                "name": name,
                "policy": policy,
                "config": json.loads(_s(g.attrs.get("config", "{}"))),
                "info": parse_policy(policy),
                "bucket_mean": a["bucket_mean"][:],
                "bucket_count": a["bucket_count"][:],
                "mean_kl": float(a["mean_kl"][()]),
                "top1": float(a["top1"][()]),
                "delta_p": float(a["delta_p"][()]),
                "percentiles": a["percentiles"][:],
                "positions": int(a["positions"][()]),
                "nonfinite_positions": int(a["nonfinite_positions"][()]),
                "nonfinite_values": int(a["nonfinite_values"][()]),
                "book_bucket_mean": g["bucket_mean"][:],
                "book_nonfinite_positions": g["nonfinite_positions"][:],
            }
            configs.append(c)
    return {"path": str(path), "attrs": attrs, "edges": edges, "books": books,
            "n_positions": int(attrs.get("n_positions", edges[-1])), "configs": configs}


_POLICY = re.compile(r"^(?P<scheme>conv|conventional|shared|split):(?P<fmts>[^@,]+)(?:@(?P<window>\d+))?"
                     r"(?:,seed=(?P<seed>\d+))?$")


def parse_policy(policy):
    """'split:nvfp4+rtn/fp16+sr@16,seed=2' -> dict(scheme, read, recur, window, seed, family).

    read/recur are (format, rounding) pairs (rounding None for fp32); family is the policy without
    window and seed (the curve a window sweep follows)."""
    m = _POLICY.match(policy.strip())
    if not m:
        return {"scheme": "?", "read": None, "recur": None, "window": None, "seed": 0, "family": policy}
    scheme = "conv" if m["scheme"].startswith("conv") else m["scheme"]

    def fmt(s):
        name, _, rnd = s.partition("+")
        return (name, rnd or None)

    parts = m["fmts"].split("/")
    read, recur = (fmt(parts[0]), fmt(parts[1])) if scheme == "split" and len(parts) == 2 else (None, fmt(parts[0]))
    return {"scheme": scheme, "read": read, "recur": recur,
            "window": int(m["window"]) if m["window"] else (1 if scheme == "conv" else None),
            "seed": int(m["seed"] or 0), "family": f"{scheme}:{m['fmts']}"}


def length_label(n):
    n = int(n)
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}K"
    return str(n)


def pretty_name(policy):
    """A readable legend label: 'separate NVFP4 read / FP16+SR recur, L=16'."""
    p = parse_policy(policy)
    if p["recur"] is None:
        return policy

    def f(x):
        name, rnd = x
        name = {"fp8b128": "FP8"}.get(name, name.upper())
        return f"{name}+{rnd.upper()}" if rnd else name

    seed = f", seed {p['seed']}" if p["seed"] else ""
    if p["scheme"] == "split":
        return f"separate: {f(p['read'])} read / {f(p['recur'])} recur, L={p['window']}{seed}"
    if p["scheme"] == "shared":
        return f"shared: {f(p['recur'])}, L={p['window']}{seed}"
    return f"conventional: {f(p['recur'])}{seed}"


# ---- styles -------------------------------------------------------------------------------------

_SPLIT_COLOURS = ["#1f4e9c", "#2a9d8f", "#5e60ce", "#0081a7", "#3a86ff", "#264653"]
_SHARED_COLOURS = ["#e76f51", "#d62828", "#f4a261", "#bc4749", "#ff7b00", "#9d0208"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def _styles(configs):
    counters = {"split": 0, "shared": 0, "conv": 0}
    out = []
    for i, c in enumerate(configs):
        scheme = c["info"]["scheme"]
        k = counters.get(scheme, 0)
        counters[scheme] = k + 1
        if scheme == "split":
            st = dict(color=_SPLIT_COLOURS[k % len(_SPLIT_COLOURS)], linestyle="-", linewidth=2.2)
        elif scheme == "shared":
            st = dict(color=_SHARED_COLOURS[k % len(_SHARED_COLOURS)], linestyle="--", linewidth=1.8)
        else:
            st = dict(color=str(0.25 + 0.15 * (k % 4)), linestyle=":", linewidth=1.8)
        st["marker"] = _MARKERS[i % len(_MARKERS)]
        st["markersize"] = 4
        out.append(st)
    return out


def _x_of(edges):
    return edges[1:].astype(float)


def _length_axis(ax, x):
    """Log2 length axis with a tick per bucket end; a last bucket ending close to the previous
    power of two (N not a power of two) keeps only the label of N."""
    ax.set_xscale("log", base=2)
    labels = [length_label(v) for v in x]
    if len(x) >= 2 and x[-1] / x[-2] < 1.5:
        labels[-2] = ""
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=0 if len(x) <= 10 else 45)
    from matplotlib.ticker import NullLocator
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_yscale("log")


def _legend_label(c):
    label = pretty_name(c["policy"])
    if c["nonfinite_positions"]:
        frac = c["nonfinite_positions"] / max(1, c["positions"])
        label += f"  [{c['nonfinite_positions']} non-finite, {100 * frac:.2g}%]"
    if c["mean_kl"] == 0:
        label += "  (KL = 0: not on a log axis)"
    return label


def _select(results, configs):
    if not configs:
        return results["configs"]
    pats = [re.compile(p) for p in configs]
    return [c for c in results["configs"] if any(p.search(c["policy"]) for p in pats)]


# ---- figures ------------------------------------------------------------------------------------

def plot_kl_vs_length(results, ax=None, configs=None, title=None):
    """KL vs length (log-log), one curve per configuration. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt
    chosen = _select(results, configs)
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 8), constrained_layout=True)
    else:
        fig = ax.figure
    x = _x_of(results["edges"])
    for c, st in zip(chosen, _styles(chosen)):
        y = np.asarray(c["bucket_mean"], dtype=float)
        y = np.where(y > 0, y, np.nan)
        ax.plot(x, y, label=_legend_label(c), **st)
        # Where every position of a bucket is non-finite (an overflowed state) the curve stops: an
        # 'x' on its last finite point marks that.
        empty = np.nonzero(np.asarray(c["bucket_count"]) == 0)[0]
        finite = np.nonzero(np.isfinite(y))[0]
        if c["nonfinite_positions"] and empty.size and finite.size and empty[0] > finite[0]:
            last = finite[finite < empty[0]][-1]
            ax.plot([x[last]], [y[last]], linestyle="none", marker="x", color=st["color"], markersize=10,
                    markeredgewidth=2)
    _length_axis(ax, x)
    ax.set_xlabel("sequence length (tokens): mean over the positions of each bucket (previous edge, edge]")
    ax.set_ylabel(r"$D_{KL}(p_{FP32} \,\|\, p_{config})$")
    a = results["attrs"]
    ax.set_title(title or f"Teacher-forced KL vs FP32 conventional decode — {a.get('model_description', '')}\n"
                          f"{len(results['books'])} books, N = {results['n_positions']}", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False,
              title="solid: separate precisions (split)    dashed: shared checkpoint    dotted: conventional;"
                    "  x: the state overflowed (NaN/Inf) after this point", title_fontsize=8)
    return fig


def plot_window_sweep(results, configs=None, title=None):
    """Window sweep (paper fig. 13): left, KL vs length per (family, L); right, mean KL of the
    longest bucket against L per family (split solid, shared dashed). Returns the Figure."""
    import matplotlib.pyplot as plt
    chosen = _select(results, configs)
    fams = {}
    for c in chosen:
        fams.setdefault(c["info"]["family"] + (f",seed={c['info']['seed']}" if c["info"]["seed"] else ""), []).append(c)
    windows = sorted({c["info"]["window"] for c in chosen if c["info"]["window"] and c["info"]["scheme"] != "conv"})
    cmap = plt.get_cmap("viridis")
    wcol = {L: cmap(i / max(1, len(windows) - 1)) for i, L in enumerate(windows)}
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(14, 5.5), constrained_layout=True)
    x = _x_of(results["edges"])
    famstyle, famcolour, counters = {}, {}, {"split": 0, "shared": 0, "conv": 0}
    for i, fam in enumerate(fams):
        scheme = parse_policy(fam.split(",")[0] + "@1")["scheme"]
        famstyle[fam] = dict(linestyle="-" if scheme == "split" else "--" if scheme == "shared" else ":",
                             marker=_MARKERS[i % len(_MARKERS)])
        k = counters.get(scheme, 0)
        counters[scheme] = k + 1
        famcolour[fam] = (_SPLIT_COLOURS[k % len(_SPLIT_COLOURS)] if scheme == "split" else
                          _SHARED_COLOURS[k % len(_SHARED_COLOURS)] if scheme == "shared" else "0.4")
    for fam, cs in fams.items():
        for c in sorted(cs, key=lambda c: c["info"]["window"] or 0):
            y = np.asarray(c["bucket_mean"], dtype=float)
            colour = "0.4" if c["info"]["scheme"] == "conv" else wcol.get(c["info"]["window"], "k")
            ax0.plot(x, np.where(y > 0, y, np.nan), color=colour, markersize=3,
                     linewidth=1.5, **famstyle[fam])
    _length_axis(ax0, x)
    ax0.set_xlabel("sequence length (tokens)")
    ax0.set_ylabel(r"$D_{KL}(p_{FP32} \,\|\, p_{config})$")
    ax0.grid(True, which="both", alpha=0.3)
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=wcol[L], linewidth=2, label=f"L = {L}") for L in windows]
    handles += [Line2D([], [], color="k", label=pretty_name(f.split(",")[0] + "@0").replace(", L=0", ""), **famstyle[f])
                for f in fams]
    ax0.legend(handles=handles, fontsize=8, frameon=False)
    ax0.set_title("KL vs length for each window L", fontsize=11)

    last = len(results["edges"]) - 2
    for fam, cs in fams.items():
        cs = sorted((c for c in cs if c["info"]["window"] and c["info"]["scheme"] != "conv"),
                    key=lambda c: c["info"]["window"])
        if not cs:
            continue
        Ls = [c["info"]["window"] for c in cs]
        ys = [c["bucket_mean"][last] if c["bucket_count"][last] else np.nan for c in cs]
        ax1.plot(Ls, [y if y and y > 0 else np.nan for y in ys], color=famcolour[fam], markersize=6, linewidth=2,
                 label=pretty_name(fam.split(",")[0] + "@0").replace(", L=0", ""), **famstyle[fam])
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xticks(windows)
    ax1.set_xticklabels([str(L) for L in windows])
    ax1.set_xlabel("window L (steps per flush)")
    ax1.set_ylabel(f"mean KL at length {length_label(results['edges'][-1])}")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, frameon=False)
    ax1.set_title(f"KL of the longest bucket vs L (N = {results['n_positions']})", fontsize=11)
    fig.suptitle(title or f"Window sweep — {results['attrs'].get('model_description', '')}", fontsize=12)
    return fig


# ---- table 11 -----------------------------------------------------------------------------------

def rtn_vs_sr_table(results, lengths=(1024, 16384, 65536, 131072), configs=None):
    """Rows for the paper's table 11: mean KL in the buckets ending at `lengths` (None where the
    run is shorter) plus non-finite counts, RTN and SR variants of each configuration next to each
    other. A bucket whose positions were all non-finite gives nan; partially non-finite buckets are
    flagged. Returns (column labels, rows); rows are dicts."""
    edges = results["edges"]
    nb = len(results["books"])
    chosen = _select(results, configs)

    def key(c):
        p = c["info"]
        strip = lambda f: f[0] if f else ""
        return (p["scheme"], strip(p["read"]), strip(p["recur"]), p["window"] or 0,
                {"rtn": 0, "sr": 1}.get((p["recur"] or ("", ""))[1] or "", 2), p["seed"])

    rows = []
    for c in sorted(chosen, key=key):
        cells = []
        for L in lengths:
            hit = np.nonzero(edges[1:] == L)[0]
            if not hit.size:
                cells.append(None)
                continue
            k = int(hit[0])
            size = (edges[k + 1] - edges[k]) * nb
            nonfinite = int(size - c["bucket_count"][k])
            cells.append({"kl": float(c["bucket_mean"][k]), "nonfinite": nonfinite, "size": int(size)})
        rows.append({"policy": c["policy"], "cells": cells, "nonfinite_positions": c["nonfinite_positions"],
                     "nonfinite_values": c["nonfinite_values"], "positions": c["positions"]})
    return [length_label(L) for L in lengths], rows


def format_table(columns, rows):
    def cell(x):
        if x is None:
            return "n/a"
        if x["nonfinite"] == x["size"]:
            return "NaN/Inf"
        s = f"{x['kl']:.3g}"
        return s + "*" if x["nonfinite"] else s

    w = max([len("configuration")] + [len(r["policy"]) for r in rows])
    head = f"{'configuration':<{w}}" + "".join(f" {'KL@' + c:>10}" for c in columns) + f" {'non-finite':>16}"
    lines = [head, "-" * len(head)]
    for r in rows:
        nf = f"{r['nonfinite_positions']}/{r['positions']}"
        lines.append(f"{r['policy']:<{w}}" + "".join(f" {cell(x):>10}" for x in r["cells"]) + f" {nf:>16}")
    lines.append("KL@X: mean KL over the positions in the bucket ending at length X (pooled over books); "
                 "n/a: run shorter than X; NaN/Inf: every position of the bucket non-finite; "
                 "*: some positions non-finite (left out of the mean). non-finite: positions/all positions.")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="result file written by replayssm kl-sweep")
    ap.add_argument("-o", "--output", help="image file (png, pdf, svg); --kind table: text file (also printed)")
    ap.add_argument("--kind", choices=["length", "window", "table"], default="length")
    ap.add_argument("--configs", nargs="*", help="regular expressions selecting configurations (default: all)")
    ap.add_argument("--lengths", help="--kind table: bucket ends, comma-separated (default 1024,16384,65536,131072)")
    ap.add_argument("--title")
    ap.add_argument("--dpi", type=int, default=150)
    args = ap.parse_args(argv)

    try:
        results = load_results(args.results)
    except (OSError, ValueError) as e:
        print(f"plot_kl.py: {e}", file=sys.stderr)
        return 1
    if not _select(results, args.configs):
        print(f"plot_kl.py: no configuration matches {args.configs}", file=sys.stderr)
        return 1
    if args.kind == "table":
        lengths = tuple(int(x) for x in args.lengths.split(",")) if args.lengths else (1024, 16384, 65536, 131072)
        text = format_table(*rtn_vs_sr_table(results, lengths, args.configs))
        print(text)
        if args.output:
            with open(args.output, "w") as f:
                f.write(text + "\n")
        return 0
    import matplotlib
    matplotlib.use("Agg")
    fig = (plot_kl_vs_length(results, configs=args.configs, title=args.title) if args.kind == "length"
           else plot_window_sweep(results, configs=args.configs, title=args.title))
    out = args.output or ("kl.png" if args.kind == "length" else "kl_window.png")
    fig.savefig(out, dpi=args.dpi, bbox_inches="tight")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
