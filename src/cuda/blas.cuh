/* ======================================================================================== */
/* >>blas ---- cuBLAS and the tensor-core engines, the |.|^2 epilogue ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"

/* cuBLAS path epilogue: C (m x nn, row-major, ldc) -> |C|^2 into K and its mirror. Complex C is
   interleaved (re, im), or (plane > 0, the tensor-core engines) a real plane followed, plane
   values later, by an imaginary plane. linear (plan.linear, density matrices): K = Re C itself,
   not squared (for real C, the real Gram Tr(rho_i rho_j) of the vectorised matrices). */
template <typename T, bool CPLX, typename OutT>
__global__ void __launch_bounds__(256)
qk__k_epilogue(const T *__restrict__ Cm, int64_t ldc, int m, int nn, OutT *__restrict__ out, int64_t ld,
               OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid, int64_t plane, int linear, int g3)
{
    const int BM = 32, BN = 32;
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return;
    __shared__ OutT Cs[BM * (BN + 1)];
    for (int idx = threadIdx.x; idx < BM * BN; idx += 256) {
        int r = idx / BN, c = idx % BN;
        int gi = row0 + r, gj = col0 + c;
        T v = 0;
        if (gi < m && gj < nn && (!tri || gj + doff >= gi)) {
            if (CPLX && plane && g3) {   /* Gauss's three planes (qk__tc_products): T1, T2, T3 */
                const int64_t o = (int64_t)gi * ldc + gj;
                const T t1 = Cm[o], t2 = Cm[plane + o], zr = t1 + t2;
                if (linear) v = zr;   /* T3 is not computed */
                else { const T zi = Cm[2 * plane + o] - t1 + t2; v = zr * zr + zi * zi; }
            } else if (CPLX && plane) {
                const T zr = Cm[(int64_t)gi * ldc + gj], zi = Cm[plane + (int64_t)gi * ldc + gj];
                v = linear ? zr : zr * zr + zi * zi;
            } else if (CPLX) {
                typename qk__vec2<T>::t z = ((const typename qk__vec2<T>::t *)Cm)[(int64_t)gi * ldc + gj];
                v = linear ? z.x : z.x * z.x + z.y * z.y;
            } else {
                T z = Cm[(int64_t)gi * ldc + gj];
                v = linear ? z : z * z;
            }
        }
        Cs[r * (BN + 1) + c] = (OutT)v;
    }
    __syncthreads();
    qk__store_tile<OutT, 32, 32, 256>(Cs, row0, col0, m, nn, out, ld, mout, doff, tri, vec);
}

/* qk__k_epilogue: 32 x 32 tiles, 256 threads; a diagonal block of K(X,X) gets the triangular
   grid. plane > 0: C is a Re plane then an Im plane (the tensor-core engines), or with g3 the
   three planes of Gauss's products, Re = T1 + T2 and Im = T3 - T1 + T2. linear: K = Re C. */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_epilogue(const void *Cw, int64_t m, int64_t nn, OutT *out, int64_t ld, OutT *mout, int64_t doff,
                                     int tri, int64_t plane, int linear, int g3, cudaStream_t st, qk__err *E, int64_t ldc = -1)
{
    dim3 grid((unsigned)((nn + 31) / 32), (unsigned)((m + 31) / 32));
    const int tg = (tri && doff == 0 && nn >= m) ? qk__tri_grid(&grid) : 0;
    qk__k_epilogue<T, CPLX, OutT><<<grid, 256, 0, st>>>((const T *)Cw, ldc < 0 ? nn : ldc, (int)m, (int)nn, out, ld, mout, doff, tri,
                                                        qk__vec_ok(out, mout, ld), tg, plane, linear, g3);
    QK_LAUNCH_CK("qk__k_epilogue");
    return QK_OK;
}

/* ---- tensor-core engines (plan.engine QK_GPU_TC_*) ----
   The complex product in real form: a state row of D complex amplitudes is a real row of
   W = 2D values (interleaved re, im), and
       Re <a|b> = a . b,    Im <a|b> = a . rot(b),   rot(b) = (im, -re) pairs,
   so two real GEMMs (K = W) give the Re and Im planes of the slab and the epilogue takes
   Re^2 + Im^2 (real states: one GEMM, K = D). cuBLAS's complex routines on the tensor cores fall
   short of this (CGEMM with TF32 reached 2.8x FP32 at 12 qubits, SGEMM-TF32 7.8x:
   shared/PERFORMANCE.md), and HERK/SYRK have no tensor-core compute type, so the upper
   triangle of a diagonal block is covered by GEMMs over blocks of rows, each from its diagonal
   to the right (16 blocks: 53% of the square instead of HERK's 50%). Complex states take
   Gauss's three products instead (qk__tc_gauss_products) on every engine but TC_FP64.
     TC_TF32   operands rounded to TF32 (nearest), fp32 accumulation on the tensor cores
     TC_FP32X3 operands scaled as FP16 (below), split hi + lo (both fp16: 11 + 11 bits) and laid
               out [hi lo hi hi]: GEMMs over rows of A (blocks 0..2) and rows of B (blocks 1..3)
               sum hi*lo + lo*hi + hi*hi; the dropped lo*lo and the remainder of lo are 2^-22
               relative (lo of amplitudes below 2^-3 s is subnormal: 2^-25 s absolute, 1e-7 of
               K at most). Accuracy is set by the accumulation, not the split: the tensor cores'
               fp32 accumulation is not round-to-nearest, and the measured error fits up to an
               ulp of the partial sum lost per MMA step, which grows with the length of the sum
               (on the diagonal, a sum of positive terms, it does not cancel). So (i) the small
               products go first, while the sum is small (cuBLAS's k loop runs in order), and
               (ii) hi*hi is summed in chunks of K (2, or 4 from W = 2048 on), each chunk's GEMM
               adding the previous chunks' C through its beta = 1 epilogue (round to nearest).
               Each step lowered the measured error to fp32's own level (docs/benchmarks.md, 'Figures behind the code's constants'). fp16 halves rather than TF32: twice
               the rate, half the operand bytes, MMAs of k = 16 (half the steps of TF32's k = 8)
     TC_FP16   operands scaled by s = 2^floor(q/2) (amplitudes ~2^-q/2 become ~1: nothing
               underflows fp16's 2^-14) and rounded to fp16 (11 bits, as TF32, at twice its
               rate); alpha = 1/s^2 (exact) undoes the scale
     TC_BF16   as TC_FP16 with bfloat16 (8 bits): measurement only, no precision selects it
     TC_FP64   the real form with DGEMM (T double): operands kept, rot(b) copied
   Operands live in the workspace slot after the C planes (qk__blas_ws_bytes). When A and B are
   the same rows (a diagonal block of K(X,X)) they are converted once. */

/* n values of rows of W (interleaved complex or real states) into an operand of the real-form
   products: v = in[e], or with rot its pair partner rotated, (re, im) -> (im, -re), so that
   a . rot(b) = Im <a|b>; out[e] = scale * v rounded to O (TF32, FP16, BF16; double: kept).
   SPLIT (FP32X3, O = fp16): row r becomes four blocks [hi lo hi hi] of W, hi = fp16(scale * v)
   and lo = fp16(scale * v - hi) (the difference exact in fp32), so that the first three blocks
   of a row of A (hi lo hi) against the last three of a row of B (lo hi hi) sum, in this order,
   hi*lo + lo*hi + hi*hi (why this order: qk__tc_products). */
template <typename T, typename O, bool SPLIT>
__global__ void __launch_bounds__(256)
qk__k_tc_operand(const T *__restrict__ in, int64_t n, int64_t W, int rot, T scale, O *__restrict__ out)
{
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const T v = rot ? ((e & 1) ? -in[e - 1] : in[e + 1]) : in[e];
        if constexpr (SPLIT) {
            const float sv = (float)(v * scale);
            const O hi = qk__cvt(sv, (O *)nullptr), lo = qk__cvt(sv - qk__f(hi), (O *)nullptr);
            const int64_t r = e / W, k = e - r * W;
            O *o = out + r * 4 * W + k;
            o[0] = hi; o[W] = lo; o[2 * W] = hi; o[3 * W] = hi;
        } else out[e] = qk__cvt(v * scale, (O *)nullptr);
    }
}

/* Gauss's form of the complex product (qk__tc_products, complex states, every tensor-core mode
   but FP64): rows of D interleaved complex values into planes of D real values, plane p of the
   set bits of sel (0 re, 1 im, 2 re - im, 3 re + im) written as the j-th plane out (j counts the
   set bits below p), each pstride values apart; a plane's row is ld values, one row of
   scale * v rounded to O, or with SPLIT (FP32X3) the four blocks [hi lo hi hi] of qk__k_tc_operand. */
template <typename O, bool SPLIT>
__global__ void __launch_bounds__(256)
qk__k_tc_operand3(const float *__restrict__ in, int64_t n, int64_t D, unsigned sel, float scale, O *__restrict__ out,
                  int64_t pstride)
{
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / D, k = e - r * D;
        qk__gauss_store<O, SPLIT>(((const float2 *)in)[e], sel, scale, out + r * (SPLIT ? 4 * D : D) + k, D, pstride);
    }
}

static qk_result qk__launch_tc_operand3(qk_gpu_engine mode, const void *src, int64_t rows, int64_t D, unsigned sel, float s16,
                                        void *dst, int64_t pstride, cudaStream_t st, qk__err *E)
{
    const int64_t n = rows * D;
    const unsigned g = (unsigned)std::min<int64_t>((n + 255) / 256, (int64_t)1 << 20);
    const float *in = (const float *)src;
    if (n <= 0) return QK_OK;
    switch (mode) {
    case QK_GPU_TC_TF32: qk__k_tc_operand3<float, false><<<g, 256, 0, st>>>(in, n, D, sel, 1.0f, (float *)dst, pstride); break;
    case QK_GPU_TC_FP32X3: qk__k_tc_operand3<__half, true><<<g, 256, 0, st>>>(in, n, D, sel, s16, (__half *)dst, pstride); break;
    case QK_GPU_TC_FP16: qk__k_tc_operand3<__half, false><<<g, 256, 0, st>>>(in, n, D, sel, s16, (__half *)dst, pstride); break;
    case QK_GPU_TC_BF16: qk__k_tc_operand3<__nv_bfloat16, false><<<g, 256, 0, st>>>(in, n, D, sel, s16, (__nv_bfloat16 *)dst, pstride); break;
    default: return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: Gauss's planes take an fp32 tensor-core engine");
    }
    QK_LAUNCH_CK("qk__k_tc_operand3");
    return QK_OK;
}

/* qk__k_tc_operand for tensor-core engine mode (QK_GPU_TC_*): rows x W values of src into dst, a grid-stride loop
   of at most 2^20 blocks. */
static qk_result qk__launch_tc_operand(qk_gpu_engine mode, const void *src, int64_t rows, int64_t W, int rot, float s16, void *dst,
                                       cudaStream_t st, qk__err *E)
{
    const int64_t n = rows * W;
    const unsigned g = (unsigned)std::min<int64_t>((n + 255) / 256, (int64_t)1 << 20);
    if (n <= 0) return QK_OK;
    switch (mode) {
    case QK_GPU_TC_TF32: qk__k_tc_operand<float, float, false><<<g, 256, 0, st>>>((const float *)src, n, W, rot, 1.0f, (float *)dst); break;
    case QK_GPU_TC_FP32X3: qk__k_tc_operand<float, __half, true><<<g, 256, 0, st>>>((const float *)src, n, W, rot, s16, (__half *)dst); break;
    case QK_GPU_TC_FP16: qk__k_tc_operand<float, __half, false><<<g, 256, 0, st>>>((const float *)src, n, W, rot, s16, (__half *)dst); break;
    case QK_GPU_TC_BF16: qk__k_tc_operand<float, __nv_bfloat16, false><<<g, 256, 0, st>>>((const float *)src, n, W, rot, s16, (__nv_bfloat16 *)dst); break;
    default: qk__k_tc_operand<double, double, false><<<g, 256, 0, st>>>((const double *)src, n, W, rot, 1.0, (double *)dst); break;
    }
    QK_LAUNCH_CK("qk__k_tc_operand");
    return QK_OK;
}

/* Complex states on a tensor-core engine other than FP64 take Gauss's three products (below);
   QK_TC_4M=1 (measurement) keeps the four-product real form. */
static bool qk__tc_gauss(qk_gpu_engine mode, bool cplx)
{
    const char *e = getenv("QK_TC_4M");
    return cplx && qk__engine_tc(mode) && mode != QK_GPU_TC_FP64 && !(e && e[0] == '1');
}

/* planes: the rows are Gauss's operand planes already (qk__op_planes): the three planes of C only */
template <typename T, bool CPLX>
static size_t qk__blas_ws_bytes(qk_gpu_engine mode, int64_t rows, int64_t cols, int64_t D, bool planes = false)
{
    /* keep in step with qk.h's qk__blas_ws (the planner counts these bytes): the larger of the
       real form's (two planes of C; operands for the rows, the columns and the rotated columns)
       and Gauss's (three planes; three operand planes of D values each for the rows and for the
       columns, or four for rows that are also the columns) */
    const size_t c = (size_t)rows * (size_t)cols * (CPLX ? 2 : 1) * sizeof(T);
    const size_t W = (size_t)D * (CPLX ? 2 : 1);
    if (!qk__engine_tc(mode)) return c;
    if (planes && CPLX) return c / 2 * 3 + 512;
    if (mode == QK_GPU_TC_FP64) return c + 512 + (CPLX ? (size_t)cols * W * 8 : 0);
    const size_t per = mode == QK_GPU_TC_FP32X3 ? 8 * W : mode == QK_GPU_TC_TF32 ? 4 * W : 2 * W;
    const size_t four = c + 512 + per * ((size_t)rows + (size_t)cols * (CPLX ? 2 : 1));
    if (!CPLX) return four;
    const size_t r = (size_t)rows, cl = (size_t)cols, mx = std::max(r, cl);
    const size_t gauss = c / 2 * 3 + 512 + per / 2 * std::max(4 * mx, 3 * (r + cl));
    return std::max(four, gauss);
}


/* Gauss's form (qk__tc_gauss): with a = ar + i ai and b = br + i bi (D real values each),
       T1 = ar . br,   T2 = ai . bi,   T3 = (ar - ai) . (br + bi),
       Re <a|b> = T1 + T2,   Im <a|b> = T3 - T1 + T2,
   three real products of length D where the real form takes two of length 2D: 3/4 of the
   multiply-adds, one more plane of C for the epilogue to read. Each product is laid out, split,
   ordered and chunked as the real form's (FP32X3: [hi lo hi hi] rows, the small products first,
   hi*hi in chunks of the real form's length). Operands: planes re, im, re - im of the rows of A and
   re, im, re + im of the rows of B (four planes once when A and B are the same rows); C: the
   planes T1, T2, T3 (T3 not computed for linear, where K = Re). */
/* Called by the tensor-core products after each block of rows of a diagonal block (trap): rows
   [r0, r1), columns [r0, nn) of C are final (qk__launch_blas starts their epilogue). */
struct qk__blk_done {
    qk_result (*fn)(void *ctx, int64_t r0, int64_t r1);
    void *ctx;
};

/* Rows that are Gauss's operand planes already (the fp16, bf16 and fp32x3 engines; the state
   builder wrote them, qk__planes_out): A and B point at their rows in plane 0 (re), a row of the
   operand's length (D, fp32x3 4D); the planes im, re - im, re + im follow psa (A's) and psb (B's)
   values apart. */
struct qk__op_planes {
    int64_t psa, psb;
};

/* Under QK_TEST_FAULTS, qk_cuda_test_gauss() counts qk__tc_gauss_products' calls. */
#ifdef QK_TEST_FAULTS
static std::atomic<int> qk__gauss_calls{0};
extern "C" int qk_cuda_test_gauss(void) { return qk__gauss_calls.load(); }
#define QK__TEST_GAUSS() (++qk__gauss_calls)
#else
#define QK__TEST_GAUSS() ((void)0)
#endif
template <typename T, bool CPLX>
static qk_result qk__tc_gauss_products(cublasHandle_t h, qk_gpu_engine mode, const void *A, const void *B, int64_t m, int64_t nn,
                                       int D, int q, void *Cw, bool trap, int linear, qk__blk_done bd, cudaStream_t st,
                                       qk__err *E, const qk__op_planes *pp)
{
    const bool same = A == B, x3 = mode == QK_GPU_TC_FP32X3;
    if (pp && mode == QK_GPU_TC_TF32)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: internal error: operand planes given to the tf32 engine");
    const int64_t ld = x3 ? 4 * (int64_t)D : D, offb = x3 ? D : 0;
    QK__TEST_GAUSS();
    const size_t vb = mode == QK_GPU_TC_TF32 ? 4 : 2;
    /* the hi*hi chunks of the real form's length: W / 2 below W = 2048, W / 4 from it on */
    const int nck = x3 ? (2 * D >= 2048 ? 2 : 1) : 1;
    const int64_t Dc = (int64_t)D / nck, K0 = x3 ? 2 * (int64_t)D + Dc : D;
    const float s16 = mode == QK_GPU_TC_TF32 ? 1.0f : ldexpf(1.0f, q / 2);
    const cudaDataType_t ty = mode == QK_GPU_TC_BF16 ? CUDA_R_16BF : mode == QK_GPU_TC_TF32 ? CUDA_R_32F : CUDA_R_16F;
    const cublasComputeType_t ct = mode == QK_GPU_TC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float a32 = 1.0f / (s16 * s16), b32 = 0.0f, one32 = 1.0f;
    T *C = (T *)Cw;
    char *ops = (char *)Cw + ((size_t)m * nn * 3 * sizeof(T) + 255) / 256 * 256;
    const char *pa[3], *pb[3];
    if (pp) {     /* A: re, im, re - im; B: re, im, re + im, where the state builder wrote them */
        for (int t = 0; t < 3; ++t) pa[t] = (const char *)A + (size_t)(t * pp->psa) * vb;
        pb[0] = (const char *)B; pb[1] = (const char *)B + (size_t)pp->psb * vb; pb[2] = (const char *)B + (size_t)(3 * pp->psb) * vb;
    } else if (same) {   /* re, im, re - im, re + im of max(m, nn) rows */
        const int64_t rb = std::max(m, nn), ps = rb * ld;
        QK_TRY(qk__launch_tc_operand3(mode, A, rb, D, 0xFu, s16, ops, ps, st, E));
        for (int t = 0; t < 3; ++t) pa[t] = ops + (size_t)(t * ps) * vb;
        pb[0] = pa[0]; pb[1] = pa[1]; pb[2] = ops + (size_t)(3 * ps) * vb;
    } else {      /* B: re, im, re + im; A: re, im, re - im */
        const int64_t psb = nn * ld, psa = m * ld;
        char *oa = ops + (size_t)(3 * psb) * vb;
        QK_TRY(qk__launch_tc_operand3(mode, B, nn, D, 0xBu, s16, ops, psb, st, E));
        QK_TRY(qk__launch_tc_operand3(mode, A, m, D, 0x7u, s16, oa, psa, st, E));
        for (int t = 0; t < 3; ++t) { pb[t] = ops + (size_t)(t * psb) * vb; pa[t] = oa + (size_t)(t * psa) * vb; }
    }
    auto gemm = [&](int t, int64_t r0, int64_t r1, int64_t c0, int64_t k0, int64_t kk, bool acc) -> qk_result {
        const void *bp = pb[t] + (size_t)(c0 * ld + offb + k0) * vb;
        const void *ap = pa[t] + (size_t)(r0 * ld + k0) * vb;
        QK_BLAS_CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)(nn - c0), (int)(r1 - r0), (int)kk, &a32, bp, ty, (int)ld, ap, ty,
                                (int)ld, acc ? &one32 : &b32, C + (size_t)t * m * nn + r0 * nn + c0, CUDA_R_32F, (int)nn, ct,
                                CUBLAS_GEMM_DEFAULT));
        return QK_OK;
    };
    /* blocks of rows from the diagonal, as the real form's */
    const int64_t bs = trap ? std::max<int64_t>(512, ((m + 15) / 16 + 255) / 256 * 256) : m;
    for (int64_t r0 = 0; r0 < m; r0 += bs) {
        const int64_t r1 = std::min(m, r0 + bs), c0 = trap ? r0 : 0;
        for (int t = 0; t < (linear ? 2 : 3); ++t) {
            QK_TRY(gemm(t, r0, r1, c0, 0, K0, false));
            for (int j = 1; j < nck; ++j) QK_TRY(gemm(t, r0, r1, c0, 2 * (int64_t)D + j * Dc, Dc, true));
        }
        if (trap && bd.fn) QK_TRY(bd.fn(bd.ctx, r0, r1));
    }
    return QK_OK;
}

/* g3: Gauss's form (qk__tc_gauss, read once by the caller, whose epilogue reads the planes these
   products write) */
template <typename T, bool CPLX>
static qk_result qk__tc_products(cublasHandle_t h, qk_gpu_engine mode, const void *A, const void *B, int64_t m, int64_t nn, int D,
                                 void *Cw, bool trap, int linear, int g3, qk__blk_done bd, cudaStream_t st, qk__err *E,
                                 const qk__op_planes *pp = nullptr)
{
    const bool f64 = sizeof(T) == 8;
    if (f64 != (mode == QK_GPU_TC_FP64) || !qk__engine_tc(mode))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: tensor-core engine (plan.engine) does not match the precision");
    int q = 0;
    while (((int64_t)1 << q) < D) ++q;
    if (q > QK__TC_MAX_QUBITS) return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "qk_cuda_gram: tensor-core engines take at most 24 qubits");
    if constexpr (CPLX && sizeof(T) == 4)
        if (g3) return qk__tc_gauss_products<T, CPLX>(h, mode, A, B, m, nn, D, q, Cw, trap, linear, bd, st, E, pp);
    if (pp) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: internal error: operand planes outside Gauss's form");
    const int64_t W = CPLX ? 2 * (int64_t)D : D;
    const bool same = A == B;
    const int64_t rb = same ? std::max(m, nn) : nn; /* rows of B converted (the rows of A too when same) */
    T *Cre = (T *)Cw, *Cim = Cre + m * nn;
    char *ops = (char *)Cw + ((size_t)m * nn * (CPLX ? 2 : 1) * sizeof(T) + 255) / 256 * 256;
    const size_t vb = mode == QK_GPU_TC_TF32 ? 4 : mode == QK_GPU_TC_FP64 ? 8 : 2; /* bytes per operand value */
    const int64_t ld = mode == QK_GPU_TC_FP32X3 ? 4 * W : W, offb = mode == QK_GPU_TC_FP32X3 ? W : 0;
    /* FP32X3: the hi*hi block (the last W of K) in nck chunks, the first chunk with the small products */
    const bool x3 = mode == QK_GPU_TC_FP32X3;
    const int nck = x3 ? (W >= 2048 ? 4 : 2) : 1;
    const int64_t Wc = x3 ? W / nck : W, K0 = x3 ? 2 * W + Wc : W;
    const float s16 = x3 || mode == QK_GPU_TC_FP16 || mode == QK_GPU_TC_BF16 ? ldexpf(1.0f, q / 2) : 1.0f;
    const cudaDataType_t ty = mode == QK_GPU_TC_FP64 ? CUDA_R_64F : x3 || mode == QK_GPU_TC_FP16 ? CUDA_R_16F
                            : mode == QK_GPU_TC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t cty = mode == QK_GPU_TC_FP64 ? CUDA_R_64F : CUDA_R_32F;
    const cublasComputeType_t ct = mode == QK_GPU_TC_FP64 ? CUBLAS_COMPUTE_64F : mode == QK_GPU_TC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float a32 = 1.0f / (s16 * s16), b32 = 0.0f, one32 = 1.0f;
    const double a64 = 1.0, b64 = 0.0;

    /* operands: rows of B (xb), rotated rows of B (xr), rows of A (xa) */
    auto conv = [&](const void *src, int64_t rows, int rot, void *dst) -> qk_result {
        return qk__launch_tc_operand(mode, src, rows, W, rot, s16, dst, st, E);
    };
    const void *xa, *xb, *xr = nullptr;
    char *p = ops;
    if (mode == QK_GPU_TC_FP64) {
        xa = A; xb = B;
        if (CPLX) { QK_TRY(conv(B, nn, 1, p)); xr = p; }
    } else {
        QK_TRY(conv(B, rb, 0, p)); xb = p; p += (size_t)rb * ld * vb;
        if (CPLX) { QK_TRY(conv(B, nn, 1, p)); xr = p; p += (size_t)nn * ld * vb; }
        if (same) xa = xb;
        else { QK_TRY(conv(A, m, 0, p)); xa = p; }
    }
    /* C rows [r0, r1) x columns [c0, nn) of one plane: column-major (nn x m) = op^T A, over
       k in [k0, k0 + kk) of the operand windows; acc adds C (beta = 1) */
    auto gemm = [&](const void *bop, int64_t r0, int64_t r1, int64_t c0, T *C, int64_t k0, int64_t kk, bool acc) -> qk_result {
        const void *bp = (const char *)bop + (size_t)(c0 * ld + offb + k0) * vb;
        const void *ap = (const char *)xa + (size_t)(r0 * ld + k0) * vb;
        const void *al = f64 ? (const void *)&a64 : (const void *)&a32;
        const void *be = f64 ? (const void *)&b64 : acc ? (const void *)&one32 : (const void *)&b32;
        QK_BLAS_CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)(nn - c0), (int)(r1 - r0), (int)kk, al, bp, ty, (int)ld, ap, ty,
                                (int)ld, be, C + r0 * nn + c0, cty, (int)nn, ct, CUBLAS_GEMM_DEFAULT));
        return QK_OK;
    };
    /* blocks of rows from the diagonal: 8 of them (256-aligned, at least 512 rows) */
    const int64_t bs = trap ? std::max<int64_t>(512, ((m + 15) / 16 + 255) / 256 * 256) : m;
    for (int64_t r0 = 0; r0 < m; r0 += bs) {
        const int64_t r1 = std::min(m, r0 + bs), c0 = trap ? r0 : 0;
        for (int pl = 0; pl < (CPLX ? 2 : 1); ++pl) {
            const void *bop = pl ? xr : xb;
            T *C = pl ? Cim : Cre;
            QK_TRY(gemm(bop, r0, r1, c0, C, 0, K0, false));
            for (int j = 1; j < nck; ++j) QK_TRY(gemm(bop, r0, r1, c0, C, 2 * W + j * Wc, Wc, true));
        }
        if (trap && bd.fn) QK_TRY(bd.fn(bd.ctx, r0, r1));
    }
    return QK_OK;
}

/* cuBLAS: C (m x nn row-major, ldc = nn) holds <b_j|a_i> (the conjugate of <a_i|b_j>; |.|^2
   does not care): column-major nn x m = B^H A. For a diagonal block of K(X,X) (tri, doff == 0)
   the m x m square is one HERK/SYRK (lower triangle in column-major = j >= i, half the flops)
   and the rest a GEMM; then the fused epilogue. CUBLAS_3M: CGEMM3M (Gauss: 3 real products instead
   of 4) for complex fp32. Modes 3..7: the tensor-core engines above (Re and Im planes). linear
   (plan.linear): the epilogue writes C itself, not |C|^2 (density matrices). pp: A and B are
   Gauss's operand planes already (qk__op_planes; the caller chose Gauss's form). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_blas(cublasHandle_t h, qk_gpu_engine mode, const void *A, const void *B, int64_t m, int64_t nn, int D,
                                 void *Cw, OutT *out, int64_t ld, OutT *mout, int64_t doff, int tri,
                                 cudaStream_t st, qk__err *E, cudaStream_t est = nullptr, cudaEvent_t gemm_done = nullptr,
                                 int linear = 0, const qk__op_planes *pp = nullptr)
{
    QK_BLAS_CK(cublasSetStream(h, st));
    const size_t es = CPLX ? 2 * sizeof(T) : sizeof(T);
    const bool tc = qk__engine_tc(mode);
    const int g3 = tc && (pp || qk__tc_gauss(mode, CPLX));   /* three planes of C (qk__tc_gauss_products) */
    if (pp && !tc) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: internal error: operand planes outside the tensor-core engines");
    if (qk__poison_gemm) /* tests: every entry the epilogue reads must come from a GEMM (NaN otherwise) */
        QK_CK(cudaMemsetAsync(Cw, 0xFF, (size_t)m * (size_t)nn * (g3 ? 3 * sizeof(T) : es), st));
    /* With an epilogue stream (est), a diagonal block's epilogue runs per block of rows as the
       tensor-core products finish them, under the next block's GEMMs */
    const bool trap = tri && doff == 0 && m <= nn, blocked = tc && trap && est && gemm_done;
    struct Blk {
        const void *Cw; int64_t m, nn, ld, plane; OutT *out, *mout; int tri, linear, g3;
        cudaStream_t st, est; cudaEvent_t ev; qk__err *E;
    } bk = {Cw, m, nn, ld, tc && CPLX ? m * nn : 0, out, mout, tri, linear, g3, st, est, gemm_done, E};
    qk__blk_done bd = {nullptr, &bk};
    if (blocked)
        bd.fn = [](void *c, int64_t r0, int64_t r1) -> qk_result {
            Blk &b = *(Blk *)c;
            qk__err *E = b.E;
            QK_CK(cudaEventRecord(b.ev, b.st));
            QK_CK(cudaStreamWaitEvent(b.est, b.ev, 0));
            /* rows [r0, r1), columns [r0, nn): the square from (r0, r0), doff 0, C's rows nn apart */
            return qk__launch_epilogue<T, CPLX, OutT>((const T *)b.Cw + r0 * b.nn + r0, r1 - r0, b.nn - r0, b.out + r0 * b.ld + r0, b.ld,
                                                      b.mout ? b.mout + r0 * b.ld + r0 : nullptr, 0, b.tri, b.plane, b.linear, b.g3,
                                                      b.est, E, b.nn);
        };
    if (tc) QK_TRY((qk__tc_products<T, CPLX>(h, mode, A, B, m, nn, D, Cw, trap, linear, g3, bd, st, E, pp)));
    if (blocked) return QK_OK;
    int64_t c0 = tc ? nn : 0; /* first column done by GEMM */
    if (!tc && tri && doff == 0 && m <= nn) {
        if (CPLX) {
            if (sizeof(T) == 4) {
                float one = 1, zero = 0;
                QK_BLAS_CK(cublasCherk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_C, (int)m, D, &one, (const cuComplex *)A, D, &zero,
                                       (cuComplex *)Cw, (int)nn));
            } else {
                double one = 1, zero = 0;
                QK_BLAS_CK(cublasZherk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_C, (int)m, D, &one, (const cuDoubleComplex *)A, D,
                                       &zero, (cuDoubleComplex *)Cw, (int)nn));
            }
        } else {
            if (sizeof(T) == 4) {
                float one = 1, zero = 0;
                QK_BLAS_CK(cublasSsyrk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, (int)m, D, &one, (const float *)A, D, &zero,
                                       (float *)Cw, (int)nn));
            } else {
                double one = 1, zero = 0;
                QK_BLAS_CK(cublasDsyrk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, (int)m, D, &one, (const double *)A, D, &zero,
                                       (double *)Cw, (int)nn));
            }
        }
        c0 = m;
    }
    const int64_t gn = nn - c0;
    const void *Bg = (const char *)B + c0 * D * es;
    void *Cg = (char *)Cw + c0 * es;
    if (gn > 0) {
        if (CPLX) {
            if (sizeof(T) == 4) {
                cuComplex one = make_cuComplex(1, 0), zero = make_cuComplex(0, 0);
                if (mode == QK_GPU_CUBLAS_3M)
                    QK_BLAS_CK(cublasCgemm3m(h, CUBLAS_OP_C, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const cuComplex *)Bg, D,
                                             (const cuComplex *)A, D, &zero, (cuComplex *)Cg, (int)nn));
                else
                    QK_BLAS_CK(cublasCgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const cuComplex *)Bg, D,
                                           (const cuComplex *)A, D, &zero, (cuComplex *)Cg, (int)nn));
            } else {
                cuDoubleComplex one = make_cuDoubleComplex(1, 0), zero = make_cuDoubleComplex(0, 0);
                QK_BLAS_CK(cublasZgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const cuDoubleComplex *)Bg, D,
                                       (const cuDoubleComplex *)A, D, &zero, (cuDoubleComplex *)Cg, (int)nn));
            }
        } else {
            if (sizeof(T) == 4) {
                float one = 1, zero = 0;
                QK_BLAS_CK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const float *)Bg, D,
                                       (const float *)A, D, &zero, (float *)Cg, (int)nn));
            } else {
                double one = 1, zero = 0;
                QK_BLAS_CK(cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const double *)Bg, D,
                                       (const double *)A, D, &zero, (double *)Cg, (int)nn));
            }
        }
    }
    /* the epilogue (memory-bound) may run on its own stream, under the next slab's GEMM
       (compute-bound): zz 8 qubits spends ~10% of its time here */
    if (est && gemm_done) {
        QK_CK(cudaEventRecord(gemm_done, st));
        QK_CK(cudaStreamWaitEvent(est, gemm_done, 0));
        st = est;
    }
    return qk__launch_epilogue<T, CPLX, OutT>(Cw, m, nn, out, ld, mout, doff, tri, tc && CPLX ? m * nn : 0, linear, g3, st, E);
}

