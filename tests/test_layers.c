/* tests/test_layers.c — vocabulary-parallel embedding, layernorm, tied LM head and
 * vocabulary-parallel cross-entropy, chained as ids -> wte + wpe -> layernorm -> logits = h wte^T
 * -> loss, sharded (t = ranks, V = 509 so no t > 1 divides it) against the unsharded chain on
 * every rank: loss, and every gathered gradient (wte gets both uses) to relative 1e-5, with
 * and without sequence parallelism, with label smoothing 0 and 0.1 and ignored positions.
 * The loss is also checked against a double log-sum-exp over the gathered logits with the
 * smoothing over the global vocabulary; a forward with loss = NULL leaves the mean in backend
 * memory, summed until tpk_xent_loss_read (equal, bit for bit, to the means read at once); a
 * deferred forward (its loss computed with the gradient by the backward, fused; or settled by a
 * read or the next forward) gives the same loss and gradients bit for bit, also in chunks of 3
 * rows; cross-entropy does exactly 1 collective forward (an all-gather of 4 floats a row; none at
 * t = 1) and none backward (deferred: none forward, 1 per chunk backward); bad ids, targets,
 * sequence lengths and hidden sizes are refused. */
#include "test.h"

static int me, np;
static tpk_comm world;
enum { V = 509, P = 16, H = 8, B = 2, S = 5, T = B * S };

typedef struct chain {
    tpk_embedding e;
    tpk_layernorm ln;
    tpk_linear head;
    tpk_xent ce;
    bool sp;
} chain;


typedef struct out {
    float loss;
    double ref_loss;
    float *grad[8];
    int n;
    tpk_comm_stats ce_fwd, ce_bwd;
} out;

/* mode 0: forward, then backward; 1: a deferred forward, the loss computed by the backward (fused);
 * 2: as 1 in chunks of 3 rows */
static int run_chain(tpk_ctx *ctx, bool sp, float eps, const int32_t *ids, const int32_t *tg,
                     out *o, int mode) {
    chain c;
    memset(&c, 0, sizeof c);
    int f0 = test__fails_case;
    CHECK_OK(ctx, tpk_embedding_init(ctx, &c.e, V, P, H,
                                     &(tpk_embedding_desc){.sequence_parallel = sp}));
    CHECK_OK(ctx,
             tpk_layernorm_init(ctx, &c.ln, H,
                                &(tpk_layernorm_desc){.name = "ln_f", .sequence_parallel = sp}));
    CHECK_OK(ctx, tpk_col_linear_init(ctx, &c.head, H, V,
                                      &(tpk_linear_desc){.name = "lm_head",
                                                         .weight = c.e.wte + 1,
                                                         .sequence_parallel = sp}));
    CHECK_OK(ctx, tpk_xent_init(
                      ctx, &c.ce, V,
                      &(tpk_xent_desc){.label_smoothing = eps, .chunk_rows = mode == 2 ? 3 : 0}));
    if (test__fails_case > f0) return 1;
    test_set_weights(ctx, 99, 0.5f);
    tpk_tensor y0, y1, z, dz, dy1, dy0;
    memset(&dz, 0, sizeof dz), memset(&dy1, 0, sizeof dy1), memset(&dy0, 0, sizeof dy0);
    CHECK_OK(ctx, tpk_embedding_forward(ctx, &c.e, ids, B, S, &y0));
    CHECK_OK(ctx, tpk_layernorm_forward(ctx, &c.ln, y0, &y1));
    CHECK_OK(ctx, tpk_col_linear_forward(ctx, &c.head, y1, &z));
    if (test__fails_case > f0) return 1;
    /* double reference of the loss from the gathered logits */
    float *zg = malloc(sizeof(float) * T * V);
    tpk_tensor g = {0};
    g.data = zg;
    CHECK_OK(ctx, tpk_convert(ctx, &z, TPK_R, &g));
    double sum = 0;
    int counted = 0;
    for (int t = 0; t < T; t++) {
        if (tg[t] == -100) continue;
        double m = -INFINITY, se = 0, sz = 0;
        for (int j = 0; j < V; j++) m = fmax(m, zg[t * V + j]);
        for (int j = 0; j < V; j++) se += exp(zg[t * V + j] - m), sz += zg[t * V + j];
        double lse = m + log(se);
        sum += (1 - eps) * (lse - zg[t * V + tg[t]]) + eps * (lse - sz / V);
        counted++;
    }
    o->ref_loss = sum / counted;
    free(zg);
    tpk_comm_stats_reset(&ctx->tp);
    if (mode) CHECK_OK(ctx, tpk_xent_forward_deferred(ctx, &c.ce, z, tg));
    else CHECK_OK(ctx, tpk_xent_forward(ctx, &c.ce, z, tg, &o->loss));
    o->ce_fwd = ctx->tp.stats;
    if (!mode) { /* loss = NULL: the mean stays in backend memory, summed over such forwards until
                    read */
        float now = NAN;
        double sum = NAN;
        int64_t n = -1;
        CHECK_OK(ctx, tpk_xent_forward(ctx, &c.ce, z, tg, NULL));
        CHECK_OK(ctx, tpk_xent_forward(ctx, &c.ce, z, tg, &now)); /* read at once: not in the sum */
        CHECK_OK(ctx, tpk_xent_forward(ctx, &c.ce, z, tg, NULL));
        CHECK_OK(ctx, tpk_xent_loss_read(ctx, &c.ce, &sum, &n));
        CHECK(now == o->loss && n == 2 && sum == 2.0 * (double)o->loss,
              "loss %.9g, again %.9g; the sum of %lld forwards %.17g", (double)o->loss, (double)now,
              (long long)n, sum);
        CHECK_OK(ctx, tpk_xent_loss_read(ctx, &c.ce, &sum, &n));
        CHECK(n == 0 && sum == 0.0, "a read starts the sum again: %lld forwards, %g", (long long)n,
              sum);
        CHECK_OK(ctx, tpk_xent_forward(ctx, &c.ce, z, tg, NULL));
        tpk_xent_loss_reset(&c.ce);
        CHECK_OK(ctx, tpk_xent_forward(ctx, &c.ce, z, tg, NULL));
        CHECK_OK(ctx, tpk_xent_loss_read(ctx, &c.ce, &sum, NULL));
        CHECK(sum == (double)o->loss, "after a reset: %.17g, the loss %.9g", sum, (double)o->loss);
        /* deferred forwards settled without a backward: by the next forward, by a read; a reset
         * drops a pending one */
        CHECK_OK(ctx, tpk_xent_forward_deferred(ctx, &c.ce, z, tg));
        CHECK_OK(ctx, tpk_xent_forward(ctx, &c.ce, z, tg, NULL));
        CHECK_OK(ctx, tpk_xent_loss_read(ctx, &c.ce, &sum, &n));
        CHECK(n == 2 && sum == 2.0 * (double)o->loss,
              "a deferred forward settled by the next: %lld forwards, %.17g", (long long)n, sum);
        CHECK_OK(ctx, tpk_xent_forward_deferred(ctx, &c.ce, z, tg));
        tpk_xent_loss_reset(&c.ce);
        CHECK_OK(ctx, tpk_xent_loss_read(ctx, &c.ce, &sum, &n));
        CHECK(n == 0 && sum == 0.0, "a reset drops a pending deferred forward: %lld forwards, %g",
              (long long)n, sum);
        CHECK_OK(ctx, tpk_xent_forward_deferred(ctx, &c.ce, z, tg));
        CHECK_OK(ctx, tpk_xent_settle(ctx, &c.ce));
        CHECK_OK(ctx, tpk_xent_settle(ctx, &c.ce)); /* nothing pending: nothing done */
        CHECK_OK(ctx, tpk_xent_loss_read(ctx, &c.ce, &sum, &n));
        CHECK(n == 1 && sum == (double)o->loss,
              "a deferred forward settled alone: %lld forwards, %.17g", (long long)n, sum);
    }
    tpk_comm_stats_reset(&ctx->tp);
    CHECK_OK(ctx, tpk_xent_backward(ctx, &c.ce, 1.0f, &dz));
    o->ce_bwd = ctx->tp.stats;
    if (mode) {
        double sum = NAN;
        int64_t n = -1;
        CHECK_OK(ctx, tpk_xent_loss_read(ctx, &c.ce, &sum, &n));
        CHECK(n == 1, "deferred: %lld forwards in the sum, expected 1", (long long)n);
        o->loss = (float)sum;
    }
    CHECK_OK(ctx, tpk_col_linear_backward(ctx, &c.head, dz, &dy1));
    CHECK_OK(ctx, tpk_layernorm_backward(ctx, &c.ln, dy1, &dy0));
    CHECK_OK(ctx, tpk_embedding_backward(ctx, &c.e, dy0));
    CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
    o->n = test_gather_grads(ctx, o->grad, 8);
    tpk_embedding_destroy(ctx, &c.e), tpk_layernorm_destroy(ctx, &c.ln),
        tpk_linear_destroy(ctx, &c.head), tpk_xent_destroy(ctx, &c.ce);
    return test__fails_case > f0;
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    int32_t ids[T], tg[T];
    for (int t = 0; t < T; t++)
        ids[t] = (int32_t)((t * 131 + 7) % V), tg[t] = (int32_t)((t * 57 + 300) % V);
    tg[3] = -100, tg[8] = -100; /* ignored positions */
    ids[4] = ids[1];            /* a repeated token: its wte row gets two contributions */

    for (int sp = 0; sp < 2; sp++)
        for (int k = 0; k < 2; k++) {
            float eps = k ? 0.1f : 0.0f;
            TEST_CASE(
                "embedding -> layernorm -> tied head -> cross-entropy, V=%d%s, smoothing %.1f: "
                "matches the unsharded chain",
                V, sp ? " SP" : "", (double)eps) {
                tpk_ctx sh, ref;
                tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np});
                tpk_ctx_init(&ref, &(tpk_ctx_desc){0});
                out a, b, d[2];
                memset(&a, 0, sizeof a), memset(&b, 0, sizeof b), memset(d, 0, sizeof d);
                if (!run_chain(&sh, sp, eps, ids, tg, &a, 0) &&
                    !run_chain(&ref, sp, eps, ids, tg, &b, 0)) {
                    CHECK(fabs(a.loss - b.loss) <= 1e-5 * fabs(b.loss), "loss %.8g, unsharded %.8g",
                          (double)a.loss, (double)b.loss);
                    CHECK(fabs(a.loss - a.ref_loss) <= 1e-5 * fabs(a.ref_loss),
                          "loss %.8g, double log-sum-exp reference %.8g", (double)a.loss,
                          a.ref_loss);
                    for (int i = 0; i < a.n; i++) {
                        char what[160];
                        snprintf(what, sizeof what, "gradient of %s", sh.params.list[i].name);
                        CHECK_CLOSE(a.grad[i], b.grad[i], tpk_param_global_numel(&sh, i), 1e-5,
                                    what);
                    }
                    uint64_t calls = 0, want = np > 1;
                    for (int q = 0; q < TPK_COLL_N; q++) calls += a.ce_fwd.calls[q];
                    CHECK(a.ce_fwd.calls[TPK_COLL_ALLGATHER] == want && calls == want,
                          "cross-entropy forward: %llu collectives, expected %llu all-gather",
                          (unsigned long long)calls, (unsigned long long)want);
                    CHECK(a.ce_fwd.elems[TPK_COLL_ALLGATHER] ==
                              (np > 1 ? 4u * T * (unsigned)np : 0),
                          "cross-entropy forward gathered %llu elements, expected 4 T t",
                          (unsigned long long)a.ce_fwd.elems[TPK_COLL_ALLGATHER]);
                    calls = 0;
                    for (int q = 0; q < TPK_COLL_N; q++) calls += a.ce_bwd.calls[q];
                    CHECK(calls == 0, "cross-entropy backward: %llu collectives, expected none",
                          (unsigned long long)calls);
                    for (int m = 1; m <= 2; m++) { /* deferred (fused at t = 1), in one pass and in
                                                      chunks of 3 rows: the same bits */
                        out *o = &d[m - 1];
                        tpk_ctx s2;
                        tpk_ctx_init(&s2, &(tpk_ctx_desc){.world = &world, .tp = np});
                        int failed = run_chain(&s2, sp, eps, ids, tg, o, m);
                        tpk_ctx_destroy(&s2);
                        if (failed) continue;
                        CHECK(memcmp(&o->loss, &a.loss, sizeof a.loss) == 0,
                              "deferred%s: loss %.9g, forward then backward %.9g",
                              m == 2 ? " in chunks" : "", (double)o->loss, (double)a.loss);
                        int bad = 0;
                        for (int i = 0; i < a.n; i++)
                            bad += memcmp(o->grad[i], a.grad[i],
                                          sizeof(float) * tpk_param_global_numel(&sh, i)) != 0;
                        CHECK(bad == 0,
                              "deferred%s: %d gradients differ from forward then backward",
                              m == 2 ? " in chunks" : "", bad);
                        uint64_t cf = 0, cb = 0, wb = np > 1 ? (m == 2 ? (T + 2) / 3 : 1) : 0;
                        for (int q = 0; q < TPK_COLL_N; q++)
                            cf += o->ce_fwd.calls[q], cb += o->ce_bwd.calls[q];
                        CHECK(
                            cf == 0 && cb == wb && o->ce_bwd.calls[TPK_COLL_ALLGATHER] == wb,
                            "deferred%s: %llu collectives forward, %llu backward, expected 0, %llu",
                            m == 2 ? " in chunks" : "", (unsigned long long)cf,
                            (unsigned long long)cb, (unsigned long long)wb);
                    }
                }
                test_free_grads(a.grad, &a.n), test_free_grads(b.grad, &b.n),
                    test_free_grads(d[0].grad, &d[0].n), test_free_grads(d[1].grad, &d[1].n);
                tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
            }
        }

    TEST_CASE(
        "label smoothing over the global vocabulary: the loss is the same at t = %d as at t = 1",
        np) {
        /* the per-shard mistake (mean over the local vocabulary) would change the loss with t */
        tpk_ctx sh, ref;
        tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np});
        tpk_ctx_init(&ref, &(tpk_ctx_desc){0});
        out a = {0}, b = {0};
        if (!run_chain(&sh, false, 0.3f, ids, tg, &a, 0) &&
            !run_chain(&ref, false, 0.3f, ids, tg, &b, 0))
            CHECK(fabs(a.loss - b.loss) <= 1e-5 * fabs(b.loss) &&
                      fabs(a.loss - a.ref_loss) <= 1e-5 * a.ref_loss,
                  "%.8g vs %.8g vs %.8g", (double)a.loss, (double)b.loss, a.ref_loss);
        test_free_grads(a.grad, &a.n), test_free_grads(b.grad, &b.n);
        tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
    }

    TEST_CASE("bad input: token ids, targets, sequence length, hidden size") {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np});
        tpk_embedding e;
        tpk_layernorm ln;
        tpk_xent ce;
        tpk_tensor y;
        CHECK_OK(&ctx, tpk_embedding_init(&ctx, &e, V, P, H, NULL));
        CHECK_OK(&ctx, tpk_layernorm_init(&ctx, &ln, H, NULL));
        CHECK_OK(&ctx, tpk_xent_init(&ctx, &ce, V, NULL));
        int32_t bad[T];
        memcpy(bad, ids, sizeof bad);
        bad[3] = V;
        CHECK_FAILS(&ctx, tpk_embedding_forward(&ctx, &e, bad, B, S, &y), TPK_ERR_ARG,
                    "ids[3] = 509");
        bad[3] = -1;
        CHECK_FAILS(&ctx, tpk_embedding_forward(&ctx, &e, bad, B, S, &y), TPK_ERR_ARG,
                    "ids[3] = -1");
        int32_t longer[P + 1] = {0};
        CHECK_FAILS(&ctx, tpk_embedding_forward(&ctx, &e, longer, 1, P + 1, &y), TPK_ERR_SHAPE,
                    "longer than the position table");
        float zb[T * 3];
        test_randn(zb, T * 3, 1, 1);
        tpk_tensor z = tpk_tensor_shard_2d(zb, TPK_F32, T, V, TPK_S(-1), np, me);
        int32_t badt[T];
        memcpy(badt, tg, sizeof badt);
        badt[2] = V + 5;
        float *zbig = malloc(sizeof(float) * T * V);
        test_randn(zbig, (size_t)T * V, 2, 1);
        z.data = zbig;
        float loss;
        CHECK_FAILS(&ctx, tpk_xent_forward(&ctx, &ce, z, badt, &loss), TPK_ERR_ARG,
                    "targets[2] = 514");
        tpk_tensor zr = tpk_tensor_2d(zbig, TPK_F32, T, V, TPK_R);
        CHECK_FAILS(&ctx, tpk_xent_forward(&ctx, &ce, zr, tg, &loss), TPK_ERR_LAYOUT,
                    "z: expected layout S(-1), got R");
        CHECK_FAILS(&ctx, tpk_xent_loss_read(&ctx, &ce, NULL, NULL), TPK_ERR_ARG,
                    "tpk_xent_loss_read: sum: NULL");
        /* hidden 6, the layernorm has 8 */
        tpk_tensor narrow = tpk_tensor_2d(zb, TPK_F32, T, 6, TPK_R);
        CHECK_FAILS(&ctx, tpk_layernorm_forward(&ctx, &ln, narrow, &y), TPK_ERR_SHAPE,
                    "x: expected global shape");
        CHECK_FAILS(&ctx, tpk_xent_init(&ctx, &ce, V, &(tpk_xent_desc){.label_smoothing = 1.5f}),
                    TPK_ERR_ARG, "label_smoothing");
        tpk_linear head;
        CHECK_FAILS(&ctx,
                    tpk_col_linear_init(&ctx, &head, H + 1, V,
                                        &(tpk_linear_desc){.name = "h", .weight = e.wte + 1}),
                    TPK_ERR_SHAPE, "desc->weight");
        free(zbig);
        tpk_embedding_destroy(&ctx, &e), tpk_layernorm_destroy(&ctx, &ln),
            tpk_xent_destroy(&ctx, &ce);
        tpk_ctx_destroy(&ctx);
    }
    tpk_comm_destroy(&world);
    return test_finish();
}
