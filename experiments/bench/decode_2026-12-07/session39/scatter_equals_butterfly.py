#!/usr/bin/env python3
"""H10's claim, checked by simulation: reducing a warp's N partial sums together (state_tiles.cuh's row_sum_scatter)
gives each row sum the same float32 as reducing each by its own butterfly (row_sum), for every lane count per row
(LPR) and N the KDA read instantiates. 32 lanes are simulated with numpy float32; __shfl_xor_sync(v, off) is
v[lane ^ off]; the scatter's steps, kept halves and final lane of each value follow scatter_steps, scatter_index.
Fresh random partial sums (mixed signs and magnitudes, so rounding differs between orders) for every trial; seed printed.

    python3 scatter_equals_butterfly.py [--trials 2000] [--seed 20261208]"""
import argparse

import numpy as np


def butterfly(x, lpr):  # x: [32] float32 -> the row sum in every lane
    x = x.copy()
    off = lpr // 2
    while off > 0:
        x = (x + x[np.arange(32) ^ off]).astype(np.float32)
        off //= 2
    return x


def scatter(vals, lpr):  # vals: [32, N] float32 -> [32] (each lane's one value) as scatter_steps computes it
    buf = vals.copy()
    lanes = np.arange(32)
    n, off = buf.shape[1], lpr // 2
    while n > 1:
        h = n // 2
        upper = (lanes & off) != 0
        new = np.empty((32, h), np.float32)
        for i in range(h):
            send = np.where(upper, buf[:, i], buf[:, i + h])
            keep = np.where(upper, buf[:, i + h], buf[:, i])
            new[:, i] = (keep + send[lanes ^ off]).astype(np.float32)
        buf, n, off = new, h, off // 2
    x = buf[:, 0]
    while off > 0:
        x = (x + x[lanes ^ off]).astype(np.float32)
        off //= 2
    return x


def scatter_index(lane, lpr, n):
    i, off = 0, lpr // 2
    while n > 1:
        if lane & off:
            i += n // 2
        n, off = n // 2, off // 2
    return i


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=20261208)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    print(f"seed {a.seed}, {a.trials} trials per case")
    # KDA's read: kBatch 4 (2 for NVFP4), 2 sums a row iteration; LPR = dk / elements per piece, capped at 32.
    for lpr, n in ((32, 8), (16, 8), (8, 8), (4, 4), (16, 4), (8, 4)):
        differing = 0
        for _ in range(a.trials):
            vals = (rng.standard_normal((32, n)) * 10.0 ** rng.integers(-3, 4, (32, n))).astype(np.float32)
            got = scatter(vals, lpr)
            for lane in range(32):
                if lane % (lpr // n):
                    continue  # the lanes the kernel stores from
                i = scatter_index(lane, lpr, n)
                want = butterfly(vals[:, i], lpr)[lane]
                differing += got[lane].tobytes() != want.tobytes()
        print(f"LPR {lpr:2d}, N {n}: {differing} row sums differ from the butterfly's")
        assert differing == 0


if __name__ == "__main__":
    main()
