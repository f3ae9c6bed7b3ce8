/* examples/gpt2_train.c — a Megatron-style GPT-2 trainer on tpk: tensor parallelism (TP) within
 * groups of --tp consecutive ranks, data parallelism (DP) across them. The template to copy.
 *
 *   mpirun -np 2 build/gpt2_train --text FILE --tp 2 --layers 4 --hidden 128 --heads 4 \
 *       --batch 8 --seq-len 64 --steps 500 --save ckpt --sample 200
 *
 * Per optimizer step (gradient accumulation over --grad-accum micro-batches):
 *   for each micro-batch: ctx.rng_step = its index (new dropout masks); forward; backward with
 *       scale 1/accum (gradients accumulate; no DP communication on these micro-steps)
 *   on the last micro-batch the model's grad_ready hook starts a DP all-reduce of each bucket
 *       (a block's gradients) as soon as the backward has finished it; then all are waited
 *   sequence parallelism: the layernorm gradients (partial over TP) are all-reduced over TP
 *   grad norm  |g|^2 = sum over TP of (sharded params' |g_r|^2 + replicated params' |g|^2 on
 *              TP rank 0 only), so each replicated parameter is counted once; DP replicas hold
 *              the same averaged gradient, so no DP sum
 *   clip       g *= min(1, clip / |g|)
 *   AdamW      fp32 master weights; weight decay on 2-D weights only; lr: linear warm-up then
 *              cosine to lr * min_lr_frac. --dtype bf16 (the default on a GPU): activations and
 *              GEMM operands in bf16, weights through a bf16 copy remade after each step,
 *              gradients accumulated in f32
 * Data: llm.c token shards (header of 256 int32: magic 20240520, version 1, token count; then
 * uint16 tokens) or, with --text, the bytes of any file (vocabulary 256; the last 10% is the
 * validation split). Batch k of DP rank d reads the B*S+1 tokens at ((k * dp + d) * B*S) (wrapping
 * to the start when it would run past the end), inputs tokens[i*S .. i*S+S), targets shifted by
 * one — llm.c's loader — so batch k is a function of k alone and a resume is bit-identical.
 * Checkpoints (--save DIR): model.safetensors with Hugging Face GPT-2 names and layouts (global
 * tensors; Conv1D weights [in, out]), config.json, and optim.safetensors (AdamW moments, global,
 * and the step). Each file is written to a temporary, fsynced and renamed; both files carry the
 * step, and a load refuses a pair that disagrees. --load DIR resumes at any TP and DP size and
 * also reads a Hugging Face GPT-2 directory (config.json + model.safetensors). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tpk/tpk.h>
#include <tpk/mpi.h>
#include <tpk/safetensors.h>
#ifdef TPK_WITH_CUDA /* built where nvcc is found: the GPU when one is present */
#include <tpk/nccl.h>
#endif

/* err = the formatted message; returns 1 (a failure) */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int errf(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return 1;
}

/* ---- options --------------------------------------------------------------------------------- */

typedef struct opts {
    const char *data, *val_data, *text, *save, *load, *csv, *dtype;
    int64_t layers, hidden, heads, vocab, positions;
    int tp, batch, seq, accum, steps, warmup, eval_every, eval_batches, sample, log_every, save_every;
    bool sp, eval_only;
    float dropout, lr, min_lr_frac, wd, clip, b1, b2, smoothing;
    uint64_t seed;
} opts;

static void usage(void) {
    printf("usage: gpt2_train (--text FILE | --data SHARD [--val-data SHARD] | --load DIR) [options]\n"
           "  model:     --layers 4 --hidden 128 --heads 4 --vocab V --positions P (default: --seq-len)\n"
           "  parallel:  --tp 1 --sequence-parallel --dtype f32|bf16 (default: bf16 on a GPU, f32 on the host)\n"
           "  training:  --batch 8 --seq-len 64 --grad-accum 1 --steps 100 --lr 1e-3 --warmup 10\n"
           "             --min-lr-frac 0.1 --weight-decay 0.1 --clip 1.0 --dropout 0 --seed 1\n"
           "  eval:      --eval-every 0 --eval-batches 4 --eval-only\n"
           "  output:    --save DIR (at the end; --save-every K also writes DIR/step-K, ...) --load DIR\n"
           "             --csv FILE --sample N --log-every 1\n");
}

/* "--name value" parsing; returns 0, or 1 with a message */
static int parse(int argc, char **argv, opts *o, char *err, size_t errn) {
    *o = (opts){.layers = 4, .hidden = 128, .heads = 4, .tp = 1, .batch = 8, .seq = 64, .accum = 1, .steps = 100, .warmup = 10,
                .eval_batches = 4, .log_every = 1, .lr = 1e-3f, .min_lr_frac = 0.1f, .wd = 0.1f, .clip = 1.0f, .b1 = 0.9f, .b2 = 0.95f,
                .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
#define STR(flag, field) if (!strcmp(a, flag)) { if (!v) goto missing; o->field = v; i++; continue; }
#define INT(flag, field, lo) if (!strcmp(a, flag)) { if (!v) goto missing; long long x = strtoll(v, &end, 10); \
        if (*end || x < (lo) || x > 1000000000) return errf(err, errn, "%s: expected an integer >= %d, got \"%s\"", a, (int)(lo), v); \
        o->field = x; i++; continue; }
#define FLT(flag, field, lo, hi) if (!strcmp(a, flag)) { if (!v) goto missing; double x = strtod(v, &end); \
        if (*end || !(x >= (lo) && x <= (hi))) return errf(err, errn, "%s: expected a number in [%g, %g], got \"%s\"", a, (double)(lo), (double)(hi), v); \
        o->field = (float)x; i++; continue; }
        STR("--dtype", dtype) STR("--data", data) STR("--val-data", val_data) STR("--text", text) STR("--save", save) STR("--load", load) STR("--csv", csv)
        INT("--layers", layers, 1) INT("--hidden", hidden, 1) INT("--heads", heads, 1) INT("--vocab", vocab, 1) INT("--positions", positions, 1)
        INT("--tp", tp, 1) INT("--batch", batch, 1) INT("--seq-len", seq, 1) INT("--grad-accum", accum, 1) INT("--steps", steps, 0)
        INT("--warmup", warmup, 0) INT("--eval-every", eval_every, 0) INT("--eval-batches", eval_batches, 1) INT("--sample", sample, 0)
        INT("--log-every", log_every, 1) INT("--save-every", save_every, 0) INT("--seed", seed, 0)
        FLT("--lr", lr, 0, 10) FLT("--min-lr-frac", min_lr_frac, 0, 1) FLT("--weight-decay", wd, 0, 10) FLT("--clip", clip, 0, 1e9)
        FLT("--dropout", dropout, 0, 0.99) FLT("--label-smoothing", smoothing, 0, 0.99) FLT("--beta1", b1, 0, 0.9999) FLT("--beta2", b2, 0, 0.9999)
        if (!strcmp(a, "--sequence-parallel")) { o->sp = true; continue; }
        if (!strcmp(a, "--eval-only")) { o->eval_only = true; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return -1; }
        errf(err, errn, "unknown argument \"%s\" (--help lists them)", a);
        return 1;
    missing:
        errf(err, errn, "%s: expects a value", a);
        return 1;
#undef STR
#undef INT
#undef FLT
    }
    if (!o->data && !o->text && !(o->load && o->sample && !o->eval_only)) {
        errf(err, errn, "no data: give --text FILE or --data SHARD");
        return 1;
    }
    if (o->data && o->text) return errf(err, errn, "--data and --text: give one");
    if (!o->data && !o->text) o->steps = 0; /* --load DIR --sample N: sample only */
    if (o->dtype && strcmp(o->dtype, "f32") && strcmp(o->dtype, "bf16")) return errf(err, errn, "--dtype: expected f32 or bf16, got \"%s\"", o->dtype);
    return 0;
}

/* ---- all ranks agree ------------------------------------------------------------------------- */

static int world_rank, world_size;
static MPI_Comm tp_mpi, dp_mpi; /* the TP and DP groups, for host scalars (loss, norm, sampled logits) */


/* Every rank passes its own ok flag and message; if any rank failed, the lowest failing rank
 * prints its one-line message and every rank returns false (so all exit, none hangs). */
static bool agree(bool ok, const char *msg) {
    int bad = ok ? world_size : world_rank, first = 0;
    MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == world_size) return true;
    if (first == world_rank) fprintf(stderr, "gpt2_train: error: %s\n", msg && msg[0] ? msg : "failed");
    return false;
}
static char errbuf[1024], msg[1024]; /* msg: what a step reports; errbuf: what FAIL_IF prints */
#define FAIL_IF(cond, ...) do { bool c_ = (cond); if (c_) snprintf(errbuf, sizeof errbuf, __VA_ARGS__); if (!agree(!c_, errbuf)) goto out; } while (0)
/* a tpk call that every rank makes: on failure every rank stops */
#define TRY(call) do { tpk_status s_ = (call); FAIL_IF(s_ != TPK_OK, "%s (%s)", tpk_last_error(&ctx), tpk_status_str(s_)); } while (0)

/* ---- data ------------------------------------------------------------------------------------ */

typedef struct tokens {
    int32_t *tok;
    int64_t n;
} tokens;

static int read_file(const char *path, uint8_t **out, size_t *n, char *err, size_t errn) {
    FILE *f = fopen(path, "rb");
    if (!f) return errf(err, errn, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    uint8_t *b = malloc(cap);
    for (size_t r; b && (r = fread(b + len, 1, cap - len, f)) > 0;) {
        len += r;
        if (len == cap) {
            uint8_t *nb = realloc(b, cap *= 2);
            if (!nb) free(b);
            b = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!b || bad) return free(b), errf(err, errn, "%s: cannot read%s", path, b ? "" : " (out of memory)"), 1;
    *out = b, *n = len;
    return 0;
}

/* An llm.c token shard: 256 int32 header (magic 20240520, version 1, count), uint16 tokens. */
static int load_shard(const char *path, int64_t vocab, tokens *t, char *err, size_t errn) {
    uint8_t *b;
    size_t n;
    if (read_file(path, &b, &n, err, errn)) return 1;
    int32_t h[256];
    if (n < sizeof h) return free(b), errf(err, errn, "%s: %zu bytes, shorter than the 1024-byte llm.c header", path, n), 1;
    memcpy(h, b, sizeof h);
    if (h[0] != 20240520) return free(b), errf(err, errn, "%s: bad magic %d, expected 20240520 (an llm.c token shard)", path, h[0]), 1;
    if (h[1] != 1) return free(b), errf(err, errn, "%s: version %d, expected 1", path, h[1]), 1;
    if (h[2] < 2 || (size_t)h[2] * 2 != n - sizeof h)
        return free(b), errf(err, errn, "%s: header says %d tokens, the file holds %zu bytes of tokens", path, h[2], n - sizeof h), 1;
    t->n = h[2];
    t->tok = malloc(sizeof(int32_t) * (size_t)t->n);
    for (int64_t i = 0; t->tok && i < t->n; i++) {
        uint16_t x;
        memcpy(&x, b + sizeof h + 2 * i, 2);
        t->tok[i] = x;
        if (x >= vocab) {
            errf(err, errn, "%s: token %lld is %u, not below the model's vocabulary of %lld", path, (long long)i, x, (long long)vocab);
            free(b), free(t->tok), t->tok = NULL;
            return 1;
        }
    }
    free(b);
    return t->tok ? 0 : errf(err, errn, "out of memory");
}

/* Batch k of DP rank d: inputs and targets [B S], as llm.c's loader takes them. */
static void get_batch(const tokens *t, int64_t k, int dp, int d, int B, int S, int32_t *x, int32_t *y) {
    int64_t span = (int64_t)B * S, windows = (t->n - 1) / span, w = (k * dp + d) % windows;
    const int32_t *p = t->tok + w * span;
    for (int64_t i = 0; i < span; i++) x[i] = p[i], y[i] = p[i + 1];
}

/* ---- checkpoints: Hugging Face GPT-2 names and layouts ---------------------------------------- */

/* Conv1D weights are stored [in, out] by Hugging Face, [out, in] here */
static bool is_conv1d(const char *name) {
    size_t n = strlen(name);
    return n > 7 && !strcmp(name + n - 7, ".weight") && strncmp(name, "wte", 3) && strncmp(name, "wpe", 3) && !strstr(name, "ln_");
}
static void transpose(const float *in, float *out, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) out[j * rows + i] = in[i * cols + j];
}

static int write_text_atomic(const char *path, const char *text, char *err, size_t errn) {
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    bool ok = f && fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) {
        errf(err, errn, "%s: cannot write: %s", path, strerror(errno));
        remove(tmp);
        return 1;
    }
    return 0;
}

/* The number after "key": in a JSON text (config.json); def when absent. */
static double json_num(const char *js, const char *key, double def, bool *found) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    for (const char *p = strstr(js, pat); p; p = strstr(p + 1, pat)) {
        const char *q = p + strlen(pat);
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
        if (*q != ':') continue;
        char *end;
        double v = strtod(q + 1, &end);
        if (end != q + 1) {
            if (found) *found = true;
            return v;
        }
    }
    return def;
}

typedef struct trainer {
    tpk_ctx *ctx;
    tpk_gpt2 *m;
    float *mom, *var; /* AdamW moments, laid out like the parameters */
    int64_t step;     /* optimizer steps done */
} trainer;

/* Gather every parameter (and the moments) and write DIR on world rank 0. Collective. */
static int save_checkpoint(trainer *tr, const opts *o, const char *dir, char *err, size_t errn) {
    tpk_ctx *ctx = tr->ctx;
    int n = ctx->params.n, rc = 0;
    if (world_rank == 0 && mkdir(dir, 0755) != 0 && errno != EEXIST) rc = errf(err, errn, "%s: cannot create: %s", dir, strerror(errno));
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rc) return errf(err, errn, "%s: cannot create the checkpoint directory", dir);
    float **w = calloc((size_t)n * 3, sizeof *w);
    tpk_st_entry *e = calloc((size_t)n * 3, sizeof *e);
    int64_t(*shapes)[2] = calloc((size_t)n, sizeof *shapes);
    char(*names)[2][112] = calloc((size_t)n, sizeof *names);
    for (int i = 0; i < n && !rc; i++) {
        tpk_param *p = &ctx->params.list[i];
        size_t gn = tpk_param_global_numel(ctx, i);
        for (int k = 0; k < 3; k++) w[3 * i + k] = malloc(gn * sizeof(float));
        const float *flat[3] = {(const float *)ctx->params.data.p, tr->mom, tr->var};
        for (int k = 0; k < 3 && !rc; k++) rc = tpk_param_gather(ctx, i, flat[k], w[3 * i + k]) != TPK_OK;
        if (is_conv1d(p->name) && p->ndim == 2) { /* Hugging Face's [in, out] for the model file */
            float *t = malloc(gn * sizeof(float));
            transpose(w[3 * i], t, p->gshape[0], p->gshape[1]);
            free(w[3 * i]), w[3 * i] = t;
            shapes[i][0] = p->gshape[1], shapes[i][1] = p->gshape[0];
        } else {
            shapes[i][0] = p->gshape[0], shapes[i][1] = p->ndim > 1 ? p->gshape[1] : 0;
        }
        e[i] = (tpk_st_entry){p->name, TPK_ST_F32, p->ndim, shapes[i], w[3 * i]};
        snprintf(names[i][0], sizeof names[i][0], "%s.exp_avg", p->name);
        snprintf(names[i][1], sizeof names[i][1], "%s.exp_avg_sq", p->name);
        e[n + 2 * i] = (tpk_st_entry){names[i][0], TPK_ST_F32, p->ndim, p->gshape, w[3 * i + 1]};
        e[n + 2 * i + 1] = (tpk_st_entry){names[i][1], TPK_ST_F32, p->ndim, p->gshape, w[3 * i + 2]};
    }
    if (rc) errf(err, errn, "gathering the parameters: %s", tpk_last_error(ctx));
    if (world_rank == 0 && !rc) {
        char path[1024], stepstr[32], cfg[1024];
        snprintf(stepstr, sizeof stepstr, "%lld", (long long)tr->step);
        const char *meta[] = {"format", "pt", "step", stepstr, NULL};
        const char *ometa[] = {"format", "tpk-adamw", "step", stepstr, NULL};
        tpk_status s;
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        if ((s = tpk_st_write(ctx, path, e + n, 2 * n, ometa)) == TPK_OK) {
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            s = tpk_st_write(ctx, path, e, n, meta);
        }
        if (s != TPK_OK) rc = errf(err, errn, "%s", tpk_last_error(ctx));
        const tpk_gpt2_config *c = &tr->m->c;
        snprintf(cfg, sizeof cfg,
                 "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %lld,\n  \"n_positions\": %lld,\n"
                 "  \"n_ctx\": %lld,\n  \"n_embd\": %lld,\n  \"n_layer\": %lld,\n  \"n_head\": %lld,\n  \"n_inner\": null,\n"
                 "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": %g,\n  \"resid_pdrop\": %g,\n  \"embd_pdrop\": %g,\n"
                 "  \"attn_pdrop\": %g,\n  \"tie_word_embeddings\": true,\n  \"tpk_step\": %lld,\n  \"tpk_seed\": %llu\n}\n",
                 (long long)c->vocab, (long long)c->positions, (long long)c->positions, (long long)c->hidden, (long long)c->layers, (long long)c->heads,
                 (double)(c->ln_eps > 0 ? c->ln_eps : 1e-5f), (double)o->dropout, (double)o->dropout, (double)o->dropout, (long long)tr->step,
                 (unsigned long long)o->seed);
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (!rc) rc = write_text_atomic(path, cfg, err, errn);
    }
    for (int i = 0; i < 3 * n; i++) free(w[i]);
    free(w), free(e), free(shapes), free(names);
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rc && world_rank) errf(err, errn, "writing the checkpoint failed on rank 0");
    return rc;
}

/* Read config.json of DIR into the model dims of *o. */
static int load_config(const char *dir, opts *o, char *err, size_t errn) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    uint8_t *b;
    size_t n;
    if (read_file(path, &b, &n, err, errn)) return 1;
    char *js = realloc(b, n + 1);
    if (!js) return free(b), errf(err, errn, "out of memory"), 1;
    js[n] = 0;
    bool fl = false, fh = false, fa = false, fv = false, fp = false;
    double L = json_num(js, "n_layer", 0, &fl), H = json_num(js, "n_embd", 0, &fh), A = json_num(js, "n_head", 0, &fa);
    double V = json_num(js, "vocab_size", 0, &fv), P = json_num(js, "n_positions", 0, &fp), eps = json_num(js, "layer_norm_epsilon", 1e-5, NULL);
    free(js);
    if (!fl || !fh || !fa || !fv || !fp)
        return errf(err, errn, "%s: missing %s", path, !fl ? "n_layer" : !fh ? "n_embd" : !fa ? "n_head" : !fv ? "vocab_size" : "n_positions");
    if (L < 1 || H < 1 || A < 1 || V < 1 || P < 1 || L > 1e5 || H > 1e6 || A > H || V > 1e8 || P > 1e8 || (int64_t)H % (int64_t)A || eps <= 0)
        return errf(err, errn, "%s: implausible configuration (n_layer %g, n_embd %g, n_head %g, vocab_size %g, n_positions %g)", path, L, H, A, V, P);
    o->layers = (int64_t)L, o->hidden = (int64_t)H, o->heads = (int64_t)A, o->vocab = (int64_t)V, o->positions = (int64_t)P;
    return 0;
}

/* Set every parameter (and, when DIR has optim.safetensors, the moments and step) from DIR. */
static int load_checkpoint(trainer *tr, const char *dir, char *err, size_t errn) {
    tpk_ctx *ctx = tr->ctx;
    char path[1024];
    tpk_st_file f = {0}, of = {0};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (tpk_st_read(ctx, path, &f) != TPK_OK) return errf(err, errn, "%s", tpk_last_error(ctx));
    snprintf(path, sizeof path, "%s/optim.safetensors", dir);
    bool have_opt = access(path, F_OK) == 0;
    if (have_opt && tpk_st_read(ctx, path, &of) != TPK_OK) return tpk_st_close(&f), errf(err, errn, "%s", tpk_last_error(ctx)), 1;
    int rc = 0;
    for (int i = 0; i < ctx->params.n && !rc; i++) {
        tpk_param *p = &ctx->params.list[i];
        char alt[160];
        snprintf(alt, sizeof alt, "transformer.%s", p->name);
        const tpk_st_tensor *t = tpk_st_find(&f, p->name);
        if (!t) t = tpk_st_find(&f, alt);
        if (!t) { rc = errf(err, errn, "%s/model.safetensors: no tensor \"%s\"", dir, p->name); break; }
        bool conv = is_conv1d(p->name) && p->ndim == 2;
        int64_t want[2] = {conv ? p->gshape[1] : p->gshape[0], conv ? p->gshape[0] : (p->ndim > 1 ? p->gshape[1] : 0)};
        if (t->ndim != p->ndim || t->shape[0] != want[0] || (p->ndim > 1 && t->shape[1] != want[1])) {
            rc = errf(err, errn, "%s/model.safetensors: \"%s\" has shape [%lld%s%lld], config.json implies [%lld%s%lld]", dir, t->name,
                          (long long)t->shape[0], t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)want[0],
                          p->ndim > 1 ? ", " : "", p->ndim > 1 ? (long long)want[1] : 0LL);
            break;
        }
        size_t gn = tpk_param_global_numel(ctx, i);
        float *w = malloc(gn * sizeof(float)), *tw = conv ? malloc(gn * sizeof(float)) : NULL;
        if (tpk_st_get_f32(ctx, &f, t, w, gn) != TPK_OK) rc = errf(err, errn, "%s", tpk_last_error(ctx));
        if (!rc && conv) transpose(w, tw, want[0], want[1]);
        if (!rc && tpk_param_set_global(ctx, i, conv ? tw : w) != TPK_OK) rc = errf(err, errn, "%s", tpk_last_error(ctx));
        for (int k = 0; k < 2 && have_opt && !rc; k++) {
            char on[160];
            snprintf(on, sizeof on, "%s.%s", p->name, k ? "exp_avg_sq" : "exp_avg");
            const tpk_st_tensor *ot = tpk_st_find(&of, on);
            if (!ot) { rc = errf(err, errn, "%s/optim.safetensors: no tensor \"%s\"", dir, on); break; }
            if (tpk_st_get_f32(ctx, &of, ot, w, gn) != TPK_OK || tpk_param_scatter(ctx, i, w, k ? tr->var : tr->mom) != TPK_OK)
                rc = errf(err, errn, "%s", tpk_last_error(ctx));
        }
        free(w), free(tw);
    }
    if (!rc && have_opt) {
        const char *ms = tpk_st_meta(&f, "step"), *os = tpk_st_meta(&of, "step");
        if (!os || (ms && strcmp(ms, os)))
            rc = errf(err, errn, "%s: optim.safetensors (step %s) does not belong to model.safetensors (step %s)", dir, os ? os : "?", ms ? ms : "?");
        else tr->step = strtoll(os, NULL, 10);
    }
    tpk_st_close(&f), tpk_st_close(&of);
    return rc;
}

/* ---- training pieces ----------------------------------------------------------------------- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float lr_at(const opts *o, int64_t step) {
    if (step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    double span = o->steps > o->warmup ? (double)(o->steps - o->warmup) : 1.0, r = (double)(step - o->warmup) / span;
    if (r > 1) r = 1;
    double c = 0.5 * (1 + cos(3.141592653589793 * r)), lo = o->lr * o->min_lr_frac;
    return (float)(lo + (o->lr - lo) * c);
}

/* Data-parallel gradient buckets: a block's gradients all-reduced (sum) over DP as soon as the
 * backward has finished them. */
typedef struct dp_buckets {
    tpk_request req[4096];
    int n;
} dp_buckets;

static tpk_status start_bucket(tpk_ctx *ctx, int first, int last, void *user) {
    dp_buckets *b = (dp_buckets *)user;
    if (ctx->dp.size == 1) return TPK_OK;
    if (b->n == 4096) return tpk__fail(ctx, TPK_ERR_ARG, "start_bucket", "more than 4096 buckets");
    tpk_param *p0 = &ctx->params.list[first], *p1 = &ctx->params.list[last];
    size_t off = p0->offset, n = p1->offset + p1->numel - off;
    float *g = (float *)ctx->params.grad.p + off;
    b->req[b->n] = (tpk_request){0};
    return tpk_allreduce_start(ctx, &ctx->dp, g, g, n, TPK_F32, TPK_SUM, &b->req[b->n++]);
}

/* |g|: each sharded parameter's shard on every TP rank, each replicated one on TP rank 0 only */
static tpk_status grad_norm(tpk_ctx *ctx, float scale, double *norm) {
    double local = 0;
    for (int i = 0; i < ctx->params.n; i++) {
        tpk_param *p = &ctx->params.list[i];
        if (!p->numel || (p->split_dim < 0 && ctx->tp.rank != 0)) continue;
        double s;
        TPK_TRY(ctx->ops->sumsq(ctx, &s, tpk_param_grad(ctx, i), p->numel));
        local += s;
    }
    MPI_Allreduce(MPI_IN_PLACE, &local, 1, MPI_DOUBLE, MPI_SUM, tp_mpi);
    *norm = sqrt(local) * scale;
    return TPK_OK;
}

/* Mean loss of K validation batches, averaged over DP. Collective. */
static tpk_status evaluate(tpk_ctx *ctx, tpk_gpt2 *m, const tokens *val, const opts *o, int32_t *x, int32_t *y, double *out) {
    double sum = 0;
    for (int k = 0; k < o->eval_batches; k++) {
        float loss;
        get_batch(val, k, ctx->dp.size, ctx->dp.rank, o->batch, o->seq, x, y);
        TPK_TRY(tpk_gpt2_forward(ctx, m, x, y, o->batch, o->seq, &loss));
        sum += loss;
    }
    sum /= o->eval_batches;
    MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, dp_mpi);
    *out = sum / ctx->dp.size;
    return TPK_OK;
}

/* Sample n tokens after `start`: the logits of the last position are gathered over TP, and every
 * rank draws the same token from (seed, "sample", i). */
static tpk_status sample(tpk_ctx *ctx, tpk_gpt2 *m, int32_t start, int n, uint64_t seed, bool bytes) {
    int64_t P = m->c.positions, V = m->c.vocab;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(n + 1));
    float *row = malloc(sizeof(float) * (size_t)V), *loc = malloc(sizeof(float) * (size_t)V);
    int *counts = malloc(sizeof(int) * 2 * (size_t)ctx->tp.size), *displs = counts + ctx->tp.size;
    if (!seq || !row || !loc || !counts) return free(seq), free(row), free(loc), free(counts), tpk__fail(ctx, TPK_ERR_NOMEM, "sample", "out of memory");
    for (int q = 0; q < ctx->tp.size; q++) counts[q] = (int)tpk_split(V, ctx->tp.size, q).size, displs[q] = (int)tpk_split(V, ctx->tp.size, q).off;
    seq[0] = start;
    tpk_status s = TPK_OK;
    for (int i = 0; i < n && s == TPK_OK; i++) {
        int64_t len = i + 1, S = len < P ? len : P;
        s = tpk_gpt2_forward(ctx, m, seq + len - S, NULL, 1, S, NULL);
        if (s != TPK_OK) break;
        int64_t Vl = m->logits.shape[1];
        s = ctx->ops->memcpy(ctx, loc, (const float *)m->logits.data + (S - 1) * Vl, sizeof(float) * (size_t)Vl, ctx->ops->device ? TPK_D2H : TPK_H2H);
        if (s != TPK_OK) break;
        MPI_Allgatherv(loc, (int)Vl, MPI_FLOAT, row, counts, displs, MPI_FLOAT, tp_mpi);
        double mx = -INFINITY, z = 0, u = tpk_rng_uniform(seed, tpk_rng_stream("sample"), (uint64_t)i), c = 0;
        for (int64_t j = 0; j < V; j++) mx = fmax(mx, row[j]);
        for (int64_t j = 0; j < V; j++) z += exp(row[j] - mx);
        int32_t tok = (int32_t)(V - 1);
        for (int64_t j = 0; j < V; j++)
            if ((c += exp(row[j] - mx) / z) > u) { tok = (int32_t)j; break; }
        seq[i + 1] = tok;
    }
    if (s == TPK_OK && world_rank == 0) {
        printf("--- sample (%d tokens) ---\n", n);
        for (int i = 1; i <= n; i++) {
            if (bytes) putchar(seq[i] == '\n' || seq[i] == '\t' || (seq[i] >= 32 && seq[i] < 127) ? seq[i] : '?');
            else printf("%d ", seq[i]);
        }
        printf("\n---\n");
    }
    free(seq), free(row), free(loc), free(counts);
    return s;
}

/* The config hash every rank must share. */
static uint64_t config_hash(const opts *o) {
    char s[2048];
    snprintf(s, sizeof s, "%s %d %lld %lld %lld %lld %lld %d %d %d %d %d %d %d %d %d %d %g %g %g %g %g %g %g %g %llu %s %s %s %s %s",
             o->dtype ? o->dtype : "", o->save_every, (long long)o->layers, (long long)o->hidden, (long long)o->heads, (long long)o->vocab, (long long)o->positions, o->tp, o->batch, o->seq,
             o->accum, o->steps, o->warmup, o->eval_every, o->eval_batches, o->sample, (int)o->sp, (double)o->dropout, (double)o->lr,
             (double)o->min_lr_frac, (double)o->wd, (double)o->clip, (double)o->b1, (double)o->b2, (double)o->smoothing, (unsigned long long)o->seed,
             o->data ? o->data : "", o->val_data ? o->val_data : "", o->text ? o->text : "", o->load ? o->load : "", o->eval_only ? "eval" : "train");
    return tpk_rng_stream(s);
}

static void plot(const char *csv) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) return;
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "gnuplot -e \"set terminal png size 800,500; set output '%s.png'; set datafile separator ','; set key autotitle columnhead; "
             "set xlabel 'step'; set ylabel 'loss'; plot '%s' using 1:2 with lines title 'train', '' using 1:3 with points pt 7 title 'val'\" 2>/dev/null",
             csv, csv);
    if (system(cmd) == 0) printf("plot: %s.png\n", csv);
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    opts o;
    int rc = 1, pr = parse(argc, argv, &o, msg, sizeof msg);
    tpk_comm world = {0};
    tpk_ctx ctx = {0};
    tpk_gpt2 m = {0};
    tokens train = {0}, val = {0};
    int32_t *x = NULL, *y = NULL;
    float *mom = NULL, *var = NULL;
    FILE *csv = NULL;
    bool ctx_up = false, model_up = false;
    if (pr < 0) { MPI_Finalize(); return 0; }
    if (!agree(pr == 0, msg)) goto out;
    /* every rank must have been started with the same configuration */
    uint64_t h = config_hash(&o), hmin = h, hmax = h;
    MPI_Allreduce(MPI_IN_PLACE, &hmin, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hmax, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    FAIL_IF(hmin != hmax, "the ranks were started with different configurations (arguments differ between ranks)");
    FAIL_IF(world_size % o.tp, "--tp %d does not divide the %d ranks", o.tp, world_size);

    /* data, and the model shape (from the checkpoint when loading) */
    bool bytes = o.text != NULL;
    if (bytes && !o.vocab) o.vocab = 256;
    if (o.load) FAIL_IF(load_config(o.load, &o, msg, sizeof msg), "%s", msg);
    if (!o.vocab) o.vocab = 50257;
    if (!o.positions) o.positions = o.seq;
    FAIL_IF(bytes && o.vocab < 256, "--text needs a vocabulary of at least 256 (the model has %lld)", (long long)o.vocab);
    FAIL_IF(o.seq > o.positions, "--seq-len %d is longer than the model's %lld positions", o.seq, (long long)o.positions);
    FAIL_IF(o.hidden % o.heads, "--hidden %lld is not a multiple of --heads %lld", (long long)o.hidden, (long long)o.heads);
    if (o.text) {
        uint8_t *b = NULL;
        size_t n = 0;
        int bad = read_file(o.text, &b, &n, msg, sizeof msg);
        int64_t span = (int64_t)o.batch * o.seq + 1;
        if (!bad && (int64_t)n < 10 * span) bad = errf(msg, sizeof msg, "%s: %zu bytes, too short for batches of %lld tokens", o.text, n, (long long)span);
        if (!bad) {
            int64_t nv = (int64_t)n / 10 > span ? (int64_t)n / 10 : span;
            train.n = (int64_t)n - nv, val.n = nv;
            train.tok = malloc(sizeof(int32_t) * (size_t)train.n), val.tok = malloc(sizeof(int32_t) * (size_t)val.n);
            for (int64_t i = 0; i < (int64_t)n; i++) *(i < train.n ? &train.tok[i] : &val.tok[i - train.n]) = b[i];
        }
        double cnt[256] = {0}, ent = 0; /* the byte-unigram entropy: the loss to beat */
        for (int64_t i = 0; !bad && i < train.n; i++) cnt[train.tok[i]] += 1;
        for (int i = 0; !bad && i < 256; i++)
            if (cnt[i] > 0) ent -= cnt[i] / (double)train.n * log(cnt[i] / (double)train.n);
        if (!bad && world_rank == 0)
            printf("data: %s, %lld training and %lld validation bytes; byte-unigram entropy %.3f nats\n", o.text, (long long)train.n, (long long)val.n, ent);
        free(b);
        FAIL_IF(bad, "%s", msg);
    } else if (o.data) {
        FAIL_IF(load_shard(o.data, o.vocab, &train, msg, sizeof msg), "%s", msg);
        FAIL_IF(o.val_data && load_shard(o.val_data, o.vocab, &val, msg, sizeof msg), "%s", msg);
        if (!o.val_data) val = (tokens){train.tok, train.n}; /* evaluate on the training shard */
        FAIL_IF(train.n < (int64_t)o.batch * o.seq + 1 || val.n < (int64_t)o.batch * o.seq + 1,
                "the data holds fewer than B x S + 1 = %lld tokens", (long long)o.batch * o.seq + 1);
    }

    /* the backend (a GPU per rank where one is present), the mesh, the model, the optimizer */
    const tpk_ops *ops = tpk_ops_host();
    bool gpu = false;
#ifdef TPK_WITH_CUDA
    int ndev = tpk_cuda_device_count();
    if (ndev > 0) {
        MPI_Comm node;
        int local = 0, per_node = 1;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local), MPI_Comm_size(node, &per_node);
        MPI_Comm_free(&node);
        TRY(tpk_cuda_set_device(&ctx, local % ndev));
        ops = tpk_ops_cuda(), gpu = true;
        if (per_node <= ndev) TRY(tpk_comm_nccl_mpi(&ctx, MPI_COMM_WORLD, NULL, &world)); /* one GPU per rank */
        else TRY(tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world));                                /* ranks share GPUs */
    }
#endif
    if (!gpu) TRY(tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world));
    tpk_dtype adt = o.dtype ? (strcmp(o.dtype, "bf16") ? TPK_F32 : TPK_BF16) : gpu ? TPK_BF16 : TPK_F32; /* master weights stay f32 */
    TRY(tpk_ctx_init(&ctx, &(tpk_ctx_desc){.ops = ops, .world = &world, .tp = o.tp, .seed = o.seed, .dtype = adt}));
    ctx_up = true;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank / o.tp, world_rank, &tp_mpi); /* consecutive ranks, as tpk_ctx_init */
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % o.tp, world_rank, &dp_mpi);
    tpk_gpt2_config cfg = {.vocab = o.vocab, .positions = o.positions, .layers = o.layers, .hidden = o.hidden, .heads = o.heads, .dropout = o.dropout,
                           .label_smoothing = o.smoothing, .sequence_parallel = o.sp};
    TRY(tpk_gpt2_init(&ctx, &m, &cfg));
    model_up = true;
    size_t pbytes = sizeof(float) * (ctx.params.numel ? ctx.params.numel : 1);
    TRY(ctx.ops->alloc(&ctx, pbytes, (void **)&mom));
    TRY(ctx.ops->alloc(&ctx, pbytes, (void **)&var));
    trainer tr = {&ctx, &m, mom, var, 0};
    if (o.load) FAIL_IF(load_checkpoint(&tr, o.load, msg, sizeof msg), "%s", msg);
    int dp = ctx.dp.size;
    size_t nglobal = 0;
    for (int i = 0; i < ctx.params.n; i++) nglobal += tpk_param_global_numel(&ctx, i);
    if (world_rank == 0)
        printf("gpt2_train: %d ranks = TP %d x DP %d%s, %s backend, %s | GPT-2 L=%lld H=%lld A=%lld V=%lld P=%lld, %.2fM parameters | B=%d S=%d accum %d\n",
               world_size, o.tp, dp, o.sp ? " (sequence parallel)" : "", ctx.ops->name, adt == TPK_BF16 ? "bf16 (f32 master weights)" : "f32", (long long)o.layers, (long long)o.hidden, (long long)o.heads,
               (long long)o.vocab, (long long)o.positions, (double)nglobal * 1e-6, o.batch, o.seq, o.accum);
    x = malloc(sizeof(int32_t) * (size_t)o.batch * (size_t)o.seq);
    y = malloc(sizeof(int32_t) * (size_t)o.batch * (size_t)o.seq);

    if (o.eval_only) {
        double vl = 0;
        FAIL_IF(!val.tok, "--eval-only needs --data or --text");
        tpk_gpt2_set_dropout(&m, 0);
        TRY(evaluate(&ctx, &m, &val, &o, x, y, &vl));
        if (world_rank == 0) printf("val_loss %.6f\n", vl);
        if (o.sample) TRY(sample(&ctx, &m, o.vocab <= 256 ? '\n' : o.vocab > 50256 ? 50256 : 0, o.sample, o.seed, o.vocab <= 256));
        rc = 0;
        goto out;
    }

    if (o.csv && world_rank == 0) {
        csv = fopen(o.csv, "w");
        FAIL_IF(!csv, "%s: cannot write: %s", o.csv, strerror(errno));
        fprintf(csv, "step,train_loss,val_loss,lr,grad_norm\n");
    } else if (o.csv) {
        FAIL_IF(false, "%s", "");
    }
    dp_buckets buckets;
    m.grad_ready_user = &buckets;
    double t_start = now();
    for (int64_t step = tr.step; step < o.steps; step++) {
        double t0 = now(), lsum = 0;
        float lr = lr_at(&o, step);
        TRY(tpk_params_zero_grad(&ctx));
        buckets.n = 0;
        for (int k = 0; k < o.accum; k++) {
            int64_t micro = step * o.accum + k;
            float loss;
            ctx.rng_step = (uint64_t)micro;
            get_batch(&train, micro, dp, ctx.dp.rank, o.batch, o.seq, x, y);
            TRY(tpk_gpt2_forward(&ctx, &m, x, y, o.batch, o.seq, &loss));
            m.grad_ready = k == o.accum - 1 ? start_bucket : NULL; /* DP only after the last micro-batch */
            TRY(tpk_gpt2_backward(&ctx, &m, 1.0f / (float)o.accum));
            lsum += loss;
        }
        for (int i = 0; i < buckets.n; i++) TRY(tpk_wait(&ctx, &buckets.req[i]));
        TRY(tpk_params_reduce_partial_grads(&ctx));
        double norm = 0;
        float gscale = 1.0f / (float)dp;
        TRY(grad_norm(&ctx, gscale, &norm));
        FAIL_IF(!isfinite(norm), "step %lld: the gradient norm is %g", (long long)step + 1, norm);
        if (o.clip > 0 && norm > o.clip) gscale *= (float)(o.clip / norm);
        for (int i = 0; i < ctx.params.n; i++) {
            tpk_param *p = &ctx.params.list[i];
            if (!p->numel) continue;
            TRY(ctx.ops->adamw(&ctx, tpk_param_data(&ctx, i), tpk_param_grad(&ctx, i), mom + p->offset, var + p->offset, p->numel, lr, o.b1, o.b2, 1e-8f,
                               p->decay ? o.wd : 0.0f, step + 1, gscale));
        }
        tpk_params_updated(&ctx); /* a bf16 context remakes its bf16 weights */
        tr.step = step + 1;
        double l = lsum / o.accum;
        MPI_Allreduce(MPI_IN_PLACE, &l, 1, MPI_DOUBLE, MPI_SUM, dp_mpi);
        l /= dp;
        double ms = 1e3 * (now() - t0), vl = NAN;
        if (o.eval_every && (tr.step % o.eval_every == 0 || tr.step == o.steps)) {
            tpk_gpt2_set_dropout(&m, 0);
            TRY(evaluate(&ctx, &m, &val, &o, x, y, &vl));
            tpk_gpt2_set_dropout(&m, o.dropout);
        }
        if (o.save && o.save_every && tr.step % o.save_every == 0 && tr.step < o.steps) { /* DIR/step-N */
            char sub[1100];
            snprintf(sub, sizeof sub, "%s/step-%lld", o.save, (long long)tr.step);
            if (world_rank == 0) mkdir(o.save, 0755);
            FAIL_IF(save_checkpoint(&tr, &o, sub, msg, sizeof msg), "%s", msg);
            if (world_rank == 0) printf("saved %s (step %lld)\n", sub, (long long)tr.step);
        }
        if (world_rank == 0) {
            if (tr.step % o.log_every == 0 || tr.step == o.steps || isfinite(vl)) {
                printf("step %5lld/%d | loss %.4f | grad norm %.3f | lr %.2e | %.1f ms | %.0f tok/s", (long long)tr.step, o.steps, (double)l, norm,
                       (double)lr, ms, (double)o.batch * o.seq * o.accum * dp / (ms * 1e-3));
                if (gpu) { /* model flops utilisation: 6 N + 12 L H S flops per token, against TPK_PEAK_TFLOPS (default 989, H100 bf16 dense) */
                    const char *pk = getenv("TPK_PEAK_TFLOPS");
                    double peak = (pk ? atof(pk) : 989.0) * 1e12 * world_size, tok = (double)o.batch * o.seq * o.accum * dp;
                    double fl = (6.0 * (double)nglobal + 12.0 * (double)o.layers * (double)o.hidden * o.seq) * tok;
                    printf(" | MFU %.1f%%", 100.0 * fl / (ms * 1e-3) / peak);
                }
                if (isfinite(vl)) printf(" | val loss %.4f", vl);
                printf("\n");
                fflush(stdout);
            }
            if (csv) {
                fprintf(csv, "%lld,%.9g,", (long long)tr.step, (double)l); /* %.9g: every f32 exactly */
                if (isfinite(vl)) fprintf(csv, "%.9g", vl);
                fprintf(csv, ",%.9g,%.17g\n", (double)lr, norm);
            }
        }
    }
    if (world_rank == 0 && o.steps > 0) printf("trained %lld steps in %.1f s\n", (long long)o.steps, now() - t_start);
    if (csv) fclose(csv), csv = NULL, plot(o.csv);
    if (o.save) {
        FAIL_IF(save_checkpoint(&tr, &o, o.save, msg, sizeof msg), "%s", msg);
        if (world_rank == 0) printf("saved %s (step %lld)\n", o.save, (long long)tr.step);
    }
    if (o.sample) {
        tpk_gpt2_set_dropout(&m, 0);
        TRY(sample(&ctx, &m, o.vocab <= 256 ? '\n' : o.vocab > 50256 ? 50256 : 0, o.sample, o.seed, o.vocab <= 256));
    }
    rc = 0;
out:
    if (csv) fclose(csv);
    free(x), free(y), free(train.tok);
    if (val.tok != train.tok) free(val.tok);
    if (ctx_up) {
        if (mom) ctx.ops->free(&ctx, mom);
        if (var) ctx.ops->free(&ctx, var);
        if (model_up) tpk_gpt2_destroy(&ctx, &m);
        tpk_ctx_destroy(&ctx);
    }
    if (world.vt) tpk_comm_destroy(&world);
    if (tp_mpi != MPI_COMM_NULL && tp_mpi) MPI_Comm_free(&tp_mpi);
    if (dp_mpi != MPI_COMM_NULL && dp_mpi) MPI_Comm_free(&dp_mpi);
    MPI_Finalize();
    return rc;
}
