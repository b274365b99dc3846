"""Reading `replayssm kl-sweep` result files (HDF5 schema "replayssm-kl-sweep", version 1, in
docs/KL_SWEEP.md and src/io/hdf5_results.h) into plain Python and numpy objects, and naming the
precision policies they hold."""
import json
import re

import numpy as np

SCHEMA = "replayssm-kl-sweep"
SCHEMA_VERSION = 1


def _s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def _attr(v):
    if isinstance(v, (bytes, str)):
        return _s(v)
    return v.item() if hasattr(v, "item") else v


def load_results(path):
    """Reads a result file.

    Returns a dict with: path, attrs (root attributes), edges (int64 [K+1]), books (names),
    text_fnv1a64 (per book, the stripped-text hash), n_positions, configs: a list in sweep order of
    dicts with name (group), policy, config (parsed JSON), info (parse_policy), and the aggregate and
    per-book arrays (kl itself is not loaded: f["configs"][name]["kl"]).
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
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version}, this reader knows {SCHEMA_VERSION}")
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
        c.update({k: convert(_need(a, k, path)[()]) for k, convert in _AGGREGATE_SCALARS.items()})
        c.update({f"book_{k}": _need(g, k, path)[:] for k in _PER_BOOK_ARRAYS})
        configs.append(c)
    return {"path": str(path), "attrs": attrs, "edges": edges, "books": books, "text_fnv1a64": hashes,
            "n_positions": int(attrs.get("n_positions", edges[-1])), "configs": configs}


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
