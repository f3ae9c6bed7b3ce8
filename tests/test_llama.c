/* tests/test_llama.c — the Llama parts: RMSNorm, the SwiGLU MLP, grouped-query attention with
 * rotary embeddings, the Llama block and the whole model, sharded over t = ranks against the
 * unsharded layer on every rank (outputs, input gradients and every gathered parameter gradient
 * to relative 1e-5), with and without sequence parallelism. A = 6 query heads and G = 2
 * key/value heads, so at t = 3 and 4 a key/value head is held by two ranks (its gradient summed
 * by tpk_params_reduce_partial_grads); also G = 1 (every rank holds the one key/value head),
 * G = A, V = 509, T = 14 tokens (uneven sequence-parallel slices). Also: finite differences per
 * layer, the collective counts per block (as GPT-2's: 2 all-reduces of T H each way, or 2
 * all-gathers + 2 reduce-scatters under SP), the gradient norm equal to the unsharded one, the
 * tied head, the model over weighted TP splits (tests/tp_layer.h: test_weighted), and bad input. */
#include "tp_layer.h"

static int me, np;
static tpk_comm world;
enum { B = 2, S = 7, T = B * S, H = 24, A = 6, F = 40, V = 509, P = 16 };

enum { K_RMS, K_MLP, K_ATTN, K_BLOCK, K_N };
static const char *kind_name[] = {"RMSNorm", "SwiGLU MLP", "GQA attention", "Llama block"};

typedef struct layer {
    int kind;
    tpk_rmsnorm r;
    tpk_swiglu_mlp m;
    tpk_gqa_attention a;
    tpk_block b;
} layer;

/* the layer under test (tests/tp_layer.h): arg = G key/value heads */
static tpk_status layer_init(tpk_ctx *ctx, void *lv, int kind, int64_t G, bool sp, float p) {
    layer *l = (layer *)lv;
    (void)p;
    memset(l, 0, sizeof *l);
    l->kind = kind;
    if (kind == K_RMS)
        return tpk_rmsnorm_init(
            ctx, &l->r, H,
            &(tpk_rmsnorm_desc){.name = "norm", .eps = 1e-5f, .sequence_parallel = sp});
    if (kind == K_MLP)
        return tpk_swiglu_mlp_init(
            ctx, &l->m, H,
            &(tpk_swiglu_mlp_desc){.name = "mlp", .hidden = F, .sequence_parallel = sp});
    if (kind == K_ATTN)
        return tpk_gqa_attention_init(
            ctx, &l->a, H, A,
            &(tpk_gqa_attention_desc){
                .name = "attn", .kv_heads = G, .rope_theta = 500.0f, .sequence_parallel = sp});
    return tpk_llama_block_init(ctx, &l->b, H,
                                &(tpk_llama_block_desc){.name = "model.layers.0",
                                                        .heads = A,
                                                        .kv_heads = G,
                                                        .ffn = F,
                                                        .sequence_parallel = sp});
}
static tpk_status layer_fwd(tpk_ctx *ctx, void *lv, tpk_tensor x, tpk_tensor *y) {
    layer *l = (layer *)lv;
    if (l->kind == K_RMS) return tpk_rmsnorm_forward(ctx, &l->r, x, y);
    if (l->kind == K_MLP) return tpk_swiglu_mlp_forward(ctx, &l->m, x, y);
    if (l->kind == K_ATTN) return tpk_gqa_attention_forward(ctx, &l->a, x, B, S, y);
    return tpk_block_forward(ctx, &l->b, x, B, S, y);
}
static bool block_inplace; /* the block's backward in place (as the model runs it) */
static float dy_copy[T * H];
static tpk_status layer_bwd(tpk_ctx *ctx, void *lv, tpk_tensor dy, tpk_tensor *dx) {
    layer *l = (layer *)lv;
    if (l->kind == K_RMS) return tpk_rmsnorm_backward(ctx, &l->r, dy, dx);
    if (l->kind == K_MLP) return tpk_swiglu_mlp_backward(ctx, &l->m, dy, dx);
    if (l->kind == K_ATTN) return tpk_gqa_attention_backward(ctx, &l->a, dy, dx);
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
    if (l->kind == K_RMS) tpk_rmsnorm_destroy(ctx, &l->r);
    else if (l->kind == K_MLP) tpk_swiglu_mlp_destroy(ctx, &l->m);
    else if (l->kind == K_ATTN) tpk_gqa_attention_destroy(ctx, &l->a);
    else tpk_block_destroy(ctx, &l->b);
}
static layer storage;
static test_layer layer_case(int kind, int64_t G, bool sp) {
    test_layer L = {layer_init, layer_fwd, layer_bwd, layer_destroy, &storage, kind, G,
                    T,          H,         sp,        0.0f};
    return L;
}
static tpk_tensor act(tpk_ctx *ctx, float *global, bool sp) {
    return test_act(ctx, global, T, H, sp);
}

static float xin[T * H], dyin[T * H];

/* ---- the model ---------------------------------------------------------------------------- */

static int32_t ids[T], tg[T];

static int run_model(tpk_ctx *ctx, const tpk_llama_config *cfg, test_model_result *o) {
    tpk_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.arch = TPK_ARCH_LLAMA, mc.llama = *cfg;
    return test_run_model(ctx, &mc, 0, ids, tg, B, S, o);
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

    TEST_CASE(
        "grouped layout: A=6 query heads over G=2 key/value heads at t=1..6: each rank holds the "
        "heads its queries read, each head owned once") {
        for (int t = 1; t <= 6; t++)
            for (int64_t G = 1; G <= 6; G++) {
                if (6 % G) continue;
                tpk_layout l = TPK_S_GROUPED(0, 4, (int)(6 / G));
                int64_t owned = 0;
                for (int r = 0; r < t; r++) {
                    tpk_range q = tpk_split(6, t, r), kv = tpk_shard_run(G * 4, l, t, r, 0),
                              own = tpk_shard_owned(G * 4, l, t, r);
                    int64_t g0, Gl = tpk_attn_kv_heads(6, G, q.off, q.size, &g0);
                    CHECK(kv.off == g0 * 4 && kv.size == Gl * 4,
                          "t=%d G=%lld rank %d: rows [%lld, +%lld), expected heads [%lld, +%lld)",
                          t, (long long)G, r, (long long)kv.off, (long long)kv.size, (long long)g0,
                          (long long)Gl);
                    for (int64_t h = q.off; h < q.off + q.size; h++)
                        CHECK(h / (6 / G) * 4 >= kv.off && h / (6 / G) * 4 < kv.off + kv.size,
                              "head %lld unread", (long long)h);
                    owned += own.size;
                }
                CHECK(owned == G * 4, "t=%d G=%lld: %lld rows owned, expected %lld", t,
                      (long long)G, (long long)owned, (long long)(G * 4));
            }
    }

    for (int kind = 0; kind < K_N; kind++)
        for (int sp = 0; sp < 2; sp++) {
            int64_t Gs[3] = {2, 1, 6};
            for (int gi = 0; gi < (kind >= K_ATTN ? 3 : 1); gi++) {
                int64_t G = Gs[gi];
                if (kind == K_BLOCK && gi == 2) continue;
                TEST_CASE(
                    "%s%s%s: output, dx, every gradient and the gradient norm match the unsharded "
                    "layer; %s collectives",
                    kind_name[kind], sp ? " SP" : "",
                    kind >= K_ATTN ? (G == 2   ? ", A=6 G=2"
                                      : G == 1 ? ", A=6 G=1"
                                               : ", A=6 G=6")
                                   : "",
                    kind == K_BLOCK ? "2+2"
                    : kind == K_RMS ? "no"
                                    : "1+1") {
                    tpk_ctx sh, ref;
                    tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
                    tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 5});
                    test_layer L = layer_case(kind, G, sp);
                    test_layer_result a = {0}, b = {0};
                    if (!test_run_layer(&sh, &L, xin, dyin, &a) &&
                        !test_run_layer(&ref, &L, xin, dyin, &b)) {
                        test_compare_layers(&sh, &L, &a, &b);
                        if (kind != K_RMS) {
                            int n = kind == K_BLOCK ? 2 : 1;
                            test_check_counts(&a.fwd, sp, n, T * H, "forward");
                            test_check_counts(&a.bwd, sp, n, T * H, "backward");
                        } else {
                            CHECK(test_total_calls(&a.fwd) + test_total_calls(&a.bwd) == 0,
                                  "RMSNorm made collectives");
                        }
                    }
                    test_layer_result_free(&a), test_layer_result_free(&b);
                    tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
                }
            }
        }

    for (int kind = 0; kind < K_N; kind++)
        for (int sp = 0; sp < 2; sp++)
            TEST_CASE("%s%s: finite differences of the sharded layer match its backward",
                      kind_name[kind], sp ? " SP" : "") {
                tpk_ctx sh;
                tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
                test_layer L = layer_case(kind, 2, sp);
                test_layer_fd(&sh, &L, xin, dyin, 4);
                tpk_ctx_destroy(&sh);
            }

    for (int sp = 0; sp < 2; sp++)
        for (int pi = 0; pi < 1; pi++)
            TEST_CASE(
                "Llama block%s, dropout %.1f: the backward in place (the model's: each norm adds "
                "its dx onto dy's buffer, no add and no copy) equals "
                "the backward apart bit for bit",
                sp ? " SP" : "", pi ? 0.1 : 0.0) {
                test_block_inplace(&world, np, layer_case(K_BLOCK, 2, sp), &block_inplace, xin,
                                   dyin);
            }

    TEST_CASE(
        "GQA attention: rope_theta < 0 turns the rotary embedding off (the first token, at "
        "position 0, is unrotated either way)") {
        tpk_ctx c;
        tpk_ctx_init(&c, &(tpk_ctx_desc){.seed = 5});
        tpk_gqa_attention a1, a2;
        tpk_tensor y1, y2;
        CHECK_OK(&c, tpk_gqa_attention_init(&c, &a1, H, A,
                                            &(tpk_gqa_attention_desc){.name = "r", .kv_heads = 2}));
        CHECK_OK(&c, tpk_gqa_attention_init(
                         &c, &a2, H, A,
                         &(tpk_gqa_attention_desc){.name = "n", .kv_heads = 2, .rope_theta = -1}));
        test_set_weights(&c, 7, 0.3f);
        for (int i = 0; i < c.params.n / 2; i++) { /* the same weights in both */
            size_t gn = tpk_param_global_numel(&c, i);
            float *w = malloc(gn * sizeof(float));
            CHECK_OK(&c, tpk_param_get_global(&c, i, false, w));
            CHECK_OK(&c, tpk_param_set_global(&c, i + c.params.n / 2, w));
            free(w);
        }
        CHECK_OK(&c, tpk_gqa_attention_forward(&c, &a1, tpk_tensor_2d(xin, TPK_F32, T, H, TPK_R), B,
                                               S, &y1));
        CHECK_OK(&c, tpk_gqa_attention_forward(&c, &a2, tpk_tensor_2d(xin, TPK_F32, T, H, TPK_R), B,
                                               S, &y2));
        CHECK(test_relerr((float *)y1.data, (float *)y2.data, H) < 1e-6, "position 0: rotated %g",
              test_relerr((float *)y1.data, (float *)y2.data, H));
        CHECK(test_relerr((float *)y1.data + H, (float *)y2.data + H, (T - 1) * H) > 1e-3,
              "the rotary embedding changed nothing");
        tpk_gqa_attention_destroy(&c, &a1), tpk_gqa_attention_destroy(&c, &a2);
        tpk_ctx_destroy(&c);
    }

    /* the whole model */
    for (int sp = 0; sp < 2; sp++)
        for (int ti = 0; ti < 2; ti++)
            TEST_CASE(
                "Llama model (L=2, H=%d, A=6, G=2, F=%d, V=%d padded)%s%s: loss, gradient norm and "
                "every gradient match the unsharded, unpadded model; "
                "collectives as GPT-2's",
                H, F, V, sp ? " SP" : "", ti ? ", tied head, smoothing 0.1" : ", untied head") {
                tpk_llama_config cfg = {.vocab = V,
                                        .positions = P,
                                        .layers = 2,
                                        .hidden = H,
                                        .heads = A,
                                        .kv_heads = 2,
                                        .ffn = F,
                                        .rope_theta = 1000.0f,
                                        .sequence_parallel = sp,
                                        .tie_embeddings = ti,
                                        .label_smoothing = ti ? 0.1f : 0.0f};
                tpk_llama_config unpadded = cfg;
                unpadded.vocab_multiple = -1;
                tpk_ctx sh, ref;
                tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3});
                tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 3});
                test_model_result a = {0}, b = {0};
                if (!run_model(&sh, &cfg, &a) && !run_model(&ref, &unpadded, &b)) {
                    test_compare_models(&sh, &a, &b, 1e-5, 1e-5);
                    CHECK(a.n == 2 + 9 * 2 + !ti, "%d parameters", a.n);
                    uint64_t L = 2, fwd = test_total_calls(&a.fwd), bwd = test_total_calls(&a.bwd),
                             xg = np > 1;
                    if (!sp) { /* 2 per block + the embedding forward + the cross-entropy's
                                  all-gather (t > 1); 2 per block + the head backward */
                        CHECK(a.fwd.calls[TPK_COLL_ALLREDUCE] == 2 * L + 1 &&
                                  a.fwd.calls[TPK_COLL_ALLGATHER] == xg && fwd == 2 * L + 1 + xg,
                              "forward: %llu collectives", (unsigned long long)fwd);
                        CHECK(a.bwd.calls[TPK_COLL_ALLREDUCE] == 2 * L + 1 && bwd == 2 * L + 1,
                              "backward: %llu collectives", (unsigned long long)bwd);
                    } else { /* the backward also all-gathers the inputs of the head and of each
                                block's projections again */
                        CHECK(a.fwd.calls[TPK_COLL_ALLGATHER] == 2 * L + 1 + xg &&
                                  a.fwd.calls[TPK_COLL_REDUCE_SCATTER] == 2 * L + 1 &&
                                  fwd == 4 * L + 2 + xg,
                              "SP forward: %llu collectives", (unsigned long long)fwd);
                        CHECK(a.bwd.calls[TPK_COLL_ALLGATHER] == 4 * L + 2 &&
                                  a.bwd.calls[TPK_COLL_REDUCE_SCATTER] == 2 * L + 1 &&
                                  bwd == 6 * L + 3,
                              "SP backward: %llu collectives", (unsigned long long)bwd);
                    }
                    int q = tpk_param_find(&sh, "model.layers.1.self_attn.k_proj.weight"),
                        e = tpk_param_find(&sh, "lm_head.weight");
                    CHECK(q >= 0 && sh.params.list[q].gshape[0] == 2 * (H / A) &&
                              sh.params.list[q].gshape[1] == H,
                          "k_proj is not [G D, H]");
                    CHECK(ti ? e < 0 : e >= 0, "lm_head.weight %s with tie_embeddings %d",
                          e < 0 ? "missing" : "present", ti);
                }
                test_model_result_free(&a), test_model_result_free(&b);
                tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
            }

    for (int sp = 0; sp < 2; sp++)
        for (int pad = 0; pad < 2; pad++)
            TEST_CASE(
                "Llama model (L=2, A=6, G=2, V=%d %s)%s over TP weights 2 | 3:1 | 3:1:2 | 1:2:3:4 "
                "at t=%d: the heads and the vocabulary split by "
                "weight, shared key/value heads; loss and every gradient match the unsharded model",
                V, pad ? "padded: units of 64 rows" : "unpadded", sp ? " SP" : "", np) {
                tpk_model_config mc, ref;
                memset(&mc, 0, sizeof mc);
                mc.arch = TPK_ARCH_LLAMA;
                mc.llama = (tpk_llama_config){.vocab = V,
                                              .positions = P,
                                              .layers = 2,
                                              .hidden = H,
                                              .heads = A,
                                              .kv_heads = 2,
                                              .ffn = F,
                                              .sequence_parallel = sp,
                                              .vocab_multiple = pad ? 0 : -1};
                ref = mc;
                ref.llama.vocab_multiple = -1, ref.llama.sequence_parallel = false;
                test_weighted(&world, np, &mc, &ref, ids, tg, B, S);
            }

    for (int rc = TPK_RECOMPUTE_FULL; rc <= TPK_RECOMPUTE_SELECTIVE; rc++)
        for (int sp = 0; sp < 2; sp++)
            TEST_CASE(
                "Llama model (L=4, G=2%s) with %s activation recompute at t=%d: loss and every "
                "gradient bit-identical, peak memory lower",
                sp ? ", SP" : "", tpk_recompute_name((tpk_recompute)rc), np) {
                tpk_model_config mc;
                memset(&mc, 0, sizeof mc);
                mc.arch = TPK_ARCH_LLAMA;
                mc.llama = (tpk_llama_config){.vocab = V,
                                              .positions = P,
                                              .layers = 4,
                                              .hidden = H,
                                              .heads = A,
                                              .kv_heads = 2,
                                              .ffn = F,
                                              .sequence_parallel = sp};
                test_recompute(&world, np, TPK_F32, &mc, (tpk_recompute)rc, ids, tg, B, S);
            }

    for (int sp = 0; sp < 2; sp++)
        TEST_CASE(
            "Llama model (L=2, G=2%s) at t=%d: the loss deferred to the backward (fused) equals "
            "forward then backward bit for bit",
            sp ? ", SP" : "", np) {
            tpk_model_config mc;
            memset(&mc, 0, sizeof mc);
            mc.arch = TPK_ARCH_LLAMA;
            mc.llama = (tpk_llama_config){.vocab = V,
                                          .positions = P,
                                          .layers = 2,
                                          .hidden = H,
                                          .heads = A,
                                          .kv_heads = 2,
                                          .ffn = F,
                                          .sequence_parallel = sp};
            test_deferred(&world, np, TPK_F32, &mc, ids, tg, B, S);
        }

    TEST_CASE(
        "Llama model in bf16 (mixed precision) at t=%d: loss and every gradient within bf16 "
        "tolerance of the f32 model",
        np) {
        tpk_llama_config cfg = {.vocab = V,
                                .positions = P,
                                .layers = 2,
                                .hidden = H,
                                .heads = A,
                                .kv_heads = 2,
                                .ffn = F};
        tpk_ctx c16, c32;
        tpk_ctx_init(&c16,
                     &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3, .dtype = TPK_BF16});
        tpk_ctx_init(&c32, &(tpk_ctx_desc){.seed = 3});
        test_model_result a = {0}, b = {0};
        if (!run_model(&c16, &cfg, &a) && !run_model(&c32, &cfg, &b)) {
            /* gradients within 8e-2: the first layer's norm weight gradient, a sum over 14 rows
             * that cancel, is the most sensitive; bf16 against f32 it measured 0.019 to 0.054 over
             * t = 1..4 and the two orders of the backward's additions (in place or apart) */
            test_compare_models(&c16, &a, &b, 1e-2, 8e-2);
            CHECK(a.loss != b.loss, "the bf16 loss equals the f32 loss exactly: is bf16 in use?");
        }
        test_model_result_free(&a), test_model_result_free(&b);
        tpk_ctx_destroy(&c16), tpk_ctx_destroy(&c32);
    }

    TEST_CASE(
        "bad input: A not divisible by G, odd head size for RoPE, rope_theta, F, sequence length, "
        "backward before forward") {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np});
        tpk_gqa_attention at;
        tpk_swiglu_mlp mlp;
        tpk_rmsnorm rn;
        tpk_llama m;
        tpk_tensor y;
        CHECK_FAILS(
            &ctx, tpk_gqa_attention_init(&ctx, &at, H, A, &(tpk_gqa_attention_desc){.kv_heads = 4}),
            TPK_ERR_SHAPE, "desc->kv_heads: expected a divisor of A = 6 query heads, got 4");
        CHECK_FAILS(&ctx, tpk_gqa_attention_init(&ctx, &at, 18, 6, NULL), TPK_ERR_SHAPE,
                    "rotary embeddings need an even head size, got 3");
        CHECK_FAILS(
            &ctx,
            tpk_gqa_attention_init(&ctx, &at, H, A, &(tpk_gqa_attention_desc){.rope_theta = 0.5f}),
            TPK_ERR_ARG, "desc->rope_theta");
        CHECK_OK(&ctx, tpk_gqa_attention_init(&ctx, &at, 18, 6,
                                              &(tpk_gqa_attention_desc){
                                                  .rope_theta = -1})); /* no rope: any head size */
        tpk_gqa_attention_destroy(&ctx, &at);
        CHECK_OK(&ctx,
                 tpk_gqa_attention_init(&ctx, &at, H, A, &(tpk_gqa_attention_desc){.kv_heads = 2}));
        CHECK_FAILS(&ctx, tpk_gqa_attention_backward(&ctx, &at, act(&ctx, dyin, false), &y),
                    TPK_ERR_ARG, "backward before forward");
        CHECK_FAILS(&ctx, tpk_gqa_attention_forward(&ctx, &at, act(&ctx, xin, false), B, S + 1, &y),
                    TPK_ERR_SHAPE, "x: expected global shape [16, 24]");
        CHECK_FAILS(&ctx, tpk_gqa_attention_forward(&ctx, &at, act(&ctx, xin, true), B, S, &y),
                    TPK_ERR_LAYOUT, "expected layout R");
        tpk_gqa_attention_destroy(&ctx, &at);
        CHECK_FAILS(&ctx, tpk_swiglu_mlp_init(&ctx, &mlp, H, NULL), TPK_ERR_SHAPE,
                    "desc->hidden: expected >= 1");
        CHECK_FAILS(&ctx, tpk_rmsnorm_init(&ctx, &rn, H, &(tpk_rmsnorm_desc){.eps = -1}),
                    TPK_ERR_ARG, "desc->eps");
        CHECK_OK(&ctx, tpk_rmsnorm_init(&ctx, &rn, H, NULL));
        CHECK_FAILS(
            &ctx, tpk_rmsnorm_forward(&ctx, &rn, tpk_tensor_2d(xin, TPK_F32, T, H - 1, TPK_R), &y),
            TPK_ERR_SHAPE, "x: expected global shape");
        CHECK_FAILS(&ctx,
                    tpk_rmsnorm_backward_add(&ctx, &rn, tpk_tensor_2d(dyin, TPK_F32, T, H, TPK_R),
                                             tpk_tensor_2d(xin, TPK_F32, T, H, TPK_R)),
                    TPK_ERR_ARG, "backward before forward");
        CHECK_OK(&ctx,
                 tpk_rmsnorm_forward(&ctx, &rn, tpk_tensor_2d(xin, TPK_F32, T, H, TPK_R), &y));
        CHECK_FAILS(&ctx,
                    tpk_rmsnorm_backward_add(&ctx, &rn, tpk_tensor_2d(dyin, TPK_F32, T, H, TPK_R),
                                             tpk_tensor_2d(dyin, TPK_F32, T, H, TPK_R)),
                    TPK_ERR_ARG, "tpk_rmsnorm_backward_add: acc: must not alias dy");
        CHECK_FAILS(&ctx,
                    tpk_rmsnorm_backward_add(&ctx, &rn, tpk_tensor_2d(dyin, TPK_F32, T, H, TPK_R),
                                             tpk_tensor_2d(xin, TPK_F32, T, H - 1, TPK_R)),
                    TPK_ERR_SHAPE, "acc");
        tpk_rmsnorm_destroy(&ctx, &rn);
        tpk_llama_config cfg = {.vocab = V,
                                .positions = P,
                                .layers = 1,
                                .hidden = H,
                                .heads = A,
                                .kv_heads = 4,
                                .ffn = F};
        CHECK_FAILS(&ctx, tpk_llama_init(&ctx, &m, &cfg), TPK_ERR_ARG,
                    "cfg->kv_heads: expected a divisor of cfg->heads = 6, got 4");
        tpk_lm_destroy(&ctx, &m.lm);
        cfg.kv_heads = 2, cfg.hidden = 18;
        CHECK_FAILS(&ctx, tpk_llama_init(&ctx, &m, &cfg), TPK_ERR_ARG,
                    "rotary embeddings need an even head size, got 3");
        tpk_lm_destroy(&ctx, &m.lm);
        cfg.hidden = H;
        CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &cfg));
        float loss;
        CHECK_FAILS(&ctx, tpk_lm_backward(&ctx, &m.lm, 1.0f), TPK_ERR_ARG,
                    "backward needs a forward with targets first");
        CHECK_FAILS(&ctx, tpk_lm_forward(&ctx, &m.lm, ids, tg, 1, P + 1, &loss), TPK_ERR_SHAPE,
                    "S: expected at most cfg->positions = 16, got 17");
        int32_t bad[T];
        memcpy(bad, ids, sizeof bad), bad[3] = V;
        CHECK_FAILS(&ctx, tpk_lm_forward(&ctx, &m.lm, bad, tg, B, S, &loss), TPK_ERR_ARG, "509");
        tpk_lm_destroy(&ctx, &m.lm);
        tpk_ctx_destroy(&ctx);
    }

    tpk_comm_destroy(&world);
    return test_finish();
}
