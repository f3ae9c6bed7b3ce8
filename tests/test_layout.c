/* tests/test_layout.c — layout conversions and the six region ops, forward and backward, on
 * every layout each accepts, against the global tensor computed on every rank: R is the
 * tensor, S(d) its tpk_split slice, P rank q's summand (their sum the true value). Shapes
 * include uneven splits, dims smaller than the rank count (ranks holding nothing) and a
 * 3-D tensor split on its middle dim. Wrong layouts and shapes must be refused. */
#include "test.h"

static int me, np;

/* shard of the global g [ndim, gshape] along d for rank r -> out */
static void slice(const float *g, const int64_t *gs, int ndim, int d, int r, float *out) {
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < d; i++) outer *= gs[i];
    for (int i = d + 1; i < ndim; i++) inner *= gs[i];
    tpk_range s = tpk_split(gs[d], np, r);
    for (int64_t o = 0; o < outer; o++)
        memcpy(out + o * s.size * inner, g + (o * gs[d] + s.off) * inner,
               sizeof(float) * (size_t)(s.size * inner));
}
static size_t numel(const int64_t *gs, int ndim) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)gs[i];
    return n;
}
/* the summand of rank q and the full sum */
static void partial(float *p, size_t n, int q) { test_randn(p, n, 100 + (uint64_t)q, 1.f); }
static void partial_sum(float *s, float *tmp, size_t n) {
    for (size_t i = 0; i < n; i++) s[i] = 0;
    for (int q = 0; q < np; q++) {
        partial(tmp, n, q);
        for (size_t i = 0; i < n; i++) s[i] += tmp[i];
    }
}

typedef struct { int ndim; int64_t g[3]; } shape;

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    tpk_comm world;
    tpk_ctx ctx;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK ||
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}) != TPK_OK) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    const shape shapes[] = {{2, {5, 7, 0}}, {2, {6, 1, 0}}, {2, {1, 10, 0}}, {2, {7, 3, 0}}};
    size_t cap = 512;
    float *G = malloc(cap * 4), *S = malloc(cap * 4), *in = malloc(cap * 4), *out = malloc(cap * 4),
          *want = malloc(cap * 4), *tmp = malloc(cap * 4);

    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t *gs = shapes[si].g;
        int nd = shapes[si].ndim;
        size_t n = numel(gs, nd);
        test_randn(G, n, 7 + si, 1.f); /* the replicated tensor */
        partial_sum(S, tmp, n);        /* the true value of the partial tensors */
        TEST_CASE("region ops forward and backward on [%lld, %lld]", (long long)gs[0],
                  (long long)gs[1]) {
            struct {
                tpk_region r;
                bool bwd;
                tpk_layout lin, lout;
                int src;    /* 0: G (R or slice), 1: partial */
                int expect; /* 0: G, 1: S */
            } cases[] = {
                {TPK_REGION_COPY, false, TPK_R, TPK_R, 0, 0},
                {TPK_REGION_COPY, true, TPK_P, TPK_R, 1, 1},
                {TPK_REGION_REDUCE, false, TPK_P, TPK_R, 1, 1},
                {TPK_REGION_REDUCE, true, TPK_R, TPK_R, 0, 0},
                {TPK_REGION_GATHER, false, TPK_S(-1), TPK_R, 0, 0},
                {TPK_REGION_GATHER, true, TPK_R, TPK_S(-1), 0, 0},
                {TPK_REGION_SCATTER, false, TPK_R, TPK_S(-1), 0, 0},
                {TPK_REGION_SCATTER, true, TPK_S(-1), TPK_R, 0, 0},
                {TPK_REGION_SP_GATHER, false, TPK_S(0), TPK_R, 0, 0},
                {TPK_REGION_SP_GATHER, true, TPK_P, TPK_S(0), 1, 1},
                {TPK_REGION_SP_SCATTER, false, TPK_P, TPK_S(0), 1, 1},
                {TPK_REGION_SP_SCATTER, true, TPK_S(0), TPK_R, 0, 0},
            };
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
                int din = tpk_layout_dim(cases[k].lin, nd),
                    dout = tpk_layout_dim(cases[k].lout, nd);
                /* input as this rank holds it */
                if (cases[k].src == 1) partial(in, n, me);
                else if (din >= 0) slice(G, gs, nd, din, me, in);
                else memcpy(in, G, n * 4);
                tpk_tensor x = tpk_tensor_shard(in, TPK_F32, nd, gs, cases[k].lin, np, me), y = {0};
                y.data = out;
                test_poison(out, n);
                const float *truth = cases[k].expect ? S : G;
                if (dout >= 0) slice(truth, gs, nd, dout, me, want);
                else memcpy(want, truth, n * 4);
                size_t nout =
                    dout >= 0 ? n / (size_t)gs[dout] * (size_t)tpk_split(gs[dout], np, me).size : n;
                tpk_status s = cases[k].bwd ? tpk_region_backward(&ctx, cases[k].r, &x, &y)
                                            : tpk_region_forward(&ctx, cases[k].r, &x, &y);
                CHECK(s == TPK_OK, "case %zu: %s", k, tpk_last_error(&ctx));
                CHECK(tpk_layout_eq(y.layout, cases[k].lout, nd), "case %zu: output layout", k);
                CHECK(tpk_numel(&y) == (int64_t)nout,
                      "case %zu: output holds %lld elements, expected %zu", k,
                      (long long)tpk_numel(&y), nout);
                CHECK_CLOSE(out, want, nout, 1e-6, "values");
                CHECK(nout == n || isnan(out[nout]), "case %zu: wrote past its shard", k);
                /* every other input layout is refused, naming the expected one */
                tpk_layout all[] = {TPK_R, TPK_P, TPK_S(0), TPK_S(-1)};
                for (size_t j = 0; j < 4; j++) {
                    if (tpk_layout_eq(all[j], cases[k].lin, nd)) continue;
                    tpk_tensor z = tpk_tensor_shard(in, TPK_F32, nd, gs, all[j], np, me), w = {0};
                    w.data = out;
                    CHECK_FAILS(&ctx,
                                cases[k].bwd ? tpk_region_backward(&ctx, cases[k].r, &z, &w)
                                             : tpk_region_forward(&ctx, cases[k].r, &z, &w),
                                TPK_ERR_LAYOUT, "expected layout");
                }
            }
        }
    }
    TEST_CASE("convert a 3-D tensor split on its middle dim (R->S(1), S(1)->R, P->S(1))") {
        int64_t gs[3] = {3, 6, 5};
        size_t n = numel(gs, 3);
        test_randn(G, n, 99, 1.f);
        partial_sum(S, tmp, n);
        slice(G, gs, 3, 1, me, want);
        tpk_tensor x = tpk_tensor_nd(G, TPK_F32, 3, gs, TPK_R), y = {0};
        y.data = out;
        test_poison(out, n);
        CHECK_OK(&ctx, tpk_convert(&ctx, &x, TPK_S(1), &y));
        CHECK_CLOSE(out, want, (size_t)tpk_numel(&y), 1e-7, "R -> S(1)");
        memcpy(in, out, (size_t)tpk_numel(&y) * 4);
        tpk_tensor s1 = tpk_tensor_shard(in, TPK_F32, 3, gs, TPK_S(1), np, me);
        test_poison(out, n);
        CHECK_OK(&ctx, tpk_convert(&ctx, &s1, TPK_R, &y));
        CHECK_CLOSE(out, G, n, 1e-7, "S(1) -> R");
        partial(in, n, me);
        tpk_tensor p = tpk_tensor_nd(in, TPK_F32, 3, gs, TPK_P);
        test_poison(out, n);
        CHECK_OK(&ctx, tpk_convert(&ctx, &p, TPK_S(1), &y));
        slice(S, gs, 3, 1, me, want);
        CHECK_CLOSE(out, want, (size_t)tpk_numel(&y), 1e-6, "P -> S(1)");
        partial(in, n, me);
        CHECK_OK(&ctx, tpk_convert(&ctx, &p, TPK_R, &p)); /* in place */
        CHECK_CLOSE(in, S, n, 1e-6, "P -> R in place");
    }
    TEST_CASE("bad tensors are refused with a named argument") {
        int64_t gs[2] = {4, 6};
        test_randn(in, 24, 5, 1.f);
        tpk_tensor y = {0};
        y.data = out;
        tpk_tensor x = tpk_tensor_shard(in, TPK_F32, 2, gs, TPK_S(-1), np, me);
        x.shape[1] += 1; /* local shape that does not match the split */
        CHECK_FAILS(&ctx, tpk_convert(&ctx, &x, TPK_R, &y), TPK_ERR_SHAPE, "dim 1 should be");
        x = tpk_tensor_nd(in, TPK_F32, 2, gs, TPK_P);
        CHECK_FAILS(&ctx, tpk_convert(&ctx, &x, TPK_P, &y), TPK_OK, ""); /* P -> P is a copy */
        x = tpk_tensor_nd(in, TPK_F32, 2, gs, TPK_R);
        CHECK_FAILS(&ctx, tpk_convert(&ctx, &x, TPK_P, &y), TPK_ERR_LAYOUT, "no conversion");
        CHECK_FAILS(&ctx, tpk_convert(&ctx, &x, TPK_S(2), &y), TPK_ERR_LAYOUT, "to");
        CHECK_FAILS(&ctx, tpk_convert(&ctx, &x, TPK_S_EX(0, 2, 1), &y), TPK_ERR_LAYOUT, "strided");
        x.data = NULL;
        CHECK_FAILS(&ctx, tpk_convert(&ctx, &x, TPK_S(0), &y), TPK_ERR_ARG, "in: data is NULL");
        x.data = in;
        tpk_tensor nul = {0};
        CHECK_FAILS(&ctx, tpk_convert(&ctx, &x, TPK_S(0), &nul), TPK_ERR_ARG, "out->data");
        CHECK_FAILS(&ctx, tpk_region_forward(&ctx, (tpk_region)17, &x, &y), TPK_ERR_ARG, "region");
        x = tpk_tensor_shard(in, TPK_F32, 2, gs, TPK_S(0), np, me);
        x.dtype = (tpk_dtype)5;
        CHECK_FAILS(&ctx, tpk_region_forward(&ctx, TPK_REGION_SP_GATHER, &x, &y), TPK_ERR_DTYPE,
                    "dtype");
    }
    TEST_CASE("split arithmetic: uneven, covering, in order") {
        int bad = 0;
        for (int64_t n = 0; n < 40; n++)
            for (int p = 1; p <= 9; p++) {
                int64_t next = 0;
                for (int i = 0; i < p; i++) {
                    tpk_range r = tpk_split(n, p, i);
                    bad += r.off != next || r.size < n / p || r.size > n / p + 1 ||
                           (i < n % p) != (r.size == n / p + 1);
                    next = r.off + r.size;
                }
                bad += next != n;
            }
        CHECK(bad == 0, "%d bad splits", bad);
        CHECK(tpk_split(10, 3, 0).size == 4 && tpk_split(10, 3, 2).off == 7 &&
                  tpk_split(1, 4, 3).size == 0,
              "examples");
        CHECK(tpk_shard_size(12, TPK_S_EX(0, 3, 1), 4, 0) == 3 &&
                  tpk_shard_size(12, TPK_S_EX(0, 3, 1), 4, 3) == 3 &&
                  tpk_shard_size(6, TPK_S_EX(0, 3, 1), 4, 3) == 0,
              "strided");
        CHECK(tpk_shard_size(12, TPK_S_EX(0, 1, 2), 4, 0) == 4 &&
                  tpk_shard_size(12, TPK_S_EX(0, 1, 2), 4, 3) == 2 &&
                  tpk_shard_size(36, TPK_S_EX(0, 3, 2), 4, 3) == 6,
              "units");
        char buf[64];
        CHECK(!strcmp(tpk_layout_str(TPK_S(-1), buf, sizeof buf), "S(-1)") &&
                  !strcmp(tpk_layout_str(TPK_P, buf, sizeof buf), "P"),
              "names");
    }
    TEST_CASE(
        "weighted split arithmetic: NULL weights = the even split; shards tile [0, n) in order, "
        "each within one element of n w_i / W") {
        int bad = 0;
        double w[9];
        for (int64_t n = 0; n < 60; n++)
            for (int p = 1; p <= 9; p++)
                for (int k = 0; k < 4; k++) {
                    for (int i = 0; i < p; i++)
                        w[i] = k == 0   ? 1.0
                               : k == 1 ? 1.0 + i
                               : k == 2 ? 0.1 + (double)((i * 7 + (int)n) % 5)
                                        : 1e-3 + (i == 0) * 100.0;
                    double W = 0;
                    for (int i = 0; i < p; i++) W += w[i];
                    int64_t next = 0;
                    for (int i = 0; i < p; i++) {
                        tpk_range r = tpk_split_weighted(n, w, p, i),
                                  e = tpk_split_weighted(n, NULL, p, i), u = tpk_split(n, p, i);
                        bad += r.off != next || r.size < 0 ||
                               fabs((double)r.size - (double)n * w[i] / W) >= 1.0 + 1e-9 ||
                               e.off != u.off || e.size != u.size;
                        next = r.off + r.size;
                    }
                    bad += next != n;
                }
        CHECK(bad == 0, "%d bad weighted splits", bad);
        double a[2] = {3, 1}, b[4] = {1, 2, 3, 4};
        CHECK(tpk_split_weighted(8, a, 2, 0).size == 6 && tpk_split_weighted(8, a, 2, 1).off == 6 &&
                  tpk_split_weighted(8, a, 2, 1).size == 2,
              "3:1 of 8");
        CHECK(tpk_split_weighted(6, b, 4, 0).size == 0 &&
                  tpk_split_weighted(6, b, 4, 1).size == 1 &&
                  tpk_split_weighted(6, b, 4, 3).size == 3,
              "1:2:3:4 of 6");
        CHECK(tpk_shard_size_w(24, TPK_S_EX(0, 3, 2), 2, a, 0) == 18 &&
                  tpk_shard_size_w(24, TPK_S_EX(0, 3, 2), 2, a, 1) == 6,
              "strided, units");
    }
    TEST_CASE(
        "weighted TP split (weights 3:1:2:1...): conversions R -> S(d) -> R, P -> S(0) against the "
        "weighted slices of the global tensor") {
        double w[8] = {3, 1, 2, 1, 5, 1, 1, 2};
        tpk_ctx wc;
        CHECK_OK(&wc,
                 tpk_ctx_init(&wc, &(tpk_ctx_desc){.world = &world, .tp = np, .tp_weights = w}));
        int64_t gs[3] = {5, 13, 3};
        size_t n = numel(gs, 3);
        test_randn(G, n, 77, 1.f);
        partial_sum(S, tmp, n);
        for (int d = 0; d < 3; d++) {
            int64_t outer = 1, inner = 1;
            for (int i = 0; i < d; i++) outer *= gs[i];
            for (int i = d + 1; i < 3; i++) inner *= gs[i];
            tpk_range r = tpk_split_weighted(gs[d], w, np, me);
            for (int sum = 0; sum < 2; sum++) { /* want: this rank's weighted slice of G (R ->
                                                   S(d)), or of S (P -> S(d)) */
                const float *truth = sum ? S : G;
                for (int64_t o = 0; o < outer; o++)
                    memcpy(want + o * r.size * inner, truth + (o * gs[d] + r.off) * inner,
                           sizeof(float) * (size_t)(r.size * inner));
                if (sum) partial(in, n, me);
                else memcpy(in, G, n * 4);
                tpk_tensor x = tpk_tensor_nd(in, TPK_F32, 3, gs, sum ? TPK_P : TPK_R), y = {0};
                test_poison(out, n);
                y.data = out;
                CHECK_OK(&wc, tpk_convert(&wc, &x, TPK_S(d), &y));
                CHECK(y.shape[d] == r.size, "dim %d: local size %lld, expected %lld", d,
                      (long long)y.shape[d], (long long)r.size);
                CHECK_CLOSE(out, want, (size_t)(outer * r.size * inner), 1e-5,
                            sum ? "P -> S(d)" : "R -> S(d)");
                if (sum) continue;
                tpk_tensor z = {0};
                memcpy(in, out, (size_t)(outer * r.size * inner) * 4);
                x = y, x.data = in;
                test_poison(out, n);
                z.data = out;
                CHECK_OK(&wc, tpk_convert(&wc, &x, TPK_R, &z));
                CHECK_CLOSE(out, G, n, 1e-12, "S(d) -> R");
            }
        }
        tpk_ctx_destroy(&wc);
    }
    TEST_CASE(
        "bad TP weights: zero, negative, NaN, infinite, or different on different ranks: a clear "
        "error on every rank") {
        double bads[4] = {0.0, -1.0, NAN, INFINITY};
        for (int k = 0; k < 4; k++) {
            double w[8] = {1, 1, 1, 1, 1, 1, 1, 1};
            w[np - 1] = bads[k];
            tpk_ctx c;
            char msg[64];
            snprintf(msg, sizeof msg, "desc->tp_weights[%d]: expected a finite weight > 0", np - 1);
            CHECK_FAILS(
                &c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = np, .tp_weights = w}),
                TPK_ERR_ARG, msg);
        }
        double w[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        w[0] = me ? 2.0 : 1.0; /* rank 0 says 1, the others 2 (with one rank: all agree) */
        tpk_ctx c;
        tpk_status s =
            tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = np, .tp_weights = w});
        if (np > 1)
            CHECK(s == TPK_ERR_ARG &&
                      strstr(tpk_last_error(&c), "the ranks were given different weights"),
                  "different weights: %s", tpk_last_error(&c));
        else CHECK(s == TPK_OK, "one rank: %s", tpk_last_error(&c));
        if (s == TPK_OK) tpk_ctx_destroy(&c);
    }
    free(G), free(S), free(in), free(out), free(want), free(tmp);
    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    return test_finish();
}
