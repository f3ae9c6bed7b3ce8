/* tpk/models/block.h — the transformer block every model is made of: data (its norms, its
 * attention, its MLP, its residual style) and plain functions over it.
 *
 * Hidden states x R [T, H] (S(0) under sequence parallelism), T = B S tokens. Pre-norm, in one of
 * three residual styles (tpk_residual_style):
 *   sequential (GPT-2, Llama):      x1 = x + drop(attn(n1(x)));  y = x1 + drop(mlp(n2(x1)))
 *   parallel (GPT-NeoX):            y = x + drop(attn(n1(x))) + drop(mlp(n2(x)))
 *   parallel, one norm (GPT-J):     h = n1(x);  y = x + drop(attn(h)) + drop(mlp(h))
 * backward, the same order reversed (dy the gradient of y):
 *   sequential:  dx1 = dy + n2'(mlp'(drop'(dy)));  dx = dx1 + n1'(attn'(drop'(dx1)))
 *   parallel:    dx = dy + n2'(mlp'(drop'(dy))) + n1'(attn'(drop'(dy)))
 *   one norm:    dx = dy + n1'(mlp'(drop'(dy)) + attn'(drop'(dy)))
 * Each sublayer is a tagged choice (tpk_norm_kind, tpk_attn_kind, tpk_mlp_kind) of the kit's
 * layers — layernorm or RMSNorm; attention with one fused QKV projection (tpk_attention: GPT-2,
 * GPT-NeoX's per-head packing and partial rotary) or grouped-query attention (tpk_gqa_attention:
 * Llama); an MLP, SwiGLU, or a mixture of experts (tpk_moe: Mixtral, Qwen2-MoE; sequential
 * residual) — or a user's own attention or MLP through one small interface
 * (tpk_sublayer). The
 * block's functions switch on the tag and call the layer's own function: no table, no macro.
 * Collectives: the sequential block's are its layers', 2 all-reduces of T H forward and 2 backward
 * under TP (the two row linears forward, the two column linears backward); under SP all-gathers
 * and reduce-scatters. A parallel block of the kit's layers sums its branches while they are
 * partial and reduces once (tpk_stream, tpk/layers/layout.h): forward xr = gather(x), a =
 * attn(n1(xr)) P, m = mlp(n2(xr)) P, y = x + reduce(drop(a) + drop(m)); backward dr =
 * reduce'(dy), both branches' input gradients P, the norms' P, summed, dx = dy + gather'(sum):
 * 1 all-reduce forward and 1 backward (SP: 1 all-gather and 1 reduce-scatter each way); its
 * norms' weight gradients are then partial over TP (tpk_params_reduce_partial_grads once a
 * step). With a user's sublayer the parallel block reduces each branch (its sublayer's own
 * contract).
 * Selective recompute (tpk/layers/recompute.h): tpk_block_recompute runs the norms forward again
 * on their kept inputs and has the attention and the MLP remake their lent buffers; a block's
 * buffers by recompute set are its layers' lists (tpk_block_bufs), one after another.
 * Context parallelism (ctx->cp, c > 1): S is the whole sequence's length and x holds this rank's
 * T = B S / c rows (tpk/layers/cp_split.h); the norms, MLPs and residuals work row by row as ever,
 * the kit's attentions over the CP group (desc.cp_comm: the ring or the all-gather). */
#ifndef TPK_BLOCK_H
#define TPK_BLOCK_H

#include "../layers/attn.h"
#include "../layers/mlp.h"
#include "../layers/moe.h"
#include "../layers/norm.h"
#include "../layers/recompute.h"
#include "../layers/resid.h"

/* The recompute sets of a layer's buffers (tpk/runtime/buf.h), for a user's sublayer's bufs. */
enum {
    TPK_BUFS_LENT = TPK__SET_LENT,       /* remade by selective recompute */
    TPK_BUFS_KEPT = TPK__SET_KEPT,       /* the rest the forward writes */
    TPK_BUFS_SCRATCH = TPK__SET_SCRATCH, /* what only the backward uses */
    TPK_BUFS_MAX = TPK__SET_MAX          /* at most this many of one set, for a whole block */
};

/* ---- norm: layernorm or RMSNorm -------------------------------------------------------------- */

typedef enum tpk_norm_kind {
    TPK_NORM_LAYERNORM = 0, /* (x - mean) / sqrt(var + eps) w + b (weight and bias) */
    TPK_NORM_RMSNORM = 1    /* x / sqrt(mean(x^2) + eps) w */
} tpk_norm_kind;

typedef struct tpk_norm_desc {
    tpk_norm_kind kind;
    const char *name; /* below the block's name: "ln_1", "input_layernorm" */
    float eps;        /* 0: the layer's default (layernorm 1e-5, RMSNorm 1e-6) */
} tpk_norm_desc;

typedef struct tpk_norm {
    tpk_norm_kind kind;
    union {
        tpk_layernorm ln;
        tpk_rmsnorm rms;
    } u;
} tpk_norm;

/* sp: the input S(0) (sequence parallelism); partial: the backward takes dy P and gives dx P (a
 * parallel block's branches, tpk_layernorm_desc.partial_dy). */
static inline tpk_status tpk_norm_init(tpk_ctx *ctx, tpk_norm *n, int64_t H, const char *name,
                                       const tpk_norm_desc *d, bool sp, bool partial) {
    static const char *fn = "tpk_norm_init";
    memset(n, 0, sizeof *n);
    n->kind = d->kind;
    if (d->kind == TPK_NORM_LAYERNORM) {
        tpk_layernorm_desc ld;
        memset(&ld, 0, sizeof ld);
        ld.name = name, ld.eps = d->eps, ld.sequence_parallel = sp, ld.partial_dy = partial;
        return tpk_layernorm_init(ctx, &n->u.ln, H, &ld);
    }
    if (d->kind == TPK_NORM_RMSNORM) {
        tpk_rmsnorm_desc rd;
        memset(&rd, 0, sizeof rd);
        rd.name = name, rd.eps = d->eps, rd.sequence_parallel = sp, rd.partial_dy = partial;
        return tpk_rmsnorm_init(ctx, &n->u.rms, H, &rd);
    }
    return tpk__fail(ctx, TPK_ERR_ARG, fn,
                     "%s: kind: expected TPK_NORM_LAYERNORM or TPK_NORM_RMSNORM, got %d", name,
                     (int)d->kind);
}
static inline tpk_status tpk_norm_forward(tpk_ctx *ctx, tpk_norm *n, tpk_tensor x, tpk_tensor *y) {
    if (n->kind == TPK_NORM_RMSNORM) return tpk_rmsnorm_forward(ctx, &n->u.rms, x, y);
    return tpk_layernorm_forward(ctx, &n->u.ln, x, y);
}
static inline tpk_status tpk_norm_backward(tpk_ctx *ctx, tpk_norm *n, tpk_tensor dy,
                                           tpk_tensor *dx) {
    if (n->kind == TPK_NORM_RMSNORM) return tpk_rmsnorm_backward(ctx, &n->u.rms, dy, dx);
    return tpk_layernorm_backward(ctx, &n->u.ln, dy, dx);
}
/* acc += the input gradient (the skip path's buffer takes it in the same pass). */
static inline tpk_status tpk_norm_backward_add(tpk_ctx *ctx, tpk_norm *n, tpk_tensor dy,
                                               tpk_tensor acc) {
    if (n->kind == TPK_NORM_RMSNORM) return tpk_rmsnorm_backward_add(ctx, &n->u.rms, dy, acc);
    return tpk_layernorm_backward_add(ctx, &n->u.ln, dy, acc);
}
static inline int tpk_norm_bufs(tpk_norm *n, int set, tpk_buf **o) {
    if (n->kind == TPK_NORM_RMSNORM) return tpk__rmsnorm_bufs(&n->u.rms, set, o);
    return tpk__layernorm_bufs(&n->u.ln, set, o);
}
/* The input the last forward kept (selective recompute runs the norm again on it). */
static inline tpk_tensor *tpk_norm_input(tpk_norm *n) {
    return n->kind == TPK_NORM_RMSNORM ? &n->u.rms.x : &n->u.ln.x;
}
/* Its parameters' ids: first..last. */
static inline void tpk_norm_params(const tpk_norm *n, int *first, int *last) {
    if (n->kind == TPK_NORM_RMSNORM) *first = *last = n->u.rms.w;
    else *first = n->u.ln.w, *last = n->u.ln.b;
}
static inline void tpk_norm_destroy(tpk_ctx *ctx, tpk_norm *n) {
    if (n->kind == TPK_NORM_RMSNORM) tpk_rmsnorm_destroy(ctx, &n->u.rms);
    else tpk_layernorm_destroy(ctx, &n->u.ln);
}

/* ---- a user's sublayer ----------------------------------------------------------------------- */

/* A user's attention or MLP inside a kit block: what it does with one instance `self` (size bytes,
 * zeroed and owned by the block). Its contract is the kit's layers': x R [T, H] (S(0) under
 * sequence parallelism), y the same layout and shape, x unchanged until the backward; the backward
 * returns dx in the layout of x and accumulates the gradients of its parameters, registered by its
 * init (tpk_param_add) under "<name>.*". An attention gets B and S (causal within each of the B
 * sequences; under context parallelism x holds this rank's B S / c rows of them, cp_split.h); an
 * MLP's forward gets them too and may ignore them. */
typedef struct tpk_sublayer {
    const char *what; /* in messages: "my_attention" */
    size_t size;      /* bytes of one instance */
    tpk_status (*init)(tpk_ctx *ctx, void *self, int64_t H, const char *name, const void *user,
                       bool sequence_parallel);
    tpk_status (*forward)(tpk_ctx *ctx, void *self, tpk_tensor x, int64_t B, int64_t S,
                          tpk_tensor *y);
    tpk_status (*backward)(tpk_ctx *ctx, void *self, tpk_tensor dy, tpk_tensor *dx);
    void (*destroy)(tpk_ctx *ctx, void *self);
    /* Optional. Its tpk_bufs of one set (TPK_BUFS_*: the same ones in the same order every time;
     * NULL: it keeps its own, nothing is pooled), and the remaking of its TPK_BUFS_LENT ones from x
     * before the backward (needed when it lists any). */
    int (*bufs)(void *self, int set, tpk_buf **out);
    tpk_status (*recompute)(tpk_ctx *ctx, void *self, tpk_tensor x);
} tpk_sublayer;

/* ---- attention: fused QKV, grouped-query, or the user's -------------------------------------- */

typedef enum tpk_attn_kind {
    TPK_ATTN_FUSED = 0, /* tpk_attention: one column linear [Q; K; V] (or per head), row out */
    TPK_ATTN_GQA = 1,   /* tpk_gqa_attention: q, k, v column linears, grouped K/V heads, o row */
    TPK_ATTN_USER = 2   /* a tpk_sublayer */
} tpk_attn_kind;

typedef struct tpk_attn_desc {
    tpk_attn_kind kind;
    const char *name;         /* below the block's name: "attn", "self_attn" */
    tpk_attention_desc fused; /* TPK_ATTN_FUSED's options (its name, dropout, SP, init set by the
                                 block) */
    tpk_gqa_attention_desc gqa; /* TPK_ATTN_GQA's (likewise) */
    const tpk_sublayer *user; /* TPK_ATTN_USER: the interface, and what its init gets */
    const void *user_arg;
} tpk_attn_desc;

typedef struct tpk_block_attn {
    tpk_attn_kind kind;
    union {
        tpk_attention fused;
        tpk_gqa_attention gqa;
    } u;
    const tpk_sublayer *user;
    void *self; /* TPK_ATTN_USER's instance */
} tpk_block_attn;

/* ---- MLP: an activation between two linears, SwiGLU, or the user's --------------------------- */

typedef enum tpk_mlp_kind {
    TPK_MLP_ACT = 0,    /* tpk_mlp: column linear, activation (GELU: GPT-2, GPT-NeoX), row linear */
    TPK_MLP_SWIGLU = 1, /* tpk_swiglu_mlp: gate, up column linears, silu(g) u, down row (Llama) */
    TPK_MLP_USER = 2,   /* a tpk_sublayer */
    TPK_MLP_MOE = 3     /* tpk_moe: a router and SwiGLU experts over ctx->ep (Mixtral); x R (S(0)
                           under SP: gathered at its entry), the sequential residual only; it
                           keeps its own buffers (none lent) */
} tpk_mlp_kind;

typedef struct tpk_mlp_layer_desc {
    tpk_mlp_kind kind;
    const char *name;            /* below the block's name: "mlp" */
    tpk_mlp_desc act;            /* TPK_MLP_ACT's options (hidden, act, names) */
    tpk_swiglu_mlp_desc swiglu;  /* TPK_MLP_SWIGLU's (hidden required) */
    const tpk_sublayer *user;    /* TPK_MLP_USER */
    const void *user_arg;
    tpk_moe_desc moe;            /* TPK_MLP_MOE's (experts, top_k, hidden required; its name and
                                    init set by the block) */
} tpk_mlp_layer_desc;

typedef struct tpk_block_mlp {
    tpk_mlp_kind kind;
    union {
        tpk_mlp act;
        tpk_swiglu_mlp swiglu;
        tpk_moe moe;
    } u;
    const tpk_sublayer *user;
    void *self;
} tpk_block_mlp;

/* ---- the block ------------------------------------------------------------------------------- */

typedef enum tpk_residual_style {
    TPK_RESIDUAL_SEQUENTIAL = 0,       /* x1 = x + attn(n1(x)), y = x1 + mlp(n2(x1)) */
    TPK_RESIDUAL_PARALLEL = 1,         /* y = x + attn(n1(x)) + mlp(n2(x)) */
    TPK_RESIDUAL_PARALLEL_ONE_NORM = 2 /* y = x + attn(n1(x)) + mlp(n1(x)): no n2 */
} tpk_residual_style;

typedef struct tpk_block_desc {
    const char *name;         /* the block's: its parameters "<name>.<sublayer>.*" (required) */
    int64_t heads;            /* A (required unless the attention is the user's) */
    tpk_residual_style residual;
    tpk_norm_desc norm_1, norm_2; /* norm_2 unused with TPK_RESIDUAL_PARALLEL_ONE_NORM */
    tpk_attn_desc attn;
    tpk_mlp_layer_desc mlp;
    float dropout;            /* both residual branches and the attention's probabilities */
    bool sequence_parallel;
    float init_std;           /* the input projections' weights; 0: 0.02 */
    float proj_init_std;      /* the output projections' (attention and MLP); 0: init_std */
    tpk_cp_comm cp_comm;      /* the kit's attentions under context parallelism: TPK_CP_P2P (the
                                 ring, default) or TPK_CP_ALLGATHER (set in attn.fused / attn.gqa
                                 like sequence_parallel) */
} tpk_block_desc;

typedef struct tpk_block {
    char name[80];
    int64_t H;                /* 0: not initialised */
    tpk_residual_style residual;
    tpk_norm norm_1, norm_2;
    tpk_block_attn attn;
    tpk_block_mlp mlp;
    tpk_residual res_1, res_2; /* the branches' dropout (masks "<name>.resid_1", "_2") */
    bool partial;              /* a parallel block summing its branches while partial */
    tpk_stream stream;         /* then its two crossings of the residual stream */
    int p0, p1;                /* its parameters are ids p0..p1 */
} tpk_block;

static inline tpk_status tpk__sublayer_init(tpk_ctx *ctx, const char *fn, const char *what,
                                            const tpk_sublayer *u, void **self, int64_t H,
                                            const char *name, const void *arg, bool sp) {
    if (!u || !u->init || !u->forward || !u->backward || !u->destroy || !u->size)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->%s.user: expected a tpk_sublayer with size, init, forward, "
                         "backward and destroy, got %s",
                         what, u ? "one missing a member" : "NULL");
    if (u->bufs && !u->recompute)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->%s.user (%s): bufs given without recompute (the lent buffers "
                         "must be remade before the backward)",
                         what, u->what ? u->what : "?");
    *self = tpk__calloc(ctx, 1, u->size);
    if (!*self) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%s: %zu bytes", name, u->size);
    return u->init(ctx, *self, H, name, arg, sp);
}

/* partial: the output P and the input gradient P, not sequence parallel (a partial block's) */
static inline tpk_status tpk__block_attn_init(tpk_ctx *ctx, const char *fn, tpk_block_attn *a,
                                              int64_t H, const char *name,
                                              const tpk_block_desc *d, bool partial) {
    float std = d->init_std > 0 ? d->init_std : 0.02f;
    bool sp = d->sequence_parallel && !partial;
    a->kind = d->attn.kind;
    if (a->kind == TPK_ATTN_FUSED) {
        tpk_attention_desc ad = d->attn.fused;
        ad.name = name, ad.dropout = d->dropout, ad.sequence_parallel = sp;
        ad.partial_output = ad.partial_dx = partial, ad.cp_comm = d->cp_comm;
        ad.init_std = std, ad.proj_init_std = d->proj_init_std;
        return tpk_attention_init(ctx, &a->u.fused, H, d->heads, &ad);
    }
    if (a->kind == TPK_ATTN_GQA) {
        tpk_gqa_attention_desc gd = d->attn.gqa;
        gd.name = name, gd.dropout = d->dropout, gd.sequence_parallel = sp;
        gd.partial_output = gd.partial_dx = partial, gd.cp_comm = d->cp_comm;
        gd.init_std = std, gd.proj_init_std = d->proj_init_std;
        return tpk_gqa_attention_init(ctx, &a->u.gqa, H, d->heads, &gd);
    }
    if (a->kind == TPK_ATTN_USER) {
        a->user = d->attn.user;
        return tpk__sublayer_init(ctx, fn, "attn", a->user, &a->self, H, name, d->attn.user_arg,
                                  d->sequence_parallel);
    }
    return tpk__fail(ctx, TPK_ERR_ARG, fn,
                     "desc->attn.kind: expected TPK_ATTN_FUSED, _GQA or _USER, got %d",
                     (int)a->kind);
}
static inline tpk_status tpk__block_mlp_init(tpk_ctx *ctx, const char *fn, tpk_block_mlp *m,
                                             int64_t H, const char *name,
                                             const tpk_block_desc *d, bool partial) {
    float std = d->init_std > 0 ? d->init_std : 0.02f;
    bool sp = d->sequence_parallel && !partial;
    m->kind = d->mlp.kind;
    if (m->kind == TPK_MLP_ACT) {
        tpk_mlp_desc md = d->mlp.act;
        md.name = name, md.sequence_parallel = sp, md.partial_output = md.partial_dx = partial;
        md.init_std = std, md.proj_init_std = d->proj_init_std;
        return tpk_mlp_init(ctx, &m->u.act, H, &md);
    }
    if (m->kind == TPK_MLP_SWIGLU) {
        tpk_swiglu_mlp_desc sd = d->mlp.swiglu;
        sd.name = name, sd.sequence_parallel = sp, sd.partial_output = sd.partial_dx = partial;
        sd.init_std = std, sd.proj_init_std = d->proj_init_std;
        return tpk_swiglu_mlp_init(ctx, &m->u.swiglu, H, &sd);
    }
    if (m->kind == TPK_MLP_USER) {
        m->user = d->mlp.user;
        return tpk__sublayer_init(ctx, fn, "mlp", m->user, &m->self, H, name, d->mlp.user_arg,
                                  d->sequence_parallel);
    }
    if (m->kind == TPK_MLP_MOE) {
        if (partial)
            return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                             "desc->mlp.kind: TPK_MLP_MOE takes its input R or S(0) (not yet in a "
                             "parallel residual), expected desc->residual "
                             "TPK_RESIDUAL_SEQUENTIAL");
        tpk_moe_desc md = d->mlp.moe;
        md.name = name, md.init_std = std, md.proj_init_std = d->proj_init_std;
        md.sequence_parallel = sp; /* x S(0): gathered at its entry, y reduce-scattered */
        return tpk_moe_init(ctx, &m->u.moe, H, &md);
    }
    return tpk__fail(ctx, TPK_ERR_ARG, fn,
                     "desc->mlp.kind: expected TPK_MLP_ACT, _SWIGLU, _USER or _MOE, got %d",
                     (int)m->kind);
}

/* Build block b over hidden size H: its parameters registered in the order norm_1, attention,
 * norm_2, MLP (ids b->p0..b->p1, contiguous). */
static inline tpk_status tpk_block_init(tpk_ctx *ctx, tpk_block *b, int64_t H,
                                        const tpk_block_desc *desc) {
    static const char *fn = "tpk_block_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "block: NULL");
    if (!desc) return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc: NULL (desc->name is required)");
    memset(b, 0, sizeof *b);
    const tpk_block_desc *d = desc;
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if ((unsigned)d->residual > (unsigned)TPK_RESIDUAL_PARALLEL_ONE_NORM)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->residual: expected TPK_RESIDUAL_SEQUENTIAL, _PARALLEL or "
                         "_PARALLEL_ONE_NORM, got %d",
                         (int)d->residual);
    if (!(d->dropout >= 0.0f && d->dropout < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->dropout: expected 0 <= p < 1, got %g",
                         (double)d->dropout);
    TPK_TRY(tpk__layer_name(ctx, fn, b->name, sizeof b->name, d->name, "block"));
    b->residual = d->residual;
    /* a parallel block of the kit's layers: its branches summed while partial, one reduction */
    bool pr = d->residual != TPK_RESIDUAL_SEQUENTIAL && d->attn.kind != TPK_ATTN_USER &&
              d->mlp.kind != TPK_MLP_USER;
    bool nsp = d->sequence_parallel && !pr; /* the norms' input: S(0), or the gathered stream */
    b->partial = pr;
    tpk__params_mark(ctx); /* the block's ids, new or (a copy) reused */
    char n[160];
    snprintf(n, sizeof n, "%s.%s", b->name, d->norm_1.name ? d->norm_1.name : "norm_1");
    TPK_TRY(tpk_norm_init(ctx, &b->norm_1, H, n, &d->norm_1, nsp, pr));
    snprintf(n, sizeof n, "%s.%s", b->name, d->attn.name ? d->attn.name : "attn");
    TPK_TRY(tpk__block_attn_init(ctx, fn, &b->attn, H, n, d, pr));
    if (d->residual != TPK_RESIDUAL_PARALLEL_ONE_NORM) {
        snprintf(n, sizeof n, "%s.%s", b->name, d->norm_2.name ? d->norm_2.name : "norm_2");
        TPK_TRY(tpk_norm_init(ctx, &b->norm_2, H, n, &d->norm_2, nsp, pr));
    }
    snprintf(n, sizeof n, "%s.%s", b->name, d->mlp.name ? d->mlp.name : "mlp");
    TPK_TRY(tpk__block_mlp_init(ctx, fn, &b->mlp, H, n, d, pr));
    if (pr) {
        tpk_stream_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.sequence_parallel = d->sequence_parallel;
        TPK_TRY(tpk_stream_init(ctx, &b->stream, H, &sd));
    }
    TPK_TRY(tpk__block_residuals(ctx, b->name, d->dropout, &b->res_1, &b->res_2));
    tpk__params_marked(ctx, &b->p0, &b->p1);
    b->H = H;
    return TPK_OK;
}

/* ---- the sublayers' calls, by kind ----------------------------------------------------------- */

/* A branch's output (and input gradient) holds the rows (CP) of its input (output gradient),
 * whatever layer it is: a user's too. */
static inline tpk_status tpk__block_rows(tpk_status s, tpk_tensor *out, const tpk_tensor *in) {
    if (s == TPK_OK) *out = tpk__rows_of(*out, in);
    return s;
}
static inline tpk_status tpk__block_attn_forward(tpk_ctx *ctx, tpk_block_attn *a, tpk_tensor x,
                                                 int64_t B, int64_t S, tpk_tensor *y) {
    tpk_status s = a->kind == TPK_ATTN_FUSED ? tpk_attention_forward(ctx, &a->u.fused, x, B, S, y)
                   : a->kind == TPK_ATTN_GQA ? tpk_gqa_attention_forward(ctx, &a->u.gqa, x, B, S, y)
                                             : a->user->forward(ctx, a->self, x, B, S, y);
    return tpk__block_rows(s, y, &x);
}
static inline tpk_status tpk__block_attn_backward(tpk_ctx *ctx, tpk_block_attn *a, tpk_tensor dy,
                                                  tpk_tensor *dx) {
    tpk_status s = a->kind == TPK_ATTN_FUSED ? tpk_attention_backward(ctx, &a->u.fused, dy, dx)
                   : a->kind == TPK_ATTN_GQA ? tpk_gqa_attention_backward(ctx, &a->u.gqa, dy, dx)
                                             : a->user->backward(ctx, a->self, dy, dx);
    return tpk__block_rows(s, dx, &dy);
}
static inline tpk_status tpk__block_attn_recompute(tpk_ctx *ctx, tpk_block_attn *a, tpk_tensor h) {
    if (a->kind == TPK_ATTN_FUSED) return tpk__attention_recompute(ctx, &a->u.fused, h);
    if (a->kind == TPK_ATTN_GQA) return tpk__gqa_attention_recompute(ctx, &a->u.gqa, h);
    return a->user->recompute ? a->user->recompute(ctx, a->self, h) : TPK_OK;
}
static inline int tpk__block_attn_bufs(tpk_block_attn *a, int set, tpk_buf **o) {
    if (a->kind == TPK_ATTN_FUSED) return tpk__attention_bufs(&a->u.fused, set, o);
    if (a->kind == TPK_ATTN_GQA) return tpk__gqa_attention_bufs(&a->u.gqa, set, o);
    return a->user && a->user->bufs ? a->user->bufs(a->self, set, o) : 0;
}
static inline void tpk__block_attn_destroy(tpk_ctx *ctx, tpk_block_attn *a) {
    if (a->kind == TPK_ATTN_FUSED) tpk_attention_destroy(ctx, &a->u.fused);
    else if (a->kind == TPK_ATTN_GQA) tpk_gqa_attention_destroy(ctx, &a->u.gqa);
    else if (a->self) a->user->destroy(ctx, a->self);
    tpk__free(ctx, a->self), a->self = NULL;
}

static inline tpk_status tpk__block_mlp_forward(tpk_ctx *ctx, tpk_block_mlp *m, tpk_tensor x,
                                                int64_t B, int64_t S, tpk_tensor *y) {
    tpk_status s = m->kind == TPK_MLP_ACT      ? tpk_mlp_forward(ctx, &m->u.act, x, y)
                   : m->kind == TPK_MLP_SWIGLU ? tpk_swiglu_mlp_forward(ctx, &m->u.swiglu, x, y)
                   : m->kind == TPK_MLP_MOE    ? tpk_moe_forward(ctx, &m->u.moe, x, y)
                                               : m->user->forward(ctx, m->self, x, B, S, y);
    return tpk__block_rows(s, y, &x);
}
static inline tpk_status tpk__block_mlp_backward(tpk_ctx *ctx, tpk_block_mlp *m, tpk_tensor dy,
                                                 tpk_tensor *dx) {
    tpk_status s = m->kind == TPK_MLP_ACT      ? tpk_mlp_backward(ctx, &m->u.act, dy, dx)
                   : m->kind == TPK_MLP_SWIGLU ? tpk_swiglu_mlp_backward(ctx, &m->u.swiglu, dy, dx)
                   : m->kind == TPK_MLP_MOE /* its own aux in the loss, or the model's pooled one */
                       ? tpk_moe_backward(ctx, &m->u.moe, dy, 1.0f, dx)
                       : m->user->backward(ctx, m->self, dy, dx);
    return tpk__block_rows(s, dx, &dy);
}
static inline tpk_status tpk__block_mlp_recompute(tpk_ctx *ctx, tpk_block_mlp *m, tpk_tensor h) {
    if (m->kind == TPK_MLP_ACT) return tpk__mlp_recompute(ctx, &m->u.act, h);
    if (m->kind == TPK_MLP_SWIGLU) return tpk__swiglu_mlp_recompute(ctx, &m->u.swiglu, h);
    if (m->kind == TPK_MLP_MOE) return TPK_OK; /* nothing lent: its buffers are its own */
    return m->user->recompute ? m->user->recompute(ctx, m->self, h) : TPK_OK;
}
static inline int tpk__block_mlp_bufs(tpk_block_mlp *m, int set, tpk_buf **o) {
    if (m->kind == TPK_MLP_ACT) return tpk__mlp_bufs(&m->u.act, set, o);
    if (m->kind == TPK_MLP_SWIGLU) return tpk__swiglu_mlp_bufs(&m->u.swiglu, set, o);
    if (m->kind == TPK_MLP_MOE) return 0;
    return m->user && m->user->bufs ? m->user->bufs(m->self, set, o) : 0;
}
static inline void tpk__block_mlp_destroy(tpk_ctx *ctx, tpk_block_mlp *m) {
    if (m->kind == TPK_MLP_ACT) tpk_mlp_destroy(ctx, &m->u.act);
    else if (m->kind == TPK_MLP_SWIGLU) tpk_swiglu_mlp_destroy(ctx, &m->u.swiglu);
    else if (m->kind == TPK_MLP_MOE) tpk_moe_destroy(ctx, &m->u.moe);
    else if (m->self) m->user->destroy(ctx, m->self);
    tpk__free(ctx, m->self), m->self = NULL;
}

/* ---- forward, backward, recompute ------------------------------------------------------------ */

static inline tpk_status tpk__block_args(tpk_ctx *ctx, const char *fn, const tpk_block *b,
                                         const tpk_tensor *out) {
    if (!ctx) return TPK_ERR_ARG;
    if (!b || !b->H) return tpk__fail(ctx, TPK_ERR_ARG, fn, "block: expected an initialised block");
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "output: NULL");
    return TPK_OK;
}

/* drop(*t) in place on a branch's partial output: the mask is the same on every rank and linear,
 * so the masked partial outputs sum to the masked output (the layer sees the whole-shaped tensor
 * as the activation it is on each rank). */
static inline tpk_status tpk__block_drop_partial(tpk_ctx *ctx, tpk_residual *r, tpk_tensor t) {
    t.layout = TPK_R;
    return tpk_residual_branch_forward(ctx, r, &t);
}
/* The parallel block with partial branches (the header's sequence): one reduction forward. */
static inline tpk_status tpk__block_forward_partial(tpk_ctx *ctx, tpk_block *b, tpk_tensor x,
                                                    int64_t B, int64_t S, tpk_tensor *y) {
    tpk_tensor xr, h, a, m;
    TPK_TRY(tpk_stream_gather_forward(ctx, &b->stream, x, &xr)); /* checks x; SP: all-gather */
    TPK_TRY(tpk_norm_forward(ctx, &b->norm_1, xr, &h));
    TPK_TRY(tpk__block_attn_forward(ctx, &b->attn, h, B, S, &a)); /* P */
    if (b->residual == TPK_RESIDUAL_PARALLEL) TPK_TRY(tpk_norm_forward(ctx, &b->norm_2, xr, &h));
    TPK_TRY(tpk__block_mlp_forward(ctx, &b->mlp, h, B, S, &m)); /* P */
    TPK_TRY(tpk__block_drop_partial(ctx, &b->res_1, a));
    TPK_TRY(tpk__block_drop_partial(ctx, &b->res_2, m));
    size_t n = (size_t)tpk_numel(&a);
    if (n) TPK_TRY(tpk_op_axpby(ctx, a.data, 1.0f, m.data, 1.0f, ctx->dtype, n)); /* a + m, P */
    return tpk_stream_reduce_forward(ctx, &b->stream, a, &x, y); /* x + reduce(a + m) */
}
/* Its backward: dr = reduce'(dy) R feeds both branches; their input gradients P, through the
 * norms (partial_dy) into one P sum; dx = dy + gather'(sum): one reduction. dx is in the stream's
 * buffer. */
static inline tpk_status tpk__block_backward_partial(tpk_ctx *ctx, tpk_block *b, tpk_tensor dy,
                                                     tpk_tensor *dx) {
    tpk_tensor dr, g, da, dm, dn;
    memset(&dr, 0, sizeof dr), memset(&dn, 0, sizeof dn);
    TPK_TRY(tpk_stream_reduce_backward(ctx, &b->stream, dy, &dr)); /* checks dy; SP: all-gather */
    TPK_TRY(tpk_residual_backward(ctx, &b->res_2, dr, &g));        /* drop'(dr), the MLP's */
    TPK_TRY(tpk__block_mlp_backward(ctx, &b->mlp, g, &dm));         /* P */
    TPK_TRY(tpk_residual_backward(ctx, &b->res_1, dr, &g));
    TPK_TRY(tpk__block_attn_backward(ctx, &b->attn, g, &da));       /* P */
    if (b->residual == TPK_RESIDUAL_PARALLEL_ONE_NORM) {
        size_t n = (size_t)tpk_numel(&da);
        if (n) TPK_TRY(tpk_op_axpby(ctx, da.data, 1.0f, dm.data, 1.0f, ctx->dtype, n));
        TPK_TRY(tpk_norm_backward(ctx, &b->norm_1, da, &dn)); /* n1'(da + dm), P */
    } else {
        TPK_TRY(tpk_norm_backward(ctx, &b->norm_1, da, &dn));   /* P */
        TPK_TRY(tpk_norm_backward_add(ctx, &b->norm_2, dm, dn)); /* dn += n2'(dm), P */
    }
    return tpk_stream_gather_backward(ctx, &b->stream, dn, &dy, dx); /* dy + reduce(dn) */
}

/* y = block(x) for B sequences of S tokens: x R [B S, H] (S(0) under sequence parallelism), y the
 * same layout, in a buffer of the block's; x must stay unchanged until the backward. The
 * sequential block with layernorms fuses its first add into n2 (one pass: x1 = x + drop(a),
 * h = n2(x1)). */
static inline tpk_status tpk_block_forward(tpk_ctx *ctx, tpk_block *b, tpk_tensor x, int64_t B,
                                           int64_t S, tpk_tensor *y) {
    TPK_TRY(tpk__block_args(ctx, "tpk_block_forward", b, y));
    /* under CP the residual dropouts' masks are indexed by each row's sequence position */
    tpk_residual_set_seq(&b->res_1, S), tpk_residual_set_seq(&b->res_2, S);
    if (b->partial) return tpk__block_forward_partial(ctx, b, x, B, S, y);
    tpk_tensor h, a, x1, m;
    TPK_TRY(tpk_norm_forward(ctx, &b->norm_1, x, &h)); /* checks x: layout, [T, H] */
    TPK_TRY(tpk__block_attn_forward(ctx, &b->attn, h, B, S, &a));
    if (b->residual == TPK_RESIDUAL_PARALLEL_ONE_NORM) {
        TPK_TRY(tpk__block_mlp_forward(ctx, &b->mlp, h, B, S, &m));
        TPK_TRY(tpk_residual_forward(ctx, &b->res_1, x, a, &x1)); /* x + drop(a), in a's buffer */
        return tpk_residual_forward(ctx, &b->res_2, x1, m, y);     /* + drop(m), in m's */
    }
    if (b->residual == TPK_RESIDUAL_SEQUENTIAL && b->norm_2.kind == TPK_NORM_LAYERNORM) {
        TPK_TRY(tpk_residual_branch_forward(ctx, &b->res_1, &a)); /* drop(a) in place */
        TPK_TRY(tpk_layernorm_forward_residual(ctx, &b->norm_2.u.ln, x, a, &x1, &h));
    } else {
        TPK_TRY(tpk_residual_forward(ctx, &b->res_1, x, a, &x1));
        TPK_TRY(tpk_norm_forward(ctx, &b->norm_2, b->residual == TPK_RESIDUAL_PARALLEL ? x : x1,
                                 &h));
    }
    TPK_TRY(tpk__block_mlp_forward(ctx, &b->mlp, h, B, S, &m));
    return tpk_residual_forward(ctx, &b->res_2, x1, m, y); /* y = x1 + drop(m), in m's buffer */
}

/* The backward with the choice of where dx goes: inplace, dy's buffer (which the caller gives up)
 * receives dx — each norm's backward adds its input gradient onto the skip path's in the same pass
 * (the stack of blocks passes one gradient buffer down so); otherwise dy is left unchanged and dx
 * is in norm_1's buffer. */
static inline tpk_status tpk__block_backward(tpk_ctx *ctx, const char *fn, tpk_block *b,
                                             tpk_tensor dy, tpk_tensor *dx, bool inplace) {
    TPK_TRY(tpk__block_args(ctx, fn, b, dx));
    tpk_tensor *x1 = tpk_norm_input(&b->norm_1);
    if (!x1->ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "block \"%s\": backward before forward", b->name);
    if (b->partial) return tpk__block_backward_partial(ctx, b, dy, dx); /* dx: its own buffer */
    TPK_TRY(tpk__check(ctx, fn, "dy", &dy, x1->layout, ctx->dtype, 2, x1->gshape));
    tpk_tensor g, dh, dh2, da, dx1;
    TPK_TRY(tpk_residual_backward(ctx, &b->res_2, dy, &g)); /* drop'(dy) into the MLP branch */
    TPK_TRY(tpk__block_mlp_backward(ctx, &b->mlp, g, &dh2));
    if (b->residual == TPK_RESIDUAL_SEQUENTIAL) {
        if (inplace) { /* dx1 = dy + n2'(dh2), in dy's buffer */
            TPK_TRY(tpk_norm_backward_add(ctx, &b->norm_2, dh2, dy));
            TPK_TRY(tpk_residual_backward(ctx, &b->res_1, dy, &g)); /* drop'(dx1) */
            TPK_TRY(tpk__block_attn_backward(ctx, &b->attn, g, &da));
            TPK_TRY(tpk_norm_backward_add(ctx, &b->norm_1, da, dy)); /* dx = dx1 + n1'(da) */
            *dx = dy;
            return TPK_OK;
        }
        TPK_TRY(tpk_norm_backward(ctx, &b->norm_2, dh2, &dx1));      /* in n2's buffer */
        TPK_TRY(tpk_residual_backward_add(ctx, &b->res_2, dx1, dy)); /* dx1 += dy: the skip */
        TPK_TRY(tpk_residual_backward(ctx, &b->res_1, dx1, &g));
        TPK_TRY(tpk__block_attn_backward(ctx, &b->attn, g, &da));
        TPK_TRY(tpk_norm_backward(ctx, &b->norm_1, da, dx));         /* in n1's buffer */
        return tpk_residual_backward_add(ctx, &b->res_1, *dx, dx1);   /* dx += dx1 */
    }
    /* parallel: both branches from dy, before dy (inplace: its buffer) takes the sum */
    TPK_TRY(tpk_residual_backward(ctx, &b->res_1, dy, &g));
    TPK_TRY(tpk__block_attn_backward(ctx, &b->attn, g, &da));
    if (b->residual == TPK_RESIDUAL_PARALLEL_ONE_NORM) {
        /* dh = da + dh2: the one norm's output gradient (in the attention's buffer) */
        size_t n = (size_t)tpk_numel(&da);
        if (n) TPK_TRY(tpk_op_axpby(ctx, da.data, 1.0f, dh2.data, 1.0f, ctx->dtype, n));
        dh = da;
        if (inplace) {
            TPK_TRY(tpk_norm_backward_add(ctx, &b->norm_1, dh, dy)); /* dx = dy + n1'(dh) */
            *dx = dy;
            return TPK_OK;
        }
        TPK_TRY(tpk_norm_backward(ctx, &b->norm_1, dh, dx));
        return tpk_residual_backward_add(ctx, &b->res_1, *dx, dy);
    }
    if (inplace) { /* dx = dy + n2'(dh2) + n1'(da), in dy's buffer */
        TPK_TRY(tpk_norm_backward_add(ctx, &b->norm_2, dh2, dy));
        TPK_TRY(tpk_norm_backward_add(ctx, &b->norm_1, da, dy));
        *dx = dy;
        return TPK_OK;
    }
    TPK_TRY(tpk_norm_backward(ctx, &b->norm_2, dh2, &dx1));       /* in n2's buffer */
    TPK_TRY(tpk_residual_backward_add(ctx, &b->res_2, dx1, dy));  /* dx1 += dy: the skip path */
    TPK_TRY(tpk_norm_backward(ctx, &b->norm_1, da, dx));          /* in n1's buffer */
    return tpk_residual_backward_add(ctx, &b->res_1, *dx, dx1);    /* dx += dx1 */
}

/* dx of the last forward from dy (the layout of y), dy left unchanged, dx in a buffer of the
 * block's; every gradient of the block accumulated into the flat gradient buffer. */
static inline tpk_status tpk_block_backward(tpk_ctx *ctx, tpk_block *b, tpk_tensor dy,
                                            tpk_tensor *dx) {
    return tpk__block_backward(ctx, "tpk_block_backward", b, dy, dx, false);
}

/* Selective recompute: the norms forward again on their kept inputs (the same statistics, the
 * same outputs), the attention and the MLP remake their lent buffers (tpk/layers/recompute.h). */
static inline tpk_status tpk_block_recompute(tpk_ctx *ctx, tpk_block *b) {
    tpk_tensor h;
    TPK_TRY(tpk_norm_forward(ctx, &b->norm_1, *tpk_norm_input(&b->norm_1), &h));
    TPK_TRY(tpk__block_attn_recompute(ctx, &b->attn, h));
    if (b->residual != TPK_RESIDUAL_PARALLEL_ONE_NORM)
        TPK_TRY(tpk_norm_forward(ctx, &b->norm_2, *tpk_norm_input(&b->norm_2), &h));
    return tpk__block_mlp_recompute(ctx, &b->mlp, h);
}

/* The block's buffers of one recompute set (TPK_BUFS_*): its layers' lists, one after another. */
static inline int tpk_block_bufs(tpk_block *b, int set, tpk_buf **o) {
    int n = tpk_norm_bufs(&b->norm_1, set, o);
    n += tpk__block_attn_bufs(&b->attn, set, o + n);
    if (b->residual != TPK_RESIDUAL_PARALLEL_ONE_NORM) n += tpk_norm_bufs(&b->norm_2, set, o + n);
    n += tpk__block_mlp_bufs(&b->mlp, set, o + n);
    n += tpk__residual_bufs(&b->res_1, set, o + n);
    n += tpk__residual_bufs(&b->res_2, set, o + n);
    if (b->partial) { /* the stream: the gathered input and the output kept, gradients scratch */
        if (set == TPK__SET_KEPT) o[n++] = &b->stream.xg, o[n++] = &b->stream.y;
        if (set == TPK__SET_SCRATCH) o[n++] = &b->stream.dx, o[n++] = &b->stream.dp;
    }
    return n;
}

/* Every dropout probability of the block: the attention's and both branches'. */
static inline void tpk_block_set_dropout(tpk_block *b, float p) {
    if (b->attn.kind == TPK_ATTN_FUSED) b->attn.u.fused.p = p;
    if (b->attn.kind == TPK_ATTN_GQA) b->attn.u.gqa.p = p;
    b->res_1.drop.p = b->res_2.drop.p = p;
}

/* Frees the block's buffers (its parameters stay in the context). */
static inline void tpk_block_destroy(tpk_ctx *ctx, tpk_block *b) {
    if (!b || !b->name[0]) return;
    tpk_norm_destroy(ctx, &b->norm_1);
    if (b->residual != TPK_RESIDUAL_PARALLEL_ONE_NORM) tpk_norm_destroy(ctx, &b->norm_2);
    tpk__block_attn_destroy(ctx, &b->attn);
    tpk__block_mlp_destroy(ctx, &b->mlp);
    tpk_residual_destroy(ctx, &b->res_1), tpk_residual_destroy(ctx, &b->res_2);
    tpk_stream_destroy(ctx, &b->stream);
    memset(b, 0, sizeof *b);
}

#endif /* TPK_BLOCK_H */
