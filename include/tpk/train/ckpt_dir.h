/* tpk/train/ckpt_dir.h — a checkpoint directory, replaced whole or not at all.
 *
 * A save of DIR writes its files into DIR.tpk-new, then swaps it in by two renames:
 *   DIR -> DIR.tpk-old   (when DIR exists)
 *   DIR.tpk-new -> DIR
 * each followed by an fsync of the parent; then DIR.tpk-old's entries that are not checkpoint
 * files (tpk_ckpt_is_file: a user's README, a Hugging Face folder's tokenizer files, a trainer's
 * step-N directories) are carried into DIR by rename and the rest removed. A stop leaves one of
 * three states, each read as one whole checkpoint:
 *   DIR.tpk-new beside DIR     before the swap: DIR is the old checkpoint
 *   DIR.tpk-old without DIR    between the renames: DIR.tpk-old is the checkpoint
 *                              (tpk_ckpt_resolve: what a load reads)
 *   DIR.tpk-old beside DIR     after the swap: DIR is the new checkpoint
 * and the next save repairs it first (tpk_ckpt_repair). Every function here works on one rank
 * (world rank 0, the only writer); tpk/train/ckpt.h's collective save and load use them. A
 * checkpoint id is a random 64-bit number as 16 hex digits, stamped into every file of one save
 * so that a load can tell files of two checkpoints apart. Nothing is ever removed or moved
 * through a symbolic link: DIR, DIR.tpk-old or DIR.tpk-new a link (lstat) is refused, naming it,
 * before anything is touched. */
#ifndef TPK_CKPT_DIR_H
#define TPK_CKPT_DIR_H

#include <dirent.h>
#include <time.h>

#include "../base/rng.h"
#include "safetensors.h"

#if !defined(__cplusplus) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE) &&                \
    (!defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 200112L)
/* POSIX.1-2001; strict C11's <sys/stat.h> hides it (also -pthread's _POSIX_C_SOURCE 199506L) */
int lstat(const char *path, struct stat *st);
#endif
#ifndef S_ISLNK
#define S_ISLNK(m) (((m) & 0170000) == 0120000) /* POSIX's value of S_IFLNK */
#endif

/* A checkpoint path's names, trailing slashes dropped: base (the checkpoint), old
 * (base.tpk-old: the previous checkpoint while a save swaps the two), tmp (base.tpk-new: a save's
 * files until the swap) and parent (base's parent directory, fsynced after each rename). */
typedef struct tpk_ckpt_paths {
    char base[1024], old[1040], tmp[1040], parent[1024];
} tpk_ckpt_paths;

/* dir's names into *p; TPK_ERR_ARG for an empty path, one of 1024 bytes or more, or one whose
 * last name is "." or ".." or "/" (the checkpoint is replaced by rename: it needs a name). */
static inline tpk_status tpk__ckpt_paths_of(tpk_ctx *ctx, const char *fn, const char *dir,
                                            tpk_ckpt_paths *p) {
    if (!ctx) return TPK_ERR_ARG;
    if (!p) return tpk__fail(ctx, TPK_ERR_ARG, fn, "p: NULL");
    memset(p, 0, sizeof *p);
    size_t n = dir ? strlen(dir) : 0;
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n == 0 || n >= sizeof p->base)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "dir \"%.40s\": expected a path of 1..%zu bytes",
                         dir ? dir : "(NULL)", sizeof p->base - 1);
    memcpy(p->base, dir, n), p->base[n] = 0;
    snprintf(p->old, sizeof p->old, "%s.tpk-old", p->base);
    snprintf(p->tmp, sizeof p->tmp, "%s.tpk-new", p->base);
    const char *slash = strrchr(p->base, '/'), *last = slash ? slash + 1 : p->base;
    if (!slash) snprintf(p->parent, sizeof p->parent, ".");
    else
        snprintf(p->parent, sizeof p->parent, "%.*s", slash == p->base ? 1 : (int)(slash - p->base),
                 p->base);
    if (!strcmp(last, ".") || !strcmp(last, "..") || !*last)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "dir \"%s\": expected a path ending in the checkpoint directory's name, not \"%s\"",
            p->base, *last ? last : "/");
    return TPK_OK;
}
static inline tpk_status tpk_ckpt_paths_of(tpk_ctx *ctx, const char *dir, tpk_ckpt_paths *p) {
    return tpk__ckpt_paths_of(ctx, "tpk_ckpt_paths_of", dir, p);
}

/* The directory a load of dir reads into out[n]: dir when it holds config.json, else
 * dir.tpk-old when that does (a save stopped between its two renames: the previous checkpoint is
 * the checkpoint), else dir (whose error then names it). */
static inline tpk_status tpk_ckpt_resolve(tpk_ctx *ctx, const char *dir, char *out, size_t n) {
    static const char *fn = "tpk_ckpt_resolve";
    if (!ctx) return TPK_ERR_ARG;
    if (!out || n == 0) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: expected a buffer");
    if (!dir) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dir: NULL");
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    if (len == 0 || len >= 1024 || len + 9 > n)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "dir \"%.40s\": expected a path of 1..1023 bytes (out: %zu bytes)", dir,
                         n);
    char cj[1100];
    snprintf(out, n, "%.*s", (int)len, dir);
    snprintf(cj, sizeof cj, "%.*s/config.json", (int)len, dir);
    if (access(cj, F_OK) == 0) return TPK_OK;
    snprintf(cj, sizeof cj, "%.*s.tpk-old/config.json", (int)len, dir);
    if (access(cj, F_OK) == 0) snprintf(out, n, "%.*s.tpk-old", (int)len, dir);
    return TPK_OK;
}

/* Whether a directory entry is one of a checkpoint's files, replaced and removed with it:
 * config.json, optim.safetensors, fp8.safetensors, model*.safetensors (model.safetensors, Hugging
 * Face's shards model-K-of-N.safetensors), model.safetensors.index.json, and a killed writer's
 * temporaries "<one of these>.tmp.<pid>". Everything else in a checkpoint directory is the
 * user's. */
static inline bool tpk_ckpt_is_file(const char *name) {
    if (!name) return false;
    const char *t = strstr(name, ".tmp.");
    size_t n = t ? (size_t)(t - name) : strlen(name);
    if (t) {
        const char *d = t + 5;
        if (!*d) return false;
        for (; *d; d++)
            if (*d < '0' || *d > '9') return false;
    }
    static const char *const exact[] = {"config.json", "optim.safetensors", "fp8.safetensors",
                                        "model.safetensors.index.json"};
    for (int k = 0; k < 4; k++)
        if (n == strlen(exact[k]) && !strncmp(name, exact[k], n)) return true;
    return n >= 17 && !strncmp(name, "model", 5) && !strncmp(name + n - 12, ".safetensors", 12);
}

/* Whether path is a symbolic link (lstat: the link itself, never what it points to). */
static inline bool tpk__ckpt_is_link(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}
/* An error naming path when it is a symbolic link: a checkpoint's directories are never
 * followed out of their own folder. */
static inline tpk_status tpk__ckpt_no_link(tpk_ctx *ctx, const char *fn, const char *path) {
    if (!tpk__ckpt_is_link(path)) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_IO, fn,
                     "%s: a symbolic link: a checkpoint's folder is never followed through a "
                     "link (give the folder it points to, or remove the link)",
                     path);
}

/* fsync a directory (its renames durable); EINVAL: a filesystem that cannot, accepted. */
static inline bool tpk__ckpt_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return false;
    bool ok = fsync(fd) == 0 || errno == EINVAL;
    close(fd);
    return ok;
}

/* Remove dir's checkpoint files (tpk_ckpt_is_file), then dir when nothing else is in it; *kept
 * (may be NULL) tells whether dir stayed for the other entries. A missing dir: nothing to do.
 * ctx may be NULL (a cleanup whose error is not reported). */
static inline tpk_status tpk__ckpt_remove(tpk_ctx *ctx, const char *fn, const char *dir,
                                          bool *kept) {
    if (kept) *kept = false;
    TPK_TRY(tpk__ckpt_no_link(ctx, fn, dir));
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT
                   ? TPK_OK
                   : tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot list: %s", dir, strerror(errno));
    int others = 0;
    tpk_status s = TPK_OK;
    char path[1400];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (!tpk_ckpt_is_file(e->d_name)) { others++; continue; }
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT && s == TPK_OK)
            s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot remove: %s", path, strerror(errno));
    }
    closedir(d);
    if (s == TPK_OK && !others && rmdir(dir) != 0)
        s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot remove: %s", dir, strerror(errno));
    if (kept) *kept = others > 0;
    return s;
}

/* Remove the checkpoint saved in dir: its files (config.json, the model and optimizer files),
 * then dir when it holds nothing else; a user's other files, and dir with them, stay. One rank
 * (a trainer keeping the last K checkpoints calls it on world rank 0). A missing dir is not an
 * error. */
static inline tpk_status tpk_ckpt_remove(tpk_ctx *ctx, const char *dir) {
    tpk_ckpt_paths p;
    TPK_TRY(tpk__ckpt_paths_of(ctx, "tpk_ckpt_remove", dir, &p));
    return tpk__ckpt_remove(ctx, "tpk_ckpt_remove", p.base, NULL);
}

/* Move every entry of `from` that is not a checkpoint file into `to`, where none of that name
 * is (`to`'s own one wins; `from` keeps the other). */
static inline tpk_status tpk__ckpt_carry(tpk_ctx *ctx, const char *fn, const char *from,
                                         const char *to) {
    TPK_TRY(tpk__ckpt_no_link(ctx, fn, from));
    TPK_TRY(tpk__ckpt_no_link(ctx, fn, to));
    DIR *d = opendir(from);
    if (!d) return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot list: %s", from, strerror(errno));
    tpk_status s = TPK_OK;
    char a[1400], b[1400];
    struct stat st;
    for (struct dirent *e; (e = readdir(d)) && s == TPK_OK;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || tpk_ckpt_is_file(e->d_name))
            continue;
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        if (stat(b, &st) == 0) continue;
        if (rename(a, b) != 0)
            s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot move to %s: %s", a, b, strerror(errno));
    }
    closedir(d);
    return s;
}

/* Finish or undo what a stopped save of dir left (one rank; before the next save): base missing
 * and base.tpk-old present: the old checkpoint renamed back; both present: the new checkpoint is
 * in place, the old one's other entries are carried into it and the rest removed; base.tpk-new
 * (never swapped in) removed. An old or new directory that holds entries of the user's that
 * cannot go anywhere is an error naming it. Nothing to repair: TPK_OK. */
static inline tpk_status tpk__ckpt_repair(tpk_ctx *ctx, const char *fn, const tpk_ckpt_paths *p) {
    struct stat st;
    TPK_TRY(tpk__ckpt_no_link(ctx, fn, p->base));
    TPK_TRY(tpk__ckpt_no_link(ctx, fn, p->old));
    TPK_TRY(tpk__ckpt_no_link(ctx, fn, p->tmp));
    bool base = stat(p->base, &st) == 0, old = stat(p->old, &st) == 0, kept = false;
    if (old && !base) {
        if (rename(p->old, p->base) != 0)
            return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot rename back to %s: %s", p->old,
                             p->base, strerror(errno));
        if (!tpk__ckpt_fsync_dir(p->parent))
            return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: fsync failed: %s", p->parent,
                             strerror(errno));
    } else if (old) {
        TPK_TRY(tpk__ckpt_carry(ctx, fn, p->old, p->base));
        TPK_TRY(tpk__ckpt_remove(ctx, fn, p->old, &kept));
        if (kept)
            return tpk__fail(
                ctx, TPK_ERR_IO, fn,
                "%s: left by an earlier save, holds entries %s also has: move or remove them",
                p->old, p->base);
    }
    TPK_TRY(tpk__ckpt_remove(ctx, fn, p->tmp, &kept));
    if (kept)
        return tpk__fail(ctx, TPK_ERR_IO, fn,
                         "%s: expected only a stopped save's files there (remove the directory)",
                         p->tmp);
    return TPK_OK;
}
static inline tpk_status tpk_ckpt_repair(tpk_ctx *ctx, const char *dir) {
    tpk_ckpt_paths p;
    TPK_TRY(tpk__ckpt_paths_of(ctx, "tpk_ckpt_repair", dir, &p));
    return tpk__ckpt_repair(ctx, "tpk_ckpt_repair", &p);
}

/* Start a save of dir (one rank): dir's names into *p, what a stopped save left repaired, and an
 * empty p->tmp (dir.tpk-new) made for the files; dir, when it exists, must be a directory. */
static inline tpk_status tpk__ckpt_begin(tpk_ctx *ctx, const char *fn, const char *dir,
                                         tpk_ckpt_paths *p) {
    struct stat st;
    TPK_TRY(tpk__ckpt_paths_of(ctx, fn, dir, p));
    TPK_TRY(tpk__ckpt_repair(ctx, fn, p));
    if (stat(p->base, &st) == 0 && !S_ISDIR(st.st_mode))
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: exists and is not a directory", p->base);
    if (mkdir(p->tmp, 0755) != 0)
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot create: %s", p->tmp, strerror(errno));
    return TPK_OK;
}
static inline tpk_status tpk_ckpt_begin(tpk_ctx *ctx, const char *dir, tpk_ckpt_paths *p) {
    return tpk__ckpt_begin(ctx, "tpk_ckpt_begin", dir, p);
}

/* Give up a save begun with tpk_ckpt_begin (one rank): p->tmp's checkpoint files and p->tmp
 * removed; dir stays as it was. */
static inline tpk_status tpk_ckpt_abort(tpk_ctx *ctx, const tpk_ckpt_paths *p) {
    if (!ctx) return TPK_ERR_ARG;
    if (!p) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_ckpt_abort", "p: NULL");
    return tpk__ckpt_remove(ctx, "tpk_ckpt_abort", p->tmp, NULL);
}

/* Swap the files written into p->tmp in for p->base (one rank): p->tmp fsynced; base (when it
 * exists) renamed to base.tpk-old, base.tpk-new to base, the parent fsynced, the old directory's
 * other entries carried over, the old checkpoint removed. A failure before the second rename
 * leaves base as it was; one after it is an error saying the checkpoint was saved. */
static inline tpk_status tpk__ckpt_commit(tpk_ctx *ctx, const char *fn, const tpk_ckpt_paths *p) {
    if (!ctx) return TPK_ERR_ARG;
    if (!p || !p->base[0]) return tpk__fail(ctx, TPK_ERR_ARG, fn, "p: expected tpk_ckpt_begin's");
    TPK_TRY(tpk__ckpt_no_link(ctx, fn, p->base));
    TPK_TRY(tpk__ckpt_no_link(ctx, fn, p->old));
    TPK_TRY(tpk__ckpt_no_link(ctx, fn, p->tmp));
    if (!tpk__ckpt_fsync_dir(p->tmp))
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: fsync failed: %s", p->tmp, strerror(errno));
    struct stat st;
    bool had = stat(p->base, &st) == 0;
    if (had && rename(p->base, p->old) != 0)
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot rename to %s: %s", p->base, p->old,
                         strerror(errno));
    if (rename(p->tmp, p->base) != 0) {
        tpk_status s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot rename to %s: %s", p->tmp,
                                 p->base, strerror(errno));
        if (had) rename(p->old, p->base);
        return s;
    }
    if (!tpk__ckpt_fsync_dir(p->parent))
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: saved, but fsync of %s failed: %s", p->base,
                         p->parent, strerror(errno));
    if (!had) return TPK_OK;
    bool kept = false;
    TPK_TRY(tpk__ckpt_carry(ctx, fn, p->old, p->base));
    if (!tpk__ckpt_fsync_dir(p->base))
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: saved, but fsync failed: %s", p->base,
                         strerror(errno));
    TPK_TRY(tpk__ckpt_remove(ctx, fn, p->old, &kept));
    if (kept)
        return tpk__fail(ctx, TPK_ERR_IO, fn,
                         "%s: saved, but %s keeps entries %s also has: move or remove them",
                         p->base, p->old, p->base);
    if (!tpk__ckpt_fsync_dir(p->parent))
        return tpk__fail(ctx, TPK_ERR_IO, fn, "%s: saved, but fsync of %s failed: %s", p->base,
                         p->parent, strerror(errno));
    return TPK_OK;
}
static inline tpk_status tpk_ckpt_commit(tpk_ctx *ctx, const tpk_ckpt_paths *p) {
    return tpk__ckpt_commit(ctx, "tpk_ckpt_commit", p);
}

/* A new random checkpoint id, 16 hex digits and a NUL into out[17]: /dev/urandom, or the time,
 * the PID and an address mixed where it cannot be read. */
static inline void tpk_ckpt_new_id(char out[17]) {
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    bool ok = fd >= 0 && read(fd, &x, sizeof x) == (ssize_t)sizeof x;
    if (fd >= 0) close(fd);
    if (!ok) {
        tpk_u32x4 r = tpk_philox((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32),
                                 (uint64_t)(uintptr_t)&x, (uint64_t)clock());
        x = (uint64_t)r.v[0] << 32 | r.v[1];
    }
    snprintf(out, 17, "%016llx", (unsigned long long)x);
}

/* text to path atomically (one rank): a temporary "<path>.tmp.<pid>" written, fsynced and
 * renamed over path. */
static inline tpk_status tpk__ckpt_write_text(tpk_ctx *ctx, const char *fn, const char *path,
                                              const char *text) {
    if (!ctx) return TPK_ERR_ARG;
    if (!path || !text) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !path ? "path" : "text");
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    bool ok = fd >= 0 && tpk__st_write_all(fd, text, strlen(text)) && fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (ok) return TPK_OK;
    tpk_status s = tpk__fail(ctx, TPK_ERR_IO, fn, "%s: cannot write: %s", path, strerror(errno));
    unlink(tmp);
    return s;
}
static inline tpk_status tpk_ckpt_write_text(tpk_ctx *ctx, const char *path, const char *text) {
    return tpk__ckpt_write_text(ctx, "tpk_ckpt_write_text", path, text);
}

#endif /* TPK_CKPT_DIR_H */
