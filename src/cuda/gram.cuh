/* ======================================================================================== */
/* >>gram ---- the fused SIMT Gram kernel, its tile configurations ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"
#include "states.cuh"

/* One k-step of a fused Gram operand into shared memory: R states from row r0 (of rows) and BK
   amplitudes from k0, element (row, k) read with k fastest (a row's BK amplitudes are
   contiguous), stored k-major as S[(k * R + row) * W (+1 for Im)]; zeros past the ends. */
template <typename T, bool CPLX, int R, int BK, int NT>
__device__ __forceinline__ void qk__gram_stage(const T *__restrict__ X, int rows, int r0, int k0, int D, T *S)
{
    const int W = CPLX ? 2 : 1;
    for (int e = threadIdx.x; e < R * BK; e += NT) {
        int r = e / BK, k = e % BK;
        int gr = r0 + r, gk = k0 + k;
        T vr = 0, vi = 0;
        if (gr < rows && gk < D) {
            if (CPLX) { typename qk__vec2<T>::t v = ((const typename qk__vec2<T>::t *)X)[(int64_t)gr * D + gk]; vr = v.x; vi = v.y; }
            else vr = X[(int64_t)gr * D + gk];
        }
        S[(k * R + r) * W] = vr;
        if (CPLX) S[(k * R + r) * W + 1] = vi;
    }
}

/* Fused Gram tile: acc[i][j] = <a_i|b_j> over D amplitudes in registers, then |.|^2 (complex)
   or .^2 (real), staged and stored. A: m states, B: nn states, row-major with stride D. */
template <typename T, bool CPLX, typename OutT, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
qk__k_gram(const T *__restrict__ A, const T *__restrict__ B, int m, int nn, int D,
           OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid)
{
    const int NT = (BM / TM) * (BN / TN);
    const int W = CPLX ? 2 : 1; /* T values per amplitude */
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return; /* whole tile below the diagonal */
    extern __shared__ __align__(16) unsigned char qk__smem[];
    T *As = (T *)qk__smem;               /* [BK][BM][W] */
    T *Bs = As + BK * BM * W;            /* [BK][BN][W] */
    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    T accr[TM][TN], acci[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) { accr[i][j] = 0; acci[i][j] = 0; }

    for (int k0 = 0; k0 < D; k0 += BK) {
        /* load: element e = (row, k) with k fastest: a row's BK amplitudes are contiguous */
        qk__gram_stage<T, CPLX, BM, BK, NT>(A, m, row0, k0, D, As);
        qk__gram_stage<T, CPLX, BN, BK, NT>(B, nn, col0, k0, D, Bs);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            T ar[TM], ai[TM], br[TN], bi[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                ar[i] = As[(k * BM + ty * TM + i) * W];
                ai[i] = CPLX ? As[(k * BM + ty * TM + i) * W + 1] : (T)0;
            }
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                br[j] = Bs[(k * BN + tx * TN + j) * W];
                bi[j] = CPLX ? Bs[(k * BN + tx * TN + j) * W + 1] : (T)0;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    accr[i][j] = fma(ar[i], br[j], accr[i][j]);
                    if (CPLX) {
                        accr[i][j] = fma(ai[i], bi[j], accr[i][j]);
                        acci[i][j] = fma(ar[i], bi[j], acci[i][j]);
                        acci[i][j] = fma(-ai[i], br[j], acci[i][j]);
                    }
                }
        }
        __syncthreads();
    }
    OutT *Cs = (OutT *)qk__smem; /* [BM][BN + 1], reuses the operand buffers */
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            T v = CPLX ? accr[i][j] * accr[i][j] + acci[i][j] * acci[i][j] : accr[i][j] * accr[i][j];
            Cs[(ty * TM + i) * (BN + 1) + tx * TN + j] = (OutT)v;
        }
    __syncthreads();
    qk__store_tile<OutT, BM, BN, NT>(Cs, row0, col0, m, nn, out, ld, mout, doff, tri, vec);
}

/* Tile shapes of the fused kernel, 256 threads each.
   complex fp32: 128 x 64 tile, 8 x 4 complex per thread (64 accumulators, ~120 registers:
   2 blocks / SM); real fp32: 128 x 128, 8 x 8; fp64: 64 x 64, 4 x 4 (accumulators twice the
   size). Small states (2^q <= 32) are write-bound (4 bytes of K per 8*2^q flops), so they get
   64 x 64 tiles with 4 x 4 per thread: fewer registers, more blocks in flight per SM to keep
   the stores streaming (zz 4 qubits, n = 32768, qk-bench). */
template <int BM_, int BN_, int BK_, int TM_, int TN_> struct qk__tiles {
    enum { BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_ };
};
template <typename T, bool CPLX, typename OutT, typename C>
static qk_result qk__launch_gram_cfg(const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                     OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    const int NT = (C::BM / C::TM) * (C::BN / C::TN);
    size_t op = (size_t)C::BK * (C::BM + C::BN) * (CPLX ? 2 : 1) * sizeof(T);
    size_t ep = (size_t)C::BM * (C::BN + 1) * sizeof(OutT);
    size_t smem = std::max(op, ep);
    auto kf = qk__k_gram<T, CPLX, OutT, C::BM, C::BN, C::BK, C::TM, C::TN>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t r0 = 0; r0 < m; r0 += (int64_t)65535 * C::BM) { /* grid.y limit */
        int64_t mm = std::min<int64_t>(m - r0, (int64_t)65535 * C::BM);
        dim3 grid((unsigned)((nn + C::BN - 1) / C::BN), (unsigned)((mm + C::BM - 1) / C::BM));
        const int tg = (tri && doff == 0 && r0 == 0 && mm == m && C::BM == C::BN && nn >= mm) ? qk__tri_grid(&grid) : 0;
        const T *Ar = (const T *)A + r0 * (int64_t)D * (CPLX ? 2 : 1);
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        kf<<<grid, NT, smem, st>>>(Ar, (const T *)B, (int)mm, (int)nn, D, o, ld, mo, doff - r0, tri, qk__vec_ok(o, mo, ld), tg);
        QK_LAUNCH_CK("qk__k_gram");
    }
    return QK_OK;
}

