/* tpk/layers/xent.h — vocabulary-parallel cross-entropy (the loss of an LM head whose logits are
 * split over the vocabulary, e.g. GPT-2's tied head).
 *
 * Over logits z S(-1) [T, V] (rank r holds columns [v0, v0 + V_r)):
 *   forward   each rank, in one read of its logits: per row the running max m_r and
 *             s_r = sum exp(z - m_r) (online softmax), z_target (or 0), sum z — gathered over TP
 *             (one all-gather of [T, 4] per rank; none at t = 1); then per row, in rank order,
 *             M = max m_r, lse = M + log sum_r s_r exp(m_r - M),
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
 *   fused     a deferred forward (tpk_xent_forward_deferred) leaves the loss to the backward,
 *             which computes loss and gradient together: at t = 1 one pass per row (xent_fused:
 *             the logits read once, the gradient written once, instead of two reads before the
 *             backward's read and write); under TP in chunks of desc->chunk_rows rows (statistics,
 *             all-gather, loss, gradient per chunk, so a chunk's second read can come from cache).
 *             The same bits as the forward and backward apart.
 * A padded vocabulary (desc->padded_vocab = Vp > V, the logits of a head over tpk_embedding's
 * padded table): z is S(-1) [T, Vp]; the columns >= V are left out of the max, the sums and the
 * loss, and their gradient is zero. The columns are split as the vocabulary is
 * (tpk_tp_vocab_split; z's layout tpk_tp_vocab_layout(ctx, Vp, -1): S(-1), in units of 64 columns
 * under TP weights when Vp is a multiple of 64).
 * Context parallelism (ctx->cp, c > 1: each rank holds its share of every sequence's rows,
 * tpk/layers/cp_split.h): the loss is the mean over the counted positions of all CP ranks — the
 * counts summed over ctx->cp (one host all-reduce per forward), each rank's mean its rows' sum over
 * that total (so the gradient's scale / counted is the total's too), the means summed over ctx->cp
 * where the host reads them (a forward's *loss: one f64 all-reduce; tpk_xent_loss_read: on the
 * running sum it downloads). Every CP rank then holds the same value. */
#ifndef TPK_XENT_H
#define TPK_XENT_H

#include "cp_split.h"
#include "params.h"

typedef struct tpk_xent_desc {
    float label_smoothing;    /* eps in [0, 1), over the global vocabulary */
    bool set_ignore_index;    /* use ignore_index below instead of the default -100 */
    int32_t ignore_index;
    int64_t padded_vocab;     /* the logits' global columns Vp >= V (0: V) */
    int64_t chunk_rows;       /* rows per pass of a fused loss and gradient under TP (0: all rows in
                                 one pass) */
} tpk_xent_desc;

typedef struct tpk_xent {
    float eps;
    int32_t ignore;
    int64_t V, Vp, T, counted, chunk; /* counted: over every CP rank's rows (ctx->cp) */
    tpk_tensor z;             /* the logits of the last forward (overwritten by backward) */
    tpk_buf targets, part, lse, loss, dloss;
    tpk_buf mean;             /* f64 [2] in backend memory: the running sum of means (loss = NULL
                                 forwards), the last mean returned */
    int64_t nsum;             /* forwards in the running sum since the last read or reset */
    bool pending, pending_sum; /* a deferred forward's loss is still to compute; its mean joins the
                                  running sum */
    size_t *counts;           /* [tp.size] the all-gather's counts (host) */
} tpk_xent;

static inline tpk_status tpk_xent_init(tpk_ctx *ctx, tpk_xent *ce, int64_t V,
                                       const tpk_xent_desc *desc) {
    static const char *fn = "tpk_xent_init";
    tpk_xent_desc d;
    TPK__INIT_LAYER(ctx, fn, ce, d, desc);
    if (V < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "V: expected >= 1, got %lld", (long long)V);
    if (!(d.label_smoothing >= 0 && d.label_smoothing < 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->label_smoothing: expected 0 <= eps < 1, got %g",
                         (double)d.label_smoothing);
    if (d.padded_vocab && d.padded_vocab < V)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "desc->padded_vocab: expected >= V = %lld (or 0), got %lld", (long long)V,
                         (long long)d.padded_vocab);
    if (d.chunk_rows < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->chunk_rows: expected >= 0 (0: all rows at once), got %lld",
                         (long long)d.chunk_rows);
    ce->counts = (size_t *)tpk__calloc(ctx, (size_t)ctx->tp.size, sizeof(size_t));
    if (!ce->counts) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "counts: out of host memory");
    ce->V = V, ce->Vp = d.padded_vocab ? d.padded_vocab : V, ce->eps = d.label_smoothing,
    ce->ignore = d.set_ignore_index ? d.ignore_index : -100;
    ce->chunk = d.chunk_rows;
    return TPK_OK;
}

/* This rank's columns of the logits: the first v0 (global), how many are real (not padding). */
static inline void tpk__xent_cols(const tpk_ctx *ctx, const tpk_xent *ce, int64_t *v0,
                                  int64_t *real) {
    tpk_range r = tpk_tp_vocab_split(ctx, ce->Vp, ctx->tp.rank);
    int64_t n = ce->V - r.off;
    *v0 = r.off, *real = n < 0 ? 0 : n < r.size ? n : r.size;
}

/* Rows [r0, r0 + n) of the last forward's logits: this rank's statistics (one read), gathered over
 * TP in rank order (one all-gather; none at t = 1), then each row's loss and lse. */
static inline tpk_status tpk__xent_rows(tpk_ctx *ctx, tpk_xent *ce, int64_t r0, int64_t n) {
    int64_t ld = ce->z.shape[1], v0, Vl, P = ctx->tp.size;
    tpk__xent_cols(ctx, ce, &v0, &Vl);
    const char *z = (const char *)ce->z.data + (size_t)(r0 * ld) * tpk_dtype_size(ctx->dtype);
    const int32_t *tg = (const int32_t *)ce->targets.p + r0;
    float *all = (float *)ce->part.p, *mine = P > 1 ? all + 4 * P * n : all; /* [P, n, 4], [n, 4] */
    TPK_TRY(tpk_op_xent_stats(ctx, mine, z, tg, n, Vl, ld, v0, ctx->dtype));
    if (P > 1) {
        for (int64_t q = 0; q < P; q++) ce->counts[q] = (size_t)(4 * n);
        TPK_TRY(tpk_allgatherv(ctx, &ctx->tp, mine, (size_t)(4 * n), all, ce->counts,
                               (size_t)(4 * P * n), TPK_F32));
    }
    return tpk_op_xent_loss(ctx, (float *)ce->loss.p + r0, (float *)ce->lse.p + r0, all, P, tg, n,
                            ce->V, ce->eps, ce->ignore);
}

/* The mean of the last forward's losses: into the running sum (sum: after a read or reset it starts
 * again) or, with sum = false, into the slot a forward with a loss pointer downloads. */
static inline tpk_status tpk__xent_mean(tpk_ctx *ctx, tpk_xent *ce, bool sum) {
    double *mean = (double *)ce->mean.p; /* [0] the running sum, [1] the mean returned now */
    TPK_TRY(tpk_op_xent_mean(ctx, sum ? mean : mean + 1, (const float *)ce->loss.p, ce->T,
                             ce->counted, sum && ce->nsum > 0));
    if (sum) ce->nsum++;
    return TPK_OK;
}

/* A deferred forward's loss, computed now (no gradient); nothing when none is pending. A trainer
 * need not call it: tpk_xent_backward, tpk_xent_loss_read and the next forward settle it. */
static inline tpk_status tpk_xent_settle(tpk_ctx *ctx, tpk_xent *ce) {
    if (!ctx) return TPK_ERR_ARG;
    if (!ce || !ce->pending) return TPK_OK;
    ce->pending = false;
    TPK_TRY(tpk__xent_rows(ctx, ce, 0, ce->T));
    return ce->pending_sum ? tpk__xent_mean(ctx, ce, true) : TPK_OK;
}

/* Checks z and the targets, uploads the targets and sizes the buffers: the forward's common
 * part. */
static inline tpk_status tpk__xent_prepare(tpk_ctx *ctx, tpk_xent *ce, tpk_tensor z,
                                           const int32_t *targets, const char *fn) {
    int64_t want[2] = {-1, ce->Vp};
    TPK_TRY(
        tpk__check(ctx, fn, "z", &z, tpk_tp_vocab_layout(ctx, ce->Vp, -1), ctx->dtype, 2, want));
    TPK_TRY(tpk__cp_rows_check(ctx, fn, "z", &z)); /* the mean is over every CP rank's rows */
    int64_t T = z.shape[0], counted = 0;
    if (T && !targets) return tpk__fail(ctx, TPK_ERR_ARG, fn, "targets: NULL");
    for (int64_t i = 0; i < T; i++) {
        if (targets[i] == ce->ignore) continue;
        if (targets[i] < 0 || targets[i] >= ce->V)
            return tpk__fail(
                ctx, TPK_ERR_ARG, fn,
                "targets[%lld] = %d: expected a token id in 0..%lld or the ignore index %d",
                (long long)i, targets[i], (long long)(ce->V - 1), ce->ignore);
        counted++;
    }
    if (tpk_cp_size(ctx) > 1) { /* the mean over every CP rank's counted positions */
        double all = (double)counted;
        TPK_TRY(tpk_allreduce_host(ctx, &ctx->cp, &all, 1, TPK_F64, TPK_SUM));
        counted = (int64_t)all;
    }
    size_t f = sizeof(float), n = (size_t)(T ? T : 1), P = (size_t)ctx->tp.size;
    TPK_TRY(tpk__upload_i32(ctx, &ce->targets, targets, T));
    TPK_TRY(tpk__buf_reserve(ctx, &ce->part, 4 * f * n * (P > 1 ? P + 1 : 1)));
    TPK_TRY(tpk__buf_reserve(ctx, &ce->lse, f * n));
    TPK_TRY(tpk__buf_reserve(ctx, &ce->loss, f * n));
    TPK_TRY(tpk__buf_reserve(ctx, &ce->mean, 2 * sizeof(double)));
    ce->z = z, ce->T = T, ce->counted = counted;
    return TPK_OK;
}

/* The mean over counted positions of the cross-entropy of logits z S(-1) [T, Vp] against targets
 * [T] (host memory; each in 0..V-1 or the ignore index). One collective (an all-gather; none at
 * t = 1). loss != NULL: *loss = the mean (one download: the host waits); loss = NULL: the mean
 * stays in backend memory, added to the running sum that tpk_xent_loss_read returns (no download,
 * no wait). A deferred forward before this one is settled first. Under context parallelism the
 * mean of every CP rank's rows (collective over ctx->cp: the counts, and the mean with a loss
 * pointer). */
static inline tpk_status tpk_xent_forward(tpk_ctx *ctx, tpk_xent *ce, tpk_tensor z,
                                          const int32_t *targets, float *loss) {
    static const char *fn = "tpk_xent_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!ce || !ce->V)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "ce: expected an initialised cross-entropy");
    TPK_TRY(tpk_xent_settle(ctx, ce));
    TPK_TRY(tpk__xent_prepare(ctx, ce, z, targets, fn));
    TPK_TRY(tpk__xent_rows(ctx, ce, 0, ce->T));
    TPK_TRY(tpk__xent_mean(ctx, ce, !loss));
    if (!loss) return TPK_OK;
    if (tpk_cp_size(ctx) > 1) /* this rank's share of the mean, summed over CP */
        TPK_TRY(tpk_allreduce(ctx, &ctx->cp, (double *)ce->mean.p + 1, (double *)ce->mean.p + 1, 1,
                              TPK_F64, TPK_SUM));
    double m = 0;
    TPK_TRY(tpk_op_memcpy(ctx, &m, (double *)ce->mean.p + 1, sizeof m,
                          ctx->ops->device ? TPK_D2H : TPK_H2H));
    *loss = (float)m; /* exact: the op stored a float */
    return TPK_OK;
}

/* A forward whose loss waits for the backward: the arguments are checked and the targets uploaded
 * now; tpk_xent_backward then computes the loss and the gradient together (fused: the logits read
 * once at t = 1), and the mean joins the running sum as a forward with loss = NULL. z must not
 * change until the loss is settled: by the backward, tpk_xent_settle, tpk_xent_loss_read or the
 * next forward, whichever comes first (a model settles before its next forward writes the
 * logits). */
static inline tpk_status tpk_xent_forward_deferred(tpk_ctx *ctx, tpk_xent *ce, tpk_tensor z,
                                                   const int32_t *targets) {
    static const char *fn = "tpk_xent_forward_deferred";
    if (!ctx) return TPK_ERR_ARG;
    if (!ce || !ce->V)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "ce: expected an initialised cross-entropy");
    TPK_TRY(tpk_xent_settle(ctx, ce));
    TPK_TRY(tpk__xent_prepare(ctx, ce, z, targets, fn));
    ce->pending = ce->pending_sum = true;
    return TPK_OK;
}

/* *sum = the sum of the means of the forwards with loss = NULL since the last read or reset, in
 * their order (in double), *n (may be NULL) = how many; one download (a host wait) when n > 0, then
 * the sum starts again. A deferred forward is settled first. Not collective unless a deferred
 * forward is pending (its settling gathers over TP): every TP rank holds the same value. Under
 * context parallelism collective over ctx->cp when n > 0 (each rank's shares of the means summed:
 * every CP rank holds the mean of all their rows). */
static inline tpk_status tpk_xent_loss_read(tpk_ctx *ctx, tpk_xent *ce, double *sum, int64_t *n) {
    static const char *fn = "tpk_xent_loss_read";
    if (!ctx) return TPK_ERR_ARG;
    if (!ce || !ce->V)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "ce: expected an initialised cross-entropy");
    if (!sum) return tpk__fail(ctx, TPK_ERR_ARG, fn, "sum: NULL");
    TPK_TRY(tpk_xent_settle(ctx, ce));
    double v = 0;
    if (ce->nsum)
        TPK_TRY(tpk_op_memcpy(ctx, &v, ce->mean.p, sizeof v, ctx->ops->device ? TPK_D2H : TPK_H2H));
    if (ce->nsum && tpk_cp_size(ctx) > 1)
        TPK_TRY(tpk_allreduce_host(ctx, &ctx->cp, &v, 1, TPK_F64, TPK_SUM));
    *sum = v;
    if (n) *n = ce->nsum;
    ce->nsum = 0;
    return TPK_OK;
}
/* Start the running sum again without reading it (no device work); a pending deferred forward's
 * mean is left out as well. */
static inline void tpk_xent_loss_reset(tpk_xent *ce) {
    if (ce) ce->nsum = 0, ce->pending_sum = false;
}

/* dz = d(scale * mean loss)/dz, written over the logits of the last forward; *dz S(-1). After a
 * deferred forward: its loss too, in the same pass (at t = 1 one kernel: xent_fused). */
static inline tpk_status tpk_xent_backward(tpk_ctx *ctx, tpk_xent *ce, float scale,
                                           tpk_tensor *dz) {
    static const char *fn = "tpk_xent_backward";
    if (!ctx) return TPK_ERR_ARG;
    if (!ce || !ce->V)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "ce: expected an initialised cross-entropy");
    if (!dz) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dz: NULL");
    if (!ce->z.ndim) return tpk__fail(ctx, TPK_ERR_ARG, fn, "backward before forward");
    if (!isfinite(scale))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "scale: expected a finite number, got %g",
                         (double)scale);
    int64_t T = ce->T, ld = ce->z.shape[1], v0, Vl;
    tpk__xent_cols(ctx, ce, &v0, &Vl);
    float g = ce->counted ? scale / (float)ce->counted : 0.0f;
    bool fused = ce->pending;
    ce->pending = false;
    if (fused && ctx->tp.size == 1) {
        TPK_TRY(tpk_op_xent_fused(ctx, ce->z.data, (float *)ce->loss.p, (float *)ce->lse.p,
                                  ce->z.data, (const int32_t *)ce->targets.p, T, ce->V, ld, ce->eps,
                                  ce->ignore, g, ctx->dtype));
    } else {
        TPK_TRY(tpk__buf_reserve(ctx, &ce->dloss, sizeof(float) * (size_t)(T ? T : 1)));
        if (T) TPK_TRY(tpk_op_fill(ctx, ce->dloss.p, TPK_F32, (size_t)T, g));
        int64_t step = fused && ce->chunk > 0 && ce->chunk < T ? ce->chunk : T;
        for (int64_t r0 = 0; r0 < T; r0 += step) { /* fused: a chunk's loss, then its gradient */
            int64_t n = T - r0 < step ? T - r0 : step;
            void *zc = (char *)ce->z.data + (size_t)(r0 * ld) * tpk_dtype_size(ctx->dtype);
            if (fused) TPK_TRY(tpk__xent_rows(ctx, ce, r0, n));
            TPK_TRY(tpk_op_xent_grad(ctx, zc, zc, (const float *)ce->lse.p + r0,
                                     (const int32_t *)ce->targets.p + r0,
                                     (const float *)ce->dloss.p + r0, n, Vl, ld, v0, ce->V, ce->eps,
                                     ce->ignore, ctx->dtype));
        }
    }
    if (fused && ce->pending_sum) TPK_TRY(tpk__xent_mean(ctx, ce, true));
    *dz = ce->z;
    return TPK_OK;
}

static inline void tpk_xent_destroy(tpk_ctx *ctx, tpk_xent *ce) {
    tpk_buf *b[] = {&ce->targets, &ce->part, &ce->lse, &ce->loss, &ce->dloss, &ce->mean};
    for (int i = 0; i < 6; i++) tpk__buf_free(ctx, b[i]);
    tpk__free(ctx, ce->counts);
    ce->counts = NULL, ce->nsum = 0, ce->pending = ce->pending_sum = false;
}

#endif /* TPK_XENT_H */
