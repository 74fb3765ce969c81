/* ======================================================================================== */
/* >>amp ---- amplitude encoding from host data (qk_cuda_amplitude_encode) ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"

/* Amplitude encoding: one block per row, the norm in double, then x/||x|| padded and cast. */
template <typename T>
__global__ void __launch_bounds__(256) qk__k_amp_encode(const double *__restrict__ x, int64_t rows, int d, int64_t D,
                                                       T *__restrict__ out)
{
    __shared__ double red[256];
    const int64_t r = blockIdx.x;
    if (r >= rows) return;
    const double *xr = x + r * d;
    double acc = 0;
    for (int k = threadIdx.x; k < d; k += blockDim.x) acc += xr[k] * xr[k];
    const double inv = 1.0 / sqrt(qk__block_sum256(red, acc));
    T *o = out + r * D;
    for (int64_t k = threadIdx.x; k < D; k += blockDim.x) o[k] = k < d ? (T)(xr[k] * inv) : (T)0;
}

/* qk__k_amp_encode: one block of 256 threads per row. */
template <typename T>
static qk_result qk__launch_amp_encode(const double *x, int64_t rows, int d, int64_t D, T *out, cudaStream_t st, qk__err *E)
{
    qk__k_amp_encode<T><<<(unsigned)rows, 256, 0, st>>>(x, rows, d, D, out);
    QK_LAUNCH_CK("qk__k_amp_encode");
    return QK_OK;
}

/* A large host copy on several threads (pageable source into pinned staging): one core copies
   a tenth of what the H2D copy behind it moves (docs/benchmarks.md, 'Figures behind the code's constants'). */
static void qk__par_memcpy(void *dst, const void *src, size_t n)
{
    const size_t part = (size_t)8 << 20;
    int nt = (int)std::min<size_t>(8, (n + part - 1) / part);
    if (nt <= 1) { memcpy(dst, src, n); return; }
    std::vector<std::thread> th;
    for (int t = 1; t < nt; ++t)
        th.emplace_back([=] {
            size_t a = n * t / nt, b = n * (t + 1) / nt;
            memcpy((char *)dst + a, (const char *)src + a, b - a);
        });
    memcpy(dst, src, n / nt);
    for (auto &x : th) x.join();
}

/* Encodes n host rows into out_dev on two streams: cp copies (H2D, through pinned staging when x
   is pageable), ks runs the kernel; synchronous (returns when out_dev is complete). The Gram
   job passes its pool's streams; qk_cuda_amplitude_encode, called without a context, its own. */
static qk_result qk__amp_encode(const double *x, int64_t n, int d, int n_qubits, qk_precision precision, void *out_dev,
                                int64_t batch, double *seconds, cudaStream_t cp, cudaStream_t ks, qk__err *E)
{
    if (batch <= 0) batch = 64;
    if (batch > n) batch = n > 0 ? n : 1;
    const int64_t D = (int64_t)1 << n_qubits;
    const size_t rowb = (size_t)d * sizeof(double);
    struct R {
        cudaStream_t cp = nullptr, ks = nullptr;
        double *dbuf[2] = {nullptr, nullptr};
        double *stage[2] = {nullptr, nullptr};
        cudaEvent_t h2d[2] = {nullptr, nullptr}, kdone[2] = {nullptr, nullptr}, t0 = nullptr, t1 = nullptr;
        ~R() {
            if (cp) cudaStreamSynchronize(cp);
            if (ks) cudaStreamSynchronize(ks);
            for (int i = 0; i < 2; ++i) {
                cudaFree(dbuf[i]);
                if (stage[i]) cudaFreeHost(stage[i]);
                if (h2d[i]) cudaEventDestroy(h2d[i]);
                if (kdone[i]) cudaEventDestroy(kdone[i]);
            }
            if (t0) cudaEventDestroy(t0);
            if (t1) cudaEventDestroy(t1);
            cudaGetLastError();
        }
    } R;
    R.cp = cp;
    R.ks = ks;
    cudaPointerAttributes at;
    bool pinned = cudaPointerGetAttributes(&at, x) == cudaSuccess && at.type == cudaMemoryTypeHost;
    cudaGetLastError();
    for (int i = 0; i < 2; ++i) {
        QK_CK(cudaMalloc((void **)&R.dbuf[i], (size_t)batch * rowb));
        if (!pinned) QK_CK(cudaMallocHost((void **)&R.stage[i], (size_t)batch * rowb));
        QK_CK(cudaEventCreateWithFlags(&R.h2d[i], cudaEventDisableTiming));
        QK_CK(cudaEventCreateWithFlags(&R.kdone[i], cudaEventDisableTiming));
    }
    QK_CK(cudaEventCreate(&R.t0));
    QK_CK(cudaEventCreate(&R.t1));
    QK_CK(cudaEventRecord(R.t0, R.cp));
    const int64_t nb = (n + batch - 1) / batch;
    for (int64_t b = 0; b < nb; ++b) {
        const int i = (int)(b & 1);
        const int64_t r0 = b * batch, rows = std::min(batch, n - r0);
        /* buffer i is free once the kernel of batch b-2 is done */
        if (b >= 2) QK_CK(cudaStreamWaitEvent(R.cp, R.kdone[i], 0));
        const double *src = x + r0 * d;
        if (!pinned) {
            if (b >= 2) QK_CK(cudaEventSynchronize(R.h2d[i])); /* staging i was read by batch b-2's copy */
            qk__par_memcpy(R.stage[i], src, rows * rowb);
            src = R.stage[i];
        }
        QK_CK(cudaMemcpyAsync(R.dbuf[i], src, rows * rowb, cudaMemcpyHostToDevice, R.cp));
        QK_CK(cudaEventRecord(R.h2d[i], R.cp));
        QK_CK(cudaStreamWaitEvent(R.ks, R.h2d[i], 0));
        QK_TRY(qk__dispatch(precision == QK_PRECISION_FP64, false, false, [&](auto ty) {
            typedef typename decltype(ty)::T T;
            return qk__launch_amp_encode<T>(R.dbuf[i], rows, d, D, (T *)out_dev + r0 * D, R.ks, E);
        }));
        QK_CK(cudaEventRecord(R.kdone[i], R.ks));
    }
    QK_CK(cudaEventRecord(R.t1, R.ks));
    QK_CK(cudaEventSynchronize(R.t1));
    if (seconds) {
        float ms = 0;
        QK_CK(cudaEventElapsedTime(&ms, R.t0, R.t1));
        *seconds = ms * 1e-3;
    }
    return QK_OK;
}

extern "C" qk_result qk_cuda_amplitude_encode(const double *x, int64_t n, int d, int n_qubits, qk_precision precision,
                                              void *out_dev, int64_t batch, double *seconds, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!x || !out_dev || n < 0 || d < 1 || n_qubits < 0 || n_qubits > QK_MAX_STATE_QUBITS || ((int64_t)1 << n_qubits) < d)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_amplitude_encode: bad argument");
    struct S {
        cudaStream_t s[2] = {nullptr, nullptr};
        ~S() { for (int i = 0; i < 2; ++i) if (s[i]) { cudaStreamSynchronize(s[i]); cudaStreamDestroy(s[i]); } cudaGetLastError(); }
    } st;
    for (int i = 0; i < 2; ++i) QK_CK(cudaStreamCreateWithFlags(&st.s[i], cudaStreamNonBlocking));
    return qk__amp_encode(x, n, d, n_qubits, precision, out_dev, batch, seconds, st.s[0], st.s[1], E);
}
