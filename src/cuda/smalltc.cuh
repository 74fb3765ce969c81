#pragma once
#include "base.cuh"
#include "common.cuh"
#include "gram.cuh"
#include "small.cuh"
/* >>smalltc ---- its tensor-core form, fp16 hi/lo splits (fused configuration 8) ---- */
/* The persistent few-qubit kernel above is bound by the FP32 pipe's issue rate at 4 and more
   qubits (4 * 2^q FMAs a pair). Here the inner products run on the tensor cores (mma.sync
   m16n8k16, fp16 operands, fp32 accumulators) at fp32 accuracy: each amplitude, scaled by
   s = 2^floor(q/2) (as >>tcf's FP16, so that small amplitudes stay normal), is split into
   hi = fp16(s x) and lo = fp16(s x - hi), 22 significant bits, and a product is
   lo*hi + hi*lo + hi*hi (lo*lo, 2^-22 relative, is dropped); the accumulators are scaled back by
   1/s^2, exactly. The complex product takes no planes: one register holds the (re, im) of one
   amplitude as the two k slots of a lane, so one MMA gives Re <a|b> and, with B's halves turned
   to (im, -re), a second gives Im <a|b> (as in >>tcf). No conversion pass: the split happens on
   the fragment, from the fp32 states in shared memory. (A first version split into TF32 halves
   on m16n8k8: the same error, half the k per MMA, 0.8x to 0.75x the speed at 5 and 6 qubits.)

   Layout: 64 x 64 tiles of 4 warps (2 x 2 warps of 32 x 32 pairs), persistent over the tile
   list, with up to 4 blocks per SM (128 registers a thread) so that one block's MMAs run while
   another's stores issue (one 512-thread block of 128 x 128 tiles per SM ran its phases in lock
   step). Tiles in the triangle's order, as >>small (bands of 16 tile rows, column by column,
   for DRAM locality, ran at 0.95x). Both operands' rows (the whole inner dimension) reach
   shared memory by cp.async, double-buffered where two buffers fit in 80 KB (D <= 32): the next
   tile's rows load while this tile computes (D = 64: one buffer). Rows are S words apart, S = 8 or 24 mod 32, so
   the 8-byte fragment loads of a half-warp (rows g = 0..3, amplitudes t = 0..3) hit distinct
   banks. The epilogue takes |.|^2 in registers, stages a tile inside K and off the diagonal in
   the operand buffer just read, and writes it and its mirror as 16-byte pieces (tiles cut by
   the diagonal or K's edge store from the fragments, with guards). Accumulation: at most
   3 * D / 8 = 24 MMA steps into one set of fp32 accumulators (the truncating adds of >>tcf's
   note cost less than an fp32 ulp per step here; the suite and qk-bench measure the error
   against the CPU engine and fp64). Semantics of out / mout / doff / tri are those of qk__k_gram. */
#define QK__STC_BM 64   /* tile side: 4 warps, up to 4 blocks per SM whose phases (MMA, stores) interleave */

/* shared-memory row stride (words) of D amplitudes; buffers (2: double-buffered) and bytes of
   a BM-row tile's operands; threads of a block (4 warps at BM = 64) */
__host__ __device__ constexpr int qk__stc_stride(int D) { return 2 * D + ((2 * D) % 32 == 8 || (2 * D) % 32 == 24 ? 0 : 8); }
__host__ __device__ constexpr int qk__stc_stages(int D, int BM) { return 2 * 2 * BM * qk__stc_stride(D) * 4 <= 80 * 1024 ? 2 : 1; }
__host__ __device__ constexpr int qk__stc_buf(int D, int BM) /* words: the operands, or the staged tile (BM + 4 a row) */
{
    return 2 * BM * qk__stc_stride(D) > BM * (BM + 4) ? 2 * BM * qk__stc_stride(D) : BM * (BM + 4);
}
__host__ __device__ constexpr size_t qk__stc_smem(int D, int BM) { return (size_t)qk__stc_stages(D, BM) * qk__stc_buf(D, BM) * 4; }
__host__ __device__ constexpr int qk__stc_threads(int BM) { return (BM / 32) * (BM / 32) * 32; }

/* v * s -> (hi, lo) as half2 words: hi = fp16(v s), lo = fp16(v s - hi) */
__device__ __forceinline__ void qk__f16_split(float2 v, float s, uint32_t &hi, uint32_t &lo)
{
    const float x = v.x * s, y = v.y * s;
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    hi = *(const uint32_t *)&h;
    lo = *(const uint32_t *)&l;
}

/* a B amplitude (re, im) -> its hi and lo words (qk__f16_split) and their turns (im, -re), the
   operands of Im <a|b> */
__device__ __forceinline__ void qk__f16_split_b(float2 v, float s, uint32_t &hi, uint32_t &lo, uint32_t &rhi, uint32_t &rlo)
{
    qk__f16_split(v, s, hi, lo);
    rhi = __byte_perm(hi, 0, 0x1032) ^ 0x80000000u;
    rlo = __byte_perm(lo, 0, 0x1032) ^ 0x80000000u;
}
/* one 16 x 8 piece: (cr, ci) += (Re, Im) <a|b> from the split operands, lo*hi + hi*lo + hi*hi */
__device__ __forceinline__ void qk__mma_c3(float *cr, float *ci, const uint32_t *ah, const uint32_t *al, const uint32_t *bh,
                                           const uint32_t *bl, const uint32_t *rh, const uint32_t *rl)
{
    qk__mma_f16(cr, al, bh);
    qk__mma_f16(ci, al, rh);
    qk__mma_f16(cr, ah, bl);
    qk__mma_f16(ci, ah, rl);
    qk__mma_f16(cr, ah, bh);
    qk__mma_f16(ci, ah, rh);
}

template <int D, int BM>
__global__ void __launch_bounds__(qk__stc_threads(BM), 65536 / (qk__stc_threads(BM) * 128))
qk__k_gram_small_tc(const float2 *__restrict__ A, const float2 *__restrict__ B, int m, int nn, float *__restrict__ out,
                    int64_t ld, float *__restrict__ mout, int64_t doff, int tri, int vec, int tx_tiles, int tgrid, int64_t ntiles)
{
    constexpr int NT = qk__stc_threads(BM), WPR = BM / 32, S = qk__stc_stride(D), ST = qk__stc_stages(D, BM);
    constexpr int CH = D / 2, BUF = qk__stc_buf(D, BM), CS = BM + 4; /* 16-byte chunks a row, words a buffer, staged row */
    constexpr float sc = (float)(D >= 64 ? 8 : D >= 16 ? 4 : D >= 4 ? 2 : 1), isc2 = 1.0f / (sc * sc); /* 2^floor(q/2) */
    static_assert(D >= 4 && D <= 64, "the few-qubit tensor-core kernel: 2 to 6 qubits");
    extern __shared__ __align__(16) float qk__stc_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wr = (warp / WPR) * 32, wc = (warp % WPR) * 32;
    auto tile = [&](int64_t L, int &a, int &b) {
        if (tgrid > 0) qk__tri_tile(L, tgrid, a, b);
        else {
            a = (int)(L / tx_tiles);
            b = (int)(L % tx_tiles);
        }
    };
    /* the rows of tile (r0, c0) into buffer buf: A rows, then B rows (zero past m / nn) */
    auto issue = [&](int r0, int c0, int buf) {
        float *s = qk__stc_sm + buf * BUF;
        for (int e = threadIdx.x; e < 2 * BM * CH; e += NT) {
            const int op = e / (BM * CH), r = (e / CH) % BM, c = e % CH;
            const int gr = (op ? c0 : r0) + r, lim = op ? nn : m;
            const float2 *src = (op ? B : A) + (int64_t)(gr < lim ? gr : lim - 1) * D + 2 * c;
            qk__cp16(s + (op * BM + r) * S + 4 * c, src, gr < lim ? 16 : 0);
        }
        qk__cp_commit();
    };
    int64_t L = blockIdx.x;
    if (L >= ntiles) return;
    int a, b;
    if (ST == 2) {
        tile(L, a, b);
        issue(a * BM, b * BM, 0);
    }
    for (int buf = 0; L < ntiles; L += gridDim.x, buf ^= (ST - 1)) {
        if (ST == 2) {
            if (L + gridDim.x < ntiles) {
                tile(L + gridDim.x, a, b);
                issue(a * BM, b * BM, buf ^ 1);
            } else qk__cp_commit(); /* an empty group: wait_group 1 below then means this tile's */
            qk__cp_wait<1>();
        }
        tile(L, a, b);
        const int row0 = a * BM, col0 = b * BM;
        if (ST == 1) {
            issue(row0, col0, 0);
            qk__cp_wait<0>();
        }
        __syncthreads();
        if (!(tri && (int64_t)col0 + BM - 1 + doff < row0)) { /* block-uniform: a tile under the diagonal is skipped */
            const float *sa = qk__stc_sm + buf * BUF + wr * S, *sb = qk__stc_sm + buf * BUF + (BM + wc) * S;
            float cr[2][4][4] = {}, ci[2][4][4] = {};
            /* m16n8k16: k slots 2t, 2t + 1 (one register) = (re, im) of amplitude 8 ks + t, slots
               2t + 8, 2t + 9 = amplitude 8 ks + t + 4 (zero past D) */
#pragma unroll
            for (int ks = 0; ks < (D + 7) / 8; ++ks) {
                const int c0 = 8 * ks + t, c1 = c0 + 4;
                uint32_t ah[2][4], al[2][4];
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int r = 0; r < 4; ++r) { /* a0 (g, c0) a1 (g + 8, c0) a2 (g, c1) a3 (g + 8, c1) */
                        const int c = r < 2 ? c0 : c1;
                        const float2 u = c < D ? *(const float2 *)(sa + (16 * i + g + 8 * (r & 1)) * S + 2 * c) : make_float2(0.f, 0.f);
                        qk__f16_split(u, sc, ah[i][r], al[i][r]);
                    }
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    uint32_t bh[2], bl[2], rh[2], rl[2];
#pragma unroll
                    for (int r = 0; r < 2; ++r) { /* b0 (c0, g) b1 (c1, g) */
                        const int c = r ? c1 : c0;
                        const float2 v = c < D ? *(const float2 *)(sb + (8 * j + g) * S + 2 * c) : make_float2(0.f, 0.f);
                        qk__f16_split_b(v, sc, bh[r], bl[r], rh[r], rl[r]);
                    }
#pragma unroll
                    for (int i = 0; i < 2; ++i) qk__mma_c3(cr[i][j], ci[i][j], ah[i], al[i], bh, bl, rh, rl);
                }
            }
            /* a tile inside K and off the diagonal (block-uniform) is staged in this buffer
               (its operands are read) and written as 16-byte rows, its mirror as 16-byte column
               pieces, two lanes a 32-byte sector (as >>small); other tiles store from the
               fragments with guards */
            const bool full = vec && row0 + BM <= m && col0 + BM <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM);
            float *cs = qk__stc_sm + buf * BUF;
            if (full) __syncthreads();
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int li = wr + 16 * i + 8 * h + g, lj = wc + 8 * j + 2 * t, gi = row0 + li, gj = col0 + lj;
                        const float r0 = cr[i][j][2 * h] * isc2, i0 = ci[i][j][2 * h] * isc2;
                        const float r1 = cr[i][j][2 * h + 1] * isc2, i1 = ci[i][j][2 * h + 1] * isc2;
                        const float k0 = r0 * r0 + i0 * i0, k1 = r1 * r1 + i1 * i1;
                        if (full) {
                            *(float2 *)(cs + li * CS + lj) = make_float2(k0, k1);
                            continue;
                        }
                        float *o = out + (int64_t)gi * ld + gj;
                        const bool in0 = gi < m && gj < nn, in1 = gi < m && gj + 1 < nn;
                        const bool ok0 = in0 && (!tri || gj + doff >= gi), ok1 = in1 && (!tri || gj + 1 + doff >= gi);
                        if (vec && ok0 && ok1) __stcs((float2 *)o, make_float2(k0, k1));
                        else {
                            if (ok0) o[0] = k0;
                            if (ok1) o[1] = k1;
                        }
                        if (mout) {
                            if (in0 && (!tri || gj + doff > gi)) __stcs(mout + (int64_t)gj * ld + gi, k0);
                            if (in1 && (!tri || gj + 1 + doff > gi)) __stcs(mout + (int64_t)(gj + 1) * ld + gi, k1);
                        }
                    }
            if (full) {
                __syncthreads();
                for (int idx = threadIdx.x; idx < BM * BM / 4; idx += NT) {
                    const int r = idx / (BM / 4), c = (idx % (BM / 4)) * 4;
                    __stcs((float4 *)(out + (int64_t)(row0 + r) * ld + col0 + c), *(const float4 *)(cs + r * CS + c));
                }
                if (mout)
                    for (int idx = threadIdx.x; idx < BM * BM / 4; idx += NT) {
                        /* lanes 2p, 2p + 1: rows r, r + 4 of column c (CS = 4 mod 32: a warp's 16
                           columns and the two row offsets meet each bank once) */
                        const int p = idx >> 1, c = p % BM, r = (p / BM) * 8 + (idx & 1) * 4;
                        __stcs((float4 *)(mout + (int64_t)(col0 + c) * ld + row0 + r),
                               make_float4(cs[r * CS + c], cs[(r + 1) * CS + c], cs[(r + 2) * CS + c], cs[(r + 3) * CS + c]));
                    }
            }
        }
        __syncthreads(); /* this buffer is refilled by the issue two tiles on (one, single-buffered) */
    }
}

/* ---- the warp-pipelined form for 4 qubits (fused configuration 8 at D = 16) ---- */
/* At 4 qubits K(X,X) is bound by the write of K (every entry written once), and on GPUs with the
   fastest memory the block form above runs well under that write: its four warps meet at three
   barriers a tile and stage every tile in shared memory. Warps that never wait for each other but load their
   operands only when they need them wait on those loads instead (docs/benchmarks.md, "The
   4-qubit Gram in warp-private pipelines"). Here each warp runs its own pipeline. It has two private shared-memory stages
   (8 KB each: 32 A rows and 32 B rows of 128 bytes), and while it computes and stores one tile,
   cp.async fills the other with its next tile's rows. Warps synchronise only with themselves
   (__syncwarp); there is no block barrier.

   A block of 4 warps takes a 64 x 64 tile and each warp a 32 x 32 quarter of it. The tiles go in
   patches of QK__STW_PATCH x QK__STW_PATCH, row by row inside a patch, and the blocks take them in
   turn. Tiles wholly under the diagonal (tri), and those past K's edge, are skipped. The operands
   are split as in the block form (hi and lo in fp16, with the scale s) from the fragments read
   out of the stage.

   The rows and columns are permuted inside a quarter so that each lane ends with a 4 x 8 block of
   K:
   - m16 piece i, fragment row g + 8h, is row 4g + 2i + h;
   - n8 piece j, fragment column nu, is column 16 (j >> 1) + 4 (nu >> 1) + 2 (j & 1) + (nu & 1).
   Lane (g, t) then holds rows 4g .. 4g + 3 and columns 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3.
   A row store is a 16-byte piece: one warp instruction writes 8 rows x 64 contiguous bytes. A
   mirror store is the 4 rows of one column: 8 lanes write 128 contiguous bytes. Both are whole
   32-byte sectors, straight from the accumulators.

   In a stage, 16-byte chunk k of row r sits at chunk k ^ f(r), with f(r) = 2 ((r >> 2) & 3) for
   the A rows and 2 ((r & 1) | ((r >> 1) & 2)) for the B rows. Each half-warp's fragment reads then
   meet every bank once: four rows, each a 32-byte pair of chunks.

   Semantics of out / mout / doff / tri are those of qk__k_gram. */
#define QK__STW_WARPS 4  /* warps a block: a 64 x 64 tile in quarters; warps share no data */
#define QK__STW_PATCH 16 /* tiles a side of the patch order */
#define QK__STW_STAGE (64 * 32) /* words of a stage: 32 A and 32 B rows of 16 amplitudes */

__global__ void __launch_bounds__(32 * QK__STW_WARPS, 3)
qk__k_gram_stw(const float2 *__restrict__ A, const float2 *__restrict__ B, int m, int nn, float *__restrict__ out, int64_t ld,
               float *__restrict__ mout, int64_t doff, int tri, int vec)
{
    constexpr int D = 16;
    constexpr float sc = 4.0f, isc4 = 1.0f / (sc * sc * sc * sc); /* as qk__k_gram_small_tc at D = 16 */
    extern __shared__ __align__(16) float qk__stw_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float *const stage0 = qk__stw_sm + warp * 2 * QK__STW_STAGE;
    const int Tx = (nn + 63) / 64, Ty = (m + 63) / 64; /* the launcher keeps the patch grid's tiles under 2^31 */
    const int PX = (Tx + QK__STW_PATCH - 1) / QK__STW_PATCH, PY = (Ty + QK__STW_PATCH - 1) / QK__STW_PATCH;
    const int total = PX * PY * QK__STW_PATCH * QK__STW_PATCH;
    /* this warp's quarter of tile L: its first row and column, false where it has nothing to write */
    auto quarter = [&](int L, int &row0, int &col0) {
        const int pt = L / (QK__STW_PATCH * QK__STW_PATCH), in = L % (QK__STW_PATCH * QK__STW_PATCH);
        const int a = (pt / PX) * QK__STW_PATCH + in / QK__STW_PATCH, b = (pt % PX) * QK__STW_PATCH + in % QK__STW_PATCH;
        row0 = 64 * a + 32 * (warp >> 1);
        col0 = 64 * b + 32 * (warp & 1);
        return a < Ty && b < Tx && row0 < m && col0 < nn && !(tri && (int64_t)col0 + 31 + doff < row0);
    };
    /* the next tile from L on with work for this warp (total: none) */
    auto next = [&](int L, int &row0, int &col0) {
        while (L < total && !quarter(L, row0, col0)) L += gridDim.x;
        return L;
    };
    /* rows of a quarter into stage s: A rows row0 .. row0 + 31, then B rows col0 .. col0 + 31
       (zeros past m / nn), chunk k of stage row r at chunk k ^ f(r) */
    auto issue = [&](int row0, int col0, float *s) {
#pragma unroll
        for (int e = lane; e < 64 * 8; e += 32) {
            const int r = e >> 3, k = e & 7, isb = r >> 5, rr = r & 31;
            const int gr = (isb ? col0 : row0) + rr, lim = isb ? nn : m;
            const int f = isb ? 2 * ((rr & 1) | ((rr >> 1) & 2)) : 2 * ((rr >> 2) & 3);
            const float2 *src = (isb ? B : A) + (int64_t)(gr < lim ? gr : lim - 1) * D + 2 * k;
            qk__cp16(s + r * 32 + 4 * (k ^ f), src, gr < lim ? 16 : 0);
        }
    };
    int row0, col0, nrow0, ncol0;
    int L = next(blockIdx.x, row0, col0);
    if (L >= total) return;
    issue(row0, col0, stage0);
    qk__cp_commit();
    for (int buf = 0; L < total; buf ^= 1) {
        const int Ln = next(L + gridDim.x, nrow0, ncol0);
        if (Ln < total) issue(nrow0, ncol0, stage0 + (buf ^ 1) * QK__STW_STAGE);
        qk__cp_commit(); /* (empty past the last tile: wait_group 1 below then means this tile's) */
        qk__cp_wait<1>();
        __syncwarp();    /* every lane's chunks of this stage have landed */
        const float *sa = stage0 + buf * QK__STW_STAGE, *sb = sa + 32 * 32;
        float cr[2][4][4] = {}, ci[2][4][4] = {};
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            uint32_t ah[2][4], al[2][4]; /* A fragments: rows 4g + 2i + (r & 1), amplitudes 8 ks + t + 4 (r >> 1) */
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int rr = 4 * g + 2 * i + (r & 1), c = 8 * ks + t + 4 * (r >> 1);
                    const float2 u = *(const float2 *)(sa + rr * 32 + 4 * ((c >> 1) ^ (2 * ((rr >> 2) & 3))) + 2 * (c & 1));
                    qk__f16_split(u, sc, ah[i][r], al[i][r]);
                }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                /* B fragment of column nu = g: quarter column 16 (j >> 1) + 4 (g >> 1) + 2 (j & 1) + (g & 1) */
                const int rr = 16 * (j >> 1) + 4 * (g >> 1) + 2 * (j & 1) + (g & 1), f = 2 * ((rr & 1) | ((rr >> 1) & 2));
                uint32_t bh[2], bl[2], rh[2], rl[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int c = 8 * ks + t + 4 * r;
                    const float2 v = *(const float2 *)(sb + rr * 32 + 4 * ((c >> 1) ^ f) + 2 * (c & 1));
                    qk__f16_split_b(v, sc, bh[r], bl[r], rh[r], rl[r]);
                }
#pragma unroll
                for (int i = 0; i < 2; ++i) qk__mma_c3(cr[i][j], ci[i][j], ah[i], al[i], bh, bl, rh, rl);
            }
        }
        __syncwarp(); /* every lane has read this stage: the next tile but one may fill it */
        /* kv[x][v][y] = K[row0 + 4g + x][col0 + 16 v + 4t + y] */
        float kv[4][2][4];
#pragma unroll
        for (int x = 0; x < 4; ++x)
#pragma unroll
            for (int v = 0; v < 2; ++v)
#pragma unroll
                for (int y = 0; y < 4; ++y) {
                    const int i = x >> 1, j = 2 * v + (y >> 1), e = 2 * (x & 1) + (y & 1);
                    kv[x][v][y] = (cr[i][j][e] * cr[i][j][e] + ci[i][j][e] * ci[i][j][e]) * isc4;
                }
        const bool full = vec && row0 + 32 <= m && col0 + 32 <= nn && (!tri || (int64_t)col0 + doff >= row0 + 32);
        if (full) {
#pragma unroll
            for (int x = 0; x < 4; ++x)
#pragma unroll
                for (int v = 0; v < 2; ++v)
                    __stcs((float4 *)(out + (int64_t)(row0 + 4 * g + x) * ld + col0 + 16 * v + 4 * t),
                           make_float4(kv[x][v][0], kv[x][v][1], kv[x][v][2], kv[x][v][3]));
            if (mout)
#pragma unroll
                for (int v = 0; v < 2; ++v)
#pragma unroll
                    for (int y = 0; y < 4; ++y)
                        __stcs((float4 *)(mout + (int64_t)(col0 + 16 * v + 4 * t + y) * ld + row0 + 4 * g),
                               make_float4(kv[0][v][y], kv[1][v][y], kv[2][v][y], kv[3][v][y]));
        } else {
#pragma unroll
            for (int x = 0; x < 4; ++x)
#pragma unroll
                for (int v = 0; v < 2; ++v)
#pragma unroll
                    for (int y = 0; y < 4; ++y) {
                        const int gi = row0 + 4 * g + x, gj = col0 + 16 * v + 4 * t + y;
                        if (gi >= m || gj >= nn) continue;
                        if (!tri || gj + doff >= gi) out[(int64_t)gi * ld + gj] = kv[x][v][y];
                        if (mout && (!tri || gj + doff > gi)) mout[(int64_t)gj * ld + gi] = kv[x][v][y];
                    }
        }
        L = Ln;
        row0 = nrow0;
        col0 = ncol0;
    }
    qk__cp_wait<0>();
}

/* Under QK_TEST_FAULTS, qk_cuda_test_small_warp() counts qk__k_gram_stw's launches. */
#ifdef QK_TEST_FAULTS
static std::atomic<int> qk__stw_launches{0};
extern "C" int qk_cuda_test_small_warp(void) { return qk__stw_launches.load(); }
#endif
/* Where the warp-pipelined form runs by default: devices with 3 of its blocks resident per SM (12
   warps) and at least QK__STW_MIN_BW bytes/s of peak DRAM bandwidth (2 x memory clock x bus
   width); below that bandwidth the block form already runs close to the write of K and keeps the
   job (which devices pass, and the figures: docs/benchmarks.md, "The 4-qubit Gram in
   warp-private pipelines"). Cached per device.
   QK_STC_WARP=1 takes it wherever it launches, QK_STC_OLD=1 nowhere. */
#define QK__STW_MIN_BW 4.4e12
static bool qk__stw_device_ok()
{
    static std::atomic<int> cache[64];
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) { cudaGetLastError(); return false; }
    const int known = cache[dev].load(std::memory_order_acquire);
    if (known) return known == 2;
    int clk = 0, bus = 0, per = 0;
    const size_t smem = (size_t)QK__STW_WARPS * 2 * QK__STW_STAGE * sizeof(float);
    bool ok = cudaDeviceGetAttribute(&clk, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess &&
              2.0 * clk * 1e3 * (bus / 8.0) >= QK__STW_MIN_BW &&
              cudaFuncSetAttribute(qk__k_gram_stw, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess &&
              cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, qk__k_gram_stw, 32 * QK__STW_WARPS, smem) == cudaSuccess && per >= 3;
    cudaGetLastError();
    cache[dev].store(ok ? 2 : 1, std::memory_order_release);
    return ok;
}
#ifdef QK_TEST_FAULTS
extern "C" int qk_cuda_test_small_warp_default(void) { return qk__stw_device_ok() ? 1 : 0; }
#endif

/* qk__k_gram_stw over an m x nn block; QK_ERROR_UNSUPPORTED where its tile numbers would pass
   2^31 (the block form takes it) */
static qk_result qk__launch_stw(const float2 *A, const float2 *B, int64_t m, int64_t nn, float *out, int64_t ld, float *mout,
                                int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    const int64_t tiles = ((m + 63) / 64) * ((nn + 63) / 64); /* a bound on the blocks with work */
    if (tiles <= 0) return QK_OK;
    const int64_t P = 64 * QK__STW_PATCH, patched = ((m + P - 1) / P) * ((nn + P - 1) / P) * QK__STW_PATCH * QK__STW_PATCH;
    if (patched >= INT32_MAX) return QK_ERROR_UNSUPPORTED;
    const size_t smem = (size_t)QK__STW_WARPS * 2 * QK__STW_STAGE * sizeof(float);
    QK_CK(cudaFuncSetAttribute(qk__k_gram_stw, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int dev = 0, sms = 0, per = 0;
    QK_CK(cudaGetDevice(&dev));
    QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    QK_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, qk__k_gram_stw, 32 * QK__STW_WARPS, smem));
    if (per < 1) per = 1;
    const int64_t grid = std::min<int64_t>(tiles, (int64_t)sms * per);
#ifdef QK_TEST_FAULTS
    ++qk__stw_launches;
#endif
    qk__k_gram_stw<<<(unsigned)grid, 32 * QK__STW_WARPS, smem, st>>>(A, B, (int)m, (int)nn, out, ld, mout, doff, tri, qk__vec_ok(out, mout, ld));
    const cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess) return qk__cuda_fail(E, c, "launch of qk__k_gram_stw", __LINE__);
    return QK_OK;
}

template <int D, int BM>
static qk_result qk__launch_small_tc_d(const float2 *A, const float2 *B, int64_t m, int64_t nn, float *out, int64_t ld,
                                       float *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    return qk__launch_persistent(qk__k_gram_small_tc<D, BM>, qk__stc_threads(BM), qk__stc_smem(D, BM), BM, A, B, m, nn, out,
                                 ld, mout, doff, tri, st, "launch of qk__k_gram_small_tc", E);
}

/* The few-qubit tensor-core kernel for complex fp32 states with float K, 4 <= D <= 64 and
   16-byte aligned operands (cp.async); anything else is QK_ERROR_UNSUPPORTED (the caller falls
   back to the persistent SIMT kernel, then the tiled one). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_small_tc(const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                     OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    if (sizeof(T) != 4 || !CPLX || sizeof(OutT) != 4 || ((uintptr_t)A | (uintptr_t)B) % 16 != 0) return QK_ERROR_UNSUPPORTED;
    const float2 *a = (const float2 *)A, *b = (const float2 *)B;
    float *o = (float *)(void *)out, *mo = (float *)(void *)mout;
    if (D == 16 && !getenv("QK_STC_OLD") && (getenv("QK_STC_WARP") || qk__stw_device_ok())) { /* 4 qubits: the warp-pipelined form */
        const qk_result r = qk__launch_stw(a, b, m, nn, o, ld, mo, doff, tri, st, E);
        if (r != QK_ERROR_UNSUPPORTED) return r;
    }
    switch (D) {
    case 4: return qk__launch_small_tc_d<4, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 8: return qk__launch_small_tc_d<8, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 16: return qk__launch_small_tc_d<16, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 32: return qk__launch_small_tc_d<32, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 64: return qk__launch_small_tc_d<64, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    default: return QK_ERROR_UNSUPPORTED;
    }
}

/* Fused-kernel configurations by index (qk_plan.kernel_cfg 1..QK__N_FUSED_CFG, named by qk.h's
   qk__fused_cfg_name; 0: the fixed table, qk__fused_cfg_fixed, which the planner names too). The
   autotuner (qk_cuda_tune_gram) times these on the real shape. 7 is the persistent few-qubit
   kernel (>>small: complex fp32 states with float K and D <= 32; elsewhere it runs as 1); 8 its
   tensor-core form (>>smalltc: the same states with 4 <= D <= 64; elsewhere it runs as 7). Which
   one runs is qk.h's qk__fused_cfg_runs, the rule the planner writes into the plan; the launch
   fallbacks below remain only for operands that are not 16-byte aligned (never qk's own
   buffers: a state is a multiple of 32 bytes from D = 4 on). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_gram(int cfg, const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                 OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    {
        int q = 0;
        while ((1 << q) < D) ++q;
        cfg = qk__fused_cfg_runs(cfg, q, sizeof(T) == 8, CPLX, sizeof(OutT) == 4);
    }
    if (cfg == 8) {
        const qk_result r = qk__launch_small_tc<T, CPLX, OutT>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
        if (r != QK_ERROR_UNSUPPORTED) return r;
        cfg = 7;
    }
    if (cfg == 7) {
        if (sizeof(T) == 4 && CPLX && sizeof(OutT) == 4 && D <= 32) return qk__launch_small<T, CPLX, OutT>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
        cfg = 1;
    }
    switch (cfg) {
    case 2: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<128, 64, 8, 8, 4>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    case 4: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<128, 128, 8, 8, 8>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    default: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<64, 64, 8, 4, 4>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    }
}

