"""Make a checkpoint with random weights and the published shapes of a 4B-class model (issue 10, Benchmark).

    python3 scripts/make_random_checkpoint.py --shape qwen3.5-4b|nemotron-3-nano-4b --out DIR
        [--seed S] [--layers K] [--tiny] [--vocab V] [--device auto|cuda|cpu] [--force]

The model is built with transformers' own config and model classes (transformers 5.17:
Qwen3_5TextConfig + Qwen3_5ForCausalLM, NemotronHConfig + NemotronHForCausalLM), initialised by
transformers' own _init_weights (std 0.02 normals for the projections and embeddings, HF's A_log and
dt_bias for the recurrences, unit norms), and saved with save_pretrained in BF16: config.json +
model.safetensors (one file), which `replayssm info DIR` and model::CausalLM::load read. Random
weights exercise the sweep at paper scale; they say nothing about accuracy. A folder that already
holds a complete checkpoint of the same settings (random_checkpoint.json) is kept unless --force.

Speed: the parameters are created directly in BF16 on the GPU when there is one (--device auto),
so transformers' init runs there; on an H200 a 4-5B model is built in a few seconds and saving
~9 GB of safetensors takes about 10-30 s (disk-bound); expect under a minute per model. On a CPU
the same takes minutes: use --tiny or --layers there.

Shapes (every value, and where it comes from):

qwen3.5-4b  (model_type qwen3_5_text) -- the published Qwen3.5-4B text config, as collected in
  ../shared/spec/MODEL_SHAPES.md and restated in issue 10:
    num_hidden_layers 32, full_attention_interval 4 (layers 3, 7, ..., 31 full attention, 24 GDN),
    hidden_size 2560, intermediate_size 9216 (SwiGLU, hidden_act silu),
    num_attention_heads 16, num_key_value_heads 4, head_dim 256 (Qwen3.5 attention is always
    output-gated in transformers: attn_output_gate), rope_theta 1e7, partial_rotary_factor 0.25,
    mrope_section [11, 11, 10] interleaved (text positions: plain RoPE),
    linear_num_key_heads 16, linear_num_value_heads 32, linear_key_head_dim 128,
    linear_value_head_dim 128, linear_conv_kernel_dim 4, vocab_size 248320,
    tie_word_embeddings false, rms_norm_eps 1e-6;
    max_position_embeddings 262144 (published; only recorded).
nemotron-3-nano-4b  (model_type nemotron_h) -- the paper's 21 Mamba-2 + 4 attention layers, 8 groups,
  96 heads, d_state 128, head dim 80 (issue 10); the rest from the published config as collected in
  ../shared/spec/MODEL_SHAPES.md:
    hybrid_override_pattern M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M- (42 layers: 21 M, 4 *, 17 -),
    hidden_size 3136, intermediate_size 12544 (mlp_hidden_act relu2),
    num_attention_heads 40, num_key_value_heads 8, head_dim 128 (no RoPE in NemotronH),
    mamba_num_heads 96, mamba_head_dim 80, n_groups 8, ssm_state_size 128, conv_kernel 4,
    chunk_size 256, use_conv_bias true, vocab_size 131072, layer_norm_epsilon 1e-5,
    max_position_embeddings 262144;
    not in MODEL_SHAPES.md, so transformers' NemotronHConfig defaults are kept: tie_word_embeddings
    false, use_bias false, mlp_bias false, attention_bias false, time_step_min 0.001 (the dt clamp),
    mamba_hidden_act silu.

--layers K keeps the first K layers of the pattern (testing); --tiny keeps the layer pattern and the
SSM state sizes (dk = 128, so every state format applies) but shrinks every width (hidden 64) and the
vocabulary (512, enough for byte-level ids), for a CPU check; --vocab V overrides the vocabulary.
Each folder gets random_checkpoint.json (shape, seed, options, parameter count, versions, time).
"""
import argparse
import json
import pathlib
import shutil
import sys
import time

QWEN_PATTERN_INTERVAL = 4
NEMOTRON_PATTERN = "M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-"
SHAPES = ("qwen3.5-4b", "nemotron-3-nano-4b")


def qwen_config(transformers, layers, tiny, vocab):
    n = 32 if layers is None else layers
    types = ["full_attention" if (i + 1) % QWEN_PATTERN_INTERVAL == 0 else "linear_attention" for i in range(32)][:n]
    kw = dict(vocab_size=248320, hidden_size=2560, intermediate_size=9216, num_hidden_layers=n, layer_types=types,
              num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_conv_kernel_dim=4,
              linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
              linear_num_value_heads=32, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
              max_position_embeddings=262144,
              rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                               "mrope_section": [11, 11, 10], "mrope_interleaved": True})
    if tiny:
        kw.update(vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=1,
                  head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_value_head_dim=32)
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
    if vocab is not None:
        kw["vocab_size"] = vocab
    return transformers.Qwen3_5TextConfig(**kw), transformers.Qwen3_5ForCausalLM


def nemotron_config(transformers, layers, tiny, vocab):
    pattern = NEMOTRON_PATTERN if layers is None else NEMOTRON_PATTERN[:layers]
    kw = dict(vocab_size=131072, hidden_size=3136, hybrid_override_pattern=pattern, num_attention_heads=40,
              num_key_value_heads=8, head_dim=128, intermediate_size=12544, mlp_hidden_act="relu2",
              mamba_num_heads=96, mamba_head_dim=80, n_groups=8, ssm_state_size=128, conv_kernel=4, chunk_size=256,
              use_conv_bias=True, layer_norm_epsilon=1e-5, max_position_embeddings=262144,
              tie_word_embeddings=False, use_bias=False, mlp_bias=False, attention_bias=False)
    if tiny:
        kw.update(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, chunk_size=64)
    if vocab is not None:
        kw["vocab_size"] = vocab
    return transformers.NemotronHConfig(**kw), transformers.NemotronHForCausalLM


def settings_of(args):
    return {"shape": args.shape, "seed": args.seed, "layers": args.layers, "tiny": args.tiny, "vocab": args.vocab}


def complete(out, settings):
    """The folder holds a finished checkpoint made with these settings."""
    meta = out / "random_checkpoint.json"
    if not (meta.is_file() and (out / "config.json").is_file() and (out / "model.safetensors").is_file()):
        return False
    try:
        return json.loads(meta.read_text()).get("settings") == settings
    except (OSError, ValueError):
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shape", required=True, choices=SHAPES)
    ap.add_argument("--out", required=True, help="output folder (created; replaced with --force)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None, help="keep the first K layers of the pattern (testing)")
    ap.add_argument("--tiny", action="store_true", help="every width shrunk, pattern and state sizes kept (testing)")
    ap.add_argument("--vocab", type=int, default=None, help="override the vocabulary size (testing)")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--force", action="store_true", help="rebuild even if DIR holds this checkpoint already")
    args = ap.parse_args(argv)
    full_layers = 32 if args.shape == "qwen3.5-4b" else len(NEMOTRON_PATTERN)
    if args.layers is not None and not 1 <= args.layers <= full_layers:
        ap.error(f"--layers {args.layers}: expected 1 to {full_layers} (the layers of {args.shape})")
    if args.vocab is not None and not 256 <= args.vocab <= 1 << 20:
        ap.error(f"--vocab {args.vocab}: expected 256 to 2^20 (byte-level ids need 256)")
    out = pathlib.Path(args.out)
    settings = settings_of(args)
    if complete(out, settings) and not args.force:
        print(f"{out}: already holds this checkpoint ({json.dumps(settings)}); kept (--force rebuilds it)")
        return 0
    if out.exists() and any(out.iterdir()):
        if not args.force and not (out / "random_checkpoint.json").is_file():
            ap.error(f"--out {out}: exists and is not a checkpoint made by this script (use --force to replace it)")
        shutil.rmtree(out)

    import torch
    import transformers

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    t0 = time.time()
    make = qwen_config if args.shape == "qwen3.5-4b" else nemotron_config
    cfg, cls = make(transformers, args.layers, args.tiny, args.vocab)
    torch.manual_seed(args.seed)
    torch.set_grad_enabled(False)
    # Parameters born in BF16 on the target device: transformers' init runs there, nothing is
    # materialised in FP32 or on the host first.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(previous)
    model = model.to(torch.bfloat16).eval()
    if device == "cuda":
        torch.cuda.synchronize()
    t_build = time.time() - t0
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise RuntimeError(f"non-finite initial weights in {bad[:5]} (transformers' init changed?)")
    n_params = sum(p.numel() for p in model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    if not (out / "model.safetensors").is_file():
        raise RuntimeError(f"{out}: save_pretrained wrote no single model.safetensors: {sorted(f.name for f in out.iterdir())}")
    t_total = time.time() - t0
    meta = {"settings": settings, "model_class": type(model).__name__, "model_type": cfg.model_type,
            "parameters": int(n_params), "dtype": "bfloat16", "device": device,
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "build_seconds": round(t_build, 2), "total_seconds": round(t_total, 2),
            "init": "transformers' own _init_weights (initializer_range 0.02), created in bfloat16"}
    # Written last: its presence marks a complete checkpoint.
    (out / "random_checkpoint.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e9
    print(f"{out}: {type(model).__name__} {args.shape}{' (tiny)' if args.tiny else ''}"
          f"{f' first {args.layers} layers' if args.layers else ''}, {n_params / 1e9:.3f} B parameters, "
          f"{size:.2f} GB, built in {t_build:.1f} s on {device}, {t_total:.1f} s with saving")
    return 0
