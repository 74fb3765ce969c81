/* ======================================================================================== */
/* >>vjp ---- qk_cuda_gram_vjp: the gradient of a loss of K for every weight on the GPU ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"
#include "compile.cuh"
#include "states.cuh"
#include "pipeline.cuh"
/* The CPU's qk_gram_vjp (vjp.c, docs/gradients.md) on one GPU, fp64:
   1. the states A (and B) on the device (qk__build_states: rows of D amplitudes, complex
      interleaved or, for real maps, real);
   2. conj(S) = B^H A with cuBLAS (K(X,X): ZHERK / DSYRK, one triangle), read as row-major
      nx x ny: entry (i, j) = conj(S_ij) = <b_j|a_i>;
   3. one elementwise kernel: K = |S|^2 and W = G' o conj(S) (G' = G + G^T for K(X,X)), W in
      place of S for K(X,Y);
   4. the adjoint vectors with cuBLAS: lam = W B (rows), mu = W^H A (rows; K(X,Y));
   5. the adjoint sweeps: one block per sample walks the map's ops from the last to the first on
      its state s and adjoint vector l (in shared memory where both fit, else in place in global
      memory), each weighted op's angle derivative -Im <Gen s|l> (P: 2 Im <Pi_1 s|l>) summed by
      the block in a fixed order, times dt/dw, added to the sample's row of an n x P buffer by
      one thread in op order; then each weight's column summed over the samples in a fixed order.
   Every sum has a fixed order (cuBLAS's fp64 products are deterministic on one device, the block
   reductions' shapes depend on D only), so the gradient and K are the same bits run to run. */

#define QK__VJP_TPB 256 /* threads of a sweep block (the reduction's shape: fixed) */

/* K and W from conj(S) (row-major nx x ny, K(X,X): entries (r, c) with c <= r valid) and G
   (row-major, ld ny). W may be Sb (K(X,Y)). */
template <bool CPLX>
__global__ void qk__k_vjp_w(const double *Sb, double *W, double *K, const double *__restrict__ G, int64_t nx, int64_t ny, int sym)
{
    const int64_t tot = nx * ny;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < tot; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / ny, c = e % ny;
        double vr, vi = 0.0, g;
        if (sym) {
            const bool low = c <= i;
            const int64_t at = low ? e : c * ny + i;
            if (CPLX) { vr = Sb[2 * at]; vi = low ? Sb[2 * at + 1] : -Sb[2 * at + 1]; }
            else vr = Sb[at];
            if (c == i) vi = 0.0; /* S_ii is real */
            g = G[e] + G[c * ny + i];
        } else {
            if (CPLX) { vr = Sb[2 * e]; vi = Sb[2 * e + 1]; }
            else vr = Sb[e];
            g = G[e];
        }
        if (K) K[e] = vr * vr + vi * vi;
        if (W) {
            if (CPLX) { W[2 * e] = g * vr; W[2 * e + 1] = g * vi; }
            else W[e] = g * vr;
        }
    }
}

/* the block's sum of v, in a fixed order (warp shuffles, then warp 0 over the warps in order);
   red: QK__VJP_TPB / 32 doubles; the result on thread 0 */
__device__ __forceinline__ double qk__vjp_block_sum(double v, double *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x == 0)
        for (int k = 0; k < QK__VJP_TPB / 32; ++k) s += red[k];
    return s;
}

/* Im(conj(g) l) */
__device__ __forceinline__ double qk__vjp_imdot(double gr, double gi, double lr, double li) { return gr * li - gi * lr; }

/* The adjoint sweeps of samples [r0, r1) (rows r < nx: X's, state A and lam L; r >= nx: Y's, B
   and M). A row is R doubles (CPLX: D complex interleaved; else D real). gbuf: n_w doubles a row,
   zero before. in_smem: s and l copied into dynamic shared memory (2R doubles) first. */
template <bool CPLX>
__global__ void __launch_bounds__(QK__VJP_TPB)
qk__k_vjp_sweep(const qk_op *__restrict__ ops, int n_ops, int q, const double *__restrict__ w, int n_w,
                const double *__restrict__ x, const double *__restrict__ y, int64_t nx, int d, double *A, double *B, double *L,
                double *M, int64_t r0, int in_smem, double *__restrict__ gbuf)
{
    extern __shared__ __align__(16) unsigned char qk__smem[];
    __shared__ double red[2][QK__VJP_TPB / 32];
    const int64_t r = r0 + blockIdx.x, D = (int64_t)1 << q, R = CPLX ? 2 * D : D;
    const bool from_y = r >= nx;
    const int64_t i = from_y ? r - nx : r;
    const double *xs = (from_y ? y : x) + i * d;
    double *s = (from_y ? B : A) + i * R, *l = (from_y ? M : L) + i * R;
    if (in_smem) {
        double *ss = (double *)qk__smem, *sl = ss + R;
        for (int64_t a = threadIdx.x; a < R; a += blockDim.x) { ss[a] = s[a]; sl[a] = l[a]; }
        s = ss;
        l = sl;
        __syncthreads();
    }
    double *grow = gbuf + r * n_w;
    int par = 0;
    for (int k = n_ops - 1; k >= 0; --k) {
        const qk_op o = ops[k];
        if (o.kind == QK_OP_AMPLITUDE) break; /* the first op; nothing before it has a weight */
        const bool angled = qk__op_has_angle(o.kind);
        const bool weighted = angled && (o.angle.kind == QK_ARG_W || o.angle.kind == QK_ARG_WX);
        const double t = angled ? qk__angle_value(&o.angle, xs, w) : 0.0;
        const bool back = k > 0;
        const int64_t b0 = (int64_t)1 << o.q0;
        double part = 0.0;
        if (o.kind == QK_OP_CNOT || o.kind == QK_OP_CZ || o.kind == QK_OP_RZZ) {
            const int64_t b1 = (int64_t)1 << o.q1;
            if (o.kind == QK_OP_CNOT) {
                if (back)
                    for (int64_t u = threadIdx.x; u < D / 2; u += blockDim.x) {
                        const int64_t i0 = ((u >> o.q1) << (o.q1 + 1)) | (u & (b1 - 1));
                        if (!(i0 & b0)) continue;
                        const int64_t i1 = i0 | b1;
                        if (CPLX) {
                            double2 *s2 = (double2 *)s, *l2 = (double2 *)l, v;
                            v = s2[i0]; s2[i0] = s2[i1]; s2[i1] = v;
                            v = l2[i0]; l2[i0] = l2[i1]; l2[i1] = v;
                        } else {
                            double v;
                            v = s[i0]; s[i0] = s[i1]; s[i1] = v;
                            v = l[i0]; l[i0] = l[i1]; l[i1] = v;
                        }
                    }
            } else if (o.kind == QK_OP_CZ) {
                if (back)
                    for (int64_t a = threadIdx.x; a < D; a += blockDim.x) {
                        if ((a & (b0 | b1)) != (b0 | b1)) continue;
                        if (CPLX) { s[2 * a] = -s[2 * a]; s[2 * a + 1] = -s[2 * a + 1]; l[2 * a] = -l[2 * a]; l[2 * a + 1] = -l[2 * a + 1]; }
                        else { s[a] = -s[a]; l[a] = -l[a]; }
                    }
            } else { /* RZZ: exp(-i t/2 Z Z); back: the phase e^{+i t/2 z}, z = +-1 by the parity */
                double sn, cs;
                sincos(0.5 * t, &sn, &cs);
                for (int64_t a = threadIdx.x; a < D; a += blockDim.x) {
                    const bool odd = ((a & b0) != 0) != ((a & b1) != 0);
                    const double sr = s[CPLX ? 2 * a : a], si = CPLX ? s[2 * a + 1] : 0.0;
                    const double lr = l[CPLX ? 2 * a : a], li = CPLX ? l[2 * a + 1] : 0.0;
                    if (weighted) part += odd ? -qk__vjp_imdot(sr, si, lr, li) : qk__vjp_imdot(sr, si, lr, li);
                    if (back && CPLX) {
                        const double pi = odd ? -sn : sn;
                        s[2 * a] = cs * sr - pi * si; s[2 * a + 1] = cs * si + pi * sr;
                        l[2 * a] = cs * lr - pi * li; l[2 * a + 1] = cs * li + pi * lr;
                    }
                }
            }
        } else { /* one qubit: the derivative from the pair (i0, i1), then both back through U^dagger */
            double m[8];
            (void)qk__u1(o.kind, -t, o.kind == QK_OP_BASIS && qk__basis_one(xs[o.angle.x0]), m);
            if (weighted || back)
                for (int64_t u = threadIdx.x; u < D / 2; u += blockDim.x) {
                    const int64_t i0 = ((u >> o.q0) << (o.q0 + 1)) | (u & (b0 - 1)), i1 = i0 | b0;
                    double s0r, s0i = 0.0, s1r, s1i = 0.0, l0r, l0i = 0.0, l1r, l1i = 0.0;
                    if (CPLX) {
                        const double2 a0 = ((const double2 *)s)[i0], a1 = ((const double2 *)s)[i1];
                        const double2 c0 = ((const double2 *)l)[i0], c1 = ((const double2 *)l)[i1];
                        s0r = a0.x; s0i = a0.y; s1r = a1.x; s1i = a1.y; l0r = c0.x; l0i = c0.y; l1r = c1.x; l1i = c1.y;
                    } else {
                        s0r = s[i0]; s1r = s[i1]; l0r = l[i0]; l1r = l[i1];
                    }
                    if (weighted) {
                        switch (o.kind) { /* (Gen s) at i0 and i1 against l */
                        case QK_OP_RX: part += qk__vjp_imdot(s1r, s1i, l0r, l0i) + qk__vjp_imdot(s0r, s0i, l1r, l1i); break;
                        case QK_OP_RY: part += qk__vjp_imdot(s1i, -s1r, l0r, l0i) + qk__vjp_imdot(-s0i, s0r, l1r, l1i); break;
                        case QK_OP_RZ: part += qk__vjp_imdot(s0r, s0i, l0r, l0i) - qk__vjp_imdot(s1r, s1i, l1r, l1i); break;
                        default: part += qk__vjp_imdot(s1r, s1i, l1r, l1i); break; /* P: Pi_1 */
                        }
                    }
                    if (back) {
                        if (CPLX) {
                            double2 y0, y1;
                            y0.x = m[0] * s0r - m[1] * s0i + m[2] * s1r - m[3] * s1i;
                            y0.y = m[0] * s0i + m[1] * s0r + m[2] * s1i + m[3] * s1r;
                            y1.x = m[4] * s0r - m[5] * s0i + m[6] * s1r - m[7] * s1i;
                            y1.y = m[4] * s0i + m[5] * s0r + m[6] * s1i + m[7] * s1r;
                            ((double2 *)s)[i0] = y0; ((double2 *)s)[i1] = y1;
                            y0.x = m[0] * l0r - m[1] * l0i + m[2] * l1r - m[3] * l1i;
                            y0.y = m[0] * l0i + m[1] * l0r + m[2] * l1i + m[3] * l1r;
                            y1.x = m[4] * l0r - m[5] * l0i + m[6] * l1r - m[7] * l1i;
                            y1.y = m[4] * l0i + m[5] * l0r + m[6] * l1i + m[7] * l1r;
                            ((double2 *)l)[i0] = y0; ((double2 *)l)[i1] = y1;
                        } else { /* real maps: every op's matrix is real */
                            s[i0] = m[0] * s0r + m[2] * s1r; s[i1] = m[4] * s0r + m[6] * s1r;
                            l[i0] = m[0] * l0r + m[2] * l1r; l[i1] = m[4] * l0r + m[6] * l1r;
                        }
                    }
                }
        }
        if (weighted) {
            const double dt = qk__vjp_block_sum(part, red[par]); /* includes a barrier */
            par ^= 1;
            if (threadIdx.x == 0) {
                const double dw = o.angle.scale * (o.angle.kind == QK_ARG_WX ? xs[o.angle.x0] : 1.0);
                grow[o.angle.w] += (o.kind == QK_OP_P ? 2.0 * dt : -dt) * dw;
            }
        } else
            __syncthreads();
        if (!back) break;
    }
}

/* grad[w] = sum over the n rows of gbuf[r][w], one block per weight, in a fixed order */
__global__ void __launch_bounds__(256) qk__k_vjp_sum(const double *__restrict__ gbuf, int64_t n, int n_w, double *__restrict__ grad)
{
    __shared__ double red[256];
    const int wi = blockIdx.x;
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < n; r += 256) acc += gbuf[r * n_w + wi];
    const double sum = qk__block_sum256(red, acc);
    if (threadIdx.x == 0) grad[wi] = sum;
}

/* qk__k_vjp_w: grid-stride, 256 threads a block */
static qk_result qk__launch_vjp_w(bool real, const double *Sb, double *W, double *K, const double *G, int64_t nx, int64_t ny, int sym,
                                  cudaStream_t st, qk__err *E)
{
    const unsigned grid = (unsigned)std::min<int64_t>((nx * ny + 255) / 256, 65535);
    if (real) qk__k_vjp_w<false><<<grid, 256, 0, st>>>(Sb, W, K, G, nx, ny, sym);
    else qk__k_vjp_w<true><<<grid, 256, 0, st>>>(Sb, W, K, G, nx, ny, sym);
    QK_LAUNCH_CK("qk__k_vjp_w");
    return QK_OK;
}

/* qk__k_vjp_sweep: one block of QK__VJP_TPB threads per sample of [r0, r0 + n), 2R doubles of
   dynamic shared memory where in_smem (the attribute set by the caller) */
static qk_result qk__launch_vjp_sweep(bool real, const qk_op *ops, int n_ops, int q, const double *w, int n_w, const double *x,
                                      const double *y, int64_t nx, int d, double *A, double *B, double *L, double *M, int64_t r0,
                                      int64_t n, int in_smem, size_t smem, double *gbuf, cudaStream_t st, qk__err *E)
{
    for (int64_t g0 = 0; g0 < n; g0 += 65535) {
        const unsigned nblk = (unsigned)std::min<int64_t>(65535, n - g0);
        if (real)
            qk__k_vjp_sweep<false><<<nblk, QK__VJP_TPB, in_smem ? smem : 0, st>>>(ops, n_ops, q, w, n_w, x, y, nx, d, A, B, L, M, r0 + g0,
                                                                               in_smem, gbuf);
        else
            qk__k_vjp_sweep<true><<<nblk, QK__VJP_TPB, in_smem ? smem : 0, st>>>(ops, n_ops, q, w, n_w, x, y, nx, d, A, B, L, M, r0 + g0,
                                                                              in_smem, gbuf);
        QK_LAUNCH_CK("qk__k_vjp_sweep");
    }
    return QK_OK;
}

/* qk__k_vjp_sum: one block of 256 threads per weight */
static qk_result qk__launch_vjp_sum(const double *gbuf, int64_t n, int n_w, double *grad, cudaStream_t st, qk__err *E)
{
    qk__k_vjp_sum<<<(unsigned)n_w, 256, 0, st>>>(gbuf, n, n_w, grad);
    QK_LAUNCH_CK("qk__k_vjp_sum");
    return QK_OK;
}

/* The device bytes of a VJP (what qk_cuda_gram_vjp allocates, the build scratch included). */
static double qk__vjp_bytes(const qk_map *map, const qk__prog &pg, int64_t nx, int64_t ny, int sym, int real, int k_out)
{
    const double D = (double)((int64_t)1 << map->n_qubits), es = real ? 8.0 : 16.0, nmax = (double)std::max(nx, ny);
    const double n = (double)nx + (sym ? 0.0 : (double)ny);
    double b = 8.0 * n * map->n_features;                                          /* x, y */
    b += nmax * pg.P * 8.0 + (pg.passes.size() > 1 ? nmax * D * 16.0 : 0.0) + nmax * 8.0; /* build scratch */
    b += n * D * es * 2.0;                                                         /* states, adjoint vectors */
    b += (double)nx * ny * (es * (sym ? 2.0 : 1.0) + 8.0 + (k_out ? 8.0 : 0.0));   /* conj(S) (and W), G, K */
    b += n * std::max(1, map->n_weights) * 8.0 + 4096.0 * 8 + map->n_ops * sizeof(qk_op);
    return b;
}

struct qk__vjp_bufs {
    double *dx = nullptr, *dy = nullptr, *A = nullptr, *B = nullptr, *L = nullptr, *M = nullptr;
    double *S = nullptr, *W = nullptr, *G = nullptr, *K = nullptr, *gbuf = nullptr, *grad = nullptr;
    qk_op *ops = nullptr;
    qk__build_ws ws;
    qk__dprog dp;
    cudaStream_t st = nullptr, st2 = nullptr; /* the products and kernels; G's upload beside them */
    cudaEvent_t ev = nullptr, sev[2] = {nullptr, nullptr};   /* staging buffers' DMAs */
    cublasHandle_t blas = nullptr;
    qk_cuda_pool *lent = nullptr;
    bool own_st = false, own_blas = false;
};

static void qk__vjp_free(qk__vjp_bufs &b)
{
    if (b.st) cudaStreamSynchronize(b.st);
    if (b.st2) cudaStreamSynchronize(b.st2);
    cudaFree(b.dx); cudaFree(b.dy); cudaFree(b.A); cudaFree(b.B); cudaFree(b.L); cudaFree(b.M);
    if (b.W != b.S) cudaFree(b.W);   /* K(X,Y): W is S, overwritten in place */
    cudaFree(b.S); cudaFree(b.G); cudaFree(b.K); cudaFree(b.gbuf); cudaFree(b.grad); cudaFree(b.ops);
    cudaFree(b.ws.params); cudaFree(b.ws.tmp); cudaFree(b.ws.inv);
    qk__dprog_free(&b.dp);
    if (b.own_blas && b.blas) cublasDestroy(b.blas);
    if (b.ev) cudaEventDestroy(b.ev);
    for (cudaEvent_t e : b.sev) if (e) cudaEventDestroy(e);
    if (b.own_st && b.st) cudaStreamDestroy(b.st);
    if (b.own_st && b.st2) cudaStreamDestroy(b.st2);
    qk__pool_return(b.lent);
    cudaGetLastError();
    b = qk__vjp_bufs();
}

/* Host rows on up to 8 threads (the copies between pageable memory and pinned staging: one core
   copies a fraction of what PCIe moves). Each thread runs f(r0, r1) on its share of rows
   [0, rows), at least 2^20 bytes (min_rows_per rows) a thread. */
template <typename F>
static void qk__vjp_par_rows(int64_t rows, int64_t min_rows, F f)
{
    const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(8, rows / std::max<int64_t>(1, min_rows)));
    if (nt <= 1) { f((int64_t)0, rows); return; }
    std::vector<std::thread> th;
    for (int64_t t = 1; t < nt; ++t) th.emplace_back([=] { f(rows * t / nt, rows * (t + 1) / nt); });
    f((int64_t)0, rows / nt);
    for (auto &x : th) x.join();
}

/* G (nx x ny doubles, rows ldg apart, the caller's host memory) into dG (rows of ny) on stream
   st, checking every entry is finite on the way: *bad is the row-major index (row * ny + column)
   of the first that is not, or -1. Pageable G crosses through the two pinned staging buffers (a
   chunk of rows copied and checked by up to 8 threads into one while the other's DMA runs: the
   driver's own pageable path runs at a fraction of the pinned rate, docs/benchmarks.md,
   "Gradients on the GPU"); page-locked G (or no staging) is copied as it is and checked by the
   same threads, read-only, while its DMA runs. Returns once the copies are queued and the check
   is done (the staging's last DMA may still run: its event is ev[0..1]). */
static qk_result qk__vjp_upload_g(double *dG, const double *g, int64_t nx, int64_t ny, int64_t ldg, void *const stage[2], size_t stage_bytes,
                                  cudaStream_t st, cudaEvent_t ev[2], int64_t *bad, qk__err *E)
{
    const size_t rowb = (size_t)ny * sizeof(double);
    const int64_t min_rows = std::max<int64_t>(1, (int64_t)(((size_t)1 << 20) / rowb));
    std::atomic<int64_t> first(INT64_MAX);
    auto check = [&](const double *src, int64_t ld, int64_t row0, int64_t r0, int64_t r1, double *dst) {
        int64_t f = INT64_MAX;
        for (int64_t r = r0; r < r1 && f == INT64_MAX; ++r) {
            const double *a = src + r * ld;
            if (dst) memcpy(dst + r * ny, a, rowb);
            bool ok = true;
            for (int64_t c = 0; c < ny; ++c) ok &= std::isfinite(a[c]);   /* no branch a column: vectorised */
            if (!ok)
                for (int64_t c = 0; c < ny; ++c)
                    if (!std::isfinite(a[c])) { f = (row0 + r) * ny + c; break; }
        }
        int64_t cur = first.load();
        while (f < cur && !first.compare_exchange_weak(cur, f)) {}
    };
    const bool staged = !qk_cuda_host_pinned(g) && stage[0] && stage[1] && stage_bytes >= rowb;
    if (!staged) {
        QK_CK(cudaMemcpy2DAsync(dG, rowb, g, (size_t)ldg * sizeof(double), rowb, (size_t)nx, cudaMemcpyHostToDevice, st));
        qk__vjp_par_rows(nx, min_rows, [&](int64_t r0, int64_t r1) { check(g, ldg, 0, r0, r1, nullptr); });
    } else {
        const int64_t chunk = std::min<int64_t>(nx, (int64_t)(stage_bytes / rowb));
        for (int64_t r0 = 0, k = 0; r0 < nx; r0 += chunk, ++k) {
            const int64_t rows = std::min(chunk, nx - r0);
            const int i = (int)(k & 1);
            if (k >= 2) QK_CK(cudaEventSynchronize(ev[i]));   /* staging i was read by chunk k - 2's DMA */
            double *sb = (double *)stage[i];
            qk__vjp_par_rows(rows, min_rows, [&](int64_t a, int64_t b) { check(g + r0 * ldg, ldg, r0, a, b, sb); });
            if (first.load() != INT64_MAX) break;
            QK_CK(cudaMemcpyAsync(dG + r0 * ny, sb, (size_t)rows * rowb, cudaMemcpyHostToDevice, st));
            QK_CK(cudaEventRecord(ev[i], st));
        }
    }
    *bad = first.load() == INT64_MAX ? -1 : first.load();
    return QK_OK;
}

/* dK (nx x ny doubles, dense) into the caller's k (same shape), through the pinned staging where
   k is pageable (each chunk's DMA, then its copy out on up to 8 threads while the next chunk's
   DMA runs), else straight. Synchronous. */
static qk_result qk__vjp_download_k(double *k, const double *dK, int64_t nx, int64_t ny, void *const stage[2], size_t stage_bytes,
                                    cudaStream_t st, cudaEvent_t ev[2], qk__err *E)
{
    const size_t rowb = (size_t)ny * sizeof(double);
    if (qk_cuda_host_pinned(k) || !stage[0] || !stage[1] || stage_bytes < rowb) {
        QK_CK(cudaMemcpyAsync(k, dK, (size_t)nx * rowb, cudaMemcpyDeviceToHost, st));
        QK_CK(cudaStreamSynchronize(st));
        return QK_OK;
    }
    const int64_t chunk = std::min<int64_t>(nx, (int64_t)(stage_bytes / rowb)), nck = (nx + chunk - 1) / chunk;
    const int64_t min_rows = std::max<int64_t>(1, (int64_t)(((size_t)1 << 20) / rowb));
    for (int64_t k0 = 0; k0 < std::min<int64_t>(2, nck); ++k0) {   /* the first two chunks' DMA */
        const int64_t r0 = k0 * chunk, rows = std::min(chunk, nx - r0);
        QK_CK(cudaMemcpyAsync(stage[k0], dK + r0 * ny, (size_t)rows * rowb, cudaMemcpyDeviceToHost, st));
        QK_CK(cudaEventRecord(ev[k0], st));
    }
    for (int64_t c = 0; c < nck; ++c) {
        const int i = (int)(c & 1);
        const int64_t r0 = c * chunk, rows = std::min(chunk, nx - r0);
        QK_CK(cudaEventSynchronize(ev[i]));
        const double *sb = (const double *)stage[i];
        qk__vjp_par_rows(rows, min_rows, [&](int64_t a, int64_t b) { memcpy(k + (r0 + a) * ny, sb + a * ny, (size_t)(b - a) * rowb); });
        if (c + 2 < nck) {   /* staging i is free again: chunk c + 2's DMA */
            const int64_t r2 = (c + 2) * chunk, rows2 = std::min(chunk, nx - r2);
            QK_CK(cudaMemcpyAsync(stage[i], dK + r2 * ny, (size_t)rows2 * rowb, cudaMemcpyDeviceToHost, st));
            QK_CK(cudaEventRecord(ev[i], st));
        }
    }
    return QK_OK;
}

/* A build's states into out (rows of D: real where real, else complex double). */
static qk_result qk__vjp_states(const qk__prog &pg, qk__vjp_bufs &b, const double *dx, int64_t n, double *out, bool real, qk__err *E)
{
    return qk__build_states<double>(pg, b.dp, dx, n, b.ws, out, real, b.st, E);
}

static qk_result qk__vjp_run(const qk_map *map, const qk_vjp_desc *d, int real, qk_cuda_pool *pool, void *const stage[2], size_t stage_bytes,
                             qk__vjp_bufs &b, qk__err *E)
{
    const int64_t nx = d->n_x, ny = d->y ? d->n_y : d->n_x, D = (int64_t)1 << map->n_qubits, R = real ? D : 2 * D;
    const int sym = d->y == nullptr, nw = map->n_weights;
    const int64_t total = nx + (sym ? 0 : ny), ldg = d->ld_g ? d->ld_g : ny;
    const size_t es = real ? 8 : 16;
    char msg[300];
    qk__prog pg;
    qk_map m2 = *map;
    if (m2.cls == QK_CLASS_PRODUCT) m2.cls = QK_CLASS_COMPLEX; /* build the state vector anyway */
    QK_TRY(qk__compile(&m2, &pg, E));
    /* the device memory first: a clear error before anything is allocated */
    {
        size_t fr = 0, tot = 0;
        QK_CK(cudaMemGetInfo(&fr, &tot));
        const double need = qk__vjp_bytes(map, pg, nx, ny, sym, real, d->k_out != nullptr);
        if (need > 0.95 * (double)fr) {
            snprintf(msg, sizeof msg,
                     "qk_gram_vjp: the states, S, W and the adjoint vectors need %.3g GB of device memory, %.3g GB are free "
                     "(the gradient keeps every state resident: fewer samples per call)", need * 1e-9, (double)fr * 1e-9);
            return qk__fail_msg(E, QK_ERROR_DEVICE_OUT_OF_MEMORY, msg);
        }
    }
    if ((b.lent = qk__pool_borrow(pool))) { /* the context's stream and cuBLAS handle */
        b.st = pool->st[0];
        b.st2 = pool->st[1];
        if (!pool->blas) QK_BLAS_CK(cublasCreate(&pool->blas));
        b.blas = pool->blas;
    } else {
        b.own_st = true;
        QK_CK(cudaStreamCreateWithFlags(&b.st, cudaStreamNonBlocking));
        QK_CK(cudaStreamCreateWithFlags(&b.st2, cudaStreamNonBlocking));
        QK_BLAS_CK(cublasCreate(&b.blas));
        b.own_blas = true;
    }
    QK_BLAS_CK(cublasSetStream(b.blas, b.st));
    QK_CK(cudaEventCreateWithFlags(&b.ev, cudaEventDisableTiming));
    auto poll = [&](int64_t done) -> qk_result {
        if (!d->progress) return QK_OK;
        QK_CK(cudaStreamSynchronize(b.st));
        if (d->progress(done, total, d->progress_user))
            return qk__fail_msg(E, QK_ERROR_CANCELLED, "qk_gram_vjp: cancelled by the progress callback (nothing was written)");
        return QK_OK;
    };
    /* 1. states */
    QK_TRY(qk__dprog_make(pg, map, &b.dp, E));
    const int64_t nmax = std::max(nx, ny);
    QK_CK(cudaMalloc((void **)&b.dx, std::max<size_t>(1, (size_t)nx * map->n_features * sizeof(double))));
    QK_CK(cudaMemcpyAsync(b.dx, d->x, (size_t)nx * map->n_features * sizeof(double), cudaMemcpyHostToDevice, b.st));
    if (!sym) {
        QK_CK(cudaMalloc((void **)&b.dy, std::max<size_t>(1, (size_t)ny * map->n_features * sizeof(double))));
        QK_CK(cudaMemcpyAsync(b.dy, d->y, (size_t)ny * map->n_features * sizeof(double), cudaMemcpyHostToDevice, b.st));
    }
    QK_CK(cudaMalloc(&b.ws.params, (size_t)nmax * pg.P * sizeof(double)));
    if (pg.passes.size() > 1) QK_CK(cudaMalloc(&b.ws.tmp, (size_t)nmax * D * 16));
    if (pg.has_amp) QK_CK(cudaMalloc((void **)&b.ws.inv, (size_t)nmax * sizeof(double)));
    QK_CK(cudaMalloc((void **)&b.A, (size_t)nx * D * es));
    QK_TRY(qk__vjp_states(pg, b, b.dx, nx, b.A, real, E));
    if (!sym) {
        QK_CK(cudaMalloc((void **)&b.B, (size_t)ny * D * es));
        QK_TRY(qk__vjp_states(pg, b, b.dy, ny, b.B, real, E));
    } else
        b.B = nullptr;
    double *Bs = sym ? b.A : b.B;
    /* 2. conj(S), row-major nx x ny: column-major ny x nx = B^H A */
    QK_CK(cudaMalloc((void **)&b.S, (size_t)nx * ny * es));
    {
        const double one = 1.0, zero = 0.0;
        const cuDoubleComplex c1 = make_cuDoubleComplex(1, 0), c0 = make_cuDoubleComplex(0, 0);
        if (sym) {
            if (real) QK_BLAS_CK(cublasDsyrk(b.blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T, (int)nx, (int)D, &one, b.A, (int)D, &zero, b.S, (int)nx));
            else QK_BLAS_CK(cublasZherk(b.blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_C, (int)nx, (int)D, &one, (const cuDoubleComplex *)b.A, (int)D,
                                        &zero, (cuDoubleComplex *)b.S, (int)nx));
        } else {
            if (real) QK_BLAS_CK(cublasDgemm(b.blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)ny, (int)nx, (int)D, &one, Bs, (int)D, b.A, (int)D, &zero, b.S, (int)ny));
            else QK_BLAS_CK(cublasZgemm(b.blas, CUBLAS_OP_C, CUBLAS_OP_N, (int)ny, (int)nx, (int)D, &c1, (const cuDoubleComplex *)Bs, (int)D,
                                        (const cuDoubleComplex *)b.A, (int)D, &c0, (cuDoubleComplex *)b.S, (int)ny));
        }
    }
    /* G's upload on the second stream, checked on the way, while the states and S are computed
       (the host copies hold the calling thread; the work queued before them runs meanwhile) */
    QK_CK(cudaMalloc((void **)&b.G, (size_t)nx * ny * sizeof(double)));
    QK_CK(cudaEventCreateWithFlags(&b.sev[0], cudaEventDisableTiming));
    QK_CK(cudaEventCreateWithFlags(&b.sev[1], cudaEventDisableTiming));
    {
        int64_t bad = -1;
        QK_TRY(qk__vjp_upload_g(b.G, d->g, nx, ny, ldg, stage, stage_bytes, b.st2, b.sev, &bad, E));
        if (bad >= 0) {
            snprintf(msg, sizeof msg, "qk_gram_vjp: g[%lld][%lld] is not finite", (long long)(bad / ny), (long long)(bad % ny));
            return qk__fail_msg(E, QK_ERROR_NON_FINITE, msg);
        }
    }
    QK_CK(cudaEventRecord(b.ev, b.st2));
    QK_CK(cudaStreamWaitEvent(b.st, b.ev, 0));
    QK_CK(cudaStreamSynchronize(b.st)); /* the build scratch goes back (cudaFree would wait anyway) */
    cudaFree(b.ws.params); cudaFree(b.ws.tmp); cudaFree(b.ws.inv);
    b.ws.params = nullptr; b.ws.tmp = nullptr; b.ws.inv = nullptr;   /* freed once (qk__vjp_free) */
    b.ws = qk__build_ws();
    QK_TRY(poll(0));
    /* 3. K and W */
    if (d->k_out) QK_CK(cudaMalloc((void **)&b.K, (size_t)nx * ny * sizeof(double)));
    if (nw > 0) {
        if (sym) QK_CK(cudaMalloc((void **)&b.W, (size_t)nx * ny * es));
        else b.W = b.S;
    }
    QK_TRY(qk__launch_vjp_w(real, b.S, b.W, b.K, b.G, nx, ny, sym, b.st, E));
    std::vector<double> grad_h((size_t)std::max(1, nw));
    if (nw > 0) {
        QK_TRY(poll(0));
        /* 4. lam = W B (column-major D x nx: B (D x ny) times W (ny x nx)); mu = A W^H */
        QK_CK(cudaMalloc((void **)&b.L, (size_t)nx * D * es));
        if (!sym) QK_CK(cudaMalloc((void **)&b.M, (size_t)ny * D * es));
        const double one = 1.0, zero = 0.0;
        const cuDoubleComplex c1 = make_cuDoubleComplex(1, 0), c0 = make_cuDoubleComplex(0, 0);
        if (real) {
            QK_BLAS_CK(cublasDgemm(b.blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)D, (int)nx, (int)ny, &one, Bs, (int)D, b.W, (int)ny, &zero, b.L, (int)D));
            if (!sym)
                QK_BLAS_CK(cublasDgemm(b.blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)D, (int)ny, (int)nx, &one, b.A, (int)D, b.W, (int)ny, &zero, b.M, (int)D));
        } else {
            QK_BLAS_CK(cublasZgemm(b.blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)D, (int)nx, (int)ny, &c1, (const cuDoubleComplex *)Bs, (int)D,
                                   (const cuDoubleComplex *)b.W, (int)ny, &c0, (cuDoubleComplex *)b.L, (int)D));
            if (!sym)
                QK_BLAS_CK(cublasZgemm(b.blas, CUBLAS_OP_N, CUBLAS_OP_C, (int)D, (int)ny, (int)nx, &c1, (const cuDoubleComplex *)b.A, (int)D,
                                       (const cuDoubleComplex *)b.W, (int)ny, &c0, (cuDoubleComplex *)b.M, (int)D));
        }
        /* W, S and G are done with: give them back before the sweeps */
        QK_CK(cudaStreamSynchronize(b.st));
        if (b.W != b.S) cudaFree(b.W);
        cudaFree(b.S); cudaFree(b.G);
        b.W = b.S = b.G = nullptr;
        QK_TRY(poll(0));
        /* 5. the sweeps, in chunks of samples where a progress callback polls between them */
        QK_CK(cudaMalloc((void **)&b.ops, (size_t)std::max(1, map->n_ops) * sizeof(qk_op)));
        QK_CK(cudaMemcpyAsync(b.ops, map->ops, (size_t)map->n_ops * sizeof(qk_op), cudaMemcpyHostToDevice, b.st));
        QK_CK(cudaMalloc((void **)&b.gbuf, (size_t)total * nw * sizeof(double)));
        QK_CK(cudaMemsetAsync(b.gbuf, 0, (size_t)total * nw * sizeof(double), b.st));
        QK_CK(cudaMalloc((void **)&b.grad, (size_t)nw * sizeof(double)));
        int optin = 0, dev = -1;
        QK_CK(cudaGetDevice(&dev));
        QK_CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        const size_t smem = (size_t)2 * R * sizeof(double);
        const int in_smem = smem + 1024 <= (size_t)optin;
        if (in_smem) {
            if (real) QK_CK(cudaFuncSetAttribute(qk__k_vjp_sweep<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            else QK_CK(cudaFuncSetAttribute(qk__k_vjp_sweep<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        }
        const int64_t chunk = d->progress ? std::max<int64_t>(1, (total + 15) / 16) : total;
        for (int64_t r0 = 0; r0 < total; r0 += chunk) {
            const int64_t nb = std::min(chunk, total - r0);
            QK_TRY(qk__launch_vjp_sweep(real, b.ops, map->n_ops, map->n_qubits, b.dp.w, nw, b.dx, b.dy, nx, map->n_features, b.A, Bs, b.L, b.M,
                                        r0, nb, in_smem, smem, b.gbuf, b.st, E));
            QK_TRY(poll(r0 + nb));
        }
        QK_TRY(qk__launch_vjp_sum(b.gbuf, total, nw, b.grad, b.st, E));
        QK_CK(cudaMemcpyAsync(grad_h.data(), b.grad, (size_t)nw * sizeof(double), cudaMemcpyDeviceToHost, b.st));
    }
    QK_CK(cudaStreamSynchronize(b.st));
    /* the outputs once nothing can fail: K straight into k_out (the last call), the gradient */
    if (d->k_out) QK_TRY(qk__vjp_download_k(d->k_out, b.K, nx, ny, stage, stage_bytes, b.st, b.sev, E));
    if (nw > 0) memcpy(d->grad_w, grad_h.data(), (size_t)nw * sizeof(double));
    return QK_OK;
}

extern "C" qk_result qk_cuda_gram_vjp(const qk_map *map, const qk_vjp_desc *desc, int real, qk_cuda_pool *pool, void *const stage[2],
                                      size_t stage_bytes, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!map || !desc || !desc->x || !desc->g || (map->n_weights > 0 && !desc->grad_w))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram_vjp: NULL argument");
    if (map->n_qubits > QK_MAX_STATE_QUBITS) return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_gram_vjp: too many qubits");
    const int64_t ny = desc->y ? desc->n_y : desc->n_x;
    if (desc->n_x > INT32_MAX || ny > INT32_MAX)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram_vjp: more than 2^31 - 1 samples a side");
    qk__vjp_bufs b;
    qk_result r;
    try {
        void *const none[2] = {nullptr, nullptr};
        r = qk__vjp_run(map, desc, real, pool, stage ? stage : none, stage ? stage_bytes : 0, b, E);
    } catch (const std::bad_alloc &) {
        r = qk__fail_msg(E, QK_ERROR_OUT_OF_MEMORY, "qk_cuda_gram_vjp: out of host memory");
    }
    qk__vjp_free(b);
    return r;
}
