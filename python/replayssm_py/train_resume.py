"""The resume checkpoint of scripts/train_tiny.py --resume-dir DIR (replayssm_py.train runs the loop).

A training split into runs of a few minutes (a GPU lent for minutes at a time, maybe a fresh machine
each run) continues from what the last run saved, bit for bit where torch allows: the weights and the
AdamW state (float32), the sampler's and torch's RNG states, the step, and the per-step log so far.

Files in DIR, all small enough to travel one by one (each at most SHARD_BYTES):

* ``resume.json``                  the manifest, written last (temporary + rename): the commit point of a
                                   save. Format, step, the identity of the training (the arguments that
                                   fix its result and the training text's sha256), the shard names with
                                   their sha256, the optimiser's param_groups, the log so far.
* ``state-<step>-<i>.safetensors`` the tensors: ``param.<name>``, ``opt.<index>.<key>``, ``rng.<name>``.

Once the run that reaches the last step has written --out, the shards are removed and the manifest is
marked ``finished`` (a rerun is refused instead of training again).

A save writes the new shards under new names, then the manifest, then removes the previous save's
shards; a save cut off at any point leaves the previous one readable. Loading checks every shard's
sha256 (a file cut short in transfer is refused, not half-read).

This module needs torch and safetensors only inside save/load; the identity check is plain JSON, so a
rerun with other arguments is refused before torch is imported.
"""
import hashlib
import json
import os
import pathlib

from .files import write_text_atomically

FORMAT = "replayssm-train-resume"
VERSION = 1
MANIFEST = "resume.json"
SHARD_BYTES = 15 * 2 ** 20  # a file that comes back from the GPU machine may have at most 16 MiB


class ResumeError(Exception):
    """The resume folder cannot be used for this run (other arguments, damaged files)."""


def read_manifest(resume_dir):
    """The manifest dict, or None when the folder holds no save."""
    path = pathlib.Path(resume_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ResumeError(f"{path}: not a readable resume manifest ({e})") from e
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise ResumeError(f"{path}: format {m.get('format')!r} version {m.get('version')!r}, expected {FORMAT!r} "
                          f"version {VERSION}")
    return m


def identity_differences(saved, now):
    """['--lr: 0.003 when saved, 0.002 now', ...] for every identity field that differs."""
    out = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key, "(absent)"), now.get(key, "(absent)")
        if a != b:
            out.append(f"{key}: {a} when saved, {b} now")
    return out


def check_identity(manifest, identity, resume_dir):
    """Raises ResumeError naming every difference between the saved training and this one (the keys of
    `identity`; the device type is checked once torch has chosen the device)."""
    diff = identity_differences({k: v for k, v in manifest["identity"].items() if k in identity}, identity)
    if diff:
        raise ResumeError(f"{resume_dir} holds a training with other arguments ({'; '.join(diff)}): give the "
                          "same arguments to continue it, or another --resume-dir to start a new one")


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _shards(tensors, limit):
    """Splits {name: tensor} in order into dicts of at most `limit` bytes (a larger tensor alone)."""
    groups, cur, size = [], {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if cur and size + n > limit:
            groups.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += n
    if cur:
        groups.append(cur)
    return groups


def remove_temporaries(resume_dir):
    """Removes what a save killed half-way left (*.tmp files)."""
    for p in pathlib.Path(resume_dir).glob("*.tmp"):
        p.unlink()


def save(resume_dir, step, identity, model, opt, generators, log_state, torch, moments="fp32"):
    """Writes a save of the training at `step` (steps done). generators: {name: torch.Generator or the
    state tensor}; log_state: JSON-able dict restored by load(). moments 'bf16' stores AdamW's moments
    rounded to bfloat16 (half the optimiser's size; a resumed run then differs from an uninterrupted one)."""
    from safetensors.torch import save_file

    d = pathlib.Path(resume_dir)
    d.mkdir(parents=True, exist_ok=True)
    remove_temporaries(d)
    tensors = {f"param.{n}": p.detach().to("cpu", copy=True).contiguous() for n, p in model.named_parameters()}
    osd = opt.state_dict()
    for index, st in osd["state"].items():
        for key, v in st.items():
            t = v.detach().to("cpu", copy=True)
            if moments == "bf16" and key in ("exp_avg", "exp_avg_sq"):
                t = t.to(torch.bfloat16)
            tensors[f"opt.{index}.{key}"] = t.contiguous()
    for name, g in generators.items():
        state = g.get_state() if hasattr(g, "get_state") else g
        tensors[f"rng.{name}"] = state.to("cpu", copy=True).contiguous()
    names = []
    for i, group in enumerate(_shards(tensors, SHARD_BYTES)):
        name = f"state-{step:08d}-{i}.safetensors"
        tmp = d / (name + ".tmp")
        save_file(group, str(tmp))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, d / name)
        names.append({"file": name, "sha256": _sha256(d / name), "bytes": (d / name).stat().st_size})
    manifest = {"format": FORMAT, "version": VERSION, "step": step, "identity": identity,
                "moments": moments, "shards": names,
                "param_groups": [{k: v for k, v in g.items()} for g in osd["param_groups"]],
                "log": log_state}
    write_text_atomically(d / MANIFEST, json.dumps(manifest) + "\n")
    keep = {s["file"] for s in names}
    for p in d.glob("state-*.safetensors"):
        if p.name not in keep:
            p.unlink()
    return sum(s["bytes"] for s in names)


def mark_finished(resume_dir, step, out):
    """After the last step's checkpoint is in --out: the manifest keeps the identity and the log, marked
    finished, and the shards are removed (a rerun is refused rather than repeated)."""
    d = pathlib.Path(resume_dir)
    m = read_manifest(d)
    m.update(finished={"step": step, "out": out}, shards=[])
    write_text_atomically(d / MANIFEST, json.dumps(m) + "\n")
    for p in d.glob("state-*.safetensors"):
        p.unlink()


def load(resume_dir, manifest, model, opt, torch, device):
    """Restores the weights and the optimiser in place; returns {rng name: state tensor (CPU)}."""
    from safetensors.torch import load_file

    d = pathlib.Path(resume_dir)
    tensors = {}
    for s in manifest["shards"]:
        p = d / s["file"]
        if not p.exists():
            raise ResumeError(f"{p}: named by {d / MANIFEST} but missing")
        if _sha256(p) != s["sha256"]:
            raise ResumeError(f"{p}: sha256 differs from the one {d / MANIFEST} records (cut short or changed)")
        tensors.update(load_file(str(p)))
    params = dict(model.named_parameters())
    saved = {k[len("param."):] for k in tensors if k.startswith("param.")}
    if saved != set(params):
        raise ResumeError(f"{d}: the saved parameters ({len(saved)}) are not this model's ({len(params)}): "
                          f"{sorted(saved ^ set(params))[:5]}")
    with torch.no_grad():
        for n, p in params.items():
            src = tensors[f"param.{n}"]
            if src.shape != p.shape or src.dtype != p.dtype:
                raise ResumeError(f"{d}: parameter {n} is {tuple(src.shape)} {src.dtype}, the model's "
                                  f"{tuple(p.shape)} {p.dtype}")
            p.copy_(src)
    state = {}
    for k, t in tensors.items():
        if k.startswith("opt."):
            _, index, key = k.split(".", 2)
            if key in ("exp_avg", "exp_avg_sq"):
                t = t.to(torch.float32)
            state.setdefault(int(index), {})[key] = t
    groups = opt.state_dict()["param_groups"]
    for g, sg in zip(groups, manifest["param_groups"]):
        if g["params"] != sg["params"]:
            raise ResumeError(f"{d}: the optimiser's parameter groups differ from the saved ones")
    opt.load_state_dict({"state": state, "param_groups": manifest["param_groups"]})
    # load_state_dict keeps the saved flags; this machine's choice of fused kernels wins
    for g, mine in zip(opt.param_groups, groups):
        for flag in ("fused", "foreach"):
            if flag in mine:
                g[flag] = mine[flag]
    return {k[len("rng."):]: t for k, t in tensors.items() if k.startswith("rng.")}
