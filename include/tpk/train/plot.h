/* tpk/train/plot.h — a loss curve drawn as an SVG by the kit itself, no external program: from
 * the CSV of tpk/train/log.h (step, train_loss, val_loss, ...), read back from the file (so a
 * resumed run's curve is there whole), the training loss a polyline, the validation loss circles
 * joined by a line, axes "step" and "loss" with grid lines and labels at round values (Heckbert's
 * nice numbers: 1, 2 or 5 times a power of ten), a legend and the CSV's file name as the title.
 * A NaN or infinite loss is left out of its curve; a row that does not parse (a line a killed run
 * cut) is skipped; one row, or a curve of one value, gets axes around it. A curve of more than
 * TPK__PLOT_POINTS points is drawn through at most that many (the lowest and the highest of each
 * run of consecutive rows, in their order), so a run of any length gives a file of tens of KB.
 * Needs POSIX (stat, to leave a device such as /dev/full alone when a write fails). */
#ifndef TPK_PLOT_H
#define TPK_PLOT_H

#include <errno.h>
#include <math.h>
#include <sys/stat.h>

#include "../base/ctx.h"

enum { TPK__PLOT_POINTS = 2000 }; /* at most this many points a curve (and circles) */

/* One curve: its finite points in file order. */
typedef struct tpk__plot_series {
    double *x, *y;
    size_t n, cap;
} tpk__plot_series;

static inline bool tpk__plot_push(const tpk_ctx *ctx, tpk__plot_series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024, was = s->cap * sizeof(double);
        double *nx = (double *)tpk__realloc(ctx, s->x, was, cap * sizeof(double));
        if (nx) s->x = nx;
        double *ny = nx ? (double *)tpk__realloc(ctx, s->y, was, cap * sizeof(double)) : NULL;
        if (!ny) return false;
        s->y = ny, s->cap = cap;
    }
    s->x[s->n] = x, s->y[s->n] = y, s->n++;
    return true;
}
static inline void tpk__plot_free(const tpk_ctx *ctx, tpk__plot_series *s) {
    tpk__free(ctx, s->x), tpk__free(ctx, s->y);
}

/* The indices of s's points drawn (at most TPK__PLOT_POINTS): all, or the lowest and the highest
 * of each run of ceil(2 n / TPK__PLOT_POINTS) consecutive points, in their order. */
static inline size_t tpk__plot_decimate(const tpk__plot_series *s, size_t *idx) {
    size_t n = s->n, m = 0;
    if (n <= TPK__PLOT_POINTS) {
        for (size_t i = 0; i < n; i++) idx[i] = i;
        return n;
    }
    size_t run = (2 * n + TPK__PLOT_POINTS - 1) / TPK__PLOT_POINTS;
    for (size_t a = 0; a < n; a += run) {
        size_t lo = a, hi = a, b = a + run < n ? a + run : n;
        for (size_t i = a; i < b; i++) {
            if (s->y[i] < s->y[lo]) lo = i;
            if (s->y[i] > s->y[hi]) hi = i;
        }
        idx[m++] = lo < hi ? lo : hi;
        if (lo != hi) idx[m++] = lo < hi ? hi : lo;
    }
    return m;
}

/* x rounded to a nice number: 1, 2, 5 or 10 times a power of ten (nearest when round, else the
 * one at or above). */
static inline double tpk__plot_nice(double x, bool round) {
    double e = floor(log10(x)), f = x / pow(10, e), nf;
    if (round) nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
    else nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
    return nf * pow(10, e);
}
/* An axis over [mn, mx] (mn > mx: no data): [*lo, *hi] the range widened to multiples of the tick
 * step *d (whole numbers when integer), about `ticks` ticks; a zero range widened around it. */
static inline void tpk__plot_axis(double mn, double mx, int ticks, bool integer, double *lo,
                                  double *hi, double *d) {
    if (mn > mx) mn = 0, mx = 1;
    if (mx == mn) {
        double pad = integer ? 1 : mn != 0 ? fabs(mn) * 0.1 : 1;
        mn -= pad, mx += pad;
    }
    *d = tpk__plot_nice(tpk__plot_nice(mx - mn, false) / (ticks - 1), true);
    if (integer && *d < 1) *d = 1;
    *lo = floor(mn / *d) * *d, *hi = ceil(mx / *d) * *d;
}
/* A tick's label: as many decimals as the step needs (none at or above 1), %g for the extreme. */
static inline void tpk__plot_label(char *buf, size_t size, double v, double d) {
    if (fabs(v) < d * 1e-9) v = 0; /* no "-0" */
    int frac = d >= 1 ? 0 : (int)ceil(-log10(d) - 1e-9);
    if (fabs(v) >= 1e9 || frac > 9) snprintf(buf, size, "%.6g", v);
    else snprintf(buf, size, "%.*f", frac, v);
}
/* The page: W x H, the plot area [L, W - R] x [T, H - B] showing [x0, x1] x [y0, y1]. */
typedef struct tpk__plot_frame {
    double W, H, L, R, T, B, x0, x1, y0, y1;
} tpk__plot_frame;
static inline double tpk__plot_px(const tpk__plot_frame *p, double x) {
    return p->L + (x - p->x0) / (p->x1 - p->x0) * (p->W - p->L - p->R);
}
static inline double tpk__plot_py(const tpk__plot_frame *p, double y) {
    return p->H - p->B - (y - p->y0) / (p->y1 - p->y0) * (p->H - p->T - p->B);
}
/* The text with XML's special characters escaped. */
static inline void tpk__plot_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
            case '&': fputs("&amp;", f); break;
            case '<': fputs("&lt;", f); break;
            case '>': fputs("&gt;", f); break;
            case '"': fputs("&quot;", f); break;
            default: fputc(*s, f);
        }
    }
}

/* The curve's points from the CSV: train (step, train_loss) and val (step, val_loss), finite
 * only; *rows the rows read. */
static inline tpk_status tpk__plot_read(tpk_ctx *ctx, const char *fn, const char *csv,
                                        tpk__plot_series *train, tpk__plot_series *val,
                                        size_t *rows, double *xmin, double *xmax) {
    FILE *f = fopen(csv, "r");
    if (!f) return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot open (%s)", csv, strerror(errno));
    char line[1024];
    tpk_status s = TPK_OK;
    if (!fgets(line, sizeof line, f) || strncmp(line, "step,train_loss,val_loss", 24))
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                      "%s: not a loss curve (its first line is not \"step,train_loss,val_loss,"
                      "...\")",
                      csv);
    while (s == TPK_OK && fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len && line[len - 1] != '\n' && !feof(f)) { /* too long: not a row of the log */
            for (int ch; (ch = fgetc(f)) != EOF && ch != '\n';) {}
            continue;
        }
        char *p = line, *end = NULL;
        double step = strtod(p, &end), loss, v = NAN;
        if (end == p || *end != ',' || !isfinite(step)) continue;
        loss = strtod(p = end + 1, &end);
        if (end == p || (*end != ',' && *end != '\n' && *end)) continue;
        if (*end == ',' && end[1] != ',' && end[1] != '\n' && end[1]) {
            v = strtod(p = end + 1, &end);
            if (end == p) v = NAN;
        }
        (*rows)++;
        *xmin = fmin(*xmin, step), *xmax = fmax(*xmax, step);
        if ((isfinite(loss) && !tpk__plot_push(ctx, train, step, loss)) ||
            (isfinite(v) && !tpk__plot_push(ctx, val, step, v)))
            s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%s: the curve's points", csv);
    }
    if (s == TPK_OK && ferror(f)) s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot read", csv);
    fclose(f);
    return s;
}

/* Write svg_path: the curve of the loss-curve CSV csv_path (tpk/train/log.h's). TPK_ERR_IO naming
 * the file when the CSV cannot be read or the SVG written (a full disk: the partial SVG removed,
 * the CSV untouched); TPK_ERR_FORMAT when csv_path is not such a curve. Not collective. */
static inline tpk_status tpk_plot_svg(tpk_ctx *ctx, const char *csv_path, const char *svg_path) {
    static const char *fn = "tpk_plot_svg";
    if (!ctx) return TPK_ERR_ARG;
    if (!csv_path || !svg_path)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", csv_path ? "svg_path" : "csv_path");
    if (!strcmp(csv_path, svg_path))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "svg_path: \"%s\" is the CSV itself", svg_path);
    tpk__plot_series tr, va;
    memset(&tr, 0, sizeof tr), memset(&va, 0, sizeof va);
    size_t rows = 0, *idx = NULL;
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    tpk_status s = tpk__plot_read(ctx, fn, csv_path, &tr, &va, &rows, &xmin, &xmax);
    size_t most = tr.n > va.n ? tr.n : va.n;
    if (s == TPK_OK && !(idx = (size_t *)tpk__malloc(ctx, sizeof(size_t) * most)))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%s: the curve's points", csv_path);
    FILE *f = NULL;
    if (s == TPK_OK && !(f = fopen(svg_path, "w")))
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write (%s)", svg_path, strerror(errno));
    if (s != TPK_OK) {
        tpk__plot_free(ctx, &tr), tpk__plot_free(ctx, &va), tpk__free(ctx, idx);
        return s;
    }
    for (size_t i = 0; i < tr.n; i++) ymin = fmin(ymin, tr.y[i]), ymax = fmax(ymax, tr.y[i]);
    for (size_t i = 0; i < va.n; i++) ymin = fmin(ymin, va.y[i]), ymax = fmax(ymax, va.y[i]);
    tpk__plot_frame fr;
    fr.W = 800, fr.H = 500, fr.L = 72, fr.R = 24, fr.T = 44, fr.B = 56;
    const double W = fr.W, H = fr.H, L = fr.L, R = fr.R, T = fr.T, B = fr.B;
    double dx, dy;
    tpk__plot_axis(xmin, xmax, 7, true, &fr.x0, &fr.x1, &dx);
    tpk__plot_axis(ymin, ymax, 6, false, &fr.y0, &fr.y1, &dy);
    const double x0 = fr.x0, y0 = fr.y0;
    const char *name = strrchr(csv_path, '/');
    name = name ? name + 1 : csv_path;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
            "viewBox=\"0 0 %g %g\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"%g\" height=\"%g\" fill=\"white\"/>\n<text class=\"title\" x=\"%g\" "
            "y=\"26\" text-anchor=\"middle\" font-size=\"15\">",
            W, H, W, H, W, H, (L + W - R) / 2);
    tpk__plot_text(f, name);
    fprintf(f, "</text>\n<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
    char lab[64];
    int nx = (int)floor((fr.x1 - x0) / dx + 0.5), ny = (int)floor((fr.y1 - y0) / dy + 0.5);
    for (int t = 0; t <= nx; t++)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\"/>\n",
                tpk__plot_px(&fr, x0 + t * dx), T, tpk__plot_px(&fr, x0 + t * dx), H - B);
    for (int t = 0; t <= ny; t++)
        fprintf(f, "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\"/>\n", L,
                tpk__plot_py(&fr, y0 + t * dy), W - R, tpk__plot_py(&fr, y0 + t * dy));
    fprintf(f,
            "</g>\n<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" "
            "stroke=\"black\"/>\n<g text-anchor=\"middle\">\n",
            L, T, W - L - R, H - T - B);
    for (int t = 0; t <= nx; t++) {
        tpk__plot_label(lab, sizeof lab, x0 + t * dx, dx);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"black\"/><text "
                "class=\"xtick\" x=\"%.1f\" y=\"%g\">%s</text>\n",
                tpk__plot_px(&fr, x0 + t * dx), H - B, tpk__plot_px(&fr, x0 + t * dx), H - B + 5,
                tpk__plot_px(&fr, x0 + t * dx), H - B + 19, lab);
    }
    fprintf(f, "</g>\n<g text-anchor=\"end\">\n");
    for (int t = 0; t <= ny; t++) {
        tpk__plot_label(lab, sizeof lab, y0 + t * dy, dy);
        fprintf(f,
                "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"black\"/><text "
                "class=\"ytick\" x=\"%g\" y=\"%.1f\">%s</text>\n",
                L - 5, tpk__plot_py(&fr, y0 + t * dy), L, tpk__plot_py(&fr, y0 + t * dy), L - 8,
                tpk__plot_py(&fr, y0 + t * dy) + 4, lab);
    }
    fprintf(f,
            "</g>\n<text class=\"xlabel\" x=\"%g\" y=\"%g\" text-anchor=\"middle\">step</text>\n"
            "<text class=\"ylabel\" transform=\"translate(18 %g) rotate(-90)\" "
            "text-anchor=\"middle\">loss</text>\n",
            (L + W - R) / 2, H - 14, (T + H - B) / 2);
    /* the curves: train, then val's line and circles */
    for (int c = 0; c < 2; c++) {
        const tpk__plot_series *sr = c ? &va : &tr;
        size_t m = tpk__plot_decimate(sr, idx);
        if (!m) continue;
        fprintf(f,
                "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" "
                "stroke-linejoin=\"round\" stroke-linecap=\"round\" points=\"",
                c ? "val" : "train", c ? "#d95f02" : "#1f77b4", c ? "1.2" : "1.5");
        for (size_t i = 0; i < m; i++)
            fprintf(f, "%s%.1f,%.1f", i ? " " : "", tpk__plot_px(&fr, sr->x[idx[i]]),
                    tpk__plot_py(&fr, sr->y[idx[i]]));
        fprintf(f, "\"/>\n");
        if (!c && m == 1) /* a line of one point: a dot */
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"#1f77b4\"/>\n",
                    tpk__plot_px(&fr, tr.x[0]), tpk__plot_py(&fr, tr.y[0]));
        if (!c) continue;
        /* the validation rows' circles, smaller when there are many */
        fprintf(f, "<g class=\"val-pts\" fill=\"#d95f02\">\n");
        for (size_t i = 0; i < m; i++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%s\"/>\n",
                    tpk__plot_px(&fr, sr->x[idx[i]]), tpk__plot_py(&fr, sr->y[idx[i]]),
                    m > 200 ? "1.5" : "3");
        fprintf(f, "</g>\n");
    }
    if (!tr.n && !va.n)
        fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\" fill=\"gray\">%s</text>\n",
                (L + W - R) / 2, (T + H - B) / 2, rows ? "no finite loss" : "no rows yet");
    /* the legend, at the top right of the plot area */
    double lx = W - R - 118, ly = T + 10;
    fprintf(f,
            "<g class=\"legend\"><rect x=\"%g\" y=\"%g\" width=\"110\" height=\"%d\" "
            "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999\"/>\n<line x1=\"%g\" y1=\"%g\" "
            "x2=\"%g\" y2=\"%g\" stroke=\"#1f77b4\" stroke-width=\"1.5\"/><text x=\"%g\" "
            "y=\"%g\">train</text>\n",
            lx, ly, va.n ? 44 : 24, lx + 8, ly + 12, lx + 32, ly + 12, lx + 40, ly + 16);
    if (va.n)
        fprintf(f,
                "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#d95f02\" "
                "stroke-width=\"1.2\"/><circle class=\"legend-pt\" cx=\"%g\" cy=\"%g\" r=\"3\" "
                "fill=\"#d95f02\"/><text x=\"%g\" y=\"%g\">validation</text>\n",
                lx + 8, ly + 32, lx + 32, ly + 32, lx + 20, ly + 32, lx + 40, ly + 36);
    fprintf(f, "</g>\n</svg>\n");
    tpk__plot_free(ctx, &tr), tpk__plot_free(ctx, &va), tpk__free(ctx, idx);
    bool bad = ferror(f) != 0;
    int err = errno;
    if (fclose(f) != 0 && !bad) bad = true, err = errno;
    if (bad) {
        struct stat st;
        if (stat(svg_path, &st) == 0 && S_ISREG(st.st_mode)) remove(svg_path);
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write (%s)", svg_path, strerror(err));
    }
    return TPK_OK;
}

#endif /* TPK_PLOT_H */
