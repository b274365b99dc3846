#!/usr/bin/env python3
"""Tokenise PG-19 style books with a model's own tokenizer for `replayssm kl-sweep --tokens-dir`.

    python3 scripts/tokenize_text.py --text-dir ../shared/data/pg19/test --tokenizer /models/Qwen3.5-4B \
        --out tokens/qwen3.5-4b
    replayssm kl-sweep /models/Qwen3.5-4B --text-dir ../shared/data/pg19/test \
        --tokens-dir tokens/qwen3.5-4b --length 131072 --out results-fig5.h5

Each book is stripped of its Project Gutenberg header and licence footer exactly as the C++ reader
does (src/io/text_source.h, "gutenberg-v1"), tokenised without special tokens (--add-bos prepends
the tokenizer's BOS id) and written as OUT/NAME.npy (int32, the whole book). OUT/manifest.json names
the tokenizer and, per book, the source file, the token file and the FNV-1a hash of the stripped
text: kl-sweep recomputes that hash from --text-dir and refuses tokens made from different text.

--tokenizer is a model folder holding tokenizer.json (or that file); it is run with the `tokenizers`
package alone, BOS taken from tokenizer_config.json. --tokenizer bytes: id = byte value +
--byte-offset (what kl-sweep does without --tokens-dir; useful to check that both strippers agree).
The work is done by replayssm_py.tokenize_text.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.tokenize_text import tokenize_books  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text-dir", required=True, help="folder of .txt books")
    ap.add_argument("--tokenizer", required=True, help="model folder with tokenizer.json, a tokenizer.json, or 'bytes'")
    ap.add_argument("--out", required=True, help="output folder (NAME.npy per book + manifest.json)")
    ap.add_argument("--books", type=int, default=0, help="only the first N books in name order (0: all)")
    ap.add_argument("--add-bos", action="store_true", help="prepend the tokenizer's BOS token id")
    ap.add_argument("--byte-offset", type=int, default=0, help="--tokenizer bytes: id = byte + offset")
    args = ap.parse_args(argv)
    try:
        tokenize_books(args.text_dir, args.tokenizer, args.out, books=args.books, add_bos=args.add_bos,
                       byte_offset=args.byte_offset)
    except (OSError, ValueError) as e:
        print(f"tokenize_text.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
