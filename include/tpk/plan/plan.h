/* tpk/plan/plan.h — the configuration planner: memory per rank and step time of every TP x CP x PP
 * x DP x micro-batch x recompute x ZeRO stage (0, 1, 2) x sequence-parallel (x the CP attention's
 * mode) choice for a model, a global batch and a cluster, by a dry run of the real code.
 *
 * tpk_plan_run: one configuration. For each pipeline stage s (one stage without PP), rank
 * (TP 0, CP 0, DP 0, stage s) of the mesh is walked on the counting backend and communicator
 * (tpk/plan/count.h) through exactly the trainer's calls: tpk_ctx_init, the model (or the stage's
 * parts, tpk_pipe_model_init, 1F1B, blocks split evenly), AdamW (ZeRO-1 or 2 sharded), the DP
 * buckets (ZeRO-2's reduce-scatters under the backward: linked by tpk_dp_shard_grads),
 * then two steps of tpk_model_train_step (tpk/train/step.h) over M = B / (dp mb) micro-batches.
 * peak_bytes = the largest tpk_mem_peak over the stages from the first step on: the figure the
 * trainer prints as its peak memory (parameters, gradients, bf16 copies, activations under the
 * recompute mode, the optimizer's moments or their ZeRO slice, ZeRO-2's gradient slice beside
 * the gradient buffer the backward still fills whole, the SP scratch, the pipeline's
 * live micro-batches and receive buffers; under CP a rank's B S / c rows and the attention's
 * K|V and dK|dV blocks), counted by the same code, not a formula beside it. Under CP the ring's
 * messages (or the all-gather and reduce-scatter) are the code's own calls on the CP group,
 * costed on its channel: the K|V steps started under each block's attention, the dK|dV ones
 * waited for.
 * The second step's modelled time (tpk/plan/hw.h) is the step time: without PP, the stage's clock
 * (ops, plus the collectives' time not hidden under compute); with PP, each stage's mean forward
 * and backward (their messages shared among them) played through the schedule
 * (tpk_pipe_check_costs: the bubble), plus the slowest stage's time after its last backward (the
 * DP reduction left exposed, the norm, AdamW).
 *
 * tpk_plan: every configuration of `gpus` ranks: tp | gpus with tp <= gpus_per_node (a TP group
 * inside a node), cp | gpus / tp (desc->cp: c = 1 alone unless asked), pp | gpus / (tp cp) with
 * pp <= layers, dp = gpus / (tp cp pp) dividing the global batch, micro-batches mb | B / dp,
 * recompute none / selective / full, ZeRO 1 to 3 when dp cp > 1, SP when tp > 1, at cp > 1 the
 * ring and the all-gather, for Mixtral and Qwen2-MoE every EP size e dividing both dp
 * and the experts (desc->ep; EP groups carved out of the DP ranks: TP x EP x DP x PP, ZeRO
 * where DP x CP / e > 1 (its slices over the ranks holding the same experts), no HSDP at e > 1:
 * the trainer's rules; SP as for the dense models, the MoE block gathering its tokens and
 * reduce-scattering its output), the experts' memory (E / e of them a rank) the
 * dry run's own; each either planned or rejected with its reason (does not divide:
 * the batch over DP, the sequence over 2 cp chunks; exceeds the node; CP on a backend whose
 * table lacks the attention over CP's block op; does not fit:
 * peak + the profile's reserve over its memory, or the model's own error). Sorted: the fitting
 * ones fastest first (then the smaller peak), then the rejected.
 * The imbalance of a router is the data's, which a dry run cannot know: it assumes a balanced
 * router (tpk/layers/router.h: every expert T k / E of a rank's rows, and every EP peer routing
 * as the rank walked, tpk/layers/moe.h), so each rank receives T k rows; the all-to-alls (the
 * counts, the rows both ways) are the code's own calls on ctx->ep, costed on its channel
 * (tpk/plan/count.h). MFU counts the parameters a token uses (the experts' k / E). A Qwen2-MoE
 * with dense layers among its sparse ones (decoder_sparse_step, mlp_only_layers) is counted as it
 * is built, each dense layer's SwiGLU MLP (weights, gradients, moments, activations) where it
 * stands: its stages are dry-run whole, not probed (its blocks are of two kinds). */
#ifndef TPK_PLAN_H
#define TPK_PLAN_H

#include <math.h>

#include "../train/memory.h"
#include "../train/trainable.h"
#include "count.h"

typedef struct tpk_plan_desc {
    tpk_model_config model; /* the family's config (shape, positions; its sp and recompute are
                               set per configuration) */
    int64_t seq;            /* tokens a sequence */
    int64_t batch;          /* the global batch, sequences a step */
    int gpus, gpus_per_node;
    const tpk_hw *hw;
    const tpk_ops *like; /* the backend to count like (its fused ops; NULL: the CUDA
                               backend's) */
    tpk_dtype dtype;     /* activations: TPK_BF16 on a GPU, TPK_F32 on the host */
    /* restrictions (0 or -1: every value) */
    int tp, pp, micro_batch, zero, sp; /* zero: the ZeRO stage 0 to 3 */
    int recompute;                     /* -1: all; else a tpk_recompute */
    bool exact;  /* dry-run every block (the reference the extrapolation is tested against);
                      false: a stage of more than 3 k + 3 blocks is probed at k, k + 1, k + 2 */
    int cp;      /* CP sizes: 0 or 1: c = 1 alone (the plan without CP); -1: every c dividing the
                    ranks after TP; c > 1: c alone */
    int cp_comm; /* at c > 1: TPK_CP_P2P (0) or TPK_CP_ALLGATHER alone; -1: both */
    int ep;      /* EP sizes (a Mixtral's alone): 0 or 1: e = 1 alone; -1: every e dividing the DP
                    size and the experts; e > 1: e alone */
    int zero_shard; /* HSDP under ZeRO 1-3 (ZeRO's slices within groups of S DP x CP ranks): 0 or
                       -1: both the whole DP x CP group and a node's DP x CP ranks (gpus_per_node
                       / tp, where that is a divisor >= 2 of DP x CP and smaller); S > 0: S alone
                       (DP x CP itself, or a size that does not divide it: no HSDP) */
} tpk_plan_desc;

/* The probes' depth k (blocks a stage): past the first blocks' transients (the recompute pools'
 * first lending, the pipeline's first receive). Doubled while three probes are not affine. */
#define TPK_PLAN_PROBE 4

typedef struct tpk_plan_cfg {
    int tp, pp, dp, micro_batch, accum; /* accum: micro-batches a step per DP rank */
    tpk_recompute recompute;
    int zero; /* the ZeRO stage: 0, 1 (the optimizer sharded over DP), 2 (the gradients too), 3
               * (the weights too, between uses: tpk/train/zero3.h; each stage its own) */
    bool sp;
    bool fits;
    double peak_bytes; /* per rank, the largest over stages (tpk_mem_peak) */
    double weights_bytes, grads_bytes, optim_bytes, activ_bytes; /* that stage's peak in parts: the
                            f32 master weights and their bf16 copy (ZeRO-3: the f32 shard), the f32
                            gradients (and a bf16 model's scratch for adding into them; ZeRO-2: and
                            its reduced slice), AdamW's moments (ZeRO-1 and 2: the slice), and the
                            rest: activations, receive buffers, scratch */
    double gathered_bytes; /* that stage's part of ZeRO-3's gathered buffers (block slots, the rest
                            unit's, blocks kept for the backward); 0 without ZeRO-3 */
    double step_seconds;                                         /* modelled */
    double tokens_per_s, mfu;
    double compute_s, exposed_comm_s, bubble; /* the step's parts: compute (the slowest stage's),
                                                 collectives the clock waited for, the pipeline's
                                                 idle share */
    char reason[200];                         /* why rejected ("" when it fits) */
    int64_t probe;       /* the probes' depth k, blocks a stage, where the figures were extrapolated
                      (0: every stage dry-run whole) */
    int cp;              /* context parallelism: ranks splitting each sequence (0 read as 1) */
    tpk_cp_comm cp_comm; /* at cp > 1: the attention's mode, the ring or the all-gather */
    int ep;              /* expert parallelism: EP ranks of the DP ranks (0 read as 1) */
    int zero_shard;      /* HSDP: ZeRO's slices within groups of this many DP x CP ranks, the
                            slices' gradients all-reduced across them; 0: none (the whole group) */
} tpk_plan_cfg;

/* Its ZeRO stage in words: "3", or under HSDP "3 (HSDP: shards of S)"; into buf (n bytes). */
static inline const char *tpk_plan_zero_words(const tpk_plan_cfg *p, char *buf, size_t n) {
    if (n && p->zero_shard > 0) snprintf(buf, n, "%d (HSDP: shards of %d)", p->zero, p->zero_shard);
    else if (n) snprintf(buf, n, "%d", p->zero);
    return buf;
}

/* A configuration's EP size (its ep, 0 read as 1). */
static inline int tpk_plan_ep(const tpk_plan_cfg *p) { return p->ep > 1 ? p->ep : 1; }
/* A configuration's CP size (0 read as 1). */
static inline int tpk_plan_cp(const tpk_plan_cfg *p) { return p->cp > 1 ? p->cp : 1; }
/* Its CP in words for a mesh "TP t<words> x PP ...": " x CP c (p2p ring)" or " x CP c
 * (all-gather)", "" at c = 1; into buf (n bytes), returned. */
static inline const char *tpk_plan_cp_words(const tpk_plan_cfg *p, char *buf, size_t n) {
    if (n) buf[0] = 0;
    if (p->cp > 1 && n)
        snprintf(buf, n, " x CP %d (%s)", p->cp,
                 p->cp_comm == TPK_CP_ALLGATHER ? "all-gather" : "p2p ring");
    return buf;
}

/* A counting context: rank `rank` of a tp x cp x dp x pp world (EP groups of ep of the DP
 * ranks), timed on d's profile where it has one */
static inline tpk_status tpk__plan_ctx(tpk_ctx *err, tpk_ctx *ctx, tpk_count *c, tpk_comm *world,
                                       const tpk_plan_desc *d, int tp, int cp, int dp, int pp,
                                       int ep, int zs, int rank) {
    TPK_TRY(tpk_count_init_ep(err, c, d->hw, d->like, tp, cp, dp, pp, ep, rank,
                              d->gpus_per_node > 0 ? d->gpus_per_node : 1));
    c->zs = zs; /* HSDP: its two splits replayed */
    TPK_TRY(tpk_count_world(err, c, world));
    tpk_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.ops = &c->ops, cd.world = world, cd.tp = tp, cd.cp = cp, cd.pp = pp, cd.ep = ep;
    cd.zero_shard_size = zs;
    cd.seed = 1;
    cd.dtype = d->dtype;
    cd.allocator = err->allocator, cd.logger = err->logger; /* the caller's hooks */
    tpk_status s = tpk_ctx_init(ctx, &cd);
    if (s != TPK_OK) {
        snprintf(err->err, sizeof err->err, "%s", ctx->err);
        tpk_comm_destroy(world);
        return err->last = s;
    }
    if (d->hw) s = tpk_count_attach(ctx, c);
    return s;
}

/* A mixture of experts' E and k (the family's defaults applied): 0 and 0 for a model without
 * experts (Mixtral: tpk/models/mixtral.h, Qwen2-MoE: tpk/models/qwen2_moe.h). */
static inline int64_t tpk__plan_experts(const tpk_model_config *m, int64_t *k) {
    if (m->arch == TPK_ARCH_MIXTRAL)
        return *k = m->mixtral.top_k ? m->mixtral.top_k : 2,
               m->mixtral.experts ? m->mixtral.experts : 8;
    if (m->arch == TPK_ARCH_QWEN2_MOE)
        return *k = m->qwen2_moe.top_k ? m->qwen2_moe.top_k : 4,
               m->qwen2_moe.experts ? m->qwen2_moe.experts : 60;
    return *k = 0, 0;
}

/* Whether the model's blocks are all alike, so that the probes' extrapolation (which adds blocks
 * to a stage) holds: not for a Qwen2-MoE with dense layers among its sparse ones (two kinds of
 * block, in an order of the layer's index), whose stages are dry-run whole. */
static inline bool tpk__plan_blocks_alike(const tpk_model_config *m) {
    return m->arch != TPK_ARCH_QWEN2_MOE || tpk_qwen2_moe_dense_layers(&m->qwen2_moe) == 0;
}

/* Parameters of a model of `layers` blocks (0: the desc's own; the tied embedding once); *ex: the
 * routed experts' among them. */
static inline tpk_status tpk__plan_params_at(tpk_ctx *err, const tpk_plan_desc *d, int64_t layers,
                                             double *n, double *ex) {
    tpk_count c;
    tpk_comm world;
    tpk_ctx ctx;
    tpk_plan_desc one = *d;
    one.hw = NULL;
    TPK_TRY(tpk__plan_ctx(err, &ctx, &c, &world, &one, 1, 1, 1, 1, 1, 0, 0));
    tpk_model m;
    tpk_model_config cfg = d->model;
    int64_t *sh[5];
    tpk__model_common(&cfg, sh, NULL, NULL, NULL, NULL);
    if (layers > 0) *sh[2] = layers;
    tpk_status s = tpk_model_init(&ctx, &m, &cfg);
    if (s == TPK_OK) {
        *n = (double)tpk_params_global_numel(&ctx), *ex = 0;
        for (int i = 0; i < ctx.params.n; i++)
            if (ctx.params.list[i].expert) *ex += (double)tpk_param_global_numel(&ctx, i);
        tpk_model_destroy(&ctx, &m);
    } else snprintf(err->err, sizeof err->err, "%s", ctx.err), err->last = s;
    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    return s;
}

/* The whole model's parameters (the tied embedding once) and its routed experts' (*ex).
 * Past 2 TPK_PLAN_PROBE + 1 blocks (and not d->exact, the blocks alike): N(k) + (L - k)
 * (N(k + 1) - N(k)), k = TPK_PLAN_PROBE — the blocks are identical, so exact (whole numbers below
 * 2^53); a model of two kinds of block is built whole. */
static inline tpk_status tpk__plan_params(tpk_ctx *err, const tpk_plan_desc *d, double *n,
                                          double *ex) {
    tpk_model_config cfg = d->model;
    int64_t *sh[5], k = TPK_PLAN_PROBE;
    tpk__model_common(&cfg, sh, NULL, NULL, NULL, NULL);
    int64_t L = *sh[2];
    if (d->exact || L <= 2 * k + 1 || !tpk__plan_blocks_alike(&d->model))
        return tpk__plan_params_at(err, d, 0, n, ex);
    double a = 0, b = 0, xa = 0, xb = 0;
    TPK_TRY(tpk__plan_params_at(err, d, k, &a, &xa));
    TPK_TRY(tpk__plan_params_at(err, d, k + 1, &b, &xb));
    *n = a + (double)(L - k) * (b - a), *ex = xa + (double)(L - k) * (xb - xa);
    return TPK_OK;
}
/* Parameters of the whole model (the tied embedding once). */
static inline tpk_status tpk_plan_model_params(tpk_ctx *err, const tpk_plan_desc *d, double *n) {
    double ex = 0;
    return tpk__plan_params(err, d, n, &ex);
}
/* Those a token uses, for MFU (6 N + 12 L H S flops a token): k of the E routed experts (a
 * Qwen2-MoE's shared expert on every token). */
static inline tpk_status tpk__plan_active_params(tpk_ctx *err, const tpk_plan_desc *d, double *n) {
    double ex = 0;
    TPK_TRY(tpk__plan_params(err, d, n, &ex));
    int64_t k = 0, E = tpk__plan_experts(&d->model, &k);
    if (E) *n -= ex * (1.0 - (double)k / (double)E);
    return TPK_OK;
}

/* One stage's dry run: its peak, the second step's time and, with stages, its forwards' and
 * backwards' time, its messages' and the schedule. */
typedef struct tpk__plan_stage {
    double peak, step, f, b, msg, tail, compute, exposed, weights, grads, optim, gathered;
    double elems; /* the largest collective's elements */
    double busy[TPK_COUNT_CHANNELS], wait[TPK_COUNT_CHANNELS]; /* per channel, the second step */
} tpk__plan_stage;

static inline tpk_status tpk__plan_stage_run(tpk_ctx *err, const tpk_plan_desc *d, tpk_plan_cfg *p,
                                             int stage, int64_t per_stage, tpk__plan_stage *out,
                                             tpk_pipe_schedule *sched) {
    tpk_count c;
    tpk_comm world;
    tpk_ctx ctx;
    int cp = tpk_plan_cp(p);
    TPK_TRY(tpk__plan_ctx(err, &ctx, &c, &world, d, p->tp, cp, p->dp, p->pp, tpk_plan_ep(p),
                          p->zero_shard, stage * p->tp * cp * p->dp));
    tpk_model_config cfg = d->model;
    int64_t *sh[5];
    tpk_model_config_common(&cfg, sh, 0.0f, p->sp, p->recompute);
    cfg.gpt2.cp_comm = cfg.llama.cp_comm = cfg.neox.cp_comm = cfg.custom.cp_comm = p->cp_comm;
    if (per_stage > 0) *sh[2] = per_stage * p->pp; /* a probe: per_stage blocks on every stage */
    tpk_model m;
    tpk_pipe_model pm;
    tpk_adamw opt;
    tpk_dp_buckets b;
    tpk_zero3 z3;
    memset(&m, 0, sizeof m), memset(&pm, 0, sizeof pm), memset(&opt, 0, sizeof opt);
    memset(&b, 0, sizeof b), memset(&z3, 0, sizeof z3);
    bool piped = p->pp > 1;
    size_t ntok = (size_t)p->accum * (size_t)p->micro_batch * (size_t)d->seq; /* (>= CP rows) */
    int32_t *ids = (int32_t *)tpk__calloc(&ctx, ntok, sizeof(int32_t));
    tpk_status s = ids ? TPK_OK : tpk__fail(&ctx, TPK_ERR_NOMEM, "tpk_plan", "out of host memory");
    if (s == TPK_OK)
        s = piped
                ? tpk_pipe_model_init(&ctx, &pm, &cfg, TPK_PIPE_1F1B, p->accum, 1, NULL, NULL, 0, 0)
                : tpk_model_init(&ctx, &m, &cfg);
    tpk_adamw_desc ad; /* the trainer's defaults; the moments' size is what counts */
    memset(&ad, 0, sizeof ad);
    ad.b1 = 0.9f, ad.b2 = 0.95f, ad.eps = 1e-8f, ad.weight_decay = 0.1f;
    ad.zero = p->zero > 0, ad.zero_stage = p->zero;
    if (s == TPK_OK) s = tpk_adamw_init(&ctx, &opt, &ad);
    if (s == TPK_OK && p->zero >= 2) s = tpk_dp_shard_grads(&ctx, &b, &opt);
    if (s == TPK_OK && p->zero == 3) /* the trainer's: each stage its own */
        s = piped ? tpk_zero3_init_pipe(&ctx, &z3, &pm, &opt, NULL)
                  : tpk_zero3_init(&ctx, &z3, tpk_model_lm(&m), &opt, NULL);
    if (s == TPK_OK) {
        if (piped)
            tpk_pipe_model_set_dp(&pm, p->zero == 1 ? NULL : &b), pm.exec.clock = tpk__count_clock,
                                                                  pm.exec.clock_user = &c;
        else tpk_model_set_grad_ready(&m, tpk_dp_grad_ready, &b);
        tpk_mem_peak(&ctx, true); /* the trainer's peak: from the first step */
    }
    double t0 = 0, e0 = 0, o0 = 0, busy0[TPK_COUNT_CHANNELS], wait0[TPK_COUNT_CHANNELS];
    for (int step = 0; s == TPK_OK && step < 2; step++) {
        t0 = c.t, e0 = c.t_exposed, o0 = c.t_ops;
        memcpy(busy0, c.chan_busy, sizeof busy0), memcpy(wait0, c.chan_wait, sizeof wait0);
        s = tpk_model_train_step(&ctx, piped ? NULL : &m, piped ? &pm : NULL, &opt, &b, ids, ids,
                                 p->micro_batch, d->seq, p->accum,
                                 1.0f / (float)p->accum / (float)p->dp, (uint64_t)step * 1000u,
                                 1e-4f, 1.0f, NULL);
    }
    if (s == TPK_OK) {
        out->peak = (double)tpk_mem_peak(&ctx, false);
        tpk_mem_held h; /* held from the setup on: their share of the peak */
        s = tpk_mem_held_get(&ctx, &opt, &z3, &h);
        out->weights = h.weights, out->grads = h.grads, out->optim = h.optim;
        out->gathered = h.gathered;
        out->step = c.t - t0, out->exposed = c.t_exposed - e0, out->compute = c.t_ops - o0;
        out->elems = c.max_elems;
        for (int i = 0; i < TPK_COUNT_CHANNELS; i++)
            out->busy[i] = c.chan_busy[i] - busy0[i], out->wait[i] = c.chan_wait[i] - wait0[i];
        if (piped) {
            int steps = pm.M * pm.V;
            out->f = pm.exec.t_f / steps, out->b = pm.exec.t_b / steps;
            out->msg = pm.exec.t_wait;
            out->tail = out->step - pm.exec.t_compute - pm.exec.t_wait;
            if (sched && !sched->n) { /* the schedule, for the planner's play */
                s = tpk_pipe_schedule_make(&ctx, sched, TPK_PIPE_1F1B, p->pp, p->accum, 1);
            }
        }
    } else snprintf(err->err, sizeof err->err, "%s", ctx.err), err->last = s;
    tpk__free(&ctx, ids);
    if (piped) tpk_pipe_model_destroy(&ctx, &pm);
    else tpk_model_destroy(&ctx, &m);
    tpk_zero3_destroy(&ctx, &z3);
    tpk_adamw_destroy(&ctx, &opt);
    tpk_dp_destroy(&b);
    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    return s;
}

/* The figures of a stage, as an array (the extrapolation's fields): memory ones first. */
enum { TPK__PLAN_MEM = 6, TPK__PLAN_FIELDS = 13 };
static inline void tpk__plan_fields(tpk__plan_stage *x, double *f[TPK__PLAN_FIELDS]) {
    f[0] = &x->peak, f[1] = &x->weights, f[2] = &x->grads, f[3] = &x->optim, f[4] = &x->gathered;
    f[5] = &x->elems, f[6] = &x->step, f[7] = &x->f, f[8] = &x->b, f[9] = &x->msg;
    f[10] = &x->tail, f[11] = &x->compute, f[12] = &x->exposed;
}

/* Stage `stage`'s figures with n blocks. A stage's blocks are identical (else, a Qwen2-MoE's dense
 * layers among its sparse ones, the stage is dry-run whole: tpk__plan_blocks_alike): each adds the
 * same
 * buffers (its weights, gradients, moments, kept activations) and the same ops and collectives, so
 * every figure is affine in n once the first blocks' transients are past: x(n) = x(k) + (n - k) dx.
 * Three probes (k, k + 1, k + 2 blocks on every stage, the rest of the configuration as is) give
 * dx and check it: the memory figures' two differences equal exactly (whole bytes), the times'
 * within 1e-9 of the step (rounding); else k doubles. The times are affine only once past a
 * transient: a channel's backlog left by the ends (an untied head's large DP bucket, drained under
 * the blocks' backward) shrinks by a block's compute less its collectives per block, and while it
 * drains the step grows slower than later. The step is the largest of the clock's path and each
 * channel's (convex in n): it is affine from the probes on when no figure falls (each is a sum of
 * non-negative times, so a falling one is a transient: a wait on a channel draining), and no
 * channel's time grows faster than the step (it would overtake the step further on: the step
 * holds every collective it starts). Else k doubles. A stage of at most 3 k + 3 blocks (or
 * d->exact) is dry-run whole: fewer blocks than the probes'. The largest collective's elements
 * extrapolated past INT_MAX refuse the configuration as the real run's front end would. */
static inline tpk_status tpk__plan_stage_at(tpk_ctx *err, const tpk_plan_desc *d, tpk_plan_cfg *p,
                                            int stage, int64_t n, tpk__plan_stage *out,
                                            tpk_pipe_schedule *sched) {
    for (int64_t k = TPK_PLAN_PROBE;; k *= 2) {
        if (d->exact || n <= 3 * k + 3 || !tpk__plan_blocks_alike(&d->model))
            return tpk__plan_stage_run(err, d, p, stage, 0, out, sched);
        tpk__plan_stage x[3];
        double *f[3][TPK__PLAN_FIELDS], *o[TPK__PLAN_FIELDS];
        memset(x, 0, sizeof x);
        for (int i = 0; i < 3; i++) {
            TPK_TRY(tpk__plan_stage_run(err, d, p, stage, k + i, &x[i], sched));
            tpk__plan_fields(&x[i], f[i]);
        }
        *out = x[2];
        tpk__plan_fields(out, o);
        bool affine = true;
        double m = (double)(n - k - 2), tol = 1e-9 * (fabs(x[2].step) + fabs(x[2].f + x[2].b));
        for (int j = 0; j < TPK__PLAN_FIELDS; j++) {
            double d1 = *f[1][j] - *f[0][j], d2 = *f[2][j] - *f[1][j];
            if (j < TPK__PLAN_MEM ? d1 != d2 : fabs(d1 - d2) > tol) affine = false;
            *o[j] = *f[2][j] + m * (j < TPK__PLAN_MEM ? d2 : 0.5 * (d1 + d2));
        }
        double dstep = 0.5 * (x[2].step - x[0].step);
        for (int j = TPK__PLAN_MEM; j < TPK__PLAN_FIELDS; j++)
            if (*f[2][j] - *f[0][j] < -2 * tol) affine = false; /* falling: a transient */
        for (int i = 0; i < TPK_COUNT_CHANNELS; i++)
            if (x[2].wait[i] - x[0].wait[i] < -2 * tol ||
                0.5 * (x[2].busy[i] - x[0].busy[i]) > dstep + tol)
                affine = false;
        if (!affine) continue;
        if (k > p->probe) p->probe = k;
        if (out->elems > (double)INT_MAX)
            return tpk__fail(err, TPK_ERR_ARG, "tpk_plan",
                             "stage %d of %lld blocks: a collective of %.0f elements, expected at "
                             "most %d per call",
                             stage, (long long)n, out->elems, INT_MAX);
        return TPK_OK;
    }
}

/* Plan configuration p (its tp, pp, dp, micro_batch, accum, recompute, zero, sp set): its peak,
 * time and fit; the model's own refusal (a shape that does not divide) lands in p->reason and
 * returns TPK_OK with fits = false; params: tpk_plan_model_params's. */
static inline tpk_status tpk_plan_run(tpk_ctx *err, const tpk_plan_desc *d, double params,
                                      tpk_plan_cfg *p) {
    tpk__plan_stage st[1024];
    memset(st, 0, sizeof st[0]);
    int P = p->pp;
    if (P > 1024) return tpk__fail(err, TPK_ERR_ARG, "tpk_plan_run", "pp: at most 1024, got %d", P);
    tpk_pipe_schedule sched;
    memset(&sched, 0, sizeof sched);
    p->fits = false, p->reason[0] = 0, p->peak_bytes = 0, p->step_seconds = 0, p->probe = 0;
    double pf[1024], pb[1024], tail = 0, compute = 0, exposed = 0;
    int64_t *sh[5];
    tpk_model_config cfg = d->model;
    tpk_model_config_common(&cfg, sh, 0.0f, false, TPK_RECOMPUTE_NONE);
    int64_t L = *sh[2];
    for (int s = 0; s < P; s++) { /* tpk_pipe_split's even split: stages 1 .. L % P one more */
        int64_t n = L / P + (s >= 1 && s <= L % P ? 1 : 0);
        tpk_status r = tpk__plan_stage_at(err, d, p, s, n, &st[s], &sched);
        if (r == TPK_ERR_NOMEM) return r;
        if (r != TPK_OK) { /* the model's refusal: this configuration's reason */
            snprintf(p->reason, sizeof p->reason, "%.199s", err->err);
            tpk_clear_error(err);
            tpk_pipe_schedule_free(&sched);
            return TPK_OK;
        }
        if (st[s].peak > p->peak_bytes) {
            p->peak_bytes = st[s].peak, p->weights_bytes = st[s].weights;
            p->grads_bytes = st[s].grads, p->optim_bytes = st[s].optim;
            p->gathered_bytes = st[s].gathered;
            p->activ_bytes =
                st[s].peak - st[s].weights - st[s].grads - st[s].optim - st[s].gathered;
        }
        pf[s] = st[s].f + st[s].msg / (2.0 * p->accum),
        pb[s] = st[s].b + st[s].msg / (2.0 * p->accum);
        if (st[s].tail > tail) tail = st[s].tail;
        if (st[s].compute > compute) compute = st[s].compute;
        if (st[s].exposed > exposed) exposed = st[s].exposed;
    }
    double span = st[0].step, idle[1024];
    p->bubble = 0;
    if (P > 1) {
        tpk_status r = tpk_pipe_check_costs(err, &sched, pf, pb, idle, &span);
        tpk_pipe_schedule_free(&sched);
        TPK_TRY(r);
        double worst = 0;
        for (int s = 0; s < P; s++) worst = idle[s] > worst ? idle[s] : worst;
        p->bubble = span > 0 ? worst / span : 0;
        span += tail;
    }
    p->step_seconds = span, p->compute_s = compute, p->exposed_comm_s = exposed;
    double tok = (double)d->batch * (double)d->seq;
    double flops = (6.0 * params + 12.0 * (double)*sh[2] * (double)*sh[3] * (double)d->seq) * tok;
    p->tokens_per_s = span > 0 ? tok / span : 0;
    p->mfu = d->hw && span > 0 ? flops / span / (d->hw->peak_tflops * 1e12 * d->gpus) : 0;
    double need = p->peak_bytes + (d->hw ? d->hw->reserve_gb * 1e9 : 0);
    p->fits = !d->hw || need <= d->hw->mem_gb * 1e9;
    if (!p->fits)
        snprintf(p->reason, sizeof p->reason,
                 "does not fit: %.2f GB per rank + %.1f GB reserved > %.0f GB", p->peak_bytes / 1e9,
                 d->hw->reserve_gb, d->hw->mem_gb);
    return TPK_OK;
}

static inline int tpk__plan_cmp(const void *a, const void *b) {
    const tpk_plan_cfg *x = (const tpk_plan_cfg *)a, *y = (const tpk_plan_cfg *)b;
    if (x->fits != y->fits) return x->fits ? -1 : 1;
    if (x->fits && x->step_seconds != y->step_seconds)
        return x->step_seconds < y->step_seconds ? -1 : 1;
    if (x->peak_bytes != y->peak_bytes) return x->peak_bytes < y->peak_bytes ? -1 : 1;
    return 0;
}

/* One slot more of *v (n used of *cap), zeroed: NULL when out of memory (*v freed). */
static inline tpk_plan_cfg *tpk__plan_slot(tpk_ctx *err, tpk_plan_cfg **v, int *n, int *cap) {
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 256;
        tpk_plan_cfg *w =
            (tpk_plan_cfg *)tpk__realloc(err, *v, sizeof *w * (size_t)*cap, sizeof *w * (size_t)nc);
        if (!w) {
            tpk__free(err, *v), *v = NULL;
            return NULL;
        }
        *v = w, *cap = nc;
    }
    tpk_plan_cfg *p = &(*v)[(*n)++];
    memset(p, 0, sizeof *p);
    return p;
}

/* The configurations of one mesh TP x CP x PP x DP into *v (n of *cap): every micro-batch,
 * recompute mode, ZeRO stage, SP and CP mode the desc allows, each planned; a mesh rejected before
 * any dry run gives one row with its reason. */
static inline tpk_status tpk__plan_mesh(tpk_ctx *err, const tpk_plan_desc *d, int64_t L, int tp,
                                        int cp, int pp, int dp, int ep, bool cp_ops, double params,
                                        tpk_plan_cfg **v, int *n, int *cap) {
    int64_t Bd = d->batch % dp ? 0 : d->batch / dp, k = 0,
            E = tpk__plan_experts(&d->model, &k); /* (read at ep > 1) */
    char why[200] = "";
    if (tp > d->gpus_per_node)
        snprintf(why, sizeof why, "TP %d exceeds a node's %d GPUs (a TP group stays inside a node)",
                 tp, d->gpus_per_node);
    else if (pp > L)
        snprintf(why, sizeof why, "PP %d: more stages than the %lld blocks", pp, (long long)L);
    else if (!Bd)
        snprintf(why, sizeof why, "does not divide: the global batch %lld over DP %d",
                 (long long)d->batch, dp);
    else if (cp > 1 && d->seq % (2 * cp))
        snprintf(why, sizeof why,
                 "does not divide: the sequence length %lld into 2 x CP %d chunks (the "
                 "load-balanced split)",
                 (long long)d->seq, cp);
    else if (ep > 1 && dp % ep)
        snprintf(why, sizeof why,
                 "does not divide: DP %d into EP groups of %d (EP is carved out of the DP ranks)",
                 dp, ep);
    else if (ep > 1 && E % ep)
        snprintf(why, sizeof why, "does not divide: the %lld experts over EP %d", (long long)E, ep);
    else if (cp > 1 && !cp_ops)
        snprintf(why, sizeof why,
                 "CP %d: the %s backend has no attention over CP yet (attn_block_fwd, _bwd)", cp,
                 d->like && d->like->name ? d->like->name : "CUDA");
    if (why[0]) {
        tpk_plan_cfg *p = tpk__plan_slot(err, v, n, cap);
        if (!p) return tpk__fail(err, TPK_ERR_NOMEM, "tpk_plan", "out of memory");
        p->tp = tp, p->cp = cp, p->pp = pp, p->dp = dp, p->ep = ep;
        snprintf(p->reason, sizeof p->reason, "%s", why);
        return TPK_OK;
    }
    for (int64_t mb = 1; mb <= Bd; mb++) {
        if (Bd % mb || (d->micro_batch > 0 && mb != d->micro_batch)) continue;
        for (int rc = 0; rc < TPK_RECOMPUTE_COUNT; rc++) {
            if (d->recompute >= 0 && rc != d->recompute) continue;
            /* ZeRO where its slicing group (DP x CP, at EP > 1 the ranks holding the same
               experts: DP x CP / EP) has more than one rank */
            for (int z = 0; z <= (dp * cp / ep > 1 ? 3 : 0); z++) {
                if (d->zero >= 0 && z != d->zero) continue;
                /* HSDP's shard sizes: none, and a node's DP x CP ranks (or the one asked); not
                   at EP > 1 */
                int g = dp * cp, node = d->gpus_per_node % tp ? 0 : d->gpus_per_node / tp;
                int hs = d->zero_shard > 0 ? d->zero_shard : node;
                hs = z && ep == 1 && hs >= 2 && hs < g && g % hs == 0 ? hs : 0;
                for (int zs = d->zero_shard > 0 && hs ? hs : 0; zs <= hs; zs += hs ? hs : 1)
                for (int sp = 0; sp <= (tp > 1); sp++) {
                    if (d->sp >= 0 && sp != d->sp) continue;
                    for (int cm = 0; cm <= (cp > 1 ? TPK_CP_ALLGATHER : 0); cm++) {
                        if (cp > 1 && d->cp_comm >= 0 && cm != d->cp_comm) continue;
                        tpk_plan_cfg *p = tpk__plan_slot(err, v, n, cap);
                        if (!p) return tpk__fail(err, TPK_ERR_NOMEM, "tpk_plan", "out of memory");
                        p->tp = tp, p->cp = cp, p->pp = pp, p->dp = dp, p->micro_batch = (int)mb;
                        p->accum = (int)(Bd / mb), p->recompute = (tpk_recompute)rc, p->zero = z;
                        p->sp = sp, p->cp_comm = (tpk_cp_comm)cm, p->ep = ep, p->zero_shard = zs;
                        TPK_TRY(tpk_plan_run(err, d, params, p));
                    }
                }
            }
        }
    }
    return TPK_OK;
}

/* Every configuration (see the top) into *out (n of them; tpk_free(err, *out) frees it), sorted. */
static inline tpk_status tpk_plan(tpk_ctx *err, const tpk_plan_desc *d, tpk_plan_cfg **out,
                                  int *n) {
    static const char *fn = "tpk_plan";
    if (!err) return TPK_ERR_ARG;
    if (!d || !out || !n) return tpk__fail(err, TPK_ERR_ARG, fn, "desc, out, n: NULL");
    *out = NULL, *n = 0;
    if (d->gpus < 1)
        return tpk__fail(err, TPK_ERR_ARG, fn, "gpus: expected at least 1 rank, got %d", d->gpus);
    if (d->gpus_per_node < 1)
        return tpk__fail(err, TPK_ERR_ARG, fn, "gpus_per_node: expected >= 1, got %d",
                         d->gpus_per_node);
    if (d->batch < 1 || d->seq < 1)
        return tpk__fail(err, TPK_ERR_ARG, fn,
                         "batch, seq: expected a global batch and a sequence length >= 1, got "
                         "%lld, %lld",
                         (long long)d->batch, (long long)d->seq);
    double params = 0;
    TPK_TRY(tpk__plan_active_params(err, d, &params));
    int64_t *sh[5];
    tpk_model_config cfg = d->model;
    tpk_model_config_common(&cfg, sh, 0.0f, false, TPK_RECOMPUTE_NONE);
    int64_t L = *sh[2];
    int cap = 0, cnt = 0;
    tpk_plan_cfg *v = NULL;
    int want_cp = d->cp == 0 ? 1 : d->cp; /* -1: every CP size */
    int want_ep = d->ep == 0 ? 1 : d->ep; /* -1: every EP size */
    int64_t topk = 0, experts = tpk__plan_experts(&d->model, &topk); /* 0: none */
    if (want_ep > 1 && !experts)
        return tpk__fail(err, TPK_ERR_ARG, fn,
                         "ep: %d expert-parallel ranks, and the model has no experts (a Mixtral "
                         "or a Qwen2-MoE has)",
                         want_ep);
    /* the attention over CP: the counted backend's block op (attn_block_fwd, _bwd) */
    bool cp_ops = d->like && d->like->attn_block_fwd && d->like->attn_block_bwd;
    for (int tp = 1; tp <= d->gpus; tp++) {
        if (d->gpus % tp || (d->tp > 0 && tp != d->tp)) continue;
        for (int cp = 1; cp <= d->gpus / tp; cp++) {
            if ((d->gpus / tp) % cp || (want_cp > 0 && cp != want_cp)) continue;
            for (int pp = 1; pp <= d->gpus / tp / cp; pp++) {
                if ((d->gpus / tp / cp) % pp || (d->pp > 0 && pp != d->pp)) continue;
                int dp = d->gpus / tp / cp / pp;
                int e0 = want_ep > 0 ? want_ep : 1, e1 = want_ep > 0 ? want_ep : experts ? dp : 1;
                for (int ep = e0; ep <= e1; ep++) { /* a given EP is rejected by name */
                    if (want_ep < 0 && (dp % ep || experts % ep)) continue;
                    tpk_status s = tpk__plan_mesh(err, d, L, tp, cp, pp, dp, ep, cp_ops, params, &v,
                                                  &cnt, &cap);
                    if (s != TPK_OK) {
                        tpk__free(err, v);
                        return s;
                    }
                }
            }
        }
    }
    qsort(v, (size_t)cnt, sizeof *v, tpk__plan_cmp);
    *out = v, *n = cnt;
    return TPK_OK;
}

/* One configuration as a JSON object (the keys of build/plan --json). */
static inline void tpk_plan_json(const tpk_plan_cfg *p, FILE *f) {
    fprintf(f,
            "{\"tp\": %d, \"cp\": %d, \"pp\": %d, \"dp\": %d, \"ep\": %d, \"micro_batch\": %d, "
            "\"accum\": %d, \"cp_comm\": \"%s\", "
            "\"recompute\": \"%s\", \"zero\": %d, \"sp\": %s, \"peak_bytes\": %.0f, "
            "\"weights_bytes\": %.0f, \"gathered_bytes\": %.0f, \"grads_bytes\": %.0f, "
            "\"optimizer_bytes\": %.0f, \"activation_bytes\": %.0f, \"step_seconds\": %.6g, "
            "\"tokens_per_s\": %.6g, \"mfu\": %.4f, \"bubble\": %.4f, \"fits\": %s",
            p->tp, tpk_plan_cp(p), p->pp, p->dp, tpk_plan_ep(p), p->micro_batch, p->accum,
            tpk_cp_comm_name(p->cp_comm), tpk_recompute_name(p->recompute), p->zero,
            p->sp ? "true" : "false", p->peak_bytes, p->weights_bytes, p->gathered_bytes,
            p->grads_bytes, p->optim_bytes, p->activ_bytes, p->step_seconds, p->tokens_per_s,
            p->mfu, p->bubble, p->fits ? "true" : "false");
    fprintf(f, ", \"zero_shard_size\": %d", p->zero_shard); /* HSDP's S; 0: none */
    if (p->reason[0]) {
        fprintf(f, ", \"reason\": \"");
        for (const char *c = p->reason; *c; c++)
            if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
            else if ((unsigned char)*c >= 0x20) fputc(*c, f);
        fprintf(f, "\"");
    }
    fprintf(f, "}");
}

#endif /* TPK_PLAN_H */
