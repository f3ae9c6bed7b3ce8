/* tests/test_ckpt_folder.c — a trainer's checkpoint folder (tpk/train/ckpt_folder.h), each rank in
 * folders of its own: the --save probe makes the parents and leaves no file, and fails under a
 * regular file with the path and the reason; it refuses DIR, DIR.tpk-old or DIR.tpk-new as a
 * symbolic link (the folder linked to keeps every file), a stopped save's leftovers the save
 * would refuse, and a folder another live run holds the lock of (DIR.tpk-lock: a dead process's
 * lock taken over, another host's refused, released by tpk_ckpt_unlock); a repair or remove
 * through a link refused, the target untouched; --keep 2 over this run's step-1..5 leaves step-4
 * and step-5 and every other name (step-03, step-x, a README, a step-6 with no checkpoint id, a
 * step-7 there before the probe, a step-8 that is a link); the tokenizer's files copied from a
 * folder
 * (tokenizer.json; vocab.json and merges.txt) or a file, a checkpoint's own never replaced; the
 * resume note of a checkpoint with and without optim.safetensors, and none at step 0. The
 * expected names and lines are written out by hand. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <sys/stat.h>
#include <sys/wait.h>
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

    TEST_CASE("ckpt folder: links refused, a user's folder elsewhere untouched") {
        char user[200], link[200], lp[240];
        snprintf(user, sizeof user, "%s/user", base);
        sh("mkdir -p %s", user);
        put(user, "config.json", "{\"mine\": 1}");
        put(user, "model.safetensors", "mine");
        put(user, "notes.txt", "mine");
        const char *sfx[3] = {"", ".tpk-old", ".tpk-new"};
        for (int k = 0; k < 3; k++) {
            snprintf(link, sizeof link, "%s/ln%d", base, k);
            snprintf(lp, sizeof lp, "%s%s", link, sfx[k]);
            CHECK(symlink("user", lp) == 0, "symlink %s", lp);
            bool refused = !tpk_ckpt_probe(link, err, sizeof err);
            CHECK(refused && strstr(err, lp) && strstr(err, "is a symbolic link"),
                  "--save %s with %s a link: %s", link, lp, refused ? err : "accepted");
            CHECK(tpk_ckpt_repair(&ctx, link) == TPK_ERR_IO &&
                      strstr(tpk_last_error(&ctx), "a symbolic link"),
                  "repair through %s refused: %s", lp, tpk_last_error(&ctx));
        }
        CHECK(tpk_ckpt_remove(&ctx, link) == TPK_OK, "ln2 is no link: nothing to remove");
        snprintf(link, sizeof link, "%s/ln0", base);
        CHECK(tpk_ckpt_remove(&ctx, link) == TPK_ERR_IO &&
                  strstr(tpk_last_error(&ctx), "a symbolic link"),
              "remove through a link refused: %s", tpk_last_error(&ctx));
        CHECK(same_text(user, "config.json", "{\"mine\": 1}") &&
                  same_text(user, "model.safetensors", "mine") &&
                  same_text(user, "notes.txt", "mine"),
              "the user's folder keeps every file");
    }

    TEST_CASE("ckpt folder: a stopped save's leftovers checked before training") {
        char d[200], side[220];
        snprintf(d, sizeof d, "%s/left", base);
        snprintf(side, sizeof side, "%s.tpk-new", d);
        sh("mkdir -p %s", side);
        put(side, "model.safetensors", "half");
        put(side, "mine.txt", "mine");
        CHECK(!tpk_ckpt_probe(d, err, sizeof err) && strstr(err, side) &&
                  strstr(err, "holds mine.txt, which is not a checkpoint's"),
              "DIR.tpk-new with a user's file: %s", err);
        CHECK(has(side, "mine.txt") && has(side, "model.safetensors"), "DIR.tpk-new untouched");
        sh("rm -rf %s.tpk-new", d);
        snprintf(side, sizeof side, "%s.tpk-old", d);
        sh("mkdir -p %s", side);
        put(side, "README.md", "old");
        sh("mkdir -p %s", d);
        put(d, "README.md", "new");
        CHECK(!tpk_ckpt_probe(d, err, sizeof err) && strstr(err, side) &&
                  strstr(err, "holds README.md, which the checkpoint beside it has too"),
              "DIR.tpk-old holding DIR's README.md: %s", err);
        snprintf(side, sizeof side, "%s.tpk-lock", d);
        CHECK(!has(base, "left.tpk-lock"), "no lock left by a refused probe");
        sh("rm -rf %s.tpk-old", d);
        CHECK(tpk_ckpt_probe(d, err, sizeof err), "then accepted: %s", err);
        CHECK(tpk_ckpt_unlock(d) && !has(base, "left.tpk-lock"), "unlocked");
    }

    TEST_CASE("ckpt folder: the lock DIR.tpk-lock") {
        char d[200], lock[220], host[256] = "", text[400];
        snprintf(d, sizeof d, "%s/locked", base);
        snprintf(lock, sizeof lock, "%s.tpk-lock", d);
        CHECK(tpk_ckpt_probe(d, err, sizeof err), "%s", err);
        gethostname(host, sizeof host - 1);
        snprintf(text, sizeof text, "tpk-lock host %s pid %ld start ", host, (long)getpid());
        CHECK(has(base, "locked.tpk-lock"), "the lock made");
        FILE *f = fopen(lock, "r");
        char got[400] = "";
        if (f) (void)!fgets(got, sizeof got, f), fclose(f);
        CHECK(!strncmp(got, text, strlen(text)), "the lock says host and pid: %s", got);
        CHECK(tpk_ckpt_probe(d, err, sizeof err), "the same process again: %s", err);
        CHECK(tpk_ckpt_unlock(d) && !has(base, "locked.tpk-lock"), "released");
        pid_t live = getppid(); /* alive while this test runs */
        snprintf(text, sizeof text, "tpk-lock host %s pid %ld start 0\n", host, (long)live);
        put(base, "locked.tpk-lock", text);
        CHECK(!tpk_ckpt_probe(d, err, sizeof err) && strstr(err, "in use by another run") &&
                  strstr(err, lock),
              "a live process's lock refused: %s", err);
        CHECK(same_text(base, "locked.tpk-lock", text), "its lock untouched");
        put(base, "locked.tpk-lock", "tpk-lock host another-host-name pid 1 start 5\n");
        CHECK(!tpk_ckpt_probe(d, err, sizeof err) && strstr(err, "another-host-name"),
              "another host's lock refused: %s", err);
        pid_t dead = fork(); /* a process that has ended: its PID free */
        if (dead == 0) _exit(0);
        waitpid(dead, NULL, 0);
        snprintf(text, sizeof text, "tpk-lock host %s pid %ld start 7\n", host, (long)dead);
        put(base, "locked.tpk-lock", text);
        CHECK(tpk_ckpt_probe(d, err, sizeof err), "a dead process's lock taken over: %s", err);
        f = fopen(lock, "r"), got[0] = 0;
        if (f) (void)!fgets(got, sizeof got, f), fclose(f);
        snprintf(text, sizeof text, "tpk-lock host %s pid %ld start ", host, (long)getpid());
        CHECK(!strncmp(got, text, strlen(text)), "now this process's: %s", got);
        CHECK(tpk_ckpt_unlock(d) && !has(base, "locked.tpk-lock"), "released");
    }

    TEST_CASE("ckpt folder: --keep 2 leaves the newest two step-K and every other name") {
        snprintf(p, sizeof p, "%s/keep", base);
        sh("mkdir -p %s/step-7 %s/other", p);
        char d[300];
        snprintf(d, sizeof d, "%s/step-7", p); /* another run's, there before the probe */
        put(d, "config.json", "{\"tpk_checkpoint_id\": \"00000000000000aa\"}");
        put(d, "model.safetensors", "theirs");
        snprintf(d, sizeof d, "%s/other", p); /* a user's folder a step-8 link points to */
        put(d, "config.json", "{\"tpk_checkpoint_id\": \"00000000000000bb\"}");
        put(d, "model.safetensors", "mine");
        snprintf(d, sizeof d, "%s/step-8", p);
        CHECK(symlink("other", d) == 0, "symlink step-8");
        CHECK(!tpk_ckpt_probe(p, err, sizeof err) && strstr(err, "step-8 is a symbolic link"),
              "a step-K link refused before training: %s", err);
        remove(d);
        CHECK(tpk_ckpt_probe(p, err, sizeof err), "%s", err);
        CHECK(symlink("other", d) == 0, "symlink step-8 (made during the run)");
        const char *dirs[] = {"step-1", "step-2", "step-3", "step-4", "step-5",
                              "step-03", "step-x", "step-6", "step-7", "step-8"};
        static char id[12100]; /* step-1's config.json 12 kB long, its id at the end */
        for (int i = 0; i < 8; i++) { /* this run's saves, then a step-6 of no checkpoint */
            snprintf(d, sizeof d, "%s/%s", p, dirs[i]);
            sh("mkdir -p %s", d);
            int k = snprintf(id, sizeof id, "{\"pad\": \""), pad = i ? 1 : 12000;
            memset(id + k, 'x', (size_t)pad);
            snprintf(id + k + pad, sizeof id - (size_t)(k + pad),
                     "\", \"tpk_checkpoint_id\": \"%016x\"}", 0x100 + i);
            put(d, "config.json", i == 7 ? "{}" : id);
            put(d, "model.safetensors", "w");
        }
        put(p, "README.md", "mine");
        CHECK_OK(&ctx, tpk_ckpt_keep_last(&ctx, p, 2));
        bool want[10] = {false, false, false, true, true, true, true, true, true, true};
        for (int i = 0; i < 10; i++)
            CHECK(has(p, dirs[i]) == want[i], "%s: %s", dirs[i], want[i] ? "kept" : "removed");
        CHECK(has(p, "README.md"), "README kept");
        snprintf(d, sizeof d, "%s/other", p);
        CHECK(same_text(d, "model.safetensors", "mine"), "the linked folder untouched");
        snprintf(d, sizeof d, "%s/step-7", p);
        CHECK(same_text(d, "model.safetensors", "theirs"), "another run's step-7 untouched");
        CHECK(tpk_ckpt_unlock(p), "unlocked");
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
