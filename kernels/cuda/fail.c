/* kernels/cuda/fail.c — tpk__fail for the CUDA kernels' translation units: tpk/ctx.h is C (it uses
 * compound literals), so the .cu files record their failures through this C function. */
#include <tpk/ctx.h>

tpk_status tpk__cuda_fail(tpk_ctx *ctx, tpk_status s, const char *fn, const char *fmt, ...);

tpk_status tpk__cuda_fail(tpk_ctx *ctx, tpk_status s, const char *fn, const char *fmt, ...) {
    if (ctx) {
        int n = snprintf(ctx->err, sizeof ctx->err, "%s: ", fn);
        if (n < 0 || (size_t)n >= sizeof ctx->err) n = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err + n, sizeof ctx->err - (size_t)n, fmt, ap);
        va_end(ap);
        ctx->last = s;
    }
    return s;
}
