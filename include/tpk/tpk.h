/* tpk/tpk.h — the umbrella header: everything that needs neither MPI nor CUDA headers.
 * Add <tpk/mpi.h> for the MPI communicator (compile with mpicc). */
#ifndef TPK_TPK_H
#define TPK_TPK_H

#include "core.h"
#include "rng.h"
#include "comm.h"
#include "ops.h"
#include "ctx.h"
#include "coll.h"
#include "layout.h"
#include "params.h"
#include "act.h"
#include "linear.h"
#include "norm.h"
#include "embed.h"
#include "mlp.h"
#include "attn.h"
#include "gpt2.h"

#endif /* TPK_TPK_H */
