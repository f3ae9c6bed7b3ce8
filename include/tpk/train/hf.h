/* tpk/train/hf.h — the families' checkpoints (GPT-2, Llama, GPT-NeoX, Mixtral, Qwen2-MoE) in
 * Hugging Face's layout, saved and loaded at any TP, DP (and, with experts, EP) size.
 *
 * A checkpoint directory holds
 *   config.json        GPT2LMHeadModel's config (model_type "gpt2": n_layer, n_embd, n_head,
 *                      vocab_size, n_positions, layer_norm_epsilon, ...) or LlamaForCausalLM's
 *                      (model_type "llama": num_hidden_layers, hidden_size, num_attention_heads,
 *                      num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings,
 *                      rms_norm_eps, rope_theta, tie_word_embeddings) or GPTNeoXForCausalLM's
 *                      (model_type "gpt_neox": the same sizes, rotary_pct, rotary_emb_base,
 *                      layer_norm_eps, use_parallel_residual) or MixtralForCausalLM's
 *                      (model_type "mixtral": Llama's with num_local_experts, ...) or
 *                      Qwen2MoeForCausalLM's (model_type "qwen2_moe": num_experts,
 *                      moe_intermediate_size, shared_expert_intermediate_size, norm_topk_prob,
 *                      ...), plus tpk_step, tpk_seed,
 *                      tpk_checkpoint_id (16 hex digits, random per save) and tpk_run_id
 *   model.safetensors  every parameter as its GLOBAL tensor under Hugging Face names; GPT-2's
 *                      Conv1D weights (c_attn, c_proj, c_fc) stored [in, out] as Hugging Face
 *                      does (tpk keeps [out, in]); Llama's all [out, in]; metadata {"format": "pt",
 *                      "step": N, "tpk_checkpoint_id": ID}. Loading also reads Hugging Face's
 *                      shards, model-K-of-N.safetensors named by model.safetensors.index.json.
 *   optim.safetensors  the AdamW moments "<name>.exp_avg", "<name>.exp_avg_sq" (global,
 *                      [out, in]), the step and the id, when an optimizer is given
 * Saving gathers every tensor over TP (collective on every rank); world rank 0 writes the files
 * into DIR.tpk-new and swaps it in for DIR by rename, carrying over DIR's other files, so DIR is
 * replaced whole or not at all (tpk_ckpt_commit; a load reads DIR.tpk-old when a save stopped
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

#include "ckpt.h"
#include "data.h"
#include "../models/families.h"
#include "optim.h"
#include "safetensors.h"

/* ---- config.json: its top-level members, through tpk/text/json.h (the kit's one reader) ----- */

/* A top-level member's value: kind 0 (absent), 'n' number (num: its whole text read by strtod,
 * however long; finite), 'b' true/false (num 1/0), 's' string (decoded: its first 63 bytes in str,
 * its length in len), 'z' null, 'o' object or array (len: its members or elements); `at` is
 * the byte offset where the value starts. */
typedef struct tpk__json_val {
    char kind;
    double num;
    char str[64];
    size_t at, len;
} tpk__json_val;

/* Parse bytes[n] (named `what` in errors) as strict JSON (tpk/text/json.h: every object's keys
 * once, valid UTF-8, numbers whole and finite, nesting at most 64 deep), require an object at the
 * top level and describe its members keys[i] in v[i]. */
static inline tpk_status tpk__config_members(tpk_ctx *ctx, const char *fn, const uint8_t *b,
                                             size_t n, const char *what, const char *const *keys,
                                             int nkeys, tpk__json_val *v) {
    tpk__json root;
    char *arena = NULL;
    for (int k = 0; k < nkeys; k++) memset(&v[k], 0, sizeof v[k]);
    tpk_status s = tpk__json_read(ctx, fn, what, (const char *)b, n, &root, &arena);
    if (s == TPK_OK && root.type != TPK__JOBJ)
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: byte %zu: expected an object at the top level",
                      what, root.at);
    for (int k = 0; s == TPK_OK && k < nkeys; k++) {
        const tpk__json *m = tpk__json_get(&root, keys[k]);
        if (!m) continue;
        v[k].at = m->at, v[k].num = m->num;
        switch (m->type) {
        case TPK__JNUM: v[k].kind = 'n'; break;
        case TPK__JBOOL: v[k].kind = 'b'; break;
        case TPK__JNULL: v[k].kind = 'z'; break;
        case TPK__JSTR: /* one longer than 63 bytes or holding a NUL: cut, "..." appended (it
                           then equals no name compared with) */
            v[k].kind = 's', v[k].len = m->len;
            if (m->len <= 63 && !memchr(m->str, 0, m->len)) memcpy(v[k].str, m->str, m->len + 1);
            else snprintf(v[k].str, sizeof v[k].str, "%.60s...", m->str);
            break;
        default: v[k].kind = 'o', v[k].len = m->len;
        }
    }
    tpk__json_free(&root, &arena);
    return s;
}
/* A member that must be a number when present (`need`: and must be present). */
static inline tpk_status tpk__config_number(tpk_ctx *ctx, const char *fn, const char *what,
                                            const char *key, const tpk__json_val *v, bool need) {
    if (v->kind == 'n' || (!v->kind && !need)) return TPK_OK;
    if (!v->kind) return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: missing %s (a number)", what, key);
    return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: byte %zu: expected a number for %s", what, v->at,
                     key);
}

/* The heads of a rotary model's config.json (Llama's, Qwen2-MoE's): an even head size H / A, G
 * dividing A, and head_dim (hd, when given) H / A. */
static inline tpk_status tpk__config_heads(tpk_ctx *ctx, const char *fn, const char *what,
                                           double H, double A, double G, const tpk__json_val *hd) {
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
    if (hd->kind && hd->num != H / A)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: head_dim %g: expected hidden_size / num_attention_heads = "
                         "%g",
                         what, hd->at, hd->num, H / A);
    return TPK_OK;
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
            return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: byte %zu: expected true or false for %s",
                             what, v[k].at, keys[k]);
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
    TPK_TRY(tpk__config_heads(ctx, fn, what, H, A, G, &v[NHD]));
    if (v[NACT].kind && (v[NACT].kind != 's' || strcmp(v[NACT].str, "silu")))
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: hidden_act \"%s\": expected \"silu\" (SwiGLU)", what,
                         v[NACT].at, v[NACT].str);
    if (v[NAB].num || v[NMB].num)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: attention_bias / mlp_bias: expected false (Llama has no "
                         "biases)",
                         what, v[NAB].num ? v[NAB].at : v[NMB].at);
    if (v[NRS].kind && v[NRS].kind != 'z')
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: rope_scaling: expected null (tpk computes the unscaled "
                         "rotary embedding)",
                         what, v[NRS].at);
    cfg->layers = (int64_t)L, cfg->hidden = (int64_t)H, cfg->heads = (int64_t)A,
    cfg->kv_heads = (int64_t)G, cfg->vocab = (int64_t)V;
    cfg->positions = (int64_t)P, cfg->ffn = (int64_t)F, cfg->norm_eps = (float)eps,
    cfg->rope_theta = (float)theta, cfg->tie_embeddings = v[NTIE].num != 0;
    return TPK_OK;
}

/* MixtralForCausalLM's config.json: Llama's keys (tpk_llama_config_parse: the sizes, heads,
 * intermediate_size (each expert's), rms_norm_eps (absent: Mixtral's 1e-5), rope_theta (absent:
 * 1e6), tie_word_embeddings), num_local_experts (absent: 8), num_experts_per_tok (absent: 2),
 * router_aux_loss_coef (absent: 0.001; 0: none); refused: a sliding_window shorter than
 * max_position_embeddings (tpk attends to every earlier position), router_jitter_noise > 0. */
static inline tpk_status tpk_mixtral_config_parse(tpk_ctx *ctx, const uint8_t *b, size_t n,
                                                  const char *what, tpk_mixtral_config *cfg) {
    static const char *fn = "tpk_mixtral_config_parse";
    if (!ctx) return TPK_ERR_ARG;
    if (!cfg || !what || (n && !b))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "bytes, what, cfg: NULL");
    tpk_llama_config l;
    memset(&l, 0, sizeof l);
    TPK_TRY(tpk_llama_config_parse(ctx, b, n, what, &l));
    enum { NE, NK, NC, NEPS, NTH, NSW, NJ, NORL, NK_ };
    static const char *const keys[] = {"num_local_experts",   "num_experts_per_tok",
                                       "router_aux_loss_coef", "rms_norm_eps",
                                       "rope_theta",          "sliding_window",
                                       "router_jitter_noise", "output_router_logits"};
    tpk__json_val v[NK_];
    TPK_TRY(tpk__config_members(ctx, fn, b, n, what, keys, NK_, v));
    if (v[NORL].kind && v[NORL].kind != 'b')
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: byte %zu: output_router_logits: expected true or false", what,
                         v[NORL].at);
    for (int k = 0; k < NORL; k++)
        if (k != NSW || v[k].kind != 'z')
            TPK_TRY(tpk__config_number(ctx, fn, what, keys[k], &v[k], false));
    double E = v[NE].kind ? v[NE].num : 8, K = v[NK].kind ? v[NK].num : 2,
           c = v[NC].kind ? v[NC].num : 0.001;
    if (!(E >= 1 && E <= 1e6 && E == floor(E) && K >= 1 && K <= E && K == floor(K) && c >= 0 &&
          c < 1e6))
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: implausible configuration (num_local_experts %g, num_experts_per_tok "
                         "%g, router_aux_loss_coef %g)",
                         what, E, K, c);
    if (v[NSW].kind == 'n' && v[NSW].num < (double)l.positions)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: sliding_window %g: expected null or at least "
                         "max_position_embeddings %lld (tpk attends to every earlier position)",
                         what, v[NSW].at, v[NSW].num, (long long)l.positions);
    if (v[NJ].kind && v[NJ].num != 0)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: router_jitter_noise %g: expected 0 (no jitter)", what,
                         v[NJ].at, v[NJ].num);
    cfg->layers = l.layers, cfg->hidden = l.hidden, cfg->heads = l.heads;
    cfg->kv_heads = l.kv_heads, cfg->vocab = l.vocab, cfg->positions = l.positions;
    cfg->ffn = l.ffn, cfg->tie_embeddings = l.tie_embeddings;
    cfg->norm_eps = v[NEPS].kind ? l.norm_eps : 1e-5f;
    cfg->rope_theta = v[NTH].kind ? l.rope_theta : 1e6f;
    cfg->experts = (int64_t)E, cfg->top_k = (int64_t)K;
    /* Hugging Face adds the load-balancing loss to the loss only with output_router_logits true
     * (false when absent): otherwise none, whatever router_aux_loss_coef says */
    bool aux_on = v[NORL].kind == 'b' && v[NORL].num != 0;
    cfg->aux_coef = aux_on && c > 0 ? (float)c : -1.0f; /* < 0: none */
    return TPK_OK;
}

/* A config.json member `key` that lists layers (Qwen2-MoE's mlp_only_layers): absent, null or an
 * array of whole numbers 0 .. L - 1 (repeats allowed: a set) into *out; anything else refused by
 * name (a layer at or past L, or past TPK_LAYER_SET_MAX, a non-integer, not an array). */
static inline tpk_status tpk__config_layers(tpk_ctx *ctx, const char *fn, const uint8_t *b,
                                            size_t n, const char *what, const char *key, double L,
                                            tpk_layer_set *out) {
    tpk__json root;
    char *arena = NULL;
    memset(out, 0, sizeof *out);
    tpk_status s = tpk__json_read(ctx, fn, what, (const char *)b, n, &root, &arena);
    const tpk__json *v = s == TPK_OK ? tpk__json_get(&root, key) : NULL;
    if (v && v->type != TPK__JNULL && v->type != TPK__JARR)
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                      "%s: byte %zu: %s: expected an array of layer indices or null", what, v->at,
                      key);
    for (size_t k = 0; s == TPK_OK && v && v->type == TPK__JARR && k < v->len; k++) {
        const tpk__json *e = &v->kids[k];
        int64_t i = -1;
        if (!tpk__json_int(e, 0, L - 1, &i))
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                          "%s: byte %zu: %s: expected whole layer indices 0..%g (num_hidden_layers "
                          "%g), got %s",
                          what, e->at, key, L - 1, L,
                          e->type == TPK__JNUM ? e->str : "not a number");
        else if (!tpk_layer_set_add(out, i))
            s = tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                          "%s: byte %zu: %s: layer %lld: tpk lists layers below %d alone", what,
                          e->at, key, (long long)i, TPK_LAYER_SET_MAX);
    }
    tpk__json_free(&root, &arena);
    return s;
}

/* Qwen2MoeForCausalLM's config.json (Hugging Face Qwen2MoeConfig): the sizes, heads,
 * num_key_value_heads (absent: num_attention_heads), rms_norm_eps (absent: 1e-6), rope_theta
 * (absent: Qwen2MoeConfig's 10000), tie_word_embeddings, num_experts (absent: 60),
 * num_experts_per_tok (4), moe_intermediate_size (1408), shared_expert_intermediate_size (5632),
 * intermediate_size (the dense layers' MLP: 5632), decoder_sparse_step (1: every layer sparse),
 * mlp_only_layers (absent or null: none; tpk__config_layers), norm_topk_prob (false),
 * router_aux_loss_coef (0.001; added only with output_router_logits true, as Hugging Face does);
 * refused by name: use_sliding_window true, qkv_bias false, a hidden_act other than silu,
 * rope_scaling, a head_dim other than hidden / heads. */
static inline tpk_status tpk_qwen2_moe_config_parse(tpk_ctx *ctx, const uint8_t *b, size_t n,
                                                    const char *what, tpk_qwen2_moe_config *cfg) {
    static const char *fn = "tpk_qwen2_moe_config_parse";
    if (!ctx) return TPK_ERR_ARG;
    if (!cfg || !what || (n && !b))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "bytes, what, cfg: NULL");
    enum { NL, NH, NA, NV, NP, NG, NEPS, NTH, NE, NK, NF, NFS, NC, NDS, NFD, NHD, /* numbers */
           NTIE, NNORM, NORL, NSW, NQB,                                           /* booleans */
           NACT, NRS, NK_ };
    static const char *const keys[] = {"num_hidden_layers",
                                       "hidden_size",
                                       "num_attention_heads",
                                       "vocab_size",
                                       "max_position_embeddings",
                                       "num_key_value_heads",
                                       "rms_norm_eps",
                                       "rope_theta",
                                       "num_experts",
                                       "num_experts_per_tok",
                                       "moe_intermediate_size",
                                       "shared_expert_intermediate_size",
                                       "router_aux_loss_coef",
                                       "decoder_sparse_step",
                                       "intermediate_size",
                                       "head_dim",
                                       "tie_word_embeddings",
                                       "norm_topk_prob",
                                       "output_router_logits",
                                       "use_sliding_window",
                                       "qkv_bias",
                                       "hidden_act",
                                       "rope_scaling"};
    tpk__json_val v[NK_];
    TPK_TRY(tpk__config_members(ctx, fn, b, n, what, keys, NK_, v));
    for (int k = 0; k <= NHD; k++)
        TPK_TRY(tpk__config_number(ctx, fn, what, keys[k], &v[k], k <= NP));
    for (int k = NTIE; k <= NQB; k++)
        if (v[k].kind && v[k].kind != 'b')
            return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: byte %zu: expected true or false for %s",
                             what, v[k].at, keys[k]);
    double L = v[NL].num, H = v[NH].num, A = v[NA].num, V = v[NV].num, P = v[NP].num;
    double G = v[NG].kind ? v[NG].num : A, eps = v[NEPS].kind ? v[NEPS].num : 1e-6,
           theta = v[NTH].kind ? v[NTH].num : 10000, E = v[NE].kind ? v[NE].num : 60,
           K = v[NK].kind ? v[NK].num : 4, F = v[NF].kind ? v[NF].num : 1408,
           Fs = v[NFS].kind ? v[NFS].num : 5632, c = v[NC].kind ? v[NC].num : 0.001,
           Fd = v[NFD].kind ? v[NFD].num : 5632, step = v[NDS].kind ? v[NDS].num : 1;
    bool ok = L >= 1 && H >= 1 && A >= 1 && V >= 1 && P >= 1 && G >= 1 && G <= A && L <= 1e5 &&
              H <= 1e6 && A <= H && V <= 1e8 && P <= 1e8 && L == floor(L) && H == floor(H) &&
              A == floor(A) && V == floor(V) && P == floor(P) && G == floor(G) && eps >= 1e-30 &&
              eps < 1 && theta > 1 && theta < 1e30 && E >= 1 && E <= 1e6 && E == floor(E) &&
              K >= 1 && K <= E && K == floor(K) && F >= 1 && F <= 1e7 && F == floor(F) &&
              Fs >= 1 && Fs <= 1e7 && Fs == floor(Fs) && c >= 0 && c < 1e6;
    if (!ok)
        return tpk__fail(
            ctx, TPK_ERR_FORMAT, fn,
            "%s: implausible configuration (num_hidden_layers %g, hidden_size %g, "
            "num_attention_heads %g, num_key_value_heads %g, vocab_size %g, "
            "max_position_embeddings %g, rms_norm_eps %g, rope_theta %g, num_experts %g, "
            "num_experts_per_tok %g, moe_intermediate_size %g, shared_expert_intermediate_size "
            "%g, router_aux_loss_coef %g)",
            what, L, H, A, G, V, P, eps, theta, E, K, F, Fs, c);
    if (!(Fd >= 1 && Fd <= 1e7 && Fd == floor(Fd)))
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: byte %zu: intermediate_size %g: expected a whole number 1..1e7 (the "
                         "dense layers' MLP)",
                         what, v[NFD].at, Fd);
    if (!(step >= 1 && step <= 1e5 && step == floor(step)))
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: byte %zu: decoder_sparse_step %g: expected a whole number 1..1e5 "
                         "(layer i sparse where (i + 1) %% decoder_sparse_step is 0)",
                         what, v[NDS].at, step);
    TPK_TRY(tpk__config_heads(ctx, fn, what, H, A, G, &v[NHD]));
    tpk_layer_set only;
    TPK_TRY(tpk__config_layers(ctx, fn, b, n, what, "mlp_only_layers", L, &only));
    if (v[NSW].num)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: use_sliding_window: expected false (tpk attends to every "
                         "earlier position)",
                         what, v[NSW].at);
    if (v[NQB].kind && !v[NQB].num)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: qkv_bias: expected true (Qwen2's q, k, v projections have "
                         "biases)",
                         what, v[NQB].at);
    if (v[NACT].kind && (v[NACT].kind != 's' || strcmp(v[NACT].str, "silu")))
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: hidden_act \"%s\": expected \"silu\" (SwiGLU)", what,
                         v[NACT].at, v[NACT].kind == 's' ? v[NACT].str : "(not a string)");
    if (v[NRS].kind && v[NRS].kind != 'z')
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: rope_scaling: expected null (tpk computes the unscaled "
                         "rotary embedding)",
                         what, v[NRS].at);
    cfg->layers = (int64_t)L, cfg->hidden = (int64_t)H, cfg->heads = (int64_t)A;
    cfg->kv_heads = (int64_t)G, cfg->vocab = (int64_t)V, cfg->positions = (int64_t)P;
    cfg->norm_eps = (float)eps, cfg->rope_theta = (float)theta;
    cfg->tie_embeddings = v[NTIE].num != 0;
    cfg->experts = (int64_t)E, cfg->top_k = (int64_t)K, cfg->moe_ffn = (int64_t)F;
    cfg->shared_ffn = (int64_t)Fs, cfg->norm_topk_prob = v[NNORM].num != 0;
    cfg->dense_ffn = (int64_t)Fd, cfg->sparse_step = (int64_t)step, cfg->mlp_only = only;
    /* as Mixtral's: the load-balancing loss only with output_router_logits true */
    bool aux_on = v[NORL].kind == 'b' && v[NORL].num != 0;
    cfg->aux_coef = aux_on && c > 0 ? (float)c : -1.0f; /* < 0: none */
    return TPK_OK;
}

/* dir/config.json's bytes (free them) and its path (dir.tpk-old's after a stopped save:
 * tpk_ckpt_resolve). */
static inline tpk_status tpk__config_load(tpk_ctx *ctx, const char *fn, const char *dir, char *path,
                                          size_t np, uint8_t **b, size_t *n) {
    if (!ctx) return TPK_ERR_ARG;
    if (!dir) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dir: NULL");
    char d[1100];
    TPK_TRY(tpk_ckpt_resolve(ctx, dir, d, sizeof d)); /* a save stopped mid-swap: the previous
                                                          checkpoint */
    snprintf(path, np, "%s/config.json", d);
    return tpk__read_file(ctx, fn, path, b, n);
}

/* GPTNeoXForCausalLM's config.json: the sizes, rotary_pct (or partial_rotary_factor),
 * rotary_emb_base (or rope_theta), layer_norm_eps, hidden_act ("gelu": exact; "gelu_new",
 * "gelu_pytorch_tanh", "gelu_fast": the tanh form), use_parallel_residual (false: the sequential
 * block); refused: another activation, biases off, a tied head, scaled rotary embeddings. */
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
            return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: byte %zu: expected true or false for %s",
                             what, v[k].at, keys[k]);
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
                         "%s: byte %zu: hidden_act \"%s\": expected \"gelu\" (exact) or "
                         "\"gelu_new\", \"gelu_pytorch_tanh\", \"gelu_fast\" (the tanh form)",
                         what, v[NACT].at, *act ? act : "(not a string)");
    if (v[NTIE].num)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: tie_word_embeddings: expected false (GPT-NeoX's head is "
                         "untied)",
                         what, v[NTIE].at);
    if (v[NAB].kind && !v[NAB].num)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: attention_bias: expected true (GPT-NeoX's projections have "
                         "biases)",
                         what, v[NAB].at);
    if (v[NRS].kind && v[NRS].kind != 'z')
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "%s: byte %zu: rope_scaling: expected null (tpk computes the unscaled "
                         "rotary embedding)",
                         what, v[NRS].at);
    cfg->layers = (int64_t)L, cfg->hidden = (int64_t)H, cfg->heads = (int64_t)A;
    cfg->vocab = (int64_t)V, cfg->positions = (int64_t)P, cfg->ffn = (int64_t)F;
    cfg->rotary_pct = (float)pct, cfg->rope_theta = (float)base, cfg->ln_eps = (float)eps;
    cfg->act = exact ? TPK_ACT_GELU : TPK_ACT_GELU_TANH;
    /* false: the sequential block, as Hugging Face runs it; absent: true */
    cfg->sequential = v[NPAR].kind && !v[NPAR].num;
    return TPK_OK;
}
/* config.json of dir's checkpoint read whole (f->b, freed by the caller with tpk__free) for fn,
 * whose cfg must not be NULL. */
typedef struct tpk__config_file {
    char path[1200];
    uint8_t *b;
    size_t n;
} tpk__config_file;
static inline tpk_status tpk__config_open(tpk_ctx *ctx, const char *fn, const char *dir,
                                          const void *cfg, tpk__config_file *f) {
    f->b = NULL, f->n = 0;
    if (ctx && !cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg: NULL");
    return tpk__config_load(ctx, fn, dir, f->path, sizeof f->path, &f->b, &f->n);
}
/* A family's config from dir/config.json (of the checkpoint dir holds, tpk_ckpt_resolve), as its
 * tpk_F_config_parse. */
static inline tpk_status tpk_gpt2_config_read(tpk_ctx *ctx, const char *dir, tpk_gpt2_config *cfg) {
    tpk__config_file f;
    TPK_TRY(tpk__config_open(ctx, "tpk_gpt2_config_read", dir, cfg, &f));
    tpk_status s = tpk_gpt2_config_parse(ctx, f.b, f.n, f.path, cfg);
    tpk__free(ctx, f.b);
    return s;
}
static inline tpk_status tpk_llama_config_read(tpk_ctx *ctx, const char *dir,
                                               tpk_llama_config *cfg) {
    tpk__config_file f;
    TPK_TRY(tpk__config_open(ctx, "tpk_llama_config_read", dir, cfg, &f));
    tpk_status s = tpk_llama_config_parse(ctx, f.b, f.n, f.path, cfg);
    tpk__free(ctx, f.b);
    return s;
}
static inline tpk_status tpk_neox_config_read(tpk_ctx *ctx, const char *dir, tpk_neox_config *cfg) {
    tpk__config_file f;
    TPK_TRY(tpk__config_open(ctx, "tpk_neox_config_read", dir, cfg, &f));
    tpk_status s = tpk_neox_config_parse(ctx, f.b, f.n, f.path, cfg);
    tpk__free(ctx, f.b);
    return s;
}
static inline tpk_status tpk_mixtral_config_read(tpk_ctx *ctx, const char *dir,
                                                 tpk_mixtral_config *cfg) {
    tpk__config_file f;
    TPK_TRY(tpk__config_open(ctx, "tpk_mixtral_config_read", dir, cfg, &f));
    tpk_status s = tpk_mixtral_config_parse(ctx, f.b, f.n, f.path, cfg);
    tpk__free(ctx, f.b);
    return s;
}
static inline tpk_status tpk_qwen2_moe_config_read(tpk_ctx *ctx, const char *dir,
                                                   tpk_qwen2_moe_config *cfg) {
    tpk__config_file f;
    TPK_TRY(tpk__config_open(ctx, "tpk_qwen2_moe_config_read", dir, cfg, &f));
    tpk_status s = tpk_qwen2_moe_config_parse(ctx, f.b, f.n, f.path, cfg);
    tpk__free(ctx, f.b);
    return s;
}

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
    tpk__free(ctx, b);
    TPK_TRY(s);
    /* the families' model_type (tpk/models/families.h) */
    static const char *const types[] = {"gpt2", "llama", "gpt_neox", "mixtral", "qwen2_moe"};
    int nt = (int)(sizeof types / sizeof types[0]), k = 0;
    while (v.kind == 's' && k < nt && strcmp(v.str, types[k])) k++;
    if (v.kind != 's' || k == nt) {
        char want[160] = "";
        for (int i = 0; i < nt; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s\"%s\"",
                     i == 0 ? "" : i == nt - 1 ? " or " : ", ", types[i]);
        char place[40] = ""; /* where the value is, when it is */
        if (v.kind) snprintf(place, sizeof place, "byte %zu: ", v.at);
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn, "%s: %smodel_type %s%s%s: expected %s", path,
                         place, v.kind == 's' ? "\"" : "",
                         v.kind == 's' ? v.str
                         : v.kind      ? "(not a string)"
                                       : "missing",
                         v.kind == 's' ? "\"" : "", want);
    }
    snprintf(type, n, "%.31s", v.str); /* one of the families' */
    return TPK_OK;
}

/* ---- the checkpoint directory: replaced whole or not at all (tpk/train/ckpt_dir.h) ---------- */

/* Remove the checkpoint saved in dir: its files, then dir when it holds nothing else
 * (tpk_ckpt_remove). One rank. */
static inline tpk_status tpk_hf_remove(tpk_ctx *ctx, const char *dir) {
    return tpk_ckpt_remove(ctx, dir);
}

/* ---- Hugging Face's names and files ---------------------------------------------------------- */

/* Conv1D weights are stored [in, out] by Hugging Face, [out, in] here. */
static inline bool tpk__hf_is_conv1d(const tpk_param *p) {
    size_t n = strlen(p->name);
    return p->ndim == 2 && n > 7 && !strcmp(p->name + n - 7, ".weight") &&
           strncmp(p->name, "wte", 3) && strncmp(p->name, "wpe", 3) && !strstr(p->name, "ln_");
}
/* GPT-2's map (tpk_ckpt_map_fn): tpk's names are Hugging Face's; the Conv1D weights
 * transposed. */
static inline void tpk__hf_gpt2_map(void *arg, const tpk_param *p, char *name, size_t cap,
                                    bool *transposed) {
    (void)arg, (void)name, (void)cap;
    *transposed = tpk__hf_is_conv1d(p);
}
/* The buffers Hugging Face's files carry and tpk computes itself (tpk_ckpt_load_desc.ignore): the
 * causal masks (GPT-2's attn.bias and attn.masked_bias, GPT-NeoX's attention.bias and
 * attention.masked_bias in files of older transformers versions) and the rotary frequencies
 * rotary_emb.inv_freq of Llama and GPT-NeoX. */
static inline bool tpk__hf_buffer(void *arg, const char *name) {
    static const char *const buffers[] = {".attn.bias", ".attn.masked_bias", ".attention.bias",
                                          ".attention.masked_bias", ".rotary_emb.inv_freq"};
    size_t len = strlen(name);
    (void)arg;
    for (int k = 0; k < (int)(sizeof buffers / sizeof buffers[0]); k++) {
        size_t b = strlen(buffers[k]);
        if (len > b && !strcmp(name + len - b, buffers[k])) return true;
    }
    return false;
}

/* The model files of a Hugging Face directory dir into f: the shards model-K-of-N.safetensors
 * named by model.safetensors.index.json's weight_map ({"tensor name": "file", ...}), or without
 * an index the one file model.safetensors (tpk_ckpt_load_desc.index). */
static inline tpk_status tpk__hf_index(tpk_ctx *ctx, const char *fn, const char *dir,
                                       tpk_ckpt_files *f) {
    char path[1200];
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) != 0) return tpk__ckpt_single(ctx, fn, "model.safetensors", f);
    snprintf(f->index, sizeof f->index, "model.safetensors.index.json");
    f->al = tpk__allocator(ctx);
    uint8_t *b = NULL;
    size_t n = 0;
    TPK_TRY(tpk__read_file(ctx, fn, path, &b, &n));
    tpk__json root; /* strict JSON (tpk/text/json.h): the weight map's names once each */
    char *arena = NULL;
    tpk_status s = tpk__json_read_named(ctx, fn, path, (const char *)b, n, "weight_map", "tensor",
                                        &root, &arena);
    const tpk__json *wm = s == TPK_OK ? tpk__json_get(&root, "weight_map") : NULL;
    if (s == TPK_OK && (!wm || wm->type != TPK__JOBJ))
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: byte %zu: expected an object \"weight_map\"",
                      path, wm ? wm->at : 0);
    size_t nm = wm ? wm->len : 0;
    if (s == TPK_OK) {
        f->tensor = (char(*)[256])tpk__calloc(ctx, nm, 256);
        f->which = (int *)tpk__calloc(ctx, nm, sizeof(int));
        f->file = (char(*)[128])tpk__calloc(ctx, nm, 128);
        if (!f->tensor || !f->which || !f->file)
            s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the weight map");
    }
    for (size_t k = 0; s == TPK_OK && k < nm; k++) {
        const tpk__json *e = &wm->kids[k];
        if (e->key_len > 255 || memchr(e->key, 0, e->key_len))
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                          "%s: byte %zu: weight_map: a tensor name of more than 255 bytes or "
                          "with \\u0000",
                          path, e->key_at);
        else if (e->type != TPK__JSTR)
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                          "%s: byte %zu: weight_map: file: expected a string", path, e->at);
        else if (e->len >= 128 || e->len < 13 || memchr(e->str, 0, e->len) ||
                 strchr(e->str, '/') || strcmp(e->str + e->len - 12, ".safetensors") ||
                 e->str[0] == '.')
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                          "%s: byte %zu: weight_map: \"%.100s\": expected a file name ending in "
                          ".safetensors in the same directory",
                          path, e->at, e->str);
        if (s != TPK_OK) break;
        int q = 0;
        while (q < f->n && strcmp(f->file[q], e->str)) q++;
        if (q == f->n) snprintf(f->file[f->n++], 128, "%s", e->str);
        snprintf(f->tensor[k], 256, "%s", e->key), f->which[k] = q;
        f->nmap = (int)k + 1;
    }
    tpk__json_free(&root, &arena);
    tpk__free(ctx, b);
    const char *dup = NULL;
    if (s == TPK_OK &&
        !(f->byname = (const char **)tpk__malloc(ctx, sizeof(char *) * (size_t)f->nmap)))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the weight map");
    for (int k = 0; s == TPK_OK && k < f->nmap; k++) f->byname[k] = f->tensor[k];
    if (s == TPK_OK && tpk__st_has_dup(f->byname, (size_t)f->nmap, &dup)) /* sorts byname */
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                      "%s: weight_map: the tensor \"%.200s\" appears twice", path, dup);
    if (s == TPK_OK && !(f->st = (tpk_st_file *)tpk__calloc(ctx, (size_t)f->n, sizeof *f->st)))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the file table");
    if (s == TPK_OK && !(f->open = (bool *)tpk__calloc(ctx, (size_t)f->n, 1)))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the file table");
    if (s != TPK_OK) tpk_ckpt_files_close(f);
    return s;
}

/* ---- save ------------------------------------------------------------------------------------ */

typedef struct tpk_gpt2_save_desc {
    int64_t step;       /* optimizer steps done (the "step" metadata, tpk_step) */
    uint64_t seed;      /* tpk_seed in config.json */
    const char *run_id; /* tpk_run_id in config.json (tpk_ckpt_save_desc.run_id); NULL: none */
} tpk_gpt2_save_desc;
typedef tpk_gpt2_save_desc tpk_hf_save_desc;

/* A family's save: every parameter (and opt's moments) with config.json's text `config`
 * (tpk_ckpt_save; conv1d: GPT-2's Conv1D weights stored [in, out]). Collective over
 * ctx->world. */
static inline tpk_status tpk__hf_save(tpk_ctx *ctx, const char *fn, const tpk_adamw *opt,
                                      const char *dir, const tpk_hf_save_desc *d,
                                      const char *config, bool conv1d) {
    tpk_ckpt_save_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.step = d->step, cd.seed = d->seed, cd.config = config, cd.run_id = d->run_id;
    cd.map = conv1d ? tpk__hf_gpt2_map : NULL;
    return tpk__ckpt_save(ctx, fn, opt, dir, &cd);
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
    TPK_TRY(tpk__hf_save_args(ctx, fn, m && m->lm.blocks, dir, desc, &d));
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
        "  \"attn_pdrop\": %g,\n  \"tie_word_embeddings\": true\n}\n",
        (long long)c->vocab, (long long)c->positions, (long long)c->positions, (long long)c->hidden,
        (long long)c->layers, (long long)c->heads, (double)(c->ln_eps > 0 ? c->ln_eps : 1e-5f),
        (double)c->dropout, (double)c->dropout, (double)c->dropout);
    return tpk__hf_save(ctx, fn, opt, dir, &d, cfg, true);
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
    TPK_TRY(tpk__hf_save_args(ctx, fn, m && m->lm.blocks, dir, desc, &d));
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
        "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"float32\"\n}\n",
        (long long)c->vocab, (long long)c->positions, (long long)c->hidden, (long long)c->ffn,
        (long long)c->layers, (long long)c->heads, (long long)c->kv_heads,
        (long long)(c->hidden / c->heads), tpk__float_text(c->norm_eps, e1, sizeof e1),
        tpk__float_text(c->rope_theta, e2, sizeof e2), c->tie_embeddings ? "true" : "false");
    return tpk__hf_save(ctx, fn, opt, dir, &d, cfg, false);
}

/* Save a GPT-NeoX (and opt's moments when opt is not NULL) to dir in Hugging Face's
 * GPTNeoXForCausalLM layout: config.json (model_type "gpt_neox", hidden_act "gelu" or "gelu_new"),
 * model.safetensors with every tensor [out, in] (query_key_value's rows per head, as tpk holds
 * them). Collective over ctx->world. */
static inline tpk_status tpk_neox_save(tpk_ctx *ctx, const tpk_neox *m, const tpk_adamw *opt,
                                       const char *dir, const tpk_hf_save_desc *desc) {
    static const char *fn = "tpk_neox_save";
    tpk_hf_save_desc d;
    TPK_TRY(tpk__hf_save_args(ctx, fn, m && m->lm.blocks, dir, desc, &d));
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
             "  \"use_parallel_residual\": %s,\n  \"attention_bias\": true,\n"
             "  \"hidden_dropout\": %g,\n  \"attention_dropout\": %g,\n"
             "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"float32\"\n}\n",
             (long long)c->vocab, (long long)c->positions, (long long)c->hidden,
             (long long)c->ffn, (long long)c->layers, (long long)c->heads, e3, e3,
             tpk__float_text(c->rope_theta, e1, sizeof e1), e1,
             c->act == TPK_ACT_GELU_TANH ? "gelu_new" : "gelu",
             tpk__float_text(c->ln_eps, e2, sizeof e2), c->sequential ? "false" : "true",
             (double)c->dropout, (double)c->dropout);
    return tpk__hf_save(ctx, fn, opt, dir, &d, cfg, false);
}

/* Save a Mixtral (and opt's moments when opt is not NULL) to dir in Hugging Face's
 * MixtralForCausalLM layout: config.json (model_type "mixtral"), model.safetensors with every
 * tensor [out, in] under its global name, each expert's (block_sparse_moe.experts.<e>.w1/w2/w3)
 * written from the EP rank holding it (tpk_ckpt_save). Collective over ctx->world. */
static inline tpk_status tpk_mixtral_save(tpk_ctx *ctx, const tpk_mixtral *m, const tpk_adamw *opt,
                                          const char *dir, const tpk_hf_save_desc *desc) {
    static const char *fn = "tpk_mixtral_save";
    tpk_hf_save_desc d;
    TPK_TRY(tpk__hf_save_args(ctx, fn, m && m->lm.blocks, dir, desc, &d));
    char cfg[1600], e1[32], e2[32], e3[32];
    const tpk_mixtral_config *c = &m->c;
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"MixtralForCausalLM\"],\n  \"model_type\": \"mixtral\",\n"
             "  \"vocab_size\": %lld,\n  \"max_position_embeddings\": %lld,\n"
             "  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
             "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
             "  \"num_key_value_heads\": %lld,\n  \"head_dim\": %lld,\n"
             "  \"hidden_act\": \"silu\",\n  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n"
             "  \"num_local_experts\": %lld,\n  \"num_experts_per_tok\": %lld,\n"
             "  \"router_aux_loss_coef\": %s,\n  \"output_router_logits\": %s,\n"
             "  \"router_jitter_noise\": 0.0,\n  \"sliding_window\": null,\n"
             "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"float32\"\n}\n",
             (long long)c->vocab, (long long)c->positions, (long long)c->hidden, (long long)c->ffn,
             (long long)c->layers, (long long)c->heads, (long long)c->kv_heads,
             (long long)(c->hidden / c->heads), tpk__float_text(c->norm_eps, e1, sizeof e1),
             tpk__float_text(c->rope_theta, e2, sizeof e2), (long long)c->experts,
             (long long)c->top_k,
             c->aux_coef > 0 ? tpk__float_text(c->aux_coef, e3, sizeof e3) : "0.0",
             c->aux_coef > 0 ? "true" : "false", c->tie_embeddings ? "true" : "false");
    return tpk__hf_save(ctx, fn, opt, dir, &d, cfg, false);
}

/* Save a Qwen2-MoE (and opt's moments when opt is not NULL) to dir in Hugging Face's
 * Qwen2MoeForCausalLM layout: config.json (model_type "qwen2_moe"; intermediate_size the dense
 * layers' F_d, decoder_sparse_step, mlp_only_layers), model.safetensors with every tensor
 * [out, in] under its global name (a dense layer's mlp.gate_proj/up_proj/down_proj), each routed
 * expert's (mlp.experts.<e>.gate_proj/up_proj/down_proj) written from the EP rank holding it
 * (tpk_ckpt_save). Collective over ctx->world. */
static inline tpk_status tpk_qwen2_moe_save(tpk_ctx *ctx, const tpk_qwen2_moe *m,
                                            const tpk_adamw *opt, const char *dir,
                                            const tpk_hf_save_desc *desc) {
    static const char *fn = "tpk_qwen2_moe_save";
    tpk_hf_save_desc d;
    TPK_TRY(tpk__hf_save_args(ctx, fn, m && m->lm.blocks, dir, desc, &d));
    char cfg[2000 + 6 * TPK_LAYER_SET_MAX], e1[32], e2[32], e3[32], only[6 * TPK_LAYER_SET_MAX];
    const tpk_qwen2_moe_config *c = &m->c;
    tpk_layer_set_text(&c->mlp_only, ", ", only, sizeof only);
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"Qwen2MoeForCausalLM\"],\n  \"model_type\": "
             "\"qwen2_moe\",\n"
             "  \"vocab_size\": %lld,\n  \"max_position_embeddings\": %lld,\n"
             "  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
             "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
             "  \"num_key_value_heads\": %lld,\n  \"hidden_act\": \"silu\",\n"
             "  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n  \"rope_scaling\": null,\n"
             "  \"num_experts\": %lld,\n  \"num_experts_per_tok\": %lld,\n"
             "  \"moe_intermediate_size\": %lld,\n  \"shared_expert_intermediate_size\": %lld,\n"
             "  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": %lld,\n"
             "  \"mlp_only_layers\": [%s],\n  \"router_aux_loss_coef\": %s,\n"
             "  \"output_router_logits\": %s,\n  \"use_sliding_window\": false,\n"
             "  \"attention_dropout\": 0.0,\n"
             "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"float32\"\n}\n",
             (long long)c->vocab, (long long)c->positions, (long long)c->hidden,
             (long long)c->dense_ffn, (long long)c->layers, (long long)c->heads,
             (long long)c->kv_heads, tpk__float_text(c->norm_eps, e1, sizeof e1),
             tpk__float_text(c->rope_theta, e2, sizeof e2), (long long)c->experts,
             (long long)c->top_k, (long long)c->moe_ffn, (long long)c->shared_ffn,
             c->norm_topk_prob ? "true" : "false", (long long)c->sparse_step, only,
             c->aux_coef > 0 ? tpk__float_text(c->aux_coef, e3, sizeof e3) : "0.0",
             c->aux_coef > 0 ? "true" : "false", c->tie_embeddings ? "true" : "false");
    return tpk__hf_save(ctx, fn, opt, dir, &d, cfg, false);
}

/* ---- load ------------------------------------------------------------------------------------ */

/* A family's load (tpk_ckpt_load) from a tpk checkpoint or a Hugging Face directory: its shards
 * with their index, its buffers ignored; gpt2: the Conv1D weights transposed, names with or
 * without "transformer.", an lm_head.weight equal to wte.weight accepted (tpk ties the two). */
static inline tpk_status tpk__hf_load(tpk_ctx *ctx, const char *fn, tpk_adamw *opt,
                                      const char *dir, bool gpt2) {
    tpk_ckpt_load_desc d;
    memset(&d, 0, sizeof d);
    d.ignore = tpk__hf_buffer, d.index = tpk__hf_index;
    if (gpt2) {
        d.map = tpk__hf_gpt2_map, d.alias = "transformer.";
        d.tied[0] = "lm_head.weight", d.tied[1] = "wte.weight";
    }
    return tpk__ckpt_load(ctx, fn, opt, dir, &d, NULL);
}

/* What a load of dir reads (tpk_ckpt_info: the directory, whether it holds an optimizer file,
 * config.json's tpk_step, tpk_seed and tpk_checkpoint_id). Not collective. */
typedef tpk_ckpt_info tpk_hf_info;
static inline tpk_status tpk_hf_info_read(tpk_ctx *ctx, const char *dir, tpk_hf_info *out) {
    return tpk_ckpt_info_read(ctx, dir, out);
}

/* Set every parameter (and, when opt is given and dir has optim.safetensors, the moments and
 * opt->step) from dir. The model must have the shapes of dir's config.json. Every rank reads. */
static inline tpk_status tpk_gpt2_load(tpk_ctx *ctx, tpk_gpt2 *m, tpk_adamw *opt, const char *dir) {
    static const char *fn = "tpk_gpt2_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->lm.blocks || !dir)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    return tpk__hf_load(ctx, fn, opt, dir, true);
}
/* The same for a Llama: Hugging Face's LlamaForCausalLM files, one model.safetensors or shards
 * with model.safetensors.index.json. Every rank reads. */
static inline tpk_status tpk_llama_load(tpk_ctx *ctx, tpk_llama *m, tpk_adamw *opt,
                                        const char *dir) {
    static const char *fn = "tpk_llama_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->lm.blocks || !dir)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    return tpk__hf_load(ctx, fn, opt, dir, false);
}
/* The same for a Mixtral: Hugging Face's MixtralForCausalLM files; each expert's tensors read by
 * the EP rank holding it. Every rank reads. */
static inline tpk_status tpk_mixtral_load(tpk_ctx *ctx, tpk_mixtral *m, tpk_adamw *opt,
                                          const char *dir) {
    static const char *fn = "tpk_mixtral_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->lm.blocks || !dir)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    return tpk__hf_load(ctx, fn, opt, dir, false);
}
/* The same for a Qwen2-MoE: Hugging Face's Qwen2MoeForCausalLM files; each routed expert's
 * tensors read by the EP rank holding it. Every rank reads. */
static inline tpk_status tpk_qwen2_moe_load(tpk_ctx *ctx, tpk_qwen2_moe *m, tpk_adamw *opt,
                                            const char *dir) {
    static const char *fn = "tpk_qwen2_moe_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->lm.blocks || !dir)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    return tpk__hf_load(ctx, fn, opt, dir, false);
}
static inline tpk_status tpk_neox_load(tpk_ctx *ctx, tpk_neox *m, tpk_adamw *opt,
                                       const char *dir) {
    static const char *fn = "tpk_neox_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->lm.blocks || !dir)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "model");
    return tpk__hf_load(ctx, fn, opt, dir, false);
}

#endif /* TPK_HF_H */
