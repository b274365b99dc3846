"""Hand-made .npy files for the reader tests: each case is (name, bytes); numpy decides which are valid."""
import struct

import numpy as np


def npy_bytes(header, data, version=(1, 0), pad=True, header_len=None):
    h = header.encode("utf8" if version == (3, 0) else "latin1")
    if pad:
        pre = 8 + (2 if version == (1, 0) else 4)
        h += b" " * ((64 - (pre + len(h) + 1) % 64) % 64) + b"\n"
    n = len(h) if header_len is None else header_len
    length = struct.pack("<H", n) if version == (1, 0) else struct.pack("<I", n)
    return b"\x93NUMPY" + bytes(version) + length + h + data


def header(descr="'<f4'", fortran="False", shape="(2, 16)"):
    return "{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)


def cases(rng):
    x = (rng.standard_normal((2, 16)) * 3).astype("<f4")
    d = x.tobytes()
    out = []
    for descr in ["'<f4'", "'f4'", "'=f4'", "'|f4'", "'<f'", "'f'", "'float32'", "'single'", '"<f4"', "u'<f4'",
                  "r'<f4'", "'<' 'f4'", "'\\x3cf4'", "'''<f4'''", "'>f4'", "'<f8'", "'<F4'", "'>float32'", "'<single'",
                  "' f4'", "b'<f4'", "f'<f4'", "[('', '<f4')]", "[('a', '<f4')]", "None", "'<f2'", "'<i4'", "'|u1'",
                  "'<c8'", "'V4'", "4"]:
        data = x.astype(">f4").tobytes() if descr in ("'>f4'",) else d
        out.append((f"descr {descr}", npy_bytes(header(descr=descr), data)))
    for shape in ["(2, 16)", "(2,16)", "( 2 , 16 , )", "(0x2, 0o20)", "(0b10, 1_6)", "(+2, 16)", "(2, 16,)",
                  "((2), 16)", "(32,)", "(2, 1, 16)", "(-2, -16)", "(-1, 32)", "(-(2), 16)", "(2, 'x', 16)",
                  "(True, 32)", "(2.0, 16)", "[2, 16]", "32", "(32)", "((2,), 16)", "(2, 016)", "(2, 16,,)",
                  "(99999999999999999999999, 16)", "(2, 16, 1+0j)", "(-True, 32)", "(--2, 16)", "(2L, 16L)",
                  "(2 L, 16)", "(1152921504606846977, 16)", "(4611686018427387906, 8)", "(2305843009213693952, 16)"]:
        out.append((f"shape {shape}", npy_bytes(header(shape=shape), d)))
    for fortran in ["True", "0", "1", "'False'", "None"]:
        data = x.T.copy().tobytes() if fortran == "True" else d
        out.append((f"fortran {fortran}", npy_bytes(header(fortran=fortran, shape="(2, 16)"), data)))
    base = header()
    raw = {
        "dup descr last wins": "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 16), 'descr': '<f4'}",
        "dup descr last is f8": "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 16), 'descr': '<f8'}",
        "dup shape last wins": "{'descr': '<f4', 'fortran_order': False, 'shape': 'x', 'shape': (2, 16)}",
        "extra key": "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 16), 'x': 1}",
        "missing key": "{'descr': '<f4', 'shape': (2, 16)}",
        "non-string key": "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 16), 1: 2}",
        "unhashable key": "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 16), [1]: 2}",
        "comment": base + " # a comment",
        "tabs and newlines": "{'descr':\t'<f4',\n'fortran_order': False,\r\n'shape': (2, 16)}",
        "line continuation": "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 16)}\\\n",
        "leading spaces": "   " + base,
        "leading newline then indent": "\n  " + base,
        "parenthesised dict": "(" + base + ")",
        "tuple of dict": base + ",",
        "two dicts": base + "\n{}",
        "list": "['descr', 'fortran_order', 'shape']",
        "set": "{'descr', 'fortran_order', 'shape'}",
        "nul padding": base + "\x00",
        "unterminated string": "{'descr': '<f4, 'fortran_order': False, 'shape': (2, 16)}",
        "unclosed dict": "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 16)",
        "empty": "",
        "set() value overwritten": "{'descr': set(), 'fortran_order': False, 'shape': (2, 16), 'descr': '<f4'}",
        "complex value overwritten": "{'descr': 1+2j, 'fortran_order': False, 'shape': (2, 16), 'descr': '<f4'}",
        "name value": "{'descr': float32, 'fortran_order': False, 'shape': (2, 16)}",
    }
    for name, h in raw.items():
        out.append((name, npy_bytes(h, d)))
    out.append(("version 2.0", npy_bytes(base, d, version=(2, 0))))
    out.append(("version 3.0", npy_bytes(base, d, version=(3, 0))))
    out.append(("version 3.0 non-ascii", npy_bytes(base + " # \u00e9\u4e2d", d, version=(3, 0))))
    out.append(("version 1.1", npy_bytes(base, d, version=(1, 1))))
    out.append(("version 4.0", npy_bytes(base, d, version=(4, 0))))
    out.append(("version 0.0", npy_bytes(base, d, version=(0, 0))))
    out.append(("no padding", npy_bytes(base, d, pad=False)))
    out.append(("truncated data", npy_bytes(base, d[:-1])))
    out.append(("no data", npy_bytes(base, b"")))
    out.append(("header length beyond the file", npy_bytes(base, d, version=(2, 0), header_len=2**32 - 1)))
    out.append(("header length short", npy_bytes(base, d, header_len=20)))
    out.append(("header over 10000 characters", npy_bytes(base + " " * 10050, d)))
    out.append(("header of 9990 characters", npy_bytes(base + " " * (9990 - len(base)), d, pad=False)))
    out.append(("only magic", b"\x93NUMPY\x01\x00"))
    out.append(("bad magic", b"\x93NUMPZ\x01\x00" + npy_bytes(base, d)[8:]))
    out.append(("empty file", b""))
    return x, out
