/* tests/fuzz/fuzz_config.c — fuzz target for tpk/train/hf.h's readers of config.json and the
 * shard index, on tpk/text/json.h (the kit's one JSON reader, strict). Each input is given to
 *   tpk_gpt2_config_parse   GPT-2's config.json
 *   tpk_llama_config_parse  Llama's config.json
 *   tpk_neox_config_parse   GPT-NeoX's config.json
 *   tpk__hf_index           model.safetensors.index.json's weight_map (it reads a directory: the
 *                           input is written to the index file of a directory of this process's
 *                           own under $TMPDIR, else /tmp, removed at exit; it reads the file back
 *                           into a buffer of at least 64 KiB, so ASan sees only reads past that)
 * Whatever the bytes, each must return a status without crashing or reading outside them; a
 * refusal is TPK_ERR_FORMAT (the Llama and GPT-NeoX parsers: or TPK_ERR_UNSUPPORTED, for a value
 * it names)
 * with a message naming the input and, for a syntax error, a byte offset inside it, and the index
 * reader leaves nothing allocated; an acceptance gives a plausible configuration (positive sizes,
 * hidden a multiple of heads; Llama: an even head size, kv_heads dividing heads; GPT-NeoX: a
 * rotated fraction in (0, 1] that rotates a pair, an activation it has) or a weight map
 * whose every tensor names one of its files, each a ".safetensors" name in the same directory.
 * A broken promise aborts (a crash to the fuzzer).
 *   make fuzz                      libFuzzer + ASan + UBSan, each target for FUZZ_SECONDS (clang)
 * tests/test_hf.c includes this file (TPK_FUZZ_NO_MAIN) to replay tests/fuzz/corpus_config in
 * `make test` through all three: files named valid_* must parse as GPT-2 configs, bad_* must be
 * refused as such. */
#include <tpk/train/hf.h>

static tpk_status fuzz_llama_one(const uint8_t *data, size_t size) {
    static const char prefix[] = "tpk_llama_config_parse: input: ";
    tpk_ctx ctx;
    tpk_llama_config c;
    memset(&ctx, 0, sizeof ctx), memset(&c, 0, sizeof c);
    tpk_status s = tpk_llama_config_parse(&ctx, data, size, "input", &c);
    if (s != TPK_OK) {
        if ((s != TPK_ERR_FORMAT && s != TPK_ERR_UNSUPPORTED) ||
            strncmp(ctx.err, prefix, sizeof prefix - 1))
            abort();
        const char *rest = ctx.err + sizeof prefix - 1; /* a syntax error: "byte N: expected ..." */
        if (s == TPK_ERR_FORMAT && !strncmp(rest, "byte ", 5) &&
            strtoull(rest + 5, NULL, 10) > size)
            abort();
        return s;
    }
    if (c.layers < 1 || c.hidden < 1 || c.heads < 1 || c.kv_heads < 1 || c.vocab < 1 ||
        c.positions < 1 || c.ffn < 1 || c.heads > c.hidden || c.hidden % c.heads ||
        (c.hidden / c.heads) % 2 || c.heads % c.kv_heads || !(c.norm_eps > 0 && c.norm_eps <= 1) ||
        !(c.rope_theta >= 1 && isfinite(c.rope_theta)))
        abort();
    return s;
}

/* A syntax error's byte offset, where the message has one, lies inside the input. */
static void fuzz__offset_inside(const char *rest, size_t size) {
    if (!strncmp(rest, "byte ", 5) && strtoull(rest + 5, NULL, 10) > size) abort();
}

static tpk_status fuzz_neox_one(const uint8_t *data, size_t size) {
    static const char prefix[] = "tpk_neox_config_parse: input: ";
    tpk_ctx ctx;
    tpk_neox_config c;
    memset(&ctx, 0, sizeof ctx), memset(&c, 0, sizeof c);
    tpk_status s = tpk_neox_config_parse(&ctx, data, size, "input", &c);
    if (s != TPK_OK) {
        if ((s != TPK_ERR_FORMAT && s != TPK_ERR_UNSUPPORTED) ||
            strncmp(ctx.err, prefix, sizeof prefix - 1))
            abort();
        fuzz__offset_inside(ctx.err + sizeof prefix - 1, size);
        return s;
    }
    if (c.layers < 1 || c.hidden < 1 || c.heads < 1 || c.vocab < 1 || c.positions < 1 ||
        c.ffn < 1 || c.heads > c.hidden || c.hidden % c.heads ||
        tpk_neox_rotary_dim(c.hidden / c.heads, c.rotary_pct) < 2 ||
        !(c.rotary_pct > 0 && c.rotary_pct <= 1) || !(c.ln_eps > 0 && c.ln_eps < 1) ||
        !(c.rope_theta > 1 && isfinite(c.rope_theta)) ||
        (c.act != TPK_ACT_GELU && c.act != TPK_ACT_GELU_TANH))
        abort();
    return s;
}

static char fuzz__dir[600], fuzz__index[700];
static void fuzz__index_remove(void) { remove(fuzz__index), rmdir(fuzz__dir); }

static tpk_status fuzz_index_one(const uint8_t *data, size_t size) {
    if (!fuzz__dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz__dir, sizeof fuzz__dir, "%s/tpk-fuzz-index.%ld", tmp && tmp[0] ? tmp : "/tmp",
                 (long)getpid());
        snprintf(fuzz__index, sizeof fuzz__index, "%s/model.safetensors.index.json", fuzz__dir);
        if (mkdir(fuzz__dir, 0700) != 0 && errno != EEXIST)
            fprintf(stderr, "fuzz_config: %s: cannot create\n", fuzz__dir), abort();
        atexit(fuzz__index_remove);
    }
    remove(fuzz__index); /* a new file: rewriting one in place (O_TRUNC) makes some file systems
                            flush it at close */
    FILE *f = fopen(fuzz__index, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        fprintf(stderr, "fuzz_config: %s: cannot write\n", fuzz__index), abort();
    tpk_ctx ctx;
    tpk_ckpt_files hf;
    memset(&ctx, 0, sizeof ctx);
    tpk_status s = tpk__hf_index(&ctx, "fuzz_index", fuzz__dir, &hf);
    if (s != TPK_OK) {
        char prefix[800];
        int np = snprintf(prefix, sizeof prefix, "fuzz_index: %s: ", fuzz__index);
        if (s != TPK_ERR_FORMAT || strncmp(ctx.err, prefix, (size_t)np)) abort();
        if (hf.file || hf.st || hf.open || hf.tensor || hf.which || hf.n || hf.nmap) abort();
        /* a JSON or weight_map fault: "byte N: ...", N inside the input */
        const char *rest = ctx.err + np;
        if (!strncmp(rest, "byte ", 5) && strtoull(rest + 5, NULL, 10) > size) abort();
        return s;
    }
    if (!hf.file || !hf.st || !hf.open || !hf.tensor || !hf.which || hf.n < 0 || hf.n > hf.nmap)
        abort();
    for (int k = 0; k < hf.nmap; k++)
        if (hf.which[k] < 0 || hf.which[k] >= hf.n || strlen(hf.tensor[k]) > 255) abort();
    for (int q = 0; q < hf.n; q++) {
        size_t len = strlen(hf.file[q]);
        if (len < 13 || len > 127 || strchr(hf.file[q], '/') || hf.file[q][0] == '.' ||
            strcmp(hf.file[q] + len - 12, ".safetensors") || hf.open[q])
            abort();
        for (int r = 0; r < q; r++)
            if (!strcmp(hf.file[r], hf.file[q])) abort();
    }
    tpk_ckpt_files_close(&hf);
    return s;
}

/* The GPT-2 parser's status (the replay's verdict); the other readers are checked as well. */
static tpk_status fuzz_config_one(const uint8_t *data, size_t size) {
    tpk_ctx ctx; /* only its error fields are used */
    tpk_gpt2_config c;
    memset(&ctx, 0, sizeof ctx), memset(&c, 0, sizeof c);
    tpk_status s = tpk_gpt2_config_parse(&ctx, data, size, "input", &c);
    fuzz_llama_one(data, size);
    fuzz_neox_one(data, size);
    fuzz_index_one(data, size);
    if (s != TPK_OK) {
        if (s != TPK_ERR_FORMAT || strncmp(ctx.err, "tpk_gpt2_config_parse: input: ", 30)) abort();
        const char *b = strstr(ctx.err, ": byte ");
        if (b && strtoull(b + 7, NULL, 10) > size) abort();
        return s;
    }
    if (c.layers < 1 || c.hidden < 1 || c.heads < 1 || c.vocab < 1 || c.positions < 1 ||
        c.hidden % c.heads || !(c.ln_eps > 0))
        abort();
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_config_one(data, size);
    return 0;
}
