"""The peer benchmarks' CSV outputs follow the toolkit's output rule (the C++ CLI's check_outputs): an
existing file is refused before anything runs (no torch, no peer) unless --force, a missing folder is named,
and the file is written atomically through Python's csv writer, so a label holding a comma stays one field."""
import csv
import subprocess
import sys

import pytest

from conftest import ROOT, checkout_env
from replayssm_py.files import output_refusal, write_csv_atomically

SCRIPTS = ("bench_fla.py", "bench_peers.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_existing_csv_is_refused_before_anything_runs(tmp_path, script):
    old = tmp_path / "peers.csv"
    old.write_text("an earlier run's results\n")
    code = ("import runpy, sys\n"
            f"sys.argv = [{script!r}, '--csv', {str(old)!r}]\n"
            f"try:\n    runpy.run_path({str(ROOT / 'scripts' / script)!r}, run_name='__main__')\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=checkout_env(), timeout=120)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr
    assert f"--csv {old}: exists; refusing to overwrite a result (use --force to replace it)" in r.stderr, r.stderr
    assert old.read_text() == "an earlier run's results\n"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--csv", str(tmp_path / "no" / "x.csv")],
                       capture_output=True, text=True, env=checkout_env(), timeout=120)
    assert r.returncode == 2 and "does not exist (create it first)" in r.stderr, r.stderr


def test_output_refusal_allows_a_new_file_and_force():
    assert output_refusal(ROOT / "no-such-results.csv", False, "--csv") is None
    assert output_refusal(ROOT / "README.md", True, "--csv") is None
    assert "is a directory" in output_refusal(ROOT / "docs", True, "--csv")


def test_csv_rows_read_back_whole_with_commas_and_quotes(tmp_path):
    rows = [("nemotron-3-super", "vllm replayssm_output_only (staggered)", 256, 308.7),
            ("qwen3.5-4b", 'nvfp4 read skip=auto, 50% skip "x"', 32, 12.5)]
    path = write_csv_atomically(tmp_path / "t.csv", ["model", "kernel", "batch", "us_per_step"], rows)
    with open(path, newline="") as f:
        back = list(csv.reader(f))
    assert back[0] == ["model", "kernel", "batch", "us_per_step"]
    assert back[1:] == [[str(x) for x in row] for row in rows]
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]  # no temporary left
