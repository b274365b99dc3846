#!/usr/bin/env python3
"""Generate the bit-exact golden vectors for replayssm's number formats.

What it does
------------
Writes ``data/goldens/formats_v1.json``: inputs (float32 bit patterns) and the
expected outputs (element codes, packed bytes, block scales, tensor scale,
decoded float32 bit patterns) of

* the element conversions fp16, bf16, FP8 E4M3 ("fn") and FP4 E2M1,
* the NVFP4 container (blocks of 16, E4M3 block scale, FP32 tensor scale;
  NVIDIA Transformer Engine recipe, multiply-by-reciprocal form),
* the FP8 block-128 container (E4M3 elements, FP32 scale per 128 elements),

each with round-to-nearest-even (``rtn``) and with the project's stochastic
rounding (``sr``: Philox4x32-10 word 0 keyed by (seed, stream, flat index),
"add 32 random bits below the kept bits and truncate").  The definitions are
those of ``shared/spec/FORMATS.md`` plus the project's choices written out in
the functions below (non-finite blocks are "poisoned", all-zero FP8 blocks get
scale 1, ...).

Project choices fixed here:

* NVFP4 global amax is taken over the finite elements only; a block holding
  any NaN or +-inf is "poisoned": block scale code 0x7F (E4M3 NaN), element
  codes 0, decoded values NaN.  A block whose E4M3 scale rounds to 0 gets
  enc = FLT_MAX (1/0 clamped), so its codes saturate to +-6 (0 stays 0) and
  it decodes to signed zeros.
* FP8 block-128: s = amax / 448, s = 1 when that is 0 (all-zero block or
  underflow); a poisoned block gets s = NaN (bits 0x7FC00000), codes 0x7F,
  decoded NaN.
* SR of NaN and of |y| >= max of the format is RTN (saturating as RTN does).

This is an independent implementation in numpy + ml_dtypes, written only to
check the C++/CUDA library bit for bit.  All scale arithmetic is done in IEEE
float32 (numpy float32 scalars/arrays: every ``*`` and ``/`` rounds once, no
fused operations, no flush-to-zero of float32 subnormals).

Output conventions
------------------
* every float32 value is written as its uint32 bit pattern;
* every NaN in ``decoded_bits`` is written as the canonical quiet NaN
  0x7FC00000 (the definitions fix only that the value is NaN, not its sign or
  payload: compare decoded NaNs by NaN-ness);
* ``codes`` are unsigned element codes, one per element, row-major;
  ``packed`` (NVFP4 only) holds two E2M1 codes per byte, element 2i in the low
  nibble; ``block_scales`` holds E4M3 codes (NVFP4) or float32 bits (FP8
  block-128); ``tensor_scale_bits`` (NVFP4 only) is the float32 S_dec;
* ``seed`` and ``stream`` are present in every case (used only by ``sr``);
  the SR random word of element ``index`` is
  ``philox4x32_10(ctr=[index lo, index hi, stream lo, stream hi],
  key=[seed lo, seed hi])[0]``.
* the input data come from ``numpy.random.RandomState(NUMPY_SEED)`` (the legacy
  generator, whose streams numpy keeps stable across versions).

How to regenerate
-----------------
    python3 scripts/make_format_goldens.py                # writes data/goldens/formats_v1.json
    python3 scripts/make_format_goldens.py -o OTHER.json  # writes elsewhere

The output is deterministic; ``tests/python/test_format_goldens_script.py``
checks that the committed file equals a fresh regeneration.
"""

import argparse
import json
import os
import sys

import ml_dtypes
import numpy as np

NUMPY_SEED = 20250611
FORMAT_VERSION = 1
GENERATOR = "scripts/make_format_goldens.py"

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
CANONICAL_NAN_BITS = 0x7FC00000
MASK32 = np.uint64(0xFFFFFFFF)

# --------------------------------------------------------------------------
# Philox4x32-10 (Random123 definition)
# --------------------------------------------------------------------------
PHILOX_M0 = np.uint64(0xD2511F53)
PHILOX_M1 = np.uint64(0xCD9E8D57)
PHILOX_W0 = np.uint64(0x9E3779B9)
PHILOX_W1 = np.uint64(0xBB67AE85)


def philox4x32_10(ctr, key):
    """Philox4x32-10 on arrays.

    ctr: array-like (..., 4) of uint32 words, key: array-like (..., 2) of
    uint32 words (broadcast against each other).  Returns (..., 4) uint32.
    """
    ctr = np.asarray(ctr, dtype=np.uint64)
    key = np.asarray(key, dtype=np.uint64)
    c0, c1, c2, c3 = (ctr[..., i] & MASK32 for i in range(4))
    k0, k1 = key[..., 0] & MASK32, key[..., 1] & MASK32
    for rnd in range(10):
        if rnd:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        p0 = PHILOX_M0 * c0  # < 2^64: exact in uint64
        p1 = PHILOX_M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def sr_random_words(seed, stream, indices):
    """The project's SR random word (uint32) for each element index."""
    idx = np.asarray(indices, dtype=np.uint64)
    seed = int(seed)
    stream = int(stream)
    ctr = np.empty(idx.shape + (4,), dtype=np.uint64)
    ctr[..., 0] = idx & MASK32
    ctr[..., 1] = idx >> np.uint64(32)
    ctr[..., 2] = stream & 0xFFFFFFFF
    ctr[..., 3] = stream >> 32
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint64)
    return philox4x32_10(ctr, key)[..., 0]


# --------------------------------------------------------------------------
# float32 helpers
# --------------------------------------------------------------------------
def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bits32(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def f32_sign(x):
    return (bits32(x) >> np.uint32(31)).astype(np.uint32)


# --------------------------------------------------------------------------
# RTN element encoders: float32 array -> uint32 code array
# --------------------------------------------------------------------------
def rtn_fp16(x):
    """IEEE half, RNE; overflow -> +-inf; any NaN -> 0x7FFF."""
    x = np.asarray(x, dtype=np.float32)
    nan = np.isnan(x)
    with np.errstate(over="ignore", invalid="ignore"):
        codes = np.where(nan, F32(0), x).astype(np.float16).view(np.uint16).astype(np.uint32)
    codes[nan] = 0x7FFF
    return codes


def rtn_bf16(x):
    """bfloat16, RNE; overflow -> +-inf; any NaN -> 0x7FFF."""
    x = np.asarray(x, dtype=np.float32)
    nan = np.isnan(x)
    with np.errstate(over="ignore", invalid="ignore"):
        codes = np.where(nan, F32(0), x).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
    codes[nan] = 0x7FFF
    return codes


def rtn_e4m3(x):
    """FP8 E4M3fn, RNE, saturating to +-448; any NaN -> 0x7F (CUDA's float path canonicalises NaN)."""
    x = np.asarray(x, dtype=np.float32)
    nan = np.isnan(x)
    xc = np.clip(np.where(nan, F32(0), x), F32(-448), F32(448)).astype(np.float32)
    codes = xc.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).astype(np.uint32)
    codes[nan] = 0x7F
    return codes


def rtn_e2m1(x):
    """FP4 E2M1, RNE, saturating to +-6; any NaN -> +6 (code 0x7)."""
    x = np.asarray(x, dtype=np.float32)
    nan = np.isnan(x)
    xc = np.clip(np.where(nan, F32(0), x), F32(-6), F32(6)).astype(np.float32)
    codes = (xc.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & np.uint8(0xF)).astype(np.uint32)
    codes[nan] = 0x7
    return codes


# --------------------------------------------------------------------------
# decoders: code array -> float32 array (NaN codes -> NaN)
# --------------------------------------------------------------------------
def decode_fp16(codes):
    return np.asarray(codes, dtype=np.uint16).view(np.float16).astype(np.float32)


def decode_bf16(codes):
    return f32(np.asarray(codes, dtype=np.uint32) << np.uint32(16))


def decode_e4m3(codes):
    return np.asarray(codes, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_VALUES = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES]).astype(np.float32)


def decode_e2m1(codes):
    return E2M1_VALUES[np.asarray(codes, dtype=np.int64) & 0xF]


# --------------------------------------------------------------------------
# magnitude tables: table[m] = value of magnitude code m (finite, >= 0)
# --------------------------------------------------------------------------
def _table_fp16():
    return np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)


def _table_bf16():
    return f32(np.arange(0x7F80, dtype=np.uint32) << np.uint32(16)).astype(np.float64)


def _table_e4m3():
    return np.arange(0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _table_e2m1():
    return E2M1_MAGNITUDES.astype(np.float64)


class Fmt:
    def __init__(self, name, nbits, rtn, decode, table):
        self.name = name
        self.nbits = nbits
        self.rtn = rtn
        self.decode = decode
        self.table = table
        self.max = table[-1]


FORMATS = {
    "fp16": Fmt("fp16", 16, rtn_fp16, decode_fp16, _table_fp16()),
    "bf16": Fmt("bf16", 16, rtn_bf16, decode_bf16, _table_bf16()),
    "e4m3": Fmt("e4m3", 8, rtn_e4m3, decode_e4m3, _table_e4m3()),
    "e2m1": Fmt("e2m1", 4, rtn_e2m1, decode_e2m1, _table_e2m1()),
}
for _f in FORMATS.values():  # the tables must be strictly increasing
    assert np.all(np.diff(_f.table) > 0), _f.name


# --------------------------------------------------------------------------
# stochastic rounding
# --------------------------------------------------------------------------
def sr_encode(fmt, y, r):
    """Stochastically round float32 y to format fmt with uint32 random words r.

    NaN and |y| >= max: as RTN.  Otherwise lo <= |y| < hi are adjacent
    magnitudes of the format; hi iff r + floor(frac * 2^32) >= 2^32 with
    frac = (|y| - lo) / (hi - lo) (exact in float64).  Sign kept (also on 0).
    """
    F = FORMATS[fmt]
    y = np.asarray(y, dtype=np.float32)
    r = np.asarray(r, dtype=np.uint64)
    codes = F.rtn(y)
    with np.errstate(invalid="ignore"):
        a = np.abs(y.astype(np.float64))
    m = np.isfinite(a) & (a < F.max)
    am = a[m]
    idx = np.searchsorted(F.table, am, side="right")  # table[idx-1] <= am < table[idx]
    lo = F.table[idx - 1]
    hi = F.table[idx]
    frac = (am - lo) / (hi - lo)
    t = np.floor(frac * 2.0**32).astype(np.uint64)
    up = (r[m] + t) >= np.uint64(2**32)
    mag = np.where(up, idx, idx - 1).astype(np.uint32)
    codes[m] = (f32_sign(y)[m] << np.uint32(F.nbits - 1)) | mag
    return codes


def encode(fmt, y, rounding, seed=0, stream=0, indices=None):
    y = np.asarray(y, dtype=np.float32)
    if rounding == "rtn":
        return FORMATS[fmt].rtn(y)
    if rounding == "sr":
        if indices is None:
            indices = np.arange(y.size, dtype=np.uint64).reshape(y.shape)
        return sr_encode(fmt, y, sr_random_words(seed, stream, indices))
    raise ValueError(rounding)


# --------------------------------------------------------------------------
# block-scaled containers
# --------------------------------------------------------------------------
def quantize_nvfp4(x, rounding, seed=0, stream=0, block=16):
    """NVFP4, Transformer Engine recipe (reciprocal form), non-finite blocks poisoned."""
    x = np.asarray(x, dtype=np.float32)
    assert x.ndim == 2 and x.shape[1] % block == 0
    fin = np.isfinite(x)
    global_amax = F32(np.max(np.abs(x[fin]))) if fin.any() else F32(0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore", under="ignore"):
        s_enc = F32(448 * 6) / global_amax if global_amax != 0 else F32(np.inf)
        s_enc = min(F32(s_enc), FLT_MAX)
        if global_amax == 0 or s_enc == 0:
            s_enc = F32(1.0)
        s_enc = F32(s_enc)
        s_dec = F32(F32(1.0) / s_enc)

        xb = x.reshape(-1, block)
        poisoned = ~np.all(np.isfinite(xb), axis=1)
        xb_safe = np.where(poisoned[:, None], F32(0), xb).astype(np.float32)
        bamax = np.max(np.abs(xb_safe), axis=1).astype(np.float32)
        s_enc_6 = F32(s_enc * F32(1.0 / 6.0))
        scale_codes = rtn_e4m3(bamax * s_enc_6)
        sb = decode_e4m3(scale_codes)
        enc = np.minimum(F32(1.0) / (sb * s_dec), FLT_MAX).astype(np.float32)
        y = (xb_safe * enc[:, None]).astype(np.float32)
        indices = np.arange(x.size, dtype=np.uint64).reshape(xb.shape)
        codes = encode("e2m1", y, rounding, seed, stream, indices)
        decoded = ((decode_e2m1(codes) * sb[:, None]).astype(np.float32) * s_dec).astype(np.float32)

    scale_codes[poisoned] = 0x7F
    codes[poisoned, :] = 0
    decoded[poisoned, :] = np.nan
    codes = codes.reshape(-1)
    packed = (codes[0::2] | (codes[1::2] << np.uint32(4))).astype(np.uint32)
    return {
        "codes": codes,
        "packed": packed,
        "block_scales": scale_codes.astype(np.uint32),
        "tensor_scale_bits": int(bits32(s_dec)),
        "decoded": decoded.reshape(-1),
    }


def quantize_fp8b128(x, rounding, seed=0, stream=0, block=128):
    """FP8 block-128: s = amax/448 (s=1 if 0), codes e4m3(x * min(1/s, FLT_MAX))."""
    x = np.asarray(x, dtype=np.float32)
    assert x.ndim == 2 and x.shape[1] % block == 0
    with np.errstate(divide="ignore", over="ignore", invalid="ignore", under="ignore"):
        xb = x.reshape(-1, block)
        poisoned = ~np.all(np.isfinite(xb), axis=1)
        xb_safe = np.where(poisoned[:, None], F32(0), xb).astype(np.float32)
        bamax = np.max(np.abs(xb_safe), axis=1).astype(np.float32)
        s = (bamax / F32(448)).astype(np.float32)
        s[s == 0] = F32(1.0)
        inv = np.minimum(F32(1.0) / s, FLT_MAX).astype(np.float32)
        y = (xb_safe * inv[:, None]).astype(np.float32)
        indices = np.arange(x.size, dtype=np.uint64).reshape(xb.shape)
        codes = encode("e4m3", y, rounding, seed, stream, indices)
        decoded = (decode_e4m3(codes) * s[:, None]).astype(np.float32)

    s_bits = bits32(s).copy()
    s_bits[poisoned] = CANONICAL_NAN_BITS
    codes[poisoned, :] = 0x7F
    decoded[poisoned, :] = np.nan
    return {
        "codes": codes.reshape(-1),
        "block_scales": s_bits.astype(np.uint32),
        "decoded": decoded.reshape(-1),
    }


# --------------------------------------------------------------------------
# case construction
# --------------------------------------------------------------------------
SEEDS = [0x0, 0x1234, 0xDEADBEEF, 0x100000000, 0x9E3779B97F4A7C15, 0xFFFFFFFFFFFFFFFF, 42]
STREAMS = [0x0, 0x1, 0x7, 0x100000003, 0xFFFFFFFFFFFFFFFF, 0xABCDEF0123]


def _decoded_bits(decoded):
    b = bits32(np.asarray(decoded, dtype=np.float32)).astype(np.uint32).copy()
    b[np.isnan(decoded)] = CANONICAL_NAN_BITS
    return b


def _ints(a):
    return [int(v) for v in np.asarray(a).reshape(-1).tolist()]


class CaseBuilder:
    def __init__(self):
        self.cases = []
        self.n_sr = 0

    def _seed_stream(self, rounding):
        if rounding == "rtn":
            return 0, 0
        k = self.n_sr
        self.n_sr += 1
        return SEEDS[k % len(SEEDS)], STREAMS[(5 * k + 1) % len(STREAMS)]

    def element(self, name, fmt, x):
        x = np.asarray(x, dtype=np.float32).reshape(1, -1)
        for rounding in ("rtn", "sr"):
            seed, stream = self._seed_stream(rounding)
            codes = encode(fmt, x, rounding, seed, stream)
            decoded = FORMATS[fmt].decode(codes)
            self.cases.append({
                "name": f"{name}_{rounding}", "kind": "element", "format": fmt,
                "rounding": rounding, "seed": seed, "stream": stream,
                "rows": int(x.shape[0]), "cols": int(x.shape[1]),
                "input_bits": _ints(bits32(x)),
                "codes": _ints(codes),
                "decoded_bits": _ints(_decoded_bits(decoded)),
            })

    def container(self, name, kind, x):
        x = np.asarray(x, dtype=np.float32)
        assert x.ndim == 2
        for rounding in ("rtn", "sr"):
            seed, stream = self._seed_stream(rounding)
            if kind == "nvfp4":
                q = quantize_nvfp4(x, rounding, seed, stream)
            else:
                q = quantize_fp8b128(x, rounding, seed, stream)
            case = {
                "name": f"{name}_{rounding}", "kind": kind, "format": kind,
                "rounding": rounding, "seed": seed, "stream": stream,
                "rows": int(x.shape[0]), "cols": int(x.shape[1]),
                "input_bits": _ints(bits32(x)),
                "codes": _ints(q["codes"]),
            }
            if kind == "nvfp4":
                case["packed"] = _ints(q["packed"])
            case["block_scales"] = _ints(q["block_scales"])
            if kind == "nvfp4":
                case["tensor_scale_bits"] = q["tensor_scale_bits"]
            case["decoded_bits"] = _ints(_decoded_bits(q["decoded"]))
            self.cases.append(case)


SPECIAL_BITS = np.array([
    0x00000000, 0x80000000,              # +-0
    0x7F800000, 0xFF800000,              # +-inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA00000,  # NaNs
    0x00000001, 0x80000001, 0x00000002, 0x007FFFFF, 0x807FFFFF, 0x00400000, 0x80400000,  # subnormals
    0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF,  # FLT_MIN, FLT_MAX
    0x3F800000, 0xBF800000,
], dtype=np.uint32)


def _nextafter_both(v):
    v = np.asarray(v, dtype=np.float32)
    return np.concatenate([v, np.nextafter(v, F32(np.inf)), np.nextafter(v, F32(-np.inf))]).astype(np.float32)


def _with_signs(v):
    v = np.asarray(v, dtype=np.float32)
    return np.concatenate([v, -v]).astype(np.float32)


def element_inputs(fmt, rng, n_target):
    """Special values, representables, ties (+-1 ulp), near-max values, random data."""
    F = FORMATS[fmt]
    tab = F.table
    parts = [f32(SPECIAL_BITS)]
    # representable magnitudes (all for the small formats, a sample for fp16/bf16)
    if len(tab) <= 256:
        sel = np.arange(len(tab))
    else:
        sel = np.unique(np.concatenate([
            np.arange(0, 12), np.arange(len(tab) - 12, len(tab)),
            rng.randint(0, len(tab), size=120)]))
    mids_idx = sel[sel + 1 < len(tab)]
    parts.append(_with_signs(tab[sel].astype(np.float32)))
    mids = ((tab[mids_idx] + tab[mids_idx + 1]) / 2).astype(np.float32)  # exact in float32
    assert np.all(mids.astype(np.float64) == (tab[mids_idx] + tab[mids_idx + 1]) / 2)
    parts.append(_with_signs(_nextafter_both(mids)))
    # half of the smallest subnormal (tie to zero), and around max
    beyond = {"fp16": 65536.0, "bf16": float(2.0**128), "e4m3": 512.0, "e2m1": 8.0}[fmt]
    near_max = np.array([tab[1] / 2, tab[1] / 4, F.max, (F.max + beyond) / 2, beyond,
                         F.max * 1.5, F.max * 4], dtype=np.float64)
    with np.errstate(over="ignore"):
        near_max = near_max.astype(np.float32)
    near_max = near_max[np.isfinite(near_max)]
    if fmt == "e4m3":  # (448, 464]: saturates to 448 (464 is the RNE tie with the NaN slot 480)
        near_max = np.concatenate([near_max, np.float32([456, 464])])
    parts.append(_with_signs(_nextafter_both(near_max)))
    # the same non-representable value many times (shows the SR spread)
    rep = {"fp16": 1.0 + 2.0**-12, "bf16": 1.0 + 2.0**-9 + 2.0**-11, "e4m3": 0.3, "e2m1": 1.3}[fmt]
    parts.append(np.full(48, rep, dtype=np.float32))
    parts.append(np.full(16, -2.6 if fmt == "e2m1" else -rep * 3, dtype=np.float32))
    base = np.concatenate(parts).astype(np.float32)
    n_rest = max(n_target - base.size, 200)
    scales = {"fp16": [1e-6, 1.0, 1e3, 3e4], "bf16": [1e-30, 1.0, 1e30, 1e38],
              "e4m3": [1e-2, 1.0, 100.0, 300.0], "e2m1": [0.3, 1.0, 2.0, 4.0]}[fmt]
    per = n_rest // (len(scales) + 2)
    rnd = [rng.standard_normal(per) * s for s in scales]
    rnd.append(rng.uniform(-1.1 * F.max, 1.1 * F.max, per))
    with np.errstate(over="ignore"):
        rnd = [r.astype(np.float32) for r in rnd]
    rb = rng.randint(0, 2**32, size=n_rest - per * (len(scales) + 1), dtype=np.uint64).astype(np.uint32)
    rnd.append(f32(rb))
    return np.concatenate([base] + rnd).astype(np.float32)


def _normal(rng, shape, scale):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _subnormals(rng, shape):
    bits = rng.randint(1, 0x00800000, size=shape).astype(np.uint32)
    bits |= (rng.randint(0, 2, size=shape).astype(np.uint32) << np.uint32(31))
    return f32(bits).copy()


def container_inputs(kind, rng):
    """(name, matrix) pairs for one container kind."""
    B = 16 if kind == "nvfp4" else 128
    top = F32(448 * 6) if kind == "nvfp4" else F32(448)
    if kind == "nvfp4":
        s_small, s_mid, s_big = (2, 32), (3, 128), (4, 256)
    else:
        s_small, s_mid, s_big = (2, 128), (3, 128), (4, 256)
    out = []
    out.append(("normal_1e-3", _normal(rng, s_mid, 1e-3)))
    out.append(("normal_1", _normal(rng, s_big, 1.0)))
    out.append(("normal_1e3", _normal(rng, s_small, 1e3)))
    out.append(("normal_1e30", _normal(rng, s_mid, 1e30)))
    out.append(("normal_1e-30", _normal(rng, s_mid, 1e-30)))

    x = (rng.standard_t(2, size=s_big)).astype(np.float32)
    pos = rng.choice(x.size, size=5, replace=False)
    x.reshape(-1)[pos] = (rng.choice([-1, 1], size=5) * 10.0 ** rng.uniform(3, 6, size=5)).astype(np.float32)
    out.append(("heavy_tail", x))

    out.append(("all_zero", np.zeros(s_small, dtype=np.float32)))

    x = _normal(rng, (4, 256), 1.0)
    x[1, 0:B] = 0.0                                   # an all +0 block
    x[2, B:2 * B] = -0.0                              # an all -0 block
    x[3, 0:B] = np.where(rng.randint(0, 2, size=B) == 1, F32(0.0), F32(-0.0))  # mixed +-0
    out.append(("zero_blocks_inside", x))

    x = _normal(rng, s_small, 2.0)
    mask = rng.randint(0, 4, size=s_small) == 0
    x[mask] = -0.0
    out.append(("neg_zero", x))

    x = _normal(rng, s_mid, 1.0)
    mask = rng.randint(0, 5, size=s_mid) == 0
    x[mask] = _subnormals(rng, s_mid)[mask]
    x[2, :B] = _subnormals(rng, (B,))  # one block entirely subnormal
    out.append(("subnormal_mixed", x))
    out.append(("all_subnormal", _subnormals(rng, s_small)))

    # block amax exactly at the top of the scale range, plus values at ties
    if kind == "nvfp4":
        # global amax 2688 -> S_enc = 1; blocks with amax 6 -> block scale 1, enc 1
        ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.5, 3.0, 6.0, 4.5, 0.125, 5.5, 2.25, 0.0],
                        dtype=np.float32)
        x = np.zeros((2, 32), dtype=np.float32)
        x[0, :16] = ties
        x[0, 16:32] = -ties
        x[1, :16] = rng.standard_normal(16).astype(np.float32) * 500
        x[1, 3] = 2688.0
        x[1, 16:32] = np.concatenate([np.nextafter(ties[:8], F32(np.inf)),
                                      np.nextafter(ties[:8], F32(-np.inf))])
        x[1, 16 + 10] = 6.0
        out.append(("amax_2688_ties", x))
        x = _normal(rng, (3, 128), 100.0)
        x[0, 5] = -2688.0
        # blocks whose amax makes amax/6 land on / next to an E4M3 tie
        # block amax 6.375 -> 1.0625 (E4M3 tie), 7.125 -> 1.1875 (tie), 0.0703125 -> 6 * 2^-9
        # (subnormal E4M3 scale), 448 -> 74.67
        for j, bm in enumerate([6.375, 6.75, 7.125, 4.6875, 13.5, 27.0, 448.0, 0.0703125]):
            blk = x[1, 16 * j:16 * (j + 1)]
            blk *= F32(bm) / np.max(np.abs(blk))
            blk[np.argmax(np.abs(blk))] = F32(bm)
        out.append(("amax_2688_scale_ties", x))
    else:
        # blocks of amax exactly 448 -> s = 1, elements at E4M3 ties
        e4 = FORMATS["e4m3"].table
        mids = ((e4[:-1] + e4[1:]) / 2).astype(np.float32)  # 126 ties
        x = np.zeros((2, 256), dtype=np.float32)
        x[0, :126] = mids
        x[0, 126] = 448.0
        x[0, 127] = -0.0
        x[0, 128:254] = -mids
        x[0, 254] = -448.0
        x[0, 255] = 464.0 / 2
        x[1, :128] = np.nextafter(np.concatenate([mids, [448, 448]]).astype(np.float32), F32(np.inf))
        x[1, 126] = 448.0
        x[1, 127] = 448.0
        x[1, 128:256] = np.nextafter(np.concatenate([mids, [1, 448]]).astype(np.float32), F32(-np.inf))
        x[1, 255] = -448.0
        out.append(("amax_448_ties", x))
        # blocks whose amax is 448 * 2^k (exact power-of-two scales) and others
        x = _normal(rng, (3, 128), 1.0)
        for i, bm in enumerate([448 * 2.0**-10, 448 * 2.0**20, 1.0]):
            x[i] *= F32(bm) / np.max(np.abs(x[i]))
            x[i, 7] = F32(bm)
        out.append(("amax_pow2_scales", x))

    # a block much smaller than the global amax (scale underflow / subnormal scale)
    if kind == "nvfp4":
        x = _normal(rng, (2, 128), 1.0)
        x[0, 0] = 2688.0
        for j, bm in enumerate([1e-4, 1e-3, 2e-3, 5e-3, 0.0117, 0.02, 1e-6, 3e-38]):
            blk = x[1, 16 * j:16 * (j + 1)]
            blk *= F32(bm) / np.max(np.abs(blk))
        x[0, 16:32] *= F32(1e-5)
        out.append(("tiny_block_scale_underflow", x))
    else:
        x = _normal(rng, (1, 768), 1.0)
        # amax 1e-40: s subnormal, 1/s overflows; 1e-44, 1e-43: s underflows to 0 -> 1;
        # 3e-38: s subnormal, 1/s overflows; 1.5e-36: s subnormal, 1/s finite
        for j, bm in enumerate([1e3, 1e-40, 1e-44, 3e-38, 1e-43, 1.5e-36]):
            blk = x[0, 128 * j:128 * (j + 1)]
            blk *= F32(bm) / np.max(np.abs(blk))
            if bm < 1e-38:  # float32-subnormal block with amax exactly F32(bm)
                top_bits = int(bits32(F32(bm)))
                b = rng.randint(1, top_bits + 1, size=128).astype(np.uint32)
                b |= rng.randint(0, 2, size=128).astype(np.uint32) << np.uint32(31)
                blk[:] = f32(b)
                blk[3] = F32(bm)
        out.append(("tiny_block_scales", x))

    # NaN, +inf, -inf
    x = _normal(rng, (4, 256), 3.0)
    x[0, 1] = np.nan
    x[0, 5] = np.inf
    x[0, 9] = -np.inf                        # NaN, +inf, -inf in one block
    x[1, B + 2] = np.nan                     # a NaN alone
    x[2, 2 * B - 1] = -np.inf                # -inf alone (last element of a block)
    x[3, 0] = f32(np.uint32(0xFFC00001))     # a negative NaN with payload, first of a block
    x[3, 255] = np.inf                       # +inf alone, last element of the matrix
    out.append(("nonfinite", x))
    x = np.full(s_small, np.nan, dtype=np.float32)
    x[0, 0] = np.inf
    out.append(("all_nonfinite", x))

    # huge values (global amax FLT_MAX) and a tiny normal global amax
    x = _normal(rng, s_small, 1e37)
    x[0, 0] = FLT_MAX
    x[1, 1] = -FLT_MAX
    out.append(("huge_flt_max", x))
    x = _normal(rng, s_small, 1e-37)
    out.append(("tiny_global_amax", x))
    return out


def build_cases():
    rng = np.random.RandomState(NUMPY_SEED)
    cb = CaseBuilder()
    for fmt in ("fp16", "bf16", "e4m3", "e2m1"):
        cb.element(f"elem_{fmt}_mixed", fmt, element_inputs(fmt, rng, 2000))
    for kind in ("nvfp4", "fp8b128"):
        for name, x in container_inputs(kind, rng):
            cb.container(f"{kind}_{name}", kind, x)
    return cb.cases


def render(cases):
    head = {
        "format_version": FORMAT_VERSION,
        "generator": GENERATOR,
        "numpy_version": np.__version__,
        "ml_dtypes_version": ml_dtypes.__version__,
        "numpy_seed": NUMPY_SEED,
    }
    lines = ["{"]
    for k, v in head.items():
        lines.append(f"{json.dumps(k)}: {json.dumps(v)},")
    lines.append('"cases": [')
    for i, c in enumerate(cases):
        lines.append(json.dumps(c, separators=(",", ":")) + ("," if i + 1 < len(cases) else ""))
    lines.append("]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def default_output():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "goldens", "formats_v1.json")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=default_output(), help="output path (default data/goldens/formats_v1.json)")
    args = ap.parse_args(argv)
    cases = build_cases()
    text = render(cases)
    out = os.path.normpath(args.output)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w", encoding="ascii", newline="\n") as f:
        f.write(text)
    print(f"wrote {out}: {len(cases)} cases, {len(text)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
