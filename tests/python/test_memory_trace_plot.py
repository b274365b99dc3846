"""scripts/plot_memory_trace.py / replayssm_py.memory_trace_plot: the memory trace of train_tiny runs drawn from
train_log.json, the context changes where the per-step record says, and a clear refusal without a trace."""
import json
import math
import random
import subprocess
import sys

import pytest

from conftest import ROOT, checkout_env

sys.path.insert(0, str(ROOT / "python"))
from replayssm_py import memory_trace_plot as mtp  # noqa: E402

SCRIPT = ROOT / "scripts" / "plot_memory_trace.py"


def fake_log(seed, steps=120, log_every=20, text=True, arch="qwen3_5"):
    """A train_log.json document with a random context schedule and random memory quantiles (never constant)."""
    rng = random.Random(seed)
    first, second = rng.randrange(20, 60), rng.randrange(70, 110)
    per_step = [1024 if i < first else 4096 if i < second else 16384 for i in range(steps)]

    def summary():
        med = rng.uniform(100, 400)
        return {"n": 24, "p10": med / 10, "median": med, "p90": med * rng.uniform(5, 15),
                "max": med * rng.uniform(20, 40), "at_least_1000": rng.randrange(0, 9)}

    entries = [{"step": s, "loss": 1.0, "seq_len": per_step[s - 1], "memory": summary(),
                **({"memory_text": summary()} if text else {})} for s in range(log_every, steps + 1, log_every)]
    return {"arch": arch, "seq_len": per_step, "log": entries}, (first + 1, second + 1)


def test_context_changes_come_from_the_per_step_record():
    log, (first, second) = fake_log(1)
    assert mtp.context_changes(log) == [(1, 1024), (first, 4096), (second, 16384)]
    del log["seq_len"]  # without it: the logged entries (coarser, at logged steps only)
    changes = mtp.context_changes(log)
    assert [n for _, n in changes] == [1024, 4096, 16384] and changes[1][0] >= first


def test_plot_draws_both_traces_per_panel():
    logs = [fake_log(2)[0], fake_log(3, arch="kimi_linear")[0]]
    fig = mtp.plot_memory_trace(logs, names=["a", "b"])
    for ax, log in zip(fig.axes, logs):
        solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
        dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert len(solid) == len(dashed) == 3  # median, p90, max of each trace
        steps = [e["step"] for e in log["log"]]
        medians = sorted(e["memory_text"]["median"] for e in log["log"])
        drawn = [ln for ln in solid if sorted(ln.get_ydata()) == medians]
        assert len(drawn) == 1 and list(drawn[0].get_xdata()) == steps
    assert "channels" in fig.axes[1].get_title() and "heads" in fig.axes[0].get_title()


def test_plot_without_the_text_trace_draws_the_weights_alone():
    fig = mtp.plot_memory_trace([fake_log(4, text=False)[0]])
    assert len([ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "-"]) == 0


def test_script_writes_the_image_and_refuses_a_log_without_trace(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.json").write_text(json.dumps(fake_log(5)[0]))
    out = tmp_path / "trace.png"
    r = subprocess.run([sys.executable, str(SCRIPT), str(run), "--out", str(out)], capture_output=True, text=True,
                       env=checkout_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "train_log.json").write_text(json.dumps({"arch": "mamba2", "log": [{"step": 5, "loss": 1.0}]}))
    r = subprocess.run([sys.executable, str(SCRIPT), str(empty), "--out", str(out)], capture_output=True, text=True,
                       env=checkout_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "no memory trace" in r.stderr
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "missing")], capture_output=True, text=True,
                       env=checkout_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "no train_log.json" in r.stderr


@pytest.mark.parametrize("run", ["long_mamba2", "long_qwen3_5"])
def test_committed_traces_plot(run, tmp_path):
    """The committed H200 traces (experiments/training/weight_trace_2026-12-03) load and draw."""
    log = mtp.load_log(ROOT / "experiments" / "training" / "weight_trace_2026-12-03" / run)
    fig = mtp.plot_memory_trace([log])
    assert len(fig.axes[0].get_lines()) >= 4


def test_settling_against_a_float64_fit():
    # Random traces: the change per 10% of the steps must equal numpy's float64 least-squares fit of the log
    # over the logged steps from the card's reference step (last at or before 80%) to the end.
    np = pytest.importorskip("numpy")
    for seed in range(5):
        log, _ = fake_log(100 + seed, steps=rng_steps(seed), log_every=10)
        s = mtp.settling(log)
        entries = log["log"]
        last = entries[-1]["step"]
        ref = max(e["step"] for e in entries if e["step"] <= 0.8 * last)
        window = [e for e in entries if e["step"] >= ref]
        assert s["from_step"] == ref and s["to_step"] == last and s["entries"] == len(window)
        x = np.array([e["step"] / last for e in window], dtype=np.float64)
        for stat in ("median", "p90", "max"):
            y = np.log([e["memory_text"][stat] for e in window])
            a = np.polyfit(x, y, 1)[0]
            assert s[stat]["per_tenth"] == pytest.approx(np.expm1(0.1 * a), rel=1e-9, abs=1e-12)
            assert s[stat]["change"] == pytest.approx(window[-1]["memory_text"][stat] / window[0]["memory_text"][stat] - 1)
        counts = [e["memory_text"]["at_least_1000"] for e in window]
        assert s["at_least_1000"] == {"start": counts[0], "end": counts[-1], "min": min(counts), "max": max(counts)}


def rng_steps(seed):
    return random.Random(seed).randrange(150, 400)


def test_settling_of_a_geometric_trace_is_its_rate():
    # memory = m0 * exp(c * step / N): the fitted change per 10% of the steps is exactly exp(0.1 c) - 1, and a
    # constant trace gives 0; too short a trace gives None.
    rng = random.Random(7)
    for _ in range(4):
        c, m0, n = rng.uniform(-2, 2), rng.uniform(50, 500), rng.randrange(100, 300)
        entries = [{"step": s, "memory_text": {"n": 24, "median": m0 * math.exp(c * s / n), "p90": 3 * m0,
                                               "max": m0 * 10 * math.exp(-c * s / n), "at_least_1000": s % 3}}
                   for s in range(10, n + 1, 10)]
        s = mtp.settling({"log": entries})
        last = entries[-1]["step"]
        assert s["median"]["per_tenth"] == pytest.approx(math.exp(0.1 * c * last / n) - 1, rel=1e-9)
        assert s["max"]["per_tenth"] == pytest.approx(math.exp(-0.1 * c * last / n) - 1, rel=1e-9)
        assert s["p90"]["per_tenth"] == pytest.approx(0.0, abs=1e-12) and s["p90"]["change"] == 0.0
    assert mtp.settling({"log": entries[:1]}) is None
    assert mtp.settling({"log": [{"step": 5, "memory": {}}]}) is None


def test_the_script_prints_the_settling_table(tmp_path):
    log, _ = fake_log(11)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_log.json").write_text(json.dumps(log))
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "run"), "--out", str(tmp_path / "t.png")],
                         capture_output=True, text=True, env=checkout_env(), check=True).stdout
    s = mtp.settling(log)
    row = [line for line in out.splitlines() if line.startswith("| run |")][-1]  # the header's first cell is "run" too
    assert f"{s['from_step']}–{s['to_step']}" in row and f"{100 * s['median']['per_tenth']:+.1f}% per 10%" in row
