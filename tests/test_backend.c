/* tests/test_backend.c — a trainer's backend and mesh (tpk/train/backend.h), its --plan
 * (tpk/train/plan_apply.h) and what it prints around the loop (tpk/train/report.h): on the host,
 * the world communicator of every rank and a context of TP x DP x PP as asked; the dtype of --dtype
 * and its defaults; the node's ranks; the planner's first choice (tpk_plan's, called directly)
 * applied to the flags, its line printed, the mesh flags it chooses itself refused by name; the
 * banner and the summary of a model without stages against lines written out. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <tpk/train/backend.h>
#include <tpk/train/plan_apply.h>
#include <tpk/train/report.h>

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    int np = test__size;

    TEST_CASE("backend: the host, the world, the mesh and the dtype") {
        tpk_ctx c;
        memset(&c, 0, sizeof c);
        tpk_run_backend b;
        CHECK_OK(&c, tpk_run_backend_init(&c, &b, NULL, 30));
        CHECK(b.ops == tpk_ops_host() && !b.gpu && b.dtype == TPK_F32 && b.world.size == np &&
                  b.world.rank == test__rank,
              "gpu %d size %d", (int)b.gpu, b.world.size);
        int tp = np % 2 == 0 ? 2 : 1;
        CHECK_OK(&c, tpk_run_ctx_init(&c, &b, tp, 1, 1, 1, 0, NULL, 3, false));
        CHECK(c.tp.size == tp && c.dp.size == np / tp && c.pp.size == 1 && c.ops == tpk_ops_host(),
              "TP %d DP %d PP %d", c.tp.size, c.dp.size, c.pp.size);
        tpk_ctx_destroy(&c), tpk_comm_destroy(&b.world);
        CHECK(tpk_run_dtype("bf16", false) == TPK_BF16 && tpk_run_dtype("f32", true) == TPK_F32 &&
                  tpk_run_dtype(NULL, true) == TPK_BF16 && tpk_run_dtype(NULL, false) == TPK_F32,
              "dtypes");
        int n = 0, local = -1;
        tpk_run_node_size(true, &n, &local);
        CHECK(n >= 1 && n <= np && local >= 0 && local < np, "node %d, local %d", n, local);
        CHECK(!tpk_run_gpu_present(), "no GPU in a host build");
    }

    TEST_CASE("plan: the planner's first choice applied, its line printed") {
        tpk_ctx c;
        memset(&c, 0, sizeof c);
        tpk_run_opts o;
        char e[512] = "";
        const char *a[] = {"t", "--text",  "f", "--layers",  "2",  "--hidden", "32", "--heads",
                           "4", "--batch", "4", "--seq-len", "16", "--plan"};
        CHECK(tpk_run_parse(&o, 14, (char **)a, np, e, sizeof e) == 0, "%s", e);
        tpk_model_config cfg, want_cfg;
        int64_t def[4] = {256, 4, 128, 4}, S = 0;
        CHECK(tpk_run_model_config(&c, &o, def, 64, &cfg, &S, e, sizeof e) == TPK_OK, "%s", e);
        want_cfg = cfg;
        tpk_hw hw;
        tpk_hw_builtin("cpu", &hw);
        tpk_plan_desc pd;
        memset(&pd, 0, sizeof pd);
        pd.model = cfg, pd.seq = 16, pd.gpus = np, pd.gpus_per_node = np, pd.hw = &hw;
        pd.batch = 4 * np, pd.like = tpk_ops_host(), pd.dtype = TPK_F32;
        pd.zero = pd.sp = pd.recompute = -1;
        tpk_plan_cfg *pv = NULL;
        int pn = 0;
        CHECK_OK(&c, tpk_plan(&c, &pd, &pv, &pn));
        char *out = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&out, &len);
        CHECK_OK(&c, tpk_run_plan(&c, &o, &cfg, 16, np, np, false, f));
        fclose(f);
        if (pv && pn) {
            char want[80];
            snprintf(want, sizeof want, "plan: TP %d x PP %d x DP %d, micro-batch %d x %d a step",
                     pv[0].tp, pv[0].pp, pv[0].dp, pv[0].micro_batch, pv[0].accum);
            CHECK(out && !strncmp(out, want, strlen(want)) && strstr(out, "on cpu"), "%s vs %s",
                  out ? out : "", want);
            CHECK(o.tp == pv[0].tp && o.pp == pv[0].pp && o.batch == pv[0].micro_batch &&
                      o.accum == pv[0].accum && o.rc == pv[0].recompute &&
                      o.zero == pv[0].zero && o.sp == pv[0].sp && o.piped == (o.pp > 1),
                  "applied");
            CHECK(cfg.gpt2.sequence_parallel == pv[0].sp && cfg.gpt2.recompute == pv[0].recompute &&
                      cfg.gpt2.layers == want_cfg.gpt2.layers,
                  "the config's");
        }
        free(out), tpk_free(&c, pv);
        o.schedule = "gpipe";
        CHECK(tpk_run_plan(&c, &o, &cfg, 16, np, np, false, NULL) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&c), "--plan: chooses the mesh itself; leave out "
                                             "--schedule"),
              "%s", tpk_last_error(&c));
        o.schedule = NULL, o.plan_profile = "h300";
        CHECK(tpk_run_plan(&c, &o, &cfg, 16, np, np, false, NULL) == TPK_ERR_ARG, "%s",
              tpk_last_error(&c));
    }

    TEST_CASE("report: the banner and the summary of a model without stages") {
        tpk_ctx c;
        tpk_comm self = tpk_comm_self(false);
        tpk_run_opts o;
        char e[512] = "";
        const char *a[] = {"t", "--text",  "f", "--layers",  "2",  "--hidden",     "32", "--heads",
                           "4", "--batch", "4", "--seq-len", "16", "--grad-accum", "2"};
        CHECK(tpk_run_parse(&o, 15, (char **)a, 1, e, sizeof e) == 0, "%s", e);
        tpk_model_config cfg;
        int64_t def[4] = {256, 4, 128, 4}, S = 0;
        CHECK(tpk_run_model_config(&c, &o, def, 64, &cfg, &S, e, sizeof e) == TPK_OK, "%s", e);
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &self, .seed = 2}));
        tpk_trainable t;
        tpk_trainable_desc d = {false, TPK_PIPE_1F1B, 2, 1, NULL, false, S};
        CHECK_OK(&c, tpk_trainable_init(&c, &t, &cfg, &d));
        size_t n = 0;
        CHECK_OK(&c, tpk_trainable_params(&c, &t, &n));
        char *out = NULL, want[400];
        size_t len = 0;
        FILE *f = open_memstream(&out, &len);
        tpk_run_banner(f, &c, &o, &t, &cfg, (double)n, S, 4);
        fclose(f);
        snprintf(want, sizeof want,
                 "train: 1 rank = TP 1 x DP 1, host backend, f32 | GPT-2 L=2 H=32 A=4 V=256 P=16, "
                 "%.2fM parameters | B=4 S=16 accum 2\n",
                 (double)n * 1e-6);
        CHECK(out && !strcmp(out, want), "%s vs %s", out ? out : "", want);
        free(out);
        out = NULL;
        tpk_ranks r;
        tpk_ranks_init(&r, "t");
        o.steps = 5;
        f = open_memstream(&out, &len);
        tpk_mem_held held = {1.5e6, 2.25e6, 3e6, 0}; /* the split: the peak less these */
        tpk_mem_held z3 = {0.5e6, 2.25e6, 3e6, 1.25e6}; /* ZeRO-3's: gathered buffers named */
        tpk_run_summary(f, &r, &c, &o, &t, NULL, 5, 1.0); /* every rank (a collective) */
        tpk_run_summary(f, &r, &c, &o, &t, NULL, 2, 1.0);
        tpk_run_summary(f, &r, &c, &o, &t, &held, 2, 1.0);
        tpk_run_summary(f, &r, &c, &o, &t, &z3, 2, 1.0);
        fclose(f);
        if (test__rank == 0) {
            const char *w0 = "trained no steps: the model is at step 5, --steps 5 | peak memory ";
            char w2[200], w3[200];
            snprintf(w2, sizeof w2,
                     "peak memory %.2f MB (recompute none) = weights 1.50 + gradients 2.25 + "
                     "optimizer 3.00 + activations and work %.2f\n",
                     tpk_mem_peak(&c, false) / 1e6, tpk_mem_peak(&c, false) / 1e6 - 6.75);
            snprintf(w3, sizeof w3,
                     "peak memory %.2f MB (recompute none) = weights 0.50 + gathered 1.25 + "
                     "gradients 2.25 + optimizer 3.00 + activations and work %.2f\n",
                     tpk_mem_peak(&c, false) / 1e6, tpk_mem_peak(&c, false) / 1e6 - 7.00);
            CHECK(out && !strncmp(out, w0, strlen(w0)) &&
                      strstr(out, "\ntrained steps 3..5 in 1.0 s | peak memory ") &&
                      strstr(out, w2) && strstr(out, w3),
                  "%s (the split: %s; with gathered buffers: %s)", out ? out : "", w2, w3);
        }
        free(out);
        CHECK(tpk_run_flops_per_token(&t, 1000, 16) == 6000.0 + 12.0 * 2 * 32 * 16, "flops");
        tpk_trainable_destroy(&c, &t), tpk_ctx_destroy(&c);
    }
    return test_finish();
}
