/* tests/test_sample.c — tpk/models/sample.h's controls (tpk_sample_opts: temperature, top_k,
 * top_p) and generation from a prompt, at t = ranks, against references computed here from the
 * gathered full logits (ranks by counting, not by a sort):
 *   given logits with ties, split S(-1) over the ranks, a padded vocabulary: temperature 0 gives
 *   the argmax (ties: the lowest id), top_k = 1 one of the tied largest (HF's top-k keeps every
 *   logit equal to the k-th); 200 draws of each combination of controls
 *   equal the reference's token, stay in the top k and in the nucleus; filters off (and top_k at
 *   or above the vocabulary) give exactly the draw of softmax(z / temperature) without filters;
 *   bad controls refused naming the field;
 *   a GPT-2 (V = 61, uneven at every t > 1) with random weights: 200 draws from its logits in the
 *   top k / the nucleus and equal to the reference; tpk_model_generate from a prompt longer than
 *   one token, past the positions (the sliding window), equals drawing each token after the
 *   prompt step by step from a forward of the window; the same tokens on every rank; greedy
 *   generation equals the argmax step by step; tpk_model_sample and tpk_lm_sample equal a
 *   1-token prompt without filters; bad prompts refused naming the position and the
 *   vocabulary. */
#include "test.h"

#include <tpk/train/model.h>

static int me, np;
static tpk_comm world;

/* The reference draw from z[0..n) under (T, k, p) with uniform u; kept[j] (may be NULL) = whether
 * token j survives the filters. rank[j] = how many tokens come before j (a larger logit, or the
 * same with a lower id); sums in the same order as the kit's (the nucleus in rank order, the draw
 * in id order), so the token is the same bit for bit. */
static int ref_draw(const float *z, int n, float T, int k, float p, double u, bool *kept) {
    int *rank = malloc(sizeof(int) * n), *order = malloc(sizeof(int) * n), tok = -1;
    bool *keep = malloc(sizeof(bool) * n);
    double *e = malloc(sizeof(double) * n), mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        rank[j] = 0;
        for (int i = 0; i < n; i++) rank[j] += z[i] > z[j] || (z[i] == z[j] && i < j);
        order[rank[j]] = j;
    }
    if (T == 0) {
        for (int j = 0; j < n; j++) keep[j] = rank[j] == 0;
        tok = order[0];
    } else {
        int K = k > 0 && k < n ? k : n;
        float kth = z[order[K - 1]]; /* top_k: every logit at least the k-th largest (HF's) */
        int ties = 0;
        for (int j = 0; j < n; j++) ties += rank[j] >= K && z[j] == kth;
        K += ties;
        for (int j = 0; j < n; j++) keep[j] = rank[j] < K, mx = fmax(mx, z[j] / T);
        for (int j = 0; j < n; j++) e[j] = exp(z[j] / T - mx);
        if (p < 1) {
            double s = 0, c = 0;
            for (int r = 0; r < K; r++) s += e[order[r]];
            int r = 0;
            for (; r < K && (r == 0 || c < p); r++) c += e[order[r]] / s;
            for (; r < K; r++) keep[order[r]] = false;
        }
        double s = 0, c = 0;
        for (int j = 0; j < n; j++)
            if (keep[j]) s += e[j], tok = j;
        for (int j = 0; j < n; j++)
            if (keep[j] && (c += e[j] / s) > u) {
                tok = j;
                break;
            }
    }
    if (kept) memcpy(kept, keep, sizeof(bool) * n);
    free(rank), free(order), free(keep), free(e);
    return tok;
}
static double u_of(uint64_t seed, uint64_t i) {
    return tpk_rng_uniform(seed, tpk_rng_stream("sample"), i);
}
static tpk_sample_opts opts(float T, int k, float p) {
    tpk_sample_opts o;
    o.temperature = T, o.top_k = k, o.top_p = p;
    return o;
}
/* the model's logits of the last forward (rows x Vp, S(-1)), gathered whole into z */
static void gather_logits(tpk_ctx *ctx, tpk_tensor *l, float *z) {
    tpk_tensor g = tpk_tensor_2d(z, TPK_F32, l->gshape[0], l->gshape[1], TPK_R);
    CHECK_OK(ctx, tpk_convert(ctx, l, TPK_R, &g));
}
/* the same tokens on every rank */
static bool same_on_all(const int32_t *t, int n) {
    int *lo = malloc(sizeof(int) * n), *hi = malloc(sizeof(int) * n);
    MPI_Allreduce(t, lo, n, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(t, hi, n, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    bool same = !memcmp(lo, hi, sizeof(int) * n);
    free(lo), free(hi);
    return same;
}

/* the combinations of controls the draws are checked under */
static const float CT[] = {1.0f, 0.7f, 1.3f, 1.0f, 0.8f, 1.0f, 2.0f, 0.5f};
static const int CK[] = {0, 1, 3, 0, 0, 5, 4, 100};
static const float CP[] = {1.0f, 1.0f, 1.0f, 0.5f, 0.9f, 0.8f, 0.3f, 0.95f};
enum { NC = 8, DRAWS = 200 };

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;

    TEST_CASE("given logits over %d ranks: greedy, top-k, top-p and no filter against the "
              "reference; bad controls",
              np) {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        enum { T = 2, V = 29, N = 24 }; /* columns >= N: a padded vocabulary's, never drawn */
        float z[T * V], loc[T * V];
        test_randn(z, T * V, 11, 2.0f);
        /* ties: the largest logit three times in row 1 (ids 4, 9, 17), a tie inside the top 5 */
        z[V + 4] = z[V + 9] = z[V + 17] = 6.0f, z[V + 2] = z[V + 20] = 4.5f;
        for (int j = N; j < V; j++) z[V + j] = 50.0f;
        tpk_tensor g = tpk_tensor_2d(z, TPK_F32, T, V, TPK_R),
                   l = tpk_tensor_shard_2d(loc, TPK_F32, T, V, TPK_S(-1), np, me);
        CHECK_OK(&ctx, tpk_convert(&ctx, &g, TPK_S(-1), &l));
        int32_t tok = -1;
        tpk_sample_opts o = opts(0.0f, 0, 1.0f);
        CHECK_OK(&ctx, tpk_sample_logits_opts(&ctx, l, N, 1, &o, 5, 0, &tok));
        CHECK(tok == 4, "temperature 0: %d, expected 4 (the lowest of the tied largest)", tok);
        CHECK_OK(&ctx, tpk_sample_logits(&ctx, l, N, 1, 0.0f, 5, 0, &tok));
        CHECK(tok == 4, "tpk_sample_logits at temperature 0: %d, expected 4", tok);
        int bad = 0, outside = 0, drawn = 0;
        bool kept[V];
        for (int row = 0; row < T; row++)
            for (int c = 0; c < NC; c++)
                for (uint64_t i = 0; i < 50; i++) {
                    o = opts(CT[c], CK[c], CP[c]);
                    CHECK_OK(&ctx, tpk_sample_logits_opts(&ctx, l, N, row, &o, 5, i, &tok));
                    int want = ref_draw(z + row * V, N, CT[c], CK[c], CP[c], u_of(5, i), kept);
                    bad += tok != want;
                    outside += tok < 0 || tok >= N || !kept[tok];
                    drawn++;
                    if (CK[c] == 1 && row == 1) bad += tok != 4 && tok != 9 && tok != 17;
                }
        CHECK(bad == 0, "%d of %d draws differ from the reference", bad, drawn);
        CHECK(outside == 0, "%d of %d draws outside the top k / the nucleus", outside, drawn);
        /* no filter, and top_k at or above the vocabulary: the plain draw, bit for bit; NULL opts
         * = temperature 1 */
        int plain = 0;
        for (uint64_t i = 0; i < 50; i++) {
            int32_t a = -1, b = -1, c = -1, d = -1;
            o = opts(0.7f, 0, 1.0f);
            CHECK_OK(&ctx, tpk_sample_logits_opts(&ctx, l, N, 1, &o, 9, i, &a));
            o = opts(0.7f, N, 1.0f);
            CHECK_OK(&ctx, tpk_sample_logits_opts(&ctx, l, N, 1, &o, 9, i, &b));
            CHECK_OK(&ctx, tpk_sample_logits(&ctx, l, N, 1, 0.7f, 9, i, &c));
            CHECK_OK(&ctx, tpk_sample_logits_opts(&ctx, l, 0, 0, NULL, 9, i, &d));
            int w = test_plain_draw(z + V, N, 0.7f, u_of(9, i));
            plain += a != w || b != w || c != w || d != test_plain_draw(z, V, 1.0f, u_of(9, i));
        }
        CHECK(plain == 0, "%d of 50 unfiltered draws differ from the plain draw", plain);
        /* the nucleus' edge: two tokens of probability 1/2 exactly (the rest exp(-1000) = 0):
         * top_p = 0.5 keeps the first alone (the mass before the second is not below 0.5), a
         * little more keeps both */
        float z2[8] = {-1000, 0, -1000, 0, -1000, -1000, -1000, -1000}, loc2[8];
        tpk_tensor g2 = tpk_tensor_2d(z2, TPK_F32, 1, 8, TPK_R),
                   l2 = tpk_tensor_shard_2d(loc2, TPK_F32, 1, 8, TPK_S(-1), np, me);
        CHECK_OK(&ctx, tpk_convert(&ctx, &g2, TPK_S(-1), &l2));
        int seen[2][8] = {{0}};
        for (int h = 0; h < 2; h++)
            for (uint64_t i = 0; i < 50; i++) {
                o = opts(1.0f, 0, h ? 0.5001f : 0.5f);
                CHECK_OK(&ctx, tpk_sample_logits_opts(&ctx, l2, 0, 0, &o, 3, i, &tok));
                if (tok >= 0 && tok < 8) seen[h][tok]++;
            }
        CHECK(seen[0][1] == 50, "top_p = 0.5: token 1 drawn %d of 50 times", seen[0][1]);
        CHECK(seen[1][1] + seen[1][3] == 50 && seen[1][1] > 5 && seen[1][3] > 5,
              "top_p = 0.5001: tokens 1 and 3 drawn %d and %d of 50 times", seen[1][1], seen[1][3]);
        o = opts(-1.0f, 0, 1.0f);
        CHECK_FAILS(&ctx, tpk_sample_logits_opts(&ctx, l, N, 0, &o, 5, 0, &tok), TPK_ERR_ARG,
                    "opts->temperature: expected a finite value >= 0 (0: greedy), got -1");
        o = opts(NAN, 0, 1.0f);
        CHECK_FAILS(&ctx, tpk_sample_logits_opts(&ctx, l, N, 0, &o, 5, 0, &tok), TPK_ERR_ARG,
                    "opts->temperature: expected a finite value >= 0");
        o = opts(1.0f, -2, 1.0f);
        CHECK_FAILS(&ctx, tpk_sample_logits_opts(&ctx, l, N, 0, &o, 5, 0, &tok), TPK_ERR_ARG,
                    "tpk_sample_logits_opts: opts->top_k: expected >= 0 (0: off), got -2");
        o = opts(1.0f, 0, 0.0f);
        CHECK_FAILS(&ctx, tpk_sample_logits_opts(&ctx, l, N, 0, &o, 5, 0, &tok), TPK_ERR_ARG,
                    "opts->top_p: expected 0 < top_p <= 1 (1: off), got 0");
        o = opts(1.0f, 0, 1.5f);
        CHECK_FAILS(&ctx, tpk_sample_logits_opts(&ctx, l, N, 0, &o, 5, 0, &tok), TPK_ERR_ARG,
                    "opts->top_p: expected 0 < top_p <= 1 (1: off), got 1.5");
        CHECK_FAILS(
            &ctx, tpk_sample_logits(&ctx, l, N, 0, INFINITY, 5, 0, &tok), TPK_ERR_ARG,
            "tpk_sample_logits: temperature: expected a finite value >= 0 (0: greedy), got inf");
        tpk_ctx_destroy(&ctx);
    }

    TEST_CASE("a GPT-2 at t = %d: draws from its logits, generation from a prompt against the "
              "reference step by step, greedy, the old entry points, bad prompts",
              np) {
        tpk_ctx ctx;
        tpk_model mm;
        tpk_model_config mc;
        memset(&mc, 0, sizeof mc);
        mc.arch = TPK_ARCH_GPT2;
        mc.gpt2.vocab = 61, mc.gpt2.positions = 12, mc.gpt2.layers = 2, mc.gpt2.hidden = 16;
        mc.gpt2.heads = 4;
        enum { V = 61, P = 12, NP = 5, NG = 10 }; /* NP + NG > P: the window slides */
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 3}));
        CHECK_OK(&ctx, tpk_model_init(&ctx, &mm, &mc));
        test_set_weights(&ctx, 17, 0.5f);
        int64_t Vp = mm.gpt2.lm.embed.Vp;
        float *z = malloc(sizeof(float) * (size_t)(P * Vp));
        const int32_t prompt[NP] = {7, 60, 0, 33, 7};
        /* 200 draws from the prompt's last logits under each combination */
        CHECK_OK(&ctx, tpk_model_forward(&ctx, &mm, prompt, NULL, 1, NP, NULL));
        gather_logits(&ctx, &mm.gpt2.lm.logits, z);
        const float *last = z + (NP - 1) * Vp;
        int bad = 0, outside = 0, drawn = 0, greedy = -1;
        bool kept[V];
        ref_draw(last, V, 0.0f, 0, 1.0f, 0, kept);
        for (int j = 0; j < V; j++)
            if (kept[j]) greedy = j;
        for (int c = 0; c < NC; c++) {
            tpk_sample_opts o = opts(CT[c], CK[c], CP[c]);
            int32_t toks[DRAWS];
            int hits[V] = {0};
            for (int i = 0; i < DRAWS; i++) {
                CHECK_OK(&ctx, tpk_sample_logits_opts(&ctx, mm.gpt2.lm.logits, V, NP - 1, &o, 21,
                                                      (uint64_t)i, &toks[i]));
                int want = ref_draw(last, V, CT[c], CK[c], CP[c], u_of(21, (uint64_t)i), kept);
                bad += toks[i] != want;
                outside += toks[i] < 0 || toks[i] >= V || !kept[toks[i]];
                if (toks[i] >= 0 && toks[i] < V) hits[toks[i]]++;
                drawn++;
            }
            CHECK(same_on_all(toks, DRAWS), "controls %d: the ranks drew different tokens", c);
            if (CK[c] == 1)
                CHECK(hits[greedy] == DRAWS, "top_k = 1: the argmax %d drawn %d of %d times",
                      greedy, hits[greedy], DRAWS);
            /* the kept tokens' frequencies near their renormalised probabilities (5 sigma) */
            double e[V], s = 0, mx = -INFINITY, worst = 0;
            for (int j = 0; j < V; j++) mx = fmax(mx, last[j] / CT[c]);
            for (int j = 0; j < V; j++) s += kept[j] ? (e[j] = exp(last[j] / CT[c] - mx)) : 0;
            for (int j = 0; j < V; j++) {
                double q = kept[j] ? e[j] / s : 0, sd = sqrt((q * (1 - q) + 1.0 / DRAWS) / DRAWS);
                worst = fmax(worst, fabs(hits[j] / (double)DRAWS - q) / sd);
            }
            CHECK(worst < 5, "controls %d: a frequency %.1f sigma from its probability", c, worst);
        }
        CHECK(bad == 0, "%d of %d draws differ from the reference", bad, drawn);
        CHECK(outside == 0, "%d of %d draws outside the top k / the nucleus", outside, drawn);

        /* generation from the prompt against the reference, step by step through the window */
        int32_t ref[NP + NG];
        for (int c = 0; c < NC + 1; c++) {
            float T = c < NC ? CT[c] : 0.0f;
            int k = c < NC ? CK[c] : 0;
            float p = c < NC ? CP[c] : 1.0f;
            tpk_sample_opts o = opts(T, k, p);
            int32_t out[NP + NG], via[NP + NG];
            for (int j = 0; j < NP + NG; j++) out[j] = via[j] = -1;
            CHECK_OK(&ctx, tpk_model_generate(&ctx, &mm, prompt, NP, NG, &o, 40 + c, out));
            CHECK_OK(&ctx, tpk_lm_generate(&ctx, &mm.gpt2.lm, prompt, NP, NG, &o, 40 + c, via));
            CHECK(!memcmp(out, via, sizeof out), "controls %d: tpk_lm_generate differs", c);
            CHECK(!memcmp(out, prompt, sizeof prompt),
                  "controls %d: out does not start with the "
                  "prompt",
                  c);
            CHECK(same_on_all(out, NP + NG), "controls %d: the ranks generated different tokens",
                  c);
            memcpy(ref, prompt, sizeof prompt);
            int differ = 0;
            for (int i = 0; i < NG; i++) {
                int len = NP + i, S = len < P ? len : P;
                CHECK_OK(&ctx, tpk_model_forward(&ctx, &mm, ref + len - S, NULL, 1, S, NULL));
                gather_logits(&ctx, &mm.gpt2.lm.logits, z);
                ref[len] = ref_draw(z + (S - 1) * Vp, V, T, k, p, u_of(40 + c, i), NULL);
                differ += ref[len] != out[len];
                if (ref[len] != out[len]) ref[len] = out[len]; /* continue from the kit's */
            }
            CHECK(differ == 0, "controls %d%s: %d of %d generated tokens differ from the reference",
                  c, c == NC ? " (greedy)" : "", differ, NG);
        }

        /* the old entry points: a 1-token prompt without filters; temperature 0 is greedy */
        int32_t a[NG + 1], b[NG + 1], d[NG + 1], e[NG + 1];
        tpk_sample_opts o = opts(0.8f, 0, 1.0f);
        CHECK_OK(&ctx, tpk_model_sample(&ctx, &mm, 3, NG, 0.8f, 21, a));
        CHECK_OK(&ctx, tpk_lm_sample(&ctx, &mm.gpt2.lm, 3, NG, 0.8f, 21, b));
        CHECK_OK(&ctx, tpk_model_generate(&ctx, &mm, &a[0], 1, NG, &o, 21, d));
        CHECK(!memcmp(a, b, sizeof a) && !memcmp(a, d, sizeof a),
              "tpk_model_sample, tpk_lm_sample and a 1-token prompt differ");
        o = opts(0.0f, 0, 1.0f);
        CHECK_OK(&ctx, tpk_model_sample(&ctx, &mm, 3, NG, 0.0f, 21, a));
        CHECK_OK(&ctx, tpk_model_generate(&ctx, &mm, &a[0], 1, NG, &o, 99, e));
        CHECK(!memcmp(a, e, sizeof a), "greedy: tpk_model_sample and tpk_model_generate differ");
        /* out may be the prompt */
        int32_t inplace[NP + 3], copy[NP + 3];
        memcpy(inplace, prompt, sizeof prompt);
        o = opts(1.0f, 4, 0.9f);
        CHECK_OK(&ctx, tpk_model_generate(&ctx, &mm, prompt, NP, 3, &o, 8, copy));
        CHECK_OK(&ctx, tpk_model_generate(&ctx, &mm, inplace, NP, 3, &o, 8, inplace));
        CHECK(!memcmp(inplace, copy, sizeof copy), "generating in place differs");

        /* bad prompts and controls */
        int32_t bp[3] = {4, 5, 61}, out[8];
        CHECK_FAILS(&ctx, tpk_model_generate(&ctx, &mm, bp, 3, 2, NULL, 1, out), TPK_ERR_ARG,
                    "prompt[2]: expected a token id in 0..60 (the vocabulary of 61), got 61");
        bp[2] = 0, bp[1] = -1;
        CHECK_FAILS(&ctx, tpk_model_generate(&ctx, &mm, bp, 3, 2, NULL, 1, out), TPK_ERR_ARG,
                    "prompt[1]: expected a token id in 0..60 (the vocabulary of 61), got -1");
        CHECK_FAILS(&ctx, tpk_model_generate(&ctx, &mm, bp, 0, 2, NULL, 1, out), TPK_ERR_ARG,
                    "n_prompt: expected >= 1 token, got 0");
        CHECK_FAILS(&ctx, tpk_model_generate(&ctx, &mm, NULL, 1, 2, NULL, 1, out), TPK_ERR_ARG,
                    "prompt: NULL");
        CHECK_FAILS(&ctx, tpk_model_generate(&ctx, &mm, prompt, 1, -1, NULL, 1, out), TPK_ERR_ARG,
                    "n: expected 0..");
        CHECK_FAILS(&ctx, tpk_model_generate(&ctx, &mm, prompt, 1, 2, NULL, 1, NULL), TPK_ERR_ARG,
                    "out: NULL");
        o = opts(1.0f, 0, -0.5f);
        CHECK_FAILS(&ctx, tpk_model_generate(&ctx, &mm, prompt, 1, 2, &o, 1, out), TPK_ERR_ARG,
                    "tpk_lm_generate: opts->top_p: expected 0 < top_p <= 1 (1: off), got -0.5");
        CHECK_FAILS(&ctx, tpk_model_sample(&ctx, &mm, 61, 2, 1.0f, 1, out), TPK_ERR_ARG,
                    "start: expected a token id in 0..60, got 61");
        CHECK_FAILS(&ctx, tpk_model_sample(&ctx, &mm, 1, 2, -1.0f, 1, out), TPK_ERR_ARG,
                    "temperature: expected a finite value >= 0 (0: greedy), got -1");
        free(z);
        tpk_model_destroy(&ctx, &mm), tpk_ctx_destroy(&ctx);
    }
    return test_finish();
}
