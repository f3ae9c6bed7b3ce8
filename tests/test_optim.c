/* tests/test_optim.c — the trainer headers tpk/train/optim.h and tpk/train/dp.h at t = ranks:
 *   AdamW (decayed and undecayed, sharded and replicated parameters, 3 steps, grad_scale)
 *     against a double-precision scalar reference on the gathered global tensors;
 *   the gradient norm against the unsharded norm (a replicated parameter counted once) and the
 *     clipping factor; tpk_train_step's clipping from the sum of squares in backend memory equal to
 *     the factor applied apart; a step with a non-finite norm skipped (weights kept), counted and
 *     reported by the next read; the learning-rate schedules against their formulas;
 *   DP buckets (t = 1, dp = ranks): the hook's all-reduces equal the sum of every rank's
 *     gradients, a micro-step that is not the last communicates nothing (the protocol's checks:
 *     tests/test_dp.c);
 *   ZeRO-1 (tpk_train_step with tpk_adamw_desc.zero) at DP = ranks / t against plain DP over 5
 *     steps (parameters, norms, moments), its optimizer state 1/dp per rank, its collectives, and
 *     its moments saved and loaded back (whole, into a plain optimizer, and into ZeRO-1 again);
 *   ZeRO-2 (tpk_adamw_desc.zero_stage 2, the buckets linked by tpk_dp_shard_grads) at
 *     DP = ranks / t against plain DP over 4 steps of 2 accumulated micro-batches (parameters,
 *     norms; a parameter partial over TP, deferred past its TP sum), its moments and reduced
 *     gradient slice 1/dp, its reduce-scatters per run of reported parameters (none before the
 *     last micro-batch), a range never reported refused with the weights kept, unlinked buckets
 *     refused, and its moments saved and loaded at ZeRO 0, 1 and 2;
 *   Adasum (tpk_dp_adasum) at DP = ranks / t against a double-precision reference of the recursive
 *     formula on the global tensors, with TP-sharded tensors at t = 2; equal gradients give that
 *     gradient, orthogonal ones their sum; DP 3 refused;
 *   the DP reduction over DP x CP (ctx->dp_cp; CP 2 x DP 2 and TP 2 x CP 2 at 4 ranks, CP 3 at 3,
 *     CP 2 at 2): plain buckets, ZeRO-1, ZeRO-2 and Adasum over 3 steps of tpk_train_step, each
 *     rank's gradient a random part of its DP rank's, against one rank's step on the sum over
 *     every replica (Adasum: over the DP ranks' sums) — parameters, norms, the ZeRO slice 1/(dp
 *     cp), the collectives on the DP x CP group and none on ctx->dp alone;
 *   ZeRO-3 (tpk/train/zero3.h) at DP = ranks: GPT-2 and Llama (no recompute, full recompute,
 *     blocks kept for the backward) over 3 steps of tpk_train_step against ZeRO-0: losses and
 *     norms within 1e-6, every weight after them; the bytes held (the shard, the two block
 *     buffers) counted exactly; the all-gathers of a step (count, elements) the schedule's; the
 *     next block's gather in flight (the flight recorder) when each block's forward and backward
 *     begin (none with no_prefetch, whose steps equal too); the profiler's rows "dp.allgather
 *     (start)" and "dp.wait (allgather)" one call per gather, the reduce-scatters' waits apart;
 *     bad input refused; HSDP (tpk_ctx_desc.zero_shard_size 2) at DP 4 the same;
 *   ZeRO-3 with pipeline stages (tpk_zero3_init_pipe) at PP 2 x DP 2 (4 ranks): GPT-2, 1F1B over 3
 *     micro-batches (no recompute, full recompute, blocks kept) and interleaved (2 chunks a stage,
 *     4 micro-batches), 3 steps against ZeRO-0 at the same stages: losses, norms, weights; each
 *     step's all-gathers the schedule's (2 M L_s + the rest's runs);
 *   bad input. Random inputs; results are checked on every element. */
#include "test.h"

#include <tpk/models/gpt2.h>
#include <tpk/models/llama.h>
#include <tpk/train/hf.h>
#include <tpk/train/trainable.h>
#include <tpk/train/train.h>
#include <tpk/train/memory.h>
#include <tpk/train/zero3.h>

static int me, np;
static tpk_comm world;
enum { NP = 4 };

/* W [6, 10] split on dim 0 (decay), b [10] replicated (no decay), E [9, 4] split (decay), g [4]
 * replicated (decay off) */
static void add_params(tpk_ctx *ctx, int *ids) {
    static const struct { const char *name; int ndim; int64_t d0, d1; bool split, decay;
    } P[NP] = {{"w", 2, 6, 10, true, true},
               {"b", 1, 10, 0, false, false},
               {"e", 2, 9, 4, true, true},
               {"g", 1, 4, 0, false, false}};
    for (int i = 0; i < NP; i++)
        CHECK_OK(ctx, tpk__param_add(ctx, P[i].name, P[i].ndim, P[i].d0, P[i].d1,
                                     P[i].split ? TPK_S(0) : TPK_R, TPK_INIT_NORMAL, 0.5f,
                                     P[i].decay, &ids[i]));
}
/* every parameter's gradient: N(0, 1) of (seed, name, global index), the same global tensor at
 * every t */
static void set_grads(tpk_ctx *ctx, uint64_t seed, float **glob) {
    for (int i = 0; i < ctx->params.n; i++) {
        size_t gn = tpk_param_global_numel(ctx, i);
        for (size_t k = 0; k < gn; k++)
            glob[i][k] = tpk_rng_normal(seed, tpk_rng_stream(ctx->params.list[i].name), k);
        CHECK_OK(ctx, tpk_param_scatter(ctx, i, glob[i], (float *)ctx->params.grad.p));
    }
}

/* Adasum's double-precision reference for parameter i (gn global elements) over d DP ranks:
 * rank r's gradient (kind 0 random, 1 the same on every rank, 2 disjoint supports), this rank's
 * into mine, and the recursive-doubling result into want. */
static void adasum_ref(int i, int kind, int d, int me_dp, size_t gn, float *mine, float *want) {
    double *ref = malloc(sizeof(double) * gn * (size_t)d),
           *nx = malloc(sizeof(double) * gn * (size_t)d);
    for (int r = 0; r < d; r++)
        for (size_t e = 0; e < gn; e++) {
            double x = tpk_rng_normal(60 + (uint64_t)i,
                                      kind == 1   ? 0
                                      : kind == 2 ? e % (size_t)d
                                                  : (uint64_t)r,
                                      e);
            ref[(size_t)r * gn + e] = kind == 2 && (int)(e % (size_t)d) != r ? 0.0 : (float)x;
        }
    for (size_t e = 0; e < gn; e++) mine[e] = (float)ref[(size_t)me_dp * gn + e];
    for (int lv = 1; lv < d; lv *= 2) {
        for (int r = 0; r < d; r++) {
            const double *a = ref + (size_t)r * gn, *c = ref + (size_t)(r ^ lv) * gn;
            double aa = 0, cc = 0, ac = 0;
            for (size_t e = 0; e < gn; e++) aa += a[e] * a[e], cc += c[e] * c[e], ac += a[e] * c[e];
            for (size_t e = 0; e < gn; e++)
                nx[(size_t)r * gn + e] = (aa > 0 ? 1 - ac / (2 * aa) : 1) * a[e] +
                                         (cc > 0 ? 1 - ac / (2 * cc) : 1) * c[e];
        }
        memcpy(ref, nx, sizeof(double) * gn * (size_t)d);
    }
    for (size_t e = 0; e < gn; e++) want[e] = (float)ref[(size_t)me_dp * gn + e];
    free(ref), free(nx);
}

/* ---- ZeRO-3 ---------------------------------------------------------------------------------- */

typedef struct z3_model {
    tpk_gpt2 g;
    tpk_llama l;
    tpk_lm *lm;
} z3_model;
enum { Z3_B = 2, Z3_S = 6, Z3_V = 61, Z3_L = 4 };
static tpk_status z3_model_init(tpk_ctx *ctx, z3_model *m, bool llama, tpk_recompute rc) {
    memset(m, 0, sizeof *m);
    if (llama) {
        m->lm = &m->l.lm;
        return tpk_llama_init(ctx, &m->l,
                              &(tpk_llama_config){.vocab = Z3_V,
                                                  .positions = 8,
                                                  .layers = Z3_L,
                                                  .hidden = 16,
                                                  .heads = 4,
                                                  .kv_heads = 2,
                                                  .ffn = 24,
                                                  .recompute = rc});
    }
    m->lm = &m->g.lm;
    return tpk_gpt2_init(ctx, &m->g,
                         &(tpk_gpt2_config){.vocab = Z3_V,
                                            .positions = 8,
                                            .layers = Z3_L,
                                            .hidden = 16,
                                            .heads = 4,
                                            .recompute = rc});
}
/* The test's block hook: ZeRO-3's, then the flight recorder read when a block begins: the next
 * block's gather (z3_want elements) must be in flight while this one computes. */
static int z3_inflight, z3_begins, z3_rs_inflight, z3_hsdp_early;
static tpk_status z3_hook(tpk_ctx *ctx, int64_t block, int when, void *user) {
    tpk_zero3 *z = (tpk_zero3 *)user;
    TPK_TRY(tpk_zero3_hook(ctx, block, when, user));
    /* HSDP: the all-reduces across the shard groups begun when the first block's backward begins
       (blocks 2 and up: each one's buffer reused by the block two below) */
    if (block == z->lo && when == TPK_LM_BWD_BEGIN && ctx->zrep)
        z3_hsdp_early = (int)ctx->zrep->stats.calls[TPK_COLL_ALLREDUCE];
    /* sharded gradients: as block i's backward begins, block i + 1's reduce-scatter in flight */
    if (block >= 0 && when == TPK_LM_BWD_BEGIN && z->sgrads && block + 1 < z->lo + z->nu - 1) {
        const tpk__z3_unit *g = &z->u[2 + block - z->lo];
        const tpk_flight_entry *e = tpk__flight_find(tpk__zero_group(ctx), g->greq[0].flight);
        if (g->gstate == 2 && e && e->kind == TPK_COLL_REDUCE_SCATTER &&
            e->state == TPK_FLIGHT_RUNNING && e->elems == g->elems)
            z3_rs_inflight++;
    }
    int64_t next = when == TPK_LM_FWD_BEGIN ? block + 1 : block - 1;
    if (block < 0 || (when != TPK_LM_FWD_BEGIN && when != TPK_LM_BWD_BEGIN) || next < z->lo ||
        next >= z->lo + z->nu - 1)
        return TPK_OK;
    z3_begins++;
    const tpk__z3_unit *u = &z->u[1 + next - z->lo];
    tpk_comm *dg = tpk__zero_group(ctx); /* (HSDP: its shard group) */
    const tpk_flight_entry *e = tpk__flight_find(dg, u->req[0].flight);
    if (u->state == 1 && e && e->kind == TPK_COLL_ALLGATHER && e->state == TPK_FLIGHT_RUNNING &&
        e->elems == u->elems)
        z3_inflight++;
    return TPK_OK;
}

/* The profiler's row `name` of ctx (NULL: none). */
static const tpk__prof_row *z3_row(const tpk_ctx *ctx, const char *name) {
    for (int r = 0; ctx->prof && r < ctx->prof->nrows; r++)
        if (!strcmp(ctx->prof->rows[r].name, name)) return &ctx->prof->rows[r];
    return NULL;
}

/* nopf: tpk_zero3_desc.no_prefetch; zs: HSDP's shard size (tpk_ctx_desc.zero_shard_size; 0: the
 * whole DP group); whole: tpk_zero3_desc.whole_grads; M micro-batches a step */
static void test_zero3(bool llama, tpk_recompute rc, bool keep, tpk_dtype dt, bool nopf, int zs,
                       bool whole, int M) {
    TEST_CASE(
        "ZeRO-3 at DP %d%s, %s, recompute %d%s%s%s, gradients %s, %d micro-batches: 3 steps "
        "equal ZeRO-0 (losses, norms, weights); the bytes held; the all-gathers and "
        "reduce-scatters of a step; the prefetch and the reduce-scatter in flight; the profiler's "
        "all-gather starts and waits",
        np, zs ? " (HSDP: shards of 2)" : "", llama ? "Llama" : "GPT-2", (int)rc,
        keep ? ", blocks kept for the backward" : "", dt == TPK_BF16 ? ", bf16" : "",
        nopf ? ", no prefetch" : "", whole ? "whole" : "sharded", M) {
        tpk_ctx c[2];
        z3_model m[2];
        tpk_adamw o[2];
        tpk_dp_buckets b[2] = {{0}, {0}};
        tpk_zero3 z;
        memset(&z, 0, sizeof z);
        size_t before = 0, data_bytes = 0, grad_bytes = 0;
        for (int k = 0; k < 2; k++) {
            CHECK_OK(&c[k],
                     tpk_ctx_init(&c[k], &(tpk_ctx_desc){.world = &world,
                                                         .tp = 1,
                                                         .seed = 11,
                                                         .dtype = dt,
                                                         .zero_shard_size = k ? zs : 0}));
            CHECK_OK(&c[k], z3_model_init(&c[k], &m[k], llama, rc));
            CHECK_OK(&c[k], tpk_adamw_init(
                                &c[k], &o[k],
                                &(tpk_adamw_desc){.weight_decay = 0.1f, .zero_stage = k ? 3 : 0}));
            tpk_lm_set_grad_ready(m[k].lm, tpk_dp_grad_ready, &b[k]);
        }
        tpk_ctx *x = &c[1];
        CHECK_OK(x, tpk_dp_shard_grads(x, &b[1], &o[1]));
        CHECK_FAILS(x, tpk_zero3_init(x, &z, m[1].lm, &o[0], NULL), TPK_ERR_ARG,
                    "opt: expected an optimizer made with zero_stage 3 (ZeRO-3)");
        CHECK_FAILS(x, tpk_adamw_step(x, &o[1], 1e-2f, 1.0f), TPK_ERR_ARG,
                    "opt: a ZeRO-3 optimizer not linked to its weights' shard");
        before = x->mem, data_bytes = x->params.data.bytes + x->params.data16.bytes;
        grad_bytes = x->params.grad.bytes;
        tpk_zero3_desc zd = {.keep_for_backward = keep, .no_prefetch = nopf, .whole_grads = whole};
        CHECK_OK(x, tpk_zero3_init(x, &z, m[1].lm, &o[1], &zd));
        m[1].lm->block_hook = z3_hook; /* ZeRO-3's, watched */
        size_t n = x->params.numel, most = 0, blocks = 0, rest = 0;
        int d = tpk__dp_group(x)->size, runs = 0; /* (the 1/d scale: DP) */
        tpk_comm *zg = tpk__zero_group(x);         /* the slices' group: DP, or HSDP's shards */
        CHECK(zg->size == (zs ? zs : d), "ZeRO's group of %d ranks, expected %d", zg->size,
              zs ? zs : d);
        for (int64_t i = 0; i < Z3_L; i++) {
            const tpk_block *bl = &m[1].lm->blocks[i];
            const tpk_param *p0 = &x->params.list[bl->p0], *p1 = &x->params.list[bl->p1];
            size_t e = p1->offset + p1->numel - p0->offset;
            most = e > most ? e : most, blocks += e;
        }
        for (int i = 0; i < x->params.n; i++) /* the rest: runs of ids outside the blocks */
            if (i < m[1].lm->blocks[0].p0 || i > m[1].lm->blocks[Z3_L - 1].p1) {
                bool starts = i == 0 || i == m[1].lm->blocks[Z3_L - 1].p1 + 1;
                runs += starts;
            }
        for (int r = 0; r < z.u[0].nruns; r++) rest += z.u[0].b[r] - z.u[0].a[r];
        size_t held = before - x->mem;        /* what ZeRO-3 freed, net */
        size_t each = dt == TPK_BF16 ? 6 : 4; /* a gathered element's bytes: f32 (+ bf16) */
        size_t want = data_bytes - 4 * (o[1].sn ? o[1].sn : 1) - (keep ? 0 : 2 * each * most);
        /* the gradients sharded: the flat buffer freed, two block buffers held and the rest's; a
         * unit's part of the sums: its elements within the slice */
        for (int k = 1; k < z.nu; k++) {
            size_t part = 0, lo, hi;
            for (int r = 0; r < z.u[k].nruns; r++) {
                lo = z.u[k].a[r] > o[1].s0 ? z.u[k].a[r] : o[1].s0;
                hi = z.u[k].b[r] < o[1].s0 + o[1].sn ? z.u[k].b[r] : o[1].s0 + o[1].sn;
                part += hi > lo ? hi - lo : 0;
            }
            CHECK(part == z.u[k].part, "block %d's part of the sums: %zu, expected %zu", k - 1,
                  z.u[k].part, part);
        }
        /* sharded where that holds less than the flat buffer: at DP 2 to 4 for these models (4
         * blocks, the rest a sixth of the weights), not for one of a single block */
        size_t shard_b = 4 * (2 * most + rest);
        bool sg = !whole && zg->size > 1;
        CHECK(z.grad_whole == grad_bytes && z.grad_shard == shard_b &&
                  (!sg || shard_b < grad_bytes),
              "the gradients' buffers: %zu bytes sharded, %zu whole; expected %zu, %zu, the "
              "sharded less",
              z.grad_shard, z.grad_whole, shard_b, grad_bytes);
        if (sg) want += grad_bytes - 4 * 2 * most;
        CHECK(x->params.data.p == NULL && held == want &&
                  o[1].sn == (size_t)tpk_split((int64_t)n, zg->size, zg->rank).size &&
                  z.sgrads == sg && (x->params.grad.p == NULL) == sg,
              "ZeRO-3 at DP %d: %zu bytes fewer held (the whole weights %zu, the shard %zu of %zu "
              "elements, two block buffers of %zu; gradients sharded %d, expected %d), expected "
              "%zu",
              d, held, data_bytes, o[1].sn, n, most, (int)z.sgrads, (int)sg, want);
        tpk_mem_held h; /* the gradients' bytes: 1/D of them (the slice), two blocks and the
                           rest; whole: the flat buffer beside the slice */
        CHECK_OK(x, tpk_mem_held_get(x, &o[1], &z, &h));
        double gw = sg ? 4.0 * ((double)o[1].sn + 2.0 * (double)most + (double)rest)
                       : (double)grad_bytes + (o[1].g ? 4.0 * (double)o[1].sn : 0.0);
        CHECK(h.grads == gw + (double)x->params.scratch.bytes,
              "the gradients' bytes: %.0f, expected %.0f (%zu of %zu elements a slice)", h.grads,
              gw + (double)x->params.scratch.bytes, o[1].sn, n);
        int32_t ids[Z3_B * Z3_S], tg[Z3_B * Z3_S];
        uint64_t gathers = 0; /* the all-gathers of the 3 steps */
        CHECK_OK(x, tpk_profile_start(x));
        for (int step = 0; step < 3; step++) {
            float loss[2];
            double norm[2];
            uint64_t calls = 0, elems = 0, rs0 = z.grad_rs, rse0 = z.grad_rs_elems;
            for (int k = 0; k < 2; k++) {
                tpk_ctx *y = &c[k];
                tpk_comm_stats_reset(tpk__zero_group(y));
                if (y->zrep) tpk_comm_stats_reset(y->zrep);
                z3_inflight = z3_begins = z3_rs_inflight = z3_hsdp_early = 0;
                CHECK_OK(y, tpk_params_zero_grad(y));
                for (int mb = 0; mb < M; mb++) {
                    uint64_t seed = 90 + 2 * (uint64_t)(step * M + mb);
                    for (int t = 0; t < Z3_B * Z3_S; t++) /* each DP rank its own tokens */
                        ids[t] = (int32_t)(Z3_V * tpk_rng_uniform(seed,
                                                                  (uint64_t)tpk__dp_group(y)->rank,
                                                                  (uint64_t)t)) %
                                 Z3_V,
                        tg[t] = (int32_t)(Z3_V * tpk_rng_uniform(seed + 1,
                                                                 (uint64_t)tpk__dp_group(y)->rank,
                                                                 (uint64_t)t)) %
                                Z3_V;
                    float l;
                    CHECK_OK(y, tpk_dp_begin(y, &b[k], mb == M - 1));
                    CHECK_OK(y, tpk_lm_forward(y, m[k].lm, ids, tg, Z3_B, Z3_S, &l));
                    CHECK_OK(y, tpk_lm_backward(y, m[k].lm, 1.0f / (float)M));
                    loss[k] = mb ? loss[k] + l : l;
                }
                calls = tpk__zero_group(y)->stats.calls[TPK_COLL_ALLGATHER];
                elems = tpk__zero_group(y)->stats.elems[TPK_COLL_ALLGATHER];
                CHECK_OK(y,
                         tpk_train_step(y, &o[k], &b[k], 1e-2f, 1.0f, 1.0f / (float)d, &norm[k]));
                /* HSDP: the slice's sums all-reduced across the shard groups: at once after the
                 * backward, or with sharded gradients in a step of one micro-batch each unit's
                 * part (each run's) as its reduce-scatter ends, the first under the backward */
                uint64_t hc = 1, he = o[k].sn;
                if (k && zs && sg && M == 1) {
                    hc = he = 0;
                    for (int q = 0; q < z.nu; q++)
                        for (int r = 0; r < z.u[q].nruns; r++) {
                            size_t lo = z.u[q].a[r] > o[k].s0 ? z.u[q].a[r] : o[k].s0,
                                   hi = z.u[q].b[r] < o[k].s0 + o[k].sn ? z.u[q].b[r]
                                                                        : o[k].s0 + o[k].sn;
                            hc += hi > lo, he += hi > lo ? hi - lo : 0;
                        }
                    int early = 0; /* blocks 2 .. L - 1 (units 3 .. L) holding a part */
                    for (int q = 3; q <= Z3_L; q++) early += z.u[q].part > 0;
                    CHECK(z3_hsdp_early == early,
                          "step %d: %d all-reduces across the shard groups started before the "
                          "first block's backward, expected %d (blocks 2 to %d)",
                          step + 1, z3_hsdp_early, early, Z3_L - 1);
                }
                if (k && zs)
                    CHECK(y->zrep->stats.calls[TPK_COLL_ALLREDUCE] == hc &&
                              y->zrep->stats.elems[TPK_COLL_ALLREDUCE] == he &&
                              y->zrep->stats.calls[TPK_COLL_ALLGATHER] == 0,
                          "step %d: %llu all-reduces of %llu elements across the shard groups, "
                          "expected %llu of %llu",
                          step + 1,
                          (unsigned long long)y->zrep->stats.calls[TPK_COLL_ALLREDUCE],
                          (unsigned long long)y->zrep->stats.elems[TPK_COLL_ALLREDUCE],
                          (unsigned long long)hc, (unsigned long long)he);
            }
            CHECK(fabs(loss[1] - loss[0]) <= 1e-6 * fabs(loss[0]) &&
                      fabs(norm[1] - norm[0]) <= 1e-6 * norm[0],
                  "step %d: loss %.9g, norm %.9g; ZeRO-3 %.9g, %.9g", step + 1, (double)loss[0],
                  norm[0], (double)loss[1], norm[1]);
            /* the schedule: the rest once (its runs), each block in the forward and again in the
             * backward (the last kept; all kept with keep_for_backward); nothing after AdamW */
            uint64_t wc = (uint64_t)(runs + (keep ? Z3_L : 2 * Z3_L - 1)) * (uint64_t)M;
            uint64_t we = rest + (keep ? blocks : 2 * blocks);
            if (!keep) { /* the last block gathered once */
                const tpk_block *bl = &m[1].lm->blocks[Z3_L - 1];
                const tpk_param *p0 = &x->params.list[bl->p0], *p1 = &x->params.list[bl->p1];
                we -= p1->offset + p1->numel - p0->offset;
            }
            we *= (uint64_t)M;
            gathers += calls;
            /* sharded gradients: each unit's reduce-scattered as its backward ends, every
             * micro-batch; the next block's in flight as a block's backward begins */
            uint64_t rc_want = sg ? (uint64_t)(runs + Z3_L) * (uint64_t)M : 0,
                     re_want = sg ? (uint64_t)(rest + blocks) * (uint64_t)M : 0;
            CHECK(z.grad_rs - rs0 == rc_want && z.grad_rs_elems - rse0 == re_want &&
                      z3_rs_inflight == (sg ? (Z3_L - 1) * M : 0),
                  "step %d: %llu gradient reduce-scatters of %llu elements (expected %llu of "
                  "%llu), %d in flight as the block before's backward began (expected %d)",
                  step + 1, (unsigned long long)(z.grad_rs - rs0),
                  (unsigned long long)(z.grad_rs_elems - rse0), (unsigned long long)rc_want,
                  (unsigned long long)re_want, z3_rs_inflight, sg ? (Z3_L - 1) * M : 0);
            CHECK(calls == wc && elems == we,
                  "step %d: %llu all-gathers of %llu elements, expected %llu of %llu", step + 1,
                  (unsigned long long)calls, (unsigned long long)elems, (unsigned long long)wc,
                  (unsigned long long)we);
            int wb = (nopf ? 0 : keep ? Z3_L - 1 : 2 * (Z3_L - 1)) * M;
            CHECK(z3_begins == 2 * (Z3_L - 1) * M && z3_inflight == wb,
                  "step %d: the next block's gather in flight at %d of %d block begins, expected "
                  "%d",
                  step + 1, z3_inflight, z3_begins, wb);
        }
        /* the profiler: each started all-gather waited once, its wait on a row of its own (the
         * reduce-scatters' apart), the time in them within the steps' wall time */
        CHECK_OK(x, tpk_profile_step(x));
        const tpk__prof_row *st = z3_row(x, "dp.allgather (start)"),
                            *wa = z3_row(x, "dp.wait (allgather)"),
                            *wr = z3_row(x, "dp.wait (reduce_scatter)");
        uint64_t rs = tpk__zero_group(x)->stats.calls[TPK_COLL_REDUCE_SCATTER];
        CHECK(st && wa && st->calls == gathers && wa->calls == gathers && st->ms >= 0 &&
                  wa->ms >= 0 && st->ms + wa->ms <= x->prof->wall_ms && !z3_row(x, "dp.wait") &&
                  (d == 1 || (wr && wr->calls >= rs)),
              "the profile of 3 steps: %llu all-gather starts and %llu waits (%.3f + %.3f ms of "
              "%.3f), expected %llu each; %llu reduce-scatter waits (the last step's %llu)",
              st ? (unsigned long long)st->calls : 0ULL, wa ? (unsigned long long)wa->calls : 0ULL,
              st ? st->ms : -1.0, wa ? wa->ms : -1.0, x->prof->wall_ms, (unsigned long long)gathers,
              wr ? (unsigned long long)wr->calls : 0ULL, (unsigned long long)rs);
        tpk_profile_stop(x);
        if (sg) { /* no whole gradient to read: refused by name, not a null pointer */
            double gn;
            float one;
            CHECK_FAILS(x, tpk_grad_norm(x, 1.0f, &gn), TPK_ERR_ARG,
                        "the gradients are sharded over DP (ZeRO-3");
            CHECK_FAILS(x, tpk_param_get_global(x, 0, true, &one), TPK_ERR_ARG,
                        "grad: the gradients are sharded over DP (ZeRO-3");
        }
        CHECK_OK(x, tpk_zero3_gather(x, &z)); /* the whole weights to compare */
        /* Sharded gradients over micro-batches sum each micro-batch over DP, then the micro-
         * batches (ZeRO-0: the reverse): the f32 sums round differently. The keys' bias has a
         * gradient of zero but for rounding (softmax is shift-invariant), which AdamW's
         * m / sqrt(v) turns into whole-size steps of that rounding's sign: 1e-4 relative on
         * c_attn.bias, where the losses and norms above agree within 1e-6. */
        double wtol = sg && M > 1 ? 5e-4 : 1e-6;
        for (int i = 0; i < x->params.n; i++) {
            size_t gn = tpk_param_global_numel(x, i);
            float *a = malloc(gn * 4), *w = malloc(gn * 4);
            CHECK_OK(&c[0], tpk_param_get_global(&c[0], i, false, a));
            CHECK_OK(x, tpk_param_get_global(x, i, false, w));
            CHECK_CLOSE(w, a, gn, wtol, x->params.list[i].name);
            free(a), free(w);
        }
        CHECK_OK(x, tpk_zero3_shard(x, &z));
        CHECK_FAILS(x, tpk_zero3_shard(x, &z), TPK_ERR_ARG,
                    "ctx->params: the weights are not whole (tpk_zero3_gather first)");
        CHECK_FAILS(x, tpk_zero3_hook(x, Z3_L, TPK_LM_FWD_BEGIN, &z), TPK_ERR_ARG,
                    "block: expected -1 or 0..3, got 4");
        CHECK_FAILS(x, tpk_zero3_hook(x, 0, 9, &z), TPK_ERR_ARG,
                    "when: expected TPK_LM_FWD_BEGIN..BWD_END, got 9");
        tpk_zero3_destroy(x, &z);
        for (int k = 0; k < 2; k++) {
            tpk_adamw_destroy(&c[k], &o[k]), tpk_dp_destroy(&b[k]);
            tpk_lm_destroy(&c[k], m[k].lm);
            tpk_ctx_destroy(&c[k]);
        }
    }
}

/* ZeRO-3 with pipeline stages (tpk_zero3_init_pipe) at PP 2 x DP 2: a GPT-2 of 4 blocks a chunk
 * over 1F1B or the interleaved schedule (V chunks a stage, M micro-batches, each DP rank its own
 * tokens), 3 steps of tpk_model_train_step against the same stages at ZeRO-0 — the losses and norms
 * within 1e-6, every weight after them (within 1e-5) — and the all-gathers of each step on the DP
 * group: the rest of the stage once (its runs of ids outside every chunk's blocks), each block in
 * each micro-batch's forward and backward. */
enum { Z3P_MAXM = 4 };
static void test_zero3_pipe(tpk_pipe_kind kind, int V, int M, tpk_recompute rc, bool keep) {
    TEST_CASE("ZeRO-3 at PP 2 x DP 2, GPT-2, %s (%d chunks a stage) over %d micro-batches, "
              "recompute %d%s: 3 steps equal ZeRO-0 with the same stages (losses, norms, "
              "weights); the all-gathers of a step",
              kind == TPK_PIPE_INTERLEAVED ? "interleaved" : "1F1B", V, M, (int)rc,
              keep ? ", blocks kept for the backward" : "") {
        tpk_ctx c[2];
        tpk_pipe_model pm[2];
        tpk_adamw o[2];
        tpk_dp_buckets b[2] = {{0}, {0}};
        tpk_zero3 z;
        memset(&z, 0, sizeof z);
        tpk_model_config mc;
        memset(&mc, 0, sizeof mc);
        mc.arch = TPK_ARCH_GPT2;
        mc.gpt2 = (tpk_gpt2_config){.vocab = Z3_V,
                                    .positions = 8,
                                    .layers = 4 * V,
                                    .hidden = 16,
                                    .heads = 4,
                                    .recompute = rc};
        for (int k = 0; k < 2; k++) {
            tpk_ctx_desc cd = {.world = &world, .tp = 1, .pp = 2, .seed = 11};
            CHECK_OK(&c[k], tpk_ctx_init(&c[k], &cd));
            CHECK_OK(&c[k], tpk_pipe_model_init(&c[k], &pm[k], &mc, kind, M, V, NULL, NULL, 0, 0));
            CHECK_OK(&c[k], tpk_adamw_init(
                                &c[k], &o[k],
                                &(tpk_adamw_desc){.weight_decay = 0.1f, .zero_stage = k ? 3 : 0}));
            tpk_pipe_model_set_dp(&pm[k], &b[k]);
        }
        tpk_ctx *x = &c[1];
        CHECK_OK(x, tpk_dp_shard_grads(x, &b[1], &o[1]));
        CHECK_FAILS(x, tpk_zero3_init(x, &z, tpk_model_lm(&pm[1].copy[0]), &o[1], NULL),
                    TPK_ERR_ARG, "tpk_zero3_init_pipe for the stage");
        CHECK_OK(x, tpk_zero3_init_pipe(x, &z, &pm[1], &o[1],
                                        &(tpk_zero3_desc){.keep_for_backward = keep}));
        int64_t L = 0; /* the stage's blocks, over its chunks */
        size_t blocks = 0, rest = 0;
        int runs = 0;
        bool *in = calloc((size_t)x->params.n, sizeof(bool)); /* a block's parameter */
        for (int ch = 0; ch < V; ch++) {
            const tpk_lm *lm = tpk_model_lm(&pm[1].copy[ch * pm[1].K]);
            for (int64_t i = lm->lo; i < lm->hi; i++, L++) {
                const tpk_param *a = &x->params.list[lm->blocks[i].p0],
                                *e = &x->params.list[lm->blocks[i].p1];
                blocks += e->offset + e->numel - a->offset;
                for (int q = lm->blocks[i].p0; q <= lm->blocks[i].p1; q++) in[q] = true;
            }
        }
        for (int i = 0; i < x->params.n; i++) /* the rest: the runs of ids outside the blocks */
            if (!in[i]) runs += i == 0 || in[i - 1], rest += x->params.list[i].numel;
        free(in);
        int64_t T = Z3_B * Z3_S;
        int32_t ids[Z3P_MAXM * Z3_B * Z3_S], tg[Z3P_MAXM * Z3_B * Z3_S];
        for (int step = 0; step < 3; step++) {
            double loss[2], norm[2];
            uint64_t calls = 0, elems = 0;
            for (int k = 0; k < 2; k++) {
                tpk_ctx *y = &c[k];
                int dr = tpk__dp_group(y)->rank;
                for (int64_t t = 0; t < M * T; t++) /* each DP rank its own tokens */
                    ids[t] = (int32_t)(Z3_V * tpk_rng_uniform(70 + (uint64_t)step, (uint64_t)dr,
                                                              (uint64_t)t)) %
                             Z3_V,
                    tg[t] = (int32_t)(Z3_V * tpk_rng_uniform(71 + (uint64_t)step, (uint64_t)dr,
                                                             (uint64_t)t)) %
                            Z3_V;
                tpk_comm_stats_reset(tpk__dp_group(y));
                CHECK_OK(y, tpk_model_train_step(y, NULL, &pm[k], &o[k], &b[k], ids, tg, Z3_B, Z3_S,
                                                 M, 1.0f / (float)M / 2, (uint64_t)step, 1e-2f,
                                                 100.0f, &norm[k])); /* (no clipping) */
                calls = tpk__dp_group(y)->stats.calls[TPK_COLL_ALLGATHER];
                elems = tpk__dp_group(y)->stats.elems[TPK_COLL_ALLGATHER];
                CHECK_OK(y, tpk_pipe_model_loss_read(y, &pm[k], &loss[k], NULL));
            }
            CHECK(fabs(loss[1] - loss[0]) <= 1e-6 * fabs(loss[0]) &&
                      fabs(norm[1] - norm[0]) <= 1e-6 * norm[0],
                  "step %d: loss %.9g, norm %.9g; ZeRO-3 %.9g, %.9g", step + 1, loss[0], norm[0],
                  loss[1], norm[1]);
            /* the rest once a step; without keep each block in every micro-batch's forward and
             * backward; with keep a block stays from a forward to the next backward that ends */
            if (!keep) {
                uint64_t wc = (uint64_t)runs + 2 * (uint64_t)M * (uint64_t)L;
                uint64_t we = rest + 2 * (size_t)M * blocks;
                CHECK(calls == wc && elems == we,
                      "stage %d, step %d: %llu all-gathers of %llu elements, expected %llu of %llu",
                      x->pp.rank, step + 1, (unsigned long long)calls, (unsigned long long)elems,
                      (unsigned long long)wc, (unsigned long long)we);
            }
        }
        CHECK_OK(x, tpk_zero3_gather(x, &z)); /* the whole weights to compare */
        for (int i = 0; i < x->params.n; i++) {
            size_t gn = tpk_param_global_numel(x, i);
            float *a = malloc(gn * 4), *w = malloc(gn * 4);
            CHECK_OK(&c[0], tpk_param_get_global(&c[0], i, false, a));
            CHECK_OK(x, tpk_param_get_global(x, i, false, w));
            /* the tied embedding's two copies are summed after their DP reduction at ZeRO-0 and
             * before it at ZeRO-2 and 3, so from step 2 on the weights differ by ulps, which AdamW
             * scales up where the gradient is tiny (ZeRO-2 at the same stages: 1.4e-6), most on
             * the key bias, whose gradient is zero but for rounding (7e-5) */
            const char *nm = x->params.list[i].name;
            CHECK_CLOSE(w, a, gn, strstr(nm, "c_attn.bias") ? 1e-4 : 1e-5, nm);
            free(a), free(w);
        }
        CHECK_OK(x, tpk_zero3_shard(x, &z));
        CHECK_FAILS(x, tpk_zero3_hook(x, x->pp.rank ? 0 : 4 * V - 1, TPK_LM_FWD_BEGIN, &z),
                    TPK_ERR_ARG, "block: expected -1 or");
        tpk_zero3_destroy(x, &z);
        for (int k = 0; k < 2; k++) {
            tpk_adamw_destroy(&c[k], &o[k]), tpk_dp_destroy(&b[k]);
            tpk_pipe_model_destroy(&c[k], &pm[k]);
            tpk_ctx_destroy(&c[k]);
        }
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;

    TEST_CASE(
        "AdamW in a bf16 context writes the bf16 weight copy in the same pass when it is current "
        "(else marks it stale); "
        "the copy equals bf16 of the master weights, as a remake gives it") {
        tpk_ctx ctx;
        CHECK_OK(&ctx,
                 tpk_ctx_init(&ctx, &(tpk_ctx_desc){
                                        .world = &world, .tp = np, .seed = 5, .dtype = TPK_BF16}));
        int ids[NP];
        add_params(&ctx, ids);
        float *g[NP];
        for (int i = 0; i < NP; i++) g[i] = malloc(tpk_param_global_numel(&ctx, i) * 4);
        tpk_adamw opt;
        CHECK_OK(&ctx, tpk_adamw_init(&ctx, &opt, &(tpk_adamw_desc){.weight_decay = 0.1f}));
        size_t n = ctx.params.numel;
        uint16_t *copy = malloc(2 * (n ? n : 1));
        for (int s = 0; s < 3; s++) {
            bool current = s != 1; /* step 2 after tpk_params_updated: the copy is stale, the step
                                      leaves it so */
            CHECK_OK(&ctx, tpk__params_fresh(&ctx)); /* as a forward does */
            if (!current) tpk_params_updated(&ctx);
            set_grads(&ctx, 20 + s, g);
            CHECK_OK(&ctx, tpk_adamw_step(&ctx, &opt, 1e-2f, 1.0f));
            CHECK(ctx.params.stale16 == !current, "step %d: the bf16 copy is %s, expected %s",
                  s + 1, ctx.params.stale16 ? "stale" : "current", current ? "current" : "stale");
            if (!current) continue;
            memcpy(copy, ctx.params.data16.p, 2 * n);
            int bad = 0;
            for (size_t k = 0; k < n; k++)
                bad += copy[k] != tpk_f32_to_bf16(((const float *)ctx.params.data.p)[k]);
            CHECK(
                bad == 0,
                "step %d: %d of %zu elements of the bf16 copy differ from bf16 of the master "
                "weights",
                s + 1, bad, n);
        }
        free(copy);
        tpk_adamw_destroy(&ctx, &opt);
        for (int i = 0; i < NP; i++) free(g[i]);
        tpk_ctx_destroy(&ctx);
    }

    TEST_CASE(
        "AdamW over sharded and replicated parameters equals a double reference (3 steps, decay "
        "mask, grad_scale)") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3}));
        int ids[NP];
        add_params(&ctx, ids);
        float *w[NP], *g[NP], *got = malloc(64 * sizeof(float));
        double *m[NP], *v[NP], *ref[NP];
        for (int i = 0; i < NP; i++) {
            size_t gn = tpk_param_global_numel(&ctx, i);
            w[i] = malloc(gn * 4), g[i] = malloc(gn * 4), m[i] = calloc(gn, 8),
            v[i] = calloc(gn, 8), ref[i] = malloc(gn * 8);
            CHECK_OK(&ctx, tpk_param_get_global(&ctx, i, false, w[i]));
            for (size_t k = 0; k < gn; k++) ref[i][k] = w[i][k];
        }
        tpk_adamw opt;
        CHECK_OK(&ctx,
                 tpk_adamw_init(&ctx, &opt,
                                &(tpk_adamw_desc){
                                    .b1 = 0.8f, .b2 = 0.9f, .eps = 1e-6f, .weight_decay = 0.1f}));
        const float lr[3] = {1e-2f, 5e-3f, 2e-3f}, scale[3] = {1.0f, 0.5f, 0.25f};
        for (int s = 0; s < 3; s++) {
            set_grads(&ctx, 10 + s, g);
            CHECK_OK(&ctx, tpk_adamw_step(&ctx, &opt, lr[s], scale[s]));
            double c1 = 1 / (1 - pow(0.8, s + 1)), c2 = 1 / (1 - pow(0.9, s + 1));
            for (int i = 0; i < NP; i++)
                for (size_t k = 0; k < tpk_param_global_numel(&ctx, i); k++) {
                    double gi = (double)g[i][k] * scale[s];
                    m[i][k] = 0.8 * m[i][k] + 0.2 * gi, v[i][k] = 0.9 * v[i][k] + 0.1 * gi * gi;
                    double wd = ctx.params.list[i].decay ? 0.1 : 0.0;
                    ref[i][k] -=
                        lr[s] * (m[i][k] * c1 / (sqrt(v[i][k] * c2) + 1e-6) + wd * ref[i][k]);
                }
        }
        CHECK(opt.step == 3, "step %lld", (long long)opt.step);
        double err = 0, err_m = 0;
        for (int i = 0; i < NP; i++) {
            size_t gn = tpk_param_global_numel(&ctx, i);
            test_poison(got, 64);
            CHECK_OK(&ctx, tpk_param_get_global(&ctx, i, false, got));
            for (size_t k = 0; k < gn; k++)
                err = fmax(err, fabs(got[k] - ref[i][k]) / (fabs(ref[i][k]) + 1e-3));
            test_poison(got, 64);
            /* the moments are laid out like the parameters */
            CHECK_OK(&ctx, tpk_param_gather(&ctx, i, opt.m, got));
            for (size_t k = 0; k < gn; k++)
                err_m = fmax(err_m, fabs(got[k] - m[i][k]) / (fabs(m[i][k]) + 1e-3));
        }
        CHECK(err < 1e-5 && err_m < 1e-5, "relative errors: weights %g, first moments %g", err,
              err_m);
        CHECK(ctx.params.stale16, "the step did not mark the weights updated");
        /* a parameter registered after the optimizer: refused */
        int late;
        CHECK_OK(&ctx,
                 tpk__param_add(&ctx, "late", 1, 3, 0, TPK_R, TPK_INIT_ZEROS, 0, false, &late));
        CHECK_FAILS(&ctx, tpk_adamw_step(&ctx, &opt, 1e-3f, 1.0f), TPK_ERR_ARG,
                    "register the model first");
        tpk_adamw bad;
        CHECK_FAILS(&ctx, tpk_adamw_init(&ctx, &bad, &(tpk_adamw_desc){.b1 = 1.0f}), TPK_ERR_ARG,
                    "desc->b1, b2: expected in [0, 1)");
        CHECK_FAILS(&ctx, tpk_adamw_step(&ctx, NULL, 1e-3f, 1.0f), TPK_ERR_ARG, "opt:");
        tpk_adamw_destroy(&ctx, &opt);
        for (int i = 0; i < NP; i++) free(w[i]), free(g[i]), free(m[i]), free(v[i]), free(ref[i]);
        free(got);
        tpk_ctx_destroy(&ctx);
    }

    TEST_CASE(
        "gradient norm at t = ranks equals the unsharded norm (replicated parameters once); "
        "clipping factor") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        int ids[NP];
        add_params(&ctx, ids);
        float *g[NP];
        double want = 0;
        for (int i = 0; i < NP; i++) g[i] = malloc(tpk_param_global_numel(&ctx, i) * 4);
        set_grads(&ctx, 77, g);
        for (int i = 0; i < NP; i++)
            for (size_t k = 0; k < tpk_param_global_numel(&ctx, i); k++)
                want += (double)g[i][k] * g[i][k];
        want = sqrt(want) * 0.5;
        double norm = -1;
        CHECK_OK(&ctx, tpk_grad_norm(&ctx, 0.5f, &norm));
        CHECK(fabs(norm - want) <= 1e-12 * want, "norm %.17g, unsharded %.17g", norm, want);
        CHECK(tpk_clip_factor(10.0, 1.0f) == 0.1f && tpk_clip_factor(0.5, 1.0f) == 1.0f &&
                  tpk_clip_factor(10.0, 0.0f) == 1.0f,
              "clip factors");
        CHECK_FAILS(&ctx, tpk_grad_norm(&ctx, 1.0f, NULL), TPK_ERR_ARG, "norm: NULL");
        for (int i = 0; i < NP; i++) free(g[i]);
        tpk_ctx_destroy(&ctx);
    }

    TEST_CASE(
        "tpk_train_step at t = %d clips from the sum of squares left in backend memory: bit for "
        "bit tpk_grad_norm, tpk_clip_factor and "
        "tpk_adamw_step (3 steps, clipped and not)",
        np) {
        tpk_ctx c[2];
        tpk_adamw o[2];
        tpk_dp_buckets b[2] = {{0}, {0}};
        int ids[NP];
        float *g[NP];
        for (int z = 0; z < 2; z++) {
            CHECK_OK(&c[z],
                     tpk_ctx_init(&c[z], &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3}));
            add_params(&c[z], ids);
            CHECK_OK(&c[z], tpk_adamw_init(&c[z], &o[z], &(tpk_adamw_desc){.weight_decay = 0.1f}));
        }
        for (int i = 0; i < NP; i++) g[i] = malloc(tpk_param_global_numel(&c[0], i) * 4);
        const float clip[3] = {1.0f, 100.0f, 0.0f}; /* the norm is about 4: clipped, within, no
                                                       clipping */
        for (int step = 0; step < 3; step++) {
            double n0 = -1, n1 = -2;
            set_grads(&c[0], 90 + (uint64_t)step, g), set_grads(&c[1], 90 + (uint64_t)step, g);
            CHECK_OK(&c[0], tpk_grad_norm(&c[0], 0.5f, &n0));
            CHECK_OK(&c[0],
                     tpk_adamw_step(&c[0], &o[0], 1e-2f, 0.5f * tpk_clip_factor(n0, clip[step])));
            CHECK_OK(&c[1], tpk_train_step(&c[1], &o[1], &b[1], 1e-2f, clip[step], 0.5f,
                                           step == 1 ? &n1 : NULL));
            if (step != 1) CHECK_OK(&c[1], tpk_train_norm_read(&c[1], 0.5f, &n1));
            CHECK(n0 == n1 && (step || n0 > clip[0]),
                  "step %d: norm %.17g, from tpk_train_step %.17g", step, n0, n1);
        }
        CHECK(!memcmp(c[0].params.data.p, c[1].params.data.p, c[0].params.numel * 4),
              "the weights differ after 3 steps");
        CHECK(!memcmp(o[0].m, o[1].m, o[0].sn * 4) && !memcmp(o[0].v, o[1].v, o[0].sn * 4),
              "the moments differ after 3 steps");
        for (int i = 0; i < NP; i++) free(g[i]);
        for (int z = 0; z < 2; z++)
            tpk_adamw_destroy(&c[z], &o[z]), tpk_dp_destroy(&b[z]), tpk_ctx_destroy(&c[z]);
    }

    TEST_CASE("learning-rate schedules: warm-up, cosine, linear, constant") {
        tpk_lr_schedule c = {TPK_LR_COSINE, 1e-3f, 0.1f, 10, 110}, l = c, k = c;
        l.kind = TPK_LR_LINEAR, k.kind = TPK_LR_CONSTANT;
        CHECK(fabsf(tpk_lr_at(&c, 0) - 1e-4f) < 1e-9f && fabsf(tpk_lr_at(&c, 9) - 1e-3f) < 1e-9f,
              "warm-up");
        CHECK(fabsf(tpk_lr_at(&c, 10) - 1e-3f) < 1e-9f, "cosine start %g",
              (double)tpk_lr_at(&c, 10));
        CHECK(fabsf(tpk_lr_at(&c, 60) - 5.5e-4f) < 1e-9f,
              "cosine middle %g (expected the mean of lr and lr * 0.1)", (double)tpk_lr_at(&c, 60));
        CHECK(fabsf(tpk_lr_at(&c, 110) - 1e-4f) < 1e-9f &&
                  fabsf(tpk_lr_at(&c, 500) - 1e-4f) < 1e-9f,
              "cosine end");
        CHECK(fabsf(tpk_lr_at(&l, 35) - (float)(1e-4 + 9e-4 * 0.75)) < 1e-9f,
              "linear at a quarter %g", (double)tpk_lr_at(&l, 35));
        CHECK(tpk_lr_at(&k, 50) == 1e-3f && fabsf(tpk_lr_at(&k, 5) - 6e-4f) < 1e-9f, "constant");
    }

    TEST_CASE(
        "DP buckets from the backward hook: sums over %d DP ranks, no communication on earlier "
        "micro-steps",
        np) {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = 1}));
        int ids[NP];
        add_params(&ctx, ids);
        size_t n = ctx.params.numel;
        float *mine = calloc(n, 4), *want = calloc(n, 4), *got = malloc(n * 4);
        for (int r = 0; r < np; r++) /* the parameters' elements (the gaps between them stay zero,
                                        as in training) */
            for (int i = 0; i < NP; i++)
                for (size_t k = ctx.params.list[i].offset;
                     k < ctx.params.list[i].offset + ctx.params.list[i].numel; k++) {
                    float x = tpk_rng_normal(5, (uint64_t)r, k);
                    want[k] += x;
                    if (r == me) mine[k] = x;
                }
        memcpy(ctx.params.grad.p, mine, n * 4);
        tpk_dp_buckets b = {0};
        tpk_comm_stats_reset(&ctx.dp);
        CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, false));
        CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, 0, NP - 1, &b));
        CHECK(ctx.dp.stats.calls[TPK_COLL_ALLREDUCE] == 0 &&
                  !memcmp(ctx.params.grad.p, mine, n * 4),
              "a micro-step that is not the last communicated");
        CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, true));
        CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, 2, 3, &b)); /* buckets in the backward's order: the
                                                              last parameters first */
        CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, 0, 1, &b));
        CHECK_FAILS(&ctx, tpk_dp_begin(&ctx, &b, true), TPK_ERR_ARG, "still running");
        CHECK_OK(&ctx, tpk_dp_finish(&ctx, &b));
        memcpy(got, ctx.params.grad.p, n * 4);
        CHECK_CLOSE(got, want, n, 1e-6, "DP-reduced gradients");
        CHECK(ctx.dp.stats.calls[TPK_COLL_ALLREDUCE] == (np > 1 ? 2u : 0u), "%llu all-reduces",
              (unsigned long long)ctx.dp.stats.calls[TPK_COLL_ALLREDUCE]);
        CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, true));
        CHECK_FAILS(&ctx, tpk_dp_grad_ready(&ctx, 3, 1, &b), TPK_ERR_ARG,
                    "first, last: expected 0 <= first <= last < 4, got 3, 1");
        CHECK_FAILS(&ctx, tpk_dp_grad_ready(&ctx, 0, 1, NULL), TPK_ERR_ARG,
                    "user: expected the tpk_dp_buckets");
        CHECK_OK(&ctx, tpk_dp_grad_ready_all(&ctx, &b));
        CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG, /* the refusal is kept */
                    "refused, the reduction is not whole: tpk_dp_grad_ready: first, last");
        tpk_dp_destroy(&b);
        free(mine), free(want), free(got);
        tpk_ctx_destroy(&ctx);
    }
    for (int tp = 1; tp <= 2; tp++) {
        if (np % tp) continue;
        TEST_CASE(
            "ZeRO-1 at DP %d x TP %d: 5 steps of tpk_train_step equal plain DP (parameters, norms, "
            "moments); state 1/dp; saved and loaded",
            np / tp, tp) {
            tpk_ctx c[2];
            tpk_adamw o[2];
            tpk_dp_buckets b[2] = {{0}, {0}};
            double norm[2][5];
            int ids[NP];
            for (int z = 0; z < 2; z++) {
                CHECK_OK(&c[z], tpk_ctx_init(
                                    &c[z], &(tpk_ctx_desc){.world = &world, .tp = tp, .seed = 3}));
                add_params(&c[z], ids);
                CHECK_OK(&c[z],
                         tpk_adamw_init(&c[z], &o[z],
                                        &(tpk_adamw_desc){.weight_decay = 0.1f, .zero = z == 1}));
            }
            size_t n = c[0].params.numel;
            int d = c[1].dp.size;
            tpk_range sl = tpk_split((int64_t)n, d, c[1].dp.rank);
            CHECK(o[1].s0 == (size_t)sl.off && o[1].sn == (size_t)sl.size &&
                      o[1].sn <= (n + (size_t)d - 1) / (size_t)d && o[0].sn == n,
                  "ZeRO-1 keeps %zu of %zu elements' moments at DP rank %d of %d", o[1].sn, n,
                  c[1].dp.rank, d);
            float *g = malloc(n * 4);
            for (int step = 0; step < 5; step++)
                for (int z = 0; z < 2; z++) {
                    for (int i = 0; i < NP; i++) { /* each DP rank its own gradient, the same global
                                                      tensor on every TP rank */
                        size_t gn = tpk_param_global_numel(&c[z], i);
                        float *gg = malloc(gn * 4);
                        for (size_t k = 0; k < gn; k++)
                            gg[k] = tpk_rng_normal(40 + (uint64_t)step,
                                                   (uint64_t)(c[z].dp.rank * 16 + i), k);
                        CHECK_OK(&c[z],
                                 tpk_param_scatter(&c[z], i, gg, (float *)c[z].params.grad.p));
                        free(gg);
                    }
                    tpk_comm_stats_reset(&c[z].dp);
                    CHECK_OK(&c[z], tpk_dp_begin(&c[z], &b[z], z == 0));
                    CHECK_OK(
                        &c[z],
                        tpk_dp_grad_ready(
                            &c[z], 0, NP - 1,
                            &b[z])); /* plain: the whole buffer in one bucket; ZeRO-1: nothing */
                    CHECK_OK(&c[z], tpk_train_step(&c[z], &o[z], &b[z], 1e-2f, 0.5f,
                                                   1.0f / (float)d, &norm[z][step]));
                    if (z == 1 && d > 1)
                        CHECK(
                            c[1].dp.stats.calls[TPK_COLL_REDUCE_SCATTER] == 1 &&
                                c[1].dp.stats.calls[TPK_COLL_ALLGATHER] == 1 &&
                                c[1].dp.stats.calls[TPK_COLL_ALLREDUCE] == 1 &&
                                c[1].dp.stats.elems[TPK_COLL_REDUCE_SCATTER] == n,
                            "ZeRO-1 step: %llu reduce-scatters, %llu all-gathers, %llu all-reduces "
                            "(the norm)",
                            (unsigned long long)c[1].dp.stats.calls[TPK_COLL_REDUCE_SCATTER],
                            (unsigned long long)c[1].dp.stats.calls[TPK_COLL_ALLGATHER],
                            (unsigned long long)c[1].dp.stats.calls[TPK_COLL_ALLREDUCE]);
                }
            for (int step = 0; step < 5; step++)
                CHECK(fabs(norm[0][step] - norm[1][step]) <= 1e-6 * norm[0][step],
                      "step %d: norm %.9g, ZeRO-1 %.9g", step, norm[0][step], norm[1][step]);
            for (int i = 0; i < NP; i++) {
                size_t gn = tpk_param_global_numel(&c[0], i);
                float *a = malloc(gn * 4), *z = malloc(gn * 4);
                CHECK_OK(&c[0], tpk_param_get_global(&c[0], i, false, a));
                CHECK_OK(&c[1], tpk_param_get_global(&c[1], i, false, z));
                CHECK_CLOSE(z, a, gn, 1e-6, "parameter after 5 ZeRO-1 steps");
                free(a), free(z);
            }
            /* the moments: saved whole from ZeRO-1, loaded into a plain optimizer and into
             * ZeRO-1 */
            char dir[128];
            snprintf(dir, sizeof dir, "build/tests/zero_np%d_tp%d", np, tp);
            CHECK_OK(&c[1], tpk_ckpt_save(&c[1], &o[1], dir,
                                          &(tpk_ckpt_save_desc){.step = o[1].step}));
            tpk_adamw back[2];
            for (int z = 0; z < 2; z++) {
                CHECK_OK(&c[z], tpk_adamw_init(&c[z], &back[z], &(tpk_adamw_desc){.zero = z == 1}));
                CHECK_OK(&c[z], tpk_ckpt_load(&c[z], &back[z], dir, NULL, NULL));
                CHECK(back[z].step == 5, "step %lld", (long long)back[z].step);
            }
            float *m0 = malloc(n * 4), *m1 = malloc(n * 4), *l1 = malloc(n * 4);
            memcpy(m0, o[0].m, n * 4);
            memcpy(m1, back[0].m, n * 4);
            CHECK_CLOSE(m1, m0, n, 1e-6, "first moments saved under ZeRO-1, loaded whole");
            memcpy(l1, back[1].m, back[1].sn * 4);
            CHECK(!memcmp(l1, (const float *)o[1].m, o[1].sn * 4),
                  "ZeRO-1 slice of the first moments after save and load");
            free(m0), free(m1), free(l1), free(g);
            for (int z = 0; z < 2; z++)
                tpk_adamw_destroy(&c[z], &back[z]), tpk_adamw_destroy(&c[z], &o[z]),
                    tpk_dp_destroy(&b[z]), tpk_ctx_destroy(&c[z]);
        }
    }
    for (int tp = 1; tp <= 2; tp++) {
        if (np % tp) continue;
        TEST_CASE(
            "ZeRO-2 at DP %d x TP %d: 4 steps x 2 micro-batches equal ZeRO-0 (weights, norms); "
            "slice 1/dp; its reduce-scatters; protocol checked; saved and loaded",
            np / tp, tp) {
            tpk_ctx c[2];
            tpk_adamw o[2];
            tpk_dp_buckets b[2] = {{0}, {0}};
            double norm[2][4];
            int ids[NP];
            size_t held[2];
            for (int z = 0; z < 2; z++) {
                CHECK_OK(&c[z], tpk_ctx_init(
                                    &c[z], &(tpk_ctx_desc){.world = &world, .tp = tp, .seed = 5}));
                add_params(&c[z], ids);
                c[z].params.list[1].tp_partial_grad = true; /* b: each TP rank a partial sum */
                CHECK_OK(&c[z], tpk_params_trim(&c[z])); /* (what tpk_adamw_init frees first) */
                held[z] = c[z].mem;
                CHECK_OK(&c[z], tpk_adamw_init(&c[z], &o[z],
                                               &(tpk_adamw_desc){.weight_decay = 0.1f,
                                                                 .zero_stage = z ? 2 : 0}));
                held[z] = c[z].mem - held[z];
                if (z) CHECK_OK(&c[z], tpk_dp_shard_grads(&c[z], &b[z], &o[z]));
            }
            size_t n = c[0].params.numel;
            int d = c[1].dp.size;
            tpk_range sl = tpk_split((int64_t)n, d, c[1].dp.rank);
            CHECK(o[1].s0 == (size_t)sl.off && o[1].sn == (size_t)sl.size && o[1].stage == 2 &&
                      (d > 1) == (o[1].g != NULL) && held[0] == 8 * n &&
                      held[1] == (d > 1 ? 12 : 8) * (o[1].sn ? o[1].sn : 1),
                  "ZeRO-2 holds the moments and the reduced gradient of %zu of %zu elements at DP "
                  "rank %d of %d (%zu bytes; ZeRO-0 %zu)",
                  o[1].sn, n, c[1].dp.rank, d, held[1], held[0]);
            float *tmp = malloc(n * 4);
            for (int step = 0; step < 4; step++)
                for (int z = 0; z < 2; z++) {
                    tpk_ctx *x = &c[z];
                    float *g = (float *)x->params.grad.p;
                    CHECK_OK(x, tpk_params_zero_grad(x));
                    if (o[z].g) test_poison(o[z].g, o[z].sn); /* every element written each step */
                    tpk_comm_stats_reset(&x->dp);
                    for (int mb = 0; mb < 2; mb++) {
                        CHECK_OK(x, tpk_dp_begin(x, &b[z], mb == 1));
                        /* the backward: the parameters' gradients added last first, each range
                         * reported once final (the last micro-batch's ranges split around the
                         * deferred b) */
                        static const int first[2][3] = {{2, 0, -1}, {3, 1, 0}},
                                         last[2][3] = {{3, 1, -1}, {3, 2, 0}};
                        for (int r = 0; r < 3 && first[mb][r] >= 0; r++) {
                            for (int i = first[mb][r]; i <= last[mb][r]; i++) {
                                /* each DP rank its own gradient; b's differs on each TP rank too */
                                size_t gn = tpk_param_global_numel(x, i);
                                float *gg = malloc(gn * 4);
                                uint64_t who = (uint64_t)(x->dp.rank * 16 + i) +
                                               (i == 1 ? 256 * (uint64_t)x->tp.rank : 0);
                                for (size_t k = 0; k < gn; k++)
                                    gg[k] = tpk_rng_normal(70 + (uint64_t)(2 * step + mb), who, k);
                                memset(tmp, 0, n * 4);
                                CHECK_OK(x, tpk_param_scatter(x, i, gg, tmp));
                                const tpk_param *p = &x->params.list[i];
                                for (size_t k = p->offset; k < p->offset + p->numel; k++)
                                    g[k] += tmp[k];
                                free(gg);
                            }
                            CHECK_OK(x, tpk_dp_grad_ready(x, first[mb][r], last[mb][r], &b[z]));
                        }
                        if (mb == 0)
                            CHECK(x->dp.stats.calls[TPK_COLL_REDUCE_SCATTER] +
                                          x->dp.stats.calls[TPK_COLL_ALLREDUCE] ==
                                      0,
                                  "a micro-batch that is not the last communicated over DP");
                    }
                    CHECK_OK(x, tpk_train_step(x, &o[z], &b[z], 1e-2f, 0.5f, 1.0f / (float)d,
                                               &norm[z][step]));
                    /* ZeRO-2: a reduce-scatter per run of the last micro-batch's reports (e; w;
                     * b, or b and g at TP 1 where nothing is deferred ... in id order: 3; 1-2 or
                     * 2; 0), b's after the step's TP sum at TP 2; one all-gather; the norm */
                    if (z == 1 && d > 1)
                        CHECK(x->dp.stats.calls[TPK_COLL_REDUCE_SCATTER] == (tp > 1 ? 4u : 3u) &&
                                  x->dp.stats.calls[TPK_COLL_ALLGATHER] == 1 &&
                                  x->dp.stats.calls[TPK_COLL_ALLREDUCE] == 1 &&
                                  x->dp.stats.elems[TPK_COLL_REDUCE_SCATTER] <= n,
                              "ZeRO-2 step: %llu reduce-scatters (%llu elements of %zu), %llu "
                              "all-gathers, %llu all-reduces (the norm)",
                              (unsigned long long)x->dp.stats.calls[TPK_COLL_REDUCE_SCATTER],
                              (unsigned long long)x->dp.stats.elems[TPK_COLL_REDUCE_SCATTER], n,
                              (unsigned long long)x->dp.stats.calls[TPK_COLL_ALLGATHER],
                              (unsigned long long)x->dp.stats.calls[TPK_COLL_ALLREDUCE]);
                }
            for (int step = 0; step < 4; step++)
                CHECK(fabs(norm[0][step] - norm[1][step]) <= 1e-6 * norm[0][step],
                      "step %d: norm %.9g, ZeRO-2 %.9g", step, norm[0][step], norm[1][step]);
            for (int i = 0; i < NP; i++) {
                size_t gn = tpk_param_global_numel(&c[0], i);
                float *a = malloc(gn * 4), *z = malloc(gn * 4);
                CHECK_OK(&c[0], tpk_param_get_global(&c[0], i, false, a));
                CHECK_OK(&c[1], tpk_param_get_global(&c[1], i, false, z));
                CHECK_CLOSE(z, a, gn, 1e-6, "parameter after 4 ZeRO-2 steps");
                free(a), free(z);
            }
            /* the protocol still checked: a range never reported, the weights kept */
            float *w0 = malloc(n * 4);
            memcpy(w0, c[1].params.data.p, n * 4);
            CHECK_OK(&c[1], tpk_dp_begin(&c[1], &b[1], true));
            CHECK_OK(&c[1], tpk_dp_grad_ready(&c[1], 0, 1, &b[1]));
            CHECK_OK(&c[1], tpk_dp_grad_ready(&c[1], 3, 3, &b[1]));
            CHECK_FAILS(&c[1], tpk_train_step(&c[1], &o[1], &b[1], 1e-2f, 0.5f, 1.0f, NULL),
                        TPK_ERR_ARG,
                        "parameter \"e\" (id 2): never reported (tpk_dp_grad_ready) on the "
                        "step's last micro-batch");
            CHECK(!memcmp(w0, c[1].params.data.p, n * 4), "a refused step changed the weights");
            if (d > 1) { /* buckets not linked to the optimizer, or linked to another */
                CHECK_FAILS(&c[1], tpk_train_step(&c[1], &o[1], &b[0], 1e-2f, 0.5f, 1.0f, NULL),
                            TPK_ERR_ARG, "buckets: not linked to opt's gradient slice");
                CHECK_FAILS(&c[0], tpk_dp_shard_grads(&c[0], &b[0], &o[0]), TPK_ERR_ARG,
                            "opt: expected an optimizer made with zero_stage 2 (ZeRO-2), got "
                            "ZeRO stage 0");
            }
            free(w0);
            /* the moments: saved whole from ZeRO-2, loaded into ZeRO-0, 1 and 2 */
            char dir[128];
            snprintf(dir, sizeof dir, "build/tests/zero2_np%d_tp%d", np, tp);
            CHECK_OK(&c[1],
                     tpk_ckpt_save(&c[1], &o[1], dir, &(tpk_ckpt_save_desc){.step = o[1].step}));
            for (int st = 0; st < 3; st++) {
                tpk_adamw back;
                CHECK_OK(&c[1], tpk_adamw_init(&c[1], &back, &(tpk_adamw_desc){.zero_stage = st}));
                CHECK_OK(&c[1], tpk_ckpt_load(&c[1], &back, dir, NULL, NULL));
                float *m = malloc(n * 4);
                memcpy(m, back.m, back.sn * 4);
                CHECK(back.step == 4 && back.sn == (st ? o[1].sn : n), "step %lld",
                      (long long)back.step);
                CHECK_CLOSE(m, (const float *)o[0].m + back.s0, back.sn, 1e-6,
                            "first moments saved under ZeRO-2, loaded at ZeRO 0, 1, 2");
                free(m);
                tpk_adamw_destroy(&c[1], &back);
            }
            free(tmp);
            for (int z = 0; z < 2; z++)
                tpk_adamw_destroy(&c[z], &o[z]), tpk_dp_destroy(&b[z]), tpk_ctx_destroy(&c[z]);
        }
    }
    for (int tp = 1; tp <= 2; tp++) {
        int d = np / tp;
        if (np % tp || (d & (d - 1))) continue;
        for (int kind = 0; kind < 3; kind++)
            TEST_CASE(
                "Adasum at DP %d x TP %d, %s gradients: the recursive formula on the whole "
                "tensors, in double",
                d, tp,
                kind == 0   ? "random"
                : kind == 1 ? "equal (gives that gradient)"
                            : "orthogonal (gives their sum)") {
                tpk_ctx ctx;
                CHECK_OK(&ctx,
                         tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = tp, .seed = 3}));
                int ids[NP];
                add_params(&ctx, ids);
                tpk_dp_buckets b = {0};
                CHECK_OK(&ctx, tpk_dp_adasum_init(&ctx, &b));
                float *mine[NP], *want[NP];
                for (int i = 0; i < NP; i++) {
                    size_t gn = tpk_param_global_numel(&ctx, i);
                    mine[i] = malloc(gn * 4), want[i] = malloc(gn * 4);
                    adasum_ref(i, kind, d, ctx.dp.rank, gn, mine[i], want[i]);
                    CHECK_OK(&ctx, tpk_param_scatter(&ctx, i, mine[i], (float *)ctx.params.grad.p));
                    if (kind == 1)
                        CHECK_CLOSE(want[i], mine[i], gn, 1e-6,
                                    "reference: equal gradients changed");
                }
                CHECK_OK(&ctx, tpk_dp_adasum(&ctx, &b));
                for (int i = 0; i < NP; i++) {
                    size_t gn = tpk_param_global_numel(&ctx, i);
                    float *got = malloc(gn * 4);
                    test_poison(got, gn);
                    CHECK_OK(&ctx, tpk_param_get_global(&ctx, i, true, got));
                    char what[128];
                    snprintf(what, sizeof what, "Adasum of %s", ctx.params.list[i].name);
                    CHECK_CLOSE(got, want[i], gn, 1e-5, what);
                    if (kind == 2) { /* orthogonal: the sum of every rank's gradient */
                        for (size_t e = 0; e < gn; e++)
                            got[e] = (float)tpk_rng_normal(60 + (uint64_t)i, e % (size_t)d, e);
                        CHECK_CLOSE(want[i], got, gn, 1e-6,
                                    "reference: orthogonal gradients are not summed");
                    }
                    free(got), free(mine[i]), free(want[i]);
                }
                tpk_dp_destroy(&b), tpk_ctx_destroy(&ctx);
            }
    }
    if (np == 3)
        TEST_CASE("Adasum at DP 3: refused (a power of two is needed)") {
            tpk_ctx ctx;
            CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = 1}));
            tpk_dp_buckets b = {0};
            CHECK_FAILS(&ctx, tpk_dp_adasum_init(&ctx, &b), TPK_ERR_ARG,
                        "ctx->dp: Adasum needs a power-of-two number of DP ranks, got 3");
            CHECK_FAILS(&ctx, tpk_dp_adasum(&ctx, &b), TPK_ERR_ARG,
                        "expected buckets made for Adasum");
            tpk_dp_destroy(&b), tpk_ctx_destroy(&ctx);
        }
    /* the DP reduction over DP x CP: each CP rank's gradient is a part of its DP rank's, summed
     * over ctx->dp_cp (scaled 1/dp, not 1/(dp cp)); ZeRO slices over it; Adasum sums over CP
     * first, then combines over DP */
    /* HSDP (zs: tpk_ctx_desc.zero_shard_size): ZeRO's slices within groups of zs DP x CP ranks,
     * the slices' sums all-reduced across the groups (DP 4 and CP 2 x DP 2 in shards of 2) */
    for (int tp = 1; tp <= 2; tp++)
        for (int cp = 1; cp <= 3; cp++)
            for (int zs = 0; zs <= 2; zs += 2) {
                if (np % (tp * cp) || (cp == 3 && tp > 1)) continue;
                int dp = np / (tp * cp), g = dp * cp;
                if (zs ? g % zs || g == zs || tp > 1 : cp == 1) continue;
                static const char *mode_name[4] = {"plain (buckets)", "ZeRO-1", "ZeRO-2", "Adasum"};
                for (int mode = 0; mode < 4; mode++) {
                    if (mode == 3 && dp > 2) continue; /* the reference below: one Adasum level */
                    if (zs && (mode == 0 || mode == 3)) continue; /* HSDP: ZeRO's slices only */
                    TEST_CASE(
                        "the DP reduction over DP %d x CP %d (TP %d), %s%s: 3 steps of "
                        "tpk_train_step equal one rank's step on the gradient summed over every "
                        "replica (parameters, norms); no collective over ctx->dp alone",
                        dp, cp, tp, mode_name[mode], zs ? ", HSDP in shards of 2" : "") {
                        tpk_ctx c, r; /* c: TP x CP x DP; r: the reference, TP alone */
                        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world,
                                                                      .tp = tp,
                                                                      .cp = cp,
                                                                      .seed = 3,
                                                                      .zero_shard_size = zs}));
                        CHECK_OK(&r, tpk_ctx_init(&r, &(tpk_ctx_desc){
                                                          .world = &world, .tp = tp, .seed = 3}));
                        int ids[NP];
                        add_params(&c, ids), add_params(&r, ids);
                        tpk_adamw oc, orf;
                        tpk_dp_buckets b = {0};
                        CHECK_OK(&c, tpk_adamw_init(
                                         &c, &oc,
                                         &(tpk_adamw_desc){.weight_decay = 0.1f,
                                                           .zero_stage =
                                                               mode == 1 || mode == 2 ? mode : 0}));
                        CHECK_OK(&r,
                                 tpk_adamw_init(&r, &orf, &(tpk_adamw_desc){.weight_decay = 0.1f}));
                        size_t n = c.params.numel;
                        /* HSDP: shard group q / zs, ranked q % zs (q: the DP x CP rank) */
                        int q = c.dp_cp->rank, zg = zs ? zs : g, zr = zs ? q % zs : q;
                        tpk_range sl = tpk_split((int64_t)n, zg, zr);
                        bool sliced = mode == 1 || mode == 2;
                        CHECK(
                            c.dp_cp->size == g && oc.s0 == (sliced ? (size_t)sl.off : 0) &&
                                oc.sn == (sliced ? (size_t)sl.size : n) &&
                                (zs ? c.zshard == &c.zshard_group && c.zshard->size == zs &&
                                          c.zshard->rank == zr && c.zrep->size == g / zs &&
                                          c.zrep->rank == q / zs
                                    : c.zshard == c.dp_cp && !c.zrep),
                            "the optimizer keeps [%zu, +%zu) of %zu elements at rank %d of the %d "
                            "replicas (shards of %d)",
                            oc.s0, oc.sn, n, c.dp_cp->rank, c.dp_cp->size, zg);
                        if (mode == 2) CHECK_OK(&c, tpk_dp_shard_grads(&c, &b, &oc));
                        if (mode == 3) CHECK_OK(&c, tpk_dp_adasum_init(&c, &b));
                        float scale = mode == 3 ? 1.0f : 1.0f / (float)dp;
                        for (int step = 0; step < 3; step++) {
                            for (int i = 0; i < NP; i++) {
                                size_t gn = tpk_param_global_numel(&c, i);
                                float *part = malloc(gn * 4), *want = malloc(gn * 4);
                                double *tot = calloc(gn, 8), *gd = calloc((size_t)dp * gn, 8);
                                for (int d = 0; d < dp; d++) /* replica (d, q): its own part */
                                    for (int q = 0; q < cp; q++)
                                        for (size_t k = 0; k < gn; k++) {
                                            float x =
                                                tpk_rng_normal(70 + (uint64_t)step,
                                                               (uint64_t)((d * 8 + q) * 16 + i), k);
                                            tot[k] += x, gd[(size_t)d * gn + k] += x;
                                            if (d == c.dp.rank && q == c.cp.rank) part[k] = x;
                                        }
                                double a2 = 0, b2 = 0, dot = 0; /* Adasum of the DP ranks' sums */
                                for (size_t k = 0; dp == 2 && k < gn; k++)
                                    a2 += gd[k] * gd[k], b2 += gd[gn + k] * gd[gn + k],
                                        dot += gd[k] * gd[gn + k];
                                for (size_t k = 0; k < gn; k++)
                                    want[k] = (float)(mode < 3 || dp == 1
                                                          ? tot[k]
                                                          : (1 - dot / (2 * a2)) * gd[k] +
                                                                (1 - dot / (2 * b2)) * gd[gn + k]);
                                CHECK_OK(&c,
                                         tpk_param_scatter(&c, i, part, (float *)c.params.grad.p));
                                CHECK_OK(&r,
                                         tpk_param_scatter(&r, i, want, (float *)r.params.grad.p));
                                free(part), free(want), free(tot), free(gd);
                            }
                            tpk_comm_stats_reset(&c.dp), tpk_comm_stats_reset(c.dp_cp);
                            tpk_comm_stats_reset(&c.cp);
                            if (zs) tpk_comm_stats_reset(c.zshard), tpk_comm_stats_reset(c.zrep);
                            CHECK_OK(&c, tpk_dp_begin(&c, &b, mode != 1));
                            CHECK_OK(&c, tpk_dp_grad_ready(&c, 0, NP - 1, &b));
                            double nc = -1, nr = -2;
                            CHECK_OK(&c, tpk_train_step(&c, &oc, &b, 1e-2f, 0.5f, scale, &nc));
                            CHECK_OK(&r, tpk_grad_norm(&r, scale, &nr));
                            CHECK_OK(&r, tpk_adamw_step(&r, &orf, 1e-2f,
                                                        scale * tpk_clip_factor(nr, 0.5f)));
                            CHECK(fabs(nc - nr) <= 1e-6 * nr && nr > 0.5,
                                  "step %d: norm %.9g, the reference's %.9g", step, nc, nr);
                            uint64_t on_dp = 0, on_cp = 0;
                            for (int k = 0; k < TPK_COLL_N; k++)
                                on_dp += c.dp.stats.calls[k], on_cp += c.cp.stats.calls[k];
                            const uint64_t *gc = c.zshard->stats.calls; /* ZeRO's group */
                            uint64_t on_g = 0; /* HSDP: over the DP x CP group as a whole */
                            for (int k = 0; zs && k < TPK_COLL_N; k++)
                                on_g += c.dp_cp->stats.calls[k];
                            CHECK(
                                !zs || (on_g == 0 && on_cp == 0 &&
                                        c.zrep->stats.calls[TPK_COLL_ALLREDUCE] == 1 &&
                                        c.zrep->stats.elems[TPK_COLL_ALLREDUCE] == oc.sn),
                                "step %d: HSDP: %llu collectives over DP x CP, %llu over CP; %llu "
                                "all-reduces of %llu elements across the shard groups (the slice: "
                                "%zu)",
                                step, (unsigned long long)on_g, (unsigned long long)on_cp,
                                (unsigned long long)c.zrep->stats.calls[TPK_COLL_ALLREDUCE],
                                (unsigned long long)c.zrep->stats.elems[TPK_COLL_ALLREDUCE], oc.sn);
                            if (zs) on_dp = 0; /* (at CP 1 ctx->dp is DP x CP: checked above) */
                            CHECK(
                                mode == 3 ? gc[TPK_COLL_ALLREDUCE] == 0 &&
                                                c.cp.stats.calls[TPK_COLL_ALLREDUCE] == 1
                                : mode == 0
                                    ? gc[TPK_COLL_ALLREDUCE] == 1 && on_dp == 0 && on_cp == 0
                                    : gc[TPK_COLL_REDUCE_SCATTER] >= 1 &&
                                          gc[TPK_COLL_ALLGATHER] == 1 &&
                                          gc[TPK_COLL_ALLREDUCE] == 1 && on_dp == 0 && on_cp == 0,
                                "step %d: over ZeRO's group %llu all-reduces, %llu "
                                "reduce-scatters, %llu all-gathers; %llu collectives over "
                                "ctx->dp, %llu over ctx->cp",
                                step, (unsigned long long)gc[TPK_COLL_ALLREDUCE],
                                (unsigned long long)gc[TPK_COLL_REDUCE_SCATTER],
                                (unsigned long long)gc[TPK_COLL_ALLGATHER],
                                (unsigned long long)on_dp, (unsigned long long)on_cp);
                        }
                        for (int i = 0; i < NP; i++) {
                            size_t gn = tpk_param_global_numel(&c, i);
                            float *a = malloc(gn * 4), *z = malloc(gn * 4);
                            test_poison(a, gn), test_poison(z, gn);
                            CHECK_OK(&r, tpk_param_get_global(&r, i, false, a));
                            CHECK_OK(&c, tpk_param_get_global(&c, i, false, z));
                            CHECK_CLOSE(z, a, gn, 1e-6, "parameter after 3 steps");
                            free(a), free(z);
                        }
                        tpk_adamw_destroy(&c, &oc), tpk_adamw_destroy(&r, &orf), tpk_dp_destroy(&b);
                        tpk_ctx_destroy(&c), tpk_ctx_destroy(&r);
                    }
                }
            }
    TEST_CASE("HSDP: a shard size that does not divide DP x CP, or of 1, refused by name") {
        tpk_ctx ctx;
        char want[160];
        snprintf(want, sizeof want,
                 "desc->zero_shard_size: expected 0 (ZeRO's slices over the whole DP x CP group) "
                 "or a divisor >= 2 of DP x CP = %d x 1 = %d",
                 np, np);
        int bad[3] = {np + 1, -2, np > 1 ? 1 : 3};
        for (int k = 0; k < 3; k++)
            CHECK_FAILS(&ctx,
                        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world,
                                                           .zero_shard_size = bad[k]}),
                        TPK_ERR_ARG, want);
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .zero_shard_size = np}));
        CHECK(ctx.zshard == ctx.dp_cp && !ctx.zrep, "a shard of every DP rank: no HSDP groups");
        tpk_ctx_destroy(&ctx);
    }
    TEST_CASE("tpk_train_step: bad input") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = 1}));
        int ids[NP];
        add_params(&ctx, ids);
        tpk_adamw o;
        tpk_dp_buckets b = {0};
        CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, &(tpk_adamw_desc){.zero = true}));
        CHECK_FAILS(&ctx, tpk_train_step(&ctx, NULL, &b, 1e-3f, 1.0f, 1.0f, NULL), TPK_ERR_ARG,
                    "opt: expected an initialised optimizer");
        CHECK_FAILS(&ctx, tpk_train_step(&ctx, &o, NULL, 1e-3f, 1.0f, 1.0f, NULL), TPK_ERR_ARG,
                    "buckets: NULL");
        CHECK_FAILS(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 1.0f, NAN, NULL), TPK_ERR_ARG,
                    "grad_scale, clip: expected finite numbers");
        if (np > 1) { /* under ZeRO-1 the buckets must not have started */
            CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, true));
            CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, 0, NP - 1, &b));
            CHECK_FAILS(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 1.0f, 1.0f, NULL), TPK_ERR_ARG,
                        "all-reduces started under ZeRO-1");
            CHECK_OK(&ctx, tpk_dp_finish(&ctx, &b));
        }
        double nrm = 0;
        CHECK_FAILS(&ctx, tpk_train_norm_read(&ctx, 1.0f, &nrm), TPK_ERR_ARG,
                    "tpk_train_norm_read: no training step has run");
        float inf = INFINITY, *w0 = malloc(ctx.params.numel * 4);
        memcpy(w0, ctx.params.data.p, ctx.params.numel * 4);
        memcpy(ctx.params.grad.p, &inf, sizeof inf); /* a gradient that is not finite (on every
                                                        rank) */
        /* without a norm pointer the step neither waits nor fails: it is skipped on the device,
         * counted, and reported by the next read */
        CHECK_OK(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 1.0f, 1.0f, NULL));
        CHECK_OK(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 1.0f, 1.0f, NULL));
        CHECK(!memcmp(w0, ctx.params.data.p, ctx.params.numel * 4),
              "a step with an infinite gradient norm changed the weights");
        CHECK_FAILS(&ctx, tpk_train_norm_read(&ctx, 1.0f, &nrm), TPK_ERR_ARG,
                    "not finite (now inf) on 2 step(s) since it was last read, which were skipped");
        /* reported: the count starts again */
        CHECK_OK(&ctx, tpk_train_norm_read(&ctx, 1.0f, &nrm));
        CHECK_FAILS(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 1.0f, 1.0f, &nrm), TPK_ERR_ARG,
                    "tpk_train_norm_read: the gradient norm was not finite (now inf) on 1 step(s)");
        CHECK(!memcmp(w0, ctx.params.data.p, ctx.params.numel * 4),
              "a step with an infinite gradient norm changed the weights");
        CHECK_FAILS(&ctx, tpk_train_norm_read(&ctx, 1.0f, NULL), TPK_ERR_ARG, "norm: NULL");
        free(w0);
        tpk_adamw_destroy(&ctx, &o), tpk_dp_destroy(&b), tpk_ctx_destroy(&ctx);
    }
    /* sharded gradients over 2 micro-batches (reduced each); full recompute; the flat buffer
     * kept whole (reduced on the last micro-batch) without prefetch; HSDP */
    test_zero3(false, TPK_RECOMPUTE_NONE, false, TPK_F32, false, 0, false, 2);
    test_zero3(true, TPK_RECOMPUTE_FULL, false, TPK_F32, false, 0, false, 1);
    test_zero3(false, TPK_RECOMPUTE_NONE, false, TPK_F32, true, 0, true, 2);
    if (np == 4) { /* HSDP: the all-reduces across the groups under the backward, and after it */
        test_zero3(false, TPK_RECOMPUTE_NONE, false, TPK_F32, false, 2, false, 1);
        test_zero3(false, TPK_RECOMPUTE_NONE, false, TPK_F32, false, 2, false, 2);
    }
    if (np <= 2) { /* (the long set) */
        test_zero3(false, TPK_RECOMPUTE_FULL, false, TPK_F32, false, 0, false, 1);
        test_zero3(true, TPK_RECOMPUTE_NONE, false, TPK_F32, false, 0, false, 2);
        test_zero3(false, TPK_RECOMPUTE_NONE, true, TPK_F32, false, 0, false, 2);
        test_zero3(false, TPK_RECOMPUTE_NONE, false, TPK_BF16, false, 0, false, 2);
        test_zero3(true, TPK_RECOMPUTE_FULL, true, TPK_BF16, false, 0, false, 1);
        test_zero3(false, TPK_RECOMPUTE_NONE, false, TPK_F32, false, 0, true, 1);
    }
    if (np == 4) { /* PP 2 x DP 2 */
        test_zero3_pipe(TPK_PIPE_1F1B, 1, 3, TPK_RECOMPUTE_NONE, false);
        test_zero3_pipe(TPK_PIPE_1F1B, 1, 3, TPK_RECOMPUTE_FULL, false);
        test_zero3_pipe(TPK_PIPE_1F1B, 1, 3, TPK_RECOMPUTE_NONE, true);
        test_zero3_pipe(TPK_PIPE_INTERLEAVED, 2, 4, TPK_RECOMPUTE_NONE, false);
    }
    tpk_comm_destroy(&world);
    return test_finish();
}
