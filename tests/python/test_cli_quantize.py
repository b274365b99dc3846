"""`replayssm quantize` end to end, against the independent numpy + ml_dtypes implementation
in replayssm_py.formats (scripts/make_format_goldens.py), on fresh random tensors (fixed, recorded seeds)."""
import subprocess

import numpy as np
import pytest

from replayssm_py import formats as g
from conftest import replayssm_binary

SEED = 20261130


def run(args, check=True):
    return subprocess.run([replayssm_binary(), *args], capture_output=True, text=True, check=check)


def expected(fmt, x, rounding, seed, stream):
    if fmt == "nvfp4":
        return g.quantize_nvfp4(x, rounding, seed, stream)["decoded"].reshape(x.shape)
    if fmt == "fp8b128":
        return g.quantize_fp8b128(x, rounding, seed, stream)["decoded"].reshape(x.shape)
    codes = g.encode(fmt, x.reshape(-1), rounding, seed, stream)
    return g.FORMATS[fmt].decode(codes).astype(np.float32).reshape(x.shape)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8b128", "e4m3", "e2m1", "fp16", "bf16"])
@pytest.mark.parametrize("rounding", ["rtn", "sr"])
def test_quantize_matches_independent_implementation(tmp_path, fmt, rounding):
    rng = np.random.default_rng([SEED, hash((fmt, rounding)) % 2**31])
    x = (rng.standard_normal((6, 256)) * np.exp(rng.uniform(-8, 8, (6, 1)))).astype(np.float32)
    x[0, 3] = -0.0
    np.save(tmp_path / "in.npy", x)
    seed, stream = int(rng.integers(2**63)), int(rng.integers(2**40))
    run(["quantize", "--format", fmt, "--rounding", rounding, "--seed", str(seed), "--stream", str(stream),
         str(tmp_path / "in.npy"), str(tmp_path / "out.npy")])
    y = np.load(tmp_path / "out.npy")
    assert y.dtype == np.float32 and y.shape == x.shape
    want = expected(fmt, x, rounding, seed, stream)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))


def test_codes_and_scales_outputs(tmp_path):
    x = np.random.default_rng(SEED + 1).standard_normal((4, 64)).astype(np.float32)
    np.save(tmp_path / "in.npy", x)
    run(["quantize", "--format", "nvfp4", "--codes", str(tmp_path / "c.npy"), "--scales", str(tmp_path / "s.npy"),
         "--tensor-scale", str(tmp_path / "t.npy"), str(tmp_path / "in.npy"), str(tmp_path / "out.npy")])
    ref = g.quantize_nvfp4(x, "rtn")
    assert np.array_equal(np.load(tmp_path / "c.npy").reshape(-1), ref["codes"].astype(np.uint8))
    assert np.array_equal(np.load(tmp_path / "s.npy").reshape(-1), ref["block_scales"].astype(np.uint8))
    assert np.load(tmp_path / "t.npy").view(np.uint32)[0] == ref["tensor_scale_bits"]


def test_bad_inputs_give_clear_errors(tmp_path):
    np.save(tmp_path / "f64.npy", np.zeros((2, 32)))
    r = run(["quantize", str(tmp_path / "f64.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode != 0 and "f64.npy" in r.stderr and "expected float32" in r.stderr

    np.save(tmp_path / "odd.npy", np.ones((2, 40), np.float32))
    r = run(["quantize", "--format", "nvfp4", str(tmp_path / "odd.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode != 0 and "odd.npy" in r.stderr and "multiple of 16" in r.stderr

    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    r = run(["quantize", str(tmp_path / "junk.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode != 0 and "not a .npy file" in r.stderr

    r = run(["quantize", "--format", "fp6", str(tmp_path / "odd.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode != 0 and "expected one of" in r.stderr


def test_version_and_formats_self_check():
    r = run(["--version"])
    assert "git" in r.stdout
    r = run(["formats"])
    assert "All format checks passed." in r.stdout


# ---- the .npy reader against numpy, through `quantize` (issue 17, defects 2 and 7) ---------------

import os  # noqa: E402
import resource  # noqa: E402
import warnings  # noqa: E402

import npy_cases  # noqa: E402


def numpy_verdict(path):
    """The float32 C-order array numpy reads from path, or the reason it does not give one."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the Python 2 'L' retry warns; it still loads
            a = np.load(path)
    except Exception as e:  # numpy's refusal is the expected outcome for the toolkit too
        return None, f"numpy: {type(e).__name__}"
    if a.dtype.names is not None or a.dtype.kind != "f" or a.dtype.itemsize != 4:
        return None, f"numpy reads dtype {a.dtype.str}"
    return np.ascontiguousarray(a, dtype="<f4"), "float32"


def temporaries(d):
    return sorted(p.name for p in d.iterdir() if ".tmp" in p.name)


def test_reader_accepts_exactly_what_numpy_reads_as_float32(tmp_path):
    x, corpus = npy_cases.cases(np.random.default_rng(SEED + 7))
    accepted = 0
    for i, (name, data) in enumerate(corpus):
        src = tmp_path / f"case{i:03d}.npy"
        src.write_bytes(data)
        want, why = numpy_verdict(src)
        out = tmp_path / f"out{i:03d}.npy"
        r = run(["quantize", "--format", "fp32", str(src), str(out)], check=False)
        if want is not None and want.size > 0 and want.ndim > 0:
            assert r.returncode == 0, f"{name}: numpy reads it as float32, replayssm says {r.stderr}"
            got = np.load(out)
            assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
            accepted += 1
        else:
            assert r.returncode == 2, f"{name} ({why}): replayssm accepted it: {r.stderr}"
            assert src.name in r.stderr and "error" in r.stderr, f"{name}: {r.stderr}"
            assert not out.exists(), name
    assert accepted >= 25  # the corpus has both sides
    assert temporaries(tmp_path) == []


def test_reader_messages_name_file_field_and_expectation(tmp_path):
    x, _ = npy_cases.cases(np.random.default_rng(SEED + 8))
    d = x.tobytes()
    expectations = {
        "(-4, 32)": ("'shape'", "non-negative integers"),
        "(4, 'x', 32)": ("'shape'", "non-negative integers"),
    }
    for shape, words in expectations.items():
        (tmp_path / "s.npy").write_bytes(npy_cases.npy_bytes(npy_cases.header(shape=shape), d))
        r = run(["quantize", str(tmp_path / "s.npy"), str(tmp_path / "o.npy")], check=False)
        assert r.returncode == 2 and "s.npy" in r.stderr and all(w in r.stderr for w in words), r.stderr
    # A 4 GiB header length is refused from the length field, before anything is allocated.
    (tmp_path / "h.npy").write_bytes(npy_cases.npy_bytes(npy_cases.header(), d, version=(2, 0), header_len=2**32 - 1))
    r = run(["quantize", str(tmp_path / "h.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode == 2 and "h.npy" in r.stderr and "header length" in r.stderr and "numpy's limit" in r.stderr
    # Duplicate 'descr': the last one wins, as in numpy (here '<f8', so not float32).
    dup = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 16), 'descr': '<f8'}"
    (tmp_path / "dup.npy").write_bytes(npy_cases.npy_bytes(dup, np.zeros((2, 16)).tobytes()))
    r = run(["quantize", str(tmp_path / "dup.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode == 2 and "dup.npy" in r.stderr and "dtype is '<f8', expected float32" in r.stderr
    # Bytes after the data: numpy ignores them; the toolkit refuses (the shape does not describe the file).
    (tmp_path / "t.npy").write_bytes(npy_cases.npy_bytes(npy_cases.header(), d + b"\0\0\0\0"))
    r = run(["quantize", str(tmp_path / "t.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode == 2 and "t.npy" in r.stderr and "4 bytes after the data" in r.stderr
    assert not (tmp_path / "o.npy").exists()


@pytest.mark.parametrize("shape", [(2**60 + 1, 16), (2**62 + 2, 4), (2**61, 16), (2**31, 2**31, 2**2)])
def test_overflowing_shape_is_refused(tmp_path, shape):
    # (2^60 + 1) * 16 wraps to 16 elements in 64 bits: the 64 data bytes would "match" the shape.
    data = np.arange(16, dtype="<f4").tobytes()
    (tmp_path / "big.npy").write_bytes(npy_cases.npy_bytes(npy_cases.header(shape=str(shape)), data))
    r = run(["quantize", "--format", "fp16", str(tmp_path / "big.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode == 2 and "big.npy" in r.stderr and "more than 2^63 bytes" in r.stderr, r.stderr
    assert not (tmp_path / "o.npy").exists() and temporaries(tmp_path) == []


def test_empty_and_zero_dimensional_arrays_are_refused(tmp_path):
    for name, a in [("zero_d", np.array(1.5, np.float32)), ("empty", np.zeros((0, 16), np.float32))]:
        np.save(tmp_path / f"{name}.npy", a)
        r = run(["quantize", str(tmp_path / f"{name}.npy"), str(tmp_path / "o.npy")], check=False)
        assert r.returncode == 2 and f"{name}.npy" in r.stderr and "expected a non-empty array" in r.stderr


def test_big_endian_and_fortran_inputs_read_as_numpy_does(tmp_path):
    x = np.random.default_rng(SEED + 9).standard_normal((3, 32)).astype(np.float32)
    np.save(tmp_path / "c.npy", x)
    np.save(tmp_path / "be.npy", x.astype(">f4"))
    np.save(tmp_path / "f.npy", np.asfortranarray(x))
    run(["quantize", "--format", "nvfp4", str(tmp_path / "c.npy"), str(tmp_path / "oc.npy")])
    for name in ("be", "f"):
        run(["quantize", "--format", "nvfp4", str(tmp_path / f"{name}.npy"), str(tmp_path / f"o{name}.npy")])
        assert np.array_equal(np.load(tmp_path / f"o{name}.npy").view(np.uint32),
                              np.load(tmp_path / "oc.npy").view(np.uint32)), name


def test_nonfinite_inputs_are_counted(tmp_path):
    x = np.random.default_rng(SEED + 10).standard_normal((2, 16)).astype(np.float32)
    x[0, 3], x[1, 0] = np.nan, np.inf
    np.save(tmp_path / "in.npy", x)
    r = run(["quantize", "--format", "nvfp4", str(tmp_path / "in.npy"), str(tmp_path / "o.npy")])
    assert "2 non-finite inputs, 32 non-finite outputs" in r.stderr  # both blocks are poisoned (README)


# ---- outputs: validated before any is written, all or none, never silently replaced (defect 11) ---

def make_input(tmp_path, shape=(4, 64)):
    x = np.random.default_rng(SEED + 11).standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "in.npy", x)
    return str(tmp_path / "in.npy")


def test_existing_output_is_kept_without_force(tmp_path):
    src = make_input(tmp_path)
    (tmp_path / "o.npy").write_bytes(b"previous result")
    r = run(["quantize", src, str(tmp_path / "o.npy")], check=False)
    assert r.returncode == 2 and "o.npy" in r.stderr and "use --force" in r.stderr
    assert (tmp_path / "o.npy").read_bytes() == b"previous result"
    run(["quantize", "--force", src, str(tmp_path / "o.npy")])
    assert np.load(tmp_path / "o.npy").shape == (4, 64)


def test_scales_error_comes_before_any_output(tmp_path):
    src = make_input(tmp_path)
    r = run(["quantize", "--format", "e4m3", "--scales", str(tmp_path / "s.npy"), src, str(tmp_path / "o.npy")],
            check=False)
    assert r.returncode == 2 and "--scales" in r.stderr and "only nvfp4 and fp8b128" in r.stderr
    r = run(["quantize", "--format", "fp8b128", "--tensor-scale", str(tmp_path / "t.npy"), src,
             str(tmp_path / "o.npy")], check=False)
    assert r.returncode == 2 and "--tensor-scale" in r.stderr and "only nvfp4" in r.stderr
    # A later output that exists stops the run before OUT is written.
    (tmp_path / "c.npy").write_bytes(b"keep")
    r = run(["quantize", "--codes", str(tmp_path / "c.npy"), src, str(tmp_path / "o.npy")], check=False)
    assert r.returncode == 2 and "--codes" in r.stderr and "c.npy" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy", "in.npy"]


def test_bad_output_paths(tmp_path):
    src = make_input(tmp_path)
    (tmp_path / "dir.npy").mkdir()
    checks = [
        ([src, str(tmp_path / "dir.npy")], ["OUT", "dir.npy", "is a directory"]),
        ([src, str(tmp_path / "missing" / "o.npy")], ["OUT", "missing", "does not exist"]),
        (["--force", src, src], ["OUT", "in.npy", "is the input"]),
        (["--codes", str(tmp_path / "o.npy"), src, str(tmp_path / "o.npy")], ["--codes", "the same file as OUT"]),
    ]
    for args, words in checks:
        r = run(["quantize", *args], check=False)
        assert r.returncode == 2 and all(w in r.stderr for w in words), (args, r.stderr)
    r = run(["quantize", str(tmp_path / "dir.npy"), str(tmp_path / "o.npy")], check=False)
    assert r.returncode != 0 and "dir.npy" in r.stderr
    assert np.array_equal(np.load(src), np.random.default_rng(SEED + 11).standard_normal((4, 64)).astype(np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.npy", "in.npy"]


def limit_file_size(nbytes):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def test_file_size_limit_leaves_no_temporary_and_keeps_the_old_output(tmp_path):
    src = make_input(tmp_path, (64, 256))  # 64 KiB of output
    (tmp_path / "o.npy").write_bytes(b"previous result")
    r = subprocess.run([replayssm_binary(), "quantize", "--force", "--codes", str(tmp_path / "c.npy"), src,
                        str(tmp_path / "o.npy")], capture_output=True, text=True, preexec_fn=limit_file_size(20000))
    assert r.returncode == 2 and "o.npy" in r.stderr and "file size limit" in r.stderr, r.stderr
    assert (tmp_path / "o.npy").read_bytes() == b"previous result"
    assert not (tmp_path / "c.npy").exists() and temporaries(tmp_path) == []


def test_temporary_of_a_killed_run_is_removed(tmp_path):
    src = make_input(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".o.npy.tmp-{dead.pid}"
    other = tmp_path / f".o.npy.2.tmp-{dead.pid}"  # another output's temporary: not ours to remove
    live = tmp_path / f".o.npy.tmp-{os.getpid()}"  # a live writer's
    for p in (stale, other, live):
        p.write_bytes(b"partial")
    r = run(["quantize", src, str(tmp_path / "o.npy")])
    assert f"removed {stale}" in r.stderr and "interrupted run" in r.stderr
    assert not stale.exists() and other.exists() and live.exists()
    assert np.load(tmp_path / "o.npy").shape == (4, 64)
