"""`replayssm bench` refuses options that no run can honour before any GPU work: the error names the
option, what it accepts and the value. A bad command line on the GPU machine then fails in a second,
and never times a kernel or prints a time. Without --repeats >= 1 the median had no sample to take.
Here, without a GPU, any GPU work would fail first with a CUDA error instead of the refusal. A build
without CUDA refuses every bench run, so these tests skip there."""
import subprocess

import pytest

from conftest import replayssm_binary


def bench(*args):
    r = subprocess.run([replayssm_binary(), "bench", *args], capture_output=True, text=True, timeout=120)
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
