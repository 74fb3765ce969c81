/* ======================================================================================== */
/* >>states ---- prep, pass and qubit-vector kernels; qk__build_states ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"
#include "compile.cuh"

/* What a state builder writes: complex states (mode 0: rows of D float2), or Gauss's operand
   planes of the fp16 (mode 1), bfloat16 (mode 2) or fp32x3 (mode 3) tensor-core engine, as the
   operand pass (qk__launch_tc_operand3) makes them from complex states: planes re, im, re - im,
   re + im of scale * amplitude (scale: the engine's 2^floor(q/2)), ps values apart, row s of
   plane p at p * ps + s * R values from the start, R = D (modes 1, 2) or 4D (mode 3: the blocks
   [hi lo hi hi]) (qk__gauss_store). */
struct qk__planes_out {
    int mode;
    float scale;
    int64_t ps;
};
/* amplitude g = (x, y) of state s (D amplitudes) into po's planes (mode 1..3) */
__device__ __forceinline__ void qk__planes_put(const qk__planes_out &po, void *out, int64_t s, int64_t D, int64_t g, float x, float y)
{
    const float2 z = make_float2(x, y);
    if (po.mode == 1) qk__gauss_store<__half, false>(z, 0xFu, po.scale, (__half *)out + s * D + g, D, po.ps);
    else if (po.mode == 2) qk__gauss_store<__nv_bfloat16, false>(z, 0xFu, po.scale, (__nv_bfloat16 *)out + s * D + g, D, po.ps);
    else qk__gauss_store<__half, true>(z, 0xFu, po.scale, (__half *)out + s * 4 * D + g, D, po.ps);
}

/* 2x2 matrix of a one-qubit gate (qk__u1, shared with the CPU engine): m00 re, im, m01 re, im,
   m10 re, im, m11 re, im; the identity for BASIS on a 0. */
__device__ void qk__gate_matrix(int kind, double t, const double *xs, const qk_angle *ang, int op, double *m)
{
    qk__u1(kind, t, kind == QK_OP_BASIS && qk__basis_one(xs[ang[op].x0]), m);
}

/* Per-sample parameters: gate matrices and phase coefficients (double math, stored as T). */
template <typename T>
__global__ void qk__k_prep(const qk__job *__restrict__ jobs, int n_jobs, const qk__contrib *__restrict__ con,
                           const qk_angle *__restrict__ ang, const int *__restrict__ op_kind,
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
            ps[jb.out + QK__QV_RE0] = (T)u0r; ps[jb.out + QK__QV_IM0] = (T)u0i;
            ps[jb.out + QK__QV_RE1] = (T)u1r; ps[jb.out + QK__QV_IM1] = (T)u1i;
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

/* The pass descriptor is a __grid_constant__ parameter: its pos / npos arrays are indexed with
   run-time values (qk__pdep, the phase tables), which on a by-value parameter compiles to a
   compare-and-select over every element (~60 instructions per access; Nsight Compute's source
   counters on the structured pass: 35% of its instructions). As a grid constant they are one
   constant-bank load. */
/* One pass of the state program over chunks of 2^L amplitudes (see the design comment).
   Block: spb states x tps threads each; grid: (states / spb) * chunks. OUT_REAL writes the real
   part only (real maps); po (float complex states, mode 1..3) the operand planes instead. */
template <typename T, bool OUT_REAL>
__global__ void qk__k_pass(const __grid_constant__ qk__pass p, const qk__instr *__restrict__ prog, int q,
                           const T *__restrict__ params, int P, int64_t n,
                           const double *__restrict__ amp_x, const double *__restrict__ amp_inv, int amp_d,
                           const qk__cx<T> *__restrict__ in, void *__restrict__ out, int spb, int tps, int stage,
                           const qk__planes_out po)
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
    if (stage) {
        /* the state's parameters in shared memory (after the tables): the DIAG tables' phase sums
           and the gates read them with data-dependent indices, each a dependent load, which from
           global memory waited for L1 / L2 every time */
        T *sp = (T *)((C *)qk__smem + (size_t)spb * N) + (size_t)spb * TBL + (size_t)ls * P;
        if (active)
            for (int k = lt; k < P; k += tps) sp[k] = ps[k];
        ps = sp;
        __syncthreads();
    }

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
                    const T *uk = u + 4 * p.pos[i0 + i] + ((v >> i) & 1) * 2; /* QK__QV_RE0 or _RE1 */
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
                if (fixed == 0) {
                    /* no fixed qubits (a one-pass state): TL[e] = cf0 + the linear terms of e's
                       bits + the pair terms of its bit pairs, the 7 + 21 coefficients read once
                       into registers and every entry an unrolled sum over the bl <= 7 bits (pos
                       ascends, so bit k2 > k1 is the higher qubit); qk__phase walks the set bits
                       with a dependent load a term (docs/benchmarks.md, "Per-call costs") */
                    T lin[7], pr[21];
#pragma unroll
                    for (int k2 = 0; k2 < 7; ++k2) {
                        const int u2 = k2 < bl ? p.pos[k2] : 0;   /* in range whatever the compiler hoists */
                        lin[k2] = k2 < bl ? cf[1 + u2] : (T)0;
#pragma unroll
                        for (int k1 = 0; k1 < k2; ++k1)
                            pr[k2 * (k2 - 1) / 2 + k1] = k2 < bl ? cf[1 + q + u2 + (k2 < bl ? p.pos[k1] : 0) * q] : (T)0;
                    }
                    for (int e = lt; e < (1 << bl); e += tps) {
                        T ph = qf;
#pragma unroll
                        for (int k2 = 0; k2 < 7; ++k2) {
                            T t = lin[k2];
#pragma unroll
                            for (int k1 = 0; k1 < k2; ++k1) t += ((e >> k1) & 1) ? pr[k2 * (k2 - 1) / 2 + k1] : (T)0;
                            ph += ((e >> k2) & 1) ? t : (T)0;
                        }
                        TL[e] = ph;
                    }
                } else {
                    for (int e = lt; e < (1 << bl); e += tps) TL[e] = qk__phase<T>(fixed | qk__pdep(e, p), cf, q);
                }
                for (int e = lt; e < (1 << bh); e += tps) TH[e] = qk__phase<T>(fixed | qk__pdep((uint32_t)e << bl, p), cf, q) - qf;
                for (int e = lt; e < (bh << bl); e += tps) {
                    /* E[j][lo]: lo's pair terms with hi bit j, an unrolled sum of independent loads */
                    const int j = e >> bl, lo = e & ((1 << bl) - 1);
                    const T *dj = cf + 1 + q + p.pos[bl + j];
                    T acc = 0;
#pragma unroll
                    for (int i = 0; i < 7; ++i)
                        if (i < bl && ((lo >> i) & 1)) acc += dj[(i < bl ? p.pos[i] : 0) * q];
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
            else if (sizeof(T) == 4 && po.mode) qk__planes_put(po, out, s, D, g, (float)a[r].x, (float)a[r].y);
            else ((C *)out)[s * D + g] = a[r];
        }
    }
}

/* The structured pass: a pass of QK__PASS_QUBITS in-chunk qubits whose program is DIAG phases
   and Hadamards only (zz, iqp and their entanglement variants: every pass of them). The generic
   pass above spends ~360 instructions per amplitude there (16 qubits, Nsight Compute: issue
   bound, a 2x2 complex matrix per gate, sweeps through shared memory); this one keeps each
   thread's R = 2^RB amplitudes in registers:
   - the runs of Hadamards between phases are a Walsh-Hadamard transform over their bits: add /
     subtract butterflies on the register bits, one scale (1/sqrt 2)^m, and a transpose through
     shared memory (swizzled: no bank conflicts) to bring the next bits into registers; the
     chunk's 13 bits take 3 register layouts, 2 transposes;
   - a phase is base(thread) + sum_{j in k} e_j + sum_{j<j' in k} d_jj' over the set register
     bits j of register slot k: base and e_j once per thread from the quadratic form's
     coefficients, then a handful of adds per amplitude (k is a compile-time index).
   Layout rb0: register bit j of thread t is in-chunk bit rb0 + j; the thread's bits fill the
   others in order. Layouts rb0 >= 5 put in-chunk bits 0..4 on the lanes of a warp (coalesced
   global loads and stores when those are global bits 0..4, as the compiler's fill makes them).
   One state chunk per block, 2^(L - RB) threads; the host sends other passes to qk__k_pass. */
template <int RB> struct qk__wht_layouts;
template <> struct qk__wht_layouts<5> { static constexpr int n = 3; __device__ static int at(int i) { return i == 0 ? 8 : i == 1 ? 0 : 5; } };
template <> struct qk__wht_layouts<4> { static constexpr int n = 4; __device__ static int at(int i) { return i == 0 ? 9 : (i - 1) * 4; } };

__device__ __forceinline__ uint32_t qk__wht_tpart(uint32_t t, int rb0, int RB)
{
    return (t & ((1u << rb0) - 1)) | ((t >> rb0) << (rb0 + RB));
}
__device__ __forceinline__ uint32_t qk__wht_swz(uint32_t r) { return r ^ ((r >> 5) & 31); }
/* The global amplitude index of register slot k of thread t in layout cur: the thread's part
   (fixed bits and its in-chunk bits) or the qubits of the set register bits (k is a
   compile-time index at every use: the selection folds away). */
template <int RB> struct qk__wht_gidx {
    uint32_t gt, gb[RB];
    __device__ __forceinline__ qk__wht_gidx(const qk__pass &p, uint32_t fixed, uint32_t t, int cur)
    {
        gt = fixed | qk__pdep(qk__wht_tpart(t, cur, RB), p);
#pragma unroll
        for (int j = 0; j < RB; ++j) gb[j] = 1u << p.pos[cur + j];
    }
    __device__ __forceinline__ uint32_t operator()(int k) const
    {
        uint32_t g = gt;
#pragma unroll
        for (int j = 0; j < RB; ++j) if ((k >> j) & 1) g |= gb[j];
        return g;
    }
};
/* A DIAG's phase on a thread's 2^RB register amplitudes: slot k gets base + sum of e_j over its set
   register bits j + sum of dd[j'][j] over its pairs of them (k is a compile-time index: a handful
   of adds per amplitude); the structured passes' shared last step (qk__k_pass_wht, qk__k_states_fz). */
template <typename T, int RB, typename V>
__device__ __forceinline__ void qk__wht_phase(T base, const T (&e)[RB], const T (&dd)[RB][RB], V (&v)[1 << RB])
{
#pragma unroll
    for (int k = 0; k < (1 << RB); ++k) {
        T ph = base, sn, cs;
#pragma unroll
        for (int j = 0; j < RB; ++j) {
            if (!((k >> j) & 1)) continue;
            ph += e[j];
#pragma unroll
            for (int jj = 0; jj < RB; ++jj) if (jj < j && ((k >> jj) & 1)) ph += dd[jj][j];
        }
        qk__sincos(ph, &sn, &cs);
        const V a = v[k];
        v[k].x = a.x * cs - a.y * sn;
        v[k].y = a.x * sn + a.y * cs;
    }
}

/* T values of the structured pass's tables: the phase tables (at most 13 + 1 + 16 + 32 + 5 * 16
   + 5 * 16 + 5 * 32 for RB 4 or 5), then the fold's 16 + 32 + 1 complex */
#define QK__WHT_TBL 448

template <typename T, int RB, bool OUT_REAL>
__global__ void __launch_bounds__(1 << (QK__PASS_QUBITS - RB))
qk__k_pass_wht(const __grid_constant__ qk__pass p, const qk__instr *__restrict__ prog, int q, const T *__restrict__ params, int P,
               const qk__cx<T> *__restrict__ in, void *__restrict__ out, const qk__planes_out po)
{
    constexpr int L = QK__PASS_QUBITS, R = 1 << RB;
    typedef qk__cx<T> C;
    typedef typename qk__vec2<T>::t V2;
    typedef qk__wht_layouts<RB> LY;
    extern __shared__ __align__(16) unsigned char qk__smem[];
    C *sh = (C *)qk__smem;
    T *tb = (T *)(sh + (1 << L)); /* the phase tables, then the fold's */
    constexpr int NHI = L - RB - 4; /* thread bits 0..3 index the "lo" tables, the others "hi" */
    const uint32_t t = threadIdx.x;
    const int64_t nchunks = (int64_t)1 << (q - L);
    const int64_t s = blockIdx.x / nchunks, chunk = blockIdx.x % nchunks;
    const int64_t D = (int64_t)1 << q;
    uint32_t fixed = 0;
    for (int i = 0; i < q - L; ++i) if ((chunk >> i) & 1) fixed |= 1u << p.npos[i];
    const T *ps = params + s * (int64_t)P;
    int cur = LY::at(0);
    C v[R];

    /* start: the folded product state, |0>, or the previous pass's amplitudes */
    {
        if (p.first && p.fold >= 0) {
            /* prod over qubits of u_Q[bit]: the thread's factor from block tables (fixed bits,
               thread bits 0..3, thread bits 4..), then a product tree over the register bits
               (2 complex products per amplitude) */
            const T *u = ps + p.fold;
            C *UL = (C *)(tb + QK__WHT_TBL), *UH = UL + 16, *UF = UH + (1 << NHI);
            if (t < 16 + (1u << NHI) + 1) {
                const bool lo = t < 16, hi = !lo && t < 16 + (1u << NHI);
                const uint32_t e = lo ? t : t - 16;
                T ar = 1, ai = 0;
                if (lo || hi)
                    for (int i = 0; i < (lo ? 4 : NHI); ++i) {
                        const int b = lo ? i : 4 + i, ib = b < cur ? b : b + RB;
                        const T *uk = u + 4 * p.pos[ib] + ((e >> i) & 1) * 2;
                        T br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                        ar = br; ai = bi;
                    }
                else
                    for (int i = 0; i < q - L; ++i) {
                        const T *uk = u + 4 * p.npos[i] + ((fixed >> p.npos[i]) & 1) * 2;
                        T br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                        ar = br; ai = bi;
                    }
                C z; z.x = ar; z.y = ai;
                if (lo) UL[e] = z; else if (hi) UH[e] = z; else UF[0] = z;
            }
            __syncthreads();
            C a = UF[0], l = UL[t & 15], h = UH[t >> 4], m;
            m.x = a.x * l.x - a.y * l.y; m.y = a.x * l.y + a.y * l.x;
            v[0].x = m.x * h.x - m.y * h.y; v[0].y = m.x * h.y + m.y * h.x;
            /* constant trip counts throughout: an inner bound of 1 << j kept the loops rolled
               and made v[] dynamically indexed (a compare-and-select over all 32 registers per
               access: 35% of the pass's instructions, Nsight Compute source counters) */
#pragma unroll
            for (int j = 0; j < RB; ++j) {
                const T *u0 = u + 4 * p.pos[cur + j], *u1 = u0 + 2;
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    if (k >= (1 << j)) continue;
                    C a = v[k], b, c;
                    b.x = a.x * u1[0] - a.y * u1[1]; b.y = a.x * u1[1] + a.y * u1[0];
                    c.x = a.x * u0[0] - a.y * u0[1]; c.y = a.x * u0[1] + a.y * u0[0];
                    v[k | (1 << j)] = b;
                    v[k] = c;
                }
            }
        } else {
            const qk__wht_gidx<RB> gi(p, fixed, t, cur);
#pragma unroll
            for (int k = 0; k < R; ++k) {
                const uint32_t g = gi(k);
                if (p.first) { v[k].x = g == 0 ? (T)1 : (T)0; v[k].y = 0; }
                else { const V2 w = ((const V2 *)in)[s * D + g]; v[k].x = w.x; v[k].y = w.y; }
            }
        }
    }

    /* moves the amplitudes to layout nw through shared memory */
    auto transpose = [&](int nw) {
        const uint32_t to = qk__wht_tpart(t, cur, RB), tn = qk__wht_tpart(t, nw, RB);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < R; ++k) sh[qk__wht_swz(to | ((uint32_t)k << cur))] = v[k];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < R; ++k) v[k] = sh[qk__wht_swz(tn | ((uint32_t)k << nw))];
        cur = nw;
    };
    /* the pending Hadamards (a mask of in-chunk bits; H H = I) as one transform */
    auto flush = [&](uint32_t pend) {
        const int m = __popc(pend);
        while (pend) {
            uint32_t rm = ((1u << RB) - 1) << cur;
            if (!(pend & rm)) {
                int best = cur, bc = 0;
                for (int i = 0; i < LY::n; ++i) {
                    int c = __popc(pend & (((1u << RB) - 1) << LY::at(i)));
                    if (c > bc) { bc = c; best = LY::at(i); }
                }
                transpose(best);
                rm = ((1u << RB) - 1) << cur;
            }
#pragma unroll
            for (int j = 0; j < RB; ++j) {
                if (!((pend >> (cur + j)) & 1)) continue;
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    if ((k >> j) & 1) continue;
                    C a = v[k], b = v[k | (1 << j)];
                    v[k].x = a.x + b.x; v[k].y = a.y + b.y;
                    v[k | (1 << j)].x = a.x - b.x; v[k | (1 << j)].y = a.y - b.y;
                }
            }
            pend &= ~rm;
        }
        if (m) {
            const T sc = (T)ldexp((m & 1) ? 0.70710678118654752440 : 1.0, -(m >> 1));
#pragma unroll
            for (int k = 0; k < R; ++k) { v[k].x *= sc; v[k].y *= sc; }
        }
    };

    uint32_t pend = 0;
    for (int ii = p.i0; ii < p.i1; ++ii) {
        const qk__instr in_ = prog[ii];
        if (in_.kind == QK__I_GATE) { pend ^= 1u << in_.b0; continue; }
        flush(pend);
        pend = 0;
        /* DIAG: phase(g) = cf[0] + sum_{i set} cf[1+i] + sum_{i<j set} cf[1+q+i*q+j] */
        const T *cf = ps + in_.off;
        /* base and e_j from block tables, no per-thread loops over set bits (they diverged and
           cost ~40% of the pass). Thread bit b is in-chunk bit ib(b) (b < cur ? b : b + RB),
           global qubit pos[ib(b)]; W[r]: in-chunk bit r's linear coefficient plus its pairs with
           the fixed bits; TLo / THi: the phase of thread bits 0..3 / 4.. (W and their pairs);
           Y[i][lo]: pairs of thread bit 4+i with bits 0..3; G[j][lo] / H[j][hi]: pairs of
           register bit j with thread bits 0..3 / 4... */
        T *W = tb, *Pf = W + L, *TLo = Pf + 1, *THi = TLo + 16, *Y = THi + (1 << NHI), *G = Y + NHI * 16,
          *H = G + RB * 16;
        auto dq = [&](int a, int b) { return cf[1 + q + (a < b ? a * q + b : b * q + a)]; };
        auto tq = [&](int b) { return p.pos[b < cur ? b : b + RB]; }; /* thread bit -> qubit */
        __syncthreads(); /* the previous DIAG's readers are done */
        if (t < L) {
            const int Q = p.pos[t];
            T acc = cf[1 + Q];
            for (int i = 0; i < q - L; ++i) if ((fixed >> p.npos[i]) & 1) acc += dq(p.npos[i], Q);
            W[t] = acc;
        } else if (t == L) Pf[0] = qk__phase<T>(fixed, cf, q);
        __syncthreads();
        {
            int e = (int)t;
            T acc = 0;
            if (e < 16) {
                for (int b = 0; b < 4; ++b) {
                    if (!((e >> b) & 1)) continue;
                    acc += W[b < cur ? b : b + RB];
                    for (int b2 = 0; b2 < b; ++b2) if ((e >> b2) & 1) acc += dq(tq(b2), tq(b));
                }
                TLo[e] = acc;
            } else if ((e -= 16) < (1 << NHI)) {
                for (int i = 0; i < NHI; ++i) {
                    if (!((e >> i) & 1)) continue;
                    acc += W[4 + i < cur ? 4 + i : 4 + i + RB];
                    for (int i2 = 0; i2 < i; ++i2) if ((e >> i2) & 1) acc += dq(tq(4 + i2), tq(4 + i));
                }
                THi[e] = acc;
            } else if ((e -= 1 << NHI) < NHI * 16) {
                const int i = e >> 4, lo = e & 15;
                for (int b = 0; b < 4; ++b) if ((lo >> b) & 1) acc += dq(tq(b), tq(4 + i));
                Y[e] = acc;
            } else if ((e -= NHI * 16) < RB * 16) {
                const int j = e >> 4, lo = e & 15;
                for (int b = 0; b < 4; ++b) if ((lo >> b) & 1) acc += dq(tq(b), p.pos[cur + j]);
                G[e] = acc;
            } else if ((e -= RB * 16) < RB << NHI) {
                const int j = e >> NHI, hi = e & ((1 << NHI) - 1);
                for (int i = 0; i < NHI; ++i) if ((hi >> i) & 1) acc += dq(tq(4 + i), p.pos[cur + j]);
                H[e] = acc;
            }
        }
        __syncthreads();
        const uint32_t tl = t & 15, th = t >> 4;
        T base = Pf[0] + TLo[tl] + THi[th];
#pragma unroll
        for (int i = 0; i < NHI; ++i) base += ((th >> i) & 1) ? Y[i * 16 + tl] : (T)0;
        T e[RB], dd[RB][RB];
#pragma unroll
        for (int j = 0; j < RB; ++j) {
            e[j] = W[cur + j] + G[j * 16 + tl] + H[(j << NHI) + th];
#pragma unroll
            for (int jj = 0; jj < RB; ++jj) if (jj < j) dd[jj][j] = cf[1 + q + p.pos[cur + jj] * q + p.pos[cur + j]];
        }
        qk__wht_phase<T, RB>(base, e, dd, v);
    }
    flush(pend);

    /* store from a layout with in-chunk bits 0..4 on the lanes */
    if (cur < 5) transpose(LY::at(0));
    const qk__wht_gidx<RB> gi(p, fixed, t, cur);
    /* one loop a format, as the fused kernel's store (docs/benchmarks.md, "Every state builder
       writes the planes") */
    if (OUT_REAL || sizeof(T) != 4 || !po.mode) {
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const uint32_t g = gi(k);
            if (OUT_REAL) ((T *)out)[s * D + g] = v[k].x;
            else { V2 w; w.x = v[k].x; w.y = v[k].y; ((V2 *)out)[s * D + g] = w; } /* one 8/16-byte store */
        }
    } else if (po.mode == 1) {
#pragma unroll
        for (int k = 0; k < R; ++k)
            qk__gauss_store<__half, false>(make_float2((float)v[k].x, (float)v[k].y), 0xFu, po.scale, (__half *)out + s * D + gi(k), D, po.ps);
    } else if (po.mode == 3) {
#pragma unroll
        for (int k = 0; k < R; ++k)
            qk__gauss_store<__half, true>(make_float2((float)v[k].x, (float)v[k].y), 0xFu, po.scale, (__half *)out + s * 4 * D + gi(k), D, po.ps);
    } else {
#pragma unroll
        for (int k = 0; k < R; ++k)
            qk__gauss_store<__nv_bfloat16, false>(make_float2((float)v[k].x, (float)v[k].y), 0xFu, po.scale,
                                                  (__nv_bfloat16 *)out + s * D + gi(k), D, po.ps);
    }
}

/* Product maps: per sample and qubit the 2-vector u_k = (ops on qubit k) |0>. */
template <typename T>
__global__ void qk__k_qubit_vectors(const int *__restrict__ qops, const int *__restrict__ qoff, int q,
                                    const qk_angle *__restrict__ ang, const int *__restrict__ op_kind,
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
    T *o = u + (s * q + k) * 4; /* the shared layout (QK__QV_*) */
    o[QK__QV_RE0] = (T)a0r; o[QK__QV_IM0] = (T)a0i; o[QK__QV_RE1] = (T)a1r; o[QK__QV_IM1] = (T)a1i;
}

/* Build scratch of qk__build_states: params (n * P), a state buffer for multi-pass programs
   (n * 2^q complex), inverse norms. All from the caller's workspace. */
struct qk__build_ws {
    void *params = nullptr;
    void *tmp = nullptr;       /* multi-pass: complex states */
    double *inv = nullptr;
};

/* qk__k_prep: one block of 128 threads per sample. */
template <typename T>
static qk_result qk__launch_prep(const qk__prog &pg, const qk__dprog &dp, const double *dx, int64_t n, T *params,
                                 cudaStream_t st, qk__err *E)
{
    qk__k_prep<T><<<(unsigned)n, 128, 0, st>>>(dp.jobs, (int)pg.jobs.size(), dp.con, dp.ang, dp.op_kind, dx, n,
                                                pg.d, dp.w, params, pg.P);
    QK_LAUNCH_CK("qk__k_prep");
    return QK_OK;
}

/* qk__k_invnorm: one thread per sample. */
static qk_result qk__launch_invnorm(const double *dx, int64_t n, int d, double *inv, cudaStream_t st, qk__err *E)
{
    qk__k_invnorm<<<(unsigned)((n + 127) / 128), 128, 0, st>>>(dx, n, d, inv);
    QK_LAUNCH_CK("qk__k_invnorm");
    return QK_OK;
}

/* qk__k_pass: spb states of tps threads per block, one block per (state group, chunk); shared
   memory holds the spb chunks of 2^L amplitudes, their phase tables and, where they fit in
   QK__PASS_STAGE_BYTES, their parameters. */
#define QK__PASS_STAGE_BYTES ((size_t)16 << 10)
template <typename T>
static qk_result qk__launch_pass(const qk__pass &p, const qk__prog &pg, const qk__dprog &dp, int64_t n, const double *ampx,
                                 const qk__build_ws &ws, const qk__cx<T> *in, void *out, bool out_real, int spb, int tps,
                                 const qk__planes_out &po, cudaStream_t st, qk__err *E)
{
    const int q = pg.q, N = 1 << p.L;
    const int64_t nchunks = (int64_t)1 << (q - p.L);
    const int64_t groups = (n + spb - 1) / spb;
    size_t smem = (size_t)spb * N * sizeof(qk__cx<T>) + (size_t)spb * qk__tbl_size(p.L) * sizeof(T);
    /* the parameters staged in shared memory where they take at most QK__PASS_STAGE_BYTES a block */
    const size_t pbytes = (size_t)spb * pg.P * sizeof(T);
    const int stage = pbytes <= QK__PASS_STAGE_BYTES ? 1 : 0;
    if (stage) smem += pbytes;
    auto kf = out_real ? qk__k_pass<T, true> : qk__k_pass<T, false>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kf<<<(unsigned)(groups * nchunks), spb * tps, smem, st>>>(p, dp.instr, q, (const T *)ws.params, pg.P, n, ampx, ws.inv,
                                                             pg.has_amp ? pg.d : 0, in, out, spb, tps, stage, po);
    QK_LAUNCH_CK("qk__k_pass");
    return QK_OK;
}

/* A pass qk__k_pass_wht runs: a full chunk (L = QK__PASS_QUBITS) whose instructions are DIAG
   phases and Hadamards only, starting from the folded product, |0> or the previous pass (not
   from amplitude data). */
static bool qk__pass_is_wht(const qk__pass &p, const qk__prog &pg)
{
    if (p.L != QK__LMAX || (p.first && pg.has_amp)) return false;
    for (int ii = p.i0; ii < p.i1; ++ii) {
        const qk__instr &in_ = pg.instr[ii];
        if (in_.kind == QK__I_CNOT || (in_.kind == QK__I_GATE && !in_.h)) return false;
    }
    return true;
}

/* qk__k_pass_wht: one block of 2^(L - RB) threads per (state, chunk); RB = 5 register bits for
   float, 4 for double (the same 64 registers of amplitudes); shared memory holds one chunk. */
template <typename T>
static qk_result qk__launch_pass_wht(const qk__pass &p, const qk__prog &pg, const qk__dprog &dp, int64_t n,
                                     const qk__build_ws &ws, const qk__cx<T> *in, void *out, bool out_real,
                                     const qk__planes_out &po, cudaStream_t st, qk__err *E)
{
    constexpr int RB = sizeof(T) == 4 ? 5 : 4;
    const int q = pg.q;
    const int64_t nchunks = (int64_t)1 << (q - p.L);
    const size_t smem = ((size_t)1 << p.L) * sizeof(qk__cx<T>) + (QK__WHT_TBL + 2 * 64) * sizeof(T);
    auto kf = out_real ? qk__k_pass_wht<T, RB, true> : qk__k_pass_wht<T, RB, false>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kf<<<(unsigned)(n * nchunks), 1u << (p.L - RB), smem, st>>>(p, dp.instr, q, (const T *)ws.params, pg.P, in, out, po);
    QK_LAUNCH_CK("qk__k_pass_wht");
    return QK_OK;
}

/* The fused structured pass (q = 14, 15, 16; complex or real fp32): the two structured passes of
   a zz-like program in one kernel. A thread-block cluster of C = 2^(q - 13) blocks holds one state,
   a chunk of 2^13 amplitudes per block in shared memory. Each block runs the first pass's program
   on its chunk (the first pass's fixed qubits 13.. = its cluster rank), then writes the chunk
   straight into the shared memory of the blocks that own it in the second pass (the second pass
   fixes qubits 13 - c..12, c = q - 13: distributed shared memory, one 256-byte row per warp and
   register), and after the cluster barrier runs the second pass's program and stores the state
   once. Against the two launches of qk__k_pass_wht: one global write per amplitude instead of
   write, read, write; and every shared-memory transpose and the store have compile-time offsets:
   - the chunk buffer is padded (element r at r + (r >> 5)) instead of XOR-swizzled: padding is
     additive over disjoint bits, so an access is a per-thread base plus an immediate (the
     swizzled transposes cost ~6 address instructions per access with the layout a run-time
     value); every access pattern below is free of bank conflicts (lanes step 1 or 33 elements);
   - the layouts are the same three (register bits at 8, 0 or 5), the transposes dispatched over
     the six (from, to) pairs;
   - the Hadamards' (1/sqrt 2)^m scales are one factor (the host's count over both passes) put on
     the start (the program is linear), not a multiply per amplitude and transform.
   The host sends only the canonical pass pair (pass 1: qubits 0..12, starting from the folded
   product or |0>; pass 2: qubits 0..12-c and 13..q-1) here; QK_STATES_OLD=1 in the environment
   keeps the two-launch path (A/B). Compute capability 9.0 or later, with a build for it. */
#define QK__FZ_SH 8448 /* elements of the padded chunk: 8191 + (8191 >> 5) + 1, rounded up */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ int qk__fz_built = 1;
#else
__device__ int qk__fz_built = 0;
#endif

__device__ __forceinline__ uint32_t qk__fz_pad(uint32_t r) { return r + (r >> 5); }
/* the padded offset of register slot k in layout LAY (k << LAY's pad; a constant after unrolling) */
__host__ __device__ constexpr uint32_t qk__fz_k(int lay, int k) { return (uint32_t)((k << lay) + ((k << lay) >> 5)); }
/* the global qubit of register bit j in the second pass's layout 8 (in-chunk bit 8 + j) */
__host__ __device__ constexpr uint32_t qk__fz_g2(int cb, int k)
{
    uint32_t g = 0;
    for (int j = 0; j < 5; ++j)
        if ((k >> j) & 1) g |= 1u << (8 + j < 13 - cb ? 8 + j : 8 + j + cb);
    return g;
}

template <int FROM, int TO>
__device__ __forceinline__ void qk__fz_tr(float2 *sh, float2 (&v)[32], uint32_t t)
{
    const uint32_t bf = qk__fz_pad(qk__wht_tpart(t, FROM, 5)), bt = qk__fz_pad(qk__wht_tpart(t, TO, 5));
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 32; ++k) sh[bf + qk__fz_k(FROM, k)] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 32; ++k) v[k] = sh[bt + qk__fz_k(TO, k)];
}

/* to layout nw (8, 0 or 5) */
__device__ __forceinline__ void qk__fz_move(float2 *sh, float2 (&v)[32], uint32_t t, int &cur, int nw)
{
    if (cur == nw) return;
    if (cur == 8) { if (nw == 0) qk__fz_tr<8, 0>(sh, v, t); else qk__fz_tr<8, 5>(sh, v, t); }
    else if (cur == 0) { if (nw == 8) qk__fz_tr<0, 8>(sh, v, t); else qk__fz_tr<0, 5>(sh, v, t); }
    else { if (nw == 8) qk__fz_tr<5, 8>(sh, v, t); else qk__fz_tr<5, 0>(sh, v, t); }
    cur = nw;
}

/* butterflies on the register bits of MASK (a constant: straight-line code whose results the
   compiler renames; a run-time test per bit costs a move per value and bit at its merge) */
template <uint32_t MASK>
__device__ __forceinline__ void qk__fz_bf(float2 (&v)[32])
{
#pragma unroll
    for (int j = 0; j < 5; ++j) {
        if (!((MASK >> j) & 1)) continue;
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            if ((k >> j) & 1) continue;
            const float2 a = v[k], b = v[k | (1 << j)];
            v[k].x = a.x + b.x; v[k].y = a.y + b.y;
            v[k | (1 << j)].x = a.x - b.x; v[k | (1 << j)].y = a.y - b.y;
        }
    }
}

/* the layout a flush of pend runs its next butterflies in: cur while it holds pending bits, else
   the one of 8, 0, 5 (in that order) that holds the most (the host's qk__fz_plan follows it too) */
__host__ __device__ __forceinline__ int qk__fz_pick(uint32_t pend, int cur)
{
    if (pend & (31u << cur)) return cur;
    int best = cur, bc = 0;
    for (int i = 0; i < 3; ++i) {
        const int lay = i == 0 ? 8 : i == 1 ? 0 : 5;
        const int c = __builtin_popcount(pend & (31u << lay));
        if (c > bc) { bc = c; best = lay; }
    }
    return best;
}

/* the pending Hadamards (a mask of in-chunk bits) as one unscaled transform; the register masks
   of zz and iqp (all five bits; three low or three high) take straight-line code */
__device__ __forceinline__ void qk__fz_flush(float2 *sh, float2 (&v)[32], uint32_t t, int &cur, uint32_t pend)
{
    while (pend) {
        qk__fz_move(sh, v, t, cur, qk__fz_pick(pend, cur));
        const uint32_t msk = (pend >> cur) & 31;
        if (msk == 31) qk__fz_bf<31>(v);
        else if (msk == 7) qk__fz_bf<7>(v);
        else if (msk == 28) qk__fz_bf<28>(v);
        else {
            if (msk & 1) qk__fz_bf<1>(v);
            if (msk & 2) qk__fz_bf<2>(v);
            if (msk & 4) qk__fz_bf<4>(v);
            if (msk & 8) qk__fz_bf<8>(v);
            if (msk & 16) qk__fz_bf<16>(v);
        }
        pend &= ~(31u << cur);
    }
}

/* The fused kernel's program, made on the host (qk__fz_plan): per pass, the steps (the Hadamards
   pending before each DIAG, as a mask of in-chunk bits, then the DIAG's index, -1 at the pass's
   end) and per DIAG its pass, its coefficients' offset in the params and the register layout it
   runs in (the host follows qk__fz_flush's choice of layouts). A grid constant: the kernel reads
   it from the constant bank instead of walking the instruction list in global memory (a dependent
   load per instruction: 9 % of the kernel's stall samples at 16 qubits, Nsight Compute). */
#define QK__FZ_MAXS 8
#define QK__FZ_MAXD 4
#define QK__FZ_MAXP 2048 /* params per state the kernel stages in shared memory at most (8 KB: two blocks per SM stay) */
#define QK__FZ_TBL 272 /* floats of one DIAG's tables: W 13, Pf 1, TLo 16, THi 16, Y 64, G 80, H 80 */
struct qk__fz_steps {
    int n[2];
    uint32_t pend[2][QK__FZ_MAXS];
    int dg[2][QK__FZ_MAXS];
    int nd;
    int d_pass[QK__FZ_MAXD], d_off[QK__FZ_MAXD], d_lay[QK__FZ_MAXD];
    int fold; /* pass 1 starts from the folded product at this offset of the params, or -1: |0> */
};

/* The global qubit of in-chunk bit r in pass pi (pass 1: r; pass 2: r below 13 - cb, r + cb
   above) and of the pass's fixed bit i (13 + i; 13 - cb + i): the pass pair qk__fz_fits takes. */
__host__ __device__ __forceinline__ int qk__fz_pos(int pi, int cb, int r) { return pi == 0 || r < 13 - cb ? r : r + cb; }
__host__ __device__ __forceinline__ int qk__fz_npos(int pi, int cb, int i) { return (pi == 0 ? 13 : 13 - cb) + i; }

/* Every DIAG's tables at once, before the passes (qk__k_pass_wht builds them per DIAG, three
   block barriers each): W[r], in-chunk bit r's linear coefficient plus its pairs with the fixed
   bits; Pf, the fixed bits' phase; TLo / THi, the phase of thread bits 0..3 / 4..7; Y[i][lo], pairs
   of thread bit 4 + i with bits 0..3; G[j][lo] / H[j][hi], pairs of register bit j with thread
   bits 0..3 / 4..7. Thread bit b is in-chunk bit b (b < lay) or b + 5 in the DIAG's layout lay.
   The sums are unrolled with every coefficient loaded and the unset terms selected away: loops
   over the set bits made each entry a chain of dependent shared-memory loads, and the block
   waited for its slowest entry (38 % of the kernel's stall samples at 16 qubits). */
template <int CB>
__device__ __forceinline__ void qk__fz_tables(const qk__fz_steps &st, uint32_t rank, const float *pv, int q, float *tb, uint32_t t)
{
    constexpr int L = 13, RB = 5;
    if ((int)t < 14 * st.nd) {
        const int d = (int)t / 14, e = (int)t % 14, pi = st.d_pass[d];
        const float *cf = pv + st.d_off[d];
        float acc;
        if (e < L) { /* W[e] */
            const int Q = qk__fz_pos(pi, CB, e);
            acc = cf[1 + Q];
#pragma unroll
            for (int i = 0; i < CB; ++i) {
                const int nq = qk__fz_npos(pi, CB, i); /* fixed and in-chunk qubits differ */
                const float x = cf[1 + q + (nq < Q ? nq * q + Q : Q * q + nq)];
                acc += ((rank >> i) & 1) ? x : 0.f;
            }
        } else { /* Pf: the phase of the fixed bits alone (ascending qubits) */
            acc = cf[0];
#pragma unroll
            for (int i = 0; i < CB; ++i) {
                const int nq = qk__fz_npos(pi, CB, i);
                float x = cf[1 + nq];
#pragma unroll
                for (int i2 = 0; i2 < i; ++i2) {
                    const float y = cf[1 + q + qk__fz_npos(pi, CB, i2) * q + nq];
                    x += ((rank >> i2) & 1) ? y : 0.f;
                }
                acc += ((rank >> i) & 1) ? x : 0.f;
            }
        }
        tb[d * QK__FZ_TBL + e] = acc;
    }
    __syncthreads();
    /* entry e = t of each DIAG's TLo (0..15), THi (16..31), Y (32..95), G (96..175), H (176..255),
       stored at 14 + e */
    const int e = (int)t;
#pragma unroll
    for (int d = 0; d < QK__FZ_MAXD; ++d) {
        if (d >= st.nd) break;
        const int pi = st.d_pass[d], cur = st.d_lay[d];
        const float *cf = pv + st.d_off[d];
        const float *W = tb + d * QK__FZ_TBL;
        auto dq = [&](int a, int b) { return cf[1 + q + (a < b ? a * q + b : b * q + a)]; };
        auto ib = [&](int b) { return b < cur ? b : b + RB; }; /* thread bit -> in-chunk bit */
        float acc = 0;
        if (e < 32) {
            const int b0 = (e >> 4) * 4, m = e & 15; /* TLo: thread bits 0..3; THi: 4..7 */
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                float x = W[ib(b0 + b)];
#pragma unroll
                for (int b2 = 0; b2 < b; ++b2) {
                    const float y = dq(qk__fz_pos(pi, CB, ib(b0 + b2)), qk__fz_pos(pi, CB, ib(b0 + b)));
                    x += ((m >> b2) & 1) ? y : 0.f;
                }
                acc += ((m >> b) & 1) ? x : 0.f;
            }
        } else {
            /* pairs of four source bits (the set bits of m) with one partner qubit */
            int b0, m, partner;
            if (e < 96) { const int f = e - 32; b0 = 0; m = f & 15; partner = qk__fz_pos(pi, CB, ib(4 + (f >> 4))); }
            else if (e < 176) { const int f = e - 96; b0 = 0; m = f & 15; partner = qk__fz_pos(pi, CB, cur + (f >> 4)); }
            else { const int f = e - 176; b0 = 4; m = f & 15; partner = qk__fz_pos(pi, CB, cur + (f >> 4)); }
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const float y = dq(qk__fz_pos(pi, CB, ib(b0 + b)), partner);
                acc += ((m >> b) & 1) ? y : 0.f;
            }
        }
        tb[d * QK__FZ_TBL + 14 + e] = acc;
    }
    __syncthreads();
}

/* DIAG d on the registers (layout st.d_lay[d], which the flush before it brought): qk__k_pass_wht's
   phase, from the tables qk__fz_tables built; no barrier. */
template <int CB>
__device__ __forceinline__ void qk__fz_diag(const qk__fz_steps &st, int d, uint32_t t, const float *pv, int q, const float *tb,
                                            float2 (&v)[32])
{
    constexpr int L = 13, RB = 5, NHI = L - RB - 4;
    const int pi = st.d_pass[d], cur = st.d_lay[d];
    const float *cf = pv + st.d_off[d];
    const float *W = tb + d * QK__FZ_TBL, *TLo = W + L + 1, *THi = TLo + 16, *Y = THi + (1 << NHI), *G = Y + NHI * 16, *H = G + RB * 16;
    const uint32_t tl = t & 15, th = t >> 4;
    float base = W[L] + TLo[tl] + THi[th];
#pragma unroll
    for (int i = 0; i < NHI; ++i) base += ((th >> i) & 1) ? Y[i * 16 + tl] : 0.f;
    float e[RB], dd[RB][RB];
#pragma unroll
    for (int j = 0; j < RB; ++j) {
        e[j] = W[cur + j] + G[j * 16 + tl] + H[(j << NHI) + th];
#pragma unroll
        for (int jj = 0; jj < RB; ++jj)
            if (jj < j) dd[jj][j] = cf[1 + q + qk__fz_pos(pi, CB, cur + jj) * q + qk__fz_pos(pi, CB, cur + j)];
    }
    qk__wht_phase<float, RB>(base, e, dd, v);
}

/* One pass's steps on the registers; pv: the state's params in shared memory */
template <int CB>
__device__ __forceinline__ void qk__fz_run(const qk__fz_steps &st, int pi, int &cur, uint32_t t, const float *pv, int q, float2 *sh,
                                           const float *tb, float2 (&v)[32])
{
    for (int si = 0; si < st.n[pi]; ++si) { /* one flush site (each is a copy of the transposes) */
        qk__fz_flush(sh, v, t, cur, st.pend[pi][si]);
        const int d = st.dg[pi][si];
        if (d >= 0) qk__fz_diag<CB>(st, d, t, pv, q, tb, v);
    }
}

__device__ __forceinline__ void qk__cluster_sync()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/* CB = q - 13 cross qubits (cluster of 2^CB blocks); sc: the transforms' total scale. Complex
   output only: the programs it takes (Hadamards and phases) make complex states, written as
   po says. Shared memory: the padded chunk, the DIAGs' tables, the fold's, the state's P params
   (qk__fz_smem). */
template <int CB>
__global__ void __launch_bounds__(256, 2)
qk__k_states_fz(const __grid_constant__ qk__fz_steps st, int q, const float *__restrict__ params, int P, float sc,
                const qk__planes_out po, void *__restrict__ out)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int L = 13, RB = 5, R = 32, NHI = L - RB - 4, LO = L - CB;
    extern __shared__ __align__(16) unsigned char qk__smem[];
    float2 *sh = (float2 *)qk__smem;
    float *tb = (float *)(sh + QK__FZ_SH);                 /* the DIAGs' tables */
    float2 *UL = (float2 *)(tb + QK__FZ_MAXD * QK__FZ_TBL), *UH = UL + 16, *UF = UH + (1 << NHI); /* the fold's */
    float *pv = tb + QK__FZ_MAXD * QK__FZ_TBL + 2 * 64;     /* the state's P params: every table reads them from here */
    const uint32_t t = threadIdx.x;
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const int64_t s = blockIdx.x >> CB;
    const int64_t D = (int64_t)1 << q;
    const float *ps = params + s * (int64_t)P;
    { /* P <= QK__FZ_MAXP = 8 x 256: every load in flight before the first store */
        float r[QK__FZ_MAXP / 256];
#pragma unroll
        for (int j = 0; j < QK__FZ_MAXP / 256; ++j) r[j] = (int)t + j * 256 < P ? ps[t + j * 256] : 0.f;
#pragma unroll
        for (int j = 0; j < QK__FZ_MAXP / 256; ++j) if ((int)t + j * 256 < P) pv[t + j * 256] = r[j];
    }
    __syncthreads();
    const uint32_t fixed = rank << L; /* pass 1: qubits 0..12 in the chunk, 13.. = the rank */
    const float *u = pv + st.fold;
    /* the fold's block factors (threads 128..160: beside the tables' first jobs), read after the
       tables' barriers: prod over qubits of u_Q[bit] for thread bits 0..3, 4..7 and the fixed bits */
    if (st.fold >= 0 && t >= 128 && t < 128 + 16 + (1u << NHI) + 1) {
        const uint32_t f = t - 128;
        const bool lo = f < 16, hi = !lo && f < 16 + (1u << NHI);
        const uint32_t e = lo ? f : f - 16;
        float ar = 1, ai = 0;
        if (lo || hi)
            for (int i = 0; i < (lo ? 4 : NHI); ++i) {
                const float *uk = u + 4 * (lo ? i : 4 + i) + ((e >> i) & 1) * 2; /* thread bit b = qubit b in layout 8 */
                float br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                ar = br; ai = bi;
            }
        else {
            for (int i = 0; i < CB; ++i) {
                const float *uk = u + 4 * (L + i) + ((rank >> i) & 1) * 2;
                float br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                ar = br; ai = bi;
            }
            ar *= sc; ai *= sc;
        }
        float2 z; z.x = ar; z.y = ai;
        if (lo) UL[e] = z; else if (hi) UH[e] = z; else UF[0] = z;
    }
    qk__fz_tables<CB>(st, rank, pv, q, tb, t);

    /* start in layout 8: the folded product or |0>, times sc */
    float2 v[R];
    int cur = 8;
    if (st.fold >= 0) {
        const float2 a = UF[0], l = UL[t & 15], h = UH[t >> 4];
        float2 m;
        m.x = a.x * l.x - a.y * l.y; m.y = a.x * l.y + a.y * l.x;
        v[0].x = m.x * h.x - m.y * h.y; v[0].y = m.x * h.y + m.y * h.x;
        /* the register qubits' (8..12) vectors: where each has u0 == u1 (zz: H|0>) every slot is
           v0 * prod u0 (a uniform branch), else the product tree */
        bool same = true;
#pragma unroll
        for (int j = 0; j < RB; ++j) {
            const float *u0 = u + 4 * (8 + j);
            same = same && u0[0] == u0[2] && u0[1] == u0[3];
        }
        if (same) {
#pragma unroll
            for (int j = 0; j < RB; ++j) {
                const float *u0 = u + 4 * (8 + j);
                const float2 a0 = v[0];
                v[0].x = a0.x * u0[0] - a0.y * u0[1]; v[0].y = a0.x * u0[1] + a0.y * u0[0];
            }
#pragma unroll
            for (int k = 1; k < R; ++k) v[k] = v[0];
        } else {
#pragma unroll
            for (int j = 0; j < RB; ++j) {
                const float *u0 = u + 4 * (8 + j), *u1 = u0 + 2;
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    if (k >= (1 << j)) continue;
                    const float2 a0 = v[k];
                    float2 b, c;
                    b.x = a0.x * u1[0] - a0.y * u1[1]; b.y = a0.x * u1[1] + a0.y * u1[0];
                    c.x = a0.x * u0[0] - a0.y * u0[1]; c.y = a0.x * u0[1] + a0.y * u0[0];
                    v[k | (1 << j)] = b;
                    v[k] = c;
                }
            }
        }
    } else {
        /* pass 1's chunk is qubits 0..12 in order: in-chunk index = global bits */
        const uint32_t g0 = fixed | qk__wht_tpart(t, cur, RB);
#pragma unroll
        for (int k = 0; k < R; ++k) { v[k].x = (g0 | ((uint32_t)k << 8)) == 0 ? sc : 0.f; v[k].y = 0.f; }
    }

    qk__fz_run<CB>(st, 0, cur, t, pv, q, sh, tb, v);
    qk__fz_move(sh, v, t, cur, 5);

    /* the exchange, from layout 5: r1 = lane | k << 5 | w << 10 (w = warp) goes to block
       r1 >> LO at r2 = (r1 & (2^LO - 1)) | rank << LO. The first barrier: every block of the
       cluster runs and is done reading its chunk buffer; the second: every write has landed. */
    qk__cluster_sync();
    {
        const uint32_t w = t >> 5, lane = t & 31;
        const uint32_t dst = w >> (3 - CB);
        const uint32_t r2 = ((w & ((1u << (3 - CB)) - 1)) << 10) | (rank << LO);
        uint32_t ra;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"((uint32_t)__cvta_generic_to_shared(sh)), "r"(dst));
        ra += 8u * (lane + qk__fz_pad(r2));
#pragma unroll
        for (int k = 0; k < R; ++k)
            asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(ra + 8u * qk__fz_k(5, k)), "f"(v[k].x), "f"(v[k].y)
                         : "memory");
    }
    qk__cluster_sync();

    /* pass 2 on this block's chunk (its fixed qubits LO..12 = rank), from layout 8 */
    const uint32_t fixed2 = rank << LO;
    cur = 8;
    {
        const uint32_t b = qk__fz_pad(t); /* layout 8: in-chunk bits 0..7 = t */
#pragma unroll
        for (int k = 0; k < R; ++k) v[k] = sh[b + qk__fz_k(8, k)];
    }
    qk__fz_run<CB>(st, 1, cur, t, pv, q, sh, tb, v);
    qk__fz_move(sh, v, t, cur, 8);

    /* store from layout 8: thread bits are qubits 0..7 (lanes 0..4: 256 bytes per warp and
       register), register bit j is in-chunk bit 8 + j */
    /* one loop a format: qk__planes_put's switch inside this unrolled loop made the fp32x3 planes
       slower than the operand pass they replace (docs/benchmarks.md, "Every state builder writes
       the planes") */
    const int64_t gb = s * (po.mode == 3 ? 4 * D : D) + (fixed2 | t);
    if (po.mode == 0) {
#pragma unroll
        for (int k = 0; k < R; ++k) __stwb((float2 *)out + gb + qk__fz_g2(CB, k), v[k]); /* st.global: out is device memory */
    } else if (po.mode == 1) {
#pragma unroll
        for (int k = 0; k < R; ++k) qk__gauss_store<__half, false>(v[k], 0xFu, po.scale, (__half *)out + gb + qk__fz_g2(CB, k), D, po.ps);
    } else if (po.mode == 3) {
#pragma unroll
        for (int k = 0; k < R; ++k) qk__gauss_store<__half, true>(v[k], 0xFu, po.scale, (__half *)out + gb + qk__fz_g2(CB, k), D, po.ps);
    } else {
#pragma unroll
        for (int k = 0; k < R; ++k)
            qk__gauss_store<__nv_bfloat16, false>(v[k], 0xFu, po.scale, (__nv_bfloat16 *)out + gb + qk__fz_g2(CB, k), D, po.ps);
    }
#endif
}

/* The pass pair qk__k_states_fz takes: float states of 14..16 qubits in exactly two structured
   passes, the first over qubits 0..12 from the folded product or |0>, the second over qubits
   0..12-c and 13..q-1 (c = q - 13), as qk__compile_passes makes them for zz and iqp. */
/* The fused kernel's program (qk__fz_steps) of a pass pair that qk__fz_fits; false when a pass
   has more than QK__FZ_MAXS steps or the passes more than QK__FZ_MAXD DIAGs. Each DIAG's layout
   is the one qk__fz_flush leaves before it (qk__fz_pick, the same choice on both sides). */
static bool qk__fz_plan(const qk__prog &pg, qk__fz_steps *st)
{
    memset(st, 0, sizeof *st);
    st->fold = pg.passes[0].fold;
    for (int pi = 0; pi < 2; ++pi) {
        const qk__pass &p = pg.passes[pi];
        uint32_t pend = 0;
        int n = 0, cur = 8; /* each pass starts in layout 8 */
        for (int ii = p.i0; ii <= p.i1; ++ii) {
            const bool end = ii == p.i1;
            if (!end && pg.instr[ii].kind == QK__I_GATE) { pend ^= 1u << pg.instr[ii].b0; continue; }
            if (n == QK__FZ_MAXS) return false;
            st->pend[pi][n] = pend;
            while (pend) { cur = qk__fz_pick(pend, cur); pend &= ~(31u << cur); }
            st->dg[pi][n] = -1;
            if (!end) {
                if (st->nd == QK__FZ_MAXD) return false;
                st->d_pass[st->nd] = pi;
                st->d_off[st->nd] = pg.instr[ii].off;
                st->d_lay[st->nd] = cur;
                st->dg[pi][n] = st->nd++;
            }
            ++n;
        }
        st->n[pi] = n;
    }
    return true;
}

static size_t qk__fz_smem(int P)
{
    return (size_t)QK__FZ_SH * sizeof(float2) + ((size_t)QK__FZ_MAXD * QK__FZ_TBL + 2 * 64 + (size_t)P) * sizeof(float);
}

static bool qk__fz_fits(const qk__prog &pg)
{
    const int q = pg.q;
    if (q < 14 || q > 16 || pg.passes.size() != 2 || pg.has_amp || pg.P > QK__FZ_MAXP) return false;
    const qk__pass &a = pg.passes[0], &b = pg.passes[1];
    if (!qk__pass_is_wht(a, pg) || !qk__pass_is_wht(b, pg) || !a.first || b.first || a.L != 13 || b.L != 13) return false;
    const int c = q - 13;
    for (int i = 0; i < 13; ++i) {
        if (a.pos[i] != i) return false;
        if (b.pos[i] != (i < 13 - c ? i : i + c)) return false;
    }
    for (int i = 0; i < c; ++i)
        if (a.npos[i] != 13 + i || b.npos[i] != 13 - c + i) return false;
    qk__fz_steps st;
    return qk__fz_plan(pg, &st);
}

template <int CB>
static qk_result qk__launch_fz1(const qk__prog &pg, int64_t n, const qk__build_ws &ws, const qk__planes_out &po, void *out,
                                cudaStream_t st, qk__err *E)
{
    const size_t smem = qk__fz_smem(pg.P);
    auto kf = qk__k_states_fz<CB>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1u << CB;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)(n << CB), 1, 1);
    cfg.blockDim = dim3(256, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    qk__fz_steps fs;
    qk__fz_plan(pg, &fs); /* qk__fz_fits checked it */
    /* the Hadamards' scale (1/sqrt 2)^m: m their count over every flush, put on the start */
    int m = 0;
    for (int pi = 0; pi < 2; ++pi)
        for (int i = 0; i < fs.n[pi]; ++i) m += __builtin_popcount(fs.pend[pi][i]);
    const float sc = (float)pow(0.5, 0.5 * m);
    QK_CK(cudaLaunchKernelEx(&cfg, kf, fs, pg.q, (const float *)ws.params, pg.P, sc, po, out));
    QK_LAUNCH_CK("qk__k_states_fz");
    return QK_OK;
}

/* 1 when the current device runs qk__k_states_fz: compute capability 9.0 or later, a build with its code
   (qk__fz_built) and room for a cluster of 8 of its blocks (cudaOccupancyMaxActiveClusters).
   Cached per device. */
static int qk__fz_device_ok()
{
    static std::atomic<int> cache[64]; /* 0 unknown, 1 no, 2 yes */
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) { cudaGetLastError(); return 0; }
    const int known = cache[dev].load(std::memory_order_acquire);
    if (known) return known == 2;
    int ok = 0, flag = 0, major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 &&
        cudaMemcpyFromSymbol(&flag, qk__fz_built, sizeof flag) == cudaSuccess && flag == 1) {
        const size_t smem = qk__fz_smem(QK__FZ_MAXP);
        auto kf = qk__k_states_fz<3>;
        int nc = 0;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 8;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(8, 1, 1);
        cfg.blockDim = dim3(256, 1, 1);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        ok = cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess &&
             cudaOccupancyMaxActiveClusters(&nc, kf, &cfg) == cudaSuccess && nc > 0;
    }
    cudaGetLastError();
    cache[dev].store(ok ? 2 : 1, std::memory_order_release);
    return ok;
}

/* qk__k_states_fz: one cluster of 2^(q - 13) blocks of 256 threads per state (complex float
   states, or the operand planes po asks). Under QK_TEST_FAULTS, qk_cuda_test_states_fused()
   counts its launches, qk_cuda_test_planes() the state builds that wrote operand planes. */
#ifdef QK_TEST_FAULTS
static std::atomic<int> qk__fz_launches{0}, qk__plane_builds{0};
extern "C" int qk_cuda_test_states_fused(void) { return qk__fz_launches.load(); }
extern "C" int qk_cuda_test_planes(void) { return qk__plane_builds.load(); }
#endif
static qk_result qk__launch_fz(const qk__prog &pg, int64_t n, const qk__build_ws &ws, const qk__planes_out &po, void *out,
                               cudaStream_t st, qk__err *E)
{
#ifdef QK_TEST_FAULTS
    ++qk__fz_launches;
#endif
    switch (pg.q - 13) {
    case 1: return qk__launch_fz1<1>(pg, n, ws, po, out, st, E);
    case 2: return qk__launch_fz1<2>(pg, n, ws, po, out, st, E);
    default: return qk__launch_fz1<3>(pg, n, ws, po, out, st, E);
    }
}

/* 1 when qk__build_states builds n states of pg with qk__k_states_fz: float complex states of a
   program it fits, on a device that runs it (QK_STATES_OLD=1, measurement: never) */
static bool qk__fz_takes(const qk__prog &pg, int64_t n, bool fp32, bool out_real)
{
    return fp32 && !out_real && !pg.states && n <= (int64_t)(INT32_MAX >> 3) && qk__fz_fits(pg) && !getenv("QK_STATES_OLD") &&
           qk__fz_device_ok();
}

/* Given states (qk_gram_states): row s of x (ld doubles apart, dim amplitudes of the state type)
   into the engine's layout, zero-padded to D, scaled to norm 1 where the flags ask (the norm in
   double, one block per row). */
template <typename T>
__global__ void __launch_bounds__(256) qk__k_load_states(const double *__restrict__ x, int64_t n, int ld, int type, int flags,
                                                        int64_t dim, int64_t D, void *__restrict__ out, int out_real)
{
    __shared__ double red[256];
    const int64_t s = blockIdx.x;
    if (s >= n) return;
    const double *row = x + s * (int64_t)ld;
    double inv = 1.0;
    if (flags & QK__STATE_MIXED) {
        /* a density matrix (dim x dim): the real vector [Re rho | Im rho] (real types: Re rho),
           divided by the trace where the flags ask, as the CPU engine's qk__state_row */
        const int64_t d2 = dim * dim;
        const bool cplx = type == QK_STATE_C128 || type == QK_STATE_C64;
        if (flags & QK__STATE_NORMALIZE) {
            double acc = 0, re, im;
            for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) {
                qk__state_amp(row, type, k * dim + k, &re, &im);
                acc += re;
            }
            inv = 1.0 / qk__block_sum256(red, acc);
        }
        for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
            double re = 0, im = 0, v = 0;
            if (k < d2) { qk__state_amp(row, type, k, &re, &im); v = re; }
            else if (cplx && k < 2 * d2) { qk__state_amp(row, type, k - d2, &re, &im); v = im; }
            ((T *)out)[s * D + k] = (T)(v * inv);
        }
        return;
    }
    if (flags & QK__STATE_NORMALIZE) {
        double acc = 0, re, im;
        for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) {
            qk__state_amp(row, type, k, &re, &im);
            acc += re * re + im * im;
        }
        inv = 1.0 / sqrt(qk__block_sum256(red, acc));
    }
    for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
        double re = 0, im = 0;
        if (k < dim) qk__state_amp(row, type, k, &re, &im);
        if (out_real) ((T *)out)[s * D + k] = (T)(re * inv);
        else {
            qk__cx<T> v;
            v.x = (T)(re * inv);
            v.y = (T)(im * inv);
            ((qk__cx<T> *)out)[s * D + k] = v;
        }
    }
}

/* Builds n states (x already on the device) into out: complex T or, out_real, T. */
/* po (mode 1..3): out receives Gauss's operand planes (qk__planes_out) in place of complex float
   states: the fused kernel's store or the last pass's writes them. */
template <typename T>
static qk_result qk__build_states(const qk__prog &pg, const qk__dprog &dp, const double *dx, int64_t n,
                                  qk__build_ws &ws, void *out, bool out_real, cudaStream_t st, qk__err *E,
                                  const qk__planes_out *po = nullptr)
{
    const qk__planes_out cx = {0, 1.0f, 0};
    const bool planes = po && po->mode;
    if (planes && (sizeof(T) != 4 || out_real || pg.states))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: internal error: operand planes asked of a state "
                                                          "builder that cannot write them (please report the map)");
    if (n <= 0) return QK_OK;
#ifdef QK_TEST_FAULTS
    if (planes) ++qk__plane_builds;
#endif
    if (pg.states) {
        qk__k_load_states<T><<<(unsigned)n, 256, 0, st>>>(dx, n, pg.d, pg.st_type, pg.st_flags, pg.st_dim, (int64_t)1 << pg.q, out,
                                                           out_real ? 1 : 0);
        QK_LAUNCH_CK("qk__k_load_states");
        return QK_OK;
    }
    QK_TRY(qk__launch_prep<T>(pg, dp, dx, n, (T *)ws.params, st, E));
    if (pg.has_amp) QK_TRY(qk__launch_invnorm(dx, n, pg.d, ws.inv, st, E));
    const int np = (int)pg.passes.size();
    const double *ampx = pg.has_amp ? dx : nullptr;
    /* 14..16 qubits in two structured passes: one fused launch (QK_STATES_OLD=1: the two) */
    if (qk__fz_takes(pg, n, sizeof(T) == 4, out_real)) return qk__launch_fz(pg, n, ws, planes ? *po : cx, out, st, E);
    for (int pi = 0; pi < np; ++pi) {
        const qk__pass &p = pg.passes[pi];
        const int N = 1 << p.L;
        /* threads per state: half the amplitudes (one pair per thread per gate), at most 256;
           small states share a block so that blocks have at least 128 threads. A one-pass
           program of up to 10 qubits runs a warp per state, four states a block: its DIAG
           tables and gates are chains of dependent loads a block waits on, and four states in
           flight per block hide them (the figures: docs/benchmarks.md, "Per-call costs"). */
        int tps = std::max(1, std::min(256, N / 2));
        if (np == 1 && N <= 1024) tps = std::min(tps, 32);
        int spb = (pi == 0 && np == 1) ? std::max(1, 128 / tps) : 1;
        if (np > 1) spb = 1;
        /* multi-pass programs run in place on tmp (the chunks of one pass are disjoint: no block
           reads amplitudes another block of the same pass writes); the last pass writes out */
        const bool last = pi == np - 1;
        const qk__cx<T> *in = (const qk__cx<T> *)ws.tmp;
        void *o = last ? out : ws.tmp;
        const qk__planes_out &lpo = last && planes ? *po : cx;
        if (qk__pass_is_wht(p, pg)) QK_TRY(qk__launch_pass_wht<T>(p, pg, dp, n, ws, in, o, last && out_real, lpo, st, E));
        else QK_TRY(qk__launch_pass<T>(p, pg, dp, n, ampx, ws, in, o, last && out_real, spb, tps, lpo, st, E));
    }
    return QK_OK;
}

/* qk__k_qubit_vectors: per-qubit 2-vectors of product-map samples (the analytic path's
   "states"), one thread per (sample, qubit). */
template <typename T>
static qk_result qk__launch_qubit_vectors(const qk__dprog &dp, int q, const double *x, int64_t n, int d, T *out,
                                          cudaStream_t st, qk__err *E)
{
    const int64_t tot = n * q;
    if (tot <= 0) return QK_OK;
    qk__k_qubit_vectors<T><<<(unsigned)((tot + 255) / 256), 256, 0, st>>>(dp.qops, dp.qoff, q, dp.ang, dp.op_kind, x, n, d,
                                                                          dp.w, out);
    QK_LAUNCH_CK("qk__k_qubit_vectors");
    return QK_OK;
}

