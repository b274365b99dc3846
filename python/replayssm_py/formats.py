"""An independent model of replayssm's number formats in numpy + ml_dtypes, written only to check
the C++/CUDA library bit for bit (the golden file, `replayssm quantize`).

The element conversions fp16, bf16, FP8 E4M3 ("fn") and FP4 E2M1, the NVFP4 container (blocks of 16,
E4M3 block scale, FP32 tensor scale; NVIDIA Transformer Engine recipe, multiply-by-reciprocal form)
and the FP8 block-128 container (E4M3 elements, FP32 scale per 128 elements), each with
round-to-nearest-even (``rtn``) and the project's stochastic rounding (``sr``: Philox4x32-10 word 0
keyed by (seed, stream, flat index), "add 32 random bits below the kept bits and truncate"). The
definitions are those of ``shared/spec/FORMATS.md`` plus the project's choices:

* NVFP4 global amax is taken over the finite elements only; a block holding
  any NaN or +-inf is "poisoned": block scale code 0x7F (E4M3 NaN), element
  codes 0, decoded values NaN.  A block whose E4M3 scale rounds to 0 gets
  enc = FLT_MAX (1/0 clamped), so its codes saturate to +-6 (0 stays 0) and
  it decodes to signed zeros.
* FP8 block-128: s = amax / 448, s = 1 when that is 0 (all-zero block or
  underflow); a poisoned block gets s = NaN (bits 0x7FC00000), codes 0x7F,
  decoded NaN.
* SR of NaN and of |y| >= max of the format is RTN (saturating as RTN does).

All scale arithmetic is done in IEEE float32 (numpy float32 scalars/arrays: every ``*`` and ``/``
rounds once, no fused operations, no flush-to-zero of float32 subnormals).
"""
import ml_dtypes
import numpy as np

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
