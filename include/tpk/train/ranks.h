/* tpk/train/ranks.h — the ranks of an MPI job agreeing before and after the context exists: that
 * every rank goes on, or all stop with one error line; that they were started with the same
 * arguments and read the same checkpoint and data.
 *
 * tpk_ranks_agree: each rank passes its own verdict; one all-reduce (MIN of the failing ranks'
 * numbers) tells all whether any failed, and the lowest failing rank prints "PROG: error: MSG" on
 * standard error: every rank returns the same answer, none hangs. A world collective waits at most
 * the timeout (--timeout; tpk_mpi_wait); a collective that fails or times out cannot be agreed on
 * (a stopped peer never answers), so the rank prints its line and aborts the job (MPI_Abort).
 * Digests: 64-bit FNV-1a over 8-byte words (then the tail bytes), h = (h ^ w) * 0x100000001b3
 * from the offset basis 0xcbf29ce484222325; each step is a bijection of h, so one differing word
 * always changes the digest. Ranks compare h and ~h in one all-reduce of MAX: they agree when
 * max h == ~max ~h, i.e. max h == min h. Hashing a checkpoint's files sends heartbeats (tpk_busy):
 * a rank slow to read does not time the others out. Needs MPI and POSIX (opendir). */
#ifndef TPK_TRAIN_RANKS_H
#define TPK_TRAIN_RANKS_H

#include <dirent.h>

#include "../runtime/mpi.h"
#include "ckpt_dir.h"
#include "data.h"

#define TPK_DIGEST0 0xcbf29ce484222325ull /* FNV-1a's offset basis */

/* The world's ranks as the program sees them. */
typedef struct tpk_ranks {
    int rank, size;
    double timeout;   /* seconds a world collective waits (0: no limit) */
    const char *prog; /* the error lines' prefix: "train" */
    char msg[1024];   /* this rank's message for the next tpk_ranks_agree */
} tpk_ranks;

/* r for MPI_COMM_WORLD (MPI initialised), the timeout TPK_TIMEOUT's or 600 s, the world's
 * heartbeat started (tpk_mpi_heartbeat_init; collective): false (a message in r->msg) when
 * TPK_TIMEOUT is not a number of seconds or the heartbeat cannot start. */
static inline bool tpk_ranks_init(tpk_ranks *r, const char *prog) {
    tpk_ctx e;
    memset(r, 0, sizeof *r), memset(&e, 0, sizeof e);
    r->prog = prog;
    MPI_Comm_rank(MPI_COMM_WORLD, &r->rank), MPI_Comm_size(MPI_COMM_WORLD, &r->size);
    if (tpk_mpi_heartbeat_init(&e) == TPK_OK && tpk_mpi_timeout_default(&e, &r->timeout) == TPK_OK)
        return true;
    snprintf(r->msg, sizeof r->msg, "%s", tpk_last_error(&e));
    r->timeout = 600;
    return false;
}

/* A collective failed or timed out: this rank's error line, then the job aborted. */
static inline void tpk_ranks_abort(const tpk_ranks *r, const char *what) {
    fflush(stdout);
    fprintf(stderr, "%s: error: rank %d: %s\n", r->prog, r->rank, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* MPI_Allreduce in place over the world, waiting at most r->timeout (tpk_ranks_abort after). */
static inline void tpk_ranks_allreduce(const tpk_ranks *r, void *buf, int n, MPI_Datatype t,
                                       MPI_Op op) {
    tpk_ctx e;
    MPI_Request q;
    char what[48];
    memset(&e, 0, sizeof e);
    MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, MPI_COMM_WORLD, &q);
    snprintf(what, sizeof what, "the world (%d ranks)", r->size);
    if (tpk_mpi_wait(&e, "MPI_Allreduce", what, &q, r->timeout) != TPK_OK)
        tpk_ranks_abort(r, tpk_last_error(&e));
}

/* A new run id, the same on every rank: 16 hex digits drawn on rank 0 (tpk_ckpt_new_id), the
 * others' zeros OR-ed in. Collective. */
static inline void tpk_ranks_new_id(const tpk_ranks *r, char id[17]) {
    memset(id, 0, 17);
    if (r->rank == 0) tpk_ckpt_new_id(id);
    tpk_ranks_allreduce(r, id, 17, MPI_BYTE, MPI_BOR);
}

/* Whether every rank's ok is true (the header says how); msg: this rank's message (NULL or "":
 * "failed"). Collective. */
static inline bool tpk_ranks_agree(const tpk_ranks *r, bool ok, const char *msg) {
    int first = ok ? r->size : r->rank;
    tpk_ranks_allreduce(r, &first, 1, MPI_INT, MPI_MIN);
    if (first == r->size) return true;
    fflush(stdout); /* what was printed before comes before the error */
    if (first == r->rank)
        fprintf(stderr, "%s: error: %s\n", r->prog, msg && msg[0] ? msg : "failed");
    return false;
}

/* tpk_ranks_agree on !bad, bad's message formatted into r->msg. Collective. */
static inline bool tpk_ranks_check(tpk_ranks *r, bool bad, const char *fmt, ...) {
    if (bad) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, sizeof r->msg, fmt, ap);
        va_end(ap);
    }
    return tpk_ranks_agree(r, !bad, r->msg);
}

/* tpk_ranks_agree on a call's status s: TPK_ERR_COMM aborts the job (tpk_ranks_abort); another
 * failure is ctx's last error with its status's name. Collective. */
static inline bool tpk_ranks_ok(tpk_ranks *r, tpk_ctx *ctx, tpk_status s) {
    if (s == TPK_ERR_COMM) tpk_ranks_abort(r, tpk_last_error(ctx));
    if (s != TPK_OK)
        snprintf(r->msg, sizeof r->msg, "%s (%s)", tpk_last_error(ctx), tpk_status_str(s));
    return tpk_ranks_agree(r, s == TPK_OK, r->msg);
}

/* The digest of n bytes at p, continuing from h (TPK_DIGEST0 to begin). */
static inline uint64_t tpk_digest(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Whether every rank holds the same h[0..n) (n <= 32). Collective. */
static inline bool tpk_ranks_same(const tpk_ranks *r, const uint64_t *h, int n) {
    uint64_t hh[64];
    if (n > 32) n = 32;
    for (int i = 0; i < n; i++) hh[2 * i] = h[i], hh[2 * i + 1] = ~h[i];
    tpk_ranks_allreduce(r, hh, 2 * n, MPI_UINT64_T, MPI_MAX);
    for (int i = 0; i < n; i++)
        if (hh[2 * i] != ~hh[2 * i + 1]) return false;
    return true;
}

/* The digest of a file's bytes and length, read 64 KiB at a time, a heartbeat (tpk_busy) after
 * each (0: it cannot be read; the load says why). */
static inline uint64_t tpk_file_digest(const char *path) {
    unsigned char buf[1 << 16];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = TPK_DIGEST0;
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        h = tpk_digest(h, buf, n), total += n, tpk_busy(NULL, 0);
    bool bad = ferror(f);
    fclose(f);
    return bad ? 0 : tpk_digest(h, &total, sizeof total);
}

/* Whether every rank was started with the same arguments (each one's length and bytes). */
static inline bool tpk_ranks_same_args(tpk_ranks *r, int argc, char **argv) {
    uint64_t h = tpk_digest(TPK_DIGEST0, &argc, sizeof argc);
    for (int i = 1; i < argc; i++) {
        size_t len = strlen(argv[i]);
        h = tpk_digest(tpk_digest(h, &len, sizeof len), argv[i], len);
    }
    return tpk_ranks_check(r, !tpk_ranks_same(r, &h, 1),
                           "the ranks were started with different configurations (arguments "
                           "differ between ranks)");
}

static inline int tpk__ranks_cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}
static inline bool tpk__ranks_ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && !strcmp(s + n - t, tail);
}

/* Whether the ranks see the same checkpoint in dir (the names of its *.json and *.safetensors
 * files, then each file's bytes); the error names --load dir or the file. Collective; one rank:
 * true at once. */
static inline bool tpk_ranks_same_checkpoint(tpk_ranks *r, const char *dir) {
    if (r->size == 1) return true;
    tpk__test_slow(r->rank, true); /* TPK_TEST_SLOW_RANK: a rank slow to read, with heartbeats */
    char **names = NULL, path[4096] = "";
    int n = 0, cap = 0, res = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!tpk__ranks_ends_with(e->d_name, ".json") &&
            !tpk__ranks_ends_with(e->d_name, ".safetensors"))
            continue;
        if (n == cap) { /* before any context: the C library's allocator (tpk__al_*, NULL) */
            size_t was = sizeof(char *) * (size_t)cap;
            char **g = (char **)tpk__al_realloc(NULL, names, was,
                                                sizeof(char *) * (size_t)(cap = 2 * cap + 8));
            if (!g) break;
            names = g;
        }
        if (!(names[n] = (char *)tpk__al_malloc(NULL, strlen(e->d_name) + 1))) break;
        memcpy(names[n], e->d_name, strlen(e->d_name) + 1);
        n++;
    }
    if (d) closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, tpk__ranks_cmp_names);
    uint64_t h = tpk_digest(TPK_DIGEST0, &n, sizeof n);
    for (int i = 0; i < n; i++) h = tpk_digest(h, names[i], strlen(names[i]) + 1);
    if (!tpk_ranks_same(r, &h, 1)) res = 1;
    for (int i = 0; !res && i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        h = tpk_file_digest(path);
        if (!tpk_ranks_same(r, &h, 1)) res = 2;
    }
    for (int i = 0; i < n; i++) tpk__al_free(NULL, names[i]);
    tpk__al_free(NULL, names);
    if (res == 1)
        return tpk_ranks_check(r, true,
                               "the ranks see different checkpoint files in --load %s (the lists "
                               "of its .json and .safetensors files differ)",
                               dir);
    return tpk_ranks_check(r, res == 2,
                           "the ranks read different contents from %s: every rank must load the "
                           "same checkpoint",
                           path);
}

/* Whether every rank read the same training and validation tokens; the error names the file
 * (text: --text's; else --data's or --val-data's, val NULL: the training file's). Collective. */
static inline bool tpk_ranks_same_data(tpk_ranks *r, const tpk_tokens *train,
                                       const tpk_tokens *valid, const char *text, const char *data,
                                       const char *val) {
    if (r->size == 1) return true;
    uint64_t h[2] = {tpk_digest(TPK_DIGEST0, train->tok, sizeof(int32_t) * (size_t)train->n),
                     tpk_digest(TPK_DIGEST0, valid->tok, sizeof(int32_t) * (size_t)valid->n)};
    bool same = tpk_ranks_same(r, h, 2), in_train = same || !tpk_ranks_same(r, h, 1);
    const char *file = text ? text : in_train ? data : val ? val : data;
    const char *flag = text ? "--text" : in_train ? "--data" : val ? "--val-data" : "--data";
    return tpk_ranks_check(r, !same,
                           "the ranks read different contents from %s (%s): every rank must read "
                           "the same data",
                           file, flag);
}

#endif /* TPK_TRAIN_RANKS_H */
