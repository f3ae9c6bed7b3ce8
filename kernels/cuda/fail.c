/* kernels/cuda/fail.c — tpk__fail for the CUDA kernels' translation units: tpk/ctx.h is C (it uses
 * compound literals), so the .cu files record their failures through this C function. */
#include <tpk/ctx.h>

tpk_status tpk__cuda_fail(tpk_ctx *ctx, tpk_status s, const char *fn, const char *fmt, ...);

tpk_status tpk__cuda_fail(tpk_ctx *ctx, tpk_status s, const char *fn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tpk__vfail(ctx, s, fn, fmt, ap);
    va_end(ap);
    return s;
}
