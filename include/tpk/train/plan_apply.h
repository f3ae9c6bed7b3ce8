/* tpk/train/plan_apply.h — a trainer's --plan: the planner (tpk/plan/plan.h) runs its dry run of
 * every TP x PP x DP, micro-batch, recompute, ZeRO stage and sequence-parallel choice for this
 * job's ranks on a hardware profile (--plan-profile NAME|FILE; h100 on a GPU, cpu on the host),
 * and the fastest configuration that fits replaces the flags' mesh and step shape. The step keeps
 * its sequences: --batch x --grad-accum x DP as given (DP = ranks / (TP CP PP)) is the global
 * batch planned. CP is the flags': --cp C plans at CP C (TP, DP, the step's shape and, unless
 * --cp-comm is given, the attention's mode chosen around it), without --cp at CP 1; EP likewise:
 * --ep E plans a Mixtral at EP E (its DP a multiple of E), without --ep at EP 1. The same
 * inputs on every rank give the same choice on every rank (no collective). */
#ifndef TPK_TRAIN_PLAN_APPLY_H
#define TPK_TRAIN_PLAN_APPLY_H

#include "../plan/plan.h"
#include "backend.h"
#include "options.h"

/* The planner's choice for `world` ranks, `per_node` a node (0: the least over this job's nodes,
 * a collective of MPI_COMM_WORLD), applied to o (tp, pp, batch, accum, rc, zero, zero_shard,
 * sp, piped, cp_comm) and cfg (its sp, recompute and cp_comm); what was chosen printed on out
 * (NULL: not). gpu: the profile, dtype and counted backend's defaults (the CUDA one's; else the
 * host's). */
static inline tpk_status tpk_run_plan(tpk_ctx *ctx, tpk_run_opts *o, tpk_model_config *cfg,
                                      int64_t seq, int world, int per_node, bool gpu, FILE *out) {
    static const char *fn = "--plan";
    if (!ctx) return TPK_ERR_ARG;
    if (!o || !cfg) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_run_plan", "%s: NULL", o ? "cfg" : "o");
    char line[600];
    size_t nline = sizeof line;
    if (per_node < 1) tpk_run_node_size(true, &per_node, NULL);
    if (o->tp_weights || o->dp_batch || o->pp_layers || o->schedule || o->dp_reduce)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "chooses the mesh itself; leave out %s",
                         o->tp_weights  ? "--tp-weights"
                         : o->dp_batch  ? "--dp-batch"
                         : o->pp_layers ? "--pp-layers"
                         : o->schedule  ? "--schedule"
                                        : "--dp-reduce");
    tpk_hw hw;
    char err[256] = "";
    const char *prof = o->plan_profile ? o->plan_profile : gpu ? "h100" : "cpu";
    if (!tpk_hw_builtin(prof, &hw) && !tpk_hw_read(prof, &hw, err, sizeof err))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s", err);
    tpk_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.model = *cfg, pd.seq = seq, pd.gpus = world, pd.gpus_per_node = per_node;
    int64_t cp = o->cp > 1 ? o->cp : 1;
    pd.batch = o->batch * o->accum * (world / (o->tp * cp * o->pp)), pd.hw = &hw;
    pd.cp = (int)cp;                    /* the flags' CP: 1 plans without CP */
    pd.ep = o->ep > 1 ? (int)o->ep : 1; /* the flags' EP */
    pd.cp_comm = !o->cp_comm ? -1 : strcmp(o->cp_comm, "allgather") ? TPK_CP_P2P : TPK_CP_ALLGATHER;
    pd.like = gpu ? NULL : tpk_ops_host();
    pd.dtype = o->dtype ? (strcmp(o->dtype, "bf16") ? TPK_F32 : TPK_BF16)
               : gpu    ? TPK_BF16
                        : TPK_F32;
    pd.zero = pd.sp = pd.recompute = -1;
    pd.zero_shard = o->zero_shard > 0 ? (int)o->zero_shard : 0; /* HSDP: the flag's, or planned */
    tpk_plan_cfg *pv = NULL;
    int pn = 0, fit = 0;
    TPK_TRY(tpk_plan(ctx, &pd, &pv, &pn));
    for (int i = 0; i < pn; i++) fit += pv[i].fits;
    if (!fit) {
        char why[200];
        snprintf(why, sizeof why, "%s", pn ? pv[pn - 1].reason : "none");
        tpk_free(ctx, pv);
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "no configuration of %lld sequences of %lld tokens fits %d ranks of %.0f "
                         "GB (%s)",
                         (long long)pd.batch, (long long)seq, world, hw.mem_gb, why);
    }
    tpk_plan_cfg b = pv[0];
    char cpw[48], cpw2[48], epw[24] = "", zw[48]; /* (every configuration at the flags' EP) */
    if (b.ep > 1) snprintf(epw, sizeof epw, " (EP %d)", b.ep);
    int k =
        snprintf(line, nline,
                 "plan: TP %d%s x PP %d x DP %d%s, micro-batch %d x %d a step, recompute %s, "
                 "ZeRO %s, SP %s: the fastest of %d configurations that fit (%d planned) on "
                 "%s: %.4f s a step, peak %.2f MB a rank",
                 b.tp, tpk_plan_cp_words(&b, cpw, sizeof cpw), b.pp, b.dp, epw, b.micro_batch,
                 b.accum, tpk_recompute_name(b.recompute), tpk_plan_zero_words(&b, zw, sizeof zw),
                 b.sp ? "on" : "off", fit, pn, hw.name, b.step_seconds, b.peak_bytes / 1e6);
    if (fit > 1 && k > 0 && (size_t)k < nline)
        snprintf(line + k, nline - (size_t)k,
                 "; the next: TP %d%s x PP %d x DP %d%s, micro-batch %d, recompute %s, %.4f s",
                 pv[1].tp, tpk_plan_cp_words(&pv[1], cpw2, sizeof cpw2), pv[1].pp, pv[1].dp, epw,
                 pv[1].micro_batch, tpk_recompute_name(pv[1].recompute), pv[1].step_seconds);
    tpk_free(ctx, pv);
    if (out) fprintf(out, "%s\n", line);
    o->tp = b.tp, o->pp = b.pp, o->batch = b.micro_batch, o->accum = b.accum;
    o->rc = b.recompute, o->zero = b.zero, o->sp = b.sp, o->piped = o->pp > 1;
    o->zero_shard = b.zero_shard;
    o->cp_comm = tpk_cp_comm_name(b.cp_comm); /* (read at cp > 1 alone) */
    int64_t *sh[5];
    tpk_model_config_common(cfg, sh, (float)o->smoothing, o->sp, o->rc);
    cfg->gpt2.cp_comm = cfg->llama.cp_comm = cfg->neox.cp_comm = cfg->custom.cp_comm = b.cp_comm;
    cfg->mixtral.cp_comm = cfg->qwen2_moe.cp_comm = b.cp_comm;
    return TPK_OK;
}

#endif /* TPK_TRAIN_PLAN_APPLY_H */
