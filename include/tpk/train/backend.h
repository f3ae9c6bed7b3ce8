/* tpk/train/backend.h — a trainer's backend and mesh: the GPU of each rank where one is present
 * (a program built with TPK_WITH_CUDA: rank r of a node of n takes device r mod the node's
 * devices; NCCL when every rank has a device of its own, else MPI), the host otherwise; the world
 * communicator with the job's collective timeout (inherited by the TP, DP and PP groups); the
 * activation dtype (--dtype, else bf16 on a GPU and f32 on the host: master weights stay f32);
 * then the context over TP x CP x DP x PP (context parallelism on the host backend only: the CUDA
 * table has no attention over CP yet, refused by name). tpk_run_node_size: the ranks sharing this
 * node (the least over the world: the planner's GPUs per node). Needs MPI. */
#ifndef TPK_TRAIN_BACKEND_H
#define TPK_TRAIN_BACKEND_H

#include "../runtime/host.h"
#include "../runtime/init.h"
#include "../runtime/mpi.h"
#ifdef TPK_WITH_CUDA
#include "../runtime/cuda.h"
#include "../runtime/nccl.h"
#endif

/* The backend and mesh a trainer runs on. */
typedef struct tpk_run_backend {
    const tpk_ops *ops;
    bool gpu;        /* a GPU per rank */
    tpk_dtype dtype; /* the activations' */
    tpk_comm world;
} tpk_run_backend;

/* Whether this process can use a GPU (built with TPK_WITH_CUDA, a device present). */
static inline bool tpk_run_gpu_present(void) {
#ifdef TPK_WITH_CUDA
    return tpk_cuda_device_count() > 0;
#else
    return false;
#endif
}

/* The ranks on this node (MPI_COMM_TYPE_SHARED) into *n, and this rank's place among them into
 * *local (may be NULL); least: *n the least over the world (a collective of the world). */
static inline void tpk_run_node_size(bool least, int *n, int *local) {
    MPI_Comm node;
    int w = 0, l = 0, per = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &w);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &l), MPI_Comm_size(node, &per), MPI_Comm_free(&node);
    if (least) MPI_Allreduce(MPI_IN_PLACE, &per, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    *n = per;
    if (local) *local = l;
}

/* The dtype of --dtype (NULL: bf16 on a GPU, f32 on the host). */
static inline tpk_dtype tpk_run_dtype(const char *dtype, bool gpu) {
    return dtype ? (strcmp(dtype, "bf16") ? TPK_F32 : TPK_BF16) : gpu ? TPK_BF16 : TPK_F32;
}

/* b's backend and world communicator (collectives wait at most timeout_s; 0: no limit), dtype
 * from --dtype (may be NULL). Collective over MPI_COMM_WORLD. */
static inline tpk_status tpk_run_backend_init(tpk_ctx *ctx, tpk_run_backend *b, const char *dtype,
                                              double timeout_s) {
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_run_backend_init", "b: NULL");
    memset(b, 0, sizeof *b);
    b->ops = tpk_ops_host();
#ifdef TPK_WITH_CUDA
    int ndev = tpk_cuda_device_count();
    if (ndev > 0) {
        int local = 0, per_node = 1;
        tpk_run_node_size(false, &per_node, &local);
        TPK_TRY(tpk_cuda_set_device(ctx, local % ndev));
        b->ops = tpk_ops_cuda(), b->gpu = true;
        tpk_nccl_desc nd;
        memset(&nd, 0, sizeof nd);
        nd.timeout_s = timeout_s, nd.no_poll = timeout_s == 0;
        tpk_status ns = per_node <= ndev ? tpk_comm_nccl_mpi(ctx, MPI_COMM_WORLD, &nd, &b->world)
                                         : TPK_ERR_UNSUPPORTED; /* one GPU per rank */
        /* ranks sharing GPUs, or a build without NCCL: MPI */
        TPK_TRY(ns == TPK_ERR_UNSUPPORTED ? tpk_comm_mpi(ctx, MPI_COMM_WORLD, &b->world) : ns);
    }
#endif
    if (!b->gpu) TPK_TRY(tpk_comm_mpi(ctx, MPI_COMM_WORLD, &b->world));
    if (!strcmp(b->world.vt->name, "mpi"))
        TPK_TRY(tpk_comm_mpi_set_timeout(ctx, &b->world, timeout_s));
    b->dtype = tpk_run_dtype(dtype, b->gpu);
    return TPK_OK;
}

/* The context on b over TP x CP x DP x PP, EP (expert parallelism, ep: 0 or 1 none) carved out of
 * DP, ZeRO's slices within groups of zero_shard DP x CP ranks (HSDP; 0: the whole group;
 * tpk_ctx_desc.zero_shard_size), tp_weights: NULL, or tp shares. */
static inline tpk_status tpk_run_ctx_init(tpk_ctx *ctx, tpk_run_backend *b, int tp, int cp, int pp,
                                          int ep, int zero_shard, const double *tp_weights,
                                          uint64_t seed, bool deterministic) {
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_run_ctx_init", "b: NULL");
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.ops = b->ops, d.world = &b->world, d.tp = tp, d.cp = cp, d.pp = pp, d.ep = ep, d.seed = seed;
    d.dtype = b->dtype;
    d.tp_weights = tp_weights, d.deterministic = deterministic, d.zero_shard_size = zero_shard;
    return tpk_ctx_init(ctx, &d);
}

#endif /* TPK_TRAIN_BACKEND_H */
