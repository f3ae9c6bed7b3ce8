/* tpk/runtime/init.h — the context's lifecycle: tpk_ctx_init and tpk_ctx_destroy.
 *
 * tpk_ctx_init takes the backend table (desc->ops; NULL: the default backend, tpk_ops_default,
 * which the host archive defines), the world communicator (NULL: one rank, `self`), the TP size t,
 * the context-parallel size c and the pipeline's stage count p, and splits the world of n = t c d p
 * ranks into a mesh, TP fastest, then CP, then DP, then PP (Megatron-LM's order):
 *   world rank w = tp + t (cp + c (dp + d pp)):  TP rank w % t, CP rank (w / t) % c,
 *                                                DP rank (w / (t c)) % d, stage w / (t c d)
 * TP's collectives run in every layer and want the fastest links (consecutive ranks: one node);
 * CP's ring passes keys and values in every attention layer, next after TP; DP's gradient
 * reduction runs once a step, its buckets under the backward; the pipeline sends one activation
 * per micro-batch and stage and tolerates the slowest links, so its stages lie farthest apart (a
 * stage's TP group stays in a node, the stages across nodes). With c = 1 the mesh is the TP x DP
 * x PP one (CP rank 0, ctx->cp one rank of its own, no split made); with p = 1 the TP x DP one of
 * before (DP rank w / t). Expert parallelism (EP, e = desc->ep) is carved out of the DP ranks,
 * not a dimension of its own: e divides d, an EP group is e consecutive DP ranks (DP ranks e k ..
 * e k + e - 1 of one TP rank, CP rank and stage; EP rank: dp rank % e), and ctx->edp holds the
 * replicas of an expert (d / e x c ranks: the same TP rank, stage and EP rank); at e = 1 ctx->ep is
 * one rank of its own and ctx->edp is ctx->dp_cp (no split made).
 * HSDP (desc->zero_shard_size S) cuts the DP x CP group once more, for ZeRO alone: shard groups of
 * S consecutive DP x CP ranks (ctx->zshard) and replica groups across them (ctx->zrep), split last
 * and only when 2 <= S < DP x CP. A table with a missing entry is
 * refused, naming the entry (a dry run's, tpk_ops.dry_run, needs its memory entries alone); p > 1
 * needs a world with point-to-point (its p2p entry), e > 1 one with an all-to-all (alltoallv). */
#ifndef TPK_INIT_H
#define TPK_INIT_H

#include "../base/env.h"
#include "buf.h"
#include "coll.h"
#include "comm_self.h"

/* The default backend: defined by the host backend (kernels/host, in libtpk_host.a and
 * libtpk_cuda.a) and declared weak here, so a program that passes its own table links without
 * either archive. A static link extracts it only when asked: the Makefile and tpk.pc link with
 * -Wl,-u,tpk_ops_default; otherwise pass .ops = tpk_ops_host() (tpk/runtime/host.h). */
#if defined(__GNUC__) || defined(__clang__)
TPK_EXTERN_C const tpk_ops *tpk_ops_default(void) __attribute__((weak));
#define TPK__DEFAULT_OPS() (tpk_ops_default ? tpk_ops_default() : NULL)
#else
#define TPK__DEFAULT_OPS() NULL
#endif

static inline void tpk_ctx_destroy(tpk_ctx *ctx);

/* The TP split's weights into ctx->tp_w (NULL: even), after checking that every rank of the world
 * was given the same (one all-reduce of the weights and their negatives, MAX, over the world):
 * ranks that split differently would exchange mismatched shards. */
static inline tpk_status tpk__ctx_weights(tpk_ctx *ctx, const char *fn, const double *weights,
                                          int tp) {
    double *x = (double *)tpk__calloc(ctx, (size_t)(2 * tp + 1), sizeof(double)); /* [w, -w, 1] */
    if (!x) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d TP weights", tp);
    for (int q = 0; q < tp; q++) x[q] = weights ? weights[q] : 0, x[tp + q] = -x[q];
    x[2 * tp] = weights ? 1 : 0;
    tpk_status s = tpk_allreduce_host(ctx, ctx->world, x, (size_t)(2 * tp + 1), TPK_F64, TPK_MAX);
    bool same = true;
    for (int q = 0; s == TPK_OK && q < tp; q++)
        same = same && x[q] == -x[tp + q] && x[q] == (weights ? weights[q] : 0);
    if (s == TPK_OK && !same)
        s = tpk__fail(ctx, TPK_ERR_ARG, fn,
                      "desc->tp_weights: the ranks were given different weights (or some none)");
    if (s == TPK_OK && weights) {
        ctx->tp_w = x; /* the first tp entries: the weights */
        return TPK_OK;
    }
    tpk__free(ctx, x);
    return s;
}

/* The mesh's groups as splits of the world (tpk_ctx_init; a counting world replays them, tpk/plan):
 * world rank w = tp rank + tp (cp rank + cp (dp rank + dp pp rank)); group g = 0 (TP: consecutive
 * ranks, keyed by TP rank), 1 (DP: the same TP and CP rank and stage, keyed by DP rank), 2 (PP: the
 * same TP, CP and DP rank, keyed by stage), 3 (CP: the same TP and DP rank and stage, keyed by
 * CP rank) or 4 (DP x CP, a weight's replicas: the same TP rank and stage, keyed by
 * cp rank + cp dp rank) -> the color and key w passes. At cp = 1 groups 0..2 are those of
 * TP x DP x PP (and group 4 is group 1: not split then). */
static inline void tpk__mesh_split_cp(int w, int tp, int cp, int dp, int g, int *color, int *key) {
    int tr = w % tp, cr = w / tp % cp, dr = w / (tp * cp) % dp,
        pr = w / (tp * cp * dp); /* this rank's TP, CP, DP and PP ranks */
    *color = g == 0   ? w / tp
             : g == 1 ? (pr * cp + cr) * tp + tr
             : g == 2 ? (dr * cp + cr) * tp + tr
             : g == 3 ? (pr * dp + dr) * tp + tr
                      : pr * tp + tr;
    *key = g == 0 ? tr : g == 1 ? dr : g == 2 ? pr : g == 3 ? cr : cr + cp * dr;
}
/* Expert parallelism's groups, carved out of the DP ranks (tpk_ctx_desc.ep = e divides d): group
 * g = 0 (EP: the same TP and CP rank, stage and dp rank / e, keyed by dp rank % e: e consecutive DP
 * ranks) or 1 (EDP, an expert's replicas: the same TP rank, stage and dp rank % e, keyed by
 * cp rank + cp (dp rank / e)) -> the color and key w passes. Both only at e > 1. */
static inline void tpk__mesh_split_ep(int w, int tp, int cp, int dp, int ep, int g, int *color,
                                      int *key) {
    int tr = w % tp, cr = w / tp % cp, dr = w / (tp * cp) % dp, pr = w / (tp * cp * dp);
    *color = g == 0 ? ((pr * (dp / ep) + dr / ep) * cp + cr) * tp + tr
                    : (pr * ep + dr % ep) * tp + tr;
    *key = g == 0 ? dr % ep : cr + cp * (dr / ep);
}
/* HSDP's groups (tpk_ctx_desc.zero_shard_size zs) of the DP x CP group, whose rank is q = cp rank
 * + cp dp rank: g = 0 the shard group (the same TP rank and stage, q / zs; ranked q % zs), g = 1
 * the replica group (the same TP rank and stage, q % zs; ranked q / zs). */
static inline void tpk__mesh_split_zero(int w, int tp, int cp, int dp, int zs, int g, int *color,
                                        int *key) {
    int tr = w % tp, q = w / tp % (cp * dp), pr = w / (tp * cp * dp);
    *color = g == 0 ? (pr * (cp * dp / zs) + q / zs) * tp + tr : (pr * zs + q % zs) * tp + tr;
    *key = g == 0 ? q % zs : q / zs;
}
/* The TP x DP x PP mesh's (cp = 1): group g = 0, 1, 2 as above. */
static inline void tpk__mesh_split(int w, int tp, int dp, int g, int *color, int *key) {
    tpk__mesh_split_cp(w, tp, 1, dp, g, color, key);
}

/* Create a context: ops (default: the host backend when linked), world (default self), TP groups
 * of desc->tp consecutive ranks, CP groups of desc->cp, desc->pp pipeline stages, DP groups across
 * them (the world size must be tp x cp x pp x a whole DP size), EP groups of desc->ep of the DP
 * ranks (a divisor of the DP size); desc->allocator and desc->logger its hooks (tpk/base/ctx.h), in
 * place before anything is allocated or recorded. */
static inline tpk_status tpk_ctx_init(tpk_ctx *ctx, const tpk_ctx_desc *desc) {
    static const char *fn = "tpk_ctx_init";
    if (!ctx) return TPK_ERR_ARG;
    memset(ctx, 0, sizeof *ctx);
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    ctx->logger = d.logger;
    const tpk_allocator *al = &d.allocator;
    if (!al->alloc_fn != !al->free_fn || (al->realloc_fn && !al->alloc_fn))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->allocator: expected alloc_fn and free_fn both set (realloc_fn "
                         "optional) or all NULL, got alloc_fn %s, free_fn %s, realloc_fn %s",
                         al->alloc_fn ? "set" : "NULL", al->free_fn ? "set" : "NULL",
                         al->realloc_fn ? "set" : "NULL");
    ctx->allocator = d.allocator;
    TPK_TRY(tpk_env_check(ctx)); /* the TPK_* variables the kit reads (tpk/base/env.h) */
    ctx->ops = d.ops ? d.ops : TPK__DEFAULT_OPS();
    ctx->seed = d.seed, ctx->dtype = d.dtype, ctx->deterministic = d.deterministic;
    if (!ctx->ops)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->ops: expected a backend table (tpk_ops_host(), tpk_ops_cuda() or your own); "
            "NULL asks for the default, "
            "and none is linked (link libtpk_host.a with -Wl,-u,tpk_ops_default)");
    const char *missing = tpk__ops_missing(ctx->ops);
    if (missing[0]) {
        tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->ops: the table \"%s\" has no %s entry (%s are required)",
            ctx->ops->name ? ctx->ops->name : "?", missing,
            ctx->ops->dry_run ? "a dry run's memory entries, TPK__OPS_MEMORY,"
                              : "the core entries of tpk_ops, TPK__OPS_CORE,");
        ctx->ops = NULL;
        return TPK_ERR_ARG;
    }
    if (d.dtype != TPK_F32 && d.dtype != TPK_BF16)
        return tpk__fail(ctx, TPK_ERR_DTYPE, fn,
                         "desc->dtype: expected TPK_F32 or TPK_BF16, got %s",
                         tpk_dtype_name(d.dtype));
    if (!d.world) ctx->self_world = tpk_comm_self(ctx->ops->device), d.world = &ctx->self_world;
    if (!d.world->vt)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->world: expected an initialised communicator");
    const char *cmiss = tpk__comm_missing(d.world->vt);
    if (*cmiss)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->world: the communicator \"%s\" has no %s entry",
                         d.world->vt->name ? d.world->vt->name : "?", cmiss);
    ctx->world = d.world;
    int tp = d.tp ? d.tp : 1, cp = d.cp ? d.cp : 1, pp = d.pp ? d.pp : 1, n = d.world->size;
    if (tp < 1 || tp > n || n % tp)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->tp: expected a divisor of the world size %d, got %d", n, d.tp);
    if (cp < 1 || cp > n / tp || (n / tp) % cp)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->cp: expected a divisor of world size / tp = %d / %d = %d (the "
                         "world is TP x CP x DP x PP; 0: 1), got %d",
                         n, tp, n / tp, d.cp);
    if (cp > 1 && (pp < 1 || pp > n / (tp * cp) || (n / (tp * cp)) % pp))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->pp: expected a divisor of world size / (tp cp) = %d / (%d x %d) = "
                         "%d (the world is TP x CP x DP x PP), got %d",
                         n, tp, cp, n / (tp * cp), d.pp);
    if (pp < 1 || pp > n / tp || (n / tp) % pp)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->pp: expected a divisor of world size / tp = %d / %d = %d (the "
                         "world is TP x DP x PP), got %d",
                         n, tp, n / tp, d.pp);
    if (pp > 1 && !d.world->vt->p2p)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->pp: %d stages need point-to-point, and the world communicator "
                         "\"%s\" has no p2p entry",
                         pp, d.world->vt->name ? d.world->vt->name : "?");
    int ep = d.ep ? d.ep : 1, dsize = n / tp / cp / pp;
    if (ep < 1 || ep > dsize || dsize % ep)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->ep: expected a divisor of the DP size %d = world size / (tp cp pp) "
                         "= %d / (%d x %d x %d) (EP groups are carved out of the DP ranks; 0: 1), "
                         "got %d",
                         dsize, n, tp, cp, pp, d.ep);
    if (ep > 1 && !d.world->vt->alltoallv)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->ep: %d expert-parallel ranks need an all-to-all, and the world "
                         "communicator \"%s\" has no alltoallv entry",
                         ep, d.world->vt->name ? d.world->vt->name : "?");
    int zs = d.zero_shard_size ? d.zero_shard_size : dsize * cp;
    if (zs < 1 || zs > dsize * cp || (dsize * cp) % zs || (zs == 1 && dsize * cp > 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->zero_shard_size: expected 0 (ZeRO's slices over the whole DP x CP "
                         "group) or a divisor >= 2 of DP x CP = %d x %d = %d (HSDP: the slices "
                         "within groups of that many ranks), got %d",
                         dsize, cp, dsize * cp, d.zero_shard_size);
    if (ep > 1 && zs < dsize * cp)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "desc->zero_shard_size: %d with desc->ep %d: HSDP's shard groups are not "
                         "yet with expert parallelism (ZeRO slices over the EDP group there: the "
                         "ranks holding the same experts); expected 0",
                         d.zero_shard_size, ep);
    for (int q = 0; d.tp_weights && q < tp; q++)
        if (!(d.tp_weights[q] > 0) || isinf(d.tp_weights[q]))
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "desc->tp_weights[%d]: expected a finite weight > 0, got %g", q,
                             d.tp_weights[q]);
    int w = d.world->rank, dp = n / tp / cp / pp, c[5] = {0}, k[5] = {0};
    for (int g = 0; g < 5; g++) tpk__mesh_split_cp(w, tp, cp, dp, g, &c[g], &k[g]);
    tpk_status s = tpk_comm_split(ctx, d.world, c[0], k[0], &ctx->tp);
    if (s == TPK_OK) s = tpk_comm_split(ctx, d.world, c[1], k[1], &ctx->dp);
    if (s == TPK_OK) s = tpk_comm_split(ctx, d.world, c[2], k[2], &ctx->pp);
    /* CP and DP x CP last, and only at cp > 1: at cp = 1 the world's splits are those of before
       (a counting world replays three), ctx->cp is a one-rank group of its own and a weight's
       replicas are the DP group itself */
    if (s == TPK_OK && cp > 1) s = tpk_comm_split(ctx, d.world, c[3], k[3], &ctx->cp);
    else if (s == TPK_OK) ctx->cp = tpk_comm_self(ctx->ops->device);
    if (s == TPK_OK && cp > 1) s = tpk_comm_split(ctx, d.world, c[4], k[4], &ctx->dp_cp_group);
    ctx->dp_cp = cp > 1 ? &ctx->dp_cp_group : &ctx->dp;
    /* EP and EDP last, and only at ep > 1: at ep = 1 the world's splits are those of before,
       ctx->ep is a one-rank group of its own and an expert's replicas are a weight's (dp_cp) */
    for (int g = 0; g < 2 && s == TPK_OK && ep > 1; g++) {
        int ce = 0, ke = 0;
        tpk__mesh_split_ep(w, tp, cp, dp, ep, g, &ce, &ke);
        s = tpk_comm_split(ctx, d.world, ce, ke, g ? &ctx->edp_group : &ctx->ep);
    }
    if (s == TPK_OK && ep == 1) ctx->ep = tpk_comm_self(ctx->ops->device);
    ctx->edp = ep > 1 ? &ctx->edp_group : ctx->dp_cp;
    /* HSDP's two groups last, and only when asked: without, the splits are those of before and
       ZeRO slices over the DP x CP group itself */
    for (int g = 0; g < 2 && s == TPK_OK && zs < dp * cp; g++) {
        int cz = 0, kz = 0;
        tpk__mesh_split_zero(w, tp, cp, dp, zs, g, &cz, &kz);
        s = tpk_comm_split(ctx, d.world, cz, kz, g ? &ctx->zrep_group : &ctx->zshard_group);
    }
    ctx->zshard = zs < dp * cp ? &ctx->zshard_group : ctx->dp_cp;
    ctx->zrep = zs < dp * cp ? &ctx->zrep_group : NULL;
    if (s == TPK_OK) s = tpk__ctx_weights(ctx, fn, d.tp_weights, tp);
    if (s != TPK_OK) {
        char keep[sizeof ctx->err];
        memcpy(keep, ctx->err, sizeof keep);
        tpk_ctx_destroy(ctx);
        memcpy(ctx->err, keep, sizeof keep);
        ctx->last = s;
        return s;
    }
    const char *prof = getenv("TPK_PROFILE"); /* TPK_PROFILE=1: the profiler on, its table printed
                                                 by tpk_ctx_destroy */
    if (prof && prof[0] && strcmp(prof, "0")) {
        TPK_TRY(tpk_profile_start(ctx));
        ctx->prof->from_env = true;
    }
    if (ctx->world->flight.report) /* the flight recorder's (coll.h) */
        *tpk__flight_slot() = (uintptr_t)ctx;
    return s;
}

static inline void tpk_ctx_destroy(tpk_ctx *ctx) {
    if (!ctx) return;
    if (ctx->prof && ctx->prof->from_env && ctx->ops && ctx->world && ctx->world->rank == 0) {
        if (ctx->ep.size > 1)
            tpk_logf(ctx, TPK_LOG_INFO,
                     "TPK_PROFILE: context of %d ranks (TP %d x CP %d x DP %d x PP %d; EP %d of "
                     "the DP ranks)",
                     ctx->world->size, ctx->tp.size, ctx->cp.size, ctx->dp.size, ctx->pp.size,
                     ctx->ep.size);
        else if (ctx->cp.size > 1)
            tpk_logf(ctx, TPK_LOG_INFO,
                     "TPK_PROFILE: context of %d ranks (TP %d x CP %d x DP %d x PP %d)",
                     ctx->world->size, ctx->tp.size, ctx->cp.size, ctx->dp.size, ctx->pp.size);
        else
            tpk_logf(ctx, TPK_LOG_INFO, "TPK_PROFILE: context of %d rank%s (TP %d x DP %d x PP %d)",
                     ctx->world->size, ctx->world->size == 1 ? "" : "s", ctx->tp.size,
                     ctx->dp.size, ctx->pp.size);
        tpk_profile_log(ctx);
    }
    tpk_profile_stop(ctx);
    if (tpk__flight_ctx() == ctx) *tpk__flight_slot() = 0;
    if (ctx->ops) {
        tpk__buf_free(ctx, &ctx->work[0]);
        tpk__buf_free(ctx, &ctx->work[1]);
        tpk__buf_free(ctx, &ctx->sp);
        tpk__buf_free(ctx, &ctx->normsq);
        tpk__buf_free(ctx, &ctx->params.data);
        tpk__buf_free(ctx, &ctx->params.grad);
        tpk__buf_free(ctx, &ctx->params.data16);
        tpk__buf_free(ctx, &ctx->params.scratch);
    }
    tpk__free(ctx, ctx->params.list), tpk__free(ctx, ctx->params.index); /* the registry's */
    tpk__free(ctx, ctx->tp_w);
    tpk_comm_destroy(&ctx->tp);
    tpk_comm_destroy(&ctx->dp);
    tpk_comm_destroy(&ctx->pp);
    tpk_comm_destroy(&ctx->cp);
    tpk_comm_destroy(&ctx->dp_cp_group); /* (dp_cp points at it or at dp: not destroyed itself) */
    tpk_comm_destroy(&ctx->ep);
    tpk_comm_destroy(&ctx->edp_group); /* (edp points at it or at dp_cp's group) */
    tpk_comm_destroy(&ctx->zshard_group); /* (zshard points at it or at dp_cp) */
    tpk_comm_destroy(&ctx->zrep_group);
    const tpk_ops *ops = ctx->ops;
    tpk_allocator al = ctx->allocator;
    tpk_logger lg = ctx->logger;
    memset(ctx, 0, sizeof *ctx);
    ctx->ops = ops, ctx->allocator = al, ctx->logger = lg; /* kept: the hooks of what follows */
}

#endif /* TPK_INIT_H */
