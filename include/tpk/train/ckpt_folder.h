/* tpk/train/ckpt_folder.h — a trainer's checkpoint folder --save DIR: probed before training, so
 * a bad path fails before the first step, not after the last: DIR, DIR.tpk-old, DIR.tpk-new and
 * DIR.tpk-lock must not be symbolic links (nothing is removed or moved through one); DIR is made
 * with its parents, a file written, flushed and removed in it; the lock DIR.tpk-lock taken (made
 * with O_EXCL, holding "host pid start": a second run saving into DIR is refused; a lock whose
 * process is gone on this host is stale and taken over; released at exit); what a stopped save
 * left (DIR.tpk-new, DIR.tpk-old, the same of each DIR/step-K) checked as the save will check it.
 * DIR/step-K the checkpoints of --save-every K, the newest N of this run's kept (--keep N: the
 * others removed oldest first by tpk_hf_remove, which leaves a user's other files; a directory
 * named step-K that is no checkpoint, a link, or one that was there when the probe ran, is never
 * removed nor counted); the tokenizer's files copied beside the model (a checkpoint that samples
 * text); and what a resume says (its step; an optimizer state that starts fresh where the
 * checkpoint has none). Every function works on the calling rank alone (world rank 0: the one
 * writer). Needs POSIX. */
#ifndef TPK_TRAIN_CKPT_FOLDER_H
#define TPK_TRAIN_CKPT_FOLDER_H

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf.h"

#if !defined(__cplusplus) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE) &&                \
    (!defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 200112L)
/* POSIX.1-2001; strict C11's headers hide them (also -pthread's _POSIX_C_SOURCE 199506L) */
int kill(pid_t pid, int sig);
int gethostname(char *name, size_t len);
#endif

/* The message fmt, ... into err[n] (cut to fit); false. */
static inline bool tpk__ckpt_say(char *err, size_t n, const char *fmt, ...) {
    va_list a;
    va_start(a, fmt);
    vsnprintf(err, n, fmt, a);
    va_end(a);
    return false;
}

/* The locks this process holds (DIR.tpk-lock paths and their text), released at exit. */
#define TPK__CKPT_LOCKS 8
static char tpk__ckpt_lock_path[TPK__CKPT_LOCKS][1100];
static char tpk__ckpt_lock_text[TPK__CKPT_LOCKS][400];
/* The step-K checkpoints each probed DIR held when it was probed (another run's: --keep never
 * removes nor counts them): DIR, then K and the checkpoint id of each. */
#define TPK__CKPT_SEEN 512
static char tpk__ckpt_seen_dir[TPK__CKPT_LOCKS][1100];
static int tpk__ckpt_seen_n[TPK__CKPT_LOCKS];
static long long tpk__ckpt_seen_step[TPK__CKPT_LOCKS][TPK__CKPT_SEEN];
static char tpk__ckpt_seen_id[TPK__CKPT_LOCKS][TPK__CKPT_SEEN][24];

/* A process's start time (field 22 of /proc/PID/stat, clock ticks since boot); 0 where it
 * cannot be read (then only whether the process lives decides). */
static inline unsigned long long tpk__ckpt_proc_start(long pid) {
    char p[64], b[1024];
    snprintf(p, sizeof p, "/proc/%ld/stat", pid);
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(b, 1, sizeof b - 1, f) : 0;
    if (f) fclose(f);
    b[n] = 0;
    char *c = strrchr(b, ')'); /* after the command's name, which may hold spaces */
    if (!c) return 0;
    int field = 2;
    for (; *c && field < 22; c++)
        if (*c == ' ') field++;
    return field == 22 ? strtoull(c, NULL, 10) : 0;
}
/* This process's lock text: "tpk-lock host H pid P start S\n". */
static inline void tpk__ckpt_lock_me(char *out, size_t n) {
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == ' ' || *c == '\n') *c = '_';
    snprintf(out, n, "tpk-lock host %s pid %ld start %llu\n", host, (long)getpid(),
             tpk__ckpt_proc_start((long)getpid()));
}
/* path's first bytes (at most n - 1) into out; false when it cannot be read. */
static inline bool tpk__ckpt_read_small(const char *path, char *out, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t k = fread(out, 1, n - 1, f);
    fclose(f);
    out[k] = 0;
    return true;
}
/* Whether the lock text t names a process that is gone: this host's, and its PID not running
 * (or running with another start time: a PID reused). A lock of another host is never stale. */
static inline bool tpk__ckpt_lock_stale(const char *t) {
    char host[256], me[400], mhost[256];
    long pid = 0;
    unsigned long long start = 0;
    if (sscanf(t, "tpk-lock host %255s pid %ld start %llu", host, &pid, &start) != 3 || pid <= 0)
        return false; /* not ours to judge: refused, the message says how to remove it */
    tpk__ckpt_lock_me(me, sizeof me);
    if (sscanf(me, "tpk-lock host %255s", mhost) != 1 || strcmp(host, mhost)) return false;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return true;
    unsigned long long now = tpk__ckpt_proc_start(pid);
    return start && now && now != start;
}
/* Remove the locks this process holds (each only while it still holds this process's text). */
static inline void tpk__ckpt_unlock_all(void) {
    char t[400];
    for (int k = 0; k < TPK__CKPT_LOCKS; k++)
        if (tpk__ckpt_lock_path[k][0]) {
            if (tpk__ckpt_read_small(tpk__ckpt_lock_path[k], t, sizeof t) &&
                !strcmp(t, tpk__ckpt_lock_text[k]))
                unlink(tpk__ckpt_lock_path[k]);
            tpk__ckpt_lock_path[k][0] = 0;
        }
}
/* Release the lock of --save dir taken by tpk_ckpt_probe (also done at exit); true when it was
 * held by this process. */
static inline bool tpk_ckpt_unlock(const char *dir) {
    tpk_ckpt_paths p;
    char lock[1100], t[400];
    size_t n = dir ? strlen(dir) : 0;
    if (!n || n >= sizeof p.base) return false;
    snprintf(p.base, sizeof p.base, "%.1000s", dir);
    while (n > 1 && p.base[n - 1] == '/') p.base[--n] = 0;
    snprintf(lock, sizeof lock, "%s.tpk-lock", p.base);
    for (int k = 0; k < TPK__CKPT_LOCKS; k++)
        if (!strcmp(tpk__ckpt_lock_path[k], lock)) {
            if (tpk__ckpt_read_small(lock, t, sizeof t) && !strcmp(t, tpk__ckpt_lock_text[k]))
                unlink(lock);
            tpk__ckpt_lock_path[k][0] = 0;
            return true;
        }
    return false;
}
/* Take lock (the path DIR.tpk-lock) for this process: made with O_EXCL; one held by this
 * process already: kept; a stale one (tpk__ckpt_lock_stale) moved aside, checked to be the one
 * read, and removed, then made again. false with the message in err. */
static inline bool tpk__ckpt_lock(const char *lock, const char *dir, char *err, size_t n) {
    char me[400], t[400], aside[1200];
    tpk__ckpt_lock_me(me, sizeof me);
    int slot = -1;
    for (int k = 0; k < TPK__CKPT_LOCKS; k++)
        if (!strcmp(tpk__ckpt_lock_path[k], lock)) return true; /* ours already */
        else if (slot < 0 && !tpk__ckpt_lock_path[k][0]) slot = k;
    if (slot < 0)
        return tpk__ckpt_say(err, n, "--save %s: this process holds %d locks already", dir,
                        TPK__CKPT_LOCKS),
               false;
    for (int tries = 0; tries < 2; tries++) {
        int fd = open(lock, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd >= 0) {
            bool ok = tpk__st_write_all(fd, me, strlen(me)) && fsync(fd) == 0;
            ok = close(fd) == 0 && ok;
            if (!ok) {
                unlink(lock);
                return tpk__ckpt_say(err, n, "--save %s: cannot write its lock %s (%s)", dir, lock,
                                strerror(errno)),
                       false;
            }
            static bool registered = false;
            if (!registered) registered = atexit(tpk__ckpt_unlock_all) == 0;
            snprintf(tpk__ckpt_lock_path[slot], sizeof tpk__ckpt_lock_path[slot], "%.1090s", lock);
            snprintf(tpk__ckpt_lock_text[slot], sizeof tpk__ckpt_lock_text[slot], "%s", me);
            return true;
        }
        if (errno != EEXIST)
            return tpk__ckpt_say(err, n, "--save %s: cannot create its lock %s (%s)", dir, lock,
                            strerror(errno)),
                   false;
        if (!tpk__ckpt_read_small(lock, t, sizeof t)) continue; /* removed meanwhile: again */
        if (!strcmp(t, me)) return true; /* this process's, from an earlier probe */
        if (!tpk__ckpt_lock_stale(t)) {
            size_t k = strlen(t);
            while (k && t[k - 1] == '\n') t[--k] = 0;
            return tpk__ckpt_say(err, n,
                            "--save %s: in use by another run (%s holds \"%.300s\"; remove it "
                            "if that run has ended)",
                            dir, lock, t),
                   false;
        }
        snprintf(aside, sizeof aside, "%.1100s.stale.%ld", lock, (long)getpid());
        if (rename(lock, aside) != 0) continue;
        char t2[400];
        bool same = tpk__ckpt_read_small(aside, t2, sizeof t2) && !strcmp(t, t2);
        int back = same ? 0 : link(aside, lock); /* another run's fresh lock: put back */
        (void)back;
        unlink(aside);
        if (!same)
            return tpk__ckpt_say(err, n, "--save %s: in use by another run (%s just taken)", dir,
                                 lock);
    }
    return tpk__ckpt_say(err, n, "--save %s: cannot take its lock %s", dir, lock), false;
}

/* What a stopped save of base left, checked as the save will check it (tpk_ckpt_repair), without
 * changing anything: base, base.tpk-old and base.tpk-new not symbolic links; base.tpk-new holding
 * only checkpoint files; base.tpk-old beside base holding none of base's other entries. */
static inline bool tpk__ckpt_leftovers_ok(const char *base, char *err, size_t n) {
    char old[1100], tmp[1100], a[1400], b[1400];
    snprintf(old, sizeof old, "%.1000s.tpk-old", base);
    snprintf(tmp, sizeof tmp, "%.1000s.tpk-new", base);
    const char *names[3] = {base, old, tmp};
    for (int k = 0; k < 3; k++)
        if (tpk__ckpt_is_link(names[k]))
            return tpk__ckpt_say(err, n,
                            "--save: %.1000s is a symbolic link: a checkpoint's folder is never "
                            "followed through a link (give the folder it points to, or remove "
                            "the link)",
                            names[k]),
                   false;
    struct stat st;
    for (int k = 1; k < 3; k++) {
        DIR *d = opendir(names[k]);
        if (!d) continue;
        bool base_too = k == 1 && stat(base, &st) == 0, bad = false;
        for (struct dirent *e; !bad && (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
                tpk_ckpt_is_file(e->d_name))
                continue;
            snprintf(a, sizeof a, "%s/%s", base, e->d_name);
            if (k == 2 || (base_too && lstat(a, &st) == 0))
                bad = true, snprintf(b, sizeof b, "%s", e->d_name);
        }
        closedir(d);
        if (bad)
            return tpk__ckpt_say(err, n,
                            k == 2 ? "--save: %.1000s: left by a stopped save, holds %.200s, "
                                     "which is not a checkpoint's: move it, or remove the folder"
                                   : "--save: %.1000s: left by a stopped save, holds %.200s, "
                                     "which the checkpoint beside it has too: move or remove it",
                            names[k], b),
                   false;
    }
    return true;
}

/* Whether sub (DIR/step-K) holds a whole checkpoint with an id (its config.json, written last,
 * saying tpk_checkpoint_id); the id into id[24]. Not a link. */
static inline bool tpk__ckpt_step_id(const char *sub, char id[24]) {
    char p[1200];
    struct stat st;
    id[0] = 0;
    if (lstat(sub, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    snprintf(p, sizeof p, "%.1100s/config.json", sub);
    if (stat(p, &st) != 0 || st.st_size <= 0 || st.st_size > (1 << 24)) return false;
    /* the whole file (the id is near its end); no context: the C library's allocator */
    char *b = (char *)tpk__al_malloc(NULL, (size_t)st.st_size + 1);
    bool got = b && tpk__ckpt_read_small(p, b, (size_t)st.st_size + 1);
    const char *k = got ? strstr(b, "\"tpk_checkpoint_id\"") : NULL;
    size_t m = 0;
    if (k && (k = strchr(k + 19, '"')))
        for (k++; m < 23 && k[m] && k[m] != '"'; m++) id[m] = k[m];
    bool closed = k && m && k[m] == '"';
    id[m] = 0;
    tpk__al_free(NULL, b);
    if (!closed) return id[0] = 0, false;
    snprintf(p, sizeof p, "%.1100s/model.safetensors", sub);
    if (access(p, F_OK) != 0) {
        snprintf(p, sizeof p, "%.1100s/model.safetensors.index.json", sub);
        if (access(p, F_OK) != 0) return id[0] = 0, false;
    }
    return true;
}
/* Whether name is "step-K" with K a whole number written as such; K into *v. */
static inline bool tpk__ckpt_step_name(const char *name, long long *v) {
    char tail, num[32];
    return sscanf(name, "step-%lld%c", v, &tail) == 1 && *v >= 0 &&
           !strcmp(name + 5, (snprintf(num, sizeof num, "%lld", *v), num));
}

/* Before training, on world rank 0: DIR, DIR.tpk-old, DIR.tpk-new, DIR.tpk-lock not symbolic
 * links and a stopped save's leftovers ones its repair accepts; DIR made (mkdir -p) and a probe
 * file written and removed in it; the lock DIR.tpk-lock taken (tpk__ckpt_lock; released at exit
 * or by tpk_ckpt_unlock); each DIR/step-K checked the same (not a link, its leftovers) and the
 * checkpoints there now noted (--keep leaves them). false with the message in err ("--save:
 * cannot create ...", "--save DIR: cannot write in it (...)", "--save DIR: in use by another
 * run (...)"), the lock not kept. */
static inline bool tpk_ckpt_probe(const char *dir, char *err, size_t n) {
    char p[4096], f[4200];
    if (!dir || !*dir) return tpk__ckpt_say(err, n, "--save: expected a folder, got none"), false;
    if (strlen(dir) >= 1000) /* DIR.tpk-old and DIR/step-K within a checkpoint's 1023 bytes */
        return tpk__ckpt_say(err, n, "--save: a path of at most %d characters, got %zu", 999,
                        strlen(dir)),
               false;
    snprintf(p, sizeof p, "%s", dir);
    for (size_t k = strlen(p); k > 1 && p[k - 1] == '/';) p[--k] = 0;
    char lock[4200];
    snprintf(lock, sizeof lock, "%s.tpk-lock", p);
    if (!tpk__ckpt_leftovers_ok(p, err, n)) return false;
    if (tpk__ckpt_is_link(lock))
        return tpk__ckpt_say(err, n, "--save: %.1000s is a symbolic link: remove it", lock), false;
    for (char *c = p + 1;; c++) /* each parent, then DIR */
        if (*c == '/' || !*c) {
            char end = *c;
            *c = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return tpk__ckpt_say(err, n, "--save: cannot create %.900s (%s)", p,
                                     strerror(errno));
            *c = end;
            if (!end) break;
        }
    snprintf(f, sizeof f, "%s/.train-probe-%ld", dir, (long)getpid());
    FILE *pf = fopen(f, "w");
    bool ok = pf && fputs("probe\n", pf) >= 0 && fflush(pf) == 0;
    int e = errno;
    if (pf) ok = fclose(pf) == 0 && ok, remove(f);
    if (!ok)
        return tpk__ckpt_say(err, n, "--save %s: cannot write in it (%s)", dir,
                        strerror(pf ? e : errno)),
               false;
    if (!tpk__ckpt_lock(lock, dir, err, n)) return false; /* also: its parent is writable */
    /* DIR's entries: a step-K that is a link refused, each step-K's leftovers checked, the
     * checkpoints there now noted (another run's: --keep leaves them) */
    DIR *d = opendir(p);
    int slot = -1;
    for (int k = 0; k < TPK__CKPT_LOCKS && slot < 0; k++)
        if (!strcmp(tpk__ckpt_seen_dir[k], p) || !tpk__ckpt_seen_dir[k][0]) slot = k;
    if (slot < 0) slot = 0;
    snprintf(tpk__ckpt_seen_dir[slot], sizeof tpk__ckpt_seen_dir[slot], "%.1090s", p);
    tpk__ckpt_seen_n[slot] = 0;
    ok = true;
    for (struct dirent *de; ok && d && (de = readdir(d));) {
        char nm[300], sub[4400], id[24];
        long long v;
        snprintf(nm, sizeof nm, "%.299s", de->d_name);
        size_t len = strlen(nm);
        if (len > 8 && (!strcmp(nm + len - 8, ".tpk-old") || !strcmp(nm + len - 8, ".tpk-new")))
            nm[len - 8] = 0;
        if (!tpk__ckpt_step_name(nm, &v)) continue;
        snprintf(sub, sizeof sub, "%s/%s", p, nm);
        ok = tpk__ckpt_leftovers_ok(sub, err, n);
        int *ns = &tpk__ckpt_seen_n[slot];
        if (ok && !strcmp(nm, de->d_name) && tpk__ckpt_step_id(sub, id) && *ns < TPK__CKPT_SEEN)
            tpk__ckpt_seen_step[slot][*ns] = v,
            snprintf(tpk__ckpt_seen_id[slot][*ns], 24, "%s", id), (*ns)++;
    }
    if (d) closedir(d);
    if (!ok) tpk_ckpt_unlock(p);
    return ok;
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
 * oldest first. Only this run's count: a directory (not a link) whose config.json, written last,
 * has a checkpoint id, with its model file, and that was not there with the same id when
 * tpk_ckpt_probe ran on DIR in this process; anything else named step-K (a user's folder, a
 * half-written one, another run's) is never removed nor counted as newer. */
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
    char base[1100], sub0[1400], id[24];
    snprintf(base, sizeof base, "%.1000s", dir);
    for (size_t m = strlen(base); m > 1 && base[m - 1] == '/';) base[--m] = 0;
    int slot = -1;
    for (int q = 0; q < TPK__CKPT_LOCKS && slot < 0; q++)
        if (!strcmp(tpk__ckpt_seen_dir[q], base)) slot = q;
    for (struct dirent *e; !nomem && (e = readdir(d));) {
        if (!tpk__ckpt_step_name(e->d_name, &v)) continue;
        snprintf(sub0, sizeof sub0, "%s/%s", base, e->d_name);
        if (!tpk__ckpt_step_id(sub0, id)) continue; /* no checkpoint of ours */
        bool seen = false;
        for (int q = 0; slot >= 0 && q < tpk__ckpt_seen_n[slot] && !seen; q++)
            seen = tpk__ckpt_seen_step[slot][q] == v && !strcmp(tpk__ckpt_seen_id[slot][q], id);
        if (seen) continue; /* there before this run: another run's */
        {
            size_t was = sizeof *k * cap;
            long long *g = nk < cap ? k
                                    : (long long *)tpk__realloc(ctx, k, was,
                                                                sizeof *k * (cap = cap ? 2 * cap
                                                                                       : 64));
            if (!g) nomem = true;
            else k = g, k[nk++] = v;
        }
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
 * (never a silent restart), and likewise "fp8 scaling state starts fresh ..." where the context's
 * FP8 recipe scales by delayed scaling and dir has no fp8.safetensors. Nothing at step 0. */
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
    if (training && tpk__ckpt_fp8_on(ctx) && tpk_hf_info_read(ctx, dir, &info) == TPK_OK &&
        !info.has_fp8)
        fprintf(out,
                "fp8 scaling state starts fresh at step %lld (%s has no fp8.safetensors: scales "
                "1, empty amax histories)\n",
                (long long)step, info.dir);
    return TPK_OK;
}

#endif /* TPK_TRAIN_CKPT_FOLDER_H */
