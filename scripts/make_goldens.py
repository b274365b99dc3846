#!/usr/bin/env python3
"""Generate tiny random Hugging Face checkpoints and their reference log-probabilities.

What it does
------------
For each architecture the C++ model loader supports (``src/model/``), builds a tiny model with
transformers' own classes, randomises its weights (fixed seed, scales chosen so that the logits
are far from uniform and the SSM heads span fast and slow decays), saves it with
``save_pretrained`` (config.json + model.safetensors) into ``data/models/<name>/`` and writes

* ``tokens.npy``    int64 (N,): a fixed token sequence (N = 320, seed below);
* ``logprobs.npy``  float32 (N, vocab): transformers' FP32 forward, log_softmax over the vocabulary
                    (taken in float64 from the float32 logits, then rounded to float32);
* ``golden.json``   the transformers and torch versions, the seed, the model class, the shapes.

The reference is transformers' slow torch path on the CPU (no CUDA or hub kernels, eager
attention, chunked SSM scans), an implementation independent of ours.

Models (all FP32; dk = 128 everywhere so that every state format applies: NVFP4 blocks of 16
and FP8 blocks of 128 run along dk):

* ``mamba2_tiny``    Mamba2ForCausalLM, 3 layers, n_groups = 2, dk (state) 128 != dv (head) 16,
                     finite dt limits (both clamps active), untied LM head.
* ``nemotron_h_tiny`` NemotronHForCausalLM, pattern ``M*-M-*``: Mamba-2 (n_groups 2, grouped
                     gated norm, dt clamped at time_step_min), attention without RoPE (GQA 4:2),
                     relu2 MLP; untied LM head.
* ``qwen3_5_tiny``   Qwen3_5ForCausalLM (Qwen3_5TextConfig), layers GDN,GDN,attn,GDN,attn:
                     4 value heads on 2 key heads, dk 128 != dv 16, gated attention with q/k norm and
                     partial RoPE (factor 0.5), GQA 4:2, SwiGLU MLP, tied embeddings.

Run:  python3 scripts/make_goldens.py [--out data/models]   (needs torch and transformers).
The tests read the files only; regenerate when transformers' modelling code changes.
"""
import argparse
import json
import math
import pathlib
import shutil

import numpy as np

SEED = 20261130
N_TOKENS = 320
FORMAT_VERSION = 1


def randomise(model, torch, gen, kind):
    """Weights with O(1) activations everywhere and peaked output distributions."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("A_log"):
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
    raise ValueError(name)


def main():
    import torch
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parents[1] / "data" / "models"))
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    out_root = pathlib.Path(args.out)
    torch.set_grad_enabled(False)
    names = args.only or ["mamba2_tiny", "nemotron_h_tiny", "qwen3_5_tiny"]
    for i, name in enumerate(names):
        torch.manual_seed(SEED + i)
        gen = torch.Generator().manual_seed(SEED + 100 + i)
        model, kind = build(name, transformers, torch)
        model = model.to(torch.float32).eval()
        randomise(model, torch, gen, kind)
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()
        model.config._attn_implementation = "eager"
        vocab = model.config.vocab_size
        rng = np.random.default_rng(SEED + i)
        tokens = rng.integers(0, vocab, N_TOKENS, dtype=np.int64)
        logits = model(input_ids=torch.from_numpy(tokens)[None], use_cache=False).logits[0]
        assert logits.dtype == torch.float32
        logprobs = torch.log_softmax(logits.double(), dim=-1).float().numpy()

        d = out_root / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        model.save_pretrained(d)
        for extra in ("generation_config.json",):
            (d / extra).unlink(missing_ok=True)
        np.save(d / "tokens.npy", tokens)
        np.save(d / "logprobs.npy", logprobs)
        p = np.exp(logprobs.astype(np.float64))
        entropy = float(-(p * logprobs).sum(-1).mean())
        meta = {
            "format_version": FORMAT_VERSION,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "seed": SEED + i,
            "model_class": type(model).__name__,
            "model_type": model.config.model_type,
            "n_tokens": N_TOKENS,
            "vocab_size": vocab,
            "parameters": int(sum(t.numel() for t in model.parameters())),
            "mean_entropy_nats": entropy,
            "logit_std": float(logits.std()),
            "reference": "transformers slow torch path on CPU, float32, eager attention; "
                         "log_softmax in float64 of the float32 logits",
        }
        (d / "golden.json").write_text(json.dumps(meta, indent=2) + "\n")
        size = sum(f.stat().st_size for f in d.iterdir())
        print(f"{name}: {meta['parameters']} parameters, entropy {entropy:.3f} nats "
              f"(uniform {math.log(vocab):.3f}), logit std {meta['logit_std']:.2f}, {size / 1e6:.2f} MB -> {d}")


if __name__ == "__main__":
    main()
