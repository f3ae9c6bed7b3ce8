/* tpk/train/ckpt_folder.h — a trainer's checkpoint folder --save DIR: probed before training (DIR
 * made with its parents, a file written, flushed and removed in it), so a bad path fails before
 * the first step, not after the last; DIR/step-K the checkpoints of --save-every K, the newest N
 * kept (--keep N: the others removed oldest first by tpk_hf_remove, which leaves a user's other
 * files); the tokenizer's files copied beside the model (a checkpoint that samples text); and
 * what a resume says (its step; an optimizer state that starts fresh where the checkpoint has
 * none). Every function works on the calling rank alone (world rank 0: the one writer). Needs
 * POSIX. */
#ifndef TPK_TRAIN_CKPT_FOLDER_H
#define TPK_TRAIN_CKPT_FOLDER_H

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf.h"

/* DIR made (mkdir -p) and a probe file written and removed in it; false with the message in err
 * ("--save: cannot create ...", "--save DIR: cannot write in it (...)"). */
static inline bool tpk_ckpt_probe(const char *dir, char *err, size_t n) {
    char p[4096], f[4200];
    if (!dir || !*dir) return snprintf(err, n, "--save: expected a folder, got none"), false;
    if (strlen(dir) >= sizeof p)
        return snprintf(err, n, "--save: a path of at most %zu characters, got %zu", sizeof p - 1,
                        strlen(dir)),
               false;
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1;; c++) /* each parent, then DIR */
        if (*c == '/' || !*c) {
            char end = *c;
            *c = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return snprintf(err, n, "--save: cannot create %.900s (%s)", p, strerror(errno)),
                       false;
            *c = end;
            if (!end) break;
        }
    snprintf(f, sizeof f, "%s/.train-probe-%ld", dir, (long)getpid());
    FILE *pf = fopen(f, "w");
    bool ok = pf && fputs("probe\n", pf) >= 0 && fflush(pf) == 0;
    int e = errno;
    if (pf) ok = fclose(pf) == 0 && ok, remove(f);
    if (!ok)
        return snprintf(err, n, "--save %s: cannot write in it (%s)", dir,
                        strerror(pf ? e : errno)),
               false;
    return true;
}

/* DIR/step-K into out. */
static inline const char *tpk_ckpt_step_dir(char *out, size_t n, const char *dir, int64_t step) {
    snprintf(out, n, "%s/step-%lld", dir, (long long)step);
    return out;
}

static inline int tpk__ckpt_cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* The checkpoints DIR/step-K (K a whole number, written as such) beyond the newest keep removed,
 * oldest first. */
static inline tpk_status tpk_ckpt_keep_last(tpk_ctx *ctx, const char *dir, int64_t keep) {
    static const char *fn = "tpk_ckpt_keep_last";
    if (!ctx) return TPK_ERR_ARG;
    if (!dir || keep < 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s", !dir ? "dir: NULL" : "keep: expected >= 1");
    DIR *d = opendir(dir);
    if (!d)
        return tpk__fail(ctx, TPK_ERR_IO, "--keep", "%s: cannot list: %s", dir, strerror(errno));
    long long *k = NULL, v;
    size_t nk = 0, cap = 0;
    bool nomem = false;
    char tail, num[32];
    for (struct dirent *e; !nomem && (e = readdir(d));)
        if (sscanf(e->d_name, "step-%lld%c", &v, &tail) == 1 && v >= 0 &&
            !strcmp(e->d_name + 5, (snprintf(num, sizeof num, "%lld", v), num))) {
            size_t was = sizeof *k * cap;
            long long *g = nk < cap ? k
                                    : (long long *)tpk__realloc(ctx, k, was,
                                                                sizeof *k * (cap = cap ? 2 * cap
                                                                                       : 64));
            if (!g) nomem = true;
            else k = g, k[nk++] = v;
        }
    closedir(d);
    tpk_status s =
        nomem ? tpk__fail(ctx, TPK_ERR_NOMEM, "--keep", "the list of %s's checkpoints", dir)
              : TPK_OK;
    if (nk > 1) qsort(k, nk, sizeof *k, tpk__ckpt_cmp_ll);
    for (size_t i = 0; s == TPK_OK && i + (size_t)keep < nk; i++) { /* the oldest nk - keep */
        char sub[1100];
        s = tpk_hf_remove(ctx, tpk_ckpt_step_dir(sub, sizeof sub, dir, k[i]));
    }
    tpk__free(ctx, k);
    return s;
}

/* The tokenizer's files (tokenizer.json, or vocab.json and merges.txt, from the folder `from`, or
 * the file itself) copied into dir where it has none of its own. */
static inline tpk_status tpk_ckpt_copy_tokenizer(tpk_ctx *ctx, const char *from, const char *dir) {
    static const char *fn = "tpk_ckpt_copy_tokenizer";
    static const char *const names[3] = {"tokenizer.json", "vocab.json", "merges.txt"};
    if (!ctx) return TPK_ERR_ARG;
    if (!from || !dir) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", from ? "dir" : "from");
    struct stat st;
    char a[1100], b[1100];
    bool folder = stat(from, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(a, sizeof a, "%.1000s/tokenizer.json", from);
    int k0 = !folder || stat(a, &st) == 0 ? 0 : 1, k1 = k0 ? 3 : 1; /* which files to copy */
    for (int k = k0; k < k1; k++) {
        if (folder) snprintf(a, sizeof a, "%.1000s/%s", from, names[k]);
        else snprintf(a, sizeof a, "%.1000s", from);
        snprintf(b, sizeof b, "%.1000s/%s", dir, names[k]);
        if (stat(b, &st) == 0) continue; /* the checkpoint's folder has its own */
        uint8_t *buf = NULL;
        size_t n = 0;
        TPK_TRY(tpk__read_file(ctx, fn, a, &buf, &n));
        FILE *f = fopen(b, "wb");
        bool ok = f && fwrite(buf, 1, n, f) == n;
        ok = (f && fclose(f) == 0) && ok;
        tpk_free(ctx, buf);
        if (!ok) {
            remove(b);
            return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write: %s", b, strerror(errno));
        }
    }
    return TPK_OK;
}

/* What a resume from dir at `step` says on out: "resumed from DIR at step K", and, training,
 * "optimizer state starts fresh at step K (DIR has no optim.safetensors)" where it has none
 * (never a silent restart). Nothing at step 0. */
static inline tpk_status tpk_ckpt_resume_note(tpk_ctx *ctx, const char *dir, int64_t step,
                                              bool training, FILE *out) {
    if (!ctx) return TPK_ERR_ARG;
    if (!dir || !out)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_ckpt_resume_note", "%s: NULL", dir ? "out" : "dir");
    if (!step) return TPK_OK;
    fprintf(out, "resumed from %s at step %lld\n", dir, (long long)step);
    tpk_hf_info info;
    if (training && tpk_hf_info_read(ctx, dir, &info) == TPK_OK && !info.has_optim)
        fprintf(out, "optimizer state starts fresh at step %lld (%s has no optim.safetensors)\n",
                (long long)step, info.dir);
    return TPK_OK;
}

#endif /* TPK_TRAIN_CKPT_FOLDER_H */
