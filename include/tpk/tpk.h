/* tpk/tpk.h — the umbrella header: the stack from base/core.h to the GPT-2, Llama and GPT-NeoX
 * models, the host backend, and a trainer's AdamW, DP buckets, pipeline schedules and token
 * data. Include yourself
 * <tpk/train/train.h>, <tpk/train/log.h>, <tpk/train/safetensors.h>, <tpk/train/ckpt_dir.h>,
 * <tpk/train/ckpt.h>, <tpk/train/hf.h> and <tpk/train/model.h> (POSIX), <tpk/runtime/mpi.h> for
 * the MPI communicator (compile with mpicc),
 * <tpk/runtime/cuda.h> and <tpk/runtime/nccl.h> for the CUDA backend and the NCCL communicator.
 *
 * The folders are the strata; a header includes only its own folder's or a lower one's:
 *   base/     core.h rng.h          status, dtypes, layouts, tensor views; counter RNG
 *             comm.h ops.h          the two interfaces: communicator, compute backend table
 *             ctx.h                 the context, errors, argument checks, its hooks (host
 *                                   memory, messages)
 *             version.h             the version: TPK_VERSION_*, tpk_version()
 *             env.h                 the TPK_* environment variables, each checked like a flag
 *   runtime/  backend.h op.h        what a backend includes; the checked op front end
 *             profile.h buf.h       the profiler; backend buffers
 *             coll.h init.h         checked collectives; the context's lifecycle (the mesh)
 *             comm_self.h mpi.h     the communicators: one rank, MPI, NCCL (nccl.h)
 *             host.h cuda.h         the backends' tables (host: the default)
 *   layers/   layout.h params.h     layout conversions and region ops; the parameter registry
 *             act.h linear.h norm.h embed.h xent.h resid.h mlp.h attn.h
 *             cp_split.h cp_attn.h  context parallelism: the load-balanced split of a sequence;
 *                                   attention over it (ring or all-gather)
 *             router.h moe.h        mixture of experts: the router (top-k, the auxiliary loss);
 *                                   the dispatcher over the EP group and the sparse MoE block
 *             recompute.h           a stack of blocks, activation recompute
 *   models/   block.h               the block: norms, attention, MLP, residual style
 *             lm.h sample.h         the language model over it (one type); sampling
 *             gpt2.h llama.h neox.h the GPT-2, Llama and GPT-NeoX configurations (families.h)
 *             mixtral.h qwen2_moe.h Mixtral and Qwen2-MoE: Llama's with a mixture of experts
 *             moe_family.h          (their shared options: the router's, the capacity, z-loss,
 *                                   dropout)
 *   train/    optim.h dp.h data.h   AdamW, norm, clipping, schedules; DP buckets; token data
 *             schedule.h pipeline.h pipeline parallelism: schedules as data; the split of blocks
 *                                   over stages and the executor
 *             train.h log.h         a step's end (DP reduction, norm, clipping, AdamW); the loss
 *                                   curve (not included here)
 *             safetensors.h         checkpoint files (POSIX; not included here, nor the next)
 *             ckpt_dir.h ckpt.h     a checkpoint directory replaced whole; any model's
 *                                   checkpoints (parameters, moments) at any TP, DP, PP size
 *             hf.h model.h          Hugging Face layouts; one handle over every family
 *             trainable.h           one handle at any pipeline size; the trainer's optimizer step
 *                                   over M micro-batches (POSIX; not included here)
 *   plan/     hw.h count.h plan.h   the configuration planner: hardware profiles and the cost
 *                                   model; the counting backend and communicator; the dry runs
 *                                   and the search (POSIX; not included here)
 *   text/     json.h unicode.h      a JSON reader; UTF-8, Unicode classes and NFC (above base/
 *             tokenizer.h           alone): byte-level BPE, Hugging Face's tokenizer files */
#ifndef TPK_TPK_H
#define TPK_TPK_H

#include "base/core.h"
#include "base/rng.h"
#include "base/comm.h"
#include "base/ops.h"
#include "base/ctx.h"
#include "base/env.h"
#include "runtime/op.h"
#include "runtime/buf.h"
#include "runtime/coll.h"
#include "runtime/comm_self.h"
#include "runtime/init.h"
#include "runtime/host.h"
#include "layers/layout.h"
#include "layers/params.h"
#include "layers/act.h"
#include "layers/linear.h"
#include "layers/norm.h"
#include "layers/embed.h"
#include "layers/xent.h"
#include "layers/mlp.h"
#include "layers/attn.h"
#include "layers/cp_split.h"
#include "layers/cp_attn.h"
#include "layers/router.h"
#include "layers/moe.h"
#include "layers/resid.h"
#include "models/block.h"
#include "models/lm.h"
#include "models/sample.h"
#include "models/families.h"
#include "train/optim.h"
#include "train/dp.h"
#include "train/schedule.h"
#include "train/pipeline.h"
#include "train/data.h"
#include "text/tokenizer.h"

#endif /* TPK_TPK_H */
