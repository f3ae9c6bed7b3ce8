// tests/cuda_cxx.cu — the kit from a CUDA C++ file (nvcc, -Xcompiler -Wall,-Wextra,-Werror), as a
// trainer written in CUDA C++ would use it: <tpk/tpk.h> and <tpk/runtime/cuda.h> included directly,
// the layers called from host code, and a kernel of the user's own run on a tpk buffer on tpk's
// stream.
//   host:  a small GPT-2 (L = 2, H = 32, A = 4, V = 67) forward and backward on the host backend;
//          its loss equals the log-sum-exp recomputed here in double from its gathered logits.
//   GPU (where one is present): the same model on the CUDA backend (f32, TF32 off): loss and every
//          gradient equal the host's (relative 1e-4), and a user kernel reading the CUDA logits
//          finds the same row maxima as the host logits.
// Run by tests/run.sh where nvcc built it; prints "ok"/"FAIL" lines.
#include <tpk/runtime/cuda.h>
#include <tpk/tpk.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

// The user's own kernel: mx[t] = max_j z[t, j] over the first V columns of a [T, ld] f32 buffer
// (GPT-2's logits have rows of the padded vocabulary), one thread per row.
__global__ void row_max(const float *z, int T, int V, int ld, float *mx) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    float m = -INFINITY;
    for (int j = 0; j < V; j++) m = fmaxf(m, z[(size_t)t * ld + j]);
    mx[t] = m;
}

namespace {
int fails_total = 0;
void report(const char *name, int fails) {
    std::printf("%s %s [np=1]\n", fails ? "FAIL" : "ok", name);
    fails_total += fails ? 1 : 0;
}
const int B = 2, S = 9, T = B * S, V = 67;

struct Run {
    float loss = 0;
    std::vector<float> logits;             // [T, V]
    std::vector<std::vector<float>> grads;
    std::vector<float> user_max;           // the user kernel's row maxima (CUDA only)
};

int run(const tpk_ops *ops, tpk_comm *world, Run &r) {
    int fails = 0;
    tpk_ctx ctx;
    tpk_ctx_desc d;
    std::memset(&d, 0, sizeof d);
    d.ops = ops, d.world = world, d.seed = 8;
    auto ok = [&](tpk_status s, const char *what) {
        if (s != TPK_OK)
            std::fprintf(stderr, "  %s: %s (%s)\n", what, tpk_last_error(&ctx), tpk_status_str(s)),
                fails++;
        return s == TPK_OK;
    };
    if (!ok(tpk_ctx_init(&ctx, &d), "tpk_ctx_init")) return fails;
    tpk_gpt2_config cfg;
    std::memset(&cfg, 0, sizeof cfg);
    cfg.vocab = V, cfg.positions = 16, cfg.layers = 2, cfg.hidden = 32, cfg.heads = 4;
    tpk_gpt2 m;
    if (ok(tpk_gpt2_init(&ctx, &m, &cfg), "tpk_gpt2_init")) {
        std::vector<int32_t> ids(T), tg(T);
        for (int i = 0; i < T; i++) ids[i] = (13 * i + 5) % V, tg[i] = (29 * i + 2) % V;
        if (ok(tpk_lm_forward(&ctx, &m.lm, ids.data(), tg.data(), B, S, &r.loss),
               "tpk_lm_forward")) {
            // the vocabulary padded to an aligned shard: columns >= V are padding
            int ld = (int)m.lm.logits.shape[1];
            std::vector<float> full((size_t)T * ld, NAN);
            ok(tpk_op_memcpy(&ctx, full.data(), m.lm.logits.data, sizeof(float) * T * ld,
                             ops->device ? TPK_D2H : TPK_H2H),
               "logits");
            r.logits.assign((size_t)T * V, NAN);
            for (int t = 0; t < T; t++)
                for (int j = 0; j < V; j++) r.logits[(size_t)t * V + j] = full[(size_t)t * ld + j];
            if (ops->device) { // the user's kernel on tpk's buffer and stream
                float *mx = nullptr;
                r.user_max.assign(T, NAN);
                cudaStream_t st = (cudaStream_t)tpk_cuda_stream();
                if (cudaMalloc(&mx, sizeof(float) * T) == cudaSuccess) {
                    row_max<<<1, 64, 0, st>>>((const float *)m.lm.logits.data, T, V, ld, mx);
                    if (cudaMemcpyAsync(r.user_max.data(), mx, sizeof(float) * T,
                                        cudaMemcpyDeviceToHost, st) != cudaSuccess ||
                        cudaStreamSynchronize(st) != cudaSuccess)
                        fails++;
                    cudaFree(mx);
                } else {
                    fails++;
                }
            }
            if (ok(tpk_lm_backward(&ctx, &m.lm, 1.0f), "tpk_lm_backward"))
                for (int i = 0; i < ctx.params.n; i++) {
                    std::vector<float> g(tpk_param_global_numel(&ctx, i), NAN);
                    ok(tpk_param_get_global(&ctx, i, true, g.data()), "tpk_param_get_global");
                    r.grads.push_back(g);
                }
        }
        tpk_lm_destroy(&ctx, &m.lm);
    }
    tpk_ctx_destroy(&ctx);
    return fails;
}

double relerr(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 1e-30;
    if (a.size() != b.size() || a.empty()) return INFINITY;
    for (size_t i = 0; i < a.size(); i++) {
        if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
        num = std::fmax(num, std::fabs((double)a[i] - b[i])),
        den = std::fmax(den, std::fabs((double)b[i]));
    }
    return num / den;
}
} // namespace

int main() {
    Run host;
    tpk_comm self = tpk_comm_self(false);
    int f = run(tpk_ops_host(), &self, host);
    double ref = 0; // mean over positions of lse - z_target, in double from the logits
    for (int t = 0; t < T && !host.logits.empty(); t++) {
        double mx = -INFINITY, se = 0;
        for (int j = 0; j < V; j++) mx = std::fmax(mx, host.logits[(size_t)t * V + j]);
        for (int j = 0; j < V; j++) se += std::exp(host.logits[(size_t)t * V + j] - mx);
        ref += mx + std::log(se) - host.logits[(size_t)t * V + (29 * t + 2) % V];
    }
    ref /= T;
    if (!(std::fabs(host.loss - ref) < 1e-5 * std::fabs(ref)))
        std::fprintf(stderr, "  loss %.9g, recomputed %.9g\n", host.loss, ref), f++;
    report(
        "CUDA C++ file (nvcc): GPT-2 on the host backend, loss equals the double log-sum-exp of "
        "its logits",
        f);
    if (tpk_cuda_device_count() < 1) {
        std::printf("cuda_cxx: no GPU here: the CUDA backend part did not run\n");
        return fails_total ? 1 : 0;
    }
    Run gpu;
    tpk_comm cs = tpk_comm_self_cuda();
    f = run(tpk_ops_cuda(), &cs, gpu);
    double e = std::fabs((double)gpu.loss - host.loss) / std::fabs((double)host.loss);
    if (!(e < 1e-4))
        std::fprintf(stderr, "  CUDA loss %.9g, host %.9g\n", gpu.loss, host.loss), f++;
    for (size_t i = 0; i < host.grads.size(); i++)
        if (i >= gpu.grads.size() || !(relerr(gpu.grads[i], host.grads[i]) < 1e-4))
            std::fprintf(stderr, "  gradient %zu differs\n", i), f++;
    std::vector<float> want(T);
    for (int t = 0; t < T; t++) {
        want[t] = -INFINITY;
        for (int j = 0; j < V; j++) want[t] = std::fmax(want[t], host.logits[(size_t)t * V + j]);
    }
    if (!(relerr(gpu.user_max, want) < 1e-4))
        std::fprintf(stderr, "  the user kernel's row maxima differ\n"), f++;
    report(
        "CUDA C++ file: GPT-2 on the CUDA backend equals the host backend; a user kernel reads "
        "tpk's logits on tpk's stream",
        f);
    tpk_comm_destroy(&cs);
    return fails_total ? 1 : 0;
}
