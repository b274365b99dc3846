# Checks the fragment bookkeeping of the tensor-core NVFP4 read (cuda/ssm/mma_read.cuh) before a device run: an
# emulation of one warp's m16n8k16 products, with the register layout of the PTX ISA ("Matrix Fragments for
# mma.m16n8k16", f16 A/B, fp32 D), for main's shared-column layout and the lane-column layout of
# nvfp4_lane_columns.patch. Each lane's A pairs come from its own 32-element piece of rows g and g + 8 (the
# pair order of e2m1x8_to_half2_scaled), B from build_mma_b_table's rule; the row sums the kernel would write
# are compared with float64 dot products of the decoded rows with q (and k). It checks which element meets
# which, not the hardware's rounding: products and sums here are float64.
# Usage: python3 emulate_mma_layouts.py [--cases N] [--seed S]
import argparse

import numpy as np

E = 32  # NVFP4 elements per piece (16 bytes); dk = 128 = 4 lanes x E
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def piece_element(pair, half):  # mma_read.cuh
    return 8 * (pair // 4) + (pair % 2) + 4 * ((pair % 4) // 2) + 2 * half


def mma(d, a, b):
    """d (32 lanes x 4) += A B, with a[lane] = 4 registers of 2 values, b[lane] = 2 registers of 2 values."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        (a0, a1, a2, a3), (b0, b1) = a[lane], b[lane]
        A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = a0, a1
        A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = a2, a3
        B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = b0, b1
    D = A @ B
    for lane in range(32):
        g, t = lane // 4, lane % 4
        d[lane] += [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]


def split_hi_lo(x):
    hi = x.astype(np.float16).astype(np.float64)
    return hi, (x - hi).astype(np.float16).astype(np.float64)


def one_tile(rng, lane_columns, gdn):
    codes = rng.integers(0, 16, size=(16, 4 * E))  # a 16-row tile, dk = 128
    scales = 2.0 ** rng.integers(-6, 5, size=(16, 4 * E // 16)) * rng.integers(1, 8, size=(16, 4 * E // 16))
    value = np.where(codes >= 8, -1, 1) * E2M1[codes % 8]  # e2m1, sign in bit 3
    state = value * np.repeat(scales, 16, axis=1)
    q = rng.standard_normal(4 * E); k = rng.standard_normal(4 * E)
    vectors = [q, k] if gdn else [q]
    s = [14 - int(np.floor(np.log2(np.max(np.abs(v))))) for v in vectors]  # mma_vector_exponent
    # B registers per lane: table[lane][P], P = 0..15 pairs of the lane's piece columns t * E + piece_element.
    table = np.zeros((32, 16, 2))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        if lane_columns:
            vi = 0 if g // 2 == t else None
        else:
            vi = 0 if g < 2 else 1 if (g < 4 and gdn) else None
        if vi is None:
            continue
        for P in range(16):
            x = np.array([vectors[vi][t * E + piece_element(P, h)] for h in (0, 1)]) * 2.0 ** s[vi]
            hi, lo = split_hi_lo(x)
            table[lane, P] = hi if g % 2 == 0 else lo
    out = [np.zeros(16) for _ in vectors]
    if lane_columns:
        db = [np.zeros((32, 4)), np.zeros((32, 4))]
    else:
        d = np.zeros((32, 4))
    for m in range(E // 4):
        a, b = [], []
        for lane in range(32):
            g, t = lane // 4, lane % 4
            regs = []
            for row in (g, g + 8):
                pairs = []
                for p in (2 * m, 2 * m + 1):
                    cols = [t * E + piece_element(p, h) for h in (0, 1)]
                    pairs.append(value[row, cols] if lane_columns else state[row, cols])
                regs.append(pairs)
            a.append((regs[0][0], regs[1][0], regs[0][1], regs[1][1]))  # ag[2m], ag8[2m], ag[2m+1], ag8[2m+1]
            b.append((table[lane, 2 * m], table[lane, 2 * m + 1]))
        mma(db[m // (E // 8)] if lane_columns else d, a, b)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        if lane_columns:
            # The lane's own block sums times its pieces' block scales, then the 4 lanes of the row group.
            blk = [t * E // 16, t * E // 16 + 1]
            yg = sum((db[i][lane, 0] + db[i][lane, 1]) * scales[g, blk[i]] for i in (0, 1))
            yg8 = sum((db[i][lane, 2] + db[i][lane, 3]) * scales[g + 8, blk[i]] for i in (0, 1))
            out[0][g] += yg * 2.0 ** -s[0]
            out[0][g + 8] += yg8 * 2.0 ** -s[0]
        elif t < len(vectors):
            out[t][g] = (d[lane, 0] + d[lane, 1]) * 2.0 ** -s[t]
            out[t][g + 8] = (d[lane, 2] + d[lane, 3]) * 2.0 ** -s[t]
    worst = 0.0
    for v, o in zip(vectors, out):
        ref = state @ v
        worst = max(worst, float(np.max(np.abs(o - ref) / (np.abs(state) @ np.abs(v) + 1e-300))))
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--seed", type=int, default=19)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    ok = True
    for name, lane_columns, gdn in (("shared columns, Mamba-2", False, False), ("shared columns, GDN", False, True),
                                    ("lane columns, Mamba-2", True, False)):
        worst = max(one_tile(rng, lane_columns, gdn) for _ in range(args.cases))
        # hi + lo carry each vector element to 2^-22 of itself or better; anything misplaced is O(1).
        good = worst < 1e-6
        ok &= good
        print(f"{name:26s} {args.cases} tiles: max |emulated - float64| / sum|terms| = {worst:.2e} {'ok' if good else 'WRONG'}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
