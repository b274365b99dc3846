"""`replayssm info`, `logits` and a short `kl-sweep` on the mixture-of-experts goldens
(data/models/{nemotron_h_moe,qwen3_5_moe}_tiny, made by scripts/make_goldens.py with transformers'
own classes): the MoE summary, the memory statement, FP32 log-probs against transformers', and a
sweep that runs end to end."""
import json
import subprocess

import h5py
import numpy as np
import pytest

from conftest import ROOT, replayssm_binary

MODELS = ROOT / "data" / "models"
EXPECTED = {
    "nemotron_h_moe_tiny": ["layers         5: ME*-E",
                            "MoE            2 layers: 8 experts, top 3 from the 2 best of 4 groups, sigmoid scores "
                            "+ correction bias, renormalised, scaled by 2.5, experts relu^2 intermediate 16, "
                            "shared expert intermediate 24"],
    "qwen3_5_moe_tiny": ["model_type     qwen3_5_moe_text", "layers         3: G*G",
                         "every layer also has a mixture-of-experts MLP",
                         "MoE            3 layers: 8 experts, top 3, softmax scores, renormalised, experts SwiGLU "
                         "intermediate 8, shared expert intermediate 16 (sigmoid-gated)"],
}


def run(args, check=True):
    return subprocess.run([replayssm_binary(), *map(str, args)], capture_output=True, text=True, check=check)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_info_describes_the_moe_layers_and_the_memory(name):
    out = run(["info", MODELS / name]).stdout
    for line in EXPECTED[name]:
        assert line in out, (line, out)
    assert "parameters as stored, read from the memory-mapped checkpoint" in out
    assert "N x (3 x hidden + W)" in out and "N = 131072" in out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_logits_match_transformers(name, tmp_path):
    d = MODELS / name
    out = tmp_path / "lp.npy"
    run(["logits", d, "--tokens", d / "tokens.npy", "--out", out])
    got, ref = np.load(out), np.load(d / "logprobs.npy")
    assert got.shape == ref.shape
    assert np.all(np.abs(got - ref) <= 1e-4 * (1 + np.abs(ref)))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_short_kl_sweep_runs(name, tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    # two small books, bytes as tokens (vocab 256)
    rng = np.random.default_rng(7)
    words = ["the", "sea", "ship", "wind", "night", "light", "stone", "river", "old", "came"]
    for i in range(2):
        (text / f"book{i}.txt").write_text(" ".join(rng.choice(words, 400)) + "\n")
    out = tmp_path / "r.h5"
    r = run(["kl-sweep", MODELS / name, "--text-dir", text, "--length", 64,
             "--policies", "conv:fp16+rtn,shared:nvfp4+rtn@16", "--windows", "16", "--out", out], check=False)
    assert r.returncode == 0, r.stderr
    with h5py.File(out, "r") as f:
        fp16 = float(np.asarray(f["configs/conv:fp16+rtn/aggregate/mean_kl"]))
        nvfp4 = float(np.asarray(f["configs/shared:nvfp4+rtn@16/aggregate/mean_kl"]))
    # a coarser state format moves the distribution further: both measurable, NVFP4 well above FP16
    assert 0 < fp16 < nvfp4, (fp16, nvfp4)
