"""Kimi Linear through the CLI on the golden kimi_linear_tiny (made by scripts/make_goldens.py with
transformers' KimiLinearForCausalLM): `replayssm info` shows the KDA and latent-attention shapes,
`replayssm logits` gives transformers' FP32 log-probabilities, a short `kl-sweep` runs, and a
config with MoE layers is refused with exit code 2, naming the file and the key."""
import json
import random
import shutil
import subprocess

import numpy as np
import pytest

from conftest import ROOT, replayssm_binary

MODEL = ROOT / "data" / "models" / "kimi_linear_tiny"
SEED = 20261130
WORDS = "the of and to a in that is was he for it with as his on be at by night day came dark".split()


def run(*args):
    return subprocess.run([replayssm_binary(), *map(str, args)], capture_output=True, text=True)


@pytest.fixture
def text_dir(tmp_path):
    """Two books of about 3 KB of words (fixed seed)."""
    d = tmp_path / "books"
    d.mkdir()
    rng = random.Random(SEED)
    for name in ("a", "b"):
        (d / f"{name}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(700)) + "\n")
    return d


def test_info_shows_kda_and_latent_attention():
    meta = json.loads((MODEL / "golden.json").read_text())
    r = run("info", MODEL)
    assert r.returncode == 0, r.stderr
    for want in ["model_type     kimi_linear", "layers         2: K*",
                 "KDA            1 layers: heads 1 (each its own key head), dk = dv = 128, conv kernel 4",
                 "multi-head latent attention, heads 2, q_lora_rank none, kv_lora_rank 16, qk nope/rope head dims "
                 "16/8 (no positional encoding), v_head_dim 16",
                 "MLP            2 blocks: intermediate 64, SwiGLU", "separate (lm_head.weight)",
                 f"parameters     {meta['parameters']}"]:
        assert want in r.stdout, (want, r.stdout)


def test_logits_match_transformers_and_policies_change_them(tmp_path):
    ref = np.load(MODEL / "logprobs.npy")
    r = run("logits", MODEL, "--tokens", MODEL / "tokens.npy", "--out", tmp_path / "lp.npy", "--threads", 2)
    assert r.returncode == 0, r.stderr
    lp = np.load(tmp_path / "lp.npy")
    rel = np.abs(lp.astype(np.float64) - ref) / np.maximum(1.0, np.abs(ref))
    assert rel.max() <= 1e-4
    r = run("logits", MODEL, "--tokens", MODEL / "tokens.npy", "--out", tmp_path / "nv.npy", "--policy",
            "split:nvfp4+rtn/fp32@16")
    assert r.returncode == 0, r.stderr
    assert np.abs(np.load(tmp_path / "nv.npy") - lp).max() > 1e-3


def test_short_kl_sweep_runs(tmp_path, text_dir):
    h5py = pytest.importorskip("h5py")
    out = tmp_path / "res.h5"
    r = run("kl-sweep", MODEL, "--text-dir", text_dir, "--length", 64, "--policies", "conv:fp32,shared:nvfp4+sr",
            "--windows", 4, "--chunk", 16, "--threads", 1, "--progress", "off", "--out", out)
    assert r.returncode == 0, r.stderr
    assert f"results: {out}" in r.stdout
    with h5py.File(out, "r") as f:
        assert f.attrs["n_positions"] == 64
        exact = f["configs"]["conv:fp32"]["kl"][:]
        assert exact.shape == (2, 64) and (exact == 0).all()
        lossy = f["configs"]["shared:nvfp4+sr@4"]["kl"][:]
        assert np.isfinite(lossy).all() and (lossy >= 0).all() and lossy.max() > 0


def test_moe_layers_are_refused(tmp_path):
    d = tmp_path / "moe"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(MODEL / f, d / f)
    cfg = json.loads((d / "config.json").read_text())
    cfg["mlp_layer_types"] = ["dense", "sparse"]
    (d / "config.json").write_text(json.dumps(cfg))
    r = run("info", d)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert str(d / "config.json") in r.stderr
    assert "Kimi Linear MoE layers: not supported yet (dense layers only)" in r.stderr
    assert "config key \"mlp_layer_types\"" in r.stderr
