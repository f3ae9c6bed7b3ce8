/* bench/gemm.c — the sharded GEMMs of a tensor-parallel transformer layer, per rank.
 *
 * For a model shape (H hidden, F = 4H feed-forward, T tokens per rank) and t in {1, 2, 4, 8},
 * rank 0 holds F_r = split(F, t, 0) output features of the column linear (W [F_r, H]) and input
 * features of the row linear (W [H, F_r]). Its six GEMMs (m x n x k, 2 m n k flops):
 *   column fwd    y[T, F_r]  = x[T, H] W^T          m=T   n=F_r k=H
 *   column dgrad  dx[T, H]   = dy[T, F_r] W          m=T   n=H   k=F_r
 *   column wgrad  dW[F_r, H] = dy^T x               m=F_r n=H   k=T
 *   row fwd       y[T, H]    = x[T, F_r] W^T        m=T   n=H   k=F_r
 *   row dgrad     dx[T, F_r] = dy[T, H] W           m=T   n=F_r k=H
 *   row wgrad     dW[H, F_r] = dy^T x               m=H   n=F_r k=T
 * and the vocabulary-parallel LM head (V entries padded as the models pad them, tpk_vocab_padded
 * with 64 rows per shard: V_r = Vp / t; and, to show what the padding buys, unpadded
 * V_r = split(V, t, 0)):
 *   lm fwd        z[T, V_r]  = x[T, H] E^T          m=T   n=V_r k=H
 *   lm dgrad      dx[T, H]   = dz[T, V_r] E         m=T   n=H   k=V_r
 *   lm wgrad      dE[V_r, H] = dz^T x               m=V_r n=H   k=T
 * Each is timed through tpk_op_gemm (the checked front end, as a layer calls it; a weight gradient
 * in bf16 through tpk_op_gemm_acc into an f32 C with beta = 1, as tpk__grad_gemm does) after a
 * warm-up, rotating over buffer sets larger than the L2 cache, and reported as TFLOP/s (GFLOP/s on
 * the host), % of the measured peak (a large square GEMM, its fastest call) and the ratio to a
 * plain GEMM of the same shape in the same process (cuBLASLt on packed operands on the GPU,
 * cblas_sgemm on the host). Median of the timed calls; CUDA events on the GPU, the monotonic clock
 * on the host.
 *
 * With --experts E (a mixture of experts' local experts, instead of the table above): the three
 * GEMMs of the experts' first linear over T rows split among E experts (W_g [F, H] each), as one
 * tpk_op_gemm_grouped call against one tpk_op_gemm of the same T rows and one W (the dense layer
 * of the same flops), with the rows split evenly (T / E each) and skewed (expert g's share
 * proportional to g + 1, rounded down, the rest to the last):
 *   grouped fwd    y_g = x_g W_g^T       [T_g, F] per expert; one GEMM m=T n=F k=H
 *   grouped dgrad  dx_g = dy_g W_g       [T_g, H];            one GEMM m=T n=H k=F
 *   grouped wgrad  dW_g += dy_g^T x_g    [F, H] f32;          one GEMM m=F n=H k=T
 * and the path each grouped form took ("path": "launch", the CUDA backend's one
 * cublasGemmGroupedBatchedEx launch, or "loop": a GEMM per expert — the host's, and the CUDA
 * backend's for bf16's wgrad into f32, which cuBLAS's grouped GEMM does not take).
 *
 * With --fp8 (an FP8 linear's GEMMs, tpk/layers/linear.h, instead of the table above; t = 1):
 * tpk_op_gemm_fp8 on codes against tpk_op_gemm (tpk_op_gemm_acc for the weight gradient) in bf16
 * of the same shape in the same process, for the column and row linears and a square P^3 GEMM:
 *   fwd    y = qx qw^T      E4M3 x E4M3, a bf16 C        (cuBLASLt's FP8 layout, TN)
 *   dgrad  dx = qdy qw      E5M2 x E4M3, a bf16 C        (qw transposed into scratch first)
 *   wgrad  dW += qdy^T qx   E5M2 x E4M3, an f32 C, beta 1 (both transposed first)
 * The casts (fp8_quant) are not in the time: they are fused into a layer's neighbouring pass or
 * amortised (the weight's codes once per step); ratio = FP8's rate over bf16's.
 *
 *   gemm [--H 768] [--F 4H] [--tokens T] [--vocab 50257] [--dtype f32|bf16] [--t 1,2,4,8]
 *        [--iters N] [--peak P] [--experts E] [--fp8] [--host] [--tf32] [--json]
 * --peak: the size of the square GEMM that measures the peak (8192 on the GPU, 2048 on the host).
 * The CUDA backend is used when the program was built with it (-DTPK_WITH_CUDA) and a device is
 * present, unless --host. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <cblas.h>
#include <time.h>

#include <tpk/tpk.h>
#ifdef TPK_WITH_CUDA
#include <tpk/runtime/cuda.h>
#endif

static tpk_ctx ctx;
static bool gpu;

#define TRY(call)                                                                                  \
    do {                                                                                           \
        tpk_status s__ = (call);                                                                   \
        if (s__ != TPK_OK) {                                                                       \
            fprintf(stderr, "bench/gemm: %s: %s\n", #call, tpk_last_error(&ctx));                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* one timed call: fn(arg, set) on buffer set `set` */
typedef void (*call_fn)(void *arg, int set);

static bool take_min; /* the peak: the fastest call, not the median */

/* median milliseconds of `iters` calls after `warm` warm-up calls, rotating over `sets` */
static double time_median(call_fn f, void *arg, int sets, int warm, int iters) {
    for (int i = 0; i < warm; i++) f(arg, i % sets);
    double *ms = malloc(sizeof(double) * (size_t)iters);
#ifdef TPK_WITH_CUDA
    void *e0 = gpu ? tpk_cuda_event_new() : NULL, *e1 = gpu ? tpk_cuda_event_new() : NULL;
#endif
    TRY(tpk_op_sync(&ctx));
    for (int i = 0; i < iters; i++) {
#ifdef TPK_WITH_CUDA
        if (gpu) {
            tpk_cuda_event_record(e0);
            f(arg, i % sets);
            tpk_cuda_event_record(e1);
            ms[i] = tpk_cuda_event_ms(e0, e1);
            continue;
        }
#endif
        double t0 = now_ms();
        f(arg, i % sets);
        ms[i] = now_ms() - t0;
    }
#ifdef TPK_WITH_CUDA
    if (gpu) tpk_cuda_event_free(e0), tpk_cuda_event_free(e1);
#endif
    qsort(ms, (size_t)iters, sizeof(double), cmp_double);
    double med = take_min ? ms[0] : ms[iters / 2];
    free(ms);
    return med;
}

typedef struct gemm_case {
    bool ta, tb;
    int64_t m, n, k;
    tpk_dtype dt;
    bool acc;            /* a weight gradient: in bf16 added into an f32 C (tpk_op_gemm_acc, beta =
                            1) */
    void **a, **b, **c; /* [sets] each (c f32 when acc) */
    float *fa, *fb, *fc; /* host reference operands (f32) */
} gemm_case;

static void call_tpk(void *arg, int set) {
    gemm_case *g = arg;
    int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
    if (g->acc && g->dt != TPK_F32)
        TRY(tpk_op_gemm_acc(&ctx, g->ta, g->tb, g->m, g->n, g->k, 1.0f, g->a[set], lda, g->b[set],
                            ldb, 1.0f, g->c[set], g->n, g->dt));
    else
        TRY(tpk_op_gemm(&ctx, g->ta, g->tb, g->m, g->n, g->k, 1.0f, g->a[set], lda, g->b[set], ldb,
                        g->acc ? 1.0f : 0.0f, g->c[set], g->n, g->dt));
}
static void call_plain(void *arg, int set) {
    gemm_case *g = arg;
#ifdef TPK_WITH_CUDA
    if (gpu) {
        TRY(tpk_cuda_plain_gemm(&ctx, g->ta, g->tb, g->m, g->n, g->k, g->a[set], g->b[set],
                                g->c[set], g->dt));
        return;
    }
#endif
    /* f32: the very buffers tpk_op_gemm used; bf16: f32 copies (cblas has no bf16) */
    bool f32 = g->dt == TPK_F32;
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                (int)g->m, (int)g->n, (int)g->k, 1.0f, f32 ? (const float *)g->a[set] : g->fa,
                (int)(g->ta ? g->m : g->k), f32 ? (const float *)g->b[set] : g->fb,
                (int)(g->tb ? g->k : g->n), 0.0f, f32 ? (float *)g->c[set] : g->fc, (int)g->n);
}

static void *buf_rand(size_t n, tpk_dtype dt, uint64_t stream) {
    void *p;
    TRY(tpk_op_alloc(&ctx, n * tpk_dtype_size(dt), &p));
    TRY(tpk_op_rng_2d(&ctx, p, dt, 1, (int64_t)n, (int64_t)n, 0, 0, 1, stream, TPK_RNG_NORMAL, 0.0f,
                      1.0f));
    return p;
}

/* --experts: one form of the experts' GEMM (q: 0 fwd, 1 dgrad, 2 wgrad) over E groups of rows,
 * grouped, or (one) as a single GEMM of all T rows against W_0 */
typedef struct grouped_case {
    int q, E;
    bool one;
    int64_t T, H, F;
    const int64_t *rows;
    tpk_dtype dt;
    void *x, *y, **w; /* x [T, q ? F : H], y [T, q ? H : F]; w[E] [F, H] (f32 for wgrad) */
} grouped_case;
static void call_grouped(void *arg, int set) {
    grouped_case *c = arg;
    (void)set;
    int64_t T = c->T, H = c->H, F = c->F;
    tpk_dtype dt = c->dt;
    if (c->q == 0) {
        if (c->one) TRY(tpk_op_gemm(&ctx, false, true, T, F, H, 1.f, c->x, H, c->w[0], H, 0.f,
                                    c->y, F, dt));
        else TRY(tpk_op_gemm_grouped(&ctx, false, true, c->E, c->rows, F, H, 1.f, c->x, H, c->w, H,
                                     dt, 0.f, c->y, F, dt));
    } else if (c->q == 1) {
        if (c->one) TRY(tpk_op_gemm(&ctx, false, false, T, H, F, 1.f, c->x, F, c->w[0], H, 0.f,
                                    c->y, H, dt));
        else TRY(tpk_op_gemm_grouped(&ctx, false, false, c->E, c->rows, H, F, 1.f, c->x, F, c->w, H,
                                     dt, 0.f, c->y, H, dt));
    } else if (c->one) {
        TRY(tpk_op_gemm_acc(&ctx, true, false, F, H, T, 1.f, c->x, F, c->y, H, 1.f, c->w[0], H,
                            dt));
    } else {
        TRY(tpk_op_gemm_grouped(&ctx, true, false, c->E, c->rows, H, F, 1.f, c->x, F, c->w, H,
                                TPK_F32, 1.f, c->y, H, dt));
    }
}
/* the grouped calls the CUDA backend ran as one launch so far (0 on the host: its loop) */
static unsigned long long grouped_launches(void) {
#ifdef TPK_WITH_CUDA
    return tpk_cuda_gemm_grouped_launches();
#else
    return 0;
#endif
}
/* the --experts report: each form, evenly and skewed, grouped against one GEMM; "path": whether the
 * grouped call ran as one launch (the CUDA backend's cublasGemmGroupedBatchedEx) or as a loop */
static void run_experts(int E, int64_t T, int64_t H, int64_t F, tpk_dtype dt, int iters, bool json,
                        double unit, const char *uname) {
    int64_t *rows = calloc((size_t)E, sizeof(int64_t));
    void **w = calloc((size_t)E, sizeof(void *));
    if (!json)
        printf("experts: E=%d, T=%lld rows, each W_g [%lld, %lld]; grouped (one gemm_grouped) "
               "against one gemm of the same rows\n%-14s %-6s %9s %8s  %9s %8s  %6s  %s\n",
               E, (long long)T, (long long)F, (long long)H, "gemm", "rows", "ms", uname, "one ms",
               uname, "ratio", "path");
    else
        printf("{\"backend\": \"%s\", \"dtype\": \"%s\", \"experts\": %d, \"H\": %lld, \"F\": "
               "%lld, \"tokens\": %lld, \"unit\": \"%s\", \"rows\": [",
               ctx.ops->name, tpk_dtype_name(dt), E, (long long)H, (long long)F, (long long)T,
               uname);
    const char *names[3] = {"grouped fwd", "grouped dgrad", "grouped wgrad"};
    int row = 0;
    for (int skew = 0; skew < 2; skew++) {
        int64_t left = T, wsum = (int64_t)E * (E + 1) / 2;
        for (int g = 0; g < E; g++) {
            rows[g] = skew ? T * (g + 1) / wsum : T / E;
            left -= rows[g];
        }
        rows[E - 1] += left;
        for (int q = 0; q < 3; q++) {
            tpk_dtype wdt = q == 2 ? TPK_F32 : dt;
            for (int g = 0; g < E; g++) w[g] = buf_rand((size_t)(F * H), wdt, 100 + g);
            grouped_case c = {q, E, false, T, H, F, rows, dt, buf_rand((size_t)(T * (q ? F : H)),
                              dt, 1), buf_rand((size_t)(T * (q ? H : F)), dt, 2), w};
            unsigned long long l0 = grouped_launches();
            double ms = time_median(call_grouped, &c, 1, 1, iters);
            const char *path = grouped_launches() > l0 ? "launch" : "loop";
            c.one = true;
            double ms1 = time_median(call_grouped, &c, 1, 1, iters);
            double fl = 2.0 * (double)T * (double)H * (double)F, rate = fl / (ms * 1e-3) / unit,
                   rate1 = fl / (ms1 * 1e-3) / unit;
            if (!json)
                printf("%-14s %-6s %9.3f %8.2f  %9.3f %8.2f  %6.2f  %s\n", names[q],
                       skew ? "skewed" : "even", ms, rate, ms1, rate1, ms1 / ms, path);
            else
                printf("%s\n  {\"gemm\": \"%s\", \"rows\": \"%s\", \"ms\": %.4f, \"rate\": %.3f, "
                       "\"one_ms\": %.4f, \"one_rate\": %.3f, \"ratio\": %.3f, \"path\": \"%s\"}",
                       row++ ? "," : "", names[q], skew ? "skewed" : "even", ms, rate, ms1, rate1,
                       ms1 / ms, path);
            tpk_op_free(&ctx, c.x), tpk_op_free(&ctx, c.y);
            for (int g = 0; g < E; g++) tpk_op_free(&ctx, w[g]);
        }
    }
    if (json) printf("\n]}\n");
    free(rows), free(w);
}

/* --fp8: one GEMM of an FP8 linear, on codes (qa, qb) or in bf16 (a, b), [sets] each */
typedef struct fp8_case {
    bool ta, tb, acc;
    int64_t m, n, k;
    tpk_fp8_fmt fa, fb;
    uint8_t **qa, **qb;
    void **a, **b, **c; /* bf16 operands; c f32 when acc, else bf16 */
} fp8_case;
static void call_fp8(void *arg, int set) {
    fp8_case *g = arg;
    int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
    TRY(tpk_op_gemm_fp8(&ctx, g->ta, g->tb, g->m, g->n, g->k, 1e-3f, g->qa[set], g->fa, lda,
                        g->qb[set], g->fb, ldb, g->acc ? 1.0f : 0.0f, g->c[set], g->n,
                        g->acc ? TPK_F32 : TPK_BF16));
}
static void call_bf16(void *arg, int set) {
    fp8_case *g = arg;
    int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
    if (g->acc)
        TRY(tpk_op_gemm_acc(&ctx, g->ta, g->tb, g->m, g->n, g->k, 1e-3f, g->a[set], lda,
                            g->b[set], ldb, 1.0f, g->c[set], g->n, TPK_BF16));
    else
        TRY(tpk_op_gemm(&ctx, g->ta, g->tb, g->m, g->n, g->k, 1e-3f, g->a[set], lda, g->b[set],
                        ldb, 0.0f, g->c[set], g->n, TPK_BF16));
}
static uint8_t *codes_rand(size_t n, tpk_fp8_fmt fmt, uint64_t stream) {
    void *x = buf_rand(n, TPK_BF16, stream);
    void *q;
    TRY(tpk_op_alloc(&ctx, n, &q));
    TRY(tpk_op_fp8_quant(&ctx, q, NULL, x, TPK_BF16, n, 1.0f, fmt, false));
    tpk_op_free(&ctx, x);
    return q;
}
/* one shape: FP8 and bf16, in ms (buffer sets rotated past the L2 cache, as run_case) */
static void run_fp8_case(fp8_case *g, int iters, size_t l2, double *ms_fp8, double *ms_bf16) {
    size_t na = (size_t)(g->m * g->k), nb = (size_t)(g->k * g->n), nc = (size_t)(g->m * g->n);
    size_t set_bytes = (na + nb) * 3 + nc * (g->acc ? 4 : 2);
    int sets = (int)(2 * l2 / set_bytes) + 2;
    if (sets > 8) sets = 8;
    g->qa = calloc((size_t)sets, sizeof(void *)), g->qb = calloc((size_t)sets, sizeof(void *));
    g->a = calloc((size_t)sets, sizeof(void *)), g->b = calloc((size_t)sets, sizeof(void *)),
    g->c = calloc((size_t)sets, sizeof(void *));
    for (int s = 0; s < sets; s++) {
        g->qa[s] = codes_rand(na, g->fa, 5 * s), g->qb[s] = codes_rand(nb, g->fb, 5 * s + 1);
        g->a[s] = buf_rand(na, TPK_BF16, 5 * s + 2), g->b[s] = buf_rand(nb, TPK_BF16, 5 * s + 3);
        g->c[s] = buf_rand(nc, g->acc ? TPK_F32 : TPK_BF16, 5 * s + 4);
    }
    *ms_fp8 = time_median(call_fp8, g, sets, gpu ? 5 : 1, iters);
    *ms_bf16 = time_median(call_bf16, g, sets, gpu ? 5 : 1, iters);
    for (int s = 0; s < sets; s++)
        tpk_op_free(&ctx, g->qa[s]), tpk_op_free(&ctx, g->qb[s]), tpk_op_free(&ctx, g->a[s]),
            tpk_op_free(&ctx, g->b[s]), tpk_op_free(&ctx, g->c[s]);
    free(g->qa), free(g->qb), free(g->a), free(g->b), free(g->c);
}
/* the --fp8 report: the square P^3 GEMM, then the column and row linears' three GEMMs each */
static void run_fp8(int64_t T, int64_t H, int64_t F, int64_t P, int iters, size_t l2, bool json,
                    double unit, const char *uname) {
    struct {
        const char *name;
        bool ta, tb, acc;
        int64_t m, n, k;
        tpk_fp8_fmt fa;
    } g[7] = {{"square", 0, 1, 0, P, P, P, TPK_E4M3},
              {"column fwd", 0, 1, 0, T, F, H, TPK_E4M3},
              {"column dgrad", 0, 0, 0, T, H, F, TPK_E5M2},
              {"column wgrad", 1, 0, 1, F, H, T, TPK_E5M2},
              {"row fwd", 0, 1, 0, T, H, F, TPK_E4M3},
              {"row dgrad", 0, 0, 0, T, F, H, TPK_E5M2},
              {"row wgrad", 1, 0, 1, H, F, T, TPK_E5M2}};
    if (!json) {
        printf("FP8 GEMMs (tpk_op_gemm_fp8) against bf16 (tpk_op_gemm): backend %s, H=%lld F=%lld "
               "tokens=%lld, median of %d\n\n",
               ctx.ops->name, (long long)H, (long long)F, (long long)T, iters);
        printf("%-14s %6s %6s %6s  %-9s  %9s  %8s  %9s  %8s  %6s\n", "gemm", "m", "n", "k",
               "formats", "fp8 ms", uname, "bf16 ms", uname, "ratio");
    } else {
        printf("{\"backend\": \"%s\", \"fp8\": true, \"H\": %lld, \"F\": %lld, \"tokens\": %lld, "
               "\"unit\": \"%s\", \"rows\": [",
               ctx.ops->name, (long long)H, (long long)F, (long long)T, uname);
    }
    for (int q = 0; q < 7; q++) {
        fp8_case c = {g[q].ta, g[q].tb, g[q].acc, g[q].m, g[q].n, g[q].k, g[q].fa, TPK_E4M3,
                      0,       0,       0,        0,      0};
        double ms8, ms16;
        run_fp8_case(&c, q ? iters : 2 * iters, l2, &ms8, &ms16);
        double fl = 2.0 * (double)c.m * (double)c.n * (double)c.k, r8 = fl / (ms8 * 1e-3) / unit,
               r16 = fl / (ms16 * 1e-3) / unit;
        const char *fm = g[q].fa == TPK_E5M2 ? "E5M2xE4M3" : "E4M3xE4M3";
        if (!json)
            printf("%-14s %6lld %6lld %6lld  %-9s  %9.3f  %8.2f  %9.3f  %8.2f  %6.2f\n",
                   g[q].name, (long long)c.m, (long long)c.n, (long long)c.k, fm, ms8, r8, ms16,
                   r16, r8 / r16);
        else
            printf("%s\n  {\"gemm\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
                   "\"formats\": \"%s\", \"ms\": %.4f, \"rate\": %.3f, \"bf16_ms\": %.4f, "
                   "\"bf16_rate\": %.3f, \"ratio\": %.3f}",
                   q ? "," : "", g[q].name, (long long)c.m, (long long)c.n, (long long)c.k, fm,
                   ms8, r8, ms16, r16, r8 / r16);
    }
    if (json) printf("\n]}\n");
}

/* Time one shape: tpk and plain, in ms. */
static void run_case(gemm_case *g, int iters, size_t l2, double *ms_tpk, double *ms_plain) {
    size_t es = tpk_dtype_size(g->dt), na = (size_t)(g->m * g->k), nb = (size_t)(g->k * g->n),
           nc = (size_t)(g->m * g->n);
    size_t set_bytes = (na + nb + nc) * es;
    int sets = (int)(2 * l2 / (set_bytes ? set_bytes : 1)) + 2;
    if (sets > 16) sets = 16;
    g->a = calloc((size_t)sets, sizeof(void *)), g->b = calloc((size_t)sets, sizeof(void *)),
    g->c = calloc((size_t)sets, sizeof(void *));
    tpk_dtype cdt = g->acc ? TPK_F32 : g->dt; /* (the plain GEMM writes its dt into the first half
                                                 of an f32 C) */
    for (int s = 0; s < sets; s++)
        g->a[s] = buf_rand(na, g->dt, 3 * s), g->b[s] = buf_rand(nb, g->dt, 3 * s + 1),
        g->c[s] = buf_rand(nc, cdt, 3 * s + 2);
    g->fa = g->fb = g->fc = NULL;
    if (!gpu) {
        g->fa = malloc(na * 4), g->fb = malloc(nb * 4), g->fc = malloc(nc * 4);
        for (size_t i = 0; i < na; i++) g->fa[i] = (float)(i % 7) * 0.1f;
        for (size_t i = 0; i < nb; i++) g->fb[i] = (float)(i % 5) * 0.1f;
    }
    *ms_tpk = time_median(call_tpk, g, sets, gpu ? 5 : 1, iters);
    *ms_plain = time_median(call_plain, g, gpu || g->dt == TPK_F32 ? sets : 1, gpu ? 5 : 1, iters);
    for (int s = 0; s < sets; s++)
        tpk_op_free(&ctx, g->a[s]), tpk_op_free(&ctx, g->b[s]), tpk_op_free(&ctx, g->c[s]);
    free(g->a), free(g->b), free(g->c), free(g->fa), free(g->fb), free(g->fc);
}

int main(int argc, char **argv) {
    int64_t H = 768, F = 0, T = 0, V = 50257;
    tpk_dtype dt = TPK_F32;
    int ts[8] = {1, 2, 4, 8}, nt = 4, iters = 0;
    int64_t P = 0; /* the peak's square GEMM */
    bool json = false, force_host = false, tf32 = false;
    int experts = 0;
    bool fp8 = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--host")) force_host = true;
        else if (!strcmp(a, "--tf32")) tf32 = true;
        else if (!strcmp(a, "--fp8")) fp8 = true;
        else if (v && !strcmp(a, "--H")) H = atoll(v), i++;
        else if (v && !strcmp(a, "--F")) F = atoll(v), i++;
        else if (v && !strcmp(a, "--tokens")) T = atoll(v), i++;
        else if (v && !strcmp(a, "--vocab")) V = atoll(v), i++;
        else if (v && !strcmp(a, "--iters")) iters = atoi(v), i++;
        else if (v && !strcmp(a, "--peak")) P = atoll(v), i++;
        else if (v && !strcmp(a, "--experts")) experts = atoi(v), i++;
        else if (v && !strcmp(a, "--dtype")) dt = !strcmp(v, "bf16") ? TPK_BF16 : TPK_F32, i++;
        else if (v && !strcmp(a, "--t")) {
            nt = 0;
            for (const char *p = v; *p && nt < 8; p++) {
                ts[nt++] = atoi(p);
                while (p[1] && p[1] != ',') p++;
                if (p[1] == ',') p++;
            }
            i++;
        } else {
            fprintf(
                stderr,
                "usage: %s [--H n] [--F n] [--tokens n] [--vocab V] [--dtype f32|bf16] [--t "
                "1,2,4,8] [--iters n] [--peak P] [--experts E] [--fp8] [--host] [--tf32] "
                "[--json]\n",
                argv[0]);
            return 2;
        }
    }
    const tpk_ops *ops = tpk_ops_host();
#ifdef TPK_WITH_CUDA
    if (!force_host && tpk_cuda_device_count() > 0) ops = tpk_ops_cuda(), gpu = true;
    tpk_cuda_allow_tf32(tf32);
#else
    (void)force_host;
#endif
    if (!F) F = 4 * H;
    if (!T) T = gpu ? 8192 : 1024;
    if (!iters) iters = gpu ? 50 : 3;
    if (!P) P = gpu ? 8192 : 2048;
    if (experts && fp8) {
        fprintf(stderr, "bench/gemm: --experts and --fp8: one at a time\n");
        return 2;
    }
    if (H < 1 || F < 1 || T < 1 || V < 1 || iters < 1 || P < 1 || experts < 0) {
        fprintf(stderr, "bench/gemm: H, F, tokens, vocab, iters and peak must be positive, "
                        "experts >= 0\n");
        return 2;
    }
    if (tpk_ctx_init(&ctx, &(tpk_ctx_desc){.ops = ops}) != TPK_OK) {
        fprintf(stderr, "bench/gemm: %s\n", tpk_last_error(&ctx));
        return 1;
    }
    if (experts) {
        run_experts(experts, T, H, F, dt, iters, json, gpu ? 1e12 : 1e9,
                    gpu ? "TFLOP/s" : "GFLOP/s");
        tpk_ctx_destroy(&ctx);
        return 0;
    }
    size_t l2 = (size_t)32 << 20;
#ifdef TPK_WITH_CUDA
    if (gpu && tpk_cuda_l2_bytes()) l2 = tpk_cuda_l2_bytes();
#endif
    if (fp8) {
        run_fp8(T, H, F, P, iters, l2, json, gpu ? 1e12 : 1e9, gpu ? "TFLOP/s" : "GFLOP/s");
        tpk_ctx_destroy(&ctx);
        return 0;
    }
    /* measured peak: a square GEMM through the plain path */
    gemm_case pk = {false, false, P, P, P, gpu ? dt : TPK_F32, false, 0, 0, 0, 0, 0, 0};
    double pk_tpk, pk_plain;
    take_min = true;
    run_case(&pk, gpu ? 10 : 5, l2, &pk_tpk, &pk_plain);
    take_min = false;
    double unit = gpu ? 1e12 : 1e9; /* TFLOP/s on the GPU, GFLOP/s on the host */
    const char *uname = gpu ? "TFLOP/s" : "GFLOP/s";
    double peak = 2.0 * P * P * P / (pk_plain * 1e-3) / unit;
    if (!json) {
        printf(
            "sharded GEMMs per rank: backend %s, dtype %s%s, H=%lld F=%lld V=%lld tokens=%lld, "
            "median of %d%s\n",
            ops->name, tpk_dtype_name(dt),
            gpu && dt == TPK_F32 ? (tf32 ? " (TF32 allowed)" : " (exact f32)") : "", (long long)H,
            (long long)F, (long long)V, (long long)T, iters,
            dt == TPK_F32 ? "" : "; wgrad: gemm_acc into f32 (plain: a bf16 C)");
        printf("measured peak: %.1f %s (%s %lld^3)\n\n", peak, uname,
               gpu ? "cuBLASLt" : "cblas_sgemm", (long long)P);
        printf("%3s  %-14s %6s %6s %6s  %9s  %8s  %6s  %8s  %6s\n", "t", "gemm", "m", "n", "k",
               "ms", uname, "%peak", "plain", "ratio");
    } else {
        printf(
            "{\"backend\": \"%s\", \"dtype\": \"%s\", \"H\": %lld, \"F\": %lld, \"V\": %lld, "
            "\"tokens\": %lld, \"unit\": \"%s\", \"peak\": %.3f, \"rows\": [",
            ops->name, tpk_dtype_name(dt), (long long)H, (long long)F, (long long)V, (long long)T,
            uname, peak);
    }
    int row = 0;
    for (int ti = 0; ti < nt; ti++) {
        int t = ts[ti];
        if (t < 1) continue;
        int64_t Fr = tpk_split(F, t, 0).size, Vr = tpk_vocab_padded(V, 64, t) / t,
                Vu = tpk_split(V, t, 0).size;
        struct {
            const char *name;
            bool ta, tb;
            int64_t m, n, k;
        } g[12] = {{"column fwd", 0, 1, T, Fr, H},     {"column dgrad", 0, 0, T, H, Fr},
                   {"column wgrad", 1, 0, Fr, H, T},   {"row fwd", 0, 1, T, H, Fr},
                   {"row dgrad", 0, 0, T, Fr, H},      {"row wgrad", 1, 0, H, Fr, T},
                   {"lm fwd", 0, 1, T, Vr, H},         {"lm dgrad", 0, 0, T, H, Vr},
                   {"lm wgrad", 1, 0, Vr, H, T},       {"lm fwd unpad", 0, 1, T, Vu, H},
                   {"lm dgrad unpad", 0, 0, T, H, Vu}, {"lm wgrad unpad", 1, 0, Vu, H, T}};
        for (int q = 0; q < 12; q++) {
            if (q >= 9 && Vu == Vr) continue; /* V already a multiple of 64 t */
            gemm_case c = {g[q].ta, g[q].tb, g[q].m, g[q].n, g[q].k, dt, q % 3 == 2,
                           0,       0,       0,      0,      0,      0};
            double ms, ms_plain;
            run_case(&c, iters, l2, &ms, &ms_plain);
            double fl = 2.0 * (double)c.m * (double)c.n * (double)c.k,
                   rate = fl / (ms * 1e-3) / unit, prate = fl / (ms_plain * 1e-3) / unit;
            if (!json)
                printf("%3d  %-14s %6lld %6lld %6lld  %9.3f  %8.2f  %5.1f%%  %8.2f  %6.2f\n", t,
                       g[q].name, (long long)c.m, (long long)c.n, (long long)c.k, ms, rate,
                       100.0 * rate / peak, prate, rate / prate);
            else
                printf(
                    "%s\n  {\"t\": %d, \"gemm\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
                    "\"ms\": %.4f, \"rate\": %.3f, \"pct_peak\": %.2f, "
                    "\"plain_rate\": %.3f, \"ratio\": %.3f}",
                    row ? "," : "", t, g[q].name, (long long)c.m, (long long)c.n, (long long)c.k,
                    ms, rate, 100.0 * rate / peak, prate, rate / prate);
            row++;
        }
    }
    if (json) printf("\n]}\n");
    tpk_ctx_destroy(&ctx);
    return 0;
}
