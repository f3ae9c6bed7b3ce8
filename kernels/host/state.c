/* kernels/host/state.c — the host backend's memory: buffers are host memory (device = false).
 *
 *   alloc    zero-filled (calloc), a clear error naming the bytes when it fails
 *   memcpy   every direction is a host copy: apart, over the pool's threads; overlapping, memmove
 *   sync     nothing to wait for: every op has finished when it returns */
#include "host_private.h"

/* ---- memory ---------------------------------------------------------------------------------- */

static tpk_status host_alloc(tpk_ctx *ctx, size_t bytes, void **out) {
    static const char *fn = "host.alloc";
    *out = NULL;
    if (bytes > SIZE_MAX - 63) return tpk__host_nomem(ctx, fn, bytes);
    size_t rounded = (bytes + 63) / 64 * 64; /* aligned_alloc wants a multiple of the alignment */
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (!p) return tpk__host_nomem(ctx, fn, bytes);
    memset(p, 0, rounded);
    *out = p;
    return TPK_OK;
}

static void host_free(tpk_ctx *ctx, void *p) {
    (void)ctx;
    free(p);
}

typedef struct copy_job {
    char *dst;
    const char *src;
} copy_job;
static void memcpy_part(void *p, int64_t lo, int64_t hi) { /* bytes [lo, hi) */
    const copy_job *c = (const copy_job *)p;
    memcpy(c->dst + lo, c->src + lo, (size_t)(hi - lo));
}
/* apart: over the pool's threads (pool.c) in parts of at least 256 KiB; overlapping: memmove */
static tpk_status host_memcpy(tpk_ctx *ctx, void *dst, const void *src, size_t bytes,
                              tpk_copy_dir dir) {
    (void)ctx, (void)dir;
    if (!bytes || dst == src) return TPK_OK;
    copy_job c = {(char *)dst, (const char *)src};
    if (c.dst + bytes <= c.src || c.src + bytes <= c.dst)
        tpk__host_par((int64_t)bytes, 1 << 18, memcpy_part, &c);
    else memmove(dst, src, bytes);
    return TPK_OK;
}

static tpk_status host_sync(tpk_ctx *ctx) {
    (void)ctx;
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_state_ops(tpk_ops *o) {
    o->alloc = host_alloc;
    o->free = host_free;
    o->memcpy = host_memcpy;
    o->sync = host_sync;
}
