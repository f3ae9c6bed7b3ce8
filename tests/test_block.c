/* tests/test_block.c — the kit's public block (tpk/models/block.h) as a user composes it:
 *   - GPT-J's layout (one RMSNorm feeding grouped-query attention and a GELU MLP in parallel),
 *     its branches summed while partial: output, dx and every gradient against the unsharded
 *     block, 1 all-reduce each way (SP: 1 all-gather and 1 reduce-scatter), finite differences,
 *     the backward in place bit-equal to the backward apart;
 *   - a user's sublayers (tpk_sublayer: an attention and an MLP of one's own, here wrapping the
 *     kit's layers under the same names, so the same weights) in a sequential block: bit-equal to
 *     the block of the kit's layers; in a parallel block (each branch reduced by its own contract:
 *     2 all-reduces each way) against the unsharded block and finite differences;
 *   - a model of one's own (TPK_ARCH_CUSTOM) whose MLP is the user's, with its buffers lent for
 *     selective and full recompute: every number bit-identical to no recompute, memory lower;
 *   - bad descriptions refused by name.
 * Run at 1..4 ranks (uneven heads and widths at 3 and 4). */
#include "tp_layer.h"

static int me, np;
static tpk_comm world;
enum { B = 2, S = 5, T = B * S, H = 24, A = 6, G = 3, F = 36, V = 61, P = 16 };

/* ---- a user's sublayers: the kit's attention and MLP behind tpk_sublayer -------------------- */

static tpk_status my_attn_init(tpk_ctx *ctx, void *self, int64_t h, const char *name,
                               const void *user, bool sp) {
    (void)user;
    tpk_gqa_attention_desc d = {.name = name, .kv_heads = G, .sequence_parallel = sp};
    return tpk_gqa_attention_init(ctx, (tpk_gqa_attention *)self, h, A, &d);
}
static tpk_status my_attn_fwd(tpk_ctx *ctx, void *self, tpk_tensor x, int64_t b, int64_t s,
                              tpk_tensor *y) {
    return tpk_gqa_attention_forward(ctx, (tpk_gqa_attention *)self, x, b, s, y);
}
static tpk_status my_attn_bwd(tpk_ctx *ctx, void *self, tpk_tensor dy, tpk_tensor *dx) {
    return tpk_gqa_attention_backward(ctx, (tpk_gqa_attention *)self, dy, dx);
}
static void my_attn_destroy(tpk_ctx *ctx, void *self) {
    tpk_gqa_attention_destroy(ctx, (tpk_gqa_attention *)self);
}
static const tpk_sublayer my_attn = {"my_attention", sizeof(tpk_gqa_attention), my_attn_init,
                                     my_attn_fwd,    my_attn_bwd, my_attn_destroy, NULL, NULL};

static tpk_status my_mlp_init(tpk_ctx *ctx, void *self, int64_t h, const char *name,
                              const void *user, bool sp) {
    tpk_mlp_desc d = {.name = name, .hidden = *(const int64_t *)user, .sequence_parallel = sp};
    return tpk_mlp_init(ctx, (tpk_mlp *)self, h, &d);
}
static tpk_status my_mlp_fwd(tpk_ctx *ctx, void *self, tpk_tensor x, int64_t b, int64_t s,
                             tpk_tensor *y) {
    (void)b, (void)s;
    return tpk_mlp_forward(ctx, (tpk_mlp *)self, x, y);
}
static tpk_status my_mlp_bwd(tpk_ctx *ctx, void *self, tpk_tensor dy, tpk_tensor *dx) {
    return tpk_mlp_backward(ctx, (tpk_mlp *)self, dy, dx);
}
static void my_mlp_destroy(tpk_ctx *ctx, void *self) { tpk_mlp_destroy(ctx, (tpk_mlp *)self); }
/* its buffers lent to the model's pools and remade before the backward: the kit's MLP's own */
static int my_mlp_bufs(void *self, int set, tpk_buf **o) {
    return tpk__mlp_bufs((tpk_mlp *)self, set, o);
}
static tpk_status my_mlp_recompute(tpk_ctx *ctx, void *self, tpk_tensor x) {
    return tpk__mlp_recompute(ctx, (tpk_mlp *)self, x);
}
static const tpk_sublayer my_mlp = {"my_mlp",   sizeof(tpk_mlp), my_mlp_init,
                                    my_mlp_fwd, my_mlp_bwd,      my_mlp_destroy,
                                    my_mlp_bufs, my_mlp_recompute};
static const int64_t my_mlp_width = F;

/* ---- the blocks under test ------------------------------------------------------------------- */

enum { K_GPTJ, K_USER_SEQ, K_KIT_SEQ, K_USER_PAR, K_N };
static const char *kind_name[K_N] = {"GPT-J block (one norm, partial branches)",
                                     "block of a user's attention and MLP (sequential)",
                                     "the same block of the kit's layers",
                                     "parallel block of a user's attention and MLP"};

static tpk_block_desc block_desc(int kind, bool sp, float p) {
    tpk_block_desc d;
    memset(&d, 0, sizeof d);
    d.name = "layers.0", d.heads = A, d.dropout = p, d.sequence_parallel = sp;
    d.residual = kind == K_GPTJ         ? TPK_RESIDUAL_PARALLEL_ONE_NORM
                 : kind == K_USER_PAR ? TPK_RESIDUAL_PARALLEL
                                      : TPK_RESIDUAL_SEQUENTIAL;
    d.norm_1.kind = d.norm_2.kind = TPK_NORM_RMSNORM;
    d.norm_1.name = "ln_1", d.norm_2.name = "ln_2";
    bool user = kind == K_USER_SEQ || kind == K_USER_PAR;
    d.attn.kind = user ? TPK_ATTN_USER : TPK_ATTN_GQA, d.attn.name = "attn";
    d.attn.gqa.kv_heads = G, d.attn.user = &my_attn;
    d.mlp.kind = user ? TPK_MLP_USER : TPK_MLP_ACT, d.mlp.name = "mlp";
    d.mlp.act.hidden = F, d.mlp.user = &my_mlp, d.mlp.user_arg = &my_mlp_width;
    return d;
}

static tpk_status layer_init(tpk_ctx *ctx, void *lv, int kind, int64_t arg, bool sp, float p) {
    (void)arg;
    tpk_block_desc d = block_desc(kind, sp, p);
    return tpk_block_init(ctx, (tpk_block *)lv, H, &d);
}
static tpk_status layer_fwd(tpk_ctx *ctx, void *lv, tpk_tensor x, tpk_tensor *y) {
    return tpk_block_forward(ctx, (tpk_block *)lv, x, B, S, y);
}
static bool block_inplace;
static float dy_copy[T * H];
static tpk_status layer_bwd(tpk_ctx *ctx, void *lv, tpk_tensor dy, tpk_tensor *dx) {
    if (block_inplace) { /* the model's form, on a copy of dy */
        tpk_tensor d = dy;
        d.data = dy_copy;
        memcpy(dy_copy, dy.data, sizeof(float) * (size_t)tpk_numel(&dy));
        return tpk__block_backward(ctx, "tpk_block_backward", (tpk_block *)lv, d, dx, true);
    }
    return tpk_block_backward(ctx, (tpk_block *)lv, dy, dx);
}
static void layer_destroy(tpk_ctx *ctx, void *lv) { tpk_block_destroy(ctx, (tpk_block *)lv); }
static tpk_block storage;
static test_layer layer_case(int kind, bool sp) {
    test_layer L = {layer_init, layer_fwd, layer_bwd, layer_destroy, &storage, kind, 0,
                    T,          H,         sp,        0.0f};
    return L;
}

static float xin[T * H], dyin[T * H];
enum { MS = 16, ML = 6 }; /* the model's sequences: B of MS tokens, ML blocks */
static int32_t ids[B * MS], tg[B * MS];

static tpk_model_config custom_cfg(bool user_mlp, bool sp) {
    tpk_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.arch = TPK_ARCH_CUSTOM;
    tpk_lm_config *c = &mc.custom;
    c->vocab = V, c->positions = P, c->layers = ML, c->hidden = H, c->sequence_parallel = sp;
    c->block = block_desc(user_mlp ? K_USER_SEQ : K_GPTJ, sp, 0.0f);
    c->block.name = "layers";
    if (user_mlp) c->block.attn.kind = TPK_ATTN_GQA; /* the user's MLP, the kit's attention */
    c->final_norm.kind = TPK_NORM_RMSNORM;
    return mc;
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    test_randn(xin, T * H, 1, 1.0f);
    test_randn(dyin, T * H, 2, 1.0f);
    for (int t = 0; t < B * MS; t++)
        ids[t] = (int32_t)((t * 17 + 3) % V), tg[t] = (int32_t)((t * 7 + 1) % V);

    for (int kind = 0; kind < K_N; kind++) {
        if (kind == K_KIT_SEQ) continue; /* the reference of K_USER_SEQ, below */
        for (int sp = 0; sp < 2; sp++)
            TEST_CASE("%s%s: output, dx, every gradient and the gradient norm match the "
                      "unsharded block; its collectives",
                      kind_name[kind], sp ? " SP" : "") {
                tpk_ctx sh, ref;
                tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
                tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 5});
                test_layer L = layer_case(kind, sp);
                test_layer_result a = {0}, b = {0};
                if (!test_run_layer(&sh, &L, xin, dyin, &a) &&
                    !test_run_layer(&ref, &L, xin, dyin, &b)) {
                    test_compare_layers(&sh, &L, &a, &b);
                    if (kind == K_GPTJ && !sp) { /* one all-reduce each way */
                        test_check_counts(&a.fwd, false, 1, T * H, "forward");
                        test_check_counts(&a.bwd, false, 1, T * H, "backward");
                    } else if (kind == K_GPTJ) { /* one all-gather, one reduce-scatter each way */
                        for (int d = 0; d < 2; d++) {
                            const tpk_comm_stats *c = d ? &a.bwd : &a.fwd;
                            CHECK(c->calls[TPK_COLL_ALLGATHER] == 1 &&
                                      c->calls[TPK_COLL_REDUCE_SCATTER] == 1 &&
                                      test_total_calls(c) == 2,
                                  "SP %s: %llu collectives", d ? "backward" : "forward",
                                  (unsigned long long)test_total_calls(c));
                        }
                    } else { /* each branch reduced by its own layers */
                        test_check_counts(&a.fwd, sp, 2, T * H, "forward");
                        test_check_counts(&a.bwd, sp, 2, T * H, "backward");
                    }
                }
                test_layer_result_free(&a), test_layer_result_free(&b);
                tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
            }
    }

    for (int kind = 0; kind < K_N; kind += 3)
        TEST_CASE("%s: finite differences of the sharded block match its backward",
                  kind_name[kind]) {
            tpk_ctx sh;
            tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
            test_layer L = layer_case(kind, false);
            test_layer_fd(&sh, &L, xin, dyin, 4);
            tpk_ctx_destroy(&sh);
        }

    for (int sp = 0; sp < 2; sp++)
        TEST_CASE("GPT-J block%s: the backward in place equals the backward apart bit for bit",
                  sp ? " SP" : "") {
            test_block_inplace(&world, np, layer_case(K_GPTJ, sp), &block_inplace, xin, dyin);
        }

    TEST_CASE("a user's attention and MLP (tpk_sublayer) equal the kit's layers they wrap, bit "
              "for bit: output, dx and every gradient at t=%d",
              np) {
        tpk_ctx c1, c2;
        tpk_ctx_init(&c1, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
        tpk_ctx_init(&c2, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
        test_layer_result a = {0}, b = {0};
        test_layer Lu = layer_case(K_USER_SEQ, false), Lk = layer_case(K_KIT_SEQ, false);
        if (!test_run_layer(&c1, &Lu, xin, dyin, &a) && !test_run_layer(&c2, &Lk, xin, dyin, &b)) {
            CHECK(!memcmp(a.y, b.y, sizeof(float) * T * H) &&
                      !memcmp(a.dx, b.dx, sizeof(float) * T * H),
                  "output or dx differ");
            CHECK(a.n == b.n, "%d against %d parameters", a.n, b.n);
            for (int i = 0; i < a.n && i < b.n; i++)
                CHECK(!memcmp(a.grad[i], b.grad[i],
                              sizeof(float) * tpk_param_global_numel(&c1, i)),
                      "the gradient of %s differs", c1.params.list[i].name);
        }
        test_layer_result_free(&a), test_layer_result_free(&b);
        tpk_ctx_destroy(&c1), tpk_ctx_destroy(&c2);
    }

    for (int um = 0; um < 2; um++)
        for (int rc = TPK_RECOMPUTE_FULL; rc <= TPK_RECOMPUTE_SELECTIVE; rc++)
            TEST_CASE("a model of one's own (%s) with %s recompute at t=%d: loss and every "
                      "gradient bit-identical, peak memory lower",
                      um ? "the user's MLP, its buffers lent" : "GPT-J's block",
                      tpk_recompute_name((tpk_recompute)rc), np) {
                tpk_model_config mc = custom_cfg(um, false);
                test_recompute(&world, np, TPK_F32, &mc, (tpk_recompute)rc, ids, tg, B, MS);
            }

    TEST_CASE("bad descriptions: a sublayer's missing member, bufs without recompute, unknown "
              "kinds and residual style, dropout without dropout sites") {
        /* each refusal in a context of its own (a refused block leaves what it registered) */
        tpk_ctx c;
        tpk_block b;
        tpk_block_desc d[5];
        tpk_sublayer half = my_mlp, lends = my_mlp;
        half.backward = NULL, lends.recompute = NULL;
        d[0] = block_desc(K_USER_SEQ, false, 0.0f), d[0].mlp.user = &half;
        d[1] = block_desc(K_USER_SEQ, false, 0.0f), d[1].mlp.user = &lends;
        d[2] = block_desc(K_GPTJ, false, 0.0f), d[2].attn.kind = (tpk_attn_kind)7;
        d[3] = block_desc(K_GPTJ, false, 0.0f), d[3].residual = (tpk_residual_style)5;
        d[4] = block_desc(K_GPTJ, false, 0.0f), d[4].norm_1.kind = (tpk_norm_kind)3;
        static const char *want[5] = {
            "desc->mlp.user: expected a tpk_sublayer with size, init, forward, backward and "
            "destroy",
            "desc->mlp.user (my_mlp): bufs given without recompute",
            "desc->attn.kind: expected TPK_ATTN_FUSED, _GQA or _USER, got 7",
            "desc->residual: expected TPK_RESIDUAL_SEQUENTIAL, _PARALLEL or _PARALLEL_ONE_NORM, "
            "got 5",
            "layers.0.ln_1: kind: expected TPK_NORM_LAYERNORM or TPK_NORM_RMSNORM, got 3"};
        for (int k = 0; k < 5; k++) {
            tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
            CHECK_FAILS(&c, tpk_block_init(&c, &b, H, &d[k]), TPK_ERR_ARG, want[k]);
            tpk_block_destroy(&c, &b);
            tpk_ctx_destroy(&c);
        }
        tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
        tpk_lm m;
        tpk_model_config mc = custom_cfg(false, false);
        mc.custom.block.dropout = 0.1f;
        CHECK_FAILS(&c, tpk_lm_init(&c, &m, &mc.custom), TPK_ERR_ARG,
                    "cfg->block.dropout: the model has no dropout sites");
        tpk_ctx_destroy(&c);
        tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
        mc.custom.block.dropout = 0;
        CHECK_OK(&c, tpk_lm_init(&c, &m, &mc.custom));
        CHECK_FAILS(&c, tpk_lm_set_dropout(&c, &m, 0.1f), TPK_ERR_UNSUPPORTED,
                    "p: the model has no dropout");
        tpk_lm_destroy(&c, &m);
        CHECK_FAILS(&c, tpk_block_backward(&c, NULL, test_act(&c, dyin, T, H, false), NULL),
                    TPK_ERR_ARG, "block: expected an initialised block");
        tpk_ctx_destroy(&c);
    }

    tpk_comm_destroy(&world);
    return test_finish();
}
