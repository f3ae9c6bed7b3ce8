/* tpk/runtime/op.h — the checked front end of the compute backend: one inline entry per op.
 *
 * Layers and users call tpk_op_<name>(ctx, ...) with the arguments of the table entry
 * ctx->ops-><name> (contracts in tpk/base/ops.h). Each entry validates its arguments once, for
 * every backend (a user's own table included), naming the argument and the expected value in the
 * context's error, and then dispatches to the table (a dry run's table, tpk_ops.dry_run, has its
 * compute ops counted by the profiler and none called: TPK__OP_CALL). Backends hold kernels and
 * launchers only. */
#ifndef TPK_OP_H
#define TPK_OP_H

#include <math.h>

#include "backend.h"
#include "profile.h"

/* The first required entry (TPK__OPS_CORE; a dry run's table, tpk_ops.dry_run: TPK__OPS_MEMORY) of
 * a backend table that is NULL ("" for a complete table): tpk_ctx_init refuses an incomplete
 * table, naming the entry. The layer ops
 * (TPK__OPS_LAYERS) may be NULL — calling one fails, naming it (TPK__OP_LAYER) — and so may the
 * fusions (TPK__OPS_FUSED): the front end composes them (tpk__compose_*, tpk/runtime/backend.h). */
static inline const char *tpk__ops_missing(const tpk_ops *ops) {
    if (!ops->name) return "name";
#define TPK__OPS_MISSING(e) \
    if (!ops->e) return #e;
    if (ops->dry_run) { /* a dry run calls its memory entries alone (TPK__OP_CALL) */
        TPK__OPS_MEMORY(TPK__OPS_MISSING)
    } else {
        TPK__OPS_CORE(TPK__OPS_MISSING)
    }
#undef TPK__OPS_MISSING
    return "";
}

/* A layer op (TPK__OPS_LAYERS) the table leaves NULL: a user's table needs the core ops only, and
 * a layer op it lacks fails when called, naming it (tpk__op_no_entry, tpk/runtime/backend.h).
 * TPK__OP_LAYER(e, args...) calls ctx->ops->e or fails so (inside an entry with ctx and fn). */
#define TPK__OP_LAYER(e, ...) \
    (ctx->ops->e ? ctx->ops->e(__VA_ARGS__) : tpk__op_no_entry(ctx, fn, #e))

/* The dispatch of a compute op (every entry but TPK__OPS_MEMORY's) once its arguments are checked:
 * `call` timed when the profiler is on (TPK__PROF_OP); in a dry run (tpk_ops.dry_run) not made —
 * the profiler, the planner's hook, sees the op's name, bytes and flops as in a real run
 * (tpk__prof_dry) and the op returns TPK_OK. A real table pays one branch on its flag. */
#define TPK__OP_CALL(ctx, name, bytes, flops, call)                                       \
    ((ctx)->ops->dry_run ? tpk__prof_dry((ctx), (name), (double)(bytes), (double)(flops)) \
                         : TPK__PROF_OP(ctx, name, bytes, flops, call))

/* ---- argument checks, written once for every backend ----------------------------------------- */

/* a context with a backend (no message can be left without a context) */
static inline tpk_status tpk__op_ctx(tpk_ctx *ctx, const char *fn) {
    if (!ctx) return TPK_ERR_ARG;
    if (ctx->ops) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "ctx->ops: expected a backend table, got NULL");
}
static inline tpk_status tpk__op_float(tpk_ctx *ctx, const char *fn, const char *arg,
                                       tpk_dtype dt) {
    if (dt == TPK_F32 || dt == TPK_BF16) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "%s: expected f32 or bf16, got %s (%d)", arg,
                     tpk_dtype_name(dt), (int)dt);
}
static inline tpk_status tpk__op_any(tpk_ctx *ctx, const char *fn, const char *arg, tpk_dtype dt) {
    if (tpk_dtype_valid(dt)) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "%s: expected f32, bf16, i32 or f64, got %s (%d)", arg,
                     tpk_dtype_name(dt), (int)dt);
}
static inline tpk_status tpk__op_nonneg(tpk_ctx *ctx, const char *fn, const char *arg, int64_t v) {
    if (v >= 0) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected >= 0, got %lld", arg, (long long)v);
}
static inline tpk_status tpk__op_pos(tpk_ctx *ctx, const char *fn, const char *arg, int64_t v) {
    if (v >= 1) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected >= 1, got %lld", arg, (long long)v);
}
/* the context, a compute dtype and two sizes >= 0 (named a and b) */
static inline tpk_status tpk__op_dims(tpk_ctx *ctx, const char *fn, tpk_dtype dt, const char *a,
                                      int64_t va, const char *b, int64_t vb) {
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_nonneg(ctx, fn, a, va));
    return tpk__op_nonneg(ctx, fn, b, vb);
}
/* a buffer that the op touches (needed) must be present */
static inline tpk_status tpk__op_ptr(tpk_ctx *ctx, const char *fn, const char *arg, const void *p,
                                     bool needed) {
    if (p || !needed) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected a buffer, got NULL", arg);
}
/* every buffer of a list, named by a comma-separated list of names */
static inline tpk_status tpk__op_ptrs(tpk_ctx *ctx, const char *fn, const char *names,
                                      const void *const *ps, int n, bool needed) {
    for (int k = 0; k < n; k++, names = strchr(names, ',') ? strchr(names, ',') + 1 : names) {
        if (ps[k] || !needed) continue;
        char arg[32];
        size_t len = strcspn(names, ",");
        snprintf(arg, sizeof arg, "%.*s", (int)(len < sizeof arg ? len : sizeof arg - 1), names);
        return tpk__op_ptr(ctx, fn, arg, NULL, true);
    }
    return TPK_OK;
}
/* leading dimension: ld >= max(1, min) */
static inline tpk_status tpk__op_ld(tpk_ctx *ctx, const char *fn, const char *arg, int64_t ld,
                                    int64_t min) {
    if (min < 1) min = 1;
    if (ld >= min) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected >= %lld, got %lld", arg, (long long)min,
                     (long long)ld);
}
static inline tpk_status tpk__op_prob(tpk_ctx *ctx, const char *fn, float p) {
    if (p >= 0.0f && p < 1.0f) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "p: expected 0 <= p < 1, got %g", (double)p);
}
/* label smoothing: 0 <= eps <= 1 */
static inline tpk_status tpk__op_smoothing(tpk_ctx *ctx, const char *fn, float smoothing) {
    if (smoothing >= 0.0f && smoothing <= 1.0f) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "smoothing: expected 0..1, got %g", (double)smoothing);
}
static inline tpk_status tpk__op_act(tpk_ctx *ctx, const char *fn, tpk_act act) {
    if ((unsigned)act < (unsigned)TPK_ACT_COUNT) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn,
                     "act: expected TPK_ACT_NONE, TPK_ACT_GELU_TANH or TPK_ACT_GELU, got %d",
                     (int)act);
}
/* the window [row0, row0 + rows) x [col0, col0 + cols) of a tensor with gcols columns */
static inline tpk_status tpk__op_window(tpk_ctx *ctx, const char *fn, int64_t rows, int64_t cols,
                                        int64_t gcols, int64_t row0, int64_t col0) {
    TPK_TRY(tpk__op_nonneg(ctx, fn, "rows", rows));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "cols", cols));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "row0", row0));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "col0", col0));
    if (gcols < col0 + cols)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "gcols: expected >= col0 + cols = %lld, got %lld",
                         (long long)(col0 + cols), (long long)gcols);
    return TPK_OK;
}

/* ---- memory ---------------------------------------------------------------------------------- */

/* *out = a zero-filled buffer of `bytes` in backend memory */
static inline tpk_status tpk_op_alloc(tpk_ctx *ctx, size_t bytes, void **out) {
    static const char *fn = "tpk_op_alloc";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: expected a pointer, got NULL");
    *out = NULL;
    return ctx->ops->alloc(ctx, bytes, out);
}
static inline void tpk_op_free(tpk_ctx *ctx, void *p) {
    if (ctx && ctx->ops && p) ctx->ops->free(ctx, p);
}
static inline tpk_status tpk_op_memcpy(tpk_ctx *ctx, void *dst, const void *src, size_t bytes,
                                       tpk_copy_dir dir) {
    static const char *fn = "tpk_op_memcpy";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    if (dir != TPK_H2D && dir != TPK_D2H && dir != TPK_D2D && dir != TPK_H2H)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "dir: expected TPK_H2D, TPK_D2H, TPK_D2D or TPK_H2H, got %d", (int)dir);
    TPK_TRY(tpk__op_ptr(ctx, fn, "dst", dst, bytes > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "src", src, bytes > 0));
    return bytes
               ? TPK__PROF_OP(ctx, "memcpy", bytes, 0, ctx->ops->memcpy(ctx, dst, src, bytes, dir))
               : TPK_OK;
}
static inline tpk_status tpk_op_sync(tpk_ctx *ctx) {
    TPK_TRY(tpk__op_ctx(ctx, "tpk_op_sync"));
    return ctx->ops->sync(ctx);
}

/* ---- elementwise ----------------------------------------------------------------------------- */

static inline tpk_status tpk_op_fill(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value) {
    static const char *fn = "tpk_op_fill";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, n > 0));
    return n ? TPK__OP_CALL(ctx, "fill", (double)n * (double)tpk_dtype_size(dt), 0,
                            ctx->ops->fill(ctx, x, dt, n, value))
             : TPK_OK;
}
/* rows move as bytes: every dtype is copied exactly */
static inline tpk_status tpk_op_copy2d(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src,
                                       int64_t lds, int64_t rows, int64_t cols, tpk_dtype dt) {
    static const char *fn = "tpk_op_copy2d";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_any(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "rows", rows));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "cols", cols));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldd", ldd, cols));
    TPK_TRY(tpk__op_ld(ctx, fn, "lds", lds, cols));
    bool any = rows > 0 && cols > 0;
    TPK_TRY(tpk__op_ptr(ctx, fn, "dst", dst, any));
    TPK_TRY(tpk__op_ptr(ctx, fn, "src", src, any));
    return any ? TPK__OP_CALL(ctx, "copy2d",
                              2.0 * (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                              ctx->ops->copy2d(ctx, dst, ldd, src, lds, rows, cols, dt))
               : TPK_OK;
}
/* a conversion takes f32 and bf16; a same-dtype cast (a copy) takes any dtype */
static inline tpk_status tpk_op_cast(tpk_ctx *ctx, void *dst, tpk_dtype dst_dt, const void *src,
                                     tpk_dtype src_dt, size_t n) {
    static const char *fn = "tpk_op_cast";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_any(ctx, fn, "dst_dt", dst_dt));
    TPK_TRY(tpk__op_any(ctx, fn, "src_dt", src_dt));
    if (dst_dt != src_dt) {
        TPK_TRY(tpk__op_float(ctx, fn, "dst_dt", dst_dt));
        TPK_TRY(tpk__op_float(ctx, fn, "src_dt", src_dt));
    }
    TPK_TRY(tpk__op_ptr(ctx, fn, "dst", dst, n > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "src", src, n > 0));
    return n ? TPK__OP_CALL(ctx, "cast",
                            (double)n * (double)(tpk_dtype_size(dst_dt) + tpk_dtype_size(src_dt)),
                            0, ctx->ops->cast(ctx, dst, dst_dt, src, src_dt, n))
             : TPK_OK;
}
static inline tpk_status tpk_op_axpby(tpk_ctx *ctx, void *y, float a, const void *x, float b,
                                      tpk_dtype dt, size_t n) {
    static const char *fn = "tpk_op_axpby";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, n > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, n > 0));
    return n ? TPK__OP_CALL(ctx, "axpby",
                            (b != 0.0f ? 3.0 : 2.0) * (double)n * (double)tpk_dtype_size(dt), 0,
                            ctx->ops->axpby(ctx, y, a, x, b, dt, n))
             : TPK_OK;
}
static inline tpk_status tpk_op_act_fwd(tpk_ctx *ctx, tpk_act act, void *y, const void *x,
                                        tpk_dtype dt, size_t n) {
    static const char *fn = "tpk_op_act_fwd";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_act(ctx, fn, act));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, n > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, n > 0));
    return n ? TPK__OP_CALL(ctx, "act_fwd", 2.0 * (double)n * (double)tpk_dtype_size(dt), 0,
                            ctx->ops->act_fwd(ctx, act, y, x, dt, n))
             : TPK_OK;
}
static inline tpk_status tpk_op_act_bwd(tpk_ctx *ctx, tpk_act act, void *dx, const void *x,
                                        const void *dy, tpk_dtype dt, size_t n) {
    static const char *fn = "tpk_op_act_bwd";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_act(ctx, fn, act));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_ptr(ctx, fn, "dx", dx, n > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, n > 0 && act != TPK_ACT_NONE)); /* NONE: dx = dy, x not
                                                                            read */
    TPK_TRY(tpk__op_ptr(ctx, fn, "dy", dy, n > 0));
    return n ? TPK__OP_CALL(ctx, "act_bwd", 3.0 * (double)n * (double)tpk_dtype_size(dt), 0,
                            ctx->ops->act_bwd(ctx, act, dx, x, dy, dt, n))
             : TPK_OK;
}
static inline tpk_status tpk_op_rng_2d(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows,
                                       int64_t cols, int64_t gcols, int64_t row0, int64_t col0,
                                       uint64_t seed, uint64_t stream, tpk_rng_dist dist, float a,
                                       float b) {
    static const char *fn = "tpk_op_rng_2d";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_window(ctx, fn, rows, cols, gcols, row0, col0));
    if (dist != TPK_RNG_NORMAL && dist != TPK_RNG_UNIFORM)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "dist: expected TPK_RNG_NORMAL or TPK_RNG_UNIFORM, got %d", (int)dist);
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, rows > 0 && cols > 0));
    return rows && cols ? TPK__OP_CALL(ctx, "rng_2d",
                                       (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                                       ctx->ops->rng_2d(ctx, x, dt, rows, cols, gcols, row0, col0,
                                                        seed, stream, dist, a, b))
                        : TPK_OK;
}
static inline tpk_status tpk_op_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows,
                                        int64_t cols, int64_t gcols, int64_t row0, int64_t col0,
                                        float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "tpk_op_dropout";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_window(ctx, fn, rows, cols, gcols, row0, col0));
    TPK_TRY(tpk__op_prob(ctx, fn, p));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, rows * cols > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, rows * cols > 0));
    return rows && cols
               ? TPK__OP_CALL(ctx, "dropout",
                              2.0 * (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                              TPK__OP_LAYER(dropout, ctx, y, x, rows, cols, gcols, row0, col0, p,
                                            seed, stream, dt))
               : TPK_OK;
}

/* ---- GEMM and the linear forward ------------------------------------------------------------- */

/* stored shapes: A is [m, k] or [k, m] (ta), B is [k, n] or [n, k] (tb), C is [m, n]; an operand
 * may be NULL only when the product does not touch it (an empty C, or k = 0) */
static inline tpk_status tpk__op_gemm_check(tpk_ctx *ctx, const char *fn, bool ta, bool tb,
                                            int64_t m, int64_t n, int64_t k, const void *a,
                                            int64_t lda, const void *b, int64_t ldb, const void *c,
                                            int64_t ldc, tpk_dtype dt) {
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "m", m, "n", n));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "k", k));
    TPK_TRY(tpk__op_ld(ctx, fn, "lda", lda, ta ? m : k));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldb", ldb, tb ? k : n));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldc", ldc, n));
    TPK_TRY(tpk__op_ptr(ctx, fn, "a", a, m > 0 && n > 0 && k > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "b", b, m > 0 && n > 0 && k > 0));
    return tpk__op_ptr(ctx, fn, "c", c, m > 0 && n > 0);
}
static inline tpk_status tpk_op_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n,
                                     int64_t k, float alpha, const void *a, int64_t lda,
                                     const void *b, int64_t ldb, float beta, void *c, int64_t ldc,
                                     tpk_dtype dt) {
    TPK_TRY(tpk__op_gemm_check(ctx, "tpk_op_gemm", ta, tb, m, n, k, a, lda, b, ldb, c, ldc, dt));
    return m && n ? TPK__OP_CALL(ctx, "gemm", 0, 2.0 * (double)m * (double)n * (double)k,
                                 ctx->ops->gemm(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta,
                                                c, ldc, dt))
                  : TPK_OK;
}
/* C (f32) = alpha op(A) op(B) + beta C, A and B in dt (see tpk_ops.gemm_acc) */
static inline tpk_status tpk_op_gemm_acc(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n,
                                         int64_t k, float alpha, const void *a, int64_t lda,
                                         const void *b, int64_t ldb, float beta, float *c,
                                         int64_t ldc, tpk_dtype dt) {
    TPK_TRY(
        tpk__op_gemm_check(ctx, "tpk_op_gemm_acc", ta, tb, m, n, k, a, lda, b, ldb, c, ldc, dt));
    return m && n ? TPK__OP_CALL(ctx, "gemm_acc", 0, 2.0 * (double)m * (double)n * (double)k,
                                 ctx->ops->gemm_acc(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb,
                                                    beta, c, ldc, dt))
                  : TPK_OK;
}
static inline tpk_status tpk_op_bias_add(tpk_ctx *ctx, void *y, const void *bias, int64_t rows,
                                         int64_t cols, tpk_dtype dt) {
    static const char *fn = "tpk_op_bias_add";
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "rows", rows, "cols", cols));
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, rows > 0 && cols > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "bias", bias, rows > 0 && cols > 0));
    return rows && cols
               ? TPK__OP_CALL(ctx, "bias_add",
                              2.0 * (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                              ctx->ops->bias_add(ctx, y, bias, rows, cols, dt))
               : TPK_OK;
}
static inline tpk_status tpk_op_bias_grad(tpk_ctx *ctx, void *db, const void *dy, int64_t rows,
                                          int64_t cols, tpk_dtype dt, tpk_dtype db_dt,
                                          bool accumulate) {
    static const char *fn = "tpk_op_bias_grad";
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "rows", rows, "cols", cols));
    if (db_dt != dt && db_dt != TPK_F32)
        return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "db_dt: expected %s or f32, got %s",
                         tpk_dtype_name(dt), tpk_dtype_name(db_dt));
    TPK_TRY(tpk__op_ptr(ctx, fn, "db", db, cols > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "dy", dy, rows > 0 && cols > 0));
    return cols ? TPK__OP_CALL(ctx, "bias_grad",
                               (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                               ctx->ops->bias_grad(ctx, db, dy, rows, cols, dt, db_dt, accumulate))
                : TPK_OK;
}
/* ---- FP8: the casts and the GEMM on FP8 codes (tpk/base/ops.h; tpk/layers/fp8.h) ----------- */

static inline tpk_status tpk__op_fp8_fmt(tpk_ctx *ctx, const char *fn, const char *arg,
                                         tpk_fp8_fmt f) {
    if (f == TPK_E4M3 || f == TPK_E5M2) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected TPK_E4M3 or TPK_E5M2, got %d", arg,
                     (int)f);
}
/* q = fp8(x scale), *amax = max(accumulate ? *amax : 0, max |x|); q or amax may be NULL */
static inline tpk_status tpk_op_fp8_quant(tpk_ctx *ctx, uint8_t *q, float *amax, const void *x,
                                          tpk_dtype dt, size_t n, float scale, tpk_fp8_fmt fmt,
                                          bool accumulate) {
    static const char *fn = "tpk_op_fp8_quant";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_fp8_fmt(ctx, fn, "fmt", fmt));
    if (!(scale > 0.0f) || isinf(scale))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "scale: expected a finite value > 0, got %g",
                         (double)scale);
    if (!q && !amax) return tpk__fail(ctx, TPK_ERR_ARG, fn, "q, amax: expected one, got neither");
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, n > 0));
    if (!n && !(amax && !accumulate)) return TPK_OK;
    return TPK__OP_CALL(ctx, "fp8_quant", (double)n * (double)(tpk_dtype_size(dt) + (q ? 1 : 0)), 0,
                        TPK__OP_LAYER(fp8_quant, ctx, q, amax, x, dt, n, scale, fmt, accumulate));
}
/* y = f32(q) scale_inv */
static inline tpk_status tpk_op_fp8_dequant(tpk_ctx *ctx, void *y, tpk_dtype dt, const uint8_t *q,
                                            size_t n, float scale_inv, tpk_fp8_fmt fmt) {
    static const char *fn = "tpk_op_fp8_dequant";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_fp8_fmt(ctx, fn, "fmt", fmt));
    if (!isfinite(scale_inv))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "scale_inv: expected a finite value, got %g",
                         (double)scale_inv);
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, n > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "q", q, n > 0));
    return n ? TPK__OP_CALL(ctx, "fp8_dequant", (double)n * (double)(tpk_dtype_size(dt) + 1), 0,
                            TPK__OP_LAYER(fp8_dequant, ctx, y, dt, q, n, scale_inv, fmt))
             : TPK_OK;
}
/* C (c_dt) = alpha op(A) op(B) + beta C on FP8 codes (see tpk_ops.gemm_fp8) */
static inline tpk_status tpk_op_gemm_fp8(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n,
                                         int64_t k, float alpha, const uint8_t *a, tpk_fp8_fmt fa,
                                         int64_t lda, const uint8_t *b, tpk_fp8_fmt fb, int64_t ldb,
                                         float beta, void *c, int64_t ldc, tpk_dtype c_dt) {
    static const char *fn = "tpk_op_gemm_fp8";
    TPK_TRY(tpk__op_gemm_check(ctx, fn, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, c_dt));
    TPK_TRY(tpk__op_fp8_fmt(ctx, fn, "fa", fa));
    TPK_TRY(tpk__op_fp8_fmt(ctx, fn, "fb", fb));
    if (!isfinite(alpha) || !isfinite(beta))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "alpha, beta: expected finite values, got %g, %g",
                         (double)alpha, (double)beta);
    return m && n ? TPK__OP_CALL(ctx, "gemm_fp8", 0, 2.0 * (double)m * (double)n * (double)k,
                                 TPK__OP_LAYER(gemm_fp8, ctx, ta, tb, m, n, k, alpha, a, fa, lda, b,
                                               fb, ldb, beta, c, ldc, c_dt))
                  : TPK_OK;
}

/* ---- the grouped GEMM (tpk/base/ops.h; the experts of tpk/layers/moe.h) ---------------------- */

/* G GEMMs on row groups of x and y against a matrix each (see tpk_ops.gemm_grouped) */
static inline tpk_status tpk_op_gemm_grouped(tpk_ctx *ctx, bool wgrad, bool tw, int64_t groups,
                                             const int64_t *rows, int64_t n, int64_t k,
                                             float alpha, const void *x, int64_t ldx,
                                             void *const *w, int64_t ldw, tpk_dtype w_dt,
                                             float beta, void *y, int64_t ldy, tpk_dtype dt) {
    static const char *fn = "tpk_op_gemm_grouped";
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "n", n, "k", k));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "groups", groups));
    if (w_dt != dt && !(wgrad && w_dt == TPK_F32))
        return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "w_dt: expected %s%s, got %s (%d)",
                         tpk_dtype_name(dt), wgrad && dt != TPK_F32 ? " or f32" : "",
                         tpk_dtype_name(w_dt), (int)w_dt);
    if (groups && !rows)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "rows: expected a host array of %lld row counts, got NULL",
                         (long long)groups);
    if (groups && !w && n && k)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "w: expected a host array of %lld matrices, got NULL", (long long)groups);
    TPK_TRY(tpk__op_ld(ctx, fn, "ldx", ldx, k));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldw", ldw, tw ? k : n));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldy", ldy, n));
    int64_t R = 0;
    for (int64_t g = 0; g < groups; g++) {
        if (rows[g] < 0)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "rows[%lld]: expected >= 0, got %lld",
                             (long long)g, (long long)rows[g]);
        R += rows[g];
        if (n && k && (wgrad || rows[g]) && !w[g])
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "w[%lld]: expected a buffer, got NULL",
                             (long long)g);
    }
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, R > 0 && n > 0 && k > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, R > 0 && n > 0 && (k > 0 || !wgrad)));
    bool any = wgrad ? groups > 0 && n > 0 && k > 0 : R > 0 && n > 0;
    return any ? TPK__OP_CALL(ctx, "gemm_grouped", 0, 2.0 * (double)R * (double)n * (double)k,
                              TPK__OP_LAYER(gemm_grouped, ctx, wgrad, tw, groups, rows, n, k, alpha,
                                            x, ldx, w, ldw, w_dt, beta, y, ldy, dt))
               : TPK_OK;
}

/* ---- rows moved by an index (tpk/base/ops.h; the permutations of tpk/layers/moe.h) ---------- */

/* y[i] = x[idx[i]] (a zero row where idx[i] is outside [0, xrows)); idx's values are the caller's:
 * in backend memory, not read here */
static inline tpk_status tpk_op_gather_rows(tpk_ctx *ctx, void *y, int64_t ldy, const void *x,
                                            int64_t ldx, int64_t xrows, const int32_t *idx,
                                            int64_t rows, int64_t cols, tpk_dtype dt) {
    static const char *fn = "tpk_op_gather_rows";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_any(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "rows", rows));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "xrows", xrows));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "cols", cols));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldy", ldy, cols));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldx", ldx, cols));
    bool any = rows > 0 && cols > 0;
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, any));
    TPK_TRY(tpk__op_ptr(ctx, fn, "idx", idx, any));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, any && xrows > 0));
    return any ? TPK__OP_CALL(
                     ctx, "gather_rows",
                     (double)rows * (2.0 * (double)cols * (double)tpk_dtype_size(dt) + 4.0), 0,
                     TPK__OP_LAYER(gather_rows, ctx, y, ldy, x, ldx, xrows, idx, rows, cols, dt))
               : TPK_OK;
}
/* y[r] (+)= the rows x[i] with idx[i] = r, in index order (see tpk_ops.scatter_add_rows) */
static inline tpk_status tpk_op_scatter_add_rows(tpk_ctx *ctx, void *y, int64_t ldy, int64_t yrows,
                                                 const void *x, int64_t ldx, const int32_t *idx,
                                                 int64_t rows, int64_t cols, tpk_dtype dt,
                                                 bool accumulate) {
    static const char *fn = "tpk_op_scatter_add_rows";
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "rows", rows, "cols", cols));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "yrows", yrows));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldy", ldy, cols));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldx", ldx, cols));
    bool out = yrows > 0 && cols > 0, in = out && rows > 0;
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, out));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, in));
    TPK_TRY(tpk__op_ptr(ctx, fn, "idx", idx, in));
    double es = (double)tpk_dtype_size(dt);
    return out && (in || !accumulate)
               ? TPK__OP_CALL(ctx, "scatter_add_rows",
                              (double)rows * ((double)cols * es + 4.0) +
                                  (accumulate ? 2.0 : 1.0) * (double)yrows * (double)cols * es,
                              (double)rows * (double)cols,
                              TPK__OP_LAYER(scatter_add_rows, ctx, y, ldy, yrows, x, ldx, idx, rows,
                                            cols, dt, accumulate))
               : TPK_OK;
}
/* the sizes and buffers of the MoE combine: T tokens of K entries, rows of H, o of orows rows */
static inline tpk_status tpk__op_combine_check(tpk_ctx *ctx, const char *fn, const void *o,
                                               int64_t orows, const int32_t *row, const float *w,
                                               int64_t T, int64_t K, int64_t H, tpk_dtype dt) {
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "T", T, "H", H));
    TPK_TRY(tpk__op_pos(ctx, fn, "K", K));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "orows", orows));
    TPK_TRY(tpk__op_ptr(ctx, fn, "row", row, T > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "w", w, T > 0));
    return tpk__op_ptr(ctx, fn, "o", o, T > 0 && H > 0 && orows > 0);
}
/* y[t] = sum_i w[t K + i] o[row[t K + i]] over the kept entries, i ascending (see
 * tpk_ops.moe_combine_fwd) */
static inline tpk_status tpk_op_moe_combine_fwd(tpk_ctx *ctx, void *y, const void *o, int64_t orows,
                                                const int32_t *row, const float *w, int64_t T,
                                                int64_t K, int64_t H, tpk_dtype dt) {
    static const char *fn = "tpk_op_moe_combine_fwd";
    TPK_TRY(tpk__op_combine_check(ctx, fn, o, orows, row, w, T, K, H, dt));
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, T > 0 && H > 0));
    double es = (double)tpk_dtype_size(dt), TK = (double)T * (double)K;
    return T > 0 && H > 0
               ? TPK__OP_CALL(ctx, "moe_combine_fwd",
                              TK * ((double)H * es + 8.0) + (double)T * (double)H * es,
                              2.0 * TK * (double)H,
                              TPK__OP_LAYER(moe_combine_fwd, ctx, y, o, orows, row, w, T, K, H, dt))
               : TPK_OK;
}
/* dw[e] = dy[e / K] . o[row[e]], dout = o's gradient (see tpk_ops.moe_combine_bwd) */
static inline tpk_status tpk_op_moe_combine_bwd(tpk_ctx *ctx, float *dw, void *dout, const void *dy,
                                                const void *o, int64_t orows, const int32_t *row,
                                                const float *w, int64_t T, int64_t K, int64_t H,
                                                tpk_dtype dt) {
    static const char *fn = "tpk_op_moe_combine_bwd";
    TPK_TRY(tpk__op_combine_check(ctx, fn, o, orows, row, w, T, K, H, dt));
    TPK_TRY(tpk__op_ptr(ctx, fn, "dw", dw, T > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "dout", dout, orows > 0 && H > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "dy", dy, T > 0 && H > 0));
    double es = (double)tpk_dtype_size(dt), TK = (double)T * (double)K;
    return T > 0 || (orows > 0 && H > 0)
               ? TPK__OP_CALL(ctx, "moe_combine_bwd",
                              TK * (2.0 * (double)H * es + 12.0) +
                                  ((double)T + (double)orows) * (double)H * es,
                              4.0 * TK * (double)H,
                              TPK__OP_LAYER(moe_combine_bwd, ctx, dw, dout, dy, o, orows, row, w, T,
                                            K, H, dt))
               : TPK_OK;
}

/* ---- the fusions: a NULL fused entry (TPK__OPS_FUSED) is composed from the required entries
 * (tpk__compose_*, tpk/runtime/backend.h) ---- */

static inline tpk_status tpk_op_linear_fwd(tpk_ctx *ctx, void *y, void *pre, const void *x,
                                           const void *w, const void *bias, int64_t T, int64_t n,
                                           int64_t k, tpk_act act, tpk_dtype dt) {
    static const char *fn = "tpk_op_linear_fwd";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_act(ctx, fn, act));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "T", T));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "n", n));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "k", k));
    bool any = T > 0 && n > 0;
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, any));
    TPK_TRY(tpk__op_ptr(ctx, fn, "pre", pre, act != TPK_ACT_NONE && any));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, any && k > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "w", w, any && k > 0));
    return any ? TPK__OP_CALL(
                     ctx, "linear_fwd", 0, 2.0 * (double)T * (double)n * (double)k,
                     (ctx->ops->linear_fwd ? ctx->ops->linear_fwd : tpk__compose_linear_fwd)(
                         ctx, y, pre, x, w, bias, T, n, k, act, dt))
               : TPK_OK;
}
/* du = (dy W) act'(pre), db = colsum(du) (see tpk_ops.linear_bwd_act) */
static inline tpk_status tpk_op_linear_bwd_act(tpk_ctx *ctx, void *du, void *db, const void *dy,
                                               const void *w, const void *pre, int64_t T, int64_t n,
                                               int64_t k, tpk_act act, tpk_dtype dt) {
    static const char *fn = "tpk_op_linear_bwd_act";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_act(ctx, fn, act));
    if (act == TPK_ACT_NONE)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "act: expected an activation, got none (use tpk_op_gemm)");
    TPK_TRY(tpk__op_nonneg(ctx, fn, "T", T));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "n", n));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "k", k));
    bool any = T > 0 && n > 0;
    const void *ps[] = {du, pre};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "du,pre", ps, 2, any));
    TPK_TRY(tpk__op_ptr(ctx, fn, "dy", dy, any && k > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "w", w, any && k > 0));
    if (any && (du == dy || du == pre || du == w))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "du: must not alias dy, w or pre");
    if (!any)
        return db && n ? tpk_op_fill(ctx, db, dt, (size_t)n, 0.0f) : TPK_OK; /* no rows: db = 0 */
    return TPK__OP_CALL(
        ctx, "linear_bwd_act", 0, 2.0 * (double)T * (double)n * (double)k,
        (ctx->ops->linear_bwd_act ? ctx->ops->linear_bwd_act : tpk__compose_linear_bwd_act)(
            ctx, du, db, dy, w, pre, T, n, k, act, dt));
}

/* ---- layernorm ------------------------------------------------------------------------------- */

static inline tpk_status tpk__op_rows_cols(tpk_ctx *ctx, const char *fn, int64_t rows, int64_t cols,
                                           tpk_dtype dt) {
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_float(ctx, fn, "dt", dt));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "rows", rows));
    return tpk__op_pos(ctx, fn, "cols", cols);
}
static inline tpk_status tpk_op_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd,
                                              const void *x, const float *w, const float *b,
                                              int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    static const char *fn = "tpk_op_layernorm_fwd";
    TPK_TRY(tpk__op_rows_cols(ctx, fn, rows, cols, dt));
    if (!(eps > 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "eps: expected > 0, got %g", (double)eps);
    const void *ps[] = {y, mean, rstd, x, w, b};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "y,mean,rstd,x,w,b", ps, 6, rows > 0));
    return rows ? TPK__OP_CALL(ctx, "layernorm_fwd",
                               2.0 * (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                               TPK__OP_LAYER(layernorm_fwd, ctx, y, mean, rstd, x, w, b, rows, cols,
                                             eps, dt))
                : TPK_OK;
}
static inline tpk_status tpk_op_residual_layernorm_fwd(tpk_ctx *ctx, void *x1, void *y, float *mean,
                                                       float *rstd, const void *x, const void *r,
                                                       const float *w, const float *b, int64_t rows,
                                                       int64_t cols, float eps, tpk_dtype dt) {
    static const char *fn = "tpk_op_residual_layernorm_fwd";
    TPK_TRY(tpk__op_rows_cols(ctx, fn, rows, cols, dt));
    if (!(eps > 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "eps: expected > 0, got %g", (double)eps);
    const void *ps[] = {x1, y, mean, rstd, x, r, w, b};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "x1,y,mean,rstd,x,r,w,b", ps, 8, rows > 0));
    return rows ? TPK__OP_CALL(ctx, "residual_layernorm_fwd",
                               4.0 * (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                               (ctx->ops->residual_layernorm_fwd
                                    ? ctx->ops->residual_layernorm_fwd
                                    : tpk__compose_residual_layernorm_fwd)(
                                   ctx, x1, y, mean, rstd, x, r, w, b, rows, cols, eps, dt))
                : TPK_OK;
}
static inline tpk_status tpk_op_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db,
                                              const void *dy, const void *x, const float *w,
                                              const float *mean, const float *rstd, int64_t rows,
                                              int64_t cols, tpk_dtype dt, bool accumulate_dx) {
    static const char *fn = "tpk_op_layernorm_bwd";
    TPK_TRY(tpk__op_rows_cols(ctx, fn, rows, cols, dt));
    const void *ps[] = {dx, dw, db, dy, x, w, mean, rstd};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "dx,dw,db,dy,x,w,mean,rstd", ps, 8, rows > 0));
    return rows ? TPK__OP_CALL(ctx, "layernorm_bwd",
                               3.0 * (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                               TPK__OP_LAYER(layernorm_bwd, ctx, dx, dw, db, dy, x, w, mean, rstd,
                                             rows, cols, dt, accumulate_dx))
                : TPK_OK;
}
static inline tpk_status tpk_op_rmsnorm_fwd(tpk_ctx *ctx, void *y, float *rstd, const void *x,
                                            const float *w, int64_t rows, int64_t cols, float eps,
                                            tpk_dtype dt) {
    static const char *fn = "tpk_op_rmsnorm_fwd";
    TPK_TRY(tpk__op_rows_cols(ctx, fn, rows, cols, dt));
    if (!(eps > 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "eps: expected > 0, got %g", (double)eps);
    const void *ps[] = {y, rstd, x, w};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "y,rstd,x,w", ps, 4, rows > 0));
    return rows ? TPK__OP_CALL(ctx, "rmsnorm_fwd",
                               2.0 * (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                               TPK__OP_LAYER(rmsnorm_fwd, ctx, y, rstd, x, w, rows, cols, eps, dt))
                : TPK_OK;
}
static inline tpk_status tpk_op_rmsnorm_bwd(tpk_ctx *ctx, void *dx, float *dw, const void *dy,
                                            const void *x, const float *w, const float *rstd,
                                            int64_t rows, int64_t cols, tpk_dtype dt,
                                            bool accumulate_dx) {
    static const char *fn = "tpk_op_rmsnorm_bwd";
    TPK_TRY(tpk__op_rows_cols(ctx, fn, rows, cols, dt));
    const void *ps[] = {dx, dw, dy, x, w, rstd};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "dx,dw,dy,x,w,rstd", ps, 6, rows > 0));
    return rows ? TPK__OP_CALL(ctx, "rmsnorm_bwd",
                               3.0 * (double)rows * (double)cols * (double)tpk_dtype_size(dt), 0,
                               TPK__OP_LAYER(rmsnorm_bwd, ctx, dx, dw, dy, x, w, rstd, rows, cols,
                                             dt, accumulate_dx))
                : TPK_OK;
}

/* ---- embedding ------------------------------------------------------------------------------- */

static inline tpk_status tpk__op_embed_check(tpk_ctx *ctx, const char *fn, int64_t T, int64_t H,
                                             int64_t vrows, tpk_dtype dt) {
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "T", T, "H", H));
    return tpk__op_nonneg(ctx, fn, "vrows", vrows);
}
static inline tpk_status tpk_op_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids,
                                          const float *table, int64_t T, int64_t H, int64_t v0,
                                          int64_t vrows, tpk_dtype dt, bool accumulate) {
    static const char *fn = "tpk_op_embed_fwd";
    TPK_TRY(tpk__op_embed_check(ctx, fn, T, H, vrows, dt));
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, T * H > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "ids", ids, T > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "table", table, vrows * H > 0));
    return T && H
               ? TPK__OP_CALL(
                     ctx, "embed_fwd", 2.0 * (double)T * (double)H * (double)tpk_dtype_size(dt), 0,
                     TPK__OP_LAYER(embed_fwd, ctx, y, ids, table, T, H, v0, vrows, dt, accumulate))
               : TPK_OK;
}
static inline tpk_status tpk_op_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy,
                                          const int32_t *ids, int64_t T, int64_t H, int64_t v0,
                                          int64_t vrows, tpk_dtype dt) {
    static const char *fn = "tpk_op_embed_bwd";
    TPK_TRY(tpk__op_embed_check(ctx, fn, T, H, vrows, dt));
    TPK_TRY(tpk__op_ptr(ctx, fn, "dtable", dtable, vrows * H > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "dy", dy, T * H > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "ids", ids, T > 0));
    return T && H && vrows
               ? TPK__OP_CALL(ctx, "embed_bwd",
                              (double)T * (double)H * ((double)tpk_dtype_size(dt) + 8.0), 0,
                              TPK__OP_LAYER(embed_bwd, ctx, dtable, dy, ids, T, H, v0, vrows, dt))
               : TPK_OK;
}

/* ---- cross-entropy --------------------------------------------------------------------------- */

/* the logits' row stride: ld >= Vl (columns Vl..ld-1 are a padded vocabulary's padding) */
static inline tpk_status tpk__op_xent_ld(tpk_ctx *ctx, const char *fn, int64_t Vl, int64_t ld) {
    if (ld < Vl)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "ld: expected >= Vl = %lld, got %lld", (long long)Vl,
                         (long long)ld);
    return TPK_OK;
}
/* part f32 [T, 4]: one read of z (the bytes counted for the profiler) */
static inline tpk_status tpk_op_xent_stats(tpk_ctx *ctx, float *part, const void *z,
                                           const int32_t *targets, int64_t T, int64_t Vl,
                                           int64_t ld, int64_t v0, tpk_dtype dt) {
    static const char *fn = "tpk_op_xent_stats";
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "T", T, "Vl", Vl));
    TPK_TRY(tpk__op_xent_ld(ctx, fn, Vl, ld));
    const void *ps[] = {part, targets};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "part,targets", ps, 2, T > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "z", z, T * Vl > 0));
    return T ? TPK__OP_CALL(ctx, "xent_stats",
                            (double)T * ((double)Vl * (double)tpk_dtype_size(dt) + 16.0), 0,
                            TPK__OP_LAYER(xent_stats, ctx, part, z, targets, T, Vl, ld, v0, dt))
             : TPK_OK;
}
/* part f32 [P, T, 4]: the P ranks' xent_stats in rank order */
static inline tpk_status tpk_op_xent_loss(tpk_ctx *ctx, float *loss, float *lse, const float *part,
                                          int64_t P, const int32_t *targets, int64_t T, int64_t V,
                                          float smoothing, int32_t ignore_index) {
    static const char *fn = "tpk_op_xent_loss";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "T", T));
    TPK_TRY(tpk__op_pos(ctx, fn, "P", P));
    TPK_TRY(tpk__op_pos(ctx, fn, "V", V));
    TPK_TRY(tpk__op_smoothing(ctx, fn, smoothing));
    const void *ps[] = {loss, lse, part, targets};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "loss,lse,part,targets", ps, 4, T > 0));
    return T ? TPK__OP_CALL(ctx, "xent_loss", (16.0 * (double)P + 12.0) * (double)T, 0,
                            TPK__OP_LAYER(xent_loss, ctx, loss, lse, part, P, targets, T, V,
                                          smoothing, ignore_index))
             : TPK_OK;
}
/* *acc (f64 in backend memory) = (accumulate ? *acc : 0) + the sum of loss[0..T) over count
 * positions (count >= 0: this call's counted rows, or under context parallelism every CP rank's,
 * so that the CP ranks' results sum to the mean) */
static inline tpk_status tpk_op_xent_mean(tpk_ctx *ctx, double *acc, const float *loss, int64_t T,
                                          int64_t count, bool accumulate) {
    static const char *fn = "tpk_op_xent_mean";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "T", T));
    if (count < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "count: expected >= 0 counted positions (this call's rows', or every CP "
                         "rank's), got %lld",
                         (long long)count);
    TPK_TRY(tpk__op_ptr(ctx, fn, "acc", acc, true));
    TPK_TRY(tpk__op_ptr(ctx, fn, "loss", loss, T > 0));
    return TPK__OP_CALL(ctx, "xent_mean", 4.0 * (double)T + 16.0, 0,
                        TPK__OP_LAYER(xent_mean, ctx, acc, loss, T, count, accumulate));
}
static inline tpk_status tpk_op_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse,
                                          const int32_t *targets, const float *dloss, int64_t T,
                                          int64_t Vl, int64_t ld, int64_t v0, int64_t V,
                                          float smoothing, int32_t ignore_index, tpk_dtype dt) {
    static const char *fn = "tpk_op_xent_grad";
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "T", T, "Vl", Vl));
    TPK_TRY(tpk__op_xent_ld(ctx, fn, Vl, ld));
    TPK_TRY(tpk__op_pos(ctx, fn, "V", V));
    TPK_TRY(tpk__op_smoothing(ctx, fn, smoothing));
    TPK_TRY(tpk__op_ptr(ctx, fn, "dz", dz, T * ld > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "z", z, T * ld > 0));
    const void *ps[] = {lse, targets, dloss};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "lse,targets,dloss", ps, 3, T > 0));
    return T && ld ? TPK__OP_CALL(ctx, "xent_grad",
                                  2.0 * (double)T * (double)ld * (double)tpk_dtype_size(dt), 0,
                                  TPK__OP_LAYER(xent_grad, ctx, dz, z, lse, targets, dloss, T, Vl,
                                                ld, v0, V, smoothing, ignore_index, dt))
                   : TPK_OK;
}

/* The loss and its gradient of logits z [T, ld] holding the whole vocabulary V (one rank): z read
 * once, dz (may alias z) written once; dloss = g for every row. */
static inline tpk_status tpk_op_xent_fused(tpk_ctx *ctx, void *dz, float *loss, float *lse,
                                           const void *z, const int32_t *targets, int64_t T,
                                           int64_t V, int64_t ld, float smoothing,
                                           int32_t ignore_index, float g, tpk_dtype dt) {
    static const char *fn = "tpk_op_xent_fused";
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "T", T, "V", V));
    TPK_TRY(tpk__op_pos(ctx, fn, "V", V));
    TPK_TRY(tpk__op_xent_ld(ctx, fn, V, ld));
    TPK_TRY(tpk__op_smoothing(ctx, fn, smoothing));
    if (!isfinite(g))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "g: expected a finite gradient scale, got %g",
                         (double)g);
    TPK_TRY(tpk__op_ptr(ctx, fn, "dz", dz, T > 0));
    TPK_TRY(tpk__op_ptr(ctx, fn, "z", z, T > 0));
    const void *ps[] = {loss, lse, targets};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "loss,lse,targets", ps, 3, T > 0));
    return T ? TPK__OP_CALL(
                   ctx, "xent_fused",
                   (double)T * (2.0 * (double)ld * (double)tpk_dtype_size(dt) + 12.0), 0,
                   (ctx->ops->xent_fused ? ctx->ops->xent_fused : tpk__compose_xent_fused)(
                       ctx, dz, loss, lse, z, targets, T, V, ld, smoothing, ignore_index, g, dt))
             : TPK_OK;
}

/* ---- attention ------------------------------------------------------------------------------- */

static inline tpk_status tpk__op_attn_check(tpk_ctx *ctx, const char *fn, int64_t B, int64_t S,
                                            int64_t Al, int64_t D, int64_t A, int64_t G,
                                            int64_t head0, float p, tpk_dtype dt) {
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "B", B, "S", S));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "Al", Al));
    TPK_TRY(tpk__op_pos(ctx, fn, "D", D));
    if (G < 1 || G > A || A % G)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "G: expected a divisor of A = %lld (key/value heads), got %lld",
                         (long long)A, (long long)G);
    if (head0 < 0 || head0 + Al > A)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "head0: expected 0 <= head0 and head0 + Al <= A = %lld, got %lld",
                         (long long)A, (long long)head0);
    return tpk__op_prob(ctx, fn, p);
}
static inline tpk_status tpk_op_attn_fwd(tpk_ctx *ctx, void *out, float *lse, const void *qkv,
                                         int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A,
                                         int64_t G, int64_t head0, float scale, float p,
                                         uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "tpk_op_attn_fwd";
    TPK_TRY(tpk__op_attn_check(ctx, fn, B, S, Al, D, A, G, head0, p, dt));
    bool any = B * S * Al > 0;
    const void *ps[] = {out, lse, qkv};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "out,lse,qkv", ps, 3, any));
    return any ? TPK__OP_CALL(ctx, "attn_fwd", 0,
                              2.0 * (double)B * (double)Al * (double)S * (double)S * (double)D,
                              TPK__OP_LAYER(attn_fwd, ctx, out, lse, qkv, B, S, Al, D, A, G, head0,
                                            scale, p, seed, stream, dt))
               : TPK_OK;
}
static inline tpk_status tpk_op_attn_bwd(tpk_ctx *ctx, void *dqkv, const void *dout,
                                         const void *qkv, const void *out, const float *lse,
                                         int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A,
                                         int64_t G, int64_t head0, float scale, float p,
                                         uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "tpk_op_attn_bwd";
    TPK_TRY(tpk__op_attn_check(ctx, fn, B, S, Al, D, A, G, head0, p, dt));
    bool any = B * S * Al > 0;
    const void *ps[] = {dqkv, dout, qkv, out, lse};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "dqkv,dout,qkv,out,lse", ps, 5, any));
    return any ? TPK__OP_CALL(ctx, "attn_bwd", 0,
                              5.0 * (double)B * (double)Al * (double)S * (double)S * (double)D,
                              TPK__OP_LAYER(attn_bwd, ctx, dqkv, dout, qkv, out, lse, B, S, Al, D,
                                            A, G, head0, scale, p, seed, stream, dt))
               : TPK_OK;
}

/* One block's geometry (tpk_attn_blk, tpk/base/ops.h): sizes, positions, heads, leading dims. */
static inline tpk_status tpk__op_attn_blk_check(tpk_ctx *ctx, const char *fn, const tpk_attn_blk *b,
                                                tpk_dtype dt) {
    TPK_TRY(tpk__op_ctx(ctx, fn));
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "b: expected a block's geometry, got NULL");
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "b->Sq", b->Sq, "b->Sk", b->Sk));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "b->q0", b->q0));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "b->k0", b->k0));
    TPK_TRY(tpk__op_nonneg(ctx, fn, "b->Al", b->Al));
    TPK_TRY(tpk__op_pos(ctx, fn, "b->D", b->D));
    if (b->G < 1 || b->G > b->A || b->A % b->G)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "b->G: expected a divisor of b->A = %lld (key/value heads), got %lld",
                         (long long)b->A, (long long)b->G);
    if (b->head0 < 0 || b->head0 + b->Al > b->A)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "b->head0: expected 0 <= head0 and head0 + Al <= A = %lld, got %lld",
                         (long long)b->A, (long long)b->head0);
    if (!isfinite(b->scale))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "b->scale: expected a finite scale, got %g",
                         (double)b->scale);
    if (!(b->p >= 0.0f && b->p < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "b->p: expected 0 <= p < 1, got %g", (double)b->p);
    if (b->p > 0.0f) { /* the mask's index reads the sequence's batch index and whole length */
        TPK_TRY(tpk__op_nonneg(ctx, fn, "b->b", b->b));
        int64_t end = b->q0 + b->Sq > b->k0 + b->Sk ? b->q0 + b->Sq : b->k0 + b->Sk;
        if (b->S < end)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "b->S: with dropout expected the whole sequence's length, >= the "
                             "block's last position + 1 = %lld, got %lld",
                             (long long)end, (long long)b->S);
    }
    int64_t Gl = tpk_attn_kv_heads(b->A, b->G, b->head0, b->Al, NULL), AD = b->Al * b->D;
    TPK_TRY(tpk__op_ld(ctx, fn, "b->ldq", b->ldq, AD));
    TPK_TRY(tpk__op_ld(ctx, fn, "b->lddq", b->lddq, AD));
    TPK_TRY(tpk__op_ld(ctx, fn, "b->ldkv", b->ldkv, 2 * Gl * b->D));
    TPK_TRY(tpk__op_ld(ctx, fn, "b->ldo", b->ldo, AD));
    return tpk__op_ld(ctx, fn, "b->ldl", b->ldl, b->Sq);
}
/* The (query, key) pairs of a block that are visible: its flops' measure. */
static inline double tpk__attn_blk_pairs(const tpk_attn_blk *b) {
    if (!b->causal) return (double)b->Sq * (double)b->Sk;
    double n = 0;
    for (int64_t i = 0; i < b->Sq; i++) {
        int64_t v = b->q0 + i - b->k0 + 1;
        n += (double)(v < 0 ? 0 : v > b->Sk ? b->Sk : v);
    }
    return n;
}
static inline tpk_status tpk_op_attn_block_fwd(tpk_ctx *ctx, float *out, float *lse, const void *q,
                                               const void *kv, const tpk_attn_blk *b, bool merge,
                                               tpk_dtype dt) {
    static const char *fn = "tpk_op_attn_block_fwd";
    TPK_TRY(tpk__op_attn_blk_check(ctx, fn, b, dt));
    bool any = b->Sq * b->Al > 0;
    const void *ps[] = {out, lse, q};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "out,lse,q", ps, 3, any));
    TPK_TRY(tpk__op_ptr(ctx, fn, "kv", kv, any && b->Sk > 0));
    return any ? TPK__OP_CALL(ctx, "attn_block_fwd", 0,
                              4.0 * tpk__attn_blk_pairs(b) * (double)b->Al * (double)b->D,
                              TPK__OP_LAYER(attn_block_fwd, ctx, out, lse, q, kv, b, merge, dt))
               : TPK_OK;
}
static inline tpk_status tpk_op_attn_block_bwd(tpk_ctx *ctx, float *dq, float *dkv,
                                               const void *dout, const void *out, const float *lse,
                                               const void *q, const void *kv,
                                               const tpk_attn_blk *b, tpk_dtype dt) {
    static const char *fn = "tpk_op_attn_block_bwd";
    TPK_TRY(tpk__op_attn_blk_check(ctx, fn, b, dt));
    bool any = b->Sq * b->Sk * b->Al > 0;
    const void *ps[] = {dq, dkv, dout, out, lse, q, kv};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "dq,dkv,dout,out,lse,q,kv", ps, 7, any));
    return any ? TPK__OP_CALL(ctx, "attn_block_bwd", 0,
                              10.0 * tpk__attn_blk_pairs(b) * (double)b->Al * (double)b->D,
                              TPK__OP_LAYER(attn_block_bwd, ctx, dq, dkv, dout, out, lse, q, kv,
                                            b, dt))
               : TPK_OK;
}

/* ---- rotary embedding, SwiGLU, RMSNorm (Llama) ----------------------------------------------- */

/* rope's and rope_at's arguments but the positions */
static inline tpk_status tpk__op_rope_args(tpk_ctx *ctx, const char *fn, void *y, int64_t ldy,
                                           const void *x, int64_t ldx, int64_t rows, int64_t heads,
                                           int64_t D, float theta, tpk_dtype dt) {
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "rows", rows, "heads", heads));
    if (D < 2 || D % 2)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "D: expected an even head size >= 2 (rotate-half pairs j, j + D/2), got %lld",
            (long long)D);
    if (!(theta > 1.0f) || isinf(theta))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "theta: expected a finite base > 1 (e.g. 10000), got %g", (double)theta);
    TPK_TRY(tpk__op_ld(ctx, fn, "ldx", ldx, heads * D));
    TPK_TRY(tpk__op_ld(ctx, fn, "ldy", ldy, heads * D));
    bool any = rows * heads > 0;
    TPK_TRY(tpk__op_ptr(ctx, fn, "y", y, any));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, any));
    if (any && y == x && ldy != ldx)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "ldy: in place (y == x) expected ldx = %lld, got %lld", (long long)ldx,
                         (long long)ldy);
    return TPK_OK;
}
static inline tpk_status tpk_op_rope(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx,
                                     int64_t rows, int64_t S, int64_t heads, int64_t D, float theta,
                                     bool inverse, tpk_dtype dt) {
    static const char *fn = "tpk_op_rope";
    TPK_TRY(tpk__op_rope_args(ctx, fn, y, ldy, x, ldx, rows, heads, D, theta, dt));
    TPK_TRY(tpk__op_pos(ctx, fn, "S", S));
    bool any = rows * heads > 0;
    return any ? TPK__OP_CALL(ctx, "rope",
                              2.0 * (double)rows * (double)(heads * D) * (double)tpk_dtype_size(dt),
                              0,
                              TPK__OP_LAYER(rope, ctx, y, ldy, x, ldx, rows, S, heads, D, theta,
                                            inverse, dt))
               : TPK_OK;
}
/* rope at the positions pos[i mod npos] of row i (int32, backend memory; its values are the
 * caller's: not read here) */
static inline tpk_status tpk_op_rope_at(tpk_ctx *ctx, void *y, int64_t ldy, const void *x,
                                        int64_t ldx, int64_t rows, const int32_t *pos, int64_t npos,
                                        int64_t heads, int64_t D, float theta, bool inverse,
                                        tpk_dtype dt) {
    static const char *fn = "tpk_op_rope_at";
    TPK_TRY(tpk__op_rope_args(ctx, fn, y, ldy, x, ldx, rows, heads, D, theta, dt));
    TPK_TRY(tpk__op_pos(ctx, fn, "npos", npos));
    bool any = rows * heads > 0;
    TPK_TRY(tpk__op_ptr(ctx, fn, "pos", pos, any));
    return any ? TPK__OP_CALL(ctx, "rope_at",
                              2.0 * (double)rows * (double)(heads * D) * (double)tpk_dtype_size(dt),
                              0,
                              TPK__OP_LAYER(rope_at, ctx, y, ldy, x, ldx, rows, pos, npos, heads, D,
                                            theta, inverse, dt))
               : TPK_OK;
}
static inline tpk_status tpk_op_swiglu_fwd(tpk_ctx *ctx, void *h, const void *gu, int64_t rows,
                                           int64_t F, tpk_dtype dt) {
    static const char *fn = "tpk_op_swiglu_fwd";
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "rows", rows, "F", F));
    const void *ps[] = {h, gu};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "h,gu", ps, 2, rows * F > 0));
    return rows && F ? TPK__OP_CALL(ctx, "swiglu_fwd",
                                    3.0 * (double)rows * (double)F * (double)tpk_dtype_size(dt), 0,
                                    TPK__OP_LAYER(swiglu_fwd, ctx, h, gu, rows, F, dt))
                     : TPK_OK;
}
static inline tpk_status tpk_op_swiglu_bwd(tpk_ctx *ctx, void *dgu, const void *gu, const void *dh,
                                           int64_t rows, int64_t F, tpk_dtype dt) {
    static const char *fn = "tpk_op_swiglu_bwd";
    TPK_TRY(tpk__op_dims(ctx, fn, dt, "rows", rows, "F", F));
    const void *ps[] = {dgu, gu, dh};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "dgu,gu,dh", ps, 3, rows * F > 0));
    return rows && F ? TPK__OP_CALL(ctx, "swiglu_bwd",
                                    5.0 * (double)rows * (double)F * (double)tpk_dtype_size(dt), 0,
                                    TPK__OP_LAYER(swiglu_bwd, ctx, dgu, gu, dh, rows, F, dt))
                     : TPK_OK;
}

/* ---- optimizer ------------------------------------------------------------------------------- */

static inline tpk_status tpk_op_adamw(tpk_ctx *ctx, float *w, const float *g, float *m, float *v,
                                      size_t n, float lr, float b1, float b2, float eps, float wd,
                                      int64_t step, float grad_scale, double *norm, float clip,
                                      const int64_t *decay, int64_t nruns, uint16_t *w16) {
    static const char *fn = "tpk_op_adamw";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    if (step < 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "step: expected >= 1, got %lld", (long long)step);
    if (nruns < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "nruns: expected >= 0, got %lld", (long long)nruns);
    if (decay && !nruns)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "nruns: expected >= 1 runs with a decay table (NULL: decay everywhere)");
    if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "b1, b2: expected in [0, 1), got %g, %g", (double)b1,
                         (double)b2);
    if (!isfinite(grad_scale) || isnan(clip))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "grad_scale, clip: expected finite numbers, got %g, %g",
                         (double)grad_scale, (double)clip);
    const void *ps[] = {w, g, m, v};
    TPK_TRY(tpk__op_ptrs(ctx, fn, "w,g,m,v", ps, 4, n > 0));
    return n ? TPK__OP_CALL(ctx, "adamw", (w16 ? 30.0 : 28.0) * (double)n, 0,
                            ctx->ops->adamw(ctx, w, g, m, v, n, lr, b1, b2, eps, wd, step,
                                            grad_scale, norm, clip, decay, nruns, w16))
             : TPK_OK;
}
/* *out (f64 in backend memory) = (accumulate ? *out : 0) + the sum of squares, in double; no host
 * wait */
static inline tpk_status tpk_op_sumsq(tpk_ctx *ctx, double *out, const float *x, size_t n,
                                      bool accumulate) {
    static const char *fn = "tpk_op_sumsq";
    TPK_TRY(tpk__op_ctx(ctx, fn));
    TPK_TRY(tpk__op_ptr(ctx, fn, "out", out, true));
    TPK_TRY(tpk__op_ptr(ctx, fn, "x", x, n > 0));
    if (!n && accumulate) return TPK_OK;
    return TPK__OP_CALL(ctx, "sumsq", 4.0 * (double)n, 0,
                        ctx->ops->sumsq(ctx, out, x, n, accumulate));
}

#endif /* TPK_OP_H */
