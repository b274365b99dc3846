"""scripts/decode_projection.py / replayssm_py.decode_projection: a run's targets carried to another card.

Oracles: hand-built runs where every row's time moves between the cards by its own random factor (and the copy rate by
another), so each target's true value on the second card is known by judging the second card's rounds directly; and
committed device runs, where projecting the pair's own first-card run must give the pair's second-card values."""
import csv
import random
import subprocess
import sys

import pytest

from conftest import ROOT
from replayssm_py import decode_projection as dp
from replayssm_py import decode_targets as dt

SCRIPT = ROOT / "scripts" / "decode_projection.py"
SEED = 20261207
# The committed pair: the library of e39e803 on an H100 (session 21, call 1) and on an H200 (session 20).
H100_PAIR = [ROOT / f"experiments/bench/decode_2026-12-06/session21/call_pack22/record_lib_land_{i}.csv.xz" for i in (1, 2)]
H200_PAIR = [ROOT / f"experiments/bench/decode_2026-12-06/session20/call_record/record_lib_all_{i}.csv.xz" for i in (1, 2)]
KERNELS = [dt.CONVENTIONAL, dt.STAGGERED, dt.NONFLUSH, dt.FLUSH] + [k for k, _ in dt.LP_READS.values()] + \
    [k for k, _ in dt.VERIFY.values()]
SHAPES = ["nemotron-3-super", "qwen3.5-4b"]


def random_round(rng, batches=(32, 256)):
    """{(shape, kernel, B): row}: fresh random times; the conventional row's % of copy random too."""
    return {(s, k, b): {"us": rng.uniform(20, 900), "pct_copy": rng.uniform(60, 99), "timer": "events"}
            for s in SHAPES for k in KERNELS for b in batches}


def on_second_card(rnd, row_factor, copy_factor):
    """The same round as the second card would time it: each row's time times its factor; % of copy is bytes over
    time over the copy rate, so it moves by 1 / (row factor * copy factor)."""
    return {key: {**r, "us": r["us"] * row_factor[key[:2]], "pct_copy": r["pct_copy"] / (row_factor[key[:2]] * copy_factor)}
            for key, r in rnd.items()}


def test_projection_is_exact_when_each_row_keeps_its_card_factor():
    rng = random.Random(SEED)
    row_factor = {(s, k): rng.uniform(0.6, 1.1) for s in SHAPES for k in KERNELS}
    copy_factor = rng.uniform(0.6, 0.8)
    pair_a = [random_round(rng) for _ in range(2)]
    pair_b = [on_second_card(r, row_factor, copy_factor) for r in pair_a]
    run_a = [random_round(rng) for _ in range(3)]
    truth = {(v.shape, v.target, v.batch): v for v in dt.judge([on_second_card(r, row_factor, copy_factor) for r in run_a])}
    projections = dp.project(pair_a, pair_b, run_a)
    # Every bench target of both shapes at B = 256 and B = 32 (the staggered one), none invented.
    assert len(projections) == sum(1 for v in truth.values() if v.measured)
    for p in projections:
        t = truth[(p.shape, p.target, p.batch)]
        assert p.projected == pytest.approx(t.value, rel=1e-12), p
        assert p.projected_met == t.met, p
    # Each row's time factor between the pair's cards is the one it was given.
    factors = dp.row_factors(pair_a, pair_b)
    assert factors.keys() == pair_a[0].keys()
    for (shape, kernel, batch), f in factors.items():
        assert f == pytest.approx(row_factor[(shape, kernel)], rel=1e-12)


def test_every_statistic_projects_exactly_with_one_round_a_run():
    """One round a run: the projection is exact whichever statistic summarises the rounds."""
    rng = random.Random(SEED + 1)
    row_factor = {(s, k): rng.uniform(0.6, 1.1) for s in SHAPES for k in KERNELS}
    pair_a = [random_round(rng)]
    run_a = [random_round(rng)]
    for stat in dt.STATISTICS:
        truth = {(v.shape, v.target, v.batch): v.value
                 for v in dt.judge([on_second_card(run_a[0], row_factor, 0.7)], (), stat)}
        for p in dp.project(pair_a, [on_second_card(pair_a[0], row_factor, 0.7)], run_a, stat):
            assert p.projected == pytest.approx(truth[(p.shape, p.target, p.batch)], rel=1e-12)


def test_a_pair_timed_two_ways_is_refused():
    rng = random.Random(SEED + 2)
    a = random_round(rng)
    b = {k: {**r, "timer": "queued"} for k, r in random_round(rng).items()}
    with pytest.raises(dt.TargetsInputError, match="timed differently"):
        dp.project([a], [b], [random_round(rng)])
    mixed = {**a, **{k: {**r, "timer": "queued"} for k, r in list(a.items())[:3]}}
    with pytest.raises(dt.TargetsInputError, match="mix timers"):
        dp.project([a, mixed], [a], [a])
    with pytest.raises(dt.TargetsInputError, match="no bench CSV"):
        dp.project([a], [a], [])


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_committed_pair_projects_its_own_run_onto_the_other_card(tmp_path):
    """The run = the pair's H100 side: every projected value is the H200 side's value, through the script."""
    out = tmp_path / "proj.csv"
    r = run_script("--pair-from", *H100_PAIR, "--pair-to", *H200_PAIR, "--run", *H100_PAIR, "--cards", "H100", "H200",
                   "--csv", out, "--row-factors", 32)
    assert r.returncode == 0, r.stderr
    assert "projected (H200)" in r.stdout and "not a measurement" in r.stdout
    # --row-factors 32: the target rows at B = 32 only, each the H200 time over the H100 time.
    factor_rows = [line.split(" | ") for line in r.stdout.splitlines() if line.startswith("| ") and line.endswith(" |")
                   and line.count(" | ") == 3 and not line.startswith("| shape")]
    assert factor_rows and all(row[2] == "32" for row in factor_rows)
    assert {row[1] for row in factor_rows} <= set(dp.TARGET_ROWS)
    h200 = {(v.shape, v.target, str(v.batch)): v.value for v in dt.judge([dt.read_bench_csv(p) for p in H200_PAIR])}
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 40  # five shapes, seven to nine targets each at B = 256, and B = 32's staggered step
    for row in rows:
        assert float(row["projected"]) == pytest.approx(h200[(row["model"], row["target"], row["batch"])], rel=1e-5)
    # An existing result is not replaced without --force.
    again = run_script("--pair-from", *H100_PAIR, "--pair-to", *H200_PAIR, "--run", *H100_PAIR, "--csv", out)
    assert again.returncode == 2 and "exists" in again.stderr
    # --row-factors at a batch the pair does not hold is refused, naming it.
    none = run_script("--pair-from", *H100_PAIR, "--pair-to", *H200_PAIR, "--run", *H100_PAIR, "--row-factors", 7)
    assert none.returncode == 2 and "B = 7" in none.stderr


def test_unreadable_input_is_refused_naming_the_file(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("model,kernel,batch,us_per_step,pct_copy\nqwen3.5-4b,conventional fp32,256,-1,90\n")
    r = run_script("--pair-from", bad, "--pair-to", *H200_PAIR, "--run", *H100_PAIR)
    assert r.returncode == 2 and str(bad) in r.stderr and "us_per_step" in r.stderr
    other = tmp_path / "other.csv"
    other.write_text("model,kernel,batch,us_per_step,pct_copy\nno-such-shape,conventional fp32,256,10,90\n")
    r = run_script("--pair-from", *H100_PAIR, "--pair-to", *H200_PAIR, "--run", other)
    assert r.returncode == 2 and "no target is measured in all three" in r.stderr
