/* tpk/layers/fp8.h — the FP8 recipe: per-tensor scales for the FP8 linears (tpk/layers/linear.h).
 *
 * A linear made with tpk_linear_desc.fp8 while the context holds a recipe (ctx->fp8, set by
 * tpk_fp8_init) quantizes three tensors — its input x and weight W in E4M3, its output gradient dy
 * in E5M2 (the HYBRID format) — and runs its GEMMs on the codes (tpk_op_gemm_fp8: the codes
 * decoded exactly, f32 sums) with the scales taken out again in the GEMM's alpha:
 *   q = fp8(v s), y = (1 / (s_x s_w)) sum_k q_x q_w = x W^T up to the casts' rounding.
 * Master weights, the optimizer, norms, embeddings, the LM head and the attention's softmax are
 * not quantized (the kit's attention and MLP ask for FP8; the LM head does not).
 *
 * The scale of a tensor (TransformerEngine's recipes):
 *   current  s = fp8_max / amax / 2^margin with amax = max |v| of the tensor now (its maximum over
 *            the TP group first: one all-reduce of a float per quantization); amax = 0 gives s = 1
 *   delayed  s from an amax history of the last `history` steps (the step's amax: the maximum over
 *            the step's quantizations of the tensor, and over TP x DP x CP, ctx->tp then
 *            ctx->dp_cp, at the update): amax = max over the window (TPK_FP8_AMAX_MAX) or the
 *            latest (TPK_FP8_AMAX_MOST_RECENT); s = fp8_max / amax / 2^margin in f32, the previous
 *            s kept where amax is 0 or not finite or s would not be finite; s = 1 before the first
 *            update. tpk_fp8_update after each optimizer step records the amaxes and sets the
 *            scales for the next.
 * The amax reduction makes every rank of a stage hold the same state, so a TP 1 and a TP 2 run
 * quantize to the same codes; the state (each tensor's history and scale, and the update count)
 * is what a checkpoint keeps (tpk/train/ckpt.h: fp8.safetensors beside the optimizer's file). */
#ifndef TPK_FP8_H
#define TPK_FP8_H

#include "params.h"

typedef enum tpk_fp8_scaling {
    TPK_FP8_NONE = 0,
    TPK_FP8_CURRENT = 1,
    TPK_FP8_DELAYED = 2
} tpk_fp8_scaling;
typedef enum tpk_fp8_amax_algo {
    TPK_FP8_AMAX_MAX = 0,        /* the maximum over the history window */
    TPK_FP8_AMAX_MOST_RECENT = 1 /* the latest step's */
} tpk_fp8_amax_algo;

typedef struct tpk_fp8_desc {
    tpk_fp8_scaling scaling; /* TPK_FP8_CURRENT or TPK_FP8_DELAYED (required) */
    int history;             /* delayed: the amax history's length, 1..1 << 20; 0 = 1024 */
    tpk_fp8_amax_algo algo;  /* delayed: TPK_FP8_AMAX_MAX (default) or _MOST_RECENT */
    int margin;              /* s = fp8_max / amax / 2^margin; 0..64 */
} tpk_fp8_desc;

/* a linear's three tensors, at its slot + k */
enum { TPK_FP8_X = 0, TPK_FP8_W = 1, TPK_FP8_DY = 2 };

typedef struct tpk_fp8 {
    tpk_fp8_desc d;
    int n, cap;        /* tensors registered, room for */
    char (*names)[96]; /* [n] "<linear>.input", ".weight", ".grad_output" */
    float *scale;      /* [n] the scales quantization uses now (delayed) */
    float *hist;       /* [n, history] the amaxes of the last steps, column 0 the latest */
    float *amax_h;     /* [n] the step's amaxes, read back at the update */
    tpk_buf amax;      /* f32 [n] in backend memory: this step's amaxes (current: scratch) */
    int64_t steps;     /* updates done */
    bool paused;       /* delayed: quantizations record no amax (an evaluation's forwards,
                          tpk_trainable_losses), so they do not change the next scales */
} tpk_fp8;

static inline const char *tpk_fp8_scaling_name(tpk_fp8_scaling s) {
    return s == TPK_FP8_CURRENT ? "current" : s == TPK_FP8_DELAYED ? "delayed" : "none";
}

/* A recipe on ctx: ctx->fp8 = f, which the linears made with tpk_linear_desc.fp8 from now on
 * register with (three tensors each). Destroy it after the layers. */
static inline tpk_status tpk_fp8_init(tpk_ctx *ctx, tpk_fp8 *f, const tpk_fp8_desc *desc) {
    static const char *fn = "tpk_fp8_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!f) return tpk__fail(ctx, TPK_ERR_ARG, fn, "f: NULL");
    if (!desc) return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc: NULL");
    memset(f, 0, sizeof *f);
    f->d = *desc;
    if (f->d.scaling != TPK_FP8_CURRENT && f->d.scaling != TPK_FP8_DELAYED)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->scaling: expected TPK_FP8_CURRENT or TPK_FP8_DELAYED, got %d",
                         (int)f->d.scaling);
    if (f->d.history < 0 || f->d.history > (1 << 20))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->history: expected 1..1048576 (0 = 1024), got %d", f->d.history);
    if (f->d.algo != TPK_FP8_AMAX_MAX && f->d.algo != TPK_FP8_AMAX_MOST_RECENT)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->algo: expected TPK_FP8_AMAX_MAX or TPK_FP8_AMAX_MOST_RECENT, got %d",
            (int)f->d.algo);
    if (f->d.margin < 0 || f->d.margin > 64)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->margin: expected 0..64, got %d", f->d.margin);
    if (!f->d.history) f->d.history = 1024;
    ctx->fp8 = f;
    return TPK_OK;
}

/* Free the recipe's memory; ctx->fp8 no longer points at it. */
static inline void tpk_fp8_destroy(tpk_ctx *ctx, tpk_fp8 *f) {
    if (!f) return;
    if (ctx) {
        tpk__buf_free(ctx, &f->amax);
        if (ctx->fp8 == f) ctx->fp8 = NULL;
    }
    tpk__free(ctx, f->names), tpk__free(ctx, f->scale), tpk__free(ctx, f->hist);
    tpk__free(ctx, f->amax_h);
    memset(f, 0, sizeof *f);
}

/* The scale for an amax: fp8_max / amax / 2^margin (f32), `old` where amax is 0 or not finite or
 * the scale would not be finite (TransformerEngine's rule). */
static inline float tpk_fp8_scale_of(float amax, float fp8_max, int margin, float old) {
    if (!(amax > 0.0f) || !isfinite(amax)) return old;
    float s = fp8_max / amax / ldexpf(1.0f, margin);
    return isfinite(s) && s > 0.0f ? s : old;
}

/* Three tensors for the linear `name` (input, weight, output gradient): *slot their first. */
static inline tpk_status tpk__fp8_register(tpk_ctx *ctx, tpk_fp8 *f, const char *name, int *slot) {
    static const char *fn = "tpk_fp8 (a linear's registration)";
    if (f->n + 3 > f->cap) {
        int cap = f->cap ? 2 * f->cap : 48;
        size_t L = (size_t)f->d.history;
        char(*nm)[96] = (char(*)[96])tpk__realloc(ctx, f->names, sizeof *nm * (size_t)f->cap,
                                                  sizeof *nm * (size_t)cap);
        if (nm) f->names = nm;
        float *sc = (float *)tpk__realloc(ctx, f->scale, sizeof(float) * (size_t)f->cap,
                                          sizeof(float) * (size_t)cap);
        if (sc) f->scale = sc;
        float *h = (float *)tpk__realloc(ctx, f->hist, sizeof(float) * L * (size_t)f->cap,
                                         sizeof(float) * L * (size_t)cap);
        if (h) f->hist = h;
        float *a = (float *)tpk__realloc(ctx, f->amax_h, sizeof(float) * (size_t)f->cap,
                                         sizeof(float) * (size_t)cap);
        if (a) f->amax_h = a;
        if (!nm || !sc || !h || !a) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d tensors", cap);
        f->cap = cap;
    }
    static const char *what[3] = {"input", "weight", "grad_output"};
    *slot = f->n;
    for (int k = 0; k < 3; k++) {
        int i = f->n++;
        snprintf(f->names[i], sizeof f->names[i], "%s.%s", name, what[k]);
        f->scale[i] = 1.0f, f->amax_h[i] = 0.0f;
        for (int j = 0; j < f->d.history; j++) f->hist[(size_t)i * (size_t)f->d.history + j] = 0;
    }
    /* the backend's amaxes, zeroed (tpk_op_alloc's memory is) */
    tpk_buf nb;
    memset(&nb, 0, sizeof nb);
    TPK_TRY(tpk__buf_reserve(ctx, &nb, sizeof(float) * (size_t)f->cap));
    if (f->amax.p && f->n > 3)
        TPK_TRY(tpk_op_memcpy(ctx, nb.p, f->amax.p, sizeof(float) * (size_t)(f->n - 3), TPK_D2D));
    tpk__buf_free(ctx, &f->amax);
    f->amax = nb;
    return TPK_OK;
}

/* q [n] = the codes of x [n] (ctx->dtype) for tensor i in fmt; *used the scale quantized with.
 * use >= 0: quantize with that scale, recording nothing (the backward's second quantization of
 * the forward's x and W). Otherwise current scaling: the amax now, all-reduced (max) over TP, then
 * the codes; delayed: the recipe's scale, the amax added into the step's (tpk_fp8_update). A
 * collective under current scaling: every rank of the TP group calls it, n = 0 too. */
static inline tpk_status tpk__fp8_quant(tpk_ctx *ctx, tpk_fp8 *f, int i, const void *x, size_t n,
                                        uint8_t *q, tpk_fp8_fmt fmt, float use, float *used) {
    float *am = (float *)f->amax.p + i;
    float s = use;
    if (use > 0) {
    } else if (f->d.scaling == TPK_FP8_DELAYED) {
        s = f->scale[i];
        if (f->paused && !q) return *used = s, TPK_OK;
        return *used = s,
               tpk_op_fp8_quant(ctx, q, f->paused ? NULL : am, x, ctx->dtype, n, s, fmt, true);
    } else {
        float a = 0.0f;
        TPK_TRY(tpk_op_fp8_quant(ctx, NULL, am, x, ctx->dtype, n, 1.0f, fmt, false));
        if (ctx->tp.size > 1) TPK_TRY(tpk_allreduce(ctx, &ctx->tp, am, am, 1, TPK_F32, TPK_MAX));
        TPK_TRY(tpk_op_memcpy(ctx, &a, am, sizeof a, TPK_D2H));
        s = tpk_fp8_scale_of(a, tpk_fp8_max(fmt), f->d.margin, 1.0f);
    }
    *used = s;
    return n ? tpk_op_fp8_quant(ctx, q, NULL, x, ctx->dtype, n, s, fmt, false) : TPK_OK;
}

/* After each optimizer step (delayed scaling; under current scaling it only counts the step): the
 * step's amaxes reduced (max) over ctx->tp and ctx->dp_cp, read back, each tensor's history
 * shifted with the step's amax in front, the scales for the next step set from it, the step's
 * amaxes zeroed. Collective over the stage's ranks (TP x DP x CP). */
static inline tpk_status tpk_fp8_update(tpk_ctx *ctx, tpk_fp8 *f) {
    static const char *fn = "tpk_fp8_update";
    if (!ctx) return TPK_ERR_ARG;
    if (!f) return tpk__fail(ctx, TPK_ERR_ARG, fn, "f: NULL");
    f->steps++;
    if (f->d.scaling != TPK_FP8_DELAYED || !f->n) return TPK_OK;
    size_t n = (size_t)f->n, L = (size_t)f->d.history;
    float *am = (float *)f->amax.p;
    if (ctx->tp.size > 1) TPK_TRY(tpk_allreduce(ctx, &ctx->tp, am, am, n, TPK_F32, TPK_MAX));
    if (ctx->dp_cp && ctx->dp_cp->size > 1)
        TPK_TRY(tpk_allreduce(ctx, ctx->dp_cp, am, am, n, TPK_F32, TPK_MAX));
    TPK_TRY(tpk_op_memcpy(ctx, f->amax_h, am, sizeof(float) * n, TPK_D2H));
    for (size_t i = 0; i < n; i++) {
        float *h = f->hist + i * L, a = f->amax_h[i];
        memmove(h + 1, h, sizeof(float) * (L - 1));
        h[0] = a;
        if (f->d.algo == TPK_FP8_AMAX_MAX)
            for (size_t j = 1; j < L; j++) a = fmaxf(a, h[j]);
        tpk_fp8_fmt fmt = i % 3 == TPK_FP8_DY ? TPK_E5M2 : TPK_E4M3;
        f->scale[i] = tpk_fp8_scale_of(a, tpk_fp8_max(fmt), f->d.margin, f->scale[i]);
    }
    return tpk_op_fill(ctx, am, TPK_F32, n, 0.0f);
}

#endif /* TPK_FP8_H */
