/* tests/test_linear.c — column and row parallel linears, alone and as column -> GELU -> row,
 * with and without sequence parallelism, against the unsharded layer run on every rank
 * (self communicator, t = 1) with the same weights and inputs: outputs, input gradients and
 * every gathered weight gradient to relative 1e-5. Also: finite differences, collective
 * counts, the order of the column backward (dx all-reduce started before the weight-gradient
 * GEMM and waited after it), uneven splits (10 over 3, 7 over 4, 1 over 4), the same over
 * weighted TP splits (tpk_ctx_desc.tp_weights 3:1, 3:1:2, 1:2:3:4), a padded vocabulary table in
 * weighted 64-row units, initialisation that does not depend on t, and bad input. Run at 1..4
 * ranks. */
#include "test.h"

static int me, np;
static tpk_comm world;

enum { COL, ROW, PAIR };
typedef struct net {
    int kind;
    bool sp, bias, gather, row_in_R, fp8;
    int64_t T, in, hid, out; /* COL/ROW: in -> out; PAIR: in -> hid -> out (= in) */
    tpk_linear a, b;
    tpk_gelu g;
    tpk_tensor h1, h2; /* intermediates kept for backward */
} net;

static const char *net_name(const net *n) {
    static char buf[160];
    snprintf(buf, sizeof buf, "%s %lldx%lld%s%s%s%s T=%lld",
             n->kind == COL   ? "column"
             : n->kind == ROW ? "row"
                              : "column-gelu-row",
             (long long)n->in, (long long)(n->kind == PAIR ? n->hid : n->out),
             n->bias ? " +bias" : "", n->sp ? " SP" : "", n->gather ? " gather" : "",
             n->row_in_R ? " R-input" : "", (long long)n->T);
    return buf;
}

static tpk_status net_init(tpk_ctx *ctx, net *n) {
    tpk_linear_desc da = {.name = "a",
                          .bias = n->bias,
                          .gather_output = n->gather,
                          .sequence_parallel = n->sp,
                          .fp8 = n->fp8};
    tpk_linear_desc db = {.name = "b", .bias = n->bias, .sequence_parallel = n->sp, .fp8 = n->fp8};
    if (n->kind == COL) return tpk_col_linear_init(ctx, &n->a, n->in, n->out, &da);
    if (n->kind == ROW) return tpk_row_linear_init(ctx, &n->a, n->in, n->out, &db);
    TPK_TRY(tpk_col_linear_init(ctx, &n->a, n->in, n->hid, &da));
    return tpk_row_linear_init(ctx, &n->b, n->hid, n->out, &db);
}
static void net_destroy(tpk_ctx *ctx, net *n) {
    tpk_linear_destroy(ctx, &n->a), tpk_linear_destroy(ctx, &n->b), tpk_gelu_destroy(ctx, &n->g);
}
/* the layer's input layout, from the global X [T, in] */
static tpk_layout in_layout(const net *n) {
    if (n->sp && n->kind != ROW) return TPK_S(0);
    if (n->kind == ROW) return n->row_in_R ? TPK_R : TPK_S(-1);
    return TPK_R;
}
/* this rank's part of a global 2-D tensor in layout l; data in a new buffer */
static tpk_tensor local_of(tpk_ctx *ctx, const float *g, int64_t rows, int64_t cols, tpk_layout l) {
    tpk_tensor R = tpk_tensor_2d((void *)g, TPK_F32, rows, cols, TPK_R), out = {0};
    out.data = malloc((size_t)(rows * cols + 1) * 4);
    if (l.kind == TPK_LAYOUT_R)
        memcpy(out.data, g, (size_t)(rows * cols) * 4),
            out = tpk_tensor_2d(out.data, TPK_F32, rows, cols, TPK_R);
    else tpk_convert(ctx, &R, l, &out);
    return out;
}
/* the global value of a local tensor (R, S or P) into g */
static tpk_status global_of(tpk_ctx *ctx, tpk_tensor t, float *g) {
    tpk_tensor o = {0};
    o.data = g;
    return tpk_convert(ctx, &t, TPK_R, &o);
}

static tpk_status net_forward(tpk_ctx *ctx, net *n, tpk_tensor x, tpk_tensor *y) {
    if (n->kind == COL) return tpk_col_linear_forward(ctx, &n->a, x, y);
    if (n->kind == ROW) return tpk_row_linear_forward(ctx, &n->a, x, y);
    TPK_TRY(tpk_col_linear_forward(ctx, &n->a, x, &n->h1));
    TPK_TRY(tpk_gelu_forward(ctx, &n->g, n->h1, &n->h2));
    return tpk_row_linear_forward(ctx, &n->b, n->h2, y);
}
static tpk_status net_backward(tpk_ctx *ctx, net *n, tpk_tensor dy, tpk_tensor *dx) {
    if (n->kind == COL) return tpk_col_linear_backward(ctx, &n->a, dy, dx);
    if (n->kind == ROW) return tpk_row_linear_backward(ctx, &n->a, dy, dx);
    tpk_tensor d2, d1;
    TPK_TRY(tpk_row_linear_backward(ctx, &n->b, dy, &d2));
    TPK_TRY(tpk_gelu_backward(ctx, &n->g, d2, &d1));
    return tpk_col_linear_backward(ctx, &n->a, d1, dx);
}

/* Run net on ctx: forward X, backward dY; global y, dx and gradients (params in order) out. */
typedef struct result { float *y, *dx, *grad[4]; int nparams; tpk_comm_stats fwd, bwd; } result;
static int run_net(tpk_ctx *ctx, net *n, const float *X, const float *dY, result *r) {
    int fails = 0;
#define RUN_OK(call)                                                                               \
    do {                                                                                           \
        tpk_status s_ = (call);                                                                    \
        if (s_ != TPK_OK) {                                                                        \
            CHECK(s_ == TPK_OK, "%s: %s", #call, tpk_last_error(ctx));                             \
            return ++fails;                                                                        \
        }                                                                                          \
    } while (0)
    RUN_OK(net_init(ctx, n));
    test_set_weights(ctx, 1234, 0.3f);
    tpk_tensor x = local_of(ctx, X, n->T, n->in, in_layout(n)), y, dx;
    tpk_comm_stats_reset(&ctx->tp);
    RUN_OK(net_forward(ctx, n, x, &y));
    r->fwd = ctx->tp.stats;
    r->y = malloc((size_t)(n->T * n->out) * 4);
    test_poison(r->y, (size_t)(n->T * n->out));
    RUN_OK(global_of(ctx, y, r->y));
    tpk_tensor dy = local_of(ctx, dY, n->T, n->out, y.layout);
    dy = tpk_tp_tensor_2d(ctx, dy.data, TPK_F32, y.gshape[0], y.gshape[1], y.layout);
    tpk_comm_stats_reset(&ctx->tp);
    RUN_OK(net_backward(ctx, n, dy, &dx));
    r->bwd = ctx->tp.stats;
    r->dx = malloc((size_t)(n->T * n->in) * 4);
    test_poison(r->dx, (size_t)(n->T * n->in));
    RUN_OK(global_of(ctx, dx, r->dx));
    r->nparams = ctx->params.n;
    for (int i = 0; i < ctx->params.n; i++) {
        r->grad[i] = malloc(tpk_param_global_numel(ctx, i) * 4);
        test_poison(r->grad[i], tpk_param_global_numel(ctx, i));
        RUN_OK(tpk_param_get_global(ctx, i, true, r->grad[i]));
    }
    free(x.data), free(dy.data);
    return fails;
}
static void free_result(result *r) {
    free(r->y), free(r->dx);
    for (int i = 0; i < r->nparams; i++) free(r->grad[i]);
}

/* The sharded net (its TP split weighted by w; NULL: even) against the unsharded one. */
static void compare_w(net proto, const double *w) {
    tpk_ctx sh, ref;
    tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5, .tp_weights = w});
    tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 5});
    net a = proto, b = proto;
    float *X = malloc((size_t)(proto.T * proto.in) * 4),
          *dY = malloc((size_t)(proto.T * proto.out) * 4);
    test_randn(X, (size_t)(proto.T * proto.in), 11, 1.f);
    test_randn(dY, (size_t)(proto.T * proto.out), 12, 1.f);
    result rs = {0}, rr = {0};
    if (run_net(&sh, &a, X, dY, &rs) == 0 && run_net(&ref, &b, X, dY, &rr) == 0) {
        if (w) { /* the shard's features: [floor(n W_r / W), floor(n W_{r+1} / W)) of the split
                    features */
            double W = 0, Wr = 0;
            for (int q = 0; q < np; q++) Wr += q < me ? w[q] : 0, W += w[q];
            int64_t n = proto.kind == ROW ? proto.in : proto.kind == COL ? proto.out : proto.hid;
            int64_t lo = (int64_t)floor((double)n * Wr / W),
                    hi = me == np - 1 ? n : (int64_t)floor((double)n * (Wr + w[me]) / W);
            CHECK(a.a.n_local == hi - lo && a.a.in_off == (proto.kind == ROW ? lo : 0),
                  "rank %d holds %lld features at %lld, expected [%lld, %lld)", me,
                  (long long)a.a.n_local, (long long)a.a.in_off, (long long)lo, (long long)hi);
        }
        CHECK_CLOSE(rs.y, rr.y, (size_t)(proto.T * proto.out), 1e-5, "output");
        CHECK_CLOSE(rs.dx, rr.dx, (size_t)(proto.T * proto.in), 1e-5, "input gradient");
        CHECK(rs.nparams == rr.nparams, "parameter count %d vs %d", rs.nparams, rr.nparams);
        for (int i = 0; i < rs.nparams && i < rr.nparams; i++) {
            char what[128];
            snprintf(what, sizeof what, "gradient of %s", sh.params.list[i].name);
            CHECK_CLOSE(rs.grad[i], rr.grad[i], tpk_param_global_numel(&sh, i), 1e-5, what);
        }
        /* collectives: a column -> row pair does one all-reduce of T*H each way (under SP one
         * all-gather and one reduce-scatter of T*H each way, and in the backward a second
         * all-gather: the column linear's input again, which it does not keep gathered); nothing
         * else */
        if (proto.kind == PAIR) {
            uint64_t TH = (uint64_t)(proto.T * proto.in);
            const tpk_comm_stats *st[2] = {&rs.fwd, &rs.bwd};
            for (int k = 0; k < 2; k++) {
                const char *way = k ? "backward" : "forward";
                const tpk_comm_stats *s = st[k];
                if (!proto.sp) {
                    CHECK(s->calls[TPK_COLL_ALLREDUCE] == 1 && s->elems[TPK_COLL_ALLREDUCE] == TH,
                          "%s: %llu all-reduces of %llu elements, expected 1 of %llu", way,
                          (unsigned long long)s->calls[TPK_COLL_ALLREDUCE],
                          (unsigned long long)s->elems[TPK_COLL_ALLREDUCE], (unsigned long long)TH);
                    CHECK(s->calls[TPK_COLL_ALLGATHER] + s->calls[TPK_COLL_REDUCE_SCATTER] +
                                  s->calls[TPK_COLL_BROADCAST] ==
                              0,
                          "%s: other collectives", way);
                } else {
                    uint64_t ag = k ? 2 : 1;
                    CHECK(s->calls[TPK_COLL_ALLGATHER] == ag &&
                              s->elems[TPK_COLL_ALLGATHER] == ag * TH,
                          "%s: %llu all-gathers of %llu, expected %llu of %llu", way,
                          (unsigned long long)s->calls[TPK_COLL_ALLGATHER],
                          (unsigned long long)s->elems[TPK_COLL_ALLGATHER], (unsigned long long)ag,
                          (unsigned long long)(ag * TH));
                    CHECK(s->calls[TPK_COLL_REDUCE_SCATTER] == 1 &&
                              s->elems[TPK_COLL_REDUCE_SCATTER] == TH,
                          "%s: %llu reduce-scatters, expected 1", way,
                          (unsigned long long)s->calls[TPK_COLL_REDUCE_SCATTER]);
                    CHECK(s->calls[TPK_COLL_ALLREDUCE] + s->calls[TPK_COLL_BROADCAST] == 0,
                          "%s: other collectives", way);
                }
            }
        }
    }
    free_result(&rs), free_result(&rr);
    net_destroy(&sh, &a), net_destroy(&ref, &b);
    tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
    free(X), free(dY);
}
static void compare(net proto) { compare_w(proto, NULL); }

/* Finite differences on the sharded net: L = sum(y * dY), dL/dtheta by central differences of
 * global parameter entries (set on every rank) and of input entries, in double. */
static double net_loss(tpk_ctx *ctx, net *n, const float *X, const float *dY) {
    tpk_tensor x = local_of(ctx, X, n->T, n->in, in_layout(n)), y;
    float *yg = malloc((size_t)(n->T * n->out) * 4);
    double L = NAN;
    if (net_forward(ctx, n, x, &y) == TPK_OK && global_of(ctx, y, yg) == TPK_OK) {
        L = 0;
        for (int64_t i = 0; i < n->T * n->out; i++) L += (double)yg[i] * dY[i];
    }
    free(x.data), free(yg);
    return L;
}
static void finite_differences(net proto) {
    tpk_ctx sh;
    tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np});
    net a = proto;
    float *X = malloc((size_t)(proto.T * proto.in) * 4),
          *dY = malloc((size_t)(proto.T * proto.out) * 4);
    test_randn(X, (size_t)(proto.T * proto.in), 21, 1.f);
    test_randn(dY, (size_t)(proto.T * proto.out), 22, 1.f);
    result r = {0};
    if (run_net(&sh, &a, X, dY, &r) == 0) {
        const float eps = 1e-2f;
        double worst = 0;
        for (int p = 0; p < sh.params.n; p++) {
            size_t gn = tpk_param_global_numel(&sh, p);
            float *w = malloc(gn * 4);
            tpk_param_get_global(&sh, p, false, w);
            for (int k = 0; k < 6; k++) {
                size_t i = (size_t)(tpk_rng_uniform(3, (uint64_t)p, (uint64_t)k) * (float)gn) % gn;
                float keep = w[i];
                w[i] = keep + eps, tpk_param_set_global(&sh, p, w);
                double lp = net_loss(&sh, &a, X, dY);
                w[i] = keep - eps, tpk_param_set_global(&sh, p, w);
                double lm = net_loss(&sh, &a, X, dY);
                w[i] = keep, tpk_param_set_global(&sh, p, w);
                double fd = (lp - lm) / (2 * eps), an = r.grad[p][i],
                       e = fabs(fd - an) / fmax(1.0, fabs(an));
                if (e > worst) worst = e;
                CHECK(e < 1e-2, "%s[%zu]: finite difference %.6g, backward %.6g",
                      sh.params.list[p].name, i, fd, an);
            }
            free(w);
        }
        float *Xp = malloc((size_t)(proto.T * proto.in) * 4);
        for (int k = 0; k < 6; k++) {
            size_t i = (size_t)(tpk_rng_uniform(4, 0, (uint64_t)k) * (float)(proto.T * proto.in)) %
                       (size_t)(proto.T * proto.in);
            memcpy(Xp, X, (size_t)(proto.T * proto.in) * 4);
            Xp[i] = X[i] + eps;
            double lp = net_loss(&sh, &a, Xp, dY);
            Xp[i] = X[i] - eps;
            double lm = net_loss(&sh, &a, Xp, dY);
            double fd = (lp - lm) / (2 * eps), an = r.dx[i];
            CHECK(fabs(fd - an) / fmax(1.0, fabs(an)) < 1e-2,
                  "x[%zu]: finite difference %.6g, backward %.6g", i, fd, an);
        }
        free(Xp);
    }
    free_result(&r);
    net_destroy(&sh, &a);
    tpk_ctx_destroy(&sh);
    free(X), free(dY);
}

/* ---- tracing wrappers: the order of GEMMs and collectives in the column backward ---------- */
static char trace[64][24];
static int ntrace;
static const tpk_comm_vtable *real_vt;
static const tpk_ops *real_ops;
static void note(const char *s) {
    if (ntrace < 64) snprintf(trace[ntrace++], sizeof trace[0], "%s", s);
}
static tpk_status tr_allreduce(tpk_ctx *c, tpk_comm *m, const void *s, void *r, size_t n,
                               tpk_dtype d, tpk_redop o, tpk_request *q) {
    note(q ? "allreduce-start" : "allreduce");
    return real_vt->allreduce(c, m, s, r, n, d, o, q);
}
static tpk_status tr_ag(tpk_ctx *c, tpk_comm *m, const void *s, void *r, const size_t *n,
                        tpk_dtype d, tpk_request *q) {
    note(q ? "allgather-start" : "allgather");
    return real_vt->allgatherv(c, m, s, r, n, d, q);
}
static tpk_status tr_rs(tpk_ctx *c, tpk_comm *m, const void *s, void *r, const size_t *n,
                        tpk_dtype d, tpk_redop o, tpk_request *q) {
    note(q ? "reduce-scatter-start" : "reduce-scatter");
    return real_vt->reduce_scatterv(c, m, s, r, n, d, o, q);
}
static tpk_status tr_wait(tpk_ctx *c, tpk_request *q) {
    note("wait");
    return real_vt->wait(c, q);
}
static tpk_status tr_gemm(tpk_ctx *c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float al,
                          const void *a, int64_t lda, const void *b, int64_t ldb, float be,
                          void *cc, int64_t ldc, tpk_dtype dt) {
    note(ta ? "gemm-wgrad" : "gemm");
    return real_ops->gemm(c, ta, tb, m, n, k, al, a, lda, b, ldb, be, cc, ldc, dt);
}

/* ---- FP8 ----------------------------------------------------------------------------------- */

/* v rounded to FP8 (mb mantissa bits, least normal exponent emin, max mx) the plain way: the
 * quantum of its binade, nearbyint (ties to even), saturation; NaN stays */
static double fp8_round(float v, int mb, int emin, double mx) {
    double a = fabs((double)v);
    if (isnan(v)) return v;
    if (a >= mx) return copysign(mx, v);
    if (a == 0) return copysign(0.0, v);
    int e = (int)floor(log2(a));
    if (e < emin) e = emin;
    double q = ldexp(nearbyint(ldexp(a, mb - e)), e - mb);
    return copysign(q, v);
}
static double q43(float v) { return fp8_round(v, 3, -6, 448); }
static double q52(float v) { return fp8_round(v, 2, -14, 57344); }
static float amax_of(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* The FP8 linear (column or row, SP or not, bias) under a recipe over 3 steps, on the sharded
 * context (TP np) and the unsharded one (TP 1): each step's y, dx and gradients against a
 * reference written here (X, W and dY quantized with the scales of a hand-run recipe, the GEMMs
 * in double on the codes, alpha = 1 / (s_a s_b), the bias and db from the unquantized values),
 * the recipe's state (histories, scales) against the hand-run one, and the two contexts equal
 * (the amax reduction over TP). Step k's input and output gradient are scaled by 4^k, so the
 * histories and scales move. */
static void fp8_steps(net proto, tpk_fp8_scaling mode, tpk_fp8_amax_algo algo) {
    enum { STEPS = 3, L = 2, MARGIN = 1 };
    tpk_ctx cs[2];
    tpk_fp8 fs[2];
    net nets[2] = {proto, proto};
    tpk_fp8_desc fd = {.scaling = mode, .history = L, .algo = algo, .margin = MARGIN};
    tpk_ctx_init(&cs[0], &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 5});
    tpk_ctx_init(&cs[1], &(tpk_ctx_desc){.seed = 5});
    int64_t T = proto.T, in = proto.in, out = proto.out;
    size_t nx = (size_t)(T * in), ny = (size_t)(T * out), nw = (size_t)(out * in);
    float *X = malloc(nx * 4), *dY = malloc(ny * 4), *W = malloc(nw * 4), *B = malloc(out * 4);
    float *ry = malloc(ny * 4), *rdx = malloc(nx * 4), *rdw = malloc(nw * 4),
          *rdb = malloc(out * 4);
    result res[2][STEPS];
    memset(res, 0, sizeof res);
    float hist[3][L] = {{0}}, scale[3] = {1, 1, 1}; /* the hand-run recipe (delayed) */
    int fails = 0;
    for (int c = 0; c < 2; c++) {
        CHECK_OK(&cs[c], tpk_fp8_init(&cs[c], &fs[c], &fd));
        CHECK(cs[c].fp8 == &fs[c], "ctx->fp8 not set");
    }
    for (int step = 0; step < STEPS && !fails; step++) {
        test_randn(X, nx, 31 + (uint64_t)step, ldexpf(1.0f, 2 * step));
        test_randn(dY, ny, 41 + (uint64_t)step, ldexpf(1.0f, -2 * step));
        for (int c = 0; c < 2 && !fails; c++) {
            tpk_ctx *ctx = &cs[c];
            if (step == 0) { /* run_net made the layer and set its weights: later steps reuse */
                fails += run_net(ctx, &nets[c], X, dY, &res[c][0]);
                CHECK(fs[c].n == 3, "%d tensors registered, expected 3", fs[c].n);
            } else {
                net *n = &nets[c];
                result *r = &res[c][step];
                tpk_tensor x = local_of(ctx, X, T, in, in_layout(n)), y, dx;
                CHECK_OK(ctx, tpk_params_zero_grad(ctx));
                CHECK_OK(ctx, net_forward(ctx, n, x, &y));
                r->y = malloc(ny * 4), r->dx = malloc(nx * 4);
                CHECK_OK(ctx, global_of(ctx, y, r->y));
                tpk_tensor dyl = local_of(ctx, dY, T, out, y.layout), dx_;
                tpk_tensor dy = tpk_tp_tensor_2d(ctx, dyl.data, TPK_F32, T, out, y.layout);
                CHECK_OK(ctx, net_backward(ctx, n, dy, &dx_));
                dx = dx_;
                CHECK_OK(ctx, global_of(ctx, dx, r->dx));
                r->nparams = ctx->params.n;
                for (int i = 0; i < ctx->params.n; i++) {
                    r->grad[i] = malloc(tpk_param_global_numel(ctx, i) * 4);
                    CHECK_OK(ctx, tpk_param_get_global(ctx, i, true, r->grad[i]));
                }
                free(x.data), free(dyl.data);
            }
        }
        if (fails) break;
        /* the reference: the weights as set, the scales of this step */
        CHECK_OK(&cs[1], tpk_param_get_global(&cs[1], 0, false, W));
        if (proto.bias) CHECK_OK(&cs[1], tpk_param_get_global(&cs[1], 1, false, B));
        float ax = amax_of(X, nx), aw = amax_of(W, nw), ady = amax_of(dY, ny);
        float s[3];
        if (mode == TPK_FP8_CURRENT)
            s[0] = 448.0f / ax / 2.0f, s[1] = 448.0f / aw / 2.0f, s[2] = 57344.0f / ady / 2.0f;
        else s[0] = scale[0], s[1] = scale[1], s[2] = scale[2];
        for (int i = 0; i < T; i++)
            for (int o = 0; o < out; o++) {
                double acc = 0;
                for (int k = 0; k < in; k++)
                    acc += q43(X[i * in + k] * s[0]) * q43(W[o * in + k] * s[1]);
                ry[i * out + o] =
                    (float)(acc * ((1.0f / s[0]) * (1.0f / s[1])) + (proto.bias ? B[o] : 0.0f));
            }
        for (int i = 0; i < T; i++)
            for (int k = 0; k < in; k++) {
                double acc = 0;
                for (int o = 0; o < out; o++)
                    acc += q52(dY[i * out + o] * s[2]) * q43(W[o * in + k] * s[1]);
                rdx[i * in + k] = (float)(acc * ((1.0f / s[2]) * (1.0f / s[1])));
            }
        for (int o = 0; o < out; o++) {
            double db = 0;
            for (int i = 0; i < T; i++) db += dY[i * out + o];
            rdb[o] = (float)db;
            for (int k = 0; k < in; k++) {
                double acc = 0;
                for (int i = 0; i < T; i++)
                    acc += q52(dY[i * out + o] * s[2]) * q43(X[i * in + k] * s[0]);
                rdw[o * in + k] = (float)(acc * ((1.0f / s[2]) * (1.0f / s[0])));
            }
        }
        for (int c = 0; c < 2; c++) {
            result *r = &res[c][step];
            char what[96];
            snprintf(what, sizeof what, "step %d %s: y", step, c ? "TP 1" : "TP np");
            CHECK_CLOSE(r->y, ry, ny, 1e-5, what);
            snprintf(what, sizeof what, "step %d %s: dx", step, c ? "TP 1" : "TP np");
            CHECK_CLOSE(r->dx, rdx, nx, 1e-5, what);
            snprintf(what, sizeof what, "step %d %s: dW", step, c ? "TP 1" : "TP np");
            CHECK_CLOSE(r->grad[0], rdw, nw, 1e-5, what);
            if (proto.bias) {
                snprintf(what, sizeof what, "step %d %s: db", step, c ? "TP 1" : "TP np");
                CHECK_CLOSE(r->grad[1], rdb, (size_t)out, 1e-5, what);
            }
            for (int k = 0; k < 3; k++)
                CHECK(cs[c].fp8 == &fs[c] && nets[c].a.f8_s[k] == s[k],
                      "step %d: tensor %d quantized with scale %g, expected %g", step, k,
                      (double)nets[c].a.f8_s[k], (double)s[k]);
            CHECK_OK(&cs[c], tpk_fp8_update(&cs[c], &fs[c]));
        }
        /* the sharded and unsharded runs equal: the same codes, sums in another order */
        CHECK_CLOSE(res[0][step].y, res[1][step].y, ny, 1e-6, "TP np vs TP 1: y");
        CHECK_CLOSE(res[0][step].dx, res[1][step].dx, nx, 1e-6, "TP np vs TP 1: dx");
        CHECK_CLOSE(res[0][step].grad[0], res[1][step].grad[0], nw, 1e-6, "TP np vs TP 1: dW");
        /* the hand-run recipe's update, and the library's state against it */
        float a[3] = {ax, aw, ady}, mx[3] = {448, 448, 57344};
        for (int k = 0; k < 3; k++) {
            hist[k][1] = hist[k][0], hist[k][0] = a[k];
            float m = algo == TPK_FP8_AMAX_MAX ? fmaxf(hist[k][0], hist[k][1]) : hist[k][0];
            if (m > 0) scale[k] = mx[k] / m / 2.0f;
            for (int c = 0; c < 2 && mode == TPK_FP8_DELAYED; c++) {
                CHECK(fs[c].hist[k * L] == hist[k][0] && fs[c].hist[k * L + 1] == hist[k][1],
                      "step %d tensor %d: history %g %g, expected %g %g", step, k,
                      (double)fs[c].hist[k * L], (double)fs[c].hist[k * L + 1], (double)hist[k][0],
                      (double)hist[k][1]);
                CHECK(fs[c].scale[k] == scale[k], "step %d tensor %d: scale %g, expected %g", step,
                      k, (double)fs[c].scale[k], (double)scale[k]);
            }
        }
    }
    for (int c = 0; c < 2; c++) {
        for (int st = 0; st < STEPS; st++) free_result(&res[c][st]);
        net_destroy(&cs[c], &nets[c]);
        tpk_fp8_destroy(&cs[c], &fs[c]);
        CHECK(cs[c].fp8 == NULL, "ctx->fp8 left set");
        tpk_ctx_destroy(&cs[c]);
    }
    free(X), free(dY), free(W), free(B), free(ry), free(rdx), free(rdw), free(rdb);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;

    /* FP8: column and row, with and without SP, current and delayed scaling (max and
     * most-recent), against the reference; TP np against TP 1 */
    for (int kind = 0; kind < 2; kind++)
        for (int sp = 0; sp < 2; sp++)
            for (int mode = 0; mode < 3; mode++) {
                net n = {.kind = kind ? ROW : COL,
                         .sp = sp,
                         .bias = true,
                         .fp8 = true,
                         .T = 6,
                         .in = kind ? 10 : 8,
                         .out = kind ? 8 : 10};
                tpk_fp8_scaling sc = mode ? TPK_FP8_DELAYED : TPK_FP8_CURRENT;
                tpk_fp8_amax_algo al = mode == 2 ? TPK_FP8_AMAX_MOST_RECENT : TPK_FP8_AMAX_MAX;
                TEST_CASE("%s FP8 %s%s over 3 steps: the reference, the recipe's state, TP 1",
                          net_name(&n), tpk_fp8_scaling_name(sc), mode == 2 ? " (most recent)" : "")
                fp8_steps(n, sc, al);
            }
    TEST_CASE("tpk_fp8_init refuses bad descs by name") {
        tpk_ctx c;
        tpk_fp8 f;
        tpk_ctx_init(&c, &(tpk_ctx_desc){.seed = 1});
        CHECK_FAILS(&c, tpk_fp8_init(&c, &f, &(tpk_fp8_desc){.scaling = TPK_FP8_NONE}), TPK_ERR_ARG,
                    "desc->scaling");
        CHECK_FAILS(
            &c, tpk_fp8_init(&c, &f, &(tpk_fp8_desc){.scaling = TPK_FP8_DELAYED, .history = -1}),
            TPK_ERR_ARG, "desc->history");
        CHECK_FAILS(&c,
                    tpk_fp8_init(&c, &f, &(tpk_fp8_desc){.scaling = TPK_FP8_DELAYED, .margin = 65}),
                    TPK_ERR_ARG, "desc->margin: expected 0..64");
        CHECK_FAILS(
            &c,
            tpk_fp8_init(&c, &f,
                         &(tpk_fp8_desc){.scaling = TPK_FP8_CURRENT, .algo = (tpk_fp8_amax_algo)7}),
            TPK_ERR_ARG, "desc->algo");
        CHECK(c.fp8 == NULL, "a refused recipe left on the context");
        tpk_ctx_destroy(&c);
    }

    /* uneven: 10 over 3, 7 over 4, 1 over 4 (ranks holding nothing); T = 5 tokens */
    const int64_t outs[] = {10, 7, 1};
    for (int k = 0; k < 3; k++)
        for (int sp = 0; sp < 2; sp++)
            for (int opt = 0; opt < 2; opt++) {
                net n = {.kind = COL,
                         .sp = sp,
                         .bias = true,
                         .gather = opt && !sp,
                         .T = 5,
                         .in = 6,
                         .out = outs[k]};
                if (sp && opt) n.bias = false;
                TEST_CASE("%s matches the unsharded layer", net_name(&n)) compare(n);
                net m = {.kind = ROW,
                         .sp = sp,
                         .bias = !opt,
                         .row_in_R = opt,
                         .T = 5,
                         .in = outs[k],
                         .out = 6};
                TEST_CASE("%s matches the unsharded layer", net_name(&m)) compare(m);
            }
    for (int sp = 0; sp < 2; sp++) {
        net p = {.kind = PAIR, .sp = sp, .bias = true, .T = 7, .in = 6, .hid = 10, .out = 6};
        TEST_CASE("%s matches the unsharded MLP; collective counts", net_name(&p)) compare(p);
        TEST_CASE("%s: finite differences", net_name(&p)) finite_differences(p);
    }
    /* weighted TP splits: 2 | 3:1 | 3:1:2 | 1:2:3:4 (features and, under SP, tokens by weight; 1
     * feature over 4: three ranks hold nothing) */
    static const double wts[4][4] = {{2}, {3, 1}, {3, 1, 2}, {1, 2, 3, 4}};
    const double *tw = wts[np - 1];
    for (int k = 0; k < 3; k++)
        for (int sp = 0; sp < 2; sp++) {
            net n = {.kind = COL,
                     .sp = sp,
                     .bias = true,
                     .gather = !sp,
                     .T = 5,
                     .in = 6,
                     .out = outs[k]};
            TEST_CASE("%s over TP weights 2 | 3:1 | 3:1:2 | 1:2:3:4 matches the unsharded layer",
                      net_name(&n))
            compare_w(n, tw);
            net m = {.kind = ROW,
                     .sp = sp,
                     .bias = true,
                     .row_in_R = !sp,
                     .T = 5,
                     .in = outs[k],
                     .out = 6};
            TEST_CASE("%s over TP weights 2 | 3:1 | 3:1:2 | 1:2:3:4 matches the unsharded layer",
                      net_name(&m))
            compare_w(m, tw);
        }
    for (int sp = 0; sp < 2; sp++) {
        net p = {.kind = PAIR, .sp = sp, .bias = true, .T = 7, .in = 6, .hid = 10, .out = 6};
        TEST_CASE(
            "%s over TP weights 2 | 3:1 | 3:1:2 | 1:2:3:4 matches the unsharded MLP; collective "
            "counts",
            net_name(&p))
        compare_w(p, tw);
    }
    {
        net c = {.kind = COL, .bias = true, .T = 4, .in = 5, .out = 7};
        TEST_CASE("%s: finite differences", net_name(&c)) finite_differences(c);
        net r = {.kind = ROW, .bias = true, .T = 4, .in = 7, .out = 5};
        TEST_CASE("%s: finite differences", net_name(&r)) finite_differences(r);
    }

    TEST_CASE(
        "column backward starts the dx all-reduce before the weight-gradient GEMM, waits after; "
        "under SP it first starts the input's "
        "all-gather again, runs the dx GEMM, then waits") {
        for (int sp = 0; sp < 2; sp++) {
            tpk_ctx ctx;
            tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np});
            static tpk_comm_vtable vt;
            static tpk_ops ops;
            real_vt = ctx.tp.vt, real_ops = ctx.ops;
            vt = *real_vt, vt.allreduce = tr_allreduce, vt.allgatherv = tr_ag,
            vt.reduce_scatterv = tr_rs, vt.wait = tr_wait;
            ops = *real_ops, ops.gemm = tr_gemm;
            ctx.tp.vt = &vt, ctx.ops = &ops;
            net n = {.kind = COL, .sp = sp, .bias = true, .T = 6, .in = 4, .out = 8};
            float X[24], dY[48];
            test_randn(X, 24, 1, 1), test_randn(dY, 48, 2, 1);
            CHECK_OK(&ctx, net_init(&ctx, &n));
            tpk_tensor x = local_of(&ctx, X, 6, 4, in_layout(&n)), y, dx;
            CHECK_OK(&ctx, net_forward(&ctx, &n, x, &y));
            tpk_tensor dy = tpk_tensor_shard_2d(NULL, TPK_F32, 6, 8, TPK_S(-1), np, me);
            tpk_tensor dyl = local_of(&ctx, dY, 6, 8, TPK_S(-1));
            dy.data = dyl.data;
            ntrace = 0;
            CHECK_OK(&ctx, net_backward(&ctx, &n, dy, &dx));
            const char *want_sp[] = {"allgather-start",      "gemm",       "wait",
                                     "reduce-scatter-start", "gemm-wgrad", "wait"};
            const char *want_r[] = {"gemm", "allreduce-start", "gemm-wgrad", "wait"},
                       **want = sp ? want_sp : want_r;
            int nwant = sp ? 6 : 4;
            CHECK(ntrace == nwant, "%d events, expected %d", ntrace, nwant);
            for (int i = 0; i < nwant && i < ntrace; i++)
                CHECK(!strcmp(trace[i], want[i]), "event %d: %s, expected %s", i, trace[i],
                      want[i]);
            ctx.tp.vt = real_vt, ctx.ops = real_ops;
            free(x.data), free(dyl.data);
            net_destroy(&ctx, &n);
            tpk_ctx_destroy(&ctx);
        }
    }

    TEST_CASE(
        "initialisation: the same seed gives the same unsharded weights at t = %d as at t = 1",
        np) {
        tpk_ctx sh, ref;
        CHECK_OK(&sh, tpk_ctx_init(&sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 77}));
        CHECK_OK(&ref, tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 77}));
        tpk_ctx *both[2] = {&sh, &ref};
        for (int k = 0; k < 2; k++) {
            tpk_linear c, r;
            CHECK_OK(both[k],
                     tpk_col_linear_init(
                         both[k], &c, 6, 9,
                         &(tpk_linear_desc){.name = "qkv", .stride = 3, .init_std = 0.5f}));
            CHECK_OK(both[k],
                     tpk_row_linear_init(both[k], &r, 11, 5, &(tpk_linear_desc){.name = "proj"}));
            int id;
            CHECK_OK(
                both[k],
                tpk_param_add(
                    both[k],
                    &(tpk_param_desc){
                        "cube", 3, {3, 7, 2, 0}, TPK_S(1), TPK_INIT_NORMAL, 1.f, false, 0, false},
                    &id));
            CHECK_OK(both[k],
                     tpk_param_add(
                         both[k],
                         &(tpk_param_desc){
                             "ones", 1, {5, 0, 0, 0}, TPK_R, TPK_INIT_ONES, 0, false, 0, false},
                         &id));
            /* padded rows (a padded vocabulary) at t = np; unpadded in the reference: the same
             * draw */
            int64_t pad = k == 0 ? tpk_vocab_padded(13, 4, np) : 0, pad_r = k == 0 ? 8 : 0;
            CHECK_OK(both[k], tpk_param_add(both[k],
                                            &(tpk_param_desc){"padded",
                                                              2,
                                                              {13, 3, 0, 0},
                                                              TPK_S(0),
                                                              TPK_INIT_NORMAL,
                                                              1.f,
                                                              true,
                                                              pad,
                                                              false},
                                            &id));
            CHECK_OK(both[k], tpk_param_add(both[k],
                                            &(tpk_param_desc){"padded_ones",
                                                              2,
                                                              {5, 2, 0, 0},
                                                              TPK_R,
                                                              TPK_INIT_ONES,
                                                              0,
                                                              false,
                                                              pad_r,
                                                              false},
                                            &id));
        }
        { /* the stored shards: rows of 4 m on each rank (m = 4), the padding rows zero */
            int ip = tpk_param_find(&sh, "padded"), io = tpk_param_find(&sh, "padded_ones");
            tpk_param *pp = &sh.params.list[ip];
            CHECK(sh.params.list[io].shape[0] == 8, "replicated padded param stores %lld rows",
                  (long long)sh.params.list[io].shape[0]);
            int64_t Vp = tpk_vocab_padded(13, 4, np), v0 = tpk_split(Vp, np, me).off;
            CHECK(pp->shape[0] == Vp / np && pp->shape[0] % 4 == 0 && pp->gshape[0] == 13 &&
                      pp->padded_rows == Vp,
                  "padded shard %lld rows of %lld", (long long)pp->shape[0],
                  (long long)pp->gshape[0]);
            CHECK(tpk_param_global_numel(&sh, ip) == 39, "global numel %zu, expected 39",
                  tpk_param_global_numel(&sh, ip));
            const float *d = tpk_param_data(&sh, ip);
            for (int64_t r = 0; r < pp->shape[0]; r++)
                for (int c = 0; c < 3; c++) {
                    bool pad_row = v0 + r >= 13;
                    CHECK(pad_row ? d[r * 3 + c] == 0.0f : d[r * 3 + c] != 0.0f,
                          "padded row %lld (global %lld) col %d = %g", (long long)r,
                          (long long)(v0 + r), c, d[r * 3 + c]);
                }
            const float *o = tpk_param_data(&sh, io);
            for (int r = 0; r < 8; r++)
                CHECK(o[2 * r] == (r < 5 ? 1.0f : 0.0f), "replicated padded row %d = %g", r,
                      o[2 * r]);
            /* scatter then gather: the whole tensor back, the padding still zero */
            float w[39], back[39];
            test_randn(w, 39, 12, 1.0f);
            CHECK_OK(&sh, tpk_param_set_global(&sh, ip, w));
            test_poison(back, 39);
            CHECK_OK(&sh, tpk_param_get_global(&sh, ip, false, back));
            CHECK(memcmp(w, back, sizeof w) == 0, "padded scatter/gather round trip");
            for (int64_t r = 0; r < pp->shape[0]; r++)
                if (v0 + r >= 13)
                    CHECK(d[r * 3] == 0.0f, "padding row %lld written by scatter", (long long)r);
            CHECK_FAILS(&sh, tpk_param_set_global(&sh, ip, NULL), TPK_ERR_ARG, "in: NULL");
            CHECK_OK(&ref, tpk_param_set_global(&ref, tpk_param_find(&ref, "padded"),
                                                w)); /* the comparison below */
            int bad;
            CHECK_FAILS(
                &sh,
                tpk_param_add(
                    &sh,
                    &(tpk_param_desc){
                        "bad_pad", 2, {13, 3, 0, 0}, TPK_S(0), TPK_INIT_ZEROS, 0, false, 12, false},
                    &bad),
                TPK_ERR_ARG, "bad_pad: padded_rows: expected >= shape[0] = 13");
            CHECK_FAILS(&sh,
                        tpk_param_add(&sh,
                                      &(tpk_param_desc){"bad_pad2",
                                                        2,
                                                        {13, 3, 0, 0},
                                                        TPK_S(1),
                                                        TPK_INIT_ZEROS,
                                                        0,
                                                        false,
                                                        16,
                                                        false},
                                      &bad),
                        TPK_ERR_ARG, "layout R or S(0)");
        }
        CHECK(sh.params.n == ref.params.n, "parameter counts");
        for (int i = 0; i < sh.params.n; i++) {
            size_t gn = tpk_param_global_numel(&sh, i);
            float *a = malloc(gn * 4), *b = malloc(gn * 4);
            test_poison(a, gn), test_poison(b, gn);
            CHECK_OK(&sh, tpk_param_get_global(&sh, i, false, a));
            CHECK_OK(&ref, tpk_param_get_global(&ref, i, false, b));
            CHECK(memcmp(a, b, gn * 4) == 0, "%s differs from the unsharded draw",
                  sh.params.list[i].name);
            double s2 = 0;
            for (size_t k = 0; k < gn; k++) s2 += (double)b[k] * b[k];
            CHECK(s2 > 0, "%s is all zeros", sh.params.list[i].name);
            free(a), free(b);
        }
        tpk_ctx other;
        tpk_linear c;
        tpk_ctx_init(&other, &(tpk_ctx_desc){.seed = 78});
        tpk_col_linear_init(&other, &c, 6, 9,
                            &(tpk_linear_desc){.name = "qkv", .stride = 3, .init_std = 0.5f});
        float *a = malloc(54 * 4), *b = malloc(54 * 4);
        tpk_param_get_global(&other, 0, false, a), tpk_param_get_global(&ref, 0, false, b);
        CHECK(memcmp(a, b, 54 * 4) != 0, "another seed gives the same weights");
        free(a), free(b);
        tpk_ctx_destroy(&other), tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref);
    }

    TEST_CASE(
        "a padded vocabulary table (509 rows padded for %d shards of a multiple of 64) over TP "
        "weights 2 | 3:1 | 3:1:2 | 1:2:3:4: shards of whole "
        "64-row units by weight, the unsharded draw, zero padding, scatter and gather",
        np) {
        tpk_ctx sh, ref, eq;
        double ones[4] = {1, 1, 1, 1};
        CHECK_OK(&sh,
                 tpk_ctx_init(
                     &sh, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 9, .tp_weights = tw}));
        CHECK_OK(&ref, tpk_ctx_init(&ref, &(tpk_ctx_desc){.seed = 9}));
        CHECK_OK(&eq,
                 tpk_ctx_init(&eq, &(tpk_ctx_desc){.world = &world, .tp = np, .tp_weights = ones}));
        int64_t Vp = tpk_vocab_padded(509, 64, np), units = Vp / 64;
        double W = 0, Wr = 0;
        for (int q = 0; q < np; q++) Wr += q < me ? tw[q] : 0, W += tw[q];
        int64_t lo = 64 * (int64_t)floor((double)units * Wr / W),
                hi = me == np - 1 ? Vp : 64 * (int64_t)floor((double)units * (Wr + tw[me]) / W);
        tpk_range r = tpk_tp_vocab_split(&sh, Vp, me), e = tpk_tp_vocab_split(&eq, Vp, me),
                  u = tpk_split(Vp, np, me);
        CHECK(r.off == lo && r.size == hi - lo && r.size % 64 == 0,
              "rank %d: vocabulary rows [%lld, +%lld), expected [%lld, %lld)", me, (long long)r.off,
              (long long)r.size, (long long)lo, (long long)hi);
        CHECK(e.off == u.off && e.size == u.size,
              "equal weights: rows [%lld, +%lld), the even split [%lld, +%lld)", (long long)e.off,
              (long long)e.size, (long long)u.off, (long long)u.size);
        CHECK(tpk_tp_vocab_split(&sh, 509, me).size == tpk_split_weighted(509, tw, np, me).size,
              "unpadded: the plain weighted split");
        int is, ir;
        tpk_param_desc
            d = {"vocab", 2,  {509, 3, 0, 0}, tpk_tp_vocab_layout(&sh, Vp, 0), TPK_INIT_NORMAL, 1.f,
                 true,    Vp, false},
            dr = d;
        dr.layout = TPK_S(0), dr.padded_rows = 0;
        CHECK_OK(&sh, tpk_param_add(&sh, &d, &is));
        CHECK_OK(&ref, tpk_param_add(&ref, &dr, &ir));
        float *g = malloc(509 * 3 * 4), *a = malloc(509 * 3 * 4), *x = malloc(509 * 3 * 4);
        CHECK_OK(&ref, tpk_param_get_global(&ref, ir, false, g));
        const tpk_param *p = &sh.params.list[is];
        const float *loc = tpk_param_data(&sh, is);
        int bad = 0;
        CHECK(p->shape[0] == hi - lo, "the shard stores %lld rows, expected %lld",
              (long long)p->shape[0], (long long)(hi - lo));
        for (int64_t i = 0; i < p->shape[0] && p->shape[0] == hi - lo; i++)
            for (int c = 0; c < 3; c++)
                bad += loc[i * 3 + c] != (lo + i < 509 ? g[(lo + i) * 3 + c] : 0.0f);
        CHECK(bad == 0, "%d stored elements differ from the unsharded draw (or non-zero padding)",
              bad);
        test_poison(a, 509 * 3);
        CHECK_OK(&sh, tpk_param_get_global(&sh, is, false, a));
        CHECK(!memcmp(a, g, 509 * 3 * 4), "gathered table differs from the unsharded draw");
        test_randn(x, 509 * 3, 31, 1.0f);
        CHECK_OK(&sh, tpk_param_set_global(&sh, is, x));
        test_poison(a, 509 * 3);
        CHECK_OK(&sh, tpk_param_get_global(&sh, is, false, a));
        CHECK(!memcmp(a, x, 509 * 3 * 4), "scatter then gather: not the table");
        bad = 0;
        for (int64_t i = 0; i < p->shape[0]; i++)
            for (int c = 0; c < 3; c++)
                bad += loc[i * 3 + c] != (lo + i < 509 ? x[(lo + i) * 3 + c] : 0.0f);
        CHECK(
            bad == 0,
            "%d stored elements after scatter differ from the table's rows [%lld, %lld) (or "
            "non-zero padding)",
            bad, (long long)lo, (long long)hi);
        free(g), free(a), free(x);
        tpk_ctx_destroy(&sh), tpk_ctx_destroy(&ref), tpk_ctx_destroy(&eq);
    }

    TEST_CASE("bad input: layout, shape, NULL, dtype, order, layer kind") {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np});
        tpk_linear c, r, s;
        CHECK_OK(&ctx, tpk_col_linear_init(&ctx, &c, 4, 6, &(tpk_linear_desc){.bias = true}));
        CHECK_OK(&ctx, tpk_row_linear_init(&ctx, &r, 6, 4, NULL));
        CHECK_OK(&ctx, tpk_col_linear_init(&ctx, &s, 4, 6,
                                           &(tpk_linear_desc){.sequence_parallel = true}));
        float buf[64];
        test_randn(buf, 64, 9, 1);
        tpk_tensor y, dx;
        tpk_tensor x = tpk_tensor_2d(buf, TPK_F32, 3, 4, TPK_R);
        CHECK_FAILS(&ctx, tpk_col_linear_backward(&ctx, &c, x, &dx), TPK_ERR_ARG,
                    "backward before forward");
        CHECK_FAILS(&ctx,
                    tpk_col_linear_forward(
                        &ctx, &c, tpk_tensor_shard_2d(buf, TPK_F32, 3, 4, TPK_S(0), np, me), &y),
                    TPK_ERR_LAYOUT, "x: expected layout R, got S(0)");
        CHECK_FAILS(&ctx, tpk_col_linear_forward(&ctx, &s, x, &y), TPK_ERR_LAYOUT,
                    "x: expected layout S(0), got R");
        CHECK_FAILS(&ctx,
                    tpk_col_linear_forward(&ctx, &c, tpk_tensor_2d(buf, TPK_F32, 3, 5, TPK_R), &y),
                    TPK_ERR_SHAPE, "x: expected global shape");
        CHECK_FAILS(&ctx,
                    tpk_col_linear_forward(&ctx, &c, tpk_tensor_2d(NULL, TPK_F32, 3, 4, TPK_R), &y),
                    TPK_ERR_ARG, "x: data is NULL");
        CHECK_FAILS(&ctx,
                    tpk_col_linear_forward(&ctx, &c, tpk_tensor_2d(buf, TPK_BF16, 3, 4, TPK_R), &y),
                    TPK_ERR_DTYPE, "x: expected dtype f32");
        CHECK_FAILS(&ctx, tpk_col_linear_forward(&ctx, &c, x, NULL), TPK_ERR_ARG, "y");
        CHECK_FAILS(&ctx, tpk_col_linear_forward(&ctx, NULL, x, &y), TPK_ERR_ARG, "layer");
        CHECK_FAILS(&ctx, tpk_row_linear_forward(&ctx, &c, x, &y), TPK_ERR_ARG,
                    "is a column linear");
        CHECK_FAILS(&ctx,
                    tpk_row_linear_forward(&ctx, &r, tpk_tensor_2d(buf, TPK_F32, 3, 6, TPK_P), &y),
                    TPK_ERR_LAYOUT, "x: expected layout S(-1)");
        tpk_tensor xs = tpk_tensor_shard_2d(buf, TPK_F32, 3, 6, TPK_S(-1), np, me);
        xs.shape[1] += 1;
        CHECK_FAILS(&ctx, tpk_row_linear_forward(&ctx, &r, xs, &y), TPK_ERR_SHAPE,
                    "x: local shape");
        CHECK_OK(&ctx, tpk_col_linear_forward(&ctx, &c, x, &y));
        tpk_tensor dyw =
            tpk_tensor_shard_2d(buf, TPK_F32, 2, 6, TPK_S(-1), np, me); /* 2 tokens, not 3 */
        CHECK_FAILS(&ctx, tpk_col_linear_backward(&ctx, &c, dyw, &dx), TPK_ERR_SHAPE,
                    "dy: expected global shape");
        CHECK_FAILS(
            &ctx, tpk_col_linear_backward(&ctx, &c, tpk_tensor_2d(buf, TPK_F32, 3, 6, TPK_R), &dx),
            TPK_ERR_LAYOUT, "dy: expected layout S(-1), got R");
        /* the GELU between them refuses a partial sum */
        tpk_gelu g = {0};
        CHECK_FAILS(&ctx, tpk_gelu_forward(&ctx, &g, tpk_tensor_2d(buf, TPK_F32, 3, 6, TPK_P), &y),
                    TPK_ERR_LAYOUT, "x: expected layout R or S(d), got P");
        /* descriptors */
        tpk_linear z;
        CHECK_FAILS(&ctx, tpk_col_linear_init(&ctx, &z, 0, 4, NULL), TPK_ERR_SHAPE,
                    "in: expected >= 1");
        CHECK_FAILS(&ctx, tpk_col_linear_init(&ctx, &z, 4, 10, &(tpk_linear_desc){.stride = 3}),
                    TPK_ERR_SHAPE, "multiple of desc->stride");
        CHECK_FAILS(&ctx, tpk_row_linear_init(&ctx, &z, 4, 6, &(tpk_linear_desc){.stride = 3}),
                    TPK_ERR_ARG, "desc->stride");
        CHECK_FAILS(&ctx,
                    tpk_col_linear_init(&ctx, &z, 4, 6, &(tpk_linear_desc){.name = "linear0"}),
                    TPK_ERR_ARG, "already registered");
        CHECK_FAILS(
            &ctx,
            tpk_col_linear_init(
                &ctx, &z, 4, 6,
                &(tpk_linear_desc){.name = "q", .gather_output = true, .sequence_parallel = true}),
            TPK_ERR_ARG, "desc->gather_output");
        tpk_linear_destroy(&ctx, &c), tpk_linear_destroy(&ctx, &r), tpk_linear_destroy(&ctx, &s),
            tpk_gelu_destroy(&ctx, &g);
        tpk_ctx_destroy(&ctx);
    }
    tpk_comm_destroy(&world);
    return test_finish();
}
