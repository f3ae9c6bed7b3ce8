/* tpk/base/core.h — status codes, dtypes, layouts, tensor views and split arithmetic.
 *
 * A tensor view is (data, dtype, local shape, layout, global shape). The layout says what
 * the local data means across the ranks of the tensor-parallel group:
 *   R     every rank holds the whole tensor;              local shape == global shape
 *   S(d)  every rank holds its slice of dimension d;       local[d] == tpk_split(global[d], t,
 *   r).size
 *   P     every rank holds a whole-shaped partial value;   the true value is the sum over ranks
 * Splits may be uneven: shard i of n over p parts starts at i*(n/p) + min(i, n%p) and has
 * n/p + (i < n%p) elements, so the first n%p shards hold one element more. Splits may also be
 * weighted (tpk_split_weighted: shard i in proportion to w_i; a context's TP group splits so when
 * given tpk_ctx_desc.tp_weights, and its code asks the context: tpk_tp_split in tpk/base/ctx.h).
 * Over context parallelism a tensor's rows are tagged (cp_rows): whole sequences, or this CP
 * rank's chunks of them.
 * Plain C11 that also compiles as C++17, no allocation, no globals. */
#ifndef TPK_CORE_H
#define TPK_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* C and C++: a literal of a struct type ((T){...} in C, T{...} in C++), and the linkage of the
 * functions the compiled archives define. */
#ifdef __cplusplus
#define TPK_LIT(T) T
#define TPK_EXTERN_C extern "C"
#else
#define TPK_LIT(T) (T)
#define TPK_EXTERN_C
#endif

typedef enum tpk_status {
    TPK_OK = 0,
    TPK_ERR_ARG,         /* a bad argument: null pointer, value out of range */
    TPK_ERR_SHAPE,       /* a shape that does not fit the layer or the other operands */
    TPK_ERR_LAYOUT,      /* a tensor layout the operation does not accept */
    TPK_ERR_DTYPE,       /* a dtype the operation does not accept */
    TPK_ERR_COMM,        /* a collective failed */
    TPK_ERR_BACKEND,     /* a compute backend call failed */
    TPK_ERR_IO,          /* a file could not be read or written */
    TPK_ERR_FORMAT,      /* a file is malformed */
    TPK_ERR_NOMEM,       /* an allocation failed */
    TPK_ERR_UNSUPPORTED, /* valid, but this backend or build does not provide it */
} tpk_status;

static inline const char *tpk_status_str(tpk_status s) {
    switch (s) {
    case TPK_OK: return "TPK_OK";
    case TPK_ERR_ARG: return "TPK_ERR_ARG";
    case TPK_ERR_SHAPE: return "TPK_ERR_SHAPE";
    case TPK_ERR_LAYOUT: return "TPK_ERR_LAYOUT";
    case TPK_ERR_DTYPE: return "TPK_ERR_DTYPE";
    case TPK_ERR_COMM: return "TPK_ERR_COMM";
    case TPK_ERR_BACKEND: return "TPK_ERR_BACKEND";
    case TPK_ERR_IO: return "TPK_ERR_IO";
    case TPK_ERR_FORMAT: return "TPK_ERR_FORMAT";
    case TPK_ERR_NOMEM: return "TPK_ERR_NOMEM";
    case TPK_ERR_UNSUPPORTED: return "TPK_ERR_UNSUPPORTED";
    }
    return "TPK_ERR_?";
}

/* Evaluate a call returning tpk_status; return its status from the enclosing function on
 * failure. */
#define TPK_TRY(call)                                                                              \
    do {                                                                                           \
        tpk_status tpk__s = (call);                                                                \
        if (tpk__s != TPK_OK) return tpk__s;                                                       \
    } while (0)

/* ---- dtypes ------------------------------------------------------------------------------ */

/* f32 and bf16 are the compute dtypes; i32 holds token ids; f64 is for host scalars reduced
 * over a communicator (a loss, a squared norm): collectives and copies take it, ops do not. */
typedef enum tpk_dtype { TPK_F32 = 0, TPK_BF16 = 1, TPK_I32 = 2, TPK_F64 = 3 } tpk_dtype;

static inline bool tpk_dtype_valid(tpk_dtype dt) {
    return dt == TPK_F32 || dt == TPK_BF16 || dt == TPK_I32 || dt == TPK_F64;
}
static inline size_t tpk_dtype_size(tpk_dtype dt) {
    return dt == TPK_BF16 ? 2 : dt == TPK_F64 ? 8 : 4;
}
static inline const char *tpk_dtype_name(tpk_dtype dt) {
    return dt == TPK_F32    ? "f32"
           : dt == TPK_BF16 ? "bf16"
           : dt == TPK_I32  ? "i32"
           : dt == TPK_F64  ? "f64"
                            : "?";
}

/* bf16 <-> f32, round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t tpk_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float tpk_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- split arithmetic ------------------------------------------------------------------- */

typedef struct tpk_range { int64_t off, size; } tpk_range;

/* Shard i of n elements over `parts` parts; the first n % parts shards get one more. */
static inline tpk_range tpk_split(int64_t n, int parts, int i) {
    tpk_range r = {0, 0};
    if (n < 0 || parts <= 0 || i < 0 || i >= parts) return r;
    int64_t q = n / parts, m = n % parts;
    r.off = (int64_t)i * q + (i < m ? i : m);
    r.size = q + (i < m ? 1 : 0);
    return r;
}

/* Shard i of n elements over `parts` parts in proportion to positive weights w[0 .. parts)
 * (e.g. each rank's measured speed): shard i is [b_i, b_{i+1}), b_i = floor(n W_i / W), W_i =
 * w_0 + ... + w_{i-1} summed left to right in double, W = W_parts (so b_parts = n exactly and the
 * shards tile [0, n); each is within one element of n w_i / W). w NULL: tpk_split. */
static inline tpk_range tpk_split_weighted(int64_t n, const double *w, int parts, int i) {
    if (!w) return tpk_split(n, parts, i);
    tpk_range r = {0, 0};
    if (n < 0 || parts <= 0 || i < 0 || i >= parts) return r;
    double W = 0, Wi = 0;
    for (int q = 0; q < parts; q++) {
        if (q == i) Wi = W;
        W += w[q];
    }
    double Wj = Wi + w[i]; /* W_{i+1}: the same left-to-right sum */
    /* n W_i first, then / W: exact for small integer weights (so equal weights split a multiple
     * of `parts` evenly); non-negative, so the conversion's truncation is the floor */
    int64_t b0 = (int64_t)((double)n * Wi / W),
            b1 = i + 1 == parts ? n : (int64_t)((double)n * Wj / W);
    if (b1 > n) b1 = n;
    if (b0 > b1) b0 = b1;
    r.off = b0, r.size = b1 - b0;
    return r;
}

/* A comma-separated list of positive finite numbers ("3,1": weights for tpk_split_weighted) into
 * w[max]: the count parsed, or -1 when the text is not such a list or holds more than max. */
static inline int tpk_parse_weights(const char *list, double *w, int max) {
    int n = 0;
    for (const char *p = list; p && *p; n++) {
        char *end = NULL;
        double x = strtod(p, &end);
        if (end == p || n >= max || !(x > 0 && x < 1e300) || (*end && *end != ',') ||
            (*end == ',' && !end[1]))
            return -1;
        w[n] = x, p = *end ? end + 1 : end;
    }
    return list && *list ? n : -1;
}

/* A vocabulary of V entries padded so that each of `parts` even shards is a multiple of m rows:
 * V rounded up to a multiple of m * parts (m <= 0: V). Megatron pads the same way. */
static inline int64_t tpk_vocab_padded(int64_t V, int64_t m, int parts) {
    if (m <= 0 || parts <= 0) return V;
    int64_t q = m * parts;
    return (V + q - 1) / q * q;
}

/* ---- layouts ------------------------------------------------------------------------------ */

typedef enum tpk_layout_kind {
    TPK_LAYOUT_R = 0,
    TPK_LAYOUT_S = 1,
    TPK_LAYOUT_P = 2
} tpk_layout_kind;
typedef struct tpk_layout {
    tpk_layout_kind kind;
    int dim;    /* S only; negative counts from the end (-1 = last) */
    int stride; /* S only; 0 or 1: one split. s > 1: dim d is s equal blocks, each split over
                   the ranks, and a shard is its slice of every block (fused [Q; K; V]). */
    int unit;   /* S only; 0 or 1: split elements. u > 1: split whole groups of u (heads of D). */
    int group;  /* S only; 0 or 1: none. g > 1 (grouped-query attention's K and V): dim d is n/u
                   units (key/value heads of u rows), unit k read by the g query heads
                   [k g, (k + 1) g); the n/u g query heads are split with tpk_split and a shard
                   holds every unit its query heads read, so a unit read from two ranks is held
                   by both (replicated, its gradient summed over them: tpk/layers/norm.h). Stride
                   1. */
} tpk_layout;

#define TPK_R (TPK_LIT(tpk_layout){TPK_LAYOUT_R, 0, 0, 0, 0})
#define TPK_P (TPK_LIT(tpk_layout){TPK_LAYOUT_P, 0, 0, 0, 0})
#define TPK_S(d) (TPK_LIT(tpk_layout){TPK_LAYOUT_S, (d), 0, 0, 0})
/* S(d) with s blocks split separately, each in groups of u elements (heads of size u). */
#define TPK_S_EX(d, s, u) (TPK_LIT(tpk_layout){TPK_LAYOUT_S, (d), (s), (u), 0})
/* S(d) of key/value heads of u elements, each read by g query heads (the query heads split). */
#define TPK_S_GROUPED(d, u, g) (TPK_LIT(tpk_layout){TPK_LAYOUT_S, (d), 1, (u), (g)})

static inline int tpk_layout_stride(tpk_layout l) {
    return l.kind == TPK_LAYOUT_S && l.stride > 1 ? l.stride : 1;
}
static inline int tpk_layout_unit(tpk_layout l) {
    return l.kind == TPK_LAYOUT_S && l.unit > 1 ? l.unit : 1;
}
static inline int tpk_layout_group(tpk_layout l) {
    return l.kind == TPK_LAYOUT_S && l.group > 1 ? l.group : 1;
}

/* Where shard `index` of a dim of n elements holds its run in block b (< stride) of layout l:
 * each block of n/stride elements is split in groups of `unit` with tpk_split_weighted (w NULL:
 * evenly). Grouped (g > 1): the units [q0 / g, (q0 + nq - 1) / g] read by the query heads
 * [q0, q0 + nq) of the shard. */
static inline tpk_range tpk_shard_run_w(int64_t n, tpk_layout l, int parts, const double *w,
                                        int index, int b) {
    int64_t s = tpk_layout_stride(l), u = tpk_layout_unit(l), g = tpk_layout_group(l),
            block = n / s;
    if (g > 1) {
        tpk_range q = tpk_split_weighted(block / u * g, w, parts, index), out = {q.off / g * u, 0};
        if (q.size) out.size = ((q.off + q.size - 1) / g + 1) * u - out.off;
        return out;
    }
    tpk_range r = tpk_split_weighted(block / u, w, parts, index),
              out = {b * block + r.off * u, r.size * u};
    return out;
}
/* The part of shard `index` (offsets within the shard) that no lower shard also holds: the
 * whole shard except under a grouped layout, where a unit belongs to the lowest shard holding
 * it. Sums over the ranks (a gradient norm) count each element once over these parts. */
static inline tpk_range tpk_shard_owned_w(int64_t n, tpk_layout l, int parts, const double *w,
                                          int index) {
    tpk_range r = tpk_shard_run_w(n, l, parts, w, index, 0),
              own = {0, tpk_layout_stride(l) * r.size};
    if (tpk_layout_group(l) == 1) return own;
    int64_t end = 0; /* the end of the units held below */
    for (int q = 0; q < index; q++) {
        tpk_range o = tpk_shard_run_w(n, l, parts, w, q, 0);
        if (o.size && o.off + o.size > end) end = o.off + o.size;
    }
    if (end > r.off) own.off = end - r.off < r.size ? end - r.off : r.size;
    own.size = r.size - own.off;
    return own;
}
/* Local extent of a dim of n elements in layout l (n must be a multiple of stride * unit). */
static inline int64_t tpk_shard_size_w(int64_t n, tpk_layout l, int parts, const double *w,
                                       int index) {
    return tpk_layout_stride(l) * tpk_shard_run_w(n, l, parts, w, index, 0).size;
}
/* The same over even shards. */
static inline tpk_range tpk_shard_run(int64_t n, tpk_layout l, int parts, int index, int b) {
    return tpk_shard_run_w(n, l, parts, NULL, index, b);
}
static inline tpk_range tpk_shard_owned(int64_t n, tpk_layout l, int parts, int index) {
    return tpk_shard_owned_w(n, l, parts, NULL, index);
}
static inline int64_t tpk_shard_size(int64_t n, tpk_layout l, int parts, int index) {
    return tpk_shard_size_w(n, l, parts, NULL, index);
}

/* Sharded dimension normalised to [0, ndim), or -1 when out of range / not S. */
static inline int tpk_layout_dim(tpk_layout l, int ndim) {
    if (l.kind != TPK_LAYOUT_S) return -1;
    int d = l.dim < 0 ? l.dim + ndim : l.dim;
    return (d >= 0 && d < ndim) ? d : -1;
}
static inline bool tpk_layout_eq(tpk_layout a, tpk_layout b, int ndim) {
    if (a.kind != b.kind) return false;
    return a.kind != TPK_LAYOUT_S ||
           (tpk_layout_dim(a, ndim) == tpk_layout_dim(b, ndim) &&
            tpk_layout_stride(a) == tpk_layout_stride(b) &&
            tpk_layout_unit(a) == tpk_layout_unit(b) && tpk_layout_group(a) == tpk_layout_group(b));
}
/* "R", "P", "S(0)", "S(-1)" into buf (at least 16 bytes); returns buf. */
static inline const char *tpk_layout_str(tpk_layout l, char *buf, size_t n) {
    if (l.kind == TPK_LAYOUT_R) snprintf(buf, n, "R");
    else if (l.kind == TPK_LAYOUT_P) snprintf(buf, n, "P");
    else if (l.kind == TPK_LAYOUT_S && tpk_layout_group(l) > 1)
        snprintf(buf, n, "S(%d, unit %d, group %d)", l.dim, tpk_layout_unit(l),
                 tpk_layout_group(l));
    else if (l.kind == TPK_LAYOUT_S && (tpk_layout_stride(l) > 1 || tpk_layout_unit(l) > 1))
        snprintf(buf, n, "S(%d, stride %d, unit %d)", l.dim, tpk_layout_stride(l),
                 tpk_layout_unit(l));
    else if (l.kind == TPK_LAYOUT_S) snprintf(buf, n, "S(%d)", l.dim);
    else snprintf(buf, n, "?(%d)", (int)l.kind);
    return buf;
}

/* ---- tensor views ------------------------------------------------------------------------ */

#define TPK_MAX_DIMS 4

typedef struct tpk_tensor {
    void *data;                    /* local data, row-major, contiguous */
    tpk_dtype dtype;
    int ndim;
    int64_t shape[TPK_MAX_DIMS];   /* local shape */
    int64_t gshape[TPK_MAX_DIMS];  /* global shape (differs from shape only on an S dim) */
    tpk_layout layout;
    uint8_t cp_rows; /* the rows over context parallelism: 0 whole sequences; 1 this CP rank's
                        load-balanced chunks of them (tpk/layers/cp_split.h: tpk_cp_rows), which
                        the readers across the sequence check (tpk__cp_rows_check). Row-wise
                        layers carry it from input to output (tpk__rows_of). */
} tpk_tensor;

static inline int64_t tpk_numel(const tpk_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
static inline size_t tpk_nbytes(const tpk_tensor *t) {
    return (size_t)tpk_numel(t) * tpk_dtype_size(t->dtype);
}

/* A 2-D view whose local shape is its global shape: layouts R and P (and S when t = 1). */
static inline tpk_tensor tpk_tensor_2d(void *data, tpk_dtype dt, int64_t rows, int64_t cols,
                                       tpk_layout l) {
    tpk_tensor t = {data, dt, 2, {rows, cols, 0, 0}, {rows, cols, 0, 0}, l, 0};
    return t;
}
/* t with the CP rows tag of `in`: the output of a row-wise layer (row i from input row i) holds
 * its input's rows. */
static inline tpk_tensor tpk__rows_of(tpk_tensor t, const tpk_tensor *in) {
    t.cp_rows = in->cp_rows;
    return t;
}
/* An n-D view whose local shape is its global shape. */
static inline tpk_tensor tpk_tensor_nd(void *data, tpk_dtype dt, int ndim, const int64_t *shape,
                                       tpk_layout l) {
    tpk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data, t.dtype = dt, t.ndim = ndim, t.layout = l;
    for (int i = 0; i < ndim && i < TPK_MAX_DIMS; i++) t.shape[i] = t.gshape[i] = shape[i];
    return t;
}
/* Shard `index` of `parts` of a tensor of global shape `gshape` with layout S(d) (or any
 * layout: R and P give the whole shape). */
static inline tpk_tensor tpk_tensor_shard(void *data, tpk_dtype dt, int ndim, const int64_t *gshape,
                                          tpk_layout l, int parts, int index) {
    tpk_tensor t = tpk_tensor_nd(data, dt, ndim, gshape, l);
    int d = tpk_layout_dim(l, ndim);
    if (d >= 0) t.shape[d] = tpk_shard_size(gshape[d], l, parts, index);
    return t;
}
/* A 2-D shard: global [rows, cols], layout l, on rank `index` of `parts`. */
static inline tpk_tensor tpk_tensor_shard_2d(void *data, tpk_dtype dt, int64_t rows, int64_t cols,
                                             tpk_layout l, int parts, int index) {
    int64_t g[2] = {rows, cols};
    return tpk_tensor_shard(data, dt, 2, g, l, parts, index);
}

#endif /* TPK_CORE_H */
