/* tests/test_text.c — tpk/text by hand-worked cases, independent of Hugging Face
 * (tests/tokenizer.sh compares with the library itself): the JSON reader's escapes (surrogate pairs
 * into UTF-8), its refusals with a byte offset (a lone surrogate, a control character, nesting past
 * 64 levels, trailing characters, a bad number, truncation); BPE's order on a tokenizer written
 * here: the lowest rank first, the leftmost of equal ranks ("aaa" -> "aa a"), a merge of merges, a
 * byte without a token dropped, ignore_merges taking a whole-word token, an added token cut out of
 * the text before the words (and single_word refusing one inside a word); decode turning bytes that
 * are not UTF-8 into U+FFFD; bad arguments. The tokenizer fuzz corpus (tests/fuzz/corpus_tokenizer)
 * is replayed through the fuzz target's checks. Every rank runs the same cases. */
#include "test.h"

#define TPK_FUZZ_NO_MAIN
#include "fuzz/fuzz_tokenizer.c"

/* ids of s through t, as "1 2 3" in buf */
static const char *enc(tpk_ctx *ctx, tpk_tokenizer *t, const char *s, char *buf, size_t n) {
    int32_t *ids = NULL;
    size_t k = 0;
    buf[0] = 0;
    if (tpk_tokenizer_encode(ctx, t, s, strlen(s), &ids, &k) != TPK_OK) return "(error)";
    for (size_t i = 0; i < k; i++)
        snprintf(buf + strlen(buf), n - strlen(buf), i ? " %d" : "%d", (int)ids[i]);
    free(ids);
    return buf;
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    tpk_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    char buf[256];

    TEST_CASE("JSON: escapes and surrogate pairs decoded; refusals name the byte") {
        const char *doc = "{\"k\": \"a\\u00e9\\ud83d\\ude00\\n\\\"\", \"n\": -1.5e2, \"x\": [true, "
                          "null], \"k\": \"last\"}";
        tpk__json root;
        char *arena = NULL;
        CHECK_OK(&ctx, tpk__json_parse(&ctx, "doc", doc, strlen(doc), &root, &arena));
        const tpk__json *k = tpk__json_get(&root, "k"), *n = tpk__json_get(&root, "n");
        CHECK(k && k->len == 4 && !strcmp(k->str, "last"), "a repeated key: the last");
        CHECK(root.len == 4 && root.kids[0].len == 9 &&
                  !memcmp(root.kids[0].str, "a\xc3\xa9\xf0\x9f\x98\x80\n\"", 9),
              "escapes decoded to UTF-8: %s", root.kids[0].str);
        CHECK(n && n->type == TPK__JNUM && n->num == -150, "a number");
        tpk__json_free(&root, &arena);
        static const struct {
            const char *doc, *want;
        } bad[] = {
            {"{\"a\": \"\\ud800x\"}", "byte 7: a lone high surrogate"},
            {"{\"a\": \"\\udc00\"}", "byte 7: a lone low surrogate"},
            {"[\"a\tb\"]", "byte 3: a control character inside a string"},
            {"[1, 2] x", "byte 7: characters after the document"},
            {"[01]", "byte 1: a bad number"},
            {"{\"a\": [1, 2", "truncated JSON"},
            {"{\"a\" 1}", "byte 5: expected ':'"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            CHECK_FAILS(&ctx,
                        tpk__json_parse(&ctx, "doc", bad[i].doc, strlen(bad[i].doc), &root, &arena),
                        TPK_ERR_FORMAT, bad[i].want);
            tpk__json_free(&root, &arena);
        }
        char deep[200];
        memset(deep, '[', 65), memset(deep + 65, ']', 65), deep[130] = 0;
        CHECK_FAILS(&ctx, tpk__json_parse(&ctx, "doc", deep, 130, &root, &arena), TPK_ERR_FORMAT,
                    "byte 64: nested deeper than 64 levels");
        tpk__json_free(&root, &arena);
    }

    TEST_CASE("BPE: lowest rank first, leftmost of equal ranks, merges of merges, added tokens") {
        /* ids: a 0, b 1, c 2, aa 3, bc 4, abc 5, "Ġ" 6, x 7; merges by rank: b c, a a, a bc */
        const char *json =
            "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"aa\": 3, "
            "\"bc\": 4, \"abc\": 5, \"\\u0120\": 6, \"x\": 7, \"xx\": 8},"
            " \"merges\": [\"b c\", \"a a\", \"a bc\"], \"ignore_merges\": IM},"
            " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
            " \"added_tokens\": [{\"id\": 9, \"content\": \"<s>\", \"special\": true, "
            "\"normalized\": false}, {\"id\": 10, \"content\": \"cab\", \"single_word\": true}]}";
        char doc[800];
        const char *im = strstr(json, "IM");
        snprintf(doc, sizeof doc, "%.*sfalse%s", (int)(im - json), json, im + 2);
        tpk_tokenizer *t = NULL;
        CHECK_OK(&ctx, tpk_tokenizer_parse(&ctx, doc, strlen(doc), "doc", &t));
        if (t) {
            CHECK(t->vocab_size == 11 && t->eot == 9, "vocab %lld eot %d", (long long)t->vocab_size,
                  (int)t->eot);
            /* abc: (b c) rank 0 before (a b) no merge -> a bc -> (a bc) rank 2 -> abc */
            CHECK(!strcmp(enc(&ctx, t, "abc", buf, sizeof buf), "5"), "abc -> %s", buf);
            /* aaa: (a a) at 0 and 1, same rank: the leftmost -> aa a */
            CHECK(!strcmp(enc(&ctx, t, "aaa", buf, sizeof buf), "3 0"), "aaa -> %s", buf);
            CHECK(!strcmp(enc(&ctx, t, "aaaa", buf, sizeof buf), "3 3"), "aaaa -> %s", buf);
            /* "q" has no token: dropped, as the library drops it without an unknown token */
            CHECK(!strcmp(enc(&ctx, t, "aqa", buf, sizeof buf), "3"), "aqa -> %s", buf);
            /* " a": two words? no: " ?\p{L}+" is one word, Ġ a (no merge) */
            CHECK(!strcmp(enc(&ctx, t, " a", buf, sizeof buf), "6 0"), "' a' -> %s", buf);
            /* <s> cut out first; "cab" alone is a word, inside "xcab" it is not (single_word) */
            CHECK(!strcmp(enc(&ctx, t, "a<s>a", buf, sizeof buf), "0 9 0"), "a<s>a -> %s", buf);
            CHECK(!strcmp(enc(&ctx, t, "cab", buf, sizeof buf), "10"), "cab -> %s", buf);
            CHECK(!strcmp(enc(&ctx, t, "xcab", buf, sizeof buf), "7 2 0 1"), "xcab -> %s", buf);
            /* xx is a token, yet no merge makes it: without ignore_merges x x */
            CHECK(!strcmp(enc(&ctx, t, "xx", buf, sizeof buf), "7 7"), "xx -> %s", buf);
            int32_t bad_utf8[3] = {0, 6, 0}, out_of[1] = {11};
            char *s = NULL;
            size_t n = 0;
            CHECK_OK(&ctx, tpk_tokenizer_decode(&ctx, t, bad_utf8, 3, false, &s, &n));
            CHECK(s && n == 3 && !strcmp(s, "a a"), "decode: %s", s ? s : "(null)");
            free(s);
            CHECK_FAILS(&ctx, tpk_tokenizer_decode(&ctx, t, out_of, 1, false, &s, &n), TPK_ERR_ARG,
                        "ids[0]: 11 is not a token id (expected 0..10");
            CHECK_FAILS(&ctx, tpk_tokenizer_encode(&ctx, t, NULL, 3, NULL, &n), TPK_ERR_ARG,
                        "ids: NULL");
            tpk_tokenizer_free(t);
        }
        snprintf(doc, sizeof doc, "%.*strue%s", (int)(im - json), json, im + 2);
        CHECK_OK(&ctx, tpk_tokenizer_parse(&ctx, doc, strlen(doc), "doc", &t));
        if (t) { /* ignore_merges: a word that is a token is taken whole */
            CHECK(!strcmp(enc(&ctx, t, "xx", buf, sizeof buf), "8"), "xx -> %s", buf);
            tpk_tokenizer_free(t);
        }
    }

    TEST_CASE("decode: bytes that are not UTF-8 become U+FFFD, as Hugging Face's decode") {
        /* a byte-level vocabulary of the bytes 0xC3 ("Ã") and 0xA9 ("©") and 'a' */
        const char *doc = "{\"model\": {\"vocab\": {\"\\u00c3\": 0, \"\\u00a9\": 1, \"a\": 2}, "
                          "\"merges\": []}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}";
        tpk_tokenizer *t = NULL;
        CHECK_OK(&ctx, tpk_tokenizer_parse(&ctx, doc, strlen(doc), "doc", &t));
        if (t) {
            int32_t e[2] = {0, 1}, half[2] = {0, 2};
            char *s = NULL;
            size_t n = 0;
            CHECK_OK(&ctx, tpk_tokenizer_decode(&ctx, t, e, 2, false, &s, &n));
            CHECK(n == 2 && !strcmp(s, "\xc3\xa9"), "C3 A9 -> é");
            free(s);
            CHECK_OK(&ctx, tpk_tokenizer_decode(&ctx, t, half, 2, false, &s, &n));
            CHECK(n == 4 && !strcmp(s, "\xef\xbf\xbd"
                                       "a"),
                  "C3 'a' -> U+FFFD a");
            free(s);
            tpk_tokenizer_free(t);
        }
    }

    TEST_CASE("tokenizer fuzz corpus replay (tests/fuzz/corpus_tokenizer)")
    test_replay_corpus("tests/fuzz/corpus_tokenizer", fuzz_tokenizer_one, "valid", 10);
    return test_finish();
}
