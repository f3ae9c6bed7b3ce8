/* tpk/train/ckpt.h — checkpoints of any model: every registered parameter (tpk/layers/params.h)
 * and the AdamW moments saved as GLOBAL tensors, loaded at any TP, DP and PP size.
 *
 * A checkpoint directory (replaced whole or not at all: tpk/train/ckpt_dir.h) holds
 *   config.json        the model's own description (tpk_ckpt_save_desc.config: a JSON object the
 *                      model writes and reads back, tpk_ckpt_config_read) with its members
 *                      added: tpk_step, tpk_seed, tpk_checkpoint_id (16 hex digits, random
 *                      per save) and, when the save names one, tpk_run_id (the run the
 *                      checkpoint belongs to: a trainer's loss curve continues only its own)
 *   model.safetensors  every parameter as its global tensor [gshape] (padding rows left out),
 *                      named and laid out as the registry has it, or as a map hook says
 *                      (tpk_ckpt_map_fn: another name, a 2-D weight stored transposed);
 *                      metadata {"format": "pt", "step": N, "tpk_checkpoint_id": ID}
 *   optim.safetensors  when an optimizer is given: "<name>.exp_avg", "<name>.exp_avg_sq", each
 *                      global [gshape] as registered; metadata {"format": "tpk-adamw", "step",
 *                      "tpk_checkpoint_id"}
 *   fp8.safetensors    when an optimizer is given and the context's FP8 recipe scales by delayed
 *                      scaling (ctx->fp8, tpk/layers/fp8.h): each FP8 tensor's
 *                      "<name>.amax_history" [L] (element 0 the latest step's amax) and
 *                      "<name>.scale" [1], names as the recipe registered them ("h.0.attn.qkv.
 *                      input"); metadata {"format": "tpk-fp8", "step", "tpk_checkpoint_id",
 *                      "updates"}. The state is the same on every rank of a stage (its amaxes
 *                      are reduced over TP and DP x CP), so it loads at any TP, DP, CP, PP size.
 * Save (collective over ctx->world): each tensor gathered over TP (tpk_param_gather); the moments
 * whole first (under ZeRO-1 and 2 each rank's slice gathered over DP x CP, ctx->dp_cp); under
 * pipeline stages each stage's leader (TP, CP and DP rank 0) sends its tensors, but the copies
 * another stage holds (pp_copy), to world rank 0, which writes the files into DIR.tpk-new and
 * swaps it in. Every rank returns the same status.
 * Load (every rank reads the files itself; the only communication: the tensors the stages account
 * for, combined over ctx->pp): each rank sets its shard of each of its parameters
 * (tpk_param_scatter), of the moments its ZeRO slice. So a checkpoint saved at (t, d, p) loads at
 * any (t', d', p') whose stages hold the same parameters between them, at any CP size (the
 * weights are replicated over CP: the files do not depend on it), and at any ZeRO stage (the
 * files are the same at every stage; ZeRO-2's gradient slice is not saved). Refused, naming the
 * file and the tensor: a parameter's tensor missing or mis-shaped, a value not finite (a second
 * moment negative), a tensor no parameter accounts for, steps that are not whole numbers or
 * disagree between config.json and the files, checkpoint ids that differ (files of two saves).
 * With an optimizer but no optim.safetensors: opt->step = the checkpoint's step, the moments as
 * they were. With an optimizer and a delayed-scaling recipe: the recipe's histories, scales and
 * update count from fp8.safetensors (a history of another length: its newest min(L, L') amaxes,
 * zeros after them); a tensor of the recipe missing there, or one the recipe (on some stage) has
 * not, refused; no fp8.safetensors: the recipe's state as it was (fresh: s = 1, zero histories;
 * tpk_ckpt_info.has_fp8 lets a trainer say so). A current-scaling recipe or none ignores it. */
#ifndef TPK_CKPT_H
#define TPK_CKPT_H

#include "ckpt_dir.h"
#include "optim.h"
#include "../layers/fp8.h"
#include "../runtime/coll.h"

/* How parameter p is stored in the files: *name (cap bytes, set to p->name before the call) its
 * tensor's name there, *transposed (false before the call) whether a 2-D parameter [out, in] is
 * stored [in, out] (Hugging Face GPT-2's Conv1D). Its moments are "<name>.exp_avg" and
 * "<name>.exp_avg_sq", never transposed. */
typedef void (*tpk_ckpt_map_fn)(void *arg, const tpk_param *p, char *name, size_t cap,
                                bool *transposed);

typedef struct tpk_ckpt_save_desc {
    int64_t step;       /* optimizer steps done: 0..10^18 ("step" metadata, tpk_step) */
    uint64_t seed;      /* tpk_seed in config.json: 0..2^53 (JSON numbers are doubles) */
    const char *config; /* config.json's text: a JSON object without tpk_step, tpk_seed,
                           tpk_checkpoint_id and tpk_run_id (the save adds them); NULL: {} */
    const char *run_id; /* tpk_run_id in config.json: 1..32 of [0-9a-z] naming the run (a
                           resumed run keeps its checkpoint's: tpk_ckpt_info.run_id); NULL or
                           "": none */
    tpk_ckpt_map_fn map; /* NULL: every tensor named and shaped as registered */
    void *map_arg;
} tpk_ckpt_save_desc;

/* A checkpoint's model files: one (model.safetensors) or several with an index naming the file of
 * each tensor (Hugging Face's shards: tpk/train/hf.h). */
typedef struct tpk_ckpt_files {
    int n;
    char (*file)[128];   /* [n] distinct file names in the directory */
    tpk_st_file *st;     /* [n] each read on first use */
    bool *open;          /* [n] */
    int nmap;            /* with an index: tensor[k] lies in file[which[k]]; tensor NULL: no
                            index, every tensor in file[0] */
    char (*tensor)[256];
    int *which;
    const char **byname; /* [nmap] the rows of tensor sorted by name (binary search) */
    char index[64];      /* the index file's name, for messages */
    tpk_allocator al;    /* the arrays': the making context's allocator (tpk_ckpt_files_close's) */
} tpk_ckpt_files;

typedef struct tpk_ckpt_load_desc {
    tpk_ckpt_map_fn map; /* the save's (NULL: names and shapes as registered) */
    void *map_arg;
    const char *alias;   /* a prefix the files' names may also carry ("transformer."); NULL: none */
    bool (*ignore)(void *arg, const char *name); /* a file tensor the model computes itself (a
                            buffer such as a causal mask): neither loaded nor refused; NULL: none */
    void *ignore_arg;
    const char *tied[2]; /* {file tensor, parameter}: a tensor the files may carry beside the
                            parameter the model ties it to; when present it must equal that
                            parameter as loaded (GPT-2's lm_head.weight and wte.weight); NULL:
                            none */
    /* The model files' table from dir (the fn names the caller in errors); NULL:
     * model.safetensors alone. */
    tpk_status (*index)(tpk_ctx *ctx, const char *fn, const char *dir, tpk_ckpt_files *f);
} tpk_ckpt_load_desc;

/* What a checkpoint says about itself: the directory a load reads (dir, or dir.tpk-old left by a
 * save stopped between its renames), whether it holds optim.safetensors and fp8.safetensors, and
 * config.json's
 * tpk_step, tpk_seed, tpk_checkpoint_id and tpk_run_id (0, 0, "" and "" when absent). */
typedef struct tpk_ckpt_info {
    char dir[1100];
    bool has_optim, has_fp8; /* optim.safetensors, fp8.safetensors there */
    int64_t step;
    uint64_t seed;
    char id[64];
    char run_id[33];
} tpk_ckpt_info;

/* ---- shared by save and load ----------------------------------------------------------------- */

static inline void tpk__ckpt_transpose(const float *in, float *out, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) out[j * rows + i] = in[i * cols + j];
}

/* Parameter i's name in the files into name[112] and whether it is stored transposed; an error
 * when the map gives an empty or too long name, or transposes a parameter that is not 2-D. */
static inline tpk_status tpk__ckpt_name(tpk_ctx *ctx, const char *fn, tpk_ckpt_map_fn map,
                                        void *arg, int i, char name[112], bool *transposed) {
    const tpk_param *p = &ctx->params.list[i];
    char buf[160];
    snprintf(buf, sizeof buf, "%s", p->name);
    *transposed = false;
    if (map) map(arg, p, buf, sizeof buf, transposed);
    buf[sizeof buf - 1] = 0;
    size_t n = strlen(buf);
    if (n == 0 || n > 96)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->map: parameter \"%s\": expected a name of 1..96 bytes, got %zu",
                         p->name, n);
    if (*transposed && p->ndim != 2)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->map: parameter \"%s\": only a 2-D parameter is stored transposed, "
                         "it has %d dimensions",
                         p->name, p->ndim);
    memcpy(name, buf, n + 1);
    return TPK_OK;
}

/* opt, when given, made for the context's parameters. */
static inline tpk_status tpk__ckpt_opt(tpk_ctx *ctx, const char *fn, const tpk_adamw *opt) {
    if (opt && (!opt->m || !opt->v))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "opt: expected an initialised optimizer");
    if (opt && opt->numel != ctx->params.numel)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "opt: made for %zu parameter elements, the context has %zu (register the model first)",
            opt->numel, ctx->params.numel);
    return TPK_OK;
}

/* ---- save ------------------------------------------------------------------------------------ */

/* config.json's text: desc's config (a JSON object without the members added here, checked
 * whole) with tpk_step, tpk_seed, tpk_checkpoint_id id and (run not "") tpk_run_id before its
 * closing brace; *out from the context's allocator. */
static inline tpk_status tpk__ckpt_config_text(tpk_ctx *ctx, const char *fn, const char *config,
                                               int64_t step, uint64_t seed, const char *id,
                                               const char *run, char **out) {
    tpk__json root;
    char *arena = NULL;
    *out = NULL;
    if (!config) config = "{}";
    tpk_status s = tpk__json_parse(ctx, "desc->config", config, strlen(config), &root, &arena);
    if (s == TPK_OK && root.type != TPK__JOBJ)
        s = tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->config: expected a JSON object {...}");
    static const char *const ours[] = {"tpk_step", "tpk_seed", "tpk_checkpoint_id", "tpk_run_id"};
    for (int k = 0; k < 4 && s == TPK_OK; k++)
        if (tpk__json_get(&root, ours[k]))
            s = tpk__fail(ctx, TPK_ERR_ARG, fn,
                          "desc->config: holds \"%s\": expected the model's members only (the "
                          "save adds tpk_step, tpk_seed, tpk_checkpoint_id and tpk_run_id)",
                          ours[k]);
    tpk__json_free(&root, &arena);
    if (s != TPK_OK) return s == TPK_ERR_FORMAT ? TPK_ERR_ARG : s;
    size_t end = strlen(config);
    while (end > 1 && config[end - 1] != '}') end--; /* after the closing brace (an object's) */
    end--;                                           /* the brace */
    while (end && strchr(" \t\r\n", config[end - 1])) end--;
    bool empty = end && config[end - 1] == '{'; /* "{}": the three are the only members */
    size_t cap = end + 260;
    char *t = (char *)tpk__malloc(ctx, cap);
    if (!t) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "config.json's text");
    snprintf(t, cap,
             "%.*s%s\n  \"tpk_step\": %lld,\n  \"tpk_seed\": %llu,\n  \"tpk_checkpoint_id\": "
             "\"%s\"%s%.32s%s\n}\n",
             (int)end, config, empty ? "" : ",", (long long)step, (unsigned long long)seed, id,
             *run ? ",\n  \"tpk_run_id\": \"" : "", run, *run ? "\"" : "");
    *out = t;
    return TPK_OK;
}

/* Pipeline stages: host values to or from pp rank `peer` (staged through backend memory where the
 * PP group's communicator takes device buffers). */
static inline tpk_status tpk__ckpt_g_xfer(tpk_ctx *ctx, tpk_comm *g, void *host, size_t n,
                                          tpk_dtype dt, int peer, bool send) {
    size_t bytes = n * tpk_dtype_size(dt);
    if (!g->device || !bytes)
        return send ? tpk_send(ctx, g, host, n, dt, peer, 0)
                    : tpk_recv(ctx, g, host, n, dt, peer, 0);
    TPK_TRY(tpk__buf_reserve(ctx, &ctx->work[1], bytes));
    if (send) TPK_TRY(tpk_op_memcpy(ctx, ctx->work[1].p, host, bytes, TPK_H2D));
    TPK_TRY(send ? tpk_send(ctx, g, ctx->work[1].p, n, dt, peer, 0)
                 : tpk_recv(ctx, g, ctx->work[1].p, n, dt, peer, 0));
    return send ? TPK_OK : tpk_op_memcpy(ctx, host, ctx->work[1].p, bytes, TPK_D2H);
}
static inline tpk_status tpk__ckpt_pp_xfer(tpk_ctx *ctx, void *host, size_t n, tpk_dtype dt,
                                           int peer, bool send) {
    return tpk__ckpt_g_xfer(ctx, &ctx->pp, host, n, dt, peer, send);
}
/* The EP size (expert parallelism: each EP rank holds other experts, tpk_param.expert). */
static inline int tpk__ckpt_ep(const tpk_ctx *ctx) { return ctx->ep.vt ? ctx->ep.size : 1; }

/* A checkpoint's tensors gathered from the pipeline stages: the model's entries and (k3 = 3) the
 * optimizer's, the buffers they point into. */
typedef struct tpk__ckpt_all {
    tpk_st_entry *e; /* [n] model, then [2 n] optimizer when with moments */
    int n;
    char (*names)[3][112];
    int64_t (*shapes)[2][2]; /* the model entry's (maybe transposed) and the optimizer's */
    float **data;            /* [3 n] */
} tpk__ckpt_all;
static inline void tpk__ckpt_all_free(const tpk_ctx *ctx, tpk__ckpt_all *a) {
    for (int i = 0; a->data && i < 3 * a->n; i++) tpk__free(ctx, a->data[i]);
    tpk__free(ctx, a->e), tpk__free(ctx, a->names), tpk__free(ctx, a->shapes);
    tpk__free(ctx, a->data);
    memset(a, 0, sizeof *a);
}
/* Whether parameter i goes to the root: under stages every one but a copy another stage holds
 * (pp_copy); under EP an expert (each EP rank's own). */
static inline bool tpk__ckpt_sent(const tpk_ctx *ctx, int i, bool experts) {
    return experts ? ctx->params.list[i].expert : !ctx->params.list[i].pp_copy;
}
/* Under pipeline stages (ctx->pp.size > 1), the leaders of the stages (TP, CP, DP rank 0) send
 * their entries e[n] (model) and e[n + 2 i + k] (moments, when k3 = 3) — except the copies another
 * stage holds (pp_copy) — to stage 0's leader, world rank 0, which gathers all of them in stage
 * order into *all; the others send nothing. experts (expert parallelism, ctx->ep of size > 1, no
 * stages): the same over ctx->ep, the EP ranks of world rank 0 (TP and CP rank 0, DP rank < ep)
 * sending their experts alone, each under its global name, to world rank 0. Per tensor: its
 * header (ndim, the two shapes, the name), then its data and moments. */
static inline tpk_status tpk__ckpt_save_stages(tpk_ctx *ctx, const char *fn, const tpk_st_entry *e,
                                               int n, int k3, bool experts, tpk__ckpt_all *all) {
    memset(all, 0, sizeof *all);
    tpk_comm *g = experts ? &ctx->ep : &ctx->pp;
    bool lead = ctx->tp.rank == 0 && ctx->cp.rank == 0 &&
                (experts ? ctx->dp.rank / tpk__ckpt_ep(ctx) == 0 && ctx->pp.rank == 0
                         : ctx->dp.rank == 0),
         root = lead && g->rank == 0;
    if (!lead) return TPK_OK;
    enum { HDR = 5 + 28 };
    int32_t hdr[HDR];
    if (!root) { /* a stage's leader: its tensors to the root */
        int32_t cnt = 0;
        for (int i = 0; i < n; i++) cnt += tpk__ckpt_sent(ctx, i, experts);
        TPK_TRY(tpk__ckpt_g_xfer(ctx, g, &cnt, 1, TPK_I32, 0, true));
        for (int i = 0; i < n; i++) {
            if (!tpk__ckpt_sent(ctx, i, experts)) continue;
            const tpk_st_entry *m = &e[i];
            memset(hdr, 0, sizeof hdr);
            hdr[0] = m->ndim, hdr[1] = (int32_t)m->shape[0],
            hdr[2] = m->ndim > 1 ? (int32_t)m->shape[1] : 0;
            hdr[3] = (int32_t)ctx->params.list[i].gshape[0],
            hdr[4] = m->ndim > 1 ? (int32_t)ctx->params.list[i].gshape[1] : 0;
            snprintf((char *)&hdr[5], 112, "%s", m->name);
            TPK_TRY(tpk__ckpt_g_xfer(ctx, g, hdr, HDR, TPK_I32, 0, true));
            size_t gn = (size_t)hdr[1] * (size_t)(m->ndim > 1 ? hdr[2] : 1);
            for (int k = 0; k < k3; k++)
                TPK_TRY(tpk__ckpt_g_xfer(ctx, g, (void *)(k ? e[n + 2 * i + k - 1].data : m->data),
                                         gn, TPK_F32, 0, true));
        }
        return TPK_OK;
    }
    int cap = n + 16; /* the root: its own, then each stage's in turn */
    all->e = (tpk_st_entry *)tpk__calloc(ctx, (size_t)cap * 3, sizeof *all->e);
    all->names = (char(*)[3][112])tpk__calloc(ctx, (size_t)cap, sizeof *all->names);
    all->shapes = (int64_t(*)[2][2])tpk__calloc(ctx, (size_t)cap, sizeof *all->shapes);
    all->data = (float **)tpk__calloc(ctx, (size_t)cap * 3, sizeof *all->data);
    if (!all->e || !all->names || !all->shapes || !all->data)
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the checkpoint's tables");
    tpk_status s = TPK_OK;
    for (int q = 0; q < g->size && s == TPK_OK; q++) {
        int32_t cnt = 0;
        if (q == 0)
            for (int i = 0; i < n; i++) cnt += !ctx->params.list[i].pp_copy;
        else s = tpk__ckpt_g_xfer(ctx, g, &cnt, 1, TPK_I32, q, false);
        for (int i = 0, j = 0; s == TPK_OK && j < cnt; i++) {
            if (q == 0 && ctx->params.list[i].pp_copy) continue;
            j++;
            if (all->n == cap) { /* grow the tables */
                int nc = 2 * cap;
                size_t c = (size_t)cap, m = (size_t)nc;
                tpk_st_entry *ne = (tpk_st_entry *)tpk__realloc(ctx, all->e, sizeof *ne * c * 3,
                                                                sizeof *ne * m * 3);
                if (ne) all->e = ne;
                char(*nn)[3][112] =
                    ne ? (char(*)[3][112])tpk__realloc(ctx, all->names, sizeof *nn * c,
                                                        sizeof *nn * m)
                       : NULL;
                if (nn) all->names = nn;
                int64_t(*ns)[2][2] =
                    nn ? (int64_t(*)[2][2])tpk__realloc(ctx, all->shapes, sizeof *ns * c,
                                                         sizeof *ns * m)
                       : NULL;
                if (ns) all->shapes = ns;
                float **nd = ns ? (float **)tpk__realloc(ctx, all->data, sizeof *nd * c * 3,
                                                         sizeof *nd * m * 3)
                                : NULL;
                if (!nd) {
                    s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the checkpoint's tables");
                    break;
                }
                all->data = nd, cap = nc;
                for (int k = 3 * all->n; k < 3 * cap; k++) all->data[k] = NULL;
            }
            int a = all->n;
            size_t gn;
            if (q == 0) {
                const tpk_param *p = &ctx->params.list[i];
                memset(hdr, 0, sizeof hdr);
                hdr[0] = e[i].ndim, hdr[1] = (int32_t)e[i].shape[0],
                hdr[2] = e[i].ndim > 1 ? (int32_t)e[i].shape[1] : 0;
                hdr[3] = (int32_t)p->gshape[0], hdr[4] = p->ndim > 1 ? (int32_t)p->gshape[1] : 0;
                snprintf((char *)&hdr[5], 112, "%s", e[i].name);
            } else {
                s = tpk__ckpt_g_xfer(ctx, g, hdr, HDR, TPK_I32, q, false);
            }
            if (s != TPK_OK) break;
            ((char *)&hdr[5])[111] = 0;
            gn = (size_t)hdr[1] * (size_t)(hdr[0] > 1 ? hdr[2] : 1);
            all->n++;
            for (int k = 0; k < k3 && s == TPK_OK; k++) {
                float *d = (float *)tpk__malloc(ctx, sizeof(float) * gn);
                all->data[3 * a + k] = d;
                if (!d) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
                else if (q == 0)
                    memcpy(d, k ? e[n + 2 * i + k - 1].data : e[i].data, sizeof(float) * gn);
                else s = tpk__ckpt_g_xfer(ctx, g, d, gn, TPK_F32, q, false);
            }
            snprintf(all->names[a][0], 112, "%.111s", (char *)&hdr[5]);
            for (int k = 1; k < 3; k++)
                snprintf(all->names[a][k], 112, "%.96s.%s", (char *)&hdr[5],
                         k == 2 ? "exp_avg_sq" : "exp_avg");
            all->shapes[a][0][0] = hdr[1], all->shapes[a][0][1] = hdr[2];
            all->shapes[a][1][0] = hdr[3], all->shapes[a][1][1] = hdr[4];
        }
    }
    if (s != TPK_OK) return s;
    tpk_st_entry *m = all->e; /* the model's entries, then the moments' */
    for (int a = 0; a < all->n; a++) {
        m[a].name = all->names[a][0], m[a].dtype = TPK_ST_F32,
        m[a].ndim = all->shapes[a][0][1] ? 2 : 1;
        m[a].shape = all->shapes[a][0], m[a].data = all->data[3 * a];
        for (int k = 0; k < 2 && k3 == 3; k++) {
            tpk_st_entry *o = &m[all->n + 2 * a + k];
            o->name = all->names[a][1 + k], o->dtype = TPK_ST_F32, o->ndim = m[a].ndim;
            o->shape = all->shapes[a][1], o->data = all->data[3 * a + 1 + k];
        }
    }
    return TPK_OK;
}

/* ---- the FP8 recipe's state (fp8.safetensors) ----------------------------------------------- */

/* Whether a save or load with an optimizer keeps the context's FP8 state: a delayed-scaling recipe
 * (current scaling keeps none). */
static inline bool tpk__ckpt_fp8_on(const tpk_ctx *ctx) {
    return ctx->fp8 && ctx->fp8->d.scaling == TPK_FP8_DELAYED;
}

/* Every stage's FP8 state, gathered on world rank 0 for fp8.safetensors: n tensors' names, their
 * histories [n, L] and scales [n], and the entries (2 n: history, scale) pointing into them. */
typedef struct tpk__ckpt_fp8 {
    int n, cap;
    int64_t L, updates, shape_h[1], shape_s[1];
    char (*names)[2][112];
    float *hist, *scale;
    tpk_st_entry *e;
} tpk__ckpt_fp8;
static inline void tpk__ckpt_fp8_free(const tpk_ctx *ctx, tpk__ckpt_fp8 *g) {
    tpk__free(ctx, g->names), tpk__free(ctx, g->hist), tpk__free(ctx, g->scale);
    tpk__free(ctx, g->e);
    memset(g, 0, sizeof *g);
}
/* Room for m more tensors in g. */
static inline tpk_status tpk__ckpt_fp8_grow(tpk_ctx *ctx, const char *fn, tpk__ckpt_fp8 *g, int m) {
    if (g->n + m <= g->cap) return TPK_OK;
    size_t c = (size_t)g->cap, nc = (size_t)(g->n + m) * 2 + 16, L = (size_t)g->L;
    char(*nn)[2][112] =
        (char(*)[2][112])tpk__realloc(ctx, g->names, sizeof *nn * c, sizeof *nn * nc);
    if (nn) g->names = nn;
    float *h = nn ? (float *)tpk__realloc(ctx, g->hist, sizeof(float) * L * c,
                                          sizeof(float) * L * nc)
                  : NULL;
    if (h) g->hist = h;
    float *sc = h ? (float *)tpk__realloc(ctx, g->scale, sizeof(float) * c, sizeof(float) * nc)
                  : NULL;
    if (sc) g->scale = sc;
    if (!sc) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the FP8 state of %zu tensors", nc);
    g->cap = (int)nc;
    return TPK_OK;
}
/* The FP8 state of every stage into *g on world rank 0 (the stages' leaders, TP, CP and DP rank 0,
 * send theirs: the count and history length, the names, histories and scales); the others leave
 * g empty. Collective over the stages' leaders. */
static inline tpk_status tpk__ckpt_fp8_gather(tpk_ctx *ctx, const char *fn, tpk__ckpt_fp8 *g) {
    memset(g, 0, sizeof *g);
    const tpk_fp8 *f = ctx->fp8;
    bool lead = ctx->tp.rank == 0 && ctx->cp.rank == 0 && ctx->dp.rank == 0,
         root = lead && ctx->pp.rank == 0;
    if (!lead) return TPK_OK;
    int32_t hdr[2] = {f->n, f->d.history};
    if (!root) {
        TPK_TRY(tpk__ckpt_pp_xfer(ctx, hdr, 2, TPK_I32, 0, true));
        if (!f->n) return TPK_OK;
        TPK_TRY(tpk__ckpt_pp_xfer(ctx, f->names, (size_t)f->n * 24, TPK_I32, 0, true));
        TPK_TRY(tpk__ckpt_pp_xfer(ctx, f->hist, (size_t)f->n * (size_t)f->d.history, TPK_F32, 0,
                                  true));
        return tpk__ckpt_pp_xfer(ctx, f->scale, (size_t)f->n, TPK_F32, 0, true);
    }
    g->L = f->d.history, g->updates = f->steps;
    char(*nm)[96] = NULL;
    tpk_status s = TPK_OK;
    for (int q = 0; q < ctx->pp.size && s == TPK_OK; q++) {
        if (q) s = tpk__ckpt_pp_xfer(ctx, hdr, 2, TPK_I32, q, false);
        if (s == TPK_OK && hdr[1] != g->L)
            s = tpk__fail(ctx, TPK_ERR_ARG, fn,
                          "ctx->fp8: stage %d's amax history has %d steps, stage 0's %lld (the "
                          "same recipe on every stage)",
                          q, (int)hdr[1], (long long)g->L);
        if (s == TPK_OK) s = tpk__ckpt_fp8_grow(ctx, fn, g, hdr[0]);
        if (s != TPK_OK || !hdr[0]) continue;
        size_t m = (size_t)hdr[0], L = (size_t)g->L;
        float *h = g->hist + (size_t)g->n * L, *sc = g->scale + g->n;
        if (q == 0) {
            nm = f->names;
            memcpy(h, f->hist, sizeof(float) * m * L), memcpy(sc, f->scale, sizeof(float) * m);
        } else {
            nm = (char(*)[96])tpk__malloc(ctx, 96 * m);
            s = nm ? tpk__ckpt_pp_xfer(ctx, nm, m * 24, TPK_I32, q, false)
                   : tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu names", m);
            if (s == TPK_OK) s = tpk__ckpt_pp_xfer(ctx, h, m * L, TPK_F32, q, false);
            if (s == TPK_OK) s = tpk__ckpt_pp_xfer(ctx, sc, m, TPK_F32, q, false);
        }
        for (size_t i = 0; i < m && s == TPK_OK; i++) {
            nm[i][95] = 0;
            snprintf(g->names[g->n + (int)i][0], 112, "%s.amax_history", nm[i]);
            snprintf(g->names[g->n + (int)i][1], 112, "%s.scale", nm[i]);
        }
        if (q) tpk__free(ctx, nm);
        if (s == TPK_OK) g->n += (int)m;
    }
    if (s == TPK_OK && !(g->e = (tpk_st_entry *)tpk__calloc(ctx, 2 * (size_t)g->n + 1,
                                                            sizeof *g->e)))
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the FP8 state's entries");
    g->shape_h[0] = g->L, g->shape_s[0] = 1;
    for (int i = 0; i < g->n && s == TPK_OK; i++) {
        tpk_st_entry *e = &g->e[2 * i];
        e[0].name = g->names[i][0], e[0].dtype = TPK_ST_F32, e[0].ndim = 1;
        e[0].shape = g->shape_h, e[0].data = g->hist + (size_t)i * (size_t)g->L;
        e[1].name = g->names[i][1], e[1].dtype = TPK_ST_F32, e[1].ndim = 1;
        e[1].shape = g->shape_s, e[1].data = g->scale + i;
    }
    if (s != TPK_OK) tpk__ckpt_fp8_free(ctx, g);
    return s;
}

/* World rank 0's part of a save: the files (the optimizer file when nopt > 0, the FP8 state's when
 * f8 holds entries, the model file, then config.json, text, last) into p->tmp, each stamped with
 * step and the checkpoint id; then swapped in for p->base (tpk_ckpt_commit). */
static inline tpk_status tpk__ckpt_write(tpk_ctx *ctx, const char *fn, const tpk_ckpt_paths *p,
                                         const tpk_st_entry *e, int n, int nopt,
                                         const tpk__ckpt_fp8 *f8, int64_t step, const char *id,
                                         const char *text) {
    char path[1100], stepstr[32], upd[32];
    snprintf(stepstr, sizeof stepstr, "%lld", (long long)step);
    snprintf(upd, sizeof upd, "%lld", (long long)f8->updates);
    const char *meta[] = {"format", "pt", "step", stepstr, "tpk_checkpoint_id", id, NULL};
    const char *ometa[] = {"format", "tpk-adamw", "step", stepstr, "tpk_checkpoint_id", id, NULL};
    const char *fmeta[] = {"format",  "tpk-fp8", "step", stepstr, "tpk_checkpoint_id",
                           id,        "updates", upd,    NULL};
    snprintf(path, sizeof path, "%s/optim.safetensors", p->tmp);
    if (nopt) TPK_TRY(tpk_st_write(ctx, path, e + n, nopt, ometa));
    snprintf(path, sizeof path, "%s/fp8.safetensors", p->tmp);
    if (f8->e) TPK_TRY(tpk_st_write(ctx, path, f8->e, 2 * f8->n, fmeta));
    snprintf(path, sizeof path, "%s/model.safetensors", p->tmp);
    TPK_TRY(tpk_st_write(ctx, path, e, n, meta));
    snprintf(path, sizeof path, "%s/config.json", p->tmp);
    TPK_TRY(tpk__ckpt_write_text(ctx, fn, path, text));
    return tpk__ckpt_commit(ctx, fn, p);
}

/* Save every registered parameter (and opt's moments when opt is not NULL) to dir, replacing what
 * dir held as one checkpoint, with config.json's text made from desc (NULL: step 0, seed 0, {},
 * no map). fn names the caller in errors. Collective over ctx->world. */
static inline tpk_status tpk__ckpt_save(tpk_ctx *ctx, const char *fn, const tpk_adamw *opt,
                                        const char *dir, const tpk_ckpt_save_desc *desc) {
    if (!ctx) return TPK_ERR_ARG;
    tpk_ckpt_save_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (!dir) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dir: NULL");
    if (d.step < 0 || d.step > (int64_t)1000000000000000000LL)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->step: expected 0..10^18, got %lld",
                         (long long)d.step);
    if (d.seed > ((uint64_t)1 << 53))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->seed: expected 0..2^53 (config.json's numbers are doubles), got "
                         "%llu",
                         (unsigned long long)d.seed);
    size_t rn = d.run_id ? strlen(d.run_id) : 0;
    for (size_t i = 0; i < rn; i++)
        if (rn > 32 || !((d.run_id[i] >= '0' && d.run_id[i] <= '9') ||
                         (d.run_id[i] >= 'a' && d.run_id[i] <= 'z')))
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "desc->run_id: expected 1..32 of [0-9a-z] (or NULL), got \"%.40s\"",
                             d.run_id);
    TPK_TRY(tpk__ckpt_opt(ctx, fn, opt));
    bool root = ctx->world->rank == 0, made = false;
    tpk_ckpt_paths p;
    TPK_TRY(tpk__ckpt_paths_of(ctx, fn, dir, &p));
    char id[17] = "", *text = NULL;
    if (root) tpk_ckpt_new_id(id); /* the only writer: the id is rank 0's */
    TPK_TRY(tpk__ckpt_config_text(ctx, fn, d.config, d.step, d.seed, id, rn ? d.run_id : "",
                                  &text));
    int n = ctx->params.n, k3 = opt ? 3 : 1;
    float **w = (float **)tpk__calloc(ctx, (size_t)n * 3 + 1, sizeof *w);
    tpk_st_entry *e = (tpk_st_entry *)tpk__calloc(ctx, (size_t)n * 3 + 1, sizeof *e);
    int64_t(*shapes)[2] = (int64_t(*)[2])tpk__calloc(ctx, (size_t)n + 1, sizeof *shapes);
    char(*names)[3][112] = (char(*)[3][112])tpk__calloc(ctx, (size_t)n + 1, sizeof *names);
    tpk_status s = w && e && shapes && names
                       ? TPK_OK
                       : tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the checkpoint's tables");
    for (int i = 0; i < n && s == TPK_OK; i++) { /* the names first: a bad map fails everywhere */
        bool tr = false;
        s = tpk__ckpt_name(ctx, fn, d.map, d.map_arg, i, names[i][0], &tr);
        shapes[i][0] = tr ? 1 : 0; /* remembered until the tensors are gathered */
    }
    if (s == TPK_OK && root) s = tpk__ckpt_begin(ctx, fn, dir, &p);
    tpk_status all = tpk_agree(ctx, ctx->world, s);
    if (all != TPK_OK) {
        tpk__free(ctx, w), tpk__free(ctx, e), tpk__free(ctx, shapes), tpk__free(ctx, names);
        tpk__free(ctx, text);
        return s != TPK_OK ? s
                           : tpk__fail(ctx, all, fn, "%s: cannot start the save on world rank 0",
                                       dir);
    }
    float *om = NULL, *ov = NULL; /* the whole moments (ZeRO-1: gathered over DP) */
    if (opt) s = tpk__adamw_whole(ctx, opt, true, &om, &ov, &made);
    for (int i = 0; i < n && s == TPK_OK; i++) {
        const tpk_param *pr = &ctx->params.list[i];
        size_t gn = tpk_param_global_numel(ctx, i);
        const float *flat[3] = {(const float *)ctx->params.data.p, om, ov};
        bool tr = shapes[i][0] != 0;
        for (int k = 0; k < k3 && s == TPK_OK; k++) {
            if (!(w[3 * i + k] = (float *)tpk__malloc(ctx, sizeof(float) * gn)))
                s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
            else s = tpk_param_gather(ctx, i, flat[k], w[3 * i + k]); /* collective over TP */
        }
        if (s != TPK_OK) break;
        if (tr) { /* stored [in, out] in the model file */
            float *t = (float *)tpk__malloc(ctx, sizeof(float) * gn);
            if (!t) { s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn); break; }
            tpk__ckpt_transpose(w[3 * i], t, pr->gshape[0], pr->gshape[1]);
            tpk__free(ctx, w[3 * i]), w[3 * i] = t;
            shapes[i][0] = pr->gshape[1], shapes[i][1] = pr->gshape[0];
        } else {
            shapes[i][0] = pr->gshape[0], shapes[i][1] = pr->ndim > 1 ? pr->gshape[1] : 0;
        }
        e[i].name = names[i][0], e[i].dtype = TPK_ST_F32, e[i].ndim = pr->ndim,
        e[i].shape = shapes[i], e[i].data = w[3 * i];
        for (int k = 0; k < 2 && opt; k++) {
            char base[112]; /* a copy: the moment's name is formed in the same array */
            memcpy(base, names[i][0], sizeof base);
            snprintf(names[i][1 + k], sizeof names[i][1 + k], "%.96s.%s", base,
                     k ? "exp_avg_sq" : "exp_avg");
            tpk_st_entry *o = &e[n + 2 * i + k];
            o->name = names[i][1 + k], o->dtype = TPK_ST_F32, o->ndim = pr->ndim,
            o->shape = pr->gshape, o->data = w[3 * i + 1 + k];
        }
    }
    tpk__ckpt_all staged; /* under pipeline stages: every stage's tensors, on world rank 0 */
    memset(&staged, 0, sizeof staged);
    bool gathered = ctx->pp.size > 1 || tpk__ckpt_ep(ctx) > 1; /* the others' tensors too */
    if (gathered) { /* once every rank has its own */
        s = tpk_agree(ctx, ctx->world, s);
        if (s == TPK_OK)
            s = tpk__ckpt_save_stages(ctx, fn, e, n, k3, ctx->pp.size == 1, &staged);
    }
    tpk__ckpt_fp8 f8; /* the FP8 recipe's state (delayed scaling), every stage's, on rank 0 */
    memset(&f8, 0, sizeof f8);
    if (s == TPK_OK && opt && tpk__ckpt_fp8_on(ctx)) s = tpk__ckpt_fp8_gather(ctx, fn, &f8);
    if (s == TPK_OK && root)
        s = gathered ? tpk__ckpt_write(ctx, fn, &p, staged.e, staged.n,
                                               opt ? 2 * staged.n : 0, &f8, d.step, id, text)
                             : tpk__ckpt_write(ctx, fn, &p, e, n, opt ? 2 * n : 0, &f8, d.step,
                                               id, text);
    tpk__ckpt_all_free(ctx, &staged), tpk__ckpt_fp8_free(ctx, &f8);
    if (s != TPK_OK && root) tpk__ckpt_remove(NULL, fn, p.tmp, NULL); /* never swapped in */
    for (int i = 0; w && i < 3 * n; i++) tpk__free(ctx, w[i]);
    tpk__free(ctx, w), tpk__free(ctx, e), tpk__free(ctx, shapes), tpk__free(ctx, names);
    tpk__free(ctx, text);
    if (made) tpk_op_free(ctx, om), tpk_op_free(ctx, ov);
    all = tpk_agree(ctx, ctx->world, s);
    if (all != TPK_OK && s == TPK_OK)
        return tpk__fail(ctx, all, fn, "%s: writing the checkpoint failed on another rank", dir);
    return s;
}
static inline tpk_status tpk_ckpt_save(tpk_ctx *ctx, const tpk_adamw *opt, const char *dir,
                                       const tpk_ckpt_save_desc *desc) {
    return tpk__ckpt_save(ctx, "tpk_ckpt_save", opt, dir, desc);
}

/* ---- load ------------------------------------------------------------------------------------ */

static inline void tpk_ckpt_files_close(tpk_ckpt_files *f) {
    if (!f) return;
    for (int i = 0; f->open && i < f->n; i++)
        if (f->open[i]) tpk_st_close(&f->st[i]);
    tpk_allocator al = f->al;
    tpk__al_free(&al, f->file), tpk__al_free(&al, f->st), tpk__al_free(&al, f->open);
    tpk__al_free(&al, f->tensor), tpk__al_free(&al, f->which), tpk__al_free(&al, (void *)f->byname);
    memset(f, 0, sizeof *f);
}
/* The table of one model file, `name` (no index). */
static inline tpk_status tpk__ckpt_single(tpk_ctx *ctx, const char *fn, const char *name,
                                          tpk_ckpt_files *f) {
    memset(f, 0, sizeof *f);
    f->al = tpk__allocator(ctx);
    f->n = 1, f->file = (char(*)[128])tpk__calloc(ctx, 1, 128),
    f->st = (tpk_st_file *)tpk__calloc(ctx, 1, sizeof *f->st),
    f->open = (bool *)tpk__calloc(ctx, 1, 1);
    if (!f->file || !f->st || !f->open) {
        tpk_ckpt_files_close(f);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the file table");
    }
    snprintf(f->file[0], 128, "%s", name);
    return TPK_OK;
}
/* f's file q read (once). */
static inline tpk_status tpk__ckpt_open(tpk_ctx *ctx, const char *dir, tpk_ckpt_files *f, int q) {
    if (f->open[q]) return TPK_OK;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, f->file[q]);
    TPK_TRY(tpk_st_read(ctx, path, &f->st[q]));
    f->open[q] = true;
    return TPK_OK;
}
/* The tensor `name` of dir's model files (*t NULL if absent); *file its file. */
static inline tpk_status tpk__ckpt_find(tpk_ctx *ctx, const char *fn, const char *dir,
                                        tpk_ckpt_files *f, const char *name,
                                        const tpk_st_tensor **t, tpk_st_file **file) {
    int q = 0;
    *t = NULL;
    if (f->tensor) { /* sharded: the index names the file */
        int lo = 0, hi = f->nmap, k = -1;
        while (lo < hi && k < 0) {
            int mid = lo + (hi - lo) / 2, c = strcmp(f->byname[mid], name);
            if (!c)
                k = (int)((const char(*)[256])(const void *)f->byname[mid] -
                          (const char(*)[256])f->tensor); /* its row */
            else if (c < 0) lo = mid + 1;
            else hi = mid;
        }
        if (k < 0) return TPK_OK;
        q = f->which[k];
    }
    TPK_TRY(tpk__ckpt_open(ctx, dir, f, q));
    *t = tpk_st_find(&f->st[q], name), *file = &f->st[q];
    if (!*t && f->tensor)
        return tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s/%s: no tensor \"%s\" (%s puts it there)",
                         dir, f->file[q], name, f->index);
    return TPK_OK;
}

/* A step as written in a checkpoint ("step" metadata, tpk_step): a whole number 0..10^18 in
 * decimal digits, nothing else. */
static inline bool tpk__ckpt_step_text(const char *t, int64_t *out) {
    int64_t v = 0;
    if (!t || !*t || strlen(t) > 18) return false;
    for (const char *c = t; *c; c++) {
        if (*c < '0' || *c > '9') return false;
        v = 10 * v + (*c - '0');
    }
    *out = v;
    return true;
}

/* What a checkpoint's files say about themselves: a file's name, its step and its checkpoint id
 * (each NULL when the file does not say). */
typedef struct tpk__ckpt_stamp {
    const char *file, *key, *step, *id; /* key: the step's name there ("step", "tpk_step") */
} tpk__ckpt_stamp;

/* The stamps of one checkpoint's files (config.json first) must agree: each step a whole number,
 * every step given the same, every id given the same, and an id in every file or in none (files
 * without any id: Hugging Face's, older tpk's, accepted; some with and one without: files of two
 * saves, refused). *step: the step they give (0 when none does). */
static inline tpk_status tpk__ckpt_stamps_agree(tpk_ctx *ctx, const char *fn, const char *dir,
                                                const tpk__ckpt_stamp *st, int n, int64_t *step) {
    int first_step = -1, first_id = -1, no_id = -1;
    *step = 0;
    for (int k = 0; k < n; k++) {
        if (st[k].step) {
            int64_t v;
            if (!tpk__ckpt_step_text(st[k].step, &v))
                return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                                 "%s/%s: %s \"%.40s\": expected a whole number", dir, st[k].file,
                                 st[k].key, st[k].step);
            if (first_step < 0) first_step = k, *step = v;
            else if (strcmp(st[k].step, st[first_step].step))
                return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                                 "%s: %s (%s %s) does not belong to %s (%s %s)", dir, st[k].file,
                                 st[k].key, st[k].step, st[first_step].file, st[first_step].key,
                                 st[first_step].step);
        }
        if (st[k].id) {
            if (first_id < 0) first_id = k;
            else if (strcmp(st[k].id, st[first_id].id))
                return tpk__fail(
                    ctx, TPK_ERR_FORMAT, fn,
                    "%s: %s (tpk_checkpoint_id %.40s) does not belong to %s (tpk_checkpoint_id "
                    "%.40s): files of two checkpoints",
                    dir, st[k].file, st[k].id, st[first_id].file, st[first_id].id);
        } else if (no_id < 0) no_id = k;
        if (first_id >= 0 && no_id >= 0)
            return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                             "%s: %s has no tpk_checkpoint_id and %s has %.40s: files of two "
                             "checkpoints (only a checkpoint with no id in any file loads as an "
                             "older one)",
                             dir, st[no_id].file, st[first_id].file, st[first_id].id);
    }
    return TPK_OK;
}

/* The first element of w[n] that is not finite (or, `nonneg`, negative) as an error naming the
 * tensor `name` of `file` and the element; TPK_OK when there is none. */
static inline tpk_status tpk__ckpt_finite(tpk_ctx *ctx, const char *fn, const char *file,
                                          const char *name, const float *w, size_t n,
                                          bool nonneg) {
    for (size_t j = 0; j < n; j++)
        if (!isfinite(w[j]) || (nonneg && w[j] < 0))
            return tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                             "%s: tensor \"%s\": element %zu is %g: expected a finite%s value",
                             file, name, j, (double)w[j], nonneg ? ", non-negative" : "");
    return TPK_OK;
}

/* config.json's members of ours, read from its text b[n] (path names it): each a valid value or
 * absent, none twice. */
typedef struct tpk__ckpt_config {
    bool has_step, has_id, has_seed, has_run;
    char step[24]; /* tpk_step in decimal digits */
    int64_t stepv;
    uint64_t seed;
    char id[64];
    char run[33];
} tpk__ckpt_config;
static inline tpk_status tpk__ckpt_config_read(tpk_ctx *ctx, const char *fn, const char *path,
                                               const uint8_t *b, size_t n, tpk__ckpt_config *c) {
    tpk__json root;
    char *arena = NULL;
    memset(c, 0, sizeof *c);
    tpk_status s = tpk__json_parse(ctx, path, (const char *)b, n, &root, &arena);
    if (s == TPK_OK && root.type != TPK__JOBJ)
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: expected a JSON object", path);
    static const char *const keys[] = {"tpk_step", "tpk_seed", "tpk_checkpoint_id", "tpk_run_id"};
    for (int k = 0; k < 4 && s == TPK_OK; k++) {
        int times = 0;
        for (size_t i = 0; i < root.len; i++) times += !strcmp(root.kids[i].key, keys[k]);
        if (times > 1)
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: %s appears %d times", path, keys[k], times);
    }
    const tpk__json *v = s == TPK_OK ? tpk__json_get(&root, "tpk_step") : NULL;
    if (v && !tpk__json_int(v, 0, 1e18, &c->stepv))
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: tpk_step: expected a whole number", path);
    else if (v) c->has_step = true, snprintf(c->step, sizeof c->step, "%lld", (long long)c->stepv);
    v = s == TPK_OK ? tpk__json_get(&root, "tpk_seed") : NULL;
    int64_t seed = 0;
    if (v && !tpk__json_int(v, 0, 9007199254740992.0, &seed))
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: tpk_seed: expected a whole number 0..2^53",
                      path);
    else if (v) c->has_seed = true, c->seed = (uint64_t)seed;
    v = s == TPK_OK ? tpk__json_get(&root, "tpk_checkpoint_id") : NULL;
    if (v && (v->type != TPK__JSTR || v->len >= sizeof c->id || strlen(v->str) != v->len))
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                      "%s: tpk_checkpoint_id: expected a string of at most %zu bytes", path,
                      sizeof c->id - 1);
    else if (v) c->has_id = true, snprintf(c->id, sizeof c->id, "%s", v->str);
    v = s == TPK_OK ? tpk__json_get(&root, "tpk_run_id") : NULL;
    if (v && (v->type != TPK__JSTR || v->len == 0 || v->len >= sizeof c->run ||
              strlen(v->str) != v->len || strspn(v->str, "0123456789abcdefghijklmnopqrstuvwxyz") !=
                                              v->len))
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                      "%s: tpk_run_id: expected a string of 1..%zu of [0-9a-z]", path,
                      sizeof c->run - 1);
    else if (v) c->has_run = true, snprintf(c->run, sizeof c->run, "%s", v->str);
    tpk__json_free(&root, &arena);
    return s;
}
/* dir's config.json (of the checkpoint dir holds: tpk_ckpt_resolve) read and its members of ours
 * into *c; info, when not NULL, filled. */
static inline tpk_status tpk__ckpt_info(tpk_ctx *ctx, const char *fn, const char *dir,
                                        tpk__ckpt_config *c, tpk_ckpt_info *info) {
    tpk_ckpt_info in;
    char path[1200];
    uint8_t *b = NULL;
    size_t n = 0;
    memset(&in, 0, sizeof in);
    TPK_TRY(tpk_ckpt_resolve(ctx, dir, in.dir, sizeof in.dir));
    snprintf(path, sizeof path, "%s/config.json", in.dir);
    TPK_TRY(tpk__read_file(ctx, fn, path, &b, &n));
    tpk_status s = tpk__ckpt_config_read(ctx, fn, path, b, n, c);
    tpk__free(ctx, b);
    TPK_TRY(s);
    in.step = c->stepv, in.seed = c->seed;
    snprintf(in.id, sizeof in.id, "%s", c->id);
    snprintf(in.run_id, sizeof in.run_id, "%s", c->run);
    snprintf(path, sizeof path, "%s/optim.safetensors", in.dir);
    in.has_optim = access(path, F_OK) == 0;
    snprintf(path, sizeof path, "%s/fp8.safetensors", in.dir);
    in.has_fp8 = access(path, F_OK) == 0;
    if (info) *info = in;
    return TPK_OK;
}

/* What dir's checkpoint says about itself (tpk_ckpt_info); config.json's tpk_ members checked.
 * One rank, no communication (a trainer says from it that the optimizer state starts fresh). */
static inline tpk_status tpk_ckpt_info_read(tpk_ctx *ctx, const char *dir, tpk_ckpt_info *out) {
    static const char *fn = "tpk_ckpt_info_read";
    tpk__ckpt_config c;
    if (!ctx) return TPK_ERR_ARG;
    if (!dir || !out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !dir ? "dir" : "out");
    memset(out, 0, sizeof *out);
    return tpk__ckpt_info(ctx, fn, dir, &c, out);
}

/* config.json's whole text of dir's checkpoint (tpk_ckpt_resolve) into *text (NUL-terminated,
 * from the context's allocator: tpk_free(ctx, *text)) and *n bytes (n may be NULL): the model's
 * description, read before the model is built. One rank, no communication. */
static inline tpk_status tpk_ckpt_config_read(tpk_ctx *ctx, const char *dir, char **text,
                                              size_t *n) {
    static const char *fn = "tpk_ckpt_config_read";
    char d[1100], path[1200];
    uint8_t *b = NULL;
    size_t len = 0;
    if (!ctx) return TPK_ERR_ARG;
    if (!text) return tpk__fail(ctx, TPK_ERR_ARG, fn, "text: NULL");
    *text = NULL;
    if (n) *n = 0;
    TPK_TRY(tpk_ckpt_resolve(ctx, dir, d, sizeof d));
    snprintf(path, sizeof path, "%s/config.json", d);
    TPK_TRY(tpk__read_file(ctx, fn, path, &b, &len));
    char *t = (char *)tpk__realloc(ctx, b, len, len + 1);
    if (!t) {
        tpk__free(ctx, b);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%s: %zu bytes", path, len + 1);
    }
    t[len] = 0, *text = t;
    if (n) *n = len;
    return TPK_OK;
}

/* Every tensor of dir's model files (each name in the index, or the one file's) and of the
 * optimizer file (of, when given: "<name>.exp_avg" and ".exp_avg_sq") accounted for by the model
 * (its parameters' names in the files, names[n], sorted here; also under desc's alias; desc's
 * ignored buffers and tied tensor), else an error naming the first that is not. Under pipeline
 * stages a tensor is accounted for when some stage has it: each stage marks its own, and the
 * marks are combined over ctx->pp (a collective: every rank calls it, `mine` its status so far,
 * which it returns when failing). */
static inline tpk_status tpk__ckpt_all_known(tpk_ctx *ctx, const char *fn, const char *dir,
                                             tpk_ckpt_files *files, const tpk_st_file *of,
                                             const tpk_ckpt_load_desc *d, char (*names)[112],
                                             tpk_status mine) {
    int n = ctx->params.n, nopt = of ? of->n : 0;
    tpk_status s = mine;
    if (s == TPK_OK && !files->tensor) s = tpk__ckpt_open(ctx, dir, files, 0);
    int total = s != TPK_OK ? 0 : files->tensor ? files->nmap : files->st[0].n;
    const char **sorted = (const char **)tpk__malloc(ctx, sizeof(char *) * (size_t)n);
    /* the marks: the same count on every stage (0 for a failed one, which then takes part) */
    int32_t cnt[2] = {total, nopt}, *known = NULL;
    if (ctx->pp.size > 1) {
        tpk_status c = tpk_allreduce_host(ctx, &ctx->pp, cnt, 2, TPK_I32, TPK_MAX);
        if (s == TPK_OK) s = c;
    }
    if (tpk__ckpt_ep(ctx) > 1) { /* the EP ranks likewise (each marks its own experts) */
        tpk_status c = tpk_allreduce_host(ctx, &ctx->ep, cnt, 2, TPK_I32, TPK_MAX);
        if (s == TPK_OK) s = c;
    }
    known = (int32_t *)tpk__calloc(ctx, (size_t)(cnt[0] + cnt[1] + 1), sizeof(int32_t));
    if ((!sorted || !known) && s == TPK_OK)
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the parameter names");
    if (s == TPK_OK && (cnt[0] != total || cnt[1] != nopt))
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: the stages read different files", dir);
    for (int i = 0; s == TPK_OK && i < n; i++) sorted[i] = names[i];
    if (s == TPK_OK && n > 1) qsort(sorted, (size_t)n, sizeof *sorted, tpk__st_strcmp);
    size_t la = d->alias ? strlen(d->alias) : 0;
    for (int k = 0; s == TPK_OK && k < total; k++) {
        const char *name = files->tensor ? files->tensor[k] : files->st[0].tensors[k].name,
                   *bare = la && !strncmp(name, d->alias, la) ? name + la : name;
        known[k] = (d->ignore && d->ignore(d->ignore_arg, name)) ||
                   (d->tied[0] && !strcmp(bare, d->tied[0])) ||
                   bsearch(&bare, sorted, (size_t)n, sizeof *sorted, tpk__st_strcmp) != NULL;
    }
    for (int k = 0; s == TPK_OK && k < nopt; k++) {
        char base[256];
        const char *name = of->tensors[k].name, *dot = strrchr(name, '.');
        snprintf(base, sizeof base, "%.*s", dot ? (int)(dot - name) : 0, name);
        const char *key = base;
        known[total + k] = dot && (!strcmp(dot, ".exp_avg") || !strcmp(dot, ".exp_avg_sq")) &&
                           bsearch(&key, sorted, (size_t)n, sizeof *sorted, tpk__st_strcmp);
    }
    if (ctx->pp.size > 1 && known) { /* every rank of the pipeline takes part, failed or not */
        tpk_status c = tpk_allreduce_host(ctx, &ctx->pp, known, (size_t)(cnt[0] + cnt[1]),
                                          TPK_I32, TPK_MAX);
        if (s == TPK_OK) s = c;
    }
    if (tpk__ckpt_ep(ctx) > 1 && known) { /* an expert: known to the EP rank holding it */
        tpk_status c = tpk_allreduce_host(ctx, &ctx->ep, known, (size_t)(cnt[0] + cnt[1]),
                                          TPK_I32, TPK_MAX);
        if (s == TPK_OK) s = c;
    }
    const char *extra = NULL, *where = files->tensor ? files->index : files->file[0];
    for (int k = 0; s == TPK_OK && k < total + nopt && !extra; k++)
        if (!known[k]) {
            extra = k < total ? (files->tensor ? files->tensor[k] : files->st[0].tensors[k].name)
                              : of->tensors[k - total].name;
            if (k >= total) where = "optim.safetensors";
        }
    tpk__free(ctx, sorted), tpk__free(ctx, known);
    if (s == TPK_OK && extra)
        return tpk__fail(
            ctx, TPK_ERR_FORMAT, fn,
            "%s/%s: tensor \"%s\" is not a parameter of the model config.json describes (a layer "
            "beyond its count, a head it ties?)",
            dir, where, extra);
    return s;
}

/* The tensor d->tied[0], when the files carry it, equal to w[n] (the parameter d->tied[1] as
 * loaded), else an error naming both. */
static inline tpk_status tpk__ckpt_tied(tpk_ctx *ctx, const char *fn, const char *dir,
                                        tpk_ckpt_files *files, const tpk_ckpt_load_desc *d,
                                        const float *w, size_t n) {
    const tpk_st_tensor *t = NULL;
    tpk_st_file *tf = NULL;
    char alt[300];
    TPK_TRY(tpk__ckpt_find(ctx, fn, dir, files, d->tied[0], &t, &tf));
    if (!t && d->alias) {
        snprintf(alt, sizeof alt, "%s%s", d->alias, d->tied[0]);
        TPK_TRY(tpk__ckpt_find(ctx, fn, dir, files, alt, &t, &tf));
    }
    if (!t) return TPK_OK;
    float *h = (float *)tpk__malloc(ctx, sizeof(float) * n);
    if (!h) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", n);
    tpk_status s = tpk_st_numel(t) == (int64_t)n ? tpk_st_get_f32(ctx, tf, t, h, n) : TPK_ERR_SHAPE;
    if (s == TPK_OK && memcmp(h, w, sizeof(float) * n)) s = TPK_ERR_FORMAT;
    tpk__free(ctx, h);
    if (s == TPK_ERR_SHAPE || s == TPK_ERR_FORMAT)
        return tpk__fail(ctx, s, fn,
                         "%s: \"%s\" differs from \"%s\": the model ties the two (a tensor of its "
                         "own is not loaded)",
                         dir, t->name, d->tied[1]);
    return s;
}

/* The context's FP8 state (ctx->fp8, delayed scaling) from dir's fp8.safetensors, ff: each of the
 * recipe's tensors' history (its newest min(L, L') amaxes; zeros after them) and scale, and the
 * update count; a tensor missing, mis-shaped, negative or not finite (a scale not positive)
 * refused, and a tensor of the file that no stage's recipe has. Collective over ctx->pp (the
 * marks of the file's tensors combined: every rank calls it, `mine` its status so far, which it
 * returns when failing). */
static inline tpk_status tpk__ckpt_fp8_load(tpk_ctx *ctx, const char *fn, const char *dir,
                                            const tpk_st_file *ff, tpk_status mine) {
    tpk_fp8 *f = ctx->fp8;
    char path[1200], nm[128];
    snprintf(path, sizeof path, "%s/fp8.safetensors", dir);
    tpk_status s = mine;
    int32_t cnt = s == TPK_OK ? ff->n : 0, *known = NULL;
    if (ctx->pp.size > 1) {
        tpk_status c = tpk_allreduce_host(ctx, &ctx->pp, &cnt, 1, TPK_I32, TPK_MAX);
        if (s == TPK_OK) s = c;
    }
    if (s == TPK_OK && cnt != ff->n)
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: the stages read different files", path);
    size_t L = (size_t)f->d.history;
    float *h = (float *)tpk__malloc(ctx, sizeof(float) * L);
    known = (int32_t *)tpk__calloc(ctx, (size_t)cnt + 1, sizeof *known);
    if ((!h || !known) && s == TPK_OK)
        s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the FP8 state of %d tensors", f->n);
    const char *upd = s == TPK_OK ? tpk_st_meta(ff, "updates") : NULL;
    int64_t updates = 0;
    if (s == TPK_OK && (!upd || !tpk__ckpt_step_text(upd, &updates)))
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: updates \"%.40s\": expected a whole number",
                      path, upd ? upd : "(none)");
    for (int i = 0; i < f->n && s == TPK_OK; i++)
        for (int k = 0; k < 2 && s == TPK_OK; k++) {
            snprintf(nm, sizeof nm, "%s.%s", f->names[i], k ? "scale" : "amax_history");
            const tpk_st_tensor *t = tpk_st_find(ff, nm);
            if (!t) {
                s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                              "%s: no tensor \"%s\" (the checkpoint's FP8 linears are not the "
                              "model's)",
                              path, nm);
                break;
            }
            known[t - ff->tensors] = 1;
            if (t->ndim != 1 || t->shape[0] < 1 || (k && t->shape[0] != 1)) {
                char got[96];
                s = tpk__fail(ctx, TPK_ERR_SHAPE, fn, "%s: \"%s\": expected shape %s, got %s",
                              path, nm, k ? "[1]" : "[L], L >= 1",
                              tpk__shape_str(t->shape, t->ndim, got, sizeof got));
                break;
            }
            size_t m = (size_t)t->shape[0];
            float *v = m > L ? (float *)tpk__malloc(ctx, sizeof(float) * m) : h;
            if (!v) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", m);
            if (s == TPK_OK) s = tpk_st_get_f32(ctx, ff, t, v, m);
            if (s == TPK_OK) s = tpk__ckpt_finite(ctx, fn, path, nm, v, m, true);
            if (s == TPK_OK && k && !(v[0] > 0))
                s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: \"%s\" is %g: expected a scale > 0",
                              path, nm, (double)v[0]);
            if (s == TPK_OK && k) f->scale[i] = v[0];
            else if (s == TPK_OK) { /* the newest min(L, m) steps, zeros after them */
                float *row = f->hist + (size_t)i * L;
                for (size_t j = 0; j < L; j++) row[j] = j < m ? v[j] : 0.0f;
            }
            if (v != h) tpk__free(ctx, v);
        }
    if (ctx->pp.size > 1 && known) { /* every rank of the pipeline takes part, failed or not */
        tpk_status c = tpk_allreduce_host(ctx, &ctx->pp, known, (size_t)cnt, TPK_I32, TPK_MAX);
        if (s == TPK_OK) s = c;
    }
    for (int k = 0; k < cnt && s == TPK_OK; k++)
        if (!known[k])
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn,
                          "%s: tensor \"%s\" is not a tensor of the model's FP8 linears", path,
                          ff->tensors[k].name);
    if (s == TPK_OK) f->steps = updates;
    tpk__free(ctx, h), tpk__free(ctx, known);
    return s;
}

/* Set every parameter (and, when opt is given, the moments and opt->step) from dir: see the top
 * of this file. fn names the caller in errors. info (may be NULL): what the checkpoint says about
 * itself. Every rank reads. */
static inline tpk_status tpk__ckpt_load(tpk_ctx *ctx, const char *fn, tpk_adamw *opt,
                                        const char *dir_in, const tpk_ckpt_load_desc *desc,
                                        tpk_ckpt_info *info) {
    if (!ctx) return TPK_ERR_ARG;
    if (!dir_in) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dir: NULL");
    tpk_ckpt_load_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (!d.tied[0] != !d.tied[1])
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->tied: expected both names or neither");
    TPK_TRY(tpk__ckpt_opt(ctx, fn, opt));
    tpk_ckpt_info in;
    tpk__ckpt_config cfg;
    TPK_TRY(tpk__ckpt_info(ctx, fn, dir_in, &cfg, &in));
    const char *dir = in.dir;
    char path[1300];
    int n = ctx->params.n;
    tpk_st_file of;
    tpk_ckpt_files files;
    memset(&of, 0, sizeof of);
    tpk_status s = d.index ? d.index(ctx, fn, dir, &files)
                           : tpk__ckpt_single(ctx, fn, "model.safetensors", &files);
    TPK_TRY(s);
    if (!files.index[0]) snprintf(files.index, sizeof files.index, "the index");
    bool have_opt = opt && in.has_optim, made = false,
         have_fp8 = opt && in.has_fp8 && tpk__ckpt_fp8_on(ctx);
    tpk_st_file ff; /* fp8.safetensors */
    memset(&ff, 0, sizeof ff);
    float *om = NULL, *ov = NULL, *tied = NULL; /* the whole moments (ZeRO-1: made here, this
                                                   rank's slice kept at the end) */
    size_t ntied = 0;
    char(*names)[112] = (char(*)[112])tpk__calloc(ctx, (size_t)n + 1, sizeof *names);
    if (!names) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "the parameter names");
    snprintf(path, sizeof path, "%s/optim.safetensors", dir);
    if (s == TPK_OK && have_opt) s = tpk_st_read(ctx, path, &of);
    if (s == TPK_OK && have_opt) s = tpk__adamw_whole(ctx, opt, false, &om, &ov, &made);
    snprintf(path, sizeof path, "%s/fp8.safetensors", dir);
    if (s == TPK_OK && have_fp8) s = tpk_st_read(ctx, path, &ff);
    for (int i = 0; i < n && s == TPK_OK; i++) {
        const tpk_param *p = &ctx->params.list[i];
        char altname[300];
        bool conv = false;
        const tpk_st_tensor *t = NULL;
        tpk_st_file *tf = NULL;
        s = tpk__ckpt_name(ctx, fn, d.map, d.map_arg, i, names[i], &conv);
        if (s == TPK_OK) s = tpk__ckpt_find(ctx, fn, dir, &files, names[i], &t, &tf);
        if (s == TPK_OK && !t && d.alias) {
            snprintf(altname, sizeof altname, "%s%s", d.alias, names[i]);
            s = tpk__ckpt_find(ctx, fn, dir, &files, altname, &t, &tf);
        }
        if (s != TPK_OK) break;
        if (!t) {
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s/%s: no tensor \"%s\"", dir,
                          files.tensor ? files.index : files.file[0], names[i]);
            break;
        }
        int64_t want[2] = {conv ? p->gshape[1] : p->gshape[0],
                           conv ? p->gshape[0] : (p->ndim > 1 ? p->gshape[1] : 0)};
        if (t->ndim != p->ndim || t->shape[0] != want[0] ||
            (p->ndim > 1 && t->shape[1] != want[1])) {
            char got[96];
            tpk__shape_str(t->shape, t->ndim, got, sizeof got);
            s = tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                          "%s: \"%s\" has shape %s, config.json implies [%lld%s%lld]", dir,
                          t->name, got, (long long)want[0], p->ndim > 1 ? ", " : "",
                          p->ndim > 1 ? (long long)want[1] : 0LL);
            break;
        }
        size_t gn = tpk_param_global_numel(ctx, i);
        float *w = (float *)tpk__malloc(ctx, sizeof(float) * gn),
              *tw = conv ? (float *)tpk__malloc(ctx, sizeof(float) * gn) : NULL;
        if (!w || (conv && !tw)) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
        snprintf(path, sizeof path, "%s/%s", dir, files.file[tf - files.st]);
        if (s == TPK_OK) s = tpk_st_get_f32(ctx, tf, t, w, gn);
        if (s == TPK_OK) s = tpk__ckpt_finite(ctx, fn, path, t->name, w, gn, false);
        if (s == TPK_OK && conv) tpk__ckpt_transpose(w, tw, want[0], want[1]);
        if (s == TPK_OK && d.tied[1] && !tied && !strcmp(p->name, d.tied[1])) {
            if ((tied = (float *)tpk__malloc(ctx, sizeof(float) * gn))) /* for the tied check */
                memcpy(tied, conv ? tw : w, sizeof(float) * gn), ntied = gn;
            else s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu floats", gn);
        }
        if (s == TPK_OK) s = tpk_param_set_global(ctx, i, conv ? tw : w);
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        for (int k = 0; k < 2 && have_opt && s == TPK_OK; k++) {
            char on[160];
            snprintf(on, sizeof on, "%s.%s", names[i], k ? "exp_avg_sq" : "exp_avg");
            const tpk_st_tensor *ot = tpk_st_find(&of, on);
            if (!ot) s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s: no tensor \"%s\"", path, on);
            else if (ot->ndim != p->ndim || tpk_st_numel(ot) != (int64_t)gn ||
                     ot->shape[0] != p->gshape[0]) {
                char got[96], want[96];
                s = tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                              "%s: \"%s\": expected the parameter's shape %s, got %s", path, on,
                              tpk__shape_str(p->gshape, p->ndim, want, sizeof want),
                              tpk__shape_str(ot->shape, ot->ndim, got, sizeof got));
            }
            if (s == TPK_OK) s = tpk_st_get_f32(ctx, &of, ot, w, gn);
            if (s == TPK_OK) s = tpk__ckpt_finite(ctx, fn, path, on, w, gn, k == 1);
            if (s == TPK_OK) s = tpk_param_scatter(ctx, i, w, k ? ov : om);
        }
        tpk__free(ctx, w), tpk__free(ctx, tw);
    }
    s = tpk__ckpt_all_known(ctx, fn, dir, &files, have_opt ? &of : NULL, &d, names, s);
    if (have_fp8) s = tpk__ckpt_fp8_load(ctx, fn, dir, &ff, s); /* collective over PP */
    if (s == TPK_OK && tied) s = tpk__ckpt_tied(ctx, fn, dir, &files, &d, tied, ntied);
    tpk__ckpt_stamp st[67]; /* config.json, the model files read, the optimizer and FP8 files */
    int nst = 1;
    st[0].file = "config.json", st[0].key = "tpk_step", st[0].step = cfg.has_step ? cfg.step : NULL,
    st[0].id = cfg.has_id ? cfg.id : NULL;
    for (int q = 0; q <= files.n; q++) { /* the model files (at most 64 of them), then the optimizer
                                            file */
        tpk_st_file *sf = q < files.n ? (files.open[q] && nst < 65 ? &files.st[q] : NULL)
                          : have_opt  ? &of
                                      : NULL;
        if (!sf) continue;
        st[nst].file = q < files.n ? files.file[q] : "optim.safetensors", st[nst].key = "step";
        st[nst].step = tpk_st_meta(sf, "step"), st[nst].id = tpk_st_meta(sf, "tpk_checkpoint_id"),
        nst++;
    }
    if (have_opt && s == TPK_OK && !st[nst - 1].step)
        s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s/optim.safetensors: no step in its metadata",
                      dir);
    if (have_fp8) {
        st[nst].file = "fp8.safetensors", st[nst].key = "step";
        st[nst].step = tpk_st_meta(&ff, "step"), st[nst].id = tpk_st_meta(&ff, "tpk_checkpoint_id");
        if (s == TPK_OK && !st[nst].step)
            s = tpk__fail(ctx, TPK_ERR_FORMAT, fn, "%s/fp8.safetensors: no step in its metadata",
                          dir);
        nst++;
    }
    int64_t step = 0;
    if (s == TPK_OK) s = tpk__ckpt_stamps_agree(ctx, fn, dir, st, nst, &step);
    if (s == TPK_OK && opt) opt->step = step; /* no optimizer file: fresh moments from the
                                                 checkpoint's step */
    if (made) {
        tpk_status k = tpk__adamw_keep_slice(ctx, opt, om, ov);
        if (s == TPK_OK) s = k;
    }
    tpk__free(ctx, tied), tpk__free(ctx, names);
    tpk_ckpt_files_close(&files), tpk_st_close(&of), tpk_st_close(&ff);
    if (s == TPK_OK && info) *info = in, info->step = step;
    return s;
}
static inline tpk_status tpk_ckpt_load(tpk_ctx *ctx, tpk_adamw *opt, const char *dir,
                                       const tpk_ckpt_load_desc *desc, tpk_ckpt_info *info) {
    return tpk__ckpt_load(ctx, "tpk_ckpt_load", opt, dir, desc, info);
}

#endif /* TPK_CKPT_H */
