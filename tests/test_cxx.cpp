// tests/test_cxx.cpp — the kit used from C++17 (g++ through mpicxx, -Wall -Wextra -Werror
// -pedantic): a small GPT-2 (L = 2, H = 24, A = 6, V = 61, dropout 0.1, SP at even t) built at
// t = ranks and, on every rank, unsharded on a one-rank context; forward and backward; the loss
// and every gathered gradient of the sharded model equal the unsharded one (relative 1e-5).
// A bad call is refused with the argument named, as from C. Prints "ok"/"FAIL" lines like the C
// tests (tests/run.sh counts them).
#include <tpk/runtime/mpi.h>
#include <tpk/tpk.h>
#include <tpk/plan/plan.h>
#include <tpk/train/pipe_model.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int rank_ = 0, size_ = 1, fails_total = 0;

// One test case: every rank agrees on the outcome; rank 0 prints it.
void report(const std::string &name, int fails) {
    int all = 0;
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank_ == 0) std::printf("%s %s [np=%d]\n", all ? "FAIL" : "ok", name.c_str(), size_);
    std::fflush(stdout);
    fails_total += all ? 1 : 0;
}

// A context that destroys itself.
struct Context {
    tpk_ctx ctx;
    tpk_status status;
    Context(tpk_comm *world, int tp, bool sp_dtype_bf16 = false) {
        tpk_ctx_desc d;
        std::memset(&d, 0, sizeof d);
        d.world = world, d.tp = tp, d.seed = 21, d.dtype = sp_dtype_bf16 ? TPK_BF16 : TPK_F32;
        status = tpk_ctx_init(&ctx, &d);
    }
    ~Context() { tpk_ctx_destroy(&ctx); }
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;
};

struct Result {
    float loss = 0;
    std::vector<std::vector<float>> grads;
};

// Build the model on c, run one forward and backward, gather every gradient.
int run(Context &c, bool sp, Result &out) {
    int fails = 0;
    auto ok = [&](tpk_status s, const char *what) {
        if (s != TPK_OK) {
            std::fprintf(stderr, "  [rank %d] %s: %s (%s)\n", rank_, what, tpk_last_error(&c.ctx),
                         tpk_status_str(s));
            fails++;
        }
        return s == TPK_OK;
    };
    if (!ok(c.status, "tpk_ctx_init")) return fails;
    tpk_gpt2_config cfg;
    std::memset(&cfg, 0, sizeof cfg);
    cfg.vocab = 61, cfg.positions = 8, cfg.layers = 2, cfg.hidden = 24, cfg.heads = 6,
    cfg.dropout = 0.1f, cfg.sequence_parallel = sp;
    tpk_gpt2 m;
    if (!ok(tpk_gpt2_init(&c.ctx, &m, &cfg), "tpk_gpt2_init")) return fails;
    const int B = 2, S = 7;
    std::vector<int32_t> ids(B * S), targets(B * S);
    for (int i = 0; i < B * S; i++)
        ids[i] = (7 * i + 3) % 61, targets[i] = i == 5 ? -100 : (11 * i + 1) % 61;
    c.ctx.rng_step = 3;
    if (ok(tpk_lm_forward(&c.ctx, &m.lm, ids.data(), targets.data(), B, S, &out.loss),
           "tpk_lm_forward") &&
        ok(tpk_lm_backward(&c.ctx, &m.lm, 1.0f), "tpk_lm_backward") &&
        ok(tpk_params_reduce_partial_grads(&c.ctx),
           "tpk_params_reduce_partial_grads")) { /* SP: layernorm grads */
        for (int i = 0; i < c.ctx.params.n; i++) {
            std::vector<float> g(tpk_param_global_numel(&c.ctx, i), NAN);
            ok(tpk_param_get_global(&c.ctx, i, true, g.data()), "tpk_param_get_global");
            out.grads.push_back(std::move(g));
        }
    }
    tpk_lm_destroy(&c.ctx, &m.lm);
    return fails;
}

double relerr(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) {
        if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
        num = std::fmax(num, std::fabs((double)a[i] - b[i])),
        den = std::fmax(den, std::fabs((double)b[i]));
    }
    return a.size() == b.size() ? num / den : INFINITY;
}

}  // namespace

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    tpk_comm world;
    if (tpk_comm_mpi(nullptr, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    bool sp = size_ % 2 == 0;
    {
        Result sharded, ref;
        int fails = 0;
        {
            Context c(&world, size_);
            fails += run(c, sp, sharded);
        }
        {
            Context c(nullptr, 1);  // the unsharded model, on this rank alone
            fails += run(c, false, ref);
        }
        double e = std::fabs((double)sharded.loss - ref.loss) / std::fabs((double)ref.loss);
        if (!(e < 1e-5))
            std::fprintf(stderr, "  [rank %d] loss %.9g vs unsharded %.9g\n", rank_, sharded.loss,
                         ref.loss),
                fails++;
        if (sharded.grads.size() != ref.grads.size() || ref.grads.empty()) fails++;
        for (size_t i = 0; i < sharded.grads.size() && i < ref.grads.size(); i++)
            if (!(relerr(sharded.grads[i], ref.grads[i]) < 1e-5))
                std::fprintf(stderr, "  [rank %d] gradient %zu: relative error %g\n", rank_, i,
                             relerr(sharded.grads[i], ref.grads[i])),
                    fails++;
        report(std::string("C++17: GPT-2 at t = ranks") + (sp ? " (sequence parallel)" : "") +
                   " equals the unsharded model (loss, every gradient)",
               fails);
    }
    {
        Context c(&world, size_);
        tpk_linear l;
        tpk_linear_desc d;
        std::memset(&d, 0, sizeof d);
        int fails = c.status != TPK_OK;
        if (tpk_col_linear_init(&c.ctx, &l, 8, 4 * size_, &d) != TPK_OK) fails++;
        std::vector<float> x(3 * 8, 0.5f);
        tpk_tensor tx = tpk_tensor_2d(x.data(), TPK_F32, 3, 8, TPK_P), ty;
        tpk_status s = tpk_col_linear_forward(&c.ctx, &l, tx, &ty);
        if (s != TPK_ERR_LAYOUT ||
            !std::strstr(tpk_last_error(&c.ctx), "x: expected layout R, got P"))
            std::fprintf(stderr, "  [rank %d] misuse: %s: %s\n", rank_, tpk_status_str(s),
                         tpk_last_error(&c.ctx)),
                fails++;
        tpk_linear_destroy(&c.ctx, &l);
        report("C++17: a P input to a column linear is refused (TPK_ERR_LAYOUT naming x)", fails);
    }
    { /* the planner from C++: a GPT-2 planned on 2 H100s, every row planned or given a reason */
        tpk_ctx err;
        std::memset(&err, 0, sizeof err);
        tpk_hw hw;
        tpk_plan_desc d;
        std::memset(&d, 0, sizeof d);
        int64_t *sh[5];
        d.model.arch = TPK_ARCH_GPT2;
        tpk_model_config_common(&d.model, sh, 0, false, TPK_RECOMPUTE_NONE);
        *sh[0] = 256, *sh[1] = 64, *sh[2] = 2, *sh[3] = 64, *sh[4] = 4;
        d.seq = 64, d.batch = 4, d.gpus = 2, d.gpus_per_node = 2, d.hw = &hw, d.dtype = TPK_BF16;
        d.tp = d.pp = d.micro_batch = 0, d.zero = d.sp = d.recompute = -1;
        tpk_plan_cfg *v = nullptr;
        int n = 0, fails = !tpk_hw_builtin("h100", &hw);
        if (tpk_plan(&err, &d, &v, &n) != TPK_OK || n < 1 || !v[0].fits || !(v[0].peak_bytes > 0))
            std::fprintf(stderr, "  [rank %d] plan: %s (%d rows)\n", rank_, tpk_last_error(&err),
                         n),
                fails++;
        for (int i = 0; i < n; i++)
            if (!v[i].fits && !v[i].reason[0]) fails++;
        std::free(v);
        report("C++17: tpk_plan plans a GPT-2 on 2 GPUs (every configuration planned or rejected "
               "with a reason)",
               fails);
    }
    tpk_comm_destroy(&world);
    MPI_Finalize();
    return fails_total ? 1 : 0;
}
