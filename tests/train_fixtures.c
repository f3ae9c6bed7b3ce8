/* tests/train_fixtures.c — inputs for the trainer tests (tests/train.sh), good and hostile.
 *
 *   train_fixtures shard OUT TEXT [MAGIC VERSION]   an llm.c token shard of TEXT's bytes
 *   train_fixtures shard-truncated OUT TEXT         a shard whose header promises more tokens
 *   train_fixtures shard-big OUT TEXT TOKEN         a shard with one token id replaced by TOKEN
 *   train_fixtures corrupt IN OUT KIND              a copy of the safetensors file IN, broken:
 *       header-len    the header length runs past the end of the file
 *       offsets       the first tensor's data_offsets point past the buffer
 *       overlap       the second tensor's offsets overlap the first
 *       dtype         the first tensor's dtype is "Q7"
 *       shape         the first tensor's first dimension is changed (so it no longer matches
 *                     config.json; its byte size is kept by swapping the dims of a 2-D tensor
 *                     or, for a 1-D one, by halving dim 0 and adding a dim of 2)
 *       truncated     the file cut in the middle of the tensor data
 *   train_fixtures check FILE                      exit 0 when FILE is a whole, valid safetensors
 *   file
 * The corruptions edit the JSON header text; `check` uses the strict reader
 * (tpk/train/safetensors.h). */
#include <tpk/train/safetensors.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) free(b), b = NULL;
    fclose(f);
    *n = (size_t)len;
    return b;
}
static int spit(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    int bad = fwrite(a, 1, na, f) != na || (nb && fwrite(b, 1, nb, f) != nb);
    return fclose(f) || bad;
}

static int shard(const char *out, const char *text, int32_t magic, int32_t version, int truncated,
                 long big) {
    size_t n;
    uint8_t *t = slurp(text, &n);
    if (!t) return fprintf(stderr, "cannot read %s\n", text), 1;
    int32_t h[256] = {0};
    h[0] = magic, h[1] = version, h[2] = (int32_t)n + (truncated ? 100 : 0);
    uint16_t *tok = malloc(2 * n);
    for (size_t i = 0; i < n; i++) tok[i] = t[i];
    if (big >= 0) tok[n / 2] = (uint16_t)big;
    int rc = spit(out, h, sizeof h, tok, 2 * n);
    free(t), free(tok);
    return rc;
}

/* the n-th occurrence of `key` in the header text */
static char *nth(char *hdr, const char *key, int k) {
    char *p = hdr;
    for (int i = 0; p && i <= k; i++) p = strstr(i ? p + 1 : p, key);
    return p;
}

static int corrupt(const char *in, const char *out, const char *kind) {
    size_t n;
    uint8_t *b = slurp(in, &n);
    if (!b || n < 8) return fprintf(stderr, "cannot read %s\n", in), 1;
    uint64_t hl;
    memcpy(&hl, b, 8);
    if (hl > n - 8) return fprintf(stderr, "%s: not a safetensors file\n", in), 1;
    char *hdr = calloc(hl + 64, 1);
    memcpy(hdr, b + 8, hl);
    size_t nd = n - 8 - hl; /* data bytes */
    int rc = 0;
    if (!strcmp(kind, "header-len")) {
        uint64_t big = (uint64_t)n * 4;
        memcpy(b, &big, 8);
        rc = spit(out, b, n, NULL, 0);
    } else if (!strcmp(kind, "truncated")) {
        rc = spit(out, b, 8 + hl + nd / 2, NULL, 0);
    } else {
        /* edit the header text (it may grow), then write length + header + the same data */
        char *p = NULL, tmp[96];
        size_t cap = hl + 64;
        char *q = NULL, *e = NULL;
        if (!strcmp(kind, "dtype") && (p = nth(hdr, "\"F32\"", 0))) memcpy(p, "\"Q7\" ", 5);
        else if (!strcmp(kind, "offsets") && (p = nth(hdr, "\"data_offsets\"", 0)) &&
                 (q = strchr(p, '[')) && (e = strchr(q, ']')))
            snprintf(tmp, sizeof tmp, "[%llu,%llu]", (unsigned long long)nd * 2,
                     (unsigned long long)nd * 2 + 4);
        else if (!strcmp(kind, "overlap") && (p = nth(hdr, "\"data_offsets\"", 1)) &&
                 (q = strchr(p, '[')) && (e = strchr(q, ']'))) {
            long b0 = strtol(q + 1, NULL, 10),
                 b1 = strtol(strchr(q, ',') + 1, NULL,
                             10); /* shift it back over its predecessor by 4 bytes */
            snprintf(tmp, sizeof tmp, "[%ld,%ld]", b0 - 4, b1 - 4);
        } else if (!strcmp(kind, "shape") && (p = nth(hdr, "\"shape\"", 0)) &&
                   (q = strchr(p, '[')) && (e = strchr(q, ']'))) {
            long d0 = strtol(q + 1, NULL, 10), d1 = strchr(q, ',') && strchr(q, ',') < e
                                                        ? strtol(strchr(q, ',') + 1, NULL, 10)
                                                        : -1;
            if (d1 >= 0)
                snprintf(tmp, sizeof tmp, "[%ld,%ld]", d0 / 2,
                         d1 * 2); /* same bytes, another shape */
            else snprintf(tmp, sizeof tmp, "[%ld,2]", d0 / 2);
        } else if (strcmp(kind, "dtype")) {
            return fprintf(stderr, "unknown corruption %s\n", kind), 1;
        }
        if (!p) return fprintf(stderr, "%s: nothing to corrupt for %s\n", in, kind), 1;
        char *nh = calloc(cap + sizeof tmp, 1);
        if (q && e) { /* splice tmp over [q, e] */
            size_t pre = (size_t)(q - hdr);
            memcpy(nh, hdr, pre);
            strcpy(nh + pre, tmp);
            strcat(nh, e + 1);
        } else {
            memcpy(nh, hdr, hl);
        }
        uint64_t nl = strlen(nh);
        uint8_t len8[8];
        memcpy(len8, &nl, 8);
        FILE *f = fopen(out, "wb");
        rc = !f || fwrite(len8, 1, 8, f) != 8 || fwrite(nh, 1, nl, f) != nl ||
             fwrite(b + 8 + hl, 1, nd, f) != nd;
        if (f && fclose(f)) rc = 1;
        free(nh);
    }
    free(b), free(hdr);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "shard"))
        return shard(argv[2], argv[3], argc > 4 ? atoi(argv[4]) : 20240520,
                     argc > 5 ? atoi(argv[5]) : 1, 0, -1);
    if (argc == 4 && !strcmp(argv[1], "shard-truncated"))
        return shard(argv[2], argv[3], 20240520, 1, 1, -1);
    if (argc == 5 && !strcmp(argv[1], "shard-big"))
        return shard(argv[2], argv[3], 20240520, 1, 0, atol(argv[4]));
    if (argc == 5 && !strcmp(argv[1], "corrupt")) return corrupt(argv[2], argv[3], argv[4]);
    if (argc == 3 && !strcmp(argv[1], "check")) {
        tpk_ctx ctx; /* only its error fields are used */
        tpk_st_file f;
        memset(&ctx, 0, sizeof ctx);
        tpk_status s = tpk_st_read(&ctx, argv[2], &f);
        if (s != TPK_OK) fprintf(stderr, "%s\n", ctx.err);
        tpk_st_close(&f);
        return s != TPK_OK;
    }
    fprintf(stderr, "usage: train_fixtures shard|shard-truncated|shard-big|corrupt|check ...\n");
    return 2;
}
