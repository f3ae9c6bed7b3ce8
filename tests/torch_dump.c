/* tests/torch_dump.c — one forward and backward of a small GPT-2, Llama, GPT-NeoX, Mixtral or
 * Qwen2-MoE at t = ranks (Mixtral, Qwen2-MoE: t = ranks / ep), written out for the PyTorch
 * reference (tests/torch_ref.py), which rebuilds the model from the same global weights with
 * PyTorch's own layers and compares the loss and every gradient.
 *
 *   mpirun -np N build/tests/torch_dump DIR [sp] [llama [tied] | neox [tanh] | mixtral [ep2] |
 *                                                  qwen2_moe [ep2] [norm] [dense]]
 * sp: sequence parallelism; llama: the Llama model (A = 6 query heads, G = 2 key/value heads,
 * SwiGLU F = 40, rope_theta 1000, RMSNorm eps 1e-5) instead of GPT-2; tied: the Llama's LM head
 * reuses embed_tokens (GPT-2's always does); neox: GPT-NeoX (H = 48, A = 6: heads of 8, half of
 * each rotated, F = 40, rotary base 1000, parallel residual, untied; the exact GELU, or its tanh
 * form with tanh); mixtral: Llama's (untied) with E = 4 experts of F = 40, top-2, aux coefficient
 * 0.1, at EP 1 or 2 (ep2: DP 2 = EP 2, each DP rank its own tokens, the loss their mean, the
 * gradients summed over DP, an expert's over EDP, divided by the DP size; each EP rank's experts
 * in DIR/ep<q>.txt, ep<q>_w.bin, ep<q>_g.bin, each DP rank's tokens in DIR/ids<r>.bin,
 * targets<r>.bin); qwen2_moe: as mixtral's, with q, k, v biases, experts of F = 40 named
 * gate_proj, up_proj, down_proj, a shared expert of F_s = 28 with its sigmoid gate, the top-k
 * weights renormalised only with norm (norm_topk_prob); dense: 6 layers, decoder_sparse_step 2
 * and mlp_only_layers [3] (layers 1 and 5 sparse, 0, 2, 3, 4 dense: a SwiGLU MLP of F_d = 36).
 * Writes DIR/model.txt (config
 * — arch and, for Llama, kv_heads, ffn, rope_theta, norm_eps, tie —, loss, and per parameter: name,
 * global shape, offset in floats), DIR/weights.bin and DIR/grads.bin (f32, global tensors in
 * registry order), DIR/ids.bin and DIR/targets.bin (i32 [B S]). Label smoothing 0.1, two ignored
 * positions, no dropout. */
#include "test.h"

#include <errno.h>
#include <sys/stat.h>

enum { V = 509, P = 16, L = 2, H = 24, A = 6, B = 2, S = 9, T = B * S };
enum { G = 2, F = 40 }; /* Llama: key/value heads, SwiGLU intermediate size */
enum { HN = 48 };        /* GPT-NeoX: hidden size (heads of 8) */
enum { NE = 4, KE = 2 };  /* Mixtral: experts, top-k */
static const float AUX = 0.1f; /* Mixtral: router_aux_loss_coef */
enum { FS = 28 };              /* Qwen2-MoE: the shared expert's intermediate size */
enum { LD = 6, FD = 36 };      /* Qwen2-MoE with dense layers: layers, the dense MLP's size */
static const float PCT = 0.5f; /* GPT-NeoX: the rotated fraction of a head */
static const float EPS = 0.1f, THETA = 1000.0f, RMS_EPS = 1e-5f;

static int write_file(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "torch_dump: cannot write %s\n", path);
        if (f) fclose(f);
        return 1;
    }
    return fclose(f) != 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, np;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    bool sp = false, llama = false, tied = false, neox = false, tanh_gelu = false, bad = argc < 2;
    bool mix = false, qwen = false, norm = false, dense = false;
    int ep = 1;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "sp")) sp = true;
        else if (!strcmp(argv[i], "llama")) llama = true;
        else if (!strcmp(argv[i], "tied")) tied = true;
        else if (!strcmp(argv[i], "neox")) neox = true;
        else if (!strcmp(argv[i], "tanh")) tanh_gelu = true;
        else if (!strcmp(argv[i], "mixtral")) mix = true;
        else if (!strcmp(argv[i], "qwen2_moe")) qwen = true;
        else if (!strcmp(argv[i], "norm")) norm = true;
        else if (!strcmp(argv[i], "dense")) dense = true;
        else if (!strcmp(argv[i], "ep2")) ep = 2;
        else bad = true;
    }
    if (bad || (tied && !llama) || (neox && llama) || (tanh_gelu && !neox) ||
        ((mix || qwen) && (llama || neox || sp)) || (mix && qwen) || ((norm || dense) && !qwen) ||
        (ep > 1 && (!(mix || qwen) || np % ep))) {
        if (me == 0)
            fprintf(stderr, "usage: torch_dump DIR [sp] [llama [tied] | neox [tanh] | mixtral "
                            "[ep2] | qwen2_moe [ep2] [norm] [dense]]\n");
        MPI_Finalize();
        return 2;
    }
    const char *dir = argv[1];
    tpk_comm world;
    tpk_ctx ctx;
    tpk_gpt2 m;
    tpk_llama lm;
    tpk_neox nm;
    tpk_mixtral xm;
    tpk_qwen2_moe qm;
    int rc = 0;
    memset(&m, 0, sizeof m), memset(&lm, 0, sizeof lm), memset(&nm, 0, sizeof nm);
    memset(&xm, 0, sizeof xm), memset(&qm, 0, sizeof qm);
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    tpk_gpt2_config cfg = {.vocab = V,
                           .positions = P,
                           .layers = L,
                           .hidden = H,
                           .heads = A,
                           .label_smoothing = EPS,
                           .sequence_parallel = sp};
    tpk_llama_config lcfg = {.vocab = V,
                             .positions = P,
                             .layers = L,
                             .hidden = H,
                             .heads = A,
                             .kv_heads = G,
                             .ffn = F,
                             .rope_theta = THETA,
                             .norm_eps = RMS_EPS,
                             .label_smoothing = EPS,
                             .tie_embeddings = tied,
                             .sequence_parallel = sp};
    tpk_neox_config ncfg = {.vocab = V, .positions = P, .layers = L, .hidden = HN, .heads = A,
                            .ffn = F, .rotary_pct = PCT, .rope_theta = THETA,
                            .label_smoothing = EPS, .sequence_parallel = sp,
                            .act = tanh_gelu ? TPK_ACT_GELU_TANH : TPK_ACT_GELU};
    tpk_mixtral_config xcfg = {.vocab = V, .positions = P, .layers = L, .hidden = H, .heads = A,
                               .kv_heads = G, .ffn = F, .experts = NE, .top_k = KE,
                               .aux_coef = AUX, .rope_theta = THETA, .norm_eps = RMS_EPS,
                               .label_smoothing = EPS};
    tpk_qwen2_moe_config qcfg = {.vocab = V, .positions = P, .layers = L, .hidden = H, .heads = A,
                                 .kv_heads = G, .moe_ffn = F, .shared_ffn = FS, .experts = NE,
                                 .top_k = KE, .norm_topk_prob = norm, .aux_coef = AUX,
                                 .rope_theta = THETA, .norm_eps = RMS_EPS, .label_smoothing = EPS};
    if (dense) /* (qcfg: the model's dense layers are read from it at init) */
        qcfg.layers = LD, qcfg.sparse_step = 2, qcfg.dense_ffn = FD,
        tpk_layer_set_add(&qcfg.mlp_only, 3);
    int tp = np / ep; /* Mixtral, Qwen2-MoE at ep2: DP = EP = 2 */
    tpk_status s = tpk_ctx_init(
        &ctx, &(tpk_ctx_desc){.world = &world, .tp = tp, .ep = ep, .seed = 17});
    if (s == TPK_OK)
        s = llama  ? tpk_llama_init(&ctx, &lm, &lcfg)
            : neox ? tpk_neox_init(&ctx, &nm, &ncfg)
            : mix  ? tpk_mixtral_init(&ctx, &xm, &xcfg)
            : qwen ? tpk_qwen2_moe_init(&ctx, &qm, &qcfg)
                   : tpk_gpt2_init(&ctx, &m, &cfg);
    tpk_lm *lmp = llama ? &lm.lm : neox ? &nm.lm : mix ? &xm.lm : qwen ? &qm.lm : &m.lm;
    if (s != TPK_OK) {
        tpk_report(&ctx, s, "torch_dump");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    test_set_weights(&ctx, 23, 0.3f);
    int32_t ids[T], tg[T];
    int dr = ctx.dp.rank, dps = ctx.dp.size; /* each DP rank its own tokens (Mixtral at ep2) */
    for (int i = 0; i < T; i++)
        ids[i] = (int32_t)((i * 211 + 5 + 97 * dr) % V),
        tg[i] = (int32_t)((i * 89 + 41 + 13 * dr) % V);
    tg[3] = -100, tg[T - 1] = -100;
    float loss = 0;
    s = tpk_lm_forward(&ctx, lmp, ids, tg, B, S, &loss);
    if (s == TPK_OK) s = tpk_lm_backward(&ctx, lmp, 1.0f);
    /* SP norm weights; shared key/value heads */
    if (s == TPK_OK) s = tpk_params_reduce_partial_grads(&ctx);
    if (s == TPK_OK && dps > 1) { /* the mean over DP: the loss, and below each gradient */
        double l = loss;
        s = tpk_allreduce_host(&ctx, &ctx.dp, &l, 1, TPK_F64, TPK_SUM);
        loss = (float)(l / dps);
    }
    if (s != TPK_OK) {
        tpk_report(&ctx, s, "torch_dump");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* the dense parameters in model.txt, weights.bin, grads.bin; an EP rank's experts in its own */
    size_t total = 0, etotal = 0;
    for (int i = 0; i < ctx.params.n; i++)
        *(ctx.params.list[i].expert ? &etotal : &total) += tpk_param_global_numel(&ctx, i);
    float *w = malloc(total * sizeof(float)), *g = malloc(total * sizeof(float));
    float *ew = malloc((etotal + 1) * sizeof(float)), *eg = malloc((etotal + 1) * sizeof(float));
    size_t off = 0, eoff = 0;
    for (int i = 0; i < ctx.params.n; i++) {
        bool ex = ctx.params.list[i].expert;
        size_t *o = ex ? &eoff : &off, n = tpk_param_global_numel(&ctx, i);
        float *wp = (ex ? ew : w) + *o, *gp = (ex ? eg : g) + *o;
        if (tpk_param_get_global(&ctx, i, false, wp) != TPK_OK ||
            tpk_param_get_global(&ctx, i, true, gp) != TPK_OK ||
            (dps > 1 &&
             tpk_allreduce_host(&ctx, ex ? ctx.edp : ctx.dp_cp, gp, n, TPK_F32, TPK_SUM) != TPK_OK))
            rc = 1;
        for (size_t k = 0; k < n; k++) gp[k] /= (float)dps;
        *o += n;
    }
    bool moe = mix || qwen;
    if (moe && ctx.tp.rank == 0 && ctx.edp->rank == 0 && !rc) { /* this EP rank's experts */
        char name[64], path[512];
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) rc = 1;
        snprintf(path, sizeof path, "%s/ep%d.txt", dir, ctx.ep.rank);
        FILE *f = rc ? NULL : fopen(path, "w");
        if (!f) rc = 1;
        else {
            eoff = 0;
            for (int i = 0; i < ctx.params.n; i++) {
                tpk_param *p = &ctx.params.list[i];
                if (!p->expert) continue;
                fprintf(f, "param %s %zu %d", p->name, eoff, p->ndim);
                for (int d = 0; d < p->ndim; d++) fprintf(f, " %lld", (long long)p->gshape[d]);
                fprintf(f, "\n");
                eoff += tpk_param_global_numel(&ctx, i);
            }
            rc |= fclose(f) != 0;
            snprintf(name, sizeof name, "ep%d_w.bin", ctx.ep.rank);
            rc |= write_file(dir, name, ew, etotal * sizeof(float));
            snprintf(name, sizeof name, "ep%d_g.bin", ctx.ep.rank);
            rc |= write_file(dir, name, eg, etotal * sizeof(float));
        }
    }
    if (moe && ctx.tp.rank == 0 && !rc) { /* this DP rank's tokens */
        char name[64];
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) rc = 1;
        snprintf(name, sizeof name, "ids%d.bin", dr);
        rc |= write_file(dir, name, ids, sizeof ids);
        snprintf(name, sizeof name, "targets%d.bin", dr);
        rc |= write_file(dir, name, tg, sizeof tg);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0 && !rc) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            fprintf(stderr, "torch_dump: cannot create %s\n", dir), rc = 1;
        char path[512];
        snprintf(path, sizeof path, "%s/model.txt", dir);
        FILE *f = rc ? NULL : fopen(path, "w");
        if (!f) rc = 1;
        else {
            if (llama)
                fprintf(
                    f,
                    "config arch llama V %d P %d L %d H %d A %d kv_heads %d ffn %d rope_theta %.9g "
                    "norm_eps %.9g tie %d B %d S %d smoothing %.9g tp %d sp %d\n",
                    V, P, L, H, A, G, F, (double)THETA, (double)RMS_EPS, (int)tied, B, S,
                    (double)EPS, np, (int)sp);
            else if (mix)
                fprintf(f,
                        "config arch mixtral V %d P %d L %d H %d A %d kv_heads %d ffn %d "
                        "experts %d top_k %d aux_coef %.9g rope_theta %.9g norm_eps %.9g tie 0 "
                        "B %d S %d smoothing %.9g tp %d sp 0 ep %d dp %d\n",
                        V, P, L, H, A, G, F, NE, KE, (double)AUX, (double)THETA,
                        (double)RMS_EPS, B, S, (double)EPS, tp, ep, dps);
            else if (qwen)
                fprintf(f,
                        "config arch qwen2_moe V %d P %d L %d H %d A %d kv_heads %d ffn %d "
                        "shared_ffn %d experts %d top_k %d norm_topk_prob %d aux_coef %.9g "
                        "rope_theta %.9g norm_eps %.9g tie 0 B %d S %d smoothing %.9g tp %d sp 0 "
                        "ep %d dp %d sparse_step %d mlp_only %s dense_ffn %d\n",
                        V, P, dense ? LD : L, H, A, G, F, FS, NE, KE, (int)norm, (double)AUX,
                        (double)THETA, (double)RMS_EPS, B, S, (double)EPS, tp, ep, dps,
                        dense ? 2 : 1, dense ? "3" : "-", FD);
            else if (neox)
                fprintf(f,
                        "config arch neox V %d P %d L %d H %d A %d ffn %d rotary_pct %.9g "
                        "rope_theta %.9g ln_eps %.9g gelu_tanh %d B %d S %d smoothing %.9g tp %d "
                        "sp %d\n",
                        V, P, L, HN, A, F, (double)PCT, (double)THETA, 1e-5, (int)tanh_gelu, B, S,
                        (double)EPS, np, (int)sp);
            else
                fprintf(
                    f,
                    "config arch gpt2 V %d P %d L %d H %d A %d B %d S %d smoothing %.9g ln_eps "
                    "%.9g tp %d sp %d\n",
                    V, P, L, H, A, B, S, (double)EPS, 1e-5, np, (int)sp);
            fprintf(f, "loss %.9g\n", (double)loss);
            off = 0;
            for (int i = 0; i < ctx.params.n; i++) {
                tpk_param *p = &ctx.params.list[i];
                if (p->expert) continue; /* in ep<q>.txt */
                fprintf(f, "param %s %zu %d", p->name, off, p->ndim);
                for (int d = 0; d < p->ndim; d++) fprintf(f, " %lld", (long long)p->gshape[d]);
                fprintf(f, "\n");
                off += tpk_param_global_numel(&ctx, i);
            }
            rc |= fclose(f) != 0;
            rc |= write_file(dir, "weights.bin", w, total * sizeof(float));
            rc |= write_file(dir, "grads.bin", g, total * sizeof(float));
            rc |= write_file(dir, "ids.bin", ids, sizeof ids);
            rc |= write_file(dir, "targets.bin", tg, sizeof tg);
        }
    }
    free(w), free(g), free(ew), free(eg);
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    tpk_lm_destroy(&ctx, lmp);
    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    MPI_Finalize();
    return rc;
}
