/* bench/host_block.c — forward + backward time of one GPT-2 block on the host backend at t = 1,
 * next to the same block in PyTorch on the CPU (bench/torch_block.py), one thread each, in the
 * same run. Prints both, the ratio, and GFLOP/s (the GEMM and attention flops of the block).
 *
 *   OPENBLAS_NUM_THREADS=1 build/bench/host_block [--hidden 768] [--heads 12] [--batch 1]
 *       [--seq 1024] [--iters 5] [--json]
 * Times are the median over --iters iterations after one warm-up iteration. PyTorch is run by
 * Debian's /usr/bin/python3 (TPK_PYTHON overrides); without torch its column says so. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, popen */
#include <tpk/tpk.h>

#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    long H = 768, A = 12, B = 1, S = 1024, iters = 5;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        long *dst = NULL;
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--hidden")) dst = &H;
        else if (!strcmp(argv[i], "--heads")) dst = &A;
        else if (!strcmp(argv[i], "--batch")) dst = &B;
        else if (!strcmp(argv[i], "--seq")) dst = &S;
        else if (!strcmp(argv[i], "--iters")) dst = &iters;
        else {
            bool help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            if (!help) fprintf(stderr, "host_block: unknown argument %s\n", argv[i]);
            fprintf(
                help ? stdout : stderr,
                "usage: %s [--hidden 768] [--heads 12] [--batch 1] [--seq 1024] [--iters 5] "
                "[--json]\n",
                argv[0]);
            return help ? 0 : 2;
        }
        if (dst) {
            if (i + 1 >= argc || (*dst = strtol(argv[i + 1], NULL, 10)) < 1) {
                fprintf(stderr, "host_block: %s expects a positive integer\n", argv[i]);
                return 2;
            }
            i++;
        }
    }
    const char *threads = getenv("OPENBLAS_NUM_THREADS");
    if (!threads || strcmp(threads, "1"))
        fprintf(
            stderr,
            "host_block: note: OPENBLAS_NUM_THREADS is not 1; the comparison assumes one thread "
            "each\n");
    long T = B * S;
    tpk_ctx ctx;
    tpk_block blk;
    tpk_status s = tpk_ctx_init(&ctx, &(tpk_ctx_desc){.ops = tpk_ops_host(), .seed = 1});
    if (s == TPK_OK)
        s = tpk_gpt2_block_init(&ctx, &blk, H, &(tpk_gpt2_block_desc){.name = "h.0", .heads = A});
    float *x = malloc(sizeof(float) * (size_t)(T * H)),
          *dy = malloc(sizeof(float) * (size_t)(T * H));
    if (s != TPK_OK || !x || !dy) return tpk_report(&ctx, s ? s : TPK_ERR_NOMEM, "host_block"), 1;
    for (long i = 0; i < T * H; i++)
        x[i] = tpk_rng_normal(3, 0, (uint64_t)i), dy[i] = tpk_rng_normal(4, 0, (uint64_t)i);
    tpk_tensor xt = tpk_tensor_2d(x, TPK_F32, T, H, TPK_R),
               dyt = tpk_tensor_2d(dy, TPK_F32, T, H, TPK_R), y, dx;
    double *tf = malloc(sizeof(double) * (size_t)iters),
           *tb = malloc(sizeof(double) * (size_t)iters);
    for (long it = -1; it < iters && s == TPK_OK; it++) {
        double t0 = now();
        s = tpk_block_forward(&ctx, &blk, xt, B, S, &y);
        double t1 = now();
        if (s == TPK_OK) s = tpk_block_backward(&ctx, &blk, dyt, &dx);
        double t2 = now();
        if (it >= 0) tf[it] = t1 - t0, tb[it] = t2 - t1;
    }
    if (s != TPK_OK) return tpk_report(&ctx, s, "host_block"), 1;
    double fwd = median(tf, (int)iters), bwd = median(tb, (int)iters);
    /* nominal flops, the same for both columns: the 4 linears 2 T H (3H + H + 4H + 4H) forward,
     * twice that backward; attention Q K^T and P V counted over the full S x S (2 products
     * forward, 5 backward: P recomputed, dP, dV, dQ, dK), although tpk skips the masked half */
    double gemm = 2.0 * (double)T * (double)H * 12.0 * (double)H,
           att = 2.0 * (double)B * (double)S * (double)S * (double)H;
    double flops = 3.0 * gemm + 7.0 * att;

    /* PyTorch, the same block, same sizes, one thread */
    const char *py = getenv("TPK_PYTHON") ? getenv("TPK_PYTHON") : "/usr/bin/python3";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s bench/torch_block.py %ld %ld %ld %ld %ld 2>/dev/null", py, H, A,
             B, S, iters);
    double pf = -1, pb = -1;
    FILE *p = popen(cmd, "r");
    if (p) {
        if (fscanf(p, "%lf %lf", &pf, &pb) != 2) pf = pb = -1;
        pclose(p);
    }
    double ours = fwd + bwd, theirs = pf + pb;
    if (json) {
        printf(
            "{\"bench\": \"host_block\", \"H\": %ld, \"A\": %ld, \"B\": %ld, \"S\": %ld, "
            "\"iters\": %ld, \"tpk_fwd_ms\": %.3f, \"tpk_bwd_ms\": %.3f, "
            "\"tpk_gflops\": %.2f",
            H, A, B, S, iters, 1e3 * fwd, 1e3 * bwd, flops / ours * 1e-9);
        if (pf >= 0)
            printf(", \"torch_fwd_ms\": %.3f, \"torch_bwd_ms\": %.3f, \"torch_over_tpk\": %.3f",
                   1e3 * pf, 1e3 * pb, theirs / ours);
        printf("}\n");
    } else {
        printf(
            "GPT-2 block forward+backward, H=%ld A=%ld B=%ld S=%ld (T=%ld), t=1, one thread, "
            "median of %ld\n",
            H, A, B, S, T, iters);
        printf("%-22s %10s %10s %10s %9s\n", "", "fwd ms", "bwd ms", "total ms", "GFLOP/s");
        printf("%-22s %10.1f %10.1f %10.1f %9.1f\n", "tpk host backend", 1e3 * fwd, 1e3 * bwd,
               1e3 * ours, flops / ours * 1e-9);
        if (pf >= 0) {
            printf("%-22s %10.1f %10.1f %10.1f %9.1f\n", "PyTorch CPU", 1e3 * pf, 1e3 * pb,
                   1e3 * theirs, flops / theirs * 1e-9);
            printf("PyTorch time / tpk time = %.2f (above 1: tpk is faster)\n", theirs / ours);
        } else {
            printf("%-22s PyTorch not available (%s cannot import torch)\n", "PyTorch CPU", py);
        }
    }
    free(x), free(dy), free(tf), free(tb);
    tpk_block_destroy(&ctx, &blk);
    tpk_ctx_destroy(&ctx);
    return 0;
}
