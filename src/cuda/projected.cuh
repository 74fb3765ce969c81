/* ======================================================================================== */
/* >>projected ---- qk_cuda_gram_projected: the projected quantum kernel on the GPU ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"
#include "compile.cuh"
#include "states.cuh"
#include "pipeline.cuh"
/* The CPU's qk_gram_projected (vjp.c, docs/gradients.md) on one GPU, fp64. Each sample gives 3q
   features f = (rho00, Re rho01, Im rho01) per qubit, K(x, x') = exp(-2 gamma |f - f'|^2):
   1. the features, by path:
      statevector  the states built on the device (qk__build_states) in chunks of samples, then
                   one block per (sample, qubit) sums rho00 = sum |psi_i|^2 and rho01 = sum
                   psi_i conj(psi_{i|b}) over the indices i without bit b (a strided loop, then a
                   tree over the block: a fixed order);
      MPS          each chunk's MPS built on the host (qk.h's provider: the MPS engine's builder,
                   as the CPU path does), uploaded in the engine's lane layout as it is, then one
                   block per sample (a grid of at most a few blocks per SM, each looping over
                   samples) runs the CPU's two sweeps: the left environments L_s stored for every
                   site (the block's global scratch), then right to left R_{s+1}, X = A R,
                   W = L_s X, rho_s = W A^H and R_s = X A^H, the site tensor and the working
                   matrices in shared memory where they fit (else the block's global scratch);
                   every entry is summed by one thread in the CPU's order (rho: per l' by one
                   thread, then the l' in order), so the features are the same bits run to run;
                   the host builds the next chunk while the device sweeps this one;
      product      the features computed on the host (qk.h), uploaded;
   2. K: a tiled kernel over pairs (64 x 64 a block, the features staged through shared memory
      16 at a time), |f - f'|^2 summed in feature order as on the CPU, then exp, written in the
      output dtype; K(X,X) resident on the device computes the tiles on and above the diagonal
      and writes both halves, else slabs of rows (every column);
   3. K to the caller's buffer (ld_out), slab by slab, once every device buffer is held (a slab
      copy is the only thing after the first host write that can fail: a CUDA error). */

#define QK__PQ_TPB 128  /* threads of an MPS sweep block */
#define QK__PQ_BM 64    /* rows (and columns) of K per RBF block */
#define QK__PQ_BK 16    /* features per shared-memory stage */

/* rho00 and rho01 of qubit blockIdx.y of sample blockIdx.x (rows of D: complex interleaved, or
   real): F[sample][3k .. 3k + 2] */
template <bool CPLX>
__global__ void __launch_bounds__(256) qk__k_pq_sv(const double *__restrict__ S, int q, double *__restrict__ F)
{
    __shared__ double red[3][256];
    const int64_t i = blockIdx.x, D = (int64_t)1 << q;
    const int k = blockIdx.y;
    const int64_t b = (int64_t)1 << k;
    const double *s = S + i * (CPLX ? 2 * D : D);
    double r00 = 0.0, rr = 0.0, ri = 0.0;
    for (int64_t u = threadIdx.x; u < D / 2; u += 256) {
        const int64_t i0 = ((u >> k) << (k + 1)) | (u & (b - 1)), i1 = i0 | b;
        if (CPLX) {
            const double2 a0 = ((const double2 *)s)[i0], a1 = ((const double2 *)s)[i1];
            r00 += a0.x * a0.x + a0.y * a0.y;
            rr += a0.x * a1.x + a0.y * a1.y;   /* psi_i0 conj(psi_i1) */
            ri += a0.y * a1.x - a0.x * a1.y;
        } else {
            const double a0 = s[i0], a1 = s[i1];
            r00 += a0 * a0;
            rr += a0 * a1;
        }
    }
    const double s0 = qk__block_sum256(red[0], r00), s1 = qk__block_sum256(red[1], rr), s2 = qk__block_sum256(red[2], ri);
    if (threadIdx.x == 0) {
        double *f = F + i * 3 * q + 3 * k;
        f[0] = s0; f[1] = s1; f[2] = s2;
    }
}

/* The MPS sweeps' pieces (complex numbers as (re, im) pairs of doubles):
   qk__pq_dot  out = sum_k x[k xs] y[k ys] (CONJ: x[k xs] conj(y[k ys])) over len terms, in order;
   qk__pq_site the site tensor of one sample from the lane layout (entry e at p + e 2 nj, its
               imaginary part nj later) into sA, by the block's threads;
   qk__pq_lmul out[l'][a][r] = sum_l Ls[l][l'] M[l][a][r] (Ls dl x dl, M dl x 2 x dr), by the block. */
template <bool CONJ>
__device__ __forceinline__ void qk__pq_dot(const double *x, int xs, const double *y, int ys, int len, double *out)
{
    double re = 0.0, im = 0.0;
    for (int k = 0; k < len; ++k) {
        const double xr = x[2 * k * xs], xi = x[2 * k * xs + 1], yr = y[2 * k * ys], yi = y[2 * k * ys + 1];
        if (CONJ) {
            re += xr * yr + xi * yi;
            im += xi * yr - xr * yi;
        } else {
            re += xr * yr - xi * yi;
            im += xr * yi + xi * yr;
        }
    }
    out[0] = re;
    out[1] = im;
}
__device__ __forceinline__ void qk__pq_site(double *sA, const double *p, int na, int nj)
{
    for (int e = threadIdx.x; e < na; e += QK__PQ_TPB) {
        sA[2 * e] = p[(int64_t)e * 2 * nj];
        sA[2 * e + 1] = p[(int64_t)e * 2 * nj + nj];
    }
}
__device__ __forceinline__ void qk__pq_lmul(const double *Ls, const double *M, int dl, int dr, double *out)
{
    for (int e = threadIdx.x; e < dl * 2 * dr; e += QK__PQ_TPB) {
        const int lp = e / (2 * dr), ar = e % (2 * dr);   /* ar = a dr + r */
        qk__pq_dot<false>(Ls + 2 * lp, dl, M + 2 * ar, 2 * dr, dl, out + 2 * e);
    }
}

/* The features of n samples of an MPS chunk (lane layout: sample i in group i / nj at lane
   i % nj; entry e of site s at off[s] + e * 2 nj, its imaginary part nj later) into F (row i).
   Block b takes samples b, b + gridDim.x, ...; its scratch is per_block doubles at
   scratch + b * per_block: the left environments (L_s at loff[s], 2 D[s]^2 doubles), then, where
   !in_smem, the working matrices (from loff[q] + 2 D[q]^2), which are else in dynamic shared
   memory: the site tensor sA and X, W (4 dmax^2 each), R, Rn (2 dmax^2 each), rho's partial sums
   (8 dmax). */
__global__ void __launch_bounds__(QK__PQ_TPB)
qk__k_pq_mps(const double *__restrict__ lanes, int64_t n, int q, const int *__restrict__ Dd, const int *__restrict__ ord,
             const int64_t *__restrict__ off, int64_t group, int nj, const int64_t *__restrict__ loff, int dmax, double *scratch,
             int64_t per_block, int in_smem, double *__restrict__ F)
{
    extern __shared__ __align__(16) unsigned char qk__smem[];
    const int tid = threadIdx.x;
    const int64_t dm2 = (int64_t)dmax * dmax;
    double *L = scratch + (int64_t)blockIdx.x * per_block;
    double *sA = in_smem ? (double *)qk__smem : L + loff[q] + 2 * Dd[q] * Dd[q];
    double *X = sA + 4 * dm2, *W = X + 4 * dm2, *R = W + 4 * dm2, *Rn = R + 2 * dm2, *part = Rn + 2 * dm2;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const double *g = lanes + (i / nj) * group + (i % nj);
        double *f = F + i * 3 * q;
        if (tid == 0) { L[0] = 1.0; L[1] = 0.0; }
        /* left: L_{s+1}[r][r'] = sum_{l', a} X[l'][a][r] conj(A[l'][a][r']), X[l'][a][r] = sum_l L_s[l][l'] A[l][a][r] */
        for (int s = 0; s < q; ++s) {
            const int dl = Dd[s], dr = Dd[s + 1], na = dl * 2 * dr;
            qk__pq_site(sA, g + off[s], na, nj);
            __syncthreads(); /* sA, and L_s of the last site */
            const double *Ls = L + loff[s];
            double *Ln = L + loff[s + 1];
            qk__pq_lmul(Ls, sA, dl, dr, X);
            __syncthreads();
            /* (l', a) as one index j = 2 l' + a, X[j][r] conj(A[j][r']) summed over j */
            for (int e = tid; e < dr * dr; e += QK__PQ_TPB) {
                const int r = e / dr, rp = e % dr;
                qk__pq_dot<true>(X + 2 * r, dr, sA + 2 * rp, dr, 2 * dl, Ln + 2 * e);
            }
            __syncthreads(); /* sA and X are read: the next site may overwrite them */
        }
        /* right to left */
        if (tid == 0) { R[0] = 1.0; R[1] = 0.0; }
        for (int s = q - 1; s >= 0; --s) {
            const int dl = Dd[s], dr = Dd[s + 1], na = dl * 2 * dr;
            const double *Ls = L + loff[s];
            qk__pq_site(sA, g + off[s], na, nj);
            __syncthreads(); /* sA, R */
            /* X[l][a][r'] = sum_r A[l][a][r] R[r][r'] */
            for (int e = tid; e < na; e += QK__PQ_TPB) {
                const int rp = e % dr;
                qk__pq_dot<false>(sA + 2 * (e - rp), 1, R + 2 * rp, dr, dr, X + 2 * e);
            }
            __syncthreads();
            /* W[l'][a][r'] = sum_l L_s[l][l'] X[l][a][r'] */
            qk__pq_lmul(Ls, X, dl, dr, W);
            /* R_s[l][l'] = sum_{a, r'} X[l][a][r'] conj(A[l'][a][r']) (into Rn: R is read no more) */
            for (int e = tid; e < dl * dl; e += QK__PQ_TPB) {
                const int l = e / dl, lp = e % dl;   /* (a, r') as one index a dr + r' */
                qk__pq_dot<true>(X + 4 * l * dr, 1, sA + 4 * lp * dr, 1, 2 * dr, Rn + 2 * e);
            }
            __syncthreads();
            /* rho[a][a'] = sum_{l'} sum_{r'} W[l'][a][r'] conj(A[l'][a'][r']): per (a, a', l') here */
            for (int e = tid; e < 4 * dl; e += QK__PQ_TPB) {
                const int c = e / dl, lp = e % dl, a = c >> 1, ap = c & 1;
                qk__pq_dot<true>(W + 2 * (lp * 2 + a) * dr, 1, sA + 2 * (lp * 2 + ap) * dr, 1, dr, part + 2 * e);
            }
            __syncthreads();
            if (tid == 0) {
                double rho[8];
                for (int c = 0; c < 4; ++c) {
                    double vr = 0.0, vi = 0.0;
                    for (int lp = 0; lp < dl; ++lp) { vr += part[2 * (c * dl + lp)]; vi += part[2 * (c * dl + lp) + 1]; }
                    rho[2 * c] = vr;
                    rho[2 * c + 1] = vi;
                }
                double tr = rho[0] + rho[6];
                if (!(tr > 0)) tr = 1.0;
                const int k = ord[s];
                f[3 * k] = rho[0] / tr;
                f[3 * k + 1] = rho[2] / tr;
                f[3 * k + 2] = rho[3] / tr;
            }
            double *sw = R;
            R = Rn;
            Rn = sw;
            /* the next site's loads (sA) and R come after a barrier; part is written again only
               after two more */
        }
        __syncthreads(); /* the last site's reads of sA, part and L_0 before the next sample */
    }
}

/* K over the pairs of rows [r0, r0 + rows) of Fa against the ncols rows of Fb (nf features a
   row): K[i - r0][j] (ld ldk) = exp(coef |fa_i - fb_j|^2), the sum in feature order. sym (K(X,X),
   the whole of K: r0 = 0): only tiles with a column >= a row, and the mirror written. */
template <typename OutT>
__global__ void __launch_bounds__(256) qk__k_pq_rbf(const double *__restrict__ Fa, const double *__restrict__ Fb, int64_t r0, int64_t rows,
                                                    int64_t ncols, int nf, double coef, OutT *__restrict__ K, int64_t ldk, int sym)
{
    __shared__ double sa[QK__PQ_BK][QK__PQ_BM + 1], sb[QK__PQ_BK][QK__PQ_BM + 1];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t i0 = r0 + (int64_t)blockIdx.y * QK__PQ_BM, j0 = (int64_t)blockIdx.x * QK__PQ_BM;
    if (sym && j0 + QK__PQ_BM - 1 < i0) return; /* wholly below the diagonal (block-uniform) */
    const int64_t rend = r0 + rows;
    double d2[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) d2[a][c] = 0.0;
    for (int k0 = 0; k0 < nf; k0 += QK__PQ_BK) {
        for (int e = threadIdx.x; e < QK__PQ_BM * QK__PQ_BK; e += 256) {
            const int rr = e / QK__PQ_BK, kk = e % QK__PQ_BK, k = k0 + kk;
            const int64_t ia = i0 + rr, jb = j0 + rr;
            sa[kk][rr] = (ia < rend && k < nf) ? Fa[ia * nf + k] : 0.0;
            sb[kk][rr] = (jb < ncols && k < nf) ? Fb[jb * nf + k] : 0.0;
        }
        __syncthreads();
        const int kn = min(QK__PQ_BK, nf - k0);
        for (int kk = 0; kk < kn; ++kk) {
            double av[4], bv[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) av[a] = sa[kk][ty + 16 * a];
#pragma unroll
            for (int c = 0; c < 4; ++c) bv[c] = sb[kk][tx + 16 * c];
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const double t = av[a] - bv[c];
                    d2[a][c] += t * t;
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int64_t i = i0 + ty + 16 * a, j = j0 + tx + 16 * c;
            if (i >= rend || j >= ncols) continue;
            const OutT v = (OutT)exp(coef * d2[a][c]);
            if (sym) {
                if (j < i) continue;
                K[i * ldk + j] = v;
                if (j > i) K[j * ldk + i] = v;
            } else
                K[(i - r0) * ldk + j] = v;
        }
}

/* qk__k_pq_sv: a block of 256 threads per (sample, qubit) of n samples */
static qk_result qk__launch_pq_sv(bool real, const double *S, int64_t n, int q, double *F, cudaStream_t st, qk__err *E)
{
    for (int64_t g0 = 0; g0 < n; g0 += 65535) {   /* grid.x within 65535 on every device */
        const dim3 grid((unsigned)std::min<int64_t>(65535, n - g0), (unsigned)q);
        const int64_t R = real ? ((int64_t)1 << q) : ((int64_t)2 << q);
        if (real) qk__k_pq_sv<false><<<grid, 256, 0, st>>>(S + g0 * R, q, F + g0 * 3 * q);
        else qk__k_pq_sv<true><<<grid, 256, 0, st>>>(S + g0 * R, q, F + g0 * 3 * q);
        QK_LAUNCH_CK("qk__k_pq_sv");
    }
    return QK_OK;
}

/* qk__k_pq_mps: nblk blocks of QK__PQ_TPB threads, smem bytes of dynamic shared memory where
   in_smem (the attribute set by the caller) */
static qk_result qk__launch_pq_mps(const double *lanes, int64_t n, int q, const int *Dd, const int *ord, const int64_t *off, int64_t group,
                                   int nj, const int64_t *loff, int dmax, double *scratch, int64_t per_block, int in_smem, size_t smem,
                                   int nblk, double *F, cudaStream_t st, qk__err *E)
{
    qk__k_pq_mps<<<(unsigned)nblk, QK__PQ_TPB, in_smem ? smem : 0, st>>>(lanes, n, q, Dd, ord, off, group, nj, loff, dmax, scratch, per_block,
                                                                         in_smem, F);
    QK_LAUNCH_CK("qk__k_pq_mps");
    return QK_OK;
}

/* qk__k_pq_rbf: 64 x 64 pairs a block of 256 threads over rows [r0, r0 + rows) and ncols columns */
static qk_result qk__launch_pq_rbf(bool f32, const double *Fa, const double *Fb, int64_t r0, int64_t rows, int64_t ncols, int nf, double coef,
                                   void *K, int64_t ldk, int sym, cudaStream_t st, qk__err *E)
{
    const int64_t gy = (rows + QK__PQ_BM - 1) / QK__PQ_BM, gx = (ncols + QK__PQ_BM - 1) / QK__PQ_BM;
    for (int64_t y0 = 0; y0 < gy; y0 += 65535) {   /* grid.y within 65535 */
        const dim3 grid((unsigned)gx, (unsigned)std::min<int64_t>(65535, gy - y0));
        const int64_t rr0 = r0 + y0 * QK__PQ_BM, rrows = std::min<int64_t>(rows - y0 * QK__PQ_BM, (int64_t)65535 * QK__PQ_BM);
        /* K's row rr0 sits at (rr0 - r0) rows into the slab (sym: r0 = 0, rows from 0) */
        if (f32) {
            float *Kp = (float *)K + (sym ? 0 : (rr0 - r0) * ldk);
            qk__k_pq_rbf<float><<<grid, 256, 0, st>>>(Fa, Fb, rr0, rrows, ncols, nf, coef, Kp, ldk, sym);
        } else {
            double *Kp = (double *)K + (sym ? 0 : (rr0 - r0) * ldk);
            qk__k_pq_rbf<double><<<grid, 256, 0, st>>>(Fa, Fb, rr0, rrows, ncols, nf, coef, Kp, ldk, sym);
        }
        QK_LAUNCH_CK("qk__k_pq_rbf");
    }
    return QK_OK;
}

struct qk__pq_bufs {
    double *dx = nullptr, *S = nullptr, *F = nullptr, *lanes = nullptr, *scr = nullptr;
    void *K = nullptr;
    int *Dd = nullptr, *ord = nullptr;
    int64_t *off = nullptr, *loff = nullptr;
    qk__build_ws ws;
    qk__dprog dp;
    cudaStream_t st = nullptr;
    qk_cuda_pool *lent = nullptr;
    bool own_st = false;
};

static void qk__pq_free(qk__pq_bufs &b)
{
    if (b.st) cudaStreamSynchronize(b.st);
    cudaFree(b.dx); cudaFree(b.S); cudaFree(b.F); cudaFree(b.lanes); cudaFree(b.scr); cudaFree(b.K);
    cudaFree(b.Dd); cudaFree(b.ord); cudaFree(b.off); cudaFree(b.loff);
    cudaFree(b.ws.params); cudaFree(b.ws.tmp); cudaFree(b.ws.inv);
    qk__dprog_free(&b.dp);
    if (b.own_st && b.st) cudaStreamDestroy(b.st);
    qk__pool_return(b.lent);
    cudaGetLastError();
    b = qk__pq_bufs();
}

template <typename V>
static qk_result qk__pq_upload(const V *h, size_t n, V **d, cudaStream_t st, qk__err *E)
{
    QK_CK(cudaMalloc((void **)d, std::max<size_t>(1, n * sizeof(V))));
    QK_CK(cudaMemcpyAsync(*d, h, n * sizeof(V), cudaMemcpyHostToDevice, st));
    return QK_OK;
}

static qk_result qk__pq_run(const qk_map *map, const qk_gram_desc *d, double gamma, const qk_cuda_pq *src, qk_cuda_pool *pool, qk__pq_bufs &b,
                            qk__err *E)
{
    const int q = map->n_qubits, nf = 3 * q, nfeat = map->n_features;
    const int64_t nx = d->n_x, ny = d->y ? d->n_y : 0, cols = d->y ? d->n_y : d->n_x, ntot = nx + ny;
    const int64_t ld = d->ld_out ? d->ld_out : cols;
    const bool f32 = d->out_dtype == QK_F32;
    const size_t es = f32 ? 4 : 8;
    const int path = src->fx ? 0 : src->mps ? 2 : 1; /* 0 host features, 1 statevector, 2 MPS */
    char msg[320];
    size_t fr = 0, tot = 0;
    QK_CK(cudaMemGetInfo(&fr, &tot));
    const double avail = 0.9 * (double)fr;
    /* the features of both sides (resident), then K (all of it where it fits a third of what is
       left, else slabs of rows), then the path's work space in the rest */
    const double fbytes = 8.0 * (double)ntot * nf;
    if (fbytes + (double)cols * es > avail) {
        snprintf(msg, sizeof msg, "qk_gram_projected: the reduced density matrices of %lld samples x %d qubits need %.3g GB of device memory, "
                 "%.3g GB are free", (long long)ntot, q, fbytes * 1e-9, (double)fr * 1e-9);
        return qk__fail_msg(E, QK_ERROR_DEVICE_OUT_OF_MEMORY, msg);
    }
    const double kall = (double)nx * cols * es;
    int64_t slab = nx;
    if (kall > (avail - fbytes) / 3) slab = std::max<int64_t>(1, (int64_t)((avail - fbytes) / 3 / ((double)cols * es)));
    const bool sym = !d->y && slab == nx;
    const double kbytes = (double)slab * cols * es;
    const double wbudget = avail - fbytes - kbytes;
    /* the path's work space: a chunk of samples */
    qk__prog pg;
    int64_t chunk = 0, D = (int64_t)1 << (path == 1 ? q : 0);
    const int64_t R = path == 1 ? (src->real ? D : 2 * D) : 0;
    int dmax = 1, nblk = 0, in_smem = 0;
    size_t smem = 0;
    int64_t per_block = 0;
    std::vector<int64_t> loff;
    if (path == 1) {
        QK_TRY(qk__compile(map, &pg, E));
        const double per = 8.0 * R + 8.0 * pg.P + (pg.passes.size() > 1 ? 16.0 * D : 0.0) + 8.0;
        const double xbytes = 8.0 * (double)ntot * nfeat;
        chunk = (int64_t)std::min<double>((double)std::max(nx, ny), std::floor((wbudget - xbytes) / per));
        if (chunk < 1) {
            snprintf(msg, sizeof msg, "qk_gram_projected: a %d-qubit state needs %.3g GB of device memory beside the features and K "
                     "(%.3g GB), %.3g GB are free", q, (per + xbytes) * 1e-9, (fbytes + kbytes) * 1e-9, (double)fr * 1e-9);
            return qk__fail_msg(E, QK_ERROR_DEVICE_OUT_OF_MEMORY, msg);
        }
    } else if (path == 2) {
        const int ns = src->n_sites;
        loff.resize((size_t)ns + 1);
        int64_t lt = 0;
        for (int s = 0; s <= ns; ++s) {
            dmax = std::max(dmax, src->D[s]);
            loff[(size_t)s] = lt;
            lt += 2 * (int64_t)src->D[s] * src->D[s];
        }
        const int64_t wk = 16 * (int64_t)dmax * dmax + 8 * (int64_t)dmax;
        int optin = 0, dev = -1, sms = 1;
        QK_CK(cudaGetDevice(&dev));
        QK_CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        smem = (size_t)wk * sizeof(double);
        in_smem = smem + 1024 <= (size_t)optin;
        per_block = lt + (in_smem ? 0 : wk);
        chunk = std::min<int64_t>(src->chunk, std::max(nx, ny));
        const double lanes_b = 8.0 * (double)((chunk + src->nj - 1) / src->nj) * src->group;
        const int want = (int)std::min<int64_t>(chunk, (int64_t)sms * 8);
        nblk = (int)std::min<double>(want, std::floor((wbudget - lanes_b) / (8.0 * per_block)));
        if (nblk < 1) {
            snprintf(msg, sizeof msg, "qk_gram_projected: the MPS of %lld samples and the environments of %d sites (bond %d) need %.3g GB of "
                     "device memory beside the features and K (%.3g GB), %.3g GB are free", (long long)chunk, ns, dmax,
                     (lanes_b + 8.0 * per_block) * 1e-9, (fbytes + kbytes) * 1e-9, (double)fr * 1e-9);
            return qk__fail_msg(E, QK_ERROR_DEVICE_OUT_OF_MEMORY, msg);
        }
    }
    /* streams */
    if ((b.lent = qk__pool_borrow(pool))) b.st = pool->st[0];
    else {
        b.own_st = true;
        QK_CK(cudaStreamCreateWithFlags(&b.st, cudaStreamNonBlocking));
    }
    /* every device buffer, before the first host write */
    QK_CK(cudaMalloc((void **)&b.F, std::max<size_t>(1, (size_t)fbytes)));
    QK_CK(cudaMalloc(&b.K, (size_t)kbytes));
    double *Fx = b.F, *Fy = d->y ? b.F + nx * nf : b.F;
    if (path == 0) {
        QK_CK(cudaMemcpyAsync(Fx, src->fx, (size_t)nx * nf * 8, cudaMemcpyHostToDevice, b.st));
        if (d->y) QK_CK(cudaMemcpyAsync(Fy, src->fy, (size_t)ny * nf * 8, cudaMemcpyHostToDevice, b.st));
    } else if (path == 1) {
        QK_TRY(qk__dprog_make(pg, map, &b.dp, E));
        /* both sides in one buffer: x's rows, then y's */
        QK_CK(cudaMalloc((void **)&b.dx, std::max<size_t>(1, (size_t)ntot * nfeat * 8)));
        QK_CK(cudaMemcpyAsync(b.dx, d->x, (size_t)nx * nfeat * 8, cudaMemcpyHostToDevice, b.st));
        if (d->y) QK_CK(cudaMemcpyAsync(b.dx + nx * nfeat, d->y, (size_t)ny * nfeat * 8, cudaMemcpyHostToDevice, b.st));
        const double *dy = b.dx + nx * nfeat;
        QK_CK(cudaMalloc(&b.ws.params, std::max<size_t>(1, (size_t)chunk * pg.P * sizeof(double))));
        if (pg.passes.size() > 1) QK_CK(cudaMalloc(&b.ws.tmp, (size_t)chunk * D * 16));
        if (pg.has_amp) QK_CK(cudaMalloc((void **)&b.ws.inv, (size_t)chunk * sizeof(double)));
        QK_CK(cudaMalloc((void **)&b.S, (size_t)chunk * R * 8));
        for (int side = 0; side < (d->y ? 2 : 1); ++side) {
            const int64_t n = side ? ny : nx;
            const double *xs = side ? dy : b.dx;
            double *F = side ? Fy : Fx;
            for (int64_t r0 = 0; r0 < n; r0 += chunk) {
                const int64_t c = std::min(chunk, n - r0);
                QK_TRY(qk__build_states<double>(pg, b.dp, xs + r0 * nfeat, c, b.ws, b.S, src->real != 0, b.st, E));
                QK_TRY(qk__launch_pq_sv(src->real != 0, b.S, c, q, F + r0 * nf, b.st, E));
            }
        }
    } else {
        const int ns = src->n_sites;
        QK_TRY(qk__pq_upload(src->D, (size_t)ns + 1, &b.Dd, b.st, E));
        QK_TRY(qk__pq_upload(src->order, (size_t)ns, &b.ord, b.st, E));
        QK_TRY(qk__pq_upload(src->off, (size_t)ns + 1, &b.off, b.st, E));
        QK_TRY(qk__pq_upload(loff.data(), loff.size(), &b.loff, b.st, E));
        const size_t lanes_b = (size_t)8 * (size_t)((chunk + src->nj - 1) / src->nj) * (size_t)src->group;
        QK_CK(cudaMalloc((void **)&b.lanes, lanes_b));
        QK_CK(cudaMalloc((void **)&b.scr, (size_t)nblk * (size_t)per_block * 8));
        if (in_smem) QK_CK(cudaFuncSetAttribute(qk__k_pq_mps, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        for (int side = 0; side < (d->y ? 2 : 1); ++side) {
            const int64_t n = side ? ny : nx;
            double *F = side ? Fy : Fx;
            for (int64_t r0 = 0; r0 < n; r0 += chunk) {
                const int64_t c = std::min(chunk, n - r0);
                const double *h = nullptr;
                /* the host builds this chunk while the device sweeps the last one */
                const qk_result r = src->build(side, r0, r0 + c, &h, src->user);
                if (r != QK_OK) {
                    if (E->buf && E->size) E->buf[0] = 0;   /* the provider's message stands */
                    return r;
                }
                /* pageable: the copy waits for the last sweep (which reads the buffer), returns
                   once h is staged */
                QK_CK(cudaMemcpyAsync(b.lanes, h, (size_t)8 * (size_t)((c + src->nj - 1) / src->nj) * (size_t)src->group,
                                      cudaMemcpyHostToDevice, b.st));
                QK_TRY(qk__launch_pq_mps(b.lanes, c, ns, b.Dd, b.ord, b.off, src->group, src->nj, b.loff, dmax, b.scr, per_block, in_smem, smem,
                                         (int)std::min<int64_t>(nblk, c), F + r0 * nf, b.st, E));
            }
        }
    }
    /* K, slab by slab, into the caller's buffer */
    const double coef = -2.0 * gamma;
    for (int64_t r0 = 0; r0 < nx; r0 += slab) {
        const int64_t rows = std::min(slab, nx - r0);
        QK_TRY(qk__launch_pq_rbf(f32, Fx, Fy, r0, rows, cols, nf, coef, b.K, cols, sym ? 1 : 0, b.st, E));
        QK_CK(cudaMemcpy2DAsync((char *)d->out + (size_t)r0 * ld * es, (size_t)ld * es, b.K, (size_t)cols * es, (size_t)cols * es, (size_t)rows,
                                cudaMemcpyDeviceToHost, b.st));
        QK_CK(cudaStreamSynchronize(b.st));
    }
    return QK_OK;
}

extern "C" qk_result qk_cuda_gram_projected(const qk_map *map, const qk_gram_desc *desc, double gamma, const qk_cuda_pq *src,
                                            qk_cuda_pool *pool, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!map || !desc || !desc->x || !desc->out || !src || (src->fx && desc->y && !src->fy) || (src->mps && !src->build))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram_projected: NULL argument");
    if (!src->fx && !src->mps && map->n_qubits > QK_MAX_STATE_QUBITS)
        return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_gram_projected: too many qubits for the statevector path");
    if (src->mps && (src->n_sites != map->n_qubits || src->nj < 1 || src->chunk < 1))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram_projected: the MPS description does not fit the map");
    qk__pq_bufs b;
    qk_result r;
    try {
        r = qk__pq_run(map, desc, gamma, src, pool, b, E);
    } catch (const std::bad_alloc &) {
        r = qk__fail_msg(E, QK_ERROR_OUT_OF_MEMORY, "qk_cuda_gram_projected: out of host memory");
    }
    qk__pq_free(b);
    return r;
}
