#!/usr/bin/env python3
"""Which layers carry a hybrid model's long-range information (issue 11: why the Gated DeltaNet heads of
long_qwen3_5 learned short memories while long_nemotron_h kept four Mamba-2 heads of >= 1,000 tokens):

    python3 experiments/context_ablation.py data/models/long_qwen3_5 [--bytes 16384] [--window 256] \
        [--books 4] [--text-dir ../shared/data/pg19/test] [--out experiments/results/context_ablation_X.txt]

transformers' own forward (float32, CPU) streams each book in chunks of --window tokens with the cache carried,
under four context rules:
  full       everything carried (the model as trained and evaluated);
  attn-local the attention layers keep only the last --window keys/values before each chunk (each query sees
             between --window and 2 --window - 1 tokens; position ids stay the true positions, so RoPE phases
             are those of the full run), the SSM states are carried;
  ssm-reset  the SSM layers' recurrent and convolution states are zeroed before each chunk (an SSM memory of at
             most 2 --window - 1 tokens), the attention caches are carried;
  both       both restrictions.
It prints bits per byte over the positions from --skip on (default 1,024: every rule has the same local
context there), pooled over the books, and the increase of each rule over "full": the information per byte
that needs context beyond the window through that path. Text: the first --books PG-19 test books in name
order, stripped, their first --bytes bytes.
"""
import argparse
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
from replayssm_py.text import list_books, strip_book  # noqa: E402

RULES = ("full", "attn-local", "ssm-reset", "both")


def cache_layers(cache):
    """(attention layers, SSM layers) of a transformers cache: DynamicCache layers with keys/values, and
    LinearAttentionLayer (Qwen3.5, NemotronH) state dicts; Mamba2Cache's tensors for a pure Mamba-2 model."""
    attn, ssm = [], []
    for layer in getattr(cache, "layers", []):
        if hasattr(layer, "recurrent_states"):
            ssm.append(layer)
        elif getattr(layer, "keys", None) is not None:
            attn.append(layer)
    return attn, ssm


def restrict(cache, rule, window):
    import torch

    attn, ssm = cache_layers(cache)
    if rule in ("attn-local", "both"):
        for layer in attn:
            layer.keys, layer.values = layer.keys[:, :, -window:], layer.values[:, :, -window:]
    if rule in ("ssm-reset", "both"):
        if not ssm and hasattr(cache, "ssm_states"):  # Mamba2Cache
            for t in (cache.ssm_states, cache.conv_states):
                if torch.is_tensor(t):
                    t.zero_()
                else:
                    for x in t:
                        x.zero_()
        for layer in ssm:
            for states in (layer.recurrent_states, layer.conv_states):
                for t in states.values():
                    if t is not None:
                        t.zero_()


def book_nll(model, ids, rule, window, skip, torch):
    """Sum of the next-byte NLL (nats) over target positions >= skip, and their count."""
    import torch.nn.functional as F

    n = ids.shape[1] - 1
    total, count, cache = 0.0, 0, None
    mamba2 = type(model).__name__ == "Mamba2ForCausalLM"
    for s in range(0, n, window):
        e = min(s + window, n)
        if cache is not None:
            restrict(cache, rule, window)
        kwargs = {"cache_params": cache} if mamba2 else {"past_key_values": cache}
        if mamba2 and cache is not None:
            kwargs["cache_position"] = torch.arange(s, e)
        out = model(input_ids=ids[:, s:e], position_ids=None if mamba2 else torch.arange(s, e)[None],
                    use_cache=True, **kwargs)
        cache = out.cache_params if mamba2 else out.past_key_values
        pos = torch.arange(s, e)  # the target of input position p is byte p + 1
        keep = pos + 1 >= skip
        if keep.any():
            nll = F.cross_entropy(out.logits[0].double(), ids[0, s + 1:e + 1], reduction="none")
            total += nll[keep].sum().item()
            count += int(keep.sum())
    return total, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--text-dir", default=str(ROOT.parent / "shared" / "data" / "pg19" / "test"))
    ap.add_argument("--books", type=int, default=4)
    ap.add_argument("--bytes", type=int, default=16384)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--skip", type=int, default=1024)
    ap.add_argument("--out", type=pathlib.Path)
    a = ap.parse_args()
    if not (a.window >= 1 and a.bytes > a.skip >= 2 * a.window):
        ap.error("need --bytes > --skip >= 2 --window >= 2 (every rule must have the same local context from --skip)")
    if not (pathlib.Path(a.model) / "config.json").is_file():
        ap.error(f"{a.model}: no config.json there (expected a Hugging Face checkpoint folder, e.g. data/models/long_qwen3_5)")
    if not pathlib.Path(a.text_dir).is_dir():
        ap.error(f"--text-dir {a.text_dir}: not a folder (expected the PG-19 test books)")
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    books = list_books(a.text_dir)[:a.books]
    texts = [(p.name, strip_book(p)[:a.bytes]) for p in books]
    rows = {}
    with torch.no_grad():
        for rule in RULES:
            tot, cnt = 0.0, 0
            for name, text in texts:
                ids = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()[None]
                t, c = book_nll(model, ids, rule, a.window, a.skip, torch)
                tot, cnt = tot + t, cnt + c
            rows[rule] = tot / cnt / math.log(2)
            print(f"{rule:10s} {rows[rule]:.4f} bits/byte", file=sys.stderr, flush=True)
    lines = [f"context ablation: {a.model}, {len(texts)} books ({', '.join(n for n, _ in texts)}), first {a.bytes} bytes, "
             f"window {a.window}, bits/byte over targets from byte {a.skip} on (transformers {transformers.__version__}, "
             "float32, CPU)", "", "| rule | bits/byte | over full |", "|---|---|---|"]
    lines += [f"| {r} | {rows[r]:.4f} | {rows[r] - rows['full']:+.4f} |" for r in RULES]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
