"""`replayssm traffic` at the edges of its options: windows whose byte counts would overflow are
refused, the largest accepted window gives the exact formula, non-finite inputs are refused, and
numbers too large for an integer are printed, not wrapped."""
import re
import subprocess

import pytest

from conftest import replayssm_binary


def traffic(*args):
    return subprocess.run([replayssm_binary(), "traffic", "--shape", "qwen3.5-4b", *args], capture_output=True,
                          text=True)


def number(text):
    return int(text.replace(",", ""))


@pytest.mark.parametrize("args,fragment", [
    (["--window", "0"], "--window L must be an integer in [1, 1048576] (got 0)"),
    # (L - 1) L / 2 records of r bytes overflowed 64 bits: the replay column read "-0"
    (["--window", "2000000000"], "--window L must be an integer in [1, 1048576] (got 2000000000)"),
    (["--kv-bytes-per-token", "inf"], "--kv-bytes-per-token must be a finite number > 0 (got inf)"),
    (["--kv-bytes-per-token", "nan"], "--kv-bytes-per-token must be a finite number > 0 (got nan)"),
    (["--drafts", "2", "--accepted", "nan"], "--accepted A must be >= 1 (got nan)"),
    (["--state-format", "fp5"], "--state-format: unknown number format 'fp5'"),
])
def test_bad_values_are_refused(args, fragment):
    r = traffic(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert fragment in r.stderr, r.stderr


def test_largest_window_is_exact_and_columns_stay_apart():
    L = 1 << 20
    r = traffic("--window", str(L))
    assert r.returncode == 0, r.stderr
    m = re.search(r"M_S = ([\d,]+) B per head.*record r = \S+ = (\d+) B", r.stdout)
    M, rec = number(m.group(1)), int(m.group(2))
    row = re.search(r"^  per head +([\d,]+) +([\d,]+) +([\d.]+)$", r.stdout, re.M)
    assert row, r.stdout  # three separate columns, even when a number fills its column
    assert number(row.group(1)) == 2 * L * M
    assert number(row.group(2)) == (L + 1) * M + (L - 1) * (L + 2) // 2 * rec


def test_numbers_beyond_an_integer_are_printed_in_scientific_notation():
    r = traffic("--kv-bytes-per-token", "1e-300")
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if "crossover context:" in l)
    assert "e+30" in line and "-0 tokens" not in line, line


def test_bench_schemes_refuses_a_kda_shape():
    """`bench --schemes` on a KDA shape is refused by name before any GPU work (CUDA builds); a build
    without CUDA refuses every bench run."""
    run = subprocess.run([replayssm_binary(), "bench", "--schemes", "--shapes", "kimi-linear-48b-a3b"],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert ("'kimi-linear-48b-a3b' has KDA" in run.stderr) or ("no CUDA kernels" in run.stderr), run.stderr


@pytest.mark.parametrize("shape", ["nemotron-3-super", "qwen3.5-4b", "kimi-linear-48b-a3b"])
def test_policy_modifier_bytes_follow_the_head_shape(shape):
    """The +ef line's residual traffic is an fp32 matrix read and written (8 dv dk bytes); the skip
    line's savings are each copy's storage: fp32 4 dv dk, fp16 2 dv dk, fp8b128 dv dk + 4 dv dk / 128,
    nvfp4 dv dk / 2 + dv dk / 16 + 4 (formats spec: E2M1 nibbles, one E4M3 scale per 16, an fp32
    tensor scale)."""
    r = subprocess.run([replayssm_binary(), "traffic", "--shape", shape], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    dk, dv = (int(x) for x in re.search(r"dk = (\d+), dv = (\d+)", r.stdout).groups())
    n = dk * dv
    assert number(re.search(r"fp32 residual, \+([\d,]+) B per write", r.stdout).group(1)) == 8 * n
    saved = re.search(r"saving the copy's bytes \(fp32 ([\d,]+) B, fp16 ([\d,]+) B, fp8b128 ([\d,]+) B, "
                      r"nvfp4 ([\d,]+) B\)", r.stdout)
    assert [number(x) for x in saved.groups()] == [4 * n, 2 * n, n + 4 * n // 128, n // 2 + n // 16 + 4]
    assert number(re.search(r"a pure write, saving ([\d,]+) B", r.stdout).group(1)) == 4 * n
