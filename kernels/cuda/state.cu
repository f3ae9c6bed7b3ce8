/* kernels/cuda/state.cu — the CUDA backend's device state, memory and the profiler's timer.
 *
 * One state per process (g_state: the device, the stream ops run on, the cuBLASLt handle, events,
 * scratch), made on first use (tpk__cuda_get). Memory is device memory (device = true): alloc
 * zero-filled, memcpy in every direction on the stream, sync waits for the stream (counted:
 * tpk_cuda_sync_count). The profiler's timer: CUDA events recorded on the stream, read when the
 * step closes (tpk/runtime/profile.h). The C API of tpk/runtime/cuda.h (device count, stream,
 * events, L2 size). */
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "common.cuh"

/* ---- state ----------------------------------------------------------------------------------- */

static tpk__cuda_state g_state;
static std::atomic<bool> g_ready;
static std::mutex g_mutex;
static std::atomic<bool> g_tf32;

tpk__cuda_state *tpk__cuda_get(tpk_ctx *ctx, const char *fn) {
    if (g_ready) return &g_state;
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_ready) return &g_state;
    tpk__cuda_state s = {};
    cudaError_t e = cudaGetDevice(&s.device);
    int major = 0, minor = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s.device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, s.device);
    s.cc = 10 * major + minor;
    int optin = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, s.device);
    s.smem_optin = (size_t)optin;
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        tpk__cuda_err(
            ctx, fn,
            "CUDA initialisation (cudaGetDevice, cudaDeviceGetAttribute, cudaStreamCreate)", e);
        return NULL;
    }
    cublasStatus_t b = cublasLtCreate(&s.lt);
    if (b != CUBLAS_STATUS_SUCCESS) {
        tpk__fail(ctx, TPK_ERR_BACKEND, fn, "cublasLtCreate: %s", cublasLtGetStatusString(b));
        cudaStreamDestroy(s.stream);
        return NULL;
    }
    s.lt_ws_bytes = (size_t)32 << 20;
    e = cudaMalloc(&s.lt_ws, s.lt_ws_bytes);
    if (e != cudaSuccess) {
        tpk__cuda_err(ctx, fn, "cudaMalloc of the cuBLASLt workspace", e);
        cublasLtDestroy(s.lt);
        cudaStreamDestroy(s.stream);
        return NULL;
    }
    g_state = s;
    g_ready = true;
    return &g_state;
}

static std::atomic<tpk__cuda_wait_hook> g_wait_hook;
void tpk__cuda_set_wait_hook(tpk__cuda_wait_hook hook) { g_wait_hook = hook; }
tpk_status tpk__cuda_event_wait(tpk_ctx *ctx, const char *fn, cudaEvent_t ev) {
    tpk__cuda_wait_hook hook = g_wait_hook;
    if (!hook) { /* nothing that could hang: block */
        TPK__CUDA_TRY(ctx, fn, cudaEventSynchronize(ev));
        return TPK_OK;
    }
    for (int spins = 0;; spins++) {
        cudaError_t e = tpk__event_query(ev);
        if (e == cudaSuccess) return TPK_OK;
        if (e != cudaErrorNotReady) return tpk__cuda_err(ctx, fn, "cudaEventQuery", e);
        TPK_TRY(hook(ctx, fn));
        if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

static std::atomic<unsigned long long> g_syncs;
tpk_status tpk__cuda_wait(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st) {
    g_syncs++;
    if (!st->sync_ev)
        TPK__CUDA_TRY(ctx, fn, cudaEventCreateWithFlags(&st->sync_ev, cudaEventDisableTiming));
    TPK__CUDA_TRY(ctx, fn, cudaEventRecord(st->sync_ev, st->stream));
    return tpk__cuda_event_wait(ctx, fn, st->sync_ev);
}
extern "C" unsigned long long tpk_cuda_sync_count(void) { return g_syncs.load(); }

tpk_status tpk__cuda_scratch(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, size_t bytes,
                             void **out) {
    if (st->scratch_bytes < bytes) {
        /* earlier kernels on the stream may still read the old buffer */
        TPK_TRY(tpk__cuda_wait(ctx, fn, st));
        if (st->scratch) cudaFree(st->scratch);
        st->scratch = NULL, st->scratch_bytes = 0;
        size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes;
        TPK__CUDA_TRY(ctx, fn, cudaMalloc(&st->scratch, want));
        st->scratch_bytes = want;
    }
    *out = st->scratch;
    return TPK_OK;
}

extern "C" int tpk_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}
extern "C" tpk_status tpk_cuda_set_device(tpk_ctx *ctx, int device) {
    TPK__CUDA_TRY(ctx, "tpk_cuda_set_device", cudaSetDevice(device));
    return TPK_OK;
}
extern "C" void *tpk_cuda_stream(void) {
    tpk__cuda_state *st = tpk__cuda_get(NULL, "tpk_cuda_stream");
    return st ? (void *)st->stream : NULL;
}
extern "C" void tpk_cuda_allow_tf32(bool allow) { g_tf32 = allow; }
bool tpk__cuda_tf32(void) { return g_tf32; }

extern "C" void *tpk_cuda_event_new(void) {
    cudaEvent_t e;
    return cudaEventCreate(&e) == cudaSuccess ? (void *)e : NULL;
}
extern "C" void tpk_cuda_event_record(void *ev) {
    tpk__cuda_state *st = tpk__cuda_get(NULL, "tpk_cuda_event_record");
    if (st && ev) cudaEventRecord((cudaEvent_t)ev, st->stream);
}
extern "C" float tpk_cuda_event_ms(void *start, void *end) {
    float ms = -1.0f;
    if (!start || !end || cudaEventSynchronize((cudaEvent_t)end) != cudaSuccess) return -1.0f;
    if (cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end) != cudaSuccess)
        return -1.0f;
    return ms;
}
extern "C" void tpk_cuda_event_free(void *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}
extern "C" size_t tpk_cuda_l2_bytes(void) {
    int dev = 0, l2 = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess)
        return 0;
    return (size_t)l2;
}

/* ---- memory ---------------------------------------------------------------------------------- */

static tpk_status cuda_alloc(tpk_ctx *ctx, size_t bytes, void **out) {
    static const char *fn = "cuda.alloc";
    *out = NULL;
    TPK__CUDA_STATE(st, ctx, fn);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn,
                         "could not allocate %zu bytes of device memory: %s", bytes,
                         cudaGetErrorString(e));
    }
    e = cudaMemsetAsync(p, 0, bytes ? bytes : 1, st->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        return tpk__cuda_err(ctx, fn, "cudaMemsetAsync", e);
    }
    *out = p;
    return TPK_OK;
}

static void cuda_free(tpk_ctx *ctx, void *p) {
    (void)ctx;
    if (p) cudaFree(p); /* cudaFree waits for the device: no kernel still uses p */
}

static tpk_status cuda_memcpy(tpk_ctx *ctx, void *dst, const void *src, size_t bytes,
                              tpk_copy_dir dir) {
    static const char *fn = "cuda.memcpy";
    if (!bytes || dst == src) return TPK_OK;
    if (dir == TPK_H2H) {
        memmove(dst, src, bytes);
        return TPK_OK;
    }
    TPK__CUDA_STATE(st, ctx, fn);
    if (dir == TPK_H2D && bytes <= TPK__CUDA_UPLOAD_MAX) { /* token ids, targets, host values:
                                                              through a pinned slot, no wait */
        int k = st->up_next;
        st->up_next = (k + 1) % TPK__CUDA_UPLOAD_SLOTS;
        if (!st->up_done[k])
            TPK__CUDA_TRY(ctx, fn,
                          cudaEventCreateWithFlags(&st->up_done[k], cudaEventDisableTiming));
        /* its last copy has been done (long ago, as a rule) */
        TPK_TRY(tpk__cuda_event_wait(ctx, fn, st->up_done[k]));
        if (st->up_bytes[k] < bytes) {
            if (st->up[k]) cudaFreeHost(st->up[k]);
            st->up[k] = NULL, st->up_bytes[k] = 0;
            size_t want = bytes < 4096 ? 4096 : bytes;
            TPK__CUDA_TRY(ctx, fn, cudaHostAlloc(&st->up[k], want, cudaHostAllocDefault));
            st->up_bytes[k] = want;
        }
        memcpy(st->up[k], src, bytes); /* the caller may reuse src as soon as we return */
        TPK__CUDA_TRY(ctx, fn,
                      cudaMemcpyAsync(dst, st->up[k], bytes, cudaMemcpyHostToDevice, st->stream));
        TPK__CUDA_TRY(ctx, fn, cudaEventRecord(st->up_done[k], st->stream));
        return TPK_OK;
    }
    cudaMemcpyKind k = dir == TPK_H2D   ? cudaMemcpyHostToDevice
                       : dir == TPK_D2H ? cudaMemcpyDeviceToHost
                                        : cudaMemcpyDeviceToDevice;
    TPK__CUDA_TRY(ctx, fn, cudaMemcpyAsync(dst, src, bytes, k, st->stream));
    /* the host side may be reused (large H2D) or read (D2H) as soon as we return */
    if (dir != TPK_D2D) TPK_TRY(tpk__cuda_wait(ctx, fn, st));
    return TPK_OK;
}

static tpk_status cuda_sync(tpk_ctx *ctx) {
    static const char *fn = "cuda.sync";
    TPK__CUDA_STATE(st, ctx, fn);
    return tpk__cuda_wait(ctx, fn, st);
}


/* ---- the profiler's timer: CUDA events recorded on the stream (tpk/runtime/profile.h) -------- */

static tpk_status cuda_timer_mark(tpk_ctx *ctx, int slot) {
    static const char *fn = "cuda.timer_mark";
    TPK__CUDA_STATE(st, ctx, fn);
    if (slot < 0) return tpk__fail(ctx, TPK_ERR_ARG, fn, "slot: expected >= 0, got %d", slot);
    if (slot >= st->nev) {
        int n = st->nev ? st->nev : 256;
        while (n <= slot) n *= 2;
        cudaEvent_t *e = (cudaEvent_t *)realloc(st->ev, sizeof *e * (size_t)n);
        if (!e) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d timer events", n);
        st->ev = e;
        for (; st->nev < n; st->nev++) TPK__CUDA_TRY(ctx, fn, cudaEventCreate(&st->ev[st->nev]));
    }
    TPK__CUDA_TRY(ctx, fn, cudaEventRecord(st->ev[slot], st->stream));
    return TPK_OK;
}
static tpk_status cuda_timer_ms(tpk_ctx *ctx, int a, int b, float *ms) {
    static const char *fn = "cuda.timer_ms";
    TPK__CUDA_STATE(st, ctx, fn);
    if (a < 0 || b < 0 || a >= st->nev || b >= st->nev)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "marks %d, %d: expected recorded marks 0..%d", a, b,
                         st->nev - 1);
    TPK__CUDA_TRY(ctx, fn, cudaEventSynchronize(st->ev[b]));
    TPK__CUDA_TRY(ctx, fn, cudaEventElapsedTime(ms, st->ev[a], st->ev[b]));
    return TPK_OK;
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_state_ops(tpk_ops *o) {
    o->name = "cuda", o->self = &g_state, o->device = true;
    o->alloc = cuda_alloc;
    o->free = cuda_free;
    o->memcpy = cuda_memcpy;
    o->sync = cuda_sync;
    o->timer_mark = cuda_timer_mark;
    o->timer_ms = cuda_timer_ms;
}
