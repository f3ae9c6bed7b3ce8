/* kernels/host/elementwise.c — the host backend's elementwise ops, one loop per op for both dtypes
 * (TPK__BY_DTYPE; bf16 widened to f32 on load, rounded to nearest even on store).
 *
 *   fill      x = value
 *   copy2d    rows of cols elements between leading dimensions (bytes: any dtype)
 *   cast      dst = src in another dtype
 *   axpby     y = a x + b y  (b = 0 ignores y, like beta in gemm)
 *   bias_add  y[i, j] += bias[j];  bias_grad: db[j] = sum_i dy[i, j] (+ db[j]), summed in double
 *   act_fwd   GELU-tanh: y = x/2 (1 + tanh(s (x + c x^3))), s = sqrt(2/pi), c = 0.044715;
 *             GELU: y = x Phi(x) = x/2 (1 + erf(x / sqrt 2));  NONE: y = x
 *   act_bwd   GELU-tanh: dx = dy (1/2 (1 + t) + x/2 (1 - t^2) s (1 + 3 c x^2)),
 *             t = tanh(s (x + c x^3));  GELU: dx = dy (Phi(x) + x phi(x))
 *   fp8_quant   q = fp8(x scale) (tpk_f32_to_fp8: nearest even, saturating) and amax = max |x|
 *               in the same pass;  fp8_dequant  y = f32(q) scale_inv
 * Element loops run in 8-lane vectors (vec.h; a tail through the same vector code) over the pool's
 * threads (pool.c); bias_grad splits the columns, each summing its rows in order: every result is
 * the same at any thread count. */
#include <math.h>

#include "vec.h"

enum { GRAIN = 1 << 14 }; /* the fewest elements a thread is given */

/* the arguments of one elementwise op, for its parts */
typedef struct ew_job {
    tpk_dtype dt, sdt; /* the output's dtype; cast: the source's */
    tpk_act act;
    void *y;
    const void *x, *z; /* act_bwd: x the input, z the output's gradient */
    float a, b;
    int64_t cols;
    bool accumulate;
} ew_job;

/* ---- fill, copy2d, cast, axpby --------------------------------------------------------------- */

TPK__HOST_INLINE void fill_range(tpk_dtype dt, const ew_job *j, int64_t lo, int64_t hi) {
    tpk__v8f v = tpk__vsplat(j->a);
    int64_t i = lo;
    for (; i + TPK__VL <= hi; i += TPK__VL) tpk__vst(j->y, dt, (size_t)i, v);
    tpk__vst_n(j->y, dt, (size_t)i, v, hi - i);
}
TPK__HOST_SIMD static void fill_part(void *p, int64_t lo, int64_t hi) {
    const ew_job *j = (const ew_job *)p;
    TPK__BY_DTYPE(j->dt, fill_range, j, lo, hi);
}
static tpk_status host_fill(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value) {
    (void)ctx;
    ew_job j;
    memset(&j, 0, sizeof j);
    j.dt = dt, j.y = x, j.a = value;
    tpk__host_par((int64_t)n, GRAIN, fill_part, &j);
    return TPK_OK;
}

/* Rows are moved as bytes, so every dtype (i32 too) is copied exactly; rows over the threads when
 * no row overlaps another's destination (dst == src or apart), else in order as memmove. */
typedef struct copy_job {
    char *dst;
    const char *src;
    size_t ldd, lds, row;
} copy_job;
static void copy2d_part(void *p, int64_t lo, int64_t hi) {
    const copy_job *c = (const copy_job *)p;
    for (int64_t i = lo; i < hi; i++)
        memmove(c->dst + (size_t)i * c->ldd, c->src + (size_t)i * c->lds, c->row);
}
static tpk_status host_copy2d(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src, int64_t lds,
                              int64_t rows, int64_t cols, tpk_dtype dt) {
    (void)ctx;
    if (rows <= 0 || cols <= 0) return TPK_OK;
    size_t es = tpk_dtype_size(dt);
    copy_job c = {(char *)dst, (const char *)src, (size_t)ldd * es, (size_t)lds * es,
                  (size_t)cols * es};
    size_t span_d = c.ldd * (size_t)(rows - 1) + c.row, span_s = c.lds * (size_t)(rows - 1) + c.row;
    bool apart = c.dst + span_d <= c.src || c.src + span_s <= c.dst;
    tpk__host_par(rows, apart ? 1 + GRAIN / (int64_t)c.row : rows, copy2d_part, &c);
    return TPK_OK;
}

TPK__HOST_INLINE void cast_range(tpk_dtype dt, const ew_job *j, int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + TPK__VL <= hi; i += TPK__VL)
        tpk__vst(j->y, dt, (size_t)i, tpk__vld(j->x, j->sdt, (size_t)i));
    tpk__vst_n(j->y, dt, (size_t)i, tpk__vld_n(j->x, j->sdt, (size_t)i, hi - i), hi - i);
}
TPK__HOST_SIMD static void cast_part(void *p, int64_t lo, int64_t hi) {
    const ew_job *j = (const ew_job *)p;
    TPK__BY_DTYPE(j->dt, cast_range, j, lo, hi);
}
static tpk_status host_cast(tpk_ctx *ctx, void *dst, tpk_dtype dst_dt, const void *src,
                            tpk_dtype src_dt, size_t n) {
    (void)ctx;
    if (n == 0) return TPK_OK;
    if (dst_dt == src_dt) {
        if (dst != src) memmove(dst, src, n * tpk_dtype_size(dst_dt));
        return TPK_OK;
    }
    /* f32 -> bf16 rounds to nearest even; bf16 -> f32 is exact */
    ew_job j;
    memset(&j, 0, sizeof j);
    j.dt = dst_dt, j.sdt = src_dt, j.y = dst, j.x = src;
    tpk__host_par((int64_t)n, GRAIN, cast_part, &j);
    return TPK_OK;
}

/* y = a x + b y; b = 0: y is not read */
TPK__HOST_INLINE tpk__v8f axpby_v(const ew_job *j, tpk__v8f x, tpk__v8f y) {
    return j->b == 0.0f ? x * j->a : x * j->a + y * j->b;
}
TPK__HOST_INLINE void axpby_range(tpk_dtype dt, const ew_job *j, int64_t lo, int64_t hi) {
    int64_t i = lo;
    bool rd = j->b != 0.0f;
    for (; i + TPK__VL <= hi; i += TPK__VL)
        tpk__vst(j->y, dt, (size_t)i,
                 axpby_v(j, tpk__vld(j->x, dt, (size_t)i),
                         rd ? tpk__vld(j->y, dt, (size_t)i) : tpk__vsplat(0.0f)));
    int64_t n = hi - i;
    tpk__vst_n(j->y, dt, (size_t)i,
               axpby_v(j, tpk__vld_n(j->x, dt, (size_t)i, n),
                       rd ? tpk__vld_n(j->y, dt, (size_t)i, n) : tpk__vsplat(0.0f)),
               n);
}
TPK__HOST_SIMD static void axpby_part(void *p, int64_t lo, int64_t hi) {
    const ew_job *j = (const ew_job *)p;
    TPK__BY_DTYPE(j->dt, axpby_range, j, lo, hi);
}
static tpk_status host_axpby(tpk_ctx *ctx, void *y, float a, const void *x, float b, tpk_dtype dt,
                             size_t n) {
    (void)ctx;
    ew_job j;
    memset(&j, 0, sizeof j);
    j.dt = dt, j.y = y, j.x = x, j.a = a, j.b = b;
    tpk__host_par((int64_t)n, GRAIN, axpby_part, &j);
    return TPK_OK;
}

/* ---- bias ------------------------------------------------------------------------------------ */

/* rows [lo, hi) of y [rows, cols] += bias */
TPK__HOST_INLINE void bias_add_rows(tpk_dtype dt, const ew_job *j, int64_t lo, int64_t hi) {
    int64_t C = j->cols, nv = C / TPK__VL * TPK__VL;
    for (int64_t i = lo; i < hi; i++) {
        size_t r = (size_t)(i * C);
        int64_t c = 0;
        for (; c < nv; c += TPK__VL)
            tpk__vst(j->y, dt, r + (size_t)c,
                     tpk__vld(j->y, dt, r + (size_t)c) + tpk__vld(j->x, dt, (size_t)c));
        tpk__vst_n(j->y, dt, r + (size_t)c,
                   tpk__vld_n(j->y, dt, r + (size_t)c, C - c) +
                       tpk__vld_n(j->x, dt, (size_t)c, C - c),
                   C - c);
    }
}
TPK__HOST_SIMD static void bias_add_part(void *p, int64_t lo, int64_t hi) {
    const ew_job *j = (const ew_job *)p;
    TPK__BY_DTYPE(j->dt, bias_add_rows, j, lo, hi);
}
static tpk_status host_bias_add(tpk_ctx *ctx, void *y, const void *bias, int64_t rows, int64_t cols,
                                tpk_dtype dt) {
    (void)ctx;
    if (cols <= 0) return TPK_OK;
    ew_job j;
    memset(&j, 0, sizeof j);
    j.dt = dt, j.y = y, j.x = bias, j.cols = cols;
    tpk__host_par(rows, 1 + GRAIN / cols, bias_add_part, &j);
    return TPK_OK;
}

/* columns [lo, hi) of db: dy's rows summed in double, in row order (a thread owns its columns) */
TPK__HOST_INLINE void bias_grad_cols(tpk_dtype dt, const ew_job *j, int64_t lo, int64_t hi) {
    enum { W = 64 };
    double acc[W];
    int64_t rows = (int64_t)j->a, C = j->cols;
    for (int64_t c0 = lo; c0 < hi; c0 += W) {
        int64_t w = hi - c0 < W ? hi - c0 : W;
        for (int64_t c = 0; c < w; c++)
            acc[c] = j->accumulate ? tpk__ld(j->y, j->sdt, (size_t)(c0 + c)) : 0.0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t c = 0; c < w; c++) acc[c] += tpk__ld(j->x, dt, (size_t)(i * C + c0 + c));
        for (int64_t c = 0; c < w; c++) tpk__st(j->y, j->sdt, (size_t)(c0 + c), (float)acc[c]);
    }
}
TPK__HOST_SIMD static void bias_grad_part(void *p, int64_t lo, int64_t hi) {
    const ew_job *j = (const ew_job *)p;
    TPK__BY_DTYPE(j->dt, bias_grad_cols, j, lo, hi);
}
static tpk_status host_bias_grad(tpk_ctx *ctx, void *db, const void *dy, int64_t rows, int64_t cols,
                                 tpk_dtype dt, tpk_dtype db_dt, bool accumulate) {
    (void)ctx;
    if (cols == 0) return TPK_OK;
    ew_job j;
    memset(&j, 0, sizeof j);
    j.dt = dt, j.sdt = db_dt, j.y = db, j.x = dy, j.a = (float)rows, j.cols = cols,
    j.accumulate = accumulate;
    tpk__host_par(cols, 64, bias_grad_part, &j);
    return TPK_OK;
}

/* ---- activations (tpk_act): one loop per direction, the activation a switch ------------------ */

#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f
#define GELU_RSQRT2 0.7071067811865476f   /* 1 / sqrt(2) */
#define GELU_RSQRT2PI 0.3989422804014327f /* 1 / sqrt(2 pi) */

/* 1/2 (1 + tanh(u)) = sigmoid(2u): one exp, no tanh (exp(-2u) = inf gives 0, not NaN) */
TPK__HOST_INLINE tpk__v8f gelu_sig(tpk__v8f v) {
    return 1.0f / (1.0f + tpk__vexp(-2.0f * GELU_S * (v + GELU_C * v * v * v)));
}
/* Phi(v) = (1 + erf(v / sqrt 2)) / 2, lane by lane (the C library's erff) */
TPK__HOST_INLINE tpk__v8f gelu_phi(tpk__v8f v) {
    for (int k = 0; k < TPK__VL; k++) v[k] = 0.5f * (1.0f + erff(v[k] * GELU_RSQRT2));
    return v;
}

/* act(v) and act'(v); GELU-tanh: 1 - t^2 = 4 sg (1 - sg) */
TPK__HOST_INLINE tpk__v8f act_value(tpk_act act, tpk__v8f v) {
    switch (act) {
        case TPK_ACT_GELU_TANH: return v * gelu_sig(v);
        case TPK_ACT_GELU: return v * gelu_phi(v);
        default: return v;
    }
}
TPK__HOST_INLINE tpk__v8f act_slope(tpk_act act, tpk__v8f v) {
    switch (act) {
        case TPK_ACT_GELU_TANH: {
            tpk__v8f sg = gelu_sig(v);
            return sg + 2.0f * v * sg * (1.0f - sg) * GELU_S * (1.0f + 3.0f * GELU_C * v * v);
        }
        case TPK_ACT_GELU: return gelu_phi(v) + v * GELU_RSQRT2PI * tpk__vexp(-0.5f * v * v);
        default: return tpk__vsplat(1.0f);
    }
}

/* y = act(x); with z (act_bwd): y = z act'(x) (z is read before y is written: y may alias z) */
TPK__HOST_INLINE void act_range(tpk_dtype dt, const ew_job *j, int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + TPK__VL <= hi; i += TPK__VL) {
        tpk__v8f x = tpk__vld(j->x, dt, (size_t)i);
        tpk__vst(j->y, dt, (size_t)i,
                 j->z ? tpk__vld(j->z, dt, (size_t)i) * act_slope(j->act, x)
                      : act_value(j->act, x));
    }
    int64_t n = hi - i;
    tpk__v8f x = tpk__vld_n(j->x, dt, (size_t)i, n);
    tpk__vst_n(
        j->y, dt, (size_t)i,
        j->z ? tpk__vld_n(j->z, dt, (size_t)i, n) * act_slope(j->act, x) : act_value(j->act, x), n);
}
TPK__HOST_SIMD static void act_part(void *p, int64_t lo, int64_t hi) {
    const ew_job *j = (const ew_job *)p;
    TPK__BY_DTYPE(j->dt, act_range, j, lo, hi);
}
static tpk_status act_run(tpk_act act, void *y, const void *x, const void *dy, tpk_dtype dt,
                          size_t n) {
    ew_job j;
    memset(&j, 0, sizeof j);
    j.dt = dt, j.act = act, j.y = y, j.x = x, j.z = dy;
    tpk__host_par((int64_t)n, GRAIN / 4, act_part, &j);
    return TPK_OK;
}
/* NONE is a copy (nothing in place) */
static tpk_status host_act_fwd(tpk_ctx *ctx, tpk_act act, void *y, const void *x, tpk_dtype dt,
                               size_t n) {
    (void)ctx;
    if (act == TPK_ACT_NONE) {
        if (y != x) memmove(y, x, n * tpk_dtype_size(dt));
        return TPK_OK;
    }
    return act_run(act, y, x, NULL, dt, n);
}
/* NONE: dx = dy */
static tpk_status host_act_bwd(tpk_ctx *ctx, tpk_act act, void *dx, const void *x, const void *dy,
                               tpk_dtype dt, size_t n) {
    (void)ctx;
    if (act == TPK_ACT_NONE) {
        if (dx != dy) memmove(dx, dy, n * tpk_dtype_size(dt));
        return TPK_OK;
    }
    return act_run(act, dx, x, dy, dt, n);
}

/* ---- FP8: quantize (with the amax in the same pass) and dequantize -------------------------- */

typedef struct fp8_job {
    tpk_dtype dt;
    tpk_fp8_fmt fmt;
    uint8_t *q;
    void *y;
    const void *x;
    float scale;
    float amax[TPK__HOST_MAX_THREADS]; /* each chunk's max |x| */
    int64_t grain, n;
} fp8_job;
TPK__HOST_INLINE void fp8_quant_range(tpk_dtype dt, fp8_job *j, int64_t lo, int64_t hi) {
    float m = 0.0f;
    for (int64_t i = lo; i < hi; i++) {
        float v = tpk__ld(j->x, dt, (size_t)i);
        m = fmaxf(m, fabsf(v)); /* a NaN is ignored (fmaxf), an infinity kept */
        if (j->q) j->q[i] = tpk_f32_to_fp8(v * j->scale, j->fmt);
    }
    j->amax[lo / j->grain] = m;
}
/* chunks [lo, hi) of grain elements each (the last shorter), chunk c's max |x| in amax[c] */
static void fp8_quant_part(void *p, int64_t lo, int64_t hi) {
    fp8_job *j = (fp8_job *)p;
    for (int64_t c = lo; c < hi; c++) {
        int64_t a = c * j->grain, b = a + j->grain < j->n ? a + j->grain : j->n;
        TPK__BY_DTYPE(j->dt, fp8_quant_range, j, a, b);
    }
}
/* n elements in at most TPK__HOST_MAX_THREADS chunks of at least GRAIN: the amax a fixed tree of
 * chunk maxima (a max is exact in any order anyway) */
static tpk_status host_fp8_quant(tpk_ctx *ctx, uint8_t *q, float *amax, const void *x, tpk_dtype dt,
                                 size_t n, float scale, tpk_fp8_fmt fmt, bool accumulate) {
    fp8_job j;
    memset(&j, 0, sizeof j);
    (void)ctx;
    j.dt = dt, j.fmt = fmt, j.q = q, j.x = x, j.scale = scale, j.n = (int64_t)n;
    j.grain = (j.n + TPK__HOST_MAX_THREADS - 1) / TPK__HOST_MAX_THREADS;
    if (j.grain < GRAIN) j.grain = GRAIN;
    int64_t chunks = (j.n + j.grain - 1) / j.grain;
    tpk__host_par(chunks, 1, fp8_quant_part, &j);
    if (amax) {
        float m = accumulate ? *amax : 0.0f;
        for (int64_t c = 0; c < chunks; c++) m = fmaxf(m, j.amax[c]);
        *amax = m;
    }
    return TPK_OK;
}

TPK__HOST_INLINE void fp8_dequant_range(tpk_dtype dt, fp8_job *j, int64_t lo, int64_t hi) {
    float tab[256];
    for (int c = 0; c < 256; c++) tab[c] = tpk_fp8_to_f32((uint8_t)c, j->fmt) * j->scale;
    for (int64_t i = lo; i < hi; i++) tpk__st(j->y, dt, (size_t)i, tab[j->q[i]]);
}
static void fp8_dequant_part(void *p, int64_t lo, int64_t hi) {
    fp8_job *j = (fp8_job *)p;
    TPK__BY_DTYPE(j->dt, fp8_dequant_range, j, lo, hi);
}
static tpk_status host_fp8_dequant(tpk_ctx *ctx, void *y, tpk_dtype dt, const uint8_t *q, size_t n,
                                   float scale_inv, tpk_fp8_fmt fmt) {
    (void)ctx;
    fp8_job j;
    memset(&j, 0, sizeof j);
    j.dt = dt, j.fmt = fmt, j.y = y, j.q = (uint8_t *)q, j.scale = scale_inv;
    tpk__host_par((int64_t)n, GRAIN, fp8_dequant_part, &j);
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_elementwise_ops(tpk_ops *o) {
    o->fill = host_fill;
    o->copy2d = host_copy2d;
    o->cast = host_cast;
    o->axpby = host_axpby;
    o->bias_add = host_bias_add;
    o->bias_grad = host_bias_grad;
    o->act_fwd = host_act_fwd;
    o->act_bwd = host_act_bwd;
    o->fp8_quant = host_fp8_quant;
    o->fp8_dequant = host_fp8_dequant;
}
