/* tests/fuzz/fuzz_config.c — fuzz target for the strict config.json parser (tpk_gpt2_config_parse,
 * tpk/hf.h). Whatever the bytes, it must return a status without crashing or reading outside
 * them; a refusal is TPK_ERR_FORMAT with a message naming the input and, for a syntax error,
 * a byte offset inside it; an acceptance gives a plausible configuration (positive sizes,
 * hidden a multiple of heads). A broken promise aborts (a crash to the fuzzer).
 *   make fuzz                      libFuzzer + ASan + UBSan, each target for FUZZ_SECONDS (clang)
 * tests/test_hf.c includes this file (TPK_FUZZ_NO_MAIN) to replay tests/fuzz/corpus_config in
 * `make test`: files named valid_* must parse, bad_* must be refused. */
#include <tpk/hf.h>

static tpk_status fuzz_config_one(const uint8_t *data, size_t size) {
    tpk_ctx ctx; /* only its error fields are used */
    tpk_gpt2_config c;
    memset(&ctx, 0, sizeof ctx), memset(&c, 0, sizeof c);
    tpk_status s = tpk_gpt2_config_parse(&ctx, data, size, "input", &c);
    if (s != TPK_OK) {
        if (s != TPK_ERR_FORMAT || strncmp(ctx.err, "tpk_gpt2_config_parse: input: ", 30)) abort();
        const char *b = strstr(ctx.err, ": byte ");
        if (b && strtoull(b + 7, NULL, 10) > size) abort();
        return s;
    }
    if (c.layers < 1 || c.hidden < 1 || c.heads < 1 || c.vocab < 1 || c.positions < 1 || c.hidden % c.heads || !(c.ln_eps > 0)) abort();
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_config_one(data, size);
    return 0;
}
