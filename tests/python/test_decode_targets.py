"""scripts/decode_targets.py / replayssm_py.decode_targets: issue 13's target ratios from bench CSVs.

Oracles: the bench's own `speedup_vs_reference` column (computed in C++ from its own timings) on committed device
runs; hand-built rounds with fresh random times on either side of each limit; `replayssm traffic` for the
recurrence of each shape."""
import csv
import lzma
import pathlib
import random
import re
import statistics
import subprocess
import sys

import pytest

from conftest import ROOT, replayssm_binary
from replayssm_py import decode_targets as dt

SCRIPT = ROOT / "scripts" / "decode_targets.py"
# Committed device runs (H100): session 21's record rounds and session 23's.
RECORDS = [ROOT / "experiments/bench/decode_2026-12-06/session21/call4/record_1.csv.xz",
           ROOT / "experiments/bench/decode_2026-12-06/session23/call4/record_2.csv.xz"]
SEED = 20261206


def read_raw(path):
    with lzma.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def verdict(verdicts, shape, target, batch):
    found = [v for v in verdicts if v.shape == shape and v.target.startswith(target) and v.batch == batch]
    assert len(found) == 1, (shape, target, batch, found)
    return found[0]


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.parent.parent.name)
def test_one_round_gives_the_bench_own_ratios(path):
    """With one round the tool's ratios are the bench's speedup column: x conventional for the staggered step,
    its inverse for the flush step and the verification rows, x the FP32 read for the LP reads."""
    raw = read_raw(path)
    speedup = {(r["model"], r["kernel"], int(r["batch"])): float(r["speedup_vs_reference"]) for r in raw}
    pct = {(r["model"], r["kernel"], int(r["batch"])): float(r["pct_copy"]) for r in raw}
    verdicts = dt.judge([dt.read_bench_csv(path)])
    checked = 0
    for v in verdicts:
        if not v.measured:
            continue
        s, b = v.shape, v.batch
        if v.target.startswith("conventional"):
            expected = pct[(s, dt.CONVENTIONAL, b)]
        elif v.target.startswith("staggered"):
            expected = speedup[(s, dt.STAGGERED, b)]
        elif v.target.startswith("flush"):
            expected = 1.0 / speedup[(s, dt.FLUSH, b)]
        elif v.target.startswith("verification"):
            kernel = dt.VERIFY["no flush" if "no flush" in v.target else "with a flush"][0]
            expected = 1.0 / speedup[(s, kernel, b)]
        else:
            kernel = dt.LP_READS[v.target.split(" read")[0]][0]
            expected = speedup[(s, kernel, b)]
        # The CSV rounds times to 1 ns and speedups to 1e-4.
        assert v.value == pytest.approx(expected, rel=1e-3, abs=2e-4), (v, expected)
        checked += 1
    assert checked >= 40, checked  # five shapes, seven to nine targets each
    # A record run has no B = 8..128 rows beside 32 and 256: nothing invented for them.
    assert {v.batch for v in verdicts} == {32, 256}


def bench_round(rng, shape, times_by_kernel, batch=256, pct=95.0):
    rows = {}
    for kernel, us in times_by_kernel.items():
        rows[(shape, kernel, batch)] = {"us": us, "pct_copy": pct if kernel == dt.CONVENTIONAL else rng.uniform(10, 99)}
    return rows


def test_verdicts_on_either_side_of_each_limit():
    rng = random.Random(SEED)
    conv = rng.uniform(200, 800)
    nf = conv / rng.uniform(1.5, 2.0)
    over, under = 1.0 + rng.uniform(0.002, 0.05), 1.0 - rng.uniform(0.002, 0.05)
    # Super: staggered just above 1.75x, flush just above 1.1 steps, FP16 just above 1.7x, FP8 just below 2.8x.
    times = {dt.CONVENTIONAL: conv, dt.STAGGERED: conv / (1.75 * over), dt.FLUSH: conv * 1.1 * over, dt.NONFLUSH: nf,
             dt.LP_READS["FP16"][0]: nf / (1.7 * over), dt.LP_READS["FP8-b128"][0]: nf / (2.8 * under),
             dt.VERIFY["no flush"][0]: conv * 1.1 * under}
    v = dt.judge([bench_round(rng, "nemotron-3-super", times, pct=92.0 * under)])
    assert verdict(v, "nemotron-3-super", "conventional", 256).status == "missed"
    assert verdict(v, "nemotron-3-super", "staggered", 256).status == "met"
    assert verdict(v, "nemotron-3-super", "flush", 256).status == "missed"
    assert verdict(v, "nemotron-3-super", "FP16 read", 256).status == "met"
    assert verdict(v, "nemotron-3-super", "FP8-b128 read", 256).status == "missed"
    assert verdict(v, "nemotron-3-super", "NVFP4 read", 256).status == "not measured"
    assert verdict(v, "nemotron-3-super", "verification no flush", 256).status == "met"
    assert verdict(v, "nemotron-3-super", "verification with a flush", 256).status == "not measured"
    assert verdict(v, "nemotron-3-super", "staggered", 32).status == "not measured"
    # The same staggered ratio on another shape needs only 1.6x; 1.7x on Super misses.
    t2 = {dt.CONVENTIONAL: conv, dt.STAGGERED: conv / 1.7}
    assert verdict(dt.judge([bench_round(rng, "qwen3.5-4b", t2)]), "qwen3.5-4b", "staggered", 256).met
    assert not verdict(dt.judge([bench_round(rng, "nemotron-3-super", t2)]), "nemotron-3-super", "staggered", 256).met
    # KDA has no verification target.
    kda = dt.judge([bench_round(rng, "kimi-linear-48b-a3b", times)])
    assert not [x for x in kda if x.target.startswith("verification")]


def test_ratios_are_taken_within_a_round_then_summarised():
    """Two rounds whose conventional times differ by 20%: a within-round ratio keeps each round's own pairing."""
    rng = random.Random(SEED + 1)
    ratios = [rng.uniform(1.55, 1.85) for _ in range(4)]
    rounds = []
    for r in ratios:
        conv = rng.uniform(300, 600)
        rounds.append(bench_round(rng, "qwen3.5-122b-a10b", {dt.CONVENTIONAL: conv, dt.STAGGERED: conv / r}))
    for name, f in dt.STATISTICS.items():
        v = verdict(dt.judge(rounds, statistic=name), "qwen3.5-122b-a10b", "staggered", 256)
        assert v.value == pytest.approx(f(ratios), rel=1e-12)
        assert sorted(v.per_round) == pytest.approx(sorted(ratios), rel=1e-12)
    assert verdict(dt.judge(rounds), "qwen3.5-122b-a10b", "staggered", 256).value == pytest.approx(
        statistics.median(ratios))


def test_peers_against_our_staggered_step():
    rng = random.Random(SEED + 2)
    ours = {b: rng.uniform(40, 300) for b in (16, 32, 256)}
    bench = {}
    for b, us in ours.items():
        bench[("nemotron-3-nano-4b", dt.STAGGERED, b)] = {"us": us, "pct_copy": 90.0}
        bench[("nemotron-3-nano-4b", dt.CONVENTIONAL, b)] = {"us": us * 1.7, "pct_copy": 95.0}
    peers = {("nemotron-3-nano-4b", dt.VLLM_REPLAY, 16): {"us": ours[16] * 1.1, "pct_copy": None},   # > 1 suffices
             ("nemotron-3-nano-4b", dt.VLLM_REPLAY, 32): {"us": ours[32] * 1.29, "pct_copy": None},  # < 1.3
             ("nemotron-3-nano-4b", dt.VLLM_REPLAY, 256): {"us": ours[256] * 1.31, "pct_copy": None},
             ("nemotron-3-nano-4b", "flashinfer checkpointing_ssu monolith (staggered)", 256):
                 {"us": ours[256] * 0.99, "pct_copy": None},
             ("nemotron-3-nano-4b", dt.VLLM_REPLAY, 128): {"us": 100.0, "pct_copy": None}}  # no bench row at 128
    v = dt.judge([bench], [peers])
    assert verdict(v, "nemotron-3-nano-4b", dt.VLLM_REPLAY, 16).status == "met"
    assert verdict(v, "nemotron-3-nano-4b", dt.VLLM_REPLAY, 32).status == "missed"
    assert verdict(v, "nemotron-3-nano-4b", dt.VLLM_REPLAY, 256).status == "met"
    assert verdict(v, "nemotron-3-nano-4b", dt.VLLM_REPLAY, 256).value == pytest.approx(1.31)
    assert verdict(v, "nemotron-3-nano-4b", "flashinfer", 256).status == "missed"
    assert verdict(v, "nemotron-3-nano-4b", dt.VLLM_REPLAY, 128).status == "not measured"
    # B = 16 (>= 8, not 32 or 256): the staggered step needs only 1.0x there.
    assert verdict(v, "nemotron-3-nano-4b", "staggered", 16).limit == 1.0


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


HEADER = ["model", "kernel", "batch", "param", "us_per_step", "bytes_per_step", "gbps", "pct_copy",
          "speedup_vs_reference", "copy_gbps"]


@pytest.mark.parametrize("header,row,fragment", [
    (["model", "kernel", "batch", "pct_copy"], ["m", "k", "256", "90"], "header lacks the field(s) us_per_step"),
    (HEADER, ["m", "k", "256", "1", "fast", "1", "1", "90", "1", "1"], "line 2: field 'us_per_step': expected a positive number, got 'fast'"),
    (HEADER, ["m", "k", "256", "1", "-3", "1", "1", "90", "1", "1"], "line 2: field 'us_per_step'"),
    (HEADER, ["m", "k", "256", "1", "nan", "1", "1", "90", "1", "1"], "line 2: field 'us_per_step'"),
    (HEADER, ["m", "k", "2.5", "1", "3", "1", "1", "90", "1", "1"], "line 2: field 'batch': expected a positive integer"),
])
def test_bad_bench_csv_is_refused_naming_file_line_and_field(tmp_path, header, row, fragment):
    path = write_csv(tmp_path / "bad.csv", header, [row])
    with pytest.raises(dt.TargetsInputError, match=re.escape(fragment)) as e:
        dt.read_bench_csv(path)
    assert str(path) in str(e.value)


def test_duplicate_rows_and_empty_files_are_refused(tmp_path):
    row = ["m", "k", "256", "1", "3", "1", "1", "90", "1", "1"]
    with pytest.raises(dt.TargetsInputError, match="appears twice"):
        dt.read_bench_csv(write_csv(tmp_path / "dup.csv", HEADER, [row, row]))
    with pytest.raises(dt.TargetsInputError, match="no rows"):
        dt.read_bench_csv(write_csv(tmp_path / "empty.csv", HEADER, []))
    with pytest.raises(dt.TargetsInputError, match="cannot read"):
        dt.read_bench_csv(tmp_path / "missing.csv")


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_cli_prints_writes_and_refuses(tmp_path):
    out = tmp_path / "targets.csv"
    r = run_script(*RECORDS[:1], "--csv", out)
    assert r.returncode == 0, r.stderr
    assert "| nemotron-3-super | staggered step, x conventional | 256 |" in r.stdout
    summary = re.search(r"(\d+) met, (\d+) missed, (\d+) not measured \(of (\d+)\)", r.stdout)
    met, missed, absent, total = map(int, summary.groups())
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == total == met + missed + absent
    assert sum(row["status"] == "met" for row in rows) == met
    # An existing result is not replaced without --force; --strict fails a run with a missed target.
    r = run_script(*RECORDS[:1], "--csv", out)
    assert r.returncode == 2 and "--csv" in r.stderr, r.stderr
    assert missed > 0  # these H100 runs miss the NVFP4 read's 3.8x on every shape
    assert run_script(*RECORDS[:1], "--strict").returncode == 1
    bad = write_csv(tmp_path / "bad.csv", ["model", "kernel"], [["m", "k"]])
    r = run_script(bad)
    assert r.returncode == 2 and f"{bad}: header lacks" in r.stderr, r.stderr


def test_shape_recurrences_match_the_cli():
    for shape, recurrence in dt.SHAPE_RECURRENCE.items():
        r = subprocess.run([replayssm_binary(), "traffic", "--shape", shape], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        first = r.stdout.splitlines()[0]
        assert re.search(rf"\({re.escape(shape)}\): {re.escape(recurrence)},", first), first


def test_peer_csvs_carry_their_timer(tmp_path):
    """bench_peers.py writes a timer column; a CSV without one (every run before session 26) is events-timed."""
    rng = random.Random(SEED + 3)
    ours = rng.uniform(50, 400)
    bench = {("nemotron-3-super", dt.STAGGERED, 64): {"us": ours, "pct_copy": 90.0}}
    peer_row = ["nemotron-3-super", dt.VLLM_REPLAY, "64", f"{ours * 1.2:.6f}"]
    old = write_csv(tmp_path / "old.csv", ["model", "kernel", "batch", "us_per_step"], [peer_row])
    new = write_csv(tmp_path / "new.csv", ["model", "kernel", "batch", "us_per_step", "timer"], [peer_row + ["graph"]])
    v = dt.judge([bench], [dt.read_peer_csv(old), dt.read_peer_csv(new)])
    assert [x.target for x in v if "vllm" in x.target] == [f"{dt.VLLM_REPLAY} [events], x our staggered step",
                                                           f"{dt.VLLM_REPLAY} [graph], x our staggered step"]
    assert all(x.limit == dt.VLLM_MIN_RATIO and x.status == "missed" for x in v if "vllm" in x.target)
    assert "[events] were timed with CUDA events" in dt.format_markdown(v)
    bad = write_csv(tmp_path / "bad.csv", ["model", "kernel", "batch", "us_per_step", "timer"], [peer_row + ["wall"]])
    with pytest.raises(dt.TargetsInputError, match=r"line 2: field 'timer': expected one of events, graph, got 'wall'"):
        dt.read_peer_csv(bad)
    # A CSV without the column can be declared graph-timed (session 26's call 4 wrote such files).
    assert dt.read_peer_csv(old, "graph")[("nemotron-3-super", dt.VLLM_REPLAY, 64)]["timer"] == "graph"
    with pytest.raises(dt.TargetsInputError, match="unknown peer timer 'wall'"):
        dt.read_peer_csv(old, "wall")


def test_bench_csvs_carry_their_timer_and_rounds_of_two_timers_are_refused(tmp_path):
    """`replayssm bench` writes a timer column since session 27 (queued by default); a CSV without it is events-timed.
    A queued round and an events round differ by the host's launch time in every one-step row, so judging them
    together would mix two measurements: refused, naming both."""
    rng = random.Random(SEED + 4)
    conv, stag = rng.uniform(300, 600), rng.uniform(150, 250)
    rows = [["nemotron-3-super", dt.CONVENTIONAL, "256", "1", f"{conv:.3f}", "1", "1", "95", "1", "3000"],
            ["nemotron-3-super", dt.STAGGERED, "256", "16", f"{stag:.3f}", "1", "1", "90", "1", "3000"]]
    old = write_csv(tmp_path / "old.csv", HEADER, rows)
    new = write_csv(tmp_path / "new.csv", HEADER + ["timer"], [r + ["queued"] for r in rows])
    assert all(r["timer"] == "events" for r in dt.read_bench_csv(old).values())
    v = dt.judge([dt.read_bench_csv(new)])
    assert verdict(v, "nemotron-3-super", "staggered", 256).value == pytest.approx(conv / stag, rel=1e-4)  # times to 1 ns
    assert "`replayssm bench --timer queued`" in dt.format_markdown(v)
    assert "`replayssm bench --timer events`" in dt.format_markdown(dt.judge([dt.read_bench_csv(old)]))
    with pytest.raises(dt.TargetsInputError, match=r"the bench CSVs mix timers \(events, queued\)"):
        dt.judge([dt.read_bench_csv(old), dt.read_bench_csv(new)])
    bad = write_csv(tmp_path / "bad.csv", HEADER + ["timer"], [rows[0] + ["graph"]])
    with pytest.raises(dt.TargetsInputError, match=r"line 2: field 'timer': expected one of queued, events, got 'graph'"):
        dt.read_bench_csv(bad)
