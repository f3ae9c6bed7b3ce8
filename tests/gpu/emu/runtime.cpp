/* tests/gpu/emu/runtime.cpp — the emulated CUDA runtime (tpk_emu.h): one device (an sm_90 part),
 * device memory in host memory (256-byte aligned, poisoned with NaN when allocated and freed),
 * streams and events that complete at once, the runtime API's argument checks that matter to the
 * backend (device ranges inside allocations, pitches, stream and event handles, timing flags), and
 * the block scheduler that runs a kernel's threads as fibers.
 *
 * The scheduler: a launch runs its blocks one after another; a block's threads are fibers with
 * their own stacks (a small context switch on x86-64, ucontext elsewhere; AddressSanitizer is told
 * about the switches), run one at a time until they reach a barrier or end, in the order
 * TPK_EMU_SCHED picks (run_lockstep, run_warps). __syncthreads lets the
 * block go on when every live thread has arrived; a warp instruction when every live lane of the
 * warp has posted its operand (the exchange areas are double-buffered by the lane's count of warp
 * instructions, so one barrier per instruction suffices and a lane that is one instruction
 * ahead or behind is caught). A block whose threads all wait but at different barriers is reported
 * (it would hang on the GPU), as is a warp instruction after some of the warp's lanes exited.
 *
 * The checks of memory accesses: in the checked build the kernels are compiled with
 * -fsanitize=thread, whose instrumentation calls __tsan_read4 (and the like) before each load and
 * store; this file defines
 * those callbacks (no sanitizer runtime is linked): a shared byte goes to the race detector
 * (race_check: per byte the last write's barrier interval and warp, the interval's readers), any
 * other address must be the thread's stack, the program's statics or a live allocation
 * (global_check). The launching thread's accesses before the kernel's first statement (the launch's
 * arguments) and host code are not checked. */
#include "tpk_emu.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define TPK_EMU_ASAN 1
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

/* ---- reports --------------------------------------------------------------------------------- */

static int g_fails;
static unsigned long long g_mma; /* mma.sync instructions emulated (per warp), for
                                    TPK_EMU_PROFILE */
static void emu_summary() {
    if (g_fails)
        printf("FAIL emu: %d problem%s found by the CUDA emulation (the lines above)\n", g_fails,
               g_fails == 1 ? "" : "s");
    fflush(stdout);
}
static bool g_expecting;  /* tpk_emu_expect_begin .. _end: reports are the test's expectation */
static int g_expected;
static char g_expected_msg[512];
void tpk_emu_fail(const char *fmt, ...) {
    static bool once;
    va_list ap;
    va_start(ap, fmt);
    if (g_expecting) {
        char msg[512];
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (!g_expected++) snprintf(g_expected_msg, sizeof g_expected_msg, "%s", msg);
        printf("  (expected) emu: %s\n", msg);
        fflush(stdout);
        return;
    }
    if (!once) once = true, atexit(emu_summary);
    if (++g_fails > 30) {
        va_end(ap);
        return;
    }
    fflush(stdout);
    printf("FAIL emu: ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}
void tpk_emu_expect_begin() {
    g_expecting = true, g_expected = 0, g_expected_msg[0] = 0;
}
int tpk_emu_expect_end(const char **first) {
    g_expecting = false;
    if (first) *first = g_expected_msg;
    return g_expected;
}
static thread_local cudaError_t g_last = cudaSuccess;
void tpk_emu_set_error(cudaError_t e) {
    if (e != cudaSuccess) g_last = e;
}
static cudaError_t ret(cudaError_t e) {
    tpk_emu_set_error(e);
    return e;
}
cudaError_t cudaGetLastError() {
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return g_last; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define N(x) \
    case x: return #x;
        N(cudaSuccess)
        N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInitializationError)
            N(cudaErrorInvalidConfiguration) N(cudaErrorInvalidPitchValue)
                N(cudaErrorInvalidDevicePointer) N(cudaErrorInvalidMemcpyDirection)
                    N(cudaErrorNoDevice) N(cudaErrorInvalidDevice) N(cudaErrorInvalidResourceHandle)
                        N(cudaErrorNotReady) N(cudaErrorIllegalAddress)
                            N(cudaErrorLaunchOutOfResources) N(cudaErrorLaunchTimeout)
                                N(cudaErrorLaunchFailure)
#undef N
    }
    return "cudaErrorUnknown";
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure (emulation: see the FAIL emu line)";
    case cudaErrorLaunchTimeout: return "the launch timed out (emulation: the block cannot go on)";
    default: return cudaGetErrorName(e);
    }
}

/* ---- device ---------------------------------------------------------------------------------- */

/* shared memory per block: 48 KiB without opting in, up to 227 KiB (sm_90) with it; a smaller GPU's
 * limit from TPK_EMU_SMEM_OPTIN (bytes, e.g. 101376: the 99 KiB of sm_86/89) */
enum { SMEM_DEFAULT = 48 * 1024 };
static int smem_optin() {
    static int v = [] {
        const char *e = getenv("TPK_EMU_SMEM_OPTIN");
        return e && atoi(e) >= SMEM_DEFAULT ? atoi(e) : 232448;
    }();
    return v;
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
static int g_device;
cudaError_t cudaGetDevice(int *d) {
    *d = g_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d != 0) return ret(cudaErrorInvalidDevice);
    g_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
    if (device != 0) return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "tpk CPU emulation of an sm_90 GPU (H100 limits)");
    p->totalGlobalMem = (size_t)80 << 30, p->sharedMemPerBlock = SMEM_DEFAULT,
    p->sharedMemPerBlockOptin = smem_optin();
    p->warpSize = 32, p->maxThreadsPerBlock = 1024, p->major = 9, p->minor = 0,
    p->multiProcessorCount = 132, p->l2CacheSize = 50 << 20;
    p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int device) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return ret(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrL2CacheSize: *v = p.l2CacheSize; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    default: return ret(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

/* ---- memory ---------------------------------------------------------------------------------- */

static std::mutex g_mem_mutex;
static std::map<uintptr_t, size_t> g_dev, g_pinned; /* base -> bytes */

/* the allocation of `m` holding [p, p + bytes), or NULL */
static bool in_alloc(const std::map<uintptr_t, size_t> &m, const void *p, size_t bytes) {
    uintptr_t u = (uintptr_t)p;
    auto it = m.upper_bound(u);
    if (it == m.begin()) return false;
    --it;
    return u >= it->first && u + bytes <= it->first + (it->second ? it->second : 1);
}
bool tpk_emu_check_device(const void *p, size_t bytes, const char *what) {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    if (!bytes || in_alloc(g_dev, p, bytes)) return true;
    tpk_emu_fail("%s: device range %p + %zu bytes is not inside one cudaMalloc allocation", what, p,
                 bytes);
    return false;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = NULL;
    if (!bytes) return cudaSuccess;
    void *q = NULL;
    if (posix_memalign(&q, 256, bytes) != 0) return ret(cudaErrorMemoryAllocation);
    memset(q, 0xff, bytes); /* uninitialised device memory reads as NaN */
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    g_dev[(uintptr_t)q] = bytes;
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    auto it = g_dev.find((uintptr_t)p);
    if (it == g_dev.end()) {
        tpk_emu_fail("cudaFree(%p): not an allocation of cudaMalloc", p);
        return ret(cudaErrorInvalidValue);
    }
    memset(p, 0xff, it->second);
    g_dev.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    *p = malloc(bytes ? bytes : 1);
    if (!*p) return ret(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    g_pinned[(uintptr_t)*p] = bytes;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    if (!g_pinned.erase((uintptr_t)p)) {
        tpk_emu_fail("cudaFreeHost(%p): not an allocation of cudaHostAlloc", p);
        return ret(cudaErrorInvalidValue);
    }
    free(p);
    return cudaSuccess;
}

/* ---- streams, events ------------------------------------------------------------------------- */

struct CUstream_st {
    unsigned flags;
};
struct CUevent_st {
    unsigned flags;
    bool recorded;
    std::chrono::steady_clock::time_point t;
};
static std::vector<CUstream_st *> g_streams;
static std::vector<CUevent_st *> g_events;
static bool stream_ok(cudaStream_t s, const char *what) {
    if (!s || std::find(g_streams.begin(), g_streams.end(), s) != g_streams.end()) return true;
    tpk_emu_fail("%s: stream %p is not a live stream", what, (void *)s);
    return false;
}
static bool event_ok(cudaEvent_t e, const char *what) {
    if (e && std::find(g_events.begin(), g_events.end(), e) != g_events.end()) return true;
    tpk_emu_fail("%s: event %p is not a live event", what, (void *)e);
    return false;
}
/* a handle made and registered as live, and one unregistered and freed (streams, events) */
template <class H> static cudaError_t handle_new(std::vector<H> &live, H *out, H h) {
    *out = h;
    live.push_back(h);
    return cudaSuccess;
}
template <class H> static cudaError_t handle_delete(std::vector<H> &live, H h) {
    auto it = std::find(live.begin(), live.end(), h);
    if (!h || it == live.end()) return ret(cudaErrorInvalidResourceHandle);
    live.erase(it);
    delete h;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    return handle_new(g_streams, s, new CUstream_st{flags});
}
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { return handle_delete(g_streams, s); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    return stream_ok(s, "cudaStreamSynchronize") ? cudaSuccess
                                                 : ret(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    return stream_ok(s, "cudaStreamQuery") ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    return stream_ok(s, "cudaStreamWaitEvent") && event_ok(e, "cudaStreamWaitEvent")
               ? cudaSuccess
               : ret(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    return handle_new(g_events, e, new CUevent_st{flags, false, {}});
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) { return handle_delete(g_events, e); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!event_ok(e, "cudaEventRecord") || !stream_ok(s, "cudaEventRecord"))
        return ret(cudaErrorInvalidResourceHandle);
    e->recorded = true, e->t = std::chrono::steady_clock::now();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    return event_ok(e, "cudaEventSynchronize") ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    return event_ok(e, "cudaEventQuery") ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!event_ok(a, "cudaEventElapsedTime") || !event_ok(b, "cudaEventElapsedTime"))
        return ret(cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming)
        return ret(cudaErrorInvalidResourceHandle); /* as CUDA: no timing on such events */
    if (!a->recorded || !b->recorded) return ret(cudaErrorInvalidResourceHandle);
    *ms = (float)std::chrono::duration<double, std::milli>(b->t - a->t).count();
    return cudaSuccess;
}

/* ---- copies ---------------------------------------------------------------------------------- */

static bool ranges_ok(void *dst, const void *src, size_t dbytes, size_t sbytes, cudaMemcpyKind kind,
                      const char *what) {
    bool ok = true;
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
        ok &= tpk_emu_check_device(dst, dbytes, what);
    if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice)
        ok &= tpk_emu_check_device(src, sbytes, what);
    return ok;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
    if (!stream_ok(s, "cudaMemcpyAsync")) return ret(cudaErrorInvalidResourceHandle);
    if ((unsigned)kind > cudaMemcpyDefault) return ret(cudaErrorInvalidMemcpyDirection);
    if (!bytes) return cudaSuccess;
    if (!dst || !src) return ret(cudaErrorInvalidValue);
    if (!ranges_ok(dst, src, bytes, bytes, kind, "cudaMemcpyAsync"))
        return ret(cudaErrorInvalidValue);
    uintptr_t d = (uintptr_t)dst, r = (uintptr_t)src;
    if (dst != src && d < r + bytes && r < d + bytes)
        tpk_emu_fail("cudaMemcpyAsync: overlapping ranges %p, %p (%zu bytes): undefined", dst, src,
                     bytes);
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, bytes, kind, 0);
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s) {
    if (!stream_ok(s, "cudaMemcpy2DAsync")) return ret(cudaErrorInvalidResourceHandle);
    if (width > dpitch || width > spitch) return ret(cudaErrorInvalidPitchValue);
    if (!width || !height) return cudaSuccess;
    if (!ranges_ok(dst, src, dpitch * (height - 1) + width, spitch * (height - 1) + width, kind,
                   "cudaMemcpy2DAsync"))
        return ret(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
    if (!stream_ok(s, "cudaMemsetAsync")) return ret(cudaErrorInvalidResourceHandle);
    if (!bytes) return cudaSuccess;
    if (!tpk_emu_check_device(p, bytes, "cudaMemsetAsync")) return ret(cudaErrorInvalidValue);
    memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t bytes) { return cudaMemsetAsync(p, v, bytes, 0); }

static std::map<const void *, int> g_func_smem;
cudaError_t tpk_emu_func_attr(const void *f, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > smem_optin()) return ret(cudaErrorInvalidValue);
        g_func_smem[f] = value;
    }
    return cudaSuccess;
}

/* ---- schedules, the race detector's switch --------------------------------------------------- */

/* TPK_EMU_SCHED: the order a block's threads run in between barriers.
 *   lockstep (default): every ready thread in turn until it blocks (a barrier or a warp-synchronous
 *     instruction), ascending or descending by block, so the warps stay within one warp instruction
 *     of each other;
 *   asc, desc, random[:seed]: each warp alone from one __syncthreads to the next (its lanes lined
 *   up
 *     at its warp instructions), the warps in ascending, descending or a seeded random order drawn
 *     anew at every barrier; blocks ascending, descending, or alternating as in lockstep.
 * A kernel whose result depends on the order (a missing barrier, a read of another warp's data
 * before it is written) gives different answers under different schedules.
 * TPK_EMU_RACE=1: the shared-memory race detector (needs the kernels compiled with the access
 * instrumentation, see the hooks below: the Makefile's checked build, libtpk_cuda_emu_chk.a). */
enum SchedMode { SCHED_LOCKSTEP, SCHED_ASC, SCHED_DESC, SCHED_RANDOM };
struct SchedCfg {
    SchedMode mode;
    uint64_t rng; /* random: splitmix64 state, from the seed */
    bool race;
};
static SchedCfg g_sched_cfg;
static bool g_sched_ready;
/* parse a TPK_EMU_SCHED value into c.mode (and the seed); false when it is none */
static bool sched_parse(const char *e, SchedCfg &c) {
    if (!e || !*e || !strcmp(e, "lockstep")) c.mode = SCHED_LOCKSTEP;
    else if (!strcmp(e, "asc")) c.mode = SCHED_ASC;
    else if (!strcmp(e, "desc")) c.mode = SCHED_DESC;
    else if (!strncmp(e, "random", 6) && (!e[6] || e[6] == ':'))
        c.mode = SCHED_RANDOM, c.rng = e[6] ? strtoull(e + 7, NULL, 0) : 1;
    else return false;
    return true;
}
/* the configuration (read from the environment at the first use) */
static inline SchedCfg &sched() {
    if (__builtin_expect(!g_sched_ready, 0)) {
        g_sched_ready = true;
        g_sched_cfg = SchedCfg{SCHED_LOCKSTEP, 1, false};
        const char *e = getenv("TPK_EMU_SCHED"), *r = getenv("TPK_EMU_RACE");
        if (!sched_parse(e, g_sched_cfg))
            tpk_emu_fail("TPK_EMU_SCHED=%s: not lockstep, asc, desc or random[:seed]", e);
        g_sched_cfg.race = r && *r && strcmp(r, "0") != 0;
    }
    return g_sched_cfg;
}
bool tpk_emu_configure(const char *schedule, bool race) {
    SchedCfg c = sched();
    if (!sched_parse(schedule, c)) return false;
    c.race = race;
    g_sched_cfg = c;
    return true;
}
static uint64_t sched_rand() {
    uint64_t z = (sched().rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
size_t tpk_emu_grid_cap(size_t g) {
    static size_t cap = [] {
        const char *e = getenv("TPK_EMU_GRID_CAP");
        return e && atol(e) > 0 ? (size_t)atol(e) : (size_t)0;
    }();
    return cap && g > cap ? cap : g;
}
static bool g_instrumented; /* an instrumented object's constructor called __tsan_init */

/* ---- fibers ---------------------------------------------------------------------------------- */

namespace {
enum State { READY, RUNNING, WAIT_BAR, WAIT_WARP, DONE };
enum { STACK = 256 << 10, GUARD = 4096, MAX_THREADS = 1024, SMEM_GUARD = 4096 };
struct Copy {
    void *dst;
    const void *src;
    bool valid;
};
struct Fiber {
    void *sp;
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
    unsigned char *stack; /* lowest usable byte; STACK bytes */
    State state;
    uint3 tid;
    int warp, lane;
    unsigned wseq;
    std::vector<Copy> pending; /* cp.async copies not landed yet, oldest first */
    size_t committed;          /* the first `committed` of them are in closed groups
                                  (commit_group) */
    bool in_body;              /* past the kernel's entry (tpk_emu_kernel_enter): its accesses are
                                  checked */
    void *asan_fake;
};
/* a shared-memory range of the block: the dynamic buffer or one static __shared__ array */
struct Region {
    uintptr_t base;
    size_t bytes, shadow; /* shadow: its first byte's index in Sched::shadow */
    const char *name;
};
/* the race detector's record of one shared byte: the last write (barrier interval, warp, atomic?)
 * and the reads of the current interval (the first reader and another one, or NONE) */
enum { NONE = 0xffff };
struct Shadow {
    unsigned wep, rep;
    uint16_t wwarp, rwarp, rwarp2;
    bool watomic;
};
struct Warp {
    int size, live, arrived, kind;
    unsigned seq;
    void (*complete)(tpk_emu_xchg &);
    tpk_emu_xchg x[2];
};
struct Sched {
    Fiber fibers[MAX_THREADS];
    int nstacks;
    Warp warps[MAX_THREADS / 32];
    int nthreads, live, arrived;
    Fiber *cur;
    void *sched_sp;
#if !defined(__x86_64__)
    ucontext_t sched_uc;
#endif
    const void *main_lo;
    size_t main_size;
    const char *name;
    void (*body)(void *);
    void *arg;
    bool abort, told_lanes, told_diverge, failed;
    std::vector<unsigned char> dyn; /* the dynamic shared memory + its guard zone */
    size_t dyn_bytes;
    std::vector<Region> regions; /* the block's shared memory: [0] the dynamic buffer, then the
                                    static arrays seen */
    std::vector<Shadow> shadow;  /* the race detector's state of each shared byte (Region::shadow +
                                    offset) */
    unsigned epoch;              /* barrier intervals: +1 at each __syncthreads that lets the block
                                    go on and each block start */
    bool entered, told_race, told_oob;
    uintptr_t host_lo, host_hi; /* the launching thread's stack (the launch's lambda and what it
                                   captures) */
    unsigned long long launches;
};
Sched S;
std::mutex g_launch_mutex;
} // namespace

#if defined(__x86_64__)
/* tpk_emu_ctx_switch(save, to): push the callee-saved registers and the SSE / x87 control words,
 * save the stack pointer in *save, load `to` and pop the other context's */
extern "C" void tpk_emu_ctx_switch(void **save, void *to);
asm(".pushsection .text\n"
    ".globl tpk_emu_ctx_switch\n"
    ".type tpk_emu_ctx_switch,@function\n"
    "tpk_emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size tpk_emu_ctx_switch, .-tpk_emu_ctx_switch\n"
    ".popsection\n");
#endif

static void fiber_exit();
static void fiber_entry() {
#ifdef TPK_EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &S.main_lo, &S.main_size);
#endif
    S.body(S.arg);
    fiber_exit();
}
static void fiber_start(Fiber &f) {
#if defined(__x86_64__)
    uintptr_t top = ((uintptr_t)(f.stack + STACK)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 72);
    uint32_t csr[2] = {0x1f80u, 0x037fu}; /* MXCSR, x87 control word: the defaults */
    memcpy(sp, csr, 8);
    for (int r = 1; r <= 6; r++) sp[r] = 0; /* r15 .. rbp */
    sp[7] = (uint64_t)(uintptr_t)&fiber_entry;
    sp[8] = 0; /* fiber_entry's return address: it never returns */
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = STACK;
    f.uc.uc_link = NULL;
    makecontext(&f.uc, fiber_entry, 0);
#endif
}
static void switch_in(Fiber &f) {
#ifdef TPK_EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, f.stack, STACK);
#endif
#if defined(__x86_64__)
    tpk_emu_ctx_switch(&S.sched_sp, f.sp);
#else
    swapcontext(&S.sched_uc, &f.uc);
#endif
#ifdef TPK_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}
static void switch_out(bool exiting) {
    Fiber &f = *S.cur;
#ifdef TPK_EMU_ASAN
    __sanitizer_start_switch_fiber(exiting ? NULL : &f.asan_fake, S.main_lo, S.main_size);
#else
    (void)exiting;
#endif
#if defined(__x86_64__)
    tpk_emu_ctx_switch(&f.sp, S.sched_sp);
#else
    swapcontext(&f.uc, &S.sched_uc);
#endif
#ifdef TPK_EMU_ASAN
    __sanitizer_finish_switch_fiber(f.asan_fake, &S.main_lo, &S.main_size);
#endif
}
static void release_bar() {
    S.arrived = 0, S.epoch++;
    for (int i = 0; i < S.nthreads; i++)
        if (S.fibers[i].state == WAIT_BAR) S.fibers[i].state = READY;
}
static const char *kind_name(int k) {
    return k == TPK_EMU_SHFL       ? "shuffle"
           : k == TPK_EMU_SYNCWARP ? "__syncwarp"
           : k == TPK_EMU_LDSM     ? "ldmatrix"
           : k == TPK_EMU_MOVM     ? "movmatrix"
                                   : "mma.sync";
}
static void finish_warp(Warp &w, int wi) {
    if (w.live < 32 && !S.told_lanes) {
        S.told_lanes = true;
        tpk_emu_fail(
            "kernel %s, block (%u, %u, %u), warp %d: a %s with %d of 32 lanes present (lanes "
            "exited, or a partial warp): "
            "undefined with a full mask",
            S.name, blockIdx.x, blockIdx.y, blockIdx.z, wi, kind_name(w.kind), w.live);
    }
    if (w.complete) w.complete(w.x[w.seq & 1]);
    w.arrived = 0;
    for (int l = 0; l < w.size; l++) {
        Fiber &f = S.fibers[32 * wi + l];
        if (f.state == WAIT_WARP) f.state = READY;
    }
}
static void fiber_exit() {
    Fiber &f = *S.cur;
    f.state = DONE;
    f.pending.clear(), f.committed = 0;
    S.live--;
    Warp &w = S.warps[f.warp];
    w.live--;
    if (S.arrived > 0 && S.arrived == S.live) release_bar();
    if (w.arrived > 0 && w.arrived == w.live) finish_warp(w, f.warp);
    switch_out(true);
    abort(); /* never resumed */
}
static void in_kernel(const char *what) {
    if (S.cur) return;
    tpk_emu_fail("%s called outside a kernel", what);
    abort();
}

void __syncthreads() {
    in_kernel("__syncthreads");
    if (++S.arrived == S.live) {
        release_bar();
        if (sched().mode == SCHED_LOCKSTEP) return;
        S.cur->state = READY; /* the other schedules start the next interval with a new order of the
                                 warps */
    } else {
        S.cur->state = WAIT_BAR;
    }
    switch_out(false);
}
const tpk_emu_xchg &tpk_emu_warp_op(int kind, const void *data, size_t bytes,
                                    void (*complete)(tpk_emu_xchg &), unsigned *seqp) {
    in_kernel("a warp instruction");
    Fiber &f = *S.cur;
    Warp &w = S.warps[f.warp];
    unsigned seq = f.wseq++;
    *seqp = seq;
    tpk_emu_xchg &x = w.x[seq & 1];
    if (bytes) memcpy(x.lane[f.lane], data, bytes);
    x.seq[f.lane] = seq, x.kind[f.lane] = kind;
    if (w.arrived == 0) {
        w.seq = seq, w.kind = kind, w.complete = complete;
    } else if ((w.seq != seq || w.kind != kind) && !S.told_diverge) {
        S.told_diverge = true;
        tpk_emu_fail(
            "kernel %s, block (%u, %u, %u), warp %d: lanes at different warp instructions (lane "
            "%d: %s number %u; an earlier lane: "
            "%s number %u): a divergent warp-synchronous instruction",
            S.name, blockIdx.x, blockIdx.y, blockIdx.z, f.warp, f.lane, kind_name(kind), seq,
            kind_name(w.kind), w.seq);
        S.abort = true;
    }
    if (++w.arrived == w.live) {
        finish_warp(w, f.warp);
    } else {
        f.state = WAIT_WARP;
        switch_out(false);
    }
    return x;
}
bool tpk_emu_lane_ok(const tpk_emu_xchg &x, int src, unsigned seq, const char *what) {
    if (x.seq[src] == seq) return true;
    if (!S.told_lanes) {
        S.told_lanes = true;
        tpk_emu_fail(
            "kernel %s, block (%u, %u, %u): %s reads lane %d, which did not take part (exited)",
            S.name, blockIdx.x, blockIdx.y, blockIdx.z, what, src);
    }
    return false;
}
void tpk_emu_check_mask(unsigned mask, const char *what) {
    static bool told;
    if (mask == 0xffffffffu || told) return;
    told = true;
    tpk_emu_fail("kernel %s: %s with mask %#x: the emulation takes full masks only",
                 S.name ? S.name : "?", what, mask);
}
void tpk_emu_misaligned(const void *p, const char *what) {
    static std::string told;
    if (!S.cur) return; /* host code: a copy of a vector type on the host is not a device access */
    S.failed = true;
    if (told == S.name) return;
    told = S.name;
    tpk_emu_fail(
        "kernel %s, block (%u, %u, %u), thread %u: a %s at %p, not 16-byte aligned (a misaligned "
        "address on the GPU)",
        S.name, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, what, p);
}
/* ---- shared and global memory accesses: the race detector, the address checks ---------------- */

/* a static __shared__ array: poisoned and made a region of the block (its shadow bytes after the
 * dynamic buffer's and the arrays seen before) when the block's first thread reaches it */
void tpk_emu_shared(void *p, size_t bytes, const char *name) {
    in_kernel("a __shared__ declaration");
    for (const Region &r : S.regions)
        if (r.base == (uintptr_t)p) return;
    memset(p, 0xff, bytes);
    const Region &last = S.regions.back();
    S.regions.push_back(Region{(uintptr_t)p, bytes, last.shadow + last.bytes, name});
    if (S.shadow.size() < S.regions.back().shadow + bytes)
        S.shadow.resize(S.regions.back().shadow + bytes, Shadow{0, 0, NONE, NONE, NONE, false});
    size_t total = 0;
    for (const Region &r : S.regions) total += r.bytes;
    if (total > (size_t)smem_optin() && !S.told_oob) {
        S.told_oob = S.failed = true;
        tpk_emu_fail(
            "kernel %s: %zu bytes of shared memory (dynamic %zu + static), above the %d a block "
            "may have (too many resources on the GPU)",
            S.name, total, S.dyn_bytes, smem_optin());
    }
}
void *tpk_emu_dyn_smem_raw() {
    in_kernel("extern __shared__");
    return S.dyn.data();
}

enum { ACC_READ, ACC_WRITE, ACC_ATOMIC };
static const char *acc_name(int k) {
    return k == ACC_READ ? "read" : k == ACC_WRITE ? "wrote" : "atomically updated";
}
static void race_report(const Region &r, size_t off, int warp, int kind, int other,
                        int other_kind) {
    if (S.told_race) return;
    S.told_race = true;
    tpk_emu_fail(
        "race in kernel %s, block (%u, %u, %u): shared memory %s%s byte %zu: warp %d %s it and "
        "warp %d %s it in the same barrier "
        "interval (no __syncthreads between: %s)",
        S.name, blockIdx.x, blockIdx.y, blockIdx.z, r.name ? "array " : "",
        r.name ? r.name : "(dynamic)", off, other, acc_name(other_kind), warp, acc_name(kind),
        other_kind == ACC_READ ? "write-after-read"
        : kind == ACC_READ     ? "read-after-write"
                               : "write-after-write");
}
/* racecheck's rule: two different warps touching one byte in one barrier interval, at least one
 * writing, atomics with atomics aside; a warp's own lanes never race here (a warp's order is
 * __syncwarp's business, and its lanes run lined up at the warp instructions) */
static void race_check(const Region &r, size_t off, size_t n, int kind) {
    int w = S.cur->warp;
    unsigned ep = S.epoch;
    for (size_t i = 0; i < n; i++) {
        Shadow &b = S.shadow[r.shadow + off + i];
        if (kind == ACC_READ) {
            if (b.wep == ep && b.wwarp != w && !S.told_race)
                race_report(r, off + i, w, kind, b.wwarp, b.watomic ? ACC_ATOMIC : ACC_WRITE);
            if (b.rep != ep) b.rep = ep, b.rwarp = (uint16_t)w, b.rwarp2 = NONE;
            else if (b.rwarp != w) b.rwarp2 = (uint16_t)w;
        } else {
            if (b.wep == ep && b.wwarp != w && !(kind == ACC_ATOMIC && b.watomic))
                race_report(r, off + i, w, kind, b.wwarp, b.watomic ? ACC_ATOMIC : ACC_WRITE);
            else if (b.rep == ep && b.rwarp != w)
                race_report(r, off + i, w, kind, b.rwarp, ACC_READ);
            else if (b.rep == ep && b.rwarp2 != NONE && b.rwarp2 != w)
                race_report(r, off + i, w, kind, b.rwarp2, ACC_READ);
            b.wep = ep, b.wwarp = (uint16_t)w, b.watomic = kind == ACC_ATOMIC;
        }
    }
}

/* global memory: the ranges of live allocations found last (the launch clears them; nothing is
 * freed during a launch) */
static thread_local bool t_in_launch;
/* the ranges of the allocations found last, most recent first (cleared at each launch) */
enum { HITS = 16 };
static struct {
    uintptr_t lo, hi;
} g_hits[HITS];
extern "C" char __executable_start[], _end[];
static void oob_report(uintptr_t a, size_t n, int kind, const char *where) {
    S.failed = true;
    if (S.told_oob) return;
    S.told_oob = true;
    tpk_emu_fail(
        "kernel %s, block (%u, %u, %u), thread %u: a %zu-byte %s at %#lx, %s (an illegal address "
        "on the GPU)",
        S.name, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, n,
        kind == ACC_READ ? "read" : "write", (unsigned long)a, where);
}
static void global_check(uintptr_t a, size_t n, int kind) {
    for (int i = 0; i < HITS; i++)
        if (a - g_hits[i].lo < g_hits[i].hi - g_hits[i].lo && a + n <= g_hits[i].hi) {
            if (i) std::swap(g_hits[i], g_hits[0]);
            return;
        }
    /* the launching thread's stack (the arguments the launch's lambda captured) */
    if (a >= S.host_lo && a + n <= S.host_hi) return;
    if (a >= (uintptr_t)S.dyn.data() && a < (uintptr_t)S.dyn.data() + S.dyn.size())
        return oob_report(a, n, kind, "past the block's dynamic shared memory");
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    for (auto *m : {&g_dev, &g_pinned}) {
        auto it = m->upper_bound(a);
        if (it == m->begin()) continue;
        --it;
        if (a >= it->first && a + n <= it->first + it->second) {
            memmove(&g_hits[1], &g_hits[0], sizeof g_hits - sizeof g_hits[0]);
            g_hits[0] = {it->first, it->first + it->second};
            return;
        }
    }
    oob_report(a, n, kind, "outside every live cudaMalloc / cudaHostAlloc allocation");
}
/* every load and store of the kernels' code (compiled with the thread sanitizer's instrumentation,
 * whose callbacks below come here instead of to a sanitizer runtime) once the thread has entered
 * the kernel: its own stack passes, shared memory goes to the race detector, the rest must lie in
 * a live allocation (or the program's statics) */
static inline void on_access(const void *p, size_t n, int kind) {
    if (!t_in_launch) return;
    Fiber *f = S.cur;
    if (!f || !f->in_body) return;
    uintptr_t a = (uintptr_t)p;
    if (a - (uintptr_t)f->stack < STACK) return;
    /* shared memory: the dynamic buffer (on the heap) or a static array (in the program's image,
     * where the other statics pass: threadIdx and the like, the emulation's warp exchanges) */
    bool image = a - (uintptr_t)__executable_start < (uintptr_t)(_end - __executable_start);
    for (size_t i = image ? 1 : 0, nr = image ? S.regions.size() : 1; i < nr; i++) {
        const Region &r = S.regions[i];
        if (a - r.base < r.bytes) {
            if (a + n > r.base + r.bytes)
                return oob_report(a, n, kind, "past the end of a shared-memory array");
            if (sched().race) race_check(r, a - r.base, n, kind);
            return;
        }
    }
    if (!image) global_check(a, n, kind);
}
extern "C" {
void __tsan_init() { g_instrumented = true; }
void __tsan_func_entry(void *) {}
void __tsan_func_exit() {}
#define TPK_EMU_HOOKS(N)                                                  \
    void __tsan_read##N(void *p) { on_access(p, N, ACC_READ); }           \
    void __tsan_write##N(void *p) { on_access(p, N, ACC_WRITE); }         \
    void __tsan_unaligned_read##N(void *p) { on_access(p, N, ACC_READ); } \
    void __tsan_unaligned_write##N(void *p) { on_access(p, N, ACC_WRITE); }
TPK_EMU_HOOKS(1)
TPK_EMU_HOOKS(2)
TPK_EMU_HOOKS(4)
TPK_EMU_HOOKS(8)
TPK_EMU_HOOKS(16)
#undef TPK_EMU_HOOKS
void __tsan_read_range(void *p, unsigned long n) { on_access(p, n, ACC_READ); }
void __tsan_write_range(void *p, unsigned long n) { on_access(p, n, ACC_WRITE); }
void __tsan_vptr_read(void **p) { on_access(p, sizeof *p, ACC_READ); }
void __tsan_vptr_update(void **p, void *) { on_access(p, sizeof *p, ACC_WRITE); }
/* the atomics of the instrumented files (the host code's std::atomic; no kernel uses a
 * shared-memory atomic today): done sequentially consistent, checked as atomic accesses */
#define TPK_EMU_ATOMICS(N, T)                                                                   \
    T __tsan_atomic##N##_load(const volatile T *p, int) {                                       \
        on_access((const void *)p, sizeof(T), ACC_READ);                                        \
        return __atomic_load_n(p, __ATOMIC_SEQ_CST);                                            \
    }                                                                                           \
    void __tsan_atomic##N##_store(volatile T *p, T v, int) {                                    \
        on_access((const void *)p, sizeof(T), ACC_ATOMIC);                                      \
        __atomic_store_n(p, v, __ATOMIC_SEQ_CST);                                               \
    }                                                                                           \
    T __tsan_atomic##N##_exchange(volatile T *p, T v, int) {                                    \
        on_access((const void *)p, sizeof(T), ACC_ATOMIC);                                      \
        return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);                                     \
    }                                                                                           \
    T __tsan_atomic##N##_fetch_add(volatile T *p, T v, int) {                                   \
        on_access((const void *)p, sizeof(T), ACC_ATOMIC);                                      \
        return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);                                      \
    }                                                                                           \
    T __tsan_atomic##N##_fetch_sub(volatile T *p, T v, int) {                                   \
        on_access((const void *)p, sizeof(T), ACC_ATOMIC);                                      \
        return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);                                      \
    }                                                                                           \
    int __tsan_atomic##N##_compare_exchange_strong(volatile T *p, T *e, T v, int, int) {        \
        on_access((const void *)p, sizeof(T), ACC_ATOMIC);                                      \
        return __atomic_compare_exchange_n(p, e, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
    }                                                                                           \
    int __tsan_atomic##N##_compare_exchange_weak(volatile T *p, T *e, T v, int, int) {          \
        on_access((const void *)p, sizeof(T), ACC_ATOMIC);                                      \
        return __atomic_compare_exchange_n(p, e, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);  \
    }
TPK_EMU_ATOMICS(8, uint8_t)
TPK_EMU_ATOMICS(16, uint16_t)
TPK_EMU_ATOMICS(32, uint32_t)
TPK_EMU_ATOMICS(64, uint64_t)
#undef TPK_EMU_ATOMICS
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
}

/* the kernel's first statement (cu2cpp.pl puts it there): from here on the thread's accesses are
 * the kernel's; the first thread checks the launch's dynamic shared memory against the kernel's
 * cudaFuncAttributeMaxDynamicSharedMemorySize (above 48 KiB the GPU refuses the launch without
 * it) */
void tpk_emu_kernel_enter(const void *kernel) {
    in_kernel("a kernel's entry");
    S.cur->in_body = true;
    if (S.entered) return;
    S.entered = true;
    if (S.dyn_bytes <= SMEM_DEFAULT) return;
    auto it = g_func_smem.find(kernel);
    int allowed = it == g_func_smem.end() ? SMEM_DEFAULT : it->second;
    if ((size_t)allowed >= S.dyn_bytes) return;
    tpk_emu_fail(
        "kernel %s launched with %zu bytes of dynamic shared memory, above the %d its "
        "cudaFuncAttributeMaxDynamicSharedMemorySize "
        "allows (the launch fails on the GPU)",
        S.name, S.dyn_bytes, allowed);
    S.abort = true;
}

/* cp.async: the destination reads as poison (NaN) from the issue until the copy lands at the
 * thread's wait; a write of the issuing warp at both times for the race detector */
void tpk__fl_cp16(void *dst, const void *src, bool valid) {
    in_kernel("cp.async");
    if ((uintptr_t)dst % 16 || (valid && (uintptr_t)src % 16))
        tpk_emu_fail("cp.async: 16 bytes from %p to %p, not 16-byte aligned", src, dst);
    uintptr_t d = (uintptr_t)dst, base = (uintptr_t)S.dyn.data();
    if (d < base || d + 16 > base + S.dyn_bytes) {
        oob_report(d, 16, ACC_WRITE,
                   "a cp.async destination outside the block's dynamic shared memory");
        return;
    }
    if (valid && S.cur->in_body) global_check((uintptr_t)src, 16, ACC_READ);
    on_access(dst, 16, ACC_WRITE);
    memset(dst, 0xff, 16);
    S.cur->pending.push_back(Copy{dst, src, valid});
}
void tpk__fl_commit() {
    in_kernel("cp.async.commit_group");
    S.cur->committed = S.cur->pending.size();
}
/* wait_group 0: every committed group lands; copies issued after the last commit stay pending */
void tpk__fl_wait_all() {
    in_kernel("cp.async.wait_group");
    Fiber &f = *S.cur;
    for (size_t i = 0; i < f.committed; i++) {
        const Copy &c = f.pending[i];
        on_access(c.dst, 16, ACC_WRITE);
        if (c.valid) memcpy(c.dst, c.src, 16);
        else memset(c.dst, 0, 16);
    }
    f.pending.erase(f.pending.begin(), f.pending.begin() + (std::ptrdiff_t)f.committed);
    f.committed = 0;
}
void tpk_emu_ldsm_check(const void *row) {
    in_kernel("ldmatrix");
    const unsigned char *p = static_cast<const unsigned char *>(row),
                        *base = static_cast<const unsigned char *>(tpk_emu_dyn_smem_raw());
    if ((uintptr_t)p % 16) tpk_emu_fail("ldmatrix: a row address %p not 16-byte aligned", row);
    if (p < base || p + 16 > base + S.dyn_bytes)
        tpk_emu_fail("ldmatrix: a row address outside the block's dynamic shared memory");
}
/* D (16x8) = A (16x16) B (16x8) from the lanes' registers, bf16 inputs, f32 products and sums */
void tpk_emu_mma_complete(tpk_emu_xchg &x) {
    g_mma++;
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        uint32_t r[6];
        memcpy(r, x.lane[L], sizeof r);
        int g = L >> 2, t = L & 3;
        for (int h = 0; h < 2; h++) { /* h: the low / high half of a register */
            A[g][2 * t + h] = tpk_emu_bf2f((unsigned short)(r[0] >> (16 * h)));
            A[g + 8][2 * t + h] = tpk_emu_bf2f((unsigned short)(r[1] >> (16 * h)));
            A[g][2 * t + 8 + h] = tpk_emu_bf2f((unsigned short)(r[2] >> (16 * h)));
            A[g + 8][2 * t + 8 + h] = tpk_emu_bf2f((unsigned short)(r[3] >> (16 * h)));
            B[2 * t + h][g] = tpk_emu_bf2f((unsigned short)(r[4] >> (16 * h)));
            B[2 * t + 8 + h][g] = tpk_emu_bf2f((unsigned short)(r[5] >> (16 * h)));
        }
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            float acc = 0.0f;
            for (int k = 0; k < 16; k++) acc += A[i][k] * B[k][j];
            x.result[i][j] = acc;
        }
}

/* ---- launches -------------------------------------------------------------------------------- */

static std::map<std::string, double> g_prof; /* TPK_EMU_PROFILE=1: seconds per kernel, printed at
                                                exit */
static void prof_print() {
    fprintf(stderr, "emu profile: %llu warp mma.sync instructions\n", g_mma);
    std::vector<std::pair<double, std::string>> v;
    for (auto &p : g_prof) v.push_back({p.second, p.first});
    std::sort(v.rbegin(), v.rend());
    for (auto &p : v) fprintf(stderr, "emu profile: %8.3f s  %s\n", p.first, p.second.c_str());
}

static void alloc_stacks(int n) {
    for (; S.nstacks < n; S.nstacks++) {
        void *m =
            mmap(NULL, STACK + GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            perror("tpk emu: mmap of a fiber stack");
            abort();
        }
        mprotect(m, GUARD, PROT_NONE); /* an overflow faults instead of overwriting the next
                                          stack */
        S.fibers[S.nstacks].stack = (unsigned char *)m + GUARD;
    }
}

/* the hang report: every live thread waits, but not all at one barrier or warp instruction */
static void report_hang() {
    int n = S.nthreads, bar = 0, warp = 0, first_warp = -1;
    for (int i = 0; i < n; i++) {
        bar += S.fibers[i].state == WAIT_BAR;
        if (S.fibers[i].state == WAIT_WARP) warp++, first_warp = first_warp < 0 ? i : first_warp;
    }
    tpk_emu_fail(
        "kernel %s, block (%u, %u, %u) cannot go on (a hang on the GPU): %d threads at "
        "__syncthreads, %d at warp instructions "
        "(thread %d first), %d ended",
        S.name, blockIdx.x, blockIdx.y, blockIdx.z, bar, warp, first_warp, n - S.live);
    S.abort = true;
}
static void resume(Fiber &f) {
    S.cur = &f, threadIdx = f.tid, f.state = RUNNING;
    switch_in(f);
}
/* lockstep: every ready thread in turn (ascending or descending) until it blocks, again and
 * again */
static void run_lockstep(bool reverse) {
    int n = S.nthreads;
    while (S.live > 0 && !S.abort) {
        bool ran = false;
        for (int k = 0; k < n && !S.abort; k++) {
            Fiber &f = S.fibers[reverse ? n - 1 - k : k];
            if (f.state != READY) continue;
            resume(f);
            ran = true;
        }
        S.cur = NULL;
        if (!ran && !S.abort) report_hang();
    }
}
/* asc, desc, random: per barrier interval, each warp alone until all its lanes wait at the barrier
 * (or ended), its lanes in turn until each blocks; the warps in the schedule's order */
static void run_warps(SchedMode mode) {
    int nw = (S.nthreads + 31) / 32;
    std::vector<int> order((size_t)nw);
    while (S.live > 0 && !S.abort) {
        for (int w = 0; w < nw; w++) order[(size_t)w] = mode == SCHED_DESC ? nw - 1 - w : w;
        if (mode == SCHED_RANDOM)
            for (int w = nw - 1; w > 0; w--)
                std::swap(order[(size_t)w], order[(size_t)(sched_rand() % (uint64_t)(w + 1))]);
        unsigned ep = S.epoch;
        bool ran = false;
        for (int oi = 0; oi < nw && !S.abort && S.epoch == ep; oi++) {
            Warp &W = S.warps[order[(size_t)oi]];
            bool rev = mode == SCHED_DESC || (mode == SCHED_RANDOM && (sched_rand() & 1));
            for (bool again = true; again && !S.abort && S.epoch == ep;) {
                again = false;
                for (int l = 0; l < W.size && !S.abort && S.epoch == ep; l++) {
                    Fiber &f = S.fibers[32 * order[(size_t)oi] + (rev ? W.size - 1 - l : l)];
                    if (f.state != READY) continue;
                    resume(f);
                    ran = again = true;
                }
            }
        }
        S.cur = NULL;
        if (!ran && !S.abort) report_hang();
    }
}

/* one block: every thread from its start until it ends; false when the block cannot go on */
static bool run_block(bool reverse) {
    int n = S.nthreads;
    for (int i = 0; i < n; i++) {
        Fiber &f = S.fibers[i];
        f.state = READY;
        f.tid = uint3{(unsigned)i % blockDim.x, (unsigned)i / blockDim.x % blockDim.y,
                      (unsigned)i / (blockDim.x * blockDim.y)};
        f.warp = i / 32, f.lane = i % 32, f.wseq = 0;
        f.pending.clear(), f.committed = 0, f.in_body = false;
        fiber_start(f);
    }
    for (int w = 0; w < (n + 31) / 32; w++) {
        Warp &W = S.warps[w];
        W.size = W.live = n - 32 * w < 32 ? n - 32 * w : 32;
        W.arrived = 0, W.complete = NULL;
        for (auto &x : W.x) memset(x.seq, 0xff, sizeof x.seq);
    }
    S.live = n, S.arrived = 0, S.epoch++;
    memset(S.dyn.data(), 0xff, S.dyn_bytes); /* NaN in f32 and bf16 */
    for (size_t k = S.dyn_bytes; k < S.dyn.size(); k++) S.dyn[k] = (k & 1) ? 0x7f : 0xc1;
    S.regions.assign(1, Region{(uintptr_t)S.dyn.data(), S.dyn_bytes, 0, NULL});
    if (S.shadow.size() < S.dyn_bytes)
        S.shadow.resize(S.dyn_bytes, Shadow{0, 0, NONE, NONE, NONE, false});
    if (sched().mode == SCHED_LOCKSTEP) run_lockstep(reverse);
    else run_warps(sched().mode);
    S.cur = NULL;
    for (size_t k = S.dyn_bytes; k < S.dyn.size(); k++)
        if (S.dyn[k] != ((k & 1) ? 0x7f : 0xc1)) {
            tpk_emu_fail(
                "kernel %s, block (%u, %u, %u): wrote byte %zu of its dynamic shared memory, past "
                "the %zu bytes of the launch",
                S.name, blockIdx.x, blockIdx.y, blockIdx.z, k, S.dyn_bytes);
            S.abort = true;
            break;
        }
    return !S.abort;
}

/* the launching thread's stack: what the launch's lambda captures lives there */
static void host_stack(uintptr_t *lo, uintptr_t *hi) {
    static thread_local uintptr_t l, h;
    if (!h) {
        pthread_attr_t a;
        void *base = NULL;
        size_t size = 0;
        if (pthread_getattr_np(pthread_self(), &a) == 0) {
            pthread_attr_getstack(&a, &base, &size);
            pthread_attr_destroy(&a);
        }
        l = (uintptr_t)base, h = (uintptr_t)base + size;
    }
    *lo = l, *hi = h;
}

void tpk_emu_run(const char *name, const tpk_emu_cfg_t &cfg, void (*body)(void *), void *arg) {
    std::lock_guard<std::mutex> lock(g_launch_mutex);
    if (S.name) {
        tpk_emu_fail("kernel %s launched from inside kernel %s", name, S.name);
        return tpk_emu_set_error(cudaErrorLaunchFailure);
    }
    /* the hardware's launch limits: a block of at most 1024 threads (x, y <= 1024, z <= 64), a grid
     * of x < 2^31, y, z <= 65535 blocks; dynamic shared memory up to the device's opt-in limit (and
     * above 48 KiB only with the kernel's attribute: tpk_emu_kernel_enter) */
    const dim3 &g = cfg.grid, &b = cfg.block;
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (!threads || threads > MAX_THREADS || b.x > 1024 || b.y > 1024 || b.z > 64 || !g.x || !g.y ||
        !g.z || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
        tpk_emu_fail(
            "kernel %s: launch of grid (%u, %u, %u) x block (%u, %u, %u): an invalid configuration",
            name, g.x, g.y, g.z, b.x, b.y, b.z);
        return tpk_emu_set_error(cudaErrorInvalidConfiguration);
    }
    if (cfg.smem > (size_t)smem_optin()) {
        tpk_emu_fail(
            "kernel %s: launch with %zu bytes of dynamic shared memory, above the device's %d",
            name, cfg.smem, smem_optin());
        return tpk_emu_set_error(cudaErrorInvalidValue);
    }
    if (!stream_ok(cfg.stream, name)) return tpk_emu_set_error(cudaErrorInvalidResourceHandle);
    static bool prof = getenv("TPK_EMU_PROFILE") && atexit(prof_print) == 0;
    static bool race_told;
    if (sched().race && !g_instrumented && !race_told) {
        race_told = true;
        tpk_emu_fail(
            "TPK_EMU_RACE=1, but the kernels were compiled without the access instrumentation (the "
            "checked build is "
            "libtpk_cuda_emu_chk.a, the tests' *_chk programs; not in an AddressSanitizer build)");
    }
    auto t0 = std::chrono::steady_clock::now();
    alloc_stacks((int)threads);
    S.name = name, S.body = body, S.arg = arg,
    S.abort = S.told_lanes = S.told_diverge = S.failed = false;
    S.entered = S.told_race = S.told_oob = false;
    S.nthreads = (int)threads, S.dyn_bytes = cfg.smem;
    S.dyn.assign(cfg.smem + SMEM_GUARD, 0);
    host_stack(&S.host_lo, &S.host_hi);
    for (auto &h : g_hits) h.lo = h.hi = 0;
    t_in_launch = true;
    gridDim = g, blockDim = b;
    /* the blocks in ascending order, or descending in every other launch (a block that needs
     * another block's results of the same launch gets them or not); a block's threads alternate
     * too; asc and desc take the blocks in their own order */
    unsigned long long l = S.launches++, nb = (unsigned long long)g.x * g.y * g.z;
    SchedMode mode = sched().mode;
    bool ok = true;
    for (unsigned long long k = 0; k < nb && ok; k++) {
        bool down = mode == SCHED_ASC ? false : mode == SCHED_DESC ? true : (l & 1);
        unsigned long long q = down ? nb - 1 - k : k;
        blockIdx = uint3{(unsigned)(q % g.x), (unsigned)(q / g.x % g.y),
                         (unsigned)(q / ((unsigned long long)g.x * g.y))};
        ok = run_block(((l / 2 + q) & 1) != 0);
    }
    t_in_launch = false;
    S.name = NULL;
    if (prof)
        g_prof[name] +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ok || S.failed) tpk_emu_set_error(cudaErrorLaunchFailure);
}
