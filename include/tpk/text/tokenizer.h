/* tpk/text/tokenizer.h — byte-level BPE as Hugging Face `tokenizers` does it for GPT-2 and
 * GPT-NeoX: text in, token ids out, and back.
 *
 * Loading (tpk_tokenizer_load): a tokenizer.json (a file, or DIR/tokenizer.json), else GPT-2's
 * DIR/vocab.json + DIR/merges.txt (GPT-2's settings; "<|endoftext|>" special). Accepted:
 * normalizer null, NFC or a Sequence of those; pre-tokenizer ByteLevel (add_prefix_space,
 * use_regex) alone or in a Sequence; model BPE (vocab, merges as "a b" strings or ["a", "b"]
 * pairs, ignore_merges; no dropout, unknown token or subword affixes); decoder ByteLevel or null.
 * Anything else is refused by name (TPK_ERR_UNSUPPORTED), a malformed file with the place
 * (TPK_ERR_FORMAT): truncated JSON, a merge naming a token not in the vocabulary, a merge whose
 * result is not in it, a missing key.
 *
 * Encoding (tpk_tokenizer_encode), the library's order:
 *   0. bytes that are not UTF-8 become U+FFFD, maximal subpart by maximal subpart (what Rust's
 *      String::from_utf8_lossy and Python's decode("utf-8", "replace") make of them);
 *   1. added tokens with normalized = false are cut out of the raw text: leftmost, then longest;
 *      single_word, lstrip, rstrip as the library applies them;
 *   2. each text piece between them is normalized (NFC), then added tokens with normalized = true
 *      are cut out of it the same way;
 *   3. each remaining piece gets a leading space (add_prefix_space, unless it starts with one) and
 *      is split into words by GPT-2's pattern (use_regex)
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      matched by hand (tpk__tok_word: the alternatives in order, leftmost-first; \s+(?!\S) is the
 *      whitespace run less its last character when a non-space follows), Unicode classes from
 *      tpk/text/unicode.h;
 *   4. each word's bytes become one-character symbols through GPT-2's bytes_to_unicode map, and
 *      merges apply lowest rank first, leftmost first among equal ranks (a heap over the adjacent
 *      pairs: O(w log w) for a word of w bytes); words up to 255 bytes are cached.
 * No special tokens are added (no post-processor template).
 * Decoding (tpk_tokenizer_decode): each id's token through the ByteLevel decoder (every character
 * mapped back to its byte, or the token's own UTF-8 when one character is not in the map), the
 * bytes joined, then made UTF-8 as in step 0 — Hugging Face's decode, special tokens kept unless
 * skip_special.
 *
 * Memory: the vocabulary and merges, a word cache of at most 65,536 entries and ~4 MB (emptied when
 * full), scratch linear in the longest word, all from the allocator of the context that loaded it
 * (kept in the tokenizer for tpk_tokenizer_free); the ids and text handed back, and each call's
 * scratch, from the allocator of the context passed (tpk_free). One thread at a time per tokenizer
 * (the cache). */
#ifndef TPK_TEXT_TOKENIZER_H
#define TPK_TEXT_TOKENIZER_H

#include "json.h"
#include "unicode.h"

typedef struct tpk__tok_added {
    char *content; /* malloc'd, normalized when `normalized` and the tokenizer normalizes */
    size_t len;
    int32_t id;
    bool special, normalized, lstrip, rstrip, single_word;
} tpk__tok_added;

/* Words already merged: FNV-1a of the word -> its ids. Slots [TPK__TOK_CACHE]; keys and ids in two
 * arenas; everything dropped when a limit is reached. */
#define TPK__TOK_CACHE (1 << 16)
#define TPK__TOK_CACHE_BYTES (2 << 20)
typedef struct tpk__tok_cache {
    uint64_t *hash;        /* [TPK__TOK_CACHE], 0: empty */
    uint32_t *koff, *ioff; /* [TPK__TOK_CACHE] the word in keys, its ids in ids */
    uint8_t *klen, *nid;   /* [TPK__TOK_CACHE] bytes, ids (a cached word has at most 255) */
    uint8_t *keys;         /* [TPK__TOK_CACHE_BYTES] */
    int32_t *ids;          /* [TPK__TOK_CACHE_BYTES / 4] */
    size_t count, kused, iused;
} tpk__tok_cache;

typedef struct tpk__tok_merge {
    int32_t rank, pos, id;
} tpk__tok_merge;

typedef struct tpk_tokenizer {
    int64_t vocab_size; /* ids 0..vocab_size-1: the model's vocabulary and the added tokens */
    int32_t eot;        /* "<|endoftext|>", else the first special added token; -1: none */
    bool nfc, add_prefix_space, use_regex, ignore_merges;
    /* id -> its token (names + name_off[id], name_len[id] bytes; UINT32_MAX: no token) and the
     * bytes it decodes to (dec + dec_off[id], dec_len[id]) */
    char *names;
    uint8_t *dec;
    uint32_t *name_off, *name_len, *dec_off, *dec_len; /* [vocab_size] */
    uint8_t *special;                                  /* [vocab_size] 1: a special added token */
    int32_t *vslot; /* the model's vocabulary by token: ids, -1 empty [vmask + 1] */
    size_t vmask;
    uint64_t *mkey; /* merges (left << 32 | right) -> rank, merged id [mmask + 1], key ~0: empty */
    int32_t *mrank, *mid;
    size_t mmask;
    int32_t byte_id[256];  /* the id of byte b's one-character token, -1: none */
    uint16_t byte_cp[256]; /* GPT-2's bytes_to_unicode: byte -> code point (< 324) */
    tpk__tok_added *added; /* [nadded], by (normalized, first byte, longest first) */
    int nadded;
    uint16_t abeg[2][257]; /* added[abeg[k][b] .. abeg[k][b + 1]): normalized == k, first byte b */
    tpk__tok_cache cache;
    int32_t *sym, *prev, *next; /* one word's symbols [scap] */
    tpk__tok_merge *heap;       /* [scap] */
    size_t scap;
    tpk_allocator al; /* its memory's: the loading context's allocator (tpk/base/ctx.h) */
} tpk_tokenizer;

/* ---- tables --------------------------------------------------------------------------------- */

static inline uint64_t tpk__fnv(const void *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h | 1;
}
/* The model vocabulary's id of token s[0..n), -1 when absent. */
static inline int32_t tpk__tok_find(const tpk_tokenizer *t, const char *s, size_t n) {
    for (size_t i = (size_t)tpk__fnv(s, n) & t->vmask;; i = (i + 1) & t->vmask) {
        int32_t id = t->vslot[i];
        if (id < 0) return -1;
        if (t->name_len[id] == n && !memcmp(t->names + t->name_off[id], s, n)) return id;
    }
}
static inline size_t tpk__tok_mslot(const tpk_tokenizer *t, uint64_t key) {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & t->mmask;
    while (t->mkey[i] != ~0ull && t->mkey[i] != key) i = (i + 1) & t->mmask;
    return i;
}
/* The merge of ids (a, b): its rank, and the merged id in *id; -1 when a b is no merge. */
static inline int32_t tpk__tok_merge_of(const tpk_tokenizer *t, int32_t a, int32_t b, int32_t *id) {
    size_t i = tpk__tok_mslot(t, (uint64_t)(uint32_t)a << 32 | (uint32_t)b);
    if (t->mkey[i] == ~0ull) return -1;
    *id = t->mid[i];
    return t->mrank[i];
}

/* ---- pre-tokenization ---------------------------------------------------------------------- */

/* The character at s[p] (valid UTF-8): its class in *c, the position after it. */
static inline size_t tpk__tok_next(const uint8_t *s, size_t n, size_t p, int *c) {
    if (s[p] < 0x80) return *c = tpk__uc_class(s[p]), p + 1;
    uint32_t cp;
    size_t k = tpk__utf8_decode(s + p, n - p, &cp);
    *c = tpk__uc_class(cp);
    return p + k;
}
/* The end of the run of class c starting at p. */
static inline size_t tpk__tok_run(const uint8_t *s, size_t n, size_t p, int c) {
    while (p < n) {
        int d;
        size_t q = tpk__tok_next(s, n, p, &d);
        if (d != c) break;
        p = q;
    }
    return p;
}
/* The end of GPT-2's pattern's match at p < n (every character starts one). */
static inline size_t tpk__tok_word(const uint8_t *s, size_t n, size_t p) {
    int c0, c1;
    size_t q = tpk__tok_next(s, n, p, &c0);
    if (s[p] == '\'' && q < n) { /* 's 't 'm 'd 're 've 'll */
        uint8_t a = s[q], b = q + 1 < n ? s[q + 1] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return q + 1;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return q + 2;
    }
    if (s[p] == ' ' && q < n) { /* " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+" */
        tpk__tok_next(s, n, q, &c1);
        if (c1 != TPK__UC_SPACE) return tpk__tok_run(s, n, q, c1);
    }
    if (c0 != TPK__UC_SPACE) return tpk__tok_run(s, n, p, c0);
    size_t last = p, e = q; /* \s+(?!\S) | \s+ */
    while (e < n) {
        size_t r = tpk__tok_next(s, n, e, &c1);
        if (c1 != TPK__UC_SPACE) break;
        last = e, e = r;
    }
    return e == n || last == p ? e : last;
}

/* ---- BPE ------------------------------------------------------------------------------------ */

typedef struct tpk__ids {
    int32_t *p; /* [cap] */
    size_t n, cap;
} tpk__ids;
static inline tpk_status tpk__ids_push(tpk_ctx *ctx, tpk__ids *v, const int32_t *x, size_t k) {
    if (k == 0) return TPK_OK; /* nothing (and v->p may still be NULL: no pointer arithmetic) */
    if (v->n + k > v->cap) {
        size_t c = v->cap ? v->cap : 1024;
        while (c < v->n + k) c *= 2;
        int32_t *p = (int32_t *)tpk__realloc(ctx, v->p, v->cap * sizeof *p, c * sizeof *p);
        if (!p) return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_tokenizer_encode", "%zu ids", c);
        v->p = p, v->cap = c;
    }
    memcpy(v->p + v->n, x, k * sizeof *x);
    v->n += k;
    return TPK_OK;
}
static inline bool tpk__heap_less(tpk__tok_merge a, tpk__tok_merge b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}
static inline void tpk__heap_push(tpk__tok_merge *h, size_t *n, tpk__tok_merge m) {
    size_t i = (*n)++;
    while (i && tpk__heap_less(m, h[(i - 1) / 2])) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = m;
}
static inline tpk__tok_merge tpk__heap_pop(tpk__tok_merge *h, size_t *n) {
    tpk__tok_merge top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && tpk__heap_less(h[c + 1], h[c])) c++;
        if (!tpk__heap_less(h[c], last)) break;
        h[i] = h[c], i = c;
    }
    if (*n) h[i] = last;
    return top;
}
/* Push the merge of symbol i with its next one, if any, onto the heap. */
static inline void tpk__tok_candidate(const tpk_tokenizer *t, int32_t i, size_t *nh) {
    int32_t j = t->next[i], id;
    if (j < 0) return;
    int32_t r = tpk__tok_merge_of(t, t->sym[i], t->sym[j], &id);
    tpk__tok_merge g;
    g.rank = r, g.pos = i, g.id = id;
    if (r >= 0) tpk__heap_push(t->heap, nh, g);
}
/* The merges of one word (w[0..n) bytes; t's scratch holds n symbols): its ids appended to out. */
static inline tpk_status tpk__tok_merge_word(tpk_ctx *ctx, tpk_tokenizer *t, const uint8_t *w,
                                             size_t n, tpk__ids *out) {
    size_t m = 0, nh = 0;
    for (size_t i = 0; i < n; i++) /* a byte without its token is dropped, as the library does */
        if (t->byte_id[w[i]] >= 0) t->sym[m++] = t->byte_id[w[i]];
    for (size_t i = 0; i < m; i++)
        t->prev[i] = (int32_t)i - 1, t->next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    for (size_t i = 0; i + 1 < m; i++) tpk__tok_candidate(t, (int32_t)i, &nh);
    while (nh) {
        tpk__tok_merge g = tpk__heap_pop(t->heap, &nh);
        int32_t i = g.pos, j = t->next[i], id;
        /* stale: i merged away (sym -1), no next, or the pair changed since it was pushed */
        if (t->sym[i] < 0 || j < 0 || tpk__tok_merge_of(t, t->sym[i], t->sym[j], &id) < 0 ||
            id != g.id)
            continue;
        t->sym[i] = g.id, t->sym[j] = -1, t->next[i] = t->next[j];
        if (t->next[i] >= 0) t->prev[t->next[i]] = i;
        if (t->prev[i] >= 0) tpk__tok_candidate(t, t->prev[i], &nh);
        tpk__tok_candidate(t, i, &nh);
    }
    for (int32_t i = m ? 0 : -1; i >= 0; i = t->next[i])
        TPK_TRY(tpk__ids_push(ctx, out, &t->sym[i], 1));
    return TPK_OK;
}
/* The ids of one word (its UTF-8 bytes w[0..n)) appended to out. */
static inline tpk_status tpk__tok_bpe(tpk_ctx *ctx, tpk_tokenizer *t, const uint8_t *w, size_t n,
                                      tpk__ids *out) {
    static const char *fn = "tpk_tokenizer_encode";
    tpk__tok_cache *c = &t->cache;
    uint64_t h = 0;
    size_t slot = 0;
    if (n < 256) { /* cached? */
        h = tpk__fnv(w, n);
        for (slot = (size_t)h & (TPK__TOK_CACHE - 1); c->hash[slot];
             slot = (slot + 1) & (TPK__TOK_CACHE - 1))
            if (c->hash[slot] == h && c->klen[slot] == n && !memcmp(c->keys + c->koff[slot], w, n))
                return tpk__ids_push(ctx, out, c->ids + c->ioff[slot], c->nid[slot]);
    }
    if (n > t->scap) {
        size_t k = n > 2 * t->scap ? n : 2 * t->scap;
        size_t was = t->scap;
        int32_t *a = (int32_t *)tpk__al_realloc(&t->al, t->sym, was * 4, k * 4);
        if (a) t->sym = a;
        int32_t *b = (int32_t *)tpk__al_realloc(&t->al, t->prev, was * 4, k * 4);
        if (b) t->prev = b;
        int32_t *d = (int32_t *)tpk__al_realloc(&t->al, t->next, was * 4, k * 4);
        if (d) t->next = d;
        tpk__tok_merge *e = (tpk__tok_merge *)tpk__al_realloc(&t->al, t->heap, 2 * was * sizeof *e,
                                                              2 * k * sizeof *e);
        if (e) t->heap = e;
        if (!a || !b || !d || !e)
            return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "a word of %zu bytes", n);
        t->scap = k;
    }
    size_t at0 = out->n;
    int32_t whole = -1;
    if (t->ignore_merges) {        /* the whole word a token: taken as it is */
        char *u = (char *)t->heap; /* 2 bytes a byte fit in its [2 scap] merges */
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += tpk__utf8_encode(t->byte_cp[w[i]], (uint8_t *)u + k);
        whole = tpk__tok_find(t, u, k);
    }
    TPK_TRY(whole >= 0 ? tpk__ids_push(ctx, out, &whole, 1)
                       : tpk__tok_merge_word(ctx, t, w, n, out));
    if (n < 256 && out->n - at0 < 256) {
        size_t k = out->n - at0;
        if (c->count >= TPK__TOK_CACHE / 2 || c->kused + n > TPK__TOK_CACHE_BYTES ||
            c->iused + k > TPK__TOK_CACHE_BYTES / 4) { /* full: start again */
            memset(c->hash, 0, TPK__TOK_CACHE * sizeof *c->hash);
            c->count = c->kused = c->iused = 0;
            for (slot = (size_t)h & (TPK__TOK_CACHE - 1); c->hash[slot];)
                slot = (slot + 1) & (TPK__TOK_CACHE - 1);
        }
        c->hash[slot] = h, c->klen[slot] = (uint8_t)n, c->nid[slot] = (uint8_t)k;
        c->koff[slot] = (uint32_t)c->kused, c->ioff[slot] = (uint32_t)c->iused;
        memcpy(c->keys + c->kused, w, n);
        if (k) memcpy(c->ids + c->iused, out->p + at0, k * sizeof(int32_t)); /* none: p NULL */
        c->kused += n, c->iused += k, c->count++;
    }
    return TPK_OK;
}

/* ---- encoding ------------------------------------------------------------------------------- */

/* s[0..n) with every ill-formed UTF-8 sequence replaced by U+FFFD into *out (3 n + 1 bytes from
 * the context's allocator, *m used); *out = NULL when s is already UTF-8. */
static inline tpk_status tpk__utf8_lossy(tpk_ctx *ctx, const char *fn, const uint8_t *s, size_t n,
                                         uint8_t **out, size_t *m) {
    *out = NULL;
    size_t p = 0, bad = 0;
    while (p < n) {
        if (s[p] < 0x80) {
            p++;
            continue;
        }
        uint32_t cp;
        size_t k = tpk__utf8_decode(s + p, n - p, &cp);
        if (cp == 0xFFFD && !(k == 3 && s[p] == 0xEF && s[p + 1] == 0xBF && s[p + 2] == 0xBD)) {
            bad = 1;
            break;
        }
        p += k;
    }
    if (!bad) return TPK_OK;
    uint8_t *o = (uint8_t *)tpk__malloc(ctx, 3 * n + 1); /* one U+FFFD (3 bytes) a byte at most */
    if (!o) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu bytes", 3 * n);
    memcpy(o, s, p);
    size_t j = p;
    while (p < n) {
        uint32_t cp;
        size_t k = s[p] < 0x80 ? (cp = s[p], 1) : tpk__utf8_decode(s + p, n - p, &cp);
        j += tpk__utf8_encode(cp, o + j), p += k;
    }
    *out = o, *m = j;
    return TPK_OK;
}

/* The words of one text piece (after the added tokens and the normalizer) through BPE. */
static inline tpk_status tpk__tok_piece(tpk_ctx *ctx, tpk_tokenizer *t, const uint8_t *s, size_t n,
                                        tpk__ids *out) {
    if (!n) return TPK_OK;
    uint8_t *sp = NULL;
    if (t->add_prefix_space && s[0] != ' ') {
        if (!(sp = (uint8_t *)tpk__malloc(ctx, n + 1)))
            return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_tokenizer_encode", "%zu bytes", n + 1);
        sp[0] = ' ', memcpy(sp + 1, s, n), s = sp, n++;
    }
    tpk_status st = TPK_OK;
    for (size_t p = 0, q; st == TPK_OK && p < n; p = q) {
        q = t->use_regex ? tpk__tok_word(s, n, p) : n;
        st = tpk__tok_bpe(ctx, t, s + p, q - p, out);
    }
    tpk__free(ctx, sp);
    return st;
}
/* Whether the character before s[p] / at s[p] (p < n) is a word character (\w), for single_word. */
static inline bool tpk__tok_word_before(const uint8_t *s, size_t p) {
    if (!p) return false;
    size_t b = tpk__utf8_back(s, p - 1, 0);
    uint32_t cp;
    tpk__utf8_decode(s + b, p - b, &cp);
    return tpk__uc_word(cp);
}
static inline bool tpk__tok_word_at(const uint8_t *s, size_t n, size_t p) {
    uint32_t cp;
    return p < n && (tpk__utf8_decode(s + p, n - p, &cp), tpk__uc_word(cp));
}
/* Cut the added tokens with normalized == k out of s[0..n) (leftmost, then longest); the pieces
 * between go on: stage 1 (k = 0) normalizes and cuts again, stage 2 (k = 1) to tpk__tok_piece. */
static inline tpk_status tpk__tok_split(tpk_ctx *ctx, tpk_tokenizer *t, const uint8_t *s, size_t n,
                                        int k, tpk__ids *out);
static inline tpk_status tpk__tok_text(tpk_ctx *ctx, tpk_tokenizer *t, const uint8_t *s, size_t n,
                                       int k, tpk__ids *out) {
    if (!n) return TPK_OK;
    if (k == 1) return tpk__tok_piece(ctx, t, s, n, out);
    bool plain = !t->nfc; /* code points below U+0300 (lead bytes below 0xCC) are already NFC */
    for (size_t i = 0; !plain && i < n; i++)
        if (s[i] >= 0xCC) break;
        else if (i + 1 == n) plain = true;
    if (plain) return tpk__tok_split(ctx, t, s, n, 1, out);
    uint8_t *z;
    size_t m;
    TPK_TRY(tpk__nfc(ctx, s, n, &z, &m));
    tpk_status st = tpk__tok_split(ctx, t, z, m, 1, out);
    tpk__free(ctx, z);
    return st;
}
static inline tpk_status tpk__tok_split(tpk_ctx *ctx, tpk_tokenizer *t, const uint8_t *s, size_t n,
                                        int k, tpk__ids *out) {
    if (t->abeg[k][0] == t->abeg[k][256]) return tpk__tok_text(ctx, t, s, n, k, out);
    size_t done = 0; /* the end of the last cut */
    for (size_t p = 0; p < n;) {
        const tpk__tok_added *a = NULL;
        for (int i = t->abeg[k][s[p]]; i < t->abeg[k][s[p] + 1]; i++)
            if (t->added[i].len <= n - p && !memcmp(s + p, t->added[i].content, t->added[i].len)) {
                a = &t->added[i];
                break;
            }
        if (!a) {
            p++;
            continue;
        }
        size_t start = p, stop = p + a->len;
        p = stop; /* the next match is searched after this one, whatever the strips take */
        /* single_word: not beside a word character (the library's \w$ and ^\w) */
        if (a->single_word && (tpk__tok_word_before(s, start) || tpk__tok_word_at(s, n, stop)))
            continue;
        if (a->lstrip) {
            size_t b = start;
            while (b > 0) {
                size_t c0 = tpk__utf8_back(s, b - 1, 0);
                int c;
                tpk__tok_next(s, n, c0, &c);
                if (c != TPK__UC_SPACE) break;
                b = c0;
            }
            start = b > done ? b : done;
        }
        if (a->rstrip) stop = tpk__tok_run(s, n, stop, TPK__UC_SPACE);
        if (done < start) TPK_TRY(tpk__tok_text(ctx, t, s + done, start - done, k, out));
        TPK_TRY(tpk__ids_push(ctx, out, &a->id, 1));
        done = stop;
    }
    return done < n ? tpk__tok_text(ctx, t, s + done, n - done, k, out) : TPK_OK;
}

/* text[0..n) (any bytes; not UTF-8 becomes U+FFFD) encoded; the ids appended to *ids (from the
 * context's allocator: tpk_free(ctx, *ids); NULL for a new array; *n_ids in: the ids there, out:
 * with the new ones). No special tokens are added. Not thread-safe on one tokenizer (its word
 * cache). */
static inline tpk_status tpk_tokenizer_encode(tpk_ctx *ctx, tpk_tokenizer *t, const char *text,
                                              size_t n, int32_t **ids, size_t *n_ids) {
    static const char *fn = "tpk_tokenizer_encode";
    if (!ctx) return TPK_ERR_ARG;
    if (!t || !ids || !n_ids || (!text && n))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL",
                         !t       ? "t"
                         : !ids   ? "ids"
                         : !n_ids ? "n_ids"
                                  : "text");
    tpk__ids out = {*ids, *n_ids, *ids ? *n_ids : 0};
    uint8_t *fixed;
    size_t m;
    TPK_TRY(tpk__utf8_lossy(ctx, fn, (const uint8_t *)text, n, &fixed, &m));
    tpk_status st = fixed ? tpk__tok_split(ctx, t, fixed, m, 0, &out)
                          : tpk__tok_split(ctx, t, (const uint8_t *)text, n, 0, &out);
    tpk__free(ctx, fixed);
    *ids = out.p, *n_ids = out.n;
    return st;
}

/* ids[0..n) decoded to UTF-8 text: *out (from the context's allocator: tpk_free(ctx, *out);
 * NUL-terminated, *out_n bytes without it). An id outside the vocabulary is TPK_ERR_ARG.
 * skip_special: special added tokens left out. */
static inline tpk_status tpk_tokenizer_decode(tpk_ctx *ctx, const tpk_tokenizer *t,
                                              const int32_t *ids, size_t n, bool skip_special,
                                              char **out, size_t *out_n) {
    static const char *fn = "tpk_tokenizer_decode";
    if (!ctx) return TPK_ERR_ARG;
    if (!t || !out || !out_n || (!ids && n))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL",
                         !t       ? "t"
                         : !out   ? "out"
                         : !out_n ? "out_n"
                                  : "ids");
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size || t->name_len[ids[i]] == UINT32_MAX)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "ids[%zu]: %d is not a token id (expected 0..%lld, a token's)", i,
                             (int)ids[i], (long long)t->vocab_size - 1);
        if (!(skip_special && t->special[ids[i]])) len += t->dec_len[ids[i]];
    }
    uint8_t *b = (uint8_t *)tpk__malloc(ctx, len + 1);
    if (!b) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu bytes", len + 1);
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (!(skip_special && t->special[ids[i]]))
            memcpy(b + j, t->dec + t->dec_off[ids[i]], t->dec_len[ids[i]]), j += t->dec_len[ids[i]];
    uint8_t *fixed;
    size_t m;
    tpk_status st = tpk__utf8_lossy(ctx, fn, b, j, &fixed, &m);
    if (st != TPK_OK) return tpk__free(ctx, b), st;
    if (fixed) { /* fixed holds 3 j + 1 >= m + 1 bytes: trimmed to m + 1 */
        uint8_t *g = (uint8_t *)tpk__realloc(ctx, fixed, m, m + 1);
        tpk__free(ctx, b), b = g ? g : fixed, j = m;
    }
    b[j] = 0;
    *out = (char *)b, *out_n = j;
    return TPK_OK;
}

/* The id of token s (NUL-terminated; an added token's content or the model vocabulary's token, as
 * the file spells it: GPT-2's "Ġthe" for " the"), TPK_ERR_ARG when there is none. */
static inline tpk_status tpk_tokenizer_token_id(tpk_ctx *ctx, const tpk_tokenizer *t, const char *s,
                                                int32_t *id) {
    if (!ctx) return TPK_ERR_ARG;
    if (!t || !s || !id)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_tokenizer_token_id", "%s: NULL",
                         !t   ? "t"
                         : !s ? "s"
                              : "id");
    size_t n = strlen(s);
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, s, n))
            return *id = t->added[i].id, TPK_OK;
    *id = tpk__tok_find(t, s, n);
    if (*id < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_tokenizer_token_id", "s: \"%.64s\" is not a token",
                         s);
    return TPK_OK;
}

static inline void tpk_tokenizer_free(tpk_tokenizer *t) {
    if (!t) return;
    tpk_allocator al = t->al;
    void *own[] = {t->names,   t->dec,     t->name_off, t->name_len, t->dec_off,
                   t->dec_len, t->special, t->vslot,    t->mkey,     t->mrank,
                   t->mid,     t->sym,     t->prev,     t->next,     t->heap};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) tpk__al_free(&al, own[i]);
    for (int i = 0; i < t->nadded; i++) tpk__al_free(&al, t->added[i].content);
    tpk__al_free(&al, t->added);
    tpk__tok_cache *c = &t->cache;
    void *cache[] = {c->hash, c->koff, c->ioff, c->klen, c->nid, c->keys, c->ids};
    for (size_t i = 0; i < sizeof cache / sizeof cache[0]; i++) tpk__al_free(&al, cache[i]);
    tpk__al_free(&al, t);
}

/* ---- loading -------------------------------------------------------------------------------- */

/* A loader's state: the file's name for messages, the vocabulary as (token, id) pairs. */
typedef struct tpk__tok_load {
    tpk_ctx *ctx;
    const char *file;
    tpk_tokenizer *t;
} tpk__tok_load;

static inline tpk_status tpk__tok_bad(tpk__tok_load *L, tpk_status s, const char *what) {
    return tpk__fail(L->ctx, s, "tpk_tokenizer_load", "%s: %s", L->file, what);
}
/* The vocabulary (n tokens: strings tok[i] of len[i] bytes, ids id[i]) into t's tables. */
static inline tpk_status tpk__tok_vocab(tpk__tok_load *L, size_t n, const char *const *tok,
                                        const size_t *len, const int64_t *id) {
    tpk_tokenizer *t = L->t;
    int64_t V = 0;
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (id[i] < 0 || id[i] >= (1 << 30)) {
            char m[160];
            snprintf(m, sizeof m, "vocabulary token \"%.40s\": id %lld (expected 0..2^30-1)",
                     tok[i], (long long)id[i]);
            return tpk__tok_bad(L, TPK_ERR_FORMAT, m);
        }
        if (id[i] + 1 > V) V = id[i] + 1;
        bytes += len[i];
    }
    for (int i = 0; i < t->nadded; i++) {
        if (t->added[i].id + 1 > V) V = t->added[i].id + 1;
        bytes += t->added[i].len;
    }
    if (!V) return tpk__tok_bad(L, TPK_ERR_FORMAT, "an empty vocabulary");
    if (V > 2 * (int64_t)(n + (size_t)t->nadded) + 1024) { /* holes: not a real vocabulary */
        char m[160];
        snprintf(m, sizeof m,
                 "ids up to %lld for %zu tokens (expected ids below about twice the "
                 "tokens)",
                 (long long)V - 1, n + (size_t)t->nadded);
        return tpk__tok_bad(L, TPK_ERR_FORMAT, m);
    }
    size_t cap = 16;
    while (cap < 2 * n + 16) cap *= 2;
    t->vocab_size = V, t->vmask = cap - 1;
    const tpk_allocator *al = &t->al;
    t->names = (char *)tpk__al_malloc(al, bytes + 1);
    t->name_off = (uint32_t *)tpk__al_malloc(al, (size_t)V * 4),
    t->name_len = (uint32_t *)tpk__al_malloc(al, (size_t)V * 4);
    t->dec = (uint8_t *)tpk__al_malloc(al, 2 * bytes + 1); /* every token's bytes, the added ones
                                                             twice */
    t->dec_off = (uint32_t *)tpk__al_malloc(al, (size_t)V * 4),
    t->dec_len = (uint32_t *)tpk__al_malloc(al, (size_t)V * 4);
    t->special = (uint8_t *)tpk__al_calloc(al, (size_t)V, 1),
    t->vslot = (int32_t *)tpk__al_malloc(al, cap * 4);
    if (!t->names || !t->name_off || !t->name_len || !t->dec || !t->dec_off || !t->dec_len ||
        !t->special || !t->vslot)
        return tpk__tok_bad(L, TPK_ERR_NOMEM, "out of memory for the vocabulary");
    for (int64_t i = 0; i < V; i++) t->name_len[i] = UINT32_MAX, t->dec_len[i] = 0;
    memset(t->vslot, 0xff, cap * 4);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->name_len[id[i]] != UINT32_MAX) {
            char m[200];
            uint32_t k = t->name_len[id[i]]; /* the names are not NUL-terminated */
            snprintf(m, sizeof m, "vocabulary: id %lld given to \"%.*s\" and to \"%.40s\"",
                     (long long)id[i], (int)(k < 40 ? k : 40), t->names + t->name_off[id[i]],
                     tok[i]);
            return tpk__tok_bad(L, TPK_ERR_FORMAT, m);
        }
        if (tpk__tok_find(t, tok[i], len[i]) >= 0) {
            char m[160];
            snprintf(m, sizeof m, "vocabulary: token \"%.40s\" twice", tok[i]);
            return tpk__tok_bad(L, TPK_ERR_FORMAT, m);
        }
        memcpy(t->names + at, tok[i], len[i]);
        t->name_off[id[i]] = (uint32_t)at, t->name_len[id[i]] = (uint32_t)len[i], at += len[i];
        size_t s = (size_t)tpk__fnv(tok[i], len[i]) & t->vmask;
        while (t->vslot[s] >= 0) s = (s + 1) & t->vmask;
        t->vslot[s] = (int32_t)id[i];
    }
    for (int i = 0; i < t->nadded; i++) { /* an added token's content names an id without one */
        tpk__tok_added *a = &t->added[i];
        t->special[a->id] = a->special;
        if (t->name_len[a->id] != UINT32_MAX) continue;
        memcpy(t->names + at, a->content, a->len);
        t->name_off[a->id] = (uint32_t)at, t->name_len[a->id] = (uint32_t)a->len, at += a->len;
    }
    /* each token's bytes: the ByteLevel decoder's */
    int16_t inv[324];
    for (int c = 0; c < 324; c++) inv[c] = -1;
    for (int b = 0; b < 256; b++) inv[t->byte_cp[b]] = (int16_t)b;
    size_t d = 0;
    for (int64_t i = 0, r; i < V + t->nadded; i++) { /* the ids, then the added tokens again */
        if (i < V && t->name_len[i] == UINT32_MAX) continue;
        const tpk__tok_added *a = i < V ? NULL : &t->added[i - V];
        /* an added token decodes as its content (the library's order), also where the model's
         * vocabulary has the id */
        const uint8_t *s =
            a ? (const uint8_t *)a->content : (const uint8_t *)t->names + t->name_off[i];
        size_t m = a ? a->len : t->name_len[i], k = 0, p = 0;
        r = a ? a->id : i;
        t->dec_off[r] = (uint32_t)d;
        for (; p < m; k++) {
            uint32_t cp;
            p += tpk__utf8_decode(s + p, m - p, &cp);
            if (cp >= 324 || inv[cp] < 0) break;
            t->dec[d + k] = (uint8_t)inv[cp];
        }
        if (p < m) memcpy(t->dec + d, s, m), k = m; /* a character not in the map: as it is */
        t->dec_len[r] = (uint32_t)k, d += k;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        t->byte_id[b] = tpk__tok_find(t, (const char *)u, tpk__utf8_encode(t->byte_cp[b], u));
    }
    return TPK_OK;
}
/* A vocabulary object {"token": id, ...} (`what` in messages) into t's tables. */
static inline tpk_status tpk__tok_vocab_json(tpk__tok_load *L, const tpk__json *v,
                                             const char *what) {
    size_t nv = v->len;
    tpk_ctx *ctx = L->ctx;
    const char **tok = (const char **)tpk__malloc(ctx, (nv + 1) * sizeof *tok);
    size_t *len = (size_t *)tpk__malloc(ctx, (nv + 1) * sizeof *len);
    int64_t *ids = (int64_t *)tpk__malloc(ctx, (nv + 1) * sizeof *ids);
    tpk_status st = tok && len && ids ? TPK_OK : tpk__tok_bad(L, TPK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == TPK_OK && i < nv; i++) {
        const tpk__json *e = &v->kids[i];
        tok[i] = e->key, len[i] = e->key_len;
        if (!tpk__json_int(e, 0, (1 << 30) - 1, &ids[i])) {
            char m[160];
            snprintf(m, sizeof m, "%s \"%.40s\": expected an id 0..2^30-1", what, e->key);
            st = tpk__tok_bad(L, TPK_ERR_FORMAT, m);
        }
    }
    if (st == TPK_OK) st = tpk__tok_vocab(L, nv, tok, len, ids);
    tpk__free(ctx, (void *)tok), tpk__free(ctx, len), tpk__free(ctx, ids);
    return st;
}
/* Merge i (tokens a[0..na), b[0..nb)) with rank i into the table (sized by tpk__tok_merges0). */
static inline tpk_status tpk__tok_merge_add(tpk__tok_load *L, size_t i, const char *a, size_t na,
                                            const char *b, size_t nb) {
    tpk_tokenizer *t = L->t;
    int32_t x = tpk__tok_find(t, a, na), y = tpk__tok_find(t, b, nb), z = -1;
    char m[240];
    if (x < 0 || y < 0) {
        snprintf(m, sizeof m, "merges[%zu] \"%.*s %.*s\": \"%.*s\" is not in the vocabulary", i,
                 (int)(na < 40 ? na : 40), a, (int)(nb < 40 ? nb : 40), b,
                 (int)(x < 0 ? (na < 40 ? na : 40) : (nb < 40 ? nb : 40)), x < 0 ? a : b);
        return tpk__tok_bad(L, TPK_ERR_FORMAT, m);
    }
    char *ab = (char *)tpk__malloc(L->ctx, na + nb + 1);
    if (!ab) return tpk__tok_bad(L, TPK_ERR_NOMEM, "out of memory for the merges");
    memcpy(ab, a, na), memcpy(ab + na, b, nb);
    z = tpk__tok_find(t, ab, na + nb);
    tpk__free(L->ctx, ab);
    if (z < 0) {
        snprintf(m, sizeof m,
                 "merges[%zu] \"%.*s %.*s\": the merged token is not in the vocabulary", i,
                 (int)(na < 40 ? na : 40), a, (int)(nb < 40 ? nb : 40), b);
        return tpk__tok_bad(L, TPK_ERR_FORMAT, m);
    }
    uint64_t key = (uint64_t)(uint32_t)x << 32 | (uint32_t)y;
    size_t s = tpk__tok_mslot(t, key);
    /* repeated: the last rank stays, as the library's map keeps it */
    t->mkey[s] = key, t->mrank[s] = (int32_t)i, t->mid[s] = z;
    return TPK_OK;
}
static inline tpk_status tpk__tok_merges0(tpk__tok_load *L, size_t n) {
    tpk_tokenizer *t = L->t;
    size_t cap = 16;
    while (cap < 2 * n + 16) cap *= 2;
    t->mmask = cap - 1;
    t->mkey = (uint64_t *)tpk__al_malloc(&t->al, cap * 8);
    t->mrank = (int32_t *)tpk__al_malloc(&t->al, cap * 4),
    t->mid = (int32_t *)tpk__al_malloc(&t->al, cap * 4);
    if (!t->mkey || !t->mrank || !t->mid)
        return tpk__tok_bad(L, TPK_ERR_NOMEM, "out of memory for the merges");
    memset(t->mkey, 0xff, cap * 8);
    return TPK_OK;
}
/* A merge "a b" (one space) split in two; false when it is not that. */
static inline bool tpk__tok_merge_split(const char *s, size_t n, size_t *sp) {
    const char *c = (const char *)memchr(s, ' ', n);
    if (!c || c == s || c == s + n - 1 || memchr(c + 1, ' ', (size_t)(s + n - c - 1))) return false;
    *sp = (size_t)(c - s);
    return true;
}
static inline int tpk__tok_cmp_added(const void *x, const void *y) {
    const tpk__tok_added *a = (const tpk__tok_added *)x, *b = (const tpk__tok_added *)y;
    if (a->normalized != b->normalized) return a->normalized - b->normalized;
    if ((uint8_t)a->content[0] != (uint8_t)b->content[0])
        return (uint8_t)a->content[0] - (uint8_t)b->content[0];
    return a->len != b->len ? (a->len < b->len ? 1 : -1) : a->id - b->id;
}
/* After the vocabulary: the added tokens ordered for the scan, the end-of-text token. */
static inline tpk_status tpk__tok_finish(tpk__tok_load *L) {
    tpk_tokenizer *t = L->t;
    if (t->nadded) qsort(t->added, (size_t)t->nadded, sizeof *t->added, tpk__tok_cmp_added);
    for (int k = 0, i = 0; k < 2; k++)
        for (int b = 0; b < 256; b++) {
            t->abeg[k][b] = (uint16_t)i;
            while (i < t->nadded && t->added[i].normalized == k &&
                   (uint8_t)t->added[i].content[0] == b)
                i++;
            t->abeg[k][b + 1] = (uint16_t)i;
        }
    t->eot = -1;
    for (int i = 0; i < t->nadded && t->eot < 0; i++)
        if (!strcmp(t->added[i].content, "<|endoftext|>")) t->eot = t->added[i].id;
    for (int i = 0; i < t->nadded && t->eot < 0; i++)
        if (t->added[i].special) t->eot = t->added[i].id;
    if (t->eot < 0) t->eot = tpk__tok_find(t, "<|endoftext|>", 13);
    tpk__tok_cache *c = &t->cache;
    const tpk_allocator *al = &t->al;
    c->hash = (uint64_t *)tpk__al_calloc(al, TPK__TOK_CACHE, 8);
    c->koff = (uint32_t *)tpk__al_malloc(al, TPK__TOK_CACHE * 4),
    c->ioff = (uint32_t *)tpk__al_malloc(al, TPK__TOK_CACHE * 4);
    c->klen = (uint8_t *)tpk__al_malloc(al, TPK__TOK_CACHE),
    c->nid = (uint8_t *)tpk__al_malloc(al, TPK__TOK_CACHE);
    c->keys = (uint8_t *)tpk__al_malloc(al, TPK__TOK_CACHE_BYTES),
    c->ids = (int32_t *)tpk__al_malloc(al, TPK__TOK_CACHE_BYTES);
    if (!c->hash || !c->koff || !c->ioff || !c->klen || !c->nid || !c->keys || !c->ids)
        return tpk__tok_bad(L, TPK_ERR_NOMEM, "out of memory for the word cache");
    return TPK_OK;
}
static inline void tpk__tok_bytes_map(tpk_tokenizer *t) { /* GPT-2's bytes_to_unicode */
    int extra = 0;
    for (int b = 0; b < 256; b++)
        t->byte_cp[b] = (uint16_t)(((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
                                       ? b
                                       : 256 + extra++);
}

/* A member's type name, for messages ("null" when absent). */
static inline const char *tpk__tok_type(const tpk__json *v) {
    const tpk__json *ty = tpk__json_get(v, "type");
    return !v || v->type == TPK__JNULL ? "null" : ty && ty->type == TPK__JSTR ? ty->str : "?";
}
static inline bool tpk__tok_flag(const tpk__json *v, const char *key, bool dflt) {
    const tpk__json *f = tpk__json_get(v, key);
    return f && f->type == TPK__JBOOL ? f->num != 0 : dflt;
}
/* normalizer: null, NFC, or a Sequence of those. */
static inline tpk_status tpk__tok_normalizer(tpk__tok_load *L, const tpk__json *v, int depth) {
    const char *ty = tpk__tok_type(v);
    if (!strcmp(ty, "null")) return TPK_OK;
    if (!strcmp(ty, "NFC")) return L->t->nfc = true, TPK_OK;
    const tpk__json *seq = tpk__json_get(v, "normalizers");
    if (!strcmp(ty, "Sequence") && seq && seq->type == TPK__JARR && depth < 4) {
        for (size_t i = 0; i < seq->len; i++)
            TPK_TRY(tpk__tok_normalizer(L, &seq->kids[i], depth + 1));
        return TPK_OK;
    }
    char m[160];
    snprintf(m, sizeof m, "normalizer %.40s: not supported (expected null or NFC)", ty);
    return tpk__tok_bad(L, TPK_ERR_UNSUPPORTED, m);
}
/* pre_tokenizer: ByteLevel, or a Sequence holding exactly one ByteLevel. */
static inline tpk_status tpk__tok_pre(tpk__tok_load *L, const tpk__json *v, int *seen, int depth) {
    const char *ty = tpk__tok_type(v);
    const tpk__json *seq = tpk__json_get(v, "pretokenizers");
    if (!strcmp(ty, "ByteLevel")) {
        L->t->add_prefix_space = tpk__tok_flag(v, "add_prefix_space", true);
        L->t->use_regex = tpk__tok_flag(v, "use_regex", true);
        ++*seen;
        return TPK_OK;
    }
    if (!strcmp(ty, "Sequence") && seq && seq->type == TPK__JARR && depth < 4) {
        for (size_t i = 0; i < seq->len; i++)
            TPK_TRY(tpk__tok_pre(L, &seq->kids[i], seen, depth + 1));
        return TPK_OK;
    }
    char m[160];
    snprintf(m, sizeof m, "pre_tokenizer %.40s: not supported (expected ByteLevel)", ty);
    return tpk__tok_bad(L, TPK_ERR_UNSUPPORTED, m);
}
/* The parts of tokenizer.json (root) into L->t. */
static inline tpk_status tpk__tok_from_json(tpk__tok_load *L, const tpk__json *root) {
    tpk_tokenizer *t = L->t;
    char m[200];
    if (root->type != TPK__JOBJ) return tpk__tok_bad(L, TPK_ERR_FORMAT, "expected a JSON object");
    const tpk__json *model = tpk__json_get(root, "model"), *vocab = tpk__json_get(model, "vocab"),
                    *merges = tpk__json_get(model, "merges"),
                    *added = tpk__json_get(root, "added_tokens");
    if (!model || model->type != TPK__JOBJ)
        return tpk__tok_bad(L, TPK_ERR_FORMAT, "no \"model\" object");
    const char *mty = tpk__tok_type(model);
    if (strcmp(mty, "BPE") && strcmp(mty, "?")) {
        snprintf(m, sizeof m, "model %.40s: not supported (expected BPE)", mty);
        return tpk__tok_bad(L, TPK_ERR_UNSUPPORTED, m);
    }
    static const char *const nulls[4] = {"dropout", "unk_token", "continuing_subword_prefix",
                                         "end_of_word_suffix"};
    for (int i = 0; i < 4; i++) {
        const tpk__json *f = tpk__json_get(model, nulls[i]);
        if (f && f->type != TPK__JNULL && !(f->type == TPK__JSTR && !f->len)) {
            snprintf(m, sizeof m, "model.%s: not supported in a byte-level BPE (expected null)",
                     nulls[i]);
            return tpk__tok_bad(L, TPK_ERR_UNSUPPORTED, m);
        }
    }
    if (tpk__tok_flag(model, "byte_fallback", false))
        return tpk__tok_bad(L, TPK_ERR_UNSUPPORTED,
                            "model.byte_fallback: not supported (expected false)");
    t->ignore_merges = tpk__tok_flag(model, "ignore_merges", false);
    if (!vocab || vocab->type != TPK__JOBJ)
        return tpk__tok_bad(L, TPK_ERR_FORMAT, "no \"model.vocab\" object");
    if (!merges || merges->type != TPK__JARR)
        return tpk__tok_bad(L, TPK_ERR_FORMAT, "no \"model.merges\" list");
    TPK_TRY(tpk__tok_normalizer(L, tpk__json_get(root, "normalizer"), 0));
    int seen = 0;
    TPK_TRY(tpk__tok_pre(L, tpk__json_get(root, "pre_tokenizer"), &seen, 0));
    if (seen != 1)
        return tpk__tok_bad(L, TPK_ERR_UNSUPPORTED, "pre_tokenizer: expected one ByteLevel");
    const char *dty = tpk__tok_type(tpk__json_get(root, "decoder"));
    if (strcmp(dty, "ByteLevel") && strcmp(dty, "null")) {
        snprintf(m, sizeof m, "decoder %.40s: not supported (expected ByteLevel)", dty);
        return tpk__tok_bad(L, TPK_ERR_UNSUPPORTED, m);
    }
    /* added tokens */
    if (added && added->type != TPK__JARR && added->type != TPK__JNULL)
        return tpk__tok_bad(L, TPK_ERR_FORMAT, "\"added_tokens\": expected a list");
    size_t na = added && added->type == TPK__JARR ? added->len : 0;
    if (na > 60000) return tpk__tok_bad(L, TPK_ERR_UNSUPPORTED, "more than 60000 added tokens");
    t->added = (tpk__tok_added *)tpk__al_calloc(&t->al, na + 1, sizeof *t->added);
    if (!t->added) return tpk__tok_bad(L, TPK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < na; i++) {
        const tpk__json *a = &added->kids[i], *c = tpk__json_get(a, "content"),
                        *id = tpk__json_get(a, "id");
        int64_t idv = 0;
        if (!c || c->type != TPK__JSTR || !c->len || !tpk__json_int(id, 0, (1 << 30) - 1, &idv)) {
            snprintf(m, sizeof m,
                     "added_tokens[%zu]: expected a non-empty \"content\" and an id 0..2^30-1", i);
            return tpk__tok_bad(L, TPK_ERR_FORMAT, m);
        }
        tpk__tok_added *d = &t->added[t->nadded];
        d->normalized = tpk__tok_flag(a, "normalized", true),
        d->special = tpk__tok_flag(a, "special", false);
        d->lstrip = tpk__tok_flag(a, "lstrip", false),
        d->rstrip = tpk__tok_flag(a, "rstrip", false);
        d->single_word = tpk__tok_flag(a, "single_word", false), d->id = (int32_t)idv;
        if (!(d->content = (char *)tpk__al_malloc(&t->al, c->len + 1)))
            return tpk__tok_bad(L, TPK_ERR_NOMEM, "out of memory");
        memcpy(d->content, c->str, c->len + 1), d->len = c->len;
        t->nadded++;
        if (d->normalized && t->nfc) { /* matched against normalized text: normalized itself */
            uint8_t *z;
            size_t zn;
            TPK_TRY(tpk__nfc(L->ctx, (const uint8_t *)d->content, d->len, &z, &zn));
            char *z1 = (char *)tpk__al_malloc(&t->al, zn + 1);
            if (z1) memcpy(z1, z, zn), z1[zn] = 0;
            tpk__free(L->ctx, z);
            if (!z1) return tpk__tok_bad(L, TPK_ERR_NOMEM, "out of memory");
            tpk__al_free(&t->al, d->content), d->content = z1, d->len = zn;
        }
    }
    TPK_TRY(tpk__tok_vocab_json(L, vocab, "model.vocab"));
    TPK_TRY(tpk__tok_merges0(L, merges->len));
    for (size_t i = 0; i < merges->len; i++) {
        const tpk__json *e = &merges->kids[i];
        size_t sp;
        if (e->type == TPK__JSTR && tpk__tok_merge_split(e->str, e->len, &sp))
            TPK_TRY(tpk__tok_merge_add(L, i, e->str, sp, e->str + sp + 1, e->len - sp - 1));
        else if (e->type == TPK__JARR && e->len == 2 && e->kids[0].type == TPK__JSTR &&
                 e->kids[1].type == TPK__JSTR)
            TPK_TRY(tpk__tok_merge_add(L, i, e->kids[0].str, e->kids[0].len, e->kids[1].str,
                                       e->kids[1].len));
        else {
            snprintf(m, sizeof m, "merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", i);
            return tpk__tok_bad(L, TPK_ERR_FORMAT, m);
        }
    }
    return tpk__tok_finish(L);
}
/* GPT-2's two files: vocab.json ({"token": id}) and merges.txt ("#version" line, then "a b"). */
static inline tpk_status tpk__tok_from_files(tpk__tok_load *L, const char *vpath,
                                             const char *mpath) {
    tpk_tokenizer *t = L->t;
    uint8_t *b = NULL, *mb = NULL;
    size_t n = 0, mn = 0;
    char *arena = NULL;
    tpk__json root;
    memset(&root, 0, sizeof root);
    L->file = vpath;
    const tpk_allocator *al = &L->ctx->allocator;
    tpk_status st = tpk__read_file_al(L->ctx, al, "tpk_tokenizer_load", vpath, &b, &n);
    if (st == TPK_OK) st = tpk__json_parse(L->ctx, vpath, (const char *)b, n, &root, &arena);
    if (st == TPK_OK && root.type != TPK__JOBJ)
        st = tpk__tok_bad(L, TPK_ERR_FORMAT, "expected a JSON object {\"token\": id, ...}");
    t->add_prefix_space = false, t->use_regex = true;
    if (st == TPK_OK) st = tpk__tok_vocab_json(L, &root, "vocabulary");
    int32_t eot = st == TPK_OK ? tpk__tok_find(t, "<|endoftext|>", 13) : -1;
    if (eot >= 0) { /* GPT-2's one special token */
        t->added = (tpk__tok_added *)tpk__al_calloc(&t->al, 1, sizeof *t->added);
        char *c = (char *)tpk__al_malloc(&t->al, 14);
        if (!t->added || !c) st = tpk__tok_bad(L, TPK_ERR_NOMEM, "out of memory");
        else {
            memcpy(c, "<|endoftext|>", 14);
            t->added[0].content = c, t->added[0].len = 13, t->added[0].id = eot;
            t->added[0].special = true, t->nadded = 1, t->special[eot] = 1;
        }
    }
    L->file = mpath;
    if (st == TPK_OK) st = tpk__read_file_al(L->ctx, al, "tpk_tokenizer_load", mpath, &mb, &mn);
    size_t lines = 0;
    for (size_t i = 0; st == TPK_OK && i < mn; i++) lines += mb[i] == '\n';
    if (st == TPK_OK) st = tpk__tok_merges0(L, lines + 1);
    for (size_t p = 0, line = 1, rank = 0; st == TPK_OK && p < mn; line++) {
        const uint8_t *e = (const uint8_t *)memchr(mb + p, '\n', mn - p);
        size_t q = e ? (size_t)(e - mb) : mn, k = q - p, sp;
        if (k && mb[p + k - 1] == '\r') k--;
        const char *s = (const char *)mb + p;
        p = q + 1;
        if (!k || (line == 1 && k >= 8 && !memcmp(s, "#version", 8))) continue;
        if (!tpk__tok_merge_split(s, k, &sp)) {
            char m[160];
            snprintf(m, sizeof m, "line %zu: expected \"a b\" (two tokens, one space)", line);
            st = tpk__tok_bad(L, TPK_ERR_FORMAT, m);
        } else st = tpk__tok_merge_add(L, rank++, s, sp, s + sp + 1, k - sp - 1);
    }
    if (st == TPK_OK) st = tpk__tok_finish(L);
    tpk__json_free(&root, &arena);
    tpk__al_free(al, b), tpk__al_free(al, mb);
    return st;
}

/* tokenizer.json's text (s[0..n), from `file`) parsed into L->t. */
static inline tpk_status tpk__tok_json_text(tpk__tok_load *L, const char *file, const char *s,
                                            size_t n) {
    char *arena = NULL;
    tpk__json root;
    L->file = file;
    tpk_status st = tpk__json_parse(L->ctx, file, s, n, &root, &arena);
    if (st == TPK_OK) st = tpk__tok_from_json(L, &root);
    tpk__json_free(&root, &arena);
    return st;
}

/* A tokenizer from path: a tokenizer.json file, or a folder holding tokenizer.json, or GPT-2's
 * vocab.json and merges.txt. *out: free with tpk_tokenizer_free. */
static inline tpk_status tpk_tokenizer_load(tpk_ctx *ctx, const char *path, tpk_tokenizer **out) {
    static const char *fn = "tpk_tokenizer_load";
    if (!ctx) return TPK_ERR_ARG;
    if (!path || !out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", path ? "out" : "path");
    *out = NULL;
    size_t pn = strlen(path);
    char *j = (char *)tpk__malloc(ctx, pn + 32), *v = (char *)tpk__malloc(ctx, pn + 32),
         *mg = (char *)tpk__malloc(ctx, pn + 32);
    tpk_tokenizer *t = (tpk_tokenizer *)tpk__calloc(ctx, 1, sizeof *t);
    if (!j || !v || !mg || !t) {
        tpk__free(ctx, j), tpk__free(ctx, v), tpk__free(ctx, mg), tpk__free(ctx, t);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "a tokenizer");
    }
    t->al = ctx->allocator;
    tpk__tok_bytes_map(t);
    tpk__tok_load L = {ctx, path, t};
    snprintf(j, pn + 32, "%s/tokenizer.json", path), snprintf(v, pn + 32, "%s/vocab.json", path);
    snprintf(mg, pn + 32, "%s/merges.txt", path);
    FILE *f = fopen(path, "rb"), *fj = fopen(j, "rb"), *fv = fopen(v, "rb"), *fm = fopen(mg, "rb");
    char c1;
    bool dir = f && fread(&c1, 1, 1, f) == 0 && ferror(f); /* a folder opens, then fails to read */
    if (f) fclose(f);
    if (fj) fclose(fj);
    if (fv) fclose(fv);
    if (fm) fclose(fm);
    tpk_status st;
    if (!f) st = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot open: %s", path, strerror(errno));
    else if (dir && !fj && !(fv && fm))
        st = tpk__fail(ctx, TPK_ERR_IO, fn,
                       "%s: no tokenizer.json, and no vocab.json with merges.txt, in this folder",
                       path);
    else if (dir && !fj) st = tpk__tok_from_files(&L, v, mg);
    else {
        const char *file = dir ? j : path;
        uint8_t *b = NULL;
        size_t n = 0;
        st = tpk__read_file_al(ctx, &ctx->allocator, fn, file, &b, &n);
        if (st == TPK_OK) st = tpk__tok_json_text(&L, file, (const char *)b, n);
        tpk__free(ctx, b);
    }
    tpk__free(ctx, j), tpk__free(ctx, v), tpk__free(ctx, mg);
    if (st != TPK_OK) return tpk_tokenizer_free(t), st;
    *out = t;
    return TPK_OK;
}

/* A tokenizer from a tokenizer.json held in memory (json[0..n), named `name` in errors). *out: free
 * with tpk_tokenizer_free. */
static inline tpk_status tpk_tokenizer_parse(tpk_ctx *ctx, const char *json, size_t n,
                                             const char *name, tpk_tokenizer **out) {
    if (!ctx) return TPK_ERR_ARG;
    if (!out || !name || (!json && n))
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_tokenizer_parse", "%s: NULL",
                         !out    ? "out"
                         : !name ? "name"
                                 : "json");
    *out = NULL;
    tpk_tokenizer *t = (tpk_tokenizer *)tpk__calloc(ctx, 1, sizeof *t);
    if (!t) return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_tokenizer_parse", "a tokenizer");
    t->al = ctx->allocator;
    tpk__tok_bytes_map(t);
    tpk__tok_load L = {ctx, name, t};
    tpk_status st = tpk__tok_json_text(&L, name, json ? json : "", n);
    if (st != TPK_OK) return tpk_tokenizer_free(t), st;
    *out = t;
    return TPK_OK;
}

#endif /* TPK_TEXT_TOKENIZER_H */
