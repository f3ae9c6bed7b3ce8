/* bench/kernels.c — the memory-bound ops and attention of a backend, timed.
 *
 * Each memory-bound op is timed on N elements (or [rows, cols]) after a warm-up; its rate is the
 * fewest bytes it must move (each input read once, each output written once) over the median
 * time, in GB/s, next to the measured copy bandwidth (tpk_op_memcpy of a large buffer, bytes read
 * plus written). Attention: TFLOP/s of the causal forward (2 B A S^2 D: half of Q K^T and of P V)
 * and backward (5 B A S^2 D). CUDA events on the GPU, the monotonic clock on the host. Then the
 * same attention shape in PyTorch (bench/torch_attn.py: scaled_dot_product_attention where it
 * exists), in the same run, and tpk's speed as a percentage of PyTorch's; likewise the
 * cross-entropy (xent_fused against F.cross_entropy forward + backward, bench/torch_xent.py).
 *
 *   kernels [--n N] [--cols C] [--vocab V] [--xent-rows R] [--dtype f32|bf16] [--B b --S s --A a
 *   --D d] [--iters n] [--host] [--json]
 *
 * The MoE dispatcher's row ops (gather_rows, scatter_add_rows, moe_combine_fwd/bwd) move R = N / C
 * rows by the embedding's hashed ids (repeats: a scatter's destination takes several rows).
 * --cols: the row width of the layernorm and the embedding (default 1024, the rows N / C): 768
 * gives GPT-2 124M's layernorm. The cross-entropy ops on their own logits [--xent-rows, --vocab]
 * (default 4096 x 50304 on a GPU, GPT-2's padded vocabulary at t = 1, 50304 / t a rank's shard;
 * 16 rows on the host): a block works on one row of logits, so rows of 1024 would time the
 * block's reductions, and 1334 rows (N / 50304) a partly filled last wave, not the memory. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, popen */
#include <time.h>

#include <tpk/tpk.h>
#ifdef TPK_WITH_CUDA
#include <tpk/runtime/cuda.h>
#endif

static tpk_ctx ctx;
static bool gpu;

#define TRY(call)                                                                                  \
    do {                                                                                           \
        tpk_status s__ = (call);                                                                   \
        if (s__ != TPK_OK) {                                                                       \
            fprintf(stderr, "bench/kernels: %s: %s\n", #call, tpk_last_error(&ctx));               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the buffers every op works on */
static size_t N;
static int64_t R, C;   /* N = R x C */
static int64_t XR, XV; /* the cross-entropy's logits xl and their gradient xd: [XR, XV] */
static tpk_dtype dt;
static void *x, *y, *z, *ids, *tgt, *dl, *xl, *xd;
static float *w, *b, *mean, *rstd, *m1, *v1, *xf, *gf, *part, *lse, *mx;
static int64_t AB, AS, AA, AD;
static void *qkv, *ao, *ado, *adqkv;
static float *alse;

enum {
    OP_COPY,
    OP_FILL,
    OP_CAST,
    OP_AXPBY,
    OP_BIAS,
    OP_GELU_F,
    OP_GELU_B,
    OP_DROPOUT,
    OP_LN_F,
    OP_LN_B,
    OP_EMBED,
    OP_GATHER,
    OP_SCATTER,
    OP_COMB_F,
    OP_COMB_B,
    OP_XENT_S,
    OP_XENT_G,
    OP_XENT_F,
    OP_ADAMW,
    OP_ATT_F,
    OP_ATT_B,
    OP_N
};
static const char *op_name[OP_N] = {
    "memcpy D2D",   "fill",         "cast f32->bf16",   "axpby",           "bias_add",
    "act_fwd gelu", "act_bwd gelu", "dropout",          "layernorm_fwd",   "layernorm_bwd",
    "embed_fwd",    "gather_rows",  "scatter_add_rows", "moe_combine_fwd", "moe_combine_bwd",
    "xent_stats",   "xent_grad",    "xent_fused",       "adamw",           "attn_fwd",
    "attn_bwd"};

static void run_op(int op) {
    size_t es = tpk_dtype_size(dt);
    switch (op) {
        case OP_COPY: TRY(tpk_op_memcpy(&ctx, y, x, N * es, gpu ? TPK_D2D : TPK_H2H)); break;
        case OP_FILL: TRY(tpk_op_fill(&ctx, y, dt, N, 1.0f)); break;
        case OP_CAST: TRY(tpk_op_cast(&ctx, z, TPK_BF16, xf, TPK_F32, N)); break;
        case OP_AXPBY: TRY(tpk_op_axpby(&ctx, y, 0.5f, x, 0.5f, dt, N)); break;
        case OP_BIAS: TRY(tpk_op_bias_add(&ctx, y, x, R, C, dt)); break;
        case OP_GELU_F: TRY(tpk_op_act_fwd(&ctx, TPK_ACT_GELU_TANH, y, x, dt, N)); break;
        case OP_GELU_B: TRY(tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, y, x, z, dt, N)); break;
        case OP_DROPOUT: TRY(tpk_op_dropout(&ctx, y, x, R, C, C, 0, 0, 0.1f, 1, 2, dt)); break;
        case OP_LN_F:
            TRY(tpk_op_layernorm_fwd(&ctx, y, mean, rstd, x, w, b, R, C, 1e-5f, dt));
            break;
        case OP_LN_B:
            TRY(tpk_op_layernorm_bwd(&ctx, y, m1, v1, z, x, w, mean, rstd, R, C, dt, false));
            break;
        case OP_EMBED: TRY(tpk_op_embed_fwd(&ctx, y, ids, xf, R, C, 0, R, dt, false)); break;
        /* the MoE dispatcher's row ops on R rows of C: gathered and scattered by the ids (R rows
         * each), combined as R / 2 tokens of k = 2 rows (the ids), weights gf */
        case OP_GATHER: TRY(tpk_op_gather_rows(&ctx, y, C, x, C, R, ids, R, C, dt)); break;
        case OP_SCATTER:
            TRY(tpk_op_scatter_add_rows(&ctx, y, C, R, x, C, ids, R, C, dt, false));
            break;
        case OP_COMB_F: TRY(tpk_op_moe_combine_fwd(&ctx, y, x, R, ids, gf, R / 2, 2, C, dt)); break;
        case OP_COMB_B:
            TRY(tpk_op_moe_combine_bwd(&ctx, mx, y, z, x, R, ids, gf, R / 2, 2, C, dt));
            break;
        case OP_XENT_S: TRY(tpk_op_xent_stats(&ctx, part, xl, tgt, XR, XV, XV, 0, dt)); break;
        case OP_XENT_G:
            TRY(tpk_op_xent_grad(&ctx, xd, xl, lse, tgt, dl, XR, XV, XV, 0, XV, 0.0f, -100, dt));
            break;
        case OP_XENT_F:
            TRY(tpk_op_xent_fused(&ctx, xd, mx, lse, xl, tgt, XR, XV, XV, 0.0f, -100, 1.0f, dt));
            break;
        case OP_ADAMW:
            TRY(tpk_op_adamw(&ctx, xf, gf, m1, v1, N, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 1.0f,
                             NULL, 0.0f, NULL, 0, NULL));
            break;
        case OP_ATT_F:
            TRY(tpk_op_attn_fwd(&ctx, ao, alse, qkv, AB, AS, AA, AD, AA, AA, 0, 1.0f / 8, 0.0f, 1,
                                2, dt));
            break;
        case OP_ATT_B:
            TRY(tpk_op_attn_bwd(&ctx, adqkv, ado, qkv, ao, alse, AB, AS, AA, AD, AA, AA, 0,
                                1.0f / 8, 0.0f, 1, 2, dt));
            break;
    }
}
/* the fewest bytes an op moves */
static double op_bytes(int op) {
    double es = (double)tpk_dtype_size(dt), n = (double)N, nx = (double)XR * (double)XV;
    switch (op) {
        case OP_COPY: return 2 * n * es;
        case OP_FILL: return n * es;
        case OP_CAST: return n * 6;
        case OP_AXPBY: return 3 * n * es;
        case OP_BIAS:
        case OP_GELU_F:
        case OP_DROPOUT:
        case OP_LN_F: return 2 * n * es;
        case OP_GELU_B:
        case OP_LN_B: return 3 * n * es;
        case OP_XENT_G: return 2 * nx * es; /* the logits read once, their gradient written once */
        case OP_XENT_S:
            return nx * es;                 /* the logits read once (the [XR, 4] statistics are
                                           noise) */
        case OP_XENT_F: return 2 * nx * es; /* the logits read once, their gradient written once */
        case OP_EMBED: return n * (4 + es);
        case OP_GATHER:
        case OP_SCATTER: return 2 * n * es + 4.0 * (double)R;   /* the rows once each, the ids */
        case OP_COMB_F: return 1.5 * n * es + 8.0 * (double)R;  /* R rows in, R / 2 out */
        case OP_COMB_B: return 2.5 * n * es + 12.0 * (double)R; /* dy, o's rows, dout; dw */
        case OP_ADAMW: return n * 28;
    }
    return 0;
}
static double op_flops(int op) {
    double s2 = (double)AS * (double)AS * (double)AB * (double)AA * (double)AD;
    return op == OP_ATT_F ? 2 * s2 : op == OP_ATT_B ? 5 * s2 : 0;
}

static double time_op(int op, int iters) {
    for (int i = 0; i < 2; i++) run_op(op);
    TRY(tpk_op_sync(&ctx));
    double *ms = malloc(sizeof(double) * (size_t)iters);
#ifdef TPK_WITH_CUDA
    void *e0 = gpu ? tpk_cuda_event_new() : NULL, *e1 = gpu ? tpk_cuda_event_new() : NULL;
#endif
    for (int i = 0; i < iters; i++) {
#ifdef TPK_WITH_CUDA
        if (gpu) {
            tpk_cuda_event_record(e0);
            run_op(op);
            tpk_cuda_event_record(e1);
            ms[i] = tpk_cuda_event_ms(e0, e1);
            continue;
        }
#endif
        double t0 = now_ms();
        run_op(op);
        ms[i] = now_ms() - t0;
    }
#ifdef TPK_WITH_CUDA
    if (gpu) tpk_cuda_event_free(e0), tpk_cuda_event_free(e1);
#endif
    qsort(ms, (size_t)iters, sizeof(double), cmp_double);
    double med = ms[iters / 2];
    free(ms);
    return med;
}

static void *buf(size_t bytes) {
    void *p;
    TRY(tpk_op_alloc(&ctx, bytes, &p));
    return p;
}
static void *rnd(size_t n, tpk_dtype t, uint64_t stream, float a, float s) {
    void *p = buf(n * tpk_dtype_size(t));
    if (n)
        TRY(tpk_op_rng_2d(&ctx, p, t, 1, (int64_t)n, (int64_t)n, 0, 0, 1, stream, TPK_RNG_NORMAL, a,
                          s));
    return p;
}

/* n ids in [0, range), scattered by a multiplicative hash (i 2654435761 mod 2^32, mod range): the
 * embedding reads distinct table rows, not one row from the cache */
static void *ids_upload(size_t n, int64_t range) {
    int32_t *h = malloc(n * 4);
    if (!h) exit(1);
    for (size_t i = 0; i < n; i++)
        h[i] = (int32_t)((uint32_t)((uint64_t)i * 2654435761u) % (uint32_t)range);
    void *p = buf(n * 4);
    TRY(tpk_op_memcpy(&ctx, p, h, n * 4, gpu ? TPK_H2D : TPK_H2H));
    TRY(tpk_op_sync(&ctx));
    free(h);
    return p;
}

int main(int argc, char **argv) {
    int64_t n = 0, cols = 1024, vocab = 50304, xrows = 0;
    int iters = 0;
    bool json = false, force_host = false;
    dt = TPK_F32;
    AB = 0, AS = 0, AA = 0, AD = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--host")) force_host = true;
        else if (v && !strcmp(a, "--n")) n = atoll(v), i++;
        else if (v && !strcmp(a, "--cols")) cols = atoll(v), i++;
        else if (v && !strcmp(a, "--vocab")) vocab = atoll(v), i++;
        else if (v && !strcmp(a, "--xent-rows")) xrows = atoll(v), i++;
        else if (v && !strcmp(a, "--iters")) iters = atoi(v), i++;
        else if (v && !strcmp(a, "--dtype")) dt = !strcmp(v, "bf16") ? TPK_BF16 : TPK_F32, i++;
        else if (v && !strcmp(a, "--B")) AB = atoll(v), i++;
        else if (v && !strcmp(a, "--S")) AS = atoll(v), i++;
        else if (v && !strcmp(a, "--A")) AA = atoll(v), i++;
        else if (v && !strcmp(a, "--D")) AD = atoll(v), i++;
        else {
            fprintf(
                stderr,
                "usage: %s [--n N] [--cols C] [--vocab V] [--xent-rows R] [--dtype f32|bf16] [--B "
                "b --S s --A a --D d] [--iters n] [--host] [--json]\n",
                argv[0]);
            return 2;
        }
    }
    const tpk_ops *ops = tpk_ops_host();
#ifdef TPK_WITH_CUDA
    if (!force_host && tpk_cuda_device_count() > 0) ops = tpk_ops_cuda(), gpu = true;
#else
    (void)force_host;
#endif
    if (!n) n = gpu ? (int64_t)1 << 26 : (int64_t)1 << 22;
    if (!iters) iters = gpu ? 50 : 5;
    if (!AB) AB = gpu ? 8 : 1;
    if (!AS) AS = gpu ? 1024 : 256;
    if (!AA) AA = gpu ? 12 : 4;
    if (!xrows) xrows = gpu ? 4096 : 16;
    if (cols < 1 || n < cols || vocab < 1 || xrows < 1 || iters < 1 || AB < 1 || AS < 1 || AA < 1 ||
        AD < 1) {
        fprintf(stderr, "bench/kernels: sizes must be positive (n >= cols)\n");
        return 2;
    }
    if (tpk_ctx_init(&ctx, &(tpk_ctx_desc){.ops = ops}) != TPK_OK) {
        fprintf(stderr, "bench/kernels: %s\n", tpk_last_error(&ctx));
        return 1;
    }
    C = cols, R = n / cols, N = (size_t)(R * C), XV = vocab, XR = xrows;
    x = rnd(N, dt, 1, 0, 1), y = rnd(N, dt, 2, 0, 1), z = rnd(N, dt, 3, 0, 1);
    xf = rnd(N, TPK_F32, 4, 0, 1), gf = rnd(N, TPK_F32, 5, 0, 1), m1 = rnd(N, TPK_F32, 6, 0, 0.1f),
    v1 = rnd(N, TPK_F32, 7, 1, 0);
    w = rnd((size_t)C, TPK_F32, 8, 1, 0.1f), b = rnd((size_t)C, TPK_F32, 9, 0, 0.1f);
    size_t RM = (size_t)(R > XR ? R : XR); /* rows of the per-row buffers */
    mean = rnd((size_t)R, TPK_F32, 10, 0, 0), rstd = rnd((size_t)R, TPK_F32, 11, 1, 0),
    lse = rnd(RM, TPK_F32, 12, 8, 0);
    /* mx: the fused op's losses */
    dl = rnd(RM, TPK_F32, 13, 1, 0), mx = buf(RM * 4), part = buf(RM * 16);
    ids = ids_upload((size_t)R, R), tgt = ids_upload(RM, XV);
    xl = rnd((size_t)(XR * XV), dt, 16, 0, 3),
    xd = buf(
        (size_t)(XR * XV) *
        tpk_dtype_size(
            dt)); /* every token a different table row, the targets spread over the vocabulary */
    size_t nq = (size_t)(AB * AS * 3 * AA * AD), no = (size_t)(AB * AS * AA * AD);
    qkv = rnd(nq, dt, 14, 0, 1), ao = buf(no * tpk_dtype_size(dt)), ado = rnd(no, dt, 15, 0, 1),
    adqkv = buf(nq * tpk_dtype_size(dt));
    alse = buf((size_t)(AB * AA * AS) * 4);
    TRY(tpk_op_sync(&ctx));
    double copy_ms = time_op(OP_COPY, iters), copy_bw = op_bytes(OP_COPY) / (copy_ms * 1e-3) / 1e9;
    if (!json) {
        printf("kernels: backend %s, dtype %s, %lld elements ([%lld, %lld]), cross-entropy [%lld, "
               "%lld], median of %d; attention B=%lld S=%lld A=%lld "
               "D=%lld\n",
               ops->name, tpk_dtype_name(dt), (long long)N, (long long)R, (long long)C,
               (long long)XR, (long long)XV, iters, (long long)AB, (long long)AS, (long long)AA,
               (long long)AD);
        printf("measured copy bandwidth: %.1f GB/s (read + write)\n\n%-16s %10s %10s %8s\n",
               copy_bw, "op", "ms", "GB/s", "% copy");
    } else {
        printf(
            "{\"backend\": \"%s\", \"dtype\": \"%s\", \"n\": %lld, \"xent_shape\": [%lld, %lld], "
            "\"attn_shape\": {\"B\": %lld, \"S\": %lld, "
            "\"A\": %lld, \"D\": %lld}, \"copy_gbs\": %.3f, \"rows\": [",
            ops->name, tpk_dtype_name(dt), (long long)N, (long long)XR, (long long)XV,
            (long long)AB, (long long)AS, (long long)AA, (long long)AD, copy_bw);
    }
    for (int op = OP_FILL; op < OP_N; op++) {
        double ms = time_op(op, iters);
        bool att = op == OP_ATT_F || op == OP_ATT_B;
        double rate = att ? op_flops(op) / (ms * 1e-3) / 1e12 : op_bytes(op) / (ms * 1e-3) / 1e9;
        if (!json) {
            if (att) printf("%-16s %10.3f %10.3f TFLOP/s\n", op_name[op], ms, rate);
            else
                printf("%-16s %10.3f %10.1f %7.1f%%\n", op_name[op], ms, rate,
                       100 * rate / copy_bw);
        } else {
            printf("%s\n  {\"op\": \"%s\", \"ms\": %.4f, \"%s\": %.4f}", op == OP_FILL ? "" : ",",
                   op_name[op], ms, att ? "tflops" : "gbs", rate);
        }
    }
    /* PyTorch's causal attention on the same shape, in the same run (the first python that
     * imports torch: $TPK_PYTHON, python3, /usr/bin/python3) */
    double att_ms[2] = {time_op(OP_ATT_F, iters), time_op(OP_ATT_B, iters)}, pt[2] = {-1, -1};
    char pname[64] = "", cmd[1024];
    const char *pys[] = {getenv("TPK_PYTHON"), "python3", "/usr/bin/python3"};
    for (int k = 0; k < 3 && pt[0] < 0; k++) {
        if (!pys[k]) continue;
        snprintf(cmd, sizeof cmd, "%s bench/torch_attn.py %lld %lld %lld %lld %s %s %d 2>/dev/null",
                 pys[k], (long long)AB, (long long)AS, (long long)AA, (long long)AD,
                 tpk_dtype_name(dt), gpu ? "cuda" : "cpu", iters);
        FILE *p = popen(cmd, "r");
        if (p && fscanf(p, "%lf %lf %63s", &pt[0], &pt[1], pname) != 3) pt[0] = pt[1] = -1;
        if (p) pclose(p);
    }
    /* PyTorch's F.cross_entropy forward + backward on the same logits [XR, XV], against
     * xent_fused (the loss and the gradient of one rank holding the vocabulary), in the same run:
     * the thread count OpenBLAS has (PyTorch's default otherwise) */
    double xent_ms = time_op(OP_XENT_F, iters), ptx = -1;
    const char *thr = getenv("OPENBLAS_NUM_THREADS");
    for (int k = 0; k < 3 && ptx < 0; k++) {
        if (!pys[k]) continue;
        snprintf(cmd, sizeof cmd, "%s bench/torch_xent.py %lld %lld %s %s %d %d 2>/dev/null",
                 pys[k], (long long)XR, (long long)XV, tpk_dtype_name(dt), gpu ? "cuda" : "cpu",
                 iters, thr ? atoi(thr) : 0);
        FILE *p = popen(cmd, "r");
        if (p && fscanf(p, "%lf", &ptx) != 1) ptx = -1;
        if (p) pclose(p);
    }
    /* the CUDA backend's generic attention kernels on the same shape (TPK_ATTN=generic), for the
     * speed-up of the tensor-core ones (bf16, D = 64 or 128) */
    double gen[2] = {-1, -1}, det_ms = -1;
    if (gpu) {
        setenv("TPK_ATTN", "generic", 1);
        gen[0] = time_op(OP_ATT_F, iters), gen[1] = time_op(OP_ATT_B, iters);
        unsetenv("TPK_ATTN");
        ctx.deterministic = true; /* the backward with a dQ kernel of its own instead of f32
                                     atomics */
        det_ms = time_op(OP_ATT_B, iters);
        ctx.deterministic = false;
    }
    if (!json) {
        if (det_ms > 0)
            printf(
                "\nattention backward, deterministic (dQ in a kernel of its own, no atomics): %.3f "
                "ms, %.2fx the default's time\n",
                det_ms, det_ms / att_ms[1]);
        if (gen[0] > 0)
            printf("\nattention with the generic kernels (TPK_ATTN=generic): forward %.3f ms, "
                   "backward %.3f ms; the default path is %.2fx as fast "
                   "(forward+backward)\n",
                   gen[0], gen[1], (gen[0] + gen[1]) / (att_ms[0] + att_ms[1]));
        if (pt[0] > 0)
            printf(
                "\nattention against PyTorch (%s, same shape and dtype): forward %.3f ms vs %.3f "
                "ms (%.0f%% of PyTorch's speed), "
                "forward+backward %.3f ms vs %.3f ms (%.0f%%)\n",
                pname, att_ms[0], pt[0], 100 * pt[0] / att_ms[0], att_ms[0] + att_ms[1],
                pt[0] + pt[1], 100 * (pt[0] + pt[1]) / (att_ms[0] + att_ms[1]));
        else printf("\nattention against PyTorch: not measured (no python with torch)\n");
        if (ptx > 0)
            printf("cross-entropy against PyTorch (F.cross_entropy forward + backward, [%lld, %lld]"
                   " %s): xent_fused %.3f ms vs %.3f ms (%.0f%% of PyTorch's speed)\n",
                   (long long)XR, (long long)XV, tpk_dtype_name(dt), xent_ms, ptx,
                   100 * ptx / xent_ms);
        else printf("cross-entropy against PyTorch: not measured (no python with torch)\n");
    } else {
        if (det_ms > 0)
            printf("\n], \"attn_bwd_deterministic_ms\": %.4f, \"generic_attn\": ", det_ms);
        else printf("\n], \"attn_bwd_deterministic_ms\": null, \"generic_attn\": ");
        if (gen[0] > 0)
            printf("{\"fwd_ms\": %.4f, \"bwd_ms\": %.4f}, \"torch_attn\": ", gen[0], gen[1]);
        else printf("null, \"torch_attn\": ");
        if (pt[0] > 0)
            printf("{\"impl\": \"%s\", \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"tpk_fwd_ms\": %.4f, "
                   "\"tpk_bwd_ms\": %.4f}",
                   pname, pt[0], pt[1], att_ms[0], att_ms[1]);
        else printf("null");
        if (ptx > 0) printf(", \"torch_xent\": {\"ms\": %.4f, \"tpk_ms\": %.4f}}\n", ptx, xent_ms);
        else printf(", \"torch_xent\": null}\n");
    }
    void *all[] = {x,   y,  z,  xf,   gf,  m1,  v1,  w,  b,   mean,  rstd,
                   lse, dl, mx, part, ids, tgt, qkv, ao, ado, adqkv, alse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tpk_op_free(&ctx, all[i]);
    tpk_ctx_destroy(&ctx);
    return 0;
}
