/* tpk/layers/embed.h — vocabulary-parallel token embedding with a replicated position embedding.
 *
 * Embedding: rank r holds rows [v0, v0 + V_r) of wte [V, H] (tpk_tp_vocab_split: even, or by the
 * context's TP weights; V need not divide t).
 *   forward   ids R [T] (host memory, checked: 0 <= id < V) -> rows in range, zeros elsewhere:
 *             P -> all-reduce -> R (SP: reduce-scatter -> S(0)); + wpe[t % S] (replicated, once)
 *   backward  dy R (SP: S(0), all-gathered first) -> dwte[id - v0] += dy for own ids;
 *             dwpe[pos] += dy (complete on every rank). No other communication.
 * Context parallelism (ctx->cp): a rank's rows are its two chunks of each sequence
 * (tpk/layers/cp_split.h), each read at its true position in wpe; the gradients are this rank's
 * rows' part (summed over the CP group with the data-parallel reduction, over ctx->dp_cp).
 * Padded vocabulary (desc->vocab_multiple = m, as Megatron's make-vocab-size-divisible-by): wte is
 * stored as Vp = V rounded up to a multiple of m t rows, every shard Vp / t rows (a multiple of
 * m: a tied LM head's GEMMs get aligned leading dimensions; with TP weights, shards of whole units
 * of 64 rows, layout tpk_tp_vocab_layout), the rows >= V zero and never trained
 * (tpk_param_desc.padded_rows); checkpoints and tpk_param_gather see [V, H].
 * The vocabulary-parallel cross-entropy of the tied LM head is in tpk/layers/xent.h. */
#ifndef TPK_EMBED_H
#define TPK_EMBED_H

#include "cp_split.h"
#include "params.h"

typedef struct tpk_embedding_desc {
    const char *wte_name;   /* default "wte" */
    const char *wpe_name;   /* default "wpe"; positions 0 = no position table */
    bool sequence_parallel; /* output S(0) */
    float init_std;         /* wte N(0, std^2), default 0.02; wpe uses 0.01 */
    int64_t vocab_multiple; /* pad each shard to a multiple of this many rows (0: no padding) */
} tpk_embedding_desc;

typedef struct tpk_embedding {
    int64_t V, P, H, v0, vl; /* rows [v0, v0 + vl) of the (padded) table on this rank */
    int64_t Vp;              /* the padded vocabulary (V without padding) */
    bool sp;
    int wte, wpe; /* wpe = -1 without positions */
    int64_t B, S;
    int64_t pos_T, pos_S; /* the positions in `pos` (uploaded once per shape) */
    tpk_buf ids, pos, y, y2; /* y: the partial sums without SP (under SP they live in ctx->sp) */
} tpk_embedding;

static inline tpk_status tpk_embedding_init(tpk_ctx *ctx, tpk_embedding *e, int64_t V,
                                            int64_t positions, int64_t H,
                                            const tpk_embedding_desc *desc) {
    static const char *fn = "tpk_embedding_init";
    tpk_embedding_desc d;
    TPK__INIT_LAYER(ctx, fn, e, d, desc);
    if (V < 1 || V > INT32_MAX)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "V: expected 1..%d, got %lld", INT32_MAX,
                         (long long)V);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if (positions < 0)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "positions: expected >= 0, got %lld",
                         (long long)positions);
    if (d.vocab_multiple < 0 || d.vocab_multiple > (1 << 20))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->vocab_multiple: expected 0..%d, got %lld",
                         1 << 20, (long long)d.vocab_multiple);
    e->V = V, e->P = positions, e->H = H, e->sp = d.sequence_parallel, e->wpe = -1;
    e->Vp = tpk_vocab_padded(V, d.vocab_multiple, ctx->tp.size);
    tpk_range r = tpk_tp_vocab_split(ctx, e->Vp, ctx->tp.rank);
    e->v0 = r.off, e->vl = r.size;
    tpk_param_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.name = d.wte_name ? d.wte_name : "wte", pd.ndim = 2, pd.shape[0] = V, pd.shape[1] = H,
    pd.layout = tpk_tp_vocab_layout(ctx, e->Vp, 0);
    pd.init = TPK_INIT_NORMAL, pd.std = d.init_std > 0 ? d.init_std : 0.02f, pd.decay = true,
    pd.padded_rows = e->Vp;
    TPK_TRY(tpk_param_add(ctx, &pd, &e->wte));
    if (positions)
        TPK_TRY(tpk__param_add(ctx, d.wpe_name ? d.wpe_name : "wpe", 2, positions, H, TPK_R,
                               TPK_INIT_NORMAL, 0.01f, true, &e->wpe));
    return TPK_OK;
}

/* y = wte[ids] + wpe[position]: ids [B * S] token ids in host memory, the same on every TP rank;
 * y R [B*S, H] (S(0) under sequence parallelism). Under context parallelism (ctx->cp, c > 1) S is
 * the whole sequence's length (a multiple of 2c) and ids and y hold this rank's B S / c rows
 * (tpk/layers/cp_split.h), each at its true position (tpk_cp_position). */
static inline tpk_status tpk_embedding_forward(tpk_ctx *ctx, tpk_embedding *e, const int32_t *ids,
                                               int64_t B, int64_t S, tpk_tensor *y) {
    static const char *fn = "tpk_embedding_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!e || !e->V)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised embedding");
    if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL");
    if (B < 0 || S < 0)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "B, S: expected >= 0, got %lld, %lld",
                         (long long)B, (long long)S);
    if (e->wpe >= 0 && S > e->P)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "S: sequence of %lld is longer than the position table (%lld positions)",
                         (long long)S, (long long)e->P);
    TPK_TRY(tpk__cp_layer_seq(ctx, fn, S));
    int64_t T = tpk_cp_rows(ctx, B, S), Sl = S / tpk_cp_size(ctx); /* this CP rank's rows */
    if (T && !ids) return tpk__fail(ctx, TPK_ERR_ARG, fn, "ids: NULL");
    for (int64_t i = 0; i < T; i++)
        if (ids[i] < 0 || ids[i] >= e->V)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "ids[%lld] = %d: expected a token id in 0..%lld",
                             (long long)i, ids[i], (long long)(e->V - 1));
    e->B = B, e->S = S;
    TPK_TRY(tpk__upload_i32(ctx, &e->ids, ids, T));
    /* SP: only until its reduce-scatter, in the scratch */
    tpk_tensor yp = tpk_tensor_2d(NULL, ctx->dtype, T, e->H, TPK_P);
    TPK_TRY(e->sp ? tpk__sp_view(ctx, &yp) : tpk__buf_view(ctx, &e->y, &yp));
    if (T)
        TPK_TRY(tpk_op_embed_fwd(ctx, yp.data, (const int32_t *)e->ids.p,
                                 tpk_param_data(ctx, e->wte), T, e->H, e->v0, e->vl, ctx->dtype,
                                 false));
    tpk_tensor o = yp;
    tpk_range rows = {0, T};
    if (e->sp) {
        o = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, e->H, TPK_S(0));
        TPK_TRY(tpk__buf_view(ctx, &e->y2, &o));
        TPK_TRY(tpk_convert(ctx, &yp, TPK_S(0), &o)); /* reduce-scatter tokens */
        rows = tpk_tp_split(ctx, T, ctx->tp.rank);
    } else {
        TPK_TRY(tpk_convert(ctx, &yp, TPK_R, &o)); /* all-reduce in place */
    }
    if (e->pos_T != T || e->pos_S != S || !e->pos.p) { /* positions of all T rows (the backward uses
                                                          them all), once per shape; under CP the
                                                          true ones of this rank's rows */
        int32_t *pos = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * (size_t)(T ? T : 1));
        if (!pos) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "positions");
        int c = tpk_cp_size(ctx), r = c > 1 ? ctx->cp.rank : 0;
        for (int64_t i = 0; i < T; i++)
            pos[i] = (int32_t)(c > 1 ? tpk_cp_position(S, c, r, i % Sl) : i % (S ? S : 1));
        tpk_status s = tpk__upload_i32(ctx, &e->pos, pos, T);
        tpk__free(ctx, pos);
        TPK_TRY(s);
        e->pos_T = T, e->pos_S = S;
    }
    if (e->wpe >= 0 && rows.size)
        TPK_TRY(tpk_op_embed_fwd(ctx, o.data, (const int32_t *)e->pos.p + rows.off,
                                 tpk_param_data(ctx, e->wpe), rows.size, e->H, 0, e->P, ctx->dtype,
                                 true));
    o.cp_rows = tpk_cp_size(ctx) > 1; /* this CP rank's rows (tpk_tensor.cp_rows) */
    *y = o;
    return TPK_OK;
}

/* Accumulate dwte (own rows) and dwpe from dy R [B*S, H] (S(0) under sequence parallelism). */
static inline tpk_status tpk_embedding_backward(tpk_ctx *ctx, tpk_embedding *e, tpk_tensor dy) {
    static const char *fn = "tpk_embedding_backward";
    if (!ctx) return TPK_ERR_ARG;
    if (!e || !e->V)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised embedding");
    int64_t T = tpk_cp_rows(ctx, e->B, e->S), want[2] = {T, e->H};
    TPK_TRY(tpk__check(ctx, fn, "dy", &dy, e->sp ? TPK_S(0) : TPK_R, ctx->dtype, 2, want));
    TPK_TRY(tpk__cp_rows_check(ctx, fn, "dy", &dy)); /* rows at their positions */
    if (e->sp) {
        tpk_tensor g = tpk_tensor_2d(NULL, ctx->dtype, T, e->H, TPK_R);
        TPK_TRY(tpk__sp_view(ctx, &g)); /* read only within this call */
        TPK_TRY(tpk_convert(ctx, &dy, TPK_R, &g)); /* all-gather tokens */
        dy = g;
    }
    if (!T) return TPK_OK;
    TPK_TRY(tpk_op_embed_bwd(ctx, tpk_param_grad(ctx, e->wte), dy.data, (const int32_t *)e->ids.p,
                             T, e->H, e->v0, e->vl, ctx->dtype));
    if (e->wpe >= 0)
        TPK_TRY(tpk_op_embed_bwd(ctx, tpk_param_grad(ctx, e->wpe), dy.data,
                                 (const int32_t *)e->pos.p, T, e->H, 0, e->P, ctx->dtype));
    return TPK_OK;
}

static inline void tpk_embedding_destroy(tpk_ctx *ctx, tpk_embedding *e) {
    tpk_buf *b[] = {&e->ids, &e->pos, &e->y, &e->y2};
    for (int i = 0; i < 4; i++) tpk__buf_free(ctx, b[i]);
}

#endif /* TPK_EMBED_H */
