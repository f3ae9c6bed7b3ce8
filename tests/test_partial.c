/* tests/test_partial.c — partial outputs for tensor parallelism: the layer options that leave a
 * tensor P (whole-shaped, the true value the sum over TP ranks) instead of reducing it, and the
 * residual stream's crossings (tpk_stream) that reduce once for several branches.
 *   - each option against the unsharded layer (t = 1, the ordinary layer, run on every rank with
 *     the same weights and inputs): a row linear's partial_output (input S(-1) or R, with and
 *     without sequence parallelism), a column linear's partial_dx (with and without SP), the
 *     attentions' (GPT-2's, GPT-NeoX's per-head rotary one, grouped-query) and the MLPs' (GELU,
 *     SwiGLU) partial_output and partial_dx alone and together, the norms' partial_dy: outputs
 *     and input gradients summed over the ranks where P, every gathered gradient (after
 *     tpk_params_reduce_partial_grads), to relative 1e-5; the layouts returned; the collectives
 *     counted (a partial option does none of its own); a norm's backward_add on a partial
 *     accumulator. A P input gradient is fed as a random split of the global one over the ranks.
 *   - the parallel residual block y = x + attn(n1(x)) + mlp(n2(x)) (GPT-NeoX's layers and
 *     Llama's) built from the partial options and tpk_stream against the same block of ordinary
 *     (reducing) layers on the same mesh and unsharded: y, dx and every gradient, with and
 *     without SP, over even and weighted TP splits; exactly 1 all-reduce of T H forward and 1
 *     backward (SP: 1 all-gather and 1 reduce-scatter each way) against the ordinary block's 2.
 *   - bad input: a P tensor where R is expected (and the reverse), options on the wrong linear,
 *     partial_dy with SP, the stream's backward before its forward.
 * Uneven splits: T = 10 tokens, 6 heads, MLP widths 100 and 50, linears 10 -> 7 and 7 -> 10 over
 * 3 and 4 ranks. Run at 1..4 ranks. */
#include "test.h"

static int me, np;
static tpk_comm world;
enum { B = 2, S = 5, T = B * S, H = 48, A = 6 };

/* ---- local tensors -------------------------------------------------------------------------- */

/* Rank q's share of a P tensor of global value g: noise for q > 0, g minus the others' on rank 0;
 * the shares sum to g. */
static float share(const tpk_ctx *ctx, const float *g, size_t i, int q) {
    if (q) return 0.5f * tpk_rng_normal(4321 + (uint64_t)q, 0x9a, i);
    float v = g[i];
    for (int r = 1; r < ctx->tp.size; r++) v -= 0.5f * tpk_rng_normal(4321 + (uint64_t)r, 0x9a, i);
    return v;
}
/* This rank's part of a global [rows, cols] tensor g in layout l (R, S(d) or P), in a new
 * buffer. */
static tpk_tensor local_of(tpk_ctx *ctx, const float *g, int64_t rows, int64_t cols, tpk_layout l) {
    size_t n = (size_t)(rows * cols);
    tpk_tensor R = tpk_tensor_2d((void *)g, TPK_F32, rows, cols, TPK_R), out;
    memset(&out, 0, sizeof out);
    out.data = malloc((n + 1) * sizeof(float));
    if (l.kind == TPK_LAYOUT_R) {
        memcpy(out.data, g, n * sizeof(float));
        out = tpk_tensor_2d(out.data, TPK_F32, rows, cols, TPK_R);
    } else if (l.kind == TPK_LAYOUT_P) {
        for (size_t i = 0; i < n; i++) ((float *)out.data)[i] = share(ctx, g, i, ctx->tp.rank);
        out = tpk_tensor_2d(out.data, TPK_F32, rows, cols, TPK_P);
    } else {
        CHECK_OK(ctx, tpk_convert(ctx, &R, l, &out));
    }
    return out;
}
/* The global value of a local tensor (R, S or P: summed) into g[rows cols], poisoned first. */
static void global_of(tpk_ctx *ctx, tpk_tensor t, float *g) {
    size_t n = (size_t)(t.gshape[0] * t.gshape[1]);
    test_poison(g, n);
    if (t.layout.kind == TPK_LAYOUT_R) {
        memcpy(g, t.data, n * sizeof(float));
        return;
    }
    tpk_tensor o;
    memset(&o, 0, sizeof o);
    o.data = g;
    CHECK_OK(ctx, tpk_convert(ctx, &t, TPK_R, &o));
}
static bool same_layout(tpk_layout a, tpk_layout b) { return tpk_layout_eq(a, b, 2); }
static const char *lstr(tpk_layout l) {
    static char buf[4][64];
    static int k;
    k = (k + 1) % 4;
    return tpk_layout_str(l, buf[k], sizeof buf[k]);
}

typedef struct counts {
    uint64_t ag, ar, rs;
} counts;
/* exactly these collectives, nothing else */
static void check_counts(const tpk_comm_stats *s, counts want, const char *dir) {
    uint64_t total = 0;
    for (int q = 0; q < TPK_COLL_N; q++) total += s->calls[q];
    CHECK(s->calls[TPK_COLL_ALLGATHER] == want.ag && s->calls[TPK_COLL_ALLREDUCE] == want.ar &&
              s->calls[TPK_COLL_REDUCE_SCATTER] == want.rs && total == want.ag + want.ar + want.rs,
          "%s: %llu collectives (%llu all-gathers, %llu all-reduces, %llu reduce-scatters); "
          "expected %llu, %llu, %llu",
          dir, (unsigned long long)total, (unsigned long long)s->calls[TPK_COLL_ALLGATHER],
          (unsigned long long)s->calls[TPK_COLL_ALLREDUCE],
          (unsigned long long)s->calls[TPK_COLL_REDUCE_SCATTER], (unsigned long long)want.ag,
          (unsigned long long)want.ar, (unsigned long long)want.rs);
}

/* ---- one layer with its options ------------------------------------------------------------- */

enum { ROWL, COLL, ATTN, NEOX, GQA, MLP, SWIGLU, LN, RMS, NKIND };
static const char *kind_name[NKIND] = {"row linear 10->7",   "column linear 7->10", "attention",
                                       "GPT-NeoX attention", "GQA attention",       "GELU MLP",
                                       "SwiGLU MLP",         "layernorm",           "RMSNorm"};

typedef struct lay {
    int kind;
    bool po, pdx, sp, xR; /* partial output, partial dx (norms: partial_dy), SP, row input R */
    tpk_linear lin;
    tpk_attention at;
    tpk_gqa_attention gq;
    tpk_mlp mlp;
    tpk_swiglu_mlp sw;
    tpk_layernorm ln;
    tpk_rmsnorm rms;
} lay;

static int64_t lay_in(const lay *L) { return L->kind == ROWL ? 10 : L->kind == COLL ? 7 : H; }
static int64_t lay_out(const lay *L) { return L->kind == ROWL ? 7 : L->kind == COLL ? 10 : H; }
static bool is_norm(const lay *L) { return L->kind == LN || L->kind == RMS; }
static tpk_layout x_layout(const lay *L) {
    if (L->kind == ROWL) return L->xR ? TPK_R : TPK_S(-1);
    return L->sp ? TPK_S(0) : TPK_R;
}
static tpk_layout y_layout(const lay *L) {
    if (L->kind == COLL) return TPK_S(-1);
    if (is_norm(L)) return TPK_R;
    return L->po ? TPK_P : L->sp ? TPK_S(0) : TPK_R;
}
static tpk_layout dy_layout(const lay *L) {
    if (L->kind == COLL) return TPK_S(-1);
    if (is_norm(L)) return L->pdx ? TPK_P : TPK_R;
    return L->po ? TPK_R : L->sp ? TPK_S(0) : TPK_R;
}
static tpk_layout dx_layout(const lay *L) {
    if (L->kind == ROWL) return x_layout(L);
    if (is_norm(L)) return L->pdx ? TPK_P : TPK_R;
    return L->pdx ? TPK_P : L->sp ? TPK_S(0) : TPK_R;
}
/* the collectives: a partial option does none of its own; under SP the column linears gather
 * their input (again in the backward) and a reducing row linear gathers dy */
static counts fwd_counts(const lay *L) {
    counts c = {0, 0, 0};
    bool red = !L->po && L->kind != COLL && !is_norm(L);
    c.ag = L->sp && L->kind != ROWL;
    c.ar = red && !L->sp, c.rs = red && L->sp;
    return c;
}
static counts bwd_counts(const lay *L) {
    counts c = {0, 0, 0};
    if (is_norm(L)) return c;
    bool red = !L->pdx && L->kind != ROWL;
    c.ag = (L->sp && L->kind != ROWL) + (L->sp && !L->po && L->kind != COLL) + L->xR;
    c.ar = red && !L->sp, c.rs = red && L->sp;
    return c;
}

static tpk_status lay_init(tpk_ctx *ctx, lay *L) {
    bool po = L->po, pdx = L->pdx, sp = L->sp;
    switch (L->kind) {
        case ROWL:
            return tpk_row_linear_init(
                ctx, &L->lin, 10, 7,
                &(tpk_linear_desc){
                    .name = "lin", .bias = true, .sequence_parallel = sp, .partial_output = po});
        case COLL:
            return tpk_col_linear_init(
                ctx, &L->lin, 7, 10,
                &(tpk_linear_desc){
                    .name = "lin", .bias = true, .sequence_parallel = sp, .partial_dx = pdx});
        case ATTN:
        case NEOX:
            return tpk_attention_init(ctx, &L->at, H, A,
                                      &(tpk_attention_desc){.name = "attn",
                                                            .qkv_per_head = L->kind == NEOX,
                                                            .rotary_dim = L->kind == NEOX ? 4 : 0,
                                                            .sequence_parallel = sp,
                                                            .dropout = 0.1f,
                                                            .partial_output = po,
                                                            .partial_dx = pdx});
        case GQA:
            return tpk_gqa_attention_init(ctx, &L->gq, H, A,
                                          &(tpk_gqa_attention_desc){.name = "attn",
                                                                    .kv_heads = 2,
                                                                    .bias = true,
                                                                    .sequence_parallel = sp,
                                                                    .partial_output = po,
                                                                    .partial_dx = pdx});
        case MLP:
            return tpk_mlp_init(ctx, &L->mlp, H,
                                &(tpk_mlp_desc){.name = "mlp",
                                                .hidden = 100,
                                                .act = TPK_ACT_GELU,
                                                .sequence_parallel = sp,
                                                .partial_output = po,
                                                .partial_dx = pdx});
        case SWIGLU:
            return tpk_swiglu_mlp_init(ctx, &L->sw, H,
                                       &(tpk_swiglu_mlp_desc){.name = "mlp",
                                                              .hidden = 50,
                                                              .bias = true,
                                                              .sequence_parallel = sp,
                                                              .partial_output = po,
                                                              .partial_dx = pdx});
        case LN:
            return tpk_layernorm_init(ctx, &L->ln, H,
                                      &(tpk_layernorm_desc){.name = "ln", .partial_dy = pdx});
        default:
            return tpk_rmsnorm_init(ctx, &L->rms, H,
                                    &(tpk_rmsnorm_desc){.name = "rms", .partial_dy = pdx});
    }
}
static tpk_status lay_fwd(tpk_ctx *ctx, lay *L, tpk_tensor x, tpk_tensor *y) {
    switch (L->kind) {
        case ROWL: return tpk_row_linear_forward(ctx, &L->lin, x, y);
        case COLL: return tpk_col_linear_forward(ctx, &L->lin, x, y);
        case ATTN:
        case NEOX: return tpk_attention_forward(ctx, &L->at, x, B, S, y);
        case GQA: return tpk_gqa_attention_forward(ctx, &L->gq, x, B, S, y);
        case MLP: return tpk_mlp_forward(ctx, &L->mlp, x, y);
        case SWIGLU: return tpk_swiglu_mlp_forward(ctx, &L->sw, x, y);
        case LN: return tpk_layernorm_forward(ctx, &L->ln, x, y);
        default: return tpk_rmsnorm_forward(ctx, &L->rms, x, y);
    }
}
static tpk_status lay_bwd(tpk_ctx *ctx, lay *L, tpk_tensor dy, tpk_tensor *dx) {
    switch (L->kind) {
        case ROWL: return tpk_row_linear_backward(ctx, &L->lin, dy, dx);
        case COLL: return tpk_col_linear_backward(ctx, &L->lin, dy, dx);
        case ATTN:
        case NEOX: return tpk_attention_backward(ctx, &L->at, dy, dx);
        case GQA: return tpk_gqa_attention_backward(ctx, &L->gq, dy, dx);
        case MLP: return tpk_mlp_backward(ctx, &L->mlp, dy, dx);
        case SWIGLU: return tpk_swiglu_mlp_backward(ctx, &L->sw, dy, dx);
        case LN: return tpk_layernorm_backward(ctx, &L->ln, dy, dx);
        default: return tpk_rmsnorm_backward(ctx, &L->rms, dy, dx);
    }
}
static void lay_destroy(tpk_ctx *ctx, lay *L) {
    switch (L->kind) {
        case ROWL:
        case COLL: tpk_linear_destroy(ctx, &L->lin); break;
        case ATTN:
        case NEOX: tpk_attention_destroy(ctx, &L->at); break;
        case GQA: tpk_gqa_attention_destroy(ctx, &L->gq); break;
        case MLP: tpk_mlp_destroy(ctx, &L->mlp); break;
        case SWIGLU: tpk_swiglu_mlp_destroy(ctx, &L->sw); break;
        case LN: tpk_layernorm_destroy(ctx, &L->ln); break;
        default: tpk_rmsnorm_destroy(ctx, &L->rms); break;
    }
}

typedef struct result {
    float *y, *dx; /* global */
    float *grad[16];
    int n;
    tpk_comm_stats fwd, bwd;
} result;
static void result_free(result *r) {
    free(r->y), free(r->dx), r->y = r->dx = NULL;
    test_free_grads(r->grad, &r->n);
}

/* Forward and backward of L on ctx (weights test_set_weights(7, 0.3)) from the global X and DY,
 * the layouts checked; the partial gradients summed. Nonzero on failure. */
static int run_layer(tpk_ctx *ctx, lay *L, const float *X, const float *DY, result *o) {
    int f0 = test__fails_case;
    memset(o, 0, sizeof *o);
    CHECK_OK(ctx, lay_init(ctx, L));
    if (test__fails_case > f0) return 1;
    test_set_weights(ctx, 7, 0.3f);
    int64_t ni = lay_in(L), no = lay_out(L);
    tpk_tensor x = local_of(ctx, X, T, ni, x_layout(L)),
               dy = local_of(ctx, DY, T, no, dy_layout(L));
    tpk_tensor y, dx;
    memset(&y, 0, sizeof y), memset(&dx, 0, sizeof dx);
    o->y = (float *)malloc(sizeof(float) * (size_t)(T * no));
    o->dx = (float *)malloc(sizeof(float) * (size_t)(T * ni));
    tpk_comm_stats_reset(&ctx->tp);
    CHECK_OK(ctx, lay_fwd(ctx, L, x, &y));
    o->fwd = ctx->tp.stats;
    if (test__fails_case == f0) {
        CHECK(same_layout(y.layout, y_layout(L)), "y: layout %s, expected %s", lstr(y.layout),
              lstr(y_layout(L)));
        if (test__fails_case == f0) global_of(ctx, y, o->y);
        tpk_comm_stats_reset(&ctx->tp);
        CHECK_OK(ctx, lay_bwd(ctx, L, dy, &dx));
        o->bwd = ctx->tp.stats;
    }
    if (test__fails_case == f0) {
        CHECK(same_layout(dx.layout, dx_layout(L)), "dx: layout %s, expected %s", lstr(dx.layout),
              lstr(dx_layout(L)));
        if (test__fails_case == f0) global_of(ctx, dx, o->dx);
        CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
        o->n = test_gather_grads(ctx, o->grad, 16);
    }
    lay_destroy(ctx, L);
    free(x.data), free(dy.data);
    return test__fails_case > f0;
}

static void compare(tpk_ctx *sh, const result *a, const result *b, int64_t ny, int64_t nx,
                    double tol) {
    CHECK_CLOSE(a->y, b->y, (size_t)(T * ny), tol, "output");
    CHECK_CLOSE(a->dx, b->dx, (size_t)(T * nx), tol, "input gradient");
    CHECK(a->n == b->n, "%d parameters, reference %d", a->n, b->n);
    for (int i = 0; i < a->n && i < b->n; i++) {
        char what[160];
        snprintf(what, sizeof what, "gradient of %s", sh->params.list[i].name);
        CHECK_CLOSE(a->grad[i], b->grad[i], tpk_param_global_numel(sh, i), tol, what);
    }
}

static void test_layer_option(lay L) {
    float X[T * H], DY[T * H];
    int64_t ni = lay_in(&L), no = lay_out(&L);
    test_randn(X, (size_t)(T * ni), 11 + (uint64_t)L.kind, 1.0f);
    test_randn(DY, (size_t)(T * no), 12 + (uint64_t)L.kind, 1.0f);
    tpk_ctx sh, un;
    CHECK_OK(&sh, tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5}));
    CHECK_OK(&un, tpk_ctx_init(&un, &(tpk_ctx_desc){.seed = 5}));
    lay R = L;
    R.po = R.pdx = R.sp = R.xR = false;
    result a, b;
    if (!run_layer(&sh, &L, X, DY, &a) && !run_layer(&un, &R, X, DY, &b)) {
        compare(&sh, &a, &b, no, ni, 1e-5);
        check_counts(&a.fwd, fwd_counts(&L), "forward");
        check_counts(&a.bwd, bwd_counts(&L), "backward");
        if (is_norm(&L)) { /* the weight gradients are marked partial, summed once per step */
            int flagged = 0;
            for (int i = 0; i < sh.params.n; i++) flagged += sh.params.list[i].tp_partial_grad;
            CHECK(flagged == sh.params.n, "%d of %d parameters marked tp_partial_grad", flagged,
                  sh.params.n);
        }
    }
    result_free(&a), result_free(&b);
    tpk_ctx_destroy(&sh), tpk_ctx_destroy(&un);
}

/* A norm with partial_dy: backward_add onto a partial accumulator adds its partial dx, so the
 * accumulator's sum is the accumulators' sum plus the true dx; the weight gradients as apart. */
static void test_norm_add(int kind) {
    float X[T * H], DY[T * H], ACC[T * H], want[T * H], got[T * H];
    test_randn(X, T * H, 21, 1.0f), test_randn(DY, T * H, 22, 1.0f);
    test_randn(ACC, T * H, 23, 1.0f);
    tpk_ctx sh, un;
    CHECK_OK(&sh, tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5}));
    CHECK_OK(&un, tpk_ctx_init(&un, &(tpk_ctx_desc){.seed = 5}));
    lay L, R;
    memset(&L, 0, sizeof L);
    L.kind = kind, L.pdx = true;
    R = L, R.pdx = false;
    result b;
    if (!run_layer(&un, &R, X, DY, &b)) {
        for (int i = 0; i < T * H; i++) want[i] = ACC[i] + b.dx[i];
        CHECK_OK(&sh, lay_init(&sh, &L));
        test_set_weights(&sh, 7, 0.3f);
        tpk_tensor x = local_of(&sh, X, T, H, TPK_R), dy = local_of(&sh, DY, T, H, TPK_P),
                   acc = local_of(&sh, ACC, T, H, TPK_P), y;
        CHECK_OK(&sh, lay_fwd(&sh, &L, x, &y));
        tpk_comm_stats_reset(&sh.tp);
        CHECK_OK(&sh, kind == LN ? tpk_layernorm_backward_add(&sh, &L.ln, dy, acc)
                                 : tpk_rmsnorm_backward_add(&sh, &L.rms, dy, acc));
        uint64_t calls = 0;
        for (int q = 0; q < TPK_COLL_N; q++) calls += sh.tp.stats.calls[q];
        CHECK(calls == 0, "backward_add: %llu collectives, expected none",
              (unsigned long long)calls);
        global_of(&sh, acc, got);
        CHECK_CLOSE(got, want, T * H, 1e-5, "accumulated input gradient");
        CHECK_OK(&sh, tpk_params_reduce_partial_grads(&sh));
        float *g[16];
        int n = test_gather_grads(&sh, g, 16);
        CHECK(n == b.n, "%d parameters, reference %d", n, b.n);
        for (int i = 0; i < n && i < b.n; i++)
            CHECK_CLOSE(g[i], b.grad[i], tpk_param_global_numel(&sh, i), 1e-5,
                        sh.params.list[i].name);
        test_free_grads(g, &n);
        lay_destroy(&sh, &L);
        free(x.data), free(dy.data), free(acc.data);
    }
    result_free(&b);
    tpk_ctx_destroy(&sh), tpk_ctx_destroy(&un);
}

/* ---- the parallel residual block ------------------------------------------------------------ */

typedef struct blk {
    bool llama, partial, sp;
    tpk_layernorm ln1, ln2;
    tpk_rmsnorm rn1, rn2;
    tpk_attention at;
    tpk_gqa_attention gq;
    tpk_mlp mlp;
    tpk_swiglu_mlp sw;
    tpk_stream st;
    float *y, *dx; /* this rank's y and dx (the stream's layout) */
} blk;

static tpk_status blk_norm_init(tpk_ctx *ctx, blk *b, int i) {
    bool sp = b->sp && !b->partial, pd = b->partial;
    const char *name = i ? "ln_2" : "ln_1";
    if (b->llama)
        return tpk_rmsnorm_init(
            ctx, i ? &b->rn2 : &b->rn1, H,
            &(tpk_rmsnorm_desc){.name = name, .sequence_parallel = sp, .partial_dy = pd});
    return tpk_layernorm_init(
        ctx, i ? &b->ln2 : &b->ln1, H,
        &(tpk_layernorm_desc){.name = name, .sequence_parallel = sp, .partial_dy = pd});
}
/* ln_1, attn, ln_2, mlp: ordinary (sequence parallel with the block), or partial (the norms'
 * partial_dy, the branches' partial_output and partial_dx, none SP: only the stream is) */
static tpk_status blk_init(tpk_ctx *ctx, blk *b) {
    bool sp = b->sp && !b->partial, p = b->partial;
    TPK_TRY(blk_norm_init(ctx, b, 0));
    if (b->llama)
        TPK_TRY(tpk_gqa_attention_init(ctx, &b->gq, H, A,
                                       &(tpk_gqa_attention_desc){.name = "attn",
                                                                 .kv_heads = 3,
                                                                 .sequence_parallel = sp,
                                                                 .dropout = 0.1f,
                                                                 .partial_output = p,
                                                                 .partial_dx = p}));
    else
        TPK_TRY(tpk_attention_init(ctx, &b->at, H, A,
                                   &(tpk_attention_desc){.name = "attn",
                                                         .qkv_per_head = true,
                                                         .rotary_dim = 4,
                                                         .sequence_parallel = sp,
                                                         .dropout = 0.1f,
                                                         .partial_output = p,
                                                         .partial_dx = p}));
    TPK_TRY(blk_norm_init(ctx, b, 1));
    if (b->llama)
        TPK_TRY(tpk_swiglu_mlp_init(ctx, &b->sw, H,
                                    &(tpk_swiglu_mlp_desc){.name = "mlp",
                                                           .hidden = 50,
                                                           .sequence_parallel = sp,
                                                           .partial_output = p,
                                                           .partial_dx = p}));
    else
        TPK_TRY(tpk_mlp_init(ctx, &b->mlp, H,
                             &(tpk_mlp_desc){.name = "mlp",
                                             .hidden = 100,
                                             .act = TPK_ACT_GELU,
                                             .sequence_parallel = sp,
                                             .partial_output = p,
                                             .partial_dx = p}));
    return tpk_stream_init(ctx, &b->st, H, &(tpk_stream_desc){.sequence_parallel = b->sp});
}
static void blk_destroy(tpk_ctx *ctx, blk *b) {
    if (b->llama)
        tpk_rmsnorm_destroy(ctx, &b->rn1), tpk_rmsnorm_destroy(ctx, &b->rn2),
            tpk_gqa_attention_destroy(ctx, &b->gq), tpk_swiglu_mlp_destroy(ctx, &b->sw);
    else
        tpk_layernorm_destroy(ctx, &b->ln1), tpk_layernorm_destroy(ctx, &b->ln2),
            tpk_attention_destroy(ctx, &b->at), tpk_mlp_destroy(ctx, &b->mlp);
    tpk_stream_destroy(ctx, &b->st);
    free(b->y), free(b->dx), b->y = b->dx = NULL;
}
static tpk_status norm_fwd(tpk_ctx *ctx, blk *b, int i, tpk_tensor x, tpk_tensor *y) {
    if (b->llama) return tpk_rmsnorm_forward(ctx, i ? &b->rn2 : &b->rn1, x, y);
    return tpk_layernorm_forward(ctx, i ? &b->ln2 : &b->ln1, x, y);
}
static tpk_status norm_bwd(tpk_ctx *ctx, blk *b, int i, tpk_tensor dy, tpk_tensor *dx) {
    if (b->llama) return tpk_rmsnorm_backward(ctx, i ? &b->rn2 : &b->rn1, dy, dx);
    return tpk_layernorm_backward(ctx, i ? &b->ln2 : &b->ln1, dy, dx);
}
static tpk_status norm_bwd_add(tpk_ctx *ctx, blk *b, int i, tpk_tensor dy, tpk_tensor acc) {
    if (b->llama) return tpk_rmsnorm_backward_add(ctx, i ? &b->rn2 : &b->rn1, dy, acc);
    return tpk_layernorm_backward_add(ctx, i ? &b->ln2 : &b->ln1, dy, acc);
}
static tpk_status attn_fwd(tpk_ctx *ctx, blk *b, tpk_tensor x, tpk_tensor *y) {
    return b->llama ? tpk_gqa_attention_forward(ctx, &b->gq, x, B, S, y)
                    : tpk_attention_forward(ctx, &b->at, x, B, S, y);
}
static tpk_status attn_bwd(tpk_ctx *ctx, blk *b, tpk_tensor dy, tpk_tensor *dx) {
    return b->llama ? tpk_gqa_attention_backward(ctx, &b->gq, dy, dx)
                    : tpk_attention_backward(ctx, &b->at, dy, dx);
}
static tpk_status mlp_fwd(tpk_ctx *ctx, blk *b, tpk_tensor x, tpk_tensor *y) {
    return b->llama ? tpk_swiglu_mlp_forward(ctx, &b->sw, x, y)
                    : tpk_mlp_forward(ctx, &b->mlp, x, y);
}
static tpk_status mlp_bwd(tpk_ctx *ctx, blk *b, tpk_tensor dy, tpk_tensor *dx) {
    return b->llama ? tpk_swiglu_mlp_backward(ctx, &b->sw, dy, dx)
                    : tpk_mlp_backward(ctx, &b->mlp, dy, dx);
}

/* y = x + attn(n1(x)) + mlp(n2(x)); x in the stream's layout. Ordinary: each branch reduced by
 * its own row linear, summed here. Partial: the branches summed while partial, one reduction. */
static tpk_status blk_forward(tpk_ctx *ctx, blk *b, tpk_tensor x, tpk_tensor *y) {
    tpk_tensor xr = x, h1, h2, a, m;
    if (b->partial) TPK_TRY(tpk_stream_gather_forward(ctx, &b->st, x, &xr)); /* SP: all-gather */
    TPK_TRY(norm_fwd(ctx, b, 0, xr, &h1));
    TPK_TRY(attn_fwd(ctx, b, h1, &a));
    TPK_TRY(norm_fwd(ctx, b, 1, xr, &h2));
    TPK_TRY(mlp_fwd(ctx, b, h2, &m));
    if (b->partial) { /* a + m, still partial; one all-reduce (SP: reduce-scatter), + x */
        TPK_TRY(tpk_op_axpby(ctx, a.data, 1.0f, m.data, 1.0f, TPK_F32, (size_t)tpk_numel(&a)));
        return tpk_stream_reduce_forward(ctx, &b->st, a, &x, y);
    }
    size_t n = (size_t)tpk_numel(&x);
    b->y = (float *)malloc(sizeof(float) * (n + 1));
    for (size_t i = 0; i < n; i++)
        b->y[i] =
            ((const float *)x.data)[i] + ((const float *)a.data)[i] + ((const float *)m.data)[i];
    *y = x, y->data = b->y;
    return TPK_OK;
}
/* dx = dy + n1'(attn'(dy)) + n2'(mlp'(dy)). Partial: dy all-gathered (SP), both branches' dx
 * partial, both norms' backward on them (the second added onto the first), one all-reduce (SP:
 * reduce-scatter) with the skip path's dy added. */
static tpk_status blk_backward(tpk_ctx *ctx, blk *b, tpk_tensor dy, tpk_tensor *dx) {
    tpk_tensor dr = dy, da, dm, dn;
    if (b->partial) {
        TPK_TRY(tpk_stream_reduce_backward(ctx, &b->st, dy, &dr)); /* SP: all-gather */
        TPK_TRY(attn_bwd(ctx, b, dr, &da));                        /* P */
        TPK_TRY(norm_bwd(ctx, b, 0, da, &dn));                     /* P */
        TPK_TRY(mlp_bwd(ctx, b, dr, &dm));                         /* P */
        TPK_TRY(norm_bwd_add(ctx, b, 1, dm, dn));                  /* dn += n2'(dm) */
        return tpk_stream_gather_backward(ctx, &b->st, dn, &dy, dx);
    }
    size_t n = (size_t)tpk_numel(&dy);
    b->dx = (float *)malloc(sizeof(float) * (n + 1));
    memcpy(b->dx, dy.data, sizeof(float) * n);
    tpk_tensor acc = dy;
    acc.data = b->dx;
    TPK_TRY(attn_bwd(ctx, b, dy, &da));
    TPK_TRY(norm_bwd_add(ctx, b, 0, da, acc));
    TPK_TRY(mlp_bwd(ctx, b, dy, &dm));
    TPK_TRY(norm_bwd_add(ctx, b, 1, dm, acc));
    *dx = acc;
    return TPK_OK;
}

static int run_block(tpk_ctx *ctx, blk *b, const float *X, const float *DY, result *o) {
    int f0 = test__fails_case;
    memset(o, 0, sizeof *o);
    CHECK_OK(ctx, blk_init(ctx, b));
    if (test__fails_case > f0) return 1;
    test_set_weights(ctx, 9, 0.3f);
    tpk_layout sl = b->sp ? TPK_S(0) : TPK_R;
    tpk_tensor x = local_of(ctx, X, T, H, sl), dy = local_of(ctx, DY, T, H, sl), y, dx;
    memset(&y, 0, sizeof y), memset(&dx, 0, sizeof dx);
    o->y = (float *)malloc(sizeof(float) * T * H), o->dx = (float *)malloc(sizeof(float) * T * H);
    tpk_comm_stats_reset(&ctx->tp);
    CHECK_OK(ctx, blk_forward(ctx, b, x, &y));
    o->fwd = ctx->tp.stats;
    if (test__fails_case == f0) {
        CHECK(same_layout(y.layout, sl), "y: layout %s, expected %s", lstr(y.layout), lstr(sl));
        global_of(ctx, y, o->y);
        tpk_comm_stats_reset(&ctx->tp);
        CHECK_OK(ctx, blk_backward(ctx, b, dy, &dx));
        o->bwd = ctx->tp.stats;
    }
    if (test__fails_case == f0) {
        CHECK(same_layout(dx.layout, sl), "dx: layout %s, expected %s", lstr(dx.layout), lstr(sl));
        global_of(ctx, dx, o->dx);
        CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx)); /* once per step, not counted */
        o->n = test_gather_grads(ctx, o->grad, 16);
    }
    blk_destroy(ctx, b);
    free(x.data), free(dy.data);
    return test__fails_case > f0;
}

static void test_block(bool llama, bool sp, bool weighted) {
    static const double w[4][4] = {{2}, {3, 1}, {3, 1, 2}, {1, 2, 3, 4}};
    float X[T * H], DY[T * H];
    test_randn(X, T * H, 31, 1.0f), test_randn(DY, T * H, 32, 1.0f);
    tpk_ctx_desc d = {.world = &world, .tp = np, .seed = 5, .tp_weights = weighted ? w[np - 1] : 0};
    tpk_ctx c[3];
    blk b[3];
    result r[3];
    memset(b, 0, sizeof b), memset(r, 0, sizeof r);
    int failed = 0;
    for (int k = 0; k < 3; k++) { /* partial, ordinary on the same mesh, ordinary unsharded */
        tpk_ctx_desc u = {.seed = 5};
        CHECK_OK(&c[k], tpk_ctx_init(&c[k], k < 2 ? &d : &u));
        b[k].llama = llama, b[k].partial = k == 0, b[k].sp = sp && k < 2;
        failed |= run_block(&c[k], &b[k], X, DY, &r[k]);
    }
    if (!failed) {
        compare(&c[0], &r[0], &r[1], H, H, 1e-5);
        compare(&c[0], &r[0], &r[2], H, H, 1e-5);
        uint64_t TH = (uint64_t)T * H;
        /* partial: one all-reduce each way (SP: one all-gather, one reduce-scatter) */
        counts one = {sp, !sp, sp};
        check_counts(&r[0].fwd, one, "partial block forward");
        check_counts(&r[0].bwd, one, "partial block backward");
        for (int dir = 0; dir < 2; dir++) {
            const tpk_comm_stats *s = dir ? &r[0].bwd : &r[0].fwd;
            CHECK(s->elems[TPK_COLL_ALLREDUCE] == (sp ? 0 : TH) &&
                      s->elems[TPK_COLL_ALLGATHER] == (sp ? TH : 0) &&
                      s->elems[TPK_COLL_REDUCE_SCATTER] == (sp ? TH : 0),
                  "%s: %llu elements all-reduced, %llu all-gathered, %llu reduce-scattered; "
                  "expected T H = %llu",
                  dir ? "backward" : "forward", (unsigned long long)s->elems[TPK_COLL_ALLREDUCE],
                  (unsigned long long)s->elems[TPK_COLL_ALLGATHER],
                  (unsigned long long)s->elems[TPK_COLL_REDUCE_SCATTER], (unsigned long long)TH);
        }
        /* the ordinary block: two (SP: the column linears gather their input, the row linears dy;
         * the grouped-query attention gathers once for its three projections) */
        counts two_f = {sp ? 2u : 0u, sp ? 0u : 2u, sp ? 2u : 0u};
        counts two_b = {sp ? 4u : 0u, sp ? 0u : 2u, sp ? 2u : 0u};
        check_counts(&r[1].fwd, two_f, "ordinary block forward");
        check_counts(&r[1].bwd, two_b, "ordinary block backward");
    }
    for (int k = 0; k < 3; k++) result_free(&r[k]), tpk_ctx_destroy(&c[k]);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void test_bad_input(void) {
    tpk_ctx c;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5}));
    float X[T * H];
    test_randn(X, T * H, 41, 1.0f);
    tpk_linear l;
    CHECK_FAILS(
        &c,
        tpk_col_linear_init(&c, &l, 8, 8, &(tpk_linear_desc){.name = "c", .partial_output = true}),
        TPK_ERR_ARG, "desc->partial_output");
    CHECK_FAILS(
        &c, tpk_row_linear_init(&c, &l, 8, 8, &(tpk_linear_desc){.name = "r", .partial_dx = true}),
        TPK_ERR_ARG, "desc->partial_dx");
    tpk_layernorm ln;
    tpk_rmsnorm rn;
    CHECK_FAILS(
        &c,
        tpk_layernorm_init(&c, &ln, H,
                           &(tpk_layernorm_desc){.sequence_parallel = true, .partial_dy = true}),
        TPK_ERR_ARG, "desc->partial_dy");
    CHECK_FAILS(&c,
                tpk_rmsnorm_init(
                    &c, &rn, H, &(tpk_rmsnorm_desc){.sequence_parallel = true, .partial_dy = true}),
                TPK_ERR_ARG, "desc->partial_dy");
    tpk_tensor xR = local_of(&c, X, T, H, TPK_R), xP = local_of(&c, X, T, H, TPK_P), y, d;
    /* a P tensor where R is expected */
    tpk_mlp m;
    CHECK_OK(&c, tpk_mlp_init(&c, &m, H, &(tpk_mlp_desc){.name = "m", .partial_output = true}));
    CHECK_FAILS(&c, tpk_mlp_forward(&c, &m, xP, &y), TPK_ERR_LAYOUT, "x: expected layout R");
    CHECK_OK(&c, tpk_mlp_forward(&c, &m, xR, &y));
    CHECK(same_layout(y.layout, TPK_P), "the MLP's output: %s, expected P", lstr(y.layout));
    CHECK_FAILS(&c, tpk_mlp_backward(&c, &m, xP, &d), TPK_ERR_LAYOUT, "dy: expected layout R");
    CHECK_OK(&c, tpk_layernorm_init(&c, &ln, H, &(tpk_layernorm_desc){.name = "ln"}));
    CHECK_FAILS(&c, tpk_layernorm_forward(&c, &ln, y, &d), TPK_ERR_LAYOUT,
                "x: expected layout R"); /* the MLP's P output */
    CHECK_OK(&c, tpk_layernorm_forward(&c, &ln, xR, &d));
    CHECK_FAILS(&c, tpk_layernorm_backward(&c, &ln, xP, &d), TPK_ERR_LAYOUT,
                "dy: expected layout R");
    /* and R where P is expected: a partial norm's dy */
    CHECK_OK(&c,
             tpk_rmsnorm_init(&c, &rn, H, &(tpk_rmsnorm_desc){.name = "rn", .partial_dy = true}));
    CHECK_OK(&c, tpk_rmsnorm_forward(&c, &rn, xR, &d));
    CHECK_FAILS(&c, tpk_rmsnorm_backward(&c, &rn, xR, &d), TPK_ERR_LAYOUT, "dy: expected layout P");
    CHECK_FAILS(&c, tpk_rmsnorm_backward_add(&c, &rn, xP, xR), TPK_ERR_LAYOUT,
                "acc: expected layout P");
    /* the stream */
    tpk_stream st;
    CHECK_FAILS(&c, tpk_stream_init(&c, &st, 0, NULL), TPK_ERR_SHAPE, "H: expected >= 1");
    CHECK_OK(&c, tpk_stream_init(&c, &st, H, NULL));
    CHECK_FAILS(&c, tpk_stream_gather_backward(&c, &st, xP, NULL, &d), TPK_ERR_ARG,
                "backward before forward");
    CHECK_FAILS(&c, tpk_stream_reduce_backward(&c, &st, xR, &d), TPK_ERR_ARG,
                "backward before forward");
    CHECK_FAILS(&c, tpk_stream_gather_forward(&c, &st, xP, &d), TPK_ERR_LAYOUT,
                "x: expected layout R");
    CHECK_FAILS(&c, tpk_stream_reduce_forward(&c, &st, xR, NULL, &d), TPK_ERR_LAYOUT,
                "p: expected layout P");
    CHECK_FAILS(&c, tpk_stream_reduce_forward(&c, &st, xP, &xP, &d), TPK_ERR_LAYOUT,
                "skip: expected layout R");
    CHECK_OK(&c, tpk_stream_gather_forward(&c, &st, xR, &d));
    CHECK(d.data == xR.data, "without SP the gather forward is x itself");
    CHECK_FAILS(&c, tpk_stream_gather_backward(&c, &st, xR, NULL, &d), TPK_ERR_LAYOUT,
                "dp: expected layout P");
    CHECK_OK(&c, tpk_stream_reduce_forward(&c, &st, xP, &xR, &d));
    CHECK_FAILS(&c, tpk_stream_reduce_backward(&c, &st, xP, &d), TPK_ERR_LAYOUT,
                "dy: expected layout R");
    CHECK_FAILS(&c, tpk_stream_reduce_forward(&c, &st, xP, NULL, NULL), TPK_ERR_ARG, "y: NULL");
    tpk_stream_destroy(&c, &st);
    tpk_mlp_destroy(&c, &m), tpk_layernorm_destroy(&c, &ln), tpk_rmsnorm_destroy(&c, &rn);
    free(xR.data), free(xP.data);
    tpk_ctx_destroy(&c);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    (void)me;

    for (int sp = 0; sp < 2; sp++)
        for (int xR = 0; xR < 2; xR++)
            TEST_CASE("row linear 10->7 +bias, partial_output%s%s: the sum over ranks is the "
                      "unsharded output, dy R, no collective of its own",
                      sp ? " SP" : "", xR ? " R-input" : "") {
                lay L;
                memset(&L, 0, sizeof L);
                L.kind = ROWL, L.po = true, L.sp = sp, L.xR = xR;
                test_layer_option(L);
            }
    for (int sp = 0; sp < 2; sp++)
        TEST_CASE("column linear 7->10 +bias, partial_dx%s: dx P sums to the unsharded dx, no "
                  "all-reduce%s",
                  sp ? " SP" : "", sp ? " nor reduce-scatter" : "") {
            lay L;
            memset(&L, 0, sizeof L);
            L.kind = COLL, L.pdx = true, L.sp = sp;
            test_layer_option(L);
        }
    for (int k = ATTN; k <= SWIGLU; k++)
        for (int sp = 0; sp < 2; sp++)
            for (int opt = 1; opt < 4; opt++)
                TEST_CASE("%s%s%s%s: against the unsharded layer, the layouts, the collectives",
                          kind_name[k], opt & 1 ? " partial_output" : "",
                          opt & 2 ? " partial_dx" : "", sp ? " SP" : "") {
                    lay L;
                    memset(&L, 0, sizeof L);
                    L.kind = k, L.po = opt & 1, L.pdx = (opt & 2) != 0, L.sp = sp;
                    test_layer_option(L);
                }
    for (int k = LN; k <= RMS; k++) {
        TEST_CASE("%s partial_dy: dy P -> dx P summing to the unsharded dx, the weight gradients "
                  "partial and summed once",
                  kind_name[k]) {
            lay L;
            memset(&L, 0, sizeof L);
            L.kind = k, L.pdx = true;
            test_layer_option(L);
        }
        TEST_CASE("%s partial_dy backward_add: onto a partial accumulator", kind_name[k]) {
            test_norm_add(k);
        }
    }
    for (int llama = 0; llama < 2; llama++)
        for (int sp = 0; sp < 2; sp++)
            for (int weighted = 0; weighted < 2; weighted++)
                TEST_CASE("parallel residual block (%s)%s%s: branches reduced once = the ordinary "
                          "block = unsharded; 1 %s each way",
                          llama ? "Llama layers" : "GPT-NeoX layers", sp ? " SP" : "",
                          weighted ? " weighted TP" : "",
                          sp ? "all-gather + 1 reduce-scatter" : "all-reduce") {
                    test_block(llama, sp, weighted);
                }
    TEST_CASE("bad input: P where R is expected and R where P is, options on the wrong layer, "
              "the stream's order") {
        test_bad_input();
    }
    return test_finish();
}
