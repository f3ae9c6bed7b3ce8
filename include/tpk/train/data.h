/* tpk/train/data.h — token data for a trainer: llm.c token shards, byte text, and the batch windows
 * each data-parallel rank reads.
 *
 * llm.c shard: a header of 256 little-endian int32 (magic 20240520, version 1, token count n),
 *   then n uint16 tokens; every token must be below the model's vocabulary.
 * Text: any file, one token per byte (vocabulary 256), or the ids of a tokenizer
 *   (tpk/text/tokenizer.h); the last 10% (at least one batch window) is the validation split.
 * Batches (llm.c's loader): batch k of DP rank d of dp ranks reads the B*S + 1 tokens at
 *   window w = (k dp + d) mod W, W = (n - 1) / (B S) windows, offset w B S; inputs are tokens
 *   [i, i + B S), targets the next token of each. Batch k is a function of k alone, so a
 *   resume sees the same batches. With micro-batch sizes per DP rank (tpk_data_dp_batches) rank d
 *   reads sequences k Btot + off_d .. + B_d: the group reads one Btot-sequence batch.
 * Errors name the file: TPK_ERR_IO (cannot open or read), TPK_ERR_FORMAT (bad magic, version,
 * length, token), TPK_ERR_SHAPE (too little data for one batch). Host memory only; no
 * communication. */
#ifndef TPK_DATA_H
#define TPK_DATA_H

#include <errno.h>
#include <math.h>

#include "../base/ctx.h"

typedef struct tpk_tokens {
    int32_t *tok; /* [n] */
    int64_t n;
    tpk_allocator al; /* tok's: the allocator of the context that made it (tpk_tokens_free's; zero:
                         the C library's, for a tok of one's own from malloc) */
} tpk_tokens;

static inline void tpk_tokens_free(tpk_tokens *t) {
    if (t) tpk__al_free(&t->al, t->tok), t->tok = NULL, t->n = 0;
}

/* An llm.c token shard held in memory (bytes[n], named `what` in errors) into *t, every token
 * checked against the vocabulary. */
static inline tpk_status tpk_data_parse_shard(tpk_ctx *ctx, const uint8_t *b, size_t n,
                                              const char *what, int64_t vocab, tpk_tokens *t) {
    static const char *fn = "tpk_data_parse_shard";
    if (!ctx) return TPK_ERR_ARG;
    if (!t || (n && !b) || !what) return tpk__fail(ctx, TPK_ERR_ARG, fn, "bytes, what, t: NULL");
    memset(t, 0, sizeof *t);
    int32_t h[256];
    if (n < sizeof h)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: %zu bytes, shorter than the 1024-byte llm.c header", what, n);
    memcpy(h, b, sizeof h);
    if (h[0] != 20240520)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: bad magic 0x%08x, expected 0x%08x (20240520: an llm.c token shard)",
                         what, (unsigned)h[0], 20240520u);
    if (h[1] != 1)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: version %d, expected 1", what, h[1]);
    if (h[2] < 2 || (size_t)h[2] * 2 != n - sizeof h)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: header says %d tokens, the file holds %zu bytes of tokens", what,
                         h[2], n - sizeof h);
    t->al = tpk__allocator(ctx);
    if (!(t->tok = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * (size_t)h[2])))
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d tokens", h[2]);
    for (int64_t i = 0; i < h[2]; i++) {
        uint16_t x;
        memcpy(&x, b + sizeof h + 2 * i, 2);
        t->tok[i] = x;
        if (x >= vocab) {
            tpk_tokens_free(t);
            return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                             "%s: token %lld is %u, not below the model's vocabulary of %lld", what,
                             (long long)i, x, (long long)vocab);
        }
    }
    t->n = h[2];
    return TPK_OK;
}

/* An llm.c token shard file into *t. */
static inline tpk_status tpk_data_load_shard(tpk_ctx *ctx, const char *path, int64_t vocab,
                                             tpk_tokens *t) {
    static const char *fn = "tpk_data_load_shard";
    if (!ctx) return TPK_ERR_ARG;
    if (!path || !t) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", path ? "t" : "path");
    memset(t, 0, sizeof *t);
    uint8_t *b = NULL;
    size_t n = 0;
    TPK_TRY(tpk__read_file(ctx, fn, path, &b, &n));
    tpk_status s = tpk_data_parse_shard(ctx, b, n, path, vocab, t);
    tpk__free(ctx, b);
    return s;
}

/* Tokens (tok[n], named `what` in errors, `unit` their name: "bytes", "tokens"): *train the
 * first 90%, *val the rest (at least `span` = B S + 1 tokens, one batch window); *entropy (may be
 * NULL) the unigram entropy of the training split in nats, the loss a model must beat. */
static inline tpk_status tpk_data_split_tokens(tpk_ctx *ctx, const int32_t *tok, size_t n,
                                               const char *what, const char *unit, int64_t span,
                                               tpk_tokens *train, tpk_tokens *val,
                                               double *entropy) {
    static const char *fn = "tpk_data_split_tokens";
    if (!ctx) return TPK_ERR_ARG;
    if (!train || !val || !what || !unit || (n && !tok))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "tok, what, unit, train, val: NULL");
    if (span < 2)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "span: expected >= 2 (B x S + 1), got %lld",
                         (long long)span);
    memset(train, 0, sizeof *train), memset(val, 0, sizeof *val);
    if (span > INT64_MAX / 10 || (int64_t)n < 10 * span)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "%s: %zu %s, too short for batches of %lld tokens",
                         what, n, unit, (long long)span);
    int32_t top = 0;
    for (size_t i = 0; i < n; i++) {
        if (tok[i] < 0)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: token %zu is %d (expected >= 0)", what, i,
                             (int)tok[i]);
        top = tok[i] > top ? tok[i] : top;
    }
    int64_t nv = (int64_t)n / 10 > span ? (int64_t)n / 10 : span;
    train->n = (int64_t)n - nv, val->n = nv;
    train->al = val->al = tpk__allocator(ctx);
    train->tok = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * (size_t)train->n),
    val->tok = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * (size_t)val->n);
    double *cnt = entropy ? (double *)tpk__calloc(ctx, (size_t)top + 1, sizeof(double)) : NULL;
    if (!train->tok || !val->tok || (entropy && !cnt)) {
        tpk_tokens_free(train), tpk_tokens_free(val), tpk__free(ctx, cnt);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu tokens", n);
    }
    memcpy(train->tok, tok, sizeof(int32_t) * (size_t)train->n);
    memcpy(val->tok, tok + train->n, sizeof(int32_t) * (size_t)val->n);
    if (entropy) {
        double e = 0;
        for (int64_t i = 0; i < train->n; i++) cnt[train->tok[i]] += 1;
        for (int32_t i = 0; i <= top; i++)
            if (cnt[i] > 0) e -= cnt[i] / (double)train->n * log(cnt[i] / (double)train->n);
        *entropy = e;
    }
    tpk__free(ctx, cnt);
    return TPK_OK;
}
/* Bytes as tokens (bytes[n]), one token per byte, split as tpk_data_split_tokens. */
static inline tpk_status tpk_data_split_text(tpk_ctx *ctx, const uint8_t *b, size_t n,
                                             const char *what, int64_t span, tpk_tokens *train,
                                             tpk_tokens *val, double *entropy) {
    if (!ctx) return TPK_ERR_ARG;
    if (n && !b) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_data_split_text", "bytes: NULL");
    int32_t *t = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * n);
    if (!t) return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_data_split_text", "%zu tokens", n);
    for (size_t i = 0; i < n; i++) t[i] = b[i];
    tpk_status s = tpk_data_split_tokens(ctx, t, n, what, "bytes", span, train, val, entropy);
    tpk__free(ctx, t);
    return s;
}

/* A file's bytes as tokens, split as tpk_data_split_text. */
static inline tpk_status tpk_data_load_text(tpk_ctx *ctx, const char *path, int64_t span,
                                            tpk_tokens *train, tpk_tokens *val, double *entropy) {
    static const char *fn = "tpk_data_load_text";
    if (!ctx) return TPK_ERR_ARG;
    if (!path || !train || !val) return tpk__fail(ctx, TPK_ERR_ARG, fn, "path, train, val: NULL");
    if (span < 2)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "span: expected >= 2 (B x S + 1), got %lld",
                         (long long)span);
    uint8_t *b = NULL;
    size_t n = 0;
    TPK_TRY(tpk__read_file(ctx, fn, path, &b, &n));
    tpk_status s = tpk_data_split_text(ctx, b, n, path, span, train, val, entropy);
    tpk__free(ctx, b);
    return s;
}

/* The B sequences of S tokens starting at sequence q (taken modulo the whole B-sequence windows
 * the data holds, W = (n - 1) / (B S)): x, y [B S] host int32, targets the next tokens. */
static inline tpk_status tpk_data_batch_seq(tpk_ctx *ctx, const tpk_tokens *t, int64_t q, int64_t B,
                                            int64_t S, int32_t *x, int32_t *y) {
    static const char *fn = "tpk_data_batch";
    if (!ctx) return TPK_ERR_ARG;
    if (!t || !t->tok || !x || !y)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "t, x, y: expected buffers, got NULL");
    if (B < 1 || S < 1 || q < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "B, S, q: expected B, S >= 1, q >= 0, got %lld, %lld, %lld", (long long)B,
                         (long long)S, (long long)q);
    int64_t span = B * S;
    if (t->n < span + 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "the data holds %lld tokens, fewer than B x S + 1 = %lld", (long long)t->n,
                         (long long)span + 1);
    int64_t windows = (t->n - 1) / span;
    const int32_t *p = t->tok + (q % (windows * B)) * S;
    for (int64_t i = 0; i < span; i++) x[i] = p[i], y[i] = p[i + 1];
    return TPK_OK;
}
/* Batch k of DP rank d (of dp): x, y [B S] host int32 (window k dp + d). */
static inline tpk_status tpk_data_batch(tpk_ctx *ctx, const tpk_tokens *t, int64_t k, int dp, int d,
                                        int64_t B, int64_t S, int32_t *x, int32_t *y) {
    if (ctx && (dp < 1 || d < 0 || d >= dp || k < 0))
        return tpk__fail(
            ctx, TPK_ERR_ARG, "tpk_data_batch",
            "B, S, k, dp, d: expected B, S >= 1, k >= 0, 0 <= d < dp, got %lld, %lld, %lld, %d, %d",
            (long long)B, (long long)S, (long long)k, dp, d);
    return tpk_data_batch_seq(ctx, t, (k * dp + d) * B, B, S, x, y);
}

/* Heterogeneous data parallelism (HetSeq): the DP ranks' micro-batch sizes as a list "8,8,4"
 * (one per DP rank; NULL or "": every rank B). This DP rank's size *Bd, the sequences of the ranks
 * before it *off, and the step's total *Btot: step k's micro-batch of this rank is sequences
 * k Btot + off .. + Bd (tpk_data_batch_seq), so the DP group reads what one rank with Btot would,
 * and weighting each rank's mean loss by Bd / Btot makes the summed gradient that rank's. */
static inline tpk_status tpk_data_dp_batches(tpk_ctx *ctx, const char *list, int64_t B, int64_t *Bd,
                                             int64_t *off, int64_t *Btot) {
    static const char *fn = "tpk_data_dp_batches";
    if (!ctx) return TPK_ERR_ARG;
    if (!Bd || !off || !Btot) return tpk__fail(ctx, TPK_ERR_ARG, fn, "Bd, off, Btot: NULL");
    int d = ctx->dp.size, r = ctx->dp.rank, n = 0;
    *Bd = B, *off = (int64_t)r * B, *Btot = (int64_t)d * B;
    if (!list || !list[0])
        return B >= 1 ? TPK_OK
                      : tpk__fail(ctx, TPK_ERR_ARG, fn, "B: expected >= 1, got %lld", (long long)B);
    *Btot = 0;
    for (const char *p = list;; n++) {
        char *end = NULL;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1 || v > 1000000 || (*end && *end != ','))
            return tpk__fail(
                ctx, TPK_ERR_ARG, fn,
                "list \"%s\": expected %d comma-separated micro-batch sizes of 1..1000000 (one per "
                "DP rank)",
                list, d);
        if (n == r) *Bd = v, *off = *Btot;
        *Btot += v;
        if (!*end) break;
        p = end + 1;
    }
    if (n + 1 != d)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "list \"%s\": %d sizes for %d DP ranks", list, n + 1,
                         d);
    return TPK_OK;
}

#endif /* TPK_DATA_H */
