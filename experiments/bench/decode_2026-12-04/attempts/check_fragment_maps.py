"""The lane-to-matrix maps of the two tensor-core verification patches, checked on the CPU: each warp lane's
registers are placed by the PTX ISA's m16n8k8 .tf32 fragment tables (A: rows l/4, l/4+8 x k slots l%4, l%4+4;
B: k slots l%4, l%4+4 of column l/4; D: rows l/4, l/4+8 x columns 2(l%4), 2(l%4)+1), the products are
taken in float64, and the results must equal S q_s (stream) and the rank-h fold U = C K (fold) at the
columns the patches write them to. It checks the index maps, not the hardware: test_decode_cuda does that.
Run: python3 experiments/bench/decode_2026-12-04/attempts/check_fragment_maps.py"""
import numpy as np
rng = np.random.default_rng(1)
DK, TD, h = 128, 8, 13
S = rng.standard_normal((16, DK))           # one 16-row group
Q = rng.standard_normal((8, DK)); Q[TD:] = 0  # drafts (B columns), zero past TD
C = rng.standard_normal((16, h))              # fold coefficients c_p[row]
Kk = rng.standard_normal((h, DK))             # keys
def mma(D, a, b):  # a[lane][4], b[lane][2]; D[lane][4]; PTX layouts for m16n8k8 tf32
    A = np.zeros((16, 8)); B = np.zeros((8, 8))
    for l in range(32):
        g, t = l // 4, l % 4
        A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = a[l]
        B[t, g], B[t + 4, g] = b[l]
    P = A @ B
    for l in range(32):
        g, t = l // 4, l % 4
        D[l] += [P[g, 2 * t], P[g, 2 * t + 1], P[g + 8, 2 * t], P[g + 8, 2 * t + 1]]
# stream: lane's a[8] = S[g][32c+8t..], b[8] = S[g+8][...]; step i: a regs {a[2i], b[2i], a[2i+1], b[2i+1]}
d = np.zeros((32, 4)); u = np.zeros((4, 32, 4))
for c in range(DK // 32):
    av = [S[l // 4, 32 * c + 8 * (l % 4): 32 * c + 8 * (l % 4) + 8] for l in range(32)]
    bv = [S[l // 4 + 8, 32 * c + 8 * (l % 4): 32 * c + 8 * (l % 4) + 8] for l in range(32)]
    for i in range(4):
        a = [[av[l][2 * i], bv[l][2 * i], av[l][2 * i + 1], bv[l][2 * i + 1]] for l in range(32)]
        b = [[Q[l // 4, 32 * c + 8 * (l % 4) + 2 * i], Q[l // 4, 32 * c + 8 * (l % 4) + 2 * i + 1]] for l in range(32)]
        mma(d, a, b)
ref = S @ Q.T   # [16 rows][8 drafts]
err = 0
for l in range(32):
    g, t = l // 4, l % 4
    for q in range(4):
        s = 2 * t + (q & 1); row = g if q < 2 else g + 8
        err = max(err, abs(d[l, q] - ref[row, s]))
print("stream max err", err)
# fold: U[row][col] = sum_p C[row][p] K[p][col]; per chunk c, tile m: D col n <-> 32c + 8(n//2) + 2m + n%2
U = C @ Kk
err = 0
for c in range(DK // 32):
    u = np.zeros((4, 32, 4))
    for p0 in range(0, h, 8):
        a = []
        for l in range(32):
            g, t = l // 4, l % 4
            cv = []
            for r in range(4):
                p = p0 + t + 4 * (r // 2); row = g + 8 * (r % 2)
                cv.append(C[row, p] if p < h else 0.0)
            a.append(cv)
        for m in range(4):
            b = []
            for l in range(32):
                g, t = l // 4, l % 4
                colg = 32 * c + 8 * (g // 2) + g % 2 + 2 * m
                b.append([Kk[p0 + t, colg] if p0 + t < h else 0.0, Kk[p0 + t + 4, colg] if p0 + t + 4 < h else 0.0])
            mma(u[m], a, b)
    for l in range(32):
        g, t = l // 4, l % 4
        for m in range(4):
            # lane's a[2m], a[2m+1] <-> columns 32c + 8t + 2m (+1) of row g; b[.] row g+8
            for e, (row, q) in enumerate([(g, 0), (g, 1), (g + 8, 2), (g + 8, 3)]):
                col = 32 * c + 8 * t + 2 * m + (q & 1)
                err = max(err, abs(u[m][l][q] - U[row, col]))
print("fold max err", err)
