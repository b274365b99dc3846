"""The paper-figure details of replayssm_py.plot (issue 11): SR seeds pooled into one curve, curves that
hide each other marked, the shared/separate ratio arrow, one panel per model (fig. 12). Oracles: the
arithmetic done here by hand on fresh random curves, and matplotlib's own record of what it drew."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, checkout_env
from replayssm_py import plot
from replayssm_py.results import load_results, parse_policy

from test_plot_and_notebook import make_results

PLOT = ROOT / "scripts" / "plot_kl.py"


def curve(policy, mean, se=None, count=None):
    mean = np.asarray(mean, dtype=float)
    return {"policy": policy, "info": parse_policy(policy), "bucket_mean": mean,
            "bucket_mean_se": np.full(mean.shape, np.nan) if se is None else np.asarray(se, dtype=float),
            "bucket_count": np.full(mean.shape, 100 if count is None else count), "nonfinite_positions": 0,
            "positions": 100 * mean.size, "mean_kl": float(np.nanmean(mean)), "seed_group": []}


def test_sr_seeds_pool_into_one_curve():
    rng = np.random.default_rng(1101)
    k, buckets = 3, 7
    means = rng.lognormal(-7, 1, size=(k, buckets))
    ses = means * rng.uniform(0.01, 0.2, size=(k, buckets))
    seeds = [curve(f"shared:nvfp4+sr@16,seed={s}", means[s], ses[s]) for s in range(k)]
    other = curve("split:nvfp4+rtn/fp32@16", rng.lognormal(-8, 1, size=buckets))
    out = plot.collapse_seeds([seeds[0], other, seeds[1], seeds[2]])
    assert [c["policy"] for c in out] == ["shared:nvfp4+sr@16", "split:nvfp4+rtn/fp32@16"]
    pooled = out[0]
    assert pooled["seeds"] == [0, 1, 2]
    np.testing.assert_allclose(pooled["bucket_mean"], means.mean(axis=0), rtol=1e-14)
    boot = np.sqrt((ses ** 2).sum(axis=0)) / k
    spread = means.std(axis=0, ddof=1) / np.sqrt(k)
    np.testing.assert_allclose(pooled["bucket_mean_se"], np.maximum(boot, spread), rtol=1e-14)
    assert (pooled["bucket_count"] == 3 * 100).all() and pooled["positions"] == 3 * 100 * buckets
    assert "(mean of 3 SR seeds)" in plot.curve_label(pooled)
    assert out[1]["seeds"] == [0] and "seeds" not in plot.curve_label(out[1])


def test_overlapping_curves_are_found():
    rng = np.random.default_rng(1102)
    base = rng.lognormal(-8, 0.5, size=9)
    a = curve("split:nvfp4+rtn/fp32@16", base)
    b = curve("split:nvfp4+rtn/fp16+sr@16", base * rng.uniform(0.95, 1.05, size=9))  # within 10% everywhere
    c = curve("shared:nvfp4+sr@16", base * 20)
    d = curve("shared:nvfp4+rtn@16", base * np.r_[np.ones(8), 1.3])  # 30% apart in one bucket
    assert plot.overlapping_pairs([a, b, c, d]) == [(0, 1)]


def test_ratio_arrow_picks_the_papers_pair_at_the_longest_finite_bucket():
    rng = np.random.default_rng(1103)
    sep = rng.lognormal(-8, 0.3, size=6)
    sh_sr = sep * rng.uniform(5, 50, size=6)
    sh_sr[-1] = np.nan  # the last bucket is empty for the shared curve: the arrow moves one bucket left
    curves = [curve("shared:nvfp4+rtn@16", sep * 100), curve("split:nvfp4+rtn/fp16+sr@16", sep * 1.01),
              curve("shared:nvfp4+sr@16", sh_sr), curve("split:nvfp4+rtn/fp32@16", sep),
              curve("shared:fp16+sr@16", sep / 10)]
    i_sh, i_sep, k, r = plot.shared_separate_ratio(curves)
    assert (i_sh, i_sep, k) == (2, 3, 4)
    assert r == pytest.approx(sh_sr[4] / sep[4], rel=1e-14)
    # without SR the RTN shared curve is used; without any separate configuration there is no arrow
    assert plot.shared_separate_ratio([curves[0], curves[3]])[:3] == (0, 1, 5)
    assert plot.shared_separate_ratio([curves[0], curves[2], curves[4]]) is None


def test_one_panel_per_model_with_one_legend(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    make_results(a, n=65536, books=2, seed=11)  # its shared fp16+rtn overflows after 40K positions
    make_results(b, n=16384, books=1, seed=12)
    ra, rb = load_results(a), load_results(b)
    fig = plot.plot_kl_panels([ra, rb])
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert len(axes) == 2
    assert axes[0].get_title().endswith("2 books, N = 64K") and axes[1].get_title().endswith("1 book, N = 16K")
    # every policy once in the figure's legend, and drawn in the same colour in both panels
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    policies = [c["policy"] for c in ra["configs"]]
    assert len(labels) == len(policies)
    colours = [{line.get_gid(): line.get_color() for line in ax.get_lines() if line.get_gid()} for ax in axes]
    assert set(colours[0]) == set(policies) and colours[0] == colours[1]
    assert [t for t in labels if "non-finite" in t] == ["shared: FP16+RTN, L=16  [non-finite positions in 1 of 2 panels]"]
    # the arrow's text is the ratio of the two curves at the longest bucket
    ratio = plot.shared_separate_ratio(plot.collapse_seeds(ra["configs"]))
    texts = [t.get_text() for t in axes[0].texts]
    assert f"{ratio[3]:.0f}×" in texts or f"{ratio[3]:.1f}×" in texts


def test_panels_from_the_command_line(tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    make_results(a, n=8192, books=1, seed=21)
    make_results(b, n=8192, books=1, seed=22)
    out = tmp_path / "fig12.png"
    r = subprocess.run([sys.executable, str(PLOT), str(a), str(b), "-o", str(out)], capture_output=True, text=True,
                       env=checkout_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = subprocess.run([sys.executable, str(PLOT), str(a), str(b), "--kind", "table"], capture_output=True,
                       text=True, env=checkout_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 1 and "one panel each for --kind length only" in r.stderr


def test_window_sweep_marks_curves_that_hide_each_other(tmp_path):
    """plot_window_sweep (fig. 13): where two families' curves at the same L agree within 10% in every bucket
    (checked here by hand), the later one is drawn with open markers on the left, and the families' curves over L
    on the right likewise, with the legend saying so; families that differ keep filled markers."""
    import matplotlib

    matplotlib.use("Agg")
    path = make_results(tmp_path / "w.h5", n=16384, books=2, windows=(4, 16, 64), seed=31)
    res = load_results(path)
    by = {c["policy"]: np.asarray(c["bucket_mean"], dtype=float) for c in res["configs"]}
    fams = ["split:nvfp4+rtn/fp32", "split:nvfp4+rtn/fp16+sr"]
    for L in (4, 16, 64):  # the oracle: the synthetic separate curves differ by ~3%, far under 10%
        a, b = by[f"{fams[0]}@{L}"], by[f"{fams[1]}@{L}"]
        assert np.all(np.abs(a - b) <= 0.1 * np.minimum(a, b))
        assert not np.all(np.abs(by[f"shared:nvfp4+sr@{L}"] - a) <= 0.1 * a)
    fig = plot.plot_window_sweep(res, configs="nvfp4")
    ax0, ax1 = [ax for ax in fig.axes if ax.get_title()]
    open_left = [line for line in ax0.get_lines() if line.get_markerfacecolor() == "none" and line.get_xdata().size > 1]
    assert len(open_left) == 3  # the FP16+SR family at each of the three windows, nothing else
    labels = [t.get_text() for t in ax0.get_legend().get_texts()]
    assert [t for t in labels if "open markers" in t] == [
        "separate: NVFP4+RTN read / FP16+SR recur — open markers where it overlaps another curve"]
    # right: one value per L, the longest bucket's; the pairs within 10% at every L, found by hand
    order = ["shared:nvfp4+sr", "shared:nvfp4+rtn", *fams]  # the file's order of the nvfp4 families
    last = {f: np.array([by[f"{f}@{L}"][-1] for L in (4, 16, 64)]) for f in order}
    expect = [(order[i], order[j]) for j in range(len(order)) for i in range(j)
              if np.all(np.abs(last[order[i]] - last[order[j]]) <= 0.1 * np.minimum(last[order[i]], last[order[j]]))]
    assert (fams[0], fams[1]) in expect
    right = [t.get_text() for t in ax1.get_legend().get_texts()]
    name = {f: plot.pretty_name(f + "@0").replace(", L=0", "") for f in order}
    assert sorted(t for t in right if "overlaps" in t) == sorted(
        f"{name[j]} — overlaps {name[i]} (open markers)" for i, j in expect)
    open_right = [line for line in ax1.get_lines() if line.get_markerfacecolor() == "none"]
    assert len(open_right) == len(expect) and all(list(l.get_xdata()) == [4, 16, 64] for l in open_right)
