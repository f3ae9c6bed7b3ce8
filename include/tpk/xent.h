/* tpk/xent.h — vocabulary-parallel cross-entropy (the loss of an LM head whose logits are split
 * over the vocabulary, e.g. GPT-2's tied head).
 *
 * Over logits z S(-1) [T, V] (rank r holds columns [v0, v0 + V_r)):
 *   forward   m = all-reduce MAX of the row max; (sum exp(z - m), z_target, sum z) packed in one
 *             all-reduce SUM; lse = m + log sum exp;
 *             loss_t = lse - (1 - eps) z_target - eps mean_V(z)      (eps: label smoothing over
 *             the GLOBAL vocabulary, so the value is the same at every t); positions whose
 *             target is the ignore index (default -100) count for nothing; the loss is the mean
 *             over the counted positions, reduced on the device (xent_mean: a fixed order) and read
 *             by the host only when asked: at once (tpk_xent_forward with a loss pointer: one
 *             download, one host wait) or later — a forward with loss = NULL adds its mean to a
 *             running sum left in backend memory, which tpk_xent_loss_read downloads (a trainer
 *             reads it on its log steps only; the other steps make no loss download).
 *   backward  dz = (softmax(z) - (1 - eps) onehot - eps / V) * scale / counted, written over z;
 *             no communication.
 * A padded vocabulary (desc->padded_vocab = Vp > V, the logits of a head over tpk_embedding's
 * padded table): z is S(-1) [T, Vp]; the columns >= V are left out of the max, the sums and the
 * loss, and their gradient is zero. The columns are split as the vocabulary is
 * (tpk_tp_vocab_split; z's layout tpk_tp_vocab_layout(ctx, Vp, -1): S(-1), in units of 64 columns
 * under TP weights when Vp is a multiple of 64). */
#ifndef TPK_XENT_H
#define TPK_XENT_H

#include "params.h"

typedef struct tpk_xent_desc {
    float label_smoothing;    /* eps in [0, 1), over the global vocabulary */
    bool set_ignore_index;    /* use ignore_index below instead of the default -100 */
    int32_t ignore_index;
    int64_t padded_vocab;     /* the logits' global columns Vp >= V (0: V) */
} tpk_xent_desc;

typedef struct tpk_xent {
    float eps;
    int32_t ignore;
    int64_t V, Vp, T, counted;
    tpk_tensor z;             /* the logits of the last forward (overwritten by backward) */
    tpk_buf targets, mx, part, lse, loss, dloss;
    tpk_buf mean;             /* f64 [2] in backend memory: the running sum of means (loss = NULL forwards), the last mean returned */
    int64_t nsum;             /* forwards in the running sum since the last read or reset */
} tpk_xent;

static inline tpk_status tpk_xent_init(tpk_ctx *ctx, tpk_xent *ce, int64_t V, const tpk_xent_desc *desc) {
    static const char *fn = "tpk_xent_init";
    tpk_xent_desc d;
    TPK__INIT_LAYER(ctx, fn, ce, d, desc);
    if (V < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "V: expected >= 1, got %lld", (long long)V);
    if (!(d.label_smoothing >= 0 && d.label_smoothing < 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->label_smoothing: expected 0 <= eps < 1, got %g", (double)d.label_smoothing);
    if (d.padded_vocab && d.padded_vocab < V)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "desc->padded_vocab: expected >= V = %lld (or 0), got %lld", (long long)V, (long long)d.padded_vocab);
    ce->V = V, ce->Vp = d.padded_vocab ? d.padded_vocab : V, ce->eps = d.label_smoothing, ce->ignore = d.set_ignore_index ? d.ignore_index : -100;
    return TPK_OK;
}

/* This rank's columns of the logits: the first v0 (global), how many are real (not padding). */
static inline void tpk__xent_cols(const tpk_ctx *ctx, const tpk_xent *ce, int64_t *v0, int64_t *real) {
    tpk_range r = tpk_tp_vocab_split(ctx, ce->Vp, ctx->tp.rank);
    int64_t n = ce->V - r.off;
    *v0 = r.off, *real = n < 0 ? 0 : n < r.size ? n : r.size;
}

/* The mean over counted positions of the cross-entropy of logits z S(-1) [T, Vp] against targets
 * [T] (host memory; each in 0..V-1 or the ignore index). Two collectives. loss != NULL: *loss = the
 * mean (one download: the host waits for the device); loss = NULL: the mean stays in backend
 * memory, added to the running sum that tpk_xent_loss_read returns (no download, no wait). */
static inline tpk_status tpk_xent_forward(tpk_ctx *ctx, tpk_xent *ce, tpk_tensor z, const int32_t *targets, float *loss) {
    static const char *fn = "tpk_xent_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!ce || !ce->V) return tpk__fail(ctx, TPK_ERR_ARG, fn, "ce: expected an initialised cross-entropy");
    int64_t want[2] = {-1, ce->Vp};
    TPK_TRY(tpk__check(ctx, fn, "z", &z, tpk_tp_vocab_layout(ctx, ce->Vp, -1), ctx->dtype, 2, want));
    int64_t T = z.shape[0], ld = z.shape[1], v0, Vl, counted = 0;
    tpk__xent_cols(ctx, ce, &v0, &Vl);
    if (T && !targets) return tpk__fail(ctx, TPK_ERR_ARG, fn, "targets: NULL");
    for (int64_t i = 0; i < T; i++) {
        if (targets[i] == ce->ignore) continue;
        if (targets[i] < 0 || targets[i] >= ce->V)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "targets[%lld] = %d: expected a token id in 0..%lld or the ignore index %d", (long long)i,
                             targets[i], (long long)(ce->V - 1), ce->ignore);
        counted++;
    }
    size_t f = sizeof(float), n = (size_t)(T ? T : 1);
    TPK_TRY(tpk__upload_i32(ctx, &ce->targets, targets, T));
    TPK_TRY(tpk__buf_reserve(ctx, &ce->mx, f * n));
    TPK_TRY(tpk__buf_reserve(ctx, &ce->part, 3 * f * n));
    TPK_TRY(tpk__buf_reserve(ctx, &ce->lse, f * n));
    TPK_TRY(tpk__buf_reserve(ctx, &ce->loss, f * n));
    float *mx = (float *)ce->mx.p, *part = (float *)ce->part.p;
    const int32_t *tg = (const int32_t *)ce->targets.p;
    TPK_TRY(tpk_op_xent_max(ctx, mx, z.data, T, Vl, ld, ctx->dtype));
    TPK_TRY(tpk_allreduce(ctx, &ctx->tp, mx, mx, (size_t)T, TPK_F32, TPK_MAX));
    TPK_TRY(tpk_op_xent_partial(ctx, part, z.data, mx, tg, T, Vl, ld, v0, ctx->dtype));
    TPK_TRY(tpk_allreduce(ctx, &ctx->tp, part, part, 3 * (size_t)T, TPK_F32, TPK_SUM));
    TPK_TRY(tpk_op_xent_loss(ctx, (float *)ce->loss.p, (float *)ce->lse.p, mx, part, tg, T, ce->V, ce->eps, ce->ignore));
    TPK_TRY(tpk__buf_reserve(ctx, &ce->mean, 2 * sizeof(double)));
    double *mean = (double *)ce->mean.p; /* [0] the running sum, [1] the mean returned now */
    TPK_TRY(tpk_op_xent_mean(ctx, loss ? mean + 1 : mean, (const float *)ce->loss.p, T, counted, !loss && ce->nsum > 0));
    ce->z = z, ce->T = T, ce->counted = counted;
    if (!loss) {
        ce->nsum++;
        return TPK_OK;
    }
    double m = 0;
    TPK_TRY(tpk_op_memcpy(ctx, &m, mean + 1, sizeof m, ctx->ops->device ? TPK_D2H : TPK_H2H));
    *loss = (float)m; /* exact: the op stored a float */
    return TPK_OK;
}

/* *sum = the sum of the means of the forwards with loss = NULL since the last read or reset, in
 * their order (in double), *n (may be NULL) = how many; one download (a host wait) when n > 0, then
 * the sum starts again. Not collective: every TP rank holds the same value. */
static inline tpk_status tpk_xent_loss_read(tpk_ctx *ctx, tpk_xent *ce, double *sum, int64_t *n) {
    static const char *fn = "tpk_xent_loss_read";
    if (!ctx) return TPK_ERR_ARG;
    if (!ce || !ce->V) return tpk__fail(ctx, TPK_ERR_ARG, fn, "ce: expected an initialised cross-entropy");
    if (!sum) return tpk__fail(ctx, TPK_ERR_ARG, fn, "sum: NULL");
    double v = 0;
    if (ce->nsum) TPK_TRY(tpk_op_memcpy(ctx, &v, ce->mean.p, sizeof v, ctx->ops->device ? TPK_D2H : TPK_H2H));
    *sum = v;
    if (n) *n = ce->nsum;
    ce->nsum = 0;
    return TPK_OK;
}
/* Start the running sum again without reading it (no device work). */
static inline void tpk_xent_loss_reset(tpk_xent *ce) {
    if (ce) ce->nsum = 0;
}

/* dz = d(scale * mean loss)/dz, written over the logits of the last forward; *dz S(-1). */
static inline tpk_status tpk_xent_backward(tpk_ctx *ctx, tpk_xent *ce, float scale, tpk_tensor *dz) {
    static const char *fn = "tpk_xent_backward";
    if (!ctx) return TPK_ERR_ARG;
    if (!ce || !ce->V) return tpk__fail(ctx, TPK_ERR_ARG, fn, "ce: expected an initialised cross-entropy");
    if (!dz) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dz: NULL");
    if (!ce->z.ndim) return tpk__fail(ctx, TPK_ERR_ARG, fn, "backward before forward");
    int64_t T = ce->T, ld = ce->z.shape[1], v0, Vl;
    tpk__xent_cols(ctx, ce, &v0, &Vl);
    TPK_TRY(tpk__buf_reserve(ctx, &ce->dloss, sizeof(float) * (size_t)(T ? T : 1)));
    if (T) TPK_TRY(tpk_op_fill(ctx, ce->dloss.p, TPK_F32, (size_t)T, ce->counted ? scale / (float)ce->counted : 0.0f));
    TPK_TRY(tpk_op_xent_grad(ctx, ce->z.data, ce->z.data, (const float *)ce->lse.p, (const int32_t *)ce->targets.p, (const float *)ce->dloss.p, T,
                                Vl, ld, v0, ce->V, ce->eps, ce->ignore, ctx->dtype));
    *dz = ce->z;
    return TPK_OK;
}

static inline void tpk_xent_destroy(tpk_ctx *ctx, tpk_xent *ce) {
    tpk_buf *b[] = {&ce->targets, &ce->mx, &ce->part, &ce->lse, &ce->loss, &ce->dloss, &ce->mean};
    for (int i = 0; i < 7; i++) tpk__buf_free(ctx, b[i]);
    ce->nsum = 0;
}

#endif /* TPK_XENT_H */
