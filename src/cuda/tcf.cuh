#pragma once
#include "base.cuh"
#include "common.cuh"
#include "states.cuh"
#include "wgmma.cuh"
/* >>tcf ---- the fused tensor-core Gram kernel (mma.sync; plan.engine QK_GPU_TCF_*) ---- */
/* The tensor-core precisions without cuBLAS: one kernel computes a square tile of K with
   mma.sync (m16n8k8 TF32, m16n8k16 FP16, fp32 accumulators in registers), takes |.|^2 in its
   epilogue and writes the tile and its mirror (qk__store_tile), over the triangular tile grid of
   the fp32 fused kernel (qk__tile_of): no Re/Im planes in memory, 4 bytes of K per pair written
   once, half the tiles of K(X,X). At 8 qubits the cuBLAS engines spend most of their time
   writing and re-reading the planes (docs/precision.md: 162 Gpairs/s TF32 at zz 8 q, n=32768,
   against ~350 for a kernel that writes K only).

   Operands. A conversion pass (qk__k_tcf_operand) writes every state once as 32-bit words:
   TF32 the float rounded to TF32 (nearest, as the cuBLAS engine); FP16 two halves of s * x
   (s = 2^floor(q/2), as the cuBLAS engine, undone exactly in the epilogue); FP32X3 a row of hi
   words then a row of lo words (hi = fp16(s x), lo = fp16(s x - hi)). Rows are zero-padded to
   a whole number of k-stages (KW words), so the kernel has no k tail.

   The complex product without planes. States stay interleaved (re, im). The k index of an MMA
   is free to be any permutation of the physical words as long as A and B agree, and the one
   used here gives each thread the (re, im) of one amplitude in a pair of registers: TF32, the
   two k's t and t+4 of thread t are words 2i and 2i+1; FP16, one register is one amplitude
   (re low half, im high half). So with B the same fragment, one MMA gives
   Re <a|b> = sum a_re b_re + a_im b_im, and with B's pair rotated in registers, (re, im) ->
   (im, -re) (a swap and a sign bit), a second MMA gives Im <a|b> = sum a_re b_im - a_im b_re.
   Real maps take one MMA.

   Fragment layout (PTX ISA, mma.m16n8k8 .tf32 and m16n8k16 .f16; g = lane / 4, t = lane % 4):
     A (16 x k, row-major) a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4)  [k in 32-bit words]
     B (k x 8, column)     b0 (t, g) b1 (t+4, g)
     C (16 x 8)            c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1)
   Shared memory holds rows of KW words per stage (row stride S = KW + 16 words, 16 mod 32: the
   16-byte fragment loads of 8 lanes, rows g and g+1 at 4t words, hit 32 distinct banks). A
   thread's 16-byte load at word 16 * grp + 4t of a row holds k-words (t, t+4) of two k-steps:
   logical k-word t + 4h of step ks is physical word 16 grp + 4t + 2ks + h. qk__tcf_kword()
   states this map; tests/gpu checks it on the host against the layout above (an emulated warp).

   Operands reach shared memory with cp.async (16 bytes, zero-fill past the last row) in a
   three-stage pipeline, one barrier per stage.

   FP32X3: three products lo*hi + hi*lo + hi*hi per k-step into the same accumulators. The
   tensor cores' fp32 accumulation is not round-to-nearest and loses up to an ulp of the partial
   sum per step (docs/precision.md), so every QK__TCF_FLUSH stages the accumulators are added
   into a second set with ordinary (round-to-nearest) fp32 adds and cleared: a partial sum never
   runs longer than a few dozen MMA steps (FP32X3 always runs 64 x 64 tiles: two sets of
   accumulators). */
#define QK__TCF_FLUSH 4
#define QK__TCF_STR2(x) #x
#define QK__TCF_STR(x) QK__TCF_STR2(x)

/* logical k-word (0..7 of k-step ks) -> physical word of a 16-word group, for lane t = lane % 4:
   k-word t + 4h of step ks is word 4t + 2ks + h (see above) */
__host__ __device__ inline int qk__tcf_kword(int t, int ks, int h) { return 4 * t + 2 * ks + h; }

template <int MODE> __device__ __forceinline__ void qk__mma(float *c, const uint32_t *a, const uint32_t *b)
{
    if constexpr (MODE == QK_GPU_TC_TF32) qk__mma_tf32(c, a, b);
    else qk__mma_f16(c, a, b);
}
/* B fragment of Im <a|b>: each amplitude (re, im) -> (im, -re). TF32: the pair is the two
   registers; FP16: the two halves of one register. */
template <int MODE> __device__ __forceinline__ void qk__rot(const uint32_t *b, uint32_t *r)
{
    if constexpr (MODE == QK_GPU_TC_TF32) {
        r[0] = b[1];
        r[1] = b[0] ^ 0x80000000u;
    } else {
        r[0] = __byte_perm(b[0], 0, 0x1032) ^ 0x80000000u;
        r[1] = __byte_perm(b[1], 0, 0x1032) ^ 0x80000000u;
    }
}
__device__ __forceinline__ uint32_t qk__u4(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
/* f(i, j, e) over a warp's MI x NI fragments of 4 accumulators each, unrolled (the accumulator
   arrays' indices stay compile-time constants, so they stay in registers) */
template <int MI, int NI, typename F> __device__ __forceinline__ void qk__each_frag(F &&f)
{
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(i, j, e);
}


/* Operand words of rows of W floats (interleaved complex or real states): ldp words per row and
   part (zero-padded); FP32X3 writes two parts per row (hi, then lo). */
template <int MODE>
__global__ void __launch_bounds__(256)
qk__k_tcf_operand(const float *__restrict__ in, int64_t rows, int64_t W, int64_t ldp, float scale, uint32_t *__restrict__ out)
{
    const int64_t n = rows * ldp;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / ldp, k = e - r * ldp;
        const float *x = in + r * W;
        if constexpr (MODE == QK_GPU_TC_TF32) {
            out[e] = k < W ? __float_as_uint(qk__tf32_rna(x[k])) : 0u;
        } else {
            const float v0 = 2 * k < W ? x[2 * k] * scale : 0.0f, v1 = 2 * k + 1 < W ? x[2 * k + 1] * scale : 0.0f;
            const __half h0 = __float2half_rn(v0), h1 = __float2half_rn(v1);
            const uint32_t hw = (uint32_t)__half_as_ushort(h0) | ((uint32_t)__half_as_ushort(h1) << 16);
            if constexpr (MODE == QK_GPU_TC_FP16) out[e] = hw;
            else {
                const __half l0 = __float2half_rn(v0 - __half2float(h0)), l1 = __float2half_rn(v1 - __half2float(h1));
                out[r * 2 * ldp + k] = hw;
                out[r * 2 * ldp + ldp + k] = (uint32_t)__half_as_ushort(l0) | ((uint32_t)__half_as_ushort(l1) << 16);
            }
        }
    }
}

/* One BM x BM tile of K per block; WGM x WGN warps, each a (BM/WGM) x (BM/WGN) warp tile of
   16 x 8 MMA tiles. A, B: operand words, ldw words per row (FP32X3: hi part, lo part at ldw/2),
   nkt k-stages of KW words (FP32X3: 16 hi + 16 lo). inv_s2 undoes the FP16 scale of <a|b>. */
template <int MODE, bool CPLX, typename OutT, int BM, int WGM, int WGN, int NS>
__global__ void __launch_bounds__(WGM * WGN * 32)
qk__k_tcgram(const uint32_t *__restrict__ A, const uint32_t *__restrict__ B, int64_t ldw, int nkt, int m, int nn,
             float inv_s2, OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid)
{
    constexpr bool SPLIT = MODE == QK_GPU_TC_FP32X3, FLUSH = SPLIT;
    constexpr int NT = WGM * WGN * 32, BN = BM;
    constexpr int WM = BM / WGM, WN = BN / WGN, MI = WM / 16, NI = WN / 8;
    constexpr int KW = 32, S = KW + 16, CH = KW / 4; /* words per row and stage, row stride, 16-byte chunks */
    constexpr int NG = SPLIT ? 1 : KW / 16;          /* 16-word groups per stage and part */
    constexpr int CI = CPLX ? MI : 1, CJ = CPLX ? NI : 1, FI = FLUSH ? MI : 1, FJ = FLUSH ? NI : 1;
    constexpr int FCI = FLUSH && CPLX ? MI : 1, FCJ = FLUSH && CPLX ? NI : 1;
    static_assert(MI >= 1 && NI >= 1 && WM % 16 == 0 && WN % 8 == 0, "warp tile");
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return; /* whole tile below the diagonal */
    extern __shared__ __align__(16) unsigned char qk__smem[];
    uint32_t *sm = (uint32_t *)qk__smem; /* [NS][BM + BN][S] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp / WGN, wn = warp % WGN;

    auto load = [&](int kt, int buf) {
        uint32_t *st = sm + buf * (BM + BN) * S;
        for (int c = threadIdx.x; c < (BM + BN) * CH; c += NT) {
            const int r = c / CH, cc = c % CH;
            const bool isb = r >= BM;
            const int grow = (isb ? col0 + r - BM : row0 + r);
            const bool ok = grow < (isb ? nn : m);
            const int64_t off = SPLIT ? (int64_t)(cc / 4) * (ldw / 2) + (int64_t)kt * 16 + (cc % 4) * 4 : (int64_t)kt * KW + cc * 4;
            const uint32_t *gp = (isb ? B : A) + (ok ? (int64_t)grow * ldw : 0) + off;
            qk__cp16(st + r * S + cc * 4, gp, ok ? 16 : 0);
        }
    };

    float accr[MI][NI][4], acci[CI][CJ][4], totr[FI][FJ][4], toti[FCI][FCJ][4];
    qk__each_frag<MI, NI>([&](int i, int j, int e) {
        accr[i][j][e] = 0.0f;
        if constexpr (CPLX) acci[i][j][e] = 0.0f;
        if constexpr (FLUSH) totr[i][j][e] = 0.0f;
        if constexpr (FLUSH && CPLX) toti[i][j][e] = 0.0f;
    });

#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        if (s < nkt) load(s, s);
        qk__cp_commit();
    }
    for (int kt = 0; kt < nkt; ++kt) {
        qk__cp_wait<NS - 2>();
        __syncthreads(); /* stage kt landed for every thread; stage kt-1's buffer is free */
        if (kt + NS - 1 < nkt) load(kt + NS - 1, (kt + NS - 1) % NS);
        qk__cp_commit();
        const uint32_t *As = sm + (kt % NS) * (BM + BN) * S, *Bs = As + BM * S;
#pragma unroll
        for (int gq = 0; gq < NG; ++gq) {
            /* 16-byte loads: [part][row g / g+8] of A, [part] of B; part 1 is FP32X3's lo */
            uint4 af[SPLIT ? 2 : 1][MI][2], bf[SPLIT ? 2 : 1][NI];
#pragma unroll
            for (int p = 0; p < (SPLIT ? 2 : 1); ++p) {
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    const uint32_t *ra = As + (wm * WM + i * 16 + g) * S + p * 16 + gq * 16 + 4 * t;
                    af[p][i][0] = *(const uint4 *)ra;
                    af[p][i][1] = *(const uint4 *)(ra + 8 * S);
                }
#pragma unroll
                for (int j = 0; j < NI; ++j) bf[p][j] = *(const uint4 *)(Bs + (wn * WN + j * 8 + g) * S + p * 16 + gq * 16 + 4 * t);
            }
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                /* products (A part, B part): FP32X3 lo*hi, hi*lo, hi*hi (small first); else hi*hi */
#pragma unroll
                for (int pr = SPLIT ? 0 : 2; pr < 3; ++pr) {
                    const int pa = pr == 0 ? 1 : 0, pb = pr == 1 ? 1 : 0;
                    uint32_t a[MI][4];
#pragma unroll
                    for (int i = 0; i < MI; ++i) {
                        a[i][0] = qk__u4(af[pa][i][0], 2 * ks);     /* (g,   k-word t)   */
                        a[i][1] = qk__u4(af[pa][i][1], 2 * ks);     /* (g+8, k-word t)   */
                        a[i][2] = qk__u4(af[pa][i][0], 2 * ks + 1); /* (g,   k-word t+4) */
                        a[i][3] = qk__u4(af[pa][i][1], 2 * ks + 1); /* (g+8, k-word t+4) */
                    }
#pragma unroll
                    for (int j = 0; j < NI; ++j) {
                        uint32_t b[2] = {qk__u4(bf[pb][j], 2 * ks), qk__u4(bf[pb][j], 2 * ks + 1)};
#pragma unroll
                        for (int i = 0; i < MI; ++i) qk__mma<MODE>(accr[i][j], a[i], b);
                        if constexpr (CPLX) {
                            uint32_t br[2];
                            qk__rot<MODE>(b, br);
#pragma unroll
                            for (int i = 0; i < MI; ++i) qk__mma<MODE>(acci[i][j], a[i], br);
                        }
                    }
                }
            }
        }
        if constexpr (FLUSH) {
            if ((kt + 1) % QK__TCF_FLUSH == 0 || kt + 1 == nkt)
                qk__each_frag<MI, NI>([&](int i, int j, int e) {
                    totr[i % FI][j % FJ][e] += accr[i][j][e];
                    accr[i][j][e] = 0.0f;
                    if constexpr (CPLX) {
                        toti[i % FCI][j % FCJ][e] += acci[i % CI][j % CJ][e];
                        acci[i % CI][j % CJ][e] = 0.0f;
                    }
                });
        }
    }
    qk__cp_wait<0>();
    __syncthreads(); /* every warp is done with the operand buffers */
    OutT *Cs = (OutT *)qk__smem; /* [BM][BN + 1] */
    qk__each_frag<MI, NI>([&](int i, int j, int e) {
        const int r = wm * WM + i * 16 + g + (e >> 1) * 8, c = wn * WN + j * 8 + 2 * t + (e & 1);
        float re, im = 0.0f;
        if constexpr (FLUSH) re = totr[i % FI][j % FJ][e] * inv_s2;
        else re = accr[i][j][e] * inv_s2;
        if constexpr (CPLX) {
            if constexpr (FLUSH) im = toti[i % FCI][j % FCJ][e] * inv_s2;
            else im = acci[i % CI][j % CJ][e] * inv_s2;
        }
        Cs[r * (BN + 1) + c] = (OutT)(re * re + im * im);
    });
    __syncthreads();
    qk__store_tile<OutT, BM, BN, NT>(Cs, row0, col0, m, nn, out, ld, mout, doff, tri, vec);
}

/* Fused tensor-core configurations (qk_plan.kernel_cfg with a TCF engine; 0 runs 1):
     1  128 x 128 tiles, 8 warps of 64 x 32 (the fixed table's at 8 qubits)
     2   64 x  64 tiles, 4 warps of 32 x 32 (the fixed table's up to 7 qubits; FP32X3 always:
        two accumulator sets, 128 registers)
   FP32X3 takes 2 whatever the configuration: its second accumulator set (the flush) and its hi
   and lo fragments would not fit the registers at 64 x 32 per warp (complex: 256 accumulators).
   A third configuration (128 x 128, 8 warps of 32 x 64) was never the fastest at 6 to 16 qubits
   in any mode (docs/benchmarks.md, QK__TCF_MAX_QUBITS) and was removed: each configuration costs
   nvcc a kernel per mode x CPLX x OutT x architecture. */
template <int MODE, bool CPLX, typename OutT, int BM, int WGM, int WGN>
static qk_result qk__launch_tcf_cfg(const uint32_t *A, const uint32_t *B, int64_t ldw, int nkt, int64_t m, int64_t nn, float inv_s2,
                                    OutT *out, int64_t ld, OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    constexpr int NS = 3, S = 48, NT = WGM * WGN * 32;
    const size_t smem = std::max((size_t)NS * 2 * BM * S * 4, (size_t)BM * (BM + 1) * sizeof(OutT));
    auto kf = qk__k_tcgram<MODE, CPLX, OutT, BM, WGM, WGN, NS>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t r0 = 0; r0 < m; r0 += (int64_t)65535 * BM) { /* grid.y limit */
        const int64_t mm = std::min<int64_t>(m - r0, (int64_t)65535 * BM);
        dim3 grid((unsigned)((nn + BM - 1) / BM), (unsigned)((mm + BM - 1) / BM));
        int tg = 0;
        if (tri && doff == 0 && r0 == 0 && mm == m && nn >= mm) {
            const int64_t Tx = grid.x, Ty = grid.y;
            tg = (int)Tx;
            grid = dim3((unsigned)(Ty * Tx - Ty * (Ty - 1) / 2), 1);
        }
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        kf<<<grid, NT, smem, st>>>(A + r0 * ldw, B, ldw, nkt, (int)mm, (int)nn, inv_s2, o, ld, mo, doff - r0, tri,
                                   qk__vec_ok(o, mo, ld), tg);
        QK_LAUNCH_CK("qk__k_tcgram");
    }
    return QK_OK;
}

template <int MODE, bool CPLX, typename OutT>
static qk_result qk__launch_tcf_mode(int cfg, const uint32_t *A, const uint32_t *B, int64_t ldw, int nkt, int64_t m, int64_t nn,
                                     float inv_s2, OutT *out, int64_t ld, OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E,
                                     int64_t mcols = INT64_MAX)
{
    /* mcols: the mirror of the first mcols columns only (a band of K(X,X)'s rows); the wgmma
       launcher keeps it in one launch where its persistent kernels run, the others run the
       columns from mcols on as a second call without a mirror */
    if (mout && mcols < nn && qk__tcf_cfg_runs(MODE == QK_GPU_TC_FP32X3 ? QK_GPU_TCF_FP32X3 : MODE == QK_GPU_TC_FP16 ? QK_GPU_TCF_FP16 : QK_GPU_TCF_TF32, cfg) != 4) {
        const int64_t c = std::max<int64_t>(0, mcols);
        if (c > 0) QK_TRY((qk__launch_tcf_mode<MODE, CPLX, OutT>(cfg, A, B, ldw, nkt, m, c, inv_s2, out, ld, mout, doff, tri, st, E)));
        return qk__launch_tcf_mode<MODE, CPLX, OutT>(cfg, A, B + c * ldw, ldw, nkt, m, nn - c, inv_s2, out + c, ld, nullptr, doff + c, tri, st, E);
    }
    /* FP32X3 (MODE QK_GPU_TC_FP32X3) runs configuration 2 whatever cfg says (two accumulator sets,
       32 x 32 per warp keeps them in registers), or 4, the wgmma kernel. Its other mma.sync
       configurations are not instantiated (if constexpr: they were unreachable, and each cost
       nvcc a kernel per CPLX x OutT x architecture). */
    if constexpr (MODE == QK_GPU_TC_FP32X3) {
        if (qk__tcf_cfg_runs(QK_GPU_TCF_FP32X3, cfg) == 4)   /* wgmma (>>wgmma) */
            return qk__launch_wg<true, CPLX, OutT>(A, B, ldw, ldw / 2, m, nn, inv_s2, out, ld, mout, doff, tri, st, E, mcols);
        return qk__launch_tcf_cfg<MODE, CPLX, OutT, 64, 2, 2>(A, B, ldw, nkt, m, nn, inv_s2, out, ld, mout, doff, tri, st, E);
    } else {
        cfg = qk__tcf_cfg_runs(MODE == QK_GPU_TC_FP16 ? QK_GPU_TCF_FP16 : QK_GPU_TCF_TF32, cfg);   /* the planner's rule */
        switch (cfg) {
        case 4:
            if constexpr (MODE == QK_GPU_TC_FP16) return qk__launch_wg<false, CPLX, OutT>(A, B, ldw, ldw, m, nn, inv_s2, out, ld, mout, doff, tri, st, E, mcols);
            else return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "fused tensor-core configuration 4 (wgmma) serves fp16 and fp32x3 only");
        case 2: return qk__launch_tcf_cfg<MODE, CPLX, OutT, 64, 2, 2>(A, B, ldw, nkt, m, nn, inv_s2, out, ld, mout, doff, tri, st, E);
        default: return qk__launch_tcf_cfg<MODE, CPLX, OutT, 128, 2, 4>(A, B, ldw, nkt, m, nn, inv_s2, out, ld, mout, doff, tri, st, E);
        }
    }
}

/* Operand geometry of engine `eng` (QK_GPU_TCF_*; MODE and mode below: the cuBLAS tensor-core
   engine of the same operand format, QK_GPU_TC_TF32, TC_FP32X3, TC_FP16) for states of D amplitudes: words per row and part
   (ldp, a whole number of k-stages), words per row (ldw), k-stages (nkt), the FP16 scale. Keep in
   step with qk.h's qk__tcf_ws (the planner counts these bytes). */
struct qk__tcf_geom {
    int mode;
    int64_t W, ldp, ldw;
    int nkt;
    float scale, inv_s2;
};
static qk__tcf_geom qk__tcf_geometry(qk_gpu_engine eng, int64_t D, bool cplx)
{
    qk__tcf_geom G;
    G.mode = (int)qk__engine_tc_of(eng);   /* the operand format: that of the cuBLAS engine of the mode */
    G.W = cplx ? 2 * D : D;
    const int64_t words = G.mode == QK_GPU_TC_TF32 ? G.W : (G.W + 1) / 2, kw = 32;   /* whole 32-word stages: the wgmma kernels' too */
    G.ldp = (words + kw - 1) / kw * kw;
    G.ldw = G.mode == QK_GPU_TC_FP32X3 ? 2 * G.ldp : G.ldp;
    G.nkt = (int)(G.ldp / (G.mode == QK_GPU_TC_FP32X3 ? 16 : 32));   /* the mma.sync kernel's stages: FP32X3 16 words a part */
    int q = 0;
    while (((int64_t)1 << q) < D) ++q;
    G.scale = G.mode == QK_GPU_TC_TF32 ? 1.0f : ldexpf(1.0f, q / 2);
    G.inv_s2 = 1.0f / (G.scale * G.scale);
    return G;
}

static qk_result qk__tcf_convert(const qk__tcf_geom &G, const void *src, int64_t rows, uint32_t *dst, cudaStream_t st, qk__err *E)
{
    const int64_t n = rows * G.ldp;
    if (n <= 0) return QK_OK;
    const unsigned blocks = (unsigned)std::min<int64_t>((n + 255) / 256, (int64_t)1 << 20);
    switch (G.mode) {
    case QK_GPU_TC_TF32: qk__k_tcf_operand<QK_GPU_TC_TF32><<<blocks, 256, 0, st>>>((const float *)src, rows, G.W, G.ldp, G.scale, dst); break;
    case QK_GPU_TC_FP32X3: qk__k_tcf_operand<QK_GPU_TC_FP32X3><<<blocks, 256, 0, st>>>((const float *)src, rows, G.W, G.ldp, G.scale, dst); break;
    default: qk__k_tcf_operand<QK_GPU_TC_FP16><<<blocks, 256, 0, st>>>((const float *)src, rows, G.W, G.ldp, G.scale, dst); break;
    }
    QK_LAUNCH_CK("qk__k_tcf_operand");
    return QK_OK;
}

template <bool CPLX, typename OutT>
static qk_result qk__launch_tcf(const qk__tcf_geom &G, int cfg, const uint32_t *A, const uint32_t *B, int64_t m, int64_t nn, OutT *out,
                                int64_t ld, OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E, int64_t mcols = INT64_MAX)
{
    if (G.mode != QK_GPU_TC_FP32X3 && G.W > (CPLX ? 2 : 1) * ((int64_t)1 << QK__TCF_NOFLUSH_MAX_QUBITS))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "fused tensor-core kernel: tf32 and fp16 serve at most "
                            QK__TCF_STR(QK__TCF_NOFLUSH_MAX_QUBITS) " qubits (their accumulation error grows with the state; "
                            "use the cuBLAS engine or fp32x3)");
    switch (G.mode) {
    case QK_GPU_TC_TF32: return qk__launch_tcf_mode<QK_GPU_TC_TF32, CPLX, OutT>(cfg, A, B, G.ldw, G.nkt, m, nn, G.inv_s2, out, ld, mout, doff, tri, st, E, mcols);
    case QK_GPU_TC_FP32X3: return qk__launch_tcf_mode<QK_GPU_TC_FP32X3, CPLX, OutT>(cfg, A, B, G.ldw, G.nkt, m, nn, G.inv_s2, out, ld, mout, doff, tri, st, E, mcols);
    default: return qk__launch_tcf_mode<QK_GPU_TC_FP16, CPLX, OutT>(cfg, A, B, G.ldw, G.nkt, m, nn, G.inv_s2, out, ld, mout, doff, tri, st, E, mcols);
    }
}

/* Autotune of the fused engine (qk__tune): converts the n states into ws (bytes) and runs K(X,X). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__tune_tcf(qk_gpu_engine eng, int cfg, const void *S, int64_t n, int D, void *ws, size_t ws_bytes, OutT *K, qk__err *E)
{
    if (sizeof(T) != 4) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_tune_gram: fused tensor-core engine takes float states");
    const qk__tcf_geom G = qk__tcf_geometry(eng, D, CPLX);
    if ((size_t)n * G.ldw * 4 > ws_bytes) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_tune_gram: workspace too small for the fused tensor-core engine");
    QK_TRY(qk__tcf_convert(G, S, n, (uint32_t *)ws, 0, E));
    return qk__launch_tcf<CPLX, OutT>(G, cfg, (const uint32_t *)ws, (const uint32_t *)ws, n, n, K, n, K, 0, 1, 0, E);
}

