/* tpk/layers/mlp.h — the tensor-parallel MLPs: GPT-2's (column c_fc H -> F, an activation on the
 * shard, GELU-tanh by default, row c_proj F -> H) and Llama's SwiGLU (below).
 *
 *   forward   x R [T, H] (S(0) under sequence parallelism)
 *             h_r = act(x W1_rᵀ + b1_r)    S(-1) [T, F_r]     (no communication; one fused op,
 *                                                            tpk_op_linear_fwd with act)
 *             y = h_r W2_rᵀ  P -> all-reduce -> R (SP: reduce-scatter -> S(0)); + b2
 *   backward  du_r = (dy W2_r) act'(u_r), db1_r += colsum(du_r)  (one op: tpk_op_linear_bwd_act);
 *             dW2_r += dyᵀ h_r; db2 += colsum(dy)
 *             dx = du_r W1_r  P -> all-reduce (SP: reduce-scatter),
 *             overlapped with dW1_r += du_rᵀ x, db1_r += colsum(du_r)
 * One all-reduce of T H each way (SP: one all-gather and one reduce-scatter each way).
 * Partial outputs (both MLPs; a parallel residual block sums two branches and reduces once):
 * desc.partial_output leaves y as the second linear's P [T, H] (no collective; its bias on TP
 * rank 0 only) and the backward takes dy R [T, H]; desc.partial_dx leaves dx as the first linear's
 * P [T, H] (no collective). Both also under sequence parallelism (x S(0), gathered). */
#ifndef TPK_MLP_H
#define TPK_MLP_H

#include "linear.h"

typedef struct tpk_mlp_desc {
    const char *name;       /* parameters "<name>.c_fc.*", "<name>.c_proj.*"; default "mlp<N>" */
    const char *fc_name;    /* the first linear's name below `name`; default "c_fc" */
    const char *proj_name;  /* the second's; default "c_proj" */
    int64_t hidden;         /* F; default 4 H */
    bool sequence_parallel;
    float init_std;         /* c_fc weight; default 0.02 */
    float proj_init_std;    /* c_proj weight; default init_std */
    tpk_act act;            /* between c_fc and c_proj; TPK_ACT_NONE (zero) selects the default,
                               GELU-tanh (without one the MLP would be a single linear map) */
    bool partial_output;    /* y P [T, H], not reduced (c_proj's partial_output); dy then R */
    bool partial_dx;        /* backward's dx P [T, H], not reduced (c_fc's partial_dx) */
} tpk_mlp_desc;

typedef struct tpk_mlp {
    char name[80];
    int64_t H, F;
    tpk_act act;
    tpk_linear c_fc, c_proj; /* c_fc with the activation fused (tpk_linear_desc.act) */
} tpk_mlp;

static inline tpk_status tpk_mlp_init(tpk_ctx *ctx, tpk_mlp *m, int64_t H,
                                      const tpk_mlp_desc *desc) {
    static const char *fn = "tpk_mlp_init";
    tpk_mlp_desc d;
    TPK__INIT_LAYER(ctx, fn, m, d, desc);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if ((unsigned)d.act >= (unsigned)TPK_ACT_COUNT)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->act: expected a tpk_act, got %d", (int)d.act);
    if (d.hidden < 0)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "desc->hidden: expected >= 1 (0 = 4 H), got %lld",
                         (long long)d.hidden);
    TPK_TRY(tpk__layer_name(ctx, fn, m->name, sizeof m->name, d.name, "mlp"));
    m->H = H, m->F = d.hidden ? d.hidden : 4 * H;
    char pn[128];
    snprintf(pn, sizeof pn, "%s.%s", m->name, d.fc_name ? d.fc_name : "c_fc");
    tpk_linear_desc ld;
    memset(&ld, 0, sizeof ld);
    m->act = d.act != TPK_ACT_NONE ? d.act : TPK_ACT_GELU_TANH;
    ld.name = pn, ld.bias = true, ld.act = m->act, ld.sequence_parallel = d.sequence_parallel,
    ld.init_std = d.init_std, ld.partial_dx = d.partial_dx;
    ld.fp8 = true; /* FP8 under ctx->fp8 (tpk/layers/fp8.h) */
    TPK_TRY(tpk_col_linear_init(ctx, &m->c_fc, H, m->F, &ld));
    snprintf(pn, sizeof pn, "%s.%s", m->name, d.proj_name ? d.proj_name : "c_proj");
    ld.act = TPK_ACT_NONE, ld.init_std = d.proj_init_std > 0 ? d.proj_init_std : d.init_std;
    ld.partial_dx = false, ld.partial_output = d.partial_output;
    return tpk_row_linear_init(ctx, &m->c_proj, m->F, H, &ld);
}

static inline void tpk_mlp_destroy(tpk_ctx *ctx, tpk_mlp *m) {
    tpk_linear_destroy(ctx, &m->c_fc), tpk_linear_destroy(ctx, &m->c_proj);
}

/* y = c_proj(act(c_fc(x))): x R [T, H] (S(0) under sequence parallelism), y the same layout
 * (partial_output: P [T, H]). */
static inline tpk_status tpk_mlp_forward(tpk_ctx *ctx, tpk_mlp *m, tpk_tensor x, tpk_tensor *y) {
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->H)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mlp_forward", "layer: expected an initialised MLP");
    tpk_tensor h;
    TPK_TRY(tpk_col_linear_forward(ctx, &m->c_fc, x, &h)); /* h = act(x W1_r^T + b1_r), S(-1) [T,
                                                              F_r], one fused op */
    return tpk_row_linear_forward(ctx, &m->c_proj, h, y);
}

/* Its buffers by recompute set (tpk/runtime/buf.h): its linears'.
 * Selective recompute (tpk/layers/recompute.h): the MLP lends out the activation a = act(pre)
 * (c_fc's output, which c_proj reads) and keeps the pre-activation: before its backward it makes
 * a again from pre (one elementwise pass, tpk_op_act_fwd: no GEMM) and takes h (the norm's
 * output, made again) as c_fc's saved input; under SP c_fc gathers its input into the context's
 * scratch in each call. Memory: T F_r kept a block instead of 2 T F_r. */
static inline int tpk__mlp_bufs(tpk_mlp *m, int set, tpk_buf **o) {
    tpk_linear *fc = &m->c_fc, *mp = &m->c_proj;
    if (set == TPK__SET_LENT) return o[0] = &fc->y, 1;
    if (set == TPK__SET_KEPT) {
        tpk_buf *l[] = {&fc->y2, &fc->pre, &mp->xb, &mp->y, &mp->y2, &mp->pre};
        return tpk__bufs_list(o, l, 6);
    }
    return tpk__linear_scratch(fc, o) + tpk__linear_scratch(mp, o + 5);
}
static inline tpk_status tpk__mlp_recompute(tpk_ctx *ctx, tpk_mlp *m, tpk_tensor h) {
    tpk_linear *fc = &m->c_fc;
    TPK_TRY(tpk__col_linear_input(ctx, "tpk_mlp (recompute)", fc, h));
    size_t n = (size_t)(fc->T * fc->n_local); /* a = act(pre), into the lent buffer c_proj reads */
    if (!n) return TPK_OK;
    TPK_TRY(tpk__buf_reserve(ctx, &fc->y, n * tpk_dtype_size(ctx->dtype)));
    return tpk_op_act_fwd(ctx, fc->d.act, fc->y.p, fc->pre.p, ctx->dtype, n);
}

/* c_proj's dx GEMM with the activation's backward and c_fc's bias gradient in it (the MLP owns
 * both linears): du = (dy W2_r) act'(pre) and db1_r = colsum(du) in one op (tpk_op_linear_bwd_act;
 * cuBLASLt's DGELU_BGRAD epilogue), du in c_proj's dx buffer. */
static inline tpk_status tpk__mlp_dx_act(tpk_ctx *ctx, void *user, void *du, const void *dy,
                                         const void *w, int64_t T, int64_t n, int64_t out) {
    tpk_col_linear *fc = &((tpk_mlp *)user)->c_fc;
    void *db = NULL;
    if (fc->b >= 0) {
        TPK_TRY(tpk__buf_reserve(ctx, &fc->gw, (size_t)n * tpk_dtype_size(ctx->dtype)));
        db = fc->gw.p;
    }
    TPK_TRY(tpk_op_linear_bwd_act(ctx, du, db, dy, w, fc->pre.p, T, n, out, fc->d.act, ctx->dtype));
    return db ? tpk__grad_add(ctx, tpk_param_grad(ctx, fc->b), db, (size_t)n) : TPK_OK;
}

/* dx of the last forward from dy (the layout of y; partial_output: R [T, H]), in the layout of x
 * (partial_dx: P [T, H]); accumulates the gradients of c_fc and c_proj. */
static inline tpk_status tpk_mlp_backward(tpk_ctx *ctx, tpk_mlp *m, tpk_tensor dy, tpk_tensor *dx) {
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->H)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mlp_backward",
                         "layer: expected an initialised MLP");
    tpk_col_linear *fc = &m->c_fc;
    tpk_row_linear *cp = &m->c_proj;
    /* fused where c_proj took c_fc's activation as it was: the same features and rows, not
     * gathered */
    bool fuse = fc->d.act != TPK_ACT_NONE && !cp->x_was_R && !fc->d.gather_output &&
                fc->n_local == cp->n_local && fc->T == cp->T && !cp->f8; /* FP8: apart */
    tpk__row_dx own = {tpk__mlp_dx_act, m};
    tpk_tensor du;
    TPK_TRY(tpk__row_linear_backward(ctx, cp, dy, &du, fuse ? &own : NULL)); /* S(-1) [T, F_r] */
    /* then c_fc's GEMMs (the activation's backward when not fused) */
    return tpk__col_linear_backward(ctx, fc, du, dx, fuse);
}

/* ---- SwiGLU MLP (Llama) -------------------------------------------------------------------------
 *
 *   gate_up  column H -> 2F, stride 2: parameters "<name>.gate_proj.weight" and
 *   "<name>.up_proj.weight"
 *            [F, H] registered in a row, so this rank's rows of each side by side are one strided
 *            shard: gu_r = x [W_gate,r; W_up,r]ᵀ  S(-1) [T, 2 F_r] = [gate_r | up_r]
 *   swiglu   h_r = silu(gate_r) up_r  S(-1) [T, F_r]                 (tpk_op_swiglu_fwd, no
 *   communication)
 *   down     row "<name>.down_proj" F -> H: P -> all-reduce -> R (SP: reduce-scatter -> S(0))
 *   backward mirrors it (tpk_op_swiglu_bwd between the two linears).
 * One all-reduce of T H each way (SP: one all-gather and one reduce-scatter each way). */

typedef struct tpk_swiglu_mlp_desc {
    const char *name;       /* default "mlp<N>" */
    int64_t hidden;         /* F (Llama's intermediate_size); required */
    bool bias;              /* biases on the three projections (Llama: none) */
    bool sequence_parallel;
    float init_std;         /* gate and up weights; default 0.02 */
    float proj_init_std;    /* down_proj; default init_std */
    bool partial_output;    /* y P [T, H], not reduced (down's partial_output); dy then R */
    bool partial_dx;        /* backward's dx P [T, H], not reduced (gate_up's partial_dx) */
} tpk_swiglu_mlp_desc;

typedef struct tpk_swiglu_mlp {
    char name[80];
    int64_t H, F;
    tpk_linear gate_up, down;
    tpk_tensor gu; /* S(-1) [T, 2 F_r] of the last forward, owned by gate_up */
    tpk_buf h, dgu;
} tpk_swiglu_mlp;

static inline tpk_status tpk_swiglu_mlp_init(tpk_ctx *ctx, tpk_swiglu_mlp *m, int64_t H,
                                             const tpk_swiglu_mlp_desc *desc) {
    static const char *fn = "tpk_swiglu_mlp_init";
    tpk_swiglu_mlp_desc d;
    TPK__INIT_LAYER(ctx, fn, m, d, desc);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if (d.hidden < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "desc->hidden: expected >= 1 (the intermediate size F), got %lld",
                         (long long)d.hidden);
    TPK_TRY(tpk__layer_name(ctx, fn, m->name, sizeof m->name, d.name, "mlp"));
    m->H = H, m->F = d.hidden;
    char pn[128];
    tpk_linear_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.name = m->name, ld.bias = d.bias, ld.stride = 2, ld.parts[0] = "gate_proj",
    ld.parts[1] = "up_proj";
    ld.sequence_parallel = d.sequence_parallel, ld.init_std = d.init_std;
    ld.partial_dx = d.partial_dx, ld.fp8 = true; /* FP8 under ctx->fp8 (tpk/layers/fp8.h) */
    TPK_TRY(tpk_col_linear_init(ctx, &m->gate_up, H, 2 * m->F, &ld));
    memset(&ld, 0, sizeof ld);
    snprintf(pn, sizeof pn, "%s.down_proj", m->name);
    ld.name = pn, ld.bias = d.bias, ld.sequence_parallel = d.sequence_parallel,
    ld.init_std = d.proj_init_std > 0 ? d.proj_init_std : d.init_std;
    ld.partial_output = d.partial_output, ld.fp8 = true;
    return tpk_row_linear_init(ctx, &m->down, m->F, H, &ld);
}

static inline void tpk_swiglu_mlp_destroy(tpk_ctx *ctx, tpk_swiglu_mlp *m) {
    tpk_linear_destroy(ctx, &m->gate_up), tpk_linear_destroy(ctx, &m->down);
    tpk__buf_free(ctx, &m->h), tpk__buf_free(ctx, &m->dgu);
}

/* *h = silu(gate) up  S(-1) [T, F_r] in m->h, from gate_up's output m->gu */
static inline tpk_status tpk__swiglu_product(tpk_ctx *ctx, tpk_swiglu_mlp *m, tpk_tensor *h) {
    int64_t T = m->gu.shape[0], Fl = m->gu.shape[1] / 2;
    *h = tpk__rows_of(tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, m->F, TPK_S(-1)), &m->gu);
    TPK_TRY(tpk__buf_view(ctx, &m->h, h));
    return tpk_op_swiglu_fwd(ctx, h->data, m->gu.data, T, Fl, ctx->dtype);
}

/* y = down(silu(gate(x)) up(x)): x R [T, H] (S(0) under sequence parallelism), y the same
 * layout (partial_output: P [T, H]). */
static inline tpk_status tpk_swiglu_mlp_forward(tpk_ctx *ctx, tpk_swiglu_mlp *m, tpk_tensor x,
                                                tpk_tensor *y) {
    static const char *fn = "tpk_swiglu_mlp_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->H)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised SwiGLU MLP");
    TPK_TRY(tpk_col_linear_forward(ctx, &m->gate_up, x, &m->gu)); /* [T, 2 F_r] = [gate_r | up_r] */
    tpk_tensor h;
    TPK_TRY(tpk__swiglu_product(ctx, m, &h));
    return tpk_row_linear_forward(ctx, &m->down, h, y);
}

/* Its buffers by recompute set (tpk/runtime/buf.h), its linears' among them.
 * Selective recompute (tpk/layers/recompute.h): lent out is the product h (gate_up's output is
 * kept; under SP its input is gathered into the context's scratch in each call); before the
 * backward, with x = the norm's output again as gate_up's saved input, silu(gate) up is made again
 * (no GEMM). */
static inline int tpk__swiglu_mlp_bufs(tpk_swiglu_mlp *m, int set, tpk_buf **o) {
    tpk_linear *gu = &m->gate_up, *dn = &m->down;
    if (set == TPK__SET_LENT) return o[0] = &m->h, 1;
    if (set == TPK__SET_KEPT) {
        tpk_buf *l[] = {&gu->y, &gu->y2, &gu->pre, &dn->xb, &dn->y, &dn->y2, &dn->pre};
        return tpk__bufs_list(o, l, 7);
    }
    o[0] = &m->dgu;
    return 1 + tpk__linear_scratch(gu, o + 1) + tpk__linear_scratch(dn, o + 6);
}
static inline tpk_status tpk__swiglu_mlp_recompute(tpk_ctx *ctx, tpk_swiglu_mlp *m, tpk_tensor x) {
    TPK_TRY(tpk__col_linear_input(ctx, "tpk_swiglu_mlp (recompute)", &m->gate_up, x));
    tpk_tensor h;
    TPK_TRY(tpk__swiglu_product(ctx, m, &h));
    m->down.x.data = h.data; /* down's saved input */
    return TPK_OK;
}

/* dx of the last forward from dy (the layout of y; partial_output: R [T, H]), in the layout of x
 * (partial_dx: P [T, H]); accumulates the gradients of the three projections. */
static inline tpk_status tpk_swiglu_mlp_backward(tpk_ctx *ctx, tpk_swiglu_mlp *m, tpk_tensor dy,
                                                 tpk_tensor *dx) {
    static const char *fn = "tpk_swiglu_mlp_backward";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->H)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised SwiGLU MLP");
    if (!m->gu.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", m->name);
    tpk_tensor dh, dgu = m->gu;
    TPK_TRY(tpk_row_linear_backward(ctx, &m->down, dy, &dh)); /* S(-1) [T, F_r] */
    TPK_TRY(tpk__buf_view(ctx, &m->dgu, &dgu));
    TPK_TRY(tpk_op_swiglu_bwd(ctx, dgu.data, m->gu.data, dh.data, m->gu.shape[0],
                              m->gu.shape[1] / 2, ctx->dtype));
    return tpk_col_linear_backward(ctx, &m->gate_up, dgu, dx);
}

#endif /* TPK_MLP_H */
