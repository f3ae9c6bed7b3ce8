/* tpk/plan/count.h — a counting backend and a counting communicator: the kit's real code walked
 * without memory and without arithmetic (the planner's dry run, tpk/plan/plan.h).
 *
 * The backend (c->ops) is a dry run's table (tpk_ops.dry_run): the front end (tpk/runtime/op.h)
 * checks each op's arguments, hands its name, bytes and flops to the profiler as in a real run and
 * calls no compute entry, so the table has its four memory entries alone. It allocates no memory:
 * alloc gives each buffer an address of its own in a range that is never mapped (a dereference
 * faults), so a layer's pointer tests work and any host access to a buffer would show at once;
 * free and sync do nothing; a copy to the host writes zeros. It says it is a device (device =
 * true), so the front end never reads its buffers. The fused entries mark the fusions of the
 * backend planned for (never called). What it counts is the context's own: ctx->mem and
 * ctx->mem_peak (tpk/runtime/buf.h) move exactly as in a real run, because the same calls grow and
 * free the same tpk_bufs — the planned peak is the run's.
 *
 * The communicator is one rank of a world of N = tp cp dp pp ranks (its mesh), gpus_per_node a
 * node. Its splits replay tpk_ctx_init's (tpk__mesh_split_cp: TP, DP, PP, and at cp > 1 CP and
 * DP x CP; at ep > 1 then EP and EDP: tpk__mesh_split_ep; under HSDP, c->zs, its shard and
 * replica groups: tpk__mesh_split_zero) and the pipeline's tied-embedding group
 * (stages 0 and P - 1 of the PP group); another split is an error naming it. A group knows its
 * members' world ranks, so whether it spans nodes. Collectives move nothing; a point-to-point
 * batch (the pipeline's messages, the CP ring's) and the all-to-all with per-peer counts (the MoE
 * dispatcher's, tpk/layers/moe.h: the larger of the bytes sent to and received from the other
 * ranks, one latency per peer) are costed like a collective on the group's channel.
 *
 * Time: with tpk_count_attach the profiler's hook (tpk/runtime/profile.h) hands every op's name,
 * bytes and flops to the cost model (tpk/plan/hw.h), which advances the compute clock t; each
 * collective is costed on its group's channel: a blocking one starts when both the clock and the
 * channel are free and holds the clock until it ends; a started one (a request) runs on the channel
 * while compute goes on, and tpk_wait moves the clock to its end (the overlap the code schedules:
 * the TP all-reduce of dgrad under wgrad, DP buckets under the backward). */
#ifndef TPK_COUNT_H
#define TPK_COUNT_H

#include <stdint.h>

#include "../runtime/init.h"
#include "../runtime/profile.h"
#include "hw.h"

enum { TPK_COUNT_CHANNELS = 8 };

typedef struct tpk_count {
    tpk_ops ops;                 /* the table (tpk_count_init) */
    const tpk_hw *hw;            /* the cost model (NULL: memory only) */
    uintptr_t next;              /* the next address alloc gives */
    int world, rank, tp, dp, pp; /* the mesh and this rank */
    int gpus_per_node;
    int splits; /* the world's splits so far (tpk_ctx_init's three; five at cp > 1) */
    int zs;     /* HSDP's shard size (tpk_ctx_desc.zero_shard_size; 0: none): its two splits
                   (shard and replica groups, tpk__mesh_split_zero) replayed after the mesh's */
    double t;   /* the compute clock, seconds */
    double t_ops, t_coll, t_exposed; /* compute, collectives' own time, and the part of it the
                                        clock waited for */
    double flops, bytes;             /* counted by the ops */
    bool coll;                       /* a collective's entry ran: the hook skips its record */
    double max_elems;                /* the most elements one collective call moved (the front
                                        end refuses past INT_MAX: tpk/runtime/coll.h) */
    /* per channel (a group's, in the order first used; past TPK_COUNT_CHANNELS - 1 the last slot
       takes the rest): its collectives' time and the clock's waits on it (the planner's check
       that a probe is past its transients, tpk/plan/plan.h) */
    const void *chan[TPK_COUNT_CHANNELS];
    double chan_busy[TPK_COUNT_CHANNELS], chan_wait[TPK_COUNT_CHANNELS];
    int nchan;
    tpk_allocator al; /* the host memory of its communicators: tpk_count_init's context's */
    int cp;           /* context parallelism: the world is TP x CP x DP x PP (tpk_count_init_cp) */
    int ep;           /* expert parallelism: EP groups of ep of the DP ranks (tpk_count_init_ep) */
} tpk_count;

typedef struct tpk__count_comm {
    tpk_count *c;
    int *members;   /* [size] world ranks, by rank in the group */
    bool world;     /* the counting world itself */
    bool inter;     /* the members span nodes */
    double free_at; /* when its channel is free */
} tpk__count_comm;

static inline tpk_count *tpk__count_of(tpk_ctx *ctx) { return (tpk_count *)ctx->ops->self; }

/* A started collective's end and channel (tpk_request.state) */
typedef struct tpk__count_req {
    double end;
    int chan;
} tpk__count_req;

/* The slot of channel cc in c's per-channel figures. */
static inline int tpk__count_chan(tpk_count *c, const void *cc) {
    for (int i = 0; i < c->nchan; i++)
        if (c->chan[i] == cc) return i;
    if (c->nchan == TPK_COUNT_CHANNELS) return TPK_COUNT_CHANNELS - 1;
    c->chan[c->nchan] = cc;
    return c->nchan++;
}

/* ---- the backend -------------------------------------------------------------------------- */

static inline tpk_status tpk__count_alloc(tpk_ctx *ctx, size_t bytes, void **out) {
    tpk_count *c = tpk__count_of(ctx);
    *out = (void *)c->next;
    c->next += (bytes + 255) / 256 * 256 + 256; /* distinct, aligned, never mapped */
    return TPK_OK;
}
static inline void tpk__count_free(tpk_ctx *ctx, void *p) { (void)ctx, (void)p; }
static inline tpk_status tpk__count_memcpy(tpk_ctx *ctx, void *dst, const void *src, size_t bytes,
                                           tpk_copy_dir dir) {
    (void)ctx;
    if (dir == TPK_D2H) memset(dst, 0, bytes); /* the host reads zeros */
    else if (dir == TPK_H2H) memmove(dst, src, bytes);
    return TPK_OK;
}
static inline tpk_status tpk__count_sync(tpk_ctx *ctx) {
    (void)ctx;
    return TPK_OK;
}

/* The table into c->ops: a dry run's (the memory entries alone); its fused entries mark where
 * `like` fuses (like NULL: every fusion, as the CUDA backend; the host composes the fused linear
 * and residual-layernorm) — never called, so the compositions serve as the marks. */
static inline void tpk__count_table(tpk_count *c, const tpk_ops *like) {
    tpk_ops *o = &c->ops;
    memset(o, 0, sizeof *o);
    o->name = "count", o->self = c, o->device = true, o->dry_run = true;
    o->alloc = tpk__count_alloc, o->free = tpk__count_free, o->memcpy = tpk__count_memcpy;
    o->sync = tpk__count_sync;
    if (!like || like->linear_fwd) o->linear_fwd = tpk__compose_linear_fwd;
    if (!like || like->linear_bwd_act) o->linear_bwd_act = tpk__compose_linear_bwd_act;
    if (!like || like->residual_layernorm_fwd)
        o->residual_layernorm_fwd = tpk__compose_residual_layernorm_fwd;
    if (!like || like->xent_fused) o->xent_fused = tpk__compose_xent_fused;
}

/* ---- the communicator --------------------------------------------------------------------- */

/* A collective of `kind` moving `bytes` on group g: its time on g's channel (see the top). */
static inline tpk_status tpk__count_coll(tpk_ctx *ctx, tpk_comm *g, tpk_coll_kind kind,
                                         double bytes, double elems, tpk_request *req) {
    tpk__count_comm *cc = (tpk__count_comm *)g->impl;
    tpk_count *c = cc->c;
    c->coll = true;
    if (elems > c->max_elems) c->max_elems = elems;
    (void)ctx;
    if (!c->hw) return TPK_OK;
    double sec = tpk_hw_coll_seconds(c->hw, kind, bytes, g->size, cc->inter),
           start = c->t > cc->free_at ? c->t : cc->free_at;
    int ch = tpk__count_chan(c, cc);
    cc->free_at = start + sec;
    c->t_coll += sec, c->chan_busy[ch] += sec;
    if (req) { /* its end, for tpk_wait */
        tpk__count_req *r = (tpk__count_req *)tpk__al_malloc(&c->al, sizeof *r);
        if (!r)
            return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_count (collective)", "out of host memory");
        r->end = cc->free_at, r->chan = ch, req->state = r;
    } else {
        c->t_exposed += cc->free_at - c->t, c->chan_wait[ch] += cc->free_at - c->t;
        c->t = cc->free_at;
    }
    return TPK_OK;
}
static inline tpk_status tpk__count_c_allreduce(tpk_ctx *ctx, tpk_comm *g, const void *send,
                                                void *recv, size_t count, tpk_dtype dt,
                                                tpk_redop op, tpk_request *req) {
    (void)send, (void)recv, (void)op;
    return tpk__count_coll(ctx, g, TPK_COLL_ALLREDUCE, (double)count * tpk_dtype_size(dt),
                           (double)count, req);
}
static inline double tpk__count_sum(const tpk_comm *g, const size_t *counts, tpk_dtype dt) {
    double n = 0;
    for (int q = 0; q < g->size; q++) n += (double)counts[q];
    return n * (double)tpk_dtype_size(dt);
}
static inline tpk_status tpk__count_c_allgatherv(tpk_ctx *ctx, tpk_comm *g, const void *send,
                                                 void *recv, const size_t *counts, tpk_dtype dt,
                                                 tpk_request *req) {
    (void)send, (void)recv;
    double bytes = tpk__count_sum(g, counts, dt);
    return tpk__count_coll(ctx, g, TPK_COLL_ALLGATHER, bytes, bytes / tpk_dtype_size(dt), req);
}
static inline tpk_status tpk__count_c_reduce_scatterv(tpk_ctx *ctx, tpk_comm *g, const void *send,
                                                      void *recv, const size_t *counts,
                                                      tpk_dtype dt, tpk_redop op,
                                                      tpk_request *req) {
    (void)send, (void)recv, (void)op;
    double bytes = tpk__count_sum(g, counts, dt);
    return tpk__count_coll(ctx, g, TPK_COLL_REDUCE_SCATTER, bytes, bytes / tpk_dtype_size(dt), req);
}
static inline tpk_status tpk__count_c_bcast(tpk_ctx *ctx, tpk_comm *g, void *buf, size_t count,
                                            tpk_dtype dt, int root, tpk_request *req) {
    (void)buf, (void)root;
    return tpk__count_coll(ctx, g, TPK_COLL_BROADCAST, (double)count * tpk_dtype_size(dt),
                           (double)count, req);
}
static inline tpk_status tpk__count_c_barrier(tpk_ctx *ctx, tpk_comm *g, tpk_request *req) {
    tpk_status s = tpk__count_coll(ctx, g, TPK_COLL_BARRIER, 0, 0, req);
    ((tpk__count_comm *)g->impl)->c->coll = false; /* not profiled: no record to skip */
    return s;
}
static inline tpk_status tpk__count_c_wait(tpk_ctx *ctx, tpk_request *req) {
    tpk_count *c = tpk__count_of(ctx);
    c->coll = true;
    tpk__count_req *r = (tpk__count_req *)req->state;
    if (r && r->end > c->t) {
        c->t_exposed += r->end - c->t, c->chan_wait[r->chan] += r->end - c->t;
        c->t = r->end;
    }
    tpk__al_free(&c->al, r);
    req->state = NULL;
    return TPK_OK;
}
/* A batch of sends and receives: the larger direction's bytes, one latency (the pipeline's peer
 * waits are the schedule's, played by the planner: tpk_pipe_check_costs). */
static inline tpk_status tpk__count_c_p2p(tpk_ctx *ctx, tpk_comm *g, const tpk_p2p *ops, int n,
                                          tpk_request *req) {
    tpk__count_comm *cc = (tpk__count_comm *)g->impl;
    double sent = 0, got = 0, most = 0;
    bool inter = false;
    for (int i = 0; i < n; i++) {
        double b = (double)ops[i].count * (double)tpk_dtype_size(ops[i].dtype);
        most = (double)ops[i].count > most ? (double)ops[i].count : most;
        *(ops[i].send ? &sent : &got) += b;
        int gpn = cc->c->gpus_per_node;
        inter = inter || cc->members[ops[i].peer] / gpn != cc->members[g->rank] / gpn;
    }
    bool keep = cc->inter;
    cc->inter = inter;
    tpk_status s = tpk__count_coll(ctx, g, TPK_COLL_SEND, sent > got ? sent : got, most, req);
    cc->inter = keep;
    return s;
}
/* The all-to-all with per-peer counts: the larger of the bytes sent to and received from the
 * other ranks (this rank's own block stays), costed as TPK_COLL_ALLTOALL (tpk/plan/hw.h). */
static inline tpk_status tpk__count_c_alltoallv(tpk_ctx *ctx, tpk_comm *g, const void *send,
                                                const size_t *sendcounts, void *recv,
                                                const size_t *recvcounts, tpk_dtype dt,
                                                tpk_request *req) {
    (void)send, (void)recv;
    double sent = 0, got = 0, most = 0, es = (double)tpk_dtype_size(dt);
    for (int q = 0; q < g->size; q++) {
        double a = (double)sendcounts[q], b = (double)recvcounts[q];
        most += a > b ? a : b;
        if (q != g->rank) sent += a * es, got += b * es;
    }
    return tpk__count_coll(ctx, g, TPK_COLL_ALLTOALL, sent > got ? sent : got, most, req);
}
static inline void tpk__count_c_destroy(tpk_comm *g) {
    tpk__count_comm *cc = (tpk__count_comm *)g->impl;
    if (cc) tpk__al_free(&cc->c->al, cc->members), tpk__al_free(&cc->c->al, cc);
    g->impl = NULL;
}
static inline tpk_status tpk__count_c_split(tpk_ctx *ctx, tpk_comm *g, int color, int key,
                                            tpk_comm *out);
static const tpk_comm_vtable tpk__count_comm_vt = {"count", TPK__COMM_TABLE(tpk__count_c_),
                                                   tpk__count_c_destroy, tpk__count_c_p2p,
                                                   tpk__count_c_alltoallv};

/* A group of `n` members (world ranks, by rank), this rank among them. */
static inline tpk_status tpk__count_group(tpk_ctx *ctx, tpk_count *c, const int *members, int n,
                                          bool world, tpk_comm *out) {
    tpk__count_comm *cc = (tpk__count_comm *)tpk__al_calloc(&c->al, 1, sizeof *cc);
    int *m = (int *)tpk__al_malloc(&c->al, sizeof(int) * (size_t)n);
    if (!cc || !m) {
        tpk__al_free(&c->al, cc), tpk__al_free(&c->al, m);
        return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_count", "out of host memory");
    }
    memcpy(m, members, sizeof(int) * (size_t)n);
    cc->c = c, cc->members = m, cc->world = world;
    memset(out, 0, sizeof *out);
    out->vt = &tpk__count_comm_vt, out->impl = cc, out->size = n, out->device = true;
    for (int i = 0; i < n; i++) {
        if (m[i] == c->rank) out->rank = i;
        cc->inter = cc->inter || m[i] / c->gpus_per_node != m[0] / c->gpus_per_node;
    }
    return TPK_OK;
}

/* World split gi of a dry run for world rank w: the mesh's (base of them), EP's (epn), HSDP's. */
static inline void tpk__count_mesh_split(const tpk_count *c, int w, int gi, int base, int epn,
                                         int *color, int *key) {
    if (gi < base) tpk__mesh_split_cp(w, c->tp, c->cp, c->dp, gi, color, key);
    else if (gi < base + epn)
        tpk__mesh_split_ep(w, c->tp, c->cp, c->dp, c->ep, gi - base, color, key);
    else tpk__mesh_split_zero(w, c->tp, c->cp, c->dp, c->zs, gi - base - epn, color, key);
}

/* The splits a dry run meets: of the world, tpk_ctx_init's three (TP, DP, PP, in that order), at
 * cp > 1 its two more (CP, then DP x CP: tpk__mesh_split_cp) and at ep > 1 its last two (EP, then
 * EDP: tpk__mesh_split_ep); of a group of P ranks, the tied
 * embedding's (ranks 0 and P - 1: color 0, the others 1, key = rank). Each is checked against the
 * rule it replays. */
static inline tpk_status tpk__count_c_split(tpk_ctx *ctx, tpk_comm *g, int color, int key,
                                            tpk_comm *out) {
    static const char *fn = "tpk_comm_split (count)";
    tpk__count_comm *cc = (tpk__count_comm *)g->impl;
    tpk_count *c = cc->c;
    int n = g->size, k = 0;
    int *m = (int *)tpk__al_malloc(&c->al, sizeof(int) * (size_t)(n > 0 ? n : 1));
    if (!m) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    bool known = false;
    int base = c->cp > 1 ? 5 : 3, ep = c->ep > 1 ? c->ep : 1, epn = ep > 1 ? 2 : 0;
    if (cc->world && c->splits < base + epn + (c->zs ? 2 : 0)) {
        int gi = c->splits++, want_c, want_k;
        tpk__count_mesh_split(c, c->rank, gi, base, epn, &want_c, &want_k);
        known = want_c == color && want_k == key;
        for (int w = 0; known && w < n; w++) { /* ordered by key: by the group's rank */
            int cw, kw;
            tpk__count_mesh_split(c, w, gi, base, epn, &cw, &kw);
            if (cw == color) m[kw] = w, k++;
        }
    } else if (!cc->world && key == g->rank &&
               color == (g->rank == 0 || g->rank == n - 1 ? 0 : 1)) {
        known = true;
        for (int r = 0; r < n; r++)
            if ((r == 0 || r == n - 1 ? 0 : 1) == color) m[k++] = cc->members[r];
    }
    tpk_status s = known ? tpk__count_group(ctx, c, m, k, false, out)
                         : tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                                     "color %d, key %d on rank %d of %d: not a split the counting "
                                     "communicator replays (tpk_ctx_init's mesh, TP x CP x DP x "
                                     "PP, EP, EDP, HSDP's, the tied embedding's group)",
                                     color, key, g->rank, n);
    tpk__al_free(&c->al, m);
    return s;
}

/* ---- setup -------------------------------------------------------------------------------- */

/* Count for rank `rank` of a world of tp x cp x dp x pp ranks (world rank
 * tp rank + tp (cp rank + cp (dp rank + dp pp rank))), gpus_per_node to a node, ops like `like`
 * (NULL: every fused entry), costed by hw (NULL: memory alone). Addresses start at 2^56: above
 * every mapping of a 64-bit process (the dry run needs 64-bit pointers). */
static inline tpk_status tpk_count_init_cp(tpk_ctx *err, tpk_count *c, const tpk_hw *hw,
                                           const tpk_ops *like, int tp, int cp, int dp, int pp,
                                           int rank, int gpus_per_node) {
    static const char *fn = "tpk_count_init";
    memset(c, 0, sizeof *c);
    if (sizeof(void *) < 8)
        return tpk__fail(err, TPK_ERR_UNSUPPORTED, fn, "the dry run needs 64-bit pointers");
    if (tp < 1 || cp < 1 || dp < 1 || pp < 1 || gpus_per_node < 1 || rank < 0 ||
        (double)tp * cp * dp * pp > INT_MAX || rank >= tp * cp * dp * pp)
        return tpk__fail(err, TPK_ERR_ARG, fn,
                         "expected tp, cp, dp, pp, gpus_per_node >= 1 and 0 <= rank < tp cp dp pp, "
                         "got %d, %d, %d, %d, %d, rank %d",
                         tp, cp, dp, pp, gpus_per_node, rank);
    tpk__count_table(c, like);
    c->hw = hw, c->next = (uintptr_t)1 << 56;
    c->world = tp * cp * dp * pp, c->rank = rank, c->tp = tp, c->cp = cp, c->dp = dp, c->pp = pp;
    c->gpus_per_node = gpus_per_node, c->ep = 1;
    if (err) c->al = err->allocator;
    return TPK_OK;
}
/* The same with expert parallelism: EP groups of ep of the dp DP ranks (ep divides dp), whose
 * splits (EP, EDP) the communicator replays after the mesh's. */
static inline tpk_status tpk_count_init_ep(tpk_ctx *err, tpk_count *c, const tpk_hw *hw,
                                           const tpk_ops *like, int tp, int cp, int dp, int pp,
                                           int ep, int rank, int gpus_per_node) {
    TPK_TRY(tpk_count_init_cp(err, c, hw, like, tp, cp, dp, pp, rank, gpus_per_node));
    if (ep < 1 || dp % ep)
        return tpk__fail(err, TPK_ERR_ARG, "tpk_count_init",
                         "ep: expected a divisor of the DP size %d, got %d", dp, ep);
    c->ep = ep;
    return TPK_OK;
}
/* The same at cp = 1: a world of tp x dp x pp ranks. */
static inline tpk_status tpk_count_init(tpk_ctx *err, tpk_count *c, const tpk_hw *hw,
                                        const tpk_ops *like, int tp, int dp, int pp, int rank,
                                        int gpus_per_node) {
    return tpk_count_init_cp(err, c, hw, like, tp, 1, dp, pp, rank, gpus_per_node);
}
/* The world communicator of c (tpk_comm_destroy frees it). */
static inline tpk_status tpk_count_world(tpk_ctx *err, tpk_count *c, tpk_comm *out) {
    int *m = (int *)tpk__al_malloc(&c->al, sizeof(int) * (size_t)c->world);
    if (!m) return tpk__fail(err, TPK_ERR_NOMEM, "tpk_count_world", "out of host memory");
    for (int w = 0; w < c->world; w++) m[w] = w;
    tpk_status s = tpk__count_group(err, c, m, c->world, true, out);
    tpk__al_free(&c->al, m);
    return s;
}

/* The profiler's hook: an op advances the clock by its modelled time; a collective's record is
 * skipped (its entry costed it). */
static inline void tpk__count_hook(tpk_ctx *ctx, void *user, const char *name, double bytes,
                                   double flops) {
    tpk_count *c = (tpk_count *)user;
    (void)ctx;
    if (c->coll) {
        c->coll = false;
        return;
    }
    c->flops += flops, c->bytes += bytes;
    if (!c->hw) return;
    double s = tpk_hw_op_seconds(c->hw, name, bytes, flops);
    c->t += s, c->t_ops += s;
}
/* The modelled clock (a pipeline executor's: tpk_pipe.clock). */
static inline double tpk__count_clock(void *user) { return ((tpk_count *)user)->t; }

/* Time the context's ops and collectives on c's model (after tpk_ctx_init on c's table). */
static inline tpk_status tpk_count_attach(tpk_ctx *ctx, tpk_count *c) {
    TPK_TRY(tpk_profile_start(ctx));
    ctx->prof->hook = tpk__count_hook, ctx->prof->hook_user = c;
    return TPK_OK;
}

#endif /* TPK_COUNT_H */
