#!/usr/bin/env python3
"""CPU re-enactment of the index arithmetic of stage_window_records, fold_rows and the streamed flush's
coefficients (the prepared patches of this folder): every thread's 16-byte pieces must cover
vals[p][0 .. NH dv) exactly once, each from the right ring slot or the current token, and the folds must
read, for a row of a head, that row's value at every position. This checks the
lane arithmetic only, not the CUDA semantics of cp.async; test_decode_cuda on the H200 decides those."""
import itertools, random

K_THREADS = 256


def small_div(x, d):
    # SmallDiv (decode_common.cuh): int((x + 0.5) * (1 / d)) in float32
    import numpy as np
    inv = np.float32(1.0) / np.float32(d)
    return int((np.float32(x) + np.float32(0.5)) * inv)


def staging_ok(kind, B, H, G, dv, NH, capacity, start, h0, head0, b):
    piece = 8 if kind == 'mamba2' else 4  # values per 16 bytes: bf16 v or fp32 u
    staged = h0 + 1 if kind == 'mamba2' else h0
    run = NH * dv
    pieces = run % piece == 0 and (H * dv) % piece == 0 and (head0 * dv) % piece == 0
    if not pieces:
        return None  # the element-wise fallback: dst[i] = src_of(i / run)[i % run], nothing to re-enact

    def slot(p):
        s = start + p
        return b * capacity + (s - capacity if s >= capacity else s)

    def src_of(p):  # (buffer, element offset)
        if kind == 'mamba2' and p == h0:
            return ('in.v', (b * H + head0) * dv)
        return ('rec', (slot(p) * H + head0) * dv)

    per_position = run // piece
    written = {}
    for t in range(K_THREADS):
        for i in range(t, staged * per_position, K_THREADS):
            p = small_div(i, per_position) if per_position <= 1024 else i // per_position
            pc = i - p * per_position
            buf, off = src_of(p)
            for e in range(piece):
                d = p * run + pc * piece + e
                assert d not in written, 'written twice'
                written[d] = (buf, off + pc * piece + e)
                # 16-byte alignment of both ends, in elements
                assert (p * run + pc * piece) % piece == 0 and (off + pc * piece) % piece == 0
    # expected: vals[p][n dv + r] = value (n, r) at position p
    for p in range(staged):
        buf, off = src_of(p)
        for n in range(NH):
            for r in range(dv):
                assert written.pop(p * run + n * dv + r) == (buf, off + n * dv + r)
    assert not written
    # the non-flush fold: row idx (head n = idx // dv, row r) reads vals[p * run + idx], i.e. head n's row r
    for idx in range(run):
        n, r = small_div(idx, dv), idx - small_div(idx, dv) * dv
        assert n == idx // dv and 0 <= r < dv
    # the streamed flush's coefficient of record p for row `row` of head n reads vals[(p NH + n) dv + row]
    for p in range(staged):
        for n in range(NH):
            for row in range(dv):
                assert (p * NH + n) * dv + row == p * run + n * dv + row
    return True


rng = random.Random(20261204)
checked = fallback = 0
shapes = [(128, 8, 64), (64, 8, 80), (16, 1, 128), (32, 16, 128), (16, 1, 64), (6, 2, 37), (12, 1, 80), (4, 2, 128)]
for (H, G, dv), kind in itertools.product(shapes, ['mamba2', 'gdn']):
    hpg = H // G
    for NH in [n for n in range(1, hpg + 1) if hpg % n == 0]:
        for _ in range(6):
            L = rng.choice([4, 8, 16, 32, 64])
            capacity = L + rng.choice([0, 0, 8])
            start, h0 = rng.randrange(capacity), rng.randrange(L - 1)
            head0 = NH * rng.randrange(H // NH)
            r = staging_ok(kind, 3, H, G, dv, NH, capacity, start, h0, head0, rng.randrange(3))
            checked += r is True
            fallback += r is None
print(f'staging and fold maps: {checked} configurations checked, {fallback} take the element-wise fallback')
