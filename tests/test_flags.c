/* tests/test_flags.c — the flag table (tpk/train/flags.h) and the trainer's shared table
 * (tpk/train/options.h), against values and messages written out by hand: every kind parsed into
 * a poisoned options struct (every field set, defaults included), each error's exact message, a
 * usage that lists every flag of a set on lines of at most 100 columns, the same message for the
 * same flag in the trainer's set and the planner's (model and --dtype only: --lr unknown there),
 * the checks of flags together (--micro-batches and --grad-accum, --pp-layers, --tp-weights, the
 * mesh against the world), a family's flags set in its config or refused, and the model's config
 * from the flags. Needs no MPI beyond the harness; each rank runs the same cases. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <tpk/train/options.h>

typedef struct demo {
    const char *name, *mode;
    int64_t count, opt;
    double rate;
    bool fast;
    tpk_flag_list fam;
} demo;

static const tpk_flag demo_flags[] = {
    {"--name", TPK_FLAG_STR, 0, 0, "x", NULL, NULL, 1, "demo", NULL, offsetof(demo, name)},
    {"--mode", TPK_FLAG_CHOICE, 0, 0, NULL, "a|b|c", NULL, 1, "demo", NULL, offsetof(demo, mode)},
    {"--count", TPK_FLAG_INT, 1, 100, "7", NULL, NULL, 1, "demo", "how many",
     offsetof(demo, count)},
    {"--opt", TPK_FLAG_INT, 0, 1, NULL, "0|1", "0 or 1 (on or off)", 2, "other", NULL,
     offsetof(demo, opt)},
    {"--rate", TPK_FLAG_NUM, 0, 0.5, "0.25", NULL, NULL, 1, "demo", NULL, offsetof(demo, rate)},
    {"--fast", TPK_FLAG_BOOL, 0, 0, NULL, NULL, NULL, 1, "demo", NULL, offsetof(demo, fast)},
    {"--fam", TPK_FLAG_LIST, 1, 9, NULL, "N", NULL, 1, "demo", NULL, offsetof(demo, fam)},
};

/* parse argv (NULL-terminated) with mask into *d (poisoned first): the return, message in err */
static int run(unsigned mask, demo *d, char *err, const char **rest, int *nrest, ...) {
    const char *args[32] = {"prog"};
    int argc = 1;
    va_list ap;
    va_start(ap, nrest);
    for (const char *a; argc < 31 && (a = va_arg(ap, const char *));) args[argc++] = a;
    va_end(ap);
    memset(d, 0xA5, sizeof *d);
    err[0] = 0;
    tpk_flag_set set = {demo_flags, (int)(sizeof demo_flags / sizeof demo_flags[0]), mask, d};
    return tpk_flags_parse(&set, 1, argc, (char **)args, rest, nrest, err, 512);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    char err[512];
    demo d;

    TEST_CASE("flags: every kind parsed, defaults set") {
        CHECK(run(3, &d, err, NULL, NULL, "--mode", "b", "--count", "42", "--fast", "--fam", "3",
                  "--fam", "x", "--rate", "0.5", NULL) == 0,
              "%s", err);
        CHECK(!strcmp(d.name, "x") && !strcmp(d.mode, "b"), "name %s mode %s", d.name, d.mode);
        CHECK(d.count == 42 && d.opt == -1 && d.rate == 0.5 && d.fast, "count %lld opt %lld",
              (long long)d.count, (long long)d.opt);
        CHECK(d.fam.n == 2 && !strcmp(d.fam.v[0].flag, "--fam") && !strcmp(d.fam.v[1].value, "x"),
              "fam %d", d.fam.n);
        CHECK(run(3, &d, err, NULL, NULL, NULL) == 0 && d.count == 7 && d.rate == 0.25 && !d.fast &&
                  !d.mode && d.fam.n == 0,
              "defaults: count %lld rate %g", (long long)d.count, d.rate);
        const char *rest[8];
        int nrest = 0;
        CHECK(run(3, &d, err, rest, &nrest, "a.txt", "--count", "3", "b.txt", NULL) == 0 &&
                  nrest == 2 && !strcmp(rest[0], "a.txt") && !strcmp(rest[1], "b.txt"),
              "rest %d", nrest);
        CHECK(run(3, &d, err, NULL, NULL, "--count", "3", "-h", NULL) == -1, "help");
    }

    TEST_CASE("flags: each error's message") {
        struct {
            unsigned mask;
            const char *a, *b, *want;
        } c[] = {
            {3, "--count", "1000",
             "--count: expected an integer in [1, 100], got \"1000\" (out of range)"},
            {3, "--count", "1.5", "--count: expected an integer in [1, 100], got \"1.5\""},
            {3, "--count", "two", "--count: expected an integer in [1, 100], got \"two\""},
            {3, "--rate", "0.6", "--rate: expected a number in [0, 0.5], got \"0.6\""},
            {3, "--mode", "d", "--mode: expected a, b or c, got \"d\""},
            {3, "--opt", "2", "--opt: expected 0 or 1 (on or off), got \"2\""},
            {1, "--opt", "1", "unknown argument \"--opt\" (--help lists them)"},
            {3, "--count", "", "--count: expects a value, got an empty string"},
            {3, "--name", "--fast", "--name: expects a value, got the flag --fast"},
            {3, "--count", NULL, "--count: expects a value"},
            {3, "stray", NULL, "unknown argument \"stray\" (--help lists them)"},
        };
        for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
            int r = run(c[i].mask, &d, err, NULL, NULL, c[i].a, c[i].b, NULL);
            CHECK(r == 1 && !strcmp(err, c[i].want), "case %zu: %d \"%s\", expected \"%s\"", i, r,
                  err, c[i].want);
        }
        char buf[64];
        CHECK(!strcmp(tpk_flags_choices("x|y", buf, sizeof buf), "x or y"), "%s", buf);
    }

    int nt = 0;
    const tpk_flag *table = tpk_run_flags(&nt);
    TEST_CASE("options: the usage lists every flag, lines of at most 100 columns") {
        tpk_run_opts o;
        tpk_flag_set set = {table, nt, TPK_OPT_TRAINER, &o};
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        CHECK(f != NULL, "open_memstream");
        if (f) tpk_flags_usage(f, "usage: train\n", &set, 1), fclose(f);
        for (int i = 0; text && i < nt; i++) {
            char want[80];
            snprintf(want, sizeof want, " %s", table[i].name);
            CHECK(strstr(text, want) != NULL, "%s not in the usage", table[i].name);
        }
        CHECK(text && strstr(text, " --beta1 0.9") && strstr(text, " --beta2 0.95"), "betas");
        for (char *l = text; l && *l;) {
            size_t n = strcspn(l, "\n");
            CHECK(n <= 100, "a line of %zu columns: %.60s", n, l);
            l += n + (l[n] ? 1 : 0);
        }
        free(text);
    }

    TEST_CASE("options: one message for a flag in the trainer's set and the planner's") {
        tpk_run_opts a, b;
        char e1[256] = "", e2[256] = "";
        const char *args[] = {"p", "--layers", "0"};
        tpk_flag_set tr = {table, nt, TPK_OPT_TRAINER, &a};
        tpk_flag_set pl = {table, nt, TPK_OPT_MODEL | TPK_OPT_DTYPE, &b};
        CHECK(tpk_flags_parse(&tr, 1, 3, (char **)args, NULL, NULL, e1, sizeof e1) == 1 &&
                  tpk_flags_parse(&pl, 1, 3, (char **)args, NULL, NULL, e2, sizeof e2) == 1 &&
                  !strcmp(e1, e2) &&
                  !strcmp(
                      e1,
                      "--layers: expected an integer in [1, 1000000000], got \"0\" (out of range)"),
              "\"%s\" vs \"%s\"", e1, e2);
        const char *lr[] = {"p", "--lr", "0.1"};
        CHECK(tpk_flags_parse(&pl, 1, 3, (char **)lr, NULL, NULL, e2, sizeof e2) == 1 &&
                  !strcmp(e2, "unknown argument \"--lr\" (--help lists them)"),
              "%s", e2);
        const char *kv[] = {"p", "--kv-heads", "2", "--dtype", "bf16"};
        CHECK(tpk_flags_parse(&pl, 1, 5, (char **)kv, NULL, NULL, e2, sizeof e2) == 0 &&
                  b.fam.n == 1 && !strcmp(b.fam.v[0].flag, "--kv-heads") &&
                  !strcmp(b.dtype, "bf16"),
              "%s", e2);
    }

    TEST_CASE("options: flags together") {
        tpk_run_opts o;
        char e[512] = "";
        const char *a1[] = {"t", "--text", "f", "--micro-batches", "4", "--grad-accum", "2"};
        CHECK(tpk_run_parse(&o, 7, (char **)a1, 2, e, sizeof e) == 1 &&
                  !strcmp(e, "--micro-batches 4 and --grad-accum 2: the same count, give one"),
              "%s", e);
        const char *a2[] = {"t",          "--text",      "f",           "--pp",   "2",
                            "--schedule", "interleaved", "--pp-layers", "1,2,3,4"};
        CHECK(tpk_run_parse(&o, 9, (char **)a2, 4, e, sizeof e) == 0 && o.piped && o.vstages == 2 &&
                  o.nppl == 4 && o.ppl[0] == 1 && o.ppl[3] == 4 && o.kind == TPK_PIPE_INTERLEAVED &&
                  o.steps == 100 && !o.steps_given,
              "%s", e);
        const char *a3[] = {"t", "--text", "f", "--tp", "2", "--tp-weights", "3,1"};
        CHECK(tpk_run_parse(&o, 7, (char **)a3, 2, e, sizeof e) == 0 && o.tw[0] == 3 &&
                  o.tw[1] == 1,
              "%s", e);
        CHECK(tpk_run_parse(&o, 7, (char **)a3, 3, e, sizeof e) == 1 &&
                  !strcmp(e, "--tp 2 does not divide the 3 ranks"),
              "%s", e);
        const char *a4[] = {"t", "--text", "f", "--zero", "1", "--tp", "2"};
        CHECK(tpk_run_parse(&o, 7, (char **)a4, 2, e, sizeof e) == 1 &&
                  strstr(e, "--zero 1: shards the optimizer over data parallelism, but there is 1 "
                            "DP rank (2 ranks / --tp 2)"),
              "%s", e);
        const char *a5[] = {"t", "--load", "d"};
        CHECK(tpk_run_parse(&o, 3, (char **)a5, 1, e, sizeof e) == 1 &&
                  strstr(e, "--load DIR alone can only --sample N"),
              "%s", e);
        CHECK(tpk_run_parse(&o, 1, (char **)a5, 1, e, sizeof e) == 1 &&
                  !strcmp(e, "no arguments: --help lists the options"),
              "%s", e);
    }

    TEST_CASE("options: a family's flags and the model's config") {
        tpk_ctx ctx;
        memset(&ctx, 0, sizeof ctx);
        tpk_run_opts o;
        tpk_model_config cfg;
        char e[512] = "";
        int64_t def[4] = {256, 4, 128, 4}, S = -1;
        const char *a1[] = {"t", "--text",   "f", "--arch",    "llama", "--kv-heads",
                            "2", "--layers", "3", "--seq-len", "32"};
        CHECK(tpk_run_parse(&o, 11, (char **)a1, 1, e, sizeof e) == 0, "%s", e);
        memset(&cfg, 0xA5, sizeof cfg);
        CHECK(tpk_run_model_config(&ctx, &o, def, 64, &cfg, &S, e, sizeof e) == TPK_OK, "%s", e);
        CHECK(cfg.arch == TPK_ARCH_LLAMA && cfg.llama.kv_heads == 2 && cfg.llama.layers == 3 &&
                  cfg.llama.hidden == 128 && cfg.llama.vocab == 256 && cfg.llama.positions == 32 &&
                  S == 32 && tpk_run_config_vocab(&cfg) == 256,
              "arch %d G %lld L %lld P %lld S %lld", (int)cfg.arch, (long long)cfg.llama.kv_heads,
              (long long)cfg.llama.layers, (long long)cfg.llama.positions, (long long)S);
        const char *a2[] = {"t", "--text", "f", "--kv-heads", "2"};
        CHECK(tpk_run_parse(&o, 5, (char **)a2, 1, e, sizeof e) == 0, "%s", e);
        CHECK(tpk_run_model_config(&ctx, &o, def, 64, &cfg, &S, e, sizeof e) == TPK_ERR_ARG &&
                  !strcmp(e, "--kv-heads: applies to --arch llama or mixtral or qwen2_moe only "
                             "(the model is gpt2)"),
              "%s", e);
        const char *a3[] = {"t", "--text", "f", "--arch", "neox", "--rotary-pct", "2"};
        CHECK(tpk_run_parse(&o, 7, (char **)a3, 1, e, sizeof e) == 0, "%s", e);
        CHECK(tpk_run_model_config(&ctx, &o, def, 64, &cfg, &S, e, sizeof e) == TPK_ERR_ARG &&
                  !strcmp(e, "--rotary-pct: expected a number in [1e-06, 1], got \"2\""),
              "%s", e);
        const char *a4[] = {"t", "--text", "f", "--positions", "16", "--seq-len", "32"};
        CHECK(tpk_run_parse(&o, 7, (char **)a4, 1, e, sizeof e) == 0, "%s", e);
        CHECK(tpk_run_model_config(&ctx, &o, def, 64, &cfg, &S, e, sizeof e) == TPK_ERR_ARG &&
                  !strcmp(e, "--seq-len 32 is longer than the model's 16 positions"),
              "%s", e);
        const char *a5[] = {"t", "--text", "f", "--arch", "llama", "--dropout", "0.1"};
        CHECK(tpk_run_parse(&o, 7, (char **)a5, 1, e, sizeof e) == 0, "%s", e);
        CHECK(tpk_run_model_config(&ctx, &o, def, 64, &cfg, &S, e, sizeof e) == TPK_ERR_ARG &&
                  !strcmp(e, "--dropout: the Llama model has no dropout"),
              "%s", e);
    }
    return test_finish();
}
