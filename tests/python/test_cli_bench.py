"""`replayssm bench` refuses options that no run can honour before any GPU work: the error names the
option, what it accepts and the value. A bad command line on the GPU machine then fails in a second,
and never times a kernel or prints a time. Without --repeats >= 1 the median had no sample to take.
Here, without a GPU, any GPU work would fail first with a CUDA error instead of the refusal. A build
without CUDA refuses every bench run, so these tests skip there."""
import csv
import subprocess

import pytest

from conftest import replayssm_binary


def bench(*args):
    r = subprocess.run([replayssm_binary(), "bench", *args], capture_output=True, text=True, timeout=600)
    if r.returncode == 2 and "no CUDA kernels" in r.stderr:
        pytest.skip("this build has no CUDA kernels (configure with -DREPLAYSSM_CUDA=ON)")
    return r


@pytest.mark.parametrize("args,fragment", [
    (["--repeats", "0"], "bench --repeats must be >= 1: each time is the median of the timed repetitions (got 0)"),
    (["--batch", "0"], "bench --batch B must be in [1, 65535] (got 0)"),
    (["--batch", "32", "70000"], "bench --batch B must be in [1, 65535] (got 70000)"),
    (["--window", "0"], "bench --window L must be in [1, 64], the decode kernels' largest window (got 0)"),
    (["--window", "16", "65"], "bench --window L must be in [1, 64], the decode kernels' largest window (got 65)"),
    (["--drafts", "3"], "bench --drafts T must be one of 1, 2, 4, 8 (the verification kernels' draft counts; got 3)"),
    (["--shapes", "mamba-9"], "bench --shapes: unknown model shape 'mamba-9': expected one of"),
    (["--arena-gib", "nan"], "bench --arena-gib must be a finite number >= 0 (got nan)"),
    (["--timer", "wall"], "--timer: wall not in {queued,events}"),
    (["--rows", "read (fp16"], "bench --rows 'read (fp16': not a regular expression (ECMAScript)"),
    (["--rows", "non-flush read fp4"], "bench --rows 'non-flush read fp4' matches no row; the rows are: conventional fp32;"),
    (["--rows", "nvfp4", "--schemes"], "bench --rows selects rows of the main table; --schemes prints figure 7's table instead"),
])
def test_options_no_run_can_honour_are_refused_by_name(args, fragment):
    r = bench(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert fragment in r.stderr, r.stderr
    assert "| model |" not in r.stdout, r.stdout  # no table started: nothing was timed


def test_the_schemes_table_checks_its_options_too():
    """--schemes takes its own defaults for shapes, batch and drafts; a draft count given on the command line
    is checked like the main table's."""
    r = bench("--schemes", "--drafts", "2", "5")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "bench --drafts T must be one of 1, 2, 4, 8" in r.stderr, r.stderr


def test_an_existing_csv_is_refused_before_any_gpu_work(tmp_path):
    """Results are never silently replaced: the old bench opened --csv with std::ofstream at the end of the run
    and truncated whatever was there. The refusal comes before any GPU work, like the options'."""
    old = tmp_path / "bench.csv"
    old.write_text("an earlier run's results\n")
    r = bench("--csv", str(old))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"--csv '{old}': exists; refusing to overwrite a result (use --force to replace it)" in r.stderr, r.stderr
    assert old.read_text() == "an earlier run's results\n"
    r = bench("--csv", str(tmp_path / "missing" / "bench.csv"))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "the directory" in r.stderr and "does not exist (create it first)" in r.stderr, r.stderr


def test_forced_csv_is_replaced_whole_or_not_at_all_and_reads_back_with_pythons_csv(tmp_path):
    """With --force: without a GPU the run fails before it measures anything, and the earlier file is intact (the
    CSV is written atomically at the end). With a GPU (the device machine) the file is replaced by the run's
    table, which Python's csv reader (the independent oracle) reads as rows of the header's 11 fields, the
    kernel labels that hold commas intact (until 2026-12-05 those were written bare, one field too many), and
    every row names the timer (queued, the default)."""
    old = tmp_path / "bench.csv"
    old.write_text("an earlier run's results\n")
    r = bench("--csv", str(old), "--force", "--shapes", "nemotron-3-super", "--batch", "1", "--window", "4",
              "--drafts", "2", "--repeats", "1")
    assert "refusing to overwrite" not in r.stderr, r.stderr
    assert not list(tmp_path.glob(".bench.csv.tmp-*")), "a temporary was left behind"
    if r.returncode != 0:  # no GPU here: nothing measured, nothing written
        assert "CUDA" in r.stderr or "cuda" in r.stderr, r.stderr
        assert old.read_text() == "an earlier run's results\n"
        return
    with open(old, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert header[:2] == ["model", "kernel"] and len(header) == 11 and header[-1] == "timer", header
    assert body and all(len(row) == len(header) for row in body), [row for row in body if len(row) != len(header)]
    labels = {row[1] for row in body}
    assert "nvfp4 read skip=auto, 50% skip (x no skip)" in labels, sorted(labels)
    assert all(float(row[4]) > 0 and int(row[2]) == 1 for row in body)  # us_per_step, batch
    assert {row[-1] for row in body} == {"queued"}


def row_labels_named_by_the_refusal():
    """The labels the bench can print, as its refusal of a --rows pattern that matches none lists them."""
    r = bench("--rows", "^$")
    assert r.returncode == 2, (r.returncode, r.stderr)
    listed = r.stderr.split("matches no row; the rows are: ", 1)[1].strip()
    return listed.split("; ")


def run_rows(tmp_path, *args):
    out = tmp_path / "rows.csv"
    r = bench("--csv", str(out), "--shapes", "nemotron-3-super", "--batch", "1", "--window", "4", "--drafts", "2",
              "--repeats", "1", *args)
    if r.returncode != 0:  # no GPU here: the run fails before it measures anything
        assert "CUDA" in r.stderr or "cuda" in r.stderr, r.stderr
        pytest.skip("no GPU: --rows is checked on the device machine")
    with open(out, newline="") as f:
        return [row[1] for row in list(csv.reader(f))[1:]]


def test_without_rows_every_listed_row_is_timed_once(tmp_path):
    """The refusal's list is the table's rows: a full run (a Mamba-2 shape, one window, one draft count) prints each
    of them exactly once, in that order."""
    assert run_rows(tmp_path) == row_labels_named_by_the_refusal()


@pytest.mark.parametrize("pattern,expected", [
    # the NVFP4 read and what it is measured against: the conventional step, the FP32 non-flush read
    ("non-flush read nvfp4", ["conventional fp32", "replay fp32 non-flush step", "non-flush read nvfp4 (x over fp32 read)"]),
    # a skipping row needs the NVFP4 read, which needs the FP32 read
    ("50% skip", ["conventional fp32", "replay fp32 non-flush step", "non-flush read nvfp4 (x over fp32 read)",
                  "nvfp4 read skip=auto, 50% skip (x no skip)"]),
    # the error-feedback split flush is measured against the split flush, that against the flush step
    ("nvfp4\\+ef", ["conventional fp32", "replay fp32 flush step", "flush split nvfp4/fp32 (x shared flush)",
                    "flush split nvfp4+ef/fp32 (x no ef)"]),
    ("^verify output-only", ["conventional fp32", "verify output-only (no flush)", "verify output-only (with flush)"]),
])
def test_rows_times_the_selected_rows_and_their_references_only(tmp_path, pattern, expected):
    assert run_rows(tmp_path, "--rows", pattern) == expected
