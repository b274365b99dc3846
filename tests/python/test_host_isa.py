"""The CPU reference built for the machine's vector units (REPLAYSSM_HOST_ISA=native, the default)
must agree with the portable x86-64 baseline build to FP32 rounding.

The two builds sum in different orders (Eigen's packet width, FMA), so they are not bit-identical;
both must stay as close to each other as each is to transformers' FP32 forward (the goldens are
matched to 1e-5 relative, tests/model/test_model_goldens.cpp). The portable twin `replayssm-portable`
is built beside `replayssm` whenever the ISA is not portable; without it this test is skipped with
the reason.
"""
import os
import pathlib
import subprocess

import numpy as np
import pytest

from conftest import ROOT, replayssm_binary

MODELS = ["mamba2_tiny", "nemotron_h_tiny", "qwen3_5_tiny", "tiny_mamba2", "tiny_qwen3_5"]
# Relative to the largest |log-probability| of the sequence: the goldens' FP32 tolerance.
RTOL = 1e-5


def portable_binary():
    return pathlib.Path(replayssm_binary()).with_name("replayssm-portable")


def run_logits(binary, model, tokens, out, policy):
    subprocess.run([str(binary), "logits", str(model), "--tokens", str(tokens), "--out", str(out),
                    "--policy", policy], check=True, capture_output=True, text=True)
    return np.load(out)


def tokens_for(model_dir, tmp_path):
    golden = model_dir / "tokens.npy"
    if golden.exists():
        return golden
    # Trained byte-level models: a fixed slice of bytes of the repository's README, fresh per model.
    ids = np.frombuffer((ROOT / "README.md").read_bytes()[:600], dtype=np.uint8).astype(np.int32)
    path = tmp_path / "tokens.npy"
    np.save(path, ids)
    return path


@pytest.mark.parametrize("name", MODELS)
def test_native_build_within_fp32_rounding_of_portable(name, tmp_path):
    portable = portable_binary()
    if not portable.exists():
        pytest.skip(f"{portable} not built (REPLAYSSM_HOST_ISA=portable: nothing to compare)")
    model = ROOT / "data" / "models" / name
    tokens = tokens_for(model, tmp_path)
    native = run_logits(replayssm_binary(), model, tokens, tmp_path / "native.npy", "conv:fp32")
    base = run_logits(portable, model, tokens, tmp_path / "portable.npy", "conv:fp32")
    assert native.shape == base.shape and native.ndim == 2 and native.shape[0] > 100
    assert np.isfinite(native).all() and np.isfinite(base).all()
    scale = float(np.max(np.abs(base)))
    assert scale > 1.0  # log-probabilities of a real vocabulary, not zeros
    diff = float(np.max(np.abs(native.astype(np.float64) - base.astype(np.float64))))
    assert diff <= RTOL * scale, f"{name}: max |native - portable| = {diff:.3g} > {RTOL} x {scale:.3g}"


def test_versions_record_the_isa():
    portable = portable_binary()
    if not portable.exists():
        pytest.skip(f"{portable} not built (REPLAYSSM_HOST_ISA=portable)")
    native = subprocess.run([replayssm_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    base = subprocess.run([str(portable), "--version"], capture_output=True, text=True, check=True).stdout
    assert "host ISA portable" in base
    assert "host ISA portable" not in native and "host ISA" in native
