/* tests/test_plot.c — tpk/train/plot.h (the loss curve's SVG, no external program) and its call
 * from tpk/train/log.h: CSVs written here (random losses with and without validation rows, one
 * row, constant losses, NaN and infinite losses, 20k rows, more validation rows than a curve
 * draws, a file name with XML's special characters) drawn, and each SVG checked: its tags nest
 * and close (the svg element last), each polyline's point count (every finite row, or at most
 * 2000 when there are more), every coordinate finite and inside the viewBox, one circle per
 * validation row, the axes' titles "step" and "loss", tick labels at evenly spaced nice values
 * (1, 2 or 5 times a power of ten) covering the data, the CSV's file name as the title; the file
 * small at 20k rows. A curve resumed by tpk_log_open (rows after the resumed step dropped) drawn
 * from the file whole by tpk_log_close. Failures: a directory that does not exist, /dev/full
 * (TPK_ERR_IO naming the file, the device left alone, the CSV unchanged), an SVG path that is a
 * directory through tpk_log_close, a missing CSV, another file's header, the CSV as its own SVG.
 * Each rank works on its own files (the log cases on world rank 0's). */
#include "test.h"

#include <sys/stat.h>
#include <unistd.h>

#include <tpk/train/log.h>

static int me, np;
static char dir[256];

/* the whole file, NUL-terminated (malloc'd; NULL when unreadable), *n its length */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    for (size_t r; (r = fread(b + len, 1, cap - len - 1, f)) > 0;)
        if ((len += r) == cap - 1) b = realloc(b, cap *= 2);
    fclose(f);
    b[len] = 0;
    if (n) *n = len;
    return b;
}

/* The CSV of a run: rows steps 1..n, a validation loss every val_every rows (0: none), losses
 * from kind: 'r' random and falling, 'c' constant 2.5, 'n' with NaN and infinite losses. Returns
 * the finite train and val counts and the finite range of steps and losses. */
typedef struct csv_info {
    int train, val;
    double xmin, xmax, ymin, ymax;
} csv_info;
static csv_info write_csv(const char *path, int n, int val_every, char kind) {
    csv_info c = {0, 0, INFINITY, -INFINITY, INFINITY, -INFINITY};
    FILE *f = fopen(path, "w");
    fputs("step,train_loss,val_loss,lr,grad_norm\n", f);
    for (int i = 1; i <= n; i++) {
        double u = tpk_rng_uniform(7, 1, (uint64_t)i), loss = 4 * exp(-i / 3000.0) + 0.5 * u + 1;
        if (kind == 'c') loss = 2.5;
        if (kind == 'n' && i % 7 == 0) loss = NAN;
        if (kind == 'n' && i % 11 == 0) loss = i % 2 ? INFINITY : -INFINITY;
        double v = val_every && i % val_every == 0 ? (kind == 'c' ? 2.5 : loss + 0.2) : NAN;
        if (kind == 'n' && i % 30 == 0) v = NAN; /* "nan" written in the val column */
        char vs[32] = "";
        if (val_every && i % val_every == 0) snprintf(vs, sizeof vs, "%.9g", v);
        fprintf(f, "%d,%.9g,%s,%.9g,%.17g\n", i, loss, vs, 1e-3, 0.5);
        if (isfinite(loss)) c.train++, c.ymin = fmin(c.ymin, loss), c.ymax = fmax(c.ymax, loss);
        if (isfinite(v)) c.val++, c.ymin = fmin(c.ymin, v), c.ymax = fmax(c.ymax, v);
        if (isfinite(loss) || isfinite(v)) c.xmin = fmin(c.xmin, i), c.xmax = fmax(c.xmax, i);
    }
    fclose(f);
    return c;
}

/* The tags of s nest and close, the root is svg, nothing but space after it, every '&' an
 * entity; NULL, or what is wrong. */
static const char *xml_check(const char *s) {
    static char why[160];
    const char *stack[32];
    int depth = 0, roots = 0;
    const char *p = s;
    while ((p = strpbrk(p, "<&"))) {
        if (*p == '&') {
            if (strncmp(p, "&amp;", 5) && strncmp(p, "&lt;", 4) && strncmp(p, "&gt;", 4) &&
                strncmp(p, "&quot;", 6))
                return "a bare '&'";
            p++;
            continue;
        }
        if (!strncmp(p, "<?", 2) || !strncmp(p, "<!--", 4)) {
            const char *e = strstr(p, p[1] == '?' ? "?>" : "-->");
            if (!e) return "an unclosed <? or <!--";
            p = e + 2;
            continue;
        }
        const char *e = p + 1;
        bool quoted = false;
        for (; *e && (quoted || *e != '>'); e++)
            if (*e == '"') quoted = !quoted;
            else if (*e == '<' && !quoted) return "a '<' inside a tag";
        if (!*e) return "a tag without its '>'";
        size_t len = strcspn(p + 1 + (p[1] == '/'), " />\n");
        const char *name = p + 1 + (p[1] == '/');
        if (p[1] == '/') {
            if (!depth || strncmp(stack[depth - 1], name, len) ||
                strcspn(stack[depth - 1], " />\n") != len) {
                snprintf(why, sizeof why, "</%.*s> closes no open element", (int)len, name);
                return why;
            }
            depth--;
        } else if (e[-1] != '/') {
            if (depth == 0) roots++;
            if (depth == 0 && strncmp(name, "svg ", 4)) return "the root is not <svg>";
            if (depth == 32) return "nested too deep";
            stack[depth++] = name;
        }
        p = e + 1;
        if (depth == 0 && roots) {
            while (*p == ' ' || *p == '\n') p++;
            return *p ? "something after </svg>" : NULL;
        }
    }
    return depth ? "an element left open" : "no svg element";
}

/* attribute `name` of the tag at p (up to its '>') as a number; NAN when absent */
static double attr(const char *p, const char *name) {
    char key[32];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *e = strchr(p, '>'), *a = strstr(p, key);
    return a && a < e ? strtod(a + strlen(key), NULL) : NAN;
}

/* What an SVG of the kit shows: per curve, the polyline's points (-1: none) and its circles; the
 * tick labels; whether every coordinate is finite and in the viewBox. */
typedef struct svg_info {
    int train, val, circles, nx, ny;
    double xt[32], yt[32];
    bool coords_ok;
} svg_info;
static svg_info svg_read(const char *s) {
    svg_info v;
    memset(&v, 0, sizeof v);
    v.train = v.val = -1, v.coords_ok = true;
    const char *vb = strstr(s, "viewBox=\"");
    double W = 0, H = 0;
    if (!vb || sscanf(vb, "viewBox=\"0 0 %lf %lf\"", &W, &H) != 2) v.coords_ok = false;
#define IN(x, y) (isfinite(x) && isfinite(y) && (x) >= 0 && (x) <= W && (y) >= 0 && (y) <= H)
    for (const char *p = s; (p = strstr(p, "<polyline ")); p++) {
        bool val = strstr(p, "class=\"val\"") && strstr(p, "class=\"val\"") < strchr(p, '>');
        const char *q = strstr(p, "points=\"") + 8;
        int n = 0;
        while (*q != '"') {
            char *e;
            double x = strtod(q, &e), y = NAN;
            if (*e == ',') y = strtod(e + 1, &e);
            else v.coords_ok = false;
            if (!IN(x, y)) v.coords_ok = false;
            if (e == q) break;
            n++, q = e;
            while (*q == ' ') q++;
        }
        *(val ? &v.val : &v.train) = n;
    }
    const char *g = strstr(s, "<g class=\"val-pts\""), *ge = g ? strstr(g, "</g>") : NULL;
    for (const char *p = g; g && ge && (p = strstr(p, "<circle ")) && p < ge; p++) {
        v.circles++;
        if (!IN(attr(p, "cx"), attr(p, "cy")) || !(attr(p, "r") > 0)) v.coords_ok = false;
    }
    for (const char *p = s; (p = strstr(p, "<line ")); p++)
        if (!IN(attr(p, "x1"), attr(p, "y1")) || !IN(attr(p, "x2"), attr(p, "y2")))
            v.coords_ok = false;
    for (const char *p = s; (p = strstr(p, "<text class=\"")); p++) {
        bool x = !strncmp(p + 13, "xtick\"", 6), y = !strncmp(p + 13, "ytick\"", 6);
        if (!IN(attr(p, "x"), attr(p, "y")) && (x || y)) v.coords_ok = false;
        const char *t = strchr(p, '>') + 1;
        if (x && v.nx < 32) v.xt[v.nx++] = strtod(t, NULL);
        if (y && v.ny < 32) v.yt[v.ny++] = strtod(t, NULL);
    }
#undef IN
    return v;
}
/* n >= 2 labels evenly spaced by 1, 2 or 5 times a power of ten, covering [lo, hi] */
static bool nice_ticks(const double *t, int n, double lo, double hi) {
    if (n < 2 || n > 20) return false;
    double d = t[1] - t[0], e = floor(log10(d) + 1e-9), m = d / pow(10, e);
    if (!(d > 0) || (fabs(m - 1) > 1e-6 && fabs(m - 2) > 1e-6 && fabs(m - 5) > 1e-6)) return false;
    for (int i = 1; i < n; i++)
        if (fabs(t[i] - t[i - 1] - d) > 1e-6 * d) return false;
    for (int i = 0; i < n; i++)
        if (fabs(t[i] / d - floor(t[i] / d + 0.5)) > 1e-6) return false;
    return t[0] <= lo + 1e-9 * fabs(lo) && t[n - 1] >= hi - 1e-9 * fabs(hi);
}

/* draw csv into svg and check everything a drawing must show */
static void check_plot(tpk_ctx *ctx, const char *name, int n, int val_every, char kind) {
    char csv[512], svg[512], title[256];
    snprintf(csv, sizeof csv, "%s/%s.csv", dir, name);
    snprintf(svg, sizeof svg, "%s/%s.svg", dir, name);
    csv_info c = write_csv(csv, n, val_every, kind);
    CHECK_OK(ctx, tpk_plot_svg(ctx, csv, svg));
    size_t size = 0;
    char *s = slurp(svg, &size);
    CHECK(s != NULL, "%s: not written", svg);
    if (!s) return;
    const char *bad = xml_check(s);
    CHECK(bad == NULL, "%s: %s", svg, bad);
    svg_info v = svg_read(s);
    int most = 2000, want_train = c.train ? c.train : -1, want_val = c.val ? c.val : -1;
    if (c.train > most)
        CHECK(v.train >= most / 2 && v.train <= most, "%s: %d points", svg, v.train);
    else CHECK(v.train == want_train, "%s: %d train points, expected %d", svg, v.train, want_train);
    if (c.val > most) CHECK(v.val >= most / 2 && v.val <= most, "%s: %d val points", svg, v.val);
    else CHECK(v.val == want_val, "%s: %d val points, expected %d", svg, v.val, want_val);
    CHECK(v.circles == (c.val > most ? v.val : c.val), "%s: %d circles, expected %d", svg,
          v.circles, c.val > most ? v.val : c.val);
    CHECK(v.coords_ok, "%s: a coordinate not finite or outside the viewBox", svg);
    CHECK(strstr(s, ">step</text>") && strstr(s, ">loss</text>"), "%s: no axis titles", svg);
    CHECK(nice_ticks(v.xt, v.nx, c.xmin, c.xmax), "%s: x ticks %d: %g %g ... %g (data %g..%g)", svg,
          v.nx, v.xt[0], v.xt[1], v.xt[v.nx ? v.nx - 1 : 0], c.xmin, c.xmax);
    CHECK(nice_ticks(v.yt, v.ny, c.ymin, c.ymax), "%s: y ticks %d: %g %g ... %g (data %g..%g)", svg,
          v.ny, v.yt[0], v.yt[1], v.yt[v.ny ? v.ny - 1 : 0], c.ymin, c.ymax);
    CHECK(!strstr(s, "nan") && !strstr(s, "inf"), "%s: NaN or inf in the file", svg);
    CHECK(strstr(s, ">train</text>") && (!c.val || strstr(s, ">validation</text>")),
          "%s: the legend", svg);
    /* the title: the CSV's file name, XML-escaped */
    char *t = title;
    for (const char *q = strrchr(csv, '/') + 1; *q && t < title + sizeof title - 8; q++)
        t += *q == '&'   ? sprintf(t, "&amp;")
             : *q == '<' ? sprintf(t, "&lt;")
                         : sprintf(t, "%c", *q);
    CHECK(strstr(s, title) != NULL, "%s: the title %s", svg, title);
    CHECK(size < (n > 2000 ? 160000u : 80000u), "%s: %zu bytes", svg, size);
    free(s);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    snprintf(dir, sizeof dir, "build/tests/plot_np%d_r%d", np, me);
    mkdir("build", 0755), mkdir("build/tests", 0755), mkdir(dir, 0755);
    tpk_ctx ctx;
    if (test_host_ctx(&ctx) != TPK_OK) return 1;
    char csv[512], svg[512];

    TEST_CASE("SVG of random losses, with and without validation rows; one row; constant") {
        check_plot(&ctx, "random", 500, 50, 'r');
        check_plot(&ctx, "train_only", 300, 0, 'r');
        check_plot(&ctx, "one_row", 1, 1, 'r');
        check_plot(&ctx, "one_row_train", 1, 0, 'r');
        check_plot(&ctx, "constant", 50, 10, 'c');
        check_plot(&ctx, "a&b<c", 40, 8, 'r');
    }
    TEST_CASE("SVG: NaN and infinite losses left out; 20k rows drawn through at most 2000 points "
              "a curve") {
        check_plot(&ctx, "bad_losses", 100, 5, 'n');
        check_plot(&ctx, "long", 20000, 100, 'r');
        check_plot(&ctx, "long_val", 20000, 5, 'r');
        /* no finite loss, no rows: axes alone */
        snprintf(csv, sizeof csv, "%s/empty.csv", dir),
            snprintf(svg, sizeof svg, "%s/empty.svg", dir);
        write_csv(csv, 0, 0, 'r');
        CHECK_OK(&ctx, tpk_plot_svg(&ctx, csv, svg));
        char *s = slurp(svg, NULL);
        CHECK(s && !xml_check(s) && strstr(s, "no rows yet"), "an empty curve's SVG");
        free(s);
    }
    TEST_CASE("SVG failures: a missing directory, /dev/full, another file, the CSV itself; "
              "TPK_ERR_IO naming the file, the CSV kept") {
        snprintf(csv, sizeof csv, "%s/random.csv", dir);
        size_t n0 = 0, n1 = 0;
        char *before = slurp(csv, &n0);
        snprintf(svg, sizeof svg, "%s/no/such/dir/curve.svg", dir);
        CHECK_FAILS(&ctx, tpk_plot_svg(&ctx, csv, svg), TPK_ERR_IO, "curve.svg: cannot write (");
        struct stat st;
        if (stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode)) {
            CHECK_FAILS(&ctx, tpk_plot_svg(&ctx, csv, "/dev/full"), TPK_ERR_IO,
                        "/dev/full: cannot write (");
            CHECK(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode), "/dev/full is gone");
        }
        char *after = slurp(csv, &n1);
        CHECK(before && after && n0 == n1 && !memcmp(before, after, n0), "the CSV changed");
        free(before), free(after);
        snprintf(svg, sizeof svg, "%s/x.svg", dir);
        CHECK_FAILS(&ctx, tpk_plot_svg(&ctx, "build/tests/no_such_curve.csv", svg), TPK_ERR_IO,
                    "no_such_curve.csv: cannot open");
        CHECK_FAILS(&ctx, tpk_plot_svg(&ctx, "Makefile", svg), TPK_ERR_FORMAT,
                    "Makefile: not a loss curve");
        CHECK_FAILS(&ctx, tpk_plot_svg(&ctx, csv, csv), TPK_ERR_ARG, "is the CSV itself");
        CHECK_FAILS(&ctx, tpk_plot_svg(&ctx, NULL, svg), TPK_ERR_ARG, "csv_path: NULL");
    }
    TEST_CASE("tpk_log_close: FILE.svg of a resumed curve read back whole; an unwritable SVG is "
              "TPK_ERR_IO, the CSV kept") {
        tpk_comm world;
        tpk_ctx wc;
        CHECK_OK(&ctx, tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world));
        CHECK_OK(&wc, tpk_ctx_init(&wc, &(tpk_ctx_desc){.world = &world}));
        char wdir[256];
        snprintf(wdir, sizeof wdir, "build/tests/plot_np%d_r0", np); /* world rank 0's */
        snprintf(csv, sizeof csv, "%s/log.csv", wdir),
            snprintf(svg, sizeof svg, "%s/log.svg", wdir);
        if (me == 0) remove(svg);
        tpk_log log;
        CHECK_OK(&wc, tpk_log_open(&wc, &log, csv, 0, "r1"));
        for (int i = 1; i <= 10; i++)
            CHECK_OK(&wc, tpk_log_row(&wc, &log, i, 5.0 - 0.1 * i, i % 5 ? NAN : 4.0, 1e-3, 1));
        CHECK_OK(&wc, tpk_log_close(&wc, &log, false));
        /* another run's resume refused, the file kept; this run's resumed at 5: rows 6.. again */
        CHECK_FAILS(&wc, tpk_log_open(&wc, &log, csv, 5, "r2"), TPK_ERR_IO,
                    me ? "log.csv: refused on world rank 0"
                       : "step 1 is run \"r1\"'s and this run is \"r2\": another run's curve");
        CHECK_OK(&wc, tpk_log_open(&wc, &log, csv, 5, "r1"));
        for (int i = 6; i <= 12; i++)
            CHECK_OK(&wc, tpk_log_row(&wc, &log, i, 4.0 - 0.1 * i, i % 5 ? NAN : 3.0, 1e-3, 1));
        CHECK_OK(&wc, tpk_log_close(&wc, &log, true));
        if (me == 0) {
            char *s = slurp(svg, NULL);
            CHECK(s != NULL, "%s: not written", svg);
            svg_info v = s ? svg_read(s) : (svg_info){0};
            CHECK(s && !xml_check(s) && v.train == 12 && v.val == 2 && v.circles == 2,
                  "%s: %d train points, %d val points, %d circles; expected 12, 2, 2", svg, v.train,
                  v.val, v.circles);
            free(s);
            /* FILE.svg a directory: the plot fails, the CSV stays */
            remove(svg), mkdir(svg, 0755);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        CHECK_OK(&wc, tpk_log_open(&wc, &log, csv, 12, "r1"));
        CHECK_OK(&wc, tpk_log_row(&wc, &log, 13, 2.5, NAN, 1e-3, 1));
        if (me == 0)
            CHECK_FAILS(&wc, tpk_log_close(&wc, &log, true), TPK_ERR_IO, "log.svg: cannot write (");
        else CHECK_OK(&wc, tpk_log_close(&wc, &log, true));
        if (me == 0) {
            size_t n = 0;
            char *s = slurp(csv, &n);
            CHECK(s && !strncmp(s, "step,train_loss,val_loss", 24) && strstr(s, "\n13,2.5,,") &&
                      strstr(s, ",r1\n13,"),
                  "%s: the CSV lost its rows", csv);
            free(s), rmdir(svg);
        }
        tpk_ctx_destroy(&wc);
    }
    tpk_ctx_destroy(&ctx);
    return test_finish();
}
