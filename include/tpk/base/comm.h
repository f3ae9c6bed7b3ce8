/* tpk/base/comm.h — the communicator interface: a table of collectives over one group of ranks.
 *
 * A tpk_comm is (vtable, implementation state, rank, size, counters). Every collective has a
 * blocking form (req == NULL) and a start form (req != NULL) finished by tpk_wait(). Buffers
 * live where the implementation says (`device`): host memory for MPI (device buffers staged, or
 * given to a CUDA-aware MPI), device memory for NCCL; self takes either (its context's memcpy).
 * Collectives (counts are elements of `dtype`):
 *   allreduce       recv[i] = op over ranks of send[i]                         (count each)
 *   allgatherv      recv = concat over ranks q of send_q (counts[q] elements)   (rank-major)
 *   reduce_scatterv recv = rank r's block (counts[r]) of op over ranks of send   (send: sum counts)
 *   bcast           buf = root's buf
 *   barrier
 *   alltoallv       (optional entry) recv's block from rank q = rank q's block for this rank:
 *                   send holds one block per rank in rank order (sendcounts[q] elements for rank
 *                   q), recv one block from each rank in rank order (recvcounts[q] from rank q);
 *                   recvcounts[q] must be rank q's sendcounts[this rank] (MPI_Alltoallv with the
 *                   blocks packed, no displacements)
 * send == recv is allowed for allreduce (in place).
 * Point-to-point (optional entry, for pipeline parallelism): p2p runs a batch of sends and receives
 * to and from other ranks of the group as one operation (torch.distributed's batch_isend_irecv,
 * NCCL's ncclGroupStart/End around ncclSend/ncclRecv); a send matches the peer's receive of the
 * same tag, and between a pair of ranks sends of one tag match receives in the order posted (NCCL
 * has no tags: there the order alone matches them). The batch finishes when all its parts have.
 * The wrappers that check arguments and count calls and bytes are in tpk/runtime/coll.h. */
#ifndef TPK_COMM_H
#define TPK_COMM_H

#include "core.h"

typedef struct tpk_ctx tpk_ctx;
typedef struct tpk_comm tpk_comm;

typedef enum tpk_redop { TPK_SUM = 0, TPK_MAX = 1 } tpk_redop;

typedef enum tpk_coll_kind {
    TPK_COLL_ALLREDUCE = 0,
    TPK_COLL_ALLGATHER,
    TPK_COLL_REDUCE_SCATTER,
    TPK_COLL_BROADCAST,
    TPK_COLL_BARRIER,
    TPK_COLL_SEND,     /* point-to-point: elements sent */
    TPK_COLL_RECV,     /* elements received */
    TPK_COLL_ALLTOALL, /* all-to-all: elements sent (this rank's blocks, its own included) */
    TPK_COLL_N
} tpk_coll_kind;

static inline const char *tpk_coll_name(tpk_coll_kind k) {
    static const char *names[TPK_COLL_N] = {"all-reduce", "all-gather", "reduce-scatter",
                                            "broadcast",  "barrier",    "send",
                                            "receive",    "all-to-all"};
    return (unsigned)k < TPK_COLL_N ? names[k] : "?";
}

/* Per-communicator counters: calls, elements and bytes each rank contributed, per kind.
 * For all-gather the elements counted are the gathered total; for reduce-scatter the input. */
typedef struct tpk_comm_stats {
    uint64_t calls[TPK_COLL_N];
    uint64_t elems[TPK_COLL_N];
    uint64_t bytes[TPK_COLL_N];
} tpk_comm_stats;

/* One part of a point-to-point batch: count elements of dtype sent from buf to rank `peer` of the
 * group (send) or received from it into buf. tag >= 0 tells messages between the same pair apart
 * (the pipeline's: activation or gradient, model chunk, micro-batch). */
typedef struct tpk_p2p {
    void *buf;
    size_t count;
    tpk_dtype dtype;
    int peer;
    int tag;
    bool send;
} tpk_p2p;

/* An outstanding collective. `state` belongs to the implementation until tpk_wait(). */
typedef struct tpk_request {
    tpk_comm *comm;
    void *state;
    bool active;
    uint64_t flight; /* its operation number in comm->flight (tpk/runtime/coll.h) */
    int kind;        /* the tpk_coll_kind it started (TPK_COLL_SEND: a point-to-point batch): the
                        profiler's row of its tpk_wait, "dp.wait (allgather)" */
} tpk_request;

/* The flight recorder (tpk/runtime/coll.h fills it, prints it when a collective fails or times
 * out): each communicator keeps its last TPK_FLIGHT_N operations in a ring. An operation's `seq`
 * counts within its group: the collectives (all kinds together) 1, 2, ... and the point-to-point
 * batches 1, 2, ... apart, so ranks of one group that are in step hold the same numbers, and a
 * rank whose count is below the number the others wait in never reached that collective. */
#define TPK_FLIGHT_N 16
typedef enum tpk_flight_state {
    TPK_FLIGHT_RUNNING = 0, /* started, not finished (a start form not yet waited, or waiting) */
    TPK_FLIGHT_DONE,
    TPK_FLIGHT_FAILED /* an error or the timeout */
} tpk_flight_state;
typedef struct tpk_flight_entry {
    uint64_t id;            /* the communicator's operation number, from 1 (0: an empty slot) */
    uint64_t seq;           /* the group's collective (or point-to-point batch) number, from 1 */
    uint64_t elems, bytes;  /* this rank's, counted as in tpk_comm_stats; a batch's sum */
    double t0, t1;          /* host clock (seconds) at its start and its end (t1 0: not ended) */
    int kind;               /* tpk_coll_kind; TPK_COLL_SEND for a point-to-point batch;
                              TPK_COLL_N for a program's own MPI wait (tpk_mpi_wait) */
    const char *what;       /* TPK_COLL_N: the wait's name as the program gave it */
    int state;              /* tpk_flight_state */
    int peer, nsend, nrecv; /* a batch: its first part's peer, its sends and receives */
} tpk_flight_entry;
typedef struct tpk_flight {
    tpk_flight_entry ring[TPK_FLIGHT_N]; /* operation id goes to slot id % TPK_FLIGHT_N */
    uint64_t ops;                        /* operations recorded */
    uint64_t colls;                      /* collectives begun (the last one's seq) */
    uint64_t batches;                    /* point-to-point batches begun */
    uint64_t waits;   /* the program's own MPI waits begun (the world's; tpk_mpi_wait) */
    uint64_t waiting; /* the operation this rank waits in now (0: none) */
    bool reported;    /* a failure on this communicator was reported already */
    /* On the world communicator (NULL elsewhere): what prints a failure's report, asking the
     * other ranks where they are (tpk/runtime/mpi.h's); NULL: coll.h prints this rank's record. */
    void (*report)(tpk_ctx *ctx, tpk_comm *failed, const tpk_flight_entry *e, double waited_s);
} tpk_flight;

typedef struct tpk_comm_vtable {
    const char *name;
    tpk_status (*allreduce)(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv, size_t count,
                            tpk_dtype dt, tpk_redop op, tpk_request *req);
    tpk_status (*allgatherv)(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                             const size_t *counts, tpk_dtype dt, tpk_request *req);
    tpk_status (*reduce_scatterv)(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                  const size_t *counts, tpk_dtype dt, tpk_redop op,
                                  tpk_request *req);
    tpk_status (*bcast)(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count, tpk_dtype dt, int root,
                        tpk_request *req);
    tpk_status (*barrier)(tpk_ctx *ctx, tpk_comm *c, tpk_request *req);
    tpk_status (*wait)(tpk_ctx *ctx, tpk_request *req);
    /* New communicator of the ranks with the same color, ordered by key (MPI_Comm_split). */
    tpk_status (*split)(tpk_ctx *ctx, tpk_comm *c, int color, int key, tpk_comm *out);
    void (*destroy)(tpk_comm *c);
    /* Optional (NULL: none; tpk_p2p fails naming the communicator): the batch ops[n] of sends and
     * receives, every peer another rank of c. */
    tpk_status (*p2p)(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n, tpk_request *req);
    /* Optional (NULL: none; tpk_alltoallv fails naming the communicator): the all-to-all with
     * per-peer counts above (sendcounts, recvcounts: c->size each; checked by the front end). */
    tpk_status (*alltoallv)(tpk_ctx *ctx, tpk_comm *c, const void *send, const size_t *sendcounts,
                            void *recv, const size_t *recvcounts, tpk_dtype dt, tpk_request *req);
} tpk_comm_vtable;

/* The vtable's required entries in its order (X(entry) each): each implementation fills its table
 * with TPK__COMM_TABLE(prefix), prefix##allreduce, ..., prefix##split, then its destroy (NULL:
 * nothing to free), so an entry is named in one place; tpk_ctx_init refuses a world whose vtable
 * lacks one of them (tpk__comm_missing), naming it. */
#define TPK__COMM_ENTRIES(X) \
    X(allreduce) X(allgatherv) X(reduce_scatterv) X(bcast) X(barrier) X(wait) X(split)
#define TPK__COMM_TABLE(prefix)                                                    \
    prefix##allreduce, prefix##allgatherv, prefix##reduce_scatterv, prefix##bcast, \
        prefix##barrier, prefix##wait, prefix##split
/* The optional entries come after destroy, named in the table's initialiser:
 * {TPK__COMM_TABLE(p), destroy, p2p or NULL, alltoallv or NULL}. */
static inline const char *tpk__comm_missing(const tpk_comm_vtable *vt) {
    if (!vt->name) return "name";
#define TPK__COMM_MISSING(e) \
    if (!vt->e) return #e;
    TPK__COMM_ENTRIES(TPK__COMM_MISSING)
#undef TPK__COMM_MISSING
    return "";
}

struct tpk_comm {
    const tpk_comm_vtable *vt;
    void *impl;
    int rank, size;
    bool device; /* buffers are device memory */
    tpk_comm_stats stats;
    tpk_flight flight; /* the last operations (the flight recorder, above) */
};

#endif /* TPK_COMM_H */
