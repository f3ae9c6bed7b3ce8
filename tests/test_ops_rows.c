/* tests/test_ops_rows.c — the host backend's rows moved by an index (kernels/host/rows.c):
 * gather_rows, scatter_add_rows, moe_combine_fwd and moe_combine_bwd on random inputs against a
 * plain C reference — in double within a tolerance, and written out in the contract's f32 order
 * (tpk/base/ops.h), which every result must equal bit for bit — with indices that repeat, are -1
 * or out of range, outputs poisoned (NaN) where the op writes them and their padding kept, both
 * dtypes (gather_rows: all four); the combine and its backward against the per-row axpby loop the
 * MoE dispatcher made before (tpk/layers/moe.h: the same bits in f32); bad arguments refused by
 * name. Runs on one rank. */
#include "ops_test.h"

/* x as floats of dt (rounded to bf16 where dt is bf16), stored in dt into `raw` */
static void store(void *raw, tpk_dtype dt, const float *x, size_t n) {
    if (dt == TPK_F32) memcpy(raw, x, n * sizeof(float));
    else to_bf16((uint16_t *)raw, x, n);
}
static void load(float *x, tpk_dtype dt, const void *raw, size_t n) {
    if (dt == TPK_F32) memcpy(x, raw, n * sizeof(float));
    else from_bf16(x, (const uint16_t *)raw, n);
}
/* random values of dt: N(0, 1) rounded to what dt holds */
static float *rand_dt(size_t n, uint64_t seed, tpk_dtype dt) {
    float *x = fbuf(n);
    test_randn(x, n, seed, 1.0f);
    if (dt == TPK_BF16) round_bf16(x, n);
    return x;
}
/* v rounded to dt */
static float rnd(tpk_dtype dt, float v) {
    return dt == TPK_F32 ? v : tpk_bf16_to_f32(tpk_f32_to_bf16(v));
}
/* a buffer of n elements of dt, every byte 0xff (NaN in f32 and bf16) */
static void *poisoned(size_t n, tpk_dtype dt) {
    size_t b = (n ? n : 1) * tpk_dtype_size(dt);
    void *p = malloc(b);
    memset(p, 0xff, b);
    return p;
}

/* ---- gather_rows ----------------------------------------------------------------------------- */

static void test_gather(void) {
    const tpk_dtype all[4] = {TPK_F32, TPK_BF16, TPK_I32, TPK_F64};
    for (int d = 0; d < 4; d++) {
        tpk_dtype dt = all[d];
        TEST_CASE("gather_rows [%s]: y[i] = x[idx[i]] bytes exactly (repeats), zeros for -1 and "
                  "out of range, the padding kept",
                  tpk_dtype_name(dt)) {
            enum { XR = 11, ROWS = 14, C = 13, LDX = 16, LDY = 15 };
            const int32_t idx[ROWS] = {3, -1, 0, 10, 3, 11, 7, INT32_MIN, 3, 2, 1000, 9, 5, 0};
            size_t es = tpk_dtype_size(dt);
            unsigned char *x = malloc(XR * LDX * es), *y = malloc(ROWS * LDY * es);
            for (size_t b = 0; b < XR * LDX * es; b++) x[b] = (unsigned char)(b * 131 + 7);
            memset(y, 0xa5, ROWS * LDY * es);
            CHECK_OK(&ctx, tpk_op_gather_rows(&ctx, y, LDY, x, LDX, XR, idx, ROWS, C, dt));
            size_t bad = 0, pad = 0;
            for (int i = 0; i < ROWS; i++) {
                const unsigned char *yi = y + (size_t)i * LDY * es;
                bool in = idx[i] >= 0 && idx[i] < XR;
                for (size_t b = 0; b < C * es; b++)
                    bad += yi[b] != (in ? x[(size_t)idx[i] * LDX * es + b] : 0);
                for (size_t b = C * es; b < LDY * es; b++) pad += yi[b] != 0xa5;
            }
            CHECK(bad == 0, "%zu bytes are not the indexed row (or zero)", bad);
            CHECK(pad == 0, "%zu padding bytes written", pad);
            /* no rows in x: every row zeros, x not read */
            memset(y, 0xa5, ROWS * LDY * es);
            CHECK_OK(&ctx, tpk_op_gather_rows(&ctx, y, LDY, NULL, LDX, 0, idx, ROWS, C, dt));
            bad = 0;
            for (int i = 0; i < ROWS; i++)
                for (size_t b = 0; b < C * es; b++) bad += y[(size_t)i * LDY * es + b] != 0;
            CHECK(bad == 0, "xrows = 0: %zu nonzero bytes", bad);
            CHECK_OK(&ctx, tpk_op_gather_rows(&ctx, NULL, LDY, NULL, LDX, XR, NULL, 0, C, dt));
            free(x), free(y);
        }
    }
}

/* ---- scatter_add_rows ------------------------------------------------------------------------ */

/* The contract in f32, element by element: row r of y (ly columns apart) from y0 (accumulate) or
 * the first row naming it, the next ones added in index order, rounded once; zeros where none */
static void ref_scatter(tpk_dtype dt, float *y, int64_t ldy, int64_t yrows, const float *y0,
                        const float *x, int64_t ldx, const int32_t *idx, int64_t rows, int64_t cols,
                        bool acc, double *yd) {
    for (int64_t r = 0; r < yrows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float v = acc ? y0[r * ldy + c] : 0.0f;
            double s = acc ? y0[r * ldy + c] : 0.0;
            bool any = false;
            for (int64_t i = 0; i < rows; i++) {
                if (idx[i] != r) continue;
                float t = x[i * ldx + c];
                v = !any && !acc ? t : v + t;
                s += t, any = true;
            }
            y[r * ldy + c] = !any && acc ? y0[r * ldy + c] : rnd(dt, v);
            yd[r * cols + c] = s;
        }
}

static void test_scatter(void) {
    const tpk_dtype dts[2] = {TPK_F32, TPK_BF16};
    for (int d = 0; d < 2; d++) {
        tpk_dtype dt = dts[d];
        TEST_CASE("scatter_add_rows [%s]: a destination's rows summed in index order (repeats, "
                  "-1, out of range), zeros where none, accumulate, padding kept, permutations",
                  tpk_dtype_name(dt)) {
            enum { YR = 9, ROWS = 23, C = 21, LDX = 24, LDY = 22 };
            int32_t idx[ROWS];
            for (int i = 0; i < ROWS; i++) idx[i] = (int32_t)((i * 5 + 2) % 13) - 1; /* -1..11 */
            idx[4] = INT32_MAX, idx[9] = INT32_MIN; /* rows 0 and 7 (idx 0 and 7) named by none */
            for (int i = 0; i < ROWS; i++)
                if (idx[i] == 0 || idx[i] == 7) idx[i] = 3;
            float *x = rand_dt(ROWS * LDX, 1, dt), *y0 = rand_dt(YR * LDY, 2, dt);
            float *want = fbuf(YR * LDY), *got = fbuf(YR * LDY), *nan = fbuf(YR * LDY);
            double *wd = dbuf(YR * C);
            void *xr = malloc(ROWS * LDX * 4), *yr = malloc(YR * LDY * 4);
            store(xr, dt, x, ROWS * LDX);
            for (int acc = 0; acc < 2; acc++) {
                if (acc) store(yr, dt, y0, YR * LDY);
                else memset(yr, 0xff, YR * LDY * 4), load(nan, dt, yr, YR * LDY); /* poison */
                const float *before = acc ? y0 : nan;
                CHECK_OK(&ctx, tpk_op_scatter_add_rows(&ctx, yr, LDY, YR, xr, LDX, idx, ROWS, C, dt,
                                                       acc));
                load(got, dt, yr, YR * LDY);
                memcpy(want, before, YR * LDY * sizeof(float)); /* the padding: as it was */
                ref_scatter(dt, want, LDY, YR, before, x, LDX, idx, ROWS, C, acc, wd);
                size_t diff = 0;
                for (int r = 0; r < YR; r++) diff += bitdiff(got + r * LDY, want + r * LDY, LDY);
                CHECK(diff == 0,
                      "accumulate %d: %zu elements differ from the f32 sums in index "
                      "order (or the padding moved)",
                      acc, diff);
                float *g = fbuf(YR * C), *w = fbuf(YR * C);
                for (int r = 0; r < YR; r++)
                    for (int c = 0; c < C; c++) g[r * C + c] = got[r * LDY + c];
                d2f(w, wd, YR * C);
                CHECK_CLOSE(g, w, YR * C, dt == TPK_F32 ? TOL_F32 : TOL_BF16,
                            acc ? "scatter_add_rows accumulate vs double"
                                : "scatter_add_rows vs double");
                free(g), free(w);
            }
            /* a permutation of the rows: each destination named once, the rows copied exactly */
            int32_t perm[YR];
            for (int i = 0; i < YR; i++) perm[i] = (int32_t)((i * 4 + 3) % YR);
            memset(yr, 0xff, YR * LDY * 4);
            CHECK_OK(&ctx,
                     tpk_op_scatter_add_rows(&ctx, yr, LDY, YR, xr, LDX, perm, YR, C, dt, false));
            load(got, dt, yr, YR * LDY);
            size_t diff = 0;
            for (int i = 0; i < YR; i++) diff += bitdiff(got + perm[i] * LDY, x + i * LDX, C);
            CHECK(diff == 0, "a permutation: %zu elements are not the rows copied", diff);
            /* nothing to add: zeros, or (accumulate) not called at all */
            memset(yr, 0xff, YR * LDY * 4);
            CHECK_OK(&ctx,
                     tpk_op_scatter_add_rows(&ctx, yr, LDY, YR, NULL, LDX, NULL, 0, C, dt, false));
            load(got, dt, yr, YR * LDY);
            size_t nz = 0;
            for (int r = 0; r < YR; r++)
                for (int c = 0; c < C; c++) nz += got[r * LDY + c] != 0.0f;
            CHECK(nz == 0, "no rows: %zu elements not zero", nz);
            CHECK_OK(&ctx,
                     tpk_op_scatter_add_rows(&ctx, yr, LDY, YR, NULL, LDX, NULL, 0, C, dt, true));
            load(want, dt, yr, YR * LDY);
            CHECK(bitdiff(got, want, YR * LDY) == 0, "accumulate of no rows changed y");
            free(x), free(y0), free(want), free(got), free(nan), free(wd), free(xr), free(yr);
        }
    }
}

/* ---- moe_combine_fwd, moe_combine_bwd -------------------------------------------------------- */

enum { T = 10, K = 3, H = 37, OR = 31 }; /* H: four vectors of 8 and a tail of 5; OR prime */

/* the entries: row[t K + i], distinct kept rows (the dispatcher's slots: 7 e + 3 mod 31) with
 * some dropped (-1, out of range); token 6 keeps none, token 8 one; with repeat a row named by
 * three entries */
static void combine_rows(int32_t *row, bool repeat) {
    for (int e = 0; e < T * K; e++) row[e] = (int32_t)((e * 7 + 3) % OR);
    row[2] = -1, row[10] = OR, row[13] = INT32_MIN;
    row[18] = row[19] = row[20] = -1;                /* token 6 */
    row[24] = -1, row[26] = -1;                      /* token 8: i = 1 kept */
    if (repeat) row[5] = row[11], row[29] = row[11]; /* a row named three times (the adjoint) */
}
static bool kept(int32_t r) { return r >= 0 && r < OR; }

static void test_combine(void) {
    const tpk_dtype dts[2] = {TPK_F32, TPK_BF16};
    for (int d = 0; d < 2; d++) {
        tpk_dtype dt = dts[d];
        TEST_CASE("moe_combine_fwd/bwd [%s]: y the kept rows weighted (i order, rounded once), "
                  "dw = dy . o-row, dout's terms in entry order; dropped entries and tokens",
                  tpk_dtype_name(dt)) {
            int32_t row[T * K];
            float w[T * K];
            test_randn(w, T * K, 30, 1.0f);
            float *o = rand_dt(OR * H, 31, dt), *dy = rand_dt(T * H, 32, dt);
            void *or_ = malloc(OR * H * 4), *dyr = malloc(T * H * 4);
            store(or_, dt, o, OR * H), store(dyr, dt, dy, T * H);
            for (int rep = 0; rep < 2; rep++) {
                combine_rows(row, rep);
                /* forward */
                void *yr = poisoned(T * H, dt);
                CHECK_OK(&ctx, tpk_op_moe_combine_fwd(&ctx, yr, or_, OR, row, w, T, K, H, dt));
                float *got = fbuf(T * H), *want = fbuf(T * H), *wd = fbuf(T * H);
                load(got, dt, yr, T * H);
                for (int t = 0; t < T; t++)
                    for (int c = 0; c < H; c++) {
                        float v = 0.0f;
                        double s = 0;
                        bool first = true;
                        for (int i = 0; i < K; i++) {
                            int32_t r = row[t * K + i];
                            if (!kept(r)) continue;
                            float p = o[r * H + c] * w[t * K + i];
                            v = first ? p : v + p, first = false;
                            s += (double)o[r * H + c] * w[t * K + i];
                        }
                        want[t * H + c] = rnd(dt, v), wd[t * H + c] = (float)s;
                    }
                CHECK(bitdiff(got, want, T * H) == 0,
                      "y: %zu elements differ from the f32 sum in i order",
                      bitdiff(got, want, T * H));
                CHECK_CLOSE(got, wd, T * H, dt == TPK_F32 ? TOL_F32 : TOL_BF16, "y vs double");
                size_t nz = 0;
                for (int c = 0; c < H; c++) nz += got[6 * H + c] != 0.0f;
                CHECK(nz == 0, "token 6 (every entry dropped): %zu elements not zero", nz);
                /* backward */
                float *dw = fbuf(T * K), *dwd = fbuf(T * K);
                void *dor = poisoned(OR * H, dt);
                test_poison(dw, T * K);
                CHECK_OK(&ctx,
                         tpk_op_moe_combine_bwd(&ctx, dw, dor, dyr, or_, OR, row, w, T, K, H, dt));
                for (int e = 0; e < T * K; e++) {
                    double s = 0;
                    for (int c = 0; c < H && kept(row[e]); c++)
                        s += (double)dy[(e / K) * H + c] * o[row[e] * H + c];
                    dwd[e] = (float)s;
                }
                CHECK_CLOSE(dw, dwd, T * K, TOL_F32, "dw vs double (f32 sums)");
                size_t dz = 0;
                for (int e = 0; e < T * K; e++) dz += !kept(row[e]) && dw[e] != 0.0f;
                CHECK(dz == 0, "%zu dropped entries' dw not 0", dz);
                float *gdo = fbuf(OR * H), *wdo = fbuf(OR * H), *ddo = fbuf(OR * H);
                load(gdo, dt, dor, OR * H);
                for (int r = 0; r < OR; r++)
                    for (int c = 0; c < H; c++) {
                        float v = 0.0f;
                        double s = 0;
                        bool first = true;
                        for (int e = 0; e < T * K; e++) {
                            if (row[e] != r) continue;
                            float p = dy[(e / K) * H + c] * w[e];
                            v = first ? p : v + p, first = false;
                            s += (double)dy[(e / K) * H + c] * w[e];
                        }
                        wdo[r * H + c] = rnd(dt, v), ddo[r * H + c] = (float)s;
                    }
                CHECK(bitdiff(gdo, wdo, OR * H) == 0,
                      "dout: %zu elements differ from the terms summed in entry order",
                      bitdiff(gdo, wdo, OR * H));
                CHECK_CLOSE(gdo, ddo, OR * H, dt == TPK_F32 ? TOL_F32 : TOL_BF16, "dout vs double");
                free(yr), free(got), free(want), free(wd), free(dw), free(dwd), free(dor);
                free(gdo), free(wdo), free(ddo);
            }
            /* nothing: T = 0 writes dout's zeros; no rows in o: y zeros */
            void *dor = poisoned(OR * H, dt);
            CHECK_OK(&ctx, tpk_op_moe_combine_bwd(&ctx, NULL, dor, NULL, or_, OR, NULL, NULL, 0, K,
                                                  H, dt));
            float *g = fbuf(OR * H);
            load(g, dt, dor, OR * H);
            size_t nz = 0;
            for (int k = 0; k < OR * H; k++) nz += g[k] != 0.0f;
            CHECK(nz == 0, "T = 0: %zu elements of dout not zero", nz);
            void *yr = poisoned(T * H, dt);
            CHECK_OK(&ctx, tpk_op_moe_combine_fwd(&ctx, yr, NULL, 0, row, w, T, K, H, dt));
            load(g, dt, yr, T * H);
            nz = 0;
            for (int k = 0; k < T * H; k++) nz += g[k] != 0.0f;
            CHECK(nz == 0, "orows = 0: %zu elements of y not zero", nz);
            free(o), free(dy), free(or_), free(dyr), free(dor), free(g), free(yr);
        }
    }
}

/* The dispatcher's former per-row loop (tpk/layers/moe.h before these ops): y[t] by one axpby per
 * kept entry (b = 0 first), dout[r] = axpby(w, dy[t], 0), dx[t] by axpby(1, row, 1) in i order.
 * The ops give its bits in f32 (k = 2 for the sum of a token's rows, whose order the scatter takes
 * by destination in index order: two terms commute). */
static void test_former_loop(void) {
    TEST_CASE("moe_combine_fwd/bwd and scatter_add_rows: the former per-row axpby loop's bits "
              "(f32)") {
        const tpk_dtype dt = TPK_F32;
        int32_t row[T * K];
        combine_rows(row, false);
        float w[T * K], *o = rand_dt(OR * H, 40, dt), *dy = rand_dt(T * H, 41, dt);
        test_randn(w, T * K, 42, 1.0f);
        float *y = fbuf(T * H), *yl = fbuf(T * H), *dout = fbuf(OR * H), *dl = fbuf(OR * H),
              *dw = fbuf(T * K);
        test_poison(dout, OR * H), test_poison(dl, OR * H);
        CHECK_OK(&ctx, tpk_op_moe_combine_fwd(&ctx, y, o, OR, row, w, T, K, H, dt));
        CHECK_OK(&ctx, tpk_op_moe_combine_bwd(&ctx, dw, dout, dy, o, OR, row, w, T, K, H, dt));
        for (int t = 0; t < T; t++) {
            int n = 0;
            for (int i = 0; i < K; i++) {
                int32_t r = row[t * K + i];
                if (!kept(r)) continue;
                CHECK_OK(&ctx, tpk_op_axpby(&ctx, yl + t * H, w[t * K + i], o + r * H,
                                            n++ ? 1.0f : 0.0f, dt, H));
                CHECK_OK(&ctx,
                         tpk_op_axpby(&ctx, dl + r * H, w[t * K + i], dy + t * H, 0.0f, dt, H));
            }
            if (!n) CHECK_OK(&ctx, tpk_op_fill(&ctx, yl + t * H, dt, H, 0.0f));
        }
        for (int r = 0; r < OR; r++) /* rows no entry names: the op writes zeros there */
            if (isnan(dl[r * H])) memset(dl + r * H, 0, H * sizeof(float));
        CHECK(bitdiff(y, yl, T * H) == 0, "y: %zu elements differ from the axpby loop's",
              bitdiff(y, yl, T * H));
        CHECK(bitdiff(dout, dl, OR * H) == 0, "dout: %zu elements differ from the axpby loop's",
              bitdiff(dout, dl, OR * H));
        /* the dispatch's backward at k = 2: dx[t] = rows s(t, 0) + s(t, 1) of dxs, src[s] = t */
        enum { TT = 9, KK = 2 };
        int32_t src[TT * KK];
        for (int s = 0; s < TT * KK; s++) src[s] = (int32_t)((s * 5 + 1) % TT); /* each t twice */
        float *dxs = rand_dt(TT * KK * H, 43, dt), *dx = fbuf(TT * H), *dxl = fbuf(TT * H);
        test_poison(dx, TT * H);
        CHECK_OK(&ctx,
                 tpk_op_scatter_add_rows(&ctx, dx, H, TT, dxs, H, src, TT * KK, H, dt, false));
        for (int t = 0; t < TT; t++) { /* the former loop: its rows in the reverse order */
            int n = 0;
            for (int s = TT * KK - 1; s >= 0; s--)
                if (src[s] == t)
                    CHECK_OK(&ctx, tpk_op_axpby(&ctx, dxl + t * H, 1.0f, dxs + s * H,
                                                n++ ? 1.0f : 0.0f, dt, H));
        }
        CHECK(bitdiff(dx, dxl, TT * H) == 0, "dx: %zu elements differ from the axpby loop's",
              bitdiff(dx, dxl, TT * H));
        free(o), free(dy), free(y), free(yl), free(dout), free(dl), free(dw), free(dxs), free(dx),
            free(dxl);
    }
}

/* ---- bad arguments --------------------------------------------------------------------------- */

static void test_bad(void) {
    TEST_CASE("gather_rows, scatter_add_rows, moe_combine_fwd/bwd: bad arguments fail naming them; "
              "a table without the entry fails naming it") {
        float a[64] = {0}, b[64] = {0}, dw[8];
        int32_t idx[4] = {0, 1, -1, 2};
        CHECK_FAILS(&ctx, tpk_op_gather_rows(&ctx, a, 4, b, 4, 4, idx, 4, 4, (tpk_dtype)7),
                    TPK_ERR_DTYPE, "tpk_op_gather_rows: dt: expected f32, bf16, i32 or f64");
        CHECK_FAILS(&ctx, tpk_op_gather_rows(&ctx, a, 4, b, 4, 4, idx, -1, 4, TPK_F32), TPK_ERR_ARG,
                    "rows: expected >= 0, got -1");
        CHECK_FAILS(&ctx, tpk_op_gather_rows(&ctx, a, 4, b, 4, -2, idx, 4, 4, TPK_F32), TPK_ERR_ARG,
                    "xrows: expected >= 0, got -2");
        CHECK_FAILS(&ctx, tpk_op_gather_rows(&ctx, a, 4, b, 4, 4, idx, 4, -4, TPK_F32), TPK_ERR_ARG,
                    "cols: expected >= 0, got -4");
        CHECK_FAILS(&ctx, tpk_op_gather_rows(&ctx, a, 3, b, 4, 4, idx, 4, 4, TPK_F32), TPK_ERR_ARG,
                    "ldy: expected >= 4, got 3");
        CHECK_FAILS(&ctx, tpk_op_gather_rows(&ctx, a, 4, b, 2, 4, idx, 4, 4, TPK_F32), TPK_ERR_ARG,
                    "ldx: expected >= 4, got 2");
        CHECK_FAILS(&ctx, tpk_op_gather_rows(&ctx, NULL, 4, b, 4, 4, idx, 4, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gather_rows: y: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_gather_rows(&ctx, a, 4, NULL, 4, 4, idx, 4, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gather_rows: x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_gather_rows(&ctx, a, 4, b, 4, 4, NULL, 4, 4, TPK_F32), TPK_ERR_ARG,
                    "tpk_op_gather_rows: idx: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_scatter_add_rows(&ctx, a, 4, 4, b, 4, idx, 4, 4, TPK_I32, false),
                    TPK_ERR_DTYPE, "tpk_op_scatter_add_rows: dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx, tpk_op_scatter_add_rows(&ctx, a, 4, -1, b, 4, idx, 4, 4, TPK_F32, false),
                    TPK_ERR_ARG, "yrows: expected >= 0, got -1");
        CHECK_FAILS(&ctx, tpk_op_scatter_add_rows(&ctx, a, 4, 4, b, 4, idx, -3, 4, TPK_F32, false),
                    TPK_ERR_ARG, "tpk_op_scatter_add_rows: rows: expected >= 0, got -3");
        CHECK_FAILS(&ctx, tpk_op_scatter_add_rows(&ctx, a, 2, 4, b, 4, idx, 4, 4, TPK_F32, true),
                    TPK_ERR_ARG, "ldy: expected >= 4, got 2");
        CHECK_FAILS(&ctx, tpk_op_scatter_add_rows(&ctx, NULL, 4, 4, b, 4, idx, 4, 4, TPK_F32, true),
                    TPK_ERR_ARG, "tpk_op_scatter_add_rows: y: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_scatter_add_rows(&ctx, a, 4, 4, NULL, 4, idx, 4, 4, TPK_F32, true),
                    TPK_ERR_ARG, "tpk_op_scatter_add_rows: x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_scatter_add_rows(&ctx, a, 4, 4, b, 4, NULL, 4, 4, TPK_F32, true),
                    TPK_ERR_ARG, "tpk_op_scatter_add_rows: idx: expected a buffer");
        float w[8] = {0};
        CHECK_FAILS(&ctx, tpk_op_moe_combine_fwd(&ctx, a, b, 4, idx, w, 2, 0, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_moe_combine_fwd: K: expected >= 1, got 0");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_fwd(&ctx, a, b, 4, idx, w, -2, 2, 4, TPK_F32),
                    TPK_ERR_ARG, "T: expected >= 0, got -2");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_fwd(&ctx, a, b, -4, idx, w, 2, 2, 4, TPK_F32),
                    TPK_ERR_ARG, "orows: expected >= 0, got -4");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_fwd(&ctx, a, b, 4, idx, w, 2, 2, 4, TPK_F64),
                    TPK_ERR_DTYPE, "tpk_op_moe_combine_fwd: dt: expected f32 or bf16, got f64");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_fwd(&ctx, a, b, 4, NULL, w, 2, 2, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_moe_combine_fwd: row: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_fwd(&ctx, a, b, 4, idx, NULL, 2, 2, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_moe_combine_fwd: w: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_fwd(&ctx, a, NULL, 4, idx, w, 2, 2, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_moe_combine_fwd: o: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_fwd(&ctx, NULL, b, 4, idx, w, 2, 2, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_moe_combine_fwd: y: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_bwd(&ctx, NULL, a, b, b, 4, idx, w, 2, 2, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_moe_combine_bwd: dw: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_bwd(&ctx, dw, NULL, b, b, 4, idx, w, 2, 2, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_moe_combine_bwd: dout: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_bwd(&ctx, dw, a, NULL, b, 4, idx, w, 2, 2, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_moe_combine_bwd: dy: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_moe_combine_bwd(&ctx, dw, a, b, b, 4, idx, w, 2, 2, -1, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_moe_combine_bwd: H: expected >= 0, got -1");
        /* a user's table without the entries: a call fails naming the entry */
        static tpk_ops t;
        t = *tpk_ops_host();
        t.name = "no rows", t.gather_rows = NULL, t.moe_combine_bwd = NULL;
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &t}));
        CHECK_FAILS(&c, tpk_op_gather_rows(&c, a, 4, b, 4, 4, idx, 4, 4, TPK_F32),
                    TPK_ERR_UNSUPPORTED, "the backend \"no rows\" has no gather_rows entry");
        CHECK_FAILS(&c, tpk_op_moe_combine_bwd(&c, dw, a, b, b, 4, idx, w, 2, 2, 4, TPK_F32),
                    TPK_ERR_UNSUPPORTED, "has no moe_combine_bwd entry");
        tpk_ctx_destroy(&c);
    }
}

OPS_TEST_MAIN(test_gather, test_scatter, test_combine, test_former_loop, test_bad)
