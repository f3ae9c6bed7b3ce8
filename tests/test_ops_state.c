/* tests/test_ops_state.c — the host backend's memory (kernels/host/state.c): alloc (zero-filled),
 * free, memcpy in every direction, sync. Runs on one rank. */
#include "ops_test.h"

/* ---- memory -------------------------------------------------------------------------------- */

static void test_memory(void) {
    const tpk_ops *ops = ctx.ops;
    TEST_CASE("host ops: table, alloc, memcpy, sync") {
        CHECK(ops == tpk_ops_host(), "ctx.ops is not the host table");
        CHECK(strcmp(ops->name, "host") == 0, "name = %s", ops->name);
        CHECK(!ops->device && ops->self == NULL, "device = %d", (int)ops->device);
        CHECK(ops->alloc && ops->free && ops->memcpy && ops->sync && ops->fill && ops->copy2d &&
                  ops->cast && ops->axpby && ops->gemm && ops->bias_add && ops->bias_grad &&
                  ops->act_fwd && ops->act_bwd && ops->rng_2d,
              "an entry is NULL");

        size_t sizes[] = {0, 1, 3, 100, 4096, (size_t)1 << 22};
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            unsigned char *p = NULL;
            CHECK_OK(&ctx, tpk_op_alloc(&ctx, sizes[s], (void **)&p));
            CHECK(p != NULL, "alloc(%zu) gave NULL", sizes[s]);
            if (!p) continue;
            CHECK(((uintptr_t)p & 63) == 0, "alloc(%zu) = %p is not 64-byte aligned", sizes[s],
                  (void *)p);
            size_t nz = 0;
            for (size_t i = 0; i < sizes[s]; i++) nz += p[i] != 0;
            CHECK(nz == 0, "alloc(%zu): %zu bytes not zero", sizes[s], nz);
            tpk_op_free(&ctx, p);
        }
        tpk_op_free(&ctx, NULL);

        void *huge = (void *)1;
        CHECK_FAILS(&ctx, tpk_op_alloc(&ctx, (size_t)1 << 62, &huge), TPK_ERR_NOMEM,
                    "4611686018427387904 bytes");
        CHECK(huge == NULL, "failed alloc left %p", huge);
        CHECK_FAILS(&ctx, tpk_op_alloc(&ctx, SIZE_MAX, &huge), TPK_ERR_NOMEM, "bytes");

        float src[17], dst[17];
        test_randn(src, 17, 1, 1.0f);
        tpk_copy_dir dirs[] = {TPK_H2D, TPK_D2H, TPK_D2D, TPK_H2H};
        for (int d = 0; d < 4; d++) {
            test_poison(dst, 17);
            CHECK_OK(&ctx, tpk_op_memcpy(&ctx, dst, src, sizeof src, dirs[d]));
            CHECK(memcmp(dst, src, sizeof src) == 0, "memcpy dir %d differs", d);
        }
        CHECK_OK(&ctx, tpk_op_memcpy(&ctx, NULL, NULL, 0, TPK_H2H));
        CHECK_OK(&ctx, tpk_op_sync(&ctx));
    }
}

OPS_TEST_MAIN(test_memory)
