/* tpk/tpk.h — the umbrella header: the stack from core.h to the GPT-2 and Llama models, the host
 * backend, and a trainer's AdamW, DP buckets, token data and sampling. Include yourself
 * <tpk/train.h> and <tpk/log.h>, <tpk/safetensors.h>, <tpk/hf.h> and <tpk/model.h> (POSIX),
 * <tpk/mpi.h> for the MPI communicator (compile with mpicc), <tpk/cuda.h> and <tpk/nccl.h> for the
 * CUDA backend and the NCCL communicator.
 *
 * What includes what (each header includes only what it uses):
 *   core.h rng.h                       status, dtypes, layouts, tensor views; counter RNG
 *   comm.h ops.h                       the two interfaces: communicator, compute backend table
 *   ctx.h                              the context, errors, argument checks
 *   op.h buf.h                         the checked op front end (timed by profile.h); backend buffers
 *   coll.h comm_self.h init.h          checked collectives; one-rank comm; ctx lifecycle (mesh)
 *   host.h                             the host backend's table (the default backend)
 *   layout.h params.h                  layout conversions and region ops; the parameter registry
 *   act.h linear.h norm.h embed.h      layers
 *   xent.h resid.h mlp.h attn.h
 *   lm.h                               the language-model skeleton: embedding, stack of blocks
 *                                      (recompute.h), final norm, head, loss; a family's table
 *   gpt2.h llama.h                     the GPT-2 and Llama blocks, configs and names
 *   optim.h dp.h data.h sample.h       a trainer's machinery: AdamW, norm, clipping, schedules; DP
 *                                      buckets; token data; sampling
 *   train.h log.h                      a step's end (DP reduction, norm, clipping, AdamW); the loss
 *                                      curve (not included here)
 *   safetensors.h hf.h model.h         checkpoint files, Hugging Face GPT-2 and Llama layouts; one
 *                                      handle over both models (POSIX; not included here) */
#ifndef TPK_TPK_H
#define TPK_TPK_H

#include "core.h"
#include "rng.h"
#include "comm.h"
#include "ops.h"
#include "ctx.h"
#include "op.h"
#include "buf.h"
#include "coll.h"
#include "comm_self.h"
#include "init.h"
#include "host.h"
#include "layout.h"
#include "params.h"
#include "act.h"
#include "linear.h"
#include "norm.h"
#include "embed.h"
#include "xent.h"
#include "mlp.h"
#include "attn.h"
#include "resid.h"
#include "lm.h"
#include "gpt2.h"
#include "llama.h"
#include "optim.h"
#include "dp.h"
#include "data.h"
#include "sample.h"

#endif /* TPK_TPK_H */
