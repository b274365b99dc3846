"""Plot `replayssm state-error` output (paper appendix C.6 on real states): per SSM head, the measured
mean-square error of the stored state (relative to the state's mean square) against the error
model's prediction, one colour per policy, the line measured = predicted and a factor-2 band; the
second panel shows measured / predicted against the window decay E[gamma^2], where the model's
accumulation factor 1/(1 - E[gamma^2]) lives; the third (Mamba-2 heads) the same ratio when the model
takes the moments of the rounding errors the checkpoint actually received (realized_*), not those of
one rounding of the exact state.

  python3 scripts/plot_state_error.py STATE_ERROR.json [--out FILE.png]
"""
import argparse
import json
import math
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_state_error(data, title_name=None):
    """The figure for one `replayssm state-error` JSON document (already parsed): three panels, see the module
    docstring. Raises ValueError when no head has a positive predicted and measured error."""
    policies = data["policies"]
    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(17, 5))
    lo, hi = math.inf, 0.0
    drew_realized = False
    for i, p in enumerate(policies):
        pts = [(h["predicted_ms"] / h["state_ms"], h["measured_ms"] / h["state_ms"], h["mean_gamma2"])
               for h in p["heads"] if h["predicted_ms"] and h["state_ms"] > 0 and h["measured_ms"] > 0]
        if not pts:
            continue
        x, y, g2 = zip(*pts)
        colour = f"C{i}"
        marker = "o" if p["policy"].startswith("shared") else "^"
        ax.scatter(x, y, s=14, c=colour, marker=marker, alpha=0.7, label=f"{p['policy']} ({len(pts)} heads)")
        bx.scatter(g2, [m / q for q, m in zip(x, y)], s=14, c=colour, marker=marker, alpha=0.7)
        real = [(h["mean_gamma2"], h["measured_ms"] / h["realized_predicted_ms"]) for h in p["heads"]
                if h.get("realized_predicted_ms") and h["measured_ms"] > 0]
        if real:
            cx.scatter(*zip(*real), s=14, c=colour, marker=marker, alpha=0.7)
            drew_realized = True
        lo, hi = min(lo, *x, *y), max(hi, *x, *y)
    if hi == 0.0:
        plt.close(fig)
        raise ValueError("no head with a positive predicted and measured error")
    line = [lo / 2, hi * 2]
    ax.plot(line, line, "k-", lw=1, label="measured = predicted")
    ax.fill_between(line, [v / 2 for v in line], [v * 2 for v in line], color="0.85", zorder=0, label="factor 2")
    name = title_name or pathlib.Path(data["model_dir"]).name
    ax.set(xscale="log", yscale="log", xlabel="predicted mean-square error / state mean square",
           ylabel="measured mean-square error / state mean square",
           title=f"stored-state error per head: {name}, {data['positions_per_book']} positions")
    ax.legend(fontsize=7, loc="upper left")
    bx.axhline(1.0, color="k", lw=1)
    bx.axhspan(0.5, 2.0, color="0.85", zorder=0)
    bx.set(xlabel="E[gamma^2] over the window (gamma = prod alpha over L tokens)", ylabel="measured / predicted",
           yscale="log", title="where the independent-rounding model holds")
    cx.axhline(1.0, color="k", lw=1)
    cx.axhspan(0.5, 2.0, color="0.85", zorder=0)
    cx.set(xlabel="E[gamma^2] over the window", ylabel="measured / predicted from the realized rounding errors",
           yscale="log", title="sigma^2, b of the errors received (Mamba-2)")
    if not drew_realized:  # an empty panel would read as "no error": say why there is nothing to draw
        cx.text(0.5, 0.5, "not measured for this model: the errors received are known\nexactly only for a "
                "scalar decay (Mamba-2); a GDN/KDA state's error\nis carried by a matrix, not by gamma",
                transform=cx.transAxes, ha="center", va="center", fontsize=9, color="0.3")
    fig.text(0.01, 0.01, "shared (o): sigma^2/(1-E[gamma^2]) + (b/(1-E[gamma]))^2; split (^): one rounding of the HP "
                         "state; steady state (second half of the flushes). Right: realized r_e = D_e - gamma_e D_{e-1}; RTN's "
                         "errors correlate with the carried error, which the independent model leaves out", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", type=pathlib.Path)
    ap.add_argument("--out", type=pathlib.Path, help="default: the JSON path with .png")
    a = ap.parse_args(argv)
    try:
        data = json.loads(a.json.read_text())
        data["policies"]
    except (OSError, json.JSONDecodeError, KeyError) as e:
        sys.exit(f"{a.json}: not a `replayssm state-error` file ({e})")
    out = a.out or a.json.with_suffix(".png")
    try:
        fig = plot_state_error(data)
    except ValueError as e:
        sys.exit(f"{a.json}: {e}")
    fig.savefig(out, dpi=130)
    plt.close(fig)
    print(f"wrote {out}")
    return 0
