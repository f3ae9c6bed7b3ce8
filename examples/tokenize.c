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
 * One process; no MPI. Errors: one line on stderr, exit status 1. */
#include <errno.h>
#include <limits.h>
#include <tpk/base/ctx.h>
#include <tpk/text/tokenizer.h>

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
/* The whole of path ("-": standard input) into *b, *n. */
static tpk_status read_all(const char *path, uint8_t **b, size_t *n) {
    return strcmp(path, "-") ? tpk__read_file(&ctx, "tokenize", path, b, n)
                             : tpk__read_stream(&ctx, "tokenize", "standard input", stdin, b, n);
}
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
    const char *tok = NULL, *out = NULL, *print = NULL, *decode = NULL;
    double val = 0.1;
    long long shard = 100000000;
    bool skip = false;
    int nfiles = 0;
    const char **files = (const char **)calloc((size_t)argc, sizeof *files);
    if (!files) return die("%s", "out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = !strcmp(a, "--tokenizer") || !strcmp(a, "--out") || !strcmp(a, "--print") ||
                     !strcmp(a, "--decode") || !strcmp(a, "--val") || !strcmp(a, "--shard-tokens");
        if (takes && (!v || !*v)) return die("%s: expected a value", a);
        char *end = NULL;
        if (!strcmp(a, "--tokenizer")) tok = v, i++;
        else if (!strcmp(a, "--out")) out = v, i++;
        else if (!strcmp(a, "--print")) print = v, i++;
        else if (!strcmp(a, "--decode")) decode = v, i++;
        else if (!strcmp(a, "--skip-special")) skip = true;
        else if (!strcmp(a, "--val")) {
            val = strtod(v, &end), i++;
            if (*end || !(val >= 0 && val < 1))
                return die("--val: expected a fraction in [0, 1), got \"%s\"", v);
        } else if (!strcmp(a, "--shard-tokens")) {
            shard = strtoll(v, &end, 10), i++;
            if (*end || shard < 1 || shard > INT_MAX) /* the header counts in int32 */
                return die("--shard-tokens: expected a whole number in 1..2^31-1, got \"%s\"", v);
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: tokenize --tokenizer DIR (--out PREFIX [--val 0.1] [--shard-tokens N] "
                   "FILE... | --print FILE | --decode FILE [--skip-special])\n");
            return 0;
        } else if (a[0] == '-' && a[1] == '-')
            return die("%s: unknown flag (--help lists them)", a);
        else files[nfiles++] = a;
    }
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
        if (read_all(print, &b, &n) != TPK_OK ||
            tpk_tokenizer_encode(&ctx, t, (const char *)b, n, &ids, &nids) != TPK_OK)
            goto fail;
        for (size_t i = 0; i < nids; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        printf("\n");
    } else if (decode) {
        if (read_all(decode, &b, &n) != TPK_OK) goto fail;
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
            if (tpk__read_file(&ctx, "tokenize", files[f], &b, &n) != TPK_OK) goto fail;
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
