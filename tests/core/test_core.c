/* CPU suite: maps, Gram properties, analytic vs statevector, parser round trips and errors, bad
   input. Every comparison is against an independent computation made here (naive loops over
   states, a Walsh-Hadamard + diagonal-phase construction of ZZ states), on fresh random inputs
   (seed printed; QK_TEST_SEED=... reproduces a run). */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime under strict -std=c11 */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../qk_test.h"

/* K from states by the definition, naive loops */
static double *naive_gram(qk_ctx *ctx, const qk_map *m, const double *x, int64_t nx, const double *y, int64_t ny)
{
    int64_t D = (int64_t)1 << m->n_qubits, i, j, k;
    double *sx = (double *)malloc(sizeof(double) * (size_t)(2 * D * nx));
    double *sy = (double *)malloc(sizeof(double) * (size_t)(2 * D * ny));
    double *K = (double *)malloc(sizeof(double) * (size_t)(nx * ny));
    if (qk_states(ctx, m, x, nx, sx) != QK_OK || qk_states(ctx, m, y, ny, sy) != QK_OK) { printf("states: %s\n", qk_last_error()); exit(2); }
    for (i = 0; i < nx; i++)
        for (j = 0; j < ny; j++) {
            double re = 0, im = 0;
            for (k = 0; k < D; k++) {
                double ar = sx[2 * (i * D + k)], ai = sx[2 * (i * D + k) + 1];
                double br = sy[2 * (j * D + k)], bi = sy[2 * (j * D + k) + 1];
                re += ar * br + ai * bi;
                im += ar * bi - ai * br;
            }
            K[i * ny + j] = re * re + im * im;
        }
    free(sx); free(sy);
    return K;
}

static double *gram(qk_ctx *ctx, const qk_map *m, const double *x, int64_t nx, const double *y, int64_t ny)
{
    int64_t cols = y ? ny : nx;
    double *K = (double *)malloc(sizeof(double) * (size_t)(nx * cols));
    qk_gram_desc d;
    int64_t i;
    for (i = 0; i < nx * cols; i++) K[i] = NAN; /* poison */
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = nx; d.y = y; d.n_y = ny; d.out = K;
    if (qk_gram(ctx, m, &d) != QK_OK) { printf("gram: %s\n", qk_last_error()); exit(2); }
    return K;
}

/* ---- ZZ states built independently: (H^n then diag phase)^reps, Walsh-Hadamard transform ---- */
static void zz_indep(const double *x, int q, int reps, double alpha, double *re, double *im)
{
    int64_t D = (int64_t)1 << q, k, b;
    int r, i, j;
    double norm = 1.0 / sqrt((double)D);
    for (k = 0; k < D; k++) { re[k] = 0; im[k] = 0; }
    re[0] = 1;
    for (r = 0; r < reps; r++) {
        for (i = 0; i < q; i++) { /* H on qubit i */
            int64_t bit = (int64_t)1 << i;
            for (k = 0; k < D; k++) if (!(k & bit)) {
                double ar = re[k], ai = im[k], br = re[k | bit], bi = im[k | bit];
                re[k] = ar + br; im[k] = ai + bi; re[k | bit] = ar - br; im[k | bit] = ai - bi;
            }
        }
        for (k = 0; k < D; k++) {
            double ph = 0, c, s, ar = re[k] * norm, ai = im[k] * norm;
            for (i = 0; i < q; i++) {
                if ((k >> i) & 1) ph += x[i];
                for (j = i + 1; j < q; j++)
                    if (((k >> i) ^ (k >> j)) & 1) ph += (3.14159265358979323846 - x[i]) * (3.14159265358979323846 - x[j]);
            }
            c = cos(alpha * ph); s = sin(alpha * ph);
            re[k] = c * ar - s * ai; im[k] = c * ai + s * ar;
        }
        (void)b;
    }
}

static void test_zz_independent(void)
{
    int q;
    qk_ctx *ctx = qk_test_cpu_ctx(0);
    for (q = 1; q <= 7; q++) {
        qk_map *m = qk_test_parse("zz(reps=2,alpha=1.7)", q);
        int64_t D = (int64_t)1 << q, n = 3, i, k;
        double *x = qk_test_rand_data(n, q, 0, 2 * 3.14159265358979323846);
        double *s = (double *)malloc(sizeof(double) * (size_t)(2 * D * n));
        double *re = (double *)malloc(sizeof(double) * (size_t)D), *im = (double *)malloc(sizeof(double) * (size_t)D);
        double err = 0;
        CHECK(qk_states(ctx, m, x, n, s) == QK_OK, "states: %s", qk_last_error());
        for (i = 0; i < n; i++) {
            zz_indep(x + i * q, q, 2, 1.7, re, im);
            for (k = 0; k < D; k++) {
                double e = hypot(s[2 * (i * D + k)] - re[k], s[2 * (i * D + k) + 1] - im[k]);
                if (!(e <= err)) err = e;
            }
        }
        CHECK(err < 1e-12, "zz q=%d: state error %.3g vs Walsh-Hadamard construction", q, err);
        free(x); free(s); free(re); free(im);
        qk_map_free(m);
    }
    qk_ctx_destroy(ctx);
}

/* ---- blocked, threaded Gram vs the definition; properties ---- */
static void test_gram_vs_naive(void)
{
    const char *specs[] = {"zz(reps=2)", "zz(reps=1,ent=linear)", "iqp(reps=2)", "hea(layers=2)", "hea(layers=1,rot=yz,ent=cnot)",
                           "amplitude", "circuit(qubits=3: h(0) h(1) h(2) rz(0, x0) cz(0,1) ry(2, 0.5*x1+0.2) cx(2,0) rzz(1,2, x0*x1) y(1))"};
    int feats[] = {5, 6, 4, 6, 5, 11, 3};
    int64_t ns[] = {1, 3, 67, 131};
    size_t s;
    int t;
    qk_ctx *c1 = qk_test_cpu_ctx(1), *c2 = qk_test_cpu_ctx(3);
    for (s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        qk_map *m = qk_test_parse(specs[s], feats[s]);
        for (t = 0; t < 4; t++) {
            int64_t n = ns[t], ny = 37, i, j;
            double *x = qk_test_rand_data(n, feats[s], -1, 3), *y = qk_test_rand_data(ny, feats[s], -1, 3);
            double *K1 = gram(c1, m, x, n, NULL, 0), *K2 = gram(c2, m, x, n, NULL, 0);
            double *Kn = naive_gram(c1, m, x, n, x, n);
            double *Kxy = gram(c2, m, x, n, y, ny), *Kxyn = naive_gram(c1, m, x, n, y, ny);
            double asym = 0, diag = 0;
            CHECK(qk_test_max_diff(K1, Kn, n * n) < 1e-12, "%s n=%lld: blocked vs naive %.3g", specs[s], (long long)n, qk_test_max_diff(K1, Kn, n * n));
            CHECK(qk_test_max_diff(K1, K2, n * n) < 1e-13, "%s n=%lld: 1 vs 3 threads differ %.3g", specs[s], (long long)n, qk_test_max_diff(K1, K2, n * n));
            CHECK(qk_test_max_diff(Kxy, Kxyn, n * ny) < 1e-12, "%s n=%lld: K(X,Y) vs naive %.3g", specs[s], (long long)n, qk_test_max_diff(Kxy, Kxyn, n * ny));
            for (i = 0; i < n; i++) {
                if (fabs(K1[i * n + i] - 1) > diag) diag = fabs(K1[i * n + i] - 1);
                for (j = 0; j < n; j++) if (K1[i * n + j] != K1[j * n + i]) asym = 1;
            }
            CHECK(asym == 0, "%s: K(X,X) not exactly symmetric", specs[s]);
            CHECK(diag < 1e-12, "%s: diagonal off 1 by %.3g", specs[s], diag);
            /* PSD: v^T K v >= -tol for random v */
            for (t = t; t < 4; t++) {
                int r;
                for (r = 0; r < 5; r++) {
                    double *v = qk_test_rand_data(n, 1, -1, 1), quad = 0, vv = 0;
                    for (i = 0; i < n; i++) { vv += v[i] * v[i]; for (j = 0; j < n; j++) quad += v[i] * K1[i * n + j] * v[j]; }
                    CHECK(quad >= -1e-10 * vv * (double)n, "%s: v'Kv = %g < 0", specs[s], quad);
                    free(v);
                }
                break;
            }
            free(x); free(y); free(K1); free(K2); free(Kn); free(Kxy); free(Kxyn);
        }
        qk_map_free(m);
    }
    qk_ctx_destroy(c1); qk_ctx_destroy(c2);
}

/* K(X,Y) equals the matching block of K(X u Y) */
static void test_block_of_union(void)
{
    qk_ctx *ctx = qk_test_cpu_ctx(0);
    qk_map *m = qk_test_parse("zz(reps=2,ent=circular)", 4);
    int64_t nx = 70, ny = 45, n = nx + ny, i, j;
    double *u = qk_test_rand_data(n, 4, 0, 3.14159265358979323846);
    double *K = gram(ctx, m, u, n, NULL, 0), *Kxy = gram(ctx, m, u, nx, u + nx * 4, ny);
    double e = 0;
    for (i = 0; i < nx; i++)
        for (j = 0; j < ny; j++) {
            double t = fabs(K[i * n + nx + j] - Kxy[i * ny + j]);
            if (!(t <= e)) e = t;
        }
    CHECK(e < 1e-13, "K(X,Y) vs block of K(XuY): %.3g", e);
    free(u); free(K); free(Kxy);
    qk_map_free(m);
    qk_ctx_destroy(ctx);
}

/* product maps: analytic path vs the statevector of the same map */
static void test_analytic(void)
{
    const char *specs[] = {"angle(rot=x)", "angle(rot=y)", "angle(rot=z)", "basis",
                           "circuit(qubits=4: h(0) rx(1, x1) ry(2, 2*x0*x2-0.3) rz(3, x3) p(0, (pi-x0)*(pi-x1)) h(3) y(1) z(2) x(0))",
                           "hea(layers=2)" /* q=1: no ring, a product map */};
    int feats[] = {6, 5, 7, 6, 4, 1};
    size_t s;
    qk_ctx *ctx = qk_test_cpu_ctx(0);
    for (s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        qk_map *m = qk_test_parse(specs[s], feats[s]);
        int64_t n = 23, i;
        double *x = qk_test_rand_data(n, feats[s], -2, 4), *K, *Kn;
        CHECK(m->cls == QK_CLASS_PRODUCT, "%s should be a product map", specs[s]);
        if (m->type == QK_MAP_BASIS) for (i = 0; i < n * feats[s]; i++) x[i] = x[i] > 1 ? 1.0 : 0.0;
        K = gram(ctx, m, x, n, NULL, 0);
        Kn = naive_gram(ctx, m, x, n, x, n);
        CHECK(qk_test_max_diff(K, Kn, n * n) < 1e-12, "%s: analytic vs statevector %.3g", specs[s], qk_test_max_diff(K, Kn, n * n));
        free(x); free(K); free(Kn);
        qk_map_free(m);
    }
    /* 200 qubits: no state could hold this; the kernel is the product of per-qubit cos^2 */
    {
        qk_map *m = qk_test_parse("angle(rot=y)", 200);
        int64_t n = 5, i, j, k;
        double *x = qk_test_rand_data(n, 200, 0, 0.3), *K = gram(ctx, m, x, n, NULL, 0), e = 0;
        for (i = 0; i < n; i++)
            for (j = 0; j < n; j++) {
                double p = 1;
                for (k = 0; k < 200; k++) { double c = cos(0.5 * (x[i * 200 + k] - x[j * 200 + k])); p *= c * c; }
                if (fabs(p - K[i * n + j]) > e) e = fabs(p - K[i * n + j]);
            }
        CHECK(e < 1e-13, "angle(y) 200 qubits vs prod cos^2: %.3g", e);
        free(x); free(K);
        qk_map_free(m);
    }
    qk_ctx_destroy(ctx);
}

/* outputs: float32, ld_out, callback tiles, progress, cancellation */
typedef struct tile_acc { double *K; int64_t n; int calls; int cancel_after; } tile_acc;
static int on_tile(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *tile, int64_t ld, void *user)
{
    tile_acc *a = (tile_acc *)user;
    int64_t i, j;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) a->K[(i0 + i) * a->n + j0 + j] = ((const double *)tile)[i * ld + j];
    a->calls++;
    return a->cancel_after && a->calls >= a->cancel_after;
}
static int on_progress(int64_t done, int64_t total, void *user)
{
    int64_t *last = (int64_t *)user;
    if (done < last[0] || done > total) last[1] = 1; /* must be monotone and bounded */
    last[0] = done;
    return 0;
}

static void test_outputs(void)
{
    qk_ctx *ctx = qk_test_cpu_ctx(2);
    qk_map *m = qk_test_parse("iqp(reps=1)", 5);
    int64_t n = 150, ld = 157, i, j;
    double *x = qk_test_rand_data(n, 5, 0, 2), *K = gram(ctx, m, x, n, NULL, 0);
    float *Kf = (float *)malloc(sizeof(float) * (size_t)(n * ld));
    double *Kc = (double *)malloc(sizeof(double) * (size_t)(n * n));
    qk_gram_desc d;
    tile_acc acc;
    int64_t prog[2] = {0, 0};
    double e = 0;
    int pad_ok = 1;
    for (i = 0; i < n * ld; i++) Kf[i] = -7.0f;
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = n; d.out = Kf; d.ld_out = ld; d.out_dtype = QK_F32;
    d.progress = on_progress; d.progress_user = prog;
    CHECK(qk_gram(ctx, m, &d) == QK_OK, "f32 gram: %s", qk_last_error());
    for (i = 0; i < n; i++) {
        for (j = 0; j < n; j++) if (fabs(Kf[i * ld + j] - K[i * n + j]) > e) e = fabs(Kf[i * ld + j] - K[i * n + j]);
        for (j = n; j < ld; j++) if (Kf[i * ld + j] != -7.0f) pad_ok = 0;
    }
    CHECK(e < 1e-6, "float32 output vs float64: %.3g", e);
    CHECK(pad_ok, "ld_out padding was written");
    CHECK(prog[0] == n * n && prog[1] == 0, "progress ended at %lld of %lld (monotone violations %lld)", (long long)prog[0], (long long)(n * n), (long long)prog[1]);

    for (i = 0; i < n * n; i++) Kc[i] = NAN;
    memset(&d, 0, sizeof d);
    acc.K = Kc; acc.n = n; acc.calls = 0; acc.cancel_after = 0;
    d.x = x; d.n_x = n; d.output = QK_OUTPUT_CALLBACK; d.tile_fn = on_tile; d.tile_user = &acc;
    CHECK(qk_gram(ctx, m, &d) == QK_OK, "callback gram: %s", qk_last_error());
    for (i = 0; i < n; i++) for (j = 0; j < i; j++) Kc[i * n + j] = Kc[j * n + i]; /* caller mirrors */
    CHECK(qk_test_max_diff(Kc, K, n * n) == 0, "callback tiles differ from host output: %.3g", qk_test_max_diff(Kc, K, n * n));
    acc.calls = 0; acc.cancel_after = 2;
    CHECK(qk_gram(ctx, m, &d) == QK_ERROR_CANCELLED, "cancel via tile callback not reported");
    CHECK(acc.calls == 2, "tiles delivered after cancel: %d", acc.calls);
    free(x); free(K); free(Kf); free(Kc);
    qk_map_free(m);
    qk_ctx_destroy(ctx);
}

/* A cancel while the states are built: with 18 qubits and 48 samples the states are nearly all
   the work (each a few passes over 2^18 amplitudes, K one 48 x 48 tile), and the engine polls the
   progress callback while it builds them, so a callback that cancels at its first call stops
   the job in a small fraction of the uncancelled time (before the fix the first call came after
   every state was built). Bounds: a quarter of the uncancelled run's wall time and of its CPU
   time (all threads: the latency is a poll interval, a few ms of work, plus the unwind). The
   CPU time holds on a loaded machine; the wall time is compared with an uncancelled run just
   before, best of three pairs, as one scheduling hiccup on a shared 2-core machine is not the
   engine's. Nothing of K is written, the detail says when it came, the callback is not called
   again once it cancelled, and qk stays usable. */

static void test_cancel_states(void)
{
    const int q = 18;
    const int64_t n = 48, ny = 5;
    qk_ctx *ctx = qk_test_cpu_ctx(2);
    qk_map *m = qk_test_parse("zz(reps=2)", q);
    double *x = qk_test_rand_data(n + ny, q, 0, 3), *K = (double *)malloc(sizeof(double) * (size_t)(n * n));
    qk_gram_desc d;
    double full[2], cut[2], best[2] = {1e30, 1e30};
    int64_t i;
    int try_, calls = 0, untouched = 1;
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = n; d.out = K; d.progress_user = &calls;
    qk_test_perturb(0);
    for (try_ = 0; try_ < 3 && (best[0] >= 0.25 || best[1] >= 0.25); try_++) {
        qk_result r;
        d.progress = NULL;
        CHECK(qk_test_timed_gram(ctx, m, &d, full) == QK_OK, "zz %d qubits, n %lld: %s", q, (long long)n, qk_last_error());
        for (i = 0; i < n * n; i++) K[i] = -7.0;
        d.progress = qk_test_cancel_first;
        calls = 0;
        r = qk_test_timed_gram(ctx, m, &d, cut);
        CHECK(r == QK_ERROR_CANCELLED && strstr(qk_last_error(), "while the states were built") != NULL,
              "cancel while building states: %d, %s", (int)r, qk_last_error());
        CHECK(calls == 1, "the progress callback was called %d times, want 1 (it cancelled at the first)", calls);
        for (i = 0; i < n * n; i++) if (K[i] != -7.0) untouched = 0;
        printf("cancel while building states: %.1f ms, %.1f ms CPU (uncancelled %.1f ms, %.1f ms CPU)\n",
               cut[0] * 1e3, cut[1] * 1e3, full[0] * 1e3, full[1] * 1e3);
        if (cut[0] / full[0] < best[0]) best[0] = cut[0] / full[0];
        if (cut[1] / full[1] < best[1]) best[1] = cut[1] / full[1];
    }
    CHECK(best[0] < 0.25 && best[1] < 0.25, "cancelled after %.0f%% of the uncancelled wall time, %.0f%% of its CPU time: the state build does not poll",
          100 * best[0], 100 * best[1]);
    CHECK(untouched, "a job cancelled while its states were built wrote K");
    /* K(X,Y): X's and Y's states, the same */
    d.y = x + n * q; d.n_y = ny;
    calls = 0;
    CHECK(qk_test_timed_gram(ctx, m, &d, cut) == QK_ERROR_CANCELLED && calls == 1, "K(X,Y) cancel while building states: %s", qk_last_error());
    CHECK(cut[1] < 0.25 * full[1], "K(X,Y) cancelled after %.3f s CPU (uncancelled K(X,X) %.3f s)", cut[1], full[1]);
    /* still usable: a small job completes */
    d.y = NULL; d.n_x = 3; d.progress = NULL;
    CHECK(qk_gram(ctx, m, &d) == QK_OK, "after a cancel: %s", qk_last_error());
    free(x); free(K);
    qk_test_perturb(1);
    qk_map_free(m);
    qk_ctx_destroy(ctx);
}

/* ---- parser ---- */
static int same_map(const qk_map *a, const qk_map *b)
{
    int i;
    if (a->n_qubits != b->n_qubits || a->n_features != b->n_features || a->n_weights != b->n_weights || a->n_ops != b->n_ops || a->cls != b->cls) return 0;
    for (i = 0; i < a->n_ops; i++) {
        const qk_op *x = &a->ops[i], *y = &b->ops[i];
        if (x->kind != y->kind || x->q0 != y->q0) return 0;
        if ((x->kind == QK_OP_CNOT || x->kind == QK_OP_CZ || x->kind == QK_OP_RZZ) && x->q1 != y->q1) return 0;
        if (x->kind == QK_OP_RX || x->kind == QK_OP_RY || x->kind == QK_OP_RZ || x->kind == QK_OP_P || x->kind == QK_OP_RZZ) {
            if (x->angle.kind != y->angle.kind || x->angle.scale != y->angle.scale || x->angle.offset != y->angle.offset) return 0;
            if (x->angle.kind != QK_ARG_CONST && x->angle.kind != QK_ARG_W && x->angle.x0 != y->angle.x0) return 0;
            if ((x->angle.kind == QK_ARG_XX || x->angle.kind == QK_ARG_PIXX) && x->angle.x1 != y->angle.x1) return 0;
            if ((x->angle.kind == QK_ARG_W || x->angle.kind == QK_ARG_WX) && x->angle.w != y->angle.w) return 0;
        }
    }
    return 1;
}

/* spec (on 2 features) is a parse error at the column col, and leaves the output map NULL */
static void check_parse_error(const char *spec, int col)
{
    qk_map *a = (qk_map *)&qk_test_fails; /* must be reset to NULL */
    char want[32];
    qk_result r = qk_map_parse(spec, 2, &a);
    snprintf(want, sizeof want, "column %d:", col);
    CHECK(r == QK_ERROR_PARSE, "'%s' gave %s, want parse error", spec, qk_result_string(r));
    CHECK(a == NULL, "'%s': out not cleared", spec);
    if (r == QK_OK) qk_map_free(a);
    CHECK(strstr(qk_last_error(), want) != NULL, "'%s': message '%s' lacks '%s'", spec, qk_last_error(), want);
}

static void test_parser(void)
{
    const char *ok[] = {"zz", "zz()", " ZZ ( reps = 3 , alpha=1.25, ent=sca ) ", "zz(ent=pairwise)", "zz(ent=reverse_linear,reps=1)",
                        "iqp", "iqp(reps=2)", "angle(rot=y)", "amplitude", "amplitude(qubits=5)", "basis",
                        "hea(layers=3,rot=yz,ent=cnot)", "hea(qubits=6)",
                        "circuit(qubits=3,weights=2: h(0) rx(1, 0.5*x0+0.1) ry(2, w1*x2) rz(0, x0*x1) p(1, 2*(pi-x0)*(pi-x2)) cx(0,1) cz(1,2) rzz(0,2, -1.5*x1) x(1) y(0) z(2); rz(1, w0); ry(0,-x2-0.25); rx(2, pi); p(0, -pi))"};
    struct { const char *spec; int col; } bad[] = {
        {"zzz", 1}, {"zz(reps=)", 9}, {"zz(rep=2)", 4}, {"zz(reps=2", 10}, {"zz(ent=ring)", 8}, {"angle(rot=w)", 11},
        {"zz(reps=2) extra", 12}, {"circuit(qubits=2: h(0) foo(1))", 24}, {"circuit(qubits=2: rx(0))", 23},
        {"circuit(qubits=2: rx(0, 2*q1))", 27}, {"circuit(qubits=2: cx(0))", 23}, {"hea(rot=x)", 9}, {"", 1}, {"zz(alpha=abc)", 10},
    };
    size_t i;
    for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        qk_map *a = NULL, *b = NULL;
        char buf[4096];
        qk_result r = qk_map_parse(ok[i], 4, &a);
        CHECK(r == QK_OK, "parse '%s': %s", ok[i], qk_last_error());
        if (r != QK_OK) continue;
        CHECK(qk_map_spec(a, buf, sizeof buf) < (int)sizeof buf, "spec too long");
        r = qk_map_parse(buf, 4, &b);
        CHECK(r == QK_OK && same_map(a, b), "round trip '%s' -> '%s' differs (%s)", ok[i], buf, r ? qk_last_error() : "ops");
        /* custom: the circuit spec of any builtin map must rebuild the same ops */
        if (r == QK_OK && a->type != QK_MAP_CUSTOM && a->type != QK_MAP_AMPLITUDE && a->type != QK_MAP_BASIS) {
            qk_map_desc d;
            qk_map *c = NULL;
            memset(&d, 0, sizeof d);
            d.type = QK_MAP_CUSTOM; d.n_features = 4; d.n_qubits = a->n_qubits; d.ops = a->ops; d.n_ops = a->n_ops; d.n_weights = a->n_weights;
            CHECK(qk_map_make(&d, &c) == QK_OK, "custom copy of '%s': %s", ok[i], qk_last_error());
            if (c) {
                qk_map *e = NULL;
                char buf2[65536];
                qk_map_spec(c, buf2, sizeof buf2);
                CHECK(qk_map_parse(buf2, 4, &e) == QK_OK && same_map(c, e), "circuit round trip of '%s' fails: %s", ok[i], qk_last_error());
                qk_map_free(e);
                qk_map_free(c);
            }
        }
        qk_map_free(a); qk_map_free(b);
    }
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        check_parse_error(bad[i].spec, bad[i].col);
    }
    { /* map errors other than syntax */
        qk_map *a = NULL;
        CHECK(qk_map_parse("zz", 31, &a) == QK_ERROR_TOO_MANY_QUBITS, "zz with 31 qubits: %s", qk_last_error());
        CHECK(qk_map_parse("angle", 31, &a) == QK_OK, "angle with 31 qubits is a product map: %s", qk_last_error());
        qk_map_free(a); a = NULL;
        CHECK(qk_map_parse("amplitude(qubits=2)", 5, &a) == QK_ERROR_SHAPE, "amplitude 5 features in 2 qubits");
        CHECK(qk_map_parse("zz(qubits=3)", 4, &a) == QK_ERROR_SHAPE, "zz qubits != features");
        CHECK(qk_map_parse("circuit(qubits=2: cx(0,0))", 2, &a) == QK_ERROR_INVALID_ARGUMENT, "cx on one qubit");
        CHECK(qk_map_parse("circuit(qubits=2: rx(0, x5))", 2, &a) == QK_ERROR_INVALID_ARGUMENT, "feature out of range");
        CHECK(qk_map_parse("circuit(qubits=2: rx(0, w0))", 2, &a) == QK_ERROR_INVALID_ARGUMENT, "weight without weights=");
        CHECK(qk_map_parse("circuit(qubits=2: h(2))", 2, &a) == QK_ERROR_INVALID_ARGUMENT, "qubit out of range");
        {   /* the ops' weight and feature indices (qk_map_make's check of w * x and w angles) */
            qk_op op;
            qk_map_desc md;
            int t;
            memset(&md, 0, sizeof md);
            md.type = QK_MAP_CUSTOM; md.n_features = 2; md.n_qubits = 1; md.ops = &op; md.n_ops = 1; md.n_weights = 2;
            for (t = 0; t < 5; t++) {
                const int wx = t != 4, x0 = t == 0 ? 2 : t == 1 ? -1 : 1, w = t == 2 ? 2 : t == 3 || t == 4 ? -1 : 0;
                qk_result r;
                memset(&op, 0, sizeof op);
                op.kind = QK_OP_RY; op.angle.kind = wx ? QK_ARG_WX : QK_ARG_W; op.angle.x0 = x0; op.angle.w = w; op.angle.scale = 1.0;
                r = qk_map_make(&md, &a);
                CHECK(r == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), t < 2 ? "feature x" : "weight w"),
                      "%s with x%d, w%d: %d %s", wx ? "w * x" : "w", x0, w, (int)r, qk_last_error());
                qk_map_free(a); a = NULL;
            }
            op.angle.kind = QK_ARG_WX; op.angle.x0 = 1; op.angle.w = 1;
            CHECK(qk_map_make(&md, &a) == QK_OK, "w1 * x1: %s", qk_last_error());
            qk_map_free(a); a = NULL;
        }
        CHECK(qk_map_parse("zz", 0, &a) == QK_ERROR_INVALID_ARGUMENT, "zero features");
        CHECK(qk_map_parse(NULL, 2, &a) == QK_ERROR_INVALID_ARGUMENT, "NULL spec");
        CHECK(a == NULL, "out set on error");
    }
}

/* ---- bad input: clear error, output untouched ---- */
/* Issue 27, item 9: a parameter given twice is an error naming it (zz(reps=2,reps=3) used to
   run reps=3); stray characters after a number are named (zz(reps=0x10) used to say "'reps'
   must be > 0"). */
static void test_parser_dup_stray(void)
{
    struct { const char *spec; int col; const char *sub, *sub2; } bad[] = {
        {"zz(reps=2,reps=3)", 11, "'reps' is given twice", NULL},
        {"hea(layers=1,layers=4,rot=y,rot=yz)", 14, "'layers' is given twice", NULL},
        {"hea(layers=1,rot=y,rot=yz)", 20, "'rot' is given twice", NULL},
        {"hea(reps=2,layers=3)", 12, "'layers' repeats 'reps'", NULL},
        {"iqp(reps=1, n_repeats=1)", 13, "'n_repeats' repeats 'reps'", NULL},
        {"zz(ent=full,ent=full)", 13, "'ent' is given twice", NULL},
        {"zz(alpha=1,alpha=2)", 12, "'alpha' is given twice", NULL},
        {"amplitude(qubits=1,qubits=1)", 20, "'qubits' is given twice", NULL},
        {"circuit(qubits=2,weights=1,weights=1: h(0))", 28, "'weights' is given twice", NULL},
        {"zz(reps=0x10)", 10, "stray characters 'x10'", "'reps=0x10'"},
        {"zz(reps=2.0)", 10, "stray characters '.0'", NULL},
        {"zz(reps=1e3)", 10, "stray characters 'e3'", NULL},
        {"zz(qubits=0x2)", 12, "stray characters 'x2'", NULL},
        {"zz(alpha=0x1)", 11, "stray characters 'x1'", "'alpha=0x1'"},
        {"zz(alpha=1.5abc)", 13, "stray characters 'abc'", NULL},
        {"circuit(qubits=2,weights=1_0: h(0))", 27, "stray characters '_0'", NULL},
    };
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        check_parse_error(bad[i].spec, bad[i].col);
        CHECK(strstr(qk_last_error(), bad[i].sub) != NULL, "'%s': message '%s' lacks '%s'", bad[i].spec, qk_last_error(), bad[i].sub);
        if (bad[i].sub2)
            CHECK(strstr(qk_last_error(), bad[i].sub2) != NULL, "'%s': message '%s' lacks '%s'", bad[i].spec, qk_last_error(), bad[i].sub2);
        CHECK(!strstr(qk_last_error(), "must be > 0"), "'%s': '%s'", bad[i].spec, qk_last_error());
    }
    { /* each parameter once still parses, and a value followed by blanks or ')' is clean */
        const char *ok[] = {"zz(reps=2 , alpha=0.5 ,ent=linear, qubits=2)", "hea(layers=1,rot=yz,ent=cz,qubits=2)",
                            "iqp(n_repeats=3)", "circuit(qubits=2,weights=1,features=2: h(0))", "zz(alpha=-pi)"};
        for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
            qk_map *a = NULL;
            CHECK(qk_map_parse(ok[i], 2, &a) == QK_OK, "'%s': %s", ok[i], qk_last_error());
            qk_map_free(a);
        }
    }
}

/* qk_map_check_data's flat scan (every value finite: the largest |x| in one pass; otherwise the
   rows again, to name the first bad value): a bad value at each position of the scan's groups of
   four and in its tail (7 x 3 = 21 values), of either sign; the angle bound from the largest |x|,
   which may be a negative value. */
static void test_check_data_scan(void)
{
    qk_map *zz = qk_test_parse("zz", 3);
    double x[21], bad[3];
    char want[64];
    int i, k, b;
    bad[0] = NAN; bad[1] = INFINITY; bad[2] = -INFINITY;
    for (i = 0; i < 21; i++) x[i] = 0.1 * (i + 1) - 1.0;
    CHECK(qk_map_check_data(zz, x, 7, "X") == QK_OK, "finite data: %s", qk_last_error());
    for (k = 0; k < 21; k++)
        for (b = 0; b < 3; b++) {
            const double keep = x[k];
            x[k] = bad[b];
            if (b == 0 && k + 1 < 21) x[20] = NAN;   /* a later bad value too: the first is named */
            snprintf(want, sizeof want, "X[%d][%d] is %s", k / 3, k % 3, b == 0 ? "NaN" : "Inf");
            CHECK(qk_map_check_data(zz, x, 7, "X") == QK_ERROR_NON_FINITE && strstr(qk_last_error(), want), "%s: %s", want,
                  qk_last_error());
            x[k] = keep;
            x[20] = 0.1 * 21 - 1.0;
        }
    for (k = 0; k < 7; k++) {   /* a row of +-1e160: its pair angles (pi - x_i)(pi - x_j) overflow, found through the bound */
        double keep[3];
        memcpy(keep, x + 3 * k, sizeof keep);
        for (i = 0; i < 3; i++) x[3 * k + i] = k % 2 ? -1e160 : 1e160;
        snprintf(want, sizeof want, "X row %d", k);
        CHECK(qk_map_check_data(zz, x, 7, "X") == QK_ERROR_BAD_DATA && strstr(qk_last_error(), want), "row %d of %g: %s", k, x[3 * k],
              qk_last_error());
        x[3 * k] = 1.0;
        CHECK(qk_map_check_data(zz, x, 7, "X") == QK_ERROR_BAD_DATA, "two of 1e160 in row %d: %s", k, qk_last_error());
        x[3 * k + 1] = 1.0;   /* one large value alone: every angle finite */
        CHECK(qk_map_check_data(zz, x, 7, "X") == QK_OK, "one of 1e160 in row %d: %s", k, qk_last_error());
        memcpy(x + 3 * k, keep, sizeof keep);
    }
    for (i = 0; i < 21; i++) x[i] = -1e3 * (i + 1);   /* all negative: the bound still clears them */
    CHECK(qk_map_check_data(zz, x, 7, "X") == QK_OK, "negative data: %s", qk_last_error());
    qk_map_free(zz);
}

static void test_bad_input(void)
{
    qk_ctx *ctx = qk_test_cpu_ctx(0);
    qk_map *zz = qk_test_parse("zz", 3), *amp = qk_test_parse("amplitude", 4), *basis = qk_test_parse("basis", 2), *hea = qk_test_parse("hea(layers=1)", 3);
    double x[12], K[16], w[3] = {1, 2, NAN};
    qk_gram_desc d;
    qk_ctx *c2 = NULL;
    qk_ctx_desc cd;
    int i;
    for (i = 0; i < 12; i++) x[i] = 0.1 * (i + 1);
    for (i = 0; i < 16; i++) K[i] = -3;
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = 4; d.out = K;
    x[5] = NAN;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_NON_FINITE && strstr(qk_last_error(), "X[1][2] is NaN"), "NaN: %s", qk_last_error());
    x[5] = INFINITY;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_NON_FINITE && strstr(qk_last_error(), "X[1][2] is Inf"), "Inf: %s", qk_last_error());
    x[5] = 0.5;
    d.y = x; d.n_y = 0;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_INVALID_ARGUMENT, "n_y = 0");
    d.y = NULL; d.n_x = 0;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_INVALID_ARGUMENT, "n_x = 0");
    d.n_x = -2;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_INVALID_ARGUMENT, "n_x < 0");
    d.n_x = 4; d.ld_out = 3;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_INVALID_ARGUMENT, "ld_out < cols");
    d.ld_out = 0; d.out = NULL;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_INVALID_ARGUMENT, "out NULL");
    d.out = K; d.x = NULL;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_INVALID_ARGUMENT, "x NULL");
    d.x = x;
    CHECK(qk_gram(NULL, zz, &d) == QK_ERROR_INVALID_ARGUMENT, "ctx NULL");
    CHECK(qk_gram(ctx, NULL, &d) == QK_ERROR_INVALID_ARGUMENT, "map NULL");
    CHECK(qk_gram(ctx, zz, NULL) == QK_ERROR_INVALID_ARGUMENT, "desc NULL");
    d.output = QK_OUTPUT_CALLBACK;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_INVALID_ARGUMENT, "callback without tile_fn");
    d.output = QK_OUTPUT_DEVICE;
    CHECK(qk_gram(ctx, zz, &d) == QK_ERROR_NO_DEVICE, "device output on the CPU engine");
    d.output = QK_OUTPUT_HOST;
    d.n_x = 3;
    for (i = 0; i < 12; i++) x[i] = 0;
    x[4] = 1;
    CHECK(qk_gram(ctx, amp, &d) == QK_ERROR_ZERO_NORM && strstr(qk_last_error(), "row 0"), "zero-norm row: %s", qk_last_error());
    for (i = 0; i < 12; i++) x[i] = (i % 3 == 0);
    x[3] = 0.5;
    CHECK(qk_gram(ctx, basis, &d) == QK_ERROR_BAD_DATA && strstr(qk_last_error(), "X[1][1]"), "basis 0.5: %s", qk_last_error());
    for (i = 0; i < 16; i++) CHECK(K[i] == -3, "output written on error (K[%d] = %g)", i, K[i]);
    CHECK(qk_map_set_weights(hea, w, 3) == QK_ERROR_NON_FINITE, "NaN weight");
    CHECK(qk_map_set_weights(hea, w, 2) == QK_ERROR_SHAPE, "weight count");
    memset(&cd, 0, sizeof cd);
    cd.vram_fraction = 1.5;
    CHECK(qk_ctx_create(&cd, &c2) == QK_ERROR_INVALID_ARGUMENT && c2 == NULL, "vram_fraction 1.5");
    cd.vram_fraction = 0; cd.n_threads = -1;
    CHECK(qk_ctx_create(&cd, &c2) == QK_ERROR_INVALID_ARGUMENT, "n_threads -1");
    CHECK(qk_ctx_create(NULL, NULL) == QK_ERROR_INVALID_ARGUMENT, "out NULL");
#if !defined(QK_CUDA)
    cd.n_threads = 0; cd.device = QK_DEVICE_CUDA;
    CHECK(qk_ctx_create(&cd, &c2) == QK_ERROR_NO_DEVICE, "cuda without engine: %s", qk_result_string(qk_ctx_create(&cd, &c2)));
#endif
    for (i = 0; i < QK_RESULT_COUNT_; i++) CHECK(strcmp(qk_result_string((qk_result)i), "unknown qk_result") != 0, "result %d unnamed", i);
    qk_map_free(zz); qk_map_free(amp); qk_map_free(basis); qk_map_free(hea);
    qk_ctx_destroy(ctx);
}

/* trainable weights change the kernel as the map says: hea with weights w equals hea with
   weights 1 on the data scaled by w (per qubit, one layer) */
static void test_weights(void)
{
    qk_ctx *ctx = qk_test_cpu_ctx(0);
    qk_map *a = qk_test_parse("hea(layers=1)", 4), *b = qk_test_parse("hea(layers=1)", 4);
    double w[4] = {0.5, 1.5, -0.7, 2.0};
    int64_t n = 9, i, k;
    double *x = qk_test_rand_data(n, 4, 0, 3), *xs = (double *)malloc(sizeof(double) * (size_t)(n * 4)), *K1, *K2;
    CHECK(qk_map_set_weights(a, w, 4) == QK_OK, "set weights: %s", qk_last_error());
    for (i = 0; i < n; i++) for (k = 0; k < 4; k++) xs[i * 4 + k] = x[i * 4 + k] * w[k];
    K1 = gram(ctx, a, x, n, NULL, 0);
    K2 = gram(ctx, b, xs, n, NULL, 0);
    CHECK(qk_test_max_diff(K1, K2, n * n) < 1e-13, "weights vs scaled data: %.3g", qk_test_max_diff(K1, K2, n * n));
    free(x); free(xs); free(K1); free(K2);
    qk_map_free(a); qk_map_free(b);
    qk_ctx_destroy(ctx);
}

/* max |state - op-by-op| of sample x: qk__state1 (diagonal runs and Hadamard runs folded)
   against qk__apply op by op, nothing folded */
static double state_vs_op_by_op(const qk_map *m, const double *x)
{
    const int q = m->n_qubits;
    const int64_t D = (int64_t)1 << q;
    double *re = (double *)malloc(sizeof(double) * (size_t)D), *im = (double *)malloc(sizeof(double) * (size_t)D);
    double *r2 = (double *)calloc((size_t)D, sizeof(double)), *i2 = (double *)calloc((size_t)D, sizeof(double));
    double *th = (double *)malloc(sizeof(double) * ((size_t)m->n_ops + 1 + qk__diag_scratch(q)));
    double e = 0.0;
    int64_t i;
    int k;
    qk__state1(m, x, re, im, th, NULL);
    r2[0] = 1.0;
    qk_map_angles(m, x, th);
    for (k = 0; k < m->n_ops; k++) qk__apply(&m->ops[k], th[k], x, r2, i2, q);
    for (i = 0; i < D; i++) {
        double a = fabs(re[i] - r2[i]) + fabs(im[i] - i2[i]);
        if (!(a <= e)) e = a;
    }
    free(re); free(im); free(r2); free(i2); free(th);
    return e;
}

/* The CPU state builder folds a run of diagonal ops (Z, RZ, P, CZ, RZZ, zz pairs) into one
   table pass from QK__DIAG_MIN_QUBITS on: the state equals the op-by-op application of every
   op (qk__apply, no folding) on fresh random data, to 1e-13, for every map family with
   diagonal runs and a custom circuit mixing all of them, just below, at and above the threshold. */
static void test_diag_fold(void)
{
    const char *specs[] = {"zz(reps=2)", "zz(reps=2,ent=linear)", "zz(reps=1,ent=circular,alpha=1.7)", "iqp(reps=2)",
                           "circuit(qubits=12: h(0) h(3) h(7) h(11) rz(0, x0) p(1, 2*(pi-x0)*(pi-x2)) cz(1,2) z(5) "
                           "rzz(0,11, -1.5*x1) cx(3,4) p(4, x3) cx(3,4) rz(11, x2*x3) cz(0,11) h(2) h(5))"};
    int si, q;
    for (si = 0; si < 5; si++)
        for (q = QK__DIAG_MIN_QUBITS - 1; q <= QK__DIAG_MIN_QUBITS + 1; q++) {
            qk_map *m = NULL;
            double *x, e;
            int d = si == 4 ? 4 : q;
            if (si == 4 && q != QK__DIAG_MIN_QUBITS) continue;
            if (qk_map_parse(specs[si], d, &m) != QK_OK) { CHECK(0, "diag fold: parse %s: %s", specs[si], qk_last_error()); continue; }
            x = qk_test_rand_data(1, d, 0.0, 2 * 3.14159265358979);
            e = state_vs_op_by_op(m, x);
            CHECK(e <= 1e-13, "diag fold %s q=%d: max |state - op-by-op| = %.3g", specs[si], q, e);
            qk_map_free(m);
            free(x);
        }
}

/* The CPU state builder applies a run of Hadamards on distinct qubits as one Walsh-Hadamard
   transform (a fresh |0> directly as the superposition): the state equals the op-by-op
   application (qk__apply, a 2x2 matrix per H) to 1e-13, on fresh random data, for runs at the
   start (fresh, partial masks), in the middle of other gates, of high qubits only (no bit under
   the cache block: the separate scale pass), broken by a repeated qubit (h(3) h(3) is the
   identity, two runs), below the block size (4 qubits) and above it. */
static void test_h_runs(void)
{
    const char *specs[] = {
        "circuit(qubits=12: h(1) h(4) h(10) ry(0, x0) ry(11, x1) rz(5, x2) h(10) h(11) cz(0,11) h(0) h(3) h(3) h(11) h(10) "
        "h(2) ry(4, x3) h(4) h(0) h(11) h(1) h(5) h(6) h(7) h(8) h(9) rz(7, x0*x1) h(7) h(7))",
        "circuit(qubits=4: h(0) h(1) h(2) h(3) rz(2, x0) cz(0,3) h(3) h(1) ry(0, x1) h(0) h(2) h(3))",
        "circuit(qubits=13: ry(12, x0) h(12) h(11) h(10) rz(3, x1) h(0) h(12) cz(2,12) h(5) h(6))",
        "zz(reps=3,ent=linear)"};
    int si;
    for (si = 0; si < 4; si++) {
        qk_map *m = NULL;
        int d = si == 3 ? 11 : 4;
        double *x, e;
        if (qk_map_parse(specs[si], d, &m) != QK_OK) { CHECK(0, "h runs: parse %s: %s", specs[si], qk_last_error()); continue; }
        x = qk_test_rand_data(1, d, 0.0, 2 * 3.14159265358979);
        e = state_vs_op_by_op(m, x);
        CHECK(e <= 1e-13, "h runs %s: max |state - op-by-op| = %.3g", specs[si], e);
        qk_map_free(m);
        free(x);
    }
}

/* Independent of qk__apply (whose Z / CZ / RZ / P / CNOT walk their quarter or half of the
   state in runs): one op by its definition, a test per amplitude. */
static void naive_op(const qk_op *o, double t, double *re, double *im, int q)
{
    const int64_t D = (int64_t)1 << q, b0 = (int64_t)1 << o->q0, b1 = o->q1 >= 0 ? (int64_t)1 << o->q1 : 0;
    const double c = cos(0.5 * t), sn = sin(0.5 * t), r = sqrt(0.5);
    int64_t i;
    for (i = 0; i < D; i++) {
        double pr = 1, pi = 0, ar, ai, br, bi;
        switch (o->kind) {
        case QK_OP_Z: if (i & b0) pr = -1; break;
        case QK_OP_CZ: if ((i & b0) && (i & b1)) pr = -1; break;
        case QK_OP_RZ: pr = c; pi = (i & b0) ? sn : -sn; break;
        case QK_OP_P: if (i & b0) { pr = cos(t); pi = sin(t); } break;
        case QK_OP_CNOT:
            if ((i & b0) && !(i & b1)) {
                ar = re[i]; ai = im[i]; re[i] = re[i | b1]; im[i] = im[i | b1]; re[i | b1] = ar; im[i | b1] = ai;
            }
            continue;
        case QK_OP_H: case QK_OP_RY: case QK_OP_RX:
            if (i & b0) continue;
            ar = re[i]; ai = im[i]; br = re[i | b0]; bi = im[i | b0];
            if (o->kind == QK_OP_H) {
                re[i] = r * (ar + br); im[i] = r * (ai + bi); re[i | b0] = r * (ar - br); im[i | b0] = r * (ai - bi);
            } else if (o->kind == QK_OP_RY) {
                re[i] = c * ar - sn * br; im[i] = c * ai - sn * bi; re[i | b0] = sn * ar + c * br; im[i | b0] = sn * ai + c * bi;
            } else { /* RX: (c a - i s b, -i s a + c b) */
                re[i] = c * ar + sn * bi; im[i] = c * ai - sn * br; re[i | b0] = sn * ai + c * br; im[i | b0] = -sn * ar + c * bi;
            }
            continue;
        default: continue;
        }
        ar = re[i]; ai = im[i];
        re[i] = pr * ar - pi * ai;
        im[i] = pr * ai + pi * ar;
    }
}

/* The state builder against naive_op for circuits of every op it walks in runs (Z, CZ, RZ, P,
   CNOT with the control above and below the target, on low and high qubits), from a spread
   state (every amplitude non-zero), starting real (the builder skips the imaginary parts until
   the first complex op) and turning complex, on fresh random data, to 1e-13. */
static void test_ops_naive(void)
{
    const char *specs[] = {
        "circuit(qubits=11: h(0) h(1) h(2) h(3) h(4) h(5) h(6) h(7) h(8) h(9) h(10) ry(0, x0) ry(10, x1) h(5) cz(0,10) cz(7,8) z(3) z(0) cx(9,2) cx(1,6) cx(10,0) ry(4, x2) cz(1,2) "
        "rz(6, x3) p(0, x1) p(9, x2) cx(3,8) cx(8,3) cz(0,1) rz(10, x0*x2) rx(2, x1) z(10) cx(0,1) h(3) h(7))",
        "circuit(qubits=3: h(0) h(1) ry(2, x0) cx(2,0) cz(0,2) z(1) rz(1, x1) cx(0,2) p(2, x2) cz(1,2))"};
    int si;
    for (si = 0; si < 2; si++) {
        qk_map *m = NULL;
        double *x, *re, *im, *r2, *i2, *th, e = 0.0;
        int64_t D, i;
        int k, q;
        if (qk_map_parse(specs[si], 4, &m) != QK_OK) { CHECK(0, "ops naive: parse %s: %s", specs[si], qk_last_error()); continue; }
        q = m->n_qubits;
        D = (int64_t)1 << q;
        x = qk_test_rand_data(1, 4, 0.0, 2 * 3.14159265358979);
        re = (double *)malloc(sizeof(double) * (size_t)D); im = (double *)malloc(sizeof(double) * (size_t)D);
        r2 = (double *)calloc((size_t)D, sizeof(double)); i2 = (double *)calloc((size_t)D, sizeof(double));
        th = (double *)malloc(sizeof(double) * ((size_t)m->n_ops + 1 + qk__diag_scratch(q)));
        qk__state1(m, x, re, im, th, NULL);
        qk_map_angles(m, x, th);
        r2[0] = 1.0;
        for (k = 0; k < m->n_ops; k++) naive_op(&m->ops[k], th[k], r2, i2, q);
        for (i = 0; i < D; i++) {
            double a = fabs(re[i] - r2[i]) + fabs(im[i] - i2[i]);
            if (!(a <= e)) e = a;
        }
        CHECK(e <= 1e-13, "ops vs naive %s: max |state - naive| = %.3g", specs[si], e);
        qk_map_free(m);
        free(x); free(re); free(im); free(r2); free(i2); free(th);
    }
}

/* The parity rule (qk__parity_at, qk_engine.h), one for every engine: CX(c,t) D(t) CX(c,t) with
   D = Z, RZ or P is one diagonal op on the bit c xor t (the CPU state builder used to take P
   only, the MPS and GPU compilers all three). Circuits with each D, the control above and below
   the target, and near misses (D on the control, the second CX reversed, RX in the middle, CZ in
   the middle, a CX P pair cut by the end of the circuit): the rule takes exactly the triples
   counted here; the state equals naive_op applied op by op (below, at and above
   QK__DIAG_MIN_QUBITS: the one-pass path and the folded diagonal run) to 1e-13; K on the MPS
   path equals the statevector K to 1e-12. */
static void test_parity_rule(void)
{
    static const struct { const char *body; int triples; } cs[] = {
        {"cx(0,1) z(1) cx(0,1) cx(2,1) rz(1, x0) cx(2,1) cx(1,3) p(3, x1*x2) cx(1,3)", 3},
        {"cx(0,1) rz(0, x0) cx(0,1) cx(1,2) p(2, x1) cx(2,1) cx(2,3) rx(3, x2) cx(2,3) cx(0,1) cz(1,2) cx(0,1)", 0},
        {"rz(1, x3) cx(3,2) rz(2, 0.5*x0+0.25) cx(3,2) z(0) cx(0,3) z(3) cx(0,3) cx(1,2) p(2, x2)", 2},
    };
    const int qs[3] = {5, QK__DIAG_MIN_QUBITS, QK__DIAG_MIN_QUBITS + 1};
    int ci, qi;
    for (ci = 0; ci < 3; ci++)
        for (qi = 0; qi < 3; qi++) {
            const int q = qs[qi];
            char spec[1024];
            int len, k, found = 0;
            qk_map *m = NULL;
            len = snprintf(spec, sizeof spec, "circuit(qubits=%d:", q);
            for (k = 0; k < q; k++) len += snprintf(spec + len, sizeof spec - (size_t)len, " h(%d)", k);
            for (k = 0; k < q; k++) len += snprintf(spec + len, sizeof spec - (size_t)len, " ry(%d, x%d)", k, k % 4);
            snprintf(spec + len, sizeof spec - (size_t)len, " %s)", cs[ci].body);
            if (qk_map_parse(spec, 4, &m) != QK_OK) { CHECK(0, "parity: parse %s: %s", spec, qk_last_error()); continue; }
            for (k = 0; k < m->n_ops; k++)
                if (qk__parity_at(m->ops, m->n_ops, k)) { found++; k += 2; }
            CHECK(found == cs[ci].triples, "parity q=%d case %d: the rule took %d triples, want %d", q, ci, found, cs[ci].triples);
            {
                const int64_t D = (int64_t)1 << q;
                double *x = qk_test_rand_data(1, 4, 0.0, 2 * 3.14159265358979), e = 0.0;
                double *re = (double *)malloc(sizeof(double) * (size_t)D), *im = (double *)malloc(sizeof(double) * (size_t)D);
                double *r2 = (double *)calloc((size_t)D, sizeof(double)), *i2 = (double *)calloc((size_t)D, sizeof(double));
                double *th = (double *)malloc(sizeof(double) * ((size_t)m->n_ops + 1 + qk__diag_scratch(q)));
                int64_t i;
                qk__state1(m, x, re, im, th, NULL);
                qk_map_angles(m, x, th);
                r2[0] = 1.0;
                for (k = 0; k < m->n_ops; k++) naive_op(&m->ops[k], th[k], r2, i2, q);
                for (i = 0; i < D; i++) {
                    double a = fabs(re[i] - r2[i]) + fabs(im[i] - i2[i]);
                    if (!(a <= e)) e = a;
                }
                CHECK(e <= 1e-13, "parity q=%d case %d: max |state - naive| = %.3g", q, ci, e);
                free(x); free(re); free(im); free(r2); free(i2); free(th);
            }
            if (q <= QK__DIAG_MIN_QUBITS) {   /* the MPS path against the statevector */
                qk_ctx *ctx = qk_test_cpu_ctx(2);
                double *x = qk_test_rand_data(9, 4, 0.0, 2 * 3.14159265358979), *K = gram(ctx, m, x, 9, NULL, 0);
                double *Km = (double *)malloc(sizeof(double) * 81);
                qk_gram_desc d;
                memset(&d, 0, sizeof d);
                d.x = x; d.n_x = 9; d.out = Km; d.path = QK_PATH_MPS;
                CHECK(qk_gram(ctx, m, &d) == QK_OK, "parity q=%d case %d: MPS: %s", q, ci, qk_last_error());
                CHECK(qk_test_max_diff(K, Km, 81) <= 1e-12, "parity q=%d case %d: MPS K off by %.3g", q, ci, qk_test_max_diff(K, Km, 81));
                free(x); free(K); free(Km);
                qk_ctx_destroy(ctx);
            }
            qk_map_free(m);
        }
}

int main(void)
{
    qk_test_seed();
    test_zz_independent();
    test_gram_vs_naive();
    test_block_of_union();
    test_analytic();
    test_outputs();
    test_cancel_states();
    test_parser();
    test_parser_dup_stray();
    test_parity_rule();
    test_bad_input();
    test_check_data_scan();
    test_weights();
    test_diag_fold();
    test_h_runs();
    test_ops_naive();
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
