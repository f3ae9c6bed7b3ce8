/* tests/fuzz/fuzz_data.c — fuzz target for the token loaders (tpk/train/data.h): each input is
 * parsed as an llm.c shard (tpk_data_parse_shard, vocabulary 50257) and split as byte text
 * (tpk_data_split_text, a span from the first byte). Whatever the bytes: a status, no crash, no
 * read outside them; an accepted shard holds exactly (size - 1024) / 2 tokens, each below the
 * vocabulary; an accepted text split covers every byte in order and its entropy is finite and
 * non-negative; refusals leave no tokens behind. A broken promise aborts.
 * tests/test_data.c includes this file (TPK_FUZZ_NO_MAIN) to replay tests/fuzz/corpus_data:
 * files named valid_shard_* must parse as shards, bad_* must be refused as shards. */
#include <tpk/train/data.h>

static tpk_status fuzz_data_one(const uint8_t *data, size_t size) {
    tpk_ctx ctx;
    tpk_tokens t, tr, va;
    memset(&ctx, 0, sizeof ctx);
    memset(&t, 0xA5, sizeof t); /* poisoned: the loader must set it, a refusal clear it */
    tpk_status s = tpk_data_parse_shard(&ctx, data, size, "input", 50257, &t);
    if (s == TPK_OK) {
        if (size < 1024 || t.n != (int64_t)(size - 1024) / 2 || !t.tok) abort();
        for (int64_t i = 0; i < t.n; i++)
            if (t.tok[i] < 0 || t.tok[i] >= 50257) abort();
        tpk_tokens_free(&t);
    } else if (s != TPK_ERR_FORMAT || t.tok || t.n) {
        abort();
    }
    int64_t span = size ? 2 + data[0] % 64 : 2;
    double ent = -1;
    tpk_status st = tpk_data_split_text(&ctx, data, size, "input", span, &tr, &va, &ent);
    if (st == TPK_OK) {
        if (tr.n + va.n != (int64_t)size || va.n < span || !(ent >= 0 && ent <= log(256.0) + 1e-9))
            abort();
        for (int64_t i = 0; i < (int64_t)size; i++)
            if ((i < tr.n ? tr.tok[i] : va.tok[i - tr.n]) != data[i]) abort();
        tpk_tokens_free(&tr), tpk_tokens_free(&va);
    } else if (st != TPK_ERR_SHAPE || tr.tok || va.tok) {
        abort();
    }
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_data_one(data, size);
    return 0;
}
