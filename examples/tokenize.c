/* tokenize — text files to llm.c token shards, and ids to text, with a Hugging Face tokenizer
 * (tpk/text/tokenizer.h: byte-level BPE, GPT-2 and GPT-NeoX tokenizer.json, or GPT-2's
 * vocab.json + merges.txt).
 *
 *   tokenize --tokenizer DIR --out PREFIX [--val 0.1] [--shard-tokens 100000000] FILE...
 *       each FILE one document, preceded by the end-of-text token (llm.c's convention); the
 *       first --val of the tokens to PREFIX_val_000000.bin, the rest to PREFIX_train_000000.bin,
 *       _000001, ... (a shard: 256 int32 header — 20240520, 1, count — then uint16 tokens)
 *   tokenize --tokenizer DIR --print FILE     FILE's ids on one line, space-separated, no special
 *                                             tokens added ("-": standard input)
 *   tokenize --tokenizer DIR --decode FILE    ids (whitespace-separated) back to bytes on stdout
 *                                             (--skip-special: special tokens left out)
 * --tokenizer is the trainer's flag (tpk/train/options.h), the rest a table here, parsed by the
 * same parser (tpk/train/flags.h): the same messages. One process; no MPI. Errors: one line on
 * stderr, exit status 1. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <tpk/base/ctx.h>
#include <tpk/text/tokenizer.h>
#include <tpk/train/options.h>
#include <tpk/train/sources.h>

static tpk_ctx ctx; /* for its error message alone */

static int die(const char *fmt, const char *a) {
    fprintf(stderr, "tokenize: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    return 1;
}
static int failed(void) {
    fprintf(stderr, "tokenize: %s\n", tpk_last_error(&ctx));
    return 1;
}
/* The tokenizer's own flags (--tokenizer: the trainer's table's). */
typedef struct opts {
    const char *out, *print, *decode;
    double val;
    int64_t shard;
    bool skip;
} opts;
static const tpk_flag tokenize_flags[] = {
    {"--out", TPK_FLAG_STR, 0, 0, NULL, "PREFIX", NULL, 1, "shards",
     "FILE... after the flags: PREFIX_val_000000.bin, PREFIX_train_000000.bin, ...",
     offsetof(opts, out)},
    {"--val", TPK_FLAG_NUM, 0, 0.999999, "0.1", NULL, "a fraction in [0, 1)", 1, "shards",
     "the validation share", offsetof(opts, val)},
    {"--shard-tokens", TPK_FLAG_INT, 1, INT_MAX, "100000000", NULL, NULL, 1, "shards",
     "tokens a shard; its header counts in int32", offsetof(opts, shard)},
    {"--print", TPK_FLAG_STR, 0, 0, NULL, "FILE", NULL, 1, "ids", "its ids (\"-\": standard input)",
     offsetof(opts, print)},
    {"--decode", TPK_FLAG_STR, 0, 0, NULL, "FILE", NULL, 1, "decode", "ids back to bytes",
     offsetof(opts, decode)},
    {"--skip-special", TPK_FLAG_BOOL, 0, 0, NULL, NULL, NULL, 1, "decode",
     "special tokens left out", offsetof(opts, skip)},
};
/* ids[0..n) as an llm.c shard (version 1: uint16 tokens). */
static tpk_status write_shard(const char *path, const int32_t *ids, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return tpk_fail(&ctx, TPK_ERR_IO, "tokenize", "%s: cannot create: %s", path,
                        strerror(errno));
    int32_t h[256] = {20240520, 1, (int32_t)n};
    bool ok = fwrite(h, sizeof h, 1, f) == 1;
    uint16_t buf[4096];
    for (size_t i = 0; ok && i < n; i += 4096) {
        size_t k = n - i < 4096 ? n - i : 4096;
        for (size_t j = 0; j < k; j++) buf[j] = (uint16_t)ids[i + j];
        ok = fwrite(buf, 2, k, f) == k;
    }
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        remove(path); /* never a shard cut short */
        return tpk_fail(&ctx, TPK_ERR_IO, "tokenize", "%s: cannot write: %s", path,
                        strerror(errno));
    }
    printf("%s: %zu tokens\n", path, n);
    return TPK_OK;
}

int main(int argc, char **argv) {
    opts o;
    tpk_run_opts ro;
    int nt = 0, nfiles = 0;
    const tpk_flag *table = tpk_run_flags(&nt);
    tpk_flag_set sets[2] = {
        {table, nt, TPK_OPT_TOKENIZER, &ro},
        {tokenize_flags, (int)(sizeof tokenize_flags / sizeof tokenize_flags[0]), 1, &o}};
    char err[512];
    const char **files = (const char **)calloc((size_t)argc, sizeof *files);
    if (!files) return die("%s", "out of memory");
    int pr = tpk_flags_parse(sets, 2, argc, argv, files, &nfiles, err, sizeof err);
    if (pr < 0)
        tpk_flags_usage(stdout,
                        "usage: tokenize --tokenizer DIR (--out PREFIX [--val 0.1] [--shard-tokens "
                        "N] FILE... | --print FILE | --decode FILE [--skip-special])\n",
                        sets, 2);
    if (pr) free(files);
    if (pr < 0) return 0;
    if (pr > 0) return die("error: %s", err);
    const char *tok = ro.tokenizer, *out = o.out, *print = o.print, *decode = o.decode;
    double val = o.val;
    long long shard = (long long)o.shard;
    bool skip = o.skip;
    if (!tok)
        return die("%s",
                   "--tokenizer DIR: required (a folder with tokenizer.json, or vocab.json and "
                   "merges.txt)");
    if (!!print + !!decode + !!out != 1)
        return die("%s", "give one of --out PREFIX FILE..., --print FILE, --decode FILE");
    if (out && !nfiles) return die("%s", "--out: expected text files after the flags");
    if (!out && nfiles) return die("%s: a file without --out", files[0]);
    tpk_tokenizer *t = NULL;
    if (tpk_tokenizer_load(&ctx, tok, &t) != TPK_OK) return failed();
    int rc = 1;
    uint8_t *b = NULL;
    size_t n = 0, nids = 0;
    int32_t *ids = NULL;
    char *text = NULL;
    if (print) {
        if (tpk_run_read_file(&ctx, print, &b, &n) != TPK_OK ||
            tpk_tokenizer_encode(&ctx, t, (const char *)b, n, &ids, &nids) != TPK_OK)
            goto fail;
        for (size_t i = 0; i < nids; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        printf("\n");
    } else if (decode) {
        if (tpk_run_read_file(&ctx, decode, &b, &n) != TPK_OK) goto fail;
        size_t cap = n / 2 + 1;
        ids = (int32_t *)malloc(cap * sizeof *ids);
        if (!ids) {
            tpk_fail(&ctx, TPK_ERR_NOMEM, "tokenize", "%zu ids", cap);
            goto fail;
        }
        for (size_t p = 0; p < n;) {
            if (b[p] == ' ' || b[p] == '\n' || b[p] == '\t' || b[p] == '\r') {
                p++;
                continue;
            }
            long long v = 0;
            size_t q = p;
            while (q < n && b[q] >= '0' && b[q] <= '9' && v <= INT_MAX) v = v * 10 + (b[q++] - '0');
            if (q == p || v > INT_MAX ||
                (q < n && b[q] != ' ' && b[q] != '\n' && b[q] != '\t' && b[q] != '\r')) {
                tpk_fail(&ctx, TPK_ERR_FORMAT, "--decode",
                         "%s: byte %zu: expected token ids (whole numbers separated by spaces)",
                         decode, q);
                goto fail;
            }
            ids[nids++] = (int32_t)v, p = q;
        }
        size_t m = 0;
        if (tpk_tokenizer_decode(&ctx, t, ids, nids, skip, &text, &m) != TPK_OK) goto fail;
        if (fwrite(text, 1, m, stdout) != m) {
            tpk_fail(&ctx, TPK_ERR_IO, "tokenize", "standard output: cannot write");
            goto fail;
        }
    } else {
        if (t->vocab_size > 65536) {
            tpk_fail(&ctx, TPK_ERR_UNSUPPORTED, "tokenize",
                     "%s: %lld tokens: an llm.c shard holds ids below 65536", tok,
                     (long long)t->vocab_size);
            goto fail;
        }
        if (t->eot < 0)
            fprintf(stderr, "tokenize: note: the tokenizer has no end-of-text token: documents "
                            "are joined without one\n");
        for (int f = 0; f < nfiles; f++) {
            if (tpk_run_read_file(&ctx, files[f], &b, &n) != TPK_OK) goto fail;
            if (t->eot >= 0) {
                int32_t e = t->eot;
                int32_t *g = (int32_t *)realloc(ids, (nids + 1) * sizeof *ids);
                if (!g) {
                    tpk_fail(&ctx, TPK_ERR_NOMEM, "tokenize", "%zu ids", nids + 1);
                    goto fail;
                }
                ids = g, ids[nids++] = e;
            }
            if (tpk_tokenizer_encode(&ctx, t, (const char *)b, n, &ids, &nids) != TPK_OK) goto fail;
            free(b), b = NULL;
        }
        size_t nv = (size_t)((double)nids * val + 0.5), k = 0;
        size_t plen = strlen(out) + 32;
        char *path = (char *)malloc(plen);
        if (!path) goto fail;
        bool ok = true;
        for (size_t at = 0; ok && at < nv; at += (size_t)shard, k++)
            snprintf(path, plen, "%s_val_%06zu.bin", out, k),
                ok = write_shard(path, ids + at,
                                 nv - at < (size_t)shard ? nv - at : (size_t)shard) == TPK_OK;
        k = 0;
        for (size_t at = nv; ok && at < nids; at += (size_t)shard, k++)
            snprintf(path, plen, "%s_train_%06zu.bin", out, k),
                ok = write_shard(path, ids + at,
                                 nids - at < (size_t)shard ? nids - at : (size_t)shard) == TPK_OK;
        free(path);
        if (!ok) goto fail;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        tpk_fail(&ctx, TPK_ERR_IO, "tokenize", "standard output: cannot write (%s)",
                 strerror(errno));
        goto fail;
    }
    rc = 0;
fail:
    if (rc) failed();
    free(b), free(ids), free(text), free(files), tpk_tokenizer_free(t);
    return rc;
}
