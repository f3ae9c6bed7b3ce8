/* tpk/train/log.h — a training run's loss curve: a CSV file (step, train_loss, val_loss, lr,
 * grad_norm, run; every f32 exactly, %.9g; run the run's id, tpk_trainable.run_id) written by
 * world rank 0, and when it is closed an SVG of the curve beside it drawn by the kit (FILE.csv ->
 * FILE.svg, tpk/train/plot.h), and a PNG (FILE.png) where gnuplot is installed, or a line saying
 * there is none. A resumed run appends to the curve of the run it resumes (its rows after the
 * resumed step dropped) only when that curve is its own run's up to the resumed step: every row
 * naming the run the checkpoint names, the rows' steps consecutive (each the one before plus one)
 * and one of them the resumed step; another run's curve (even one whose steps fit), a curve that
 * ends before it (a gap), starts after it, or whose steps jump (two runs' rows) is refused, naming
 * the file, and left as it is. A file removed or replaced while the run writes it is an error at
 * the next row. Every write is checked: a failure is TPK_ERR_IO naming the file.
 * Collective over ctx->world only in tpk_log_open (every rank learns whether rank 0 could
 * write). */
#ifndef TPK_LOG_H
#define TPK_LOG_H

#include <errno.h>
#include <math.h>
#include <sys/stat.h>

#include "../runtime/coll.h"
#include "plot.h"

typedef struct tpk_log {
    FILE *f;        /* world rank 0's file; NULL elsewhere or without a log */
    char path[512];
    unsigned long long dev, ino; /* the file opened: one removed or replaced is noticed */
    char run[33];                /* every row's run column */
} tpk_log;

static const char tpk__log_header[] = "step,train_loss,val_loss,lr,grad_norm,run\n";

/* The curve of an earlier run resumed at step `from`: path's rows up to step `from` kept, later
 * ones (which the resumed run writes again) dropped, written to path.tmp and renamed over path.
 * Fails, path left as it is, on a file that is not such a curve (another header: also an older
 * curve without the run column), with a row of another run than `run`, whose steps are not
 * consecutive (two runs' rows, or a gap) or that has no row at step `from` (it ends before, or
 * starts after, the step the run continues from). */
static inline tpk_status tpk__log_keep(tpk_ctx *ctx, const char *path, int64_t from,
                                       const char *run) {
    static const char *fn = "tpk_log_open";
    FILE *in = fopen(path, "r"), *out = NULL;
    if (!in) return TPK_OK; /* a new file */
    char line[1024], tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    tpk_status s = TPK_OK;
    long long prev = -1, first = -1;
    bool at = false;
    if (!fgets(line, sizeof line, in) || strcmp(line, tpk__log_header))
        s = tpk__fail(
            ctx, TPK_ERR_IO, fn,
            "%s: not a loss curve of this kit (its first line is not \"step,train_loss,val_loss,"
            "lr,grad_norm,run\"): give another --csv, or remove it",
            path);
    else if (!(out = fopen(tmp, "w")) || fputs(tpk__log_header, out) < 0)
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write (%s)", tmp, strerror(errno));
    while (s == TPK_OK && fgets(line, sizeof line, in)) {
        char *end = NULL;
        long long step = strtoll(line, &end, 10);
        if (end == line || *end != ',') continue;
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        const char *comma = strrchr(line, ','); /* the last field: the run */
        size_t rl = line + len > comma ? (size_t)(line + len - comma - 1) : 0;
        if (rl != strlen(run) || strncmp(comma + 1, run, rl)) {
            s = tpk__fail(ctx, TPK_ERR_IO, fn,
                          "%s: step %lld is run \"%.*s\"'s and this run is \"%s\": another run's "
                          "curve (give another --csv, or remove it)",
                          path, step, (int)(rl > 40 ? 40 : rl), comma + 1, run);
            break;
        }
        if (prev >= 0 && step != prev + 1) {
            s = tpk__fail(ctx, TPK_ERR_IO, fn,
                          "%s: step %lld follows step %lld: not one run's curve (two runs' rows, "
                          "or a gap): give another --csv, or remove it",
                          path, step, prev);
            break;
        }
        if (first < 0) first = step;
        prev = step, at = at || step == (long long)from;
        if (step > from) continue; /* after the resumed step: written again */
        if (fputs(line, out) < 0)
            s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write (%s)", tmp, strerror(errno));
    }
    if (s == TPK_OK && ferror(in)) s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot read", path);
    if (s == TPK_OK && !at)
        s = first < 0 ? tpk__fail(ctx, TPK_ERR_IO, fn,
                                  "%s: has no rows, the run continues from step %lld: a gap (give "
                                  "another --csv, or remove it)",
                                  path, (long long)from)
                      : tpk__fail(ctx, TPK_ERR_IO, fn,
                                  "%s: its rows are steps %lld..%lld, the run continues from step "
                                  "%lld: %s (give another --csv, or remove it)",
                                  path, first, prev, (long long)from,
                                  prev < from ? "a gap" : "it starts after that step");
    fclose(in);
    if (out && fclose(out) != 0 && s == TPK_OK)
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write (%s)", tmp, strerror(errno));
    if (s == TPK_OK && rename(tmp, path) != 0)
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot replace it (%s)", path, strerror(errno));
    if (s != TPK_OK && out) remove(tmp);
    return s;
}

/* Open path (NULL or "": no log) for writing on world rank 0; run: the run's id written in every
 * row (tpk_trainable.run_id: 0..32 of [0-9a-z]; NULL: ""). from = 0: a new curve (the header,
 * any earlier file replaced); from > 0, a run resumed at step `from`: the rows of path up to that
 * step kept (each of run `run`) and the new ones appended (the header only if the file is new).
 * A write that fails (a full disk, /dev/full) fails here, before training. */
static inline tpk_status tpk_log_open(tpk_ctx *ctx, tpk_log *log, const char *path, int64_t from,
                                      const char *run) {
    static const char *fn = "tpk_log_open";
    if (!ctx) return TPK_ERR_ARG;
    if (!log) return tpk__fail(ctx, TPK_ERR_ARG, fn, "log: NULL");
    memset(log, 0, sizeof *log);
    if (!path || !path[0]) return TPK_OK;
    if (strlen(path) >= sizeof log->path)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "path: longer than %zu characters",
                         sizeof log->path - 1);
    if (from < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "from: expected a step >= 0, got %lld",
                         (long long)from);
    if (!run) run = "";
    if (strlen(run) > 32 || strspn(run, "0123456789abcdefghijklmnopqrstuvwxyz") != strlen(run))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "run: expected 0..32 of [0-9a-z], got \"%.40s\"",
                         run);
    snprintf(log->path, sizeof log->path, "%s", path);
    snprintf(log->run, sizeof log->run, "%s", run);
    tpk_status s = TPK_OK;
    if (ctx->world->rank == 0) {
        bool append = false;
        if (from > 0) {
            FILE *old = fopen(path, "r");
            append = old != NULL;
            if (old) fclose(old);
            s = tpk__log_keep(ctx, path, from, run);
        }
        if (s == TPK_OK && !(log->f = fopen(path, append ? "a" : "w")))
            s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write (%s)", path, strerror(errno));
        if (s == TPK_OK && ((!append && fputs(tpk__log_header, log->f) < 0) || fflush(log->f) != 0))
            s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write (%s)", path, strerror(errno));
        struct stat st;
        if (s == TPK_OK && stat(path, &st) == 0)
            log->dev = (unsigned long long)st.st_dev, log->ino = (unsigned long long)st.st_ino;
        if (s != TPK_OK && log->f) fclose(log->f), log->f = NULL;
    }
    if (tpk_agree(ctx, ctx->world, s) != TPK_OK && s == TPK_OK)
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: refused on world rank 0 (its message says why)",
                      path);
    return s;
}
/* One row, flushed (a full disk shows at once); val_loss NaN: not evaluated at this step (an
 * empty field). Not collective: it fails on world rank 0 only, with TPK_ERR_IO naming the file. */
static inline tpk_status tpk_log_row(tpk_ctx *ctx, tpk_log *log, int64_t step, double loss,
                                     double val_loss, double lr, double norm) {
    if (!ctx) return TPK_ERR_ARG;
    if (!log) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_log_row", "log: NULL");
    if (!log->f) return TPK_OK;
    struct stat st;
    bool gone = stat(log->path, &st) != 0;
    if (gone || (unsigned long long)st.st_dev != log->dev ||
        (unsigned long long)st.st_ino != log->ino)
        return tpk__fail(ctx, TPK_ERR_IO, "tpk_log_row",
                         "%s: %s during the run: its rows would be lost", log->path,
                         gone ? "removed" : "replaced");
    char v[32] = "";
    if (isfinite(val_loss)) snprintf(v, sizeof v, "%.9g", val_loss);
    if (fprintf(log->f, "%lld,%.9g,%s,%.9g,%.17g,%s\n", (long long)step, loss, v, lr, norm,
                log->run) < 0 ||
        fflush(log->f) != 0)
        return tpk__fail(ctx, TPK_ERR_IO, "tpk_log_row", "%s: cannot write (%s)", log->path,
                         strerror(errno));
    return TPK_OK;
}
/* Close the file (TPK_ERR_IO when its last write fails); with plot, write FILE.svg from the file
 * (tpk_plot_svg: TPK_ERR_IO naming FILE.svg when it cannot be written; the CSV stays) and make
 * FILE.png with gnuplot where it is installed (a line through the context's logger says each:
 * "plot: FILE", TPK_LOG_INFO; gnuplot's failure TPK_LOG_WARN). Not collective. */
static inline tpk_status tpk_log_close(tpk_ctx *ctx, tpk_log *log, bool plot) {
    if (!log || !log->f) return TPK_OK;
    bool bad = fclose(log->f) != 0;
    log->f = NULL;
    if (bad)
        return ctx ? tpk__fail(ctx, TPK_ERR_IO, "tpk_log_close", "%s: cannot write (%s)", log->path,
                               strerror(errno))
                   : TPK_ERR_IO;
    if (!plot) return TPK_OK;
    char cmd[4400], png[600], svg[600];
    size_t n = strlen(log->path);
    int stem = (int)(n > 4 && !strcmp(log->path + n - 4, ".csv") ? n - 4 : n);
    snprintf(png, sizeof png, "%.*s.png", stem, log->path);
    snprintf(svg, sizeof svg, "%.*s.svg", stem, log->path);
    tpk_status s = tpk_plot_svg(ctx, log->path, svg);
    if (s == TPK_OK) tpk_logf(ctx, TPK_LOG_INFO, "plot: %s", svg);
    fflush(stdout);
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        tpk_logf(ctx, TPK_LOG_INFO, "plot: gnuplot is not installed: no %s (the SVG has the curve)",
                 png);
        return s;
    }
    snprintf(cmd, sizeof cmd,
             "gnuplot -e \"set terminal png size 800,500; set output '%s'; set datafile separator "
             "','; set key autotitle columnhead; set xlabel 'step'; set ylabel 'loss'; plot '%s' "
             "using 1:2 with lines title 'train', '' using 1:3 with points pt 7 title 'val'\"",
             png, log->path);
    if (system(cmd) == 0) tpk_logf(ctx, TPK_LOG_INFO, "plot: %s", png);
    else tpk_logf(ctx, TPK_LOG_WARN, "plot: gnuplot failed for %s", log->path);
    return s;
}

#endif /* TPK_LOG_H */
