/* qk_gram_vjp on the GPU engine (issue 24, src/cuda/vjp.cuh) against the CPU engine's qk_gram_vjp
   on the same map, weights, X, Y and G (the CPU VJP is itself checked against finite differences
   and the parameter-shift rule: tests/core/test_vjp.c). Fresh random maps, weights, data and G
   every run (seed printed, QK_TEST_SEED to replay).

   - every gate kind that can carry a weight (RX, RY, RZ, P, RZZ; w and w * x angles; a weight in
     two gates), random circuits of every op kind (BASIS and an AMPLITUDE start included), hea
     real and complex, a product map; K(X,X) and K(X,Y); sizes whose sweeps run in shared memory
     and sizes past it (13-qubit complex, 14-qubit real states: in place in global memory);
     fp64: max |grad_gpu - grad_cpu| <= 1e-10 max |grad_cpu|, max |K_gpu - K_cpu| <= 1e-12
     (the VJP has no fp32 mode: qk_vjp_desc has no precision, as on the CPU);
   - run to run: the gradient and K bit for bit the same (K(X,X) and K(X,Y), real and complex);
   - G pageable (through the context's page-locked staging, in chunks) and page-locked (straight),
     with a padded ld_g, k_out pageable and page-locked: the same bits; a non-finite G entry named
     (the first in row order, in the first chunk and in the last), grad_w and k_out untouched;
   - a cancel from the progress callback leaves grad_w and k_out untouched;
   - every device acquisition of a call failing in turn (QK_TEST_FAULTS): an error, the outputs
     untouched, and no device memory kept after all of them; a later call succeeds.
   With the argument "bench": qk_gram (fp64 and the engine's default precision) and qk_gram_vjp of
   hea(layers=2) at 8 and 12 qubits, n = 4096, K(X,X), wall time, medians of 5 after a warm-up,
   and the ratio VJP / Gram (the target: <= 4), then exit.
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

static qk_map *custom(int q, int d, const std::vector<qk_op> &ops, int nw) { return qk_test_custom(q, d, ops.data(), (int)ops.size(), nw); }

static void rand_weights(qk_map *m)
{
    std::vector<double> w((size_t)std::max(1, m->n_weights));
    for (auto &v : w) v = qk_test_uniform(-2.0, 2.0);
    if (m->n_weights > 0 && qk_map_set_weights(m, w.data(), m->n_weights) != QK_OK) { printf("weights: %s\n", qk_last_error()); exit(2); }
}

/* A random circuit of q qubits and d features over every op kind: weighted angles (w, w * x)
   and data angles; feature d - 1 is 0 / 1 (the BASIS ops' bit). */
static qk_map *random_map(int q, int d, int n_ops, int nw, bool basis)
{
    static const qk_op_kind kinds[] = {QK_OP_H, QK_OP_X, QK_OP_Y, QK_OP_Z, QK_OP_RX, QK_OP_RY, QK_OP_RZ, QK_OP_P, QK_OP_CNOT, QK_OP_CZ, QK_OP_RZZ};
    std::vector<qk_op> ops;
    for (int b = 0; b < q; ++b) ops.push_back(qk_test_op(QK_OP_H, b, 0, QK_ARG_CONST, 0, 0, 0, 1, 0));
    if (basis) ops.push_back(qk_test_op(QK_OP_BASIS, (int)(qk_test_rand64() % q), 0, QK_ARG_CONST, d - 1, 0, 0, 1, 0));
    for (int k = 0; k < n_ops; ++k) {
        const qk_op_kind kd = kinds[qk_test_rand64() % (sizeof kinds / sizeof kinds[0])];
        const int q0 = (int)(qk_test_rand64() % q);
        int q1 = (int)(qk_test_rand64() % (q - 1));
        if (q1 >= q0) ++q1;
        const int a = (int)(qk_test_rand64() % 4);
        const qk_arg_kind ak = !qk__op_has_angle(kd) ? QK_ARG_CONST : a == 0 ? QK_ARG_X : a == 1 ? QK_ARG_WX : QK_ARG_W;
        ops.push_back(qk_test_op(kd, q0, q1, ak, (int)(qk_test_rand64() % (d - 1)), 0, (int)(qk_test_rand64() % nw), qk_test_uniform(0.3, 1.7),
                         qk_test_uniform(-0.5, 0.5)));
    }
    qk_map *m = custom(q, d, ops, nw);
    rand_weights(m);
    return m;
}

static std::vector<double> rand_vec(int64_t n, double lo, double hi)
{
    std::vector<double> v((size_t)n);
    for (auto &e : v) e = qk_test_uniform(lo, hi);
    return v;
}

static std::vector<double> rand_data(const qk_map *m, int64_t n, bool basis_col)
{
    std::vector<double> x = rand_vec(n * m->n_features, -1.3, 1.3);
    if (basis_col)
        for (int64_t i = 0; i < n; ++i) x[(size_t)(i * m->n_features + m->n_features - 1)] = (double)(qk_test_rand64() & 1);
    return x;
}

static qk_result vjp(qk_ctx *ctx, const qk_map *m, const std::vector<double> &x, int64_t nx, const std::vector<double> *y, int64_t ny,
                     const std::vector<double> &G, std::vector<double> &g, std::vector<double> &K)
{
    qk_vjp_desc v;
    const int64_t cols = y ? ny : nx;
    g.assign((size_t)std::max(1, m->n_weights), NAN);
    K.assign((size_t)(nx * cols), NAN);
    memset(&v, 0, sizeof v);
    v.x = x.data(); v.n_x = nx;
    if (y) { v.y = y->data(); v.n_y = ny; }
    v.g = G.data(); v.grad_w = g.data(); v.k_out = K.data();
    return qk_gram_vjp(ctx, m, &v);
}

static double max_abs(const std::vector<double> &a, size_t n)
{
    double r = 0;
    for (size_t i = 0; i < n; ++i) r = std::max(r, std::fabs(a[i]));
    return r;
}

/* GPU against CPU on fresh X (and Y) and G */
static void check(const char *name, const qk_map *m, int64_t nx, int64_t ny, bool basis_col = false)
{
    const int64_t cols = ny ? ny : nx;
    std::vector<double> x = rand_data(m, nx, basis_col), y = ny ? rand_data(m, ny, basis_col) : std::vector<double>();
    if (m->n_ops > 0 && m->ops[0].kind == QK_OP_AMPLITUDE) { /* positive rows: non-zero norms */
        for (auto &e : x) e = std::fabs(e) + 0.05;
        for (auto &e : y) e = std::fabs(e) + 0.05;
    }
    std::vector<double> G = rand_vec(nx * cols, -1.0, 1.0), gc, Kc, gg, Kg;
    CHECK(vjp(g_cpu, m, x, nx, ny ? &y : nullptr, ny, G, gc, Kc) == QK_OK, "%s: CPU: %s", name, qk_last_error());
    const qk_result r = vjp(g_gpu, m, x, nx, ny ? &y : nullptr, ny, G, gg, Kg);
    CHECK(r == QK_OK, "%s: GPU: %s", name, qk_last_error());
    if (r != QK_OK) return;
    const size_t nw = (size_t)m->n_weights;
    double dg = 0, dk = 0;
    for (size_t i = 0; i < nw; ++i) dg = std::max(dg, std::isnan(gg[i]) ? INFINITY : std::fabs(gg[i] - gc[i]));
    for (size_t i = 0; i < Kc.size(); ++i) dk = std::max(dk, std::isnan(Kg[i]) ? INFINITY : std::fabs(Kg[i] - Kc[i]));
    /* relative to the largest gradient entry, with a floor for gradients that cancel to ~0 (a
       weight whose gates cancel: both engines give rounding noise, ~1e-15): 1e-3 of the mean |G| */
    double gmean = 0;
    for (double v : G) gmean += std::fabs(v);
    gmean /= (double)std::max<size_t>(1, G.size());
    const double scale = std::max(max_abs(gc, nw), 1e-3 * gmean);
    CHECK(dg <= 1e-10 * scale, "%s %s (n=%lld,%lld): max |grad gpu - cpu| = %.3g, max |grad| = %.3g", name, ny ? "K(X,Y)" : "K(X,X)",
          (long long)nx, (long long)ny, dg, scale);
    CHECK(dk <= 1e-12, "%s %s: max |K gpu - cpu| = %.3g", name, ny ? "K(X,Y)" : "K(X,X)", dk);
    printf("  %-44s %s n=%lld,%lld: %d weights, grad rel %.2g, K %.2g\n", name, ny ? "K(X,Y)" : "K(X,X)", (long long)nx, (long long)ny,
           m->n_weights, dg / scale, dk);
}

static int cancel_at(int64_t done, int64_t total, void *user)
{
    (void)done; (void)total;
    return --*(int *)user == 0;
}

static double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static int bench()
{
    for (int q : {8, 12}) {
        const int64_t n = 4096;
        qk_map *m = qk_test_parse("hea(layers=2)", q);
        rand_weights(m);
        std::vector<double> x = rand_vec(n * q, -1.2, 1.2), G = rand_vec(n * n, -1, 1), K((size_t)(n * n)), g((size_t)m->n_weights);
        std::vector<double> tg64, tgd, tv, tvk;
        for (int rep = 0; rep < 6; ++rep) {
            qk_gram_desc gd;
            memset(&gd, 0, sizeof gd);
            gd.x = x.data(); gd.n_x = n; gd.out = K.data(); gd.out_dtype = QK_F64; gd.precision = QK_PRECISION_FP64;
            double t0 = now_s();
            if (qk_gram(g_gpu, m, &gd) != QK_OK) { printf("gram: %s\n", qk_last_error()); return 1; }
            const double a = now_s() - t0;
            gd.precision = QK_PRECISION_DEFAULT;
            t0 = now_s();
            if (qk_gram(g_gpu, m, &gd) != QK_OK) { printf("gram: %s\n", qk_last_error()); return 1; }
            const double b = now_s() - t0;
            qk_vjp_desc v;
            memset(&v, 0, sizeof v);
            v.x = x.data(); v.n_x = n; v.g = G.data(); v.grad_w = g.data();
            t0 = now_s();
            if (qk_gram_vjp(g_gpu, m, &v) != QK_OK) { printf("vjp: %s\n", qk_last_error()); return 1; }
            const double c = now_s() - t0;
            v.k_out = K.data();
            t0 = now_s();
            if (qk_gram_vjp(g_gpu, m, &v) != QK_OK) { printf("vjp: %s\n", qk_last_error()); return 1; }
            const double e = now_s() - t0;
            if (rep == 0) continue; /* warm-up */
            tg64.push_back(a); tgd.push_back(b); tv.push_back(c); tvk.push_back(e);
        }
        const double G64 = median(tg64), GD = median(tgd), V = median(tv), VK = median(tvk);
        printf("bench hea(layers=2) q=%d n=%lld K(X,X), %d weights: gram fp64 %.2f ms, gram default precision %.2f ms, "
               "vjp %.2f ms, vjp + K %.2f ms; vjp / gram fp64 = %.2fx (with K %.2fx), vjp / gram default = %.2fx\n",
               q, (long long)n, m->n_weights, G64 * 1e3, GD * 1e3, V * 1e3, VK * 1e3, V / G64, VK / G64, V / GD);
        qk_map_free(m);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (qk_cuda_device_count() == 0) { printf("no CUDA device: skipped\n"); return 77; }
    qk_test_seed();
    g_gpu = qk_test_ctx(QK_DEVICE_CUDA, 0);
    g_cpu = qk_test_ctx(QK_DEVICE_CPU, 2);
    if (argc > 1 && !strcmp(argv[1], "bench")) return bench();
    {   /* every weighted gate kind, each weight once */
        qk_map *m = qk_test_weighted_gates();
        rand_weights(m);
        check("custom: RX RY RZ P RZZ (w)", m, 30, 0);
        check("custom: RX RY RZ P RZZ (w)", m, 25, 17);
        qk_map_free(m);
    }
    {   /* w * x angles, a weight in two gates */
        std::vector<qk_op> ops = {
            qk_test_op(QK_OP_H, 0, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),    qk_test_op(QK_OP_H, 1, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),
            qk_test_op(QK_OP_RX, 0, 0, QK_ARG_WX, 0, 0, 0, 1.0, 0.2),  qk_test_op(QK_OP_RY, 1, 0, QK_ARG_WX, 1, 0, 1, 0.8, 0),
            qk_test_op(QK_OP_RZZ, 0, 1, QK_ARG_WX, 2, 0, 2, 1.0, 0),   qk_test_op(QK_OP_P, 1, 0, QK_ARG_WX, 0, 0, 0, 1.5, 0),
            qk_test_op(QK_OP_CNOT, 1, 0, QK_ARG_CONST, 0, 0, 0, 1, 0), qk_test_op(QK_OP_RZ, 0, 0, QK_ARG_W, 0, 0, 2, 0.6, 0),
            qk_test_op(QK_OP_RY, 0, 0, QK_ARG_PIXX, 0, 1, 0, 0.3, 0),
        };
        qk_map *m = custom(2, 3, ops, 3);
        rand_weights(m);
        check("custom: w*x angles, shared weights", m, 28, 0);
        check("custom: w*x angles, shared weights", m, 20, 11);
        qk_map_free(m);
    }
    {   /* an amplitude start, then weighted gates */
        std::vector<qk_op> ops = {
            qk_test_op(QK_OP_AMPLITUDE, 0, 0, QK_ARG_CONST, 0, 0, 0, 1, 0), qk_test_op(QK_OP_RY, 0, 0, QK_ARG_W, 0, 0, 0, 1.0, 0),
            qk_test_op(QK_OP_CNOT, 0, 2, QK_ARG_CONST, 0, 0, 0, 1, 0),      qk_test_op(QK_OP_RZ, 1, 0, QK_ARG_W, 0, 0, 1, 0.8, 0.1),
            qk_test_op(QK_OP_RX, 2, 0, QK_ARG_WX, 3, 0, 2, 1.2, 0),         qk_test_op(QK_OP_RY, 1, 0, QK_ARG_W, 0, 0, 0, 0.5, 0),
        };
        qk_map *m = custom(3, 8, ops, 3);
        rand_weights(m);
        check("custom: amplitude start", m, 33, 0);
        check("custom: amplitude start", m, 21, 14);
        qk_map_free(m);
    }
    for (int t = 0; t < 6; ++t) {   /* random circuits of every op kind (BASIS included) */
        const int q = 2 + (int)(qk_test_rand64() % 6), d = 4, nw = 1 + (int)(qk_test_rand64() % 6);
        qk_map *m = random_map(q, d, 10 + (int)(qk_test_rand64() % 30), nw, true);
        char name[64];
        snprintf(name, sizeof name, "random circuit q=%d (%d ops)", q, m->n_ops);
        check(name, m, 20 + (int64_t)(qk_test_rand64() % 60), 0, true);
        check(name, m, 20 + (int64_t)(qk_test_rand64() % 60), 5 + (int64_t)(qk_test_rand64() % 60), true);
        qk_map_free(m);
    }
    {
        struct { const char *spec; int q; int64_t nx, ny; } hs[] = {
            {"hea(layers=2)", 5, 24, 0},          {"hea(layers=2)", 5, 19, 22},
            {"hea(layers=2,rot=yz)", 4, 20, 13},  {"hea(layers=2,rot=yz)", 4, 21, 0},
            {"hea(layers=2)", 9, 140, 0},         {"hea(layers=2)", 9, 131, 77},
            {"hea(layers=2,rot=yz)", 8, 103, 0},  {"hea(layers=2,rot=yz)", 8, 97, 53},
            {"hea(layers=2,rot=yz)", 12, 40, 0},  /* 128 KB of s and l: shared memory */
            {"hea(layers=2,rot=yz)", 13, 24, 9},  /* 256 KB: in place in global memory */
            {"hea(layers=2)", 14, 20, 0},         /* real, 256 KB: global memory */
        };
        for (auto &h : hs) {
            qk_map *m = qk_test_parse(h.spec, h.q);
            rand_weights(m);
            char name[64];
            snprintf(name, sizeof name, "%s q=%d", h.spec, h.q);
            check(name, m, h.nx, h.ny);
            qk_map_free(m);
        }
    }
    {   /* a product map with complex states */
        std::vector<qk_op> ops = {
            qk_test_op(QK_OP_H, 0, 0, QK_ARG_CONST, 0, 0, 0, 1, 0), qk_test_op(QK_OP_RX, 1, 0, QK_ARG_W, 0, 0, 0, 0.9, 0.1),
            qk_test_op(QK_OP_RZ, 0, 0, QK_ARG_W, 0, 0, 1, 1.0, 0),  qk_test_op(QK_OP_RY, 1, 0, QK_ARG_X, 1, 0, 0, 1.0, 0),
            qk_test_op(QK_OP_P, 0, 0, QK_ARG_W, 0, 0, 2, 1.2, 0),
        };
        qk_map *m = custom(2, 2, ops, 3);
        rand_weights(m);
        check("custom product map", m, 26, 0);
        check("custom product map", m, 22, 15);
        qk_map_free(m);
    }
    {   /* run to run: the same bits */
        static const char *specs[] = {"hea(layers=2)", "hea(layers=2,rot=yz)"};
        for (int sp = 0; sp < 2; ++sp)
            for (int yy = 0; yy < 2; ++yy) {
                qk_map *m = qk_test_parse(specs[sp], 8);
                rand_weights(m);
                const int64_t nx = 300, ny = yy ? 170 : 0, cols = ny ? ny : nx;
                std::vector<double> x = rand_data(m, nx, false), y = rand_data(m, ny, false), G = rand_vec(nx * cols, -1, 1), g0, K0, g1, K1;
                bool same = true;
                CHECK(vjp(g_gpu, m, x, nx, ny ? &y : nullptr, ny, G, g0, K0) == QK_OK, "repro: %s", qk_last_error());
                for (int rep = 0; rep < 3; ++rep) {
                    CHECK(vjp(g_gpu, m, x, nx, ny ? &y : nullptr, ny, G, g1, K1) == QK_OK, "repro: %s", qk_last_error());
                    same = same && !memcmp(g0.data(), g1.data(), sizeof(double) * g0.size()) && !memcmp(K0.data(), K1.data(), sizeof(double) * K0.size());
                }
                CHECK(same, "%s %s: the GPU gradient or K differs between runs", specs[sp], ny ? "K(X,Y)" : "K(X,X)");
                qk_map_free(m);
            }
    }
    {   /* G through the staging (pageable) and straight (page-locked), with a padded ld_g, k_out
           pageable and page-locked: the same gradient and K bits; a non-finite G entry named (the
           first in row order, in a later chunk of rows too), the outputs untouched */
        qk_map *m = qk_test_parse("hea(layers=2)", 7);
        rand_weights(m);
        const int64_t n = 3000, ld = n + 3;   /* 3000 x 3003 doubles: 72 MB, three 32 MB chunks */
        std::vector<double> x = rand_data(m, n, false), Gp = rand_vec(n * ld, -1, 1), G((size_t)(n * n));
        for (int64_t i = 0; i < n; ++i) memcpy(&G[(size_t)(i * n)], &Gp[(size_t)(i * ld)], (size_t)n * 8);
        std::vector<double> g0, K0, gc, Kc;
        CHECK(vjp(g_gpu, m, x, n, nullptr, 0, G, g0, K0) == QK_OK, "staging: %s", qk_last_error());
        CHECK(vjp(g_cpu, m, x, n, nullptr, 0, G, gc, Kc) == QK_OK, "staging cpu: %s", qk_last_error());
        double dk = 0;
        for (size_t i = 0; i < Kc.size(); ++i) dk = std::max(dk, std::isnan(K0[i]) ? INFINITY : std::fabs(K0[i] - Kc[i]));
        CHECK(dk <= 1e-12, "staging: K vs the CPU %.3g", dk);
        for (int pin = 0; pin <= 1; ++pin) {
            std::vector<double> g1((size_t)m->n_weights, NAN), K1((size_t)(n * n), NAN);
            if (pin) { cudaHostRegister(Gp.data(), Gp.size() * 8, cudaHostRegisterPortable); cudaHostRegister(K1.data(), K1.size() * 8, cudaHostRegisterPortable); }
            qk_vjp_desc v;
            memset(&v, 0, sizeof v);
            v.x = x.data(); v.n_x = n; v.g = Gp.data(); v.ld_g = ld; v.grad_w = g1.data(); v.k_out = K1.data();
            CHECK(qk_gram_vjp(g_gpu, m, &v) == QK_OK && !memcmp(g1.data(), g0.data(), g0.size() * 8) && !memcmp(K1.data(), K0.data(), K0.size() * 8),
                  "G ld %lld %s: another gradient or K than G dense and pageable (%s)", (long long)ld, pin ? "page-locked" : "pageable", qk_last_error());
            for (int64_t at : {(int64_t)5 * ld + 7, (int64_t)2900 * ld + 11}) {   /* chunk 0; the last chunk */
                const double keep = Gp[(size_t)at], keep2 = Gp[(size_t)(2950 * ld + 1)];
                Gp[(size_t)at] = at % 2 ? INFINITY : NAN;
                if (at > 1000 * ld) Gp[(size_t)(2950 * ld + 1)] = NAN;   /* a later bad entry: the first is named */
                std::fill(g1.begin(), g1.end(), 7.0);
                std::fill(K1.begin(), K1.end(), 7.0);
                const qk_result r = qk_gram_vjp(g_gpu, m, &v);
                char want[64];
                snprintf(want, sizeof want, "g[%lld][%lld] is not finite", (long long)(at / ld), (long long)(at % ld));
                bool untouched = true;
                for (double e : g1) untouched = untouched && e == 7.0;
                for (size_t i = 0; i < K1.size() && untouched; i += 997) untouched = K1[i] == 7.0;
                CHECK(r == QK_ERROR_NON_FINITE && strstr(qk_last_error(), want) && untouched, "%s G, a bad entry at %lld: %d (%s), outputs untouched %d",
                      pin ? "page-locked" : "pageable", (long long)at, (int)r, qk_last_error(), (int)untouched);
                Gp[(size_t)at] = keep;
                Gp[(size_t)(2950 * ld + 1)] = keep2;
            }
            if (pin) { cudaHostUnregister(Gp.data()); cudaHostUnregister(K1.data()); }
        }
        qk_map_free(m);
    }
    {   /* cancel from the progress callback: outputs untouched */
        qk_map *m = qk_test_parse("hea(layers=2,rot=yz)", 6);
        rand_weights(m);
        const int64_t n = 64;
        std::vector<double> x = rand_data(m, n, false), G = rand_vec(n * n, -1, 1), g((size_t)m->n_weights, 7.0), K((size_t)(n * n), 7.0);
        for (int at : {1, 2, 5}) {
            qk_vjp_desc v;
            int left = at;
            memset(&v, 0, sizeof v);
            v.x = x.data(); v.n_x = n; v.g = G.data(); v.grad_w = g.data(); v.k_out = K.data();
            v.progress = cancel_at; v.progress_user = &left;
            const qk_result r = qk_gram_vjp(g_gpu, m, &v);
            CHECK(r == QK_ERROR_CANCELLED, "cancel at call %d: %d (%s)", at, (int)r, qk_last_error());
            bool untouched = true;
            for (double e : g) untouched = untouched && e == 7.0;
            for (double e : K) untouched = untouched && e == 7.0;
            CHECK(untouched, "cancel at call %d: grad_w or k_out written", at);
        }
        qk_map_free(m);
    }
    {   /* every device acquisition of a call failing in turn: an error, nothing written, nothing kept */
        qk_map *m = qk_test_parse("hea(layers=2,rot=yz)", 10);
        rand_weights(m);
        for (int yy = 0; yy < 2; ++yy) {
            const int64_t nx = 256, ny = yy ? 200 : 0, cols = ny ? ny : nx;
            std::vector<double> x = rand_data(m, nx, false), y = rand_data(m, ny, false), G = rand_vec(nx * cols, -1, 1), g, K;
            CHECK(vjp(g_gpu, m, x, nx, ny ? &y : nullptr, ny, G, g, K) == QK_OK, "faults warm-up: %s", qk_last_error());
            CHECK(vjp(g_gpu, m, x, nx, ny ? &y : nullptr, ny, G, g, K) == QK_OK, "faults warm-up: %s", qk_last_error());
            cudaDeviceSynchronize();
            const size_t live0 = qk_cuda_test_live_bytes();
            const int c0 = qk_cuda_test_alloc_count();
            CHECK(vjp(g_gpu, m, x, nx, ny ? &y : nullptr, ny, G, g, K) == QK_OK, "faults count: %s", qk_last_error());
            const int acq = qk_cuda_test_alloc_count() - c0;
            CHECK(acq >= 8, "only %d device acquisitions counted", acq);
            for (int k = 1; k <= acq; ++k) {
                std::vector<double> gf, Kf;
                qk_cuda_test_fail_alloc(k);
                const qk_result r = vjp(g_gpu, m, x, nx, ny ? &y : nullptr, ny, G, gf, Kf);
                qk_cuda_test_fail_alloc(0);
                bool untouched = true;
                for (double e : gf) untouched = untouched && std::isnan(e);
                for (double e : Kf) untouched = untouched && std::isnan(e);
                CHECK(r == QK_ERROR_DEVICE_OUT_OF_MEMORY || r == QK_ERROR_OUT_OF_MEMORY, "acquisition %d of %d failing: %d (%s)", k, acq, (int)r,
                      qk_last_error());
                CHECK(untouched, "acquisition %d failing: grad_w or k_out written", k);
            }
            cudaDeviceSynchronize();
            const size_t live1 = qk_cuda_test_live_bytes();
            CHECK(live1 == live0, "%s: the engine's device memory before the faulted calls %zu bytes, after %zu", ny ? "K(X,Y)" : "K(X,X)",
                  live0, live1);
            std::vector<double> g2, K2;
            CHECK(vjp(g_gpu, m, x, nx, ny ? &y : nullptr, ny, G, g2, K2) == QK_OK, "after the faults: %s", qk_last_error());
            CHECK(!memcmp(g.data(), g2.data(), sizeof(double) * g.size()), "after the faults: another gradient");
        }
        qk_map_free(m);
    }
    qk_ctx_destroy(g_gpu);
    qk_ctx_destroy(g_cpu);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
