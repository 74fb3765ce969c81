/* ======================================================================================== */
/* >>api ---- the extern "C" surface qk.h calls (qk_cuda_gram, qk_cuda_states, ...) ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"
#include "compile.cuh"
#include "states.cuh"
#include "widen.cuh"
#include "pipeline.cuh"

extern "C" int qk_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}

extern "C" qk_result qk_cuda_device_query(int device, qk_device_info *info, char *err, size_t err_size)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        if (err) snprintf(err, err_size, "cudaGetDeviceProperties(%d): %s", device, cudaGetErrorString(e));
        cudaGetLastError();
        return QK_ERROR_NO_DEVICE;
    }
    memset(info, 0, sizeof *info);
    info->present = 1;
    memcpy(info->name, p.name, std::min(sizeof info->name, sizeof p.name) - 1);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->smem_per_block_optin = p.sharedMemPerBlockOptin;
    info->l2_bytes = (size_t)p.l2CacheSize;
    if (cudaDriverGetVersion(&info->driver_version) != cudaSuccess) { cudaGetLastError(); info->driver_version = 0; }
    info->wgmma = qk__wgmma_ok(device);
    e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMemGetInfo(&info->free_bytes, &info->total_bytes);
    if (e != cudaSuccess) {
        if (err) snprintf(err, err_size, "cudaMemGetInfo on device %d: %s", device, cudaGetErrorString(e));
        cudaGetLastError();
        return QK_ERROR_CUDA;
    }
    return QK_OK;
}

extern "C" int qk_cuda_host_pinned(const void *p)
{
    cudaPointerAttributes at;
    int pinned = p && cudaPointerGetAttributes(&at, p) == cudaSuccess && at.type == cudaMemoryTypeHost;
    cudaGetLastError();
    return pinned;
}

extern "C" void qk_cuda_host_lock(const void *p, size_t bytes, int *locked)
{
    int dev = 0, ro = 0;
    *locked = 0;
    if (!p || bytes == 0 || qk_cuda_host_pinned(p)) return;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, dev);
    cudaGetLastError();
    unsigned flags = cudaHostRegisterPortable | (ro ? cudaHostRegisterReadOnly : 0u);
    /* const: read-only registration only reads the pages (cudaHostRegister's pointer is not const) */
    cudaError_t e = cudaHostRegister(const_cast<void *>(p), bytes, flags);
    if (e != cudaSuccess && ro) { cudaGetLastError(); e = cudaHostRegister(const_cast<void *>(p), bytes, cudaHostRegisterPortable); }
    if (e == cudaSuccess) *locked = 1;
    cudaGetLastError();
}

extern "C" void qk_cuda_host_unlock(const void *p)
{
    if (p) cudaHostUnregister(const_cast<void *>(p));
    cudaGetLastError();
}

/* The checks of given device states (qk_gram_states, on_device), one block per row; the rows
   must be device memory of the current device. Pure states (DM false): out[s] the squared norm of
   row s, NaN for a row with a non-finite amplitude. Density matrices (DM true): out[3 s] the trace
   (NaN for a matrix with a non-finite entry), out[3 s + 1] the largest max(|Re rho_ab - Re
   rho_ba|, |Im rho_ab + Im rho_ba|), out[3 s + 2] the largest |rho_ab|. */
template <bool DM>
__global__ void __launch_bounds__(256) qk__k_state_check(const double *__restrict__ x, int64_t n, int64_t ld, int type, int64_t dim,
                                                        double *__restrict__ out)
{
    __shared__ double red[256];
    __shared__ int bad;
    const int64_t s = blockIdx.x;
    if (s >= n) return;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    const double *row = x + s * ld;
    const double nan = __longlong_as_double(0x7ff8000000000000LL);
    double acc = 0, dev = 0, mx = 0, re, im, re2, im2;
    for (int64_t k = threadIdx.x; k < (DM ? dim * dim : dim); k += blockDim.x) {
        qk__state_amp(row, type, k, &re, &im);
        if (!isfinite(re) || !isfinite(im)) bad = 1;
        if constexpr (!DM) {
            acc += re * re + im * im;
        } else {
            const int64_t a = k / dim, b = k - a * dim;
            mx = fmax(mx, re * re + im * im);
            if (a == b) acc += re;   /* the trace */
            if (b > a) {
                qk__state_amp(row, type, b * dim + a, &re2, &im2);
                dev = fmax(dev, fmax(fabs(re - re2), fabs(im + im2)));
            } else if (a == b) dev = fmax(dev, fabs(im + im));   /* the diagonal: real */
        }
    }
    const double sum = qk__block_sum256(red, acc);   /* its barriers also publish bad */
    if constexpr (!DM) {
        if (threadIdx.x == 0) out[s] = bad ? nan : sum;
    } else {
        const double hd = qk__block_max256(red, dev), m2 = qk__block_max256(red, mx);
        if (threadIdx.x == 0) {
            out[3 * s] = bad ? nan : sum;
            out[3 * s + 1] = hd;
            out[3 * s + 2] = sqrt(m2);
        }
    }
}

/* The device pointer checks of qk_cuda_state_norms, qk_cuda_state_dm_check and qk_cuda_state_hash:
   x is device (or managed) memory of the current device. */
static qk_result qk__states_on_this_device(const void *x, qk__err *E)
{
    cudaPointerAttributes at;
    int cur = -1;
    char msg[160];
    cudaGetDevice(&cur);
    if (cudaPointerGetAttributes(&at, x) != cudaSuccess || (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)) {
        cudaGetLastError();
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "the states are not CUDA device memory (on_device = 1)");
    }
    if (at.device != cur) {
        snprintf(msg, sizeof msg, "the states are on device %d, the engine runs on device %d", at.device, cur);
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, msg);
    }
    return QK_OK;
}

/* Runs qk__k_state_check<DM> over n rows of x into the host array out (1 or 3 doubles a row). */
static qk_result qk__state_check_run(bool dm, const void *x, int64_t n, int64_t ld, int type, int64_t dim, double *out, qk__err *E)
{
    const size_t bytes = (size_t)n * (dm ? 3 : 1) * sizeof(double);
    double *d = nullptr;
    char msg[160];
    QK_TRY(qk__states_on_this_device(x, E));
    QK_CK(cudaMalloc((void **)&d, bytes));
    if (dm) qk__k_state_check<true><<<(unsigned)n, 256>>>((const double *)x, n, ld, type, dim, d);
    else qk__k_state_check<false><<<(unsigned)n, 256>>>((const double *)x, n, ld, type, dim, d);
    cudaError_t ce = cudaGetLastError();
    if (ce == cudaSuccess) ce = cudaMemcpy(out, d, bytes, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (ce != cudaSuccess) {
        snprintf(msg, sizeof msg, "%s: %s", dm ? "qk__k_state_dm_check" : "qk__k_state_norms", cudaGetErrorString(ce));
        return qk__fail_msg(E, QK_ERROR_CUDA, msg);
    }
    return QK_OK;
}

extern "C" qk_result qk_cuda_state_dm_check(const void *x, int64_t n, int64_t ld, int type, int64_t dim, double *out, char *err,
                                            size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!x || n <= 0 || !out || dim < 1) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_state_dm_check: bad argument");
    return qk__state_check_run(true, x, n, ld, type, dim, out, E);
}

/* Pure device states as density matrices (qk_gram_states: a pure device side against device
   matrices): row i of x (ldx_bytes apart, dim amplitudes of type) into row i of out (ld_out
   elements of type apart) as |psi><psi|, entry (a, b) = psi_a conj(psi_b), the products in double
   without contraction, then rounded to type, as the host's qk__states_outer. */
__global__ void __launch_bounds__(256) qk__k_state_outer(const char *__restrict__ x, int64_t n, int64_t ldx_bytes, int type, int64_t dim,
                                                         char *__restrict__ out, int64_t ld_out)
{
    const int es = qk__state_esize(type);
    const int64_t d2 = dim * dim, total = n * d2;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t / d2, k = t - i * d2, a = k / dim, b = k - a * dim;
        const char *row = x + i * ldx_bytes;
        double ar, ai, br, bi;
        qk__state_amp(row, type, a, &ar, &ai);
        qk__state_amp(row, type, b, &br, &bi);
        const double re = __dadd_rn(__dmul_rn(ar, br), __dmul_rn(ai, bi)), im = __dsub_rn(__dmul_rn(ai, br), __dmul_rn(ar, bi));
        char *o = out + (i * ld_out + k) * es;
        switch (type) {
        case QK_STATE_C128: ((double *)o)[0] = re; ((double *)o)[1] = im; break;
        case QK_STATE_C64: ((float *)o)[0] = (float)re; ((float *)o)[1] = (float)im; break;
        case QK_STATE_F64: *(double *)o = re; break;
        default: *(float *)o = (float)re; break;
        }
    }
}

extern "C" qk_result qk_cuda_state_outer(const void *x, int64_t n, int64_t ldx_bytes, int type, int64_t dim, int64_t ld_out, void **out,
                                         char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    char msg[200];
    void *d = nullptr;
    if (!x || n <= 0 || dim < 1 || ld_out < dim * dim || !out) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_state_outer: bad argument");
    *out = nullptr;
    QK_TRY(qk__states_on_this_device(x, E));
    const size_t bytes = (size_t)n * (size_t)ld_out * (size_t)qk__state_esize(type);
    cudaError_t ce = cudaMalloc(&d, bytes);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        snprintf(msg, sizeof msg, "cannot allocate %.3g GB of device memory for the pure states as density matrices (%s)", (double)bytes * 1e-9,
                 cudaGetErrorString(ce));
        return qk__fail_msg(E, ce == cudaErrorMemoryAllocation ? QK_ERROR_DEVICE_OUT_OF_MEMORY : QK_ERROR_CUDA, msg);
    }
    const int64_t total = n * dim * dim;
    const unsigned g = (unsigned)std::min<int64_t>((total + 255) / 256, (int64_t)1 << 20);
    ce = cudaMemset(d, 0, bytes);   /* the rows' padding past dim^2 */
    if (ce == cudaSuccess) {
        qk__k_state_outer<<<g, 256>>>((const char *)x, n, ldx_bytes, type, dim, (char *)d, ld_out);
        ce = cudaGetLastError();
    }
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(0);   /* done before the engine's streams read it */
    if (ce != cudaSuccess) {
        cudaFree(d);
        snprintf(msg, sizeof msg, "qk__k_state_outer: %s", cudaGetErrorString(ce));
        return qk__fail_msg(E, QK_ERROR_CUDA, msg);
    }
    *out = d;
    return QK_OK;
}

extern "C" void qk_cuda_dev_free(void *p)
{
    if (p) cudaFree(p);
}

extern "C" qk_result qk_cuda_state_norms(const void *x, int64_t n, int64_t ld, int type, int64_t dim, double *norms, char *err,
                                         size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!x || n <= 0 || !norms) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_state_norms: bad argument");
    return qk__state_check_run(false, x, n, ld, type, dim, norms, E);
}

/* qk_cuda_state_hash: each thread adds mixes of its words (splitmix64's finaliser of (word,
   index in the row) xor a mix of the row), each warp's sum is added to *out: integer sums, so
   the result does not depend on the order. */
__device__ __forceinline__ unsigned long long qk__mix64(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void __launch_bounds__(256) qk__k_state_hash(const unsigned int *__restrict__ x, int64_t n, int64_t ld_words,
                                                        int64_t row_words, unsigned long long *out)
{
    unsigned long long acc = 0;
    const int64_t total = n * row_words;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t / row_words, k = t - i * row_words;
        const unsigned long long w = ((unsigned long long)x[i * ld_words + k] << 32) | (unsigned long long)(k & 0xffffffff);
        acc += qk__mix64(w ^ qk__mix64((unsigned long long)i + 0x9e3779b97f4a7c15ull));
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

extern "C" qk_result qk_cuda_state_hash(const void *x, int64_t n, int64_t ld, int64_t row_bytes, uint64_t *hash, char *err,
                                        size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    unsigned long long *d = nullptr, h = 0;
    char msg[160];
    if (!x || n <= 0 || !hash || row_bytes <= 0 || row_bytes % 4 != 0 || row_bytes > ld * 8)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_state_hash: bad argument");
    QK_TRY(qk__states_on_this_device(x, E));
    const int64_t words = n * (row_bytes / 4);
    const unsigned blocks = (unsigned)std::min<int64_t>((words + 255) / 256, 4096);
    QK_CK(cudaMalloc((void **)&d, sizeof *d));
    cudaError_t ce = cudaMemset(d, 0, sizeof *d);
    if (ce == cudaSuccess) {
        qk__k_state_hash<<<blocks, 256>>>((const unsigned int *)x, n, ld * 2, row_bytes / 4, d);
        ce = cudaGetLastError();
    }
    if (ce == cudaSuccess) ce = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (ce != cudaSuccess) {
        snprintf(msg, sizeof msg, "qk__k_state_hash: %s", cudaGetErrorString(ce));
        return qk__fail_msg(E, QK_ERROR_CUDA, msg);
    }
    *hash = (uint64_t)h;
    return QK_OK;
}

extern "C" qk_result qk_cuda_host_alloc(size_t bytes, void **p, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    *p = nullptr;
    QK_CK(cudaMallocHost(p, bytes ? bytes : 1));
    return QK_OK;
}

extern "C" void qk_cuda_host_free(void *p)
{
    if (p) cudaFreeHost(p);
    cudaGetLastError();
}

extern "C" qk_result qk_cuda_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, const qk_cuda_io *io,
                                  char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!plan || !map || !desc || !desc->x) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: NULL argument");
    if ((desc->output == QK_OUTPUT_DEVICE || desc->output == QK_OUTPUT_HOST) && !desc->out)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: out is NULL");
    if (plan->path != QK_PATH_ANALYTIC && map->n_qubits > QK_MAX_STATE_QUBITS)
        return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_gram: too many qubits for a state vector");
    /* the engine runs the job the plan was made for; a plan of another job is refused, not
       re-derived from the desc */
    if (plan->symmetric != (desc->y == nullptr) || plan->n_x != desc->n_x || plan->n_y != (desc->y ? desc->n_y : desc->n_x) ||
        plan->output != desc->output) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "qk_cuda_gram: the plan was made for another job (plan: %lld x %lld%s, output %d; desc: %lld x %lld%s, output %d)",
                 (long long)plan->n_x, (long long)plan->n_y, plan->symmetric ? " symmetric" : "", (int)plan->output,
                 (long long)desc->n_x, (long long)(desc->y ? desc->n_y : desc->n_x), desc->y ? "" : " symmetric", (int)desc->output);
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, msg);
    }
    if (io && (io->mirror_out || io->mrows)) {   /* the transpose as well: a rectangle to the host */
        const bool pinned = plan->output == QK_OUTPUT_HOST && plan->host_pinned;
        const char *bad = plan->output == QK_OUTPUT_DEVICE ? "a DEVICE output"
                          : plan->symmetric                 ? "a symmetric plan (K(X,X) mirrors itself)"
                          : io->mirror_out && !pinned       ? "mirror_out without a page-locked HOST output (plan.host_pinned)"
                          : !io->mirror_out && pinned       ? "mrows with a page-locked HOST output (mirror_out takes it)"
                          : io->mirror_out && io->mirror_ld < plan->n_x ? "mirror_ld below the job's rows"
                                                                        : nullptr;
        if (bad) {
            char msg[200];
            snprintf(msg, sizeof msg, "qk_cuda_gram: the transposed output (qk_cuda_io.mirror_out / mrows) with %s", bad);
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, msg);
        }
    }
    if (io && io->band_rows != 0) {   /* a symmetric job's first rows alone */
        const char *bad = !plan->symmetric                               ? "a plan of K(X,Y) (the band is K(X,X)'s)"
                          : io->band_rows < 0 || io->band_rows > plan->n_x ? "band_rows outside [0, n_x]"
                          : io->mirror_out || io->mrows                  ? "the transposed output (mirror_out / mrows)"
                                                                         : nullptr;
        if (bad) {
            char msg[200];
            snprintf(msg, sizeof msg, "qk_cuda_gram: the band of rows (qk_cuda_io.band_rows = %lld) with %s", (long long)io->band_rows, bad);
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, msg);
        }
    }
    qk_plan P = *plan; /* the plan this attempt runs: qk__plan_shrink makes the next one */
    if (qk__plan_engine(&P) == QK_GPU_ENGINE_COUNT)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: plan.engine is no qk_gpu_engine");
    if (P.linear && (P.path == QK_PATH_ANALYTIC || !qk__engine_blas(qk__plan_engine(&P))))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: plan.linear (density matrices) runs on the cuBLAS engines "
                                                          "(plan.engine CUBLAS or TC_*), whose epilogue keeps the inner product unsquared");
    int64_t delivered = 0;
    int shrinks = 0;
    char why[160] = "";
    const bool real = P.path == QK_PATH_REAL;
    const bool p64 = P.precision == QK_PRECISION_FP64;
    /* Out of device memory: retry from scratch with the planner's next smaller plan (nothing has
       reached the caller's output before a slab completes; a host output may be partly written,
       which the result code says). */
    for (;;) {
        qk__job_state J;
        J.E = E;
        J.plan = &P;
        J.map = map;
        J.desc = desc;
        J.rows = io ? io->rows : nullptr;
        J.rows_user = io ? io->rows_user : nullptr;
        J.stats = io ? io->stats : nullptr;
        J.prof = io ? io->prof : nullptr;
        J.cpool = io ? io->pool : nullptr;
        for (int i = 0; i < 2; ++i) J.io_stage[i] = io ? io->stage[i] : nullptr;
        J.io_stage_bytes = io ? io->stage_bytes : 0;
        J.fetch = io ? io->fetch : nullptr;
        J.fetch_user = io ? io->fetch_user : nullptr;
        J.mirror_out = io ? io->mirror_out : nullptr;
        J.mirror_ld = io ? io->mirror_ld : 0;
        J.mrows = io ? io->mrows : nullptr;
        J.mrows_user = io ? io->mrows_user : nullptr;
        J.band_rows = io ? io->band_rows : 0;
        J.delivered = &delivered;
        qk_result r;
        r = qk__dispatch(p64, !real, P.out_dtype == QK_F64, [&](auto ty) {
            typedef decltype(ty) Ty;
            return qk__pipe<typename Ty::T, Ty::CPLX, typename Ty::OutT>(&J).run();
        });
        qk__job_free(&J);
        if (r == QK_OK && io && io->stats) {
            io->stats->n_shrinks = shrinks;
            memcpy(io->stats->shrink_why, why, sizeof why);
        }
        if (r != QK_ERROR_DEVICE_OUT_OF_MEMORY || delivered > 0 || !qk__plan_shrink(&P)) return r;
        if (shrinks++ == 0) snprintf(why, sizeof why, "%s", err ? err : "");
    }
}

extern "C" qk_result qk_cuda_states(const qk_map *map, const double *x, int64_t n, qk_precision precision, double *out,
                                    char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!map || (!x && n > 0) || (!out && n > 0)) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_states: NULL argument");
    if (map->n_qubits > QK_MAX_STATE_QUBITS) return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_states: too many qubits");
    if (n == 0) return QK_OK;
    qk__prog pg;
    qk_map m2 = *map;
    if (m2.cls == QK_CLASS_PRODUCT) m2.cls = QK_CLASS_COMPLEX; /* build the state vector anyway */
    QK_TRY(qk__compile(&m2, &pg, E));
    qk__dprog dp;
    qk__build_ws ws;
    double *dx = nullptr, *dout = nullptr;
    void *st = nullptr;
    const int64_t D = (int64_t)1 << map->n_qubits;
    const bool p64 = precision == QK_PRECISION_FP64;
    const size_t cx = p64 ? 16 : 8, T = p64 ? 8 : 4;
    auto run = [&]() -> qk_result {
        QK_TRY(qk__dprog_make(pg, map, &dp, E));
        QK_CK(cudaMalloc((void **)&dx, std::max<size_t>(1, (size_t)n * map->n_features * sizeof(double))));
        QK_CK(cudaMemcpy(dx, x, (size_t)n * map->n_features * sizeof(double), cudaMemcpyHostToDevice));
        QK_CK(cudaMalloc(&ws.params, (size_t)n * pg.P * T));
        if (pg.passes.size() > 1) QK_CK(cudaMalloc(&ws.tmp, (size_t)n * D * cx));
        if (pg.has_amp) QK_CK(cudaMalloc((void **)&ws.inv, (size_t)n * sizeof(double)));
        QK_CK(cudaMalloc(&st, (size_t)n * D * cx));
        QK_CK(cudaMalloc((void **)&dout, (size_t)n * D * 2 * sizeof(double)));
        QK_TRY(qk__dispatch(p64, false, false, [&](auto ty) {
            typedef typename decltype(ty)::T Tv;
            QK_TRY(qk__build_states<Tv>(pg, dp, dx, n, ws, st, false, 0, E));
            return qk__launch_widen<Tv>((const qk__cx<Tv> *)st, dout, n * D, 0, E);
        }));
        QK_CK(cudaMemcpy(out, dout, (size_t)n * D * 2 * sizeof(double), cudaMemcpyDeviceToHost));
        return QK_OK;
    };
    qk_result r = run();
    qk__dprog_free(&dp);
    cudaFree(dx); cudaFree(dout); cudaFree(st);
    cudaFree(ws.params); cudaFree(ws.tmp); cudaFree(ws.inv);
    return r;
}
