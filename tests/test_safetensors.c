/* tests/test_safetensors.c — the safetensors reader and writer (tpk/train/safetensors.h).
 *
 * Every rank runs every case on its own files under build/tests/st_r<rank>/:
 *   - round trip of F32, BF16, I32, U8 tensors (0-d and empty ones included) and metadata;
 *   - a file built byte by byte to the format (escapes, surrogate pairs, F16 values);
 *   - hostile headers, each rejected with TPK_ERR_FORMAT and a message naming the problem;
 *     strict JSON (tpk/text/json.h's reader): a tensor name or metadata key twice named at the
 *     repeat's file offset with the first's, invalid UTF-8, offsets past 2^64 - 1 (2^64 - 1 read
 *     exactly), a number out of range, nesting where a number belongs, file offsets in messages;
 *     every truncation and every single-byte corruption of a valid file is survived;
 *   - the atomic writer: failures (missing directory, a write past a file-size limit, a
 *     directory in the way) leave no temporary and the old file intact; bad arguments;
 *   - the fuzz corpus (tests/fuzz/corpus) through the fuzz target's checks. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "test.h"
#include <tpk/train/safetensors.h>
#define TPK_FUZZ_NO_MAIN
#include "fuzz/fuzz_safetensors.c"

static char dir[128];

/* dir/name into buf */
static const char *path_of(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", dir, name);
    return buf;
}
/* A whole file into a malloc'd buffer (NULL if absent). */
static uint8_t *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = (uint8_t *)malloc(sz > 0 ? (size_t)sz : 1);
    *n = fread(b, 1, (size_t)sz, fp);
    fclose(fp);
    return b;
}
static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
/* The temporary tpk_st_write would use for path. */
static const char *tmp_of(char *buf, size_t n, const char *path) {
    snprintf(buf, n, "%s.tmp.%ld", path, (long)getpid());
    return buf;
}

/* A file: the 8-byte length of `header` (as given, no padding) + header + `ndata` bytes
 * 0..ndata-1. */
static uint8_t *mkfile(const char *header, size_t ndata, size_t *size) {
    size_t h = strlen(header);
    *size = 8 + h + ndata;
    uint8_t *b = (uint8_t *)malloc(*size);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < ndata; i++) b[8 + h + i] = (uint8_t)i;
    return b;
}

typedef struct hostile {
    const char *header;
    size_t ndata;
    const char *needle;
} hostile;

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    tpk_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    char p[256], q[256];
    snprintf(dir, sizeof dir, "build/tests/st_r%d", test__rank);
    mkdir("build", 0755), mkdir("build/tests", 0755), mkdir(dir, 0755);

    TEST_CASE("safetensors round trip: F32, BF16, I32, U8, 0-d, empty, metadata") {
        float w[6] = {1.5f, -2.25f, 3e-8f, 1e30f, -0.0f, 7.0f};
        uint16_t bf[4];
        float bfv[4] = {1.0f, -3.5f, 0.15625f, 65280.0f};
        for (int i = 0; i < 4; i++) bf[i] = tpk_f32_to_bf16(bfv[i]);
        int32_t ids[3] = {-7, 0, 2147483647}, scalar = 42;
        uint8_t u8[5] = {0, 1, 128, 254, 255};
        int64_t sw[2] = {2, 3}, sbf[2] = {2, 2}, sid[1] = {3}, su8[1] = {5}, sempty[3] = {4, 0, 2};
        tpk_st_entry e[] = {
            {"h.0.attn.c_attn.weight", TPK_ST_F32, 2, sw, w},
            {"h.0.ln_1.bias", TPK_ST_BF16, 2, sbf, bf},
            {"ids", TPK_ST_I32, 1, sid, ids},
            {"step", TPK_ST_I32, 0, NULL, &scalar},
            {"empty", TPK_ST_F32, 3, sempty, NULL},
            {"bytes \"quoted\" \\ \t é", TPK_ST_U8, 1, su8, u8},
        };
        const char *meta[] = {"format", "pt", "note", "line\nbreak \"q\" ü", NULL};
        path_of(p, sizeof p, "rt.safetensors");
        CHECK_OK(&ctx, tpk_st_write(&ctx, p, e, 6, meta));
        CHECK(!exists(tmp_of(q, sizeof q, p)), "temporary %s left behind", q);
        size_t size;
        uint8_t *raw = slurp(p, &size);
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
        CHECK(hlen % 8 == 0 && size == 8 + hlen + 24 + 8 + 12 + 4 + 0 + 5,
              "header %llu bytes, file %zu", (unsigned long long)hlen, size);
        free(raw);

        tpk_st_file f;
        CHECK_OK(&ctx, tpk_st_read(&ctx, p, &f));
        CHECK(f.n == 6 && f.n_meta == 2 && f.data_size == 24 + 8 + 12 + 4 + 5,
              "n %d meta %d data %llu", f.n, f.n_meta, (unsigned long long)f.data_size);
        uint64_t off = 0;
        for (int i = 0; i < f.n && i < 6; i++) {
            const tpk_st_tensor *t = &f.tensors[i];
            CHECK(!strcmp(t->name, e[i].name) && t->dtype == e[i].dtype && t->ndim == e[i].ndim,
                  "tensor %d: %s", i, t->name);
            for (int d = 0; d < t->ndim; d++)
                CHECK(t->shape[d] == e[i].shape[d], "tensor %d dim %d", i, d);
            uint64_t bytes = (uint64_t)tpk_st_numel(t) * tpk_st_dtype_size(t->dtype);
            CHECK(t->begin == off && t->end == off + bytes, "tensor %d at [%llu, %llu)", i,
                  (unsigned long long)t->begin, (unsigned long long)t->end);
            if (bytes)
                CHECK(!memcmp(f.data + t->begin, e[i].data, bytes), "tensor %d bytes differ", i);
            CHECK(tpk_st_find(&f, e[i].name) == t, "find %s", e[i].name);
            off += bytes;
        }
        CHECK(tpk_st_find(&f, "missing") == NULL, "found a missing tensor");
        CHECK(tpk_st_meta(&f, "format") && !strcmp(tpk_st_meta(&f, "format"), "pt"), "meta format");
        CHECK(tpk_st_meta(&f, "note") && !strcmp(tpk_st_meta(&f, "note"), meta[3]), "meta note");
        CHECK(tpk_st_meta(&f, "absent") == NULL, "meta absent");

        float got[6];
        CHECK_OK(&ctx, tpk_st_get_f32(&ctx, &f, tpk_st_find(&f, e[0].name), got, 6));
        CHECK(!memcmp(got, w, sizeof w), "F32 values differ");
        CHECK_OK(&ctx, tpk_st_get_f32(&ctx, &f, tpk_st_find(&f, e[1].name), got, 4));
        CHECK(!memcmp(got, bfv, sizeof bfv), "BF16 values differ");
        CHECK_OK(&ctx, tpk_st_get_f32(&ctx, &f, tpk_st_find(&f, "empty"), got, 0));
        CHECK_FAILS(&ctx, tpk_st_get_f32(&ctx, &f, tpk_st_find(&f, "ids"), got, 3), TPK_ERR_DTYPE,
                    "dtype I32");
        CHECK_FAILS(&ctx, tpk_st_get_f32(&ctx, &f, tpk_st_find(&f, e[0].name), got, 5),
                    TPK_ERR_SHAPE, "has 6 elements (shape [2, 3]), n is 5");
        tpk_st_close(&f);
        CHECK(f.tensors == NULL && f.owned == NULL, "close did not reset");
        tpk_st_close(&f); /* twice is harmless */

        /* no tensors, no metadata; and overwriting an existing file */
        CHECK_OK(&ctx, tpk_st_write(&ctx, p, NULL, 0, NULL));
        CHECK_OK(&ctx, tpk_st_read(&ctx, p, &f));
        CHECK(f.n == 0 && f.n_meta == 0 && f.data_size == 0, "empty file: n %d", f.n);
        tpk_st_close(&f);
    }

    TEST_CASE("safetensors fixed file built byte by byte") {
        /* name "aé😀" written with escapes; F16 1, -2, 2^-24 (subnormal), inf; BF16 -1.5;
         * metadata */
        const char *h =
            " {\"__metadata__\": {\"k\\u00fc\": \"v\\/\"},\n"
            "  \"a\\u00e9\\ud83d\\ude00\": {\"shape\": [2, 2], \"dtype\": \"F16\", "
            "\"data_offsets\": [0, 8]},\n"
            "  \"b\": {\"data_offsets\": [8, 10], \"dtype\": \"BF16\", \"shape\": []}}\t\r\n ";
        size_t size;
        uint8_t *b = mkfile(h, 10, &size);
        const uint8_t data[10] = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0x00, 0x7c, 0xc0, 0xbf};
        memcpy(b + size - 10, data, 10);
        tpk_st_file f;
        CHECK_OK(&ctx, tpk_st_parse(&ctx, b, size, "fixed", &f));
        CHECK(f.n == 2 && f.data == b + size - 10, "n %d, data not referenced in place", f.n);
        const tpk_st_tensor *a = tpk_st_find(&f, "a\xc3\xa9\xf0\x9f\x98\x80");
        CHECK(a && a->dtype == TPK_ST_F16 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 2,
              "escaped name not decoded");
        CHECK(tpk_st_meta(&f, "k\xc3\xbc") && !strcmp(tpk_st_meta(&f, "k\xc3\xbc"), "v/"),
              "metadata not decoded");
        float got[4], one;
        if (a) {
            CHECK_OK(&ctx, tpk_st_get_f32(&ctx, &f, a, got, 4));
            CHECK(got[0] == 1.0f && got[1] == -2.0f && got[2] == 5.9604644775390625e-8f &&
                      isinf(got[3]) && got[3] > 0,
                  "F16: %g %g %g %g", got[0], got[1], got[2], got[3]);
        }
        CHECK_OK(&ctx, tpk_st_get_f32(&ctx, &f, tpk_st_find(&f, "b"), &one, 1));
        CHECK(one == -1.5f, "BF16 0-d: %g", one);
        tpk_st_close(&f);
        free(b);
    }

    TEST_CASE("safetensors hostile files are rejected with a message naming the problem") {
        static const hostile cases[] = {
            {"", 0, "header is empty"},
            {"[]", 0, "not a JSON object"},
            {"{\"a\":", 0, "tensor \"a\": expected an object"}, /* cut off */
            {"{\"a\" 1}", 0, "expected ':'"},
            {"{} x", 0, "unexpected bytes after the JSON object"},
            {"{}}", 0, "unexpected bytes after"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},}", 1,
             "expected a string"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
             2, "\"a\" appears twice"},
            {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
             "unknown dtype \"F33\""},
            {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
             "shape[0]: -1 is negative"},
            {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
             "fraction or exponent"},
            {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4,
             "leading zero"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
             "more than 8 dimensions"},
            {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
             "\"data_offsets\":[0,4]}}",
             4, "byte count overflows"},
            {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}",
             4, "integer larger than"},
            {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
             "needs 8 bytes, data_offsets [0, 4] hold 4"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 2,
             "lie outside the 2-byte data buffer"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[3,1]}}", 4,
             "begin is after end"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
             4, "overlaps tensor \"a\""},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4,
             "hole in the data buffer: bytes [0, 2)"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 4,
             "2 bytes after the last tensor"},
            {"{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "tensor \"a\": expected a string"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1,
             "shape: expected an array"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":\"0\"}}", 1,
             "data_offsets: expected an array of 2 integers"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1,
             "expected an array of 2 integers"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "missing field \"data_offsets\""},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1,
             "unknown field \"x\""},
            {"{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "field \"dtype\" appears twice"},
            {"{\"a\":[1]}", 0, "tensor \"a\": expected an object"},
            {"{\"a\":{\"dtype\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
             "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}",
             0, "expected a string"},
            {"{\"a\\u0000\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "\\u0000 in a string"},
            {"{\"\\ud800x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "not followed by a low one"},
            {"{\"\\udc00\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "lone low surrogate"},
            {"{\"\\x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "invalid escape '\\x'"},
            {"{\"\\u12G4\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "4 hex digits"},
            {"{\"\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "invalid UTF-8"},
            {"{\"\xed\xa0\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "invalid UTF-8"}, /* encoded surrogate */
            {"{\"\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "invalid UTF-8"}, /* overlong */
            {"{\"a\tb\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             "control character 0x09"},
            {"{\"abc", 0, "unterminated string"},
            {"{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ \"k\": expected a string"},
            {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ appears twice"},
            {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
             "__metadata__ key \"k\" appears twice"},
            {"{\"__metadata__\":[]}", 0, "__metadata__: expected an object"},
        };
        tpk_st_file f;
        size_t size;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            uint8_t *b = mkfile(cases[i].header, cases[i].ndata, &size);
            CHECK_FAILS(&ctx, tpk_st_parse(&ctx, b, size, "hostile", &f), TPK_ERR_FORMAT,
                        cases[i].needle);
            CHECK(strstr(tpk_last_error(&ctx), "tpk_st_parse: hostile: ") == tpk_last_error(&ctx),
                  "case %zu: message does not name the input", i);
            CHECK(f.owned == NULL && f.tensors == NULL, "case %zu: out not cleared", i);
            free(b);
        }
        /* a name of 256 bytes */
        char h[600];
        char name[257];
        memset(name, 'n', 256), name[256] = 0;
        snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                 name);
        uint8_t *b = mkfile(h, 1, &size);
        CHECK_FAILS(&ctx, tpk_st_parse(&ctx, b, size, "hostile", &f), TPK_ERR_FORMAT,
                    "is 256 bytes, longer than 255");
        free(b);
        /* the length field: short file, beyond the file, absurd */
        const uint8_t short5[5] = {1, 0, 0, 0, 0};
        CHECK_FAILS(&ctx, tpk_st_parse(&ctx, short5, 5, "short", &f), TPK_ERR_FORMAT,
                    "5 bytes, shorter than the 8-byte header length");
        b = mkfile("{}", 0, &size);
        b[0] = 3;
        CHECK_FAILS(&ctx, tpk_st_parse(&ctx, b, size, "long", &f), TPK_ERR_FORMAT,
                    "header length 3 exceeds the 2 bytes after it");
        b[0] = 0, b[4] = 1; /* 2^32 */
        CHECK_FAILS(&ctx, tpk_st_parse(&ctx, b, size, "huge", &f), TPK_ERR_FORMAT,
                    "header length 4294967296 is larger than the 100000000-byte limit");
        free(b);
        /* files that cannot be read */
        CHECK_FAILS(&ctx, tpk_st_read(&ctx, path_of(p, sizeof p, "no-such.safetensors"), &f),
                    TPK_ERR_IO, "no-such.safetensors: cannot open");
        CHECK_FAILS(&ctx, tpk_st_read(&ctx, dir, &f), TPK_ERR_IO, "not a regular file");
        CHECK_FAILS(&ctx, tpk_st_parse(&ctx, NULL, 8, "x", &f), TPK_ERR_ARG, "bytes is NULL");
    }

    TEST_CASE("safetensors strict JSON: repeats named at their byte, UTF-8, ranges, nesting") {
        /* each: header, data bytes, the message (byte offsets are the file's: the header starts
         * at byte 8) */
        static const char *const e1 = "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}",
                              *e2 = "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}";
        char h[3][400], want[3][200];
        snprintf(h[0], sizeof h[0], "{\"a\":%s,\"b\":%s,\"a\":%s}", e1, e2,
                 "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}");
        snprintf(want[0], sizeof want[0],
                 "hostile: byte %zu: tensor name \"a\" appears twice (first at byte 9)",
                 8 + (size_t)(strstr(h[0], "},\"a\":") + 2 - h[0]));
        snprintf(h[1], sizeof h[1],
                 "{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"},\"a\":%s}", e1);
        snprintf(want[1], sizeof want[1],
                 "hostile: byte %zu: __metadata__ key \"k\" appears twice (first at byte 25)",
                 8 + (size_t)(strstr(h[1], "\"k\":\"3\"") - h[1]));
        snprintf(h[2], sizeof h[2], "{\"__metadata__\":{\"k\":\"v\xed\xa0\x80\"},\"a\":%s}", e1);
        snprintf(want[2], sizeof want[2],
                 "hostile: byte %zu: __metadata__ \"k\": expected valid UTF-8 in a string",
                 8 + (size_t)(strstr(h[2], "\xed") - h[2]));
        tpk_st_file f;
        size_t size;
        for (int i = 0; i < 3; i++) {
            uint8_t *b = mkfile(h[i], i ? 1 : 3, &size);
            CHECK_FAILS(&ctx, tpk_st_parse(&ctx, b, size, "hostile", &f), TPK_ERR_FORMAT, want[i]);
            free(b);
        }
        static const hostile cases[] = {
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,"
             "18446744073709551616]}}",
             1,
             "hostile: byte 57: tensor \"a\": data_offsets: integer larger than "
             "18446744073709551615"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1e400],\"data_offsets\":[0,1]}}", 1,
             "byte 36: tensor \"a\": shape[0]: expected an integer, got a fraction or exponent"},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]"
             "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],\"data_offsets\":[0,1]}}",
             1, "byte 36: tensor \"a\": shape[0]: expected a non-negative integer"},
            {"{\"a\" 1}", 0, "hostile: byte 13: expected ':' after \"a\""},
            {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}", 1,
             "byte 60: the top-level object: expected ',' or '}' (truncated JSON)"},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            uint8_t *b = mkfile(cases[i].header, cases[i].ndata, &size);
            CHECK_FAILS(&ctx, tpk_st_parse(&ctx, b, size, "hostile", &f), TPK_ERR_FORMAT,
                        cases[i].needle);
            free(b);
        }
        /* the largest offsets read exactly: 2^64 - 1 is past this file's data, named as such */
        uint8_t *b = mkfile("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":"
                            "[18446744073709551615,18446744073709551615]}}",
                            0, &size);
        CHECK_FAILS(&ctx, tpk_st_parse(&ctx, b, size, "hostile", &f), TPK_ERR_FORMAT,
                    "data_offsets [18446744073709551615, 18446744073709551615] lie outside");
        free(b);
    }

    TEST_CASE("safetensors: every truncation and single-byte change of a valid file is survived") {
        float w[3] = {1, 2, 3};
        int64_t s3[1] = {3}, s0[1] = {0};
        tpk_st_entry e[] = {{"w\xc3\xa9", TPK_ST_F32, 1, s3, w},
                            {"e", TPK_ST_BF16, 1, s0, NULL},
                            {"x", TPK_ST_F16, 1, s3, w}};
        const char *meta[] = {"k", "v\\\"", NULL};
        path_of(p, sizeof p, "mut.safetensors");
        CHECK_OK(&ctx, tpk_st_write(&ctx, p, e, 3, meta));
        size_t size, rejected = 0, accepted = 0;
        uint8_t *good = slurp(p, &size);
        CHECK(good && fuzz_safetensors_one(good, size) == TPK_OK, "the valid file does not parse");
        for (size_t n = 0; good && n < size; n++) {
            uint8_t *cut = (uint8_t *)malloc(n ? n : 1); /* exact size, so a sanitizer sees any
                                                            overread */
            memcpy(cut, good, n);
            CHECK(fuzz_safetensors_one(cut, n) == TPK_ERR_FORMAT,
                  "truncated to %zu bytes: accepted", n);
            free(cut);
        }
        static const uint8_t subst[] = {0,   '"', '\\', '{', '}',  '[',  ']', ',',
                                        ':', '-', '9',  'e', 0x80, 0xff, ' '};
        for (size_t i = 0; good && i < size; i++) {
            uint8_t keep = good[i];
            for (size_t k = 0; k < sizeof subst; k++) {
                if (subst[k] == keep) continue;
                good[i] = subst[k];
                if (fuzz_safetensors_one(good, size) == TPK_OK) accepted++;
                else rejected++;
            }
            good[i] = keep;
        }
        CHECK(rejected > accepted, "%zu corruptions accepted, %zu rejected", accepted, rejected);
        free(good);
    }

    TEST_CASE("safetensors atomic writer: failures leave no temporary and the old file intact") {
        uint8_t big[65536], small[16];
        memset(big, 7, sizeof big), memset(small, 3, sizeof small);
        int64_t sb[1] = {65536}, ss[1] = {16};
        tpk_st_entry eb = {"big", TPK_ST_U8, 1, sb, big}, es = {"small", TPK_ST_U8, 1, ss, small};
        path_of(p, sizeof p, "atomic.safetensors");
        CHECK_OK(&ctx, tpk_st_write(&ctx, p, &es, 1, NULL));
        size_t n0, n1;
        uint8_t *before = slurp(p, &n0);

        /* a path in a missing directory */
        path_of(q, sizeof q, "missing-dir/x.safetensors");
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, q, &es, 1, NULL), TPK_ERR_IO,
                    "create the temporary file");
        CHECK(!exists(q), "%s exists", q);

        /* a write that fails half way: a file-size limit below the file's size */
        struct rlimit old, lim;
        getrlimit(RLIMIT_FSIZE, &old);
        lim = old, lim.rlim_cur = 4096;
        void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &lim);
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &eb, 1, NULL), TPK_ERR_IO, "write (");
        setrlimit(RLIMIT_FSIZE, &old);
        signal(SIGXFSZ, prev);
        CHECK(strstr(tpk_last_error(&ctx), "the temporary was removed"), "%s",
              tpk_last_error(&ctx));
        CHECK(!exists(tmp_of(q, sizeof q, p)), "temporary %s left behind", q);
        uint8_t *after = slurp(p, &n1);
        CHECK(after && n0 == n1 && !memcmp(before, after, n0), "the old file changed");
        free(after);

        /* a directory in the way: the rename fails */
        path_of(q, sizeof q, "a-directory");
        mkdir(q, 0755);
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, q, &es, 1, NULL), TPK_ERR_IO,
                    "rename the temporary file over it");
        char t[300];
        CHECK(!exists(tmp_of(t, sizeof t, q)), "temporary %s left behind", t);

        /* bad arguments: nothing is created */
        int64_t neg[1] = {-2}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        char longname[300];
        memset(longname, 'x', 299), longname[299] = 0;
        tpk_st_entry dup[2] = {es, es}, bad;
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, dup, 2, NULL), TPK_ERR_ARG,
                    "name \"small\" appears twice");
        bad = es, bad.shape = neg;
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &bad, 1, NULL), TPK_ERR_ARG,
                    "shape[0] = -2 is negative");
        bad = es, bad.ndim = 9, bad.shape = nine;
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &bad, 1, NULL), TPK_ERR_ARG, "ndim 9");
        bad = es, bad.data = NULL;
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &bad, 1, NULL), TPK_ERR_ARG, "data is NULL");
        bad = es, bad.name = "__metadata__";
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &bad, 1, NULL), TPK_ERR_ARG, "reserved");
        bad = es, bad.name = "bad\xff";
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &bad, 1, NULL), TPK_ERR_ARG, "not valid UTF-8");
        bad = es, bad.name = longname;
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &bad, 1, NULL), TPK_ERR_ARG,
                    "longer than 255 bytes");
        bad = es, bad.dtype = TPK_ST_NDTYPES;
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &bad, 1, NULL), TPK_ERR_ARG, "invalid dtype");
        const char *m1[] = {"k", NULL, NULL}, *m2[] = {"k", "1", "k", "2", NULL};
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &es, 1, m1), TPK_ERR_ARG, "key \"k\" has no value");
        CHECK_FAILS(&ctx, tpk_st_write(&ctx, p, &es, 1, m2), TPK_ERR_ARG,
                    "key \"k\" appears twice");
        after = slurp(p, &n1);
        CHECK(after && n0 == n1 && !memcmp(before, after, n0), "the old file changed");
        CHECK(!exists(tmp_of(q, sizeof q, p)), "temporary %s left behind", q);
        free(after);

        /* a successful overwrite replaces it */
        CHECK_OK(&ctx, tpk_st_write(&ctx, p, &eb, 1, NULL));
        tpk_st_file f;
        CHECK_OK(&ctx, tpk_st_read(&ctx, p, &f));
        CHECK(f.n == 1 && !strcmp(f.tensors[0].name, "big") && f.data_size == sizeof big,
              "overwrite");
        tpk_st_close(&f);
        CHECK(!exists(tmp_of(q, sizeof q, p)), "temporary %s left behind", q);
        free(before);
    }

    TEST_CASE("safetensors fuzz corpus replay (tests/fuzz/corpus)") {
        DIR *d = opendir("tests/fuzz/corpus");
        CHECK(d != NULL, "cannot open tests/fuzz/corpus");
        int files = 0;
        for (struct dirent *de; d && (de = readdir(d));) {
            if (de->d_name[0] == '.') continue;
            char path[512];
            snprintf(path, sizeof path, "tests/fuzz/corpus/%s", de->d_name);
            size_t size;
            uint8_t *b = slurp(path, &size);
            CHECK(b != NULL, "cannot read %s", path);
            if (!b) continue;
            tpk_status s = fuzz_safetensors_one(b, size);
            tpk_st_file f;
            tpk_status r = tpk_st_read(&ctx, path, &f); /* the same through the file reader */
            tpk_st_close(&f);
            CHECK(r == s, "%s: tpk_st_read %s, tpk_st_parse %s", path, tpk_status_str(r),
                  tpk_status_str(s));
            if (!strncmp(de->d_name, "valid", 5))
                CHECK(s == TPK_OK, "%s: %s", path, tpk_last_error(&ctx));
            if (!strncmp(de->d_name, "bad", 3))
                CHECK(s == TPK_ERR_FORMAT, "%s: %s", path, tpk_status_str(s));
            free(b);
            files++;
        }
        if (d) closedir(d);
        CHECK(files >= 8, "only %d corpus files", files);
    }

    return test_finish();
}
