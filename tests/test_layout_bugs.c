/* tests/test_layout_bugs.c — the silent wrong-gradient classes a layout type checker finds in
 * tensor-parallel kits (Megatron-LM issue #7452), reproduced against the kit's layers. Each is a
 * refused call (TPK_ERR_LAYOUT, the message naming the argument and the layout expected), or,
 * where the kit cannot express the mistake, the reason in a comment and the right result checked.
 * Every layout is a tag on the tensor (tpk_tensor.layout), so the checks hold at t = 1 too, where
 * the shapes alone could not tell. Run at 1..4 ranks (t = ranks; uneven splits at 3).
 *   1. A vocabulary-parallel cross-entropy fed gathered (R) logits: each rank would take the whole
 *      vocabulary for its shard, the log-sum-exp summing t copies: the loss grows by log t and
 *      the gradient is wrong. tpk_xent_forward refuses "z: expected layout S(-1)"; the loss of the
 *      S(-1) logits equals the unsharded log-softmax loss (computed here on the host).
 *   2. A partial value used as replicated: a row linear's partial_output (P) fed to a layernorm
 *      (expects R: the norm of a partial sum is not the sum of norms), and a P gradient given to
 *      a norm's backward that expects R. Both refused, "x: expected layout R, got P" and
 *      "dy: expected layout R, got P".
 *   3. A sequence-parallel norm's weight gradient not summed over TP: each rank holds the sum over
 *      its own token rows only, so the replicated weights would step apart. The kit marks the
 *      gradient P after such a backward (at t > 1) and the optimizer refuses it until
 *      tpk_params_reduce_partial_grads: "ctx->params: expected layout R for every gradient, got
 *      P"; after the reduction the step runs and the weights agree over TP, equal to the step
 *      of the unsharded layer (an SGD-like check: the update of AdamW's first step is -lr sign).
 *   4. A replicated input fed to a row linear that expects its shard: not a mistake the kit can
 *      make silently — the input's tag says R and the layer slices its own columns (Megatron's
 *      input_is_parallel flag, which can lie, has no counterpart). Checked: the output from R
 *      equals the output from the S(-1) shard. The lie itself — a whole [T, in] tensor tagged
 *      S(-1) — is refused by its local shape at t > 1 (TPK_ERR_SHAPE, "local shape"); at t = 1 the
 *      shard is the whole and the result right. A sequence-sharded S(0) input is refused
 *      "x: expected layout S(-1)".
 *   5. A column linear's output consumed without its gather: the S(-1) features fed to a layer that
 *      needs every feature (a layernorm) are refused "x: expected layout R, got S(-1)". */
#include "test.h"

static tpk_comm world;
enum { B = 2, S = 5, T = B * S, H = 12, V = 20 };

static tpk_status mkctx(tpk_ctx *ctx, int tp) {
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.world = tp > 1 ? &world : NULL, d.tp = tp, d.seed = 5, d.dtype = TPK_F32;
    return tpk_ctx_init(ctx, &d);
}

/* in converted to layout `to` into a new host buffer (free its data). */
static tpk_tensor conv(tpk_ctx *c, const tpk_tensor *in, tpk_layout to) {
    tpk_tensor out;
    memset(&out, 0, sizeof out);
    out.data = malloc((size_t)(in->gshape[0] * in->gshape[1] + 1) * sizeof(float));
    CHECK_OK(c, tpk_convert(c, in, to, &out));
    return out;
}

/* The mean over T rows of lse(z_t) - z_t[target_t], on the host in double. */
static double ref_loss(const float *z, const int32_t *tg) {
    double sum = 0;
    for (int t = 0; t < T; t++) {
        double m = -1e30, s = 0;
        for (int v = 0; v < V; v++) m = z[t * V + v] > m ? z[t * V + v] : m;
        for (int v = 0; v < V; v++) s += exp(z[t * V + v] - m);
        sum += m + log(s) - z[t * V + tg[t]];
    }
    return sum / T;
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    int np = test__size;

    TEST_CASE("layout_bug_xent_gathered_logits") {
        tpk_ctx c;
        CHECK_OK(&c, mkctx(&c, np));
        static float Z[T * V];
        int32_t tg[T];
        test_randn(Z, T * V, 31, 2.0f);
        for (int t = 0; t < T; t++) tg[t] = (int32_t)((t * 7 + 3) % V);
        tpk_xent ce;
        tpk_xent_desc xd;
        memset(&xd, 0, sizeof xd);
        xd.padded_vocab = V; /* no padding: the logits are the V columns */
        CHECK_OK(&c, tpk_xent_init(&c, &ce, V, &xd));
        tpk_tensor zR = tpk_tensor_2d(Z, TPK_F32, T, V, TPK_R), zS;
        float loss = NAN;
        CHECK_FAILS(&c, tpk_xent_forward(&c, &ce, zR, tg, &loss), TPK_ERR_LAYOUT,
                    "z: expected layout S(-1)");
        CHECK(strstr(tpk_last_error(&c), "got R") != NULL, "%s", tpk_last_error(&c));
        tpk_clear_error(&c);
        zS = conv(&c, &zR, tpk_tp_vocab_layout(&c, V, -1));
        CHECK_OK(&c, tpk_xent_forward(&c, &ce, zS, tg, &loss));
        double want = ref_loss(Z, tg);
        CHECK(fabs(loss - want) < 1e-5 * fabs(want), "loss %.7f, unsharded %.7f", (double)loss,
              want);
        tpk_xent_destroy(&c, &ce), free(zS.data);
        tpk_ctx_destroy(&c);
    }

    TEST_CASE("layout_bug_partial_used_as_replicated") {
        tpk_ctx c;
        CHECK_OK(&c, mkctx(&c, np));
        tpk_row_linear row;
        tpk_layernorm ln;
        tpk_linear_desc rd;
        memset(&rd, 0, sizeof rd);
        rd.name = "o", rd.partial_output = true;
        CHECK_OK(&c, tpk_row_linear_init(&c, &row, H, H, &rd));
        CHECK_OK(&c, tpk_layernorm_init(&c, &ln, H, &(tpk_layernorm_desc){.name = "ln"}));
        test_set_weights(&c, 3, 0.3f);
        static float X[T * H], DY[T * H];
        test_randn(X, T * H, 41, 1.0f), test_randn(DY, T * H, 42, 1.0f);
        tpk_tensor xR = tpk_tensor_2d(X, TPK_F32, T, H, TPK_R), xs, y, yn;
        xs = conv(&c, &xR, TPK_S(-1));
        CHECK_OK(&c, tpk_row_linear_forward(&c, &row, xs, &y));
        CHECK(y.layout.kind == TPK_LAYOUT_P, "the partial output's layout: %d", y.layout.kind);
        CHECK_FAILS(&c, tpk_layernorm_forward(&c, &ln, y, &yn), TPK_ERR_LAYOUT,
                    "x: expected layout R, got P");
        /* a P gradient given to a backward that expects the R one */
        CHECK_OK(&c, tpk_layernorm_forward(&c, &ln, xR, &yn));
        tpk_tensor dyP = tpk_tensor_2d(DY, TPK_F32, T, H, TPK_P), dx;
        CHECK_FAILS(&c, tpk_layernorm_backward(&c, &ln, dyP, &dx), TPK_ERR_LAYOUT,
                    "dy: expected layout R, got P");
        tpk_linear_destroy(&c, &row), tpk_layernorm_destroy(&c, &ln), free(xs.data);
        tpk_ctx_destroy(&c);
    }

    TEST_CASE("layout_bug_sp_norm_grad_not_reduced") {
        /* the sharded run (SP over t = np) and the unsharded one, one AdamW step each */
        float w_sh[H], w_un[H];
        test_poison(w_sh, H), test_poison(w_un, H);
        static float X[T * H], DY[T * H];
        test_randn(X, T * H, 51, 1.0f), test_randn(DY, T * H, 52, 1.0f);
        for (int k = 0; k < 2; k++) {
            int t = k ? 1 : np;
            tpk_ctx c;
            CHECK_OK(&c, mkctx(&c, t));
            tpk_layernorm ln;
            CHECK_OK(&c, tpk_layernorm_init(
                             &c, &ln, H,
                             &(tpk_layernorm_desc){.name = "ln", .sequence_parallel = t > 1}));
            test_set_weights(&c, 4, 0.5f);
            tpk_adamw opt;
            memset(&opt, 0, sizeof opt);
            CHECK_OK(&c, tpk_adamw_init(&c, &opt,
                                        &(tpk_adamw_desc){.b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f}));
            CHECK_OK(&c, tpk_params_zero_grad(&c));
            tpk_tensor xR = tpk_tensor_2d(X, TPK_F32, T, H, TPK_R), x = xR, y, dx;
            tpk_tensor dR = tpk_tensor_2d(DY, TPK_F32, T, H, TPK_R), dy = dR;
            if (t > 1) x = conv(&c, &xR, TPK_S(0)), dy = conv(&c, &dR, TPK_S(0));
            CHECK_OK(&c, tpk_layernorm_forward(&c, &ln, x, &y));
            CHECK_OK(&c, tpk_layernorm_backward(&c, &ln, dy, &dx));
            if (t > 1) {
                CHECK_FAILS(&c, tpk_adamw_step(&c, &opt, 0.1f, 1.0f), TPK_ERR_LAYOUT,
                            "ctx->params: expected layout R for every gradient, got P");
                CHECK_OK(&c, tpk_params_reduce_partial_grads(&c));
            }
            CHECK_OK(&c, tpk_adamw_step(&c, &opt, 0.1f, 1.0f));
            int wi = tpk_param_find(&c, "ln.weight");
            CHECK(wi >= 0, "ln.weight not registered");
            if (wi >= 0) CHECK_OK(&c, tpk_param_get_global(&c, wi, false, k ? w_un : w_sh));
            tpk_layernorm_destroy(&c, &ln), tpk_adamw_destroy(&c, &opt);
            if (t > 1) free(x.data), free(dy.data);
            tpk_ctx_destroy(&c);
        }
        CHECK_CLOSE(w_sh, w_un, H, 1e-5, "ln.weight after one step, SP against unsharded");
        /* every TP rank the same weights: their spread over ranks is zero */
        float lo[H], hi[H];
        MPI_Allreduce(w_sh, lo, H, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(w_sh, hi, H, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
        CHECK(!memcmp(lo, hi, sizeof lo), "the ranks' ln.weight differ after the step");
    }

    TEST_CASE("layout_bug_replicated_input_to_row_linear") {
        tpk_ctx c;
        CHECK_OK(&c, mkctx(&c, np));
        tpk_row_linear row;
        tpk_linear_desc rd;
        memset(&rd, 0, sizeof rd);
        rd.name = "o", rd.bias = true;
        CHECK_OK(&c, tpk_row_linear_init(&c, &row, H, 7, &rd));
        test_set_weights(&c, 6, 0.3f);
        static float X[T * H], y1[T * 7], y2[T * 7];
        test_randn(X, T * H, 61, 1.0f);
        test_poison(y1, T * 7), test_poison(y2, T * 7);
        tpk_tensor xR = tpk_tensor_2d(X, TPK_F32, T, H, TPK_R), xs, y;
        xs = conv(&c, &xR, TPK_S(-1));
        CHECK_OK(&c, tpk_row_linear_forward(&c, &row, xs, &y));
        CHECK(y.layout.kind == TPK_LAYOUT_R, "output layout %d", y.layout.kind);
        memcpy(y1, y.data, sizeof y1);
        CHECK_OK(&c, tpk_row_linear_forward(&c, &row, xR, &y)); /* R: sliced by the layer */
        memcpy(y2, y.data, sizeof y2);
        CHECK_CLOSE(y2, y1, T * 7, 1e-6, "row linear from R against from its S(-1) shard");
        /* the reference: y = x W^T + b on the host, from the gathered weights */
        float W[7 * H], b[7], ref[T * 7];
        CHECK_OK(&c, tpk_param_get_global(&c, tpk_param_find(&c, "o.weight"), false, W));
        CHECK_OK(&c, tpk_param_get_global(&c, tpk_param_find(&c, "o.bias"), false, b));
        for (int t = 0; t < T; t++)
            for (int o = 0; o < 7; o++) {
                double s = b[o];
                for (int i = 0; i < H; i++) s += (double)X[t * H + i] * W[o * H + i];
                ref[t * 7 + o] = (float)s;
            }
        CHECK_CLOSE(y1, ref, T * 7, 1e-5, "row linear against x W^T + b");
        /* the lie: a whole [T, H] tensor tagged as the S(-1) shard */
        tpk_tensor lie = tpk_tensor_2d(X, TPK_F32, T, H, TPK_S(-1));
        if (np > 1)
            CHECK_FAILS(&c, tpk_row_linear_forward(&c, &row, lie, &y), TPK_ERR_SHAPE,
                        "x: local shape");
        else CHECK_OK(&c, tpk_row_linear_forward(&c, &row, lie, &y)); /* the shard is the whole */
        tpk_tensor seq = tpk_tp_tensor_2d(&c, X, TPK_F32, T, H, TPK_S(0));
        CHECK_FAILS(&c, tpk_row_linear_forward(&c, &row, seq, &y), TPK_ERR_LAYOUT,
                    "x: expected layout S(-1)");
        CHECK(strstr(tpk_last_error(&c), "got S(0)") != NULL, "%s", tpk_last_error(&c));
        tpk_linear_destroy(&c, &row), free(xs.data);
        tpk_ctx_destroy(&c);
    }

    TEST_CASE("layout_bug_column_output_without_gather") {
        tpk_ctx c;
        CHECK_OK(&c, mkctx(&c, np));
        tpk_col_linear col;
        tpk_layernorm ln;
        tpk_linear_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.name = "up";
        CHECK_OK(&c, tpk_col_linear_init(&c, &col, H, H, &cd));
        CHECK_OK(&c, tpk_layernorm_init(&c, &ln, H, &(tpk_layernorm_desc){.name = "ln"}));
        test_set_weights(&c, 7, 0.3f);
        static float X[T * H];
        test_randn(X, T * H, 71, 1.0f);
        tpk_tensor xR = tpk_tensor_2d(X, TPK_F32, T, H, TPK_R), y, yn;
        CHECK_OK(&c, tpk_col_linear_forward(&c, &col, xR, &y));
        CHECK(y.layout.kind == TPK_LAYOUT_S, "column output layout %d", y.layout.kind);
        CHECK_FAILS(&c, tpk_layernorm_forward(&c, &ln, y, &yn), TPK_ERR_LAYOUT,
                    "x: expected layout R, got S(-1)");
        tpk_linear_destroy(&c, &col), tpk_layernorm_destroy(&c, &ln);
        tpk_ctx_destroy(&c);
    }

    tpk_comm_destroy(&world);
    return test_finish();
}
