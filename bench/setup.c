/* bench/setup.c — model setup time against depth: a context, a tiny GPT-2 and its AdamW state
 * built at 1,000, 4,000 and 16,000 layers (hidden 8, 2 heads, one rank, the host backend), the
 * time per layer printed for each. Setup is linear in the number of parameters when the time per
 * layer stays flat as the depth grows (the parameter registry's name index, amortised buffer
 * growth); a quadratic part shows as a time per layer that grows with the depth.
 *
 *   build/bench/setup [--layers 1000,4000,16000] [--arch gpt2|llama]   (make bench-setup)
 * Not a timed test: it prints figures, it checks nothing but that setup succeeds. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <tpk/tpk.h>
#include <tpk/train/model.h>

#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Build and destroy a context, an L-layer model and its optimizer; *secs: the wall time of the
 * build (context, model, optimizer). */
static tpk_status setup(tpk_arch arch, int64_t L, double *secs, char *err, size_t n) {
    tpk_ctx ctx = {0};
    tpk_model m = {0};
    tpk_adamw opt = {0};
    tpk_model_config cfg = {
        .arch = arch,
        .gpt2 = {.vocab = 256, .positions = 8, .layers = L, .hidden = 8, .heads = 2},
        .llama = {.vocab = 256,
                  .positions = 8,
                  .layers = L,
                  .hidden = 8,
                  .heads = 2,
                  .kv_heads = 2,
                  .ffn = 16,
                  .rope_theta = 10000,
                  .norm_eps = 1e-6f}};
    double t0 = now();
    tpk_status s = tpk_ctx_init(&ctx, &(tpk_ctx_desc){.ops = tpk_ops_host(), .seed = 1});
    bool up = s == TPK_OK;
    if (s == TPK_OK) s = tpk_model_init(&ctx, &m, &cfg);
    if (s == TPK_OK)
        s = tpk_adamw_init(&ctx, &opt, &(tpk_adamw_desc){.b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f});
    *secs = now() - t0;
    if (s != TPK_OK) snprintf(err, n, "%s (%s)", tpk_last_error(&ctx), tpk_status_str(s));
    if (up) tpk_adamw_destroy(&ctx, &opt), tpk_model_destroy(&ctx, &m), tpk_ctx_destroy(&ctx);
    return s;
}

int main(int argc, char **argv) {
    const char *layers = "1000,4000,16000", *arch = "gpt2";
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--layers")) layers = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--arch")) arch = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--layers 1000,4000,16000] [--arch gpt2|llama]\n", argv[0]);
            return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
        }
    }
    if (strcmp(arch, "gpt2") && strcmp(arch, "llama")) {
        fprintf(stderr, "setup: --arch: expected gpt2 or llama, got \"%s\"\n", arch);
        return 2;
    }
    printf("model setup (context + %s, hidden 8, 2 heads + AdamW state; one rank, host backend)\n",
           arch);
    printf("%8s %10s %14s\n", "layers", "setup s", "us per layer");
    for (const char *p = layers; *p;) {
        char *end = NULL, err[1024] = "";
        long long L = strtoll(p, &end, 10);
        if (end == p || L < 1 || (*end && *end != ',')) {
            fprintf(stderr,
                    "setup: --layers: expected positive integers separated by commas, got \"%s\"\n",
                    layers);
            return 2;
        }
        double secs = 0;
        if (setup(strcmp(arch, "llama") ? TPK_ARCH_GPT2 : TPK_ARCH_LLAMA, L, &secs, err,
                  sizeof err) != TPK_OK) {
            fprintf(stderr, "setup: %lld layers: %s\n", L, err);
            return 1;
        }
        printf("%8lld %10.3f %14.1f\n", L, secs, 1e6 * secs / (double)L);
        fflush(stdout);
        p = *end ? end + 1 : end;
    }
    return 0;
}
