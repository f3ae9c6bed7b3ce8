/* examples/train.c — a Megatron-style trainer on tpk for every model family (--arch gpt2, llama,
 * neox): tensor parallelism (TP) within groups of --tp consecutive ranks, data parallelism (DP)
 * across them (tpk/train/model.h: one handle for every family). The template to copy:
 *   mpirun -np 2 build/train --text FILE --tp 2 --layers 4 --hidden 128 --heads 4 --steps 500
 *   --save ckpt --sample 200
 * A step: --grad-accum micro-batches (ctx.rng_step = the micro-batch: new dropout masks), forward,
 * backward x 1/accum, the last one starting each block's DP reduction as its backward ends
 * (tpk/train/dp.h); SP layernorm grads over TP; the global norm, clipping, AdamW and the schedule
 * (tpk/train/optim.h); the losses summed on the device, read only on a step that reports them. Data
 * (tpk/train/data.h): llm.c shards or a text file's bytes, batch k of DP rank d is window k*dp + d,
 * so a resume is bit-identical. Checkpoints (tpk/train/hf.h): Hugging Face GPT-2 or Llama layout
 * (--load reads config.json's model_type), loadable at any TP and DP size. A failure: one line
 * `train: error: ...`, every rank stops; a collective that fails or gets no answer within --timeout
 * S (a stopped or dead rank) aborts the job after its line. Ranks compare digests of their
 * arguments, data and checkpoint files before training. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tpk/tpk.h>
#include <tpk/train/log.h>
#include <tpk/train/model.h>
#include <tpk/train/step.h>
#include <tpk/plan/plan.h>
#include <tpk/runtime/mpi.h>
#ifdef TPK_WITH_CUDA /* built where nvcc is found: the GPU when one is present */
#include <tpk/runtime/nccl.h>
#endif

typedef struct opts {
    const char *data, *val_data, *text, *save, *load, *csv, *dtype, *arch, *dp_reduce, *dp_batch,
        *recompute, *tp_weights, *schedule, *pp_layers, *plan_profile, *tokenizer, *prompt;
    int64_t layers, hidden, heads, vocab, positions;
    int tp, zero, batch, seq, accum, steps, warmup, eval_every, eval_batches, sample, log_every,
        save_every, keep, pp, micro, vstages;
    /* rc: --recompute parsed; steps_given: --steps was given */
    bool sp, eval_only, profile, det, steps_given, print_schedule, plan;
    tpk_recompute rc;
    tpk_pipe_kind kind; /* --schedule parsed (1f1b by default) */
    float dropout, lr, min_lr_frac, wd, clip, b1, b2, smoothing, temperature, top_p;
    int top_k;
    /* a family's config flags (tpk_lm_flag: --kv-heads, --ffn, --rotary-pct, ...), as given */
    struct { const char *flag, *value; } fam[16];
    int nfam;
    uint64_t seed;
    double timeout; /* --timeout S: how long a collective waits for the other ranks (0: no limit;
                       -1: not given) */
} opts;

/* the usage; each family's own flags (tpk_lm_flag) are printed between model and parallel */
static const char *usage_model =
    "usage: train (--text FILE | --data SHARD [--val-data SHARD] | --load DIR) [options]\n"
    "  model:     --arch NAME (%s) --layers 4 --hidden 128 --heads 4 --vocab V --positions P "
    "(default: --seq-len)\n";
static const char *usage =
    "  parallel:  --tp 1 (--tp-weights 3,1: each TP rank's share) --sequence-parallel --dtype "
    "f32|bf16 (default: bf16 on a GPU, f32 on the host)\n"
    "             --zero 1 (ZeRO-1: the optimizer sharded over DP) --dp-reduce mean|adasum (DP a "
    "power of two) --recompute none|selective|full\n"
    "  pipeline:  --pp 1 (stages; the world is TP x DP x PP) --micro-batches M (a step's "
    "micro-batches, as --grad-accum) --schedule gpipe|1f1b|interleaved\n"
    "             --virtual-stages 2 (interleaved: chunks a stage) --pp-layers 5,7 (blocks per "
    "virtual stage; auto: balanced by a flop estimate, the head's too) --print-schedule\n"
    "  plan:      --plan (TP, PP, the micro-batch, recompute, ZeRO-1 and SP chosen by the planner "
    "for these ranks: the fastest that fits; the step keeps --batch x --grad-accum x DP "
    "sequences)\n"
    "             --plan-profile NAME|FILE (its hardware: h100 on a GPU, cpu on the host; a file "
    "of plan --calibrate)\n"
    "  training:  --batch 8 (--dp-batch 8,8,4: one per DP rank) --seq-len 64 (--load: at most its "
    "positions) --grad-accum 1 --steps 100 --lr 1e-3 --warmup 10\n"
    "             --min-lr-frac 0.1 --weight-decay 0.1 --clip 1.0 --dropout 0 --label-smoothing 0 "
    "--seed 1 --deterministic (same bits every run)\n"
    "  eval:      --eval-every 0 --eval-batches 4 --eval-only\n"
    "  output:    --save DIR (made and checked writable before training; written at the end; "
    "--save-every K also writes DIR/step-K, ... --keep N: only the last N of them) --load DIR\n"
    "             --csv FILE (a resume continues it; FILE.svg: the loss curves) --log-every 1 "
    "--profile (every op's time per step, from step 2)\n"
    "  text:      --tokenizer DIR (tokenizer.json, or vocab.json + merges.txt; default: --load "
    "DIR's) for --text and samples\n"
    "             --sample N (tokens after --prompt TEXT, else after end-of-text) --temperature 1 "
    "(0: the most likely) --top-k 0 (off) --top-p 1 (off) --seed\n"
    "  failures:  --timeout 600 (seconds a collective waits for the other ranks, then the job "
    "stops; 0: no limit; default TPK_TIMEOUT or 600)\n"
    "  with --load the model's shape is its config.json's: a shape flag that differs is an error\n";

/* The families' --arch names, joined by sep ("gpt2|llama|neox"). */
static const char *arch_names(char *buf, size_t n, const char *sep) {
    buf[0] = 0;
    for (int k = 0; k < TPK_ARCH_COUNT; k++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", k ? sep : "",
                 tpk__model_family((tpk_arch)k)->name);
    return buf;
}
/* The family's labelled config flags of the built model, " G=2 F=64", for the banner. */
static const char *family_banner(tpk_model *m, char *buf, size_t n) {
    int nf = 0;
    const tpk_lm_flag *f = TPK__FAM(m)->flags(&nf);
    const char *c = (const char *)tpk__model_built_cfg(m);
    buf[0] = 0;
    for (int i = 0; i < nf; i++) {
        size_t at = strlen(buf);
        if (!f[i].label) continue;
        if (f[i].is_int)
            snprintf(buf + at, n - at, " %s=%lld", f[i].label,
                     (long long)*(const int64_t *)(c + f[i].off));
        else
            snprintf(buf + at, n - at, " %s=%g", f[i].label,
                     (double)*(const float *)(c + f[i].off));
    }
    return buf;
}
static void print_usage(void) {
    char names[96];
    printf(usage_model, arch_names(names, sizeof names, "|"));
    for (int k = 0; k < TPK_ARCH_COUNT; k++) {
        int n = 0;
        const tpk_lm_flag *f = tpk__model_family((tpk_arch)k)->flags(&n);
        if (!n) continue;
        char label[32];
        snprintf(label, sizeof label, "%s:", tpk__model_family((tpk_arch)k)->name);
        printf("  %-10s", label);
        for (int i = 0; i < n; i++) printf(" %s %s", f[i].flag, f[i].help);
        printf("\n");
    }
    printf("%s", usage);
}
/* Sets (or, loading, checks against the checkpoint's) cfg's fields of the family flags given:
 * false with the message in err for a flag the family has not, a bad value, or a value that
 * differs from a loaded config.json's. */
static bool family_flags(const opts *o, tpk_model_config *cfg, char *err, size_t n) {
    for (int k = 0; k < o->nfam; k++) {
        const char *a = o->fam[k].flag, *v = o->fam[k].value;
        const tpk_lm_flag *f = tpk_model_flag(cfg->arch, a);
        if (!f) {
            char who[64] = "";
            for (int q = 0; q < TPK_ARCH_COUNT; q++)
                if (tpk_model_flag((tpk_arch)q, a))
                    snprintf(who + strlen(who), sizeof who - strlen(who), "%s%s",
                             *who ? " or " : "", tpk__model_family((tpk_arch)q)->name);
            return snprintf(err, n, "%s: applies to --arch %s only (the model is %s)", a, who,
                            tpk_arch_name(cfg->arch)),
                   false;
        }
        char *end = NULL;
        double x = f->is_int ? (double)strtoll(v, &end, 10) : strtod(v, &end);
        if (*end || !(x >= f->lo && x <= f->hi))
            return snprintf(err, n, "%s: expected %s in [%g, %g], got \"%s\"", a,
                            f->is_int ? "an integer" : "a number", f->lo, f->hi, v),
                   false;
        void *field = (char *)tpk__model_cfg(cfg) + f->off;
        double has = f->is_int ? (double)*(int64_t *)field : (double)*(float *)field;
        if (o->load && fabs(x - has) > 1e-6 * fabs(has))
            return snprintf(err, n,
                            "%s %g: the checkpoint %s has %g (a loaded model's shape is its "
                            "config.json's: leave the flag out)",
                            a, x, o->load, has),
                   false;
        if (f->is_int) *(int64_t *)field = (int64_t)x;
        else *(float *)field = (float)x;
    }
    return true;
}

static int parse(int argc, char **argv, opts *o, char *err, size_t n);
/* Whether v is one of the trainer's flags: parsed alone, it is not an unknown argument. */
static bool is_flag(const char *v) {
    opts o;
    char e[256] = "", *args[2] = {(char *)"train", (char *)v};
    return v[0] == '-' &&
           (parse(2, args, &o, e, sizeof e) < 0 || strncmp(e, "unknown argument", 16));
}

/* "--name value" parsing into o (model shape flags 0: not given, the default or the checkpoint's);
 * 0, -1 for --help, or 1 with a message in err. A value is never empty nor one of the flags. */
static int parse(int argc, char **argv, opts *o, char *err, size_t n) {
    *o = (opts){.tp = 1,
                .pp = 1,
                .kind = TPK_PIPE_1F1B,
                .batch = 8,
                .seq = 0 /* 64, or a loaded model's positions if fewer */,
                .accum = 1,
                .steps = -1 /* 100 when not given */,
                .warmup = 10,
                .eval_batches = 4,
                .log_every = 1,
                .lr = 1e-3f,
                .min_lr_frac = 0.1f,
                .wd = 0.1f,
                .clip = 1.0f,
                .b1 = 0.9f,
                .b2 = 0.95f,
                .temperature = 1,
                .top_p = 1,
                .seed = 1};
    o->timeout = -1; /* not given: the library's default */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL; char *end = NULL;
#define VALUE if (!v || !*v || is_flag(v)) goto missing;
#define STR(flag, f) if (!strcmp(a, flag)) { VALUE o->f = v; i++; continue; }
#define INT(flag, f, lo)                                                                         \
    if (!strcmp(a, flag)) {                                                                      \
        VALUE long long x = strtoll(v, &end, 10);                                                \
        if (*end || x < (lo) || x > 1000000000)                                                  \
            return snprintf(err, n, "%s: expected an integer in [%d, 1000000000], got \"%s\"%s", \
                            a, (int)(lo), v, *end ? "" : " (out of range)"),                     \
                   1;                                                                            \
        o->f = x;                                                                                \
        i++;                                                                                     \
        continue;                                                                                \
    }
#define FLT(flag, f, lo, hi)                                                            \
    if (!strcmp(a, flag)) {                                                             \
        VALUE double x = strtod(v, &end);                                               \
        if (*end || !(x >= (lo) && x <= (hi)))                                          \
            return snprintf(err, n, "%s: expected a number in [%g, %g], got \"%s\"", a, \
                            (double)(lo), (double)(hi), v),                             \
                   1;                                                                   \
        o->f = (float)x;                                                                \
        i++;                                                                            \
        continue;                                                                       \
    }
        /* the flags, a table (clang-format would break it into a staircase) */
        /* clang-format off */
        STR("--arch", arch) STR("--dtype", dtype) STR("--data", data) STR("--val-data", val_data)
        STR("--text", text) STR("--save", save) STR("--load", load) STR("--csv", csv)
        STR("--dp-reduce", dp_reduce) STR("--dp-batch", dp_batch) STR("--recompute", recompute)
        STR("--tp-weights", tp_weights) STR("--schedule", schedule) STR("--pp-layers", pp_layers)
        STR("--plan-profile", plan_profile) STR("--tokenizer", tokenizer) STR("--prompt", prompt)
        INT("--top-k", top_k, 0) FLT("--temperature", temperature, 0, 1e3)
        FLT("--top-p", top_p, 0, 1)
        INT("--pp", pp, 1) INT("--micro-batches", micro, 1) INT("--virtual-stages", vstages, 1)
        INT("--layers", layers, 1) INT("--hidden", hidden, 1) INT("--heads", heads, 1)
        INT("--vocab", vocab, 1) INT("--positions", positions, 1)
        INT("--tp", tp, 1) INT("--zero", zero, 0) INT("--batch", batch, 1) INT("--seq-len", seq, 1)
        INT("--grad-accum", accum, 1) INT("--steps", steps, 0) INT("--warmup", warmup, 0)
        INT("--eval-every", eval_every, 0) INT("--eval-batches", eval_batches, 1)
        INT("--sample", sample, 0) INT("--log-every", log_every, 1)
        INT("--save-every", save_every, 0) INT("--keep", keep, 1) INT("--seed", seed, 0)
        FLT("--lr", lr, 0, 10) FLT("--min-lr-frac", min_lr_frac, 0, 1)
        FLT("--weight-decay", wd, 0, 10) FLT("--clip", clip, 0, 1e9)
        FLT("--timeout", timeout, 0, 1e9)
        FLT("--dropout", dropout, 0, 0.99) FLT("--label-smoothing", smoothing, 0, 0.99)
        FLT("--beta1", b1, 0, 0.9999) FLT("--beta2", b2, 0, 0.9999)
#define BOOL(flag, f) if (!strcmp(a, flag)) { o->f = true; continue; }
        BOOL("--sequence-parallel", sp) BOOL("--eval-only", eval_only) BOOL("--profile", profile)
        BOOL("--deterministic", det) BOOL("--print-schedule", print_schedule) BOOL("--plan", plan)
            /* clang-format on */
            if (tpk_model_flag(TPK_ARCH_COUNT, a)) { /* checked when the family is known */
            VALUE if (o->nfam == 16) return snprintf(err, n, "%s: too many model flags", a), 1;
            o->fam[o->nfam].flag = a, o->fam[o->nfam++].value = v;
            i++;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        return snprintf(err, n, "unknown argument \"%s\" (--help lists them)", a), 1;
    missing:
        if (!v) return snprintf(err, n, "%s: expects a value", a), 1;
        return snprintf(err, n, "%s: expects a value, got %s%s", a,
                        *v ? "the flag " : "an empty string", v),
               1;
    }
    o->steps_given = o->steps >= 0;
    if (!o->steps_given) o->steps = 100;
    if (argc < 2) return snprintf(err, n, "no arguments: --help lists the options"), 1;
    if (!(o->top_p > 0)) return snprintf(err, n, "--top-p: expected a number in (0, 1], got 0"), 1;
    if (o->prompt && !o->sample) o->sample = 128; /* a prompt asks for a sample */
    if (!o->data && !o->text && !(o->load && o->sample && !o->eval_only))
        return snprintf(
                   err, n,
                   "no data: give --text FILE or --data SHARD to train or evaluate (--load DIR "
                   "alone can only --sample N)"),
               1;
    if (o->data && o->text) return snprintf(err, n, "--data and --text: give one"), 1;
    if (!o->data && !o->text) o->steps = 0; /* --load DIR --sample N: sample only */
    if (o->dtype && strcmp(o->dtype, "f32") && strcmp(o->dtype, "bf16"))
        return snprintf(err, n, "--dtype: expected f32 or bf16, got \"%s\"", o->dtype), 1;
    if (o->dp_reduce && strcmp(o->dp_reduce, "mean") && strcmp(o->dp_reduce, "adasum"))
        return snprintf(err, n, "--dp-reduce: expected mean or adasum, got \"%s\"", o->dp_reduce),
               1;
    if (o->recompute && !tpk_recompute_parse(o->recompute, &o->rc))
        return snprintf(err, n, "--recompute: expected none, selective or full, got \"%s\"",
                        o->recompute),
               1;
    if (o->schedule && !tpk_pipe_kind_parse(o->schedule, &o->kind))
        return snprintf(err, n, "--schedule: expected gpipe, 1f1b or interleaved, got \"%s\"",
                        o->schedule),
               1;
    if (o->micro && o->accum != 1 && o->accum != o->micro)
        return snprintf(err, n, "--micro-batches %d and --grad-accum %d: the same count, give one",
                        o->micro, o->accum),
               1;
    if (o->micro) o->accum = o->micro;
    if (o->vstages && o->kind != TPK_PIPE_INTERLEAVED && o->vstages != 1)
        return snprintf(err, n,
                        "--virtual-stages %d: only the interleaved schedule has several chunks a "
                        "stage (--schedule interleaved)",
                        o->vstages),
               1;
    if (!o->vstages) o->vstages = o->kind == TPK_PIPE_INTERLEAVED ? 2 : 1;
    if (o->zero > 1)
        return snprintf(
                   err, n,
                   "--zero: expected 0 or 1 (ZeRO-1: the optimizer state sharded over DP), got %d",
                   o->zero),
               1;
    tpk_arch arch;
    char names[96];
    if (o->arch && !tpk_arch_from_name(o->arch, false, &arch))
        return snprintf(err, n, "--arch: expected one of %s, got \"%s\"",
                        arch_names(names, sizeof names, ", "), o->arch),
               1;
    if (o->save_every && !o->save)
        return snprintf(err, n,
                        "--save-every %d: needs --save DIR (the checkpoints go to DIR/step-K)",
                        o->save_every),
               1;
    return 0;
}

static int world_rank, world_size;
static double coll_timeout = 600; /* seconds a collective waits for the other ranks (--timeout; 0:
                                     no limit) */
/* A collective failed or timed out: the ranks can no longer agree on stopping (a stopped peer
 * never would), so this rank prints the error line and aborts the job (mpirun ends every rank). */
static void comm_abort(const char *what) {
    fflush(stdout);
    fprintf(stderr, "train: error: rank %d: %s\n", world_rank, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}
/* MPI_Allreduce in place over the world, waiting at most coll_timeout (comm_abort after it). */
static void world_allreduce(void *buf, int n, MPI_Datatype t, MPI_Op op) {
    tpk_ctx e = {0}; /* the error message's home */
    MPI_Request r;
    /* the world's errors are fatal: no status to check */
    MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, MPI_COMM_WORLD, &r);
    char what[48];
    snprintf(what, sizeof what, "the world (%d ranks)", world_size);
    if (tpk_mpi_wait(&e, "MPI_Allreduce", what, &r, coll_timeout) != TPK_OK)
        comm_abort(tpk_last_error(&e));
}
/* Every rank passes its own ok flag and message; if any failed, the lowest failing rank prints
 * its message and every rank returns false, so all stop and none hangs. */
static bool agree(bool ok, const char *msg) {
    int first = ok ? world_size : world_rank;
    world_allreduce(&first, 1, MPI_INT, MPI_MIN);
    if (first == world_size) return true;
    fflush(stdout); /* what was printed before comes before the error */
    if (first == world_rank) fprintf(stderr, "train: error: %s\n", msg && msg[0] ? msg : "failed");
    return false;
}
static char msg[1024];
#define DIGEST0 0xcbf29ce484222325ull /* FNV-1a's offset basis */
/* 64-bit FNV-1a over n bytes, 8-byte words at a time (then the tail bytes), continuing from h:
 * the digests ranks compare. Each step is a bijection of h, so one differing word always shows. */
static uint64_t digest(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
/* Whether every rank holds the same h[0..n) (one all-reduce of h and ~h, MAX: max h == ~min ~h).
 * Collective. */
static bool same_everywhere(const uint64_t *h, int n) {
    uint64_t hh[64];
    for (int i = 0; i < n; i++) hh[2 * i] = h[i], hh[2 * i + 1] = ~h[i];
    world_allreduce(hh, 2 * n, MPI_UINT64_T, MPI_MAX);
    for (int i = 0; i < n; i++)
        if (hh[2 * i] != ~hh[2 * i + 1]) return false;
    return true;
}
/* The digest of a file's bytes, read in pieces of 1 MiB (0 when it cannot be read: the load reports
 * why). */
static uint64_t file_digest(const char *path) {
    static unsigned char buf[1 << 20];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = DIGEST0;
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = digest(h, buf, n), total += n;
    bool bad = ferror(f);
    fclose(f);
    return bad ? 0 : digest(h, &total, sizeof total);
}
static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}
static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && !strcmp(s + n - t, tail);
}
/* Whether the ranks see the same checkpoint in dir (its *.json and *.safetensors files:
 * config.json, the model's files, the optimizer's): 0 yes; 1 the lists of names differ; 2 a file's
 * bytes differ (its path in bad). Collective. */
static int differing_checkpoint(const char *dir, char *bad, size_t nbad) {
    char **names = NULL;
    int n = 0, cap = 0, res = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!ends_with(e->d_name, ".json") && !ends_with(e->d_name, ".safetensors")) continue;
        if (n == cap) {
            char **g = (char **)realloc(names, sizeof(char *) * (size_t)(cap = 2 * cap + 8));
            if (!g) break;
            names = g;
        }
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    if (d) closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_names);
    uint64_t h = digest(DIGEST0, &n, sizeof n);
    for (int i = 0; i < n; i++) h = digest(h, names[i], strlen(names[i]) + 1);
    if (!same_everywhere(&h, 1)) res = 1;
    char path[4096];
    for (int i = 0; !res && i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        h = file_digest(path);
        if (!same_everywhere(&h, 1) && (res = 2) && snprintf(bad, nbad, "%s", path) >= (int)nbad)
            bad[nbad - 1] = 0;
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return res;
}
#define FAIL_IF(cond, ...)                              \
    do {                                                \
        bool c_ = (cond);                               \
        if (c_) snprintf(msg, sizeof msg, __VA_ARGS__); \
        if (!agree(!c_, msg)) goto out;                 \
    } while (0)
#define TRY(call)                                                                   \
    do {                                                                            \
        tpk_status s_ = (call);                                                     \
        if (s_ == TPK_ERR_COMM) comm_abort(tpk_last_error(&ctx));                   \
        FAIL_IF(s_ != TPK_OK, "%s (%s)", tpk_last_error(&ctx), tpk_status_str(s_)); \
    } while (0)
/* A GPU this process can use (the CUDA trainer on a machine that has one). */
static bool gpu_present(void) {
#ifdef TPK_WITH_CUDA
    return tpk_cuda_device_count() > 0;
#else
    return false;
#endif
}
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --save DIR checked before training: DIR made with its parents (mkdir -p) and a probe file
 * written, flushed and removed in it. false with a message in err. */
static bool probe_dir(const char *dir, char *err, size_t n) {
    char p[4096], f[4200];
    if (strlen(dir) >= sizeof p)
        return snprintf(err, n, "--save: a path of at most %zu characters, got %zu", sizeof p - 1,
                        strlen(dir)),
               false;
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1;; c++) /* each parent, then DIR */
        if (*c == '/' || !*c) {
            char end = *c;
            *c = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return snprintf(err, n, "--save: cannot create %.900s (%s)", p, strerror(errno)),
                       false;
            *c = end;
            if (!end) break;
        }
    snprintf(f, sizeof f, "%s/.train-probe-%ld", dir, (long)getpid());
    FILE *pf = fopen(f, "w");
    bool ok = pf && fputs("probe\n", pf) >= 0 && fflush(pf) == 0;
    int e = errno;
    if (pf) ok = fclose(pf) == 0 && ok, remove(f);
    if (!ok)
        return snprintf(err, n, "--save %s: cannot write in it (%s)", dir,
                        strerror(pf ? e : errno)),
               false;
    return true;
}

/* A model shape flag given beside --load that differs from the checkpoint's config.json: its
 * message in err, false; true when none does. */
static bool shape_agrees(const opts *o, int64_t *const sh[5], char *err, size_t n) {
    struct { const char *flag; double given, has; } f[] = {
        {"--layers", (double)o->layers, (double)*sh[2]},
        {"--hidden", (double)o->hidden, (double)*sh[3]},
        {"--heads", (double)o->heads, (double)*sh[4]},
        {"--vocab", (double)o->vocab, (double)*sh[0]},
        {"--positions", (double)o->positions, (double)*sh[1]}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].given && fabs(f[i].given - f[i].has) > 1e-6 * fabs(f[i].has))
            return snprintf(
                       err, n,
                       "%s %g: the checkpoint %s has %g (a loaded model's shape is its "
                       "config.json's: leave the flag out)",
                       f[i].flag, f[i].given, o->load, f[i].has),
                   false;
    return true;
}

/* Mean loss of K validation batches, averaged over DP (dropout off). Collective. With stages (pm):
 * the K batches go through the pipeline as micro-batches, forwards alone. */
static tpk_status evaluate(tpk_ctx *ctx, tpk_model *m, tpk_pipe_model *pm, const tpk_tokens *val,
                           const opts *o, int32_t *x, int32_t *y, double *out) {
    double sum = 0;
    size_t bt = (size_t)o->batch * (size_t)o->seq;
    for (int k = 0; k < o->eval_batches; k++) {
        float loss;
        TPK_TRY(tpk_data_batch(ctx, val, k, ctx->dp.size, ctx->dp.rank, o->batch, o->seq,
                               x + (pm ? (size_t)k * bt : 0), y + (pm ? (size_t)k * bt : 0)));
        if (pm) continue;
        TPK_TRY(tpk_model_forward(ctx, m, x, y, o->batch, o->seq, &loss));
        sum += loss;
    }
    if (pm) {
        float *l = (float *)malloc(sizeof(float) * (size_t)o->eval_batches);
        if (!l) return tpk_fail(ctx, TPK_ERR_NOMEM, "evaluate", "%d losses", o->eval_batches);
        tpk_status s = tpk_pipe_model_eval(ctx, pm, x, y, o->batch, o->seq, o->eval_batches, l);
        for (int k = 0; s == TPK_OK && k < o->eval_batches; k++) sum += l[k];
        free(l);
        TPK_TRY(s);
    }
    sum /= o->eval_batches;
    TPK_TRY(tpk_allreduce_host(ctx, &ctx->dp, &sum, 1, TPK_F64, TPK_SUM));
    *out = sum / ctx->dp.size;
    return TPK_OK;
}

/* --sample N tokens (dropout off) after the prompt — --prompt's ids (the tokenizer's, or its bytes
 * with the byte vocabulary), else one end-of-text token (the tokenizer's; newline for bytes;
 * <|endoftext|> for GPT-2's vocabulary) — under --temperature, --top-k, --top-p; printed on rank 0:
 * the prompt and the continuation as text (a tokenizer's decode, or bytes), else as ids. */
static tpk_status sample(tpk_ctx *ctx, tpk_model *m, const opts *o, tpk_tokenizer *tk) {
    int64_t V = tpk_model_vocab(m);
    bool bytes = !tk && V <= 256;
    int n = o->sample;
    size_t np = 0, pl = o->prompt ? strlen(o->prompt) : 0;
    int32_t *prompt = NULL, *seq = NULL;
    char *text = NULL;
    tpk_status s = TPK_OK;
    if (pl && tk) s = tpk_tokenizer_encode(ctx, tk, o->prompt, pl, &prompt, &np);
    else if (pl && (prompt = (int32_t *)malloc(sizeof(int32_t) * pl)))
        for (np = 0; np < pl; np++) prompt[np] = (uint8_t)o->prompt[np];
    bool start = !np; /* no prompt: one end-of-text token, not printed */
    if (s == TPK_OK && start && !(prompt = (int32_t *)malloc(sizeof(int32_t))))
        s = tpk_fail(ctx, TPK_ERR_NOMEM, "sample", "a prompt");
    if (s == TPK_OK && start)
        np = 1, prompt[0] = tk && tk->eot >= 0 ? tk->eot : bytes ? '\n' : V > 50256 ? 50256 : 0;
    if (s == TPK_OK && !(seq = (int32_t *)malloc(sizeof(int32_t) * (np + (size_t)n))))
        s = tpk_fail(ctx, TPK_ERR_NOMEM, "sample", "%zu tokens", np + (size_t)n);
    if (s == TPK_OK) s = tpk_model_set_dropout(ctx, m, 0);
    tpk_sample_opts so = {o->temperature, o->top_k, o->top_p};
    if (s == TPK_OK) s = tpk_model_generate(ctx, m, prompt, (int)np, n, &so, o->seed, seq);
    const int32_t *shown = seq + (start ? 1 : 0);
    size_t ns = np + (size_t)n - (start ? 1 : 0), tn = 0;
    if (s == TPK_OK && tk) s = tpk_tokenizer_decode(ctx, tk, shown, ns, false, &text, &tn);
    if (s == TPK_OK && world_rank == 0) {
        printf("--- sample (%d tokens%s) ---\n", n, start ? "" : " after the prompt");
        if (tk) fwrite(text, 1, tn, stdout);
        for (size_t i = 0; !tk && i < ns; i++) {
            int c = shown[i];
            bytes ? putchar(c == '\n' || c == '\t' || (c >= 32 && c < 127) ? c : '?')
                  : printf("%d ", c);
        }
        printf("\n---\n");
    }
    free(prompt), free(seq), free(text);
    return s;
}
/* --tokenizer DIR, else --load DIR's own (tokenizer.json, or vocab.json and merges.txt); *path: the
 * folder or file it came from (NULL: none). */
static tpk_status load_tokenizer(tpk_ctx *ctx, const opts *o, tpk_tokenizer **tk,
                                 const char **path) {
    *tk = NULL, *path = o->tokenizer;
    char a[1100], b[1100];
    if (!*path && o->load) {
        snprintf(a, sizeof a, "%.1000s/tokenizer.json", o->load);
        snprintf(b, sizeof b, "%.1000s/merges.txt", o->load);
        if (access(a, R_OK) == 0 || access(b, R_OK) == 0) *path = o->load;
    }
    return *path ? tpk_tokenizer_load(ctx, *path, tk) : TPK_OK;
}
/* Copy the tokenizer's files (tokenizer.json, or vocab.json and merges.txt, from a folder or the
 * file itself) into the saved checkpoint dir, where it has none: the checkpoint samples text.
 * World rank 0. */
static tpk_status save_tokenizer(tpk_ctx *ctx, const char *from, const char *dir) {
    static const char *const names[3] = {"tokenizer.json", "vocab.json", "merges.txt"};
    struct stat st;
    char a[1100], b[1100];
    bool folder = stat(from, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(a, sizeof a, "%.1000s/tokenizer.json", from);
    int k0 = !folder || stat(a, &st) == 0 ? 0 : 1, k1 = k0 ? 3 : 1; /* which files to copy */
    for (int k = k0; k < k1; k++) {
        if (folder) snprintf(a, sizeof a, "%.1000s/%s", from, names[k]);
        else snprintf(a, sizeof a, "%.1000s", from);
        snprintf(b, sizeof b, "%.1000s/%s", dir, names[k]);
        if (stat(b, &st) == 0) continue; /* the checkpoint's folder has its own */
        uint8_t *buf = NULL;
        size_t n = 0;
        TPK_TRY(tpk__read_file(ctx, "save_tokenizer", a, &buf, &n));
        FILE *f = fopen(b, "wb");
        bool ok = f && fwrite(buf, 1, n, f) == n;
        ok = (f && fclose(f) == 0) && ok;
        free(buf);
        if (!ok) {
            remove(b);
            return tpk_fail(ctx, TPK_ERR_IO, "save_tokenizer", "%s: cannot write: %s", b,
                            strerror(errno));
        }
    }
    return TPK_OK;
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}
/* --keep N: remove the checkpoints DIR/step-K (K a whole number) beyond the newest n, oldest first,
 * on
 * world rank 0 after a save succeeded (tpk_hf_remove: a user's other files stay). */
static tpk_status keep_last(tpk_ctx *ctx, const char *dir, int n) {
    DIR *d = world_rank == 0 ? opendir(dir) : NULL;
    if (!d)
        return world_rank == 0 ? tpk_fail(ctx, TPK_ERR_IO, "--keep", "%s: cannot list: %s", dir,
                                          strerror(errno))
                               : TPK_OK;
    long long *k = NULL, v;
    size_t nk = 0, cap = 0;
    bool nomem = false;
    char tail, num[32];
    for (struct dirent *e; !nomem && (e = readdir(d));)
        if (sscanf(e->d_name, "step-%lld%c", &v, &tail) == 1 && v >= 0 &&
            !strcmp(e->d_name + 5, (snprintf(num, sizeof num, "%lld", v), num))) {
            long long *g =
                nk < cap ? k : (long long *)realloc(k, sizeof *k * (cap = cap ? 2 * cap : 64));
            if (!g) nomem = true;
            else k = g, k[nk++] = v;
        }
    closedir(d);
    tpk_status s = nomem
                       ? tpk_fail(ctx, TPK_ERR_NOMEM, "--keep", "the list of %s's checkpoints", dir)
                       : TPK_OK;
    if (nk > 1) qsort(k, nk, sizeof *k, cmp_ll);
    for (size_t i = 0; s == TPK_OK && i + (size_t)n < nk; i++) { /* the oldest nk - n */
        char sub[1100];
        snprintf(sub, sizeof sub, "%s/step-%lld", dir, k[i]);
        s = tpk_hf_remove(ctx, sub);
    }
    free(k);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    signal(SIGXFSZ, SIG_IGN); /* a full disk or a file-size limit: write fails (EFBIG), the save
                                 reports it */
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    opts o;
    int rc = 1, pr = parse(argc, argv, &o, msg, sizeof msg);
    tpk_comm world = {0};
    tpk_ctx ctx = {0}; /* errors before tpk_ctx_init land in it too */
    tpk_model m = {0};
    tpk_pipe_model pm = {0}; /* --pp > 1 (or a --schedule): this rank's stage, instead of m */
    int64_t ppl[256];        /* --pp-layers */
    tpk_adamw opt = {0}; tpk_dp_buckets dp_b = {0};
    tpk_tokens train = {0}, val = {0};
    tpk_tokenizer *tk = NULL; /* --tokenizer, or --load DIR's */
    const char *tk_path = NULL;
    int32_t *x = NULL, *y = NULL;
    tpk_log csv = {0}; bool ctx_up = false;
    if (pr < 0) { if (world_rank == 0) print_usage(); MPI_Finalize(); return 0; }
    if (tpk_mpi_timeout_default(&ctx, &coll_timeout) != TPK_OK && pr == 0)
        pr = 1, snprintf(msg, sizeof msg, "%s", tpk_last_error(&ctx)); /* TPK_TIMEOUT */
    if (o.timeout >= 0) coll_timeout = o.timeout; /* --timeout over TPK_TIMEOUT */
    if (!agree(pr == 0, msg)) goto out;
    { /* every rank must have been started with the same arguments: a digest of every byte of every
         argument and its length */
        uint64_t h = digest(DIGEST0, &argc, sizeof argc);
        for (int i = 1; i < argc; i++) {
            size_t len = strlen(argv[i]);
            h = digest(digest(h, &len, sizeof len), argv[i], len);
        }
        FAIL_IF(
            !same_everywhere(&h, 1),
            "the ranks were started with different configurations (arguments differ between "
            "ranks)");
    }
    if (o.load && world_size > 1) { /* the checkpoint's files: the same bytes on every rank, or the
                                       ranks build different models */
        char bad[512];
        int d = differing_checkpoint(o.load, bad, sizeof bad);
        FAIL_IF(
            d,
            d == 1
                ? "the ranks see different checkpoint files in --load %s (the lists of its .json "
                  "and .safetensors files differ)"
                : "the ranks read different contents from %s: every rank must load the same "
                  "checkpoint",
            d == 1 ? o.load : bad);
    }
    FAIL_IF(o.keep && !(o.save && o.save_every),
            "--keep %d: applies to the checkpoints of --save DIR --save-every K", o.keep);
    FAIL_IF(world_size % o.tp, "--tp %d does not divide the %d ranks", o.tp, world_size);
    FAIL_IF(world_size % (o.tp * o.pp),
            "--pp %d: the %d ranks are not TP x DP x PP with --tp %d (expected a multiple of %d "
            "ranks)",
            o.pp, world_size, o.tp, o.tp * o.pp);
    bool piped = o.pp > 1 || o.schedule || o.pp_layers;
    FAIL_IF(piped && o.kind == TPK_PIPE_INTERLEAVED && (o.eval_every || o.eval_only) &&
                o.eval_batches % o.pp,
            "--eval-batches %d: the interleaved schedule evaluates through the stages a multiple "
            "of the %d stages of batches",
            o.eval_batches, o.pp);
    FAIL_IF(piped && o.sample,
            "--sample: not supported with pipeline stages yet (--pp %d): save with --pp, then "
            "--load the checkpoint without it to sample",
            o.pp);
    int nppl = 0;
    bool pp_auto = o.pp_layers && !strcmp(o.pp_layers, "auto"); /* balanced by cost */
    if (o.pp_layers && !pp_auto) { /* a comma-separated list of block counts, one per virtual
                                      stage */
        const char *c = o.pp_layers;
        char *end = NULL;
        bool good = true;
        while (good && *c && nppl < 256) {
            long long v = strtoll(c, &end, 10);
            good = end != c && (*end == ',' || !*end);
            ppl[nppl++] = v, c = *end ? end + 1 : end;
        }
        FAIL_IF(!good || nppl != o.pp * o.vstages,
                "--pp-layers: expected %d whole numbers separated by commas (one per virtual "
                "stage: --pp %d x --virtual-stages %d), got \"%s\"",
                o.pp * o.vstages, o.pp, o.vstages, o.pp_layers);
    }
    double tw[64];
    int ntw = o.tp_weights ? tpk_parse_weights(o.tp_weights, tw, 64)
                           : o.tp; /* --tp-weights: the TP split's shares */
    FAIL_IF(
        ntw != o.tp,
        "--tp-weights: expected %d positive numbers separated by commas (one per TP rank), got "
        "\"%s\"",
        o.tp, o.tp_weights);
    if (!agree(world_rank || !o.save || probe_dir(o.save, msg, sizeof msg), msg))
        goto out; /* a bad --save fails now, not after training */
    /* the tokenizer of --text and the samples; the model shape (from the checkpoint when
     * loading) and the data */
    TRY(load_tokenizer(&ctx, &o, &tk, &tk_path));
    int64_t V0 = o.vocab  ? o.vocab
                 : tk     ? tk->vocab_size
                 : o.text ? 256
                          : 50257,
            L0 = o.layers ? o.layers : 4, H0 = o.hidden ? o.hidden : 128,
            A0 = o.heads ? o.heads : 4;
    tpk_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (!o.arch || !tpk_arch_from_name(o.arch, false, &cfg.arch)) cfg.arch = TPK_ARCH_GPT2;
    if (o.load) TRY(tpk_model_config_read(&ctx, o.load, &cfg));
    const tpk_model_family *fam = tpk__model_family(cfg.arch);
    int64_t *sh[5]; /* the family's vocab, positions, layers, hidden, heads */
    tpk_model_config_common(&cfg, sh, o.smoothing, o.sp, o.rc);
    if (!o.load) *sh[0] = V0, *sh[1] = o.positions, *sh[2] = L0, *sh[3] = H0, *sh[4] = A0;
    int64_t *V = sh[0], *P = sh[1];
    if (!o.seq) o.seq = o.load && *P && *P < 64 ? (int)*P : 64;
    if (!*P) *P = o.seq;
    FAIL_IF(o.load && o.arch && strcmp(o.arch, tpk_arch_name(cfg.arch)),
            "--arch %s: the checkpoint %s holds a %s model", o.arch, o.load,
            tpk_arch_name(cfg.arch));
    FAIL_IF(!fam->dropout && o.dropout > 0, "--dropout: the %s model has no dropout",
            fam->title);
    if (!agree(family_flags(&o, &cfg, msg, sizeof msg), msg)) goto out;
    if (!agree(!o.load || shape_agrees(&o, sh, msg, sizeof msg), msg)) goto out;
    FAIL_IF(o.text && !tk && *V < 256,
            "--text needs a vocabulary of at least 256 (the model has %lld)", (long long)*V);
    FAIL_IF(tk && tk->vocab_size > *V,
            "--tokenizer %s: %lld tokens, more than the model's vocabulary of %lld", tk_path,
            (long long)tk->vocab_size, (long long)*V);
    FAIL_IF(o.prompt && !tk && *V > 256,
            "--prompt: needs a tokenizer (--tokenizer DIR) for a vocabulary of %lld tokens",
            (long long)*V);
    FAIL_IF(o.seq > *P, "--seq-len %d is longer than the model's %lld positions", o.seq,
            (long long)*P);
    if (o.plan) { /* the planner's choice (tpk/plan/plan.h) replaces the mesh and the step's
                     shape; the step's sequences stay --batch x --grad-accum x DP as given */
        FAIL_IF(o.tp_weights || o.dp_batch || o.pp_layers || o.schedule || o.dp_reduce,
                "--plan: chooses the mesh itself; leave out %s",
                o.tp_weights  ? "--tp-weights"
                : o.dp_batch  ? "--dp-batch"
                : o.pp_layers ? "--pp-layers"
                : o.schedule  ? "--schedule"
                              : "--dp-reduce");
        tpk_hw hw;
        const char *prof = o.plan_profile ? o.plan_profile : gpu_present() ? "h100" : "cpu";
        bool have = tpk_hw_builtin(prof, &hw) || tpk_hw_read(prof, &hw, msg, sizeof msg);
        if (!agree(have, msg)) goto out;
        MPI_Comm node;
        int per_node = 1;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &per_node), MPI_Comm_free(&node);
        MPI_Allreduce(MPI_IN_PLACE, &per_node, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        tpk_plan_desc pd;
        memset(&pd, 0, sizeof pd);
        pd.model = cfg, pd.seq = o.seq, pd.gpus = world_size, pd.gpus_per_node = per_node;
        pd.batch = (int64_t)o.batch * o.accum * (world_size / (o.tp * o.pp)), pd.hw = &hw;
        pd.like = gpu_present() ? NULL : tpk_ops_host();
        pd.dtype = o.dtype         ? (strcmp(o.dtype, "bf16") ? TPK_F32 : TPK_BF16)
                   : gpu_present() ? TPK_BF16
                                   : TPK_F32;
        pd.zero = pd.sp = pd.recompute = -1;
        tpk_plan_cfg *pv = NULL;
        int pn = 0, fit = 0;
        TRY(tpk_plan(&ctx, &pd, &pv, &pn));
        for (int i = 0; i < pn; i++) fit += pv[i].fits;
        if (!fit) {
            char why[200];
            snprintf(why, sizeof why, "%s", pn ? pv[pn - 1].reason : "none");
            free(pv);
            FAIL_IF(true,
                    "--plan: no configuration of %lld sequences of %d tokens fits %d ranks of %.0f "
                    "GB (%s)",
                    (long long)pd.batch, o.seq, world_size, hw.mem_gb, why);
        }
        tpk_plan_cfg b = pv[0];
        if (world_rank == 0) {
            printf("plan: TP %d x PP %d x DP %d, micro-batch %d x %d a step, recompute %s, ZeRO-1 "
                   "%s, SP %s: the fastest of %d configurations that fit (%d planned) on %s: %.4f "
                   "s a step, peak %.2f MB a rank",
                   b.tp, b.pp, b.dp, b.micro_batch, b.accum, tpk_recompute_name(b.recompute),
                   b.zero ? "on" : "off", b.sp ? "on" : "off", fit, pn, hw.name, b.step_seconds,
                   b.peak_bytes / 1e6);
            if (fit > 1)
                printf("; the next: TP %d x PP %d x DP %d, micro-batch %d, recompute %s, %.4f s",
                       pv[1].tp, pv[1].pp, pv[1].dp, pv[1].micro_batch,
                       tpk_recompute_name(pv[1].recompute), pv[1].step_seconds);
            printf("\n");
        }
        free(pv);
        o.tp = b.tp, o.pp = b.pp, o.batch = b.micro_batch, o.accum = b.accum;
        o.rc = b.recompute, o.zero = b.zero, o.sp = b.sp;
        tpk_model_config_common(&cfg, sh, o.smoothing, o.sp, o.rc);
        piped = o.pp > 1;
    }
    if (o.text && tk) { /* the tokenizer's ids */
        double ent = 0;
        uint8_t *b = NULL;
        size_t n = 0, nids = 0;
        int32_t *ids = NULL;
        tpk_status ts = tpk__read_file(&ctx, "--text", o.text, &b, &n);
        if (ts == TPK_OK) ts = tpk_tokenizer_encode(&ctx, tk, (const char *)b, n, &ids, &nids);
        if (ts == TPK_OK)
            ts = tpk_data_split_tokens(&ctx, ids, nids, o.text, "tokens",
                                       (int64_t)o.batch * o.seq + 1, &train, &val, &ent);
        free(b), free(ids);
        TRY(ts);
        if (world_rank == 0)
            printf("data: %s, %zu bytes: %lld training and %lld validation tokens (%s, %.2f bytes "
                   "a token); token-unigram entropy %.3f nats\n",
                   o.text, n, (long long)train.n, (long long)val.n, tk_path,
                   (double)n / (double)(train.n + val.n), ent);
    } else if (o.text) {
        double ent = 0;
        TRY(tpk_data_load_text(&ctx, o.text, (int64_t)o.batch * o.seq + 1, &train, &val, &ent));
        if (world_rank == 0)
            printf(
                "data: %s, %lld training and %lld validation bytes; byte-unigram entropy %.3f "
                "nats\n",
                o.text, (long long)train.n, (long long)val.n, ent);
    } else if (o.data) {
        TRY(tpk_data_load_shard(&ctx, o.data, *V, &train));
        TRY(tpk_data_load_shard(&ctx, o.val_data ? o.val_data : o.data, *V,
                                &val)); /* no --val-data: the training shard */
        FAIL_IF(train.n <= (int64_t)o.batch * o.seq || val.n <= (int64_t)o.batch * o.seq,
                "the data holds fewer than B x S + 1 = %lld tokens",
                (long long)o.batch * o.seq + 1);
    }
    if (world_size > 1 && (o.text || o.data)) { /* the tokens every rank read: the same, or the
                                                   ranks train on different batches */
        uint64_t h[2] = {digest(DIGEST0, train.tok, sizeof(int32_t) * (size_t)train.n),
                         digest(DIGEST0, val.tok, sizeof(int32_t) * (size_t)val.n)};
        bool same = same_everywhere(h, 2),
             text_or_train = same || !same_everywhere(h, 1); /* which file differs */
        FAIL_IF(
            !same,
            "the ranks read different contents from %s (%s): every rank must read the same data",
            o.text          ? o.text
            : text_or_train ? o.data
            : o.val_data    ? o.val_data
                            : o.data,
            o.text          ? "--text"
            : text_or_train ? "--data"
            : o.val_data    ? "--val-data"
                            : "--data");
    }
    /* the backend (a GPU per rank where one is present), the mesh, the model, the optimizer */
    const tpk_ops *ops = tpk_ops_host(); bool gpu = false;
#ifdef TPK_WITH_CUDA
    int ndev = tpk_cuda_device_count();
    if (ndev > 0) {
        MPI_Comm node;
        int local = 0, per_node = 1;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local), MPI_Comm_size(node, &per_node), MPI_Comm_free(&node);
        TRY(tpk_cuda_set_device(&ctx, local % ndev));
        ops = tpk_ops_cuda(), gpu = true;
        tpk_status ns = per_node <= ndev
                            ? tpk_comm_nccl_mpi(&ctx, MPI_COMM_WORLD,
                                                &(tpk_nccl_desc){.timeout_s = coll_timeout,
                                                                 .no_poll = coll_timeout == 0},
                                                &world)
                            : TPK_ERR_UNSUPPORTED; /* one GPU per rank */
        TRY(ns == TPK_ERR_UNSUPPORTED ? tpk_comm_mpi(&ctx, MPI_COMM_WORLD, &world)
                                      : ns); /* ranks share GPUs, or a build without NCCL: MPI */
    }
#endif
    if (!gpu) TRY(tpk_comm_mpi(&ctx, MPI_COMM_WORLD, &world));
    if (!strcmp(world.vt->name, "mpi"))
        TRY(tpk_comm_mpi_set_timeout(&ctx, &world,
                                     coll_timeout)); /* inherited by the TP and DP groups */
    tpk_dtype adt = o.dtype ? (strcmp(o.dtype, "bf16") ? TPK_F32 : TPK_BF16)
                    : gpu   ? TPK_BF16
                            : TPK_F32; /* master weights stay f32 */
    TRY(tpk_ctx_init(&ctx, &(tpk_ctx_desc){.ops = ops,
                                           .world = &world,
                                           .tp = o.tp,
                                           .pp = o.pp,
                                           .seed = o.seed,
                                           .dtype = adt,
                                           .tp_weights = o.tp_weights ? tw : NULL,
                                           .deterministic = o.det}));
    ctx_up = true;
    if (piped) {
        double *cost = NULL, cf = 0, cl = 0;
        FAIL_IF(pp_auto && !(cost = (double *)malloc(sizeof(double) * (size_t)(*sh[2] + 1))),
                "out of memory for %lld costs", (long long)*sh[2]);
        if (pp_auto) tpk_pipe_model_costs(&cfg, o.seq, cost, &cf, &cl);
        tpk_status ps = tpk_pipe_model_init(&ctx, &pm, &cfg, o.kind, o.accum, o.vstages,
                                            o.pp_layers && !pp_auto ? ppl : NULL, cost, cf, cl);
        free(cost);
        TRY(ps);
        TRY(tpk_pipe_model_set_dropout(&ctx, &pm, o.dropout));
    } else {
        TRY(tpk_model_init(&ctx, &m, &cfg));
        TRY(tpk_model_set_dropout(&ctx, &m, o.dropout)); /* every site (refused above where none) */
    }
    tpk_model *mm = piped ? &pm.copy[0] : &m; /* the model's sizes */
    FAIL_IF(
        o.zero && ctx.dp.size == 1,
        "--zero 1: shards the optimizer over data parallelism, but there is 1 DP rank (%d ranks / "
        "--tp %d)",
        world_size, o.tp);
    TRY(tpk_adamw_init(
        &ctx, &opt,
        &(tpk_adamw_desc){
            .b1 = o.b1, .b2 = o.b2, .eps = 1e-8f, .weight_decay = o.wd, .zero = o.zero > 0}));
    if (o.load) TRY(tpk_model_load(&ctx, mm, &opt, o.load)); /* stages: each sets its own */
    /* without --steps, --eval-only and --sample of a checkpoint past the default train nothing */
    if (o.load && o.sample && !o.steps_given && opt.step > o.steps) o.steps = (int)opt.step;
    FAIL_IF(!o.eval_only && o.steps && opt.step > o.steps,
            "--steps %d: the checkpoint %s is already at step %lld (--steps counts from 0)",
            o.steps, o.load, (long long)opt.step);
    if (o.load && opt.step && world_rank == 0)
        printf("resumed from %s at step %lld\n", o.load, (long long)opt.step);
    if (o.load && opt.step && !o.eval_only && world_rank == 0) { /* no optim.safetensors: said,
                                                                    never a silent restart */
        tpk_hf_info info;
        if (tpk_hf_info_read(&ctx, o.load, &info) == TPK_OK && !info.has_optim)
            printf("optimizer state starts fresh at step %lld (%s has no optim.safetensors)\n",
                   (long long)opt.step, info.dir);
    }
    int dp = ctx.dp.size; size_t nglobal = tpk_params_global_numel(&ctx);
    if (piped) { /* every stage's, the tied embedding's copy once */
        double ng = 0;
        for (int i = 0; i < ctx.params.n; i++)
            if (!ctx.params.list[i].pp_copy) ng += (double)tpk_param_global_numel(&ctx, i);
        TRY(tpk_allreduce_host(&ctx, &ctx.pp, &ng, 1, TPK_F64, TPK_SUM));
        nglobal = (size_t)ng;
    }
    int64_t Bd, off, Btot; /* this DP rank's micro-batch, the sequences before it, the step's
                              (HetSeq: --dp-batch) */
    TRY(tpk_data_dp_batches(&ctx, o.dp_batch, o.batch, &Bd, &off, &Btot));
    char bmsg[160]; /* the banner's batch: --batch, or --dp-batch's sizes and their sum */
    char fbuf[160]; /* the family's banner flags; a stage's chunk */
    if (world_rank == 0)
        printf(
            "train: %d rank%s = TP %d x DP %d%s%s, %s backend, %s | %s L=%lld H=%lld A=%lld V=%lld "
            "P=%lld%s, %.2fM parameters | B=%s S=%d %s %d\n",
            world_size, world_size == 1 ? "" : "s", o.tp, dp,
            piped ? (snprintf(msg, sizeof msg, " x PP %d (%s, %d chunk%s a stage)", o.pp,
                              tpk_pipe_kind_name(o.kind), o.vstages, o.vstages > 1 ? "s" : ""),
                     msg)
                  : "",
            o.sp ? " (sequence parallel)" : "", ctx.ops->name,
            adt == TPK_BF16 ? "bf16 (f32 master weights)" : "f32", fam->title,
            (long long)tpk_model_layers(mm), (long long)tpk_model_hidden(mm), (long long)*sh[4],
            (long long)*V, (long long)*P, family_banner(mm, fbuf, sizeof fbuf),
            (double)nglobal * 1e-6,
            (o.dp_batch
                 ? snprintf(bmsg, sizeof bmsg, "%s per DP rank = %lld", o.dp_batch, (long long)Btot)
                 : snprintf(bmsg, sizeof bmsg, "%d", o.batch),
             bmsg),
            o.seq, piped ? "micro-batches" : "accum", o.accum);
    if (piped && world_rank == 0) { /* the stage map: each virtual stage's blocks and ends */
        printf("stages:");
        for (int u = 0; u < o.pp * o.vstages; u++)
            printf("%s %d%s: blocks %lld-%lld%s%s", u ? " |" : "", u % o.pp,
                   o.vstages > 1 ? (snprintf(fbuf, sizeof fbuf, ".%d", u / o.pp), fbuf) : "",
                   (long long)pm.first[u], (long long)pm.first[u + 1] - 1,
                   u == 0 ? " + embedding" : "",
                   u == o.pp * o.vstages - 1 ? " + norm, head, loss" : "");
        printf("\n");
        if (o.print_schedule) tpk_pipe_print(&pm.sched, false, stdout);
    }
    /* a micro-batch's tokens (with stages: the step's M micro-batches, one after another) */
    size_t bs = sizeof(int32_t) * (size_t)(o.batch > Bd ? o.batch : Bd) * o.seq *
                (size_t)(o.accum > o.eval_batches ? o.accum : o.eval_batches);
    FAIL_IF(!(x = malloc(bs)) || !(y = malloc(bs)), "out of memory for a batch");
    if (o.eval_only) {
        double vl = 0;
        FAIL_IF(!val.tok, "--eval-only needs --data or --text");
        TRY(piped ? tpk_pipe_model_set_dropout(&ctx, &pm, 0) : tpk_model_set_dropout(&ctx, &m, 0));
        TRY(evaluate(&ctx, &m, piped ? &pm : NULL, &val, &o, x, y, &vl));
        if (world_rank == 0) printf("val_loss %.6f\n", vl);
        if (o.sample) TRY(sample(&ctx, &m, &o, tk));
        FAIL_IF(world_rank == 0 && (fflush(stdout) != 0 || ferror(stdout)),
                "standard output: cannot write (%s)", strerror(errno));
        rc = 0;
        goto out;
    }
    TRY(tpk_log_open(&ctx, &csv, o.csv, opt.step)); /* a resume keeps the curve up to its step and
                                                       appends */

    /* training */
    tpk_lr_schedule sched = {TPK_LR_COSINE, o.lr, o.min_lr_frac, o.warmup, o.steps};
    if (!piped) tpk_model_set_grad_ready(&m, tpk_dp_grad_ready, &dp_b);
    else
        tpk_pipe_model_set_dp(&pm, o.zero || (o.dp_reduce && !strcmp(o.dp_reduce, "adasum"))
                                       ? NULL
                                       : &dp_b); /* the buckets under the last micro-batch */
    bool adasum = o.dp_reduce && !strcmp(o.dp_reduce, "adasum");
    if (adasum) TRY(tpk_dp_adasum_init(&ctx, &dp_b)); /* the buckets then start nothing: Adasum
                                                         after the backward */
    double t_start = now(), t_int = t_start, int_s = 0;
    int64_t t0step = opt.step,
            int_n = 0;        /* the reporting interval's start, its steps' time and count */
    tpk_mem_peak(&ctx, true); /* the peak from here: training */
    double pp_busy = 0, pp_wait = 0; /* stages: seconds in compute steps, waiting in messages */
    for (int64_t step = opt.step; step < o.steps; step++) {
        double l = NAN, norm = 0, vl = NAN;
        float lr = tpk_lr_at(&sched, step);
        /* the step's micro-batches, one after another in x, y */
        size_t mbt = (size_t)Bd * (size_t)o.seq;
        for (int k = 0; k < o.accum; k++) /* = window micro * dp + rank with one --batch */
            TRY(tpk_data_batch_seq(&ctx, &train, (step * o.accum + k) * Btot + off, Bd, o.seq,
                                   x + (size_t)k * mbt, y + (size_t)k * mbt));
        /* the loss and the norm read (a wait) only on a step that reports them — printed,
         * evaluated, a --csv row — on every rank alike */
        int64_t s1 = step + 1; /* opt.step after this step */
        bool eval = o.eval_every && (s1 % o.eval_every == 0 || s1 == o.steps),
             report = s1 % o.log_every == 0 || s1 == o.steps || eval || csv.path[0];
        /* the micro-batches' forwards and backwards (the losses add up on the device; with
           stages, the pipeline, the DP buckets under each chunk's last backward), then the DP
           reduction (weighted sum, or Adasum), norm, clip, AdamW: tpk/train/step.h */
        TRY(tpk_model_train_step(&ctx, piped ? NULL : &m, piped ? &pm : NULL, &opt, &dp_b, x, y, Bd,
                                 o.seq, o.accum,
                                 (adasum ? (float)dp : 1.0f) * (float)Bd / (float)Btot /
                                     (float)o.accum, /* weighted by tokens */
                                 (uint64_t)(step * o.accum), lr, o.clip, report ? &norm : NULL));
        if (piped) pp_busy += pm.exec.t_compute, pp_wait += pm.exec.t_wait; /* the executor's */
        if (report && !piped)
            TRY(tpk_model_loss_dp(&ctx, &m, (double)Bd / (double)Btot / o.accum,
                                  &l)); /* mean over micro-batches and DP ranks' tokens */
        if (report && piped) {          /* the last stage's, given to every stage, then over DP */
            double sum = 0;
            TRY(tpk_pipe_model_loss_read(&ctx, &pm, &sum, NULL));
            l = sum * (double)Bd / (double)Btot / o.accum;
            TRY(tpk_allreduce_host(&ctx, &ctx.dp, &l, 1, TPK_F64, TPK_SUM));
        }
        /* the mean step time since the last printed line: a step that does not report does not
         * wait, so the wall time from the last reporting step's end to this one's loss,
         * evaluations, lines and saves left out */
        if (report) int_s += now() - t_int;
        int_n++;
        if (eval) {
            TRY(piped ? tpk_pipe_model_set_dropout(&ctx, &pm, 0)
                      : tpk_model_set_dropout(&ctx, &m, 0));
            TRY(evaluate(&ctx, &m, piped ? &pm : NULL, &val, &o, x, y, &vl));
            TRY(piped ? tpk_pipe_model_set_dropout(&ctx, &pm, o.dropout)
                      : tpk_model_set_dropout(&ctx, &m, o.dropout));
        }
        bool out_ok = true; /* rank 0's step line and --csv row written */
        if (world_rank == 0 &&
            (opt.step % o.log_every == 0 || opt.step == o.steps || isfinite(vl))) {
            double ms = 1e3 * int_s / (double)int_n, tok = (double)Btot * o.seq * o.accum,
                   eta = (now() - t_start) / (double)(opt.step - t0step) *
                         (double)(o.steps - opt.step);
            printf("step %5lld/%d | loss %.4f | grad norm %.3f | lr %.2e | %.1f ms | %.0f tok/s",
                   (long long)opt.step, o.steps, l, norm, (double)lr, ms, tok / (ms * 1e-3));
            if (gpu) { /* model flops utilisation: 6 N + 12 L H S flops per token, against
                          TPK_PEAK_TFLOPS (default 989, H100 bf16 dense) */
                const char *pk = getenv("TPK_PEAK_TFLOPS");
                double fl = (6.0 * (double)nglobal + 12.0 * (double)tpk_model_layers(mm) *
                                                         (double)tpk_model_hidden(mm) * o.seq) *
                            tok;
                printf(" | MFU %.1f%%",
                       100.0 * fl / (ms * 1e-3) / ((pk ? atof(pk) : 989.0) * 1e12 * world_size));
            }
            if (isfinite(vl)) printf(" | val loss %.4f", vl);
            printf(" | ETA %dm%02ds\n", (int)(eta / 60), (int)fmod(eta, 60.0));
            out_ok = fflush(stdout) == 0 && !ferror(stdout);
            int_s = 0, int_n = 0;
        }
        if (world_rank == 0 && !out_ok)
            snprintf(msg, sizeof msg, "standard output: cannot write (%s)", strerror(errno));
        if (out_ok && tpk_log_row(&ctx, &csv, opt.step, l, vl, lr, norm) != TPK_OK)
            out_ok = false, snprintf(msg, sizeof msg, "%s", tpk_last_error(&ctx));
        if (report && !agree(out_ok, msg)) goto out; /* a failed write stops every rank (rank 0
                                                        alone writes) */
        if (o.save && o.save_every && opt.step % o.save_every == 0 &&
            opt.step < o.steps) { /* DIR/step-N, after its step line */
            char sub[1100];
            snprintf(sub, sizeof sub, "%s/step-%lld", o.save, (long long)opt.step);
            TRY(tpk_model_save(&ctx, mm, &opt, sub, &(tpk_hf_save_desc){opt.step, o.seed}));
            if (world_rank == 0) printf("saved %s (step %lld)\n", sub, (long long)opt.step);
            /* after the save succeeded: the newest --keep stay */
            if (o.keep) TRY(keep_last(&ctx, o.save, o.keep));
        }
        if (o.profile)
            TRY(ctx.prof ? tpk_profile_step(&ctx)
                         : tpk_profile_start(&ctx)); /* the first step (warm-up) not profiled */
        if (report) t_int = now(); /* the next interval starts */
    }
    if (o.steps > 0 && t0step >= o.steps && world_rank == 0) /* a resume at the last step */
        printf(
            "trained no steps: %s is at step %lld, --steps %d | peak memory %.2f MB (recompute "
            "%s)\n",
            o.load, (long long)t0step, o.steps, tpk_mem_peak(&ctx, false) / 1e6,
            tpk_recompute_name(o.rc));
    /* the kit's buffers at most: parameters, gradients, optimizer moments, activations, scratch
     * (backend memory) */
    else if (o.steps > 0 && t0step < o.steps) {
        /* the peak of each stage (its largest over its TP and DP ranks) */
        /* and each stage's idle fraction: its time waiting in messages over the pipeline's time */
        double peaks[128] = {0}, mine = tpk_mem_peak(&ctx, false) / 1e6;
        if (ctx.pp.rank < 64)
            peaks[ctx.pp.rank] = mine,
            peaks[64 + ctx.pp.rank] = pp_busy + pp_wait > 0 ? pp_wait / (pp_busy + pp_wait) : 0;
        world_allreduce(peaks, 128, MPI_DOUBLE, MPI_MAX);
        char per[600] = "", idle[600] = "";
        for (int q = 0; piped && q < o.pp && q < 64; q++) {
            snprintf(per + strlen(per), sizeof per - strlen(per), "%s%.2f", q ? ", " : "",
                     peaks[q]);
            snprintf(idle + strlen(idle), sizeof idle - strlen(idle), "%s%.3f", q ? ", " : "",
                     peaks[64 + q]);
        }
        if (world_rank == 0 && piped)
            printf("trained steps %lld..%d in %.1f s | peak memory per stage %s MB (recompute "
                   "%s) | idle per stage %s (the bubble: waiting in messages)\n",
                   (long long)(t0step + 1), o.steps, now() - t_start, per, tpk_recompute_name(o.rc),
                   idle);
        else if (world_rank == 0)
            printf("trained steps %lld..%d in %.1f s | peak memory %.2f MB (recompute %s)\n",
                   (long long)(t0step + 1), o.steps, now() - t_start, mine,
                   tpk_recompute_name(o.rc));
    }
    if (ctx.prof && !ctx.prof->from_env && world_rank == 0 && !piped)
        tpk_profile_print(&ctx, stdout); /* rank 0 only: no TRY (it agrees over ranks) */
    for (int q = 0; ctx.prof && !ctx.prof->from_env && piped && q < o.pp; q++) {
        /* each stage's table from its first rank (its ops, its messages: the "p2p" rows), headed
           by its stage (mpirun may pass the ranks' lines on in another order) */
        if (ctx.pp.rank == q && ctx.tp.rank == 0 && ctx.dp.rank == 0) {
            printf("stage %d of %d:\n", q, o.pp);
            tpk_profile_print(&ctx, stdout);
            fflush(stdout);
        }
        int one = 1;
        world_allreduce(&one, 1, MPI_INT, MPI_SUM); /* the next stage prints after this one */
    }
    TRY(tpk_log_close(&ctx, &csv, true)); /* and FILE.png where gnuplot is installed */
    if (o.save) {
        TRY(tpk_model_save(&ctx, mm, &opt, o.save, &(tpk_hf_save_desc){opt.step, o.seed}));
        /* the tokenizer beside it, so that --load DIR samples text */
        TRY(world_rank == 0 && tk ? save_tokenizer(&ctx, tk_path, o.save) : TPK_OK);
        if (world_rank == 0) printf("saved %s (step %lld)\n", o.save, (long long)opt.step);
    }
    if (o.sample) TRY(sample(&ctx, &m, &o, tk));
    FAIL_IF(world_rank == 0 && (fflush(stdout) != 0 || ferror(stdout)),
            "standard output: cannot write (%s)", strerror(errno));
    rc = 0;
out:
    tpk_log_close(&ctx, &csv, false);
    free(x), free(y), tpk_tokens_free(&train), tpk_tokens_free(&val), tpk_dp_destroy(&dp_b);
    tpk_tokenizer_free(tk);
    if (ctx_up)
        tpk_adamw_destroy(&ctx, &opt), tpk_pipe_model_destroy(&ctx, &pm),
            tpk_model_destroy(&ctx, &m), tpk_ctx_destroy(&ctx);
    if (world.vt) tpk_comm_destroy(&world);
    MPI_Finalize();
    return rc;
}
