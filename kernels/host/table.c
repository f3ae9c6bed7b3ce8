/* kernels/host/table.c — the host backend's table: every file's entries (tpk__host_<file>_ops),
 * made once (pthread_once); the fusions it does not fuse (all but linear_fwd and xent_fused) left
 * NULL for the front end to compose (tpk/runtime/op.h). tpk_ops_default: the backend of a context
 * created with desc->ops = NULL (tpk/runtime/init.h declares it weak). */
#include <pthread.h>

#include <tpk/runtime/host.h>

#include "host_private.h"

static tpk_ops host_table;
static pthread_once_t host_table_once = PTHREAD_ONCE_INIT;
static void host_table_make(void) {
    tpk_ops o = {.name = "host", .self = NULL, .device = false};
    tpk__host_state_ops(&o);
    tpk__host_elementwise_ops(&o);
    tpk__host_gemm_ops(&o);
    tpk__host_optim_ops(&o);
    tpk__host_rng_ops(&o);
    tpk__host_norm_ops(&o);
    tpk__host_rope_swiglu_ops(&o);
    tpk__host_embed_ops(&o);
    tpk__host_rows_ops(&o);
    tpk__host_xent_ops(&o);
    tpk__host_attn_ops(&o);
    host_table = o;
}
const tpk_ops *tpk_ops_host(void) {
    pthread_once(&host_table_once, host_table_make);
    return &host_table;
}

const tpk_ops *tpk_ops_default(void) { return tpk_ops_host(); }
