/* qk_gram_projected on the GPU engine (issue 24 item 4, src/cuda/projected.cuh) against the CPU
   engine's qk_gram_projected on the same map and data (the CPU kernel is itself checked against
   explicit partial traces and across its paths: tests/core/test_projected.c). Fresh random data
   every run (seed printed, QK_TEST_SEED to replay).

   - the statevector path: zz (complex), hea real and complex, iqp, a 14-qubit state built in
     several passes; K(X,X) and K(X,Y), several gammas, f64 and f32 outputs with a padded ld_out:
     max |K_gpu - K_cpu| <= 1e-12 (f32: the same floats but for the last bit of rounding, 1e-6),
     and the padding between rows untouched;
   - the MPS path: zz linear at 40 and 165 qubits, zz circular at 40 and 60 (folded qubit order),
     hea real and complex at 50-60 qubits, and the MPS path forced at 10 qubits: the same bound;
   - a product map at 40 qubits (features on the host, the RBF on the device): the same bound;
   - run to run: K the same bits (statevector, MPS, K(X,X) and K(X,Y));
   - errors as on the CPU: gamma 0, negative, NaN, infinite (QK_ERROR_INVALID_ARGUMENT), NaN in X
     or Y (QK_ERROR_NON_FINITE), a device output (QK_ERROR_UNSUPPORTED); K untouched;
   - every device acquisition of a call failing in turn (QK_TEST_FAULTS), statevector and MPS:
     an error, K untouched, no device memory kept after all of them; a later call the same bits.
   With the argument "bench": the 165-qubit zz(reps=2,ent=linear) kernel at n = 200 and the
   784-qubit one at n = 50, K(X,X), GPU and CPU engines, wall time, medians of 3 after a warm-up.
   Exit 77 (meson: skipped) when no CUDA device exists. */
#include <vector>
#include <string>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"

static qk_ctx *g_gpu, *g_cpu;

static std::vector<double> rand_vec(int64_t n, double lo, double hi)
{
    std::vector<double> v((size_t)n);
    for (auto &e : v) e = qk_test_uniform(lo, hi);
    return v;
}

/* K (nx x cols, rows ld apart, NaN first) of the projected kernel on ctx; path QK_PATH_DEFAULT (as qk_gram chooses)
   unless given */
static qk_result proj(qk_ctx *ctx, const qk_map *m, const std::vector<double> &x, int64_t nx, const std::vector<double> *y, int64_t ny,
                      double gamma, qk_dtype dt, int64_t ld, std::vector<double> &K, qk_path path = QK_PATH_DEFAULT)
{
    qk_gram_desc g;
    K.assign((size_t)(nx * ld), 0.0);
    memset(K.data(), 0xff, K.size() * sizeof(double));   /* NaN as doubles and as floats (f32 output: the first half) */
    memset(&g, 0, sizeof g);
    g.x = x.data(); g.n_x = nx;
    if (y) { g.y = y->data(); g.n_y = ny; }
    g.out = K.data(); g.ld_out = ld; g.out_dtype = dt; g.path = path;
    return qk_gram_projected(ctx, m, &g, gamma);
}

static double entry(const std::vector<double> &K, qk_dtype dt, int64_t i, int64_t c, int64_t ld)
{
    return dt == QK_F32 ? (double)((const float *)K.data())[i * ld + c] : K[(size_t)(i * ld + c)];
}

/* GPU against CPU on fresh X (and Y) */
static void check(const char *spec, int d, int64_t nx, int64_t ny, double gamma, qk_dtype dt, qk_path path = QK_PATH_DEFAULT)
{
    qk_map *m = qk_test_parse(spec, d);
    const int64_t cols = ny ? ny : nx, ld = cols + 3;
    std::vector<double> x = rand_vec(nx * m->n_features, -2, 2), y = rand_vec(ny * m->n_features, -2, 2), Kc, Kg;
    CHECK(proj(g_cpu, m, x, nx, ny ? &y : nullptr, ny, gamma, dt, ld, Kc, path) == QK_OK, "%s: CPU: %s", spec, qk_last_error());
    const qk_result r = proj(g_gpu, m, x, nx, ny ? &y : nullptr, ny, gamma, dt, ld, Kg, path);
    CHECK(r == QK_OK, "%s q=%d: GPU: %s", spec, m->n_qubits, qk_last_error());
    if (r == QK_OK) {
        double err = 0, kmin = 1;
        int64_t mid = 0;
        bool pad = true;
        for (int64_t i = 0; i < nx; ++i) {
            for (int64_t c = 0; c < cols; ++c) {
                const double a = entry(Kg, dt, i, c, ld), b = entry(Kc, dt, i, c, ld), e = std::fabs(a - b);
                err = std::isnan(e) ? INFINITY : std::max(err, e);
                kmin = std::min(kmin, b);
                mid += b > 1e-6 && b < 0.999;
            }
            for (int64_t c = cols; c < ld; ++c) pad = pad && std::isnan(entry(Kg, dt, i, c, ld));
        }
        const double tol = dt == QK_F32 ? 1e-6 : 1e-12;
        CHECK(err <= tol, "%s q=%d %s %s gamma %g: max |K_gpu - K_cpu| = %.3g", spec, m->n_qubits, ny ? "K(X,Y)" : "K(X,X)",
              dt == QK_F32 ? "f32" : "f64", gamma, err);
        CHECK(pad, "%s: the padding between rows of K written", spec);
        CHECK(mid > 0, "%s: no entry of K in (1e-6, 0.999) (min %.3g): the comparison is vacuous", spec, kmin);
        printf("  %-34s q=%3d %s %s gamma %.2f%s: max |K_gpu - K_cpu| %.2g (min K %.2g)\n", spec, m->n_qubits, ny ? "K(X,Y)" : "K(X,X)",
               dt == QK_F32 ? "f32" : "f64", gamma, path == QK_PATH_MPS ? " (MPS forced)" : "", err, kmin);
    }
    qk_map_free(m);
}

/* the same call twice on the GPU: the same bits */
static void repeat(const char *spec, int d, int64_t nx, int64_t ny, qk_path path = QK_PATH_DEFAULT)
{
    qk_map *m = qk_test_parse(spec, d);
    const int64_t cols = ny ? ny : nx;
    std::vector<double> x = rand_vec(nx * m->n_features, -2, 2), y = rand_vec(ny * m->n_features, -2, 2), K1, K2;
    CHECK(proj(g_gpu, m, x, nx, ny ? &y : nullptr, ny, 0.3, QK_F64, cols, K1, path) == QK_OK, "%s: %s", spec, qk_last_error());
    CHECK(proj(g_gpu, m, x, nx, ny ? &y : nullptr, ny, 0.3, QK_F64, cols, K2, path) == QK_OK, "%s: %s", spec, qk_last_error());
    CHECK(!memcmp(K1.data(), K2.data(), K1.size() * sizeof(double)), "%s q=%d %s: two runs differ", spec, m->n_qubits,
          ny ? "K(X,Y)" : "K(X,X)");
    printf("  %-34s q=%3d %s: run to run the same bits\n", spec, m->n_qubits, ny ? "K(X,Y)" : "K(X,X)");
    qk_map_free(m);
}

static bool untouched(const std::vector<double> &K)
{
    for (double e : K) {
        uint64_t u;
        memcpy(&u, &e, sizeof u);
        if (u != ~(uint64_t)0) return false;
    }
    return true;
}

static void errors()
{
    qk_map *m = qk_test_parse("zz(reps=2)", 5);
    const int64_t n = 12;
    std::vector<double> x = rand_vec(n * 5, -2, 2), y = rand_vec(7 * 5, -2, 2), K;
    for (double gm : {0.0, -1.0, (double)NAN, (double)INFINITY}) {
        qk_result rc = proj(g_cpu, m, x, n, nullptr, 0, gm, QK_F64, n, K);
        qk_result rg = proj(g_gpu, m, x, n, nullptr, 0, gm, QK_F64, n, K);
        CHECK(rg == QK_ERROR_INVALID_ARGUMENT && rg == rc, "gamma %g: GPU %d, CPU %d", gm, (int)rg, (int)rc);
        CHECK(untouched(K), "gamma %g: K written", gm);
    }
    std::vector<double> xb = x, yb = y;
    xb[13] = NAN;
    yb[6] = NAN;
    qk_result rc = proj(g_cpu, m, xb, n, nullptr, 0, 0.5, QK_F64, n, K), rg = proj(g_gpu, m, xb, n, nullptr, 0, 0.5, QK_F64, n, K);
    CHECK(rg == QK_ERROR_NON_FINITE && rg == rc, "NaN in X: GPU %d, CPU %d (%s)", (int)rg, (int)rc, qk_last_error());
    CHECK(untouched(K), "NaN in X: K written");
    rc = proj(g_cpu, m, x, n, &yb, 7, 0.5, QK_F64, 7, K);
    rg = proj(g_gpu, m, x, n, &yb, 7, 0.5, QK_F64, 7, K);
    CHECK(rg == QK_ERROR_NON_FINITE && rg == rc, "NaN in Y: GPU %d, CPU %d (%s)", (int)rg, (int)rc, qk_last_error());
    CHECK(untouched(K), "NaN in Y: K written");
    {   /* K to a device buffer: host output only, as on the CPU */
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = n; g.out = K.data(); g.output = QK_OUTPUT_DEVICE;
        CHECK(qk_gram_projected(g_gpu, m, &g, 0.5) == QK_ERROR_UNSUPPORTED, "device output accepted");
    }
    printf("  errors: gamma 0 / < 0 / NaN / inf, NaN in X and Y, device output: as on the CPU, K untouched\n");
    qk_map_free(m);
}

/* every device acquisition of a call failing in turn */
static void faults(const char *spec, int d, int64_t nx, int64_t ny)
{
    qk_map *m = qk_test_parse(spec, d);
    const int64_t cols = ny ? ny : nx;
    std::vector<double> x = rand_vec(nx * m->n_features, -2, 2), y = rand_vec(ny * m->n_features, -2, 2), K, Kf, K2;
    CHECK(proj(g_gpu, m, x, nx, ny ? &y : nullptr, ny, 0.4, QK_F64, cols, K) == QK_OK, "faults warm-up: %s", qk_last_error());
    cudaDeviceSynchronize();
    const size_t live0 = qk_cuda_test_live_bytes();   /* the engine's own bytes: other processes on the GPU do not move them */
    const int c0 = qk_cuda_test_alloc_count();
    CHECK(proj(g_gpu, m, x, nx, ny ? &y : nullptr, ny, 0.4, QK_F64, cols, K) == QK_OK, "faults count: %s", qk_last_error());
    const int acq = qk_cuda_test_alloc_count() - c0;
    CHECK(acq >= 2, "%s: only %d device acquisitions counted", spec, acq);
    for (int k = 1; k <= acq; ++k) {
        qk_cuda_test_fail_alloc(k);
        const qk_result r = proj(g_gpu, m, x, nx, ny ? &y : nullptr, ny, 0.4, QK_F64, cols, Kf);
        qk_cuda_test_fail_alloc(0);
        CHECK(r == QK_ERROR_DEVICE_OUT_OF_MEMORY || r == QK_ERROR_OUT_OF_MEMORY, "%s: acquisition %d of %d failing: %d (%s)", spec, k, acq, (int)r,
              qk_last_error());
        CHECK(untouched(Kf), "%s: acquisition %d failing: K written", spec, k);
    }
    cudaDeviceSynchronize();
    const size_t live1 = qk_cuda_test_live_bytes();
    CHECK(live1 == live0, "%s: the engine's device memory before the faulted calls %zu bytes, after %zu", spec, live0, live1);
    CHECK(proj(g_gpu, m, x, nx, ny ? &y : nullptr, ny, 0.4, QK_F64, cols, K2) == QK_OK, "after the faults: %s", qk_last_error());
    CHECK(!memcmp(K.data(), K2.data(), K.size() * sizeof(double)), "%s: after the faults another K", spec);
    printf("  %-34s q=%3d %s: each of %d device acquisitions failing: an error, K untouched, no memory kept\n", spec, m->n_qubits,
           ny ? "K(X,Y)" : "K(X,X)", acq);
    qk_map_free(m);
}

static double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static int bench()
{
    const struct { int q; int64_t n; } cases[] = {{165, 200}, {784, 50}};
    for (const auto &c : cases) {
        qk_map *m = qk_test_parse("zz(reps=2,ent=linear)", c.q);
        std::vector<double> x = rand_vec(c.n * c.q, -2, 2), Kg, Kc;
        std::vector<double> tg, tc;
        for (int rep = 0; rep < 4; ++rep) {
            double t0 = now_s();
            if (proj(g_gpu, m, x, c.n, nullptr, 0, 0.1, QK_F64, c.n, Kg) != QK_OK) { printf("gpu: %s\n", qk_last_error()); return 1; }
            const double a = now_s() - t0;
            t0 = now_s();
            if (proj(g_cpu, m, x, c.n, nullptr, 0, 0.1, QK_F64, c.n, Kc) != QK_OK) { printf("cpu: %s\n", qk_last_error()); return 1; }
            const double b = now_s() - t0;
            if (rep == 0) continue;   /* warm-up */
            tg.push_back(a);
            tc.push_back(b);
        }
        const double err = qk_test_max_diff(Kg.data(), Kc.data(), c.n * c.n);
        printf("bench projected zz(reps=2,ent=linear) q=%d n=%lld K(X,X): GPU %.1f ms, CPU (%d threads) %.1f ms, CPU / GPU %.2fx, "
               "max |K_gpu - K_cpu| %.2g\n", c.q, (long long)c.n, median(tg) * 1e3, qk__ncores(), median(tc) * 1e3, median(tc) / median(tg), err);
        qk_map_free(m);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (qk_cuda_device_count() == 0) { printf("no CUDA device: skipped\n"); return 77; }
    qk_test_seed();
    g_gpu = qk_test_ctx(QK_DEVICE_CUDA, 0);
    g_cpu = qk_test_ctx(QK_DEVICE_CPU, 0);
    if (argc > 1 && !strcmp(argv[1], "bench")) return bench();
    printf("statevector path:\n");
    check("zz(reps=2)", 6, 40, 0, 0.7, QK_F64);
    check("zz(reps=2)", 6, 40, 0, 0.05, QK_F64);
    check("zz(reps=1,ent=linear)", 9, 17, 12, 2.0, QK_F64);
    check("iqp", 5, 30, 21, 1.3, QK_F64);
    check("hea(layers=2)", 7, 25, 0, 0.4, QK_F64);               /* real states */
    check("hea(layers=2)", 7, 25, 19, 0.4, QK_F32);
    check("hea(layers=1,rot=yz,ent=cnot)", 8, 21, 0, 0.5, QK_F64); /* complex */
    check("hea(layers=1,rot=yz,ent=cnot)", 8, 21, 13, 0.5, QK_F32);
    check("zz(reps=2)", 14, 9, 5, 5.0, QK_F64);                   /* fp64 states past one pass (14 qubits; near-mixed qubits: a large gamma) */
    check("zz(reps=2)", 6, 130, 70, 0.7, QK_F64);                 /* K's tiles past one block */
    printf("MPS path:\n");
    check("zz(reps=2,ent=linear)", 10, 23, 0, 0.3, QK_F64, QK_PATH_MPS);
    check("hea(layers=2)", 9, 13, 7, 0.5, QK_F64, QK_PATH_MPS);
    check("zz(reps=2,ent=linear)", 40, 30, 0, 0.1, QK_F64);
    check("zz(reps=2,ent=linear)", 40, 20, 11, 0.1, QK_F32);
    check("zz(reps=2,ent=circular)", 40, 16, 9, 0.1, QK_F64);
    check("zz(reps=1,ent=circular)", 60, 12, 0, 0.1, QK_F64);
    check("hea(layers=2)", 50, 14, 0, 0.1, QK_F64);               /* real */
    check("hea(layers=1,rot=yz,ent=cnot)", 60, 12, 7, 0.1, QK_F64); /* complex */
    check("zz(reps=2,ent=linear)", 165, 12, 0, 0.05, QK_F64);
    check("zz(reps=2,ent=linear)", 165, 10, 6, 0.05, QK_F32);
    printf("product map:\n");
    check("angle(rot=x)", 40, 25, 0, 0.05, QK_F64);
    check("angle(rot=x)", 40, 25, 14, 0.05, QK_F32);
    printf("run to run:\n");
    repeat("hea(layers=1,rot=yz,ent=cnot)", 9, 70, 0);
    repeat("zz(reps=2)", 8, 50, 33);
    repeat("zz(reps=2,ent=linear)", 100, 20, 0);
    repeat("zz(reps=2,ent=circular)", 40, 15, 9);
    printf("errors:\n");
    errors();
    faults("zz(reps=2)", 8, 40, 0);
    faults("hea(layers=2)", 7, 30, 17);
    faults("zz(reps=2,ent=linear)", 60, 20, 0);
    faults("angle(rot=x)", 12, 20, 9);
    qk_ctx_destroy(g_gpu);
    qk_ctx_destroy(g_cpu);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
