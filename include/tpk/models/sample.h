/* tpk/models/sample.h — sampling from a vocabulary-parallel LM head.
 *
 * The logits of one position are split over TP (rank r holds columns [v0, v0 + V_r)): they are
 * gathered over ctx->tp into the whole row, of which the first `vocab` columns are drawn from (the
 * rest a padded vocabulary's padding, never drawn). The controls (tpk_sample_opts) are Hugging Face
 * generate's: temperature 0 is greedy (the largest logit, ties to the lowest id); else p =
 * softmax(z / temperature) in double, top_k keeps the logits at least the k-th largest (HF's
 * TopKLogitsWarper: every logit equal to the k-th too), top_p then the nucleus (in descending
 * order, each token whose predecessors' probability is below top_p: HF's TopPLogitsWarper; at least
 * one), p renormalised over what is kept; the token is the first kept j (in id order) with
 * sum_{kept i <= j} p_i > u, u = uniform(seed, stream("sample"), i) — the same draw on every rank,
 * so every rank of every group picks the same token without another collective. Filters off (top_k
 * 0, top_p 1), the sum runs over every column as it did before the filters: the same token, bit for
 * bit. A model's generation (tpk_lm_generate, tpk_lm_sample: tpk/models/lm.h, through
 * tpk__generate_run) continues a prompt token by token, the last `positions` tokens as the context
 * (a sliding window), recomputing the forward each step; draw i gives the prompt's i-th new
 * token. Under context parallelism (ctx->cp, c > 1) each step's window runs split over the CP group
 * like a training sequence (tpk_lm_generate pads it at the end to a multiple of 2c: causal, so the
 * padding changes no logit before it); the CP rank holding the window's last position draws the
 * token (with its TP group) and gives it to the others (one all-reduce of an int32 over ctx->cp),
 * so every rank continues with the same token. */
#ifndef TPK_SAMPLE_H
#define TPK_SAMPLE_H

#include "../layers/cp_split.h"
#include "../layers/layout.h"

/* The sampling controls (HF generate's temperature, top_k, top_p). */
typedef struct tpk_sample_opts {
    float temperature; /* > 0: softmax(z / temperature); 0: greedy (argmax, ties: lowest id) */
    int top_k;         /* 0: off; k: only the logits >= the k-th largest (ties kept, as HF's) */
    float top_p;       /* 1: off; 0 < p < 1: only the nucleus of probability p (after top_k) */
} tpk_sample_opts;

/* temperature 1, no filter: plain sampling from softmax(z) */
static inline tpk_sample_opts tpk_sample_defaults(void) {
    tpk_sample_opts o;
    o.temperature = 1.0f, o.top_k = 0, o.top_p = 1.0f;
    return o;
}

/* opts checked; pre names them in the message ("opts->" or "") */
static inline tpk_status tpk__sample_opts_check(tpk_ctx *ctx, const char *fn, const char *pre,
                                                const tpk_sample_opts *o) {
    if (!(o->temperature >= 0) || isinf(o->temperature))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "%stemperature: expected a finite value >= 0 (0: greedy), got %g", pre,
                         (double)o->temperature);
    if (o->top_k < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%stop_k: expected >= 0 (0: off), got %d", pre,
                         o->top_k);
    if (!(o->top_p > 0 && o->top_p <= 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%stop_p: expected 0 < top_p <= 1 (1: off), got %g",
                         pre, (double)o->top_p);
    return TPK_OK;
}

/* A logit and its id, sorted by logit descending then id ascending (NaN as -inf: a total order,
 * so every rank's qsort gives the same order). */
typedef struct tpk__sample_rank {
    float z;
    int32_t id;
} tpk__sample_rank;
static inline int tpk__sample_rank_cmp(const void *pa, const void *pb) {
    const tpk__sample_rank *a = (const tpk__sample_rank *)pa, *b = (const tpk__sample_rank *)pb;
    float za = isnan(a->z) ? -INFINITY : a->z, zb = isnan(b->z) ? -INFINITY : b->z;
    if (za != zb) return za > zb ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* The token drawn from the logits z[0..V) (V >= 1) under opts with the uniform u; r (V entries)
 * and keep (V bytes) are scratch, used only when a filter is on. */
static inline int32_t tpk__sample_draw(const float *z, int64_t V, const tpk_sample_opts *o,
                                       double u, tpk__sample_rank *r, unsigned char *keep) {
    const float T = o->temperature;
    if (T == 0) { /* greedy: the first largest (NaN never chosen over a number) */
        int64_t best = 0;
        for (int64_t j = 1; j < V; j++)
            if (z[j] > z[best] || (isnan(z[best]) && !isnan(z[j]))) best = j;
        return (int32_t)best;
    }
    int64_t k = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    if (k == V && !(o->top_p < 1)) { /* no filter: as before the filters, bit for bit */
        double mx = -INFINITY, s = 0, c = 0;
        for (int64_t j = 0; j < V; j++) mx = fmax(mx, z[j] / T);
        for (int64_t j = 0; j < V; j++) s += exp(z[j] / T - mx);
        for (int64_t j = 0; j < V; j++)
            if ((c += exp(z[j] / T - mx) / s) > u) return (int32_t)j;
        return (int32_t)(V - 1);
    }
    for (int64_t j = 0; j < V; j++) r[j].z = z[j], r[j].id = (int32_t)j;
    qsort(r, (size_t)V, sizeof *r, tpk__sample_rank_cmp);
    while (k < V && r[k].z == r[k - 1].z) k++; /* top_k keeps every logit equal to the k-th */
    double mx = -INFINITY;
    for (int64_t j = 0; j < V; j++) mx = fmax(mx, z[j] / T);
    if (o->top_p < 1) { /* the nucleus of the top k: while the mass before stays below top_p */
        double s = 0, c = 0;
        for (int64_t q = 0; q < k; q++) s += exp(r[q].z / T - mx);
        int64_t q = 0;
        for (; q < k && (q == 0 || c < o->top_p); q++) c += exp(r[q].z / T - mx) / s;
        k = q;
    }
    memset(keep, 0, (size_t)V);
    int32_t last = 0;
    for (int64_t q = 0; q < k; q++) {
        keep[r[q].id] = 1;
        if (r[q].id > last) last = r[q].id;
    }
    double s = 0, c = 0;
    for (int64_t j = 0; j < V; j++)
        if (keep[j]) s += exp(z[j] / T - mx);
    for (int64_t j = 0; j < V; j++)
        if (keep[j] && (c += exp(z[j] / T - mx) / s) > u) return (int32_t)j;
    return last;
}

/* tpk_sample_logits_opts, failures named fn */
static inline tpk_status tpk__sample_logits(tpk_ctx *ctx, const char *fn, tpk_tensor logits,
                                            int64_t vocab, int64_t row, const tpk_sample_opts *opts,
                                            uint64_t seed, uint64_t i, int32_t *tok) {
    if (!ctx) return TPK_ERR_ARG;
    if (!tok) return tpk__fail(ctx, TPK_ERR_ARG, fn, "tok: NULL");
    tpk_sample_opts o = opts ? *opts : tpk_sample_defaults();
    TPK_TRY(tpk__sample_opts_check(ctx, fn, opts ? "opts->" : "", &o));
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
    bool filter = o.temperature > 0 && ((o.top_k > 0 && o.top_k < Vr) || o.top_p < 1);
    size_t *counts = (size_t *)tpk__malloc(ctx, sizeof(size_t) * (size_t)t);
    float *all = (float *)tpk__malloc(ctx, sizeof(float) * (size_t)V);
    tpk__sample_rank *r =
        filter ? (tpk__sample_rank *)tpk__malloc(ctx, (sizeof(tpk__sample_rank) + 1) * (size_t)Vr)
               : NULL;
    tpk_status s = counts && all && (r || !filter)
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
    if (s == TPK_OK)
        *tok = tpk__sample_draw(all, Vr, &o, tpk_rng_uniform(seed, tpk_rng_stream("sample"), i), r,
                                r ? (unsigned char *)(r + Vr) : NULL);
    tpk__free(ctx, counts), tpk__free(ctx, all), tpk__free(ctx, r);
    return s;
}
/* *tok = a token in 0..vocab-1 drawn from row `row` of logits S(-1) [T, Vp] (split as the
 * vocabulary: layout tpk_tp_vocab_layout(ctx, Vp, -1)) under opts (NULL: tpk_sample_defaults())
 * (draw index i); vocab = 0: all Vp columns. Collective over TP. */
static inline tpk_status tpk_sample_logits_opts(tpk_ctx *ctx, tpk_tensor logits, int64_t vocab,
                                                int64_t row, const tpk_sample_opts *opts,
                                                uint64_t seed, uint64_t i, int32_t *tok) {
    return tpk__sample_logits(ctx, "tpk_sample_logits_opts", logits, vocab, row, opts, seed, i,
                              tok);
}
/* The same at a temperature alone (top_k 0, top_p 1: no filter; 0: greedy). */
static inline tpk_status tpk_sample_logits(tpk_ctx *ctx, tpk_tensor logits, int64_t vocab,
                                           int64_t row, float temperature, uint64_t seed,
                                           uint64_t i, int32_t *tok) {
    static const char *fn = "tpk_sample_logits";
    tpk_sample_opts o = tpk_sample_defaults();
    o.temperature = temperature;
    if (ctx && tpk__sample_opts_check(ctx, fn, "", &o) != TPK_OK) return TPK_ERR_ARG;
    return tpk__sample_logits(ctx, fn, logits, vocab, row, &o, seed, i, tok);
}

/* The token drawn from row `row` of z (row < 0: this CP rank does not hold the window's last
 * position), the same on every rank of the CP group: the holder's draw given to the others. */
static inline tpk_status tpk__generate_pick(tpk_ctx *ctx, const char *fn, tpk_tensor z,
                                            int64_t vocab, int64_t row, const tpk_sample_opts *o,
                                            uint64_t seed, uint64_t i, int32_t *tok) {
    if (tpk_cp_size(ctx) == 1) return tpk__sample_logits(ctx, fn, z, vocab, row, o, seed, i, tok);
    int32_t t = -1; /* the holder's token; -1 from the others (and from a holder that failed) */
    tpk_status s = row >= 0 ? tpk__sample_logits(ctx, fn, z, vocab, row, o, seed, i, &t) : TPK_OK;
    if (s != TPK_OK) t = -1;
    tpk_status a = tpk_allreduce_host(ctx, &ctx->cp, &t, 1, TPK_I32, TPK_MAX);
    TPK_TRY(s);
    TPK_TRY(a);
    if (t < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "draw %llu: the CP rank holding the window's last position drew no token "
                         "(it failed)",
                         (unsigned long long)i);
    *tok = t;
    return TPK_OK;
}

/* out[0..n_prompt) = prompt, out[n_prompt..n_prompt + n): n tokens drawn one after another (draw
 * i for out[n_prompt + i]) under opts (NULL: tpk_sample_defaults()), logits(m, window, &z, &row)
 * giving the logits z of the window (the last `positions` tokens) and the row of its last position
 * in z (under context parallelism -1 on the CP ranks that do not hold it). out may be prompt. */
static inline tpk_status tpk__generate_run(tpk_ctx *ctx, const char *fn, void *m,
                                           tpk_status (*logits)(tpk_ctx *, void *, const int32_t *,
                                                                int64_t, tpk_tensor *, int64_t *),
                                           int64_t vocab, int64_t positions, const int32_t *prompt,
                                           int n_prompt, int n, const tpk_sample_opts *opts,
                                           uint64_t seed, int32_t *out) {
    tpk_sample_opts o = opts ? *opts : tpk_sample_defaults();
    TPK_TRY(tpk__sample_opts_check(ctx, fn, "opts->", &o));
    if (!prompt) return tpk__fail(ctx, TPK_ERR_ARG, fn, "prompt: NULL");
    if (n_prompt < 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "n_prompt: expected >= 1 token, got %d", n_prompt);
    if (n < 0 || n > INT32_MAX - n_prompt)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "n: expected 0..%d (n_prompt + n fits an int), got %d",
                         INT32_MAX - n_prompt, n);
    for (int j = 0; j < n_prompt; j++)
        if (prompt[j] < 0 || prompt[j] >= vocab)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "prompt[%d]: expected a token id in 0..%lld (the vocabulary of %lld), "
                             "got %d",
                             j, (long long)vocab - 1, (long long)vocab, (int)prompt[j]);
    if (out != prompt) memmove(out, prompt, sizeof(int32_t) * (size_t)n_prompt);
    for (int i = 0; i < n; i++) {
        int64_t len = (int64_t)n_prompt + i, S = len < positions ? len : positions;
        tpk_tensor z;
        int64_t row = -1;
        TPK_TRY(logits(ctx, m, out + len - S, S, &z, &row));
        TPK_TRY(tpk__generate_pick(ctx, fn, z, vocab, row, &o, seed, (uint64_t)i, &out[len]));
    }
    return TPK_OK;
}
#endif /* TPK_SAMPLE_H */
