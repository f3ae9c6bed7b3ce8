/* tpk/runtime/profile.h — a built-in profiler: the time of every op and collective, per step.
 *
 * tpk_profile_start(ctx) (or TPK_PROFILE=1 in the environment, read by tpk_ctx_init) turns it on.
 * Every op of the checked front end (tpk/runtime/op.h) and every collective (tpk/runtime/coll.h) is
 * then timed: with the backend's timer marks where its table has them (the CUDA backend: CUDA
 * events recorded on its stream around each op, read at the end of a step, so the step is not
 * serialised), else with the host clock around the call (exact for the host backend, whose ops are
 * synchronous). tpk_profile_step(ctx) closes a step (waiting for the device); tpk_profile_print
 * writes one row per op name, heaviest first:
 *   calls per step, ms per step, share of the step's wall time, and the achieved rate:
 *   GB/s (the fewest bytes the op must move: each input read once, each output written once) or
 *   TFLOP/s (GEMMs, the fused linear, attention: 2 m n k; 2 B A S^2 D forward, 5 backward).
 * tpk_profile_log passes the same lines to the context's logger (tpk_logf, TPK_LOG_INFO; by default
 * stderr): with TPK_PROFILE=1 world rank 0 does so when the context is destroyed.
 * A dry run's table (tpk_ops.dry_run: the planner's, tpk/plan/count.h) has its compute ops
 * counted here and never called (TPK__OP_CALL, tpk/runtime/op.h): the hook sees each op's name,
 * bytes and flops exactly as a real run's profile does. */
#ifndef TPK_PROFILE_H
#define TPK_PROFILE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/ctx.h"

typedef struct tpk__prof_row {
    const char *name; /* a string literal */
    uint64_t calls;
    double ms, bytes, flops;
} tpk__prof_row;

typedef struct tpk__prof_call { /* an op call of the current step, its time not read yet */
    int row;                     /* -1 while the call runs */
    double bytes, flops, t0, t1; /* host clock (ms) when the backend has no timer */
} tpk__prof_call;

struct tpk_profile {
    tpk__prof_row rows[96];
    int nrows;
    tpk__prof_call *pend;
    int npend, cap;
    int open[16], depth; /* the calls running: a collective may stage through ops of its own */
    double t_step, t_start, wall_ms; /* host ms: start of this step, of the profile; closed steps'
                                        wall time */
    int steps;
    bool from_env; /* printed by tpk_ctx_destroy */
    /* a dry run's sink (tpk/plan/count.h; NULL: none): when set, each outermost op and collective
     * is handed to it with the bytes and flops above when it returns, and nothing is timed */
    void (*hook)(tpk_ctx *ctx, void *user, const char *name, double bytes, double flops);
    void *hook_user;
};

static inline double tpk__now_ms(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline tpk_status tpk_profile_start(tpk_ctx *ctx) {
    if (!ctx) return TPK_ERR_ARG;
    if (ctx->prof) return TPK_OK;
    tpk_profile *p = (tpk_profile *)tpk__calloc(ctx, 1, sizeof *p);
    if (!p) return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_profile_start", "out of host memory");
    p->t_start = p->t_step = tpk__now_ms();
    ctx->prof = p;
    return TPK_OK;
}

/* Before an op: its call reserved, its start mark. */
static inline void tpk__prof_begin(tpk_ctx *ctx) {
    tpk_profile *p = ctx->prof;
    if (p->hook) {
        p->depth++;
        return;
    }
    int idx = -1;
    if (p->npend == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        tpk__prof_call *n = (tpk__prof_call *)tpk__realloc(ctx, p->pend, sizeof *n * (size_t)p->cap,
                                                           sizeof *n * (size_t)cap);
        if (n) p->pend = n, p->cap = cap;
    }
    if (p->npend < p->cap) {
        idx = p->npend++;
        p->pend[idx].row = -1;
        if (ctx->ops->timer_mark) ctx->ops->timer_mark(ctx, 2 * idx);
        else p->pend[idx].t0 = tpk__now_ms();
    }
    if (p->depth < 16) p->open[p->depth] = idx;
    p->depth++;
}
/* After an op: its end mark and its row; the call is read when the step closes. Returns s. */
static inline tpk_status tpk__prof_end(tpk_ctx *ctx, const char *name, double bytes, double flops,
                                       tpk_status s) {
    tpk_profile *p = ctx->prof;
    if (p->depth == 0) return s;
    if (p->hook) {
        if (--p->depth == 0) p->hook(ctx, p->hook_user, name, bytes, flops);
        return s;
    }
    int idx = --p->depth < 16 ? p->open[p->depth] : -1, r = 0;
    if (idx < 0) return s; /* not recorded (out of memory or nested too deep) */
    while (r < p->nrows && p->rows[r].name != name && strcmp(p->rows[r].name, name)) r++;
    if (r == p->nrows && r < (int)(sizeof p->rows / sizeof p->rows[0])) {
        p->rows[r].name = name;
        p->rows[r].calls = 0, p->rows[r].ms = p->rows[r].bytes = p->rows[r].flops = 0;
        p->nrows++;
    }
    tpk__prof_call *c = &p->pend[idx];
    if (ctx->ops->timer_mark) ctx->ops->timer_mark(ctx, 2 * idx + 1);
    else c->t1 = tpk__now_ms();
    c->row = r < p->nrows ? r : -1, c->bytes = bytes, c->flops = flops;
    return s;
}
/* A backend call (a collective, a copy; a compute op: TPK__OP_CALL, tpk/runtime/op.h) timed when
 * the profiler is on. */
#define TPK__PROF_OP(ctx, name, bytes, flops, call)                                              \
    ((ctx) && (ctx)->prof ? (tpk__prof_begin(ctx), tpk__prof_end((ctx), (name), (double)(bytes), \
                                                                 (double)(flops), (call)))       \
                          : (call))
/* A compute op in a dry run (tpk_ops.dry_run): no entry called, the profiler (its hook) told of
 * the op as in a real run. */
static inline tpk_status tpk__prof_dry(tpk_ctx *ctx, const char *name, double bytes,
                                       double flops) {
    if (!ctx->prof) return TPK_OK;
    tpk__prof_begin(ctx);
    return tpk__prof_end(ctx, name, bytes, flops, TPK_OK);
}

/* Read the pending calls' times into the rows (waits for the device). */
static inline tpk_status tpk__prof_flush(tpk_ctx *ctx) {
    tpk_profile *p = ctx->prof;
    tpk_status s = TPK_OK;
    for (int i = 0; i < p->npend; i++) {
        tpk__prof_call *c = &p->pend[i];
        if (c->row < 0) continue;
        float ms = (float)(c->t1 - c->t0);
        if (ctx->ops->timer_ms && s == TPK_OK) s = ctx->ops->timer_ms(ctx, 2 * i, 2 * i + 1, &ms);
        tpk__prof_row *row = &p->rows[c->row];
        row->calls++, row->ms += ms, row->bytes += c->bytes, row->flops += c->flops;
    }
    p->npend = 0, p->depth = 0;
    return s;
}

/* Close a step: wait for the device, read the step's times, count its wall time. */
static inline tpk_status tpk_profile_step(tpk_ctx *ctx) {
    if (!ctx) return TPK_ERR_ARG;
    tpk_profile *p = ctx->prof;
    if (!p) return TPK_OK;
    TPK_TRY(ctx->ops->sync(ctx));
    TPK_TRY(tpk__prof_flush(ctx));
    double now = tpk__now_ms();
    p->wall_ms += now - p->t_step, p->t_step = now, p->steps++;
    return TPK_OK;
}

/* One line of the table: to f, or (f NULL) to the context's logger. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline void
tpk__prof_line(tpk_ctx *ctx, FILE *f, const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (f) fprintf(f, "%s\n", line);
    else tpk_logf(ctx, TPK_LOG_INFO, "%s", line);
}
/* The table to f, or (f NULL) to the logger (tpk_profile_print, tpk_profile_log). */
static inline tpk_status tpk__prof_table(tpk_ctx *ctx, FILE *f, const char *fn) {
    if (!ctx) return TPK_ERR_ARG;
    tpk_profile *p = ctx->prof;
    if (!p)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "the profiler is off (tpk_profile_start or TPK_PROFILE=1)");
    if (p->npend || !p->steps) TPK_TRY(tpk_profile_step(ctx));
    int order[96], n = p->nrows;
    double timed = 0, step = p->wall_ms / p->steps;
    for (int i = 0; i < n; i++) order[i] = i, timed += p->rows[i].ms;
    for (int i = 1; i < n; i++) /* heaviest first */
        for (int j = i; j > 0 && p->rows[order[j]].ms > p->rows[order[j - 1]].ms; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    tpk__prof_line(ctx, f, "profile: %d step%s, %.3f ms per step (wall), backend %s, %s",
                   p->steps, p->steps == 1 ? "" : "s", step, ctx->ops->name,
                   ctx->ops->timer_mark ? "ops timed by the backend's timer in stream order"
                                        : "ops timed by the host clock");
    tpk__prof_line(ctx, f, "%-26s %10s %10s %7s %16s", "op", "calls/step", "ms/step", "% step",
                   "rate");
    for (int k = 0; k < n; k++) {
        const tpk__prof_row *r = &p->rows[order[k]];
        char rate[32] = "";
        double sec = r->ms * 1e-3;
        /* (a time below the clock's resolution: "-" for the rate, the unit kept) */
        if (r->flops > 0 && sec > 0)
            snprintf(rate, sizeof rate, "%.2f TFLOP/s", r->flops / sec * 1e-12);
        else if (r->flops > 0) snprintf(rate, sizeof rate, "- TFLOP/s");
        else if (r->bytes > 0 && sec > 0)
            snprintf(rate, sizeof rate, "%.1f GB/s", r->bytes / sec * 1e-9);
        else if (r->bytes > 0) snprintf(rate, sizeof rate, "- GB/s");
        tpk__prof_line(ctx, f, "%-26s %10.1f %10.3f %6.1f%% %16s", r->name,
                       (double)r->calls / p->steps, r->ms / p->steps,
                       step > 0 ? 100.0 * r->ms / p->steps / step : 0.0, rate);
    }
    tpk__prof_line(ctx, f, "%-26s %10s %10.3f %6.1f%%", "all timed ops", "", timed / p->steps,
                   step > 0 ? 100.0 * timed / p->steps / step : 0.0);
    return TPK_OK;
}
/* The table (see the top of this file) to f. Steps not closed by tpk_profile_step count as one. */
static inline tpk_status tpk_profile_print(tpk_ctx *ctx, FILE *f) {
    if (ctx && ctx->prof && !f) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_profile_print", "f: NULL");
    return tpk__prof_table(ctx, f, "tpk_profile_print");
}
/* The same table through the context's logger, one message a line (TPK_LOG_INFO). */
static inline tpk_status tpk_profile_log(tpk_ctx *ctx) {
    return tpk__prof_table(ctx, NULL, "tpk_profile_log");
}

static inline void tpk_profile_stop(tpk_ctx *ctx) {
    if (!ctx || !ctx->prof) return;
    tpk__free(ctx, ctx->prof->pend);
    tpk__free(ctx, ctx->prof);
    ctx->prof = NULL;
}

#endif /* TPK_PROFILE_H */
