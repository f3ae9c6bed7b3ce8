/* tpk/runtime/nccl.h — the NCCL communicator bootstrapped through MPI (compile with mpicc, link
 * build/libtpk_cuda.a $(CUDA_LIBS)).
 *
 * tpk_comm_nccl_mpi(): rank 0 of `comm` creates an ncclUniqueId, MPI_Bcast sends it (with rank
 * 0's status, so a failure there fails every rank instead of hanging them), and every rank
 * joins with tpk_comm_nccl (tpk/runtime/cuda.h) on its current device. Without MPI, distribute the
 * id yourself and call tpk_comm_nccl. NCCL wants one device per rank: select it first
 * (tpk_cuda_set_device). */
#ifndef TPK_NCCL_H
#define TPK_NCCL_H

#include "cuda.h"
#include "../base/ctx.h"


/* Without <mpi.h> on the include path (a plain C compiler) the header is empty beyond
 * tpk/runtime/cuda.h. */
#if defined(MPI_VERSION) || !defined(__has_include) || __has_include(<mpi.h>)
#include "mpi.h" /* tpk/runtime/mpi.h: <mpi.h> without its C++ bindings */

static inline tpk_status tpk_comm_nccl_mpi(tpk_ctx *ctx, MPI_Comm comm, const tpk_nccl_desc *desc,
                                           tpk_comm *out) {
    static const char *fn = "tpk_comm_nccl_mpi";
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: NULL");
    int init = 0, rank = 0, size = 0;
    MPI_Initialized(&init);
    if (!init)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "MPI is not initialised: call MPI_Init first");
    if (comm == MPI_COMM_NULL) return tpk__fail(ctx, TPK_ERR_ARG, fn, "comm: MPI_COMM_NULL");
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    struct {
        int status;
        tpk_nccl_id id;
    } msg;
    memset(&msg, 0, sizeof msg);
    if (rank == 0) msg.status = (int)tpk_nccl_unique_id(ctx, &msg.id);
    int rc = MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, comm);
    if (rc != MPI_SUCCESS)
        return tpk__fail(ctx, TPK_ERR_COMM, fn, "MPI_Bcast of the NCCL id failed (MPI error %d)",
                         rc);
    if (msg.status != TPK_OK) {
        if (rank != 0)
            tpk__fail(ctx, (tpk_status)msg.status, fn, "rank 0 could not create an NCCL id");
        return (tpk_status)msg.status;
    }
    return tpk_comm_nccl(ctx, &msg.id, size, rank, desc, out);
}

#endif /* <mpi.h> */
#endif /* TPK_NCCL_H */
