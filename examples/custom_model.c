/* examples/custom_model.c — a model of one's own, built from the kit's public parts and trained at
 * TP x DP: a template to copy.
 *
 * The model is none of the kit's families: a pre-norm decoder as GPT-J lays it out — one RMSNorm
 * feeding attention and MLP in parallel, y = x + attn(n(x)) + mlp(n(x)) (the branches summed while
 * partial and reduced once) — with grouped-query attention and rotary embeddings, a plain GELU MLP
 * and an untied head over a padded byte vocabulary. It is data: a tpk_lm_config whose block is a
 * tpk_block_desc. The kit's model (tpk_lm) gives it selective recompute and pooled buffers, the
 * data-parallel buckets check that every gradient was reduced (tpk_dp_*), and the checkpoint
 * (tpk_ckpt_save, _load) saves its parameters and AdamW's moments with a config of its own, loading
 * at any TP and DP size.
 *
 *   mpirun -np 4 build/custom_model --tp 2 --steps 20 [--text FILE] [--save DIR] [--load DIR]
 *
 * The tokens are the bytes of --text (else a built-in paragraph); each step's global batch of
 * B sequences is split over the DP ranks, so the losses are the same at every TP and DP size. */
#include <tpk/tpk.h>
#include <tpk/runtime/mpi.h>
#include <tpk/train/ckpt.h>
#include <tpk/train/train.h>

#define TRY(call)                                                                                  \
    do {                                                                                           \
        tpk_status s_ = (call);                                                                    \
        if (s_ != TPK_OK) {                                                                        \
            tpk_report(&ctx, s_, #call);                                                           \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

enum { V = 256, H = 64, A = 4, G = 2, F = 256, L = 2, B = 4, S = 32 };

static const char *corpus =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
    "of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness, it was the spring of hope, it was the winter "
    "of despair, we had everything before us, we had nothing before us.\n";

/* The model: what a family header would hold. */
static tpk_lm_config model_config(void) {
    tpk_lm_config c = {0};
    c.vocab = V, c.positions = S, c.layers = L, c.hidden = H;
    c.block.name = "layers", c.block.heads = A;
    c.block.residual = TPK_RESIDUAL_PARALLEL_ONE_NORM; /* GPT-J: one norm, two branches */
    c.block.norm_1 = (tpk_norm_desc){.kind = TPK_NORM_RMSNORM, .name = "ln", .eps = 1e-6f};
    c.block.attn.kind = TPK_ATTN_GQA, c.block.attn.name = "attn";
    c.block.attn.gqa.kv_heads = G, c.block.attn.gqa.rope_theta = 10000.0f;
    c.block.mlp.kind = TPK_MLP_ACT, c.block.mlp.name = "mlp";
    c.block.mlp.act.hidden = F, c.block.mlp.act.act = TPK_ACT_GELU;
    c.final_norm = (tpk_norm_desc){.kind = TPK_NORM_RMSNORM, .name = "norm_f", .eps = 1e-6f};
    c.embed_name = "embed.weight", c.head_name = "head.weight"; /* untied */
    c.init_std = 0.02f;
    c.recompute = TPK_RECOMPUTE_SELECTIVE;
    return c;
}
/* Its config.json, saved with each checkpoint. */
static const char *config_json =
    "{\"model_type\": \"custom_gptj\", \"vocab_size\": 256, \"hidden_size\": 64, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 256, "
    "\"num_hidden_layers\": 2, \"max_position_embeddings\": 32}";

static char *read_text(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = *n > 0 ? malloc((size_t)*n) : NULL;
    if (t && fread(t, 1, (size_t)*n, f) != (size_t)*n) free(t), t = NULL;
    fclose(f);
    return t;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int tp = 1, steps = 20;
    const char *text = NULL, *save = NULL, *load = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "custom_model: error: %s: expected a value after it\n", a);
            return 2;
        }
        if (!strcmp(a, "--tp")) tp = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--save")) save = v;
        else if (!strcmp(a, "--load")) load = v;
        else {
            fprintf(stderr,
                    "custom_model: error: unknown flag %s (expected --tp, --steps, --text, "
                    "--save or --load)\n",
                    a);
            return 2;
        }
        i++;
    }
    tpk_comm world;
    tpk_ctx ctx = {0};
    TRY(tpk_comm_mpi(&ctx, MPI_COMM_WORLD, &world));
    if (tp < 1 || steps < 1 || world.size % tp) {
        fprintf(stderr, "custom_model: error: --tp %d, --steps %d: expected a divisor of the %d "
                        "ranks and at least one step\n", tp, steps, world.size);
        return 2;
    }
    TRY(tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = tp, .seed = 1234}));
    int dp = ctx.dp.size;
    if (B % dp) {
        fprintf(stderr, "custom_model: error: %d DP ranks do not split a batch of %d\n", dp, B);
        return 2;
    }

    long n = (long)strlen(corpus);
    char *data = text ? read_text(text, &n) : NULL;
    if (text && (!data || n < S + 2)) {
        fprintf(stderr, "custom_model: error: --text %s: expected a readable file of at least %d "
                        "bytes\n", text, S + 2);
        return 2;
    }
    const char *bytes = data ? data : corpus;

    tpk_lm m;
    tpk_lm_config cfg = model_config();
    TRY(tpk_lm_init(&ctx, &m, &cfg));
    tpk_adamw opt;
    TRY(tpk_adamw_init(&ctx, &opt, &(tpk_adamw_desc){.weight_decay = 0.1f, .zero = dp > 1}));
    tpk_dp_buckets dpb = {0};
    TRY(tpk_dp_init(&ctx, &dpb)); /* every parameter this rank holds: checked each step */
    if (!opt.d.zero) tpk_lm_set_grad_ready(&m, tpk_dp_grad_ready, &dpb); /* ZeRO-1: after */
    int first = 0;
    if (load) {
        tpk_ckpt_info info;
        TRY(tpk_ckpt_load(&ctx, &opt, load, NULL, &info));
        first = (int)info.step;
    }

    int32_t ids[B * S], tg[B * S];
    int b0 = ctx.dp.rank * (B / dp), nb = B / dp; /* this DP rank's sequences */
    for (int step = first; step < steps; step++) {
        for (int k = 0; k < B * S; k++) { /* sequence b starts at (step B + b) 37 in the text */
            long at = ((long)(step * B + k / S) * 37 + k % S) % (n - 1);
            ids[k] = (unsigned char)bytes[at], tg[k] = (unsigned char)bytes[at + 1];
        }
        float loss = 0;
        TRY(tpk_params_zero_grad(&ctx));
        TRY(tpk_dp_begin(&ctx, &dpb, !opt.d.zero));
        TRY(tpk_lm_forward(&ctx, &m, ids + b0 * S, tg + b0 * S, nb, S, &loss));
        TRY(tpk_lm_backward(&ctx, &m, 1.0f));
        TRY(tpk_train_step(&ctx, &opt, &dpb, 3e-3f, 1.0f, 1.0f / (float)dp, NULL));
        double mean = (double)loss / dp; /* the global batch's mean loss */
        TRY(tpk_allreduce_host(&ctx, &ctx.dp, &mean, 1, TPK_F64, TPK_SUM));
        if (world.rank == 0) printf("step %d/%d | loss %.6f\n", step + 1, steps, mean);
    }
    if (save) {
        tpk_ckpt_save_desc sd = {.step = steps, .seed = 1234, .config = config_json};
        TRY(tpk_ckpt_save(&ctx, &opt, save, &sd));
        if (world.rank == 0) printf("saved %s\n", save);
    }
    if (world.rank == 0)
        printf("TP %d x DP %d, %d parameters, peak %.2f MB a rank\n", tp, dp, ctx.params.n,
               (double)tpk_mem_peak(&ctx, false) / 1e6);
    free(data);
    tpk_dp_destroy(&dpb);
    tpk_adamw_destroy(&ctx, &opt);
    tpk_lm_destroy(&ctx, &m);
    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    MPI_Finalize();
    return 0;
}
