/* ======================================================================================== */
/* >>tune ---- the autotuner (qk_cuda_tune_gram) ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"
#include "smalltc.cuh"
#include "blas.cuh"
#include "tcf.cuh"
#include "pipeline.cuh"

/* Tuning operands: uniform in [-1, 1) from a hash of the index (no state, reproducible). */
template <typename T>
__global__ void qk__k_fill_random(T *p, int64_t count, uint32_t seed)
{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= count) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 16; h *= 0x7feb352dU; h ^= h >> 15; h *= 0x846ca68bU; h ^= h >> 16;
    p[i] = (T)h * ((T)2 / (T)4294967296.0) - (T)1;
}

template <typename T>
static qk_result qk__launch_fill_random(T *p, int64_t count, uint32_t seed, cudaStream_t st, qk__err *E)
{
    qk__k_fill_random<T><<<(unsigned)((count + 255) / 256), 256, 0, st>>>(p, count, seed);
    QK_LAUNCH_CK("qk__k_fill_random");
    return QK_OK;
}

struct qk__tune_ws {
    void *S = nullptr, *K = nullptr, *Cw = nullptr;
    cublasHandle_t h = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    ~qk__tune_ws() {
        cudaFree(S); cudaFree(K); cudaFree(Cw);
        if (h) cublasDestroy(h);
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
        cudaGetLastError();
    }
};


template <typename T, bool CPLX, typename OutT>
static qk_result qk__tune(const qk_plan *pl, int64_t n, int reps, qk_cuda_tune_result *res, qk__err *E)
{
    const int D = 1 << pl->n_qubits;
    const size_t es = CPLX ? 2 * sizeof(T) : sizeof(T);
    const qk_gpu_engine tcm = pl->n_qubits <= QK__TC_MAX_QUBITS ? qk__tc_engine(pl->precision, 1) : QK_GPU_FUSED;
    /* the fused tensor-core kernel (configurations 1 and 2; FP32X3: 2) beside its cuBLAS engine:
       float states, and TF32 / FP16 (unflushed) only up to QK__TCF_NOFLUSH_MAX_QUBITS */
    const qk_gpu_engine tcf = sizeof(T) == 4 && (tcm == QK_GPU_TC_FP32X3 || pl->n_qubits <= QK__TCF_NOFLUSH_MAX_QUBITS)
                              ? qk__engine_tcf_of(tcm) : QK_GPU_FUSED;
    const size_t tcf_bytes = tcf != QK_GPU_FUSED ? (size_t)n * (size_t)qk__tcf_geometry(tcf, D, CPLX).ldw * 4 : 0;
    const size_t ws_bytes = std::max(qk__blas_ws_bytes<T, CPLX>(tcm != QK_GPU_FUSED ? tcm : QK_GPU_CUBLAS, n, n, D), tcf_bytes);
    qk__tune_ws w;
    QK_CK(cudaMalloc(&w.S, (size_t)n * D * es));
    QK_CK(cudaMalloc(&w.K, (size_t)n * n * sizeof(OutT)));
    QK_CK(cudaMalloc(&w.Cw, ws_bytes));
    QK_BLAS_CK(cublasCreate(&w.h));
    QK_CK(cudaEventCreate(&w.e0));
    QK_CK(cudaEventCreate(&w.e1));
    const int64_t cnt = (int64_t)n * D * (CPLX ? 2 : 1);
    QK_TRY(qk__launch_fill_random<T>((T *)w.S, cnt, 12345u, 0, E));
    res->n = 0;
    for (int c = 1; c <= QK__N_FUSED_CFG; ++c)
        if (qk__fused_cfg_kept(c)) { res->blas[res->n] = QK_GPU_FUSED; res->cfg[res->n] = c; res->n++; }
    res->blas[res->n] = QK_GPU_CUBLAS; res->cfg[res->n] = 0; res->n++;
    if (CPLX && sizeof(T) == 4) { res->blas[res->n] = QK_GPU_CUBLAS_3M; res->cfg[res->n] = 0; res->n++; }
    if (tcm != QK_GPU_FUSED) { res->blas[res->n] = tcm; res->cfg[res->n] = 0; res->n++; }
    for (int c = 1; tcf != QK_GPU_FUSED && c <= (tcf == QK_GPU_TCF_FP32X3 ? 1 : 2); ++c) {
        res->blas[res->n] = tcf; res->cfg[res->n] = tcf == QK_GPU_TCF_FP32X3 ? 2 : c; res->n++;
    }
    int dev = 0;
    if (tcf != QK_GPU_FUSED && tcf != QK_GPU_TCF_TF32 && cudaGetDevice(&dev) == cudaSuccess && qk__wgmma_ok(dev)) {
        res->blas[res->n] = tcf; res->cfg[res->n] = 4; res->n++;   /* the wgmma kernel (>>wgmma) */
    }
    OutT *K = (OutT *)w.K;
    for (int c = 0; c < res->n; ++c) {
        std::vector<double> t;
        for (int r = 0; r < reps + 1; ++r) {
            QK_CK(cudaEventRecord(w.e0, 0));
            if (qk__engine_tcf((qk_gpu_engine)res->blas[c]))
                QK_TRY((qk__tune_tcf<T, CPLX, OutT>((qk_gpu_engine)res->blas[c], res->cfg[c], w.S, n, D, w.Cw, ws_bytes, K, E)));
            else if (res->blas[c] != QK_GPU_FUSED) QK_TRY((qk__launch_blas<T, CPLX, OutT>(w.h, (qk_gpu_engine)res->blas[c], w.S, w.S, n, n, D, w.Cw, K, n, K, 0, 1, 0, E)));
            else QK_TRY((qk__launch_gram<T, CPLX, OutT>(res->cfg[c], w.S, w.S, n, n, D, K, n, K, 0, 1, 0, E)));
            QK_CK(cudaEventRecord(w.e1, 0));
            QK_CK(cudaEventSynchronize(w.e1));
            float ms = 0;
            QK_CK(cudaEventElapsedTime(&ms, w.e0, w.e1));
            if (r > 0) t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        res->ms[c] = t[t.size() / 2];
    }
    res->best = 0;
    for (int c = 1; c < res->n; ++c) if (res->ms[c] < res->ms[res->best]) res->best = c;
    return QK_OK;
}

extern "C" qk_result qk_cuda_tune_gram(const qk_plan *plan, int64_t n_samples, int reps, qk_cuda_tune_result *res,
                                       char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!plan || !res) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_tune_gram: NULL argument");
    memset(res, 0, sizeof *res);
    if (plan->path == QK_PATH_ANALYTIC || plan->n_qubits > 20)
        return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "qk_cuda_tune_gram: nothing to tune for this path/size");
    int64_t n = n_samples > 0 ? n_samples : 4096;
    if (plan->n_x > 0 && n > plan->n_x) n = plan->n_x;
    if (reps < 1) reps = 3;
    res->n_samples = n;
    return qk__dispatch(plan->precision == QK_PRECISION_FP64, plan->path != QK_PATH_REAL, plan->out_dtype == QK_F64,
                        [&](auto ty) {
                            typedef decltype(ty) Ty;
                            return qk__tune<typename Ty::T, Ty::CPLX, typename Ty::OutT>(plan, n, reps, res, E);
                        });
}

