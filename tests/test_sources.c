/* tests/test_sources.c — a trainer's tokens and text (tpk/train/sources.h), each rank in a folder
 * of its own, against the calls they stand for: the tokenizer of --tokenizer or of a loaded
 * checkpoint's folder (none where it has none); the data of a text file as bytes
 * (tpk_data_load_text) or as a tokenizer's ids (tpk_tokenizer_encode, tpk_data_split_tokens) and
 * of llm.c shards (tpk_data_load_shard), with the line each prints; shards shorter than a batch
 * refused; the text's fit to a vocabulary (three messages); a sample of a byte model equal to
 * tpk_model_generate's ids shown as bytes, and one after a prompt. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <tpk/train/sources.h>

static const char *tok_json =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u010a\": 3}, "
    "\"merges\": [\"a b\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
    "\"add_prefix_space\": false}}";

static void put(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) fwrite(b, 1, n, f), fclose(f);
}
static bool same_tokens(const tpk_tokens *a, const tpk_tokens *b) {
    return a->n == b->n && !memcmp(a->tok, b->tok, sizeof(int32_t) * (size_t)a->n);
}
/* out's text (a memstream) into *text */
static FILE *capture(char **text, size_t *len) { return open_memstream(text, len); }

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    char base[100], p[200], q[200], cmd[600];
    snprintf(base, sizeof base, "build/tests/sources_np%d_r%d", test__size, test__rank);
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/tok %s/ck", base, base, base);
    (void)system(cmd);
    tpk_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    char text[4000];
    for (int i = 0; i < 3999; i++)
        text[i] = "ab\nba"[(int)(5 * test_dropout_u(1, 2, (uint64_t)i)) % 5];
    text[3999] = 0;
    snprintf(p, sizeof p, "%s/text.txt", base);
    put(p, text, strlen(text));
    snprintf(q, sizeof q, "%s/tok/tokenizer.json", base);
    put(q, tok_json, strlen(tok_json));

    TEST_CASE("sources: the tokenizer of --tokenizer or of the checkpoint's folder") {
        tpk_tokenizer *tk = NULL;
        const char *from = "x";
        char tokdir[120], ck[120];
        snprintf(tokdir, sizeof tokdir, "%s/tok", base), snprintf(ck, sizeof ck, "%s/ck", base);
        CHECK_OK(&ctx, tpk_run_tokenizer(&ctx, NULL, ck, &tk, &from));
        CHECK(!tk && !from, "none in a checkpoint without one");
        CHECK_OK(&ctx, tpk_run_tokenizer(&ctx, tokdir, NULL, &tk, &from));
        CHECK(tk && from == tokdir && tk->vocab_size == 4, "--tokenizer");
        tpk_tokenizer_free(tk), tk = NULL;
        snprintf(cmd, sizeof cmd, "cp %s %s/", q, ck);
        (void)system(cmd);
        CHECK_OK(&ctx, tpk_run_tokenizer(&ctx, NULL, ck, &tk, &from));
        CHECK(tk && from == ck, "the checkpoint's own");
        uint8_t *b = NULL;
        size_t n = 0;
        CHECK_OK(&ctx, tpk_run_read_file(&ctx, p, &b, &n));
        CHECK(b && n == strlen(text) && !memcmp(b, text, n), "the file's bytes");
        tpk_free(&ctx, b);

        tpk_tokens tr = {0}, va = {0}, rt = {0}, rv = {0};
        char *out = NULL;
        size_t len = 0;
        FILE *f = capture(&out, &len);
        CHECK_OK(&ctx, tpk_run_data(&ctx, p, tk, "TOK", NULL, NULL, 4, 17, &tr, &va, f));
        fclose(f);
        int32_t *ids = NULL;
        size_t nids = 0;
        double ent = 0;
        CHECK_OK(&ctx, tpk_tokenizer_encode(&ctx, tk, text, strlen(text), &ids, &nids));
        CHECK_OK(&ctx, tpk_data_split_tokens(&ctx, ids, nids, p, "tokens", 17, &rt, &rv, &ent));
        CHECK(same_tokens(&tr, &rt) && same_tokens(&va, &rv), "the tokenizer's ids");
        char want[400];
        snprintf(want, sizeof want,
                 "data: %s, %zu bytes: %lld training and %lld validation tokens (TOK, %.2f bytes a "
                 "token); token-unigram entropy %.3f nats\n",
                 p, strlen(text), (long long)rt.n, (long long)rv.n,
                 (double)strlen(text) / (double)(rt.n + rv.n), ent);
        CHECK(out && !strcmp(out, want), "line: %s", out ? out : "");
        free(out), tpk_free(&ctx, ids);
        tpk_tokens_free(&tr), tpk_tokens_free(&va), tpk_tokens_free(&rt), tpk_tokens_free(&rv);
        tpk_tokenizer_free(tk);
    }

    TEST_CASE("sources: bytes and shards") {
        tpk_tokens tr = {0}, va = {0}, rt = {0}, rv = {0};
        double ent = 0;
        CHECK_OK(&ctx, tpk_run_data(&ctx, p, NULL, NULL, NULL, NULL, 256, 33, &tr, &va, NULL));
        CHECK_OK(&ctx, tpk_data_load_text(&ctx, p, 33, &rt, &rv, &ent));
        CHECK(same_tokens(&tr, &rt) && same_tokens(&va, &rv), "the bytes");
        tpk_tokens_free(&tr), tpk_tokens_free(&va), tpk_tokens_free(&rv);
        /* a shard: 256 int32 header (20240520, 1, n), then uint16 tokens */
        static int32_t h[256];
        uint16_t t16[300];
        h[0] = 20240520, h[1] = 1, h[2] = 300;
        for (int i = 0; i < 300; i++) t16[i] = (uint16_t)(rt.tok[i] % 256);
        char sh[120];
        snprintf(sh, sizeof sh, "%s/s.bin", base);
        FILE *f = fopen(sh, "wb");
        if (f) fwrite(h, sizeof h, 1, f), fwrite(t16, 2, 300, f), fclose(f);
        CHECK_OK(&ctx, tpk_run_data(&ctx, NULL, NULL, NULL, sh, NULL, 256, 33, &tr, &va, NULL));
        CHECK_OK(&ctx, tpk_data_load_shard(&ctx, sh, 256, &rv));
        CHECK(same_tokens(&tr, &rv) && same_tokens(&va, &rv), "a shard for both");
        tpk_tokens_free(&tr), tpk_tokens_free(&va);
        CHECK(tpk_run_data(&ctx, NULL, NULL, NULL, sh, NULL, 256, 301, &tr, &va, NULL) ==
                      TPK_ERR_SHAPE &&
                  strstr(tpk_last_error(&ctx), "fewer than B x S + 1 = 301 tokens"),
              "%s", tpk_last_error(&ctx));
        tpk_tokens_free(&tr), tpk_tokens_free(&va), tpk_tokens_free(&rt), tpk_tokens_free(&rv);
    }

    TEST_CASE("sources: the text's fit to the model's vocabulary") {
        char e[300] = "";
        tpk_tokenizer tk;
        memset(&tk, 0, sizeof tk);
        tk.vocab_size = 300;
        CHECK(tpk_run_text_fits(NULL, NULL, "f", NULL, 256, e, sizeof e), "bytes fit 256");
        CHECK(!tpk_run_text_fits(NULL, NULL, "f", NULL, 100, e, sizeof e) &&
                  !strcmp(e, "--text needs a vocabulary of at least 256 (the model has 100)"),
              "%s", e);
        CHECK(!tpk_run_text_fits(&tk, "T", "f", NULL, 256, e, sizeof e) &&
                  !strcmp(e, "--tokenizer T: 300 tokens, more than the model's vocabulary of 256"),
              "%s", e);
        CHECK(!tpk_run_text_fits(NULL, NULL, NULL, "hi", 50257, e, sizeof e) &&
                  !strcmp(e, "--prompt: needs a tokenizer (--tokenizer DIR) for a vocabulary of "
                             "50257 tokens"),
              "%s", e);
    }

    TEST_CASE("sources: a sample of a byte model, as generate draws it") {
        tpk_ctx c;
        tpk_comm self = tpk_comm_self(false);
        tpk_model m;
        tpk_model_config mc;
        memset(&mc, 0, sizeof mc);
        mc.arch = TPK_ARCH_GPT2, mc.gpt2.vocab = 256, mc.gpt2.positions = 16, mc.gpt2.layers = 1;
        mc.gpt2.hidden = 8, mc.gpt2.heads = 2;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &self, .seed = 4}));
        CHECK_OK(&c, tpk_model_init(&c, &m, &mc));
        tpk_sample_opts so = {1.0f, 0, 1.0f};
        char *out = NULL;
        size_t len = 0;
        FILE *f = capture(&out, &len);
        CHECK_OK(&c, tpk_run_sample(&c, &m, NULL, NULL, 6, &so, 7, f));
        CHECK_OK(&c, tpk_run_sample(&c, &m, NULL, "ab", 3, &so, 7, f));
        fclose(f);
        int32_t start = '\n', seq[7], pr[2] = {'a', 'b'}, seq2[5];
        CHECK_OK(&c, tpk_model_generate(&c, &m, &start, 1, 6, &so, 7, seq));
        CHECK_OK(&c, tpk_model_generate(&c, &m, pr, 2, 3, &so, 7, seq2));
        char want[200] = "--- sample (6 tokens) ---\n";
        for (int i = 1; i < 7; i++) {
            int ch = seq[i];
            size_t at = strlen(want);
            want[at] = (char)(ch == '\n' || ch == '\t' || (ch >= 32 && ch < 127) ? ch : '?');
            want[at + 1] = 0;
        }
        strcat(want, "\n---\n--- sample (3 tokens after the prompt) ---\n");
        for (int i = 0; i < 5; i++) {
            int ch = seq2[i];
            size_t at = strlen(want);
            want[at] = (char)(ch == '\n' || ch == '\t' || (ch >= 32 && ch < 127) ? ch : '?');
            want[at + 1] = 0;
        }
        strcat(want, "\n---\n");
        CHECK(out && !strcmp(out, want), "got\n%s\nwant\n%s", out ? out : "", want);
        free(out);
        CHECK(tpk_run_sample(&c, &m, NULL, NULL, 0, &so, 7, NULL) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&c), "n: expected >= 1"),
              "%s", tpk_last_error(&c));
        tpk_model_destroy(&c, &m), tpk_ctx_destroy(&c);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    (void)system(cmd);
    return test_finish();
}
