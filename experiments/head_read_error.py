#!/usr/bin/env python3
"""Which head of one Mamba-2 layer carries the KL of a separate-precision read (issue 11, figure 13 on
long_nemotron_h), computed independently of the C++ toolkit:

    python3 experiments/head_read_error.py data/models/long_nemotron_h --block 9 --positions 3600 \
        --windows 4,64 [--check build/replayssm]

transformers' own forward (float32, CPU) gives the reference log-probabilities and, for the chosen block, the
Mamba-2 recurrence's inputs (dt, x, B, C). The script replays that block's exact FP32 state per head,
quantizes it at every flush (every L steps) with NVFP4 RTN (replayssm_py.formats, the golden-file code),
and adds the read error of each non-flush step, y_t += (gamma_{flush..t} E) C_t with E = Q(S_flush) - S_flush,
to the block's output. This is the split:nvfp4+rtn/fp32@L policy on that block alone. It then runs the rest of
the forward again: all heads at once, then each head alone. It prints the mean KL against the reference over
the last three quarters of the positions, and the KL at the worst position.

With --check BIN, `BIN logits --layer-policy BLOCK=split:nvfp4+rtn/fp32@L` computes the same configuration in
C++. The two must agree (per-position correlation and means), which makes this an oracle for the toolkit's
split emulation. Text: the first PG-19 test book in name order, stripped (--text-dir).
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
from replayssm_py.formats import quantize_nvfp4  # noqa: E402
from replayssm_py.text import list_books, strip_book  # noqa: E402
from replayssm_py.train import layer_pattern  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--block", type=int, required=True, help="block index of a Mamba-2 layer (as in replayssm info)")
    ap.add_argument("--positions", type=int, default=3600)
    ap.add_argument("--windows", default="4,64")
    ap.add_argument("--text-dir", default=str(ROOT.parent / "shared" / "data" / "pg19" / "test"))
    ap.add_argument("--check", metavar="BIN", help="replayssm binary: compare with its logits --layer-policy")
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F
    import transformers
    from transformers.models.mamba2 import modeling_mamba2
    from transformers.models.nemotron_h import modeling_nemotron_h

    torch.set_grad_enabled(False)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    arch = model.config.model_type
    if arch not in ("mamba2", "nemotron_h"):
        sys.exit(f"head_read_error: {a.model}: model_type {arch!r}; expected mamba2 or nemotron_h")
    pattern = layer_pattern(arch, model.config)
    if not 0 <= a.block < len(pattern) or pattern[a.block] != "M":
        sys.exit(f"head_read_error: --block {a.block} is not a Mamba-2 layer of {a.model} (pattern {pattern})")
    ordinal = pattern[: a.block].count("M")  # the block's position among the Mamba-2 calls of one forward
    n_mamba = pattern.count("M")
    book = list_books(a.text_dir)[0]
    ids_np = np.frombuffer(strip_book(book), np.uint8)[: a.positions + 1].astype(np.int32)
    if ids_np.size < a.positions + 1:
        sys.exit(f"head_read_error: {book} holds {ids_np.size} bytes after stripping, fewer than --positions + 1")
    ids = torch.tensor(ids_np[None].astype(np.int64))
    windows = [int(w) for w in a.windows.split(",")]

    target = modeling_nemotron_h if arch == "nemotron_h" else modeling_mamba2  # whose mixers call this scan
    original = target.mamba2_chunk_scan
    hook = {"calls": 0, "capture": None, "inject": None}

    def scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None, dt_softplus=False,
             dt_limit=(0.0, float("inf")), **kw):
        y = original(hidden_states, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias,
                                 initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit, **kw)
        index = hook["calls"] % n_mamba
        hook["calls"] += 1
        if index != ordinal:
            return y
        if hook["capture"] is not None:  # dt as the mixer uses it: + dt_bias, softplus, clamp
            d = dt.float() + (dt_bias.float() if dt_bias is not None else 0)
            d = (F.softplus(d) if dt_softplus else d).clamp(min=dt_limit[0], max=dt_limit[1])
            hook["capture"].update(x=hidden_states[0].double().numpy(), dt=d[0].double().numpy(),
                                   A=A.double().numpy(), B=B[0].double().numpy(), C=C[0].double().numpy())
        if hook["inject"] is not None:
            y = y + torch.from_numpy(hook["inject"][None]).to(y.dtype)
        return y

    def log_probs():
        return torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, : a.positions].double(), -1).numpy()

    target.mamba2_chunk_scan = scan
    try:
        cap = {}
        hook["capture"] = cap
        ref = log_probs()
        hook["capture"] = None
        p_ref = np.exp(ref)
        n_tok, heads, dv = cap["x"].shape
        groups, dk = cap["B"].shape[1:]
        alpha = np.exp(cap["dt"] * cap["A"][None])  # (tokens, heads)

        def read_errors(L):
            """(tokens, heads, dv): the output error of reading Q(S_flush) decayed to step t instead of S."""
            err = np.zeros((n_tok, heads, dv))
            for h in range(heads):
                g = h // (heads // groups)
                S, stale = np.zeros((dv, dk)), None
                for t in range(n_tok):
                    S = alpha[t, h] * S + (cap["dt"][t, h] * cap["x"][t, h])[:, None] * cap["B"][t, g][None, :]
                    if stale is not None:
                        stale = alpha[t, h] * stale
                        if (t + 1) % L:  # a non-flush step reads the low-precision copy; the flush reads S
                            err[t, h] = stale @ cap["C"][t, g]
                    if (t + 1) % L == 0:
                        q = quantize_nvfp4(S.astype(np.float32), "rtn")["decoded"].reshape(dv, dk)
                        stale = q.astype(np.float64) - S
            return err

        def kl_with(err):
            hook["inject"], hook["calls"] = err.astype(np.float32), 0
            try:
                return (p_ref * (ref - log_probs())).sum(1)
            finally:
                hook["inject"] = None

        tail = slice(a.positions // 4, a.positions)
        print(f"model {a.model}, block {a.block} (pattern {pattern}), book {book.name}, {a.positions} positions; "
              f"mean KL over positions ({tail.start}, {a.positions}]")
        for L in windows:
            err = read_errors(L)
            k = kl_with(err)
            worst = tail.start + int(np.argmax(k[tail]))
            line = f"L={L:3d} all heads: {k[tail].mean():.3e}   worst position {worst}: {k[worst]:.4f}"
            if a.check:
                with tempfile.TemporaryDirectory() as w:
                    np.save(f"{w}/ids.npy", ids_np)
                    for name, policy, extra in (("ref", "conv:fp32", []),
                                                ("cfg", "conv:fp32", ["--layer-policy", f"{a.block}=split:nvfp4+rtn/fp32@{L}"])):
                        subprocess.run([a.check, "logits", a.model, "--tokens", f"{w}/ids.npy", "--out",
                                        f"{w}/{name}.npy", "--policy", policy, "--device", "cpu", *extra],
                                       check=True, capture_output=True)
                    r = np.load(f"{w}/ref.npy").astype(np.float64)[: a.positions]
                    c = np.load(f"{w}/cfg.npy").astype(np.float64)[: a.positions]
                    kt = (np.exp(r) * (r - c)).sum(1)
                line += (f"   | replayssm: {kt[tail].mean():.3e}, worst {kt[worst]:.4f}, "
                         f"correlation {np.corrcoef(k[tail], kt[tail])[0, 1]:.4f}")
            print(line)
            for h in range(heads):
                alone = np.zeros_like(err)
                alone[:, h] = err[:, h]
                kh = kl_with(alone)
                print(f"        head {h} alone: {kh[tail].mean():.3e} ({kh[tail].mean() / k[tail].mean():6.1%} of all), "
                      f"at {worst}: {kh[worst]:.4f}; memory 1/(1 - mean alpha) = {1 / (1 - alpha[:, h].mean()):.1f}")
    finally:
        target.mamba2_chunk_scan = original


if __name__ == "__main__":
    main()
