/* tests/gpu/emu/cuda_bf16.h — stands in for CUDA's cuda_bf16.h in the CPU emulation of the CUDA
 * backend: __nv_bfloat16 and its conversions are in tpk_emu.h. */
#include "tpk_emu.h"
