/* tests/test_pipeline_lm.c — GPT-2 and Llama under pipeline parallelism (tpk/train/pipe_model.h)
 * (and a custom model: GPT-J's one-norm parallel block, grouped-query attention, an untied head;
 * and Mixtral, its aux loss pooled over every stage's layers through the messages' sides, with the
 * routers' z-loss and dropout 0.1, with and without SP; also at PP 2 x EP 2 at 4 ranks, each DP
 * rank its own tokens, against EP 2 without stages: within 1e-6, found to the bit)
 * against the same model without a pipeline on the same TP group: for every mesh TP x PP of the
 * ranks (DP 1), every schedule (GPipe, 1F1B, interleaved with 2 chunks a stage where it applies),
 * with and without sequence parallelism, dropout (GPT-2) and each recompute mode, the losses of the
 * M micro-batches and every gradient after the step equal the reference's: to the bit, except the
 * tied embedding's (its two copies' gradients are summed in another order: within 1e-6). And the
 * messages: the schedule's count, each this TP rank's hidden states (1/t of them under SP); and an
 * evaluation through the stages (forwards alone) gives the reference's losses on every stage. Bad
 * splits are refused. Run at 1..4 ranks. Under context parallelism (CP 2 x PP 2 at 4 ranks, in make
 * test-long: TPK_TESTS long or all), each CP rank's pipeline carries its rows: the same checks
 * against the model without stages on the same CP group (losses and gradients to the bit, the
 * tied embedding's within 1e-6; GPT-2 with dropout; Mixtral), every schedule, the messages B S / c
 * rows. */
#include <tpk/train/pipe_model.h>

#include "test.h"

enum { V = 97, P = 16, H = 24, B = 2, S = 8, M = 4, MAXL = 8 };

/* The test's GPT-2 (dropout 0.1), Llama (A = 4, G = 2, F = 40) or Mixtral (E = 4, k = 2, F = 16,
 * aux coefficient 0.05, the routers' z-loss 0.01, dropout 0.1) of MAXL blocks. */
static tpk_model_config small_model(tpk_arch arch, bool sp, tpk_recompute rc) {
    tpk_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.arch = arch;
    if (arch == TPK_ARCH_MIXTRAL)
        mc.mixtral = (tpk_mixtral_config){.vocab = V, .positions = P, .layers = MAXL, .hidden = H,
                                          .heads = 4, .kv_heads = 2, .ffn = 16, .experts = 4,
                                          .top_k = 2, .aux_coef = 0.05f, .z_coef = 0.01f,
                                          .dropout = 0.1f, .sequence_parallel = sp,
                                          .recompute = rc};
    else if (arch == TPK_ARCH_GPT2)
        mc.gpt2 = (tpk_gpt2_config){.vocab = V, .positions = P, .layers = MAXL, .hidden = H,
                                    .heads = 4, .dropout = 0.1f, .sequence_parallel = sp,
                                    .recompute = rc};
    else
        mc.llama = (tpk_llama_config){.vocab = V, .positions = P, .layers = MAXL, .hidden = H,
                                      .heads = 4, .kv_heads = 2, .ffn = 40,
                                      .sequence_parallel = sp, .recompute = rc};
    return mc;
}

static int32_t ids[M * B * S], tg[M * B * S];
static int32_t cids[M * B * S], ctg[M * B * S]; /* this CP rank's rows of each micro-batch */

/* the reference: the whole model on this rank's TP x CP group (with EP, its TP x DP group: EP ep
 * over the DP ranks, each its own tokens), micro-batch after micro-batch (under CP its rows of
 * each, cids and ctg, made here) */
static void reference(tpk_comm *tpw, int tp, int cp, int ep, const tpk_model_config *mc,
                      tpk_ctx *r, tpk_model *m, float *loss) {
    CHECK_OK(r, tpk_ctx_init(r, &(tpk_ctx_desc){.world = tpw, .tp = tp, .cp = cp, .ep = ep,
                                                .seed = 5}));
    int64_t T = tpk_cp_rows(r, B, S);
    int32_t di[M * B * S], dt[M * B * S]; /* DP rank q's tokens: shifted by 5 q */
    for (int i = 0; i < M * B * S; i++)
        di[i] = (ids[i] + 5 * r->dp.rank) % V, dt[i] = (tg[i] + 5 * r->dp.rank) % V;
    for (int k = 0; k < M; k++) {
        CHECK_OK(r, tpk_cp_scatter_host(r, cids + k * T, di + k * B * S, B, S, sizeof(int32_t)));
        CHECK_OK(r, tpk_cp_scatter_host(r, ctg + k * T, dt + k * B * S, B, S, sizeof(int32_t)));
    }
    CHECK_OK(r, tpk_model_init(r, m, mc));
    CHECK_OK(r, tpk_params_zero_grad(r));
    for (int k = 0; k < M; k++) {
        r->rng_step = (uint64_t)k;
        CHECK_OK(r, tpk_model_forward(r, m, cids + k * T, ctg + k * T, B, S, &loss[k]));
        CHECK_OK(r, tpk_model_backward(r, m, 1.0f / M));
    }
}

static double moe_worst; /* a mixture of experts': the largest relative difference found */

static void run(tpk_comm *world, tpk_comm *tpw, int tp, int cp, int pp, int ep,
                const tpk_model_config *mc, tpk_pipe_kind kind, int Vc, const char *what) {
    tpk_ctx c, r;
    tpk_model ref;
    float lr[M], la[M];
    reference(tpw, tp, cp, ep, mc, &r, &ref, lr);
    bool moe = mc->arch == TPK_ARCH_MIXTRAL;
    CHECK(!moe || tpk_model_lm(&ref)->aux > 0, "%s: no aux loss", what);
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = world, .tp = tp, .cp = cp, .pp = pp,
                                                  .ep = ep, .seed = 5}));
    int64_t T = tpk_cp_rows(&c, B, S);
    tpk_pipe_model pm;
    CHECK_OK(&c, tpk_pipe_model_init(&c, &pm, mc, kind, M, Vc, NULL, NULL, 0, 0));
    CHECK_OK(&c, tpk_params_zero_grad(&c));
    tpk_comm_stats_reset(&c.pp);
    CHECK_OK(&c, tpk_pipe_model_step(&c, &pm, cids, ctg, B, S, 1.0f / M, 0, la));
    int bad = 0, tied = 0;
    double worst = 0;
    for (int i = 0; i < c.params.n; i++) {
        const tpk_param *q = &c.params.list[i];
        int j = tpk_param_find(&r, q->name);
        if (j < 0 || r.params.list[j].numel != q->numel) {
            bad++;
            continue;
        }
        const float *a = (const float *)c.params.grad.p + q->offset;
        const float *b = (const float *)r.params.grad.p + r.params.list[j].offset;
        if (i == pm.wte && pp > 1) { /* the tied embedding: two copies summed */
            double d = 0, n = 0;
            for (size_t e = 0; e < q->numel; e++)
                d += ((double)a[e] - b[e]) * ((double)a[e] - b[e]), n += (double)b[e] * b[e];
            worst = sqrt(d / (n > 0 ? n : 1));
            tied++;
            continue;
        }
        if (!memcmp(a, b, sizeof(float) * q->numel)) continue;
        double d = 0, n = 0; /* a mixture of experts: within 1e-6 (else the bits) */
        for (size_t e = 0; e < q->numel; e++)
            d = fmax(d, fabs((double)a[e] - b[e])), n = fmax(n, fabs((double)b[e]));
        moe_worst = fmax(moe_worst, d / (n > 0 ? n : 1));
        bad += !moe || d > 1e-6 * n;
    }
    for (int k = 0; c.pp.rank == pp - 1 && k < M; k++) {
        double d = fabs((double)la[k] - lr[k]) / fabs((double)lr[k]);
        if (moe) moe_worst = fmax(moe_worst, d);
        bad += moe ? d > 1e-6 : la[k] != lr[k];
    }
    int sends, recvs;
    tpk_pipe_messages(&pm.sched, c.pp.rank, &sends, &recvs);
    bool sp = mc->gpt2.sequence_parallel || mc->llama.sequence_parallel ||
              mc->custom.sequence_parallel || mc->mixtral.sequence_parallel;
    uint64_t rows = (uint64_t)(sp ? tpk_tp_split(&c, T, c.tp.rank).size : T);
    CHECK(bad == 0 && worst < 1e-6,
          "%s %s tp=%d cp=%d pp=%d V=%d: %d gradients or losses differ (tied embedding: %g "
          "relative)",
          what, tpk_pipe_kind_name(kind), tp, cp, pp, Vc, bad, worst);
    /* a mixture of experts: each message with its side, the pooled aux's 2 E + 2 sums */
    uint64_t per = moe ? 2 : 1, side = moe ? 2 * 4 + 2 : 0;
    CHECK(pm.nside == (int64_t)side, "%s: a side of %lld values, expected %llu", what,
          (long long)pm.nside, (unsigned long long)side);
    CHECK(c.pp.stats.calls[TPK_COLL_SEND] == (uint64_t)sends * per &&
              c.pp.stats.elems[TPK_COLL_SEND] == (uint64_t)sends * (rows * H + side),
          "%s: %llu sends of %llu elements, expected %llu of %llu", what,
          (unsigned long long)c.pp.stats.calls[TPK_COLL_SEND],
          (unsigned long long)c.pp.stats.elems[TPK_COLL_SEND],
          (unsigned long long)(sends * per),
          (unsigned long long)((uint64_t)sends * (rows * H + side)));
    CHECK(pp == 1 || c.params.n < r.params.n || c.pp.size == 1, "stage holds the whole model");
    /* evaluation through the stages, forwards alone, dropout off: the reference's losses */
    float er[M], ea[M];
    CHECK_OK(&r, tpk_model_set_dropout(&r, &ref, 0));
    for (int k = 0; k < M; k++)
        CHECK_OK(&r, tpk_model_forward(&r, &ref, cids + k * T, ctg + k * T, B, S, &er[k]));
    CHECK_OK(&c, tpk_pipe_model_set_dropout(&c, &pm, 0));
    CHECK_OK(&c, tpk_pipe_model_eval(&c, &pm, cids, ctg, B, S, M, ea));
    int ebad = 0;
    for (int k = 0; k < M; k++) {
        double d = fabs((double)ea[k] - er[k]) / fabs((double)er[k]);
        if (moe) moe_worst = fmax(moe_worst, d);
        ebad += moe ? d > 1e-6 : ea[k] != er[k];
    }
    CHECK(!ebad, "%s %s pp=%d: evaluation %g vs %g (first micro-batch)", what,
          tpk_pipe_kind_name(kind), pp, (double)ea[0], (double)er[0]);
    tpk_pipe_model_destroy(&c, &pm);
    tpk_model_destroy(&r, &ref);
    tpk_ctx_destroy(&c);
    tpk_ctx_destroy(&r);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    int me = test__rank, np = test__size;
    const char *set = getenv("TPK_TESTS"); /* make test-long's: long or all */
    bool slow = set && strcmp(set, "quick"); /* Mixtral's recompute modes, EP's other schedules */
    tpk_comm world;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    for (int i = 0; i < M * B * S; i++)
        ids[i] = (int32_t)(tpk_rng_uniform(11, 0, (uint64_t)i) * V) % V,
        tg[i] = (int32_t)(tpk_rng_uniform(12, 0, (uint64_t)i) * V) % V;

    static const char *fam_name[4] = {
        "GPT-2 (dropout 0.1)", "Llama", "a custom model (GPT-J's parallel block, dropout 0.1)",
        "Mixtral (the aux loss pooled over the stages, a z-loss, dropout 0.1)"};
    for (int fam = 0; fam < 4; fam++)
        /* Mixtral's SP in make test at 4 ranks (TP 2 x PP 2) */
        for (int sp = 0; sp < (fam == 3 && !slow && np != 4 ? 1 : 2); sp++)
            TEST_CASE("%s (L=%d)%s: every mesh and schedule equals the run without a pipeline",
                      fam_name[fam], MAXL, sp ? " SP" : "") {
                for (int tp = 1; tp <= np; tp++) {
                    int pp = np / tp;
                    if (np % tp) continue;
                    /* this rank's TP group as a world of its own, for the reference */
                    MPI_Comm sub;
                    MPI_Comm_split(MPI_COMM_WORLD, me / tp, me % tp, &sub);
                    tpk_comm tpw;
                    CHECK_OK(NULL, tpk_comm_mpi(NULL, sub, &tpw));
                    MPI_Comm_free(&sub);
                    for (int rc = 0; rc < TPK_RECOMPUTE_COUNT; rc++)
                        for (int kind = 0; kind < TPK_PIPE_KINDS; kind++) {
                            if (kind == TPK_PIPE_INTERLEAVED && (pp < 2 || M % pp)) continue;
                            if (rc && kind != TPK_PIPE_1F1B) continue; /* recompute: one schedule */
                            if (rc && fam == 3 && !slow) continue;
                            tpk_model_config mc;
                            memset(&mc, 0, sizeof mc);
                            if (fam == 0) {
                                mc = small_model(TPK_ARCH_GPT2, sp, (tpk_recompute)rc);
                            } else if (fam == 2) { /* one RMSNorm feeding both branches */
                                mc.arch = TPK_ARCH_CUSTOM;
                                tpk_lm_config *c = &mc.custom;
                                c->vocab = V, c->positions = P, c->layers = MAXL, c->hidden = H;
                                c->block.heads = 4, c->block.dropout = 0.1f;
                                c->block.residual = TPK_RESIDUAL_PARALLEL_ONE_NORM;
                                c->block.norm_1.kind = TPK_NORM_RMSNORM;
                                c->block.attn.kind = TPK_ATTN_GQA;
                                c->block.attn.gqa.kv_heads = 2;
                                c->block.mlp.act.hidden = 40;
                                c->final_norm.kind = TPK_NORM_RMSNORM;
                                c->dropout_sites = true, c->sequence_parallel = sp;
                                c->recompute = (tpk_recompute)rc;
                            } else {
                                mc = small_model(fam == 3 ? TPK_ARCH_MIXTRAL : TPK_ARCH_LLAMA, sp,
                                                 (tpk_recompute)rc);
                            }
                            char what[64];
                            snprintf(what, sizeof what, "%s recompute %s",
                                     fam == 3   ? "mixtral"
                                     : fam == 2 ? "custom"
                                     : fam      ? "llama"
                                                : "gpt2",
                                     tpk_recompute_name((tpk_recompute)rc));
                            run(&world, &tpw, tp, 1, pp, 1, &mc, (tpk_pipe_kind)kind,
                                kind == TPK_PIPE_INTERLEAVED ? 2 : 1, what);
                        }
                    tpk_comm_destroy(&tpw);
                }
            }

    if (np == 4)
        TEST_CASE("Mixtral at PP 2 x EP 2 (DP 2, each DP rank its own tokens): %s equals EP 2 "
                  "without stages within 1e-6 (losses, every gradient)",
                  slow ? "every schedule" : "the interleaved schedule") {
            MPI_Comm sub; /* this stage's DP group (world rank dp + 2 pp) as a world of its own */
            MPI_Comm_split(MPI_COMM_WORLD, me / 2, me % 2, &sub);
            tpk_comm dpw;
            CHECK_OK(NULL, tpk_comm_mpi(NULL, sub, &dpw));
            MPI_Comm_free(&sub);
            for (int kind = 0; kind < TPK_PIPE_KINDS; kind++) {
                if (kind != TPK_PIPE_INTERLEAVED && !slow) continue; /* (make test: one) */
                tpk_model_config mc = small_model(TPK_ARCH_MIXTRAL, false, TPK_RECOMPUTE_NONE);
                run(&world, &dpw, 1, 1, 2, 2, &mc, (tpk_pipe_kind)kind,
                    kind == TPK_PIPE_INTERLEAVED ? 2 : 1, "mixtral EP 2");
            }
            tpk_comm_destroy(&dpw);
        }
    if (me == 0) printf("mixtral: largest relative difference %.3g\n", moe_worst);

    if (np == 4 && slow)
        TEST_CASE("CP 2 x PP 2: each CP rank's pipeline equals the model without stages on its CP "
                  "group (GPT-2 tied, dropout 0.1; Llama GQA; Mixtral, its aux pooled over CP and "
                  "the stages; every schedule)") {
            MPI_Comm sub; /* this rank's CP group (world rank cp + 2 pp) as a world of its own */
            MPI_Comm_split(MPI_COMM_WORLD, me / 2, me % 2, &sub);
            tpk_comm cpw;
            CHECK_OK(NULL, tpk_comm_mpi(NULL, sub, &cpw));
            MPI_Comm_free(&sub);
            for (int fam = 0; fam < 3; fam++)
                for (int kind = 0; kind < TPK_PIPE_KINDS; kind++)
                    for (int rc = 0; rc < 2; rc++) {
                        if (rc && (fam == 0 || kind != TPK_PIPE_1F1B)) continue; /* full: 1F1B */
                        tpk_model_config mc;
                        memset(&mc, 0, sizeof mc);
                        tpk_recompute rm = rc ? TPK_RECOMPUTE_FULL : TPK_RECOMPUTE_NONE;
                        static const tpk_arch arch[3] = {TPK_ARCH_GPT2, TPK_ARCH_LLAMA,
                                                         TPK_ARCH_MIXTRAL};
                        mc = small_model(arch[fam], false, rm);
                        char what[64];
                        snprintf(what, sizeof what, "%s recompute %s",
                                 fam == 2 ? "mixtral" : fam ? "llama" : "gpt2",
                                 tpk_recompute_name(rm));
                        run(&world, &cpw, 1, 2, 2, 1, &mc, (tpk_pipe_kind)kind,
                            kind == TPK_PIPE_INTERLEAVED ? 2 : 1, what);
                    }
            tpk_comm_destroy(&cpw);
        }

    TEST_CASE("bad splits: more stages than blocks, a list with a zero or the wrong sum") {
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .pp = np}));
        tpk_model_config mc;
        memset(&mc, 0, sizeof mc);
        mc.arch = TPK_ARCH_GPT2;
        mc.gpt2 =
            (tpk_gpt2_config){.vocab = V, .positions = P, .layers = 2, .hidden = H, .heads = 4};
        tpk_pipe_model pm;
        if (np > 2) {
            CHECK(tpk_pipe_model_init(&c, &pm, &mc, TPK_PIPE_1F1B, M, 1, NULL, NULL, 0, 0) ==
                          TPK_ERR_ARG &&
                      strstr(tpk_last_error(&c), "for 2 blocks"),
                  "%s", tpk_last_error(&c));
        }
        mc.gpt2.layers = 8; /* a list: np entries, one of them 0, or a wrong sum */
        int64_t counts[4] = {8, 0, 0, 0};
        if (np > 1)
            CHECK(tpk_pipe_model_init(&c, &pm, &mc, TPK_PIPE_1F1B, M, 1, counts, NULL, 0, 0) ==
                          TPK_ERR_ARG &&
                      strstr(tpk_last_error(&c), "entry 1 is 0"),
                  "%s", tpk_last_error(&c));
        for (int u = 0; u < np; u++) counts[u] = u ? 1 : 9 - np + 1;
        CHECK(tpk_pipe_model_init(&c, &pm, &mc, TPK_PIPE_1F1B, M, 1, counts, NULL, 0, 0) ==
                      TPK_ERR_ARG &&
                  strstr(tpk_last_error(&c), "counts to add up to the 8 blocks"),
              "%s", tpk_last_error(&c));
        CHECK(c.params.n == 0, "a failed init left %d parameters", c.params.n);
        tpk_ctx_destroy(&c);
    }

    tpk_comm_destroy(&world);
    return test_finish();
}
