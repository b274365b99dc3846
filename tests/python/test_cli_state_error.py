"""`replayssm state-error` (issue 11, appendix C.6 on real states) on a golden model: the JSON holds one
entry per SSM head and policy, split with an FP32 recur copy measures exactly its prediction (one
rounding), shared errors exceed one rounding by about the model's accumulation factor, and
scripts/plot_state_error.py draws it."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, replayssm_binary

MODEL = ROOT / "data" / "models" / "mamba2_tiny"


def run(*args):
    return subprocess.run([replayssm_binary(), *map(str, args)], capture_output=True, text=True)


def test_state_error_json_and_plot(text_dir, tmp_path):
    out = tmp_path / "se.json"
    r = run("state-error", MODEL, "--text-dir", text_dir, "--length", 640, "--books", 2, "--threads", 2,
            "--policies", "shared:nvfp4+sr@16,split:nvfp4+rtn/fp32@8", "--json", out)
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert [p["policy"] for p in j["policies"]] == ["shared:nvfp4+sr@16", "split:nvfp4+rtn/fp32@8"]
    for p in j["policies"]:
        assert len(p["heads"]) == 2 * 3 * 8  # 2 books x 3 layers x 8 heads
        keys = [(h["book"], h["layer"], h["value_head"]) for h in p["heads"]]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)  # one row per head, in order (reruns equal)
        window = 16 if p["policy"].startswith("shared") else 8
        for h in p["heads"]:
            assert h["events"] == 640 // window and h["steady_events"] == h["events"] - h["events"] // 2
            assert h["measured_ms"] > 0 and h["state_ms"] > 0
            one = h["rounding_var"] + h["rounding_bias"] ** 2
            if p["policy"].startswith("split"):
                assert h["measured_ms"] == pytest.approx(h["predicted_ms"], rel=1e-9)
                assert h["recur_measured_ms"] == 0
                assert h["realized_var"] == 0 and h["realized_predicted_ms"] == pytest.approx(h["predicted_ms"])
            else:
                factor = 1 / (1 - h["mean_gamma2"])
                assert h["predicted_ms"] >= one * factor * (1 - 1e-12)
                assert h["realized_var"] > 0  # the rounding errors the checkpoint received (Mamba-2)
                assert h["realized_predicted_ms"] == pytest.approx(
                    h["realized_var"] / (1 - h["mean_gamma2"]) + (h["realized_bias"] / (1 - h["mean_gamma"])) ** 2)
    png = tmp_path / "se.png"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_state_error.py"), str(out), "--out", str(png)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert png.stat().st_size > 10_000


def test_refusals(text_dir, tmp_path):
    out = tmp_path / "x.json"
    out.write_text("keep")
    r = run("state-error", MODEL, "--text-dir", text_dir, "--length", 64, "--json", out)
    assert r.returncode != 0 and "exists" in r.stderr and out.read_text() == "keep"
    r = run("state-error", MODEL, "--text-dir", text_dir, "--length", 64, "--json", tmp_path / "y.json",
            "--policies", "conv:nvfp4+rtn")
    assert r.returncode != 0 and "conventional" in r.stderr


def test_plot_says_why_the_realized_panel_is_empty():
    """A model without realized-error moments (GDN, KDA: no scalar decay) gets a note in the third panel, not
    an empty panel that reads as 'no error'; a Mamba-2 document gets points and no note."""
    sys.path.insert(0, str(ROOT / "python"))
    from replayssm_py.state_error_plot import plot_state_error

    def doc(realized):
        head = {"predicted_ms": 2e-3, "state_ms": 1.0, "measured_ms": 1.5e-3, "mean_gamma2": 0.9,
                "realized_predicted_ms": 1.6e-3 if realized else 0.0}
        return {"model_dir": "m", "positions_per_book": 64, "policies": [{"policy": "shared:nvfp4+sr@16",
                                                                          "heads": [head]}]}
    for realized in (False, True):
        fig = plot_state_error(doc(realized))
        cx = fig.axes[2]
        notes = [t.get_text() for t in cx.texts]
        assert (len(cx.collections) > 0) == realized
        assert any("not measured" in t for t in notes) == (not realized)


def test_error_feedback_is_refused_before_any_work(text_dir, tmp_path):
    r = run("state-error", MODEL, "--text-dir", text_dir, "--length", 64, "--json", tmp_path / "ef.json",
            "--policies", "shared:nvfp4+ef@16")
    assert r.returncode == 2, r.stderr
    assert "error feedback (+ef)" in r.stderr and "use +rtn or +sr" in r.stderr
    assert not (tmp_path / "ef.json").exists()
