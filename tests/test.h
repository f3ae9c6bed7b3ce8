/* tests/test.h — a small harness for tests run under mpirun.
 *
 * A case groups checks: TEST_CASE("name") { CHECK(...); ... } ends with test_end(), which
 * adds up failures over all ranks so every rank agrees; rank 0 prints "ok <name> [np=N]"
 * or "FAIL <name> [np=N]". The driver (tests/run.sh) counts those lines. Any failure makes
 * the program exit 1 (test_finish). TPK_TEST_MATCH=a,b in the environment runs only the cases
 * whose name contains a or b (tests/run.sh: the emulator's second race schedule on the cases it
 * alone reaches); unset, every case. */
#ifndef TPK_TEST_H
#define TPK_TEST_H

#include <dirent.h>
#include <math.h>
#include <mpi.h>
#include <tpk/tpk.h>
#include <tpk/runtime/mpi.h>

static int test__rank, test__size, test__fails_case, test__fails_total, test__cases;
static char test__name[160];

static inline void test_init(int *argc, char ***argv) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &test__rank);
    MPI_Comm_size(MPI_COMM_WORLD, &test__size);
}
/* Whether the case named test__name runs: TPK_TEST_MATCH unset, or one of its comma-separated
 * parts in the name (the same on every rank). */
static inline int test_selected(void) {
    const char *m = getenv("TPK_TEST_MATCH");
    if (!m || !*m) return 1;
    char part[64];
    for (const char *p = m; *p;) {
        size_t n = strcspn(p, ",");
        if (n && n < sizeof part) {
            memcpy(part, p, n), part[n] = 0;
            if (strstr(test__name, part)) return 1;
        }
        p += n + (p[n] == ',');
    }
    return 0;
}
static inline int test_begin(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(test__name, sizeof test__name, fmt, ap);
    va_end(ap);
    test__fails_case = 0;
    return test_selected();
}
static inline void test_end(void) {
    int all = 0;
    MPI_Allreduce(&test__fails_case, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (test__rank == 0) printf("%s %s [np=%d]\n", all ? "FAIL" : "ok", test__name, test__size);
    fflush(stdout);
    test__fails_total += all ? 1 : 0;
    test__cases++;
}
static inline int test_finish(void) {
    MPI_Finalize();
    return test__fails_total ? 1 : 0;
}
#define TEST_CASE(...) \
    for (int test__once = test_begin(__VA_ARGS__); test__once; test__once = 0, test_end())

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            test__fails_case++;                                                                \
            fprintf(stderr, "  [rank %d] %s:%d: %s: check failed: %s: ", test__rank, __FILE__, \
                    __LINE__, test__name, #cond);                                              \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
        }                                                                                      \
    } while (0)

/* A call that must succeed. */
#define CHECK_OK(ctx, call)                                                                        \
    do {                                                                                           \
        tpk_status test__s = (call);                                                               \
        CHECK(test__s == TPK_OK, "%s: %s", tpk_status_str(test__s), tpk_last_error(ctx));          \
    } while (0)

/* A call that must fail with `want` and a message containing `needle`. */
#define CHECK_FAILS(ctx, call, want, needle)                                          \
    do {                                                                              \
        tpk_clear_error(ctx);                                                         \
        tpk_status test__s = (call);                                                  \
        CHECK(test__s == (want), "got %s, expected %s (%s)", tpk_status_str(test__s), \
              tpk_status_str(want), tpk_last_error(ctx));                             \
        CHECK(strstr(tpk_last_error(ctx), (needle)) != NULL,                          \
              "message \"%s\" does not name \"%s\"", tpk_last_error(ctx), (needle));  \
    } while (0)

/* A context's logger that keeps the lines it is given (not TPK_LOG_DEBUG's failure records):
 * tpk_ctx_desc.logger = {test_catch_log, &buf}. */
typedef struct test_logbuf {
    char lines[256][1024];
    int n;
} test_logbuf;
static inline void test_catch_log(tpk_log_level level, const char *msg, void *user) {
    test_logbuf *b = (test_logbuf *)user;
    if (level != TPK_LOG_DEBUG && b->n < 256) snprintf(b->lines[b->n++], 1024, "%s", msg);
}
/* The number of caught lines holding s1 and s2 (NULL: s1 alone). */
static inline int test_lines_with(const test_logbuf *b, const char *s1, const char *s2) {
    int n = 0;
    for (int i = 0; i < b->n; i++) n += strstr(b->lines[i], s1) && (!s2 || strstr(b->lines[i], s2));
    return n;
}

/* all[q] = the world rank of member q of group g (at most 16 members): an all-gather of each
 * member's world rank `me`. Collective over g. */
static inline void test_group_ranks(tpk_ctx *c, tpk_comm *g, int32_t me, int32_t all[16]) {
    size_t counts[16];
    for (int q = 0; q < g->size; q++) counts[q] = 1;
    if (g->size > 1)
        CHECK_OK(c, tpk_allgatherv(c, g, &me, 1, all, counts, (size_t)g->size, TPK_I32));
    else all[0] = me;
}

/* max |got - want| / max(max |want|, 1e-30) over n elements; NaN anywhere gives INFINITY. */
static inline double test_relerr(const float *got, const float *want, size_t n) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        if (isnan(g) || isnan(w)) return INFINITY;
        if (fabs(g - w) > num) num = fabs(g - w);
        if (fabs(w) > den) den = fabs(w);
    }
    return num / den;
}
#define CHECK_CLOSE(got, want, n, tol, what)                                                       \
    do {                                                                                           \
        double test__e = test_relerr((got), (want), (n));                                         \
        CHECK(test__e < (tol), "%s: relative error %.3g >= %.3g", (what), test__e, (double)(tol)); \
    } while (0)

/* The dropout draw of index i written out from its definition (tpk/base/rng.h), independently of
 * tpk_dropout_u: output i % 4 of the Philox call on counter i / 4, bits >> 8 times 2^-24. */
static inline float test_dropout_u(uint64_t seed, uint64_t stream, uint64_t i) {
    return (float)(tpk_philox(seed, stream, i / 4).v[i % 4] >> 8) / 16777216.0f;
}
/* Deterministic random fill: N(0,1) * scale from (seed, index), the same on every rank. */
static inline void test_randn(float *x, size_t n, uint64_t seed, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * tpk_rng_normal(seed, 0x7e57, i);
}
/* A one-rank context on the host backend, for the op tests; reports a failure on stderr. */
static inline tpk_status test_host_ctx(tpk_ctx *ctx) {
    tpk_status s = tpk_ctx_init(ctx, &(tpk_ctx_desc){.ops = tpk_ops_host()});
    if (s != TPK_OK) fprintf(stderr, "tpk_ctx_init: %s\n", tpk_last_error(ctx));
    return s;
}
/* Every parameter of ctx set to N(0, scale^2) drawn from (seed, its name, global index): the
 * same global tensor on every rank and at every TP size. */
static inline void test_set_weights(tpk_ctx *ctx, uint64_t seed, float scale) {
    for (int i = 0; i < ctx->params.n; i++) {
        size_t gn = tpk_param_global_numel(ctx, i);
        float *w = (float *)malloc(gn * sizeof(float));
        for (size_t k = 0; k < gn; k++)
            w[k] = scale * tpk_rng_normal(seed, tpk_rng_stream(ctx->params.list[i].name), k);
        tpk_param_set_global(ctx, i, w);
        free(w);
    }
}
/* NaN poison, so an element a kernel forgot to write shows up. */
static inline void test_poison(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}
/* Every gradient of ctx gathered to its global tensor (collective over TP): grad[i] is malloc'd,
 * poisoned first; returns the number of parameters (at most max). Free with test_free_grads. */
static inline int test_gather_grads(tpk_ctx *ctx, float **grad, int max) {
    int n = ctx->params.n < max ? ctx->params.n : max;
    for (int i = 0; i < n; i++) {
        size_t gn = tpk_param_global_numel(ctx, i);
        grad[i] = (float *)malloc(gn * sizeof(float));
        test_poison(grad[i], gn);
        tpk_status s = tpk_param_get_global(ctx, i, true, grad[i]);
        CHECK(s == TPK_OK, "gathering the gradient of %s: %s", ctx->params.list[i].name,
              tpk_last_error(ctx));
    }
    return n;
}
static inline void test_free_grads(float **grad, int *n) {
    for (int i = 0; i < *n; i++) free(grad[i]);
    *n = 0;
}

/* The token drawn from logits z[0..n) at temperature temp with uniform u, without filters, in
 * double (z / temp in f32): what tpk_sample_logits computes, for the sampling tests. */
static inline int test_plain_draw(const float *z, int n, float temp, double u) {
    double mx = -INFINITY, s = 0, c = 0;
    for (int j = 0; j < n; j++) mx = fmax(mx, z[j] / temp);
    for (int j = 0; j < n; j++) s += exp(z[j] / temp - mx);
    for (int j = 0; j < n; j++)
        if ((c += exp(z[j] / temp - mx) / s) > u) return j;
    return n - 1;
}
/* Replay a fuzz corpus (tests/fuzz/<dir>) through a fuzz target's checks (`one` aborts on a
 * broken promise): files named <valid>* must be accepted, bad* refused as TPK_ERR_FORMAT; at
 * least `min` files. */
static inline void test_replay_corpus(const char *dir, tpk_status (*one)(const uint8_t *, size_t),
                                      const char *valid, int min) {
    DIR *d = opendir(dir);
    CHECK(d != NULL, "cannot open %s", dir);
    int files = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        FILE *f = fopen(p, "rb");
        uint8_t *b = (uint8_t *)malloc(1 << 16);
        size_t size = f && b ? fread(b, 1, 1 << 16, f) : 0;
        if (f) fclose(f);
        CHECK(f && b, "cannot read %s", p);
        /* a read past the end is past the allocation */
        uint8_t *exact = (uint8_t *)malloc(size ? size : 1);
        if (exact && b) memcpy(exact, b, size);
        tpk_status s = exact ? one(exact, size) : TPK_ERR_NOMEM;
        if (!strncmp(de->d_name, valid, strlen(valid)))
            CHECK(s == TPK_OK, "%s: %s", p, tpk_status_str(s));
        if (!strncmp(de->d_name, "bad", 3))
            CHECK(s == TPK_ERR_FORMAT, "%s: %s", p, tpk_status_str(s));
        free(b), free(exact);
        files++;
    }
    if (d) closedir(d);
    CHECK(files >= min, "only %d corpus files in %s", files, dir);
}

#endif /* TPK_TEST_H */
