/* tpk/models/families.h — the kit's model families, each a configuration of the language model
 * (tpk/models/lm.h): GPT-2 (gpt2.h), the Llama family (llama.h), GPT-NeoX (neox.h), Mixtral
 * (mixtral.h: Llama with a mixture of experts), Qwen2-MoE (qwen2_moe.h: Qwen2's attention with
 * a mixture of experts and a shared expert). A family is
 * its header here (its config, its block as a tpk_block_desc, its names) and its Hugging Face
 * config.json keys and checkpoint names in tpk/train/hf.h; the trainer's handle (tpk/train/
 * model.h) lists the families in one table of values. */
#ifndef TPK_FAMILIES_H
#define TPK_FAMILIES_H

#include "gpt2.h"
#include "llama.h"
#include "mixtral.h"
#include "neox.h"
#include "qwen2_moe.h"

#endif /* TPK_FAMILIES_H */
