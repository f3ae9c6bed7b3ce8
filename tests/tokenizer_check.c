/* tokenizer_check — tpk/text/tokenizer.h on many strings in one process, for
 * tests/tokenizer_ref.py (which compares the answers with Hugging Face `tokenizers`):
 *   tokenizer_check encode DIR IN OUT         IN: records (uint32 little-endian length, bytes);
 *                                             OUT: one line of space-separated ids per record
 *   tokenizer_check decode DIR IN OUT [skip]  IN: one line of ids per record; OUT: records of
 *                                             the decoded text (skip: special tokens left out)
 *   tokenizer_check load PATH                 loads; prints "ok" or the error (exit 1)
 * Exit status 1 with the kit's error message on any failure. */
#include <tpk/base/ctx.h>
#include <tpk/text/tokenizer.h>

static tpk_ctx ctx;

static int fail(void) {
    fprintf(stderr, "tokenizer_check: %s\n", tpk_last_error(&ctx));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tokenizer_check encode|decode|load DIR [IN OUT [skip]]\n");
        return 2;
    }
    tpk_tokenizer *t = NULL;
    if (tpk_tokenizer_load(&ctx, argv[2], &t) != TPK_OK) return fail();
    if (!strcmp(argv[1], "load")) {
        printf("ok vocab %lld eot %d\n", (long long)t->vocab_size, (int)t->eot);
        tpk_tokenizer_free(t);
        return 0;
    }
    if (argc < 5) return 2;
    uint8_t *b = NULL;
    size_t n = 0;
    if (tpk__read_file(&ctx, "tokenizer_check", argv[3], &b, &n) != TPK_OK) return fail();
    FILE *o = fopen(argv[4], "wb");
    if (!o) return perror(argv[4]), 1;
    int32_t *ids = NULL;
    size_t cap = 0;
    int rc = 0;
    if (!strcmp(argv[1], "encode")) {
        for (size_t p = 0; p + 4 <= n && !rc;) {
            uint32_t len = (uint32_t)b[p] | (uint32_t)b[p + 1] << 8 | (uint32_t)b[p + 2] << 16 |
                           (uint32_t)b[p + 3] << 24;
            p += 4;
            if (len > n - p) return fprintf(stderr, "tokenizer_check: a truncated record\n"), 1;
            size_t k = 0; /* a fresh count, the same array */
            if (tpk_tokenizer_encode(&ctx, t, (const char *)b + p, len, &ids, &k) != TPK_OK)
                rc = fail();
            for (size_t i = 0; !rc && i < k; i++) fprintf(o, i ? " %d" : "%d", (int)ids[i]);
            fprintf(o, "\n");
            p += len;
        }
    } else {
        bool skip = argc > 5 && !strcmp(argv[5], "skip");
        for (size_t p = 0; p < n && !rc;) {
            size_t k = 0;
            while (p < n && b[p] != '\n') {
                if (b[p] == ' ') {
                    p++;
                    continue;
                }
                if (k == cap) {
                    cap = cap ? 2 * cap : 1024;
                    int32_t *g = (int32_t *)realloc(ids, cap * sizeof *ids);
                    if (!g) return fprintf(stderr, "tokenizer_check: out of memory\n"), 1;
                    ids = g;
                }
                ids[k++] = (int32_t)strtol((const char *)b + p, NULL, 10);
                while (p < n && b[p] != ' ' && b[p] != '\n') p++;
            }
            p++;
            char *text = NULL;
            size_t m = 0;
            if (tpk_tokenizer_decode(&ctx, t, ids, k, skip, &text, &m) != TPK_OK) {
                rc = fail();
                break;
            }
            uint8_t h[4] = {(uint8_t)m, (uint8_t)(m >> 8), (uint8_t)(m >> 16), (uint8_t)(m >> 24)};
            fwrite(h, 1, 4, o), fwrite(text, 1, m, o);
            free(text);
        }
    }
    if (fclose(o) != 0) rc = 1;
    free(b), free(ids), tpk_tokenizer_free(t);
    return rc;
}
