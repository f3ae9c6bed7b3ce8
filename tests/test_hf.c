/* tests/test_hf.c — tpk/hf.h and tpk/sample.h at t = ranks:
 *   a GPT-2 (V = 61, uneven at every t > 1) with random weights and AdamW moments after one step,
 *   saved at t = ranks (collective, rank 0 writes), then loaded into a fresh model at t = ranks
 *   and into an unsharded one on every rank: every parameter, both moments and the step equal;
 *   config.json read back; a truncated config.json, one with a syntax error, a missing key and
 *   an implausible value refused naming the file (and the byte); an optimizer file of another
 *   step refused;
 *   sampling: the tokens drawn at t = ranks are the same on every rank and equal the unsharded
 *   model's; one draw from given logits equals a double-precision computation here;
 *   a Llama (A = 6 query heads, G = 2 key/value heads, untied head) saved at t = ranks and loaded
 *   at t = ranks, unsharded, and from Hugging Face shards (model-0000K-of-00002.safetensors and
 *   model.safetensors.index.json): every parameter, both moments and the step equal; its sampling
 *   the same on every rank and unsharded; unknown model_type, unsupported Llama config values,
 *   a mis-shaped tensor and bad index files refused naming the fault;
 *   the config.json fuzz corpus replayed through the fuzz target's checks. */
#include "test.h"

#include <sys/stat.h>

#include <tpk/model.h>
#define TPK_FUZZ_NO_MAIN
#include "fuzz/fuzz_config.c"

static int me, np;
static tpk_comm world;

static tpk_gpt2_config config(void) {
    tpk_gpt2_config c;
    memset(&c, 0, sizeof c);
    c.vocab = 61, c.positions = 12, c.layers = 2, c.hidden = 16, c.heads = 4;
    return c;
}
static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}
/* every parameter and both moments gathered: out[3 * i + k] */
/* the token drawn from logits z[0..n) at temperature temp with uniform u, in double */
static int ref_draw(const float *z, int n, float temp, double u) { /* z / temp in f32, as tpk_sample_logits */
    double mx = -INFINITY, s = 0, c = 0;
    for (int j = 0; j < n; j++) mx = fmax(mx, z[j] / temp);
    for (int j = 0; j < n; j++) s += exp(z[j] / temp - mx);
    for (int j = 0; j < n; j++)
        if ((c += exp(z[j] / temp - mx) / s) > u) return j;
    return n - 1;
}
/* One training step of model m (either architecture) on fixed tokens, then every parameter
 * and both moments gathered into out[3 i + k]. */
static void one_step(tpk_ctx *ctx, tpk_model *m, tpk_adamw *o) {
    int32_t ids[12], tg[12];
    for (int i = 0; i < 12; i++) ids[i] = (5 * i + 1) % 61, tg[i] = (7 * i + 3) % 61;
    float loss;
    test_set_weights(ctx, 8, 0.3f);
    CHECK_OK(ctx, tpk_params_zero_grad(ctx));
    CHECK_OK(ctx, tpk_model_forward(ctx, m, ids, tg, 2, 6, &loss));
    CHECK_OK(ctx, tpk_model_backward(ctx, m, 1.0f));
    CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
    CHECK_OK(ctx, tpk_adamw_step(ctx, o, 1e-3f, 1.0f));
}
static void gather_all(tpk_ctx *ctx, const tpk_adamw *o, float **out) {
    for (int i = 0; i < ctx->params.n; i++) {
        size_t gn = tpk_param_global_numel(ctx, i);
        const float *flat[3] = {(const float *)ctx->params.data.p, o->m, o->v};
        for (int k = 0; k < 3; k++) {
            out[3 * i + k] = malloc(gn * 4);
            test_poison(out[3 * i + k], gn);
            CHECK_OK(ctx, tpk_param_gather(ctx, i, flat[k], out[3 * i + k]));
        }
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    char dir[256], path[512];
    snprintf(dir, sizeof dir, "build/tests/hf_np%d", np);
    tpk_gpt2_config cfg = config();
    int nparams = 0;
    float *before[3 * 64] = {0};

    TEST_CASE("save at t = %d, load at t = %d and unsharded: parameters, moments and step equal", np, np) {
        tpk_ctx ctx;
        tpk_gpt2 m;
        tpk_adamw o;
        tpk_model mm;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 4}));
        CHECK_OK(&ctx, tpk_model_init(&ctx, &mm, &(tpk_model_config){.arch = TPK_ARCH_GPT2, .gpt2 = cfg}));
        CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
        one_step(&ctx, &mm, &o);
        nparams = ctx.params.n;
        gather_all(&ctx, &o, before);
        CHECK_OK(&ctx, tpk_gpt2_save(&ctx, &mm.gpt2, &o, dir, &(tpk_gpt2_save_desc){o.step, 4}));
        tpk_adamw_destroy(&ctx, &o), tpk_model_destroy(&ctx, &mm), tpk_ctx_destroy(&ctx);
        for (int pass = 0; pass < 2; pass++) { /* at t = np, then unsharded on this rank */
            tpk_gpt2_config rc = config();
            rc.layers = 1, rc.hidden = 8; /* overwritten from config.json */
            CHECK_OK(&ctx, tpk_gpt2_config_read(&ctx, dir, &rc));
            CHECK(rc.layers == 2 && rc.hidden == 16 && rc.heads == 4 && rc.vocab == 61 && rc.positions == 12 && fabsf(rc.ln_eps - 1e-5f) < 1e-12f, "config.json read back");
            CHECK_OK(&ctx, tpk_ctx_init(&ctx, pass ? &(tpk_ctx_desc){.seed = 99} : &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 99}));
            CHECK_OK(&ctx, tpk_gpt2_init(&ctx, &m, &rc));
            CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
            CHECK_OK(&ctx, tpk_gpt2_load(&ctx, &m, &o, dir));
            CHECK(o.step == 1, "step %lld", (long long)o.step);
            float *after[3 * 64];
            gather_all(&ctx, &o, after);
            int bad = 0;
            for (int i = 0; i < 3 * nparams; i++) {
                bad += memcmp(before[i], after[i], tpk_param_global_numel(&ctx, i / 3) * 4) != 0;
                free(after[i]);
            }
            CHECK(bad == 0, "%d of %d tensors differ after loading %s", bad, 3 * nparams, pass ? "unsharded" : "at t = ranks");
            tpk_adamw_destroy(&ctx, &o), tpk_gpt2_destroy(&ctx, &m), tpk_ctx_destroy(&ctx);
        }
    }

    TEST_CASE("sampling at t = %d: the same tokens on every rank, equal to the unsharded model's", np) {
        int32_t tok[2][9];
        for (int pass = 0; pass < 2; pass++) {
            tpk_ctx ctx;
            tpk_gpt2 m;
            CHECK_OK(&ctx, tpk_ctx_init(&ctx, pass ? &(tpk_ctx_desc){.seed = 1} : &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 1}));
            CHECK_OK(&ctx, tpk_gpt2_init(&ctx, &m, &cfg));
            CHECK_OK(&ctx, tpk_gpt2_load(&ctx, &m, NULL, dir));
            for (int i = 0; i < 9; i++) tok[pass][i] = -1;
            CHECK_OK(&ctx, tpk_gpt2_sample(&ctx, &m, 3, 8, 0.8f, 21, tok[pass]));
            CHECK_FAILS(&ctx, tpk_gpt2_sample(&ctx, &m, 61, 2, 1.0f, 21, tok[pass]), TPK_ERR_ARG, "start: expected a token id in 0..60, got 61");
            tpk_gpt2_destroy(&ctx, &m), tpk_ctx_destroy(&ctx);
        }
        int lo[9], hi[9];
        MPI_Allreduce(tok[0], lo, 9, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(tok[0], hi, 9, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        CHECK(!memcmp(lo, hi, sizeof lo), "ranks drew different tokens");
        CHECK(!memcmp(tok[0], tok[1], sizeof tok[0]), "t = %d drew %d %d %d ..., the unsharded model %d %d %d ...", np, tok[0][1], tok[0][2], tok[0][3], tok[1][1],
              tok[1][2], tok[1][3]);
        for (int i = 1; i < 9; i++) CHECK(tok[0][i] >= 0 && tok[0][i] < 61, "token %d = %d", i, tok[0][i]);
    }

    TEST_CASE("one draw from given logits (S(-1) over %d ranks) equals a double computation", np) {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        enum { T = 3, V = 29 };
        float z[T * V], loc[T * V];
        test_randn(z, T * V, 6, 2.0f);
        tpk_tensor g = tpk_tensor_2d(z, TPK_F32, T, V, TPK_R), l = tpk_tensor_shard_2d(loc, TPK_F32, T, V, TPK_S(-1), np, me);
        CHECK_OK(&ctx, tpk_convert(&ctx, &g, TPK_S(-1), &l));
        /* all 29 columns, then a padded vocabulary: columns >= 20 padding, never drawn however large */
        for (int pad = 0; pad < 2; pad++) {
            int n = pad ? 20 : V;
            if (pad) {
                for (int j = 20; j < V; j++) z[V + j] = 50.0f;
                CHECK_OK(&ctx, tpk_convert(&ctx, &g, TPK_S(-1), &l));
            }
            for (uint64_t i = 0; i < 20; i++) {
                int32_t got = -1;
                CHECK_OK(&ctx, tpk_sample_logits(&ctx, l, pad ? n : 0, 1, 0.7f, 5, i, &got));
                int want = ref_draw(z + V, n, 0.7f, tpk_rng_uniform(5, tpk_rng_stream("sample"), i));
                CHECK(got == want, "%sdraw %llu: %d, expected %d", pad ? "padded " : "", (unsigned long long)i, got, want);
            }
        }
        int32_t t;
        CHECK_FAILS(&ctx, tpk_sample_logits(&ctx, l, V + 1, 0, 1.0f, 5, 0, &t), TPK_ERR_ARG, "vocab: expected 0..29 (the logits' columns), got 30");
        CHECK_FAILS(&ctx, tpk_sample_logits(&ctx, l, 0, 3, 1.0f, 5, 0, &t), TPK_ERR_ARG, "row: expected 0..2, got 3");
        CHECK_FAILS(&ctx, tpk_sample_logits(&ctx, l, 0, 0, 0.0f, 5, 0, &t), TPK_ERR_ARG, "temperature: expected > 0");
        CHECK_FAILS(&ctx, tpk_sample_logits(&ctx, g, 0, 0, 1.0f, 5, 0, &t), TPK_ERR_LAYOUT, "logits: expected layout S(-1), got R");
        tpk_ctx_destroy(&ctx);
    }

    TEST_CASE("config.json: truncated, bad syntax, missing key, implausible; optimizer of another step") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        char bad[300];
        snprintf(bad, sizeof bad, "build/tests/hf_bad_np%d_r%d", np, me);
        mkdir(bad, 0755);
        snprintf(path, sizeof path, "%s/config.json", bad);
        tpk_gpt2_config c = config();
        static const struct { const char *text, *needle; } bad_configs[] = { /* each a TPK_ERR_FORMAT naming the fault */
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": 12\n", "config.json: byte 78: expected ',' or '}'"},
            {"{\"n_layer\": 2, \"n_embd\": 16 \"n_head\": 4}", "byte 28: expected ',' or '}'"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61}", "missing n_positions"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 5, \"vocab_size\": 61, \"n_positions\": 12, \"x\": [1, {\"a\": null}]}", "implausible configuration"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": 12} x", "the end of the text"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": 12, \"s\": \"a\\qb\"}", "expected an escape"},
        };
        for (size_t k = 0; k < sizeof bad_configs / sizeof *bad_configs; k++) {
            write_text(path, bad_configs[k].text);
            CHECK_FAILS(&ctx, tpk_gpt2_config_read(&ctx, bad, &c), TPK_ERR_FORMAT, bad_configs[k].needle);
        }
        write_text(path, "{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": 12, \"activation_function\": \"gelu_new\", \"n_inner\": null}");
        CHECK_OK(&ctx, tpk_gpt2_config_read(&ctx, bad, &c));
        snprintf(path, sizeof path, "%s/none", bad);
        CHECK_FAILS(&ctx, tpk_gpt2_config_read(&ctx, path, &c), TPK_ERR_IO, "config.json: cannot open");
        /* the saved checkpoint's model with the optimizer file of a checkpoint at step 7 */
        tpk_gpt2 m;
        tpk_adamw o;
        char dir7[300], mix[600];
        snprintf(dir7, sizeof dir7, "%s_step7", dir), snprintf(mix, sizeof mix, "%s/mix", bad);
        CHECK_OK(&ctx, tpk_gpt2_init(&ctx, &m, &cfg));
        CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
        CHECK_OK(&ctx, tpk_gpt2_save(&ctx, &m, &o, dir7, &(tpk_gpt2_save_desc){7, 1})); /* collective */
        mkdir(mix, 0755);
        const char *from[3] = {dir, dir, dir7}, *file[3] = {"config.json", "model.safetensors", "optim.safetensors"};
        for (int k = 0; k < 3; k++) {
            char src[700], dst[700];
            snprintf(src, sizeof src, "%s/%s", from[k], file[k]), snprintf(dst, sizeof dst, "%s/%s", mix, file[k]);
            FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
            for (int ch; in && out && (ch = fgetc(in)) != EOF;) fputc(ch, out);
            if (in) fclose(in);
            if (out) fclose(out);
        }
        CHECK_FAILS(&ctx, tpk_gpt2_load(&ctx, &m, &o, mix), TPK_ERR_FORMAT, "optim.safetensors (step 7) does not belong to model.safetensors (step 1)");
        CHECK_OK(&ctx, tpk_gpt2_load(&ctx, &m, NULL, mix)); /* the model alone loads */
        tpk_gpt2_destroy(&ctx, &m), tpk_adamw_destroy(&ctx, &o);
        tpk_ctx_destroy(&ctx);
    }
    /* ---- Llama ---- */
    tpk_llama_config lc;
    memset(&lc, 0, sizeof lc);
    lc.vocab = 61, lc.positions = 12, lc.layers = 2, lc.hidden = 24, lc.heads = 6, lc.kv_heads = 2, lc.ffn = 20, lc.rope_theta = 500.0f, lc.norm_eps = 1e-5f;
    char ldir[256], sdir[256];
    snprintf(ldir, sizeof ldir, "build/tests/hf_llama_np%d", np), snprintf(sdir, sizeof sdir, "build/tests/hf_llama_sharded_np%d", np);
    float *lbefore[3 * 64] = {0};
    int lparams = 0;
    TEST_CASE("Llama (A=6, G=2, untied) saved at t = %d; loaded at t = %d, unsharded, and from Hugging Face shards with an index: parameters, moments, step equal", np, np) {
        tpk_ctx ctx;
        tpk_llama m;
        tpk_adamw o;
        tpk_model mm;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 4}));
        CHECK_OK(&ctx, tpk_model_init(&ctx, &mm, &(tpk_model_config){.arch = TPK_ARCH_LLAMA, .llama = lc}));
        CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
        one_step(&ctx, &mm, &o);
        lparams = ctx.params.n;
        gather_all(&ctx, &o, lbefore);
        CHECK_OK(&ctx, tpk_model_save(&ctx, &mm, &o, ldir, &(tpk_hf_save_desc){o.step, 4}));
        tpk_adamw_destroy(&ctx, &o), tpk_model_destroy(&ctx, &mm), tpk_ctx_destroy(&ctx);
        if (me == 0) { /* the same checkpoint as Hugging Face shards it: two files and an index, no model.safetensors */
            char p2[600];
            tpk_ctx h;
            tpk_st_file f;
            CHECK_OK(&h, tpk_ctx_init(&h, &(tpk_ctx_desc){.seed = 1}));
            snprintf(p2, sizeof p2, "%s/model.safetensors", ldir);
            CHECK_OK(&h, tpk_st_read(&h, p2, &f));
            mkdir(sdir, 0755);
            tpk_st_entry e[64];
            int n = f.n < 64 ? f.n : 64, half = n / 2;
            char idx[8192] = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
            for (int i = 0; i < n; i++) {
                e[i].name = f.tensors[i].name, e[i].dtype = f.tensors[i].dtype, e[i].ndim = f.tensors[i].ndim, e[i].shape = f.tensors[i].shape;
                e[i].data = f.data + f.tensors[i].begin;
                snprintf(idx + strlen(idx), sizeof idx - strlen(idx), "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", e[i].name, i < half ? 1 : 2);
            }
            strcat(idx, "}}\n");
            const char *meta[] = {"format", "pt", NULL};
            snprintf(p2, sizeof p2, "%s/model-00001-of-00002.safetensors", sdir);
            CHECK_OK(&h, tpk_st_write(&h, p2, e, half, meta));
            snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", sdir);
            CHECK_OK(&h, tpk_st_write(&h, p2, e + half, n - half, meta));
            snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", sdir), write_text(p2, idx);
            char src[600];
            snprintf(src, sizeof src, "%s/config.json", ldir), snprintf(p2, sizeof p2, "%s/config.json", sdir);
            FILE *in = fopen(src, "rb"), *out = fopen(p2, "wb");
            for (int ch; in && out && (ch = fgetc(in)) != EOF;) fputc(ch, out);
            if (in) fclose(in);
            if (out) fclose(out);
            tpk_st_close(&f), tpk_ctx_destroy(&h);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        for (int pass = 0; pass < 3; pass++) { /* at t = np; unsharded; the shards at t = np (weights only) */
            tpk_llama_config rc;
            memset(&rc, 0, sizeof rc);
            char type[32] = "";
            CHECK_OK(&ctx, tpk_hf_model_type(&ctx, pass == 2 ? sdir : ldir, type, sizeof type));
            CHECK(!strcmp(type, "llama"), "model_type \"%s\"", type);
            CHECK_OK(&ctx, tpk_llama_config_read(&ctx, pass == 2 ? sdir : ldir, &rc));
            CHECK(rc.layers == 2 && rc.hidden == 24 && rc.heads == 6 && rc.kv_heads == 2 && rc.ffn == 20 && rc.vocab == 61 && rc.positions == 12 &&
                      rc.rope_theta == 500.0f && rc.norm_eps == 1e-5f && !rc.tie_embeddings,
                  "config.json read back");
            CHECK_OK(&ctx, tpk_ctx_init(&ctx, pass == 1 ? &(tpk_ctx_desc){.seed = 99} : &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 99}));
            CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &rc));
            CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
            CHECK_OK(&ctx, tpk_llama_load(&ctx, &m, pass == 2 ? NULL : &o, pass == 2 ? sdir : ldir));
            float *after[3 * 64];
            gather_all(&ctx, &o, after);
            int bad = 0;
            for (int i = 0; i < 3 * lparams; i++) {
                if (pass < 2 || i % 3 == 0) bad += memcmp(lbefore[i], after[i], tpk_param_global_numel(&ctx, i / 3) * 4) != 0;
                free(after[i]);
            }
            CHECK(bad == 0, "%d tensors differ after loading %s", bad, pass == 0 ? "at t = ranks" : pass == 1 ? "unsharded" : "the shards");
            if (pass < 2) CHECK(o.step == 1, "step %lld", (long long)o.step);
            tpk_adamw_destroy(&ctx, &o), tpk_llama_destroy(&ctx, &m), tpk_ctx_destroy(&ctx);
        }
    }

    TEST_CASE("Llama sampling at t = %d: the same tokens on every rank, equal to the unsharded model's", np) {
        int32_t tok[2][9];
        for (int pass = 0; pass < 2; pass++) {
            tpk_ctx ctx;
            tpk_llama m;
            CHECK_OK(&ctx, tpk_ctx_init(&ctx, pass ? &(tpk_ctx_desc){.seed = 1} : &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 1}));
            CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &lc));
            CHECK_OK(&ctx, tpk_llama_load(&ctx, &m, NULL, ldir));
            for (int i = 0; i < 9; i++) tok[pass][i] = -1;
            CHECK_OK(&ctx, tpk_llama_sample(&ctx, &m, 3, 8, 0.8f, 21, tok[pass]));
            tpk_llama_destroy(&ctx, &m), tpk_ctx_destroy(&ctx);
        }
        int lo[9], hi[9];
        MPI_Allreduce(tok[0], lo, 9, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(tok[0], hi, 9, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        CHECK(!memcmp(lo, hi, sizeof lo) && !memcmp(tok[0], tok[1], sizeof tok[0]), "ranks or the unsharded model drew different tokens");
        for (int i = 1; i < 9; i++) CHECK(tok[0][i] >= 0 && tok[0][i] < 61, "token %d = %d", i, tok[0][i]);
    }

    TEST_CASE("Llama bad input: unknown model_type, unsupported config values, a mis-shaped or missing tensor, a bad index") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        char bad[300], type[32];
        snprintf(bad, sizeof bad, "build/tests/hf_llama_bad_np%d_r%d", np, me);
        mkdir(bad, 0755);
        snprintf(path, sizeof path, "%s/config.json", bad);
        static const struct { const char *text, *needle; tpk_status want; } cases[] = {
            {"{\"model_type\": \"mistral\"}", "model_type \"mistral\": expected \"gpt2\" or \"llama\"", TPK_ERR_UNSUPPORTED},
            {"{\"n_layer\": 2}", "model_type missing: expected", TPK_ERR_UNSUPPORTED},
            {"{\"model_type\": 7}", "model_type (not a string)", TPK_ERR_UNSUPPORTED},
        };
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            write_text(path, cases[k].text);
            CHECK_FAILS(&ctx, tpk_hf_model_type(&ctx, bad, type, sizeof type), cases[k].want, cases[k].needle);
        }
#define LLAMA_CFG(extra) "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 24, \"num_attention_heads\": 6, \"vocab_size\": 61, " \
                         "\"max_position_embeddings\": 12, \"intermediate_size\": 20" extra "}"
        static const struct { const char *text, *needle; tpk_status want; } lcases[] = {
            {LLAMA_CFG(", \"num_key_value_heads\": 4"), "num_key_value_heads 4: expected a divisor of num_attention_heads 6", TPK_ERR_FORMAT},
            {LLAMA_CFG(", \"hidden_act\": \"gelu\""), "hidden_act \"gelu\": expected \"silu\"", TPK_ERR_UNSUPPORTED},
            {LLAMA_CFG(", \"rope_scaling\": {\"type\": \"llama3\"}"), "rope_scaling: expected null", TPK_ERR_UNSUPPORTED},
            {LLAMA_CFG(", \"attention_bias\": true"), "attention_bias / mlp_bias: expected false", TPK_ERR_UNSUPPORTED},
            {LLAMA_CFG(", \"head_dim\": 8"), "head_dim 8: expected hidden_size / num_attention_heads = 4", TPK_ERR_UNSUPPORTED},
            {LLAMA_CFG(", \"tie_word_embeddings\": 1"), "expected true or false for tie_word_embeddings", TPK_ERR_FORMAT},
            {LLAMA_CFG(", \"rms_norm_eps\": -1"), "implausible configuration", TPK_ERR_FORMAT},
            {"{\"model_type\": \"llama\", \"num_hidden_layers\": 2}", "missing hidden_size", TPK_ERR_FORMAT},
            {"{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 18, \"num_attention_heads\": 6, \"vocab_size\": 61, "
             "\"max_position_embeddings\": 12, \"intermediate_size\": 20}", "expected an even head size", TPK_ERR_FORMAT},
        };
        tpk_llama_config c;
        for (size_t k = 0; k < sizeof lcases / sizeof *lcases; k++) {
            write_text(path, lcases[k].text);
            CHECK_FAILS(&ctx, tpk_llama_config_read(&ctx, bad, &c), lcases[k].want, lcases[k].needle);
        }
        write_text(path, LLAMA_CFG(", \"num_key_value_heads\": 2, \"hidden_act\": \"silu\", \"rope_scaling\": null, \"tie_word_embeddings\": true, \"head_dim\": 4"));
        CHECK_OK(&ctx, tpk_llama_config_read(&ctx, bad, &c));
        CHECK(c.kv_heads == 2 && c.tie_embeddings && c.norm_eps == 1e-6f && c.rope_theta == 10000.0f, "defaults and booleans read");
        /* the saved checkpoint into a model of another shape, and without a tensor */
        tpk_llama m;
        tpk_llama_config other = lc;
        other.kv_heads = 3;
        CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &other));
        CHECK_FAILS(&ctx, tpk_llama_load(&ctx, &m, NULL, ldir), TPK_ERR_SHAPE, "\"model.layers.0.self_attn.k_proj.weight\" has shape [8, 24], config.json implies [12, 24]");
        tpk_llama_destroy(&ctx, &m), tpk_ctx_destroy(&ctx); /* a model's parameters stay in its context: a fresh one per model */
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        other = lc, other.tie_embeddings = true; /* no lm_head: loads (the file's extra tensor unused) */
        CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &other));
        CHECK_OK(&ctx, tpk_llama_load(&ctx, &m, NULL, ldir));
        tpk_llama_destroy(&ctx, &m), tpk_ctx_destroy(&ctx);
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &lc));
        char idx[700];
        snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", bad);
        static const struct { const char *text, *needle; } icases[] = {
            {"{\"weight_map\": {\"model.norm.weight\": \"../model-00001-of-00002.safetensors\"}}", "expected a file name ending in .safetensors in the same directory"},
            {"{\"weight_map\": {\"model.norm.weight\": \"x.bin\"}}", "expected a file name ending in .safetensors"},
            {"{\"weight_map\": [1]}", "expected an object \"weight_map\""},
            {"{\"weight_map\": {\"model.norm.weight\": 3}}", "weight_map: file: expected a string"},
            {"{\"weight_map\": {}}", "no tensor \"model.embed_tokens.weight\""},
            {"{\"weight_map\": {\"model.embed_tokens.weight\"", "byte"},
        };
        for (size_t k = 0; k < sizeof icases / sizeof *icases; k++) {
            write_text(idx, icases[k].text);
            CHECK_FAILS(&ctx, tpk_llama_load(&ctx, &m, NULL, bad), TPK_ERR_FORMAT, icases[k].needle);
        }
        write_text(idx, "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00001.safetensors\"}}");
        CHECK_FAILS(&ctx, tpk_llama_load(&ctx, &m, NULL, bad), TPK_ERR_IO, "model-00001-of-00001.safetensors");
        tpk_llama_destroy(&ctx, &m);
        tpk_ctx_destroy(&ctx);
    }
    for (int i = 0; i < 3 * lparams; i++) free(lbefore[i]);

    TEST_CASE("config.json fuzz corpus replay (tests/fuzz/corpus_config)") test_replay_corpus("tests/fuzz/corpus_config", fuzz_config_one, "valid", 7);
    for (int i = 0; i < 3 * nparams; i++) free(before[i]);
    tpk_comm_destroy(&world);
    return test_finish();
}
