# tests/gpu/emulate.py — CPU-side checks of the CUDA backend's index arithmetic, without a GPU:
# the tiling of the flash-style attention kernels (kernels/cuda/attn.cu: attn_fwd_kernel,
# attn_dq_kernel, attn_dkv_kernel, lanes and warps written as loops, causal bounds, dropout keep
# factors, S not a multiple of the tile) against dense attention, and the row-major -> column-major
# operand mapping of cuda_gemm (kernels/cuda/gemm.cu) and the indexing of its tiled fallback kernel
# (gemm_fallback_kernel) for every transpose and padded strides, and the chunked column sums of
# bias_grad / layernorm_bwd (colsum_partial_kernel, blocks striding over more chunks than
# gridDim.y).
# Run: python3 tests/gpu/emulate.py (needs numpy); make cuda-check runs it where numpy is present.
import sys

import numpy as np

fails = 0


def check(name, err, tol=1e-12):
    global fails
    ok = err < tol
    fails += not ok
    print(("ok " if ok else "FAIL ") + f"{name}: max abs error {err:.3g}")


def attention(S, D, p, TILE=32, WARPS=8, seed=0):
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(D)
    Q, K, V, dO = (rng.standard_normal((S, D)) for _ in range(4))
    keepm = (rng.random((S, S)) >= p) / (1 - p)
    mask = np.tril(np.ones((S, S), bool))
    Sm = np.where(mask, scale * Q @ K.T, -np.inf)
    L = Sm.max(1) + np.log(np.exp(Sm - Sm.max(1)[:, None]).sum(1))
    P = np.exp(Sm - L[:, None])
    O = (P * keepm) @ V
    Dr = (dO * O).sum(1)
    dS = P * ((dO @ V.T) * keepm - Dr[:, None]) * mask
    dQ, dK, dV = scale * dS @ K, scale * dS.T @ Q, (P * keepm).T @ dO
    Oe, Le = np.zeros((S, D)), np.zeros(S)
    for i0 in range(0, S, WARPS):  # attn_fwd_kernel: block of WARPS query rows, key tiles of TILE
        last = min(i0 + WARPS - 1, S - 1)
        for i in range(i0, min(i0 + WARPS, S)):
            q, o, m, l = Q[i] * scale, np.zeros(D), -np.inf, 0.0
            for j0 in range(0, last + 1, TILE):
                if j0 > i:
                    continue
                js = np.arange(j0, j0 + TILE)
                s = np.array([q @ K[j] if j <= i else -np.inf for j in js])
                mn = max(m, s.max())
                pe = np.where(js <= i, np.exp(s - mn), 0.0)
                corr = np.exp(m - mn)
                l = l * corr + pe.sum()
                pw = np.array([pe[t] * (keepm[i, j] if j <= i else 0.0) for t, j in enumerate(js)])
                nk = min(i - j0 + 1, TILE)
                o = o * corr + sum(pw[t] * V[j0 + t] for t in range(nk))
                m = mn
            Oe[i], Le[i] = o / l, m + np.log(l)
    Dre = (dO * Oe).sum(1)
    dQe = np.zeros((S, D))
    for i0 in range(0, S, WARPS):  # attn_dq_kernel
        last = min(i0 + WARPS - 1, S - 1)
        for i in range(i0, min(i0 + WARPS, S)):
            acc = np.zeros(D)
            for j0 in range(0, last + 1, TILE):
                if j0 > i:
                    continue
                ds = np.zeros(TILE)
                for t in range(TILE):
                    j = j0 + t
                    if j <= i:
                        Pij = np.exp(scale * (Q[i] @ K[j]) - Le[i])
                        ds[t] = Pij * ((dO[i] @ V[j]) * keepm[i, j] - Dre[i])
                acc += sum(ds[t] * K[j0 + t] for t in range(min(i - j0 + 1, TILE)))
            dQe[i] = scale * acc
    dKe, dVe = np.zeros((S, D)), np.zeros((S, D))
    for j0 in range(
        0, S, WARPS
    ):  # attn_dkv_kernel: block of WARPS key rows, query tiles from j0's tile
        for j in range(j0, min(j0 + WARPS, S)):
            dk, dv = np.zeros(D), np.zeros(D)
            for q0 in range(j0 // TILE * TILE, S, TILE):
                if q0 + TILE - 1 < j:
                    continue
                for t in range(TILE):
                    i = q0 + t
                    if j <= i < S:
                        Pij = np.exp(scale * (Q[i] @ K[j]) - Le[i])
                        dv += Pij * keepm[i, j] * dO[i]
                        dk += Pij * ((dO[i] @ V[j]) * keepm[i, j] - Dre[i]) * Q[i]
            dKe[j], dVe[j] = scale * dk, dv
    tag = f"attention S={S} D={D} p={p}"
    for name, got, want in (
        ("out", Oe, O),
        ("lse", Le, L),
        ("dQ", dQe, dQ),
        ("dK", dKe, dK),
        ("dV", dVe, dV),
    ):
        check(f"{tag} {name}", np.abs(got - want).max())


def gemm(m, n, k, seed=1):
    rng = np.random.default_rng(seed)

    def colmajor(buf, rows, cols, ld):  # cuBLASLt's view of a buffer
        return np.array([[buf[c * ld + r] for c in range(cols)] for r in range(rows)])

    for ta in (0, 1):
        for tb in (0, 1):
            lda, ldb, ldc = (m if ta else k) + 2, (k if tb else n) + 1, n + 3
            a_rows, b_rows = (k if ta else m), (n if tb else k)
            A, B = rng.standard_normal(a_rows * lda), rng.standard_normal(b_rows * ldb)
            Am, Bm = (
                A.reshape(a_rows, lda)[:, : (m if ta else k)],
                B.reshape(b_rows, ldb)[:, : (k if tb else n)],
            )
            want = (Am.T if ta else Am) @ (Bm.T if tb else Bm)
            F = colmajor(
                B, k if tb else n, n if tb else k, ldb
            )  # first operand: B's storage, op tb
            G = colmajor(
                A, m if ta else k, k if ta else m, lda
            )  # second operand: A's storage, op ta
            Dp = (F.T if tb else F) @ (G.T if ta else G)  # [n, m], column-major, ld ldc
            C = np.zeros(m * ldc)
            for r in range(n):
                for c in range(m):
                    C[c * ldc + r] = Dp[r, c]
            check(
                f"gemm operand mapping ta={ta} tb={tb}",
                np.abs(C.reshape(m, ldc)[:, :n] - want).max(),
            )


def gemm_fallback(m, n, k, T=16, seed=2):
    rng = np.random.default_rng(seed)
    for ta in (0, 1):
        for tb in (0, 1):
            lda, ldb, ldc = (m if ta else k) + 1, (k if tb else n) + 2, n + 1
            a = rng.standard_normal((k if ta else m) * lda)
            b = rng.standard_normal((n if tb else k) * ldb)
            c0 = rng.standard_normal(m * ldc)
            Am = a.reshape(-1, lda)[:, : (m if ta else k)]
            Bm = b.reshape(-1, ldb)[:, : (k if tb else n)]
            alpha, beta = 0.7, 0.5
            want = c0.reshape(m, ldc).copy()
            want[:, :n] = alpha * (Am.T if ta else Am) @ (Bm.T if tb else Bm) + beta * want[:, :n]
            c = c0.copy()
            for by in range(-(-m // T)):
                for bx in range(-(-n // T)):
                    acc = np.zeros((T, T))
                    for k0 in range(0, k, T):
                        As, Bs = np.zeros((T, T)), np.zeros((T, T))
                        for ty in range(T):
                            for tx in range(T):
                                ar, ak = by * T + ty, k0 + tx
                                if ar < m and ak < k:
                                    As[ty, tx] = a[ak * lda + ar] if ta else a[ar * lda + ak]
                                bk, bc = k0 + ty, bx * T + tx
                                if bk < k and bc < n:
                                    Bs[ty, tx] = b[bc * ldb + bk] if tb else b[bk * ldb + bc]
                        acc += As @ Bs
                    for ty in range(T):
                        for tx in range(T):
                            row, col = by * T + ty, bx * T + tx
                            if row < m and col < n:
                                c[row * ldc + col] = alpha * acc[ty, tx] + beta * c[row * ldc + col]
            check(f"gemm fallback kernel ta={ta} tb={tb}", np.abs(c.reshape(m, ldc) - want).max())


def colsum(rows, cols, grid_y, ROWS=256, seed=3):
    """colsum_partial_kernel (kernels/cuda/common.cuh): grid (ceil(cols / 32), grid_y),
    block (32, 8); block y strides over the row chunks, thread (x, y) sums rows r0 + y,
    r0 + y + 8, ... of its chunk, the 8 sums are added in y order; the final kernel adds the
    chunks in order."""
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal((rows, cols))
    chunks = -(-rows // ROWS)
    part = np.full((chunks, cols), np.nan)
    for bx in range(-(-cols // 32)):
        for by in range(grid_y):
            for c in range(by, chunks, grid_y):
                r0, r1 = c * ROWS, min(c * ROWS + ROWS, rows)
                for tx in range(32):
                    j = bx * 32 + tx
                    if j < cols:
                        part[c, j] = sum(dy[r0 + ty : r1 : 8, j].sum() for ty in range(8))
    got = part.sum(0) if chunks else np.zeros(cols)
    check(
        f"column sums rows={rows} cols={cols} grid_y={grid_y}", np.abs(got - dy.sum(0)).max(), 1e-9
    )


attention(45, 40, 0.2)
attention(70, 16, 0.0)
attention(9, 64, 0.1)
gemm(5, 7, 3)
gemm_fallback(19, 35, 21)
colsum(1100, 70, 5)  # 5 chunks, every block of the grid's y dimension covering one
colsum(
    1100, 70, 2
)  # fewer blocks than chunks (the 65535 cap scaled down): blocks stride over chunks
colsum(0, 33, 1)
print(f"{fails} failed")
sys.exit(1 if fails else 0)
