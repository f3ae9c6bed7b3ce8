/* tpk/train/sources.h — where a trainer's tokens come from and its text goes: the tokenizer
 * (--tokenizer DIR, else a loaded checkpoint's own tokenizer.json or vocab.json + merges.txt), the
 * data (--text FILE: its bytes, or its tokenizer's ids; --data SHARD [--val-data SHARD]: llm.c
 * token shards), each split into training and validation tokens (tpk/train/data.h) with a line
 * that says what was read, and a sample of the model (--sample N after --prompt TEXT, else after
 * one end-of-text token: the tokenizer's; newline for bytes; <|endoftext|> for GPT-2's
 * vocabulary) printed as text (the tokenizer's decode, or the bytes) or as ids. Needs POSIX
 * (access). */
#ifndef TPK_TRAIN_SOURCES_H
#define TPK_TRAIN_SOURCES_H

#include <unistd.h>

#include "../text/tokenizer.h"
#include "data.h"
#include "model.h"

/* The whole file at path ("-": standard input) into *out (*n bytes; free with
 * tpk_free(ctx, *out)). */
static inline tpk_status tpk_run_read_file(tpk_ctx *ctx, const char *path, uint8_t **out,
                                           size_t *n) {
    static const char *fn = "tpk_run_read_file";
    if (!ctx) return TPK_ERR_ARG;
    if (!path || !out || !n)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !path ? "path" : !out ? "out" : "n");
    return strcmp(path, "-") ? tpk__read_file(ctx, fn, path, out, n)
                             : tpk__read_stream(ctx, fn, "standard input", stdin, out, n);
}

/* The tokenizer of `tokenizer` (a folder or file), else load's own where it has one; *tk NULL and
 * *path NULL where there is none; *path: where it came from. */
static inline tpk_status tpk_run_tokenizer(tpk_ctx *ctx, const char *tokenizer, const char *load,
                                           tpk_tokenizer **tk, const char **path) {
    if (!ctx) return TPK_ERR_ARG;
    if (!tk || !path)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_run_tokenizer", "%s: NULL", tk ? "path" : "tk");
    char a[1100], b[1100];
    *tk = NULL, *path = tokenizer;
    if (!*path && load) {
        snprintf(a, sizeof a, "%.1000s/tokenizer.json", load);
        snprintf(b, sizeof b, "%.1000s/merges.txt", load);
        if (access(a, R_OK) == 0 || access(b, R_OK) == 0) *path = load;
    }
    return *path ? tpk_tokenizer_load(ctx, *path, tk) : TPK_OK;
}

/* Whether the text side fits a model of vocab tokens: --text needs 256 ids (bytes) without a
 * tokenizer, a tokenizer (tk_path, may be NULL) no more ids than the model, a prompt of a model
 * past bytes a tokenizer. false with the message in err. */
static inline bool tpk_run_text_fits(const tpk_tokenizer *tk, const char *tk_path, const char *text,
                                     const char *prompt, int64_t vocab, char *err, size_t n) {
    if (text && !tk && vocab < 256)
        return snprintf(err, n, "--text needs a vocabulary of at least 256 (the model has %lld)",
                        (long long)vocab),
               false;
    if (tk && tk->vocab_size > vocab)
        return snprintf(err, n,
                        "--tokenizer %s: %lld tokens, more than the model's vocabulary of %lld",
                        tk_path ? tk_path : "", (long long)tk->vocab_size, (long long)vocab),
               false;
    if (prompt && !tk && vocab > 256)
        return snprintf(err, n,
                        "--prompt: needs a tokenizer (--tokenizer DIR) for a vocabulary of %lld "
                        "tokens",
                        (long long)vocab),
               false;
    return true;
}

/* The data's training and validation tokens: text (with tk, its ids; else its bytes) or the
 * shards data and val (NULL: data) of ids below vocab; span = B S + 1, the least a batch needs.
 * What a text file gave printed on out (NULL: not). */
static inline tpk_status tpk_run_data(tpk_ctx *ctx, const char *text, tpk_tokenizer *tk,
                                      const char *tk_path, const char *data, const char *val,
                                      int64_t vocab, int64_t span, tpk_tokens *train,
                                      tpk_tokens *valid, FILE *out) {
    static const char *fn = "tpk_run_data";
    if (!ctx) return TPK_ERR_ARG;
    if (!train || !valid || (!text && !data))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL",
                         !train   ? "train"
                         : !valid ? "valid"
                                  : "text and data");
    double ent = 0;
    char line[1200] = "";
    size_t nline = sizeof line;
    if (text && tk) {
        uint8_t *b = NULL;
        size_t n = 0, nids = 0;
        int32_t *ids = NULL;
        tpk_status s = tpk__read_file(ctx, "--text", text, &b, &n);
        if (s == TPK_OK) s = tpk_tokenizer_encode(ctx, tk, (const char *)b, n, &ids, &nids);
        if (s == TPK_OK)
            s = tpk_data_split_tokens(ctx, ids, nids, text, "tokens", span, train, valid, &ent);
        tpk_free(ctx, b), tpk_free(ctx, ids);
        TPK_TRY(s);
        snprintf(line, nline,
                 "data: %s, %zu bytes: %lld training and %lld validation tokens (%s, %.2f bytes a "
                 "token); token-unigram entropy %.3f nats",
                 text, n, (long long)train->n, (long long)valid->n, tk_path,
                 (double)n / (double)(train->n + valid->n), ent);
        if (out) fprintf(out, "%s\n", line);
        return TPK_OK;
    }
    if (text) {
        TPK_TRY(tpk_data_load_text(ctx, text, span, train, valid, &ent));
        snprintf(line, nline,
                 "data: %s, %lld training and %lld validation bytes; byte-unigram entropy %.3f "
                 "nats",
                 text, (long long)train->n, (long long)valid->n, ent);
        if (out) fprintf(out, "%s\n", line);
        return TPK_OK;
    }
    TPK_TRY(tpk_data_load_shard(ctx, data, vocab, train));
    TPK_TRY(tpk_data_load_shard(ctx, val ? val : data, vocab, valid));
    if (train->n < span || valid->n < span)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "the data holds fewer than B x S + 1 = %lld tokens", (long long)span);
    return TPK_OK;
}

/* n tokens of m (dropout off) after `prompt` (NULL or "": one end-of-text token, not shown; else
 * its tokenizer's ids, or its bytes without a tokenizer), drawn under so with seed; printed on out
 * (NULL: not) between "--- sample (N tokens...) ---" and "---". Collective over the model's
 * ranks. */
static inline tpk_status tpk_run_sample(tpk_ctx *ctx, tpk_model *m, tpk_tokenizer *tk,
                                        const char *prompt, int n, const tpk_sample_opts *so,
                                        uint64_t seed, FILE *out) {
    static const char *fn = "tpk_run_sample";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !so || n < 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s",
                         !m    ? "m: NULL"
                         : !so ? "so: NULL"
                               : "n: expected >= 1");
    int64_t V = tpk_model_vocab(m);
    bool bytes = !tk && V <= 256;
    size_t np = 0, pl = prompt ? strlen(prompt) : 0, tn = 0;
    int32_t *ids = NULL, *seq = NULL;
    char *text = NULL;
    tpk_status s = TPK_OK;
    if (pl && tk) s = tpk_tokenizer_encode(ctx, tk, prompt, pl, &ids, &np);
    else if (pl && (ids = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * pl)))
        for (np = 0; np < pl; np++) ids[np] = (uint8_t)prompt[np];
    bool start = !np; /* no prompt: one end-of-text token, not printed */
    if (s == TPK_OK && start && !(ids = (int32_t *)tpk__malloc(ctx, sizeof(int32_t))))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "a prompt");
    if (s == TPK_OK && start)
        np = 1, ids[0] = tk && tk->eot >= 0 ? tk->eot : bytes ? '\n' : V > 50256 ? 50256 : 0;
    if (s == TPK_OK && !(seq = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * (np + (size_t)n))))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu tokens", np + (size_t)n);
    if (s == TPK_OK) s = tpk_model_set_dropout(ctx, m, 0);
    if (s == TPK_OK) s = tpk_model_generate(ctx, m, ids, (int)np, n, so, seed, seq);
    const int32_t *shown = seq + (start ? 1 : 0);
    size_t ns = np + (size_t)n - (start ? 1 : 0);
    if (s == TPK_OK && tk) s = tpk_tokenizer_decode(ctx, tk, shown, ns, false, &text, &tn);
    if (s == TPK_OK && out) {
        fprintf(out, "--- sample (%d tokens%s) ---\n", n, start ? "" : " after the prompt");
        if (tk) fwrite(text, 1, tn, out);
        for (size_t i = 0; !tk && i < ns; i++) {
            int c = shown[i];
            if (bytes) fputc(c == '\n' || c == '\t' || (c >= 32 && c < 127) ? c : '?', out);
            else fprintf(out, "%d ", c);
        }
        fprintf(out, "\n---\n");
    }
    tpk_free(ctx, ids), tpk_free(ctx, seq), tpk_free(ctx, text);
    return s;
}

#endif /* TPK_TRAIN_SOURCES_H */
