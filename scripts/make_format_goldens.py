#!/usr/bin/env python3
"""Generate the bit-exact golden vectors for replayssm's number formats.

Writes ``data/goldens/formats_v1.json``: inputs (float32 bit patterns) and the expected outputs
(element codes, packed bytes, block scales, tensor scale, decoded float32 bit patterns) of fp16,
bf16, FP8 E4M3, FP4 E2M1, the NVFP4 container and the FP8 block-128 container, with RTN and with
the project's stochastic rounding, from the independent numpy + ml_dtypes implementation in
replayssm_py.formats (definitions and project choices in its docstring; the file's conventions in
replayssm_py.goldens).

    python3 scripts/make_format_goldens.py                # writes data/goldens/formats_v1.json
    python3 scripts/make_format_goldens.py -o OTHER.json  # writes elsewhere

The output is deterministic; ``tests/python/test_format_goldens_script.py`` checks that the committed
file equals a fresh regeneration.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py import goldens  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=str(goldens.FORMAT_GOLDENS),
                    help="output path (default data/goldens/formats_v1.json)")
    args = ap.parse_args(argv)
    n_cases, n_bytes = goldens.write_format_goldens(args.output)
    print(f"wrote {args.output}: {n_cases} cases, {n_bytes} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
