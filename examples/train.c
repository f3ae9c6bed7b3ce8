/* examples/train.c — a Megatron-style trainer on tpk for every model family (--arch gpt2, llama,
 * neox): tensor parallelism (TP) within groups of --tp consecutive ranks, context parallelism
 * (--cp: each sequence split over C ranks), data parallelism (DP) across them, pipeline stages
 * (--pp). The template to copy:
 *   mpirun -np 2 build/train --text FILE --tp 2 --layers 4 --hidden 128 --heads 4 --steps 500
 *   --save ckpt --sample 200
 * The machinery is the library's (tpk/train/): the flags (options.h: one table), the ranks'
 * agreement and input digests (ranks.h), the backend and mesh (backend.h), the tokenizer, data and
 * samples (sources.h), the checkpoint folder (ckpt_folder.h), --plan (plan_apply.h) and one
 * handle for every pipeline size (trainable.h). What stays here: the order of things, the loop,
 * its logging and the evaluation. A step: --grad-accum micro-batches, forward, backward, the DP
 * reduction, norm, clipping, AdamW under a cosine schedule; the loss read only on a step that
 * reports it. Batch k of DP rank d is window k*dp + d (its CP ranks read the same sequences; the
 * trainable hands each its chunks), so a resume is bit-identical. A failure:
 * one line `train: error: ...`, every rank stops; a collective that fails or gets no answer
 * within --timeout S aborts the job after its line. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <time.h>

#include <tpk/tpk.h>
#include <tpk/train/backend.h>
#include <tpk/train/ckpt_folder.h>
#include <tpk/train/log.h>
#include <tpk/train/options.h>
#include <tpk/train/plan_apply.h>
#include <tpk/train/ranks.h>
#include <tpk/train/report.h>
#include <tpk/train/sources.h>
#include <tpk/train/trainable.h>
#include <tpk/train/zero3.h>

static tpk_ranks W; /* the world: its agreement on going on, the error lines */
static tpk_ctx ctx; /* errors before tpk_ctx_init land in it too */
/* what main builds and frees: the backend and world communicator, the model, the optimizer, the
 * DP buckets, the tokens, the tokenizer (--tokenizer, or --load DIR's), a step's batch, --csv */
static tpk_run_backend be;
static tpk_trainable t;
static tpk_adamw opt;
static tpk_fp8 f8; /* --fp8: the recipe (ctx.fp8) */
static tpk_dp_buckets dp_b;
static tpk_zero3 z3; /* --zero 3: the weights sharded between uses */
static tpk_tokens train, val;
static tpk_tokenizer *tk;
static const char *tk_path;
static int32_t *x, *y;
static tpk_log csv;
static bool ok(tpk_status s) { return tpk_ranks_ok(&W, &ctx, s); }
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static bool out_ok(void) { return fflush(stdout) == 0 && !ferror(stdout); }

/* Mean loss of --eval-batches validation batches, averaged over DP, dropout off. Collective. */
static tpk_status evaluate(tpk_trainable *t, const tpk_tokens *val, const tpk_run_opts *o,
                           int64_t S, int32_t *x, int32_t *y, double *out) {
    int K = (int)o->eval_batches;
    size_t bt = (size_t)o->batch * (size_t)S;
    float *l = (float *)malloc(sizeof(float) * (size_t)K);
    double sum = 0;
    if (!l) return tpk_fail(&ctx, TPK_ERR_NOMEM, "evaluate", "%d losses", K);
    tpk_status s = tpk_trainable_set_dropout(&ctx, t, 0);
    for (int k = 0; s == TPK_OK && k < K; k++)
        s = tpk_data_batch(&ctx, val, k, ctx.dp.size, ctx.dp.rank, o->batch, S, x + k * bt,
                           y + k * bt);
    if (s == TPK_OK) s = tpk_trainable_losses(&ctx, t, x, y, o->batch, S, K, l);
    for (int k = 0; s == TPK_OK && k < K; k++) sum += l[k];
    free(l);
    TPK_TRY(s);
    TPK_TRY(tpk_trainable_set_dropout(&ctx, t, (float)o->dropout));
    sum /= K;
    TPK_TRY(tpk_allreduce_host(&ctx, &ctx.dp, &sum, 1, TPK_F64, TPK_SUM));
    *out = sum / ctx.dp.size;
    return TPK_OK;
}

/* The step's line on rank 0: loss (a mixture of experts': the cross-entropy plus the router's
 * load-balancing loss, that share in brackets), norm, lr, the mean step time since the last line,
 * tokens/s,
 * on a GPU the model flops utilisation (6 N + 12 L H S flops a token against TPK_PEAK_TFLOPS,
 * default 989: an H100's bf16 dense), the validation loss, at more than one rank the slowest and
 * fastest rank's compute time a step (tpk_run_pace), the time left. */
static bool log_step(int64_t step, int64_t steps, double l, double aux, double norm, float lr,
                     double ms, double tok, double eta, double vl, double flops_tok,
                     const tpk_run_pace *p) {
    double peak = 989.0; /* TPK_PEAK_TFLOPS, checked with the others at tpk_ctx_init */
    tpk_env_number(NULL, "TPK_PEAK_TFLOPS", peak, &peak);
    char pace[96];
    printf("step %5lld/%lld | loss %.4f", (long long)step, (long long)steps, l);
    if (isfinite(aux)) printf(" (aux %.6f)", aux); /* a mixture of experts' share of the loss */
    printf(" | grad norm %.3f | lr %.2e | %.1f ms | %.0f tok/s", norm, (double)lr, ms,
           tok / (ms * 1e-3));
    if (flops_tok > 0)
        printf(" | MFU %.1f%%",
               100.0 * flops_tok * tok / (ms * 1e-3) / (peak * 1e12 * W.size));
    if (isfinite(vl)) printf(" | val loss %.4f", vl);
    printf("%s | ETA %dm%02ds\n", tpk_run_pace_str(p, pace, sizeof pace), (int)(eta / 60),
           (int)fmod(eta, 60.0));
    return out_ok();
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    signal(SIGXFSZ, SIG_IGN); /* a full disk or a file-size limit: the write fails (EFBIG) */
    tpk_run_opts o;
    char err[1024] = "";
    bool env = tpk_ranks_init(&W, "train"); /* TPK_TIMEOUT's */
    int rc = 1, pr = tpk_run_parse(&o, argc, argv, W.size, err, sizeof err);
    if (pr < 0 && W.rank == 0) tpk_run_usage(stdout);
    if (pr < 0) return MPI_Finalize(), 0;
    if (pr == 0 && !env) pr = 1, snprintf(err, sizeof err, "%s", W.msg);
    if (o.timeout >= 0) W.timeout = o.timeout; /* --timeout over TPK_TIMEOUT */
    bool up = false, gpu = tpk_run_gpu_present();
    /* the same arguments, checkpoint and --save folder on every rank; the model's config */
    if (!tpk_ranks_agree(&W, pr == 0, err) || !tpk_ranks_same_args(&W, argc, argv) ||
        (o.load && !tpk_ranks_same_checkpoint(&W, o.load)) ||
        !tpk_ranks_agree(&W, W.rank || !o.save || tpk_ckpt_probe(o.save, err, sizeof err), err) ||
        !ok(tpk_run_tokenizer(&ctx, o.tokenizer, o.load, &tk, &tk_path)))
        goto out;
    int64_t def[4] = {tk ? tk->vocab_size : o.text ? 256 : 50257, 4, 128, 4}, S = 0, V = 0;
    tpk_model_config cfg;
    bool fits = tpk_run_model_config(&ctx, &o, def, 64, &cfg, &S, err, sizeof err) == TPK_OK &&
                tpk_run_text_fits(tk, tk_path, o.text, o.prompt, V = tpk_run_config_vocab(&cfg),
                                  err, sizeof err);
    FILE *out0 = W.rank ? NULL : stdout; /* rank 0 prints */
    if (!tpk_ranks_agree(&W, fits, err) ||
        (o.plan && /* the planner's mesh and step shape replace the flags' */
         !ok(tpk_run_plan(&ctx, &o, &cfg, S, W.size, 0, gpu, out0))) ||
        ((o.text || o.data) && /* the tokens: the same on every rank */
         (!ok(tpk_run_data(&ctx, o.text, tk, tk_path, o.data, o.val_data, V, o.batch * S + 1,
                           &train, &val, out0)) ||
          !tpk_ranks_same_data(&W, &train, &val, o.text, o.data, o.val_data))))
        goto out;
    /* the backend (a GPU per rank where one is present), the mesh, the model, the optimizer */
    tpk_trainable_desc td = {o.piped,   o.kind, (int)o.accum, (int)o.vstages, o.nppl ? o.ppl : NULL,
                             o.pp_auto, S};
    tpk_adamw_desc ad = tpk_run_adamw_desc(&o);
    char run[17]; /* this run's id: its checkpoints and --csv rows name it (a resume: the loaded) */
    tpk_ranks_new_id(&W, run);
    tpk_fp8_desc fd = {o.fp8 && !strcmp(o.fp8, "delayed") ? TPK_FP8_DELAYED : TPK_FP8_CURRENT,
                       (int)o.fp8_history,
                       o.fp8_amax && !strcmp(o.fp8_amax, "most_recent") ? TPK_FP8_AMAX_MOST_RECENT
                                                                        : TPK_FP8_AMAX_MAX,
                       (int)o.fp8_margin};
    if (!ok(tpk_run_backend_init(&ctx, &be, o.dtype, W.timeout)) ||
        !(up =
              ok(tpk_run_ctx_init(&ctx, &be, (int)o.tp, (int)o.cp, (int)o.pp, (int)o.ep,
                                  (int)o.zero_shard, o.tp_weights ? o.tw : NULL, o.seed, o.det))) ||
        (o.fp8 && !ok(tpk_fp8_init(&ctx, &f8, &fd))) || /* before the model: its linears */
        !ok(tpk_trainable_init(&ctx, &t, &cfg, &td)))
        goto out;
    memcpy(t.run_id, run, sizeof run); /* a loaded checkpoint's replaces it */
    if (!ok(tpk_trainable_set_dropout(&ctx, &t, (float)o.dropout)) ||
        !ok(tpk_adamw_init(&ctx, &opt, &ad)) ||
        (o.load && !ok(tpk_trainable_load(&ctx, &t, &opt, o.load))))
        goto out;
    if (!tpk_ranks_agree(&W, tpk_run_resume(&ctx, &o, opt.step, W.rank == 0, err, sizeof err), err))
        goto out;
    size_t nglobal = 0;
    int64_t Bd, off, Btot; /* this DP rank's micro-batch, the sequences before it, the step's */
    if (!ok(tpk_trainable_params(&ctx, &t, &nglobal)) ||
        !ok(tpk_data_dp_batches(&ctx, o.dp_batch, o.batch, &Bd, &off, &Btot)))
        goto out;
    if (W.rank == 0) tpk_run_banner(stdout, &ctx, &o, &t, &cfg, (double)nglobal, S, Btot);
    if (W.rank == 0 && o.fp8)
        printf("fp8: %s scaling of %d tensors (E4M3 x and W, E5M2 dy; history %lld, %s, margin "
               "%lld); embeddings, LM head, norms and softmax unquantized\n",
               o.fp8, f8.n, (long long)o.fp8_history, o.fp8_amax ? o.fp8_amax : "max",
               (long long)o.fp8_margin);
    size_t mbt = (size_t)Bd * (size_t)S, /* a micro-batch's tokens; the buffers hold a step's */
        bs = sizeof(int32_t) * (size_t)(o.batch > Bd ? o.batch : Bd) * (size_t)S *
             (size_t)(o.accum > o.eval_batches ? o.accum : o.eval_batches);
    if (!tpk_ranks_check(&W, !(x = malloc(bs)) || !(y = malloc(bs)), "out of memory for a batch"))
        goto out;
    double vl = NAN;
    if (o.eval_only) {
        if (!tpk_ranks_check(&W, !val.tok, "--eval-only needs --data or --text") ||
            !ok(evaluate(&t, &val, &o, S, x, y, &vl)))
            goto out;
        if (W.rank == 0) printf("val_loss %.6f\n", vl);
        goto finish;
    }
    if (!ok(tpk_log_open(&ctx, &csv, o.csv, opt.step, t.run_id))) goto out; /* a resume appends */

    /* training */
    bool adasum = o.dp_reduce && !strcmp(o.dp_reduce, "adasum"),
         moe = tpk_arch_has_experts(cfg.arch); /* the step line shows the aux loss */
    tpk_lr_schedule sched = {TPK_LR_COSINE, (float)o.lr, (float)o.min_lr_frac, o.warmup, o.steps};
    tpk_trainable_set_dp(&t, &dp_b, o.zero != 1 && !adasum); /* the buckets under the backward */
    if (adasum && !ok(tpk_dp_adasum_init(&ctx, &dp_b))) goto out; /* after the backward */
    if (o.zero >= 2 && !ok(tpk_dp_shard_grads(&ctx, &dp_b, &opt))) goto out; /* reduce-scatters */
    /* --zero 3: with stages each stage shards its own weights */
    tpk_zero3_desc z3d = {.no_prefetch = o.zero3_no_prefetch,
                          .whole_grads = o.zero3_whole_grads};
    if (o.zero == 3 && !ok(t.piped ? tpk_zero3_init_pipe(&ctx, &z3, &t.pm, &opt, &z3d)
                                   : tpk_zero3_init(&ctx, &z3, tpk_model_lm(&t.m), &opt, &z3d)))
        goto out;
    if (o.zero == 3 && W.rank == 0) { /* sharded: past one DP rank, without stages, if less */
        if (z3.sgrads)
            printf("zero3: gradients sharded (each block's reduce-scattered as its backward ends, "
                   "each micro-batch): %.2f MB of buffers beside the slice, not the whole %.2f\n",
                   (double)z3.grad_shard / 1e6, (double)z3.grad_whole / 1e6);
        else
            printf("zero3: gradients whole (reduce-scattered on the step's last micro-batch: "
                   "%s)\n",
                   o.zero3_whole_grads ? "--zero3-whole-grads"
                   : t.piped           ? "pipeline stages"
                                       : "their sharded buffers would hold more");
    }
    double t0 = now(), t_int = t0, int_s = 0, /* the reporting interval: its start, its time */
        flops = gpu ? tpk_run_flops_per_token(&t, (double)nglobal, S) : 0;
    int64_t from = opt.step, int_n = 0;
    tpk_mem_peak(&ctx, true); /* the peak from here: training */
    tpk_run_pace pace = tpk_run_pace_begin(opt.step); /* each rank's compute time a step */
    for (int64_t step = opt.step; step < o.steps; step++) {
        double l = NAN, aux = NAN, norm = 0, w = (double)Bd / (double)Btot / (double)o.accum;
        float lr = tpk_lr_at(&sched, step);
        for (int64_t k = 0; k < o.accum; k++) /* window micro * dp + rank with one --batch */
            if (!ok(tpk_data_batch_seq(&ctx, &train, (step * o.accum + k) * Btot + off, Bd, S,
                                       x + k * mbt, y + k * mbt)))
                goto out;
        /* the loss and norm read (a wait) only on a step that prints, evaluates or logs */
        int64_t s1 = step + 1;
        bool eval = o.eval_every && (s1 % o.eval_every == 0 || s1 == o.steps),
             report = s1 % o.log_every == 0 || s1 == o.steps || eval || csv.path[0];
        vl = NAN;
        if (!ok(tpk_trainable_step(&ctx, &t, &opt, &dp_b, x, y, Bd, S, (int)o.accum,
                                   (adasum ? (float)ctx.dp.size : 1.0f) * (float)Bd / (float)Btot /
                                       (float)o.accum, /* weighted by tokens */
                                   (uint64_t)(step * o.accum), lr, (float)o.clip,
                                   report ? &norm : NULL)) ||
            (report && !ok(tpk_trainable_loss(&ctx, &t, w, &l))) ||
            (report && moe && !ok(tpk_trainable_aux(&ctx, &t, w, &aux))) ||
            (eval && !ok(evaluate(&t, &val, &o, S, x, y, &vl))))
            goto out;
        if (report && moe) l += aux; /* the loss trained: Hugging Face's outputs.loss */
        if (report) int_s += now() - t_int; /* a step that does not report does not wait */
        int_n++;
        if (report) tpk_run_pace_step(&W, &pace, opt.step); /* the slowest rank, at a report */
        bool written = true; /* rank 0's step line and --csv row */
        if (W.rank == 0 && (opt.step % o.log_every == 0 || opt.step == o.steps || isfinite(vl))) {
            double ms = 1e3 * int_s / (double)int_n,
                   eta = (now() - t0) / (double)(opt.step - from) * (double)(o.steps - opt.step);
            written = log_step(opt.step, o.steps, l, aux, norm, lr, ms,
                               (double)(Btot * S * o.accum), eta, vl, flops, &pace);
            int_s = 0, int_n = 0;
        }
        if (!written)
            snprintf(err, sizeof err, "standard output: cannot write (%s)", strerror(errno));
        if (written && tpk_log_row(&ctx, &csv, opt.step, l, vl, lr, norm) != TPK_OK)
            written = false, snprintf(err, sizeof err, "%s", tpk_last_error(&ctx));
        if (report && !tpk_ranks_agree(&W, written, err)) goto out; /* every rank stops */
        if (o.save && o.save_every && opt.step % o.save_every == 0 && opt.step < o.steps) {
            char sub[1100]; /* DIR/step-N, after its step line; then the newest --keep stay */
            tpk_ckpt_step_dir(sub, sizeof sub, o.save, opt.step);
            if (z3.u && !ok(tpk_zero3_gather(&ctx, &z3))) goto out; /* --zero 3: saved whole */
            if (!ok(tpk_trainable_save(&ctx, &t, &opt, sub, opt.step, o.seed))) goto out;
            if (z3.u && !ok(tpk_zero3_shard(&ctx, &z3))) goto out;
            if (W.rank == 0) printf("saved %s (step %lld)\n", sub, (long long)opt.step);
            if (o.keep && !ok(W.rank ? TPK_OK : tpk_ckpt_keep_last(&ctx, o.save, o.keep))) goto out;
        }
        if (o.profile && !ok(ctx.prof ? tpk_profile_step(&ctx) : tpk_profile_start(&ctx)))
            goto out; /* the first step (a warm-up) not profiled */
        if (report) t_int = now();
    }
    tpk_mem_held held; /* the peak's weights, gathered, gradients, optimizer */
    if (!ok(tpk_mem_held_get(&ctx, &opt, &z3, &held))) goto out;
    tpk_run_summary(stdout, &W, &ctx, &o, &t, &held, from, now() - t0);
    tpk_run_profiles(stdout, &W, &ctx, t.piped, &pace);
    if (o.profile && moe && !ok(tpk_run_expert_rows(W.rank ? NULL : stdout, &ctx, &t))) goto out;
    if (!ok(tpk_log_close(&ctx, &csv, true))) goto out; /* and FILE.png where gnuplot is */
    if (z3.u && !ok(tpk_zero3_gather(&ctx, &z3))) goto out; /* whole to save and sample */
    if (o.save) { /* the model, and the tokenizer beside it: --load DIR samples text */
        if (!ok(tpk_trainable_save(&ctx, &t, &opt, o.save, opt.step, o.seed)) ||
            !ok(W.rank == 0 && tk ? tpk_ckpt_copy_tokenizer(&ctx, tk_path, o.save) : TPK_OK))
            goto out;
        if (W.rank == 0) printf("saved %s (step %lld)\n", o.save, (long long)opt.step);
    }
finish:;
    tpk_sample_opts so = {(float)o.temperature, (int)o.top_k, (float)o.top_p};
    if (o.sample && !ok(tpk_run_sample(&ctx, tpk_trainable_model(&t), tk, o.prompt, (int)o.sample,
                                       &so, o.seed, out0)))
        goto out;
    if (tpk_ranks_check(&W, W.rank == 0 && !out_ok(), "standard output: cannot write (%s)",
                        strerror(errno)))
        rc = 0;
out:
    tpk_log_close(&ctx, &csv, false);
    free(x), free(y), tpk_tokens_free(&train), tpk_tokens_free(&val), tpk_dp_destroy(&dp_b);
    tpk_tokenizer_free(tk), tpk_zero3_destroy(&ctx, &z3);
    if (up) tpk_adamw_destroy(&ctx, &opt), tpk_trainable_destroy(&ctx, &t);
    if (up) tpk_fp8_destroy(&ctx, &f8), tpk_ctx_destroy(&ctx);
    if (be.world.vt) tpk_comm_destroy(&be.world);
    MPI_Finalize();
    return rc;
}
