/* tests/test_env.c — the TPK_* environment variables checked like flags (tpk/base/env.h): for every
 * variable of the table, values inside its range accepted and values outside it, words it does not
 * take, trailing characters and non-numbers refused by tpk_ctx_init with TPK_ERR_ARG naming the
 * variable and the value; an empty value the same as unset; tpk_env_number's value and default;
 * TPK_TIMEOUT through the MPI communicator's reader. One rank. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <tpk/runtime/mpi.h>

/* tpk_ctx_init (the host backend, one rank) with name=value set; the variable unset after. */
static tpk_status init_with(tpk_ctx *ctx, const char *name, const char *value) {
    setenv(name, value, 1);
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = TPK_F32;
    tpk_status s = tpk_ctx_init(ctx, &d);
    if (s == TPK_OK) tpk_ctx_destroy(ctx);
    unsetenv(name);
    return s;
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    for (int i = 0; i < TPK_ENV_NVARS; i++) unsetenv(tpk_env_vars[i].name);
    tpk_ctx ctx;
    static const struct {
        const char *name, *value;
        bool good;
    } cases[] = {
        {"TPK_NUM_THREADS", "1", true},        {"TPK_NUM_THREADS", "64", true},
        {"TPK_NUM_THREADS", "0", false},       {"TPK_NUM_THREADS", "65", false},
        {"TPK_NUM_THREADS", "four", false},    {"TPK_NUM_THREADS", "2x", false},
        {"TPK_NUM_THREADS", "-3", false},      {"TPK_NUM_THREADS", "99999999999999999999", false},
        {"TPK_PROFILE", "0", true},            {"TPK_PROFILE", "yes", false},
        {"TPK_PROFILE", "10", false},          {"TPK_TIMEOUT", "0", true},
        {"TPK_TIMEOUT", "2.5", true},          {"TPK_TIMEOUT", "soon", false},
        {"TPK_TIMEOUT", "-1", false},          {"TPK_TIMEOUT", "1e10", false},
        {"TPK_TIMEOUT", "nan", false},         {"TPK_ATTN", "generic", true},
        {"TPK_ATTN", "flash", true},           {"TPK_ATTN", "fast", false},
        {"TPK_ATTN", "generic ", false},       {"TPK_MPI_STAGE", "1", true},
        {"TPK_MPI_STAGE", "true", false},      {"TPK_PEAK_TFLOPS", "989", true},
        {"TPK_PEAK_TFLOPS", "0", false},       {"TPK_PEAK_TFLOPS", "inf", false},
        {"TPK_TEST_SLOW_RANK", "1:2.5", true}, {"TPK_TEST_SLOW_RANK", "1", false},
        {"TPK_TEST_SLOW_RANK", "-1:2", false}, {"TPK_TEST_SLOW_RANK", "1:0", false},
        {"TPK_TEST_SLOW_RANK", "1:2s", false},
    };
    TEST_CASE("env: each variable's good values accepted, bad ones refused by name") {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            tpk_status s = init_with(&ctx, cases[i].name, cases[i].value);
            if (cases[i].good) {
                CHECK(s == TPK_OK, "%s=%s: %s", cases[i].name, cases[i].value,
                      tpk_last_error(&ctx));
            } else {
                char want[160];
                snprintf(want, sizeof want, "%s: expected ", cases[i].name);
                CHECK(s == TPK_ERR_ARG && strstr(tpk_last_error(&ctx), want) &&
                          strstr(tpk_last_error(&ctx), cases[i].value),
                      "%s=%s: %s (%s)", cases[i].name, cases[i].value, tpk_status_str(s),
                      tpk_last_error(&ctx));
            }
        }
        for (int i = 0; i < TPK_ENV_NVARS; i++) /* empty: as unset */
            CHECK(init_with(&ctx, tpk_env_vars[i].name, "") == TPK_OK, "%s empty: %s",
                  tpk_env_vars[i].name, tpk_last_error(&ctx));
    }
    TEST_CASE("env: tpk_env_number's value, its default, and a name not in the table") {
        double v = -1;
        CHECK_OK(&ctx, tpk_env_number(&ctx, "TPK_PEAK_TFLOPS", 989, &v));
        CHECK(v == 989, "default %g", v);
        setenv("TPK_PEAK_TFLOPS", "312.5", 1);
        CHECK_OK(&ctx, tpk_env_number(&ctx, "TPK_PEAK_TFLOPS", 989, &v));
        CHECK(v == 312.5, "value %g", v);
        setenv("TPK_PEAK_TFLOPS", "a lot", 1);
        CHECK_FAILS(&ctx, tpk_env_number(&ctx, "TPK_PEAK_TFLOPS", 989, &v), TPK_ERR_ARG,
                    "TPK_PEAK_TFLOPS: expected a number in [0.001, 1e+06]");
        unsetenv("TPK_PEAK_TFLOPS");
        CHECK_FAILS(&ctx, tpk_env_number(&ctx, "TPK_NUM_THREAD", 1, &v), TPK_ERR_ARG,
                    "\"TPK_NUM_THREAD\"");
        CHECK_FAILS(&ctx, tpk_env_number(&ctx, "TPK_ATTN", 1, &v), TPK_ERR_ARG, "numeric");
        CHECK(tpk_env_find("TPK_NUM_THREADS") && !tpk_env_find("TPK_NUM_THREAD"), "find");
    }
    TEST_CASE("env: TPK_TIMEOUT through the MPI communicator's reader") {
        double t = -1;
        CHECK_OK(&ctx, tpk_mpi_timeout_default(&ctx, &t));
        CHECK(t == 600, "unset: %g", t);
        setenv("TPK_TIMEOUT", "7", 1);
        CHECK_OK(&ctx, tpk_mpi_timeout_default(&ctx, &t));
        CHECK(t == 7, "7: %g", t);
        setenv("TPK_TIMEOUT", "7 s", 1);
        CHECK_FAILS(&ctx, tpk_mpi_timeout_default(&ctx, &t), TPK_ERR_ARG,
                    "TPK_TIMEOUT: expected a number in [0, 1e+09]");
        unsetenv("TPK_TIMEOUT");
    }
    return test_finish();
}
