/* tests/unicode_check.c — tpk/text/unicode.h as a filter, for tests/unicode.sh to compare against
 * Python's unicodedata and codecs (also valid C++17: the script compiles it with g++ too):
 *   unicode_check classes          every code point's class | \w << 2 as runs "START END CLASS"
 *                                  (hex)
 *   unicode_check nfc              each line of stdin (UTF-8) -> its NFC, one line each
 *   unicode_check decode           each line of stdin (hex bytes) -> the code points
 *                                  tpk__utf8_decode reads from them (hex, space-separated)
 *   unicode_check roundtrip FILE   every scalar value encoded into FILE (in order); prints
 *                                  "ok"/"FAIL" for decode(encode(cp)) == cp, the lengths, and
 *                                  U+FFFD for the non-scalars
 *   unicode_check speed            MB/s of the class lookup and of NFC on a few texts */
#include <stdio.h>
#include <time.h>

#include <tpk/text/unicode.h>

/* a line of stdin into *buf (grown; without its '\n'); -1 at the end */
static long read_line(uint8_t **buf, size_t *cap) {
    size_t n = 0;
    int c;
    while ((c = getchar()) != EOF && c != '\n') {
        if (n + 1 >= *cap) {
            *cap = 2 * *cap + 64;
            *buf = (uint8_t *)realloc(*buf, *cap);
            if (!*buf) exit(3);
        }
        (*buf)[n++] = (uint8_t)c;
    }
    return c == EOF && n == 0 ? -1 : (long)n;
}

static int classes(void) {
    uint32_t start = 0;
    int cur = tpk__uc_class(0) | tpk__uc_word(0) << 2;
    for (uint32_t cp = 1; cp <= 0x110000; cp++) {
        int c = cp < 0x110000 ? tpk__uc_class(cp) | tpk__uc_word(cp) << 2 : -1;
        if (c != cur) printf("%X %X %d\n", start, cp - 1, cur), start = cp, cur = c;
    }
    return 0;
}

static int nfc(void) {
    tpk_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    uint8_t *line = NULL, *out;
    size_t cap = 0, m;
    long n;
    while ((n = read_line(&line, &cap)) >= 0) {
        uint8_t *s = (uint8_t *)malloc(n ? (size_t)n : 1); /* exactly n bytes: ASan sees overruns */
        if (!s) return 3;
        memcpy(s, line, (size_t)n);
        if (tpk__nfc(&ctx, s, (size_t)n, &out, &m) != TPK_OK) return fprintf(stderr, "nomem\n"), 1;
        fwrite(out, 1, m, stdout), putchar('\n');
        free(out), free(s);
    }
    free(line);
    return 0;
}

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

static int decode(void) {
    uint8_t *line = NULL;
    size_t cap = 0;
    long n;
    while ((n = read_line(&line, &cap)) >= 0) {
        size_t len = (size_t)n / 2;
        uint8_t *s = (uint8_t *)malloc(len ? len : 1); /* exactly len bytes */
        if (!s) return 3;
        for (size_t i = 0; i < len; i++)
            s[i] = (uint8_t)(hexval(line[2 * i]) << 4 | hexval(line[2 * i + 1]));
        for (size_t p = 0; p < len;) {
            uint32_t cp;
            size_t k = tpk__utf8_decode(s + p, len - p, &cp);
            if (k < 1 || k > 4 || k > len - p) return fprintf(stderr, "bad length %zu\n", k), 1;
            printf(p ? " %X" : "%X", cp);
            p += k;
        }
        putchar('\n');
        free(s);
    }
    free(line);
    return 0;
}

static int roundtrip(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return perror(path), 1;
    long bad = 0, count = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp < 0xE000) continue;
        uint8_t b[4];
        size_t k = tpk__utf8_encode(cp, b), want = cp < 0x80      ? 1
                                                   : cp < 0x800   ? 2
                                                   : cp < 0x10000 ? 3
                                                                  : 4;
        uint32_t back = 0;
        size_t j = tpk__utf8_decode(b, k, &back);
        if (k != want || j != k || back != cp) {
            if (bad++ < 5) printf("    U+%04X: %zu bytes, decoded U+%04X in %zu\n", cp, k, back, j);
        }
        fwrite(b, 1, k, f), count++;
    }
    fclose(f);
    if (bad) printf("FAIL utf8_roundtrip (%ld of %ld scalar values)\n", bad, count);
    else printf("ok utf8_roundtrip (%ld scalar values)\n", count);
    long nonscalar = 0; /* surrogates and values past U+10FFFF are written as U+FFFD */
    uint32_t odd[] = {0xD800, 0xDBFF, 0xDC00, 0xDFFF, 0x110000, 0x1FFFFF, 0xFFFFFFFF};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        uint8_t b[4];
        size_t k = tpk__utf8_encode(odd[i], b);
        if (k != 3 || b[0] != 0xEF || b[1] != 0xBF || b[2] != 0xBD) nonscalar++;
    }
    printf("%s utf8_encode_nonscalar\n", nonscalar ? "FAIL" : "ok");
    return 0;
}

static double now(void) {
    struct timespec t;
    timespec_get(&t, TIME_UTC);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* MB/s of decode + class over a text of the given characters, and of tpk__nfc over it */
static void speed_of(const char *name, const uint32_t *chars, size_t nc) {
    size_t n = 4u << 20, len = 0;
    uint8_t *s = (uint8_t *)malloc(n + 4), *out;
    uint64_t x = 88172645463325252ull;
    while (len < n) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        len += tpk__utf8_encode(chars[x % nc], s + len);
    }
    double t0 = now();
    long sum = 0;
    for (size_t p = 0; p < len;) {
        uint32_t cp;
        p += tpk__utf8_decode(s + p, len - p, &cp);
        sum += tpk__uc_class(cp);
    }
    double t1 = now();
    tpk_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    size_t m;
    if (tpk__nfc(&ctx, s, len, &out, &m) != TPK_OK) exit(1);
    double t2 = now();
    printf("speed: %-28s decode+class %7.1f MB/s   nfc %7.1f MB/s   (%ld)\n", name,
           (double)len / 1e6 / (t1 - t0), (double)len / 1e6 / (t2 - t1), sum % 10);
    free(out), free(s);
}

static int speed(void) {
    uint32_t latin[] = {'a', 'b', 'e', ' ', 0xE9, 0xFC, 0x11B, 0x161, '1', '.'};
    uint32_t cjk[] = {0x4E2D, 0x6587, 0x3002, 0x7684, 0x662F, 0x3001, 0x5B57, 0x306E};
    uint32_t hangul[] = {0xD55C, 0xAD6D, 0xC5B4, ' ', 0xBB38, 0xC790};
    uint32_t cyr[] = {0x43F, 0x440, 0x438, 0x432, 0x435, 0x442, ' '};
    uint32_t deva[] = {0x915, 0x93F, 0x928, 0x94D, 0x926, 0x940, ' ', 0x93C, 0x930};
    uint32_t marks[] = {'a', 0x301, 0x323, 0x300, 'o', 0x308, 0x1100, 0x1161, 0x11A8};
    speed_of("latin (below U+0300)", latin, 10);
    speed_of("cyrillic", cyr, 7);
    speed_of("cjk", cjk, 8);
    speed_of("hangul", hangul, 6);
    speed_of("devanagari (nukta)", deva, 9);
    speed_of("decomposed (marks, jamo)", marks, 9);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "classes")) return classes();
    if (!strcmp(mode, "nfc")) return nfc();
    if (!strcmp(mode, "decode")) return decode();
    if (!strcmp(mode, "roundtrip") && argc > 2) return roundtrip(argv[2]);
    if (!strcmp(mode, "speed")) return speed();
    fprintf(stderr, "usage: unicode_check classes | nfc | decode | roundtrip FILE | speed\n");
    return 2;
}
