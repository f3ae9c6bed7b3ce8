/* kernels/cuda/flash.cuh — causal attention on tensor cores: FlashAttention-2 (Dao, 2023) with
 * bf16 storage, f32 accumulation and mma.sync m16n8k16 (sm_80 and later), head dims 64 and 128.
 * Included by attn.cu, which keeps the generic kernels for f32 and other head dims.
 *
 * Layouts (the op's contract, tpk/base/ops.h): qkv [B, S, Al + 2 Gl, D] (grouped-query: A query
 * heads over G key/value heads; the local query head h reads local key/value head kv(h) =
 * (head0 + h) / (A / G) - g0, g0 = head0 / (A / G); Q of h at column block h, K and V of kv at
 * Al + kv and Al + Gl + kv; G = A: Gl = Al, kv(h) = h), out [B, S, Al, D], lse [B, Al, S] =
 * natural log of sum_j exp(scale q_i . k_j), dqkv like qkv, Dr [B, Al, S] = rowsum(dO * O).
 * tpk__fl_heads gives Gl, g0 and the group size.
 *
 * Forward (tpk__flash_fwd): a block of 4 warps owns 64 MT query rows of one (b, h) (MT = 2 at D =
 * 64, 1 at D = 128: tpk__fl_fwd_mt), warp w the rows 16 MT w .. 16 MT w + 16 MT - 1. Key/value
 * tiles of 64 rows are staged through shared memory (cp.async, two buffers), each serving the 4
 * warps; per tile, in registers:
 *   S = Q K^T (16 MT x 64)        m' = max(m, rowmax S)           P = 2^(scale log2(e) S - scale
 *   log2(e) m')
 *   l' = l 2^(scale log2(e) (m - m')) + rowsum P                   O' = O 2^(scale log2(e) (m -
 *   m')) + (P keep) V
 * and at the end O / l and lse = scale m + ln l. The key tiles below the block's first row run a
 * mask-free step; the one or two the diagonal (or S) crosses a masked one (selects, no branch),
 * tiles above a warp's rows skipped. At D = 128 Q's A fragments stay in registers (its tile staged
 * in a key buffer), at D = 64 Q stays in shared memory ([128][72]).
 * Backward (after Dr):
 *   tpk__flash_dkv: a block of 4 warps owns 64 keys (16 per warp) of one key/value head and
 *     streams the 64-query tiles at or after them, of every local query head that reads that head
 *     in turn (one pipeline over (head, tile)), so a shared head's dK, dV sum over its query heads
 *     in registers (every warp's keys meet queries at or after them in every tile from k0 on):
 *     P^T = 2^(scale log2(e) K Q^T - lse log2(e)), dP^T = V dO^T, dS^T = P^T (dP^T keep - Dr),
 *     dV += (P^T keep) dO,  dK += scale dS^T Q
 *     The row terms lse log2(e) and Dr of a tile's queries are staged beside it, interleaved so a
 *     lane reads its 2 queries' 4 values of an 8-query tile in one 16-byte load; P^T keep and dS^T
 *     are rounded to bf16 A fragments as they are made. Per query head the diagonal's tile is a
 *     masked step (selects), the rest mask-free (rows past S are staged as zeros and add 0).
 *     At D = 64 a tile runs in 4 chunks of 16 queries (P needs no running max): a chunk's Q and dO
 *     B fragments (k along D) are read from shared memory once (ldmatrix), serve S^T and dP^T, and
 *     are transposed in registers (movmatrix.trans, tpk__fl_movt) into the B fragments of dK and
 *     dV's products (k along the queries); the warp's K, V A fragments stay in registers for the
 *     whole kernel. At D = 128 (dK, dV take 128 registers a thread) a tile's steps are whole: S^T
 *     and dP^T of its 64 queries, then dV and dK with Q, dO read again (ldmatrix.trans).
 *   and dQ, by default, in the same pass (DQ, as FlashAttention-2): each warp writes its dS^T to
 *     shared memory as it holds it, dS^T [64 keys][64 queries] (a 32-bit store per pair), and after
 *     a barrier warp w adds dS [32 queries 32 (w % 2) .., 64 keys] K [64 keys, D / 2 columns from
 *     (D / 2) (w / 2)] (dS's A fragments by ldmatrix.trans from dS^T) into dq_acc [B, S, Al, D]
 *     (f32, zeroed) with atomic adds (two floats per reduction on sm_90); a last pass writes
 *     dQ = scale dq_acc as bf16.
 *     Five GEMMs in all, but the order of the atomic adds varies from run to run.
 *   tpk__flash_dq (tpk_ctx.deterministic): a block owns 64 queries and streams the key tiles at or
 *     before them, recomputing P and dP:  dQ += scale dS K  in f32 registers, every output written
 *     once — deterministic, bit for bit, for the price of recomputing two GEMMs (7 instead of 5).
 *     The warp's Q, dO A fragments stay in registers; a key tile runs in 4 chunks of 16 keys, each
 *     chunk's K fragments read from shared memory once (K^T, for S) and transposed in registers
 *     (movmatrix) into dQ += dS K's B operand.
 * Dropout (DROP, p > 0): keep_ij from the counter RNG at index ((b A + head0 + h) S + i) S + j, as
 * every backend (tpk/base/rng.h: index x takes output x % 4 of Philox call x / 4); the kernels
 * without it carry no RNG. Where S % 4 = 0 every call covers 4 keys of one row, which 2 lanes
 * (row-major fragments: forward, dQ) or 4 lanes (the transposed fragment: dK, dV) hold: each of
 * those lanes draws one call per 4 elements and they trade outputs by shuffles (tpk__fl_drop_rows,
 * tpk__fl_drop_cols); other S draw each element alone.
 * Exponentials are ex2.approx.ftz (tpk__ex2 of common.cuh, which this file follows): one MUFU.EX2,
 * results under 2^-126 flushed to 0 (exp2f's denormal fix-up would cost three more an element).
 * Copies: each thread's 64-bit source address and shared offset are formed once (tpk__fl_copy), a
 * 16-byte piece is then a pointer step, a compare and the cp.async, in a fixed trip count.
 * Resources (ptxas of nvcc 13.0; bench/RESULTS.md gives the figures per kernel and arch): every
 * kernel is __launch_bounds__(128, 2) — 4 warps, at most 255 registers, two blocks per SM on sm_80
 * and sm_90 — and takes at most 78 KB of shared memory (tpk__flash_smem): D = 128 single-buffers
 * the dK/dV kernel's Q, dO and the dQ kernel's K, V tiles so two blocks fit an A100's 164 KB. The
 * per-element work inside a tile is 32-bit (the masks as distances in the tile's coordinates; the
 * dropout index of a row or column formed once per tile plus constants; the head mapping in
 * unsigned 32-bit, tpk__fl_heads). None of this has run on a GPU.
 *
 * Fragments (PTX ISA, mma.m16n8k16 with .bf16 inputs): lane = 4 g + t, g = lane / 4, t = lane % 4;
 * a register holds two bf16, the lower index in the low half.
 *   A 16x16 (row-major):  a0 (g, 2t..2t+1)  a1 (g+8, 2t..2t+1)  a2 (g, 2t+8..2t+9)  a3 (g+8,
 *   2t+8..2t+9)
 *   B 16x8 (k x n):       b0 (k = 2t..2t+1, n = g)  b1 (k = 2t+8..2t+9, n = g)
 *   C/D 16x8 (f32):       c0, c1 (g, 2t..2t+1)  c2, c3 (g+8, 2t..2t+1)
 * so the C fragments of two neighbouring 8-column tiles, packed to bf16, are the A fragment of
 * their 16 columns: P and dS go from one GEMM into the next without leaving registers.
 * Fragments are read from shared memory by ldmatrix.x4 (an A fragment, or the B fragments of two
 * 8-column tiles; .trans where the tile holds B as [k][n]: V, dO, Q, K in the P V-shaped products),
 * one instruction where 32-bit loads took four to eight. Shared tiles are [64][D + 8] bf16: rows 16
 * bytes apart beyond D, so the eight rows of each ldmatrix phase fall on 32 distinct banks.
 *
 * With TPK_FLASH_EMU defined the file compiles as host C++ against the CUDA emulation
 * (tests/gpu/emu/tpk_emu.h), which runs each thread of a block as a fiber and emulates mma.sync,
 * ldmatrix, the shuffles and cp.async from the PTX ISA's definitions: tests/gpu/ops.c checks the
 * kernels against the host backend without a GPU. */
#ifndef TPK_CUDA_FLASH_CUH
#define TPK_CUDA_FLASH_CUH

#include <math.h>
#include <stdint.h>

#include <type_traits>

#include <tpk/base/rng.h>

#include "common.cuh" /* tpk__ex2, TPK__LOG2E */

#ifndef TPK_FLASH_EMU
#define TPK__FL_SMEM(T, name)                                         \
    extern __shared__ __align__(16) unsigned char tpk__fl_smem_raw[]; \
    T *name = reinterpret_cast<T *>(tpk__fl_smem_raw)
#define TPK__FL_UNROLL _Pragma("unroll")
#define TPK__FL_PRAGMA(x) _Pragma(#x)
#define TPK__FL_UNROLL_N(n) TPK__FL_PRAGMA(unroll(n)) /* unrolled n times (n a constant
                                                         expression) */

/* D (16x8 f32) += A (16x16 bf16) B (16x8 bf16) over the warp */
__device__ __forceinline__ void tpk__fl_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    (void)d, (void)a, (void)b; /* never launched below sm_80 (tpk__flash_usable) */
#endif
}
/* two floats -> bf16x2, round to nearest even, lo in the low half */
__device__ __forceinline__ uint32_t tpk__fl_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ float tpk__fl_shfl_xor(float v, int m) {
    return __shfl_xor_sync(0xffffffffu, v, m);
}
/* 16 bytes global -> shared without passing through registers (cp.async, sm_80); zeros when
 * !valid */
__device__ __forceinline__ void tpk__fl_cp16(void *dst, const void *src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0));
#else
    (void)dst, (void)src, (void)valid;
#endif
}
/* close the group of copies issued so far / wait until every group of this thread has landed */
__device__ __forceinline__ void tpk__fl_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
__device__ __forceinline__ void tpk__fl_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}
/* ldmatrix.x4 (sm_75+): lane l gives the address of row l % 8 of the 8x8 bf16 matrix l / 8 (16
 * bytes, 16-byte aligned); r[i] gets this lane's pair of matrix i: (row g, columns 2t, 2t+1), or
 * with TRANS (rows 2t, 2t+1, column g) — one instruction for four fragment registers */
template <bool TRANS>
__device__ __forceinline__ void tpk__fl_ldsm4(uint32_t r[4], const uint16_t *row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#else
    (void)row, r[0] = r[1] = r[2] = r[3] = 0;
#endif
}
/* movmatrix.m8n8.trans (sm_75+): the transpose of an 8x8 bf16 matrix held as a fragment (lane
 * 4 r + c / 2 holds (r, c), (r, c + 1)), in the same layout: lane 4 g + t gets (2 t, g), (2 t + 1,
 * g) — a B fragment loaded with k along one dimension becomes the one with k along the other */
__device__ __forceinline__ uint32_t tpk__fl_movt(uint32_t a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
    return d;
#else
    return a;
#endif
}
/* p[0] += a, p[1] += b in global memory, atomically (one 8-byte reduction on sm_90 where the
 * toolkit has the float2 atomicAdd — CUDA 12.8 and later here, to be safe —; p 8-byte aligned) */
#define TPK__FL_RED2_VEC \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 8))
__device__ __forceinline__ void tpk__fl_red2(float *p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && TPK__FL_RED2_VEC
    atomicAdd(reinterpret_cast<float2 *>(p), make_float2(a, b));
#else
    atomicAdd(p, a), atomicAdd(p + 1, b);
#endif
}
#else
#define TPK__FL_UNROLL_N(n) /* the emulation runs the loops as written */
#endif

enum {
    TPK__FL_ROWS = 64 /* query rows of a streamed tile; the dQ kernel's rows per block */,
    TPK__FL_KEYS = 64 /* keys per tile */
};

/* Warps per block: 4 in every kernel, so two blocks fit an SM's 65536 registers at up to 255 each
 * (__launch_bounds__(128, 2)). The dK/dV kernel's 4 warps own 16 keys each (dK, dV alone take
 * D registers a thread): 64 keys a block, each Q, dO tile brought from L2 serving 64 keys. The
 * forward's warps own 16 MT rows each (tpk__fl_fwd_mt): at D = 64 MT = 2, FlashAttention-2's
 * 128-row blocks of 4 warps, each K and V fragment a warp loads from shared memory serving two
 * 16-row blocks (half the shared-memory bytes per mma of MT = 1); at D = 128 MT = 1 (O alone takes
 * 64 registers a row block). */
static constexpr int tpk__fl_warps(int kernel /* 0 fwd, 1 dkv, 2 dq */) { return (void)kernel, 4; }
/* the dK/dV kernel's Q, dO buffers: 2 (the next tile lands while this one is used) at D = 64, 1 at
 * D = 128 (78 KB a block instead of 112: two blocks fit an A100's 164 KB) */
static constexpr int tpk__fl_dkv_nbuf(int D) { return D == 128 ? 1 : 2; }
/* the deterministic dQ kernel's K, V buffers: likewise (68 KB a block at D = 128 instead of 102) */
static constexpr int tpk__fl_dq_nbuf(int D) { return D == 128 ? 1 : 2; }
static constexpr int tpk__fl_fwd_mt(int D) { return D == 64 ? 2 : 1; }
/* query rows of a forward block */
static constexpr int tpk__fl_fwd_rows(int D) { return 16 * tpk__fl_fwd_mt(D) * tpk__fl_warps(0); }
/* whether the forward holds Q's fragments in registers (D = 128: 32 registers, and Q's tile staged
 * in a key buffer, so a block takes 4 tiles of shared memory, not 5: two blocks fit an A100's
 * SM) */
static constexpr bool tpk__fl_fwd_qreg(int D) { return D == 128; }

/* Shared memory of the kernels for head dim D, in bytes: the fixed tiles (Q [tpk__fl_fwd_rows]; K,
 * V [16 W]; Q, dO [64]) and two buffers of the streamed [64]-row ones (K, V; Q, dO, lse, Dr; K, V),
 * the next tile landing while the current one is used; the dK/dV kernel that also makes dQ adds the
 * tile's dS^T [16 W][64 + 8]. Rows of D + 8 bf16. */
static inline size_t tpk__flash_smem(int kernel /* 0 fwd, 1 dkv, 2 dq, 3 dkv with dQ */, int D) {
    size_t row = sizeof(uint16_t) * (size_t)(D + 8), tile = row * TPK__FL_ROWS;
    if (kernel == 0)
        return (tpk__fl_fwd_qreg(D) ? 0 : row * (size_t)tpk__fl_fwd_rows(D)) + 4 * tile;
    if (kernel == 2) return (2 + 2 * (size_t)tpk__fl_dq_nbuf(D)) * tile;
    size_t keys = 16 * (size_t)tpk__fl_warps(1), nbuf = (size_t)tpk__fl_dkv_nbuf(D);
    size_t dkv = 2 * row * keys + nbuf * (2 * tile + 2 * sizeof(float) * TPK__FL_ROWS);
    return kernel == 1 ? dkv : dkv + sizeof(uint16_t) * keys * (size_t)(TPK__FL_ROWS + 8);
}

/* whether the kernels' 32-bit indices hold for S rows of Al local query heads over Gl local
 * key/value heads of head dim D: S < 2^30 (tile coordinates) and 16 rows of qkv [.., Al + 2 Gl, D]
 * (and of dout) under 2^31 elements (copy strides) */
static inline bool tpk__flash_fits(int64_t S, int64_t Al, int64_t Gl, int64_t D) {
    return S < ((int64_t)1 << 30) && 16 * (Al + 2 * Gl) * D < ((int64_t)1 << 31);
}

/* keep factor of the element with dropout index `index` (p > 0): 0 or 1/(1-p); one Philox call for
 * this element alone (tpk_dropout_u: output index % 4 of call index / 4) */
__device__ __forceinline__ float tpk__att_keep_at(float p, uint64_t seed, uint64_t stream,
                                                  uint64_t index) {
    return tpk_dropout_u(seed, stream, index) >= p ? 1.0f / (1.0f - p) : 0.0f;
}
/* keep factor of a drawn uniform u (p > 0) */
__device__ __forceinline__ float tpk__att_keep_u(float p, float u) {
    return u >= p ? 1.0f / (1.0f - p) : 0.0f;
}
/* keep factor of P[i][j] of head (b, global head hg): index ((b A + hg) S + i) S + j; 1 without
 * dropout */
__device__ __forceinline__ float tpk__att_keep(float p, uint64_t seed, uint64_t stream, int64_t b,
                                               int64_t A, int64_t hg, int64_t S, int64_t i,
                                               int64_t j) {
    if (p <= 0.0f) return 1.0f;
    return tpk__att_keep_at(p, seed, stream, (uint64_t)((((b * A + hg) * S + i) * S) + j));
}

/* A thread's share of copying ROWS rows of a bf16 matrix (row stride ld) into a shared tile
 * [ROWS][D + 8] in 16-byte pieces (cp.async) by the block's NT threads: thread x takes column
 * 8 (x % (D / 8)) of rows x / (D / 8) + RSTEP k, k = 0 .. N - 1 (RSTEP = NT / (D / 8)). The 64-bit
 * source address and the shared offset are formed once, when the copy is placed (seek); each piece
 * is then a pointer step, a compare against the rows left and the cp.async (a fixed trip count: the
 * compiler cannot bound threadIdx.x, so a loop over it rebuilt every address). */
template <int D, int NT, int ROWS = TPK__FL_ROWS> struct tpk__fl_copy {
    static constexpr int CPR = D / 8 /* pieces per row */, RSTEP = NT / CPR, N = ROWS / RSTEP;
    static_assert(NT % CPR == 0 && ROWS % RSTEP == 0, "whole rows per pass, whole passes per tile");
    const uint16_t *src; /* this thread's first piece of the rows to copy */
    int step;            /* RSTEP rows of the source: 32-bit (tpk__flash_fits: 16 rows of qkv or
                            dout under 2^31 elements) */
    int row, soff;       /* this thread's first row in the tile; its first piece's offset there */
    __device__ __forceinline__ tpk__fl_copy() {
        int x = (int)threadIdx.x;
        row = x / CPR, soff = row * (D + 8) + (x % CPR) * 8;
    }
    /* place the copy at rows r0 .. r0 + ROWS - 1 of base (row stride ld) */
    __device__ __forceinline__ void seek(const uint16_t *base, int64_t ld, int64_t r0) {
        src = base + (r0 + row) * ld + (soff - row * (D + 8)), step = RSTEP * (int)ld;
    }
    /* start the copies into dst; rows from `rows` on (the rows before S) as zeros; then move on by
     * ROWS rows. TWO: the same rows of a second matrix at src + off into dst2 as well */
    template <bool TWO = false>
    __device__ __forceinline__ void run(uint16_t *dst, int rows, const uint16_t *base,
                                        uint16_t *dst2 = nullptr, int64_t off = 0) {
        const uint16_t *s = src;
        TPK__FL_UNROLL for (int k = 0; k < N; k++) {
            bool valid = row + RSTEP * k < rows;
            const uint16_t *p = valid ? s : base;
            tpk__fl_cp16(dst + soff + RSTEP * k * (D + 8), p, valid);
            if (TWO) tpk__fl_cp16(dst2 + soff + RSTEP * k * (D + 8), p + (valid ? off : 0), valid);
            s += step;
        }
        src = s;
    }
};

/* Key/value tiles streamed in order through NBUF buffers: tile it (rows 64 it .. 64 it + 63 of K
 * and of V = K + voff, row stride ld, rows >= S as zeros) into buffers it % NBUF of Kb, Vb
 * [NBUF][64][D + 8]. */
template <int D, int NT, int NBUF = 2> struct tpk__fl_kv_stream {
    tpk__fl_copy<D, NT> c;
    const uint16_t *K;
    int64_t voff;
    int rows; /* S less the next tile's first row (clamped) */
    __device__ __forceinline__ tpk__fl_kv_stream(const uint16_t *K_, int64_t voff_, int64_t ld,
                                                 int64_t S)
        : K(K_), voff(voff_) {
        c.seek(K, ld, 0);
        rows = (int)(S < INT32_MAX ? S : INT32_MAX);
    }
    /* start the next tile (it) into its buffers when it < ntiles, then close the group of copies
     * issued so far (cp.async.commit_group) */
    __device__ __forceinline__ void next(uint16_t *Kb, uint16_t *Vb, int it, int ntiles) {
        constexpr int TILE = TPK__FL_ROWS * (D + 8);
        if (it < ntiles) {
            c.template run<true>(Kb + (it % NBUF) * TILE, rows, K, Vb + (it % NBUF) * TILE, voff);
            rows -= TPK__FL_KEYS;
        }
        tpk__fl_commit();
    }
};

/* Start copying rows r0 .. r0 + ROWS - 1 of a bf16 matrix with row stride ld (rows >= S as zeros)
 * into dst [ROWS][D + 8] by the block's NT threads; the data is there after tpk__fl_wait_all and a
 * barrier. */
template <int D, int NT, int ROWS = TPK__FL_ROWS>
__device__ __forceinline__ void tpk__fl_stage(uint16_t *dst, const uint16_t *src, int64_t ld,
                                              int64_t r0, int64_t S) {
    tpk__fl_copy<D, NT, ROWS> c;
    c.seek(src, ld, r0);
    c.run(dst, (int)(S - r0 < ROWS ? S - r0 : ROWS), src);
}

/* v clamped to [lo, hi]: a distance in a tile's 32-bit coordinates */
__device__ __forceinline__ int tpk__fl_clamp(int64_t v, int lo, int hi) {
    return (int)(v < lo ? lo : v > hi ? hi : v);
}
__device__ __forceinline__ int tpk__fl_imin(int a, int b) { return a < b ? a : b; }

/* Fragments from a row-major shared tile with row stride ld (rows 16 bytes apart mod 128: every
 * 8-row phase of an ldmatrix hits 32 distinct banks), each by one ldmatrix.x4 of the warp (lane l
 * addresses row l % 16 or l % 8 of its matrix l / 8):
 * the A fragment of the 16x16 block at (row0, col0) */
__device__ __forceinline__ void tpk__fl_frag_a(uint32_t a[4], const uint16_t *s, int ld, int row0,
                                               int col0, int lane) {
    tpk__fl_ldsm4<false>(a, s + (row0 + (lane & 15)) * ld + col0 + 8 * (lane >> 4));
}
/* the B fragments of two 8-column tiles n0 .. n0 + 15 (b[0..1] the first, b[2..3] the second) with
 * B[k][n] = s[n0 + n][k0 + k]: the tile holds B transposed (K for S = Q K^T) */
__device__ __forceinline__ void tpk__fl_frag_bt2(uint32_t b[4], const uint16_t *s, int ld, int n0,
                                                 int k0, int lane) {
    tpk__fl_ldsm4<false>(b,
                         s + (n0 + (lane & 7) + 8 * (lane >> 4)) * ld + k0 + 8 * ((lane >> 3) & 1));
}
/* the same with B[k][n] = s[k0 + k][n0 + n]: the tile holds B as it is (V for O = P V), loaded
 * transposed */
__device__ __forceinline__ void tpk__fl_frag_b2(uint32_t b[4], const uint16_t *s, int ld, int k0,
                                                int n0, int lane) {
    tpk__fl_ldsm4<true>(b, s + (k0 + (lane & 15)) * ld + n0 + 8 * (lane >> 4));
}
/* the A fragment of the 16x16 block at (row0, col0) of A = s^T: the tile holds A transposed (dS^T
 * for dQ = dS K), loaded transposed — matrix m covers A's rows row0 + 8 (m & 1), columns col0 + 8
 * (m >> 1) */
__device__ __forceinline__ void tpk__fl_frag_at(uint32_t a[4], const uint16_t *s, int ld, int row0,
                                                int col0, int lane) {
    tpk__fl_ldsm4<true>(a, s + (col0 + (lane & 7) + 8 * (lane >> 4)) * ld + row0 +
                               8 * ((lane >> 3) & 1));
}
/* the C fragments of columns 0..7 (c0) and 8..15 (c1) as the bf16 A fragment of the 16 columns */
__device__ __forceinline__ void tpk__fl_c_to_a(uint32_t a[4], const float c0[4],
                                               const float c1[4]) {
    a[0] = tpk__fl_pack(c0[0], c0[1]), a[1] = tpk__fl_pack(c0[2], c0[3]);
    a[2] = tpk__fl_pack(c1[0], c1[1]), a[3] = tpk__fl_pack(c1[2], c1[3]);
}
/* max / sum over the 4 lanes that share a fragment row */
__device__ __forceinline__ float tpk__fl_quad_max(float v) {
    v = fmaxf(v, tpk__fl_shfl_xor(v, 1));
    return fmaxf(v, tpk__fl_shfl_xor(v, 2));
}
__device__ __forceinline__ float tpk__fl_quad_sum(float v) {
    v += tpk__fl_shfl_xor(v, 1);
    return v + tpk__fl_shfl_xor(v, 2);
}

/* ---- dropout draws, one Philox call per 4 elements (tpk/base/rng.h: index x takes output x % 4 of
 * call
 * x / 4). With S a multiple of 4 every dropout row ((b A + head) S + i) S starts at a multiple of
 * 4, so keys 4m .. 4m + 3 of a row are one call; the lanes that hold those 4 elements draw one call
 * each and exchange the outputs with shuffles. Otherwise (S % 4 != 0) each element is drawn alone
 * (tpk__att_keep_at). */

/* w.v[i] for a lane-dependent i, by selects (no indexed array: registers only) */
__device__ __forceinline__ float tpk__fl_pick(const tpk_f32x4 &w, int i) {
    float lo = (i & 1) ? w.v[1] : w.v[0], hi = (i & 1) ? w.v[3] : w.v[2];
    return (i & 2) ? hi : lo;
}
/* Row-major C fragment (rows queries, columns keys: forward, dQ): u[e] = the draw of element e of
 * an 8-key tile, (row g + 8 (e >> 1), key 2 t + (e & 1)). Lanes t and t ^ 1 hold keys 4 (t / 2) ..
 * + 3 of rows g and g + 8: the even lane draws row g's 4, the odd lane row g + 8's, and each hands
 * the other the two it needs (two shuffles). x: the dropout index of key 4 (t / 2) of the tile in
 * row g + 8 (t & 1) — the row this lane draws. */
__device__ __forceinline__ void tpk__fl_drop_rows(float u[4], uint64_t seed, uint64_t stream,
                                                  uint64_t x, int t) {
    tpk_f32x4 w = tpk_rng_uniform4(seed, stream, x >> 2);
    bool odd = t & 1;
    float r0 = tpk__fl_shfl_xor(odd ? w.v[0] : w.v[2], 1),
          r1 = tpk__fl_shfl_xor(odd ? w.v[1] : w.v[3], 1);
    u[0] = odd ? r0 : w.v[0], u[1] = odd ? r1 : w.v[1], u[2] = odd ? w.v[2] : r0,
    u[3] = odd ? w.v[3] : r1;
}
/* Transposed C fragment (rows keys, columns queries: dK, dV): u[e] = the draw of element e of an
 * 8-query tile, (key g + 8 (e >> 1), query 2 t + (e & 1)). Keys 4a .. 4a + 3 of a query lie in
 * lanes g = 4a + d, d = 0..3 (same t): lane d draws combination e = d — query 2 t + (d & 1), keys
 * 4a + 8 (d >> 1) .. + 3 — and the four lanes transpose their draws (three xor shuffles: in round k
 * lane d sends word d ^ k and receives lane d ^ k's word d, its element e = d ^ k). x: the dropout
 * index of that query and first key. */
__device__ __forceinline__ void tpk__fl_drop_cols(float u[4], uint64_t seed, uint64_t stream,
                                                  uint64_t x, int g) {
    tpk_f32x4 w = tpk_rng_uniform4(seed, stream, x >> 2);
    int d = g & 3;
    TPK__FL_UNROLL for (int k = 0; k < 4; k++) {
        float v = tpk__fl_pick(w, d ^ k);
        if (k) v = tpk__fl_shfl_xor(v, 4 * k);
        TPK__FL_UNROLL for (int e = 0; e < 4; e++) u[e] = (d ^ k) == e ? v : u[e];
    }
}

/* acc[8 m + nt] (MT row blocks of 16 x 64, each in eight 8-column C tiles) = A B^T with A 16 MT x D
 * (afrag(m, kk, af) makes the fragment of row block m, column block kk: from a shared tile or from
 * registers) and B = rows 0 .. 63 of the shared tile `bt`, over D columns: S = Q K^T, dP = dO V^T.
 * Each B fragment loaded serves the MT row blocks. The k loop unrolled UNR times (fully by
 * default). */
template <int D, int MT = 1, int UNR = D / 16, class F>
__device__ __forceinline__ void tpk__fl_mma_abt(float (*acc)[4], F afrag, const uint16_t *bt,
                                                int lane) {
    TPK__FL_UNROLL for (int nt = 0; nt < 8 * MT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] =
        acc[nt][3] = 0.0f;
    TPK__FL_UNROLL_N(UNR) for (int kk = 0; kk < D / 16; kk++) {
        uint32_t af[MT][4];
        TPK__FL_UNROLL for (int m = 0; m < MT; m++) afrag(m, kk, af[m]);
        TPK__FL_UNROLL for (int nt = 0; nt < 8; nt += 2) {
            uint32_t bf[4];
            tpk__fl_frag_bt2(bf, bt, D + 8, 8 * nt, 16 * kk, lane);
            TPK__FL_UNROLL for (int m = 0; m < MT; m++) tpk__fl_mma(acc[8 * m + nt], af[m], bf),
                tpk__fl_mma(acc[8 * m + nt + 1], af[m], bf + 2);
        }
    }
}
/* acc[(N / 8) m + dt] (MT row blocks of 16 x N in 8-column C tiles) += A B with A 16 MT x 16 K16
 * (afrag(m, kk, af) makes the fragment of row block m, column block kk) and B = rows 0 .. 16 K16 -
 * 1, columns n0 .. n0 + N - 1 of the shared tile `b` (row stride D + 8) */
template <int D, int N, int K16 = 4, int MT = 1, class F>
__device__ __forceinline__ void tpk__fl_mma_ab(float (*acc)[4], F afrag, const uint16_t *b, int n0,
                                               int lane) {
    TPK__FL_UNROLL for (int kk = 0; kk < K16; kk++) {
        uint32_t af[MT][4];
        TPK__FL_UNROLL for (int m = 0; m < MT; m++) afrag(m, kk, af[m]);
        TPK__FL_UNROLL for (int dt = 0; dt < N / 8; dt += 2) {
            uint32_t bf[4];
            tpk__fl_frag_b2(bf, b, D + 8, 16 * kk, n0 + 8 * dt, lane);
            TPK__FL_UNROLL for (int m = 0; m < MT; m++)
                tpk__fl_mma(acc[(N / 8) * m + dt], af[m], bf),
                tpk__fl_mma(acc[(N / 8) * m + dt + 1], af[m], bf + 2);
        }
    }
}
/* acc[(D / 8) m + dt] (MT row blocks of 16 x D) += C B with C = c[8 m .. 8 m + 7] (16 x 64 in C
 * tiles, rounded to bf16 as the A operand) and B = rows 0 .. 63 of the shared tile `b`: O += P V,
 * dV += P^T dO, dK += dS^T Q, dQ += dS K */
template <int D, int MT = 1>
__device__ __forceinline__ void tpk__fl_mma_cb(float (*acc)[4], const float (*c)[4],
                                               const uint16_t *b, int lane) {
    tpk__fl_mma_ab<D, D, 4, MT>(
        acc,
        [&](int m, int kk, uint32_t af[4]) {
            tpk__fl_c_to_a(af, c[8 * m + 2 * kk], c[8 * m + 2 * kk + 1]);
        },
        b, 0, lane);
}

/* the same with C already rounded to bf16 A fragments: a[4 m + kk] the 16 x 16 block kk of row
 * block m */
template <int D, int MT = 1>
__device__ __forceinline__ void tpk__fl_mma_pb(float (*acc)[4], const uint32_t (*a)[4],
                                               const uint16_t *b, int lane) {
    tpk__fl_mma_ab<D, D, 4, MT>(
        acc,
        [&](int m, int kk, uint32_t af[4]) {
            af[0] = a[4 * m + kk][0], af[1] = a[4 * m + kk][1], af[2] = a[4 * m + kk][2],
            af[3] = a[4 * m + kk][3];
        },
        b, 0, lane);
}


/* Grouped-query attention: the group size A / G, the first local key/value head g0 = head0 / grp
 * and the local key/value heads Gl (tpk_attn_kv_heads), as the kernels need them (and attn.cu's
 * GEMM path on the host). Head indices
 * are 32-bit (the launchers refuse A >= 2^31): unsigned 32-bit divisions are a few instructions
 * inline where 64-bit ones are calls, which cost the tensor-core kernels registers. */
struct tpk__fl_heads {
    int grp, g0, Gl;
    int64_t ld; /* (Al + 2 Gl) D: a row of qkv */
};
__host__ __device__ __forceinline__ tpk__fl_heads tpk__fl_heads_of(int64_t Al, int64_t A,
                                                                   int64_t G, int64_t head0,
                                                                   int64_t D) {
    tpk__fl_heads r;
    unsigned grp = (unsigned)A / (unsigned)G, g0 = (unsigned)head0 / grp;
    r.grp = (int)grp, r.g0 = (int)g0,
    r.Gl = Al > 0 ? (int)(((unsigned)head0 + (unsigned)Al - 1u) / grp - g0 + 1u) : 0;
    r.ld = (Al + 2 * (int64_t)r.Gl) * D;
    return r;
}
/* the local key/value head that local query head h reads */
__host__ __device__ __forceinline__ int tpk__fl_kv_of(const tpk__fl_heads &hd, int64_t head0,
                                                      int64_t h) {
    return (int)(((unsigned)head0 + (unsigned)h) / (unsigned)hd.grp) - hd.g0;
}
/* the local query heads [*h0, *h1) that read local key/value head kv: global heads
 * [(g0 + kv) grp, (g0 + kv + 1) grp) within [head0, head0 + Al) */
__host__ __device__ __forceinline__ void tpk__fl_q_of(const tpk__fl_heads &hd, int64_t head0,
                                                      int64_t Al, int64_t kv, int *h0, int *h1) {
    int lo = (hd.g0 + (int)kv) * hd.grp - (int)head0, hi = lo + hd.grp;
    *h0 = lo > 0 ? lo : 0, *h1 = hi < (int)Al ? hi : (int)Al;
}

/* grid (ceil(S / ROWS), Al, B), 32 W threads, ROWS = 16 MT W (tpk__fl_fwd_rows): block x owns
 * query rows q0 = (gridDim.x - 1 - x) ROWS .. q0 + ROWS - 1, the longest rows first; warp w the 16
 * MT rows from q0 + 16 MT w, in MT blocks of 16 that share each K and V fragment the warp loads.
 * The key tiles 0 .. q0 / 64 - 1 lie below every row of the block: a loop of mask-free steps; the
 * one or two tiles the diagonal (or S) crosses follow, masked, each warp skipping a tile wholly
 * above its rows. out [B, S, Al, D], lse [B, Al, S]. */
template <int D, int W, int MT, bool DROP>
__global__ void __launch_bounds__(32 * W, 2)
    tpk__flash_fwd(uint16_t *out, float *lse, const uint16_t *qkv, int64_t S, int64_t Al, int64_t A,
                   int64_t G, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream) {
    constexpr int LD = D + 8, NT = TPK__FL_KEYS / 8 /* 8-key tiles of S */, ND = D / 8,
                  WR = 16 * MT /* rows of a warp */, ROWS = WR * W;
    constexpr int TILE = TPK__FL_ROWS * LD;
    constexpr bool QREG = D == 128; /* tpk__fl_fwd_qreg: Q's A fragments held in registers (its tile
                                       staged in K's buffer 1) */
    static_assert(!QREG || ROWS == TPK__FL_ROWS, "Q staged in one key tile's buffer");
    TPK__FL_SMEM(uint16_t, Kb); /* [2][64][LD] each: K, V of tile it in buffer it % 2 */
    uint16_t *Vb = Kb + 2 * TILE, *Qs = QREG ? Kb + TILE : Vb + 2 * TILE; /* Q [ROWS][LD] */
    int w = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int64_t b = blockIdx.z, h = blockIdx.y, q0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * ROWS;
    int64_t ld3, kvo, vo; /* a row of qkv; the columns of K and V of the key/value head query head h
                             reads */
    {
        tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D);
        ld3 = hd.ld, kvo = (Al + tpk__fl_kv_of(hd, head0, h)) * D, vo = (int64_t)hd.Gl * D;
    }
    const uint16_t *Q = qkv + b * S * ld3 + h * D, *K = qkv + b * S * ld3 + kvo;
    int64_t wrow = q0 + WR * w, last = (q0 + ROWS < S ? q0 + ROWS : S) - 1;
    int ntiles = (int)(last / TPK__FL_KEYS) + 1,
        nfree =
            (int)(q0 / TPK__FL_KEYS); /* key tiles 0 .. the block's last row; the mask-free ones */
    tpk__fl_kv_stream<D, 32 * W> kvs(K, vo, ld3, S);
    tpk__fl_stage<D, 32 * W, ROWS>(Qs, Q, ld3, q0, S);
    kvs.next(Kb, Vb, 0, ntiles);
    tpk__fl_wait_all();
    __syncthreads();
    uint32_t qf[D / 16][4]; /* QREG: this warp's Q, A fragments of its 16 rows */
    if (QREG) {
        TPK__FL_UNROLL for (int kk = 0; kk < D / 16; kk++)
            tpk__fl_frag_a(qf[kk], Qs, LD, WR * w, 16 * kk, lane);
        __syncthreads(); /* Q read by every warp before key tile 1 lands on it */
    }
    auto qfrag = [&](int mt, int kk, uint32_t af[4]) {
        if (QREG) af[0] = qf[kk][0], af[1] = qf[kk][1], af[2] = qf[kk][2], af[3] = qf[kk][3];
        else tpk__fl_frag_a(af, Qs, LD, WR * w + 16 * mt, 16 * kk, lane);
    };
    /* row block mt of the warp: O in o[ND mt ..], its rows g and g + 8 in m[2 mt + r], l[2 mt +
     * r] */
    float o[MT * ND][4], m[2 * MT], l[2 * MT];
    TPK__FL_UNROLL for (int dt = 0; dt < MT * ND; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] =
        0.0f;
    TPK__FL_UNROLL for (int r = 0; r < 2 * MT; r++) m[r] = -INFINITY, l[r] = 0.0f;
    const float sl2 = scale * TPK__LOG2E;
    uint64_t drow = DROP ? (uint64_t)(((b * A + head0 + h) * S + wrow + g) * S)
                         : 0;          /* dropout index of (row wrow + g, key 0) */
    const bool grouped = (S & 3) == 0; /* dropout: one Philox call per 4 elements
                                          (tpk__fl_drop_rows) */
    /* one key tile: S = Q K^T, the online softmax, O += P V; MASK: the causal and S masks */
    auto step = [&](auto masked, int it) {
        constexpr bool MASK = decltype(masked)::value;
        int64_t j0 = (int64_t)it * TPK__FL_KEYS;
        const uint16_t *Ks = Kb + (it & 1) * TILE, *Vs = Vb + (it & 1) * TILE;
        float s[MT * NT][4]; /* row block mt's 16 x 64 in s[NT mt ..] */
        tpk__fl_mma_abt<D, MT>(s, qfrag, Ks, lane);
        /* MASK, in the tile's 32-bit coordinates: key j0 + c of row wrow + r is masked when
         * c > (wrow - j0) + r (above the diagonal) or c > S - 1 - j0 (past S), i.e. c > lim of the
         * row; lim is taken less this lane's first column 2 t, so the test is against the
         * compile-time 8 nt + (e & 1) */
        int lim[2 * MT];
        if (MASK) {
            int diag = tpk__fl_clamp(wrow - j0, -WR, TPK__FL_KEYS),
                send = tpk__fl_clamp(S - j0, 0, TPK__FL_KEYS) - 1;
            TPK__FL_UNROLL for (int r = 0; r < 2 * MT; r++) lim[r] =
                tpk__fl_imin(diag + 8 * r + g, send) - 2 * t; /* row 16 (r / 2) + 8 (r % 2) + g */
        }
        float corr[2 * MT], msl[2 * MT];
        TPK__FL_UNROLL for (int mt = 0; mt < MT; mt++) {
            float mx[2] = {m[2 * mt], m[2 * mt + 1]};
            TPK__FL_UNROLL for (int nt = 0; nt < NT; nt++)
                TPK__FL_UNROLL for (int e = 0; e < 4; e++) {
                if (MASK && 8 * nt + (e & 1) > lim[2 * mt + (e >> 1)])
                    s[NT * mt + nt][e] = -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[NT * mt + nt][e]);
            }
            TPK__FL_UNROLL for (int r = 0; r < 2; r++) {
                int i = 2 * mt + r;
                mx[r] = tpk__fl_quad_max(mx[r]); /* finite: key j0 is in every row's reach */
                corr[i] = tpk__ex2((m[i] - mx[r]) * sl2); /* 0 on the first tile (m = -inf) */
                m[i] = mx[r], l[i] *= corr[i], msl[i] = mx[r] * sl2;
            }
        }
        TPK__FL_UNROLL for (int mt = 0; mt < MT; mt++)
            TPK__FL_UNROLL for (int nt = 0; nt < NT; nt++) {
            float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            uint64_t dx = drow + (uint64_t)(16 * mt) * (uint64_t)S; /* row wrow + 16 mt + g */
            if (DROP && grouped)
                tpk__fl_drop_rows(u, seed, stream,
                                  dx + (uint64_t)(8 * (t & 1) * S + j0 + 8 * nt + 4 * (t >> 1)), t);
            TPK__FL_UNROLL for (int e = 0; e < 4; e++) {
                float pe = tpk__ex2(fmaf(s[NT * mt + nt][e], sl2,
                                         -msl[2 * mt + (e >> 1)])); /* masked: 2^-inf = 0 */
                l[2 * mt + (e >> 1)] += pe;
                if (DROP && pe != 0.0f)
                    pe *= grouped ? tpk__att_keep_u(p, u[e])
                                  : tpk__att_keep_at(p, seed, stream,
                                                     dx + (uint64_t)(8 * (e >> 1) * S + j0 +
                                                                     8 * nt + 2 * t + (e & 1)));
                s[NT * mt + nt][e] = pe;
            }
        }
        TPK__FL_UNROLL for (int mt = 0; mt < MT; mt++)
            TPK__FL_UNROLL for (int dt = 0; dt < ND; dt++)
                TPK__FL_UNROLL for (int e = 0; e < 4; e++) o[ND * mt + dt][e] *=
            corr[2 * mt + (e >> 1)];
        tpk__fl_mma_cb<D, MT>(o, s, Vs, lane);
    };
    int it = 0;
    for (; it < nfree; it++) {
        kvs.next(Kb, Vb, it + 1, ntiles); /* the next tile lands in the other buffers meanwhile */
        step(std::false_type{}, it);
        tpk__fl_wait_all();
        __syncthreads(); /* the next tile is there for everyone, this one read by everyone */
    }
    for (; it < ntiles; it++) {
        kvs.next(Kb, Vb, it + 1, ntiles);
        /* not above this warp's diagonal (WR divides 64: a tile that starts after the warp's first
         * row starts after its last), so key j0 is in every row's reach (finite maxima) */
        if ((int64_t)it * TPK__FL_KEYS <= wrow) step(std::true_type{}, it);
        tpk__fl_wait_all();
        __syncthreads();
    }
    TPK__FL_UNROLL for (int mt = 0; mt < MT; mt++) TPK__FL_UNROLL for (int r = 0; r < 2; r++) {
            int64_t i = wrow + 16 * mt + g + 8 * r;
            float lr = tpk__fl_quad_sum(l[2 * mt + r]);
            if (i >= S) continue;
            float inv = 1.0f / lr;
            uint16_t *orow = out + ((b * S + i) * Al + h) * D + 2 * t;
            TPK__FL_UNROLL for (int dt = 0; dt < ND; dt++) *
                reinterpret_cast<uint32_t *>(orow + 8 * dt) =
                tpk__fl_pack(o[ND * mt + dt][2 * r] * inv, o[ND * mt + dt][2 * r + 1] * inv);
            if (t == 0) lse[(b * Al + h) * S + i] = m[2 * mt + r] * scale + logf(lr);
        }
}

/* grid (ceil(S / 16 W), Gl, B), 32 W threads (W = tpk__fl_warps(1)): block x owns keys
 * k0 = 16 W x .. k0 + 16 W - 1 of local key/value head y (block 0 has the most query tiles and
 * starts first), warp w the keys k0 + 16 w .. + 15; the 64-query tiles from k0 on, of each local
 * query head reading head y in turn, through one pipeline. Per head the first tile (the diagonal's)
 * is a masked step, the others mask-free. With NBUF = 1 (D = 128: two
 * blocks fit an A100's SM) the next Q, dO tile is copied into the one buffer once every warp has
 * used this one (after dK's GEMM), landing while dQ's GEMM runs; with NBUF = 2 at the tile's start.
 * Writes dK, dV of dqkv; DQ: adds dS K into dq_acc [B, S, Al, D]. */
template <int D, int W, bool DROP, bool DQ>
__global__ void __launch_bounds__(32 * W, 2)
    tpk__flash_dkv(uint16_t *dqkv, float *dq_acc, const uint16_t *dout, const uint16_t *qkv,
                   const float *lse, const float *Dr, int64_t S, int64_t Al, int64_t A, int64_t G,
                   int64_t head0, float scale, float p, uint64_t seed, uint64_t stream) {
    constexpr int LD = D + 8, TILE = TPK__FL_ROWS * LD, NT = TPK__FL_ROWS / 8 /* 8-query tiles */,
                  ND = D / 8, KEYS = 16 * W, LDS = TPK__FL_ROWS + 8;
    constexpr int NBUF = D == 128 ? 1 : 2; /* tpk__fl_dkv_nbuf */
    /* CHUNKED (D = 64): the tile in chunks of 16 queries, each chunk's Q and dO fragments read from
     * shared memory once and transposed in registers, and the warp's K, V A fragments held in
     * registers (32 a thread). At D = 128 dK, dV take 128 registers a thread and the chunks' Q, dO
     * fragments 64 more: K, V could not stay in registers, re-reading them per chunk gave back most
     * of the saving (about 290-300 bytes per HMMA), and ptxas spilled; D = 128 keeps the whole-tile
     * steps */
    constexpr bool CHUNKED = D == 64, KVREG = CHUNKED;
    constexpr int KUNR = DROP && D == 128 ? 2 : D / 16; /* the whole-tile steps: the unroll of S^T's
                                                           and dP^T's k loops */
    static_assert(W == 4 && KEYS == TPK__FL_ROWS,
                  "dQ's GEMM: 4 warps of 32 queries x D / 2 columns over the block's 64 keys");
    TPK__FL_SMEM(uint16_t, Ks); /* [KEYS][LD] each: K, V of the block's keys */
    uint16_t *Vs = Ks + KEYS * LD, *Qb = Vs + KEYS * LD,
             *dOb =
                 Qb +
                 NBUF * TILE; /* [NBUF][64][LD] each: Q, dO of query tile it in buffer it % NBUF */
    /* [NBUF][64][2]: lse log2(e), Dr of the tile's query c at [c / 2][0..1], [c / 2][2..3] */
    float *Lb = reinterpret_cast<float *>(dOb + NBUF * TILE);
    uint16_t *dSt = reinterpret_cast<uint16_t *>(
        Lb + NBUF * 2 * TPK__FL_ROWS); /* DQ: [KEYS][LDS] dS^T of the tile */
    int w = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int Si = (int)S; /* tile coordinates in 32 bits (tpk__flash_fits: S < 2^30) */
    int b = (int)blockIdx.z, kv = (int)blockIdx.y, k0 = (int)blockIdx.x * KEYS;
    tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D);
    int ld3 = (int)hd.ld, ldo = (int)Al * D; /* tpk__flash_fits */
    int h0, h1; /* the local query heads h0 .. h1 - 1 read this key/value head */
    tpk__fl_q_of(hd, head0, Al, kv, &h0, &h1);
    const uint16_t *K = qkv + (int64_t)b * S * ld3 + (Al + kv) * D, *V = K + (int64_t)hd.Gl * D;
    int ntq = (Si - 1 - k0) / TPK__FL_ROWS + 1; /* query tiles k0 .. S - 1 of one query head */
    int ntiles = ntq * (h1 - h0);               /* over the local query heads h0 .. h1 - 1 reading
                                                   this head */
    tpk__fl_copy<D, 32 * W> cq;
    /* the row terms of tile tq of query head h: thread x < 64 fetches lse of query q0 + x, thread
     * 64 + x its Dr, into a register a tile ahead, stored into shared memory at the tile's end
     * (stash) */
    int rt = (int)threadIdx.x & (TPK__FL_ROWS - 1), rdr = (int)threadIdx.x >> 6;
    auto fetch_row = [&](int h, int tq) {
        int i = k0 + tq * TPK__FL_ROWS + rt;
        const float *src = (rdr ? Dr : lse) + (b * Al + h) * S;
        return i < Si ? (rdr ? src[i] : src[i] * TPK__LOG2E) : 0.0f;
    };
    auto stash_row = [&](float v, int buf) {
        Lb[buf * 2 * TPK__FL_ROWS + 4 * (rt >> 1) + 2 * rdr + (rt & 1)] = v;
    };
    auto stage_q = [&](int h, int tq, int buf) { /* Q, dO of tile tq of query head h into buffer
                                                    buf */
        int q0 = k0 + tq * TPK__FL_ROWS, rows = tpk__fl_imin(Si - q0, TPK__FL_ROWS);
        const uint16_t *Q = qkv + (int64_t)b * S * ld3 + h * D,
                       *dO = dout + (int64_t)b * S * ldo + h * D;
        cq.seek(Q, ld3, q0), cq.run(Qb + buf * TILE, rows, Q);
        cq.seek(dO, ldo, q0), cq.run(dOb + buf * TILE, rows, dO);
    };
    tpk__fl_stage<D, 32 * W, KEYS>(Ks, K, ld3, k0, S);
    tpk__fl_stage<D, 32 * W, KEYS>(Vs, V, ld3, k0, S);
    stage_q(h0, 0, 0);
    stash_row(fetch_row(h0, 0), 0);
    tpk__fl_commit();
    tpk__fl_wait_all();
    __syncthreads();
    float dk[ND][4], dv[ND][4];
    /* KVREG: the A fragments of K, V [16 keys][D] */
    uint32_t kreg[KVREG ? D / 16 : 1][4], vreg[KVREG ? D / 16 : 1][4];
    if (KVREG) {
        TPK__FL_UNROLL for (int kk = 0; kk < D / 16; kk++)
            tpk__fl_frag_a(kreg[kk], Ks, LD, 16 * w, 16 * kk, lane),
            tpk__fl_frag_a(vreg[kk], Vs, LD, 16 * w, 16 * kk, lane);
    }
    auto kfrag = [&](uint32_t af[4], int kk) { /* the A fragment of K [16 keys][columns 16 kk ..] */
                                               if (KVREG)
                                                   af[0] = kreg[kk][0], af[1] = kreg[kk][1],
                                                   af[2] = kreg[kk][2], af[3] = kreg[kk][3];
                                               else
                                                   tpk__fl_frag_a(af, Ks, LD, 16 * w, 16 * kk,
                                                                  lane);
    };
    auto vfrag = [&](uint32_t af[4], int kk) {
        if (KVREG)
            af[0] = vreg[kk][0], af[1] = vreg[kk][1], af[2] = vreg[kk][2], af[3] = vreg[kk][3];
        else tpk__fl_frag_a(af, Vs, LD, 16 * w, 16 * kk, lane);
    };
    TPK__FL_UNROLL for (int dt = 0; dt < ND; dt++) TPK__FL_UNROLL for (int e = 0; e < 4; e++)
        dk[dt][e] = dv[dt][e] = 0.0f;
    const float sl2 = scale * TPK__LOG2E;
    int wkey = k0 + 16 * w; /* this warp's keys: wkey + g, wkey + g + 8 */
    const bool grouped = (S & 3) == 0; /* dropout: one Philox call per 4 elements
                                          (tpk__fl_drop_cols) */
    /* tile tq of query head h, the it-th of the pipeline; MASK: the causal mask (the diagonal's
     * tile) */
    auto step = [&](auto masked, int h, int tq, int it) {
        constexpr bool MASK = decltype(masked)::value;
        int q0 = k0 + tq * TPK__FL_ROWS;
        int buf = NBUF == 2 ? it & 1 : 0;
        const uint16_t *Qs = Qb + buf * TILE, *dOs = dOb + buf * TILE;
        const float *Ls = Lb + buf * 2 * TPK__FL_ROWS;
        bool more = it + 1 < ntiles;
        int nh = tq + 1 < ntq ? h : h + 1, ntq1 = tq + 1 < ntq ? tq + 1 : 0; /* the next tile */
        /* lands in the other buffer meanwhile */
        if (NBUF == 2 && more) stage_q(nh, ntq1, (it + 1) & 1);
        {
            /* MASK, in the tile's 32-bit coordinates: query q0 + c, key wkey + r is kept when
             * c >= (wkey - q0) + r (on or below the diagonal). Past S no mask is needed: those
             * rows of Q, dO, K, V and the row terms are staged as zeros, so a query past S adds
             * P^T 0 to dV and dS^T = P^T (0 - 0) = 0 to dK and dQ, and a key past S is not
             * written */
            auto mask_diag = [&] {
                return MASK ? tpk__fl_clamp(wkey - q0, -TPK__FL_ROWS, TPK__FL_ROWS) : 0;
            };
            /* dropout index of (query q0 + 2 t, key wkey + g); grouped: of the call this lane
             * draws, query q0 + 2 t + (g & 1), keys wkey + 4 (g >> 2) + 8 ((g >> 1) & 1) .. + 3
             * (tpk__fl_drop_cols). Both formed where the steps below first need them (before the
             * whole-tile GEMMs at D = 128 they cost ptxas a spill) */
            auto drop_x = [&] {
                uint64_t x =
                    DROP ? (uint64_t)(((b * A + head0 + h) * S + q0 + 2 * t) * S + wkey + g) : 0;
                if (DROP && grouped)
                    x += (uint64_t)((int64_t)(g & 1) * S + 8 * ((g >> 1) & 1) - (g & 3));
                return x;
            };
            /* 16 keys x the 8-query tile nt, in place: S^T -> P^T keep, dP^T -> dS^T = P^T (dP^T
             * keep - Dr), zero above the diagonal under MASK; rounded to bf16 as they are made (pa,
             * sa: two registers of an A fragment each), and dS^T stored for dQ as the fragment
             * holds it */
            auto tile8 = [&](float(&st)[4], float(&dpt)[4], uint32_t *pa, uint32_t *sa, int nt,
                             int diag, uint64_t dx) {
                float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (DROP && grouped)
                    tpk__fl_drop_cols(u, seed, stream, dx + (uint64_t)(8 * nt) * (uint64_t)S, g);
                /* the row terms of queries 8 nt + 2 t, + 1: lse log2(e) in rt.x, .y, Dr in .z,
                 * .w */
                float4 rtm = *reinterpret_cast<const float4 *>(Ls + 4 * (4 * nt + t));
                float L2[2] = {rtm.x, rtm.y}, Dq[2] = {rtm.z, rtm.w};
                TPK__FL_UNROLL for (int e = 0; e < 4; e++) {
                    int cq = 8 * nt + 2 * t + (e & 1), r = g + 8 * (e >> 1);
                    float P = tpk__ex2(fmaf(st[e], sl2, -L2[e & 1]));
                    float keep =
                        !DROP ? 1.0f
                        : grouped
                            ? tpk__att_keep_u(p, u[e])
                            : tpk__att_keep_at(p, seed, stream,
                                               dx + (uint64_t)(8 * nt + (e & 1)) * (uint64_t)S +
                                                   (uint64_t)(8 * (e >> 1)));
                    float ds = P * fmaf(dpt[e], keep, -Dq[e & 1]);
                    P *= keep;
                    if (MASK) {
                        bool in = cq >= diag + r;
                        P = in ? P : 0.0f, ds = in ? ds : 0.0f;
                    }
                    st[e] = P, dpt[e] = ds;
                }
                pa[0] = tpk__fl_pack(st[0], st[1]), pa[1] = tpk__fl_pack(st[2], st[3]);
                sa[0] = tpk__fl_pack(dpt[0], dpt[1]), sa[1] = tpk__fl_pack(dpt[2], dpt[3]);
                if (DQ) { /* dS^T [key 16 w + g (+ 8)][queries 8 nt + 2 t, + 1] */
                    uint16_t *srow = dSt + (16 * w + g) * LDS + 8 * nt + 2 * t;
                    *reinterpret_cast<uint32_t *>(srow) = sa[0];
                    *reinterpret_cast<uint32_t *>(srow + 8 * LDS) = sa[1];
                }
            };
            if (CHUNKED) {
                int diag = mask_diag();
                uint64_t dx = drop_x();
                /* the tile in 4 chunks of 16 queries (P needs no running max): each chunk's Q and
                 * dO fragments are read from shared memory once, as the B operands of S^T and dP^T
                 * (k along D), and transposed in registers (movmatrix) into those of dK and dV (k
                 * along the queries) */
                TPK__FL_UNROLL for (int c = 0; c < NT / 2; c++) {
                    uint32_t qf[D / 16][4], of[D / 16][4]; /* the B fragments of queries 16 c .. +
                                                              15 (n) by D (k): Q^T, dO^T */
                    float st[2][4], dpt[2][4];             /* S^T = K Q^T, dP^T = V dO^T: 16 keys x
                                                              the chunk's 16 queries */
                    TPK__FL_UNROLL for (int j = 0; j < 2; j++)
                        TPK__FL_UNROLL for (int e = 0; e < 4; e++) st[j][e] = dpt[j][e] = 0.0f;
                    TPK__FL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
                        uint32_t af[4];
                        tpk__fl_frag_bt2(qf[kk], Qs, LD, 16 * c, 16 * kk, lane);
                        kfrag(af, kk);
                        tpk__fl_mma(st[0], af, qf[kk]), tpk__fl_mma(st[1], af, qf[kk] + 2);
                        tpk__fl_frag_bt2(of[kk], dOs, LD, 16 * c, 16 * kk, lane);
                        vfrag(af, kk);
                        tpk__fl_mma(dpt[0], af, of[kk]), tpk__fl_mma(dpt[1], af, of[kk] + 2);
                    }
                    uint32_t pa[4], sa[4]; /* P^T keep, dS^T of the chunk as bf16 A fragments (k =
                                              its 16 queries) */
                    /* the C fragments of 8-query tiles 2 c, 2 c + 1 are the A fragment of their
                     * 16 */
                    TPK__FL_UNROLL for (int j = 0; j < 2; j++)
                        tile8(st[j], dpt[j], pa + 2 * j, sa + 2 * j, 2 * c + j, diag, dx);
                    /* dV += (P^T keep) dO, dK += dS^T Q over the chunk's queries (dK scaled at the
                     * end). The 8x8 blocks of qf[kk] are (queries 0-7 | 8-15) x (columns 16 kk +
                     * 0-7 | 8-15) in the order (0, 0), (0, 8), (8, 0), (8, 8); transposed, (0, 0)
                     * and (8, 0) are the B fragment of columns 16 kk .. + 7, (0, 8) and (8, 8) that
                     * of 16 kk + 8 .. + 15 */
                    TPK__FL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
                        uint32_t b0[2] = {tpk__fl_movt(of[kk][0]), tpk__fl_movt(of[kk][2])},
                                 b1[2] = {tpk__fl_movt(of[kk][1]), tpk__fl_movt(of[kk][3])};
                        tpk__fl_mma(dv[2 * kk], pa, b0), tpk__fl_mma(dv[2 * kk + 1], pa, b1);
                    }
                    TPK__FL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
                        uint32_t b0[2] = {tpk__fl_movt(qf[kk][0]), tpk__fl_movt(qf[kk][2])},
                                 b1[2] = {tpk__fl_movt(qf[kk][1]), tpk__fl_movt(qf[kk][3])};
                        tpk__fl_mma(dk[2 * kk], sa, b0), tpk__fl_mma(dk[2 * kk + 1], sa, b1);
                    }
                }
            } else { /* D = 128: the whole tile's S^T, dP^T, then dV, dK with Q, dO read again,
                        transposed (ldmatrix.trans) */
                float st[NT][4], dpt[NT][4]; /* S^T = K Q^T, dP^T = V dO^T: 16 keys x 64 queries */
                uint32_t pf[4][4], sf[4][4]; /* P^T keep, dS^T as bf16 A fragments, 16 queries
                                                each */
                /* with dropout at D = 128 (dK, dV 128 registers, the Philox draws) the k loops are
                 * unrolled by 2: fully, ptxas spilled a word in the tile loop */
                tpk__fl_mma_abt<D, 1, KUNR>(
                    st,
                    [&](int, int kk, uint32_t af[4]) {
                        tpk__fl_frag_a(af, Ks, LD, 16 * w, 16 * kk, lane);
                    },
                    Qs, lane);
                tpk__fl_mma_abt<D, 1, KUNR>(
                    dpt,
                    [&](int, int kk, uint32_t af[4]) {
                        tpk__fl_frag_a(af, Vs, LD, 16 * w, 16 * kk, lane);
                    },
                    dOs, lane);
                int diag = mask_diag();
                uint64_t dx = drop_x();
                /* the A fragments of P^T keep and dS^T: half the registers of the f32 tiles */
                TPK__FL_UNROLL for (int nt = 0; nt < NT; nt++)
                    tile8(st[nt], dpt[nt], pf[nt >> 1] + 2 * (nt & 1), sf[nt >> 1] + 2 * (nt & 1),
                          nt, diag, dx);
                tpk__fl_mma_pb<D>(dv, pf, dOs, lane); /* dV += (P^T keep) dO */
                tpk__fl_mma_pb<D>(dk, sf, Qs, lane);  /* dK += dS^T Q (scaled at the end) */
            }
        } /* a warp whose keys all lie past S (the last block) runs too: its K, V rows are zeros, so
           * it adds dS 0 to dQ, and its dK, dV are not written */
        float row = more ? fetch_row(nh, ntq1) : 0.0f; /* the next tile's row term, landing while
                                                          dQ's GEMM runs */
        if (DQ || NBUF == 1) __syncthreads(); /* dS written by every warp; Q, dO read by every
                                                 warp */
        if (NBUF == 1 && more) stage_q(nh, ntq1, 0);
        if (DQ) { /* dQ [32 queries 32 (w % 2) .., D / 2 columns from c0] += dS K over the block's
                     keys, added into dq_acc */
            constexpr int NC = D / 2;
            int qr = 32 * (w & 1), c0 = NC * (w >> 1);
            float dq[2 * NC / 8][4];
            TPK__FL_UNROLL for (int dt = 0; dt < 2 * NC / 8; dt++) dq[dt][0] = dq[dt][1] =
                dq[dt][2] = dq[dt][3] = 0.0f;
            tpk__fl_mma_ab<D, NC, 4, 2>(
                dq,
                [&](int m, int kk, uint32_t af[4]) {
                    tpk__fl_frag_at(af, dSt, LDS, qr + 16 * m, 16 * kk, lane);
                },
                Ks, c0, lane);
            TPK__FL_UNROLL for (int m = 0; m < 2; m++) TPK__FL_UNROLL for (int r = 0; r < 2; r++) {
                    int i = q0 + qr + 16 * m + g + 8 * r;
                    if (i >= Si) continue;
                    float *qrow =
                        dq_acc + ((b * S + i) * Al + h) * D + c0 + 2 * t; /* dq_acc [B, S, Al, D] */
                    TPK__FL_UNROLL for (int dt = 0; dt < NC / 8; dt++)
                        tpk__fl_red2(qrow + 8 * dt, dq[(NC / 8) * m + dt][2 * r],
                                     dq[(NC / 8) * m + dt][2 * r + 1]);
                }
        }
        if (more) stash_row(row, (it + 1) % NBUF);
        tpk__fl_commit();
        tpk__fl_wait_all();
        __syncthreads(); /* the next tile is there for everyone, this one read by everyone */
    };
    for (int h = h0, it = 0; it < ntiles; h++) { /* query heads h0 .. h1 - 1, ntq tiles each */
        int tq = 0;
        step(std::true_type{}, h, tq++, it++); /* the diagonal's tile */
        for (; tq < ntq; tq++) step(std::false_type{}, h, tq, it++);
    }
    TPK__FL_UNROLL for (int r = 0; r < 2; r++) {
        int j = wkey + g + 8 * r;
        if (j >= Si) continue;
        uint16_t *krow = dqkv + (b * S + j) * ld3 + (Al + kv) * D + 2 * t,
                 *vrow = krow + hd.Gl * D; /* rows of ld3 */
        TPK__FL_UNROLL for (int dt = 0; dt < ND; dt++) {
            *reinterpret_cast<uint32_t *>(krow + 8 * dt) =
                tpk__fl_pack(scale * dk[dt][2 * r], scale * dk[dt][2 * r + 1]);
            *reinterpret_cast<uint32_t *>(vrow + 8 * dt) =
                tpk__fl_pack(dv[dt][2 * r], dv[dt][2 * r + 1]);
        }
    }
}

/* grid (ceil(S / 64), Al, B), 128 threads: block x owns queries q0 .. q0 + 63 (the longest rows
 * first), warp w the rows q0 + 16 w .. + 15; the key tiles before q0 mask-free, the diagonal's
 * masked. NBUF = 2: the next K, V tile lands while this one is used; NBUF = 1 (D = 128: 68 KB a
 * block, two fit an A100's SM) it is copied once every warp has used this one. Writes dQ of
 * dqkv. */
template <int D, bool DROP>
__global__ void __launch_bounds__(128, 2)
    tpk__flash_dq(uint16_t *dqkv, const uint16_t *dout, const uint16_t *qkv, const float *lse,
                  const float *Dr, int64_t S, int64_t Al, int64_t A, int64_t G, int64_t head0,
                  float scale, float p, uint64_t seed, uint64_t stream) {
    constexpr int LD = D + 8, TILE = TPK__FL_ROWS * LD, NT = TPK__FL_KEYS / 8, ND = D / 8;
    constexpr int NBUF = D == 128 ? 1 : 2; /* tpk__fl_dq_nbuf */
    TPK__FL_SMEM(uint16_t, Qs); /* [64][LD] each: Q, dO of the block's queries */
    /* [NBUF][64][LD] each: K, V of key tile it in buffer it % NBUF */
    uint16_t *dOs = Qs + TILE, *Kb = dOs + TILE, *Vb = Kb + NBUF * TILE;
    int w = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int64_t b = blockIdx.z, h = blockIdx.y,
            q0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * TPK__FL_ROWS;
    tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D);
    int64_t ld3 = hd.ld, ldo = Al * D, kv = tpk__fl_kv_of(hd, head0, h);
    const uint16_t *Q = qkv + b * S * ld3 + h * D, *K = qkv + b * S * ld3 + (Al + kv) * D,
                   *dO = dout + b * S * ldo + h * D;
    int64_t wrow = q0 + 16 * w, last = (q0 + TPK__FL_ROWS < S ? q0 + TPK__FL_ROWS : S) - 1;
    int ntiles = (int)(last / TPK__FL_KEYS) + 1,
        nfree =
            (int)(q0 / TPK__FL_KEYS); /* key tiles 0 .. the block's last row; the mask-free ones */
    tpk__fl_stage<D, 128>(Qs, Q, ld3, q0, S);
    tpk__fl_stage<D, 128>(dOs, dO, ldo, q0, S);
    tpk__fl_kv_stream<D, 128, NBUF> kvs(K, (int64_t)hd.Gl * D, ld3, S);
    kvs.next(Kb, Vb, 0, ntiles);
    float L2[2], Di[2], dq[ND][4]; /* rows g, g + 8: lse log2(e), Dr */
    TPK__FL_UNROLL for (int r = 0; r < 2; r++) {
        int64_t i = wrow + g + 8 * r;
        L2[r] = i < S ? lse[(b * Al + h) * S + i] * TPK__LOG2E : 0.0f;
        Di[r] = i < S ? Dr[(b * Al + h) * S + i] : 0.0f;
    }
    TPK__FL_UNROLL for (int dt = 0; dt < ND; dt++) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] =
        0.0f;
    const float sl2 = scale * TPK__LOG2E;
    uint64_t drow = DROP ? (uint64_t)(((b * A + head0 + h) * S + wrow + g) * S)
                         : 0;          /* dropout index of (row wrow + g, key 0) */
    const bool grouped = (S & 3) == 0; /* dropout: one Philox call per 4 elements
                                          (tpk__fl_drop_rows) */
    tpk__fl_wait_all();
    __syncthreads();
    uint32_t qa[D / 16][4], da[D / 16][4]; /* the warp's Q, dO A fragments [16 rows][D], held for
                                              the whole kernel */
    TPK__FL_UNROLL for (int kk = 0; kk < D / 16; kk++)
        tpk__fl_frag_a(qa[kk], Qs, LD, 16 * w, 16 * kk, lane),
        tpk__fl_frag_a(da[kk], dOs, LD, 16 * w, 16 * kk, lane);
    /* key tile it: S = Q K^T, dP = dO V^T, dS = P (dP keep - Dr), dQ += dS K; MASK: the forward's
     * masks */
    auto step = [&](auto masked, int it) {
        constexpr bool MASK = decltype(masked)::value;
        int64_t j0 = (int64_t)it * TPK__FL_KEYS;
        const uint16_t *Ks = Kb + (it % NBUF) * TILE, *Vs = Vb + (it % NBUF) * TILE;
        int lim[2] = {0, 0}; /* MASK: key j0 + c of row wrow + g + 8 r is kept when 8 nt + (e & 1) =
                                c - 2 t <= lim[r] */
        if (MASK) {
            int diag = tpk__fl_clamp(wrow - j0, -16, TPK__FL_KEYS),
                send = tpk__fl_clamp(S - j0, 0, TPK__FL_KEYS) - 1;
            lim[0] = tpk__fl_imin(diag + g, send) - 2 * t,
            lim[1] = tpk__fl_imin(diag + g + 8, send) - 2 * t;
        }
        /* the tile in 4 chunks of 16 keys: each chunk's K fragments are read from shared memory
         * once, as the B operand of S = Q K^T (k along D), and transposed in registers (movmatrix)
         * into that of dQ += dS K (k along the keys); Q's and dO's A fragments are in registers */
        TPK__FL_UNROLL for (int c = 0; c < NT / 2; c++) {
            uint32_t kf[D / 16][4]; /* the B fragments of keys 16 c .. + 15 (n) by D (k): K^T */
            float s[2][4], dp[2][4]; /* S = Q K^T, dP = dO V^T: 16 queries x the chunk's 16 keys */
            TPK__FL_UNROLL for (int j = 0; j < 2; j++) TPK__FL_UNROLL for (int e = 0; e < 4; e++)
                s[j][e] = dp[j][e] = 0.0f;
            TPK__FL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
                uint32_t vf[4];
                tpk__fl_frag_bt2(kf[kk], Ks, LD, 16 * c, 16 * kk, lane);
                tpk__fl_mma(s[0], qa[kk], kf[kk]), tpk__fl_mma(s[1], qa[kk], kf[kk] + 2);
                tpk__fl_frag_bt2(vf, Vs, LD, 16 * c, 16 * kk, lane);
                tpk__fl_mma(dp[0], da[kk], vf), tpk__fl_mma(dp[1], da[kk], vf + 2);
            }
            uint32_t sa[4]; /* dS of the chunk as a bf16 A fragment (k = its 16 keys) */
            TPK__FL_UNROLL for (int j = 0; j < 2; j++) {
                int nt = 2 * c + j; /* the 8-key tile */
                float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (DROP && grouped)
                    tpk__fl_drop_rows(
                        u, seed, stream,
                        drow + (uint64_t)(8 * (t & 1) * S + j0 + 8 * nt + 4 * (t >> 1)), t);
                TPK__FL_UNROLL for (int e = 0; e < 4; e++) {
                    float P = tpk__ex2(fmaf(s[j][e], sl2, -L2[e >> 1]));
                    float keep =
                        !DROP     ? 1.0f
                        : grouped ? tpk__att_keep_u(p, u[e])
                                  : tpk__att_keep_at(p, seed, stream,
                                                     drow + (uint64_t)(8 * (e >> 1) * S + j0 +
                                                                       8 * nt + 2 * t + (e & 1)));
                    float ds = P * fmaf(dp[j][e], keep, -Di[e >> 1]);
                    if (MASK) ds = 8 * nt + (e & 1) <= lim[e >> 1] ? ds : 0.0f;
                    s[j][e] = ds;
                }
                sa[2 * j] = tpk__fl_pack(s[j][0], s[j][1]),
                       sa[2 * j + 1] = tpk__fl_pack(s[j][2], s[j][3]);
            }
            /* dQ += dS K over the chunk's keys (scaled at the end): the transposed 8x8 blocks (keys
             * 0-7, columns 16 kk ..) and (keys 8-15, 16 kk ..) are the B fragment of columns 16 kk
             * .. + 7, those at 16 kk + 8 that of 16 kk + 8 .. + 15 */
            TPK__FL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
                uint32_t b0[2] = {tpk__fl_movt(kf[kk][0]), tpk__fl_movt(kf[kk][2])},
                         b1[2] = {tpk__fl_movt(kf[kk][1]), tpk__fl_movt(kf[kk][3])};
                tpk__fl_mma(dq[2 * kk], sa, b0), tpk__fl_mma(dq[2 * kk + 1], sa, b1);
            }
        }
    };
    auto end_tile = [&](int it) {
        if (NBUF == 1) {
            __syncthreads(); /* this tile read by everyone */
            kvs.next(Kb, Vb, it + 1, ntiles);
        }
        tpk__fl_wait_all();
        __syncthreads(); /* the next tile is there for everyone, this one read by everyone */
    };
    int it = 0;
    for (; it < nfree; it++) {
        if (NBUF == 2) kvs.next(Kb, Vb, it + 1, ntiles); /* the next tile lands in the other buffers
                                                            meanwhile */
        step(std::false_type{}, it);
        end_tile(it);
    }
    for (; it < ntiles; it++) {
        if (NBUF == 2) kvs.next(Kb, Vb, it + 1, ntiles);
        if ((int64_t)it * TPK__FL_KEYS <= wrow + 15)
            step(std::true_type{}, it); /* not above this warp's diagonal (uniform over the warp) */
        end_tile(it);
    }
    TPK__FL_UNROLL for (int r = 0; r < 2; r++) {
        int64_t i = wrow + g + 8 * r;
        if (i >= S) continue;
        uint16_t *qrow = dqkv + (b * S + i) * ld3 + h * D + 2 * t;
        TPK__FL_UNROLL for (int dt = 0; dt < ND; dt++) *
            reinterpret_cast<uint32_t *>(qrow + 8 * dt) =
            tpk__fl_pack(scale * dq[dt][2 * r], scale * dq[dt][2 * r + 1]);
    }
}

#endif /* TPK_CUDA_FLASH_CUH */
