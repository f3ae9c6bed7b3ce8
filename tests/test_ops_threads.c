/* tests/test_ops_threads.c — the host backend's results do not depend on its thread count
 * (kernels/host/pool.c): every op split over the pool runs on random inputs, with shapes that give
 * several parts and ragged tails, at 1 thread and at 2, 3 and 7 (TPK_NUM_THREADS), both dtypes
 * where the op has them; every output must be the same bits as at 1 thread. Outputs start
 * poisoned (NaN), so an element no part wrote shows too. And a child of fork() gets a pool of its
 * own. Runs on one rank. */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup, fork */
#include "ops_test.h"

#include <sys/wait.h>
#include <unistd.h>

enum { N = 100003, R = 77, C = 1031, XT = 13, XV = 5003, ER = 211, EH = 389 };

/* every op's outputs, end to end (bytes), for one thread count */
typedef struct outs {
    unsigned char *p;
    size_t n, cap;
} outs;
enum { CAP = 32 << 20 }; /* every output fits: a slot never moves */
static void *slot(outs *o, size_t bytes) {
    if (!o->p) o->p = (unsigned char *)calloc(o->cap = CAP, 1);
    o->n = (o->n + 15) & ~(size_t)15; /* every slot 16-byte aligned (the gaps stay 0) */
    if (!o->p || o->n + bytes > o->cap) {
        fprintf(stderr, "test_ops_threads: the outputs exceed %d bytes\n", CAP);
        exit(1);
    }
    void *s = o->p + o->n;
    memset(s, 0xff, bytes); /* NaN in f32 and bf16: an element not written shows */
    o->n += bytes;
    return s;
}

static float *in_x, *in_y, *in_z, *in_w, *in_b, *in_xl, *in_E;
static int32_t *in_ids, *in_tgt;

static void run_all(outs *o, tpk_dtype dt) {
    const tpk_ops *ops = ctx.ops;
    size_t es = tpk_dtype_size(dt);
    /* the inputs in dt */
    void *x = slot(o, N * es), *y0 = slot(o, N * es), *z = slot(o, N * es);
    CHECK_OK(&ctx, ops->cast(&ctx, x, dt, in_x, TPK_F32, N));
    CHECK_OK(&ctx, ops->cast(&ctx, y0, dt, in_y, TPK_F32, N));
    CHECK_OK(&ctx, ops->cast(&ctx, z, dt, in_z, TPK_F32, N));
    void *a = slot(o, N * es);
    CHECK_OK(&ctx, ops->fill(&ctx, a, dt, N, 0.375f));
    a = slot(o, N * es), memcpy(a, y0, N * es);
    CHECK_OK(&ctx, ops->axpby(&ctx, a, 0.7f, x, -1.3f, dt, N));
    a = slot(o, N * es);
    CHECK_OK(&ctx, ops->axpby(&ctx, a, 0.7f, x, 0.0f, dt, N));
    a = slot(o, N * es), memcpy(a, x, N * es);
    CHECK_OK(&ctx, ops->bias_add(&ctx, a, z, N / C, C, dt));
    float *db = (float *)slot(o, C * 4);
    CHECK_OK(&ctx, ops->bias_grad(&ctx, db, x, N / C, C, dt, TPK_F32, false));
    CHECK_OK(&ctx, ops->bias_grad(&ctx, db, z, N / C, C, dt, TPK_F32, true));
    for (int act = TPK_ACT_GELU_TANH; act <= TPK_ACT_GELU; act++) {
        a = slot(o, N * es);
        CHECK_OK(&ctx, ops->act_fwd(&ctx, (tpk_act)act, a, x, dt, N));
        a = slot(o, N * es);
        CHECK_OK(&ctx, ops->act_bwd(&ctx, (tpk_act)act, a, x, z, dt, N));
    }
    a = slot(o, (size_t)(R * C) * es);
    CHECK_OK(&ctx, ops->dropout(&ctx, a, x, R, C, C + 5, 3, 2, 0.3f, 11, 7, dt));
    a = slot(o, (size_t)(R * C) * es);
    CHECK_OK(&ctx, ops->rng_2d(&ctx, a, dt, R, C, C + 9, 1, 4, 5, 6, TPK_RNG_NORMAL, 0.1f, 2.0f));
    a = slot(o, (size_t)(R * C) * es);
    CHECK_OK(&ctx, ops->copy2d(&ctx, a, C, x, C + 3, R, C, dt));
    a = slot(o, N * es);
    CHECK_OK(&ctx, ops->memcpy(&ctx, a, x, N * es, TPK_H2H));
    /* the norms: [R, C] */
    float *mean = (float *)slot(o, R * 4), *rstd = (float *)slot(o, R * 4);
    void *ln = slot(o, (size_t)(R * C) * es), *dx = slot(o, (size_t)(R * C) * es);
    float *dw = (float *)slot(o, C * 4), *dbb = (float *)slot(o, C * 4);
    CHECK_OK(&ctx, ops->layernorm_fwd(&ctx, ln, mean, rstd, x, in_w, in_b, R, C, 1e-5f, dt));
    memcpy(dx, y0, (size_t)(R * C) * es), memcpy(dw, in_w, C * 4), memcpy(dbb, in_b, C * 4);
    CHECK_OK(&ctx, ops->layernorm_bwd(&ctx, dx, dw, dbb, z, x, in_w, mean, rstd, R, C, dt, true));
    ln = slot(o, (size_t)(R * C) * es), dx = slot(o, (size_t)(R * C) * es);
    rstd = (float *)slot(o, R * 4), dw = (float *)slot(o, C * 4);
    CHECK_OK(&ctx, ops->rmsnorm_fwd(&ctx, ln, rstd, x, in_w, R, C, 1e-5f, dt));
    memset(dw, 0, C * 4);
    CHECK_OK(&ctx, ops->rmsnorm_bwd(&ctx, dx, dw, z, x, in_w, rstd, R, C, dt, false));
    /* the embedding: ER tokens of EH columns over a 97-row shard (some ids outside it) */
    a = slot(o, (size_t)(ER * EH) * es);
    CHECK_OK(&ctx, ops->embed_fwd(&ctx, a, in_ids, in_E, ER, EH, 20, 97, dt, false));
    CHECK_OK(&ctx, ops->embed_fwd(&ctx, a, in_ids, in_E, ER, EH, 0, 20, dt, true));
    float *dE = (float *)slot(o, (size_t)(97 * EH) * 4);
    memcpy(dE, in_E, (size_t)(97 * EH) * 4);
    CHECK_OK(&ctx, ops->embed_bwd(&ctx, dE, x, in_ids, ER, EH, 20, 97, dt));
    /* rows moved by an index (the same ids: repeats, some past the rows): gathered from 96 rows
     * of C, scattered from ER rows of EH into 96 (and added to y0's), combined by 70 tokens of
     * K = 3 entries from 96 rows of EH, its backward */
    a = slot(o, (size_t)(ER * C) * es);
    CHECK_OK(&ctx, ops->gather_rows(&ctx, a, C, x, C, 96, in_ids, ER, C, dt));
    a = slot(o, (size_t)(96 * EH) * es);
    CHECK_OK(&ctx, ops->scatter_add_rows(&ctx, a, EH, 96, x, EH, in_ids, ER, EH, dt, false));
    a = slot(o, (size_t)(96 * EH) * es), memcpy(a, y0, (size_t)(96 * EH) * es);
    CHECK_OK(&ctx, ops->scatter_add_rows(&ctx, a, EH, 96, x, EH, in_ids, ER, EH, dt, true));
    a = slot(o, (size_t)(70 * EH) * es);
    CHECK_OK(&ctx, ops->moe_combine_fwd(&ctx, a, x, 96, in_ids, in_w, 70, 3, EH, dt));
    float *cdw = (float *)slot(o, 210 * 4);
    a = slot(o, (size_t)(96 * EH) * es);
    CHECK_OK(&ctx, ops->moe_combine_bwd(&ctx, cdw, a, z, x, 96, in_ids, in_w, 70, 3, EH, dt));
    /* the cross-entropy: [XT, XV] logits, rows padded to XV + 3 */
    size_t nx = (size_t)(XT * (XV + 3));
    void *zl = slot(o, nx * es);
    CHECK_OK(&ctx, ops->cast(&ctx, zl, dt, in_xl, TPK_F32, nx));
    float *part = (float *)slot(o, XT * 16), *loss = (float *)slot(o, XT * 4),
          *lse = (float *)slot(o, XT * 4), *dl = (float *)slot(o, XT * 4);
    CHECK_OK(&ctx, ops->xent_stats(&ctx, part, zl, in_tgt, XT, XV, XV + 3, 0, dt));
    CHECK_OK(&ctx, ops->xent_loss(&ctx, loss, lse, part, 1, in_tgt, XT, XV, 0.1f, -100));
    for (int t = 0; t < XT; t++) dl[t] = 0.25f + 0.01f * (float)t;
    a = slot(o, nx * es);
    CHECK_OK(&ctx,
             ops->xent_grad(&ctx, a, zl, lse, in_tgt, dl, XT, XV, XV + 3, 0, XV, 0.1f, -100, dt));
    a = slot(o, nx * es), loss = (float *)slot(o, XT * 4), lse = (float *)slot(o, XT * 4);
    CHECK_OK(&ctx,
             ops->xent_fused(&ctx, a, loss, lse, zl, in_tgt, XT, XV, XV + 3, 0.1f, -100, 0.5f, dt));
    if (dt != TPK_F32) return;
    /* f32 only: AdamW (decay on two runs, a bf16 copy) and the sum of squares */
    float *w = (float *)slot(o, N * 4), *m = (float *)slot(o, N * 4), *v = (float *)slot(o, N * 4);
    uint16_t *w16 = (uint16_t *)slot(o, N * 2);
    memcpy(w, in_x, N * 4), memcpy(m, in_y, N * 4), memset(v, 0, N * 4);
    const int64_t runs[4] = {1000, 40000, 60001, 99999};
    for (int64_t step = 1; step <= 2; step++)
        CHECK_OK(&ctx, ops->adamw(&ctx, w, in_z, m, v, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step,
                                  0.5f, NULL, 1.0f, runs, 2, w16));
    double *ss = (double *)slot(o, 8);
    CHECK_OK(&ctx, ops->sumsq(&ctx, ss, in_x, N, false));
    CHECK_OK(&ctx, ops->sumsq(&ctx, ss, in_z, N, true));
}

static void test_threads(void) {
    TEST_CASE("host ops: the same bits at 1, 2, 3 and 7 threads (every op the pool splits)") {
        size_t nx = (size_t)(XT * (XV + 3));
        in_x = fbuf(N), in_y = fbuf(N), in_z = fbuf(N), in_w = fbuf(C), in_b = fbuf(C);
        in_xl = fbuf(nx), in_E = fbuf((size_t)(97 * EH));
        in_ids = (int32_t *)malloc(ER * sizeof(int32_t)), in_tgt = (int32_t *)malloc(XT * 4);
        test_randn(in_x, N, 1, 1.0f), test_randn(in_y, N, 2, 1.0f), test_randn(in_z, N, 3, 1.0f);
        test_randn(in_w, C, 4, 1.0f), test_randn(in_b, C, 5, 1.0f), test_randn(in_xl, nx, 6, 3.0f);
        test_randn(in_E, (size_t)(97 * EH), 7, 1.0f);
        for (int t = 0; t < ER; t++) in_ids[t] = (t * 37) % 131; /* repeats, some past the shard */
        for (int t = 0; t < XT; t++) in_tgt[t] = t == 4 ? -100 : (t * 401) % XV;
        const char *old = getenv("TPK_NUM_THREADS");
        char *saved = old ? strdup(old) : NULL;
        for (int d = 0; d < 2; d++) {
            tpk_dtype dt = d ? TPK_BF16 : TPK_F32;
            outs one = {NULL, 0, 0};
            setenv("TPK_NUM_THREADS", "1", 1);
            run_all(&one, dt);
            const int counts[] = {2, 3, 7};
            for (int k = 0; k < 3; k++) {
                char s[8];
                snprintf(s, sizeof s, "%d", counts[k]);
                setenv("TPK_NUM_THREADS", s, 1);
                outs many = {NULL, 0, 0};
                run_all(&many, dt);
                size_t diff = 0, first = 0;
                for (size_t i = 0; i < one.n && many.n == one.n; i++)
                    if (one.p[i] != many.p[i] && !diff++) first = i;
                CHECK(many.n == one.n && diff == 0,
                      "%s at %d threads: %zu of %zu bytes differ from 1 thread (first at %zu)",
                      d ? "bf16" : "f32", counts[k], diff, one.n, first);
                free(many.p);
            }
            /* nothing stayed poisoned: every output byte run was written (f32 NaN = 0xffffffff) */
            size_t left = 0;
            for (size_t i = 0; i + 4 <= one.n; i += 4) {
                uint32_t u;
                memcpy(&u, one.p + i, 4);
                left += u == 0xffffffffu;
            }
            CHECK(left == 0, "%s: %zu words still poisoned", d ? "bf16" : "f32", left);
            free(one.p);
        }
        if (saved) setenv("TPK_NUM_THREADS", saved, 1), free(saved);
        else unsetenv("TPK_NUM_THREADS");
        free(in_x), free(in_y), free(in_z), free(in_w), free(in_b), free(in_xl), free(in_E);
        free(in_ids), free(in_tgt);
    }
}

/* A child of fork() after the pool has started has no workers: it must make its own, not wait on
 * the parent's (an alarm turns a hang into a failure). */
static void test_fork(void) {
    TEST_CASE("host ops: the pool in a child process of fork()") {
        enum { M = 1 << 16 };
        float *a = fbuf(M), *b = fbuf(M), *c = fbuf(M);
        test_randn(a, M, 8, 1.0f);
        setenv("TPK_NUM_THREADS", "3", 1);
        CHECK_OK(&ctx, ctx.ops->act_fwd(&ctx, TPK_ACT_GELU_TANH, b, a, TPK_F32, M));
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) { /* the child: the same op again, over a pool of its own */
            alarm(60);
            tpk_status st = ctx.ops->act_fwd(&ctx, TPK_ACT_GELU_TANH, c, a, TPK_F32, M);
            _exit(st == TPK_OK && memcmp(b, c, sizeof(float) * M) == 0 ? 0 : 3);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork or waitpid failed");
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's op %s (status %d)",
              WIFSIGNALED(status) ? "hung or crashed" : "gave other bits", status);
        CHECK_OK(&ctx, ctx.ops->act_fwd(&ctx, TPK_ACT_GELU_TANH, c, a, TPK_F32, M));
        CHECK(memcmp(b, c, sizeof(float) * M) == 0, "the parent's pool after the fork differs");
        unsetenv("TPK_NUM_THREADS");
        free(a), free(b), free(c);
    }
}

OPS_TEST_MAIN(test_threads, test_fork)
