/* tpk/train/pipe_model.h — a model (any family, tpk/train/model.h) as this rank's pipeline stage:
 * its chunks' parts, one copy of each part per micro-batch in flight, and the executor's calls.
 *
 * tpk_pipe_model_init splits the model's L blocks over the P V virtual stages (tpk_pipe_split:
 * even, a list or by cost) and builds, for each of this stage's V chunks, the part of virtual
 * stage u = chunk P + stage (cfg.part: its blocks; the embedding on u = 0, the final norm, head
 * and loss on u = P V - 1; a tied head's weight copied there). A layer keeps what its backward
 * needs in its own buffers and views, so a part serves one micro-batch at a time; the schedule
 * keeps up to P - s micro-batches of a chunk alive between their forward and backward (1F1B;
 * GPipe M), so each chunk has that many copies of its part — models over the same parameters
 * (ctx->params.reuse), each with its own activations — and a micro-batch holds one copy from its
 * forward to its backward. Memory: the copies' activations, which the schedule needs anyway.
 *
 * tpk_pipe_model_step runs the schedule over M micro-batches (ids and targets [M][B S / c] in host
 * memory, the same on every stage: this CP rank's rows of B sequences of S tokens, tpk_cp_rows;
 * c = 1 without context parallelism): each forward and backward of micro-batch k runs
 * with ctx->rng_step = rng_step + k (the dropout masks of a run without a pipeline that sets the
 * micro-batch's index so), the backward with `scale` (1 / M for a mean over micro-batches); the
 * gradients are summed into the flat gradient buffer (zero it first), each parameter over the
 * micro-batches in order: the bits of the same micro-batches run one after another without a
 * pipeline. Then the tied embedding's two copies (first and last stage) are summed over the
 * embedding group, so both hold the whole gradient. losses (may be NULL): the last stage's loss of
 * each micro-batch ([M], host; each a download); else the losses add up on the device
 * (tpk_pipe_model_loss_read).
 *
 * A mixture of experts (Mixtral: the load-balancing aux pooled over every layer's routing,
 * tpk/models/lm.h): each message has a side of 2 E + 2 f64 values (tpk_pipe_stage.side) — with the
 * hidden states, the routing's sums over the blocks before the next part (N, the z-losses, C_e,
 * Q_e), which the next part's forward starts from, so the last part's aux is the whole model's;
 * with the gradient, the whole model's N and C_e, which every part's routers' backward needs
 * (coef E C_e / N²) — so the losses and every gradient are the bits of the model without stages.
 * A stage's EP groups are its own DP ranks' (ctx->ep). tpk_pipe_model_aux_read reads the aux.
 *
 * Under context parallelism (ctx->cp, c > 1) the pipeline of each CP rank carries its rows: a
 * message is this TP and CP rank's B S / c hidden states (1/c of the bytes; S(0) slices of them
 * under sequence parallelism), a stage's CP ranks run the attention over ctx->cp among themselves,
 * and the DP buckets reduce over DP x CP (tpk__dp_group), so the gradients are the CP 1 run's. */
#ifndef TPK_PIPE_MODEL_H
#define TPK_PIPE_MODEL_H

#include "dp.h"
#include "model.h"
#include "pipeline.h"

typedef struct tpk_pipe_model {
    tpk_model_config cfg; /* the whole model's */
    tpk_pipe_schedule sched;
    int P, V, M, stage;
    int64_t *first;  /* [P V + 1] the split */
    tpk_model *copy; /* [V][K] each chunk's copies */
    int K;           /* copies per chunk (the most micro-batches of a chunk alive) */
    int *held;       /* [V M]: the copy holding (chunk, mb); -1 */
    bool *busy;      /* [V K] */
    bool tied;       /* the head's weight is the embedding's (copies on stages 0 and P - 1) */
    int wte;         /* its id on this rank (-1 when this stage holds neither copy) */
    tpk_comm embed;  /* stages 0 and P - 1 of this pipeline (when tied and P > 1) */
    tpk_pipe exec;
    /* the step's arguments, for the callbacks */
    const int32_t *ids, *targets;
    int64_t B, S;
    float scale, *losses;
    uint64_t rng_step;
    tpk_dp_buckets *dp; /* tpk_pipe_model_set_dp: the DP buckets the last micro-batch's backward of
                           each chunk starts (NULL: none) */
    tpk_pipe_schedule eval; /* the forwards alone over eval_m micro-batches (tpk_pipe_model_eval) */
    int eval_m;
    bool evaluating;
    /* a mixture of experts: the pooled aux's sums beside every message (the header's) */
    int64_t nside;   /* 2 E + 2 values a message (tpk__lm_aux_len); 0 without experts */
    tpk_buf side;    /* backend [V run_m][4][nside]: each message step's side */
    double *host;    /* host [nside] */
    int run_m;       /* the micro-batches of the run under way */
} tpk_pipe_model;

/* The parameters of this stage are the copies' (chunk 0's first, then chunk 1's, ...). */
static inline void tpk_pipe_model_destroy(tpk_ctx *ctx, tpk_pipe_model *pm) {
    if (!pm) return;
    for (int i = 0; pm->copy && i < pm->V * pm->K; i++)
        tpk_model_destroy(ctx, &pm->copy[i]); /* (one not built is zeros: nothing to free) */
    tpk__free(ctx, pm->copy), tpk__free(ctx, pm->held), tpk__free(ctx, pm->busy);
    tpk__free(ctx, pm->first);
    tpk_pipe_free(ctx, &pm->exec);
    tpk_pipe_schedule_free(&pm->sched);
    tpk_pipe_schedule_free(&pm->eval);
    tpk_comm_destroy(&pm->embed);
    tpk__buf_free(ctx, &pm->side), tpk__free(ctx, pm->host);
    memset(pm, 0, sizeof *pm);
}

/* A cost per block and the two ends' extras for a balanced split (tpk_pipe_split), in flops per
 * token of a forward and backward: a pre-norm block holds about 12 H^2 weights (GPT-2's 4 H^2
 * attention and 8 H^2 MLP; Llama's 4 H^2 and 3 H F with F = 8/3 H) at 6 flops each, and its
 * attention 12 S H (Q K^T and P V, forward and backward); the last stage's head 6 V H; the first
 * stage's embedding a gather (0). cost[L] filled; *first, *last the ends'. */
static inline void tpk_pipe_model_costs(const tpk_model_config *cfg, int64_t S, double *cost,
                                        double *first, double *last) {
    int64_t *shape[5];
    float *ls;
    bool *sp;
    tpk_recompute *rc;
    tpk_model_config c = *cfg;
    tpk__model_common(&c, shape, &ls, &sp, &rc, NULL);
    double V = (double)*shape[0], L = (double)*shape[2], H = (double)*shape[3];
    for (int64_t i = 0; i < (int64_t)L; i++) cost[i] = 6 * 12 * H * H + 12 * (double)S * H;
    *first = 0, *last = 6 * V * H;
}

/* Build this rank's stage (ctx->pp.rank of ctx->pp.size) of the model cfg for schedule `kind`
 * over M micro-batches with V chunks a stage; counts (may be NULL): blocks per virtual stage;
 * cost (may be NULL): per block, with cost_first and cost_last (tpk_pipe_split). */
static inline tpk_status tpk_pipe_model_init(tpk_ctx *ctx, tpk_pipe_model *pm,
                                             const tpk_model_config *cfg, tpk_pipe_kind kind, int M,
                                             int V, const int64_t *counts, const double *cost,
                                             double cost_first, double cost_last) {
    static const char *fn = "tpk_pipe_model_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!pm || !cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", pm ? "cfg" : "model");
    memset(pm, 0, sizeof *pm);
    pm->wte = -1;
    if (!tpk__model_family(cfg->arch))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->arch: expected a family, got %d",
                         (int)cfg->arch);
    int P = ctx->pp.size, s = ctx->pp.rank;
    pm->cfg = *cfg, pm->P = P, pm->V = V, pm->M = M, pm->stage = s;
    tpk_status st = tpk_pipe_schedule_make(ctx, &pm->sched, kind, P, M, V);
    int64_t *shape[5];
    float *ls;
    bool *sp;
    tpk_recompute *rc;
    tpk__model_common(&pm->cfg, shape, &ls, &sp, &rc, NULL);
    int64_t L = *shape[2];
    if (st == TPK_OK) {
        pm->first = (int64_t *)tpk__malloc(ctx, sizeof(int64_t) * (size_t)(P * V + 1));
        st = pm->first
                 ? tpk_pipe_split(ctx, L, P * V, counts, cost, cost_first, cost_last, pm->first)
                 : tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    }
    /* the copies a chunk needs: the most of its micro-batches alive at once on this stage */
    for (int c = 0; st == TPK_OK && c < V; c++) {
        int live = 0;
        for (int i = 0; i < pm->sched.n[s]; i++) {
            tpk_pipe_step x = pm->sched.step[s][i];
            if (x.chunk != c) continue;
            live += x.action == TPK_PIPE_F, live -= x.action == TPK_PIPE_B;
            if (live > pm->K) pm->K = live;
        }
    }
    if (st == TPK_OK) {
        pm->copy = (tpk_model *)tpk__calloc(ctx, (size_t)(V * pm->K), sizeof *pm->copy);
        pm->busy = (bool *)tpk__calloc(ctx, (size_t)(V * pm->K), sizeof *pm->busy);
        pm->held = (int *)tpk__malloc(ctx, sizeof(int) * (size_t)(V * M));
        if (!pm->copy || !pm->busy || !pm->held)
            st = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    }
    bool reuse = ctx->params.reuse;
    for (int c = 0; st == TPK_OK && c < V; c++) {
        int u = c * P + s;
        tpk_model_config pc = pm->cfg;
        tpk_lm_part *part = tpk_model_config_part(&pc);
        part->lo = pm->first[u], part->hi = pm->first[u + 1];
        part->no_embed = u != 0, part->no_head = u != P * V - 1;
        for (int k = 0; st == TPK_OK && k < pm->K; k++) {
            int before = ctx->params.n;
            ctx->params.reuse = k > 0; /* the copies share the first's parameters */
            st = tpk_model_init(ctx, &pm->copy[c * pm->K + k], &pc);
            if (st == TPK_OK && k > 0 && ctx->params.n != before)
                st = tpk__fail(ctx, TPK_ERR_ARG, fn,
                               "a copy of chunk %d registered %d parameters of its own (a layer "
                               "without a name?)",
                               c, ctx->params.n - before);
        }
    }
    ctx->params.reuse = reuse;
    if (st == TPK_OK && (pm->nside = tpk__lm_aux_len(tpk_model_lm(&pm->copy[0]))) > 0 &&
        !(pm->host = (double *)tpk__calloc(ctx, (size_t)pm->nside, sizeof(double))))
        st = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    /* the tied embedding: its weight on the first stage (the embedding), on the last (the head) */
    if (st == TPK_OK) {
        const tpk_lm *p = tpk_model_lm(&pm->copy[0]), *q = tpk_model_lm(&pm->copy[(V - 1) * pm->K]);
        const char *name = p->c.embed_name;
        /* tied: the head's weight is the embedding's on the whole model (probe: stage 0 alone
           cannot tell; the last stage's head says it by its weight's name) */
        int last_tied =
            (s == P - 1 && q->head_w >= 0 && !strcmp(ctx->params.list[q->head_w].name, name)) ? 1
                                                                                              : 0;
        int32_t t = last_tied;
        st = tpk_allreduce_host(ctx, &ctx->pp, &t, 1, TPK_I32, TPK_MAX);
        pm->tied = t != 0;
        if (st == TPK_OK && pm->tied) pm->wte = tpk_param_find(ctx, name);
        if (st == TPK_OK && pm->wte >= 0 && P > 1 && s == P - 1) /* counted on stage 0 */
            ctx->params.list[pm->wte].pp_copy = true;
        if (st == TPK_OK && pm->tied && P > 1)
            st = tpk_comm_split(ctx, &ctx->pp, s == 0 || s == P - 1 ? 0 : 1, s, &pm->embed);
    }
    if (st != TPK_OK) {
        char keep[sizeof ctx->err];
        memcpy(keep, ctx->err, sizeof keep);
        tpk_pipe_model_destroy(ctx, pm);
        memcpy(ctx->err, keep, sizeof keep);
    }
    return st;
}

/* The side of a message step (the executor's side_buf): its place in pm->side. */
static inline void *tpk__pipe_model_side(void *user, tpk_pipe_step x) {
    tpk_pipe_model *pm = (tpk_pipe_model *)user;
    size_t at = ((size_t)x.chunk * (size_t)pm->run_m + (size_t)x.mb) * 4 +
                (size_t)(x.action - TPK_PIPE_RECV_ACT);
    return (double *)pm->side.p + at * (size_t)pm->nside;
}
/* The side of (chunk, mb)'s message `action` to or from the host (pm->host). */
static inline tpk_status tpk__pipe_model_side_io(tpk_ctx *ctx, tpk_pipe_model *pm, int chunk,
                                                 int mb, int action, bool up) {
    tpk_pipe_step x = {action, chunk, mb};
    void *d = tpk__pipe_model_side(pm, x);
    size_t n = sizeof(double) * (size_t)pm->nside;
    bool dev = ctx->ops->device;
    return up ? tpk_op_memcpy(ctx, d, pm->host, n, dev ? TPK_H2D : TPK_H2H)
              : tpk_op_memcpy(ctx, pm->host, d, n, dev ? TPK_D2H : TPK_H2H);
}

static inline tpk_status tpk__pipe_model_fwd(tpk_ctx *ctx, void *user, int chunk, int mb,
                                             const void *x, const void **y) {
    tpk_pipe_model *pm = (tpk_pipe_model *)user;
    int k = 0;
    while (k < pm->K && pm->busy[chunk * pm->K + k]) k++;
    if (k == pm->K)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_pipe_model_step",
                         "chunk %d: more micro-batches alive than its %d copies", chunk, pm->K);
    int i = chunk * pm->K + k, u = chunk * pm->P + pm->stage;
    size_t off = (size_t)mb * (size_t)tpk_cp_rows(ctx, pm->B, pm->S); /* this CP rank's rows */
    if (!pm->evaluating)
        pm->busy[i] = true, pm->held[chunk * pm->M + mb] = i; /* until its
                                                                                 backward */
    ctx->rng_step = pm->rng_step + (uint64_t)mb;
    bool last = u == pm->P * pm->V - 1;
    tpk_tensor out;
    memset(&out, 0, sizeof out);
    tpk_lm *lm = tpk_model_lm(&pm->copy[i]);
    if (pm->nside) { /* the pooled aux's sums over the blocks before this part's */
        if (u) TPK_TRY(tpk__pipe_model_side_io(ctx, pm, chunk, mb, TPK_PIPE_RECV_ACT, false));
        tpk__lm_aux_before(lm, u ? pm->host : NULL);
    }
    TPK_TRY(tpk_model_stage_forward(ctx, &pm->copy[i], u == 0 ? pm->ids + off : NULL, x,
                                    last ? pm->targets + off : NULL, pm->B, pm->S,
                                    last && pm->losses ? &pm->losses[mb] : NULL, &out));
    if (pm->nside && !last) { /* and through this part's, to the next */
        tpk__lm_aux_sums(lm, pm->host);
        TPK_TRY(tpk__pipe_model_side_io(ctx, pm, chunk, mb, TPK_PIPE_SEND_ACT, true));
    }
    if (out.ndim) /* the message: this CP rank's rows under CP (tpk_tensor.cp_rows), else whole */
        TPK_TRY(tpk__cp_rows_check(ctx, "tpk_pipe_model_step", "y", &out));
    *y = out.data;
    return TPK_OK;
}
static inline tpk_status tpk__pipe_model_bwd(tpk_ctx *ctx, void *user, int chunk, int mb,
                                             const void *dy, const void **dx) {
    tpk_pipe_model *pm = (tpk_pipe_model *)user;
    int i = pm->held[chunk * pm->M + mb];
    if (i < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_pipe_model_step",
                         "micro-batch %d, chunk %d: backward without its forward", mb, chunk);
    ctx->rng_step = pm->rng_step + (uint64_t)mb;
    tpk_tensor g;
    memset(&g, 0, sizeof g);
    /* the chunk's last micro-batch: each block's DP all-reduce starts as its backward ends */
    bool reduce = pm->dp && mb == pm->M - 1 && tpk__dp_group(ctx)->size > 1 && !pm->dp->adasum;
    int u = chunk * pm->P + pm->stage;
    tpk_lm *lm = tpk_model_lm(&pm->copy[i]);
    if (pm->nside && u != pm->P * pm->V - 1) { /* the whole model's N and C_e, from the last */
        TPK_TRY(tpk__pipe_model_side_io(ctx, pm, chunk, mb, TPK_PIPE_RECV_GRAD, false));
        tpk__lm_aux_totals(lm, pm->host);
    }
    if (reduce) pm->dp->active = true;
    tpk_status s = tpk_model_stage_backward(ctx, &pm->copy[i], pm->scale, (void *)dy, &g);
    if (reduce) pm->dp->active = false;
    TPK_TRY(s);
    if (pm->nside && u) { /* handed on to the part before */
        tpk__lm_aux_sums(lm, pm->host);
        TPK_TRY(tpk__pipe_model_side_io(ctx, pm, chunk, mb, TPK_PIPE_SEND_GRAD, true));
    }
    pm->busy[i] = false, pm->held[chunk * pm->M + mb] = -1;
    if (g.ndim) TPK_TRY(tpk__cp_rows_check(ctx, "tpk_pipe_model_step", "dx", &g)); /* as y */
    *dx = g.data;
    return TPK_OK;
}

/* The executor's view of this stage: a message is this TP rank's hidden states of T tokens (this CP
 * rank's rows under CP), all T rows or its S(0) slice under sequence parallelism (the model's own
 * layout, tpk_lm). */
static inline tpk_pipe_stage tpk__pipe_model_stage(tpk_ctx *ctx, tpk_pipe_model *pm, int64_t T) {
    const tpk_lm *p = tpk_model_lm(&pm->copy[0]);
    tpk_pipe_stage st;
    memset(&st, 0, sizeof st);
    st.count = (size_t)((p->c.sequence_parallel ? tpk_tp_split(ctx, T, ctx->tp.rank).size : T) *
                        p->c.hidden);
    st.dtype = ctx->dtype, st.forward = tpk__pipe_model_fwd, st.backward = tpk__pipe_model_bwd;
    st.user = pm;
    st.side = (size_t)pm->nside, st.side_buf = tpk__pipe_model_side;
    return st;
}
/* The side messages' places for a run of M micro-batches (a mixture of experts'). */
static inline tpk_status tpk__pipe_model_sides(tpk_ctx *ctx, tpk_pipe_model *pm, int M) {
    pm->run_m = M;
    size_t n = (size_t)pm->V * (size_t)M * 4 * (size_t)pm->nside;
    return pm->nside ? tpk__buf_reserve(ctx, &pm->side, sizeof(double) * n) : TPK_OK;
}

/* One step's forwards and backwards over the pipeline (the header says what the arguments mean). */
static inline tpk_status tpk_pipe_model_step(tpk_ctx *ctx, tpk_pipe_model *pm, const int32_t *ids,
                                             const int32_t *targets, int64_t B, int64_t S,
                                             float scale, uint64_t rng_step, float *losses) {
    static const char *fn = "tpk_pipe_model_step";
    if (!ctx) return TPK_ERR_ARG;
    if (!pm || !pm->copy)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: expected an initialised one");
    if (B < 1 || S < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "B, S: expected >= 1, got %lld, %lld",
                         (long long)B, (long long)S);
    if (!ids || !targets)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", ids ? "targets" : "ids");
    TPK_TRY(tpk__cp_layer_seq(ctx, fn, S)); /* every stage alike, before any message */
    pm->ids = ids, pm->targets = targets, pm->B = B, pm->S = S, pm->scale = scale;
    pm->rng_step = rng_step, pm->losses = losses;
    for (int i = 0; i < pm->V * pm->M; i++) pm->held[i] = -1;
    for (int i = 0; i < pm->V * pm->K; i++) pm->busy[i] = false;
    tpk_pipe_stage st = tpk__pipe_model_stage(ctx, pm, tpk_cp_rows(ctx, B, S));
    TPK_TRY(tpk__pipe_model_sides(ctx, pm, pm->M));
    TPK_TRY(tpk_pipe_run(ctx, &pm->exec, &pm->sched, &st));
    if (pm->tied && pm->P > 1 && pm->wte >= 0) { /* the two copies' gradients summed (after their
                                                    DP reductions: they write them; ZeRO-2's
                                                    comes after, in tpk_train_step) */
        if (pm->dp) TPK_TRY(tpk_dp_finish(ctx, pm->dp));
        const tpk_param *q = &ctx->params.list[pm->wte];
        float *g = (float *)ctx->params.grad.p + q->offset;
        TPK_TRY(tpk_allreduce(ctx, &pm->embed, g, g, q->numel, TPK_F32, TPK_SUM));
    }
    return TPK_OK;
}

/* The mean losses of M micro-batches (ids, targets [M][B S / c], host: this CP rank's rows) through
 * the stages, forwards alone (tpk_pipe_schedule_forward of the model's kind; a micro-batch's
 * activations dropped after its forward): losses[M] on every stage (the last stage's, given to all
 * over ctx->pp). Set the dropout to 0 first for an evaluation. Collective over the pipeline. */
static inline tpk_status tpk_pipe_model_eval(tpk_ctx *ctx, tpk_pipe_model *pm, const int32_t *ids,
                                             const int32_t *targets, int64_t B, int64_t S, int M,
                                             float *losses) {
    static const char *fn = "tpk_pipe_model_eval";
    if (!ctx) return TPK_ERR_ARG;
    if (!pm || !pm->copy)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: expected an initialised one");
    if (!ids || !targets || !losses)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL",
                         !ids       ? "ids"
                         : !targets ? "targets"
                                    : "losses");
    if (B < 1 || S < 1 || M < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "B, S, M: expected >= 1, got %lld, %lld, %d",
                         (long long)B, (long long)S, M);
    TPK_TRY(tpk__cp_layer_seq(ctx, fn, S));
    if (pm->eval_m != M) {
        tpk_pipe_schedule_free(&pm->eval);
        pm->eval_m = 0;
        tpk_pipe_kind k = pm->sched.kind;
        if (k == TPK_PIPE_INTERLEAVED && M % pm->P) k = TPK_PIPE_GPIPE; /* (V = 1 below) */
        TPK_TRY(tpk_pipe_schedule_forward(ctx, &pm->eval, k, pm->P, M,
                                          k == TPK_PIPE_INTERLEAVED ? pm->V : 1));
        pm->eval_m = M;
    }
    if (pm->eval.V != pm->V)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "M: %d micro-batches cannot run through %d chunks a stage (the "
                         "interleaved schedule needs a multiple of the %d stages)",
                         M, pm->V, pm->P);
    pm->ids = ids, pm->targets = targets, pm->B = B, pm->S = S, pm->losses = losses;
    pm->evaluating = true;
    for (int k = 0; k < M; k++) losses[k] = 0;
    tpk_pipe_stage st = tpk__pipe_model_stage(ctx, pm, tpk_cp_rows(ctx, B, S));
    tpk_status s = tpk__pipe_model_sides(ctx, pm, M);
    if (s == TPK_OK) s = tpk_pipe_run(ctx, &pm->exec, &pm->eval, &st);
    pm->evaluating = false, pm->losses = NULL;
    TPK_TRY(s);
    return pm->P > 1 ? tpk_allreduce_host(ctx, &ctx->pp, losses, (size_t)M, TPK_F32, TPK_SUM)
                     : TPK_OK;
}

/* The data-parallel buckets (tpk/train/dp.h) that each chunk's last micro-batch starts, as its
 * backward finishes each block's gradients (every copy's grad_ready hook); b = NULL: none (the
 * caller reduces after the step: ZeRO-1, Adasum). tpk_train_step waits for them. The buckets learn
 * this stage's tied embedding copy: ZeRO-2 reduce-scatters it after the two copies are summed. */
static inline void tpk_pipe_model_set_dp(tpk_pipe_model *pm, tpk_dp_buckets *b) {
    pm->dp = b;
    if (b) b->tied = pm->tied && pm->P > 1 && pm->wte >= 0 ? pm->wte + 1 : 0;
    for (int i = 0; i < pm->V * pm->K; i++)
        tpk_model_set_grad_ready(&pm->copy[i], b ? tpk_dp_grad_ready : NULL, b);
}

/* Every dropout probability of every copy (tpk_model_set_dropout). */
static inline tpk_status tpk_pipe_model_set_dropout(tpk_ctx *ctx, tpk_pipe_model *pm, float p) {
    for (int i = 0; pm && i < pm->V * pm->K; i++)
        TPK_TRY(tpk_model_set_dropout(ctx, &pm->copy[i], p));
    return TPK_OK;
}
/* A mixture of experts' load-balancing loss (its coefficient's share) of the micro-batches since
 * the last read, added up on the last stage (its last chunk's copies: the whole model's, the
 * stages' routing pooled) and given to every stage (an all-reduce over ctx->pp); 0 without
 * experts. Collective over the pipeline. */
static inline tpk_status tpk_pipe_model_aux_read(tpk_ctx *ctx, tpk_pipe_model *pm, double *sum) {
    if (!pm || !pm->copy || !sum)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_pipe_model_aux_read", "%s: NULL",
                         !sum ? "sum" : "model");
    double v = 0;
    for (int k = 0; pm->stage == pm->P - 1 && k < pm->K; k++)
        v += tpk_lm_aux_read(tpk_model_lm(&pm->copy[(pm->V - 1) * pm->K + k]));
    if (pm->P > 1) TPK_TRY(tpk_allreduce_host(ctx, &ctx->pp, &v, 1, TPK_F64, TPK_SUM));
    *sum = v;
    return TPK_OK;
}

/* *sum = the mean losses of the steps' micro-batches since the last read, added up on the last
 * stage (its last chunk's copies, each one download) and given to every stage (an all-reduce over
 * ctx->pp); *n (may be NULL) how many. Collective over the pipeline. */
static inline tpk_status tpk_pipe_model_loss_read(tpk_ctx *ctx, tpk_pipe_model *pm, double *sum,
                                                  int64_t *n) {
    double v[2] = {0, 0};
    if (!pm || !pm->copy || !sum)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_pipe_model_loss_read", "%s: NULL",
                         !sum ? "sum" : "model");
    for (int k = 0; pm->stage == pm->P - 1 && k < pm->K; k++) {
        double s = 0;
        int64_t c = 0;
        TPK_TRY(tpk_model_loss_read(ctx, &pm->copy[(pm->V - 1) * pm->K + k], &s, &c));
        v[0] += s, v[1] += (double)c;
    }
    if (pm->P > 1) TPK_TRY(tpk_allreduce_host(ctx, &ctx->pp, v, 2, TPK_F64, TPK_SUM));
    *sum = v[0];
    if (n) *n = (int64_t)v[1];
    return TPK_OK;
}

#endif /* TPK_PIPE_MODEL_H */
