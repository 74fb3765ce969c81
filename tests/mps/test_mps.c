/* MPS path (docs/mps.md): K from matrix product states against the statevector engine (CPU) at
   1e-12 for every local map family and q = 2..14 (and 20), each sample's MPS contracted back to a
   statevector and compared with qk_states, 100-qubit runs against exact decompositions (a product
   of independent blocks computed by statevectors; data that switch the entangler off, against the
   analytic path), the bond bounds, output modes (host, tiles, .npy), cancel, the planner's choice
   and clear errors. Fresh random data each run (seed printed; QK_TEST_SEED=... reproduces it). */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (qk_test.h) under strict -std=c11 */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../qk_test.h"

/* K on the given path (poisoned output first); NULL when qk_gram fails (*res says why) */
static double *gram_path(qk_ctx *ctx, const qk_map *m, const double *x, int64_t nx, const double *y, int64_t ny,
                         qk_path path, qk_result *res, qk_plan *plan)
{
    int64_t cols = y ? ny : nx, i;
    double *K = (double *)malloc(sizeof(double) * (size_t)(nx * cols));
    qk_gram_desc d;
    qk_result r;
    for (i = 0; i < nx * cols; i++) K[i] = NAN;
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = nx; d.y = y; d.n_y = ny; d.out = K; d.out_dtype = QK_F64; d.path = path;
    if (plan) {
        r = qk_plan_make(ctx, m, &d, plan);
        if (r != QK_OK) { if (res) *res = r; free(K); return NULL; }
    }
    r = qk_gram(ctx, m, &d);
    if (res) *res = r;
    if (r != QK_OK) { free(K); return NULL; }
    return K;
}

/* Every sample's MPS (the engine's lane layout) contracted to 2^q amplitudes, against qk_states. */
static double state_error(qk_ctx *ctx, const qk_map *m, const double *x, int64_t n, double *discarded)
{
    qk__mps_prog p;
    int q = m->n_qubits, s;
    int64_t D = (int64_t)1 << q, i, z;
    double *sv = (double *)malloc(sizeof(double) * (size_t)(2 * D * n)), *mps, err = 0;
    double vr[128], vi[128], wr[128], wi[128];
    if (qk__mps_prog_make(m, &p) != QK_OK || qk_states(ctx, m, x, n, sv) != QK_OK) { printf("state_error: %s\n", qk_last_error()); exit(2); }
    mps = qk__mps_states(&p, m, x, n, 2, discarded, NULL, NULL);
    if (!mps) { printf("mps states: %s\n", qk_last_error()); exit(2); }
    for (i = 0; i < n; i++) {
        const double *g = mps + (i / QK__NJ) * p.group;
        int lane = (int)(i % QK__NJ);
        for (z = 0; z < D; z++) {
            int l, r, a;
            vr[0] = 1; vi[0] = 0;
            for (s = 0; s < q; s++) {
                int dl = p.D[s], dr = p.D[s + 1];
                const double *A = g + p.off[s] + lane;
                a = (int)((z >> p.order[s]) & 1);
                for (r = 0; r < dr; r++) {
                    double sr = 0, si = 0;
                    for (l = 0; l < dl; l++) {
                        size_t e = ((size_t)l * 2 + a) * dr + r;
                        double ar = A[e * 2 * QK__NJ], ai = A[e * 2 * QK__NJ + QK__NJ];
                        sr += vr[l] * ar - vi[l] * ai;
                        si += vr[l] * ai + vi[l] * ar;
                    }
                    wr[r] = sr; wi[r] = si;
                }
                memcpy(vr, wr, sizeof(double) * (size_t)dr);
                memcpy(vi, wi, sizeof(double) * (size_t)dr);
            }
            {
                double er = fabs(vr[0] - sv[2 * (i * D + z)]), ei = fabs(vi[0] - sv[2 * (i * D + z) + 1]);
                if (er > err) err = er;
                if (ei > err) err = ei;
            }
        }
    }
    free(sv);
    free(mps);
    qk__mps_prog_free(&p);
    return err;
}

/* MPS K equals the statevector K: K(X,X) (n not a multiple of the 64-tile or the 8-lane group) and
   K(X,Y), on MPS forced and on the statevector forced; the states themselves for q <= 10. */
static void family(qk_ctx *ctx, const char *spec, int q, int64_t nx, int64_t ny)   /* nx < 0: K(X,Y) only */
{
    double t0 = getenv("QK_TEST_VERBOSE") ? qk_test_now(CLOCK_MONOTONIC) : 0;
    const int xx = nx > 0;
    qk_map *m = qk_test_parse(spec, q);
    double *x, *y;
    qk_result r1 = QK_OK, r2 = QK_OK, r3, r4;
    qk_plan pl;
    double *Km, *Ks;
    if (nx < 0) nx = -nx;
    x = qk_test_rand_data(nx, q, -0.5, 3.5);
    y = qk_test_rand_data(ny, q, -0.5, 3.5);
    Km = xx ? gram_path(ctx, m, x, nx, NULL, 0, QK_PATH_MPS, &r1, &pl) : NULL;
    Ks = xx ? gram_path(ctx, m, x, nx, NULL, 0, QK_PATH_COMPLEX, &r2, NULL) : NULL;
    double *Ym = gram_path(ctx, m, x, nx, y, ny, QK_PATH_MPS, &r3, xx ? NULL : &pl);
    double *Ys = gram_path(ctx, m, x, nx, y, ny, QK_PATH_COMPLEX, &r4, NULL);
    CHECK(r1 == QK_OK && r2 == QK_OK && r3 == QK_OK && r4 == QK_OK, "%s q=%d: %s", spec, q, qk_last_error());
    if ((!xx || (Km && Ks)) && Ym && Ys) {
        double e1 = xx ? qk_test_max_diff(Km, Ks, nx * nx) : 0, e2 = qk_test_max_diff(Ym, Ys, nx * ny);
        CHECK(pl.path == QK_PATH_MPS && pl.mps_bond >= 1 && pl.mps_bond <= QK_MPS_MAX_BOND, "%s q=%d: plan path %d bond %d", spec, q, (int)pl.path, pl.mps_bond);
        CHECK(e1 <= 1e-12, "%s q=%d: K(X,X) MPS vs statevector %.3g (tol 1e-12 abs)", spec, q, e1);
        CHECK(e2 <= 1e-12, "%s q=%d: K(X,Y) MPS vs statevector %.3g (tol 1e-12 abs)", spec, q, e2);
    }
    if (q <= 10) {
        double disc = -1, e = state_error(ctx, m, x, nx < 20 ? nx : 20, &disc);
        CHECK(e <= 1e-12, "%s q=%d: MPS amplitudes vs qk_states %.3g", spec, q, e);
        CHECK(disc >= 0 && disc <= 1e-12, "%s q=%d: compression dropped %.3g (bound not exact?)", spec, q, disc);
    }
    free(Km); free(Ks); free(Ym); free(Ys); free(x); free(y);
    qk_map_free(m);
    if (t0 > 0) printf("  %-40s q=%2d %.3f s\n", spec, q, qk_test_now(CLOCK_MONOTONIC) - t0);
}

static void families(qk_ctx *ctx)
{
    static const char *ents[] = {"linear", "reverse_linear", "circular", "pairwise", "sca"};
    char spec[128];
    int q, e, reps;
    for (q = 2; q <= 14; q += (q < 6 ? 1 : 4))
        for (e = 0; e < 5; e++)
            for (reps = 1; reps <= 3; reps++) {
                int64_t n = q < 10 ? 37 : 9;
                int ring = e >= 2 && e != 3;   /* circular, sca: 4^reps */
                /* q >= 10: reps 1 and 3 (linear kinds, bond 8), 1 and 2 (rings, bond 16) */
                if (q >= 10 && reps == (ring ? 3 : 2)) continue;
                snprintf(spec, sizeof spec, "zz(reps=%d,ent=%s)", reps, ents[e]);
                family(ctx, spec, q, n, 5);
            }
    /* alpha other than 2 */
    family(ctx, "zz(reps=2,ent=linear,alpha=0.7)", 7, 19, 9);
    /* hea rings: CZ and CNOT, y and yz, 1..3 layers */
    for (q = 2; q <= 14; q += (q < 6 ? 1 : 4))
        for (reps = 1; reps <= 3; reps++) {
            if (q >= 10 && reps == 3) continue;
            snprintf(spec, sizeof spec, "hea(layers=%d,rot=yz,ent=cnot)", reps);
            family(ctx, spec, q, q <= 10 ? 21 : 9, 4);
            snprintf(spec, sizeof spec, "hea(layers=%d,rot=y,ent=cz)", reps);
            family(ctx, spec, q, q <= 10 ? 21 : 9, 4);
        }
    /* a brickwork custom circuit: every gate kind, neighbouring and next-neighbouring pairs */
    family(ctx, "circuit(qubits=6: h(0) h(1) h(2) h(3) h(4) h(5) rx(0, x0) ry(1, 0.5*x1+0.2) rz(2, x2*x3) "
                "p(3, x3) y(4) x(5) cx(0,1) cz(2,3) rzz(4,5, x4*x5) cx(1,2) rzz(3,4, x1) cz(5,4) "
                "rx(2, x2) ry(3, x5) h(4) rzz(0,2, x0*x2) cx(3,1) z(0) cx(2,4) p(4, (pi-x2)*(pi-x4)) cx(2,4) "
                "cx(5,3) rz(5, x5) cz(0,1) rzz(1,3, 0.3))", 6, 25, 7);
    /* long-range gates (spans up to 11 sites) through the MPO of the general path */
    family(ctx, "circuit(qubits=12: h(0) h(3) h(5) h(11) ry(7, x7) rx(9, x9) cx(0,11) rzz(3,8, x3*x8) cz(5,10) "
                "p(10, x10) cx(9,2) rzz(11,1, x1) h(6) cx(7,4) rz(4, x4))", 12, 13, 5);
    family(ctx, "zz(reps=2,ent=linear)", 6, 1, 1);   /* one sample */
    /* iqp is all-to-all: small enough for MPS at 5 qubits (forced), and right */
    family(ctx, "iqp(reps=2)", 5, 17, 6);
    /* q = 20 against the statevector, n small */
    family(ctx, "zz(reps=2,ent=linear)", 20, -2, 1);
}

/* A sample whose exact MPS (zz(reps=1), all-to-all, 12 qubits, bond 64) meets columns of norm
   ~1e-160 in the QR sweeps: their Householder beta overflowed to inf and the whole MPS became NaN,
   so K had NaN rows on the MPS path of the CPU and GPU engines alike, with QK_OK (found by the
   GPU suite's pool test, 2026-11-26). K must be finite and equal the statevector's. */
static void tiny_columns(qk_ctx *ctx)
{
    static const double x7[12] = {2.9844363593051377, 2.0173171887627417, 3.2827227574599549, 4.6493050697489204,
                                  3.094936211861175, 3.8571013032910888, 1.3333715565937441, 3.3484642573764849,
                                  2.9900072574010155, 2.8421033201190191, 4.1907965352902172, 3.1500569943292334};
    qk_map *m = qk_test_parse("zz(reps=1)", 12);
    double *x = qk_test_rand_data(3, 12, 0, 6.28);
    qk_result r1, r2;
    qk_plan pl;
    memcpy(x + 12, x7, sizeof x7);   /* the middle sample */
    double *Km = gram_path(ctx, m, x, 3, NULL, 0, QK_PATH_MPS, &r1, &pl), *Ks = gram_path(ctx, m, x, 3, NULL, 0, QK_PATH_COMPLEX, &r2, NULL);
    CHECK(r1 == QK_OK && r2 == QK_OK && Km && Ks, "tiny columns: %s", qk_last_error());
    if (Km && Ks) {
        int finite = 1, k;
        for (k = 0; k < 9; k++) finite &= isfinite(Km[k]) != 0;
        CHECK(finite && pl.mps_bond == 64, "tiny columns: K on the MPS path not finite (bond %d)", pl.mps_bond);
        CHECK(qk_test_max_diff(Km, Ks, 9) <= 1e-12, "tiny columns: MPS vs statevector %.3g", qk_test_max_diff(Km, Ks, 9));
    }
    free(Km); free(Ks); free(x);
    qk_map_free(m);
}

/* The bounds the planner reports: 2^r for linear zz (capped at the ends), 4^r circular. */
static void bounds(void)
{
    static const struct { const char *spec; int q, want; } c[] = {
        {"zz(reps=1,ent=linear)", 12, 2}, {"zz(reps=2,ent=linear)", 12, 4}, {"zz(reps=3,ent=linear)", 12, 8},
        {"zz(reps=2,ent=pairwise)", 12, 4}, {"zz(reps=1,ent=circular)", 12, 4}, {"zz(reps=2,ent=circular)", 12, 16},
        {"zz(reps=3,ent=linear)", 4, 4}, {"hea(layers=2,ent=cz)", 10, 16}, {"zz(reps=2,ent=sca)", 12, 16},
    };
    size_t i;
    for (i = 0; i < sizeof c / sizeof c[0]; i++) {
        qk_map *m = qk_test_parse(c[i].spec, c[i].q);
        qk__mps_prog p;
        int s, ok = 1;
        CHECK(qk__mps_prog_make(m, &p) == QK_OK, "prog %s", c[i].spec);
        CHECK(p.chi == c[i].want, "%s q=%d: bond bound %d, want %d", c[i].spec, c[i].q, p.chi, c[i].want);
        /* never above 2^(sites on the smaller side) */
        for (s = 0; s <= c[i].q; s++) {
            int small = s < c[i].q - s ? s : c[i].q - s;
            if (p.D[s] > (1 << small)) ok = 0;
        }
        CHECK(ok, "%s: a bond exceeds the dimension of its smaller side", c[i].spec);
        qk__mps_prog_free(&p);
        qk_map_free(m);
    }
}

/* 100 qubits: no statevector. K symmetric, unit diagonal, in [0, 1]; equal to exact decompositions. */
static void big(qk_ctx *ctx)
{
    const int q = 100, B = 10;
    const int64_t n = 23;
    double *x = qk_test_rand_data(n, q, 0.0, 3.0), *K, *Kb, *P;
    qk_map *m = qk_test_parse("zz(reps=2,ent=linear)", q), *blk, *whole;
    qk_result r;
    qk_plan pl;
    char buf[512];
    int64_t i, j;
    int b, k;
    /* default path: MPS is the only one */
    K = gram_path(ctx, m, x, n, NULL, 0, QK_PATH_DEFAULT, &r, &pl);
    CHECK(K != NULL && pl.path == QK_PATH_MPS && pl.mps_bond == 4, "zz linear 100 qubits: %s (path %d, bond %d)", qk_last_error(), (int)pl.path, pl.mps_bond);
    qk_plan_describe(&pl, buf, sizeof buf);
    CHECK(strstr(buf, "mps (matrix product states)") && strstr(buf, "bond dimension <= 4"), "describe: %s", buf);
    if (K) {
        int sym = 1, unit = 1, range = 1;
        for (i = 0; i < n; i++) {
            if (fabs(K[i * n + i] - 1.0) > 1e-12) unit = 0;
            for (j = 0; j < n; j++) {
                if (K[i * n + j] != K[j * n + i]) sym = 0;
                if (!(K[i * n + j] >= -1e-15 && K[i * n + j] <= 1.0 + 1e-12)) range = 0;
            }
        }
        CHECK(sym && unit && range, "100 qubits: symmetric %d, unit diagonal %d, in [0,1] %d", sym, unit, range);
    }
    free(K);

    /* ten independent 10-qubit zz chains in one 100-qubit circuit: K is the product of the blocks'
       kernels, each by the statevector engine on its own columns */
    {
        size_t cap = 200000, len = 0;
        char *spec = (char *)malloc(cap), bspec[64];
        double *xb = (double *)malloc(sizeof(double) * (size_t)(n * B));
        int rep;
        len += (size_t)snprintf(spec + len, cap - len, "circuit(qubits=%d:", q);
        for (rep = 0; rep < 2; rep++)
            for (b = 0; b < q / B; b++) {
                for (k = b * B; k < b * B + B; k++) len += (size_t)snprintf(spec + len, cap - len, " h(%d) p(%d, 2*x%d)", k, k, k);
                for (k = b * B; k + 1 < b * B + B; k++)
                    len += (size_t)snprintf(spec + len, cap - len, " cx(%d,%d) p(%d, 2*(pi-x%d)*(pi-x%d)) cx(%d,%d)", k, k + 1, k + 1, k, k + 1, k, k + 1);
            }
        snprintf(spec + len, cap - len, ")");
        whole = qk_test_parse(spec, q);
        snprintf(bspec, sizeof bspec, "zz(reps=2,ent=linear)");
        blk = qk_test_parse(bspec, B);
        K = gram_path(ctx, whole, x, n, NULL, 0, QK_PATH_DEFAULT, &r, &pl);
        CHECK(K != NULL && pl.path == QK_PATH_MPS, "blocks: %s", qk_last_error());
        P = (double *)malloc(sizeof(double) * (size_t)(n * n));
        for (i = 0; i < n * n; i++) P[i] = 1.0;
        for (b = 0; b < q / B; b++) {
            for (i = 0; i < n; i++) memcpy(xb + i * B, x + i * q + b * B, sizeof(double) * B);
            Kb = gram_path(ctx, blk, xb, n, NULL, 0, QK_PATH_COMPLEX, &r, NULL);
            CHECK(Kb != NULL, "block statevector: %s", qk_last_error());
            if (Kb) for (i = 0; i < n * n; i++) P[i] *= Kb[i];
            free(Kb);
        }
        if (K) {
            double e = qk_test_max_diff(K, P, n * n);
            CHECK(e <= 1e-12, "100 qubits, ten blocks: MPS vs product of block statevector kernels %.3g", e);
        }
        free(K); free(P); free(xb); free(spec);
        qk_map_free(whole); qk_map_free(blk);
    }

    /* odd features = pi switch every linear entangler off ((pi - x_i)(pi - x_j) = 0): the state is
       a product, K equals the analytic path of the map without entanglers */
    {
        size_t cap = 100000, len = 0;
        char *spec = (char *)malloc(cap);
        qk_map *prod;
        double *y = qk_test_rand_data(7, q, 0.0, 3.0), *Ka;
        for (i = 0; i < n; i++) for (k = 1; k < q; k += 2) x[i * q + k] = QK__PI;
        for (i = 0; i < 7; i++) for (k = 1; k < q; k += 2) y[i * q + k] = QK__PI;
        len += (size_t)snprintf(spec + len, cap - len, "circuit(qubits=%d:", q);
        for (b = 0; b < 2; b++)
            for (k = 0; k < q; k++) len += (size_t)snprintf(spec + len, cap - len, " h(%d) p(%d, 2*x%d)", k, k, k);
        snprintf(spec + len, cap - len, ")");
        prod = qk_test_parse(spec, q);
        CHECK(prod->cls == QK_CLASS_PRODUCT, "reference map is a product");
        K = gram_path(ctx, m, x, n, y, 7, QK_PATH_DEFAULT, &r, &pl);
        Ka = gram_path(ctx, prod, x, n, y, 7, QK_PATH_DEFAULT, &r, NULL);
        CHECK(K && Ka && pl.path == QK_PATH_MPS, "entangler off: %s", qk_last_error());
        if (K && Ka) {
            double e = qk_test_max_diff(K, Ka, n * 7);
            CHECK(e <= 1e-12, "100 qubits, entangler off: MPS K(X,Y) vs analytic %.3g", e);
        }
        free(K); free(Ka); free(y); free(spec);
        qk_map_free(prod);
    }
    free(x);
    qk_map_free(m);
}

/* ---- output modes ---- */
typedef struct tiles { double *K; int64_t n, cols; int bad, calls, cancel_after; } tiles;
static int on_tile(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *t, int64_t ld, void *user)
{
    tiles *T = (tiles *)user;
    const double *v = (const double *)t;
    int64_t a, b;
    if (m != n && !(i0 + m == T->n || j0 + n == T->cols)) T->bad = 1;     /* square but at the edges */
    if (T->cols == T->n && j0 < i0) T->bad = 1;                          /* symmetric: upper tiles */
    for (a = 0; a < m; a++)
        for (b = 0; b < n; b++) T->K[(i0 + a) * T->cols + j0 + b] = v[a * ld + b];
    T->calls++;
    return T->cancel_after > 0 && T->calls >= T->cancel_after;
}
static int cancel_progress(int64_t done, int64_t total, void *user)
{
    (void)total; (void)user;
    return done > 0;
}

static void outputs(qk_ctx *ctx)
{
    const int q = 40;
    const int64_t n = 150, ny = 70;   /* three tile rows, the last partial */
    qk_map *m = qk_test_parse("zz(reps=1,ent=circular)", q);
    double *x = qk_test_rand_data(n, q, 0.0, 3.0), *y = qk_test_rand_data(ny, q, 0.0, 3.0);
    qk_result r;
    double *K = gram_path(ctx, m, x, n, NULL, 0, QK_PATH_DEFAULT, &r, NULL);
    double *KY = gram_path(ctx, m, x, n, y, ny, QK_PATH_DEFAULT, &r, NULL);
    qk_gram_desc d;
    tiles T;
    int64_t i;
    char path[256];
    CHECK(K && KY, "40-qubit circular: %s", qk_last_error());
    if (!K || !KY) goto done;
    /* K(X,Y) is a block of K(X u Y) */
    {
        double *xy = (double *)malloc(sizeof(double) * (size_t)((n + ny) * q)), *Kall;
        int64_t a, b;
        double e = 0;
        memcpy(xy, x, sizeof(double) * (size_t)(n * q));
        memcpy(xy + n * q, y, sizeof(double) * (size_t)(ny * q));
        Kall = gram_path(ctx, m, xy, n + ny, NULL, 0, QK_PATH_DEFAULT, &r, NULL);
        CHECK(Kall != NULL, "K(X u Y): %s", qk_last_error());
        if (Kall)
            for (a = 0; a < n; a++)
                for (b = 0; b < ny; b++) {
                    double v = fabs(Kall[a * (n + ny) + n + b] - KY[a * ny + b]);
                    if (v > e) e = v;
                }
        CHECK(e == 0.0, "K(X,Y) is not bitwise the block of K(X u Y): %.3g", e);
        free(Kall); free(xy);
    }
    /* tile callback: square tiles, upper triangle, same values */
    memset(&T, 0, sizeof T);
    T.n = n; T.cols = n;
    T.K = (double *)malloc(sizeof(double) * (size_t)(n * n));
    for (i = 0; i < n * n; i++) T.K[i] = NAN;
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = n; d.output = QK_OUTPUT_CALLBACK; d.tile_fn = on_tile; d.tile_user = &T; d.out_dtype = QK_F64;
    CHECK(qk_gram(ctx, m, &d) == QK_OK, "callback: %s", qk_last_error());
    {
        int64_t a, b;
        int same = 1;
        for (a = 0; a < n; a++)
            for (b = a; b < n; b++) if (T.K[a * n + b] != K[a * n + b]) same = 0;
        CHECK(same && !T.bad && T.calls == 6, "callback tiles: same %d, shape ok %d, calls %d (want 6)", same, !T.bad, T.calls);
    }
    /* cancel from the tile callback and from progress */
    T.calls = 0; T.cancel_after = 1;
    CHECK(qk_gram(ctx, m, &d) == QK_ERROR_CANCELLED, "callback cancel");
    free(T.K);
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = n; d.out = K; d.progress = cancel_progress;
    CHECK(qk_gram(ctx, m, &d) == QK_ERROR_CANCELLED && strstr(qk_last_error(), "cancelled"), "progress cancel: %s", qk_last_error());
    /* .npy stream through the CPU engine's writer: bitwise the host K, float64 and float32 */
    snprintf(path, sizeof path, "/tmp/qk_test_mps_%d.npy", (int)getpid());
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = n; d.y = y; d.n_y = ny; d.output = QK_OUTPUT_NPY; d.out_path = path; d.no_sync = 1;
    CHECK(qk_gram(ctx, m, &d) == QK_OK, "npy: %s", qk_last_error());
    {
        qk_array A;
        memset(&A, 0, sizeof A);
        CHECK(qk_npy_read(path, &A) == QK_OK && A.rows == n && A.cols == ny && qk_test_max_diff(A.data, KY, n * ny) == 0.0,
              "npy K(X,Y) differs from the host K");
        qk_array_free(&A);
        d.y = NULL; d.n_y = 0; d.out_dtype = QK_F32;
        CHECK(qk_gram(ctx, m, &d) == QK_OK, "npy f32: %s", qk_last_error());
        CHECK(qk_npy_read(path, &A) == QK_OK && A.rows == n && A.cols == n, "npy f32 read");
        if (A.data) {
            int same = 1;
            for (i = 0; i < n * n; i++) if ((float)K[i] != (float)A.data[i]) same = 0;
            CHECK(same, "npy float32 K(X,X) differs from the host K rounded");
        }
        qk_array_free(&A);
        remove(path);
    }
done:
    free(K); free(KY); free(x); free(y);
    qk_map_free(m);
}

/* ---- planner and errors ---- */
static void planning(qk_ctx *ctx)
{
    qk_gram_desc d;
    qk_plan p;
    qk_map *m;
    double x[64];
    int i;
    for (i = 0; i < 64; i++) x[i] = 0.1 * i;
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = 1; d.out = x;
    /* small zz linear: the statevector is cheaper; q = 24: MPS */
    m = qk_test_parse("zz(reps=2,ent=linear)", 8);
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_OK && p.path == QK_PATH_COMPLEX, "zz8 linear: path %d", (int)p.path);
    qk_map_free(m);
    m = qk_test_parse("zz(reps=2,ent=linear)", 24);
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_OK && p.path == QK_PATH_MPS && p.mps_bond == 4 && p.mps_span == 1,
          "zz24 linear: path %d bond %d span %d", (int)p.path, p.mps_bond, p.mps_span);
    d.path = QK_PATH_REAL;   /* forcing the statevector */
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_OK && p.path == QK_PATH_COMPLEX, "zz24 forced statevector: path %d", (int)p.path);
    d.path = QK_PATH_DEFAULT;
    qk_map_free(m);
    /* circular: folded order keeps gates within two sites */
    m = qk_test_parse("zz(reps=1,ent=circular)", 40);
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_OK && p.path == QK_PATH_MPS && p.mps_bond == 4, "zz40 circular: %s", qk_last_error());
    d.path = QK_PATH_COMPLEX;
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_ERROR_TOO_MANY_QUBITS && strstr(qk_last_error(), "MPS"), "40 qubits forced statevector: %s", qk_last_error());
    d.path = (qk_path)9;
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_ERROR_INVALID_ARGUMENT, "unknown path");
    d.path = QK_PATH_DEFAULT;
    qk_map_free(m);
    /* iqp is all-to-all: planned as statevector where it fits, refused by MPS where the bound is big */
    m = qk_test_parse("iqp", 12);
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_OK && p.path == QK_PATH_COMPLEX, "iqp12: path %d", (int)p.path);
    qk_map_free(m);
    m = qk_test_parse("iqp", 16);
    d.path = QK_PATH_MPS;
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "not local enough") &&
          strstr(qk_last_error(), "QK_MPS_MAX_BOND"), "iqp16 forced mps: %s", qk_last_error());
    CHECK(qk_gram(ctx, m, &d) == QK_ERROR_UNSUPPORTED, "iqp16 forced mps: qk_gram must refuse too");
    qk_map_free(m);
    /* a map whose bond is too large: zz linear with 7 reps (2^7 = 128 > 64) */
    m = qk_test_parse("zz(reps=7,ent=linear)", 16);
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "128"), "zz reps 7 forced mps: %s", qk_last_error());
    qk_map_free(m);
    /* product and dense maps */
    m = qk_test_parse("angle", 50);
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "product"), "angle forced mps: %s", qk_last_error());
    d.path = QK_PATH_DEFAULT;
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_OK && p.path == QK_PATH_ANALYTIC, "angle 50: analytic");
    qk_map_free(m);
    m = qk_test_parse("amplitude", 8);
    d.path = QK_PATH_MPS;
    CHECK(qk_plan_make(ctx, m, &d, &p) == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "dense"), "amplitude forced mps: %s", qk_last_error());
    d.path = QK_PATH_DEFAULT;
    qk_map_free(m);
    /* beyond 30 qubits, non-local maps are refused when made, naming the bound */
    m = NULL;
    CHECK(qk_map_parse("zz(ent=full)", 40, &m) == QK_ERROR_TOO_MANY_QUBITS && m == NULL && strstr(qk_last_error(), "MPS path"),
          "zz full 40: %s", qk_last_error());   /* all-to-all: refused before its ops are built */
    CHECK(qk_map_parse("zz(reps=7,ent=linear)", 40, &m) == QK_ERROR_TOO_MANY_QUBITS && strstr(qk_last_error(), "QK_MPS_MAX_BOND"),
          "zz reps 7 at 40 qubits: %s", qk_last_error());   /* local but bond 128: refused with its bound */
    {   /* long-range gates beyond 30 qubits: blocks {0, 39} (no data) and {5, 20, 21}, so K is the
           3-qubit kernel of the second block, by the statevector */
        qk_map *blk = qk_test_parse("circuit(qubits=3: h(0) cx(0,1) rzz(1,2, 2*x1) ry(2, x2))", 3);
        double *x40 = qk_test_rand_data(9, 40, 0.0, 3.0), x3[27], *K40, *K3;
        qk_result r;
        int a;
        m = qk_test_parse("circuit(qubits=40: h(0) h(5) cx(0,39) cx(5,20) rzz(20,21, 2*x20) ry(21, x21))", 40);
        for (a = 0; a < 9; a++) { x3[3 * a] = x40[a * 40 + 5]; x3[3 * a + 1] = x40[a * 40 + 20]; x3[3 * a + 2] = x40[a * 40 + 21]; }
        K40 = gram_path(ctx, m, x40, 9, NULL, 0, QK_PATH_DEFAULT, &r, &p);
        K3 = gram_path(ctx, blk, x3, 9, NULL, 0, QK_PATH_COMPLEX, &r, NULL);
        CHECK(K40 && K3 && p.path == QK_PATH_MPS && p.mps_span >= 15 && qk_test_max_diff(K40, K3, 81) <= 1e-12,
              "40 qubits, long-range gates: MPS vs the 3-qubit block: path %d span %d diff %.3g", (int)p.path, p.mps_span, K40 && K3 ? qk_test_max_diff(K40, K3, 81) : -1.0);
        free(K40); free(K3); free(x40);
        qk_map_free(m); qk_map_free(blk);
        m = NULL;
    }
    CHECK(qk_map_parse("hea(layers=2)", 200, &m) == QK_OK, "hea 200 qubits: %s", qk_last_error());
    qk_map_free(m);
    /* a CUDA device injected: the MPS path is planned on the GPU engine (qk_cuda.cu's MPS kernels),
       its device memory counted (the padded MPS in the compute precision, K resident or slabs) */
    {
        qk_device_info info;
        char buf[2048];
        int64_t nmax;
        memset(&info, 0, sizeof info);
        info.present = 1; info.free_bytes = info.total_bytes = (size_t)80 << 30; info.cc_major = 9;
        info.smem_per_block_optin = 227 << 10;
        snprintf(info.name, sizeof info.name, "injected");
        m = qk_test_parse("zz(reps=2,ent=linear)", 64);
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_OK && p.backend == QK_BACKEND_CUDA && p.path == QK_PATH_MPS &&
              p.mps_bond == 4 && p.precision == QK_PRECISION_FP32 && strstr(p.config, "register kernel chi 4"),
              "gpu present, 64 qubits: %s (backend %d path %d config %s)", qk_last_error(), (int)p.backend, (int)p.path, p.config);
        CHECK(p.bytes_states == (size_t)((double)d.n_x * 64 * 2 * 16 * 2 * 4) && p.k_resident == 1 &&
              p.bytes_total == p.bytes_states + p.bytes_out, "gpu MPS bytes: states %zu resident %d", p.bytes_states, p.k_resident);
        qk_plan_describe(&p, buf, sizeof buf);
        CHECK(strstr(buf, "path mps") != NULL, "gpu MPS plan description: %s", buf);
        d.output = QK_OUTPUT_DEVICE;
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_OK && p.backend == QK_BACKEND_CUDA && p.path == QK_PATH_MPS && p.bytes_out == 0,
              "MPS with DEVICE output on the GPU: %s", qk_last_error());
        d.output = QK_OUTPUT_HOST;
        d.precision = QK_PRECISION_FP64;
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_OK && p.bytes_states == (size_t)((double)d.n_x * 64 * 2 * 16 * 2 * 8),
              "gpu MPS fp64 bytes %zu", p.bytes_states);
        d.precision = QK_PRECISION_DEFAULT;
        /* too little device memory: a clear error */
        info.free_bytes = 1000;
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_ERROR_DEVICE_OUT_OF_MEMORY && strstr(qk_last_error(), "MPS"),
              "gpu MPS out of memory: %s", qk_last_error());
        info.free_bytes = (size_t)80 << 30;
        /* VRAM estimator: half the budget over the padded MPS of one sample */
        nmax = qk_max_samples_mps(&info, 0.5, m, QK_PRECISION_FP32, 0);
        CHECK(nmax == (int64_t)floor(0.25 * (double)((size_t)80 << 30) / (64.0 * 2 * 16 * 2 * 4)), "qk_max_samples_mps %lld", (long long)nmax);
        CHECK(qk_max_samples_mps(&info, 0.5, m, QK_PRECISION_FP32, 2) == (int64_t)floor(0.25 * (double)((size_t)80 << 30) / (64.0 * 2 * 4 * 2 * 4)),
              "qk_max_samples_mps with max_bond 2");
        qk_map_free(m);
        /* below 31 qubits the cheaper path on the GPU: statevector at 8 qubits, MPS at 24 */
        m = qk_test_parse("zz(reps=2,ent=linear)", 8);
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_OK && p.backend == QK_BACKEND_CUDA && p.path == QK_PATH_COMPLEX,
              "gpu 8 qubits: path %d", (int)p.path);
        d.path = QK_PATH_MPS;
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_OK && p.path == QK_PATH_MPS, "gpu 8 qubits forced mps: %s", qk_last_error());
        d.path = QK_PATH_DEFAULT;
        qk_map_free(m);
        m = qk_test_parse("zz(reps=2,ent=linear)", 24);
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_OK && p.backend == QK_BACKEND_CUDA && p.path == QK_PATH_MPS,
              "gpu 24 qubits: path %d", (int)p.path);
        qk_map_free(m);
        /* bond 16: the warp kernel; its shared memory checked against the device */
        m = qk_test_parse("zz(reps=2,ent=circular)", 40);
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_OK && p.path == QK_PATH_MPS && strstr(p.config, "warp per pair, chi 16"),
              "gpu bond 16: %s", p.config);
        info.smem_per_block_optin = 4096;
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "shared memory"),
              "gpu bond 16 without the shared memory: %s", qk_last_error());
        info.smem_per_block_optin = 227 << 10;
        qk_map_free(m);
        /* the same errors as on the CPU: MPS forced on a product map, an unknown path */
        m = qk_test_parse("angle", 8);
        d.path = QK_PATH_MPS;
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "product"),
              "gpu present, angle forced mps: %s", qk_last_error());
        d.path = (qk_path)7;
        CHECK(qk_plan_for_device(&info, 0.85, m, &d, &p) == QK_ERROR_INVALID_ARGUMENT, "gpu present, unknown path");
        d.path = QK_PATH_DEFAULT;
        qk_map_free(m);
    }
}

/* threads do not change K (every pair is computed the same way) */
static void threads_agree(void)
{
    qk_ctx *c1 = qk_test_cpu_ctx(1), *c2 = qk_test_cpu_ctx(2);
    qk_map *m = qk_test_parse("hea(layers=1,rot=yz,ent=cnot)", 33);
    double *x = qk_test_rand_data(45, 33, -1, 1);
    qk_result r;
    double *K1 = gram_path(c1, m, x, 45, NULL, 0, QK_PATH_DEFAULT, &r, NULL);
    double *K2 = gram_path(c2, m, x, 45, NULL, 0, QK_PATH_DEFAULT, &r, NULL);
    CHECK(K1 && K2 && qk_test_max_diff(K1, K2, 45 * 45) == 0.0, "1 vs 2 threads differ");
    free(K1); free(K2); free(x);
    qk_map_free(m);
    qk_ctx_destroy(c1); qk_ctx_destroy(c2);
}

/* Truncation on request (mps_max_bond / mps_cutoff, docs/mps.md): every pair within the stated
   bound |K_ij - K~_ij| <= sqrt(eps_i) + sqrt(eps_j) of the exact K (statevector engine), eps from
   mps_discarded; the truncation really drops something (some eps > 0, K~ != K); unit diagonal
   (renormalised states); eps == 0 and K exact when max_bond >= the exact bound; clear errors. */
static double *gram_trunc(qk_ctx *ctx, const qk_map *m, const double *x, int64_t nx, const double *y, int64_t ny,
                          int max_bond, double cutoff, double *eps, qk_result *res, qk_plan *plan)
{
    int64_t cols = y ? ny : nx, i;
    double *K = (double *)malloc(sizeof(double) * (size_t)(nx * cols));
    qk_gram_desc d;
    for (i = 0; i < nx * cols; i++) K[i] = NAN;
    for (i = 0; i < nx + (y ? ny : 0); i++) eps[i] = NAN;
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = nx; d.y = y; d.n_y = ny; d.out = K; d.out_dtype = QK_F64; d.path = QK_PATH_MPS;
    d.mps_max_bond = max_bond; d.mps_cutoff = cutoff; d.mps_discarded = eps;
    if (plan && qk_plan_make(ctx, m, &d, plan) != QK_OK) { *res = QK_ERROR_INVALID_ARGUMENT; free(K); return NULL; }
    *res = qk_gram(ctx, m, &d);
    if (*res != QK_OK) { free(K); return NULL; }
    return K;
}

static void trunc_case(qk_ctx *ctx, const char *spec, int q, int max_bond, double cutoff, int must_drop)
{
    qk_map *m = qk_test_parse(spec, q);
    const int64_t nx = 9, ny = 5;
    double *x = qk_test_rand_data(nx, q, 0, 6.283), *y = qk_test_rand_data(ny, q, 0, 6.283);
    double eps[20], worst = 0, moved = 0, emax = 0;
    qk_result r;
    qk_plan plan;
    double *Ke = gram_path(ctx, m, x, nx, NULL, 0, QK_PATH_COMPLEX, &r, NULL);
    double *Kt = gram_trunc(ctx, m, x, nx, NULL, 0, max_bond, cutoff, eps, &r, &plan);
    double *Kxy = gram_path(ctx, m, x, nx, y, ny, QK_PATH_COMPLEX, &r, NULL);
    double *Ktxy;
    double eps2[20];
    int64_t i, j;
    CHECK(Ke && Kt && Kxy, "%s q=%d max_bond %d cutoff %g: %s", spec, q, max_bond, cutoff, qk_last_error());
    if (!Ke || !Kt || !Kxy) goto out;
    CHECK(plan.path == QK_PATH_MPS && plan.mps_truncate == 1 && plan.mps_bond <= (max_bond ? max_bond : plan.mps_exact_bond),
          "%s: plan path %d truncate %d bond %d (exact %d)", spec, (int)plan.path, plan.mps_truncate, plan.mps_bond, plan.mps_exact_bond);
    for (i = 0; i < nx; i++) {
        CHECK(eps[i] >= 0 && eps[i] <= 1, "%s: eps[%lld] = %g", spec, (long long)i, eps[i]);
        if (eps[i] > emax) emax = eps[i];
        CHECK(fabs(Kt[i * nx + i] - 1) <= 1e-10, "%s: truncated K diagonal %.3e (states not renormalised)", spec, Kt[i * nx + i]);
        for (j = 0; j < nx; j++) {
            double b = sqrt(eps[i]) + sqrt(eps[j]) + 1e-10, e = fabs(Kt[i * nx + j] - Ke[i * nx + j]);
            if (e - b > worst) worst = e - b;
            if (e > moved) moved = e;
            CHECK(e <= b, "%s q=%d max_bond %d: |K~ - K|[%lld][%lld] = %.3e > bound %.3e", spec, q, max_bond, (long long)i, (long long)j, e, b);
        }
    }
    if (must_drop) {
        CHECK(emax > 1e-8, "%s q=%d max_bond %d cutoff %g: nothing dropped (max eps %.3e)", spec, q, max_bond, cutoff, emax);
        CHECK(moved > 1e-9, "%s: truncated K equals the exact K (max diff %.3e)", spec, moved);
    }
    Ktxy = gram_trunc(ctx, m, x, nx, y, ny, max_bond, cutoff, eps2, &r, NULL);
    CHECK(Ktxy != NULL, "%s K(X,Y) truncated: %s", spec, qk_last_error());
    if (Ktxy) {
        for (i = 0; i < nx; i++) CHECK(eps2[i] == eps[i], "%s: eps of X differs between K(X,X) and K(X,Y)", spec);
        for (i = 0; i < nx; i++)
            for (j = 0; j < ny; j++) {
                double b = sqrt(eps2[i]) + sqrt(eps2[nx + j]) + 1e-10, e = fabs(Ktxy[i * ny + j] - Kxy[i * ny + j]);
                CHECK(e <= b, "%s K(X,Y): |K~ - K|[%lld][%lld] = %.3e > bound %.3e", spec, (long long)i, (long long)j, e, b);
            }
        free(Ktxy);
    }
    printf("  %-34s q=%2d max_bond %2d cutoff %-6g: bond %2d (exact %2d), max eps %.2e, max |K~-K| %.2e\n", spec, q, max_bond, cutoff,
           plan.mps_bond, plan.mps_exact_bond, emax, moved);
out:
    free(Ke); free(Kt); free(Kxy); free(x); free(y);
    qk_map_free(m);
}

static void truncation(qk_ctx *ctx)
{
    qk_map *m;
    double *x, *Ke, *Kt, eps[40];
    qk_result r;
    qk_plan plan;
    int64_t i;
    trunc_case(ctx, "zz(reps=2,ent=circular)", 10, 4, 0, 1);
    trunc_case(ctx, "zz(reps=2,ent=circular)", 10, 2, 0, 1);
    trunc_case(ctx, "zz(reps=3,ent=linear)", 11, 4, 0, 1);
    trunc_case(ctx, "zz(reps=2,ent=sca)", 9, 3, 0, 1);
    trunc_case(ctx, "hea(layers=2)", 10, 4, 0, 1);
    trunc_case(ctx, "zz(reps=2,ent=full)", 8, 4, 0, 1);     /* exact bound 16, all-to-all gates */
    trunc_case(ctx, "zz(reps=2,ent=circular)", 10, 0, 1e-3, 0);
    trunc_case(ctx, "zz(reps=2,ent=circular)", 10, 8, 1e-4, 1);
    /* max_bond at or above the exact bound: nothing is truncated, eps exactly 0, K exact */
    m = qk_test_parse("zz(reps=2,ent=linear)", 12);
    x = qk_test_rand_data(11, 12, 0, 6.283);
    Ke = gram_path(ctx, m, x, 11, NULL, 0, QK_PATH_COMPLEX, &r, NULL);
    Kt = gram_trunc(ctx, m, x, 11, NULL, 0, 4, 0, eps, &r, &plan);
    CHECK(Ke && Kt, "max_bond = bound: %s", qk_last_error());
    if (Ke && Kt) {
        CHECK(plan.mps_truncate == 0 && plan.mps_bond == 4, "max_bond = bound: plan truncate %d bond %d", plan.mps_truncate, plan.mps_bond);
        for (i = 0; i < 11; i++) CHECK(eps[i] == 0, "max_bond = bound: eps[%lld] = %g", (long long)i, eps[i]);
        CHECK(qk_test_max_diff(Ke, Kt, 121) <= 1e-12, "max_bond = bound: K differs by %.3e", qk_test_max_diff(Ke, Kt, 121));
    }
    free(Kt);
    Kt = gram_trunc(ctx, m, x, 11, NULL, 0, 64, 0, eps, &r, NULL);
    CHECK(Kt && qk_test_max_diff(Ke, Kt, 121) <= 1e-12 && eps[3] == 0, "max_bond 64 > bound: K or eps not exact");
    free(Kt);
    /* an exact run reports zeros too */
    Kt = gram_trunc(ctx, m, x, 11, NULL, 0, 0, 0, eps, &r, NULL);
    CHECK(Kt && eps[0] == 0 && eps[10] == 0, "exact run: eps not zero");
    free(Kt);
    /* invalid requests */
    {
        const int bad_bond[] = {-1, QK_MPS_MAX_BOND + 1};
        const double bad_cut[] = {-0.1, 1.0, 2.0, NAN};
        int k;
        for (k = 0; k < 2; k++) {
            Kt = gram_trunc(ctx, m, x, 11, NULL, 0, bad_bond[k], 0, eps, &r, NULL);
            CHECK(!Kt && r == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "mps_max_bond"), "max_bond %d: %d %s", bad_bond[k], (int)r, qk_last_error());
            free(Kt);
        }
        for (k = 0; k < 4; k++) {
            Kt = gram_trunc(ctx, m, x, 11, NULL, 0, 0, bad_cut[k], eps, &r, NULL);
            CHECK(!Kt && r == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "mps_cutoff"), "cutoff %g: %d %s", bad_cut[k], (int)r, qk_last_error());
            free(Kt);
        }
    }
    free(Ke); free(x);
    qk_map_free(m);
    /* the plan states the bound */
    {
        qk_gram_desc d;
        char buf[2048];
        m = qk_test_parse("zz(reps=2,ent=circular)", 40);
        x = qk_test_rand_data(4, 40, 0, 6.283);
        memset(&d, 0, sizeof d);
        d.x = x; d.n_x = 4; d.out = eps; d.out_dtype = QK_F64; d.mps_max_bond = 4;
        r = qk_plan_make(ctx, m, &d, &plan);
        CHECK(r == QK_OK && plan.path == QK_PATH_MPS && plan.mps_bond == 4 && plan.mps_exact_bond == 16, "plan with max_bond: %d bond %d exact %d",
              (int)r, plan.mps_bond, plan.mps_exact_bond);
        qk_plan_describe(&plan, buf, sizeof buf);
        CHECK(strstr(buf, "truncated; exact bound 16") && strstr(buf, "sqrt(eps_i) + sqrt(eps_j)"), "plan description: %s", buf);
        free(x);
        qk_map_free(m);
    }
}

/* A cancel while the MPS are built: 60-qubit linear zz, K(X,Y) of 4000 samples against one, so
   that building the 4001 MPS is nearly all the work. The engine polls the progress callback
   while it builds, so a callback that cancels at its first call stops the job in a small
   fraction of the uncancelled time (before, the first call came after every MPS was built).
   Bounds: a quarter of the uncancelled run's wall time and of its CPU time (all threads; the
   latency is a poll interval, a few ms of work, plus the unwind). The CPU time holds on a loaded
   machine; the wall time is compared with an uncancelled run just before, best of three pairs.
   K is not written, the callback is not called again, and a later job runs. */

static void cancel_while_building(void)
{
    const int q = 60;
    const int64_t n = 4000;
    qk_ctx *ctx = qk_test_cpu_ctx(2);
    qk_map *m = qk_test_parse("zz(reps=2,ent=linear)", q);
    double *x = qk_test_rand_data(n + 1, q, 0.0, 3.0), *K = (double *)malloc(sizeof(double) * (size_t)n), KX[9];
    qk_gram_desc d;
    qk_plan plan;
    double full[2], cut[2], best[2] = {1e30, 1e30};
    int64_t i;
    int try_, calls = 0, untouched = 1;
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = n; d.y = x + n * q; d.n_y = 1; d.out = K; d.progress_user = &calls;
    CHECK(qk_plan_make(ctx, m, &d, &plan) == QK_OK && plan.path == QK_PATH_MPS, "cancel case: the MPS path (%s)", qk_last_error());
    qk_test_perturb(0);
    for (try_ = 0; try_ < 3 && (best[0] >= 0.25 || best[1] >= 0.25); try_++) {
        qk_result r;
        d.progress = NULL;
        CHECK(qk_test_timed_gram(ctx, m, &d, full) == QK_OK, "linear zz %d qubits, %lld samples: %s", q, (long long)n, qk_last_error());
        for (i = 0; i < n; i++) K[i] = -7.0;
        d.progress = qk_test_cancel_first;
        calls = 0;
        r = qk_test_timed_gram(ctx, m, &d, cut);
        CHECK(r == QK_ERROR_CANCELLED && calls == 1 && strstr(qk_last_error(), "while the states were built") != NULL,
              "MPS: cancel while building: %d, %d calls, %s", (int)r, calls, qk_last_error());
        for (i = 0; i < n; i++) if (K[i] != -7.0) untouched = 0;
        printf("MPS: cancel while building %.1f ms, %.1f ms CPU (uncancelled %.1f ms, %.1f ms CPU)\n",
               cut[0] * 1e3, cut[1] * 1e3, full[0] * 1e3, full[1] * 1e3);
        if (cut[0] / full[0] < best[0]) best[0] = cut[0] / full[0];
        if (cut[1] / full[1] < best[1]) best[1] = cut[1] / full[1];
    }
    CHECK(best[0] < 0.25 && best[1] < 0.25, "MPS: cancelled after %.0f%% of the uncancelled wall time, %.0f%% of its CPU time: the MPS build does not poll",
          100 * best[0], 100 * best[1]);
    CHECK(untouched, "MPS: a job cancelled while its MPS were built wrote K");
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = 3; d.out = KX; d.path = QK_PATH_MPS;
    CHECK(qk_gram(ctx, m, &d) == QK_OK && fabs(KX[0] - 1.0) < 1e-12, "MPS after a cancel: %s", qk_last_error());
    free(x); free(K);
    qk_test_perturb(1);
    qk_map_free(m);
    qk_ctx_destroy(ctx);
}

#define SECTION(call) do { double t0_ = qk_test_now(CLOCK_MONOTONIC); call; printf("%-16s %.2f s\n", #call, qk_test_now(CLOCK_MONOTONIC) - t0_); } while (0)

int main(void)
{
    qk_ctx *ctx;
    qk_test_seed();
    ctx = qk_test_cpu_ctx(0);
    bounds();
    SECTION(families(ctx));
    SECTION(tiny_columns(ctx));
    SECTION(big(ctx));
    SECTION(outputs(ctx));
    SECTION(planning(ctx));
    SECTION(threads_agree());
    SECTION(cancel_while_building());
    SECTION(truncation(ctx));
    qk_ctx_destroy(ctx);
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
