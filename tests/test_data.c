/* tests/test_data.c — tpk/train/data.h: llm.c shards written here read back token for token; every
 * malformed shard (short header, bad magic, bad version, a count that disagrees with the file,
 * a token not below the vocabulary, a missing file, a directory) refused with the file named;
 * byte text split 90/10 with the byte-unigram entropy recomputed here; batch windows against
 * llm.c's formula, DP ranks reading disjoint windows, wrap-around; heterogeneous DP micro-batch
 * sizes reading one batch between them; bad arguments. Each rank
 * works on its own files. The loaders' fuzz corpus is replayed through the fuzz target's checks. */
#include "test.h"

#include <sys/stat.h>

#define TPK_FUZZ_NO_MAIN
#include "fuzz/fuzz_data.c"

static int me, np;
static char dir[256];

/* a shard file: header (magic, version, count) and uint16 tokens; count_override < 0: the true
 * count */
static void write_shard(const char *path, int32_t magic, int32_t version, const uint16_t *tok,
                        int n, int count_override, int header_ints) {
    int32_t h[256] = {0};
    h[0] = magic, h[1] = version, h[2] = count_override >= 0 ? count_override : n;
    FILE *f = fopen(path, "wb");
    fwrite(h, 4, (size_t)header_ints, f);
    if (header_ints == 256) fwrite(tok, 2, (size_t)n, f);
    fclose(f);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    snprintf(dir, sizeof dir, "build/tests/data_r%d", me);
    mkdir("build", 0755), mkdir("build/tests", 0755), mkdir(dir, 0755);
    tpk_ctx ctx;
    if (test_host_ctx(&ctx) != TPK_OK) return 1;
    enum { N = 1000, V = 300 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(tpk_rng_uniform(1, 2, (uint64_t)i) * V);
    char path[512];

    TEST_CASE("llm.c shard: written, read back token for token") {
        snprintf(path, sizeof path, "%s/good.bin", dir);
        write_shard(path, 20240520, 1, tok, N, -1, 256);
        tpk_tokens t;
        CHECK_OK(&ctx, tpk_data_load_shard(&ctx, path, V, &t));
        CHECK(t.n == N, "%lld tokens", (long long)t.n);
        int bad = 0;
        for (int i = 0; i < N && t.tok; i++) bad += t.tok[i] != tok[i];
        CHECK(bad == 0, "%d tokens differ", bad);
        tpk_tokens_free(&t);
    }

    TEST_CASE("llm.c shard: every malformed file refused, naming the file") {
        tpk_tokens t;
        snprintf(path, sizeof path, "%s/short.bin", dir);
        write_shard(path, 20240520, 1, tok, N, -1, 100);
        CHECK_FAILS(&ctx, tpk_data_load_shard(&ctx, path, V, &t), TPK_ERR_FORMAT,
                    "short.bin: 400 bytes, shorter than the 1024-byte llm.c header");
        snprintf(path, sizeof path, "%s/magic.bin", dir);
        write_shard(path, 12345, 1, tok, N, -1, 256);
        CHECK_FAILS(&ctx, tpk_data_load_shard(&ctx, path, V, &t), TPK_ERR_FORMAT,
                    "magic.bin: bad magic 0x00003039, expected 0x0134d888");
        snprintf(path, sizeof path, "%s/version.bin", dir);
        write_shard(path, 20240520, 7, tok, N, -1, 256);
        CHECK_FAILS(&ctx, tpk_data_load_shard(&ctx, path, V, &t), TPK_ERR_FORMAT,
                    "version 7, expected 1");
        snprintf(path, sizeof path, "%s/count.bin", dir);
        write_shard(path, 20240520, 1, tok, N, N + 5, 256);
        CHECK_FAILS(&ctx, tpk_data_load_shard(&ctx, path, V, &t), TPK_ERR_FORMAT,
                    "header says 1005 tokens, the file holds 2000 bytes");
        snprintf(path, sizeof path, "%s/good.bin", dir);
        CHECK_FAILS(&ctx, tpk_data_load_shard(&ctx, path, 100, &t), TPK_ERR_FORMAT,
                    "not below the model's vocabulary of 100");
        CHECK(t.tok == NULL && t.n == 0, "a refused shard left tokens behind");
        snprintf(path, sizeof path, "%s/none.bin", dir);
        CHECK_FAILS(&ctx, tpk_data_load_shard(&ctx, path, V, &t), TPK_ERR_IO,
                    "none.bin: cannot open");
        CHECK_FAILS(&ctx, tpk_data_load_shard(&ctx, dir, V, &t), TPK_ERR_IO, "cannot read");
        CHECK_FAILS(&ctx, tpk_data_load_shard(&ctx, NULL, V, &t), TPK_ERR_ARG, "path: NULL");
    }

    TEST_CASE("byte text: 90/10 split, byte-unigram entropy, too short refused") {
        snprintf(path, sizeof path, "%s/text.txt", dir);
        FILE *f = fopen(path, "wb");
        for (int i = 0; i < 5000; i++)
            fputc("abcdefgh\n"[(int)(tpk_rng_uniform(3, 4, (uint64_t)i) * 9)], f);
        fclose(f);
        tpk_tokens tr, va;
        double ent = -1, want = 0, cnt[256] = {0};
        CHECK_OK(&ctx, tpk_data_load_text(&ctx, path, 65, &tr, &va, &ent));
        CHECK(tr.n == 4500 && va.n == 500, "split %lld + %lld", (long long)tr.n, (long long)va.n);
        for (int i = 0; i < tr.n; i++) cnt[tr.tok[i]]++;
        for (int i = 0; i < 256; i++)
            if (cnt[i]) want -= cnt[i] / tr.n * log(cnt[i] / tr.n);
        CHECK(fabs(ent - want) < 1e-12, "entropy %g, recomputed %g", ent, want);
        CHECK(va.tok && va.tok[0] == "abcdefgh\n"[(int)(tpk_rng_uniform(3, 4, 4500) * 9)],
              "the validation split starts at byte 4500");
        tpk_tokens_free(&tr), tpk_tokens_free(&va);
        CHECK_FAILS(&ctx, tpk_data_load_text(&ctx, path, 501, &tr, &va, NULL), TPK_ERR_SHAPE,
                    "text.txt: 5000 bytes, too short for batches of 501 tokens");
        CHECK_FAILS(&ctx, tpk_data_load_text(&ctx, path, 1, &tr, &va, NULL), TPK_ERR_ARG,
                    "span: expected >= 2");
    }

    TEST_CASE(
        "batch windows: llm.c's formula, disjoint across DP ranks, wrap-around, bad arguments") {
        tpk_tokens t = {0};
        t.n = N, t.tok = malloc(sizeof(int32_t) * N);
        for (int i = 0; i < N; i++) t.tok[i] = i;
        enum { B = 3, S = 7 };
        int32_t x[B * S], y[B * S];
        int windows = (N - 1) / (B * S), bad = 0;
        for (int k = 0; k < 40; k++)
            for (int d = 0; d < 3; d++) {
                test_poison((float *)x, B * S), test_poison((float *)y, B * S);
                CHECK_OK(&ctx, tpk_data_batch(&ctx, &t, k, 3, d, B, S, x, y));
                int w = (k * 3 + d) % windows;
                for (int i = 0; i < B * S; i++)
                    bad += x[i] != w * B * S + i || y[i] != w * B * S + i + 1;
            }
        CHECK(bad == 0, "%d tokens differ from window (k dp + d) mod %d", bad, windows);
        CHECK_FAILS(&ctx, tpk_data_batch(&ctx, &t, 0, 2, 2, B, S, x, y), TPK_ERR_ARG,
                    "0 <= d < dp");
        CHECK_FAILS(&ctx, tpk_data_batch(&ctx, &t, 0, 1, 0, 100, 10, x, y), TPK_ERR_SHAPE,
                    "fewer than B x S + 1 = 1001");
        CHECK_FAILS(&ctx, tpk_data_batch(&ctx, &t, 0, 1, 0, B, S, NULL, y), TPK_ERR_ARG,
                    "expected buffers");
        tpk_tokens_free(&t);
    }
    TEST_CASE(
        "heterogeneous DP micro-batches (tpk_data_dp_batches, tpk_data_batch_seq): sizes, offsets, "
        "the group reads one batch; bad lists") {
        tpk_tokens t = {0};
        t.n = N, t.tok = malloc(sizeof(int32_t) * N);
        for (int i = 0; i < N; i++) t.tok[i] = i;
        int64_t Bd, off, Btot;
        CHECK_OK(&ctx, tpk_data_dp_batches(&ctx, NULL, 5, &Bd, &off, &Btot));
        CHECK(Bd == 5 && off == 0 && Btot == 5, "uniform at DP 1: %lld %lld %lld", (long long)Bd,
              (long long)off, (long long)Btot);
        CHECK_OK(&ctx, tpk_data_dp_batches(&ctx, "7", 5, &Bd, &off, &Btot));
        CHECK(Bd == 7 && off == 0 && Btot == 7, "one size at DP 1: %lld", (long long)Bd);
        CHECK_FAILS(&ctx, tpk_data_dp_batches(&ctx, "8,4", 5, &Bd, &off, &Btot), TPK_ERR_ARG,
                    "list \"8,4\": 2 sizes for 1 DP ranks");
        CHECK_FAILS(&ctx, tpk_data_dp_batches(&ctx, "8,", 5, &Bd, &off, &Btot), TPK_ERR_ARG,
                    "expected 1 comma-separated micro-batch sizes");
        CHECK_FAILS(&ctx, tpk_data_dp_batches(&ctx, "-3", 5, &Bd, &off, &Btot), TPK_ERR_ARG,
                    "micro-batch sizes of 1..1000000");
        enum { S = 7 };
        int32_t x[12 * S], y[12 * S], a[12 * S], b[12 * S];
        int bad = 0;
        for (int k = 0; k < 3; k++) { /* sizes 8, 4 at offsets 0, 8 read what one rank of 12
                                         reads */
            CHECK_OK(&ctx, tpk_data_batch(&ctx, &t, k, 1, 0, 12, S, x, y));
            CHECK_OK(&ctx, tpk_data_batch_seq(&ctx, &t, k * 12 + 0, 8, S, a, b));
            CHECK_OK(&ctx, tpk_data_batch_seq(&ctx, &t, k * 12 + 8, 4, S, a + 8 * S, b + 8 * S));
            bad += memcmp(x, a, sizeof x) != 0 || memcmp(y, b, sizeof y) != 0;
            for (int d = 0; d < 3; d++) { /* uniform: the window k dp + d */
                CHECK_OK(&ctx, tpk_data_batch(&ctx, &t, k, 3, d, 4, S, x, y));
                CHECK_OK(&ctx, tpk_data_batch_seq(&ctx, &t, (k * 3 + d) * 4, 4, S, a, b));
                bad += memcmp(x, a, 4 * S * sizeof(int32_t)) != 0;
            }
        }
        CHECK(bad == 0, "%d batches differ", bad);
        CHECK_FAILS(&ctx, tpk_data_batch_seq(&ctx, &t, -1, 4, S, x, y), TPK_ERR_ARG,
                    "q: expected B, S >= 1, q >= 0");
        tpk_tokens_free(&t);
    }
    TEST_CASE("token loaders fuzz corpus replay (tests/fuzz/corpus_data)")
    test_replay_corpus("tests/fuzz/corpus_data", fuzz_data_one, "valid_shard", 5);
    tpk_ctx_destroy(&ctx);
    return test_finish();
}
