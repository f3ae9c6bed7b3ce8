/* tests/test_gpt2.c — head-parallel attention, the MLP, the GPT-2 block and the whole GPT-2
 * model, sharded over t = ranks against the unsharded layer on every rank (outputs, input
 * gradients and every gathered parameter gradient to relative 1e-5), with and without
 * sequence parallelism and dropout; A = 6 heads (uneven at t = 4), A = 2 (t > A: ranks with no
 * head), V = 509, T = 14 tokens (uneven sequence-parallel slices). Also: finite differences
 * per layer on the sharded layer, the collective counts per block (2 all-reduces of T H each
 * way, or 2 all-gathers + 2 reduce-scatters under SP), SP on = SP off, dropout masks the same
 * at every t and changing with the step, the model over weighted TP splits (tests/tp_layer.h:
 * test_weighted), and bad input. */
#include "tp_layer.h"

static int me, np;
static tpk_comm world;
enum { B = 2, S = 7, T = B * S, H = 24, V = 509, P = 16 };

enum { K_ATTN, K_MLP, K_BLOCK };
static const char *kind_name[] = {"attention", "MLP", "GPT-2 block"};

typedef struct layer {
    int kind;
    tpk_attention a;
    tpk_mlp m;
    tpk_block b;
} layer;

/* the layer under test (tests/tp_layer.h): arg = A heads */
static tpk_status layer_init(tpk_ctx *ctx, void *lv, int kind, int64_t A, bool sp, float p) {
    layer *l = (layer *)lv;
    memset(l, 0, sizeof *l);
    l->kind = kind;
    if (kind == K_ATTN)
        return tpk_attention_init(
            ctx, &l->a, H, A,
            &(tpk_attention_desc){.name = "attn", .sequence_parallel = sp, .dropout = p});
    if (kind == K_MLP)
        return tpk_mlp_init(ctx, &l->m, H, &(tpk_mlp_desc){.name = "mlp", .sequence_parallel = sp});
    return tpk_gpt2_block_init(
        ctx, &l->b, H,
        &(tpk_gpt2_block_desc){.name = "h.0", .heads = A, .sequence_parallel = sp, .dropout = p});
}
static tpk_status layer_fwd(tpk_ctx *ctx, void *lv, tpk_tensor x, tpk_tensor *y) {
    layer *l = (layer *)lv;
    if (l->kind == K_ATTN) return tpk_attention_forward(ctx, &l->a, x, B, S, y);
    if (l->kind == K_MLP) return tpk_mlp_forward(ctx, &l->m, x, y);
    return tpk_block_forward(ctx, &l->b, x, B, S, y);
}
static bool block_inplace; /* the block's backward in place (as the model runs it) */
static float dy_copy[T * H];
static tpk_status layer_bwd(tpk_ctx *ctx, void *lv, tpk_tensor dy, tpk_tensor *dx) {
    layer *l = (layer *)lv;
    if (l->kind == K_ATTN) return tpk_attention_backward(ctx, &l->a, dy, dx);
    if (l->kind == K_MLP) return tpk_mlp_backward(ctx, &l->m, dy, dx);
    if (block_inplace) { /* the model's form, on a copy of dy: dx comes back in that buffer */
        tpk_tensor d = dy;
        d.data = dy_copy;
        memcpy(dy_copy, dy.data, sizeof(float) * (size_t)tpk_numel(&dy));
        return tpk__block_backward(ctx, "tpk_block_backward", &l->b, d, dx, true);
    }
    return tpk_block_backward(ctx, &l->b, dy, dx);
}
static void layer_destroy(tpk_ctx *ctx, void *lv) {
    layer *l = (layer *)lv;
    if (l->kind == K_ATTN) tpk_attention_destroy(ctx, &l->a);
    else if (l->kind == K_MLP) tpk_mlp_destroy(ctx, &l->m);
    else tpk_block_destroy(ctx, &l->b);
}
static layer storage;
static test_layer layer_case(int kind, int64_t A, bool sp, float p) {
    test_layer L = {layer_init, layer_fwd, layer_bwd, layer_destroy, &storage, kind, A, T,
                    H,          sp,        p};
    return L;
}
static tpk_tensor act(tpk_ctx *ctx, float *global, bool sp) {
    return test_act(ctx, global, T, H, sp);
}

static float xin[T * H], dyin[T * H];

/* ---- the model ---------------------------------------------------------------------------- */

static int32_t ids[T], tg[T];

static int run_model(tpk_ctx *ctx, const tpk_gpt2_config *cfg, uint64_t step,
                     test_model_result *o) {
    tpk_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.arch = TPK_ARCH_GPT2, mc.gpt2 = *cfg;
    return test_run_model(ctx, &mc, step, ids, tg, B, S, o);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    test_randn(xin, T * H, 1, 1.0f);
    test_randn(dyin, T * H, 2, 1.0f);
    for (int t = 0; t < T; t++)
        ids[t] = (int32_t)((t * 131 + 7) % V), tg[t] = (int32_t)((t * 57 + 300) % V);
    tg[5] = -100;

    /* each layer against the unsharded layer */
    for (int kind = 0; kind < 3; kind++)
        for (int sp = 0; sp < 2; sp++)
            for (int pi = 0; pi < 2; pi++) {
                float p = pi ? 0.1f : 0.0f;
                if (kind == K_MLP && pi) continue; /* the MLP has no dropout of its own */
                int64_t As[2] = {6, 2};
                for (int ai = 0; ai < (kind == K_MLP ? 1 : 2); ai++) {
                    int64_t A = As[ai];
                    TEST_CASE(
                        "%s%s, A=%lld, dropout %.1f: output, dx and every gradient match the "
                        "unsharded layer; %s collectives",
                        kind_name[kind], sp ? " SP" : "", (long long)A, (double)p,
                        kind == K_BLOCK ? "2+2" : "1+1") {
                        tpk_ctx sh, ref;
                        tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
                        tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 5});
                        test_layer L = layer_case(kind, A, sp, p);
                        test_layer_result a = {0}, b = {0};
                        if (!test_run_layer(&sh, &L, xin, dyin, &a) &&
                            !test_run_layer(&ref, &L, xin, dyin, &b)) {
                            test_compare_layers(&sh, &L, &a, &b);
                            int n = kind == K_BLOCK ? 2 : 1;
                            test_check_counts(&a.fwd, sp, n, T * H, "forward");
                            test_check_counts(&a.bwd, sp, n, T * H, "backward");
                        }
                        test_layer_result_free(&a), test_layer_result_free(&b);
                        tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
                    }
                }
            }

    for (int kind = 0; kind < 3; kind++)
        for (int sp = 0; sp < 2; sp++) {
            float p = kind == K_MLP ? 0.0f : 0.1f;
            TEST_CASE("%s%s%s: finite differences of the sharded layer match its backward",
                      kind_name[kind], sp ? " SP" : "", p > 0 ? ", dropout 0.1" : "") {
                tpk_ctx sh;
                tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
                test_layer L = layer_case(kind, 6, sp, p);
                test_layer_fd(&sh, &L, xin, dyin, 3);
                tpk_ctx_destroy(&sh);
            }
        }

    for (int sp = 0; sp < 2; sp++)
        for (int pi = 0; pi < 2; pi++)
            TEST_CASE(
                "GPT-2 block%s, dropout %.1f: the backward in place (the model's: each norm adds "
                "its dx onto dy's buffer, no add and no copy) equals "
                "the backward apart bit for bit",
                sp ? " SP" : "", pi ? 0.1 : 0.0) {
                test_block_inplace(&world, np, layer_case(K_BLOCK, 6, sp, pi ? 0.1f : 0.0f),
                                   &block_inplace, xin, dyin);
            }

    TEST_CASE(
        "GPT-2 block with dropout 0.1: SP on and off give the same numbers; the masks change with "
        "the step") {
        tpk_ctx c1, c2, c3;
        tpk_ctx_init(&c1, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
        tpk_ctx_init(&c2, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
        tpk_ctx_init(&c3, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
        c3.rng_step = 1;
        test_layer L = layer_case(K_BLOCK, 6, false, 0.1f),
                   Lsp = layer_case(K_BLOCK, 6, true, 0.1f);
        test_layer_result a = {0}, b = {0}, c = {0};
        if (!test_run_layer(&c1, &L, xin, dyin, &a) && !test_run_layer(&c2, &Lsp, xin, dyin, &b) &&
            !test_run_layer(&c3, &L, xin, dyin, &c)) {
            test_compare_layers(&c1, &L, &a, &b);
            CHECK(test_relerr(c.y, a.y, T * H) > 1e-3, "step 1 gave the output of step 0");
        }
        test_layer_result_free(&a), test_layer_result_free(&b), test_layer_result_free(&c);
        tpk_ctx_destroy(&c1), tpk_ctx_destroy(&c2), tpk_ctx_destroy(&c3);
    }

    /* the whole model */
    for (int sp = 0; sp < 2; sp++)
        for (int pi = 0; pi < 2; pi++)
            for (int si = 0; si < 2; si++) {
                float p = pi ? 0.1f : 0.0f, eps = si ? 0.1f : 0.0f;
                if (pi && si) continue;
                TEST_CASE(
                    "GPT-2 model (L=2, H=%d, A=6, V=%d padded to shards of a multiple of 64)%s, "
                    "dropout %.1f, smoothing %.1f: loss and every "
                    "gradient match the unsharded, unpadded model",
                    H, V, sp ? " SP" : "", (double)p, (double)eps) {
                    tpk_gpt2_config cfg = {.vocab = V,
                                           .positions = P,
                                           .layers = 2,
                                           .hidden = H,
                                           .heads = 6,
                                           .dropout = p,
                                           .label_smoothing = eps,
                                           .sequence_parallel = sp};
                    tpk_gpt2_config unpadded = cfg;
                    unpadded.vocab_multiple = -1;
                    tpk_ctx sh, ref;
                    tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3});
                    tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 3});
                    test_model_result a = {0}, b = {0};
                    if (!run_model(&sh, &cfg, 4, &a) && !run_model(&ref, &unpadded, 4, &b)) {
                        test_compare_models(&sh, &a, &b, 1e-5, 1e-5);
                        /* per model: 2 per block + embedding (1) forward; the head, 2 per block
                         * backward; plus the cross-entropy's all-gather forward (none at t = 1);
                         * under SP the backward also all-gathers the head's and each column
                         * linear's input again (2 per block + 1) */
                        uint64_t L = 2, fwd = test_total_calls(&a.fwd),
                                 bwd = test_total_calls(&a.bwd), xg = np > 1;
                        if (!sp) {
                            CHECK(
                                a.fwd.calls[TPK_COLL_ALLREDUCE] == 2 * L + 1 &&
                                    a.fwd.calls[TPK_COLL_ALLGATHER] == xg && fwd == 2 * L + 1 + xg,
                                "forward: %llu collectives, expected %llu all-reduces and %llu "
                                "all-gather",
                                (unsigned long long)fwd, (unsigned long long)(2 * L + 1),
                                (unsigned long long)xg);
                            CHECK(a.bwd.calls[TPK_COLL_ALLREDUCE] == 2 * L + 1 && bwd == 2 * L + 1,
                                  "backward: %llu collectives, expected %llu all-reduces",
                                  (unsigned long long)bwd, (unsigned long long)(2 * L + 1));
                        } else {
                            CHECK(a.fwd.calls[TPK_COLL_ALLGATHER] == 2 * L + 1 + xg &&
                                      a.fwd.calls[TPK_COLL_REDUCE_SCATTER] == 2 * L + 1 &&
                                      a.fwd.calls[TPK_COLL_ALLREDUCE] == 0 && fwd == 4 * L + 2 + xg,
                                  "SP forward: %llu collectives", (unsigned long long)fwd);
                            CHECK(a.bwd.calls[TPK_COLL_ALLGATHER] == 4 * L + 2 &&
                                      a.bwd.calls[TPK_COLL_REDUCE_SCATTER] == 2 * L + 1 &&
                                      bwd == 6 * L + 3,
                                  "SP backward: %llu collectives", (unsigned long long)bwd);
                        }
                    }
                    test_model_result_free(&a), test_model_result_free(&b);
                    tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
                }
            }

    for (int sp = 0; sp < 2; sp++)
        for (int pad = 0; pad < 2; pad++)
            TEST_CASE(
                "GPT-2 model (L=2, A=6, V=%d %s, dropout 0.1)%s over TP weights 2 | 3:1 | 3:1:2 | "
                "1:2:3:4 at t=%d: the heads and the vocabulary "
                "split by weight; loss and every gradient match the unsharded model",
                V, pad ? "padded: units of 64 rows" : "unpadded", sp ? " SP" : "", np) {
                tpk_model_config mc, ref;
                memset(&mc, 0, sizeof mc);
                mc.arch = TPK_ARCH_GPT2;
                mc.gpt2 = (tpk_gpt2_config){.vocab = V,
                                            .positions = P,
                                            .layers = 2,
                                            .hidden = H,
                                            .heads = 6,
                                            .dropout = 0.1f,
                                            .sequence_parallel = sp,
                                            .vocab_multiple = pad ? 0 : -1};
                ref = mc;
                ref.gpt2.vocab_multiple = -1, ref.gpt2.sequence_parallel = false;
                test_weighted(&world, np, &mc, &ref, ids, tg, B, S);
            }

    TEST_CASE(
        "GPT-2 model with dropout 0.1: SP on = SP off; dropout changes the loss; t > A (A=%d "
        "heads) works",
        np > 1 ? np - 1 : 1) {
        tpk_gpt2_config cfg = {
            .vocab = V, .positions = P, .layers = 2, .hidden = H, .heads = 6, .dropout = 0.1f};
        tpk_ctx c1, c2;
        tpk_ctx_init(&c1, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3});
        tpk_ctx_init(&c2, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3});
        test_model_result a = {0}, b = {0}, c = {0}, d = {0};
        tpk_gpt2_config spc = cfg;
        spc.sequence_parallel = true;
        if (!run_model(&c1, &cfg, 9, &a) && !run_model(&c2, &spc, 9, &b)) {
            CHECK(fabsf(a.loss - b.loss) <= 1e-5f * fabsf(b.loss), "loss %.8g, with SP %.8g",
                  (double)a.loss, (double)b.loss);
            for (int i = 0; i < a.n; i++)
                CHECK_CLOSE(a.grad[i], b.grad[i], tpk_param_global_numel(&c1, i), 1e-5,
                            c1.params.list[i].name);
        }
        tpk_gpt2_config nod = cfg;
        nod.dropout = 0;
        tpk_ctx c3, c4;
        tpk_ctx_init(&c3, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3});
        if (!run_model(&c3, &nod, 9, &c))
            CHECK(fabsf(a.loss - c.loss) > 1e-4f,
                  "loss with dropout %.8g equals the loss without %.8g", (double)a.loss,
                  (double)c.loss);
        /* fewer heads than ranks: ranks without a head contribute zeros */
        tpk_gpt2_config few = cfg;
        few.heads = np > 1 ? np - 1 : 1;
        few.hidden = 12 * few.heads;
        tpk_ctx_init(&c4, &(tpk_ctx_desc){.seed = 3});
        test_model_result e = {0};
        tpk_ctx c5;
        tpk_ctx_init(&c5, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3});
        if (!run_model(&c5, &few, 2, &d) && !run_model(&c4, &few, 2, &e)) {
            CHECK(fabsf(d.loss - e.loss) <= 1e-5f * fabsf(e.loss), "loss %.8g, unsharded %.8g",
                  (double)d.loss, (double)e.loss);
            for (int i = 0; i < d.n; i++)
                CHECK_CLOSE(d.grad[i], e.grad[i], tpk_param_global_numel(&c5, i), 1e-5,
                            c5.params.list[i].name);
        }
        test_model_result_free(&a), test_model_result_free(&b), test_model_result_free(&c),
            test_model_result_free(&d), test_model_result_free(&e);
        tpk_ctx_destroy(&c1), tpk_ctx_destroy(&c2), tpk_ctx_destroy(&c3), tpk_ctx_destroy(&c4),
            tpk_ctx_destroy(&c5);
    }

    for (int rc = TPK_RECOMPUTE_FULL; rc <= TPK_RECOMPUTE_SELECTIVE; rc++)
        for (int sp = 0; sp < 2; sp++)
            for (int bf = 0; bf < 2; bf++)
                TEST_CASE(
                    "GPT-2 model (L=4, dropout 0.1%s%s) with %s activation recompute at t=%d: loss "
                    "and every gradient bit-identical, peak memory lower",
                    sp ? ", SP" : "", bf ? ", bf16" : "", tpk_recompute_name((tpk_recompute)rc),
                    np) {
                    tpk_model_config mc;
                    memset(&mc, 0, sizeof mc);
                    mc.arch = TPK_ARCH_GPT2;
                    mc.gpt2 = (tpk_gpt2_config){.vocab = V,
                                                .positions = P,
                                                .layers = 4,
                                                .hidden = H,
                                                .heads = 6,
                                                .dropout = 0.1f,
                                                .sequence_parallel = sp};
                    test_recompute(&world, np, bf ? TPK_BF16 : TPK_F32, &mc, (tpk_recompute)rc, ids,
                                   tg, B, S);
                }

    for (int sp = 0; sp < 2; sp++)
        for (int bf = 0; bf < 2; bf++)
            TEST_CASE(
                "GPT-2 model (L=2, dropout 0.1%s%s) at t=%d: the loss deferred to the backward "
                "(fused) equals forward then backward bit for bit",
                sp ? ", SP" : "", bf ? ", bf16" : "", np) {
                tpk_model_config mc;
                memset(&mc, 0, sizeof mc);
                mc.arch = TPK_ARCH_GPT2;
                mc.gpt2 = (tpk_gpt2_config){.vocab = V,
                                            .positions = P,
                                            .layers = 2,
                                            .hidden = H,
                                            .heads = 6,
                                            .dropout = 0.1f,
                                            .label_smoothing = 0.1f,
                                            .sequence_parallel = sp};
                test_deferred(&world, np, bf ? TPK_BF16 : TPK_F32, &mc, ids, tg, B, S);
            }

    for (int sp = 0; sp < 2; sp++)
        TEST_CASE(
            "GPT-2 model in bf16 (mixed precision)%s at t=%d: loss and every gradient within bf16 "
            "tolerance of the f32 model",
            sp ? " SP" : "", np) {
            tpk_gpt2_config cfg = {.vocab = V,
                                   .positions = P,
                                   .layers = 2,
                                   .hidden = H,
                                   .heads = 6,
                                   .dropout = 0.1f,
                                   .sequence_parallel = sp};
            tpk_ctx c16, c32;
            tpk_ctx_init(&c16,
                         &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3, .dtype = TPK_BF16});
            tpk_ctx_init(&c32, &(tpk_ctx_desc){.seed = 3});
            test_model_result a = {0}, b = {0};
            if (!run_model(&c16, &cfg, 4, &a) && !run_model(&c32, &cfg, 4, &b)) {
                test_compare_models(&c16, &a, &b, 1e-2, 5e-2);
                CHECK(fabsf(a.loss - b.loss) > 0,
                      "the bf16 loss equals the f32 loss exactly: is bf16 in use?");
            }
            test_model_result_free(&a), test_model_result_free(&b);
            tpk_ctx_destroy(&c16), tpk_ctx_destroy(&c32);
        }

    TEST_CASE(
        "bad input: heads, hidden sizes, token rows, model config, labels, sequence length, "
        "backward before forward") {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np});
        tpk_attention at;
        tpk_block blk;
        tpk_gpt2 m;
        tpk_tensor y;
        CHECK_FAILS(&ctx, tpk_attention_init(&ctx, &at, 25, 6, NULL), TPK_ERR_SHAPE,
                    "H: expected a positive multiple of A = 6, got 25");
        CHECK_FAILS(&ctx,
                    tpk_attention_init(&ctx, &at, H, 6, &(tpk_attention_desc){.dropout = 1.0f}),
                    TPK_ERR_ARG, "desc->dropout");
        CHECK_OK(&ctx, tpk_attention_init(&ctx, &at, H, 6, NULL));
        CHECK_FAILS(&ctx, tpk_attention_backward(&ctx, &at, act(&ctx, dyin, false), &y),
                    TPK_ERR_ARG, "backward before forward");
        CHECK_FAILS(&ctx, tpk_attention_forward(&ctx, &at, act(&ctx, xin, false), B, S + 1, &y),
                    TPK_ERR_SHAPE, "B x S = 16 token rows, got 14");
        tpk_tensor narrow = tpk_tensor_2d(xin, TPK_F32, T, H - 6, TPK_R);
        CHECK_FAILS(&ctx, tpk_attention_forward(&ctx, &at, narrow, B, S, &y), TPK_ERR_SHAPE,
                    "x: expected global shape [-1, 24]");
        CHECK_FAILS(&ctx, tpk_attention_forward(&ctx, &at, act(&ctx, xin, true), B, S, &y),
                    TPK_ERR_LAYOUT, "expected layout R");
        CHECK_FAILS(&ctx, tpk_gpt2_block_init(&ctx, &blk, H, NULL), TPK_ERR_ARG,
                    "desc->heads is required");
        CHECK_OK(&ctx, tpk_gpt2_block_init(&ctx, &blk, H, &(tpk_gpt2_block_desc){.heads = 6}));
        CHECK_FAILS(&ctx, tpk_block_forward(&ctx, &blk, narrow, B, S, &y), TPK_ERR_SHAPE,
                    "x: expected global shape [-1, 24]");
        CHECK_FAILS(&ctx, tpk_block_backward(&ctx, &blk, act(&ctx, dyin, false), &y),
                    TPK_ERR_ARG, "backward before forward");
        CHECK_FAILS(
            &ctx,
            tpk_gpt2_init(&ctx, &m,
                          &(tpk_gpt2_config){
                              .vocab = V, .positions = P, .layers = 1, .hidden = 20, .heads = 6}),
            TPK_ERR_ARG, "cfg->hidden");
        tpk_gpt2_config cfg = {.vocab = V, .positions = P, .layers = 1, .hidden = H, .heads = 6};
        CHECK_OK(&ctx, tpk_gpt2_init(&ctx, &m, &cfg));
        float loss;
        CHECK_FAILS(&ctx, tpk_lm_backward(&ctx, &m.lm, 1.0f), TPK_ERR_ARG,
                    "backward needs a forward");
        int32_t bad[T];
        memcpy(bad, tg, sizeof bad);
        bad[4] = V;
        CHECK_FAILS(&ctx, tpk_lm_forward(&ctx, &m.lm, ids, bad, B, S, &loss), TPK_ERR_ARG,
                    "targets[4] = 509");
        memcpy(bad, ids, sizeof bad);
        bad[2] = -3;
        CHECK_FAILS(&ctx, tpk_lm_forward(&ctx, &m.lm, bad, tg, B, S, &loss), TPK_ERR_ARG,
                    "ids[2] = -3");
        static int32_t longer[P + 1];
        CHECK_FAILS(&ctx, tpk_lm_forward(&ctx, &m.lm, longer, longer, 1, P + 1, &loss),
                    TPK_ERR_SHAPE, "longer than the position table");
        CHECK_OK(&ctx, tpk_lm_forward(&ctx, &m.lm, ids, NULL, B, S, NULL)); /* logits only */
        CHECK(m.lm.logits.shape[1] == tpk_split(m.lm.embed.Vp, np, me).size &&
                  m.lm.logits.shape[1] % 64 == 0 && m.lm.logits.gshape[1] == m.lm.embed.Vp &&
                  m.lm.embed.Vp == tpk_vocab_padded(V, 64, np) && m.lm.logits.shape[0] == T,
              "logits [%lld, %lld]", (long long)m.lm.logits.shape[0],
              (long long)m.lm.logits.shape[1]);
        CHECK_FAILS(&ctx, tpk_lm_backward(&ctx, &m.lm, 1.0f), TPK_ERR_ARG,
                    "backward needs a forward");
        tpk_ctx badctx;
        CHECK_FAILS(&badctx, tpk_ctx_init(&badctx, &(tpk_ctx_desc){.dtype = TPK_I32}),
                    TPK_ERR_DTYPE, "desc->dtype: expected TPK_F32 or TPK_BF16, got i32");
        tpk_attention_destroy(&ctx, &at), tpk_block_destroy(&ctx, &blk),
            tpk_lm_destroy(&ctx, &m.lm);
        tpk_ctx_destroy(&ctx);
    }
    tpk_comm_destroy(&world);
    return test_finish();
}
