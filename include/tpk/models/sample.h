/* tpk/models/sample.h — sampling from a vocabulary-parallel LM head.
 *
 * The logits of one position are split over TP (rank r holds columns [v0, v0 + V_r)): they are
 * gathered over ctx->tp into the whole row, p = softmax(z / temperature) in double over the first
 * `vocab` columns (the rest a padded vocabulary's padding, never drawn), and the token
 * is the first j with sum_{i <= j} p_i > u, u = uniform(seed, stream("sample"), i) — the same
 * draw on every rank, so every rank of every group picks the same token without another
 * collective. A family's sampling (tpk_gpt2_sample, tpk_llama_sample, in its own header) continues
 * a sequence token by token through tpk__lm_sample, the last `positions` tokens as the context (a
 * sliding window), recomputing the forward each step. */
#ifndef TPK_SAMPLE_H
#define TPK_SAMPLE_H

#include "lm.h"

/* *tok = a token in 0..vocab-1 drawn from row `row` of logits S(-1) [T, Vp] (split as the
 * vocabulary: layout tpk_tp_vocab_layout(ctx, Vp, -1)) (draw index i); vocab = 0: all Vp columns.
 * Collective over TP. */
static inline tpk_status tpk_sample_logits(tpk_ctx *ctx, tpk_tensor logits, int64_t vocab,
                                           int64_t row, float temperature, uint64_t seed,
                                           uint64_t i, int32_t *tok) {
    static const char *fn = "tpk_sample_logits";
    if (!ctx) return TPK_ERR_ARG;
    if (!tok) return tpk__fail(ctx, TPK_ERR_ARG, fn, "tok: NULL");
    if (!(temperature > 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "temperature: expected > 0, got %g",
                         (double)temperature);
    int64_t want[2] = {-1, -1};
    TPK_TRY(tpk__check(ctx, fn, "logits", &logits, tpk_tp_vocab_layout(ctx, logits.gshape[1], -1),
                       logits.dtype, 2, want));
    if (logits.dtype != TPK_F32 && logits.dtype != TPK_BF16)
        return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "logits: expected f32 or bf16, got %s",
                         tpk_dtype_name(logits.dtype));
    if (row < 0 || row >= logits.shape[0])
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "row: expected 0..%lld, got %lld",
                         (long long)logits.shape[0] - 1, (long long)row);
    if (vocab < 0 || vocab > logits.gshape[1])
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "vocab: expected 0..%lld (the logits' columns), got %lld",
                         (long long)logits.gshape[1], (long long)vocab);
    int t = ctx->tp.size;
    int64_t V = logits.gshape[1], Vl = logits.shape[1],
            Vr = vocab ? vocab : V; /* gathered, drawn from */
    size_t *counts = (size_t *)malloc(sizeof(size_t) * (size_t)t);
    float *all = (float *)malloc(sizeof(float) * (size_t)V);
    tpk_status s = counts && all
                       ? TPK_OK
                       : tpk__fail(ctx, TPK_ERR_NOMEM, fn, "a row of %lld logits", (long long)V);
    for (int q = 0; s == TPK_OK && q < t; q++)
        counts[q] = (size_t)tpk_tp_vocab_split(ctx, V, q).size;
    /* this rank's part of the row as f32 in backend memory, gathered over TP, copied to the host */
    if (s == TPK_OK) s = tpk__buf_reserve(ctx, &ctx->work[0], sizeof(float) * (size_t)(Vl + V + 1));
    float *mine = (float *)ctx->work[0].p, *row_all = mine + Vl;
    const void *src = (const char *)logits.data + (size_t)(row * Vl) * tpk_dtype_size(logits.dtype);
    if (s == TPK_OK && Vl) s = tpk_op_cast(ctx, mine, TPK_F32, src, logits.dtype, (size_t)Vl);
    if (s == TPK_OK)
        s = tpk_allgatherv(ctx, &ctx->tp, mine, (size_t)Vl, row_all, counts, (size_t)V, TPK_F32);
    if (s == TPK_OK)
        s = tpk_op_memcpy(ctx, all, row_all, sizeof(float) * (size_t)V,
                          ctx->ops->device ? TPK_D2H : TPK_H2H);
    if (s == TPK_OK) {
        double mx = -INFINITY, z = 0, c = 0, u = tpk_rng_uniform(seed, tpk_rng_stream("sample"), i);
        for (int64_t j = 0; j < Vr; j++) mx = fmax(mx, all[j] / temperature);
        for (int64_t j = 0; j < Vr; j++) z += exp(all[j] / temperature - mx);
        *tok = (int32_t)(Vr - 1);
        for (int64_t j = 0; j < Vr; j++)
            if ((c += exp(all[j] / temperature - mx) / z) > u) {
                *tok = (int32_t)j;
                break;
            }
    }
    free(counts), free(all);
    return s;
}

/* out[0] = start, out[1..n]: n tokens drawn one after another, logits(m, window) giving the
 * logits of the window (the last `positions` tokens). */
static inline tpk_status tpk__sample_run(tpk_ctx *ctx, const char *fn, void *m,
                                         tpk_status (*logits)(tpk_ctx *, void *, const int32_t *,
                                                              int64_t, tpk_tensor *),
                                         int64_t vocab, int64_t positions, int32_t start, int n,
                                         float temperature, uint64_t seed, int32_t *out) {
    if (n < 0) return tpk__fail(ctx, TPK_ERR_ARG, fn, "n: expected >= 0, got %d", n);
    if (start < 0 || start >= vocab)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "start: expected a token id in 0..%lld, got %d",
                         (long long)vocab - 1, start);
    out[0] = start;
    for (int i = 0; i < n; i++) {
        int64_t len = i + 1, S = len < positions ? len : positions;
        tpk_tensor z;
        TPK_TRY(logits(ctx, m, out + len - S, S, &z));
        TPK_TRY(
            tpk_sample_logits(ctx, z, vocab, S - 1, temperature, seed, (uint64_t)i, &out[i + 1]));
    }
    return TPK_OK;
}
/* The logits callback for a model of the skeleton (tpk/models/lm.h): m is its tpk__lm_parts. */
static inline tpk_status tpk__lm_sample_logits(tpk_ctx *ctx, void *m, const int32_t *ids, int64_t S,
                                               tpk_tensor *z) {
    return tpk__lm_logits(ctx, "tpk_lm_sample", (tpk__lm_parts *)m, ids, S, z);
}
/* A model of the skeleton's sampling; p = NULL: not initialised. */
static inline tpk_status tpk__lm_sample(tpk_ctx *ctx, const char *fn, tpk__lm_parts *p,
                                        int64_t vocab, int64_t positions, int32_t start, int n,
                                        float temperature, uint64_t seed, int32_t *out) {
    if (!ctx) return TPK_ERR_ARG;
    if (!p || !out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", out ? "model" : "out");
    return tpk__sample_run(ctx, fn, p, tpk__lm_sample_logits, vocab, positions, start, n,
                           temperature, seed, out);
}

#endif /* TPK_SAMPLE_H */
