"""The paper's table 11 form from a loaded result file (replayssm_py.results.load_results): mean KL
in the buckets ending at given lengths (± the block-bootstrap standard error where the file has it,
schema version 2), RTN and SR variants of each configuration next to each other, with non-finite
counts."""
import numpy as np

from .results import length_label, select

DEFAULT_LENGTHS = (1024, 16384, 65536, 131072)


def rtn_vs_sr_table(results, lengths=DEFAULT_LENGTHS, configs=None):
    """(column labels, rows); each row a dict with the policy, per-length cells (None where the run is
    shorter, else kl / se / nonfinite / size: a bucket whose positions were all non-finite has kl nan;
    se is nan in a version-1 file) and the non-finite totals."""
    edges = results["edges"]
    nb = len(results["books"])

    def key(c):
        p = c["info"]
        first = lambda f: f[0] if f else ""  # noqa: E731
        return (p["scheme"], first(p["read"]), first(p["recur"]), p["window"] or 0,
                {"rtn": 0, "sr": 1, "ef": 2}.get((p["recur"] or ("", ""))[1] or "", 3), p["seed"])

    rows = []
    for c in sorted(select(results, configs), key=key):
        cells = []
        for L in lengths:
            hit = np.nonzero(edges[1:] == L)[0]
            if not hit.size:
                cells.append(None)
                continue
            k = int(hit[0])
            size = (edges[k + 1] - edges[k]) * nb
            se = c.get("bucket_mean_se")
            cells.append({"kl": float(c["bucket_mean"][k]), "se": float(se[k]) if se is not None else float("nan"),
                          "nonfinite": int(size - c["bucket_count"][k]), "size": int(size)})
        rows.append({"policy": c["policy"], "cells": cells, "nonfinite_positions": c["nonfinite_positions"],
                     "nonfinite_values": c["nonfinite_values"], "positions": c["positions"]})
    return [length_label(L) for L in lengths], rows


def format_table(columns, rows):
    """The table as text, with a legend line."""
    def cell(x):
        if x is None:
            return "n/a"
        if x["nonfinite"] == x["size"]:
            return "NaN/Inf"
        s = f"{x['kl']:.3g}"
        if np.isfinite(x.get("se", np.nan)):
            s += f"±{x['se']:.2g}"
        return s + "*" if x["nonfinite"] else s

    with_se = any(x is not None and np.isfinite(x.get("se", np.nan)) for r in rows for x in r["cells"])
    cw = 17 if with_se else 10
    w = max([len("configuration")] + [len(r["policy"]) for r in rows])
    head = f"{'configuration':<{w}}" + "".join(f" {'KL@' + c:>{cw}}" for c in columns) + f" {'non-finite':>16}"
    lines = [head, "-" * len(head)]
    for r in rows:
        nf = f"{r['nonfinite_positions']}/{r['positions']}"
        lines.append(f"{r['policy']:<{w}}" + "".join(f" {cell(x):>{cw}}" for x in r["cells"]) + f" {nf:>16}")
    lines.append("KL@X: mean KL over the positions in the bucket ending at length X (pooled over books)"
                 + (", ± its block-bootstrap standard error" if with_se else "") + "; "
                 "n/a: run shorter than X; NaN/Inf: every position of the bucket non-finite; "
                 "*: some positions non-finite (left out of the mean). non-finite: positions/all positions.")
    return "\n".join(lines)
