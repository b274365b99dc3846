"""Training the bundled byte-level models (scripts/train_tiny.py is the command; its help text says
what a run makes): the PG-19 test-set refusal, model presets built with transformers' own classes, a
chunked Mamba-2 scan in einsum form for training, the long-memory initialisation of the SSM decays, the
context schedule, the training loop (resumable: train_resume.py holds the saved state), the
bits-per-byte evaluation, the decay spectrum (`replayssm info --decays`) and the model card. torch and
transformers are imported only inside the functions that need them (the `train` extra), so the data
and argument checks run without them.
"""
import contextlib
import hashlib
import json
import math
import os
import pathlib
import platform
import shlex
import statistics
import sys
import time

from .files import write_text_atomically
from .text import STRIP_VERSION, TextError, list_books, strip_book, strip_gutenberg

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_TRAIN_DIR = ROOT.parent / "shared" / "data" / "gutenberg-train"
DEFAULT_PG19_DIR = ROOT.parent / "shared" / "data" / "pg19" / "test"
MAX_CHECKPOINT_BYTES = 25 * 1000 * 1000
EXIT_REFUSED = 2
TRAIN_DIR_HINT = "point --train-dir at a folder of Project Gutenberg .txt books"
PG19_DIR_HINT = "point --pg19-dir at the PG-19 test books"


# ---- the text: never the PG-19 test books ---------------------------------------------------------------

def check_not_pg19_test(train_dir, pg19_dir):
    """Raises TextError if training on train_dir could mean training on the PG-19 test books."""
    train = pathlib.Path(train_dir).resolve()
    test = pathlib.Path(pg19_dir).resolve()
    refuse = "refusing to train on the PG-19 test books"
    if train == test or (train.name == "test" and train.parent.name == "pg19"):
        raise TextError(f"{refuse}: --train-dir {train_dir} is the PG-19 test folder ({train})")
    if not test.is_dir() or not train.is_dir():
        return
    test_books = {p.name.lower(): p for p in test.iterdir() if p.is_file()}
    test_hashes = {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in test_books.values()
                   if p.suffix.lower() == ".txt"}
    for p in sorted(train.iterdir()):
        if not p.is_file():
            continue
        if p.name.lower() in test_books and p.suffix.lower() == ".txt":
            raise TextError(f"{refuse}: {p} has the name of PG-19 test book {test_books[p.name.lower()]}")
        if p.suffix.lower() == ".txt":
            h = hashlib.sha256(p.read_bytes()).hexdigest()
            if h in test_hashes:
                raise TextError(f"{refuse}: {p} has the same contents as PG-19 test book {test_hashes[h]}")


def load_training_text(train_dir, pg19_dir):
    """(corpus bytes, per-book records). Checks the PG-19 exclusion first."""
    check_not_pg19_test(train_dir, pg19_dir)
    books, parts = [], []
    for p in list_books(train_dir, hint=TRAIN_DIR_HINT):
        raw = p.read_bytes()
        body = strip_gutenberg(raw, str(p))[0]
        books.append({"file": p.name, "raw_bytes": len(raw), "text_bytes": len(body)})
        parts.append(body)
    return b"\n".join(parts), books


def load_eval_books(pg19_dir, n_bytes):
    """[(name, first n_bytes of the stripped book)] or None when the folder is missing."""
    if not pathlib.Path(pg19_dir).is_dir():
        return None
    books = [(p.name, strip_book(p)[:n_bytes]) for p in list_books(pg19_dir, hint=PG19_DIR_HINT)]
    for name, text in books:
        if len(text) < 2:
            raise TextError(f"{pg19_dir}/{name}: fewer than 2 bytes of text to evaluate on")
    return books


# ---- model configurations ---------------------------------------------------------------------------

def qwen_layer_types(n_layers, interval=4):
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


PRESETS = {
    # hidden 256, expand 2 -> 8 value heads of dv 64; 2 groups of B/C (key heads), dk 128.
    ("mamba2", "default"): dict(
        hidden_size=256, num_hidden_layers=6, expand=2, num_heads=8, head_dim=64, state_size=128, n_groups=2,
        conv_kernel=4, chunk_size=64),
    ("mamba2", "tiny"): dict(
        hidden_size=32, num_hidden_layers=2, expand=2, num_heads=4, head_dim=16, state_size=32, n_groups=2,
        conv_kernel=4, chunk_size=16),
    # 8 layers GGG*GGG*; GDN: 2 key heads (dk 128), 4 value heads (dv 64); attention 4 heads / 2 kv heads of 64.
    ("qwen3_5", "default"): dict(
        hidden_size=256, num_hidden_layers=8, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, layer_types=qwen_layer_types(8)),
    ("qwen3_5", "tiny"): dict(
        hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"]),
    # NemotronH-style hybrid, pattern M-M-M*-M-M- (M Mamba-2, - relu2 MLP, * attention without RoPE): Mamba-2
    # 8 heads of dv 64 on 2 groups, dk 128 (as tiny_mamba2); attention 4 heads / 2 kv heads of 64; MLP 768.
    ("nemotron_h", "default"): dict(
        hidden_size=256, hybrid_override_pattern="M-M-M*-M-M-", mamba_num_heads=8, mamba_head_dim=64,
        ssm_state_size=128, n_groups=2, conv_kernel=4, chunk_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=768),
    ("nemotron_h", "tiny"): dict(
        hidden_size=32, hybrid_override_pattern="M*-", mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=32,
        n_groups=2, conv_kernel=4, chunk_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        intermediate_size=64),
    # Kimi-Linear-style hybrid, pattern KKK*KKK* (K Kimi Delta Attention, * MLA), dense SwiGLU MLPs (no MoE):
    # KDA 2 heads of dk = dv = 128 (Kimi Linear's head size); MLA 4 heads, kv rank 128, nope/rope 32/32, v 64.
    ("kimi_linear", "default"): dict(
        hidden_size=256, num_hidden_layers=8, intermediate_size=512, layer_types=qwen_layer_types(8),
        mlp_layer_types=["dense"] * 8, linear_num_heads=2, linear_head_dim=128, linear_conv_kernel_dim=4,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=32,
        v_head_dim=64, head_dim=64),
    ("kimi_linear", "tiny"): dict(
        hidden_size=32, num_hidden_layers=2, intermediate_size=64, layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense"] * 2, linear_num_heads=2, linear_head_dim=16, linear_conv_kernel_dim=4,
        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
        v_head_dim=16, head_dim=16),
}
DEFAULT_LR = {"mamba2": 3e-3, "qwen3_5": 2e-3, "nemotron_h": 2e-3, "kimi_linear": 2e-3}
ARCH_TITLES = {"mamba2": "Mamba-2", "qwen3_5": "Qwen3.5-style Gated DeltaNet hybrid",
               "kimi_linear": "Kimi-Linear-style Kimi Delta Attention + MLA hybrid",
               "nemotron_h": "NemotronH-style Mamba-2 + attention + MLP hybrid"}
PATTERN_LEGENDS = {"mamba2": "M Mamba-2", "qwen3_5": "G Gated DeltaNet, * gated attention",
                   "kimi_linear": "K Kimi Delta Attention, * MLA attention",
                   "nemotron_h": "M Mamba-2, * attention, - relu2 MLP"}


def build_config(arch, preset, transformers):
    p = dict(PRESETS[(arch, preset)])
    if arch == "mamba2":
        return transformers.Mamba2Config(
            vocab_size=256, **p, use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-5,
            initializer_range=0.02, tie_word_embeddings=False, pad_token_id=0, bos_token_id=None,
            eos_token_id=None)
    if arch == "nemotron_h":
        # time_step_min is NemotronHMamba2Mixer's hard floor on dt (and the C++ loader's): 1e-4 keeps it below
        # every dt of the long-memory initialisation (smallest 1e-3) even with the input's share of dt.
        return transformers.NemotronHConfig(
            vocab_size=256, **p, mlp_hidden_act="relu2", mamba_hidden_act="silu", time_step_min=1e-4,
            time_step_max=0.1, time_step_floor=1e-4, layer_norm_epsilon=1e-5, initializer_range=0.02,
            tie_word_embeddings=False, use_conv_bias=True, use_bias=False, mlp_bias=False, attention_bias=False,
            max_position_embeddings=131072, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    if arch == "kimi_linear":
        # Untied LM head: transformers' KimiLinearForCausalLM does not tie it (a tied config would save two
        # different matrices, which the C++ loader refuses). No MoE layer, so the expert fields are placeholders.
        return transformers.KimiLinearConfig(
            vocab_size=256, **p, q_lora_rank=None, hidden_act="silu", rms_norm_eps=1e-5, initializer_range=0.02,
            tie_word_embeddings=False, max_position_embeddings=131072, num_experts=1, num_experts_per_token=1,
            moe_intermediate_size=16, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    return transformers.Qwen3_5TextConfig(
        vocab_size=256, **p, hidden_act="silu", rms_norm_eps=1e-6, initializer_range=0.02,
        tie_word_embeddings=True, max_position_embeddings=131072, attention_bias=False, pad_token_id=None,
        bos_token_id=None, eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})


MODEL_CLASSES = {"mamba2": "Mamba2ForCausalLM", "qwen3_5": "Qwen3_5ForCausalLM", "nemotron_h": "NemotronHForCausalLM",
                 "kimi_linear": "KimiLinearForCausalLM"}


def build_model(arch, config, transformers):
    return getattr(transformers, MODEL_CLASSES[arch])(config)


def layer_pattern(arch, config):
    if arch == "mamba2":
        return "M" * config.num_hidden_layers
    if arch == "nemotron_h":
        return "".join({"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-", "moe": "E"}[t] for t in config.layers_block_type)
    delta = "K" if arch == "kimi_linear" else "G"
    return "".join("*" if t == "full_attention" else delta for t in config.layer_types)


def config_summary(arch, c):
    """[(field, value)] for the card: the config keys the C++ loader reads."""
    rows = [("model_type", c.model_type), ("vocab_size", c.vocab_size), ("hidden_size", c.hidden_size),
            ("num_hidden_layers", c.num_hidden_layers), ("layer pattern", layer_pattern(arch, c))]
    if arch == "mamba2":
        rows += [("num_heads (value heads)", c.num_heads), ("head_dim (dv)", c.head_dim),
                 ("state_size (dk)", c.state_size), ("n_groups (key heads)", c.n_groups), ("expand", c.expand),
                 ("conv_kernel", c.conv_kernel), ("chunk_size", c.chunk_size),
                 ("time_step_limit", list(c.time_step_limit)), ("layer_norm_epsilon", c.layer_norm_epsilon),
                 ("tie_word_embeddings", c.tie_word_embeddings), ("pad_token_id", c.pad_token_id)]
    elif arch == "nemotron_h":
        rows += [("mamba_num_heads (value heads)", c.mamba_num_heads), ("mamba_head_dim (dv)", c.mamba_head_dim),
                 ("ssm_state_size (dk)", c.ssm_state_size), ("n_groups (key heads)", c.n_groups),
                 ("conv_kernel", c.conv_kernel), ("chunk_size", c.chunk_size),
                 ("time_step_min (dt floor)", c.time_step_min),
                 ("num_attention_heads", c.num_attention_heads), ("num_key_value_heads", c.num_key_value_heads),
                 ("head_dim", c.head_dim), ("intermediate_size (relu2 MLP)", c.intermediate_size),
                 ("layer_norm_epsilon", c.layer_norm_epsilon), ("tie_word_embeddings", c.tie_word_embeddings),
                 ("pad_token_id", c.pad_token_id)]
    elif arch == "kimi_linear":
        rows += [("linear_num_heads (KDA heads)", c.linear_num_heads), ("linear_head_dim (dk = dv)", c.linear_head_dim),
                 ("linear_conv_kernel_dim", c.linear_conv_kernel_dim),
                 ("num_attention_heads (MLA)", c.num_attention_heads), ("kv_lora_rank", c.kv_lora_rank),
                 ("qk_nope_head_dim / qk_rope_head_dim", f"{c.qk_nope_head_dim} / {c.qk_rope_head_dim}"),
                 ("v_head_dim", c.v_head_dim), ("intermediate_size (SwiGLU, every layer dense)", c.intermediate_size),
                 ("rms_norm_eps", c.rms_norm_eps), ("tie_word_embeddings", c.tie_word_embeddings),
                 ("pad_token_id", c.pad_token_id)]
    else:
        rp = c.rope_parameters or {}
        rows += [("linear_num_key_heads", c.linear_num_key_heads),
                 ("linear_num_value_heads", c.linear_num_value_heads),
                 ("linear_key_head_dim (dk)", c.linear_key_head_dim),
                 ("linear_value_head_dim (dv)", c.linear_value_head_dim),
                 ("linear_conv_kernel_dim", c.linear_conv_kernel_dim),
                 ("num_attention_heads", c.num_attention_heads), ("num_key_value_heads", c.num_key_value_heads),
                 ("head_dim", c.head_dim), ("rope", f"theta {rp.get('rope_theta')}, partial_rotary_factor "
                                                   f"{rp.get('partial_rotary_factor')}"),
                 ("intermediate_size (SwiGLU)", c.intermediate_size), ("rms_norm_eps", c.rms_norm_eps),
                 ("tie_word_embeddings", c.tie_word_embeddings), ("pad/bos/eos", "none")]
    return rows


# ---- a faster Mamba-2 chunk scan for training ------------------------------------------------------

def _segsum(x, torch):
    """out[..., i, j] = x[..., j+1] + ... + x[..., i] for i >= j, -inf above the diagonal."""
    n = x.shape[-1]
    below = torch.ones(n, n, dtype=torch.bool, device=x.device).tril(-1)
    s = x[..., :, None].expand(*x.shape, n).masked_fill(~below, 0.0).cumsum(-2)
    return s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=x.device).tril(), -math.inf)


def make_einsum_chunk_scan(reference):
    """A drop-in for transformers' mamba2_chunk_scan (the chunked SSD form of S_t = a_t S_{t-1} + x_t dt_t B_t^T,
    y_t = S_t C_t + D x_t) that contracts with matmuls instead of materialising broadcast products. Calls with an
    initial state or asking for the final state (decoding) go to `reference`."""
    import torch
    import torch.nn.functional as F

    def scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None, dt_softplus=False,
             dt_limit=(0.0, float("inf")), return_final_states=False, **kwargs):
        if initial_states is not None or return_final_states:
            return reference(hidden_states, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias,
                             initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit,
                             return_final_states=return_final_states, **kwargs)
        dev = hidden_states.device.type
        with torch.autocast(dev, enabled=False) if dev in ("cuda", "cpu") else contextlib.nullcontext():
            b, t, h, p = hidden_states.shape
            g, n = B.shape[2], B.shape[3]
            r = h // g
            dt = dt.float()
            if dt_bias is not None:
                dt = dt + dt_bias.float()
            if dt_softplus:
                dt = F.softplus(dt)
            dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
            x, B, C = hidden_states.float(), B.float(), C.float()
            pad = (-t) % chunk_size
            if pad:  # zero x, dt, B, C at the end: decay 1, no input, outputs cut below
                x = F.pad(x, (0, 0, 0, 0, 0, pad))
                dt = F.pad(dt, (0, 0, 0, pad))
                B = F.pad(B, (0, 0, 0, 0, 0, pad))
                C = F.pad(C, (0, 0, 0, 0, 0, pad))
            c, L = (t + pad) // chunk_size, chunk_size
            xd = (x * dt[..., None]).view(b, c, L, g, r, p)
            Bc, Cc = B.view(b, c, L, g, n), C.view(b, c, L, g, n)
            a = (A.float() * dt).view(b, c, L, g, r).permute(0, 3, 4, 1, 2)  # (b, g, r, c, L) log-decays
            a_cum = a.cumsum(-1)
            # within a chunk: y_l += sum_{s<=l} (C_l . B_s) exp(a_{s+1} + ... + a_l) xd_s
            scores = torch.einsum("bclgn,bcsgn->bgcls", Cc, Bc)[:, :, None] * torch.exp(_segsum(a, torch))
            y = torch.einsum("bgrcls,bcsgrp->bclgrp", scores, xd)
            # state each chunk adds, at its end: sum_s exp(a_{s+1} + ... + a_L) xd_s B_s^T
            w = torch.exp(a_cum[..., -1:] - a_cum).permute(0, 3, 4, 1, 2)[..., None]  # (b, c, L, g, r, 1)
            chunk_states = torch.einsum("bclgrp,bclgn->bcgrpn", xd * w, Bc)
            # states entering each chunk: the chunk-level recurrence unrolled (c+1 x c+1 decays)
            decay = torch.exp(_segsum(F.pad(a_cum[..., -1], (1, 0)), torch))  # (b, g, r, c+1, c+1)
            states = torch.cat([torch.zeros_like(chunk_states[:, :1]), chunk_states], dim=1)
            entering = torch.einsum("bgrzc,bcgrpn->bzgrpn", decay, states)[:, :-1]
            y = y + torch.einsum("bclgn,bcgrpn->bclgrp", Cc, entering) * \
                torch.exp(a_cum).permute(0, 3, 4, 1, 2)[..., None]
            y = y.reshape(b, c * L, h, p)
            if D is not None:
                y = y + D.float()[:, None] * x
            return y[:, :t]

    return scan


class MambaScan:
    """Context manager: transformers' Mamba-2 mixers (Mamba2ForCausalLM's and NemotronH's, which call the
    same chunked SSD form through their module's `mamba2_chunk_scan`) call `scan` instead."""

    def __init__(self, scan):
        from transformers.models.mamba2 import modeling_mamba2
        from transformers.models.nemotron_h import modeling_nemotron_h
        self.modules, self.scan, self.saved = (modeling_mamba2, modeling_nemotron_h), scan, None

    def __enter__(self):
        self.saved = [m.mamba2_chunk_scan for m in self.modules]
        if self.scan is not None:
            for m in self.modules:
                m.mamba2_chunk_scan = self.scan
        return self

    def __exit__(self, *exc):
        for m, f in zip(self.modules, self.saved):
            m.mamba2_chunk_scan = f
        return False


GDN_DEFAULT_CHUNK = 64  # transformers' torch_chunk_gated_delta_rule default
GDN_SCANS = ("loop", "associative")  # --gdn-scan: transformers' chunk loop, or the associative scan below


KDA_SUBCHUNK = 16  # positions per sub-chunk of _kda_chunk_products' exact pairwise diagonal blocks


def _kda_chunk_products(k_beta, q, k, cum, torch):
    """For KDA (per-channel log-decays cum [..., C, dk], cumulative from the chunk's start): the lower
    UT matrix sum_d k_beta[i,d] k[j,d] exp(cum[i,d] - cum[j,d]) and the causal intra-chunk scores, the same
    with q[i] and j <= i; [..., C, C] each. Never computed as exp of a large times exp of a small number
    (which overflows for fast channels): the chunk is cut into sub-chunks of KDA_SUBCHUNK positions; a block of rows in sub-chunk I against
    columns j before it is one matmul with the decay split at I's first position r,
    (x[i] exp(cum[i] - cum[r])) . (k[j] exp(cum[r] - cum[j])), both exponents <= 0; the diagonal blocks take
    the pairwise decays (sub-chunk^2 x dk per sub-chunk instead of chunk^2 x dk)."""
    C, dk = cum.shape[-2:]
    S = KDA_SUBCHUNK if C % KDA_SUBCHUNK == 0 else C
    P = C // S
    lead = cum.shape[:-2]
    sub = lambda x: x.reshape(*lead, P, S, dk)  # noqa: E731
    cs, ks = sub(cum), sub(k)
    ref = cs[..., 0, :]  # [..., P, dk]: cum at each sub-chunk's first position
    row_decay = (cs - ref.unsqueeze(-2)).exp()  # [..., P, S, dk], <= 1
    pos = torch.arange(C, device=cum.device)
    before = pos[None, :] < (torch.arange(P, device=cum.device) * S)[:, None]  # [P, C]: column j before sub-chunk I
    col_exp = (ref.unsqueeze(-2) - cum.unsqueeze(-3)).masked_fill(~before[..., None], float("-inf"))
    cols = k.unsqueeze(-3) * col_exp.exp()  # [..., P, C, dk]: k[j] exp(cum[r_I] - cum[j]), 0 from r_I on
    upper = torch.ones(S, S, dtype=torch.bool, device=cum.device).triu(1)
    pair = (cs.unsqueeze(-2) - cs.unsqueeze(-3)).masked_fill(upper[..., None], float("-inf")).exp()  # [..., P, S, S, dk]
    k_pair = ks.unsqueeze(-3) * pair
    eye = torch.eye(P, dtype=cum.dtype, device=cum.device)[:, None, :, None]  # places block I at rows I, columns I

    def products(x):
        xs = sub(x)
        off = (xs * row_decay) @ cols.transpose(-1, -2)  # [..., P, S, C]
        diag = (xs.unsqueeze(-2) * k_pair).sum(-1)  # [..., P, S, S]
        return (off + (diag.unsqueeze(-2) * eye).reshape(*lead, P, S, C)).reshape(*lead, C, C).float()
    return products(k_beta), products(q)


def associative_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=GDN_DEFAULT_CHUNK, initial_state=None,
                                       output_final_state=False, use_qk_l2norm_in_kernel=False, **_):
    """transformers' torch_chunk_gated_delta_rule (Gated DeltaNet: g [batch, length, heads], one decay per head
    and token) or chunk_kimi_delta_attention (Kimi Delta Attention: g [batch, length, heads, dk], one decay per
    key channel), same arguments and the same chunked mathematics (the UT transform inside each chunk by
    triangular solves), with the sequential loop over chunks replaced by an associative scan.
    Chunk i maps the state S_i it starts from to S_{i+1} = M_i S_i + c_i, with M_i = D_i - K~_i^T W_i
    (the product of the chunk's per-token transitions diag(a_t) (I - beta_t k_t k_t^T); D_i = gamma_i I for
    GDN, diag(gamma_i) over the key channels for KDA) and c_i = K~_i^T U_i; a Hillis-Steele scan composes these
    affine maps in ceil(log2(chunks)) levels of batched matmuls, so a 16K-byte training context takes 8 levels
    instead of 256 dependent iterations (forward and backward). Extra memory: chunks x dk x dk per head and
    level, and for KDA the decays of _kda_chunk_products (sub-chunk x dk per position: exact, never a product
    of a large and a small exponential).
    Float32 inputs, like transformers'; under autocast its matmuls run at the autocast precision, as theirs do."""
    import torch
    import torch.nn.functional as F

    initial_dtype = query.dtype
    batch, length, _, dk = key.shape
    n_heads, dv = value.shape[-2:]
    per_channel = g.dim() == 4  # KDA
    query, key, value, beta, g = [x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                                  for x in (query, key, value, beta, g)]
    if use_qk_l2norm_in_kernel:  # transformers' l2norm (FLA's): x * rsqrt(sum x^2 + 1e-6)
        query = query * torch.rsqrt((query * query).sum(-1, keepdim=True) + 1e-6)
        key = key * torch.rsqrt((key * key).sum(-1, keepdim=True) + 1e-6)
    query = query * dk ** -0.5
    pad = (chunk_size - length % chunk_size) % chunk_size
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta = F.pad(beta, (0, pad))
    g = F.pad(g, (0, 0, 0, pad)) if per_channel else F.pad(g, (0, pad))
    n = (length + pad) // chunk_size

    def chunks(x):
        return x.reshape(batch, n_heads, n, chunk_size, x.shape[-1])
    q, k = chunks(query), chunks(key)
    k_beta, v_beta = chunks(key * beta.unsqueeze(-1)), chunks(value * beta.unsqueeze(-1))
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    if per_channel:
        cum = chunks(g).cumsum(-2)  # [b, h, n, C, dk]: log of each channel's decay from the chunk's start
        ut, intra = _kda_chunk_products(k_beta, q, k, cum, torch)
        start, last = cum.exp(), cum[..., -1:, :]  # decay from the chunk's start; the whole chunk's
        k_dec = k * (last - cum).exp()
        decay_all = torch.diag_embed(last.squeeze(-2).exp())  # D_i
    else:
        cum = g.reshape(batch, n_heads, n, chunk_size).cumsum(-1)  # log of the decay from the chunk's start
        pair = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
        ut = (k_beta @ k.transpose(-1, -2)) * pair  # unit lower triangular after the solve's own diagonal
        intra = (q @ k.transpose(-1, -2)) * pair
        start = cum.exp().unsqueeze(-1)
        k_dec = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)  # K~_i
        decay_all = cum[..., -1].exp()[..., None, None] * torch.eye(dk, dtype=q.dtype, device=q.device)
    u = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)  # U_i
    w = torch.linalg.solve_triangular(ut, k_beta * start, upper=False, unitriangular=True)  # W_i
    q_dec = q * start
    kt = k_dec.transpose(-1, -2)
    m = decay_all - kt @ w  # [b, h, n, dk, dk]
    c = kt @ u  # [b, h, n, dk, dv]
    step = 1
    while step < n:  # inclusive scan: (M, c)_i <- (M_i M_{i-step}, M_i c_{i-step} + c_i)
        m, c = (torch.cat([m[:, :, :step], m[:, :, step:] @ m[:, :, :-step]], 2),
                torch.cat([c[:, :, :step], m[:, :, step:] @ c[:, :, :-step] + c[:, :, step:]], 2))
        step *= 2
    if initial_state is None:
        after = c  # S_{i+1}
        first = torch.zeros(batch, n_heads, 1, dk, dv, dtype=q.dtype, device=q.device)
    else:
        s0 = initial_state.to(c).unsqueeze(2)
        after = m @ s0 + c
        first = s0
    before = torch.cat([first, after[:, :, :-1]], 2)  # S_i, the state chunk i starts from
    v_new = u - w @ before
    out = q_dec @ before + intra @ v_new
    out = out.reshape(batch, n_heads, -1, dv)[:, :, :length]
    out = out.transpose(1, 2).to(initial_dtype, memory_format=torch.contiguous_format)
    return out, (after[:, :, -1] if output_final_state else None)


# The delta-rule layers whose chunked rule GatedDeltaChunk replaces: arch -> (transformers module, function name).
DELTA_RULES = {"qwen3_5": ("transformers.models.qwen3_5.modeling_qwen3_5", "torch_chunk_gated_delta_rule"),
               "kimi_linear": ("transformers.models.kimi_linear.modeling_kimi_linear", "chunk_kimi_delta_attention")}


class GatedDeltaChunk:
    """Context manager: transformers' delta-rule layers (Qwen3.5's Gated DeltaNet, Kimi Linear's KDA; arch picks
    which) run their chunked rule with `chunk` positions per chunk instead of its default 64, and with scan
    "associative" the chunks' states come from associative_chunk_gated_delta_rule instead of transformers'
    sequential loop over chunks (one iteration of small matmuls per chunk, forward and backward: at 16K-byte
    training contexts 256 dependent iterations per layer, launch-bound on a GPU). Same mathematics, float32
    rounding apart (tests/python/test_train_tiny.py compares losses and gradients). chunk None or 64 with
    scan "loop": no change."""

    def __init__(self, chunk, scan="loop", arch="qwen3_5"):
        import importlib
        if scan not in GDN_SCANS:
            raise ValueError(f"GDN scan must be one of {GDN_SCANS}, got {scan!r}")
        if arch not in DELTA_RULES:
            raise ValueError(f"no delta-rule layer in --arch {arch}: one of {sorted(DELTA_RULES)}")
        module, self.name = DELTA_RULES[arch]
        self.module, self.chunk, self.scan, self.saved = importlib.import_module(module), chunk, scan, None

    def __enter__(self):
        self.saved = getattr(self.module, self.name)
        if self.chunk not in (None, GDN_DEFAULT_CHUNK) or self.scan != "loop":
            rule = associative_chunk_gated_delta_rule if self.scan == "associative" else self.saved
            chunk = self.chunk or GDN_DEFAULT_CHUNK

            def chunked(*a, **k):
                k["chunk_size"] = chunk
                return rule(*a, **k)

            setattr(self.module, self.name, chunked)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.saved)
        return False


# ---- the decays a forward pass uses, measured on text --------------------------------------------------

# Where transformers' mixers hand over each layer's decays (whatever MambaScan / GatedDeltaChunk put there):
# arch -> (module, function, the positional names its decay arguments may take).
_MAMBA_SCAN = ("mamba2_chunk_scan", ("hidden_states", "dt", "A", "B", "C", "chunk_size", "D"))
_DELTA_RULE_ARGS = ("query", "key", "value", "g", "beta")
DECAY_SITES = {"mamba2": [("transformers.models.mamba2.modeling_mamba2", *_MAMBA_SCAN)],
               "nemotron_h": [("transformers.models.nemotron_h.modeling_nemotron_h", *_MAMBA_SCAN)],
               "qwen3_5": [(DELTA_RULES["qwen3_5"][0], DELTA_RULES["qwen3_5"][1], _DELTA_RULE_ARGS)],
               "kimi_linear": [(DELTA_RULES["kimi_linear"][0], DELTA_RULES["kimi_linear"][1], _DELTA_RULE_ARGS)]}
PROBE_BYTES = 4096  # bytes per window of the text-measured memory trace
PROBE_WINDOWS = 2   # windows, at offsets 0 and len/2 of the training text


class DecayProbe:
    """Context manager: while active, every Mamba-2 / delta-rule layer that runs records the mean over the
    forward's positions (and batch) of its per-token decay alpha: per head for Mamba-2 and Gated DeltaNet, per
    head and key channel for KDA (head-major), in layer order, into `self.means` (lists of floats). It wraps the
    module-level functions the mixers call, so it sees the decays the model actually applies, the input's share
    included: Mamba-2 alpha = exp(A softplus(dt + dt_bias)) clamped as the scan clamps dt, GDN/KDA
    alpha = exp(g) (g the log-decay the rule receives). head_memories reads only the weights (input's share at
    0), which for GDN heads differs by an order of magnitude from what text gives (experiments/training/README.md)."""

    def __init__(self, arch):
        import importlib
        self.sites = [(importlib.import_module(mod), name, names) for mod, name, names in DECAY_SITES.get(arch, [])]
        self.means, self.saved = [], []

    @staticmethod
    def _arg(a, k, names, name):
        return k[name] if name in k else a[names.index(name)]

    def _wrap(self, f, names):
        import torch
        import torch.nn.functional as F

        def recording(*a, **k):
            with torch.no_grad():
                # float64 from the layer's own inputs: 1 - alpha of a 10^4-token head is 1e-4, where a float32
                # exp would already be off by 5e-4 of it.
                if "dt" in names:  # Mamba-2: the scan's own dt transform (mamba2_chunk_scan's arguments)
                    dt = self._arg(a, k, names, "dt").double()
                    if k.get("dt_bias") is not None:
                        dt = dt + k["dt_bias"].double()
                    if k.get("dt_softplus", False):
                        dt = F.softplus(dt)
                    lo, hi = k.get("dt_limit", (0.0, float("inf")))
                    alpha = torch.exp(self._arg(a, k, names, "A").double() * dt.clamp(min=lo, max=hi))  # [b, t, h]
                else:  # GDN g [b, t, h], KDA g [b, t, h, dk]: log-decays
                    alpha = torch.exp(self._arg(a, k, names, "g").double())
                self.means.append(alpha.mean(dim=(0, 1)).reshape(-1).tolist())
            return f(*a, **k)

        return recording

    def __enter__(self):
        self.saved = [getattr(m, name) for m, name, _ in self.sites]
        for (m, name, names), f in zip(self.sites, self.saved):
            setattr(m, name, self._wrap(f, names))
        return self

    def __exit__(self, *exc):
        for (m, name, _), f in zip(self.sites, self.saved):
            setattr(m, name, f)
        return False


def probe_windows(corpus, torch, device, length=PROBE_BYTES, windows=PROBE_WINDOWS):
    """The fixed text of the measured memory trace: `windows` windows of `length` bytes (shorter when the text
    is) of the training text, at offsets i * len / windows. Training text only: the PG-19 test books stay out."""
    length = max(1, min(length, len(corpus) // windows))
    starts = [i * (len(corpus) // windows) for i in range(windows)]
    rows = [list(corpus[s:s + length]) for s in starts]
    return torch.tensor(rows, dtype=torch.long, device=device)


def text_memories(model, probe, arch, torch, amp):
    """[[1/(1 - mean alpha)] per layer] of the decays `model` applies on the token windows `probe` (DecayProbe;
    one no-grad forward, the training's autocast); None for an architecture without decays."""
    if arch not in DECAY_SITES:
        return None
    was_training = model.training
    model.eval()
    with DecayProbe(arch) as p, torch.no_grad(), torch.autocast(probe.device.type, dtype=torch.bfloat16, enabled=amp):
        model(input_ids=probe, use_cache=False)
    model.train(was_training)
    return [[1.0 / (1.0 - a) if a < 1.0 else math.inf for a in layer] for layer in p.means]


# ---- long-memory initialisation ---------------------------------------------------------------------

DEFAULT_INIT_MEMORY = (10.0, 1e4)  # tokens: the log-uniform span of --decay-init log-uniform
INIT_DT = (0.1, 1e-3)  # dt at the shortest and the longest memory (Mamba's usual dt range)


def ssm_decay_modules(model):
    """The SSM mixers, in layer order: every module with per-head A_log and dt_bias, whose per-token decay is
    alpha = exp(-exp(A_log) * softplus(dt_in + dt_bias)) (Mamba-2 and NemotronH mixers, Gated DeltaNet)."""
    def has_decay(m):
        a, d = getattr(m, "A_log", None), getattr(m, "dt_bias", None)
        return a is not None and d is not None and hasattr(a, "dim") and a.dim() == 1 and d.shape == a.shape
    return [m for m in model.modules() if has_decay(m)]


def kda_forget_gates(model):
    """Kimi Delta Attention's forget gates, in layer order: A_log [1, 1, heads, 1] per head and dt_bias
    [heads * dk] per key channel; channel c of head h decays by alpha = exp(-exp(A_log_h) * softplus(f_c +
    dt_bias_{h dk + c})) per token, f the input's share (transformers' KimiLinearForgetGate)."""
    return [m for m in model.modules() if getattr(m, "A_log", None) is not None and m.A_log.dim() == 4
            and getattr(m, "dt_bias", None) is not None and m.dt_bias.numel() == m.A_log.numel() * m.head_dim]


def long_memory_targets(n_layers, n_heads, lo, hi):
    """[[memory tokens of head h of SSM layer l]]: quantiles (h + (l + 1/2)/n_layers)/n_heads of the log-uniform
    law on [lo, hi], so every layer spans the whole range and the heads of all layers interleave."""
    return [[lo * (hi / lo) ** ((h + (l + 0.5) / n_layers) / n_heads) for h in range(n_heads)]
            for l in range(n_layers)]


def init_long_memory(model, torch, lo=DEFAULT_INIT_MEMORY[0], hi=DEFAULT_INIT_MEMORY[1]):
    """--decay-init log-uniform: sets every SSM head's A_log and dt_bias so that, with the input's share of dt at
    0, its decay is alpha = 1 - 1/m for the head's target memory m (long_memory_targets). The rate
    -log(alpha) = A dt is split between the two: dt runs log-linearly with log m from INIT_DT[0] at m = lo to
    INIT_DT[1] at m = hi (the state's gain dt/(1 - alpha) = dt m stays within 1/A in [1, 10]), and
    A = -log(1 - 1/m)/dt. Both are trainable (no weight decay on vectors): the model can keep or unlearn them.
    Returns the targets."""
    mixers = ssm_decay_modules(model)
    if not mixers:
        return init_long_memory_kda(model, torch, lo, hi)
    n_heads = mixers[0].A_log.numel()
    targets = long_memory_targets(len(mixers), n_heads, lo, hi)
    with torch.no_grad():
        for mixer, mem in zip(mixers, targets):
            m = torch.tensor(mem, dtype=torch.float64)
            q = torch.log(m / lo) / math.log(hi / lo) if hi > lo else torch.zeros_like(m)
            dt = torch.exp(math.log(INIT_DT[0]) + q * (math.log(INIT_DT[1]) - math.log(INIT_DT[0])))
            rate = -torch.log1p(-1.0 / m)
            mixer.A_log.copy_(torch.log(rate / dt).to(mixer.A_log.dtype))
            mixer.dt_bias.copy_((dt + torch.log(-torch.expm1(-dt))).to(mixer.dt_bias.dtype))  # softplus^-1(dt)
    return targets


def init_long_memory_kda(model, torch, lo, hi):
    """--decay-init log-uniform on KDA: the decay is per key channel, so the channels (not the heads) take the
    quantiles of long_memory_targets, channel c of head h the (c * heads + h)-th of its layer's, so that every
    head spans the whole range. A_log = 0 (A = 1, the rate is softplus(dt_bias) alone: KDA has no dt scaling
    an input, so the Mamba split of the rate between A and dt has no reason here) and dt_bias = softplus^-1 of
    -log(1 - 1/m). Returns the targets per layer, in dt_bias order (head-major). [] when the model has none."""
    gates = kda_forget_gates(model)
    if not gates:
        return []
    n_heads, dk = gates[0].num_heads, gates[0].head_dim
    targets = long_memory_targets(len(gates), n_heads * dk, lo, hi)
    out = []
    with torch.no_grad():
        for gate, mem in zip(gates, targets):
            order = [mem[c * n_heads + h] for h in range(n_heads) for c in range(dk)]
            rate = -torch.log1p(-1.0 / torch.tensor(order, dtype=torch.float64))
            gate.A_log.zero_()
            gate.dt_bias.copy_((rate + torch.log(-torch.expm1(-rate))).to(gate.dt_bias.dtype))
            out.append(order)
    return out


def memory_summary(memories, long_tokens=1000.0):
    """Quantiles of the weight-implied memories (head_memories' lists, flattened): what the training log
    records at every logged step, to show whether the decay spectrum has settled."""
    flat = sorted(m for layer in memories for m in layer)
    if not flat:
        return None
    q = lambda f: flat[min(len(flat) - 1, int(f * len(flat)))]
    return {"n": len(flat), "p10": q(0.1), "median": q(0.5), "p90": q(0.9), "max": flat[-1],
            "at_least_1000": sum(m >= long_tokens for m in flat)}


def memory_trace_line(log_entries, kda):
    """The card's sentences on how the memories moved over training: from the weights (`memory`) and, when the
    log has it, measured on the probe text (`memory_text`). None without a trace."""
    who = "channels" if kda else "heads"
    out = []
    for key, what in (("memory", "from the weights at every logged step, input's share of dt at 0"),
                      ("memory_text", f"measured on text at every logged step: 1/(1 - mean alpha) over "
                                      f"{PROBE_WINDOWS} windows of {PROBE_BYTES:,} bytes of the training text")):
        trace = [(e["step"], e[key]) for e in log_entries or [] if e.get(key)]
        moved = settling({"log": log_entries}, key)
        if moved is None:
            continue
        last = trace[-1][1]
        picks = [trace[0], trace[len(trace) // 4], trace[len(trace) // 2], trace[3 * len(trace) // 4], trace[-1]]
        seen, marks = set(), []
        for st, m in picks:
            if st not in seen:
                seen.add(st)
                marks.append(f"step {st}: {_tokens(m['median'])} ({m['at_least_1000']} ≥ 1,000)")
        out.append(f"Over training ({what}; train_log.json `log[].{key}`), median memory of the {last['n']} {who}: "
                   + ", ".join(marks) + f". From step {moved['from_step']} (80% of the steps) to the end the median "
                   f"moved {100 * abs(moved['median']['change']):.1f}% and the {who} of ≥ 1,000 tokens went from "
                   f"{moved['at_least_1000']['start']} to {moved['at_least_1000']['end']}.")
    return " ".join(out) if out else None


def settling(log, key="memory_text", tail=0.2):
    """How much the spectrum still moves at the end of a training: over the logged steps from the last one at or
    before (1 - tail) of the final step (the card's reference step) to the end, per statistic (median, p90,
    max) the relative change from that step to the end and the least-squares slope of its logarithm against
    the step, as the relative change per 10% of the steps (exp(0.1 a) - 1, a the slope per whole training);
    and the range of the count of heads (KDA: channels) of >= 1,000 tokens. None when the log has fewer than
    two entries of `key` in that range."""
    trace = [(e["step"], e[key]) for e in log.get("log") or [] if e.get(key)]
    if len(trace) < 2:
        return None
    last = trace[-1][0]
    ref = max((st for st, _ in trace if st <= (1 - tail) * last), default=trace[0][0])
    window = [(st, m) for st, m in trace if st >= ref]
    if len(window) < 2:
        return None
    x = [st / last for st, _ in window]
    out = {"key": key, "from_step": ref, "to_step": last, "entries": len(window)}
    for stat in ("median", "p90", "max"):
        y = [math.log(m[stat]) for _, m in window]
        mx, my = sum(x) / len(x), sum(y) / len(y)
        a = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sum((xi - mx) ** 2 for xi in x)
        out[stat] = {"start": window[0][1][stat], "end": window[-1][1][stat],
                     "change": window[-1][1][stat] / window[0][1][stat] - 1, "per_tenth": math.exp(0.1 * a) - 1}
    counts = [m["at_least_1000"] for _, m in window]
    out["at_least_1000"] = {"start": counts[0], "end": counts[-1], "min": min(counts), "max": max(counts)}
    return out


def head_memories(model, torch):
    """[[1/(1 - alpha) of each head with the input's share of dt at 0]] from the weights (a property of the
    parameters, not of text: `replayssm info --decays` measures the latter)."""
    out = []
    with torch.no_grad():
        for mixer in ssm_decay_modules(model):
            rate = torch.exp(mixer.A_log.double()) * torch.nn.functional.softplus(mixer.dt_bias.double())
            out.append((1.0 / -torch.expm1(-rate)).tolist())
        for gate in kda_forget_gates(model):  # KDA: one per key channel, head-major (dt_bias order)
            a = torch.exp(gate.A_log.double()).reshape(-1).repeat_interleave(gate.head_dim)
            rate = a * torch.nn.functional.softplus(gate.dt_bias.double())
            out.append((1.0 / -torch.expm1(-rate)).tolist())
    return out


# ---- the training context: a schedule of lengths ---------------------------------------------------------

def parse_seq_len_schedule(text):
    """'1024:0,4096:0.3,16384:0.6' -> [(1024, 0.0), (4096, 0.3), (16384, 0.6)]: length in bytes and the
    fraction of --steps from which it applies. Raises ValueError naming what is wrong."""
    out = []
    for part in text.split(","):
        length, sep, frac = part.strip().partition(":")
        if not sep:
            raise ValueError(f"entry {part!r} is not LENGTH:FRACTION")
        try:
            length, frac = int(length), float(frac)
        except ValueError:
            raise ValueError(f"entry {part!r}: LENGTH must be an integer and FRACTION a number") from None
        if length <= 0 or not (math.isfinite(frac) and 0 <= frac < 1):
            raise ValueError(f"entry {part!r}: LENGTH must be positive and FRACTION in [0, 1)")
        if out and frac <= out[-1][1]:
            raise ValueError(f"entry {part!r}: fractions must increase")
        out.append((length, frac))
    if out[0][1] != 0:
        raise ValueError(f"the first entry must start at fraction 0, got {out[0][1]}")
    return out


def schedule_steps(schedule, steps, tokens_per_step):
    """[(first step, length, batch)]: entry i from step floor(fraction * steps + 1/2), batch = tokens_per_step /
    length (refused unless whole). Entries that start at the same step as the next are dropped."""
    rows = []
    for length, frac in schedule:
        if tokens_per_step % length:
            raise ValueError(f"{tokens_per_step} tokens per step is not a whole number of {length}-byte sequences")
        rows.append((int(math.floor(frac * steps + 0.5)), length, tokens_per_step // length))
    return [r for i, r in enumerate(rows) if i + 1 == len(rows) or rows[i + 1][0] > r[0]]


def refit_segments(segments, steps, new_steps, step):
    """The curriculum `segments` (planned for `steps`) stretched to `new_steps` when --minutes refits the
    schedule before the 0-based step `step`: segments that have begun keep their start (what ran stays as
    logged), later ones keep their fraction of the schedule but start no earlier than `step`; one overtaken
    by the next is dropped, so the context only grows."""
    rows = [[start if start <= step else max(step, int(math.floor(start / steps * new_steps + 0.5))), length, batch]
            for start, length, batch in segments]
    return [r for i, r in enumerate(rows) if i + 1 == len(rows) or rows[i + 1][0] > r[0]]


def shape_at(segments, step):
    """(length, batch) of the training step `step` (0-based)."""
    cur = segments[0]
    for seg in segments:
        if seg[0] <= step:
            cur = seg
    return cur[1], cur[2]


# ---- training ---------------------------------------------------------------------------------------

def lr_at(step, total, warmup, peak, final_ratio=0.1):
    """Linear warm-up over `warmup` steps, then cosine from peak to final_ratio * peak at step total - 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    span = max(1, total - 1 - warmup)
    frac = min(1.0, (step - warmup) / span)
    return peak * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def fast_paths():
    """Which optional kernel packages are importable (transformers uses them instead of its torch code)."""
    import importlib.util
    return {pkg: importlib.util.find_spec(pkg) is not None for pkg in ("mamba_ssm", "causal_conv1d", "fla")}


FIT_STEPS = (30, 200, 1000, 3000)  # after these steps the step count is fitted to --minutes (timed from step 10)


def make_optimizer(model, args, device, torch):
    decay, no_decay = [], []
    for name, prm in model.named_parameters():
        (decay if prm.dim() >= 2 else no_decay).append(prm)
    use_fused = device.type == "cuda"
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=use_fused), use_fused


def train(model, corpus, args, device, torch, log, resume=None):
    """Runs the training loop; returns the log dict (per-step loss, learning rate and shape, timings).

    resume: None (one run, today's behaviour: --minutes fits the schedule to the budget), or a dict with
    'dir', 'identity', 'manifest' (None for a first run): --steps is then the whole schedule, --minutes and
    --stop-after-steps bound this run, and the state is saved every --save-every-minutes and at the end."""
    import torch.nn.functional as F
    from . import train_resume

    data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8).to(device)
    segments = args.segments
    longest = max(length for _, length, _ in segments)
    if len(corpus) - longest - 1 <= 0:
        raise TextError(f"training text ({len(corpus)} bytes) is shorter than the longest training sequence + 1 "
                        f"({longest + 1})")
    gen = torch.Generator().manual_seed(args.seed + 1)
    opt, use_fused = make_optimizer(model, args, device, torch)
    amp = (args.amp == "bf16") or (args.amp == "auto" and device.type == "cuda")
    budget_s = args.minutes * 60.0 if args.minutes > 0 else math.inf
    total = args.steps
    warmup = max(1, min(args.warmup, total // 5))
    # the whole training's per-step log (earlier runs' part restored from the resume folder)
    hist = {"loss": [], "lr": [], "seq_len": [], "batch": [], "log": [], "notes": [], "runs": []}
    step = 0
    if resume is not None and resume["manifest"] is not None:
        m = resume["manifest"]
        rng = train_resume.load(resume["dir"], m, model, opt, torch, device)
        gen.set_state(rng["sampler"])
        torch.set_rng_state(rng["torch_cpu"])
        if device.type == "cuda" and "torch_cuda" in rng:
            torch.cuda.set_rng_state(rng["torch_cuda"], device)
        hist = m["log"]
        step = m["step"]
        log(f"resumed from {resume['dir']} at step {step} of {total} (saved by run {len(hist['runs'])})")
    run_start_step = step
    run_losses = torch.zeros(max(0, total - step), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    offsets = {}
    probe = probe_windows(corpus, torch, device)

    def generators():
        g = {"sampler": gen, "torch_cpu": torch.get_rng_state()}
        if device.type == "cuda":
            g["torch_cuda"] = torch.cuda.get_rng_state(device)
        return g

    def flush_losses():  # this run's losses so far into hist (one device sync)
        lo = len(hist["loss"]) - run_start_step
        if step > len(hist["loss"]):
            hist["loss"] += run_losses[lo:step - run_start_step].tolist()

    def save_resume(reason):
        flush_losses()
        runs = hist["runs"][:-1] + [dict(hist["runs"][-1], end_step=step,
                                         wall_s=round(time.perf_counter() - t0, 3))]
        state = dict(hist, runs=runs)
        nbytes = train_resume.save(resume["dir"], step, resume["identity"], model, opt, generators(), state, torch,
                                   moments=args.resume_moments)
        log(f"saved the training at step {step} to {resume['dir']} ({nbytes / 1e6:.1f} MB; {reason})")

    hist["runs"].append({"run": len(hist["runs"]) + 1, "start_step": step, "device": str(device),
                         "minutes": args.minutes})
    model.train()
    t0 = time.perf_counter()
    last_save = t0
    mark = None
    stop_reason = None
    entered = (None, step)  # (length, first step) of the curriculum segment running now
    while step < total:
        seq_len, batch = shape_at(segments, step)
        if seq_len != entered[0]:
            entered = (seq_len, step)
        if seq_len not in offsets:
            offsets[seq_len] = torch.arange(seq_len + 1, device=device)
        lr = lr_at(step, total, warmup, args.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(corpus) - seq_len - 1, (batch,), generator=gen).to(device)
        xy = data[starts[:, None] + offsets[seq_len]].long()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=xy[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xy[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_losses[step - run_start_step] = loss.detach()
        hist["lr"].append(lr)
        hist["seq_len"].append(int(xy.shape[1]) - 1)
        hist["batch"].append(int(xy.shape[0]))
        step += 1
        run_step = step - run_start_step

        # Refit after FIT_STEPS and 40 steps into each longer context (a step's time depends on its length),
        # timing from 10 steps into the segment (steps 1-10 of a shape warm up the allocator and kernel choice).
        in_segment = step - entered[1]
        later_segment = entered[1] > run_start_step
        fit_now = resume is None and math.isfinite(budget_s) and (step in FIT_STEPS or (later_segment and in_segment == 40))
        if run_step <= FIT_STEPS[0] or fit_now or (later_segment and in_segment == 10) or \
                step % args.log_every == 0 or step == total:
            sync()
            now = time.perf_counter() - t0
            if run_step == 1 and not math.isfinite(loss.item()):
                raise RuntimeError(f"the loss is not finite at step {step}")
            if run_step == 10 or (later_segment and in_segment == 10):
                mark = (step, now)
            # A fit step that is also a segment's 10th step has no timed steps yet: that segment's own refit at
            # its 40th step does the fitting.
            if fit_now and mark is not None and step > mark[0]:  # time the steps since the last mark
                per_step = (now - mark[1]) / (step - mark[0])
                mark = (step, now)
                fits = step + int(max(0.0, budget_s * 0.98 - now) / per_step)
                fitted = min(args.steps, max(step, fits))
                if fitted != total:
                    hist["notes"].append(f"step {step}: {per_step * 1e3:.1f} ms/step, the {args.minutes:g}-minute "
                                         f"budget fits {fits} steps (--steps {args.steps}): schedule set to "
                                         f"{fitted} steps")
                    log(hist["notes"][-1])
                    if len(segments) > 1:  # the curriculum keeps its fractions of the fitted schedule
                        segments = refit_segments(segments, total, fitted, step)
                        args.segments = segments
                        hist["notes"].append("context schedule now " + ", ".join(
                            f"{length} bytes x {b} from step {start}" for start, length, b in segments))
                        log(hist["notes"][-1])
                    total = fitted
                    warmup = max(1, min(args.warmup, total // 5))
            if step % args.log_every == 0 or step == total:
                lo = max(run_start_step, step - args.log_every) - run_start_step
                recent = run_losses[lo:run_step].mean().item()
                hist["log"].append({"step": step, "loss": recent, "lr": lr, "seq_len": seq_len, "batch": batch,
                                    "elapsed_s": round(now, 3), "run": hist["runs"][-1]["run"],
                                    "memory": memory_summary(head_memories(model, torch)),
                                    "memory_text": memory_summary(text_memories(model, probe, args.arch, torch, amp) or [])})
                log(f"step {step:6d}/{total}  loss {recent:.4f}  ({recent / math.log(2):.3f} bits/byte)  "
                    f"lr {lr:.2e}  {seq_len} x {batch}  {now:7.1f} s")
                if not math.isfinite(recent):
                    raise RuntimeError(f"the training loss is {recent} at step {step}")
        if step >= total:
            break
        if time.perf_counter() - t0 >= budget_s:
            stop_reason = f"the {args.minutes:g}-minute budget of this run is spent"
        elif args.stop_after_steps and run_step >= args.stop_after_steps:
            stop_reason = f"--stop-after-steps {args.stop_after_steps} reached"
        if stop_reason:
            if resume is None:
                hist["notes"].append(f"stopped at step {step} of {total}: {stop_reason} (learning rate not fully "
                                     "decayed)")
                log(hist["notes"][-1])
            break
        if resume is not None and args.save_every_minutes > 0 and \
                time.perf_counter() - last_save >= 60.0 * args.save_every_minutes:
            sync()
            save_resume(f"every {args.save_every_minutes:g} minutes")
            last_save = time.perf_counter()
    sync()
    wall = time.perf_counter() - t0
    flush_losses()
    hist["runs"][-1].update(end_step=step, wall_s=round(wall, 3))
    if resume is not None and (step > run_start_step or resume["manifest"] is None):
        save_resume(stop_reason or "the last step")
    finished = step >= total
    if resume is not None and not finished:
        log(f"stopped at step {step} of {total}: {stop_reason}; run the same command again to continue")
    loss_list = hist["loss"]
    tail = loss_list[-min(len(loss_list), max(1, args.log_every)):] or [math.nan]
    wall_all = sum(r["wall_s"] for r in hist["runs"])
    return {
        "finished": finished, "steps": step, "scheduled_steps": total, "warmup_steps": warmup, "wall_s": wall_all,
        "tokens_seen": sum(a * b for a, b in zip(hist["seq_len"], hist["batch"])), "loss": loss_list,
        "lr": hist["lr"], "seq_len": hist["seq_len"], "batch": hist["batch"], "log": hist["log"],
        "final_loss": sum(tail) / len(tail), "final_loss_steps": len(tail), "amp_bf16": amp,
        "notes": hist["notes"], "runs": hist["runs"], "ms_per_step": 1e3 * wall_all / max(1, step),
        "fused_adamw": use_fused,
    }


# ---- evaluation -------------------------------------------------------------------------------------

def _cache_kwargs(arch, cache):
    return {"cache_params": cache} if arch == "mamba2" else {"past_key_values": cache}


def _next_cache(arch, out):
    return out.cache_params if arch == "mamba2" else out.past_key_values


def evaluate(model, arch, books, seq_len, chunk, batch, device, torch):
    """Bits per byte on each book: streamed (cache carried, one context per book) and windowed."""
    import torch.nn.functional as F

    model.eval()
    rows = []
    with torch.no_grad():
        for name, text in books:
            ids = torch.frombuffer(bytearray(text), dtype=torch.uint8).long().to(device)[None]
            n = ids.shape[1] - 1  # bytes predicted
            # streamed
            nll, cache = 0.0, None
            for s in range(0, n, chunk):
                out = model(input_ids=ids[:, s:min(s + chunk, n)], use_cache=True, **_cache_kwargs(arch, cache))
                cache = _next_cache(arch, out)
                tgt = ids[:, s + 1:min(s + chunk, n) + 1]
                nll += F.cross_entropy(out.logits[0].double(), tgt[0], reduction="sum").item()
            streamed = nll / n / math.log(2)
            # windowed: inputs ids[s:s + seq_len] predict ids[s + 1:s + seq_len + 1], s = 0, seq_len, ...
            nll_w, full = 0.0, n // seq_len
            for lo in range(0, full, batch):
                starts = range(lo * seq_len, min(full, lo + batch) * seq_len, seq_len)
                x = torch.stack([ids[0, s:s + seq_len] for s in starts])
                y = torch.stack([ids[0, s + 1:s + seq_len + 1] for s in starts])
                logits = model(input_ids=x, use_cache=False).logits
                nll_w += F.cross_entropy(logits.double().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                         reduction="sum").item()
            if n % seq_len:
                s = full * seq_len
                logits = model(input_ids=ids[:, s:n], use_cache=False).logits
                nll_w += F.cross_entropy(logits[0].double(), ids[0, s + 1:n + 1], reduction="sum").item()
            rows.append({"book": name, "bytes": int(ids.shape[1]), "predicted": n,
                         "bpb_streamed": streamed, "bpb_windowed": nll_w / n / math.log(2)})
    total = sum(r["predicted"] for r in rows)
    return {
        "books": rows,
        "bpb_streamed": sum(r["bpb_streamed"] * r["predicted"] for r in rows) / total,
        "bpb_windowed": sum(r["bpb_windowed"] * r["predicted"] for r in rows) / total,
        "predicted_bytes": total,
    }


# ---- the model card ---------------------------------------------------------------------------------

def _fmt_bytes(n):
    return f"{n:,} bytes ({n / 2 ** 20:.2f} MiB)"


def shape_text(a):
    """'batch 16 x 1024 bytes', or the context schedule with its batches."""
    segs = a["segments"]
    if len(segs) == 1:
        return f"batch {segs[0][2]} x {segs[0][1]} bytes"
    return (f"{a['tokens_per_step']:,} tokens per step; context schedule (--seq-len-schedule "
            f"{a['seq_len_schedule']}): " + ", ".join(f"{b} x {n} bytes from step {s}" for s, n, b in segs))


def write_card(path, info):
    c = info
    lines = [f"# {c['name']}: byte-level {c['arch_title']} trained by scripts/train_tiny.py", "",
             "## Architecture", "",
             f"- class: `{c['model_class']}` (model_type `{c['model_type']}`), layers `{c['pattern']}` "
             f"({c['pattern_legend']})",
             f"- parameters: {c['parameters']:,} ({c['checkpoint_bytes'] / 1e6:.2f} MB float32 safetensors)",
             "- tokenizer: bytes, token id = byte value, vocab_size 256; no BOS/EOS is ever inserted; "
             f"{c['special_ids']}", "",
             "## Config summary", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in c["config_rows"]]
    lines += ["", "## Training text", "",
              f"- folder: `{c['train_dir']}`, {len(c['books'])} books, {_fmt_bytes(c['raw_bytes'])} as files, "
              f"{_fmt_bytes(c['text_bytes'])} after stripping ({STRIP_VERSION}: BOM, CRLF, Project Gutenberg "
              "header and licence footer removed)",
              f"- PG-19 test books excluded: {c['exclusion']}",
              "- files: " + ", ".join(f"{b['file']} ({b['text_bytes']:,})" for b in c["books"]), "",
              "## Training", "",
              f"- steps: {c['steps']} (scheduled {c['scheduled_steps']}, --steps {c['args']['steps']}, "
              f"--minutes {c['args']['minutes']:g}), " + shape_text(c['args']),
              f"- tokens seen: {c['tokens_seen']:,} ({c['tokens_seen'] / max(1, c['text_bytes']):.2f} passes "
              "over the text)",
              f"- optimiser: AdamW (betas 0.9/0.95, weight decay {c['args']['weight_decay']:g} on matrices), "
              f"peak lr {c['args']['lr']:g}, {c['warmup_steps']} warm-up steps, cosine to 10%, clip 1.0",
              f"- precision: float32 weights, {'bf16 autocast' if c['amp_bf16'] else 'float32 compute'}"
              f"{', TF32 matmuls' if c['tf32'] else ''}; "
              f"SSM code: {c['scan_note']}",
              f"- wall time: {c['wall_s']:.1f} s training ({c['ms_per_step']:.1f} ms/step), {c['total_s']:.1f} s "
              "in all",
              f"- device: {c['device']}",
              f"- seed: {c['args']['seed']}",
              f"- final training loss: {c['final_loss']:.4f} nats/byte = {c['final_loss'] / math.log(2):.4f} "
              f"bits/byte (mean of the last {c['final_loss_steps']} steps); curve in train_log.json"]
    runs = c.get("runs") or []
    if len(runs) > 1 or (runs and c["args"].get("resume_dir")):
        lines += [f"- runs: {len(runs)} (resumed from `--resume-dir`): " + ", ".join(
            f"steps {r['start_step']}-{r['end_step']} on {r['device']} in {r['wall_s']:.0f} s" for r in runs)]
    lines += [f"- note: {n}" for n in c["notes"]]
    lines += ["", "## Bits per byte on the PG-19 test books", ""]
    ev = c["eval"]
    if ev is None:
        lines += [f"Skipped: {c['eval_skipped']}"]
    else:
        lines += [f"First {c['args']['eval_bytes']:,} bytes of each book after stripping, teacher-forced, float32, "
                  "transformers' own forward (reference torch paths). Streamed: chunks of "
                  f"{c['args']['eval_chunk']} bytes with the cache carried (one context per book); windowed: "
                  f"independent windows of {c['args']['seq_len']} bytes. Every byte after the first is predicted "
                  "once.", "",
                  "| book | bytes | bpb streamed | bpb windowed |", "|---|---|---|---|"]
        lines += [f"| {r['book']} | {r['bytes']:,} | {r['bpb_streamed']:.4f} | {r['bpb_windowed']:.4f} |"
                  for r in ev["books"]]
        lines += [f"| **all** | {ev['predicted_bytes']:,} predicted | **{ev['bpb_streamed']:.4f}** | "
                  f"**{ev['bpb_windowed']:.4f}** |", "", f"Evaluation time: {c['eval_s']:.1f} s."]
    lines += [""] + decay_section(c)
    lines += ["", "## Software", "",
              f"- transformers {c['versions']['transformers']}, torch {c['versions']['torch']}, "
              f"python {c['versions']['python']}, {c['versions']['platform']}",
              f"- optional kernels importable: {c['fast_paths']}", "",
              "## Command", "", "```", c["command"], "```", "",
              f"Same steps without a time budget: `{c['repeat_command']}`", ""]
    write_text_atomically(path, "\n".join(lines))


def logged_args(args):
    """vars(args) for the log and the card, the replayssm binary relative to the checkout when inside it
    (a machine's absolute path says nothing to the next reader)."""
    out = dict(vars(args))
    try:
        out["replayssm"] = str(pathlib.Path(out["replayssm"]).resolve().relative_to(ROOT.resolve()))
    except (KeyError, TypeError, ValueError):
        pass
    return out


def with_option(argv, flag, value):
    """argv with `flag value` set (replacing `flag X` or `flag=X`)."""
    return without_option(argv, flag) + [flag, value]


def without_option(argv, flag):
    """argv without `flag X` / `flag=X`."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == flag:
            i += 2
            continue
        if not argv[i].startswith(flag + "="):
            out.append(argv[i])
        i += 1
    return out


# The arguments that fix a training's result: a resumed run must repeat them (train_resume.check_identity).
IDENTITY_ARGS = ("arch", "preset", "steps", "segments", "tokens_per_step", "seed", "lr", "warmup", "weight_decay",
                 "amp", "mamba_scan", "gdn_chunk", "gdn_scan", "decay_init", "init_memory", "resume_moments")


def training_identity(args, corpus):
    ident = {f"--{k.replace('_', '-')}": json.loads(json.dumps(getattr(args, k))) for k in IDENTITY_ARGS}
    ident["training text sha256"] = hashlib.sha256(corpus).hexdigest()
    return ident


def decay_spectrum(out, args, log):
    """Runs `replayssm info OUT --decays` on the PG-19 test books (decays.json beside the card). Returns
    (the JSON's content plus the command, None) or (None, why it was skipped)."""
    import subprocess
    exe = pathlib.Path(args.replayssm)
    if args.decay_length == 0:
        return None, "--decay-length 0"
    if not exe.exists():
        return None, f"no replayssm binary at `{args.replayssm}` (build it, or give --replayssm BIN)"
    if not pathlib.Path(args.pg19_dir).is_dir():
        return None, f"the PG-19 test folder `{args.pg19_dir}` does not exist"
    target = out / "decays.json"
    cmd = [str(exe), "info", str(out), "--decays", "--text-dir", str(args.pg19_dir), "--length",
           str(args.decay_length), "--books", "4", "--windows", "16", "--json", str(target), "--force"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"`{shlex.join(cmd)}` failed (exit {r.returncode}): {r.stderr.strip()[-500:]}"
    j = json.loads(target.read_text())
    j["command"] = shlex.join(["replayssm", *cmd[1:-1]])
    j["seconds"] = round(time.perf_counter() - t0, 1)
    s = j["summary"]
    log(f"decay spectrum: {s['heads']} heads, median memory {s['median_memory_tokens']}, "
        f"{s['long_memory_heads']} with >= {s['long_memory_tokens']:.0f} tokens ({j['seconds']} s)")
    return j, None


def _tokens(x):
    return "inf" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:.1f}")


def decay_section(c):
    """The card's "Decay spectrum" lines (data/models/README.md)."""
    lines = ["## Decay spectrum (how long the heads remember)", ""]
    init = c.get("init_memories") or []
    kda = c["args"].get("arch") == "kimi_linear"  # KDA decays per key channel: the channels take the quantiles
    if c["args"].get("decay_init") == "log-uniform":
        lo, hi = c["args"]["init_memory"]
        who, how = (("KDA decays per key channel, so each channel's dt_bias set (A_log 0)", "init_long_memory_kda")
                    if kda else ("each SSM head's A_log and dt_bias set", "init_long_memory"))
        lines += [f"Initialisation (`--decay-init log-uniform`): {who} so that its "
                  f"memory 1/(1 - alpha) with the input's share of dt at 0 is a quantile of the log-uniform law on "
                  f"[{lo:g}, {hi:g}] tokens, every layer spanning the whole range (train.py {how})."]
    else:
        lines += ["Initialisation: transformers' own (`--decay-init transformers`)."]
    flat = sorted(m for layer in init for m in layer)
    if flat:
        lines += [f"From the initial weights (input's share of dt at 0): {len(flat)} {'channels' if kda else 'heads'}, memory "
                  f"{_tokens(flat[0])} to {_tokens(flat[-1])} tokens, median {_tokens(flat[len(flat) // 2])}.", ""]
    trace = memory_trace_line(c.get("log"), kda)
    if trace:
        lines += [trace, ""]
    d = c.get("decays")
    if d is None:
        return lines + [f"Measured on text: skipped ({c.get('decays_note')})."]
    s = d["summary"]
    n = s["heads"]
    lines += [f"`{d['command']}` (CPU, FP32 state; the first {d['positions_per_book']:,} bytes of each PG-19 test "
              f"book after stripping; {d['seconds']} s). Effective memory of a head: 1/(1 − mean α) tokens over "
              f"every position. {n} SSM heads: median {_tokens(s['median_memory_tokens'])} tokens, largest "
              f"{_tokens(s['max_memory_tokens'])}; heads with memory ≥ {s['long_memory_tokens']:,.0f} tokens "
              f"(where state errors accumulate over 128K): **{s['long_memory_heads']} of {n}**.", "",
              "| memory (tokens) | heads |", "|---|---|"]
    lines += [f"| {name} | {k} |" for name, k in zip(s["decades"], s["heads_per_decade"])]
    # KDA: a head's mean alpha mixes fast and slow channels; its slowest channel is what remembers. (replayssm
    # info writes max_channel_memory_tokens for every head; for one decay per head it is the head's memory.)
    longest = sorted(h["max_channel_memory_tokens"] for h in d.get("heads", [])
                     if h.get("channels", 1) > 1 and h.get("max_channel_memory_tokens") is not None)
    if longest:
        n_long = sum(m >= s["long_memory_tokens"] for m in longest)
        lines += ["", f"Per key channel (KDA decays per channel): each head's longest-remembering channel holds median "
                      f"{_tokens(statistics.median(longest))} tokens, largest {_tokens(longest[-1])}; heads with a channel "
                      f"of memory ≥ {s['long_memory_tokens']:,.0f} tokens: **{n_long} of {len(longest)}**."]
    books = ", ".join(f"{b['name']} {b['bits_per_byte']:.4f}" for b in d["books"])
    lines += ["", f"Bits per byte of the same run (replayssm's forward, {d['positions_per_book']:,} positions per "
                  f"book): {books}; mean {d['mean_bits_per_byte']:.4f}. Per-head α histograms and quantiles and γ "
                  "over L = 16: `decays.json` beside this card."]
    return lines


def splice_section(card, heading_prefix, lines, before="## Software"):
    """The card's text with the section whose heading starts with heading_prefix replaced by `lines` (or
    inserted before the `before` heading)."""
    rows = card.split("\n")
    start = next((i for i, r in enumerate(rows) if r.startswith(heading_prefix)), None)
    if start is None:
        at = next((i for i, r in enumerate(rows) if r.startswith(before)), len(rows))
        return "\n".join(rows[:at] + lines + [""] + rows[at:])
    end = next((i for i in range(start + 1, len(rows)) if rows[i].startswith("## ")), len(rows))
    return "\n".join(rows[:start] + lines + [""] + rows[end:])


def add_decays(args):
    """scripts/train_tiny.py --add-decays DIR: measures the decay spectrum of a trained folder (one trained where
    no replayssm binary was, e.g. on a GPU machine) and writes it into its card, train_log.json and decays.json."""
    def log(msg):
        print(f"[train_tiny add-decays] {msg}", file=sys.stderr, flush=True)

    out = pathlib.Path(args.add_decays)
    card_path, log_path = out / "MODEL_CARD.md", out / "train_log.json"
    for f in (card_path, log_path):
        if not f.exists():
            print(f"train_tiny.py: --add-decays {out}: {f.name} is missing (a folder written by train_tiny.py?)",
                  file=sys.stderr)
            return EXIT_REFUSED
    train_log = json.loads(log_path.read_text())
    decays, note = decay_spectrum(out, args, log)
    if decays is None:
        print(f"train_tiny.py: --add-decays {out}: {note}", file=sys.stderr)
        return EXIT_REFUSED
    c = {"args": train_log["args"], "init_memories": train_log.get("init_memory_tokens"), "decays": decays,
         "log": train_log.get("log")}
    card = splice_section(card_path.read_text(), "## Decay spectrum", decay_section(c))
    write_text_atomically(card_path, card)
    train_log["decays"], train_log["decays_note"] = decays, None
    write_text_atomically(log_path, json.dumps(train_log, indent=1) + "\n")
    log(f"wrote the decay spectrum into {card_path} and {log_path}")
    return 0


def run(args, argv, script):
    """The whole run of scripts/train_tiny.py: args as it parsed them, argv and the script's path
    for the card's command lines. Returns the exit status (EXIT_REFUSED for unusable text or output)."""
    t_start = time.perf_counter()

    def log(msg):
        print(f"[train_tiny {args.arch}] {msg}", file=sys.stderr, flush=True)

    # The data checks come first: a refusal needs neither torch nor transformers.
    try:
        corpus, books = load_training_text(args.train_dir, args.pg19_dir)
        eval_books = load_eval_books(args.pg19_dir, args.eval_bytes) if args.eval_bytes > 0 else None
    except TextError as e:
        print(f"train_tiny.py: {e}", file=sys.stderr)
        return EXIT_REFUSED
    out = pathlib.Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        print(f"train_tiny.py: {out} exists and is not empty (--force replaces it)", file=sys.stderr)
        return EXIT_REFUSED
    resume = None
    if args.resume_dir:
        from . import train_resume
        identity = training_identity(args, corpus)
        try:
            manifest = train_resume.read_manifest(args.resume_dir)
            if manifest is not None:
                train_resume.check_identity(manifest, identity, args.resume_dir)
                if manifest.get("finished"):
                    raise train_resume.ResumeError(
                        f"{args.resume_dir} holds a finished training (step {manifest['step']}, written to "
                        f"{manifest['finished']['out']}): nothing to continue; another --resume-dir starts anew")
        except train_resume.ResumeError as e:
            print(f"train_tiny.py: {e}", file=sys.stderr)
            return EXIT_REFUSED
        resume = {"dir": args.resume_dir, "identity": identity, "manifest": manifest}
    pg19 = pathlib.Path(args.pg19_dir)
    exclusion = (f"the training folder is not `{args.pg19_dir}` and shares no file name or contents with its "
                 f"{sum(p.suffix.lower() == '.txt' for p in pg19.iterdir())} .txt files" if pg19.is_dir() else
                 f"`{args.pg19_dir}` not found, so only its path was checked")
    log(f"{len(books)} books, {len(corpus):,} bytes of text from {args.train_dir}")

    # Deterministic cuBLAS needs this before CUDA starts; keep transformers off the network.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("train_tiny.py: --device cuda but torch sees no GPU", file=sys.stderr)
        return EXIT_REFUSED
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # NaN-filling every new tensor costs GPU time
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the float32 SSM matmuls in training
        torch.backends.cudnn.allow_tf32 = True

    if resume is not None and resume["manifest"] is not None and \
            resume["manifest"]["identity"].get("device_type") != device.type:
        print(f"train_tiny.py: {args.resume_dir} holds a training on {resume['manifest']['identity'].get('device_type')}"
              f", this run is on {device.type}: give --device {resume['manifest']['identity'].get('device_type')} to "
              "continue it", file=sys.stderr)
        return EXIT_REFUSED
    if resume is not None:
        resume["identity"]["device_type"] = device.type

    config = build_config(args.arch, args.preset, transformers)
    model = build_model(args.arch, config, transformers).to(torch.float32).to(device)
    init_targets = init_long_memory(model, torch, *args.init_memory) if args.decay_init == "log-uniform" else None
    init_memories = head_memories(model, torch)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{type(model).__name__} {layer_pattern(args.arch, config)}: {n_params:,} parameters on {device}")

    scan = None
    uses_mamba2 = args.arch in ("mamba2", "nemotron_h")
    if uses_mamba2 and args.mamba_scan == "einsum" and not fast_paths()["mamba_ssm"]:
        from transformers.models.mamba2 import modeling_mamba2
        scan = make_einsum_chunk_scan(modeling_mamba2.mamba2_chunk_scan)
    if uses_mamba2:
        scan_note = ("mamba_ssm kernels" if fast_paths()["mamba_ssm"] else
                     "Mamba-2 chunk scan in einsum form (replayssm_py/train.py) for training, transformers' reference "
                     "torch scan for evaluation" if scan is not None else "transformers' reference torch scan")
    else:
        rule = "Kimi Delta Attention" if args.arch == "kimi_linear" else "Gated DeltaNet"
        scan_note = "flash-linear-attention kernels" if fast_paths()["fla"] else \
            f"transformers' reference torch {rule} (chunked, {args.gdn_chunk} positions per chunk in " \
            f"training, {GDN_DEFAULT_CHUNK} in evaluation)" + (
                "; in training the chunks' states by an associative scan (replayssm_py/train.py) instead of its "
                "loop over chunks" if args.gdn_scan == "associative" else "")

    log(f"SSM code: {scan_note}; optional kernels importable: {fast_paths()}")
    gdn = (args.gdn_chunk, args.gdn_scan, args.arch) if args.arch in DELTA_RULES else (None, "loop")
    with MambaScan(scan), GatedDeltaChunk(*gdn):
        result = train(model, corpus, args, device, torch, log, resume)
    log(f"trained {result['steps']} steps in {result['wall_s']:.1f} s ({result['ms_per_step']:.1f} ms/step), "
        f"final loss {result['final_loss']:.4f}")
    if not result["finished"] and resume is not None:
        return 0  # the state is saved in --resume-dir: the same command continues it
    # without --resume-dir a run the budget cut short is still written (its card notes the early stop)

    model = model.to(torch.float32)
    t_eval = time.perf_counter()
    ev, skipped = None, None
    if eval_books is None:
        skipped = ("--eval-bytes 0" if args.eval_bytes == 0 else
                   f"the PG-19 test folder `{args.pg19_dir}` does not exist")
    else:
        prev = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")  # no TF32 in the evaluation
        torch.backends.cudnn.allow_tf32 = False
        try:
            ev = evaluate(model, args.arch, eval_books, args.seq_len, args.eval_chunk, args.eval_batch, device,
                          torch)
        finally:
            torch.set_float32_matmul_precision(prev)
        log(f"PG-19 bits/byte: streamed {ev['bpb_streamed']:.4f}, windowed {ev['bpb_windowed']:.4f}")
    eval_s = time.perf_counter() - t_eval

    if out.exists() and args.force:
        for f in out.iterdir():
            if f.is_file():
                f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    model.cpu().save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    ckpt_bytes = (out / "model.safetensors").stat().st_size
    if ckpt_bytes > MAX_CHECKPOINT_BYTES:
        log(f"warning: model.safetensors is {ckpt_bytes / 1e6:.1f} MB, over the 25 MB target")

    decays, decays_note = decay_spectrum(out, args, log)

    command = "python3 " + shlex.join([os.path.relpath(script, os.getcwd()), *argv])
    repeat = without_option(with_option(with_option(argv, "--steps", str(result["steps"])), "--minutes", "0"),
                            "--resume-dir")
    if "--seq-len-schedule" in argv:  # the curriculum as it ran (fitting --minutes may have moved it)
        repeat = with_option(repeat, "--seq-len-schedule", ",".join(
            f"{length}:{start / result['steps']!r}" for start, length, _ in args.segments))
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    info = {
        "name": out.name, "arch": args.arch,
        "arch_title": ARCH_TITLES[args.arch],
        "model_class": type(model).__name__, "model_type": config.model_type,
        "pattern": layer_pattern(args.arch, config),
        "pattern_legend": PATTERN_LEGENDS[args.arch],
        "parameters": n_params, "checkpoint_bytes": ckpt_bytes,
        "special_ids": ("pad/bos/eos none" if args.arch == "qwen3_5" else
                        "pad_token_id 0 (NUL, never in the text), bos/eos none"),
        "decays": decays, "decays_note": decays_note, "init_memories": init_memories, "init_targets": init_targets,
        "log": result["log"],
        "config_rows": config_summary(args.arch, config), "train_dir": args.train_dir, "books": books,
        "raw_bytes": sum(b["raw_bytes"] for b in books), "text_bytes": len(corpus), "exclusion": exclusion,
        "args": logged_args(args), "scan_note": scan_note, "device": dev_name, "eval": ev, "eval_skipped": skipped,
        "eval_s": eval_s, "total_s": time.perf_counter() - t_start, "fast_paths": fast_paths(),
        "tf32": device.type == "cuda",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": platform.python_version(), "platform": platform.platform()},
        "command": command, "repeat_command": "python3 " + shlex.join([os.path.relpath(script, os.getcwd()),
                                                                       *repeat]),
        **{k: result[k] for k in ("steps", "scheduled_steps", "warmup_steps", "tokens_seen", "wall_s",
                                  "ms_per_step", "final_loss", "final_loss_steps", "amp_bf16", "notes",
                                  "runs")},
    }
    write_card(out / "MODEL_CARD.md", info)
    train_log = {
        "format": "replayssm-train-log", "version": 1, "arch": args.arch, "model_class": info["model_class"],
        "parameters": n_params, "args": logged_args(args), "command": command, "device": dev_name,
        "versions": info["versions"], "books": books, "text_bytes": len(corpus),
        "tokens_per_step": args.tokens_per_step, "eval": ev, "eval_skipped": skipped,
        "decay_init": args.decay_init, "init_memory_tokens": init_memories, "decays": decays,
        "decays_note": decays_note,
        **{k: v for k, v in result.items()},
    }
    write_text_atomically(out / "train_log.json", json.dumps(train_log, indent=1) + "\n")
    log(f"wrote {out} ({ckpt_bytes / 1e6:.2f} MB checkpoint) in {info['total_s']:.1f} s")
    if resume is not None:  # the training is in --out now: only a note stays (small, for the transfer back)
        from . import train_resume
        train_resume.mark_finished(args.resume_dir, result["steps"], str(out))
        log(f"{args.resume_dir}: the saved state is removed, resume.json records the finished training")
    return 0
