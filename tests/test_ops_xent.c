/* tests/test_ops_xent.c — the host backend's cross-entropy pieces (kernels/host/xent.c) over three
 * vocabulary shards: the loss with and without label smoothing and an ignored target, the
 * gradient against a double reference and finite differences, aliasing, bf16; and the backend's
 * vector exponential (kernels/host/vec.h) against exp in double. Runs on one rank. */
#include "ops_test.h"

#include "../kernels/host/vec.h" /* tpk__vexp: the backend's exponential, tested below */

/* ---- cross-entropy ------------------------------------------------------------------------- */

#define IGNORE (-100)

/* Reference in double over the full z [T, V]: lse, loss (0 when ignored) and, with dloss,
 * dz = (softmax - (1-eps) onehot - eps/V) dloss (0 when ignored). */
static void xent_ref(const float *z, int64_t T, int64_t V, const int32_t *y, double eps,
                     const float *dloss, double *loss, double *lse, double *dz) {
    for (int64_t t = 0; t < T; t++) {
        const float *zt = z + t * V;
        double m = -INFINITY, s = 0, sz = 0;
        for (int64_t j = 0; j < V; j++) m = zt[j] > m ? zt[j] : m;
        for (int64_t j = 0; j < V; j++) s += exp((double)zt[j] - m), sz += zt[j];
        double l = m + log(s);
        bool ign = y[t] == IGNORE;
        lse[t] = l;
        loss[t] = ign ? 0.0 : l - (1 - eps) * zt[y[t]] - eps * sz / (double)V;
        if (dz)
            for (int64_t j = 0; j < V; j++)
                dz[t * V + j] =
                    ign ? 0.0
                        : (exp((double)zt[j] - l) - (j == y[t] ? 1 - eps : 0.0) - eps / (double)V) *
                              dloss[t];
    }
}

/* columns r of z [T, V] into a contiguous [T, r.size] shard of dtype dt */
static void shard_of(void *zq, const float *z, int64_t T, int64_t V, tpk_range r, tpk_dtype dt) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < r.size; j++) {
            float v = z[t * V + r.off + j];
            if (dt == TPK_F32) ((float *)zq)[t * r.size + j] = v;
            else ((uint16_t *)zq)[t * r.size + j] = tpk_f32_to_bf16(v);
        }
}

/* The sharded forward as TP ranks run it: xent_stats per shard into part [nsh, T, 4] (the
 * all-gather's order), xent_loss over the nsh parts. With check, every shard's statistics are
 * compared with the reference (z must already be bf16-exact for bf16): the max and z_y bit for
 * bit, the sums within f32. */
static void xent_forward(const float *z, int64_t T, int64_t V, int nsh, const int32_t *y, float eps,
                         tpk_dtype dt, float *loss, float *lse, bool check) {
    size_t nt = (size_t)T;
    float *part = fbuf(4 * nt * (size_t)nsh);
    void *zq = malloc((size_t)(T * V) * sizeof(float) + 4);
    test_poison(part, 4 * nt * (size_t)nsh);
    for (int q = 0; q < nsh; q++) {
        tpk_range r = tpk_split(V, nsh, q);
        float *pq = part + 4 * nt * (size_t)q;
        shard_of(zq, z, T, V, r, dt);
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, pq, zq, y, T, r.size, r.size, r.off, dt));
        if (!check) continue;
        float g1[64], g3[64], w1[64], w3[64];
        for (int64_t t = 0; t < T && t < 64; t++) {
            float m = -INFINITY;
            for (int64_t j = 0; j < r.size; j++)
                m = z[t * V + r.off + j] > m ? z[t * V + r.off + j] : m;
            CHECK(memcmp(&m, &pq[4 * t], 4) == 0,
                  "xent_stats shard %d row %lld: max %g, expected %g", q, (long long)t, pq[4 * t],
                  m);
            double se = 0, sz = 0;
            for (int64_t j = 0; j < r.size; j++)
                se += exp((double)z[t * V + r.off + j] - m), sz += z[t * V + r.off + j];
            w1[t] = (float)se, w3[t] = (float)sz, g1[t] = pq[4 * t + 1], g3[t] = pq[4 * t + 3];
            float zy = y[t] >= r.off && y[t] < r.off + r.size ? z[t * V + y[t]] : 0.0f;
            CHECK(memcmp(&zy, &pq[4 * t + 2], 4) == 0,
                  "xent_stats shard %d row %lld: z_y part %g, expected %g", q, (long long)t,
                  pq[4 * t + 2], zy);
        }
        CHECK_CLOSE(g1, w1, (size_t)(T < 64 ? T : 64), TOL_F32, "xent_stats sum exp(z - max)");
        CHECK_CLOSE(g3, w3, (size_t)(T < 64 ? T : 64), TOL_F32, "xent_stats sum z");
    }
    test_poison(loss, nt), test_poison(lse, nt);
    CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss, lse, part, nsh, y, T, V, eps, IGNORE));
    free(part), free(zq);
}

/* dz of the full [T, V] assembled from xent_grad per shard; with check, dz aliasing z per shard
 * must give the same bits */
static void xent_backward(const float *z, const float *lse, const float *dloss, int64_t T,
                          int64_t V, int nsh, const int32_t *y, float eps, tpk_dtype dt, float *dz,
                          bool check) {
    size_t esz = dt == TPK_F32 ? 4 : 2, n = (size_t)(T * V);
    unsigned char *zq = malloc(n * 4 + 4), *dq = malloc(n * 4 + 4), *aq = malloc(n * 4 + 4);
    for (int q = 0; q < nsh; q++) {
        tpk_range r = tpk_split(V, nsh, q);
        size_t nq = (size_t)(T * r.size);
        shard_of(zq, z, T, V, r, dt);
        if (dt == TPK_F32) test_poison((float *)dq, nq);
        else poison_bf16((uint16_t *)dq, nq);
        CHECK_OK(&ctx, tpk_op_xent_grad(&ctx, dq, zq, lse, y, dloss, T, r.size, r.size, r.off, V,
                                        eps, IGNORE, dt));
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < r.size; j++)
                dz[t * V + r.off + j] = dt == TPK_F32
                                            ? ((float *)dq)[t * r.size + j]
                                            : tpk_bf16_to_f32(((uint16_t *)dq)[t * r.size + j]);
        if (check) {
            memcpy(aq, zq, nq * esz);
            CHECK_OK(&ctx, tpk_op_xent_grad(&ctx, aq, aq, lse, y, dloss, T, r.size, r.size, r.off,
                                            V, eps, IGNORE, dt));
            CHECK(memcmp(aq, dq, nq * esz) == 0,
                  "xent_grad shard %d: dz aliasing z differs from out of place", q);
        }
    }
    free(zq), free(dq), free(aq);
}

static void test_xent(void) {
    enum { T = 6, V = 11, NSH = 3 };
    /* shards of 11 over 3: [0, 4), [4, 8), [8, 11). Targets on shard edges; row 2 ignored. */
    const int32_t y[T] = {0, 10, IGNORE, 4, 7, 3};
    const size_t n = T * V;
    const float epss[] = {0.0f, 0.1f};
    for (int e = 0; e < 2; e++) {
        const float eps = epss[e];
        TEST_CASE(
            "layers cross-entropy f32 smoothing %g: 3 vocab shards, loss, ignore index, grad, "
            "finite differences, aliasing",
            (double)eps) {
            float z[T * V], dloss[T], loss[T], lse[T], wl[T], wlse[T], dz[T * V], wdz[T * V],
                fd[T * V];
            double rl[T], rlse[T], rdz[T * V];
            test_randn(z, n, 1000 + e, 3.0f);
            /* a row far from 0: the max must be subtracted */
            for (int j = 0; j < V; j++) z[4 * V + j] += 30.0f;
            test_randn(dloss, T, 1010 + e, 1.0f);

            xent_forward(z, T, V, NSH, y, eps, TPK_F32, loss, lse, true);
            xent_ref(z, T, V, y, eps, dloss, rl, rlse, rdz);
            d2f(wl, rl, T), d2f(wlse, rlse, T), d2f(wdz, rdz, n);
            CHECK_CLOSE(loss, wl, T, TOL_F32, "xent_loss vs log-sum-exp reference");
            CHECK_CLOSE(lse, wlse, T, TOL_F32, "xent_loss lse");
            CHECK(loss[2] == 0.0f, "ignored target: loss %g, expected 0", loss[2]);

            xent_backward(z, lse, dloss, T, V, NSH, y, eps, TPK_F32, dz, true);
            CHECK_CLOSE(dz, wdz, n, TOL_F32, "xent_grad vs reference");
            size_t nz = 0;
            for (int j = 0; j < V; j++) nz += dz[2 * V + j] != 0.0f;
            CHECK(nz == 0, "ignored target: %zu nonzero dz", nz);

            /* finite differences of L = sum_t dloss_t loss_t over every logit */
            float zz[T * V], lp[T], lm[T], ls[T];
            memcpy(zz, z, sizeof zz);
            for (size_t k = 0; k < n; k++) {
                float save = zz[k], xp, xm;
                double step = fd_step(save, 1e-2, &xp, &xm), Lp = 0, Lm = 0;
                zz[k] = xp;
                xent_forward(zz, T, V, NSH, y, eps, TPK_F32, lp, ls, false);
                zz[k] = xm;
                xent_forward(zz, T, V, NSH, y, eps, TPK_F32, lm, ls, false);
                zz[k] = save;
                for (int t = 0; t < T; t++)
                    Lp += (double)dloss[t] * lp[t], Lm += (double)dloss[t] * lm[t];
                fd[k] = (float)((Lp - Lm) / step);
            }
            CHECK_CLOSE(dz, fd, n, TOL_FD, "xent_grad vs finite differences of the loss");
        }
    }

    TEST_CASE("layers cross-entropy bf16 logits, smoothing 0.1: loss and grad within bf16") {
        float z[T * V], dloss[T], loss[T], lse[T], wl[T], dz[T * V], wdz[T * V];
        double rl[T], rlse[T], rdz[T * V];
        test_randn(z, n, 1020, 3.0f);
        round_bf16(z, n);
        test_randn(dloss, T, 1021, 1.0f);
        xent_forward(z, T, V, NSH, y, 0.1f, TPK_BF16, loss, lse, true);
        xent_ref(z, T, V, y, 0.1, dloss, rl, rlse, rdz);
        d2f(wl, rl, T), d2f(wdz, rdz, n);
        CHECK_CLOSE(loss, wl, T, TOL_F32,
                    "bf16 logits: loss (f32 arithmetic on exact bf16 inputs)");
        xent_backward(z, lse, dloss, T, V, NSH, y, 0.1f, TPK_BF16, dz, true);
        CHECK_CLOSE(dz, wdz, n, TOL_BF16, "bf16 xent_grad");
    }

    TEST_CASE(
        "layers cross-entropy: a padded shard (rows of ld > Vl) ignores its padding and gets a "
        "zero gradient there") {
        enum { LD = 9 };
        tpk_range r = tpk_split(V, NSH, 1); /* columns [4, 8) */
        float z[T * V], zs[T * 4], zp[T * LD], dloss[T], part[4 * T], partp[4 * T], lse[T], loss[T],
            dz[T * 4], dzp[T * LD];
        test_randn(z, n, 1030, 3.0f);
        test_randn(dloss, T, 1031, 1.0f);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < LD; j++) {
                if (j < r.size) zs[t * r.size + j] = zp[t * LD + j] = z[t * V + r.off + j];
                else zp[t * LD + j] = 1e30f; /* read as a logit, it would dominate the max and
                                                overflow the sums */
            }
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, part, zs, y, T, r.size, r.size, r.off, TPK_F32));
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, partp, zp, y, T, r.size, LD, r.off, TPK_F32));
        CHECK(memcmp(part, partp, sizeof part) == 0,
              "xent_stats of the padded rows differs from the unpadded");
        CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss, lse, part, 1, y, T, V, 0.1f, IGNORE));
        test_poison(dz, T * 4), test_poison(dzp, T * LD);
        CHECK_OK(&ctx, tpk_op_xent_grad(&ctx, dz, zs, lse, y, dloss, T, r.size, r.size, r.off, V,
                                        0.1f, IGNORE, TPK_F32));
        CHECK_OK(&ctx, tpk_op_xent_grad(&ctx, dzp, zp, lse, y, dloss, T, r.size, LD, r.off, V, 0.1f,
                                        IGNORE, TPK_F32));
        int bad = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < LD; j++)
                bad += j < r.size ? memcmp(&dz[t * r.size + j], &dzp[t * LD + j], 4) != 0
                                  : dzp[t * LD + j] != 0.0f;
        CHECK(
            bad == 0,
            "xent_grad of the padded rows: %d elements differ from the unpadded or are not zero in "
            "the padding",
            bad);
    }

    TEST_CASE(
        "layers cross-entropy: an empty shard (Vl = 0) gives (-inf, 0, 0, 0) and adds nothing to "
        "the loss") {
        float part[12], z[3 * V], loss[3], lse[3], loss2[3], lse2[3], two[2 * 12];
        const int32_t yy[3] = {0, 5, IGNORE};
        test_poison(part, 12);
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, part, NULL, yy, 3, 0, 0, 11, TPK_F32));
        int bad = 0;
        for (int t = 0; t < 3; t++)
            bad += !(isinf(part[4 * t]) && part[4 * t] < 0) + (part[4 * t + 1] != 0) +
                   (part[4 * t + 2] != 0) + (part[4 * t + 3] != 0);
        CHECK(bad == 0, "Vl = 0: parts %g %g %g %g ...", part[0], part[1], part[2], part[3]);
        /* a rank with no columns before one with all of them: the same loss as the latter alone */
        test_randn(z, 3 * V, 1040, 3.0f);
        for (int t = 0; t < 3; t++) memcpy(two + 4 * t, part + 4 * t, 16);
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, two + 12, z, yy, 3, V, V, 0, TPK_F32));
        CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss, lse, two, 2, yy, 3, V, 0.1f, IGNORE));
        CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss2, lse2, two + 12, 1, yy, 3, V, 0.1f, IGNORE));
        CHECK(memcmp(loss, loss2, sizeof loss) == 0 && memcmp(lse, lse2, sizeof lse) == 0,
              "an empty rank's parts changed the loss: %g vs %g", loss[0], loss2[0]);
    }

    TEST_CASE(
        "layers cross-entropy: xent_fused (one rank) equals xent_stats, xent_loss and xent_grad "
        "bit for bit, in place and not, "
        "padded rows, ignore index, f32 and bf16") {
        enum { LD = 16 };
        for (int d = 0; d < 2; d++) {
            tpk_dtype dt = d ? TPK_BF16 : TPK_F32;
            size_t es = d ? 2 : 4;
            float z[T * V], part[4 * T], loss[T], lse[T], fl[T], flse[T], dl[T], wl[T];
            double rl[T], rlse[T];
            unsigned char zp[T * LD * 4], dz[T * LD * 4], fz[T * LD * 4], az[T * LD * 4];
            test_randn(z, n, 1050 + d, 3.0f);
            if (d) round_bf16(z, n);
            for (int t = 0; t < T; t++)
                for (int j = 0; j < LD; j++) {
                    float v = j < V ? z[t * V + j] : 1e30f; /* the padding must not be read as
                                                               logits */
                    if (d) ((uint16_t *)zp)[t * LD + j] = tpk_f32_to_bf16(v);
                    else ((float *)zp)[t * LD + j] = v;
                }
            const float g = 0.37f;
            for (int t = 0; t < T; t++) dl[t] = g;
            CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, part, zp, y, T, V, LD, 0, dt));
            CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss, lse, part, 1, y, T, V, 0.1f, IGNORE));
            CHECK_OK(&ctx,
                     tpk_op_xent_grad(&ctx, dz, zp, lse, y, dl, T, V, LD, 0, V, 0.1f, IGNORE, dt));
            test_poison(fl, T), test_poison(flse, T), memset(fz, 0xff, sizeof fz);
            CHECK_OK(&ctx,
                     tpk_op_xent_fused(&ctx, fz, fl, flse, zp, y, T, V, LD, 0.1f, IGNORE, g, dt));
            CHECK(memcmp(fl, loss, sizeof loss) == 0 && memcmp(flse, lse, sizeof lse) == 0,
                  "%s fused loss %g lse %g, apart %g %g", d ? "bf16" : "f32", fl[0], flse[0],
                  loss[0], lse[0]);
            CHECK(memcmp(fz, dz, (size_t)(T * LD) * es) == 0,
                  "%s fused dz differs from xent_grad's", d ? "bf16" : "f32");
            memcpy(az, zp, sizeof az);
            CHECK_OK(&ctx,
                     tpk_op_xent_fused(&ctx, az, fl, flse, az, y, T, V, LD, 0.1f, IGNORE, g, dt));
            CHECK(memcmp(az, dz, (size_t)(T * LD) * es) == 0, "%s fused dz in place differs",
                  d ? "bf16" : "f32");
            xent_ref(z, T, V, y, 0.1, NULL, rl, rlse, NULL);
            d2f(wl, rl, T);
            CHECK_CLOSE(fl, wl, T, TOL_F32, "fused loss vs reference");
        }
    }

    TEST_CASE(
        "layers cross-entropy: xent_mean (the mean loss in backend memory) against a long double "
        "sum; running sums; poisoned output") {
        enum { NT = 4 };
        const int64_t Ts[NT] = {0, 1, 333, 20000}, counts[NT] = {0, 1, 300, 19999};
        for (int c = 0; c < NT; c++) {
            int64_t T = Ts[c], count = counts[c];
            float *l = fbuf((size_t)(T ? T : 1));
            test_randn(l, (size_t)T, 900 + (uint64_t)c, 3.0f);
            for (int64_t t = 0; t < T; t++)
                l[t] = fabsf(l[t]) +
                       (t % 7 == 0 ? 1e4f
                                   : 0.0f); /* losses >= 0, some large: the order matters in f32 */
            long double ref = 0;
            for (int64_t t = 0; t < T; t++) ref += l[t];
            double want = count ? (double)(float)(ref / (long double)count) : 0.0,
                   acc = NAN; /* poisoned */
            CHECK_OK(&ctx, tpk_op_xent_mean(&ctx, &acc, l, T, count, false));
            CHECK(fabs(acc - want) <= 1.2e-7 * fabs(want), "T = %lld: mean %.9g, reference %.9g",
                  (long long)T, acc, want);
            CHECK(acc == (double)(float)acc, "T = %lld: the mean is a float (%.17g)", (long long)T,
                  acc);
            double m = acc;
            /* a running sum: acc + m */
            CHECK_OK(&ctx, tpk_op_xent_mean(&ctx, &acc, l, T, count, true));
            CHECK(acc == 2.0 * m, "T = %lld: accumulated %.17g, expected %.17g", (long long)T, acc,
                  2.0 * m);
            acc = 0.25;
            CHECK_OK(&ctx, tpk_op_xent_mean(&ctx, &acc, l, T, count, true));
            CHECK(acc == 0.25 + m, "T = %lld: accumulated onto 0.25: %.17g", (long long)T, acc);
            free(l);
        }
    }
}

/* ---- the vector exponential ------------------------------------------------------------------ */

/* the distance of f from the exact e in units of the float spacing at e */
static double ulps(float f, double e) {
    int ex;
    frexp(e, &ex);
    double u = ldexp(1.0, (ex - 24 < -149 ? -149 : ex - 24)); /* the spacing of floats at e */
    return fabs((double)f - e) / u;
}

/* tpk__vexp against exp in double and against expf on every 31st float of [-87, 88] (as bit
 * patterns: every binade alike, about 68 million values), lanes permuted so each lane sees every
 * kind of value, then the edges: overflow, underflow to subnormals and zero, infinities, NaN.
 * Bound: 2 ulp from each. */
static void test_exp(void) {
    TEST_CASE("vector exp within 2 ulp of exp on [-87, 88]");
    double worst = 0, worst_f = 0; /* against exp in double; against the C library's expf */
    float at = 0;
    for (int side = 0; side < 2; side++) {
        uint32_t end = f32_bits(side ? 88.0f : -87.0f), sign = side ? 0 : 0x80000000u;
        for (uint32_t b = 0; b <= (end & 0x7fffffffu); b += 31 * TPK__VL) {
            tpk__v8f x;
            for (int k = 0; k < TPK__VL; k++) {
                uint32_t u = b + 31u * (uint32_t)((k * 3) % TPK__VL);
                x[k] = bits_f32(sign | (u > (end & 0x7fffffffu) ? 0u : u));
            }
            tpk__v8f r = tpk__vexp(x);
            for (int k = 0; k < TPK__VL; k++) {
                double e = ulps(r[k], exp((double)x[k])), f = ulps(r[k], (double)expf(x[k]));
                if (e > worst) worst = e, at = x[k];
                if (f > worst_f) worst_f = f;
            }
        }
    }
    CHECK(worst <= 2.0, "exp: %.2f ulp at x = %.9g (bound 2)", worst, (double)at);
    CHECK(worst_f <= 2.0, "exp: %.2f ulp from expf (bound 2)", worst_f);
    printf(
        "  vector exp: worst %.2f ulp from exp (at x = %.9g), %.2f ulp from expf, over [-87, 88]\n",
        worst, (double)at, worst_f);
    const float xs[] = {88.72f,  88.7228f, 89.0f,     1000.0f, INFINITY, -88.0f, -100.0f, -103.9f,
                        -104.0f, -1000.0f, -INFINITY, 0.0f,    -0.0f,    1e-30f, -1e-30f, NAN};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        float x = xs[i], r = tpk__exp1(x);
        double e = exp((double)x);
        bool ok = isnan(x)            ? isnan(r)
                  : e > 3.4028234e38  ? isinf(r) && r > 0
                  : e < 1.1754944e-38 ? fabs((double)r - e) <= 1.5e-45 /* subnormal: 1 step */
                                      : ulps(r, e) <= 2.0;
        CHECK(ok, "exp(%.9g) = %.9g, expected %.9g", (double)x, (double)r, e);
    }
    /* lanes are independent: one value alone and among others gives the same bits */
    tpk__v8f mix = {-3.5f, 2.25f, NAN, -1e4f, 80.0f, -0.5f, 1e-7f, 0.75f};
    tpk__v8f r = tpk__vexp(mix);
    for (int k = 0; k < TPK__VL; k++) {
        float one = tpk__exp1(mix[k]);
        CHECK(memcmp(&one, &r[k], 4) == 0, "exp lane %d differs from the value alone", k);
    }
}

OPS_TEST_MAIN(test_xent, test_exp)
