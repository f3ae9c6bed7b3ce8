/* tpk/train/schedule.h — pipeline schedules as data: for every stage, the list of its steps.
 *
 * P stages (ranks of the PP group), M micro-batches, V model chunks per stage (virtual stages):
 * virtual stage u = chunk P + stage holds the u-th of the V P slices of the model (Megatron-LM's
 * interleaving; V = 1: stage s holds slice s). Micro-batch k goes forward through u = 0 .. VP - 1
 * and backward the other way. A step is a compute step — F (chunk, k): the forward of micro-batch k
 * through the stage's chunk; B: its backward — or a message: RECV_ACT (the chunk's input from the
 * previous virtual stage), SEND_ACT (its output to the next), RECV_GRAD (the gradient of its output
 * from the next), SEND_GRAD (the gradient of its input to the previous). Consecutive messages form
 * one batch (tpk_p2p_run: a group in NCCL), so a stage's send and the receive its neighbour posts
 * at the same point do not wait for each other.
 *
 * The orders of compute steps (stage s, w = the warm-up forwards):
 *   GPIPE        F0 .. F(M-1), then B0 .. B(M-1)                     (M activations alive)
 *   1F1B         PipeDream-Flush (Narayanan et al. 2021): w = min(P - s - 1, M) forwards, then
 *                F(w + i) B(i) pairs, then the last w backwards       (at most P - s alive)
 *   INTERLEAVED  Megatron-LM's with V chunks: forward step j (0 .. MV - 1) runs chunk
 *                (j / P) % V on micro-batch (j / PV) P + j % P, backward step j the chunk
 *                V - 1 - (j / P) % V; w = 2 (P - s - 1) + (V - 1) P (all MV when M = P), then
 *                1F1B pairs, then the rest. P >= 2 and M a multiple of P (Megatron's conditions).
 * Backwards run in micro-batch order on every stage and chunk (GPipe's too), so each parameter's
 * gradient sums the micro-batches in the order of a run without a pipeline: the same bits.
 * Messages are placed by one rule from the compute order, cut into units (a compute step; in the
 * interleaved schedule's steady state an F B pair): what unit 0 receives, unit 0, then after each
 * unit one batch of what it sends and what the next unit receives (Megatron's
 * send_forward_recv_backward, and send_forward_backward_recv_forward_backward for the pairs), so
 * every message is posted when the unit that makes or needs it is. (With a batch between the F and
 * the B of a pair, the interleaved schedule deadlocks, and with the unit's sends out of compute
 * order its messages reach a 2-stage peer in another order: tpk_pipe_check found both.)
 * tpk_pipe_check proves a schedule runs: it plays every stage's list at once, with batches that
 * finish only when each part's peer has posted its match (NCCL's rendezvous; the k-th message from
 * one stage to another matches the k-th receive, tags agree), and it checks every (chunk,
 * micro-batch) runs F then B once, after its inputs arrived. It also gives the idle time of each
 * stage with a forward costing 1 and a backward 2 (the bubble). In theory the bubble is
 * (P - 1) / (M + P - 1) of the time for GPipe and 1F1B, and (P - 1) / V / (M + (P - 1) / V)
 * interleaved when M > P (Narayanan et al. 2021); the tests find exactly these. */
#ifndef TPK_SCHEDULE_H
#define TPK_SCHEDULE_H

#include "../runtime/coll.h"

typedef enum tpk_pipe_kind {
    TPK_PIPE_GPIPE = 0,
    TPK_PIPE_1F1B = 1,
    TPK_PIPE_INTERLEAVED = 2,
    TPK_PIPE_KINDS
} tpk_pipe_kind;

typedef enum tpk_pipe_action {
    TPK_PIPE_F = 0,
    TPK_PIPE_B,
    TPK_PIPE_RECV_ACT,
    TPK_PIPE_SEND_ACT,
    TPK_PIPE_RECV_GRAD,
    TPK_PIPE_SEND_GRAD
} tpk_pipe_action;

typedef struct tpk_pipe_step {
    int action; /* tpk_pipe_action */
    int chunk;  /* 0 .. V - 1 */
    int mb;     /* 0 .. M - 1 */
} tpk_pipe_step;

typedef struct tpk_pipe_schedule {
    tpk_pipe_kind kind;
    int P, M, V;
    bool forward_only;    /* forwards alone (evaluation: tpk_pipe_schedule_forward) */
    int *n;               /* [P] steps of each stage */
    tpk_pipe_step **step; /* [P][n[s]] */
    tpk_allocator al;     /* the making context's allocator: tpk_pipe_schedule_free's */
} tpk_pipe_schedule;

static inline const char *tpk_pipe_kind_name(tpk_pipe_kind k) {
    return k == TPK_PIPE_GPIPE         ? "gpipe"
           : k == TPK_PIPE_1F1B        ? "1f1b"
           : k == TPK_PIPE_INTERLEAVED ? "interleaved"
                                       : "?";
}
/* "gpipe", "1f1b" or "interleaved" -> *k; false when it is none of them */
static inline bool tpk_pipe_kind_parse(const char *name, tpk_pipe_kind *k) {
    for (int i = 0; i < TPK_PIPE_KINDS; i++)
        if (name && !strcmp(name, tpk_pipe_kind_name((tpk_pipe_kind)i)))
            return *k = (tpk_pipe_kind)i, true;
    return false;
}

/* Virtual stage of (stage, chunk), and whether it is the first or the last of the model. */
static inline int tpk_pipe_vstage(const tpk_pipe_schedule *s, int stage, int chunk) {
    return chunk * s->P + stage;
}
static inline bool tpk__pipe_first(const tpk_pipe_schedule *s, int stage, int chunk) {
    return tpk_pipe_vstage(s, stage, chunk) == 0;
}
static inline bool tpk__pipe_last(const tpk_pipe_schedule *s, int stage, int chunk) {
    return tpk_pipe_vstage(s, stage, chunk) == s->P * s->V - 1;
}
/* The stage a message of (stage, chunk) goes to or comes from: the next virtual stage's (act out,
 * grad in) or the previous one's (act in, grad out). */
static inline int tpk_pipe_peer(const tpk_pipe_schedule *s, int stage, int action) {
    bool next = action == TPK_PIPE_SEND_ACT || action == TPK_PIPE_RECV_GRAD;
    return next ? (stage + 1) % s->P : (stage + s->P - 1) % s->P;
}
/* A message's tag, the same on the sending and the receiving step: its kind (activation or
 * gradient), the micro-batch and the chunk of the virtual stage it leaves. Unique per pair of
 * stages within a schedule (modulo the largest tag, past which the order alone matches). */
static inline int tpk_pipe_tag(const tpk_pipe_schedule *s, int stage, tpk_pipe_step st) {
    bool act = st.action == TPK_PIPE_SEND_ACT || st.action == TPK_PIPE_RECV_ACT;
    /* the virtual stage the message leaves: the sender's */
    int from = st.action == TPK_PIPE_SEND_ACT || st.action == TPK_PIPE_SEND_GRAD
                   ? tpk_pipe_vstage(s, stage, st.chunk)
                   : tpk_pipe_vstage(s, stage, st.chunk) + (act ? -1 : 1);
    int chunk_from = from / s->P;
    return ((st.mb * s->V + chunk_from) * 2 + (act ? 0 : 1)) % (TPK_P2P_TAG_MAX + 1);
}

static inline void tpk_pipe_schedule_free(tpk_pipe_schedule *s) {
    if (!s) return;
    for (int r = 0; s->step && r < s->P; r++) tpk__al_free(&s->al, s->step[r]);
    tpk__al_free(&s->al, s->step), tpk__al_free(&s->al, s->n);
    memset(s, 0, sizeof *s);
}

/* The compute order of one stage into c[2 M V] (F and B steps); join[i]: step i runs with step i -
 * 1
 * as one unit, no messages between them (the interleaved schedule's steady F B pairs). */
static inline void tpk__pipe_order(const tpk_pipe_schedule *s, int r, tpk_pipe_step *c,
                                   bool *join) {
    int P = s->P, M = s->M, V = s->V, n = 0;
    tpk_pipe_step x;
    x.chunk = 0;
    for (int i = 0; i < (s->forward_only ? 1 : 2) * M * V; i++) join[i] = false;
    if (s->forward_only) { /* the kind's forwards alone (interleaved: in its order of chunks) */
        for (int i = 0; i < M * V; i++) {
            int g = i % (P * V);
            x.action = TPK_PIPE_F, x.chunk = V > 1 ? g / P : 0;
            x.mb = V > 1 ? (i / (P * V)) * P + g % P : i;
            c[n++] = x;
        }
        return;
    }
    if (s->kind == TPK_PIPE_GPIPE) {
        for (int k = 0; k < M; k++) x.action = TPK_PIPE_F, x.mb = k, c[n++] = x;
        for (int k = 0; k < M; k++) x.action = TPK_PIPE_B, x.mb = k, c[n++] = x;
        return;
    }
    int total = M * V, w;
    if (s->kind == TPK_PIPE_1F1B) w = P - r - 1 < M ? P - r - 1 : M;
    else w = M == P ? total : 2 * (P - r - 1) + (V - 1) * P;
    if (w > total) w = total;
    for (int j = 0; j < total + total; j++) { /* forwards 0..w-1, pairs, backwards */
        int f = j < w ? j : j < w + 2 * (total - w) ? (j - w) % 2 == 0 ? w + (j - w) / 2 : -1 : -1;
        int b = j < w                     ? -1
                : j < w + 2 * (total - w) ? (j - w) % 2 == 1 ? (j - w) / 2 : -1
                                          : total - w + (j - w - 2 * (total - w));
        int i = f >= 0 ? f : b; /* the forward or backward step index (0 .. MV - 1) */
        if (i < 0 || i >= total) continue;
        int g = i % (P * V);
        x.action = f >= 0 ? TPK_PIPE_F : TPK_PIPE_B;
        x.chunk = g / P;
        if (f < 0) x.chunk = V - 1 - x.chunk;
        x.mb = (i / (P * V)) * P + g % P;
        join[n] = s->kind == TPK_PIPE_INTERLEAVED && f < 0 && b >= 0 && j < w + 2 * (total - w);
        c[n++] = x;
    }
}

/* Build a schedule (tpk_pipe_schedule_free frees it). GPIPE and 1F1B take V = 1; INTERLEAVED
 * takes V >= 2, P >= 2 and M a multiple of P. Any M >= 1 for the others (M < P leaves stages
 * idle). */
static inline tpk_status tpk__pipe_schedule_make(tpk_ctx *ctx, const char *fn, tpk_pipe_schedule *s,
                                                 tpk_pipe_kind kind, int P, int M, int V,
                                                 bool forward_only) {
    if (!s) return tpk__fail(ctx, TPK_ERR_ARG, fn, "schedule: NULL");
    memset(s, 0, sizeof *s);
    s->forward_only = forward_only;
    if ((unsigned)kind >= (unsigned)TPK_PIPE_KINDS)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "kind: expected TPK_PIPE_GPIPE, _1F1B or _INTERLEAVED, got %d", (int)kind);
    if (P < 1 || P > 4096)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "P (stages): expected 1..4096, got %d", P);
    if (M < 1 || M > 1000000)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "M (micro-batches): expected 1..1000000, got %d", M);
    if (kind != TPK_PIPE_INTERLEAVED && V != 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "V (virtual stages): the %s schedule has one chunk per stage (V = 1), got "
                         "%d; interleave for more",
                         tpk_pipe_kind_name(kind), V);
    if (kind == TPK_PIPE_INTERLEAVED && (V < 2 || V > 1024))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "V (virtual stages): the interleaved schedule takes 2..1024 chunks per "
                         "stage, got %d (V = 1 is 1f1b)",
                         V);
    if (kind == TPK_PIPE_INTERLEAVED && P < 2)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "P (stages): the interleaved schedule needs >= 2 stages, got %d", P);
    if (kind == TPK_PIPE_INTERLEAVED && M % P)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "M (micro-batches): the interleaved schedule needs a multiple of the %d "
                         "stages, got %d",
                         P, M);
    if ((double)M * V * 2 * 2 > (double)INT_MAX / 2)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "M x V: %d x %d steps are too many", M, V);
    bool fo = s->forward_only; /* (set by tpk_pipe_schedule_forward) */
    memset(s, 0, sizeof *s);
    s->kind = kind, s->P = P, s->M = M, s->V = V, s->forward_only = fo;
    s->al = tpk__allocator(ctx);
    int nc = (fo ? 1 : 2) * M * V;
    s->n = (int *)tpk__calloc(ctx, (size_t)P, sizeof *s->n);
    s->step = (tpk_pipe_step **)tpk__calloc(ctx, (size_t)P, sizeof *s->step);
    tpk_pipe_step *c = (tpk_pipe_step *)tpk__malloc(ctx, sizeof *c * (size_t)nc);
    bool *join = (bool *)tpk__malloc(ctx, sizeof *join * (size_t)nc);
    for (int r = 0; s->n && s->step && c && join && r < P; r++)
        if (!(s->step[r] =
                  (tpk_pipe_step *)tpk__malloc(ctx, sizeof **s->step * (size_t)(3 * nc + 1))))
            break;
    if (!s->n || !s->step || !c || !join || (P && !s->step[P - 1])) {
        tpk__free(ctx, c), tpk__free(ctx, join), tpk_pipe_schedule_free(s);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %d x %d steps", P, 3 * nc);
    }
    for (int r = 0; r < P; r++) {
        tpk__pipe_order(s, r, c, join);
        tpk_pipe_step *o = s->step[r];
        int n = 0;
        /* units: a compute step, or a joined pair; before a unit, one batch of what the unit
           before sends and what this one receives; the compute steps; after the last, its sends */
        for (int i = 0; i <= nc;) {
            int e = i < nc ? i + 1 : i; /* the unit [i, e) */
            while (e < nc && join[e]) e++;
            int u0 = i - 1; /* the unit before: [u0, i) */
            while (u0 > 0 && join[u0]) u0--;
            for (int j = i > 0 ? u0 : i; j < i; j++) { /* what the unit before sends, in order */
                tpk_pipe_step m = c[j];
                bool f = m.action == TPK_PIPE_F;
                if (f ? !tpk__pipe_last(s, r, m.chunk) : !tpk__pipe_first(s, r, m.chunk))
                    m.action = f ? TPK_PIPE_SEND_ACT : TPK_PIPE_SEND_GRAD, o[n++] = m;
            }
            for (int j = i; j < e; j++) { /* what this unit receives */
                tpk_pipe_step m = c[j];
                bool f = m.action == TPK_PIPE_F;
                if (f ? !tpk__pipe_first(s, r, m.chunk) : !tpk__pipe_last(s, r, m.chunk))
                    m.action = f ? TPK_PIPE_RECV_ACT : TPK_PIPE_RECV_GRAD, o[n++] = m;
            }
            for (int j = i; j < e; j++) o[n++] = c[j];
            if (i == nc) break;
            i = e;
        }
        s->n[r] = n;
    }
    tpk__free(ctx, c), tpk__free(ctx, join);
    return TPK_OK;
}
static inline tpk_status tpk_pipe_schedule_make(tpk_ctx *ctx, tpk_pipe_schedule *s,
                                                tpk_pipe_kind kind, int P, int M, int V) {
    return tpk__pipe_schedule_make(ctx, "tpk_pipe_schedule_make", s, kind, P, M, V, false);
}
/* The forwards of the kind's schedule alone, and their messages (evaluation: no backward, a
 * micro-batch's activations dropped after its forward); the same conditions on P, M, V. */
static inline tpk_status tpk_pipe_schedule_forward(tpk_ctx *ctx, tpk_pipe_schedule *s,
                                                   tpk_pipe_kind kind, int P, int M, int V) {
    return tpk__pipe_schedule_make(ctx, "tpk_pipe_schedule_forward", s, kind, P, M, V, true);
}

/* The messages a stage sends and receives in one run of the schedule. */
static inline void tpk_pipe_messages(const tpk_pipe_schedule *s, int stage, int *sends,
                                     int *recvs) {
    int a = 0, b = 0;
    for (int i = 0; i < s->n[stage]; i++) {
        int x = s->step[stage][i].action;
        a += x == TPK_PIPE_SEND_ACT || x == TPK_PIPE_SEND_GRAD;
        b += x == TPK_PIPE_RECV_ACT || x == TPK_PIPE_RECV_GRAD;
    }
    *sends = a, *recvs = b;
}

/* One step as text: "F3", "B0" (V = 1) or "F3.1" (micro-batch 3, chunk 1); messages ">a3"
 * (activation sent), "<a3" (received), ">g3", "<g3". */
static inline const char *tpk_pipe_step_str(const tpk_pipe_schedule *s, tpk_pipe_step st, char *buf,
                                            size_t n) {
    static const char *const pre[] = {"F", "B", "<a", ">a", "<g", ">g"};
    if (s->V > 1) snprintf(buf, n, "%s%d.%d", pre[st.action % 6], st.mb, st.chunk);
    else snprintf(buf, n, "%s%d", pre[st.action % 6], st.mb);
    return buf;
}

/* Print each stage's list, one line a stage ("stage 0: F0 F1 B0 ..."): compute steps only, or with
 * the messages in brackets, a batch per bracket (messages = true). */
static inline void tpk_pipe_print(const tpk_pipe_schedule *s, bool messages, FILE *f) {
    fprintf(f, "schedule %s: %d stage%s, %d micro-batch%s, %d chunk%s a stage\n",
            tpk_pipe_kind_name(s->kind), s->P, s->P == 1 ? "" : "s", s->M, s->M == 1 ? "" : "es",
            s->V, s->V == 1 ? "" : "s");
    for (int r = 0; r < s->P; r++) {
        fprintf(f, "stage %d:", r);
        bool open = false;
        for (int i = 0; i < s->n[r]; i++) {
            char b[32];
            tpk_pipe_step st = s->step[r][i];
            bool msg = st.action >= TPK_PIPE_RECV_ACT;
            if (msg && !messages) continue;
            const char *sep = " ";
            if (msg && !open) sep = " [", open = true;
            else if (!msg && open) sep = "] ", open = false;
            fprintf(f, "%s%s", sep, tpk_pipe_step_str(s, st, b, sizeof b));
        }
        fprintf(f, "%s\n", open ? "]" : "");
    }
}

/* Play the schedule: every stage at once, a compute step takes cost_f (F) or cost_b (B) time units,
 * a batch of messages finishes once every part's peer has posted its match (the k-th message from
 * stage a to stage b matches b's k-th receive from a; their tags must agree). TPK_OK when every
 * stage reaches its end, every (chunk, micro-batch) ran F then B once on its stage, each after its
 * input arrived (RECV_ACT before F unless first, RECV_GRAD before B unless last); else TPK_ERR_ARG
 * naming the first fault (a deadlock: the steps each stage waits at). idle[P] (may be NULL): each
 * stage's time waiting, over the makespan *span (may be NULL). */
static inline tpk_status tpk__pipe_play(tpk_ctx *ctx, const tpk_pipe_schedule *s, double cost_f,
                                        double cost_b, const double *cf, const double *cb,
                                        double *idle, double *span) {
    static const char *fn = "tpk_pipe_check";
    if (!s || !s->n || !s->step)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "schedule: expected a built schedule");
    int P = s->P, M = s->M, V = s->V, ring = 2 * M * V + 1;
    size_t pp = (size_t)P * (size_t)P, cells = (size_t)P * (size_t)M * (size_t)V;
    int *pc = (int *)tpk__calloc(ctx, (size_t)P, sizeof(int));    /* each stage's next step */
    bool *in = (bool *)tpk__calloc(ctx, (size_t)P, sizeof(bool)); /* its batch is posted */
    int *part =
        (int *)tpk__calloc(ctx, (size_t)P * TPK_P2P_MAX, sizeof(int));    /* the posted parts' k */
    double *t = (double *)tpk__calloc(ctx, (size_t)P, sizeof(double));    /* each stage's clock */
    double *busy = (double *)tpk__calloc(ctx, (size_t)P, sizeof(double)); /* its compute time */
    int *nsend = (int *)tpk__calloc(ctx, pp, sizeof(int)); /* [a][b]: sends a -> b posted */
    int *nrecv = (int *)tpk__calloc(ctx, pp, sizeof(int)); /* [a][b]: receives from a posted by b */
    /* [a][b][k % ring]: the k-th send's tag and the posting times of send and receive */
    int *tags = (int *)tpk__calloc(ctx, pp * (size_t)ring, sizeof(int));
    double *tsend = (double *)tpk__calloc(ctx, pp * (size_t)ring, sizeof(double));
    double *trecv = (double *)tpk__calloc(ctx, pp * (size_t)ring, sizeof(double));
    unsigned char *state =
        (unsigned char *)tpk__calloc(ctx, cells, 1); /* 0, 1 after F, 2 after B */
    unsigned char *got =
        (unsigned char *)tpk__calloc(ctx, cells, 1); /* 1: input, 2: gradient arrived */
    tpk_status st = TPK_OK;
    char b[32];
    if (!pc || !in || !part || !t || !busy || !nsend || !nrecv || !tags || !tsend || !trecv ||
        !state || !got) {
        st = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
        goto done;
    }
    for (;;) {
        bool progress = false, all = true;
        for (int r = 0; r < P && st == TPK_OK; r++) {
            if (pc[r] >= s->n[r]) continue;
            all = false;
            tpk_pipe_step x = s->step[r][pc[r]];
            if (x.chunk < 0 || x.chunk >= V || x.mb < 0 || x.mb >= M || x.action < 0 ||
                x.action > TPK_PIPE_SEND_GRAD) {
                st = tpk__fail(ctx, TPK_ERR_ARG, fn, "stage %d step %d: out of range", r, pc[r]);
                break;
            }
            if (x.action == TPK_PIPE_F || x.action == TPK_PIPE_B) {
                size_t id = ((size_t)r * (size_t)V + (size_t)x.chunk) * (size_t)M + (size_t)x.mb;
                bool f = x.action == TPK_PIPE_F;
                bool need = f ? !tpk__pipe_first(s, r, x.chunk) : !tpk__pipe_last(s, r, x.chunk);
                if (state[id] != (f ? 0 : 1))
                    st = tpk__fail(ctx, TPK_ERR_ARG, fn, "stage %d: %s %s", r,
                                   tpk_pipe_step_str(s, x, b, sizeof b),
                                   f ? "runs twice" : "runs twice or before its forward");
                else if (need && !(got[id] & (f ? 1 : 2)))
                    st = tpk__fail(ctx, TPK_ERR_ARG, fn, "stage %d: %s runs before its %s arrived",
                                   r, tpk_pipe_step_str(s, x, b, sizeof b),
                                   f ? "input" : "output gradient");
                if (st != TPK_OK) break;
                state[id] = f ? 1 : 2;
                double c = f ? (cf ? cf[r] : cost_f) : (cb ? cb[r] : cost_b);
                t[r] += c, busy[r] += c, pc[r]++, progress = true;
                continue;
            }
            int e = pc[r]; /* the batch: the messages up to the next compute step */
            while (e < s->n[r] && s->step[r][e].action >= TPK_PIPE_RECV_ACT) e++;
            if (e - pc[r] > TPK_P2P_MAX) {
                st =
                    tpk__fail(ctx, TPK_ERR_ARG, fn, "stage %d: a batch of %d messages (at most %d)",
                              r, e - pc[r], TPK_P2P_MAX);
                break;
            }
            if (!in[r]) { /* reaching the batch: post every part, sends and receives, at t[r] */
                for (int i = pc[r]; i < e; i++) {
                    tpk_pipe_step y = s->step[r][i];
                    bool send = y.action == TPK_PIPE_SEND_ACT || y.action == TPK_PIPE_SEND_GRAD;
                    int q = tpk_pipe_peer(s, r, y.action);
                    if (q == r) {
                        st = tpk__fail(ctx, TPK_ERR_ARG, fn,
                                       "stage %d: %s has itself as its peer "
                                       "(one stage has no messages)",
                                       r, tpk_pipe_step_str(s, y, b, sizeof b));
                        break;
                    }
                    size_t ab = send ? (size_t)r * P + q : (size_t)q * P + r;
                    int k = send ? nsend[ab]++ : nrecv[ab]++;
                    size_t slot = ab * (size_t)ring + (size_t)(k % ring);
                    if (send) tags[slot] = tpk_pipe_tag(s, r, y), tsend[slot] = t[r];
                    else trecv[slot] = t[r];
                    part[(size_t)r * TPK_P2P_MAX + (size_t)(i - pc[r])] = k;
                }
                if (st != TPK_OK) break;
                in[r] = true, progress = true;
            }
            /* the batch finishes when every part's match is posted: at the latest posting time */
            bool ready = true;
            double tdone = t[r];
            for (int i = pc[r]; i < e && ready; i++) {
                tpk_pipe_step y = s->step[r][i];
                bool send = y.action == TPK_PIPE_SEND_ACT || y.action == TPK_PIPE_SEND_GRAD;
                int q = tpk_pipe_peer(s, r, y.action),
                    k = part[(size_t)r * TPK_P2P_MAX + (size_t)(i - pc[r])];
                size_t ab = send ? (size_t)r * P + q : (size_t)q * P + r;
                size_t slot = ab * (size_t)ring + (size_t)(k % ring);
                if (send ? nrecv[ab] <= k : nsend[ab] <= k) {
                    ready = false;
                    break;
                }
                if (!send && tags[slot] != tpk_pipe_tag(s, r, y)) {
                    st = tpk__fail(ctx, TPK_ERR_ARG, fn,
                                   "stage %d: %s would take a message of another step from stage "
                                   "%d (their orders of sends and receives differ)",
                                   r, tpk_pipe_step_str(s, y, b, sizeof b), q);
                    break;
                }
                double tp = send ? trecv[slot] : tsend[slot];
                if (tp > tdone) tdone = tp;
            }
            if (st != TPK_OK || !ready) continue;
            for (int i = pc[r]; i < e; i++) {
                tpk_pipe_step y = s->step[r][i];
                if (y.action == TPK_PIPE_RECV_ACT || y.action == TPK_PIPE_RECV_GRAD)
                    got[((size_t)r * V + (size_t)y.chunk) * (size_t)M + (size_t)y.mb] |=
                        y.action == TPK_PIPE_RECV_ACT ? 1 : 2;
            }
            t[r] = tdone, pc[r] = e, in[r] = false, progress = true;
        }
        if (st != TPK_OK || all) break;
        if (!progress) {
            char w[256];
            size_t k = 0;
            for (int r = 0; r < P && k + 48 < sizeof w; r++)
                if (pc[r] < s->n[r])
                    k += (size_t)snprintf(w + k, sizeof w - k, "%sstage %d at %s", k ? ", " : "", r,
                                          tpk_pipe_step_str(s, s->step[r][pc[r]], b, sizeof b));
            st = tpk__fail(ctx, TPK_ERR_ARG, fn, "deadlock: %s", w);
            break;
        }
    }
    for (size_t i = 0; st == TPK_OK && i < cells; i++)
        if (state[i] != (s->forward_only ? 1 : 2)) {
            int r = (int)(i / ((size_t)M * V)), c = (int)(i / (size_t)M % (size_t)V),
                k = (int)(i % (size_t)M);
            st = tpk__fail(ctx, TPK_ERR_ARG, fn,
                           "stage %d: micro-batch %d of chunk %d does not run forward%s", r, k, c,
                           s->forward_only ? "" : " and backward");
        }
    if (st == TPK_OK) {
        double mk = 0;
        for (int r = 0; r < P; r++) mk = t[r] > mk ? t[r] : mk;
        if (span) *span = mk;
        for (int r = 0; idle && r < P; r++) idle[r] = mk - busy[r];
    }
done:
    tpk__free(ctx, pc), tpk__free(ctx, in), tpk__free(ctx, part), tpk__free(ctx, t);
    tpk__free(ctx, busy), tpk__free(ctx, nsend), tpk__free(ctx, nrecv), tpk__free(ctx, tags);
    tpk__free(ctx, tsend), tpk__free(ctx, trecv), tpk__free(ctx, state), tpk__free(ctx, got);
    return st;
}
static inline tpk_status tpk_pipe_check(tpk_ctx *ctx, const tpk_pipe_schedule *s, double cost_f,
                                        double cost_b, double *idle, double *span) {
    return tpk__pipe_play(ctx, s, cost_f, cost_b, NULL, NULL, idle, span);
}
/* tpk_pipe_check with each stage's own costs: a forward on stage r takes cost_f[r], a backward
 * cost_b[r] (a planner's: the first stage holds the embedding, the last the head and the loss). */
static inline tpk_status tpk_pipe_check_costs(tpk_ctx *ctx, const tpk_pipe_schedule *s,
                                              const double *cost_f, const double *cost_b,
                                              double *idle, double *span) {
    if (!cost_f || !cost_b)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_pipe_check_costs", "cost_f, cost_b: NULL");
    return tpk__pipe_play(ctx, s, 0, 0, cost_f, cost_b, idle, span);
}

#endif /* TPK_SCHEDULE_H */
