/* tpk/runtime/cuda.h — the CUDA backend and the NCCL communicator (build/libtpk_cuda.a).
 *
 * Plain C declarations: this header includes no CUDA or NCCL header, so a C program compiled
 * with gcc or mpicc uses the GPU through it and links
 *     build/libtpk_cuda.a  $(CUDA_LIBS)      (the archive also carries the host backend)
 * (pkg-config: `tpk-cuda`).
 *
 *   tpk_ops_cuda()           every tpk_ops entry on the current CUDA device, f32 and bf16
 *                            storage with f32 arithmetic; GEMMs through cuBLASLt (the grouped
 *                            GEMM through cuBLAS's grouped GEMM where it serves). All work is
 *                            ordered on one stream per process (tpk_cuda_stream); memcpy to or
 *                            from the host and sync wait for it.
 *   tpk_cuda_device_count()  usable devices; 0 without a device or a driver (never fails)
 *   tpk_comm_self_cuda()     the one-rank communicator on device buffers, its copies
 *                            cudaMemcpyAsync on the backend's stream (tpk_comm_self, the default
 *                            world, copies device buffers through the context's memcpy op)
 *   tpk_comm_nccl()          a tpk_comm over NCCL on device buffers from a unique id that the
 *                            caller distributes (tpk/runtime/nccl.h does it through MPI).
 *                            Collectives run on the communicator's own stream, ordered after the
 *                            compute stream by an event at start and before it by an event at wait,
 *                            so a started all-reduce overlaps the GEMMs issued before tpk_wait. */
#ifndef TPK_CUDA_H
#define TPK_CUDA_H

#include "../base/comm.h"
#include "../base/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA backend's table (device = true). The first op creates the backend state on the
 * device current at that moment: call cudaSetDevice / tpk_cuda_set_device before. */
const tpk_ops *tpk_ops_cuda(void);
/* Number of usable CUDA devices; 0 when there is no device or no driver. */
int tpk_cuda_device_count(void);
/* Select the device of this process (before the first op); TPK_ERR_BACKEND on failure. */
tpk_status tpk_cuda_set_device(tpk_ctx *ctx, int device);
/* The stream (a cudaStream_t) every op of this process runs on; NULL when CUDA fails. */
void *tpk_cuda_stream(void);
/* Let f32 GEMMs use TF32 tensor cores (default off: f32 GEMMs are exact f32 arithmetic). */
void tpk_cuda_allow_tf32(bool allow);
/* How many times the backend has made the host wait for its stream so far (a download, an
 * upload over 4 MiB, sync, growing its scratch). Uploads up to 4 MiB (token ids, targets) go
 * through 8 pinned slots and wait only for their slot's previous copy (not counted). A training
 * step should wait only where it reads a value. */
unsigned long long tpk_cuda_sync_count(void);
/* How many gemm_grouped calls so far ran as one launch (cuBLAS's cublasGemmGroupedBatchedEx); the
 * others looped over the groups with a cuBLASLt GEMM each (docs/DESIGN.md, The grouped GEMM). */
unsigned long long tpk_cuda_gemm_grouped_launches(void);

/* Timing on the backend's stream, for benchmarks: an event, recorded in stream order;
 * tpk_cuda_event_ms waits for `end` and returns the milliseconds between the two (< 0 on error). */
void *tpk_cuda_event_new(void);
void tpk_cuda_event_record(void *ev);
float tpk_cuda_event_ms(void *start, void *end);
void tpk_cuda_event_free(void *ev);
/* Bytes of L2 cache of the current device (0 when unknown), for benchmarks that rotate buffers. */
size_t tpk_cuda_l2_bytes(void);
/* A plain cuBLASLt GEMM on packed row-major operands (lda = ta ? m : k, ldb = tb ? k : n,
 * ldc = n), without tpk's argument checks: the reference a benchmark compares ops->gemm to. */
tpk_status tpk_cuda_plain_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                               const void *a, const void *b, void *c, tpk_dtype dt);

/* One rank on device buffers: collectives are device-to-device copies on the backend's stream.
 *     tpk_comm w = tpk_comm_self_cuda();
 *     tpk_ctx_init(&ctx, &(tpk_ctx_desc){.ops = tpk_ops_cuda(), .world = &w}); */
tpk_comm tpk_comm_self_cuda(void);

/* ---- NCCL ----------------------------------------------------------------------------------- */

/* ncclUniqueId (NCCL_UNIQUE_ID_BYTES = 128 bytes), as plain bytes. */
typedef struct tpk_nccl_id {
    char bytes[128];
} tpk_nccl_id;

typedef struct tpk_nccl_desc {
    double timeout_s;   /* a collective not finished this long after the later of its start and
                           the peers' last sign of progress (`progress`) aborts the communicator
                           (TPK_ERR_COMM); 0: 600 s */
    bool blocking_wait; /* the host waits at each tpk_wait (and blocking collective), polling
                           NCCL's asynchronous error and the timeout. Default: tpk_wait only orders
                           the compute stream after the collective and the host goes on; a watchdog
                           at every later wait and at every host synchronisation of the CUDA
                           backend detects errors and timeouts (that call returns TPK_ERR_COMM) */
    bool no_poll;       /* no watchdog for this communicator: no timeout, errors only as CUDA
                           reports them (a hung collective then hangs the next synchronisation) */
    /* The peers' progress (NULL: none: a collective's timeout counts from its start). Returns the
     * time until which the peers are known to make progress, in seconds from now: negative, the
     * last note from a peer (a heartbeat, a phase's start or end) arrived that long ago; positive,
     * a peer announced a phase that lasts that much longer; -HUGE_VAL: nothing heard. The
     * watchdog calls it at its checks, at most once a millisecond per communicator (and never two
     * at once: under the watchdog's lock, on the thread that waits), and a collective's deadline
     * is timeout_s after the later of its start and that time (tpk__watch_deadline,
     * tpk/runtime/coll.h). tpk_comm_nccl_mpi (tpk/runtime/nccl.h) installs the MPI heartbeat's
     * (tpk_busy), which also answers the flight recorder's questions. Splits keep it. */
    double (*progress)(void *user);
    /* Called once when tpk_comm_destroy destroys this communicator (not a split of it, and not
     * when tpk_comm_nccl fails), to free what `user` holds; NULL: nothing to free. */
    void (*release)(void *user);
    void *user; /* the hooks' argument */
} tpk_nccl_desc;

/* A new unique id (on one rank; send it to the others). TPK_ERR_UNSUPPORTED in a build without
 * NCCL. */
tpk_status tpk_nccl_unique_id(tpk_ctx *ctx, tpk_nccl_id *id);
/* Rank `rank` of `nranks` joins the communicator `id` on the current device (collective over
 * the ranks). desc may be NULL. Destroy with tpk_comm_destroy. */
tpk_status tpk_comm_nccl(tpk_ctx *ctx, const tpk_nccl_id *id, int nranks, int rank,
                         const tpk_nccl_desc *desc, tpk_comm *out);

#ifdef __cplusplus
}
#endif

#endif /* TPK_CUDA_H */
