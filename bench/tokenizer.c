/* bench/tokenizer — tpk/text/tokenizer.h's encoding speed on one core: the file encoded line by
 * line (each line with its newline, as a batch of documents), three times (the first with an
 * empty word cache), MB/s of each and the ids' count.
 *   tokenizer DIR FILE */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <tpk/base/ctx.h>
#include <tpk/text/tokenizer.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    static tpk_ctx ctx;
    if (argc != 3) return fprintf(stderr, "usage: tokenizer DIR FILE\n"), 2;
    tpk_tokenizer *t = NULL;
    uint8_t *b = NULL;
    size_t n = 0;
    if (tpk_tokenizer_load(&ctx, argv[1], &t) != TPK_OK ||
        tpk__read_file(&ctx, "tokenizer", argv[2], &b, &n) != TPK_OK)
        return fprintf(stderr, "tokenizer: %s\n", tpk_last_error(&ctx)), 1;
    for (int pass = 0; pass < 3; pass++) {
        int32_t *ids = NULL;
        size_t k = 0;
        double t0 = now();
        for (size_t p = 0, q; p < n; p = q) {
            const uint8_t *e = (const uint8_t *)memchr(b + p, '\n', n - p);
            q = e ? (size_t)(e - b) + 1 : n;
            if (tpk_tokenizer_encode(&ctx, t, (const char *)b + p, q - p, &ids, &k) != TPK_OK)
                return fprintf(stderr, "tokenizer: %s\n", tpk_last_error(&ctx)), 1;
        }
        double s = now() - t0;
        printf("tpk pass %d: %.1f MB in %.3f s: %.1f MB/s, %zu ids\n", pass, (double)n * 1e-6, s,
               (double)n * 1e-6 / s, k);
        free(ids);
    }
    free(b), tpk_tokenizer_free(t);
    return 0;
}
