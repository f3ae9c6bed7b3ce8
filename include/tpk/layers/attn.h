/* tpk/layers/attn.h — head-parallel causal self-attention (GPT-2), forward and backward.
 *
 * A heads of size D, H = A D; rank r holds heads [a0, a0 + A_r) = tpk_tp_split(ctx, A, r) (even, or
 * by the context's TP weights; A need not divide t; a rank may hold no head when t > A, and then
 * contributes zeros).
 *   c_attn  column linear H -> 3H, W = [Wq; Wk; Wv] [3H, H]: stride 3, unit D, so the shard is
 *           the rows of its heads in each of the three blocks; output qkv S(-1) [T, 3 A_r D]
 *           = [Q_r | K_r | V_r]
 *   attn    per local head h (global a0 + h), per sequence b:
 *           P = softmax(Q Kᵀ / sqrt(D)) over j <= i (causal); dropout on P with a mask indexed
 *           by (b, global head, i, j), so it does not depend on which rank holds the head;
 *           O = P V  -> S(-1) [T, A_r D] (unit D); log-sum-exp saved, P recomputed in backward
 *   c_proj  row linear H -> H, in features split in units of D -> P -> all-reduce -> R (+ bias)
 * GPT-NeoX's variant (desc.qkv_per_head, desc.rotary_dim): W's rows grouped per head,
 * [q_h; k_h; v_h] (unit 3D, stride 1: the shard is its heads' groups), so the output holds per head
 * [q_h | k_h | v_h]; it is packed into [Q_r | K_r | V_r] (a buffer of its own) with the first
 * rotary_dim of each head of Q and K rotated (rotate-half, position s = row mod S, tpk_op_rope on
 * rotary_dim; under CP the row's true position), and the packed gradient is rotated back and
 * unpacked into W's layout.
 * Layouts: x R [T, H] (S(0) under sequence parallelism) -> y R [T, H] (S(0)).
 * Collectives: forward 1 all-reduce of T H (SP: all-gather of x + reduce-scatter of y);
 * backward 1 all-reduce of T H (SP: all-gather of dy + reduce-scatter of dx, and x all-gathered
 * again for c_attn's weight gradient: the gathered x is not kept). None inside
 * the attention itself. T = B S tokens, sequence-major ([B, S] flattened).
 * Partial outputs (a parallel residual block sums two branches and reduces once): with
 * desc.partial_output y is c_proj's P [T, H] (no collective; the bias on TP rank 0 only) and the
 * backward takes dy R [T, H]; with desc.partial_dx dx is c_attn's P [T, H] (no collective). Both
 * also under sequence parallelism (x S(0), gathered by c_attn). Both attentions alike.
 * Context parallelism (ctx->cp, c > 1; tpk/layers/cp_split.h): S is the whole sequence's length (a
 * multiple of 2c) and x, y hold this rank's B S / c rows, its two chunks of each sequence; the
 * rotary embedding turns each row by its true position (tpk_op_rope_at on tpk_cp_positions) and
 * the attention runs over the CP group (tpk/layers/cp_attn.h: desc.cp_comm, the p2p ring by
 * default or the all-gather; only K and V travel), in the forward, the backward and selective
 * recompute; heads over TP, the sequence over CP. Dropout on the probabilities under CP draws
 * tpk_op_attn_fwd's masks at the true positions (the layer's p and per-forward stream passed to
 * the blocks), so it does not depend on c. At c = 1 nothing changes. */
#ifndef TPK_ATTN_H
#define TPK_ATTN_H

#include "cp_attn.h"
#include "linear.h"

typedef struct tpk_attention_desc {
    const char *name;       /* parameters "<name>.c_attn.*", "<name>.c_proj.*"; default "attn<N>" */
    const char *qkv_name;   /* the fused projection's name below `name`; default "c_attn" */
    const char *proj_name;  /* the output projection's; default "c_proj" */
    bool qkv_per_head;      /* W's rows per head [q_h; k_h; v_h] (GPT-NeoX), else [Wq; Wk; Wv] */
    int64_t rotary_dim;     /* rotate the first rotary_dim (even, <= D) of each head of Q and K;
                               0: none (GPT-2) */
    float rope_theta;       /* the rotation's base; 0 = 10000 */
    bool sequence_parallel; /* x and y S(0) */
    float dropout;          /* on the attention probabilities; 0 = none */
    float init_std;         /* c_attn weight N(0, std^2); default 0.02 */
    float proj_init_std;    /* c_proj weight; default init_std (GPT-2 uses 0.02 / sqrt(2 layers)) */
    bool partial_output;    /* y P [T, H], not reduced (c_proj's tpk_linear_desc.partial_output);
                               backward's dy then R [T, H] */
    bool partial_dx;        /* backward's dx P [T, H], not reduced (c_attn's partial_dx) */
    tpk_cp_comm cp_comm;    /* under context parallelism: TPK_CP_P2P (the ring, default) or
                               TPK_CP_ALLGATHER (tpk/layers/cp_attn.h) */
} tpk_attention_desc;

typedef struct tpk_attention {
    char name[80];
    int64_t H, A, D;
    int64_t Al, a0;   /* local heads [a0, a0 + Al) */
    float p;
    bool pack;        /* qkv_per_head or rotary_dim: the attention reads pk */
    bool per_head;
    int64_t rot;      /* rotary_dim */
    float theta;
    tpk_linear c_attn, c_proj;
    int64_t B, S;     /* of the last forward */
    uint64_t stream;  /* dropout stream of the last forward */
    tpk_tensor qkv;   /* S(-1) [T, 3 Al D], owned by c_attn */
    tpk_buf out, lse, dqkv;
    tpk_buf pk, dpk;  /* pack: [T, 3 Al D] = [Q | K | V] rotated; the gradient in c_attn's layout */
    tpk_cp_attn cp;   /* the attention over ctx->cp (c > 1) */
    tpk_buf rpos;     /* int32 [S / c]: the rotary positions of this CP rank's rows (c > 1) */
    int64_t rpos_S;   /* the S they are of */
} tpk_attention;

/* The attention over ctx->cp of a layer (desc->cp_comm: the mode, checked at every CP size). */
static inline tpk_status tpk__attn_cp_init(tpk_ctx *ctx, const char *fn, tpk_cp_attn *cp,
                                           tpk_cp_comm comm) {
    if (comm != TPK_CP_P2P && comm != TPK_CP_ALLGATHER)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->cp_comm: expected TPK_CP_P2P or TPK_CP_ALLGATHER, got %d",
                         (int)comm);
    tpk_cp_attn_desc d;
    memset(&d, 0, sizeof d);
    d.comm = comm; /* causal */
    return tpk_cp_attn_init(ctx, cp, &d);
}

static inline tpk_status tpk_attention_init(tpk_ctx *ctx, tpk_attention *a, int64_t H, int64_t A,
                                            const tpk_attention_desc *desc) {
    static const char *fn = "tpk_attention_init";
    tpk_attention_desc d;
    TPK__INIT_LAYER(ctx, fn, a, d, desc);
    if (A < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "A: expected >= 1 heads, got %lld", (long long)A);
    if (H < 1 || H % A)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "H: expected a positive multiple of A = %lld, got %lld", (long long)A,
                         (long long)H);
    if (!(d.dropout >= 0.0f && d.dropout < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->dropout: expected 0 <= p < 1, got %g",
                         (double)d.dropout);
    if (d.rotary_dim < 0 || d.rotary_dim > H / A || d.rotary_dim % 2)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->rotary_dim: expected an even number in 0..%lld (the head size), "
                         "got %lld", (long long)(H / A), (long long)d.rotary_dim);
    if (d.rope_theta != 0 && !(d.rope_theta > 1.0f && !isinf(d.rope_theta)))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->rope_theta: expected a finite base > 1 (0 = 10000), got %g",
                         (double)d.rope_theta);
    TPK_TRY(tpk__layer_name(ctx, fn, a->name, sizeof a->name, d.name, "attn"));
    TPK_TRY(tpk__attn_cp_init(ctx, fn, &a->cp, d.cp_comm));
    a->H = H, a->A = A, a->D = H / A, a->p = d.dropout;
    a->per_head = d.qkv_per_head, a->rot = d.rotary_dim, a->pack = a->per_head || a->rot > 0;
    a->theta = d.rope_theta > 0 ? d.rope_theta : 10000.0f;
    tpk_range heads = tpk_tp_split(ctx, A, ctx->tp.rank);
    a->a0 = heads.off, a->Al = heads.size;
    char pn[128];
    snprintf(pn, sizeof pn, "%s.%s", a->name, d.qkv_name ? d.qkv_name : "c_attn");
    tpk_linear_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.name = pn, ld.bias = true, ld.stride = 3, ld.unit = (int)a->D,
    ld.sequence_parallel = d.sequence_parallel, ld.init_std = d.init_std;
    ld.partial_dx = d.partial_dx, ld.fp8 = true; /* FP8 under ctx->fp8 (tpk/layers/fp8.h) */
    /* [Wq; Wk; Wv]: stride 3, heads of D; per head: [q_h; k_h; v_h] groups of 3 D */
    if (a->per_head) ld.stride = 0, ld.unit = (int)(3 * a->D);
    TPK_TRY(tpk_col_linear_init(ctx, &a->c_attn, H, 3 * H, &ld));
    snprintf(pn, sizeof pn, "%s.%s", a->name, d.proj_name ? d.proj_name : "c_proj");
    ld.stride = 0, ld.unit = (int)a->D, ld.partial_dx = false, ld.partial_output = d.partial_output;
    ld.init_std = d.proj_init_std > 0 ? d.proj_init_std : d.init_std;
    TPK_TRY(tpk_row_linear_init(ctx, &a->c_proj, H, H, &ld));
    return TPK_OK;
}

static inline void tpk_attention_destroy(tpk_ctx *ctx, tpk_attention *a) {
    tpk_linear_destroy(ctx, &a->c_attn), tpk_linear_destroy(ctx, &a->c_proj);
    tpk__buf_free(ctx, &a->out), tpk__buf_free(ctx, &a->lse), tpk__buf_free(ctx, &a->dqkv);
    tpk__buf_free(ctx, &a->pk), tpk__buf_free(ctx, &a->dpk), tpk__buf_free(ctx, &a->rpos);
    tpk_cp_attn_destroy(ctx, &a->cp);
}

/* The rotary embedding of `heads` heads of D in `rows` rows of B sequences of S tokens, from x
 * [rows, ldx] into y [rows, ldy] (inverse: the transpose): at row mod S, or under context
 * parallelism at this CP rank's rows' true positions (rpos, uploaded once per S). */
static inline tpk_status tpk__attn_rope(tpk_ctx *ctx, tpk_buf *rpos, int64_t *rpos_S, void *y,
                                        int64_t ldy, const void *x, int64_t ldx, int64_t rows,
                                        int64_t S, int64_t heads, int64_t D, float theta,
                                        bool inverse) {
    if (tpk_cp_size(ctx) == 1)
        return tpk_op_rope(ctx, y, ldy, x, ldx, rows, S, heads, D, theta, inverse, ctx->dtype);
    TPK_TRY(tpk__cp_positions_upload(ctx, "tpk_attention (rotary positions)", rpos, rpos_S, S));
    return tpk_op_rope_at(ctx, y, ldy, x, ldx, rows, (const int32_t *)rpos->p, S / tpk_cp_size(ctx),
                          heads, D, theta, inverse, ctx->dtype);
}

/* GPT-NeoX's packing (a->pack): c_attn's output qkv [T, 3 Al D] (per head [q_h | k_h | v_h], or
 * [Q | K | V]) into pk = [Q | K | V] with the first rot columns of each head of Q and K rotated;
 * back = true: the packed gradient dpk_packed (in dqkv) rotated back into c_attn's layout (dpk).
 * One rope and one copy per head and block: the heads' columns are not one strided matrix. */
static inline tpk_status tpk__attention_pack(tpk_ctx *ctx, tpk_attention *a, bool back) {
    int64_t T = tpk_cp_rows(ctx, a->B, a->S), Al = a->Al, D = a->D, n3 = 3 * Al * D, r = a->rot;
    tpk_buf *pb = back ? &a->dqkv : &a->pk, *cb = back ? &a->dpk : NULL;
    if (!back) TPK_TRY(tpk__buf_reserve(ctx, pb, (size_t)(T * n3 > 0 ? T * n3 : 1) *
                                                     tpk_dtype_size(ctx->dtype)));
    else TPK_TRY(tpk__buf_reserve(ctx, cb, (size_t)(T * n3 > 0 ? T * n3 : 1) *
                                               tpk_dtype_size(ctx->dtype)));
    if (!T || !Al) return TPK_OK;
    void *packed = pb->p, *layer = back ? cb->p : a->qkv.data;
    for (int64_t h = 0; h < Al; h++)
        for (int64_t k = 0; k < 3; k++) {
            int64_t rk = k < 2 ? r : 0; /* Q and K rotated */
            void *p = TPK__AT(packed, k * Al * D + h * D, ctx->dtype);
            void *c = TPK__AT(layer, a->per_head ? h * 3 * D + k * D : k * Al * D + h * D,
                              ctx->dtype);
            void *dst = back ? c : p, *src = back ? p : c;
            if (rk)
                TPK_TRY(tpk__attn_rope(ctx, &a->rpos, &a->rpos_S, dst, n3, src, n3, T, a->S, 1, rk,
                                       a->theta, back));
            if (rk < D)
                TPK_TRY(tpk_op_copy2d(ctx, TPK__AT(dst, rk, ctx->dtype), n3,
                                      TPK__AT(src, rk, ctx->dtype), n3, T, D - rk, ctx->dtype));
        }
    return TPK_OK;
}

/* The attention kernel of B sequences of S tokens from qkv [T, (Al + 2 Gl) D] (query heads
 * [a0, a0 + Al) of A, key/value heads of G): *o S(-1) [T, A D] (unit D) in the buffer `out`, the
 * log-sum-exp [B, Al, S] in `lse`. Both attentions' forwards, and their selective recompute. Under
 * context parallelism T = B S / c rows, lse [B, Al, S / c], the attention over ctx->cp (cp). */
static inline tpk_status tpk__attn_core(tpk_ctx *ctx, tpk_buf *out, tpk_buf *lse, const void *qkv,
                                        int64_t B, int64_t S, int64_t A, int64_t G, int64_t a0,
                                        int64_t Al, int64_t D, float p, uint64_t stream,
                                        tpk_cp_attn *cp, tpk_tensor *o) {
    int64_t T = tpk_cp_rows(ctx, B, S), nl = Al * T;
    *o = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, A * D, TPK_S_EX(-1, 1, (int)D));
    TPK_TRY(tpk__buf_view(ctx, out, o));
    TPK_TRY(tpk__buf_reserve(ctx, lse, sizeof(float) * (size_t)(nl > 0 ? nl : 1)));
    if (!T || !Al) return TPK_OK;
    float scale = 1.0f / sqrtf((float)D);
    if (tpk_cp_size(ctx) > 1) { /* the blocks draw attn_fwd's dropout masks */
        cp->p = p, cp->stream = stream;
        return tpk_cp_attn_forward(ctx, cp, o->data, (float *)lse->p, qkv, B, S, A, G, a0, Al, D,
                                   scale);
    }
    return tpk_op_attn_fwd(ctx, o->data, (float *)lse->p, qkv, B, S, Al, D, A, G, a0, scale, p,
                           ctx->seed, stream, ctx->dtype);
}
/* The backward of tpk__attn_core: dqkv (qkv's layout) from dout S(-1) [T, Al D], the forward's
 * qkv, out and lse. */
static inline tpk_status tpk__attn_core_bwd(tpk_ctx *ctx, void *dqkv, const void *dout,
                                            const void *qkv, const void *out, const float *lse,
                                            int64_t B, int64_t S, int64_t A, int64_t G, int64_t a0,
                                            int64_t Al, int64_t D, float p, uint64_t stream,
                                            tpk_cp_attn *cp) {
    if (!tpk_cp_rows(ctx, B, S) || !Al) return TPK_OK;
    float scale = 1.0f / sqrtf((float)D);
    if (tpk_cp_size(ctx) > 1) { /* the forward's masks again */
        cp->p = p, cp->stream = stream;
        return tpk_cp_attn_backward(ctx, cp, dqkv, dout, qkv, out, lse, B, S, A, G, a0, Al, D,
                                    scale);
    }
    return tpk_op_attn_bwd(ctx, dqkv, dout, qkv, out, lse, B, S, Al, D, A, G, a0, scale, p,
                           ctx->seed, stream, ctx->dtype);
}
/* A forward's S under context parallelism: a multiple of 2c (c > 1). */
static inline tpk_status tpk__attn_cp_check(tpk_ctx *ctx, const char *fn, int64_t S) {
    return tpk__cp_layer_seq(ctx, fn, S);
}
/* The attention's input: c_attn's output, or (a->pack) packed and rotated into pk first. */
static inline tpk_status tpk__attention_core(tpk_ctx *ctx, tpk_attention *a, tpk_tensor *o) {
    if (a->pack) TPK_TRY(tpk__attention_pack(ctx, a, false));
    return tpk__attn_core(ctx, &a->out, &a->lse, a->pack ? a->pk.p : a->qkv.data, a->B, a->S, a->A,
                          a->A, a->a0, a->Al, a->D, a->p, a->stream, &a->cp, o);
}

/* Its buffers by recompute set (tpk/runtime/buf.h), its linears' among them.
 * Selective recompute (tpk/layers/recompute.h): after its forward the attention lent out (to the
 * other blocks) the output and log-sum-exp and c_proj's output (the branch, consumed by the
 * residual add); before its backward, with h = the layernorm's output again (c_attn's saved input:
 * under SP its backward gathers the tokens itself), the attention's output is made again (no
 * GEMM). */
static inline int tpk__attention_bufs(tpk_attention *a, int set, tpk_buf **o) {
    tpk_linear *ca = &a->c_attn, *cp = &a->c_proj;
    if (set == TPK__SET_LENT) { /* (pk: remade from c_attn's output with the attention) */
        tpk_buf *l[] = {&a->out, &a->lse, &cp->y, &cp->y2, &a->pk};
        return tpk__bufs_list(o, l, 5);
    }
    if (set == TPK__SET_KEPT) { /* the GEMM outputs (c_attn's: QKV) */
        tpk_buf *l[] = {&ca->y, &ca->y2, &ca->pre, &cp->xb, &cp->pre};
        return tpk__bufs_list(o, l, 5);
    }
    o[0] = &a->dqkv;
    int n = 1 + tpk__linear_scratch(ca, o + 1);
    n += tpk__linear_scratch(cp, o + n);
    o[n] = &a->dpk;
    return n + 1 + tpk__cp_attn_scratch(&a->cp, o + n + 1);
}
static inline tpk_status tpk__attention_recompute(tpk_ctx *ctx, tpk_attention *a, tpk_tensor h) {
    tpk_tensor o;
    TPK_TRY(tpk__col_linear_input(ctx, "tpk_attention (recompute)", &a->c_attn, h));
    TPK_TRY(tpk__attention_core(ctx, a, &o));
    a->c_proj.x.data = o.data; /* c_proj's saved input */
    return TPK_OK;
}

/* y = attention(x) for B sequences of S tokens: x R [B S, H] (S(0) under sequence parallelism),
 * y in the same layout (partial_output: P [B S, H]). */
static inline tpk_status tpk_attention_forward(tpk_ctx *ctx, tpk_attention *a, tpk_tensor x,
                                               int64_t B, int64_t S, tpk_tensor *y) {
    static const char *fn = "tpk_attention_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!a || !a->A)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised attention");
    if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL");
    if (B < 0 || S < 0)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "B, S: expected >= 0, got %lld, %lld",
                         (long long)B, (long long)S);
    TPK_TRY(tpk__attn_cp_check(ctx, fn, S));
    TPK_TRY(tpk__cp_rows_check(ctx, fn, "x", &x)); /* under CP this rank's chunks, else whole */
    if (x.ndim == 2 && x.gshape[0] != tpk_cp_rows(ctx, B, S))
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "x: expected B x S%s = %lld token rows, got %lld",
                         tpk_cp_size(ctx) > 1 ? " / cp" : "", (long long)tpk_cp_rows(ctx, B, S),
                         (long long)x.gshape[0]);
    tpk_tensor qkv, o;
    TPK_TRY(tpk_col_linear_forward(ctx, &a->c_attn, x, &qkv)); /* S(-1) [T, 3 Al D], stride 3 */
    a->B = B, a->S = S, a->qkv = qkv;
    a->stream = tpk__dropout_stream(ctx, a->name);
    TPK_TRY(tpk__attention_core(ctx, a, &o));
    o = tpk__rows_of(o, &x); /* x's rows (CP), which c_proj carries to y */
    return tpk_row_linear_forward(ctx, &a->c_proj, o, y); /* P -> all-reduce (SP: reduce-scatter) */
}

/* dx of the last forward from dy (the layout of y; partial_output: R [T, H]), in the layout of x
 * (partial_dx: P [T, H]); accumulates the gradients of c_attn and c_proj. */
static inline tpk_status tpk_attention_backward(tpk_ctx *ctx, tpk_attention *a, tpk_tensor dy,
                                                tpk_tensor *dx) {
    static const char *fn = "tpk_attention_backward";
    if (!ctx) return TPK_ERR_ARG;
    if (!a || !a->A)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised attention");
    if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL");
    if (!a->qkv.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", a->name);
    TPK_TRY(tpk__cp_rows_check(ctx, fn, "dy", &dy));
    tpk_tensor dout, dq;
    TPK_TRY(tpk_row_linear_backward(ctx, &a->c_proj, dy, &dout)); /* S(-1) [T, Al D] */
    dq = tpk__rows_of(a->qkv, &dy); /* dy's rows (CP), which c_attn carries to dx */
    TPK_TRY(tpk__buf_view(ctx, &a->dqkv, &dq));
    TPK_TRY(tpk__attn_core_bwd(ctx, dq.data, dout.data, a->pack ? a->pk.p : a->qkv.data, a->out.p,
                               (const float *)a->lse.p, a->B, a->S, a->A, a->A, a->a0, a->Al, a->D,
                               a->p, a->stream, &a->cp));
    if (a->pack) { /* [dQ | dK | dV] rotated back into c_attn's layout */
        TPK_TRY(tpk__attention_pack(ctx, a, true));
        dq.data = a->dpk.p;
    }
    return tpk_col_linear_backward(ctx, &a->c_attn, dq, dx); /* all-reduce (SP: reduce-scatter;
                                                                partial_dx: none) */
}

/* ---- grouped-query attention with rotary embeddings (Llama) -------------------------------------
 *
 * A query heads, G key/value heads (G divides A; query head a reads key/value head a / (A/G)),
 * head size D = H / A. Rank r holds the query heads [a0, a0 + A_r) = tpk_tp_split(ctx, A, r) and
 * the key/value heads [g0, g0 + G_r) they read (TPK_S_GROUPED): when t > G, or when an uneven split
 * cuts a group, a key/value head is held by every rank whose query heads read it (replicated, as
 * Megatron does for t > G), and tpk_params_reduce_partial_grads sums its weight gradient over them.
 *   q_proj  column [A D, H] -> Q S(-1) [T, A_r D];  k_proj, v_proj  column [G D, H] (grouped) ->
 *           K, V [T, G_r D]; the input gathered once under SP, each dx partial, summed, and
 *           reduced once in backward (one all-reduce, SP: one reduce-scatter)
 *   rope    Q and K rotated (rotate-half) by the global token position s = row mod S (under CP
 *           the row's true position, tpk_op_rope_at), into one [T, (A_r + 2 G_r) D] buffer with
 *           V; backward rotates dQ, dK back (the transpose)
 *   attn    causal, each query head reading its key/value head in place (tpk_op_attn_fwd with G;
 *           under CP over the CP group, tpk/layers/cp_attn.h)
 *   o_proj  row [H, A D], in features in heads of D -> P -> all-reduce -> R (SP: reduce-scatter)
 * Collectives: forward 1 all-reduce of T H (SP: 1 all-gather + 1 reduce-scatter), backward the
 * same (SP: and x all-gathered again, during the attention kernel's backward, for q, k, v's
 * dW); none in the attention. Parameters "<name>.{q,k,v,o}_proj.weight" (and .bias with
 * desc.bias; q, k, v's alone with desc.qkv_bias, Qwen2's), [out, in], Hugging Face Llama's names
 * below "model.layers.N.self_attn".
 * desc.partial_output: y is o_proj's P [T, H] and dy R [T, H]; desc.partial_dx: dx is the sum of
 * the three projections' P [T, H], not reduced (no all-reduce, under SP no reduce-scatter). */

typedef struct tpk_gqa_attention_desc {
    const char *name;       /* default "attn<N>" */
    int64_t kv_heads;       /* G (divides A); 0 = A (multi-head attention) */
    float rope_theta;       /* rotary base; 0 = 10000; < 0: no rotary embedding */
    bool bias;              /* q, k, v, o projections with biases (Llama: none) */
    bool qkv_bias;          /* q, k, v with biases, o_proj without (Qwen2's attention) */
    bool sequence_parallel; /* x and y S(0) */
    float dropout;          /* on the attention probabilities */
    float init_std;         /* q, k, v weights N(0, std^2); default 0.02 */
    float proj_init_std;    /* o_proj; default init_std */
    bool partial_output;    /* y P [T, H], not reduced (o_proj's partial_output); dy then R */
    bool partial_dx;        /* backward's dx P [T, H], not reduced */
    tpk_cp_comm cp_comm;    /* under context parallelism: TPK_CP_P2P (the ring, default) or
                               TPK_CP_ALLGATHER (tpk/layers/cp_attn.h) */
} tpk_gqa_attention_desc;

typedef struct tpk_gqa_attention {
    char name[80];
    int64_t H, A, G, D;
    int64_t Al, a0, Gl, g0; /* local query heads [a0, a0 + Al), key/value heads [g0, g0 + Gl) */
    float p, theta;
    bool sp;
    bool partial_dx; /* desc.partial_dx */
    tpk_linear q_proj, k_proj, v_proj, o_proj;
    int64_t B, S;
    uint64_t stream;
    tpk_tensor x;           /* the last forward's input (R, or S(0) under SP: gathered into ctx->sp
                               when read) */
    tpk_buf qkv, out, lse, dqkv, dq, dk, dv, dx;
    tpk_cp_attn cp;         /* the attention over ctx->cp (c > 1) */
    tpk_buf rpos;           /* int32 [S / c]: the rotary positions of this CP rank's rows (c > 1) */
    int64_t rpos_S;
} tpk_gqa_attention;

static inline tpk_status tpk_gqa_attention_init(tpk_ctx *ctx, tpk_gqa_attention *a, int64_t H,
                                                int64_t A, const tpk_gqa_attention_desc *desc) {
    static const char *fn = "tpk_gqa_attention_init";
    tpk_gqa_attention_desc d;
    TPK__INIT_LAYER(ctx, fn, a, d, desc);
    int64_t G = d.kv_heads ? d.kv_heads : A;
    if (A < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "A: expected >= 1 heads, got %lld", (long long)A);
    if (H < 1 || H % A)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "H: expected a positive multiple of A = %lld, got %lld", (long long)A,
                         (long long)H);
    if (G < 1 || A % G)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "desc->kv_heads: expected a divisor of A = %lld query heads, got %lld",
                         (long long)A, (long long)G);
    if (d.rope_theta >= 0 && ((H / A) % 2))
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "H / A: rotary embeddings need an even head size, got %lld",
                         (long long)(H / A));
    if (d.rope_theta > 0 && !(d.rope_theta > 1.0f && !isinf(d.rope_theta)))
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->rope_theta: expected a finite base > 1 (0 = 10000, < 0 = none), got %g",
            (double)d.rope_theta);
    if (!(d.dropout >= 0.0f && d.dropout < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->dropout: expected 0 <= p < 1, got %g",
                         (double)d.dropout);
    TPK_TRY(tpk__layer_name(ctx, fn, a->name, sizeof a->name, d.name, "attn"));
    TPK_TRY(tpk__attn_cp_init(ctx, fn, &a->cp, d.cp_comm));
    a->H = H, a->A = A, a->G = G, a->D = H / A, a->p = d.dropout, a->sp = d.sequence_parallel;
    a->partial_dx = d.partial_dx;
    a->theta = d.rope_theta < 0 ? 0.0f : d.rope_theta > 0 ? d.rope_theta : 10000.0f;
    tpk_range heads = tpk_tp_split(ctx, A, ctx->tp.rank);
    a->a0 = heads.off, a->Al = heads.size;
    a->Gl = tpk_attn_kv_heads(A, G, a->a0, a->Al, &a->g0);
    char pn[128];
    tpk_linear_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.name = pn, ld.bias = d.bias || d.qkv_bias, ld.unit = (int)a->D, ld.partial_dx = true,
    ld.init_std = d.init_std, ld.fp8 = true; /* FP8 under ctx->fp8 (tpk/layers/fp8.h) */
    snprintf(pn, sizeof pn, "%s.q_proj", a->name);
    TPK_TRY(tpk_col_linear_init(ctx, &a->q_proj, H, A * a->D, &ld));
    ld.group = (int)(A / G); /* K and V: the key/value heads this rank's query heads read */
    snprintf(pn, sizeof pn, "%s.k_proj", a->name);
    TPK_TRY(tpk_col_linear_init(ctx, &a->k_proj, H, G * a->D, &ld));
    snprintf(pn, sizeof pn, "%s.v_proj", a->name);
    TPK_TRY(tpk_col_linear_init(ctx, &a->v_proj, H, G * a->D, &ld));
    memset(&ld, 0, sizeof ld);
    ld.name = pn, ld.bias = d.bias, ld.unit = (int)a->D, ld.sequence_parallel = d.sequence_parallel;
    ld.partial_output = d.partial_output, ld.fp8 = true;
    ld.init_std = d.proj_init_std > 0 ? d.proj_init_std : d.init_std;
    snprintf(pn, sizeof pn, "%s.o_proj", a->name);
    return tpk_row_linear_init(ctx, &a->o_proj, A * a->D, H, &ld);
}

static inline void tpk_gqa_attention_destroy(tpk_ctx *ctx, tpk_gqa_attention *a) {
    tpk_linear *ls[] = {&a->q_proj, &a->k_proj, &a->v_proj, &a->o_proj};
    for (int i = 0; i < 4; i++) tpk_linear_destroy(ctx, ls[i]);
    tpk_buf *bs[] = {&a->qkv, &a->out, &a->lse, &a->dqkv, &a->dq, &a->dk, &a->dv, &a->dx, &a->rpos};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) tpk__buf_free(ctx, bs[i]);
    tpk_cp_attn_destroy(ctx, &a->cp);
}

/* rows of src [T, n] (ld n) into columns [c0, c0 + n) of dst [T, ld] (to_packed), or back; with
 * rope, rotated (forward) or rotated back (inverse) on the way. */
static inline tpk_status tpk__gqa_move(tpk_ctx *ctx, tpk_gqa_attention *a, void *packed, int64_t ld,
                                       int64_t c0, void *x, int64_t heads, bool rope,
                                       bool to_packed) {
    int64_t T = tpk_cp_rows(ctx, a->B, a->S), n = heads * a->D;
    if (!T || !n) return TPK_OK;
    void *p = TPK__AT(packed, c0, ctx->dtype);
    if (rope && a->theta > 0)
        return to_packed ? tpk__attn_rope(ctx, &a->rpos, &a->rpos_S, p, ld, x, n, T, a->S, heads,
                                          a->D, a->theta, false)
                         : tpk__attn_rope(ctx, &a->rpos, &a->rpos_S, x, n, p, ld, T, a->S, heads,
                                          a->D, a->theta, true);
    return to_packed ? tpk_op_copy2d(ctx, p, ld, x, n, T, n, ctx->dtype)
                     : tpk_op_copy2d(ctx, x, n, p, ld, T, n, ctx->dtype);
}

/* The three projections' input R [T, H]: the saved input itself, or under sequence parallelism its
 * tokens all-gathered into the context's scratch (*xg views it) — started (req: tpk_wait before
 * reading it) or, with req NULL, done. The projections' saved inputs are set to it. */
static inline tpk_status tpk__gqa_input(tpk_ctx *ctx, tpk_gqa_attention *a, tpk_tensor *xg,
                                        tpk_request *req) {
    *xg = a->x;
    if (a->sp) TPK_TRY(tpk__sp_gather(ctx, "tpk_gqa_attention", &a->x, xg, req));
    a->q_proj.x.data = a->k_proj.x.data = a->v_proj.x.data = xg->data;
    return TPK_OK;
}

/* y = attention(x) for B sequences of S tokens: x R [B S, H] (S(0) under sequence parallelism),
 * y in the same layout (partial_output: P [B S, H]). */
static inline tpk_status tpk_gqa_attention_forward(tpk_ctx *ctx, tpk_gqa_attention *a, tpk_tensor x,
                                                   int64_t B, int64_t S, tpk_tensor *y) {
    static const char *fn = "tpk_gqa_attention_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!a || !a->A)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised attention");
    if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL");
    if (B < 0 || S < 0)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "B, S: expected >= 0, got %lld, %lld",
                         (long long)B, (long long)S);
    TPK_TRY(tpk__attn_cp_check(ctx, fn, S));
    int64_t want[2] = {tpk_cp_rows(ctx, B, S), a->H}; /* under CP this rank's B S / c rows */
    TPK_TRY(tpk__check(ctx, fn, "x", &x, a->sp ? TPK_S(0) : TPK_R, ctx->dtype, 2, want));
    TPK_TRY(tpk__cp_rows_check(ctx, fn, "x", &x)); /* under CP this rank's chunks, else whole */
    a->x = x;
    TPK_TRY(tpk__gqa_input(ctx, a, &x, NULL)); /* SP: the tokens gathered once for the three
                                                  projections */
    tpk_tensor q, k, v, o;
    TPK_TRY(tpk_col_linear_forward(ctx, &a->q_proj, x, &q)); /* [T, Al D] */
    TPK_TRY(tpk_col_linear_forward(ctx, &a->k_proj, x, &k)); /* [T, Gl D] */
    TPK_TRY(tpk_col_linear_forward(ctx, &a->v_proj, x, &v));
    int64_t T = tpk_cp_rows(ctx, B, S), Al = a->Al, Gl = a->Gl, D = a->D, ld = (Al + 2 * Gl) * D;
    a->B = B, a->S = S;
    a->stream = tpk__dropout_stream(ctx, a->name);
    TPK_TRY(tpk__buf_reserve(ctx, &a->qkv,
                             (size_t)(T * ld > 0 ? T * ld : 1) * tpk_dtype_size(ctx->dtype)));
    /* [Q | K | V], Q and K rotated */
    TPK_TRY(tpk__gqa_move(ctx, a, a->qkv.p, ld, 0, q.data, Al, true, true));
    TPK_TRY(tpk__gqa_move(ctx, a, a->qkv.p, ld, Al * D, k.data, Gl, true, true));
    TPK_TRY(tpk__gqa_move(ctx, a, a->qkv.p, ld, (Al + Gl) * D, v.data, Gl, false, true));
    TPK_TRY(tpk__attn_core(ctx, &a->out, &a->lse, a->qkv.p, B, S, a->A, a->G, a->a0, Al, D, a->p,
                           a->stream, &a->cp, &o));
    o = tpk__rows_of(o, &a->x); /* x's rows (CP), which o_proj carries to y */
    return tpk_row_linear_forward(ctx, &a->o_proj, o, y); /* P -> all-reduce (SP: reduce-scatter) */
}

/* Its buffers by recompute set (tpk/runtime/buf.h), its linears' among them.
 * Selective recompute (tpk/layers/recompute.h): lent out after the forward are the projections'
 * outputs (copied into the kept [Q | K | V] buffer, rotated), the attention's output and
 * log-sum-exp; before the backward, with h = the norm's output again (the saved input, which the
 * backward gathers under SP), the attention's output is made again (no GEMM). */
static inline int tpk__gqa_attention_bufs(tpk_gqa_attention *a, int set, tpk_buf **o) {
    tpk_linear *q = &a->q_proj, *k = &a->k_proj, *v = &a->v_proj, *op = &a->o_proj;
    if (set == TPK__SET_LENT) {
        tpk_buf *l[] = {&q->y, &k->y, &v->y, &a->out, &a->lse};
        return tpk__bufs_list(o, l, 5);
    }
    if (set == TPK__SET_KEPT) { /* [Q | K | V], the GEMM outputs */
        tpk_buf *l[] = {&a->qkv, &q->y2,  &q->pre, &k->y2,  &k->pre, &v->y2,
                        &v->pre, &op->xb, &op->y,  &op->y2, &op->pre};
        return tpk__bufs_list(o, l, 11);
    }
    tpk_buf *l[] = {&a->dqkv, &a->dq, &a->dk, &a->dv, &a->dx};
    int n = tpk__bufs_list(o, l, 5);
    tpk_linear *ls[] = {q, k, v, op};
    for (int j = 0; j < 4; j++) n += tpk__linear_scratch(ls[j], o + n);
    return n + tpk__cp_attn_scratch(&a->cp, o + n);
}
static inline tpk_status tpk__gqa_attention_recompute(tpk_ctx *ctx, tpk_gqa_attention *a,
                                                      tpk_tensor h) {
    a->x.data = h.data;
    tpk_tensor o;
    TPK_TRY(tpk__attn_core(ctx, &a->out, &a->lse, a->qkv.p, a->B, a->S, a->A, a->G, a->a0, a->Al,
                           a->D, a->p, a->stream, &a->cp, &o));
    a->o_proj.x.data = o.data; /* o_proj's saved input */
    return TPK_OK;
}

/* dx of the last forward from dy (the layout of y; partial_output: R [T, H]), in the layout of x
 * (partial_dx: P [T, H]); accumulates the four projections' gradients (a shared key/value head's
 * only partially: tpk_params_reduce_partial_grads completes it). */
static inline tpk_status tpk_gqa_attention_backward(tpk_ctx *ctx, tpk_gqa_attention *a,
                                                    tpk_tensor dy, tpk_tensor *dx) {
    static const char *fn = "tpk_gqa_attention_backward";
    if (!ctx) return TPK_ERR_ARG;
    if (!a || !a->A)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised attention");
    if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL");
    if (!a->o_proj.x.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", a->name);
    int64_t B = a->B, S = a->S, T = tpk_cp_rows(ctx, B, S), Al = a->Al, Gl = a->Gl, D = a->D,
            ld = (Al + 2 * Gl) * D;
    TPK_TRY(tpk__cp_rows_check(ctx, fn, "dy", &dy));
    tpk_tensor dout, xg;
    TPK_TRY(tpk_row_linear_backward(ctx, &a->o_proj, dy, &dout)); /* S(-1) [T, Al D] */
    TPK_TRY(tpk__buf_reserve(ctx, &a->dqkv,
                             (size_t)(T * ld > 0 ? T * ld : 1) * tpk_dtype_size(ctx->dtype)));
    tpk_request req;
    memset(&req, 0, sizeof req);
    TPK_TRY(tpk__gqa_input(ctx, a, &xg, &req)); /* SP: the tokens gathered again for the weight
                                                   gradients, during the attention's backward */
    tpk_status s =
        tpk__attn_core_bwd(ctx, a->dqkv.p, dout.data, a->qkv.p, a->out.p, (const float *)a->lse.p,
                           B, S, a->A, a->G, a->a0, Al, D, a->p, a->stream, &a->cp);
    tpk_status ws = tpk_wait(ctx, &req); /* always finish the collective */
    TPK_TRY(s);
    TPK_TRY(ws);
    tpk_tensor dq = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, a->A * D, TPK_S_EX(-1, 1, (int)D));
    tpk_tensor dk = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, a->G * D,
                                     tpk__col_out_layout(&a->k_proj)),
               dv = dk;
    TPK_TRY(tpk__buf_view(ctx, &a->dq, &dq));
    TPK_TRY(tpk__buf_view(ctx, &a->dk, &dk));
    TPK_TRY(tpk__buf_view(ctx, &a->dv, &dv));
    TPK_TRY(tpk__gqa_move(ctx, a, a->dqkv.p, ld, 0, dq.data, Al, true,
                          false)); /* dQ, dK rotated back */
    TPK_TRY(tpk__gqa_move(ctx, a, a->dqkv.p, ld, Al * D, dk.data, Gl, true, false));
    TPK_TRY(tpk__gqa_move(ctx, a, a->dqkv.p, ld, (Al + Gl) * D, dv.data, Gl, false, false));
    tpk_tensor gq, gk, gv; /* each P [T, H] */
    TPK_TRY(tpk_col_linear_backward(ctx, &a->q_proj, dq, &gq));
    TPK_TRY(tpk_col_linear_backward(ctx, &a->k_proj, dk, &gk));
    TPK_TRY(tpk_col_linear_backward(ctx, &a->v_proj, dv, &gv));
    size_t n = (size_t)(T * a->H);
    if (n) {
        TPK_TRY(tpk_op_axpby(ctx, gq.data, 1.0f, gk.data, 1.0f, ctx->dtype, n));
        TPK_TRY(tpk_op_axpby(ctx, gq.data, 1.0f, gv.data, 1.0f, ctx->dtype, n));
    }
    gq = tpk__rows_of(gq, &dy);
    if (a->partial_dx) return *dx = gq, TPK_OK; /* the caller reduces */
    tpk_tensor out = a->sp ? tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, a->H, TPK_S(0))
                           : tpk_tensor_2d(NULL, ctx->dtype, T, a->H, TPK_R);
    TPK_TRY(tpk__buf_view(ctx, &a->dx, &out));
    TPK_TRY(tpk_region_backward(ctx, a->sp ? TPK_REGION_SP_GATHER : TPK_REGION_COPY, &gq,
                                &out)); /* P -> reduce-scatter / all-reduce */
    *dx = tpk__rows_of(out, &dy);
    return TPK_OK;
}

#endif /* TPK_ATTN_H */
