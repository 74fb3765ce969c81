/* K from given MPS on the GPU engine (qk_gram_mps_states on a CUDA context: the tensors packed on
   the host, contracted by qk_cuda_mps_gram) against the CPU engine's K of the same tensors (itself
   tested bit for bit against the map path and against dense statevectors: tests/mps/
   test_mps_states.c). Fresh random data every run (seed printed, QK_TEST_SEED to replay).

   Cases: qk's own MPS of zz / hea maps (unpacked from the engine's builder) at 10, 50 and 200
   qubits; random MPS of per-sample bonds up to 4 (the register kernel) and up to 6 and 12 (the
   warp kernel); K(A,A) and K(A,B); outputs host (f64, f32), device, .npy; fp64 within 1e-10, fp32
   within the plan's error bound (2e-6 + 5e-7 q chi). The plan: CUDA backend, MPS path, given.
   Exit 77 (meson: skipped) when no CUDA device exists. */
#include <vector>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <cuda_runtime.h>
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"

struct Mps {
    int q = 0;
    int64_t n = 0;
    std::vector<std::vector<double>> t;   /* n * q sites, LPR, interleaved complex */
    std::vector<const void *> ptr;
    std::vector<int> bond;                /* n * (q + 1) */
    void finish()
    {
        ptr.resize(t.size());
        for (size_t k = 0; k < t.size(); ++k) ptr[k] = t[k].data();
    }
};

static Mps of_map(const qk_map *m, const std::vector<double> &x, int64_t n)
{
    qk__mps_prog p;
    Mps r;
    if (qk__mps_prog_make(m, &p) != QK_OK) { printf("prog: %s\n", qk_last_error()); exit(2); }
    double *lanes = qk__mps_states(&p, m, x.data(), n, 4, nullptr, nullptr, nullptr);
    if (!lanes) { printf("mps states: %s\n", qk_last_error()); exit(2); }
    r.q = p.q; r.n = n;
    r.bond.resize((size_t)(n * (p.q + 1)));
    r.t.resize((size_t)(n * p.q));
    for (int64_t i = 0; i < n; ++i) {
        for (int s = 0; s <= p.q; ++s) r.bond[(size_t)(i * (p.q + 1) + s)] = p.D[s];
        const double *g = lanes + (i / QK__NJ) * p.group;
        const int lane = (int)(i % QK__NJ);
        for (int s = 0; s < p.q; ++s) {
            const int64_t e_n = (int64_t)p.D[s] * 2 * p.D[s + 1];
            std::vector<double> &o = r.t[(size_t)(i * p.q + s)];
            o.resize((size_t)(2 * e_n));
            for (int64_t e = 0; e < e_n; ++e) {
                o[(size_t)(2 * e)] = g[p.off[s] + lane + e * 2 * QK__NJ];
                o[(size_t)(2 * e + 1)] = g[p.off[s] + lane + e * 2 * QK__NJ + QK__NJ];
            }
        }
    }
    free(lanes);
    qk__mps_prog_free(&p);
    r.finish();
    return r;
}

static Mps random_mps(int q, int64_t n, int maxb)
{
    Mps r;
    r.q = q; r.n = n;
    r.bond.resize((size_t)(n * (q + 1)));
    for (int64_t i = 0; i < n; ++i)
        for (int s = 0; s <= q; ++s) {
            int cap = maxb, sm = s < q - s ? s : q - s;
            if (sm < 20 && (1 << sm) < cap) cap = 1 << sm;
            int b = 1 + (int)(qk_test_urand() * cap);
            r.bond[(size_t)(i * (q + 1) + s)] = b > cap ? cap : b;
        }
    r.t.resize((size_t)(n * q));
    for (int64_t i = 0; i < n; ++i)
        for (int s = 0; s < q; ++s) {
            const int *b = &r.bond[(size_t)(i * (q + 1))];
            std::vector<double> &o = r.t[(size_t)(i * q + s)];
            o.resize((size_t)(2 * b[s] * 2 * b[s + 1]));
            /* near a product state (entry (0, 0, 0) large) so that K is not vanishingly small at
               many sites */
            for (size_t k = 0; k < o.size(); ++k) o[k] = 0.2 / (b[s] * b[s + 1]) * qk_test_uniform(-1, 1);
            o[0] += 1.0;
        }
    r.finish();
    return r;
}

enum Out { HOST = 0, HOST32, DEVICE, NPY };

static bool gram(qk_ctx *ctx, const Mps &a, const Mps *b, qk_precision prec, Out out, std::vector<double> &K, qk_plan *plan)
{
    qk_mps_states_desc d;
    memset(&d, 0, sizeof d);
    d.n_sites = a.q;
    d.a = a.ptr.data(); d.a_bonds = a.bond.data(); d.n_a = a.n;
    if (b) { d.b = b->ptr.data(); d.b_bonds = b->bond.data(); d.n_b = b->n; }
    d.normalize = 1;
    const int64_t cols = b ? b->n : a.n;
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.precision = prec;
    K.assign((size_t)(a.n * cols), NAN);
    std::vector<float> K32;
    void *dK = nullptr;
    char path[256];
    snprintf(path, sizeof path, "/tmp/qk_test_mps_states_gpu_%d.npy", (int)getpid());
    g.out_dtype = out == HOST32 ? QK_F32 : QK_F64;
    switch (out) {
    case HOST: g.out = K.data(); break;
    case HOST32: K32.assign(K.size(), NAN); g.out = K32.data(); break;
    case DEVICE:
        if (cudaMalloc(&dK, K.size() * sizeof(double)) != cudaSuccess) return false;
        cudaMemset(dK, 0xff, K.size() * sizeof(double));
        g.out = dK; g.output = QK_OUTPUT_DEVICE; break;
    case NPY: g.output = QK_OUTPUT_NPY; g.out_path = path; break;
    }
    if (plan && qk_plan_mps_states(ctx, &d, &g, plan) != QK_OK) { cudaFree(dK); return false; }
    qk_result r = qk_gram_mps_states(ctx, &d, &g);
    if (r != QK_OK) { printf("  qk_gram_mps_states: %s\n", qk_last_error()); cudaFree(dK); return false; }
    if (out == HOST32) for (size_t k = 0; k < K.size(); ++k) K[k] = K32[k];
    if (out == DEVICE) { cudaMemcpy(K.data(), dK, K.size() * sizeof(double), cudaMemcpyDeviceToHost); cudaFree(dK); }
    if (out == NPY && !qk_test_read_k(path, a.n, cols, K.data())) return false;
    return true;
}

/* the largest |a - b| (infinity where either holds a NaN) */
static double diff(const std::vector<double> &a, const std::vector<double> &b) { return qk_test_max_diff(a.data(), b.data(), (int64_t)a.size()); }

static void check(qk_ctx *gpu, qk_ctx *cpu, const char *what, const Mps &a, const Mps &b, bool all_outputs)
{
    std::vector<double> Kc, Kcab, K;
    qk_plan plan;
    CHECK(gram(cpu, a, nullptr, QK_PRECISION_FP64, HOST, Kc, nullptr), "%s cpu: %s", what, qk_last_error());
    CHECK(gram(cpu, a, &b, QK_PRECISION_FP64, HOST, Kcab, nullptr), "%s cpu ab: %s", what, qk_last_error());
    bool ok = gram(gpu, a, nullptr, QK_PRECISION_FP64, HOST, K, &plan);
    CHECK(ok && plan.backend == QK_BACKEND_CUDA && plan.path == QK_PATH_MPS && plan.mps_given == 1, "%s: plan backend %d path %d given %d",
          what, (int)plan.backend, (int)plan.path, plan.mps_given);
    CHECK(ok && diff(K, Kc) <= 1e-10, "%s fp64 K(A,A): %.3e", what, ok ? diff(K, Kc) : -1.0);
    ok = gram(gpu, a, &b, QK_PRECISION_FP64, HOST, K, nullptr);
    CHECK(ok && diff(K, Kcab) <= 1e-10, "%s fp64 K(A,B): %.3e", what, ok ? diff(K, Kcab) : -1.0);
    const int chi = plan.mps_bond <= 2 ? 2 : plan.mps_bond <= 4 ? 4 : plan.mps_bond;
    const double tol32 = 2e-6 + 5e-7 * a.q * chi;
    ok = gram(gpu, a, nullptr, QK_PRECISION_FP32, HOST, K, nullptr);
    CHECK(ok && diff(K, Kc) <= tol32, "%s fp32 K(A,A): %.3e > %.3e", what, ok ? diff(K, Kc) : -1.0, tol32);
    ok = gram(gpu, a, &b, QK_PRECISION_FP32, HOST, K, nullptr);
    CHECK(ok && diff(K, Kcab) <= tol32, "%s fp32 K(A,B): %.3e > %.3e", what, ok ? diff(K, Kcab) : -1.0, tol32);
    if (all_outputs)
        for (int o = HOST32; o <= NPY; ++o) {
            ok = gram(gpu, a, nullptr, QK_PRECISION_FP64, (Out)o, K, nullptr);
            CHECK(ok && diff(K, Kc) <= (o == HOST32 ? 1e-6 : 1e-10), "%s output %d K(A,A): %.3e", what, o, ok ? diff(K, Kc) : -1.0);
            ok = gram(gpu, a, &b, QK_PRECISION_FP64, (Out)o, K, nullptr);
            CHECK(ok && diff(K, Kcab) <= (o == HOST32 ? 1e-6 : 1e-10), "%s output %d K(A,B): %.3e", what, o, ok ? diff(K, Kcab) : -1.0);
        }
    double kmax = 0;
    for (size_t k = 0; k < Kcab.size(); ++k) kmax = std::max(kmax, Kcab[k]);
    printf("  %-40s q=%3d n=%lld+%lld bond %2d, max K(A,B) %.2g: %s\n", what, a.q, (long long)a.n, (long long)b.n, plan.mps_bond, kmax,
           qk_test_fails ? "FAIL so far" : "ok");
}

int main(void)
{
    if (qk_cuda_device_count() <= 0) { printf("no CUDA device: skipped\n"); return 77; }
    qk_test_seed();
    qk_ctx_desc cd;
    qk_ctx *gpu = nullptr, *cpu = nullptr;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CUDA;
    cd.autotune = -1;
    if (qk_ctx_create(&cd, &gpu) != QK_OK) { printf("ctx: %s\n", qk_last_error()); return 2; }
    cd.device = QK_DEVICE_CPU;
    if (qk_ctx_create(&cd, &cpu) != QK_OK) { printf("ctx: %s\n", qk_last_error()); return 2; }
    struct { const char *spec; int q; int64_t na, nb; } maps[] = {
        {"zz(reps=2,ent=linear)", 10, 45, 13}, {"hea(layers=1)", 10, 37, 11},
        {"zz(reps=2,ent=linear)", 50, 70, 33}, {"zz(reps=2,ent=circular)", 12, 25, 9}, {"zz(reps=2,ent=linear)", 200, 41, 17}};
    for (auto &c : maps) {
        qk_map *m = nullptr;
        if (qk_map_parse(c.spec, c.q, &m) != QK_OK) { CHECK(false, "parse %s", c.spec); continue; }
        std::vector<double> x((size_t)(c.na * m->n_features)), y((size_t)(c.nb * m->n_features));
        const double spread = c.q >= 50 ? 0.03 : 6.283;   /* clustered at many qubits: K not tiny */
        for (auto &v : x) v = 1.0 + spread * qk_test_urand();
        for (auto &v : y) v = 1.0 + spread * qk_test_urand();
        Mps a = of_map(m, x, c.na), b = of_map(m, y, c.nb);
        check(gpu, cpu, c.spec, a, b, c.q == 50);
        qk_map_free(m);
    }
    {
        Mps a = random_mps(9, 40, 4), b = random_mps(9, 9, 4);
        check(gpu, cpu, "random, bonds <= 4 (register kernel)", a, b, true);
    }
    {
        Mps a = random_mps(30, 21, 6), b = random_mps(30, 5, 6);
        check(gpu, cpu, "random, bonds <= 6 (warp kernel)", a, b, false);
    }
    {
        Mps a = random_mps(120, 17, 12), b = random_mps(120, 6, 12);
        check(gpu, cpu, "random, bonds <= 12 (warp kernel)", a, b, false);
    }
    qk_ctx_destroy(gpu);
    qk_ctx_destroy(cpu);
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
