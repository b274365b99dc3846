"""`replayssm quantize` end to end, against the independent numpy + ml_dtypes implementation
in scripts/make_format_goldens.py, on fresh random tensors (fixed, recorded seeds)."""
import subprocess

import numpy as np
import pytest

import make_format_goldens as g
from conftest import replayssm_binary

SEED = 20261130


def run(args, check=True):
    return subprocess.run([replayssm_binary(), *args], capture_output=True, text=True, check=check)


def expected(fmt, x, rounding, seed, stream):
    if fmt == "nvfp4":
        return g.quantize_nvfp4(x, rounding, seed, stream)["decoded"].reshape(x.shape)
    if fmt == "fp8b128":
        return g.quantize_fp8b128(x, rounding, seed, stream)["decoded"].reshape(x.shape)
    codes = g.encode(fmt, x.reshape(-1), rounding, seed, stream)
    return g.FORMATS[fmt].decode(codes).astype(np.float32).reshape(x.shape)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8b128", "e4m3", "e2m1", "fp16", "bf16"])
@pytest.mark.parametrize("rounding", ["rtn", "sr"])
def test_quantize_matches_independent_implementation(tmp_path, fmt, rounding):
    rng = np.random.default_rng([SEED, hash((fmt, rounding)) % 2**31])
    x = (rng.standard_normal((6, 256)) * np.exp(rng.uniform(-8, 8, (6, 1)))).astype(np.float32)
    x[0, 3] = -0.0
    np.save(tmp_path / "in.npy", x)
    seed, stream = int(rng.integers(2**63)), int(rng.integers(2**40))
    run(["quantize", "--format", fmt, "--rounding", rounding, "--seed", str(seed), "--stream", str(stream),
         str(tmp_path / "in.npy"), str(tmp_path / "out.npy")])
    y = np.load(tmp_path / "out.npy")
    assert y.dtype == np.float32 and y.shape == x.shape
    want = expected(fmt, x, rounding, seed, stream)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))


def test_codes_and_scales_outputs(tmp_path):
    x = np.random.default_rng(SEED + 1).standard_normal((4, 64)).astype(np.float32)
    np.save(tmp_path / "in.npy", x)
    run(["quantize", "--format", "nvfp4", "--codes", str(tmp_path / "c.npy"), "--scales", str(tmp_path / "s.npy"),
         "--tensor-scale", str(tmp_path / "t.npy"), str(tmp_path / "in.npy"), str(tmp_path / "out.npy")])
    ref = g.quantize_nvfp4(x, "rtn")
    assert np.array_equal(np.load(tmp_path / "c.npy").reshape(-1), ref["codes"].astype(np.uint8))
    assert np.array_equal(np.load(tmp_path / "s.npy").reshape(-1), ref["block_scales"].astype(np.uint8))
    assert np.load(tmp_path / "t.npy").view(np.uint32)[0] == ref["tensor_scale_bits"]


def test_bad_inputs_give_clear_errors(tmp_path):
    np.save(tmp_path / "f64.npy", np.zeros((2, 32)))
    r = run(["quantize", str(tmp_path / "f64.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode != 0 and "f64.npy" in r.stderr and "expected float32" in r.stderr

    np.save(tmp_path / "odd.npy", np.ones((2, 40), np.float32))
    r = run(["quantize", "--format", "nvfp4", str(tmp_path / "odd.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode != 0 and "odd.npy" in r.stderr and "multiple of 16" in r.stderr

    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    r = run(["quantize", str(tmp_path / "junk.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode != 0 and "not a .npy file" in r.stderr

    r = run(["quantize", "--format", "fp6", str(tmp_path / "odd.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode != 0 and "expected one of" in r.stderr


def test_version_and_formats_self_check():
    r = run(["--version"])
    assert "git" in r.stdout
    r = run(["formats"])
    assert "All format checks passed." in r.stdout
