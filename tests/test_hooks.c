/* tests/test_hooks.c — the context's hooks (tpk/base/ctx.h) and the version (tpk/base/version.h).
 *
 * The allocator: a counting allocator (each block behind a header holding a mark and its size)
 * given to tpk_ctx_desc.allocator, once with a realloc_fn and once without (the kit then
 * allocates, copies and frees). A context over the MPI world at t = ranks (the world's and the TP
 * group's MPI state, the TP weights, the weights' all-reduce), the profiler, 300 ops and the
 * collectives' requests (all-reduce, all-gather and reduce-scatter started and waited) go through
 * it: every block counted, and after tpk_ctx_destroy and tpk_comm_destroy as many frees as
 * allocations, no byte left, no block freed that it did not give (a free of a block the C library
 * gave would show as a foreign pointer; the C library's free of one of its blocks would crash).
 * The collectives' results are checked against the sums and concatenations computed here from
 * every rank's inputs (each rank's draws are known to all), outputs poisoned first. Likewise the
 * tokenizer and NFC (a tokenizer.json with an NFC normalizer and an added token normalized at
 * load, from memory and from a file; its ids and text freed with tpk_free) against hand-worked
 * ids and bytes, and the planner's counting communicator. Then the allocator failing at its 1st,
 * 2nd, ... call through a tokenizer's load, encode and decode: TPK_ERR_NOMEM each time, nothing
 * left. The sources themselves: no malloc, calloc, realloc, free or strdup in base/, runtime/,
 * plan/, text/tokenizer.h, text/unicode.h outside the allocator's default (and the two frees of
 * the parameter registry that tpk/layers/params.h allocates with the C library).
 *
 * The logger: a bad argument's failure reaches a logger at TPK_LOG_DEBUG with the recorded text,
 * tpk_report's line at TPK_LOG_ERROR, and nothing reaches stderr (file descriptor 2, captured);
 * without a logger the same report is that line on stderr and the failure prints nothing; the
 * TPK_PROFILE=1 table at tpk_ctx_destroy reaches the logger (world rank 0); a half-given allocator
 * is refused naming desc->allocator. */
#define _POSIX_C_SOURCE 200809L /* dup, dup2, fileno, mkstemp, fdopen, setenv */
#include <ctype.h>
#include <unistd.h>

#include "test.h"
#include <tpk/plan/count.h>

/* ---- a counting allocator -------------------------------------------------------------------- */

#define MARK 0x74706b2d616c6c6full /* "tpk-allo" */
#define DEAD 0x646561642d626c6bull
typedef struct counter {
    long allocs, frees, reallocs, foreign, calls;
    long fail_at; /* the call (1, 2, ...) that returns NULL; 0: none */
    size_t live;
} counter;
typedef struct head {
    uint64_t mark, size;
} head;

static void *c_alloc(size_t bytes, void *user) {
    counter *c = (counter *)user;
    if (++c->calls == c->fail_at) return NULL;
    head *h = (head *)malloc(sizeof(head) + bytes);
    if (!h) return NULL;
    h->mark = MARK, h->size = bytes;
    c->allocs++, c->live += bytes;
    memset(h + 1, 0xA5, bytes); /* never zeroed: calloc's zeroing is the kit's */
    return h + 1;
}
static void c_free(void *p, void *user) {
    counter *c = (counter *)user;
    head *h = (head *)p - 1;
    if (h->mark != MARK) {
        c->foreign++;
        return;
    }
    h->mark = DEAD;
    c->frees++, c->live -= h->size;
    free(h);
}
static void *c_realloc(void *p, size_t bytes, void *user) {
    counter *c = (counter *)user;
    head *h = (head *)p - 1;
    if (h->mark != MARK) return c->foreign++, (void *)NULL;
    if (++c->calls == c->fail_at) return NULL;
    size_t was = h->size;
    head *g = (head *)realloc(h, sizeof(head) + bytes);
    if (!g) return NULL;
    g->size = bytes, c->live += bytes, c->live -= was, c->reallocs++;
    return g + 1;
}
static tpk_allocator counting(counter *c, bool with_realloc) {
    tpk_allocator a;
    memset(&a, 0, sizeof a);
    a.alloc_fn = c_alloc, a.free_fn = c_free, a.user_data = c;
    if (with_realloc) a.realloc_fn = c_realloc;
    return a;
}
/* every block given back, none foreign */
#define CHECK_BALANCED(c, what)                                                                  \
    CHECK((c).allocs == (c).frees && (c).live == 0 && (c).foreign == 0,                          \
          "%s: %ld allocations, %ld frees, %zu bytes left, %ld foreign frees", what, (c).allocs, \
          (c).frees, (c).live, (c).foreign)

/* ---- a logger that keeps what it is given ---------------------------------------------------- */

typedef struct capture {
    int n[5];          /* messages by level */
    char last[5][600]; /* the last message of each level */
    int lines_with[2]; /* INFO lines starting "profile: " / naming the op "fill" with 300 calls */
    char first_info[600];
} capture;
static void c_log(tpk_log_level level, const char *msg, void *user) {
    capture *k = (capture *)user;
    if (level < 1 || level > 4) return;
    k->n[level]++;
    snprintf(k->last[level], sizeof k->last[level], "%s", msg);
    if (level == TPK_LOG_INFO && k->n[level] == 1)
        snprintf(k->first_info, sizeof k->first_info, "%s", msg);
    if (level == TPK_LOG_INFO && !strncmp(msg, "profile: ", 9)) k->lines_with[0]++;
    if (level == TPK_LOG_INFO && !strncmp(msg, "fill ", 5) && strstr(msg, " 300.0 "))
        k->lines_with[1]++;
}
static tpk_logger capturing(capture *k) {
    memset(k, 0, sizeof *k);
    tpk_logger l;
    l.func = c_log, l.user_data = k;
    return l;
}

/* ---- stderr (file descriptor 2) into a buffer around a call ---------------------------------- */

typedef struct grab {
    int saved;
    FILE *tmp;
} grab;
static void grab_begin(grab *g) {
    fflush(stderr);
    g->saved = dup(2), g->tmp = tmpfile();
    if (g->tmp) dup2(fileno(g->tmp), 2);
}
static size_t grab_end(grab *g, char *out, size_t n) {
    fflush(stderr);
    dup2(g->saved, 2), close(g->saved);
    size_t k = 0;
    if (g->tmp) {
        rewind(g->tmp);
        k = fread(out, 1, n - 1, g->tmp);
        fclose(g->tmp);
    }
    out[k] = 0;
    return k;
}

/* ---- the sources: no allocation outside the allocator ---------------------------------------- */

/* The calls of malloc, calloc, realloc, free and strdup in one header (comments and strings left
 * out; a member call such as ops->free( is not one), each reported with its line; allowed[]: the
 * names of the functions whose calls are the allocator's own. Returns the count of others. */
static int scan_header(const char *path, const char *const *allowed, int nallowed) {
    FILE *f = fopen(path, "r");
    if (!f) {
        CHECK(false, "%s: cannot open", path);
        return 1;
    }
    static const char *const bad[] = {"malloc", "calloc", "realloc", "free", "strdup"};
    char line[1024], fn[128] = "";
    int found = 0, lineno = 0;
    bool comment = false;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strncmp(line, "static inline ", 14)) { /* the function this line opens */
            const char *p = strchr(line, '(');
            const char *q = p;
            while (q && q > line && (q[-1] == '_' || isalnum((unsigned char)q[-1]))) q--;
            if (p && q) snprintf(fn, sizeof fn, "%.*s", (int)(p - q), q);
        }
        char code[1024];
        size_t k = 0;
        for (size_t i = 0; line[i]; i++) { /* the code, comments and literals blanked */
            if (comment) {
                if (line[i] == '*' && line[i + 1] == '/') comment = false, i++;
                continue;
            }
            if (line[i] == '/' && line[i + 1] == '*') {
                comment = true, i++;
                continue;
            }
            if (line[i] == '/' && line[i + 1] == '/') break;
            if (line[i] == '"' || line[i] == '\'') {
                char qch = line[i];
                for (i++; line[i] && line[i] != qch; i++)
                    if (line[i] == '\\' && line[i + 1]) i++;
                if (!line[i]) break;
                code[k++] = ' ';
                continue;
            }
            code[k++] = line[i];
        }
        code[k] = 0;
        for (int b = 0; b < 5; b++)
            for (const char *p = code; (p = strstr(p, bad[b])) != NULL; p++) {
                size_t L = strlen(bad[b]);
                const char *e = p + L;
                while (*e == ' ') e++;
                bool ident_before = p > code && (p[-1] == '_' || isalnum((unsigned char)p[-1]));
                bool member = (p > code && p[-1] == '.') || (p > code + 1 && p[-1] == '>');
                if (*e != '(' || ident_before || member || isalnum((unsigned char)p[L]) ||
                    p[L] == '_')
                    continue;
                bool ok = false;
                for (int a = 0; a < nallowed; a++) ok = ok || !strcmp(fn, allowed[a]);
                if (!ok) {
                    found++;
                    CHECK(false, "%s:%d: %s( in %s, outside the allocator", path, lineno, bad[b],
                          fn[0] ? fn : "(file scope)");
                }
            }
    }
    fclose(f);
    return found;
}

/* ---- the tokenizer used below ---------------------------------------------------------------- */

/* ids: a 0, e 1, "Ã" 2 and "©" 3 (the bytes C3 A9 of é through GPT-2's byte map), "Ã©" 4; the
 * added token 5, "e" + U+0301 + "!" as written, NFC'd at load to "é!" (C3 A9 21); one merge. */
static const char *tok_json =
    "{\"normalizer\": {\"type\": \"NFC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, "
    "\"e\": 1, \"\\u00c3\": 2, \"\\u00a9\": 3, \"\\u00c3\\u00a9\": 4}, \"merges\": "
    "[\"\\u00c3 \\u00a9\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
    "\"add_prefix_space\": false}, \"added_tokens\": [{\"id\": 5, \"content\": "
    "\"e\\u0301!\", \"normalized\": true}]}";

/* Encode s and print the ids into buf ("(error)" on failure); the ids freed with tpk_free. */
static const char *enc(tpk_ctx *ctx, tpk_tokenizer *t, const char *s, char *buf, size_t n) {
    int32_t *ids = NULL;
    size_t k = 0, at = 0;
    buf[0] = 0;
    if (tpk_tokenizer_encode(ctx, t, s, strlen(s), &ids, &k) != TPK_OK) {
        tpk_free(ctx, ids);
        return "(error)";
    }
    for (size_t i = 0; i < k && at + 12 < n; i++)
        at += (size_t)snprintf(buf + at, n - at, i ? " %d" : "%d", (int)ids[i]);
    tpk_free(ctx, ids);
    return buf;
}
/* The tokenizer's checks: "a" "e" U+0301 -> NFC "aé" -> a, Ã© (merged) = "0 4"; with "!" after,
 * the added token "é!" cut from the normalized text = "0 5"; not UTF-8 becomes U+FFFD, which has
 * no token (dropped) = "0"; ids 0 4 5 decode to "a", C3 A9, then the added token's characters
 * through the byte map (é -> byte E9, ! -> 21: E9 is no UTF-8, so U+FFFD) = 61 C3 A9 EF BF BD 21,
 * as Hugging Face's ByteLevel decoder makes of it. */
static void tok_checks(tpk_ctx *ctx, tpk_tokenizer *t) {
    char buf[128];
    CHECK(!strcmp(enc(ctx, t, "ae\xcc\x81", buf, sizeof buf), "0 4"), "a e U+0301 -> %s", buf);
    CHECK(!strcmp(enc(ctx, t, "ae\xcc\x81!", buf, sizeof buf), "0 5"), "a e U+0301 ! -> %s", buf);
    CHECK(!strcmp(enc(ctx, t, "a\xff", buf, sizeof buf), "0"), "a FF -> %s", buf);
    int32_t ids[3] = {0, 4, 5};
    char *s = NULL;
    size_t n = 0;
    CHECK_OK(ctx, tpk_tokenizer_decode(ctx, t, ids, 3, false, &s, &n));
    CHECK(s && n == 7 && !memcmp(s, "a\xc3\xa9\xef\xbf\xbd!", 8), "decode 0 4 5 -> %s",
          s ? s : "(null)");
    tpk_free(ctx, s);
}
/* One pass of the fault test: a context on c, the tokenizer parsed, encoded and decoded, all freed;
 * returns the first status that is not TPK_OK (the kit's, for the allocator's NULL). */
static tpk_status tok_pass(counter *c, char *err, size_t errn) {
    tpk_ctx ctx;
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.ops = tpk_ops_host(), d.allocator = counting(c, c->fail_at % 2 == 0);
    tpk_status s = tpk_ctx_init(&ctx, &d);
    tpk_tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t k = 0, n = 0;
    char *text = NULL;
    if (s == TPK_OK) s = tpk_tokenizer_parse(&ctx, tok_json, strlen(tok_json), "doc", &t);
    const char *text_in = "ae\xcc\x81 a\xff!";
    if (s == TPK_OK) s = tpk_tokenizer_encode(&ctx, t, text_in, strlen(text_in), &ids, &k);
    if (s == TPK_OK) s = tpk_tokenizer_decode(&ctx, t, ids, k, false, &text, &n);
    snprintf(err, errn, "%s", tpk_last_error(&ctx));
    tpk_free(&ctx, ids), tpk_free(&ctx, text);
    tpk_tokenizer_free(t);
    tpk_ctx_destroy(&ctx);
    return s;
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    int me = test__rank, np = test__size;

    TEST_CASE("version: tpk_version() is TPK_VERSION_STRING, MAJOR.MINOR.PATCH of the macros") {
        char want[32];
        snprintf(want, sizeof want, "%d.%d.%d", TPK_VERSION_MAJOR, TPK_VERSION_MINOR,
                 TPK_VERSION_PATCH);
        CHECK(!strcmp(tpk_version(), want) && !strcmp(TPK_VERSION_STRING, want),
              "tpk_version() %s, TPK_VERSION_STRING %s, expected %s", tpk_version(),
              TPK_VERSION_STRING, want);
        CHECK(TPK_VERSION ==
                  TPK_VERSION_MAJOR * 10000 + TPK_VERSION_MINOR * 100 + TPK_VERSION_PATCH,
              "TPK_VERSION %d", TPK_VERSION);
    }

    for (int with_realloc = 1; with_realloc >= 0; with_realloc--)
        TEST_CASE("allocator%s: a context over the world at t = ranks, TP weights, the profiler, "
                  "300 ops, collectives started and waited: every block through it, none left",
                  with_realloc ? "" : " without realloc_fn") {
            counter c;
            memset(&c, 0, sizeof c);
            capture k;
            tpk_ctx pre, ctx;
            memset(&pre, 0, sizeof pre);
            pre.allocator = counting(&c, with_realloc); /* the world's state through it too */
            tpk_comm world;
            CHECK_OK(&pre, tpk_comm_mpi(&pre, MPI_COMM_WORLD, &world));
            CHECK(c.allocs == 1 && c.live > 0, "the world's state: %ld blocks", c.allocs);
            double w[4] = {1.0, 2.0, 1.5, 3.0};
            tpk_ctx_desc d;
            memset(&d, 0, sizeof d);
            d.ops = tpk_ops_host(), d.world = &world, d.tp = np, d.seed = 1, d.tp_weights = w;
            d.allocator = pre.allocator, d.logger = capturing(&k);
            CHECK_OK(&ctx, tpk_ctx_init(&ctx, &d));
            /* the world's state, the TP group's (an MPI group at t > 1), the weights (kept), the
             * weights' all-reduce request (freed) */
            long want = 3 + (np > 1);
            CHECK(c.allocs >= want && c.frees >= 1 && c.foreign == 0,
                  "after tpk_ctx_init: %ld allocations (expected >= %ld), %ld frees", c.allocs,
                  want, c.frees);
            CHECK_OK(&ctx, tpk_profile_start(&ctx));
            float x[64];
            for (int i = 0; i < 300; i++) /* the profiler's call list grows: 256, then 512 */
                CHECK_OK(&ctx, tpk_op_fill(&ctx, x, TPK_F32, 64, (float)i));
            CHECK(c.reallocs > 0 || !with_realloc, "the call list grew without realloc_fn");
            /* all-reduce: every rank's draws summed; all-gather of counts q + 1; reduce-scatter */
            enum { N = 40 };
            float mine[N], sum[N], want_sum[N], got_sum[N];
            for (int i = 0; i < N; i++) {
                mine[i] = tpk_rng_normal(11, (uint64_t)me, (uint64_t)i);
                double s = 0;
                for (int q = 0; q < np; q++) s += tpk_rng_normal(11, (uint64_t)q, (uint64_t)i);
                want_sum[i] = (float)s, sum[i] = NAN;
            }
            tpk_request r;
            memset(&r, 0, sizeof r);
            CHECK_OK(&ctx, tpk_allreduce_start(&ctx, &ctx.tp, mine, sum, N, TPK_F32, TPK_SUM, &r));
            CHECK_OK(&ctx, tpk_wait(&ctx, &r));
            CHECK_CLOSE(sum, want_sum, N, 1e-6, "all-reduce");
            size_t counts[4], total = 0;
            for (int q = 0; q < np; q++) counts[q] = (size_t)q + 1, total += counts[q];
            float part[4], all[10], want_all[10];
            for (int i = 0; i <= me; i++) part[i] = tpk_rng_normal(12, (uint64_t)me, (uint64_t)i);
            for (int q = 0, at = 0; q < np; q++)
                for (int i = 0; i <= q; i++)
                    want_all[at++] = tpk_rng_normal(12, (uint64_t)q, (uint64_t)i),
                    all[at - 1] = NAN;
            CHECK_OK(&ctx, tpk_allgatherv_start(&ctx, &ctx.tp, part, counts[me], all, counts, total,
                                                TPK_F32, &r));
            CHECK_OK(&ctx, tpk_wait(&ctx, &r));
            CHECK(!memcmp(all, want_all, total * sizeof(float)), "all-gather of counts q + 1");
            size_t off = 0;
            for (int q = 0; q < me; q++) off += counts[q];
            for (int i = 0; i <= me; i++) got_sum[i] = NAN;
            CHECK_OK(&ctx, tpk_reduce_scatterv_start(&ctx, &ctx.tp, mine, total, got_sum, counts,
                                                     TPK_F32, TPK_SUM, &r));
            CHECK_OK(&ctx, tpk_wait(&ctx, &r));
            CHECK_CLOSE(got_sum, want_sum + off, counts[me], 1e-6, "reduce-scatter");
            want += 2 + (np > 1 ? 3 : 0); /* the profiler, its call list; 3 requests (at t = 1 the
                                             TP group is `self`: copies, no request) */
            CHECK(c.allocs >= want,
                  "with the profiler and the collectives: %ld allocations, "
                  "expected >= %ld",
                  c.allocs, want);
            CHECK_OK(&ctx, tpk_profile_log(&ctx));
            CHECK(k.lines_with[0] == 1 && k.lines_with[1] == 1,
                  "the profile table through the logger: %d header lines, %d fill rows (300 "
                  "calls)",
                  k.lines_with[0], k.lines_with[1]);
            tpk_ctx_destroy(&ctx);
            tpk_comm_destroy(&world);
            CHECK_BALANCED(c, "the context and the world destroyed");
        }

    TEST_CASE("allocator: the tokenizer (from memory and from a file) and NFC, its ids and text "
              "freed with tpk_free: every block through it, none left") {
        counter c;
        memset(&c, 0, sizeof c);
        tpk_ctx ctx;
        tpk_ctx_desc d;
        memset(&d, 0, sizeof d);
        d.ops = tpk_ops_host(), d.allocator = counting(&c, false);
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &d));
        tpk_tokenizer *t = NULL;
        CHECK_OK(&ctx, tpk_tokenizer_parse(&ctx, tok_json, strlen(tok_json), "doc", &t));
        if (t) {
            CHECK(t->nadded == 1 && t->added[0].len == 3 &&
                      !memcmp(t->added[0].content, "\xc3\xa9!", 3),
                  "the added token NFC'd at load");
            tok_checks(&ctx, t);
            tpk_tokenizer_free(t);
        }
        long parsed = c.allocs;
        CHECK(parsed >= 20, "%ld blocks for the tables, the cache, the ids and the text", parsed);
        char path[64];
        snprintf(path, sizeof path, "/tmp/tpk_hooks_%d_XXXXXX", me);
        int fd = mkstemp(path);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        CHECK(f && fputs(tok_json, f) >= 0, "writing %s", path);
        if (f) fclose(f);
        t = NULL;
        CHECK_OK(&ctx, tpk_tokenizer_load(&ctx, path, &t));
        if (t) tok_checks(&ctx, t), tpk_tokenizer_free(t);
        remove(path);
        CHECK(c.allocs > parsed + 3, "the file's bytes and the path names through it too");
        uint8_t *z = NULL;
        size_t zn = 0;
        CHECK_OK(&ctx, tpk__nfc(&ctx, (const uint8_t *)"e\xcc\x81", 3, &z, &zn));
        CHECK(z && zn == 2 && !memcmp(z, "\xc3\xa9", 2), "NFC of e U+0301");
        tpk__free(&ctx, z);
        tpk_ctx_destroy(&ctx);
        CHECK_BALANCED(c, "the tokenizers freed");
    }

    TEST_CASE("allocator: the planner's counting communicator (a TP 2 world on an H100 profile, "
              "a started all-reduce): every block through it, none left") {
        counter c;
        memset(&c, 0, sizeof c);
        tpk_ctx err, ctx;
        memset(&err, 0, sizeof err);
        err.allocator = counting(&c, true);
        tpk_hw hw;
        CHECK(tpk_hw_builtin("h100", &hw), "the h100 profile");
        tpk_count cnt;
        tpk_comm world;
        CHECK_OK(&err, tpk_count_init(&err, &cnt, &hw, NULL, 2, 1, 1, 0, 8));
        CHECK_OK(&err, tpk_count_world(&err, &cnt, &world));
        tpk_ctx_desc d;
        memset(&d, 0, sizeof d);
        d.ops = &cnt.ops, d.world = &world, d.tp = 2, d.allocator = err.allocator;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &d));
        float v[8] = {0};
        tpk_request r;
        memset(&r, 0, sizeof r);
        CHECK_OK(&ctx, tpk_allreduce_start(&ctx, &ctx.tp, v, v, 8, TPK_F32, TPK_SUM, &r));
        CHECK_OK(&ctx, tpk_wait(&ctx, &r));
        CHECK(cnt.t > 0, "the all-reduce's time on the model: %g s", cnt.t);
        tpk_ctx_destroy(&ctx);
        tpk_comm_destroy(&world);
        CHECK(c.allocs >= 5, "the world's and the groups' members, the request: %ld", c.allocs);
        CHECK_BALANCED(c, "the dry run's context and world destroyed");
    }

    TEST_CASE("allocator: failing at each of its calls through a tokenizer's load, encode and "
              "decode gives TPK_ERR_NOMEM and leaves nothing behind") {
        /* (decode's last step, trimming its buffer, may fail and keep the larger one: OK) */
        int runs = 0, nomem = 0, kept = 0, other = 0;
        bool whole = false;
        char err[512] = "";
        for (long at = 1; at < 1000 && !whole; at++) {
            counter c;
            memset(&c, 0, sizeof c);
            c.fail_at = at;
            tpk_status s = tok_pass(&c, err, sizeof err);
            runs++;
            CHECK_BALANCED(c, "a pass with a failing allocation");
            whole = c.calls < at; /* past the last allocation: nothing failed */
            if (whole) CHECK(s == TPK_OK, "the whole pass: %s (%s)", tpk_status_str(s), err);
            else if (s == TPK_ERR_NOMEM) nomem++;
            else if (s == TPK_OK) kept++;
            else {
                other++;
                CHECK(false, "allocation %ld failing: %s (%s)", at, tpk_status_str(s), err);
            }
        }
        CHECK(whole && nomem >= 20 && kept <= 1 && other == 0,
              "%d passes: %d out of memory, %d survived, %d other failures, %s", runs, nomem, kept,
              other, whole ? "then a whole pass" : "no whole pass");
    }

    TEST_CASE("logger: a bad argument's failure at DEBUG, tpk_report at ERROR, nothing on stderr; "
              "without one, the report alone on stderr; a half-given allocator refused") {
        capture k;
        tpk_ctx ctx;
        tpk_ctx_desc d;
        memset(&d, 0, sizeof d);
        d.ops = tpk_ops_host(), d.logger = capturing(&k);
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &d));
        char out[1024], want[700];
        grab g;
        grab_begin(&g);
        tpk_status s = tpk_op_fill(&ctx, NULL, TPK_F32, 4, 1.0f);
        tpk_report(&ctx, s, "filling");
        size_t n = grab_end(&g, out, sizeof out);
        CHECK(s == TPK_ERR_ARG && k.n[TPK_LOG_DEBUG] == 1 &&
                  !strcmp(k.last[TPK_LOG_DEBUG], tpk_last_error(&ctx)) &&
                  strstr(k.last[TPK_LOG_DEBUG], "tpk_op_fill: x"),
              "DEBUG: %d messages, the last \"%s\"", k.n[TPK_LOG_DEBUG], k.last[TPK_LOG_DEBUG]);
        snprintf(want, sizeof want, "filling: %s (TPK_ERR_ARG)", tpk_last_error(&ctx));
        CHECK(k.n[TPK_LOG_ERROR] == 1 && !strcmp(k.last[TPK_LOG_ERROR], want),
              "ERROR: \"%s\", expected \"%s\"", k.last[TPK_LOG_ERROR], want);
        CHECK(n == 0, "stderr got \"%s\"", out);
        tpk_ctx_destroy(&ctx);

        memset(&d, 0, sizeof d);
        d.ops = tpk_ops_host();
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &d));
        grab_begin(&g);
        s = tpk_op_fill(&ctx, NULL, TPK_F32, 4, 1.0f);
        size_t quiet = grab_end(&g, out, sizeof out);
        CHECK(s == TPK_ERR_ARG && quiet == 0, "a failure alone printed \"%s\"", out);
        grab_begin(&g);
        tpk_report(&ctx, s, "filling");
        tpk_logf(NULL, TPK_LOG_WARN, "a warning %d", 7);
        tpk_logf(NULL, TPK_LOG_DEBUG, "not printed");
        grab_end(&g, out, sizeof out);
        char want2[800];
        snprintf(want2, sizeof want2, "filling: %s (TPK_ERR_ARG)\na warning 7\n",
                 tpk_last_error(&ctx));
        CHECK(!strcmp(out, want2), "stderr \"%s\", expected \"%s\"", out, want2);
        tpk_ctx_destroy(&ctx);

        counter c;
        memset(&c, 0, sizeof c);
        memset(&d, 0, sizeof d);
        d.ops = tpk_ops_host(), d.logger = capturing(&k);
        d.allocator.alloc_fn = c_alloc;
        CHECK_FAILS(&ctx, tpk_ctx_init(&ctx, &d), TPK_ERR_ARG,
                    "desc->allocator: expected alloc_fn and free_fn both set");
        CHECK(k.n[TPK_LOG_DEBUG] == 1 && strstr(k.last[TPK_LOG_DEBUG], "desc->allocator"),
              "the refusal through the logger: \"%s\"", k.last[TPK_LOG_DEBUG]);
        tpk_ctx_destroy(&ctx);
    }

    TEST_CASE("logger: TPK_PROFILE=1's table at tpk_ctx_destroy through it (world rank 0), "
              "nothing on stderr") {
        capture k;
        tpk_comm world;
        CHECK_OK(NULL, tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world));
        setenv("TPK_PROFILE", "1", 1);
        tpk_ctx ctx;
        tpk_ctx_desc d;
        memset(&d, 0, sizeof d);
        d.ops = tpk_ops_host(), d.world = &world, d.logger = capturing(&k);
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &d));
        unsetenv("TPK_PROFILE");
        float x[64];
        for (int i = 0; i < 300; i++) CHECK_OK(&ctx, tpk_op_fill(&ctx, x, TPK_F32, 64, 1.0f));
        grab g;
        char out[1024], want[128];
        grab_begin(&g);
        tpk_ctx_destroy(&ctx);
        size_t n = grab_end(&g, out, sizeof out);
        snprintf(want, sizeof want, "TPK_PROFILE: context of %d rank%s (TP 1 x DP %d x PP 1)", np,
                 np == 1 ? "" : "s", np);
        bool first = me == 0;
        CHECK(n == 0, "stderr got \"%s\"", out);
        CHECK(first ? k.lines_with[0] == 1 && k.lines_with[1] == 1 && k.n[TPK_LOG_INFO] >= 4
                    : k.n[TPK_LOG_INFO] == 0,
              "rank %d: %d INFO lines, %d headers, %d fill rows", me, k.n[TPK_LOG_INFO],
              k.lines_with[0], k.lines_with[1]);
        CHECK(!first || !strcmp(k.first_info, want), "the first INFO line \"%s\", expected \"%s\"",
              k.first_info, want);
        tpk_comm_destroy(&world);
    }

    TEST_CASE("sources: no malloc, calloc, realloc, free or strdup in base/, runtime/, plan/, "
              "text/tokenizer.h, text/unicode.h outside the allocator") {
        if (me == 0) {
            /* the repository's include/ from this file's path (tests/test_hooks.c) */
            char root[512];
            const char *file = __FILE__, *tail = strstr(file, "tests/test_hooks.c");
            snprintf(root, sizeof root, "%.*sinclude/tpk/", tail ? (int)(tail - file) : 0, file);
            static const char *const files[] = {
                "base/core.h",       "base/comm.h",         "base/ops.h",        "base/rng.h",
                "base/ctx.h",        "base/version.h",      "runtime/backend.h", "runtime/buf.h",
                "runtime/coll.h",    "runtime/comm_self.h", "runtime/cuda.h",    "runtime/host.h",
                "runtime/init.h",    "runtime/mpi.h",       "runtime/nccl.h",    "runtime/op.h",
                "runtime/profile.h", "plan/count.h",        "plan/hw.h",         "plan/plan.h",
                "text/tokenizer.h",  "text/unicode.h"};
            static const char *const allocator[] = {"tpk__al_malloc", "tpk__al_calloc",
                                                    "tpk__al_realloc", "tpk__al_free"};
            static const char *const destroy[] = {"tpk_ctx_destroy"};
            int found = 0;
            for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
                char path[600];
                snprintf(path, sizeof path, "%s%s", root, files[i]);
                bool base = !strcmp(files[i], "base/ctx.h"),
                     init = !strcmp(files[i], "runtime/init.h");
                found += scan_header(path,
                                     base   ? allocator
                                     : init ? destroy
                                            : NULL,
                                     base   ? 4
                                     : init ? 1
                                            : 0);
            }
            CHECK(found == 0, "%d calls outside the allocator", found);
        }
    }

    return test_finish();
}
