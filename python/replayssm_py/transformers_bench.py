"""transformers' side of the GPU sweep benchmark (scripts/bench_gpu_sweep.sh), one checkpoint:

1. validation (before anything is timed): `replayssm logits --device cuda` on the first
   --validate-positions byte tokens of the book, at each --computes precision, against transformers'
   FP32 log-probabilities of the same tokens (the independent oracle); the largest absolute
   difference over every position and vocabulary entry, and over the true next tokens;
2. timing: transformers' fastest FP32 forward (sdpa attention, TF32 off) at --length positions,
   halving on out-of-memory down to 1024: the decoder's final hidden states, then LM head and
   log-softmax in chunks of 4096 positions (the N x vocab logits would not fit); one warm-up
   forward on 1024 positions first.

Writes --out (JSON; rewritten after every step, so a cut run keeps what it measured). Exit status 1
when a validation exceeds --tolerance, 0 otherwise.

  python3 scripts/bench_transformers.py --ckpt DIR --text-dir DIR --length N --out FILE.json \
      [--validate-positions 512] [--computes fp32,bf16x3] [--replayssm BIN] [--tolerance 1e-3]
"""
import argparse
import gc
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--text-dir", required=True, type=pathlib.Path)
    ap.add_argument("--length", required=True, type=int, help="first length tried for the timed forward")
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--validate-positions", type=int, default=512, help="0: no validation")
    ap.add_argument("--computes", default="fp32", help="replayssm --compute values validated, comma-separated")
    ap.add_argument("--replayssm", default=".device/bin/replayssm")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="replayssm's --device")
    ap.add_argument("--tolerance", type=float, default=1e-3, help="largest |log p_ours - log p_transformers| accepted")
    a = ap.parse_args(argv)
    if a.length < 1 or a.validate_positions < 0:
        sys.exit("--length must be >= 1 and --validate-positions >= 0")
    books = sorted(a.text_dir.glob("*.txt"))
    if not books:
        sys.exit(f"--text-dir {a.text_dir}: no .txt books")
    book = books[0]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.set_grad_enabled(False)
    # Byte-level ids of the book's raw bytes (the sweep strips the Gutenberg header first: for a
    # timing and a forward comparison the content does not matter).
    ids_all = torch.tensor(list(book.read_bytes()[: max(a.length, a.validate_positions)]), dtype=torch.long)

    t0 = time.time()
    model = transformers.AutoModelForCausalLM.from_pretrained(a.ckpt, dtype=torch.float32, attn_implementation="sdpa")
    model = model.to(dev).eval()
    load_s = time.time() - t0
    head = model.get_output_embeddings()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {type(model).__name__} loaded in "
          f"{load_s:.1f} s on {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'})", flush=True)
    result = {"model_dir": a.ckpt, "book": book.name, "model_class": type(model).__name__, "device": dev,
              "transformers_version": transformers.__version__, "torch_version": torch.__version__,
              "attn_implementation": "sdpa", "tf32": False, "load_seconds": round(load_s, 1),
              "validation": [], "attempts": []}

    def save():
        a.out.write_text(json.dumps(result, indent=2) + "\n")

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    failed = False
    if a.validate_positions:
        v = a.validate_positions
        ids = ids_all[:v]
        theirs = torch.log_softmax(model(input_ids=ids.to(dev)[None], use_cache=False).logits[0].float(), -1)
        theirs = theirs.cpu().numpy()
        targets = ids[1:].numpy()
        with tempfile.TemporaryDirectory() as tmp:
            tok = pathlib.Path(tmp, "tokens.npy")
            np.save(tok, ids.numpy().astype(np.int32))
            for compute in a.computes.split(","):
                ours_path = pathlib.Path(tmp, f"ours_{compute}.npy")
                cmd = [a.replayssm, "logits", a.ckpt, "--tokens", str(tok), "--out", str(ours_path),
                       "--device", a.device, "--force"]
                if a.device == "cuda":
                    cmd += ["--compute", compute]
                run = subprocess.run(cmd, capture_output=True, text=True)
                if run.returncode != 0:
                    print(run.stdout + run.stderr, flush=True)
                    result["validation"].append({"compute": compute, "outcome": f"replayssm exit {run.returncode}"})
                    failed = True
                    save()
                    continue
                ours = np.load(ours_path)
                if ours.shape != theirs.shape:
                    sys.exit(f"replayssm logits: shape {ours.shape}, transformers {theirs.shape}")
                diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
                at_targets = diff[np.arange(v - 1), targets]
                entry = {"compute": compute, "positions": v, "vocab": int(theirs.shape[1]),
                         "max_abs_logprob_diff": float(diff.max()), "mean_abs_logprob_diff": float(diff.mean()),
                         "max_abs_diff_at_next_token": float(at_targets.max()),
                         "logprob_range": [float(theirs.min()), float(theirs.max())],
                         "tolerance": a.tolerance, "passed": bool(diff.max() <= a.tolerance)}
                failed |= not entry["passed"]
                result["validation"].append(entry)
                save()
                print(f"validation, replayssm --device {a.device} --compute {compute} against transformers FP32 on {v} "
                      f"positions x {theirs.shape[1]} log-probs: max |diff| {entry['max_abs_logprob_diff']:.3e}, "
                      f"mean {entry['mean_abs_logprob_diff']:.3e}, at the next tokens "
                      f"{entry['max_abs_diff_at_next_token']:.3e} (log-probs in [{theirs.min():.2f}, "
                      f"{theirs.max():.2f}]): {'passed' if entry['passed'] else 'FAILED'} (tolerance {a.tolerance:g})",
                      flush=True)
        del theirs
        gc.collect()

    def forward(n):
        ids = ids_all[:n].to(dev)[None]
        sync()
        t = time.time()
        h = model.model(input_ids=ids, use_cache=False).last_hidden_state[0]
        sync()
        t_body = time.time() - t
        lse = torch.empty(n, dtype=torch.float64, device=dev)
        for r in range(0, n, 4096):
            lse[r:r + 4096] = torch.log_softmax(head(h[r:r + 4096]), dim=-1)[:, 0].double()
        sync()
        return t_body, time.time() - t, bool(torch.isfinite(lse).all())

    floor = min(1024, a.length)
    forward(floor)  # warm-up (cuBLAS handles, kernel selection)
    n = a.length
    while n >= floor:
        print(f"transformers FP32 forward: trying {n} positions", flush=True)
        try:
            body, total, finite = forward(n)
        except torch.OutOfMemoryError:
            body = None
        if body is None:  # outside the except block: the failed forward's tensors are released by now
            result["attempts"].append({"n_positions": n, "outcome": "out of memory"})
            save()
            print(f"transformers FP32 forward: {n} positions: out of memory; halving", flush=True)
            gc.collect()
            torch.cuda.empty_cache()
            n //= 2
            continue
        result.update(n_positions=n, body_seconds=round(body, 3), total_seconds=round(total, 3),
                      tokens_per_second=round(n / total, 1), finite=finite)
        if dev == "cuda":
            result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        save()
        print(f"transformers FP32 forward: {n} positions in {total:.2f} s ({n / total:.0f} tokens/s; decoder "
              f"{body:.2f} s, LM head + log-softmax {total - body:.2f} s), finite {finite}", flush=True)
        break
    if "n_positions" not in result:
        print(f"transformers FP32 forward: out of memory down to {floor} positions", flush=True)
    save()
    return 1 if failed else 0

