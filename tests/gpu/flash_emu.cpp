/* tests/gpu/flash_emu.cpp — the tensor-core attention kernels (kernels/cuda/flash.cuh) run on the
 * CPU, without a GPU, against the host backend's attention.
 *
 * Every thread of a block is a host thread; __syncthreads is a barrier of the block; the warp
 * instructions are emulated from the PTX ISA's definitions, independently of the kernels:
 *   mma.m16n8k16 (bf16 -> f32): each lane posts its A (4 x bf16x2), B (2 x bf16x2) registers, the
 *   warp assembles A 16x16 and B 16x8 from the documented fragment layout, each lane adds its
 *   C entries (rows g, g + 8, columns 2t, 2t + 1) of A B;
 *   shfl.xor: lane l reads lane l ^ m's value;
 *   cp.async: a thread's copies are deferred to its wait_group, so a tile used too early is caught.
 * Shared memory starts poisoned (NaN) and every output element is poisoned before the run and
 * checked to be written. Shapes: D = 64 and 128, S a multiple of the 64-row tile and not, one and
 * several heads and batches, dropout off and on (its draws grouped four to a Philox call where S % 4 = 0,
 * one per element otherwise), grouped-query attention (G < A: a key/value head
 * read by several query heads, its dK and dV summed over them); the reference is the host backend in f32 on the same
 * bf16-rounded inputs (out, lse, dQ, dK, dV). Prints "ok ..." / "FAIL ..." lines for tests/run.sh. */
#define TPK_FLASH_EMU 1

#include <pthread.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <type_traits>
#include <vector>

#include <tpk/tpk.h>

/* ---- the CUDA surface the kernels use ----------------------------------------------------------- */
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define TPK__FL_UNROLL
struct uint4 {
    uint32_t x, y, z, w;
};
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }
struct emu_dim3 {
    unsigned x, y, z;
};
static thread_local emu_dim3 threadIdx, blockIdx;
static emu_dim3 gridDim;

struct emu_warp {
    pthread_barrier_t bar;
    float f[32];
    uint32_t a[32][4], b[32][2];
};
struct emu_block {
    pthread_barrier_t bar;
    emu_warp warp[4];
    std::vector<unsigned char> smem;
};
static thread_local emu_block *emu_blk;
#define TPK__FL_SMEM(T, name) T *name = reinterpret_cast<T *>(emu_blk->smem.data())

static inline void __syncthreads() { pthread_barrier_wait(&emu_blk->bar); }
static inline emu_warp &emu_my_warp() { return emu_blk->warp[threadIdx.x >> 5]; }

/* two floats -> bf16x2, round to nearest even as __floats2bfloat162_rn (tpk_f32_to_bf16), lo in the low half */
static inline uint32_t tpk__fl_pack(float lo, float hi) { return (uint32_t)tpk_f32_to_bf16(lo) | (uint32_t)tpk_f32_to_bf16(hi) << 16; }

static inline float tpk__fl_shfl_xor(float v, int m) {
    emu_warp &W = emu_my_warp();
    int lane = threadIdx.x & 31;
    W.f[lane] = v;
    pthread_barrier_wait(&W.bar);
    float r = W.f[lane ^ m];
    pthread_barrier_wait(&W.bar);
    return r;
}

static inline void tpk__fl_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    emu_warp &W = emu_my_warp();
    int lane = threadIdx.x & 31;
    memcpy(W.a[lane], a, sizeof W.a[lane]);
    memcpy(W.b[lane], b, sizeof W.b[lane]);
    pthread_barrier_wait(&W.bar);
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, t = L & 3;
        for (int h = 0; h < 2; h++) { /* h: low / high half of a register */
            A[g][2 * t + h] = tpk_bf16_to_f32((uint16_t)(W.a[L][0] >> (16 * h)));
            A[g + 8][2 * t + h] = tpk_bf16_to_f32((uint16_t)(W.a[L][1] >> (16 * h)));
            A[g][2 * t + 8 + h] = tpk_bf16_to_f32((uint16_t)(W.a[L][2] >> (16 * h)));
            A[g + 8][2 * t + 8 + h] = tpk_bf16_to_f32((uint16_t)(W.a[L][3] >> (16 * h)));
            B[2 * t + h][g] = tpk_bf16_to_f32((uint16_t)(W.b[L][0] >> (16 * h)));
            B[2 * t + 8 + h][g] = tpk_bf16_to_f32((uint16_t)(W.b[L][1] >> (16 * h)));
        }
    }
    pthread_barrier_wait(&W.bar); /* every lane has read the posted registers */
    int g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float acc = 0.0f;
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        d[e] += acc;
    }
}

/* cp.async: a thread's copies land at its next wait_group 0, as late as the instruction allows, so
 * a tile read before its wait and barrier reads the poison or the previous tile */
struct emu_copy {
    void *dst;
    const void *src;
    bool valid;
};
static thread_local std::vector<emu_copy> emu_pending;
static inline void tpk__fl_cp16(void *dst, const void *src, bool valid) { emu_pending.push_back(emu_copy{dst, src, valid}); }
static inline void tpk__fl_commit() {}
static inline void tpk__fl_wait_all() {
    for (const emu_copy &c : emu_pending) {
        if (c.valid) memcpy(c.dst, c.src, 16);
        else memset(c.dst, 0, 16);
    }
    emu_pending.clear();
}

#include "../../kernels/cuda/flash.cuh"

/* Run kernel() on grid (gx, gy, gz) of 128-thread blocks with `smem` bytes of shared memory. */
static void emu_launch(unsigned gx, unsigned gy, unsigned gz, size_t smem, const std::function<void()> &kernel) {
    gridDim = emu_dim3{gx, gy, gz};
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) {
                emu_block blk;
                pthread_barrier_init(&blk.bar, NULL, TPK__FL_THREADS);
                for (auto &w : blk.warp) pthread_barrier_init(&w.bar, NULL, 32);
                blk.smem.assign(smem, 0xff); /* NaN as bf16 and f32 */
                std::vector<std::thread> th;
                for (unsigned tid = 0; tid < TPK__FL_THREADS; tid++)
                    th.emplace_back([&, tid] {
                        threadIdx = emu_dim3{tid, 0, 0}, blockIdx = emu_dim3{x, y, z}, emu_blk = &blk;
                        kernel();
                    });
                for (auto &t : th) t.join();
                pthread_barrier_destroy(&blk.bar);
                for (auto &w : blk.warp) pthread_barrier_destroy(&w.bar);
            }
}

static int fails;
static int64_t cur_A, cur_G; /* of the case being reported */
static void report(bool ok, const char *what, int64_t D, int64_t S, float p, double err) {
    fails += !ok;
    printf("%s flash emulation %s D=%lld S=%lld p=%g A=%lld G=%lld: max error %.3g\n", ok ? "ok" : "FAIL", what, (long long)D, (long long)S, (double)p,
           (long long)cur_A, (long long)cur_G, err);
}
/* max |got - want| / (1 + |want|) over n; a poisoned (NaN) element is an infinite error */
static double rel_err(const std::vector<float> &got, const std::vector<float> &want) {
    double e = 0;
    for (size_t k = 0; k < got.size(); k++) {
        double d = std::isfinite(got[k]) ? fabs(got[k] - want[k]) / (1 + fabs(want[k])) : INFINITY;
        e = d > e ? d : e;
    }
    return e;
}
static std::vector<float> to_f32(const std::vector<uint16_t> &v) {
    std::vector<float> r(v.size());
    for (size_t k = 0; k < v.size(); k++) r[k] = tpk_bf16_to_f32(v[k]);
    return r;
}

/* G key/value heads (0: G = A, multi-head) */
template <int D> static void run_case(tpk_ctx *host, int64_t B, int64_t S, int64_t Al, int64_t A, int64_t head0, float p, int64_t G = 0) {
    float scale = 1.0f / sqrtf((float)D);
    uint64_t seed = 5, stream = 6;
    if (!G) G = A;
    cur_A = A, cur_G = G;
    int64_t Gl = tpk_attn_kv_heads(A, G, head0, Al, NULL);
    size_t nq = (size_t)(B * S * (Al + 2 * Gl) * D), no = (size_t)(B * S * Al * D), nl = (size_t)(B * Al * S);
    std::vector<uint16_t> qkv(nq), dout(no);
    for (size_t k = 0; k < nq; k++) qkv[k] = tpk_f32_to_bf16(tpk_rng_normal(11, D + S, k));
    for (size_t k = 0; k < no; k++) dout[k] = tpk_f32_to_bf16(tpk_rng_normal(12, D + S, k));
    std::vector<float> qkvf = to_f32(qkv), doutf = to_f32(dout);

    /* the host backend, f32 on the bf16 values */
    std::vector<float> out_h(no), lse_h(nl), dqkv_h(nq);
    if (tpk_op_attn_fwd(host, out_h.data(), lse_h.data(), qkvf.data(), B, S, Al, D, A, G, head0, scale, p, seed, stream, TPK_F32) != TPK_OK ||
        tpk_op_attn_bwd(host, dqkv_h.data(), doutf.data(), qkvf.data(), out_h.data(), lse_h.data(), B, S, Al, D, A, G, head0, scale, p, seed,
                        stream, TPK_F32) != TPK_OK) {
        printf("FAIL flash emulation: host attention: %s\n", tpk_last_error(host));
        fails++;
        return;
    }

    /* the kernels, emulated; outputs poisoned */
    std::vector<uint16_t> out(no, 0xffff), dqkv(nq, 0xffff);
    std::vector<float> lse(nl, NAN), Dr(nl);
    unsigned gx = (unsigned)((S + TPK__FL_ROWS - 1) / TPK__FL_ROWS);
    auto by_drop = [&](auto f) { /* the kernels with dropout where p > 0, as the CUDA backend launches them */
        if (p > 0) f(std::true_type{});
        else f(std::false_type{});
    };
    by_drop([&](auto drop) {
        emu_launch(gx, (unsigned)Al, (unsigned)B, tpk__flash_smem(0, D), [&] {
            tpk__flash_fwd<D, decltype(drop)::value>(out.data(), lse.data(), qkv.data(), S, Al, A, G, head0, scale, p, seed, stream);
        });
    });
    std::vector<float> outf = to_f32(out);
    double eo = rel_err(outf, out_h), el = rel_err(lse, lse_h);
    report(eo < 2e-2, "forward out", D, S, p, eo);
    report(el < 1e-3, "forward lse", D, S, p, el);
    /* Dr from the kernel's own bf16 output, as the CUDA backend computes it */
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Al; h++)
            for (int64_t i = 0; i < S; i++) {
                float s = 0;
                for (int64_t e = 0; e < D; e++) s += doutf[((b * S + i) * Al + h) * D + e] * outf[((b * S + i) * Al + h) * D + e];
                Dr[(b * Al + h) * S + i] = s;
            }
    by_drop([&](auto drop) {
        constexpr bool DROP = decltype(drop)::value;
        emu_launch(gx, (unsigned)Gl, (unsigned)B, tpk__flash_smem(1, D), [&] { /* one block row per key/value head */
            tpk__flash_dkv<D, DROP>(dqkv.data(), dout.data(), qkv.data(), lse.data(), Dr.data(), S, Al, A, G, head0, scale, p, seed, stream);
        });
        emu_launch(gx, (unsigned)Al, (unsigned)B, tpk__flash_smem(2, D), [&] {
            tpk__flash_dq<D, DROP>(dqkv.data(), dout.data(), qkv.data(), lse.data(), Dr.data(), S, Al, A, G, head0, scale, p, seed, stream);
        });
    });
    std::vector<float> dq, dk, dv, dq_h, dk_h, dv_h; /* split dqkv into its three parts: [Q (Al D) | K (Gl D) | V (Gl D)] */
    for (size_t k = 0; k < nq; k++) {
        int64_t c = (int64_t)(k % (size_t)((Al + 2 * Gl) * D));
        size_t part = c < Al * D ? 0 : c < (Al + Gl) * D ? 1 : 2;
        std::vector<float> &g = part == 0 ? dq : part == 1 ? dk : dv, &gh = part == 0 ? dq_h : part == 1 ? dk_h : dv_h;
        g.push_back(tpk_bf16_to_f32(dqkv[k])), gh.push_back(dqkv_h[k]);
    }
    double eq = rel_err(dq, dq_h), ek = rel_err(dk, dk_h), ev = rel_err(dv, dv_h);
    report(eq < 3e-2, "backward dQ", D, S, p, eq);
    report(ek < 3e-2, "backward dK", D, S, p, ek);
    report(ev < 3e-2, "backward dV", D, S, p, ev);
}

int main(void) {
    tpk_ctx host;
    tpk_ctx_desc desc;
    memset(&desc, 0, sizeof desc);
    if (tpk_ctx_init(&host, &desc) != TPK_OK) {
        printf("FAIL flash emulation: host context: %s\n", tpk_last_error(&host));
        return 1;
    }
    run_case<64>(&host, 1, 64, 1, 1, 0, 0.0f);     /* one tile */
    run_case<64>(&host, 2, 150, 2, 5, 2, 0.0f);    /* S not a multiple of 64, several heads and batches */
    run_case<64>(&host, 1, 100, 2, 4, 1, 0.25f);   /* dropout, global heads */
    run_case<128>(&host, 1, 130, 2, 2, 0, 0.0f);   /* D = 128 */
    run_case<128>(&host, 1, 77, 1, 3, 2, 0.1f);    /* D = 128, dropout */
    /* grouped-query: a key/value head shared by query heads, read in place; dK, dV summed over them */
    run_case<64>(&host, 1, 100, 3, 6, 2, 0.0f, 2); /* heads 2..4 of 6 over 2 key/value heads: both local, one shared by 1, one by 2 */
    run_case<64>(&host, 2, 70, 4, 4, 0, 0.25f, 1); /* every query head reads the one key/value head, dropout */
    run_case<128>(&host, 1, 130, 2, 4, 2, 0.0f, 2); /* D = 128: the second key/value head alone */
    run_case<128>(&host, 1, 65, 4, 8, 4, 0.1f, 2);  /* D = 128, dropout, 4 query heads over 1 local key/value head */
    run_case<64>(&host, 1, 130, 4, 4, 0, 0.2f, 2);  /* both key/value heads, each read by two query heads, dropout */
    run_case<128>(&host, 1, 100, 3, 6, 2, 0.1f, 2); /* heads 2..4 of 6 at D = 128 with dropout: the shared head's dK, dV over 2 heads */
    /* dropout draws: S % 4 = 0 takes one Philox call per 4 elements (shared by lanes through shuffles),
     * other S one per element (77, 65, 70, 130 above); both give the host's masks */
    run_case<64>(&host, 2, 128, 2, 4, 1, 0.2f, 2);  /* S % 4 = 0 with whole tiles, two batches, heads 1..2 of 4 */
    tpk_ctx_destroy(&host);
    printf("flash emulation: %d failed\n", fails);
    return fails ? 1 : 0;
}
