/* tests/gpu/emu/race_test.cu — the CUDA emulation's own test: kernels with the faults a GPU would
 * show and the CPU would hide, each of which the emulation must catch, and the correct variant of
 * each, which must pass clean under every schedule. Converted by cu2cpp.pl and compiled against
 * the emulation like kernels/cuda/ (make $(B)/tests/gpu_emu_race; test-only, never on a GPU).
 *
 * The kernels (NT = 128 threads, 4 warps; x: CHUNKS tiles of NT floats; thread i reads the element
 * (i + 32) % NT of a shared tile, which another warp wrote):
 *   reuse_kernel<FIXED>  out[i] = sum_c x[c][(i + 32) % NT], one shared tile reused per chunk;
 *                        without FIXED the barrier before the next chunk's store is missing
 *   war_kernel<FIXED>    out[i] = 2 x[(i + 32) % NT], shifted in place in a static __shared__
 *                        array; without FIXED the barrier between the read and the store is missing
 *   pipe_kernel<MODE>    the sum of reuse_kernel through a cp.async pipeline (warp 0 copies the
 *                        tiles, 16 bytes a thread): MODE 0 double-buffered (right), 1
 *                        single-buffered (the next tile's copy lands on the tile being read), 2
 *                        read before the wait
 *   warp_kernel          out[i] = 2 x[i] through shared memory within each warp (__syncwarp): clean
 *   copy_kernel          out[i] = x[i + off] through dynamic shared memory: the launch checks
 *   vec_kernel           the same with 16-byte loads: a vector read past the allocation
 *   movt_kernel          2 warps: out = the transposes of x's two 8x8 blocks (as bf16) by
 *                        movmatrix.trans (tpk__fl_movt), against a plain transpose
 * What is required: a race report naming the kernel for each missing barrier and the single
 * buffer (TPK_EMU_RACE's detector), a wrong result (NaN: cp.async poison) for the single buffer and
 * the early read, a wrong result for the missing barrier under some schedule without the detector,
 * a launch refused for each configuration the hardware refuses (block size, grid, shared memory
 * without the attribute or above the device's limit) and a report for reads outside an
 * allocation. */
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "flash.cuh"

enum { NT = 128, CHUNKS = 3 };

template <bool FIXED> __global__ void reuse_kernel(float *out, const float *x) {
    extern __shared__ float tile[]; /* [NT] */
    int i = threadIdx.x;
    float acc = 0.0f;
    for (int c = 0; c < CHUNKS; c++) {
        tile[i] = x[c * NT + i];
        __syncthreads();
        acc += tile[(i + 32) % NT];
        if (FIXED) __syncthreads();
    }
    out[i] = acc;
}

template <bool FIXED> __global__ void war_kernel(float *out, const float *x) {
    __shared__ float t[NT];
    int i = threadIdx.x;
    t[i] = x[i];
    __syncthreads();
    float v = t[(i + 32) % NT];
    if (FIXED) __syncthreads();
    t[i] = 2.0f * v;
    __syncthreads();
    out[i] = t[i];
}

/* out[i] = 2 x[i], exchanged within each warp through its own 32 floats of shared memory, ordered
 * by __syncwarp alone: lanes of one warp, no race across warps */
__global__ void warp_kernel(float *out, const float *x) {
    __shared__ float u[NT];
    int i = threadIdx.x, base = i & ~31;
    u[i] = x[i];
    __syncwarp();
    float v = u[base + ((i + 1) & 31)];
    __syncwarp();
    u[i] = 2.0f * v;
    __syncwarp();
    out[i] = u[base + ((i + 31) & 31)];
}

template <int MODE> __global__ void pipe_kernel(float *out, const float *x) {
    extern __shared__ __align__(16) float buf[]; /* [2][NT] */
    int i = threadIdx.x;
    float acc = 0.0f;
    if (i < NT / 4) tpk__fl_cp16(&buf[4 * i], &x[4 * i], true);
    tpk__fl_commit();
    for (int c = 0; c < CHUNKS; c++) {
        int cur = MODE == 1 ? 0 : c & 1;
        if (MODE != 2) tpk__fl_wait_all();
        __syncthreads();
        if (c + 1 < CHUNKS) {
            int next = MODE == 1 ? 0 : (c + 1) & 1;
            if (i < NT / 4) tpk__fl_cp16(&buf[next * NT + 4 * i], &x[(c + 1) * NT + 4 * i], true);
            tpk__fl_commit();
        }
        acc += buf[cur * NT + (i + 32) % NT];
        __syncthreads();
    }
    tpk__fl_wait_all();
    out[i] = acc;
}

__global__ void copy_kernel(float *out, const float *x, int n, int off) {
    extern __shared__ float s[]; /* [blockDim.x] */
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i + off] : 0.0f;
    __syncthreads();
    if (i < n) out[i] = s[threadIdx.x];
}

__global__ void vec_kernel(float4 *out, const float4 *x, int n, int off) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i + off];
}

/* ---- the driver ------------------------------------------------------------------------------ */

/* out[64 w + 8 r + c] = x[64 w + 8 c + r] rounded down to bf16 (its upper 16 bits), r, c < 8, w the
 * warp: lane 4 r + c / 2 holds elements (r, c), (r, c + 1) of the warp's 8x8 matrix and
 * tpk__fl_movt gives it those of the transpose */
__global__ void movt_kernel(float *out, const float *x) {
    int l = threadIdx.x; /* 64 w + 2 (lane): the warp's block, 2 lane its elements' offset */
    uint32_t lo, hi;
    memcpy(&lo, &x[2 * l], 4), memcpy(&hi, &x[2 * l + 1], 4);
    uint32_t d = tpk__fl_movt(lo >> 16 | (hi >> 16) << 16), a = d << 16, b = d & 0xffff0000u;
    memcpy(&out[2 * l], &a, 4), memcpy(&out[2 * l + 1], &b, 4);
}

static int g_failed;
static void report(bool ok, const char *fmt, const char *a, const char *b) {
    printf("%s ", ok ? "ok" : "FAIL");
    printf(fmt, a, b);
    printf(" [np=1]\n");
    g_failed += !ok;
}
static float g_x[CHUNKS * NT], g_out[CHUNKS * NT]; /* out: the first NT compared */
static float *d_x, *d_out;

/* run f with the emulation's reports taken as expected; their count, the first in *msg */
template <class F> static int caught(F f, const char **msg) {
    tpk_emu_expect_begin();
    f();
    int n = tpk_emu_expect_end(msg);
    cudaDeviceSynchronize();
    return n;
}
/* out against the reference (NaN-aware: a NaN anywhere is wrong) */
static bool out_ok(const float *want) {
    cudaMemcpy(g_out, d_out, NT * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < NT; i++)
        if (!(fabsf(g_out[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])))) return false;
    return true;
}
static void poison_out() { cudaMemset(d_out, 0xff, sizeof g_out); }

int main() {
    unsigned r = 12345u;
    for (float &v : g_x)
        r = r * 1664525u + 1013904223u, v = (float)(r >> 8) / (float)(1u << 24) - 0.5f;
    float sum[NT], dbl[NT];
    for (int i = 0; i < NT; i++) {
        sum[i] = 0.0f, dbl[i] = 2.0f * g_x[(i + 32) % NT];
        for (int c = 0; c < CHUNKS; c++) sum[i] += g_x[c * NT + (i + 32) % NT];
    }
    cudaMalloc(&d_x, sizeof g_x);
    cudaMalloc(&d_out, sizeof g_out);
    cudaMemcpy(d_x, g_x, sizeof g_x, cudaMemcpyHostToDevice);
    const size_t tile = NT * sizeof(float);
    const char *msg = "";

    /* the correct variants: right and clean under every schedule, with the race detector */
    const char *scheds[] = {"lockstep", "asc", "desc", "random:1", "random:2"};
    for (const char *sc : scheds) {
        tpk_emu_configure(sc, true);
        poison_out();
        int n = caught([&] { reuse_kernel<true><<<1, NT, tile>>>(d_out, d_x); }, &msg);
        report(
            n == 0 && out_ok(sum) && cudaGetLastError() == cudaSuccess,
            "emulation: reuse_kernel<true> (a barrier before the tile's reuse) right and "
            "race-free, schedule %s%s",
            sc, "");
        poison_out();
        n = caught([&] { war_kernel<true><<<1, NT>>>(d_out, d_x); }, &msg);
        report(
            n == 0 && out_ok(dbl) && cudaGetLastError() == cudaSuccess,
            "emulation: war_kernel<true> (a barrier between the read and the store) right and "
            "race-free, schedule %s%s",
            sc, "");
        float twice[NT];
        for (int i = 0; i < NT; i++) twice[i] = 2.0f * g_x[i];
        poison_out();
        n = caught([&] { warp_kernel<<<1, NT>>>(d_out, d_x); }, &msg);
        report(
            n == 0 && out_ok(twice) && cudaGetLastError() == cudaSuccess,
            "emulation: warp_kernel (lanes of one warp exchange through shared memory at "
            "__syncwarp) right and no race across warps, schedule %s%s",
            sc, "");
        poison_out();
        n = caught([&] { pipe_kernel<0><<<1, NT, 2 * tile>>>(d_out, d_x); }, &msg);
        report(
            n == 0 && out_ok(sum) && cudaGetLastError() == cudaSuccess,
            "emulation: pipe_kernel<0> (double-buffered cp.async) right and race-free, schedule "
            "%s%s",
            sc, "");
    }

    /* the faults, each caught by the race detector (whatever the schedule: lockstep and desc) */
    const char *both[] = {"lockstep", "desc"}, *warps[] = {"asc", "desc"};
    for (const char *sc : both) {
        tpk_emu_configure(sc, true);
        int n = caught([&] { reuse_kernel<false><<<1, NT, tile>>>(d_out, d_x); }, &msg);
        cudaGetLastError();
        report(
            n > 0 && strstr(msg, "race in kernel reuse_kernel<false>") &&
                strstr(msg, "shared memory (dynamic) byte"),
            "emulation: the race detector reports a missing barrier before a tile's reuse "
            "(schedule %s): %s",
            sc, msg);
        n = caught([&] { war_kernel<false><<<1, NT>>>(d_out, d_x); }, &msg);
        cudaGetLastError();
        report(
            n > 0 && strstr(msg, "race in kernel war_kernel<false>") &&
                strstr(msg, "array t byte") &&
                (strcmp(sc, "lockstep") || strstr(msg, "write-after-read")),
            "emulation: the race detector reports the read and overwrite of a static shared array "
            "(write-after-read in lockstep; schedule %s): %s",
            sc, msg);
        poison_out();
        n = caught([&] { pipe_kernel<1><<<1, NT, 2 * tile>>>(d_out, d_x); }, &msg);
        cudaGetLastError();
        report(
            n > 0 && strstr(msg, "race in kernel pipe_kernel<1>") && !out_ok(sum),
            "emulation: a single-buffered cp.async pipeline: a race reported and the in-flight "
            "tile read as poison (schedule %s): %s",
            sc, msg);
    }
    /* a tile read before its copy's wait reads the poison, not the data */
    tpk_emu_configure("lockstep", true);
    poison_out();
    int n = caught([&] { pipe_kernel<2><<<1, NT, 2 * tile>>>(d_out, d_x); }, &msg);
    cudaGetLastError();
    report(
        !out_ok(sum),
        "emulation: a cp.async tile read before its wait reads the poison (NaN), not the data "
        "(reports: %s%s)",
        n ? msg : "none", "");

    /* without the detector, the missing barrier gives a wrong answer under some schedule */
    int wrong = 0;
    for (const char *sc : warps) {
        tpk_emu_configure(sc, false);
        poison_out();
        caught([&] { reuse_kernel<false><<<1, NT, tile>>>(d_out, d_x); }, &msg);
        wrong += !out_ok(sum);
        poison_out();
        caught([&] { war_kernel<false><<<1, NT>>>(d_out, d_x); }, &msg);
        wrong += !out_ok(dbl);
    }
    report(
        wrong == 4,
        "emulation: the missing barriers give wrong answers under the asc and desc schedules (%s "
        "of 4 runs wrong)%s",
        wrong == 0   ? "none"
        : wrong == 1 ? "1"
        : wrong == 2 ? "2"
        : wrong == 3 ? "3"
                     : "4",
        "");
    tpk_emu_configure("lockstep", true);

    /* launch checks */
    int nx = CHUNKS * NT;
    n = caught([&] { copy_kernel<<<1, 1025, 0>>>(d_out, d_x, NT, 0); }, &msg);
    report(n > 0 && cudaGetLastError() == cudaErrorInvalidConfiguration,
           "emulation: a block of 1025 threads is refused: %s%s", msg, "");
    n = caught([&] { copy_kernel<<<dim3(1, 65536), 32, 0>>>(d_out, d_x, NT, 0); }, &msg);
    report(n > 0 && cudaGetLastError() == cudaErrorInvalidConfiguration,
           "emulation: a grid of 65536 blocks in y is refused: %s%s", msg, "");
    n = caught([&] { copy_kernel<<<1, NT, 64 << 10>>>(d_out, d_x, NT, 0); }, &msg);
    report(
        n > 0 && strstr(msg, "cudaFuncAttributeMaxDynamicSharedMemorySize") &&
            cudaGetLastError() != cudaSuccess,
        "emulation: 64 KiB of dynamic shared memory without the kernel's attribute is refused: "
        "%s%s",
        msg, "");
    cudaFuncSetAttribute(copy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10);
    poison_out();
    n = caught([&] { copy_kernel<<<1, NT, 64 << 10>>>(d_out, d_x, NT, 0); }, &msg);
    report(n == 0 && cudaGetLastError() == cudaSuccess && out_ok(g_x),
           "emulation: 64 KiB of dynamic shared memory with the attribute runs%s%s", "", "");
    n = caught([&] { copy_kernel<<<1, NT, 240 << 10>>>(d_out, d_x, NT, 0); }, &msg);
    report(n > 0 && cudaGetLastError() != cudaSuccess,
           "emulation: 240 KiB of dynamic shared memory (above sm_90's 227) is refused: %s%s", msg,
           "");

    /* global accesses outside every allocation: a float and a 16-byte vector one past the end */
    n = caught([&] { copy_kernel<<<3, NT, tile>>>(d_out, d_x, nx - NT, NT); }, &msg);
    report(n == 0 && cudaGetLastError() == cudaSuccess,
           "emulation: reads up to an allocation's last element pass%s%s", "", "");
    n = caught([&] { copy_kernel<<<3, NT, tile>>>(d_out, d_x, nx - NT + 1, NT); }, &msg);
    report(n > 0 && strstr(msg, "outside every live") && cudaGetLastError() != cudaSuccess,
           "emulation: a read one float past an allocation is reported: %s%s", msg, "");
    n = caught([&] { vec_kernel<<<1, 32>>>((float4 *)d_out, (const float4 *)d_x, 1, nx / 4); },
               &msg);
    report(n > 0 && strstr(msg, "16-byte read") && cudaGetLastError() != cudaSuccess,
           "emulation: a 16-byte read past an allocation is reported: %s%s", msg, "");

    /* movmatrix.trans against a plain transpose, under each schedule */
    for (const char *sc : scheds) {
        tpk_emu_configure(sc, true);
        float tr[NT];
        for (int i = 0; i < NT; i++) {
            uint32_t v;
            memcpy(&v, &g_x[(i & ~63) + 8 * (i % 8) + (i % 64) / 8], 4);
            v &= 0xffff0000u;
            memcpy(&tr[i], &v, 4);
        }
        poison_out();
        n = caught([&] { movt_kernel<<<1, NT / 2>>>(d_out, d_x); }, &msg);
        report(
            n == 0 && out_ok(tr) && cudaGetLastError() == cudaSuccess,
            "emulation: movt_kernel (movmatrix.trans) gives the transpose of an 8x8 bf16 matrix, "
            "schedule %s%s",
            sc, "");
    }

    cudaFree(d_x);
    cudaFree(d_out);
    return g_failed ? 1 : 0;
}
