/* qk_cuda.cu — the CUDA engine of qk: state construction, fused Gram kernels, the pipeline.

   Design
   ------
   A feature map (qk_map) is compiled on the host into a small device program:

     GATE  a 2x2 matrix on one qubit (H, X, Y, RX, RY, basis-X); the matrix of every GATE is
           evaluated once per sample by a prep kernel (in double, then rounded to the precision)
     CNOT  a permutation on two qubits
     DIAG  a run of diagonal ops (Z, RZ, P, CZ, RZZ, and CNOT(c,t) P(t) CNOT(c,t) which is the
           diagonal e^{i theta (b_c xor b_t)}) folded into one quadratic phase form
              phase(b) = c0 + sum_i c_i b_i + sum_{i<j} d_ij b_i b_j
           whose coefficients the prep kernel sums per sample in double and reduces mod 2 pi
           (so the float32 phase sum stays small: its ulp, not the angles, sets the error).
           A zz layer of q(q-1)/2 CNOT-P-CNOT triples is thus one pass over the amplitudes.

   States are built in shared memory: a pass loads 2^L amplitudes of a state (the amplitudes
   whose indices vary over L chosen qubits, the others fixed per block), applies every op of
   the program that touches only those qubits, and stores once. For q <= L (L = 13: 64 KB of
   complex64 or 128 KB of complex128, inside Hopper's 227 KB opt-in) the whole circuit is one
   pass that starts from |0> in shared memory: one global write per state. Larger states (up to
   30 qubits) take several passes; the scheduler packs ops greedily into passes and always keeps
   the low qubits in the set so that global accesses stay coalesced. Small states (2^q < 512)
   share a block, so a 4-qubit state does not leave a block of 8 threads alone on an SM.

   Gram: K[i][j] = |<a_i|b_j>|^2 (real maps: <a_i|b_j>^2 over real amplitudes). Two engines:
     fused   a register-tiled SIMT kernel: <a|b> accumulated in registers, |.|^2 and the store
             in its epilogue; tiles staged through shared memory so that both the tile and its
             mirror (symmetric K) are written with coalesced rows. No complex matrix in memory.
     blas    cuBLAS GEMM (C/Z/S/D) into a slab workspace, then a fused |.|^2 + mirror epilogue;
             for the tensor-core precision modes (TF32, FP32X3, FP16) real-form GEMMs of
             converted operands into Re and Im planes, the same epilogue (qk__tc_products).
   The planner picks one by qubit count (see qk__plan_cuda in qk.h for the measured reason).
   Symmetric K(X,X) computes only tiles with j >= i and writes both halves: each entry of K is
   written exactly once (the mirror writes only j > i).

   Product maps (no entangling op) never build states: per sample and qubit a 2-vector, and
   K[i][j] = prod_k |<u_k(x_i)|u_k(y_j)>|^2 (the analytic kernel).

   Output: K is produced in slabs of rows. K to the caller's device buffer: slabs straight into
   it. K to the host: when all of K fits the device budget it is kept resident (symmetric slabs
   mirror into later rows, so slab s is complete once slabs 0..s have run); each slab is copied
   D2H on a second stream while the next slab computes: straight into the caller's buffer when
   it is pinned, else into double-buffered pinned staging that qk.h's delivery hands on (a
   parallel copy into a pageable buffer, square tiles to the callback, the .npy stream). One synchronization per slab on the host side, none on the
   compute stream. When device memory runs out, the job is retried with smaller slabs and state
   tiles before it fails.

   Errors: every CUDA call goes through QK_CK, which records the expression, file and line in
   the caller's err buffer and returns a qk_result; every launch is followed by QK_LAUNCH_CK. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <chrono>
#include <thread>
#include <vector>
#include <algorithm>
#include "qk.h"
/* Profiler zones (qk_prof.h): they compile to nothing unless this file is built with
   -DQK_PROF_ENABLE (meson builds a second library, qk_cuda_prof, that way for qk-gram). */
#include "qk_prof.h"

/* ---- fault injection (tests) ---- */
/* qk_cuda_test_fail_alloc(k): the k-th resource acquisition from now on (cudaMalloc,
   cudaMallocHost, cudaStreamCreateWithFlags, cudaEventCreate[WithFlags], cublasCreate) fails as
   if out of memory (k < 0: the -k-th and every later one, so retries fail too); 0 turns it off. qk_cuda_test_alloc_count() counts the acquisitions so far,
   so that a test can fail each one of a job in turn (tests/gpu/test_gpu_engine.cpp). A test
   hook: not for concurrent use. The macros below route this file's calls through it. */
static int qk__fault_at = 0, qk__fault_seen = 0;
static bool qk__fault_persist = false;
static bool qk__fault_hit(void)
{
    ++qk__fault_seen;
    if (qk__fault_at > 0 && --qk__fault_at == 0) {
        if (qk__fault_persist) qk__fault_at = 1; /* and every later one */
        return true;
    }
    return false;
}
template <typename P> static cudaError_t qk__t_malloc(P **p, size_t n)
{
    if (qk__fault_hit()) return cudaErrorMemoryAllocation;
    return cudaMalloc((void **)p, n);
}
template <typename P> static cudaError_t qk__t_malloc_host(P **p, size_t n)
{
    if (qk__fault_hit()) return cudaErrorMemoryAllocation;
    return cudaMallocHost((void **)p, n);
}
static cudaError_t qk__t_stream(cudaStream_t *s, unsigned f)
{
    if (qk__fault_hit()) return cudaErrorMemoryAllocation;
    return cudaStreamCreateWithFlags(s, f);
}
static cudaError_t qk__t_event(cudaEvent_t *e) { return qk__fault_hit() ? cudaErrorMemoryAllocation : cudaEventCreate(e); }
static cudaError_t qk__t_event_flags(cudaEvent_t *e, unsigned f)
{
    return qk__fault_hit() ? cudaErrorMemoryAllocation : cudaEventCreateWithFlags(e, f);
}
static cublasStatus_t qk__t_blas(cublasHandle_t *h) { return qk__fault_hit() ? CUBLAS_STATUS_ALLOC_FAILED : cublasCreate_v2(h); }
#define cudaMalloc(p, n) qk__t_malloc((p), (n))
#define cudaMallocHost(p, n) qk__t_malloc_host((p), (n))
#define cudaStreamCreateWithFlags(s, f) qk__t_stream((s), (f))
#define cudaEventCreate(e) qk__t_event((e))
#define cudaEventCreateWithFlags(e, f) qk__t_event_flags((e), (f))
#undef cublasCreate /* cublas_v2.h: cublasCreate_v2 */
#define cublasCreate(h) qk__t_blas((h))
extern "C" void qk_cuda_test_fail_alloc(int k)
{
    qk__fault_persist = k < 0;
    qk__fault_at = k < 0 ? -k : k;
}
extern "C" int qk_cuda_test_alloc_count(void) { return qk__fault_seen; }

/* ---- errors ---- */
struct qk__err {
    char *buf;
    size_t size;
};

static qk_result qk__cuda_fail(qk__err *e, cudaError_t c, const char *expr, int line)
{
    qk_result r = (c == cudaErrorMemoryAllocation) ? QK_ERROR_DEVICE_OUT_OF_MEMORY : QK_ERROR_CUDA;
    if (e && e->buf && e->size)
        snprintf(e->buf, e->size, "%s at qk_cuda.cu:%d: %s", expr, line, cudaGetErrorString(c));
    cudaGetLastError(); /* clear a sticky-free error so the next call starts clean */
    return r;
}

static qk_result qk__blas_fail(qk__err *e, cublasStatus_t s, const char *expr, int line)
{
    qk_result r = (s == CUBLAS_STATUS_ALLOC_FAILED) ? QK_ERROR_DEVICE_OUT_OF_MEMORY : QK_ERROR_CUDA;
    if (e && e->buf && e->size) snprintf(e->buf, e->size, "%s at qk_cuda.cu:%d: cublas status %d", expr, line, (int)s);
    return r;
}

static qk_result qk__fail_msg(qk__err *e, qk_result r, const char *msg)
{
    if (e && e->buf && e->size) snprintf(e->buf, e->size, "%s", msg);
    return r;
}

#define QK_CK(expr) do { cudaError_t c_ = (expr); if (c_ != cudaSuccess) return qk__cuda_fail(E, c_, #expr, __LINE__); } while (0)
#define QK_BLAS_CK(expr) do { cublasStatus_t s_ = (expr); if (s_ != CUBLAS_STATUS_SUCCESS) return qk__blas_fail(E, s_, #expr, __LINE__); } while (0)
#define QK_LAUNCH_CK(name) QK_CK(cudaGetLastError())
#define QK_TRY(expr) do { qk_result r_ = (expr); if (r_ != QK_OK) return r_; } while (0)

/* ---- device program ---- */
enum { QK__I_GATE = 1, QK__I_CNOT, QK__I_DIAG };

/* Angle of one op, as qk_map_angles() defines it. */
struct qk__dangle {
    int kind, x0, x1, w;
    double scale, offset;
};

struct qk__instr {
    int kind;
    int q0, q1;         /* global qubits (GATE: q0; CNOT: control q0, target q1) */
    int b0, b1;         /* the same as bits of the in-chunk index (filled per pass) */
    int off;            /* GATE: offset of its 8 values (2x2 complex) in the sample's params;
                           DIAG: offset of its 1 + q + q*q coefficients */
};

/* A param job: one GATE matrix or one phase coefficient of a sample. */
struct qk__job {
    int kind;           /* 0: gate matrix, 1: coefficient */
    int op;             /* gate: op index */
    int out;            /* offset in the sample's params */
    int c0, c1;         /* coefficient: contributions [c0, c1) */
};

struct qk__contrib {
    int op;             /* -1: constant */
    double m, k;        /* value (m * theta(op) + k) */
};

static const int QK__LMAX = 13;
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

__device__ double qk__theta(const qk__dangle *ang, int op, const double *x, const double *w)
{
    if (op < 0) return 0.0;
    qk__dangle a = ang[op];
    double f = 0.0;
    const double PI = 3.14159265358979323846;
    switch (a.kind) {
    case QK_ARG_CONST: f = 0.0; break;
    case QK_ARG_X: f = x[a.x0]; break;
    case QK_ARG_XX: f = x[a.x0] * x[a.x1]; break;
    case QK_ARG_PIXX: f = (PI - x[a.x0]) * (PI - x[a.x1]); break;
    case QK_ARG_W: f = w[a.w]; break;
    case QK_ARG_WX: f = w[a.w] * x[a.x0]; break;
    default: f = 0.0;
    }
    return a.scale * f + a.offset;
}

/* ======================================================================================== */
/*                                        KERNELS                                           */
/* ======================================================================================== */

/* 2x2 matrix of a one-qubit gate: m00 re, im, m01 re, im, m10 re, im, m11 re, im. */
__device__ void qk__gate_matrix(int kind, double t, const double *xs, const qk__dangle *ang, int op, double *m)
{
    const double R = 0.70710678118654752440;
    double c = cos(0.5 * t), sn = sin(0.5 * t);
    for (int i = 0; i < 8; ++i) m[i] = 0;
    switch (kind) {
    case QK_OP_H: m[0] = R; m[2] = R; m[4] = R; m[6] = -R; break;
    case QK_OP_X: m[2] = 1; m[4] = 1; break;
    case QK_OP_Y: m[3] = -1; m[5] = 1; break;
    case QK_OP_RX: m[0] = c; m[3] = -sn; m[5] = -sn; m[6] = c; break;
    case QK_OP_RY: m[0] = c; m[2] = -sn; m[4] = sn; m[6] = c; break;
    case QK_OP_BASIS:
        if (xs[ang[op].x0] > 0.5) { m[2] = 1; m[4] = 1; } else { m[0] = 1; m[6] = 1; }
        break;
    default: m[0] = 1; m[6] = 1;
    }
}

/* Per-sample parameters: gate matrices and phase coefficients (double math, stored as T). */
template <typename T>
__global__ void qk__k_prep(const qk__job *__restrict__ jobs, int n_jobs, const qk__contrib *__restrict__ con,
                           const qk__dangle *__restrict__ ang, const int *__restrict__ op_kind,
                           const double *__restrict__ x, int64_t n, int d, const double *__restrict__ w,
                           T *__restrict__ params, int P)
{
    int64_t s = blockIdx.x;
    if (s >= n) return;
    const double *xs = x + s * d;
    T *ps = params + s * (int64_t)P;
    const double TWO_PI = 6.283185307179586476925;
    for (int j = threadIdx.x; j < n_jobs; j += blockDim.x) {
        qk__job jb = jobs[j];
        if (jb.kind == 1) {
            double v = 0.0;
            for (int c = jb.c0; c < jb.c1; ++c) v += con[c].m * qk__theta(ang, con[c].op, xs, w) + con[c].k;
            v -= TWO_PI * floor(v / TWO_PI);
            ps[jb.out] = (T)v;
        } else if (jb.kind == 2) {
            /* a folded qubit: its leading one-qubit gates applied to |0> */
            double u0r = 1, u0i = 0, u1r = 0, u1i = 0, m[8];
            for (int c = jb.c0; c < jb.c1; ++c) {
                qk__gate_matrix(op_kind[con[c].op], qk__theta(ang, con[c].op, xs, w), xs, ang, con[c].op, m);
                double a0r = m[0] * u0r - m[1] * u0i + m[2] * u1r - m[3] * u1i;
                double a0i = m[0] * u0i + m[1] * u0r + m[2] * u1i + m[3] * u1r;
                double a1r = m[4] * u0r - m[5] * u0i + m[6] * u1r - m[7] * u1i;
                double a1i = m[4] * u0i + m[5] * u0r + m[6] * u1i + m[7] * u1r;
                u0r = a0r; u0i = a0i; u1r = a1r; u1i = a1i;
            }
            ps[jb.out] = (T)u0r; ps[jb.out + 1] = (T)u0i; ps[jb.out + 2] = (T)u1r; ps[jb.out + 3] = (T)u1i;
        } else {
            double m[8];
            qk__gate_matrix(op_kind[jb.op], qk__theta(ang, jb.op, xs, w), xs, ang, jb.op, m);
            for (int i = 0; i < 8; ++i) ps[jb.out + i] = (T)m[i];
        }
    }
}

/* 1 / ||x||_2 per sample for amplitude encoding (the host validated non-zero norms). */
__global__ void qk__k_invnorm(const double *__restrict__ x, int64_t n, int d, double *__restrict__ inv)
{
    int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (s >= n) return;
    double acc = 0.0;
    for (int k = 0; k < d; ++k) acc += x[s * d + k] * x[s * d + k];
    inv[s] = 1.0 / sqrt(acc);
}

/* Shared table space per state (T values): the DIAG phase tables, or the folded start's two
   complex tables. */
__host__ __device__ inline int qk__tbl_size(int L)
{
    const int bl = L < 7 ? L : 7, bh = L - bl;
    const int ph = (1 << bl) + (1 << bh) + (bh << bl), fo = 2 * ((1 << bl) + (1 << bh));
    return ph > fo ? ph : fo;
}

/* In-chunk index -> amplitude index (q <= 30: 32-bit arithmetic throughout). */
__device__ __forceinline__ uint32_t qk__pdep(uint32_t r, const qk__pass &p)
{
    uint32_t g = r & ((1u << p.a) - 1);
    for (int i = p.a; i < p.L; ++i) if ((r >> i) & 1) g |= 1u << p.pos[i];
    return g;
}

template <typename T>
__device__ __forceinline__ T qk__phase(uint32_t g, const T *__restrict__ cf, int q)
{
    T ph = cf[0];
    uint32_t m = g;
    while (m) {
        int j = __ffs(m) - 1;
        m &= m - 1;
        ph += cf[1 + j];
        uint32_t lo = g & ((1u << j) - 1);
        const T *dj = cf + 1 + q + j;
        while (lo) {
            int i = __ffs(lo) - 1;
            lo &= lo - 1;
            ph += dj[i * q];
        }
    }
    return ph;
}

/* G one-qubit gates on distinct in-chunk bits applied in one sweep: each thread takes the 2^G
   amplitudes that differ in those bits into registers, applies the gates in program order and
   stores them back: one sweep and one barrier instead of G (zz: 13 H sweeps become 5). */
template <typename T, int G>
__device__ __forceinline__ void qk__gate_group(qk__cx<T> *a, int N, int lt, int tps, const int *bits,
                                               const T *const *ms)
{
    typedef qk__cx<T> C;
    T m[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < 8; ++i) m[g][i] = ms[g][i];
    int srt[G];
#pragma unroll
    for (int g = 0; g < G; ++g) srt[g] = bits[g];
#pragma unroll
    for (int i = 0; i < G; ++i)
#pragma unroll
        for (int j = 0; j + 1 < G - i; ++j)
            if (srt[j] > srt[j + 1]) { int tmp = srt[j]; srt[j] = srt[j + 1]; srt[j + 1] = tmp; }
    for (int t = lt; t < (N >> G); t += tps) {
        int base = t;
#pragma unroll
        for (int g = 0; g < G; ++g) base = ((base >> srt[g]) << (srt[g] + 1)) | (base & ((1 << srt[g]) - 1));
        C v[1 << G];
        int idx[1 << G];
#pragma unroll
        for (int k = 0; k < (1 << G); ++k) {
            int i = base;
#pragma unroll
            for (int g = 0; g < G; ++g) if ((k >> g) & 1) i |= 1 << bits[g];
            idx[k] = i;
            v[k] = a[i];
        }
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int k = 0; k < (1 << G); ++k) {
                if ((k >> g) & 1) continue;
                C x0 = v[k], x1 = v[k | (1 << g)], y0, y1;
                y0.x = m[g][0] * x0.x - m[g][1] * x0.y + m[g][2] * x1.x - m[g][3] * x1.y;
                y0.y = m[g][0] * x0.y + m[g][1] * x0.x + m[g][2] * x1.y + m[g][3] * x1.x;
                y1.x = m[g][4] * x0.x - m[g][5] * x0.y + m[g][6] * x1.x - m[g][7] * x1.y;
                y1.y = m[g][4] * x0.y + m[g][5] * x0.x + m[g][6] * x1.y + m[g][7] * x1.x;
                v[k] = y0;
                v[k | (1 << g)] = y1;
            }
#pragma unroll
        for (int k = 0; k < (1 << G); ++k) a[idx[k]] = v[k];
    }
}

/* One pass of the state program over chunks of 2^L amplitudes (see the design comment).
   Block: spb states x tps threads each; grid: (states / spb) * chunks. OUT_REAL writes the real
   part only (real maps). */
template <typename T, bool OUT_REAL>
__global__ void qk__k_pass(qk__pass p, const qk__instr *__restrict__ prog, int q,
                           const T *__restrict__ params, int P, int64_t n,
                           const double *__restrict__ amp_x, const double *__restrict__ amp_inv, int amp_d,
                           const qk__cx<T> *__restrict__ in, void *__restrict__ out, int spb, int tps)
{
    extern __shared__ __align__(16) unsigned char qk__smem[];
    typedef qk__cx<T> C;
    const int N = 1 << p.L;
    const int64_t nchunks = (int64_t)1 << (q - p.L);
    const int ls = threadIdx.x / tps, lt = threadIdx.x % tps;
    const int64_t blk = blockIdx.x;
    const int64_t chunk = blk % nchunks;
    const int64_t s = (blk / nchunks) * spb + ls;
    const bool active = s < n;
    C *a = (C *)qk__smem + (size_t)ls * N;
    /* phase tables of a DIAG, per state: bits of the in-chunk index r split into lo (bl bits)
       and hi (bh bits); phase(r) = TL[lo] + TH[hi] + sum_{j in hi} E[j][lo] (see qk__diag) */
    const int bl = p.L < 7 ? p.L : 7, bh = p.L - bl;
    const int TBL = qk__tbl_size(p.L);
    T *tb = (T *)((C *)qk__smem + (size_t)spb * N) + (size_t)ls * TBL;
    const int64_t D = (int64_t)1 << q;
    uint32_t fixed = 0;
    for (int i = 0; i < q - p.L; ++i) if ((chunk >> i) & 1) fixed |= 1u << p.npos[i];
    const T *ps = params + (active ? s : 0) * (int64_t)P;

    if (p.first && p.fold >= 0) {
        /* The folded leading gates make the start a product state: amplitude(g) =
           prod_k u_k[bit k of g] = TL[lo] * TH[hi] * F (F over the block's fixed bits). */
        if (active) {
            const T *u = ps + p.fold;
            C *TL = (C *)tb, *TH = TL + (1 << bl);
            for (int e = lt; e < (1 << bl) + (1 << bh); e += tps) {
                const bool lo = e < (1 << bl);
                const int v = lo ? e : e - (1 << bl), i0 = lo ? 0 : bl, nb = lo ? bl : bh;
                T ar = 1, ai = 0;
                for (int i = 0; i < nb; ++i) {
                    const T *uk = u + 4 * p.pos[i0 + i] + ((v >> i) & 1) * 2;
                    T br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                    ar = br; ai = bi;
                }
                if (!lo)
                    for (int i = 0; i < q - p.L; ++i) {
                        const T *uk = u + 4 * p.npos[i] + ((fixed >> p.npos[i]) & 1) * 2;
                        T br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                        ar = br; ai = bi;
                    }
                C z; z.x = ar; z.y = ai;
                if (lo) TL[v] = z; else TH[v] = z;
            }
        }
        __syncthreads();
    }
    if (active) {
        for (int r = lt; r < N; r += tps) {
            uint32_t g = fixed | qk__pdep(r, p);
            C v;
            if (p.first && p.fold >= 0) {
                const C *TL = (const C *)tb, *TH = TL + (1 << bl);
                C l = TL[r & ((1 << bl) - 1)], h = TH[r >> bl];
                v.x = l.x * h.x - l.y * h.y;
                v.y = l.x * h.y + l.y * h.x;
            } else if (p.first) {
                if (amp_x) {
                    v.x = (g < amp_d) ? (T)(amp_x[s * amp_d + g] * amp_inv[s]) : (T)0;
                    v.y = 0;
                } else {
                    v.x = (g == 0) ? (T)1 : (T)0;
                    v.y = 0;
                }
            } else {
                v = in[s * D + g];
            }
            a[r] = v;
        }
    }
    __syncthreads();
    for (int ii = p.i0; ii < p.i1; ++ii) {
        qk__instr in_ = prog[ii];
        if (in_.kind == QK__I_DIAG) {
            /* Tables first: the quadratic phase of 2^L amplitudes costs 2^bl + 2^bh full
               evaluations plus bh * 2^bl pair sums, then ~bh/2 shared loads per amplitude with
               no divergence (a warp shares hi). The direct sum per amplitude diverged on the
               popcount and cost ~5x more at 16 qubits (qk-bench zz16 states). */
            if (active) {
                const T *cf = ps + in_.off;
                T *TL = tb, *TH = tb + (1 << bl), *Et = TH + (1 << bh);
                const T qf = qk__phase<T>(fixed, cf, q);
                for (int e = lt; e < (1 << bl); e += tps) TL[e] = qk__phase<T>(fixed | qk__pdep(e, p), cf, q);
                for (int e = lt; e < (1 << bh); e += tps) TH[e] = qk__phase<T>(fixed | qk__pdep((uint32_t)e << bl, p), cf, q) - qf;
                for (int e = lt; e < (bh << bl); e += tps) {
                    int j = e >> bl, lo = e & ((1 << bl) - 1);
                    const T *dj = cf + 1 + q + p.pos[bl + j];
                    T acc = 0;
                    while (lo) {
                        int i = __ffs(lo) - 1;
                        lo &= lo - 1;
                        acc += dj[p.pos[i] * q];
                    }
                    Et[e] = acc;
                }
            }
            __syncthreads();
        }
        int G = 1;
        qk__instr g2 = in_, g3 = in_;
        if (in_.kind == QK__I_GATE && ii + 1 < p.i1) {
            g2 = prog[ii + 1];
            if (g2.kind == QK__I_GATE && g2.b0 != in_.b0) {
                G = 2;
                if (ii + 2 < p.i1) {
                    g3 = prog[ii + 2];
                    if (g3.kind == QK__I_GATE && g3.b0 != in_.b0 && g3.b0 != g2.b0) G = 3;
                }
            }
        }
        if (active && G > 1) {
            const int bits[3] = {in_.b0, g2.b0, g3.b0};
            const T *ms[3] = {ps + in_.off, ps + g2.off, ps + g3.off};
            if (G == 3) qk__gate_group<T, 3>(a, N, lt, tps, bits, ms);
            else qk__gate_group<T, 2>(a, N, lt, tps, bits, ms);
        } else if (active) {
            if (in_.kind == QK__I_GATE) {
                const T *m = ps + in_.off;
                T m00r = m[0], m00i = m[1], m01r = m[2], m01i = m[3], m10r = m[4], m10i = m[5], m11r = m[6], m11i = m[7];
                int b = in_.b0;
                for (int t = lt; t < N / 2; t += tps) {
                    int i0 = ((t >> b) << (b + 1)) | (t & ((1 << b) - 1));
                    int i1 = i0 | (1 << b);
                    C x0 = a[i0], x1 = a[i1], y0, y1;
                    y0.x = m00r * x0.x - m00i * x0.y + m01r * x1.x - m01i * x1.y;
                    y0.y = m00r * x0.y + m00i * x0.x + m01r * x1.y + m01i * x1.x;
                    y1.x = m10r * x0.x - m10i * x0.y + m11r * x1.x - m11i * x1.y;
                    y1.y = m10r * x0.y + m10i * x0.x + m11r * x1.y + m11i * x1.x;
                    a[i0] = y0;
                    a[i1] = y1;
                }
            } else if (in_.kind == QK__I_CNOT) {
                int bc = in_.b0, bt = in_.b1;
                for (int t = lt; t < N / 2; t += tps) {
                    int i0 = ((t >> bt) << (bt + 1)) | (t & ((1 << bt) - 1));
                    if ((i0 >> bc) & 1) {
                        int i1 = i0 | (1 << bt);
                        C tmp = a[i0];
                        a[i0] = a[i1];
                        a[i1] = tmp;
                    }
                }
            } else { /* DIAG */
                const T *TL = tb, *TH = tb + (1 << bl), *Et = TH + (1 << bh);
                for (int r = lt; r < N; r += tps) {
                    const int lo = r & ((1 << bl) - 1), hi = r >> bl;
                    T ph = TL[lo] + TH[hi], sn, cs;
                    for (int j = 0; j < bh; ++j)
                        if ((hi >> j) & 1) ph += Et[(j << bl) | lo];
                    qk__sincos(ph, &sn, &cs);
                    C v = a[r], y;
                    y.x = v.x * cs - v.y * sn;
                    y.y = v.x * sn + v.y * cs;
                    a[r] = y;
                }
            }
        }
        __syncthreads();
        ii += G - 1;
    }
    if (active) {
        for (int r = lt; r < N; r += tps) {
            uint32_t g = fixed | qk__pdep(r, p);
            if (OUT_REAL) ((T *)out)[s * D + g] = a[r].x;
            else ((C *)out)[s * D + g] = a[r];
        }
    }
}

/* Product maps: per sample and qubit the 2-vector u_k = (ops on qubit k) |0>. */
template <typename T>
__global__ void qk__k_qubit_vectors(const int *__restrict__ qops, const int *__restrict__ qoff, int q,
                                    const qk__dangle *__restrict__ ang, const int *__restrict__ op_kind,
                                    const double *__restrict__ x, int64_t n, int d, const double *__restrict__ w,
                                    T *__restrict__ u)
{
    int64_t id = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (id >= n * q) return;
    int64_t s = id / q;
    int k = (int)(id % q);
    const double *xs = x + s * d;
    double a0r = 1, a0i = 0, a1r = 0, a1i = 0;
    const double R = 0.70710678118654752440, PI = 3.14159265358979323846;
    for (int o = qoff[k]; o < qoff[k + 1]; ++o) {
        int op = qops[o];
        double t = qk__theta(ang, op, xs, w);
        double c = cos(0.5 * t), sn = sin(0.5 * t);
        double b0r = a0r, b0i = a0i, b1r = a1r, b1i = a1i;
        switch (op_kind[op]) {
        case QK_OP_H: a0r = R * (b0r + b1r); a0i = R * (b0i + b1i); a1r = R * (b0r - b1r); a1i = R * (b0i - b1i); break;
        case QK_OP_X: a0r = b1r; a0i = b1i; a1r = b0r; a1i = b0i; break;
        case QK_OP_Y: a0r = b1i; a0i = -b1r; a1r = -b0i; a1i = b0r; break; /* (-i b1, i b0) */
        case QK_OP_Z: a1r = -b1r; a1i = -b1i; break;
        case QK_OP_RX: /* (c b0 - i s b1, -i s b0 + c b1) */
            a0r = c * b0r + sn * b1i; a0i = c * b0i - sn * b1r;
            a1r = sn * b0i + c * b1r; a1i = -sn * b0r + c * b1i; break;
        case QK_OP_RY: a0r = c * b0r - sn * b1r; a0i = c * b0i - sn * b1i; a1r = sn * b0r + c * b1r; a1i = sn * b0i + c * b1i; break;
        case QK_OP_RZ: /* e^{-it/2} b0, e^{it/2} b1 */
            a0r = c * b0r + sn * b0i; a0i = c * b0i - sn * b0r;
            a1r = c * b1r - sn * b1i; a1i = c * b1i + sn * b1r; break;
        case QK_OP_P: { double cp = cos(t), sp = sin(t); a1r = cp * b1r - sp * b1i; a1i = cp * b1i + sp * b1r; } break;
        case QK_OP_BASIS:
            if (xs[ang[op].x0] > 0.5) { a0r = b1r; a0i = b1i; a1r = b0r; a1i = b0i; }
            break;
        default: break;
        }
        (void)PI;
    }
    T *o = u + (s * q + k) * 4;
    o[0] = (T)a0r; o[1] = (T)a0i; o[2] = (T)a1r; o[3] = (T)a1i;
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

/* Block -> tile. tgrid > 0 (square tiles, a diagonal block of K(X,X)): a 1-D grid over the
   tiles with column >= row of a tile grid with tgrid columns, row r holding tgrid - r tiles,
   so no block is launched for a tile under the diagonal (half the grid; each empty block
   still cost a launch slot: zz 4 qubits, qk-bench). */
__device__ __forceinline__ void qk__tile_of(int tgrid, int &ty, int &tx)
{
    if (tgrid == 0) { ty = blockIdx.y; tx = blockIdx.x; return; }
    const int64_t L = blockIdx.x, T = tgrid;
    const double b = 2.0 * (double)T + 1.0;
    int64_t i = (int64_t)floor((b - sqrt(b * b - 8.0 * (double)L)) * 0.5);
    if (i < 0) i = 0;
    while (i > 0 && i * T - i * (i - 1) / 2 > L) --i;
    while ((i + 1) * T - (i + 1) * i / 2 <= L) ++i;
    ty = (int)i;
    tx = (int)(i + (L - (i * T - i * (i - 1) / 2)));
}

/* Fused Gram tile: acc[i][j] = <a_i|b_j> over D amplitudes in registers, then |.|^2 (complex)
   or .^2 (real), staged and stored. A: m states, B: nn states, row-major with stride D. */
template <typename T, bool CPLX, typename OutT, int BM, int BN, int BK, int TM, int TN, bool DIRECT>
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
        for (int e = threadIdx.x; e < BM * BK; e += NT) {
            int r = e / BK, k = e % BK;
            int gr = row0 + r, gk = k0 + k;
            T vr = 0, vi = 0;
            if (gr < m && gk < D) {
                if (CPLX) { typename qk__vec2<T>::t v = ((const typename qk__vec2<T>::t *)A)[(int64_t)gr * D + gk]; vr = v.x; vi = v.y; }
                else vr = A[(int64_t)gr * D + gk];
            }
            As[(k * BM + r) * W] = vr;
            if (CPLX) As[(k * BM + r) * W + 1] = vi;
        }
        for (int e = threadIdx.x; e < BN * BK; e += NT) {
            int r = e / BK, k = e % BK;
            int gr = col0 + r, gk = k0 + k;
            T vr = 0, vi = 0;
            if (gr < nn && gk < D) {
                if (CPLX) { typename qk__vec2<T>::t v = ((const typename qk__vec2<T>::t *)B)[(int64_t)gr * D + gk]; vr = v.x; vi = v.y; }
                else vr = B[(int64_t)gr * D + gk];
            }
            Bs[(k * BN + r) * W] = vr;
            if (CPLX) Bs[(k * BN + r) * W + 1] = vi;
        }
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
    if (DIRECT && TM == 4 && TN == 4 && sizeof(OutT) == 4 && vec && row0 + BM <= m && col0 + BN <= nn &&
        (!tri || (int64_t)col0 + doff >= row0 + BM)) {
        /* Interior tile above the diagonal: each thread's 4 x 4 block goes out as four 16-byte
           rows, and its transpose as four 16-byte rows of the mirror (two lanes fill a 32-byte
           sector), straight from registers: no staging, no barrier (block-uniform branch). */
        float v[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                v[i][j] = (float)(CPLX ? accr[i % TM][j % TN] * accr[i % TM][j % TN] + acci[i % TM][j % TN] * acci[i % TM][j % TN]
                                       : accr[i % TM][j % TN] * accr[i % TM][j % TN]);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            *(float4 *)(out + (int64_t)(row0 + ty * 4 + i) * ld + col0 + tx * 4) = make_float4(v[i][0], v[i][1], v[i][2], v[i][3]);
        if (mout) {
#pragma unroll
            for (int j = 0; j < 4; ++j)
                *(float4 *)(mout + (int64_t)(col0 + tx * 4 + j) * ld + row0 + ty * 4) = make_float4(v[0][j], v[1][j], v[2][j], v[3][j]);
        }
        return;
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
                T a0r = a[0], a0i = a[1], a1r = a[2], a1i = a[3];
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const T *b = Bs + (k * BN + tx * TN + j) * 4;
                    T re = a0r * b[0] + a0i * b[1] + a1r * b[2] + a1i * b[3];
                    T im = a0r * b[1] - a0i * b[0] + a1r * b[3] - a1i * b[2];
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

/* cuBLAS path epilogue: C (m x nn, row-major, ldc) -> |C|^2 into K and its mirror. Complex C is
   interleaved (re, im), or (plane > 0, the tensor-core engines) a real plane followed, plane
   values later, by an imaginary plane. */
template <typename T, bool CPLX, typename OutT>
__global__ void __launch_bounds__(256)
qk__k_epilogue(const T *__restrict__ Cm, int64_t ldc, int m, int nn, OutT *__restrict__ out, int64_t ld,
               OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid, int64_t plane)
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
            if (CPLX && plane) {
                const T zr = Cm[(int64_t)gi * ldc + gj], zi = Cm[plane + (int64_t)gi * ldc + gj];
                v = zr * zr + zi * zi;
            } else if (CPLX) {
                typename qk__vec2<T>::t z = ((const typename qk__vec2<T>::t *)Cm)[(int64_t)gi * ldc + gj];
                v = z.x * z.x + z.y * z.y;
            } else {
                T z = Cm[(int64_t)gi * ldc + gj];
                v = z * z;
            }
        }
        Cs[r * (BN + 1) + c] = (OutT)v;
    }
    __syncthreads();
    qk__store_tile<OutT, 32, 32, 256>(Cs, row0, col0, m, nn, out, ld, mout, doff, tri, vec);
}

/* Tensor-core operands (qk__tc_products). x rounded to TF32 (10 stored mantissa bits) to
   nearest, ties away from zero, as cvt.rna.tf32.f32 does (finite x: a carry into the exponent
   is the right result). */
__device__ __forceinline__ float qk__tf32_rna(float x)
{
    return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}
__device__ __forceinline__ float qk__cvt(float v, float *) { return qk__tf32_rna(v); }
__device__ __forceinline__ __half qk__cvt(float v, __half *) { return __float2half_rn(v); }
__device__ __forceinline__ __nv_bfloat16 qk__cvt(float v, __nv_bfloat16 *) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ double qk__cvt(double v, double *) { return v; }
__device__ __forceinline__ float qk__f(__half h) { return __half2float(h); }

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

/* Amplitude encoding: one block per row, the norm in double, then x/||x|| padded and cast. */
template <typename T>
__global__ void __launch_bounds__(256) qk__k_amp_encode(const double *__restrict__ x, int64_t rows, int d, int64_t D,
                                                       T *__restrict__ out)
{
    __shared__ double red[256];
    const int64_t r = blockIdx.x;
    if (r >= rows) return;
    const double *xr = x + r * d;
    double acc = 0;
    for (int k = threadIdx.x; k < d; k += blockDim.x) acc += xr[k] * xr[k];
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    const double inv = 1.0 / sqrt(red[0]);
    T *o = out + r * D;
    for (int64_t k = threadIdx.x; k < D; k += blockDim.x) o[k] = k < d ? (T)(xr[k] * inv) : (T)0;
}

/* complex double state -> interleaved doubles (qk_cuda_states) */
template <typename T>
__global__ void qk__k_widen(const qk__cx<T> *__restrict__ in, double *__restrict__ out, int64_t count)
{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= count) return;
    out[2 * i] = (double)in[i].x;
    out[2 * i + 1] = (double)in[i].y;
}

/* ======================================================================================== */
/*                                 HOST: program compiler                                   */
/* ======================================================================================== */

struct qk__prog {
    int q, n_ops, d, n_weights;
    int real_out;
    int has_amp;
    std::vector<qk__dangle> ang;
    std::vector<int> op_kind;
    std::vector<qk__instr> instr;
    std::vector<qk__job> jobs;
    std::vector<qk__contrib> con;
    std::vector<qk__pass> passes;
    int P; /* params per sample */
    /* product maps */
    std::vector<int> qops, qoff;
};

static bool qk__is_diag1(int k) { return k == QK_OP_Z || k == QK_OP_RZ || k == QK_OP_P; }

/* Adds one quadratic-form contribution: value (m*theta(op)+k) * f(b) with f by type. */
struct qk__diag_builder {
    int q;
    /* slot -> contributions; slot 0 = c0, 1+i = c_i, 1+q+i*q+j = d_ij (i<j) */
    std::vector<std::vector<qk__contrib>> slot;
    void init(int q_) { q = q_; slot.assign(1 + q + q * q, std::vector<qk__contrib>()); }
    void add(int s, int op, double m, double k) { qk__contrib c = {op, m, k}; slot[s].push_back(c); }
    void bit(int a, int op, double m, double k) { add(1 + a, op, m, k); }
    void cnst(int op, double m, double k) { add(0, op, m, k); }
    void pair(int a, int b, int op, double m, double k) { if (a > b) std::swap(a, b); add(1 + q + a * q + b, op, m, k); }
    void xr(int a, int b, int op, double m, double k) { bit(a, op, m, k); bit(b, op, m, k); pair(a, b, op, -2 * m, -2 * k); }
};

static void qk__diag_op1(qk__diag_builder &db, const qk_op &o, int oi, int qbit_xor_with)
{
    const double PI = 3.14159265358979323846;
    /* qbit_xor_with >= 0: the op sits between CNOT(c, t) pairs: its bit becomes b_c xor b_t */
    int t = o.q0;
    switch (o.kind) {
    case QK_OP_Z:
        if (qbit_xor_with >= 0) db.xr(qbit_xor_with, t, -1, 0, PI); else db.bit(t, -1, 0, PI);
        break;
    case QK_OP_P:
        if (qbit_xor_with >= 0) db.xr(qbit_xor_with, t, oi, 1, 0); else db.bit(t, oi, 1, 0);
        break;
    case QK_OP_RZ:
        if (qbit_xor_with >= 0) db.xr(qbit_xor_with, t, oi, 1, 0); else db.bit(t, oi, 1, 0);
        db.cnst(oi, -0.5, 0);
        break;
    default: break;
    }
}

static qk_result qk__compile(const qk_map *map, qk__prog *pg, qk__err *E)
{
    const int q = map->n_qubits;
    pg->q = q;
    pg->n_ops = map->n_ops;
    pg->d = map->n_features;
    pg->n_weights = map->n_weights;
    pg->real_out = map->cls == QK_CLASS_REAL;
    pg->has_amp = 0;
    pg->ang.resize(std::max(1, map->n_ops));
    pg->op_kind.resize(std::max(1, map->n_ops));
    for (int i = 0; i < map->n_ops; ++i) {
        const qk_op &o = map->ops[i];
        qk__dangle a = {(int)o.angle.kind, o.angle.x0, o.angle.x1, o.angle.w, o.angle.scale, o.angle.offset};
        pg->ang[i] = a;
        pg->op_kind[i] = (int)o.kind;
    }
    /* product maps: per-qubit op lists */
    pg->qoff.assign(q + 1, 0);
    if (map->cls == QK_CLASS_PRODUCT) {
        std::vector<std::vector<int>> per(q);
        for (int i = 0; i < map->n_ops; ++i) {
            int k = map->ops[i].kind;
            if (k == QK_OP_CNOT || k == QK_OP_CZ || k == QK_OP_RZZ || k == QK_OP_AMPLITUDE)
                return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "product map with an entangling or amplitude op");
            per[map->ops[i].q0].push_back(i);
        }
        pg->qops.clear();
        for (int k = 0; k < q; ++k) {
            pg->qoff[k] = (int)pg->qops.size();
            pg->qops.insert(pg->qops.end(), per[k].begin(), per[k].end());
        }
        pg->qoff[q] = (int)pg->qops.size();
        if (pg->qops.empty()) pg->qops.push_back(0);
    }
    if (q > QK__MAXQ) return QK_OK; /* analytic only */

    /* instructions */
    pg->instr.clear();
    pg->jobs.clear();
    pg->con.clear();
    int P = 0;
    qk__diag_builder db;
    bool in_diag = false;
    auto flush_diag = [&]() {
        if (!in_diag) return;
        qk__instr ins = {QK__I_DIAG, -1, -1, 0, 0, P};
        pg->instr.push_back(ins);
        for (size_t s = 0; s < db.slot.size(); ++s) {
            qk__job j;
            j.kind = 1;
            j.op = -1;
            j.out = P + (int)s;
            j.c0 = (int)pg->con.size();
            for (auto &c : db.slot[s]) pg->con.push_back(c);
            j.c1 = (int)pg->con.size();
            pg->jobs.push_back(j);
        }
        P += (int)db.slot.size();
        in_diag = false;
    };
    /* Leading one-qubit gates on qubits nothing else has touched yet act on |0> alone: fold
       them into a per-sample product start state (a 2-vector per qubit, built by the prep
       kernel). zz's first H layer disappears this way: 16 qubits take 2 passes instead of 3. */
    std::vector<char> folded(std::max(1, map->n_ops), 0);
    std::vector<std::vector<int>> fold_ops(q);
    bool any_fold = false;
    {
        uint32_t touched = 0;
        bool amp = map->n_ops > 0 && map->ops[0].kind == QK_OP_AMPLITUDE;
        for (int i = 0; i < map->n_ops && !amp; ++i) {
            const qk_op &o = map->ops[i];
            int k = o.kind;
            bool one = k == QK_OP_H || k == QK_OP_X || k == QK_OP_Y || k == QK_OP_RX || k == QK_OP_RY || k == QK_OP_BASIS;
            if (one && !((touched >> o.q0) & 1)) { folded[i] = 1; fold_ops[o.q0].push_back(i); any_fold = true; continue; }
            if (o.q0 >= 0 && o.q0 < q) touched |= 1u << o.q0;
            if ((k == QK_OP_CNOT || k == QK_OP_CZ || k == QK_OP_RZZ) && o.q1 >= 0 && o.q1 < q) touched |= 1u << o.q1;
        }
    }
    int fold_off = -1;
    if (any_fold) {
        fold_off = P;
        for (int b = 0; b < q; ++b) {
            qk__job j = {2, -1, P + 4 * b, (int)pg->con.size(), 0};
            for (int op : fold_ops[b]) { qk__contrib c = {op, 0, 0}; pg->con.push_back(c); }
            j.c1 = (int)pg->con.size();
            pg->jobs.push_back(j);
        }
        P += 4 * q;
    }
    for (int i = 0; i < map->n_ops; ++i) {
        const qk_op &o = map->ops[i];
        int k = o.kind;
        if (folded[i]) continue;
        if (k == QK_OP_AMPLITUDE) {
            if (i != 0) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "amplitude op must come first");
            pg->has_amp = 1;
            continue;
        }
        /* CNOT(c,t) D(t) CNOT(c,t) with D one diagonal one-qubit op: a parity phase */
        if (k == QK_OP_CNOT && i + 2 < map->n_ops) {
            const qk_op &m = map->ops[i + 1], &e = map->ops[i + 2];
            if (qk__is_diag1(m.kind) && m.q0 == o.q1 && e.kind == QK_OP_CNOT && e.q0 == o.q0 && e.q1 == o.q1) {
                if (!in_diag) { db.init(q); in_diag = true; }
                qk__diag_op1(db, m, i + 1, o.q0);
                i += 2;
                continue;
            }
        }
        if (qk__is_diag1(k) || k == QK_OP_CZ || k == QK_OP_RZZ) {
            if (!in_diag) { db.init(q); in_diag = true; }
            if (k == QK_OP_CZ) db.pair(o.q0, o.q1, -1, 0, 3.14159265358979323846);
            else if (k == QK_OP_RZZ) { db.xr(o.q0, o.q1, i, 1, 0); db.cnst(i, -0.5, 0); }
            else qk__diag_op1(db, o, i, -1);
            continue;
        }
        flush_diag();
        if (k == QK_OP_CNOT) {
            qk__instr ins = {QK__I_CNOT, o.q0, o.q1, 0, 0, 0};
            pg->instr.push_back(ins);
        } else {
            qk__instr ins = {QK__I_GATE, o.q0, -1, 0, 0, P};
            pg->instr.push_back(ins);
            qk__job j = {0, i, P, 0, 0};
            pg->jobs.push_back(j);
            P += 8;
        }
    }
    flush_diag();
    pg->P = std::max(P, 1);

    /* passes */
    pg->passes.clear();
    const int L = std::min(q, QK__LMAX);
    uint32_t S = 0;
    qk__pass cur;
    memset(&cur, 0, sizeof cur);
    cur.i0 = 0;
    cur.first = 1;
    cur.fold = fold_off;
    auto close = [&](int i1) {
        /* fill with the lowest qubits (coalescing) */
        for (int b = 0; b < q && __builtin_popcount(S) < L; ++b) S |= 1u << b;
        cur.L = L;
        int np = 0, nn = 0;
        for (int b = 0; b < q; ++b) {
            if (S >> b & 1) cur.pos[np++] = b; else cur.npos[nn++] = b;
        }
        cur.a = 0;
        while (cur.a < L && cur.pos[cur.a] == cur.a) cur.a++;
        cur.i1 = i1;
        for (int ii = cur.i0; ii < i1; ++ii) {
            qk__instr &in_ = pg->instr[ii];
            for (int r = 0; r < L; ++r) {
                if (cur.pos[r] == in_.q0) in_.b0 = r;
                if (cur.pos[r] == in_.q1) in_.b1 = r;
            }
        }
        pg->passes.push_back(cur);
    };
    for (int ii = 0; ii < (int)pg->instr.size(); ++ii) {
        const qk__instr &in_ = pg->instr[ii];
        uint32_t need = 0;
        if (in_.kind == QK__I_GATE) need = 1u << in_.q0;
        else if (in_.kind == QK__I_CNOT) need = (1u << in_.q0) | (1u << in_.q1);
        if ((S | need) == S) continue;
        if (__builtin_popcount(S | need) <= L) { S |= need; continue; }
        close(ii);
        memset(&cur, 0, sizeof cur);
        cur.i0 = ii;
        cur.first = 0;
        cur.fold = -1;
        S = need;
    }
    close((int)pg->instr.size());
    return QK_OK;
}

/* ======================================================================================== */
/*                                  HOST: device buffers                                    */
/* ======================================================================================== */

struct qk__dprog {
    qk__dangle *ang = nullptr;
    int *op_kind = nullptr;
    qk__instr *instr = nullptr;
    qk__job *jobs = nullptr;
    qk__contrib *con = nullptr;
    double *w = nullptr;
    int *qops = nullptr, *qoff = nullptr;
};

template <typename V>
static qk_result qk__upload(const std::vector<V> &v, V **d, qk__err *E)
{
    size_t bytes = std::max<size_t>(1, v.size()) * sizeof(V);
    QK_CK(cudaMalloc((void **)d, bytes));
    if (!v.empty()) QK_CK(cudaMemcpy(*d, v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice));
    return QK_OK;
}

static void qk__dprog_free(qk__dprog *d)
{
    cudaFree(d->ang); cudaFree(d->op_kind); cudaFree(d->instr); cudaFree(d->jobs);
    cudaFree(d->con); cudaFree(d->w); cudaFree(d->qops); cudaFree(d->qoff);
    *d = qk__dprog();
}

static qk_result qk__dprog_make(const qk__prog &pg, const qk_map *map, qk__dprog *d, qk__err *E)
{
    QK_TRY(qk__upload(pg.ang, &d->ang, E));
    QK_TRY(qk__upload(pg.op_kind, &d->op_kind, E));
    QK_TRY(qk__upload(pg.instr, &d->instr, E));
    QK_TRY(qk__upload(pg.jobs, &d->jobs, E));
    QK_TRY(qk__upload(pg.con, &d->con, E));
    std::vector<double> w(map->weights, map->weights + map->n_weights);
    QK_TRY(qk__upload(w, &d->w, E));
    QK_TRY(qk__upload(pg.qops, &d->qops, E));
    QK_TRY(qk__upload(pg.qoff, &d->qoff, E));
    return QK_OK;
}

/* Builds n states (x already on the device) into out: complex T or, real_out, T.
   Scratch: params (n * P), a ping-pong state buffer for multi-pass programs (n * 2^q complex),
   inverse norms. All from the caller's workspace. */
struct qk__build_ws {
    void *params = nullptr;
    void *tmp = nullptr;       /* multi-pass: complex states */
    double *inv = nullptr;
};

template <typename T>
static qk_result qk__build_states(const qk__prog &pg, const qk__dprog &dp, const double *dx, int64_t n,
                                  qk__build_ws &ws, void *out, bool out_real, cudaStream_t st, qk__err *E)
{
    if (n <= 0) return QK_OK;
    const int q = pg.q;
    const int64_t D = (int64_t)1 << q;
    qk__k_prep<T><<<(unsigned)n, 128, 0, st>>>(dp.jobs, (int)pg.jobs.size(), dp.con, dp.ang, dp.op_kind, dx, n,
                                                pg.d, dp.w, (T *)ws.params, pg.P);
    QK_LAUNCH_CK("prep");
    if (pg.has_amp) {
        qk__k_invnorm<<<(unsigned)((n + 127) / 128), 128, 0, st>>>(dx, n, pg.d, ws.inv);
        QK_LAUNCH_CK("invnorm");
    }
    const int np = (int)pg.passes.size();
    const double *ampx = pg.has_amp ? dx : nullptr;
    for (int pi = 0; pi < np; ++pi) {
        const qk__pass &p = pg.passes[pi];
        const int N = 1 << p.L;
        /* threads per state: half the amplitudes (one pair per thread per gate), at most 256;
           small states share a block so that blocks have at least 128 threads. */
        int tps = std::max(1, std::min(256, N / 2));
        int spb = (pi == 0 && np == 1) ? std::max(1, 128 / tps) : 1;
        if (np > 1) spb = 1;
        const int64_t nchunks = (int64_t)1 << (q - p.L);
        const int64_t groups = (n + spb - 1) / spb;
        const size_t smem = (size_t)spb * N * sizeof(qk__cx<T>) + (size_t)spb * qk__tbl_size(p.L) * sizeof(T);
        /* ping-pong so that the last pass writes out; multi-pass in-place would race between
           blocks of a pass (a chunk reads amplitudes another chunk of the same pass writes? no:
           chunks of one pass are disjoint, so in place is safe), so passes run in place on tmp */
        const bool last = pi == np - 1;
        const qk__cx<T> *in = (const qk__cx<T> *)ws.tmp;
        void *o = last ? out : ws.tmp;
        bool oreal = last && out_real;
        if (oreal) {
            auto kf = qk__k_pass<T, true>;
            QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            kf<<<(unsigned)(groups * nchunks), spb * tps, smem, st>>>(p, dp.instr, q, (const T *)ws.params, pg.P, n,
                                                                     ampx, ws.inv, pg.has_amp ? pg.d : 0, in, o, spb, tps);
        } else {
            auto kf = qk__k_pass<T, false>;
            QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            kf<<<(unsigned)(groups * nchunks), spb * tps, smem, st>>>(p, dp.instr, q, (const T *)ws.params, pg.P, n,
                                                                     ampx, ws.inv, pg.has_amp ? pg.d : 0, in, o, spb, tps);
        }
        QK_LAUNCH_CK("pass");
        (void)D;
    }
    return QK_OK;
}

/* ======================================================================================== */
/*                                  HOST: Gram launchers                                    */
/* ======================================================================================== */

/* 16-byte stores are legal when both bases are 16-byte aligned and ld keeps rows aligned. */
template <typename OutT>
static int qk__vec_ok(const OutT *out, const OutT *mout, int64_t ld)
{
    const int VW = 16 / sizeof(OutT);
    return ld % VW == 0 && ((uintptr_t)out % 16) == 0 && (!mout || ((uintptr_t)mout % 16) == 0);
}

/* Tile shapes of the fused kernel, 256 threads each.
   complex fp32: 128 x 64 tile, 8 x 4 complex per thread (64 accumulators, ~120 registers:
   2 blocks / SM); real fp32: 128 x 128, 8 x 8; fp64: 64 x 64, 4 x 4 (accumulators twice the
   size). Small states (2^q <= 32) are write-bound (4 bytes of K per 8*2^q flops), so they get
   64 x 64 tiles with 4 x 4 per thread: fewer registers, more blocks in flight per SM to keep
   the stores streaming (zz 4 qubits, n = 32768, qk-bench). */
template <int BM_, int BN_, int BK_, int TM_, int TN_, bool DIRECT_ = false> struct qk__tiles {
    enum { BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_ };
    static const bool DIRECT = DIRECT_;
};
template <typename T, bool CPLX, typename OutT, typename C>
static qk_result qk__launch_gram_cfg(const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                     OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    const int NT = (C::BM / C::TM) * (C::BN / C::TN);
    size_t op = (size_t)C::BK * (C::BM + C::BN) * (CPLX ? 2 : 1) * sizeof(T);
    size_t ep = (size_t)C::BM * (C::BN + 1) * sizeof(OutT);
    size_t smem = std::max(op, ep);
    auto kf = qk__k_gram<T, CPLX, OutT, C::BM, C::BN, C::BK, C::TM, C::TN, C::DIRECT>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t r0 = 0; r0 < m; r0 += (int64_t)65535 * C::BM) { /* grid.y limit */
        int64_t mm = std::min<int64_t>(m - r0, (int64_t)65535 * C::BM);
        dim3 grid((unsigned)((nn + C::BN - 1) / C::BN), (unsigned)((mm + C::BM - 1) / C::BM));
        int tg = 0;
        if (tri && doff == 0 && r0 == 0 && mm == m && C::BM == C::BN && nn >= mm) {
            const int64_t Tx = grid.x, Ty = grid.y;
            tg = (int)Tx;
            grid = dim3((unsigned)(Ty * Tx - Ty * (Ty - 1) / 2), 1);
        }
        const T *Ar = (const T *)A + r0 * (int64_t)D * (CPLX ? 2 : 1);
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        kf<<<grid, NT, smem, st>>>(Ar, (const T *)B, (int)mm, (int)nn, D, o, ld, mo, doff - r0, tri, qk__vec_ok(o, mo, ld), tg);
        QK_LAUNCH_CK("gram");
    }
    return QK_OK;
}

/* Fused-kernel configurations by index (qk_plan.kernel_cfg; 0 = the fixed table above). The
   autotuner (qk_cuda_tune_gram) times these on the real shape. */
#define QK__N_FUSED_CFG 6
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_gram(int cfg, const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                 OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    if (cfg == 0) cfg = D <= 32 ? 1 : (sizeof(T) == 8 ? 1 : (CPLX ? 2 : 4));
    switch (cfg) {
    case 2: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<128, 64, 8, 8, 4>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    case 3: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<64, 128, 8, 4, 8>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    case 4: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<128, 128, 8, 8, 8>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    case 5: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<64, 64, 8, 4, 4, true>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    case 6: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<64, 64, 16, 4, 4>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    default: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<64, 64, 8, 4, 4>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    }
}

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
        int tg = 0;
        if (tri && doff == 0 && r0 == 0 && mm == m && nn >= mm) {
            const int64_t Tx = grid.x, Ty = grid.y;
            tg = (int)Tx;
            grid = dim3((unsigned)(Ty * Tx - Ty * (Ty - 1) / 2), 1);
        }
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        kf<<<grid, NT, smem, st>>>(UA + r0 * q * 4, UB, (int)mm, (int)nn, q, o, ld, mo, doff - r0, tri, qk__vec_ok(o, mo, ld), tg);
        QK_LAUNCH_CK("gram_product");
    }
    return QK_OK;
}

/* ---- tensor-core engines (plan.use_blas 3..7) ----
   The complex product in real form: a state row of D complex amplitudes is a real row of
   W = 2D values (interleaved re, im), and
       Re <a|b> = a . b,    Im <a|b> = a . rot(b),   rot(b) = (im, -re) pairs,
   so two real GEMMs (K = W) give the Re and Im planes of the slab and the epilogue takes
   Re^2 + Im^2 (real states: one GEMM, K = D). cuBLAS's complex routines on the tensor cores fall
   short of this (CGEMM with TF32 reached 2.8x FP32 at 12 qubits, SGEMM-TF32 7.8x:
   shared/PERFORMANCE.md), and HERK/SYRK have no tensor-core compute type, so the upper
   triangle of a diagonal block is covered by GEMMs over blocks of rows, each from its diagonal
   to the right (8 blocks: 56% of the square instead of HERK's 50%).
     3 TF32    operands rounded to TF32 (nearest), fp32 accumulation on the tensor cores
     4 FP32X3  operands scaled as FP16 (below), split hi + lo (both fp16: 11 + 11 bits) and laid
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
               Measured (zz 12 qubits, n = 16384, K error): TF32 split, hi*hi first 2.0e-4;
               small products first 1.35e-4; this scheme 3.9e-5; fp32's own 2.8e-5 (runs a, b, c
               of bench/results/2026-11-23-h200-precision-*). fp16 halves rather than TF32: twice
               the rate, half the operand bytes, MMAs of k = 16 (half the steps of TF32's k = 8)
     5 FP16    operands scaled by s = 2^floor(q/2) (amplitudes ~2^-q/2 become ~1: nothing
               underflows fp16's 2^-14) and rounded to fp16 (11 bits, as TF32, at twice its
               rate); alpha = 1/s^2 (exact) undoes the scale
     6 BF16    as 5 with bfloat16 (8 bits): measurement only, no precision selects it
     7 FP64    the real form with DGEMM (T double): operands kept, rot(b) copied
   Operands live in the workspace slot after the C planes (qk__blas_ws_bytes). When A and B are
   the same rows (a diagonal block of K(X,X)) they are converted once. */
template <typename T, bool CPLX>
static size_t qk__blas_ws_bytes(int mode, int64_t rows, int64_t cols, int64_t D)
{
    /* keep in step with qk.h's qk__blas_ws (the planner counts these bytes) */
    const size_t c = (size_t)rows * (size_t)cols * (CPLX ? 2 : 1) * sizeof(T);
    const size_t W = (size_t)D * (CPLX ? 2 : 1);
    if (mode < 3) return c;
    if (mode == 7) return c + 512 + (CPLX ? (size_t)cols * W * 8 : 0);
    const size_t per = mode == 4 ? 8 * W : mode == 3 ? 4 * W : 2 * W;
    return c + 512 + per * ((size_t)rows + (size_t)cols * (CPLX ? 2 : 1));
}

#define QK__TC_MAX_QUBITS 24 /* int leading dimensions of the FP32X3 operands (4W) stay far from 2^31 */

template <typename T, bool CPLX>
static qk_result qk__tc_products(cublasHandle_t h, int mode, const void *A, const void *B, int64_t m, int64_t nn, int D,
                                 void *Cw, bool trap, cudaStream_t st, qk__err *E)
{
    const bool f64 = sizeof(T) == 8;
    if (f64 != (mode == 7) || mode < 3 || mode > 7)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: tensor-core engine (use_blas) does not match the precision");
    int q = 0;
    while (((int64_t)1 << q) < D) ++q;
    if (q > QK__TC_MAX_QUBITS) return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "qk_cuda_gram: tensor-core engines take at most 24 qubits");
    const int64_t W = CPLX ? 2 * (int64_t)D : D;
    const bool same = A == B;
    const int64_t rb = same ? std::max(m, nn) : nn; /* rows of B converted (the rows of A too when same) */
    T *Cre = (T *)Cw, *Cim = Cre + m * nn;
    char *ops = (char *)Cw + ((size_t)m * nn * (CPLX ? 2 : 1) * sizeof(T) + 255) / 256 * 256;
    const size_t vb = mode == 3 ? 4 : mode == 7 ? 8 : 2; /* bytes per operand value */
    const int64_t ld = mode == 4 ? 4 * W : W, offb = mode == 4 ? W : 0;
    /* FP32X3: the hi*hi block (the last W of K) in nck chunks, the first chunk with the small products */
    const int nck = mode == 4 ? (W >= 2048 ? 4 : 2) : 1;
    const int64_t Wc = mode == 4 ? W / nck : W, K0 = mode == 4 ? 2 * W + Wc : W;
    const float s16 = mode >= 4 && mode <= 6 ? ldexpf(1.0f, q / 2) : 1.0f;
    const cudaDataType_t ty = mode == 7 ? CUDA_R_64F : mode == 4 || mode == 5 ? CUDA_R_16F : mode == 6 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t cty = mode == 7 ? CUDA_R_64F : CUDA_R_32F;
    const cublasComputeType_t ct = mode == 7 ? CUBLAS_COMPUTE_64F : mode == 3 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float a32 = 1.0f / (s16 * s16), b32 = 0.0f, one32 = 1.0f;
    const double a64 = 1.0, b64 = 0.0;

    /* operands: rows of B (xb), rotated rows of B (xr), rows of A (xa) */
    auto conv = [&](const void *src, int64_t rows, int rot, void *dst) -> qk_result {
        const int64_t n = rows * W;
        const unsigned g = (unsigned)std::min<int64_t>((n + 255) / 256, (int64_t)1 << 20);
        if (n <= 0) return QK_OK;
        switch (mode) {
        case 3: qk__k_tc_operand<float, float, false><<<g, 256, 0, st>>>((const float *)src, n, W, rot, 1.0f, (float *)dst); break;
        case 4: qk__k_tc_operand<float, __half, true><<<g, 256, 0, st>>>((const float *)src, n, W, rot, s16, (__half *)dst); break;
        case 5: qk__k_tc_operand<float, __half, false><<<g, 256, 0, st>>>((const float *)src, n, W, rot, s16, (__half *)dst); break;
        case 6: qk__k_tc_operand<float, __nv_bfloat16, false><<<g, 256, 0, st>>>((const float *)src, n, W, rot, s16, (__nv_bfloat16 *)dst); break;
        default: qk__k_tc_operand<double, double, false><<<g, 256, 0, st>>>((const double *)src, n, W, rot, 1.0, (double *)dst); break;
        }
        QK_LAUNCH_CK("tc_operand");
        return QK_OK;
    };
    const void *xa, *xb, *xr = nullptr;
    char *p = ops;
    if (mode == 7) {
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
    const int64_t bs = trap ? std::max<int64_t>(512, ((m + 7) / 8 + 255) / 256 * 256) : m;
    for (int64_t r0 = 0; r0 < m; r0 += bs) {
        const int64_t r1 = std::min(m, r0 + bs), c0 = trap ? r0 : 0;
        for (int pl = 0; pl < (CPLX ? 2 : 1); ++pl) {
            const void *bop = pl ? xr : xb;
            T *C = pl ? Cim : Cre;
            QK_TRY(gemm(bop, r0, r1, c0, C, 0, K0, false));
            for (int j = 1; j < nck; ++j) QK_TRY(gemm(bop, r0, r1, c0, C, 2 * W + j * Wc, Wc, true));
        }
    }
    return QK_OK;
}

/* cuBLAS: C (m x nn row-major, ldc = nn) holds <b_j|a_i> (the conjugate of <a_i|b_j>; |.|^2
   does not care): column-major nn x m = B^H A. For a diagonal block of K(X,X) (tri, doff == 0)
   the m x m square is one HERK/SYRK (lower triangle in column-major = j >= i, half the flops)
   and the rest a GEMM; then the fused epilogue. mode 2: CGEMM3M (Gauss: 3 real products instead
   of 4) for complex fp32. Modes 3..7: the tensor-core engines above (Re and Im planes). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_blas(cublasHandle_t h, int mode, const void *A, const void *B, int64_t m, int64_t nn, int D,
                                 void *Cw, OutT *out, int64_t ld, OutT *mout, int64_t doff, int tri,
                                 cudaStream_t st, qk__err *E, cudaStream_t est = nullptr, cudaEvent_t gemm_done = nullptr)
{
    QK_BLAS_CK(cublasSetStream(h, st));
    const size_t es = CPLX ? 2 * sizeof(T) : sizeof(T);
    const bool tc = mode >= 3;
    if (tc) QK_TRY((qk__tc_products<T, CPLX>(h, mode, A, B, m, nn, D, Cw, tri && doff == 0 && m <= nn, st, E)));
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
                if (mode == 2)
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
    dim3 grid((unsigned)((nn + 31) / 32), (unsigned)((m + 31) / 32));
    int tg = 0;
    if (tri && doff == 0 && nn >= m) {
        const int64_t Tx = grid.x, Ty = grid.y;
        tg = (int)Tx;
        grid = dim3((unsigned)(Ty * Tx - Ty * (Ty - 1) / 2), 1);
    }
    qk__k_epilogue<T, CPLX, OutT><<<grid, 256, 0, st>>>((const T *)Cw, nn, (int)m, (int)nn, out, ld, mout, doff, tri,
                                                        qk__vec_ok(out, mout, ld), tg, tc && CPLX ? m * nn : 0);
    QK_LAUNCH_CK("epilogue");
    return QK_OK;
}

/* ======================================================================================== */
/*                                 HOST: the Gram pipeline                                  */
/* ======================================================================================== */

/* Stream pool: a compute and a copy stream; events around each operation give the per-stream
   busy intervals (summed after the final synchronization). */
enum qk__ev_tag { QK__EV_STATES, QK__EV_SLAB, QK__EV_COPY };
static double qk__host_ms(void)
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
struct qk__pool {
    cudaStream_t st[2] = {nullptr, nullptr};
    cudaEvent_t t0 = nullptr;
    std::vector<cudaEvent_t> ev;   /* pairs (begin, end) */
    std::vector<int> ev_stream;
    std::vector<qk__ev_tag> ev_tag;
};

struct qk__job_state {
    qk__err *E;
    const qk_plan *plan;
    const qk_map *map;
    const qk_gram_desc *desc;
    qk_rows_fn rows;                     /* host-side slabs (staged outputs) */
    void *rows_user;
    void *io_stage[2];                   /* the caller's pinned staging (may be NULL) */
    size_t io_stage_bytes;
    qk_cuda_stats *stats;
    int64_t *delivered;                  /* slabs handed to rows (a retry after one would
                                            deliver rows twice) */
    qk__prog pg;
    qk__dprog dp;
    qk__pool pool;
    cublasHandle_t blas = nullptr;
    double *dx = nullptr, *dy = nullptr;
    void *SA = nullptr, *SB = nullptr;   /* states (or qubit vectors) */
    qk__build_ws ws;
    void *Kd = nullptr;                  /* device K (resident) or slab ring */
    void *Cw[2] = {nullptr, nullptr};    /* cuBLAS workspace ring (slab s uses Cw[s & 1]) */
    cudaStream_t est = nullptr;          /* epilogue stream (cuBLAS path) */
    cudaEvent_t gemm_done = nullptr, ep_done[2] = {nullptr, nullptr};
    int64_t n_blas = 0;
    void *stage[2] = {nullptr, nullptr}; /* pinned staging */
    bool own_stage = false;              /* allocated for this job (else the caller's) */
    cudaEvent_t slab_done[2] = {nullptr, nullptr}, copy_done[2] = {nullptr, nullptr};
};

static void qk__job_free(qk__job_state *J)
{
    if (J->pool.st[0]) cudaStreamSynchronize(J->pool.st[0]);
    if (J->pool.st[1]) cudaStreamSynchronize(J->pool.st[1]);
    qk__dprog_free(&J->dp);
    cudaFree(J->dx); cudaFree(J->dy);
    if (J->SA) QK_PROF_UNTRACK(J->SA);
    if (J->SB && J->SB != J->SA) QK_PROF_UNTRACK(J->SB);
    if (J->Kd && (J->desc->output != QK_OUTPUT_DEVICE || J->Kd != J->desc->out)) QK_PROF_UNTRACK(J->Kd);
    cudaFree(J->SA); if (J->SB != J->SA) cudaFree(J->SB);
    cudaFree(J->ws.params); cudaFree(J->ws.tmp); cudaFree(J->ws.inv);
    if (J->desc->output != QK_OUTPUT_DEVICE || J->Kd != J->desc->out) cudaFree(J->Kd);
    if (J->est) cudaStreamSynchronize(J->est);
    cudaFree(J->Cw[0]); cudaFree(J->Cw[1]);
    if (J->gemm_done) cudaEventDestroy(J->gemm_done);
    for (int i = 0; i < 2; ++i) if (J->ep_done[i]) cudaEventDestroy(J->ep_done[i]);
    if (J->est) cudaStreamDestroy(J->est);
    for (int i = 0; i < 2; ++i) {
        if (J->stage[i] && J->own_stage) cudaFreeHost(J->stage[i]);
        if (J->slab_done[i]) cudaEventDestroy(J->slab_done[i]);
        if (J->copy_done[i]) cudaEventDestroy(J->copy_done[i]);
        if (J->pool.st[i]) cudaStreamDestroy(J->pool.st[i]);
    }
    for (auto e : J->pool.ev) cudaEventDestroy(e);
    if (J->pool.t0) cudaEventDestroy(J->pool.t0);
    if (J->blas) cublasDestroy(J->blas);
    cudaGetLastError();
}

static qk_result qk__mark(qk__job_state *J, int s, qk__ev_tag tag)
{
    qk__err *E = J->E;
    cudaEvent_t e;
    QK_CK(cudaEventCreate(&e));
    J->pool.ev.push_back(e);
    J->pool.ev_stream.push_back(s);
    J->pool.ev_tag.push_back(tag);
    QK_CK(cudaEventRecord(e, J->pool.st[s]));
    return QK_OK;
}

/* Per-qubit 2-vectors of product-map samples (the analytic path's "states"). */
template <typename T>
static qk_result qk__launch_qubit_vectors(const qk__dprog &dp, int q, const double *x, int64_t n, int d, T *out,
                                          cudaStream_t st, qk__err *E)
{
    const int64_t tot = n * q;
    if (tot <= 0) return QK_OK;
    qk__k_qubit_vectors<T><<<(unsigned)((tot + 255) / 256), 256, 0, st>>>(dp.qops, dp.qoff, q, dp.ang, dp.op_kind, x, n, d,
                                                                          dp.w, out);
    QK_LAUNCH_CK("qubit_vectors");
    return QK_OK;
}

/* One Gram job on the device, read top to bottom (qk__pipe::run):
     alloc     streams, the compiled program, X (and Y) on the device, state buffers and their
               build scratch, the cuBLAS handle and workspace ring
     output    where K's rows live on the device (the caller's buffer, K resident, or a ring of
               two slabs) and on the host (the caller's pinned buffer, or pinned staging)
     states    bulk state construction (else each slab builds its state tiles)
     slab      slab s of K on the compute stream (upper triangle + mirror where K is whole on
               the device, full rows in the slab ring)
     ship      its D2H on the copy stream (host outputs)
     deliver   on the host: wait for a shipped slab, hand it to io->rows, report progress; slab
               s-1 is delivered while slab s computes and ships
     stats     per-stream busy time and phase times from the events
   Two leading dimensions only: ld_out, the caller's, and ldk, that of the device buffer the
   slab's rows are in. Every decision comes from the plan and the retry parameters (slab rows,
   state tile, K residency) that qk_cuda_gram passes; the steps derive nothing else. */
template <typename T, bool CPLX, typename OutT> struct qk__pipe {
    qk__job_state *J;
    qk__err *E;
    const qk_plan *pl;
    const qk_gram_desc *ds;
    const qk_map *map;
    bool sym, analytic, use_blas, bulk, dev_out, pinned_out, mirror;
    int q, d;
    int64_t nx, ny, D, ld_out, slab_rows, state_tile, tA, tB, n_slabs, ldk;
    size_t es, per_state;
    int k_resident;
    cudaStream_t cs = nullptr, xs = nullptr;
    OutT *Kdev = nullptr;                /* the caller's device buffer or the resident K */
    int64_t done_pairs = 0;
    double deliver_ms = 0;
    bool stream_amp = false;             /* pure amplitude map, bulk states: the H2D encoder */
    double enc_ms = 0;

    qk__pipe(qk__job_state *job, int64_t slab, int64_t tile, int resident)
        : J(job), E(job->E), pl(job->plan), ds(job->desc), map(job->map)
    {
        sym = ds->y == nullptr;
        nx = ds->n_x;
        ny = sym ? ds->n_x : ds->n_y;
        q = map->n_qubits;
        d = map->n_features;
        analytic = pl->path == QK_PATH_ANALYTIC;
        D = analytic ? 0 : ((int64_t)1 << q);
        es = CPLX ? 2 * sizeof(T) : sizeof(T);
        per_state = analytic ? (size_t)q * 4 * sizeof(T) : (size_t)D * es;
        use_blas = pl->use_blas && !analytic;
        ld_out = ds->ld_out > 0 ? ds->ld_out : ny;
        state_tile = tile;
        bulk = state_tile >= std::max(nx, ny);
        slab_rows = bulk ? slab : std::min(slab, state_tile); /* a slab's states are one tile */
        tA = bulk ? nx : state_tile;
        tB = bulk ? ny : state_tile;
        n_slabs = (nx + slab_rows - 1) / slab_rows;
        k_resident = resident;
        dev_out = ds->output == QK_OUTPUT_DEVICE;
        pinned_out = ds->output == QK_OUTPUT_HOST && pl->host_pinned;
        /* symmetric with a ring of slabs (K not resident): full rows, no mirror (2x the flops,
           but K never has to fit; GPU flops are cheap next to the PCIe and disk time of such a K) */
        mirror = sym && (dev_out || k_resident);
        ldk = dev_out ? ld_out : ny;
        /* a map that is only an amplitude encoding, all states at once: its states are x / ||x||
           padded, which the streaming encoder (qk_cuda_amplitude_encode: pinned double-buffered
           H2D overlapped with the normalize kernel, at the PCIe bound) writes straight into the
           state buffers; X itself never has to be whole on the device */
        stream_amp = bulk && !analytic && !CPLX && map->n_ops == 1 && map->ops[0].kind == QK_OP_AMPLITUDE;
    }

    qk_result alloc()
    {
        for (int i = 0; i < 2; ++i) QK_CK(cudaStreamCreateWithFlags(&J->pool.st[i], cudaStreamNonBlocking));
        QK_CK(cudaEventCreate(&J->pool.t0));
        cs = J->pool.st[0];
        xs = J->pool.st[1];
        QK_PROF_STREAM_NAME(cs, "qk compute");
        QK_PROF_STREAM_NAME(xs, "qk copy");
        QK_CK(cudaEventRecord(J->pool.t0, cs));
        QK_TRY(qk__compile(map, &J->pg, E));
        QK_TRY(qk__dprog_make(J->pg, map, &J->dp, E));
        if (!stream_amp) {
            QK_CK(cudaMalloc((void **)&J->dx, std::max<size_t>(1, (size_t)nx * d * sizeof(double))));
            QK_CK(cudaMemcpyAsync(J->dx, ds->x, (size_t)nx * d * sizeof(double), cudaMemcpyHostToDevice, cs));
        }
        if (!sym && !stream_amp) {
            QK_CK(cudaMalloc((void **)&J->dy, std::max<size_t>(1, (size_t)ny * d * sizeof(double))));
            QK_CK(cudaMemcpyAsync(J->dy, ds->y, (size_t)ny * d * sizeof(double), cudaMemcpyHostToDevice, cs));
        }
        QK_CK(cudaMalloc(&J->SA, std::max<size_t>(1, (size_t)tA * per_state)));
        QK_PROF_TRACK("qk states", J->SA, (size_t)tA * per_state);
        if (sym && bulk) J->SB = J->SA;
        else {
            QK_CK(cudaMalloc(&J->SB, std::max<size_t>(1, (size_t)tB * per_state)));
            QK_PROF_TRACK("qk states", J->SB, (size_t)tB * per_state);
        }
        if (!analytic && !stream_amp) {
            int64_t tmax = std::max(tA, tB);
            QK_CK(cudaMalloc(&J->ws.params, (size_t)tmax * J->pg.P * sizeof(T)));
            if (J->pg.passes.size() > 1) QK_CK(cudaMalloc(&J->ws.tmp, (size_t)tmax * D * 2 * sizeof(T)));
            if (J->pg.has_amp) QK_CK(cudaMalloc((void **)&J->ws.inv, (size_t)tmax * sizeof(double)));
        }
        if (use_blas) {
            QK_BLAS_CK(cublasCreate(&J->blas));
            QK_CK(cudaMalloc(&J->Cw[0], (qk__blas_ws_bytes<T, CPLX>(pl->use_blas, slab_rows, tB, D))));
            if (n_slabs > 1) {
                QK_CK(cudaMalloc(&J->Cw[1], (qk__blas_ws_bytes<T, CPLX>(pl->use_blas, slab_rows, tB, D))));
                QK_CK(cudaStreamCreateWithFlags(&J->est, cudaStreamNonBlocking));
                QK_PROF_STREAM_NAME(J->est, "qk epilogue");
                QK_CK(cudaEventCreateWithFlags(&J->gemm_done, cudaEventDisableTiming));
                for (int i = 0; i < 2; ++i) QK_CK(cudaEventCreateWithFlags(&J->ep_done[i], cudaEventDisableTiming));
            }
        }
        return QK_OK;
    }

    /* Pageable buffers are not page-locked for the job: registering fresh memory faults in every
       page on one thread (3.0 s for 6 GiB on the H200 machine), slower than the copy-out it
       saves; qk.h's delivery copies on all cores. */
    qk_result output()
    {
        if (!dev_out && !pinned_out && !J->rows)
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: staged output without a rows callback");
        if (dev_out) Kdev = (OutT *)ds->out;
        else if (k_resident) {
            QK_CK(cudaMalloc(&J->Kd, (size_t)nx * ny * sizeof(OutT)));
            QK_PROF_TRACK("qk K (resident)", J->Kd, (size_t)nx * ny * sizeof(OutT));
            Kdev = (OutT *)J->Kd;
        } else {
            QK_CK(cudaMalloc(&J->Kd, (size_t)2 * slab_rows * ny * sizeof(OutT)));
            QK_PROF_TRACK("qk K slab ring", J->Kd, (size_t)2 * slab_rows * ny * sizeof(OutT));
        }
        if (!dev_out && !pinned_out) {
            const size_t sb = (size_t)slab_rows * ny * sizeof(OutT);
            if (J->io_stage[0] && J->io_stage[1] && J->io_stage_bytes >= sb) {
                J->stage[0] = J->io_stage[0];
                J->stage[1] = J->io_stage[1];
            } else {
                J->own_stage = true;
                for (int i = 0; i < 2; ++i) QK_CK(cudaMallocHost(&J->stage[i], sb));
            }
        }
        for (int i = 0; i < 2; ++i) {
            QK_CK(cudaEventCreateWithFlags(&J->slab_done[i], cudaEventDisableTiming));
            QK_CK(cudaEventCreateWithFlags(&J->copy_done[i], cudaEventDisableTiming));
        }
        return QK_OK;
    }

    /* states (or per-qubit vectors) of rows [r0, r0 + cnt) of src into dst */
    qk_result build(const double *src, int64_t r0, int64_t cnt, void *dst)
    {
        if (analytic) return qk__launch_qubit_vectors<T>(J->dp, q, src + r0 * d, cnt, d, (T *)dst, cs, E);
        return qk__build_states<T>(J->pg, J->dp, src + r0 * d, cnt, J->ws, dst, !CPLX, cs, E);
    }

    /* K[A x B] (m x nn) into o (ld ldo), mirror into mo when given */
    qk_result gram(const void *A, const void *B, int64_t m, int64_t nn, OutT *o, int64_t ldo, OutT *mo, int64_t doff, int tri)
    {
        if (m <= 0 || nn <= 0) return QK_OK;
        if (analytic) return qk__launch_product<T, OutT>((const T *)A, (const T *)B, m, nn, q, o, ldo, mo, doff, tri, cs, E);
        if (!use_blas) return qk__launch_gram<T, CPLX, OutT>(pl->kernel_cfg, A, B, m, nn, (int)D, o, ldo, mo, doff, tri, cs, E);
        /* the workspace holds slab_rows x tB */
        for (int64_t c0 = 0; c0 < nn; c0 += tB) {
            int64_t cn = std::min(tB, nn - c0);
            const int k = (int)(J->n_blas & 1);
            void *cw = J->Cw[J->est ? k : 0];
            if (J->est && J->n_blas >= 2) QK_CK(cudaStreamWaitEvent(cs, J->ep_done[k], 0)); /* ring slot free */
            QK_TRY((qk__launch_blas<T, CPLX, OutT>(J->blas, pl->use_blas, A, (const char *)B + c0 * per_state, m, cn, (int)D, cw,
                                                    o + c0, ldo, mo ? mo + c0 * ldo : nullptr, doff + c0, tri, cs, E, J->est,
                                                    J->gemm_done)));
            if (J->est) QK_CK(cudaEventRecord(J->ep_done[k], J->est));
            J->n_blas++;
        }
        return QK_OK;
    }

    qk_result states()
    {
        if (!bulk) return QK_OK;
        if (stream_amp) { /* synchronous: the compute stream's kernels come after it */
            double sec = 0, sec2 = 0;
            char msg[256] = "";
            qk_result r = qk_cuda_amplitude_encode(ds->x, nx, d, q, sizeof(T) == 8 ? QK_PRECISION_FP64 : QK_PRECISION_FP32,
                                                   J->SA, 64, &sec, msg, sizeof msg);
            if (r == QK_OK && !sym)
                r = qk_cuda_amplitude_encode(ds->y, ny, d, q, sizeof(T) == 8 ? QK_PRECISION_FP64 : QK_PRECISION_FP32, J->SB, 64,
                                             &sec2, msg, sizeof msg);
            if (r != QK_OK) return qk__fail_msg(E, r, msg);
            enc_ms = (sec + sec2) * 1e3;
            return QK_OK;
        }
        QK_TRY(qk__mark(J, 0, QK__EV_STATES));
        QK_PROF_GPU_BEGIN("qk states", cs);
        QK_TRY(build(J->dx, 0, nx, J->SA));
        if (!sym) QK_TRY(build(J->dy, 0, ny, J->SB));
        QK_PROF_GPU_END("qk states", cs);
        QK_TRY(qk__mark(J, 0, QK__EV_STATES));
        return QK_OK;
    }

    /* where row i0 of slab s lives on the device */
    OutT *rows_of(int64_t s)
    {
        const int64_t i0 = s * slab_rows;
        if (Kdev) return Kdev + i0 * ldk;
        return (OutT *)J->Kd + (s & 1) * slab_rows * ny;
    }

    qk_result slab(int64_t s)
    {
        const int64_t i0 = s * slab_rows, m = std::min(slab_rows, nx - i0);
        if (!Kdev && s >= 2) QK_CK(cudaStreamWaitEvent(cs, J->copy_done[s & 1], 0)); /* ring slot shipped */
        OutT *base = rows_of(s);
        QK_TRY(qk__mark(J, 0, QK__EV_SLAB));
        QK_PROF_GPU_BEGIN("qk gram slab", cs);
        QK_PROF_COUNT("qk slabs", 1);
        const void *A;
        if (bulk) A = (const char *)J->SA + i0 * per_state;
        else { QK_TRY(build(J->dx, i0, m, J->SA)); A = J->SA; }
        const int64_t jstart = mirror ? i0 : 0;
        if (bulk) {
            const void *B = (const char *)J->SB + jstart * per_state;
            OutT *mo = mirror ? Kdev + jstart * ldk + i0 : nullptr;
            QK_TRY(gram(A, B, m, ny - jstart, base + jstart, ldk, mo, jstart - i0, mirror));
        } else {
            for (int64_t j0 = jstart; j0 < ny; j0 += state_tile) {
                int64_t nn = std::min(state_tile, ny - j0);
                const void *B;
                if (sym && j0 == i0 && nn <= m) B = A; /* A holds only the slab's m rows */
                else { QK_TRY(build(sym ? J->dx : J->dy, j0, nn, J->SB)); B = J->SB; }
                OutT *mo = mirror ? Kdev + j0 * ldk + i0 : nullptr;
                QK_TRY(gram(A, B, m, nn, base + j0, ldk, mo, j0 - i0, mirror && j0 == i0));
            }
        }
        if (J->est && s == n_slabs - 1) { /* the last epilogue ends the compute */
            QK_CK(cudaEventRecord(J->ep_done[0], J->est));
            QK_CK(cudaStreamWaitEvent(cs, J->ep_done[0], 0));
        }
        QK_PROF_GPU_END("qk gram slab", cs);
        QK_TRY(qk__mark(J, 0, QK__EV_SLAB));
        return QK_OK;
    }

    qk_result ship(int64_t s)
    {
        const int64_t i0 = s * slab_rows, m = std::min(slab_rows, nx - i0);
        const int b = (int)(s & 1);
        const size_t rowb = (size_t)ny * sizeof(OutT);
        QK_CK(cudaEventRecord(J->slab_done[b], J->est ? J->est : cs));
        /* staging[b]'s previous slab (s-2) was delivered on the host before slab s was queued */
        QK_CK(cudaStreamWaitEvent(xs, J->slab_done[b], 0));
        QK_TRY(qk__mark(J, 1, QK__EV_COPY));
        QK_PROF_GPU_BEGIN("qk D2H slab", xs);
        QK_PROF_COUNT("qk D2H bytes", (double)rowb * (double)m);
        if (pinned_out)
            QK_CK(cudaMemcpy2DAsync((OutT *)ds->out + i0 * ld_out, (size_t)ld_out * sizeof(OutT), rows_of(s),
                                    (size_t)ldk * sizeof(OutT), rowb, (size_t)m, cudaMemcpyDeviceToHost, xs));
        else
            QK_CK(cudaMemcpy2DAsync(J->stage[b], rowb, rows_of(s), (size_t)ldk * sizeof(OutT), rowb, (size_t)m,
                                    cudaMemcpyDeviceToHost, xs));
        QK_PROF_GPU_END("qk D2H slab", xs);
        QK_TRY(qk__mark(J, 1, QK__EV_COPY));
        QK_CK(cudaEventRecord(J->copy_done[b], xs));
        return QK_OK;
    }

    qk_result progress(int64_t m)
    {
        done_pairs += m * ny;
        if (ds->progress && ds->progress(done_pairs, nx * ny, ds->progress_user))
            return qk__fail_msg(E, QK_ERROR_CANCELLED, "progress callback cancelled the Gram");
        return QK_OK;
    }

    qk_result deliver(int64_t s)
    {
        const int64_t i0 = s * slab_rows, m = std::min(slab_rows, nx - i0);
        const int b = (int)(s & 1);
        QK_CK(cudaEventSynchronize(J->copy_done[b]));
        if (!pinned_out) {
            /* the callee sets qk's detail message; err stays empty */
            const double h0 = qk__host_ms();
            const qk_result r = J->rows(i0, m, J->stage[b], ny, J->rows_user);
            deliver_ms += qk__host_ms() - h0;
            ++*J->delivered;
            if (r != QK_OK) return r;
        }
        return progress(m);
    }

    qk_result stats()
    {
        qk_cuda_stats st;
        memset(&st, 0, sizeof st);
        st.n_streams = 2;
        st.n_slabs = (int)n_slabs;
        int first_slab = -1, last_slab = -1, last_any = -1;
        float last_any_ms = -1;
        for (size_t i = 0; i + 1 < J->pool.ev.size(); i += 2) {
            float ms = 0, e1 = 0;
            QK_CK(cudaEventElapsedTime(&ms, J->pool.ev[i], J->pool.ev[i + 1]));
            st.busy_ms[J->pool.ev_stream[i]] += ms;
            if (J->pool.ev_tag[i] == QK__EV_STATES) st.states_ms += ms;
            if (J->pool.ev_tag[i] == QK__EV_SLAB) { if (first_slab < 0) first_slab = (int)i; last_slab = (int)i + 1; }
            QK_CK(cudaEventElapsedTime(&e1, J->pool.t0, J->pool.ev[i + 1]));
            if (e1 > last_any_ms) { last_any_ms = e1; last_any = (int)i + 1; }
        }
        st.wall_ms = last_any_ms;
        if (first_slab >= 0) {
            float g = 0, o = 0;
            QK_CK(cudaEventElapsedTime(&g, J->pool.ev[first_slab], J->pool.ev[last_slab]));
            QK_CK(cudaEventElapsedTime(&o, J->pool.ev[first_slab], J->pool.ev[last_any]));
            st.gram_ms = g;
            st.output_ms = std::max(g, o);
        }
        st.deliver_ms = deliver_ms;
        st.states_ms += enc_ms;
        if (J->stats) *J->stats = st;
        return QK_OK;
    }

    qk_result run()
    {
        QK_TRY(alloc());
        QK_TRY(output());
        QK_TRY(states());
        for (int64_t s = 0; s < n_slabs; ++s) {
            QK_TRY(slab(s));
            if (dev_out) { QK_TRY(progress(std::min(slab_rows, nx - s * slab_rows))); continue; }
            QK_TRY(ship(s));
            if (s >= 1) QK_TRY(deliver(s - 1)); /* while slab s computes and ships */
        }
        if (!dev_out) QK_TRY(deliver(n_slabs - 1));
        if (J->est) QK_CK(cudaStreamSynchronize(J->est));
        QK_CK(cudaStreamSynchronize(cs));
        QK_CK(cudaStreamSynchronize(xs));
        return stats();
    }
};

/* the output dtype's instance of the pipeline */
template <typename T, bool CPLX>
static qk_result qk__gram_out(qk__job_state *J, int64_t slab, int64_t tile, int res)
{
    if (J->plan->out_dtype == QK_F64) return qk__pipe<T, CPLX, double>(J, slab, tile, res).run();
    return qk__pipe<T, CPLX, float>(J, slab, tile, res).run();
}

/* ======================================================================================== */
/*                                    extern "C" surface                                    */
/* ======================================================================================== */

extern "C" int qk_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}

extern "C" qk_result qk_cuda_device_query(int device, qk_device_info *info, char *err, size_t err_size)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        if (err) snprintf(err, err_size, "cudaGetDeviceProperties(%d): %s", device, cudaGetErrorString(e));
        cudaGetLastError();
        return QK_ERROR_NO_DEVICE;
    }
    memset(info, 0, sizeof *info);
    info->present = 1;
    memcpy(info->name, p.name, std::min(sizeof info->name, sizeof p.name) - 1);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->smem_per_block_optin = p.sharedMemPerBlockOptin;
    info->l2_bytes = (size_t)p.l2CacheSize;
    if (cudaDriverGetVersion(&info->driver_version) != cudaSuccess) { cudaGetLastError(); info->driver_version = 0; }
    e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMemGetInfo(&info->free_bytes, &info->total_bytes);
    if (e != cudaSuccess) {
        if (err) snprintf(err, err_size, "cudaMemGetInfo on device %d: %s", device, cudaGetErrorString(e));
        cudaGetLastError();
        return QK_ERROR_CUDA;
    }
    return QK_OK;
}

extern "C" int qk_cuda_host_pinned(const void *p)
{
    cudaPointerAttributes at;
    int pinned = p && cudaPointerGetAttributes(&at, p) == cudaSuccess && at.type == cudaMemoryTypeHost;
    cudaGetLastError();
    return pinned;
}

extern "C" qk_result qk_cuda_host_alloc(size_t bytes, void **p, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    *p = nullptr;
    QK_CK(cudaMallocHost(p, bytes ? bytes : 1));
    return QK_OK;
}

extern "C" void qk_cuda_host_free(void *p)
{
    if (p) cudaFreeHost(p);
    cudaGetLastError();
}

extern "C" qk_result qk_cuda_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, const qk_cuda_io *io,
                                  char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!plan || !map || !desc || !desc->x) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: NULL argument");
    if ((desc->output == QK_OUTPUT_DEVICE || desc->output == QK_OUTPUT_HOST) && !desc->out)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: out is NULL");
    if (plan->path != QK_PATH_ANALYTIC && map->n_qubits > QK_MAX_STATE_QUBITS)
        return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_gram: too many qubits for a state vector");
    int64_t slab = plan->tile_m > 0 ? plan->tile_m : 1024;
    int64_t tile = plan->state_tile > 0 && !plan->bulk_states ? plan->state_tile : INT64_MAX;
    int res = plan->k_resident;
    int64_t delivered = 0;
    const bool real = plan->path == QK_PATH_REAL;
    const bool p64 = plan->precision == QK_PRECISION_FP64;
    /* Out of device memory: halve the slab and state tile, then give up K residency, and retry
       from scratch (nothing has reached the caller's output before a slab completes; a host
       output may be partly written, which the result code says). */
    for (int attempt = 0;; ++attempt) {
        qk__job_state J;
        J.E = E;
        J.plan = plan;
        J.map = map;
        J.desc = desc;
        J.rows = io ? io->rows : nullptr;
        J.rows_user = io ? io->rows_user : nullptr;
        J.stats = io ? io->stats : nullptr;
        for (int i = 0; i < 2; ++i) J.io_stage[i] = io ? io->stage[i] : nullptr;
        J.io_stage_bytes = io ? io->stage_bytes : 0;
        J.delivered = &delivered;
        qk_result r;
        if (p64) r = real ? qk__gram_out<double, false>(&J, slab, tile, res) : qk__gram_out<double, true>(&J, slab, tile, res);
        else r = real ? qk__gram_out<float, false>(&J, slab, tile, res) : qk__gram_out<float, true>(&J, slab, tile, res);
        qk__job_free(&J);
        if (r != QK_ERROR_DEVICE_OUT_OF_MEMORY || delivered > 0) return r;
        if (res && !(desc->output == QK_OUTPUT_DEVICE)) { res = 0; continue; }
        if (slab > 64) { slab /= 2; continue; }
        if (tile == INT64_MAX) tile = 1 << 14;
        if (tile > 64) { tile /= 2; slab = std::min(slab, tile); continue; }
        return r;
    }
}

extern "C" qk_result qk_cuda_states(const qk_map *map, const double *x, int64_t n, qk_precision precision, double *out,
                                    char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!map || (!x && n > 0) || (!out && n > 0)) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_states: NULL argument");
    if (map->n_qubits > QK_MAX_STATE_QUBITS) return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_states: too many qubits");
    if (n == 0) return QK_OK;
    qk__prog pg;
    qk_map m2 = *map;
    if (m2.cls == QK_CLASS_PRODUCT) m2.cls = QK_CLASS_COMPLEX; /* build the state vector anyway */
    QK_TRY(qk__compile(&m2, &pg, E));
    pg.real_out = 0;
    qk__dprog dp;
    qk__build_ws ws;
    double *dx = nullptr, *dout = nullptr;
    void *st = nullptr;
    const int64_t D = (int64_t)1 << map->n_qubits;
    const bool p64 = precision == QK_PRECISION_FP64;
    const size_t cx = p64 ? 16 : 8, T = p64 ? 8 : 4;
    auto run = [&]() -> qk_result {
        QK_TRY(qk__dprog_make(pg, map, &dp, E));
        QK_CK(cudaMalloc((void **)&dx, std::max<size_t>(1, (size_t)n * map->n_features * sizeof(double))));
        QK_CK(cudaMemcpy(dx, x, (size_t)n * map->n_features * sizeof(double), cudaMemcpyHostToDevice));
        QK_CK(cudaMalloc(&ws.params, (size_t)n * pg.P * T));
        if (pg.passes.size() > 1) QK_CK(cudaMalloc(&ws.tmp, (size_t)n * D * cx));
        if (pg.has_amp) QK_CK(cudaMalloc((void **)&ws.inv, (size_t)n * sizeof(double)));
        QK_CK(cudaMalloc(&st, (size_t)n * D * cx));
        QK_CK(cudaMalloc((void **)&dout, (size_t)n * D * 2 * sizeof(double)));
        if (p64) {
            QK_TRY(qk__build_states<double>(pg, dp, dx, n, ws, st, false, 0, E));
            qk__k_widen<double><<<(unsigned)((n * D + 255) / 256), 256>>>((const qk__cx<double> *)st, dout, n * D);
        } else {
            QK_TRY(qk__build_states<float>(pg, dp, dx, n, ws, st, false, 0, E));
            qk__k_widen<float><<<(unsigned)((n * D + 255) / 256), 256>>>((const qk__cx<float> *)st, dout, n * D);
        }
        QK_LAUNCH_CK("widen");
        QK_CK(cudaMemcpy(out, dout, (size_t)n * D * 2 * sizeof(double), cudaMemcpyDeviceToHost));
        return QK_OK;
    };
    qk_result r = run();
    qk__dprog_free(&dp);
    cudaFree(dx); cudaFree(dout); cudaFree(st);
    cudaFree(ws.params); cudaFree(ws.tmp); cudaFree(ws.inv);
    return r;
}


/* ---- amplitude encoding from host data ---- */
/* A large host copy on several threads (pageable source into pinned staging): one core copies
   about 5.5 GB/s on the H200 machine, the H2D behind it runs at 55 GB/s (qk-bench amp16g,
   bench/results/2026-11-23-h200-final-a-bench.log: 388 ms to encode 2.1 GB of pageable X). */
static void qk__par_memcpy(void *dst, const void *src, size_t n)
{
    const size_t part = (size_t)8 << 20;
    int nt = (int)std::min<size_t>(8, (n + part - 1) / part);
    if (nt <= 1) { memcpy(dst, src, n); return; }
    std::vector<std::thread> th;
    for (int t = 1; t < nt; ++t)
        th.emplace_back([=] {
            size_t a = n * t / nt, b = n * (t + 1) / nt;
            memcpy((char *)dst + a, (const char *)src + a, b - a);
        });
    memcpy(dst, src, n / nt);
    for (auto &x : th) x.join();
}

extern "C" qk_result qk_cuda_amplitude_encode(const double *x, int64_t n, int d, int n_qubits, qk_precision precision,
                                              void *out_dev, int64_t batch, double *seconds, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!x || !out_dev || n < 0 || d < 1 || n_qubits < 0 || n_qubits > QK_MAX_STATE_QUBITS || ((int64_t)1 << n_qubits) < d)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_amplitude_encode: bad argument");
    if (batch <= 0) batch = 64;
    if (batch > n) batch = n > 0 ? n : 1;
    const int64_t D = (int64_t)1 << n_qubits;
    const size_t rowb = (size_t)d * sizeof(double);
    struct R {
        cudaStream_t cp = nullptr, ks = nullptr;
        double *dbuf[2] = {nullptr, nullptr};
        double *stage[2] = {nullptr, nullptr};
        cudaEvent_t h2d[2] = {nullptr, nullptr}, kdone[2] = {nullptr, nullptr}, t0 = nullptr, t1 = nullptr;
        ~R() {
            if (cp) cudaStreamSynchronize(cp);
            if (ks) cudaStreamSynchronize(ks);
            for (int i = 0; i < 2; ++i) {
                cudaFree(dbuf[i]);
                if (stage[i]) cudaFreeHost(stage[i]);
                if (h2d[i]) cudaEventDestroy(h2d[i]);
                if (kdone[i]) cudaEventDestroy(kdone[i]);
            }
            if (t0) cudaEventDestroy(t0);
            if (t1) cudaEventDestroy(t1);
            if (cp) cudaStreamDestroy(cp);
            if (ks) cudaStreamDestroy(ks);
            cudaGetLastError();
        }
    } R;
    cudaPointerAttributes at;
    bool pinned = cudaPointerGetAttributes(&at, x) == cudaSuccess && at.type == cudaMemoryTypeHost;
    cudaGetLastError();
    QK_CK(cudaStreamCreateWithFlags(&R.cp, cudaStreamNonBlocking));
    QK_CK(cudaStreamCreateWithFlags(&R.ks, cudaStreamNonBlocking));
    for (int i = 0; i < 2; ++i) {
        QK_CK(cudaMalloc((void **)&R.dbuf[i], (size_t)batch * rowb));
        if (!pinned) QK_CK(cudaMallocHost((void **)&R.stage[i], (size_t)batch * rowb));
        QK_CK(cudaEventCreateWithFlags(&R.h2d[i], cudaEventDisableTiming));
        QK_CK(cudaEventCreateWithFlags(&R.kdone[i], cudaEventDisableTiming));
    }
    QK_CK(cudaEventCreate(&R.t0));
    QK_CK(cudaEventCreate(&R.t1));
    QK_CK(cudaEventRecord(R.t0, R.cp));
    const int64_t nb = (n + batch - 1) / batch;
    for (int64_t b = 0; b < nb; ++b) {
        const int i = (int)(b & 1);
        const int64_t r0 = b * batch, rows = std::min(batch, n - r0);
        /* buffer i is free once the kernel of batch b-2 is done */
        if (b >= 2) QK_CK(cudaStreamWaitEvent(R.cp, R.kdone[i], 0));
        const double *src = x + r0 * d;
        if (!pinned) {
            if (b >= 2) QK_CK(cudaEventSynchronize(R.h2d[i])); /* staging i was read by batch b-2's copy */
            qk__par_memcpy(R.stage[i], src, rows * rowb);
            src = R.stage[i];
        }
        QK_CK(cudaMemcpyAsync(R.dbuf[i], src, rows * rowb, cudaMemcpyHostToDevice, R.cp));
        QK_CK(cudaEventRecord(R.h2d[i], R.cp));
        QK_CK(cudaStreamWaitEvent(R.ks, R.h2d[i], 0));
        if (precision == QK_PRECISION_FP64)
            qk__k_amp_encode<double><<<(unsigned)rows, 256, 0, R.ks>>>(R.dbuf[i], rows, d, D, (double *)out_dev + r0 * D);
        else
            qk__k_amp_encode<float><<<(unsigned)rows, 256, 0, R.ks>>>(R.dbuf[i], rows, d, D, (float *)out_dev + r0 * D);
        QK_LAUNCH_CK("amp_encode");
        QK_CK(cudaEventRecord(R.kdone[i], R.ks));
    }
    QK_CK(cudaEventRecord(R.t1, R.ks));
    QK_CK(cudaEventSynchronize(R.t1));
    if (seconds) {
        float ms = 0;
        QK_CK(cudaEventElapsedTime(&ms, R.t0, R.t1));
        *seconds = ms * 1e-3;
    }
    return QK_OK;
}

/* ---- autotune ---- */
__global__ void qk__k_fill_random(float *p, int64_t count, uint32_t seed)
{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= count) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 16; h *= 0x7feb352dU; h ^= h >> 15; h *= 0x846ca68bU; h ^= h >> 16;
    p[i] = (float)h * (2.0f / 4294967296.0f) - 1.0f;
}
__global__ void qk__k_fill_random_d(double *p, int64_t count, uint32_t seed)
{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= count) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 16; h *= 0x7feb352dU; h ^= h >> 15; h *= 0x846ca68bU; h ^= h >> 16;
    p[i] = (double)h * (2.0 / 4294967296.0) - 1.0;
}

struct qk__tune_ws {
    void *S = nullptr, *K = nullptr, *Cw = nullptr;
    cublasHandle_t h = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    ~qk__tune_ws() {
        cudaFree(S); cudaFree(K); cudaFree(Cw);
        if (h) cublasDestroy(h);
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
        cudaGetLastError();
    }
};

/* the tensor-core engine of a precision (qk.h's qk__tc_mode; FP64: its real form) */
static int qk__tc_mode_of(qk_precision p)
{
    return p == QK_PRECISION_TF32 ? 3 : p == QK_PRECISION_FP32X3 ? 4 : p == QK_PRECISION_FP16 ? 5 : p == QK_PRECISION_FP64 ? 7 : 0;
}

template <typename T, bool CPLX, typename OutT>
static qk_result qk__tune(const qk_plan *pl, int64_t n, int reps, qk_cuda_tune_result *res, qk__err *E)
{
    const int D = 1 << pl->n_qubits;
    const size_t es = CPLX ? 2 * sizeof(T) : sizeof(T);
    const int tcm = pl->n_qubits <= QK__TC_MAX_QUBITS ? qk__tc_mode_of(pl->precision) : 0;
    qk__tune_ws w;
    QK_CK(cudaMalloc(&w.S, (size_t)n * D * es));
    QK_CK(cudaMalloc(&w.K, (size_t)n * n * sizeof(OutT)));
    QK_CK(cudaMalloc(&w.Cw, (qk__blas_ws_bytes<T, CPLX>(tcm ? tcm : 1, n, n, D))));
    QK_BLAS_CK(cublasCreate(&w.h));
    QK_CK(cudaEventCreate(&w.e0));
    QK_CK(cudaEventCreate(&w.e1));
    const int64_t cnt = (int64_t)n * D * (CPLX ? 2 : 1);
    if (sizeof(T) == 4) qk__k_fill_random<<<(unsigned)((cnt + 255) / 256), 256>>>((float *)w.S, cnt, 12345u);
    else qk__k_fill_random_d<<<(unsigned)((cnt + 255) / 256), 256>>>((double *)w.S, cnt, 12345u);
    QK_LAUNCH_CK("fill_random");
    res->n = 0;
    for (int c = 1; c <= QK__N_FUSED_CFG; ++c) { res->blas[res->n] = 0; res->cfg[res->n] = c; res->n++; }
    res->blas[res->n] = 1; res->cfg[res->n] = 0; res->n++;
    if (CPLX && sizeof(T) == 4) { res->blas[res->n] = 2; res->cfg[res->n] = 0; res->n++; }
    if (tcm) { res->blas[res->n] = tcm; res->cfg[res->n] = 0; res->n++; }
    OutT *K = (OutT *)w.K;
    for (int c = 0; c < res->n; ++c) {
        std::vector<double> t;
        for (int r = 0; r < reps + 1; ++r) {
            QK_CK(cudaEventRecord(w.e0, 0));
            if (res->blas[c]) QK_TRY((qk__launch_blas<T, CPLX, OutT>(w.h, res->blas[c], w.S, w.S, n, n, D, w.Cw, K, n, K, 0, 1, 0, E)));
            else QK_TRY((qk__launch_gram<T, CPLX, OutT>(res->cfg[c], w.S, w.S, n, n, D, K, n, K, 0, 1, 0, E)));
            QK_CK(cudaEventRecord(w.e1, 0));
            QK_CK(cudaEventSynchronize(w.e1));
            float ms = 0;
            QK_CK(cudaEventElapsedTime(&ms, w.e0, w.e1));
            if (r > 0) t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        res->ms[c] = t[t.size() / 2];
    }
    res->best = 0;
    for (int c = 1; c < res->n; ++c) if (res->ms[c] < res->ms[res->best]) res->best = c;
    return QK_OK;
}

extern "C" qk_result qk_cuda_tune_gram(const qk_plan *plan, int64_t n_samples, int reps, qk_cuda_tune_result *res,
                                       char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!plan || !res) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_tune_gram: NULL argument");
    memset(res, 0, sizeof *res);
    if (plan->path == QK_PATH_ANALYTIC || plan->n_qubits > 20)
        return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "qk_cuda_tune_gram: nothing to tune for this path/size");
    int64_t n = n_samples > 0 ? n_samples : 4096;
    if (plan->n_x > 0 && n > plan->n_x) n = plan->n_x;
    if (reps < 1) reps = 3;
    res->n_samples = n;
    const bool real = plan->path == QK_PATH_REAL, p64 = plan->precision == QK_PRECISION_FP64, o64 = plan->out_dtype == QK_F64;
    if (p64) {
        if (real) return o64 ? qk__tune<double, false, double>(plan, n, reps, res, E) : qk__tune<double, false, float>(plan, n, reps, res, E);
        return o64 ? qk__tune<double, true, double>(plan, n, reps, res, E) : qk__tune<double, true, float>(plan, n, reps, res, E);
    }
    if (real) return o64 ? qk__tune<float, false, double>(plan, n, reps, res, E) : qk__tune<float, false, float>(plan, n, reps, res, E);
    return o64 ? qk__tune<float, true, double>(plan, n, reps, res, E) : qk__tune<float, true, float>(plan, n, reps, res, E);
}

/* ---- MPS engine (docs/mps.md) ---- */
/* K on the MPS path. qk.h builds every sample's MPS on the host (its exact builder, or the
   truncating one) and hands the site tensors over, padded to a bond of chi on both sides:
   site s of sample i is A[l][a][r] (l, r < chi, a < 2), entry e = (l * 2 + a) * chi + r, and the
   device layout is [site][entry][sample] (complex T2), so a block that needs entry e of 32
   consecutive samples reads 32 consecutive values. Zero padding is exact: padded entries add
   nothing to any product, and E starts as the 1 x 1 identity in its [0][0] corner.

   One overlap <a|b> is E = 1; per site T[l][a][r'] = sum_l' E[l][l'] B[l'][a][r'],
   E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a][r']; K = |E[0][0]|^2 after the last site:
   4 chi^3 complex multiply-adds per site and pair.

   Two kernels:
     qk__mps_reg<T, CHI>   chi <= 4 (padded to CHI = 2 or 4): one thread per pair, E and E' in
                           registers (2 x CHI^2 complex: 64 floats at CHI = 4), a block of 8 x 32
                           pairs (rows x columns of K); per site the block stages the 8 row and
                           32 column tensors in shared memory ([entry][sample]: a warp is one row
                           and 32 columns, so A is a broadcast and B 32 consecutive values, no bank
                           conflicts), the next site's tensors are loaded into registers while
                           this one is contracted. Per site and block: (8 + 32) x 2 CHI^2 complex
                           from L2 for 256 pairs x 4 CHI^3 multiply-adds.
     qk__mps_warp<T>       any chi up to QK_MPS_MAX_BOND: one warp per pair, E and T in shared
                           memory (3 chi^2 complex per warp), lanes split the entries of T and E';
                           the tensors are read from global memory (L1/L2).
   Both compute the pairs of a slab of rows; K(X,X) with K resident computes the pairs j >= i only
   and writes the mirror K[j][i] too. Precision: T = float (fp32) or double (fp64), K written in
   the output dtype. */
template <typename T> struct qk__mps_t2;
template <> struct qk__mps_t2<float> { typedef float2 t; };
template <> struct qk__mps_t2<double> { typedef double2 t; };

#define QK__MPS_TM 8    /* rows of K per block of the register kernel (blockDim.y) */
#define QK__MPS_TN 32   /* columns (blockDim.x: one warp) */

/* Arguments of one slab launch. */
template <typename T, typename OutT> struct qk__mps_args {
    const typename qk__mps_t2<T>::t *A, *B;   /* [site][entry][sample] */
    int64_t na, nb;                          /* samples in A and B (their leading dimension) */
    int q, chi;
    int64_t row0, rows;                      /* the slab: rows [row0, row0 + rows) of K */
    OutT *K;                                 /* row i of K at K + (i - krow0) * ldk */
    int64_t ldk, krow0;
    int sym;                                 /* 1: pairs j >= i only, mirror written (K resident) */
};

template <typename T, typename OutT>
__device__ __forceinline__ void qk__mps_store(const qk__mps_args<T, OutT> &g, int64_t i, int64_t j, T re, T im)
{
    const double v = (double)re * (double)re + (double)im * (double)im;
    if (g.sym) {
        if (j < i) return;
        g.K[(i - g.krow0) * g.ldk + j] = (OutT)v;
        if (j > i) g.K[(j - g.krow0) * g.ldk + i] = (OutT)v;
    } else {
        g.K[(i - g.krow0) * g.ldk + j] = (OutT)v;
    }
}

template <typename T, int CHI, typename OutT>
__global__ void __launch_bounds__(QK__MPS_TM * QK__MPS_TN)
qk__mps_reg(qk__mps_args<T, OutT> g)
{
    typedef typename qk__mps_t2<T>::t C;
    constexpr int E = 2 * CHI * CHI;                      /* entries per site */
    constexpr int NT = QK__MPS_TM * QK__MPS_TN;
    constexpr int LA = (E * QK__MPS_TM + NT - 1) / NT;    /* per-thread loads of A, B per site */
    constexpr int LB = (E * QK__MPS_TN + NT - 1) / NT;
    __shared__ C sA[E][QK__MPS_TM];
    __shared__ C sB[E][QK__MPS_TN];
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * QK__MPS_TN + tx;
    const int64_t i0 = g.row0 + (int64_t)blockIdx.y * QK__MPS_TM, j0 = (int64_t)blockIdx.x * QK__MPS_TN;
    const int64_t rend = g.row0 + g.rows;
    if (g.sym && j0 + QK__MPS_TN - 1 < i0) return;        /* wholly below the diagonal (block-uniform) */
    const int64_t i = i0 + ty, j = j0 + tx;
    C ra[LA], rb[LB];
    auto load = [&](int s) {
#pragma unroll
        for (int k = 0; k < LA; ++k) {
            const int x = tid + k * NT, e = x / QK__MPS_TM, r = x % QK__MPS_TM;
            C v; v.x = 0; v.y = 0;
            if (x < E * QK__MPS_TM && i0 + r < rend) v = g.A[((int64_t)s * E + e) * g.na + i0 + r];
            ra[k] = v;
        }
#pragma unroll
        for (int k = 0; k < LB; ++k) {
            const int x = tid + k * NT, e = x / QK__MPS_TN, c = x % QK__MPS_TN;
            C v; v.x = 0; v.y = 0;
            if (x < E * QK__MPS_TN && j0 + c < g.nb) v = g.B[((int64_t)s * E + e) * g.nb + j0 + c];
            rb[k] = v;
        }
    };
    auto stage = [&]() {
#pragma unroll
        for (int k = 0; k < LA; ++k) {
            const int x = tid + k * NT;
            if (x < E * QK__MPS_TM) sA[x / QK__MPS_TM][x % QK__MPS_TM] = ra[k];
        }
#pragma unroll
        for (int k = 0; k < LB; ++k) {
            const int x = tid + k * NT;
            if (x < E * QK__MPS_TN) sB[x / QK__MPS_TN][x % QK__MPS_TN] = rb[k];
        }
    };
    T er[CHI][CHI], ei[CHI][CHI];   /* E[l][l'] */
#pragma unroll
    for (int l = 0; l < CHI; ++l)
#pragma unroll
        for (int m = 0; m < CHI; ++m) { er[l][m] = (l == 0 && m == 0) ? (T)1 : (T)0; ei[l][m] = 0; }
    load(0);
    stage();
    __syncthreads();
    for (int s = 0; s < g.q; ++s) {
        if (s + 1 < g.q) load(s + 1);   /* in flight during this site's arithmetic */
        T nr[CHI][CHI], ni[CHI][CHI];   /* E'[r][r'] */
#pragma unroll
        for (int r = 0; r < CHI; ++r)
#pragma unroll
            for (int m = 0; m < CHI; ++m) { nr[r][m] = 0; ni[r][m] = 0; }
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int rp = 0; rp < CHI; ++rp) {
                T tr[CHI], ti[CHI];
                C b[CHI];
#pragma unroll
                for (int lp = 0; lp < CHI; ++lp) b[lp] = sB[(lp * 2 + a) * CHI + rp][tx];
#pragma unroll
                for (int l = 0; l < CHI; ++l) {   /* t = E b */
                    T xr = 0, xi = 0;
#pragma unroll
                    for (int lp = 0; lp < CHI; ++lp) {
                        xr = fma(er[l][lp], b[lp].x, xr); xr = fma(-ei[l][lp], b[lp].y, xr);
                        xi = fma(er[l][lp], b[lp].y, xi); xi = fma(ei[l][lp], b[lp].x, xi);
                    }
                    tr[l] = xr; ti[l] = xi;
                }
#pragma unroll
                for (int r = 0; r < CHI; ++r)
#pragma unroll
                    for (int l = 0; l < CHI; ++l) {   /* E'[r][rp] += conj(A[l][a][r]) t[l] */
                        const C av = sA[(l * 2 + a) * CHI + r][ty];
                        nr[r][rp] = fma(av.x, tr[l], nr[r][rp]); nr[r][rp] = fma(av.y, ti[l], nr[r][rp]);
                        ni[r][rp] = fma(av.x, ti[l], ni[r][rp]); ni[r][rp] = fma(-av.y, tr[l], ni[r][rp]);
                    }
            }
#pragma unroll
        for (int r = 0; r < CHI; ++r)
#pragma unroll
            for (int m = 0; m < CHI; ++m) { er[r][m] = nr[r][m]; ei[r][m] = ni[r][m]; }
        __syncthreads();                 /* every thread is done with this site's tiles */
        if (s + 1 < g.q) {
            stage();
            __syncthreads();
        }
    }
    if (i < rend && j < g.nb) qk__mps_store(g, i, j, er[0][0], ei[0][0]);
}

/* One warp per pair; blockDim.x = 32 * warps per block; dynamic shared memory 3 chi^2 complex per
   warp (E, then T of 2 chi^2). Pairs of the slab in row-major order, a grid-stride loop. */
template <typename T, typename OutT>
__global__ void qk__mps_warp(qk__mps_args<T, OutT> g)
{
    typedef typename qk__mps_t2<T>::t C;
    extern __shared__ unsigned char qk__mps_smem[];
    const int chi = g.chi, E = 2 * chi * chi, lane = threadIdx.x & 31, w = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    C *Em = (C *)qk__mps_smem + (size_t)w * 3 * chi * chi, *Tm = Em + chi * chi;
    const int64_t npairs = g.rows * g.nb;
    for (int64_t p = (int64_t)blockIdx.x * wpb + w; p < npairs; p += (int64_t)gridDim.x * wpb) {
        const int64_t i = g.row0 + p / g.nb, j = p % g.nb;
        if (g.sym && j < i) continue;   /* warp-uniform */
        for (int e = lane; e < chi * chi; e += 32) { Em[e].x = e == 0 ? (T)1 : (T)0; Em[e].y = 0; }
        __syncwarp();
        for (int s = 0; s < g.q; ++s) {
            const C *As = g.A + (int64_t)s * E * g.na + i, *Bs = g.B + (int64_t)s * E * g.nb + j;
            for (int o = lane; o < 2 * chi * chi; o += 32) {   /* T[l][c] = sum_l' E[l][l'] B[l'][c], c = a chi + r' */
                const int l = o / (2 * chi), c = o % (2 * chi);
                T xr = 0, xi = 0;
                for (int lp = 0; lp < chi; ++lp) {
                    const C ev = Em[l * chi + lp], bv = Bs[(int64_t)(lp * 2 * chi + c) * g.nb];
                    xr = fma(ev.x, bv.x, xr); xr = fma(-ev.y, bv.y, xr);
                    xi = fma(ev.x, bv.y, xi); xi = fma(ev.y, bv.x, xi);
                }
                Tm[o].x = xr; Tm[o].y = xi;
            }
            __syncwarp();
            for (int o = lane; o < chi * chi; o += 32) {   /* E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a chi + r'] */
                const int r = o / chi, rp = o % chi;
                T xr = 0, xi = 0;
                for (int la = 0; la < 2 * chi; ++la) {
                    const C av = As[(int64_t)(la * chi + r) * g.na], tv = Tm[la * chi + rp];
                    xr = fma(av.x, tv.x, xr); xr = fma(av.y, tv.y, xr);
                    xi = fma(av.x, tv.y, xi); xi = fma(-av.y, tv.x, xi);
                }
                Em[o].x = xr; Em[o].y = xi;
            }
            __syncwarp();
        }
        if (lane == 0) qk__mps_store(g, i, j, Em[0].x, Em[0].y);
        __syncwarp();
    }
}

/* Launches one slab. */
template <typename T, typename OutT>
static qk_result qk__mps_launch(const qk__mps_args<T, OutT> &g, int chi_pad, int sm_count, cudaStream_t st, qk__err *E)
{
    if (chi_pad <= 4) {
        dim3 blk(QK__MPS_TN, QK__MPS_TM), grd((unsigned)((g.nb + QK__MPS_TN - 1) / QK__MPS_TN), (unsigned)((g.rows + QK__MPS_TM - 1) / QK__MPS_TM));
        if (chi_pad <= 2) qk__mps_reg<T, 2, OutT><<<grd, blk, 0, st>>>(g);
        else qk__mps_reg<T, 4, OutT><<<grd, blk, 0, st>>>(g);
        QK_LAUNCH_CK("qk__mps_reg");
        return QK_OK;
    }
    const size_t per = (size_t)3 * chi_pad * chi_pad * sizeof(typename qk__mps_t2<T>::t);
    int wpb = (int)std::min<size_t>(8, (size_t)(96 << 10) / per);
    if (wpb < 1) wpb = 1;
    if (per * wpb > (48 << 10)) QK_CK(cudaFuncSetAttribute(qk__mps_warp<T, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(per * wpb)));
    int64_t blocks = (g.rows * g.nb + wpb - 1) / wpb, cap = (int64_t)(sm_count > 0 ? sm_count : 132) * 64;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    qk__mps_warp<T, OutT><<<(unsigned)blocks, 32 * wpb, per * wpb, st>>>(g);
    QK_LAUNCH_CK("qk__mps_warp");
    return QK_OK;
}

/* Device buffers and streams of one MPS Gram, released in every case. */
struct qk__mps_res {
    void *A = nullptr, *B = nullptr, *K = nullptr, *Kr[2] = {nullptr, nullptr}, *stage = nullptr;
    cudaStream_t cs = nullptr, ds = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr}, t0 = nullptr, t1 = nullptr;
    ~qk__mps_res()
    {
        cudaFree(A); cudaFree(B); cudaFree(K); cudaFree(Kr[0]); cudaFree(Kr[1]);
        if (stage) cudaFreeHost(stage);
        if (cs) cudaStreamDestroy(cs);
        if (ds) cudaStreamDestroy(ds);
        for (int k = 0; k < 2; ++k) if (ev[k]) cudaEventDestroy(ev[k]);
        if (t0) cudaEventDestroy(t0);
        if (t1) cudaEventDestroy(t1);
    }
};

/* Uploads n samples of packed doubles as T2 (fp32: converted on the host in chunks). */
template <typename T>
static qk_result qk__mps_upload(const double *src, size_t values, void **dst, cudaStream_t st, qk__err *E)
{
    QK_CK(cudaMalloc(dst, values * sizeof(T)));
    if (sizeof(T) == sizeof(double)) {
        QK_CK(cudaMemcpyAsync(*dst, src, values * sizeof(double), cudaMemcpyHostToDevice, st));
        QK_CK(cudaStreamSynchronize(st));
        return QK_OK;
    }
    const size_t chunk = (size_t)8 << 20;   /* values per step: 32 MB of floats */
    std::vector<float> buf(std::min(chunk, values));
    for (size_t o = 0; o < values; o += chunk) {
        const size_t m = std::min(chunk, values - o);
        for (size_t k = 0; k < m; ++k) buf[k] = (float)src[o + k];
        QK_CK(cudaMemcpy((float *)*dst + o, buf.data(), m * sizeof(float), cudaMemcpyHostToDevice));
    }
    return QK_OK;
}

template <typename T, typename OutT>
static qk_result qk__mps_gram_t(const qk_plan *plan, const qk_gram_desc *desc, const qk_cuda_mps *m, const qk_cuda_io *io, qk__err *E)
{
    typedef typename qk__mps_t2<T>::t C;
    qk__mps_res R;
    const int64_t nx = m->n_a, ny = m->b ? m->n_b : m->n_a;
    const bool sym = m->b == nullptr, dev_out = desc->output == QK_OUTPUT_DEVICE;
    const size_t per = (size_t)m->n_sites * 2 * m->chi * m->chi;   /* complex values per sample */
    int dev = 0, sms = 0;
    QK_CK(cudaGetDevice(&dev));
    QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    QK_CK(cudaStreamCreateWithFlags(&R.cs, cudaStreamNonBlocking));
    QK_CK(cudaStreamCreateWithFlags(&R.ds, cudaStreamNonBlocking));
    QK_CK(cudaEventCreate(&R.ev[0]));
    QK_CK(cudaEventCreate(&R.ev[1]));
    QK_CK(cudaEventCreate(&R.t0));
    QK_CK(cudaEventCreate(&R.t1));
    QK_TRY(qk__mps_upload<T>(m->a, per * 2 * (size_t)nx, &R.A, R.cs, E));
    if (!sym) QK_TRY(qk__mps_upload<T>(m->b, per * 2 * (size_t)ny, &R.B, R.cs, E));
    qk__mps_args<T, OutT> g;
    g.A = (const C *)R.A;
    g.B = (const C *)(sym ? R.A : R.B);
    g.na = nx;
    g.nb = ny;
    g.q = m->n_sites;
    g.chi = m->chi;
    QK_CK(cudaEventRecord(R.t0, R.cs));
    int64_t done = 0;
    auto progress = [&](int64_t rows) -> qk_result {
        done += rows * ny;
        if (desc->progress && desc->progress(done, nx * ny, desc->progress_user))
            return qk__fail_msg(E, QK_ERROR_CANCELLED, "progress callback cancelled the Gram");
        return QK_OK;
    };
    if (dev_out) {
        /* K straight into the caller's buffer, one slab per plan->slab_rows rows (progress) */
        const int64_t S = plan->slab_rows > 0 ? plan->slab_rows : nx;
        g.K = (OutT *)desc->out;
        g.ldk = desc->ld_out ? desc->ld_out : ny;
        g.krow0 = 0;
        g.sym = sym;
        for (int64_t r0 = 0; r0 < nx; r0 += S) {
            g.row0 = r0;
            g.rows = std::min(S, nx - r0);
            QK_TRY((qk__mps_launch<T, OutT>(g, m->chi, sms, R.cs, E)));
            QK_CK(cudaStreamSynchronize(R.cs));
            QK_TRY(progress(g.rows));
        }
    } else {
        /* host outputs: slabs of full rows to io->rows through pinned staging; K resident when
           the plan says so (K(X,X): the pairs j >= i, mirrored, so slab s is whole once slabs
           0..s ran), else a ring of two device slabs of full rows */
        const int64_t S = plan->slab_rows > 0 ? std::min(plan->slab_rows, nx) : nx;
        const size_t slab_bytes = (size_t)S * (size_t)ny * sizeof(OutT);
        const bool resident = plan->k_resident != 0;
        if (!io || !io->rows) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: no rows callback for a host output");
        if (resident) QK_CK(cudaMalloc(&R.K, (size_t)nx * (size_t)ny * sizeof(OutT)));
        else {
            QK_CK(cudaMalloc(&R.Kr[0], slab_bytes));
            QK_CK(cudaMalloc(&R.Kr[1], slab_bytes));
        }
        void *stage = io->stage[0] && io->stage_bytes >= slab_bytes ? io->stage[0] : nullptr;
        if (!stage) { QK_CK(cudaMallocHost(&R.stage, slab_bytes)); stage = R.stage; }
        const int64_t ns = (nx + S - 1) / S;
        auto launch = [&](int64_t s) -> qk_result {
            g.row0 = s * S;
            g.rows = std::min(S, nx - g.row0);
            if (resident) { g.K = (OutT *)R.K; g.krow0 = 0; g.sym = sym; }
            else { g.K = (OutT *)R.Kr[s & 1]; g.krow0 = g.row0; g.sym = 0; }
            g.ldk = ny;
            QK_TRY((qk__mps_launch<T, OutT>(g, m->chi, sms, R.cs, E)));
            QK_CK(cudaEventRecord(R.ev[s & 1], R.cs));
            return QK_OK;
        };
        QK_TRY(launch(0));
        for (int64_t s = 0; s < ns; ++s) {
            const int64_t r0 = s * S, rows = std::min(S, nx - r0);
            if (s + 1 < ns) QK_TRY(launch(s + 1));   /* computes while slab s goes out */
            QK_CK(cudaStreamWaitEvent(R.ds, R.ev[s & 1], 0));
            const OutT *src = resident ? (const OutT *)R.K + (size_t)r0 * (size_t)ny : (const OutT *)R.Kr[s & 1];
            QK_CK(cudaMemcpyAsync(stage, src, (size_t)rows * (size_t)ny * sizeof(OutT), cudaMemcpyDeviceToHost, R.ds));
            QK_CK(cudaStreamSynchronize(R.ds));
            qk_result r = io->rows(r0, rows, stage, ny, io->rows_user);
            if (r != QK_OK) { cudaStreamSynchronize(R.cs); if (E->buf && E->size) E->buf[0] = 0; return r; }
            r = progress(rows);
            if (r != QK_OK) { cudaStreamSynchronize(R.cs); return r; }
        }
    }
    QK_CK(cudaEventRecord(R.t1, R.cs));
    QK_CK(cudaEventSynchronize(R.t1));
    if (io && io->stats) {
        float ms = 0;
        QK_CK(cudaEventElapsedTime(&ms, R.t0, R.t1));
        io->stats->gram_ms = ms;
        io->stats->n_streams = 2;
        io->stats->n_slabs = (int)((nx + (plan->slab_rows > 0 ? plan->slab_rows : nx) - 1) / (plan->slab_rows > 0 ? plan->slab_rows : nx));
    }
    return QK_OK;
}

extern "C" qk_result qk_cuda_mps_gram(const qk_plan *plan, const qk_gram_desc *desc, const qk_cuda_mps *mps,
                                      const qk_cuda_io *io, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!plan || !desc || !mps || !mps->a) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: NULL argument");
    if (mps->n_sites < 1 || mps->chi < 1 || mps->chi > 64 || mps->n_a < 1 || (mps->b && mps->n_b < 1))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: bad MPS shape");
    const bool p64 = plan->precision == QK_PRECISION_FP64 || plan->precision == QK_PRECISION_FP32X3;
    const bool o64 = plan->out_dtype == QK_F64;
    if (p64) return o64 ? qk__mps_gram_t<double, double>(plan, desc, mps, io, E) : qk__mps_gram_t<double, float>(plan, desc, mps, io, E);
    return o64 ? qk__mps_gram_t<float, double>(plan, desc, mps, io, E) : qk__mps_gram_t<float, float>(plan, desc, mps, io, E);
}
/* ---- end MPS engine ---- */
