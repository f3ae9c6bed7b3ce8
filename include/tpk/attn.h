/* tpk/attn.h — head-parallel causal self-attention (GPT-2), forward and backward.
 *
 * A heads of size D, H = A D; rank r holds heads [a0, a0 + A_r) = tpk_split(A, t, r) (A need
 * not divide t; a rank may hold no head when t > A, and then contributes zeros).
 *   c_attn  column linear H -> 3H, W = [Wq; Wk; Wv] [3H, H]: stride 3, unit D, so the shard is
 *           the rows of its heads in each of the three blocks; output qkv S(-1) [T, 3 A_r D]
 *           = [Q_r | K_r | V_r]
 *   attn    per local head h (global a0 + h), per sequence b:
 *           P = softmax(Q Kᵀ / sqrt(D)) over j <= i (causal); dropout on P with a mask indexed
 *           by (b, global head, i, j), so it does not depend on which rank holds the head;
 *           O = P V  -> S(-1) [T, A_r D] (unit D); log-sum-exp saved, P recomputed in backward
 *   c_proj  row linear H -> H, in features split in units of D -> P -> all-reduce -> R (+ bias)
 * Layouts: x R [T, H] (S(0) under sequence parallelism) -> y R [T, H] (S(0)).
 * Collectives: forward 1 all-reduce of T H (SP: all-gather of x + reduce-scatter of y);
 * backward 1 all-reduce of T H (SP: all-gather of dy + reduce-scatter of dx). None inside
 * the attention itself. T = B S tokens, sequence-major ([B, S] flattened). */
#ifndef TPK_ATTN_H
#define TPK_ATTN_H

#include "linear.h"

typedef struct tpk_attention_desc {
    const char *name;       /* parameters "<name>.c_attn.*", "<name>.c_proj.*"; default "attn<N>" */
    bool sequence_parallel; /* x and y S(0) */
    float dropout;          /* on the attention probabilities; 0 = none */
    float init_std;         /* c_attn weight N(0, std^2); default 0.02 */
    float proj_init_std;    /* c_proj weight; default init_std (GPT-2 uses 0.02 / sqrt(2 layers)) */
} tpk_attention_desc;

typedef struct tpk_attention {
    char name[80];
    int64_t H, A, D;
    int64_t Al, a0;   /* local heads [a0, a0 + Al) */
    float p;
    tpk_linear c_attn, c_proj;
    int64_t B, S;     /* of the last forward */
    uint64_t stream;  /* dropout stream of the last forward */
    tpk_tensor qkv;   /* S(-1) [T, 3 Al D], owned by c_attn */
    tpk_buf out, lse, dqkv;
} tpk_attention;

static inline tpk_status tpk_attention_init(tpk_ctx *ctx, tpk_attention *a, int64_t H, int64_t A, const tpk_attention_desc *desc) {
    static const char *fn = "tpk_attention_init";
    tpk_attention_desc d;
    TPK__INIT_LAYER(ctx, fn, a, d, desc);
    if (A < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "A: expected >= 1 heads, got %lld", (long long)A);
    if (H < 1 || H % A) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected a positive multiple of A = %lld, got %lld", (long long)A, (long long)H);
    if (!(d.dropout >= 0.0f && d.dropout < 1.0f)) return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->dropout: expected 0 <= p < 1, got %g", (double)d.dropout);
    TPK_TRY(tpk__layer_name(ctx, fn, a->name, sizeof a->name, d.name, "attn"));
    a->H = H, a->A = A, a->D = H / A, a->p = d.dropout;
    tpk_range heads = tpk_split(A, ctx->tp.size, ctx->tp.rank);
    a->a0 = heads.off, a->Al = heads.size;
    char pn[128];
    snprintf(pn, sizeof pn, "%s.c_attn", a->name);
    tpk_linear_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.name = pn, ld.bias = true, ld.stride = 3, ld.unit = (int)a->D, ld.sequence_parallel = d.sequence_parallel, ld.init_std = d.init_std;
    TPK_TRY(tpk_col_linear_init(ctx, &a->c_attn, H, 3 * H, &ld)); /* [Wq; Wk; Wv]: stride 3, heads of D */
    snprintf(pn, sizeof pn, "%s.c_proj", a->name);
    ld.stride = 0, ld.init_std = d.proj_init_std > 0 ? d.proj_init_std : d.init_std;
    TPK_TRY(tpk_row_linear_init(ctx, &a->c_proj, H, H, &ld));
    return TPK_OK;
}

static inline void tpk_attention_destroy(tpk_ctx *ctx, tpk_attention *a) {
    tpk_linear_destroy(ctx, &a->c_attn), tpk_linear_destroy(ctx, &a->c_proj);
    tpk__buf_free(ctx, &a->out), tpk__buf_free(ctx, &a->lse), tpk__buf_free(ctx, &a->dqkv);
}

/* y = attention(x) for B sequences of S tokens: x R [B S, H] (S(0) under sequence parallelism),
 * y in the same layout. */
static inline tpk_status tpk_attention_forward(tpk_ctx *ctx, tpk_attention *a, tpk_tensor x, int64_t B, int64_t S, tpk_tensor *y) {
    static const char *fn = "tpk_attention_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!a || !a->A) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised attention");
    if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL");
    if (B < 0 || S < 0) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "B, S: expected >= 0, got %lld, %lld", (long long)B, (long long)S);
    if (x.ndim == 2 && x.gshape[0] != B * S)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "x: expected B x S = %lld token rows, got %lld", (long long)(B * S), (long long)x.gshape[0]);
    tpk_tensor qkv, o;
    TPK_TRY(tpk_col_linear_forward(ctx, &a->c_attn, x, &qkv)); /* S(-1) [T, 3 Al D], stride 3 */
    int64_t T = B * S, Al = a->Al, D = a->D;
    a->B = B, a->S = S, a->qkv = qkv;
    a->stream = tpk__dropout_stream(ctx, a->name);
    o = tpk_tensor_shard_2d(NULL, ctx->dtype, T, a->H, TPK_S_EX(-1, 1, (int)D), ctx->tp.size, ctx->tp.rank);
    TPK_TRY(tpk__buf_view(ctx, &a->out, &o));
    TPK_TRY(tpk__buf_reserve(ctx, &a->lse, sizeof(float) * (size_t)(B * Al * S > 0 ? B * Al * S : 1)));
    if (T && Al)
        TPK_TRY(tpk_op_attn_fwd(ctx, o.data, (float *)a->lse.p, qkv.data, B, S, Al, D, a->A, a->A, a->a0, 1.0f / sqrtf((float)D), a->p, ctx->seed,
                                   a->stream, ctx->dtype));
    return tpk_row_linear_forward(ctx, &a->c_proj, o, y); /* P -> all-reduce (SP: reduce-scatter) */
}

/* dx of the last forward from dy (the layout of y); accumulates the gradients of c_attn and
 * c_proj. */
static inline tpk_status tpk_attention_backward(tpk_ctx *ctx, tpk_attention *a, tpk_tensor dy, tpk_tensor *dx) {
    static const char *fn = "tpk_attention_backward";
    if (!ctx) return TPK_ERR_ARG;
    if (!a || !a->A) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised attention");
    if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL");
    if (!a->qkv.ndim) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", a->name);
    tpk_tensor dout, dq;
    TPK_TRY(tpk_row_linear_backward(ctx, &a->c_proj, dy, &dout)); /* S(-1) [T, Al D] */
    int64_t B = a->B, S = a->S, Al = a->Al, D = a->D;
    dq = a->qkv;
    TPK_TRY(tpk__buf_view(ctx, &a->dqkv, &dq));
    if (B * S > 0 && Al > 0)
        TPK_TRY(tpk_op_attn_bwd(ctx, dq.data, dout.data, a->qkv.data, a->out.p, (const float *)a->lse.p, B, S, Al, D, a->A, a->A, a->a0,
                                   1.0f / sqrtf((float)D), a->p, ctx->seed, a->stream, ctx->dtype));
    return tpk_col_linear_backward(ctx, &a->c_attn, dq, dx); /* all-reduce (SP: reduce-scatter) */
}

#endif /* TPK_ATTN_H */
