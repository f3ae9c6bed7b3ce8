/* tpk/log.h — a training run's loss curve: a CSV file (step, train_loss, val_loss, lr, grad_norm;
 * every f32 exactly, %.9g) written by world rank 0, and when it is closed a PNG of the curve
 * beside it (FILE.csv -> FILE.png) where gnuplot is installed, or a line saying there is none.
 * Collective over ctx->world only in tpk_log_open (every rank learns whether rank 0 could write). */
#ifndef TPK_LOG_H
#define TPK_LOG_H

#include <math.h>

#include "coll.h"

typedef struct tpk_log {
    FILE *f;        /* world rank 0's file; NULL elsewhere or without a log */
    char path[512];
} tpk_log;

/* Open path (NULL or "": no log) for writing on world rank 0 and write the header. */
static inline tpk_status tpk_log_open(tpk_ctx *ctx, tpk_log *log, const char *path) {
    static const char *fn = "tpk_log_open";
    if (!ctx) return TPK_ERR_ARG;
    if (!log) return tpk__fail(ctx, TPK_ERR_ARG, fn, "log: NULL");
    memset(log, 0, sizeof *log);
    if (!path || !path[0]) return TPK_OK;
    if (strlen(path) >= sizeof log->path) return tpk__fail(ctx, TPK_ERR_ARG, fn, "path: longer than %zu characters", sizeof log->path - 1);
    snprintf(log->path, sizeof log->path, "%s", path);
    tpk_status s = TPK_OK;
    if (ctx->world->rank == 0 && !(log->f = fopen(path, "w"))) s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write", path);
    if (log->f) fprintf(log->f, "step,train_loss,val_loss,lr,grad_norm\n");
    if (tpk_agree(ctx, ctx->world, s) != TPK_OK && s == TPK_OK) s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write (on world rank 0)", path);
    return s;
}
/* One row; val_loss NaN: not evaluated at this step (an empty field). */
static inline void tpk_log_row(tpk_log *log, int64_t step, double loss, double val_loss, double lr, double norm) {
    if (!log || !log->f) return;
    fprintf(log->f, "%lld,%.9g,", (long long)step, loss);
    if (isfinite(val_loss)) fprintf(log->f, "%.9g", val_loss);
    fprintf(log->f, ",%.9g,%.17g\n", lr, norm);
}
/* Close the file; with plot, make FILE.png with gnuplot where it is installed (a line on stdout
 * says which). */
static inline void tpk_log_close(tpk_log *log, bool plot) {
    if (!log || !log->f) return;
    fclose(log->f), log->f = NULL;
    if (!plot) return;
    char cmd[4400], png[600];
    size_t n = strlen(log->path);
    snprintf(png, sizeof png, "%.*s.png", (int)(n > 4 && !strcmp(log->path + n - 4, ".csv") ? n - 4 : n), log->path);
    snprintf(cmd, sizeof cmd,
             "if command -v gnuplot >/dev/null 2>&1; then gnuplot -e \"set terminal png size 800,500; set output '%s'; set datafile "
             "separator ','; set key autotitle columnhead; set xlabel 'step'; set ylabel 'loss'; plot '%s' using 1:2 with lines title 'train', '' using "
             "1:3 with points pt 7 title 'val'\" && echo 'plot: %s'; else echo 'plot: gnuplot is not installed: the curve is in %s only'; fi",
             png, log->path, png, log->path);
    fflush(stdout);
    if (system(cmd) != 0) fprintf(stderr, "plot: gnuplot failed for %s\n", log->path);
}

#endif /* TPK_LOG_H */
