"""`replayssm info` and `replayssm logits` on the golden tiny checkpoints (data/models/, made by
scripts/make_goldens.py with transformers' own classes): architecture summary, and the FP32
teacher-forced log-probabilities against transformers'."""
import json
import subprocess

import numpy as np
import pytest

from conftest import ROOT, replayssm_binary

MODELS = ROOT / "data" / "models"
NAMES = ["mamba2_tiny", "nemotron_h_tiny", "qwen3_5_tiny"]
EXPECTED = {
    "mamba2_tiny": ["model_type     mamba2", "layers         3: MMM",
                    "key heads (n_groups) 2, value heads 8, dk (state_size) 128, dv (head_dim) 16"],
    "nemotron_h_tiny": ["model_type     nemotron_h", "layers         6: M*-M-*",
                        "key heads (n_groups) 2, value heads 8, dk (state_size) 128, dv (head_dim) 16",
                        "heads 4, kv heads 2, head_dim 16, no positional encoding", "relu^2"],
    "qwen3_5_tiny": ["model_type     qwen3_5_text", "layers         5: GG*G*",
                     "key heads 2, value heads 4, dk 128, dv 16", "RoPE on 8 dims", "SwiGLU",
                     "tied to the embeddings"],
}


def run(args, check=True):
    return subprocess.run([replayssm_binary(), *map(str, args)], capture_output=True, text=True, check=check)


@pytest.mark.parametrize("name", NAMES)
def test_info(name):
    meta = json.loads((MODELS / name / "golden.json").read_text())
    out = run(["info", MODELS / name]).stdout
    for want in EXPECTED[name]:
        assert want in out, (want, out)
    assert f"parameters     {meta['parameters']}" in out


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(tmp_path, name):
    d = MODELS / name
    meta = json.loads((d / "golden.json").read_text())
    tokens = np.load(d / "tokens.npy")
    np.save(tmp_path / "ids32.npy", tokens.astype(np.int32))
    out = tmp_path / "lp.npy"
    r = run(["logits", d, "--tokens", tmp_path / "ids32.npy", "--out", out, "--threads", 2, "--chunk", 100])
    assert "tokens/s" in r.stderr
    lp = np.load(out)
    ref = np.load(d / "logprobs.npy")
    assert lp.dtype == np.float32 and lp.shape == ref.shape == (meta["n_tokens"], meta["vocab_size"])
    rel = np.abs(lp.astype(np.float64) - ref) / np.maximum(1.0, np.abs(ref))
    assert rel.max() <= 1e-4, f"{name} vs transformers {meta['transformers_version']}: {rel.max()}"
    assert not any(p.name.startswith(".lp.npy.tmp") for p in tmp_path.iterdir())

    # A lower-precision state changes them; raw logits are log-softmax consistent.
    r = run(["logits", d, "--tokens", d / "tokens.npy", "--out", tmp_path / "nv.npy", "--policy",
             "shared:nvfp4+rtn@16"])
    assert np.abs(np.load(tmp_path / "nv.npy") - lp).max() > 1e-3
    run(["logits", d, "--tokens", d / "tokens.npy", "--out", tmp_path / "raw.npy", "--raw"])
    raw = np.load(tmp_path / "raw.npy").astype(np.float64)
    lse = raw.max(1, keepdims=True) + np.log(np.exp(raw - raw.max(1, keepdims=True)).sum(1, keepdims=True))
    assert np.abs(raw - lse - lp).max() < 1e-4


def test_logits_errors(tmp_path):
    d = MODELS / "mamba2_tiny"
    np.save(tmp_path / "f.npy", np.zeros(4, np.float32))
    r = run(["logits", d, "--tokens", tmp_path / "f.npy", "--out", tmp_path / "o.npy"], check=False)
    assert r.returncode != 0 and "f.npy" in r.stderr and "expected int32" in r.stderr
    np.save(tmp_path / "big.npy", np.array([1, 2, 999], np.int64))
    r = run(["logits", d, "--tokens", tmp_path / "big.npy", "--out", tmp_path / "o.npy"], check=False)
    assert r.returncode != 0 and "token 999 at position 2" in r.stderr
    assert not (tmp_path / "o.npy").exists()
    np.save(tmp_path / "ok.npy", np.array([1, 2, 3], np.int64))
    r = run(["logits", d, "--tokens", tmp_path / "ok.npy", "--out", tmp_path / "o.npy", "--policy", "bogus"], check=False)
    assert r.returncode != 0 and "bogus" in r.stderr
    r = run(["logits", d, "--tokens", tmp_path / "ok.npy", "--out", tmp_path / "o.npy", "--layer-policy", "9=conv:fp32"],
            check=False)
    assert r.returncode != 0 and "layer must be an index in [0, 3)" in r.stderr
    r = run(["info", tmp_path], check=False)
    assert r.returncode != 0 and "missing config.json" in r.stderr
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    r = run(["info", tmp_path], check=False)
    assert r.returncode != 0 and 'unknown model_type "gpt2"' in r.stderr and "config.json" in r.stderr
