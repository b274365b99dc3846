#!/usr/bin/env python3
"""Train a small byte-level Mamba-2, Qwen3.5-style Gated DeltaNet hybrid, NemotronH-style hybrid or
Kimi-Linear-style KDA hybrid on Project Gutenberg books.

   python3 scripts/train_tiny.py --arch mamba2 --out data/models/tiny_mamba2 --device cuda --steps 30000 --minutes 3.5
   python3 scripts/train_tiny.py --arch qwen3_5 --out data/models/tiny_qwen3_5 --device cuda --steps 30000 --minutes 3.5
   # long memory, in resumable runs of 8 minutes (repeat the same command until the card appears in --out):
   python3 scripts/train_tiny.py --arch nemotron_h --out OUT_DIR --device cuda --steps 6000 \
       --seq-len-schedule 1024:0,4096:0.3,16384:0.6 --tokens-per-step 32768 --decay-init log-uniform \
       --resume-dir RESUME_DIR --minutes 8
   python3 scripts/train_tiny.py --add-decays data/models/tiny_nemotron_h   # the card's decay spectrum, later

What it makes
-------------
A checkpoint that ``replayssm`` (src/model/) and transformers both read: ``config.json`` +
``model.safetensors`` (float32) written by ``save_pretrained``, built with transformers' own classes and
the config conventions of scripts/make_goldens.py:

* ``--arch mamba2``:  ``Mamba2ForCausalLM`` (model_type ``mamba2``), untied LM head.
* ``--arch qwen3_5``: ``Qwen3_5ForCausalLM`` with a ``Qwen3_5TextConfig`` (model_type ``qwen3_5_text``):
  Gated DeltaNet layers (``linear_attention``) and gated full-attention layers 3:1, SwiGLU MLPs, tied
  embeddings, partial RoPE.
* ``--arch nemotron_h``: ``NemotronHForCausalLM`` (model_type ``nemotron_h``), the layer pattern
  ``M-M-M*-M-M-`` (the config's ``hybrid_override_pattern``: M Mamba-2 with 8 heads of dv 64 on 2 groups,
  - relu² MLP of 768, * attention without RoPE, 4 heads / 2 kv heads of 64), untied LM head, ≈5.0 M
  parameters (19.8 MB). ``time_step_min`` (NemotronH's hard floor on dt, which the C++ loader applies too) is
  1e-4, below every dt of the long-memory initialisation.
* ``--arch kimi_linear``: ``KimiLinearForCausalLM`` (model_type ``kimi_linear``), the layer pattern
  ``KKK*KKK*`` (K Kimi Delta Attention, 2 heads of dk = dv = 128 with per-channel decay; * MLA attention,
  4 heads, kv rank 128), dense SwiGLU MLPs of 512 in every layer (no MoE), untied LM head (transformers'
  class does not tie it), ≈6.1 M parameters (24.4 MB).

All keep dk = 128 (Mamba-2 ``state_size``, GDN ``linear_key_head_dim``, KDA ``linear_head_dim``): the state formats' blocks run
along dk and FP8 block-128 needs dk to be a multiple of 128. Each checkpoint stays under 25 MB.

Beside the weights: ``MODEL_CARD.md`` (architecture, parameter count, config summary, training text,
steps, tokens seen, wall time, device, final training loss, bits per byte on the PG-19 test books, the
decay spectrum, versions, the exact command; the template is in data/models/README.md), ``train_log.json``
(the loss, learning rate, sequence length and batch of every step, timings, the runs) and ``decays.json``.

Tokens are bytes: token id = byte value, vocab_size = 256, no BOS/EOS is ever inserted. Mamba2Config
wants a pad id: it is 0 (the NUL byte, absent from the text; Mamba-2's embedding has no padding row).
Qwen3_5TextConfig keeps pad/bos/eos = None, because a pad id there would become the embedding's
padding_idx and, with tied embeddings, pin that byte's logit at 0.

Text
----
Every ``*.txt`` in ``--train-dir`` (default ../shared/data/gutenberg-train beside the repository;
README/SOURCES/LICENSE files excluded) is read as bytes, its UTF-8 BOM dropped, CRLF turned into LF and
the Project Gutenberg header and licence footer cut (the lines strictly between the ``*** START OF ...``
marker, which may run over two lines, and the ``*** END OF ...`` / ``End of [the] Project Gutenberg``
line; blank lines trimmed at both ends). This is the "gutenberg-v1" stripping of src/io/text_source.cpp
(replayssm_py.text), so the PG-19 evaluation bytes are the ones ``replayssm kl-sweep`` feeds the model. The books are joined with one blank line between them and
training windows of ``--seq-len`` + 1 bytes are drawn uniformly at random (seeded) from the result.

**The PG-19 test books are never trained on.** Before any book is loaded the script refuses (exit
status 2) when ``--train-dir`` resolves to the PG-19 test folder (``--pg19-dir``, default
../shared/data/pg19/test) or to any folder named pg19/test, and, when that folder exists, when the
training folder holds a file with the same name as one of the test books or with the same contents.

Training
--------
AdamW (betas 0.9/0.95, weight decay on matrices only), linear warm-up then cosine decay to 10% of the
peak rate, gradient clipping at 1.0, bf16 autocast on CUDA (float32 master weights; float32 on the CPU
unless --amp bf16). ``--steps`` is the schedule length; ``--minutes M`` is a wall-clock budget for the
training loop: after steps 30, 200, 1000 and 3000 the step count is set to what the remaining time fits
at the speed measured since step 10 (never above --steps; the cosine schedule follows), and the loop
also stops hard when the budget is spent. Start-up, evaluation and saving are outside the budget (about
half a minute on a GPU).

Resumable training (``--resume-dir DIR``)
----------------------------------------
For a GPU lent minutes at a time, maybe a fresh machine each run. ``--steps`` is then the whole training's
schedule (never fitted to the budget), ``--minutes M`` the budget of this run's training loop and
``--stop-after-steps N`` a step limit of this run (for tests). The run saves its state into DIR every
``--save-every-minutes`` (default 2) and when it stops; a rerun of the same command continues from the
last save, with the same data order (the sampler's RNG state is saved) and, on the same kind of device,
the same weights bit for bit as one uninterrupted run (tests/python/test_train_tiny.py checks it on the
CPU for each architecture). Only the run that reaches the last step evaluates and writes --out; the
others exit 0 after "stopped at step S of N ...; run the same command again to continue".

A save (replayssm_py/train_resume.py) is the weights, AdamW's moments and step counts, the sampler's and
torch's RNG states, the step and the per-step log so far: shards of at most 15 MiB (safetensors) and
``resume.json``, the manifest written last (temporary + rename), so a save cut off leaves the previous
one whole; shards are checked against their sha256 when loaded. Size: 12 bytes per parameter (about 40
MB for the default mamba2, 60 MB for nemotron_h, 68 MB for qwen3_5); ``--resume-moments bf16`` stores
the moments in bfloat16 (8 bytes per parameter; a resumed run then no longer equals an uninterrupted
one). A rerun whose arguments would change the result (arch, preset, steps, context schedule, tokens per
step, seed, lr, warm-up, weight decay, amp, scan, decay initialisation, resume moments, the training
text's sha256, the device type) is refused, naming each difference. DIR must not be inside data/models
or --out (resume files are never committed). Without --resume-dir nothing changes: ``--minutes`` fits
the schedule as described above.

Context schedule (``--seq-len-schedule LEN:FRAC,...``)
----------------------------------------------------
E.g. ``1024:0,4096:0.3,16384:0.6``: sequences of 1024 bytes from step 0, 4096 from step
floor(0.3 x steps + 1/2), 16384 from floor(0.6 x steps + 1/2). The tokens per step stay constant
(``--tokens-per-step``, default --batch x the first length): the batch is tokens / length, refused
unless whole. Every step's length and batch are in train_log.json (``seq_len``, ``batch``). The windowed
evaluation and the default streamed chunk use the final length. The long-memory runs use the schedule
above with 32,768 tokens per step (batch 32, 8, 2; twice the bundled models' 16 x 1024): short sequences
first, where the loss falls fastest, then 40% of the steps at 16K, where a head's memory of thousands of
tokens pays.

Long-memory initialisation (``--decay-init log-uniform``, ``--init-memory 10:10000``)
---------------------------------------------------------------------------------
The per-token decay of every SSM head (Mamba-2, NemotronH's Mamba-2, Gated DeltaNet) is
alpha = exp(-exp(A_log) softplus(dt_in + dt_bias)). transformers' initialisation gives memories
1/(1 - alpha) of ~1 to a few hundred tokens, and the bundled models trained from it kept short ones
(tiny_mamba2: median 29 tokens, none >= 1,000). This option sets A_log and dt_bias once, after the
model is built, so that with dt_in = 0 head h of SSM layer l (of n layers, H heads each) has memory
m = lo (hi/lo)^q, q = (h + (l + 1/2)/n)/H: the heads' memories are the quantiles of the log-uniform law on
[lo, hi] = [10, 10^4] tokens, every layer spanning the whole range. The rate -log(1 - 1/m) = A dt is
split between A and dt: dt falls log-linearly with log m from 0.1 (m = 10) to 0.001 (m = 10^4), Mamba's
usual dt range, and A = rate/dt (0.1 to 1.05; the state's gain dt/(1 - alpha) = 1/A stays within
[1, 10]). Nothing else changes, both vectors are trained without weight decay, and the model can keep
or unlearn the long memories; the range is a prior of "possible", not tuned toward any result. The
card's decay spectrum section states the initial memories (from the weights) and the measured ones.
Measured at initialisation (untrained, --steps 1, CPU, ``replayssm info --decays`` on 16,384 bytes of
each PG-19 test book), per head in tokens, measured vs target: tiny mamba2 15/15, 88/87, 491/487,
2617/2738, 35/37, 212/205, 1109/1155, 6606/6494; tiny qwen3_5 57/56, 1717/1778; tiny nemotron_h 23/24,
133/133, 718/750, 4220/4217 (the input's share of dt moves the means by a few per cent).

Decay spectrum in the card
--------------------------
After training, when a replayssm binary exists (``--replayssm BIN``, default build/replayssm) and the
PG-19 folder is there, ``replayssm info OUT --decays --text-dir PG19 --length --decay-length --books 4
--windows 16 --json OUT/decays.json`` runs and its summary (heads per decade, median and largest memory,
heads >= 1,000 tokens) and bits per byte go into the card; otherwise the card says why it was skipped,
and ``--add-decays OUT`` adds it later (e.g. here, after training on a GPU machine that has no replayssm).

Memory trace (train_log.json ``log[]``): at every logged step, the quantiles of the memories 1/(1 - alpha)
the weights imply with the input's share of dt at 0 (``memory``), and of 1/(1 - mean alpha) of the decays
the model applies on two fixed 4,096-byte windows of the training text (``memory_text``, the input's share
included: for Gated DeltaNet the two differ by an order of magnitude, experiments/training/README.md). The
card states how both moved over the last 20% of the steps: whether the spectrum settled.

Without mamba_ssm / causal-conv1d / flash-linear-attention, transformers falls back to its reference
PyTorch code (a warning says so). For Gated DeltaNet that path (chunked, triangular solves and matmuls)
is fast enough. Mamba-2's reference chunk scan materialises broadcast products of size
tokens x heads x head_dim x state_size several times per layer (~0.8 TB of memory traffic per training
step of 16K tokens for the default model), so by default (``--mamba-scan einsum``) the training forward
(Mamba2's and NemotronH's mixers) uses an equivalent chunked scan written here with einsums (the same chunking, dt clamp, D skip, float32
arithmetic with TF32 matmuls on CUDA; tests/python/test_train_tiny.py checks outputs and gradients
against transformers'). The saved model is a plain Mamba2ForCausalLM, and the PG-19 evaluation always runs transformers' own forward.
``--mamba-scan reference`` trains with transformers' code unchanged. For Gated DeltaNet and KDA (the two
delta-rule layers; for KDA the same flags act on transformers' ``chunk_kimi_delta_attention``), ``--gdn-chunk N``
sets the chunk length of transformers' torch delta rule in training (default 64, its own): its loop over
chunks runs one iteration per chunk, so long contexts take fewer, larger steps with a larger N.
``--gdn-scan associative`` replaces that loop by an associative scan over the chunks' affine state maps
(log2 of the chunk count levels of batched matmuls; replayssm_py/train.py, checked against transformers'
function in tests/python/test_train_tiny.py); ``--gdn-scan loop`` (default) is transformers' loop.

Determinism: the same seed, step count, batch, device and software give the same weights as far as
torch allows (torch.use_deterministic_algorithms(True, warn_only=True), CUBLAS_WORKSPACE_CONFIG set).
With --minutes the step count depends on the machine's speed; the card records it, and
``--steps N --minutes 0`` repeats the run.

Evaluation
----------
Bits per byte on the first --eval-bytes (64 KiB) of each PG-19 test book after stripping, teacher-forced
with the model's own forward in float32, transformers' reference paths:

* streamed: the book is fed in chunks of --eval-chunk bytes with the model's cache carried between
  chunks, one context over the whole 64 KiB (what the KL sweep does, far beyond the training length);
* windowed: independent windows of --seq-len bytes (context restarts at each window).

Every byte after the first of each book is predicted once. The evaluation is skipped, with a note in the
card, when the PG-19 folder is missing (or with --eval-bytes 0).
"""
import argparse
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py import train  # noqa: E402


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring.",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["mamba2", "qwen3_5", "nemotron_h", "kimi_linear"],
                    help="required unless --add-decays")
    ap.add_argument("--add-decays", default=None, metavar="DIR",
                    help="only measure the decay spectrum of the trained folder DIR (replayssm info --decays on "
                         "--pg19-dir) and write it into its card; nothing is trained")
    ap.add_argument("--train-dir", default=str(train.DEFAULT_TRAIN_DIR), help="folder of Gutenberg .txt books")
    ap.add_argument("--pg19-dir", default=str(train.DEFAULT_PG19_DIR),
                    help="PG-19 test books: never trained on; evaluated on")
    ap.add_argument("--out", default=None, help="output folder (default data/models/tiny_<arch>)")
    ap.add_argument("--force", action="store_true", help="replace an existing non-empty output folder")
    ap.add_argument("--preset", default="default", choices=["default", "tiny"],
                    help="model size: default (the real run) or tiny (tests)")
    ap.add_argument("--steps", type=int, default=4000,
                    help="schedule length (upper bound with --minutes; with --resume-dir the whole training's)")
    ap.add_argument("--seq-len", type=int, default=None, help="training sequence length in bytes (default 1024)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len-schedule", default=None, metavar="LEN:FRAC,...",
                    help="context curriculum, e.g. 1024:0,4096:0.3,16384:0.6 (length from that fraction of --steps "
                         "on); the batch follows so that tokens per step stay --tokens-per-step")
    ap.add_argument("--tokens-per-step", type=int, default=None,
                    help="with --seq-len-schedule: tokens per step (default --batch x the first length)")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="training-loop time budget, 0: none (with --resume-dir: this run's)")
    ap.add_argument("--resume-dir", default=None,
                    help="resumable training: save here (every --save-every-minutes and at the end of the run) and "
                         "continue from the last save; not inside data/models")
    ap.add_argument("--save-every-minutes", type=float, default=2.0, help="with --resume-dir (0: only at the end)")
    ap.add_argument("--stop-after-steps", type=int, default=0,
                    help="stop this run after N steps (0: no limit), e.g. to test --resume-dir")
    ap.add_argument("--resume-moments", default="fp32", choices=["fp32", "bf16"],
                    help="AdamW moments in the resume files: fp32 (exact resume) or bf16 (half the size)")
    ap.add_argument("--decay-init", default="transformers", choices=["transformers", "log-uniform"],
                    help="SSM decays at initialisation: transformers' own, or head memories log-uniform over "
                         "--init-memory")
    ap.add_argument("--init-memory", default="10:10000", metavar="LO:HI",
                    help="--decay-init log-uniform: the memory range in tokens")
    ap.add_argument("--replayssm", default=str(train.ROOT / "build" / "replayssm"),
                    help="replayssm binary for the card's decay spectrum (skipped with a note when absent)")
    ap.add_argument("--decay-length", type=int, default=16384,
                    help="positions per PG-19 book for the decay spectrum (0: skip)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (mamba2 3e-3, qwen3_5 2e-3)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--amp", default="auto", choices=["auto", "bf16", "off"],
                    help="bf16 autocast: auto = on CUDA only")
    ap.add_argument("--mamba-scan", default="einsum", choices=["einsum", "reference"],
                    help="Mamba-2 chunk scan used for training (evaluation always uses transformers')")
    ap.add_argument("--gdn-chunk", type=int, default=train.GDN_DEFAULT_CHUNK,
                    help="qwen3_5, kimi_linear: positions per chunk of transformers' torch delta rule in training (16-4096; "
                         "evaluation always uses its default 64)")
    ap.add_argument("--gdn-scan", default="loop", choices=list(train.GDN_SCANS),
                    help="qwen3_5, kimi_linear: the states of the chunks in training by transformers' sequential loop, or by an "
                         "associative scan (log2(chunks) levels of batched matmuls; evaluation always uses the loop)")
    ap.add_argument("--eval-bytes", type=int, default=65536, help="bytes per PG-19 book to evaluate, 0: skip")
    ap.add_argument("--eval-chunk", type=int, default=None,
                    help="streamed evaluation chunk (default: the final training length, at most 2048: transformers' "
                         "torch Mamba-2 chunk scan needs memory growing with the square of the chunk; NemotronH's "
                         "ran out of an H200's 140 GB at 16,384)")
    ap.add_argument("--eval-batch", type=int, default=None,
                    help="windows per forward in the windowed evaluation (default: 8, fewer for long windows so "
                         "that a forward holds at most 16,384 bytes)")
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args(argv)
    if args.add_decays is not None:
        if args.decay_length <= 0:
            ap.error(f"--decay-length must be positive with --add-decays, got {args.decay_length}")
        return args
    if args.arch is None:
        ap.error("the following arguments are required: --arch")
    seq_len_given = args.seq_len is not None
    args.seq_len = 1024 if args.seq_len is None else args.seq_len
    if args.eval_batch is not None and args.eval_batch <= 0:
        ap.error(f"--eval-batch must be positive, got {args.eval_batch}")
    for k in ("steps", "seq_len", "batch", "warmup", "log_every"):
        if getattr(args, k) <= 0:
            ap.error(f"--{k.replace('_', '-')} must be positive, got {getattr(args, k)}")
    if args.eval_chunk is not None and args.eval_chunk <= 0:
        ap.error(f"--eval-chunk must be positive, got {args.eval_chunk}")
    # float options: NaN passes every comparison, so ask for finite values first
    if not (math.isfinite(args.minutes) and args.minutes >= 0):
        ap.error(f"--minutes must be a finite number >= 0 (0: no budget), got {args.minutes}")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        ap.error(f"--lr must be a finite number > 0, got {args.lr}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        ap.error(f"--weight-decay must be a finite number >= 0, got {args.weight_decay}")
    if args.eval_bytes < 0:
        ap.error(f"--eval-bytes must not be negative (0: skip), got {args.eval_bytes}")
    for k in ("stop_after_steps", "decay_length"):
        if getattr(args, k) < 0:
            ap.error(f"--{k.replace('_', '-')} must not be negative, got {getattr(args, k)}")
    if not (math.isfinite(args.save_every_minutes) and args.save_every_minutes >= 0):
        ap.error(f"--save-every-minutes must be a finite number >= 0, got {args.save_every_minutes}")
    if args.arch is not None and not 16 <= args.gdn_chunk <= 4096:
        ap.error(f"--gdn-chunk must be 16 to 4096 positions, got {args.gdn_chunk}")
    if args.arch not in (None, *train.DELTA_RULES) and args.gdn_scan != "loop":
        ap.error(f"--gdn-scan applies to the delta-rule architectures ({', '.join(train.DELTA_RULES)}: Gated DeltaNet, "
                 f"KDA) only, not --arch {args.arch}")
    try:
        lo, hi = (float(x) for x in args.init_memory.split(":"))
        if not (math.isfinite(lo) and math.isfinite(hi) and 1 < lo <= hi):
            raise ValueError
    except ValueError:
        ap.error(f"--init-memory must be LO:HI tokens with 1 < LO <= HI, got {args.init_memory!r}")
    args.init_memory = [lo, hi]
    if args.seq_len_schedule is None:
        if args.tokens_per_step is not None:
            ap.error("--tokens-per-step goes with --seq-len-schedule (without it: --batch x --seq-len)")
        args.tokens_per_step = args.batch * args.seq_len
        args.segments = [[0, args.seq_len, args.batch]]
    else:
        if seq_len_given:
            ap.error("give --seq-len or --seq-len-schedule, not both")
        try:
            schedule = train.parse_seq_len_schedule(args.seq_len_schedule)
            if args.tokens_per_step is None:
                args.tokens_per_step = args.batch * schedule[0][0]
            if args.tokens_per_step <= 0:
                raise ValueError(f"--tokens-per-step must be positive, got {args.tokens_per_step}")
            args.segments = [list(r) for r in train.schedule_steps(schedule, args.steps, args.tokens_per_step)]
        except ValueError as e:
            ap.error(f"--seq-len-schedule {args.seq_len_schedule}: {e}")
        args.seq_len = args.segments[-1][1]  # the final length: the windowed evaluation's and the default chunk
    if args.resume_dir is not None:
        rd = pathlib.Path(args.resume_dir).resolve()
        models = (train.ROOT / "data" / "models").resolve()
        if rd == models or models in rd.parents:
            ap.error(f"--resume-dir {args.resume_dir} is inside data/models: keep resume files out of the repository's "
                     "models (they are never committed)")
        if pathlib.Path(args.out or "").resolve() in (rd, *rd.parents) and args.out:
            ap.error(f"--resume-dir {args.resume_dir} must not be the --out folder or inside it")
    elif args.stop_after_steps:
        ap.error("--stop-after-steps goes with --resume-dir (a stopped run must be resumable)")
    args.lr = args.lr if args.lr is not None else train.DEFAULT_LR[args.arch]
    args.eval_chunk = args.eval_chunk or min(args.seq_len, 2048)
    args.eval_batch = args.eval_batch or max(1, min(8, 16384 // args.seq_len))
    args.out = args.out or str(train.ROOT / "data" / "models" / f"tiny_{args.arch}")
    return args


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.add_decays is not None:
        return train.add_decays(args)
    return train.run(args, argv, __file__)


if __name__ == "__main__":
    sys.exit(main())
