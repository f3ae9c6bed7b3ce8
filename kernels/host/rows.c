/* kernels/host/rows.c — the host backend's rows moved by an index: a mixture of experts'
 * permutations and combine (tpk/layers/moe.h).
 *
 *   gather_rows       y[i] = x[idx[i]] (zeros where idx[i] names no row): rows as bytes
 *   scatter_add_rows  y[r] (+)= the rows x[i] with idx[i] = r, i ascending: a stable counting sort
 *                     of the indices by destination (the segments), then each destination's rows
 *                     added in order in f32 and rounded once
 *   moe_combine_fwd   y[t] = sum_i w[t K + i] o[row[t K + i]] over the kept entries, i ascending:
 *                     each product rounded to f32, the sum started from the first (the per-row
 *                     axpby loop's arithmetic, which it replaced, in f32 bit for bit)
 *   moe_combine_bwd   dw[e] = dy[e / K] . o[row[e]] (8 lanes of f32 partial sums, added in lane
 *                     order), and dout = the segmented scatter of the terms w[e] dy[e / K]
 * Over the pool's threads (pool.c): by output row (gather, combine, each scatter destination) or
 * by entry (dw); every row's arithmetic is one thread's in a fixed order, the same bits at any
 * thread count. The indices are not trusted: one outside its range names no row. */
#include <stdlib.h>

#include "vec.h"

enum { ROW_GRAIN = 1 << 13 }; /* the fewest elements a thread is given */

typedef struct rows_job {
    tpk_dtype dt;
    void *y;
    float *dw;
    const void *x;       /* gather, scatter: the source rows; combine: o; dw: dy */
    const void *src;     /* the segmented scatter's terms: x, or dy (moe_combine_bwd) */
    const int32_t *idx;  /* gather: idx; combine: row */
    const float *w;      /* the terms' weights (NULL: 1) */
    const int64_t *seg;  /* the segments: destination r's entries are list[seg[r], seg[r+1]) */
    const int64_t *list; /* entries (scatter: rows of x; combine: e = t K + i) by destination */
    int64_t ldy, ldx, xrows, cols, K, rep; /* rep: an entry e's term is row e / rep of src */
    size_t es;                             /* bytes per element (gather) */
    bool acc;
} rows_job;

/* grain of a loop over rows of cols elements */
static int64_t row_grain(int64_t cols) { return 1 + ROW_GRAIN / (cols > 0 ? cols : 1); }

/* ---- gather_rows ----------------------------------------------------------------------------- */

static void gather_part(void *p, int64_t lo, int64_t hi) {
    const rows_job *j = (const rows_job *)p;
    size_t bytes = (size_t)j->cols * j->es;
    for (int64_t i = lo; i < hi; i++) {
        char *yi = (char *)j->y + (size_t)(i * j->ldy) * j->es;
        int64_t r = j->idx[i];
        if (r >= 0 && r < j->xrows)
            memcpy(yi, (const char *)j->x + (size_t)(r * j->ldx) * j->es, bytes);
        else memset(yi, 0, bytes); /* +0 in every dtype */
    }
}
static tpk_status host_gather_rows(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx,
                                   int64_t xrows, const int32_t *idx, int64_t rows, int64_t cols,
                                   tpk_dtype dt) {
    (void)ctx;
    rows_job j = {.dt = dt,
                  .y = y,
                  .x = x,
                  .idx = idx,
                  .ldy = ldy,
                  .ldx = ldx,
                  .xrows = xrows,
                  .cols = cols,
                  .es = tpk_dtype_size(dt)};
    tpk__host_par(rows, row_grain(cols), gather_part, &j);
    return TPK_OK;
}

/* ---- the segmented scatter: scatter_add_rows and moe_combine_bwd's dout ---------------------- */

/* Destinations [lo, hi): row r = (acc ? y[r] : its first term) + its other terms in list order,
 * a term w[e] src[e / rep] (w NULL: src[e / rep]); zeros where r has no term (acc: unchanged). */
TPK__HOST_INLINE void seg_loop(tpk_dtype dt, const rows_job *j, int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; r++) {
        int64_t s0 = j->seg[r], s1 = j->seg[r + 1];
        if (s0 == s1 && j->acc) continue;
        size_t yr = (size_t)(r * j->ldy);
        for (int64_t c = 0; c < j->cols; c += TPK__VL) {
            int64_t n = j->cols - c < TPK__VL ? j->cols - c : TPK__VL;
            tpk__v8f v = !j->acc        ? tpk__vsplat(0.0f)
                         : n == TPK__VL ? tpk__vld(j->y, dt, yr + (size_t)c)
                                        : tpk__vld_n(j->y, dt, yr + (size_t)c, n);
            for (int64_t s = s0; s < s1; s++) {
                int64_t e = j->list[s];
                size_t at = (size_t)((e / j->rep) * j->ldx + c);
                tpk__v8f t =
                    n == TPK__VL ? tpk__vld(j->src, dt, at) : tpk__vld_n(j->src, dt, at, n);
                if (j->w) t = t * j->w[e];
                v = s == s0 && !j->acc ? t : v + t;
            }
            if (n == TPK__VL) tpk__vst(j->y, dt, yr + (size_t)c, v);
            else tpk__vst_n(j->y, dt, yr + (size_t)c, v, n);
        }
    }
}
TPK__HOST_SIMD static void seg_part(void *p, int64_t lo, int64_t hi) {
    const rows_job *j = (const rows_job *)p;
    TPK__BY_DTYPE(j->dt, seg_loop, j, lo, hi);
}
/* The entries [0, n) by destination idx[e] in [0, yrows) (others dropped), e ascending within
 * one (a stable counting sort): *seg [yrows + 1] and *list, malloc'd. */
static tpk_status seg_build(tpk_ctx *ctx, const char *fn, const int32_t *idx, int64_t n,
                            int64_t yrows, int64_t **seg, int64_t **list) {
    *seg = calloc((size_t)yrows + 2, sizeof(int64_t));
    *list = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!*seg || !*list) {
        free(*seg), free(*list);
        *seg = *list = NULL;
        return tpk__host_nomem(ctx, fn, ((size_t)yrows + 2 + (size_t)n) * sizeof(int64_t));
    }
    int64_t *s = *seg; /* counts at s[r + 2], then their prefix sums: s[r + 1] is r's start */
    for (int64_t e = 0; e < n; e++)
        if (idx[e] >= 0 && idx[e] < yrows) s[idx[e] + 2]++;
    for (int64_t r = 2; r <= yrows + 1; r++) s[r] += s[r - 1];
    for (int64_t e = 0; e < n; e++) /* s[r + 1] walks through r's places: then r + 1's start */
        if (idx[e] >= 0 && idx[e] < yrows) (*list)[s[idx[e] + 1]++] = e;
    return TPK_OK;
}
/* y [yrows, cols] from the terms of the n entries (see seg_loop) */
static tpk_status seg_scatter(tpk_ctx *ctx, const char *fn, void *y, int64_t ldy, int64_t yrows,
                              const void *src, int64_t ldx, const int32_t *idx, int64_t n,
                              int64_t rep, const float *w, int64_t cols, tpk_dtype dt, bool acc) {
    int64_t *seg, *list;
    TPK_TRY(seg_build(ctx, fn, idx, n, yrows, &seg, &list));
    rows_job j = {.dt = dt,
                  .y = y,
                  .src = src,
                  .w = w,
                  .seg = seg,
                  .list = list,
                  .ldy = ldy,
                  .ldx = ldx,
                  .cols = cols,
                  .rep = rep,
                  .acc = acc};
    int64_t per = yrows > 0 ? 1 + n / yrows : 1; /* terms a row, on average */
    tpk__host_par(yrows, 1 + ROW_GRAIN / (per * (cols > 0 ? cols : 1)), seg_part, &j);
    free(seg), free(list);
    return TPK_OK;
}
static tpk_status host_scatter_add_rows(tpk_ctx *ctx, void *y, int64_t ldy, int64_t yrows,
                                        const void *x, int64_t ldx, const int32_t *idx,
                                        int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate) {
    return seg_scatter(ctx, "host.scatter_add_rows", y, ldy, yrows, x, ldx, idx, rows, 1, NULL,
                       cols, dt, accumulate);
}

/* ---- moe_combine_fwd, moe_combine_bwd -------------------------------------------------------- */

/* tokens [lo, hi): y[t] = the kept entries' w o-rows, i ascending (zeros when none is kept) */
TPK__HOST_INLINE void combine_loop(tpk_dtype dt, const rows_job *j, int64_t lo, int64_t hi) {
    int64_t H = j->cols, K = j->K;
    for (int64_t t = lo; t < hi; t++) {
        size_t yt = (size_t)(t * H);
        for (int64_t c = 0; c < H; c += TPK__VL) {
            int64_t n = H - c < TPK__VL ? H - c : TPK__VL;
            tpk__v8f v = tpk__vsplat(0.0f);
            bool first = true;
            for (int64_t i = 0; i < K; i++) {
                int64_t r = j->idx[t * K + i];
                if (r < 0 || r >= j->xrows) continue;
                size_t at = (size_t)(r * H + c);
                tpk__v8f p = (n == TPK__VL ? tpk__vld(j->x, dt, at) : tpk__vld_n(j->x, dt, at, n)) *
                             j->w[t * K + i];
                v = first ? p : v + p;
                first = false;
            }
            if (n == TPK__VL) tpk__vst(j->y, dt, yt + (size_t)c, v);
            else tpk__vst_n(j->y, dt, yt + (size_t)c, v, n);
        }
    }
}
TPK__HOST_SIMD static void combine_part(void *p, int64_t lo, int64_t hi) {
    const rows_job *j = (const rows_job *)p;
    TPK__BY_DTYPE(j->dt, combine_loop, j, lo, hi);
}
static tpk_status host_moe_combine_fwd(tpk_ctx *ctx, void *y, const void *o, int64_t orows,
                                       const int32_t *row, const float *w, int64_t T, int64_t K,
                                       int64_t H, tpk_dtype dt) {
    (void)ctx;
    rows_job j = {.dt = dt, .y = y, .x = o, .idx = row, .w = w, .xrows = orows, .cols = H, .K = K};
    tpk__host_par(T, 1 + ROW_GRAIN / (K * (H > 0 ? H : 1)), combine_part, &j);
    return TPK_OK;
}

/* entries [lo, hi): dw[e] = dy[e / K] . o[row[e]] in 8 lanes of f32 partial sums (a row's tail
 * zero-padded), the lanes added in order; 0 for a dropped entry */
TPK__HOST_INLINE void dot_loop(tpk_dtype dt, const rows_job *j, int64_t lo, int64_t hi) {
    int64_t H = j->cols;
    for (int64_t e = lo; e < hi; e++) {
        int64_t r = j->idx[e];
        if (r < 0 || r >= j->xrows) {
            j->dw[e] = 0.0f;
            continue;
        }
        size_t a = (size_t)((e / j->K) * H), b = (size_t)(r * H);
        tpk__v8f v = tpk__vsplat(0.0f);
        for (int64_t c = 0; c < H; c += TPK__VL) {
            int64_t n = H - c < TPK__VL ? H - c : TPK__VL;
            v += n == TPK__VL
                     ? tpk__vld(j->src, dt, a + (size_t)c) * tpk__vld(j->x, dt, b + (size_t)c)
                     : tpk__vld_n(j->src, dt, a + (size_t)c, n) *
                           tpk__vld_n(j->x, dt, b + (size_t)c, n);
        }
        float s = v[0];
        for (int k = 1; k < TPK__VL; k++) s += v[k];
        j->dw[e] = s;
    }
}
TPK__HOST_SIMD static void dot_part(void *p, int64_t lo, int64_t hi) {
    const rows_job *j = (const rows_job *)p;
    TPK__BY_DTYPE(j->dt, dot_loop, j, lo, hi);
}
static tpk_status host_moe_combine_bwd(tpk_ctx *ctx, float *dw, void *dout, const void *dy,
                                       const void *o, int64_t orows, const int32_t *row,
                                       const float *w, int64_t T, int64_t K, int64_t H,
                                       tpk_dtype dt) {
    rows_job j = {
        .dt = dt, .dw = dw, .x = o, .src = dy, .idx = row, .xrows = orows, .cols = H, .K = K};
    tpk__host_par(T * K, 1 + ROW_GRAIN / (H > 0 ? H : 1), dot_part, &j);
    return seg_scatter(ctx, "host.moe_combine_bwd", dout, H, orows, dy, H, row, T * K, K, w, H, dt,
                       false);
}

/* this file's entries of the host table (table.c) */
void tpk__host_rows_ops(tpk_ops *o) {
    o->gather_rows = host_gather_rows;
    o->scatter_add_rows = host_scatter_add_rows;
    o->moe_combine_fwd = host_moe_combine_fwd;
    o->moe_combine_bwd = host_moe_combine_bwd;
}
