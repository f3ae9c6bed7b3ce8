/* tpk/runtime/coll.h — checked, counted collectives over a tpk_comm (tpk/base/comm.h).
 *
 * tpk_allreduce & co. check their arguments (null buffers, count arrays that do not add up,
 * counts past INT_MAX), count calls/elements/bytes in comm->stats, then call the table.
 * The *_start forms return at once; tpk_wait finishes them. Point-to-point batches (tpk_p2p_run,
 * tpk_send, tpk_recv) and the all-to-all with per-peer counts (tpk_alltoallv; its counts exchanged
 * by tpk_alltoallv_counts) the same way. tpk_comm_split makes sub-groups (the context's mesh,
 * tpk/runtime/init.h).
 * The flight recorder: every call above is also written to comm->flight's ring (kind, group,
 * elements, bytes, the group's sequence number, start and end time; tpk_flight, tpk/base/comm.h).
 * When one returns TPK_ERR_COMM (a timeout, a peer gone), this rank's record is printed through
 * the context's logger (tpk_flight_log: "rank R: last collectives: ..." of its world, TP, DP and PP
 * groups), once per communicator: by the world communicator's report hook where it has one (MPI's
 * asks the other ranks where they are and names the ones that never reached the collective,
 * tpk/runtime/mpi.h), else here. */
#ifndef TPK_COLL_H
#define TPK_COLL_H

#include <limits.h>

#include "buf.h"

static inline void tpk__count(tpk_comm *c, tpk_coll_kind k, size_t elems, tpk_dtype dt) {
    c->stats.calls[k] += 1;
    c->stats.elems[k] += elems;
    c->stats.bytes[k] += elems * tpk_dtype_size(dt);
}
static inline void tpk_comm_stats_reset(tpk_comm *c) { memset(&c->stats, 0, sizeof c->stats); }

/* ---- the flight recorder --------------------------------------------------------------------- */

static inline double tpk__flight_now(void) { return tpk__now_ms() * 1e-3; }
/* The recording context of this translation unit: the last context tpk_ctx_init made on a world
 * with a report hook (tpk_ctx_destroy clears it). A program's own MPI waits on a context without
 * a world (tpk_mpi_wait: the trainer's agreement between steps) are recorded on its world, answer
 * the other ranks' questions and report through it. */
static inline uintptr_t *tpk__flight_slot(void) {
    static uintptr_t ctx; /* an address, kept as a number: it is the caller's context (whose
                             tpk_ctx_destroy clears it), not one this header owns */
    return &ctx;
}
static inline tpk_ctx *tpk__flight_ctx(void) { return (tpk_ctx *)*tpk__flight_slot(); }
/* Record the start of an operation on c (ops[n]: a point-to-point batch's parts; NULL: a
 * collective of `kind`); its operation number. */
static inline uint64_t tpk__flight_begin(tpk_comm *c, tpk_coll_kind kind, size_t elems,
                                         tpk_dtype dt, const tpk_p2p *ops, int n) {
    tpk_flight *f = &c->flight;
    tpk_flight_entry *e = &f->ring[++f->ops % TPK_FLIGHT_N];
    memset(e, 0, sizeof *e);
    e->id = f->ops;
    e->seq = kind == TPK_COLL_N ? ++f->waits : ops ? ++f->batches : ++f->colls;
    e->kind = (int)kind, e->state = TPK_FLIGHT_RUNNING, e->peer = -1, e->t0 = tpk__flight_now();
    e->elems = elems, e->bytes = elems * tpk_dtype_size(dt);
    for (int i = 0; ops && i < n; i++) {
        size_t es = tpk_dtype_size(ops[i].dtype);
        e->elems += ops[i].count, e->bytes += ops[i].count * es;
        if (ops[i].send) e->nsend++;
        else e->nrecv++;
        if (i == 0) e->peer = ops[i].peer;
    }
    return e->id;
}
/* The entry of operation id on c (NULL: overwritten since, or none). */
static inline tpk_flight_entry *tpk__flight_find(tpk_comm *c, uint64_t id) {
    tpk_flight_entry *e = &c->flight.ring[id % TPK_FLIGHT_N];
    return id && e->id == id ? e : NULL;
}
/* The context's group c is: 0 the world, 1 TP, 2 DP, 3 PP, 4 another communicator. */
static inline int tpk__flight_role(const tpk_ctx *ctx, const tpk_comm *c) {
    if (!ctx) return 4;
    return c == ctx->world ? 0 : c == &ctx->tp ? 1 : c == &ctx->dp ? 2 : c == &ctx->pp ? 3 : 4;
}
static inline const char *tpk__flight_role_name(int role) {
    static const char *names[5] = {"world", "TP", "DP", "PP", "group"};
    return role >= 0 && role < 5 ? names[role] : "group";
}
/* The size of group `role` of the context's mesh (0 the world, 1 TP, 2 DP, 3 PP; 0: not known),
 * and the world rank of rank r of the group `role` that world rank w belongs to (the mesh of
 * tpk/runtime/init.h: w = tp + t (cp + c (dp + d pp))); -1 when not known. */
static inline int tpk__flight_group_size(const tpk_ctx *ctx, int role) {
    if (!ctx || !ctx->world) return 0;
    return role == 0   ? ctx->world->size
           : role == 1 ? ctx->tp.size
           : role == 2 ? ctx->dp.size
           : role == 3 ? ctx->pp.size
                       : 0;
}
static inline int tpk__flight_member(const tpk_ctx *ctx, int role, int w, int r) {
    if (!ctx || !ctx->world || r < 0 || r >= tpk__flight_group_size(ctx, role)) return -1;
    int t = ctx->tp.size, c = ctx->cp.size > 1 ? ctx->cp.size : 1, d = ctx->dp.size;
    int tr = w % t, cr = w / t % c, dr = w / (t * c) % d, pr = w / (t * c * d);
    switch (role) {
        case 0: return r;
        case 1: return r + t * (cr + c * (dr + d * pr));
        case 2: return tr + t * (cr + c * (r + d * pr));
        case 3: return tr + t * (cr + c * (dr + d * r));
        default: return -1;
    }
}
/* The world rank of rank r of this rank's group `role`. */
static inline int tpk__flight_world_rank(const tpk_ctx *ctx, int role, int r) {
    return ctx && ctx->world ? tpk__flight_member(ctx, role, ctx->world->rank, r) : -1;
}
/* "TP all-reduce #57" or "PP point-to-point batch #12 (1 send, 1 receive; first peer: rank 3)" of
 * an operation of group `role` (peer: a world rank, -1 unknown) into buf. */
static inline const char *tpk__flight_op_name(int role, int kind, uint64_t seq, int nsend,
                                              int nrecv, int peer, char *buf, size_t n) {
    if (kind == TPK_COLL_N) {
        snprintf(buf, n, "%s MPI wait #%llu (the program's own)", tpk__flight_role_name(role),
                 (unsigned long long)seq);
    } else if (kind == TPK_COLL_SEND || kind == TPK_COLL_RECV) {
        int k = snprintf(buf, n, "%s point-to-point batch #%llu (%d send%s, %d receive%s",
                         tpk__flight_role_name(role), (unsigned long long)seq, nsend,
                         nsend == 1 ? "" : "s", nrecv, nrecv == 1 ? "" : "s");
        if (k > 0 && (size_t)k < n)
            snprintf(buf + k, n - (size_t)k, peer >= 0 ? "; first peer: rank %d)" : ")", peer);
    } else {
        snprintf(buf, n, "%s %s #%llu", tpk__flight_role_name(role),
                 tpk_coll_name((tpk_coll_kind)kind), (unsigned long long)seq);
    }
    return buf;
}
/* The name of entry e of c's ring (tpk__flight_op_name with the peer as a world rank). */
static inline const char *tpk__flight_entry_name(const tpk_ctx *ctx, const tpk_comm *c,
                                                 const tpk_flight_entry *e, char *buf, size_t n) {
    int role = tpk__flight_role(ctx, c);
    int peer = e->peer < 0 ? -1 : role == 4 ? -1 : tpk__flight_world_rank(ctx, role, e->peer);
    if (e->kind == TPK_COLL_N) {
        snprintf(buf, n, "%s %s #%llu (the program's own MPI wait)", tpk__flight_role_name(role),
                 e->what ? e->what : "?", (unsigned long long)e->seq);
        return buf;
    }
    return tpk__flight_op_name(role, e->kind, e->seq, e->nsend, e->nrecv, peer, buf, n);
}
/* This rank's number in the messages: its world rank (its rank in c without a context). */
static inline int tpk__flight_me(const tpk_ctx *ctx, const tpk_comm *c) {
    return ctx && ctx->world ? ctx->world->rank : c ? c->rank : 0;
}

/* Print this rank's flight record through the context's logger at `level`: the last
 * TPK_FLIGHT_N operations of its world, TP, DP and PP groups (and of `also`, another communicator,
 * when not NULL), oldest first, one line each after a line "rank R: last collectives (...):".
 * Groups of one rank are left out (their collectives are copies). A program may call it at any
 * time (on a signal of its own, at the end of a step). */
static inline tpk_status tpk_flight_log(tpk_ctx *ctx, tpk_comm *also, tpk_log_level level) {
    if (!ctx && !also) return TPK_ERR_ARG; /* nothing to print, nowhere to say so */
    if (level < TPK_LOG_ERROR || level > TPK_LOG_DEBUG)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_flight_log",
                         "level: expected TPK_LOG_ERROR, _WARN, _INFO or _DEBUG (1..4), got %d",
                         (int)level);
    tpk_comm *cs[5] = {ctx ? ctx->world : NULL, ctx ? (tpk_comm *)&ctx->tp : NULL,
                       ctx ? (tpk_comm *)&ctx->dp : NULL, ctx ? (tpk_comm *)&ctx->pp : NULL, also};
    const tpk_flight_entry *es[5 * TPK_FLIGHT_N];
    const tpk_comm *ec[5 * TPK_FLIGHT_N];
    int n = 0;
    for (int g = 0; g < 5; g++) {
        tpk_comm *c = cs[g];
        bool seen = false;
        for (int h = 0; h < g; h++) seen = seen || cs[h] == c;
        if (!c || !c->vt || c->size < 2 || seen) continue;
        for (int i = 0; i < TPK_FLIGHT_N; i++) {
            const tpk_flight_entry *e = &c->flight.ring[i];
            if (!e->id) continue;
            int j = n++; /* insertion by start time */
            while (j > 0 && es[j - 1]->t0 > e->t0) es[j] = es[j - 1], ec[j] = ec[j - 1], j--;
            es[j] = e, ec[j] = c;
        }
    }
    int me = tpk__flight_me(ctx, also), first = n > TPK_FLIGHT_N ? n - TPK_FLIGHT_N : 0;
    double now = tpk__flight_now();
    tpk_logf(ctx, level,
             "rank %d: last collectives (%d of this rank's groups' last operations, "
             "oldest first; times before now):",
             me, n - first);
    for (int i = first; i < n; i++) {
        const tpk_flight_entry *e = es[i];
        char name[128], st[64];
        tpk__flight_entry_name(ctx, ec[i], e, name, sizeof name);
        if (e->state == TPK_FLIGHT_DONE) snprintf(st, sizeof st, "done in %.3f s", e->t1 - e->t0);
        else if (e->state == TPK_FLIGHT_FAILED)
            snprintf(st, sizeof st, "FAILED after %.3f s", e->t1 - e->t0);
        else if (ctx && e->id == ec[i]->flight.waiting)
            snprintf(st, sizeof st, "WAITING for %.3f s", now - e->t0);
        else snprintf(st, sizeof st, "started, not waited yet");
        tpk_logf(ctx, level, "rank %d:   %s: %llu elements, %llu bytes, %.3f s ago, %s", me, name,
                 (unsigned long long)e->elems, (unsigned long long)e->bytes, now - e->t0, st);
    }
    return TPK_OK;
}
/* A failure of operation e on c (e NULL: its entry overwritten), waited_s into it: the world's
 * report hook, or this rank's record printed here. */
static inline void tpk__flight_report(tpk_ctx *ctx, tpk_comm *c, const tpk_flight_entry *e,
                                      double waited_s) {
    if (ctx && ctx->world && ctx->world->flight.report) {
        ctx->world->flight.report(ctx, c, e, waited_s);
        return;
    }
    char name[128] = "an operation (its record overwritten)";
    if (e) tpk__flight_entry_name(ctx, c, e, name, sizeof name);
    tpk_logf(ctx, TPK_LOG_ERROR, "rank %d: %s failed after %.3f s (a group of %d ranks)",
             tpk__flight_me(ctx, c), name, waited_s, c->size);
    tpk_flight_log(ctx, c, TPK_LOG_ERROR);
}
/* The communicator whose operation this process waits in now (NULL: none), whichever it is (the
 * context's groups, or another such as a pipeline's tied-embedding group): the flight recorder's
 * answer names that wait (tpk/runtime/mpi.h's tpk__mpi_answer). */
static inline tpk_comm **tpk__flight_waiting_slot(void) {
    static tpk_comm *c;
    return &c;
}
/* Operation id on c returned s; `ended`: it has finished (a blocking form, a wait) rather than
 * started. Marks its entry; on TPK_ERR_COMM reports it (once per communicator). Returns s. */
static inline tpk_status tpk__flight_end(tpk_ctx *ctx, tpk_comm *c, uint64_t id, bool ended,
                                         tpk_status s) {
    tpk_flight_entry *e = tpk__flight_find(c, id);
    double t = tpk__flight_now();
    if (e && (ended || s != TPK_OK))
        e->state = s == TPK_OK ? TPK_FLIGHT_DONE : TPK_FLIGHT_FAILED, e->t1 = t;
    if (s == TPK_ERR_COMM && !c->flight.reported) {
        c->flight.reported = true;
        tpk__flight_report(ctx, c, e, e ? t - e->t0 : 0);
    }
    if (c->flight.waiting == id) c->flight.waiting = 0;
    if (*tpk__flight_waiting_slot() == c) *tpk__flight_waiting_slot() = NULL;
    return s;
}
/* Begin recording: the operation number, which a blocking call (req NULL) waits in and a start
 * form's request keeps for its tpk_wait. */
static inline uint64_t tpk__flight_start(tpk_comm *c, tpk_coll_kind kind, size_t elems,
                                         tpk_dtype dt, const tpk_p2p *ops, int n,
                                         tpk_request *req) {
    uint64_t id = tpk__flight_begin(c, kind, elems, dt, ops, n);
    if (req) req->flight = id, req->kind = (int)kind;
    else c->flight.waiting = id, *tpk__flight_waiting_slot() = c;
    return id;
}

static inline tpk_status tpk__started(tpk_request *req, tpk_status s) {
    if (req && s == TPK_OK) req->active = true;
    return s;
}

static inline tpk_status tpk__check_comm(tpk_ctx *ctx, const char *fn, tpk_comm *c, tpk_dtype dt,
                                         tpk_request *req) {
    if (!c || !c->vt)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "comm: expected an initialised communicator, got %s",
                         c ? "one with no table" : "NULL");
    if (!tpk_dtype_valid(dt))
        return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "dtype: expected f32, bf16 or i32, got %d",
                         (int)dt);
    if (req && req->active)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "req: still holds an unfinished collective; tpk_wait it first");
    return TPK_OK;
}
static inline tpk_status tpk__check_count(tpk_ctx *ctx, const char *fn, const char *arg, size_t n) {
    if (n > (size_t)INT_MAX)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: %zu elements, expected at most %d per call",
                         arg, n, INT_MAX);
    return TPK_OK;
}

/* Whether the profiler names c's rows "dp.": the DP group, and HSDP's shard and replica groups
 * (tpk_ctx_desc.zero_shard_size: ZeRO's collectives split over them). */
static inline bool tpk__coll_is_dp(const tpk_ctx *ctx, const tpk_comm *c) {
    return c == &ctx->dp || c == &ctx->zshard_group || c == &ctx->zrep_group;
}
/* The profiler's name of a collective: kind (0 allreduce, 1 allgather, 2 reduce_scatter, 3 bcast)
 * on the TP group, the DP group or another communicator, started (req) or blocking. */
static inline const char *tpk__coll_name(const tpk_ctx *ctx, const tpk_comm *c, int kind,
                                         const tpk_request *req) {
    static const char *const names[3][2][4] = {
        {{"tp.allreduce", "tp.allgather", "tp.reduce_scatter", "tp.bcast"},
         {"tp.allreduce (start)", "tp.allgather (start)", "tp.reduce_scatter (start)",
          "tp.bcast (start)"}},
        {{"dp.allreduce", "dp.allgather", "dp.reduce_scatter", "dp.bcast"},
         {"dp.allreduce (start)", "dp.allgather (start)", "dp.reduce_scatter (start)",
          "dp.bcast (start)"}},
        {{"allreduce", "allgather", "reduce_scatter", "bcast"},
         {"allreduce (start)", "allgather (start)", "reduce_scatter (start)", "bcast (start)"}}};
    int g = c == &ctx->tp ? 0 : tpk__coll_is_dp(ctx, c) ? 1 : 2;
    return names[g][req ? 1 : 0][kind];
}
/* The profiler's name of a tpk_wait: the group as above and the kind of collective it finishes
 * (req->kind), so the time blocked in waits for started all-gathers is a row of its own
 * ("dp.wait (allgather)") apart from the reduce-scatters' ("dp.wait (reduce_scatter)"). */
static inline const char *tpk__wait_name(const tpk_ctx *ctx, const tpk_comm *c, int kind) {
    static const char *const names[3][TPK_COLL_N] = {
        {"tp.wait (allreduce)", "tp.wait (allgather)", "tp.wait (reduce_scatter)",
         "tp.wait (bcast)", "tp.wait (barrier)", "tp.wait (p2p)", "tp.wait (p2p)",
         "tp.wait (alltoallv)"},
        {"dp.wait (allreduce)", "dp.wait (allgather)", "dp.wait (reduce_scatter)",
         "dp.wait (bcast)", "dp.wait (barrier)", "dp.wait (p2p)", "dp.wait (p2p)",
         "dp.wait (alltoallv)"},
        {"wait (allreduce)", "wait (allgather)", "wait (reduce_scatter)", "wait (bcast)",
         "wait (barrier)", "wait (p2p)", "wait (p2p)", "wait (alltoallv)"}};
    int g = c == &ctx->tp ? 0 : tpk__coll_is_dp(ctx, c) ? 1 : 2;
    return names[g][kind >= 0 && kind < TPK_COLL_N ? kind : 0];
}

static inline tpk_status tpk__allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                        size_t count, tpk_dtype dt, tpk_redop op, tpk_request *req,
                                        const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, dt, req));
    TPK_TRY(tpk__check_count(ctx, fn, "count", count));
    if (count && (!send || !recv))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL buffer for %zu elements",
                         send ? "recv" : "send", count);
    if (op != TPK_SUM && op != TPK_MAX)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "op: expected TPK_SUM or TPK_MAX, got %d", (int)op);
    tpk__count(c, TPK_COLL_ALLREDUCE, count, dt);
    if (req) req->comm = c, req->state = NULL;
    uint64_t id = tpk__flight_start(c, TPK_COLL_ALLREDUCE, count, dt, NULL, 0, req);
    tpk_status s = TPK__PROF_OP(ctx, tpk__coll_name(ctx, c, 0, req),
                                (double)count * (double)tpk_dtype_size(dt), 0,
                                c->vt->allreduce(ctx, c, send, recv, count, dt, op, req));
    return tpk__started(req, tpk__flight_end(ctx, c, id, !req, s));
}
/* recv = op over ranks of send (count elements); send may equal recv. */
static inline tpk_status tpk_allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                       size_t count, tpk_dtype dt, tpk_redop op) {
    return tpk__allreduce(ctx, c, send, recv, count, dt, op, NULL, "tpk_allreduce");
}
static inline tpk_status tpk_allreduce_start(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                             void *recv, size_t count, tpk_dtype dt, tpk_redop op,
                                             tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_allreduce_start",
                         "req: expected a request, got NULL");
    return tpk__allreduce(ctx, c, send, recv, count, dt, op, req, "tpk_allreduce_start");
}

static inline tpk_status tpk__check_counts(tpk_ctx *ctx, const char *fn, tpk_comm *c,
                                           const size_t *counts, size_t total,
                                           const char *total_name) {
    if (!counts)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "counts: expected %d counts, got NULL", c->size);
    size_t sum = 0;
    for (int q = 0; q < c->size; q++) {
        TPK_TRY(tpk__check_count(ctx, fn, "counts[q]", counts[q]));
        sum += counts[q];
    }
    TPK_TRY(tpk__check_count(ctx, fn, "sum of counts", sum));
    if (sum != total)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "counts: the %d counts add up to %zu, expected %s = %zu", c->size, sum,
                         total_name, total);
    return TPK_OK;
}

static inline tpk_status tpk__allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                         size_t sendcount, void *recv, const size_t *counts,
                                         size_t recvcount, tpk_dtype dt, tpk_request *req,
                                         const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, dt, req));
    TPK_TRY(tpk__check_counts(ctx, fn, c, counts, recvcount, "recvcount"));
    if (counts[c->rank] != sendcount)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "counts[%d]: is %zu, expected this rank's sendcount = %zu", c->rank,
                         counts[c->rank], sendcount);
    if ((sendcount && !send) || (recvcount && !recv))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL buffer", recv ? "send" : "recv");
    tpk__count(c, TPK_COLL_ALLGATHER, recvcount, dt);
    if (req) req->comm = c, req->state = NULL;
    uint64_t id = tpk__flight_start(c, TPK_COLL_ALLGATHER, recvcount, dt, NULL, 0, req);
    tpk_status s = TPK__PROF_OP(ctx, tpk__coll_name(ctx, c, 1, req),
                                (double)recvcount * (double)tpk_dtype_size(dt), 0,
                                c->vt->allgatherv(ctx, c, send, recv, counts, dt, req));
    return tpk__started(req, tpk__flight_end(ctx, c, id, !req, s));
}
/* recv[recvcount] = the ranks' send buffers concatenated in rank order; counts[q] is rank q's
 * count (counts[rank] == sendcount, sum == recvcount). Uneven counts are allowed. */
static inline tpk_status tpk_allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                        size_t sendcount, void *recv, const size_t *counts,
                                        size_t recvcount, tpk_dtype dt) {
    return tpk__allgatherv(ctx, c, send, sendcount, recv, counts, recvcount, dt, NULL,
                           "tpk_allgatherv");
}
static inline tpk_status tpk_allgatherv_start(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                              size_t sendcount, void *recv, const size_t *counts,
                                              size_t recvcount, tpk_dtype dt, tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_allgatherv_start",
                         "req: expected a request, got NULL");
    return tpk__allgatherv(ctx, c, send, sendcount, recv, counts, recvcount, dt, req,
                           "tpk_allgatherv_start");
}

static inline tpk_status tpk__reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                              size_t sendcount, void *recv, const size_t *counts,
                                              tpk_dtype dt, tpk_redop op, tpk_request *req,
                                              const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, dt, req));
    TPK_TRY(tpk__check_counts(ctx, fn, c, counts, sendcount, "sendcount"));
    if ((sendcount && !send) || (counts[c->rank] && !recv))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL buffer", send ? "recv" : "send");
    if (send == recv && sendcount)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "recv: must not alias send");
    if (op != TPK_SUM && op != TPK_MAX)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "op: expected TPK_SUM or TPK_MAX, got %d", (int)op);
    tpk__count(c, TPK_COLL_REDUCE_SCATTER, sendcount, dt);
    if (req) req->comm = c, req->state = NULL;
    uint64_t id = tpk__flight_start(c, TPK_COLL_REDUCE_SCATTER, sendcount, dt, NULL, 0, req);
    tpk_status s = TPK__PROF_OP(ctx, tpk__coll_name(ctx, c, 2, req),
                                (double)sendcount * (double)tpk_dtype_size(dt), 0,
                                c->vt->reduce_scatterv(ctx, c, send, recv, counts, dt, op, req));
    return tpk__started(req, tpk__flight_end(ctx, c, id, !req, s));
}
/* send[sendcount] holds the ranks' blocks in rank order (counts[q] each, sum == sendcount);
 * recv[counts[rank]] = op over ranks of this rank's block. */
static inline tpk_status tpk_reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                             size_t sendcount, void *recv, const size_t *counts,
                                             tpk_dtype dt, tpk_redop op) {
    return tpk__reduce_scatterv(ctx, c, send, sendcount, recv, counts, dt, op, NULL,
                                "tpk_reduce_scatterv");
}
static inline tpk_status tpk_reduce_scatterv_start(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                                   size_t sendcount, void *recv,
                                                   const size_t *counts, tpk_dtype dt, tpk_redop op,
                                                   tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_reduce_scatterv_start",
                         "req: expected a request, got NULL");
    return tpk__reduce_scatterv(ctx, c, send, sendcount, recv, counts, dt, op, req,
                                "tpk_reduce_scatterv_start");
}

/* ---- all-to-all with per-peer counts --------------------------------------------------------- */

/* The checks of one side's counts: present, each and their sum within int (MPI's counts and
 * displacements); *total their sum. */
static inline tpk_status tpk__check_a2a_counts(tpk_ctx *ctx, const char *fn, tpk_comm *c,
                                               const char *arg, const size_t *counts,
                                               size_t *total) {
    if (!counts)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected %d counts, got NULL", arg, c->size);
    size_t sum = 0;
    for (int q = 0; q < c->size; q++) {
        if (counts[q] > (size_t)INT_MAX)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s[%d]: %zu elements, expected at most %d", arg,
                             q, counts[q], INT_MAX);
        sum += counts[q];
    }
    if (sum > (size_t)INT_MAX)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "%s: the %d counts add up to %zu elements, expected at most %d", arg,
                         c->size, sum, INT_MAX);
    *total = sum;
    return TPK_OK;
}
static inline tpk_status tpk__alltoallv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                        const size_t *sendcounts, void *recv,
                                        const size_t *recvcounts, tpk_dtype dt, tpk_request *req,
                                        const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, dt, req));
    size_t ns = 0, nr = 0;
    TPK_TRY(tpk__check_a2a_counts(ctx, fn, c, "sendcounts", sendcounts, &ns));
    TPK_TRY(tpk__check_a2a_counts(ctx, fn, c, "recvcounts", recvcounts, &nr));
    if (recvcounts[c->rank] != sendcounts[c->rank])
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "recvcounts[%d]: is %zu, expected this rank's own block sendcounts[%d] "
                         "= %zu",
                         c->rank, recvcounts[c->rank], c->rank, sendcounts[c->rank]);
    if ((ns && !send) || (nr && !recv))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL buffer for %zu elements",
                         ns && !send ? "send" : "recv", ns && !send ? ns : nr);
    if (ns && nr && send == recv)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "recv: must not alias send");
    if (!c->vt->alltoallv)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "comm: the communicator \"%s\" has no all-to-all entry (alltoallv)",
                         c->vt->name ? c->vt->name : "?");
    tpk__count(c, TPK_COLL_ALLTOALL, ns, dt);
    if (req) req->comm = c, req->state = NULL;
    uint64_t id = tpk__flight_start(c, TPK_COLL_ALLTOALL, ns, dt, NULL, 0, req);
    tpk_status s = TPK__PROF_OP(
        ctx, req ? "alltoallv (start)" : "alltoallv", (double)ns * (double)tpk_dtype_size(dt), 0,
        c->vt->alltoallv(ctx, c, send, sendcounts, recv, recvcounts, dt, req));
    return tpk__started(req, tpk__flight_end(ctx, c, id, !req, s));
}
/* All-to-all with per-peer counts (MPI_Alltoallv; NCCL: one group of sends and receives): send
 * holds c->size blocks in rank order, sendcounts[q] elements for rank q; recv gets one block from
 * each rank in rank order, recvcounts[q] from rank q. The counts must agree pairwise —
 * recvcounts[q] here is sendcounts[this rank] on rank q (tpk_alltoallv_counts makes them) —; a
 * rank's own block is copied (recvcounts[rank] == sendcounts[rank], checked here); zero counts are
 * allowed; recv must not alias send. Counted in c->stats as TPK_COLL_ALLTOALL (the elements this
 * rank sends, its own block included). The communicator needs the optional alltoallv entry (MPI,
 * NCCL and the one-rank communicators have it). */
static inline tpk_status tpk_alltoallv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                       const size_t *sendcounts, void *recv,
                                       const size_t *recvcounts, tpk_dtype dt) {
    return tpk__alltoallv(ctx, c, send, sendcounts, recv, recvcounts, dt, NULL, "tpk_alltoallv");
}
static inline tpk_status tpk_alltoallv_start(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                             const size_t *sendcounts, void *recv,
                                             const size_t *recvcounts, tpk_dtype dt,
                                             tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_alltoallv_start",
                         "req: expected a request, got NULL");
    return tpk__alltoallv(ctx, c, send, sendcounts, recv, recvcounts, dt, req,
                          "tpk_alltoallv_start");
}

static inline tpk_status tpk__bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count,
                                    tpk_dtype dt, int root, tpk_request *req, const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, dt, req));
    TPK_TRY(tpk__check_count(ctx, fn, "count", count));
    if (count && !buf)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "buf: NULL buffer for %zu elements", count);
    if (root < 0 || root >= c->size)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "root: expected 0..%d, got %d", c->size - 1, root);
    tpk__count(c, TPK_COLL_BROADCAST, count, dt);
    if (req) req->comm = c, req->state = NULL;
    uint64_t id = tpk__flight_start(c, TPK_COLL_BROADCAST, count, dt, NULL, 0, req);
    tpk_status s = TPK__PROF_OP(ctx, tpk__coll_name(ctx, c, 3, req),
                                (double)count * (double)tpk_dtype_size(dt), 0,
                                c->vt->bcast(ctx, c, buf, count, dt, root, req));
    return tpk__started(req, tpk__flight_end(ctx, c, id, !req, s));
}
static inline tpk_status tpk_bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count, tpk_dtype dt,
                                   int root) {
    return tpk__bcast(ctx, c, buf, count, dt, root, NULL, "tpk_bcast");
}
static inline tpk_status tpk_bcast_start(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count,
                                         tpk_dtype dt, int root, tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_bcast_start", "req: expected a request, got NULL");
    return tpk__bcast(ctx, c, buf, count, dt, root, req, "tpk_bcast_start");
}

static inline tpk_status tpk_barrier(tpk_ctx *ctx, tpk_comm *c) {
    TPK_TRY(tpk__check_comm(ctx, "tpk_barrier", c, TPK_F32, NULL));
    tpk__count(c, TPK_COLL_BARRIER, 0, TPK_F32);
    uint64_t id = tpk__flight_start(c, TPK_COLL_BARRIER, 0, TPK_F32, NULL, 0, NULL);
    return tpk__flight_end(ctx, c, id, true, c->vt->barrier(ctx, c, NULL));
}
static inline tpk_status tpk_barrier_start(tpk_ctx *ctx, tpk_comm *c, tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_barrier_start",
                         "req: expected a request, got NULL");
    TPK_TRY(tpk__check_comm(ctx, "tpk_barrier_start", c, TPK_F32, req));
    tpk__count(c, TPK_COLL_BARRIER, 0, TPK_F32);
    req->comm = c, req->state = NULL;
    uint64_t id = tpk__flight_start(c, TPK_COLL_BARRIER, 0, TPK_F32, NULL, 0, req);
    return tpk__started(req, tpk__flight_end(ctx, c, id, false, c->vt->barrier(ctx, c, req)));
}

/* ---- a long phase announced ----------------------------------------------------------------- */

/* The heartbeat of the MPI world (tpk/runtime/mpi.h's tpk_mpi_heartbeat_init installs it; none:
 * announcing does nothing): a rank about to spend long outside collectives (loading, hashing,
 * saving a checkpoint) tells the others, whose waits then do not count against their timeout. */
typedef void (*tpk__busy_fn)(double budget_s);
static inline tpk__busy_fn *tpk__busy_slot(void) {
    static tpk__busy_fn f;
    return &f;
}
#define TPK_BUSY_PHASE_S 600.0 /* a phase's budget: a checkpoint's load or save */
/* Announce this rank busy: budget_s > 0: the others hold their timeout for up to budget_s seconds
 * (or until tpk_busy_end); 0: a heartbeat, it restarts their timeout (a phase that calls it at
 * least once a timeout needs no budget). Never blocks; a no-op without a heartbeat. */
static inline tpk_status tpk_busy(tpk_ctx *ctx, double budget_s) {
    if (!(budget_s >= 0 && budget_s <= 1e9))
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_busy",
                         "budget_s: expected seconds in [0, 1e9] (0: a heartbeat), got %g",
                         budget_s);
    if (*tpk__busy_slot()) (*tpk__busy_slot())(budget_s);
    return TPK_OK;
}
/* The announced phase is over: the others' timeout starts again from now. */
static inline tpk_status tpk_busy_end(tpk_ctx *ctx) {
    (void)ctx;
    if (*tpk__busy_slot()) (*tpk__busy_slot())(-1);
    return TPK_OK;
}

/* The watchdog's rule, one for every timeout of the kit: the MPI waits (tpk/runtime/mpi.h) and
 * the NCCL communicator's watchdog (kernels/cuda/comm_nccl.cu, fed by tpk/runtime/nccl.h). Times
 * are seconds on any one clock; -HUGE_VAL: never.
 * A peer's note (tpk_busy) arrived at `now`: budget_s > 0 a phase of that many seconds, 0 a
 * heartbeat, < 0 the phase's end. *heard: the arrival of the last note from any peer; *until:
 * the end of that peer's announced phase (-HUGE_VAL: none). */
static inline void tpk__watch_note(double now, double budget_s, double *heard, double *until) {
    if (now > *heard) *heard = now;
    *until = budget_s > 0 ? now + budget_s : -HUGE_VAL;
}
/* The time until which the peers are known to make progress: the latest of `heard` and the ends
 * of the n peers' phases until[q]. */
static inline double tpk__watch_alive(double heard, const double *until, int n) {
    double a = heard;
    for (int q = 0; until && q < n; q++) a = until[q] > a ? until[q] : a;
    return a;
}
/* When a wait that began at t0 times out: timeout_s seconds after the later of t0 and `alive`
 * (tpk__watch_alive; NaN or -HUGE_VAL: nothing heard). So a heartbeat restarts the count, a phase
 * holds it until its budget runs out, and a stopped peer's notes stop: its wait ends timeout_s
 * after it began or after the peer's last note, or at most budget + timeout_s after a phase's
 * start. timeout_s <= 0 (or NaN): never (HUGE_VAL). */
static inline double tpk__watch_deadline(double t0, double alive, double timeout_s) {
    if (!(timeout_s > 0)) return HUGE_VAL;
    return (alive > t0 ? alive : t0) + timeout_s;
}

/* A test's slow rank: TPK_TEST_SLOW_RANK=R:S in the environment makes world rank R (`rank`) spend
 * S seconds here (a busy loop; with heartbeats every 50 ms when `beat`). The kit calls it before
 * hashing a checkpoint's files (tpk/train/ranks.h, with heartbeats), and before loading or saving
 * one and in the first step (tpk/train/trainable.h, under the phase's budget): for tests of the
 * timeout only. */
static inline void tpk__test_slow(int rank, bool beat) {
    const char *v = getenv("TPK_TEST_SLOW_RANK");
    int r = -1;
    double sec = 0;
    if (!v || sscanf(v, "%d:%lf", &r, &sec) != 2 || r != rank || !(sec > 0 && sec < 3600)) return;
    for (double t0 = tpk__now_ms(), t1 = t0; t1 - t0 < sec * 1e3; t1 = tpk__now_ms())
        if (beat) tpk_busy(NULL, 0);
}

/* ---- point-to-point ------------------------------------------------------------------------- */

#define TPK_P2P_MAX 16        /* parts of one batch */
#define TPK_P2P_TAG_MAX 32767 /* the largest tag (the least MPI_TAG_UB an MPI may have) */

static inline tpk_status tpk__p2p(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n,
                                  tpk_request *req, const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, TPK_F32, req));
    if (n < 0 || n > TPK_P2P_MAX || (n && !ops))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "n: expected 0..%d parts%s, got %d", TPK_P2P_MAX,
                         n && !ops ? " and ops" : "", n);
    for (int i = 0; i < n; i++) {
        const tpk_p2p *o = &ops[i];
        if (!tpk_dtype_valid(o->dtype))
            return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "ops[%d].dtype: expected a dtype, got %d", i,
                             (int)o->dtype);
        TPK_TRY(tpk__check_count(ctx, fn, "ops[i].count", o->count));
        if (o->count && !o->buf)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "ops[%d].buf: NULL buffer for %zu elements", i,
                             o->count);
        if (o->peer < 0 || o->peer >= c->size || o->peer == c->rank)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "ops[%d].peer: expected a rank of 0..%d other than this rank %d, "
                             "got %d",
                             i, c->size - 1, c->rank, o->peer);
        if (o->tag < 0 || o->tag > TPK_P2P_TAG_MAX)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "ops[%d].tag: expected 0..%d, got %d", i,
                             TPK_P2P_TAG_MAX, o->tag);
    }
    if (!c->vt->p2p)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "comm: the communicator \"%s\" has no point-to-point entry (p2p)",
                         c->vt->name ? c->vt->name : "?");
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        tpk__count(c, ops[i].send ? TPK_COLL_SEND : TPK_COLL_RECV, ops[i].count, ops[i].dtype);
        bytes += (double)ops[i].count * (double)tpk_dtype_size(ops[i].dtype);
    }
    if (req) req->comm = c, req->state = NULL, req->flight = 0;
    if (!n) return TPK_OK;
    uint64_t id = tpk__flight_start(c, TPK_COLL_SEND, 0, TPK_F32, ops, n, req);
    tpk_status s =
        TPK__PROF_OP(ctx, req ? "p2p (start)" : "p2p", bytes, 0, c->vt->p2p(ctx, c, ops, n, req));
    return tpk__started(req, tpk__flight_end(ctx, c, id, !req, s));
}
/* Run the batch ops[n] of sends and receives (tpk_p2p, tpk/base/comm.h) and wait for all of it:
 * each peer a rank of c other than this one, tags 0..TPK_P2P_TAG_MAX; counted in c->stats as
 * TPK_COLL_SEND and TPK_COLL_RECV. A batch is what NCCL runs as one group: a send and the receive
 * its peer posts in its own batch at the same point do not wait for each other. */
static inline tpk_status tpk_p2p_run(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n) {
    return tpk__p2p(ctx, c, ops, n, NULL, "tpk_p2p_run");
}
static inline tpk_status tpk_p2p_start(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n,
                                       tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_p2p_start", "req: expected a request, got NULL");
    return tpk__p2p(ctx, c, ops, n, req, "tpk_p2p_start");
}
/* One part: a blocking send of count elements to `peer`, and a blocking receive from it. */
static inline tpk_status tpk_send(tpk_ctx *ctx, tpk_comm *c, const void *buf, size_t count,
                                  tpk_dtype dt, int peer, int tag) {
    tpk_p2p o = {(void *)buf, count, dt, peer, tag, true};
    return tpk__p2p(ctx, c, &o, 1, NULL, "tpk_send");
}
static inline tpk_status tpk_recv(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count, tpk_dtype dt,
                                  int peer, int tag) {
    tpk_p2p o = {buf, count, dt, peer, tag, false};
    return tpk__p2p(ctx, c, &o, 1, NULL, "tpk_recv");
}

/* Finish a started collective. Waiting on a request that holds nothing is a no-op. */
static inline tpk_status tpk_wait(tpk_ctx *ctx, tpk_request *req) {
    if (!req) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_wait", "req: expected a request, got NULL");
    if (!req->active) return TPK_OK;
    tpk_comm *c = req->comm;
    uint64_t id = req->flight;
    if (id) c->flight.waiting = id, *tpk__flight_waiting_slot() = c;
    tpk_status s =
        TPK__PROF_OP(ctx, tpk__wait_name(ctx, c, req->kind), 0, 0, c->vt->wait(ctx, req));
    req->active = false, req->state = NULL, req->flight = 0;
    return tpk__flight_end(ctx, c, id, true, s);
}

static inline tpk_status tpk_comm_split(tpk_ctx *ctx, tpk_comm *c, int color, int key,
                                        tpk_comm *out) {
    if (!c || !c->vt || !out)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_comm_split", "%s: NULL", !out ? "out" : "comm");
    if (color < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_comm_split", "color: expected >= 0, got %d", color);
    return c->vt->split(ctx, c, color, key, out);
}
static inline void tpk_comm_destroy(tpk_comm *c) {
    if (c && *tpk__flight_waiting_slot() == c) *tpk__flight_waiting_slot() = NULL;
    if (c && c->vt && c->vt->destroy) c->vt->destroy(c);
    if (c) memset(c, 0, sizeof *c);
}

/* ---- host values over a communicator --------------------------------------------------------- */

/* Collectives on a few values in host memory (a loss, a squared norm, a flag, a token): staged
 * through the context's backend memory (ctx->work[0]), so they run on any communicator, NCCL's
 * device-only ones included. vals[n] of dt; blocking. */
static inline tpk_status tpk__host_coll(tpk_ctx *ctx, const char *fn, tpk_comm *c, void *vals,
                                        size_t n, tpk_dtype dt, tpk_redop op, int root,
                                        bool bcast) {
    if (!ctx || !ctx->ops) return TPK_ERR_ARG;
    if (n && !vals) return tpk__fail(ctx, TPK_ERR_ARG, fn, "vals: NULL buffer for %zu elements", n);
    size_t bytes = n * tpk_dtype_size(dt);
    bool dev = ctx->ops->device && bytes;
    TPK_TRY(tpk__buf_reserve(ctx, &ctx->work[0], bytes));
    void *b = dev ? ctx->work[0].p : vals;
    if (dev) TPK_TRY(tpk_op_memcpy(ctx, b, vals, bytes, TPK_H2D));
    TPK_TRY(bcast ? tpk_bcast(ctx, c, b, n, dt, root) : tpk_allreduce(ctx, c, b, b, n, dt, op));
    return dev ? tpk_op_memcpy(ctx, vals, b, bytes, TPK_D2H) : TPK_OK;
}
static inline tpk_status tpk_allreduce_host(tpk_ctx *ctx, tpk_comm *c, void *vals, size_t n,
                                            tpk_dtype dt, tpk_redop op) {
    return tpk__host_coll(ctx, "tpk_allreduce_host", c, vals, n, dt, op, 0, false);
}
static inline tpk_status tpk_bcast_host(tpk_ctx *ctx, tpk_comm *c, void *vals, size_t n,
                                        tpk_dtype dt, int root) {
    return tpk__host_coll(ctx, "tpk_bcast_host", c, vals, n, dt, TPK_SUM, root, true);
}
/* recvcounts[q] = rank q's sendcounts[this rank], for each rank q of c: the counts of a
 * tpk_alltoallv, exchanged by an all-to-all of one int32 per rank (host values staged through
 * the context's backend memory, ctx->work[0]; blocking). counts[q] <= INT_MAX. */
static inline tpk_status tpk_alltoallv_counts(tpk_ctx *ctx, tpk_comm *c, const size_t *sendcounts,
                                              size_t *recvcounts) {
    static const char *fn = "tpk_alltoallv_counts";
    if (!ctx || !ctx->ops) return TPK_ERR_ARG;
    TPK_TRY(tpk__check_comm(ctx, fn, c, TPK_I32, NULL));
    size_t total = 0;
    TPK_TRY(tpk__check_a2a_counts(ctx, fn, c, "sendcounts", sendcounts, &total));
    if (!recvcounts)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "recvcounts: expected room for %d counts, got NULL",
                         c->size);
    size_t n = (size_t)c->size, bytes = 2 * n * sizeof(int32_t);
    int32_t *h = (int32_t *)tpk__malloc(ctx, bytes + 2 * n * sizeof(size_t));
    if (!h) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %zu counts", 2 * n);
    size_t *ones = (size_t *)(void *)(h + 2 * n); /* one element to and from every rank */
    for (size_t q = 0; q < n; q++) h[q] = (int32_t)sendcounts[q], ones[q] = 1;
    bool dev = ctx->ops->device;
    tpk_status s = tpk__buf_reserve(ctx, &ctx->work[0], bytes);
    int32_t *b = s == TPK_OK && dev ? (int32_t *)ctx->work[0].p : h;
    if (s == TPK_OK && dev) s = tpk_op_memcpy(ctx, b, h, n * sizeof(int32_t), TPK_H2D);
    if (s == TPK_OK) s = tpk_alltoallv(ctx, c, b, ones, b + n, ones, TPK_I32);
    if (s == TPK_OK && dev) s = tpk_op_memcpy(ctx, h + n, b + n, n * sizeof(int32_t), TPK_D2H);
    for (size_t q = 0; s == TPK_OK && q < n; q++) {
        if (h[n + q] < 0) {
            s = tpk__fail(ctx, TPK_ERR_COMM, fn, "rank %zu sent a count of %d", q, (int)h[n + q]);
            break;
        }
        recvcounts[q] = (size_t)h[n + q];
    }
    tpk__free(ctx, h);
    return s;
}
/* Every rank of c passes its own status; all get TPK_OK only when all passed TPK_OK, else a
 * failing status (a rank's own when it failed) — so ranks stop together instead of hanging. */
static inline tpk_status tpk_agree(tpk_ctx *ctx, tpk_comm *c, tpk_status mine) {
    int32_t v[2] = {mine == TPK_OK ? 0 : 1, mine == TPK_OK ? 0 : (int32_t)mine};
    tpk_status s = tpk_allreduce_host(ctx, c, v, 2, TPK_I32, TPK_MAX);
    if (s != TPK_OK) return s;
    return v[0] ? (mine != TPK_OK ? mine : (tpk_status)v[1]) : TPK_OK;
}

#endif /* TPK_COLL_H */
