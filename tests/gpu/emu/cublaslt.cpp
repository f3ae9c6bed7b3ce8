/* tests/gpu/emu/cublaslt.cpp — cuBLASLt emulated for the CPU run of the CUDA backend (cublasLt.h).
 *
 * cublasLtMatmul computes D = alpha op(A) op(B) + beta C (C not read when beta = 0) in column-major
 * layouts with double accumulation, then the epilogue: + bias[row] (bias of D's type), GELU-tanh
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the pre-activation written to the aux buffer
 * (D's type, leading dimension EPILOGUE_AUX_LD); or backward, DGELU: x times GELU-tanh's derivative
 * at the aux buffer's value, and with BGRAD the bias vector written with each row's sum of the
 * result (D's type). As cuBLASLt it checks what it is given: live
 * descriptors, attribute sizes, operand shapes that agree (k of op(A) and op(B), C and D alike),
 * ld >= rows, device ranges inside allocations, pointers at least as aligned as the heuristic was
 * told (MIN_ALIGNMENT_* preferences, the bias and aux pointers set when it ran), an algorithm
 * used for the problem it was found for. Unsupported (no algorithm, heuristic count 0, as cuBLASLt
 * answers): an aux leading dimension not a multiple of 8 or below D's rows, an epilogue or type
 * outside the list in cublasLt.h (bf16 A, B with f32 C, D: the default epilogue only; FP8 A, B as
 * cuBLASLt's FP8 matmul takes them: E4M3 or E5M2 but not both E5M2, the TN layout, C and D alike
 * in bf16 or f32, the default epilogue, sizes and the operands' ld multiples of 16, each code
 * decoded from its bit layout here);
 * TPK_EMU_LT_NOALGO=1 in the environment answers so for every problem (the backend's fallback
 * kernel and composed linear path then run). Misuse prints a "FAIL emu:" line
 * (TPK_EMU_LT_ALIGN=warn: a misaligned pointer only noted on stderr). */
#include "cublasLt.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

struct tpk_emu_lt {
    int unused;
};
struct tpk_emu_lt_desc {
    int32_t compute, scale, pointer_mode, transa, transb, transc, bias_type, aux_type;
    uint32_t epi;
    const void *bias;
    void *aux;
    int64_t aux_ld;
};
struct tpk_emu_lt_layout {
    int32_t type, order, batch;
    uint64_t rows, cols;
    int64_t ld;
};
struct tpk_emu_lt_pref {
    uint64_t ws;
    uint32_t align[4];
};
static std::set<const void *> g_live; /* handles and descriptors not yet destroyed */
static bool live(const void *p, const char *what) {
    if (p && g_live.count(p)) return true;
    tpk_emu_fail("%s: %p is not a live cuBLASLt handle or descriptor", what, p);
    return false;
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new tpk_emu_lt{0};
    g_live.insert(*h);
    return CUBLAS_STATUS_SUCCESS;
}
template <class T> static cublasStatus_t destroy(T *p, const char *what) {
    if (!live(p, what)) return CUBLAS_STATUS_INVALID_VALUE;
    g_live.erase(p);
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return destroy(h, "cublasLtDestroy"); }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    *d = new tpk_emu_lt_desc{(int32_t)compute,
                             (int32_t)scale,
                             0,
                             CUBLAS_OP_N,
                             CUBLAS_OP_N,
                             CUBLAS_OP_N,
                             -1,
                             -1,
                             CUBLASLT_EPILOGUE_DEFAULT,
                             NULL,
                             NULL,
                             0};
    g_live.insert(*d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    return destroy(d, "cublasLtMatmulDescDestroy");
}

/* copy an attribute of exactly `want` bytes (cuBLASLt refuses another size) */
static cublasStatus_t attr(void *dst, size_t want, const void *buf, size_t bytes, const char *what,
                           int a) {
    if (bytes != want || !buf) {
        tpk_emu_fail("%s(attribute %d): %zu bytes given, the attribute has %zu", what, a, bytes,
                     want);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memcpy(dst, buf, want);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t bytes) {
    static const char *fn = "cublasLtMatmulDescSetAttribute";
    if (!live(d, fn)) return CUBLAS_STATUS_INVALID_VALUE;
    switch (a) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return attr(&d->compute, 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return attr(&d->scale, 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return attr(&d->pointer_mode, 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_TRANSA: return attr(&d->transa, 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_TRANSB: return attr(&d->transb, 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_TRANSC: return attr(&d->transc, 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return attr(&d->epi, 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return attr(&d->bias, sizeof(void *), buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        return attr(&d->aux, sizeof(void *), buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return attr(&d->aux_ld, 8, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return attr(&d->bias_type, 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
        return attr(&d->aux_type, 4, buf, bytes, fn, a);
    default:
        tpk_emu_fail("%s: attribute %d is not emulated", fn, (int)a);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    *l = new tpk_emu_lt_layout{(int32_t)type, CUBLASLT_ORDER_COL, 1, rows, cols, ld};
    g_live.insert(*l);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    return destroy(l, "cublasLtMatrixLayoutDestroy");
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t a, const void *buf,
                                                size_t bytes) {
    static const char *fn = "cublasLtMatrixLayoutSetAttribute";
    if (!live(l, fn)) return CUBLAS_STATUS_INVALID_VALUE;
    switch (a) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return attr(&l->type, 4, buf, bytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return attr(&l->order, 4, buf, bytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return attr(&l->rows, 8, buf, bytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return attr(&l->cols, 8, buf, bytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_LD: return attr(&l->ld, 8, buf, bytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return attr(&l->batch, 4, buf, bytes, fn, a);
    default:
        tpk_emu_fail("%s: attribute %d is not emulated", fn, (int)a);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new tpk_emu_lt_pref{0, {256, 256, 256, 256}}; /* cuBLASLt's defaults: no workspace,
                                                          256-byte alignment */
    g_live.insert(*p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    return destroy(p, "cublasLtMatmulPreferenceDestroy");
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t bytes) {
    static const char *fn = "cublasLtMatmulPreferenceSetAttribute";
    if (!live(p, fn)) return CUBLAS_STATUS_INVALID_VALUE;
    switch (a) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return attr(&p->ws, 8, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
        return attr(&p->align[0], 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
        return attr(&p->align[1], 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
        return attr(&p->align[2], 4, buf, bytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        return attr(&p->align[3], 4, buf, bytes, fn, a);
    default:
        tpk_emu_fail("%s: attribute %d is not emulated", fn, (int)a);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

/* ---- the problem a descriptor set describes -------------------------------------------------- */

struct problem {
    int64_t m, n, k;
    int type, btype, ctype; /* of A, of B; of C and D (f32 with bf16 A, B: the f32-output GEMM) */
    bool ta, tb, bias, gelu, aux, dgelu, bgrad; /* dgelu reads aux, bgrad writes the bias vector */
    uint64_t hash;
};
static uint32_t align_of(const void *p) {
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && u % a) a >>= 1;
    return a;
}
/* CUBLAS_STATUS_SUCCESS with p filled, INVALID_VALUE (why: the reason) or NOT_SUPPORTED */
static cublasStatus_t describe(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t A,
                               cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                               cublasLtMatrixLayout_t D, problem &p, std::string &why) {
    char buf[256];
    if (!live(op, "matmul descriptor") || !live(A, "layout A") || !live(B, "layout B") ||
        !live(C, "layout C") || !live(D, "layout D")) {
        why = "a dead descriptor";
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const tpk_emu_lt_layout *L[4] = {A, B, C, D};
    for (const tpk_emu_lt_layout *l : L) {
        if (l->order != CUBLASLT_ORDER_COL || l->batch != 1) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (l->rows > 0 && l->cols > 0 && l->ld < (int64_t)l->rows) {
            snprintf(buf, sizeof buf, "ld %lld < rows %llu", (long long)l->ld,
                     (unsigned long long)l->rows);
            why = buf;
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    /* A, B and C, D alike in f32 or bf16, or bf16 A, B with f32 C, D (no epilogue); or FP8 A, B
     * in cuBLASLt's FP8 matmul's terms (TN, multiples of 16, not both E5M2) */
    bool mixed = A->type == CUDA_R_16BF && D->type == CUDA_R_32F,
         f8a = A->type == CUDA_R_8F_E4M3 || A->type == CUDA_R_8F_E5M2,
         f8b = B->type == CUDA_R_8F_E4M3 || B->type == CUDA_R_8F_E5M2;
    if (f8a || f8b) {
        if (!f8a || !f8b || (A->type == CUDA_R_8F_E5M2 && B->type == CUDA_R_8F_E5M2) ||
            C->type != D->type || (D->type != CUDA_R_32F && D->type != CUDA_R_16BF) ||
            op->epi != CUBLASLT_EPILOGUE_DEFAULT || op->transa != CUBLAS_OP_T ||
            op->transb != CUBLAS_OP_N || D->rows % 16 || D->cols % 16 || A->rows % 16 ||
            A->ld % 16 || B->ld % 16 || op->compute != CUBLAS_COMPUTE_32F)
            return CUBLAS_STATUS_NOT_SUPPORTED;
    } else if (A->type != B->type || C->type != D->type || (A->type != D->type && !mixed) ||
               (D->type != CUDA_R_32F && D->type != CUDA_R_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (mixed && op->epi != CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (op->scale != CUDA_R_32F || op->pointer_mode != 0 || op->transc != CUBLAS_OP_N)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (op->compute != CUBLAS_COMPUTE_32F && !(op->compute == CUBLAS_COMPUTE_32F_FAST_TF32 &&
                                               A->type == CUDA_R_32F && D->type == CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((op->transa != CUBLAS_OP_N && op->transa != CUBLAS_OP_T) ||
        (op->transb != CUBLAS_OP_N && op->transb != CUBLAS_OP_T))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    p.ta = op->transa == CUBLAS_OP_T, p.tb = op->transb == CUBLAS_OP_T, p.type = A->type,
    p.btype = B->type, p.ctype = D->type;
    p.m = (int64_t)D->rows, p.n = (int64_t)D->cols;
    int64_t am = (int64_t)(p.ta ? A->cols : A->rows), ak = (int64_t)(p.ta ? A->rows : A->cols);
    int64_t bk = (int64_t)(p.tb ? B->cols : B->rows), bn = (int64_t)(p.tb ? B->rows : B->cols);
    p.k = ak;
    if (am != p.m || bn != p.n || ak != bk || C->rows != D->rows || C->cols != D->cols) {
        snprintf(
            buf, sizeof buf,
            "shapes disagree: op(A) %lld x %lld (trans %d), op(B) %lld x %lld (trans %d), C %llu x "
            "%llu, D %llu x %llu",
            (long long)am, (long long)ak, p.ta, (long long)bk, (long long)bn, p.tb,
            (unsigned long long)C->rows, (unsigned long long)C->cols, (unsigned long long)D->rows,
            (unsigned long long)D->cols);
        why = buf;
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    p.dgelu = p.bgrad = false;
    switch (op->epi) {
    case CUBLASLT_EPILOGUE_DGELU: p.dgelu = p.aux = true, p.bias = p.gelu = false; break;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        p.dgelu = p.aux = p.bgrad = p.bias = true, p.gelu = false;
        break;
    case CUBLASLT_EPILOGUE_DEFAULT: p.bias = p.gelu = p.aux = false; break;
    case CUBLASLT_EPILOGUE_BIAS: p.bias = true, p.gelu = p.aux = false; break;
    case CUBLASLT_EPILOGUE_GELU: p.gelu = true, p.bias = p.aux = false; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: p.gelu = p.bias = true, p.aux = false; break;
    case CUBLASLT_EPILOGUE_GELU_AUX: p.gelu = p.aux = true, p.bias = false; break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: p.gelu = p.aux = p.bias = true; break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((op->bias_type >= 0 && op->bias_type != D->type) ||
        (op->aux_type >= 0 && op->aux_type != D->type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (p.aux && (op->aux_ld % 8 != 0 || op->aux_ld < p.m))
        return CUBLAS_STATUS_NOT_SUPPORTED; /* "must be divisible by 8 and >= rows" */
    uint64_t h = 1469598103934665603ull;
    int64_t v[] = {p.m,         p.n,
                   p.k,         p.type * 64 + p.btype,
                   p.ctype,     p.ta,
                   p.tb,        (int64_t)op->epi,
                   A->ld,       B->ld,
                   C->ld,       D->ld,
                   op->compute, p.aux ? op->aux_ld : 0};
    for (int64_t x : v) h = (h ^ (uint64_t)x) * 1099511628211ull;
    p.hash = h;
    return CUBLAS_STATUS_SUCCESS;
}

enum { ALGO_MAGIC = 0x74706b656d75ull & 0xffffffff };
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *results,
                                              int *returned) {
    static const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    *returned = 0;
    if (!live(h, fn) || !live(pref, fn) || requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    problem p;
    std::string why;
    cublasStatus_t s = describe(op, a, b, c, d, p, why);
    if (s == CUBLAS_STATUS_INVALID_VALUE) tpk_emu_fail("%s: %s", fn, why.c_str());
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    const char *none = getenv("TPK_EMU_LT_NOALGO");
    if (none && strcmp(none, "0") != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(results, 0, sizeof *results);
    uint64_t *q = results[0].algo.data;
    q[0] = ALGO_MAGIC, q[1] = p.hash;
    for (int i = 0; i < 4; i++) q[2 + i] = pref->align[i];
    /* "routines that don't dereference this pointer, like cublasLtMatmulAlgoGetHeuristic(), depend
     * on its value to determine expected pointer alignment": the bias and aux pointers now */
    q[6] = align_of(op->bias), q[7] = align_of(op->aux);
    results[0].workspaceSize = 0, results[0].state = CUBLAS_STATUS_SUCCESS,
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* an FP8 code's value from its bit layout: E4M3 (OCP E4M3FN: bias 7, no infinities, S.1111.111
 * NaN), E5M2 (bias 15, IEEE-like) */
static double fp8_value(uint8_t c, bool e4m3) {
    int e = e4m3 ? (c >> 3) & 15 : (c >> 2) & 31, mb = e4m3 ? 3 : 2, m = c & ((1 << mb) - 1),
        bias = e4m3 ? 7 : 15;
    double sg = c & 0x80 ? -1.0 : 1.0;
    if (e4m3 && e == 15 && m == 7) return NAN;
    if (!e4m3 && e == 31) return m ? NAN : sg * INFINITY;
    return sg * (e ? ldexp(1.0 + m / (double)(1 << mb), e - bias)
                   : ldexp(m / (double)(1 << mb), 1 - bias));
}
static double load(const void *p, int type, size_t i) {
    if (type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2)
        return fp8_value(((const uint8_t *)p)[i], type == CUDA_R_8F_E4M3);
    return type == CUDA_R_32F ? (double)((const float *)p)[i]
                              : (double)tpk_emu_bf2f(((const uint16_t *)p)[i]);
}
static void store(void *p, int type, size_t i, float v) {
    if (type == CUDA_R_32F) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = tpk_emu_f2bf(v);
}
static size_t span(int64_t rows, int64_t cols, int64_t ld, int type) {
    size_t es = type == CUDA_R_32F ? 4 : type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2 ? 1 : 2;
    return rows > 0 && cols > 0 ? (size_t)(ld * (cols - 1) + rows) * es : 0;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t la, const void *B,
                              cublasLtMatrixLayout_t lb, const void *beta, const void *C,
                              cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
                              cudaStream_t stream) {
    static const char *fn = "cublasLtMatmul";
    (void)stream;
    if (!live(h, fn)) return CUBLAS_STATUS_NOT_INITIALIZED;
    problem p;
    std::string why;
    cublasStatus_t s = describe(op, la, lb, lc, ld, p, why);
    if (s == CUBLAS_STATUS_INVALID_VALUE) tpk_emu_fail("%s: %s", fn, why.c_str());
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!alpha || !beta || !D || (p.k > 0 && (!A || !B))) return CUBLAS_STATUS_INVALID_VALUE;
    if (algo && (algo->data[0] != ALGO_MAGIC || algo->data[1] != p.hash)) {
        tpk_emu_fail("%s: the algorithm was found for another problem (shape, layouts, epilogue)",
                     fn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (algo) {
        const void *ptr[6] = {A, B, C, D, op->bias, op->aux};
        static const char *names[6] = {"A", "B", "C", "D", "bias", "aux"};
        for (int i = 0; i < 6; i++) {
            /* the bias and aux vectors: at most 16-byte loads and stores assumed, so a pointer the
             * heuristic saw (NULL: any alignment) asks for min(its alignment, 16) */
            uint64_t need = i < 4 ? algo->data[2 + i] : std::min<uint64_t>(algo->data[2 + i], 16);
            if ((i < 4 || (i == 4 ? p.bias : p.aux)) && align_of(ptr[i]) < need) {
                static const char *lax = getenv("TPK_EMU_LT_ALIGN"); /* "warn": a note on stderr,
                                                                        the product computed */
                if (lax && !strcmp(lax, "warn")) {
                    fprintf(
                        stderr,
                        "emu note: cublasLtMatmul: %s = %p is %u-byte aligned, the algorithm was "
                        "chosen for %llu\n",
                        names[i], ptr[i], align_of(ptr[i]), (unsigned long long)need);
                    continue;
                }
                tpk_emu_fail(
                    "%s: %s = %p is %u-byte aligned, the algorithm was chosen for %llu-byte "
                    "alignment (%s)",
                    fn, names[i], ptr[i], align_of(ptr[i]), (unsigned long long)need,
                    i < 4 ? "MIN_ALIGNMENT preference"
                          : "the descriptor's pointer when the heuristic ran");
                return CUBLAS_STATUS_NOT_SUPPORTED;
            }
        }
    }
    if (ws_bytes && !tpk_emu_check_device(ws, ws_bytes, "cublasLtMatmul workspace"))
        return CUBLAS_STATUS_INVALID_VALUE;
    float al, be;
    memcpy(&al, alpha, 4), memcpy(&be, beta, 4);
    int t = p.type, tb = p.btype, tc = p.ctype; /* A; B; C, D */
    bool ok = tpk_emu_check_device(A, span(la->rows, la->cols, la->ld, t), "cublasLtMatmul A") &&
              tpk_emu_check_device(B, span(lb->rows, lb->cols, lb->ld, tb), "cublasLtMatmul B") &&
              tpk_emu_check_device(D, span(ld->rows, ld->cols, ld->ld, tc), "cublasLtMatmul D") &&
              (be == 0.0f ||
               tpk_emu_check_device(C, span(lc->rows, lc->cols, lc->ld, tc), "cublasLtMatmul C"));
    if (ok && p.bias)
        ok = op->bias && tpk_emu_check_device(op->bias, (size_t)p.m * (tc == CUDA_R_32F ? 4 : 2),
                                              "cublasLtMatmul bias");
    if (ok && p.aux)
        ok = op->aux &&
             tpk_emu_check_device(op->aux, span(p.m, p.n, op->aux_ld, tc), "cublasLtMatmul aux");
    if (!ok) return CUBLAS_STATUS_INVALID_VALUE;
    /* op(A) column-major [m][k] as floats: Ac[q * m + i] = op(A)(i, q) */
    int64_t m = p.m, n = p.n, k = p.k;
    std::vector<float> Ac((size_t)(m * k));
    for (int64_t q = 0; q < k; q++)
        for (int64_t i = 0; i < m; i++)
            Ac[(size_t)(q * m + i)] =
                (float)load(A, t, (size_t)(p.ta ? i * la->ld + q : q * la->ld + i));
    std::vector<double> acc((size_t)m), bsum((size_t)m, 0.0);
    for (int64_t j = 0; j < n; j++) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t q = 0; q < k; q++) {
            double bq = load(B, tb, (size_t)(p.tb ? q * lb->ld + j : j * lb->ld + q));
            const float *a = &Ac[(size_t)(q * m)];
            for (int64_t i = 0; i < m; i++) acc[(size_t)i] += (double)a[i] * bq;
        }
        for (int64_t i = 0; i < m; i++) {
            double v = (double)al * acc[(size_t)i];
            if (be != 0.0f) v += (double)be * load(C, tc, (size_t)(j * lc->ld + i));
            float x = (float)v;
            if (p.dgelu) { /* the gradient through GELU-tanh at the forward's pre-activation */
                float u = (float)load(op->aux, tc, (size_t)(j * op->aux_ld + i)),
                      th = tanhf(0.7978845608028654f * (u + 0.044715f * u * u * u));
                x *= 0.5f * (1.0f + th) + 0.5f * u * (1.0f - th * th) * 0.7978845608028654f *
                                              (1.0f + 3.0f * 0.044715f * u * u);
                store(D, tc, (size_t)(j * ld->ld + i), x);
                bsum[(size_t)i] += (double)load(D, tc, (size_t)(j * ld->ld + i));
                continue;
            }
            if (p.bias) x += (float)load(op->bias, tc, (size_t)i);
            if (p.aux) store(op->aux, tc, (size_t)(j * op->aux_ld + i), x);
            if (p.gelu)
                x = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
            store(D, tc, (size_t)(j * ld->ld + i), x);
        }
    }
    if (p.bgrad)
        for (int64_t i = 0; i < m; i++)
            store(const_cast<void *>(op->bias), tc, (size_t)i,
                  (float)bsum[(size_t)i]); /* BGRAD writes it */
    return CUBLAS_STATUS_SUCCESS;
}
