/* tpk/train/safetensors.h — a strict safetensors reader and an atomic writer (checkpoints,
 * docs/DESIGN.md section 4).
 *
 * The format:
 *   bytes [0, 8)        N, the header length, a little-endian u64
 *   bytes [8, 8+N)      the header: UTF-8 JSON, one object mapping each tensor name to
 *                         {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
 *                       plus an optional "__metadata__" object of string -> string;
 *                       writers pad it with trailing spaces
 *   bytes [8+N, size)   the data buffer; a tensor's bytes are [begin, end) of this buffer,
 *                       row-major, little-endian
 *
 * Reading (tpk_st_read, tpk_st_parse) checks everything before anything is returned and never
 * reads outside the bytes it was given. A file is rejected (TPK_ERR_FORMAT, "FILE: byte N: ...",
 * N the offset in the file of the value at fault, then the tensor or field and what is wrong)
 * when:
 *   - it is shorter than 8 bytes, N exceeds the bytes after it or TPK_ST_MAX_HEADER (100 MB);
 *   - the header is not strict JSON (tpk/text/json.h's reader, the kit's one: RFC 8259):
 *     bad syntax, bytes after the top-level object other than whitespace, a control character
 *     or invalid UTF-8 in a string, a bad escape, a lone surrogate in \uXXXX (pairs are
 *     combined), or \u0000 (names are C strings);
 *   - the top level is not an object, a tensor entry is not an object, a field has the
 *     wrong type, a field is missing, repeated or unknown (an entry has exactly dtype, shape
 *     and data_offsets), "__metadata__" appears twice or holds a non-string value;
 *   - a name is repeated (tensors or metadata keys: the repeat named at its byte, with the
 *     first's) or longer than 255 bytes;
 *   - the dtype is unknown; the shape has more than 8 dimensions, a negative, fractional or
 *     overflowing entry; element count x dtype size overflows or differs from end - begin;
 *   - begin > end, end lies outside the data buffer, or the tensors do not tile the data
 *     buffer exactly: sorted by offset each tensor starts where the previous one ended, and
 *     the last ends at the end of the file (overlaps, holes and trailing bytes are errors,
 *     as in the reference implementation).
 * The parser drives the JSON reader's cursor by the format: it never recurses, so nesting deeper
 * than the format's three levels is a type error ("expected ..."), not a stack overflow. The
 * header is scanned twice, once to count and check, once to fill one allocation, so memory is the
 * tensor table, the metadata strings and a byte offset per name, under 8 bytes per header byte
 * (no parse tree).
 *
 * Writing (tpk_st_write) is atomic: the bytes go to "<path>.tmp.<pid>" (open, write, fsync,
 * close), which is renamed over path, and the directory is fsynced. A failure removes the
 * temporary and leaves any existing file at path untouched; the error names the step.
 * Tensors are laid out in the order given, the header is padded with spaces to a multiple of
 * 8 bytes. Names, metadata and shapes are checked first (TPK_ERR_ARG), so the writer never
 * writes a file the reader would reject.
 *
 * POSIX: uses open/read/write/fsync/close/rename/getpid from <fcntl.h> and <unistd.h>, all
 * declared without feature-test macros (plain -std=c11 works). Values are little-endian on
 * disk and converted byte by byte, so the code does not depend on the host byte order. */
#ifndef TPK_SAFETENSORS_H
#define TPK_SAFETENSORS_H

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/ctx.h"
#include "../text/json.h"

#define TPK_ST_MAX_HEADER 100000000u /* the longest header accepted, in bytes */
#define TPK_ST_MAX_DIMS 8
#define TPK_ST_MAX_NAME 255 /* bytes of a tensor name, without the terminating NUL */

typedef enum tpk_st_dtype {
    TPK_ST_F32, TPK_ST_BF16, TPK_ST_F16, TPK_ST_I32, TPK_ST_I64, TPK_ST_U8,
    TPK_ST_F64, TPK_ST_I8, TPK_ST_I16, TPK_ST_U16, TPK_ST_U32, TPK_ST_U64, TPK_ST_BOOL,
    TPK_ST_F8_E4M3, TPK_ST_F8_E5M2,
    TPK_ST_NDTYPES /* not a dtype: the count */
} tpk_st_dtype;

typedef struct tpk_st_tensor {
    char name[256];
    tpk_st_dtype dtype;
    int ndim;
    int64_t shape[8];
    uint64_t begin, end; /* byte offsets into data */
} tpk_st_tensor;

/* A parsed file. tpk_st_read owns the file's bytes; tpk_st_parse references the caller's
 * (data points into them). Tensors are in header order. Free with tpk_st_close. */
typedef struct tpk_st_file {
    tpk_st_tensor *tensors;
    int n;
    uint8_t *data;
    uint64_t data_size;
    char **meta_keys, **meta_vals;
    int n_meta;
    void *owned;
} tpk_st_file;

/* One tensor to write: data holds its raw little-endian bytes in dtype. */
typedef struct tpk_st_entry {
    const char *name;
    tpk_st_dtype dtype;
    int ndim;
    const int64_t *shape;
    const void *data;
} tpk_st_entry;

/* ---- dtypes ------------------------------------------------------------------------------ */

typedef struct tpk__st_dtype_info {
    const char *name;
    size_t size;
} tpk__st_dtype_info;

static inline const tpk__st_dtype_info *tpk__st_dtypes(void) {
    static const tpk__st_dtype_info t[TPK_ST_NDTYPES] = {
        {"F32", 4}, {"BF16", 2}, {"F16", 2},  {"I32", 4},     {"I64", 8},
        {"U8", 1},  {"F64", 8},  {"I8", 1},   {"I16", 2},     {"U16", 2},
        {"U32", 4}, {"U64", 8},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    return t;
}
static inline bool tpk_st_dtype_valid(tpk_st_dtype dt) {
    return (unsigned)dt < (unsigned)TPK_ST_NDTYPES;
}
/* "F32", "BF16", ... as in the header; "?" for an invalid value. */
static inline const char *tpk_st_dtype_name(tpk_st_dtype dt) {
    return tpk_st_dtype_valid(dt) ? tpk__st_dtypes()[dt].name : "?";
}
/* Bytes per element; 0 for an invalid value. */
static inline size_t tpk_st_dtype_size(tpk_st_dtype dt) {
    return tpk_st_dtype_valid(dt) ? tpk__st_dtypes()[dt].size : 0;
}

/* Elements of a checked tensor (1 for 0-d; 0 when a dimension is 0, whatever the others). */
static inline int64_t tpk_st_numel(const tpk_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 0;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* f16 (IEEE binary16) -> f32, exact, subnormals, infinities and NaN included. */
static inline float tpk_st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f) u = sign | 0x7f800000u | (m << 13);
    else if (e != 0) u = sign | ((e + 112u) << 23) | (m << 13);
    else if (m == 0) u = sign;
    else { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400u)) m <<= 1, e--;
        u = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Bytes of a tensor of `shape` in dtype `dt` into *bytes; false when it overflows 64 bits.
 * A zero dimension makes the tensor empty whatever the other dimensions are. */
static inline bool tpk__st_nbytes(const int64_t *shape, int ndim, tpk_st_dtype dt,
                                  uint64_t *bytes) {
    uint64_t n = tpk_st_dtype_size(dt);
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) return *bytes = 0, true;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (n > UINT64_MAX / d) return false;
        n *= d;
    }
    *bytes = n;
    return true;
}

/* Whether the C string s is valid UTF-8 (tpk/text/utf8.h's decoder, strict). */
static inline bool tpk__st_utf8_valid(const char *s) {
    size_t n = strlen(s);
    return tpk__utf8_invalid((const uint8_t *)s, n) == n;
}

/* True when two of the n strings are equal; *dup is one of them. Sorts `s`. */
static inline int tpk__st_strcmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}
static inline bool tpk__st_has_dup(const char **s, size_t n, const char **dup) {
    if (n > 1) qsort(s, n, sizeof *s, tpk__st_strcmp);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(s[i - 1], s[i])) return *dup = s[i], true;
    return false;
}

/* ---- the header parser: tpk/text/json.h's cursor, driven by the format ---------------------- */

/* One tensor entry {"dtype": ..., "shape": [...], "data_offsets": [b, e]} into *t (name set);
 * data_size: the bytes of the data buffer. */
static inline tpk_status tpk__st_entry(tpk__jr *r, uint64_t data_size, tpk_st_tensor *t) {
    char where[300], w[340], key[16], dt[16], shp[200];
    size_t len;
    uint64_t v;
    unsigned seen = 0; /* bits: dtype, shape, data_offsets */
    snprintf(where, sizeof where, "tensor \"%.280s\"", t->name);
    size_t at = (tpk__jr_ws(r), r->at);
    if (!tpk__jr_eat(r, '{')) return tpk__jr_fail(r, r->at, "%s: expected an object", where);
    int m = 0;
    if (!tpk__jr_eat(r, '}')) do {
        size_t kat = (tpk__jr_ws(r), r->at);
        TPK_TRY(tpk__jr_string(r, where, true, false, key, sizeof key, &len));
        if (!tpk__jr_eat(r, ':'))
            return tpk__jr_fail(r, r->at, "%s: expected ':' after a key", where);
        unsigned bit = len >= sizeof key              ? 0
                       : !strcmp(key, "dtype")        ? 1
                       : !strcmp(key, "shape")        ? 2
                       : !strcmp(key, "data_offsets") ? 4
                                                      : 0;
        if (!bit)
            return tpk__jr_fail(r, kat, "%s: unknown field \"%.15s%s\"", where, key,
                                len >= sizeof key ? "..." : "");
        if (seen & bit)
            return tpk__jr_fail(r, kat, "%s: field \"%s\" appears twice", where, key);
        seen |= bit;
        size_t vat = (tpk__jr_ws(r), r->at);
        if (bit == 1) {
            TPK_TRY(tpk__jr_string(r, where, false, false, dt, sizeof dt, &len));
            int k = 0;
            while (k < TPK_ST_NDTYPES && (len >= sizeof dt || strcmp(dt, tpk__st_dtypes()[k].name)))
                k++;
            if (k == TPK_ST_NDTYPES)
                return tpk__jr_fail(r, vat, "%s: unknown dtype \"%.15s%s\"", where, dt,
                                    len >= sizeof dt ? "..." : "");
            t->dtype = (tpk_st_dtype)k;
        } else if (bit == 2) {
            snprintf(w, sizeof w, "%s: shape", where);
            if (!tpk__jr_eat(r, '[')) return tpk__jr_fail(r, r->at, "%s: expected an array", w);
            int e = 0;
            if (!tpk__jr_eat(r, ']')) do {
                    if (t->ndim == TPK_ST_MAX_DIMS)
                        return tpk__jr_fail(r, vat, "%s: more than %d dimensions", w,
                                            TPK_ST_MAX_DIMS);
                    snprintf(w, sizeof w, "%s: shape[%d]", where, t->ndim);
                    TPK_TRY(tpk__jr_uint(r, w, INT64_MAX, &v));
                    t->shape[t->ndim++] = (int64_t)v;
                    snprintf(w, sizeof w, "%s: shape", where);
            } while ((e = tpk__jr_next(r, ']', w)) == 1);
            if (e < 0) return TPK_ERR_FORMAT;
        } else {
            snprintf(w, sizeof w, "%s: data_offsets", where);
            if (!tpk__jr_eat(r, '['))
                return tpk__jr_fail(r, r->at, "%s: expected an array of 2 integers", w);
            TPK_TRY(tpk__jr_uint(r, w, UINT64_MAX, &t->begin));
            if (!tpk__jr_eat(r, ','))
                return tpk__jr_fail(r, r->at, "%s: expected an array of 2 integers", w);
            TPK_TRY(tpk__jr_uint(r, w, UINT64_MAX, &t->end));
            if (!tpk__jr_eat(r, ']'))
                return tpk__jr_fail(r, r->at, "%s: expected an array of 2 integers", w);
        }
    } while ((m = tpk__jr_next(r, '}', where)) == 1);
    if (m < 0) return TPK_ERR_FORMAT;
    if (seen != 7)
        return tpk__jr_fail(r, at, "%s: missing field \"%s\"", where,
                            !(seen & 1)   ? "dtype"
                            : !(seen & 2) ? "shape"
                                          : "data_offsets");
    tpk__shape_str(t->shape, t->ndim, shp, sizeof shp);
    if (t->begin > t->end)
        return tpk__jr_fail(r, at, "%s: data_offsets [%llu, %llu]: begin is after end", where,
                            (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_size)
        return tpk__jr_fail(r, at,
                            "%s: data_offsets [%llu, %llu] lie outside the %llu-byte data buffer",
                            where, (unsigned long long)t->begin, (unsigned long long)t->end,
                            (unsigned long long)data_size);
    uint64_t bytes;
    if (!tpk__st_nbytes(t->shape, t->ndim, t->dtype, &bytes))
        return tpk__jr_fail(r, at, "%s: shape %s of %s: the byte count overflows", where, shp,
                            tpk_st_dtype_name(t->dtype));
    if (bytes != t->end - t->begin)
        return tpk__jr_fail(
            r, at, "%s: shape %s of %s needs %llu bytes, data_offsets [%llu, %llu] hold %llu",
            where, shp, tpk_st_dtype_name(t->dtype), (unsigned long long)bytes,
            (unsigned long long)t->begin, (unsigned long long)t->end,
            (unsigned long long)(t->end - t->begin));
    return TPK_OK;
}

/* The "__metadata__" object: counts pairs and string bytes; stores them (and each key's offset in
 * key_at) when keys != NULL. */
static inline tpk_status tpk__st_metadata(tpk__jr *r, char **keys, char **vals, size_t *key_at,
                                          char *pool, size_t *n, size_t *bytes) {
    char where[300];
    size_t len;
    if (!tpk__jr_eat(r, '{')) return tpk__jr_fail(r, r->at, "__metadata__: expected an object");
    int m = 0;
    if (!tpk__jr_eat(r, '}')) do {
        char kb[201], *k = keys ? pool + *bytes : kb; /* counting: the key only for messages */
        size_t kat = (tpk__jr_ws(r), r->at);
        TPK_TRY(tpk__jr_string(r, "__metadata__: key", true, false, k,
                               keys ? SIZE_MAX : sizeof kb, &len));
        *bytes += len + 1;
        snprintf(where, sizeof where, "__metadata__ \"%.200s\"", k);
        if (!tpk__jr_eat(r, ':'))
            return tpk__jr_fail(r, r->at, "%s: expected ':' after a key", where);
        char *v = keys ? pool + *bytes : NULL;
        TPK_TRY(tpk__jr_string(r, where, false, false, v, keys ? SIZE_MAX : 0, &len));
        *bytes += len + 1;
        if (keys) keys[*n] = k, vals[*n] = v, key_at[*n] = kat;
        ++*n;
    } while ((m = tpk__jr_next(r, '}', "__metadata__")) == 1);
    if (m < 0) return TPK_ERR_FORMAT;
    return TPK_OK;
}

/* The whole header. Without f->tensors it only counts (tensors, metadata pairs, metadata
 * bytes) and checks; with them it fills f->tensors, the metadata and the offsets of the names
 * (name_at) and metadata keys (meta_at). */
static inline tpk_status tpk__st_header(tpk__jr *r, uint64_t data_size, tpk_st_file *f,
                                        char *pool, size_t *name_at, size_t *meta_at, size_t *nt,
                                        size_t *nm, size_t *mbytes) {
    tpk_st_tensor scratch;
    char name[sizeof scratch.name];
    size_t len;
    bool meta = false;
    *nt = *nm = *mbytes = 0;
    r->at = 0;
    if (tpk__jr_peek(r) < 0) return tpk__jr_fail(r, r->at, "the header is empty");
    if (!tpk__jr_eat(r, '{')) return tpk__jr_fail(r, r->at, "the header is not a JSON object");
    int m = 0;
    if (!tpk__jr_eat(r, '}')) do {
        size_t kat = (tpk__jr_ws(r), r->at);
        TPK_TRY(tpk__jr_string(r, "tensor name", true, false, name, sizeof name, &len));
        if (!tpk__jr_eat(r, ':'))
            return tpk__jr_fail(r, r->at, "expected ':' after \"%.200s\"", name);
        if (!strcmp(name, "__metadata__")) {
            if (meta) return tpk__jr_fail(r, kat, "__metadata__ appears twice");
            meta = true;
            TPK_TRY(tpk__st_metadata(r, f->meta_keys, f->meta_vals, meta_at, pool, nm, mbytes));
        } else {
            if (len > TPK_ST_MAX_NAME)
                return tpk__jr_fail(r, kat, "tensor name \"%.40s...\" is %zu bytes, longer than %d",
                                    name, len, TPK_ST_MAX_NAME);
            tpk_st_tensor *t = f->tensors ? &f->tensors[*nt] : &scratch;
            memset(t, 0, sizeof *t);
            memcpy(t->name, name, sizeof t->name);
            TPK_TRY(tpk__st_entry(r, data_size, t));
            if (name_at) name_at[*nt] = kat;
            ++*nt;
        }
    } while ((m = tpk__jr_next(r, '}', "the top-level object")) == 1);
    if (m < 0) return TPK_ERR_FORMAT;
    return tpk__jr_end(r, "unexpected bytes after the JSON object");
}

/* Owned memory: this block, then the tensors, the sort scratch, the metadata pointers, the byte
 * offsets of the names and metadata keys, the metadata strings. */
typedef struct tpk__st_block {
    tpk_allocator al;               /* the parsing context's allocator: tpk_st_close's */
    uint8_t *file;                  /* the file's bytes (tpk_st_read) or NULL */
    const tpk_st_tensor **by_name;  /* [n] the tensors sorted by name (the sort scratch, after the
                                       checks): tpk_st_find */
} tpk__st_block;
static inline int tpk__st_by_name(const void *a, const void *b) {
    return strcmp((*(const tpk_st_tensor *const *)a)->name,
                  (*(const tpk_st_tensor *const *)b)->name);
}
/* By name, then by place in the header (the tensor table is in header order). */
static inline int tpk__st_by_name_then_place(const void *a, const void *b) {
    const tpk_st_tensor *x = *(const tpk_st_tensor *const *)a,
                        *y = *(const tpk_st_tensor *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x > y) - (x < y);
}
/* Metadata keys by text, then by place (the pool holds them in header order). */
static inline int tpk__st_key_then_place(const void *a, const void *b) {
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    int c = strcmp(x, y);
    return c ? c : (x > y) - (x < y);
}

static inline int tpk__st_by_offset(const void *a, const void *b) {
    const tpk_st_tensor *x = *(const tpk_st_tensor *const *)a,
                        *y = *(const tpk_st_tensor *const *)b;
    return x->begin != y->begin ? (x->begin < y->begin ? -1 : 1)
           : x->end != y->end   ? (x->end < y->end ? -1 : 1)
                                : 0;
}

/* Checks over all tensors: the data buffer tiled exactly, unique names, unique metadata keys (a
 * repeat named at its byte, the first repeat in the header); name_at, meta_at: the byte offsets
 * of the names and keys in the header. */
static inline tpk_status tpk__st_global(const tpk__jr *r, tpk_st_file *f,
                                        const tpk_st_tensor **sorted, const size_t *name_at,
                                        const size_t *meta_at) {
    for (int i = 0; i < f->n; i++) sorted[i] = &f->tensors[i];
    qsort(sorted, (size_t)f->n, sizeof *sorted, tpk__st_by_offset);
    uint64_t pos = 0;
    for (int i = 0; i < f->n; i++) {
        const tpk_st_tensor *t = sorted[i];
        size_t at = name_at[t - f->tensors];
        if (t->begin < pos)
            return tpk__jr_fail(
                r, at,
                "tensor \"%.200s\" (data_offsets [%llu, %llu]) overlaps tensor \"%.200s\" "
                "[%llu, %llu]",
                t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                sorted[i - 1]->name, (unsigned long long)sorted[i - 1]->begin,
                (unsigned long long)sorted[i - 1]->end);
        if (t->begin > pos)
            return tpk__jr_fail(
                r, at,
                "hole in the data buffer: bytes [%llu, %llu) before tensor \"%.200s\" belong "
                "to no tensor",
                (unsigned long long)pos, (unsigned long long)t->begin, t->name);
        pos = t->end;
    }
    if (pos != f->data_size)
        return tpk__jr_fail(
            r, f->n ? name_at[sorted[f->n - 1] - f->tensors] : 0,
            "the data buffer has %llu bytes after the last tensor (it ends at %llu of %llu)",
            (unsigned long long)(f->data_size - pos), (unsigned long long)pos,
            (unsigned long long)f->data_size);
    const tpk_st_tensor *dup = NULL;
    for (int i = 0; i < f->n; i++) sorted[i] = &f->tensors[i];
    if (f->n > 1) qsort(sorted, (size_t)f->n, sizeof *sorted, tpk__st_by_name_then_place);
    for (int i = 1; i < f->n; i++)
        if (!strcmp(sorted[i - 1]->name, sorted[i]->name) && (!dup || sorted[i] < dup))
            dup = sorted[i];
    if (dup) {
        const tpk_st_tensor *first = f->tensors;
        while (strcmp(first->name, dup->name)) first++;
        return tpk__jr_fail(r, name_at[dup - f->tensors],
                            "tensor name \"%.200s\" appears twice (first at byte %zu)", dup->name,
                            r->base + name_at[first - f->tensors]);
    }
    const char **keys = (const char **)(void *)sorted, *kdup = NULL;
    for (int i = 0; i < f->n_meta; i++) keys[i] = f->meta_keys[i];
    if (f->n_meta > 1) qsort(keys, (size_t)f->n_meta, sizeof *keys, tpk__st_key_then_place);
    for (int i = 1; i < f->n_meta; i++)
        if (!strcmp(keys[i - 1], keys[i]) && (!kdup || keys[i] < kdup)) kdup = keys[i];
    if (kdup) {
        int k = 0, first = 0;
        while (f->meta_keys[k] != kdup) k++;
        while (strcmp(f->meta_keys[first], kdup)) first++;
        return tpk__jr_fail(r, meta_at[k], "__metadata__ key \"%.200s\" appears twice (first at "
                            "byte %zu)", kdup, r->base + meta_at[first]);
    }
    return TPK_OK;
}

static inline void tpk_st_close(tpk_st_file *f) {
    if (!f) return;
    if (f->owned) {
        tpk__st_block *b = (tpk__st_block *)f->owned;
        tpk_allocator al = b->al;
        tpk__al_free(&al, b->file), tpk__al_free(&al, f->owned);
    }
    memset(f, 0, sizeof *f);
}

/* Parse a file held in memory. Nothing is copied: out->data points into `bytes`, which must
 * outlive *out (the tensor table and the metadata strings are out's own). `what` names the
 * bytes in errors (a path; NULL gives "<memory>"). */
static inline tpk_status tpk__st_parse(tpk_ctx *ctx, const char *fn, const uint8_t *bytes,
                                       size_t size, const char *what, tpk_st_file *out) {
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: expected a tpk_st_file, got NULL");
    memset(out, 0, sizeof *out);
    if (!what) what = "<memory>";
    if (!bytes && size) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: bytes is NULL", what);
    if (size < 8)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: byte 0: %zu bytes, shorter than the 8-byte header length", what,
                         size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | bytes[i];
    if (hlen > TPK_ST_MAX_HEADER)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: byte 0: header length %llu is larger than the %u-byte limit", what,
                         (unsigned long long)hlen, TPK_ST_MAX_HEADER);
    if (hlen > size - 8)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                         "%s: byte 0: header length %llu exceeds the %zu bytes after it "
                         "(truncated file?)",
                         what, (unsigned long long)hlen, size - 8);
    tpk__jr r;
    tpk__jr_init(&r, ctx, fn, what, bytes + 8, (size_t)hlen, 8);
    uint64_t data_size = size - 8 - hlen;
    size_t nt, nm, mbytes;
    TPK_TRY(tpk__st_header(&r, data_size, out, NULL, NULL, NULL, &nt, &nm, &mbytes)); /* count */
    size_t nsort = nt > nm ? nt : nm;
    /* every part is 8-byte aligned but the strings */
    size_t off_tensors = (sizeof(tpk__st_block) + 7) / 8 * 8;
    size_t off_sort = off_tensors + nt * sizeof(tpk_st_tensor),
           off_meta = off_sort + nsort * sizeof(void *);
    size_t off_at = off_meta + 2 * nm * sizeof(char *);
    size_t off_pool = off_at + (nt + nm) * sizeof(size_t);
    uint8_t *block = (uint8_t *)tpk__calloc(ctx, 1, off_pool + mbytes);
    if (!block)
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%s: cannot allocate %zu bytes for %zu tensors",
                         what, off_pool + mbytes, nt);
    ((tpk__st_block *)(void *)block)->al = tpk__allocator(ctx);
    out->owned = block;
    out->tensors = (tpk_st_tensor *)(void *)(block + off_tensors);
    out->meta_keys = (char **)(void *)(block + off_meta);
    out->meta_vals = out->meta_keys + nm;
    out->data = (uint8_t *)(uintptr_t)(bytes + 8 + hlen);
    out->data_size = data_size;
    size_t *name_at = (size_t *)(void *)(block + off_at), *meta_at = name_at + nt;
    tpk_status s = tpk__st_header(&r, data_size, out, (char *)block + off_pool, name_at, meta_at,
                                  &nt, &nm, &mbytes); /* fill */
    out->n = (int)nt, out->n_meta = (int)nm;
    const tpk_st_tensor **idx = (const tpk_st_tensor **)(void *)(block + off_sort);
    if (s == TPK_OK) s = tpk__st_global(&r, out, idx, name_at, meta_at);
    if (s != TPK_OK) {
        tpk_st_close(out);
        return s;
    }
    /* the name index: lookups in O(log n) */
    for (size_t i = 0; i < nt; i++) idx[i] = &out->tensors[i];
    if (nt > 1) qsort(idx, nt, sizeof *idx, tpk__st_by_name);
    ((tpk__st_block *)(void *)block)->by_name = idx;
    return TPK_OK;
}

static inline tpk_status tpk_st_parse(tpk_ctx *ctx, const uint8_t *bytes, size_t size,
                                      const char *what, tpk_st_file *out) {
    return tpk__st_parse(ctx, "tpk_st_parse", bytes, size, what, out);
}

/* Read and check a whole file (the file's bytes are read into memory that *out owns). */
static inline tpk_status tpk_st_read(tpk_ctx *ctx, const char *path, tpk_st_file *out) {
    const char *fn = "tpk_st_read";
    if (out) memset(out, 0, sizeof *out);
    if (!path || !out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s is NULL", path ? "out" : "path");
    int fd = open(path, O_RDONLY);
    if (fd < 0) return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    bool stat_failed = fstat(fd, &st) != 0;
    if (stat_failed || !S_ISREG(st.st_mode)) {
        tpk_status s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: %s", path,
                                 stat_failed ? strerror(errno) : "not a regular file");
        close(fd);
        return s;
    }
    uint64_t size = (uint64_t)st.st_size;
    uint8_t *buf = size <= SIZE_MAX - 1 ? (uint8_t *)tpk__malloc(ctx, (size_t)size + 1) : NULL;
    if (!buf) {
        close(fd);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%s: cannot allocate %llu bytes for the file",
                         path, (unsigned long long)size);
    }
    size_t got = 0;
    while (got < size) {
        size_t want = size - got > ((size_t)1 << 30) ? ((size_t)1 << 30) : (size_t)(size - got);
        ssize_t r = read(fd, buf + got, want);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            tpk_status s = tpk__fail(
                ctx, TPK_ERR_IO, fn, "%s: read failed after %zu of %llu bytes: %s", path, got,
                (unsigned long long)size, r < 0 ? strerror(errno) : "unexpected end of file");
            close(fd), tpk__free(ctx, buf);
            return s;
        }
        got += (size_t)r;
    }
    close(fd);
    tpk_status s = tpk__st_parse(ctx, fn, buf, (size_t)size, path, out);
    if (s != TPK_OK) tpk__free(ctx, buf);
    else ((tpk__st_block *)out->owned)->file = buf;
    return s;
}

/* The tensor called name, or NULL. */
static inline const tpk_st_tensor *tpk_st_find(const tpk_st_file *f, const char *name) {
    const tpk__st_block *blk = f ? (const tpk__st_block *)f->owned : NULL;
    if (blk && blk->by_name && name) { /* a parsed file: binary search of the name index */
        int lo = 0, hi = f->n;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2, c = strcmp(blk->by_name[mid]->name, name);
            if (!c) return blk->by_name[mid];
            if (c < 0) lo = mid + 1;
            else hi = mid;
        }
        return NULL;
    }
    for (int i = 0; f && name && i < f->n; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

/* The metadata value of key, or NULL. */
static inline const char *tpk_st_meta(const tpk_st_file *f, const char *key) {
    for (int i = 0; f && key && i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_vals[i];
    return NULL;
}

/* Tensor t of f converted to f32 (F32, BF16, F16; others TPK_ERR_DTYPE); n must be its element
 * count. */
static inline tpk_status tpk_st_get_f32(tpk_ctx *ctx, const tpk_st_file *f, const tpk_st_tensor *t,
                                        float *out, size_t n) {
    const char *fn = "tpk_st_get_f32";
    char shp[200];
    uint64_t bytes;
    if (!f || !t) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s is NULL", f ? "t" : "f");
    if (t->ndim < 0 || t->ndim > TPK_ST_MAX_DIMS || !tpk_st_dtype_valid(t->dtype) ||
        !tpk__st_nbytes(t->shape, t->ndim, t->dtype, &bytes) || t->begin > t->end ||
        t->end > f->data_size || bytes != t->end - t->begin)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "tensor \"%.200s\" does not describe bytes of this file", t->name);
    if (t->dtype != TPK_ST_F32 && t->dtype != TPK_ST_BF16 && t->dtype != TPK_ST_F16)
        return tpk__fail(
            ctx, TPK_ERR_DTYPE, fn,
            "tensor \"%.200s\": dtype %s does not convert to f32 (expected F32, BF16 or F16)",
            t->name, tpk_st_dtype_name(t->dtype));
    size_t numel = (size_t)(bytes / tpk_st_dtype_size(t->dtype));
    if (n != numel)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "tensor \"%.200s\" has %zu elements (shape %s), n is %zu", t->name, numel,
                         tpk__shape_str(t->shape, t->ndim, shp, sizeof shp), n);
    if (n && !out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out is NULL");
    const uint8_t *p = f->data + t->begin;
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == TPK_ST_F32) {
            uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                         (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
            memcpy(&out[i], &u, 4);
        } else {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            out[i] = t->dtype == TPK_ST_BF16 ? tpk_bf16_to_f32(h) : tpk_st_f16_to_f32(h);
        }
    }
    return TPK_OK;
}

/* ---- the writer -------------------------------------------------------------------------- */

/* A growing byte string; `oom` sticks once an allocation fails. */
typedef struct tpk__st_str {
    char *p;
    size_t n, cap;
    bool oom;
    const tpk_allocator *al; /* p's (the writing context's) */
} tpk__st_str;

static inline void tpk__st_put(tpk__st_str *s, const char *b, size_t n) {
    if (s->oom) return;
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->n + n) cap *= 2;
        char *p = (char *)tpk__al_realloc(s->al, s->p, s->cap, cap);
        if (!p) {
            s->oom = true;
            return;
        }
        s->p = p, s->cap = cap;
    }
    memcpy(s->p + s->n, b, n);
    s->n += n;
}
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline void tpk__st_putf(tpk__st_str *s, const char *fmt, ...) {
    char b[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    tpk__st_put(s, b, n > 0 ? (size_t)n : 0);
}
/* A C string as a JSON string (UTF-8 passes through; '"', '\' and control bytes are escaped). */
static inline void tpk__st_put_json(tpk__st_str *s, const char *str) {
    tpk__st_put(s, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
        if (*c == '"' || *c == '\\') tpk__st_put(s, "\\", 1), tpk__st_put(s, (const char *)c, 1);
        else if (*c < 0x20) tpk__st_putf(s, "\\u%04x", *c);
        else tpk__st_put(s, (const char *)c, 1);
    }
    tpk__st_put(s, "\"", 1);
}

/* write(2) all n bytes, through short writes and signals. */
static inline bool tpk__st_write_all(int fd, const void *b, size_t n) {
    const uint8_t *p = (const uint8_t *)b;
    while (n) {
        ssize_t w = write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w, n -= (size_t)w;
    }
    return true;
}

/* Check the entries and the metadata (TPK_ERR_ARG) and build the header, padded with spaces to
 * a multiple of 8 bytes, into h; *total is the size of the data buffer. */
static inline tpk_status tpk__st_build_header(tpk_ctx *ctx, const char *fn, const tpk_st_entry *e,
                                              int n, const char *const *meta_kv, tpk__st_str *h,
                                              uint64_t *total) {
    size_t nmeta = 0;
    const char *dup;
    *total = 0;
    if (n < 0 || (n > 0 && !e))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "entries: %s",
                         n < 0 ? "n is negative" : "NULL with n > 0");
    for (; meta_kv && meta_kv[2 * nmeta]; nmeta++) {
        const char *k = meta_kv[2 * nmeta], *v = meta_kv[2 * nmeta + 1];
        if (!v) return tpk__fail(ctx, TPK_ERR_ARG, fn, "meta_kv: key \"%.200s\" has no value", k);
        if (!tpk__st_utf8_valid(k) || !tpk__st_utf8_valid(v))
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "meta_kv: \"%.200s\": key or value is not valid UTF-8", k);
    }
    for (int i = 0; i < n; i++) {
        const tpk_st_entry *t = &e[i];
        uint64_t bytes = 0;
        if (!t->name) return tpk__fail(ctx, TPK_ERR_ARG, fn, "entries[%d].name is NULL", i);
        if (strlen(t->name) > TPK_ST_MAX_NAME)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "entries[%d].name \"%.40s...\" is longer than %d bytes", i, t->name,
                             TPK_ST_MAX_NAME);
        if (!strcmp(t->name, "__metadata__") || !tpk__st_utf8_valid(t->name))
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "entries[%d].name \"%.200s\" is reserved or not valid UTF-8", i,
                             t->name);
        if (!tpk_st_dtype_valid(t->dtype))
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "entries[%d] \"%.200s\": invalid dtype %d", i,
                             t->name, (int)t->dtype);
        if (t->ndim < 0 || t->ndim > TPK_ST_MAX_DIMS || (t->ndim && !t->shape))
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "entries[%d] \"%.200s\": ndim %d (expected 0..%d, with a shape)", i,
                             t->name, t->ndim, TPK_ST_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0)
                return tpk__fail(ctx, TPK_ERR_ARG, fn,
                                 "entries[%d] \"%.200s\": shape[%d] = %lld is negative", i, t->name,
                                 d, (long long)t->shape[d]);
        if (!tpk__st_nbytes(t->shape, t->ndim, t->dtype, &bytes) || bytes > UINT64_MAX - *total)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "entries[%d] \"%.200s\": the byte count overflows", i, t->name);
        if (bytes && !t->data)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "entries[%d] \"%.200s\": data is NULL", i,
                             t->name);
        *total += bytes;
    }
    /* unique tensor names and metadata keys */
    size_t nsort = (size_t)n > nmeta ? (size_t)n : nmeta;
    const char **names = (const char **)tpk__malloc(ctx, nsort * sizeof *names);
    if (!names) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "cannot allocate %zu names", nsort);
    for (size_t i = 0; i < nmeta; i++) names[i] = meta_kv[2 * i];
    bool dup_meta = tpk__st_has_dup(names, nmeta, &dup), dup_name = false;
    if (!dup_meta) {
        for (int i = 0; i < n; i++) names[i] = e[i].name;
        dup_name = tpk__st_has_dup(names, (size_t)n, &dup);
    }
    tpk_status s =
        dup_meta   ? tpk__fail(ctx, TPK_ERR_ARG, fn, "meta_kv: key \"%.200s\" appears twice", dup)
        : dup_name ? tpk__fail(ctx, TPK_ERR_ARG, fn, "entries: name \"%.200s\" appears twice", dup)
                   : TPK_OK;
    tpk__free(ctx, names);
    if (s != TPK_OK) return s;
    /* {"__metadata__":{"k":"v",...},
     *  "name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...} */
    tpk__st_put(h, "{", 1);
    if (nmeta) {
        tpk__st_put(h, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < nmeta; i++) {
            if (i) tpk__st_put(h, ",", 1);
            tpk__st_put_json(h, meta_kv[2 * i]);
            tpk__st_put(h, ":", 1);
            tpk__st_put_json(h, meta_kv[2 * i + 1]);
        }
        tpk__st_put(h, "}", 1);
    }
    uint64_t off = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        if (i || nmeta) tpk__st_put(h, ",", 1);
        tpk__st_put_json(h, e[i].name);
        tpk__st_putf(h, ":{\"dtype\":\"%s\",\"shape\":[", tpk_st_dtype_name(e[i].dtype));
        for (int d = 0; d < e[i].ndim; d++)
            tpk__st_putf(h, d ? ",%lld" : "%lld", (long long)e[i].shape[d]);
        tpk__st_nbytes(e[i].shape, e[i].ndim, e[i].dtype, &bytes);
        tpk__st_putf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                     (unsigned long long)(off + bytes));
        off += bytes;
    }
    tpk__st_put(h, "}", 1);
    while (!h->oom && h->n % 8) tpk__st_put(h, " ", 1);
    if (h->oom) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "cannot allocate the header");
    if (h->n > TPK_ST_MAX_HEADER)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "the header would be %zu bytes, over the %u-byte limit", h->n,
                         TPK_ST_MAX_HEADER);
    return TPK_OK;
}

/* Write tensors atomically to path (see the top of this file). data[i] holds the raw
 * little-endian bytes of entry i; meta_kv is key, value, ..., NULL (or NULL for none). */
static inline tpk_status tpk_st_write(tpk_ctx *ctx, const char *path, const tpk_st_entry *entries,
                                      int n, const char *const *meta_kv) {
    const char *fn = "tpk_st_write";
    if (!path || !*path)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "path is %s", path ? "empty" : "NULL");
    tpk__st_str h;
    memset(&h, 0, sizeof h);
    h.al = ctx ? &ctx->allocator : NULL;
    uint64_t total;
    tpk_status s = tpk__st_build_header(ctx, fn, entries, n, meta_kv, &h, &total);
    size_t plen = strlen(path);
    char *tmp = s == TPK_OK ? (char *)tpk__malloc(ctx, plen + 32) : NULL,
         *dir = tmp ? (char *)tpk__malloc(ctx, plen + 2) : NULL;
    if (s == TPK_OK && !dir)
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%s: cannot allocate a path", path);
    if (s != TPK_OK) {
        tpk__free(ctx, h.p), tpk__free(ctx, tmp);
        return s;
    }
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    const char *step = NULL; /* the step that failed */
    int err = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) step = "create the temporary file", err = errno;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    bool ok = !step && tpk__st_write_all(fd, len8, 8) && tpk__st_write_all(fd, h.p, h.n);
    for (int i = 0; ok && i < n; i++) {
        uint64_t bytes = 0;
        tpk__st_nbytes(entries[i].shape, entries[i].ndim, entries[i].dtype, &bytes);
        ok = tpk__st_write_all(fd, entries[i].data, (size_t)bytes);
    }
    if (!step && !ok) step = "write", err = errno;
    if (!step && fsync(fd) != 0) step = "fsync", err = errno;
    if (fd >= 0 && close(fd) != 0 && !step) step = "close", err = errno;
    if (!step && rename(tmp, path) != 0) step = "rename the temporary file over it", err = errno;
    if (step) {
        if (fd >= 0) unlink(tmp);
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: %s (%s) failed: %s; %s", path, step, tmp,
                      strerror(err),
                      fd >= 0 ? "the temporary was removed and the file left as it was"
                              : "nothing was written");
    } else {
        /* make the rename durable: fsync the directory (EINVAL: a filesystem that cannot) */
        const char *slash = strrchr(path, '/');
        size_t dlen = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
        memcpy(dir, slash ? path : ".", dlen);
        dir[dlen] = 0;
        int dfd = open(dir, O_RDONLY);
        if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL))
            s = tpk__fail(ctx, TPK_ERR_IO, fn,
                          "%s: written, but fsync of the directory %s failed: %s", path, dir,
                          strerror(errno));
        if (dfd >= 0) close(dfd);
    }
    tpk__free(ctx, h.p), tpk__free(ctx, tmp), tpk__free(ctx, dir);
    return s;
}

#endif /* TPK_SAFETENSORS_H */
