/* tests/test_ckpt_folder.c — a trainer's checkpoint folder (tpk/train/ckpt_folder.h), each rank in
 * folders of its own: the --save probe makes the parents and leaves no file, and fails under a
 * regular file with the path and the reason; --keep 2 over step-1..5 leaves step-4 and step-5 and
 * every other name (step-03, step-x, a README); the tokenizer's files copied from a folder
 * (tokenizer.json; vocab.json and merges.txt) or a file, a checkpoint's own never replaced; the
 * resume note of a checkpoint with and without optim.safetensors, and none at step 0. The
 * expected names and lines are written out by hand. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <sys/stat.h>
#include <tpk/train/ckpt_folder.h>
#include <tpk/train/model.h>

static void put(const char *dir, const char *name, const char *text) {
    char p[300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (f) fputs(text, f), fclose(f);
}
static bool has(const char *dir, const char *name) {
    char p[300];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}
static bool same_text(const char *dir, const char *name, const char *text) {
    char p[300], b[200] = "";
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    size_t n = f ? fread(b, 1, sizeof b - 1, f) : 0;
    if (f) fclose(f);
    b[n] = 0;
    return !strcmp(b, text);
}
static void sh(const char *fmt, const char *a) {
    char c[400];
    snprintf(c, sizeof c, fmt, a, a, a);
    (void)system(c);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    char base[100], p[200], err[600];
    snprintf(base, sizeof base, "build/tests/ckpt_folder_np%d_r%d", test__size, test__rank);
    sh("rm -rf %s && mkdir -p %s", base);
    tpk_ctx ctx;
    memset(&ctx, 0, sizeof ctx);

    TEST_CASE("ckpt folder: the --save probe") {
        snprintf(p, sizeof p, "%s/deep/er/ck", base);
        CHECK(tpk_ckpt_probe(p, err, sizeof err), "%s", err);
        DIR *d = opendir(p);
        int entries = 0;
        for (struct dirent *e; d && (e = readdir(d));) entries += e->d_name[0] != '.';
        if (d) closedir(d);
        CHECK(d && entries == 0, "made, empty: %d entries", entries);
        put(base, "plainfile", "x");
        snprintf(p, sizeof p, "%s/plainfile/sub/ck", base);
        char want[300];
        snprintf(want, sizeof want, "--save: cannot create %s/plainfile/sub (Not a directory)",
                 base);
        CHECK(!tpk_ckpt_probe(p, err, sizeof err) && !strcmp(err, want), "%s", err);
    }

    TEST_CASE("ckpt folder: --keep 2 leaves the newest two step-K and every other name") {
        snprintf(p, sizeof p, "%s/keep", base);
        sh("mkdir -p %s", p);
        const char *dirs[] = {"step-1", "step-2",  "step-3", "step-4",
                              "step-5", "step-03", "step-x"};
        for (int i = 0; i < 7; i++) {
            char d[300];
            snprintf(d, sizeof d, "%s/%s", p, dirs[i]);
            sh("mkdir -p %s", d);
            put(d, "config.json", "{}");
            put(d, "model.safetensors", "w");
        }
        put(p, "README.md", "mine");
        CHECK_OK(&ctx, tpk_ckpt_keep_last(&ctx, p, 2));
        bool want[7] = {false, false, false, true, true, true, true};
        for (int i = 0; i < 7; i++)
            CHECK(has(p, dirs[i]) == want[i], "%s: %s", dirs[i], want[i] ? "kept" : "removed");
        CHECK(has(p, "README.md"), "README kept");
        CHECK(tpk_ckpt_keep_last(&ctx, p, 0) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&ctx), "keep: expected >= 1"),
              "%s", tpk_last_error(&ctx));
        char sub[100];
        CHECK(!strcmp(tpk_ckpt_step_dir(sub, sizeof sub, "ck", 12), "ck/step-12"), "%s", sub);
    }

    TEST_CASE("ckpt folder: the tokenizer's files copied beside the model") {
        char tj[120], vm[120], to[120];
        snprintf(tj, sizeof tj, "%s/tj", base), snprintf(vm, sizeof vm, "%s/vm", base);
        snprintf(to, sizeof to, "%s/to", base);
        sh("mkdir -p %s", tj), sh("mkdir -p %s", vm), sh("mkdir -p %s", to);
        put(tj, "tokenizer.json", "{\"model\": 1}");
        put(vm, "vocab.json", "{\"a\": 0}"), put(vm, "merges.txt", "#v\na b\n");
        CHECK_OK(&ctx, tpk_ckpt_copy_tokenizer(&ctx, tj, to));
        CHECK(same_text(to, "tokenizer.json", "{\"model\": 1}") && !has(to, "vocab.json"),
              "tokenizer.json");
        CHECK_OK(&ctx, tpk_ckpt_copy_tokenizer(&ctx, vm, to));
        CHECK(same_text(to, "vocab.json", "{\"a\": 0}") && same_text(to, "merges.txt", "#v\na b\n"),
              "vocab.json and merges.txt");
        put(to, "tokenizer.json", "own");
        snprintf(p, sizeof p, "%s/tokenizer.json", tj);
        CHECK_OK(&ctx, tpk_ckpt_copy_tokenizer(&ctx, p, to));
        CHECK(same_text(to, "tokenizer.json", "own"), "the checkpoint's own kept");
        snprintf(p, sizeof p, "%s/none", base);
        CHECK(tpk_ckpt_copy_tokenizer(&ctx, p, p) == TPK_ERR_IO, "a missing source");
    }

    TEST_CASE("ckpt folder: what a resume says") {
        tpk_ctx c;
        tpk_comm self = tpk_comm_self(false);
        tpk_model m;
        tpk_adamw opt = {0};
        tpk_model_config mc;
        memset(&mc, 0, sizeof mc);
        mc.arch = TPK_ARCH_GPT2, mc.gpt2.vocab = 11, mc.gpt2.positions = 4, mc.gpt2.layers = 1;
        mc.gpt2.hidden = 8, mc.gpt2.heads = 2;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &self, .seed = 3}));
        CHECK_OK(&c, tpk_model_init(&c, &m, &mc));
        CHECK_OK(&c, tpk_adamw_init(&c, &opt, &(tpk_adamw_desc){.b1 = 0.9f}));
        char a[120], b[120];
        snprintf(a, sizeof a, "%s/no_optim", base), snprintf(b, sizeof b, "%s/with_optim", base);
        CHECK_OK(&c, tpk_model_save(&c, &m, NULL, a, &(tpk_hf_save_desc){.step = 5, .seed = 3}));
        CHECK_OK(&c, tpk_model_save(&c, &m, &opt, b, &(tpk_hf_save_desc){.step = 5, .seed = 3}));
        char *text = NULL, want[800];
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        CHECK_OK(&c, tpk_ckpt_resume_note(&c, a, 5, true, f));
        CHECK_OK(&c, tpk_ckpt_resume_note(&c, b, 5, true, f));
        CHECK_OK(&c, tpk_ckpt_resume_note(&c, a, 5, false, f));
        CHECK_OK(&c, tpk_ckpt_resume_note(&c, a, 0, true, f));
        fclose(f);
        snprintf(want, sizeof want,
                 "resumed from %s at step 5\noptimizer state starts fresh at step 5 (%s has no "
                 "optim.safetensors)\nresumed from %s at step 5\nresumed from %s at step 5\n",
                 a, a, b, a);
        CHECK(text && !strcmp(text, want), "got:\n%s", text ? text : "");
        free(text);
        tpk_adamw_destroy(&c, &opt), tpk_model_destroy(&c, &m), tpk_ctx_destroy(&c);
    }
    sh("rm -rf %s", base);
    return test_finish();
}
