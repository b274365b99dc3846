"""Checks for replayssm_py.formats (the independent numpy + ml_dtypes model of the number formats)
and the golden file scripts/make_format_goldens.py writes from it.

Run:  python3 -m pytest -q tests/python/test_format_goldens_script.py
"""

import json
import pathlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from replayssm_py import formats as g
from replayssm_py import goldens

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_format_goldens.py"
GOLDEN = ROOT / "data" / "goldens" / "formats_v1.json"
F32 = np.float32


def _random_f32(rng, n):
    """A mix of uniformly random bit patterns and normal data at many scales."""
    bits = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    parts = [bits.view(np.float32)]
    for s in (1e-40, 1e-30, 1e-8, 1e-3, 0.3, 1.0, 7.0, 100.0, 1e3, 6e4, 1e20, 1e38):
        with np.errstate(over="ignore"):  # 1e38 * N(0,1) may overflow to inf: wanted
            parts.append((rng.standard_normal(n // 8) * s).astype(np.float32))
    return np.concatenate(parts)


def _nearest_even_table(fmt, x):
    """Independent RTN by table lookup (nearest magnitude, ties to the even code).

    Only for finite x with |x| <= max of the format.
    """
    F = g.FORMATS[fmt]
    a = np.abs(x.astype(np.float64))
    idx = np.searchsorted(F.table, a, side="left")  # table[idx-1] < a <= table[idx]
    idx = np.clip(idx, 1, len(F.table) - 1)
    lo, hi = F.table[idx - 1], F.table[idx]
    dlo, dhi = a - lo, hi - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (idx % 2 == 0))
    mag = np.where(pick_hi, idx, idx - 1)
    mag = np.where(a == 0, 0, mag)
    sign = (x.view(np.uint32) >> 31).astype(np.int64)
    return ((sign << (F.nbits - 1)) | mag).astype(np.uint32)


# ---------------------------------------------------------------- Philox

@pytest.mark.parametrize("ctr,key,expect", [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
])
def test_philox_known_answers(ctr, key, expect):
    out = g.philox4x32_10(np.array(ctr, dtype=np.uint32), np.array(key, dtype=np.uint32))
    assert out.dtype == np.uint32
    assert [int(v) for v in out] == expect


def test_philox_vectorised_matches_scalar_calls():
    rng = np.random.default_rng(1)
    ctr = rng.integers(0, 2**32, size=(50, 4), dtype=np.uint64)
    key = rng.integers(0, 2**32, size=(50, 2), dtype=np.uint64)
    batch = g.philox4x32_10(ctr, key)
    for i in range(50):
        assert np.array_equal(batch[i], g.philox4x32_10(ctr[i], key[i]))


def test_sr_random_word_layout():
    seed, stream = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    idx = np.array([0, 1, 2**32 - 1, 2**32, 2**40 + 17, 2**64 - 1], dtype=np.uint64)
    r = g.sr_random_words(seed, stream, idx)
    for i, ix in enumerate(idx.tolist()):
        ctr = [ix & 0xFFFFFFFF, ix >> 32, stream & 0xFFFFFFFF, stream >> 32]
        key = [seed & 0xFFFFFFFF, seed >> 32]
        assert int(r[i]) == int(g.philox4x32_10(ctr, key)[0])


# ---------------------------------------------------------------- RTN encoders

def test_fp16_rtn_matches_numpy():
    x = _random_f32(np.random.default_rng(2), 400_000)
    codes = g.rtn_fp16(x)
    nan = np.isnan(x)
    with np.errstate(over="ignore"):
        ref = x[~nan].astype(np.float16).view(np.uint16)
    assert np.array_equal(codes[~nan], ref.astype(np.uint32))
    assert np.all(codes[nan] == 0x7FFF)
    specials = np.array([65504, 65519.99, 65520, 1e9, np.inf, -np.inf, -0.0], dtype=np.float32)
    assert [int(c) for c in g.rtn_fp16(specials)] == [0x7BFF, 0x7BFF, 0x7C00, 0x7C00, 0x7C00, 0xFC00, 0x8000]


def test_bf16_rtn_matches_ml_dtypes():
    x = _random_f32(np.random.default_rng(3), 400_000)
    codes = g.rtn_bf16(x)
    nan = np.isnan(x)
    ref = x[~nan].astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(codes[~nan], ref.astype(np.uint32))
    assert np.all(codes[nan] == 0x7FFF)


def test_e4m3_rtn_matches_ml_dtypes_in_range():
    x = _random_f32(np.random.default_rng(4), 400_000)
    x = x[np.abs(x) <= 448]  # drops NaN too
    x = np.concatenate([x, np.float32([448, -448, 0.0, -0.0, 2.0**-10, -(2.0**-10)])])
    codes = g.rtn_e4m3(x)
    ref = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).astype(np.uint32)
    assert np.array_equal(codes, ref)


def test_e4m3_saturation_and_nan():
    big = np.float32([448.0001, 450, 460, 463.99, 464, 464.01, 480, 1e6, np.inf, 3.4e38])
    assert np.all(g.rtn_e4m3(big) == 0x7E)
    assert np.all(g.rtn_e4m3(-big) == 0xFE)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], dtype=np.uint32).view(np.float32)
    # CUDA's float path canonicalises every NaN to 0x7F (sign dropped).
    assert [int(c) for c in g.rtn_e4m3(nans)] == [0x7F, 0x7F, 0x7F, 0x7F]
    assert int(g.rtn_e4m3(np.float32([-0.0]))[0]) == 0x80


def test_e2m1_rtn_matches_ml_dtypes_non_nan():
    x = _random_f32(np.random.default_rng(5), 400_000)
    x = x[~np.isnan(x)]
    codes = g.rtn_e2m1(x)
    ref = (x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF).astype(np.uint32)
    assert np.array_equal(codes, ref)


def test_e2m1_ties_saturation_nan():
    ties = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.0001, 7.0, 1e30, np.inf])
    expect = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, 6.0]
    assert list(g.decode_e2m1(g.rtn_e2m1(ties))) == expect
    assert list(g.decode_e2m1(g.rtn_e2m1(-ties))) == [-v for v in expect]
    assert int(g.rtn_e2m1(np.float32([-0.0]))[0]) == 0x8
    nans = np.array([0x7FC00000, 0xFFC00000, 0xFFFFFFFF], dtype=np.uint32).view(np.float32)
    assert np.all(g.rtn_e2m1(nans) == 0x7)


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "e4m3", "e2m1"])
def test_rtn_matches_independent_table_rounding(fmt):
    """The cast-based RTN agrees with a nearest-even search in the SR tables."""
    F = g.FORMATS[fmt]
    x = _random_f32(np.random.default_rng(6), 200_000)
    x = x[np.isfinite(x)]
    x = x[np.abs(x.astype(np.float64)) <= F.max]
    mids = ((F.table[:-1] + F.table[1:]) / 2).astype(np.float32)
    x = np.concatenate([x, mids, -mids, F.table.astype(np.float32)])
    assert np.array_equal(F.rtn(x), _nearest_even_table(fmt, x))


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "e4m3", "e2m1"])
def test_decode_roundtrip(fmt):
    F = g.FORMATS[fmt]
    n = 1 << F.nbits
    codes = np.arange(n, dtype=np.uint32)
    vals = F.decode(codes)
    ok = ~np.isnan(vals)
    assert np.array_equal(F.rtn(vals[ok]), codes[ok])


# ---------------------------------------------------------------- SR

@pytest.mark.parametrize("fmt", ["fp16", "bf16", "e4m3", "e2m1"])
def test_sr_returns_a_neighbour_and_keeps_exact_values(fmt):
    F = g.FORMATS[fmt]
    rng = np.random.default_rng(7)
    x = _random_f32(rng, 100_000)
    x = x[np.isfinite(x)]
    x = x[np.abs(x.astype(np.float64)) < F.max]
    r = rng.integers(0, 2**32, size=x.size, dtype=np.uint64).astype(np.uint32)
    codes = g.sr_encode(fmt, x, r)
    v = F.decode(codes).astype(np.float64)
    a = np.abs(x.astype(np.float64))
    idx = np.searchsorted(F.table, a, side="right")
    lo, hi = F.table[idx - 1], F.table[np.minimum(idx, len(F.table) - 1)]
    av = np.abs(v)
    assert np.all((av == lo) | (av == hi))
    assert np.all(np.signbit(v) == np.signbit(x))
    exact = F.table.astype(np.float32)
    exact = np.concatenate([exact, -exact])
    rr = rng.integers(0, 2**32, size=exact.size, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(g.sr_encode(fmt, exact, rr), F.rtn(exact))


def test_sr_threshold_is_exact():
    # e2m1: 1.25 lies between 1 and 1.5, frac = 0.5 -> floor(frac*2^32) = 2^31
    y = np.float32([1.25, 1.25, -1.25, -1.25])
    r = np.array([2**31 - 1, 2**31, 2**31 - 1, 2**31], dtype=np.uint32)
    assert [float(v) for v in g.decode_e2m1(g.sr_encode("e2m1", y, r))] == [1.0, 1.5, -1.0, -1.5]
    # fp16: 1 + 2^-12 lies between 1 and 1 + 2^-10, frac = 1/4
    y = np.float32([1 + 2.0**-12] * 2)
    r = np.array([3 * 2**30 - 1, 3 * 2**30], dtype=np.uint32)
    assert [int(c) for c in g.sr_encode("fp16", y, r)] == [0x3C00, 0x3C01]
    # a value below half the smallest subnormal never rounds up for r < 2^32 - t
    y = np.float32([-(2.0**-149)])
    assert int(g.sr_encode("fp16", y, np.array([2**32 - 1], dtype=np.uint32))[0]) == 0x8000


def test_sr_specials_follow_rtn():
    y = np.array([0x7FC00000, 0xFFC00000, 0x7F800000, 0xFF800000], dtype=np.uint32).view(np.float32)
    y = np.concatenate([y, np.float32([65504, 65510, 65520, 448, 460, 500, 6, 6.5, 1e9, -0.0, 0.0])])
    r = np.full(y.size, 0xFFFFFFFF, dtype=np.uint32)
    for fmt, F in g.FORMATS.items():
        with np.errstate(invalid="ignore"):
            m = np.isnan(y) | (np.abs(y) >= F.max) | (y == 0)
        assert np.array_equal(g.sr_encode(fmt, y[m], r[m]), F.rtn(y[m]))


def test_sr_is_unbiased_statistically():
    n = 200_000
    y = np.full(n, 1.3, dtype=np.float32)  # e2m1: between 1 and 1.5, frac = 0.6 (approx.)
    codes = g.encode("e2m1", y, "sr", seed=123, stream=4)
    v = g.decode_e2m1(codes).astype(np.float64)
    p_hi = np.mean(v == 1.5)
    frac = (np.float64(np.float32(1.3)) - 1.0) / 0.5
    assert abs(p_hi - frac) < 5 * np.sqrt(frac * (1 - frac) / n)
    assert set(np.unique(v).tolist()) == {1.0, 1.5}


# ---------------------------------------------------------------- containers

def test_containers_basic_rules():
    z = np.zeros((2, 32), dtype=np.float32)
    q = g.quantize_nvfp4(z, "rtn")
    assert q["tensor_scale_bits"] == 0x3F800000
    assert np.all(q["block_scales"] == 0) and np.all(q["codes"] == 0)
    q = g.quantize_fp8b128(np.zeros((1, 128), dtype=np.float32), "rtn")
    assert int(q["block_scales"][0]) == 0x3F800000
    x = np.ones((1, 32), dtype=np.float32)
    x[0, 20] = np.nan
    q = g.quantize_nvfp4(x, "sr", seed=1, stream=2)
    assert int(q["block_scales"][1]) == 0x7F and np.all(q["codes"][16:] == 0)
    assert np.all(np.isnan(q["decoded"][16:])) and not np.any(np.isnan(q["decoded"][:16]))
    x = np.ones((1, 256), dtype=np.float32)
    x[0, 3] = -np.inf
    q = g.quantize_fp8b128(x, "rtn")
    assert int(q["block_scales"][0]) == 0x7FC00000 and np.all(q["codes"][:128] == 0x7F)
    assert int(q["block_scales"][1]) == int(np.float32(1 / 448).view(np.uint32))


def test_float32_subnormals_are_not_flushed():
    assert np.float32(1e-45) * np.float32(1.0) != 0
    assert np.float32(1.0) / np.float32(np.finfo(np.float32).max) != 0


# ---------------------------------------------------------------- golden file

def test_golden_file_is_current(tmp_path):
    out = tmp_path / "formats_v1.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "80 cases" in r.stdout and [p.name for p in tmp_path.iterdir()] == ["formats_v1.json"]
    assert GOLDEN.exists(), "run: python3 scripts/make_format_goldens.py"
    new, old = json.loads(out.read_text()), json.loads(GOLDEN.read_text())
    versions = ("numpy_version", "ml_dtypes_version")
    if all(new[k] == old[k] for k in versions):
        assert out.read_bytes() == GOLDEN.read_bytes(), "golden out of date: python3 scripts/make_format_goldens.py"
    else:  # another numpy / ml_dtypes release: the cases (every code and decoded value) must still agree
        assert {k: v for k, v in new.items() if k not in versions} == \
            {k: v for k, v in old.items() if k not in versions}, \
            f"ml_dtypes {new['ml_dtypes_version']} / numpy {new['numpy_version']} give other cases than the golden's " \
            f"{old['ml_dtypes_version']} / {old['numpy_version']}"


def test_golden_file_structure():
    d = json.loads(GOLDEN.read_text())
    assert d["format_version"] == 1 and d["numpy_seed"] == goldens.NUMPY_SEED
    assert d["generator"] == "scripts/make_format_goldens.py"
    assert GOLDEN.stat().st_size < 1_600_000
    names = [c["name"] for c in d["cases"]]
    assert len(names) == len(set(names))
    for c in d["cases"]:
        n = c["rows"] * c["cols"]
        assert len(c["input_bits"]) == n and len(c["codes"]) == n and len(c["decoded_bits"]) == n
        assert c["rounding"] in ("rtn", "sr") and 0 <= c["seed"] < 2**64 and 0 <= c["stream"] < 2**64
        if c["kind"] == "nvfp4":
            codes = c["codes"]
            assert c["packed"] == [codes[2 * i] | (codes[2 * i + 1] << 4) for i in range(n // 2)]
            assert len(c["block_scales"]) == n // 16
        elif c["kind"] == "fp8b128":
            assert len(c["block_scales"]) == n // 128
    seeds = {c["seed"] for c in d["cases"] if c["rounding"] == "sr"}
    streams = {c["stream"] for c in d["cases"] if c["rounding"] == "sr"}
    assert any(s >= 2**32 for s in seeds) and any(s >= 2**32 for s in streams)
