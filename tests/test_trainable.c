/* tests/test_trainable.c — the one trainable handle (tpk/train/trainable.h) against the model it
 * wraps, driven directly: the reference is a GPT-2 alone on each rank (a context of its own),
 * trained by tpk_model_train_step with AdamW, its losses read by tpk_model_loss_dp and evaluated
 * by tpk_model_forward. Without stages the handle gives the same bits; with stages (P = the ranks,
 * 1F1B and GPipe over 2 micro-batches; at one rank P = 1 through the pipeline) the same losses,
 * norms and evaluation within 1e-5, the same parameter count (a tied embedding's two copies once),
 * and a save read back into a model without stages gives its evaluation. Random ids and targets;
 * outputs poisoned before each read. Bad descriptions are refused by name. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <tpk/train/trainable.h>

enum { V = 61, L = 4, HID = 16, A = 2, B = 2, S = 8, M = 2, STEPS = 3 };
static int32_t ids[M * B * S], tg[M * B * S];

static tpk_model_config config(void) {
    tpk_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = TPK_ARCH_GPT2;
    c.gpt2.vocab = V, c.gpt2.positions = S, c.gpt2.layers = L, c.gpt2.hidden = HID;
    c.gpt2.heads = A;
    return c;
}

/* the reference's losses, norms (STEPS) and evaluation losses (M) on this rank alone */
static void reference(double *loss, double *norm, float *eval, size_t *params) {
    tpk_ctx r;
    tpk_comm self = tpk_comm_self(false);
    tpk_model m;
    tpk_adamw opt = {0};
    tpk_dp_buckets b = {0};
    tpk_model_config mc = config();
    CHECK_OK(&r, tpk_ctx_init(&r, &(tpk_ctx_desc){.world = &self, .seed = 9}));
    CHECK_OK(&r, tpk_model_init(&r, &m, &mc));
    CHECK_OK(&r, tpk_adamw_init(&r, &opt, &(tpk_adamw_desc){.weight_decay = 0.1f}));
    tpk_model_set_grad_ready(&m, tpk_dp_grad_ready, &b);
    *params = tpk_params_global_numel(&r);
    for (int s = 0; s < STEPS; s++) {
        loss[s] = norm[s] = NAN;
        CHECK_OK(&r, tpk_model_train_step(&r, &m, NULL, &opt, &b, ids, tg, B, S, M, 1.0f / M,
                                          (uint64_t)(s * M), 1e-2f, 1.0f, &norm[s]));
        CHECK_OK(&r, tpk_model_loss_dp(&r, &m, 1.0 / M, &loss[s]));
    }
    for (int k = 0; k < M; k++) {
        eval[k] = NAN;
        CHECK_OK(&r, tpk_model_forward(&r, &m, ids + k * B * S, tg + k * B * S, B, S, &eval[k]));
    }
    tpk_adamw_destroy(&r, &opt), tpk_model_destroy(&r, &m), tpk_dp_destroy(&b);
    tpk_ctx_destroy(&r);
}

/* the handle on ctx c, trained as the reference; losses, norms, evaluation and count out */
static void train(tpk_ctx *c, tpk_trainable *t, tpk_adamw *opt, tpk_dp_buckets *b, double *loss,
                  double *norm, float *eval, size_t *params) {
    for (int s = 0; s < STEPS; s++) {
        loss[s] = norm[s] = NAN;
        CHECK_OK(c, tpk_trainable_step(c, t, opt, b, ids, tg, B, S, M, 1.0f / M, (uint64_t)(s * M),
                                       1e-2f, 1.0f, &norm[s]));
        CHECK_OK(c, tpk_trainable_loss(c, t, 1.0 / M, &loss[s]));
    }
    for (int k = 0; k < M; k++) eval[k] = NAN;
    CHECK_OK(c, tpk_trainable_set_dropout(c, t, 0));
    CHECK_OK(c, tpk_trainable_losses(c, t, ids, tg, B, S, M, eval));
    *params = 0;
    CHECK_OK(c, tpk_trainable_params(c, t, params));
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-5 * (1 + fabs(b)); }

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    for (int i = 0; i < M * B * S; i++)
        ids[i] = (int32_t)(test_dropout_u(3, 1, (uint64_t)i) * V) % V,
        tg[i] = (int32_t)(test_dropout_u(3, 2, (uint64_t)i) * V) % V;
    double rl[STEPS], rn[STEPS];
    float re[M];
    size_t rp = 0;
    reference(rl, rn, re, &rp);
    tpk_model_config mc = config();

    TEST_CASE("trainable without stages: the model's bits") {
        tpk_ctx c;
        tpk_comm self = tpk_comm_self(false);
        tpk_trainable t;
        tpk_adamw opt = {0};
        tpk_dp_buckets b = {0};
        double l[STEPS], n[STEPS];
        float e[M];
        size_t np = 0;
        tpk_trainable_desc d = {false, TPK_PIPE_1F1B, M, 1, NULL, false, S};
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &self, .seed = 9}));
        CHECK_OK(&c, tpk_trainable_init(&c, &t, &mc, &d));
        CHECK(!t.piped && tpk_trainable_model(&t) == &t.m, "piped %d", (int)t.piped);
        CHECK_OK(&c, tpk_adamw_init(&c, &opt, &(tpk_adamw_desc){.weight_decay = 0.1f}));
        tpk_trainable_set_dp(&t, &b, true);
        train(&c, &t, &opt, &b, l, n, e, &np);
        for (int s = 0; s < STEPS; s++)
            CHECK(l[s] == rl[s] && n[s] == rn[s], "step %d: loss %.9g vs %.9g, norm %.9g vs %.9g",
                  s, l[s], rl[s], n[s], rn[s]);
        for (int k = 0; k < M; k++) CHECK(e[k] == re[k], "eval %d: %.9g vs %.9g", k, e[k], re[k]);
        CHECK(np == rp, "params %zu vs %zu", np, rp);
        tpk_adamw_destroy(&c, &opt), tpk_trainable_destroy(&c, &t), tpk_dp_destroy(&b);
        tpk_ctx_destroy(&c);
    }

    tpk_comm world;
    CHECK_OK(NULL, tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world));
    tpk_pipe_kind kinds[2] = {TPK_PIPE_1F1B, TPK_PIPE_GPIPE};
    for (int q = 0; q < 2; q++)
        TEST_CASE("trainable with %d stage%s (%s): the model's losses, norms and evaluation",
                  test__size, test__size > 1 ? "s" : "", tpk_pipe_kind_name(kinds[q])) {
            tpk_ctx c;
            tpk_trainable t;
            tpk_adamw opt = {0};
            tpk_dp_buckets b = {0};
            double l[STEPS], n[STEPS];
            float e[M];
            size_t np = 0;
            tpk_trainable_desc d = {true, kinds[q], M, 1, NULL, q == 1, S};
            CHECK_OK(&c, tpk_ctx_init(
                             &c, &(tpk_ctx_desc){.world = &world, .pp = test__size, .seed = 9}));
            CHECK_OK(&c, tpk_trainable_init(&c, &t, &mc, &d));
            CHECK(t.piped && tpk_trainable_model(&t) == &t.pm.copy[0], "piped %d", (int)t.piped);
            CHECK_OK(&c, tpk_adamw_init(&c, &opt, &(tpk_adamw_desc){.weight_decay = 0.1f}));
            tpk_trainable_set_dp(&t, &b, true);
            train(&c, &t, &opt, &b, l, n, e, &np);
            for (int s = 0; s < STEPS; s++)
                CHECK(near(l[s], rl[s]) && near(n[s], rn[s]),
                      "step %d: loss %.9g vs %.9g, norm %.9g vs %.9g", s, l[s], rl[s], n[s], rn[s]);
            for (int k = 0; k < M; k++)
                CHECK(near(e[k], re[k]), "eval %d: %.9g vs %.9g", k, e[k], re[k]);
            CHECK(np == rp, "params %zu vs %zu", np, rp);
            CHECK(q == 0 || t.busy > 0, "the compute time adds up: %g", t.busy);
            if (q == 0) { /* a save, read back without stages on one rank */
                char dir[64];
                snprintf(dir, sizeof dir, "build/tests/trainable_np%d", test__size);
                if (test__rank == 0) (void)system("mkdir -p build/tests");
                MPI_Barrier(MPI_COMM_WORLD);
                CHECK_OK(&c, tpk_trainable_save(&c, &t, &opt, dir, STEPS, 9));
                MPI_Barrier(MPI_COMM_WORLD);
                tpk_ctx r;
                tpk_comm self = tpk_comm_self(false);
                tpk_trainable u;
                tpk_trainable_desc d1 = {false, TPK_PIPE_1F1B, 1, 1, NULL, false, S};
                float f[M];
                CHECK_OK(&r, tpk_ctx_init(&r, &(tpk_ctx_desc){.world = &self, .seed = 1}));
                CHECK_OK(&r, tpk_trainable_init(&r, &u, &mc, &d1));
                CHECK_OK(&r, tpk_trainable_load(&r, &u, NULL, dir));
                for (int k = 0; k < M; k++) f[k] = NAN;
                CHECK_OK(&r, tpk_trainable_losses(&r, &u, ids, tg, B, S, M, f));
                for (int k = 0; k < M; k++)
                    CHECK(near(f[k], e[k]), "loaded eval %d: %.9g vs %.9g", k, f[k], e[k]);
                tpk_trainable_destroy(&r, &u), tpk_ctx_destroy(&r);
                MPI_Barrier(MPI_COMM_WORLD);
                if (test__rank == 0) CHECK_OK(&c, tpk_hf_remove(&c, dir));
            }
            tpk_adamw_destroy(&c, &opt), tpk_trainable_destroy(&c, &t), tpk_dp_destroy(&b);
            tpk_ctx_destroy(&c);
        }

    TEST_CASE("trainable: bad descriptions refused by name") {
        tpk_ctx c;
        tpk_comm self = tpk_comm_self(false);
        tpk_trainable t;
        tpk_trainable_desc d = {true, TPK_PIPE_1F1B, 0, 1, NULL, false, S};
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &self, .seed = 9}));
        CHECK(tpk_trainable_init(&c, &t, NULL, &d) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&c), "cfg: NULL"),
              "%s", tpk_last_error(&c));
        CHECK(tpk_trainable_init(&c, &t, &mc, &d) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&c), "d->micro, d->vstages: expected >= 1, got 0, 1"),
              "%s", tpk_last_error(&c));
        double x = 0;
        CHECK(tpk_trainable_loss(&c, NULL, 1, &x) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&c), "t: NULL"),
              "%s", tpk_last_error(&c));
        tpk_ctx_destroy(&c);
    }
    tpk_comm_destroy(&world);
    return test_finish();
}
