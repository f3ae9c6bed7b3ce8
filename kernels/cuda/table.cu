/* kernels/cuda/table.cu — the CUDA backend's table: every file's entries (tpk__cuda_<file>_ops),
 * made once (a function-local static). Every core and layer op and all four fusions are filled
 * (the GEMM epilogues, the residual-layernorm kernel, the fused cross-entropy). */
#include "common.cuh"

static tpk_ops cuda_table_make() {
    tpk_ops o = {};
    tpk__cuda_state_ops(&o);
    tpk__cuda_elementwise_ops(&o);
    tpk__cuda_gemm_ops(&o);
    tpk__cuda_fp8_ops(&o);
    tpk__cuda_optim_ops(&o);
    tpk__cuda_rng_ops(&o);
    tpk__cuda_norm_ops(&o);
    tpk__cuda_rope_swiglu_ops(&o);
    tpk__cuda_embed_ops(&o);
    tpk__cuda_rows_ops(&o);
    tpk__cuda_xent_ops(&o);
    tpk__cuda_attn_ops(&o);
    return o;
}
extern "C" const tpk_ops *tpk_ops_cuda(void) {
    static const tpk_ops ops = cuda_table_make();
    return &ops;
}
