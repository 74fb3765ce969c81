/* GPU MPS engine (qk_cuda.cu's qk_cuda_mps_gram, docs/mps.md): K on the GPU against K on the CPU
   engine's MPS path (the oracle, itself tested against the statevector engine and an independent
   numpy MPS: tests/mps/test_mps.c, tests/mps/test_mps_ref.py), fresh random data every run (seed printed,
   QK_TEST_SEED to replay), outputs poisoned with NaN first, every element checked.

   Cases: zz linear / reverse_linear / circular / pairwise / sca with reps 1..3, hea rings (CZ and
   CNOT), a brickwork custom circuit, at q = 2..20 (a subset: 2, 3, 4, 5, 7, 10, 13, 16, 20), 50
   and 200 qubits; K(X,X) and K(X,Y); sample counts that are not multiples of the kernels' tiles
   (8 x 32 pairs per block); the register kernel (bond <= 4) and the warp kernel (bond 8, 16).
   Outputs: host (float64 and float32), device, tile callback, .npy. Truncation (mps_max_bond):
   the GPU gets the same MPS, so K and eps agree with the CPU's truncated run.

   Tolerances (|gpu - cpu| <= tol):
     fp64: 1e-10
     fp32: 2e-6 + 5e-7 q chi (the site tensors rounded to float, then q float contractions of
           4 chi^3 multiply-adds each; K = |<a|b>|^2 <= 1; at q = 200, chi = 4: 4e-4; a wrong index
           or conjugation gives errors of the size of K itself, and the data at q >= 50 are
           clustered so that K is not vanishingly small)
   Exit 77 (meson: skipped) when no CUDA device exists. */
#include <vector>
#include <string>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <unistd.h>
#include <cuda_runtime.h>
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"

static double g_worst64 = 0, g_worst32 = 0;

static std::vector<double> rand_data(int64_t n, int d, bool clustered)
{
    std::vector<double> x((size_t)(n * d)), c((size_t)d);
    for (auto &v : c) v = 6.283 * qk_test_urand();
    for (int64_t i = 0; i < n; ++i)
        for (int k = 0; k < d; ++k) x[(size_t)(i * d + k)] = clustered ? c[(size_t)k] + 0.03 * qk_test_urand() : 6.283 * qk_test_urand();
    return x;
}

struct Tiles {
    std::vector<double> K;
    int64_t cols;
    bool sym;
    bool f32;
};
static int on_tile(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *t, int64_t ld, void *user)
{
    Tiles *T = (Tiles *)user;
    for (int64_t a = 0; a < m; ++a)
        for (int64_t b = 0; b < n; ++b) {
            double v = T->f32 ? (double)((const float *)t)[a * ld + b] : ((const double *)t)[a * ld + b];
            T->K[(size_t)((i0 + a) * T->cols + j0 + b)] = v;
            if (T->sym) T->K[(size_t)((j0 + b) * T->cols + i0 + a)] = v;
        }
    return 0;
}

enum Out { HOST = 0, HOST32, DEVICE, CALLBACK, NPY };
static const char *out_name[] = {"host", "host-f32", "device", "callback", "npy"};

/* K on ctx (path MPS forced), read back as doubles; false when qk_gram fails. */
static bool gram(qk_ctx *ctx, const qk_map *m, const std::vector<double> &x, int64_t nx, const std::vector<double> *y, int64_t ny,
                 qk_precision prec, Out out, int max_bond, std::vector<double> &K, std::vector<double> &eps, qk_plan *plan)
{
    const int64_t cols = y ? ny : nx;
    qk_gram_desc d;
    memset(&d, 0, sizeof d);
    d.x = x.data(); d.n_x = nx;
    if (y) { d.y = y->data(); d.n_y = ny; }
    d.precision = prec;
    d.path = QK_PATH_MPS;
    d.mps_max_bond = max_bond;
    eps.assign((size_t)(nx + (y ? ny : 0)), NAN);
    d.mps_discarded = eps.data();
    K.assign((size_t)(nx * cols), NAN);
    std::vector<float> K32;
    Tiles T;
    void *dK = nullptr;
    char path[256];
    snprintf(path, sizeof path, "/tmp/qk_test_mps_gpu_%d.npy", (int)getpid());
    d.out_dtype = out == HOST32 ? QK_F32 : QK_F64;
    switch (out) {
    case HOST: d.out = K.data(); break;
    case HOST32: K32.assign(K.size(), NAN); d.out = K32.data(); break;
    case DEVICE:
        if (cudaMalloc(&dK, K.size() * sizeof(double)) != cudaSuccess) return false;
        cudaMemset(dK, 0xff, K.size() * sizeof(double));   /* NaN */
        d.out = dK; d.output = QK_OUTPUT_DEVICE; break;
    case CALLBACK:
        T.K.assign(K.size(), NAN); T.cols = cols; T.sym = y == nullptr; T.f32 = false;
        d.output = QK_OUTPUT_CALLBACK; d.tile_fn = on_tile; d.tile_user = &T; break;
    case NPY: d.output = QK_OUTPUT_NPY; d.out_path = path; d.no_sync = 1; break;
    }
    if (plan && qk_plan_make(ctx, m, &d, plan) != QK_OK) { cudaFree(dK); return false; }
    qk_result r = qk_gram(ctx, m, &d);
    if (r != QK_OK) { printf("  qk_gram (%s): %s\n", out_name[out], qk_last_error()); cudaFree(dK); return false; }
    if (out == HOST32) for (size_t k = 0; k < K.size(); ++k) K[k] = K32[k];
    if (out == DEVICE) { cudaMemcpy(K.data(), dK, K.size() * sizeof(double), cudaMemcpyDeviceToHost); cudaFree(dK); }
    if (out == CALLBACK) K = T.K;
    if (out == NPY && !qk_test_read_k(path, nx, cols, K.data())) return false;
    return true;
}

/* the largest |a - b| (infinity where either holds a NaN) */
static double diff(const std::vector<double> &a, const std::vector<double> &b) { return qk_test_max_diff(a.data(), b.data(), (int64_t)a.size()); }

/* One map at q qubits: the GPU (fp64, fp32) against the CPU, K(X,X) and K(X,Y). */
static void mps_case(qk_ctx *gpu, qk_ctx *cpu, const char *spec, int q, int64_t nx, int64_t ny, bool all_outputs, int max_bond = 0)
{
    qk_map *m = nullptr;
    if (qk_map_parse(spec, q, &m) != QK_OK) { CHECK(false, "parse %s (%d): %s", spec, q, qk_last_error()); return; }
    const bool cl = q >= 30;
    std::vector<double> x = rand_data(nx, m->n_features, cl), y = rand_data(ny, m->n_features, cl);
    std::vector<double> Kc, Kcxy, ec, ecxy, K, e;
    qk_plan plan;
    CHECK(gram(cpu, m, x, nx, nullptr, 0, QK_PRECISION_FP64, HOST, max_bond, Kc, ec, nullptr), "%s q=%d cpu: %s", spec, q, qk_last_error());
    CHECK(gram(cpu, m, x, nx, &y, ny, QK_PRECISION_FP64, HOST, max_bond, Kcxy, ecxy, nullptr), "%s q=%d cpu xy: %s", spec, q, qk_last_error());
    bool ok = gram(gpu, m, x, nx, nullptr, 0, QK_PRECISION_FP64, HOST, max_bond, K, e, &plan);
    CHECK(ok && plan.backend == QK_BACKEND_CUDA && plan.path == QK_PATH_MPS, "%s q=%d: plan backend %d path %d: %s", spec, q, (int)plan.backend,
          (int)plan.path, qk_last_error());
    const int chi = plan.mps_bond <= 2 ? 2 : plan.mps_bond <= 4 ? 4 : plan.mps_bond;
    const double tol32 = 2e-6 + 5e-7 * q * chi;
    if (ok) {
        double d64 = diff(K, Kc);
        g_worst64 = std::max(g_worst64, d64);
        CHECK(d64 <= 1e-10, "%s q=%d n=%lld fp64 K(X,X): max |gpu - cpu| %.3e", spec, q, (long long)nx, d64);
        CHECK(diff(e, ec) <= 1e-12, "%s q=%d: eps differ gpu/cpu", spec, q);
    }
    ok = gram(gpu, m, x, nx, &y, ny, QK_PRECISION_FP64, HOST, max_bond, K, e, nullptr);
    CHECK(ok && diff(K, Kcxy) <= 1e-10, "%s q=%d fp64 K(X,Y): max |gpu - cpu| %.3e", spec, q, ok ? diff(K, Kcxy) : -1.0);
    ok = gram(gpu, m, x, nx, nullptr, 0, QK_PRECISION_FP32, HOST, max_bond, K, e, nullptr);
    if (ok) g_worst32 = std::max(g_worst32, diff(K, Kc));
    CHECK(ok && diff(K, Kc) <= tol32, "%s q=%d fp32 K(X,X): max |gpu - cpu| %.3e > %.3e", spec, q, ok ? diff(K, Kc) : -1.0, tol32);
    ok = gram(gpu, m, x, nx, &y, ny, QK_PRECISION_FP32, HOST, max_bond, K, e, nullptr);
    CHECK(ok && diff(K, Kcxy) <= tol32, "%s q=%d fp32 K(X,Y): max |gpu - cpu| %.3e > %.3e", spec, q, ok ? diff(K, Kcxy) : -1.0, tol32);
    if (all_outputs)
        for (int o = HOST32; o <= NPY; ++o) {
            ok = gram(gpu, m, x, nx, nullptr, 0, QK_PRECISION_FP64, (Out)o, max_bond, K, e, nullptr);
            const double t = o == HOST32 ? 1e-6 : 1e-10;
            CHECK(ok && diff(K, Kc) <= t, "%s q=%d output %s K(X,X): %.3e", spec, q, out_name[o], ok ? diff(K, Kc) : -1.0);
            ok = gram(gpu, m, x, nx, &y, ny, QK_PRECISION_FP64, (Out)o, max_bond, K, e, nullptr);
            CHECK(ok && diff(K, Kcxy) <= t, "%s q=%d output %s K(X,Y): %.3e", spec, q, out_name[o], ok ? diff(K, Kcxy) : -1.0);
        }
    printf("  %-44s q=%3d n=%4lld bond %2d%s: ok\n", spec, q, (long long)nx, plan.mps_bond, max_bond ? " (truncated)" : "");
    qk_map_free(m);
}

static std::string brickwork(int q, int layers)
{
    std::string s = "circuit(qubits=" + std::to_string(q) + ":";
    char b[96];
    for (int l = 0; l < layers; ++l) {
        for (int k = 0; k < q; ++k) { snprintf(b, sizeof b, " ry(%d, x%d) rz(%d, 0.5*x%d+0.1)", k, k, k, (k + 1) % q); s += b; }
        for (int k = l % 2; k + 1 < q; k += 2) {
            if (k % 4 < 2) snprintf(b, sizeof b, " cx(%d,%d)", k, k + 1);
            else snprintf(b, sizeof b, " rzz(%d,%d, x%d*x%d)", k, k + 1, k, k + 1);
            s += b;
        }
        for (int k = 0; k < q; ++k) if (k % 3 == 0) { snprintf(b, sizeof b, " h(%d) cz(%d,%d)", k, k, (k + 1) % q); s += b; }
    }
    return s + ")";
}

int main(void)
{
    if (qk_cuda_device_count() <= 0) { printf("no CUDA device: skipped\n"); return 77; }
    qk_test_seed();
    qk_ctx *gpu = qk_test_ctx(QK_DEVICE_CUDA, 0), *cpu = qk_test_ctx(QK_DEVICE_CPU, 0);
    static const char *ents[] = {"linear", "reverse_linear", "circular", "pairwise", "sca"};
    const int qs[] = {2, 3, 4, 5, 7, 10, 13, 16, 20};
    char spec[128];
    for (int q : qs)
        for (int e = 0; e < 5; ++e)
            for (int reps = 1; reps <= 3; ++reps) {
                const bool ring = e == 2 || e == 4;
                if (q >= 13 && ring && reps == 3) continue;   /* bond 64: the CPU oracle's cost */
                snprintf(spec, sizeof spec, "zz(reps=%d,ent=%s)", reps, ents[e]);
                mps_case(gpu, cpu, spec, q, q <= 10 ? 45 : 21, 13, q == 7 || (q == 13 && reps == 2));
            }
    for (int q : qs) {
        if (q < 2) continue;
        for (int l = 1; l <= 2; ++l) {
            snprintf(spec, sizeof spec, "hea(layers=%d,rot=yz,ent=cnot)", l);
            mps_case(gpu, cpu, spec, q, 37, 11, false);
            snprintf(spec, sizeof spec, "hea(layers=%d,rot=y,ent=cz)", l);
            mps_case(gpu, cpu, spec, q, 37, 11, false);
        }
    }
    for (int q : {4, 9, 16}) mps_case(gpu, cpu, brickwork(q, q == 4 ? 3 : 2).c_str(), q, 29, 9, q == 9);
    /* 50 and 200 qubits: bond 4 (register kernel) and 8 / 16 (warp kernel) */
    mps_case(gpu, cpu, "zz(reps=2,ent=linear)", 50, 70, 33, true);
    mps_case(gpu, cpu, "zz(reps=3,ent=linear)", 50, 20, 7, false);
    mps_case(gpu, cpu, "zz(reps=1,ent=circular)", 50, 40, 9, false);
    mps_case(gpu, cpu, "hea(layers=2)", 50, 12, 5, false);
    mps_case(gpu, cpu, "zz(reps=2,ent=linear)", 200, 41, 17, true);
    mps_case(gpu, cpu, "zz(reps=1,ent=pairwise)", 200, 33, 8, false);
    mps_case(gpu, cpu, brickwork(200, 2).c_str(), 200, 10, 3, false);
    /* truncation: the same truncated MPS on both engines */
    mps_case(gpu, cpu, "zz(reps=2,ent=circular)", 12, 25, 9, false, 4);
    mps_case(gpu, cpu, "zz(reps=3,ent=linear)", 50, 17, 5, false, 2);
    /* the planner on a CUDA context: MPS on the GPU beyond 30 qubits without being asked */
    {
        qk_map *m = nullptr;
        qk_map_parse("zz(reps=2,ent=linear)", 64, &m);
        std::vector<double> x = rand_data(5, 64, true), K(25);
        qk_gram_desc d;
        qk_plan p;
        memset(&d, 0, sizeof d);
        d.x = x.data(); d.n_x = 5; d.out = K.data(); d.out_dtype = QK_F64;
        CHECK(qk_plan_make(gpu, m, &d, &p) == QK_OK && p.backend == QK_BACKEND_CUDA && p.path == QK_PATH_MPS, "auto plan at 64 qubits: %d %d",
              (int)p.backend, (int)p.path);
        qk_map_free(m);
    }
    printf("largest |gpu - cpu|: fp64 %.3e, fp32 %.3e\n", g_worst64, g_worst32);
    qk_ctx_destroy(gpu);
    qk_ctx_destroy(cpu);
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
