/* qk_gram_states on the GPU engine (issue 28), against the CPU engine's qk_gram_states on the same
   states (itself tested bit for bit against the map path and against the definition:
   tests/core/test_states_in.c). Fresh random states every run (seed printed, QK_TEST_SEED to
   replay), outputs poisoned with NaN first, every element checked.

   - host states, complex128 / complex64 / float64 / float32, dims that are and are not powers of
     two, K(A,A) and K(A,B), fp64 (|gpu - cpu| <= 1e-12) and every reduced precision within
     qk_precision_error_bound at the states' qubit count; outputs host, device, callback, .npy;
   - device states (on_device = 1): K equal bit for bit to the same states given from the host,
     and not copied: the engine's resource acquisitions (the QK_TEST_FAULTS counter) are fewer by
     exactly the x (and y) buffers the host states need; normalize on the device; a NaN on the
     device named by row; a host pointer passed as device memory refused;
   - qk's own states (qk_states of zz) given to the GPU: K within 1e-12 of the map's GPU K.
   With the argument "bench": the Gram phase (qk_ctx_cuda_stats().gram_ms) of the map path and of
   device states of the same map (docs/benchmarks.md), medians of 5, then exit.
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
            bool okh = gram_states(gpu, sh, QK_PRECISION_FP64, DEVICE, Kh);
            int c1 = qk_cuda_test_alloc_count();
            bool okd = gram_states(gpu, sd, QK_PRECISION_FP64, DEVICE, Kd);
            int c2 = qk_cuda_test_alloc_count();
            CHECK(okh && okd && Kh.size() == Kd.size() && memcmp(Kh.data(), Kd.data(), Kh.size() * 8) == 0,
                  "type %d %s: device states' K differs from host states' K (max %.3g)", (int)t, sym ? "K(A,A)" : "K(A,B)", max_diff(Kh, Kd));
            /* not copied: the host states' run acquires x (and y) on the device; the device
               states' run acquires the same less those, plus one buffer of norms per side (the
               check) -- equal counts; a copy of the device states would add one per side */
            CHECK(c1 - c0 == c2 - c1, "type %d %s: device acquisitions: host states %d, device states %d (want equal: %d norm "
                  "buffers instead of %d copies)", (int)t, sym ? "K(A,A)" : "K(A,B)", c1 - c0, c2 - c1, sym ? 1 : 2, sym ? 1 : 2);
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

int main(int argc, char **argv)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) { printf("no CUDA device: skipped\n"); return 77; }
    qk_test_seed();
    qk_ctx *cpu = qk_test_ctx(QK_DEVICE_CPU, 0), *gpu = qk_test_ctx(QK_DEVICE_CUDA, 0);
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        bench(cpu, gpu);
        qk_ctx_destroy(gpu);
        qk_ctx_destroy(cpu);
        return 0;
    }
    host_cases(cpu, gpu);
    device_cases(cpu, gpu);
    own_states(cpu, gpu);
    qk_ctx_destroy(gpu);
    qk_ctx_destroy(cpu);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
