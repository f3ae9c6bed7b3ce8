/* tpk/text/json.h — the kit's one JSON reader (RFC 8259, strict), for every JSON file it reads:
 * tokenizer.json and vocab.json (tpk/text/tokenizer.h), config.json and
 * model.safetensors.index.json (tpk/train/hf.h), the safetensors header (tpk/train/safetensors.h).
 *
 * Two layers, one set of rules:
 *   the cursor (tpk__jr_*): a reader steps through the text value by value — a string decoded into
 *     the caller's buffer, a number lexed and converted, ',' or the closing bracket — so a
 *     schema-driven reader (the safetensors header) checks each value as it comes, in memory of its
 *     own, and says what it expected where ("tensor \"a\": expected an object");
 *   the tree (tpk__json_read, on the cursor): the whole document into tpk__json nodes, for the
 *     readers that look values up by key.
 * The rules, the same for every file:
 *   - syntax as RFC 8259 and nothing more: no comments, no trailing commas, no leading zeros,
 *     "1." or ".5", no bytes after the document but whitespace;
 *   - strings: valid UTF-8 (tpk/text/utf8.h's decoder: shortest form, no surrogates, nothing above
 *     U+10FFFF), no raw control character, only the escapes \" \\ \/ \b \f \n \r \t \uXXXX, a
 *     \uXXXX surrogate only as a high-low pair (decoded to one character); \u0000 where the reader
 *     allows it (the tree does: a token may hold NUL; names read as C strings do not);
 *   - numbers read whole (strtod on all of the text, however long), converted to a double only when
 *     finite (1e400 is an error, as serde_json's "number out of range"; an underflow is 0);
 *     integers converted exactly and range-checked (tpk__jr_uint, tpk__json_int);
 *   - each key of an object once (the tree: every object; a cursor reader checks its own);
 *   - nesting at most TPK__JSON_DEPTH (64) levels (the tree recurses; the cursor never does).
 * Every error is TPK_ERR_FORMAT, "FN: FILE: byte N: what was expected or found", N the offset in
 * the file (a reader of a part of a file adds where the part starts: a safetensors header is at
 * byte 8), "(truncated JSON)" appended when the text ends there. Host memory only.
 *
 * The tree: strings decoded into one arena of at most 2n + 1 bytes (a decoded string is no longer
 * than its source with its quotes; a number's text is copied there, NUL-terminated); a
 * container's children are one array of `len` nodes, an object's children carry their key and the
 * byte offset of the key. */
#ifndef TPK_TEXT_JSON_H
#define TPK_TEXT_JSON_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/ctx.h"
#include "utf8.h"

#define TPK__JSON_DEPTH 64

/* ---- the cursor ------------------------------------------------------------------------------ */

typedef struct tpk__jr {
    const uint8_t *s; /* the text [n] */
    size_t n, at;     /* at: the next byte to read */
    size_t base;      /* where s starts in its file: added to every offset in a message */
    tpk_ctx *ctx;
    const char *fn, *name; /* the function and the file named in errors */
} tpk__jr;

static inline void tpk__jr_init(tpk__jr *r, tpk_ctx *ctx, const char *fn, const char *name,
                                const void *s, size_t n, size_t base) {
    r->s = (const uint8_t *)s, r->n = n, r->at = 0, r->base = base;
    r->ctx = ctx, r->fn = fn, r->name = name ? name : "<memory>";
}

/* TPK_ERR_FORMAT: "FN: FILE: byte N: message", N = base + at; "(truncated JSON)" when at is the
 * end of the text. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline tpk_status tpk__jr_fail(const tpk__jr *r, size_t at, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tpk__fail(r->ctx, TPK_ERR_FORMAT, r->fn, "%s: byte %zu: %s%s", r->name, r->base + at,
                     msg, at >= r->n ? " (truncated JSON)" : "");
}

static inline void tpk__jr_ws(tpk__jr *r) {
    while (r->at < r->n && (r->s[r->at] == ' ' || r->s[r->at] == '\t' || r->s[r->at] == '\n' ||
                            r->s[r->at] == '\r'))
        r->at++;
}
/* After whitespace: the next byte (not consumed), -1 at the end. */
static inline int tpk__jr_peek(tpk__jr *r) {
    tpk__jr_ws(r);
    return r->at < r->n ? r->s[r->at] : -1;
}
/* After whitespace: true (and consumed) when the next byte is c. */
static inline bool tpk__jr_eat(tpk__jr *r, char c) {
    if (tpk__jr_peek(r) != (uint8_t)c) return false;
    r->at++;
    return true;
}
/* After an element of an array or object: 1 after ',', 0 after the closing byte `close`, else an
 * error (-1; the status is in the context). `where` (or NULL) prefixes the message. */
static inline int tpk__jr_next(tpk__jr *r, char close, const char *where) {
    if (tpk__jr_eat(r, ',')) return 1;
    if (tpk__jr_eat(r, close)) return 0;
    tpk__jr_fail(r, r->at, "%s%sexpected ',' or '%c'", where ? where : "", where ? ": " : "",
                 close);
    return -1;
}
/* Only whitespace left; else `what` at the first other byte. */
static inline tpk_status tpk__jr_end(tpk__jr *r, const char *what) {
    tpk__jr_ws(r);
    return r->at == r->n ? TPK_OK : tpk__jr_fail(r, r->at, "%s", what);
}

/* The value of the 4 hex digits at p (avail bytes there), -1 when they are not. */
static inline int tpk__hex4(const uint8_t *p, size_t avail) {
    int v = 0;
    if (avail < 4) return -1;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d = c >= '0' && c <= '9'   ? c - '0'
                          : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The string at the cursor (after whitespace), decoded: its first min(length, cap - 1) bytes and a
 * NUL into dst (nothing when cap is 0), the whole decoded length in *len. `key`: it is a member
 * name (said in messages); `nul`: \u0000 is allowed; `where` (or NULL) prefixes messages. */
static inline tpk_status tpk__jr_string(tpk__jr *r, const char *where, bool key, bool nul,
                                        char *dst, size_t cap, size_t *len) {
    const char *w = where ? where : "", *sep = where ? ": " : "",
               *what = key ? "a member name" : "a string";
    size_t o = 0;
    if (tpk__jr_peek(r) != '"')
        return tpk__jr_fail(r, r->at, "%s%sexpected a string%s", w, sep,
                            key ? " (a member name in double quotes)" : "");
    r->at++;
    for (;;) {
        if (r->at >= r->n) return tpk__jr_fail(r, r->at, "%s%san unterminated string", w, sep);
        uint8_t c = r->s[r->at];
        uint8_t u8[4];
        size_t k = 1;
        if (c == '"') break;
        if (c < 0x20)
            return tpk__jr_fail(r, r->at,
                                "%s%sa control character inside %s (control character 0x%02x: "
                                "expected it escaped)",
                                w, sep, what, c);
        if (c >= 0x80) { /* a multi-byte character, copied as it is */
            uint32_t cp;
            k = tpk__utf8_next(r->s + r->at, r->n - r->at, &cp);
            if (cp == TPK__UTF8_BAD)
                return tpk__jr_fail(r, r->at,
                                    "%s%sexpected valid UTF-8 in %s (invalid UTF-8: byte 0x%02x "
                                    "begins no well-formed character)",
                                    w, sep, what, c);
            for (size_t i = 0; i < k; i++, o++)
                if (o + 1 < cap) dst[o] = (char)r->s[r->at + i];
            r->at += k;
            continue;
        }
        if (c != '\\') {
            if (o + 1 < cap) dst[o] = (char)c;
            o++, r->at++;
            continue;
        }
        size_t esc = r->at; /* errors point at the backslash */
        if (esc + 1 >= r->n) return tpk__jr_fail(r, r->n, "%s%san unterminated escape", w, sep);
        uint8_t e = r->s[esc + 1];
        const char *simple = e ? strchr("\"\\/bfnrt", e) : NULL;
        r->at += 2;
        if (simple) {
            if (o + 1 < cap) dst[o] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            o++;
            continue;
        }
        if (e != 'u')
            return tpk__jr_fail(r, esc,
                                "%s%sinvalid escape '\\%c' (expected an escape: \\\" \\\\ \\/ \\b "
                                "\\f \\n \\r \\t \\uXXXX)",
                                w, sep, e >= 0x20 && e < 0x7f ? e : '?');
        int hi = tpk__hex4(r->s + r->at, r->n - r->at);
        if (hi < 0) return tpk__jr_fail(r, esc, "%s%s\\u needs 4 hex digits", w, sep);
        r->at += 4;
        uint32_t cp = (uint32_t)hi;
        if (cp >= 0xDC00 && cp < 0xE000)
            return tpk__jr_fail(r, esc, "%s%sa lone low surrogate \\u%04x", w, sep, (unsigned)cp);
        if (cp >= 0xD800 && cp < 0xDC00) {
            int lo = r->at + 2 <= r->n && r->s[r->at] == '\\' && r->s[r->at + 1] == 'u'
                         ? tpk__hex4(r->s + r->at + 2, r->n - r->at - 2)
                         : -1;
            if (lo < 0xDC00 || lo >= 0xE000)
                return tpk__jr_fail(r, esc,
                                    "%s%sa lone high surrogate \\u%04x (not followed by a low one)",
                                    w, sep, (unsigned)cp);
            r->at += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
        }
        if (cp == 0 && !nul)
            return tpk__jr_fail(r, esc, "%s%s\\u0000 in a string (expected no NUL in %s)", w, sep,
                                what);
        k = tpk__utf8_encode(cp, u8); /* never longer than the escape it came from */
        for (size_t i = 0; i < k; i++, o++)
            if (o + 1 < cap) dst[o] = (char)u8[i];
    }
    r->at++;
    if (cap) dst[o < cap ? o : cap - 1] = 0;
    *len = o;
    return TPK_OK;
}

/* The number at the cursor (after whitespace), its grammar checked (-? (0 | [1-9][0-9]*)
 * (. [0-9]+)? ([eE] [+-]? [0-9]+)?): its text is s[*start, cursor); *integral: no fraction, no
 * exponent. */
static inline tpk_status tpk__jr_number(tpk__jr *r, const char *where, size_t *start,
                                        bool *integral) {
    const char *w = where ? where : "", *sep = where ? ": " : "";
    const uint8_t *s = r->s;
    size_t a = (tpk__jr_ws(r), r->at), i = a + (a < r->n && s[a] == '-'), d0 = i;
    while (i < r->n && s[i] >= '0' && s[i] <= '9') i++;
    if (i == d0) return tpk__jr_fail(r, a, "%s%sa bad number (no digit)", w, sep);
    if (s[d0] == '0' && i > d0 + 1)
        return tpk__jr_fail(r, a, "%s%sa bad number (a leading zero)", w, sep);
    *integral = true;
    if (i < r->n && s[i] == '.') {
        size_t f = ++i;
        while (i < r->n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == f)
            return tpk__jr_fail(r, a, "%s%sa bad number (no digit after the decimal point)", w,
                                sep);
        *integral = false;
    }
    if (i < r->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < r->n && (s[i] == '+' || s[i] == '-')) i++;
        size_t e = i;
        while (i < r->n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == e)
            return tpk__jr_fail(r, a, "%s%sa bad number (no digit in the exponent)", w, sep);
        *integral = false;
    }
    *start = a, r->at = i;
    return TPK_OK;
}

/* The text s[a, b) of a checked number as a double: strtod on all of it (however long: a long
 * mantissa keeps its exponent); an error when it is beyond the finite doubles. */
static inline tpk_status tpk__jr_double(const tpk__jr *r, const char *where, size_t a, size_t b,
                                        double *out) {
    char small[64], *t = b - a < sizeof small ? small : (char *)tpk__malloc(r->ctx, b - a + 1);
    if (!t)
        return tpk__fail(r->ctx, TPK_ERR_NOMEM, r->fn, "%s: byte %zu: a number of %zu digits",
                         r->name, r->base + a, b - a);
    memcpy(t, r->s + a, b - a), t[b - a] = 0;
    double v = strtod(t, NULL);
    if (t != small) tpk__free(r->ctx, t);
    if (!isfinite(v))
        return tpk__jr_fail(r, a, "%s%sa number out of range (%.*s%s: beyond the doubles' %g)",
                            where ? where : "", where ? ": " : "", (int)(b - a < 40 ? b - a : 40),
                            (const char *)r->s + a, b - a > 40 ? "..." : "",
                            1.7976931348623157e308);
    *out = v;
    return TPK_OK;
}

/* The non-negative integer <= max at the cursor, read exactly (no fraction, no exponent; -0 is
 * 0). */
static inline tpk_status tpk__jr_uint(tpk__jr *r, const char *where, uint64_t max, uint64_t *v) {
    int c = tpk__jr_peek(r);
    size_t a = r->at;
    bool integral = true;
    if (c != '-' && !(c >= '0' && c <= '9'))
        return tpk__jr_fail(r, r->at, "%s: expected a non-negative integer", where);
    TPK_TRY(tpk__jr_number(r, where, &a, &integral));
    if (!integral)
        return tpk__jr_fail(r, a, "%s: expected an integer, got a fraction or exponent (%.*s)",
                            where, (int)(r->at - a < 40 ? r->at - a : 40), (const char *)r->s + a);
    uint64_t x = 0;
    for (size_t i = a + (c == '-'); i < r->at; i++) {
        unsigned d = (unsigned)(r->s[i] - '0');
        if (x > (max - d) / 10)
            return tpk__jr_fail(r, a, "%s: integer larger than %llu", where,
                                (unsigned long long)max);
        x = x * 10 + d;
    }
    if (c == '-' && x)
        return tpk__jr_fail(r, a, "%s: -%llu is negative", where, (unsigned long long)x);
    *v = x;
    return TPK_OK;
}

/* ---- the tree -------------------------------------------------------------------------------- */

typedef enum { TPK__JNULL, TPK__JBOOL, TPK__JNUM, TPK__JSTR, TPK__JARR, TPK__JOBJ } tpk__jtype;

typedef struct tpk__json {
    tpk__jtype type;
    size_t len;      /* string: bytes; number: its text's bytes; array, object: children */
    const char *str; /* string: decoded, NUL-terminated (may hold NUL: use len); number: its text */
    const char *key; /* a child of an object: its key (decoded, NUL-terminated) */
    size_t key_len;
    double num;             /* number (finite); bool: 0 or 1 */
    struct tpk__json *kids; /* array, object: [len] */
    size_t at, key_at;      /* byte offsets of the value and (a child of an object) its key */
} tpk__json;

typedef struct tpk__jtree {
    tpk__jr r;
    const tpk_allocator *al; /* the tree's memory (the allocator kept before the arena) */
    char *arena;             /* decoded strings [2n + 1] */
    size_t used;
    const char *parent, *noun; /* the keys of an object that is member `parent` of another are
                                  called `noun` in messages ("key" elsewhere) */
} tpk__jtree;

static inline void tpk__json_free_kids(const tpk_allocator *al, tpk__json *v) {
    if (v->type != TPK__JARR && v->type != TPK__JOBJ) return;
    for (size_t i = 0; v->kids && i < v->len; i++) tpk__json_free_kids(al, &v->kids[i]);
    tpk__al_free(al, v->kids), v->kids = NULL;
}

static inline int tpk__json_key_cmp(const void *a, const void *b) {
    const tpk__json *x = *(const tpk__json *const *)a, *y = *(const tpk__json *const *)b;
    int c = memcmp(x->key, y->key, x->key_len < y->key_len ? x->key_len : y->key_len);
    if (c) return c;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    return x->key_at < y->key_at ? -1 : x->key_at > y->key_at;
}
/* Each key of object v once: else an error at the first repeat in the text (its keys called
 * `noun`). */
static inline tpk_status tpk__json_unique(tpk__jtree *t, const tpk__json *v, const char *noun) {
    if (v->len < 2) return TPK_OK;
    const tpk__json *dup = NULL, *first = NULL;
    if (v->len <= 16) { /* small objects: every pair */
        for (size_t i = 1; i < v->len; i++)
            for (size_t j = 0; j < i && (!dup || v->kids[i].key_at < dup->key_at); j++)
                if (v->kids[i].key_len == v->kids[j].key_len &&
                    !memcmp(v->kids[i].key, v->kids[j].key, v->kids[i].key_len)) {
                    dup = &v->kids[i], first = &v->kids[j];
                    break;
                }
    } else { /* sorted by key, then offset: a repeat follows its first occurrence */
        const tpk__json **idx = (const tpk__json **)tpk__al_malloc(t->al, v->len * sizeof *idx);
        if (!idx)
            return tpk__fail(t->r.ctx, TPK_ERR_NOMEM, t->r.fn, "%s: an object of %zu members",
                             t->r.name, v->len);
        for (size_t i = 0; i < v->len; i++) idx[i] = &v->kids[i];
        qsort(idx, v->len, sizeof *idx, tpk__json_key_cmp);
        for (size_t i = 1; i < v->len; i++)
            if (idx[i]->key_len == idx[i - 1]->key_len &&
                !memcmp(idx[i]->key, idx[i - 1]->key, idx[i]->key_len) &&
                (!dup || idx[i]->key_at < dup->key_at)) {
                size_t j = i - 1;
                while (j > 0 && idx[j - 1]->key_len == idx[j]->key_len &&
                       !memcmp(idx[j - 1]->key, idx[j]->key, idx[j]->key_len))
                    j--;
                dup = idx[i], first = idx[j];
            }
        tpk__al_free(t->al, idx);
    }
    if (!dup) return TPK_OK;
    return tpk__jr_fail(&t->r, dup->key_at, "the %s \"%.*s\" appears twice (first at byte %zu)",
                        noun, (int)(dup->key_len < 100 ? dup->key_len : 100), dup->key,
                        t->r.base + first->key_at);
}

static inline tpk_status tpk__json_value(tpk__jtree *t, tpk__json *v, int depth) {
    tpk__jr *r = &t->r;
    int c = tpk__jr_peek(r);
    v->at = r->at;
    if (c == '"') {
        v->type = TPK__JSTR;
        char *d = t->arena + t->used;
        TPK_TRY(tpk__jr_string(r, NULL, false, true, d, (size_t)-1, &v->len));
        v->str = d, t->used += v->len + 1;
        return TPK_OK;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        size_t a = r->at;
        bool integral = true;
        TPK_TRY(tpk__jr_number(r, NULL, &a, &integral));
        TPK_TRY(tpk__jr_double(r, NULL, a, r->at, &v->num));
        char *d = t->arena + t->used;
        memcpy(d, r->s + a, r->at - a), d[r->at - a] = 0;
        v->type = TPK__JNUM, v->str = d, v->len = r->at - a, t->used += v->len + 1;
        return TPK_OK;
    }
    static const char *const words[3] = {"null", "false", "true"};
    for (int w = 0; w < 3; w++) {
        size_t k = strlen(words[w]);
        if (c == words[w][0]) {
            if (r->n - r->at < k || memcmp(r->s + r->at, words[w], k))
                return tpk__jr_fail(r, r->at, "a bad literal (expected %s)", words[w]);
            v->type = w ? TPK__JBOOL : TPK__JNULL, v->num = w == 2, r->at += k;
            return TPK_OK;
        }
    }
    if (c != '[' && c != '{')
        return tpk__jr_fail(r, r->at,
                            "expected a value (an object, array, string, number, true, false or "
                            "null)");
    if (depth >= TPK__JSON_DEPTH)
        return tpk__jr_fail(r, r->at, "nested deeper than %d levels", TPK__JSON_DEPTH);
    bool obj = c == '{';
    char close = obj ? '}' : ']';
    v->type = obj ? TPK__JOBJ : TPK__JARR, v->len = 0, v->kids = NULL;
    size_t cap = 0;
    r->at++;
    if (tpk__jr_eat(r, close)) return TPK_OK;
    for (int more = 1; more == 1;) {
        if (v->len == cap) {
            size_t nc = cap ? cap * 2 : 8;
            tpk__json *k =
                (tpk__json *)tpk__al_realloc(t->al, v->kids, cap * sizeof *k, nc * sizeof *k);
            if (!k)
                return tpk__fail(r->ctx, TPK_ERR_NOMEM, r->fn, "%s: %zu values", r->name, nc);
            v->kids = k, cap = nc;
        }
        tpk__json *kid = &v->kids[v->len];
        memset(kid, 0, sizeof *kid);
        v->len++; /* counted before it is filled: freed on failure */
        if (obj) {
            char *d = t->arena + t->used;
            kid->key_at = (tpk__jr_ws(r), r->at);
            TPK_TRY(tpk__jr_string(r, NULL, true, true, d, (size_t)-1, &kid->key_len));
            kid->key = d, t->used += kid->key_len + 1;
            if (!tpk__jr_eat(r, ':')) return tpk__jr_fail(r, r->at, "expected ':'");
        }
        TPK_TRY(tpk__json_value(t, kid, depth + 1));
        if ((more = tpk__jr_next(r, close, NULL)) < 0) return TPK_ERR_FORMAT;
    }
    if (!obj) return TPK_OK;
    bool named = t->parent && v->key && !strcmp(v->key, t->parent) && depth == 1;
    return tpk__json_unique(t, v, named ? t->noun : "key");
}

/* The document s[0..n) (from file `name`; `fn` names the caller in errors) into *root; *arena
 * holds its strings. The keys of the top-level member `parent` (or NULL) are called `noun` in
 * messages. Free both with tpk__json_free (also after a failure). The tree's memory is the
 * context's allocator (ctx NULL: the C library's), a copy of which the arena's block holds
 * before the strings: tpk__json_free needs no context. */
static inline tpk_status tpk__json_read_named(tpk_ctx *ctx, const char *fn, const char *name,
                                              const char *s, size_t n, const char *parent,
                                              const char *noun, tpk__json *root, char **arena) {
    tpk__jtree t;
    memset(root, 0, sizeof *root);
    tpk__jr_init(&t.r, ctx, fn, name, s, n, 0);
    t.parent = parent, t.noun = noun;
    size_t head = sizeof(tpk_allocator);
    char *block =
        n < ((size_t)-1 - 1 - head) / 2 ? (char *)tpk__malloc(ctx, head + 2 * n + 1) : NULL;
    *arena = t.arena = block ? block + head : NULL, t.used = 0;
    if (!block) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%s: %zu bytes", t.r.name, n);
    tpk_allocator al = tpk__allocator(ctx);
    memcpy(block, &al, head);
    t.al = &al;
    TPK_TRY(tpk__json_value(&t, root, 0));
    return tpk__jr_end(&t.r, "characters after the document (expected the end of the text)");
}
/* The document s[0..n) into *root (tpk__json_read_named, every key called "key"). */
static inline tpk_status tpk__json_read(tpk_ctx *ctx, const char *fn, const char *name,
                                        const char *s, size_t n, tpk__json *root, char **arena) {
    return tpk__json_read_named(ctx, fn, name, s, n, NULL, NULL, root, arena);
}
/* tpk__json_read named "tpk_json" in errors. */
static inline tpk_status tpk__json_parse(tpk_ctx *ctx, const char *name, const char *s, size_t n,
                                         tpk__json *root, char **arena) {
    return tpk__json_read(ctx, "tpk_json", name, s, n, root, arena);
}
/* Free a tree and its arena (NULL: nothing was allocated, and no node has children). */
static inline void tpk__json_free(tpk__json *root, char **arena) {
    if (!*arena) return;
    tpk_allocator al;
    memcpy(&al, *arena - sizeof al, sizeof al);
    tpk__json_free_kids(&al, root);
    tpk__al_free(&al, *arena - sizeof al), *arena = NULL;
}
/* An object's member named key (keys are unique), NULL when absent or v is not an object. */
static inline const tpk__json *tpk__json_get(const tpk__json *v, const char *key) {
    if (!v || v->type != TPK__JOBJ) return NULL;
    size_t k = strlen(key);
    for (size_t i = 0; i < v->len; i++)
        if (v->kids[i].key_len == k && !memcmp(v->kids[i].key, key, k)) return &v->kids[i];
    return NULL;
}

/* Whether v is a whole number in [lo, hi] (checked before any conversion: no undefined behaviour
 * for 1e300); *out its value. */
static inline bool tpk__json_int(const tpk__json *v, double lo, double hi, int64_t *out) {
    if (!v || v->type != TPK__JNUM || !(v->num >= lo && v->num <= hi) ||
        v->num != (double)(int64_t)v->num)
        return false;
    *out = (int64_t)v->num;
    return true;
}

#endif /* TPK_TEXT_JSON_H */
