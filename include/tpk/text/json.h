/* tpk/text/json.h — a JSON reader (RFC 8259) for the files a tokenizer is made of (tokenizer.json,
 * vocab.json): the whole text parsed into a tree of tpk__json nodes.
 *
 * Strings are decoded (escapes, \uXXXX with surrogate pairs) into one arena of at most 2n bytes
 * (each decoded string is no longer than its source, plus its NUL); a container's children are
 * one array of `len` nodes, an object's children carry their key. Numbers are kept as double.
 * Nesting is limited to TPK__JSON_DEPTH levels (no stack overflow on a hostile file). Errors are
 * TPK_ERR_FORMAT naming the file and the byte offset: truncated text, a bad token or escape, a
 * lone surrogate, trailing characters, control characters inside strings. Host memory only. */
#ifndef TPK_TEXT_JSON_H
#define TPK_TEXT_JSON_H

#include <stdlib.h>
#include <string.h>

#include "../base/ctx.h"

#define TPK__JSON_DEPTH 64

typedef enum { TPK__JNULL, TPK__JBOOL, TPK__JNUM, TPK__JSTR, TPK__JARR, TPK__JOBJ } tpk__jtype;

typedef struct tpk__json {
    tpk__jtype type;
    size_t len;      /* string: bytes; array, object: children */
    const char *str; /* string: decoded, NUL-terminated (may hold NUL: use len) */
    const char *key; /* a child of an object: its key (decoded, NUL-terminated) */
    size_t key_len;
    double num;             /* number; bool: 0 or 1 */
    struct tpk__json *kids; /* array, object: [len] */
} tpk__json;

typedef struct tpk__jparser {
    const char *s, *name; /* the text [n], its file's name for messages */
    size_t n, at;
    char *arena; /* decoded strings [2n + 1] */
    size_t used;
    tpk_ctx *ctx;
} tpk__jparser;

static inline tpk_status tpk__jerr(tpk__jparser *p, const char *what) {
    if (p->at >= p->n)
        return tpk__fail(p->ctx, TPK_ERR_FORMAT, "tpk_json", "%s: truncated JSON (%s at the end)",
                         p->name, what);
    return tpk__fail(p->ctx, TPK_ERR_FORMAT, "tpk_json", "%s: bad JSON at byte %zu: %s", p->name,
                     p->at, what);
}
static inline void tpk__jws(tpk__jparser *p) {
    while (p->at < p->n && (p->s[p->at] == ' ' || p->s[p->at] == '\t' || p->s[p->at] == '\n' ||
                            p->s[p->at] == '\r'))
        p->at++;
}
/* The value of the 4 hex digits at p (avail bytes there), -1 when they are not (\uXXXX; also the
 * safetensors header's reader). */
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
/* A string at p->at (the opening quote), decoded into the arena: *out, *len. */
static inline tpk_status tpk__jstring(tpk__jparser *p, const char **out, size_t *len) {
    if (p->at >= p->n || p->s[p->at] != '"') return tpk__jerr(p, "expected a string");
    p->at++;
    char *d = p->arena + p->used, *o = d;
    for (;;) {
        if (p->at >= p->n) return tpk__jerr(p, "an unterminated string");
        unsigned char c = (unsigned char)p->s[p->at];
        if (c == '"') break;
        if (c < 0x20) return tpk__jerr(p, "a control character inside a string");
        if (c != '\\') {
            *o++ = (char)c, p->at++;
            continue;
        }
        if (p->at + 1 >= p->n) return tpk__jerr(p, "an unterminated escape");
        char e = p->s[p->at + 1];
        size_t esc = p->at; /* errors point at the escape */
        p->at += 2;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            *o++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        if (e != 'u') return p->at = esc, tpk__jerr(p, "an unknown escape");
        if (p->at + 4 > p->n) return tpk__jerr(p, "a truncated \\u escape");
        int u = tpk__hex4((const uint8_t *)p->s + p->at, 4);
        if (u < 0) return tpk__jerr(p, "a \\u escape without 4 hex digits");
        p->at += 4;
        unsigned cp = (unsigned)u;
        if (cp >= 0xDC00 && cp < 0xE000) return p->at = esc, tpk__jerr(p, "a lone low surrogate");
        if (cp >= 0xD800 && cp < 0xDC00) {
            int lo = p->at + 6 <= p->n && p->s[p->at] == '\\' && p->s[p->at + 1] == 'u'
                         ? tpk__hex4((const uint8_t *)p->s + p->at + 2, 4)
                         : -1;
            if (lo < 0xDC00 || lo >= 0xE000)
                return p->at = esc, tpk__jerr(p, "a lone high surrogate");
            p->at += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((unsigned)lo - 0xDC00);
        }
        /* UTF-8: never longer than the escape it came from (6 or 12 bytes) */
        if (cp < 0x80) *o++ = (char)cp;
        else if (cp < 0x800) *o++ = (char)(0xC0 | cp >> 6), *o++ = (char)(0x80 | (cp & 63));
        else if (cp < 0x10000)
            *o++ = (char)(0xE0 | cp >> 12), *o++ = (char)(0x80 | (cp >> 6 & 63)),
            *o++ = (char)(0x80 | (cp & 63));
        else
            *o++ = (char)(0xF0 | cp >> 18), *o++ = (char)(0x80 | (cp >> 12 & 63)),
            *o++ = (char)(0x80 | (cp >> 6 & 63)), *o++ = (char)(0x80 | (cp & 63));
    }
    p->at++;
    *o = 0;
    *out = d, *len = (size_t)(o - d);
    p->used += *len + 1;
    return TPK_OK;
}
static inline void tpk__json_free_kids(tpk__json *v) {
    if (v->type != TPK__JARR && v->type != TPK__JOBJ) return;
    for (size_t i = 0; v->kids && i < v->len; i++) tpk__json_free_kids(&v->kids[i]);
    free(v->kids), v->kids = NULL;
}
static inline tpk_status tpk__jvalue(tpk__jparser *p, tpk__json *v, int depth) {
    tpk__jws(p);
    if (p->at >= p->n) return tpk__jerr(p, "expected a value");
    char c = p->s[p->at];
    if (c == '"') {
        v->type = TPK__JSTR;
        return tpk__jstring(p, &v->str, &v->len);
    }
    static const char *const words[3] = {"null", "false", "true"};
    for (int w = 0; w < 3; w++) {
        size_t k = strlen(words[w]);
        if (c == words[w][0]) {
            if (p->at + k > p->n || memcmp(p->s + p->at, words[w], k))
                return tpk__jerr(p, "a bad literal");
            v->type = w ? TPK__JBOOL : TPK__JNULL, v->num = w == 2, p->at += k;
            return TPK_OK;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) { /* -? int frac? exp? */
        size_t a = p->at, i = a + (c == '-');
        size_t d0 = i;
        while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') i++;
        if (i == d0 || (p->s[d0] == '0' && i > d0 + 1)) return tpk__jerr(p, "a bad number");
        if (i < p->n && p->s[i] == '.') {
            size_t f = ++i;
            while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') i++;
            if (i == f) return p->at = i, tpk__jerr(p, "a number without fraction digits");
        }
        if (i < p->n && (p->s[i] == 'e' || p->s[i] == 'E')) {
            i++;
            if (i < p->n && (p->s[i] == '+' || p->s[i] == '-')) i++;
            size_t e = i;
            while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') i++;
            if (i == e) return p->at = i, tpk__jerr(p, "a number without exponent digits");
        }
        char buf[64];
        size_t k = i - a < sizeof buf - 1 ? i - a : sizeof buf - 1;
        memcpy(buf, p->s + a, k), buf[k] = 0;
        v->type = TPK__JNUM, v->num = strtod(buf, NULL), p->at = i;
        return TPK_OK;
    }
    if (c != '[' && c != '{') return tpk__jerr(p, "expected a value");
    if (depth >= TPK__JSON_DEPTH) return tpk__jerr(p, "nested deeper than 64 levels");
    bool obj = c == '{';
    char close = obj ? '}' : ']';
    v->type = obj ? TPK__JOBJ : TPK__JARR, v->len = 0, v->kids = NULL;
    size_t cap = 0;
    p->at++;
    tpk__jws(p);
    if (p->at < p->n && p->s[p->at] == close) return p->at++, TPK_OK;
    for (;;) {
        if (v->len == cap) {
            size_t nc = cap ? cap * 2 : 8;
            tpk__json *k = (tpk__json *)realloc(v->kids, nc * sizeof *k);
            if (!k)
                return tpk__fail(p->ctx, TPK_ERR_NOMEM, "tpk_json", "%s: %zu values", p->name, nc);
            v->kids = k, cap = nc;
        }
        tpk__json *kid = &v->kids[v->len];
        memset(kid, 0, sizeof *kid);
        v->len++; /* counted before it is filled: freed on failure */
        if (obj) {
            tpk__jws(p);
            TPK_TRY(tpk__jstring(p, &kid->key, &kid->key_len));
            tpk__jws(p);
            if (p->at >= p->n || p->s[p->at] != ':') return tpk__jerr(p, "expected ':'");
            p->at++;
        }
        TPK_TRY(tpk__jvalue(p, kid, depth + 1));
        tpk__jws(p);
        if (p->at < p->n && p->s[p->at] == ',') {
            p->at++;
            continue;
        }
        if (p->at < p->n && p->s[p->at] == close) return p->at++, TPK_OK;
        return tpk__jerr(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

/* The document s[0..n) (from file `name`) into *root; *arena holds its strings. Free both with
 * tpk__json_free. */
static inline tpk_status tpk__json_parse(tpk_ctx *ctx, const char *name, const char *s, size_t n,
                                         tpk__json *root, char **arena) {
    memset(root, 0, sizeof *root);
    tpk__jparser p = {s, name, n, 0, (char *)malloc(2 * n + 1), 0, ctx};
    *arena = p.arena;
    if (!p.arena) return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_json", "%s: %zu bytes", name, 2 * n);
    tpk_status st = tpk__jvalue(&p, root, 0);
    if (st == TPK_OK) {
        tpk__jws(&p);
        if (p.at < n) st = tpk__jerr(&p, "characters after the document");
    }
    return st;
}
static inline void tpk__json_free(tpk__json *root, char **arena) {
    tpk__json_free_kids(root);
    free(*arena), *arena = NULL;
}
/* An object's member named key (the last one when repeated, as Hugging Face's loader reads),
 * NULL when absent or v is not an object. */
static inline const tpk__json *tpk__json_get(const tpk__json *v, const char *key) {
    if (!v || v->type != TPK__JOBJ) return NULL;
    const tpk__json *r = NULL;
    size_t k = strlen(key);
    for (size_t i = 0; i < v->len; i++)
        if (v->kids[i].key_len == k && !memcmp(v->kids[i].key, key, k)) r = &v->kids[i];
    return r;
}

/* Whether v is a whole number in [lo, hi] (checked before any conversion: no undefined behaviour
 * for 1e300 or NaN); *out its value. */
static inline bool tpk__json_int(const tpk__json *v, double lo, double hi, int64_t *out) {
    if (!v || v->type != TPK__JNUM || !(v->num >= lo && v->num <= hi) ||
        v->num != (double)(int64_t)v->num)
        return false;
    *out = (int64_t)v->num;
    return true;
}

#endif /* TPK_TEXT_JSON_H */
