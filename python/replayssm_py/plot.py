"""Figures from a loaded result file (replayssm_py.results.load_results), with matplotlib.

KL vs length: mean KL over the positions of each length bucket, pooled over books, on log axes,
with bands of +- 2 standard errors (block bootstrap over positions; result files of version 2);
separate-precision (split) configurations are solid blue-green lines, shared checkpoints dashed warm
colours, conventional decode dotted grey; the legend names only the styles drawn. Non-finite
positions (NaN/Inf, e.g. an overflowed RTN state) are left out of the means and counted in the
legend.
"""
import numpy as np

from .results import length_label, parse_policy, pretty_name, select

_SPLIT_COLOURS = ["#1f4e9c", "#2a9d8f", "#5e60ce", "#0081a7", "#3a86ff", "#264653"]
_SHARED_COLOURS = ["#e76f51", "#d62828", "#f4a261", "#bc4749", "#ff7b00", "#9d0208"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def percent(count, total):
    """count/total as a percentage that never reads wrong: '100%' only when every position is
    counted, '0%' only when none, '<0.01%' below that resolution."""
    if total <= 0 or count < 0 or count > total:
        raise ValueError(f"percent: count {count} of total {total} is not a fraction")
    if count == total:
        return "100%"
    if count == 0:
        return "0%"
    pct = 100.0 * count / total
    if pct < 0.01:
        return "<0.01%"
    return f"{min(pct, 99.99):.2f}".rstrip("0").rstrip(".") + "%"


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
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    labels = [length_label(v) for v in x]
    if len(x) >= 2 and x[-1] / x[-2] < 1.5:
        labels[-2] = ""
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=0 if len(x) <= 10 else 45)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_yscale("log")


def legend_label(c):
    """The policy's readable name, with its non-finite positions and a note when KL is 0."""
    label = pretty_name(c["policy"])
    if c["nonfinite_positions"]:
        label += f"  [{c['nonfinite_positions']} non-finite, {percent(c['nonfinite_positions'], c['positions'])}]"
    if c["mean_kl"] == 0:
        label += "  (KL = 0: not on a log axis)"
    return label


def _band(ax, x, y, se, colour):
    """y +- 2 se as a shaded band where the standard error is known; on the log axis a lower edge at or
    below 0 is drawn at 1% of the mean (the interval reaches 0 there). Returns whether it drew."""
    se = np.asarray(se, dtype=float)
    ok = np.isfinite(y) & np.isfinite(se)
    if not ok.any():
        return False
    lo = np.where(ok, np.maximum(y - 2 * se, 0.01 * y), np.nan)
    hi = np.where(ok, y + 2 * se, np.nan)
    ax.fill_between(x, lo, hi, color=colour, alpha=0.15, linewidth=0)
    return True


_SCHEME_STYLE = {"split": "solid: separate precisions (split)", "shared": "dashed: shared checkpoint",
                 "conv": "dotted: conventional"}


def collapse_seeds(chosen):
    """Configurations that differ only in their SR seed, drawn as one curve: per bucket the mean over the
    seeds of the bucket means, with the larger of two standard errors of that mean — the bootstrap one
    (sqrt(sum se^2) / k) and the spread over the k seeds (sd / sqrt(k)). Other configurations pass
    through unchanged. Returns dicts shaped like the configurations, plus 'seeds' (the seeds pooled)."""
    groups = {}
    for c in chosen:
        groups.setdefault((c["info"]["family"], c["info"]["window"]), []).append(c)
    out = []
    for (family, window), cs in groups.items():
        if len(cs) == 1:
            out.append(dict(cs[0], seeds=[cs[0]["info"]["seed"]]))
            continue
        k = len(cs)
        means = np.array([np.asarray(c["bucket_mean"], dtype=float) for c in cs])
        ses = np.array([np.asarray(c.get("bucket_mean_se", np.full(means.shape[1], np.nan)), dtype=float) for c in cs])
        with np.errstate(invalid="ignore"):
            boot = np.sqrt((ses ** 2).sum(axis=0)) / k
            spread = means.std(axis=0, ddof=1) / np.sqrt(k)
        merged = dict(cs[0])
        merged.update(
            policy=f"{family}@{window}" if window else family, seeds=sorted(c["info"]["seed"] for c in cs),
            bucket_mean=means.mean(axis=0), bucket_mean_se=np.fmax(boot, spread),
            bucket_count=np.sum([np.asarray(c["bucket_count"]) for c in cs], axis=0),
            nonfinite_positions=sum(c["nonfinite_positions"] for c in cs), positions=sum(c["positions"] for c in cs),
            mean_kl=float(np.mean([c["mean_kl"] for c in cs])))
        merged["info"] = dict(cs[0]["info"], seed=0)
        out.append(merged)
    return out


def curve_label(c):
    """legend_label, with the SR seeds a curve pools."""
    label = legend_label(c)
    if len(c.get("seeds", [])) > 1:
        label += f" (mean of {len(c['seeds'])} SR seeds)"
    return label


def overlapping_pairs(curves, tolerance=0.10):
    """(i, j), i < j, of curves whose bucket means differ by less than `tolerance` relative in every bucket
    both have (on a log axis one hides the other, as FP32 and FP16+SR recurrence do)."""
    pairs = []
    for j in range(len(curves)):
        for i in range(j):
            a = np.asarray(curves[i]["bucket_mean"], dtype=float)
            b = np.asarray(curves[j]["bucket_mean"], dtype=float)
            both = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
            if both.any() and np.all(np.abs(a[both] - b[both]) <= tolerance * np.minimum(a[both], b[both])):
                pairs.append((i, j))
    return pairs


def shared_separate_ratio(curves):
    """The paper's arrow (fig. 5/12): shared NVFP4 (SR preferred) over the separate NVFP4-read / FP32-recur
    configuration (else the first separate one) at the longest bucket where both are finite and > 0.
    Returns (shared index, separate index, bucket index, ratio), or None when either is missing."""
    def pick(pred, prefer):
        idx = [i for i, c in enumerate(curves) if pred(c["info"])]
        best = [i for i in idx if prefer(curves[i]["info"])]
        return (best or idx or [None])[0]

    sep = pick(lambda p: p["scheme"] == "split", lambda p: p["recur"] and p["recur"][0] == "fp32")
    if sep is None:
        return None
    window = curves[sep]["info"]["window"]
    shared = pick(lambda p: p["scheme"] == "shared" and p["recur"] and p["recur"][0] == "nvfp4",
                  lambda p: p["recur"][1] == "sr" and p["window"] == window)
    if shared is None:
        return None
    a = np.asarray(curves[shared]["bucket_mean"], dtype=float)
    b = np.asarray(curves[sep]["bucket_mean"], dtype=float)
    ok = np.nonzero(np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0))[0]
    if not ok.size:
        return None
    k = int(ok[-1])
    return shared, sep, k, float(a[k] / b[k])


def _draw_length_curves(ax, results, configs, style_of=None):
    """The curves of plot_kl_vs_length on ax; returns the legend's notes (what the styles mean).
    style_of: policy -> line style, to keep one policy's style across panels (default: by order)."""
    chosen = select(results, configs)
    curves = collapse_seeds(chosen)
    x = _x_of(results["edges"])
    styles = [style_of[c["policy"]] for c in curves] if style_of else _styles(curves)
    hidden = {j: i for i, j in overlapping_pairs(curves)}
    banded = overflowed = False
    for j, (c, st) in enumerate(zip(curves, styles)):
        y = np.asarray(c["bucket_mean"], dtype=float)
        y = np.where(y > 0, y, np.nan)
        label = curve_label(c)
        if j in hidden:  # a thin line with open, larger markers over the other: both stay visible
            st = dict(st, markerfacecolor="none", markersize=8, markeredgewidth=1.5, linewidth=1.0)
            label += f" — overlaps {pretty_name(curves[hidden[j]]['policy']).split(',')[0]} (open markers)"
        ax.plot(x, y, label=label, gid=c["policy"], **st)
        banded |= _band(ax, x, y, c.get("bucket_mean_se", np.full(len(x), np.nan)), st["color"])
        # Where every position of a bucket is non-finite (an overflowed state) the curve stops: an
        # 'x' on its last finite point marks that.
        empty = np.nonzero(np.asarray(c["bucket_count"]) == 0)[0]
        finite = np.nonzero(np.isfinite(y))[0]
        if c["nonfinite_positions"] and empty.size and finite.size and empty[0] > finite[0]:
            last = finite[finite < empty[0]][-1]
            ax.plot([x[last]], [y[last]], linestyle="none", marker="x", color=st["color"], markersize=10,
                    markeredgewidth=2)
            overflowed = True
    ratio = shared_separate_ratio(curves)
    if ratio is not None:  # a double arrow between the two curves at that bucket, labelled with the ratio
        i_sh, i_sep, k, r = ratio
        xa = x[k] * 1.12
        ax.annotate("", xy=(xa, curves[i_sh]["bucket_mean"][k]), xytext=(xa, curves[i_sep]["bucket_mean"][k]),
                    arrowprops=dict(arrowstyle="<->", color="k", linewidth=1.2))
        ax.text(xa * 1.04, np.sqrt(curves[i_sh]["bucket_mean"][k] * curves[i_sep]["bucket_mean"][k]),
                f"{r:.0f}×" if r >= 10 else f"{r:.1f}×", fontsize=10, va="center", ha="left")
    _length_axis(ax, x)
    ax.set_xlim(x[0] / 1.3, x[-1] * (1.6 if ratio is not None else 1.3))
    ax.set_xlabel("sequence length (tokens): mean over the positions of each bucket (previous edge, edge]")
    ax.grid(True, which="both", alpha=0.3)
    drawn = [s for s in ("split", "shared", "conv") if any(c["info"]["scheme"] == s for c in curves)]
    notes = ["    ".join(_SCHEME_STYLE[s] for s in drawn)]
    if banded:
        blocks = results.get("bootstrap_block_length")
        notes.append("bands: ± 2 standard errors (block bootstrap over positions"
                     + (f", blocks of {min(blocks)}-{max(blocks)} tokens" if blocks is not None else "")
                     + (", and the spread over SR seeds" if any(len(c["seeds"]) > 1 for c in curves) else "") + ")")
    if ratio is not None:
        notes.append(f"arrow: {pretty_name(curves[ratio[0]]['policy']).split(',')[0]} over "
                     f"{pretty_name(curves[ratio[1]]['policy']).split(',')[0]} at the longest length")
    if overflowed:
        notes.append("x: the state overflowed (NaN/Inf) after this point")
    return notes


def _legend(target, handles, labels, notes, anchor):
    target.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=anchor, ncol=2, frameon=False,
                  title="\n".join(n for n in notes if n), title_fontsize=8)


def plot_kl_vs_length(results, ax=None, configs=None, title=None):
    """KL vs length (log-log), one curve per configuration (SR seeds of one policy pooled into one) with a
    band of +- 2 standard errors (block bootstrap over positions, version-2 files), the shared/separate
    ratio arrow at the longest length, overlapping curves marked. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 8), constrained_layout=True)
    else:
        fig = ax.figure
    notes = _draw_length_curves(ax, results, configs)
    ax.set_ylabel(r"$D_{KL}(p_{FP32} \,\|\, p_{config})$")
    a = results["attrs"]
    books = len(results["books"])
    ax.set_title(title or f"Teacher-forced KL vs FP32 conventional decode — {_model_name(a)}\n"
                          f"{books} book{'s' if books != 1 else ''}, N = {results['n_positions']}", fontsize=11)
    _legend(ax, *ax.get_legend_handles_labels(), notes, (0.5, -0.12))
    return fig


def _model_name(attrs):
    """'long_mamba2: mamba2 (mamba2), layers MMMMMM, ...': the model folder's name before its description."""
    import pathlib

    name = pathlib.Path(attrs.get("model_dir", "") or "").name
    desc = attrs.get("model_description", "")
    return f"{name}: {desc}" if name and desc else name or desc


def panel_title(results):
    """A panel's title: the model folder's name, its books and length."""
    import pathlib

    a = results["attrs"]
    name = pathlib.Path(a.get("model_dir", "") or "model").name
    books = len(results["books"])
    sources = results.get("sources", [])  # results.merge_results: say that the panel joins several sweeps' cells
    sweeps = f", cells of {len(sources)} sweeps" if len(sources) > 1 else ""
    return f"{name}\n{books} book{'s' if books != 1 else ''}, N = {length_label(results['n_positions'])}{sweeps}"


def plot_kl_panels(results_list, configs=None, title=None):
    """Paper fig. 12: one KL-vs-length panel per result file (model), a shared y axis and one legend for
    every curve drawn in any panel. Returns the Figure."""
    import matplotlib.pyplot as plt

    n = len(results_list)
    fig, axes = plt.subplots(1, n, figsize=(6.2 * n, 6.8), sharey=True, constrained_layout=True, squeeze=False)
    # one style per policy over every panel, so that the one legend is right for all of them
    union = {}
    for results in results_list:
        for c in collapse_seeds(select(results, configs)):
            union.setdefault(c["policy"], c)
    style_of = dict(zip(union, _styles(list(union.values()))))
    handles, notes, hidden, nonfinite = {}, [], set(), {}
    for ax, results in zip(axes[0], results_list):
        for c in collapse_seeds(select(results, configs)):
            nonfinite[c["policy"]] = nonfinite.get(c["policy"], 0) + (c["nonfinite_positions"] > 0)
        for note in _draw_length_curves(ax, results, configs, style_of):
            key = note.split(" (")[0]  # the bands' note differs between files only in the block lengths
            if not any(n.split(" (")[0] == key for n in notes):
                notes.append(note.split(", blocks of")[0] + (")" if ", blocks of" in note else ""))
        ax.set_title(panel_title(results), fontsize=11)
        ax.set_xlabel("sequence length (tokens)")
        for h in ax.get_legend_handles_labels()[0]:  # keyed by policy: a panel's label carries its own counts
            handles.setdefault(h.get_gid(), h)
            if h.get_markerfacecolor() == "none":
                hidden.add(h.get_gid())
    axes[0][0].set_ylabel(r"$D_{KL}(p_{FP32} \,\|\, p_{config})$")
    fig.suptitle(title or "Teacher-forced KL vs FP32 conventional decode", fontsize=12)
    labels = []
    for policy in handles:
        c = union[policy]
        label = pretty_name(policy) + (f" (mean of {len(c['seeds'])} SR seeds)" if len(c["seeds"]) > 1 else "")
        if policy in hidden:
            label += " — open markers where it overlaps another curve"
        if nonfinite.get(policy):
            label += f"  [non-finite positions in {nonfinite[policy]} of {n} panels]"
        labels.append(label)
    fig.legend(list(handles.values()), labels, fontsize=8, loc="outside lower center", ncol=3,
               frameon=False, title="\n".join(notes), title_fontsize=8)
    return fig


def plot_window_sweep(results, configs=None, title=None):
    """Window sweep (paper fig. 13): left, KL vs length per (family, L); right, mean KL of the
    longest bucket against L per family (split solid, shared dashed); bands and bars +- 2 standard
    errors where the file has them. Returns the Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    chosen = select(results, configs)
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
    # Curves that one hides on the log axis (FP32 and FP16+SR recurrence): per window L on the left, the later
    # family of an overlapping pair is drawn thin with open, larger markers; the same over L on the right.
    hidden_left = set()
    for L in windows:
        at_l = [(fam, c) for fam, cs in fams.items() for c in cs if c["info"]["window"] == L]
        hidden_left |= {(at_l[j][0], L) for _, j in overlapping_pairs([c for _, c in at_l])}
    for fam, cs in fams.items():
        for c in sorted(cs, key=lambda c: c["info"]["window"] or 0):
            y = np.asarray(c["bucket_mean"], dtype=float)
            colour = "0.4" if c["info"]["scheme"] == "conv" else wcol.get(c["info"]["window"], "k")
            open_markers = (fam, c["info"]["window"]) in hidden_left
            ax0.plot(x, np.where(y > 0, y, np.nan), color=colour, markersize=6 if open_markers else 3,
                     linewidth=0.8 if open_markers else 1.5,
                     **dict(famstyle[fam], **({"markerfacecolor": "none"} if open_markers else {})))
            _band(ax0, x, np.where(y > 0, y, np.nan), c.get("bucket_mean_se", np.full(len(x), np.nan)), colour)
    _length_axis(ax0, x)
    ax0.set_xlabel("sequence length (tokens)")
    ax0.set_ylabel(r"$D_{KL}(p_{FP32} \,\|\, p_{config})$")
    ax0.grid(True, which="both", alpha=0.3)

    def family_name(fam):
        return pretty_name(fam.split(",")[0] + "@0").replace(", L=0", "")

    overlapped_left = {fam for fam, _ in hidden_left}
    handles = [Line2D([], [], color=wcol[L], linewidth=2, label=f"L = {L}") for L in windows]
    handles += [Line2D([], [], color="k", label=family_name(f) + (" — open markers where it overlaps another curve"
                                                                 if f in overlapped_left else ""),
                       **dict(famstyle[f], **({"markerfacecolor": "none"} if f in overlapped_left else {})))
                for f in fams]
    ax0.legend(handles=handles, fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    ax0.set_title("KL vs length for each window L", fontsize=11)

    last = len(results["edges"]) - 2
    by_l = []
    for fam, cs in fams.items():
        cs = sorted((c for c in cs if c["info"]["window"] and c["info"]["scheme"] != "conv"),
                    key=lambda c: c["info"]["window"])
        if cs:
            by_l.append(dict(fam=fam, Ls=[c["info"]["window"] for c in cs],
                             bucket_mean=[c["bucket_mean"][last] if c["bucket_count"][last] else np.nan for c in cs],
                             ses=[2 * c.get("bucket_mean_se", np.full(last + 1, np.nan))[last] for c in cs]))
    # the pairs are compared at equal L only: curves over different sets of L are never 'overlapping'
    hidden_right = {j: i for i, j in overlapping_pairs(by_l) if by_l[i]["Ls"] == by_l[j]["Ls"]}
    for j, f in enumerate(by_l):
        style = dict(famstyle[f["fam"]], markersize=6, linewidth=2, capsize=3)
        label = family_name(f["fam"])
        if j in hidden_right:
            style.update(markerfacecolor="none", markersize=10, markeredgewidth=1.5, linewidth=1.0)
            label += f" — overlaps {family_name(by_l[hidden_right[j]]['fam'])} (open markers)"
        ys, ses = f["bucket_mean"], f["ses"]
        ax1.errorbar(f["Ls"], [y if y and y > 0 else np.nan for y in ys],
                     yerr=None if np.isnan(ses).all() else np.nan_to_num(ses), color=famcolour[f["fam"]],
                     label=label, **style)
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xticks(windows)
    ax1.set_xticklabels([str(L) for L in windows])
    ax1.set_xlabel("window L (steps per flush)")
    ax1.set_ylabel(f"mean KL at length {length_label(results['edges'][-1])}")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1)  # below: no curve hidden
    ax1.set_title(f"KL of the longest bucket vs L (N = {results['n_positions']})", fontsize=11)
    fig.suptitle(title or f"Window sweep — {results['attrs'].get('model_description', '')}", fontsize=12)
    return fig


def save_figure(fig, path, dpi=150):
    """Writes the figure to a temporary beside path, then renames it over path (a reader never sees
    half an image). The format comes from the suffix, which must be one matplotlib writes."""
    import pathlib

    from .files import write_atomically

    path = pathlib.Path(path)
    fmt = path.suffix.lstrip(".").lower()
    supported = fig.canvas.get_supported_filetypes()
    if fmt not in supported:
        raise ValueError(f"{path}: the file suffix must name an image format ({', '.join('.' + k for k in sorted(supported))}), "
                         f"got {path.suffix or 'none'}")
    write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=fmt))


KINDS = ("length", "window", "table")
DEFAULT_OUTPUT = {"length": "kl.png", "window": "kl_window.png"}


def load_panel(spec):
    """One panel's results: a result file, or 'A+B+...' (when no file has that name itself) for the
    configurations of several result files of one model, merged by results.merge_results."""
    import pathlib

    from .results import load_results, merge_results

    spec = str(spec)
    if "+" in spec and not pathlib.Path(spec).exists():
        parts = spec.split("+")
        missing = [p for p in parts if not pathlib.Path(p).exists()]
        if missing:
            raise ValueError(f"{spec}: neither a file nor files joined by '+' ({', '.join(missing)} not found)")
        return merge_results([load_results(p) for p in parts])
    return load_results(spec)


def write_report(results_path, kind="length", output=None, configs=None, lengths=None, title=None, dpi=150):
    """What scripts/plot_kl.py does: a figure (kind length or window) written to output (default
    kl.png / kl_window.png), or the table-11 text (kind table), returned and written to output if
    given; results_path may be a list of files for kind length: one panel per file (fig. 12).
    Returns (text or None, output path or None). Raises ValueError / OSError with a message that
    names the file."""
    from . import tables
    from .results import load_results

    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    if isinstance(results_path, (list, tuple)):
        if len(results_path) > 1:
            if kind != "length":
                raise ValueError(f"several result files make one panel each for --kind length only, not {kind}")
            import matplotlib

            matplotlib.use("Agg")
            loaded = [load_panel(p) for p in results_path]
            for p, r in zip(results_path, loaded):
                if not select(r, configs):
                    raise ValueError(f"{p}: no configuration matches {configs} "
                                     f"(it holds {', '.join(c['policy'] for c in r['configs'])})")
            output = output or DEFAULT_OUTPUT[kind]
            save_figure(plot_kl_panels(loaded, configs=configs, title=title), output, dpi=dpi)
            return None, output
        results_path = results_path[0]
    results = load_panel(results_path)
    if not select(results, configs):
        raise ValueError(f"{results_path}: no configuration matches {configs} "
                         f"(it holds {', '.join(c['policy'] for c in results['configs'])})")
    if kind == "table":
        text = tables.format_table(*tables.rtn_vs_sr_table(results, lengths or tables.DEFAULT_LENGTHS, configs))
        if output:
            from .files import write_text_atomically
            write_text_atomically(output, text + "\n")
        return text, output
    import matplotlib

    matplotlib.use("Agg")
    fig = (plot_kl_vs_length(results, configs=configs, title=title) if kind == "length"
           else plot_window_sweep(results, configs=configs, title=title))
    output = output or DEFAULT_OUTPUT[kind]
    save_figure(fig, output, dpi=dpi)
    return None, output
