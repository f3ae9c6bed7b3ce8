/* tpk/train/report.h — what a trainer prints around its loop: the banner (the mesh TP x CP x DP x
 * PP — CP and PP where there are more than one —, backend, dtype, the model's family, shape and
 * parameters, the step's batch), with stages each virtual
 * stage's blocks (and --print-schedule's table); the end of training (its steps, time and peak
 * memory: the kit's buffers at most, the largest over each stage's ranks, split into weights,
 * ZeRO-3's gathered buffers, gradients, optimizer and the rest, and each stage's idle
 * fraction: its seconds waiting in messages over its seconds in the pipeline); and --profile's
 * tables (rank 0's, or each stage's from its first rank, headed by the stage, one after another:
 * mpirun may pass the ranks' lines on in any order), after each rank's compute and wait time; the
 * ranks' pace (tpk_run_pace: the slowest and fastest rank's compute time a step, for the step
 * line); with --profile, the rows each expert received (tpk_run_expert_rows). The step line itself
 * stays with the loop.
 * Needs MPI (tpk/train/ranks.h). */
#ifndef TPK_TRAIN_REPORT_H
#define TPK_TRAIN_REPORT_H

#include "memory.h"
#include "options.h"
#include "ranks.h"
#include "trainable.h"

/* The banner on out (the caller's rank 0): cfg the model's config, nglobal its parameters, B the
 * step's sequences of S tokens (Btot; --dp-batch's list when given). */
static inline void tpk_run_banner(FILE *out, const tpk_ctx *ctx, const tpk_run_opts *o,
                                  tpk_trainable *t, tpk_model_config *cfg, double nglobal,
                                  int64_t S, int64_t Btot) {
    tpk_model *m = tpk_trainable_model(t);
    int64_t *sh[5];
    tpk_model_config_common(cfg, sh, (float)o->smoothing, o->sp, o->rc);
    char pp[160] = "", cp[64] = "", fam[160], b[160], ep[128] = "";
    if (ctx->ep.vt && ctx->ep.size > 1) /* expert parallelism: the experts split over DP ranks */
        snprintf(ep, sizeof ep, " (EP %d)", ctx->ep.size);
    if (ctx->ep.vt && ctx->ep.size > 1 && o->zero) /* ZeRO over the ranks of the same experts */
        snprintf(ep + strlen(ep), sizeof ep - strlen(ep), " (ZeRO-%lld in slices of %d%s)",
                 (long long)o->zero, ctx->edp->size,
                 ctx->edp->size > 1 ? "" : ": none, DP x CP = EP");
    if (ctx->zrep) /* HSDP: ZeRO's slices within shard groups, all-reduced across them */
        snprintf(ep + strlen(ep), sizeof ep - strlen(ep), " (HSDP: ZeRO-%lld in shards of %d)",
                 (long long)o->zero, ctx->zshard->size);
    int world = ctx->tp.size * ctx->cp.size * ctx->dp.size * ctx->pp.size;
    if (ctx->cp.size > 1) /* context parallelism: the sequence split, the attention's exchange */
        snprintf(cp, sizeof cp, " x CP %d (%s)", ctx->cp.size,
                 o->cp_comm && !strcmp(o->cp_comm, "allgather") ? "all-gather" : "p2p ring");
    if (t->piped)
        snprintf(pp, sizeof pp, " x PP %d (%s, %d chunk%s a stage)", ctx->pp.size,
                 tpk_pipe_kind_name(o->kind), (int)o->vstages, o->vstages > 1 ? "s" : "");
    if (o->dp_batch) snprintf(b, sizeof b, "%s per DP rank = %lld", o->dp_batch, (long long)Btot);
    else snprintf(b, sizeof b, "%lld", (long long)o->batch);
    fprintf(out,
            "train: %d rank%s = TP %d%s x DP %d%s%s%s, %s backend, %s | %s L=%lld H=%lld A=%lld "
            "V=%lld P=%lld%s, %.2fM parameters | B=%s S=%lld %s %lld\n",
            world, world == 1 ? "" : "s", ctx->tp.size, cp, ctx->dp.size, ep, pp,
            o->sp ? " (sequence parallel)" : "", ctx->ops->name,
            ctx->dtype == TPK_BF16 ? "bf16 (f32 master weights)" : "f32",
            tpk_run_family_title(m->arch), (long long)tpk_model_layers(m),
            (long long)tpk_model_hidden(m), (long long)*sh[4], (long long)*sh[0], (long long)*sh[1],
            tpk_run_family_banner(m, fam, sizeof fam), nglobal * 1e-6, b, (long long)S,
            t->piped ? "micro-batches" : "accum", (long long)o->accum);
    if (!t->piped) return;
    int P = ctx->pp.size, n = P * (int)o->vstages;
    fprintf(out, "stages:"); /* each virtual stage's blocks and ends */
    for (int u = 0; u < n; u++) {
        if (o->vstages > 1) snprintf(b, sizeof b, ".%d", u / P);
        fprintf(out, "%s %d%s: blocks %lld-%lld%s%s", u ? " |" : "", u % P, o->vstages > 1 ? b : "",
                (long long)t->pm.first[u], (long long)t->pm.first[u + 1] - 1,
                u == 0 ? " + embedding" : "", u == n - 1 ? " + norm, head, loss" : "");
    }
    fprintf(out, "\n");
    if (o->print_schedule) tpk_pipe_print(&t->pm.sched, false, out);
}

/* --profile with a mixture of experts: the rows routed to each expert by the last forward (the
 * routers' counts pooled over the MoE layers, tpk_lm.aux_count), summed over the DP ranks, a
 * layer's min / mean / max over the experts on out (the caller's rank 0; NULL elsewhere): the load
 * the router's aux balances. Nothing without experts. Collective over DP. */
static inline tpk_status tpk_run_expert_rows(FILE *out, tpk_ctx *ctx, tpk_trainable *t) {
    tpk_lm *lm = tpk_model_lm(tpk_trainable_model(t));
    int64_t E = lm->c.block.mlp.moe.experts, L = lm->moe_layers; /* (a dense layer routes none) */
    if (!lm->aux_count || E < 1 || L < 1) return TPK_OK;
    double *c = (double *)tpk__malloc(ctx, sizeof(double) * (size_t)E), lo = INFINITY, hi = 0,
           sum = 0;
    if (!c)
        return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_run_expert_rows", "%lld counts", (long long)E);
    memcpy(c, lm->aux_count, sizeof(double) * (size_t)E);
    tpk_status s = tpk_allreduce_host(ctx, &ctx->dp, c, (size_t)E, TPK_F64, TPK_SUM);
    for (int64_t e = 0; e < E; e++)
        lo = fmin(lo, c[e] / (double)L), hi = fmax(hi, c[e] / (double)L), sum += c[e] / (double)L;
    tpk__free(ctx, c);
    if (s == TPK_OK && out)
        fprintf(out,
                "experts: rows a layer per expert in the last forward (%lld experts, every DP "
                "rank's tokens): min %.1f, mean %.1f, max %.1f (max / mean %.2f)\n",
                (long long)E, lo, sum / (double)E, hi, sum > 0 ? hi * (double)E / sum : 0.0);
    return s;
}

/* A step's flops per token of a model of n parameters at sequence length S: 6 n (forward and
 * backward through the weights) + 12 L H S (attention's two products, forward and backward). */
static inline double tpk_run_flops_per_token(tpk_trainable *t, double n, int64_t S) {
    tpk_model *m = tpk_trainable_model(t);
    return 6.0 * n + 12.0 * (double)tpk_model_layers(m) * (double)tpk_model_hidden(m) * (double)S;
}

/* " = weights W + gradients G + optimizer O + activations and work A" (MB) of a peak of `mb` MB
 * and what held gives of it, into buf; "weights W + gathered Z + gradients ..." where it holds
 * gathered buffers (ZeRO-3). */
static inline void tpk__run_parts(char *buf, size_t n, double mb, const tpk_mem_held *h) {
    char z[48] = "";
    if (h->gathered > 0) snprintf(z, sizeof z, " + gathered %.2f", h->gathered / 1e6);
    snprintf(buf, n,
             " = weights %.2f%s + gradients %.2f + optimizer %.2f + activations and work %.2f",
             h->weights / 1e6, z, h->grads / 1e6, h->optim / 1e6,
             mb - (h->weights + h->gathered + h->grads + h->optim) / 1e6);
}

/* With stages, a line per stage on rank 0's out: "stage S: peak memory X MB (rank R) = weights ...
 * + activations and work A", the peak and parts of R, the stage's rank of the largest peak (the
 * lowest such rank on a tie): the stage's figure of the summary's line, split as without stages.
 * mine: this rank's peak (MB); h: its tpk_mem_held_get. Two all-reduces over the world. */
static inline void tpk__run_stage_parts(FILE *out, tpk_ranks *r, tpk_ctx *ctx, double mine,
                                        const tpk_mem_held *h) {
    struct {
        double v;
        int rank;
    } pk[64];
    double w[4 * 64] = {0};
    int P = ctx->pp.size < 64 ? ctx->pp.size : 64, s = ctx->pp.rank;
    for (int q = 0; q < 64; q++) pk[q].v = -1, pk[q].rank = r->rank;
    if (s < 64) pk[s].v = mine;
    tpk_ranks_allreduce(r, pk, 64, MPI_DOUBLE_INT, MPI_MAXLOC); /* each stage's largest, its rank */
    if (s < 64 && pk[s].rank == r->rank) {
        double *x = w + 4 * s;
        x[0] = h->weights, x[1] = h->grads, x[2] = h->optim, x[3] = h->gathered;
    }
    tpk_ranks_allreduce(r, w, 4 * 64, MPI_DOUBLE, MPI_SUM); /* that rank's parts */
    for (int q = 0; r->rank == 0 && q < P; q++) {
        char parts[200];
        tpk_mem_held x = {w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]};
        tpk__run_parts(parts, sizeof parts, pk[q].v, &x);
        fprintf(out, "stage %d: peak memory %.2f MB (rank %d)%s\n", q, pk[q].v, pk[q].rank,
                parts);
    }
}

/* The end of training on rank 0's out: steps from+1..steps in `seconds`, the peak memory (each
 * stage's and its idle fraction with stages; without, rank 0's) split by kind when `held` is given
 * (on every rank or none): tpk_mem_held_get's weights, gathered buffers (ZeRO-3's, named only
 * where held), gradients and optimizer, the rest
 * activations and work (with stages a line per stage, tpk__run_stage_parts); none trained (a
 * resume at the last step): that. Collective over the world. */
static inline void tpk_run_summary(FILE *out, tpk_ranks *r, tpk_ctx *ctx, const tpk_run_opts *o,
                                   const tpk_trainable *t, const tpk_mem_held *held, int64_t from,
                                   double seconds) {
    if (o->steps <= 0) return;
    if (from >= o->steps) { /* a resume at the last step */
        if (r->rank == 0)
            fprintf(out,
                    "trained no steps: %s is at step %lld, --steps %lld | peak memory %.2f MB "
                    "(recompute %s)\n",
                    o->load ? o->load : "the model", (long long)from, (long long)o->steps,
                    tpk_mem_peak(ctx, false) / 1e6, tpk_recompute_name(o->rc));
        return;
    }
    double v[128] = {0}, mine = tpk_mem_peak(ctx, false) / 1e6, all = t->busy + t->wait;
    char per[600] = "", idle[600] = "";
    if (ctx->pp.rank < 64)
        v[ctx->pp.rank] = mine, v[64 + ctx->pp.rank] = all > 0 ? t->wait / all : 0;
    tpk_ranks_allreduce(r, v, 128, MPI_DOUBLE, MPI_MAX); /* each stage's largest */
    for (int q = 0; q < ctx->pp.size && q < 64; q++) {
        snprintf(per + strlen(per), sizeof per - strlen(per), "%s%.2f", q ? ", " : "", v[q]);
        snprintf(idle + strlen(idle), sizeof idle - strlen(idle), "%s%.3f", q ? ", " : "",
                 v[64 + q]);
    }
    if (r->rank == 0 && t->piped)
        fprintf(out,
                "trained steps %lld..%lld in %.1f s | peak memory per stage %s MB (recompute %s) "
                "| idle per stage %s (the bubble: waiting in messages)\n",
                (long long)from + 1, (long long)o->steps, seconds, per, tpk_recompute_name(o->rc),
                idle);
    else if (r->rank == 0) {
        char parts[200] = "";
        if (held) tpk__run_parts(parts, sizeof parts, mine, held);
        fprintf(out, "trained steps %lld..%lld in %.1f s | peak memory %.2f MB (recompute %s)%s\n",
                (long long)from + 1, (long long)o->steps, seconds, mine, tpk_recompute_name(o->rc),
                parts);
    }
    if (t->piped && held) tpk__run_stage_parts(out, r, ctx, mine, held);
}

/* The ranks' pace: each rank's compute time (its wall time less its MPI waits, tpk_mpi_waited)
 * over the steps since the last report, and the slowest and fastest rank's a step. */
typedef struct tpk_run_pace {
    double t, w;             /* the window's start: the wall clock and tpk_mpi_waited then */
    int64_t step;            /* the step the window starts after */
    double busy_s, wait_s;   /* this rank's compute and wait seconds over every window */
    int slow, fast;          /* the slowest and fastest rank of the last window (-1: none) */
    double slow_ms, fast_ms; /* their compute time a step */
} tpk_run_pace;
/* A pace whose first window starts now, after step `step`. */
static inline tpk_run_pace tpk_run_pace_begin(int64_t step) {
    tpk_run_pace p;
    memset(&p, 0, sizeof p);
    p.t = tpk__now_ms() * 1e-3, p.w = tpk_mpi_waited(), p.step = step, p.slow = p.fast = -1;
    return p;
}
/* At a step that reports, after step `step`: close the window (its compute and wait time added to
 * this rank's) and, at more than one rank, find the slowest and fastest rank's compute time a step
 * with one all-reduce over the world of two (time, rank) pairs (MAXLOC of t and of -t; the lowest
 * rank on a tie); a new window starts. Collective over the world. */
static inline void tpk_run_pace_step(tpk_ranks *r, tpk_run_pace *p, int64_t step) {
    double now = tpk__now_ms() * 1e-3, waited = tpk_mpi_waited();
    double wait = waited - p->w, busy = now - p->t - wait, n = (double)(step - p->step);
    if (busy < 0) busy = 0;
    p->busy_s += busy, p->wait_s += wait;
    if (r->size > 1 && n > 0) {
        struct {
            double v;
            int rank;
        } m[2] = {{1e3 * busy / n, r->rank}, {-1e3 * busy / n, r->rank}};
        tpk_ranks_allreduce(r, m, 2, MPI_DOUBLE_INT, MPI_MAXLOC);
        p->slow = m[0].rank, p->slow_ms = m[0].v, p->fast = m[1].rank, p->fast_ms = -m[1].v;
    }
    p->t = tpk__now_ms() * 1e-3, p->w = tpk_mpi_waited(), p->step = step;
}
/* The step line's part of the pace: " | slowest rank R X ms, fastest Y ms" (compute a step; none
 * at one rank) into buf. */
static inline const char *tpk_run_pace_str(const tpk_run_pace *p, char *buf, size_t n) {
    if (p->slow < 0) snprintf(buf, n, "%s", "");
    else snprintf(buf, n, " | slowest rank %d %.1f ms, fastest %.1f ms", p->slow, p->slow_ms,
                  p->fast_ms);
    return buf;
}
/* --profile's line per rank on rank 0's out: "rank R: compute X s, wait Y s (Z% waiting)" over the
 * training (tpk_run_pace_step's windows). One all-reduce over the world; none at one rank. */
static inline void tpk_run_pace_print(FILE *out, tpk_ranks *r, const tpk_run_pace *p) {
    if (r->size < 2) return;
    /* no context here: the C library's allocator (tpk__al_*, NULL) */
    double *v = (double *)tpk__al_calloc(NULL, 2 * (size_t)r->size, sizeof(double));
    int bad = !v;
    tpk_ranks_allreduce(r, &bad, 1, MPI_INT, MPI_MAX);
    if (bad) {
        if (r->rank == 0) fprintf(out, "rank times: out of host memory for %d ranks\n", r->size);
        tpk__al_free(NULL, v);
        return;
    }
    v[2 * r->rank] = p->busy_s, v[2 * r->rank + 1] = p->wait_s;
    tpk_ranks_allreduce(r, v, 2 * r->size, MPI_DOUBLE, MPI_SUM);
    for (int q = 0; r->rank == 0 && q < r->size; q++) {
        double all = v[2 * q] + v[2 * q + 1];
        fprintf(out, "rank %d: compute %.3f s, wait %.3f s (%.1f%% waiting)\n", q, v[2 * q],
                v[2 * q + 1], all > 0 ? 100.0 * v[2 * q + 1] / all : 0.0);
    }
    tpk__al_free(NULL, v);
}

/* --profile's tables on out (the header says whose). Collective over the world with stages. */
static inline void tpk_run_profiles(FILE *out, tpk_ranks *r, tpk_ctx *ctx, bool piped,
                                    const tpk_run_pace *pace) {
    if (!ctx->prof || ctx->prof->from_env) return;
    if (pace) tpk_run_pace_print(out, r, pace); /* each rank's compute and wait */
    if (!piped && r->rank == 0) tpk_profile_print(ctx, out); /* (it agrees over ranks) */
    for (int q = 0; piped && q < ctx->pp.size; q++) {
        if (ctx->pp.rank == q && ctx->tp.rank == 0 && ctx->cp.rank == 0 && ctx->dp.rank == 0) {
            fprintf(out, "stage %d of %d:\n", q, ctx->pp.size);
            tpk_profile_print(ctx, out);
            fflush(out);
        }
        int one = 1;
        tpk_ranks_allreduce(r, &one, 1, MPI_INT, MPI_SUM); /* the next stage after this one */
    }
}

#endif /* TPK_TRAIN_REPORT_H */
