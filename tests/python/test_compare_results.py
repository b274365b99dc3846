"""scripts/compare_results.py / replayssm_py.compare on real sweep files of the tiny random Mamba-2
model: a file against itself agrees exactly; against a copy whose per-position KLs are scaled, the
relative difference and z follow the scaling; files of different sweeps are refused."""
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, replayssm_binary

h5py = pytest.importorskip("h5py")
sys.path.insert(0, str(ROOT / "python"))
from replayssm_py.compare import block_z, compare_results  # noqa: E402

MODEL = str(ROOT / "data" / "models" / "mamba2_tiny")
SCRIPT = str(ROOT / "scripts" / "compare_results.py")


def sweep(text_dir, out, length=128):
    r = subprocess.run([replayssm_binary(), "kl-sweep", MODEL, "--text-dir", str(text_dir), "--length", str(length),
                        "--policies", "shared:nvfp4+sr@4,split:nvfp4/fp32@4", "--progress", "off", "--threads", "1",
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def test_a_file_agrees_with_itself(tmp_path, text_dir):
    a = sweep(text_dir, tmp_path / "a.h5")
    for row in compare_results(a, a, block=16):
        assert row["identical"] == 1.0 and row["rel"] == 0.0 and row["z"] == 0.0
        assert row["corr"] == pytest.approx(1.0)
    r = subprocess.run([sys.executable, SCRIPT, str(a), str(a), "--block", "16"], capture_output=True, text=True)
    assert r.returncode == 0 and "largest |z| 0.00" in r.stdout, r.stdout + r.stderr


def test_scaled_copy_is_detected(tmp_path, text_dir):
    a = sweep(text_dir, tmp_path / "a.h5")
    b = tmp_path / "b.h5"
    shutil.copy(a, b)
    with h5py.File(b, "r+") as f:
        for name in f["configs"]:
            f["configs"][name]["kl"][...] = f["configs"][name]["kl"][:] * np.float32(1.5)
    rows = compare_results(a, b, block=16)
    with h5py.File(a, "r") as f:
        for row, name in zip(rows, f["config_order"][:]):
            ka = f["configs"][name]["kl"][:].astype(np.float64)
            diff, se, z = block_z(ka, ka * 1.5, 16)  # the oracle: numpy on the stored values
            assert row["rel"] == pytest.approx(0.5, rel=1e-6)
            assert row["z"] == pytest.approx(z, rel=1e-3) and row["z"] > 4
            assert row["identical"] < 0.5
    r = subprocess.run([sys.executable, SCRIPT, str(a), str(b), "--block", "16"], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr


def test_different_sweeps_are_refused(tmp_path, text_dir):
    a = sweep(text_dir, tmp_path / "a.h5")
    c = sweep(text_dir, tmp_path / "c.h5", length=96)
    with pytest.raises(ValueError, match="not the same sweep"):
        compare_results(a, c, block=16)
    r = subprocess.run([sys.executable, SCRIPT, str(a), str(c)], capture_output=True, text=True)
    assert r.returncode != 0 and "not the same sweep" in r.stderr
