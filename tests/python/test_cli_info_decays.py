"""`replayssm info MODEL --decays --text-dir DIR` (issue 11): the decay spectrum's JSON is consistent
with itself, and its bits per byte equal those computed in numpy from `replayssm logits` (the
forward's other entry point) on the same bytes."""
import json
import math
import subprocess

import numpy as np
import pytest

from conftest import ROOT, replayssm_binary

MODEL = ROOT / "data" / "models" / "mamba2_tiny"


def run(*args):
    return subprocess.run([replayssm_binary(), *map(str, args)], capture_output=True, text=True)


def test_spectrum_and_bits_per_byte(text_dir, tmp_path):
    n = 300
    out = tmp_path / "decays.json"
    r = run("info", MODEL, "--decays", "--text-dir", text_dir, "--length", n, "--books", 2, "--windows", "4,16",
            "--json", out, "--threads", 2)
    assert r.returncode == 0, r.stderr
    assert "heads with memory >= 1000 tokens" in r.stdout
    j = json.loads(out.read_text())
    heads = j["heads"]
    assert len(heads) == 3 * 8  # mamba2_tiny: 3 layers x 8 heads
    assert j["summary"]["heads"] == len(heads)
    assert sum(j["summary"]["heads_per_decade"]) == len(heads)
    bins = len(j["histogram"]["bin_edges"])
    for h in heads:
        assert h["tokens"] == 2 * n
        assert 0 < h["min_alpha"] <= h["mean_alpha"] <= h["max_alpha"] < 1
        assert h["memory_tokens"] == pytest.approx(1 / (1 - h["mean_alpha"]), rel=1e-12)
        assert len(h["alpha_histogram"]) == bins and sum(h["alpha_histogram"]) == 2 * n
        for g in h["gamma"]:
            assert g["windows_counted"] == 2 * (n // g["L"])
            assert sum(g["histogram"]) == g["windows_counted"]
            assert 0 <= g["mean"] <= h["max_alpha"] ** g["L"] * (1 + 1e-9)
    long_heads = sum(h["memory_tokens"] >= 1000 for h in heads)
    assert j["summary"]["long_memory_heads"] == long_heads

    # Bits per byte from the log-probs `replayssm logits` writes for the same byte ids.
    for book, reported in zip(sorted(text_dir.glob("*.txt")), j["books"]):
        ids = np.frombuffer(book.read_bytes()[: n + 1], dtype=np.uint8).astype(np.int32)
        tok = tmp_path / f"{book.stem}.npy"
        np.save(tok, ids[:n])
        lp_path = tmp_path / f"{book.stem}_lp.npy"
        r = run("logits", MODEL, "--tokens", tok, "--out", lp_path, "--device", "cpu", "--threads", 2)
        assert r.returncode == 0, r.stderr
        lp = np.load(lp_path).astype(np.float64)
        bpb = -lp[np.arange(n), ids[1:]].mean() / math.log(2)
        assert reported["name"] == book.stem
        assert reported["bits_per_byte"] == pytest.approx(bpb, rel=1e-5)


def test_refusals(text_dir, tmp_path):
    r = run("info", MODEL, "--decays")
    assert r.returncode != 0 and "--text-dir" in r.stderr
    r = run("info", MODEL, "--text-dir", text_dir)
    assert r.returncode != 0 and "belong to --decays" in r.stderr
    existing = tmp_path / "x.json"
    existing.write_text("keep")
    r = run("info", MODEL, "--decays", "--text-dir", text_dir, "--length", 64, "--json", existing)
    assert r.returncode != 0 and "exists" in r.stderr and existing.read_text() == "keep"
    r = run("info", MODEL, "--decays", "--text-dir", text_dir, "--windows", "0")
    assert r.returncode != 0
