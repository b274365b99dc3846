#!/usr/bin/env python3
"""Tokenise PG-19 style books with a model's own Hugging Face tokenizer for `replayssm kl-sweep`.

    python3 scripts/tokenize.py --text-dir ../shared/data/pg19/test --tokenizer /models/Qwen3.5-4B \
        --out tokens/qwen3.5-4b
    replayssm kl-sweep /models/Qwen3.5-4B --text-dir ../shared/data/pg19/test \
        --tokens-dir tokens/qwen3.5-4b --length 131072 --out results-fig5.h5

Each book is stripped of its Project Gutenberg header and licence footer exactly as the C++ reader
does (src/io/text_source.h, "gutenberg-v1"), tokenised without special tokens (--add-bos prepends
the tokenizer's BOS id) and written as OUT/NAME.npy (int32, the whole book). OUT/manifest.json names
the tokenizer and, per book, the source file, the token file and the FNV-1a hash of the stripped
text: kl-sweep recomputes that hash from --text-dir and refuses tokens made from different text.

--tokenizer bytes needs no transformers: id = byte value + --byte-offset (what kl-sweep does
without --tokens-dir; useful to check that both strippers agree).
"""
import os
import sys

# This file shares its name with the standard library's `tokenize` (imported by numpy, inspect,
# linecache, traceback). Every script in scripts/ runs with scripts/ first on sys.path, and so
# does pytest (tests/python/conftest.py), so `import tokenize` there finds this file:
#  - imported under the name "tokenize": load the standard module and put it in sys.modules, which
#    is what the importer hands back (importlib re-reads sys.modules after executing a module);
#  - run as a script: drop scripts/ from sys.path before importing anything else.
if __name__ == "tokenize":
    import importlib.machinery
    import importlib.util
    import sysconfig

    _spec = importlib.machinery.PathFinder.find_spec("tokenize", [sysconfig.get_paths()["stdlib"]])
    _real = importlib.util.module_from_spec(_spec)
    sys.modules["tokenize"] = _real
    _spec.loader.exec_module(_real)
if __name__ == "__main__":
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402

import numpy as np  # noqa: E402

STRIP_VERSION = "gutenberg-v1"
FORMAT = "replayssm-tokens"
TEXT_DIR_HINT = "point --text-dir at a folder of PG-19 .txt books, e.g. ../shared/data/pg19/test"


# ---- stripping: the same steps as src/io/text_source.cpp ---------------------------------------

def _ltrim(s):
    return s.lstrip(b" \t")


def _is_blank(s):
    return s.strip(b" \t\r") == b""


def _consume(s, prefix):
    if s[: len(prefix)].lower() == prefix.lower() and len(s) >= len(prefix):
        return s[len(prefix):]
    return None


def _consume_words(s, words):
    t = s
    for i, w in enumerate(words):
        if i > 0:
            if not t or t[:1] not in (b" ", b"\t"):
                return None
            t = _ltrim(t)
        t = _consume(t, w)
        if t is None:
            return None
    return t


def _phrase(s, verb1, verb2):
    t = _consume_words(s, [verb1, verb2])
    if t is None:
        return None
    for words in ([b"", b"the", b"project", b"gutenberg"], [b"", b"this", b"project", b"gutenberg"],
                  [b"", b"project", b"gutenberg"]):
        u = _consume_words(t, words)
        if u is not None:
            return u
    return None


def _consume_stars(s):
    n = len(s) - len(s.lstrip(b"*"))
    if n < 3:
        return None
    return _ltrim(s[n:])


def _header_marker(line):
    """None if not a header marker, else whether the marker closes ('***') on this line."""
    t = _ltrim(line)
    if _consume(t, b"*END*THE SMALL PRINT") is not None:
        return True
    u = _consume_stars(t)
    if u is None:
        return None
    u = _phrase(u, b"start", b"of")
    if u is None:
        return None
    return b"***" in u


def _footer_marker(line):
    t = _ltrim(line)
    u = _consume_stars(t)
    if u is not None and _phrase(u, b"end", b"of") is not None:
        return True
    return _phrase(t, b"end", b"of") is not None


def strip_gutenberg(raw, name="text"):
    """Returns (body bytes, header_found, footer_found); raises ValueError like the C++ reader."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    text = raw.replace(b"\r\n", b"\n")
    lines = text.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    begin, end = 0, len(lines)
    header = footer = False
    for i, line in enumerate(lines):
        closed = _header_marker(line)
        if closed is None:
            continue
        header = True
        begin = i + 1
        if not closed:
            for j in range(i + 1, min(len(lines), i + 4)):
                if _is_blank(lines[j]):
                    break
                if b"***" in lines[j]:
                    begin = j + 1
                    break
        break
    for i in range(begin, len(lines)):
        if _footer_marker(lines[i]):
            footer = True
            end = i
            break
    if footer and not header:
        raise ValueError(f"{name}: has a Project Gutenberg footer but no \"*** START OF ...\" header marker, "
                         "so where the book begins is unknown")
    while begin < end and _is_blank(lines[begin]):
        begin += 1
    while end > begin and _is_blank(lines[end - 1]):
        end -= 1
    if begin == end:
        raise ValueError(f"{name}: empty after removing the Project Gutenberg header and footer")
    return b"\n".join(lines[begin:end]) + b"\n", header, footer


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for c in data:
        h ^= c
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def list_books(text_dir):
    d = pathlib.Path(text_dir)
    if not d.is_dir():
        raise SystemExit(f"no text found in {text_dir}: the directory does not exist; {TEXT_DIR_HINT}")
    books = sorted((p for p in d.iterdir()
                    if p.name.lower().endswith(".txt") and len(p.name) > 4 and p.is_file()
                    and not p.name.lower().startswith(("readme", "sources", "license"))),
                   key=lambda p: p.name)
    if not books:
        raise SystemExit(f"no text found in {text_dir}: no .txt books in it; {TEXT_DIR_HINT}")
    return books


def decode(body):
    for enc in ("utf-8", "cp1252", "latin-1"):
        try:
            return body.decode(enc), enc
        except UnicodeDecodeError:
            continue
    raise AssertionError("latin-1 decodes every byte string")


def load_tokenizer(name):
    from transformers import AutoTokenizer  # only for real tokenizers
    tok = AutoTokenizer.from_pretrained(name)
    tok.model_max_length = 1 << 62  # whole books: silence the "sequence too long" warning
    return tok


def write_atomically(path, write):
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text-dir", required=True, help="folder of .txt books")
    ap.add_argument("--tokenizer", required=True,
                    help="Hugging Face tokenizer (a local model directory or name), or 'bytes'")
    ap.add_argument("--out", required=True, help="output folder (NAME.npy per book + manifest.json)")
    ap.add_argument("--books", type=int, default=0, help="only the first N books in name order (0: all)")
    ap.add_argument("--add-bos", action="store_true", help="prepend the tokenizer's BOS token id")
    ap.add_argument("--byte-offset", type=int, default=0, help="--tokenizer bytes: id = byte + offset")
    args = ap.parse_args(argv)

    files = list_books(args.text_dir)
    if args.books > 0:
        files = files[: args.books]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.tokenizer == "bytes":
        tok, tok_class, vocab, bos = None, "bytes", 256 + args.byte_offset, None
    else:
        tok = load_tokenizer(args.tokenizer)
        tok_class, vocab, bos = type(tok).__name__, len(tok), tok.bos_token_id
        if args.add_bos and bos is None:
            raise SystemExit(f"--add-bos: tokenizer {args.tokenizer} has no BOS token")

    books = []
    for path in files:
        body, header, footer = strip_gutenberg(path.read_bytes(), str(path))
        if tok is None:
            ids = np.frombuffer(body, dtype=np.uint8).astype(np.int32) + args.byte_offset
            encoding = "bytes"
        else:
            text, encoding = decode(body)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if args.add_bos:
                ids = [bos] + ids
            ids = np.asarray(ids, dtype=np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= 2**31):
                raise SystemExit(f"{path}: token ids outside int32")
            ids = ids.astype(np.int32)
        npy = f"{path.stem}.npy"
        write_atomically(out / npy, lambda p, a=ids: np.save(open(p, "wb"), a))
        books.append({"name": path.stem, "source": path.name, "tokens": npy, "n_tokens": int(ids.size),
                      "text_bytes": len(body), "text_fnv1a64": f"{fnv1a64(body):016x}", "encoding": encoding,
                      "header_found": header, "footer_found": footer})
        print(f"{path.name}: {len(body)} bytes of text -> {ids.size} tokens", file=sys.stderr)

    manifest = {"format": FORMAT, "version": 1, "strip": STRIP_VERSION, "tokenizer": args.tokenizer,
                "tokenizer_class": tok_class, "vocab_size": vocab, "add_bos": bool(args.add_bos),
                "bos_token_id": bos, "byte_offset": args.byte_offset if tok is None else None,
                "text_dir": str(args.text_dir), "books": books}
    write_atomically(out / "manifest.json",
                     lambda p: p.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8"))
    print(f"wrote {len(books)} books to {out} (tokenizer {args.tokenizer})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
