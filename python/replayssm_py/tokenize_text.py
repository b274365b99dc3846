"""Token folders for `replayssm kl-sweep --tokens-dir` (format "replayssm-tokens", version 1).

Each book of a text folder is stripped as the C++ reader strips it (replayssm_py.text), tokenised
without special tokens (optionally the tokenizer's BOS id first) and written as OUT/NAME.npy (int32,
the whole book). OUT/manifest.json names the tokenizer and, per book, the source file, the token file
and the FNV-1a hash of the stripped text, which kl-sweep checks against its own stripping.

A model's tokenizer is read from its `tokenizer.json` with the `tokenizers` package alone (what
transformers' fast tokenizers run underneath); "bytes" means id = byte value + byte_offset.
"""
import json
import pathlib
import sys

import numpy as np

from . import text
from .files import write_atomically, write_text_atomically

FORMAT = "replayssm-tokens"
VERSION = 1
INT32_MAX = 2**31 - 1


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded or used; the message names the file and the field."""


class Tokenizer:
    """A Hugging Face tokenizer as a model folder ships it: tokenizer.json (the tokenizers
    pipeline) and, when present, tokenizer_config.json (class name, BOS token)."""

    def __init__(self, source):
        path = pathlib.Path(source)
        if path.is_dir():
            json_path = path / "tokenizer.json"
            if not json_path.is_file():
                raise TokenizerError(f"{source}: no tokenizer.json in it; --tokenizer takes a model folder with a "
                                     "tokenizer.json (the fast-tokenizer file), that file itself, or 'bytes'")
        elif path.is_file():
            json_path, path = path, path.parent
        else:
            raise TokenizerError(f"{source}: no such file or folder; --tokenizer takes a model folder with a "
                                 "tokenizer.json, that file itself, or 'bytes'")
        try:
            import tokenizers
        except ImportError:
            raise TokenizerError(f"--tokenizer {source}: the tokenizers package is not installed (pip install "
                                 "tokenizers; scripts/setup.sh installs it)") from None
        try:
            self.backend = tokenizers.Tokenizer.from_file(str(json_path))
        except Exception as e:  # the Rust parser raises its own exception type
            raise TokenizerError(f"{json_path}: not a tokenizers file ({e})") from None
        config = self._read_config(path / "tokenizer_config.json")
        self.class_name = config.get("tokenizer_class") or "tokenizers.Tokenizer"
        self.vocab_size = self.backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self._bos_id(config, path / "tokenizer_config.json")

    @staticmethod
    def _read_config(path):
        if not path.is_file():
            return {}
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(config, dict):
            raise TokenizerError(f"{path}: expected a JSON object, got {type(config).__name__}")
        return config

    def _bos_id(self, config, config_path):
        bos = config.get("bos_token")
        if isinstance(bos, dict):  # {"content": "<s>", "lstrip": ..., ...}
            bos = bos.get("content")
        if bos is None:
            return None
        if not isinstance(bos, str):
            raise TokenizerError(f"{config_path}: field bos_token: expected a token string or "
                                 f"{{\"content\": ...}}, got {bos!r}")
        token_id = self.backend.token_to_id(bos)
        if token_id is None:
            raise TokenizerError(f"{config_path}: field bos_token {bos!r} is not in the vocabulary of tokenizer.json")
        return token_id

    def encode(self, body_text):
        return self.backend.encode(body_text, add_special_tokens=False).ids


def decode(body):
    """(str, encoding): UTF-8 where the bytes are UTF-8, else cp1252, else latin-1 (never fails)."""
    for encoding in ("utf-8", "cp1252"):
        try:
            return body.decode(encoding), encoding
        except UnicodeDecodeError:
            continue
    return body.decode("latin-1"), "latin-1"


def _save_npy(path, ids):
    with open(path, "wb") as f:  # a file object: np.save would append ".npy" to a temporary's name
        np.save(f, ids, allow_pickle=False)


def tokenize_books(text_dir, tokenizer, out, books=0, add_bos=False, byte_offset=0, log=None):
    """Writes OUT/NAME.npy per book and OUT/manifest.json; returns the manifest (a dict).

    tokenizer: "bytes" or a model folder / tokenizer.json path. books: the first N books (0: all).
    Raises text.TextError or TokenizerError with a message naming the file."""
    if books < 0:
        raise ValueError(f"--books must be >= 0, got {books}")
    if byte_offset < 0:
        raise ValueError(f"--byte-offset must be >= 0, got {byte_offset}")
    log = log or (lambda msg: print(msg, file=sys.stderr))
    files = text.list_books(text_dir)
    if books > 0:
        files = files[:books]
    if tokenizer == "bytes":
        tok, tok_class, vocab, bos = None, "bytes", 256 + byte_offset, None
        if vocab - 1 > INT32_MAX:
            raise ValueError(f"--byte-offset {byte_offset}: byte ids up to {vocab - 1} do not fit int32")
    else:
        tok = Tokenizer(tokenizer)
        tok_class, vocab, bos = tok.class_name, tok.vocab_size, tok.bos_token_id
        if add_bos and bos is None:
            raise TokenizerError(f"--add-bos: tokenizer {tokenizer} has no BOS token (no bos_token in its "
                                 "tokenizer_config.json)")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)

    records = []
    for path in files:
        body, header, footer = text.strip_gutenberg(path.read_bytes(), str(path))
        if tok is None:
            ids = np.frombuffer(body, dtype=np.uint8).astype(np.int32) + np.int32(byte_offset)
            encoding = "bytes"
        else:
            decoded, encoding = decode(body)
            ids = np.asarray(([bos] if add_bos else []) + tok.encode(decoded), dtype=np.int64)
            if ids.size and (ids.min() < 0 or ids.max() > INT32_MAX):
                raise TokenizerError(f"{path}: token ids outside int32")
            ids = ids.astype(np.int32)
        npy = f"{path.stem}.npy"
        write_atomically(out / npy, lambda tmp, a=ids: _save_npy(tmp, a))
        records.append({"name": path.stem, "source": path.name, "tokens": npy, "n_tokens": int(ids.size),
                        "text_bytes": len(body), "text_fnv1a64": text.hex64(text.fnv1a64(body)),
                        "encoding": encoding, "header_found": header, "footer_found": footer})
        log(f"{path.name}: {len(body)} bytes of text -> {ids.size} tokens")

    manifest = {"format": FORMAT, "version": VERSION, "strip": text.STRIP_VERSION, "tokenizer": str(tokenizer),
                "tokenizer_class": tok_class, "vocab_size": vocab, "add_bos": bool(add_bos),
                "bos_token_id": bos, "byte_offset": byte_offset if tok is None else None,
                "text_dir": str(text_dir), "books": records}
    write_text_atomically(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    log(f"wrote {len(records)} books to {out} (tokenizer {tokenizer})")
    return manifest
