"""Re-enacts, on the CPU, the fragment map proposed for a tensor-core flush fold (README.md beside this
file): one warp folds 8 records into 8 state rows x 128 columns with eight m16n8k8 TF32 products per
record chunk, computed as D' = K^T C^T (M = 16 columns, N = 8 rows, K = 8 records).

Fragment tables (PTX ISA, mma.m16n8k8 .tf32; the same as the GDN verification patch uses):
  A (16 x 8):  lane l holds A[l/4][l%4], A[l/4+8][l%4], A[l/4][l%4+4], A[l/4+8][l%4+4]
  B (8 x 8):   lane l holds B[l%4][l/4], B[l%4+4][l/4]
  C/D (16 x 8): lane l holds D[l/4][2(l%4)], D[l/4][2(l%4)+1], D[l/4+8][2(l%4)], D[l/4+8][2(l%4)+1]
M index i of m-tile m is state column col(m, i) = 16 (i % 8) + 2 m + i // 8, so lane l's D entries over
the eight m-tiles are state rows 2(l%4), 2(l%4)+1 and the 16 consecutive columns 16(l/4) ... 16(l/4)+15.
Checks: that claim, and that the per-lane products summed per fragment equal (C K)[row][col] in float64.
Usage: python3 check_flush_mma_map.py   (exit 0 when every check holds)
"""
import numpy as np

rng = np.random.default_rng(20261204)
R, ROWS, COLS = 8, 8, 128  # records per chunk, rows of the warp, state columns (dk)
keys = rng.standard_normal((R, COLS))      # K[r][col]
coef = rng.standard_normal((R, ROWS))      # C^T: coef[r][row] = w_r v_r[row]
want = coef.T @ keys                       # update U[row][col] = sum_r coef[r][row] keys[r][col]


def col(m, i):
    return 16 * (i % 8) + 2 * m + i // 8


held = {}  # (lane) -> {(row, col): value}
for lane in range(32):
    g, t = lane // 4, lane % 4
    out = {}
    for m in range(COLS // 16):
        # A fragment (A[i][k] = keys[k][col(m, i)]) and B fragment (B[k][n] = coef[k][n]) of this lane;
        # an mma gives D[i][n] = sum_k A[i][k] B[k][n], which needs the whole warp's fragments: rebuild
        # the full tiles from every lane's registers, as the hardware does, then read this lane's D.
        A = np.zeros((16, 8)); B = np.zeros((8, 8))
        for l2 in range(32):
            g2, t2 = l2 // 4, l2 % 4
            for (i, k) in ((g2, t2), (g2 + 8, t2), (g2, t2 + 4), (g2 + 8, t2 + 4)):
                A[i][k] = keys[k][col(m, i)]
            for k in (t2, t2 + 4):
                B[k][g2] = coef[k][g2]
        D = A @ B
        for (i, n) in ((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)):
            out[(n, col(m, i))] = D[i][n]
    held[lane] = out

ok = True
for lane, out in held.items():
    g, t = lane // 4, lane % 4
    rows = {r for r, _ in out}; cols = sorted({c for _, c in out})
    ok &= rows == {2 * t, 2 * t + 1} and cols == list(range(16 * g, 16 * g + 16))
    ok &= all(abs(v - want[r][c]) <= 1e-12 * (1 + abs(want[r][c])) for (r, c), v in out.items())
covered = {rc for out in held.values() for rc in out}
ok &= covered == {(r, c) for r in range(ROWS) for c in range(COLS)}
print("lane l holds rows 2(l%4), 2(l%4)+1 and columns 16(l/4) .. 16(l/4)+15; values equal C^T K:", ok)
raise SystemExit(0 if ok else 1)
