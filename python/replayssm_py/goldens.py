"""Golden data that the C++ tests compare against, each from an implementation independent of ours.

Format goldens (data/goldens/formats_v1.json, written by scripts/make_format_goldens.py): inputs
(float32 bit patterns) and the expected outputs (element codes, packed bytes, block scales, tensor
scale, decoded float32 bit patterns) of every format of replayssm_py.formats, RTN and SR.

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
  generator, whose streams numpy keeps stable across versions), so the file is deterministic.

Model goldens (data/models/{mamba2,nemotron_h,qwen3_5}_tiny/, written by scripts/make_goldens.py):
tiny models built with transformers' own classes, weights randomised (fixed seed, scales chosen so
that the logits are far from uniform and the SSM heads span fast and slow decays), saved with
``save_pretrained`` (config.json + model.safetensors), with

* ``tokens.npy``    int64 (N,): a fixed token sequence (N = 320);
* ``logprobs.npy``  float32 (N, vocab): transformers' FP32 forward, log_softmax over the vocabulary
                    (taken in float64 from the float32 logits, then rounded to float32);
* ``golden.json``   the transformers and torch versions, the seed, the model class, the shapes.

The reference is transformers' slow torch path on the CPU (no CUDA or hub kernels, eager
attention, chunked SSM scans). All models are FP32 with dk = 128, so that every state format applies
(NVFP4 blocks of 16 and FP8 blocks of 128 run along dk):

* ``mamba2_tiny``    Mamba2ForCausalLM, 3 layers, n_groups = 2, dk (state) 128 != dv (head) 16,
                     finite dt limits (both clamps active), untied LM head.
* ``nemotron_h_tiny`` NemotronHForCausalLM, pattern ``M*-M-*``: Mamba-2 (n_groups 2, grouped
                     gated norm, dt clamped at time_step_min), attention without RoPE (GQA 4:2),
                     relu2 MLP; untied LM head.
* ``qwen3_5_tiny``   Qwen3_5ForCausalLM (Qwen3_5TextConfig), layers GDN,GDN,attn,GDN,attn:
                     4 value heads on 2 key heads, dk 128 != dv 16, gated attention with q/k norm and
                     partial RoPE (factor 0.5), GQA 4:2, SwiGLU MLP, tied embeddings.
* ``nemotron_h_moe_tiny`` NemotronHForCausalLM, pattern ``ME*-E``: 8 relu2 experts in 4 groups,
                     top 3 from the 2 best groups, e_score_correction_bias, norm_topk_prob,
                     routed_scaling_factor 2.5, a shared relu2 expert; hidden 32.
* ``qwen3_5_moe_tiny``  Qwen3_5MoeForCausalLM, layers GDN,attn,GDN: 8 SwiGLU experts, top 3
                     (softmax, renormalised), a sigmoid-gated shared expert in every layer; hidden 32.

The MoE goldens record in golden.json how many (token, slot) choices each expert of each MoE layer
received in the reference forward (``routing``); the generator refuses a model where an expert of
some layer receives none, so the goldens exercise every expert.
* ``kimi_linear_tiny`` KimiLinearForCausalLM, layers KDA, MLA: one KDA head of
                     dk = dv = 128 with channel decays from slow to fast, multi-head latent attention
                     (2 heads, kv_lora_rank 16, nope/rope/v head dims 16/8/16); a dense SwiGLU MLP in
                     layer 0, a mixture of experts in layer 1 (8 SwiGLU experts in 4 groups, top 2
                     from the 2 best groups, e_score_correction_bias, renormalised, routed scaling
                     2.446, one shared expert); untied LM head. Its
                     weights are bfloat16-representable and stored as BF16 (lossless) to stay under
                     0.6 MB; the reference forward runs in float32 like the others.
"""
import json
import math
import pathlib
import shutil

import ml_dtypes
import numpy as np

from .files import write_atomically
from .formats import (CANONICAL_NAN_BITS, F32, FLT_MAX, FORMATS, bits32, encode, f32, quantize_fp8b128,
                      quantize_nvfp4)

ROOT = pathlib.Path(__file__).resolve().parents[2]
NUMPY_SEED = 20250611
FORMAT_VERSION = 1
GENERATOR = "scripts/make_format_goldens.py"
FORMAT_GOLDENS = ROOT / "data" / "goldens" / "formats_v1.json"

# ---- format goldens: case construction ------------------------------------------------------------
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

def write_format_goldens(path=FORMAT_GOLDENS):
    """Builds every case and writes the golden file atomically; returns (cases, bytes)."""
    cases = build_cases()
    text = render(cases)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: pathlib.Path(tmp).write_bytes(text.encode("ascii")))
    return len(cases), len(text)


# ---- model goldens ----------------------------------------------------------------------------------

MODEL_SEED = 20261130
N_TOKENS = 320
MODEL_FORMAT_VERSION = 1
MODEL_NAMES = ("mamba2_tiny", "nemotron_h_tiny", "qwen3_5_tiny", "nemotron_h_moe_tiny", "qwen3_5_moe_tiny",
               "kimi_linear_tiny")
# Models whose checkpoint is written in bfloat16 (their weights are rounded to it first, so the file
# holds exactly the float32 values the reference forward used).
BF16_CHECKPOINTS = ("kimi_linear_tiny",)
MODELS_DIR = ROOT / "data" / "models"


# The seed of each model, fixed by its name, so that regenerating some models (--only) makes the same
# ones as regenerating all. (The MoE and Kimi goldens were made in parallel and both took offset 3.)
MODEL_SEEDS = {"mamba2_tiny": MODEL_SEED, "nemotron_h_tiny": MODEL_SEED + 1, "qwen3_5_tiny": MODEL_SEED + 2,
               "nemotron_h_moe_tiny": MODEL_SEED + 3, "qwen3_5_moe_tiny": MODEL_SEED + 4,
               "kimi_linear_tiny": MODEL_SEED + 3}


def model_seed(name):
    """The seed of one model (MODEL_SEEDS)."""
    return MODEL_SEEDS[name]


def randomise(model, torch, gen, kind):
    """Weights with O(1) activations everywhere and peaked output distributions."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            leaf = name.rsplit(".", 1)[-1]
            if kind == "kimi_linear" and name.endswith("A_log"):
                # KDA: alpha = exp(-A softplus(f(x) + dt_bias)) per channel; A in [0.5, 2] per head
                a = torch.exp(torch.empty(shape).uniform_(math.log(0.5), math.log(2.0), generator=gen))
                p.copy_(torch.log(a))
            elif kind == "kimi_linear" and name.endswith("dt_bias"):
                # channel time steps from 1e-4 (alpha ~ 1 - 1e-4, slow) to 3 (alpha ~ 1e-3, fast)
                dt = torch.exp(torch.empty(shape).uniform_(math.log(1e-4), math.log(3.0), generator=gen))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            elif name.endswith("A_log"):
                # decays from very slow to fast: A in [0.05, 8] (Mamba-2: alpha = exp(-A dt))
                a = torch.exp(torch.empty(shape).uniform_(math.log(0.05), math.log(8.0), generator=gen))
                p.copy_(torch.log(a))
            elif name.endswith("dt_bias"):
                dt = torch.exp(torch.empty(shape).uniform_(math.log(1e-3), math.log(0.3), generator=gen))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            elif leaf == "D":
                p.copy_(torch.empty(shape).uniform_(0.5, 1.5, generator=gen))
            elif "norm" in name and p.dim() == 1:
                if kind == "qwen3_5" and not name.endswith("linear_attn.norm.weight"):
                    p.copy_(0.2 * torch.randn(shape, generator=gen))  # (1 + w) convention
                else:
                    p.copy_(1.0 + 0.2 * torch.randn(shape, generator=gen))
            elif "conv1d.weight" in name:
                p.copy_(torch.randn(shape, generator=gen) / math.sqrt(shape[-1]))
            elif "conv1d.bias" in name or leaf == "bias":
                p.copy_(0.1 * torch.randn(shape, generator=gen))
            elif p.dim() == 3 and ".experts." in name:
                # fused expert weights [experts, out, in], held so by transformers
                p.copy_(torch.randn(shape, generator=gen) / math.sqrt(shape[2]))
            elif "embed" in name:
                # tied models use the embedding as the LM head too: keep the logits' spread moderate
                tied = bool(getattr(model.config, "tie_word_embeddings", False))
                p.copy_(torch.randn(shape, generator=gen) * (0.4 if tied else 1.0))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(shape, generator=gen) * (0.4 / math.sqrt(shape[1]) * 8))
            elif p.dim() == 2:
                p.copy_(torch.randn(shape, generator=gen) / math.sqrt(shape[1]))
            else:
                raise RuntimeError(f"no initialisation rule for {name} {shape}")
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                # a saved buffer of the sigmoid routers: small next to the scores' spread, so it moves
                # some choices, not all
                b.copy_(0.05 * torch.randn(tuple(b.shape), generator=gen))


def build(name, transformers, torch):
    if name == "mamba2_tiny":
        cfg = transformers.Mamba2Config(
            vocab_size=256, hidden_size=64, num_hidden_layers=3, num_heads=8, head_dim=16, expand=2,
            state_size=128, n_groups=2, conv_kernel=4, chunk_size=64, use_bias=False, use_conv_bias=True,
            layer_norm_epsilon=1e-5, time_step_limit=(0.004, 0.5), tie_word_embeddings=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return transformers.Mamba2ForCausalLM(cfg), "mamba2"
    if name == "nemotron_h_tiny":
        cfg = transformers.NemotronHConfig(
            vocab_size=256, hidden_size=64, hybrid_override_pattern="M*-M-*", num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, intermediate_size=96, mlp_hidden_act="relu2",
            mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=128, n_groups=2, conv_kernel=4,
            chunk_size=64, time_step_min=0.004, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
            use_conv_bias=True, use_bias=False, mlp_bias=False, attention_bias=False)
        return transformers.NemotronHForCausalLM(cfg), "nemotron_h"
    if name == "qwen3_5_tiny":
        cfg = transformers.Qwen3_5TextConfig(
            vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=5,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention",
                         "full_attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4,
            linear_key_head_dim=128, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
        return transformers.Qwen3_5ForCausalLM(cfg), "qwen3_5"
    if name == "nemotron_h_moe_tiny":
        cfg = transformers.NemotronHConfig(
            vocab_size=256, hidden_size=32, hybrid_override_pattern="ME*-E", num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, intermediate_size=48, mlp_hidden_act="relu2",
            mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=128, n_groups=1, conv_kernel=4,
            chunk_size=64, time_step_min=0.004, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
            use_conv_bias=True, use_bias=False, mlp_bias=False, attention_bias=False,
            n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=16,
            moe_shared_expert_intermediate_size=24, n_group=4, topk_group=2, norm_topk_prob=True,
            routed_scaling_factor=2.5)
        return transformers.NemotronHForCausalLM(cfg), "nemotron_h"
    if name == "qwen3_5_moe_tiny":
        cfg = transformers.Qwen3_5MoeTextConfig(
            vocab_size=256, hidden_size=32, num_hidden_layers=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_conv_kernel_dim=4,
            linear_key_head_dim=128, linear_value_head_dim=8, linear_num_key_heads=1, linear_num_value_heads=2,
            moe_intermediate_size=8, shared_expert_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
            rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
        return transformers.Qwen3_5MoeForCausalLM(cfg), "qwen3_5"
    if name == "kimi_linear_tiny":
        cfg = transformers.KimiLinearConfig(
            vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"],
            num_experts=8, num_expert_group=4, topk_group=2, num_experts_per_token=2, moe_intermediate_size=16,
            num_shared_experts=1, moe_renormalize=True, routed_scaling_factor=2.446,
            linear_num_heads=1, linear_head_dim=128, linear_conv_kernel_dim=4,
            num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=16,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, attention_bias=False,
            hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return transformers.KimiLinearForCausalLM(cfg), "kimi_linear"
    raise ValueError(name)


def routing_counts(model, torch, input_ids):
    """Per MoE layer (by name), the number of (token, slot) choices each expert received in one
    forward: recorded from the router modules' own outputs (their third return value, the indices)."""
    counts, hooks = {}, []
    for name, mod in model.named_modules():
        if type(mod).__name__ in ("NemotronHTopkRouter", "Qwen3_5MoeTopKRouter", "KimiLinearTopkRouter"):
            n_exp = mod.weight.shape[0]

            def hook(m, args, out, name=name, n_exp=n_exp):
                idx = out[2].reshape(-1)
                counts[name] = torch.bincount(idx, minlength=n_exp).tolist()
            hooks.append(mod.register_forward_hook(hook))
    model(input_ids=input_ids, use_cache=False)
    for h in hooks:
        h.remove()
    return counts


def kda_decay_spread(model, torch, input_ids):
    """Per-channel mean decay exp(g) of every KDA layer's forget gate over the golden tokens (the
    decays must span slow and fast channels for the state formats to matter)."""
    seen = []
    hooks = [m.register_forward_hook(lambda _m, _i, g: seen.append(g.exp().mean(dim=(0, 1)).flatten()))
             for n, m in model.named_modules() if n.endswith("forget_gate")]
    model(input_ids=input_ids, use_cache=False)
    for h in hooks:
        h.remove()
    means = torch.cat(seen)
    return {"min_channel_mean_decay": float(means.min()), "max_channel_mean_decay": float(means.max()),
            "channels_below_0.5": int((means < 0.5).sum()), "channels_above_0.999": int((means > 0.999).sum()),
            "channels": int(means.numel())}


def write_model_goldens(out_root=MODELS_DIR, names=MODEL_NAMES, log=print):
    """Builds, randomises and saves each model with its tokens, log-probabilities and golden.json
    (a model folder is replaced whole). Needs torch and transformers."""
    import torch
    import transformers

    out_root = pathlib.Path(out_root)
    unknown = [n for n in names if n not in MODEL_NAMES]
    if unknown:
        raise ValueError(f"--only: unknown model {', '.join(unknown)}; expected some of {', '.join(MODEL_NAMES)}")
    torch.set_grad_enabled(False)
    for name in names:
        seed = model_seed(name)
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed + 100)
        model, kind = build(name, transformers, torch)
        model = model.to(torch.float32).eval()
        randomise(model, torch, gen, kind)
        if name in BF16_CHECKPOINTS:
            # the saved buffers too (the routers' e_score_correction_bias): the file must hold exactly
            # the values the reference forward used
            saved = model.state_dict()
            for p in [*model.parameters(), *(b for n, b in model.named_buffers() if n in saved)]:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()
        model.config._attn_implementation = "eager"
        vocab = model.config.vocab_size
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, vocab, N_TOKENS, dtype=np.int64)
        logits = model(input_ids=torch.from_numpy(tokens)[None], use_cache=False).logits[0]
        routing = routing_counts(model, torch, torch.from_numpy(tokens)[None])
        idle = {layer: [e for e, n in enumerate(c) if n == 0] for layer, c in routing.items()}
        idle = {layer: e for layer, e in idle.items() if e}
        if idle:
            raise RuntimeError(f"{name}: experts that receive no token: {idle}; change the randomisation")
        assert logits.dtype == torch.float32
        logprobs = torch.log_softmax(logits.double(), dim=-1).float().numpy()

        d = out_root / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        extra = {}
        if kind == "kimi_linear":
            extra["kda_decay"] = kda_decay_spread(model, torch, torch.from_numpy(tokens)[None])
            spread = extra["kda_decay"]
            assert spread["min_channel_mean_decay"] < 0.5 and spread["max_channel_mean_decay"] > 0.999, spread
            extra["mlp_layers"] = ("layer 0 dense (SwiGLU), layer 1 sparse (KimiLinearMoE: 8 experts, every one "
                                   "receives tokens, see routing)")
        if name in BF16_CHECKPOINTS:
            model.to(torch.bfloat16).save_pretrained(d)
            extra["checkpoint_dtype"] = ("bfloat16: the weights are bfloat16-representable, stored losslessly; "
                                         "the reference forward ran in float32")
        else:
            model.save_pretrained(d)
        (d / "generation_config.json").unlink(missing_ok=True)
        np.save(d / "tokens.npy", tokens)
        np.save(d / "logprobs.npy", logprobs)
        p = np.exp(logprobs.astype(np.float64))
        entropy = float(-(p * logprobs).sum(-1).mean())
        meta = {
            "format_version": MODEL_FORMAT_VERSION,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "seed": seed,
            "model_class": type(model).__name__,
            "model_type": model.config.model_type,
            "n_tokens": N_TOKENS,
            "vocab_size": vocab,
            # parameters plus the buffers saved with them (the routers' e_score_correction_bias):
            # every value of the checkpoint the forward reads
            "parameters": int(sum(t.numel() for t in model.parameters()) +
                              sum(b.numel() for n, b in model.named_buffers() if n in model.state_dict())),
            "mean_entropy_nats": entropy,
            "logit_std": float(logits.std()),
            **({"routing": {"what": "(token, slot) choices per expert of each MoE layer over the golden tokens; "
                                    "every expert receives some", "counts": routing}} if routing else {}),
            "reference": "transformers slow torch path on CPU, float32, eager attention; "
                         "log_softmax in float64 of the float32 logits",
            **extra,
        }
        (d / "golden.json").write_text(json.dumps(meta, indent=2) + "\n")
        size = sum(f.stat().st_size for f in d.iterdir())
        log(f"{name}: {meta['parameters']} parameters, entropy {entropy:.3f} nats "
            f"(uniform {math.log(vocab):.3f}), logit std {meta['logit_std']:.2f}, {size / 1e6:.2f} MB -> {d}")
