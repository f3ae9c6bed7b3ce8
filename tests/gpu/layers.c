/* tests/gpu/layers.c — the TP layers and the GPT-2 model on the CUDA backend against the host
 * backend, at t = number of ranks: at one rank over NCCL, at t = 2, 3 over MPI with ranks sharing
 * one GPU (device buffers staged through host memory, tpk/runtime/mpi.h); at one rank the model
 * also runs on the device-buffer self communicator (tpk_comm_self_cuda). For attention, the MLP,
 * the GPT-2 block (with dropout) and the whole model (SP at odd t, dropout, label smoothing), and
 * the Llama (grouped-query, RoPE, SwiGLU, RMSNorm) and GPT-NeoX (parallel residual, per-head fused
 * QKV with partial rotary embeddings, the exact GELU) models through tpk/train/model.h, and Llama
 * under context parallelism (CP 2 at an even number of ranks), and the Mixtral and Qwen2-MoE models
 * at EP = the ranks (t > 1: the dispatcher's row ops and the grouped GEMM on device buffers): the
 * output, the input gradient
 * and every gathered parameter gradient agree to relative 1e-4 (f32 storage; the GEMMs and sums
 * are reordered). Skipped (exit 0) without a GPU. */
#include "gpu_test.h"
#include <tpk/runtime/nccl.h>
#include <tpk/train/model.h>
#include <tpk/train/train.h>

enum { B = 2, S = 9, T = B * S, H = 32, V = 301, A = 4 };

static tpk_comm world_h, world_d;
static float xin[T * H], dyin[T * H];

enum { K_ATTN, K_MLP, K_BLOCK };
static const char *kind_name[] = {"attention", "MLP", "GPT-2 block"};

typedef struct layer {
    tpk_attention a;
    tpk_mlp m;
    tpk_block b;
} layer;

typedef struct result {
    float y[T * H], dx[T * H];
    float *grad[32];
    int n;
    float loss;
} result;

static void result_free(result *r) {
    for (int i = 0; i < r->n; i++) free(r->grad[i]);
    r->n = 0;
}
static void gather_grads(tpk_ctx *ctx, result *o) {
    CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
    o->n = ctx->params.n < 32 ? ctx->params.n : 32;
    for (int i = 0; i < o->n; i++) {
        size_t gn = tpk_param_global_numel(ctx, i);
        o->grad[i] = malloc(gn * sizeof(float));
        test_poison(o->grad[i], gn);
        CHECK_OK(ctx, tpk_param_get_global(ctx, i, true, o->grad[i]));
    }
}
/* a [T, H] replicated buffer in the backend's memory */
static void *upload(tpk_ctx *ctx, const float *x) {
    void *p = NULL;
    CHECK_OK(ctx, ctx->ops->alloc(ctx, sizeof(float) * T * H, &p));
    CHECK_OK(ctx, ctx->ops->memcpy(ctx, p, x, sizeof(float) * T * H,
                                   ctx->ops->device ? TPK_H2D : TPK_H2H));
    return p;
}
static void download(tpk_ctx *ctx, tpk_tensor t, float *out) {
    test_poison(out, T * H);
    CHECK(t.layout.kind == TPK_LAYOUT_R && tpk_numel(&t) == T * H,
          "expected a replicated [T, H] tensor");
    CHECK_OK(ctx, ctx->ops->memcpy(ctx, out, t.data, sizeof(float) * T * H,
                                   ctx->ops->device ? TPK_D2H : TPK_H2H));
}

static void run_layer(tpk_ctx *ctx, int kind, float p, result *o) {
    layer l;
    memset(&l, 0, sizeof l);
    tpk_status s =
        kind == K_ATTN ? tpk_attention_init(ctx, &l.a, H, A,
                                            &(tpk_attention_desc){.name = "attn", .dropout = p})
        : kind == K_MLP
            ? tpk_mlp_init(ctx, &l.m, H, &(tpk_mlp_desc){.name = "mlp"})
            : tpk_gpt2_block_init(ctx, &l.b, H,
                                  &(tpk_gpt2_block_desc){.name = "h.0", .heads = A, .dropout = p});
    CHECK_OK(ctx, s);
    if (s != TPK_OK) return;
    test_set_weights(ctx, 7, 0.3f);
    void *xd = upload(ctx, xin), *dyd = upload(ctx, dyin);
    tpk_tensor x = tpk_tensor_2d(xd, TPK_F32, T, H, TPK_R),
               dy = tpk_tensor_2d(dyd, TPK_F32, T, H, TPK_R), y, dx;
    s = kind == K_ATTN  ? tpk_attention_forward(ctx, &l.a, x, B, S, &y)
        : kind == K_MLP ? tpk_mlp_forward(ctx, &l.m, x, &y)
                        : tpk_block_forward(ctx, &l.b, x, B, S, &y);
    CHECK_OK(ctx, s);
    if (s == TPK_OK) download(ctx, y, o->y);
    s = kind == K_ATTN  ? tpk_attention_backward(ctx, &l.a, dy, &dx)
        : kind == K_MLP ? tpk_mlp_backward(ctx, &l.m, dy, &dx)
                        : tpk_block_backward(ctx, &l.b, dy, &dx);
    CHECK_OK(ctx, s);
    if (s == TPK_OK) download(ctx, dx, o->dx);
    gather_grads(ctx, o);
    if (kind == K_ATTN) tpk_attention_destroy(ctx, &l.a);
    else if (kind == K_MLP) tpk_mlp_destroy(ctx, &l.m);
    else tpk_block_destroy(ctx, &l.b);
    ctx->ops->free(ctx, xd), ctx->ops->free(ctx, dyd);
}

static void run_model(tpk_ctx *ctx, bool sp, float p, result *o) {
    tpk_gpt2 m;
    tpk_status s = tpk_gpt2_init(ctx, &m,
                                 &(tpk_gpt2_config){.vocab = V,
                                                    .positions = S,
                                                    .layers = 2,
                                                    .hidden = H,
                                                    .heads = A,
                                                    .dropout = p,
                                                    .label_smoothing = 0.1f,
                                                    .sequence_parallel = sp});
    CHECK_OK(ctx, s);
    if (s != TPK_OK) return;
    test_set_weights(ctx, 11, 0.2f);
    int32_t ids[T], tg[T];
    for (int t = 0; t < T; t++) ids[t] = (t * 37 + 5) % V, tg[t] = t == 3 ? -100 : (t * 53 + 1) % V;
    CHECK_OK(ctx, tpk_params_zero_grad(ctx));
    CHECK_OK(ctx, tpk_lm_forward(ctx, &m.lm, ids, tg, B, S, &o->loss));
    CHECK_OK(ctx, tpk_lm_backward(ctx, &m.lm, 1.0f));
    gather_grads(ctx, o);
    tpk_lm_destroy(ctx, &m.lm);
}

/* Llama (A = 4 over G = 2) or GPT-NeoX (half of each head rotated), L = 2, through the handle */
static void run_family(tpk_ctx *ctx, tpk_arch arch, bool sp, result *o) {
    tpk_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = arch;
    int64_t *sh[5];
    tpk_model_config_common(&c, sh, 0.1f, sp, TPK_RECOMPUTE_NONE);
    *sh[0] = V, *sh[1] = S, *sh[2] = 2, *sh[3] = H, *sh[4] = A;
    c.llama.kv_heads = 2, c.llama.ffn = 64, c.neox.ffn = 64, c.neox.rotary_pct = 0.5f;
    tpk_model m;
    tpk_status s = tpk_model_init(ctx, &m, &c);
    CHECK_OK(ctx, s);
    if (s != TPK_OK) return;
    test_set_weights(ctx, 11, 0.2f);
    int32_t ids[T], tg[T];
    for (int t = 0; t < T; t++) ids[t] = (t * 37 + 5) % V, tg[t] = t == 3 ? -100 : (t * 53 + 1) % V;
    CHECK_OK(ctx, tpk_params_zero_grad(ctx));
    CHECK_OK(ctx, tpk_model_forward(ctx, &m, ids, tg, B, S, &o->loss));
    CHECK_OK(ctx, tpk_model_backward(ctx, &m, 1.0f));
    CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
    gather_grads(ctx, o);
    tpk_model_destroy(ctx, &m);
}

/* Mixtral (k = 3 of E = 6 experts, a capacity factor dropping rows) or Qwen2-MoE (k = 2, a shared
 * expert), L = 2, at EP = the ranks (DP = EP, TP 1): each rank routes its own tokens, so the
 * dispatcher's permutations, regroup, all-to-alls, combine and their backward run on the backend's
 * buffers (the row ops of kernels/cuda/rows.cu, the grouped GEMM) */
static void run_moe(tpk_ctx *ctx, tpk_arch arch, result *o) {
    tpk_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = arch;
    int64_t *sh[5];
    tpk_model_config_common(&c, sh, 0.0f, false, TPK_RECOMPUTE_NONE);
    *sh[0] = V, *sh[1] = S, *sh[2] = 2, *sh[3] = H, *sh[4] = A;
    if (arch == TPK_ARCH_MIXTRAL)
        c.mixtral.kv_heads = 2, c.mixtral.ffn = 24, c.mixtral.experts = 6, c.mixtral.top_k = 3,
        c.mixtral.aux_coef = 0.05f, c.mixtral.capacity_factor = 0.6f;
    else
        c.qwen2_moe.kv_heads = 2, c.qwen2_moe.moe_ffn = 24, c.qwen2_moe.shared_ffn = 16,
        c.qwen2_moe.experts = 6, c.qwen2_moe.top_k = 2, c.qwen2_moe.aux_coef = 0.05f;
    tpk_model m;
    tpk_status s = tpk_model_init(ctx, &m, &c);
    CHECK_OK(ctx, s);
    if (s != TPK_OK) return;
    test_set_weights(ctx, 11, 0.2f);
    int32_t ids[T], tg[T];
    for (int t = 0; t < T; t++) /* this rank's tokens */
        ids[t] = (t * 37 + 5 + 11 * test__rank) % V, tg[t] = (t * 53 + 1 + test__rank) % V;
    CHECK_OK(ctx, tpk_params_zero_grad(ctx));
    CHECK_OK(ctx, tpk_model_forward(ctx, &m, ids, tg, B, S, &o->loss));
    CHECK_OK(ctx, tpk_model_backward(ctx, &m, 1.0f));
    gather_grads(ctx, o);
    tpk_model_destroy(ctx, &m);
}

/* Llama (A = 4 over G = 2, rotary), L = 2, under context parallelism: the context's CP group
 * holds the ranks (t = 1), each given its rows of B sequences of SC tokens (tpk_cp_scatter_host):
 * the attention over CP (attn_block_fwd / _bwd), the rotary embedding at the rows' true positions
 * (rope_at) */
enum { SC = 8 };
static void run_family_cp(tpk_ctx *ctx, result *o) {
    tpk_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = TPK_ARCH_LLAMA;
    int64_t *sh[5];
    tpk_model_config_common(&c, sh, 0.1f, false, TPK_RECOMPUTE_NONE);
    *sh[0] = V, *sh[1] = SC, *sh[2] = 2, *sh[3] = H, *sh[4] = A;
    c.llama.kv_heads = 2, c.llama.ffn = 64;
    tpk_model m;
    tpk_status s = tpk_model_init(ctx, &m, &c);
    CHECK_OK(ctx, s);
    if (s != TPK_OK) return;
    test_set_weights(ctx, 11, 0.2f);
    int32_t ids[B * SC], tg[B * SC], li[B * SC], lt[B * SC];
    for (int t = 0; t < B * SC; t++)
        ids[t] = (t * 37 + 5) % V, tg[t] = t == 3 ? -100 : (t * 53 + 1) % V;
    CHECK_OK(ctx, tpk_cp_scatter_host(ctx, li, ids, B, SC, sizeof(int32_t)));
    CHECK_OK(ctx, tpk_cp_scatter_host(ctx, lt, tg, B, SC, sizeof(int32_t)));
    CHECK_OK(ctx, tpk_params_zero_grad(ctx));
    CHECK_OK(ctx, tpk_model_forward(ctx, &m, li, lt, B, SC, &o->loss));
    CHECK_OK(ctx, tpk_model_backward(ctx, &m, 1.0f));
    CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
    gather_grads(ctx, o);
    tpk_model_destroy(ctx, &m);
}

static void compare(tpk_ctx *ch, const result *d, const result *h, bool outputs) {
    if (outputs) {
        CHECK_CLOSE(d->y, h->y, T * H, 1e-4, "output");
        CHECK_CLOSE(d->dx, h->dx, T * H, 1e-4, "input gradient");
    }
    CHECK(d->n == h->n, "%d parameters, host %d", d->n, h->n);
    for (int i = 0; i < d->n && i < h->n; i++) {
        char what[160];
        snprintf(what, sizeof what, "gradient of %s", ch->params.list[i].name);
        CHECK_CLOSE(d->grad[i], h->grad[i], tpk_param_global_numel(ch, i), 1e-4, what);
    }
}

static bool contexts_on(tpk_ctx *ch, tpk_ctx *cd, tpk_comm *wd) {
    tpk_status s = tpk_ctx_init(
        ch, &(tpk_ctx_desc){.ops = tpk_ops_host(), .world = &world_h, .tp = test__size, .seed = 3});
    if (s == TPK_OK)
        s = tpk_ctx_init(
            cd, &(tpk_ctx_desc){.ops = tpk_ops_cuda(), .world = wd, .tp = test__size, .seed = 3});
    if (s != TPK_OK)
        fprintf(stderr, "tpk_ctx_init: %s / %s\n", tpk_last_error(ch), tpk_last_error(cd));
    return s == TPK_OK;
}
static bool contexts(tpk_ctx *ch, tpk_ctx *cd) { return contexts_on(ch, cd, &world_d); }

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    gpu_require("tests/gpu/layers");
    tpk_ctx boot;
    memset(&boot, 0, sizeof boot);
    if (tpk_comm_mpi(&boot, MPI_COMM_WORLD, &world_h) != TPK_OK) return 1;
    /* NCCL wants one GPU per rank: at one rank NCCL, else MPI with device staging */
    tpk_status s = test__size == 1 ? tpk_comm_nccl_mpi(&boot, MPI_COMM_WORLD, NULL, &world_d)
                                   : tpk_comm_mpi(&boot, MPI_COMM_WORLD, &world_d);
    if (s != TPK_OK) {
        fprintf(stderr, "world communicator: %s\n", tpk_last_error(&boot));
        return 1;
    }
    test_randn(xin, T * H, 1, 1.0f);
    test_randn(dyin, T * H, 2, 1.0f);
    for (int kind = 0; kind < 3; kind++)
        for (int d = 0; d < 2; d++) {
            if (kind == K_MLP && d) continue;
            float p = d ? 0.2f : 0.0f;
            TEST_CASE("%s, cuda (%s) vs host, t=%d, dropout %g", kind_name[kind], world_d.vt->name,
                      test__size, (double)p) {
                tpk_ctx ch, cd;
                if (contexts(&ch, &cd)) {
                    static result rh, rd;
                    run_layer(&ch, kind, p, &rh);
                    run_layer(&cd, kind, p, &rd);
                    compare(&ch, &rd, &rh, true);
                    result_free(&rh), result_free(&rd);
                }
                tpk_ctx_destroy(&ch), tpk_ctx_destroy(&cd);
            }
        }
    bool sp = test__size % 2 == 1 && test__size > 1;
    tpk_comm self_d = tpk_comm_self_cuda();
    for (int w = 0; w < (test__size == 1 ? 2 : 1); w++)
        TEST_CASE("GPT-2 model, cuda (%s) vs host, t=%d%s, dropout 0.1",
                  w ? self_d.vt->name : world_d.vt->name, test__size, sp ? ", SP" : "") {
            tpk_ctx ch, cd;
            if (contexts_on(&ch, &cd, w ? &self_d : &world_d)) {
                static result rh, rd;
                run_model(&ch, sp, 0.1f, &rh);
                run_model(&cd, sp, 0.1f, &rd);
                CHECK(fabsf(rd.loss - rh.loss) <= 1e-4f * fabsf(rh.loss), "loss %.7g, host %.7g",
                      (double)rd.loss, (double)rh.loss);
                compare(&ch, &rd, &rh, false);
                result_free(&rh), result_free(&rd);
            }
            tpk_ctx_destroy(&ch), tpk_ctx_destroy(&cd);
        }
    for (int a = TPK_ARCH_LLAMA; a <= TPK_ARCH_NEOX; a++)
        TEST_CASE("%s model, cuda (%s) vs host, t=%d%s", tpk__model_family((tpk_arch)a)->title,
                  world_d.vt->name, test__size, sp ? ", SP" : "") {
            tpk_ctx ch, cd;
            if (contexts(&ch, &cd)) {
                static result rh, rd;
                run_family(&ch, (tpk_arch)a, sp, &rh);
                run_family(&cd, (tpk_arch)a, sp, &rd);
                CHECK(fabsf(rd.loss - rh.loss) <= 1e-4f * fabsf(rh.loss), "loss %.7g, host %.7g",
                      (double)rd.loss, (double)rh.loss);
                compare(&ch, &rd, &rh, false);
                result_free(&rh), result_free(&rd);
            }
            tpk_ctx_destroy(&ch), tpk_ctx_destroy(&cd);
        }
    /* a mixture of experts at EP = the ranks (E = 6: 3 or 2 experts a rank) */
    for (int a = TPK_ARCH_MIXTRAL; a <= TPK_ARCH_QWEN2_MOE && test__size > 1; a++)
        TEST_CASE("%s model at EP %d, cuda (%s) vs host: each rank's loss and every gradient",
                  tpk__model_family((tpk_arch)a)->title, test__size, world_d.vt->name) {
            tpk_ctx ch, cd;
            memset(&ch, 0, sizeof ch), memset(&cd, 0, sizeof cd);
            tpk_ctx_desc dh = {.ops = tpk_ops_host(), .world = &world_h, .ep = test__size},
                         dd = {.ops = tpk_ops_cuda(), .world = &world_d, .ep = test__size};
            dh.seed = dd.seed = 3;
            tpk_status cs = tpk_ctx_init(&ch, &dh);
            if (cs == TPK_OK) cs = tpk_ctx_init(&cd, &dd);
            CHECK(cs == TPK_OK, "tpk_ctx_init: %s / %s", tpk_last_error(&ch), tpk_last_error(&cd));
            if (cs == TPK_OK) {
                static result rh, rd;
                run_moe(&ch, (tpk_arch)a, &rh);
                run_moe(&cd, (tpk_arch)a, &rd);
                CHECK(fabsf(rd.loss - rh.loss) <= 1e-4f * fabsf(rh.loss), "loss %.7g, host %.7g",
                      (double)rd.loss, (double)rh.loss);
                compare(&ch, &rd, &rh, false);
                result_free(&rh), result_free(&rd);
            }
            tpk_ctx_destroy(&ch), tpk_ctx_destroy(&cd);
        }
    /* context parallelism: CP 2 (t = 1 at 2 ranks, TP 2 x CP 2 at 4), each rank's loss share and
     * gradients (its rows' part) against the host's on the same rows */
    if (test__size % 2 == 0)
        TEST_CASE("Llama model under context parallelism, cuda (%s) vs host, TP %d x CP 2",
                  world_d.vt->name, test__size / 2) {
            tpk_ctx ch, cd;
            memset(&ch, 0, sizeof ch), memset(&cd, 0, sizeof cd);
            tpk_ctx_desc dh = {.ops = tpk_ops_host(), .world = &world_h, .tp = test__size / 2},
                         dd = {.ops = tpk_ops_cuda(), .world = &world_d, .tp = test__size / 2};
            dh.cp = dd.cp = 2, dh.seed = dd.seed = 3;
            tpk_status cs = tpk_ctx_init(&ch, &dh);
            if (cs == TPK_OK) cs = tpk_ctx_init(&cd, &dd);
            CHECK(cs == TPK_OK, "tpk_ctx_init: %s / %s", tpk_last_error(&ch), tpk_last_error(&cd));
            if (cs == TPK_OK) {
                static result rh, rd;
                run_family_cp(&ch, &rh);
                run_family_cp(&cd, &rd);
                CHECK(fabsf(rd.loss - rh.loss) <= 1e-4f * fabsf(rh.loss), "loss %.7g, host %.7g",
                      (double)rd.loss, (double)rh.loss);
                compare(&ch, &rd, &rh, false);
                result_free(&rh), result_free(&rd);
            }
            tpk_ctx_destroy(&ch), tpk_ctx_destroy(&cd);
        }
    /* host waits per training step (no host synchronisation inside a step except reading values):
     * the loss is computed with the backward (deferred, xent_fused) and stays on the device, summed
     * (xent_mean); the gradient norm's sum of squares stays there too and AdamW clips from it
     * (tpk_train_step with norm = NULL); a log step reads the loss (tpk_xent_loss_read) and the
     * norm (tpk_train_norm_read): one download each */
    if (test__size == 1)
        TEST_CASE(
            "a GPT-2 training step on the GPU (bf16, dropout 0.1, clipping) does not wait for the "
            "device; reading the loss and the norm waits once each") {
            tpk_ctx cd;
            tpk_gpt2 m;
            tpk_adamw opt;
            tpk_dp_buckets b;
            memset(&m, 0, sizeof m), memset(&opt, 0, sizeof opt), memset(&b, 0, sizeof b);
            CHECK_OK(&cd, tpk_ctx_init(&cd, &(tpk_ctx_desc){.ops = tpk_ops_cuda(),
                                                            .world = &self_d,
                                                            .seed = 3,
                                                            .dtype = TPK_BF16}));
            CHECK_OK(&cd, tpk_gpt2_init(&cd, &m,
                                        &(tpk_gpt2_config){.vocab = V,
                                                           .positions = S,
                                                           .layers = 2,
                                                           .hidden = H,
                                                           .heads = A,
                                                           .dropout = 0.1f}));
            CHECK_OK(&cd, tpk_adamw_init(&cd, &opt, NULL));
            int32_t ids[T], tg[T];
            for (int t = 0; t < T; t++) ids[t] = (t * 37 + 5) % V, tg[t] = (t * 53 + 1) % V;
            unsigned long long waits = 0, read_waits = 0, norm_waits = 0;
            for (int step = 0; step < 3; step++) { /* step 0 warms up (plans, scratch) */
                unsigned long long before = tpk_cuda_sync_count();
                double norm = 0, loss = NAN;
                int64_t n = 0;
                cd.rng_step = (uint64_t)step;
                CHECK_OK(&cd, tpk_params_zero_grad(&cd));
                tpk_xent_loss_reset(&m.lm.ce);
                /* deferred: the loss comes with the backward */
                CHECK_OK(&cd, tpk_lm_forward(&cd, &m.lm, ids, tg, B, S, NULL));
                CHECK_OK(&cd, tpk_lm_backward(&cd, &m.lm, 1.0f));
                CHECK_OK(&cd, tpk_train_step(&cd, &opt, &b, 1e-3f, 0.5f, 1.0f,
                                             NULL)); /* norm, clip, AdamW on the device */
                waits = tpk_cuda_sync_count() - before;
                before = tpk_cuda_sync_count();
                /* a log step reads it */
                CHECK_OK(&cd, tpk_xent_loss_read(&cd, &m.lm.ce, &loss, &n));
                read_waits = tpk_cuda_sync_count() - before;
                before = tpk_cuda_sync_count();
                CHECK_OK(&cd, tpk_train_norm_read(&cd, 1.0f, &norm));
                norm_waits = tpk_cuda_sync_count() - before;
                CHECK(n == 1 && isfinite(loss) && isfinite(norm) && norm > 0,
                      "step %d: %lld forwards, loss %g, norm %g", step, (long long)n, loss, norm);
            }
            CHECK(waits == 0, "a training step waited %llu times for the device", waits);
            CHECK(read_waits <= 1 && norm_waits <= 1,
                  "reading the loss waited %llu times, the norm %llu", read_waits, norm_waits);
            printf(
                "  a training step waits %llu times for the device, reading its loss %llu more, "
                "its norm %llu\n",
                waits, read_waits, norm_waits);
            tpk_adamw_destroy(&cd, &opt), tpk_lm_destroy(&cd, &m.lm), tpk_ctx_destroy(&cd);
        }
    tpk_comm_destroy(&world_d);
    tpk_comm_destroy(&world_h);
    return test_finish();
}
