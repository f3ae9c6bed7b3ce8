/* tests/test_hf.c — tpk/train/hf.h and tpk/models/sample.h at t = ranks:
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
 *   a save over a checkpoint replaces it whole (the new weights load, a README and a
 *   subdirectory carried over, nothing left beside it), and each state a stopped save leaves
 *   (DIR missing with DIR.tpk-old, both, a half-written DIR.tpk-new) loads as one whole
 *   checkpoint and is repaired by the next save; tpk_hf_remove keeps the user's files;
 *   honest loads: files of two checkpoints (ids), steps that are not whole numbers or disagree,
 *   no optimizer file (the step kept, fresh moments), a config with fewer layers than the file,
 *   unknown tensors, Hugging Face's buffers, GPT-2's lm_head.weight tied or not, NaN / inf
 *   weights and a negative second moment, each refused naming the tensor;
 *   config.json: a 100-digit number read exactly, duplicate keys (nested too) and invalid UTF-8
 *   refused;
 *   a save over a sharded Hugging Face folder: no stale index or shards, the saved weights load;
 *   the config.json fuzz corpus replayed through the fuzz target's checks. */
#include "test.h"

#include <sys/stat.h>

#include <tpk/train/model.h>
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
static void copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    for (int ch; in && out && (ch = fgetc(in)) != EOF;) fputc(ch, out);
    if (in) fclose(in);
    if (out) fclose(out);
}
static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
/* the text of a file (malloc'd, NUL-terminated; "" when unreadable) */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *b = calloc(1, 1 << 16);
    if (f && b) b[fread(b, 1, (1 << 16) - 1, f)] = 0;
    if (f) fclose(f);
    return b;
}
/* A copy of the safetensors file src at dst with metadata meta (key, value, ..., NULL), the tensor
 * `drop` left out, and `poke` (when not NULL) setting element `at` of tensor `poke_name` to it;
 * `add` / `add_from`: one more tensor named add, a copy of tensor add_from's bytes. */
static void rewrite_st(const char *src, const char *dst, const char *const *meta, const char *drop,
                       const char *poke_name, size_t at, const float *poke, const char *add,
                       const char *add_from) {
    tpk_ctx h;
    tpk_st_file f;
    if (tpk_ctx_init(&h, &(tpk_ctx_desc){.seed = 1}) != TPK_OK ||
        tpk_st_read(&h, src, &f) != TPK_OK) {
        printf("  cannot read %s\n", src);
        return;
    }
    tpk_st_entry *e = calloc((size_t)f.n + 1, sizeof *e);
    uint8_t *copy = malloc(f.data_size + 1), *extra = NULL;
    memcpy(copy, f.data, f.data_size);
    int n = 0;
    for (int i = 0; i < f.n; i++) {
        const tpk_st_tensor *t = &f.tensors[i];
        if (drop && !strcmp(t->name, drop)) continue;
        e[n].name = t->name, e[n].dtype = t->dtype, e[n].ndim = t->ndim, e[n].shape = t->shape,
        e[n].data = copy + t->begin;
        if (poke && !strcmp(t->name, poke_name)) memcpy(copy + t->begin + 4 * at, poke, 4);
        n++;
        if (add && !strcmp(t->name, add_from)) { /* its own copy of the bytes, poked when named */
            extra = malloc(t->end - t->begin);
            memcpy(extra, f.data + t->begin, t->end - t->begin);
            e[n] = e[n - 1], e[n].name = add, e[n].data = extra;
            if (poke && !strcmp(add, poke_name)) memcpy(extra + 4 * at, poke, 4);
            n++;
        }
    }
    if (tpk_st_write(&h, dst, e, n, meta) != TPK_OK)
        printf("  cannot write %s: %s\n", dst, tpk_last_error(&h));
    free(e), free(copy), free(extra), tpk_st_close(&f), tpk_ctx_destroy(&h);
}
/* Save a GPT-2 of config() with weights drawn from `seed` to dir at t = ranks with zero moments and
 * the given step (collective); its weights gathered into w[i] (free them). */
static void save_seeded(const char *dir, uint64_t seed, int64_t step, float **w) {
    tpk_ctx ctx;
    tpk_gpt2 m;
    tpk_adamw o;
    tpk_gpt2_config c = config();
    CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 4}));
    CHECK_OK(&ctx, tpk_gpt2_init(&ctx, &m, &c));
    CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
    test_set_weights(&ctx, seed, 0.3f);
    for (int i = 0; w && i < ctx.params.n; i++) {
        w[i] = malloc(tpk_param_global_numel(&ctx, i) * 4);
        CHECK_OK(&ctx, tpk_param_gather(&ctx, i, (const float *)ctx.params.data.p, w[i]));
    }
    o.step = step;
    CHECK_OK(&ctx,
             tpk_gpt2_save(&ctx, &m, &o, dir, &(tpk_gpt2_save_desc){.step = step, .seed = 1}));
    tpk_adamw_destroy(&ctx, &o), tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx);
}
/* Load dir into an unsharded GPT-2 of config `c` on this rank (with an optimizer): the status, the
 * message in err[n], the step, and how many of the parameters differ from w (-1: no w). */
static tpk_status load_cmp(const char *dir, tpk_gpt2_config c, float *const *w, int64_t *step,
                           int *differ, char *err, size_t n) {
    tpk_ctx ctx;
    tpk_gpt2 m;
    tpk_adamw o;
    tpk_ctx_init(&ctx, &(tpk_ctx_desc){.seed = 99});
    tpk_gpt2_init(&ctx, &m, &c);
    tpk_adamw_init(&ctx, &o, NULL);
    tpk_status s = tpk_gpt2_load(&ctx, &m, &o, dir);
    snprintf(err, n, "%s", tpk_last_error(&ctx));
    *step = o.step, *differ = w ? 0 : -1;
    for (int i = 0; w && s == TPK_OK && i < ctx.params.n; i++) {
        size_t gn = tpk_param_global_numel(&ctx, i);
        float *g = malloc(gn * 4);
        test_poison(g, gn);
        tpk_param_gather(&ctx, i, (const float *)ctx.params.data.p, g);
        *differ += memcmp(w[i], g, gn * 4) != 0;
        free(g);
    }
    tpk_adamw_destroy(&ctx, &o), tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx);
    return s;
}

/* every parameter and both moments gathered: out[3 * i + k] */
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

    TEST_CASE("save at t = %d, load at t = %d and unsharded: parameters, moments and step equal",
              np, np) {
        tpk_ctx ctx;
        tpk_gpt2 m;
        tpk_adamw o;
        tpk_model mm;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 4}));
        CHECK_OK(&ctx, tpk_model_init(&ctx, &mm,
                                      &(tpk_model_config){.arch = TPK_ARCH_GPT2, .gpt2 = cfg}));
        CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
        one_step(&ctx, &mm, &o);
        nparams = ctx.params.n;
        gather_all(&ctx, &o, before);
        CHECK_OK(&ctx, tpk_gpt2_save(&ctx, &mm.gpt2, &o, dir,
                                     &(tpk_gpt2_save_desc){.step = o.step, .seed = 4}));
        tpk_adamw_destroy(&ctx, &o), tpk_model_destroy(&ctx, &mm), tpk_ctx_destroy(&ctx);
        for (int pass = 0; pass < 2; pass++) { /* at t = np, then unsharded on this rank */
            tpk_gpt2_config rc = config();
            rc.layers = 1, rc.hidden = 8; /* overwritten from config.json */
            CHECK_OK(&ctx, tpk_gpt2_config_read(&ctx, dir, &rc));
            CHECK(rc.layers == 2 && rc.hidden == 16 && rc.heads == 4 && rc.vocab == 61 &&
                      rc.positions == 12 && fabsf(rc.ln_eps - 1e-5f) < 1e-12f,
                  "config.json read back");
            CHECK_OK(&ctx, tpk_ctx_init(&ctx, pass ? &(tpk_ctx_desc){.seed = 99}
                                                   : &(tpk_ctx_desc){
                                                         .world = &world, .tp = np, .seed = 99}));
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
            CHECK(bad == 0, "%d of %d tensors differ after loading %s", bad, 3 * nparams,
                  pass ? "unsharded" : "at t = ranks");
            tpk_adamw_destroy(&ctx, &o), tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx);
        }
    }

    TEST_CASE("sampling at t = %d: the same tokens on every rank, equal to the unsharded model's",
              np) {
        int32_t tok[2][9];
        for (int pass = 0; pass < 2; pass++) {
            tpk_ctx ctx;
            tpk_gpt2 m;
            CHECK_OK(&ctx, tpk_ctx_init(
                               &ctx, pass ? &(tpk_ctx_desc){.seed = 1}
                                          : &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 1}));
            CHECK_OK(&ctx, tpk_gpt2_init(&ctx, &m, &cfg));
            CHECK_OK(&ctx, tpk_gpt2_load(&ctx, &m, NULL, dir));
            for (int i = 0; i < 9; i++) tok[pass][i] = -1;
            CHECK_OK(&ctx, tpk_lm_sample(&ctx, &m.lm, 3, 8, 0.8f, 21, tok[pass]));
            CHECK_FAILS(&ctx, tpk_lm_sample(&ctx, &m.lm, 61, 2, 1.0f, 21, tok[pass]), TPK_ERR_ARG,
                        "start: expected a token id in 0..60, got 61");
            tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx);
        }
        int lo[9], hi[9];
        MPI_Allreduce(tok[0], lo, 9, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(tok[0], hi, 9, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        CHECK(!memcmp(lo, hi, sizeof lo), "ranks drew different tokens");
        CHECK(!memcmp(tok[0], tok[1], sizeof tok[0]),
              "t = %d drew %d %d %d ..., the unsharded model %d %d %d ...", np, tok[0][1],
              tok[0][2], tok[0][3], tok[1][1], tok[1][2], tok[1][3]);
        for (int i = 1; i < 9; i++)
            CHECK(tok[0][i] >= 0 && tok[0][i] < 61, "token %d = %d", i, tok[0][i]);
    }

    TEST_CASE("one draw from given logits (S(-1) over %d ranks) equals a double computation", np) {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        enum { T = 3, V = 29 };
        float z[T * V], loc[T * V];
        test_randn(z, T * V, 6, 2.0f);
        tpk_tensor g = tpk_tensor_2d(z, TPK_F32, T, V, TPK_R),
                   l = tpk_tensor_shard_2d(loc, TPK_F32, T, V, TPK_S(-1), np, me);
        CHECK_OK(&ctx, tpk_convert(&ctx, &g, TPK_S(-1), &l));
        /* all 29 columns, then a padded vocabulary: columns >= 20 padding, never drawn however
         * large */
        for (int pad = 0; pad < 2; pad++) {
            int n = pad ? 20 : V;
            if (pad) {
                for (int j = 20; j < V; j++) z[V + j] = 50.0f;
                CHECK_OK(&ctx, tpk_convert(&ctx, &g, TPK_S(-1), &l));
            }
            for (uint64_t i = 0; i < 20; i++) {
                int32_t got = -1;
                CHECK_OK(&ctx, tpk_sample_logits(&ctx, l, pad ? n : 0, 1, 0.7f, 5, i, &got));
                int want = test_plain_draw(z + V, n, 0.7f,
                                           tpk_rng_uniform(5, tpk_rng_stream("sample"), i));
                CHECK(got == want, "%sdraw %llu: %d, expected %d", pad ? "padded " : "",
                      (unsigned long long)i, got, want);
            }
        }
        int32_t t;
        CHECK_FAILS(&ctx, tpk_sample_logits(&ctx, l, V + 1, 0, 1.0f, 5, 0, &t), TPK_ERR_ARG,
                    "vocab: expected 0..29 (the logits' columns), got 30");
        CHECK_FAILS(&ctx, tpk_sample_logits(&ctx, l, 0, 3, 1.0f, 5, 0, &t), TPK_ERR_ARG,
                    "row: expected 0..2, got 3");
        CHECK_FAILS(&ctx, tpk_sample_logits(&ctx, l, 0, 0, -1.0f, 5, 0, &t), TPK_ERR_ARG,
                    "temperature: expected a finite value >= 0");
        CHECK_FAILS(&ctx, tpk_sample_logits(&ctx, g, 0, 0, 1.0f, 5, 0, &t), TPK_ERR_LAYOUT,
                    "logits: expected layout S(-1), got R");
        tpk_ctx_destroy(&ctx);
    }

    TEST_CASE(
        "config.json: truncated, bad syntax, missing key, implausible; optimizer of another step") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        char bad[300];
        snprintf(bad, sizeof bad, "build/tests/hf_bad_np%d_r%d", np, me);
        mkdir(bad, 0755);
        snprintf(path, sizeof path, "%s/config.json", bad);
        tpk_gpt2_config c = config();
        static const struct {
            const char *text, *needle;
        } bad_configs[] = {
            /* each a
                                                                                TPK_ERR_FORMAT
                                                                                naming the fault */
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
             "12\n",
             "config.json: byte 78: expected ',' or '}'"},
            {"{\"n_layer\": 2, \"n_embd\": 16 \"n_head\": 4}", "byte 28: expected ',' or '}'"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61}",
             "missing n_positions"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 5, \"vocab_size\": 61, \"n_positions\": "
             "12, \"x\": [1, {\"a\": null}]}",
             "implausible configuration"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
             "12} x",
             "the end of the text"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
             "12, \"s\": \"a\\qb\"}",
             "expected an escape"},
        };
        for (size_t k = 0; k < sizeof bad_configs / sizeof *bad_configs; k++) {
            write_text(path, bad_configs[k].text);
            CHECK_FAILS(&ctx, tpk_gpt2_config_read(&ctx, bad, &c), TPK_ERR_FORMAT,
                        bad_configs[k].needle);
        }
        write_text(
            path,
            "{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
            "12, \"activation_function\": \"gelu_new\", \"n_inner\": null}");
        CHECK_OK(&ctx, tpk_gpt2_config_read(&ctx, bad, &c));
        snprintf(path, sizeof path, "%s/none", bad);
        CHECK_FAILS(&ctx, tpk_gpt2_config_read(&ctx, path, &c), TPK_ERR_IO,
                    "config.json: cannot open");
        /* the saved checkpoint's model with the optimizer file of a checkpoint at step 7 */
        tpk_gpt2 m;
        tpk_adamw o;
        char dir7[300], mix[600];
        snprintf(dir7, sizeof dir7, "%s_step7", dir), snprintf(mix, sizeof mix, "%s/mix", bad);
        CHECK_OK(&ctx, tpk_gpt2_init(&ctx, &m, &cfg));
        CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
        CHECK_OK(&ctx, tpk_gpt2_save(&ctx, &m, &o, dir7,
                                     &(tpk_gpt2_save_desc){.step = 7, .seed = 1})); /* collective */
        mkdir(mix, 0755);
        const char *from[3] = {dir, dir, dir7},
                   *file[3] = {"config.json", "model.safetensors", "optim.safetensors"};
        for (int k = 0; k < 3; k++) {
            char src[700], dst[700];
            snprintf(src, sizeof src, "%s/%s", from[k], file[k]),
                snprintf(dst, sizeof dst, "%s/%s", mix, file[k]);
            FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
            for (int ch; in && out && (ch = fgetc(in)) != EOF;) fputc(ch, out);
            if (in) fclose(in);
            if (out) fclose(out);
        }
        CHECK_FAILS(&ctx, tpk_gpt2_load(&ctx, &m, &o, mix), TPK_ERR_FORMAT,
                    "optim.safetensors (step 7) does not belong to config.json (tpk_step 1)");
        CHECK_OK(&ctx, tpk_gpt2_load(&ctx, &m, NULL, mix)); /* the model alone loads */
        tpk_lm_destroy(&ctx, &m.lm), tpk_adamw_destroy(&ctx, &o);
        tpk_ctx_destroy(&ctx);
    }
    TEST_CASE("a save over a checkpoint replaces it whole: the new weights load, the user's files "
              "carried, nothing left beside it") {
        char d[200], f[700], err[600];
        snprintf(d, sizeof d, "build/tests/hf_swap_np%d", np);
        float *wa[64] = {0}, *wb[64] = {0};
        int differ = 0;
        int64_t step = 0;
        if (me == 0) { /* a Hugging Face folder's other files, a subdirectory, an old sharded index
                          and shard */
            snprintf(f, sizeof f, "rm -rf %s %s.tpk-old %s.tpk-new", d, d, d);
            CHECK(system(f) == 0, "%s", f);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        save_seeded(d, 11, 3, wa);
        if (me == 0) {
            snprintf(f, sizeof f, "%s/README.md", d), write_text(f, "my notes\n");
            snprintf(f, sizeof f, "%s/runs", d), mkdir(f, 0755);
            snprintf(f, sizeof f, "%s/runs/log.txt", d), write_text(f, "log\n");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        char *id_a = NULL, *id_b = NULL;
        snprintf(f, sizeof f, "%s/config.json", d), id_a = slurp(f);
        MPI_Barrier(MPI_COMM_WORLD);
        save_seeded(d, 12, 4, wb);
        snprintf(f, sizeof f, "%s/config.json", d), id_b = slurp(f);
        CHECK(strstr(id_a, "\"tpk_checkpoint_id\": \"") &&
                  strstr(id_b, "\"tpk_checkpoint_id\": \"") &&
                  strcmp(strstr(id_a, "tpk_checkpoint_id"), strstr(id_b, "tpk_checkpoint_id")),
              "config.json carries a new tpk_checkpoint_id per save");
        CHECK(load_cmp(d, config(), wb, &step, &differ, err, sizeof err) == TPK_OK && differ == 0 &&
                  step == 4,
              "the second save loads: %d differ, step %lld: %s", differ, (long long)step, err);
        CHECK(load_cmp(d, config(), wa, &step, &differ, err, sizeof err) == TPK_OK && differ > 0,
              "the first save's weights are gone");
        snprintf(f, sizeof f, "%s/README.md", d);
        char f2[700];
        snprintf(f2, sizeof f2, "%s/runs/log.txt", d);
        CHECK(exists(f) && exists(f2), "the user's README.md and runs/log.txt carried over");
        snprintf(f, sizeof f, "%s.tpk-old", d), snprintf(f2, sizeof f2, "%s.tpk-new", d);
        CHECK(!exists(f) && !exists(f2), "no .tpk-old or .tpk-new left beside the checkpoint");
        MPI_Barrier(MPI_COMM_WORLD);
        /* what a save stopped between its renames leaves: D missing, D.tpk-old the previous
         * checkpoint */
        if (me == 0) {
            snprintf(f, sizeof f, "%s.tpk-old", d);
            CHECK(rename(d, f) == 0, "rename");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        CHECK(load_cmp(d, config(), wb, &step, &differ, err, sizeof err) == TPK_OK && differ == 0 &&
                  step == 4,
              "D missing, D.tpk-old present: the previous checkpoint loads (%d differ: %s)", differ,
              err);
        tpk_ctx ictx;
        tpk_hf_info info;
        CHECK_OK(&ictx, tpk_ctx_init(&ictx, &(tpk_ctx_desc){.seed = 1}));
        CHECK_OK(&ictx, tpk_hf_info_read(&ictx, d, &info));
        CHECK(strstr(info.dir, ".tpk-old") && info.step == 4 && info.has_optim &&
                  strlen(info.id) == 16,
              "tpk_hf_info_read: %s step %lld id %s", info.dir, (long long)info.step, info.id);
        tpk_ctx_destroy(&ictx);
        MPI_Barrier(MPI_COMM_WORLD);
        /* a save after it repairs first: then D = the new save, README carried, no .tpk-old */
        float *wc[64] = {0};
        if (me == 0) { /* and a stopped save's half-written temporary directory */
            snprintf(f, sizeof f, "%s.tpk-new", d), mkdir(f, 0755);
            snprintf(f, sizeof f, "%s.tpk-new/model.safetensors.tmp.123", d), write_text(f, "half");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        save_seeded(d, 13, 5, wc);
        CHECK(load_cmp(d, config(), wc, &step, &differ, err, sizeof err) == TPK_OK && differ == 0 &&
                  step == 5,
              "after a repair the new save loads (%s)", err);
        snprintf(f, sizeof f, "%s/README.md", d), snprintf(f2, sizeof f2, "%s.tpk-old", d);
        char f3[700];
        snprintf(f3, sizeof f3, "%s.tpk-new", d);
        CHECK(exists(f) && !exists(f2) && !exists(f3),
              "README.md kept through the repair, nothing left beside D");
        MPI_Barrier(MPI_COMM_WORLD);
        /* stopped after the swap: D the new checkpoint, D.tpk-old the old one holding the user's
         * file */
        if (me == 0) {
            snprintf(f, sizeof f, "%s.tpk-old", d), mkdir(f, 0755);
            snprintf(f2, sizeof f2, "%s/README.md", d),
                snprintf(f3, sizeof f3, "%s.tpk-old/README.md", d);
            CHECK(rename(f2, f3) == 0, "rename");
            snprintf(f2, sizeof f2, "%s/config.json", d),
                snprintf(f3, sizeof f3, "%s.tpk-old/config.json", d), copy_file(f2, f3);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        CHECK(load_cmp(d, config(), wc, &step, &differ, err, sizeof err) == TPK_OK && differ == 0,
              "D and D.tpk-old: D (the newer) loads");
        MPI_Barrier(MPI_COMM_WORLD);
        save_seeded(d, 13, 5, NULL);
        snprintf(f, sizeof f, "%s/README.md", d), snprintf(f2, sizeof f2, "%s.tpk-old", d);
        CHECK(exists(f) && !exists(f2),
              "the next save carries README.md back from D.tpk-old and removes it");
        /* a save that fails (the path's parent missing) leaves nothing */
        snprintf(f, sizeof f, "%s/no/such/dir", d);
        tpk_ctx sctx;
        tpk_gpt2 sm;
        tpk_gpt2_config c = config();
        CHECK_OK(&sctx, tpk_ctx_init(&sctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        CHECK_OK(&sctx, tpk_gpt2_init(&sctx, &sm, &c));
        tpk_clear_error(&sctx);
        tpk_status ss = tpk_gpt2_save(&sctx, &sm, NULL, f, NULL);
        CHECK(ss == TPK_ERR_IO &&
                  (me != 0 || strstr(tpk_last_error(&sctx), "no/such/dir.tpk-new: cannot create")),
              "a save under a missing parent: %s", tpk_last_error(&sctx));
        snprintf(f, sizeof f, "%s/file", d);
        if (me == 0) write_text(f, "x");
        MPI_Barrier(MPI_COMM_WORLD);
        ss = tpk_gpt2_save(&sctx, &sm, NULL, f, NULL);
        CHECK(ss == TPK_ERR_IO && (me != 0 || strstr(tpk_last_error(&sctx),
                                                     "/file: exists and is not a directory")),
              "a save over a file: %s", tpk_last_error(&sctx));
        CHECK_FAILS(&sctx, tpk_gpt2_save(&sctx, &sm, NULL, "build/tests/./", NULL), TPK_ERR_ARG,
                    "not \".\"");
        CHECK_FAILS(&sctx, tpk_gpt2_save(&sctx, &sm, NULL, "/", NULL), TPK_ERR_ARG, "not \"/\"");
        tpk_lm_destroy(&sctx, &sm.lm), tpk_ctx_destroy(&sctx);
        /* tpk_hf_remove: the checkpoint's files go, the user's stay (and the directory with
         * them) */
        MPI_Barrier(MPI_COMM_WORLD);
        if (me == 0) {
            tpk_ctx rctx;
            CHECK_OK(&rctx, tpk_ctx_init(&rctx, &(tpk_ctx_desc){.seed = 1}));
            CHECK_OK(&rctx, tpk_hf_remove(&rctx, d));
            snprintf(f, sizeof f, "%s/README.md", d),
                snprintf(f2, sizeof f2, "%s/model.safetensors", d),
                snprintf(f3, sizeof f3, "%s/config.json", d);
            CHECK(exists(f) && !exists(f2) && !exists(f3),
                  "tpk_hf_remove keeps README.md, removes the checkpoint's files");
            snprintf(f, sizeof f, "%s/README.md", d), remove(f);
            snprintf(f, sizeof f, "%s/file", d), remove(f);
            snprintf(f, sizeof f, "%s/runs/log.txt", d), remove(f);
            snprintf(f, sizeof f, "%s/runs", d), rmdir(f);
            CHECK_OK(&rctx, tpk_hf_remove(&rctx, d));
            CHECK(!exists(d),
                  "tpk_hf_remove of a checkpoint with nothing else: the directory goes");
            CHECK_OK(&rctx, tpk_hf_remove(&rctx, d)); /* missing: nothing to do */
            tpk_ctx_destroy(&rctx);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < 64; i++) free(wa[i]), free(wb[i]), free(wc[i]);
        free(id_a), free(id_b);
    }

    TEST_CASE(
        "honest loads: checkpoint ids, steps, a missing optimizer file, tensors the config does "
        "not account for, non-finite values") {
        char d1[200], d2[200], b[200], f[700], g[700], err[600];
        snprintf(d1, sizeof d1, "build/tests/hf_id1_np%d", np),
            snprintf(d2, sizeof d2, "build/tests/hf_id2_np%d", np);
        snprintf(b, sizeof b, "build/tests/hf_honest_np%d_r%d", np, me);
        float *w1[64] = {0};
        int differ = 0;
        int64_t step = 0;
        save_seeded(d1, 21, 6, w1);
        save_seeded(d2, 21, 6, NULL); /* the same weights and step, another checkpoint */
        snprintf(f, sizeof f, "rm -rf %s && mkdir -p %s", b, b);
        CHECK(system(f) == 0, "%s", f);
#define B_FROM(dir, name)                                                                \
    (snprintf(f, sizeof f, "%s/%s", dir, name), snprintf(g, sizeof g, "%s/%s", b, name), \
     copy_file(f, g))
        B_FROM(d1, "config.json"), B_FROM(d1, "model.safetensors"), B_FROM(d2, "optim.safetensors");
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err, "optim.safetensors (tpk_checkpoint_id ") &&
                  strstr(err, "does not belong to config.json (tpk_checkpoint_id ") &&
                  strstr(err, "files of two checkpoints"),
              "an optimizer file of another checkpoint at the same step refused: %s", err);
        B_FROM(d2, "model.safetensors"), B_FROM(d1, "optim.safetensors");
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err, "model.safetensors (tpk_checkpoint_id "),
              "a model file of another checkpoint refused: %s", err);
        /* no optimizer file: the step from the checkpoint, fresh moments */
        B_FROM(d1, "model.safetensors");
        snprintf(g, sizeof g, "%s/optim.safetensors", b), remove(g);
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_OK && differ == 0 &&
                  step == 6,
              "no optimizer file: the weights and step 6 load (step %lld): %s", (long long)step,
              err);
        /* steps: not a whole number; model file and config.json disagreeing */
        snprintf(f, sizeof f, "%s/model.safetensors", d1),
            snprintf(g, sizeof g, "%s/model.safetensors", b);
        char id1[17] = "", cp1[300],
             *c1 = slurp((snprintf(cp1, sizeof cp1, "%s/config.json", d1), cp1)),
             *at1 = c1 ? strstr(c1, "\"tpk_checkpoint_id\": \"") : NULL;
        if (at1) snprintf(id1, sizeof id1, "%.16s", at1 + 22); /* a rewritten file keeps d1's */
        free(c1);
        CHECK(strlen(id1) == 16, "d1's config.json has a tpk_checkpoint_id");
        const char *m_half[] = {"format", "pt", "step", "6.5", NULL},
                   *m_seven[] = {"format", "pt", "step", "7", NULL},
                   *m_plain[] = {"format", "pt", "tpk_checkpoint_id", id1, NULL};
        rewrite_st(f, g, m_half, NULL, NULL, 0, NULL, NULL, NULL);
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err, "model.safetensors: step \"6.5\": expected a whole number"),
              "step metadata 6.5 refused: %s", err);
        rewrite_st(f, g, m_seven, NULL, NULL, 0, NULL, NULL, NULL);
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err,
                         "model.safetensors (step 7) does not belong to config.json (tpk_step 6)"),
              "model step 7 beside config.json's tpk_step 6 refused: %s", err);
        char *cj = slurp((snprintf(f, sizeof f, "%s/config.json", d1), f)),
             *at = strstr(cj, "\"tpk_step\": 6,");
        CHECK(at != NULL, "config.json has tpk_step 6");
        if (at) {
            char *fixed = malloc(strlen(cj) + 8);
            snprintf(fixed, strlen(cj) + 8, "%.*s\"tpk_step\": \"6\",%s", (int)(at - cj), cj,
                     at + strlen("\"tpk_step\": 6,"));
            snprintf(g, sizeof g, "%s/config.json", b), write_text(g, fixed);
            free(fixed);
        }
        free(cj);
        snprintf(f, sizeof f, "%s/model.safetensors", d1),
            snprintf(g, sizeof g, "%s/model.safetensors", b), copy_file(f, g);
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err, "tpk_step: expected a whole number"),
              "tpk_step as a string refused: %s", err);
        B_FROM(d1, "config.json");
        /* a config.json with fewer layers than the file: the file's layer 1 named */
        tpk_gpt2_config one = config();
        one.layers = 1;
        CHECK(load_cmp(b, one, NULL, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err, "tensor \"h.1.") &&
                  strstr(err, "is not a parameter of the model config.json describes"),
              "a file with 2 layers into a model of 1: %s", err);
        /* an unknown tensor; Hugging Face's buffers ignored; a tied lm_head.weight equal to wte
         * accepted, another refused */
        snprintf(f, sizeof f, "%s/model.safetensors", d1),
            snprintf(g, sizeof g, "%s/model.safetensors", b);
        rewrite_st(f, g, m_plain, NULL, NULL, 0, NULL, "h.0.mlp.extra.weight",
                   "h.0.mlp.c_fc.weight");
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err, "tensor \"h.0.mlp.extra.weight\" is not a parameter"),
              "an unknown tensor refused: %s", err);
        rewrite_st(f, g, m_plain, NULL, NULL, 0, NULL, "h.0.attn.masked_bias", "h.0.ln_1.bias");
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_OK && differ == 0,
              "Hugging Face's attn.masked_bias ignored: %s", err);
        rewrite_st(f, g, m_plain, NULL, NULL, 0, NULL, "lm_head.weight", "wte.weight");
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_OK && differ == 0,
              "lm_head.weight equal to wte.weight accepted: %s", err);
        rewrite_st(f, g, m_plain, NULL, "lm_head.weight", 5, &(float){0.5f}, "lm_head.weight",
                   "wte.weight");
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err, "\"lm_head.weight\" differs from \"wte.weight\""),
              "lm_head.weight other than wte.weight refused: %s", err);
        /* non-finite weights and moments, named with the element */
        rewrite_st(f, g, m_plain, NULL, "h.1.attn.c_proj.weight", 37, &(float){NAN}, NULL, NULL);
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err,
                         "model.safetensors: tensor \"h.1.attn.c_proj.weight\": element 37 is nan: "
                         "expected a finite value"),
              "a NaN weight refused: %s", err);
        rewrite_st(f, g, m_plain, NULL, "ln_f.bias", 3, &(float){-INFINITY}, NULL, NULL);
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err, "tensor \"ln_f.bias\": element 3 is -inf"),
              "an infinite weight refused: %s", err);
        B_FROM(d1, "model.safetensors");
        const char *o_meta[] = {"format", "tpk-adamw", "step", "6", NULL};
        snprintf(f, sizeof f, "%s/optim.safetensors", d1),
            snprintf(g, sizeof g, "%s/optim.safetensors", b);
        rewrite_st(f, g, o_meta, NULL, "wpe.weight.exp_avg_sq", 2, &(float){-1.0f}, NULL, NULL);
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err,
                         "optim.safetensors: tensor \"wpe.weight.exp_avg_sq\": element 2 is -1: "
                         "expected a finite, non-negative value"),
              "a negative second moment refused: %s", err);
        rewrite_st(f, g, o_meta, NULL, NULL, 0, NULL, "h.5.ln_1.weight.exp_avg",
                   "wpe.weight.exp_avg");
        CHECK(
            load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                strstr(err,
                       "optim.safetensors: tensor \"h.5.ln_1.weight.exp_avg\" is not a parameter"),
            "an optimizer tensor of no parameter refused: %s", err);
        rewrite_st(f, g, o_meta, NULL, NULL, 0, NULL, NULL, NULL);
        CHECK(load_cmp(b, config(), w1, &step, &differ, err, sizeof err) == TPK_ERR_FORMAT &&
                  strstr(err, "optim.safetensors has no tpk_checkpoint_id and config.json has "),
              "an optimizer file without an id beside files with one refused: %s", err);
#undef B_FROM
        for (int i = 0; i < 64; i++) free(w1[i]);
    }

    TEST_CASE("config.json strict: a long number read exactly, duplicate keys and invalid UTF-8 "
              "refused") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.seed = 1}));
        tpk_gpt2_config c = config();
        char text[400], zeros[101];
        memset(zeros, '0', 100), zeros[100] = 0;
        /* 1.000...0001e-3 with 100 zeros: 1e-3 as a float (cut at 63 characters it read as 1.0) */
        snprintf(
            text, sizeof text,
            "{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
            "12, \"layer_norm_epsilon\": 1.%s1e-3}",
            zeros);
        CHECK_OK(&ctx,
                 tpk_gpt2_config_parse(&ctx, (const uint8_t *)text, strlen(text), "long", &c));
        CHECK(c.ln_eps == 1e-3f, "layer_norm_epsilon read as %g, expected 1e-3", (double)c.ln_eps);
        static const struct {
            const char *text, *needle;
        } bad[] = {
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
             "12, \"n_layer\": 4}",
             "byte 79: the key \"n_layer\" appears twice"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
             "12, \"x\": 1, \"x\": 2}",
             "the key \"x\" appears twice"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
             "12, \"s\": \"a\xff\"}",
             "byte 86: expected valid UTF-8 in a string"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
             "12, \"s\": \"\xc3\x28\"}",
             "expected valid UTF-8 in a string"},
            {"{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
             "12, \"k\xed\xa0\x80\": 1}",
             "expected valid UTF-8 in a member name"},
        };
        for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
            CHECK_FAILS(&ctx,
                        tpk_gpt2_config_parse(&ctx, (const uint8_t *)bad[k].text,
                                              strlen(bad[k].text), "cfg", &c),
                        TPK_ERR_FORMAT, bad[k].needle);
        const char *ok_text =
            "{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
            "12, \"x\": {\"a\": 1, \"b\": {\"a\": 2}}, \"name\": \"caf\xc3\xa9 \xf0\x9f\x99\x82\"}";
        CHECK_OK(&ctx,
                 tpk_gpt2_config_parse(&ctx, (const uint8_t *)ok_text, strlen(ok_text), "ok",
                                       &c)); /* nested objects are not config.json's members */
        const char *nested_dup =
            "{\"n_layer\": 2, \"n_embd\": 16, \"n_head\": 4, \"vocab_size\": 61, \"n_positions\": "
            "12, \"x\": {\"a\": 1, \"a\": 2}}"; /* strict: every object's keys once, nested too */
        CHECK_FAILS(
            &ctx,
            tpk_gpt2_config_parse(&ctx, (const uint8_t *)nested_dup, strlen(nested_dup), "cfg", &c),
            TPK_ERR_FORMAT, "cfg: byte 93: the key \"a\" appears twice (first at byte 85)");
        tpk_ctx_destroy(&ctx);
    }

    /* ---- Llama ---- */
    tpk_llama_config lc;
    memset(&lc, 0, sizeof lc);
    lc.vocab = 61, lc.positions = 12, lc.layers = 2, lc.hidden = 24, lc.heads = 6, lc.kv_heads = 2,
    lc.ffn = 20, lc.rope_theta = 500.0f, lc.norm_eps = 1e-5f;
    char ldir[256], sdir[256];
    snprintf(ldir, sizeof ldir, "build/tests/hf_llama_np%d", np),
        snprintf(sdir, sizeof sdir, "build/tests/hf_llama_sharded_np%d", np);
    float *lbefore[3 * 64] = {0};
    int lparams = 0;
    TEST_CASE(
        "Llama (A=6, G=2, untied) saved at t = %d; loaded at t = %d, unsharded, and from Hugging "
        "Face shards with an index: parameters, moments, step equal",
        np, np) {
        tpk_ctx ctx;
        tpk_llama m;
        tpk_adamw o;
        tpk_model mm;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 4}));
        CHECK_OK(&ctx, tpk_model_init(&ctx, &mm,
                                      &(tpk_model_config){.arch = TPK_ARCH_LLAMA, .llama = lc}));
        CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
        one_step(&ctx, &mm, &o);
        lparams = ctx.params.n;
        gather_all(&ctx, &o, lbefore);
        CHECK_OK(&ctx, tpk_model_save(&ctx, &mm, &o, ldir,
                                      &(tpk_hf_save_desc){.step = o.step, .seed = 4}));
        tpk_adamw_destroy(&ctx, &o), tpk_model_destroy(&ctx, &mm), tpk_ctx_destroy(&ctx);
        if (me == 0) { /* the same checkpoint as Hugging Face shards it: two files and an index, no
                          model.safetensors */
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
                e[i].name = f.tensors[i].name, e[i].dtype = f.tensors[i].dtype,
                e[i].ndim = f.tensors[i].ndim, e[i].shape = f.tensors[i].shape;
                e[i].data = f.data + f.tensors[i].begin;
                snprintf(idx + strlen(idx), sizeof idx - strlen(idx),
                         "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "",
                         e[i].name, i < half ? 1 : 2);
            }
            strcat(idx, "}}\n");
            tpk_ckpt_info li; /* config.json is copied: the shards carry its id */
            CHECK_OK(&h, tpk_ckpt_info_read(&h, ldir, &li));
            const char *meta[] = {"format", "pt", "tpk_checkpoint_id", li.id, NULL};
            snprintf(p2, sizeof p2, "%s/model-00001-of-00002.safetensors", sdir);
            CHECK_OK(&h, tpk_st_write(&h, p2, e, half, meta));
            snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", sdir);
            CHECK_OK(&h, tpk_st_write(&h, p2, e + half, n - half, meta));
            snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", sdir), write_text(p2, idx);
            char src[600];
            snprintf(src, sizeof src, "%s/config.json", ldir),
                snprintf(p2, sizeof p2, "%s/config.json", sdir);
            FILE *in = fopen(src, "rb"), *out = fopen(p2, "wb");
            for (int ch; in && out && (ch = fgetc(in)) != EOF;) fputc(ch, out);
            if (in) fclose(in);
            if (out) fclose(out);
            tpk_st_close(&f), tpk_ctx_destroy(&h);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        for (int pass = 0; pass < 3; pass++) { /* at t = np; unsharded; the shards at t = np
                                                  (weights only) */
            tpk_llama_config rc;
            memset(&rc, 0, sizeof rc);
            char type[32] = "";
            CHECK_OK(&ctx, tpk_hf_model_type(&ctx, pass == 2 ? sdir : ldir, type, sizeof type));
            CHECK(!strcmp(type, "llama"), "model_type \"%s\"", type);
            CHECK_OK(&ctx, tpk_llama_config_read(&ctx, pass == 2 ? sdir : ldir, &rc));
            CHECK(rc.layers == 2 && rc.hidden == 24 && rc.heads == 6 && rc.kv_heads == 2 &&
                      rc.ffn == 20 && rc.vocab == 61 && rc.positions == 12 &&
                      rc.rope_theta == 500.0f && rc.norm_eps == 1e-5f && !rc.tie_embeddings,
                  "config.json read back");
            CHECK_OK(&ctx,
                     tpk_ctx_init(
                         &ctx, pass == 1 ? &(tpk_ctx_desc){.seed = 99}
                                         : &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 99}));
            CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &rc));
            CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
            CHECK_OK(&ctx,
                     tpk_llama_load(&ctx, &m, pass == 2 ? NULL : &o, pass == 2 ? sdir : ldir));
            float *after[3 * 64];
            gather_all(&ctx, &o, after);
            int bad = 0;
            for (int i = 0; i < 3 * lparams; i++) {
                if (pass < 2 || i % 3 == 0)
                    bad +=
                        memcmp(lbefore[i], after[i], tpk_param_global_numel(&ctx, i / 3) * 4) != 0;
                free(after[i]);
            }
            CHECK(bad == 0, "%d tensors differ after loading %s", bad,
                  pass == 0   ? "at t = ranks"
                  : pass == 1 ? "unsharded"
                              : "the shards");
            if (pass < 2) CHECK(o.step == 1, "step %lld", (long long)o.step);
            tpk_adamw_destroy(&ctx, &o), tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx);
        }
    }

    TEST_CASE(
        "a save over a sharded Hugging Face folder: no stale index or shards, the saved weights "
        "load, the tokenizer kept") {
        char f[600];
        if (me == 0) snprintf(f, sizeof f, "%s/tokenizer.json", sdir), write_text(f, "{}\n");
        MPI_Barrier(MPI_COMM_WORLD);
        tpk_ctx ctx;
        tpk_llama m;
        float *wl[64] = {0};
        int nl = 0;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 4}));
        CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &lc));
        test_set_weights(&ctx, 77, 0.3f);
        nl = ctx.params.n;
        for (int i = 0; i < nl; i++) {
            wl[i] = malloc(tpk_param_global_numel(&ctx, i) * 4);
            CHECK_OK(&ctx, tpk_param_gather(&ctx, i, (const float *)ctx.params.data.p, wl[i]));
        }
        CHECK_OK(&ctx,
                 tpk_llama_save(&ctx, &m, NULL, sdir, &(tpk_hf_save_desc){.step = 9, .seed = 1}));
        tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx);
        static const char *const gone[] = {"model.safetensors.index.json",
                                           "model-00001-of-00002.safetensors",
                                           "model-00002-of-00002.safetensors"};
        for (int k = 0; k < 3; k++)
            CHECK(!exists((snprintf(f, sizeof f, "%s/%s", sdir, gone[k]), f)),
                  "%s left after the save", f);
        CHECK(exists((snprintf(f, sizeof f, "%s/tokenizer.json", sdir), f)) &&
                  exists((snprintf(f, sizeof f, "%s/model.safetensors", sdir), f)),
              "tokenizer.json kept, model.safetensors written");
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.seed = 99}));
        CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &lc));
        CHECK_OK(&ctx, tpk_llama_load(&ctx, &m, NULL, sdir));
        int bad = 0;
        for (int i = 0; i < nl; i++) {
            size_t gn = tpk_param_global_numel(&ctx, i);
            float *g = malloc(gn * 4);
            test_poison(g, gn);
            CHECK_OK(&ctx, tpk_param_gather(&ctx, i, (const float *)ctx.params.data.p, g));
            bad += memcmp(g, wl[i], gn * 4) != 0;
            free(g), free(wl[i]);
        }
        CHECK(bad == 0, "%d of %d tensors differ from the saved weights (the old shards loaded?)",
              bad, nl);
        tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx);
        MPI_Barrier(MPI_COMM_WORLD);
    }

    TEST_CASE(
        "Llama sampling at t = %d: the same tokens on every rank, equal to the unsharded model's",
        np) {
        int32_t tok[2][9];
        for (int pass = 0; pass < 2; pass++) {
            tpk_ctx ctx;
            tpk_llama m;
            CHECK_OK(&ctx, tpk_ctx_init(
                               &ctx, pass ? &(tpk_ctx_desc){.seed = 1}
                                          : &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 1}));
            CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &lc));
            CHECK_OK(&ctx, tpk_llama_load(&ctx, &m, NULL, ldir));
            for (int i = 0; i < 9; i++) tok[pass][i] = -1;
            CHECK_OK(&ctx, tpk_lm_sample(&ctx, &m.lm, 3, 8, 0.8f, 21, tok[pass]));
            tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx);
        }
        int lo[9], hi[9];
        MPI_Allreduce(tok[0], lo, 9, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(tok[0], hi, 9, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        CHECK(!memcmp(lo, hi, sizeof lo) && !memcmp(tok[0], tok[1], sizeof tok[0]),
              "ranks or the unsharded model drew different tokens");
        for (int i = 1; i < 9; i++)
            CHECK(tok[0][i] >= 0 && tok[0][i] < 61, "token %d = %d", i, tok[0][i]);
    }

    TEST_CASE(
        "Llama bad input: unknown model_type, unsupported config values, a mis-shaped or missing "
        "tensor, a bad index") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        char bad[300], type[32];
        snprintf(bad, sizeof bad, "build/tests/hf_llama_bad_np%d_r%d", np, me);
        mkdir(bad, 0755);
        snprintf(path, sizeof path, "%s/config.json", bad);
        static const struct {
            const char *text, *needle;
            tpk_status want;
        } cases[] = {
            {"{\"model_type\": \"mistral\"}",
             "model_type \"mistral\": expected \"gpt2\", \"llama\", \"gpt_neox\", \"mixtral\" or "
             "\"qwen2_moe\"",
             TPK_ERR_UNSUPPORTED},
            {"{\"n_layer\": 2}", "model_type missing: expected", TPK_ERR_UNSUPPORTED},
            {"{\"model_type\": 7}", "model_type (not a string)", TPK_ERR_UNSUPPORTED},
        };
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            write_text(path, cases[k].text);
            CHECK_FAILS(&ctx, tpk_hf_model_type(&ctx, bad, type, sizeof type), cases[k].want,
                        cases[k].needle);
        }
#define LLAMA_CFG(extra)                                                          \
    "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 24, " \
    "\"num_attention_heads\": 6, \"vocab_size\": 61, "                            \
    "\"max_position_embeddings\": 12, \"intermediate_size\": 20" extra "}"
        static const struct {
            const char *text, *needle;
            tpk_status want;
        } lcases[] = {
            {LLAMA_CFG(", \"num_key_value_heads\": 4"),
             "num_key_value_heads 4: expected a divisor of num_attention_heads 6", TPK_ERR_FORMAT},
            {LLAMA_CFG(", \"hidden_act\": \"gelu\""), "hidden_act \"gelu\": expected \"silu\"",
             TPK_ERR_UNSUPPORTED},
            {LLAMA_CFG(", \"rope_scaling\": {\"type\": \"llama3\"}"), "rope_scaling: expected null",
             TPK_ERR_UNSUPPORTED},
            {LLAMA_CFG(", \"attention_bias\": true"), "attention_bias / mlp_bias: expected false",
             TPK_ERR_UNSUPPORTED},
            {LLAMA_CFG(", \"head_dim\": 8"),
             "head_dim 8: expected hidden_size / num_attention_heads = 4", TPK_ERR_UNSUPPORTED},
            {LLAMA_CFG(", \"tie_word_embeddings\": 1"),
             "expected true or false for tie_word_embeddings", TPK_ERR_FORMAT},
            {LLAMA_CFG(", \"rms_norm_eps\": -1"), "implausible configuration", TPK_ERR_FORMAT},
            {"{\"model_type\": \"llama\", \"num_hidden_layers\": 2}", "missing hidden_size",
             TPK_ERR_FORMAT},
            {"{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 18, "
             "\"num_attention_heads\": 6, \"vocab_size\": 61, "
             "\"max_position_embeddings\": 12, \"intermediate_size\": 20}",
             "expected an even head size", TPK_ERR_FORMAT},
        };
        tpk_llama_config c;
        for (size_t k = 0; k < sizeof lcases / sizeof *lcases; k++) {
            write_text(path, lcases[k].text);
            CHECK_FAILS(&ctx, tpk_llama_config_read(&ctx, bad, &c), lcases[k].want,
                        lcases[k].needle);
        }
        write_text(
            path,
            LLAMA_CFG(
                ", \"num_key_value_heads\": 2, \"hidden_act\": \"silu\", \"rope_scaling\": null, "
                "\"tie_word_embeddings\": true, \"head_dim\": 4"));
        CHECK_OK(&ctx, tpk_llama_config_read(&ctx, bad, &c));
        CHECK(c.kv_heads == 2 && c.tie_embeddings && c.norm_eps == 1e-6f &&
                  c.rope_theta == 10000.0f,
              "defaults and booleans read");
        /* the saved checkpoint into a model of another shape, and without a tensor */
        tpk_llama m;
        tpk_llama_config other = lc;
        other.kv_heads = 3;
        CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &other));
        CHECK_FAILS(
            &ctx, tpk_llama_load(&ctx, &m, NULL, ldir), TPK_ERR_SHAPE,
            "\"model.layers.0.self_attn.k_proj.weight\" has shape [8, 24], config.json implies "
            "[12, 24]");
        tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx); /* a model's parameters stay in its
                                                               context: a fresh one per model */
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        other = lc, other.tie_embeddings = true; /* a tied head beside the file's trained
                                                    lm_head.weight: refused, not dropped */
        CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &other));
        CHECK_FAILS(&ctx, tpk_llama_load(&ctx, &m, NULL, ldir), TPK_ERR_FORMAT,
                    "model.safetensors: tensor \"lm_head.weight\" is not a parameter of the model "
                    "config.json describes");
        tpk_lm_destroy(&ctx, &m.lm), tpk_ctx_destroy(&ctx);
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        CHECK_OK(&ctx, tpk_llama_init(&ctx, &m, &lc));
        char idx[700];
        snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", bad);
        static const struct {
            const char *text, *needle;
        } icases[] = {
            {"{\"weight_map\": {\"model.norm.weight\": \"../model-00001-of-00002.safetensors\"}}",
             "expected a file name ending in .safetensors in the same directory"},
            {"{\"weight_map\": {\"model.norm.weight\": \"x.bin\"}}",
             "expected a file name ending in .safetensors"},
            {"{\"weight_map\": [1]}", "expected an object \"weight_map\""},
            {"{\"weight_map\": {\"model.norm.weight\": 3}}", "weight_map: file: expected a string"},
            {"{\"weight_map\": {}}", "no tensor \"model.embed_tokens.weight\""},
            {"{\"weight_map\": {\"model.embed_tokens.weight\"", "byte"},
            {"{\"weight_map\": {\"model.norm.weight\": \"a.safetensors\", \"model.norm.weight\": "
             "\"b.safetensors\"}}",
             "the tensor \"model.norm.weight\" appears twice"},
        };
        for (size_t k = 0; k < sizeof icases / sizeof *icases; k++) {
            write_text(idx, icases[k].text);
            CHECK_FAILS(&ctx, tpk_llama_load(&ctx, &m, NULL, bad), TPK_ERR_FORMAT,
                        icases[k].needle);
        }
        write_text(idx, "{\"weight_map\": {\"model.embed_tokens.weight\": "
                        "\"model-00001-of-00001.safetensors\"}}");
        CHECK_FAILS(&ctx, tpk_llama_load(&ctx, &m, NULL, bad), TPK_ERR_IO,
                    "model-00001-of-00001.safetensors");
        tpk_lm_destroy(&ctx, &m.lm);
        tpk_ctx_destroy(&ctx);
    }
    for (int i = 0; i < 3 * lparams; i++) free(lbefore[i]);

    TEST_CASE("config.json fuzz corpus replay (tests/fuzz/corpus_config)")
    test_replay_corpus("tests/fuzz/corpus_config", fuzz_config_one, "valid", 7);
    for (int i = 0; i < 3 * nparams; i++) free(before[i]);
    tpk_comm_destroy(&world);
    return test_finish();
}
