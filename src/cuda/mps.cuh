#pragma once
#include "base.cuh"
#include "pipeline.cuh"
/* >>mps ---- the MPS path: batched transfer-matrix contraction of padded site tensors ---- */
/* K on the MPS path. qk.h builds every sample's MPS on the host (its exact builder, or the
   truncating one) and hands the site tensors over, padded to a bond of chi on both sides:
   site s of sample i is A[l][a][r] (l, r < chi, a < 2), entry e = (l * 2 + a) * chi + r, and the
   device layout is [site][entry][sample] (complex T2), so a block that needs entry e of 32
   consecutive samples reads 32 consecutive values. Zero padding is exact: padded entries add
   nothing to any product, and E starts as the 1 x 1 identity in its [0][0] corner.

   One overlap <a|b> is E = 1; per site T[l][a][r'] = sum_l' E[l][l'] B[l'][a][r'],
   E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a][r']; K = |E[0][0]|^2 after the last site:
   4 chi^3 complex multiply-adds per site and pair.

   Two kernels:
     qk__mps_reg<T, CHI>   chi <= 4 (padded to CHI = 2 or 4): one thread per pair, E and E' in
                           registers (2 x CHI^2 complex: 64 floats at CHI = 4), a block of 8 x 32
                           pairs (rows x columns of K); per site the block stages the 8 row and
                           32 column tensors in shared memory ([entry][sample]: a warp is one row
                           and 32 columns, so A is a broadcast and B 32 consecutive values, no bank
                           conflicts), the next site's tensors are loaded into registers while
                           this one is contracted. Per site and block: (8 + 32) x 2 CHI^2 complex
                           from L2 for 256 pairs x 4 CHI^3 multiply-adds.
     qk__mps_warp<T>       any chi up to QK_MPS_MAX_BOND: one warp per pair, E and T in shared
                           memory (3 chi^2 complex per warp), lanes split the entries of T and E';
                           the tensors are read from global memory (L1/L2).
   Both compute the pairs of a slab of rows; K(X,X) with K resident computes the pairs j >= i only
   and writes the mirror K[j][i] too. Precision: T = float (fp32) or double (fp64), K written in
   the output dtype. */
template <typename T> struct qk__mps_t2;
template <> struct qk__mps_t2<float> { typedef float2 t; };
template <> struct qk__mps_t2<double> { typedef double2 t; };

#define QK__MPS_TM 8    /* rows of K per block of the register kernel (blockDim.y) */
#define QK__MPS_TN 32   /* columns (blockDim.x: one warp) */

/* Arguments of one slab launch. */
template <typename T, typename OutT> struct qk__mps_args {
    const typename qk__mps_t2<T>::t *A, *B;   /* [site][entry][sample] */
    int64_t na, nb;                          /* samples in A and B (their leading dimension) */
    int q, chi;
    int64_t row0, rows;                      /* the slab: rows [row0, row0 + rows) of K */
    OutT *K;                                 /* row i of K at K + (i - krow0) * ldk */
    int64_t ldk, krow0;
    int sym;                                 /* 1: pairs j >= i only, mirror written (K resident) */
};

template <typename T, typename OutT>
__device__ __forceinline__ void qk__mps_store(const qk__mps_args<T, OutT> &g, int64_t i, int64_t j, T re, T im)
{
    const double v = (double)re * (double)re + (double)im * (double)im;
    if (g.sym) {
        if (j < i) return;
        g.K[(i - g.krow0) * g.ldk + j] = (OutT)v;
        if (j > i) g.K[(j - g.krow0) * g.ldk + i] = (OutT)v;
    } else {
        g.K[(i - g.krow0) * g.ldk + j] = (OutT)v;
    }
}

template <typename T, int CHI, typename OutT>
__global__ void __launch_bounds__(QK__MPS_TM * QK__MPS_TN)
qk__mps_reg(qk__mps_args<T, OutT> g)
{
    typedef typename qk__mps_t2<T>::t C;
    constexpr int E = 2 * CHI * CHI;                      /* entries per site */
    constexpr int NT = QK__MPS_TM * QK__MPS_TN;
    constexpr int LA = (E * QK__MPS_TM + NT - 1) / NT;    /* per-thread loads of A, B per site */
    constexpr int LB = (E * QK__MPS_TN + NT - 1) / NT;
    __shared__ C sA[E][QK__MPS_TM];
    __shared__ C sB[E][QK__MPS_TN];
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * QK__MPS_TN + tx;
    const int64_t i0 = g.row0 + (int64_t)blockIdx.y * QK__MPS_TM, j0 = (int64_t)blockIdx.x * QK__MPS_TN;
    const int64_t rend = g.row0 + g.rows;
    if (g.sym && j0 + QK__MPS_TN - 1 < i0) return;        /* wholly below the diagonal (block-uniform) */
    const int64_t i = i0 + ty, j = j0 + tx;
    C ra[LA], rb[LB];
    auto load = [&](int s) {
#pragma unroll
        for (int k = 0; k < LA; ++k) {
            const int x = tid + k * NT, e = x / QK__MPS_TM, r = x % QK__MPS_TM;
            C v; v.x = 0; v.y = 0;
            if (x < E * QK__MPS_TM && i0 + r < rend) v = g.A[((int64_t)s * E + e) * g.na + i0 + r];
            ra[k] = v;
        }
#pragma unroll
        for (int k = 0; k < LB; ++k) {
            const int x = tid + k * NT, e = x / QK__MPS_TN, c = x % QK__MPS_TN;
            C v; v.x = 0; v.y = 0;
            if (x < E * QK__MPS_TN && j0 + c < g.nb) v = g.B[((int64_t)s * E + e) * g.nb + j0 + c];
            rb[k] = v;
        }
    };
    auto stage = [&]() {
#pragma unroll
        for (int k = 0; k < LA; ++k) {
            const int x = tid + k * NT;
            if (x < E * QK__MPS_TM) sA[x / QK__MPS_TM][x % QK__MPS_TM] = ra[k];
        }
#pragma unroll
        for (int k = 0; k < LB; ++k) {
            const int x = tid + k * NT;
            if (x < E * QK__MPS_TN) sB[x / QK__MPS_TN][x % QK__MPS_TN] = rb[k];
        }
    };
    T er[CHI][CHI], ei[CHI][CHI];   /* E[l][l'] */
#pragma unroll
    for (int l = 0; l < CHI; ++l)
#pragma unroll
        for (int m = 0; m < CHI; ++m) { er[l][m] = (l == 0 && m == 0) ? (T)1 : (T)0; ei[l][m] = 0; }
    load(0);
    stage();
    __syncthreads();
    for (int s = 0; s < g.q; ++s) {
        if (s + 1 < g.q) load(s + 1);   /* in flight during this site's arithmetic */
        T nr[CHI][CHI], ni[CHI][CHI];   /* E'[r][r'] */
#pragma unroll
        for (int r = 0; r < CHI; ++r)
#pragma unroll
            for (int m = 0; m < CHI; ++m) { nr[r][m] = 0; ni[r][m] = 0; }
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int rp = 0; rp < CHI; ++rp) {
                T tr[CHI], ti[CHI];
                C b[CHI];
#pragma unroll
                for (int lp = 0; lp < CHI; ++lp) b[lp] = sB[(lp * 2 + a) * CHI + rp][tx];
#pragma unroll
                for (int l = 0; l < CHI; ++l) {   /* t = E b */
                    T xr = 0, xi = 0;
#pragma unroll
                    for (int lp = 0; lp < CHI; ++lp) {
                        xr = fma(er[l][lp], b[lp].x, xr); xr = fma(-ei[l][lp], b[lp].y, xr);
                        xi = fma(er[l][lp], b[lp].y, xi); xi = fma(ei[l][lp], b[lp].x, xi);
                    }
                    tr[l] = xr; ti[l] = xi;
                }
#pragma unroll
                for (int r = 0; r < CHI; ++r)
#pragma unroll
                    for (int l = 0; l < CHI; ++l) {   /* E'[r][rp] += conj(A[l][a][r]) t[l] */
                        const C av = sA[(l * 2 + a) * CHI + r][ty];
                        nr[r][rp] = fma(av.x, tr[l], nr[r][rp]); nr[r][rp] = fma(av.y, ti[l], nr[r][rp]);
                        ni[r][rp] = fma(av.x, ti[l], ni[r][rp]); ni[r][rp] = fma(-av.y, tr[l], ni[r][rp]);
                    }
            }
#pragma unroll
        for (int r = 0; r < CHI; ++r)
#pragma unroll
            for (int m = 0; m < CHI; ++m) { er[r][m] = nr[r][m]; ei[r][m] = ni[r][m]; }
        __syncthreads();                 /* every thread is done with this site's tiles */
        if (s + 1 < g.q) {
            stage();
            __syncthreads();
        }
    }
    if (i < rend && j < g.nb) qk__mps_store(g, i, j, er[0][0], ei[0][0]);
}

/* One warp per pair; blockDim.x = 32 * warps per block; dynamic shared memory 3 chi^2 complex per
   warp (E, then T of 2 chi^2). Pairs of the slab in row-major order, a grid-stride loop. */
template <typename T, typename OutT>
__global__ void qk__mps_warp(qk__mps_args<T, OutT> g)
{
    typedef typename qk__mps_t2<T>::t C;
    extern __shared__ unsigned char qk__mps_smem[];
    const int chi = g.chi, E = 2 * chi * chi, lane = threadIdx.x & 31, w = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    C *Em = (C *)qk__mps_smem + (size_t)w * 3 * chi * chi, *Tm = Em + chi * chi;
    const int64_t npairs = g.rows * g.nb;
    for (int64_t p = (int64_t)blockIdx.x * wpb + w; p < npairs; p += (int64_t)gridDim.x * wpb) {
        const int64_t i = g.row0 + p / g.nb, j = p % g.nb;
        if (g.sym && j < i) continue;   /* warp-uniform */
        for (int e = lane; e < chi * chi; e += 32) { Em[e].x = e == 0 ? (T)1 : (T)0; Em[e].y = 0; }
        __syncwarp();
        for (int s = 0; s < g.q; ++s) {
            const C *As = g.A + (int64_t)s * E * g.na + i, *Bs = g.B + (int64_t)s * E * g.nb + j;
            for (int o = lane; o < 2 * chi * chi; o += 32) {   /* T[l][c] = sum_l' E[l][l'] B[l'][c], c = a chi + r' */
                const int l = o / (2 * chi), c = o % (2 * chi);
                T xr = 0, xi = 0;
                for (int lp = 0; lp < chi; ++lp) {
                    const C ev = Em[l * chi + lp], bv = Bs[(int64_t)(lp * 2 * chi + c) * g.nb];
                    xr = fma(ev.x, bv.x, xr); xr = fma(-ev.y, bv.y, xr);
                    xi = fma(ev.x, bv.y, xi); xi = fma(ev.y, bv.x, xi);
                }
                Tm[o].x = xr; Tm[o].y = xi;
            }
            __syncwarp();
            for (int o = lane; o < chi * chi; o += 32) {   /* E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a chi + r'] */
                const int r = o / chi, rp = o % chi;
                T xr = 0, xi = 0;
                for (int la = 0; la < 2 * chi; ++la) {
                    const C av = As[(int64_t)(la * chi + r) * g.na], tv = Tm[la * chi + rp];
                    xr = fma(av.x, tv.x, xr); xr = fma(av.y, tv.y, xr);
                    xi = fma(av.x, tv.y, xi); xi = fma(-av.y, tv.x, xi);
                }
                Em[o].x = xr; Em[o].y = xi;
            }
            __syncwarp();
        }
        if (lane == 0) qk__mps_store(g, i, j, Em[0].x, Em[0].y);
        __syncwarp();
    }
}

/* Launches one slab. */
template <typename T, typename OutT>
static qk_result qk__mps_launch(const qk__mps_args<T, OutT> &g, int chi_pad, int sm_count, cudaStream_t st, qk__err *E)
{
    if (chi_pad <= 4) {
        dim3 blk(QK__MPS_TN, QK__MPS_TM), grd((unsigned)((g.nb + QK__MPS_TN - 1) / QK__MPS_TN), (unsigned)((g.rows + QK__MPS_TM - 1) / QK__MPS_TM));
        if (chi_pad <= 2) qk__mps_reg<T, 2, OutT><<<grd, blk, 0, st>>>(g);
        else qk__mps_reg<T, 4, OutT><<<grd, blk, 0, st>>>(g);
        QK_LAUNCH_CK("qk__mps_reg");
        return QK_OK;
    }
    const size_t per = (size_t)3 * chi_pad * chi_pad * sizeof(typename qk__mps_t2<T>::t);
    int wpb = (int)std::min<size_t>(8, (size_t)(96 << 10) / per);
    if (wpb < 1) wpb = 1;
    if (per * wpb > (48 << 10)) QK_CK(cudaFuncSetAttribute(qk__mps_warp<T, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(per * wpb)));
    int64_t blocks = (g.rows * g.nb + wpb - 1) / wpb, cap = (int64_t)(sm_count > 0 ? sm_count : 132) * 64;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    qk__mps_warp<T, OutT><<<(unsigned)blocks, 32 * wpb, per * wpb, st>>>(g);
    QK_LAUNCH_CK("qk__mps_warp");
    return QK_OK;
}

/* Device buffers and streams of one MPS Gram, released in every case: the context's pool's
   (qk_cuda_io.pool, borrowed when idle on this GPU: its streams, and its buffers by role: the
   MPS of A and B in the states' roles, K or its slab ring in K's and the workspace ring's) are
   kept for later calls, the others freed. */
struct qk__mps_res {
    void *A = nullptr, *B = nullptr, *K = nullptr, *Kr[2] = {nullptr, nullptr}, *stage = nullptr;
    cudaStream_t cs = nullptr, ds = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr}, t0 = nullptr, t1 = nullptr;
    qk_cuda_pool *lent = nullptr;
    unsigned pooled = 0;
    cudaError_t buf(int role, void **p, size_t bytes) { return qk__pool_buf(lent, &pooled, role, p, bytes); }
    void drop(int role, void *p) { if (!(pooled & (1u << role))) cudaFree(p); }
    ~qk__mps_res()
    {
        if (cs) cudaStreamSynchronize(cs);
        if (ds) cudaStreamSynchronize(ds);
        drop(QK__PB_SA, A); drop(QK__PB_SB, B); drop(QK__PB_KD, K); drop(QK__PB_CW0, Kr[0]); drop(QK__PB_CW1, Kr[1]);
        if (stage) cudaFreeHost(stage);
        if (!lent) {
            if (cs) cudaStreamDestroy(cs);
            if (ds) cudaStreamDestroy(ds);
        }
        for (int k = 0; k < 2; ++k) if (ev[k]) cudaEventDestroy(ev[k]);
        if (t0) cudaEventDestroy(t0);
        if (t1) cudaEventDestroy(t1);
        qk__pool_return(lent);
        cudaGetLastError();
    }
};

/* Uploads n samples of packed doubles as T2 (fp32: converted on the host in chunks), on st, the
   stream whose kernels read them, and waited for: a plain cudaMemcpy runs on the legacy stream,
   which does not order the job's non-blocking streams, and from pageable memory it may return
   before its DMA has landed (the kernels then read a half-written slab). */
template <typename T>
static qk_result qk__mps_upload(qk__mps_res &R, int role, const double *src, size_t values, void **dst, cudaStream_t st, qk__err *E)
{
    QK_CK(R.buf(role, dst, values * sizeof(T)));
    if (sizeof(T) == sizeof(double)) {
        QK_CK(cudaMemcpyAsync(*dst, src, values * sizeof(double), cudaMemcpyHostToDevice, st));
        QK_CK(cudaStreamSynchronize(st));
        return QK_OK;
    }
    const size_t chunk = (size_t)8 << 20;   /* values per step: 32 MB of floats */
    std::vector<float> buf(std::min(chunk, values));
    for (size_t o = 0; o < values; o += chunk) {
        const size_t m = std::min(chunk, values - o);
        for (size_t k = 0; k < m; ++k) buf[k] = (float)src[o + k];
        QK_CK(cudaMemcpyAsync((float *)*dst + o, buf.data(), m * sizeof(float), cudaMemcpyHostToDevice, st));
        QK_CK(cudaStreamSynchronize(st));   /* buf is refilled next */
    }
    return QK_OK;
}

template <typename T, typename OutT>
static qk_result qk__mps_gram_t(const qk_plan *plan, const qk_gram_desc *desc, const qk_cuda_mps *m, const qk_cuda_io *io, qk__err *E)
{
    typedef typename qk__mps_t2<T>::t C;
    qk__mps_res R;
    const int64_t nx = m->n_a, ny = m->b ? m->n_b : m->n_a;
    const bool sym = m->b == nullptr, dev_out = desc->output == QK_OUTPUT_DEVICE;
    const size_t per = (size_t)m->n_sites * 2 * m->chi * m->chi;   /* complex values per sample */
    int dev = 0, sms = 0;
    QK_CK(cudaGetDevice(&dev));
    QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if ((R.lent = qk__pool_borrow(io ? io->pool : nullptr))) {   /* the context's streams, kept across calls */
        R.cs = R.lent->st[0];
        R.ds = R.lent->st[1];
    } else {
        QK_CK(cudaStreamCreateWithFlags(&R.cs, cudaStreamNonBlocking));
        QK_CK(cudaStreamCreateWithFlags(&R.ds, cudaStreamNonBlocking));
    }
    QK_CK(cudaEventCreate(&R.ev[0]));
    QK_CK(cudaEventCreate(&R.ev[1]));
    QK_CK(cudaEventCreate(&R.t0));
    QK_CK(cudaEventCreate(&R.t1));
    QK_TRY(qk__mps_upload<T>(R, QK__PB_SA, m->a, per * 2 * (size_t)nx, &R.A, R.cs, E));
    if (!sym) QK_TRY(qk__mps_upload<T>(R, QK__PB_SB, m->b, per * 2 * (size_t)ny, &R.B, R.cs, E));
    qk__mps_args<T, OutT> g;
    g.A = (const C *)R.A;
    g.B = (const C *)(sym ? R.A : R.B);
    g.na = nx;
    g.nb = ny;
    g.q = m->n_sites;
    g.chi = m->chi;
    QK_CK(cudaEventRecord(R.t0, R.cs));
    int64_t done = 0;
    auto progress = [&](int64_t rows) -> qk_result {
        done += rows * ny;
        if (desc->progress && desc->progress(done, nx * ny, desc->progress_user))
            return qk__fail_msg(E, QK_ERROR_CANCELLED, "progress callback cancelled the Gram");
        return QK_OK;
    };
    if (dev_out) {
        /* K straight into the caller's buffer, one slab per plan->slab_rows rows (progress) */
        const int64_t S = plan->slab_rows > 0 ? plan->slab_rows : nx;
        g.K = (OutT *)desc->out;
        g.ldk = desc->ld_out ? desc->ld_out : ny;
        g.krow0 = 0;
        g.sym = sym;
        for (int64_t r0 = 0; r0 < nx; r0 += S) {
            g.row0 = r0;
            g.rows = std::min(S, nx - r0);
            QK_TRY((qk__mps_launch<T, OutT>(g, m->chi, sms, R.cs, E)));
            QK_CK(cudaStreamSynchronize(R.cs));
            QK_TRY(progress(g.rows));
        }
    } else {
        /* host outputs: slabs of full rows to io->rows through pinned staging; K resident when
           the plan says so (K(X,X): the pairs j >= i, mirrored, so slab s is whole once slabs
           0..s ran), else a ring of two device slabs of full rows */
        const int64_t S = plan->slab_rows > 0 ? std::min(plan->slab_rows, nx) : nx;
        const size_t slab_bytes = (size_t)S * (size_t)ny * sizeof(OutT);
        const bool resident = plan->k_resident != 0;
        if (!io || !io->rows) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: no rows callback for a host output");
        if (resident) QK_CK(R.buf(QK__PB_KD, &R.K, (size_t)nx * (size_t)ny * sizeof(OutT)));
        else {
            QK_CK(R.buf(QK__PB_CW0, &R.Kr[0], slab_bytes));
            QK_CK(R.buf(QK__PB_CW1, &R.Kr[1], slab_bytes));
        }
        void *stage = io->stage[0] && io->stage_bytes >= slab_bytes ? io->stage[0] : nullptr;
        if (!stage) { QK_CK(cudaMallocHost(&R.stage, slab_bytes)); stage = R.stage; }
        const int64_t ns = (nx + S - 1) / S;
        auto launch = [&](int64_t s) -> qk_result {
            g.row0 = s * S;
            g.rows = std::min(S, nx - g.row0);
            if (resident) { g.K = (OutT *)R.K; g.krow0 = 0; g.sym = sym; }
            else { g.K = (OutT *)R.Kr[s & 1]; g.krow0 = g.row0; g.sym = 0; }
            g.ldk = ny;
            QK_TRY((qk__mps_launch<T, OutT>(g, m->chi, sms, R.cs, E)));
            QK_CK(cudaEventRecord(R.ev[s & 1], R.cs));
            return QK_OK;
        };
        QK_TRY(launch(0));
        for (int64_t s = 0; s < ns; ++s) {
            const int64_t r0 = s * S, rows = std::min(S, nx - r0);
            if (s + 1 < ns) QK_TRY(launch(s + 1));   /* computes while slab s goes out */
            QK_CK(cudaStreamWaitEvent(R.ds, R.ev[s & 1], 0));
            const OutT *src = resident ? (const OutT *)R.K + (size_t)r0 * (size_t)ny : (const OutT *)R.Kr[s & 1];
            QK_CK(cudaMemcpyAsync(stage, src, (size_t)rows * (size_t)ny * sizeof(OutT), cudaMemcpyDeviceToHost, R.ds));
            QK_CK(cudaStreamSynchronize(R.ds));
            qk_result r = io->rows(r0, rows, stage, ny, io->rows_user);
            if (r != QK_OK) { cudaStreamSynchronize(R.cs); if (E->buf && E->size) E->buf[0] = 0; return r; }
            r = progress(rows);
            if (r != QK_OK) { cudaStreamSynchronize(R.cs); return r; }
        }
    }
    QK_CK(cudaEventRecord(R.t1, R.cs));
    QK_CK(cudaEventSynchronize(R.t1));
    if (io && io->stats) {
        float ms = 0;
        QK_CK(cudaEventElapsedTime(&ms, R.t0, R.t1));
        io->stats->gram_ms = ms;
        io->stats->n_streams = 2;
        io->stats->n_slabs = (int)((nx + (plan->slab_rows > 0 ? plan->slab_rows : nx) - 1) / (plan->slab_rows > 0 ? plan->slab_rows : nx));
    }
    return QK_OK;
}

extern "C" qk_result qk_cuda_mps_gram(const qk_plan *plan, const qk_gram_desc *desc, const qk_cuda_mps *mps,
                                      const qk_cuda_io *io, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!plan || !desc || !mps || !mps->a) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: NULL argument");
    if (mps->n_sites < 1 || mps->chi < 1 || mps->chi > 64 || mps->n_a < 1 || (mps->b && mps->n_b < 1))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: bad MPS shape");
    if (io && (io->mirror_out || io->mrows))   /* the MPS path runs on one GPU: no rectangle parts */
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: the transposed output (qk_cuda_io.mirror_out / mrows) is "
                                                          "qk_cuda_gram's only");
    if (io && io->band_rows)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: a band of rows (qk_cuda_io.band_rows) is qk_cuda_gram's only");
    const bool p64 = plan->precision == QK_PRECISION_FP64 || plan->precision == QK_PRECISION_FP32X3;
    const bool o64 = plan->out_dtype == QK_F64;
    if (p64) return o64 ? qk__mps_gram_t<double, double>(plan, desc, mps, io, E) : qk__mps_gram_t<double, float>(plan, desc, mps, io, E);
    return o64 ? qk__mps_gram_t<float, double>(plan, desc, mps, io, E) : qk__mps_gram_t<float, float>(plan, desc, mps, io, E);
}
/* ---- end MPS engine ---- */
