/* tpk/models/families.h — the kit's model families, listed once.
 *
 * Each family is a header of this folder over the skeleton (tpk/models/lm.h). TPK__FAMILIES(X)
 * calls X(f, F, type, dropout, title) for each, in tpk_arch order: f the prefix of its types and
 * functions (tpk_f, tpk_f_config, tpk_f_init, tpk_f_flags, ...), F its tpk_arch (TPK_ARCH_F),
 * type its Hugging Face config.json model_type, dropout whether it has dropout sites
 * (tpk_f_set_dropout), title its name in print.
 * The umbrella (tpk/tpk.h) includes the families through this list, the trainer's handle
 * (tpk/train/model.h) makes its enum, its members and its table from it, and the checkpoint
 * reader (tpk/train/hf.h) holds each family's config.json keys and names. Adding a family: its
 * header and a line here (and its Hugging Face reader and writer in tpk/train/hf.h). */
#ifndef TPK_FAMILIES_H
#define TPK_FAMILIES_H

#include "gpt2.h"
#include "llama.h"
#include "neox.h"

#define TPK__FAMILIES(X)                                                                           \
    X(gpt2, GPT2, "gpt2", true, "GPT-2")                                                           \
    X(llama, LLAMA, "llama", false, "Llama")                                                       \
    X(neox, NEOX, "gpt_neox", true, "GPT-NeoX")

#endif /* TPK_FAMILIES_H */
