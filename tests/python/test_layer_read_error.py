"""experiments/layer_read_error.sh (issue 11): one SSM layer at a time in a low-precision policy. Oracle: the
per-position KL that `replayssm kl-sweep` computes and stores in C++ for the same model, book, length and
policy, against the script's own KL from `replayssm logits` log-probabilities (numpy, float64)."""
import importlib.util
import pathlib
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT, checkout_env, replayssm_binary

SCRIPT = ROOT / "experiments" / "layer_read_error.sh"
TEXT_DIR = ROOT.parent / "shared" / "data" / "pg19" / "test"


def test_layer_read_error_matches_kl_sweep(tmp_path):
    exe = pathlib.Path(replayssm_binary())
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    if not TEXT_DIR.is_dir():
        pytest.skip(f"{TEXT_DIR} not present")
    model, n = ROOT / "data" / "models" / "nemotron_h_tiny", 512
    env = checkout_env(BIN=str(exe), REPLAYSSM_TEXT_DIR=str(TEXT_DIR))
    r = subprocess.run([str(SCRIPT), str(model), str(n), "split:nvfp4+rtn/fp32"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if f and (f[0] == "all" or f[0].startswith("layer")) and len(f) == 6:
            rows[(f[0], int(f[1]))] = np.array([float(x) for x in f[2:]])
    # the SSM layers of nemotron_h_tiny (pattern M*-M-*): blocks 0 and 3
    assert set(rows) == {(w, L) for w in ("all", "layer0", "layer3") for L in (4, 64)}
    assert all(np.all(np.isfinite(v)) and np.all(v >= 0) for v in rows.values())
    out = tmp_path / "sweep.h5"
    s = subprocess.run([str(exe), "kl-sweep", str(model), "--text-dir", str(TEXT_DIR), "--books", "1", "--length",
                        str(n), "--policies", "split:nvfp4+rtn/fp32@4,split:nvfp4+rtn/fp32@64", "--device", "cpu",
                        "--out", str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert s.returncode == 0, s.stderr
    cuts = [0, n // 16, n // 4, n]
    with h5py.File(out) as f:
        for g in f["configs"].values():
            L = int(g.attrs["policy"].rsplit("@", 1)[1])
            kl = g["kl"][0].astype(np.float64)
            means = [kl[a:b].mean() for a, b in zip(cuts, cuts[1:])]
            np.testing.assert_allclose(rows[("all", L)][:3], means, rtol=2e-3, atol=1e-12)
            assert rows[("all", L)][3] == pytest.approx(np.median(kl[cuts[2]:]), rel=2e-3, abs=1e-12)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="needs torch and transformers (the train extra)")
def test_head_read_error_reconstructs_the_toolkits_split_policy():
    """experiments/head_read_error.py rebuilds split:nvfp4+rtn/fp32@L on one Mamba-2 block from transformers'
    forward and replayssm_py.formats' NVFP4 (no C++), and its --check runs `replayssm logits --layer-policy` on
    the same input: the per-position KL of the two must agree (correlation and mean) at two windows."""
    exe = pathlib.Path(replayssm_binary())
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    if not TEXT_DIR.is_dir():
        pytest.skip(f"{TEXT_DIR} not present")
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "head_read_error.py"),
                        str(ROOT / "data" / "models" / "nemotron_h_tiny"), "--block", "0", "--positions", "400",
                        "--windows", "4,16", "--text-dir", str(TEXT_DIR), "--check", str(exe)],
                       capture_output=True, text=True, env=checkout_env(), cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stderr
    rows = [l for l in r.stdout.splitlines() if "all heads:" in l]
    assert len(rows) == 2
    for line in rows:
        ours = float(line.split("all heads:")[1].split()[0])
        theirs = float(line.split("replayssm:")[1].split(",")[0])
        corr = float(line.rsplit("correlation", 1)[1])
        assert ours > 0 and ours == pytest.approx(theirs, rel=1e-3), line
        assert corr >= 0.999, line
    heads = [l for l in r.stdout.splitlines() if "alone:" in l]
    assert len(heads) == 2 * 8  # nemotron_h_tiny: 8 value heads per Mamba-2 block (mamba_num_heads)
