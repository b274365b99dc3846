"""Expert weights read lazily from the memory-mapped checkpoint (issue 12): quantized MoE checkpoints
(FP8 block-scaled, NVFP4) dequantize per expert during the forward bit for bit as the independent numpy
writer does; a synthetic 64-expert checkpoint runs `replayssm logits` with a peak resident set far below
its float32 expert size (eager conversion holds all of it); `info --length N` estimates the memory for
the user's N and refuses a bad N."""
import json
import shutil
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import ROOT, replayssm_binary
from replayssm_py import quantized_checkpoints as qc

MODELS = ROOT / "data" / "models"


def run(args, check=True):
    return subprocess.run([replayssm_binary(), *map(str, args)], capture_output=True, text=True, check=check)


def logprobs(model_dir, tokens, out, threads=1):
    run(["logits", model_dir, "--tokens", tokens, "--out", out, "--threads", threads])
    return np.load(out)


# NVFP4 needs in-dimensions in whole groups of 16: Qwen3.5-MoE's down_proj [32, 8] and Nemotron-H's
# shared expert down_proj [32, 24] stay unquantized (excluded modules, as ModelOpt leaves them).
CASES = [("nemotron_h_moe_tiny", "fp8", (128, 128), ("lm_head",)), ("nemotron_h_moe_tiny", "fp8", (16, 48), ("lm_head",)),
         ("nemotron_h_moe_tiny", "nvfp4", None, ("lm_head", "*.shared_experts.down_proj")), ("qwen3_5_moe_tiny", "fp8", (16, 48), ("lm_head",)),
         ("qwen3_5_moe_tiny", "nvfp4", None, ("lm_head", "*.down_proj"))]


@pytest.mark.parametrize("model,fmt,block,exclude", CASES)
def test_quantized_moe_dequantizes_per_expert_bit_equal_to_numpy(tmp_path, model, fmt, block, exclude):
    src = MODELS / model
    deq = qc.write_quantized_checkpoint(src, tmp_path / "q", fmt, block=block or (128, 128), exclude=exclude,
                                        dequantized_out=tmp_path / "deq")
    experts = [n for n in deq if ".experts." in n]
    assert len(experts) >= 16, sorted(deq)
    tokens = src / "tokens.npy"
    for threads in (1, 3):  # experts dequantized by several threads at once
        got = logprobs(tmp_path / "q", tokens, tmp_path / f"q{threads}.npy", threads)
        want = logprobs(tmp_path / "deq", tokens, tmp_path / f"deq{threads}.npy", threads)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.abs(got - np.load(src / "logprobs.npy")).max() > 1e-3  # the quantization changed the model
    info = run(["info", tmp_path / "q"]).stdout
    assert f"{len(deq)} matrices dequantized to FP32" in info
    assert "read from the memory-mapped checkpoint" in info


def synthetic_moe(out, n_experts=64, intermediate=8192, dtype=np.float16):
    """qwen3_5_moe_tiny's layers with N_EXPERTS experts of INTERMEDIATE width (3 x 8192 x 32 F16 =
    1.5 MiB each), random weights (seed fixed)."""
    src = MODELS / "qwen3_5_moe_tiny"
    config = json.loads((src / "config.json").read_text())
    config.update(num_experts=n_experts, moe_intermediate_size=intermediate)
    tensors = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(20261212)
    hidden = config["hidden_size"]
    new = {}
    for name, t in tensors.items():
        if ".experts." in name:
            continue
        if name.endswith("mlp.gate.weight"):
            t = rng.standard_normal((n_experts, hidden), dtype=np.float32)
        new[name] = t
    for layer in range(config["num_hidden_layers"]):
        for e in range(n_experts):
            p = f"model.layers.{layer}.mlp.experts.{e}."
            for proj, shape in (("gate_proj", (intermediate, hidden)), ("up_proj", (intermediate, hidden)),
                                ("down_proj", (hidden, intermediate))):
                new[p + proj + ".weight"] = (rng.standard_normal(shape, dtype=np.float32) * 0.05).astype(dtype)
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    save_file(new, str(out / "model.safetensors"))
    expert_elements = config["num_hidden_layers"] * n_experts * 3 * intermediate * hidden
    return expert_elements


def peak_rss_bytes(args):
    """Runs the CLI under /usr/bin/time and returns its peak resident set. (The rusage of a child forked
    from this process would count the pages it shared with this large process before exec.)"""
    if not shutil.which("/usr/bin/time"):
        pytest.skip("/usr/bin/time is not installed (GNU time measures the peak resident set)")
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kib %M", replayssm_binary(), *map(str, args)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return int(r.stderr.strip().splitlines()[-1].split()[1]) * 1024


def test_synthetic_large_moe_runs_in_a_fraction_of_its_float32_size(tmp_path):
    expert_elements = synthetic_moe(tmp_path / "m")
    fp32_experts = 4 * expert_elements  # what converting every expert at load would hold (~288 MiB)
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.array([5, 77, 130, 201], np.int64))  # 4 positions x top 3: at most 12 of 64 experts a layer
    rss = peak_rss_bytes(["logits", tmp_path / "m", "--tokens", tokens, "--out", tmp_path / "lp.npy", "--threads", 2])
    print(f"peak RSS {rss / 2**20:.1f} MiB; experts as float32 {fp32_experts / 2**20:.1f} MiB, "
          f"as stored {fp32_experts / 2 / 2**20:.1f} MiB")
    assert rss < 0.3 * fp32_experts, (rss, fp32_experts)
    lp = np.load(tmp_path / "lp.npy")
    assert lp.shape == (4, 256) and np.isfinite(lp).all()
    # The same experts stored as float32 (F16 widened exactly): the same log-probs, bit for bit.
    f32 = tmp_path / "f32"
    f32.mkdir()
    (f32 / "config.json").write_text((tmp_path / "m" / "config.json").read_text())
    t = load_file(str(tmp_path / "m" / "model.safetensors"))
    save_file({n: v.astype(np.float32) for n, v in t.items()}, str(f32 / "model.safetensors"))
    del t
    same = logprobs(f32, tokens, tmp_path / "f32.npy", threads=3)
    assert np.array_equal(same.view(np.uint32), lp.view(np.uint32))
    # info: experts as stored (F16) counted once, not as float32
    info = run(["info", tmp_path / "m", "--length", 4, "--threads", 2]).stdout
    assert f"+ experts {fp32_experts / 2 / 2**20:.2f} MiB ({expert_elements} parameters as stored" in info
    assert "N =      4:" in info


@pytest.mark.parametrize("bad", ["0", "-3", "1099511627777", "12x", "", "1e3"])
def test_info_length_is_validated(bad):
    r = run(["info", MODELS / "qwen3_5_moe_tiny", "--length", bad], check=False)
    assert r.returncode == 2
    assert f"info: --length '{bad}' is not a positive integer up to 2^40 = 1099511627776" in r.stderr


def test_info_length_estimates_the_users_n():
    out = run(["info", MODELS / "nemotron_h_moe_tiny", "--length", 777, "--threads", 1]).stdout
    assert "N =    777:" in out and "N =   4096" not in out
    top = run(["info", MODELS / "nemotron_h_moe_tiny", "--length", 2 ** 40]).stdout
    assert f"N = {2 ** 40}:" in top
