/* tests/gpu/emu/tpk_emu.h — the CUDA surface that kernels/cuda/ uses, emulated on the CPU, so the
 * CUDA backend compiles as plain C++17 with g++ and runs without nvcc or a GPU (make
 * $(B)/tests/gpu_emu_ops; the shim headers cuda_runtime.h, cuda_bf16.h, cublasLt.h, cublas_v2.h
 * and cub/device/device_radix_sort.cuh next to this file include it).
 *
 * Device memory is host memory; a stream runs everything synchronously (a kernel runs to completion
 * at its launch, an event has passed as soon as it is recorded). A kernel launch (rewritten by
 * cu2cpp.pl into tpk_emu_launch) runs the blocks one after another; the threads of a block are
 * fibers on one host thread (runtime.cpp), switched at __syncthreads and at the warp-synchronous
 * instructions (shuffles, __syncwarp, the tensor-core mma of flash.cuh), which are emulated from
 * their PTX definitions: each lane posts its operand, the warp waits for all its lanes, then each
 * lane reads what the instruction gives it. TPK_EMU_SCHED picks the order between barriers:
 * lockstep (default; every ready thread in turn, ascending or descending by block) or asc / desc /
 * random[:seed] (each warp alone from barrier to barrier, the warps in that order), so a missing
 * barrier reads the other warps' data before it is written under some schedule. TPK_EMU_RACE=1
 * turns on the shared-memory race detector of the checked build (the converted kernels compiled
 * with the thread sanitizer's access instrumentation: runtime.cpp's callbacks see every load and
 * store; two warps on one shared byte between barriers, one writing: "FAIL emu: race ..."; there a
 * global access outside every live allocation is a FAIL line too, always). Shared memory (static
 * __shared__ arrays and the dynamic buffer) is poisoned (NaN) at each block's start; the dynamic
 * buffer has a NaN guard zone after it, checked at the block's end. A block that cannot go on
 * (threads waiting at different barriers), a warp instruction with lanes missing, a divergent warp,
 * a launch the hardware refuses and a misuse of the runtime API print a "FAIL emu: ..." line
 * (counted by tests/run.sh) and make the launch fail. docs/DESIGN.md section 7 says what is not
 * emulated. */
#ifndef TPK_EMU_H
#define TPK_EMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <math.h>

/* ---- qualifiers ------------------------------------------------------------------------------ */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
/* cu2cpp.pl rewrites every __shared__ declaration (tpk_emu_shared, tpk_emu_dyn_smem); one it
 * missed would still be a function-local static, shared by the blocks that run one by one */
#define __shared__ static
#define TPK_EMU 1

/* ---- errors, handles ------------------------------------------------------------------------- */
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchTimeout = 702,
    cudaErrorLaunchFailure = 719,
};
typedef cudaError_t cudaError;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
enum cudaDataType_t {
    CUDA_R_16F = 2,
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16BF = 14,
    CUDA_R_32I = 10,
    CUDA_R_8F_E4M3 = 28,
    CUDA_R_8F_E5M2 = 29
};
typedef cudaDataType_t cudaDataType;
#define cudaStreamDefault 0x00u
#define cudaStreamNonBlocking 0x01u
#define cudaEventDefault 0x00u
#define cudaEventBlockingSync 0x01u
#define cudaEventDisableTiming 0x02u
#define cudaHostAllocDefault 0x00u

struct CUstream_st;
struct CUevent_st;
typedef CUstream_st *cudaStream_t;
typedef CUevent_st *cudaEvent_t;

/* the emulated device's properties (one device: an sm_90 part with H100's limits) */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin;
    int warpSize, maxThreadsPerBlock, maxGridSize[3], maxThreadsDim[3], major, minor,
        multiProcessorCount, l2CacheSize;
};

/* ---- vector types ---------------------------------------------------------------------------- */
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
/* the 16-byte vectors check their addresses when copied: a 16-byte load or store from an address
 * not 16-byte aligned faults on the GPU (misaligned address), where the CPU would not mind */
void tpk_emu_misaligned(const void *p, const char *what);
template <class E> struct __attribute__((aligned(16))) tpk_emu_vec4 {
    E x, y, z, w;
    tpk_emu_vec4() = default;
    constexpr tpk_emu_vec4(E a, E b, E c, E d) : x(a), y(b), z(c), w(d) {}
    tpk_emu_vec4(const tpk_emu_vec4 &o) { copy(this, &o); }
    tpk_emu_vec4 &operator=(const tpk_emu_vec4 &o) {
        copy(this, &o);
        return *this;
    }
    static void copy(tpk_emu_vec4 *d, const tpk_emu_vec4 *s) {
        uintptr_t du = (uintptr_t)d, su = (uintptr_t)s;
        if (su % 16) tpk_emu_misaligned(s, "16-byte load");
        if (du % 16) tpk_emu_misaligned(d, "16-byte store");
        memmove((void *)du, (const void *)su, 16); /* through integers: no alignment assumed */
    }
};
typedef tpk_emu_vec4<unsigned> uint4;
typedef tpk_emu_vec4<int> int4;
typedef tpk_emu_vec4<float> float4;
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct __attribute__((aligned(8))) float2 { float x, y; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

/* ---- bf16 (cuda_bf16.h): round to nearest even; NaN -> the canonical 0x7fff, as cvt.rn.bf16.f32
 * ---- */
static inline unsigned short tpk_emu_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static inline float tpk_emu_bf2f(unsigned short h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
struct __attribute__((aligned(2))) __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(tpk_emu_f2bf(f)) {}
    operator float() const { return tpk_emu_bf2f(__x); }
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    __nv_bfloat16 r;
    r.__x = tpk_emu_f2bf(f);
    return r;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return tpk_emu_bf2f(h.__x); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
static inline __nv_bfloat162 __float22bfloat162_rn(float2 f) {
    return __floats2bfloat162_rn(f.x, f.y);
}
static inline float2 __bfloat1622float2(__nv_bfloat162 h) {
    return float2{__bfloat162float(h.x), __bfloat162float(h.y)};
}

/* ---- math intrinsics (device functions with a host counterpart) ------------------------------ */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
/* atomicMax on global memory: a block's threads are fibers that switch only at barriers and warp
 * operations, and the blocks of a launch run one at a time, so a plain read-modify-write */
static inline int atomicMax(int *p, int v) {
    int o = *p;
    if (v > o) *p = v;
    return o;
}
template <class T> static inline T __ldg(const T *p) { return *p; }

/* ---- the kernel side ------------------------------------------------------------------------- */
/* the running thread's coordinates (set by the block scheduler before it resumes a thread) */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
enum { warpSize = 32 };

/* a warp's exchange area for one warp-synchronous instruction: each lane's posted bytes and, for
 * the mma, the 16x8 product the instruction's last lane computed for the warp */
enum {
    TPK_EMU_SLOT = 32,
    TPK_EMU_SHFL = 1,
    TPK_EMU_SYNCWARP = 2,
    TPK_EMU_MMA = 3,
    TPK_EMU_LDSM = 4,
    TPK_EMU_MOVM = 5
};
struct tpk_emu_xchg {
    unsigned char lane[32][TPK_EMU_SLOT];
    unsigned seq[32];   /* the lane's count of warp instructions when it posted: a lane that did not
                           post is stale */
    int kind[32];
    float result[16][8];
};
/* post `bytes` of this lane for instruction `kind`, wait for every lane of the warp, and return the
 * exchange (complete: run once, by the last lane, on the posted data); *seq: this lane's count */
const tpk_emu_xchg &tpk_emu_warp_op(int kind, const void *data, size_t bytes,
                                    void (*complete)(tpk_emu_xchg &), unsigned *seq);
/* this lane's partner `src` posted for the same instruction (else: a FAIL line, and false) */
bool tpk_emu_lane_ok(const tpk_emu_xchg &x, int src, unsigned seq, const char *what);
void tpk_emu_check_mask(unsigned mask, const char *what);
void __syncthreads();
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    unsigned seq;
    tpk_emu_check_mask(mask, "__syncwarp");
    tpk_emu_warp_op(TPK_EMU_SYNCWARP, NULL, 0, NULL, &seq);
}
static inline unsigned tpk_emu_laneid() {
    return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31u;
}
/* value of lane src (width: CUDA's segments; a source outside the caller's segment gives its own
 * value — for __shfl_xor_sync the programming guide lets an earlier segment be read: no kernel here
 * shuffles with width < 32) */
template <class T>
static inline T tpk_emu_shfl(T v, int lane, int src, int width, const char *what) {
    static_assert(sizeof(T) <= TPK_EMU_SLOT && std::is_trivially_copyable<T>::value,
                  "a shuffled value");
    unsigned seq;
    const tpk_emu_xchg &x = tpk_emu_warp_op(TPK_EMU_SHFL, &v, sizeof v, NULL, &seq);
    int seg = lane & ~(width - 1);
    if (src < seg || src >= seg + width || src > 31) return v;
    T r;
    if (!tpk_emu_lane_ok(x, src, seq, what)) return v;
    memcpy(&r, x.lane[src], sizeof r);
    return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    tpk_emu_check_mask(mask, "__shfl_xor_sync");
    int lane = (int)tpk_emu_laneid();
    return tpk_emu_shfl(v, lane, lane ^ m, width, "__shfl_xor_sync");
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    tpk_emu_check_mask(mask, "__shfl_sync");
    int lane = (int)tpk_emu_laneid();
    return tpk_emu_shfl(v, lane, (lane & ~(width - 1)) + (src & (width - 1)), width, "__shfl_sync");
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    tpk_emu_check_mask(mask, "__shfl_down_sync");
    int lane = (int)tpk_emu_laneid();
    return tpk_emu_shfl(v, lane, lane + (int)d, width, "__shfl_down_sync");
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    tpk_emu_check_mask(mask, "__shfl_up_sync");
    int lane = (int)tpk_emu_laneid();
    return tpk_emu_shfl(v, lane, lane - (int)d, width, "__shfl_up_sync");
}

/* shared memory: a static __shared__ array is poisoned (NaN) when the block's first thread reaches
 * its declaration; the dynamic buffer (extern __shared__) is the launch's, poisoned at each
 * block */
void tpk_emu_shared(void *p, size_t bytes, const char *name);
void *tpk_emu_dyn_smem_raw();
template <class T>
static inline T *tpk_emu_dyn_smem() {
    return static_cast<T *>(tpk_emu_dyn_smem_raw());
}

/* the kernel's first statement (cu2cpp.pl inserts it, with the kernel's address): its accesses are
 * checked from here on, and the launch's dynamic shared memory against the kernel's attribute */
void tpk_emu_kernel_enter(const void *kernel);

/* ---- launches -------------------------------------------------------------------------------- */
struct tpk_emu_cfg_t {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
static inline tpk_emu_cfg_t tpk_emu_cfg(dim3 grid, dim3 block, size_t smem = 0,
                                        cudaStream_t stream = 0) {
    return tpk_emu_cfg_t{grid, block, smem, stream};
}
/* runs body(arg) as every thread of every block; a bad configuration or a failed block sets the
 * error cudaGetLastError returns */
void tpk_emu_run(const char *name, const tpk_emu_cfg_t &cfg, void (*body)(void *), void *arg);
template <class F>
static inline void tpk_emu_launch(const char *name, const tpk_emu_cfg_t &cfg, F &&f) {
    typedef typename std::remove_reference<F>::type Fn;
    tpk_emu_run(name, cfg, [](void *p) { (*static_cast<Fn *>(p))(); }, (void *)&f);
}

/* the grid of a grid-stride launch (kernels/cuda/common.cuh's tpk__grid_for): g, or at most
 * TPK_EMU_GRID_CAP blocks when that is set, so every grid-stride loop of a test takes several
 * trips */
size_t tpk_emu_grid_cap(size_t g);

/* ---- the runtime API (runtime.cpp) ----------------------------------------------------------- */
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t bytes);
template <class T>
static inline cudaError_t cudaMalloc(T **p, size_t bytes) {
    return cudaMalloc(reinterpret_cast<void **>(p), bytes);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
template <class T>
static inline cudaError_t cudaHostAlloc(T **p, size_t bytes, unsigned flags) {
    return cudaHostAlloc(reinterpret_cast<void **>(p), bytes, flags);
}
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = 0);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t tpk_emu_func_attr(const void *f, cudaFuncAttribute attr, int value);
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *f, cudaFuncAttribute attr, int value) {
    return tpk_emu_func_attr(reinterpret_cast<const void *>(f), attr, value);
}

/* the emulator's own checks: where a device range [p, p + bytes) lies in a cudaMalloc allocation,
 * a FAIL line otherwise (used by the cuBLASLt and cub emulations) */
bool tpk_emu_check_device(const void *p, size_t bytes, const char *what);
/* print "FAIL emu: ..." (counted by tests/run.sh) and count it */
void tpk_emu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tpk_emu_set_error(cudaError_t e);
/* the emulation's own tests (tests/gpu/emu/race_test.cpp): between begin and end a problem found is
 * printed as "(expected) emu: ..." and counted, not failed; end returns the count and the first */
void tpk_emu_expect_begin();
int tpk_emu_expect_end(const char **first);
/* set the schedule (a TPK_EMU_SCHED value) and the race detector, as the environment would; false
 * (nothing changed) when the schedule is not one */
bool tpk_emu_configure(const char *schedule, bool race);

/* ---- the tensor-core attention's hooks (kernels/cuda/flash.cuh with TPK_FLASH_EMU) ----------- */
#ifdef TPK_FLASH_EMU
#define TPK__FL_SMEM(T, name) T *name = tpk_emu_dyn_smem<T>()
#define TPK__FL_UNROLL
#define TPK__FL_UNROLL2
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, from the PTX ISA's fragment layouts
 * (lane = 4 g + t): A 16x16 a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..);
 * B 16x8 b0 (k = 2t..2t+1, n = g) b1 (k = 2t+8.., n = g); C c0, c1 (g, 2t..2t+1) c2, c3 (g+8,
 * ..) */
void tpk_emu_mma_complete(tpk_emu_xchg &x);
static inline void tpk__fl_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    uint32_t regs[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    unsigned seq;
    const tpk_emu_xchg &x =
        tpk_emu_warp_op(TPK_EMU_MMA, regs, sizeof regs, tpk_emu_mma_complete, &seq);
    int lane = (int)tpk_emu_laneid(), g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 4; e++) d[e] += x.result[g + 8 * (e >> 1)][2 * t + (e & 1)];
}
static inline uint32_t tpk__fl_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, 4);
    return r;
}
static inline float tpk__fl_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
/* cp.async: the destination reads as poison (NaN) from the issue, and the 16 bytes land at the
 * thread's next wait_group 0 after a commit_group closed the group holding them (as late as the
 * instruction allows), so a tile read before its wait and barrier, copied without a commit, or
 * overwritten by the next tile's copy while still read (one buffer) reads NaN */
void tpk__fl_cp16(void *dst, const void *src, bool valid);
void tpk__fl_commit();
void tpk__fl_wait_all();
/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16, from the PTX ISA: lane l posts the address of
 * row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned, in the block's dynamic shared memory); r[i]
 * = matrix i's (row g, columns 2t, 2t + 1), or with .trans (rows 2t, 2t + 1, column g), lower index
 * in the low half */
void tpk_emu_ldsm_check(const void *row);
template <bool TRANS> static inline void tpk__fl_ldsm4(uint32_t r[4], const uint16_t *row) {
    unsigned seq;
    tpk_emu_ldsm_check(row);
    const tpk_emu_xchg &x = tpk_emu_warp_op(TPK_EMU_LDSM, &row, sizeof row, NULL, &seq);
    int lane = (int)tpk_emu_laneid(), g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const uint16_t *rows[8];
        for (int j = 0; j < 8; j++) {
            if (!tpk_emu_lane_ok(x, 8 * i + j, seq, "ldmatrix")) return;
            memcpy(&rows[j], x.lane[8 * i + j], sizeof rows[j]);
        }
        uint16_t lo = TRANS ? rows[2 * t][g] : rows[g][2 * t],
                 hi = TRANS ? rows[2 * t + 1][g] : rows[g][2 * t + 1];
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
}
/* movmatrix.sync.aligned.m8n8.trans.b16, from the PTX ISA: lane 4 r + c / 2 holds elements (r, c),
 * (r, c + 1) of an 8x8 b16 matrix (c even, lower column in the low half); the result is the
 * transpose in the same layout: lane 4 g + t gets (2 t, g), (2 t + 1, g) of the input */
static inline uint32_t tpk__fl_movt(uint32_t a) {
    unsigned seq;
    const tpk_emu_xchg &x = tpk_emu_warp_op(TPK_EMU_MOVM, &a, sizeof a, NULL, &seq);
    int lane = (int)tpk_emu_laneid(), g = lane >> 2, t = lane & 3;
    uint32_t half[2];
    for (int k = 0; k < 2; k++) { /* input row 2 t + k, column g: lane 4 (2 t + k) + g / 2, half g %
                                     2 */
        int src = 4 * (2 * t + k) + (g >> 1);
        if (!tpk_emu_lane_ok(x, src, seq, "movmatrix")) return 0;
        uint32_t v;
        memcpy(&v, x.lane[src], sizeof v);
        half[k] = (g & 1) ? v >> 16 : v & 0xffffu;
    }
    return half[0] | half[1] << 16;
}
/* atomicAdd of two neighbouring floats: the blocks of a launch run one at a time, so plain adds */
static inline void tpk__fl_red2(float *p, float a, float b) { p[0] += a, p[1] += b; }
#endif

#endif /* TPK_EMU_H */
