/* tpk/layers/cp_split.h — context parallelism's load-balanced split of a sequence over the CP
 * group (ctx->cp, c ranks), Megatron-LM's:
 *
 *   a sequence of S tokens is cut into 2c chunks of Sc = S / (2c) tokens; CP rank r holds chunks
 *   r and 2c - 1 - r, in that order: its local row i (0 <= i < 2 Sc) is the token at position
 *     pos(r, i) = r Sc + i                     (i < Sc)
 *               = (2c - 1 - r) Sc + (i - Sc)   (i >= Sc).
 *
 * Under a causal mask chunk k's queries see k whole chunks and half of their own, so rank r's
 * attention work is (r + 1/2) + (2c - 1 - r + 1/2) = 2c chunk-pairs, the same on every rank (a
 * split into c contiguous pieces would give the last rank 2c - 1 times the first's). At c = 1
 * the rows are the sequence in order. Learned and rotary position tables must use pos(r, i), not
 * the row. The sequence length must be a multiple of 2c (refused by name otherwise).
 *
 * Activations of B sequences are held sequence-major as everywhere in the kit: [B, 2 Sc] rows
 * (B S / c of the B S tokens). tpk_cp_scatter keeps this rank's rows of a whole batch (the data
 * loader's tokens, which every CP rank reads alike; tests); tpk_cp_gather all-gathers the rows of
 * every CP rank back into the whole batch (tests, evaluation). A tensor of this rank's rows is
 * tagged so (tpk_tensor.cp_rows, tpk_cp_tensor_2d); the readers across the sequence check the tag
 * (tpk__cp_rows_check), so whole sequences under CP, or CP rows without it, are refused by name. */
#ifndef TPK_CP_SPLIT_H
#define TPK_CP_SPLIT_H

#include "../runtime/coll.h"

/* The position of local row i of CP rank r of c, in a sequence of S tokens (S a multiple of 2c,
 * 0 <= i < S / c): the formula above, unchecked. */
static inline int64_t tpk_cp_position(int64_t S, int c, int r, int64_t i) {
    int64_t sc = S / (2 * (int64_t)c);
    return i < sc ? (int64_t)r * sc + i : (2 * (int64_t)c - 1 - r) * sc + (i - sc);
}

/* S a length the CP group of c ranks can split: a multiple of 2c (S >= 0). */
static inline tpk_status tpk__cp_check_seq(tpk_ctx *ctx, const char *fn, const char *arg, int64_t S,
                                           int c) {
    if (S >= 0 && S % (2 * (int64_t)c) == 0) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                     "%s: expected a sequence length that is a multiple of 2 x cp = %d (%d chunks, "
                     "CP rank r holding chunks r and 2 cp - 1 - r), got %lld",
                     arg, 2 * c, 2 * c, (long long)S);
}
/* The CP group of the context (one rank when it has none). */
static inline tpk_status tpk__cp_group(tpk_ctx *ctx, const char *fn, int *c, int *r) {
    *c = 1, *r = 0;
    if (!ctx) return TPK_ERR_ARG;
    if (!ctx->ops) return tpk__fail(ctx, TPK_ERR_ARG, fn, "ctx: expected an initialised context");
    *c = ctx->cp.size > 1 ? ctx->cp.size : 1, *r = ctx->cp.size > 1 ? ctx->cp.rank : 0;
    return TPK_OK;
}

/* pos[S / c]: the sequence positions of this CP rank's rows (host memory). */
static inline tpk_status tpk_cp_positions(tpk_ctx *ctx, int64_t S, int64_t *pos) {
    static const char *fn = "tpk_cp_positions";
    int c, r;
    TPK_TRY(tpk__cp_group(ctx, fn, &c, &r));
    TPK_TRY(tpk__cp_check_seq(ctx, fn, "S", S, c));
    if (!pos && S)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "pos: expected %lld entries, got NULL",
                         (long long)(S / c));
    for (int64_t i = 0; i < S / c; i++) pos[i] = tpk_cp_position(S, c, r, i);
    return TPK_OK;
}

/* The kit's layers under CP: a forward of B sequences of S tokens (S the whole sequence's length)
 * holds this rank's B S / c rows, [B, S / c] (tpk_cp_rows); learned and rotary positions are read
 * at tpk_cp_position. c = ctx's CP size (1 without CP). */
static inline int tpk_cp_size(const tpk_ctx *ctx) { return ctx->cp.size > 1 ? ctx->cp.size : 1; }
static inline int64_t tpk_cp_rows(const tpk_ctx *ctx, int64_t B, int64_t S) {
    return B * (S / tpk_cp_size(ctx));
}
/* This TP rank's shard (layout l) of this CP rank's rows of B sequences of S tokens, [B S / c,
 * cols], tagged as CP rows where c > 1 (tpk_tensor.cp_rows): the model's hidden states under CP. */
static inline tpk_tensor tpk_cp_tensor_2d(const tpk_ctx *ctx, void *data, tpk_dtype dt, int64_t B,
                                          int64_t S, int64_t cols, tpk_layout l) {
    tpk_tensor t = tpk_tp_tensor_2d(ctx, data, dt, tpk_cp_rows(ctx, B, S), cols, l);
    t.cp_rows = tpk_cp_size(ctx) > 1;
    return t;
}
/* The check of a reader across the sequence (an attention, a learned position table, the loss, a
 * pipeline message): t's rows are this rank's CP chunks (cp_rows) where c > 1, whole sequences
 * where c = 1; refused by name otherwise (a gathered tensor under CP, a scattered one without). */
static inline tpk_status tpk__cp_rows_check(tpk_ctx *ctx, const char *fn, const char *arg,
                                            const tpk_tensor *t) {
    int c = tpk_cp_size(ctx);
    if (!t || (t->cp_rows != 0) == (c > 1)) return TPK_OK; /* NULL: the caller's check names it */
    static const char *mine = "this rank's CP rows (tpk_cp_rows)", *whole = "whole sequences";
    return tpk__fail(ctx, TPK_ERR_LAYOUT, fn, "%s: expected %s at CP %d, got %s", arg,
                     c > 1 ? mine : whole, c, t->cp_rows ? mine : whole);
}
/* A layer's check of its sequence length under CP: a multiple of 2c where c > 1. */
static inline tpk_status tpk__cp_layer_seq(tpk_ctx *ctx, const char *fn, int64_t S) {
    int c = tpk_cp_size(ctx);
    return c > 1 ? tpk__cp_check_seq(ctx, fn, "S", S, c) : TPK_OK;
}
/* pos int32 [S / c] in backend memory: the positions of this CP rank's rows of a sequence of S
 * (tpk_cp_position; at c = 1 0..S-1), uploaded again only when S differs from *have (a layer's
 * cache: -1 at first). S a multiple of 2c (checked by the caller). */
static inline tpk_status tpk__cp_positions_upload(tpk_ctx *ctx, const char *fn, tpk_buf *pos,
                                                  int64_t *have, int64_t S) {
    if (*have == S && pos->p) return TPK_OK;
    int c = tpk_cp_size(ctx), r = c > 1 ? ctx->cp.rank : 0;
    int64_t n = S / c;
    int32_t *h = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!h) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "positions: %lld entries", (long long)n);
    for (int64_t i = 0; i < n; i++) h[i] = (int32_t)(c > 1 ? tpk_cp_position(S, c, r, i) : i);
    tpk_status s = tpk__upload_i32(ctx, pos, h, n);
    tpk__free(ctx, h);
    TPK_TRY(s);
    *have = S;
    return TPK_OK;
}

/* The rows of this rank's two chunks: in the whole batch [B, S] of `cols` elements a row, or
 * (gather) of rank q's: run k (0: chunk q, 1: chunk 2c - 1 - q) of sequence b starts at whole row
 * b S + first, and at local row b (S / c) + k Sc. */
static inline int64_t tpk__cp_chunk0(int64_t S, int c, int q, int k) {
    int64_t sc = S / (2 * (int64_t)c);
    return (k ? 2 * (int64_t)c - 1 - q : q) * sc;
}
static inline tpk_status tpk__cp_batch_check(tpk_ctx *ctx, const char *fn, const void *a,
                                             const char *an, const void *b, const char *bn,
                                             int64_t B, int64_t S, int64_t cols, int c) {
    if (B < 0 || cols < 0)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "%s: expected >= 0, got %lld",
                         B < 0 ? "B" : "cols", (long long)(B < 0 ? B : cols));
    TPK_TRY(tpk__cp_check_seq(ctx, fn, "S", S, c));
    if (B * S * cols > 0 && (!a || !b))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected a buffer, got NULL", !a ? an : bn);
    return TPK_OK;
}

/* local [B (S / c), cols] = this CP rank's rows of whole [B S, cols] (backend memory, dtype dt; no
 * communication: every CP rank holds the whole batch). */
static inline tpk_status tpk_cp_scatter(tpk_ctx *ctx, void *local, const void *whole, int64_t B,
                                        int64_t S, int64_t cols, tpk_dtype dt) {
    static const char *fn = "tpk_cp_scatter";
    int c, r;
    TPK_TRY(tpk__cp_group(ctx, fn, &c, &r));
    TPK_TRY(tpk__cp_batch_check(ctx, fn, local, "local", whole, "whole", B, S, cols, c));
    int64_t sc = S / (2 * (int64_t)c), es = (int64_t)tpk_dtype_size(dt);
    for (int64_t b = 0; b < B && sc * cols > 0; b++)
        for (int k = 0; k < 2; k++)
            TPK_TRY(tpk_op_copy2d(ctx, (char *)local + ((b * 2 + k) * sc) * cols * es, cols,
                                  (const char *)whole +
                                      (b * S + tpk__cp_chunk0(S, c, r, k)) * cols * es,
                                  cols, sc, cols, dt));
    return TPK_OK;
}
/* The same in host memory, rows of row_bytes bytes (token ids, positions, loss masks). */
static inline tpk_status tpk_cp_scatter_host(tpk_ctx *ctx, void *local, const void *whole,
                                             int64_t B, int64_t S, size_t row_bytes) {
    static const char *fn = "tpk_cp_scatter_host";
    int c, r;
    TPK_TRY(tpk__cp_group(ctx, fn, &c, &r));
    TPK_TRY(
        tpk__cp_batch_check(ctx, fn, local, "local", whole, "whole", B, S, (int64_t)row_bytes, c));
    int64_t sc = S / (2 * (int64_t)c);
    for (int64_t b = 0; b < B && sc * (int64_t)row_bytes > 0; b++)
        for (int k = 0; k < 2; k++)
            memcpy((char *)local + (size_t)((b * 2 + k) * sc) * row_bytes,
                   (const char *)whole + (size_t)(b * S + tpk__cp_chunk0(S, c, r, k)) * row_bytes,
                   (size_t)sc * row_bytes);
    return TPK_OK;
}

/* whole [B S, cols] = every CP rank's local [B (S / c), cols] put back in sequence order (backend
 * memory, dtype dt; whole sequences: a tensor over them is untagged, cp_rows 0): one all-gather
 * over ctx->cp into the context's scratch (ctx->work[1]), then the rows moved. Collective over the
 * CP group. */
static inline tpk_status tpk_cp_gather(tpk_ctx *ctx, void *whole, const void *local, int64_t B,
                                       int64_t S, int64_t cols, tpk_dtype dt) {
    static const char *fn = "tpk_cp_gather";
    int c, r;
    TPK_TRY(tpk__cp_group(ctx, fn, &c, &r));
    TPK_TRY(tpk__cp_batch_check(ctx, fn, local, "local", whole, "whole", B, S, cols, c));
    int64_t sc = S / (2 * (int64_t)c), es = (int64_t)tpk_dtype_size(dt);
    size_t mine = (size_t)(B * 2 * sc * cols);
    if (!mine) return TPK_OK;
    const char *all = (const char *)local;
    if (c > 1) {
        size_t counts[64], *cnt = counts;
        if (c > 64 && !(cnt = (size_t *)tpk__malloc(ctx, sizeof(size_t) * (size_t)c)))
            return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "counts");
        for (int q = 0; q < c; q++) cnt[q] = mine;
        tpk_status s = tpk__buf_reserve(ctx, &ctx->work[1], mine * (size_t)c * (size_t)es);
        if (s == TPK_OK)
            s = tpk_allgatherv(ctx, &ctx->cp, local, mine, ctx->work[1].p, cnt, mine * (size_t)c,
                               dt);
        if (cnt != counts) tpk__free(ctx, cnt);
        TPK_TRY(s);
        all = (const char *)ctx->work[1].p;
    }
    for (int q = 0; q < c; q++)
        for (int64_t b = 0; b < B; b++)
            for (int k = 0; k < 2; k++)
                TPK_TRY(tpk_op_copy2d(
                    ctx, (char *)whole + (b * S + tpk__cp_chunk0(S, c, q, k)) * cols * es, cols,
                    all + ((int64_t)q * (int64_t)mine + (b * 2 + k) * sc * cols) * es, cols, sc,
                    cols, dt));
    return TPK_OK;
}

#endif /* TPK_CP_SPLIT_H */
