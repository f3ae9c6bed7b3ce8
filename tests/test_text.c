/* tests/test_text.c — tpk/text by hand-worked cases, independent of Hugging Face
 * (tests/tokenizer.sh compares with the library itself): the JSON reader's escapes (surrogate pairs
 * into UTF-8), its refusals with a byte offset (a lone surrogate, a control character, nesting past
 * 64 levels, trailing characters, a bad number, truncation) and its strict rules (each key of an
 * object once, nested or among 40; invalid UTF-8 in strings and keys; numbers beyond the doubles;
 * 100,000 levels refused at the 65th), its cursor's exact integers to 2^64 - 1 with the file's byte
 * offsets, the UTF-8 decoder (strict and lossy) against Unicode's Table 3-7 written out on 400,000
 * byte strings, tokenizer.json refused for a key twice, bad UTF-8, a number out of range; BPE's
 * order on a tokenizer written
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
                          "null], \"K\": \"last\"}";
        tpk__json root;
        char *arena = NULL;
        CHECK_OK(&ctx, tpk__json_parse(&ctx, "doc", doc, strlen(doc), &root, &arena));
        const tpk__json *k = tpk__json_get(&root, "K"), *n = tpk__json_get(&root, "n");
        CHECK(k && k->len == 4 && !strcmp(k->str, "last") && k->key_at == 65 && k->at == 70,
              "a key and its value, with their byte offsets");
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

    TEST_CASE("JSON strict: each key once, valid UTF-8, numbers in range, 64 levels at most") {
        tpk__json root;
        char *arena = NULL;
        char want[200], doc[2000];
        /* a repeat in a nested object, and in one of 40 keys (the sorted check): named at the
         * repeat's byte, with the first's */
        const char *dup = "{\"a\": 1, \"b\": {\"c\": 2, \"d\": [], \"c\": 3}}";
        size_t first = (size_t)(strstr(dup, "\"c\"") - dup),
               again = (size_t)(strrchr(dup, 'c') - 1 - dup);
        snprintf(want, sizeof want,
                 "doc: byte %zu: the key \"c\" appears twice (first at byte %zu)", again, first);
        CHECK_FAILS(&ctx, tpk__json_parse(&ctx, "doc", dup, strlen(dup), &root, &arena),
                    TPK_ERR_FORMAT, want);
        tpk__json_free(&root, &arena);
        size_t o = (size_t)snprintf(doc, sizeof doc, "{");
        size_t at7 = 0, at30 = 0;
        for (int i = 0; i < 40; i++) {
            if (i == 7) at7 = o + (i > 0);
            if (i == 30) at30 = o + 1;
            o += (size_t)snprintf(doc + o, sizeof doc - o, "%s\"key%d\": %d", i ? "," : "",
                                  i == 30 ? 7 : i, i);
        }
        snprintf(doc + o, sizeof doc - o, "}");
        snprintf(want, sizeof want, "byte %zu: the key \"key7\" appears twice (first at byte %zu)",
                 at30, at7);
        CHECK(doc[at7] == '"' && doc[at30] == '"', "offsets of the keys");
        CHECK_FAILS(&ctx, tpk__json_parse(&ctx, "doc", doc, strlen(doc), &root, &arena),
                    TPK_ERR_FORMAT, want);
        tpk__json_free(&root, &arena);
        /* invalid UTF-8 in strings and keys: each refused at its first bad byte */
        static const struct {
            const char *doc, *want;
        } bad[] = {
            {"[\"ab\xff\"]", "byte 4: expected valid UTF-8 in a string"},
            {"[\"\xc0\xaf\"]", "byte 2: expected valid UTF-8 in a string"},         /* overlong */
            {"[\"x\xed\xa0\x80\"]", "byte 3: expected valid UTF-8 in a string"},    /* surrogate */
            {"[\"\xf4\x90\x80\x80\"]", "byte 2: expected valid UTF-8 in a string"}, /* > 10FFFF */
            {"[\"\xe2\x82\"]", "byte 2: expected valid UTF-8 in a string"},         /* cut short */
            {"{\"k\x80\": 1}", "byte 3: expected valid UTF-8 in a member name"},
            {"[1e400]", "byte 1: a number out of range (1e400"},
            {"[0, -2.5E+309]", "byte 4: a number out of range (-2.5E+309"},
            {"[1.]", "byte 1: a bad number (no digit after the decimal point)"},
            {"[-]", "byte 1: a bad number (no digit)"},
            {"[1e]", "byte 1: a bad number (no digit in the exponent)"},
            {"[.5]", "byte 1: expected a value"},
            {"[1,]", "byte 3: expected a value"},
            {"{\"a\": tru}", "byte 6: a bad literal (expected true)"},
            {"[\"\\u0041\\q\"]", "byte 8: invalid escape '\\q'"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            CHECK_FAILS(&ctx,
                        tpk__json_parse(&ctx, "doc", bad[i].doc, strlen(bad[i].doc), &root, &arena),
                        TPK_ERR_FORMAT, bad[i].want);
            tpk__json_free(&root, &arena);
        }
        /* accepted: valid multi-byte UTF-8 copied, an underflow read as 0, a 100-digit number
         * read whole (cut at 63 characters it would be 1), the largest double, 64 levels */
        char num[200];
        snprintf(num, sizeof num,
                 "[\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\", 1e-400, 0.%0100d1e101, "
                 "1.7976931348623157e308, -0]",
                 0);
        CHECK_OK(&ctx, tpk__json_parse(&ctx, "doc", num, strlen(num), &root, &arena));
        CHECK(root.len == 5 && root.kids[0].len == 9 &&
                  !strcmp(root.kids[0].str, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80") &&
                  root.kids[1].num == 0 && root.kids[2].num == 1 &&
                  root.kids[3].num == 1.7976931348623157e308 && root.kids[4].num == 0,
              "UTF-8 kept, 1e-400 -> 0, 0.0...01e101 -> %.17g",
              root.len > 2 ? root.kids[2].num : 0);
        int64_t iv = 0;
        CHECK(tpk__json_int(&root.kids[4], 0, 10, &iv) && iv == 0 &&
                  !tpk__json_int(&root.kids[3], -1e18, 1e18, &iv) &&
                  !tpk__json_int(&root.kids[0], 0, 10, &iv),
              "integers converted only in range");
        tpk__json_free(&root, &arena);
        char deep[200];
        memset(deep, '[', 64), memset(deep + 64, ']', 64), deep[128] = 0;
        CHECK_OK(&ctx, tpk__json_parse(&ctx, "doc", deep, 128, &root, &arena));
        tpk__json_free(&root, &arena);
        static char deeper[200001]; /* 100,000 levels: refused at the 65th, no deep recursion */
        for (int i = 0; i < 70; i++) memcpy(deeper + 5 * i, "{\"a\":", 5);
        memcpy(deeper + 350, "1", 1), memset(deeper + 351, '}', 70);
        CHECK_FAILS(&ctx, tpk__json_parse(&ctx, "doc", deeper, 421, &root, &arena),
                    TPK_ERR_FORMAT, "byte 320: nested deeper than 64 levels");
        tpk__json_free(&root, &arena);
        memset(deeper, '[', 100000), memset(deeper + 100000, ']', 100000);
        CHECK_FAILS(&ctx, tpk__json_parse(&ctx, "doc", deeper, 200000, &root, &arena),
                    TPK_ERR_FORMAT, "byte 64: nested deeper than 64 levels");
        tpk__json_free(&root, &arena);
    }

    TEST_CASE("JSON cursor: exact integers to 2^64 - 1, refusals with the file's byte offsets") {
        static const struct {
            const char *text;
            uint64_t max, want;
            const char *err; /* NULL: accepted */
        } c[] = {
            {" 18446744073709551615", UINT64_MAX, UINT64_MAX, NULL},
            {"9007199254740993", UINT64_MAX, 9007199254740993ull, NULL}, /* 2^53 + 1: exact */
            {"-0", 10, 0, NULL},
            {"18446744073709551616", UINT64_MAX, 0, "f: byte 100: n: integer larger than"},
            {"11", 10, 0, "f: byte 100: n: integer larger than 10"},
            {"-3", 10, 0, "f: byte 100: n: -3 is negative"},
            {"  2e3", 10000, 0, "f: byte 102: n: expected an integer, got a fraction or exponent"},
            {"012", 100, 0, "f: byte 100: n: a bad number (a leading zero)"},
            {"\"1\"", 10, 0, "f: byte 100: n: expected a non-negative integer"},
            {"", 10, 0, "f: byte 100: n: expected a non-negative integer (truncated JSON)"},
        };
        for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
            tpk__jr r;
            uint64_t v = 12345;
            tpk__jr_init(&r, &ctx, "fn", "f", c[i].text, strlen(c[i].text), 100);
            tpk_status st = tpk__jr_uint(&r, "n", c[i].max, &v);
            if (!c[i].err)
                CHECK(st == TPK_OK && v == c[i].want, "%s -> %llu (%s)", c[i].text,
                      (unsigned long long)v, tpk_last_error(&ctx));
            else
                CHECK(st == TPK_ERR_FORMAT && strstr(tpk_last_error(&ctx), c[i].err) &&
                          v == 12345,
                      "%s: %s", c[i].text, tpk_last_error(&ctx));
        }
    }

    TEST_CASE("UTF-8: the one decoder, strict and lossy, against Table 3-7 written out") {
        long bad = 0, n = 0;
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (long t = 0; t < 400000; t++) {
            uint8_t s[4];
            size_t len = 1 + (size_t)(t % 4);
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            for (size_t i = 0; i < len; i++) { /* lead bytes everywhere; continuations mostly */
                uint8_t b = (uint8_t)(x >> (8 * i));
                s[i] = i && (x >> (40 + i)) % 4 ? (uint8_t)(0x80 | (b & 0x3F)) : b;
            }
            /* the reference, character by character: the first ill-formed offset, the code
             * points of the well-formed characters before it */
            size_t p = 0, first_bad = len;
            uint32_t want[4];
            int nw = 0;
            while (p < len) {
                uint8_t c = s[p];
                size_t need = c < 0x80                   ? 1
                              : c >= 0xC2 && c <= 0xDF   ? 2
                              : c >= 0xE0 && c <= 0xEF   ? 3
                              : c >= 0xF0 && c <= 0xF4   ? 4
                                                         : 0;
                uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80,
                        hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
                bool ok = need && p + need <= len &&
                          (need < 2 || (s[p + 1] >= lo && s[p + 1] <= hi));
                for (size_t i = 2; ok && i < need; i++) ok = s[p + i] >= 0x80 && s[p + i] <= 0xBF;
                if (!ok) {
                    first_bad = p;
                    break;
                }
                uint32_t v = need == 1 ? c : c & (0x7Fu >> need);
                for (size_t i = 1; i < need; i++) v = v << 6 | (s[p + i] & 0x3Fu);
                want[nw++] = v, p += need;
            }
            bool same = tpk__utf8_invalid(s, len) == first_bad;
            p = 0;
            for (int i = 0; i < nw; i++) {
                uint32_t cp = 0, lossy = 0;
                size_t k = tpk__utf8_next(s + p, len - p, &cp);
                tpk__utf8_decode(s + p, len - p, &lossy);
                same = same && cp == want[i] && lossy == want[i];
                p += k;
            }
            if (first_bad < len) {
                uint32_t cp = 0, lossy = 0;
                tpk__utf8_next(s + first_bad, len - first_bad, &cp);
                tpk__utf8_decode(s + first_bad, len - first_bad, &lossy);
                same = same && cp == TPK__UTF8_BAD && lossy == 0xFFFD;
            }
            n++, bad += !same;
        }
        CHECK(bad == 0, "%ld of %ld byte strings disagree with Table 3-7", bad, n);
    }

    TEST_CASE("tokenizer.json: strict JSON (a key twice, invalid UTF-8, numbers out of range)") {
        static const struct {
            const char *doc, *want;
        } bad[] = {
            {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"a\": 2}, \"merges\": []}}",
             "doc: byte 37: the key \"a\" appears twice (first at byte 21)"},
            {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"model\": {}}",
             "doc: byte 45: the key \"model\" appears twice (first at byte 1)"},
            {"{\"model\": {\"vocab\": {\"a\xff\": 0}, \"merges\": []}}",
             "doc: byte 23: expected valid UTF-8 in a member name"},
            {"{\"model\": {\"vocab\": {\"a\": 1e999}, \"merges\": []}}",
             "doc: byte 26: a number out of range"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            tpk_tokenizer *t = NULL;
            CHECK_FAILS(&ctx, tpk_tokenizer_parse(&ctx, bad[i].doc, strlen(bad[i].doc), "doc", &t),
                        TPK_ERR_FORMAT, bad[i].want);
            CHECK(t == NULL, "case %zu: no tokenizer", i);
        }
    }

    TEST_CASE("tokenizer fuzz corpus replay (tests/fuzz/corpus_tokenizer)")
    test_replay_corpus("tests/fuzz/corpus_tokenizer", fuzz_tokenizer_one, "valid", 10);
    return test_finish();
}
