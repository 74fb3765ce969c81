/* ======================================================================================== */
/* >>common ---- the device program's structs, complex helpers, the float/double dispatcher, triangular grid, tile store ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"

enum { QK__I_GATE = 1, QK__I_CNOT, QK__I_DIAG };

struct qk__instr {
    int kind;
    int q0, q1;         /* global qubits (GATE: q0; CNOT: control q0, target q1) */
    int b0, b1;         /* the same as bits of the in-chunk index (filled per pass) */
    int off;            /* GATE: offset of its 8 values (2x2 complex) in the sample's params;
                           DIAG: offset of its 1 + q + q*q coefficients */
    int h;              /* GATE: 1 where it is a Hadamard (the structured pass needs no matrix) */
};

/* A param job: one GATE matrix or one phase coefficient of a sample. */
struct qk__job {
    int kind;           /* 0: gate matrix, 1: phase coefficient, 2: a folded qubit's 2-vector */
    int op;             /* gate: op index */
    int out;            /* offset in the sample's params */
    int c0, c1;         /* coefficient, folded qubit: contributions [c0, c1) */
};

struct qk__contrib {
    int op;             /* -1: constant */
    double m, k;        /* value (m * theta(op) + k) */
};

static const int QK__LMAX = QK__PASS_QUBITS; /* qk.h's >>engine: the planner counts with it */
#define QK__MAXQ 30

struct qk__pass {
    int L;              /* qubits in the chunk */
    int pos[QK__MAXQ];  /* in-chunk bit r -> global qubit (ascending) */
    int npos[QK__MAXQ]; /* the q - L qubits fixed per block (ascending) */
    int a;              /* pos[i] == i for i < a */
    int i0, i1;         /* instructions [i0, i1) */
    int first;          /* 1: start from |0> (or the amplitude data) instead of loading */
    int fold;           /* first pass: offset of the q folded qubit 2-vectors in the params, or -1 */
};

/* ---- small complex helpers ---- */
template <typename T> struct qk__cx { T x, y; };
template <typename T> struct qk__vec2;
template <> struct qk__vec2<float> { typedef float2 t; typedef float4 t4; };
template <> struct qk__vec2<double> { typedef double2 t; typedef double2 t4; };

/* float: reduce to [-pi, pi] (the phase sum is up to ~10^3 rad), then the hardware sincos
   (|error| < 1e-6 there, under the float state's own rounding) */
__device__ __forceinline__ void qk__sincos(float a, float *s, float *c)
{
    a -= 6.28318530717958647692f * rintf(a * 0.15915494309189533577f);
    __sincosf(a, s, c);
}
__device__ __forceinline__ void qk__sincos(double a, double *s, double *c) { sincos(a, s, c); }

/* ---- tensor-core and cp.async helpers (sm_80+) ---- */
/* Tensor-core operands (qk__tc_products, the few-qubit tensor-core kernel): x rounded to TF32
   (10 stored mantissa bits) to nearest, ties away from zero, as cvt.rna.tf32.f32 does (finite x:
   a carry into the exponent is the right result). */
/* The sum of v over a block of 256 threads, in a fixed order (red: the block's __shared__
   double[256]); every thread gets it. */
__device__ __forceinline__ double qk__block_sum256(double *red, double v)
{
    red[threadIdx.x] = v;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
        __syncthreads();
    }
    return red[0];
}

/* The block's largest v (256 threads); red is shared, free again after the call's last barrier. */
__device__ __forceinline__ double qk__block_max256(double *red, double v)
{
    __syncthreads();   /* red's previous use is over */
    red[threadIdx.x] = v;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h) red[threadIdx.x] = fmax(red[threadIdx.x], red[threadIdx.x + h]);
        __syncthreads();
    }
    const double r = red[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float qk__tf32_rna(float x)
{
    return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}
/* The tensor-core engines' roundings of an operand value (TF32 round-to-nearest-away, fp16 and
   bfloat16 to nearest even; double kept) and fp16 back to float. */
__device__ __forceinline__ float qk__cvt(float v, float *) { return qk__tf32_rna(v); }
__device__ __forceinline__ __half qk__cvt(float v, __half *) { return __float2half_rn(v); }
__device__ __forceinline__ __nv_bfloat16 qk__cvt(float v, __nv_bfloat16 *) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ double qk__cvt(double v, double *) { return v; }
__device__ __forceinline__ float qk__f(__half h) { return __half2float(h); }
/* Gauss's operand planes (qk__tc_gauss_products) of one complex amplitude z: plane p of the set
   bits of sel (0 re, 1 im, 2 re - im, 3 re + im) as scale * value rounded to O, the j-th set
   bit's at o + j * pstride; SPLIT (FP32X3): the four blocks [hi lo hi hi], D apart, of
   qk__k_tc_operand. The operand pass (qk__k_tc_operand3) and the state builder that writes the
   planes itself (qk__k_states_fz) both store through here, so that both round alike. */
template <typename O, bool SPLIT>
__device__ __forceinline__ void qk__gauss_store(float2 z, unsigned sel, float scale, O *o, int64_t D, int64_t pstride)
{
    const float v[4] = {z.x, z.y, z.x - z.y, z.x + z.y};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        if (!((sel >> p) & 1u)) continue;
        const float sv = v[p] * scale;
        if constexpr (SPLIT) {
            const O hi = qk__cvt(sv, (O *)nullptr), lo = qk__cvt(sv - qk__f(hi), (O *)nullptr);
            o[0] = hi; o[D] = lo; o[2 * D] = hi; o[3 * D] = hi;
        } else *o = qk__cvt(sv, (O *)nullptr);
        o += pstride;
    }
}
__device__ __forceinline__ void qk__mma_tf32(float *c, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void qk__mma_f16(float *c, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* 16 bytes global -> shared without registers; bytes < 16 zero-fills the rest (past a last row) */
__device__ __forceinline__ void qk__cp16(void *smem, const void *g, int bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qk__cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void qk__cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Angle of op `op` of a sample (qk__angle_value, shared with the CPU engine); -1: none, 0. */
__device__ double qk__theta(const qk_angle *ang, int op, const double *x, const double *w)
{
    if (op < 0) return 0.0;
    return qk__angle_value(&ang[op], x, w);
}

/* The one float/double dispatcher: f(qk__types<T, CPLX, OutT>()) with T = double where f64
   (else float), CPLX = cplx and OutT = double where out64 (else float). The plan's precision,
   path and output dtype select one instance of a templated step this way. */
template <typename T_, bool CPLX_, typename OutT_> struct qk__types {
    typedef T_ T;
    typedef OutT_ OutT;
    static const bool CPLX = CPLX_;
};
template <typename F> static qk_result qk__dispatch(bool f64, bool cplx, bool out64, F &&f)
{
    if (f64) {
        if (cplx) return out64 ? f(qk__types<double, true, double>()) : f(qk__types<double, true, float>());
        return out64 ? f(qk__types<double, false, double>()) : f(qk__types<double, false, float>());
    }
    if (cplx) return out64 ? f(qk__types<float, true, double>()) : f(qk__types<float, true, float>());
    return out64 ? f(qk__types<float, false, double>()) : f(qk__types<float, false, float>());
}

/* The triangular grid of a diagonal block of K(X,X) in square tiles: grid (Tx, Ty) becomes a
   1-D grid over the tiles on or above the diagonal (row r of the tile grid holds Tx - r of
   them); returns Tx, the kernels' tgrid, which qk__tile_of inverts on the device. */
static int qk__tri_grid(dim3 *grid)
{
    const int64_t Tx = grid->x, Ty = grid->y;
    *grid = dim3((unsigned)(Ty * Tx - Ty * (Ty - 1) / 2), 1);
    return (int)Tx;
}

/* Block -> tile. tgrid > 0 (square tiles, a diagonal block of K(X,X)): a 1-D grid over the
   tiles with column >= row of a tile grid with tgrid columns, row r holding tgrid - r tiles,
   so no block is launched for a tile under the diagonal (half the grid; each empty block
   still cost a launch slot: zz 4 qubits, qk-bench). */
/* Tile L of the triangle (row r of a grid with T tile columns holding T - r tiles) -> (ty, tx). */
__device__ __forceinline__ void qk__tri_tile(int64_t L, int64_t T, int &ty, int &tx)
{
    const double b = 2.0 * (double)T + 1.0;
    int64_t i = (int64_t)floor((b - sqrt(b * b - 8.0 * (double)L)) * 0.5);
    if (i < 0) i = 0;
    while (i > 0 && i * T - i * (i - 1) / 2 > L) --i;
    while ((i + 1) * T - (i + 1) * i / 2 <= L) ++i;
    ty = (int)i;
    tx = (int)(i + (L - (i * T - i * (i - 1) / 2)));
}
__device__ __forceinline__ void qk__tile_of(int tgrid, int &ty, int &tx)
{
    if (tgrid == 0) { ty = blockIdx.y; tx = blockIdx.x; return; }
    qk__tri_tile(blockIdx.x, tgrid, ty, tx);
}

/* Writes a BM x BN tile staged in shared memory (Cs, row stride BN + 1) to K and, for a
   symmetric or off-diagonal block, its mirror. Rows r of the tile are rows row0 + r of the
   block, columns c are col0 + c; doff = (global column of block col 0) - (global row of block
   row 0). tri: write direct only where col >= row and mirror only where col > row (globally),
   so every entry of K is written once. Rows of both the tile and the mirror are stored by
   consecutive threads (coalesced). */
template <typename OutT, int BM, int BN, int NT>
__device__ __forceinline__ void qk__store_tile(const OutT *Cs, int row0, int col0, int m, int nn,
                                               OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout,
                                               int64_t doff, int tri, int vec)
{
    /* 16-byte stores where the whole tile is inside K and off the diagonal, and the caller
       checked alignment (ld a multiple of the vector, 16-byte aligned bases): the 4-qubit
       Gram is bound by these writes. */
    const int VW = 16 / sizeof(OutT);
    if (vec && row0 + BM <= m && col0 + BN <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM)) {
        typedef typename qk__vec2<OutT>::t4 V;
        for (int idx = threadIdx.x; idx < BM * BN / VW; idx += NT) {
            int r = idx / (BN / VW), c = (idx % (BN / VW)) * VW;
            V v;
            OutT *pv = (OutT *)&v;
#pragma unroll
            for (int k = 0; k < VW; ++k) pv[k] = Cs[r * (BN + 1) + c + k];
            *(V *)(out + (int64_t)(row0 + r) * ld + col0 + c) = v;
        }
        if (mout) {
            for (int idx = threadIdx.x; idx < BM * BN / VW; idx += NT) {
                int c = idx / (BM / VW), r = (idx % (BM / VW)) * VW;
                V v;
                OutT *pv = (OutT *)&v;
#pragma unroll
                for (int k = 0; k < VW; ++k) pv[k] = Cs[(r + k) * (BN + 1) + c];
                *(V *)(mout + (int64_t)(col0 + c) * ld + row0 + r) = v;
            }
        }
        return;
    }
    for (int idx = threadIdx.x; idx < BM * BN; idx += NT) {
        int r = idx / BN, c = idx % BN;
        int gi = row0 + r, gj = col0 + c;
        if (gi < m && gj < nn && (!tri || gj + doff >= gi)) out[(int64_t)gi * ld + gj] = Cs[r * (BN + 1) + c];
    }
    if (mout) {
        for (int idx = threadIdx.x; idx < BM * BN; idx += NT) {
            int c = idx / BM, r = idx % BM;
            int gi = row0 + r, gj = col0 + c;
            if (gi < m && gj < nn && (!tri || gj + doff > gi)) mout[(int64_t)gj * ld + gi] = Cs[r * (BN + 1) + c];
        }
    }
}

/* 16-byte stores are legal when both bases are 16-byte aligned and ld keeps rows aligned. */
template <typename OutT>
static int qk__vec_ok(const OutT *out, const OutT *mout, int64_t ld)
{
    const int VW = 16 / sizeof(OutT);
    return ld % VW == 0 && ((uintptr_t)out % 16) == 0 && (!mout || ((uintptr_t)mout % 16) == 0);
}

