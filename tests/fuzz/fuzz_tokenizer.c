/* tests/fuzz/fuzz_tokenizer.c — fuzz target for tpk/text (the JSON reader, tokenizer.json's
 * loader, the encoder and the decoder). The input's first byte picks what the rest is:
 *   even: a tokenizer.json, to tpk_tokenizer_parse (tpk/text/json.h's reader, the kit's one). A
 *         refusal is TPK_ERR_FORMAT or TPK_ERR_UNSUPPORTED with a message naming the input
 *         ("...: input: ..."), and a JSON fault's byte offset ("input: byte N: ...") lies inside
 *         it. An accepted tokenizer encodes the input itself: every
 *         id below its vocabulary, and the ids decode;
 *   odd:  text for the fixture tests/tokenizer/tokenizer.json (GPT-2's settings, loaded once):
 *         decode(encode(x)) is x with each ill-formed UTF-8 sequence replaced by U+FFFD, byte for
 *         byte (a GPT-2 byte-level BPE loses nothing else).
 * Whatever the bytes: a status, no crash, no read outside them. A broken promise aborts.
 * tests/test_text.c includes this file (TPK_FUZZ_NO_MAIN) to replay tests/fuzz/corpus_tokenizer:
 * files named valid_* must be accepted, bad_* refused as TPK_ERR_FORMAT. */
#include <tpk/text/tokenizer.h>

/* ids of text[0..n) decoded: every id in the vocabulary, decode succeeds; *back (malloc'd) */
static void fuzz_tok_roundtrip(tpk_ctx *ctx, tpk_tokenizer *t, const uint8_t *text, size_t n,
                               char **back, size_t *nb) {
    int32_t *ids = NULL;
    size_t k = 0;
    if (tpk_tokenizer_encode(ctx, t, (const char *)text, n, &ids, &k) != TPK_OK) abort();
    for (size_t i = 0; i < k; i++)
        if (ids[i] < 0 || ids[i] >= t->vocab_size) abort();
    if (tpk_tokenizer_decode(ctx, t, ids, k, false, back, nb) != TPK_OK) abort();
    free(ids);
}

static tpk_status fuzz_tokenizer_one(const uint8_t *data, size_t size) {
    tpk_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    if (!size) return TPK_ERR_FORMAT;
    const uint8_t *s = data + 1;
    size_t n = size - 1;
    char *back = NULL;
    size_t nb = 0;
    if (data[0] % 2 == 0) {
        tpk_tokenizer *t = NULL;
        tpk_status st = tpk_tokenizer_parse(&ctx, (const char *)s, n, "input", &t);
        if (st != TPK_OK) {
            const char *at = strstr(ctx.err, ": input: ");
            if ((st != TPK_ERR_FORMAT && st != TPK_ERR_UNSUPPORTED) || !at || t) abort();
            at += 9; /* a JSON fault: "byte N: ...", N inside the text (N = n: it ends there) */
            if (!strncmp(at, "byte ", 5) && strtoull(at + 5, NULL, 10) > n) abort();
            return st;
        }
        fuzz_tok_roundtrip(&ctx, t, s, n, &back, &nb);
        free(back), tpk_tokenizer_free(t);
        return TPK_OK;
    }
    static tpk_tokenizer *fixture;
    if (!fixture &&
        tpk_tokenizer_load(&ctx, "tests/tokenizer/tokenizer.json", &fixture) != TPK_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s (run from the repository's root)\n", ctx.err);
        abort();
    }
    fuzz_tok_roundtrip(&ctx, fixture, s, n, &back, &nb);
    uint8_t *want = NULL;
    size_t nw = 0;
    if (tpk__utf8_lossy(&ctx, "fuzz", s, n, &want, &nw) != TPK_OK) abort();
    if (want ? nb != nw || memcmp(back, want, nw) : nb != n || memcmp(back, s, n)) abort();
    free(back), free(want);
    return TPK_OK;
}

#ifndef TPK_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_tokenizer_one(data, size);
    return 0;
}
#endif
