/* kernels/host/pool.c — the host backend's threads: a small pool that runs one op's loop over
 * [0, n) in contiguous parts, the calling thread taking the first.
 *
 *   threads   TPK_NUM_THREADS where set, else OpenBLAS's thread count (openblas_get_num_threads:
 *             OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, else the cores) and at most the CPUs this
 *             process may run on; at most TPK__HOST_MAX_THREADS. The pool and OpenBLAS never run
 *             at once (an op is either a GEMM or a loop here), so they never oversubscribe the
 *             cores.
 *   par       part k of T is [n k / T, n (k + 1) / T). The ops give each element, row or fixed
 *             chunk of a reduction to exactly one part and combine the chunks' partial sums in
 *             chunk order afterwards, so results do not depend on T: every number is the same at
 *             1 thread and at 16.
 *   waiting   an idle worker polls for 50 us (the next op usually follows within microseconds),
 *             then sleeps on a condition variable: idle threads do not take the cores from
 *             OpenBLAS's.
 *   busy      a second caller (another thread using the backend, or an op's part calling
 *             tpk__host_par again) runs its loop alone instead of waiting: same results.
 *   fork      a child process starts without workers and creates its own when it needs them. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include <cblas.h>

#include "host_private.h"

typedef struct pool {
    pthread_mutex_t busy;                 /* held by the dispatching caller */
    pthread_mutex_t lock;                 /* guards the sleep and the wake-up */
    pthread_cond_t wake;                  /* a new job */
    pthread_cond_t done;                  /* the last worker finished */
    atomic_uint job;                      /* incremented per job */
    atomic_int pending;                   /* workers still running the job */
    int started;                          /* workers created */
    unsigned born[TPK__HOST_MAX_THREADS]; /* the job counter when worker k was created */
    int parts;                            /* the job's T */
    int64_t n;                            /* the job's range */
    tpk__host_part_fn fn;                 /* the job */
    void *arg;
} pool;

static pool P = {PTHREAD_MUTEX_INITIALIZER,
                 PTHREAD_MUTEX_INITIALIZER,
                 PTHREAD_COND_INITIALIZER,
                 PTHREAD_COND_INITIALIZER,
                 0,
                 0,
                 0,
                 {0},
                 0,
                 0,
                 NULL,
                 NULL};

/* how long a waiting thread polls before it sleeps: long enough for the next op of a step (a few
 * microseconds away), short against a GEMM (milliseconds, OpenBLAS's threads on the cores) */
enum { SPIN_NS = 50 * 1000 };

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}
static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}
/* poll until done(arg) or SPIN_NS have passed; true when done */
static bool spin(bool (*done)(const void *), const void *arg) {
    int64_t end = 0;
    for (int s = 0;; s++) {
        if (done(arg)) return true;
        if ((s & 63) == 0) { /* the clock every 64 polls */
            int64_t t = now_ns();
            if (!end) end = t + SPIN_NS;
            else if (t > end) return false;
        }
        relax();
    }
}
static bool job_moved(const void *seen) { return atomic_load(&P.job) != *(const unsigned *)seen; }
static bool all_done(const void *unused) {
    (void)unused;
    return atomic_load(&P.pending) == 0;
}

static void run_part(int k) {
    int64_t lo = P.n * k / P.parts, hi = P.n * (k + 1) / P.parts;
    if (lo < hi) P.fn(P.arg, lo, hi);
}

static void *worker(void *a) {
    int k = (int)(intptr_t)a;  /* this worker's part: 1 .. */
    unsigned seen = P.born[k]; /* a job posted after its creation is one to run */
    for (;;) {
        if (!spin(job_moved, &seen)) {
            pthread_mutex_lock(&P.lock);
            while (atomic_load(&P.job) == seen) pthread_cond_wait(&P.wake, &P.lock);
            pthread_mutex_unlock(&P.lock);
        }
        seen = atomic_load(&P.job); /* one job at a time: the next waits for this one's end */
        if (k < P.parts) run_part(k);
        if (atomic_fetch_sub(&P.pending, 1) == 1) {
            pthread_mutex_lock(&P.lock);
            pthread_cond_signal(&P.done);
            pthread_mutex_unlock(&P.lock);
        }
    }
    return NULL;
}

/* A child of fork() has none of the workers: it starts the pool afresh (its locks unheld). */
static void forked_child(void) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    P.busy = m, P.lock = m, P.wake = c, P.done = c, P.started = 0;
    atomic_store(&P.pending, 0);
}

int tpk__host_threads(void) {
    const char *e = getenv("TPK_NUM_THREADS");
    int t = e && *e ? atoi(e) : 0;
    if (t <= 0) {
        t = openblas_get_num_threads();
        if (t > 1) { /* a system call: only where there is a choice */
            cpu_set_t set;
            if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < t)
                t = CPU_COUNT(&set);
        }
    }
    return t < 1 ? 1 : t > TPK__HOST_MAX_THREADS ? TPK__HOST_MAX_THREADS : t;
}

void tpk__host_par(int64_t n, int64_t grain, tpk__host_part_fn fn, void *arg) {
    int64_t T = tpk__host_threads();
    if (grain < 1) grain = 1;
    if (T > n / grain) T = n / grain; /* at least grain per part */
    if (T <= 1 || pthread_mutex_trylock(&P.busy) != 0) {
        if (n > 0) fn(arg, 0, n);
        return;
    }
    static bool atfork; /* the handler, registered once (a child inherits it) */
    if (!atfork) atfork = pthread_atfork(NULL, NULL, forked_child) == 0;
    while (P.started < T - 1) { /* workers 1 .. T-1, created once */
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        P.born[P.started + 1] = atomic_load(&P.job);
        int rc = pthread_create(&th, &at, worker, (void *)(intptr_t)(P.started + 1));
        pthread_attr_destroy(&at);
        if (rc != 0) break;
        P.started++;
    }
    if (T > P.started + 1) T = P.started + 1; /* as many as could be created */
    if (T <= 1) {
        pthread_mutex_unlock(&P.busy);
        fn(arg, 0, n);
        return;
    }
    /* every started worker takes part (those past T run nothing), so each job's count is exact */
    P.n = n, P.parts = (int)T, P.fn = fn, P.arg = arg;
    atomic_store(&P.pending, P.started);
    pthread_mutex_lock(&P.lock);
    atomic_fetch_add(&P.job, 1);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.lock);
    run_part(0);
    spin(all_done, NULL);
    pthread_mutex_lock(&P.lock);
    while (atomic_load(&P.pending) > 0) pthread_cond_wait(&P.done, &P.lock);
    pthread_mutex_unlock(&P.lock);
    pthread_mutex_unlock(&P.busy);
}
