/* tpk/runtime/mpi.h — the MPI communicator on host buffers (compile with mpicc).
 *
 * tpk_comm_mpi() wraps a duplicate of an MPI communicator with errors returned, not fatal.
 * Collectives map one to one: MPI_Iallreduce, MPI_Iallgatherv, MPI_Ireduce_scatter,
 * MPI_Ibcast, MPI_Ibarrier, MPI_Ialltoallv, and point-to-point batches as MPI_Isend / MPI_Irecv
 * (tags as given);
 * the blocking forms start and wait. bf16 travels as 16-bit words
 * and is reduced by user operations that add (or take the max) in f32 and round to nearest
 * even. The count and displacement arrays of a v-collective live in the request until
 * tpk_wait, as MPI requires.
 *
 * Device buffers: when the context's backend keeps buffers in device memory (ctx->ops->device),
 * each collective stages through host memory with ctx->ops->memcpy: the send data is copied to a
 * host buffer before the MPI call, and the result copied back to the device buffer when the
 * collective finishes (at once, or in tpk_wait). So several ranks can share one GPU. With a
 * CUDA-aware MPI (Open MPI's MPIX_Query_cuda_support) device buffers go to MPI directly, except
 * for bf16 reductions, whose user operations read the data on the host; TPK_MPI_STAGE=1 in the
 * environment forces staging. A split that leaves one rank gives the `self` communicator
 * (tpk/runtime/comm_self.h: collectives are copies on the backend), as the NCCL one does.
 *
 * Timeout (a watchdog, as NCCL's): every wait for a collective (the blocking forms, tpk_wait)
 * polls MPI_Test — busily for its first TPK__MPI_SPIN_S seconds, then sleeping 10 us doubling to
 * 1 ms between polls — until the collective finishes or it has waited timeout_s seconds (a gap
 * between two polls counts at most 1 s, so a rank that was itself stopped, on resuming, does not
 * blame its peers at once). Then it returns TPK_ERR_COMM, "no answer from a peer within S s"
 * naming the collective and the group
 * (TP, DP, world; its size): a rank is stopped, dead or far slower. The collective cannot be
 * cancelled (MPI forbids it for collectives), so its buffers are left to MPI and the communicator
 * is unusable afterwards: every later collective on it fails at once. The caller cannot agree
 * with a stopped peer either: end the job (MPI_Abort), as the trainer does. The timeout is
 * TPK_TIMEOUT seconds from the environment when set, else TPK_MPI_TIMEOUT_DEFAULT (600 s);
 * tpk_comm_mpi_set_timeout changes it (0: wait for ever, MPI_Wait); splits inherit it.
 * The timeout measures progress, not a peer's work: with the world's heartbeat started
 * (tpk_mpi_heartbeat_init, a duplicate of MPI_COMM_WORLD) a rank in a long phase says so
 * (tpk_busy, tpk/runtime/coll.h: a note of a few bytes to every other rank, never blocking), and
 * every wait reads the notes while it sleeps: a heartbeat restarts its count, a phase's budget
 * holds it for up to that many seconds, or until the phase ends or its rank waits in a collective
 * itself. So a rank hashing or loading a checkpoint for minutes times no one out, and a stopped
 * rank's heartbeats stop: the others time out within the timeout of its last note (within the
 * budget inside a phase that cannot beat). The rule is tpk__watch_deadline's (tpk/runtime/coll.h),
 * which the NCCL watchdog shares (tpk/runtime/nccl.h feeds it these notes).
 * tpk_mpi_waited: the seconds this rank spent waiting.
 *
 * The flight recorder's report (tpk/runtime/coll.h keeps each communicator's last operations): a
 * communicator made by tpk_comm_mpi (the world) also holds a side channel, a duplicate of it on
 * which every rank keeps one receive posted for a question (an NCCL world made by tpk_comm_nccl_mpi
 * uses one kept beside it: tpk__mpi_side_other, tpk/runtime/nccl.h). When a collective of a context
 * on that world fails (the timeout, a peer gone), the rank prints its record and asks each other
 * rank of the failed group (MPI_Isend of its world rank, the group, the collective's sequence
 * number): every rank waiting in a collective of its own answers from its wait loop (the sleeping
 * polls above serve the side channel) with its groups' counts of collectives and point-to-point
 * batches begun and the operation it waits in, and prints its own record once. The asking rank
 * waits at most a quarter of the timeout (1 to 10 s) for the answers, then cancels the receives
 * that got none, and prints one line per rank of the group that never reached the collective: no
 * answer (stopped, dead, or computing outside a collective), or its count below the collective's
 * number (with what it waits in). Nothing in it can block: every call is non-blocking, its sends
 * are a few bytes, and a rank that never answers costs the deadline. */
#ifndef TPK_MPI_H
#define TPK_MPI_H

/* the C API only: no MPI C++ bindings when included from C++ */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#if defined(OPEN_MPI) && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#include "../base/env.h"
#include "coll.h"
#include "comm_self.h"
#include "op.h"

#include <time.h>
#if !defined(__cplusplus) && !defined(_POSIX_C_SOURCE)
/* POSIX; strict C11's <time.h> hides it */
int nanosleep(const struct timespec *req, struct timespec *rem);
#endif

#ifndef TPK_MPI_TIMEOUT_DEFAULT
#define TPK_MPI_TIMEOUT_DEFAULT 600.0 /* seconds: a generous NCCL watchdog's */
#endif
#define TPK__MPI_SPIN_S 1e-3 /* the busy phase of a wait, seconds */
#define TPK__MPI_ASK_N 4     /* a question: asker's world rank, group, seq, kind */
#define TPK__MPI_ANSWER_N 23 /* an answer (tpk__mpi_answer) */
#define TPK__MPI_MEMBERS 8   /* the members of another group an answer names (a[15..22]) */
#define TPK__MPI_ANSWERS 16  /* answers in flight at once */
#define TPK__MPI_TAG_ASK 1
#define TPK__MPI_TAG_ANSWER 2

typedef struct tpk__mpi {
    MPI_Comm comm;
    MPI_Op bf16_sum, bf16_max;
    double timeout_s;               /* 0: none */
    bool broken;                    /* a collective timed out: the communicator is unusable */
    char why[sizeof(((tpk_ctx *)0)->err)]; /* the error that made it so (the later refusals) */
    struct tpk__mpi_req *abandoned; /* the collectives that timed out, still MPI's (a list) */
    tpk_allocator al; /* this state's allocator: the creating context's (tpk_comm_mpi, split) */
    /* the flight recorder's side channel (tpk_comm_mpi's communicators; MPI_COMM_NULL: none) */
    MPI_Comm side;
    MPI_Request ask_req;           /* the receive of a question, always posted */
    long long ask[TPK__MPI_ASK_N]; /* its buffer */
    long long answer[TPK__MPI_ANSWERS][TPK__MPI_ANSWER_N]; /* answers being sent */
    MPI_Request answer_req[TPK__MPI_ANSWERS];
    unsigned next_answer;
    bool dumped; /* this rank's record printed (for a question or its own failure) */
} tpk__mpi;

typedef struct tpk__mpi_req {
    MPI_Request req;
    struct tpk__mpi_req *next; /* in tpk__mpi.abandoned */
    struct tpk__mpi_req *more; /* the next part of a point-to-point batch (tpk__mpi_p2p) */
    int *counts, *displs;      /* [size] each, for v-collectives */
    void *hsend, *hrecv;       /* host staging of device buffers (NULL when not staged) */
    void *drecv;               /* the device buffer the result goes back to */
    size_t recv_bytes;
    tpk_allocator al; /* the request's allocator: the context that started it */
} tpk__mpi_req;

/* Whether a collective on this context's buffers goes through host staging buffers. */
static inline bool tpk__mpi_stage(const tpk_ctx *ctx, tpk_dtype dt, bool reduction) {
    if (!ctx || !ctx->ops || !ctx->ops->device) return false;
    if (reduction && dt == TPK_BF16) return true; /* user ops run on the host */
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    const char *stage = getenv("TPK_MPI_STAGE"); /* 1: staged anyway (tpk/base/env.h) */
    if (MPIX_Query_cuda_support() == 1 && !(stage && !strcmp(stage, "1"))) return false;
#endif
    return true;
}
/* Host staging: `send_bytes` of device data at `send` copied into r->hsend, r->hrecv allocated
 * for `recv_bytes` that go back to `recv` when the collective finishes. */
static inline tpk_status tpk__mpi_stage_in(tpk_ctx *ctx, const char *fn, tpk__mpi_req *r,
                                           const void *send, size_t send_bytes, void *recv,
                                           size_t recv_bytes) {
    r->hsend = tpk__al_malloc(&r->al, send_bytes);
    r->hrecv = tpk__al_malloc(&r->al, recv_bytes);
    r->drecv = recv, r->recv_bytes = recv_bytes;
    if (!r->hsend || !r->hrecv)
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %zu staging bytes",
                         send_bytes + recv_bytes);
    if (send_bytes) return tpk_op_memcpy(ctx, r->hsend, send, send_bytes, TPK_D2H);
    return TPK_OK;
}
static inline void tpk__mpi_req_free(tpk__mpi_req *r) {
    tpk_allocator al = r->al;
    tpk__al_free(&al, r->counts), tpk__al_free(&al, r->displs);
    tpk__al_free(&al, r->hsend), tpk__al_free(&al, r->hrecv), tpk__al_free(&al, r);
}
/* A finished collective: copy a staged result back, free the request. */
static inline tpk_status tpk__mpi_done(tpk_ctx *ctx, tpk__mpi_req *r) {
    tpk_status s = TPK_OK;
    if (r->drecv && r->recv_bytes)
        s = tpk_op_memcpy(ctx, r->drecv, r->hrecv, r->recv_bytes, TPK_H2D);
    tpk__mpi_req_free(r);
    return s;
}

static inline void tpk__mpi_bf16_reduce(void *in, void *inout, int *len, MPI_Datatype *dt,
                                        bool is_max) {
    (void)dt;
    const uint16_t *a = (const uint16_t *)in;
    uint16_t *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++) {
        float x = tpk_bf16_to_f32(a[i]), y = tpk_bf16_to_f32(b[i]);
        b[i] = tpk_f32_to_bf16(is_max ? (x > y ? x : y) : x + y);
    }
}
static inline void tpk__mpi_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    tpk__mpi_bf16_reduce(in, inout, len, dt, false);
}
static inline void tpk__mpi_bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    tpk__mpi_bf16_reduce(in, inout, len, dt, true);
}

static inline tpk_status tpk__mpi_err(tpk_ctx *ctx, const char *fn, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    return tpk__fail(ctx, TPK_ERR_COMM, fn, "%s", msg);
}

static inline const tpk_comm_vtable *tpk__mpi_vtable(void);
/* The side channel of a world that is not an MPI communicator (tpk/runtime/nccl.h: the NCCL
 * world of tpk_comm_nccl_mpi), one at a time: that world's impl (NULL: none) and the MPI
 * communicator (tpk_comm_mpi's, on the same ranks) whose side channel it uses. */
typedef struct tpk__mpi_side_of {
    const void *impl;
    tpk_comm mpi;
} tpk__mpi_side_of;
static inline tpk__mpi_side_of *tpk__mpi_side_other(void) {
    static tpk__mpi_side_of s;
    return &s;
}
/* The side channel of ctx's world: its own when it is an MPI one that has one, the one kept
 * beside it (tpk__mpi_side_other) otherwise, else NULL. */
static inline tpk__mpi *tpk__mpi_side(const tpk_ctx *ctx) {
    if (!ctx || !ctx->world || !ctx->world->impl) return NULL;
    const tpk__mpi_side_of *o = tpk__mpi_side_other();
    tpk__mpi *w = ctx->world->vt == tpk__mpi_vtable() ? (tpk__mpi *)ctx->world->impl
                  : ctx->world->impl == o->impl && o->mpi.vt == tpk__mpi_vtable()
                      ? (tpk__mpi *)o->mpi.impl
                      : NULL;
    return w && w->side != MPI_COMM_NULL ? w : NULL;
}
static inline void tpk__mpi_members(tpk_ctx *ctx, tpk__mpi *w, tpk_comm *c, int *out);
/* This rank's answer: a[0] world rank, a[1] the group it waits in (-1: none; 0 world, 1 TP, 2 DP,
 * 3 PP, 4 another), a[2] that operation's kind, a[3] its seq, a[4..7] the collectives begun and
 * a[8..11] the point-to-point batches begun on the world, TP, DP and PP, a[12] the milliseconds
 * it has waited, a[13] the program's own MPI waits begun (tpk_mpi_wait); in another group (a
 * pipeline's tied-embedding group, CP, EP), a[14] how many of its members a[15..] names (the
 * first TPK__MPI_MEMBERS, world ranks), so the asker asks them in turn. */
static inline void tpk__mpi_answer(tpk_ctx *ctx, tpk__mpi *w, long long *a) {
    const tpk_comm *cs[4] = {ctx->world, &ctx->tp, &ctx->dp, &ctx->pp};
    double now = tpk__flight_now();
    a[0] = ctx->world->rank, a[1] = -1, a[2] = a[3] = a[12] = a[14] = 0;
    a[13] = (long long)ctx->world->flight.waits;
    for (int g = 0; g < 4; g++) {
        const tpk_flight *f = &cs[g]->flight;
        a[4 + g] = (long long)f->colls, a[8 + g] = (long long)f->batches;
        const tpk_flight_entry *e = &f->ring[f->waiting % TPK_FLIGHT_N];
        if (f->waiting && e->id == f->waiting && a[1] < 0)
            a[1] = g, a[2] = e->kind, a[3] = (long long)e->seq,
            a[12] = (long long)((now - e->t0) * 1e3);
    }
    tpk_comm *c = *tpk__flight_waiting_slot();
    if (a[1] >= 0 || !c || !c->vt || !c->flight.waiting) return;
    const tpk_flight_entry *e = &c->flight.ring[c->flight.waiting % TPK_FLIGHT_N];
    int mem[TPK__MPI_MEMBERS * 4]; /* a group of up to 32 ranks translated, the first 8 sent */
    if (e->id != c->flight.waiting) return;
    a[1] = 4, a[2] = e->kind, a[3] = (long long)e->seq, a[12] = (long long)((now - e->t0) * 1e3);
    if (c->size > (int)(sizeof mem / sizeof *mem)) return;
    tpk__mpi_members(ctx, w, c, mem);
    for (int r = 0; r < c->size && a[14] < TPK__MPI_MEMBERS; r++)
        if (mem[r] >= 0) a[15 + a[14]++] = mem[r];
}
/* Answer the questions that have arrived on ctx's world's side channel (tpk__mpi_report): print
 * this rank's record the first time, send the answer, post the receive again. Never blocks. */
static inline void tpk__mpi_serve(tpk_ctx *ctx) {
    tpk__mpi *w = tpk__mpi_side(ctx);
    for (int guard = 0; w && guard < 64; guard++) {
        int done = 0;
        MPI_Status st;
        if (MPI_Test(&w->ask_req, &done, &st) != MPI_SUCCESS || !done) return;
        unsigned k = w->next_answer % TPK__MPI_ANSWERS;
        int free_ = 1;
        if (w->answer_req[k] != MPI_REQUEST_NULL)
            MPI_Test(&w->answer_req[k], &free_, MPI_STATUS_IGNORE);
        if (!w->dumped) {
            char name[128];
            w->dumped = true;
            tpk_logf(ctx, TPK_LOG_ERROR, "rank %d: asked by rank %lld, which failed in %s",
                     ctx->world->rank, w->ask[0],
                     tpk__flight_op_name((int)w->ask[1], (int)w->ask[3], (uint64_t)w->ask[2], 0, 0,
                                         -1, name, sizeof name));
            tpk_flight_log(ctx, NULL, TPK_LOG_ERROR);
        }
        if (free_) { /* else the slot's answer is still in flight: this question goes unanswered */
            tpk__mpi_answer(ctx, w, w->answer[k]);
            w->next_answer++;
            MPI_Isend(w->answer[k], TPK__MPI_ANSWER_N, MPI_LONG_LONG, st.MPI_SOURCE,
                      TPK__MPI_TAG_ANSWER, w->side, &w->answer_req[k]);
        }
        if (MPI_Irecv(w->ask, TPK__MPI_ASK_N, MPI_LONG_LONG, MPI_ANY_SOURCE, TPK__MPI_TAG_ASK,
                      w->side, &w->ask_req) != MPI_SUCCESS)
            w->ask_req = MPI_REQUEST_NULL;
    }
}

/* ---- the heartbeat (tpk_busy, tpk/runtime/coll.h) -------------------------------------------- */

#define TPK__MPI_TAG_BUSY 3
/* The heartbeat's state: a duplicate of MPI_COMM_WORLD; until[q]: the time (MPI_Wtime) until
 * which world rank q announced itself busy (-HUGE_VAL: not); heard: when the last note from any
 * rank arrived (-HUGE_VAL: none; tpk__watch_note, tpk/runtime/coll.h); phase: this rank's
 * announced budget (0: none), suspended while it waits itself; last: when it last sent a
 * heartbeat; waited_s: the seconds this rank has spent in MPI waits (tpk_mpi_waited). */
typedef struct tpk__mpi_hb {
    MPI_Comm comm;
    int rank, size;
    double *until, phase, last, waited_s, heard;
    bool suspended;
} tpk__mpi_hb;
static inline tpk__mpi_hb *tpk__mpi_hb_state(void) {
    static tpk__mpi_hb hb = {MPI_COMM_NULL, 0, 0, NULL, 0, 0, 0, 0, false};
    return &hb;
}
/* The seconds this rank has waited in MPI (every tpk_mpi_wait: the kit's collectives on MPI
 * communicators and the program's own waits) since it started: the step's wait time. */
static inline double tpk_mpi_waited(void) { return tpk__mpi_hb_state()->waited_s; }
/* Read the notes that arrived; whether one did, or a peer is busy now. */
static inline bool tpk__mpi_hb_poll(void) {
    tpk__mpi_hb *h = tpk__mpi_hb_state();
    if (h->comm == MPI_COMM_NULL) return false;
    double now = MPI_Wtime();
    bool busy = false;
    for (int guard = 0; guard < 256; guard++) {
        int flag = 0;
        MPI_Status st;
        double b = 0;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TPK__MPI_TAG_BUSY, h->comm, &flag, &st) != MPI_SUCCESS ||
            !flag)
            break;
        if (MPI_Recv(&b, 1, MPI_DOUBLE, st.MPI_SOURCE, TPK__MPI_TAG_BUSY, h->comm,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            break;
        tpk__watch_note(now, b, &h->heard, &h->until[st.MPI_SOURCE]), busy = true;
    }
    for (int q = 0; q < h->size; q++) busy = busy || h->until[q] > now;
    return busy;
}
/* The time (MPI_Wtime) until which the other ranks are known to make progress, from the notes
 * read so far (tpk__watch_alive); -HUGE_VAL without the heartbeat or a note. */
static inline double tpk__mpi_hb_alive(void) {
    tpk__mpi_hb *h = tpk__mpi_hb_state();
    return h->comm == MPI_COMM_NULL ? -HUGE_VAL : tpk__watch_alive(h->heard, h->until, h->size);
}
/* A note to every other rank: *v seconds busy (> 0), a heartbeat (0) or the end (-1). Its buffer
 * outlives the send (a constant, or the state's phase), so the request is freed at once: never
 * blocks. */
static inline void tpk__mpi_hb_note(const double *v) {
    tpk__mpi_hb *h = tpk__mpi_hb_state();
    for (int q = 0; q < h->size; q++) {
        MPI_Request r;
        if (q != h->rank &&
            MPI_Isend(v, 1, MPI_DOUBLE, q, TPK__MPI_TAG_BUSY, h->comm, &r) == MPI_SUCCESS)
            MPI_Request_free(&r);
    }
}
/* The constant notes: [0] a heartbeat, [1] the end. */
static inline const double *tpk__mpi_hb_const(int i) {
    static const double v[2] = {0, -1};
    return &v[i];
}
/* tpk_busy's entry: budget_s > 0 a phase, 0 a heartbeat (at most every 50 ms), -1 the end. */
static inline void tpk__mpi_hb_send(double budget_s) {
    tpk__mpi_hb *h = tpk__mpi_hb_state();
    double now = MPI_Wtime();
    if (h->comm == MPI_COMM_NULL || (budget_s == 0 && now - h->last < 0.05)) return;
    if (budget_s == 0) h->last = now, tpk__mpi_hb_note(tpk__mpi_hb_const(0));
    else if (budget_s > 0) h->phase = budget_s, tpk__mpi_hb_note(&h->phase);
    else if (h->phase > 0) h->phase = 0, tpk__mpi_hb_note(tpk__mpi_hb_const(1));
}
/* Start the heartbeat of MPI_COMM_WORLD (collective: a duplicate of it; once, later calls do
 * nothing): from then on tpk_busy announces a rank's long phases to the others, and every MPI
 * wait (tpk_mpi_wait) reads the notes: its timeout counts only the time in which no peer was
 * announced busy and no note arrived. */
static inline tpk_status tpk_mpi_heartbeat_init(tpk_ctx *ctx) {
    tpk__mpi_hb *h = tpk__mpi_hb_state();
    if (h->comm != MPI_COMM_NULL) return TPK_OK;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &h->comm);
    if (rc != MPI_SUCCESS)
        return h->comm = MPI_COMM_NULL, tpk__mpi_err(ctx, "tpk_mpi_heartbeat_init", rc);
    MPI_Comm_rank(h->comm, &h->rank), MPI_Comm_size(h->comm, &h->size);
    size_t n = (size_t)h->size;
    /* the process's own, kept to its end: the C library's allocator (tpk__al_*, NULL) */
    if (!(h->until = (double *)tpk__al_calloc(NULL, n, sizeof(double)))) {
        MPI_Comm_free(&h->comm), h->comm = MPI_COMM_NULL;
        return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_mpi_heartbeat_init",
                         "out of host memory for %d ranks' heartbeat", h->size);
    }
    for (int q = 0; q < h->size; q++) h->until[q] = -HUGE_VAL;
    h->heard = -HUGE_VAL;
    *tpk__busy_slot() = tpk__mpi_hb_send;
    return TPK_OK;
}
/* tpk_mpi_wait's loop; fc: the context whose world's side channel it serves (NULL: none). */
static inline tpk_status tpk__mpi_wait_poll(tpk_ctx *ctx, tpk_ctx *fc, const char *fn,
                                            const char *what, MPI_Request *req, double timeout_s) {
    int rc, done = 0;
    if (timeout_s == 0) {
        rc = MPI_Wait(req, MPI_STATUS_IGNORE);
        return rc == MPI_SUCCESS ? TPK_OK : tpk__mpi_err(ctx, fn, rc);
    }
    /* the deadline is tpk__watch_deadline's (tpk/runtime/coll.h): timeout_s after the later of t0
     * and the time until which the peers are known to make progress (a note read since, a phase
     * announced). A gap between two polls counts at most 1 s: a rank that was itself stopped does
     * not blame its peers when it resumes (t0 moves past the rest of the gap). */
    double start = MPI_Wtime(), t = start, t0 = start, alive = -HUGE_VAL;
    long nap_ns = 10000;
    for (unsigned k = 0;; k++) {
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return tpk__mpi_err(ctx, fn, rc);
        if (done) return TPK_OK;
        bool nap = t - start >= TPK__MPI_SPIN_S; /* past the busy polls: sleeping ones */
        if (k % 64 == 0 || nap) { /* the clock read every 64 polls while busy */
            double t1 = MPI_Wtime(), from = alive > t0 ? alive : t0;
            double gap = t1 - (t > from ? t : from); /* of the time that counts */
            if (gap > 1) t0 = from + gap - 1;
            t = t1;
        }
        tpk__mpi_hb *h = tpk__mpi_hb_state();
        if (nap) tpk__mpi_hb_poll(), alive = tpk__mpi_hb_alive();
        if (nap && h->phase > 0 && !h->suspended) /* waiting, not working */
            h->suspended = true, tpk__mpi_hb_note(tpk__mpi_hb_const(1));
        if (t >= tpk__watch_deadline(t0, alive, timeout_s))
            return tpk__fail(
                ctx, TPK_ERR_COMM, fn,
                "no answer from a peer within %g s on %s: a rank is stopped, dead or far slower",
                timeout_s, what);
        if (nap) {
            struct timespec ts = {0, nap_ns};
            tpk__mpi_serve(fc); /* the flight recorder's questions (the world's side channel) */
            nanosleep(&ts, NULL);
            if (nap_ns < 1000000) nap_ns *= 2;
        }
    }
}
/* tpk__mpi_wait_poll, its time added to tpk_mpi_waited's. */
static inline tpk_status tpk__mpi_wait_loop(tpk_ctx *ctx, tpk_ctx *fc, const char *fn,
                                            const char *what, MPI_Request *req, double timeout_s) {
    double t0 = MPI_Wtime();
    tpk_status s = tpk__mpi_wait_poll(ctx, fc, fn, what, req, timeout_s);
    tpk__mpi_hb *h = tpk__mpi_hb_state();
    h->waited_s += MPI_Wtime() - t0;
    if (h->suspended) h->suspended = false, tpk__mpi_hb_note(&h->phase); /* working again */
    return s;
}
/* Wait for `req` at most timeout_s seconds (0: MPI_Wait): MPI_Test busily for TPK__MPI_SPIN_S,
 * then with sleeps of 10 us doubling to 1 ms. TPK_ERR_COMM on an MPI error, or on the timeout
 * with a message naming `fn` and `what` (the group); the request is then left active.
 * While it sleeps it answers the flight recorder's questions (ctx's world's side channel). A
 * program's own wait, on a context without a world (a zeroed one), goes to the recording context
 * (tpk/runtime/coll.h's tpk__flight_slot: the context last made on a world with a side channel):
 * recorded on its world as "fn #N (the program's own MPI wait)", N counted apart from the kit's
 * collectives, and on a failure reported as theirs are. */
static inline tpk_status tpk_mpi_wait(tpk_ctx *ctx, const char *fn, const char *what,
                                      MPI_Request *req, double timeout_s) {
    if (!fn || !what || !req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mpi_wait", "%s: NULL",
                         !fn     ? "fn"
                         : !what ? "what"
                                 : "req");
    if (!(timeout_s >= 0) || timeout_s > 1e9)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "timeout_s: expected seconds in [0, 1e9] (0: none), got %g", timeout_s);
    tpk_ctx *fc = ctx && ctx->world ? ctx : tpk__flight_ctx();
    if (fc == ctx || !tpk__mpi_side(fc))
        return tpk__mpi_wait_loop(ctx, fc, fn, what, req, timeout_s);
    tpk_comm *w = fc->world; /* the program's own wait: recorded on the recording context's world */
    uint64_t id = tpk__flight_begin(w, TPK_COLL_N, 0, TPK_F32, NULL, 0);
    tpk_flight_entry *e = tpk__flight_find(w, id);
    if (e) e->what = fn;
    w->flight.waiting = id;
    tpk_status s = tpk__mpi_wait_loop(ctx, fc, fn, what, req, timeout_s);
    return tpk__flight_end(fc, w, id, true, s);
}
/* The group a collective runs on, for messages: "the TP group (2 ranks)" and so on. */
static inline const char *tpk__mpi_group(const tpk_ctx *ctx, const tpk_comm *c, char *buf,
                                         size_t n) {
    const char *g = ctx && c == &ctx->tp     ? "the TP group"
                    : ctx && c == &ctx->dp   ? "the DP group"
                    : ctx && c == &ctx->pp   ? "the PP group"
                    : ctx && c == &ctx->ep   ? "the EP group"
                    : ctx && c == ctx->world ? "the world"
                                             : "a communicator";
    snprintf(buf, n, "%s (%d ranks)", g, c->size);
    return buf;
}

static inline MPI_Datatype tpk__mpi_type(tpk_dtype dt) {
    return dt == TPK_F32   ? MPI_FLOAT
           : dt == TPK_I32 ? MPI_INT32_T
           : dt == TPK_F64 ? MPI_DOUBLE
                           : MPI_UINT16_T;
}
static inline MPI_Op tpk__mpi_op(tpk__mpi *m, tpk_dtype dt, tpk_redop op) {
    if (dt == TPK_BF16) return op == TPK_MAX ? m->bf16_max : m->bf16_sum;
    return op == TPK_MAX ? MPI_MAX : MPI_SUM;
}

/* c made unusable by a collective left to MPI (timed out, or partly started): ctx's last error
 * kept as the reason that the later refusals repeat. */
static inline void tpk__mpi_break(tpk_ctx *ctx, tpk__mpi *m) {
    if (!m->broken) snprintf(m->why, sizeof m->why, "%s", ctx ? tpk_last_error(ctx) : "");
    m->broken = true;
}
/* The refusal of a communicator made unusable (tpk__mpi_break): TPK_ERR_COMM at once, naming the
 * first failure, so a rank that already timed out never waits a second timeout on it. */
static inline tpk_status tpk__mpi_broken(tpk_ctx *ctx, const char *fn, const tpk__mpi *m) {
    return tpk__fail(ctx, TPK_ERR_COMM, fn,
                     "the communicator is unusable after an earlier failure on it (%s)",
                     m->why[0] ? m->why : "a collective timed out");
}
/* Wait for a started collective within the communicator's timeout and finish it. On a timeout
 * the request and its buffers are left to MPI (it may still write them) and the communicator is
 * marked unusable. */
static inline tpk_status tpk__mpi_await(tpk_ctx *ctx, tpk_comm *c, const char *fn,
                                        tpk__mpi_req *r) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    char what[64];
    tpk_status s = TPK_OK;
    for (tpk__mpi_req *more; r; r = more) { /* a point-to-point batch: each part in turn */
        more = r->more, r->more = NULL;
        tpk_status si = s;
        if (si == TPK_OK && m->broken) { /* an earlier wait on c failed: no second timeout */
            int done = 0;
            if (MPI_Test(&r->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done)
                si = tpk__mpi_broken(ctx, fn, m);
        } else if (si == TPK_OK) {
            si = tpk_mpi_wait(ctx, fn, tpk__mpi_group(ctx, c, what, sizeof what), &r->req,
                              m->timeout_s);
        }
        if (si == TPK_OK) {
            s = tpk__mpi_done(ctx, r);
        } else {
            s = si;
            if (r->req != MPI_REQUEST_NULL)
                tpk__mpi_break(ctx, m), r->next = m->abandoned,
                m->abandoned = r; /* still running: kept until destroy */
            else tpk__mpi_req_free(r);
        }
    }
    return s;
}
/* Run a started MPI request to completion when the caller asked for the blocking form,
 * otherwise hand it to the tpk request. */
static inline tpk_status tpk__mpi_finish(tpk_ctx *ctx, tpk_comm *c, const char *fn, int rc,
                                         tpk__mpi_req *r, tpk_request *req) {
    if (rc != MPI_SUCCESS) {
        tpk__mpi_req_free(r);
        return tpk__mpi_err(ctx, fn, rc);
    }
    if (req) {
        req->state = r;
        return TPK_OK;
    }
    return tpk__mpi_await(ctx, c, fn, r);
}
/* *out = a request for a collective on c, with c->size counts and displacements when `counts`
 * is given; TPK_ERR_COMM when c is unusable (tpk__mpi_break). */
static inline tpk_status tpk__mpi_req_new(tpk_ctx *ctx, const char *fn, tpk_comm *c,
                                          const size_t *counts, tpk__mpi_req **out) {
    *out = NULL;
    if (((tpk__mpi *)c->impl)->broken) return tpk__mpi_broken(ctx, fn, (tpk__mpi *)c->impl);
    tpk__mpi_req *r = (tpk__mpi_req *)tpk__calloc(ctx, 1, sizeof *r);
    if (r && ctx) r->al = ctx->allocator;
    if (r && counts) {
        r->counts = (int *)tpk__al_malloc(&r->al, sizeof(int) * (size_t)c->size);
        r->displs = (int *)tpk__al_malloc(&r->al, sizeof(int) * (size_t)c->size);
        if (r->counts && r->displs) {
            int off = 0;
            for (int q = 0; q < c->size; q++)
                r->counts[q] = (int)counts[q], r->displs[q] = off, off += (int)counts[q];
        } else {
            tpk__mpi_req_free(r), r = NULL;
        }
    }
    if (!r) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for a request");
    *out = r;
    return TPK_OK;
}

static inline tpk_status tpk__mpi_allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                            size_t count, tpk_dtype dt, tpk_redop op,
                                            tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_allreduce (mpi)", c, NULL, &r));
    if (tpk__mpi_stage(ctx, dt, true)) {
        size_t bytes = count * tpk_dtype_size(dt);
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_allreduce (mpi)", r, send, bytes, recv, bytes);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, tpk__mpi_type(dt),
                            tpk__mpi_op(m, dt, op), m->comm, &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_allreduce (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                             void *recv, const size_t *counts, tpk_dtype dt,
                                             tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_allgatherv (mpi)", c, counts, &r));
    if (tpk__mpi_stage(ctx, dt, false)) {
        size_t es = tpk_dtype_size(dt), total = 0;
        for (int q = 0; q < c->size; q++) total += counts[q];
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_allgatherv (mpi)", r, send, counts[c->rank] * es,
                                         recv, total * es);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    MPI_Datatype t = tpk__mpi_type(dt);
    int rc = MPI_Iallgatherv(send, r->counts[c->rank], t, recv, r->counts, r->displs, t, m->comm,
                             &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_allgatherv (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                                  void *recv, const size_t *counts, tpk_dtype dt,
                                                  tpk_redop op, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_reduce_scatterv (mpi)", c, counts, &r));
    if (tpk__mpi_stage(ctx, dt, true)) {
        size_t es = tpk_dtype_size(dt), total = 0;
        for (int q = 0; q < c->size; q++) total += counts[q];
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_reduce_scatterv (mpi)", r, send, total * es,
                                         recv, counts[c->rank] * es);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    int rc = MPI_Ireduce_scatter(send, recv, r->counts, tpk__mpi_type(dt), tpk__mpi_op(m, dt, op),
                                 m->comm, &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_reduce_scatterv (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count,
                                        tpk_dtype dt, int root, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_bcast (mpi)", c, NULL, &r));
    if (tpk__mpi_stage(ctx, dt, false)) { /* the root sends from host; the others receive there */
        size_t bytes = count * tpk_dtype_size(dt);
        bool root_ = c->rank == root;
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_bcast (mpi)", r, buf, root_ ? bytes : 0,
                                         root_ ? NULL : buf, root_ ? 0 : bytes);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        buf = root_ ? r->hsend : r->hrecv;
    }
    int rc = MPI_Ibcast(buf, (int)count, tpk__mpi_type(dt), root, m->comm, &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_bcast (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_barrier(tpk_ctx *ctx, tpk_comm *c, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_barrier (mpi)", c, NULL, &r));
    int rc = MPI_Ibarrier(m->comm, &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_barrier (mpi)", rc, r, req);
}
/* The all-to-all with per-peer counts: MPI_Ialltoallv, the blocks packed (displacements the counts'
 * prefix sums); the request holds the counts and displacements of both sides until the wait
 * (counts[0..n) and displs[0..n) the send side's, [n..2n) the receive side's). Device buffers
 * staged as the all-gather's. */
static inline tpk_status tpk__mpi_alltoallv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                            const size_t *sendcounts, void *recv,
                                            const size_t *recvcounts, tpk_dtype dt,
                                            tpk_request *req) {
    static const char *fn = "tpk_alltoallv (mpi)";
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, fn, c, NULL, &r));
    size_t n = (size_t)c->size, es = tpk_dtype_size(dt), ns = 0, nr = 0;
    r->counts = (int *)tpk__al_malloc(&r->al, 2 * n * sizeof(int));
    r->displs = (int *)tpk__al_malloc(&r->al, 2 * n * sizeof(int));
    if (!r->counts || !r->displs) {
        tpk__mpi_req_free(r);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for a request");
    }
    for (size_t q = 0; q < n; q++) { /* sums within INT_MAX: checked by tpk_alltoallv */
        r->counts[q] = (int)sendcounts[q], r->displs[q] = (int)ns, ns += sendcounts[q];
        r->counts[n + q] = (int)recvcounts[q], r->displs[n + q] = (int)nr, nr += recvcounts[q];
    }
    if (tpk__mpi_stage(ctx, dt, false)) {
        tpk_status s = tpk__mpi_stage_in(ctx, fn, r, send, ns * es, recv, nr * es);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    MPI_Datatype t = tpk__mpi_type(dt);
    int rc = MPI_Ialltoallv(send, r->counts, r->displs, t, recv, r->counts + n, r->displs + n, t,
                            m->comm, &r->req);
    return tpk__mpi_finish(ctx, c, fn, rc, r, req);
}
/* A batch of sends and receives: MPI_Isend / MPI_Irecv each (device buffers staged: a send's data
 * copied to the host first, a receive's copied back when it finishes), chained in one request. */
static inline tpk_status tpk__mpi_p2p(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n,
                                      tpk_request *req) {
    static const char *fn = "tpk_p2p (mpi)";
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *first = NULL, **tail = &first;
    int rc = MPI_SUCCESS;
    tpk_status s = TPK_OK;
    for (int i = 0; i < n && s == TPK_OK && rc == MPI_SUCCESS; i++) {
        tpk__mpi_req *r;
        s = tpk__mpi_req_new(ctx, fn, c, NULL, &r);
        if (s != TPK_OK) break;
        *tail = r, tail = &r->more;
        void *buf = ops[i].buf;
        size_t bytes = ops[i].count * tpk_dtype_size(ops[i].dtype);
        if (tpk__mpi_stage(ctx, ops[i].dtype, false)) {
            s = ops[i].send ? tpk__mpi_stage_in(ctx, fn, r, buf, bytes, NULL, 0)
                            : tpk__mpi_stage_in(ctx, fn, r, NULL, 0, buf, bytes);
            if (s != TPK_OK) break;
            buf = ops[i].send ? r->hsend : r->hrecv;
        }
        MPI_Datatype t = tpk__mpi_type(ops[i].dtype);
        rc = ops[i].send
                 ? MPI_Isend(buf, (int)ops[i].count, t, ops[i].peer, ops[i].tag, m->comm, &r->req)
                 : MPI_Irecv(buf, (int)ops[i].count, t, ops[i].peer, ops[i].tag, m->comm, &r->req);
    }
    if (s == TPK_OK && rc != MPI_SUCCESS) s = tpk__mpi_err(ctx, fn, rc);
    if (s != TPK_OK) { /* the parts already started stay MPI's (their peers may never post the
                          match): the communicator is unusable, as after a timeout */
        for (tpk__mpi_req *r = first, *more; r; r = more) {
            more = r->more, r->more = NULL;
            if (r->req != MPI_REQUEST_NULL)
                tpk__mpi_break(ctx, m), r->next = m->abandoned, m->abandoned = r;
            else tpk__mpi_req_free(r);
        }
        return s;
    }
    if (req) {
        req->state = first;
        return TPK_OK;
    }
    return tpk__mpi_await(ctx, c, fn, first);
}
static inline tpk_status tpk__mpi_wait(tpk_ctx *ctx, tpk_request *req) {
    tpk__mpi_req *r = (tpk__mpi_req *)req->state;
    if (!r) return TPK_OK;
    return tpk__mpi_await(ctx, req->comm, "tpk_wait (mpi)", r);
}
static inline void tpk__mpi_destroy(tpk_comm *c) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    if (!m) return;
    int fin = 0;
    MPI_Finalized(&fin);
    for (tpk__mpi_req *r = m->abandoned, *next; r; r = next) { /* freed if MPI has finished them
                                                                  since; else left to MPI */
        int done = 0;
        next = r->next;
        if (!fin && MPI_Test(&r->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)
            tpk__mpi_req_free(r);
    }
    if (!fin && m->side != MPI_COMM_NULL) { /* the side channel: its receive cancelled */
        if (m->ask_req != MPI_REQUEST_NULL) MPI_Cancel(&m->ask_req), MPI_Request_free(&m->ask_req);
        for (int k = 0; k < TPK__MPI_ANSWERS; k++)
            if (m->answer_req[k] != MPI_REQUEST_NULL) MPI_Request_free(&m->answer_req[k]);
        MPI_Comm_free(&m->side);
    }
    if (!fin) {
        MPI_Op_free(&m->bf16_sum);
        MPI_Op_free(&m->bf16_max);
        MPI_Comm_free(&m->comm);
    }
    tpk_allocator al = m->al;
    tpk__al_free(&al, m);
    c->impl = NULL;
}
static inline tpk_status tpk__mpi_wrap(tpk_ctx *ctx, const char *fn, MPI_Comm owned,
                                       double timeout_s, tpk_comm *out);
static inline tpk_status tpk__mpi_split(tpk_ctx *ctx, tpk_comm *c, int color, int key,
                                        tpk_comm *out) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    MPI_Comm sub;
    int rc = MPI_Comm_split(m->comm, color, key, &sub), n = 0;
    if (rc != MPI_SUCCESS) return tpk__mpi_err(ctx, "tpk_comm_split (mpi)", rc);
    MPI_Comm_size(sub, &n);
    if (n == 1) { /* one rank (the TP group at t = 1): its collectives are copies, no MPI call and
                     no host staging */
        MPI_Comm_free(&sub);
        *out = tpk_comm_self(c->device);
        return TPK_OK;
    }
    return tpk__mpi_wrap(ctx, "tpk_comm_split (mpi)", sub, m->timeout_s, out); /* the parent's
                                                                                  timeout */
}

/* The flight recorder's questions of one report: per world rank whether it was asked (0 no, 1
 * waiting for its answer, 2 answered, 3 no answer), its answer, and why it was asked: the
 * operation (group, kind, seq) that the asking rank or a rank it asked waits in (by). */
typedef struct tpk__mpi_asked {
    int state, by, role, kind;
    long long seq;
    long long q[TPK__MPI_ASK_N], a[TPK__MPI_ANSWER_N];
    MPI_Request send, recv;
} tpk__mpi_asked;
/* Ask world rank q (unless asked already, or this rank) about the operation (group role, kind,
 * seq) that world rank `by` waits in. */
static inline void tpk__mpi_ask(tpk_ctx *ctx, tpk__mpi *w, tpk__mpi_asked *as, int q, int role,
                                int by, int kind, long long seq, int *pending) {
    int me = ctx->world->rank;
    if (q < 0 || q == me || q >= ctx->world->size || as[q].state) return;
    tpk__mpi_asked *x = &as[q];
    x->by = by, x->role = role, x->kind = kind, x->seq = seq;
    x->q[0] = me, x->q[1] = role, x->q[2] = seq, x->q[3] = kind;
    if (MPI_Irecv(x->a, TPK__MPI_ANSWER_N, MPI_LONG_LONG, q, TPK__MPI_TAG_ANSWER, w->side,
                  &x->recv) != MPI_SUCCESS)
        return;
    if (MPI_Isend(x->q, TPK__MPI_ASK_N, MPI_LONG_LONG, q, TPK__MPI_TAG_ASK, w->side, &x->send) !=
        MPI_SUCCESS) {
        MPI_Cancel(&x->recv), MPI_Request_free(&x->recv);
        return;
    }
    x->state = 1, (*pending)++;
}
/* The world ranks of c's ranks into out[c->size] (-1: not known): the mesh for the context's
 * groups, MPI's translation for another MPI communicator. */
static inline void tpk__mpi_members(tpk_ctx *ctx, tpk__mpi *w, tpk_comm *c, int *out) {
    int role = tpk__flight_role(ctx, c), n = c->size;
    for (int r = 0; r < n; r++) out[r] = tpk__flight_world_rank(ctx, role, r);
    if (role != 4 || c->vt != tpk__mpi_vtable()) return;
    MPI_Group g1, g2;
    int *in = (int *)tpk__al_calloc(&w->al, (size_t)n, sizeof *in);
    if (in && MPI_Comm_group(((tpk__mpi *)c->impl)->comm, &g1) == MPI_SUCCESS) {
        if (MPI_Comm_group(w->side, &g2) == MPI_SUCCESS) {
            for (int r = 0; r < n; r++) in[r] = r;
            if (MPI_Group_translate_ranks(g1, n, in, g2, out) != MPI_SUCCESS)
                for (int r = 0; r < n; r++) out[r] = -1;
            for (int r = 0; r < n; r++)
                if (out[r] == MPI_UNDEFINED) out[r] = -1;
            MPI_Group_free(&g2);
        }
        MPI_Group_free(&g1);
    }
    tpk__al_free(&w->al, in);
}
/* The flight recorder's report of a failure of e (e NULL: overwritten) on `failed`, a group of
 * ctx, waited_s into it (tpk_flight.report of a world made by tpk_comm_mpi; the header's comment
 * says how). The questions follow the waits: a rank that answers from a wait in another group
 * has that group's ranks asked in turn, so the report reaches the rank that holds them all. */
static inline void tpk__mpi_report(tpk_ctx *ctx, tpk_comm *failed, const tpk_flight_entry *e,
                                   double waited_s) {
    tpk__mpi *w = tpk__mpi_side(ctx);
    int role = tpk__flight_role(ctx, failed), n = failed->size, me = ctx->world->rank;
    char name[128] = "an operation (its record overwritten)", buf[768];
    if (e) tpk__flight_entry_name(ctx, failed, e, name, sizeof name);
    int k = 0, *mem = (int *)tpk__calloc(ctx, (size_t)n, sizeof *mem);
    if (mem && w) tpk__mpi_members(ctx, w, failed, mem);
    for (int r = 0; r < n && k < (int)sizeof buf - 16; r++)
        k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%d", r ? ", " : "",
                      mem && w ? mem[r] : tpk__flight_world_rank(ctx, role, r));
    tpk_logf(ctx, TPK_LOG_ERROR, "rank %d: %s failed after %.3f s (%s%s%s of world ranks %s)", me,
             name, waited_s, role < 4 ? "the " : "a group",
             role < 4 ? tpk__flight_role_name(role) : "", role < 4 ? " group" : "", buf);
    if (!w || !w->dumped) tpk_flight_log(ctx, failed, TPK_LOG_ERROR);
    if (w) w->dumped = true;
    if (!w || !e || !mem) { /* nobody to ask */
        tpk__free(ctx, mem);
        return;
    }
    /* ask; wait at most a quarter of the timeout (1 to 10 s) for all the answers */
    double t = w->timeout_s; /* the side channel's: its world's, or the NCCL world's */
    if (failed->vt == tpk__mpi_vtable()) t = ((tpk__mpi *)failed->impl)->timeout_s;
    double limit = t / 4 < 1 ? 1 : t / 4 > 10 ? 10 : t / 4;
    int N = ctx->world->size, pending = 0;
    tpk__mpi_asked *as = (tpk__mpi_asked *)tpk__al_calloc(&w->al, (size_t)N, sizeof *as);
    if (!as) {
        tpk_logf(ctx, TPK_LOG_ERROR, "rank %d: out of host memory to ask the other ranks", me);
        tpk__free(ctx, mem);
        return;
    }
    for (int q = 0; q < N; q++) as[q].send = as[q].recv = MPI_REQUEST_NULL;
    for (int r = 0; r < n; r++)
        tpk__mpi_ask(ctx, w, as, mem[r], role, me, e->kind, (long long)e->seq, &pending);
    tpk__free(ctx, mem);
    double t0 = MPI_Wtime();
    while (pending > 0 && MPI_Wtime() - t0 < limit) {
        for (int q = 0; q < N; q++) {
            int done = 0;
            if (as[q].state != 1) continue;
            if (MPI_Test(&as[q].recv, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) continue;
            as[q].state = 2, pending--;
            const long long *a = as[q].a; /* it waits in a group of its own: ask that one too */
            for (int r = 0; a[1] >= 0 && a[1] < 4 && r < tpk__flight_group_size(ctx, (int)a[1]);
                 r++)
                tpk__mpi_ask(ctx, w, as, tpk__flight_member(ctx, (int)a[1], q, r), (int)a[1], q,
                             (int)a[2], a[3], &pending);
            for (int r = 0; a[1] == 4 && r < a[14] && r < TPK__MPI_MEMBERS; r++)
                tpk__mpi_ask(ctx, w, as, (int)a[15 + r], 4, q, (int)a[2], a[3], &pending);
        }
        tpk__mpi_serve(ctx); /* a rank asking this one at the same time */
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    double asked = MPI_Wtime() - t0;
    bool sent = true;
    for (int q = 0; q < N; q++) {
        if (as[q].state == 1) /* no answer: the receive cancelled */
            as[q].state = 3, MPI_Cancel(&as[q].recv), MPI_Request_free(&as[q].recv);
        int done = 1;
        if (as[q].send != MPI_REQUEST_NULL) MPI_Test(&as[q].send, &done, MPI_STATUS_IGNORE);
        if (!done) sent = false, MPI_Request_free(&as[q].send); /* MPI still reads as[q].q */
    }
    int behind = 0;
    for (int q = 0; q < N; q++) {
        const tpk__mpi_asked *x = &as[q];
        if (x->state < 2) continue;
        char why[192], op[128], where[192] = "it waits in no collective";
        tpk__flight_op_name(x->role, x->kind, (uint64_t)x->seq, 0, 0, -1, op, sizeof op);
        if (x->by == me) snprintf(why, sizeof why, "%s", name);
        else snprintf(why, sizeof why, "%s (where rank %d waits)", op, x->by);
        if (x->state == 3) {
            behind++;
            tpk_logf(ctx, TPK_LOG_ERROR,
                     "rank %d: rank %d never reached %s: no answer within %.1f s (stopped, dead, "
                     "or busy outside a collective)",
                     me, q, why, asked);
            continue;
        }
        const long long *a = x->a;
        bool p2p = x->kind == TPK_COLL_SEND || x->kind == TPK_COLL_RECV;
        bool own = x->kind == TPK_COLL_N;
        long long begun = own ? a[13] : x->role < 4 ? a[(p2p ? 8 : 4) + x->role] : -1;
        const char *counted = own ? "waits" : p2p ? "point-to-point batches" : "collectives";
        if (a[1] >= 0)
            snprintf(
                where, sizeof where, "it waits in %s for %.3f s",
                tpk__flight_op_name((int)a[1], (int)a[2], (uint64_t)a[3], 0, 0, -1, op, sizeof op),
                (double)a[12] * 1e-3);
        if (!p2p && begun >= 0 && begun < x->seq) {
            behind++;
            tpk_logf(ctx, TPK_LOG_ERROR,
                     "rank %d: rank %d never reached %s: it has begun %lld %s %s; %s", me, q, why,
                     begun, tpk__flight_role_name(x->role), counted, where);
        } else {
            char cnt[96] = "";
            if (begun >= 0)
                snprintf(cnt, sizeof cnt, "%lld %s %s begun; ", begun,
                         tpk__flight_role_name(x->role), counted);
            tpk_logf(ctx, TPK_LOG_ERROR, "rank %d: rank %d answered: %s%s", me, q, cnt, where);
        }
    }
    if (!behind)
        tpk_logf(ctx, TPK_LOG_ERROR,
                 "rank %d: every rank asked reached %s or answered from a wait of its own", me,
                 name);
    if (sent) tpk__al_free(&w->al, as); /* else kept: MPI may still read a question */
}

static inline const tpk_comm_vtable *tpk__mpi_vtable(void) {
    static const tpk_comm_vtable vt = {"mpi", TPK__COMM_TABLE(tpk__mpi_), tpk__mpi_destroy,
                                       tpk__mpi_p2p, tpk__mpi_alltoallv};
    return &vt;
}

/* Take ownership of `owned` (a communicator of our own) and fill `out`; collectives wait at most
 * timeout_s seconds. */
static inline tpk_status tpk__mpi_wrap(tpk_ctx *ctx, const char *fn, MPI_Comm owned,
                                       double timeout_s, tpk_comm *out) {
    memset(out, 0, sizeof *out);
    tpk__mpi *m = (tpk__mpi *)tpk__calloc(ctx, 1, sizeof *m);
    if (!m) {
        MPI_Comm_free(&owned);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    }
    m->comm = owned, m->timeout_s = timeout_s, m->side = MPI_COMM_NULL;
    m->ask_req = MPI_REQUEST_NULL;
    for (int k = 0; k < TPK__MPI_ANSWERS; k++) m->answer_req[k] = MPI_REQUEST_NULL;
    if (ctx) m->al = ctx->allocator;
    MPI_Comm_set_errhandler(owned, MPI_ERRORS_RETURN);
    MPI_Op_create(tpk__mpi_bf16_sum, 1, &m->bf16_sum);
    MPI_Op_create(tpk__mpi_bf16_max, 1, &m->bf16_max);
    MPI_Comm_rank(owned, &out->rank);
    MPI_Comm_size(owned, &out->size);
    out->vt = tpk__mpi_vtable(), out->impl = m, out->device = false;
    return TPK_OK;
}

/* *timeout_s = the seconds a new MPI communicator's collectives wait: TPK_TIMEOUT from the
 * environment when set (TPK_ERR_ARG when it is not a number in [0, 1e9], tpk/base/env.h), else
 * 600. */
static inline tpk_status tpk_mpi_timeout_default(tpk_ctx *ctx, double *timeout_s) {
    if (!timeout_s)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mpi_timeout_default", "timeout_s: NULL");
    return tpk_env_number(ctx, "TPK_TIMEOUT", TPK_MPI_TIMEOUT_DEFAULT, timeout_s);
}

/* A tpk communicator over (a duplicate of) `comm`; MPI must be initialised. ctx may be NULL (or
 * zeroed, before tpk_ctx_init): the communicator's state comes from ctx's allocator (NULL or
 * zeroed: the C library's; set ctx->allocator first to place it), each collective's request from
 * the allocator of the context that runs it.
 * Its collectives wait at most tpk_mpi_timeout_default's seconds (TPK_TIMEOUT, else 600). */
static inline tpk_status tpk_comm_mpi(tpk_ctx *ctx, MPI_Comm comm, tpk_comm *out) {
    static const char *fn = "tpk_comm_mpi";
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: NULL");
    double timeout_s = TPK_MPI_TIMEOUT_DEFAULT;
    TPK_TRY(tpk_mpi_timeout_default(ctx, &timeout_s));
    int init = 0;
    MPI_Initialized(&init);
    if (!init)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "MPI is not initialised: call MPI_Init first");
    if (comm == MPI_COMM_NULL) return tpk__fail(ctx, TPK_ERR_ARG, fn, "comm: MPI_COMM_NULL");
    MPI_Comm dup;
    int rc = MPI_Comm_dup(comm, &dup);
    if (rc != MPI_SUCCESS) return tpk__mpi_err(ctx, fn, rc);
    TPK_TRY(tpk__mpi_wrap(ctx, fn, dup, timeout_s, out));
    tpk__mpi *m = (tpk__mpi *)out->impl; /* the flight recorder's side channel */
    rc = MPI_Comm_dup(dup, &m->side);
    if (rc == MPI_SUCCESS) {
        MPI_Comm_set_errhandler(m->side, MPI_ERRORS_RETURN);
        rc = MPI_Irecv(m->ask, TPK__MPI_ASK_N, MPI_LONG_LONG, MPI_ANY_SOURCE, TPK__MPI_TAG_ASK,
                       m->side, &m->ask_req);
    }
    if (rc != MPI_SUCCESS) {
        tpk_comm_destroy(out);
        return tpk__mpi_err(ctx, fn, rc);
    }
    out->flight.report = tpk__mpi_report;
    return TPK_OK;
}

/* How long c's collectives wait for the peers, in seconds (0: for ever); communicators split
 * from c afterwards inherit it. c: an MPI communicator, or one of a single rank (self), which
 * never waits (accepted, no effect). */
static inline tpk_status tpk_comm_mpi_set_timeout(tpk_ctx *ctx, tpk_comm *c, double timeout_s) {
    static const char *fn = "tpk_comm_mpi_set_timeout";
    if (!c || !c->vt)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "comm: expected an initialised communicator, got %s",
                         c ? "one with no table" : "NULL");
    if (!(timeout_s >= 0 && timeout_s <= 1e9))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "timeout_s: expected seconds in [0, 1e9] (0: none), got %g", timeout_s);
    if (c->vt == tpk__mpi_vtable()) ((tpk__mpi *)c->impl)->timeout_s = timeout_s;
    else if (c->size != 1)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "comm: expected an MPI communicator, got \"%s\" (NCCL: tpk_nccl_desc.timeout_s)",
            c->vt->name);
    return TPK_OK;
}

#endif /* TPK_MPI_H */
