"""Kimi Linear through the CLI on the golden kimi_linear_tiny (made by scripts/make_goldens.py with
transformers' KimiLinearForCausalLM): `replayssm info` shows the KDA and latent-attention shapes,
`replayssm logits` gives transformers' FP32 log-probabilities (its layer 1 MLP is a mixture of
experts), a short `kl-sweep` runs, and bad MoE fields are refused with exit code 2, naming the file
and the key."""
import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import ROOT, replayssm_binary

MODEL = ROOT / "data" / "models" / "kimi_linear_tiny"


def run(*args):
    return subprocess.run([replayssm_binary(), *map(str, args)], capture_output=True, text=True)


def test_info_shows_kda_latent_attention_and_moe():
    meta = json.loads((MODEL / "golden.json").read_text())
    r = run("info", MODEL)
    assert r.returncode == 0, r.stderr
    for want in ["model_type     kimi_linear", "layers         2: K*",
                 "KDA            1 layers: heads 1 (each its own key head), dk = dv = 128, conv kernel 4",
                 "multi-head latent attention, heads 2, q_lora_rank none, kv_lora_rank 16, qk nope/rope head dims "
                 "16/8 (no positional encoding), v_head_dim 16",
                 "every layer also has an MLP, a mixture of experts in layer 1",
                 "MLP            1 blocks: intermediate 64, SwiGLU",
                 "MoE            1 layers: 8 experts, top 2 from the 2 best of 4 groups, sigmoid scores + correction "
                 "bias, renormalised, scaled by 2.446, experts SwiGLU intermediate 16, shared expert intermediate 16",
                 "separate (lm_head.weight)",
                 f"parameters     {meta['parameters']}"]:
        assert want in r.stdout, (want, r.stdout)


def test_checkpoint_holds_the_reference_values():
    """transformers reading the BF16 checkpoint back gives the golden log-probs: every value the
    reference forward used (the router's correction bias included) is the stored one. Not bit for bit:
    torch's float32 reductions depend on the CPU's vector width and thread count (CI's machine differs
    from the one that made the goldens by ~4e-7 relative), while scaling any one stored tensor by
    1 + 2^-8 (one BF16 step) moves them by 2.8e-3 relative or more, and a missing correction bias by 7
    (both measured on this model), so 1e-5 relative tells the two apart."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.KimiLinearForCausalLM.from_pretrained(MODEL, dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    tokens = torch.from_numpy(np.load(MODEL / "tokens.npy"))[None]
    with torch.no_grad():
        logits = model(input_ids=tokens, use_cache=False).logits[0]
    lp = torch.log_softmax(logits.double(), dim=-1).float().numpy()
    ref = np.load(MODEL / "logprobs.npy")
    rel = np.abs(lp.astype(np.float64) - ref) / np.maximum(1.0, np.abs(ref))
    assert rel.max() <= 1e-5, rel.max()


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


@pytest.mark.parametrize("key,value,expected", [
    ("num_experts_per_token", 9, 'config key "num_experts_per_token" is 9, expected at most num_experts = 8'),
    ("num_expert_group", 3, 'config key "num_expert_group" is 3, expected a divisor of num_experts = 8'),
    ("topk_group", 5, 'config key "topk_group" is 5, expected at most num_expert_group = 4'),
    ("routed_scaling_factor", 0, 'config key "routed_scaling_factor" is 0, expected a finite number in (0, 1e6]'),
    ("num_local_experts", 16, 'config keys "num_experts" (8) and "num_local_experts" (16) name the same field'),
])
def test_bad_moe_fields_are_refused(tmp_path, key, value, expected):
    d = tmp_path / "moe"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(MODEL / f, d / f)
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    r = run("info", d)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert str(d / "config.json") in r.stderr
    assert expected in r.stderr, r.stderr
