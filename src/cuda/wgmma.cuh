#pragma once
#include "base.cuh"
#include "common.cuh"
/* >>wgmma ---- the fused tensor-core Gram on Hopper's warpgroup MMA (sm_90a; configuration 4 of the TCF engines) ---- */
/* The same job as the mma.sync kernel of >>tcf (one kernel: <a|b> on the tensor cores, |.|^2 in
   the epilogue, K written once, the triangular tile grid of K(X,X) with its mirror), on wgmma:
   one instruction is a 64 x N x 16 product of a warpgroup (four warps), issued asynchronously
   and fed from shared memory, so the issue slots that mma.sync spends on fragment loads and
   shuffles are free and the tensor cores run from a deeper pipeline.

   Operands: the FP16 and FP32X3 words of >>tcf's conversion pass (qk__k_tcf_operand: one 32-bit
   word is one complex amplitude, (re, im) fp16 of s x; FP32X3 a row of hi words, then a row of
   lo words), rows a whole number of 32-word stages (128 bytes: one swizzle row).

   Shared memory: per stage the block's A rows and B rows, 128 bytes each, in the 128-byte
   swizzle wgmma reads (16-byte chunk c of row r at chunk c ^ (r % 8); 8-row groups 1024 bytes
   apart), filled with cp.async. B is read by the instruction through a matrix descriptor; A is
   loaded into registers with ldmatrix (the m16n8k16 A layout wgmma takes for A in registers),
   so that the Im product needs no second copy of A: Re <a|b> = A . B, and with each amplitude
   of A rotated in registers ((re, im) -> (im, -re): a swap of halves and a sign bit)
   A' . B = -Im <a|b>, whose square is the same. Real maps take the Re product only.

   Pipeline: NS stages in flight ahead of the one computed (cp.async groups); each stage
   waits for the warpgroup's previous products (wgmma.wait_group 0: ptxas serializes register-A
   products whose registers are written while earlier ones run, so each stage's A registers are
   written after its predecessor completed), then one barrier covers both the landed stage and
   the buffer the next load reuses.

   FP16: 128 x 128 tiles of K, two warpgroups of 64 rows, m64n128k16 (accumulators 64 + 64 per
   thread). FP32X3: 128 x 64 tiles, m64n64k16, the products lo*hi + hi*lo + hi*hi per k-step
   (small first), and after every stage (32 amplitudes) the stage's sums are added into a second
   set of accumulators with round-to-nearest fp32 adds (the tensor cores' accumulation truncates:
   >>tcf), so no tensor-core partial sum runs longer than one stage.

   Epilogue from the accumulators (thread holds rows g and g + 8 of its warp's 16, two adjacent
   columns per 8): the tile's entries as pair stores (where qk__vec_ok: ld and the bases keep
   them aligned; else scalars), 32 bytes per row and quad (float), and
   the mirror's as scalars, 8 consecutive rows per column: every 32-byte sector written whole.
   No shared-memory staging. Only for compute capability 9.0 and a build for sm_90a
   (-Dgpu_arch=90 builds it; qk__wgmma_ok says whether this device runs it); elsewhere the kernels
   are empty and the planner never names configuration 4. */
#define QK__WG_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
/* column tiles per work item of the persistent FP16 kernel (qk__k_wg16t), chosen by measurement
   (docs/benchmarks.md, 'Figures behind the code's constants') */
#define QK__WG_ITEM 8

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ int qk__wgmma_built = 1;
#else
__device__ int qk__wgmma_built = 0;
#endif
/* 1 when device `device` runs the wgmma kernels: compute capability 9.0 and this build holds
   their sm_90a code (the device image's qk__wgmma_built). Cached per device (atomics: the
   several-GPU workers ask at once; a race only repeats the query). */
static int qk__wgmma_ok(int device)
{
    static std::atomic<int> cache[64];   /* 0 unknown, 1 no, 2 yes */
    if (device < 0 || device >= 64) return 0;
    const int known = cache[device].load(std::memory_order_acquire);
    if (known) return known == 2;
    int cur = -1, ok = 0, flag = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&cur) == cudaSuccess && cudaGetDeviceProperties(&p, device) == cudaSuccess && p.major == 9 && p.minor == 0 &&
        cudaSetDevice(device) == cudaSuccess) {
        ok = cudaMemcpyFromSymbol(&flag, qk__wgmma_built, sizeof flag) == cudaSuccess && flag == 1;
        cudaSetDevice(cur);
    }
    cudaGetLastError();
    cache[device].store(ok ? 2 : 1, std::memory_order_release);
    return ok;
}

__device__ __forceinline__ uint32_t qk__smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void qk__cp16s(uint32_t dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qk__ldsm4(uint32_t addr, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
/* The warpgroup's ordering instructions: the asm on sm_90a, nothing in other builds (where the
   wgmma kernels are never launched). */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QK__SM90A_ASM(text) asm volatile(text ::: "memory")
#else
#define QK__SM90A_ASM(text) ((void)0)
#endif
__device__ __forceinline__ void qk__wg_fence() { QK__SM90A_ASM("wgmma.fence.sync.aligned;\n"); }
__device__ __forceinline__ void qk__wg_commit() { QK__SM90A_ASM("wgmma.commit_group.sync.aligned;\n"); }
__device__ __forceinline__ void qk__wg_wait0() { QK__SM90A_ASM("wgmma.wait_group.sync.aligned 0;\n"); }
__device__ __forceinline__ void qk__fence_async_smem() { QK__SM90A_ASM("fence.proxy.async.shared::cta;\n"); }
/* keeps the compiler from moving accumulator reads or writes across the asynchronous products */
template <int N> __device__ __forceinline__ void qk__wg_pin(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void qk__wg_zero(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = 0.0f;
}
/* The byte offset of 16-byte chunk c of row r in 128-byte-swizzled rows (the layout the
   descriptors name: the chunk index xor the row's low 3 bits). */
__device__ __forceinline__ uint32_t qk__sw128(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }
/* The dynamic shared memory's first 1024-byte boundary (the 128-byte swizzle's alignment). */
__device__ __forceinline__ uint32_t qk__wg_smem1024()
{
    extern __shared__ __align__(16) unsigned char qk__smem[];
    return (qk__smem_u32(qk__smem) + 1023u) & ~1023u;
}
/* f(r, cc) for the 16-byte chunks tid, tid + 256, ... (ITEMS of them) of rows of 8 chunks: the
   block's share of one stage's loads. */
template <int ITEMS, typename F> __device__ __forceinline__ void qk__wg_each_chunk(int tid, const F &f)
{
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int c = tid + i * 256;
        f(c >> 3, c & 7);
    }
}
/* The kernels' cp.async pipeline over stages 0 .. tot - 1 (P = NS - 1 in flight): prime issues
   the first P stages' loads; advance, before stage s is used, waits for its loads, makes them
   visible to the wgmma (async) proxy, waits for every warpgroup to be done with stage s - 1 and
   issues stage s + P's loads. load(s): one stage's loads (cp.async, into slot s % NS). */
template <int P, typename L> __device__ __forceinline__ void qk__wg_prime(const L &load, int tot)
{
#pragma unroll
    for (int s = 0; s < P; ++s) {
        if (s < tot) load(s);
        qk__cp_commit();
    }
}
template <int P, typename L> __device__ __forceinline__ void qk__wg_advance(const L &load, int s, int tot)
{
    qk__cp_wait<P - 1>();
    qk__fence_async_smem();
    __syncthreads();
    if (s + P < tot) load(s + P);
    qk__cp_commit();
}
/* shared-memory matrix descriptor: start address, leading byte offset 16 (unused by the
   swizzled K-major layout), 8-row groups 1024 bytes apart, 128-byte swizzle */
__device__ __forceinline__ uint64_t qk__wg_desc(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
/* (re, im) fp16 halves -> (im, -re) */
__device__ __forceinline__ uint32_t qk__rot16(uint32_t w) { return __byte_perm(w, 0, 0x1032) ^ 0x80000000u; }

/* d (m64 x N fp32 accumulators, the wgmma D layout) += A (registers: four f16x2, the mma.sync
   m16n8k16 A layout of the warp's 16 rows) x B (shared memory, descriptor bdesc, K-major): one
   definition for both shapes, NACC = N / 2 accumulators (32 or 64: QK__WG_D<NACC> their operands,
   QK__WG_OUT<NACC> their constraints), AB the operands of A and bdesc, PRED the scale-d
   predicate's. */
#define QK__WG_D32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
                   "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define QK__WG_D64 QK__WG_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
                   "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define QK__WG_OUT32 QK__WG_F4(0), QK__WG_F4(4), QK__WG_F4(8), QK__WG_F4(12), QK__WG_F4(16), QK__WG_F4(20), QK__WG_F4(24), QK__WG_F4(28)
#define QK__WG_OUT64 QK__WG_OUT32, QK__WG_F4(32), QK__WG_F4(36), QK__WG_F4(40), QK__WG_F4(44), QK__WG_F4(48), QK__WG_F4(52), \
                     QK__WG_F4(56), QK__WG_F4(60)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QK__WG_MMA_BODY(SHAPE, NACC, AB, PRED)                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32.f16.f16 {" QK__WG_D##NACC "}, " AB ", p, 1, 1, 0;\n}\n"     \
                 : QK__WG_OUT##NACC                                                                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "n"(1))
#else
#define QK__WG_MMA_BODY(SHAPE, NACC, AB, PRED) ((void)d, (void)a, (void)bdesc)
#endif
#define QK__WG_MMA_F16(NAME, SHAPE, NACC, AB, PRED)                                                                      \
    __device__ __forceinline__ void NAME(float(&d)[NACC], const uint32_t(&a)[4], uint64_t bdesc)                        \
    {                                                                                                                    \
        QK__WG_MMA_BODY(SHAPE, NACC, AB, PRED);                                                                          \
    }
QK__WG_MMA_F16(qk__wg_m64n128k16, "m64n128k16", 64, "{%64, %65, %66, %67}, %68", "%69")
QK__WG_MMA_F16(qk__wg_m64n64k16, "m64n64k16", 32, "{%32, %33, %34, %35}, %36", "%37")

/* The epilogue of a 64-row warpgroup slice, in two steps. qk__wg_put stores two adjacent entries
   (row gi, columns gj, gj + 1) of K and their mirror (>>common's qk__store_tile rules: tri writes
   direct where col + doff >= row and mirrors where col + doff > row; inner: the whole tile inside
   K, off the diagonal, rows aligned for pair stores). qk__wg_value is one entry's (re^2 + im^2)
   from the accumulators (element x of the thread's fragment: column group x / 4, row half
   (x / 2) % 2, column x % 2). */
template <typename OutT>
__device__ __forceinline__ void qk__wg_put(float v0, float v1, int gi, int gj, bool inner, int m, int nn, OutT *__restrict__ out, int64_t ld,
                                           OutT *__restrict__ mout, int64_t doff, int tri, int mc = INT_MAX)
{
    if (inner) {
        typedef typename qk__vec2<OutT>::t V2;
        V2 w;
        w.x = (OutT)v0;
        w.y = (OutT)v1;
        *(V2 *)(out + (int64_t)gi * ld + gj) = w;
        if (mout) {
            mout[(int64_t)gj * ld + gi] = (OutT)v0;
            mout[(int64_t)(gj + 1) * ld + gi] = (OutT)v1;
        }
        return;
    }
    const float v[2] = {v0, v1};
#pragma unroll
    for (int e = 0; e < 2; ++e)
        if (gi < m && gj + e < nn) {
            if (!tri || gj + e + doff >= gi) out[(int64_t)gi * ld + gj + e] = (OutT)v[e];
            if (mout && (!tri || gj + e + doff > gi) && gj + e < mc) mout[(int64_t)(gj + e) * ld + gi] = (OutT)v[e];
        }
}
template <bool CPLX, bool TOT>
__device__ __forceinline__ float qk__wg_value(const float *ar, const float *ai, const float *tr, const float *ti, float inv_s2, int x)
{
    const float re = (TOT ? tr[x] + ar[x] : ar[x]) * inv_s2, im = CPLX ? (TOT ? ti[x] + ai[x] : ai[x]) * inv_s2 : 0.0f;
    return re * re + im * im;
}
/* The whole slice at once (NJ: 8-column groups of the slice; rl, t: the thread's row and column
   pair in its warp's 16 rows). */
template <typename OutT, int NJ, bool CPLX, bool TOT>
__device__ __forceinline__ void qk__wg_store(const float *ar, const float *ai, const float *tr, const float *ti, float inv_s2, int row0,
                                             int col0, int rl, int t, bool inner, int m, int nn, OutT *__restrict__ out, int64_t ld,
                                             OutT *__restrict__ mout, int64_t doff, int tri, int mc = INT_MAX)
{
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int x = j * 4 + h * 2;
            qk__wg_put<OutT>(qk__wg_value<CPLX, TOT>(ar, ai, tr, ti, inv_s2, x), qk__wg_value<CPLX, TOT>(ar, ai, tr, ti, inv_s2, x + 1),
                             row0 + rl + h * 8, col0 + j * 8 + 2 * t, inner, m, nn, out, ld, mout, doff, tri, mc);
        }
}
/* Column groups [j0, j1) of a slice whose values were taken earlier (v: qk__wg_value of every
   element), tri with doff 0: the persistent kernel's deferred epilogue. */
template <typename OutT>
__device__ __forceinline__ void qk__wg_store_held(const float (&v)[64], int j0, int j1, int row0, int col0, int rl, int t, bool inner,
                                                  int m, int nn, OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout)
{
#pragma unroll
    for (int j = 0; j < 16; ++j)
        if (j >= j0 && j < j1)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                qk__wg_put<OutT>(v[j * 4 + h * 2], v[j * 4 + h * 2 + 1], row0 + rl + h * 8, col0 + j * 8 + 2 * t, inner, m, nn, out, ld, mout, 0, 1);
}

/* One FP16 stage of a warpgroup's products, committed as one group: its warps' A rows (arow: this
   lane's ldmatrix row, ahi: its 16-byte half) from the swizzled stage at As, rotated in
   registers for the Im product (complex), times the 128 B rows at Bs through descriptors. */
template <bool CPLX>
__device__ __forceinline__ void qk__wg16_stage(uint32_t As, uint32_t Bs, int arow, int ahi, float (&ar)[64], float (&ai)[CPLX ? 64 : 1])
{
    uint32_t fa[4][4], fr[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const int ch = 2 * kk + ahi;
        qk__ldsm4(As + qk__sw128(arow, ch), fa[kk]);
        if constexpr (CPLX) {
#pragma unroll
            for (int q = 0; q < 4; ++q) fr[kk][q] = qk__rot16(fa[kk][q]);
        }
    }
    qk__wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const uint64_t bd = qk__wg_desc(Bs + kk * 32);
        qk__wg_m64n128k16(ar, fa[kk], bd);
        if constexpr (CPLX) qk__wg_m64n128k16(ai, fr[kk], bd);
    }
    qk__wg_commit();
}

/* FP16: a 128 x 128 tile of K per block (two warpgroups), NS stages of 32 KB. A, B: operand
   words, ldw per row, nkt 32-word stages; the other arguments as qk__k_tcgram's. */
template <bool CPLX, typename OutT, int NS>
__global__ void __launch_bounds__(256, 1)
qk__k_wg16(const uint32_t *__restrict__ A, const uint32_t *__restrict__ B, int64_t ldw, int nkt, int m, int nn, float inv_s2,
           OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 128, BN = 128, TA = BM * 128, ST = TA + BN * 128, P = NS - 1;
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return;
    const uint32_t sbase = qk__wg_smem1024();
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    auto load = [&](int kt) {   /* A's 128 rows, then B's */
        const uint32_t st = sbase + (kt % NS) * ST;
        qk__wg_each_chunk<8>(tid, [&](int r, int cc) {
            const bool isb = r >= BM;
            const int lr = isb ? r - BM : r, grow = (isb ? col0 : row0) + lr;
            const bool ok = grow < (isb ? nn : m);
            const uint32_t *gp = (isb ? B : A) + (ok ? (int64_t)grow * ldw : 0) + (int64_t)kt * 32 + cc * 4;
            qk__cp16s(st + (isb ? TA : 0) + qk__sw128(lr, cc), gp, ok ? 16 : 0);
        });
    };
    float ar[64], ai[CPLX ? 64 : 1];
    qk__wg_zero(ar);
    qk__wg_zero(ai);
    qk__wg_prime<P>(load, nkt);
    const int arow = wg * 64 + warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), ahi = lane >> 4;
    for (int kt = 0; kt < nkt; ++kt) {
        qk__wg_wait0();
        qk__wg_advance<P>(load, kt, nkt);
        const uint32_t As = sbase + (kt % NS) * ST, Bs = As + TA;
        qk__wg16_stage<CPLX>(As, Bs, arow, ahi, ar, ai);
    }
    qk__wg_wait0();
    qk__wg_pin(ar);
    if constexpr (CPLX) qk__wg_pin(ai);
    const bool inner = vec && row0 + BM <= m && col0 + BN <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM);
    qk__wg_store<OutT, 16, CPLX, false>(ar, ai, nullptr, nullptr, inv_s2, row0, col0, wg * 64 + warp * 16 + (lane >> 2), lane & 3, inner, m, nn,
                                        out, ld, mout, doff, tri);
#endif
}

/* FP32X3: a 128 x 64 tile of K per block (two warpgroups), NS stages of 48 KB (A hi, A lo, B hi,
   B lo). lo_off: words from a row's hi part to its lo part. */
template <bool CPLX, typename OutT, int NS>
__global__ void __launch_bounds__(256, 1)
qk__k_wg3(const uint32_t *__restrict__ A, const uint32_t *__restrict__ B, int64_t ldw, int64_t lo_off, int nkt, int m, int nn,
          float inv_s2, OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 128, BN = 64, TA = BM * 128, TB = BN * 128, ST = 2 * TA + 2 * TB, P = NS - 1, NA = CPLX ? 32 : 1;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return;
    const uint32_t sbase = qk__wg_smem1024();
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    auto load = [&](int kt) {   /* A hi, A lo (128 rows each), B hi, B lo (64) */
        const uint32_t st = sbase + (kt % NS) * ST;
        qk__wg_each_chunk<12>(tid, [&](int r, int cc) {
            const bool isb = r >= 2 * BM;
            const int rr = isb ? r - 2 * BM : r, part = isb ? rr / BN : rr / BM, lr = isb ? rr % BN : rr % BM;
            const int grow = (isb ? col0 : row0) + lr;
            const bool ok = grow < (isb ? nn : m);
            const uint32_t *gp = (isb ? B : A) + (ok ? (int64_t)grow * ldw : 0) + part * lo_off + (int64_t)kt * 32 + cc * 4;
            qk__cp16s(st + (isb ? 2 * TA + part * TB : part * TA) + qk__sw128(lr, cc), gp, ok ? 16 : 0);
        });
    };
    float ar[32], ai[NA], tr[32], ti[NA];
    qk__wg_zero(ar);
    qk__wg_zero(tr);
    qk__wg_zero(ai);
    qk__wg_zero(ti);
    qk__wg_prime<P>(load, nkt);
    const int arow = wg * 64 + warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), ahi = lane >> 4;
    for (int kt = 0; kt < nkt; ++kt) {
        qk__wg_wait0();
        if (kt > 0) {   /* the last stage's sums into the round-to-nearest totals */
            qk__wg_pin(ar);
            if constexpr (CPLX) qk__wg_pin(ai);
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                tr[i] += ar[i];
                ar[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < NA; ++i) {
                ti[i] += ai[i];
                ai[i] = 0.0f;
            }
        }
        qk__wg_advance<P>(load, kt, nkt);
        const uint32_t As = sbase + (kt % NS) * ST, Bs = As + 2 * TA;
        uint32_t fh[4][4], fl[4][4], rh[4][4], rl[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const int ch = 2 * kk + ahi;
            const uint32_t off = qk__sw128(arow, ch);
            qk__ldsm4(As + off, fh[kk]);
            qk__ldsm4(As + TA + off, fl[kk]);
            if constexpr (CPLX) {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    rh[kk][q] = qk__rot16(fh[kk][q]);
                    rl[kk][q] = qk__rot16(fl[kk][q]);
                }
            }
        }
        qk__wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint64_t bh = qk__wg_desc(Bs + kk * 32), bl = qk__wg_desc(Bs + TB + kk * 32);
            qk__wg_m64n64k16(ar, fl[kk], bh);
            qk__wg_m64n64k16(ar, fh[kk], bl);
            qk__wg_m64n64k16(ar, fh[kk], bh);
            if constexpr (CPLX) {
                qk__wg_m64n64k16(ai, rl[kk], bh);
                qk__wg_m64n64k16(ai, rh[kk], bl);
                qk__wg_m64n64k16(ai, rh[kk], bh);
            }
        }
        qk__wg_commit();
    }
    qk__wg_wait0();
    qk__wg_pin(ar);
    if constexpr (CPLX) qk__wg_pin(ai);
    const bool inner = vec && row0 + BM <= m && col0 + BN <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM);
    qk__wg_store<OutT, 8, CPLX, true>(ar, ai, tr, ti, inv_s2, row0, col0, wg * 64 + warp * 16 + (lane >> 2), lane & 3, inner, m, nn, out, ld,
                                      mout, doff, tri);
#endif
}

/* FP16, persistent, for the triangle of K(X,X) with short states (nkt <= 8 stages: at most 256
   complex amplitudes, 8 qubits): a block takes work items, a panel of 128 rows p and up to C
   column tiles j >= p of it, keeps the panel's A rows (every stage) resident in shared memory and
   streams the B tiles through an NS-slot ring that runs ahead across the item's tiles, so the
   next tile's first stages load under the current tile's epilogue and the A rows are read once
   per item instead of once per tile. Tm x Tn: tiles of K's rows and columns (m, nn as
   qk__k_wg16's, tri and doff 0).
   Loads go through the tensor memory accelerator: one thread issues each stage's load as one
   128-row x 32-word box (cp.async.bulk.tensor, the 128-byte swizzle, which is qk__sw128's
   layout; rows past the last read as zeros) completing on the slot's "full" mbarrier, and each
   warpgroup, once its products on a slot are done, arrives on the slot's "empty" mbarrier, which
   the loading thread waits for before it refills the slot. No stage needs the whole block at a
   barrier; the block meets only when an item's panel is replaced. It replaced the same kernel fed
   by cp.async with a block barrier per stage, whose first stall the barriers were; K is bit for
   bit the same (docs/benchmarks.md, "The fp16 kernel fed by TMA"). mp: maps of A (m rows of ldw
   words) and B (nn rows). */
struct qk__wg_maps {
    CUtensorMap a, b;
};
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void qk__mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void qk__mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qk__mbar_arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
__device__ __forceinline__ void qk__mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nQK_MBAR_WAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra QK_MBAR_WAIT_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void qk__tma_load2d(uint32_t dst, const CUtensorMap *map, int x, int y, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(map), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}
#endif
template <bool CPLX, typename OutT, int NS>
__global__ void __launch_bounds__(256, 1)
qk__k_wg16t(const __grid_constant__ qk__wg_maps mp, int nkt, int m, int nn, float inv_s2, OutT *__restrict__ out, int64_t ld,
            OutT *__restrict__ mout, int vec, int C, int mc)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 128, TS = BM * 128, P = NS - 2;   /* loads run P stages ahead: a refill waits for the stage two back */
    const uint32_t sbase = qk__wg_smem1024(), ring = sbase + nkt * TS, bars = ring + NS * TS;
    const uint32_t afull = bars + 2 * NS * 8;   /* full[s] at bars + 8 s, empty[s] at bars + 8 (NS + s) */
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int arow = wg * 64 + warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), ahi = lane >> 4;
    const int Tm = (m + BM - 1) / BM, Tn = (nn + BM - 1) / BM;
    if (tid == 0) {
        for (int s = 0; s < NS; ++s) {
            qk__mbar_init(bars + 8 * s, 1);
            qk__mbar_init(bars + 8 * (NS + s), 2);   /* one arrival per warpgroup */
        }
        qk__mbar_init(afull, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   /* the inits, visible to the copy engine */
    }
    __syncthreads();
    float ar[64], ai[CPLX ? 64 : 1];
    qk__wg_zero(ar);
    qk__wg_zero(ai);
    uint32_t u_load = 0, u_use = 0, n_items = 0;   /* loads issued (thread 0), stages consumed, panels loaded */
    int64_t items = 0;
    for (int p = 0; p < Tm; ++p) items += (Tn - p + C - 1) / C;
    for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
        int p = 0;
        int64_t rem = it;
        while (rem >= (Tn - p + C - 1) / C) {
            rem -= (Tn - p + C - 1) / C;
            ++p;
        }
        const int j0 = p + (int)rem * C, nt = min(C, Tn - j0), row0 = p * BM, tot = nt * nkt;
        __syncthreads();   /* every warpgroup is done with the last item's panel */
        auto produce = [&](int gs) {   /* thread 0: stage gs's B box into its ring slot */
            const uint32_t slot = u_load % NS, full = bars + 8 * slot, empty = bars + 8 * (NS + slot);
            if (u_load >= (uint32_t)NS) qk__mbar_wait(empty, (u_load / NS - 1) & 1);
            qk__mbar_expect_tx(full, TS);
            qk__tma_load2d(ring + slot * TS, &mp.b, (gs % nkt) * 32, (j0 + gs / nkt) * BM, full);
            ++u_load;
        };
        if (tid == 0) {
            qk__fence_async_smem();   /* the panel's generic-proxy reads (ldmatrix) before the async-proxy writes */
            qk__mbar_expect_tx(afull, (uint32_t)(nkt * TS));
            for (int kt = 0; kt < nkt; ++kt) qk__tma_load2d(sbase + kt * TS, &mp.a, kt * 32, row0, afull);
            for (int gs = 0; gs < P && gs < tot; ++gs) produce(gs);
        }
        __syncwarp();   /* warp 0 converged again before the warpgroup's aligned instructions */
        qk__mbar_wait(afull, n_items & 1);
        ++n_items;
        for (int gs = 0; gs < tot; ++gs) {
            const int kt = gs % nkt;
            if (tid == 0 && gs + P < tot) produce(gs + P);
            __syncwarp();
            const uint32_t slot = u_use % NS;
            qk__mbar_wait(bars + 8 * slot, (u_use / NS) & 1);
            qk__wg16_stage<CPLX>(sbase + kt * TS, ring + slot * TS, arow, ahi, ar, ai);
            qk__wg_wait0();
            if ((tid & 127) == 0) qk__mbar_arrive(bars + 8 * (NS + slot));   /* this warpgroup is done with the slot */
            __syncwarp();
            ++u_use;
            if (kt == nkt - 1) {
                qk__wg_pin(ar);
                if constexpr (CPLX) qk__wg_pin(ai);
                const int col0 = (j0 + gs / nkt) * BM;
                /* mirror of columns < mc only (a band's rows: qk_cuda_io.band_rows); a tile across mc stores entry by entry */
                const bool inner = vec && row0 + BM <= m && col0 + BM <= nn && col0 >= row0 + BM && (col0 + BM <= mc || col0 >= mc);
                qk__wg_store<OutT, 16, CPLX, false>(ar, ai, nullptr, nullptr, inv_s2, row0, col0, wg * 64 + warp * 16 + (lane >> 2), lane & 3,
                                                    inner, m, nn, out, ld, col0 < mc ? mout : nullptr, 0, 1, mc);
                qk__wg_zero(ar);
                qk__wg_zero(ai);
            }
        }
    }
#endif
}

/* FP32X3, persistent and fed by the tensor memory accelerator (docs/benchmarks.md, 'fp32x3 through
   TMA, measured'), for
   the triangle of K(X,X) (tri) or a rectangle (K(X,Y), tri 0) with short states (1 <= nkt <= 8
   stages: from 2 qubits, the words past a state's end zeros). A work item is a panel of 64 rows (rows 64 p ..) and up to QK__WG_ITEM column tiles
   of 128, the first starting at column 64 p (the diagonal) in a triangle, at 0 in a rectangle
   (qk__wg3t_col0); a band's mirror stops at column mc (qk_cuda_io.band_rows); a tile's 128 columns are two 64 x 64 halves, one per warpgroup, each the
   m64n64k16 products of qk__k_wg3's warpgroups in the same order (per stage lo*hi + hi*lo + hi*hi
   per k-step, the stage's sums into the round-to-nearest totals), so every entry of K is
   qk__k_wg3's bit for bit; the block's tile is 64 x 128 instead of 128 x 64. Shared memory: the
   panel's A rows (hi and lo, every stage: nkt x 16 KB) stay resident for the item, and the tiles'
   B rows (hi and lo, 128 rows: 32 KB a stage) run through an NS-slot ring.

   Two consumer warpgroups and a producer warpgroup (setmaxnreg: 232 registers a consumer thread,
   40 a producer's; a ninth warp alone would cap every thread at 168). setmaxnreg.inc takes its
   registers from the CTA's pool, which holds only what the block was launched with (384 x 168)
   and what .dec released: the producer's 128 x (168 - 40) = 16384 are exactly the consumers'
   256 x (232 - 168). (240 / 32 asked for 18432 of 17408: the consumers waited forever.)
   Thread 256 issues every load, as tensor-map boxes: A 64 rows x 32 words, B 128 x 32, the 128-byte swizzle, which is qk__sw128's
   layout). Each load completes on an mbarrier: full[slot] for the ring, afull[k] for the panel's
   stage k. Each consumer warp, once its warpgroup's products on a stage are done
   (wgmma.wait_group 0), fences its ldmatrix reads against the async proxy and arrives on the
   slot's empty mbarrier (8 arrivals), and in an item's last tile also on pempty[k]. The producer
   refills a slot once all 8 warps released it, so the ring runs NS stages ahead across tiles and
   items, and loads the next item's panel stage k as soon as the current item's last tile is done
   with it (just before the ring load that waits for the same release). No stage, tile or item
   needs the block at a barrier; the two warpgroups may drift apart by up to the ring's depth
   (one's epilogue under the other's products). The producer waits only for releases, which the
   consumers give after loads it has already issued: no deadlock. mp: maps of A (m rows, 64-row
   boxes) and B (nn rows, 128-row boxes) over ldw words a row; ldp: words from a row's hi part to
   its lo part; items: the number of work items (qk__wg3t_items). */
#define QK__WG3T_BM 64
#define QK__WG3T_BN 128
/* the first column of panel p: its diagonal (64 p) in a triangle, 0 in a rectangle */
__host__ __device__ __forceinline__ int64_t qk__wg3t_col0(int64_t p, int tri) { return tri ? QK__WG3T_BM * p : 0; }
/* column tiles of panel p: from its first column to nn */
__host__ __device__ __forceinline__ int64_t qk__wg3t_tiles(int64_t p, int64_t nn, int tri)
{
    return (nn - qk__wg3t_col0(p, tri) + QK__WG3T_BN - 1) / QK__WG3T_BN;
}
static int64_t qk__wg3t_items(int64_t m, int64_t nn, int tri)
{
    int64_t items = 0;
    for (int64_t p = 0; p * QK__WG3T_BM < m; ++p) items += (qk__wg3t_tiles(p, nn, tri) + QK__WG_ITEM - 1) / QK__WG_ITEM;
    return items;
}
/* A walk over the work items in increasing order: item it's panel p, first tile j0 and tile
   count nt (base: the first item of panel p; tri: a triangle's panels, else a rectangle's). */
struct qk__wg3t_walk {
    int base, p, tri;
};
__device__ __forceinline__ void qk__wg3t_seek(qk__wg3t_walk &w, int it, int nn, int &j0, int &nt)
{
    for (;;) {
        const int tl = (int)qk__wg3t_tiles(w.p, nn, w.tri), k = (tl + QK__WG_ITEM - 1) / QK__WG_ITEM;
        if (it < w.base + k) {
            j0 = (it - w.base) * QK__WG_ITEM;
            nt = min(QK__WG_ITEM, tl - j0);
            return;
        }
        w.base += k;
        ++w.p;
    }
}
/* A position in the block's sequence of stages: item it (the block's ik-th), tile t of nt from
   j0, k-stage kt; next() steps to the following stage (it >= items: past the last). */
struct qk__wg3t_pos {
    qk__wg3t_walk w;
    int it, ik, j0, nt, t, kt;
    __device__ __forceinline__ void start(int it0, int nn, int tri)
    {
        w.base = w.p = 0;
        w.tri = tri;
        it = it0;
        ik = t = kt = 0;
        qk__wg3t_seek(w, it, nn, j0, nt);
    }
    __device__ __forceinline__ void next(int nkt, int G, int items, int nn)
    {
        if (++kt < nkt) return;
        kt = 0;
        if (++t < nt) return;
        t = 0;
        it += G;
        ++ik;
        if (it < items) qk__wg3t_seek(w, it, nn, j0, nt);
    }
};
template <bool CPLX, typename OutT, int NS>
__global__ void __launch_bounds__(384, 1)
qk__k_wg3t(const __grid_constant__ qk__wg_maps mp, int ldp, int nkt, int m, int nn, int items, float inv_s2, OutT *__restrict__ out,
           int64_t ld, OutT *__restrict__ mout, int vec, int mc, int tri)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = QK__WG3T_BM, BN = QK__WG3T_BN, TP = BM * 128, TR = BN * 128, NA = CPLX ? 32 : 1;
    const uint32_t sbase = qk__wg_smem1024(), ring = sbase + nkt * 2 * TP, bars = ring + NS * 2 * TR;
    /* full[s] at bars + 8 s, empty[s] at bars + 8 (NS + s), afull[k] at bars + 8 (2 NS + k), pempty[k] at bars + 8 (2 NS + 8 + k) */
    const uint32_t b_full = bars, b_empty = bars + 8 * NS, b_afull = bars + 16 * NS, b_pempty = bars + 16 * NS + 64;
    const int tid = threadIdx.x, G = gridDim.x;
    if (tid == 0) {
        for (int s = 0; s < NS; ++s) {
            qk__mbar_init(b_full + 8 * s, 1);
            qk__mbar_init(b_empty + 8 * s, 8);   /* one arrival per consumer warp */
        }
        for (int k = 0; k < nkt; ++k) {
            qk__mbar_init(b_afull + 8 * k, 1);
            qk__mbar_init(b_pempty + 8 * k, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   /* the inits, visible to the copy engine */
    }
    __syncthreads();   /* the block's only barrier */
    if (tid >= 256) {   /* the producer warpgroup: its registers to the consumers, one thread loads */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid != 256) return;
        auto load_panel = [&](int kt, int p) {   /* panel p's stage kt (hi, lo) into its place, on afull[kt] */
            const uint32_t dst = sbase + kt * 2 * TP, bar = b_afull + 8 * kt;
            qk__mbar_expect_tx(bar, 2 * TP);   /* whole boxes: rows past m count too (zeros) */
            qk__tma_load2d(dst, &mp.a, kt * 32, p * BM, bar);
            qk__tma_load2d(dst + TP, &mp.a, ldp + kt * 32, p * BM, bar);
        };
        qk__wg3t_pos lp, rl;   /* the stage to load (s) and the stage whose release it waits for (s - NS) */
        lp.start(blockIdx.x, nn, tri);
        rl = lp;
        qk__wg3t_walk nw = lp.w;   /* the next item's panel */
        for (int kt = 0; kt < nkt; ++kt) load_panel(kt, lp.w.p);
        for (uint32_t s = 0;; ++s) {
            if (s >= (uint32_t)NS) {
                if (rl.it >= items) break;   /* every load issued, every panel too */
                if (rl.t == rl.nt - 1 && rl.it + G < items) {   /* the item's last tile is done with panel stage kt: the next item's */
                    int j0, nt;
                    qk__wg3t_seek(nw, rl.it + G, nn, j0, nt);
                    qk__mbar_wait(b_pempty + 8 * rl.kt, rl.ik & 1);
                    load_panel(rl.kt, nw.p);
                }
                rl.next(nkt, G, items, nn);
            }
            if (lp.it < items) {
                const uint32_t slot = s % NS, full = b_full + 8 * slot;
                if (s >= (uint32_t)NS) qk__mbar_wait(b_empty + 8 * slot, (s / NS - 1) & 1);
                const int y = (int)qk__wg3t_col0(lp.w.p, tri) + (lp.j0 + lp.t) * BN, x = lp.kt * 32;
                qk__mbar_expect_tx(full, 2 * TR);
                qk__tma_load2d(ring + slot * 2 * TR, &mp.b, x, y, full);
                qk__tma_load2d(ring + slot * 2 * TR + TR, &mp.b, ldp + x, y, full);
                lp.next(nkt, G, items, nn);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");   /* the producer's released 16384: see above */
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int arow = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), ahi = lane >> 4;
    float ar[32], ai[NA], tr[32], ti[NA];
    qk__wg_zero(ar);
    qk__wg_zero(ai);
    qk__wg_zero(tr);
    qk__wg_zero(ti);
    qk__wg3t_walk w = {0, 0, tri};
    uint32_t u = 0, ik = 0;   /* stages consumed, items begun */
    for (int it = blockIdx.x; it < items; it += G, ++ik) {
        int j0, nt;
        qk__wg3t_seek(w, it, nn, j0, nt);
        const int row0 = w.p * BM;
        for (int t = 0; t < nt; ++t) {
            const int c0 = (int)qk__wg3t_col0(w.p, tri) + (j0 + t) * BN + wg * 64;   /* this warpgroup's 64 columns (past nn: zeros, nothing stored) */
            for (int kt = 0; kt < nkt; ++kt) {
                const uint32_t slot = u % NS;
                if (t == 0) qk__mbar_wait(b_afull + 8 * kt, ik & 1);
                qk__mbar_wait(b_full + 8 * slot, (u / NS) & 1);
                __syncwarp();   /* converged before the aligned instructions */
                {
                    const uint32_t As = sbase + kt * 2 * TP, Bs = ring + slot * 2 * TR + wg * 64 * 128;
                    uint32_t fh[4][4], fl[4][4], rh[4][4], rl[4][4];
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) {
                        const uint32_t off = qk__sw128(arow, 2 * kk + ahi);
                        qk__ldsm4(As + off, fh[kk]);
                        qk__ldsm4(As + TP + off, fl[kk]);
                        if constexpr (CPLX) {
#pragma unroll
                            for (int q = 0; q < 4; ++q) {
                                rh[kk][q] = qk__rot16(fh[kk][q]);
                                rl[kk][q] = qk__rot16(fl[kk][q]);
                            }
                        }
                    }
                    qk__wg_pin(ar);   /* the zeroed sums as registers before the fence (not constants moved in between the products) */
                    if constexpr (CPLX) qk__wg_pin(ai);
                    qk__wg_fence();
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) {
                        const uint64_t bh = qk__wg_desc(Bs + kk * 32), bl = qk__wg_desc(Bs + TR + kk * 32);
                        qk__wg_m64n64k16(ar, fl[kk], bh);
                        qk__wg_m64n64k16(ar, fh[kk], bl);
                        qk__wg_m64n64k16(ar, fh[kk], bh);
                        if constexpr (CPLX) {
                            qk__wg_m64n64k16(ai, rl[kk], bh);
                            qk__wg_m64n64k16(ai, rh[kk], bl);
                            qk__wg_m64n64k16(ai, rh[kk], bh);
                        }
                    }
                    qk__wg_commit();
                    qk__wg_wait0();
                }
                qk__wg_pin(ar);
                if constexpr (CPLX) qk__wg_pin(ai);
                /* release the stage: this warp's ldmatrix reads ordered before the copy engine's next writes */
                qk__fence_async_smem();
                __syncwarp();
                if (lane == 0) {
                    qk__mbar_arrive(b_empty + 8 * slot);
                    if (t == nt - 1) qk__mbar_arrive(b_pempty + 8 * kt);
                }
                __syncwarp();
                ++u;
                if (kt == nkt - 1) {   /* the tile's epilogue: the totals and the last stage's sums */
                    int r0e = row0, c0e = c0;
                    asm volatile("" : "+r"(r0e), "+r"(c0e));   /* the stores' addresses computed here, not hoisted and kept over the stages */
                    /* mirror of columns < mc only (a band's rows); a half across mc stores entry by entry */
                    const bool inner = vec && r0e + BM <= m && c0e + 64 <= nn && (!tri || c0e >= r0e + BM) && (c0e + 64 <= mc || c0e >= mc);
                    qk__wg_store<OutT, 8, CPLX, true>(ar, ai, tr, ti, inv_s2, r0e, c0e, warp * 16 + (lane >> 2), lane & 3, inner, m, nn, out, ld,
                                                      c0e < mc ? mout : nullptr, 0, tri, mc);
                    qk__wg_zero(tr);
                    qk__wg_zero(ti);
                    qk__wg_zero(ar);
                    qk__wg_zero(ai);
                } else {   /* the stage's sums into the round-to-nearest totals */
#pragma unroll
                    for (int i = 0; i < 32; ++i) {
                        tr[i] += ar[i];
                        ar[i] = 0.0f;
                    }
#pragma unroll
                    for (int i = 0; i < NA; ++i) {
                        ti[i] += ai[i];
                        ai[i] = 0.0f;
                    }
                }
            }
        }
    }
#endif
}

/* cuTensorMapEncodeTiled from the driver the runtime uses (no link to libcuda); null where the
   driver has none. Looked up once. */
typedef CUresult (*qk__pfn_encode_tiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *, const cuuint64_t *,
                                         const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                         CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static qk__pfn_encode_tiled qk__tma_encoder()
{
    static std::once_flag once;
    static qk__pfn_encode_tiled fn = nullptr;
    std::call_once(once, [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (qk__pfn_encode_tiled)p;
        cudaGetLastError();
    });
    return fn;
}
/* The map of rows x ldw 32-bit operand words at base: 32-word x box_rows-row boxes (128: a stage
   of qk__k_wg16t) in the 128-byte swizzle, rows past the last read as zeros. */
static bool qk__wg_map(qk__pfn_encode_tiled enc, CUtensorMap *map, const uint32_t *base, int64_t rows, int64_t ldw, int box_rows = 128)
{
    const cuuint64_t dims[2] = {(cuuint64_t)ldw, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ldw * 4};
    const cuuint32_t box[2] = {32, (cuuint32_t)box_rows}, step[2] = {1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, (void *)base, dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Launchers (the arguments of qk__launch_tcf_cfg; ldp: words per row and part, a multiple of 32).
   FP16: the persistent kernel for a triangle of short states (qk__k_wg16t), else the triangular
   grid of K(X,X) (qk__tri_grid) where the whole block is one triangle; FP32X3's tiles are not
   square and skip the ones below the diagonal. */
template <bool SPLIT, bool CPLX, typename OutT>
static qk_result qk__launch_wg(const uint32_t *A, const uint32_t *B, int64_t ldw, int64_t ldp, int64_t m, int64_t nn, float inv_s2, OutT *out,
                               int64_t ld, OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E, int64_t mcols = INT64_MAX)
{
    int dev = 0;
    QK_CK(cudaGetDevice(&dev));
    if (!qk__wgmma_ok(dev))
        return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "fused tensor-core configuration 4 (wgmma) needs a compute capability 9.0 device "
                            "and a build for sm_90a (-Dgpu_arch=90); this plan named it where it cannot run");
    if (ldp % 32) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "fused tensor-core configuration 4: operand rows must be whole 32-word stages");
    constexpr int BM = 128, BN = SPLIT ? 64 : 128, NS = SPLIT ? 3 : 4;
    const size_t smem = (size_t)NS * (SPLIT ? 49152 : 32768) + 1024;
    const int nkt = (int)(ldp / 32);
    if constexpr (!SPLIT) {
        /* the triangle of K(X,X) in one launch with short states: the persistent kernel, work items
           of QK__WG_ITEM column tiles, one block per SM */
        if (tri && doff == 0 && m <= (int64_t)65535 * BM && nn >= m && nkt <= 8) {
            constexpr int C = QK__WG_ITEM;
            int dev = 0, sms = 0;
            QK_CK(cudaGetDevice(&dev));
            QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
            const int64_t Tm = (m + BM - 1) / BM, Tn = (nn + BM - 1) / BM;
            int64_t items = 0;
            for (int64_t p = 0; p < Tm; ++p) items += (Tn - p + C - 1) / C;
            const qk__pfn_encode_tiled enc = qk__tma_encoder();
            qk__wg_maps mp;
            if (enc && qk__wg_map(enc, &mp.a, A, m, ldw) && qk__wg_map(enc, &mp.b, B, nn, ldw)) {
                const size_t tsmem = (size_t)(nkt + 5) * 16384 + 1024 + 128;   /* panel, 5 ring slots, alignment, mbarriers */
                QK_CK(cudaFuncSetAttribute(qk__k_wg16t<CPLX, OutT, 5>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tsmem));
                qk__k_wg16t<CPLX, OutT, 5><<<(unsigned)std::min<int64_t>(items, sms), 256, tsmem, st>>>(mp, nkt, (int)m, (int)nn, inv_s2, out, ld,
                                                                                                     mout, qk__vec_ok(out, mout, ld), C,
                                                                                                     (int)std::min(mcols, nn));
                QK_LAUNCH_CK("qk__k_wg16t");
                return QK_OK;
            }
            /* no tensor map (a driver without the encoder): the triangular grid below */
        }
    }
    if constexpr (SPLIT) {
        /* the persistent TMA-fed FP32X3 kernel for short states (1 to 8 stages): the triangle of
           K(X,X) (from its diagonal: doff 0) or a rectangle (tri 0: every entry); qk__k_wg3
           elsewhere and where the maps cannot be encoded */
        const int wt = tri ? 1 : 0;
        if ((!tri || (doff == 0 && nn >= m)) && m < ((int64_t)1 << 30) && nn < ((int64_t)1 << 30) && nkt >= 1 && nkt <= 8 &&
            ldp <= 65536 && qk__wg3t_items(m, nn, wt) <= INT_MAX / 2) {
            const qk__pfn_encode_tiled enc = qk__tma_encoder();
            qk__wg_maps mp;
            if (enc && qk__wg_map(enc, &mp.a, A, m, ldw, QK__WG3T_BM) && qk__wg_map(enc, &mp.b, B, nn, ldw, QK__WG3T_BN)) {
                constexpr int TNS = 3;   /* 8 stages: 128 KB of panel + 3 x 32 KB of ring */
                int sms = 0;
                QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
                const int64_t items = qk__wg3t_items(m, nn, wt);
                const size_t tsmem = (size_t)nkt * 16384 + (size_t)TNS * 32768 + 1024 + 256;
                QK_CK(cudaFuncSetAttribute(qk__k_wg3t<CPLX, OutT, TNS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tsmem));
                qk__k_wg3t<CPLX, OutT, TNS><<<(unsigned)std::min<int64_t>(items, sms), 384, tsmem, st>>>(mp, (int)ldp, nkt, (int)m, (int)nn, (int)items, inv_s2,
                                                                                                     out, ld, mout, qk__vec_ok(out, mout, ld),
                                                                                                     (int)std::min(mcols, nn), wt);
                QK_LAUNCH_CK("qk__k_wg3t");
                return QK_OK;
            }
        }
    }
    if (mout && mcols < nn) {
        /* the grid kernels mirror every column: the columns from mcols on as a second call without one */
        const int64_t c = std::max<int64_t>(0, mcols);
        if (c > 0) QK_TRY((qk__launch_wg<SPLIT, CPLX, OutT>(A, B, ldw, ldp, m, c, inv_s2, out, ld, mout, doff, tri, st, E)));
        return qk__launch_wg<SPLIT, CPLX, OutT>(A, B + c * ldw, ldw, ldp, m, nn - c, inv_s2, out + c, ld, nullptr, doff + c, tri, st, E);
    }
    if constexpr (SPLIT) {
        QK_CK(cudaFuncSetAttribute(qk__k_wg3<CPLX, OutT, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    else QK_CK(cudaFuncSetAttribute(qk__k_wg16<CPLX, OutT, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t r0 = 0; r0 < m; r0 += (int64_t)65535 * BM) { /* grid.y limit */
        const int64_t mm = std::min<int64_t>(m - r0, (int64_t)65535 * BM);
        dim3 grid((unsigned)((nn + BN - 1) / BN), (unsigned)((mm + BM - 1) / BM));
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        if constexpr (SPLIT) {
            qk__k_wg3<CPLX, OutT, NS><<<grid, 256, smem, st>>>(A + r0 * ldw, B, ldw, ldp, nkt, (int)mm, (int)nn, inv_s2, o, ld, mo, doff - r0, tri,
                                                                qk__vec_ok(o, mo, ld));
            QK_LAUNCH_CK("qk__k_wg3");
        } else {
            int tg = 0;
            if (tri && doff == 0 && r0 == 0 && mm == m && nn >= mm) {
                const int64_t Tx = grid.x, Ty = grid.y;
                tg = (int)Tx;
                grid = dim3((unsigned)(Ty * Tx - Ty * (Ty - 1) / 2), 1);
            }
            qk__k_wg16<CPLX, OutT, NS><<<grid, 256, smem, st>>>(A + r0 * ldw, B, ldw, nkt, (int)mm, (int)nn, inv_s2, o, ld, mo, doff - r0, tri,
                                                                 qk__vec_ok(o, mo, ld), tg);
            QK_LAUNCH_CK("qk__k_wg16");
        }
    }
    return QK_OK;
}
