/* ======================================================================================== */
/* >>product ---- the analytic Gram of product maps ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"
#include "states.cuh"

/* Analytic Gram for product maps: K = prod_k |<u_k(a)|u_k(b)>|^2 over the q qubit 2-vectors. */
template <typename T, typename OutT, int BM, int BN, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
qk__k_gram_product(const T *__restrict__ UA, const T *__restrict__ UB, int m, int nn, int q,
                   OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid)
{
    const int NT = (BM / TM) * (BN / TN);
    const int BK = 8;
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return;
    extern __shared__ __align__(16) unsigned char qk__smem[];
    T *As = (T *)qk__smem;          /* [BK][BM][4] */
    T *Bs = As + BK * BM * 4;
    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 1;
    for (int k0 = 0; k0 < q; k0 += BK) {
        for (int e = threadIdx.x; e < BM * BK * 4; e += NT) {
            int r = e / (BK * 4), k = (e / 4) % BK, c = e % 4;
            int gr = row0 + r, gk = k0 + k;
            /* padding qubits are |0>: overlap 1, a neutral factor */
            T v = (gr < m && gk < q) ? UA[((int64_t)gr * q + gk) * 4 + c] : (T)(c == 0);
            As[(k * BM + r) * 4 + c] = v;
        }
        for (int e = threadIdx.x; e < BN * BK * 4; e += NT) {
            int r = e / (BK * 4), k = (e / 4) % BK, c = e % 4;
            int gr = col0 + r, gk = k0 + k;
            T v = (gr < nn && gk < q) ? UB[((int64_t)gr * q + gk) * 4 + c] : (T)(c == 0);
            Bs[(k * BN + r) * 4 + c] = v;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                const T *a = As + (k * BM + ty * TM + i) * 4;
                T a0r = a[QK__QV_RE0], a0i = a[QK__QV_IM0], a1r = a[QK__QV_RE1], a1i = a[QK__QV_IM1];
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const T *b = Bs + (k * BN + tx * TN + j) * 4;
                    T re = a0r * b[QK__QV_RE0] + a0i * b[QK__QV_IM0] + a1r * b[QK__QV_RE1] + a1i * b[QK__QV_IM1];
                    T im = a0r * b[QK__QV_IM0] - a0i * b[QK__QV_RE0] + a1r * b[QK__QV_IM1] - a1i * b[QK__QV_RE1];
                    acc[i][j] *= re * re + im * im;
                }
            }
        }
        __syncthreads();
    }
    OutT *Cs = (OutT *)qk__smem;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) Cs[(ty * TM + i) * (BN + 1) + tx * TN + j] = (OutT)acc[i][j];
    __syncthreads();
    qk__store_tile<OutT, BM, BN, NT>(Cs, row0, col0, m, nn, out, ld, mout, doff, tri, vec);
}

/* qk__k_gram_product: 64 x 64 tiles of 4 x 4 per thread, in bands of at most 65535 tile rows
   (grid.y); a diagonal block of K(X,X) gets the triangular grid. */
template <typename T, typename OutT>
static qk_result qk__launch_product(const T *UA, const T *UB, int64_t m, int64_t nn, int q, OutT *out, int64_t ld,
                                    OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    const int BM = 64, BN = 64, TM = 4, TN = 4, NT = 256;
    size_t op = (size_t)8 * (BM + BN) * 4 * sizeof(T);
    size_t ep = (size_t)BM * (BN + 1) * sizeof(OutT);
    size_t smem = std::max(op, ep);
    auto kf = qk__k_gram_product<T, OutT, BM, BN, TM, TN>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t r0 = 0; r0 < m; r0 += (int64_t)65535 * BM) {
        int64_t mm = std::min<int64_t>(m - r0, (int64_t)65535 * BM);
        dim3 grid((unsigned)((nn + BN - 1) / BN), (unsigned)((mm + BM - 1) / BM));
        const int tg = (tri && doff == 0 && r0 == 0 && mm == m && nn >= mm) ? qk__tri_grid(&grid) : 0;
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        kf<<<grid, NT, smem, st>>>(UA + r0 * q * 4, UB, (int)mm, (int)nn, q, o, ld, mo, doff - r0, tri, qk__vec_ok(o, mo, ld), tg);
        QK_LAUNCH_CK("qk__k_gram_product");
    }
    return QK_OK;
}

