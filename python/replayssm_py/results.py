"""Reading `replayssm kl-sweep` result files (HDF5 schema "replayssm-kl-sweep", versions 1 and 2, in
docs/KL_SWEEP.md and src/eval/results_file.h) into plain Python and numpy objects, and naming the
precision policies they hold. Version 2 added the uncertainty statistics (standard errors, spreads
over books and seeds, p99.9, RMS delta-p, perplexity ratio); read from a version-1 file they are
NaN."""
import json
import re

import numpy as np

SCHEMA = "replayssm-kl-sweep"
SCHEMA_VERSION = 2
OLDEST_SCHEMA_VERSION = 1  # still read: the v2 statistics come back as NaN
PERCENTILE_LEVELS = (50.0, 90.0, 99.0, 99.9, 100.0)


def _s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def _attr(v):
    if isinstance(v, (bytes, str)):
        return _s(v)
    return v.item() if hasattr(v, "item") else v


def load_results(path):
    """Reads a result file.

    Returns a dict with: path, attrs (root attributes), schema_version, edges (int64 [K+1]),
    bootstrap_block_length (int64 [K]: each bucket's bootstrap block; None in version 1), books
    (names), text_fnv1a64 (per book, the stripped-text hash), n_positions, percentile_levels, configs:
    a list in sweep order of dicts with name (group), policy, config (parsed JSON), info
    (parse_policy), seed_group (the configurations of this policy under other SR seeds, itself
    included; empty when one), and the aggregate and per-book (book_*) arrays (kl itself is not
    loaded: f["configs"][name]["kl"]). percentiles always has the five levels (p99.9 NaN in a
    version-1 file); the version-2 statistics (bucket_mean_se, mean_kl_se, ppl_ratio, ...) are NaN
    in a version-1 file.
    Raises ValueError for a file of another schema or version, unfinished or missing a part.
    """
    import h5py

    with h5py.File(path, "r") as f:
        return _read(f, path)


# What load_results takes from each configuration group: aggregate arrays and scalars, and per-book
# arrays (named book_<name> in the result).
_AGGREGATE_ARRAYS = ("bucket_mean", "bucket_count", "percentiles")
_AGGREGATE_SCALARS = {"mean_kl": float, "top1": float, "delta_p": float, "positions": int,
                      "nonfinite_positions": int, "nonfinite_values": int}
_PER_BOOK_ARRAYS = ("bucket_mean", "nonfinite_positions")
# Added in version 2: read when present, else NaN of the same shape ("bucket" arrays [K], scalars).
_V2_AGGREGATE_BUCKET_ARRAYS = ("bucket_mean_se", "bucket_top1", "bucket_top1_se", "bucket_rms_delta_p",
                               "bucket_ppl_ratio", "bucket_ppl_ratio_se", "bucket_mean_book_se",
                               "bucket_mean_seed_se")
_V2_AGGREGATE_SCALARS = ("mean_kl_se", "top1_se", "rms_delta_p", "ppl_ratio", "ppl_ratio_se", "ppl", "ref_ppl",
                         "mean_kl_book_se", "mean_kl_seed_se")


def _percentiles_v2(values):
    """A percentiles array (last axis = levels) in the version-2 levels: a version-1 array
    [p50, p90, p99, max] gets NaN for p99.9."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape[-1] == len(PERCENTILE_LEVELS):
        return values
    return np.insert(values, 3, np.nan, axis=-1)


def _need(group, name, path):
    """group[name], or a ValueError that names the file and the missing object."""
    if name not in group:
        where = f"{group.name.rstrip('/')}/{name}"
        raise ValueError(f"{path}: not a complete {SCHEMA} file: no {where}")
    return group[name]


def _read(f, path):
    """The dict of load_results from an open file."""
    schema = _s(f.attrs.get("schema", ""))
    if schema != SCHEMA:
        raise ValueError(f"{path}: not a replayssm kl-sweep result file (schema {schema!r})")
    version = int(f.attrs.get("schema_version", 0))
    if not OLDEST_SCHEMA_VERSION <= version <= SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version}, this reader knows {OLDEST_SCHEMA_VERSION} to "
                         f"{SCHEMA_VERSION}")
    if int(f.attrs.get("complete", 0)) != 1:
        raise ValueError(f"{path}: attribute complete is not 1: the sweep that wrote it did not finish")
    attrs = {k: _attr(v) for k, v in f.attrs.items()}
    edges = _need(f, "bucket_edges", path)[:].astype(np.int64)
    books = [_s(x) for x in _need(f, "books/name", path)[:]]
    hashes = [_s(x) for x in _need(f, "books/text_fnv1a64", path)[:]]
    order = [_s(x) for x in _need(f, "config_order", path)[:]]
    configs = []
    for name in order:
        g = _need(_need(f, "configs", path), name, path)
        if "policy" not in g.attrs:
            raise ValueError(f"{path}: not a complete {SCHEMA} file: {g.name} has no attribute policy")
        policy = _s(g.attrs["policy"])
        a = _need(g, "aggregate", path)
        c = {"name": name, "policy": policy, "config": json.loads(_s(g.attrs.get("config", "{}"))),
             "info": parse_policy(policy)}
        c.update({k: _need(a, k, path)[:] for k in _AGGREGATE_ARRAYS})
        c["percentiles"] = _percentiles_v2(c["percentiles"])
        c.update({k: convert(_need(a, k, path)[()]) for k, convert in _AGGREGATE_SCALARS.items()})
        c.update({f"book_{k}": _need(g, k, path)[:] for k in _PER_BOOK_ARRAYS})
        K, B = len(edges) - 1, len(books)
        v2 = version >= 2
        c.update({k: _need(a, k, path)[:] if v2 else np.full(K, np.nan) for k in _V2_AGGREGATE_BUCKET_ARRAYS})
        c.update({k: float(_need(a, k, path)[()]) if v2 else float("nan") for k in _V2_AGGREGATE_SCALARS})
        c["bucket_percentiles"] = (_need(a, "bucket_percentiles", path)[:] if v2
                                   else np.full((K, len(PERCENTILE_LEVELS)), np.nan))
        c["book_bucket_mean_se"] = _need(g, "bucket_mean_se", path)[:] if v2 else np.full((B, K), np.nan)
        c["book_mean_kl"] = _need(g, "mean_kl", path)[:]
        c["book_mean_kl_se"] = _need(g, "mean_kl_se", path)[:] if v2 else np.full(B, np.nan)
        c["seed_group"] = json.loads(_s(a.attrs["seed_group"])) if "seed_group" in a.attrs else []
        configs.append(c)
    blocks = f["bootstrap_block_length"][:] if "bootstrap_block_length" in f else None
    return {"path": str(path), "attrs": attrs, "schema_version": version, "edges": edges, "books": books,
            "bootstrap_block_length": blocks,
            "text_fnv1a64": hashes, "n_positions": int(attrs.get("n_positions", edges[-1])),
            "percentile_levels": PERCENTILE_LEVELS, "configs": configs}


_POLICY = re.compile(r"^(?P<scheme>conv|conventional|shared|split):(?P<fmts>[^@,]+)(?:@(?P<window>\d+))?"
                     r"(?:,seed=(?P<seed>\d+))?$")


def parse_policy(policy):
    """'split:nvfp4+rtn/fp16+sr@16,seed=2' -> dict(scheme, read, recur, window, seed, family).

    read/recur are (format, rounding) pairs (rounding None for fp32); family is the policy without
    window and seed (the curve a window sweep follows). A string of no known form gives scheme '?'."""
    m = _POLICY.match(policy.strip())
    if not m:
        return {"scheme": "?", "read": None, "recur": None, "window": None, "seed": 0, "family": policy}
    scheme = "conv" if m["scheme"].startswith("conv") else m["scheme"]

    def fmt(s):
        name, _, rnd = s.partition("+")
        return (name, rnd or None)

    parts = m["fmts"].split("/")
    if scheme == "split" and len(parts) == 2:
        read, recur = fmt(parts[0]), fmt(parts[1])
    else:
        read, recur = None, fmt(parts[0])
    return {"scheme": scheme, "read": read, "recur": recur,
            "window": int(m["window"]) if m["window"] else (1 if scheme == "conv" else None),
            "seed": int(m["seed"] or 0), "family": f"{scheme}:{m['fmts']}"}


def length_label(n):
    """1024 -> '1K', 131072 -> '128K', 1000 -> '1000'."""
    n = int(n)
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}K"
    return str(n)


def pretty_name(policy):
    """A readable legend label: 'separate: NVFP4+RTN read / FP16+SR recur, L=16'."""
    if policy.startswith("noise-floor:"):  # a --compute sweep's noise floor (docs/KL_SWEEP.md)
        compute = policy[len("noise-floor:"):].removesuffix("-vs-fp32")
        return f"noise floor: reference at {compute.upper()} vs FP32 compute"
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


# What must be equal for the configurations of several result files to be drawn as one model's panel: the
# same model, text, reference and buckets, standard errors from the same bootstrap, and the same `device`
# attribute, which also names the compute precision ("cpu", or "cuda: <GPU> (sm_XY), compute fp32"): a CPU and
# a GPU sweep are two computations.
_SAME_SWEEP_ATTRS = ("model_hash", "tokenization", "reference_policy", "n_positions", "bootstrap_base_block_length",
                     "bootstrap_resamples", "device")


def merge_results(results_list):
    """One result dict from the configurations of several result files of the same model, text, reference,
    buckets and bootstrap (e.g. table 11's and figure 13's sweeps, which hold every configuration of figure
    12 between them). A configuration (policy, window and seed) in more than one file is taken from the
    first, after checking that the others computed the same bucket means (to 1e-12, relative): the same
    computation, not two. Raises ValueError naming the files and the field that differs."""
    if not results_list:
        raise ValueError("merge_results: no result files")
    first = results_list[0]
    for r in results_list[1:]:
        where = f"{first['path']} and {r['path']}"
        for key in _SAME_SWEEP_ATTRS:
            a, b = first["attrs"].get(key), r["attrs"].get(key)
            if a != b:
                raise ValueError(f"{where} are not cells of one model's sweeps: attribute {key} is {a!r} and {b!r}")
        for key in ("books", "text_fnv1a64", "schema_version"):
            if first[key] != r[key]:
                raise ValueError(f"{where} are not cells of one model's sweeps: {key} differ ({first[key]} and {r[key]})")
        for key in ("edges", "bootstrap_block_length"):
            a, b = first[key], r[key]
            if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
                raise ValueError(f"{where} are not cells of one model's sweeps: {key} differ")
    taken, configs, sources = {}, [], []
    for r in results_list:
        sources.append(r["path"])
        for c in r["configs"]:
            info = c["info"]
            key = (info["family"], info["window"], info["seed"])
            if key in taken:
                kept, path = taken[key]
                a, b = np.asarray(kept["bucket_mean"], float), np.asarray(c["bucket_mean"], float)
                if a.shape != b.shape or not np.allclose(a, b, rtol=1e-12, atol=0.0, equal_nan=True):
                    raise ValueError(f"{path} and {r['path']} both hold {c['policy']} with different bucket means: "
                                     f"not the same computation, so not drawn as one panel")
                continue
            taken[key] = (c, r["path"])
            configs.append(c)
    merged = dict(first)
    merged.update(path="+".join(sources), configs=configs, sources=sources,
                  attrs=dict(first["attrs"], merged_from=" + ".join(sources)))
    return merged


def select(results, patterns):
    """The configurations whose policy matches any of the regular expressions (all when none)."""
    if not patterns:
        return results["configs"]
    compiled = []
    for p in patterns:
        try:
            compiled.append(re.compile(p))
        except re.error as e:
            raise ValueError(f"--configs: {p!r} is not a regular expression ({e})") from None
    return [c for c in results["configs"] if any(p.search(c["policy"]) for p in compiled)]


def strip_positions(src, dst):
    """Writes dst: the result file src without its per-position KL (the configs/*/kl datasets, N x books
    floats each, most of a long sweep's size), every statistic, block sum and attribute kept, so that
    load_results, the plots and tables and netCDF readers (xarray) read it as they read src. The dimension
    scales are detached from each kl before it is deleted (a dangling scale reference makes netCDF readers
    fail), then `h5repack` (hdf5-tools) writes the file without the freed space; dst is written atomically
    and must not exist. Raises ValueError for a file that is not a finished result file or has no kl."""
    import pathlib
    import shutil
    import subprocess

    import h5py

    from .files import write_atomically

    src, dst = pathlib.Path(src), pathlib.Path(dst)
    if dst.exists():
        raise FileExistsError(f"{dst} exists: give another output path")
    load_results(src)  # refuses files of another schema or unfinished ones
    if shutil.which("h5repack") is None:
        raise RuntimeError("h5repack not found: install hdf5-tools (scripts/setup.sh does)")
    work = dst.with_name(f".{dst.name}.unpacked")
    shutil.copyfile(src, work)
    try:
        with h5py.File(work, "r+") as f:
            stripped = 0
            for group in f["configs"].values():
                if "kl" not in group:
                    continue
                kl = group["kl"]
                for dim in kl.dims:
                    for scale in list(dim.values()):
                        dim.detach_scale(scale)
                del group["kl"]
                stripped += 1
            if stripped == 0:
                raise ValueError(f"{src}: no configs/*/kl dataset to strip")
            f.attrs["positions_stripped"] = (f"the per-position KL (configs/*/kl) of {stripped} configurations left "
                                             f"out by replayssm_py.results.strip_positions from {src.name}; the "
                                             f"sweep's command_line remakes it")

        def repack(tmp):
            r = subprocess.run(["h5repack", str(work), str(tmp)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"h5repack {work} failed: {r.stderr.strip()}")

        write_atomically(dst, repack)
    finally:
        work.unlink(missing_ok=True)
    return dst
