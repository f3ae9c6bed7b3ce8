/* tpk/mlp.h — the tensor-parallel MLP: column c_fc H -> F, an activation on the shard (GELU-tanh by
 * default), row c_proj F -> H.
 *
 *   forward   x R [T, H] (S(0) under sequence parallelism)
 *             h_r = act(x W1_rᵀ + b1_r)    S(-1) [T, F_r]     (no communication; one fused op,
 *                                                            tpk_op_linear_fwd with act)
 *             y = h_r W2_rᵀ  P -> all-reduce -> R (SP: reduce-scatter -> S(0)); + b2
 *   backward  dh_r = dy W2_r; dW2_r += dyᵀ h_r; db2 += colsum(dy)
 *             du_r = dh_r act'(u_r); dx = du_r W1_r  P -> all-reduce (SP: reduce-scatter),
 *             overlapped with dW1_r += du_rᵀ x, db1_r += colsum(du_r)
 * One all-reduce of T H each way (SP: one all-gather and one reduce-scatter each way). */
#ifndef TPK_MLP_H
#define TPK_MLP_H

#include "linear.h"

typedef struct tpk_mlp_desc {
    const char *name;       /* parameters "<name>.c_fc.*", "<name>.c_proj.*"; default "mlp<N>" */
    int64_t hidden;         /* F; default 4 H */
    bool sequence_parallel;
    float init_std;         /* c_fc weight; default 0.02 */
    float proj_init_std;    /* c_proj weight; default init_std */
    tpk_act act;            /* between c_fc and c_proj; TPK_ACT_NONE (zero) selects the default,
                               GELU-tanh (without one the MLP would be a single linear map) */
} tpk_mlp_desc;

typedef struct tpk_mlp {
    char name[80];
    int64_t H, F;
    tpk_act act;
    tpk_linear c_fc, c_proj; /* c_fc with the activation fused (tpk_linear_desc.act) */
} tpk_mlp;

static inline tpk_status tpk_mlp_init(tpk_ctx *ctx, tpk_mlp *m, int64_t H, const tpk_mlp_desc *desc) {
    static const char *fn = "tpk_mlp_init";
    tpk_mlp_desc d;
    TPK__INIT_LAYER(ctx, fn, m, d, desc);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if ((unsigned)d.act >= (unsigned)TPK_ACT_COUNT) return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->act: expected a tpk_act, got %d", (int)d.act);
    if (d.hidden < 0) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "desc->hidden: expected >= 1 (0 = 4 H), got %lld", (long long)d.hidden);
    TPK_TRY(tpk__layer_name(ctx, fn, m->name, sizeof m->name, d.name, "mlp"));
    m->H = H, m->F = d.hidden ? d.hidden : 4 * H;
    char pn[128];
    snprintf(pn, sizeof pn, "%s.c_fc", m->name);
    tpk_linear_desc ld;
    memset(&ld, 0, sizeof ld);
    m->act = d.act != TPK_ACT_NONE ? d.act : TPK_ACT_GELU_TANH;
    ld.name = pn, ld.bias = true, ld.act = m->act, ld.sequence_parallel = d.sequence_parallel, ld.init_std = d.init_std;
    TPK_TRY(tpk_col_linear_init(ctx, &m->c_fc, H, m->F, &ld));
    snprintf(pn, sizeof pn, "%s.c_proj", m->name);
    ld.act = TPK_ACT_NONE, ld.init_std = d.proj_init_std > 0 ? d.proj_init_std : d.init_std;
    return tpk_row_linear_init(ctx, &m->c_proj, m->F, H, &ld);
}

static inline void tpk_mlp_destroy(tpk_ctx *ctx, tpk_mlp *m) {
    tpk_linear_destroy(ctx, &m->c_fc), tpk_linear_destroy(ctx, &m->c_proj);
}

/* y = c_proj(act(c_fc(x))): x R [T, H] (S(0) under sequence parallelism), y the same layout. */
static inline tpk_status tpk_mlp_forward(tpk_ctx *ctx, tpk_mlp *m, tpk_tensor x, tpk_tensor *y) {
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->H) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mlp_forward", "layer: expected an initialised MLP");
    tpk_tensor h;
    TPK_TRY(tpk_col_linear_forward(ctx, &m->c_fc, x, &h)); /* h = act(x W1_r^T + b1_r), S(-1) [T, F_r], one fused op */
    return tpk_row_linear_forward(ctx, &m->c_proj, h, y);
}

/* dx of the last forward; accumulates the gradients of c_fc and c_proj. */
static inline tpk_status tpk_mlp_backward(tpk_ctx *ctx, tpk_mlp *m, tpk_tensor dy, tpk_tensor *dx) {
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->H) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mlp_backward", "layer: expected an initialised MLP");
    tpk_tensor dh;
    TPK_TRY(tpk_row_linear_backward(ctx, &m->c_proj, dy, &dh)); /* S(-1) [T, F_r] */
    return tpk_col_linear_backward(ctx, &m->c_fc, dh, dx);  /* through act', then c_fc */
}

#endif /* TPK_MLP_H */
