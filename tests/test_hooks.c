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
 * left. A model's training at every rank count (np 1: TP 1; 2: TP 2; 3: DP 3; 4: TP 2 x DP 2),
 * under each recompute mode: a GPT-2 (tpk_lm) forward and backward, a step of AdamW with the DP
 * buckets, a step of AdamW with ZeRO-1, a checkpoint saved (tpk/train/ckpt.h), poisoned, loaded
 * and its config.json read back, token data split and read from an llm.c shard (tpk/train/data.h);
 * and the pipeline model (np 2: PP 2; 3: PP 3; 4: TP 2 x PP 2) trained two steps by the trainer's
 * step (tpk_model_train_step) and evaluated: every number equal, bit for bit, to the same run on
 * the C library (the counting allocator fills its blocks with 0xA5, so a block read before it is
 * written shows), the checkpoint's weights and moments equal to those saved, the tokens equal to
 * their bytes, and every block given back (the buckets, the tokens and the pipeline's schedules
 * freed without a context, after it is destroyed, with the allocator they kept). The sources
 * themselves: no malloc, calloc, realloc, free or strdup in any header under include/tpk/ outside
 * the allocator's default (tpk__al_*).
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
#include <tpk/train/ckpt.h>
#include <tpk/train/data.h>
#include <tpk/train/trainable.h>

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

/* ---- a model's training under an allocator --------------------------------------------------- */

enum { LM_V = 61, LM_L = 2, LM_H = 32, LM_A = 4, LM_B = 2, LM_S = 8, LM_M = 4, TEXT_N = 600 };

/* What a run computed (the C library's run and the counting allocator's are compared). */
typedef struct lm_result {
    float loss[3];  /* the plain step's, ZeRO-1's, a forward after the checkpoint's load */
    double norm[2]; /* the two steps' gradient norms */
    float *w, *mv;  /* the local weights [n] after the two steps; ZeRO-1's moments [2 sn] */
    size_t n, sn;
    bool loaded; /* the weights and moments after save, poison and load: those saved */
    bool config; /* config.json read back: the model's member and tpk_step 2 */
    bool tokens; /* the split and the shard's tokens: their bytes and ids */
    double entropy, want_entropy;
    long blocks[4];  /* the allocator's blocks after the model, the steps, the checkpoint, the
                         data (counting runs) */
    int debug;       /* failures passed to the logger at DEBUG (one provoked) */
    bool debug_text; /* the provoked one's text is tpk_last_error's */
    int loud;        /* ERROR and WARN messages */
} lm_result;

/* The mesh of np ranks for the model's run: TP 2 where np is even, else DP np. */
static int lm_tp(int np) { return np % 2 == 0 ? 2 : 1; }

/* One world and context on allocator al (NULL: the C library's) and logger k; false on failure. */
static bool hooked_ctx(tpk_ctx *ctx, tpk_comm *world, const tpk_allocator *al, capture *k, int tp,
                       int pp) {
    tpk_ctx pre;
    memset(&pre, 0, sizeof pre);
    if (al) pre.allocator = *al;
    if (tpk_comm_mpi(&pre, MPI_COMM_WORLD, world) != TPK_OK) {
        CHECK(false, "tpk_comm_mpi: %s", tpk_last_error(&pre));
        return false;
    }
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.ops = tpk_ops_host(), d.world = world, d.tp = tp, d.pp = pp, d.seed = 7;
    d.deterministic = true, d.allocator = pre.allocator, d.logger = capturing(k);
    if (tpk_ctx_init(ctx, &d) != TPK_OK) {
        CHECK(false, "tpk_ctx_init: %s", tpk_last_error(ctx));
        tpk_ctx_destroy(ctx), tpk_comm_destroy(world);
        return false;
    }
    return true;
}

/* Draws for micro-batch k of this DP rank: ids and the next-token targets [B S]. */
static void lm_batch(int dp_rank, int k, int32_t *ids, int32_t *tg, int n) {
    for (int i = 0; i < n; i++) {
        double u = tpk_rng_uniform(21, (uint64_t)(dp_rank * 64 + k), (uint64_t)i);
        double w = tpk_rng_uniform(22, (uint64_t)(dp_rank * 64 + k), (uint64_t)i);
        ids[i] = (int32_t)(u * LM_V) % LM_V, tg[i] = (int32_t)(w * LM_V) % LM_V;
    }
}

/* The checkpoint's directory of this run, the same on every rank (world rank 0 makes it). */
static void lm_dir(char *dir, size_t n) {
    char made[64] = "";
    if (test__rank == 0) {
        snprintf(made, sizeof made, "/tmp/tpk_hooks_ckpt_XXXXXX");
        if (!mkdtemp(made)) made[0] = 0;
    }
    MPI_Bcast(made, sizeof made, MPI_CHAR, 0, MPI_COMM_WORLD);
    CHECK(made[0], "mkdtemp");
    snprintf(dir, n, "%s/ckpt", made);
}
static void lm_dir_remove(const char *dir) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (test__rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%.*s'", (int)(strrchr(dir, '/') - dir), dir);
        CHECK(system(cmd) == 0, "%s", cmd);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* The data: TEXT_N bytes split (span B S + 1), an llm.c shard of TEXT_N ids written to a file of
 * this rank's and read back; the tokens freed after the context (they keep its allocator). */
static void lm_data(tpk_ctx *ctx, lm_result *r, tpk_tokens *keep) {
    uint8_t text[TEXT_N];
    for (int i = 0; i < TEXT_N; i++)
        text[i] = (uint8_t)(32 + (int)(tpk_rng_uniform(23, 0, (uint64_t)i) * 40) % 40);
    tpk_tokens tr, va, sh;
    CHECK_OK(ctx, tpk_data_split_text(ctx, text, TEXT_N, "text", LM_B * LM_S + 1, &tr, &va,
                                      &r->entropy));
    double cnt[256] = {0}, e = 0;
    for (int64_t i = 0; i < tr.n; i++) cnt[text[i]] += 1;
    for (int i = 0; i < 256; i++)
        if (cnt[i] > 0) e -= cnt[i] / (double)tr.n * log(cnt[i] / (double)tr.n);
    r->want_entropy = e;
    bool same = tr.tok && va.tok && tr.n + va.n == TEXT_N;
    for (int64_t i = 0; same && i < TEXT_N; i++)
        same = (i < tr.n ? tr.tok[i] : va.tok[i - tr.n]) == text[i];
    char path[64];
    snprintf(path, sizeof path, "/tmp/tpk_hooks_shard_%d_XXXXXX", test__rank);
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    int32_t h[256];
    memset(h, 0, sizeof h);
    h[0] = 20240520, h[1] = 1, h[2] = TEXT_N;
    uint16_t ids[TEXT_N];
    for (int i = 0; i < TEXT_N; i++) ids[i] = (uint16_t)((text[i] * 7 + i) % LM_V);
    CHECK(f && fwrite(h, sizeof h, 1, f) == 1 && fwrite(ids, sizeof ids, 1, f) == 1, "writing %s",
          path);
    if (f) fclose(f);
    CHECK_OK(ctx, tpk_data_load_shard(ctx, path, LM_V, &sh));
    remove(path);
    same = same && sh.tok && sh.n == TEXT_N;
    for (int i = 0; same && i < TEXT_N; i++) same = sh.tok[i] == ids[i];
    r->tokens = same;
    keep[0] = tr, keep[1] = va, keep[2] = sh;
}

/* Each parameter's elements (not the gaps between them) in the weights and in ZeRO-1's slice of
 * the moments: poisoned (w, mv NULL), or compared with w and mv [2 sn] (true: equal). */
static bool lm_params(tpk_ctx *ctx, const tpk_adamw *o, const float *w, const float *mv) {
    bool eq = true;
    float *d = (float *)ctx->params.data.p;
    for (int i = 0; i < ctx->params.n; i++) {
        const tpk_param *p = &ctx->params.list[i];
        size_t a = p->offset, e = p->offset + p->numel;
        if (w) eq = eq && !memcmp(d + a, w + a, sizeof(float) * p->numel);
        else test_poison(d + a, p->numel);
        a = a > o->s0 ? a : o->s0, e = e < o->s0 + o->sn ? e : o->s0 + o->sn;
        for (int k = 0; a < e && k < 2; k++) {
            float *m = (k ? o->v : o->m) + (a - o->s0);
            if (mv) eq = eq && !memcmp(m, mv + k * o->sn + (a - o->s0), sizeof(float) * (e - a));
            else test_poison(m, e - a);
        }
    }
    return eq;
}

/* A GPT-2 at TP lm_tp(np) x DP under recompute mode rc on allocator al (NULL: the C library's):
 * a step with the DP buckets (plain AdamW), a step with ZeRO-1, a checkpoint saved, the weights
 * and moments poisoned, loaded, a forward; token data. c (may be NULL): al's counter. */
static void lm_run(const tpk_allocator *al, counter *c, int rc, lm_result *r) {
    memset(r, 0, sizeof *r);
    tpk_ctx ctx;
    tpk_comm world;
    capture k;
    if (!hooked_ctx(&ctx, &world, al, &k, lm_tp(test__size), 1)) return;
    tpk_gpt2 m;
    tpk_gpt2_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab = LM_V, cfg.positions = LM_S, cfg.layers = LM_L, cfg.hidden = LM_H;
    cfg.heads = LM_A, cfg.dropout = 0.1f, cfg.recompute = (tpk_recompute)rc;
    CHECK_OK(&ctx, tpk_gpt2_init(&ctx, &m, &cfg));
    tpk_adamw plain, zero;
    tpk_adamw_desc od;
    memset(&od, 0, sizeof od);
    od.weight_decay = 0.1f;
    CHECK_OK(&ctx, tpk_adamw_init(&ctx, &plain, &od));
    od.zero = true;
    CHECK_OK(&ctx, tpk_adamw_init(&ctx, &zero, &od));
    r->blocks[0] = c ? c->allocs : 0;
    tpk_dp_buckets b;
    memset(&b, 0, sizeof b);
    tpk_lm_set_grad_ready(&m.lm, tpk_dp_grad_ready, &b);
    int32_t ids[LM_B * LM_S], tg[LM_B * LM_S];
    float dp = (float)ctx.dp.size;
    for (int step = 0; step < 2; step++) { /* the buckets and plain AdamW, then ZeRO-1 */
        lm_batch(ctx.dp.rank, step, ids, tg, LM_B * LM_S);
        ctx.rng_step = (uint64_t)step;
        CHECK_OK(&ctx, tpk_params_zero_grad(&ctx));
        CHECK_OK(&ctx, tpk_lm_forward(&ctx, &m.lm, ids, tg, LM_B, LM_S, &r->loss[step]));
        CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, step == 0));
        CHECK_OK(&ctx, tpk_lm_backward(&ctx, &m.lm, 1.0f / dp));
        CHECK_OK(&ctx, tpk_train_step(&ctx, step ? &zero : &plain, &b, 1e-2f, 1.0f, 1.0f,
                                      &r->norm[step]));
    }
    r->blocks[1] = c ? c->allocs : 0;
    r->n = ctx.params.numel, r->sn = zero.sn;
    r->w = (float *)malloc(sizeof(float) * (r->n + 1));
    r->mv = (float *)malloc(sizeof(float) * (2 * r->sn + 1));
    memcpy(r->w, ctx.params.data.p, sizeof(float) * r->n);
    memcpy(r->mv, zero.m, sizeof(float) * r->sn);
    memcpy(r->mv + r->sn, zero.v, sizeof(float) * r->sn);
    /* the checkpoint: saved, everything poisoned, loaded */
    char dir[128];
    lm_dir(dir, sizeof dir);
    tpk_ckpt_save_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.step = 2, sd.seed = 7, sd.config = "{\"model\": \"gpt2\", \"layers\": 2}";
    CHECK_OK(&ctx, tpk_ckpt_save(&ctx, &zero, dir, &sd));
    lm_params(&ctx, &zero, NULL, NULL);
    tpk_params_updated(&ctx);
    tpk_ckpt_info info;
    memset(&info, 0, sizeof info);
    CHECK_OK(&ctx, tpk_ckpt_load(&ctx, &zero, dir, NULL, &info));
    r->loaded = info.step == 2 && lm_params(&ctx, &zero, r->w, r->mv);
    char *text = NULL;
    size_t tn = 0;
    CHECK_OK(&ctx, tpk_ckpt_config_read(&ctx, dir, &text, &tn));
    r->config = text && strlen(text) == tn && strstr(text, "\"model\": \"gpt2\"") &&
                strstr(text, "\"tpk_step\": 2,");
    tpk_free(&ctx, text);
    /* a failure provoked: its message at DEBUG */
    char missing[160];
    snprintf(missing, sizeof missing, "%s-missing", dir);
    int debug0 = k.n[TPK_LOG_DEBUG];
    CHECK(tpk_ckpt_load(&ctx, &zero, missing, NULL, NULL) != TPK_OK, "a load of %s", missing);
    r->debug = k.n[TPK_LOG_DEBUG] - debug0;
    r->debug_text = !strcmp(k.last[TPK_LOG_DEBUG], tpk_last_error(&ctx));
    tpk_clear_error(&ctx);
    lm_dir_remove(dir);
    ctx.rng_step = 2;
    lm_batch(ctx.dp.rank, 2, ids, tg, LM_B * LM_S);
    CHECK_OK(&ctx, tpk_lm_forward(&ctx, &m.lm, ids, tg, LM_B, LM_S, &r->loss[2]));
    r->blocks[2] = c ? c->allocs : 0;
    tpk_tokens toks[3];
    lm_data(&ctx, r, toks);
    r->blocks[3] = c ? c->allocs : 0;
    r->loud = k.n[TPK_LOG_ERROR] + k.n[TPK_LOG_WARN];
    tpk_adamw_destroy(&ctx, &plain), tpk_adamw_destroy(&ctx, &zero);
    tpk_lm_destroy(&ctx, &m.lm);
    tpk_ctx_destroy(&ctx);
    tpk_dp_destroy(&b); /* without the context: the allocator the buckets kept */
    for (int i = 0; i < 3; i++) tpk_tokens_free(&toks[i]);
    tpk_comm_destroy(&world);
}

/* The pipeline model: PP 2 at 2 and 4 ranks (TP 2 x PP 2), PP 3 at 3, PP 1 at 1; GPT-2 of 4
 * blocks, 1F1B over M micro-batches, 2 steps of the trainer's step, then an evaluation. */
typedef struct pp_result {
    double norm[2];
    float loss[LM_M];
    float *w;
    size_t n;
    long blocks; /* after the model's init (counting runs) */
} pp_result;
static int pp_of(int np) { return np == 3 ? 3 : np >= 2 ? 2 : 1; }
static void pp_run(const tpk_allocator *al, counter *c, pp_result *r) {
    memset(r, 0, sizeof *r);
    int pp = pp_of(test__size);
    tpk_ctx ctx;
    tpk_comm world;
    capture k;
    if (!hooked_ctx(&ctx, &world, al, &k, test__size / pp, pp)) return;
    tpk_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.arch = TPK_ARCH_GPT2;
    mc.gpt2.vocab = LM_V, mc.gpt2.positions = LM_S, mc.gpt2.layers = 4, mc.gpt2.hidden = LM_H;
    mc.gpt2.heads = LM_A, mc.gpt2.dropout = 0.1f;
    tpk_pipe_model pm;
    CHECK_OK(&ctx, tpk_pipe_model_init(&ctx, &pm, &mc, TPK_PIPE_1F1B, LM_M, 1, NULL, NULL, 0, 0));
    tpk_adamw opt;
    tpk_adamw_desc od;
    memset(&od, 0, sizeof od);
    od.zero = true;
    CHECK_OK(&ctx, tpk_adamw_init(&ctx, &opt, &od));
    r->blocks = c ? c->allocs : 0;
    tpk_dp_buckets b;
    memset(&b, 0, sizeof b);
    tpk_pipe_model_set_dp(&pm, &b);
    int32_t ids[LM_M * LM_B * LM_S], tg[LM_M * LM_B * LM_S];
    for (int step = 0; step < 2; step++) {
        for (int q = 0; q < LM_M; q++)
            lm_batch(0, 8 * step + q, ids + q * LM_B * LM_S, tg + q * LM_B * LM_S, LM_B * LM_S);
        CHECK_OK(&ctx, tpk_model_train_step(&ctx, NULL, &pm, &opt, &b, ids, tg, LM_B, LM_S, LM_M,
                                            1.0f / LM_M, (uint64_t)(LM_M * step), 1e-2f, 1.0f,
                                            &r->norm[step]));
    }
    CHECK_OK(&ctx, tpk_pipe_model_eval(&ctx, &pm, ids, tg, LM_B, LM_S, LM_M, r->loss));
    r->n = ctx.params.numel;
    r->w = (float *)malloc(sizeof(float) * (r->n + 1));
    memcpy(r->w, ctx.params.data.p, sizeof(float) * r->n);
    CHECK(k.n[TPK_LOG_ERROR] + k.n[TPK_LOG_WARN] == 0, "the logger got %d errors and warnings",
          k.n[TPK_LOG_ERROR] + k.n[TPK_LOG_WARN]);
    tpk_adamw_destroy(&ctx, &opt);
    tpk_pipe_model_destroy(&ctx, &pm);
    tpk_ctx_destroy(&ctx);
    tpk_dp_destroy(&b);
    tpk_comm_destroy(&world);
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

    for (int rc = 0; rc < TPK_RECOMPUTE_COUNT; rc++)
        TEST_CASE("allocator: GPT-2 at TP %d x DP %d, recompute %d: steps with the DP buckets "
                  "and ZeRO-1, a checkpoint, token data: the C library's numbers, none left",
                  lm_tp(np), np / lm_tp(np), rc) {
            lm_result want, got;
            lm_run(NULL, NULL, rc, &want);
            counter c;
            memset(&c, 0, sizeof c);
            tpk_allocator al = counting(&c, rc != 1); /* selective: without realloc_fn */
            lm_run(&al, &c, rc, &got);
            CHECK(want.w && got.w && want.n == got.n && want.sn == got.sn &&
                      !memcmp(want.loss, got.loss, sizeof want.loss) &&
                      !memcmp(want.norm, got.norm, sizeof want.norm) &&
                      !memcmp(want.w, got.w, sizeof(float) * want.n) &&
                      !memcmp(want.mv, got.mv, sizeof(float) * 2 * want.sn),
                  "losses %.7g %.7g %.7g (the C library's %.7g %.7g %.7g), norms %.9g %.9g "
                  "(%.9g %.9g), the weights and moments equal: %d",
                  got.loss[0], got.loss[1], got.loss[2], want.loss[0], want.loss[1], want.loss[2],
                  got.norm[0], got.norm[1], want.norm[0], want.norm[1],
                  want.w && got.w && want.n == got.n &&
                      !memcmp(want.w, got.w, sizeof(float) * want.n));
            CHECK(isfinite(got.loss[0]) && fabsf(got.loss[0] - logf((float)LM_V)) < 0.5f &&
                      got.norm[0] > 0 && isfinite(got.norm[1]),
                  "step 1's loss %g (about ln %d = %g), norms %g %g", got.loss[0], LM_V,
                  log((double)LM_V), got.norm[0], got.norm[1]);
            CHECK(got.loaded && want.loaded && got.config && want.config,
                  "the checkpoint: weights and moments %s as saved (the C library's run: %s), "
                  "config.json %s",
                  got.loaded ? "loaded" : "NOT loaded", want.loaded ? "loaded" : "not",
                  got.config ? "read back" : "NOT read back");
            CHECK(got.tokens && want.tokens && got.entropy == got.want_entropy &&
                      want.entropy == got.entropy,
                  "tokens %s their bytes and ids; entropy %.9g, expected %.9g",
                  got.tokens ? "equal" : "NOT equal to", got.entropy, got.want_entropy);
            CHECK(got.blocks[0] > 0 && got.blocks[1] > got.blocks[0] &&
                      got.blocks[2] > got.blocks[1] && got.blocks[3] > got.blocks[2],
                  "blocks through the allocator after the model %ld, the steps %ld, the "
                  "checkpoint %ld, the data %ld",
                  got.blocks[0], got.blocks[1], got.blocks[2], got.blocks[3]);
            CHECK(got.debug >= 1 && got.debug_text && got.loud == 0,
                  "the logger: %d DEBUG messages for the missing checkpoint (the last is the "
                  "recorded error: %d), %d errors and warnings",
                  got.debug, got.debug_text, got.loud);
            CHECK_BALANCED(c, "the model, optimizers, buckets, checkpoint and tokens freed");
            free(want.w), free(want.mv), free(got.w), free(got.mv);
        }

    TEST_CASE("allocator: the pipeline model at PP %d x TP %d, 2 trainer's steps of %d "
              "micro-batches, an evaluation: the C library's numbers, none left",
              pp_of(np), np / pp_of(np), LM_M) {
        pp_result want, got;
        pp_run(NULL, NULL, &want);
        counter c;
        memset(&c, 0, sizeof c);
        tpk_allocator al = counting(&c, true);
        pp_run(&al, &c, &got);
        bool last = me / (np / pp_of(np)) == pp_of(np) - 1;
        CHECK(want.w && got.w && want.n == got.n &&
                  !memcmp(want.norm, got.norm, sizeof want.norm) &&
                  !memcmp(want.loss, got.loss, sizeof want.loss) &&
                  !memcmp(want.w, got.w, sizeof(float) * want.n),
              "norms %.9g %.9g (the C library's %.9g %.9g), losses %.7g .. %.7g (%.7g .. %.7g), "
              "the weights equal: %d",
              got.norm[0], got.norm[1], want.norm[0], want.norm[1], got.loss[0], got.loss[LM_M - 1],
              want.loss[0], want.loss[LM_M - 1],
              want.w && got.w && want.n == got.n && !memcmp(want.w, got.w, sizeof(float) * want.n));
        CHECK(got.norm[0] > 0 && isfinite(got.norm[1]) &&
                  (!last || (isfinite(got.loss[0]) && fabsf(got.loss[0] - logf((float)LM_V)) < 1)),
              "norms %g %g, the evaluation's first loss %g", got.norm[0], got.norm[1], got.loss[0]);
        CHECK(got.blocks > 0, "%ld blocks through the allocator after the model", got.blocks);
        CHECK_BALANCED(c, "the pipeline model, its schedules, the optimizer and buckets freed");
        free(want.w), free(got.w);
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

    TEST_CASE("sources: no malloc, calloc, realloc, free or strdup in any header under "
              "include/tpk/ outside the allocator") {
        if (me == 0) {
            /* the repository's include/ from this file's path (tests/test_hooks.c) */
            char root[512];
            const char *file = __FILE__, *tail = strstr(file, "tests/test_hooks.c");
            snprintf(root, sizeof root, "%.*sinclude/tpk", tail ? (int)(tail - file) : 0, file);
            static const char *const dirs[] = {"",        "/base",  "/runtime", "/layers",
                                               "/models", "/train", "/plan",    "/text"};
            static const char *const allocator[] = {"tpk__al_malloc", "tpk__al_calloc",
                                                    "tpk__al_realloc", "tpk__al_free"};
            int found = 0, headers = 0, folders = 0;
            for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
                char dir[600];
                snprintf(dir, sizeof dir, "%s%s", root, dirs[i]);
                DIR *dp = opendir(dir);
                CHECK(dp, "%s: cannot open", dir);
                if (!dp) continue;
                folders++;
                for (struct dirent *e; (e = readdir(dp)) != NULL;) {
                    size_t L = strlen(e->d_name);
                    if (L < 3 || strcmp(e->d_name + L - 2, ".h")) continue;
                    char path[900];
                    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                    bool base = !strcmp(dirs[i], "/base") && !strcmp(e->d_name, "ctx.h");
                    found += scan_header(path, base ? allocator : NULL, base ? 4 : 0);
                    headers++;
                }
                closedir(dp);
            }
            CHECK(folders == 8 && headers >= 60, "%d folders, %d headers scanned", folders,
                  headers);
            CHECK(found == 0, "%d calls outside the allocator in %d headers", found, headers);
        }
    }

    return test_finish();
}
