/* tests/test_plan_depth.c — the planner at any depth (tpk/plan/plan.h): a stage of more than
 * 3 k + 3 identical blocks is planned from three probes of k, k + 1 and k + 2 blocks a stage,
 * extrapolated as x(n) = x(k) + (n - k) dx (memory and time are affine in a stage's blocks). The
 * reference is the full dry run of every block (tpk_plan_desc.exact):
 *   - every configuration tpk_plan enumerates on 4 GPUs (TP 1, 2, 4 x PP 1, 2, 4 x DP, every
 *     micro-batch, recompute none / selective / full, ZeRO 0, 1 and 2, SP) for GPT-2 (tied head),
 *     Llama (untied head, grouped-query attention) and GPT-NeoX, at depths whose stages hold 16 to
 *     67 blocks (uneven pipeline splits: stages 1 .. L % P one more), costed on the H100 profile
 *     (bf16, the CUDA backend's fused ops: the overlapped TP and DP collectives) and the host's:
 *     the same configurations, each extrapolated (probe > 0), with the same peak, its four parts
 *     and the fit exactly (bytes), the same refusals, and the step time, tokens/s, MFU, bubble,
 *     compute and exposed collective time within 1e-9 relative;
 *   - context parallelism (the host profile, 4 ranks: CP 2 and 4, the ring and the all-gather,
 *     TP 2 x CP 2, CP 2 x PP 2; Llama, 19 blocks): the same figures probed as dry-run whole;
 *   - a transient past the first probes: Llama's untied head (vocabulary 128,000) reduced over
 *     DP across nodes while the blocks' backward runs, at 150 and 400 blocks (the probes deepen);
 *   - the model's parameter count (MFU's N) extrapolated equal to the whole model's;
 *   - a Qwen2-MoE with dense layers among its sparse ones (two kinds of block): every
 *     configuration (EP 1 and 2) dry-run whole, never probed, its parameters the layers' own;
 *   - a depth past the probes' reach plans in seconds: 100,000 blocks of hidden 1024 (one
 *     configuration and all 348 on 8 GPUs, 66 of them ZeRO-3), 80 blocks of Llama 2 70B's shape
 *     on 64 GPUs; the figures grow with depth as the per-block ones say (peak(2L) - peak(L) =
 *     peak(3L) - peak(2L) on one GPU);
 *   - a collective grown past INT_MAX elements by depth is refused (ZeRO-1's one reduce-scatter
 *     of a stage's whole gradient), as the real run's front end refuses it.
 * One process does the planning; at several ranks each rank plans alike (the counting backend
 * needs no peers). */
#include <time.h>

#include "test.h"

#include <tpk/plan/plan.h>

static double now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void model(tpk_model_config *m, tpk_arch arch, int64_t L, int64_t H, int64_t A, int64_t V,
                  int64_t S) {
    memset(m, 0, sizeof *m);
    m->arch = arch;
    int64_t *sh[5];
    tpk_model_config_common(m, sh, 0.0f, false, TPK_RECOMPUTE_NONE);
    *sh[0] = V, *sh[1] = S, *sh[2] = L, *sh[3] = H, *sh[4] = A;
    if (arch == TPK_ARCH_LLAMA) m->llama.kv_heads = A / 2, m->llama.ffn = 3 * H;
}

/* A Qwen2-MoE of L layers, hidden 64, 4 heads (2 key/value heads), vocabulary 500, 4 experts of
 * F 24 (top-2), F_s 40, with dense layers (F_d 48): decoder_sparse_step 2 and mlp_only_layers [3]
 * (layers 1, 5, 7, ... sparse). */
static void qwen_dense_model(tpk_model_config *m, int64_t L) {
    model(m, TPK_ARCH_QWEN2_MOE, L, 64, 4, 500, 32);
    tpk_qwen2_moe_config *q = &m->qwen2_moe;
    q->kv_heads = 2, q->experts = 4, q->top_k = 2, q->moe_ffn = 24, q->shared_ffn = 40;
    q->sparse_step = 2, q->dense_ffn = 48;
    tpk_layer_set_add(&q->mlp_only, 3);
}

static bool same_key(const tpk_plan_cfg *a, const tpk_plan_cfg *b) {
    return a->tp == b->tp && a->cp == b->cp && a->cp_comm == b->cp_comm && a->pp == b->pp &&
           a->dp == b->dp && a->micro_batch == b->micro_batch && a->recompute == b->recompute &&
           a->zero == b->zero && a->sp == b->sp && a->zero_shard == b->zero_shard && a->ep == b->ep;
}
static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)); }

/* Every configuration of d planned both ways: the same figures; returns the extrapolated ones'
 * count (configurations with probe > 0) into *probed. */
static void compare(tpk_ctx *ctx, const tpk_plan_desc *d, int *probed, int *rows) {
    tpk_plan_desc ex = *d, fast = *d;
    ex.exact = true, fast.exact = false;
    tpk_plan_cfg *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    CHECK_OK(ctx, tpk_plan(ctx, &ex, &a, &na));
    CHECK_OK(ctx, tpk_plan(ctx, &fast, &b, &nb));
    CHECK(na == nb && na > 0, "%d configurations exact, %d extrapolated", na, nb);
    *probed = 0, *rows = na;
    for (int i = 0; i < na && a && b; i++) {
        const tpk_plan_cfg *x = &a[i], *y = NULL;
        for (int j = 0; j < nb && !y; j++)
            if (same_key(x, &b[j])) y = &b[j];
        CHECK(y != NULL, "TP %d PP %d DP %d mb %d: not planned by the extrapolation", x->tp, x->pp,
              x->dp, x->micro_batch);
        if (!y) continue;
        *probed += y->probe > 0;
        CHECK(x->probe == 0, "the exact plan probed (%lld)", (long long)x->probe);
        CHECK(x->fits == y->fits && !strcmp(x->reason, y->reason),
              "TP %d PP %d DP %d mb %d %s zero %d sp %d: fits %d '%s' against %d '%s'", x->tp,
              x->pp, x->dp, x->micro_batch, tpk_recompute_name(x->recompute), x->zero, x->sp,
              x->fits, x->reason, y->fits, y->reason);
        CHECK(x->peak_bytes == y->peak_bytes && x->weights_bytes == y->weights_bytes &&
                  x->grads_bytes == y->grads_bytes && x->optim_bytes == y->optim_bytes &&
                  x->activ_bytes == y->activ_bytes,
              "TP %d PP %d DP %d mb %d %s zero %d sp %d: peak %.0f against %.0f (weights %.0f "
              "%.0f, grads %.0f %.0f, optim %.0f %.0f)",
              x->tp, x->pp, x->dp, x->micro_batch, tpk_recompute_name(x->recompute), x->zero, x->sp,
              x->peak_bytes, y->peak_bytes, x->weights_bytes, y->weights_bytes, x->grads_bytes,
              y->grads_bytes, x->optim_bytes, y->optim_bytes);
        CHECK(near(x->step_seconds, y->step_seconds) && near(x->tokens_per_s, y->tokens_per_s) &&
                  near(x->mfu, y->mfu) && near(x->bubble, y->bubble) &&
                  near(x->compute_s, y->compute_s) &&
                  fabs(x->exposed_comm_s - y->exposed_comm_s) <= 1e-9 * x->step_seconds,
              "TP %d PP %d DP %d mb %d %s zero %d sp %d: step %.12g against %.12g, bubble %.9g "
              "%.9g, compute %.12g %.12g, exposed %.12g %.12g, MFU %.9g %.9g",
              x->tp, x->pp, x->dp, x->micro_batch, tpk_recompute_name(x->recompute), x->zero, x->sp,
              x->step_seconds, y->step_seconds, x->bubble, y->bubble, x->compute_s, y->compute_s,
              x->exposed_comm_s, y->exposed_comm_s, x->mfu, y->mfu);
    }
    tpk_free(ctx, a), tpk_free(ctx, b);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    tpk_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    tpk_hw h100, cpu;
    tpk_hw_builtin("h100", &h100), tpk_hw_builtin("cpu", &cpu);
    static const tpk_arch archs[3] = {TPK_ARCH_GPT2, TPK_ARCH_LLAMA, TPK_ARCH_NEOX};
    /* L = 67: one stage 67 blocks, two 33 and 34, four 16 and 17 (past 3 k + 3 = 15 everywhere);
       the host profile at 49 (PP 4: 12 and 13 whole; PP 1 and 2 probed) */
    for (int a = 0; a < 3; a++) {
        for (int hw = 0; hw < 2; hw++) {
            int64_t L = hw ? 49 : 67;
            TEST_CASE("plan_depth_%s_%s_L%lld", tpk_arch_name(archs[a]), hw ? "cpu" : "h100",
                      (long long)L) {
                tpk_plan_desc d;
                memset(&d, 0, sizeof d);
                model(&d.model, archs[a], L, 64, 4, 500, 32);
                d.seq = 32, d.batch = 8, d.gpus = 4, d.gpus_per_node = 2;
                d.hw = hw ? &cpu : &h100, d.like = hw ? tpk_ops_host() : NULL;
                d.dtype = hw ? TPK_F32 : TPK_BF16;
                d.zero = -1, d.sp = -1, d.recompute = -1;
                int probed = 0, rows = 0;
                compare(&ctx, &d, &probed, &rows);
                CHECK(probed > rows / 2, "%d of %d configurations extrapolated", probed, rows);
                if (test__rank == 0) printf("  %d configurations, %d extrapolated\n", rows, probed);
            }
        }
    }

    /* Context parallelism: a stage's blocks under CP are as identical as without (each the same
       ring of messages on the CP group): probed as dry-run whole, every CP size of 4 ranks */
    {
        TEST_CASE("plan_depth_cp_llama_cpu_L19") {
            tpk_plan_desc d;
            memset(&d, 0, sizeof d);
            model(&d.model, TPK_ARCH_LLAMA, 19, 64, 4, 500, 32);
            d.seq = 32, d.batch = 2, d.gpus = 4, d.gpus_per_node = 4, d.hw = &cpu;
            d.like = tpk_ops_host(), d.dtype = TPK_F32, d.micro_batch = 1;
            d.zero = -1, d.sp = -1, d.recompute = -1, d.cp = -1, d.cp_comm = -1;
            int probed = 0, rows = 0;
            compare(&ctx, &d, &probed, &rows);
            CHECK(probed > rows / 2, "%d of %d configurations extrapolated", probed, rows);
            if (test__rank == 0) printf("  %d configurations, %d extrapolated\n", rows, probed);
        }
    }

    /* An untied head's large DP bucket, begun before the blocks' backward, drains under it: the
       step grows by a block's DP all-reduce a block while it drains, by the block's compute after
       (convex in the depth). Probes inside the drain would extrapolate the first slope; they are
       deepened until past it. */
    for (int li = 0; li < 2; li++) {
        int64_t L = li ? 400 : 150;
        TEST_CASE("plan_depth_drain_llama_V128000_L%lld", (long long)L) {
            tpk_plan_desc d;
            memset(&d, 0, sizeof d);
            model(&d.model, TPK_ARCH_LLAMA, L, 64, 4, 128000, 64);
            d.seq = 64, d.batch = 4, d.gpus = 2, d.gpus_per_node = 1, d.hw = &h100;
            d.dtype = TPK_BF16, d.tp = 1, d.zero = -1, d.sp = -1, d.recompute = -1;
            int probed = 0, rows = 0;
            compare(&ctx, &d, &probed, &rows);
            CHECK(probed >= rows / 2 && rows > 0, "%d of %d configurations extrapolated", probed,
                  rows);
            if (test__rank == 0) /* the rest: a drain longer than a third of a stage */
                printf("  %d configurations, %d extrapolated\n", rows, probed);
        }
    }

    /* A Qwen2-MoE with dense layers among its sparse ones (decoder_sparse_step 2, mlp_only_layers
       [3]): two kinds of block, in the order of the layers' indices, so no stage is probed (a
       probe's blocks would be other kinds than the stage's); every stage dry-run whole, each dense
       layer's MLP counted where it stands, the parameters the model's own */
    {
        TEST_CASE("plan_depth_qwen2_moe_dense_cpu_L20") {
            tpk_plan_desc d;
            memset(&d, 0, sizeof d);
            qwen_dense_model(&d.model, 20);
            d.seq = 16, d.batch = 4, d.gpus = 2, d.gpus_per_node = 2, d.hw = &cpu;
            d.like = tpk_ops_host(), d.dtype = TPK_F32, d.micro_batch = 2;
            d.zero = -1, d.sp = -1, d.recompute = -1, d.ep = -1;
            int probed = 0, rows = 0;
            compare(&ctx, &d, &probed, &rows);
            CHECK(probed == 0 && rows > 0, "%d of %d configurations extrapolated", probed, rows);
            if (test__rank == 0) printf("  %d configurations, none extrapolated\n", rows);
        }
    }

    TEST_CASE("plan_depth_params") {
        for (int a = 0; a < 4; a++) {
            tpk_plan_desc d;
            memset(&d, 0, sizeof d);
            if (a < 3) model(&d.model, archs[a], 37, 64, 4, 500, 32);
            else qwen_dense_model(&d.model, 37); /* (built whole: the same) */
            double whole = 0, fast = 0;
            d.exact = true;
            CHECK_OK(&ctx, tpk_plan_model_params(&ctx, &d, &whole));
            d.exact = false;
            CHECK_OK(&ctx, tpk_plan_model_params(&ctx, &d, &fast));
            CHECK(whole == fast && whole > 0, "%s: %.0f parameters whole, %.0f extrapolated",
                  tpk_arch_name(a < 3 ? archs[a] : TPK_ARCH_QWEN2_MOE), whole, fast);
            if (a == 3) { /* the count of the layers as they are: 20 dense, 17 sparse */
                const tpk_qwen2_moe_config *q = &d.model.qwen2_moe;
                double H = 64, V = 500, E = 4, KV = 2 * 16;                /* G D */
                double attn = 2 * H * H + 2 * KV * H + H + 2 * KV + 2 * H; /* + biases, norms */
                double sparse = attn + E * H + E * 3 * H * 24 + 3 * H * 40 + H, dense = attn;
                dense += 3 * H * 48;
                double want = 2 * V * H + H + 17 * sparse + 20 * dense;
                (void)q;
                CHECK(tpk_qwen2_moe_dense_layers(q) == 20 && whole == want,
                      "Qwen2-MoE with dense layers: %.0f parameters, expected %.0f (%lld dense)",
                      whole, want, (long long)tpk_qwen2_moe_dense_layers(q));
            }
        }
    }

    TEST_CASE("plan_depth_seconds") {
        tpk_plan_desc d;
        memset(&d, 0, sizeof d);
        model(&d.model, TPK_ARCH_GPT2, 100000, 1024, 16, 50257, 1024);
        d.seq = 1024, d.batch = 8, d.gpus = 8, d.gpus_per_node = 8, d.hw = &h100;
        d.dtype = TPK_BF16, d.zero = -1, d.sp = -1, d.recompute = -1;
        tpk_plan_desc one = d;
        one.tp = 2, one.pp = 2, one.micro_batch = 1, one.zero = 0, one.sp = 1; /* DP 2 */
        one.recompute = TPK_RECOMPUTE_FULL;
        tpk_plan_cfg *v = NULL;
        int n = 0;
        double t0 = now();
        CHECK_OK(&ctx, tpk_plan(&ctx, &one, &v, &n));
        double t1 = now(), t_one = t1 - t0;
        CHECK(n == 1 && v && v[0].probe > 0 && v[0].peak_bytes > 1e12 && v[0].step_seconds > 0,
              "one configuration of 100,000 blocks: %d rows, probe %lld, peak %.3g", n,
              n ? (long long)v[0].probe : 0LL, n ? v[0].peak_bytes : 0.0);
        CHECK(t1 - t0 < 10, "one configuration of 100,000 blocks planned in %.2f s", t1 - t0);
        tpk_free(&ctx, v), v = NULL;
        t0 = now();
        CHECK_OK(&ctx, tpk_plan(&ctx, &d, &v, &n));
        t1 = now();
        int z3 = 0, z3pp = 0, z3_ok = 1; /* ZeRO-3's: at DP > 1, with stages too */
        for (int i = 0; i < n; i++)
            if (v[i].zero == 3) z3++, z3pp += v[i].pp > 1, z3_ok = z3_ok && v[i].dp * v[i].cp > 1;
        CHECK(n - z3 == 282 && z3pp > 0 && z3 > z3pp && z3_ok,
              "%d configurations, %d of them ZeRO-3, %d with stages (expected 282 besides, some "
              "with stages and some without, all at DP > 1)",
              n, z3, z3pp);
        CHECK(t1 - t0 < 120, "%d configurations of 100,000 blocks planned in %.2f s", n, t1 - t0);
        if (test__rank == 0)
            printf("  100,000 blocks of hidden 1024: one configuration %.3f s, all %d %.2f s\n",
                   t_one, n, t1 - t0);
        tpk_free(&ctx, v), v = NULL;
        /* Llama 2 70B's shape on 64 GPUs, one configuration (TP 8 x PP 8: 10 blocks a stage) */
        model(&d.model, TPK_ARCH_LLAMA, 80, 8192, 64, 32000, 4096);
        d.model.llama.kv_heads = 8, d.model.llama.ffn = 28672;
        d.seq = 4096, d.batch = 64, d.gpus = 64, d.tp = 8, d.pp = 8, d.micro_batch = 1;
        d.zero = 0, d.sp = 1, d.recompute = TPK_RECOMPUTE_SELECTIVE; /* DP 1 */
        t0 = now();
        CHECK_OK(&ctx, tpk_plan(&ctx, &d, &v, &n));
        t1 = now();
        CHECK(n == 1 && v && v[0].peak_bytes > 0, "Llama 2 70B: %d rows", n);
        if (test__rank == 0 && n == 1 && v)
            printf("  Llama 2 70B, 64 GPUs, TP 8 x PP 8: %.2f GB a rank, %.3f s a step, planned in "
                   "%.2f s\n",
                   v[0].peak_bytes / 1e9, v[0].step_seconds, t1 - t0);
        CHECK(t1 - t0 < 10, "Llama 2 70B on 64 GPUs planned in %.2f s", t1 - t0);
        tpk_free(&ctx, v), v = NULL;
    }

    TEST_CASE("plan_depth_affine_growth") { /* one GPU: the peak's per-block step is constant */
        double pk[3] = {0};
        for (int i = 0; i < 3; i++) {
            tpk_plan_desc d;
            memset(&d, 0, sizeof d);
            model(&d.model, TPK_ARCH_LLAMA, 1000 * (i + 1), 128, 4, 500, 64);
            d.seq = 64, d.batch = 2, d.gpus = 1, d.gpus_per_node = 1, d.hw = &h100;
            d.dtype = TPK_BF16, d.micro_batch = 2, d.zero = -1, d.sp = -1;
            d.recompute = TPK_RECOMPUTE_NONE;
            tpk_plan_cfg *v = NULL;
            int n = 0;
            CHECK_OK(&ctx, tpk_plan(&ctx, &d, &v, &n));
            CHECK(n == 1 && v && v[0].probe > 0, "%d rows", n);
            if (n == 1 && v) pk[i] = v[0].peak_bytes;
            tpk_free(&ctx, v);
        }
        CHECK(pk[1] - pk[0] == pk[2] - pk[1] && pk[1] > pk[0], "peaks %.0f %.0f %.0f", pk[0], pk[1],
              pk[2]);
    }

    TEST_CASE("plan_depth_collective_past_int_max") {
        /* ZeRO-1 reduce-scatters a stage's whole gradient in one call: 50 blocks of hidden 2048
           (50 M parameters each) pass 2^31 - 1 elements; 30 do not */
        for (int i = 0; i < 2; i++) {
            tpk_plan_desc d;
            memset(&d, 0, sizeof d);
            model(&d.model, TPK_ARCH_GPT2, i ? 50 : 30, 2048, 16, 500, 64);
            d.seq = 64, d.batch = 2, d.gpus = 2, d.gpus_per_node = 2, d.hw = NULL;
            d.dtype = TPK_BF16, d.tp = 1, d.pp = 1, d.micro_batch = 1, d.zero = 1, d.sp = 0;
            d.recompute = TPK_RECOMPUTE_NONE;
            tpk_plan_cfg *v = NULL, *w = NULL;
            int n = 0, m = 0;
            CHECK_OK(&ctx, tpk_plan(&ctx, &d, &v, &n));
            d.exact = true;
            CHECK_OK(&ctx, tpk_plan(&ctx, &d, &w, &m));
            CHECK(n == 1 && m == 1 && v && w, "%d and %d rows", n, m);
            if (n == 1 && m == 1 && v && w) {
                CHECK(v[0].probe > 0, "not extrapolated");
                CHECK(v[0].fits == !i && w[0].fits == !i, "L %d: fits %d (exact %d)", i ? 50 : 30,
                      v[0].fits, w[0].fits);
                if (i)
                    CHECK(strstr(v[0].reason, "expected at most 2147483647 per call") &&
                              strstr(w[0].reason, "expected at most 2147483647 per call"),
                          "reasons '%s' and '%s'", v[0].reason, w[0].reason);
            }
            tpk_free(&ctx, v), tpk_free(&ctx, w);
        }
    }
    return test_finish();
}
