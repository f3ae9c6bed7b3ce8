/* tpk/train/flags.h — command-line flags as a table of values: each flag a name, a kind, a range,
 * a default, a usage heading and help, and the offset of its field in the program's options
 * struct. One parser and one usage printer over tables, so that programs sharing a table (the
 * trainer's, tpk/train/options.h) accept the same values with the same messages:
 *   --name: expected an integer in [lo, hi], got "v"     (INT; "(out of range)" when a number)
 *   --name: expected a number in [lo, hi], got "v"       (NUM)
 *   --name: expected a or b, got "v"                     (CHOICE over "a|b"; or the flag's expect)
 *   --name: expects a value[, got an empty string | the flag --other]
 *   unknown argument "--x" (--help lists them)
 * A value is never empty nor one of the accepted flags. Fields by kind: STR and CHOICE const char
 * *, INT int64_t, NUM double, BOOL bool, LIST tpk_flag_list (every "--name value" of the entries
 * sharing its offset, checked by the program later: a model family's own flags). Defaults: an
 * INT's or NUM's def parsed, else -1 ("not given"; every range starts at 0 or above); a STR's def
 * or NULL; false; an empty list. Plain C over the table: no macros; no allocation. */
#ifndef TPK_TRAIN_FLAGS_H
#define TPK_TRAIN_FLAGS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum tpk_flag_kind {
    TPK_FLAG_STR,
    TPK_FLAG_CHOICE,
    TPK_FLAG_INT,
    TPK_FLAG_NUM,
    TPK_FLAG_BOOL,
    TPK_FLAG_LIST
} tpk_flag_kind;

typedef struct tpk_flag {
    const char *name; /* "--layers" */
    tpk_flag_kind kind;
    double lo, hi;       /* INT, NUM: the values accepted */
    const char *def;     /* the default as text (NULL: none; the usage shows it) */
    const char *meta;    /* the usage's placeholder when there is no default ("DIR"); CHOICE: the
                            choices, "a|b|c" */
    const char *expect;  /* the error's words after "expected " (NULL: from the kind and range) */
    unsigned cls;        /* its class: a set accepts the classes of its mask */
    const char *heading; /* the usage line it is listed on ("model") */
    const char *help;    /* the usage's words after it, in parentheses (NULL: none) */
    size_t off;          /* its field in the options struct */
} tpk_flag;

/* A LIST field: the flags given, in order. */
typedef struct tpk_flag_list {
    struct {
        const char *flag, *value;
    } v[16];
    int n;
} tpk_flag_list;

/* A table's flags of the classes in mask, stored into *dst. */
typedef struct tpk_flag_set {
    const tpk_flag *flags;
    int n;
    unsigned mask;
    void *dst;
} tpk_flag_set;

/* The flag of the sets named `name` (the first; NULL: none), and its set in *set (may be NULL). */
static inline const tpk_flag *tpk_flags_find(const tpk_flag_set *sets, int nsets, const char *name,
                                             const tpk_flag_set **set) {
    for (int s = 0; name && s < nsets; s++)
        for (int i = 0; i < sets[s].n; i++)
            if ((sets[s].flags[i].cls & sets[s].mask) && !strcmp(sets[s].flags[i].name, name)) {
                if (set) *set = &sets[s];
                return &sets[s].flags[i];
            }
    return NULL;
}

/* Every field of the sets at its default (the header says which). */
static inline void tpk_flags_defaults(const tpk_flag_set *sets, int nsets) {
    for (int s = 0; s < nsets; s++)
        for (int i = 0; i < sets[s].n; i++) {
            const tpk_flag *f = &sets[s].flags[i];
            char *p = (char *)sets[s].dst + f->off;
            if (!(f->cls & sets[s].mask)) continue;
            double x = f->def ? strtod(f->def, NULL) : -1;
            switch (f->kind) {
                case TPK_FLAG_INT: *(int64_t *)p = (int64_t)x; break;
                case TPK_FLAG_NUM: *(double *)p = x; break;
                case TPK_FLAG_BOOL: *(bool *)p = false; break;
                case TPK_FLAG_LIST: ((tpk_flag_list *)p)->n = 0; break;
                default: *(const char **)p = f->def; break;
            }
        }
}

/* "a or b", "a, b or c" of the choices "a|b|c" into buf. */
static inline const char *tpk_flags_choices(const char *choices, char *buf, size_t n) {
    size_t k = 0, m = strlen(choices), bars = 0;
    for (size_t i = 0; i < m; i++) bars += choices[i] == '|';
    buf[0] = 0;
    for (size_t i = 0, seen = 0; i < m && k + 5 < n; i++) {
        if (choices[i] != '|') {
            buf[k++] = choices[i];
            continue;
        }
        const char *sep = ++seen == bars ? " or " : ", ";
        for (const char *c = sep; *c && k + 1 < n; c++) buf[k++] = *c;
    }
    buf[k < n ? k : n - 1] = 0;
    return buf;
}

/* Whether v is one of the choices "a|b|c". */
static inline bool tpk_flags_is_choice(const char *choices, const char *v) {
    size_t lv = strlen(v);
    for (const char *c = choices; *c;) {
        const char *bar = strchr(c, '|');
        size_t l = bar ? (size_t)(bar - c) : strlen(c);
        if (l == lv && !strncmp(c, v, l)) return true;
        c += l + (bar ? 1 : 0);
    }
    return false;
}

/* The value v of flag f into its field; false with the message in err. */
static inline bool tpk_flags_store(const tpk_flag *f, void *dst, const char *v, char *err,
                                   size_t n) {
    char *p = (char *)dst + f->off, *end = NULL, buf[160];
    if (f->kind == TPK_FLAG_STR) return *(const char **)p = v, true;
    if (f->kind == TPK_FLAG_CHOICE) {
        if (!tpk_flags_is_choice(f->meta, v))
            return snprintf(err, n, "%s: expected %s, got \"%s\"", f->name,
                            f->expect ? f->expect : tpk_flags_choices(f->meta, buf, sizeof buf), v),
                   false;
        return *(const char **)p = v, true;
    }
    if (f->kind == TPK_FLAG_LIST) {
        tpk_flag_list *l = (tpk_flag_list *)p;
        if (l->n == 16) return snprintf(err, n, "%s: too many flags of this kind", f->name), false;
        l->v[l->n].flag = f->name, l->v[l->n++].value = v;
        return true;
    }
    bool is_int = f->kind == TPK_FLAG_INT;
    double x = is_int ? (double)strtoll(v, &end, 10) : strtod(v, &end);
    if (end == v || *end || !(x >= f->lo && x <= f->hi)) {
        if (f->expect) snprintf(buf, sizeof buf, "%s", f->expect);
        else if (is_int)
            snprintf(buf, sizeof buf, "an integer in [%lld, %lld]", (long long)f->lo,
                     (long long)f->hi);
        else snprintf(buf, sizeof buf, "a number in [%g, %g]", f->lo, f->hi);
        return snprintf(err, n, "%s: expected %s, got \"%s\"%s", f->name, buf, v,
                        is_int && end != v && !*end && !f->expect ? " (out of range)" : ""),
               false;
    }
    if (is_int) *(int64_t *)p = (int64_t)x;
    else *(double *)p = x;
    return true;
}

/* Parse argv[1..argc) into the sets' fields (their defaults first): 0; -1 for --help or -h; 1 with
 * the message in err (the program prefixes "PROG: error: "). rest (may be NULL: none accepted):
 * the arguments that are not flags, in order, *nrest of them (rest holds argc). */
static inline int tpk_flags_parse(const tpk_flag_set *sets, int nsets, int argc, char **argv,
                                  const char **rest, int *nrest, char *err, size_t n) {
    tpk_flags_defaults(sets, nsets);
    if (nrest) *nrest = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const tpk_flag_set *set = NULL;
        const tpk_flag *f = tpk_flags_find(sets, nsets, a, &set);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        if (!f && rest && nrest && a[0] != '-') {
            rest[(*nrest)++] = a;
            continue;
        }
        if (!f) return snprintf(err, n, "unknown argument \"%s\" (--help lists them)", a), 1;
        if (f->kind == TPK_FLAG_BOOL) {
            *(bool *)((char *)set->dst + f->off) = true;
            continue;
        }
        bool flag = v && (tpk_flags_find(sets, nsets, v, NULL) || !strcmp(v, "--help"));
        if (!v) return snprintf(err, n, "%s: expects a value", a), 1;
        if (!*v || flag)
            return snprintf(err, n, "%s: expects a value, got %s%s", a,
                            *v ? "the flag " : "an empty string", v),
                   1;
        if (!tpk_flags_store(f, set->dst, v, err, n)) return 1;
        i++;
    }
    return 0;
}

/* The usage: after `head` (a line or more), each heading's flags, every flag of the sets once as
 * "--name DEFAULT|META (help)", the words wrapped at 100 columns under the heading's column. */
static inline void tpk_flags_usage(FILE *out, const char *head, const tpk_flag_set *sets,
                                   int nsets) {
    fputs(head, out);
    const char *heading = NULL;
    int col = 0;
    for (int s = 0; s < nsets; s++)
        for (int i = 0; i < sets[s].n; i++) {
            const tpk_flag *f = &sets[s].flags[i];
            if (!(f->cls & sets[s].mask)) continue;
            char item[600];
            const char *val = f->def ? f->def : f->meta;
            snprintf(item, sizeof item, "%s%s%s%s%s%s", f->name, val ? " " : "", val ? val : "",
                     f->help ? " (" : "", f->help ? f->help : "", f->help ? ")" : "");
            if (!heading || strcmp(heading, f->heading)) {
                char h[40];
                snprintf(h, sizeof h, "%s:", f->heading);
                fprintf(out, "%s  %-11s", heading ? "\n" : "", h);
                col = 13, heading = f->heading;
            }
            for (const char *w = item; *w;) { /* word by word */
                size_t len = strcspn(w, " ");
                if (col > 13 && col + 1 + (int)len > 100) fprintf(out, "\n%13s", ""), col = 13;
                fprintf(out, " %.*s", (int)len, w);
                col += 1 + (int)len, w += len;
                while (*w == ' ') w++;
            }
        }
    if (heading) fputc('\n', out);
}

#endif /* TPK_TRAIN_FLAGS_H */
