/* bench/block_memory.c — peak memory a block of a model adds, for each activation recompute mode:
 * the kit's Llama against a model of one's own of the same shape (examples/custom_model.c's
 * layout: one RMSNorm feeding grouped-query attention and a GELU MLP in parallel, an untied head),
 * its MLP as wide in parameters as Llama's SwiGLU (F' = 3 F / 2).
 *
 * Each model is built at L and at 2 L blocks and runs one forward and backward of B sequences of
 * S tokens on one rank (f32, the host backend); its peak (tpk_mem_peak: weights, gradients,
 * activations, scratch) at 2 L minus the one at L, over L, is what a block costs.
 *
 *   make build/bench/block_memory && build/bench/block_memory [--hidden 256] [--seq 128]
 * Not a timed test: it prints figures, and checks only that the runs succeed. */
#include <tpk/tpk.h>
#include <tpk/train/model.h>

enum { B = 4, V = 512, L = 2 };

/* the custom model of hidden H, A heads, G key/value heads, MLP width F */
static tpk_lm_config custom(int64_t H, int64_t A, int64_t G, int64_t F, int64_t layers, int64_t S,
                            tpk_recompute rc) {
    tpk_lm_config c = {0};
    c.vocab = V, c.positions = S, c.layers = layers, c.hidden = H;
    c.block.heads = A, c.block.residual = TPK_RESIDUAL_PARALLEL_ONE_NORM;
    c.block.norm_1.kind = TPK_NORM_RMSNORM;
    c.block.attn.kind = TPK_ATTN_GQA, c.block.attn.gqa.kv_heads = G;
    c.block.mlp.kind = TPK_MLP_ACT, c.block.mlp.act.hidden = F;
    c.block.mlp.act.act = TPK_ACT_GELU;
    c.final_norm.kind = TPK_NORM_RMSNORM, c.recompute = rc;
    return c;
}

/* The peak of one forward and backward; *ok false on a failure (printed). */
static double peak(bool llama, int64_t H, int64_t A, int64_t G, int64_t F, int64_t layers,
                   int64_t S, tpk_recompute rc, bool *ok) {
    tpk_ctx ctx = {0};
    tpk_status s = tpk_ctx_init(&ctx, &(tpk_ctx_desc){.seed = 1});
    tpk_model m = {0};
    tpk_lm own = {0};
    tpk_lm *lm = &own;
    if (s == TPK_OK && llama) {
        tpk_model_config mc = {.arch = TPK_ARCH_LLAMA};
        mc.llama = (tpk_llama_config){.vocab = V, .positions = S, .layers = layers, .hidden = H,
                                      .heads = A, .kv_heads = G, .ffn = F, .recompute = rc};
        s = tpk_model_init(&ctx, &m, &mc);
        lm = tpk_model_lm(&m);
    } else if (s == TPK_OK) {
        tpk_lm_config c = custom(H, A, G, 3 * F / 2, layers, S, rc);
        s = tpk_lm_init(&ctx, &own, &c);
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(B * S));
    for (int64_t i = 0; ids && i < B * S; i++) ids[i] = (int32_t)((i * 131 + 7) % V);
    float loss;
    if (s == TPK_OK) s = tpk_lm_forward(&ctx, lm, ids, ids, B, S, &loss);
    if (s == TPK_OK) s = tpk_lm_backward(&ctx, lm, 1.0f);
    double p = (double)tpk_mem_peak(&ctx, false);
    if (s != TPK_OK) fprintf(stderr, "block_memory: %s\n", tpk_last_error(&ctx)), *ok = false;
    free(ids);
    if (llama) tpk_model_destroy(&ctx, &m);
    else tpk_lm_destroy(&ctx, &own);
    tpk_ctx_destroy(&ctx);
    return p;
}

int main(int argc, char **argv) {
    int64_t H = 256, S = 128;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--hidden")) H = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) S = atoll(argv[i + 1]);
        else return fprintf(stderr, "block_memory: unknown flag %s\n", argv[i]), 2;
    }
    int64_t A = H / 32, G = A / 2 > 0 ? A / 2 : 1, F = tpk_llama_default_ffn(H);
    bool ok = true;
    printf("a block's peak memory, one rank, f32: H %lld, %lld heads (%lld K/V), Llama's F %lld "
           "(the own model's GELU MLP %lld), B %d x S %lld tokens\n",
           (long long)H, (long long)A, (long long)G, (long long)F, (long long)(3 * F / 2), B,
           (long long)S);
    printf("%-10s %14s %14s %8s\n", "recompute", "Llama MB", "own model MB", "ratio");
    for (int rc = 0; rc < TPK_RECOMPUTE_COUNT; rc++) {
        tpk_recompute r = rc == 0 ? TPK_RECOMPUTE_NONE
                          : rc == 1 ? TPK_RECOMPUTE_SELECTIVE
                                    : TPK_RECOMPUTE_FULL;
        double b[2];
        for (int k = 0; k < 2; k++)
            b[k] = (peak(k == 0, H, A, G, F, 2 * L, S, r, &ok) -
                    peak(k == 0, H, A, G, F, L, S, r, &ok)) /
                   L / 1e6;
        printf("%-10s %14.3f %14.3f %8.3f\n", tpk_recompute_name(r), b[0], b[1], b[1] / b[0]);
    }
    return ok ? 0 : 1;
}
