/* tests/test_ckpt.c — tpk/train/ckpt.h and tpk/train/ckpt_dir.h on a model of the user's own,
 * made of public layers: a vocabulary-parallel embedding (V = 37, padded to multiples of 8 rows
 * per shard), a column and a row linear with biases, a layernorm; under pipeline stages the first
 * two on stage 0, the others on stage 1. The reference is the unsharded state: every parameter and
 * both AdamW moments drawn per element from (seed, the parameter's name, the global index), the
 * same at every mesh.
 *   resharding: saved at every (t, p) mesh the ranks allow (t x p dividing the ranks, the rest DP,
 *     the optimizer ZeRO-1), loaded at every such mesh (ZeRO-1 and not) and into a one-rank
 *     context on every rank, the state poisoned (NaN) first: every parameter, both moments and the
 *     step bit-equal to the unsharded values; the model file holds the global tensors;
 *   config.json: the model's text with tpk_step, tpk_seed and tpk_checkpoint_id added, read back
 *     (tpk_ckpt_config_read, tpk_ckpt_info_read); a config that is not an object or holds tpk_step
 *     refused;
 *   a name map: a parameter renamed and stored transposed, loaded back through the same map;
 *     without it, refused;
 *   refusals by their text: an unknown tensor, a missing tensor, a NaN weight, a negative second
 *     moment, a wrong shape, files of two checkpoints (ids that differ; config.json without an
 *     id beside files with one), an optimizer of another model;
 *   the directory: a save over a checkpoint replaces it whole (the user's file kept, nothing left
 *     beside it); each state a stopped save leaves (DIR.tpk-old alone, DIR with DIR.tpk-old, a
 *     half-written DIR.tpk-new) loads as one whole checkpoint and is repaired by the next save;
 *     tpk_ckpt_remove keeps the user's files;
 *   the FP8 recipe's state (delayed scaling, fp8.safetensors): saved at every mesh, loaded at
 *     another and unsharded, state poisoned first: every history and scale bit-equal; a history
 *     of another length gives its newest amaxes; an FP8 tensor the model has not, one it has that
 *     the file lacks, a negative amax, the file of another save refused; current scaling writes
 *     none and a delayed recipe loading such a checkpoint starts fresh. */
#include "test.h"

#include <sys/stat.h>

#include <tpk/train/ckpt.h>

static int me, np;
static tpk_comm world;

enum { V = 37, H = 12, F = 20 };

/* The model: variant 0 as above; 1 with one more layernorm "extra" (stage 1); 2 with the column
 * linear 24 wide; 3 with both linears in FP8 under a delayed-scaling recipe of a 6-step history,
 * 4 with only the column linear in FP8, 5 as 3 with a 3-step history, 6 as 3 under current
 * scaling (mesh_init makes the recipe). */
typedef struct model {
    tpk_embedding emb;
    tpk_linear up, down;
    tpk_layernorm norm, extra;
    bool has[5];
} model;

static tpk_status build(tpk_ctx *ctx, model *m, int variant) {
    memset(m, 0, sizeof *m);
    bool first = ctx->pp.rank == 0, last = ctx->pp.rank == ctx->pp.size - 1;
    int64_t f = variant == 2 ? 24 : F;
    if (first) {
        TPK_TRY(tpk_embedding_init(ctx, &m->emb, V, 0, H,
                                   &(tpk_embedding_desc){.wte_name = "emb.weight",
                                                         .vocab_multiple = 8}));
        m->has[0] = true;
        TPK_TRY(tpk_col_linear_init(ctx, &m->up, H, f,
                                    &(tpk_linear_desc){.name = "up", .bias = true,
                                                       .fp8 = variant >= 3}));
        m->has[1] = true;
    }
    if (last) {
        TPK_TRY(tpk_row_linear_init(ctx, &m->down, F, H,
                                    &(tpk_linear_desc){.name = "down", .bias = true,
                                                       .fp8 = variant >= 3 && variant != 4}));
        m->has[2] = true;
        TPK_TRY(tpk_layernorm_init(ctx, &m->norm, H, &(tpk_layernorm_desc){.name = "norm"}));
        m->has[3] = true;
        if (variant == 1) {
            TPK_TRY(tpk_layernorm_init(ctx, &m->extra, H, &(tpk_layernorm_desc){.name = "extra"}));
            m->has[4] = true;
        }
    }
    return TPK_OK;
}
static void destroy(tpk_ctx *ctx, model *m) {
    if (m->has[0]) tpk_embedding_destroy(ctx, &m->emb);
    if (m->has[1]) tpk_linear_destroy(ctx, &m->up);
    if (m->has[2]) tpk_linear_destroy(ctx, &m->down);
    if (m->has[3]) tpk_layernorm_destroy(ctx, &m->norm);
    if (m->has[4]) tpk_layernorm_destroy(ctx, &m->extra);
}

/* The unsharded reference: element k of parameter `name`'s weight (which 0), first moment (1) or
 * second moment (2, positive) in generation g. */
static float ref(const char *name, size_t k, int which, int g) {
    float z = tpk_rng_normal(1000 + 10 * (uint64_t)g + (uint64_t)which, tpk_rng_stream(name), k);
    return which == 0 ? 0.5f * z : which == 1 ? 0.1f * z : 0.01f * z * z + 1e-4f;
}
static float *ref_tensor(const tpk_param *p, int which, int g) {
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (size_t)p->gshape[d];
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t k = 0; k < n; k++) x[k] = ref(p->name, k, which, g);
    return x;
}

/* A mesh: ctx over the world with t TP ranks and p stages (world NULL: one rank), the model, an
 * AdamW (ZeRO-1 when zero). */
typedef struct mesh {
    tpk_ctx ctx;
    model m;
    tpk_adamw o;
    tpk_fp8 f8; /* variants 3..6 */
} mesh;
static tpk_status mesh_init(mesh *x, bool all, int t, int p, int variant, bool zero) {
    memset(x, 0, sizeof *x);
    TPK_TRY(tpk_ctx_init(&x->ctx, &(tpk_ctx_desc){.world = all ? &world : NULL, .tp = t, .pp = p,
                                                  .seed = 3}));
    tpk_fp8_desc fd = {variant == 6 ? TPK_FP8_CURRENT : TPK_FP8_DELAYED, variant == 5 ? 3 : 6,
                       TPK_FP8_AMAX_MAX, 0};
    if (variant >= 3) TPK_TRY(tpk_fp8_init(&x->ctx, &x->f8, &fd));
    TPK_TRY(build(&x->ctx, &x->m, variant));
    return tpk_adamw_init(&x->ctx, &x->o, &(tpk_adamw_desc){.zero = zero});
}
static void mesh_destroy(mesh *x) {
    tpk_adamw_destroy(&x->ctx, &x->o);
    destroy(&x->ctx, &x->m);
    tpk_fp8_destroy(&x->ctx, &x->f8);
    tpk_ctx_destroy(&x->ctx);
}

/* The FP8 recipe's state of generation g (by each tensor's name: the same at every mesh): history
 * element j |ref(name, j, 3, g)|, scale 1 + |ref(name, 0, 4, g)|, 11 + g updates; poison: NaN. */
static void set_fp8(mesh *x, int g, bool poison) {
    tpk_fp8 *f = &x->f8;
    for (int i = 0; i < f->n; i++) {
        for (int j = 0; j < f->d.history; j++)
            f->hist[(size_t)i * (size_t)f->d.history + (size_t)j] =
                poison ? NAN : fabsf(ref(f->names[i], (size_t)j, 3, g));
        f->scale[i] = poison ? NAN : 1.0f + fabsf(ref(f->names[i], 0, 4, g));
    }
    f->steps = poison ? -1 : 11 + g;
}
/* The recipe's state equal to generation g's saved with a history of Ls steps (its newest
 * min(Ls, L) amaxes, zeros after them); the tensors that differ. */
static int check_fp8(mesh *x, int g, int Ls, const char *what) {
    tpk_fp8 *f = &x->f8;
    int bad = 0;
    for (int i = 0; i < f->n; i++) {
        bool same = f->scale[i] == 1.0f + fabsf(ref(f->names[i], 0, 4, g));
        for (int j = 0; j < f->d.history; j++)
            same &= f->hist[(size_t)i * (size_t)f->d.history + (size_t)j] ==
                    (j < Ls ? fabsf(ref(f->names[i], (size_t)j, 3, g)) : 0.0f);
        CHECK(same, "%s: the FP8 state of %s differs", what, f->names[i]);
        bad += !same;
    }
    CHECK(f->steps == 11 + g, "%s: %lld FP8 updates, expected %d", what, (long long)f->steps,
          11 + g);
    return bad;
}

/* Every parameter and moment set from generation g's unsharded values (or NaN: poison), the
 * step 7 + g. */
static void set_state(mesh *x, int g, bool poison) {
    tpk_ctx *ctx = &x->ctx;
    size_t n = ctx->params.numel;
    float *fm = calloc(n + 1, sizeof(float)), *fv = calloc(n + 1, sizeof(float));
    for (int i = 0; i < ctx->params.n; i++) {
        const tpk_param *p = &ctx->params.list[i];
        float *t[3];
        for (int w = 0; w < 3; w++) {
            t[w] = ref_tensor(p, w, g);
            if (poison) test_poison(t[w], tpk_param_global_numel(ctx, i));
        }
        CHECK_OK(ctx, tpk_param_set_global(ctx, i, t[0]));
        CHECK_OK(ctx, tpk_param_scatter(ctx, i, t[1], fm));
        CHECK_OK(ctx, tpk_param_scatter(ctx, i, t[2], fv));
        for (int w = 0; w < 3; w++) free(t[w]);
    }
    memcpy(x->o.m, fm + x->o.s0, sizeof(float) * x->o.sn); /* the host backend: host memory */
    memcpy(x->o.v, fv + x->o.s0, sizeof(float) * x->o.sn);
    x->o.step = poison ? -1 : 7 + g;
    free(fm), free(fv);
}
/* The state equal, bit for bit, to generation g's; the number of tensors that differ. */
static int check_state(mesh *x, int g, const char *what) {
    tpk_ctx *ctx = &x->ctx;
    float *m = NULL, *v = NULL;
    bool made = false;
    int bad = 0;
    CHECK_OK(ctx, tpk__adamw_whole(ctx, &x->o, true, &m, &v, &made));
    for (int i = 0; i < ctx->params.n; i++) {
        const tpk_param *p = &ctx->params.list[i];
        size_t gn = tpk_param_global_numel(ctx, i);
        float *got = malloc(sizeof(float) * gn);
        const float *flat[3] = {(const float *)ctx->params.data.p, m, v};
        for (int w = 0; w < 3; w++) {
            float *want = ref_tensor(p, w, g);
            test_poison(got, gn);
            CHECK_OK(ctx, tpk_param_gather(ctx, i, flat[w], got));
            bool same = !memcmp(got, want, sizeof(float) * gn);
            CHECK(same, "%s: %s's %s differs from the unsharded value", what, p->name,
                  w == 0 ? "weight" : w == 1 ? "first moment" : "second moment");
            bad += !same;
            free(want);
        }
        free(got);
    }
    CHECK(x->o.step == 7 + g, "%s: step %lld, expected %d", what, (long long)x->o.step, 7 + g);
    if (made) tpk_op_free(ctx, m), tpk_op_free(ctx, v);
    return bad;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
/* A shell command on rank 0, then every rank waits for it. */
static void on_root(const char *fmt, ...) {
    char cmd[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (me == 0) CHECK(system(cmd) == 0, "%s", cmd);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Save generation g of the model (variant) at t x p to dir; the status. */
static tpk_status save_gen(const char *dir, int t, int p, int variant, int g,
                           const tpk_ckpt_save_desc *desc, void (*spoil)(mesh *)) {
    mesh x;
    tpk_status s = mesh_init(&x, true, t, p, variant, true);
    CHECK(s == TPK_OK, "mesh: %s", tpk_last_error(&x.ctx));
    set_state(&x, g, false);
    if (variant >= 3) set_fp8(&x, g, false);
    if (spoil) spoil(&x);
    tpk_ckpt_save_desc d = desc ? *desc : (tpk_ckpt_save_desc){0};
    d.step = x.o.step;
    if (!desc) d.seed = 99, d.config = "{\"kind\": \"toy\", \"hidden\": 12}";
    s = tpk_ckpt_save(&x.ctx, &x.o, dir, &d);
    CHECK(s == TPK_OK, "save %s: %s", dir, tpk_last_error(&x.ctx));
    mesh_destroy(&x);
    return s;
}
/* Load dir into a fresh model (variant) at t x p, poisoned first; *err gets the message. */
static tpk_status load_into(mesh *x, bool all, const char *dir, int t, int p, int variant,
                            bool zero, const tpk_ckpt_load_desc *desc, char *err, size_t n) {
    tpk_status s = mesh_init(x, all, t, p, variant, zero);
    CHECK(s == TPK_OK, "mesh: %s", tpk_last_error(&x->ctx));
    set_state(x, 0, true);
    if (variant >= 3) set_fp8(x, 0, true);
    s = tpk_ckpt_load(&x->ctx, &x->o, dir, desc, NULL);
    snprintf(err, n, "%s", s == TPK_OK ? "" : tpk_last_error(&x->ctx));
    return s;
}
/* A load of dir at t = np that must fail with `want` and a message holding `needle`. */
static void refused(const char *dir, int variant, tpk_status want, const char *needle,
                    const char *what) {
    mesh x;
    char err[1200];
    tpk_status s = load_into(&x, true, dir, np, 1, variant, true, NULL, err, sizeof err);
    CHECK(s == want && strstr(err, needle), "%s: got %s \"%s\", expected %s naming \"%s\"", what,
          tpk_status_str(s), err, tpk_status_str(want), needle);
    mesh_destroy(&x);
}

static void nan_down(mesh *x) { /* element 5 of down.weight NaN */
    int id = tpk_param_find(&x->ctx, "down.weight");
    if (id < 0) return; /* not on this stage */
    size_t gn = tpk_param_global_numel(&x->ctx, id);
    float *w = ref_tensor(&x->ctx.params.list[id], 0, 0);
    w[5] = NAN;
    CHECK_OK(&x->ctx, tpk_param_set_global(&x->ctx, id, w));
    free(w);
    (void)gn;
}
static void negative_v(mesh *x) { /* the second moment of norm.bias at element 3: -1 */
    int id = tpk_param_find(&x->ctx, "norm.bias");
    if (id < 0) return;
    tpk_adamw *o = &x->o;
    size_t at = x->ctx.params.list[id].offset; /* the element of the flat buffer: in one rank's
                                                 slice under ZeRO-1 (TP rank r holds the same) */
    size_t k = 3;
    if (at + k >= o->s0 && at + k < o->s0 + o->sn) o->v[at + k - o->s0] = -1;
}

static void neg_amax(mesh *x) { /* element 2 of up.input's history: -1 (on up's stage) */
    for (int i = 0; i < x->f8.n; i++)
        if (!strcmp(x->f8.names[i], "up.input")) x->f8.hist[(size_t)i * 6 + 2] = -1;
}

/* The map: up.weight named "proj_in.w" and stored transposed; everything else as registered. */
static void toy_map(void *arg, const tpk_param *p, char *name, size_t cap, bool *transposed) {
    (void)arg;
    if (!strcmp(p->name, "up.weight")) snprintf(name, cap, "proj_in.w"), *transposed = true;
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    if (me == 0) (void)system("mkdir -p build/tests");
    MPI_Barrier(MPI_COMM_WORLD);
    char base[200];
    snprintf(base, sizeof base, "build/tests/ckpt_np%d", np);
    on_root("rm -rf %s && mkdir -p %s", base, base);

    /* the meshes the ranks allow: t x p dividing np, p <= 2 */
    int mt[8], mp[8], nm = 0;
    for (int p = 1; p <= 2; p++)
        for (int t = 1; t <= np; t++)
            if (np % (t * p) == 0 && nm < 8) mt[nm] = t, mp[nm] = p, nm++;

    TEST_CASE("resharding: saved at every (t, p) of %d ranks, loaded at every (t, p) and "
              "unsharded: parameters, both moments and the step equal",
              np) {
        for (int a = 0; a < nm; a++) {
            char dir[300];
            snprintf(dir, sizeof dir, "%s/mesh%d", base, a);
            save_gen(dir, mt[a], mp[a], 0, a, NULL, NULL);
            for (int b = 0; b < nm; b++) {
                mesh x;
                char err[1200], what[200];
                bool zero = (a + b) % 2 == 0;
                snprintf(what, sizeof what, "saved at t=%d p=%d, loaded at t=%d p=%d dp=%d%s",
                         mt[a], mp[a], mt[b], mp[b], np / (mt[b] * mp[b]),
                         zero ? " ZeRO-1" : "");
                CHECK(load_into(&x, true, dir, mt[b], mp[b], 0, zero, NULL, err, sizeof err) ==
                          TPK_OK,
                      "%s: %s", what, err);
                check_state(&x, a, what);
                mesh_destroy(&x);
            }
            mesh u; /* every rank alone: the whole model */
            char err[1200], what[200];
            snprintf(what, sizeof what, "saved at t=%d p=%d, loaded unsharded", mt[a], mp[a]);
            CHECK(load_into(&u, false, dir, 1, 1, 0, false, NULL, err, sizeof err) == TPK_OK,
                  "%s: %s", what, err);
            check_state(&u, a, what);
            /* the file itself: the global [F, H] weight of the column linear */
            char path[400];
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            tpk_st_file f;
            CHECK_OK(&u.ctx, tpk_st_read(&u.ctx, path, &f));
            const tpk_st_tensor *t = tpk_st_find(&f, "up.weight");
            CHECK(t && t->ndim == 2 && t->shape[0] == F && t->shape[1] == H,
                  "model.safetensors: up.weight [%d, %d]", F, H);
            float *w = malloc(sizeof(float) * F * H);
            float *want = ref_tensor(&u.ctx.params.list[tpk_param_find(&u.ctx, "up.weight")], 0, a);
            CHECK(t && tpk_st_get_f32(&u.ctx, &f, t, w, F * H) == TPK_OK &&
                      !memcmp(w, want, sizeof(float) * F * H),
                  "model.safetensors: up.weight holds the global tensor");
            const tpk_st_tensor *e = tpk_st_find(&f, "emb.weight");
            CHECK(e && e->shape[0] == V, "model.safetensors: emb.weight without its padding rows");
            free(w), free(want);
            tpk_st_close(&f);
            mesh_destroy(&u);
            MPI_Barrier(MPI_COMM_WORLD);
        }
    }

    TEST_CASE("config.json: the model's text with tpk_step, tpk_seed, tpk_checkpoint_id, a run "
              "id; bad configs and run ids refused") {
        char dir[300], *text = NULL;
        snprintf(dir, sizeof dir, "%s/mesh0", base);
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.seed = 1}));
        size_t n = 0;
        CHECK_OK(&c, tpk_ckpt_config_read(&c, dir, &text, &n));
        CHECK(text && strlen(text) == n && strstr(text, "\"kind\": \"toy\"") &&
                  strstr(text, "\"tpk_step\": 7,") && strstr(text, "\"tpk_seed\": 99,") &&
                  strstr(text, "\"tpk_checkpoint_id\": \""),
              "config.json: %s", text ? text : "(none)");
        tpk_ckpt_info info;
        CHECK_OK(&c, tpk_ckpt_info_read(&c, dir, &info));
        CHECK(info.step == 7 && info.seed == 99 && strlen(info.id) == 16 && info.has_optim &&
                  !strcmp(info.dir, dir),
              "info: step %lld seed %llu id %s optim %d dir %s", (long long)info.step,
              (unsigned long long)info.seed, info.id, info.has_optim, info.dir);
        tpk_free(&c, text);
        tpk_ctx_destroy(&c);
        mesh x;
        CHECK_OK(&x.ctx, mesh_init(&x, true, np, 1, 0, true));
        snprintf(dir, sizeof dir, "%s/badcfg", base);
        CHECK_FAILS(&x.ctx,
                    tpk_ckpt_save(&x.ctx, &x.o, dir, &(tpk_ckpt_save_desc){.config = "[1]"}),
                    TPK_ERR_ARG, "desc->config: expected a JSON object");
        CHECK_FAILS(&x.ctx,
                    tpk_ckpt_save(&x.ctx, &x.o, dir,
                                  &(tpk_ckpt_save_desc){.config = "{\"tpk_step\": 3}"}),
                    TPK_ERR_ARG, "holds \"tpk_step\"");
        CHECK_FAILS(&x.ctx, tpk_ckpt_save(&x.ctx, &x.o, dir, &(tpk_ckpt_save_desc){.config = "{"}),
                    TPK_ERR_ARG, "desc->config");
        CHECK_FAILS(&x.ctx, tpk_ckpt_save(&x.ctx, &x.o, "build/tests/..", NULL), TPK_ERR_ARG,
                    "not \"..\"");
        CHECK(!exists(dir), "no directory made by a refused save");
        CHECK_FAILS(&x.ctx,
                    tpk_ckpt_save(&x.ctx, &x.o, dir,
                                  &(tpk_ckpt_save_desc){.config = "{\"tpk_run_id\": \"a\"}"}),
                    TPK_ERR_ARG, "holds \"tpk_run_id\"");
        CHECK_FAILS(&x.ctx, tpk_ckpt_save(&x.ctx, &x.o, dir, &(tpk_ckpt_save_desc){.run_id = "A1"}),
                    TPK_ERR_ARG, "desc->run_id: expected 1..32 of [0-9a-z]");
        CHECK(!exists(dir), "no directory made by a refused save");
        /* "{}": the three members alone, no run id */
        CHECK_OK(&x.ctx, tpk_ckpt_save(&x.ctx, &x.o, dir, &(tpk_ckpt_save_desc){.config = " {} "}));
        CHECK_OK(&x.ctx, tpk_ckpt_info_read(&x.ctx, dir, &info));
        CHECK(info.run_id[0] == 0, "no run id: \"%s\"", info.run_id);
        /* a run id: written, read back */
        CHECK_OK(&x.ctx, tpk_ckpt_save(&x.ctx, &x.o, dir, &(tpk_ckpt_save_desc){.run_id = "r7x"}));
        CHECK_OK(&x.ctx, tpk_ckpt_info_read(&x.ctx, dir, &info));
        CHECK(!strcmp(info.run_id, "r7x"), "run id: \"%s\"", info.run_id);
        mesh_destroy(&x);
    }

    TEST_CASE("a name map: a parameter renamed and stored transposed, loaded back; refused "
              "without the map") {
        char dir[300];
        snprintf(dir, sizeof dir, "%s/mapped", base);
        save_gen(dir, np, 1, 0, 4, &(tpk_ckpt_save_desc){.map = toy_map}, NULL);
        mesh x;
        char err[1200];
        tpk_ckpt_load_desc ld = {.map = toy_map};
        CHECK(load_into(&x, true, dir, np, 1, 0, true, &ld, err, sizeof err) == TPK_OK, "%s", err);
        check_state(&x, 4, "loaded through the map");
        /* the file: proj_in.w [H, F], the transpose */
        char path[400];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        tpk_st_file f;
        CHECK_OK(&x.ctx, tpk_st_read(&x.ctx, path, &f));
        const tpk_st_tensor *t = tpk_st_find(&f, "proj_in.w");
        float *w = malloc(sizeof(float) * F * H);
        CHECK(t && t->shape[0] == H && t->shape[1] == F &&
                  tpk_st_get_f32(&x.ctx, &f, t, w, F * H) == TPK_OK &&
                  w[1 * F + 2] == ref("up.weight", 2 * H + 1, 0, 4),
              "proj_in.w is up.weight transposed");
        CHECK(!tpk_st_find(&f, "up.weight"), "no up.weight in the file");
        free(w);
        tpk_st_close(&f);
        mesh_destroy(&x);
        refused(dir, 0, TPK_ERR_FORMAT, "no tensor \"up.weight\"", "without the map");
    }

    TEST_CASE("refused by their text: unknown, missing, non-finite, mis-shaped tensors, files of "
              "two checkpoints, an optimizer of another model") {
        char d0[300], d1[300], dn[300], dv[300], dx[300];
        snprintf(d0, sizeof d0, "%s/plain", base), snprintf(d1, sizeof d1, "%s/extra", base);
        snprintf(dn, sizeof dn, "%s/nan", base), snprintf(dv, sizeof dv, "%s/negv", base);
        snprintf(dx, sizeof dx, "%s/mixed", base);
        save_gen(d0, np, 1, 0, 0, NULL, NULL);
        save_gen(d1, np, 1, 1, 0, NULL, NULL);
        refused(d1, 0, TPK_ERR_FORMAT,
                "model.safetensors: tensor \"extra.weight\" is not a parameter of the model",
                "an unknown tensor");
        refused(d0, 1, TPK_ERR_FORMAT, "model.safetensors: no tensor \"extra.weight\"",
                "a missing tensor");
        save_gen(dn, np, 1, 0, 0, NULL, nan_down);
        refused(dn, 0, TPK_ERR_FORMAT,
                "model.safetensors: tensor \"down.weight\": element 5 is nan: expected a finite "
                "value",
                "a NaN weight");
        save_gen(dv, np, 1, 0, 0, NULL, negative_v);
        refused(dv, 0, TPK_ERR_FORMAT,
                "optim.safetensors: tensor \"norm.bias.exp_avg_sq\": element 3 is -1: expected a "
                "finite, non-negative value",
                "a negative second moment");
        refused(d0, 2, TPK_ERR_SHAPE,
                "\"up.weight\" has shape [20, 12], config.json implies [24, 12]", "a wrong shape");
        /* two saves of the same state: the optimizer file of one beside the other's files */
        save_gen(dx, np, 1, 0, 0, NULL, NULL);
        on_root("cp %s/optim.safetensors %s/optim.safetensors", d0, dx);
        refused(dx, 0, TPK_ERR_FORMAT, "files of two checkpoints", "mixed checkpoint ids");
        /* config.json without an id beside files with one: mixed too (only none anywhere loads) */
        save_gen(dx, np, 1, 0, 0, NULL, NULL);
        on_root("sed -i 's/\"tpk_checkpoint_id\"/\"no_id\"/' %s/config.json", dx);
        refused(dx, 0, TPK_ERR_FORMAT,
                "config.json has no tpk_checkpoint_id and model.safetensors has ",
                "config.json without an id beside files with one");
        /* the model file alone loads (no optimizer given) */
        mesh x;
        CHECK_OK(&x.ctx, mesh_init(&x, true, np, 1, 0, true));
        CHECK_OK(&x.ctx, tpk_ckpt_load(&x.ctx, NULL, d0, NULL, NULL));
        /* an optimizer made for another model: a layernorm registered after it */
        CHECK_OK(&x.ctx, tpk_layernorm_init(&x.ctx, &x.m.extra, H,
                                            &(tpk_layernorm_desc){.name = "late"}));
        x.m.has[4] = true;
        CHECK_FAILS(&x.ctx, tpk_ckpt_load(&x.ctx, &x.o, d0, NULL, NULL), TPK_ERR_ARG,
                    "opt: made for");
        CHECK_FAILS(&x.ctx, tpk_ckpt_save(&x.ctx, &x.o, d0, NULL), TPK_ERR_ARG, "opt: made for");
        mesh_destroy(&x);
    }

    TEST_CASE("FP8 state: saved at every (t, p), loaded at another and unsharded; another "
              "history length; refusals; fresh without fp8.safetensors") {
        char dir[300], d2[300], err[1200], what[400];
        for (int a = 0; a < nm; a++) {
            snprintf(dir, sizeof dir, "%s/f8_%d", base, a);
            save_gen(dir, mt[a], mp[a], 3, a, NULL, NULL);
            int b = (a + 1) % nm;
            mesh x;
            snprintf(what, sizeof what, "FP8 state saved at t=%d p=%d, loaded at t=%d p=%d", mt[a],
                     mp[a], mt[b], mp[b]);
            CHECK(load_into(&x, true, dir, mt[b], mp[b], 3, false, NULL, err, sizeof err) ==
                      TPK_OK,
                  "%s: %s", what, err);
            check_fp8(&x, a, 6, what);
            mesh_destroy(&x);
            for (int v = 3; v <= 5; v += 2) { /* unsharded: a 6-step history, a 3-step one */
                snprintf(what, sizeof what, "FP8 state saved at t=%d p=%d, loaded unsharded with "
                         "a %d-step history", mt[a], mp[a], v == 3 ? 6 : 3);
                CHECK(load_into(&x, false, dir, 1, 1, v, false, NULL, err, sizeof err) == TPK_OK,
                      "%s: %s", what, err);
                check_fp8(&x, a, v == 3 ? 6 : 3, what);
                mesh_destroy(&x);
            }
        }
        snprintf(dir, sizeof dir, "%s/f8_0", base);
        mesh x; /* the file: each tensor's history [6] and scale [1] under the recipe's names */
        CHECK_OK(&x.ctx, mesh_init(&x, false, 1, 1, 0, false));
        tpk_st_file f;
        snprintf(what, sizeof what, "%s/fp8.safetensors", dir);
        CHECK_OK(&x.ctx, tpk_st_read(&x.ctx, what, &f));
        const tpk_st_tensor *h = tpk_st_find(&f, "down.grad_output.amax_history"),
                            *sc = tpk_st_find(&f, "up.input.scale");
        CHECK(f.n == 12 && h && h->ndim == 1 && h->shape[0] == 6 && sc && sc->shape[0] == 1 &&
                  tpk_st_meta(&f, "format") && !strcmp(tpk_st_meta(&f, "format"), "tpk-fp8"),
              "fp8.safetensors: 12 tensors, a history [6] and a scale [1] by name, format tpk-fp8");
        tpk_st_close(&f);
        mesh_destroy(&x);
        snprintf(d2, sizeof d2, "%s/f8_short", base); /* saved with 3 steps, loaded with 6 */
        save_gen(d2, 1, 1, 5, 4, NULL, NULL);
        CHECK(load_into(&x, true, d2, np, 1, 3, false, NULL, err, sizeof err) == TPK_OK,
              "a 3-step history loaded into a 6-step one: %s", err);
        check_fp8(&x, 4, 3, "a 3-step history loaded into a 6-step one");
        mesh_destroy(&x);
        refused(dir, 4, TPK_ERR_FORMAT,
                "fp8.safetensors: tensor \"down.input.amax_history\" is not a tensor of the "
                "model's FP8 linears",
                "an FP8 tensor the model has not");
        snprintf(d2, sizeof d2, "%s/f8_up", base);
        save_gen(d2, 1, 1, 4, 0, NULL, NULL);
        refused(d2, 3, TPK_ERR_FORMAT, "fp8.safetensors: no tensor \"down.input.amax_history\"",
                "an FP8 tensor of the model missing");
        snprintf(d2, sizeof d2, "%s/f8_neg", base);
        save_gen(d2, 1, 1, 3, 0, NULL, neg_amax);
        refused(d2, 3, TPK_ERR_FORMAT,
                "\"up.input.amax_history\": element 2 is -1: expected a finite, non-negative",
                "a negative amax");
        snprintf(d2, sizeof d2, "%s/f8_g1", base);
        save_gen(d2, 1, 1, 3, 1, NULL, NULL);
        on_root("cp %s/fp8.safetensors %s/fp8.safetensors", dir, d2);
        refused(d2, 3, TPK_ERR_FORMAT, "fp8.safetensors (step 7) does not belong to config.json",
                "fp8.safetensors of another save");
        /* current scaling saves no state; a delayed recipe loading it keeps its own (fresh) */
        snprintf(d2, sizeof d2, "%s/f8_cur", base);
        save_gen(d2, 1, 1, 6, 0, NULL, NULL);
        snprintf(what, sizeof what, "%s/fp8.safetensors", d2);
        CHECK(!exists(what), "current scaling: no fp8.safetensors");
        CHECK_OK(&x.ctx, mesh_init(&x, true, np, 1, 3, false));
        tpk_ckpt_info info;
        CHECK_OK(&x.ctx, tpk_ckpt_load(&x.ctx, &x.o, d2, NULL, &info));
        bool fresh = !info.has_fp8 && x.f8.steps == 0;
        for (int i = 0; i < x.f8.n; i++) {
            fresh &= x.f8.scale[i] == 1.0f;
            for (int j = 0; j < x.f8.d.history; j++) fresh &= x.f8.hist[6 * i + j] == 0.0f;
        }
        CHECK(fresh, "no fp8.safetensors: the recipe's state fresh (scales 1, zero histories)");
        mesh_destroy(&x);
    }

    TEST_CASE("the directory: a save replaces it whole; each stopped save's state loads whole and "
              "is repaired; tpk_ckpt_remove keeps the user's files") {
        char d[300], old[320], tmp[320], path[400];
        snprintf(d, sizeof d, "%s/swap", base);
        snprintf(old, sizeof old, "%s.tpk-old", d), snprintf(tmp, sizeof tmp, "%s.tpk-new", d);
        mesh x;
        char err[1200];
        save_gen(d, np, 1, 0, 1, NULL, NULL);
        on_root("echo mine > %s/README.md && mkdir -p %s/step-1", d, d);
        save_gen(d, np, 1, 0, 2, NULL, NULL); /* over it */
        snprintf(path, sizeof path, "%s/README.md", d);
        CHECK(exists(path) && !exists(old) && !exists(tmp),
              "a save over a checkpoint: the user's file kept, nothing left beside it");
        snprintf(path, sizeof path, "%s/step-1", d);
        CHECK(exists(path), "the user's directory carried over");
        CHECK(load_into(&x, true, d, np, 1, 0, true, NULL, err, sizeof err) == TPK_OK, "%s", err);
        check_state(&x, 2, "the second save");
        mesh_destroy(&x);
        /* stopped between the renames: DIR.tpk-old alone is the checkpoint */
        on_root("mv %s %s", d, old);
        CHECK(load_into(&x, true, d, np, 1, 0, true, NULL, err, sizeof err) == TPK_OK, "%s", err);
        check_state(&x, 2, "DIR.tpk-old alone");
        tpk_ckpt_info info;
        CHECK_OK(&x.ctx, tpk_ckpt_info_read(&x.ctx, d, &info));
        CHECK(!strcmp(info.dir, old), "info.dir %s, expected %s", info.dir, old);
        mesh_destroy(&x);
        save_gen(d, np, 1, 0, 3, NULL, NULL); /* repairs: the old one renamed back, replaced */
        snprintf(path, sizeof path, "%s/README.md", d);
        CHECK(exists(path) && !exists(old) && !exists(tmp),
              "repaired: README kept, no DIR.tpk-old");
        CHECK(load_into(&x, true, d, np, 1, 0, true, NULL, err, sizeof err) == TPK_OK, "%s", err);
        check_state(&x, 3, "after the repair");
        mesh_destroy(&x);
        /* stopped after the swap: DIR and DIR.tpk-old (with a file of the user's) both there */
        on_root("mkdir -p %s && cp %s/*.json %s/*.safetensors %s/ && echo n > %s/notes.txt", old, d,
                d, old, old);
        CHECK(load_into(&x, true, d, np, 1, 0, true, NULL, err, sizeof err) == TPK_OK, "%s", err);
        check_state(&x, 3, "DIR beside DIR.tpk-old");
        mesh_destroy(&x);
        /* stopped before the swap: a half-written DIR.tpk-new */
        on_root("mkdir -p %s && head -c 100 %s/model.safetensors > %s/model.safetensors", tmp, d,
                tmp);
        CHECK(load_into(&x, true, d, np, 1, 0, true, NULL, err, sizeof err) == TPK_OK, "%s", err);
        check_state(&x, 3, "DIR beside a half-written DIR.tpk-new");
        mesh_destroy(&x);
        save_gen(d, np, 1, 0, 1, NULL, NULL); /* repairs both */
        snprintf(path, sizeof path, "%s/notes.txt", d);
        CHECK(exists(path) && !exists(old) && !exists(tmp),
              "repaired: the old directory's file carried, DIR.tpk-old and DIR.tpk-new gone");
        CHECK(load_into(&x, true, d, np, 1, 0, true, NULL, err, sizeof err) == TPK_OK, "%s", err);
        check_state(&x, 1, "after the second repair");
        mesh_destroy(&x);
        /* a directory of the user's under DIR.tpk-new is not removed: refused, naming it */
        on_root("mkdir -p %s/keep", tmp);
        mesh y;
        CHECK_OK(&y.ctx, mesh_init(&y, true, np, 1, 0, true));
        tpk_clear_error(&y.ctx);
        tpk_status s = tpk_ckpt_save(&y.ctx, &y.o, d, NULL);
        CHECK(s == TPK_ERR_IO &&
                  strstr(tpk_last_error(&y.ctx),
                         me == 0 ? "swap.tpk-new: expected only a stopped save's files there"
                                 : "cannot start the save on world rank 0"),
              "a user's directory in DIR.tpk-new: %s %s", tpk_status_str(s),
              tpk_last_error(&y.ctx));
        mesh_destroy(&y);
        on_root("rm -rf %s", tmp);
        /* tpk_ckpt_remove: the checkpoint's files go, the user's stay */
        if (me == 0) {
            tpk_ctx c;
            CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.seed = 1}));
            CHECK_OK(&c, tpk_ckpt_remove(&c, d));
            snprintf(path, sizeof path, "%s/config.json", d);
            bool gone = !exists(path);
            snprintf(path, sizeof path, "%s/README.md", d);
            CHECK(gone && exists(path), "tpk_ckpt_remove keeps README.md, removes config.json");
            CHECK(tpk_ckpt_is_file("model-00001-of-00002.safetensors") &&
                      tpk_ckpt_is_file("config.json.tmp.123") && !tpk_ckpt_is_file("README.md") &&
                      tpk_ckpt_is_file("fp8.safetensors") &&
                      !tpk_ckpt_is_file("config.json.tmp.x"),
                  "tpk_ckpt_is_file");
            tpk_ctx_destroy(&c);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }

    tpk_comm_destroy(&world);
    return test_finish();
}
