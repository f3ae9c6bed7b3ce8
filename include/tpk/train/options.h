/* tpk/train/options.h — the trainer's flags: one table of values (tpk/train/flags.h) for the
 * model, data, optimizer, mesh and run flags, shared by the programs that take any of them (the
 * trainer all; the planner the model's and --dtype; the tokenizer --tokenizer), so that the same
 * flag has the same range, default and message everywhere. A family's own config flags
 * (tpk_lm_flag: --kv-heads, --ffn, ...) are the table's LIST entries, checked against the family
 * once it is known (tpk_run_family_flags). tpk_run_opts_check derives and checks what the flags
 * say together (--micro-batches and --grad-accum, --virtual-stages, --pp-layers, --tp-weights,
 * the mesh TP x CP x DP x PP against the world size). tpk_run_model_config builds the model's
 * config from the flags or a checkpoint's config.json, refusing a flag that differs from the
 * checkpoint's (and a sequence length that is not a multiple of 2 x --cp). */
#ifndef TPK_TRAIN_OPTIONS_H
#define TPK_TRAIN_OPTIONS_H

#include "flags.h"
#include "ckpt_folder.h"
#include "model.h"
#include "schedule.h"

/* The classes of the table (a program accepts the classes of its mask). */
enum {
    TPK_OPT_MODEL = 1,  /* --arch, the shape, the family's flags, --load */
    TPK_OPT_DTYPE = 2,  /* --dtype */
    TPK_OPT_MESH = 4,   /* TP, DP, ZeRO, recompute, the pipeline, --plan */
    TPK_OPT_DATA = 8,   /* the data and the step's shape */
    TPK_OPT_OPTIM = 16, /* the schedule, AdamW, dropout, seeds */
    TPK_OPT_RUN = 32,   /* evaluation, checkpoints, logs, the timeout */
    TPK_OPT_TEXT = 64,  /* samples */
    TPK_OPT_TOKENIZER = 128,
    TPK_OPT_TRAINER = 255 /* all */
};

typedef struct tpk_run_opts {
    /* model */
    const char *arch, *load;
    int64_t layers, hidden, heads, vocab, positions; /* -1: not given */
    tpk_flag_list fam;                               /* the family's flags given */
    /* mesh */
    const char *dtype, *tp_weights, *dp_reduce, *recompute, *schedule, *pp_layers, *plan_profile;
    int64_t tp, zero, pp, micro, vstages;
    int64_t cp;          /* context parallelism: ranks splitting each sequence */
    const char *cp_comm; /* p2p | allgather (NULL: p2p) */
    int64_t ep;          /* expert parallelism: ranks of DP splitting a mixture's experts */
    int64_t zero_shard;  /* HSDP: --zero's slices within groups of this many DP x CP ranks (0:
                            all of them) */
    bool sp, print_schedule, plan;
    /* data */
    const char *text, *data, *val_data, *dp_batch;
    int64_t batch, seq, accum;
    /* optimizer */
    int64_t steps, warmup, seed;
    double lr, min_lr_frac, wd, clip, b1, b2, dropout, smoothing;
    bool det;
    /* run */
    int64_t eval_every, eval_batches, save_every, keep, log_every;
    const char *save, *csv;
    bool eval_only, profile, zero3_no_prefetch, zero3_whole_grads;
    double timeout; /* -1: not given */
    /* text */
    const char *tokenizer, *prompt;
    int64_t sample, top_k;
    double temperature, top_p;
    /* derived (tpk_run_opts_check) */
    bool steps_given, piped, pp_auto; /* --steps given; stages; --pp-layers auto */
    tpk_recompute rc;
    tpk_pipe_kind kind;
    int nppl; /* --pp-layers' counts, one per virtual stage */
    int64_t ppl[256];
    /* FP8 (tpk/layers/fp8.h) */
    const char *fp8, *fp8_amax; /* current | delayed (NULL: off); max | most_recent */
    int64_t fp8_history, fp8_margin;
    double tw[64]; /* --tp-weights' shares */
} tpk_run_opts;

/* The table in usage order (each heading's flags together): the model's, each family's own, then
 * the rest. */
static inline const tpk_flag *tpk_run_flags(int *n) {
    enum { M = TPK_OPT_MODEL, D = TPK_OPT_DATA, O = TPK_OPT_OPTIM, P = TPK_OPT_MESH };
    enum { R = TPK_OPT_RUN, T = TPK_OPT_TEXT, K = TPK_OPT_TOKENIZER, F = TPK_OPT_DTYPE };
    const tpk_flag_kind S = TPK_FLAG_STR, C = TPK_FLAG_CHOICE, I = TPK_FLAG_INT;
    const tpk_flag_kind X = TPK_FLAG_NUM, B = TPK_FLAG_BOOL;
    const double G = 1e9;
    static tpk_flag t[128];
    static int nt = 0;
    if (nt) return *n = nt, t;
    const tpk_flag base[] = {
        {"--arch", C, 0, 0, NULL, "gpt2|llama|neox|mixtral|qwen2_moe",
         "one of gpt2, llama, neox, mixtral, qwen2_moe", M,
         "model", "the family; default gpt2", offsetof(tpk_run_opts, arch)},
        {"--layers", I, 1, G, NULL, "L", NULL, M, "model", "blocks",
         offsetof(tpk_run_opts, layers)},
        {"--hidden", I, 1, G, NULL, "H", NULL, M, "model", NULL, offsetof(tpk_run_opts, hidden)},
        {"--heads", I, 1, G, NULL, "A", NULL, M, "model", NULL, offsetof(tpk_run_opts, heads)},
        {"--vocab", I, 1, G, NULL, "V", NULL, M, "model", NULL, offsetof(tpk_run_opts, vocab)},
        {"--positions", I, 1, G, NULL, "P", NULL, M, "model", "default: --seq-len",
         offsetof(tpk_run_opts, positions)},
        {"--load", S, 0, 0, NULL, "DIR", NULL, M, "model",
         "a checkpoint: its config.json is the model's shape, a shape flag that differs is an "
         "error",
         offsetof(tpk_run_opts, load)},
        {"--tp", I, 1, G, "1", NULL, NULL, P, "parallel", NULL, offsetof(tpk_run_opts, tp)},
        {"--tp-weights", S, 0, 0, NULL, "3,1", NULL, P, "parallel", "each TP rank's share",
         offsetof(tpk_run_opts, tp_weights)},
        {"--sequence-parallel", B, 0, 0, NULL, NULL, NULL, P, "parallel", NULL,
         offsetof(tpk_run_opts, sp)},
        {"--cp", I, 1, G, "1", NULL, NULL, P, "parallel",
         "context parallelism: each sequence split over C ranks (TP x CP x DP x PP); --seq-len a "
         "multiple of 2C",
         offsetof(tpk_run_opts, cp)},
        {"--cp-comm", C, 0, 0, NULL, "p2p|allgather", NULL, P, "parallel",
         "how keys and values travel over CP: the ring (default) or an all-gather",
         offsetof(tpk_run_opts, cp_comm)},
        {"--ep", I, 1, G, "1", NULL, NULL, P, "parallel",
         "expert parallelism (--arch mixtral, qwen2_moe): the experts split over N of the DP "
         "ranks; N divides DP and --experts",
         offsetof(tpk_run_opts, ep)},
        {"--dtype", C, 0, 0, NULL, "f32|bf16", NULL, F, "parallel",
         "default: bf16 on a GPU, f32 on the host", offsetof(tpk_run_opts, dtype)},
        {"--zero", I, 0, 3, "0", NULL,
         "0, 1 (ZeRO-1: the optimizer state sharded over DP), 2 (ZeRO-2: the gradients too) or 3 "
         "(ZeRO-3: the weights too, gathered block by block)",
         P, "parallel",
         "1: the optimizer sharded over DP (x CP); 2: the gradients too; 3: the weights too",
         offsetof(tpk_run_opts, zero)},
        {"--zero-shard-size", I, 0, G, "0", "S", NULL, P, "parallel",
         "HSDP: --zero's slices within groups of S DP x CP ranks (a node's), all-reduced across "
         "the groups; S divides DP x CP",
         offsetof(tpk_run_opts, zero_shard)},
        {"--zero3-no-prefetch", B, 0, 0, NULL, NULL, NULL, R, "parallel",
         "--zero 3: each block's gather started at its use (exposed), not one block ahead",
         offsetof(tpk_run_opts, zero3_no_prefetch)},
        {"--zero3-whole-grads", B, 0, 0, NULL, NULL, NULL, R, "parallel",
         "--zero 3: the gradient buffer kept whole and reduce-scattered on the last micro-batch "
         "(no_sync), not each block's sharded as its backward ends",
         offsetof(tpk_run_opts, zero3_whole_grads)},
        {"--dp-reduce", C, 0, 0, NULL, "mean|adasum", NULL, P, "parallel",
         "adasum: DP a power of two", offsetof(tpk_run_opts, dp_reduce)},
        {"--recompute", C, 0, 0, NULL, "none|selective|full", NULL, P, "parallel", NULL,
         offsetof(tpk_run_opts, recompute)},
        {"--pp", I, 1, G, "1", NULL, NULL, P, "pipeline", "stages; the world is TP x CP x DP x PP",
         offsetof(tpk_run_opts, pp)},
        {"--micro-batches", I, 1, G, NULL, "M", NULL, P, "pipeline",
         "a step's micro-batches, as --grad-accum", offsetof(tpk_run_opts, micro)},
        {"--schedule", C, 0, 0, NULL, "gpipe|1f1b|interleaved", NULL, P, "pipeline", "default 1f1b",
         offsetof(tpk_run_opts, schedule)},
        {"--virtual-stages", I, 1, G, NULL, "2", NULL, P, "pipeline", "interleaved: chunks a stage",
         offsetof(tpk_run_opts, vstages)},
        {"--pp-layers", S, 0, 0, NULL, "5,7|auto", NULL, P, "pipeline",
         "blocks per virtual stage; auto: balanced by a flop estimate, the head's too",
         offsetof(tpk_run_opts, pp_layers)},
        {"--print-schedule", B, 0, 0, NULL, NULL, NULL, P, "pipeline", NULL,
         offsetof(tpk_run_opts, print_schedule)},
        {"--plan", B, 0, 0, NULL, NULL, NULL, P, "plan",
         "TP, PP, the micro-batch, recompute, ZeRO and SP chosen by the planner for these "
         "ranks: the fastest that fits; the step keeps --batch x --grad-accum x DP sequences; "
         "with --cp C, at CP C",
         offsetof(tpk_run_opts, plan)},
        {"--plan-profile", S, 0, 0, NULL, "NAME|FILE", NULL, P, "plan",
         "its hardware: h100 on a GPU, cpu on the host; a file of plan --calibrate",
         offsetof(tpk_run_opts, plan_profile)},
        {"--text", S, 0, 0, NULL, "FILE", NULL, D, "data", "bytes, or --tokenizer's tokens",
         offsetof(tpk_run_opts, text)},
        {"--data", S, 0, 0, NULL, "SHARD", NULL, D, "data", "llm.c tokens",
         offsetof(tpk_run_opts, data)},
        {"--val-data", S, 0, 0, NULL, "SHARD", NULL, D, "data", "default: --data",
         offsetof(tpk_run_opts, val_data)},
        {"--batch", I, 1, G, "8", NULL, NULL, D, "data", "a DP rank's micro-batch",
         offsetof(tpk_run_opts, batch)},
        {"--dp-batch", S, 0, 0, NULL, "8,8,4", NULL, D, "data", "one per DP rank",
         offsetof(tpk_run_opts, dp_batch)},
        {"--seq-len", I, 1, G, NULL, "64", NULL, D, "data", "--load: at most its positions",
         offsetof(tpk_run_opts, seq)},
        {"--grad-accum", I, 1, G, "1", NULL, NULL, D, "data", NULL, offsetof(tpk_run_opts, accum)},
        {"--steps", I, 0, G, NULL, "100", NULL, O, "training", NULL, offsetof(tpk_run_opts, steps)},
        {"--lr", X, 0, 10, "1e-3", NULL, NULL, O, "training", NULL, offsetof(tpk_run_opts, lr)},
        {"--warmup", I, 0, G, "10", NULL, NULL, O, "training", NULL,
         offsetof(tpk_run_opts, warmup)},
        {"--min-lr-frac", X, 0, 1, "0.1", NULL, NULL, O, "training", NULL,
         offsetof(tpk_run_opts, min_lr_frac)},
        {"--weight-decay", X, 0, 10, "0.1", NULL, NULL, O, "training", NULL,
         offsetof(tpk_run_opts, wd)},
        {"--clip", X, 0, 1e9, "1.0", NULL, NULL, O, "training", NULL, offsetof(tpk_run_opts, clip)},
        {"--beta1", X, 0, 0.9999, "0.9", NULL, NULL, O, "training", NULL,
         offsetof(tpk_run_opts, b1)},
        {"--beta2", X, 0, 0.9999, "0.95", NULL, NULL, O, "training", NULL,
         offsetof(tpk_run_opts, b2)},
        {"--dropout", X, 0, 0.99, "0", NULL, NULL, O, "training", NULL,
         offsetof(tpk_run_opts, dropout)},
        {"--label-smoothing", X, 0, 0.99, "0", NULL, NULL, O, "training", NULL,
         offsetof(tpk_run_opts, smoothing)},
        {"--seed", I, 0, G, "1", NULL, NULL, O, "training", NULL, offsetof(tpk_run_opts, seed)},
        {"--deterministic", B, 0, 0, NULL, NULL, NULL, O, "training", "same bits every run",
         offsetof(tpk_run_opts, det)},
        {"--fp8", C, 0, 0, NULL, "current|delayed", NULL, O, "fp8",
         "the attention's and MLP's linears in FP8 (E4M3 x and W, E5M2 dy), scaled by the amax "
         "now or by an amax history",
         offsetof(tpk_run_opts, fp8)},
        {"--fp8-history", I, 1, 1 << 20, "1024", NULL, NULL, O, "fp8", "delayed: steps of amax",
         offsetof(tpk_run_opts, fp8_history)},
        {"--fp8-amax", C, 0, 0, NULL, "max|most_recent", NULL, O, "fp8",
         "delayed: the history's max (default) or the latest", offsetof(tpk_run_opts, fp8_amax)},
        {"--fp8-margin", I, 0, 64, "0", NULL, NULL, O, "fp8", "scale = max / amax / 2^margin",
         offsetof(tpk_run_opts, fp8_margin)},
        {"--eval-every", I, 0, G, "0", NULL, NULL, R, "eval", NULL,
         offsetof(tpk_run_opts, eval_every)},
        {"--eval-batches", I, 1, G, "4", NULL, NULL, R, "eval", NULL,
         offsetof(tpk_run_opts, eval_batches)},
        {"--eval-only", B, 0, 0, NULL, NULL, NULL, R, "eval", NULL,
         offsetof(tpk_run_opts, eval_only)},
        {"--save", S, 0, 0, NULL, "DIR", NULL, R, "output",
         "made and checked writable before training; written at the end",
         offsetof(tpk_run_opts, save)},
        {"--save-every", I, 0, G, "0", NULL, NULL, R, "output", "K: also DIR/step-K, ...",
         offsetof(tpk_run_opts, save_every)},
        {"--keep", I, 1, G, NULL, "N", NULL, R, "output", "only the last N of them",
         offsetof(tpk_run_opts, keep)},
        {"--csv", S, 0, 0, NULL, "FILE", NULL, R, "output",
         "a resume continues it; FILE.svg: the loss curves", offsetof(tpk_run_opts, csv)},
        {"--log-every", I, 1, G, "1", NULL, NULL, R, "output", NULL,
         offsetof(tpk_run_opts, log_every)},
        {"--profile", B, 0, 0, NULL, NULL, NULL, R, "output",
         "every op's time per step, from step 2", offsetof(tpk_run_opts, profile)},
        {"--tokenizer", S, 0, 0, NULL, "DIR", NULL, K, "text",
         "tokenizer.json, or vocab.json + merges.txt; default: --load DIR's",
         offsetof(tpk_run_opts, tokenizer)},
        {"--sample", I, 0, G, "0", NULL, NULL, T, "text",
         "N tokens after --prompt, else after end-of-text", offsetof(tpk_run_opts, sample)},
        {"--prompt", S, 0, 0, NULL, "TEXT", NULL, T, "text", NULL, offsetof(tpk_run_opts, prompt)},
        {"--temperature", X, 0, 1e3, "1", NULL, NULL, T, "text", "0: the most likely",
         offsetof(tpk_run_opts, temperature)},
        {"--top-k", I, 0, G, "0", NULL, NULL, T, "text", "0: off", offsetof(tpk_run_opts, top_k)},
        {"--top-p", X, 0, 1, "1", NULL, NULL, T, "text", "1: off", offsetof(tpk_run_opts, top_p)},
        {"--timeout", X, 0, 1e9, NULL, "600", NULL, R, "failures",
         "seconds a collective waits for the other ranks without progress (a rank announced "
         "busy, hashing, loading or saving a checkpoint, holds it), then the job stops; 0: no "
         "limit; default TPK_TIMEOUT or 600",
         offsetof(tpk_run_opts, timeout)}};
    int nb = (int)(sizeof base / sizeof base[0]), nm = 0;
    while (nm < nb && base[nm].cls == TPK_OPT_MODEL) nm++; /* the model's flags come first */
    for (int i = 0; i < nm; i++) t[nt++] = base[i];
    for (int k = 0; k < TPK_ARCH_COUNT; k++) { /* then each family's flags, under its name */
        int nf = 0;
        const tpk_lm_flag *f = tpk__model_family((tpk_arch)k)->flags(&nf);
        for (int i = 0; i < nf && nt < (int)(sizeof t / sizeof t[0]); i++) {
            tpk_flag e = {f[i].flag,
                          TPK_FLAG_LIST,
                          f[i].lo,
                          f[i].hi,
                          NULL,
                          f[i].help,
                          NULL,
                          M,
                          tpk__model_family((tpk_arch)k)->name,
                          NULL,
                          offsetof(tpk_run_opts, fam)};
            t[nt++] = e;
        }
    }
    for (int i = nm; i < nb && nt < (int)(sizeof t / sizeof t[0]); i++) t[nt++] = base[i];
    return *n = nt, t;
}

/* The families' --arch names joined by sep ("gpt2, llama, neox"): the ones a flag selects. */
static inline const char *tpk_run_arch_names(char *buf, size_t n, const char *sep) {
    buf[0] = 0;
    for (int k = 0; k < TPK_ARCH_COUNT; k++)
        if (k != TPK_ARCH_CUSTOM)
            snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", k ? sep : "",
                     tpk__model_family((tpk_arch)k)->name);
    return buf;
}

/* What the parsed flags say together, for a world of `world` ranks (0: not checked): derived
 * fields set; false with the message in err. */
static inline bool tpk_run_opts_check(tpk_run_opts *o, int argc, int world, char *err, size_t n) {
    o->steps_given = o->steps >= 0;
    if (!o->steps_given) o->steps = 100;
    if (argc < 2) return snprintf(err, n, "no arguments: --help lists the options"), false;
    if (!(o->top_p > 0))
        return snprintf(err, n, "--top-p: expected a number in (0, 1], got 0"), false;
    if (o->prompt && !o->sample) o->sample = 128; /* a prompt asks for a sample */
    if (!o->data && !o->text && !(o->load && o->sample && !o->eval_only))
        return snprintf(err, n,
                        "no data: give --text FILE or --data SHARD to train or evaluate (--load "
                        "DIR alone can only --sample N)"),
               false;
    if (o->data && o->text) return snprintf(err, n, "--data and --text: give one"), false;
    if (!o->data && !o->text) o->steps = 0; /* --load DIR --sample N: sample only */
    o->rc = TPK_RECOMPUTE_NONE, o->kind = TPK_PIPE_1F1B;
    if (o->recompute) tpk_recompute_parse(o->recompute, &o->rc);
    if (o->schedule) tpk_pipe_kind_parse(o->schedule, &o->kind);
    if (o->micro > 0 && o->accum != 1 && o->accum != o->micro)
        return snprintf(err, n,
                        "--micro-batches %lld and --grad-accum %lld: the same count, give one",
                        (long long)o->micro, (long long)o->accum),
               false;
    if (o->micro > 0) o->accum = o->micro;
    if (o->vstages > 0 && o->kind != TPK_PIPE_INTERLEAVED && o->vstages != 1)
        return snprintf(err, n,
                        "--virtual-stages %lld: only the interleaved schedule has several chunks "
                        "a stage (--schedule interleaved)",
                        (long long)o->vstages),
               false;
    if (o->vstages < 1) o->vstages = o->kind == TPK_PIPE_INTERLEAVED ? 2 : 1;
    if (o->save_every && !o->save)
        return snprintf(err, n,
                        "--save-every %lld: needs --save DIR (the checkpoints go to DIR/step-K)",
                        (long long)o->save_every),
               false;
    if (o->keep > 0 && !(o->save && o->save_every))
        return snprintf(err, n,
                        "--keep %lld: applies to the checkpoints of --save DIR "
                        "--save-every K",
                        (long long)o->keep),
               false;
    if (o->keep < 0) o->keep = 0;
    o->piped = o->pp > 1 || o->schedule || o->pp_layers;
    if (!o->fp8 && (o->fp8_amax || o->fp8_margin || o->fp8_history != 1024))
        return snprintf(err, n, "--fp8-history, --fp8-amax, --fp8-margin: only with --fp8"), false;
    o->pp_auto = o->pp_layers && !strcmp(o->pp_layers, "auto");
    if (world && world % o->tp)
        return snprintf(err, n, "--tp %lld does not divide the %d ranks", (long long)o->tp, world),
               false;
    if (world && world % (o->tp * o->cp))
        return snprintf(err, n,
                        "--cp %lld: the %d ranks are not TP x CP x DP with --tp %lld (expected a "
                        "multiple of %lld ranks)",
                        (long long)o->cp, world, (long long)o->tp, (long long)(o->tp * o->cp)),
               false;
    if (world && world % (o->tp * o->cp * o->pp))
        return snprintf(err, n,
                        "--pp %lld: the %d ranks are not TP x CP x DP x PP with --tp %lld --cp "
                        "%lld (expected a multiple of %lld ranks)",
                        (long long)o->pp, world, (long long)o->tp, (long long)o->cp,
                        (long long)(o->tp * o->cp * o->pp)),
               false;
    int64_t dpw = world ? world / (o->tp * o->cp * o->pp) : 0; /* the DP size */
    if (o->ep > 1 && dpw % o->ep)
        return snprintf(err, n,
                        "--ep %lld: expected a divisor of the DP size %lld (%d ranks / --tp %lld "
                        "--cp %lld --pp %lld): the EP groups are carved out of the DP ranks",
                        (long long)o->ep, (long long)dpw, world, (long long)o->tp, (long long)o->cp,
                        (long long)o->pp),
               false;
    if (o->ep > 1 && o->dp_reduce && !strcmp(o->dp_reduce, "adasum"))
        return snprintf(err, n,
                        "--ep %lld: not yet with --dp-reduce adasum (its pairs over DP would "
                        "combine different experts held at the same offsets)",
                        (long long)o->ep),
               false;
    if (o->ep > 1 && o->zero_shard)
        return snprintf(err, n,
                        "--zero-shard-size %lld: not yet with --ep %lld (at EP > 1 --zero slices "
                        "over the ranks holding the same experts, DP x CP / EP of them)",
                        (long long)o->zero_shard, (long long)o->ep),
               false;
    if (o->piped && o->kind == TPK_PIPE_INTERLEAVED && (o->eval_every || o->eval_only) &&
        o->eval_batches % o->pp)
        return snprintf(err, n,
                        "--eval-batches %lld: the interleaved schedule evaluates through the "
                        "stages a multiple of the %lld stages of batches",
                        (long long)o->eval_batches, (long long)o->pp),
               false;
    if (o->zero3_no_prefetch && o->zero != 3)
        return snprintf(err, n, "--zero3-no-prefetch: expected --zero 3, got --zero %lld",
                        (long long)o->zero),
               false;
    if (o->zero3_whole_grads && o->zero != 3)
        return snprintf(err, n, "--zero3-whole-grads: expected --zero 3, got --zero %lld",
                        (long long)o->zero),
               false;
    if (world && o->zero && !o->plan && world / (o->tp * o->pp) == 1)
        return snprintf(err, n,
                        "--zero %lld: shards the %s over data parallelism, but there is 1 DP "
                        "rank (%d ranks / --tp %lld)",
                        (long long)o->zero,
                        o->zero == 3   ? "optimizer, the gradients and the weights"
                        : o->zero == 2 ? "optimizer and the gradients"
                                       : "optimizer",
                        world,
                        (long long)o->tp),
               false;
    int64_t dpc = world ? world / (o->tp * o->pp) : 0; /* DP x CP: ZeRO's group */
    if (o->zero_shard && !o->zero && !o->plan)
        return snprintf(err, n,
                        "--zero-shard-size %lld: shards --zero's slices within groups of DP "
                        "ranks (HSDP), but --zero is 0 (expected --zero 1, 2 or 3)",
                        (long long)o->zero_shard),
               false;
    if (o->zero_shard && dpc && (o->zero_shard < 2 || dpc % o->zero_shard))
        return snprintf(err, n,
                        "--zero-shard-size %lld: expected a divisor >= 2 of DP x CP = %lld (%d "
                        "ranks / --tp %lld --pp %lld)",
                        (long long)o->zero_shard, (long long)dpc, world, (long long)o->tp,
                        (long long)o->pp),
               false;
    if (o->piped && o->sample)
        return snprintf(err, n,
                        "--sample: not supported with pipeline stages yet (--pp %lld): save with "
                        "--pp, then --load the checkpoint without it to sample",
                        (long long)o->pp),
               false;
    o->nppl = 0;
    if (o->pp_layers && !o->pp_auto) { /* whole numbers separated by commas */
        const char *c = o->pp_layers;
        char *end = NULL;
        bool good = true;
        while (good && *c && o->nppl < 256) {
            errno = 0;
            long long v = strtoll(c, &end, 10); /* past int64: refused, not clamped */
            good = end != c && (*end == ',' || !*end) && errno == 0 && v >= 1;
            o->ppl[o->nppl++] = v, c = *end ? end + 1 : end;
        }
        if (!good || o->nppl != o->pp * o->vstages)
            return snprintf(err, n,
                            "--pp-layers: expected %lld whole numbers >= 1 separated by commas "
                            "(one per virtual stage: --pp %lld x --virtual-stages %lld), got "
                            "\"%s\"",
                            (long long)(o->pp * o->vstages), (long long)o->pp,
                            (long long)o->vstages, o->pp_layers),
                   false;
    }
    int ntw = o->tp_weights ? tpk_parse_weights(o->tp_weights, o->tw, 64) : (int)o->tp;
    if (ntw != o->tp)
        return snprintf(err, n,
                        "--tp-weights: expected %lld positive numbers separated by commas (one per "
                        "TP rank), got \"%s\"",
                        (long long)o->tp, o->tp_weights),
               false;
    return true;
}

/* The trainer's flags (the whole table) parsed and checked for a world of `world` ranks: 0; -1 for
 * --help; 1 with the message in err. */
static inline int tpk_run_parse(tpk_run_opts *o, int argc, char **argv, int world, char *err,
                                size_t n) {
    int nt = 0;
    tpk_flag_set set = {tpk_run_flags(&nt), nt, TPK_OPT_TRAINER, o};
    int r = tpk_flags_parse(&set, 1, argc, argv, NULL, NULL, err, n);
    return r ? r : tpk_run_opts_check(o, argc, world, err, n) ? 0 : 1;
}

/* The trainer's usage on out: every flag of the table. */
static inline void tpk_run_usage(FILE *out) {
    int nt = 0;
    tpk_run_opts o;
    tpk_flag_set set = {tpk_run_flags(&nt), nt, TPK_OPT_TRAINER, &o};
    tpk_flags_usage(
        out,
        "usage: train (--text FILE | --data SHARD [--val-data SHARD] | --load DIR) "
        "[options]\n  (a model of --layers 4 --hidden 128 --heads 4 --vocab: the tokenizer's, 256 "
        "for --text, else 50257, unless given; with --load the model's shape is its "
        "config.json's)\n",
        &set, 1);
}

/* A checkpoint loaded at `step`: --steps met (without --steps, --eval-only and --sample of a
 * checkpoint past the default train nothing; a checkpoint past --steps is an error: --steps counts
 * from 0); print: "resumed from DIR at step K" (and tpk_ckpt_resume_note's second line) on stdout.
 * false with the message in err. */
static inline bool tpk_run_resume(tpk_ctx *ctx, tpk_run_opts *o, int64_t step, bool print,
                                  char *err, size_t n) {
    if (!o->load) return true;
    if (o->sample && !o->steps_given && step > o->steps) o->steps = step;
    if (!o->eval_only && o->steps && step > o->steps)
        return snprintf(err, n,
                        "--steps %lld: the checkpoint %s is already at step %lld (--steps counts "
                        "from 0)",
                        (long long)o->steps, o->load, (long long)step),
               false;
    if (print) tpk_ckpt_resume_note(ctx, o->load, step, !o->eval_only, stdout);
    return true;
}

/* The family flags given (o->fam) into cfg's family config, or, loading, checked against the
 * checkpoint's: false with the message in err for a flag the family has not, a value outside its
 * range, or one that differs from config.json's. */
static inline bool tpk_run_family_flags(const tpk_run_opts *o, tpk_model_config *cfg, char *err,
                                        size_t n) {
    for (int k = 0; k < o->fam.n; k++) {
        const char *a = o->fam.v[k].flag, *v = o->fam.v[k].value;
        const tpk_lm_flag *f = tpk_model_flag(cfg->arch, a);
        if (!f) {
            char who[64] = "";
            for (int q = 0; q < TPK_ARCH_COUNT; q++)
                if (tpk_model_flag((tpk_arch)q, a))
                    snprintf(who + strlen(who), sizeof who - strlen(who), "%s%s",
                             *who ? " or " : "", tpk_arch_name((tpk_arch)q));
            return snprintf(err, n, "%s: applies to --arch %s only (the model is %s)", a, who,
                            tpk_arch_name(cfg->arch)),
                   false;
        }
        void *field = (char *)tpk__model_cfg(cfg) + f->off;
        if (f->kind == TPK_LM_FLAG_LAYERS) { /* a set of layers: "0,2" or "none" */
            tpk_layer_set x, *has = (tpk_layer_set *)field;
            char buf[64];
            if (!tpk_layer_set_parse(v, &x))
                return snprintf(err, n,
                                "%s: expected layer indices 0..%d separated by commas, or none, "
                                "got \"%s\"",
                                a, TPK_LAYER_SET_MAX - 1, v),
                       false;
            if (o->load && memcmp(&x, has, sizeof x))
                return snprintf(err, n,
                                "%s %s: the checkpoint %s has %s (a loaded model's shape is its "
                                "config.json's: leave the flag out)",
                                a, v, o->load,
                                *tpk_layer_set_text(has, ",", buf, sizeof buf) ? buf : "none"),
                       false;
            *has = x;
            continue;
        }
        bool is_int = f->kind == TPK_LM_FLAG_INT;
        char *end = NULL;
        double x = is_int ? (double)strtoll(v, &end, 10) : strtod(v, &end);
        if (end == v || *end || !(x >= f->lo && x <= f->hi))
            return snprintf(err, n, "%s: expected %s in [%g, %g], got \"%s\"", a,
                            is_int ? "an integer" : "a number", f->lo, f->hi, v),
                   false;
        double has = is_int ? (double)*(int64_t *)field : (double)*(float *)field;
        if (o->load && f->kind != TPK_LM_FLAG_OPTION && fabs(x - has) > 1e-6 * fabs(has))
            return snprintf(err, n,
                            "%s %g: the checkpoint %s has %g (a loaded model's shape is its "
                            "config.json's: leave the flag out)",
                            a, x, o->load, has),
                   false;
        if (is_int) *(int64_t *)field = (int64_t)x;
        else *(float *)field = (float)x;
    }
    return true;
}

/* The model's config from the flags (a shape flag not given: def[] = vocab, layers, hidden, heads;
 * positions: --positions, else the sequence length) or --load DIR's config.json (a shape flag
 * given that differs: an error), with --label-smoothing, --sequence-parallel and --recompute.
 * *seq: --seq-len, else def_seq (loading: at most the checkpoint's positions). A failure's message
 * in err (config.json's: ctx's error and its status's name). */
static inline tpk_status tpk_run_model_config(tpk_ctx *ctx, const tpk_run_opts *o,
                                              const int64_t def[4], int64_t def_seq,
                                              tpk_model_config *cfg, int64_t *seq, char *err,
                                              size_t n) {
    memset(cfg, 0, sizeof *cfg);
    if (!o->arch || !tpk_arch_from_name(o->arch, false, &cfg->arch)) cfg->arch = TPK_ARCH_GPT2;
    tpk_status st = o->load ? tpk_model_config_read(ctx, o->load, cfg) : TPK_OK;
    if (st != TPK_OK)
        return snprintf(err, n, "%.400s (%s)", tpk_last_error(ctx), tpk_status_str(st)), st;
    int64_t *sh[5]; /* vocab, positions, layers, hidden, heads */
    tpk_model_config_common(cfg, sh, (float)o->smoothing, o->sp, o->rc);
    if (!o->load) {
        *sh[0] = o->vocab > 0 ? o->vocab : def[0], *sh[2] = o->layers > 0 ? o->layers : def[1];
        *sh[3] = o->hidden > 0 ? o->hidden : def[2], *sh[4] = o->heads > 0 ? o->heads : def[3];
        *sh[1] = o->positions > 0 ? o->positions : 0;
    }
    *seq = o->seq > 0 ? o->seq : o->load && *sh[1] && *sh[1] < def_seq ? *sh[1] : def_seq;
    if (!*sh[1]) *sh[1] = *seq;
    if (o->load && o->arch && strcmp(o->arch, tpk_arch_name(cfg->arch)))
        return snprintf(err, n, "--arch %s: the checkpoint %s holds a %s model", o->arch, o->load,
                        tpk_arch_name(cfg->arch)),
               TPK_ERR_ARG;
    if (!tpk__model_family(cfg->arch)->dropout && o->dropout > 0)
        return snprintf(err, n, "--dropout: the %s model has no dropout",
                        tpk__model_family(cfg->arch)->title),
               TPK_ERR_ARG;
    if (!tpk_run_family_flags(o, cfg, err, n)) return TPK_ERR_ARG;
    if (!tpk_arch_has_experts(cfg->arch) && o->ep > 1)
        return snprintf(err, n,
                        "--ep %lld: the %s model has no experts (--arch mixtral and qwen2_moe "
                        "have)",
                        (long long)o->ep, tpk__model_family(cfg->arch)->title),
               TPK_ERR_ARG;
    if (tpk_arch_has_experts(cfg->arch)) { /* the trainer's words for the library's refusals */
        bool mix = cfg->arch == TPK_ARCH_MIXTRAL;
        int64_t E = mix ? cfg->mixtral.experts : cfg->qwen2_moe.experts;
        int64_t k = mix ? cfg->mixtral.top_k : cfg->qwen2_moe.top_k;
        E = E ? E : mix ? 8 : 60, k = k ? k : mix ? 2 : 4;
        if (o->ep > 1 && E % o->ep)
            return snprintf(err, n,
                            "--ep %lld: expected a divisor of the %lld experts (--experts; each EP "
                            "rank holds experts / ep of them)",
                            (long long)o->ep, (long long)E),
                   TPK_ERR_ARG;
        if (k > E)
            return snprintf(err, n, "--moe-top-k %lld: expected at most the %lld experts",
                            (long long)k, (long long)E),
                   TPK_ERR_ARG;
    }
    int64_t only = cfg->arch == TPK_ARCH_QWEN2_MOE ? tpk_layer_set_last(&cfg->qwen2_moe.mlp_only)
                                                   : -1; /* Qwen2-MoE's dense layers */
    if (only >= *sh[2])
        return snprintf(err, n,
                        "--mlp-only-layers: layer %lld, expected layers below the model's %lld "
                        "(--layers)",
                        (long long)only, (long long)*sh[2]),
               TPK_ERR_ARG;
    struct {
        const char *flag;
        int64_t given, has;
    } f[] = {{"--layers", o->layers, *sh[2]},
             {"--hidden", o->hidden, *sh[3]},
             {"--heads", o->heads, *sh[4]},
             {"--vocab", o->vocab, *sh[0]},
             {"--positions", o->positions, *sh[1]}};
    for (size_t i = 0; o->load && i < sizeof f / sizeof f[0]; i++)
        if (f[i].given > 0 && f[i].given != f[i].has)
            return snprintf(err, n,
                            "%s %lld: the checkpoint %s has %lld (a loaded model's shape is its "
                            "config.json's: leave the flag out)",
                            f[i].flag, (long long)f[i].given, o->load, (long long)f[i].has),
                   TPK_ERR_ARG;
    if (*seq > *sh[1])
        return snprintf(err, n, "--seq-len %lld is longer than the model's %lld positions",
                        (long long)*seq, (long long)*sh[1]),
               TPK_ERR_ARG;
    int64_t cp = o->cp > 1 ? o->cp : 1;
    if (cp > 1 && *seq % (2 * cp))
        return snprintf(err, n,
                        "--seq-len %lld: expected a multiple of 2 x --cp = %lld (each sequence "
                        "cut into %lld chunks, CP rank r holding chunks r and 2 cp - 1 - r)",
                        (long long)*seq, (long long)(2 * cp), (long long)(2 * cp)),
               TPK_ERR_ARG;
    /* the attention over CP: the ring or the all-gather (every family's config carries it) */
    tpk_cp_comm cm = o->cp_comm && !strcmp(o->cp_comm, "allgather") ? TPK_CP_ALLGATHER : TPK_CP_P2P;
    cfg->gpt2.cp_comm = cfg->llama.cp_comm = cfg->neox.cp_comm = cfg->custom.cp_comm = cm;
    cfg->mixtral.cp_comm = cfg->qwen2_moe.cp_comm = cm;
    return TPK_OK;
}

/* The model's vocabulary (its config's). */
static inline int64_t tpk_run_config_vocab(tpk_model_config *cfg) {
    int64_t *sh[5];
    tpk__model_common(cfg, sh, NULL, NULL, NULL, NULL);
    return *sh[0];
}

/* AdamW as the flags say (--beta1, --beta2, --weight-decay, --zero; eps 1e-8). */
static inline tpk_adamw_desc tpk_run_adamw_desc(const tpk_run_opts *o) {
    tpk_adamw_desc d;
    memset(&d, 0, sizeof d);
    d.b1 = (float)o->b1, d.b2 = (float)o->b2, d.eps = 1e-8f, d.weight_decay = (float)o->wd;
    d.zero = o->zero > 0, d.zero_stage = (int)o->zero;
    return d;
}

/* The family's name in print ("GPT-2"). */
static inline const char *tpk_run_family_title(tpk_arch a) {
    return tpk__model_family(a) ? tpk__model_family(a)->title : "?";
}

/* The family's labelled config flags of a built model, " G=2 F=64" (the trainer's banner). */
static inline const char *tpk_run_family_banner(tpk_model *m, char *buf, size_t n) {
    int nf = 0;
    const tpk_lm_flag *f = tpk__model_family(m->arch)->flags(&nf);
    const char *c = (const char *)tpk__model_built_cfg(m);
    buf[0] = 0;
    for (int i = 0; i < nf; i++) {
        size_t at = strlen(buf);
        if (!f[i].label || f[i].kind == TPK_LM_FLAG_LAYERS) continue;
        if (f[i].kind == TPK_LM_FLAG_INT)
            snprintf(buf + at, n - at, " %s=%lld", f[i].label,
                     (long long)*(const int64_t *)(c + f[i].off));
        else
            snprintf(buf + at, n - at, " %s=%g", f[i].label,
                     (double)*(const float *)(c + f[i].off));
    }
    return buf;
}

#endif /* TPK_TRAIN_OPTIONS_H */
