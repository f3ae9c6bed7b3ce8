/* tpk/train/hf.h — GPT-2 and Llama checkpoints in Hugging Face's layout, saved and loaded at any TP
 * and DP size.
 *
 * A checkpoint directory holds
 *   config.json        GPT2LMHeadModel's config (model_type "gpt2": n_layer, n_embd, n_head,
 *                      vocab_size, n_positions, layer_norm_epsilon, ...) or LlamaForCausalLM's
 *                      (model_type "llama": num_hidden_layers, hidden_size, num_attention_heads,
 *                      num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings,
 *                      rms_norm_eps, rope_theta, tie_word_embeddings) or GPTNeoXForCausalLM's
 *                      (model_type "gpt_neox": the same sizes, rotary_pct, rotary_emb_base,
 *                      layer_norm_eps, use_parallel_residual), plus tpk_step, tpk_seed
 *                      and tpk_checkpoint_id (16 hex digits, random per save)
 *   model.safetensors  every parameter as its GLOBAL tensor under Hugging Face names; GPT-2's
 *                      Conv1D weights (c_attn, c_proj, c_fc) stored [in, out] as Hugging Face
 *                      does (tpk keeps [out, in]); Llama's all [out, in]; metadata {"format": "pt",
 *                      "step": N, "tpk_checkpoint_id": ID}. Loading also reads Hugging Face's
 *                      shards, model-K-of-N.safetensors named by model.safetensors.index.json.
 *   optim.safetensors  the AdamW moments "<name>.exp_avg", "<name>.exp_avg_sq" (global,
 *                      [out, in]), the step and the id, when an optimizer is given
 * Saving gathers every tensor over TP (collective on every rank); world rank 0 writes the files
 * into DIR.tpk-new and swaps it in for DIR by rename, carrying over DIR's other files, so DIR is
 * replaced whole or not at all (tpk__hf_commit; a load reads DIR.tpk-old when a save stopped
 * between the renames, and the next save repairs); every rank gets the same status.
 * Loading reads the files on every rank and sets each rank's shard (no communication), so a
 * checkpoint saved at t = 2 loads at t = 4; it also reads a Hugging Face GPT-2 directory (names
 * with or without "transformer.", the attn.bias buffers ignored) or Llama directory. Refused,
 * naming the file: shapes unlike the model's, tensors it does not account for, non-finite values,
 * steps or checkpoint ids that differ between the files. tpk_hf_model_type tells the two
 * architectures apart (tpk/train/model.h builds either).
 * config.json is parsed as strict JSON (RFC 8259: numbers read whole, each top-level key once,
 * valid UTF-8): a truncated or malformed file is an error naming the file and the byte; what
 * tpk's Llama does not compute (rope_scaling, biases, another activation) is refused by name. */
#ifndef TPK_HF_H
#define TPK_HF_H

#include <ctype.h>
#include <dirent.h>
#include <time.h>

#include "data.h"
#include "../models/families.h"
#include "optim.h"
#include "safetensors.h"

/* ---- strict JSON: the top-level members of an object ----------------------------------------- */

/* A top-level member's value: kind 0 (absent), 'n' number (num: the whole text read by strtod,
 * however long), 'b' true/false (num 1/0), 's' string (its first 63 bytes, escapes as written, in
 * str), 'z' null, 'o' object or array; `at` is the byte offset where the value starts. */
typedef struct tpk__json_val {
    char kind;
    double num;
    char str[64];
    size_t at;
} tpk__json_val;

/* True when the top-level member name t[k0, k1) already appeared among the first *nseen (kept in
 * *seen, grown as needed: offsets of each name's start and end); false after recording it, or
 * with *seen NULL when out of memory. Sorted insertion keeps the search logarithmic. */
static inline bool tpk__json_seen(const char *t, size_t k0, size_t k1, size_t (**seen)[2],
                                  size_t *nseen, size_t *cap) {
    size_t lo = 0, hi = *nseen;
    while (lo < hi) { /* the first name not below t[k0, k1) */
        size_t mid = (lo + hi) / 2, a = (*seen)[mid][0], la = (*seen)[mid][1] - a, lb = k1 - k0;
        int c = memcmp(t + a, t + k0, la < lb ? la : lb);
        if (c < 0 || (c == 0 && la < lb)) lo = mid + 1;
        else hi = mid;
    }
    if (lo < *nseen && (*seen)[lo][1] - (*seen)[lo][0] == k1 - k0 &&
        !memcmp(t + (*seen)[lo][0], t + k0, k1 - k0))
        return true;
    if (*nseen == *cap) {
        size_t nc = *cap ? 2 * *cap : 32;
        size_t(*g)[2] = (size_t(*)[2])realloc(*seen, nc * sizeof **seen);
        if (!g) { free(*seen), *seen = NULL; return false; }
        *seen = g, *cap = nc;
    }
    memmove(*seen + lo + 1, *seen + lo, (*nseen - lo) * sizeof **seen);
    (*seen)[lo][0] = k0, (*seen)[lo][1] = k1, ++*nseen;
    return false;
}

/* Checks that text[0, n) is one JSON value (RFC 8259: strings valid UTF-8; nesting at most 64
 * deep; in the top-level object each member name once) and, when it is an object, describes the
 * top-level members named keys[i] in vals[i]. On an error returns false with *at the byte offset
 * and *what the expectation. */
static inline bool tpk__json_top(const char *t, size_t n, const char *const *keys, int nkeys,
                                 tpk__json_val *vals, size_t *at, const char **what) {
    char stack[64]; /* '{' or '[' per open level */
    int depth = 0, key_index = -1;
    size_t i = 0, (*seen)[2] = NULL, nseen = 0, cap = 0; /* the top-level member names so far */
    bool top_object = false;
#define TPK__WS() while (i < n && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) i++
#define TPK__FAIL(w) do { free(seen); *at = i, *what = (w); return false; } while (0)
    for (int k = 0; k < nkeys; k++) memset(&vals[k], 0, sizeof vals[k]);
    TPK__WS();
    for (;;) { /* parse one value at position i, then what follows it */
        TPK__WS();
        if (i >= n) TPK__FAIL("a value");
        char c = t[i];
        tpk__json_val *mine = depth == 1 && key_index >= 0 ? &vals[key_index] : NULL;
        if (mine)
            mine->at = i, mine->kind = c == '{' || c == '['   ? 'o'
                                       : c == '"'             ? 's'
                                       : c == 't' || c == 'f' ? 'b'
                                       : c == 'n'             ? 'z'
                                                              : 'n';
        if (c == '{' || c == '[') {
            if (depth == 64) TPK__FAIL("nesting at most 64 deep");
            if (depth == 0 && c == '{') top_object = true;
            stack[depth++] = c, i++;
            TPK__WS();
            if (i < n && t[i] == (c == '{' ? '}' : ']')) { i++, depth--; goto after_value; }
            if (c == '[') continue;
            goto member; /* an object's first member */
        } else if (c == '"') {
            size_t s0 = i + 1;
            for (i++;; i++) {
                if (i >= n) TPK__FAIL("the end of a string");
                unsigned char u = (unsigned char)t[i];
                if (u == '"') break;
                if (u < 0x20) TPK__FAIL("no control character in a string");
                if (u >= 0x80) { /* a multi-byte character: valid UTF-8, as the safetensors reader
                                    requires */
                    size_t k = tpk__st_utf8_len((const uint8_t *)t + i, (const uint8_t *)t + n);
                    if (!k) TPK__FAIL("valid UTF-8 in a string");
                    i += k - 1;
                    continue;
                }
                if (u == '\\') {
                    if (++i >= n) TPK__FAIL("an escape");
                    if (t[i] == 'u') {
                        for (int h = 1; h <= 4; h++)
                            if (i + h >= n || !isxdigit((unsigned char)t[i + h]))
                                TPK__FAIL("four hex digits after \\u");
                        i += 4;
                    } else if (!strchr("\"\\/bfnrt", t[i])) {
                        TPK__FAIL("an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
                    }
                }
            }
            if (mine)
                snprintf(mine->str, sizeof mine->str, "%.*s", (int)(i - s0 < 63 ? i - s0 : 63),
                         t + s0);
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t s0 = i;
            if (t[i] == '-') i++;
            if (i < n && t[i] == '0') i++;
            else if (i < n && t[i] >= '1' && t[i] <= '9')
                while (i < n && t[i] >= '0' && t[i] <= '9') i++;
            else TPK__FAIL("a digit");
            if (i < n && t[i] == '.') {
                if (++i >= n || t[i] < '0' || t[i] > '9')
                    TPK__FAIL("a digit after the decimal point");
                while (i < n && t[i] >= '0' && t[i] <= '9') i++;
            }
            if (i < n && (t[i] == 'e' || t[i] == 'E')) {
                i++;
                if (i < n && (t[i] == '+' || t[i] == '-')) i++;
                if (i >= n || t[i] < '0' || t[i] > '9') TPK__FAIL("a digit in the exponent");
                while (i < n && t[i] >= '0' && t[i] <= '9') i++;
            }
            if (mine) { /* strtod on the whole text: a long mantissa keeps its exponent */
                char small[64], *num = i - s0 < sizeof small ? small : (char *)malloc(i - s0 + 1);
                if (!num) TPK__FAIL("a number short enough to copy (out of memory)");
                memcpy(num, t + s0, i - s0), num[i - s0] = 0;
                mine->num = strtod(num, NULL);
                if (num != small) free(num);
            }
        } else if (n - i >= 4 && !strncmp(t + i, "true", 4)) {
            i += 4;
            if (mine) mine->num = 1;
        } else if (n - i >= 5 && !strncmp(t + i, "false", 5)) i += 5;
        else if (n - i >= 4 && !strncmp(t + i, "null", 4)) i += 4;
        else TPK__FAIL("a value (object, array, string, number, true, false or null)");
    after_value:
        key_index = -1;
        TPK__WS();
        if (depth == 0) {
            if (i != n) TPK__FAIL("the end of the text after the top-level value");
            free(seen);
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
            size_t k0 = ++i, k;
            for (; i < n && t[i] != '"' && (unsigned char)t[i] >= 0x20 && t[i] != '\\'; i += k)
                if (!(k = tpk__st_utf8_len((const uint8_t *)t + i, (const uint8_t *)t + n)))
                    TPK__FAIL("valid UTF-8 in a member name");
            if (i >= n || t[i] != '"') TPK__FAIL("a plain member name (no escapes)");
            if (depth == 1 && tpk__json_seen(t, k0, i, &seen, &nseen, &cap)) {
                i = k0 - 1;
                TPK__FAIL("each member name once (a duplicate key)");
            }
            if (depth == 1 && !seen) TPK__FAIL("member names that fit in memory");
            for (int q = 0; depth == 1 && q < nkeys; q++)
                if (strlen(keys[q]) == i - k0 && !strncmp(t + k0, keys[q], i - k0)) key_index = q;
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

/* ---- config.json ----------------------------------------------------------------------------- */

/* Parse bytes[n] (named `what` in errors) as strict JSON and describe its top-level members
 * keys[i]. */
static inline tpk_status tpk__config_members(tpk_ctx *ctx, const char *fn, const uint8_t *b,
                                             size_t n, const char *what, const char *const *keys,
                                             int nkeys, tpk__json_val *v) {
    size_t at = 0;
    const char *expect = "";
    if (tpk__json_top((const char *)b, n, keys, nkeys, v, &at, &expect)) return TPK_OK;
    if (!strncmp(expect, "each member name once", 21)) { /* at: the duplicate's opening quote */
        size_t e = at + 1;
        while (e < n && b[e] != '"') e++;
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: byte %zu: the key \"%.*s\" appears twice (expected each key once)",
                         what, at, (int)(e - at - 1 < 100 ? e - at - 1 : 100),
                         (const char *)b + at + 1);
    }
    return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: byte %zu: expected %s", what, at, expect);
    return TPK_OK;
}
/* A member that must be a number when present (`need`: and must be present). */
static inline tpk_status tpk__config_number(tpk_ctx *ctx, const char *fn, const char *what,
                                            const char *key, const tpk__json_val *v, bool need) {
    if (v->kind == 'n' || (!v->kind && !need)) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: %s %s (a number)", what,
                     v->kind ? "expected a number for" : "missing", key);
}

/* A config.json held in memory (bytes[n], named `what` in errors) into *cfg (vocab, positions,
 * layers, hidden, heads, ln_eps; the other fields untouched). */
static inline tpk_status tpk_gpt2_config_parse(tpk_ctx *ctx, const uint8_t *b, size_t n,
                                               const char *what, tpk_gpt2_config *cfg) {
    static const char *fn = "tpk_gpt2_config_parse";
    if (!ctx) return TPK_ERR_ARG;
    if (!cfg || !what || (n && !b))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "bytes, what, cfg: NULL");
    static const char *const keys[] = {"n_layer",    "n_embd",      "n_head",
                                       "vocab_size", "n_positions", "layer_norm_epsilon"};
    tpk__json_val v[6];
    TPK_TRY(tpk__config_members(ctx, fn, b, n, what, keys, 6, v));
    for (int k = 0; k < 6; k++) TPK_TRY(tpk__config_number(ctx, fn, what, keys[k], &v[k], k < 5));
    double L = v[0].num, H = v[1].num, A = v[2].num, V = v[3].num, P = v[4].num,
           eps = v[5].kind ? v[5].num : 1e-5;
    if (!(L >= 1 && H >= 1 && A >= 1 && V >= 1 && P >= 1 && L <= 1e5 && H <= 1e6 && A <= H &&
          V <= 1e8 && P <= 1e8) ||
        L != floor(L) || H != floor(H) || A != floor(A) || V != floor(V) || P != floor(P) ||
        (int64_t)H % (int64_t)A ||
        !(eps >= 1e-30 && eps < 1)) /* eps must stay positive as an f32 */
        return tpk__fail(
            ctx, TPK_ERR_FORMAT, fn,
            "%s: implausible configuration (n_layer %g, n_embd %g, n_head %g, vocab_size %g, "
            "n_positions %g, layer_norm_epsilon %g)",
            what, L, H, A, V, P, eps);
    cfg->layers = (int64_t)L, cfg->hidden = (int64_t)H, cfg->heads = (int64_t)A,
    cfg->vocab = (int64_t)V, cfg->positions = (int64_t)P;
    cfg->ln_eps = (float)eps;
    return TPK_OK;
}

/* A Llama config.json (Hugging Face LlamaConfig) held in memory into *cfg (vocab, positions,
 * layers, hidden, heads, kv_heads, ffn, rope_theta, norm_eps, tie_embeddings; the other fields
 * untouched). What tpk's Llama does not compute is refused by name: a hidden_act other than
 * silu, attention or MLP biases, rope_scaling, a head_dim other than hidden / heads. */
static inline tpk_status tpk_llama_config_parse(tpk_ctx *ctx, const uint8_t *b, size_t n,
                                                const char *what, tpk_llama_config *cfg) {
    static const char *fn = "tpk_llama_config_parse";
    if (!ctx) return TPK_ERR_ARG;
    if (!cfg || !what || (n && !b))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "bytes, what, cfg: NULL");
    enum { NL, NH, NA, NV, NP, NF, NG, NEPS, NTH, NTIE, NACT, NAB, NMB, NRS, NHD, NK };
    static const char *const keys[] = {"num_hidden_layers",
                                       "hidden_size",
                                       "num_attention_heads",
                                       "vocab_size",
                                       "max_position_embeddings",
                                       "intermediate_size",
                                       "num_key_value_heads",
                                       "rms_norm_eps",
                                       "rope_theta",
                                       "tie_word_embeddings",
                                       "hidden_act",
                                       "attention_bias",
                                       "mlp_bias",
                                       "rope_scaling",
                                       "head_dim"};
    tpk__json_val v[NK];
    TPK_TRY(tpk__config_members(ctx, fn, b, n, what, keys, NK, v));
    for (int k = 0; k <= NTH; k++)
        TPK_TRY(tpk__config_number(ctx, fn, what, keys[k], &v[k], k <= NF));
    TPK_TRY(tpk__config_number(ctx, fn, what, keys[NHD], &v[NHD], false));
    for (int k = NTIE; k <= NMB; k += k == NTIE ? 2 : 1)
        if (v[k].kind && v[k].kind != 'b')
            return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: expected true or false for %s", what,
                             keys[k]);
    double L = v[NL].num, H = v[NH].num, A = v[NA].num, V = v[NV].num, P = v[NP].num, F = v[NF].num;
    double G = v[NG].kind ? v[NG].num : A, eps = v[NEPS].kind ? v[NEPS].num : 1e-6,
           theta = v[NTH].kind ? v[NTH].num : 10000;
    bool ok = L >= 1 && H >= 1 && A >= 1 && V >= 1 && P >= 1 && F >= 1 && G >= 1 && G <= A &&
              L <= 1e5 && H <= 1e6 && A <= H && V <= 1e8 && P <= 1e8 && F <= 1e7 && L == floor(L) &&
              H == floor(H) && A == floor(A) && V == floor(V) && P == floor(P) && F == floor(F) &&
              G == floor(G) && eps >= 1e-30 && eps < 1 && theta > 1 && theta < 1e30;
    if (!ok)
        return tpk__fail(
            ctx, TPK_ERR_FORMAT, fn,
            "%s: implausible configuration (num_hidden_layers %g, hidden_size %g, "
            "num_attention_heads %g, num_key_value_heads %g, "
            "vocab_size %g, max_position_embeddings %g, intermediate_size %g, rms_norm_eps %g, "
            "rope_theta %g)",
            what, L, H, A, G, V, P, F, eps, theta);
    if ((int64_t)H % (int64_t)A || ((int64_t)H / (int64_t)A) % 2)
        return tpk__fail(
            ctx, TPK_ERR_FORMAT, fn,
            "%s: hidden_size %g over num_attention_heads %g: expected an even head size (rotary "
            "embeddings)",
            what, H, A);
    if ((int64_t)A % (int64_t)G)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: num_key_value_heads %g: expected a divisor of num_attention_heads %g",
                         what, G, A);
    if (v[NHD].kind && v[NHD].num != H / A)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: head_dim %g: expected hidden_size / num_attention_heads = %g", what,
                         v[NHD].num, H / A);
    if (v[NACT].kind && (v[NACT].kind != 's' || strcmp(v[NACT].str, "silu")))
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: hidden_act \"%s\": expected \"silu\" (SwiGLU)", what, v[NACT].str);
    if (v[NAB].num || v[NMB].num)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: attention_bias / mlp_bias: expected false (Llama has no biases)",
                         what);
    if (v[NRS].kind && v[NRS].kind != 'z')
        return tpk__fail(
            ctx, TPK_ERR_UNSUPPORTED, fn,
            "%s: rope_scaling: expected null (tpk computes the unscaled rotary embedding)", what);
    cfg->layers = (int64_t)L, cfg->hidden = (int64_t)H, cfg->heads = (int64_t)A,
    cfg->kv_heads = (int64_t)G, cfg->vocab = (int64_t)V;
    cfg->positions = (int64_t)P, cfg->ffn = (int64_t)F, cfg->norm_eps = (float)eps,
    cfg->rope_theta = (float)theta, cfg->tie_embeddings = v[NTIE].num != 0;
    return TPK_OK;
}

/* A checkpoint path's names, trailing slashes dropped: base (the checkpoint), base.tpk-old (the
 * previous checkpoint while a save swaps the two), base.tpk-new (a save's files until the swap),
 * and base's parent directory (fsynced after each rename). False when the path is empty or too
 * long. */
typedef struct tpk__hf_paths {
    char base[1024], old[1040], tmp[1040], parent[1024];
} tpk__hf_paths;
static inline bool tpk__hf_paths_of(const char *dir, tpk__hf_paths *p) {
    size_t n = dir ? strlen(dir) : 0;
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n == 0 || n >= sizeof p->base) return false;
    memcpy(p->base, dir, n), p->base[n] = 0;
    snprintf(p->old, sizeof p->old, "%s.tpk-old", p->base),
        snprintf(p->tmp, sizeof p->tmp, "%s.tpk-new", p->base);
    const char *slash = strrchr(p->base, '/');
    if (!slash) snprintf(p->parent, sizeof p->parent, ".");
    else
        snprintf(p->parent, sizeof p->parent, "%.*s", slash == p->base ? 1 : (int)(slash - p->base),
                 p->base);
    return true;
}

/* The directory a load reads for dir: dir when it holds config.json, else dir.tpk-old when that
 * does (a save stopped between its two renames: the previous checkpoint is the checkpoint), else
 * dir (whose error then names it). */
static inline void tpk__hf_resolve(const char *dir, char *out, size_t n) {
    tpk__hf_paths p;
    char cj[1100];
    snprintf(out, n, "%s", dir ? dir : "");
    if (!tpk__hf_paths_of(dir, &p)) return;
    snprintf(cj, sizeof cj, "%s/config.json", p.base);
    if (access(cj, F_OK) == 0) return;
    snprintf(cj, sizeof cj, "%s/config.json", p.old);
    if (access(cj, F_OK) == 0) snprintf(out, n, "%s", p.old);
}

/* dir/config.json's bytes (free them) and its path (dir.tpk-old's after a stopped save:
 * tpk__hf_resolve). */
static inline tpk_status tpk__config_load(tpk_ctx *ctx, const char *fn, const char *dir, char *path,
                                          size_t np, uint8_t **b, size_t *n) {
    if (!ctx) return TPK_ERR_ARG;
    if (!dir) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dir: NULL");
    char d[1100];
    tpk__hf_resolve(dir, d, sizeof d); /* a save stopped mid-swap: the previous checkpoint */
    snprintf(path, np, "%s/config.json", d);
    return tpk__read_file(ctx, fn, path, b, n);
}

/* GPTNeoXForCausalLM's config.json: the sizes, rotary_pct (or partial_rotary_factor),
 * rotary_emb_base (or rope_theta), layer_norm_eps, hidden_act ("gelu": exact; "gelu_new",
 * "gelu_pytorch_tanh", "gelu_fast": the tanh form); refused: another activation, a sequential
 * residual, biases off, a tied head, scaled rotary embeddings. */
static inline tpk_status tpk_neox_config_parse(tpk_ctx *ctx, const uint8_t *b, size_t n,
                                               const char *what, tpk_neox_config *cfg) {
    static const char *fn = "tpk_neox_config_parse";
    if (!ctx) return TPK_ERR_ARG;
    if (!cfg || !what || (n && !b))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "bytes, what, cfg: NULL");
    enum { NL, NH, NA, NV, NP, NF, NPCT, NPRF, NBASE, NTH, NEPS, NPAR, NTIE, NAB, NACT, NRS, NK };
    static const char *const keys[] = {
        "num_hidden_layers", "hidden_size",     "num_attention_heads",   "vocab_size",
        "max_position_embeddings", "intermediate_size", "rotary_pct", "partial_rotary_factor",
        "rotary_emb_base",   "rope_theta",      "layer_norm_eps",        "use_parallel_residual",
        "tie_word_embeddings", "attention_bias", "hidden_act",           "rope_scaling"};
    tpk__json_val v[NK];
    TPK_TRY(tpk__config_members(ctx, fn, b, n, what, keys, NK, v));
    for (int k = 0; k <= NEPS; k++)
        TPK_TRY(tpk__config_number(ctx, fn, what, keys[k], &v[k], k <= NV || k == NP));
    for (int k = NPAR; k <= NAB; k++)
        if (v[k].kind && v[k].kind != 'b')
            return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: expected true or false for %s", what,
                             keys[k]);
    double L = v[NL].num, H = v[NH].num, A = v[NA].num, V = v[NV].num, P = v[NP].num;
    double F = v[NF].kind ? v[NF].num : 4 * H;
    double pct = v[NPCT].kind ? v[NPCT].num : v[NPRF].kind ? v[NPRF].num : 0.25;
    double base = v[NBASE].kind ? v[NBASE].num : v[NTH].kind ? v[NTH].num : 10000;
    double eps = v[NEPS].kind ? v[NEPS].num : 1e-5;
    bool ok = L >= 1 && H >= 1 && A >= 1 && V >= 1 && P >= 1 && F >= 1 && L <= 1e5 &&
              H <= 1e6 && A <= H && V <= 1e8 && P <= 1e8 && F <= 1e7 && L == floor(L) &&
              H == floor(H) && A == floor(A) && V == floor(V) && P == floor(P) && F == floor(F) &&
              pct > 0 && pct <= 1 && base > 1 && base < 1e30 && eps >= 1e-30 && eps < 1;
    if (!ok)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: implausible configuration (num_hidden_layers %g, hidden_size %g, "
                         "num_attention_heads %g, vocab_size %g, max_position_embeddings %g, "
                         "intermediate_size %g, rotary_pct %g, rotary_emb_base %g, "
                         "layer_norm_eps %g)",
                         what, L, H, A, V, P, F, pct, base, eps);
    if ((int64_t)H % (int64_t)A ||
        tpk_neox_rotary_dim((int64_t)H / (int64_t)A, (float)pct) < 2)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: hidden_size %g over num_attention_heads %g with rotary_pct %g: "
                         "expected whole heads with at least one rotated pair",
                         what, H, A, pct);
    const char *act = v[NACT].kind == 's' ? v[NACT].str : v[NACT].kind ? "" : "gelu";
    bool exact = !strcmp(act, "gelu"), tanh_form = !strcmp(act, "gelu_new") ||
                                                   !strcmp(act, "gelu_pytorch_tanh") ||
                                                   !strcmp(act, "gelu_fast");
    if (!exact && !tanh_form)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: hidden_act \"%s\": expected \"gelu\" (exact) or \"gelu_new\", "
                         "\"gelu_pytorch_tanh\", \"gelu_fast\" (the tanh form)",
                         what, *act ? act : "(not a string)");
    if (v[NPAR].kind && !v[NPAR].num)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: use_parallel_residual: expected true (tpk's GPT-NeoX block is the "
                         "parallel one)", what);
    if (v[NTIE].num)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: tie_word_embeddings: expected false (GPT-NeoX's head is untied)",
                         what);
    if (v[NAB].kind && !v[NAB].num)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: attention_bias: expected true (GPT-NeoX's projections have biases)",
                         what);
    if (v[NRS].kind && v[NRS].kind != 'z')
        return tpk__fail(
            ctx, TPK_ERR_UNSUPPORTED, fn,
            "%s: rope_scaling: expected null (tpk computes the unscaled rotary embedding)", what);
    cfg->layers = (int64_t)L, cfg->hidden = (int64_t)H, cfg->heads = (int64_t)A;
    cfg->vocab = (int64_t)V, cfg->positions = (int64_t)P, cfg->ffn = (int64_t)F;
    cfg->rotary_pct = (float)pct, cfg->rope_theta = (float)base, cfg->ln_eps = (float)eps;
    cfg->act = exact ? TPK_ACT_GELU : TPK_ACT_GELU_TANH;
    return TPK_OK;
}
/* tpk_F_config_read(ctx, dir, cfg) for every family F (tpk/models/families.h): dir/config.json
 * (of the checkpoint dir holds, tpk__hf_resolve) into *cfg, as tpk_F_config_parse. */
#define TPK__HF_CONFIG_READ(F, FF, TYPE, DROPOUT, TITLE)                                           \
    static inline tpk_status tpk_##F##_config_read(tpk_ctx *ctx, const char *dir,                  \
                                                   tpk_##F##_config *cfg) {                        \
        static const char *fn = "tpk_" #F "_config_read";                                          \
        char path[1200];                                                                           \
        uint8_t *b = NULL;                                                                         \
        size_t n = 0;                                                                              \
        if (ctx && !cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg: NULL");                      \
        TPK_TRY(tpk__config_load(ctx, fn, dir, path, sizeof path, &b, &n));                        \
        tpk_status s = tpk_##F##_config_parse(ctx, b, n, path, cfg);                               \
        free(b);                                                                                   \
        return s;                                                                                  \
    }
TPK__FAMILIES(TPK__HF_CONFIG_READ)
#undef TPK__HF_CONFIG_READ

/* The family of dir's checkpoint: config.json's model_type (one of the families',
 * tpk/models/families.h) into type[n]; any other (or none) is TPK_ERR_UNSUPPORTED naming it. */
static inline tpk_status tpk_hf_model_type(tpk_ctx *ctx, const char *dir, char *type, size_t n) {
    static const char *fn = "tpk_hf_model_type";
    char path[1200];
    uint8_t *b = NULL;
    size_t len = 0;
    if (ctx && (!type || !n)) return tpk__fail(ctx, TPK_ERR_ARG, fn, "type: NULL");
    TPK_TRY(tpk__config_load(ctx, fn, dir, path, sizeof path, &b, &len));
    static const char *const keys[] = {"model_type"};
    tpk__json_val v;
    tpk_status s = tpk__config_members(ctx, fn, b, len, path, keys, 1, &v);
    free(b);
    TPK_TRY(s);
    /* the families' model_type (tpk/models/families.h) */
#define TPK__MODEL_TYPE(f, F, type, dropout, title) type,
    static const char *const types[] = {TPK__FAMILIES(TPK__MODEL_TYPE)};
#undef TPK__MODEL_TYPE
    int nt = (int)(sizeof types / sizeof types[0]), k = 0;
    while (v.kind == 's' && k < nt && strcmp(v.str, types[k])) k++;
    if (v.kind != 's' || k == nt) {
        char want[160] = "";
        for (int i = 0; i < nt; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s\"%s\"",
                     i == 0 ? "" : i == nt - 1 ? " or " : ", ", types[i]);
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn, "%s: model_type %s%s%s: expected %s", path,
                         v.kind == 's' ? "\"" : "",
                         v.kind == 's' ? v.str
                         : v.kind      ? "(not a string)"
                                       : "missing",
                         v.kind == 's' ? "\"" : "", want);
    }
    snprintf(type, n, "%.31s", v.str); /* one of the families' */
    return TPK_OK;
}

/* ---- the checkpoint directory: replaced whole or not at all ---------------------------------- */

/* Whether a directory entry is one of a checkpoint's files, replaced and removed with it:
 * config.json, optim.safetensors, model*.safetensors (model.safetensors, Hugging Face's shards
 * model-K-of-N.safetensors), model.safetensors.index.json, and a killed writer's temporaries
 * "<one of these>.tmp.<pid>". Everything else in a checkpoint directory is the user's. */
static inline bool tpk__hf_ckpt_file(const char *name) {
    const char *t = strstr(name, ".tmp.");
    size_t n = t ? (size_t)(t - name) : strlen(name);
    if (t) {
        const char *d = t + 5;
        if (!*d) return false;
        for (; *d; d++)
            if (*d < '0' || *d > '9') return false;
    }
#define TPK__IS(lit) (n == sizeof(lit) - 1 && !strncmp(name, lit, n))
    return TPK__IS("config.json") || TPK__IS("optim.safetensors") ||
           TPK__IS("model.safetensors.index.json") ||
           (n >= 17 && !strncmp(name, "model", 5) && !strncmp(name + n - 12, ".safetensors", 12));
#undef TPK__IS
}

/* fsync a directory (its renames durable); EINVAL: a filesystem that cannot, accepted. */
static inline bool tpk__hf_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return false;
    bool ok = fsync(fd) == 0 || errno == EINVAL;
    close(fd);
    return ok;
}

/* Remove dir's checkpoint files (tpk__hf_ckpt_file), then dir when nothing else is in it; *kept
 * (may be NULL) tells whether dir stayed for the other entries. A missing dir: nothing to do. */
static inline tpk_status tpk__hf_remove(tpk_ctx *ctx, const char *fn, const char *dir, bool *kept) {
    DIR *d = opendir(dir);
    if (kept) *kept = false;
    if (!d)
        return errno == ENOENT
                   ? TPK_OK
                   : tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot list: %s", dir, strerror(errno));
    int others = 0;
    tpk_status s = TPK_OK;
    char path[1400];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (!tpk__hf_ckpt_file(e->d_name)) { others++; continue; }
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT && s == TPK_OK)
            s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot remove: %s", path, strerror(errno));
    }
    closedir(d);
    if (s == TPK_OK && !others && rmdir(dir) != 0)
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot remove: %s", dir, strerror(errno));
    if (kept) *kept = others > 0;
    return s;
}

/* Remove the checkpoint saved in dir: its files (config.json, model and optimizer files), then dir
 * when it holds nothing else; a user's other files, and dir with them, stay. For one rank (the
 * trainer's --keep uses it on world rank 0). A missing dir is not an error. */
static inline tpk_status tpk_hf_remove(tpk_ctx *ctx, const char *dir) {
    static const char *fn = "tpk_hf_remove";
    tpk__hf_paths p;
    if (!ctx) return TPK_ERR_ARG;
    if (!tpk__hf_paths_of(dir, &p))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "dir: expected a path of 1..1023 bytes");
    return tpk__hf_remove(ctx, fn, p.base, NULL);
}

/* Move every entry of `from` that is not a checkpoint file (a user's README, a Hugging Face
 * folder's tokenizer files, the trainer's step-N directories) into `to`, where none of that name
 * is. */
static inline tpk_status tpk__hf_carry(tpk_ctx *ctx, const char *fn, const char *from,
                                       const char *to) {
    DIR *d = opendir(from);
    if (!d) return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot list: %s", from, strerror(errno));
    tpk_status s = TPK_OK;
    char a[1400], b[1400];
    struct stat st;
    for (struct dirent *e; (e = readdir(d)) && s == TPK_OK;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || tpk__hf_ckpt_file(e->d_name))
            continue;
        snprintf(a, sizeof a, "%s/%s", from, e->d_name),
            snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        if (stat(b, &st) == 0) continue; /* `to` has its own: `from` keeps this one */
        if (rename(a, b) != 0)
            s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot move to %s: %s", a, b, strerror(errno));
    }
    closedir(d);
    return s;
}

/* Finish or undo what a stopped save left, before the next save (one rank): base missing and
 * base.tpk-old present: the old checkpoint renamed back; both present: the new checkpoint is in
 * place, the old one's other entries are carried into it and the rest removed; base.tpk-new (never
 * swapped in) removed. An old directory that cannot be emptied is an error naming it. */
static inline tpk_status tpk__hf_repair(tpk_ctx *ctx, const char *fn, const tpk__hf_paths *p) {
    struct stat st;
    bool base = stat(p->base, &st) == 0, old = stat(p->old, &st) == 0, kept = false;
    if (old && !base) {
        if (rename(p->old, p->base) != 0)
            return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot rename back to %s: %s", p->old,
                             p->base, strerror(errno));
        if (!tpk__hf_fsync_dir(p->parent))
            return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: fsync failed: %s", p->parent,
                             strerror(errno));
    } else if (old) {
        TPK_TRY(tpk__hf_carry(ctx, fn, p->old, p->base));
        TPK_TRY(tpk__hf_remove(ctx, fn, p->old, &kept));
        if (kept)
            return tpk__fail(
                ctx, TPK_ERR_IO, fn,
                "%s: left by an earlier save, holds entries %s also has: move or remove them",
                p->old, p->base);
    }
    TPK_TRY(tpk__hf_remove(ctx, fn, p->tmp, &kept));
    if (kept)
        return tpk__fail(ctx, TPK_ERR_IO, fn,
                         "%s: expected only a stopped save's files there (remove the directory)",
                         p->tmp);
    return TPK_OK;
}

/* ---- save ------------------------------------------------------------------------------------ */

/* Conv1D weights are stored [in, out] by Hugging Face, [out, in] here. */
static inline bool tpk__hf_is_conv1d(const tpk_param *p) {
    size_t n = strlen(p->name);
    return p->ndim == 2 && n > 7 && !strcmp(p->name + n - 7, ".weight") &&
           strncmp(p->name, "wte", 3) && strncmp(p->name, "wpe", 3) && !strstr(p->name, "ln_");
}
static inline void tpk__transpose(const float *in, float *out, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) out[j * rows + i] = in[i * cols + j];
}
/* text to path atomically: a temporary written, fsynced and renamed over path */
static inline tpk_status tpk__write_text_atomic(tpk_ctx *ctx, const char *fn, const char *path,
                                                const char *text) {
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
typedef tpk_gpt2_save_desc tpk_hf_save_desc;

/* A random 64-bit checkpoint id as 16 hex digits: /dev/urandom, or the time, the PID and an
 * address mixed where it cannot be read. */
static inline void tpk__hf_new_id(char out[17]) {
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    bool ok = fd >= 0 && read(fd, &x, sizeof x) == (ssize_t)sizeof x;
    if (fd >= 0) close(fd);
    if (!ok) {
        tpk_u32x4 r = tpk_philox((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32),
                                 (uint64_t)(uintptr_t)&x, (uint64_t)clock());
        x = (uint64_t)r.v[0] << 32 | r.v[1];
    }
    snprintf(out, 17, "%016llx", (unsigned long long)x);
}

/* Start a save at p (one rank): what a stopped save left repaired (tpk__hf_repair) and an empty
 * base.tpk-new made; base, when it exists, must be a directory. */
static inline tpk_status tpk__hf_begin(tpk_ctx *ctx, const char *fn, const tpk__hf_paths *p) {
    struct stat st;
    TPK_TRY(tpk__hf_repair(ctx, fn, p));
    if (stat(p->base, &st) == 0 && !S_ISDIR(st.st_mode))
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: exists and is not a directory", p->base);
    if (mkdir(p->tmp, 0755) != 0)
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot create: %s", p->tmp, strerror(errno));
    return TPK_OK;
}

/* Rank 0's part of a save: the files (the optimizer file when nopt > 0, the model file, then
 * config.json with a new tpk_checkpoint_id, also in each file's metadata) into base.tpk-new, each
 * fsynced; then swapped in: base (when it exists) renamed to base.tpk-old, base.tpk-new to base,
 * the parent fsynced, the old directory's other entries carried over, the old checkpoint removed.
 * A failure before the swap leaves base as it was. */
static inline tpk_status tpk__hf_commit(tpk_ctx *ctx, const char *fn, const tpk__hf_paths *p,
                                        const tpk_st_entry *e, int n, int nopt, int64_t step,
                                        const char *config) {
    char path[1100], stepstr[32], id[17], *text = (char *)malloc(strlen(config) + 64);
    if (!text) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "config.json's text");
    tpk__hf_new_id(id);
    size_t end = strlen(config);
    while (end && config[end - 1] != '}') end--; /* config's closing brace: the id goes before it */
    while (end > 1 && strchr(" \t\r\n", config[end - 2])) end--;
    bool empty = end > 1 && config[end - 2] == '{'; /* "{}": the id is the only member, no comma */
    snprintf(text, strlen(config) + 64, "%.*s%s\n  \"tpk_checkpoint_id\": \"%s\"\n}\n",
             end ? (int)end - 1 : 0, config, empty ? "" : ",", id);
    snprintf(stepstr, sizeof stepstr, "%lld", (long long)step);
    const char *meta[] = {"format", "pt", "step", stepstr, "tpk_checkpoint_id", id, NULL};
    const char *ometa[] = {"format", "tpk-adamw", "step", stepstr, "tpk_checkpoint_id", id, NULL};
    tpk_status s = TPK_OK;
    snprintf(path, sizeof path, "%s/optim.safetensors", p->tmp);
    if (nopt) s = tpk_st_write(ctx, path, e + n, nopt, ometa);
    snprintf(path, sizeof path, "%s/model.safetensors", p->tmp);
    if (s == TPK_OK) s = tpk_st_write(ctx, path, e, n, meta);
    snprintf(path, sizeof path, "%s/config.json", p->tmp);
    if (s == TPK_OK) s = tpk__write_text_atomic(ctx, fn, path, text);
    free(text);
    if (s == TPK_OK && !tpk__hf_fsync_dir(p->tmp))
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: fsync failed: %s", p->tmp, strerror(errno));
    if (s != TPK_OK) return s;
    struct stat st;
    bool had = stat(p->base, &st) == 0;
    if (had && rename(p->base, p->old) != 0)
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot rename to %s: %s", p->base, p->old,
                         strerror(errno));
    if (rename(p->tmp, p->base) != 0) {
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot rename to %s: %s", p->tmp, p->base,
                      strerror(errno));
        if (had) rename(p->old, p->base);
        return s;
    }
    if (!tpk__hf_fsync_dir(p->parent))
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: saved, but fsync of %s failed: %s", p->base,
                         p->parent, strerror(errno));
    if (!had) return TPK_OK;
    bool kept = false;
    TPK_TRY(tpk__hf_carry(ctx, fn, p->old, p->base));
    if (!tpk__hf_fsync_dir(p->base))
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: saved, but fsync failed: %s", p->base,
                         strerror(errno));
    TPK_TRY(tpk__hf_remove(ctx, fn, p->old, &kept));
    if (kept)
        return tpk__fail(ctx, TPK_ERR_IO, fn,
                         "%s: saved, but %s keeps entries %s also has: move or remove them",
                         p->base, p->old, p->base);
    if (!tpk__hf_fsync_dir(p->parent))
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: saved, but fsync of %s failed: %s", p->base,
                         p->parent, strerror(errno));
    return TPK_OK;
}

/* Pipeline stages: host values to or from pp rank `peer` (staged through backend memory where the
 * PP group's communicator takes device buffers). */
static inline tpk_status tpk__hf_pp_xfer(tpk_ctx *ctx, void *host, size_t n, tpk_dtype dt, int peer,
                                         bool send) {
    size_t bytes = n * tpk_dtype_size(dt);
    if (!ctx->pp.device || !bytes)
        return send ? tpk_send(ctx, &ctx->pp, host, n, dt, peer, 0)
                    : tpk_recv(ctx, &ctx->pp, host, n, dt, peer, 0);
    TPK_TRY(tpk__buf_reserve(ctx, &ctx->work[1], bytes));
    if (send) TPK_TRY(tpk_op_memcpy(ctx, ctx->work[1].p, host, bytes, TPK_H2D));
    TPK_TRY(send ? tpk_send(ctx, &ctx->pp, ctx->work[1].p, n, dt, peer, 0)
                 : tpk_recv(ctx, &ctx->pp, ctx->work[1].p, n, dt, peer, 0));
    return send ? TPK_OK : tpk_op_memcpy(ctx, host, ctx->work[1].p, bytes, TPK_D2H);
}

/* A checkpoint's tensors gathered from the pipeline stages: the model's entries and (k3 = 3) the
 * optimizer's, the buffers they point into. */
typedef struct tpk__hf_all {
    tpk_st_entry *e; /* [n] model, then [2 n] optimizer when with moments */
    int n;
    char (*names)[3][112];
    int64_t (*shapes)[2][2]; /* the model entry's (maybe transposed) and the optimizer's */
    float **data;            /* [3 n] */
} tpk__hf_all;
static inline void tpk__hf_all_free(tpk__hf_all *a) {
    for (int i = 0; a->data && i < 3 * a->n; i++) free(a->data[i]);
    free(a->e), free(a->names), free(a->shapes), free(a->data);
    memset(a, 0, sizeof *a);
}
/* Under pipeline stages (ctx->pp.size > 1), the leaders of the stages (TP and DP rank 0) send
 * their entries e[n] (model) and e[n + 2 i + k] (moments, when k3 = 3) — except the copies another
 * stage holds (pp_copy) — to stage 0's leader, world rank 0, which gathers all of them in stage
 * order into *all; the others send nothing. Per tensor: its header (ndim, the two shapes, the
 * name), then its data and moments. */
static inline tpk_status tpk__hf_save_stages(tpk_ctx *ctx, const char *fn, const tpk_st_entry *e,
                                             int n, int k3, tpk__hf_all *all) {
    memset(all, 0, sizeof *all);
    bool lead = ctx->tp.rank == 0 && ctx->dp.rank == 0, root = lead && ctx->pp.rank == 0;
    if (!lead) return TPK_OK;
    enum { HDR = 5 + 28 };
    int32_t hdr[HDR];
    if (!root) { /* a stage's leader: its tensors to the root */
        int32_t cnt = 0;
        for (int i = 0; i < n; i++) cnt += !ctx->params.list[i].pp_copy;
        TPK_TRY(tpk__hf_pp_xfer(ctx, &cnt, 1, TPK_I32, 0, true));
        for (int i = 0; i < n; i++) {
            if (ctx->params.list[i].pp_copy) continue;
            const tpk_st_entry *m = &e[i];
            memset(hdr, 0, sizeof hdr);
            hdr[0] = m->ndim, hdr[1] = (int32_t)m->shape[0],
            hdr[2] = m->ndim > 1 ? (int32_t)m->shape[1] : 0;
            hdr[3] = (int32_t)ctx->params.list[i].gshape[0],
            hdr[4] = m->ndim > 1 ? (int32_t)ctx->params.list[i].gshape[1] : 0;
            snprintf((char *)&hdr[5], 112, "%s", m->name);
            TPK_TRY(tpk__hf_pp_xfer(ctx, hdr, HDR, TPK_I32, 0, true));
            size_t gn = (size_t)hdr[1] * (size_t)(m->ndim > 1 ? hdr[2] : 1);
            for (int k = 0; k < k3; k++)
                TPK_TRY(tpk__hf_pp_xfer(ctx, (void *)(k ? e[n + 2 * i + k - 1].data : m->data), gn,
                                        TPK_F32, 0, true));
        }
        return TPK_OK;
    }
    int cap = n + 16; /* the root: its own, then each stage's in turn */
    all->e = (tpk_st_entry *)calloc((size_t)cap * 3, sizeof *all->e);
    all->names = (char(*)[3][112])calloc((size_t)cap, sizeof *all->names);
    all->shapes = (int64_t(*)[2][2])calloc((size_t)cap, sizeof *all->shapes);
    all->data = (float **)calloc((size_t)cap * 3, sizeof *all->data);
    if (!all->e || !all->names || !all->shapes || !all->data)
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the checkpoint's tables");
    tpk_status s = TPK_OK;
    for (int q = 0; q < ctx->pp.size && s == TPK_OK; q++) {
        int32_t cnt = 0;
        if (q == 0)
            for (int i = 0; i < n; i++) cnt += !ctx->params.list[i].pp_copy;
        else s = tpk__hf_pp_xfer(ctx, &cnt, 1, TPK_I32, q, false);
        for (int i = 0, j = 0; s == TPK_OK && j < cnt; i++) {
            if (q == 0 && ctx->params.list[i].pp_copy) continue;
            j++;
            if (all->n == cap) { /* grow the tables */
                int nc = 2 * cap;
                tpk_st_entry *ne = (tpk_st_entry *)realloc(all->e, sizeof *ne * (size_t)nc * 3);
                if (ne) all->e = ne;
                char(*nn)[3][112] =
                    ne ? (char(*)[3][112])realloc(all->names, sizeof *nn * (size_t)nc) : NULL;
                if (nn) all->names = nn;
                int64_t(*ns)[2][2] =
                    nn ? (int64_t(*)[2][2])realloc(all->shapes, sizeof *ns * (size_t)nc) : NULL;
                if (ns) all->shapes = ns;
                float **nd = ns ? (float **)realloc(all->data, sizeof *nd * (size_t)nc * 3) : NULL;
                if (!nd) {
                    s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the checkpoint's tables");
                    break;
                }
                all->data = nd, cap = nc;
            }
            int a = all->n;
            size_t gn;
            if (q == 0) {
                const tpk_param *p = &ctx->params.list[i];
                hdr[0] = e[i].ndim, hdr[1] = (int32_t)e[i].shape[0],
                hdr[2] = e[i].ndim > 1 ? (int32_t)e[i].shape[1] : 0;
                hdr[3] = (int32_t)p->gshape[0], hdr[4] = p->ndim > 1 ? (int32_t)p->gshape[1] : 0;
                snprintf((char *)&hdr[5], 112, "%s", e[i].name);
            } else {
                s = tpk__hf_pp_xfer(ctx, hdr, HDR, TPK_I32, q, false);
            }
            if (s != TPK_OK) break;
            ((char *)&hdr[5])[111] = 0;
            gn = (size_t)hdr[1] * (size_t)(hdr[0] > 1 ? hdr[2] : 1);
            for (int k = 0; k < k3 && s == TPK_OK; k++) {
                float *d = (float *)malloc(sizeof(float) * (gn ? gn : 1));
                all->data[3 * a + k] = d;
                if (!d) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
                else if (q == 0)
                    memcpy(d, k ? e[n + 2 * i + k - 1].data : e[i].data, sizeof(float) * gn);
                else s = tpk__hf_pp_xfer(ctx, d, gn, TPK_F32, q, false);
            }
            all->n++;
            snprintf(all->names[a][0], 112, "%.111s", (char *)&hdr[5]);
            for (int k = 1; k < 3; k++)
                snprintf(all->names[a][k], 112, "%.90s.%s", (char *)&hdr[5],
                         k == 2 ? "exp_avg_sq" : "exp_avg");
            all->shapes[a][0][0] = hdr[1], all->shapes[a][0][1] = hdr[2];
            all->shapes[a][1][0] = hdr[3], all->shapes[a][1][1] = hdr[4];
        }
    }
    if (s != TPK_OK) return s;
    tpk_st_entry *m = all->e; /* the model's entries, then the moments' */
    for (int a = 0; a < all->n; a++) {
        m[a].name = all->names[a][0], m[a].dtype = TPK_ST_F32,
        m[a].ndim = all->shapes[a][0][1] ? 2 : 1;
        m[a].shape = all->shapes[a][0], m[a].data = all->data[3 * a];
        for (int k = 0; k < 2 && k3 == 3; k++) {
            tpk_st_entry *o = &m[all->n + 2 * a + k];
            o->name = all->names[a][1 + k], o->dtype = TPK_ST_F32, o->ndim = m[a].ndim;
            o->shape = all->shapes[a][1], o->data = all->data[3 * a + 1 + k];
        }
    }
    return TPK_OK;
}

/* Save every registered parameter (and opt's moments when opt is not NULL) to dir, replacing
 * what dir held as one checkpoint (tpk__hf_commit), with config (config.json's text, written
 * last). transposed(p): the parameter is stored [in, out] (GPT-2's Conv1D), else as registered.
 * Collective over ctx->world. */
static inline tpk_status tpk__hf_save(tpk_ctx *ctx, const char *fn, const tpk_adamw *opt,
                                      const char *dir, int64_t step, const char *config,
                                      bool (*transposed)(const tpk_param *)) {
    bool root = ctx->world->rank == 0, made = false;
    tpk_status s = TPK_OK;
    tpk__hf_paths p;
    if (!tpk__hf_paths_of(dir, &p))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "dir \"%.40s\": expected a path of 1..1023 bytes",
                         dir);
    const char *last = strrchr(p.base, '/')
                           ? strrchr(p.base, '/') + 1
                           : p.base; /* replaced by rename: a name, not "." or ".." or "/" */
    if (!strcmp(last, ".") || !strcmp(last, "..") || !*last)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "dir \"%s\": expected a path ending in the checkpoint directory's name, not \"%s\"",
            p.base, *last ? last : "/");
    if (root) s = tpk__hf_begin(ctx, fn, &p);
    if (tpk_agree(ctx, ctx->world, s) != TPK_OK)
        return s != TPK_OK ? s
                           : tpk__fail(ctx, TPK_ERR_IO, fn,
                                       "%s: cannot create the checkpoint directory", dir);
    float *om = NULL, *ov = NULL; /* the whole moments (ZeRO-1: gathered over DP) */
    if (opt) TPK_TRY(tpk__adamw_whole(ctx, opt, true, &om, &ov, &made));
    int n = ctx->params.n, k3 = opt ? 3 : 1;
    float **w = (float **)calloc((size_t)n * 3, sizeof *w);
    tpk_st_entry *e = (tpk_st_entry *)calloc((size_t)n * 3, sizeof *e);
    int64_t(*shapes)[2] = (int64_t(*)[2])calloc((size_t)n, sizeof *shapes);
    char(*names)[2][112] = (char(*)[2][112])calloc((size_t)n, sizeof *names);
    if (!w || !e || !shapes || !names)
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the checkpoint's tables");
    for (int i = 0; i < n && s == TPK_OK; i++) {
        const tpk_param *p = &ctx->params.list[i];
        size_t gn = tpk_param_global_numel(ctx, i);
        const float *flat[3] = {(const float *)ctx->params.data.p, om, ov};
        for (int k = 0; k < k3 && s == TPK_OK; k++) {
            if (!(w[3 * i + k] = (float *)malloc(sizeof(float) * (gn ? gn : 1))))
                s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
            else s = tpk_param_gather(ctx, i, flat[k], w[3 * i + k]); /* collective over TP */
        }
        if (s != TPK_OK) break;
        if (transposed && transposed(p)) { /* stored [in, out] in the model file */
            float *t = (float *)malloc(sizeof(float) * (gn ? gn : 1));
            if (!t) { s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn); break; }
            tpk__transpose(w[3 * i], t, p->gshape[0], p->gshape[1]);
            free(w[3 * i]), w[3 * i] = t;
            shapes[i][0] = p->gshape[1], shapes[i][1] = p->gshape[0];
        } else {
            shapes[i][0] = p->gshape[0], shapes[i][1] = p->ndim > 1 ? p->gshape[1] : 0;
        }
        e[i].name = p->name, e[i].dtype = TPK_ST_F32, e[i].ndim = p->ndim, e[i].shape = shapes[i],
        e[i].data = w[3 * i];
        for (int k = 0; k < 2 && opt; k++) {
            snprintf(names[i][k], sizeof names[i][k], "%s.%s", p->name,
                     k ? "exp_avg_sq" : "exp_avg");
            tpk_st_entry *o = &e[n + 2 * i + k];
            o->name = names[i][k], o->dtype = TPK_ST_F32, o->ndim = p->ndim, o->shape = p->gshape,
            o->data = w[3 * i + 1 + k];
        }
    }
    tpk__hf_all staged; /* under pipeline stages: every stage's tensors, on world rank 0 */
    memset(&staged, 0, sizeof staged);
    if (ctx->pp.size > 1) { /* once every rank has its own */
        s = tpk_agree(ctx, ctx->world, s);
        if (s == TPK_OK) s = tpk__hf_save_stages(ctx, fn, e, n, k3, &staged);
    }
    if (s == TPK_OK && root)
        s = ctx->pp.size > 1 ? tpk__hf_commit(ctx, fn, &p, staged.e, staged.n,
                                              opt ? 2 * staged.n : 0, step, config)
                             : tpk__hf_commit(ctx, fn, &p, e, n, opt ? 2 * n : 0, step, config);
    tpk__hf_all_free(&staged);
    /* a save stopped before its swap: its files go */
    if (s != TPK_OK && root) tpk__hf_remove(NULL, fn, p.tmp, NULL);
    for (int i = 0; w && i < 3 * n; i++) free(w[i]);
    free(w), free(e), free(shapes), free(names);
    if (made) tpk_op_free(ctx, om), tpk_op_free(ctx, ov);
    tpk_status all = tpk_agree(ctx, ctx->world, s);
    if (all != TPK_OK && s == TPK_OK)
        return tpk__fail(ctx, all, fn, "%s: writing the checkpoint failed on another rank", dir);
    return s;
}

/* A family save's arguments: the model initialised (have), dir, and the descriptor into *d
 * (desc NULL: zeros). */
static inline tpk_status tpk__hf_save_args(tpk_ctx *ctx, const char *fn, bool have, const char *dir,
                                           const tpk_hf_save_desc *desc, tpk_hf_save_desc *d) {
    memset(d, 0, sizeof *d);
    if (!ctx) return TPK_ERR_ARG;
    if (!have || !dir) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    if (desc) *d = *desc;
    return TPK_OK;
}

/* Save the model (and opt's moments when opt is not NULL) to dir. Collective over ctx->world. */
static inline tpk_status tpk_gpt2_save(tpk_ctx *ctx, const tpk_gpt2 *m, const tpk_adamw *opt,
                                       const char *dir, const tpk_gpt2_save_desc *desc) {
    static const char *fn = "tpk_gpt2_save";
    tpk_hf_save_desc d;
    TPK_TRY(tpk__hf_save_args(ctx, fn, m && m->h, dir, desc, &d));
    char cfg[1400];
    const tpk_gpt2_config *c = &m->c;
    snprintf(
        cfg, sizeof cfg,
        "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  "
        "\"vocab_size\": %lld,\n  \"n_positions\": %lld,\n"
        "  \"n_ctx\": %lld,\n  \"n_embd\": %lld,\n  \"n_layer\": %lld,\n  \"n_head\": %lld,\n  "
        "\"n_inner\": null,\n"
        "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": %g,\n  "
        "\"resid_pdrop\": %g,\n  \"embd_pdrop\": %g,\n"
        "  \"attn_pdrop\": %g,\n  \"tie_word_embeddings\": true,\n  \"tpk_step\": %lld,\n  "
        "\"tpk_seed\": %llu\n}\n",
        (long long)c->vocab, (long long)c->positions, (long long)c->positions, (long long)c->hidden,
        (long long)c->layers, (long long)c->heads, (double)(c->ln_eps > 0 ? c->ln_eps : 1e-5f),
        (double)c->dropout, (double)c->dropout, (double)c->dropout, (long long)d.step,
        (unsigned long long)d.seed);
    return tpk__hf_save(ctx, fn, opt, dir, d.step, cfg, tpk__hf_is_conv1d);
}

/* The shortest %g text of f that reads back as the same float (1e-06, not 9.99999997e-07). */
static inline const char *tpk__float_text(float f, char *buf, size_t n) {
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, n, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return buf;
}

/* Save a Llama (and opt's moments when opt is not NULL) to dir in Hugging Face's LlamaForCausalLM
 * layout: config.json (model_type "llama"), model.safetensors with every tensor [out, in]
 * (lm_head.weight absent when tied). Collective over ctx->world. */
static inline tpk_status tpk_llama_save(tpk_ctx *ctx, const tpk_llama *m, const tpk_adamw *opt,
                                        const char *dir, const tpk_hf_save_desc *desc) {
    static const char *fn = "tpk_llama_save";
    tpk_hf_save_desc d;
    TPK_TRY(tpk__hf_save_args(ctx, fn, m && m->layers, dir, desc, &d));
    char cfg[1400], e1[32], e2[32];
    const tpk_llama_config *c = &m->c;
    snprintf(
        cfg, sizeof cfg,
        "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  "
        "\"vocab_size\": %lld,\n"
        "  \"max_position_embeddings\": %lld,\n  \"hidden_size\": %lld,\n  \"intermediate_size\": "
        "%lld,\n  \"num_hidden_layers\": %lld,\n"
        "  \"num_attention_heads\": %lld,\n  \"num_key_value_heads\": %lld,\n  \"head_dim\": "
        "%lld,\n  \"hidden_act\": \"silu\",\n"
        "  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n  \"rope_scaling\": null,\n  "
        "\"attention_bias\": false,\n  \"mlp_bias\": false,\n"
        "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"float32\",\n  \"tpk_step\": %lld,\n  "
        "\"tpk_seed\": %llu\n}\n",
        (long long)c->vocab, (long long)c->positions, (long long)c->hidden, (long long)c->ffn,
        (long long)c->layers, (long long)c->heads, (long long)c->kv_heads,
        (long long)(c->hidden / c->heads), tpk__float_text(c->norm_eps, e1, sizeof e1),
        tpk__float_text(c->rope_theta, e2, sizeof e2), c->tie_embeddings ? "true" : "false",
        (long long)d.step, (unsigned long long)d.seed);
    return tpk__hf_save(ctx, fn, opt, dir, d.step, cfg, NULL);
}

/* Save a GPT-NeoX (and opt's moments when opt is not NULL) to dir in Hugging Face's
 * GPTNeoXForCausalLM layout: config.json (model_type "gpt_neox", hidden_act "gelu" or "gelu_new"),
 * model.safetensors with every tensor [out, in] (query_key_value's rows per head, as tpk holds
 * them). Collective over ctx->world. */
static inline tpk_status tpk_neox_save(tpk_ctx *ctx, const tpk_neox *m, const tpk_adamw *opt,
                                       const char *dir, const tpk_hf_save_desc *desc) {
    static const char *fn = "tpk_neox_save";
    tpk_hf_save_desc d;
    TPK_TRY(tpk__hf_save_args(ctx, fn, m && m->layers, dir, desc, &d));
    char cfg[1600], e1[32], e2[32], e3[32];
    const tpk_neox_config *c = &m->c;
    tpk__float_text(c->rotary_pct, e3, sizeof e3);
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"GPTNeoXForCausalLM\"],\n  \"model_type\": \"gpt_neox\",\n"
             "  \"vocab_size\": %lld,\n  \"max_position_embeddings\": %lld,\n"
             "  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
             "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
             "  \"rotary_pct\": %s,\n  \"partial_rotary_factor\": %s,\n"
             "  \"rotary_emb_base\": %s,\n  \"rope_theta\": %s,\n  \"rope_scaling\": null,\n"
             "  \"hidden_act\": \"%s\",\n  \"layer_norm_eps\": %s,\n"
             "  \"use_parallel_residual\": true,\n  \"attention_bias\": true,\n"
             "  \"hidden_dropout\": %g,\n  \"attention_dropout\": %g,\n"
             "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"float32\",\n"
             "  \"tpk_step\": %lld,\n  \"tpk_seed\": %llu\n}\n",
             (long long)c->vocab, (long long)c->positions, (long long)c->hidden,
             (long long)c->ffn, (long long)c->layers, (long long)c->heads, e3, e3,
             tpk__float_text(c->rope_theta, e1, sizeof e1), e1,
             c->act == TPK_ACT_GELU_TANH ? "gelu_new" : "gelu",
             tpk__float_text(c->ln_eps, e2, sizeof e2), (double)c->dropout, (double)c->dropout,
             (long long)d.step, (unsigned long long)d.seed);
    return tpk__hf_save(ctx, fn, opt, dir, d.step, cfg, NULL);
}

/* ---- load ------------------------------------------------------------------------------------ */

/* The model's files: model.safetensors, or Hugging Face's shards model-K-of-N.safetensors named
 * by model.safetensors.index.json's weight_map ({"tensor name": "file", ...}). */
typedef struct tpk__hf_files {
    int n;
    char (*file)[128];    /* [n] distinct file names */
    tpk_st_file *st;      /* [n] read on first use */
    bool *open;
    int nmap;
    char (*tensor)[256];  /* [nmap] weight_map: tensor -> file index */
    int *which;
    const char **byname;  /* [nmap] the rows of tensor sorted by name: tpk__hf_find's binary
                             search */
} tpk__hf_files;

static inline void tpk__hf_files_close(tpk__hf_files *f) {
    for (int i = 0; f->open && i < f->n; i++)
        if (f->open[i]) tpk_st_close(&f->st[i]);
    free(f->file), free(f->st), free(f->open), free(f->tensor), free(f->which),
        free((void *)f->byname);
    memset(f, 0, sizeof *f);
}

/* dir's index file into f (no index: the one file model.safetensors). */
static inline tpk_status tpk__hf_index(tpk_ctx *ctx, const char *fn, const char *dir,
                                       tpk__hf_files *f) {
    char path[1200];
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) != 0) {
        f->n = 1, f->file = (char(*)[128])calloc(1, 128),
        f->st = (tpk_st_file *)calloc(1, sizeof *f->st), f->open = (bool *)calloc(1, 1);
        if (!f->file || !f->st || !f->open)
            return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the file table");
        snprintf(f->file[0], 128, "model.safetensors");
        return TPK_OK;
    }
    uint8_t *b = NULL;
    size_t n = 0;
    TPK_TRY(tpk__read_file(ctx, fn, path, &b, &n));
    static const char *const keys[] = {"weight_map"};
    tpk__json_val v;
    tpk_status s = tpk__config_members(ctx, fn, b, n, path, keys, 1, &v);
    if (s == TPK_OK && (v.kind != 'o' || b[v.at] != '{'))
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: expected an object \"weight_map\"", path);
    tpk__st_json j;
    memset(&j, 0, sizeof j);
    j.start = b, j.end = b + n, j.ctx = ctx, j.fn = fn, j.what = path;
    for (int pass = 0; pass < 2 && s == TPK_OK; pass++) { /* count, then fill */
        j.p = b + v.at + 1;
        int m = 0, k = 0;
        if (pass) {
            f->tensor = (char(*)[256])calloc((size_t)(f->nmap ? f->nmap : 1), 256),
            f->which = (int *)calloc((size_t)(f->nmap ? f->nmap : 1), sizeof(int));
            f->file = (char(*)[128])calloc((size_t)(f->nmap ? f->nmap : 1), 128);
            if (!f->tensor || !f->which || !f->file) {
                s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the weight map");
                break;
            }
        }
        if (!tpk__st_eat(&j, '}')) do {
            char name[256], file[128];
            size_t len;
            if ((s = tpk__st_string(&j, "weight_map: key", name, sizeof name, &len)) != TPK_OK)
                break;
            if (len >= sizeof name) {
                s = tpk__st_bad(&j, "weight_map: a tensor name longer than %zu bytes",
                                sizeof name - 1);
                break;
            }
            if (!tpk__st_eat(&j, ':')) { s = tpk__st_bad(&j, "weight_map: expected ':'"); break; }
            if ((s = tpk__st_string(&j, "weight_map: file", file, sizeof file, &len)) != TPK_OK)
                break;
            if (len >= sizeof file || len < 13 || strchr(file, '/') ||
                strcmp(file + len - 12, ".safetensors") || file[0] == '.') {
                s = tpk__st_bad(
                    &j,
                    "weight_map: \"%.100s\": expected a file name ending in .safetensors in the "
                    "same directory",
                    file);
                break;
            }
            if (pass) {
                int q = 0;
                while (q < f->n && strcmp(f->file[q], file)) q++;
                if (q == f->n) snprintf(f->file[f->n++], 128, "%s", file);
                snprintf(f->tensor[k], 256, "%s", name), f->which[k] = q;
            }
            k++;
        } while ((m = tpk__st_next(&j, '}', "weight_map")) == 1);
        if (s == TPK_OK && m < 0) s = TPK_ERR_FORMAT;
        f->nmap = k;
    }
    free(b);
    const char *dup = NULL;
    if (s == TPK_OK &&
        !(f->byname = (const char **)malloc(sizeof(char *) * (size_t)(f->nmap ? f->nmap : 1))))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the weight map");
    for (int k = 0; s == TPK_OK && k < f->nmap; k++) f->byname[k] = f->tensor[k];
    if (s == TPK_OK && tpk__st_has_dup(f->byname, (size_t)f->nmap, &dup)) /* sorts byname */
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                      "%s: weight_map: the tensor \"%.200s\" appears twice", path, dup);
    if (s == TPK_OK && !(f->st = (tpk_st_file *)calloc((size_t)(f->n ? f->n : 1), sizeof *f->st)))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the file table");
    if (s == TPK_OK && !(f->open = (bool *)calloc((size_t)(f->n ? f->n : 1), 1)))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the file table");
    if (s != TPK_OK) tpk__hf_files_close(f);
    return s;
}

/* The tensor `name` of dir's model files (NULL if absent); *file its file. */
static inline tpk_status tpk__hf_find(tpk_ctx *ctx, const char *fn, const char *dir,
                                      tpk__hf_files *f, const char *name, const tpk_st_tensor **t,
                                      tpk_st_file **file) {
    int q = 0;
    *t = NULL;
    if (f->tensor) { /* sharded: the index names the file */
        int lo = 0, hi = f->nmap, k = -1;
        while (lo < hi && k < 0) {
            int mid = lo + (hi - lo) / 2, c = strcmp(f->byname[mid], name);
            if (!c)
                k = (int)((const char(*)[256])(const void *)f->byname[mid] -
                          (const char(*)[256])f->tensor); /* its row */
            else if (c < 0) lo = mid + 1;
            else hi = mid;
        }
        if (k < 0) return TPK_OK;
        q = f->which[k];
    }
    if (!f->open[q]) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dir, f->file[q]);
        TPK_TRY(tpk_st_read(ctx, path, &f->st[q]));
        f->open[q] = true;
    }
    *t = tpk_st_find(&f->st[q], name), *file = &f->st[q];
    if (!*t && f->tensor)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s/%s: no tensor \"%s\" (model.safetensors.index.json puts it there)",
                         dir, f->file[q], name);
    return TPK_OK;
}

/* A step as written in a checkpoint ("step" metadata, tpk_step): a whole number 0..10^18 in
 * decimal digits, nothing else. */
static inline bool tpk__hf_step_text(const char *t, int64_t *out) {
    int64_t v = 0;
    if (!t || !*t || strlen(t) > 18) return false;
    for (const char *c = t; *c; c++) {
        if (*c < '0' || *c > '9') return false;
        v = 10 * v + (*c - '0');
    }
    *out = v;
    return true;
}

/* What a checkpoint's files say about themselves: a file's name, its step and its checkpoint id
 * (each NULL when the file does not say). */
typedef struct tpk__hf_stamp {
    const char *file, *key, *step, *id; /* key: the step's name there ("step", "tpk_step") */
} tpk__hf_stamp;

/* The stamps of one checkpoint's files (config.json first) must agree: each step a whole number,
 * every step given the same, every id given the same (files without an id: Hugging Face's, older
 * tpk's, accepted). *step: the step they give (0 when none does). */
static inline tpk_status tpk__hf_stamps_agree(tpk_ctx *ctx, const char *fn, const char *dir,
                                              const tpk__hf_stamp *st, int n, int64_t *step) {
    int first_step = -1, first_id = -1;
    *step = 0;
    for (int k = 0; k < n; k++) {
        if (st[k].step) {
            int64_t v;
            if (!tpk__hf_step_text(st[k].step, &v))
                return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                                 "%s/%s: %s \"%.40s\": expected a whole number", dir, st[k].file,
                                 st[k].key, st[k].step);
            if (first_step < 0) first_step = k, *step = v;
            else if (strcmp(st[k].step, st[first_step].step))
                return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                                 "%s: %s (%s %s) does not belong to %s (%s %s)", dir, st[k].file,
                                 st[k].key, st[k].step, st[first_step].file, st[first_step].key,
                                 st[first_step].step);
        }
        if (st[k].id) {
            if (first_id < 0) first_id = k;
            else if (strcmp(st[k].id, st[first_id].id))
                return tpk__fail(
                    ctx, TPK_ERR_FORMAT, fn,
                    "%s: %s (tpk_checkpoint_id %.40s) does not belong to %s (tpk_checkpoint_id "
                    "%.40s): files of two checkpoints",
                    dir, st[k].file, st[k].id, st[first_id].file, st[first_id].id);
        }
    }
    return TPK_OK;
}

/* The first element of w[n] that is not finite (or, `nonneg`, negative) as an error naming the
 * tensor `name` of `file` and the element; TPK_OK when there is none. */
static inline tpk_status tpk__hf_finite(tpk_ctx *ctx, const char *fn, const char *file,
                                        const char *name, const float *w, size_t n, bool nonneg) {
    for (size_t j = 0; j < n; j++)
        if (!isfinite(w[j]) || (nonneg && w[j] < 0))
            return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                             "%s: tensor \"%s\": element %zu is %g: expected a finite%s value",
                             file, name, j, (double)w[j], nonneg ? ", non-negative" : "");
    return TPK_OK;
}

/* Whether the model-file tensor `name` is accounted for by the model: a parameter (sorted[n], also
 * under the prefix alt) or a buffer Hugging Face's files carry and tpk computes itself (the causal
 * masks: GPT-2's attn.bias and attn.masked_bias, GPT-NeoX's attention.bias and
 * attention.masked_bias in files of older transformers versions; the rotary frequencies
 * rotary_emb.inv_freq of Llama and GPT-NeoX). */
static inline bool tpk__hf_known(const char *name, const char *const *sorted, int n,
                                 const char *alt) {
    static const char *const buffers[] = {".attn.bias", ".attn.masked_bias", ".attention.bias",
                                          ".attention.masked_bias", ".rotary_emb.inv_freq"};
    size_t len = strlen(name);
    for (int k = 0; k < (int)(sizeof buffers / sizeof buffers[0]); k++) {
        size_t b = strlen(buffers[k]);
        if (len > b && !strcmp(name + len - b, buffers[k])) return true;
    }
    if (alt && !strncmp(name, alt, strlen(alt))) name += strlen(alt);
    return bsearch(&name, sorted, (size_t)n, sizeof *sorted, tpk__st_strcmp) != NULL;
}

/* GPT-2's lm_head.weight, which Hugging Face's files may carry beside wte.weight: tpk ties the two,
 * so it must equal the embedding as loaded (wte[n]), else an error naming it. */
static inline tpk_status tpk__hf_tied_head(tpk_ctx *ctx, const char *fn, const char *dir,
                                           tpk__hf_files *files, const float *wte, size_t n) {
    const tpk_st_tensor *t = NULL;
    tpk_st_file *tf = NULL;
    TPK_TRY(tpk__hf_find(ctx, fn, dir, files, "lm_head.weight", &t, &tf));
    if (!t) return TPK_OK;
    float *h = (float *)malloc(sizeof(float) * (n ? n : 1));
    if (!h) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", n);
    tpk_status s = tpk_st_numel(t) == (int64_t)n ? tpk_st_get_f32(ctx, tf, t, h, n) : TPK_ERR_SHAPE;
    if (s == TPK_OK && memcmp(h, wte, sizeof(float) * n)) s = TPK_ERR_FORMAT;
    free(h);
    if (s == TPK_ERR_SHAPE || s == TPK_ERR_FORMAT)
        return tpk__fail(
            ctx, s, fn,
            "%s: \"lm_head.weight\" differs from \"wte.weight\": tpk's GPT-2 ties the head to the "
            "embedding (an untied head is not loaded)",
            dir);
    return s;
}

/* Every tensor of dir's model files (files: each name in the index, or model.safetensors's) and of
 * the optimizer file (of, when given: "<parameter>.exp_avg" and ".exp_avg_sq") accounted for by the
 * model, else an error naming the first that is not: a file with more layers than config.json, an
 * lm_head.weight beside tie_word_embeddings true. Under pipeline stages a tensor is accounted for
 * when some stage has it: each stage marks its own, and the marks are combined over ctx->pp (a
 * collective: every rank calls it, `mine` its status so far, which it returns when failing). */
static inline tpk_status tpk__hf_all_known(tpk_ctx *ctx, const char *fn, const char *dir,
                                           const tpk__hf_files *files, const tpk_st_file *of,
                                           const char *alt, tpk_status mine) {
    int n = ctx->params.n, total = files->tensor ? files->nmap : files->st[0].n,
        nopt = of ? of->n : 0;
    const char **sorted = (const char **)malloc(sizeof(char *) * (size_t)(n ? n : 1));
    int32_t *known = (int32_t *)calloc((size_t)(total + nopt + 1), sizeof(int32_t));
    tpk_status s = mine;
    if ((!sorted || !known) && s == TPK_OK)
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the parameter names");
    for (int i = 0; sorted && i < n; i++) sorted[i] = ctx->params.list[i].name;
    if (sorted && n > 1) qsort(sorted, (size_t)n, sizeof *sorted, tpk__st_strcmp);
    for (int k = 0; s == TPK_OK && k < total; k++) {
        const char *name = files->tensor ? files->tensor[k] : files->st[0].tensors[k].name;
        known[k] = tpk__hf_known(name, sorted, n, alt) || (alt && !strcmp(name, "lm_head.weight"));
    }
    for (int k = 0; s == TPK_OK && k < nopt; k++) {
        char base[256];
        const char *name = of->tensors[k].name, *dot = strrchr(name, '.');
        snprintf(base, sizeof base, "%.*s", dot ? (int)(dot - name) : 0, name);
        const char *key = base;
        known[total + k] = dot && (!strcmp(dot, ".exp_avg") || !strcmp(dot, ".exp_avg_sq")) &&
                           bsearch(&key, sorted, (size_t)n, sizeof *sorted, tpk__st_strcmp);
    }
    if (ctx->pp.size > 1 && known) { /* every rank of the pipeline takes part, failed or not */
        tpk_status c =
            tpk_allreduce_host(ctx, &ctx->pp, known, (size_t)(total + nopt), TPK_I32, TPK_MAX);
        if (s == TPK_OK) s = c;
    }
    const char *extra = NULL,
               *where = files->tensor ? "model.safetensors.index.json" : "model.safetensors";
    for (int k = 0; s == TPK_OK && k < total + nopt && !extra; k++)
        if (!known[k]) {
            extra = k < total ? (files->tensor ? files->tensor[k] : files->st[0].tensors[k].name)
                              : of->tensors[k - total].name;
            if (k >= total) where = "optim.safetensors";
        }
    free(sorted), free(known);
    if (s == TPK_OK && extra)
        return tpk__fail(
            ctx, TPK_ERR_FORMAT, fn,
            "%s/%s: tensor \"%s\" is not a parameter of the model config.json describes (a layer "
            "beyond its count, a head it ties?)",
            dir, where, extra);
    return s;
}

/* Set every parameter (and, when opt is given, the moments and opt->step) from dir:
 * model.safetensors or its shards, optim.safetensors. Refused, naming the file and what is wrong: a
 * tensor missing, mis-shaped, not finite, or not accounted for by the model; steps that are not
 * whole numbers or disagree between config.json, the model files and the optimizer file; checkpoint
 * ids that differ. No optimizer file: opt->step = the checkpoint's step, the moments as they were
 * (fresh). `alt`: a prefix a name may also carry ("transformer." for GPT-2, whose lm_head.weight,
 * when present, must equal wte.weight). */
static inline tpk_status tpk__hf_load(tpk_ctx *ctx, const char *fn, tpk_adamw *opt,
                                      const char *dir_in, bool (*transposed)(const tpk_param *),
                                      const char *alt) {
    char path[1300], dir[1100];
    tpk_st_file of;
    tpk__hf_files files;
    memset(&of, 0, sizeof of);
    tpk__hf_resolve(dir_in, dir, sizeof dir);
    /* config.json's step and id */
    uint8_t *cb = NULL;
    size_t cn = 0;
    TPK_TRY(tpk__config_load(ctx, fn, dir, path, sizeof path, &cb, &cn));
    static const char *const ckeys[] = {"tpk_step", "tpk_checkpoint_id"};
    tpk__json_val cv[2];
    char cstep[40] = "";
    tpk_status s = tpk__config_members(ctx, fn, cb, cn, path, ckeys, 2, cv);
    free(cb);
    TPK_TRY(s);
    if (cv[0].kind && (cv[0].kind != 'n' || !(cv[0].num >= 0 && cv[0].num <= 1e18) ||
                       cv[0].num != floor(cv[0].num)))
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: tpk_step: expected a whole number", path);
    if (cv[0].kind) snprintf(cstep, sizeof cstep, "%.0f", cv[0].num);
    if (cv[1].kind && cv[1].kind != 's')
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: tpk_checkpoint_id: expected a string", path);
    TPK_TRY(tpk__hf_index(ctx, fn, dir, &files));
    snprintf(path, sizeof path, "%s/optim.safetensors", dir);
    bool have_opt = opt && access(path, F_OK) == 0, made = false;
    float *om = NULL, *ov = NULL, *wte = NULL; /* the whole moments (ZeRO-1: made here, this rank's
                                                  slice kept at the end) */
    size_t nwte = 0;
    s = have_opt ? tpk_st_read(ctx, path, &of) : TPK_OK;
    if (s == TPK_OK && have_opt) s = tpk__adamw_whole(ctx, opt, false, &om, &ov, &made);
    for (int i = 0; i < ctx->params.n && s == TPK_OK; i++) {
        const tpk_param *p = &ctx->params.list[i];
        char altname[160];
        const tpk_st_tensor *t = NULL;
        tpk_st_file *tf = NULL;
        s = tpk__hf_find(ctx, fn, dir, &files, p->name, &t, &tf);
        if (s == TPK_OK && !t && alt) {
            snprintf(altname, sizeof altname, "%s%s", alt, p->name);
            s = tpk__hf_find(ctx, fn, dir, &files, altname, &t, &tf);
        }
        if (s != TPK_OK) break;
        if (!t) {
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s/%s: no tensor \"%s\"", dir,
                          files.tensor ? "model.safetensors.index.json" : "model.safetensors",
                          p->name);
            break;
        }
        bool conv = transposed && transposed(p);
        int64_t want[2] = {conv ? p->gshape[1] : p->gshape[0],
                           conv ? p->gshape[0] : (p->ndim > 1 ? p->gshape[1] : 0)};
        if (t->ndim != p->ndim || t->shape[0] != want[0] ||
            (p->ndim > 1 && t->shape[1] != want[1])) {
            s = tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                          "%s: \"%s\" has shape [%lld%s%lld], config.json implies [%lld%s%lld]",
                          dir, t->name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                          t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)want[0],
                          p->ndim > 1 ? ", " : "", p->ndim > 1 ? (long long)want[1] : 0LL);
            break;
        }
        size_t gn = tpk_param_global_numel(ctx, i);
        float *w = (float *)malloc(sizeof(float) * (gn ? gn : 1)),
              *tw = conv ? (float *)malloc(sizeof(float) * (gn ? gn : 1)) : NULL;
        if (!w || (conv && !tw)) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
        snprintf(path, sizeof path, "%s/%s", dir, files.file[tf - files.st]);
        if (s == TPK_OK) s = tpk_st_get_f32(ctx, tf, t, w, gn);
        if (s == TPK_OK) s = tpk__hf_finite(ctx, fn, path, t->name, w, gn, false);
        if (s == TPK_OK && alt && !strcmp(p->name, "wte.weight")) { /* kept for a tied
                                                                       lm_head.weight's check */
            if ((wte = (float *)malloc(sizeof(float) * (gn ? gn : 1))))
                memcpy(wte, w, sizeof(float) * gn), nwte = gn;
            else s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
        }
        if (s == TPK_OK && conv) tpk__transpose(w, tw, want[0], want[1]);
        if (s == TPK_OK) s = tpk_param_set_global(ctx, i, conv ? tw : w);
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        for (int k = 0; k < 2 && have_opt && s == TPK_OK; k++) {
            char on[160];
            snprintf(on, sizeof on, "%s.%s", p->name, k ? "exp_avg_sq" : "exp_avg");
            const tpk_st_tensor *ot = tpk_st_find(&of, on);
            if (!ot) s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: no tensor \"%s\"", path, on);
            if (s == TPK_OK) s = tpk_st_get_f32(ctx, &of, ot, w, gn);
            if (s == TPK_OK) s = tpk__hf_finite(ctx, fn, path, on, w, gn, k == 1);
            if (s == TPK_OK) s = tpk_param_scatter(ctx, i, w, k ? ov : om);
        }
        free(w), free(tw);
    }
    s = tpk__hf_all_known(ctx, fn, dir, &files, have_opt ? &of : NULL, alt, s);
    if (s == TPK_OK && wte) s = tpk__hf_tied_head(ctx, fn, dir, &files, wte, nwte);
    tpk__hf_stamp st[66]; /* config.json, the model files read, the optimizer file */
    int nst = 1;
    st[0].file = "config.json", st[0].key = "tpk_step", st[0].step = cv[0].kind ? cstep : NULL,
    st[0].id = cv[1].kind ? cv[1].str : NULL;
    for (int q = 0; q <= files.n; q++) { /* the model files (at most 64 of them), then the optimizer
                                            file */
        tpk_st_file *sf = q < files.n ? (files.open[q] && nst < 65 ? &files.st[q] : NULL)
                          : have_opt  ? &of
                                      : NULL;
        if (!sf) continue;
        st[nst].file = q < files.n ? files.file[q] : "optim.safetensors", st[nst].key = "step";
        st[nst].step = tpk_st_meta(sf, "step"), st[nst].id = tpk_st_meta(sf, "tpk_checkpoint_id"),
        nst++;
    }
    if (have_opt && s == TPK_OK && !st[nst - 1].step)
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s/optim.safetensors: no step in its metadata",
                      dir);
    int64_t step = 0;
    if (s == TPK_OK) s = tpk__hf_stamps_agree(ctx, fn, dir, st, nst, &step);
    if (s == TPK_OK && opt) opt->step = step; /* no optimizer file: fresh moments from the
                                                 checkpoint's step */
    if (made) {
        tpk_status k = tpk__adamw_keep_slice(ctx, opt, om, ov);
        if (s == TPK_OK) s = k;
    }
    free(wte);
    tpk__hf_files_close(&files), tpk_st_close(&of);
    return s;
}

/* What a load of dir reads (the directory: dir, or dir.tpk-old left by a stopped save), whether
 * it holds an optimizer file, and config.json's tpk_step and tpk_checkpoint_id (0 and "" when
 * absent). A trainer says from it that the optimizer state starts fresh. Not collective. */
typedef struct tpk_hf_info {
    char dir[1100];
    bool has_optim;
    int64_t step;
    char id[64];
} tpk_hf_info;
static inline tpk_status tpk_hf_info_read(tpk_ctx *ctx, const char *dir, tpk_hf_info *out) {
    static const char *fn = "tpk_hf_info_read";
    char path[1200];
    uint8_t *b = NULL;
    size_t n = 0;
    if (!ctx) return TPK_ERR_ARG;
    if (!dir || !out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "out");
    memset(out, 0, sizeof *out);
    tpk__hf_resolve(dir, out->dir, sizeof out->dir);
    TPK_TRY(tpk__config_load(ctx, fn, out->dir, path, sizeof path, &b, &n));
    static const char *const keys[] = {"tpk_step", "tpk_checkpoint_id"};
    tpk__json_val v[2];
    tpk_status s = tpk__config_members(ctx, fn, b, n, path, keys, 2, v);
    free(b);
    TPK_TRY(s);
    if (v[0].kind == 'n' && v[0].num >= 0 && v[0].num <= 1e18) out->step = (int64_t)v[0].num;
    if (v[1].kind == 's') snprintf(out->id, sizeof out->id, "%s", v[1].str);
    snprintf(path, sizeof path, "%s/optim.safetensors", out->dir);
    out->has_optim = access(path, F_OK) == 0;
    return TPK_OK;
}

/* Set every parameter (and, when opt is given and dir has optim.safetensors, the moments and
 * opt->step) from dir. The model must have the shapes of dir's config.json. Every rank reads. */
static inline tpk_status tpk_gpt2_load(tpk_ctx *ctx, tpk_gpt2 *m, tpk_adamw *opt, const char *dir) {
    static const char *fn = "tpk_gpt2_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->h || !dir)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    return tpk__hf_load(ctx, fn, opt, dir, tpk__hf_is_conv1d, "transformer.");
}
/* The same for a Llama: Hugging Face's LlamaForCausalLM files, one model.safetensors or shards
 * with model.safetensors.index.json. Every rank reads. */
static inline tpk_status tpk_llama_load(tpk_ctx *ctx, tpk_llama *m, tpk_adamw *opt,
                                        const char *dir) {
    static const char *fn = "tpk_llama_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->layers || !dir)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    return tpk__hf_load(ctx, fn, opt, dir, NULL, NULL);
}
static inline tpk_status tpk_neox_load(tpk_ctx *ctx, tpk_neox *m, tpk_adamw *opt,
                                       const char *dir) {
    static const char *fn = "tpk_neox_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->layers || !dir)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    return tpk__hf_load(ctx, fn, opt, dir, NULL, NULL);
}

#endif /* TPK_HF_H */
