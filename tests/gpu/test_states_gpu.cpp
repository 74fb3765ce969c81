/* qk_gram_states on the GPU engine (issue 28), against the CPU engine's qk_gram_states on the same
   states (itself tested bit for bit against the map path and against the definition:
   tests/core/test_states_in.c). Fresh random states every run (seed printed, QK_TEST_SEED to
   replay), outputs poisoned with NaN first, every element checked.

   - host states, complex128 / complex64 / float64 / float32, dims that are and are not powers of
     two, K(A,A) and K(A,B), fp64 (|gpu - cpu| <= 1e-12) and every reduced precision within
     qk_precision_error_bound at the states' qubit count; outputs host, device, callback, .npy;
   - device states (on_device = 1): K equal bit for bit to the same states given from the host,
     and not copied: the engine copies none of their rows into its buffers (qk_cuda_test_rows_in_bytes,
     a QK_TEST_FAULTS counter; the host states' run copies them all) and acquires one norm buffer
     per side more than the host run (qk_cuda_test_alloc_count); normalize on the device; a NaN on the
     device named by row; a host pointer passed as device memory refused;
   - qk's own states (qk_states of zz) given to the GPU: K within 1e-12 of the map's GPU K;
   - density matrices (a_mixed / b_mixed, fresh random mixtures of 2..4 random pure states): K =
     Tr(rho_i rho_j) against the CPU engine and the definition, complex128 / complex64 / float64 /
     float32, several dims, K(A,A) and K(A,B), pure A against mixed B, every output, fp64 (1e-12)
     and fp32 / auto / the tensor-core modes (on the tensor cores from 6 qubits of the vector,
     fp32x3 from 7; fp32 below, said so) within plan.error_bound; the plan says linear, the
     engine, "linear epilogue"; device matrices read in place (bitwise the host matrices' K, not
     copied), checked on the device (trace, Hermiticity, NaN, an entry past the trace: named by
     row), normalize by the trace, the tensor-core modes on them; a pure device side against
     device matrices both ways round (expanded on the device) against the host states' K, the
     CPU and the definition, a pure row off norm 1 named, normalize;
   - host states streamed in state tiles (a planner budget of 24 MB) against the CPU engine and
     the all-resident plan, the provider on the GPU (K bit for bit the host states', the rows
     asked for those the plan implies, a failing provider and a bad row named, an existing .npy
     untouched), the caller's states unlocked after the call and page-locked ones left so, and
     2.1 GB of host states on a GPU with 1.5 GB free ("stream": the mixed and streamed cases alone);
   - device states on GPU 0 with a context of 2 GPUs (skipped, said so, with one): K bitwise the
     host states' on the same 2 GPUs, within 1e-12 of the CPU and of one GPU, every output, pure
     and mixed, resident and in tiles; GPU 0 copies nothing, GPU 1 the rows its plans imply.
   With the argument "bench": the Gram phase (qk_ctx_cuda_stats().gram_ms) of the map path and of
   device states of the same map (docs/benchmarks.md), medians of 5, then exit; "bench-stream q n
   keep_gb": host states beyond device memory (bench_stream); "bench-mixed": density matrices on
   the device in every mode (bench_mixed); "bench-mgpu": device states on one GPU and on two
   (bench_mgpu); "mgpu": the several-GPU cases alone.
   Exit 77 (meson: skipped) when no CUDA device exists. */
#include <vector>
#include <string>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <cuda_runtime.h>
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"

static int esize(qk_state_type t) { return t == QK_STATE_C128 ? 16 : t == QK_STATE_F32 ? 4 : 8; }

/* n random normalised states of dim amplitudes in type t's bytes, rows ld elements apart (the
   norm taken after rounding to float, so float rows are normalised too) */
static std::vector<char> rand_states(int64_t n, int64_t dim, int64_t ld, qk_state_type t)
{
    const int es = esize(t);
    const bool cplx = t == QK_STATE_C128 || t == QK_STATE_C64, f32 = t == QK_STATE_C64 || t == QK_STATE_F32;
    std::vector<char> s((size_t)(n * ld * es), 0);
    std::vector<double> re((size_t)dim), im((size_t)dim);
    for (int64_t i = 0; i < n; ++i) {
        double ss = 0;
        for (int64_t k = 0; k < dim; ++k) {
            double u1 = qk_test_urand() + 1e-300, u2 = qk_test_urand(), r = sqrt(-2.0 * log(u1));
            re[k] = r * cos(6.283185307179586 * u2);
            im[k] = cplx ? r * sin(6.283185307179586 * u2) : 0.0;
            ss += re[k] * re[k] + im[k] * im[k];
        }
        for (int64_t k = 0; k < dim; ++k) {
            char *e = s.data() + (size_t)((i * ld + k) * es);
            double a = re[k] / sqrt(ss), b = im[k] / sqrt(ss);
            if (f32) { float v[2] = {(float)a, (float)b}; memcpy(e, v, cplx ? 8 : 4); }
            else { double v[2] = {a, b}; memcpy(e, v, cplx ? 16 : 8); }
        }
    }
    return s;
}

enum Out { HOST = 0, DEVICE, CALLBACK, NPY };
static const char *out_name[] = {"host", "device", "callback", "npy"};

struct Tiles { std::vector<double> *K; int64_t cols; bool sym, f32; };
static int on_tile(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *t, int64_t ld, void *user)
{
    Tiles *T = (Tiles *)user;
    for (int64_t a = 0; a < m; ++a)
        for (int64_t b = 0; b < n; ++b) {
            double v = T->f32 ? (double)((const float *)t)[a * ld + b] : ((const double *)t)[a * ld + b];
            (*T->K)[(size_t)((i0 + a) * T->cols + j0 + b)] = v;
            if (T->sym) (*T->K)[(size_t)((j0 + b) * T->cols + i0 + a)] = v;
        }
    return 0;
}

/* K from st on ctx in precision prec through output out, as doubles (rows x cols); false when it fails */
static bool gram_states(qk_ctx *ctx, const qk_states_desc &st, qk_precision prec, Out out, std::vector<double> &K, qk_plan *plan = nullptr)
{
    const int64_t rows = st.n_a, cols = st.b || (st.provider && st.n_b) ? st.n_b : st.n_a;
    const bool f32 = prec != QK_PRECISION_FP64 && prec != QK_PRECISION_DEFAULT;
    const size_t es = f32 ? 4 : 8;
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.precision = prec;
    g.out_dtype = f32 ? QK_F32 : QK_F64;
    K.assign((size_t)(rows * cols), NAN);
    std::vector<char> host((size_t)(rows * cols) * es);
    void *dev = nullptr;
    Tiles T = {&K, cols, cols == rows && !st.b, f32};
    char path[256];
    snprintf(path, sizeof path, "states_gpu_%d.npy", (int)getpid());
    switch (out) {
    case HOST: g.output = QK_OUTPUT_HOST; g.out = host.data(); break;
    case DEVICE:
        if (cudaMalloc(&dev, host.size()) != cudaSuccess) return false;
        cudaMemset(dev, 0xff, host.size());   /* NaN */
        g.output = QK_OUTPUT_DEVICE; g.out = dev;
        break;
    case CALLBACK: g.output = QK_OUTPUT_CALLBACK; g.tile_fn = on_tile; g.tile_user = &T; break;
    case NPY: g.output = QK_OUTPUT_NPY; g.out_path = path; g.no_sync = 1; break;
    }
    if (out == HOST) memset(host.data(), 0xff, host.size());
    if (plan && qk_plan_states(ctx, &st, &g, plan) != QK_OK) { printf("plan: %s\n", qk_last_error()); return false; }
    qk_result r = qk_gram_states(ctx, &st, &g);
    if (r != QK_OK) { printf("  qk_gram_states (%s): %s\n", out_name[out], qk_last_error()); if (dev) cudaFree(dev); return false; }
    if (out == DEVICE) { cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost); cudaFree(dev); }
    if (out == HOST || out == DEVICE)
        for (int64_t i = 0; i < rows * cols; ++i)
            K[(size_t)i] = f32 ? (double)((const float *)host.data())[i] : ((const double *)host.data())[i];
    if (out == NPY && !qk_test_read_k(path, rows, cols, K.data())) return false;
    return true;
}

static double max_diff(const std::vector<double> &a, const std::vector<double> &b)
{
    double w = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        double e = fabs(a[i] - b[i]);
        if (e != e) return INFINITY;
        w = std::max(w, e);
    }
    return w;
}

static void host_cases(qk_ctx *cpu, qk_ctx *gpu)
{
    struct C { qk_state_type t; int64_t dim, na, nb, pad; } cases[] = {
        {QK_STATE_C128, 256, 700, 0, 0},  {QK_STATE_C128, 1000, 300, 170, 3}, {QK_STATE_C64, 4096, 200, 0, 0},
        {QK_STATE_F64, 512, 333, 129, 0}, {QK_STATE_F32, 100, 257, 0, 2},     {QK_STATE_C128, 4, 900, 0, 0},
    };
    for (const C &c : cases) {
        std::vector<char> a = rand_states(c.na, c.dim, c.dim + c.pad, c.t), b;
        if (c.nb) b = rand_states(c.nb, c.dim, c.dim + c.pad, c.t);
        qk_states_desc st;
        memset(&st, 0, sizeof st);
        st.type = c.t; st.dim = c.dim; st.a = a.data(); st.n_a = c.na; st.lda = c.dim + c.pad;
        if (c.nb) { st.b = b.data(); st.n_b = c.nb; st.ldb = c.dim + c.pad; }
        std::vector<double> Kc, Kg;
        if (!gram_states(cpu, st, QK_PRECISION_FP64, HOST, Kc)) { CHECK(false, "cpu reference failed"); continue; }
        int q = 1;
        while (((int64_t)1 << q) < c.dim) ++q;
        for (int out = HOST; out <= NPY; ++out) {
            bool ok = gram_states(gpu, st, QK_PRECISION_FP64, (Out)out, Kg);
            double e = ok ? max_diff(Kc, Kg) : INFINITY;
            CHECK(e <= 1e-12, "type %d dim %lld %s fp64 %s: |gpu - cpu| = %.3g", (int)c.t, (long long)c.dim, c.nb ? "K(A,B)" : "K(A,A)",
                  out_name[out], e);
        }
        const qk_precision precs[] = {QK_PRECISION_FP32, QK_PRECISION_FP32X3, QK_PRECISION_TF32, QK_PRECISION_FP16};
        for (qk_precision p : precs) {
            qk_plan plan;
            bool ok = gram_states(gpu, st, p, HOST, Kg, &plan);
            double e = ok ? max_diff(Kc, Kg) : INFINITY, bound = qk_precision_error_bound(p, q);
            CHECK(e <= bound, "type %d dim %lld %s %s (%s): |gpu - cpu| = %.3g > bound %.3g", (int)c.t, (long long)c.dim,
                  c.nb ? "K(A,B)" : "K(A,A)", qk_precision_name(p), plan.config, e, bound);
        }
    }
}

static void device_cases(qk_ctx *cpu, qk_ctx *gpu)
{
    const qk_state_type types[] = {QK_STATE_C128, QK_STATE_C64, QK_STATE_F64, QK_STATE_F32};
    for (qk_state_type t : types) {
        const int64_t dim = 2048, na = 400, nb = 150, ld = dim + (t == QK_STATE_F32 ? 2 : 0);
        std::vector<char> a = rand_states(na, dim, ld, t), b = rand_states(nb, dim, ld, t);
        void *da = nullptr, *db = nullptr;
        if (cudaMalloc(&da, a.size()) != cudaSuccess || cudaMalloc(&db, b.size()) != cudaSuccess) { CHECK(false, "cudaMalloc"); return; }
        cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice);
        for (int sym = 1; sym >= 0; --sym) {
            qk_states_desc sh, sd;
            memset(&sh, 0, sizeof sh);
            sh.type = t; sh.dim = dim; sh.a = a.data(); sh.n_a = na; sh.lda = ld;
            if (!sym) { sh.b = b.data(); sh.n_b = nb; sh.ldb = ld; }
            sd = sh;
            sd.a = da; sd.b = sym ? nullptr : db; sd.on_device = 1;
            std::vector<double> Kh, Kd, Kc;
            gram_states(gpu, sh, QK_PRECISION_FP64, DEVICE, Kh);   /* the context's pool grown to this job's buffers */
            int c0 = qk_cuda_test_alloc_count();
            long long b0 = qk_cuda_test_rows_in_bytes();
            bool okh = gram_states(gpu, sh, QK_PRECISION_FP64, DEVICE, Kh);
            int c1 = qk_cuda_test_alloc_count();
            long long b1 = qk_cuda_test_rows_in_bytes();
            bool okd = gram_states(gpu, sd, QK_PRECISION_FP64, DEVICE, Kd);
            int c2 = qk_cuda_test_alloc_count();
            long long b2 = qk_cuda_test_rows_in_bytes();
            CHECK(okh && okd && Kh.size() == Kd.size() && memcmp(Kh.data(), Kd.data(), Kh.size() * 8) == 0,
                  "type %d %s: device states' K differs from host states' K (max %.3g)", (int)t, sym ? "K(A,A)" : "K(A,B)", max_diff(Kh, Kd));
            /* not copied: the host states' run copies its rows into the engine's buffers (the
               stream pool's, kept across calls), the device states' run copies none; it acquires
               one buffer of norms per side (the check) that the host run does not */
            CHECK(b1 - b0 >= (long long)(na - 1) * dim * esize(t) && b2 == b1, "type %d %s: rows copied in: host states %lld bytes, "
                  "device states %lld (want > 0 and 0)", (int)t, sym ? "K(A,A)" : "K(A,B)", b1 - b0, b2 - b1);
            CHECK(c2 - c1 == c1 - c0 + (sym ? 1 : 2), "type %d %s: device acquisitions: host states %d, device states %d (want %d "
                  "norm buffers more)", (int)t, sym ? "K(A,A)" : "K(A,B)", c1 - c0, c2 - c1, sym ? 1 : 2);
            gram_states(cpu, sh, QK_PRECISION_FP64, HOST, Kc);
            CHECK(max_diff(Kc, Kd) <= 1e-12, "type %d: device states vs cpu: %.3g", (int)t, max_diff(Kc, Kd));
            /* fp32 on device states, within the bound */
            std::vector<double> K32;
            int q = 11;
            bool ok = gram_states(gpu, sd, QK_PRECISION_FP32, HOST, K32);
            CHECK(ok && max_diff(Kc, K32) <= qk_precision_error_bound(QK_PRECISION_FP32, q), "type %d fp32 device states: %.3g", (int)t,
                  max_diff(Kc, K32));
        }
        /* normalize on the device: scale row 3 by 2.5 (a host copy does the same for the CPU) */
        {
            std::vector<char> a2 = a;
            const int es = esize(t), scalars = (t == QK_STATE_C128 || t == QK_STATE_C64) ? 2 : 1;
            const size_t ss = t == QK_STATE_C128 || t == QK_STATE_F64 ? 8 : 4;
            for (int64_t k = 0; k < dim * scalars; ++k) {
                char *e = a2.data() + (size_t)(3 * ld * es) + (size_t)k * ss;
                if (t == QK_STATE_C128 || t == QK_STATE_F64) { double v; memcpy(&v, e, 8); v *= 2.5; memcpy(e, &v, 8); }
                else { float v; memcpy(&v, e, 4); v *= 2.5f; memcpy(e, &v, 4); }
            }
            cudaMemcpy(da, a2.data(), a2.size(), cudaMemcpyHostToDevice);
            qk_states_desc sh, sd;
            memset(&sh, 0, sizeof sh);
            sh.type = t; sh.dim = dim; sh.a = a2.data(); sh.n_a = na; sh.lda = ld; sh.normalize = 1;
            sd = sh; sd.a = da; sd.on_device = 1;
            std::vector<double> Kc, Kd;
            qk_states_desc sn = sd;
            sn.normalize = 0;
            CHECK(!gram_states(gpu, sn, QK_PRECISION_FP64, HOST, Kd) && strstr(qk_last_error(), "A[3]"), "type %d: a device norm of 2.5^2 not named: %s",
                  (int)t, qk_last_error());
            bool ok = gram_states(cpu, sh, QK_PRECISION_FP64, HOST, Kc) && gram_states(gpu, sd, QK_PRECISION_FP64, HOST, Kd);
            CHECK(ok && max_diff(Kc, Kd) <= 1e-12, "type %d normalize on the device: %.3g", (int)t, ok ? max_diff(Kc, Kd) : INFINITY);
            /* a NaN on the device */
            double nan = NAN;
            float nanf = NAN;
            if (t == QK_STATE_C128 || t == QK_STATE_F64) cudaMemcpy((char *)da + (size_t)(17 * ld * esize(t)) + 8 * (t == QK_STATE_C128), &nan, 8, cudaMemcpyHostToDevice);
            else cudaMemcpy((char *)da + (size_t)(17 * ld * esize(t)), &nanf, 4, cudaMemcpyHostToDevice);
            CHECK(!gram_states(gpu, sd, QK_PRECISION_FP64, HOST, Kd) && strstr(qk_last_error(), "A[17]") && strstr(qk_last_error(), "NaN"),
                  "type %d: a device NaN not named: %s", (int)t, qk_last_error());
        }
        cudaFree(da);
        cudaFree(db);
    }
    /* a host pointer passed as device memory */
    std::vector<char> a = rand_states(10, 64, 64, QK_STATE_C128);
    qk_states_desc sd;
    std::vector<double> K;
    memset(&sd, 0, sizeof sd);
    sd.dim = 64; sd.a = a.data(); sd.n_a = 10; sd.on_device = 1;
    CHECK(!gram_states(gpu, sd, QK_PRECISION_FP64, HOST, K) && strstr(qk_last_error(), "not CUDA device memory"), "host as device: %s", qk_last_error());
}

/* ---- density matrices (a_mixed / b_mixed): K = Tr(rho_i rho_j), plan.linear ---- */

/* n random density matrices dim x dim in type t (rows ld elements apart): mixtures of 2..4 random
   pure states with random weights (rank >= 2: purity < 1, so K's diagonal is no square of itself);
   real types: real states (real symmetric matrices). The entries rounded to t; ref gets them back
   as complex doubles (n x dim x dim) for the definition. */
static std::vector<char> rand_dms(int64_t n, int64_t dim, int64_t ld, qk_state_type t, std::vector<double> &ref)
{
    const int es = esize(t);
    const bool cplx = t == QK_STATE_C128 || t == QK_STATE_C64, f32 = t == QK_STATE_C64 || t == QK_STATE_F32;
    std::vector<char> s((size_t)(n * ld * es), 0);
    ref.assign((size_t)(2 * n * dim * dim), 0.0);
    for (int64_t i = 0; i < n; ++i) {
        const int r = 2 + (int)(qk_test_urand() * 3.0);
        std::vector<double> w((size_t)r), rho((size_t)(2 * dim * dim), 0.0);
        double wsum = 0;
        for (double &x : w) { x = 0.05 + qk_test_urand(); wsum += x; }
        for (int k = 0; k < r; ++k) {
            std::vector<char> psi = rand_states(1, dim, dim, cplx ? QK_STATE_C128 : QK_STATE_F64);
            for (int64_t a = 0; a < dim; ++a)
                for (int64_t b = 0; b < dim; ++b) {
                    double ar, ai, br, bi;
                    qk__state_amp(psi.data(), cplx ? QK_STATE_C128 : QK_STATE_F64, a, &ar, &ai);
                    qk__state_amp(psi.data(), cplx ? QK_STATE_C128 : QK_STATE_F64, b, &br, &bi);
                    rho[(size_t)(2 * (a * dim + b))] += w[(size_t)k] / wsum * (ar * br + ai * bi);
                    rho[(size_t)(2 * (a * dim + b) + 1)] += w[(size_t)k] / wsum * (ai * br - ar * bi);
                }
        }
        for (int64_t a = 0; a < dim; ++a)   /* exactly Hermitian before rounding */
            for (int64_t b = a; b < dim; ++b) {
                double re = rho[(size_t)(2 * (a * dim + b))], im = a == b ? 0.0 : rho[(size_t)(2 * (a * dim + b) + 1)];
                rho[(size_t)(2 * (a * dim + b))] = re; rho[(size_t)(2 * (a * dim + b) + 1)] = im;
                rho[(size_t)(2 * (b * dim + a))] = re; rho[(size_t)(2 * (b * dim + a) + 1)] = -im;
            }
        for (int64_t k = 0; k < dim * dim; ++k) {
            char *e = s.data() + (size_t)((i * ld + k) * es);
            double a = rho[(size_t)(2 * k)], b = rho[(size_t)(2 * k + 1)];
            if (f32) { float v[2] = {(float)a, (float)b}; memcpy(e, v, cplx ? 8 : 4); }
            else { double v[2] = {a, b}; memcpy(e, v, cplx ? 16 : 8); }
            double re, im;
            qk__state_amp(e, t, 0, &re, &im);
            ref[(size_t)(2 * (i * dim * dim + k))] = re;
            ref[(size_t)(2 * (i * dim * dim + k) + 1)] = im;
        }
    }
    return s;
}

/* Tr(rho sigma) = sum_ab rho_ab sigma_ba (the definition, in double) for every pair; a pure side
   (pa / pb: n x dim complex) as |psi><psi| */
static std::vector<double> hs_ref(const std::vector<double> &A, int64_t na, const std::vector<double> &B, int64_t nb, int64_t dim)
{
    std::vector<double> K((size_t)(na * nb));
    const int64_t d2 = dim * dim;
    for (int64_t i = 0; i < na; ++i)
        for (int64_t j = 0; j < nb; ++j) {
            double acc = 0;
            for (int64_t a = 0; a < dim; ++a)
                for (int64_t b = 0; b < dim; ++b) {
                    const double *x = &A[(size_t)(2 * (i * d2 + a * dim + b))], *y = &B[(size_t)(2 * (j * d2 + b * dim + a))];
                    acc += x[0] * y[0] - x[1] * y[1];
                }
            K[(size_t)(i * nb + j)] = acc;
        }
    return K;
}

/* pure states (n x dim of type t) as complex |psi><psi| (n x dim x dim, for hs_ref), each entry
   rounded to t's precision as qk expands them (float types: to float) */
static std::vector<double> outer_ref(const std::vector<char> &S, int64_t n, int64_t dim, qk_state_type t)
{
    std::vector<double> R((size_t)(2 * n * dim * dim));
    for (int64_t i = 0; i < n; ++i)
        for (int64_t a = 0; a < dim; ++a)
            for (int64_t b = 0; b < dim; ++b) {
                double ar, ai, br, bi;
                qk__state_amp(S.data() + (size_t)(i * dim * esize(t)), t, a, &ar, &ai);
                qk__state_amp(S.data() + (size_t)(i * dim * esize(t)), t, b, &br, &bi);
                const bool f32 = t == QK_STATE_C64 || t == QK_STATE_F32;
                const double re = ar * br + ai * bi, im = ai * br - ar * bi;
                R[(size_t)(2 * ((i * dim + a) * dim + b))] = f32 ? (double)(float)re : re;
                R[(size_t)(2 * ((i * dim + a) * dim + b) + 1)] = f32 ? (double)(float)im : im;
            }
    return R;
}

/* The stated bound of a linear K in precision p at the vectors' qubit count q (docs/states.md,
   "On the GPU engine"): the plan's error_bound, which the test reads from the plan and checks
   against qk_precision_error_bound; fp64 is held to 1e-12 against the CPU. */
static void mixed_host_cases(qk_ctx *cpu, qk_ctx *gpu)
{
    struct C { qk_state_type t; int64_t dim, na, nb, pad; int pure_a; } cases[] = {
        {QK_STATE_C128, 2, 301, 0, 0, 0},  {QK_STATE_C128, 5, 130, 77, 3, 0}, {QK_STATE_C64, 12, 150, 0, 0, 0},
        {QK_STATE_F64, 7, 90, 133, 0, 0},  {QK_STATE_C128, 32, 140, 0, 0, 0}, {QK_STATE_F32, 9, 65, 40, 2, 0},
        {QK_STATE_C128, 6, 70, 110, 0, 1}, {QK_STATE_C64, 16, 64, 33, 0, 1},  {QK_STATE_F64, 10, 50, 45, 0, 1},
    };
    for (const C &c : cases) {
        std::vector<double> ra, rb;
        std::vector<char> a, b;
        const int64_t ld = c.dim * c.dim + c.pad;
        if (c.pure_a) { a = rand_states(c.na, c.dim, c.dim, c.t); ra = outer_ref(a, c.na, c.dim, c.t); }
        else a = rand_dms(c.na, c.dim, ld, c.t, ra);
        if (c.nb) b = rand_dms(c.nb, c.dim, ld, c.t, rb);
        qk_states_desc st;
        memset(&st, 0, sizeof st);
        st.type = c.t; st.dim = c.dim; st.a = a.data(); st.n_a = c.na; st.lda = c.pure_a ? c.dim : ld; st.a_mixed = !c.pure_a;
        if (c.nb) { st.b = b.data(); st.n_b = c.nb; st.ldb = ld; st.b_mixed = 1; }
        const bool cplx = c.t == QK_STATE_C128 || c.t == QK_STATE_C64;
        int q = 1;
        while (((int64_t)1 << q) < c.dim * c.dim * (cplx ? 2 : 1)) ++q;
        char what[96];
        snprintf(what, sizeof what, "mixed type %d dim %lld %s%s", (int)c.t, (long long)c.dim, c.nb ? "K(A,B)" : "K(A,A)",
                 c.pure_a ? " pure A" : "");
        std::vector<double> Kc, Kg, Kd = hs_ref(ra, c.na, c.nb ? rb : ra, c.nb ? c.nb : c.na, c.dim);
        if (!gram_states(cpu, st, QK_PRECISION_FP64, HOST, Kc)) { CHECK(false, "%s: cpu reference failed", what); continue; }
        CHECK(max_diff(Kc, Kd) <= 1e-12, "%s: the CPU engine vs the definition: %.3g", what, max_diff(Kc, Kd));
        for (int out = HOST; out <= NPY; ++out) {
            qk_plan plan;
            bool ok = gram_states(gpu, st, QK_PRECISION_FP64, (Out)out, Kg, &plan);
            double e = ok ? max_diff(Kc, Kg) : INFINITY;
            CHECK(e <= 1e-12, "%s fp64 %s: |gpu - cpu| = %.3g", what, out_name[out], e);
            CHECK(ok && plan.backend == QK_BACKEND_CUDA && plan.linear == 1 && plan.engine == QK_GPU_CUBLAS && plan.n_qubits == q,
                  "%s: plan backend %d linear %d engine %d qubits %d (want CUDA, 1, CUBLAS, %d)", what, (int)plan.backend, plan.linear,
                  (int)plan.engine, plan.n_qubits, q);
        }
        const qk_precision precs[] = {QK_PRECISION_FP32, QK_PRECISION_DEFAULT, QK_PRECISION_FP32X3, QK_PRECISION_TF32, QK_PRECISION_FP16};
        for (qk_precision p : precs) {
            qk_plan plan;
            const Out out = p == QK_PRECISION_FP32 ? DEVICE : HOST;
            bool ok = gram_states(gpu, st, p, out, Kg, &plan);
            double e = ok ? max_diff(Kc, Kg) : INFINITY;
            /* the mode that runs: the default is fp32x3 from 7 qubits (of the vector), else fp32; the
               tensor-core modes run on the tensor cores from 6 qubits (fp32x3 from 7), else fp32 */
            const qk_precision pb = p == QK_PRECISION_DEFAULT ? (q >= 7 ? QK_PRECISION_FP32X3 : QK_PRECISION_FP32) : p;
            const bool on_tc = (pb == QK_PRECISION_FP32X3 && q >= 7) || ((pb == QK_PRECISION_TF32 || pb == QK_PRECISION_FP16) && q >= 6);
            const qk_gpu_engine want = !on_tc ? QK_GPU_CUBLAS : pb == QK_PRECISION_FP16 ? QK_GPU_TC_FP16
                                       : pb == QK_PRECISION_TF32 ? QK_GPU_TC_TF32 : QK_GPU_TC_FP32X3;
            CHECK(ok && plan.error_bound == qk_precision_error_bound(pb, q) && e <= plan.error_bound,
                  "%s %s (%s): |gpu - cpu| = %.3g, bound %.3g (plan %.3g)", what, qk_precision_name(p), ok ? plan.config : "-", e,
                  qk_precision_error_bound(pb, q), ok ? plan.error_bound : -1.0);
            CHECK(ok && plan.linear && plan.engine == want && strstr(plan.config, "linear epilogue") && plan.precision == pb &&
                  (on_tc ? strstr(plan.config, "tensor cores, real form") != nullptr
                         : pb == QK_PRECISION_FP32 || strstr(plan.config, "no tensor cores") != nullptr),
                  "%s %s: plan engine %d (want %d) precision %s config '%s'", what, qk_precision_name(p), ok ? (int)plan.engine : -1,
                  (int)want, ok ? qk_precision_name(plan.precision) : "-", ok ? plan.config : "-");
            if (ok && on_tc) printf("  err %s %s: %.3g (bound %.3g)\n", what, qk_precision_name(pb), e, plan.error_bound);
        }
    }
    /* a host matrix that is not Hermitian, and one whose trace is off: named, the output untouched */
    std::vector<double> r;
    std::vector<char> a = rand_dms(20, 4, 16, QK_STATE_C128, r);
    qk_states_desc st;
    memset(&st, 0, sizeof st);
    st.type = QK_STATE_C128; st.dim = 4; st.a = a.data(); st.n_a = 20; st.a_mixed = 1;
    double v;
    memcpy(&v, a.data() + (size_t)((6 * 16 + 1) * 16), 8);
    v += 1e-3;
    memcpy(a.data() + (size_t)((6 * 16 + 1) * 16), &v, 8);
    std::vector<double> K;
    CHECK(!gram_states(gpu, st, QK_PRECISION_FP64, HOST, K) && strstr(qk_last_error(), "A[6]") && strstr(qk_last_error(), "Hermitian"),
          "host non-Hermitian on the GPU context: %s", qk_last_error());
}

/* Device density matrices: read in place (bitwise the host matrices' GPU K, not copied), checked
   on the device (trace, Hermiticity, NaN, named by row), normalize by the trace on the device. */
static void mixed_device_cases(qk_ctx *cpu, qk_ctx *gpu)
{
    const qk_state_type types[] = {QK_STATE_C128, QK_STATE_C64, QK_STATE_F64, QK_STATE_F32};
    for (qk_state_type t : types) {
        const int64_t dim = 20, na = 180, nb = 70, ld = dim * dim + (t == QK_STATE_F32 ? 2 : 0);
        const int es = esize(t);
        std::vector<double> ra, rb;
        std::vector<char> a = rand_dms(na, dim, ld, t, ra), b = rand_dms(nb, dim, ld, t, rb);
        void *da = nullptr, *db = nullptr;
        if (cudaMalloc(&da, a.size()) != cudaSuccess || cudaMalloc(&db, b.size()) != cudaSuccess) { CHECK(false, "cudaMalloc"); return; }
        cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice);
        for (int sym = 1; sym >= 0; --sym) {
            qk_states_desc sh, sd;
            memset(&sh, 0, sizeof sh);
            sh.type = t; sh.dim = dim; sh.a = a.data(); sh.n_a = na; sh.lda = ld; sh.a_mixed = 1;
            if (!sym) { sh.b = b.data(); sh.n_b = nb; sh.ldb = ld; sh.b_mixed = 1; }
            sd = sh;
            sd.a = da; sd.b = sym ? nullptr : db; sd.on_device = 1;
            std::vector<double> Kh, Kd, Kc, K32;
            gram_states(gpu, sh, QK_PRECISION_FP64, DEVICE, Kh);   /* the context's pool grown to this job's buffers */
            int c0 = qk_cuda_test_alloc_count();
            long long b0 = qk_cuda_test_rows_in_bytes();
            bool okh = gram_states(gpu, sh, QK_PRECISION_FP64, DEVICE, Kh);
            int c1 = qk_cuda_test_alloc_count();
            long long b1 = qk_cuda_test_rows_in_bytes();
            bool okd = gram_states(gpu, sd, QK_PRECISION_FP64, DEVICE, Kd);
            int c2 = qk_cuda_test_alloc_count();
            long long b2 = qk_cuda_test_rows_in_bytes();
            CHECK(okh && okd && Kh.size() == Kd.size() && memcmp(Kh.data(), Kd.data(), Kh.size() * 8) == 0,
                  "mixed type %d %s: device matrices' K differs from host matrices' K (max %.3g)", (int)t, sym ? "K(A,A)" : "K(A,B)",
                  max_diff(Kh, Kd));
            /* not copied (as for pure states): the host run copies its rows in, the device run
               none, and acquires a check buffer per side */
            CHECK(b1 - b0 >= (long long)(na - 1) * dim * dim * es && b2 == b1, "mixed type %d %s: rows copied in: host %lld bytes, device %lld "
                  "(want > 0 and 0)", (int)t, sym ? "K(A,A)" : "K(A,B)", b1 - b0, b2 - b1);
            CHECK(c2 - c1 == c1 - c0 + (sym ? 1 : 2), "mixed type %d %s: device acquisitions: host %d, device %d (want %d more)", (int)t,
                  sym ? "K(A,A)" : "K(A,B)", c1 - c0, c2 - c1, sym ? 1 : 2);
            gram_states(cpu, sh, QK_PRECISION_FP64, HOST, Kc);
            std::vector<double> Kr = hs_ref(ra, na, sym ? ra : rb, sym ? na : nb, dim);
            CHECK(max_diff(Kc, Kd) <= 1e-12 && max_diff(Kr, Kd) <= 1e-12, "mixed type %d device vs cpu: %.3g, vs the definition %.3g",
                  (int)t, max_diff(Kc, Kd), max_diff(Kr, Kd));
            qk_plan plan;
            bool ok = gram_states(gpu, sd, QK_PRECISION_FP32, CALLBACK, K32, &plan);
            CHECK(ok && plan.linear && max_diff(Kc, K32) <= plan.error_bound, "mixed type %d fp32 device matrices: %.3g (bound %.3g)",
                  (int)t, max_diff(Kc, K32), ok ? plan.error_bound : -1.0);
            /* the tensor-core modes on device matrices (vectors of 2^10 reals complex, 2^9 real: on
               the tensor cores), and the default (fp32x3 there), within their bounds */
            const qk_precision tcp[] = {QK_PRECISION_FP32X3, QK_PRECISION_TF32, QK_PRECISION_FP16, QK_PRECISION_DEFAULT};
            for (qk_precision p : tcp) {
                const qk_gpu_engine want = p == QK_PRECISION_FP16 ? QK_GPU_TC_FP16 : p == QK_PRECISION_TF32 ? QK_GPU_TC_TF32 : QK_GPU_TC_FP32X3;
                ok = gram_states(gpu, sd, p, p == QK_PRECISION_FP16 ? DEVICE : HOST, K32, &plan);
                const double e = ok ? max_diff(Kc, K32) : INFINITY;
                CHECK(ok && plan.linear && plan.engine == want && e <= plan.error_bound,
                      "mixed type %d %s %s device matrices: engine %d (want %d), |K - K_fp64| %.3g (bound %.3g)", (int)t,
                      sym ? "K(A,A)" : "K(A,B)", qk_precision_name(p), ok ? (int)plan.engine : -1, (int)want, e, ok ? plan.error_bound : -1.0);
                if (ok) printf("  err mixed device type %d %s %s: %.3g (bound %.3g)\n", (int)t, sym ? "K(A,A)" : "K(A,B)",
                               qk_precision_name(plan.precision), e, plan.error_bound);
            }
        }
        {   /* normalize: matrix 3 scaled by 2.5 (trace 2.5), the same on a host copy for the CPU */
            std::vector<char> a2 = a;
            const int scalars = (t == QK_STATE_C128 || t == QK_STATE_C64) ? 2 : 1;
            const size_t ss = t == QK_STATE_C128 || t == QK_STATE_F64 ? 8 : 4;
            for (int64_t k = 0; k < dim * dim * scalars; ++k) {
                char *e = a2.data() + (size_t)(3 * ld * es) + (size_t)k * ss;
                if (ss == 8) { double v; memcpy(&v, e, 8); v *= 2.5; memcpy(e, &v, 8); }
                else { float v; memcpy(&v, e, 4); v *= 2.5f; memcpy(e, &v, 4); }
            }
            cudaMemcpy(da, a2.data(), a2.size(), cudaMemcpyHostToDevice);
            qk_states_desc sh, sd;
            memset(&sh, 0, sizeof sh);
            sh.type = t; sh.dim = dim; sh.a = a2.data(); sh.n_a = na; sh.lda = ld; sh.a_mixed = 1; sh.normalize = 1;
            sd = sh; sd.a = da; sd.on_device = 1;
            qk_states_desc sn = sd;
            sn.normalize = 0;
            std::vector<double> Kc, Kd;
            CHECK(!gram_states(gpu, sn, QK_PRECISION_FP64, HOST, Kd) && strstr(qk_last_error(), "A[3]") && strstr(qk_last_error(), "trace"),
                  "mixed type %d: a device trace of 2.5 not named: %s", (int)t, qk_last_error());
            bool ok = gram_states(cpu, sh, QK_PRECISION_FP64, HOST, Kc) && gram_states(gpu, sd, QK_PRECISION_FP64, HOST, Kd);
            CHECK(ok && max_diff(Kc, Kd) <= 1e-12, "mixed type %d normalize on the device: %.3g", (int)t, ok ? max_diff(Kc, Kd) : INFINITY);
            /* not Hermitian on the device: entry (0, 1) of matrix 5 moved by 1e-3 (complex: its real part) */
            cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
            const size_t off = (size_t)((5 * ld + 1) * es);
            if (ss == 8) { double v; memcpy(&v, a.data() + off, 8); v += 1e-3; cudaMemcpy((char *)da + off, &v, 8, cudaMemcpyHostToDevice); }
            else { float v; memcpy(&v, a.data() + off, 4); v += 1e-3f; cudaMemcpy((char *)da + off, &v, 4, cudaMemcpyHostToDevice); }
            sn.a = da;
            CHECK(!gram_states(gpu, sn, QK_PRECISION_FP64, HOST, Kd) && strstr(qk_last_error(), "A[5]") && strstr(qk_last_error(), "Hermitian"),
                  "mixed type %d: a non-Hermitian device matrix not named: %s", (int)t, qk_last_error());
            /* a NaN on the device (matrix 7, entry (2, 3)) */
            cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
            double nan = NAN;
            float nanf = NAN;
            const size_t o7 = (size_t)((7 * ld + 2 * dim + 3) * es);
            if (ss == 8) cudaMemcpy((char *)da + o7, &nan, 8, cudaMemcpyHostToDevice);
            else cudaMemcpy((char *)da + o7, &nanf, 4, cudaMemcpyHostToDevice);
            CHECK(!gram_states(gpu, sn, QK_PRECISION_FP64, HOST, Kd) && strstr(qk_last_error(), "A[7]") && strstr(qk_last_error(), "NaN"),
                  "mixed type %d: a device NaN not named: %s", (int)t, qk_last_error());
            /* Hermitian, trace 1, not positive: entries (0, 1) and (1, 0) of matrix 4 raised by 2
               (past the trace; fp16 operands would overflow at large dims) */
            cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
            for (int64_t k : {(int64_t)1, dim}) {
                const size_t o4 = (size_t)((4 * ld + k) * es);
                if (ss == 8) { double v; memcpy(&v, a.data() + o4, 8); v += 2.0; cudaMemcpy((char *)da + o4, &v, 8, cudaMemcpyHostToDevice); }
                else { float v; memcpy(&v, a.data() + o4, 4); v += 2.0f; cudaMemcpy((char *)da + o4, &v, 4, cudaMemcpyHostToDevice); }
            }
            CHECK(!gram_states(gpu, sn, QK_PRECISION_FP16, HOST, Kd) && strstr(qk_last_error(), "A[4]") &&
                  strstr(qk_last_error(), "more than its trace"), "mixed type %d: a device entry past the trace not named: %s", (int)t,
                  qk_last_error());
        }
        /* a pure device side against device matrices, both ways round: the pure side expanded to
           |psi><psi| on the device, K = <psi|rho|psi>, equal to the host states' K (the same
           expansion, on the host) and to the definition; the tensor-core modes within their bounds;
           a pure row off norm 1 named */
        {
            std::vector<char> p = rand_states(30, dim, dim, t);
            std::vector<double> rp = outer_ref(p, 30, dim, t);
            void *dp = nullptr;
            cudaMalloc(&dp, p.size());
            cudaMemcpy(dp, p.data(), p.size(), cudaMemcpyHostToDevice);
            cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice);
            for (int pure_b = 0; pure_b <= 1; ++pure_b) {
                qk_states_desc sh, sd;
                memset(&sh, 0, sizeof sh);
                sh.type = t; sh.dim = dim;
                if (!pure_b) { sh.a = p.data(); sh.n_a = 30; sh.lda = dim; sh.b = b.data(); sh.n_b = nb; sh.ldb = ld; sh.b_mixed = 1; }
                else { sh.a = b.data(); sh.n_a = nb; sh.lda = ld; sh.a_mixed = 1; sh.b = p.data(); sh.n_b = 30; sh.ldb = dim; }
                sd = sh;
                sd.a = pure_b ? db : dp; sd.b = pure_b ? dp : db; sd.on_device = 1;
                const char *way = pure_b ? "K(rho, psi)" : "K(psi, rho)";
                std::vector<double> Kh, Kd, Kc, Kt;
                qk_plan plan;
                bool okh = gram_states(gpu, sh, QK_PRECISION_FP64, HOST, Kh), okd = gram_states(gpu, sd, QK_PRECISION_FP64, DEVICE, Kd, &plan);
                bool okc = gram_states(cpu, sh, QK_PRECISION_FP64, HOST, Kc);
                std::vector<double> Kr = pure_b ? hs_ref(rb, nb, rp, 30, dim) : hs_ref(rp, 30, rb, nb, dim);
                CHECK(okh && okd && okc && max_diff(Kh, Kd) <= 1e-12 && max_diff(Kc, Kd) <= 1e-12 && max_diff(Kr, Kd) <= 1e-12 && plan.linear,
                      "mixed type %d %s, pure device side: vs host states %.3g, vs cpu %.3g, vs the definition %.3g (%s)", (int)t, way,
                      okh && okd ? max_diff(Kh, Kd) : INFINITY, okc && okd ? max_diff(Kc, Kd) : INFINITY, okd ? max_diff(Kr, Kd) : INFINITY,
                      okd ? "ran" : qk_last_error());
                for (qk_precision pr : {QK_PRECISION_FP16, QK_PRECISION_FP32X3, QK_PRECISION_FP32}) {
                    bool ok = gram_states(gpu, sd, pr, pr == QK_PRECISION_FP16 ? NPY : HOST, Kt, &plan);
                    const double e = ok ? max_diff(Kc, Kt) : INFINITY;
                    CHECK(ok && e <= plan.error_bound && plan.precision == pr, "mixed type %d %s pure device side %s: %.3g (bound %.3g)", (int)t,
                          way, qk_precision_name(pr), e, ok ? plan.error_bound : -1.0);
                }
            }
            /* pure row 3 scaled by 2 (norm^2 4: the trace of its |psi><psi|) */
            std::vector<char> p2 = p;
            const size_t ss = t == QK_STATE_C128 || t == QK_STATE_F64 ? 8 : 4;
            const int scalars = (t == QK_STATE_C128 || t == QK_STATE_C64) ? 2 : 1;
            for (int64_t k = 0; k < dim * scalars; ++k) {
                char *e = p2.data() + (size_t)(3 * dim * esize(t)) + (size_t)k * ss;
                if (ss == 8) { double v; memcpy(&v, e, 8); v *= 2.0; memcpy(e, &v, 8); }
                else { float v; memcpy(&v, e, 4); v *= 2.0f; memcpy(e, &v, 4); }
            }
            cudaMemcpy(dp, p2.data(), p2.size(), cudaMemcpyHostToDevice);
            qk_states_desc sd;
            memset(&sd, 0, sizeof sd);
            sd.type = t; sd.dim = dim; sd.a = dp; sd.n_a = 30; sd.lda = dim; sd.b = db; sd.n_b = nb; sd.ldb = ld; sd.b_mixed = 1; sd.on_device = 1;
            std::vector<double> K;
            CHECK(!gram_states(gpu, sd, QK_PRECISION_FP64, HOST, K) && strstr(qk_last_error(), "A[3]") && strstr(qk_last_error(), "trace"),
                  "mixed type %d: a pure device row of norm 2 against device matrices not named: %s", (int)t, qk_last_error());
            sd.normalize = 1;
            std::vector<double> Kn, Kh;
            qk_states_desc sh = sd;
            sh.a = p2.data(); sh.b = b.data(); sh.on_device = 0;
            bool ok = gram_states(gpu, sd, QK_PRECISION_FP64, HOST, Kn) && gram_states(cpu, sh, QK_PRECISION_FP64, HOST, Kh);
            CHECK(ok && max_diff(Kn, Kh) <= 1e-12, "mixed type %d: normalize with a pure device side: %.3g", (int)t, ok ? max_diff(Kn, Kh) : INFINITY);
            cudaFree(dp);
        }
        cudaFree(da);
        cudaFree(db);
    }
}

/* qk's own states (qk_states on the CPU) given to the GPU engine: the map's GPU K */
static void own_states(qk_ctx *cpu, qk_ctx *gpu)
{
    qk_map *m = qk_test_parse("zz(reps=2)", 10);
    const int64_t n = 600, D = 1024;
    std::vector<double> x((size_t)(n * 10)), s((size_t)(2 * n * D)), Km((size_t)(n * n)), Ks;
    for (auto &v : x) v = qk_test_uniform(-1.5, 1.5);
    CHECK(qk_states(cpu, m, x.data(), n, s.data()) == QK_OK, "qk_states: %s", qk_last_error());
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.x = x.data(); g.n_x = n; g.out = Km.data(); g.out_dtype = QK_F64; g.precision = QK_PRECISION_FP64;
    CHECK(qk_gram(gpu, m, &g) == QK_OK, "map K: %s", qk_last_error());
    qk_states_desc st;
    memset(&st, 0, sizeof st);
    st.dim = D; st.a = s.data(); st.n_a = n;
    bool ok = gram_states(gpu, st, QK_PRECISION_FP64, HOST, Ks);
    CHECK(ok && max_diff(Km, Ks) <= 1e-12, "zz states on the GPU vs the map's GPU K: %.3g", ok ? max_diff(Km, Ks) : INFINITY);
    qk_map_free(m);
}

/* ---- host states streamed by state tile, and the state provider, on the GPU ---- */

/* A context on the first GPU whose planner may use about budget bytes of device memory (the
   autotuner off): the plan then holds only state tiles of the states */
static qk_ctx *budget_ctx(double budget)
{
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    qk_ctx_desc cd;
    qk_ctx *ctx = nullptr;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CUDA;
    cd.autotune = -1;
    cd.vram_fraction = std::min(1.0, budget / (double)free_b);
    if (qk_ctx_create(&cd, &ctx) != QK_OK) { printf("ctx: %s\n", qk_last_error()); exit(2); }
    return ctx;
}

/* The provider of the tests: rows of host arrays a, b (ld_src elements of es bytes apart), copied
   into qk's buffer at its ld; counts the rows asked for per side; fails (returns 1) when asked for
   row fail_row of side fail_side; scales row bad_row of side 0 by 2 (a norm of 4) when set. */
struct Prov {
    const char *src[2];
    int64_t ld_src, dim;
    int es;
    int64_t rows[2] = {0, 0};
    int calls = 0;
    int fail_side = -1;
    int64_t fail_row = -1, bad_row = -1;
};
static int prov_fn(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user)
{
    Prov *P = (Prov *)user;
    P->calls++;
    P->rows[side] += i1 - i0;
    if (side == P->fail_side && P->fail_row >= i0 && P->fail_row < i1) return 1;
    for (int64_t i = i0; i < i1; ++i) {
        char *o = (char *)buf + (size_t)((i - i0) * ld * P->es);
        memcpy(o, P->src[side] + (size_t)(i * P->ld_src * P->es), (size_t)(P->dim * P->es));
        if (side == 0 && i == P->bad_row) {
            if (P->es == 16 || P->es == 8) { double *v = (double *)o; for (int64_t k = 0; k < P->dim * P->es / 8; ++k) v[k] *= 2.0; }
            else { float *v = (float *)o; for (int64_t k = 0; k < P->dim; ++k) v[k] *= 2.0f; }
        }
    }
    return 0;
}

/* Rows the GPU engine asks a provider for under plan (docs/states.md): bulk, every row once;
   state tiles, each slab's rows, then for every column tile of the slab (from the slab's own rows
   on where K(A,A) is mirrored on the device: K there whole, or device output) its rows, except
   the tile that starts at the slab's first row and fits in it. */
static void expected_rows(const qk_plan &p, int64_t out[2], int64_t *copies = nullptr, int64_t band = 0)
{
    const int64_t nx = p.n_x, ny = p.n_y, rows = band > 0 ? band : nx;   /* band: the rows a symmetric job delivers (qk_cuda_io.band_rows) */
    int64_t nc = 0;
    out[0] = out[1] = 0;
    if (copies) *copies = 0;
    if (p.bulk_states) { out[0] = nx; if (!p.symmetric) out[1] = ny; if (copies) *copies = p.symmetric ? 1 : 2; return; }
    const int64_t R = p.state_tile, slab = std::min<int64_t>(p.tile_m, R);
    for (int64_t i0 = 0; i0 < rows; i0 += slab) {
        const int64_t m = std::min(slab, rows - i0);
        out[0] += m;
        nc++;
        const bool mirror = p.symmetric && (p.output == QK_OUTPUT_DEVICE || p.k_resident);
        for (int64_t j0 = mirror ? i0 : 0; j0 < ny; j0 += R) {
            const int64_t nn = std::min(R, ny - j0);
            if (p.symmetric && j0 == i0 && nn <= m) continue;
            out[p.symmetric ? 0 : 1] += nn;
            nc++;
        }
    }
    if (copies) *copies = nc;
}

static void streamed_cases(qk_ctx *cpu)
{
    /* a planner budget of 24 MB: the states below (11-16 MB a side with their scratch) go in tiles */
    qk_ctx *gpu = budget_ctx(24e6), *big = qk_test_ctx(QK_DEVICE_CUDA, 0);
    struct C { qk_state_type t; int64_t dim, na, nb, pad; } cases[] = {
        {QK_STATE_C128, 1024, 700, 0, 0}, {QK_STATE_C128, 1000, 650, 300, 3}, {QK_STATE_C64, 2048, 900, 0, 0},
        {QK_STATE_F64, 2048, 700, 333, 0}, {QK_STATE_F32, 4096, 900, 0, 2},
    };
    for (const C &c : cases) {
        std::vector<char> a = rand_states(c.na, c.dim, c.dim + c.pad, c.t), b;
        if (c.nb) b = rand_states(c.nb, c.dim, c.dim + c.pad, c.t);
        qk_states_desc st;
        memset(&st, 0, sizeof st);
        st.type = c.t; st.dim = c.dim; st.a = a.data(); st.n_a = c.na; st.lda = c.dim + c.pad;
        if (c.nb) { st.b = b.data(); st.n_b = c.nb; st.ldb = c.dim + c.pad; }
        const char *what = c.nb ? "K(A,B)" : "K(A,A)";
        std::vector<double> Kc, Kb, Kg;
        if (!gram_states(cpu, st, QK_PRECISION_FP64, HOST, Kc)) { CHECK(false, "cpu reference failed"); continue; }
        qk_plan plan, pb;
        bool okb = gram_states(big, st, QK_PRECISION_FP64, HOST, Kb, &pb);
        CHECK(okb && pb.bulk_states, "type %d %s: the default budget holds the states (bulk)", (int)c.t, what);
        for (int out = HOST; out <= NPY; ++out) {
            bool ok = gram_states(gpu, st, QK_PRECISION_FP64, (Out)out, Kg, &plan);
            CHECK(ok && !plan.bulk_states && plan.state_tile > 0 && plan.state_tile < std::max(c.na, c.nb),
                  "type %d %s %s: not planned in state tiles (bulk %d, tile %lld)", (int)c.t, what, out_name[out], plan.bulk_states,
                  (long long)plan.state_tile);
            double e = ok ? max_diff(Kc, Kg) : INFINITY;
            CHECK(e <= 1e-12, "type %d %s %s: streamed tiles |gpu - cpu| = %.3g", (int)c.t, what, out_name[out], e);
            if (out == HOST) {
                CHECK(ok && max_diff(Kb, Kg) <= 1e-13, "type %d %s: tiles vs bulk %.3g", (int)c.t, what, max_diff(Kb, Kg));
                /* the bytes copied in: the rows the plan implies, each a stored row (the caller's
                   ld when whole doubles, else packed to whole doubles) */
                int64_t rows[2], copies = 0;
                expected_rows(plan, rows, &copies);
                const int es = esize(c.t);
                const double rowb = (double)((c.dim + c.pad) * es % 8 == 0 ? (c.dim + c.pad) * es : (c.dim * es + 7) / 8 * 8);
                /* each copy's last row without the padding past its elements */
                const double want = (double)(rows[0] + rows[1]) * rowb - (double)copies * (rowb - (double)(c.dim * es));
                const qk_cuda_stats cs = qk_ctx_cuda_stats(gpu);
                CHECK(cs.copyin_bytes == want && cs.n_streams == 3 && cs.busy_ms[2] > 0 && cs.busy_ms[0] > 0 &&
                          cs.busy_ms[2] <= cs.wall_ms * 1.001,
                      "type %d %s: %.0f bytes copied in (%d streams, copy-in busy %.3f ms), the plan implies %.0f", (int)c.t, what,
                      cs.copyin_bytes, cs.n_streams, cs.busy_ms[2], want);
            }
        }
        CHECK(!qk_cuda_host_pinned(a.data()), "type %d %s: the caller's states are left page-locked after the call", (int)c.t, what);
        bool ok = gram_states(gpu, st, QK_PRECISION_FP32, HOST, Kg, &plan);
        int q = 1;
        while (((int64_t)1 << q) < c.dim) ++q;
        CHECK(ok && !plan.bulk_states && max_diff(Kc, Kg) <= qk_precision_error_bound(QK_PRECISION_FP32, q), "type %d %s fp32 tiles: %.3g",
              (int)c.t, what, ok ? max_diff(Kc, Kg) : INFINITY);

        /* the provider, in tiles and in bulk: K bit for bit that of the same host states on the
           same plan, and the rows asked for those the plan implies */
        for (qk_ctx *ctx : {gpu, big}) {
            Prov P;
            P.src[0] = a.data(); P.src[1] = c.nb ? b.data() : nullptr;
            P.ld_src = c.dim + c.pad; P.dim = c.dim; P.es = esize(c.t);
            qk_states_desc sp;
            memset(&sp, 0, sizeof sp);
            sp.type = c.t; sp.dim = c.dim; sp.n_a = c.na; sp.n_b = c.nb; sp.provider = prov_fn; sp.provider_user = &P;
            std::vector<double> Kh, Kp;
            qk_plan ph, pp;
            bool okh = gram_states(ctx, st, QK_PRECISION_FP64, HOST, Kh, &ph);
            P.rows[0] = P.rows[1] = 0;
            bool okp = gram_states(ctx, sp, QK_PRECISION_FP64, HOST, Kp, &pp);
            int64_t want[2];
            expected_rows(pp, want);
            const char *mode = ctx == gpu ? "tiles" : "bulk";
            CHECK(okh && okp && Kh.size() == Kp.size() && memcmp(Kh.data(), Kp.data(), Kh.size() * 8) == 0,
                  "type %d %s provider (%s): K differs from the host states' (max %.3g): %s", (int)c.t, what, mode, max_diff(Kh, Kp),
                  okp ? "" : qk_last_error());
            CHECK(P.rows[0] == want[0] && P.rows[1] == want[1], "type %d %s provider (%s): rows asked A %lld B %lld, the plan implies %lld, %lld",
                  (int)c.t, what, mode, (long long)P.rows[0], (long long)P.rows[1], (long long)want[0], (long long)want[1]);
            CHECK(!strcmp(ph.config, pp.config) && ph.state_tile == pp.state_tile, "type %d %s provider (%s): another plan (%s / %s)", (int)c.t,
                  what, mode, ph.config, pp.config);
        }
    }
    /* a provider that fails, and one that gives a row of norm 4: clean errors naming the rows,
       an existing .npy untouched */
    {
        const int64_t dim = 1024, n = 600;
        std::vector<char> a = rand_states(n, dim, dim, QK_STATE_C128);
        for (qk_ctx *ctx : {gpu, big}) {
            Prov P;
            P.src[0] = a.data(); P.src[1] = nullptr; P.ld_src = dim; P.dim = dim; P.es = 16; P.fail_side = 0; P.fail_row = 555;
            qk_states_desc sp;
            memset(&sp, 0, sizeof sp);
            sp.dim = dim; sp.n_a = n; sp.provider = prov_fn; sp.provider_user = &P;
            char path[256];
            snprintf(path, sizeof path, "states_gpu_%d.npy", (int)getpid());
            qk_test_write_text(path, "keep me");
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.output = QK_OUTPUT_NPY; g.out_path = path; g.precision = QK_PRECISION_FP64; g.no_sync = 1;
            qk_result r = qk_gram_states(ctx, &sp, &g);
            char *txt = qk_test_read_file(path, nullptr);
            CHECK(r == QK_ERROR_CANCELLED && strstr(qk_last_error(), "state provider failed") && strstr(qk_last_error(), "A rows"),
                  "failing provider on the GPU: %d %s", (int)r, qk_last_error());
            CHECK(txt && !strcmp(txt, "keep me"), "failing provider on the GPU: the existing .npy was changed");
            free(txt);
            P.fail_row = -1;
            P.bad_row = 444;
            r = qk_gram_states(ctx, &sp, &g);
            CHECK(r != QK_OK && strstr(qk_last_error(), "A[444]"), "a provider row of norm 4 on the GPU: %d %s", (int)r, qk_last_error());
            txt = qk_test_read_file(path, nullptr);
            CHECK(txt && !strcmp(txt, "keep me"), "bad provider row on the GPU: the existing .npy was changed");
            free(txt);
            remove(path);
        }
    }
    /* page-locked states of the caller stay page-locked (qk locks only what it finds pageable) */
    {
        const int64_t dim = 512, n = 300;
        std::vector<char> a = rand_states(n, dim, dim, QK_STATE_C128);
        void *pin = nullptr;
        if (cudaMallocHost(&pin, a.size()) != cudaSuccess) { CHECK(false, "cudaMallocHost"); }
        else {
            memcpy(pin, a.data(), a.size());
            qk_states_desc st;
            memset(&st, 0, sizeof st);
            st.dim = dim; st.a = pin; st.n_a = n;
            std::vector<double> Kp, Kc;
            bool ok = gram_states(gpu, st, QK_PRECISION_FP64, HOST, Kp);
            st.a = a.data();
            ok = ok && gram_states(cpu, st, QK_PRECISION_FP64, HOST, Kc);
            CHECK(ok && max_diff(Kp, Kc) <= 1e-12 && qk_cuda_host_pinned(pin), "pinned caller states: %.3g, still pinned %d",
                  ok ? max_diff(Kp, Kc) : INFINITY, qk_cuda_host_pinned(pin));
            cudaFreeHost(pin);
        }
    }
    qk_ctx_destroy(big);
    qk_ctx_destroy(gpu);
}

/* ---- device states on several GPUs (one process) ---- */

/* A context on GPUs 0 .. n-1 (the autotuner off), planning with about budget bytes of each GPU's
   device memory (0: the default fraction). */
static qk_ctx *gpus_ctx(int n, double budget)
{
    static const int ords[2] = {0, 1};
    qk_ctx_desc cd;
    qk_ctx *ctx = nullptr;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CUDA;
    cd.autotune = -1;
    cd.cuda_devices = ords;
    cd.n_cuda_devices = n;
    if (budget > 0) {
        size_t free_b = 0, total = 0;
        cudaSetDevice(0);
        cudaMemGetInfo(&free_b, &total);
        cd.vram_fraction = std::min(1.0, budget / (double)free_b);
    }
    if (qk_ctx_create(&cd, &ctx) != QK_OK) { printf("ctx: %s\n", qk_last_error()); exit(2); }
    return ctx;
}

/* K from st on ctx dealt to every GPU of the context (mgpu_min_pairs 1, the host-bound split
   on), into *plan (n_devices, parts) as qk_plan_states makes it; DEVICE: one buffer per GPU
   (out_devices, its band's rows), read back into K (K(A,A): columns from the band on, mirrored) */
static bool gram_states_mgpu(qk_ctx *ctx, const qk_states_desc &st, qk_precision prec, Out out, std::vector<double> &K, qk_plan *plan)
{
    const int64_t rows = st.n_a, cols = st.b ? st.n_b : st.n_a;
    const bool f32 = prec != QK_PRECISION_FP64, sym = !st.b;
    const size_t es = f32 ? 4 : 8;
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.precision = prec;
    g.out_dtype = f32 ? QK_F32 : QK_F64;
    g.mgpu_min_pairs = 1;
    g.mgpu_host_bound_split = 1;
    K.assign((size_t)(rows * cols), NAN);
    std::vector<char> host((size_t)(rows * cols) * es);
    void *dev[2] = {nullptr, nullptr};
    Tiles T = {&K, cols, sym, f32};
    char path[256];
    snprintf(path, sizeof path, "states_mgpu_%d.npy", (int)getpid());
    switch (out) {
    case HOST: g.output = QK_OUTPUT_HOST; g.out = host.data(); memset(host.data(), 0xff, host.size()); break;
    case DEVICE: g.output = QK_OUTPUT_DEVICE; break;
    case CALLBACK: g.output = QK_OUTPUT_CALLBACK; g.tile_fn = on_tile; g.tile_user = &T; break;
    case NPY: g.output = QK_OUTPUT_NPY; g.out_path = path; g.no_sync = 1; break;
    }
    if (out == DEVICE) g.out_devices = dev;   /* filled below; the planner does not read them */
    if (qk_plan_states(ctx, &st, &g, plan) != QK_OK) { printf("  plan: %s\n", qk_last_error()); return false; }
    if (out == DEVICE)
        for (int k = 0; k < plan->n_devices && k < 2; ++k) {
            const size_t b = (size_t)(plan->dev_row0[k + 1] - plan->dev_row0[k]) * (size_t)cols * es;
            cudaSetDevice(plan->devices[k]);
            if (cudaMalloc(&dev[k], std::max<size_t>(b, 1)) != cudaSuccess) return false;
            cudaMemset(dev[k], 0xff, b);   /* NaN */
        }
    cudaSetDevice(0);
    qk_result r = qk_gram_states(ctx, &st, &g);
    if (r != QK_OK) printf("  qk_gram_states on %d GPUs (%s): %s\n", plan->n_devices, out_name[out], qk_last_error());
    if (r == QK_OK && out == HOST)
        for (int64_t i = 0; i < rows * cols; ++i) K[(size_t)i] = f32 ? (double)((const float *)host.data())[i] : ((const double *)host.data())[i];
    if (r == QK_OK && out == DEVICE)
        for (int k = 0; k < plan->n_devices && k < 2; ++k) {
            const int64_t a = plan->dev_row0[k], b = plan->dev_row0[k + 1];
            std::vector<char> h((size_t)((b - a) * cols) * es);
            cudaSetDevice(plan->devices[k]);
            cudaMemcpy(h.data(), dev[k], h.size(), cudaMemcpyDeviceToHost);
            for (int64_t i = a; i < b; ++i)
                for (int64_t j = sym ? i : 0; j < cols; ++j) {
                    const size_t o = (size_t)((i - a) * cols + j);
                    const double v = f32 ? (double)((const float *)h.data())[o] : ((const double *)h.data())[o];
                    K[(size_t)(i * cols + j)] = v;
                    if (sym) K[(size_t)(j * cols + i)] = v;
                }
        }
    for (int k = 0; k < 2; ++k) if (dev[k]) { cudaSetDevice(plan->devices[k]); cudaFree(dev[k]); }
    cudaSetDevice(0);
    if (r == QK_OK && out == NPY && !qk_test_read_k(path, rows, cols, K.data())) return false;
    return r == QK_OK;
}

/* The bytes GPU k copies in under a plan of several GPUs: the rows each of its parts' plans
   implies (expected_rows), a row of row_bytes each, each copy's last row without the padding
   past its used_bytes (as streamed_cases counts them). */
static double mgpu_copyin(const qk_plan &p, int k, double row_bytes, double used_bytes)
{
    double b = 0;
    for (int i = 0; i < p.n_parts; ++i) {
        if (p.parts[i].device != k) continue;
        qk_plan sp;
        int64_t rows[2], copies = 0;
        qk__plan_part_plan(&p, i, nullptr, &sp);
        /* a band from the diagonal (device or callback output): its job's first n_rows rows */
        expected_rows(sp, rows, &copies, p.parts[i].symmetric && p.parts[i].n_cols > p.parts[i].n_rows ? p.parts[i].n_rows : 0);
        b += (double)(rows[0] + rows[1]) * row_bytes - (double)copies * (row_bytes - used_bytes);
    }
    return b;
}

/* Device states on GPU 0 with a context of GPUs 0 and 1 (docs/states.md, "Several GPUs"): K on 2
   GPUs bitwise the same states given from the host on the same 2 GPUs (all resident: the same
   parts and plans; in tiles within 1e-13),
   within 1e-12 of the CPU engine and of one GPU in fp64 (fp32: the bound); host, device
   (out_devices), callback and .npy outputs; K(A,A) and K(A,B); pure states and density
   matrices; all states resident and state tiles (a small budget). GPU 0 copies nothing
   (qk_ctx_device_stats: copyin_bytes 0, it reads the rows in place) and GPU 1 copies exactly the
   rows its parts' plans imply. Device output into one buffer (no out_devices) stays on GPU 0. */
static void mgpu_device_cases(qk_ctx *cpu, int n_dev)
{
    if (n_dev < 2) { printf("device states on several GPUs: %d CUDA device: skipped\n", n_dev); return; }
    qk_ctx *one = gpus_ctx(1, 0), *two = gpus_ctx(2, 0), *tight = gpus_ctx(2, 24e6);
    struct C { qk_state_type t; int64_t dim, na, nb, pad; bool mixed; qk_ctx *ctx; const char *name; } cases[] = {
        {QK_STATE_C128, 2048, 400, 0, 0, false, two, "c128 resident"},
        {QK_STATE_C128, 2048, 400, 150, 0, false, two, "c128 resident"},
        {QK_STATE_F32, 2048, 301, 129, 2, false, two, "f32 padded resident"},
        {QK_STATE_C64, 2048, 700, 0, 0, false, tight, "c64 tiles"},
        {QK_STATE_C128, 1024, 650, 300, 0, false, tight, "c128 tiles"},
        {QK_STATE_C128, 20, 180, 0, 0, true, two, "c128 density matrices"},
        {QK_STATE_F64, 20, 180, 70, 0, true, two, "f64 density matrices"},
    };
    for (const C &c : cases) {
        const int64_t ld = (c.mixed ? c.dim * c.dim : c.dim) + c.pad;
        std::vector<double> ra, rb;
        std::vector<char> a = c.mixed ? rand_dms(c.na, c.dim, ld, c.t, ra) : rand_states(c.na, c.dim, ld, c.t), b;
        if (c.nb) b = c.mixed ? rand_dms(c.nb, c.dim, ld, c.t, rb) : rand_states(c.nb, c.dim, ld, c.t);
        void *da = nullptr, *db = nullptr;
        cudaSetDevice(0);
        if (cudaMalloc(&da, a.size()) != cudaSuccess || (c.nb && cudaMalloc(&db, b.size()) != cudaSuccess)) { CHECK(false, "cudaMalloc"); return; }
        cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
        if (c.nb) cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice);
        qk_states_desc sh, sd;
        memset(&sh, 0, sizeof sh);
        sh.type = c.t; sh.dim = c.dim; sh.a = a.data(); sh.n_a = c.na; sh.lda = ld; sh.a_mixed = c.mixed;
        if (c.nb) { sh.b = b.data(); sh.n_b = c.nb; sh.ldb = ld; sh.b_mixed = c.mixed; }
        sd = sh;
        sd.a = da; sd.b = db; sd.on_device = 1;
        char what[160];
        snprintf(what, sizeof what, "2 GPUs %s dim %lld %s", c.name, (long long)c.dim, c.nb ? "K(A,B)" : "K(A,A)");
        std::vector<double> Kc, K1;
        const bool okc = gram_states(cpu, sh, QK_PRECISION_FP64, HOST, Kc);
        const bool ok1 = gram_states(one, sd, QK_PRECISION_FP64, HOST, K1);
        CHECK(okc && ok1 && max_diff(Kc, K1) <= 1e-12, "%s: one GPU vs cpu %.3g", what, okc && ok1 ? max_diff(Kc, K1) : INFINITY);
        const int es = esize(c.t);
        const double rowb = (double)(ld * es % 8 == 0 ? ld * es : ((c.mixed ? c.dim * c.dim : c.dim) * es + 7) / 8 * 8);
        for (int out = HOST; out <= NPY; ++out) {
            std::vector<double> Kd, Kh;
            qk_plan pd, ph;
            const bool okd = gram_states_mgpu(c.ctx, sd, QK_PRECISION_FP64, (Out)out, Kd, &pd);
            qk_cuda_stats cs[2];
            memset(cs, 0, sizeof cs);
            const int nd = qk_ctx_device_stats(c.ctx, cs, 2);
            const bool okh = gram_states_mgpu(c.ctx, sh, QK_PRECISION_FP64, (Out)out, Kh, &ph);
            CHECK(okd && pd.n_devices == 2 && nd == 2, "%s %s: %s on %d GPUs (%d ran)", what, out_name[out], okd ? "ran" : "failed", pd.n_devices, nd);
            if (!okd) continue;
            /* all resident: the same plans on both GPUs, so bitwise; in tiles GPU 0 may tile
               otherwise (it holds no raw rows), so within 1e-13 as tiles against bulk */
            CHECK(okh && (c.ctx == two ? memcmp(Kd.data(), Kh.data(), Kd.size() * 8) == 0 : max_diff(Kd, Kh) <= 1e-13),
                  "%s %s: device states' K differs from host states' K on 2 GPUs (max %.3g)", what, out_name[out], okh ? max_diff(Kd, Kh) : INFINITY);
            CHECK(max_diff(Kc, Kd) <= 1e-12 && max_diff(K1, Kd) <= 1e-12, "%s %s: vs cpu %.3g, vs one GPU %.3g", what, out_name[out],
                  max_diff(Kc, Kd), max_diff(K1, Kd));
            /* GPU 0 reads the rows in place, GPU 1 copies in those its plans imply */
            const double want1 = mgpu_copyin(pd, 1, rowb, (double)((c.mixed ? c.dim * c.dim : c.dim) * es));
            CHECK(cs[0].copyin_bytes == 0 && want1 > 0 && cs[1].copyin_bytes == want1 && cs[1].n_streams == 3,
                  "%s %s: copied in: GPU 0 %.0f bytes (want 0), GPU 1 %.0f (its plans imply %.0f; %d streams)", what, out_name[out],
                  cs[0].copyin_bytes, cs[1].copyin_bytes, want1, cs[1].n_streams);
            if (c.ctx == tight && out == HOST) {
                int tiles = 0;
                for (int i = 0; i < pd.n_parts; ++i) tiles += pd.parts[i].device == 1 && !pd.parts[i].bulk_states;
                CHECK(tiles > 0, "%s: GPU 1's parts not in state tiles", what);
            }
            printf("ok %-52s %-8s %d parts, GPU 1 copied %.3g MB%s\n", what, out_name[out], pd.n_parts, cs[1].copyin_bytes * 1e-6,
                   pd.dev_full_rows ? " (whole rows)" : "");
        }
        {   /* fp32 within the bound of the vectors' qubits */
            std::vector<double> K32;
            qk_plan p32;
            const bool ok = gram_states_mgpu(c.ctx, sd, QK_PRECISION_FP32, HOST, K32, &p32);
            CHECK(ok && p32.n_devices == 2 && max_diff(Kc, K32) <= p32.error_bound, "%s fp32: %.3g (bound %.3g)", what,
                  ok ? max_diff(Kc, K32) : INFINITY, ok ? p32.error_bound : -1.0);
        }
        if (!c.mixed && !c.nb && c.ctx == two) {   /* device output into one buffer (no out_devices): GPU 0 alone, as before */
            std::vector<double> Ko((size_t)(c.na * c.na));
            void *dk = nullptr;
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.precision = QK_PRECISION_FP64;
            g.out_dtype = QK_F64;
            g.mgpu_min_pairs = 1;   /* would split it */
            g.output = QK_OUTPUT_DEVICE;
            cudaMalloc(&dk, Ko.size() * 8);
            g.out = dk;
            const bool ok = dk && qk_gram_states(two, &sd, &g) == QK_OK;
            if (ok) cudaMemcpy(Ko.data(), dk, Ko.size() * 8, cudaMemcpyDeviceToHost);
            CHECK(ok && qk_ctx_device_seconds(two, nullptr, 0) == 1 && max_diff(Kc, Ko) <= 1e-12, "%s: device output into one buffer: %s on %d GPUs",
                  what, ok ? "ran" : qk_last_error(), qk_ctx_device_seconds(two, nullptr, 0));
            cudaFree(dk);
        }
        cudaSetDevice(0);
        cudaFree(da);
        if (db) cudaFree(db);
    }
    qk_ctx_destroy(tight);
    qk_ctx_destroy(two);
    qk_ctx_destroy(one);
    cudaSetDevice(0);
}

/* K(A,A) of host states larger than the device's free memory: all but about 1.5 GB of the GPU is
   taken first, then 8000 states of 14 qubits (2.1 GB) go through the GPU engine in state tiles,
   as host states and from a provider. Checked against the definition on 4000 random entries and
   the whole diagonal, the mirror bitwise, the provider's K bitwise the host states'. */
static void beyond_memory_case()
{
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    const size_t keep = (size_t)1536 << 20;
    void *blocker = nullptr;
    if (free_b <= keep + ((size_t)256 << 20) || cudaMalloc(&blocker, free_b - keep) != cudaSuccess) {
        CHECK(false, "cannot take all but 1.5 GB of the device (free %.3g GB)", free_b * 1e-9);
        return;
    }
    cudaMemGetInfo(&free_b, &total);
    const int64_t n = 8000, dim = 16384;
    std::vector<char> a = rand_states(n, dim, dim, QK_STATE_C128);
    CHECK(a.size() > free_b, "the states (%.3g GB) exceed the free device memory (%.3g GB)", a.size() * 1e-9, free_b * 1e-9);
    qk_ctx *gpu = qk_test_ctx(QK_DEVICE_CUDA, 0);
    qk_states_desc st;
    memset(&st, 0, sizeof st);
    st.dim = dim; st.a = a.data(); st.n_a = n;
    std::vector<double> K, Kp;
    qk_plan plan;
    bool ok = gram_states(gpu, st, QK_PRECISION_FP64, HOST, K, &plan);
    CHECK(ok && !plan.bulk_states && (double)plan.bytes_total <= (double)free_b, "beyond memory: %s (bulk %d, planned %.3g GB of %.3g free)",
          ok ? "ran" : qk_last_error(), plan.bulk_states, plan.bytes_total * 1e-9, free_b * 1e-9);
    if (ok) {
        const double *s = (const double *)(const void *)a.data();
        double worst = 0;
        bool mirror = true;
        for (int t = 0; t < 4000 + (int)n; ++t) {
            const int64_t i = t < (int)n ? t : (int64_t)(qk_test_urand() * n), j = t < (int)n ? t : (int64_t)(qk_test_urand() * n);
            double re = 0, im = 0;
            for (int64_t k = 0; k < dim; ++k) {
                const double ar = s[2 * (i * dim + k)], ai = s[2 * (i * dim + k) + 1], br = s[2 * (j * dim + k)], bi = s[2 * (j * dim + k) + 1];
                re += ar * br + ai * bi;
                im += ar * bi - ai * br;
            }
            worst = std::max(worst, fabs(K[(size_t)(i * n + j)] - (re * re + im * im)));
            mirror = mirror && memcmp(&K[(size_t)(i * n + j)], &K[(size_t)(j * n + i)], 8) == 0;
        }
        CHECK(worst <= 1e-12 && mirror, "beyond memory: |K - definition| = %.3g on the diagonal and 4000 entries, mirror %d", worst, (int)mirror);
        Prov P;
        P.src[0] = a.data(); P.src[1] = nullptr; P.ld_src = dim; P.dim = dim; P.es = 16;
        qk_states_desc sp;
        memset(&sp, 0, sizeof sp);
        sp.dim = dim; sp.n_a = n; sp.provider = prov_fn; sp.provider_user = &P;
        qk_plan pp;
        bool okp = gram_states(gpu, sp, QK_PRECISION_FP64, HOST, Kp, &pp);
        int64_t want[2];
        expected_rows(pp, want);
        /* bit for bit on the same plan; where the device's free memory changed between the two
           calls (other processes on the GPU) the tiles differ, and so do cuBLAS's shapes: then
           to rounding */
        const bool same_plan = pp.state_tile == plan.state_tile && pp.tile_m == plan.tile_m;
        const bool same_k = okp && (same_plan ? memcmp(K.data(), Kp.data(), K.size() * 8) == 0 : max_diff(K, Kp) <= 1e-15);
        CHECK(same_k && P.rows[0] == want[0], "beyond memory, provider: %s, rows %lld (the plan implies %lld)", okp ? "K differs" : qk_last_error(),
              (long long)P.rows[0], (long long)want[0]);
        if (okp && !same_k) {
            /* where they differ, and which one the definition agrees with */
            int64_t nd = 0, fi = -1;
            double md = 0;
            for (size_t e = 0; e < K.size(); ++e)
                if (memcmp(&K[e], &Kp[e], 8) != 0) { nd++; if (fi < 0) fi = (int64_t)e; md = std::max(md, fabs(K[e] - Kp[e])); }
            const int64_t i = fi / n, j = fi % n;
            double re = 0, im = 0;
            for (int64_t k = 0; k < dim; ++k) {
                const double ar = s[2 * (i * dim + k)], ai = s[2 * (i * dim + k) + 1], br = s[2 * (j * dim + k)], bi = s[2 * (j * dim + k) + 1];
                re += ar * br + ai * bi;
                im += ar * bi - ai * br;
            }
            printf("  %lld entries differ (max %.3g); first K[%lld][%lld]: host %.17g provider %.17g definition %.17g; plans tile %lld/%lld slab %lld/%lld\n",
                   (long long)nd, md, (long long)i, (long long)j, K[(size_t)fi], Kp[(size_t)fi], re * re + im * im, (long long)plan.state_tile,
                   (long long)pp.state_tile, (long long)plan.tile_m, (long long)pp.tile_m);
        }
        printf("beyond memory: %lld states of %.3g GB, %.3g GB free; state tile %lld, %lld rows asked (%.2f per state)\n", (long long)n,
               a.size() * 1e-9, free_b * 1e-9, (long long)plan.state_tile, (long long)P.rows[0], (double)P.rows[0] / (double)n);
    }
    qk_ctx_destroy(gpu);
    cudaFree(blocker);
}

/* The Gram phase of the map path and of device states of the same map (the states built by the
   map path itself first, on the device): medians of 5. */
static void bench(qk_ctx *cpu, qk_ctx *gpu)
{
    const struct { const char *spec; int q; int64_t n; qk_precision p; } cs[] = {
        {"zz(reps=2)", 8, 32768, QK_PRECISION_FP32X3}, {"zz(reps=2)", 12, 16384, QK_PRECISION_FP32X3},
        {"zz(reps=2)", 12, 16384, QK_PRECISION_FP64},  {"zz(reps=2)", 16, 2048, QK_PRECISION_FP32X3},
    };
    for (auto &c : cs) {
        qk_map *m = qk_test_parse(c.spec, c.q);
        const int64_t D = (int64_t)1 << c.q, n = c.n;
        std::vector<double> x((size_t)(n * c.q));
        for (auto &v : x) v = qk_test_uniform(0, 6.28);
        std::vector<double> s((size_t)(2 * n * D));
        if (qk_states(cpu, m, x.data(), n, s.data()) != QK_OK) { printf("states: %s\n", qk_last_error()); exit(2); }
        void *ds = nullptr, *K = nullptr;
        const size_t kb = (size_t)(n * n) * (c.p == QK_PRECISION_FP64 ? 8 : 4);
        if (cudaMalloc(&ds, s.size() * 8) != cudaSuccess || cudaMalloc(&K, kb) != cudaSuccess) { printf("cudaMalloc\n"); exit(2); }
        cudaMemcpy(ds, s.data(), s.size() * 8, cudaMemcpyHostToDevice);
        std::vector<double> tm, ts, wm, ws;
        for (int r = 0; r < 6; ++r) {
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.x = x.data(); g.n_x = n; g.output = QK_OUTPUT_DEVICE; g.out = K; g.precision = c.p;
            double t0 = qk_cuda_wtime();
            if (qk_gram(gpu, m, &g) != QK_OK) { printf("map: %s\n", qk_last_error()); exit(2); }
            double t1 = qk_cuda_wtime();
            qk_cuda_stats a = qk_ctx_cuda_stats(gpu);
            qk_states_desc st;
            memset(&st, 0, sizeof st);
            st.dim = D; st.a = ds; st.n_a = n; st.on_device = 1;
            g.x = nullptr; g.n_x = 0;
            double t2 = qk_cuda_wtime();
            if (qk_gram_states(gpu, &st, &g) != QK_OK) { printf("states: %s\n", qk_last_error()); exit(2); }
            double t3 = qk_cuda_wtime();
            qk_cuda_stats b = qk_ctx_cuda_stats(gpu);
            if (r == 0) continue;   /* warm-up */
            tm.push_back(a.gram_ms); ts.push_back(b.gram_ms); wm.push_back((t1 - t0) * 1e3); ws.push_back((t3 - t2) * 1e3);
        }
        auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
        const double pairs = 0.5 * (double)n * (double)(n + 1);
        printf("bench %s q=%d n=%lld %s: gram phase map %.3f ms, device states %.3f ms (%.3fx); whole call map %.3f ms, "
               "device states %.3f ms; %.1f Gpairs/s from device states\n",
               c.spec, c.q, (long long)n, qk_precision_name(c.p), med(tm), med(ts), med(ts) / med(tm), med(wm), med(ws),
               pairs / (med(ws) * 1e-3) * 1e-9);
        cudaFree(ds);
        cudaFree(K);
        qk_map_free(m);
    }
}

/* Density matrices on the device (docs/benchmarks.md): the Gram phase (gram_ms) of K(A,A) =
   Tr(rho_i rho_j) in each mode, medians of 5 after a warm-up, K on the device, and each mode's
   largest |K - K_fp64| with its stated bound. */
static void bench_mixed(void)
{
    const struct { int64_t dim, n; } cs[] = {{16, 16384}, {64, 8192}, {128, 4096}, {256, 2048}};
    const qk_precision precs[] = {QK_PRECISION_FP64, QK_PRECISION_FP32, QK_PRECISION_FP32X3, QK_PRECISION_TF32, QK_PRECISION_FP16};
    qk_ctx *gpu = qk_test_ctx(QK_DEVICE_CUDA, 0);
    for (auto &c : cs) {
        std::vector<double> ref;
        std::vector<char> a = rand_dms(c.n, c.dim, c.dim * c.dim, QK_STATE_C128, ref);
        ref.clear(); ref.shrink_to_fit();
        void *da = nullptr, *K = nullptr;
        const size_t kb = (size_t)(c.n * c.n) * 8;
        if (cudaMalloc(&da, a.size()) != cudaSuccess || cudaMalloc(&K, kb) != cudaSuccess) { printf("cudaMalloc\n"); exit(2); }
        cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
        std::vector<double> K64((size_t)(c.n * c.n)), Kp((size_t)(c.n * c.n));
        for (qk_precision p : precs) {
            qk_states_desc st;
            memset(&st, 0, sizeof st);
            st.type = QK_STATE_C128; st.dim = c.dim; st.a = da; st.n_a = c.n; st.a_mixed = 1; st.on_device = 1;
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.output = QK_OUTPUT_DEVICE; g.out = K; g.out_dtype = QK_F64; g.precision = p;
            qk_plan plan;
            if (qk_plan_states(gpu, &st, &g, &plan) != QK_OK) { printf("plan: %s\n", qk_last_error()); exit(2); }
            std::vector<double> t;
            for (int r = 0; r < 6; ++r) {
                if (qk_gram_states(gpu, &st, &g) != QK_OK) { printf("states: %s\n", qk_last_error()); exit(2); }
                if (r) t.push_back(qk_ctx_cuda_stats(gpu).gram_ms);
            }
            std::sort(t.begin(), t.end());
            cudaMemcpy(p == QK_PRECISION_FP64 ? K64.data() : Kp.data(), K, kb, cudaMemcpyDeviceToHost);
            double e = 0;
            if (p != QK_PRECISION_FP64)
                for (int64_t i = 0; i < c.n; ++i)
                    for (int64_t j = i; j < c.n; ++j) e = std::max(e, fabs(Kp[(size_t)(i * c.n + j)] - K64[(size_t)(i * c.n + j)]));
            const double pairs = 0.5 * (double)c.n * (double)(c.n + 1), L = 2.0 * (double)(c.dim * c.dim);
            printf("bench-mixed dim=%lld n=%lld %s: gram phase %.3f ms, %.2f Gpairs/s, %.1f TFLOP/s of the real Gram (2 x %.0f a pair); "
                   "max |K - K_fp64| %.3g (bound %.3g); engine %s, config '%s'\n", (long long)c.dim, (long long)c.n, qk_precision_name(p),
                   t[t.size() / 2], pairs / (t[t.size() / 2] * 1e-3) * 1e-9, pairs * 2.0 * L / (t[t.size() / 2] * 1e-3) * 1e-12, L, e,
                   plan.error_bound, qk__engine_name(plan.engine), plan.config);
        }
        cudaFree(da);
        cudaFree(K);
    }
    qk_ctx_destroy(gpu);
}

/* Device states on GPU 0 with a context of one GPU and of two (docs/benchmarks.md): the whole
   call of K(A,A) into device memory (one buffer on one GPU; out_devices, a band per GPU, on two),
   medians of 5 after a warm-up, fp32x3; each K checked against the one-GPU K within the bound. */
static void bench_mgpu(int n_dev)
{
    if (n_dev < 2) { printf("bench-mgpu: %d CUDA device: skipped\n", n_dev); return; }
    const struct { int64_t dim, n; bool mixed; } cs[] = {{256, 32768, false}, {4096, 16384, false}, {65536, 2048, false}, {64, 8192, true}};
    qk_ctx *one = gpus_ctx(1, 0), *two = gpus_ctx(2, 0);
    for (auto &c : cs) {
        std::vector<double> ref;
        const int64_t ld = c.mixed ? c.dim * c.dim : c.dim;
        std::vector<char> a = c.mixed ? rand_dms(c.n, c.dim, ld, QK_STATE_C64, ref) : rand_states(c.n, c.dim, ld, QK_STATE_C64);
        void *da = nullptr;
        cudaSetDevice(0);
        if (cudaMalloc(&da, a.size()) != cudaSuccess) { printf("cudaMalloc\n"); exit(2); }
        cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
        qk_states_desc st;
        memset(&st, 0, sizeof st);
        st.type = QK_STATE_C64; st.dim = c.dim; st.a = da; st.n_a = c.n; st.lda = ld; st.a_mixed = c.mixed; st.on_device = 1;
        double med[2] = {0, 0};
        std::vector<float> K1((size_t)(c.n * c.n));
        double err = 0, bound = 0;
        int parts = 0;
        for (int k = 0; k < 2; ++k) {
            qk_ctx *ctx = k ? two : one;
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.precision = QK_PRECISION_FP32X3; g.out_dtype = QK_F32; g.output = QK_OUTPUT_DEVICE;
            g.mgpu_min_pairs = 1;
            void *dev[2] = {nullptr, nullptr};
            qk_plan plan;
            if (k) g.out_devices = dev;
            if (qk_plan_states(ctx, &st, &g, &plan) != QK_OK) { printf("plan: %s\n", qk_last_error()); exit(2); }
            for (int d = 0; d < plan.n_devices && d < 2; ++d) {
                const int64_t rows = k ? plan.dev_row0[d + 1] - plan.dev_row0[d] : c.n;
                cudaSetDevice(plan.devices[d]);
                if (cudaMalloc(&dev[d], (size_t)(rows * c.n) * 4) != cudaSuccess) { printf("cudaMalloc K\n"); exit(2); }
            }
            cudaSetDevice(0);
            if (!k) g.out = dev[0];
            std::vector<double> t;
            for (int r = 0; r < 6; ++r) {
                const double t0 = qk_cuda_wtime();
                if (qk_gram_states(ctx, &st, &g) != QK_OK) { printf("states: %s\n", qk_last_error()); exit(2); }
                if (r) t.push_back(qk_cuda_wtime() - t0);
            }
            std::sort(t.begin(), t.end());
            med[k] = t[t.size() / 2];
            if (!k) { cudaMemcpy(K1.data(), dev[0], K1.size() * 4, cudaMemcpyDeviceToHost); bound = plan.error_bound; }
            else {
                parts = plan.n_parts;
                for (int d = 0; d < plan.n_devices && d < 2; ++d) {
                    const int64_t r0 = plan.dev_row0[d], r1 = plan.dev_row0[d + 1];
                    std::vector<float> h((size_t)((r1 - r0) * c.n));
                    cudaSetDevice(plan.devices[d]);
                    cudaMemcpy(h.data(), dev[d], h.size() * 4, cudaMemcpyDeviceToHost);
                    for (int64_t i = r0; i < r1; ++i)
                        for (int64_t j = i; j < c.n; ++j)
                            err = std::max(err, (double)fabsf(h[(size_t)((i - r0) * c.n + j)] - K1[(size_t)(i * c.n + j)]));
                }
            }
            for (int d = 0; d < 2; ++d) if (dev[d]) { cudaSetDevice(plan.devices[d]); cudaFree(dev[d]); }
            cudaSetDevice(0);
        }
        printf("bench-mgpu %s dim=%lld n=%lld fp32x3 device output: 1 GPU %.3f ms, 2 GPUs %.3f ms (%d parts): %.2fx; "
               "max |K2 - K1| %.3g (bound %.3g)\n", c.mixed ? "density matrices" : "states", (long long)c.dim, (long long)c.n,
               med[0] * 1e3, med[1] * 1e3, parts, med[0] / med[1], err, bound);
        cudaFree(da);
    }
    qk_ctx_destroy(one);
    qk_ctx_destroy(two);
}

/* Host states beyond device memory (docs/benchmarks.md, 'Host states beyond device memory'):
   all but keep_gb of the GPU taken first, then K(A,A) of n host states of q qubits (complex64)
   in state tiles, as host states and from a provider; the bytes that cross PCIe (the rows the
   plan asks for) over the wall time, against the pinned and pageable H2D rates measured in the
   same run, and against the Gram's own rate on device-resident states (n_dev of them). */
static void bench_stream(int q, int64_t n, double keep_gb, int64_t n_dev)
{
    const int64_t dim = (int64_t)1 << q;
    const size_t rowb = (size_t)dim * 8;
    /* the PCIe rates: 1 GB, pinned and pageable */
    {
        const size_t G = (size_t)1 << 30;
        void *d = nullptr, *h = nullptr;
        std::vector<char> pg(G, 1);
        cudaMalloc(&d, G);
        cudaMallocHost(&h, G);
        memset(h, 1, G);
        double best[2] = {0, 0};
        for (int r = 0; r < 3; ++r)
            for (int k = 0; k < 2; ++k) {
                double t0 = qk_cuda_wtime();
                cudaMemcpy(d, k ? (void *)pg.data() : h, G, cudaMemcpyHostToDevice);
                best[k] = std::max(best[k], G / (qk_cuda_wtime() - t0) * 1e-9);
            }
        printf("bench-stream H2D: pinned %.1f GB/s, pageable %.1f GB/s\n", best[0], best[1]);
        fflush(stdout);
        cudaFree(d);
        cudaFreeHost(h);
    }
    /* the Gram's rate on device-resident states (the compute the tiles must keep up with) */
    std::vector<char> a = rand_states(n, dim, dim, QK_STATE_C64);
    qk_ctx *gpu = qk_test_ctx(QK_DEVICE_CUDA, 0);
    double dev_rate = 0;
    {
        void *ds = nullptr, *K = nullptr;
        cudaMalloc(&ds, (size_t)n_dev * rowb);
        cudaMalloc(&K, (size_t)(n_dev * n_dev) * 4);
        cudaMemcpy(ds, a.data(), (size_t)n_dev * rowb, cudaMemcpyHostToDevice);
        qk_states_desc st;
        memset(&st, 0, sizeof st);
        st.type = QK_STATE_C64; st.dim = dim; st.a = ds; st.n_a = n_dev; st.on_device = 1;
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.output = QK_OUTPUT_DEVICE; g.out = K;
        std::vector<double> t;
        for (int r = 0; r < 4; ++r) {
            double t0 = qk_cuda_wtime();
            if (qk_gram_states(gpu, &st, &g) != QK_OK) { printf("device states: %s\n", qk_last_error()); exit(2); }
            if (r) t.push_back(qk_cuda_wtime() - t0);
        }
        std::sort(t.begin(), t.end());
        dev_rate = 0.5 * (double)n_dev * (double)(n_dev + 1) / t[t.size() / 2];
        printf("bench-stream device states: q=%d n=%lld complex64: %.3f s, %.3f Gpairs/s\n", q, (long long)n_dev, t[t.size() / 2], dev_rate * 1e-9);
        fflush(stdout);
        cudaFree(ds);
        cudaFree(K);
    }
    qk_ctx_destroy(gpu);
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    void *blocker = nullptr;
    const size_t keep = (size_t)(keep_gb * 1073741824.0);
    if (free_b > keep && cudaMalloc(&blocker, free_b - keep) != cudaSuccess) { printf("blocker\n"); exit(2); }
    cudaMemGetInfo(&free_b, &total);
    {   /* what page-locking the states for a call costs */
        int locked = 0;
        double t0 = qk_cuda_wtime();
        qk_cuda_host_lock(a.data(), a.size(), &locked);
        double t1 = qk_cuda_wtime();
        if (locked) qk_cuda_host_unlock(a.data());
        printf("bench-stream page-locking %.2f GB of states: %.3f s (locked %d), unlocking %.3f s\n", a.size() * 1e-9, t1 - t0, locked,
               qk_cuda_wtime() - t1);
    }
    gpu = qk_test_ctx(QK_DEVICE_CUDA, 0);
    std::vector<float> K((size_t)(n * n));
    for (int prov = 0; prov < 2; ++prov) {
        Prov P;
        P.src[0] = a.data(); P.src[1] = nullptr; P.ld_src = dim; P.dim = dim; P.es = 8;
        qk_states_desc st;
        memset(&st, 0, sizeof st);
        st.type = QK_STATE_C64; st.dim = dim; st.n_a = n;
        if (prov) { st.provider = prov_fn; st.provider_user = &P; }
        else st.a = a.data();
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.output = QK_OUTPUT_HOST; g.out = K.data(); g.out_dtype = QK_F32;
        qk_plan plan;
        if (qk_plan_states(gpu, &st, &g, &plan) != QK_OK) { printf("plan: %s\n", qk_last_error()); exit(2); }
        int64_t rows[2];
        expected_rows(plan, rows);
        std::vector<double> t;
        for (int r = 0; r < (prov ? 1 : 3); ++r) {   /* the test's provider copies from pageable memory on one thread */
            qk_plan pr;
            size_t fr = 0, tt = 0;
            cudaMemGetInfo(&fr, &tt);
            qk_plan_states(gpu, &st, &g, &pr);
            printf("bench-stream   before run %d: %.3f GB free; the plan: budget %.3f GB, tile %lld, slab %lld\n", r, fr * 1e-9,
                   pr.bytes_budget * 1e-9, (long long)pr.state_tile, (long long)pr.tile_m);
            double t0 = qk_cuda_wtime();
            if (qk_gram_states(gpu, &st, &g) != QK_OK) { printf("host states: %s\n", qk_last_error()); exit(2); }
            t.push_back(qk_cuda_wtime() - t0);
            qk_cuda_stats cs = qk_ctx_cuda_stats(gpu);
            int64_t rr[2];
            expected_rows(pr, rr);
            printf("bench-stream   run %d: copy-in stream busy %.0f ms for %.1f GB (%.1f GB/s while busy; the plan implies %.1f GB), "
                   "%.1f GB/s over the engine's %.0f ms\n", r, cs.busy_ms[2], cs.copyin_bytes * 1e-9, cs.copyin_bytes / (cs.busy_ms[2] * 1e-3) * 1e-9,
                   (double)rr[0] * (double)rowb * 1e-9, cs.copyin_bytes / (cs.wall_ms * 1e-3) * 1e-9, cs.wall_ms);
            printf("bench-stream   run %d: %.3f s; engine: %d slabs, compute stream busy %.0f ms, copy-out busy %.0f ms, gram %.0f ms, "
                   "output %.0f ms, delivery %.0f ms, events %.0f ms; %d restarts on a smaller plan%s%s\n", r, t.back(), cs.n_slabs, cs.busy_ms[0],
                   cs.busy_ms[1], cs.gram_ms, cs.output_ms, cs.deliver_ms, cs.wall_ms, cs.n_shrinks, cs.n_shrinks ? ": " : "", cs.shrink_why);
            fflush(stdout);
        }
        std::sort(t.begin(), t.end());
        const double sec = t[t.size() / 2], bytes = (double)rows[0] * (double)rowb, pairs = 0.5 * (double)n * (double)(n + 1);
        printf("bench-stream %s: q=%d n=%lld complex64 (%.2f GB of states, %.2f GB device memory free): %s, tile %lld; "
               "%.3f s (min %.3f, max %.3f); %.1f GB crossed PCIe (%.2f rows a state): %.1f GB/s; %.3f Gpairs/s; "
               "the compute alone at the device-states rate: %.3f s\n",
               prov ? "provider" : "host states", q, (long long)n, (double)n * rowb * 1e-9, free_b * 1e-9, plan.config,
               (long long)plan.state_tile, sec, t.front(), t.back(), bytes * 1e-9, (double)rows[0] / (double)n, bytes / sec * 1e-9,
               pairs / sec * 1e-9, pairs / dev_rate);
        fflush(stdout);
    }
    qk_ctx_destroy(gpu);
    cudaFree(blocker);
}

/* Host rows ld = dim + pad apart in an array that ends where its last row's elements do, an
   inaccessible page after it: all resident and in streamed tiles, the GPU's K equals the CPU
   engine's on the same rows (a copy of whole rows would read past the end and fault). */
static void guarded_cases(qk_ctx *cpu)
{
    qk_ctx *big = qk_test_ctx(QK_DEVICE_CUDA, 0), *small = budget_ctx(24e6);
    struct C { qk_state_type t; int64_t dim, pad, na, nb; } cases[] = {
        {QK_STATE_C128, 1000, 24, 700, 0}, {QK_STATE_C128, 1024, 6, 650, 300}, {QK_STATE_F64, 2048, 8, 700, 0}, {QK_STATE_C64, 37, 5, 90, 61},
    };
    for (const C &c : cases) {
        const int es = esize(c.t);
        const int64_t ld = c.dim + c.pad;
        std::vector<char> a = rand_states(c.na, c.dim, ld, c.t), b = c.nb ? rand_states(c.nb, c.dim, ld, c.t) : std::vector<char>();
        const size_t ba = (size_t)((c.na - 1) * ld + c.dim) * (size_t)es, bb = c.nb ? (size_t)((c.nb - 1) * ld + c.dim) * (size_t)es : 0;
        qk_test_guard ha = {nullptr, 0}, hb = {nullptr, 0};
        char *ga = (char *)qk_test_guarded(ba, &ha), *gb = c.nb ? (char *)qk_test_guarded(bb, &hb) : nullptr;
        memcpy(ga, a.data(), ba);
        if (c.nb) memcpy(gb, b.data(), bb);
        qk_states_desc st;
        memset(&st, 0, sizeof st);
        st.type = c.t; st.dim = c.dim; st.a = ga; st.n_a = c.na; st.lda = ld;
        if (c.nb) { st.b = gb; st.n_b = c.nb; st.ldb = ld; }
        std::vector<double> Kc, Kg;
        if (!gram_states(cpu, st, QK_PRECISION_FP64, HOST, Kc)) { CHECK(false, "cpu reference failed"); continue; }
        for (qk_ctx *ctx : {big, small}) {
            qk_plan plan;
            bool ok = gram_states(ctx, st, QK_PRECISION_FP64, HOST, Kg, &plan);
            double e = ok ? max_diff(Kc, Kg) : INFINITY;
            CHECK(e <= 1e-12, "guarded type %d dim %lld ld %lld %s (%s): |gpu - cpu| = %.3g", (int)c.t, (long long)c.dim, (long long)ld,
                  c.nb ? "K(A,B)" : "K(A,A)", plan.bulk_states ? "resident" : "tiles", e);
            if (ctx == small && c.dim >= 1000) CHECK(ok && !plan.bulk_states, "guarded type %d dim %lld: the small budget streams tiles", (int)c.t, (long long)c.dim);
        }
        qk_test_guarded_free(&ha);
        qk_test_guarded_free(&hb);
    }
    qk_ctx_destroy(small);
    qk_ctx_destroy(big);
}

int main(int argc, char **argv)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) { printf("no CUDA device: skipped\n"); return 77; }
    qk_test_seed();
    qk_ctx *cpu = qk_test_ctx(QK_DEVICE_CPU, 0), *gpu = qk_test_ctx(QK_DEVICE_CUDA, 0);
    if (argc > 4 && !strcmp(argv[1], "bench-stream")) {   /* bench-stream q n keep_gb [n_dev] */
        bench_stream(atoi(argv[2]), atoll(argv[3]), atof(argv[4]), argc > 5 ? atoll(argv[5]) : 8192);
        qk_ctx_destroy(gpu);
        qk_ctx_destroy(cpu);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "bench-mgpu")) {
        qk_ctx_destroy(gpu);
        qk_ctx_destroy(cpu);
        bench_mgpu(n_dev);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "bench-mixed")) {
        qk_ctx_destroy(gpu);
        qk_ctx_destroy(cpu);
        bench_mixed();
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        bench(cpu, gpu);
        qk_ctx_destroy(gpu);
        qk_ctx_destroy(cpu);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "mgpu")) {   /* the several-GPU cases alone (compute-sanitizer) */
        mgpu_device_cases(cpu, n_dev);
        qk_ctx_destroy(gpu);
        qk_ctx_destroy(cpu);
        printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
        return qk_test_fails ? 1 : 0;
    }
    const bool only_stream = argc > 1 && !strcmp(argv[1], "stream");   /* the streamed and mixed cases (compute-sanitizer) */
    if (!only_stream) {
        host_cases(cpu, gpu);
        device_cases(cpu, gpu);
        own_states(cpu, gpu);
    }
    mixed_host_cases(cpu, gpu);
    mixed_device_cases(cpu, gpu);
    streamed_cases(cpu);
    guarded_cases(cpu);
    if (!only_stream) mgpu_device_cases(cpu, n_dev);   /* skipped (said so) with one GPU */
    if (!only_stream) beyond_memory_case();
    qk_ctx_destroy(gpu);
    qk_ctx_destroy(cpu);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
