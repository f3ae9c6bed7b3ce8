/* tpk/layers/cp_attn.h — attention over context parallelism (CP): every sequence split over the c
 * ranks of ctx->cp (the load-balanced split, tpk/layers/cp_split.h), forward and backward, as a
 * ring of point-to-point steps or one all-gather.
 *
 * The math. Query i's attention over all keys is the merge of its partial attentions over blocks
 * of keys: block k gives  o_k = sum_{j in k} exp(s_ij - lse_k) v_j,  lse_k = log sum_{j in k}
 * exp(s_ij)  (s_ij = scale q_i . k_j over the visible keys), and
 *     lse = log sum_k exp(lse_k),   o = sum_k exp(lse_k - lse) o_k,
 * exact in any order; the block op merges pairwise as the blocks arrive (tpk_op_attn_block_fwd,
 * merge). The backward needs no merge: with the whole attention's o and lse, P_ij =
 * exp(s_ij - lse_i) is known block by block, dS = P (dP - rowsum(dO o O)) with dP = dO V^T, and
 *     dQ = scale sum_k dS_k K_k,   dK_k = scale dS_k^T Q,   dV_k = P_k^T dO,
 * so dQ sums over the key blocks on the rank that holds Q, and a block's dK, dV over the query
 * rows of every rank (tpk_op_attn_block_bwd adds each into f32 sums).
 *
 * The layout. Rank r of c holds the B S / c rows [B, 2 Sc] of chunks r and 2c - 1 - r of each
 * sequence (Sc = S / 2c; S must be a multiple of 2c). qkv [B S / c, (Al + 2 Gl) D] as
 * tpk_op_attn_fwd's: Q, K, V of this TP rank's query heads [a0, a0 + Al) of A and the Gl of G
 * key/value heads they read (heads split over TP, the sequence over CP: the CP group is the ranks
 * of one TP rank); out [B S / c, Al D] in ctx->dtype, lse f32 [B, Al, S / c]; dqkv like qkv.
 * Query chunk m against key chunk k: causal, k < m every key visible, k = m the diagonal (causal
 * within), k > m skipped (all masked); not causal (desc.full), every block whole.
 *
 * The two modes (tpk_cp_attn_desc.comm). Only K and V travel, the Gl key/value heads packed as
 * [B S / c, 2 Gl D] (grouped-query attention sends G / A of multi-head's bytes); n = B (S / c)
 * 2 Gl D elements.
 *   TPK_CP_P2P, the ring: c - 1 steps; at step s this rank holds rank r - s's K|V, sends it to rank
 *     r + 1 and receives rank r - s - 1's from r - 1 in one point-to-point batch, started before
 *     the step's attention and waited after it (tpk_p2p_start: the transfer overlaps the compute).
 *     Forward: c - 1 sends and c - 1 receives of n elements (ctx->dtype) a rank. Backward: the
 *     same ring of K|V, and the f32 gradient of the block in hand travels with it, in two halves
 *     (rows [0, T / 2) and [T / 2, T)): once a step's attention has added this rank's part to a
 *     half, the half is started to rank r + 1 and the next step's arrives from r - 1 into the
 *     other buffer, waited just before the next step adds to it, so each half travels under the
 *     other half's attention (the same sums in the same order as one blocking message a step:
 *     the same bits); c steps, the last bringing each rank its own block's dK, dV summed over
 *     every rank: c - 1 sends of n elements (ctx->dtype) and 2c of n / 2 f32.
 *   TPK_CP_ALLGATHER (Llama 3's): K|V all-gathered over ctx->cp (started under the own block's
 *     attention): one all-gather of c n elements; the backward gathers again and reduce-scatters
 *     the f32 gradients of every block (c n in). Every rank holds c blocks at once: c times the
 *     ring's K|V memory.
 * Both merge the blocks in the same order (this rank's, then r - 1, r - 2, ...), so they give the
 * same bits. At c = 1 both are the plain attention (no message).
 *
 * Dropout (p > 0, on the probabilities): the mask of query i and key j of global head g in sequence
 * b is tpk_op_attn_fwd's, dropout_u(seed, stream, ((b A + g) S + i) S + j) >= p at their true
 * positions (each block passes its sequence's index, S, the seed and the stream; tpk_attn_blk), so
 * it does not depend on c: the attention over CP equals the attention of the whole sequence with
 * the same seed and stream. The lse is the undropped softmax's, so the merge is unchanged; the
 * backward's P keep and dP keep use the same masks. p is the desc's (tpk_cp_attn_desc.dropout);
 * a layer whose p changes, and whose stream is drawn per forward (tpk__dropout_stream), sets a->p
 * and a->stream before each forward and its backward (tpk/layers/attn.h does). */
#ifndef TPK_CP_ATTN_H
#define TPK_CP_ATTN_H

#include "cp_split.h"

typedef enum tpk_cp_comm {
    TPK_CP_P2P = 0,      /* the ring of point-to-point steps (default) */
    TPK_CP_ALLGATHER = 1 /* K and V all-gathered, their gradients reduce-scattered */
} tpk_cp_comm;

static inline const char *tpk_cp_comm_name(tpk_cp_comm m) {
    return m == TPK_CP_P2P ? "p2p" : m == TPK_CP_ALLGATHER ? "allgather" : "?";
}

typedef struct tpk_cp_attn_desc {
    tpk_cp_comm comm; /* default TPK_CP_P2P */
    bool full;        /* every key visible (no causal mask); default causal */
    float dropout;    /* on the probabilities, 0 <= p < 1 (tpk_op_attn_fwd's masks); 0 = none */
} tpk_cp_attn_desc;

typedef struct tpk_cp_attn {
    tpk_cp_comm comm;
    bool causal;
    float p;         /* the dropout (the desc's; a layer may set it before a forward) */
    uint64_t stream; /* the mask's stream (with ctx->seed): set before a forward and its backward */
    bool ready;      /* initialised */
    tpk_buf kv[2];   /* K|V [B S / c, 2 Gl D] (ctx->dtype). p2p: the block in hand and the one
                        arriving; all-gather: kv[0] this rank's, kv[1] every rank's [c, ...] */
    tpk_buf dkv[2];  /* f32 gradients of K|V. p2p: in hand and arriving; all-gather: dkv[1] every
                        block's [c, ...], dkv[0] this rank's sum */
    tpk_buf acc;     /* f32: the output (bf16 contexts) or dqkv before its cast */
} tpk_cp_attn;

/* Its buffers, all scratch within one forward or backward (a layer lists them in its recompute
 * set TPK__SET_SCRATCH, tpk/runtime/buf.h): o[0..5). */
static inline int tpk__cp_attn_scratch(tpk_cp_attn *a, tpk_buf **o) {
    o[0] = &a->kv[0], o[1] = &a->kv[1], o[2] = &a->dkv[0], o[3] = &a->dkv[1], o[4] = &a->acc;
    return 5;
}

/* Tags of the ring's messages on ctx->cp (the dK|dV halves: TPK__CP_TAG_DKV + 0, + 1). */
enum { TPK__CP_TAG_KV = 20, TPK__CP_TAG_KV_BWD = 21, TPK__CP_TAG_DKV = 22 };

/* desc: the mode (p2p needs a CP communicator with point-to-point where c > 1) and the mask. */
static inline tpk_status tpk_cp_attn_init(tpk_ctx *ctx, tpk_cp_attn *a,
                                          const tpk_cp_attn_desc *desc) {
    static const char *fn = "tpk_cp_attn_init";
    tpk_cp_attn_desc d;
    TPK__INIT_LAYER(ctx, fn, a, d, desc);
    if (d.comm != TPK_CP_P2P && d.comm != TPK_CP_ALLGATHER)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->comm: expected TPK_CP_P2P or TPK_CP_ALLGATHER, got %d",
                         (int)d.comm);
    if (!(d.dropout >= 0.0f && d.dropout < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->dropout: expected 0 <= p < 1, got %g",
                         (double)d.dropout);
    if (!ctx->ops) return tpk__fail(ctx, TPK_ERR_ARG, fn, "ctx: expected an initialised context");
    if (d.comm == TPK_CP_P2P && ctx->cp.size > 1 && !ctx->cp.vt->p2p)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->comm: the p2p ring needs point-to-point, and the CP communicator "
                         "\"%s\" has no p2p entry (TPK_CP_ALLGATHER needs none)",
                         ctx->cp.vt->name ? ctx->cp.vt->name : "?");
    a->comm = d.comm, a->causal = !d.full, a->p = d.dropout, a->ready = true;
    return TPK_OK;
}

static inline void tpk_cp_attn_destroy(tpk_ctx *ctx, tpk_cp_attn *a) {
    if (!a) return;
    for (int k = 0; k < 2; k++) tpk__buf_free(ctx, &a->kv[k]), tpk__buf_free(ctx, &a->dkv[k]);
    tpk__buf_free(ctx, &a->acc);
    a->ready = false;
}

/* The arguments of a forward or backward: the layer, B, S (a multiple of 2c), the heads, the
 * scale, the communicator (p2p: point-to-point where c > 1). */
static inline tpk_status tpk__cp_attn_args(tpk_ctx *ctx, const char *fn, const tpk_cp_attn *a,
                                           int c, int64_t B, int64_t S, int64_t A, int64_t G,
                                           int64_t a0, int64_t Al, int64_t D, float scale) {
    if (!a || !a->ready)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "a: expected an attention initialised by tpk_cp_attn_init");
    if (B < 0) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "B: expected >= 0, got %lld", (long long)B);
    TPK_TRY(tpk__cp_check_seq(ctx, fn, "S", S, c));
    if (D < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "D: expected >= 1, got %lld", (long long)D);
    if (A < 1 || G < 1 || A % G)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "G: expected a divisor of A = %lld query heads, got %lld", (long long)A,
                         (long long)G);
    if (a0 < 0 || Al < 0 || a0 + Al > A)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "a0, Al: expected local heads [a0, a0 + Al) within A = %lld, got [%lld, "
                         "%lld)",
                         (long long)A, (long long)a0, (long long)(a0 + Al));
    if (!isfinite(scale))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "scale: expected a finite scale, got %g",
                         (double)scale);
    if (!(a->p >= 0.0f && a->p < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "a->p: expected 0 <= p < 1, got %g", (double)a->p);
    if (a->comm == TPK_CP_P2P && c > 1 && !ctx->cp.vt->p2p)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "ctx->cp: the p2p ring needs point-to-point, and the CP communicator "
                         "\"%s\" has no p2p entry (TPK_CP_ALLGATHER needs none)",
                         ctx->cp.vt->name ? ctx->cp.vt->name : "?");
    return TPK_OK;
}

/* One block's geometry: B sequences' chunks of S tokens, the heads, leading dimensions (T = B S / c
 * rows), a's dropout (the sequence's index b.b set per block). */
static inline tpk_attn_blk tpk__cp_blk(tpk_ctx *ctx, const tpk_cp_attn *a, int64_t A, int64_t G,
                                       int64_t a0, int64_t Al, int64_t D, float scale, int64_t S,
                                       int c) {
    int64_t Gl = tpk_attn_kv_heads(A, G, a0, Al, NULL);
    tpk_attn_blk b;
    memset(&b, 0, sizeof b);
    b.causal = a->causal, b.Al = Al, b.D = D, b.A = A, b.G = G, b.head0 = a0, b.scale = scale;
    b.ldq = b.lddq = (Al + 2 * Gl) * D, b.ldkv = 2 * Gl * D, b.ldo = Al * D, b.ldl = S / c;
    b.p = a->p, b.seed = ctx->seed, b.stream = a->stream, b.S = S; /* attn_fwd's masks */
    return b;
}

/* The attention of this rank's queries against rank src's K|V (kv [B S / c, 2 Gl D]): forward
 * (merged into o f32 and lse; first: the first block, which writes them) or, with dq non-NULL,
 * backward (dq f32 [T, lddq], dkv f32 [B S / c, 2 Gl D] of src's block). The key pieces
 * p = 2 s + ka in [p0, p1) (sequence s's key chunk ka, Sc rows of kv at row p Sc), each against
 * the query chunks m (this rank's r, 2c - 1 - r) in turn, skipping the blocks a causal mask hides
 * (k > m). Every output row receives its blocks in the same order for any split of [0, 2B)
 * (o, lse, dq: ka 0 then 1; dkv: qa 0 then 1). */
static inline tpk_status tpk__cp_attn_src(tpk_ctx *ctx, tpk_attn_blk b, int c, int r, int src,
                                          int64_t p0, int64_t p1, int64_t S, bool first,
                                          const void *qkv, const void *kv, float *o, float *lse,
                                          float *dq, float *dkv, const void *dout, const void *out,
                                          const float *lse_in) {
    int64_t Sl = S / c, Sc = S / (2 * (int64_t)c);
    size_t es = tpk_dtype_size(ctx->dtype);
    for (int64_t p = p0; p < p1; p++)
        for (int qa = 0; qa < 2; qa++) {
            int64_t s = p / 2, ka = p % 2;
            int64_t qc = qa ? 2 * (int64_t)c - 1 - r : r, qrow = s * Sl + qa * Sc;
            int64_t kc = ka ? 2 * (int64_t)c - 1 - src : src, krow = s * Sl + ka * Sc;
            if (b.causal && kc > qc) continue; /* every key after every query */
            b.Sq = b.Sk = Sc, b.q0 = qc * Sc, b.k0 = kc * Sc, b.b = s;
            const void *q = (const char *)qkv + (size_t)(qrow * b.ldq) * es,
                       *k = (const char *)kv + (size_t)(krow * b.ldkv) * es;
            size_t lo = (size_t)(s * b.Al * Sl + qa * Sc); /* lse's [s, 0, qa Sc] */
            if (!dq)
                TPK_TRY(tpk_op_attn_block_fwd(ctx, o + qrow * b.ldo, lse + lo, q, k, &b,
                                              !(first && ka == 0), ctx->dtype));
            else
                TPK_TRY(tpk_op_attn_block_bwd(ctx, dq + qrow * b.lddq, dkv + krow * b.ldkv,
                                              (const char *)dout + (size_t)(qrow * b.ldo) * es,
                                              (const char *)out + (size_t)(qrow * b.ldo) * es,
                                              lse_in + lo, q, k, &b, ctx->dtype));
        }
    return TPK_OK;
}

/* counts[c] = n each (an all-gather's or reduce-scatter's blocks); freed by the caller when not
 * `fixed` */
static inline size_t *tpk__cp_counts(tpk_ctx *ctx, size_t *fixed, int c, size_t n) {
    size_t *cnt = c > 64 ? (size_t *)tpk__malloc(ctx, sizeof(size_t) * (size_t)c) : fixed;
    for (int q = 0; cnt && q < c; q++) cnt[q] = n;
    return cnt;
}

/* K|V of this rank's rows packed from qkv into kv[0] (n = T 2 Gl D elements). */
static inline tpk_status tpk__cp_pack_kv(tpk_ctx *ctx, tpk_cp_attn *a, const void *qkv, int64_t T,
                                         const tpk_attn_blk *b, size_t extra_blocks) {
    size_t es = tpk_dtype_size(ctx->dtype), n = (size_t)(T * b->ldkv);
    TPK_TRY(tpk__buf_reserve(ctx, &a->kv[0], n * es));
    TPK_TRY(tpk__buf_reserve(ctx, &a->kv[1], n * es * extra_blocks));
    return tpk_op_copy2d(ctx, a->kv[0].p, b->ldkv, (const char *)qkv + (size_t)(b->Al * b->D) * es,
                         b->ldq, T, b->ldkv, ctx->dtype);
}

/* out [B S / c, Al D] (ctx->dtype) and lse f32 [B, Al, S / c] of the attention of this rank's rows
 * of B sequences of S tokens over all of them, from qkv [B S / c, (Al + 2 Gl) D] (query heads
 * [a0, a0 + Al) of A, G key/value heads; s_ij = scale q_i . k_j). Collective over ctx->cp. */
static inline tpk_status tpk_cp_attn_forward(tpk_ctx *ctx, tpk_cp_attn *a, void *out, float *lse,
                                             const void *qkv, int64_t B, int64_t S, int64_t A,
                                             int64_t G, int64_t a0, int64_t Al, int64_t D,
                                             float scale) {
    static const char *fn = "tpk_cp_attn_forward";
    int c, r;
    TPK_TRY(tpk__cp_group(ctx, fn, &c, &r));
    TPK_TRY(tpk__cp_attn_args(ctx, fn, a, c, B, S, A, G, a0, Al, D, scale));
    int64_t T = B * (S / c);
    if (!T || !Al) return TPK_OK; /* alike on every rank of the CP group (one TP rank's heads) */
    if (!out || !lse || !qkv)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected a buffer, got NULL",
                         !out   ? "out"
                         : !lse ? "lse"
                                : "qkv");
    tpk_attn_blk b = tpk__cp_blk(ctx, a, A, G, a0, Al, D, scale, S, c);
    bool ring = a->comm == TPK_CP_P2P;
    size_t es = tpk_dtype_size(ctx->dtype), n = (size_t)(T * b.ldkv);
    TPK_TRY(tpk__cp_pack_kv(ctx, a, qkv, T, &b, ring ? 1 : (size_t)c));
    float *o = (float *)out;
    if (ctx->dtype != TPK_F32) {
        TPK_TRY(tpk__buf_reserve(ctx, &a->acc, sizeof(float) * (size_t)(T * b.ldo)));
        o = (float *)a->acc.p;
    }
    tpk_request req;
    memset(&req, 0, sizeof req);
    tpk_status s = TPK_OK, ws;
    if (ring) {
        for (int st = 0; st < c && s == TPK_OK; st++) {
            int src = (r - st + c) % c;
            void *cur = a->kv[st % 2].p, *nxt = a->kv[(st + 1) % 2].p;
            if (st < c - 1) { /* the next block in flight under this one's attention */
                tpk_p2p ops[2] = {{cur, n, ctx->dtype, (r + 1) % c, TPK__CP_TAG_KV, true},
                                  {nxt, n, ctx->dtype, (r - 1 + c) % c, TPK__CP_TAG_KV, false}};
                TPK_TRY(tpk_p2p_start(ctx, &ctx->cp, ops, 2, &req));
            }
            s = tpk__cp_attn_src(ctx, b, c, r, src, 0, 2 * B, S, st == 0, qkv, cur, o, lse, NULL,
                                 NULL, NULL, NULL, NULL);
            ws = tpk_wait(ctx, &req); /* always finished */
            if (s == TPK_OK) s = ws;
        }
    } else {
        size_t fixed[64], *cnt = tpk__cp_counts(ctx, fixed, c, n);
        if (!cnt) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "counts");
        if (c > 1)
            s = tpk_allgatherv_start(ctx, &ctx->cp, a->kv[0].p, n, a->kv[1].p, cnt, n * (size_t)c,
                                     ctx->dtype, &req);
        if (s == TPK_OK) /* this rank's block under the all-gather */
            s = tpk__cp_attn_src(ctx, b, c, r, r, 0, 2 * B, S, true, qkv, a->kv[0].p, o, lse, NULL,
                                 NULL, NULL, NULL, NULL);
        ws = tpk_wait(ctx, &req);
        if (s == TPK_OK) s = ws;
        for (int st = 1; st < c && s == TPK_OK; st++) {
            int src = (r - st + c) % c;
            s = tpk__cp_attn_src(ctx, b, c, r, src, 0, 2 * B, S, false, qkv,
                                 (char *)a->kv[1].p + (size_t)src * n * es, o, lse, NULL, NULL,
                                 NULL, NULL, NULL);
        }
        if (cnt != fixed) tpk__free(ctx, cnt);
    }
    TPK_TRY(s);
    return ctx->dtype != TPK_F32
               ? tpk_op_cast(ctx, out, ctx->dtype, o, TPK_F32, (size_t)(T * b.ldo))
               : TPK_OK;
}

/* dqkv [B S / c, (Al + 2 Gl) D] (ctx->dtype, qkv's layout) of the forward's qkv, from dout
 * [B S / c, Al D] and the forward's out and lse: dQ of this rank's rows, dK and dV of its rows
 * summed over every CP rank's queries. Collective over ctx->cp. */
static inline tpk_status tpk_cp_attn_backward(tpk_ctx *ctx, tpk_cp_attn *a, void *dqkv,
                                              const void *dout, const void *qkv, const void *out,
                                              const float *lse, int64_t B, int64_t S, int64_t A,
                                              int64_t G, int64_t a0, int64_t Al, int64_t D,
                                              float scale) {
    static const char *fn = "tpk_cp_attn_backward";
    int c, r;
    TPK_TRY(tpk__cp_group(ctx, fn, &c, &r));
    TPK_TRY(tpk__cp_attn_args(ctx, fn, a, c, B, S, A, G, a0, Al, D, scale));
    int64_t T = B * (S / c);
    if (!T || !Al) return TPK_OK;
    if (!dqkv || !dout || !qkv || !out || !lse)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected a buffer, got NULL",
                         !dqkv   ? "dqkv"
                         : !dout ? "dout"
                         : !qkv  ? "qkv"
                         : !out  ? "out"
                                 : "lse");
    tpk_attn_blk b = tpk__cp_blk(ctx, a, A, G, a0, Al, D, scale, S, c);
    bool ring = a->comm == TPK_CP_P2P;
    size_t es = tpk_dtype_size(ctx->dtype), n = (size_t)(T * b.ldkv), nq = (size_t)(T * b.ldq);
    TPK_TRY(tpk__cp_pack_kv(ctx, a, qkv, T, &b, ring ? 1 : (size_t)c));
    float *dst = (float *)dqkv; /* dQ's sums in Q's columns, then dK|dV in theirs */
    if (ctx->dtype != TPK_F32) {
        TPK_TRY(tpk__buf_reserve(ctx, &a->acc, sizeof(float) * nq));
        dst = (float *)a->acc.p;
    }
    TPK_TRY(tpk_op_fill(ctx, dst, TPK_F32, nq, 0.0f));
    TPK_TRY(tpk__buf_reserve(ctx, &a->dkv[0], sizeof(float) * n));
    TPK_TRY(tpk__buf_reserve(ctx, &a->dkv[1], sizeof(float) * n * (ring ? 1 : (size_t)c)));
    tpk_request req;
    memset(&req, 0, sizeof req);
    tpk_status s = TPK_OK, ws;
    const float *own = NULL; /* this rank's K|V gradient, summed over every rank */
    if (ring) {
        /* The block's f32 gradient in two halves, rows [0, T / 2) and [T / 2, T) (key pieces
           [0, B) and [B, 2B)): a half goes on to rank r + 1, and the next step's arrives from
           r - 1 into the other buffer, in a batch started as soon as this rank's part of it is
           added and waited just before the next step adds to it, so each half travels under the
           other half's attention (the same sums, in the same order, as one message a step). */
        tpk_request dreq[2];
        memset(dreq, 0, sizeof dreq);
        size_t hn = n / 2; /* n = B 2 Sc ldkv: a half is B Sc rows */
        TPK_TRY(tpk_op_fill(ctx, a->dkv[0].p, TPK_F32, n, 0.0f));
        for (int st = 0; st < c && s == TPK_OK; st++) {
            int src = (r - st + c) % c;
            void *cur = a->kv[st % 2].p, *nxt = a->kv[(st + 1) % 2].p;
            float *dcur = (float *)a->dkv[st % 2].p, *dnxt = (float *)a->dkv[(st + 1) % 2].p;
            if (st < c - 1) {
                tpk_p2p ops[2] = {{cur, n, ctx->dtype, (r + 1) % c, TPK__CP_TAG_KV_BWD, true},
                                  {nxt, n, ctx->dtype, (r - 1 + c) % c, TPK__CP_TAG_KV_BWD, false}};
                s = tpk_p2p_start(ctx, &ctx->cp, ops, 2, &req);
            }
            for (int h = 0; h < 2 && s == TPK_OK; h++) {
                s = tpk_wait(ctx, &dreq[h]); /* this step's half h in, dnxt's half h free */
                if (s == TPK_OK)
                    s = tpk__cp_attn_src(ctx, b, c, r, src, h * B, (h + 1) * B, S, false, qkv, cur,
                                         NULL, NULL, dst, dcur, dout, out, lse);
                if (s == TPK_OK && c > 1) { /* the half, with this rank's part, onward */
                    tpk_p2p ops[2] = {
                        {dcur + h * hn, hn, TPK_F32, (r + 1) % c, TPK__CP_TAG_DKV + h, true},
                        {dnxt + h * hn, hn, TPK_F32, (r - 1 + c) % c, TPK__CP_TAG_DKV + h, false}};
                    s = tpk_p2p_start(ctx, &ctx->cp, ops, 2, &dreq[h]);
                }
            }
            ws = tpk_wait(ctx, &req); /* always finished */
            if (s == TPK_OK) s = ws;
        }
        for (int h = 0; h < 2; h++) { /* the last halves: this rank's own block, summed */
            ws = tpk_wait(ctx, &dreq[h]);
            if (s == TPK_OK) s = ws;
        }
        own = (const float *)a->dkv[c > 1 ? c % 2 : 0].p;
    } else {
        size_t fixed[64], *cnt = tpk__cp_counts(ctx, fixed, c, n);
        if (!cnt) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "counts");
        float *dall = (float *)a->dkv[1].p; /* [c, n]: every block's part from this rank */
        s = tpk_op_fill(ctx, dall, TPK_F32, n * (size_t)c, 0.0f);
        if (s == TPK_OK && c > 1)
            s = tpk_allgatherv_start(ctx, &ctx->cp, a->kv[0].p, n, a->kv[1].p, cnt, n * (size_t)c,
                                     ctx->dtype, &req);
        if (s == TPK_OK)
            s = tpk__cp_attn_src(ctx, b, c, r, r, 0, 2 * B, S, false, qkv, a->kv[0].p, NULL, NULL,
                                 dst, dall + (size_t)r * n, dout, out, lse);
        ws = tpk_wait(ctx, &req);
        if (s == TPK_OK) s = ws;
        for (int st = 1; st < c && s == TPK_OK; st++) {
            int src = (r - st + c) % c;
            s = tpk__cp_attn_src(ctx, b, c, r, src, 0, 2 * B, S, false, qkv,
                                 (char *)a->kv[1].p + (size_t)src * n * es, NULL, NULL, dst,
                                 dall + (size_t)src * n, dout, out, lse);
        }
        if (s == TPK_OK && c > 1)
            s = tpk_reduce_scatterv(ctx, &ctx->cp, dall, n * (size_t)c, a->dkv[0].p, cnt, TPK_F32,
                                    TPK_SUM);
        if (cnt != fixed) tpk__free(ctx, cnt);
        own = c > 1 ? (const float *)a->dkv[0].p : dall;
    }
    TPK_TRY(s);
    TPK_TRY(tpk_op_copy2d(ctx, dst + b.Al * b.D, b.ldq, own, b.ldkv, T, b.ldkv, TPK_F32));
    return ctx->dtype != TPK_F32 ? tpk_op_cast(ctx, dqkv, ctx->dtype, dst, TPK_F32, nq) : TPK_OK;
}

#endif /* TPK_CP_ATTN_H */
