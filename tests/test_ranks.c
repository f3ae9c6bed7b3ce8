/* tests/test_ranks.c — the ranks' agreement and digests (tpk/train/ranks.h): the digest against
 * FNV-1a written out over little-endian 8-byte words and the tail's bytes (every length 0..40 of
 * random bytes; one changed byte always changes it); a file's digest as its bytes' and length's;
 * agreement true only when every rank says so (the last rank failing alone); the same arguments,
 * checkpoint files and data on every rank, and each kind of difference found and named (a
 * checkpoint's list of files, a file's bytes, the training or the validation tokens) when the last
 * rank's differ; TPK_TIMEOUT read or refused. Run at 1 to 4 ranks (differences from 2). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <tpk/train/ranks.h>

/* FNV-1a over words, written out: word i is bytes 8i..8i+7, least significant first */
static uint64_t ref_digest(const unsigned char *b, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = 0;
        for (int j = 7; j >= 0; j--) w = (w << 8) | b[i + (size_t)j];
        h = (h ^ w) * 0x100000001b3ull;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) fputs(text, f), fclose(f);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    int me = test__rank, np = test__size;
    bool last = me == np - 1 && np > 1; /* the rank that differs */
    tpk_ranks r;
    unsetenv("TPK_TIMEOUT");
    CHECK(tpk_ranks_init(&r, "test") && r.rank == me && r.size == np && r.timeout == 600,
          "init: %s", r.msg);

    TEST_CASE("ranks: the digest is FNV-1a over words, a changed byte changes it") {
        unsigned char b[40];
        for (size_t n = 0; n <= sizeof b; n++) {
            for (size_t i = 0; i < n; i++)
                b[i] = (unsigned char)(256 * test_dropout_u(7, n, (uint64_t)i));
            uint64_t h = tpk_digest(TPK_DIGEST0, b, n);
            CHECK(h == ref_digest(b, n), "n %zu: %llx vs %llx", n, (unsigned long long)h,
                  (unsigned long long)ref_digest(b, n));
            for (size_t i = 0; i < n; i++) {
                b[i] ^= 0x40;
                CHECK(tpk_digest(TPK_DIGEST0, b, n) != h, "n %zu: byte %zu changed, same", n, i);
                b[i] ^= 0x40;
            }
        }
        char path[200];
        snprintf(path, sizeof path, "build/tests/ranks_np%d_file%d", np, me);
        if (me == 0) (void)system("mkdir -p build/tests");
        MPI_Barrier(MPI_COMM_WORLD);
        write_file(path, "checkpoint bytes, 33 of them....");
        size_t len = 32;
        uint64_t want =
            tpk_digest(ref_digest((const unsigned char *)"checkpoint bytes, 33 of them....", 32),
                       &len, sizeof len);
        CHECK(tpk_file_digest(path) == want, "file digest");
        remove(path);
        CHECK(tpk_file_digest(path) == 0, "a missing file's digest: 0");
    }

    TEST_CASE("ranks: agreement, the same arguments") {
        CHECK(tpk_ranks_agree(&r, true, NULL), "all ok");
        CHECK(!tpk_ranks_agree(&r, !last, "the last rank fails") == (np > 1), "one fails");
        CHECK(tpk_ranks_check(&r, false, "never %d", 1), "a check that holds");
        CHECK(!tpk_ranks_check(&r, last, "rank %d differs", me) == (np > 1), "a check that fails");
        tpk_ctx e;
        memset(&e, 0, sizeof e);
        CHECK(!tpk_ranks_ok(&r, &e, last ? tpk_fail(&e, TPK_ERR_IO, "f", "bad") : TPK_OK) ==
                  (np > 1),
              "a status");
        CHECK(!last || !strcmp(r.msg, "f: bad (TPK_ERR_IO)"), "its message: %s", r.msg);
        const char *a[] = {"prog", "--text", "x"}, *b[] = {"prog", "--text", "y"};
        CHECK(tpk_ranks_same_args(&r, 3, (char **)a), "same arguments");
        CHECK(!tpk_ranks_same_args(&r, 3, (char **)(last ? b : a)) == (np > 1),
              "different arguments");
        CHECK(np == 1 || strstr(r.msg, "different configurations"), "%s", r.msg);
        uint64_t h[2] = {1, (uint64_t)(last ? 3 : 2)};
        CHECK(tpk_ranks_same(&r, h, 1) && tpk_ranks_same(&r, h, 2) == (np == 1), "same");
    }

    TEST_CASE("ranks: the same checkpoint files and data") {
        char base[64], dir[100], path[160], cmd[200];
        snprintf(base, sizeof base, "build/tests/ranks_np%d", np);
        if (me == 0) snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", base, base);
        if (me == 0) (void)system(cmd);
        MPI_Barrier(MPI_COMM_WORLD);
        snprintf(dir, sizeof dir, "%s/ck%d", base, me);
        snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
        (void)system(cmd);
        snprintf(path, sizeof path, "%s/config.json", dir);
        write_file(path, "{\"n_layer\": 2}");
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        write_file(path, "weights");
        snprintf(path, sizeof path, "%s/README.md", dir); /* not compared */
        write_file(path, last ? "mine" : "theirs");
        CHECK(tpk_ranks_same_checkpoint(&r, dir), "the same files: %s", r.msg);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (last) write_file(path, "weightz");
        CHECK(!tpk_ranks_same_checkpoint(&r, dir) == (np > 1), "a file's bytes differ");
        CHECK(np == 1 || (strstr(r.msg, "the ranks read different contents from") &&
                          strstr(r.msg, "model.safetensors")),
              "%s", r.msg);
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        if (last) write_file(path, "moments");
        CHECK(!tpk_ranks_same_checkpoint(&r, dir) == (np > 1), "the lists differ");
        CHECK(np == 1 || strstr(r.msg, "different checkpoint files in --load"), "%s", r.msg);

        int32_t t1[5] = {1, 2, 3, 4, 5}, v1[3] = {7, 8, 9};
        tpk_tokens train = {0}, val = {0};
        train.tok = t1, train.n = 5, val.tok = v1, val.n = 3;
        CHECK(tpk_ranks_same_data(&r, &train, &val, NULL, "a.bin", "b.bin"), "same data");
        if (last) v1[2] = 10;
        CHECK(!tpk_ranks_same_data(&r, &train, &val, NULL, "a.bin", "b.bin") == (np > 1),
              "validation differs");
        CHECK(np == 1 || strstr(r.msg, "different contents from b.bin (--val-data)"), "%s", r.msg);
        if (last) t1[0] = 0;
        CHECK(!tpk_ranks_same_data(&r, &train, &val, "t.txt", NULL, NULL) == (np > 1),
              "training differs");
        CHECK(np == 1 || strstr(r.msg, "different contents from t.txt (--text)"), "%s", r.msg);
        MPI_Barrier(MPI_COMM_WORLD);
        if (me == 0) snprintf(cmd, sizeof cmd, "rm -rf %s", base), (void)system(cmd);
    }

    TEST_CASE("ranks: TPK_TIMEOUT read or refused") {
        tpk_ranks q;
        setenv("TPK_TIMEOUT", "30", 1);
        CHECK(tpk_ranks_init(&q, "t") && q.timeout == 30, "30: %g %s", q.timeout, q.msg);
        setenv("TPK_TIMEOUT", "soon", 1);
        CHECK(!tpk_ranks_init(&q, "t") && strstr(q.msg, "TPK_TIMEOUT") && q.timeout == 600,
              "soon: %s", q.msg);
        unsetenv("TPK_TIMEOUT");
    }
    return test_finish();
}
