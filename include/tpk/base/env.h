/* tpk/base/env.h — the environment variables the kit reads, each checked like a flag.
 *
 * One table of values (tpk_env_vars): the name, what it holds (a whole number, a number, one of
 * some words, "R:S"), its range and its meaning. tpk_ctx_init checks every one that is set
 * (tpk_env_check) and refuses a bad value with TPK_ERR_ARG naming the variable, the value and
 * what is expected ("TPK_NUM_THREADS: expected a whole number in [1, 64] (empty: the BLAS
 * library's threads), got \"four\""), so a typo is never a silent default. An empty value is
 * the same as unset. The readers (the host pool's TPK_NUM_THREADS, the CUDA attention's TPK_ATTN,
 * the trainer's TPK_PEAK_TFLOPS) read values this check passed; a program may also read one
 * through tpk_env_number. Plain C11 that also compiles as C++17; no allocation. */
#ifndef TPK_BASE_ENV_H
#define TPK_BASE_ENV_H

#include <errno.h>
#include <math.h>

#include "ctx.h"

typedef enum tpk_env_kind {
    TPK_ENV_INT,    /* a whole number in [lo, hi] */
    TPK_ENV_NUMBER, /* a number in [lo, hi] */
    TPK_ENV_WORD,   /* one of the words in `words` ("a|b") */
    TPK_ENV_RANK_S, /* "R:S": a world rank R >= 0 and seconds S in (lo, hi) (a test's hook) */
} tpk_env_kind;

typedef struct tpk_env_var {
    const char *name;
    tpk_env_kind kind;
    double lo, hi;
    const char *words; /* TPK_ENV_WORD: the accepted values, '|'-separated */
    const char *what;  /* what it does (and what unset means) */
} tpk_env_var;

static const tpk_env_var tpk_env_vars[] = {
    {"TPK_NUM_THREADS", TPK_ENV_INT, 1, 64, NULL,
     "the host backend's threads (empty: the BLAS library's threads)"},
    {"TPK_PROFILE", TPK_ENV_WORD, 0, 0, "0|1",
     "1: every context profiles its ops and prints the table when destroyed"},
    {"TPK_TIMEOUT", TPK_ENV_NUMBER, 0, 1e9, NULL,
     "seconds an MPI collective waits for peers that make no progress (0: none; empty: 600)"},
    {"TPK_ATTN", TPK_ENV_WORD, 0, 0, "generic|flash",
     "the CUDA attention: generic kernels, or the tensor-core kernels where usable (the default)"},
    {"TPK_MPI_STAGE", TPK_ENV_WORD, 0, 0, "0|1",
     "1: collectives on device buffers staged through host memory even with a CUDA-aware MPI"},
    {"TPK_PEAK_TFLOPS", TPK_ENV_NUMBER, 1e-3, 1e6, NULL,
     "a GPU's peak TFLOP/s for the trainer's MFU (empty: 989, an H100's bf16 dense)"},
    {"TPK_TEST_SLOW_RANK", TPK_ENV_RANK_S, 0, 3600, NULL,
     "R:S: world rank R spends S seconds before loading, saving, hashing and the first step "
     "(tests of the timeout only)"},
};
enum { TPK_ENV_NVARS = (int)(sizeof tpk_env_vars / sizeof tpk_env_vars[0]) };

/* The table's entry for name; NULL when the kit reads no such variable. */
static inline const tpk_env_var *tpk_env_find(const char *name) {
    for (int i = 0; name && i < TPK_ENV_NVARS; i++)
        if (!strcmp(tpk_env_vars[i].name, name)) return &tpk_env_vars[i];
    return NULL;
}

/* Whether word is one of the '|'-separated words. */
static inline bool tpk__env_word_in(const char *word, const char *words) {
    size_t n = strlen(word);
    for (const char *p = words; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t k = bar ? (size_t)(bar - p) : strlen(p);
        if (k == n && !strncmp(p, word, n)) return true;
        p = bar ? bar + 1 : NULL;
    }
    return false;
}

/* Check value (not NULL, not empty) against v: TPK_OK, or TPK_ERR_ARG naming the variable, the
 * value and what is expected. */
static inline tpk_status tpk_env_check_value(tpk_ctx *ctx, const tpk_env_var *v,
                                             const char *value) {
    static const char *fn = "tpk_env_check";
    if (!v || !value) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", v ? "value" : "v");
    char *end = NULL;
    switch (v->kind) {
    case TPK_ENV_INT: {
        errno = 0;
        long long x = strtoll(value, &end, 10);
        if (end != value && !*end && errno == 0 && x >= (long long)v->lo &&
            x <= (long long)v->hi)
            return TPK_OK;
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "%s: expected a whole number in [%.0f, %.0f] (%s), got \"%s\"", v->name,
                         v->lo, v->hi, v->what, value);
    }
    case TPK_ENV_NUMBER: {
        double x = strtod(value, &end);
        if (end != value && !*end && isfinite(x) && x >= v->lo && x <= v->hi) return TPK_OK;
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected a number in [%g, %g] (%s), got \"%s\"",
                         v->name, v->lo, v->hi, v->what, value);
    }
    case TPK_ENV_WORD:
        if (tpk__env_word_in(value, v->words)) return TPK_OK;
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected one of %s (%s), got \"%s\"", v->name,
                         v->words, v->what, value);
    case TPK_ENV_RANK_S: {
        int r = -1, used = 0;
        double sec = 0;
        if (sscanf(value, "%d:%lf%n", &r, &sec, &used) == 2 && !value[used] && r >= 0 &&
            sec > v->lo && sec < v->hi)
            return TPK_OK;
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "%s: expected R:S, a world rank R >= 0 and seconds S in (%g, %g) (%s), "
                         "got \"%s\"",
                         v->name, v->lo, v->hi, v->what, value);
    }
    }
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "v->kind: expected a tpk_env_kind, got %d",
                     (int)v->kind);
}

/* Check every variable of the table that is set (and not empty). Not collective: each rank checks
 * its own environment. */
static inline tpk_status tpk_env_check(tpk_ctx *ctx) {
    for (int i = 0; i < TPK_ENV_NVARS; i++) {
        const char *value = getenv(tpk_env_vars[i].name);
        if (value && *value) TPK_TRY(tpk_env_check_value(ctx, &tpk_env_vars[i], value));
    }
    return TPK_OK;
}

/* *out = the numeric variable name's value (checked: TPK_ERR_ARG as tpk_env_check), or def when
 * it is unset or empty. */
static inline tpk_status tpk_env_number(tpk_ctx *ctx, const char *name, double def, double *out) {
    const tpk_env_var *v = tpk_env_find(name);
    if (!v || (v->kind != TPK_ENV_INT && v->kind != TPK_ENV_NUMBER))
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_env_number",
                         "name: expected a numeric variable of tpk_env_vars, got \"%s\"",
                         name ? name : "(null)");
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_env_number", "out: NULL");
    const char *value = getenv(name);
    *out = def;
    if (!value || !*value) return TPK_OK;
    TPK_TRY(tpk_env_check_value(ctx, v, value));
    *out = strtod(value, NULL);
    return TPK_OK;
}

#endif /* TPK_BASE_ENV_H */
