/* tests/test_cp_lm.c — the language model under context parallelism (tpk/models/lm.h over
 * ctx->cp): GPT-2 (its learned position table read at each row's true position), Llama with
 * grouped-query attention (A = 4 query heads over G = 2 key/value heads, rotary), GPT-NeoX
 * (partial rotary, the parallel residual) and Mixtral (4 experts, top 2, its load-balancing aux and
 * the routers' z-loss pooled over the CP group: the ring, the all-gather, recompute, dropout),
 * each CP rank given its rows of the batch
 * (tpk_cp_scatter_host: chunks r and 2c - 1 - r of every sequence), against the same model
 * unsharded (one rank, CP 1, the whole batch) with the same weights: the loss (with a loss pointer
 * and deferred, read from the running sum) within 1e-5 relative and the same on every rank, and
 * every parameter's gradient, summed over the CP group here (the data-parallel reduction's part
 * over ctx->dp_cp) and gathered over TP, within 1e-5 of the unsharded one. Meshes: CP 2 (2 ranks),
 * CP 3 (3 ranks), TP 2 x CP 2 and CP 4 (4 ranks; at 1 rank CP 1 against itself); the ring and the
 * all-gather; selective and full recompute and sequence parallelism (Llama, Mixtral); the ring's
 * messages (c - 1 sends a layer forward). Dropout 0.1 (GPT-2, GPT-NeoX: the embedding's, the
 * branches' and the attention's masks, drawn at each row's true position): the loss and every
 * gradient equal the unsharded model's with the same seed within 1e-5, ring and all-gather, full
 * and selective recompute, sequence parallelism. Bad input refused by name: a sequence length
 * not a multiple of 2c, a dropout layer not told its sequence length, an unknown mode; under CP
 * whole sequences (the rows tag cleared) and at CP 1 CP rows (tagged), by both attentions and the
 * loss, by name.
 * Random inputs, some targets
 * ignored. Generation (CP 3, in
 * make test-long): the unsharded model's tokens, greedy and sampled, each window padded to a
 * multiple of 2c; a window that would pad past the positions refused by name. */
#include "test.h"

#include <tpk/models/families.h>

static int me, np;
static tpk_comm world;
enum { V = 97, PMAX = 32, L = 2, B = 2, S = 24, H = 32, A = 4, G = 2, F = 40, MAXP = 64 };

typedef enum { FAM_GPT2, FAM_LLAMA, FAM_NEOX, FAM_MIXTRAL, FAM_N } family;
static const char *fam_name[FAM_N] = {"GPT-2", "Llama (GQA)", "GPT-NeoX (partial rotary)",
                                      "Mixtral (E 4, k 2, the aux and z-loss pooled over CP)"};

typedef struct model {
    family f;
    tpk_gpt2 g;
    tpk_llama l;
    tpk_neox n;
    tpk_mixtral x;
} model;

typedef struct opts {
    tpk_cp_comm comm;
    tpk_recompute rc;
    bool sp;
    float dropout;
} opts;

static tpk_status model_init(tpk_ctx *ctx, model *m, family f, const opts *o) {
    memset(m, 0, sizeof *m);
    m->f = f;
    if (f == FAM_GPT2) {
        tpk_gpt2_config c;
        memset(&c, 0, sizeof c);
        c.vocab = V, c.positions = PMAX, c.layers = L, c.hidden = H, c.heads = A;
        c.recompute = o->rc, c.sequence_parallel = o->sp, c.cp_comm = o->comm;
        c.dropout = o->dropout;
        return tpk_gpt2_init(ctx, &m->g, &c);
    }
    if (f == FAM_LLAMA) {
        tpk_llama_config c;
        memset(&c, 0, sizeof c);
        c.vocab = V, c.positions = PMAX, c.layers = L, c.hidden = H, c.heads = A;
        c.kv_heads = G, c.ffn = F, c.rope_theta = 500.0f;
        c.recompute = o->rc, c.sequence_parallel = o->sp, c.cp_comm = o->comm;
        return tpk_llama_init(ctx, &m->l, &c);
    }
    if (f == FAM_MIXTRAL) {
        tpk_mixtral_config c;
        memset(&c, 0, sizeof c);
        c.vocab = V, c.positions = PMAX, c.layers = L, c.hidden = H, c.heads = A;
        c.kv_heads = G, c.ffn = F, c.rope_theta = 500.0f, c.experts = 4, c.top_k = 2;
        c.aux_coef = 0.05f, c.z_coef = 0.01f;
        c.recompute = o->rc, c.dropout = o->dropout, c.cp_comm = o->comm;
        c.sequence_parallel = o->sp;
        return tpk_mixtral_init(ctx, &m->x, &c);
    }
    tpk_neox_config c;
    memset(&c, 0, sizeof c);
    c.vocab = V, c.positions = PMAX, c.layers = L, c.hidden = H, c.heads = A;
    c.rotary_pct = 0.5f, c.rope_theta = 300.0f; /* 4 of each head's 8 dimensions rotated */
    c.recompute = o->rc, c.sequence_parallel = o->sp, c.cp_comm = o->comm;
    c.dropout = o->dropout;
    return tpk_neox_init(ctx, &m->n, &c);
}
static tpk_lm *lm_of(model *m) {
    return m->f == FAM_GPT2      ? &m->g.lm
           : m->f == FAM_LLAMA   ? &m->l.lm
           : m->f == FAM_MIXTRAL ? &m->x.lm
                                 : &m->n.lm;
}

/* every weight N(0, 0.3^2) from (its name, its global index): the same model at every mesh */
static void set_weights(tpk_ctx *ctx) {
    for (int i = 0; i < ctx->params.n; i++) {
        size_t gn = tpk_param_global_numel(ctx, i);
        float *w = (float *)malloc(gn * sizeof(float));
        for (size_t k = 0; k < gn; k++)
            w[k] = 0.3f * tpk_rng_normal(11, tpk_rng_stream(ctx->params.list[i].name), k);
        CHECK_OK(ctx, tpk_param_set_global(ctx, i, w));
        free(w);
    }
}

static int32_t ids[B * S], tg[B * S];

typedef struct result {
    float loss, loss_deferred;
    int n;
    float *grad[MAXP];
    size_t numel[MAXP];
    char name[MAXP][96];
    uint64_t fwd_sends; /* the CP group's point-to-point batches in the first forward */
} result;
static void result_free(result *r) {
    for (int i = 0; i < r->n; i++) free(r->grad[i]);
    r->n = 0;
}

/* The model on ctx (its mesh): the loss of a forward with a loss pointer and its gradients (the
 * CP group's parts summed here, the TP-partial ones summed, every one gathered over TP), then a
 * deferred forward's loss read after its backward. Nonzero on failure. */
static int run(tpk_ctx *ctx, family f, const opts *o, result *r) {
    int f0 = test__fails_case;
    memset(r, 0, sizeof *r);
    model m;
    CHECK_OK(ctx, model_init(ctx, &m, f, o));
    if (test__fails_case > f0) return 1;
    set_weights(ctx);
    tpk_lm *lm = lm_of(&m);
    int c = tpk_cp_size(ctx);
    int32_t *li = (int32_t *)malloc(sizeof(int32_t) * B * S),
            *lt = (int32_t *)malloc(sizeof(int32_t) * B * S);
    CHECK_OK(ctx, tpk_cp_scatter_host(ctx, li, ids, B, S, sizeof(int32_t)));
    CHECK_OK(ctx, tpk_cp_scatter_host(ctx, lt, tg, B, S, sizeof(int32_t)));
    CHECK_OK(ctx, tpk_params_zero_grad(ctx));
    tpk_comm_stats_reset(&ctx->cp);
    r->loss = NAN;
    CHECK_OK(ctx, tpk_lm_forward(ctx, lm, li, lt, B, S, &r->loss));
    r->fwd_sends = ctx->cp.stats.calls[TPK_COLL_SEND];
    CHECK_OK(ctx, tpk_lm_backward(ctx, lm, 1.0f));
    if (c > 1) /* the gradient of the mean loss: the parts of every CP rank's rows summed */
        CHECK_OK(ctx, tpk_allreduce(ctx, &ctx->cp, ctx->params.grad.p, ctx->params.grad.p,
                                    ctx->params.numel, TPK_F32, TPK_SUM));
    CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
    r->n = ctx->params.n < MAXP ? ctx->params.n : MAXP;
    for (int i = 0; i < r->n; i++) {
        r->numel[i] = tpk_param_global_numel(ctx, i);
        r->grad[i] = (float *)malloc(sizeof(float) * r->numel[i]);
        test_poison(r->grad[i], r->numel[i]);
        CHECK_OK(ctx, tpk_param_get_global(ctx, i, true, r->grad[i]));
        snprintf(r->name[i], sizeof r->name[i], "%s", ctx->params.list[i].name);
    }
    /* deferred: the loss computed with the logits' gradient, read from the running sum */
    double sum = NAN;
    int64_t nsum = 0;
    CHECK_OK(ctx, tpk_lm_forward(ctx, lm, li, lt, B, S, NULL));
    CHECK_OK(ctx, tpk_lm_backward(ctx, lm, 1.0f));
    CHECK_OK(ctx, tpk_xent_loss_read(ctx, &lm->ce, &sum, &nsum));
    CHECK(nsum == 1, "deferred: %lld losses in the running sum, expected 1", (long long)nsum);
    r->loss_deferred = (float)(sum + tpk_lm_aux_read(lm)); /* (a mixture of experts' aux) */
    free(li), free(lt);
    tpk_lm_destroy(ctx, lm);
    return test__fails_case > f0;
}

/* The unsharded model (this rank alone, CP 1, the whole batch), with dropout p. */
static int reference(family f, float p, result *r) {
    tpk_ctx c;
    opts o;
    memset(&o, 0, sizeof o);
    o.dropout = p;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.seed = 5}));
    int bad = run(&c, f, &o, r);
    tpk_ctx_destroy(&c);
    return bad;
}

static double mix_worst[2]; /* Mixtral's largest relative differences: loss, gradient */

/* The model at TP tp x CP cp (the rest DP) under o against the reference ref. */
static void compare(family f, int tp, int cp, const opts *o, const result *ref) {
    tpk_ctx c;
    result r;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = tp, .cp = cp, .seed = 5}));
    if (run(&c, f, o, &r) == 0) {
        double e = fabs((double)r.loss - ref->loss) / fabs((double)ref->loss),
               ed = fabs((double)r.loss_deferred - ref->loss) / fabs((double)ref->loss);
        if (f == FAM_MIXTRAL) mix_worst[0] = fmax(mix_worst[0], fmax(e, ed));
        CHECK(e < 1e-5 && ed < 1e-5,
              "loss %.9g (deferred %.9g), unsharded %.9g: relative %.3g, %.3g", (double)r.loss,
              (double)r.loss_deferred, (double)ref->loss, e, ed);
        float all[2] = {r.loss, r.loss};
        MPI_Allreduce(MPI_IN_PLACE, &all[0], 1, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &all[1], 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
        CHECK(all[0] == all[1], "the loss differs between ranks: %.9g .. %.9g", (double)all[0],
              (double)all[1]);
        CHECK(r.n == ref->n, "%d parameters, unsharded %d", r.n, ref->n);
        for (int i = 0; i < r.n && i < ref->n; i++) {
            CHECK(!strcmp(r.name[i], ref->name[i]) && r.numel[i] == ref->numel[i],
                  "parameter %d: %s of %zu, unsharded %s of %zu", i, r.name[i], r.numel[i],
                  ref->name[i], ref->numel[i]);
            if (r.numel[i] != ref->numel[i]) continue;
            CHECK_CLOSE(r.grad[i], ref->grad[i], r.numel[i], 1e-5, r.name[i]);
            if (f == FAM_MIXTRAL)
                mix_worst[1] = fmax(mix_worst[1], test_relerr(r.grad[i], ref->grad[i], r.numel[i]));
        }
        uint64_t want = o->comm == TPK_CP_P2P ? (uint64_t)L * (uint64_t)(cp - 1) : 0;
        CHECK(r.fwd_sends == want,
              "forward: %llu point-to-point batches on the CP group, "
              "expected %llu (c - 1 a layer)",
              (unsigned long long)r.fwd_sends, (unsigned long long)want);
    }
    result_free(&r);
    tpk_ctx_destroy(&c);
}

static const char *comm_name(tpk_cp_comm m) { return tpk_cp_comm_name(m); }

static void test_families(int tp, int cp) {
    for (int f = 0; f < FAM_N; f++) {
        result ref;
        if (reference((family)f, 0.0f, &ref)) {
            result_free(&ref);
            continue;
        }
        opts o;
        memset(&o, 0, sizeof o);
        TEST_CASE("%s at TP %d x CP %d (%d ranks), the ring: loss and every gradient (summed over "
                  "CP) equal the unsharded model's within 1e-5",
                  fam_name[f], tp, cp, np) {
            compare((family)f, tp, cp, &o, &ref);
        }
        if (f == FAM_LLAMA || f == FAM_MIXTRAL) {
            o.comm = TPK_CP_ALLGATHER;
            TEST_CASE("%s at TP %d x CP %d, the all-gather: the same", fam_name[f], tp, cp) {
                compare((family)f, tp, cp, &o, &ref);
            }
            o.comm = TPK_CP_P2P;
            for (int k = 0; k < 2; k++) {
                o.rc = k ? TPK_RECOMPUTE_FULL : TPK_RECOMPUTE_SELECTIVE;
                TEST_CASE("%s at TP %d x CP %d, %s recompute (%s): the same", fam_name[f], tp, cp,
                          tpk_recompute_name(o.rc), comm_name(o.comm)) {
                    compare((family)f, tp, cp, &o, &ref);
                }
            }
            o.rc = TPK_RECOMPUTE_NONE;
            if (tp > 1) {
                o.sp = true;
                TEST_CASE("%s at TP %d x CP %d with sequence parallelism: the same", fam_name[f],
                          tp, cp) {
                    compare((family)f, tp, cp, &o, &ref);
                }
            }
        }
        result_free(&ref);
        if (f == FAM_LLAMA || reference((family)f, 0.1f, &ref)) { /* dropout: GPT-2, GPT-NeoX */
            result_free(&ref);
            continue;
        }
        o.dropout = 0.1f;
        TEST_CASE("%s with dropout 0.1 (embedding, branches, attention) at TP %d x CP %d, the "
                  "ring: loss and every gradient equal the unsharded model's with the same seed",
                  fam_name[f], tp, cp) {
            compare((family)f, tp, cp, &o, &ref);
        }
        o.comm = TPK_CP_ALLGATHER, o.rc = TPK_RECOMPUTE_FULL;
        TEST_CASE("%s with dropout 0.1 at TP %d x CP %d, the all-gather, full recompute: the same",
                  fam_name[f], tp, cp) {
            compare((family)f, tp, cp, &o, &ref);
        }
        o.comm = TPK_CP_P2P, o.rc = TPK_RECOMPUTE_SELECTIVE, o.sp = tp > 1;
        TEST_CASE("%s with dropout 0.1 at TP %d x CP %d, selective recompute%s: the same",
                  fam_name[f], tp, cp, o.sp ? ", sequence parallelism" : "") {
            compare((family)f, tp, cp, &o, &ref);
        }
        result_free(&ref);
    }
}

/* Generation under CP: the model at CP cp samples the unsharded model's tokens (greedy, and at
 * temperature 0.8 with top-k 20: the same draws), windows of 1..30 tokens each padded to a
 * multiple of 2c; a window that would pad past the positions refused by name. */
static void test_generate(int cp) {
    enum { NP = 5, N = 26 }; /* the longest window NP + N - 1 = 30 <= PMAX, a multiple of 6 */
    int32_t prompt[NP] = {3, 41, 7, 88, 19};
    for (int f = 0; f < FAM_N; f++)
        TEST_CASE("%s at CP %d generates the unsharded model's tokens (greedy and sampled; "
                  "windows of 1..30 tokens padded to a multiple of 2c)",
                  fam_name[f], cp) {
            int32_t want[2][NP + N], got[2][NP + N], one[2][N + 1], one_ref[2][N + 1];
            opts o;
            memset(&o, 0, sizeof o);
            tpk_sample_opts so[2] = {{0.0f, 0, 1.0f}, {0.8f, 20, 1.0f}};
            for (int k = 0; k < 2; k++) { /* the unsharded model, then at CP cp */
                tpk_ctx c;
                if (k == 0) CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.seed = 5}));
                else
                    CHECK_OK(&c, tpk_ctx_init(
                                     &c, &(tpk_ctx_desc){.world = &world, .cp = cp, .seed = 5}));
                model m;
                CHECK_OK(&c, model_init(&c, &m, (family)f, &o));
                set_weights(&c);
                for (int q = 0; q < 2; q++) {
                    int32_t *out = k ? got[q] : want[q];
                    for (int i = 0; i < NP + N; i++) out[i] = -1;
                    CHECK_OK(&c, tpk_lm_generate(&c, lm_of(&m), prompt, NP, N, &so[q], 9, out));
                    CHECK_OK(&c, tpk_lm_sample(&c, lm_of(&m), 5, N, so[q].temperature, 9,
                                               k ? one[q] : one_ref[q]));
                }
                if (k && PMAX % (2 * cp)) /* a window of 31 tokens would pad past the 32 */
                    CHECK_FAILS(
                        &c,
                        tpk_lm_generate(&c, lm_of(&m), prompt, NP, PMAX - NP, &so[0], 9, got[0]),
                        TPK_ERR_UNSUPPORTED, "a window is padded to a multiple of 2 x cp");
                tpk_lm_destroy(&c, lm_of(&m));
                tpk_ctx_destroy(&c);
            }
            for (int q = 0; q < 2; q++) {
                CHECK(!memcmp(got[q], want[q], sizeof got[q]),
                      "%s: tokens differ from the unsharded model's (first new: %d vs %d)",
                      q ? "sampled" : "greedy", (int)got[q][NP], (int)want[q][NP]);
                CHECK(!memcmp(one[q], one_ref[q], sizeof one[q]),
                      "tpk_lm_sample %s: tokens differ from the unsharded model's",
                      q ? "sampled" : "greedy");
            }
        }
}

static void test_refusals(int cp) {
    TEST_CASE("under CP %d: a sequence length not a multiple of 2c, a dropout layer not told its "
              "sequence length, an unknown mode refused by name",
              cp) {
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .cp = cp, .seed = 5}));
        opts o;
        memset(&o, 0, sizeof o);
        model m;
        CHECK_OK(&c, model_init(&c, &m, FAM_LLAMA, &o));
        int64_t bad = 2 * cp + 2; /* not a multiple of 2c (c >= 2) */
        int32_t z[PMAX] = {0};
        CHECK_FAILS(&c, tpk_lm_forward(&c, lm_of(&m), z, z, 1, bad, NULL), TPK_ERR_SHAPE,
                    "S: expected a sequence length that is a multiple of 2 x cp");
        tpk_lm_destroy(&c, lm_of(&m));
        tpk_dropout d; /* a dropout layer alone: its rows' positions need S */
        CHECK_OK(&c, tpk_dropout_init(&c, &d, &(tpk_dropout_desc){.name = "drop", .p = 0.1f}));
        float *x = (float *)calloc((size_t)(2 * H), sizeof(float));
        tpk_tensor tx = tpk_tensor_2d(x, TPK_F32, 2, H, TPK_R);
        CHECK_FAILS(&c, tpk_dropout_forward(&c, &d, &tx), TPK_ERR_ARG,
                    "layer \"drop\": under context parallelism (cp = ");
        tpk_dropout_set_seq(&d, 2 * cp + 1); /* not a multiple of 2c */
        CHECK_FAILS(&c, tpk_dropout_forward(&c, &d, &tx), TPK_ERR_ARG,
                    "expected the sequence length set (tpk_dropout_set_seq)");
        tpk_dropout_set_seq(&d, 2 * cp); /* 2 rows: one sequence of 2c at this rank */
        CHECK_OK(&c, tpk_dropout_forward(&c, &d, &tx));
        tpk_dropout_destroy(&c, &d);
        free(x);
        tpk_gqa_attention ga;
        CHECK_FAILS(&c,
                    tpk_gqa_attention_init(&c, &ga, H, A,
                                           &(tpk_gqa_attention_desc){.cp_comm = (tpk_cp_comm)7}),
                    TPK_ERR_ARG, "desc->cp_comm: expected TPK_CP_P2P or TPK_CP_ALLGATHER, got 7");
        tpk_ctx_destroy(&c);
    }
}

/* The CP rows tag (tpk_tensor.cp_rows) checked by the readers across the sequence: under CP c a
 * tensor of whole sequences (the tag cleared), and at CP 1 one tagged as CP rows, refused by name
 * by both attentions and the loss. */
static void test_rows_tag(int cp) {
    TEST_CASE("under CP %d: whole sequences, and at CP 1 CP rows, refused by name by the "
              "attentions and the loss",
              cp) {
        for (int k = 0; k < 2; k++) { /* k = 0: CP cp, the tag cleared; 1: CP 1, the tag set */
            int c = k ? 1 : cp;
            tpk_ctx ctx;
            CHECK_OK(&ctx,
                     tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .cp = c, .seed = 5}));
            int64_t T = B * S / c;
            float *x = (float *)calloc((size_t)(T * (V > H ? V : H)), sizeof(float));
            tpk_tensor tx = tpk_cp_tensor_2d(&ctx, x, TPK_F32, B, S, H, TPK_R), ty;
            CHECK(tx.cp_rows == (c > 1), "tpk_cp_tensor_2d: cp_rows %d at CP %d", tx.cp_rows, c);
            tx.cp_rows = (uint8_t)k;
            char want[160];
            snprintf(want, sizeof want, "x: expected %s at CP %d, got %s",
                     k ? "whole sequences" : "this rank's CP rows (tpk_cp_rows)", c,
                     k ? "this rank's CP rows (tpk_cp_rows)" : "whole sequences");
            tpk_attention a;
            tpk_gqa_attention ga;
            CHECK_OK(&ctx, tpk_attention_init(&ctx, &a, H, A, NULL));
            CHECK_OK(&ctx, tpk_gqa_attention_init(&ctx, &ga, H, A,
                                                  &(tpk_gqa_attention_desc){.kv_heads = G}));
            CHECK_FAILS(&ctx, tpk_attention_forward(&ctx, &a, tx, B, S, &ty), TPK_ERR_LAYOUT, want);
            CHECK_FAILS(&ctx, tpk_gqa_attention_forward(&ctx, &ga, tx, B, S, &ty), TPK_ERR_LAYOUT,
                        want);
            tpk_xent ce;
            CHECK_OK(&ctx, tpk_xent_init(&ctx, &ce, V, NULL));
            tpk_tensor z = tpk_cp_tensor_2d(&ctx, x, TPK_F32, B, S, V, TPK_S(-1));
            z.cp_rows = (uint8_t)k;
            want[0] = 'z';
            float loss;
            CHECK_FAILS(&ctx, tpk_xent_forward(&ctx, &ce, z, tg, &loss), TPK_ERR_LAYOUT, want);
            tpk_xent_destroy(&ctx, &ce);
            tpk_gqa_attention_destroy(&ctx, &ga);
            tpk_attention_destroy(&ctx, &a);
            free(x);
            tpk_ctx_destroy(&ctx);
        }
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    for (int t = 0; t < B * S; t++) { /* random tokens, every 7th target ignored */
        ids[t] = (int32_t)(tpk_philox(3, 1, (uint64_t)t).v[0] % V);
        tg[t] = t % 7 == 3 ? -100 : (int32_t)(tpk_philox(3, 2, (uint64_t)t).v[0] % V);
    }
    if (np == 1) test_families(1, 1);  /* the CP code at c = 1: the model of before */
    if (np >= 2) test_families(1, np); /* CP 2, 3, 4 */
    if (np == 4) test_families(2, 2);  /* TP 2 x CP 2 */
    if (me == 0)
        printf("Mixtral: largest relative difference of the loss %.3g, of a gradient %.3g\n",
               mix_worst[0], mix_worst[1]);
    if (np >= 2) test_refusals(np);
    if (np >= 2) test_rows_tag(np);
    if (np == 3) test_generate(np); /* make test-long: CP 3 (6 chunks) */
    (void)me;
    return test_finish();
}
