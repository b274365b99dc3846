"""Agreement of two `replayssm kl-sweep` result files of the same sweep computed on different
devices or builds (e.g. `--device cuda` against the committed CPU result, issue 10).

The state quantizers are bit-identical on CPU and GPU given the same FP32 inputs, but the
non-recurrent layers' FP32 summation order differs, which flips some rounding decisions of the
quantizer; a flipped decision then propagates through the recurrence, so the two files hold two
realisations of the quantization noise. Their per-position KLs are therefore compared
statistically: the difference of the means in units of its standard error over blocks of
positions (neighbouring positions are correlated), besides the relative differences of the means
and of the length-bucket means, and the per-position correlation."""
import numpy as np

from .results import load_results


def _kl(path, name):
    import h5py

    with h5py.File(path, "r") as f:
        return f["configs"][name]["kl"][:].astype(np.float64)


def block_z(a, b, block):
    """(mean(b - a), its standard error from means of `block` consecutive positions per book, z)."""
    d = b - a
    n = d.shape[-1] // block
    if n < 2:
        raise ValueError(f"block {block}: fewer than 2 blocks in {d.shape[-1]} positions")
    means = d[..., :n * block].reshape(-1, block).mean(axis=1)
    se = means.std(ddof=1) / np.sqrt(means.size)
    diff = float(np.mean(d))
    return diff, float(se), (diff / se if se > 0 else (0.0 if diff == 0 else np.inf))


def compare_results(path_a, path_b, block=1024):
    """Rows, one per configuration of path_a (all must be in path_b, with the same books and N):
    dict(policy, mean_a, mean_b, rel, z, se, bucket_rel_max, corr, identical, nonfinite_a,
    nonfinite_b). Positions non-finite in either file are left out of every figure."""
    a, b = load_results(path_a), load_results(path_b)
    if a["books"] != b["books"] or a["n_positions"] != b["n_positions"]:
        raise ValueError(f"{path_a} and {path_b} are not the same sweep: books {a['books']} vs {b['books']}, "
                         f"N {a['n_positions']} vs {b['n_positions']}")
    if a["text_fnv1a64"] != b["text_fnv1a64"]:
        raise ValueError(f"{path_a} and {path_b} read different texts (books/text_fnv1a64 differ)")
    names_b = {c["name"] for c in b["configs"]}
    rows = []
    for c in a["configs"]:
        if c["name"] not in names_b:
            raise ValueError(f"{path_b} has no configuration {c['policy']} (of {path_a})")
        ka, kb = _kl(path_a, c["name"]), _kl(path_b, c["name"])
        ok = np.isfinite(ka) & np.isfinite(kb)
        fa, fb = np.where(ok, ka, 0.0), np.where(ok, kb, 0.0)
        diff, se, z = block_z(fa, fb, block)
        ma, mb = float(fa[ok].mean()), float(fb[ok].mean())
        edges = a["edges"]
        lengths = np.arange(1, a["n_positions"] + 1)
        bucket_rel = []
        for k in range(len(edges) - 1):
            sel = ok & ((lengths > edges[k]) & (lengths <= edges[k + 1]))[None, :]
            if sel.any() and ka[sel].mean() > 0:
                bucket_rel.append(abs(kb[sel].mean() - ka[sel].mean()) / ka[sel].mean())
        corr = float(np.corrcoef(fa[ok], fb[ok])[0, 1]) if ok.sum() > 1 and fa[ok].std() > 0 and fb[ok].std() > 0 \
            else float("nan")
        rows.append({"policy": c["policy"], "mean_a": ma, "mean_b": mb,
                     "rel": abs(mb - ma) / ma if ma > 0 else float("nan"), "z": z, "se": se,
                     "bucket_rel_max": max(bucket_rel) if bucket_rel else float("nan"), "corr": corr,
                     "identical": float(np.mean(ka == kb)), "nonfinite_a": int((~np.isfinite(ka)).sum()),
                     "nonfinite_b": int((~np.isfinite(kb)).sum())})
    return rows


def format_comparison(rows, label_a="a", label_b="b"):
    head = (f"{'configuration':32s} {'mean KL ' + label_a:>14s} {'mean KL ' + label_b:>14s} {'rel diff':>9s} "
            f"{'z (block SE)':>12s} {'max bucket rel':>14s} {'corr':>7s} {'identical':>9s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['policy']:32s} {r['mean_a']:14.4e} {r['mean_b']:14.4e} {r['rel']:9.4f} {r['z']:+12.2f} "
                     f"{r['bucket_rel_max']:14.4f} {r['corr']:7.4f} {r['identical']:9.3f}")
    return "\n".join(lines)
