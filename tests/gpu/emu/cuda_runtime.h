/* tests/gpu/emu/cuda_runtime.h — stands in for CUDA's cuda_runtime.h in the CPU emulation of the
 * CUDA backend: everything is in tpk_emu.h. */
#include "tpk_emu.h"
