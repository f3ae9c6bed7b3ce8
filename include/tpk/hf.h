/* tpk/hf.h — GPT-2 checkpoints in Hugging Face's layout, saved and loaded at any TP and DP size.
 *
 * A checkpoint directory holds
 *   config.json        GPT2LMHeadModel's config (n_layer, n_embd, n_head, vocab_size, n_positions,
 *                      layer_norm_epsilon, ...) plus tpk_step and tpk_seed
 *   model.safetensors  every parameter as its GLOBAL tensor under Hugging Face GPT-2 names; the
 *                      Conv1D weights (c_attn, c_proj, c_fc) stored [in, out] as Hugging Face
 *                      does (tpk keeps [out, in]); metadata {"format": "pt", "step": N}
 *   optim.safetensors  the AdamW moments "<name>.exp_avg", "<name>.exp_avg_sq" (global,
 *                      [out, in]) and the step, when an optimizer is given
 * Saving gathers every tensor over TP (collective on every rank) and world rank 0 writes each
 * file atomically (tpk_st_write: temporary, fsync, rename); every rank gets the same status.
 * Loading reads the files on every rank and sets each rank's shard (no communication), so a
 * checkpoint saved at t = 2 loads at t = 4; it also reads a Hugging Face GPT-2 directory (names
 * with or without "transformer.", the attn.bias buffers ignored). Shapes are checked against
 * the model; an optimizer file whose step differs from the model file's is refused.
 * config.json is parsed as strict JSON (RFC 8259): a truncated or malformed file is an error
 * naming the file and the byte. */
#ifndef TPK_HF_H
#define TPK_HF_H

#include <ctype.h>

#include "data.h"
#include "gpt2.h"
#include "optim.h"
#include "safetensors.h"

/* ---- strict JSON: the top-level numbers of an object ------------------------------------------ */

/* Checks that text[0, n) is one JSON value (RFC 8259; nesting at most 64 deep) and, when it is an
 * object, stores the top-level members named keys[i] whose values are numbers in vals[i]
 * (found[i] set). On a syntax error returns false with *at the byte offset and *what the
 * expectation. */
static inline bool tpk__json_top_numbers(const char *t, size_t n, const char *const *keys, int nkeys, double *vals, bool *found, size_t *at,
                                         const char **what) {
    char stack[64]; /* '{' or '[' per open level */
    int depth = 0, key_index = -1;
    size_t i = 0;
    bool top_object = false;
#define TPK__WS() while (i < n && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) i++
#define TPK__FAIL(w) do { *at = i, *what = (w); return false; } while (0)
    for (int k = 0; k < nkeys; k++) found[k] = false;
    TPK__WS();
    for (;;) { /* parse one value at position i, then what follows it */
        TPK__WS();
        if (i >= n) TPK__FAIL("a value");
        char c = t[i];
        if (c == '{' || c == '[') {
            if (depth == 64) TPK__FAIL("nesting at most 64 deep");
            if (depth == 0 && c == '{') top_object = true;
            stack[depth++] = c, i++;
            TPK__WS();
            if (i < n && t[i] == (c == '{' ? '}' : ']')) { i++, depth--; goto after_value; }
            if (c == '[') continue;
            goto member; /* an object's first member */
        } else if (c == '"') {
            for (i++;; i++) {
                if (i >= n) TPK__FAIL("the end of a string");
                unsigned char u = (unsigned char)t[i];
                if (u == '"') break;
                if (u < 0x20) TPK__FAIL("no control character in a string");
                if (u == '\\') {
                    if (++i >= n) TPK__FAIL("an escape");
                    if (t[i] == 'u') {
                        for (int h = 1; h <= 4; h++)
                            if (i + h >= n || !isxdigit((unsigned char)t[i + h])) TPK__FAIL("four hex digits after \\u");
                        i += 4;
                    } else if (!strchr("\"\\/bfnrt", t[i])) {
                        TPK__FAIL("an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
                    }
                }
            }
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t s0 = i;
            if (t[i] == '-') i++;
            if (i < n && t[i] == '0') i++;
            else if (i < n && t[i] >= '1' && t[i] <= '9') while (i < n && t[i] >= '0' && t[i] <= '9') i++;
            else TPK__FAIL("a digit");
            if (i < n && t[i] == '.') {
                if (++i >= n || t[i] < '0' || t[i] > '9') TPK__FAIL("a digit after the decimal point");
                while (i < n && t[i] >= '0' && t[i] <= '9') i++;
            }
            if (i < n && (t[i] == 'e' || t[i] == 'E')) {
                i++;
                if (i < n && (t[i] == '+' || t[i] == '-')) i++;
                if (i >= n || t[i] < '0' || t[i] > '9') TPK__FAIL("a digit in the exponent");
                while (i < n && t[i] >= '0' && t[i] <= '9') i++;
            }
            if (depth == 1 && key_index >= 0) {
                char num[64];
                size_t len = i - s0 < sizeof num - 1 ? i - s0 : sizeof num - 1;
                memcpy(num, t + s0, len), num[len] = 0;
                vals[key_index] = strtod(num, NULL), found[key_index] = true;
            }
        } else if (n - i >= 4 && !strncmp(t + i, "true", 4)) i += 4;
        else if (n - i >= 5 && !strncmp(t + i, "false", 5)) i += 5;
        else if (n - i >= 4 && !strncmp(t + i, "null", 4)) i += 4;
        else TPK__FAIL("a value (object, array, string, number, true, false or null)");
    after_value:
        key_index = -1;
        TPK__WS();
        if (depth == 0) {
            if (i != n) TPK__FAIL("the end of the text after the top-level value");
            if (!top_object) { *at = 0, *what = "an object at the top level"; return false; }
            return true;
        }
        if (i >= n) TPK__FAIL(stack[depth - 1] == '{' ? "',' or '}'" : "',' or ']'");
        if (t[i] == (stack[depth - 1] == '{' ? '}' : ']')) { i++, depth--; goto after_value; }
        if (t[i] != ',') TPK__FAIL(stack[depth - 1] == '{' ? "',' or '}'" : "',' or ']'");
        i++;
        if (stack[depth - 1] == '[') continue;
    member: /* "key" : value */
        TPK__WS();
        if (i >= n || t[i] != '"') TPK__FAIL("a member name in double quotes");
        {
            size_t k0 = ++i;
            while (i < n && t[i] != '"' && (unsigned char)t[i] >= 0x20 && t[i] != '\\') i++;
            if (i >= n || t[i] != '"') TPK__FAIL("a plain member name (no escapes)");
            for (int k = 0; depth == 1 && k < nkeys; k++)
                if (strlen(keys[k]) == i - k0 && !strncmp(t + k0, keys[k], i - k0)) key_index = k;
            i++;
        }
        TPK__WS();
        if (i >= n || t[i] != ':') TPK__FAIL("':' after a member name");
        i++;
        int keep = key_index;
        TPK__WS();
        key_index = keep;
        continue;
    }
#undef TPK__WS
#undef TPK__FAIL
}

/* ---- config.json ------------------------------------------------------------------------------------------ */

/* A config.json held in memory (bytes[n], named `what` in errors) into *cfg (vocab, positions,
 * layers, hidden, heads, ln_eps; the other fields untouched). */
static inline tpk_status tpk_gpt2_config_parse(tpk_ctx *ctx, const uint8_t *b, size_t n, const char *what, tpk_gpt2_config *cfg) {
    static const char *fn = "tpk_gpt2_config_parse";
    if (!ctx) return TPK_ERR_ARG;
    if (!cfg || !what || (n && !b)) return tpk__fail(ctx, TPK_ERR_ARG, fn, "bytes, what, cfg: NULL");
    static const char *const keys[] = {"n_layer", "n_embd", "n_head", "vocab_size", "n_positions", "layer_norm_epsilon"};
    double v[6] = {0, 0, 0, 0, 0, 1e-5};
    bool found[6];
    size_t at = 0;
    const char *expect = "";
    if (!tpk__json_top_numbers((const char *)b, n, keys, 6, v, found, &at, &expect))
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: byte %zu: expected %s", what, at, expect);
    for (int k = 0; k < 5; k++)
        if (!found[k]) return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: missing %s (a number)", what, keys[k]);
    double L = v[0], H = v[1], A = v[2], V = v[3], P = v[4], eps = found[5] ? v[5] : 1e-5;
    if (!(L >= 1 && H >= 1 && A >= 1 && V >= 1 && P >= 1 && L <= 1e5 && H <= 1e6 && A <= H && V <= 1e8 && P <= 1e8) || L != floor(L) ||
        H != floor(H) || A != floor(A) || V != floor(V) || P != floor(P) || (int64_t)H % (int64_t)A || !(eps >= 1e-30 && eps < 1)) /* eps must stay positive as an f32 */
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: implausible configuration (n_layer %g, n_embd %g, n_head %g, vocab_size %g, n_positions %g, layer_norm_epsilon %g)", what, L,
                         H, A, V, P, eps);
    cfg->layers = (int64_t)L, cfg->hidden = (int64_t)H, cfg->heads = (int64_t)A, cfg->vocab = (int64_t)V, cfg->positions = (int64_t)P;
    cfg->ln_eps = (float)eps;
    return TPK_OK;
}

/* dir/config.json into *cfg, as tpk_gpt2_config_parse. */
static inline tpk_status tpk_gpt2_config_read(tpk_ctx *ctx, const char *dir, tpk_gpt2_config *cfg) {
    static const char *fn = "tpk_gpt2_config_read";
    if (!ctx) return TPK_ERR_ARG;
    if (!dir || !cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", dir ? "cfg" : "dir");
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    uint8_t *b = NULL;
    size_t n = 0;
    TPK_TRY(tpk__read_file(ctx, fn, path, &b, &n));
    tpk_status s = tpk_gpt2_config_parse(ctx, b, n, path, cfg);
    free(b);
    return s;
}

/* ---- save ------------------------------------------------------------------------------------------------- */

/* Conv1D weights are stored [in, out] by Hugging Face, [out, in] here. */
static inline bool tpk__hf_is_conv1d(const tpk_param *p) {
    size_t n = strlen(p->name);
    return p->ndim == 2 && n > 7 && !strcmp(p->name + n - 7, ".weight") && strncmp(p->name, "wte", 3) && strncmp(p->name, "wpe", 3) &&
           !strstr(p->name, "ln_");
}
static inline void tpk__transpose(const float *in, float *out, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) out[j * rows + i] = in[i * cols + j];
}
/* text to path atomically: a temporary written, fsynced and renamed over path */
static inline tpk_status tpk__write_text_atomic(tpk_ctx *ctx, const char *fn, const char *path, const char *text) {
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    bool ok = fd >= 0 && tpk__st_write_all(fd, text, strlen(text)) && fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (ok) return TPK_OK;
    tpk_status s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write: %s", path, strerror(errno));
    unlink(tmp);
    return s;
}

typedef struct tpk_gpt2_save_desc {
    int64_t step;  /* optimizer steps done (the "step" metadata, tpk_step) */
    uint64_t seed; /* tpk_seed in config.json */
} tpk_gpt2_save_desc;

static inline tpk_status tpk__gpt2_save_rank0(tpk_ctx *ctx, const tpk_gpt2 *m, const char *dir, const tpk_gpt2_save_desc *d, const tpk_st_entry *e,
                                              int n, bool with_opt) {
    static const char *fn = "tpk_gpt2_save";
    char path[1100], stepstr[32], cfg[1400];
    snprintf(stepstr, sizeof stepstr, "%lld", (long long)d->step);
    const char *meta[] = {"format", "pt", "step", stepstr, NULL};
    const char *ometa[] = {"format", "tpk-adamw", "step", stepstr, NULL};
    if (with_opt) {
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        TPK_TRY(tpk_st_write(ctx, path, e + n, 2 * n, ometa));
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    TPK_TRY(tpk_st_write(ctx, path, e, n, meta));
    const tpk_gpt2_config *c = &m->c;
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %lld,\n  \"n_positions\": %lld,\n"
             "  \"n_ctx\": %lld,\n  \"n_embd\": %lld,\n  \"n_layer\": %lld,\n  \"n_head\": %lld,\n  \"n_inner\": null,\n"
             "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": %g,\n  \"resid_pdrop\": %g,\n  \"embd_pdrop\": %g,\n"
             "  \"attn_pdrop\": %g,\n  \"tie_word_embeddings\": true,\n  \"tpk_step\": %lld,\n  \"tpk_seed\": %llu\n}\n",
             (long long)c->vocab, (long long)c->positions, (long long)c->positions, (long long)c->hidden, (long long)c->layers, (long long)c->heads,
             (double)(c->ln_eps > 0 ? c->ln_eps : 1e-5f), (double)c->dropout, (double)c->dropout, (double)c->dropout, (long long)d->step,
             (unsigned long long)d->seed);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return tpk__write_text_atomic(ctx, fn, path, cfg);
}

/* Save the model (and opt's moments when opt is not NULL) to dir. Collective over ctx->world. */
static inline tpk_status tpk_gpt2_save(tpk_ctx *ctx, const tpk_gpt2 *m, const tpk_adamw *opt, const char *dir, const tpk_gpt2_save_desc *desc) {
    static const char *fn = "tpk_gpt2_save";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->h || !dir) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    tpk_gpt2_save_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    bool root = ctx->world->rank == 0;
    tpk_status s = TPK_OK;
    if (root && mkdir(dir, 0755) != 0 && errno != EEXIST) s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot create: %s", dir, strerror(errno));
    if (tpk_agree(ctx, ctx->world, s) != TPK_OK) return s != TPK_OK ? s : tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot create the checkpoint directory", dir);
    int n = ctx->params.n, k3 = opt ? 3 : 1;
    float **w = (float **)calloc((size_t)n * 3, sizeof *w);
    tpk_st_entry *e = (tpk_st_entry *)calloc((size_t)n * 3, sizeof *e);
    int64_t(*shapes)[2] = (int64_t(*)[2])calloc((size_t)n, sizeof *shapes);
    char(*names)[2][112] = (char(*)[2][112])calloc((size_t)n, sizeof *names);
    if (!w || !e || !shapes || !names) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the checkpoint's tables");
    for (int i = 0; i < n && s == TPK_OK; i++) {
        const tpk_param *p = &ctx->params.list[i];
        size_t gn = tpk_param_global_numel(ctx, i);
        const float *flat[3] = {(const float *)ctx->params.data.p, opt ? opt->m : NULL, opt ? opt->v : NULL};
        for (int k = 0; k < k3 && s == TPK_OK; k++) {
            if (!(w[3 * i + k] = (float *)malloc(sizeof(float) * (gn ? gn : 1)))) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
            else s = tpk_param_gather(ctx, i, flat[k], w[3 * i + k]); /* collective over TP */
        }
        if (s != TPK_OK) break;
        if (tpk__hf_is_conv1d(p)) { /* Hugging Face's [in, out] in the model file */
            float *t = (float *)malloc(sizeof(float) * (gn ? gn : 1));
            if (!t) { s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn); break; }
            tpk__transpose(w[3 * i], t, p->gshape[0], p->gshape[1]);
            free(w[3 * i]), w[3 * i] = t;
            shapes[i][0] = p->gshape[1], shapes[i][1] = p->gshape[0];
        } else {
            shapes[i][0] = p->gshape[0], shapes[i][1] = p->ndim > 1 ? p->gshape[1] : 0;
        }
        e[i].name = p->name, e[i].dtype = TPK_ST_F32, e[i].ndim = p->ndim, e[i].shape = shapes[i], e[i].data = w[3 * i];
        for (int k = 0; k < 2 && opt; k++) {
            snprintf(names[i][k], sizeof names[i][k], "%s.%s", p->name, k ? "exp_avg_sq" : "exp_avg");
            tpk_st_entry *o = &e[n + 2 * i + k];
            o->name = names[i][k], o->dtype = TPK_ST_F32, o->ndim = p->ndim, o->shape = p->gshape, o->data = w[3 * i + 1 + k];
        }
    }
    if (s == TPK_OK && root) s = tpk__gpt2_save_rank0(ctx, m, dir, &d, e, n, opt != NULL);
    for (int i = 0; w && i < 3 * n; i++) free(w[i]);
    free(w), free(e), free(shapes), free(names);
    tpk_status all = tpk_agree(ctx, ctx->world, s);
    if (all != TPK_OK && s == TPK_OK) return tpk__fail(ctx, all, fn, "%s: writing the checkpoint failed on another rank", dir);
    return s;
}

/* ---- load ------------------------------------------------------------------------------------------------- */

/* Set every parameter (and, when opt is given and dir has optim.safetensors, the moments and
 * opt->step) from dir. The model must have the shapes of dir's config.json. Every rank reads. */
static inline tpk_status tpk_gpt2_load(tpk_ctx *ctx, tpk_gpt2 *m, tpk_adamw *opt, const char *dir) {
    static const char *fn = "tpk_gpt2_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->h || !dir) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    char path[1100];
    tpk_st_file f, of;
    memset(&f, 0, sizeof f), memset(&of, 0, sizeof of);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    TPK_TRY(tpk_st_read(ctx, path, &f));
    snprintf(path, sizeof path, "%s/optim.safetensors", dir);
    bool have_opt = opt && access(path, F_OK) == 0;
    tpk_status s = have_opt ? tpk_st_read(ctx, path, &of) : TPK_OK;
    for (int i = 0; i < ctx->params.n && s == TPK_OK; i++) {
        const tpk_param *p = &ctx->params.list[i];
        char alt[160];
        snprintf(alt, sizeof alt, "transformer.%s", p->name);
        const tpk_st_tensor *t = tpk_st_find(&f, p->name);
        if (!t) t = tpk_st_find(&f, alt);
        if (!t) { s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s/model.safetensors: no tensor \"%s\"", dir, p->name); break; }
        bool conv = tpk__hf_is_conv1d(p);
        int64_t want[2] = {conv ? p->gshape[1] : p->gshape[0], conv ? p->gshape[0] : (p->ndim > 1 ? p->gshape[1] : 0)};
        if (t->ndim != p->ndim || t->shape[0] != want[0] || (p->ndim > 1 && t->shape[1] != want[1])) {
            s = tpk__fail(ctx, TPK_ERR_SHAPE, fn, "%s/model.safetensors: \"%s\" has shape [%lld%s%lld], config.json implies [%lld%s%lld]", dir, t->name,
                          (long long)t->shape[0], t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)want[0],
                          p->ndim > 1 ? ", " : "", p->ndim > 1 ? (long long)want[1] : 0LL);
            break;
        }
        size_t gn = tpk_param_global_numel(ctx, i);
        float *w = (float *)malloc(sizeof(float) * (gn ? gn : 1)), *tw = conv ? (float *)malloc(sizeof(float) * (gn ? gn : 1)) : NULL;
        if (!w || (conv && !tw)) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
        if (s == TPK_OK) s = tpk_st_get_f32(ctx, &f, t, w, gn);
        if (s == TPK_OK && conv) tpk__transpose(w, tw, want[0], want[1]);
        if (s == TPK_OK) s = tpk_param_set_global(ctx, i, conv ? tw : w);
        for (int k = 0; k < 2 && have_opt && s == TPK_OK; k++) {
            char on[160];
            snprintf(on, sizeof on, "%s.%s", p->name, k ? "exp_avg_sq" : "exp_avg");
            const tpk_st_tensor *ot = tpk_st_find(&of, on);
            if (!ot) s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s/optim.safetensors: no tensor \"%s\"", dir, on);
            if (s == TPK_OK) s = tpk_st_get_f32(ctx, &of, ot, w, gn);
            if (s == TPK_OK) s = tpk_param_scatter(ctx, i, w, k ? opt->v : opt->m);
        }
        free(w), free(tw);
    }
    if (s == TPK_OK && have_opt) {
        const char *ms = tpk_st_meta(&f, "step"), *os = tpk_st_meta(&of, "step");
        if (!os || (ms && strcmp(ms, os)))
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: optim.safetensors (step %s) does not belong to model.safetensors (step %s)", dir, os ? os : "?",
                          ms ? ms : "?");
        else opt->step = strtoll(os, NULL, 10);
    }
    tpk_st_close(&f), tpk_st_close(&of);
    return s;
}

#endif /* TPK_HF_H */
