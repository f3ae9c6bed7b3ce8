/* tests/fuzz/fuzz_safetensors.c — fuzz target for the safetensors reader (tpk/train/safetensors.h).
 *
 * Each input is a whole file given to tpk_st_parse (its header read by tpk/text/json.h's cursor,
 * the kit's one JSON reader). Whatever the bytes, the parser must return a status without
 * crashing, reading out of bounds or leaking, a refusal naming the input and a byte offset inside
 * it ("input: byte N: ..."); when it accepts the
 * bytes, everything it returned must hold together: every tensor lies inside the data buffer
 * and converts (F32/BF16/F16) or is refused with TPK_ERR_DTYPE, tpk_st_find finds every name,
 * tpk_st_meta every key. A broken promise aborts, so the fuzzer reports it as a crash.
 *
 *   make fuzz                      libFuzzer + ASan + UBSan for FUZZ_SECONDS (clang)
 *   cc -std=c11 -Iinclude tests/fuzz/fuzz_safetensors.c -o fuzz_replay && ./fuzz_replay
 *   tests/fuzz/corpus/valid_1 ...
 *                                  the same checks over files, with any C compiler
 * tests/test_safetensors.c includes this file (TPK_FUZZ_NO_MAIN) to replay the corpus in
 * `make test`. Corpus files named valid_* must parse, bad_* must be rejected as malformed;
 * others (e.g. inputs that once crashed) only must not crash. */
#include <tpk/train/safetensors.h>

/* Check one input; returns the parse status. */
static tpk_status fuzz_safetensors_one(const uint8_t *data, size_t size) {
    tpk_ctx ctx; /* only its error fields are used */
    tpk_st_file f;
    memset(&ctx, 0, sizeof ctx);
    tpk_status s = tpk_st_parse(&ctx, data, size, "input", &f);
    if (s != TPK_OK) {
        if (s != TPK_ERR_FORMAT || !ctx.err[0] || f.owned || f.tensors || f.n) abort();
        /* "tpk_st_parse: input: byte N: ...": the file and the place, N inside the file */
        static const char prefix[] = "tpk_st_parse: input: byte ";
        if (strncmp(ctx.err, prefix, sizeof prefix - 1) ||
            strtoull(ctx.err + sizeof prefix - 1, NULL, 10) > size)
            abort();
        return s;
    }
    if (f.n < 0 || f.n_meta < 0 || f.data_size > size) abort();
    for (int i = 0; i < f.n; i++) {
        const tpk_st_tensor *t = &f.tensors[i];
        if (t->begin > t->end || t->end > f.data_size || tpk_st_find(&f, t->name) != t) abort();
        size_t n = (size_t)tpk_st_numel(t), esz = tpk_st_dtype_size(t->dtype);
        if (esz == 0 || (uint64_t)n * esz != t->end - t->begin) abort();
        float *out = (float *)malloc(n ? n * sizeof(float) : 1);
        if (!out) abort();
        tpk_status g = tpk_st_get_f32(&ctx, &f, t, out, n);
        bool conv = t->dtype == TPK_ST_F32 || t->dtype == TPK_ST_BF16 || t->dtype == TPK_ST_F16;
        if (g != (conv ? TPK_OK : TPK_ERR_DTYPE)) abort();
        if (conv && tpk_st_get_f32(&ctx, &f, t, out, n + 1) != TPK_ERR_SHAPE) abort();
        free(out);
    }
    for (int i = 0; i < f.n_meta; i++)
        if (!tpk_st_meta(&f, f.meta_keys[i]) ||
            strcmp(tpk_st_meta(&f, f.meta_keys[i]), f.meta_vals[i]))
            abort();
    tpk_st_close(&f);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_safetensors_one(data, size);
    return 0;
}

#if !defined(TPK_FUZZ_LIBFUZZER) && !defined(TPK_FUZZ_NO_MAIN)
/* Replay: each argument is a file. */
int main(int argc, char **argv) {
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        FILE *fp = fopen(argv[i], "rb");
        uint8_t *buf = NULL;
        size_t n = 0, cap = 0, r;
        if (!fp) {
            fprintf(stderr, "%s: cannot open\n", argv[i]);
            bad = 1;
            continue;
        }
        do {
            if (n == cap && !(buf = (uint8_t *)realloc(buf, cap = cap ? 2 * cap : 4096))) abort();
            n += r = fread(buf + n, 1, cap - n, fp);
        } while (r);
        fclose(fp);
        /* an exact-size copy, so a read past the end is past the allocation */
        uint8_t *exact = (uint8_t *)malloc(n ? n : 1);
        if (!exact) abort();
        memcpy(exact, buf, n);
        printf("%s: %s\n", argv[i], tpk_status_str(fuzz_safetensors_one(exact, n)));
        free(exact), free(buf);
    }
    return bad;
}
#endif
