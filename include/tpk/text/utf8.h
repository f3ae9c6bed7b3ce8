/* tpk/text/utf8.h — the kit's one UTF-8 decoder, its encoder, and the checks built on them.
 *
 * tpk__utf8_next decodes one character (Unicode §3.9, Table 3-7: shortest form, no surrogates
 * D800..DFFF, nothing above U+10FFFF) and reports an ill-formed sequence by its maximal subpart.
 * Everything else is that function seen two ways:
 *   lossy   tpk__utf8_decode: an ill-formed subpart becomes U+FFFD, as Rust's from_utf8_lossy and
 *           Python's decode("utf-8", "replace") make it (the tokenizer's input and output);
 *   strict  tpk__utf8_invalid: the offset of the first ill-formed subpart (the JSON reader's
 *           strings, safetensors names and metadata: invalid UTF-8 is an error there).
 * Host code, on <stddef.h> and <stdint.h> alone. */
#ifndef TPK_TEXT_UTF8_H
#define TPK_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

#define TPK__UTF8_BAD 0xFFFFFFFFu /* tpk__utf8_next's code point for an ill-formed sequence */

/* Decodes the character at s (n >= 1 bytes available) into *cp; returns the bytes it took (1-4).
 * An ill-formed sequence gives *cp = TPK__UTF8_BAD and takes its maximal subpart: a byte that
 * cannot start a character (80..C1, F5..FF) alone; else the lead byte and the following bytes as
 * long as they continue a well-formed sequence (E0 needs A0..BF next: no overlongs; ED 80..9F: no
 * surrogates; F0 90..BF; F4 80..8F: nothing above U+10FFFF), the first that does not is left for
 * the next call. Never reads s[n] or beyond. */
static inline size_t tpk__utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    uint32_t c = s[0], lo = 0x80, hi = 0xBF; /* the range of the second byte */
    size_t len;
    if (c < 0x80) return *cp = c, 1;
    if (c < 0xC2 || c > 0xF4) return *cp = TPK__UTF8_BAD, 1;
    if (c < 0xE0) len = 2, c &= 0x1F;
    else if (c < 0xF0) {
        len = 3, c &= 0x0F;
        if (c == 0x0) lo = 0xA0;
        if (c == 0xD) hi = 0x9F;
    } else {
        len = 4, c &= 0x07;
        if (c == 0) lo = 0x90;
        if (c == 4) hi = 0x8F;
    }
    if (n < 2 || s[1] < lo || s[1] > hi) return *cp = TPK__UTF8_BAD, 1;
    c = c << 6 | (s[1] & 0x3Fu);
    for (size_t i = 2; i < len; i++) {
        if (i >= n || (s[i] & 0xC0) != 0x80) return *cp = TPK__UTF8_BAD, i;
        c = c << 6 | (s[i] & 0x3Fu);
    }
    return *cp = c, len;
}

/* tpk__utf8_next with an ill-formed subpart read as U+FFFD (lossy). */
static inline size_t tpk__utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    size_t k = tpk__utf8_next(s, n, cp);
    if (*cp == TPK__UTF8_BAD) *cp = 0xFFFD;
    return k;
}

/* The offset of the first ill-formed sequence in s[0..n), n when s is valid UTF-8 (strict). */
static inline size_t tpk__utf8_invalid(const uint8_t *s, size_t n) {
    size_t p = 0;
    uint32_t cp;
    while (p < n) {
        if (s[p] < 0x80) {
            p++;
            continue;
        }
        size_t k = tpk__utf8_next(s + p, n - p, &cp);
        if (cp == TPK__UTF8_BAD) return p;
        p += k;
    }
    return n;
}

/* The start of the character holding byte i of s: i moved back over continuation bytes, not below
 * lo. */
static inline size_t tpk__utf8_back(const uint8_t *s, size_t i, size_t lo) {
    while (i > lo && (s[i] & 0xC0) == 0x80) i--;
    return i;
}

/* Writes code point cp as UTF-8 into out; returns the bytes written (1-4). A value that is not a
 * scalar value (a surrogate D800..DFFF, above U+10FFFF) is written as U+FFFD. */
static inline size_t tpk__utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) return out[0] = (uint8_t)cp, 1;
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6), out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) cp = 0xFFFD;
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12), out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18), out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

#endif /* TPK_TEXT_UTF8_H */
