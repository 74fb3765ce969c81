#pragma once
#include "base.cuh"
#include "common.cuh"
#include "states.cuh"
/* >>small ---- the persistent few-qubit Gram kernel (fused configuration 7) ---- */
/* K of states of D <= 32 complex64 amplitudes (q <= 5) is bound by the issue rate of the FP32
   pipe and by the 4 bytes a pair written, not by loads: one tile's operands are D * 128 * 8
   bytes. This kernel keeps one 512-thread block per SM alive over many tiles (persistent, grid-
   stride over the tile list, the triangle's tiles only for a symmetric block), holds the whole
   inner dimension in shared memory, prefetches the next tile's operands into registers while it
   computes this one, and writes each tile and its mirror as full 16-byte rows / 32-byte sectors
   from a staged copy. Thread (tx, ty) owns rows ty + 16 i and columns tx + 32 j (strided: B reads
   are consecutive per lane, A reads a broadcast). Faster than the 64 x 64 fused tile where K's write
   binds (bench/small_gram_probe.cu times the candidates against the write floor; docs/benchmarks.md,
   'Few-qubit Gram: the persistent kernel'). Semantics of out / mout /
   doff / tri are those of qk__k_gram. */
#define QK__SMALL_BM 128
#define QK__SMALL_TM 8
#define QK__SMALL_TN 4
#define QK__SMALL_NT ((QK__SMALL_BM / QK__SMALL_TM) * (QK__SMALL_BM / QK__SMALL_TN))
#define QK__SMALL_CS (QK__SMALL_BM + 4) /* staged tile row stride (floats): 16-byte rows, mirror reads conflict-free */

template <int D>
__global__ void __launch_bounds__(QK__SMALL_NT, 1)
qk__k_gram_small(const float2 *__restrict__ A, const float2 *__restrict__ B, int m, int nn, float *__restrict__ out,
                 int64_t ld, float *__restrict__ mout, int64_t doff, int tri, int vec, int tx_tiles, int tgrid, int64_t ntiles)
{
    constexpr int BM = QK__SMALL_BM, BN = QK__SMALL_BM, TM = QK__SMALL_TM, TN = QK__SMALL_TN, NT = QK__SMALL_NT;
    constexpr int TX = BN / TN, TY = BM / TM, CS = QK__SMALL_CS;
    constexpr int EA = (BM * D + NT - 1) / NT, EB = (BN * D + NT - 1) / NT;
    extern __shared__ __align__(16) unsigned char qk__smem[];
    float2 (*As)[BM + 1] = (float2 (*)[BM + 1])qk__smem;
    float2 (*Bs)[BN + 1] = (float2 (*)[BN + 1])(qk__smem + sizeof(float2) * D * (BM + 1));
    float (*Cs)[CS] = (float (*)[CS])(qk__smem + sizeof(float2) * D * (BM + 1 + BN + 1));
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    float2 ra[EA], rb[EB];
    auto tile = [&](int64_t L, int &r0, int &c0) {
        int a, b;
        if (tgrid > 0) qk__tri_tile(L, tgrid, a, b);
        else {
            a = (int)(L / tx_tiles);
            b = (int)(L % tx_tiles);
        }
        r0 = a * BM;
        c0 = b * BN;
    };
    auto fetch = [&](int64_t L) {
        int r0, c0;
        tile(L, r0, c0);
#pragma unroll
        for (int u = 0; u < EA; ++u) {
            const int e = threadIdx.x + u * NT, r = e / D, k = e % D;
            ra[u] = (e < BM * D && r0 + r < m) ? A[(int64_t)(r0 + r) * D + k] : make_float2(0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < EB; ++u) {
            const int e = threadIdx.x + u * NT, r = e / D, k = e % D;
            rb[u] = (e < BN * D && c0 + r < nn) ? B[(int64_t)(c0 + r) * D + k] : make_float2(0.f, 0.f);
        }
    };
    int64_t L = blockIdx.x;
    if (L >= ntiles) return;
    fetch(L);
    for (; L < ntiles; L += gridDim.x) {
        int row0, col0;
        tile(L, row0, col0);
#pragma unroll
        for (int u = 0; u < EA; ++u) {
            const int e = threadIdx.x + u * NT;
            if (e < BM * D) As[e % D][e / D] = ra[u];
        }
#pragma unroll
        for (int u = 0; u < EB; ++u) {
            const int e = threadIdx.x + u * NT;
            if (e < BN * D) Bs[e % D][e / D] = rb[u];
        }
        __syncthreads();
        const bool below = tri && (int64_t)col0 + BN - 1 + doff < row0; /* whole tile under the diagonal */
        if (L + gridDim.x < ntiles) fetch(L + gridDim.x);
        if (!below) {
            float cr[TM][TN], ci[TM][TN];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) { cr[i][j] = 0.f; ci[i][j] = 0.f; }
#pragma unroll
            for (int k = 0; k < D; ++k) {
                float2 av[TM], bv[TN];
#pragma unroll
                for (int i = 0; i < TM; ++i) av[i] = As[k][ty + TY * i];
#pragma unroll
                for (int j = 0; j < TN; ++j) bv[j] = Bs[k][tx + TX * j];
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) {
                        cr[i][j] = fmaf(av[i].x, bv[j].x, cr[i][j]);
                        cr[i][j] = fmaf(av[i].y, bv[j].y, cr[i][j]);
                        ci[i][j] = fmaf(av[i].x, bv[j].y, ci[i][j]);
                        ci[i][j] = fmaf(-av[i].y, bv[j].x, ci[i][j]);
                    }
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) Cs[ty + TY * i][tx + TX * j] = cr[i][j] * cr[i][j] + ci[i][j] * ci[i][j];
        }
        __syncthreads();
        if (below) continue; /* block-uniform */
        if (vec && row0 + BM <= m && col0 + BN <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM)) {
            for (int idx = threadIdx.x; idx < BM * BN / 4; idx += NT) {
                const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
                __stcs((float4 *)(out + (int64_t)(row0 + r) * ld + col0 + c), *(const float4 *)&Cs[r][c]);
            }
            if (mout) {
                /* lane pairs fill 32-byte sectors of the mirror: rows r and r + 4 of one column; a
                   warp's 16 columns and the pair's 4-row offset (4 * CS = 16 banks) meet each bank once */
                for (int idx = threadIdx.x; idx < BM * BN / 4; idx += NT) {
                    const int p = idx >> 1, c = p % BN, r = (p / BN) * 8 + (idx & 1) * 4;
                    __stcs((float4 *)(mout + (int64_t)(col0 + c) * ld + row0 + r),
                           make_float4(Cs[r][c], Cs[r + 1][c], Cs[r + 2][c], Cs[r + 3][c]));
                }
            }
        } else {
            for (int idx = threadIdx.x; idx < BM * BN; idx += NT) {
                const int r = idx / BN, c = idx % BN, gi = row0 + r, gj = col0 + c;
                if (gi < m && gj < nn && (!tri || gj + doff >= gi)) out[(int64_t)gi * ld + gj] = Cs[r][c];
            }
            if (mout) {
                for (int idx = threadIdx.x; idx < BM * BN; idx += NT) {
                    const int c = idx / BM, r = idx % BM, gi = row0 + r, gj = col0 + c;
                    if (gi < m && gj < nn && (!tri || gj + doff > gi)) mout[(int64_t)gj * ld + gi] = Cs[r][c];
                }
            }
        }
    }
}

/* The persistent-grid launch of the few-qubit kernels (this one and the tensor-core one,
   smalltc.cuh): kf's dynamic shared memory (smem bytes) opted in, as many blocks of nt threads
   as stay resident on every SM, at most one per BM x BM tile of the m x nn Gram (the triangle's
   tiles for a symmetric diagonal block, qk__tri_grid, or the rectangle's); each block loops over
   tiles. what: "launch of <kernel>" for the error message. */
template <typename K>
static qk_result qk__launch_persistent(K kf, int nt, size_t smem, int BM, const float2 *A, const float2 *B, int64_t m, int64_t nn,
                                       float *out, int64_t ld, float *mout, int64_t doff, int tri, cudaStream_t st,
                                       const char *what, qk__err *E)
{
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int dev = 0, sms = 0, per = 0;
    QK_CK(cudaGetDevice(&dev));
    QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    QK_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kf, nt, smem));
    if (per < 1) per = 1;
    const int64_t Tx = (nn + BM - 1) / BM;
    dim3 tiles((unsigned)Tx, (unsigned)((m + BM - 1) / BM));
    const int tg = (tri && doff == 0 && nn >= m) ? qk__tri_grid(&tiles) : 0;
    const int64_t ntiles = (int64_t)tiles.x * tiles.y;   /* the triangle's tiles, or the rectangle's */
    if (ntiles <= 0) return QK_OK;
    const int64_t grid = std::min<int64_t>(ntiles, (int64_t)sms * per);
    kf<<<(unsigned)grid, nt, smem, st>>>(A, B, (int)m, (int)nn, out, ld, mout, doff, tri, qk__vec_ok(out, mout, ld), (int)Tx, tg, ntiles);
    cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess) return qk__cuda_fail(E, c, what, __LINE__);
    return QK_OK;
}

template <int D>
static qk_result qk__launch_small_d(const float2 *A, const float2 *B, int64_t m, int64_t nn, float *out, int64_t ld,
                                    float *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    const int BM = QK__SMALL_BM;
    const size_t smem = sizeof(float2) * D * (2 * BM + 2) + sizeof(float) * BM * QK__SMALL_CS;
    return qk__launch_persistent(qk__k_gram_small<D>, QK__SMALL_NT, smem, BM, A, B, m, nn, out, ld, mout, doff, tri, st,
                                 "launch of qk__k_gram_small", E);
}

/* The few-qubit kernel for complex fp32 states with float K and D <= 32; anything else is
   QK_ERROR_UNSUPPORTED (qk__launch_gram falls back to the tiled kernel). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_small(const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                  OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    if (sizeof(T) != 4 || !CPLX || sizeof(OutT) != 4) return QK_ERROR_UNSUPPORTED;
    const float2 *a = (const float2 *)A, *b = (const float2 *)B;
    float *o = (float *)(void *)out, *mo = (float *)(void *)mout;
    switch (D) {
    case 2: return qk__launch_small_d<2>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 4: return qk__launch_small_d<4>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 8: return qk__launch_small_d<8>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 16: return qk__launch_small_d<16>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 32: return qk__launch_small_d<32>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    default: return QK_ERROR_UNSUPPORTED;
    }
}

