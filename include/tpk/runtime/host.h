/* tpk/runtime/host.h — the host backend: every op of tpk_ops in plain C with OpenBLAS GEMMs
 * (kernels/host, build/libtpk_host.a; also inside build/libtpk_cuda.a). fp32 arithmetic, bf16
 * as a storage format; the reference the CUDA backend and the layer tests are checked against.
 * It is also the default backend (tpk_ops_default, tpk/runtime/init.h). */
#ifndef TPK_HOST_H
#define TPK_HOST_H

#include "../base/ops.h"

TPK_EXTERN_C const tpk_ops *tpk_ops_host(void);

#endif /* TPK_HOST_H */
