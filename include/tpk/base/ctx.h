/* tpk/base/ctx.h — the context: backend ops, TP, CP, DP and PP groups, seed, scratch, parameters,
 * last error.
 *
 * Every public function takes the context first, returns a tpk_status and, on failure,
 * leaves one line in ctx->err naming the function, the argument and the expected value
 * (tpk_last_error). Creating and destroying a context is in tpk/runtime/init.h (it splits the world
 * communicator into groups); the checked ops are in tpk/runtime/op.h, the backend buffers in
 * tpk/runtime/buf.h, the parameter registry in tpk/layers/params.h.
 *
 * The context's two hooks (tpk_ctx_desc.allocator, .logger), as stb, sokol and miniaudio have
 * them: every host allocation the headers make for a context goes through its allocator
 * (tpk__malloc, tpk__calloc, tpk__realloc, tpk__free; default the C library's malloc, realloc and
 * free), and every message the kit prints goes through its logger (tpk_logf; default one line on
 * stderr). Backend memory — parameters, activations, scratch in tpk_buf — is the backend table's
 * (tpk_ops.alloc, .free), and the compiled archives' own host memory (the host backend's buffers,
 * its thread pool and per-op scratch; the CUDA backend's state) is theirs: replace the table to
 * place those. */
#ifndef TPK_CTX_H
#define TPK_CTX_H

#include <errno.h>

#include "comm.h"
#include "core.h"
#include "ops.h"
#include "rng.h"
#include "version.h"

/* A growable buffer in backend memory. */
typedef struct tpk_buf {
    void *p;
    size_t bytes;
} tpk_buf;

/* One registered parameter (tpk/layers/params.h). The local shard of a parameter split on
 * `split_dim` with `stride` s: the dimension is s equal blocks, each split over the TP ranks (in
 * groups of the layout's unit), and the shard is the concatenation of this rank's slice of every
 * block (s = 3 for fused QKV). */
typedef struct tpk_param {
    char name[96];
    int ndim;
    int64_t gshape[TPK_MAX_DIMS]; /* global (unsharded) shape */
    int64_t shape[TPK_MAX_DIMS];  /* local shard shape */
    tpk_layout layout;            /* R, or S(d) with its stride and unit */
    int split_dim;                /* -1: replicated */
    int stride;                   /* blocks of the split dim (>= 1) */
    bool tp_partial_grad;         /* the gradient is a partial sum over TP (SP, partial_dy) */
    size_t offset;                /* first element in the flat buffers */
    size_t numel;                 /* local elements */
    bool decay;                   /* weight decay applies (2-D weights) */
    int64_t padded_rows;          /* dim 0 as stored and sharded: gshape[0] rows, then zero rows up
                                     to this (a padded vocabulary; tpk/layers/params.h) */
    bool pp_copy;                 /* a copy of a parameter another pipeline stage holds and counts
                                     (the tied embedding's on the last stage): not counted in the
                                     gradient norm here */
    bool expert;                  /* a routed expert's weight (tpk/layers/moe.h): held by its EP
                                     rank alone (other EP ranks register other experts), its
                                     gradient to be summed over ctx->edp, not ctx->dp_cp */
} tpk_param;

typedef struct tpk_params {
    tpk_param *list;
    int n, cap;
    int *index, index_cap;   /* open-addressing hash table of ids by name (-1: empty), index_cap a
                                power of two > 2 n: tpk_param_find in constant time, model setup
                                linear in the parameters */
    size_t numel, cap_numel; /* local elements registered / allocated */
    tpk_buf data;            /* f32 [numel] master weights */
    float **at;              /* [n] or NULL: parameter i's f32 weights at at[i] instead of in data
                                (ZeRO-3, tpk/train/zero3.h: data freed, each block's weights in a
                                gathered buffer while it runs; NULL between uses) */
    void **at16;             /* [n] or NULL: a bf16 context's copies of them (ZeRO-3, as at) */
    tpk_buf grad;            /* f32 [numel] gradients */
    float **gat;             /* [n] or NULL: parameter i's f32 gradient at gat[i] instead of in
                                grad (ZeRO-3's sharded gradients, tpk/train/zero3.h: grad freed,
                                each block's gradient in a buffer while its backward runs and its
                                reduce-scatter is in flight; NULL otherwise) */
    uint64_t grad_epoch;     /* tpk_params_zero_grad's calls while gat is set: a new
                                accumulation (ZeRO-3 zeroes its gradient slice) */
    tpk_buf data16;          /* bf16 [numel] copy of data, the weights a bf16 context computes
                                with */
    bool stale16;            /* data changed since data16 was made (tpk_params_updated) */
    tpk_buf scratch;         /* f32, for adding bf16 gradients into grad */
    int mark_lo, mark_hi;    /* the least and greatest id tpk_param_add gave since
                                tpk__params_mark (a block's parameters: its range, new or
                                reused) */
    bool reuse;              /* tpk_param_add of a name already registered, with the same shape
                                and layout, gives its id (and leaves its values): another copy of
                                a model over the same parameters (a pipeline stage keeps one per
                                micro-batch in flight, tpk/train/pipe_model.h) */
    bool dp_open;            /* the gradients' data-parallel reduction is begun and not finished
                                (tpk/train/dp.h): no optimizer step reads them until it is */
    bool tp_partial_open;    /* a backward added into gradients partial over TP (tp_partial_grad,
                                at t > 1) and tpk_params_reduce_partial_grads has not summed them
                                since: P where the optimizer needs R, so it refuses them */
} tpk_params;

typedef struct tpk_profile tpk_profile; /* tpk/runtime/profile.h */

/* Host memory for the headers' allocations (tpk_ctx_desc.allocator). All zero: the C library's
 * malloc, realloc and free. alloc_fn and free_fn go together; realloc_fn is optional (NULL: the
 * kit allocates anew, copies and frees). alloc_fn returns memory aligned as malloc's, or NULL
 * (the kit then fails with TPK_ERR_NOMEM); the kit never asks for 0 bytes and never frees NULL.
 * They are called from the threads that call the kit, never from the host backend's workers. */
typedef struct tpk_allocator {
    void *(*alloc_fn)(size_t bytes, void *user_data);
    void (*free_fn)(void *p, void *user_data);
    void *(*realloc_fn)(void *p, size_t bytes, void *user_data); /* p != NULL, bytes > 0; NULL
                                                                    on failure, p kept */
    void *user_data;
} tpk_allocator;

/* How much a message matters (tpk_logger). */
typedef enum tpk_log_level {
    TPK_LOG_ERROR = 1, /* a failure reported: tpk_report */
    TPK_LOG_WARN = 2,  /* something went wrong that the call survived (gnuplot failed) */
    TPK_LOG_INFO = 3,  /* what the kit was asked to print: the profile table (TPK_PROFILE=1), the
                          plot files tpk_log_close wrote */
    TPK_LOG_DEBUG = 4  /* every failure as it is recorded (tpk_fail), before the caller has seen
                          it: a caller may still handle it (the planner's refused configurations);
                          not printed by default */
} tpk_log_level;

/* Where the kit's messages go (tpk_ctx_desc.logger). func NULL: ERROR, WARN and INFO each one line
 * on stderr, DEBUG dropped. A message is one line without its newline. */
typedef struct tpk_logger {
    void (*func)(tpk_log_level level, const char *message, void *user_data);
    void *user_data;
} tpk_logger;

typedef struct tpk_ctx_desc {
    const tpk_ops *ops; /* default: tpk_ops_default() (the host backend, tpk/runtime/init.h) */
    tpk_comm *world;    /* default: one rank (self) */
    int tp;             /* TP group size, consecutive ranks; default 1 */
    int pp;             /* pipeline stages (PP group size), the slowest index of the mesh (world
                           rank = tp rank + t (cp rank + c (dp rank + d pp rank))); default 1. The
                           DP size is what is left: world size / (tp cp pp) */
    uint64_t seed;      /* initialisation and dropout seed */
    tpk_dtype dtype;    /* activations and GEMM operands: TPK_F32 (default) or TPK_BF16 (mixed
                           precision: weights used through a bf16 copy of the f32 master weights,
                           gradients accumulated in f32, f32 arithmetic inside every op) */
    const double *tp_weights; /* [tp] positive weights (e.g. each TP rank's speed): every TP split —
                           features, heads, vocabulary rows, tokens under sequence parallelism —
                           gives rank r a share proportional to tp_weights[r] (tpk_split_weighted);
                           NULL: even splits. The same on every rank. */
    bool deterministic; /* every op gives the same bits on every run (a backend otherwise may sum
                           in a run-dependent order: the CUDA tensor-core attention backward adds
                           dQ with f32 atomics by default, as FlashAttention-2 does) */
    tpk_allocator allocator; /* the headers' host allocations (zero: the C library's) */
    tpk_logger logger;       /* the kit's messages (zero: stderr) */
    int cp;                  /* context-parallel group size (CP: ranks splitting every sequence,
                                tpk/layers/cp_attn.h), the mesh's second index after TP; default 1
                                (the mesh, ranks and groups as without it) */
    int ep;                  /* expert-parallel group size (EP: ranks that split a mixture of
                                experts' experts and exchange its tokens, tpk/layers/moe.h), carved
                                out of the DP ranks: it divides the DP size, and an EP group is ep
                                consecutive DP ranks of one TP rank, CP rank and stage; default 1
                                (the mesh, ranks and groups as without it) */
    int zero_shard_size;     /* HSDP: ZeRO's slices over groups of this many consecutive ranks of
                                the DP x CP group (ctx->zshard), the slices' sums all-reduced
                                across the groups (ctx->zrep); a divisor >= 2 of DP x CP. 0 (the
                                default) or DP x CP itself: one group, the whole of it */
} tpk_ctx_desc;

struct tpk_ctx {
    const tpk_ops *ops;
    tpk_comm *world;
    tpk_comm self_world;  /* used when desc.world is NULL */
    tpk_comm tp, dp, pp;  /* owned groups: TP (consecutive ranks), DP (the same TP and CP rank
                             and stage), PP (the same TP, CP and DP rank: the stages of one
                             pipeline, ranked by stage); CP: `cp` below */
    double *tp_w;         /* [tp.size] the TP split's weights (tpk_ctx_desc.tp_weights); NULL:
                             even */
    uint64_t seed;
    tpk_dtype dtype;      /* activation dtype (tpk_ctx_desc.dtype) */
    bool deterministic;   /* tpk_ctx_desc.deterministic; may be changed between steps */
    uint64_t rng_step;    /* dropout masks are drawn from (seed, layer, rng_step): a trainer sets it
                             to a new value per micro-batch (e.g. the micro-step counter) */
    tpk_buf work[2];      /* scratch for layouts that must be rearranged */
    tpk_buf sp;           /* sequence parallelism's one full-token scratch [T, features], shared by
                             every layer and held only within one call: a column linear's
                             all-gathered input (forward, and again in its backward), a row linear's
                             or the embedding's partial sums before their reduce-scatter, their
                             all-gathered output gradient (tpk__sp_view) */
    tpk_buf normsq;       /* f64 [2] in backend memory: the gradient's sum of squares, steps skipped
                             (tpk/train/optim.h) */
    tpk_params params;
    int nauto;            /* counter for automatic layer names */
    tpk_status last;
    char err[512];
    tpk_profile *prof;    /* the profiler (tpk/runtime/profile.h), NULL when off */
    size_t mem, mem_peak; /* bytes held in the kit's buffers (tpk_buf: parameters, gradients, their
                             bf16 copy, activations, scratch; the optimizer's moments) now and at
                             most (tpk_mem_peak) */
    tpk_allocator allocator; /* tpk_ctx_desc.allocator; a zeroed context (before tpk_ctx_init):
                                the C library's, or what the program sets here first */
    tpk_logger logger;       /* tpk_ctx_desc.logger (likewise) */
    tpk_comm cp;             /* owned group: CP (the same TP, DP and PP rank: the ranks that split
                                one sequence, ranked by CP rank); one rank (`self`) at cp = 1 */
    tpk_comm *dp_cp;         /* the ranks holding the same weights (the same TP rank and stage:
                                DP x CP, ranked by world rank, CP fastest), over which a weight's
                                gradient is summed (the data-parallel reduction) and ZeRO-1 shards:
                                &dp at cp = 1 (the DP group itself), &dp_cp_group at cp > 1 */
    tpk_comm dp_cp_group;    /* owned group: DP x CP at cp > 1 (not split, zero, at cp = 1) */
    tpk_comm ep;             /* owned group: EP (tpk_ctx_desc.ep: the same TP and CP rank, stage
                                and DP rank / ep, ranked by DP rank % ep, its EP rank); one rank
                                (`self`) at ep = 1 */
    tpk_comm *edp;           /* the replicas of an expert's weights (expert data parallelism: the
                                same TP rank, stage and EP rank; DP / ep x CP of them, ranked by
                                cp rank + cp (dp rank / ep)), over which an expert's gradient is
                                to be summed as the dense weights' over dp_cp: dp_cp itself at
                                ep = 1 (the DP group at cp = 1), &edp_group at ep > 1 */
    tpk_comm edp_group;      /* owned group: EDP at ep > 1 (not split, zero, at ep = 1) */
    struct tpk_fp8 *fp8;     /* the FP8 recipe (tpk/layers/fp8.h: tpk_fp8_init sets it) that the
                                linears made with tpk_linear_desc.fp8 use; NULL: none */
    tpk_comm *zshard;        /* the group ZeRO slices over: ctx->dp_cp itself, or under HSDP
                                (tpk_ctx_desc.zero_shard_size S) &zshard_group, S consecutive ranks
                                of it (ranked by their DP x CP rank) */
    tpk_comm zshard_group;   /* owned group: HSDP's shard group (not split, zero, without HSDP) */
    tpk_comm *zrep;          /* HSDP: the ranks holding the same slice in the other shard groups
                                (DP x CP / S of them, ranked by shard group), over which a slice's
                                gradient sums are all-reduced; NULL without HSDP */
    tpk_comm zrep_group;     /* owned group: HSDP's replica group (not split, zero, without) */
};

/* ---- the hooks: messages and host memory --------------------------------------------------- */

/* Pass one message to the context's logger (ctx NULL, or no logger: the default, above). */
static inline void tpk__log_msg(const tpk_ctx *ctx, tpk_log_level level, const char *msg) {
    if (ctx && ctx->logger.func) ctx->logger.func(level, msg, ctx->logger.user_data);
    else if (level != TPK_LOG_DEBUG) fprintf(stderr, "%s\n", msg);
}
/* A message, printf-style, through the context's logger: the kit's own (every message it prints)
 * and yours. One line, without its newline; at most 1023 bytes are kept. */
static inline void tpk_vlogf(const tpk_ctx *ctx, tpk_log_level level, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    tpk__log_msg(ctx, level, msg);
}
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline void
tpk_logf(const tpk_ctx *ctx, tpk_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tpk_vlogf(ctx, level, fmt, ap);
    va_end(ap);
}

/* Allocator a (NULL or zero: the C library's): bytes (0 asks for 1) ... */
static inline void *tpk__al_malloc(const tpk_allocator *a, size_t bytes) {
    if (!bytes) bytes = 1;
    return a && a->alloc_fn ? a->alloc_fn(bytes, a->user_data) : malloc(bytes);
}
/* ... n x size zeroed bytes (NULL when the product overflows) ... */
static inline void *tpk__al_calloc(const tpk_allocator *a, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    if (!(a && a->alloc_fn)) return calloc(n ? n : 1, size ? size : 1);
    size_t bytes = n * size;
    void *p = tpk__al_malloc(a, bytes);
    if (p) memset(p, 0, bytes > 0 ? bytes : 1);
    return p;
}
/* ... p (holding old_bytes; NULL: none) grown or shrunk to bytes, its contents kept up to the
 * smaller; NULL on failure, p then kept ... */
static inline void *tpk__al_realloc(const tpk_allocator *a, void *p, size_t old_bytes,
                                    size_t bytes) {
    if (!bytes) bytes = 1;
    if (!p) return tpk__al_malloc(a, bytes);
    if (!(a && a->alloc_fn)) return realloc(p, bytes);
    if (a->realloc_fn) return a->realloc_fn(p, bytes, a->user_data);
    void *q = a->alloc_fn(bytes, a->user_data);
    if (q) memcpy(q, p, old_bytes < bytes ? old_bytes : bytes), a->free_fn(p, a->user_data);
    return q;
}
/* ... and p given back (NULL: nothing). */
static inline void tpk__al_free(const tpk_allocator *a, void *p) {
    if (!p) return;
    if (a && a->alloc_fn) a->free_fn(p, a->user_data);
    else free(p);
}
/* The same with the context's allocator (ctx NULL: the C library's): what the kit's code calls. */
static inline void *tpk__malloc(const tpk_ctx *ctx, size_t bytes) {
    return tpk__al_malloc(ctx ? &ctx->allocator : NULL, bytes);
}
static inline void *tpk__calloc(const tpk_ctx *ctx, size_t n, size_t size) {
    return tpk__al_calloc(ctx ? &ctx->allocator : NULL, n, size);
}
static inline void *tpk__realloc(const tpk_ctx *ctx, void *p, size_t old_bytes, size_t bytes) {
    return tpk__al_realloc(ctx ? &ctx->allocator : NULL, p, old_bytes, bytes);
}
static inline void tpk__free(const tpk_ctx *ctx, void *p) {
    tpk__al_free(ctx ? &ctx->allocator : NULL, p);
}
/* A copy of the context's allocator (ctx NULL: zero, the C library's), for an object that frees
 * its memory without a context (tpk__al_*). */
static inline tpk_allocator tpk__allocator(const tpk_ctx *ctx) {
    tpk_allocator a;
    memset(&a, 0, sizeof a);
    if (ctx) a = ctx->allocator;
    return a;
}
/* Free memory the kit handed to you (tpk_tokenizer_encode's ids, tpk_tokenizer_decode's text,
 * tpk_plan's list): with the allocator of the context you passed it. */
static inline void tpk_free(const tpk_ctx *ctx, void *p) { tpk__free(ctx, p); }

/* Record a failure: "fn: message" (the va_list form serves callers that format elsewhere). */
static inline tpk_status tpk__vfail(tpk_ctx *ctx, tpk_status s, const char *fn, const char *fmt,
                                    va_list ap) {
    if (ctx) {
        int n = snprintf(ctx->err, sizeof ctx->err, "%s: ", fn);
        if (n < 0 || (size_t)n >= sizeof ctx->err) n = 0;
        vsnprintf(ctx->err + n, sizeof ctx->err - (size_t)n, fmt, ap);
        ctx->last = s;
        if (ctx->logger.func) ctx->logger.func(TPK_LOG_DEBUG, ctx->err, ctx->logger.user_data);
    }
    return s;
}
/* Record a failure "fn: message" in the context and return s (so `return tpk_fail(...)` reads
 * naturally): the kit's own error convention, for code outside the kit too (a layer, an op
 * table or a trainer of one's own). tpk__fail is the name the kit's code uses. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static inline tpk_status
tpk_fail(tpk_ctx *ctx, tpk_status s, const char *fn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tpk__vfail(ctx, s, fn, fmt, ap);
    va_end(ap);
    return s;
}
#define tpk__fail tpk_fail

/* The message of the last failure ("" when none). */
static inline const char *tpk_last_error(const tpk_ctx *ctx) {
    return ctx ? ctx->err : "tpk: no context";
}
static inline void tpk_clear_error(tpk_ctx *ctx) { ctx->err[0] = 0, ctx->last = TPK_OK; }

/* Report a failure, "where: message (status)", through the context's logger (TPK_LOG_ERROR; by
 * default on stderr) and return the status, for use in programs. */
static inline tpk_status tpk_report(const tpk_ctx *ctx, tpk_status s, const char *where) {
    if (s != TPK_OK)
        tpk_logf(ctx, TPK_LOG_ERROR, "%s: %s (%s)", where, tpk_last_error(ctx), tpk_status_str(s));
    return s;
}

/* Shape as "[a, b, c]" into buf. */
static inline const char *tpk__shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

/* ---- the TP group's splits: even, or weighted by tpk_ctx_desc.tp_weights --------------------- */

/* Shard q of n elements over the TP group (rank q's features, heads, vocabulary rows or tokens). */
static inline tpk_range tpk_tp_split(const tpk_ctx *ctx, int64_t n, int q) {
    return tpk_split_weighted(n, ctx->tp_w, ctx->tp.size, q);
}
/* tpk_shard_run / _owned / _size on the TP group (core.h). */
static inline tpk_range tpk_tp_shard_run(const tpk_ctx *ctx, int64_t n, tpk_layout l, int q,
                                         int b) {
    return tpk_shard_run_w(n, l, ctx->tp.size, ctx->tp_w, q, b);
}
static inline tpk_range tpk_tp_shard_owned(const tpk_ctx *ctx, int64_t n, tpk_layout l, int q) {
    return tpk_shard_owned_w(n, l, ctx->tp.size, ctx->tp_w, q);
}
static inline int64_t tpk_tp_shard_size(const tpk_ctx *ctx, int64_t n, tpk_layout l, int q) {
    return tpk_shard_size_w(n, l, ctx->tp.size, ctx->tp_w, q);
}
/* The vocabulary's split over the TP group: the rows of a (padded) vocabulary table of Vp rows, and
 * the columns of its logits. Even splits: tpk_tp_split. Weighted, with Vp a multiple of 64 (a
 * padded vocabulary, tpk_vocab_padded): Vp / 64 units of 64 rows split by weight, so every shard
 * stays a multiple of 64 rows and equal weights give the even split of a vocabulary padded for even
 * shards. The unit is part of the layout — the table is tpk_tp_vocab_layout(ctx, Vp, 0), the
 * logits tpk_tp_vocab_layout(ctx, Vp, -1) — so the embedding, the LM head, the cross-entropy,
 * sampling and the parameter registry (gather, scatter, checkpoints) agree. */
static inline int tpk_tp_vocab_unit(const tpk_ctx *ctx, int64_t Vp) {
    return ctx->tp_w && Vp > 0 && Vp % 64 == 0 ? 64 : 1;
}
static inline tpk_layout tpk_tp_vocab_layout(const tpk_ctx *ctx, int64_t Vp, int dim) {
    int u = tpk_tp_vocab_unit(ctx, Vp);
    return u > 1 ? TPK_S_EX(dim, 1, u) : TPK_S(dim);
}
/* Rows [off, off + size) of the vocabulary on TP rank q. */
static inline tpk_range tpk_tp_vocab_split(const tpk_ctx *ctx, int64_t Vp, int q) {
    return tpk_tp_shard_run(ctx, Vp, tpk_tp_vocab_layout(ctx, Vp, 0), q, 0);
}
/* This TP rank's shard of a 2-D tensor [rows, cols] in layout l. */
static inline tpk_tensor tpk_tp_tensor_2d(const tpk_ctx *ctx, void *data, tpk_dtype dt,
                                          int64_t rows, int64_t cols, tpk_layout l) {
    tpk_tensor t = tpk_tensor_2d(data, dt, rows, cols, l);
    int d = tpk_layout_dim(l, 2);
    if (d >= 0) t.shape[d] = tpk_tp_shard_size(ctx, d ? cols : rows, l, ctx->tp.rank);
    return t;
}

/* Check a tensor argument: data present, dtype, rank, layout, global shape (entries < 0 are
 * free), and a local shape consistent with the layout on this rank of the TP group (its split,
 * weighted when the context's is: tpk_tp_shard_size). */
static inline tpk_status tpk__check(tpk_ctx *ctx, const char *fn, const char *arg,
                                    const tpk_tensor *t, tpk_layout want, tpk_dtype dt, int ndim,
                                    const int64_t *gshape) {
    char a[64], b[64];
    if (!t) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected a tensor, got NULL", arg);
    if (t->ndim != ndim)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "%s: expected %d dimensions, got %d", arg, ndim,
                         t->ndim);
    if (t->dtype != dt)
        return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "%s: expected dtype %s, got %s", arg,
                         tpk_dtype_name(dt), tpk_dtype_name(t->dtype));
    if (!tpk_layout_eq(t->layout, want, ndim))
        return tpk__fail(ctx, TPK_ERR_LAYOUT, fn, "%s: expected layout %s, got %s", arg,
                         tpk_layout_str(want, a, sizeof a), tpk_layout_str(t->layout, b, sizeof b));
    char c[64];
    int sd = tpk_layout_dim(want, ndim);
    if (sd >= 0 && t->gshape[sd] % (tpk_layout_stride(want) * tpk_layout_unit(want)))
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "%s: dim %d (%lld) is not a multiple of the layout's stride x unit %d",
                         arg, sd, (long long)t->gshape[sd],
                         tpk_layout_stride(want) * tpk_layout_unit(want));
    for (int i = 0; i < ndim; i++) {
        if (gshape && gshape[i] >= 0 && t->gshape[i] != gshape[i]) {
            int64_t show[TPK_MAX_DIMS];
            for (int j = 0; j < ndim; j++) show[j] = gshape[j];
            return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                             "%s: expected global shape %s (dim %d = %lld), got %s", arg,
                             tpk__shape_str(show, ndim, a, sizeof a), i, (long long)gshape[i],
                             tpk__shape_str(t->gshape, ndim, c, sizeof c));
        }
        int64_t local =
            i == sd ? tpk_tp_shard_size(ctx, t->gshape[i], want, ctx->tp.rank) : t->gshape[i];
        if (t->shape[i] != local || t->shape[i] < 0)
            return tpk__fail(
                ctx, TPK_ERR_SHAPE, fn,
                "%s: local shape %s does not match layout %s of global shape %s on rank %d of %d "
                "(dim %d should be %lld)",
                arg, tpk__shape_str(t->shape, ndim, a, sizeof a), tpk_layout_str(want, b, sizeof b),
                tpk__shape_str(t->gshape, ndim, c, sizeof c), ctx->tp.rank, ctx->tp.size, i,
                (long long)local);
    }
    if (!t->data && tpk_numel(t) > 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: data is NULL", arg);
    return TPK_OK;
}

/* The start of a layer's init: ctx and the layer present, the layer zeroed, the descriptor copy
 * *d = *desc (zeros when desc is NULL: every field has a default). */
static inline tpk_status tpk__init_layer(tpk_ctx *ctx, const char *fn, void *layer, size_t size,
                                         void *d, const void *desc, size_t dsize) {
    memset(d, 0, dsize);
    if (!ctx) return TPK_ERR_ARG;
    if (!layer) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    memset(layer, 0, size);
    if (desc) memcpy(d, desc, dsize);
    return TPK_OK;
}
#define TPK__INIT_LAYER(ctx, fn, layer, d, desc)                                                   \
    do {                                                                                           \
        memset(&(d), 0, sizeof(d)); /* visibly initialised for the compiler's flow analysis */     \
        TPK_TRY(tpk__init_layer((ctx), (fn), (layer), sizeof *(layer), &(d), (desc), sizeof(d))); \
    } while (0)

/* The dropout stream of a call site: a hash of (its name, ctx->rng_step, DP rank). Every rank
 * of a TP group draws the same stream, so a mask indexed by global position is the same at
 * every TP size; DP replicas (different data) draw different masks. */
static inline uint64_t tpk__dropout_stream(const tpk_ctx *ctx, const char *name) {
    uint64_t h = tpk_rng_stream(name);
    h = (h ^ (ctx->rng_step + 0x9E3779B97F4A7C15ull)) * 0x100000001b3ull;
    h = (h ^ ((uint64_t)ctx->dp.rank + 0xD1B54A32D192ED03ull)) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* A layer's name into dst[n]: `given`, or "<prefix><counter>" when given is NULL. A name that
 * does not fit is an error naming desc->name. */
static inline tpk_status tpk__layer_name(tpk_ctx *ctx, const char *fn, char *dst, size_t n,
                                         const char *given, const char *prefix) {
    if (!given) {
        snprintf(dst, n, "%.16s%d", prefix, ctx->nauto++);
        return TPK_OK;
    }
    if (strlen(given) >= n)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->name: \"%.40s...\" is longer than %zu characters", given, n - 1);
    memcpy(dst, given, strlen(given) + 1);
    return TPK_OK;
}

/* The rest of stream f (named path in errors) into *out (*n bytes, from allocator al: NULL, the C
 * library's); f stays open. */
static inline tpk_status tpk__read_stream_al(tpk_ctx *ctx, const tpk_allocator *al, const char *fn,
                                             const char *path, FILE *f, uint8_t **out, size_t *n) {
    size_t cap = 1 << 16, len = 0;
    uint8_t *b = (uint8_t *)tpk__al_malloc(al, cap);
    for (size_t r; b && (r = fread(b + len, 1, cap - len, f)) > 0;) {
        len += r;
        if (len == cap) {
            uint8_t *nb = (uint8_t *)tpk__al_realloc(al, b, cap, 2 * cap);
            if (!nb) tpk__al_free(al, b);
            b = nb, cap *= 2;
        }
    }
    int bad = ferror(f);
    if (!b || bad) {
        bool nomem = !b;
        tpk__al_free(al, b);
        return tpk__fail(ctx, nomem ? TPK_ERR_NOMEM : TPK_ERR_IO, fn, "%s: cannot read%s", path,
                         nomem ? " (out of memory)" : "");
    }
    *out = b, *n = len;
    return TPK_OK;
}
/* The whole file into *out (*n bytes, from allocator al as above). */
static inline tpk_status tpk__read_file_al(tpk_ctx *ctx, const tpk_allocator *al, const char *fn,
                                           const char *path, uint8_t **out, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot open: %s", path, strerror(errno));
    tpk_status s = tpk__read_stream_al(ctx, al, fn, path, f, out, n);
    fclose(f);
    return s;
}
/* The same from the context's allocator (ctx NULL: the C library's): free it with
 * tpk_free(ctx, p). */
static inline tpk_status tpk__read_stream(tpk_ctx *ctx, const char *fn, const char *path, FILE *f,
                                          uint8_t **out, size_t *n) {
    return tpk__read_stream_al(ctx, ctx ? &ctx->allocator : NULL, fn, path, f, out, n);
}
static inline tpk_status tpk__read_file(tpk_ctx *ctx, const char *fn, const char *path,
                                        uint8_t **out, size_t *n) {
    return tpk__read_file_al(ctx, ctx ? &ctx->allocator : NULL, fn, path, out, n);
}

#endif /* TPK_CTX_H */
