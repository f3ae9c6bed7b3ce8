/* tests/test_neox.c — the GPT-NeoX parts: the attention with per-head fused QKV rows and partial
 * rotary embeddings, the parallel-residual block and the whole model, sharded over t = ranks
 * against the unsharded layer on every rank (outputs, input gradients and every gathered
 * parameter gradient to relative 1e-5), with and without sequence parallelism; H = 48, A = 6
 * heads of 8 (uneven over t = 4), a quarter or half of each head rotated. Also: finite
 * differences per layer, the collective counts (1 a block each way), the block's backward in place
 * equal to the backward apart bit for bit, the model over weighted TP splits, full and selective
 * recompute bit-identical, the deferred loss, a Hugging Face checkpoint (config.json and the
 * tensors' names and shapes) saved at t = ranks and loaded unsharded with the same loss, and bad
 * input. The PyTorch reference of the model is tests/torch_ref.py (tests/run.sh). */
#include "tp_layer.h"

#include <sys/stat.h>

static int me, np;
static tpk_comm world;
enum { B = 2, S = 7, T = B * S, H = 48, A = 6, F = 40, V = 509, P = 16 };

enum { K_ATTN, K_BLOCK, K_N };
static const char *kind_name[] = {"NeoX attention", "NeoX block"};

typedef struct layer {
    int kind;
    tpk_attention a;
    tpk_block b;
} layer;

/* the layer under test (tests/tp_layer.h): arg = the rotated dimensions of a head of 8 */
static tpk_status layer_init(tpk_ctx *ctx, void *lv, int kind, int64_t rot, bool sp, float p) {
    layer *l = (layer *)lv;
    memset(l, 0, sizeof *l);
    l->kind = kind;
    if (kind == K_ATTN)
        return tpk_attention_init(ctx, &l->a, H, A,
                                  &(tpk_attention_desc){.name = "attention",
                                                        .qkv_name = "query_key_value",
                                                        .proj_name = "dense",
                                                        .qkv_per_head = true,
                                                        .rotary_dim = rot,
                                                        .rope_theta = 500.0f,
                                                        .dropout = p,
                                                        .sequence_parallel = sp});
    return tpk_neox_block_init(ctx, &l->b, H,
                               &(tpk_neox_block_desc){.name = "gpt_neox.layers.0",
                                                      .heads = A,
                                                      .ffn = F,
                                                      .rotary_dim = rot,
                                                      .dropout = p,
                                                      .sequence_parallel = sp});
}
static tpk_status layer_fwd(tpk_ctx *ctx, void *lv, tpk_tensor x, tpk_tensor *y) {
    layer *l = (layer *)lv;
    if (l->kind == K_ATTN) return tpk_attention_forward(ctx, &l->a, x, B, S, y);
    return tpk_block_forward(ctx, &l->b, x, B, S, y);
}
static bool block_inplace; /* the block's backward in place (as the model runs it) */
static float dy_copy[T * H];
static tpk_status layer_bwd(tpk_ctx *ctx, void *lv, tpk_tensor dy, tpk_tensor *dx) {
    layer *l = (layer *)lv;
    if (l->kind == K_ATTN) return tpk_attention_backward(ctx, &l->a, dy, dx);
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
    else tpk_block_destroy(ctx, &l->b);
}
static layer storage;
static test_layer layer_case(int kind, int64_t rot, bool sp) {
    test_layer L = {layer_init, layer_fwd, layer_bwd, layer_destroy, &storage, kind, rot,
                    T,          H,         sp,        0.0f};
    return L;
}

static float xin[T * H], dyin[T * H];
static int32_t ids[T], tg[T];

static tpk_model_config model_cfg(int64_t layers, bool sp, float pct) {
    tpk_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.arch = TPK_ARCH_NEOX;
    mc.neox = (tpk_neox_config){.vocab = V,
                                .positions = P,
                                .layers = layers,
                                .hidden = H,
                                .heads = A,
                                .ffn = F,
                                .rotary_pct = pct,
                                .rope_theta = 1000.0f,
                                .sequence_parallel = sp};
    return mc;
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

    for (int kind = 0; kind < K_N; kind++)
        for (int sp = 0; sp < 2; sp++)
            for (int64_t rot = 2; rot <= 8; rot += 6) /* a quarter of a head, or all of it */
                TEST_CASE("%s%s, %lld of 8 rotated: output, dx, every gradient and the gradient "
                          "norm match the unsharded layer; %s collectives",
                          kind_name[kind], sp ? " SP" : "", (long long)rot,
                          "1+1") {
                    tpk_ctx sh, ref;
                    tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
                    tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 5});
                    test_layer L = layer_case(kind, rot, sp);
                    test_layer_result a = {0}, b = {0};
                    if (!test_run_layer(&sh, &L, xin, dyin, &a) &&
                        !test_run_layer(&ref, &L, xin, dyin, &b)) {
                        test_compare_layers(&sh, &L, &a, &b);
                        /* the block: its branches summed while partial, one reduction each
                           way (SP: one all-gather and one reduce-scatter each way) */
                        bool stream = kind == K_BLOCK;
                        if (!stream || !sp) {
                            test_check_counts(&a.fwd, sp, 1, T * H, "forward");
                            test_check_counts(&a.bwd, sp, 1, T * H, "backward");
                        } else
                            for (int d = 0; d < 2; d++) {
                                const tpk_comm_stats *c = d ? &a.bwd : &a.fwd;
                                CHECK(c->calls[TPK_COLL_ALLGATHER] == 1 &&
                                          c->calls[TPK_COLL_REDUCE_SCATTER] == 1 &&
                                          test_total_calls(c) == 2,
                                      "SP %s: %llu collectives, expected 1 all-gather and 1 "
                                      "reduce-scatter",
                                      d ? "backward" : "forward",
                                      (unsigned long long)test_total_calls(c));
                            }
                    }
                    test_layer_result_free(&a), test_layer_result_free(&b);
                    tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
                }

    for (int kind = 0; kind < K_N; kind++)
        for (int sp = 0; sp < 2; sp++)
            TEST_CASE("%s%s: finite differences of the sharded layer match its backward",
                      kind_name[kind], sp ? " SP" : "") {
                tpk_ctx sh;
                tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
                test_layer L = layer_case(kind, 4, sp);
                test_layer_fd(&sh, &L, xin, dyin, 4);
                tpk_ctx_destroy(&sh);
            }

    for (int sp = 0; sp < 2; sp++)
        TEST_CASE("NeoX block%s: the backward in place (both norms add their dx onto dy's buffer "
                  "after both branches read dy) equals the backward apart bit for bit",
                  sp ? " SP" : "") {
            test_block_inplace(&world, np, layer_case(K_BLOCK, 2, sp), &block_inplace, xin, dyin);
        }

    TEST_CASE("NeoX attention: the rotation moves only the first rotary_dim of each head (the "
              "first token, at position 0, is unrotated; later tokens differ from no rotation)") {
        tpk_ctx c;
        tpk_ctx_init(&c, &(tpk_ctx_desc){.seed = 5});
        tpk_attention a1, a2;
        tpk_tensor y1, y2;
        CHECK_OK(&c, tpk_attention_init(&c, &a1, H, A,
                                        &(tpk_attention_desc){
                                            .name = "r", .qkv_per_head = true, .rotary_dim = 4}));
        CHECK_OK(&c, tpk_attention_init(&c, &a2, H, A,
                                        &(tpk_attention_desc){.name = "n", .qkv_per_head = true}));
        test_set_weights(&c, 7, 0.3f);
        for (int i = 0; i < c.params.n / 2; i++) { /* the same weights in both */
            size_t gn = tpk_param_global_numel(&c, i);
            float *w = malloc(gn * sizeof(float));
            CHECK_OK(&c, tpk_param_get_global(&c, i, false, w));
            CHECK_OK(&c, tpk_param_set_global(&c, i + c.params.n / 2, w));
            free(w);
        }
        tpk_tensor x = tpk_tensor_2d(xin, TPK_F32, T, H, TPK_R);
        CHECK_OK(&c, tpk_attention_forward(&c, &a1, x, B, S, &y1));
        CHECK_OK(&c, tpk_attention_forward(&c, &a2, x, B, S, &y2));
        double e0 = test_relerr((float *)y1.data, (float *)y2.data, H),
               e1 = test_relerr((float *)y1.data + H, (float *)y2.data + H, (T - 1) * H);
        CHECK(e0 < 1e-6, "position 0: rotated %g", e0);
        CHECK(e1 > 1e-3, "the rotary embedding changed nothing (%g)", e1);
        tpk_attention_destroy(&c, &a1), tpk_attention_destroy(&c, &a2);
        tpk_ctx_destroy(&c);
    }

    /* the whole model */
    for (int sp = 0; sp < 2; sp++)
        TEST_CASE("GPT-NeoX model (L=2, H=%d, A=6, F=%d, V=%d padded, rotary 0.25)%s: loss, "
                  "gradient norm and every gradient match the unsharded, unpadded model; "
                  "1 all-reduce a block each way",
                  H, F, V, sp ? " SP" : "") {
            tpk_model_config cfg = model_cfg(2, sp, 0.25f), unpadded = cfg;
            unpadded.neox.vocab_multiple = -1;
            tpk_ctx sh, ref;
            tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3});
            tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 3});
            test_model_result a = {0}, b = {0};
            if (!test_run_model(&sh, &cfg, 0, ids, tg, B, S, &a) &&
                !test_run_model(&ref, &unpadded, 0, ids, tg, B, S, &b)) {
                test_compare_models(&sh, &a, &b, 1e-5, 1e-5);
                CHECK(a.n == 1 + 12 * 2 + 2 + 1, "%d parameters", a.n);
                uint64_t L = 2, fwd = test_total_calls(&a.fwd), bwd = test_total_calls(&a.bwd),
                         xg = np > 1;
                /* a block: 1 all-reduce each way (its branches summed while partial); the
                   embedding, the head and the loss their own */
                if (!sp) {
                    CHECK(a.fwd.calls[TPK_COLL_ALLREDUCE] == L + 1 &&
                              a.fwd.calls[TPK_COLL_ALLGATHER] == xg && fwd == L + 1 + xg,
                          "forward: %llu collectives", (unsigned long long)fwd);
                    CHECK(a.bwd.calls[TPK_COLL_ALLREDUCE] == L + 1 && bwd == L + 1,
                          "backward: %llu collectives", (unsigned long long)bwd);
                } else {
                    CHECK(a.fwd.calls[TPK_COLL_ALLGATHER] == L + 1 + xg &&
                              a.fwd.calls[TPK_COLL_REDUCE_SCATTER] == L + 1 &&
                              fwd == 2 * L + 2 + xg,
                          "SP forward: %llu collectives (%llu all-gathers, %llu reduce-scatters)",
                          (unsigned long long)fwd,
                          (unsigned long long)a.fwd.calls[TPK_COLL_ALLGATHER],
                          (unsigned long long)a.fwd.calls[TPK_COLL_REDUCE_SCATTER]);
                    CHECK(a.bwd.calls[TPK_COLL_ALLGATHER] == L + 2 &&
                              a.bwd.calls[TPK_COLL_REDUCE_SCATTER] == L + 1 && bwd == 2 * L + 3,
                          "SP backward: %llu collectives (%llu all-gathers, %llu reduce-scatters)",
                          (unsigned long long)bwd,
                          (unsigned long long)a.bwd.calls[TPK_COLL_ALLGATHER],
                          (unsigned long long)a.bwd.calls[TPK_COLL_REDUCE_SCATTER]);
                }
                int q = tpk_param_find(&sh, "gpt_neox.layers.1.attention.query_key_value.weight"),
                    e = tpk_param_find(&sh, "embed_out.weight");
                CHECK(q >= 0 && sh.params.list[q].gshape[0] == 3 * H &&
                          sh.params.list[q].gshape[1] == H,
                      "query_key_value is not [3 H, H]");
                CHECK(e >= 0, "embed_out.weight missing");
            }
            test_model_result_free(&a), test_model_result_free(&b);
            tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
        }

    for (int sp = 0; sp < 2; sp++)
        for (int pad = 0; pad < 2; pad++)
            TEST_CASE("GPT-NeoX model (L=2, A=6, V=%d %s)%s over TP weights 2 | 3:1 | 3:1:2 | "
                      "1:2:3:4 at t=%d: the heads and the vocabulary split by weight; loss and "
                      "every gradient match the unsharded model",
                      V, pad ? "padded: units of 64 rows" : "unpadded", sp ? " SP" : "", np) {
                tpk_model_config mc = model_cfg(2, sp, 0.25f), ref;
                mc.neox.vocab_multiple = pad ? 0 : -1;
                ref = mc;
                ref.neox.vocab_multiple = -1, ref.neox.sequence_parallel = false;
                test_weighted(&world, np, &mc, &ref, ids, tg, B, S);
            }

    for (int rc = TPK_RECOMPUTE_FULL; rc <= TPK_RECOMPUTE_SELECTIVE; rc++)
        for (int sp = 0; sp < 2; sp++)
            TEST_CASE("GPT-NeoX model (L=4%s) with %s activation recompute at t=%d: loss and "
                      "every gradient bit-identical, peak memory lower",
                      sp ? ", SP" : "", tpk_recompute_name((tpk_recompute)rc), np) {
                tpk_model_config mc = model_cfg(4, sp, 0.5f);
                test_recompute(&world, np, TPK_F32, &mc, (tpk_recompute)rc, ids, tg, B, S);
            }

    for (int sp = 0; sp < 2; sp++)
        TEST_CASE("GPT-NeoX model (L=2%s) at t=%d: the loss deferred to the backward (fused) "
                  "equals forward then backward bit for bit",
                  sp ? ", SP" : "", np) {
            tpk_model_config mc = model_cfg(2, sp, 0.25f);
            test_deferred(&world, np, TPK_F32, &mc, ids, tg, B, S);
        }

    /* seq: use_parallel_residual false, the sequential block (as Hugging Face runs it) */
    for (int seq = 0; seq < 2; seq++)
    TEST_CASE("GPT-NeoX checkpoint%s: saved at t=%d in Hugging Face's layout (config.json "
              "model_type gpt_neox, the tensors [out, in] under GPTNeoXForCausalLM's names), read "
              "back as a model config and loaded unsharded: the same loss%s",
              seq ? " (use_parallel_residual false)" : "", np,
              seq ? "; not the parallel block's" : "") {
        char dir[96];
        snprintf(dir, sizeof dir, "/tmp/tpk_test_neox_%d_%d", (int)getppid(), seq);
        tpk_model_config mc = model_cfg(2, false, 0.25f);
        mc.neox.sequential = seq;
        tpk_ctx sh, un;
        tpk_model m, u;
        float l1 = 0, l2 = 0;
        CHECK_OK(&sh, tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3}));
        CHECK_OK(&sh, tpk_model_init(&sh, &m, &mc));
        test_set_weights(&sh, 11, 0.2f);
        CHECK_OK(&sh, tpk_model_forward(&sh, &m, ids, tg, B, S, &l1));
        CHECK_OK(&sh, tpk_model_save(&sh, &m, NULL, dir, NULL));
        tpk_model_destroy(&sh, &m);
        tpk_ctx_destroy(&sh);
        tpk_model_config rd;
        memset(&rd, 0, sizeof rd);
        CHECK_OK(&un, tpk_ctx_init(&un, &(tpk_ctx_desc){.seed = 4}));
        CHECK_OK(&un, tpk_model_config_read(&un, dir, &rd));
        CHECK(rd.arch == TPK_ARCH_NEOX && rd.neox.layers == 2 && rd.neox.hidden == H &&
                  rd.neox.heads == A && rd.neox.ffn == F && rd.neox.vocab == V &&
                  rd.neox.rotary_pct == 0.25f && rd.neox.rope_theta == 1000.0f &&
                  rd.neox.act == TPK_ACT_GELU && rd.neox.sequential == (bool)seq,
              "config.json read back as arch %d L %lld H %lld A %lld F %lld V %lld pct %g base %g",
              (int)rd.arch, (long long)rd.neox.layers, (long long)rd.neox.hidden,
              (long long)rd.neox.heads, (long long)rd.neox.ffn, (long long)rd.neox.vocab,
              (double)rd.neox.rotary_pct, (double)rd.neox.rope_theta);
        CHECK_OK(&un, tpk_model_init(&un, &u, &rd));
        CHECK_OK(&un, tpk_model_load(&un, &u, NULL, dir));
        CHECK_OK(&un, tpk_model_forward(&un, &u, ids, tg, B, S, &l2));
        CHECK(fabsf(l1 - l2) <= 1e-5f * fabsf(l1), "loss %.8g at t=%d, %.8g loaded unsharded",
              (double)l1, np, (double)l2);
        static float l_par; /* the parallel block's loss (seq = 0 runs first) */
        if (!seq) l_par = l2;
        else
            CHECK(fabsf(l2 - l_par) > 1e-4f * fabsf(l2),
                  "the sequential block's loss %.8g is the parallel block's", (double)l2);
        int q = tpk_param_find(&un, "gpt_neox.layers.0.attention.query_key_value.bias");
        CHECK(q >= 0 && un.params.list[q].gshape[0] == 3 * H, "query_key_value.bias not [3 H]");
        tpk_model_destroy(&un, &u);
        tpk_ctx_destroy(&un);
        MPI_Barrier(MPI_COMM_WORLD);
        if (me == 0) {
            char cmd[160];
            snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
            CHECK(system(cmd) == 0, "rm -rf %s", dir);
        }
    }

    TEST_CASE("bad input: rotary_pct, rotary_dim, ffn, act, sequence length, a config.json with "
              "another activation, backward before forward") {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np});
        tpk_attention at;
        tpk_neox m;
        tpk_model_config mc = model_cfg(1, false, 0.25f);
        CHECK_FAILS(&ctx,
                    tpk_attention_init(&ctx, &at, H, A, &(tpk_attention_desc){.rotary_dim = 3}),
                    TPK_ERR_ARG, "desc->rotary_dim: expected an even number in 0..8");
        CHECK_FAILS(&ctx,
                    tpk_attention_init(&ctx, &at, H, A, &(tpk_attention_desc){.rotary_dim = 10}),
                    TPK_ERR_ARG, "got 10");
        CHECK_FAILS(&ctx,
                    tpk_attention_init(&ctx, &at, H, A,
                                       &(tpk_attention_desc){.rotary_dim = 2, .rope_theta = 0.5f}),
                    TPK_ERR_ARG, "desc->rope_theta");
        mc.neox.rotary_pct = 1.5f;
        CHECK_FAILS(&ctx, tpk_neox_init(&ctx, &m, &mc.neox), TPK_ERR_ARG,
                    "cfg->rotary_pct: expected a fraction in (0, 1]");
        mc.neox.rotary_pct = 0.1f;
        CHECK_FAILS(&ctx, tpk_neox_init(&ctx, &m, &mc.neox), TPK_ERR_ARG,
                    "of a head of 8 rotates no pair");
        mc.neox.rotary_pct = 0.25f, mc.neox.ffn = -1;
        CHECK_FAILS(&ctx, tpk_neox_init(&ctx, &m, &mc.neox), TPK_ERR_ARG, "cfg->ffn");
        mc.neox.ffn = F, mc.neox.act = (tpk_act)7;
        CHECK_FAILS(&ctx, tpk_neox_init(&ctx, &m, &mc.neox), TPK_ERR_ARG,
                    "cfg->act: expected TPK_ACT_GELU or TPK_ACT_GELU_TANH");
        mc.neox.act = TPK_ACT_NONE;
        CHECK_OK(&ctx, tpk_neox_init(&ctx, &m, &mc.neox));
        float loss;
        CHECK_FAILS(&ctx, tpk_lm_backward(&ctx, &m.lm, 1.0f), TPK_ERR_ARG,
                    "backward needs a forward with targets first");
        CHECK_FAILS(&ctx, tpk_lm_forward(&ctx, &m.lm, ids, tg, 1, P + 1, &loss), TPK_ERR_SHAPE,
                    "S: expected at most cfg->positions = 16, got 17");
        tpk_lm_destroy(&ctx, &m.lm);
        static const struct {
            const char *extra, *needle;
        } bad[] = {
            {", \"hidden_act\": \"relu\"", "hidden_act \"relu\": expected \"gelu\" (exact)"},
            {", \"tie_word_embeddings\": true", "tie_word_embeddings: expected false"},
            {", \"rotary_pct\": 0.01", "expected whole heads with at least one rotated pair"},
            {", \"rope_scaling\": {\"type\": \"linear\"}", "rope_scaling: expected null"},
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            char text[512];
            snprintf(text, sizeof text,
                     "{\"model_type\": \"gpt_neox\", \"num_hidden_layers\": 2, \"hidden_size\": "
                     "48, \"num_attention_heads\": 6, \"vocab_size\": 61, "
                     "\"max_position_embeddings\": 12%s}",
                     bad[k].extra);
            tpk_neox_config c;
            CHECK_FAILS(&ctx,
                        tpk_neox_config_parse(&ctx, (const uint8_t *)text, strlen(text),
                                              "config.json", &c),
                        strstr(bad[k].needle, "whole heads") ? TPK_ERR_FORMAT
                                                              : TPK_ERR_UNSUPPORTED,
                        bad[k].needle);
        }
        tpk_ctx_destroy(&ctx);
    }

    tpk_comm_destroy(&world);
    return test_finish();
}
