/* K from given matrix product states (qk_gram_mps_states, docs/states.md "MPS input"):
   - qk's own MPS of a map (the engine's builder, unpacked into per-sample site tensors) given
     back give the map's MPS-path K bit for bit (both layouts, 1 and 2 threads), and the
     statevector path's K at 1e-12;
   - random MPS of per-sample bonds against the dense statevectors contracted from the same
     tensors (1e-12; complex64 at 1e-5; real tensors), normalize = 1;
   - every CPU output (host, f32 host, tile callback, .npy) the same K;
   - 165 qubits: product states hidden behind random gauge transforms on padded bonds, against
     the product of the one-qubit overlaps (1e-12);
   - errors naming the side, sample and site, the output untouched; the plan.
   Fresh random data each run (seed printed; QK_TEST_SEED=... reproduces it). */
#define _POSIX_C_SOURCE 200809L
#define QK_IMPLEMENTATION
#include "qk.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../qk_test.h"

/* n samples of q sites: t[i * q + s] holds bond[i][s] x 2 x bond[i][s+1] complex (interleaved) in
   the LPR layout; ptr the same pointers as the API takes them */
typedef struct tmps {
    int q;
    int64_t n;
    double **t;
    const void **ptr;
    int *bond;
} tmps;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) { printf("out of memory\n"); exit(2); }
    return p;
}

static void tmps_alloc_sites(tmps *m)
{
    int64_t i;
    int s;
    m->t = (double **)xmalloc(sizeof(double *) * (size_t)(m->n * m->q));
    m->ptr = (const void **)xmalloc(sizeof(void *) * (size_t)(m->n * m->q));
    for (i = 0; i < m->n; i++)
        for (s = 0; s < m->q; s++) {
            const int *b = m->bond + i * (m->q + 1);
            m->t[i * m->q + s] = (double *)xmalloc(sizeof(double) * 2 * (size_t)(b[s] * 2 * b[s + 1]));
            m->ptr[i * m->q + s] = m->t[i * m->q + s];
        }
}

static void tmps_free(tmps *m)
{
    int64_t k;
    for (k = 0; k < m->n * m->q; k++) free(m->t[k]);
    free(m->t);
    free(m->ptr);
    free(m->bond);
}

/* qk's own MPS of map m on x (the engine's lane layout) as per-sample tensors (bonds: the
   program's, padded where a sample's rank is lower) */
static tmps tmps_of_map(const qk_map *m, const double *x, int64_t n)
{
    qk__mps_prog p;
    tmps t;
    double *lanes;
    int64_t i;
    int s, l, a, r;
    if (qk__mps_prog_make(m, &p) != QK_OK) { printf("prog: %s\n", qk_last_error()); exit(2); }
    lanes = qk__mps_states(&p, m, x, n, 2, NULL, NULL, NULL);
    if (!lanes) { printf("mps states: %s\n", qk_last_error()); exit(2); }
    t.q = p.q;
    t.n = n;
    t.bond = (int *)xmalloc(sizeof(int) * (size_t)(n * (p.q + 1)));
    for (i = 0; i < n; i++)
        for (s = 0; s <= p.q; s++) t.bond[i * (p.q + 1) + s] = p.D[s];
    tmps_alloc_sites(&t);
    for (i = 0; i < n; i++) {
        const double *g = lanes + (i / QK__NJ) * p.group;
        const int lane = (int)(i % QK__NJ);
        for (s = 0; s < p.q; s++) {
            const int dl = p.D[s], dr = p.D[s + 1];
            double *o = t.t[i * p.q + s];
            for (l = 0; l < dl; l++)
                for (a = 0; a < 2; a++)
                    for (r = 0; r < dr; r++) {
                        const size_t e = ((size_t)l * 2 + a) * dr + r;
                        o[2 * e] = g[p.off[s] + lane + e * 2 * QK__NJ];
                        o[2 * e + 1] = g[p.off[s] + lane + e * 2 * QK__NJ + QK__NJ];
                    }
        }
    }
    free(lanes);
    qk__mps_prog_free(&p);
    return t;
}

/* random tensors, entries uniform in [-1, 1) (+ i [-1, 1) unless real), bonds per sample random in
   1 .. min(maxb, 2^min(s, q - s)) */
static tmps tmps_random(int q, int64_t n, int maxb, int real)
{
    tmps t;
    int64_t i, k;
    int s;
    t.q = q;
    t.n = n;
    t.bond = (int *)xmalloc(sizeof(int) * (size_t)(n * (q + 1)));
    for (i = 0; i < n; i++)
        for (s = 0; s <= q; s++) {
            int cap = maxb, sm = s < q - s ? s : q - s;
            if (sm < 20 && (1 << sm) < cap) cap = 1 << sm;
            t.bond[i * (q + 1) + s] = 1 + (int)(qk_test_urand() * cap);
            if (t.bond[i * (q + 1) + s] > cap) t.bond[i * (q + 1) + s] = cap;
        }
    tmps_alloc_sites(&t);
    for (i = 0; i < n; i++)
        for (s = 0; s < q; s++) {
            const int *b = t.bond + i * (q + 1);
            for (k = 0; k < (int64_t)b[s] * 2 * b[s + 1]; k++) {
                t.t[i * q + s][2 * k] = qk_test_uniform(-1, 1);
                t.t[i * q + s][2 * k + 1] = real ? 0.0 : qk_test_uniform(-1, 1);
            }
        }
    return t;
}

/* sample i contracted to its 2^q amplitudes, bit s of the index = site s, normalised */
static void tmps_dense(const tmps *t, int64_t i, double *out)
{
    const int q = t->q;
    const int64_t D = (int64_t)1 << q;
    const int *b = t->bond + i * (q + 1);
    int64_t z;
    long double nn = 0;
    double vr[64], vi[64], wr[64], wi[64];
    for (z = 0; z < D; z++) {
        int s, l, r;
        vr[0] = 1; vi[0] = 0;
        for (s = 0; s < q; s++) {
            const int a = (int)((z >> s) & 1), dl = b[s], dr = b[s + 1];
            const double *A = t->t[i * q + s];
            for (r = 0; r < dr; r++) {
                double sr = 0, si = 0;
                for (l = 0; l < dl; l++) {
                    const size_t e = ((size_t)l * 2 + a) * dr + r;
                    sr += vr[l] * A[2 * e] - vi[l] * A[2 * e + 1];
                    si += vr[l] * A[2 * e + 1] + vi[l] * A[2 * e];
                }
                wr[r] = sr; wi[r] = si;
            }
            memcpy(vr, wr, sizeof(double) * (size_t)dr);
            memcpy(vi, wi, sizeof(double) * (size_t)dr);
        }
        out[2 * z] = vr[0];
        out[2 * z + 1] = vi[0];
        nn += (long double)vr[0] * vr[0] + (long double)vi[0] * vi[0];
    }
    for (z = 0; z < 2 * D; z++) out[z] = (double)(out[z] / sqrtl(nn));
}

/* the same tensors in another layout or type: LRP (layout 1), or complex64 / float64 (real part) */
static void *tmps_convert(const tmps *t, int layout, qk_state_type type, const void ***ptr_out)
{
    int64_t i, tot = 0, at = 0;
    int s, l, a, r;
    const void **ptr = (const void **)xmalloc(sizeof(void *) * (size_t)(t->n * t->q));
    char *buf;
    const int es = type == QK_STATE_C64 || type == QK_STATE_F64 ? 8 : type == QK_STATE_F32 ? 4 : 16;
    for (i = 0; i < t->n; i++)
        for (s = 0; s < t->q; s++) tot += (int64_t)t->bond[i * (t->q + 1) + s] * 2 * t->bond[i * (t->q + 1) + s + 1];
    buf = (char *)xmalloc((size_t)tot * (size_t)es);
    for (i = 0; i < t->n; i++)
        for (s = 0; s < t->q; s++) {
            const int dl = t->bond[i * (t->q + 1) + s], dr = t->bond[i * (t->q + 1) + s + 1];
            const double *A = t->t[i * t->q + s];
            char *o = buf + at * es;
            ptr[i * t->q + s] = o;
            for (l = 0; l < dl; l++)
                for (a = 0; a < 2; a++)
                    for (r = 0; r < dr; r++) {
                        const size_t e = ((size_t)l * 2 + a) * dr + r;
                        const size_t k = layout == QK_MPS_LRP ? ((size_t)l * dr + r) * 2 + a : e;
                        if (type == QK_STATE_C64) { float v[2] = {(float)A[2 * e], (float)A[2 * e + 1]}; memcpy(o + k * 8, v, 8); }
                        else if (type == QK_STATE_F64) memcpy(o + k * 8, &A[2 * e], 8);
                        else if (type == QK_STATE_F32) { float v = (float)A[2 * e]; memcpy(o + k * 4, &v, 4); }
                        else memcpy(o + k * 16, &A[2 * e], 16);
                    }
            at += (int64_t)dl * 2 * dr;
        }
    *ptr_out = ptr;
    return buf;
}

static double *nan_k(int64_t n)
{
    double *K = (double *)xmalloc(sizeof(double) * (size_t)n);
    int64_t i;
    for (i = 0; i < n; i++) K[i] = NAN;
    return K;
}

static void desc_of(qk_mps_states_desc *d, const tmps *a, const tmps *b)
{
    memset(d, 0, sizeof *d);
    d->n_sites = a->q;
    d->a = a->ptr; d->a_bonds = a->bond; d->n_a = a->n;
    if (b) { d->b = b->ptr; d->b_bonds = b->bond; d->n_b = b->n; }
}

/* K of given MPS into a host buffer (NaN-poisoned); r the result */
static double *gram_mps(qk_ctx *ctx, const qk_mps_states_desc *d, qk_dtype dt, qk_result *r)
{
    const int64_t cols = d->b ? d->n_b : d->n_a;
    double *K = nan_k(d->n_a * cols);
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.out = K;
    g.out_dtype = dt ? dt : QK_F64;
    *r = qk_gram_mps_states(ctx, d, &g);
    return K;
}

/* ---- qk's own MPS given back ---- */
static void own_case(qk_ctx *ctx, qk_ctx *ctx1, const char *spec, int q, int64_t nx, int64_t ny)
{
    qk_map *m = qk_test_parse(spec, q);
    double *X = qk_test_rand_data(nx, m->n_features, -1.5, 1.5), *Y = qk_test_rand_data(ny, m->n_features, -1.5, 1.5);
    tmps tx = tmps_of_map(m, X, nx), ty = tmps_of_map(m, Y, ny);
    qk_mps_states_desc d;
    qk_gram_desc g;
    qk_result r;
    int side;
    for (side = 0; side < 2; side++) {   /* K(X,X), then K(X,Y) */
        const int64_t cols = side ? ny : nx;
        double *K0 = nan_k(nx * cols), *K1, *K2, *Ksv = nan_k(nx * cols), *Kl;
        const void **pl_a, **pl_b = NULL;
        void *ba, *bb = NULL;
        memset(&g, 0, sizeof g);
        g.x = X; g.n_x = nx; g.y = side ? Y : NULL; g.n_y = side ? ny : 0; g.out = K0; g.out_dtype = QK_F64; g.path = QK_PATH_MPS;
        CHECK(qk_gram(ctx, m, &g) == QK_OK, "%s q=%d: %s", spec, q, qk_last_error());
        g.out = Ksv;
        g.path = m->cls == QK_CLASS_REAL ? QK_PATH_REAL : QK_PATH_COMPLEX;
        CHECK(qk_gram(ctx, m, &g) == QK_OK, "%s q=%d statevector: %s", spec, q, qk_last_error());
        desc_of(&d, &tx, side ? &ty : NULL);
        K1 = gram_mps(ctx, &d, QK_F64, &r);
        CHECK(r == QK_OK, "%s q=%d: %s", spec, q, qk_last_error());
        CHECK(memcmp(K0, K1, sizeof(double) * (size_t)(nx * cols)) == 0, "%s q=%d side %d: given MPS != the map's MPS path bit for bit (max diff %.3g)",
              spec, q, side, qk_test_max_diff(K0, K1, nx * cols));
        CHECK(qk_test_max_diff(Ksv, K1, nx * cols) <= 1e-12, "%s q=%d side %d: given MPS vs statevector %.3g", spec, q, side,
              qk_test_max_diff(Ksv, K1, nx * cols));
        K2 = gram_mps(ctx1, &d, QK_F64, &r);   /* one thread */
        CHECK(r == QK_OK && memcmp(K1, K2, sizeof(double) * (size_t)(nx * cols)) == 0, "%s q=%d: 1 thread differs", spec, q);
        /* quimb's layout (LRP): the same K bit for bit */
        ba = tmps_convert(&tx, QK_MPS_LRP, QK_STATE_C128, &pl_a);
        if (side) bb = tmps_convert(&ty, QK_MPS_LRP, QK_STATE_C128, &pl_b);
        d.layout = QK_MPS_LRP;
        d.a = pl_a;
        d.b = pl_b;
        Kl = gram_mps(ctx, &d, QK_F64, &r);
        CHECK(r == QK_OK && memcmp(K0, Kl, sizeof(double) * (size_t)(nx * cols)) == 0, "%s q=%d side %d: LRP layout differs (%s)", spec, q, side,
              r == QK_OK ? "" : qk_last_error());
        free(ba); free(bb); free((void *)pl_a); free((void *)pl_b);
        free(K0); free(K1); free(K2); free(Ksv); free(Kl);
    }
    tmps_free(&tx); tmps_free(&ty);
    free(X); free(Y);
    qk_map_free(m);
}

static void own(qk_ctx *ctx, qk_ctx *ctx1)
{
    own_case(ctx, ctx1, "zz(reps=2,ent=linear)", 10, 13, 6);
    own_case(ctx, ctx1, "zz(reps=1,ent=circular)", 9, 9, 17);
    own_case(ctx, ctx1, "hea(layers=1)", 8, 11, 3);
    own_case(ctx, ctx1, "hea(layers=2,rot=yz)", 6, 8, 8);
}

/* ---- random MPS against their dense statevectors ---- */
static void dense_case(qk_ctx *ctx, int q, int64_t na, int64_t nb, int maxb, int real)
{
    tmps a = tmps_random(q, na, maxb, real), b = tmps_random(q, nb, maxb, real);
    const int64_t D = (int64_t)1 << q;
    double *va = (double *)xmalloc(sizeof(double) * 2 * (size_t)(D * na)), *vb = (double *)xmalloc(sizeof(double) * 2 * (size_t)(D * nb));
    double *Kref = (double *)xmalloc(sizeof(double) * (size_t)(na * nb)), *Kaa = (double *)xmalloc(sizeof(double) * (size_t)(na * na));
    double *K, *K32;
    qk_mps_states_desc d;
    qk_result r;
    int64_t i, j, z;
    for (i = 0; i < na; i++) tmps_dense(&a, i, va + 2 * D * i);
    for (i = 0; i < nb; i++) tmps_dense(&b, i, vb + 2 * D * i);
    for (i = 0; i < na; i++)
        for (j = 0; j < nb + na; j++) {   /* long double references: K(A,B), then K(A,A) */
            const double *u = va + 2 * D * i, *v = j < nb ? vb + 2 * D * j : va + 2 * D * (j - nb);
            long double sr = 0, si = 0;
            for (z = 0; z < D; z++) {
                sr += (long double)u[2 * z] * v[2 * z] + (long double)u[2 * z + 1] * v[2 * z + 1];
                si += (long double)u[2 * z] * v[2 * z + 1] - (long double)u[2 * z + 1] * v[2 * z];
            }
            if (j < nb) Kref[i * nb + j] = (double)(sr * sr + si * si);
            else Kaa[i * na + j - nb] = (double)(sr * sr + si * si);
        }
    desc_of(&d, &a, &b);
    d.normalize = 1;
    K = gram_mps(ctx, &d, QK_F64, &r);
    CHECK(r == QK_OK, "dense q=%d: %s", q, qk_last_error());
    CHECK(qk_test_max_diff(K, Kref, na * nb) <= 1e-12, "dense q=%d real=%d K(A,B): %.3g", q, real, qk_test_max_diff(K, Kref, na * nb));
    free(K);
    desc_of(&d, &a, NULL);
    d.normalize = 1;
    K = gram_mps(ctx, &d, QK_F64, &r);
    CHECK(r == QK_OK && qk_test_max_diff(K, Kaa, na * na) <= 1e-12, "dense q=%d real=%d K(A,A): %.3g", q, real, qk_test_max_diff(K, Kaa, na * na));
    K32 = gram_mps(ctx, &d, QK_F32, &r);   /* a float32 K */
    {
        double worst = 0;
        for (i = 0; i < na * na; i++) {
            float v;
            memcpy(&v, (const char *)K32 + 4 * i, 4);
            if (fabs((double)v - Kaa[i]) > worst || v != v) worst = v != v ? INFINITY : fabs((double)v - Kaa[i]);
        }
        CHECK(r == QK_OK && worst <= 1e-6, "dense q=%d f32 out: %.3g", q, worst);
    }
    free(K32);
    free(K);
    /* complex64 tensors (float rounding), and real float64 tensors for the real case */
    {
        const void **p32;
        void *b32 = tmps_convert(&a, QK_MPS_LPR, real ? QK_STATE_F64 : QK_STATE_C64, &p32);
        desc_of(&d, &a, NULL);
        d.a = p32;
        d.type = real ? QK_STATE_F64 : QK_STATE_C64;
        d.normalize = 1;
        K = gram_mps(ctx, &d, QK_F64, &r);
        CHECK(r == QK_OK && qk_test_max_diff(K, Kaa, na * na) <= (real ? 1e-12 : 1e-5), "dense q=%d %s tensors: %.3g", q, real ? "f64" : "c64",
              qk_test_max_diff(K, Kaa, na * na));
        free(K); free(b32); free((void *)p32);
    }
    tmps_free(&a); tmps_free(&b);
    free(va); free(vb); free(Kref); free(Kaa);
}

static void dense(qk_ctx *ctx)
{
    dense_case(ctx, 9, 11, 5, 5, 0);
    dense_case(ctx, 7, 9, 9, 8, 1);
    dense_case(ctx, 1, 3, 2, 1, 0);
    dense_case(ctx, 2, 4, 3, 2, 0);
}

/* ---- outputs ---- */
static void outputs(qk_ctx *ctx)
{
    enum { N = QK__T + 9 };   /* two tile rows, the second partial */
    tmps a = tmps_random(8, N, 4, 0);
    qk_mps_states_desc d;
    qk_gram_desc g;
    qk_result r;
    double *K;
    char path[64];
    qk_array arr;
    qk_test_tiles tt;
    desc_of(&d, &a, NULL);
    d.normalize = 1;
    K = gram_mps(ctx, &d, QK_F64, &r);
    CHECK(r == QK_OK, "outputs: %s", qk_last_error());
    snprintf(path, sizeof path, "test_mps_states_%d.npy", (int)getpid());
    memset(&g, 0, sizeof g);
    g.output = QK_OUTPUT_NPY;
    g.out_path = path;
    g.out_dtype = QK_F64;
    CHECK(qk_gram_mps_states(ctx, &d, &g) == QK_OK, "npy: %s", qk_last_error());
    CHECK(qk_npy_read(path, &arr) == QK_OK && arr.rows == N && arr.cols == N && memcmp(arr.data, K, sizeof(double) * N * N) == 0,
          "npy output differs from the host buffer");
    qk_array_free(&arr);
    remove(path);
    memset(&tt, 0, sizeof tt);
    tt.K = nan_k(N * N);
    tt.rows = tt.cols = N;
    tt.side = QK__T;
    tt.sym = 1;
    memset(&g, 0, sizeof g);
    g.output = QK_OUTPUT_CALLBACK;
    g.tile_fn = qk_test_on_tile;
    g.tile_user = &tt;
    g.out_dtype = QK_F64;
    r = qk_gram_mps_states(ctx, &d, &g);
    CHECK(r == QK_OK && tt.bad == 0 && memcmp(tt.K, K, sizeof(double) * N * N) == 0 && tt.calls == 3, "tile callback: r %d bad %d (%s)", (int)r, tt.bad, qk_last_error());
    free(tt.K);
    free(K);
    tmps_free(&a);
}

/* ---- 165 qubits: product states behind gauge transforms ---- */
/* a product state u_s (2 complex per site) as an MPS whose bonds are padded to 2 (zeros) and then
   mixed by a random invertible G per bond: A_s <- A_s G, A_{s+1} <- G^-1 A_{s+1}, the same state */
static void gauge_product(tmps *t, int64_t i, const double *u)
{
    const int q = t->q;
    int s, l, a, r;
    double G[8], Gi[8];
    for (s = 0; s < q; s++) {   /* the padded product: A_s[0][a][0] = u_s[a], zero elsewhere */
        const int dl = t->bond[i * (q + 1) + s], dr = t->bond[i * (q + 1) + s + 1];
        double *A = t->t[i * q + s];
        memset(A, 0, sizeof(double) * 2 * (size_t)(dl * 2 * dr));
        for (a = 0; a < 2; a++) { A[2 * (a * dr)] = u[4 * s + 2 * a]; A[2 * (a * dr) + 1] = u[4 * s + 2 * a + 1]; }
    }
    for (s = 1; s < q; s++) {   /* bond s, between sites s-1 and s: bond 2 */
        double *L = t->t[i * q + s - 1], *R = t->t[i * q + s], det[2], T[16];
        const int dl = t->bond[i * (q + 1) + s - 1], dr = t->bond[i * (q + 1) + s + 1];
        int k;
        do {
            for (k = 0; k < 8; k++) G[k] = qk_test_uniform(-1, 1);
            det[0] = G[0] * G[6] - G[1] * G[7] - (G[2] * G[4] - G[3] * G[5]);
            det[1] = G[0] * G[7] + G[1] * G[6] - (G[2] * G[5] + G[3] * G[4]);
        } while (det[0] * det[0] + det[1] * det[1] < 0.05);
        {   /* Gi = [[g11, -g01], [-g10, g00]] / det */
            const double dd = det[0] * det[0] + det[1] * det[1];
            const double c[8] = {G[6], G[7], -G[2], -G[3], -G[4], -G[5], G[0], G[1]};
            for (k = 0; k < 4; k++) {
                Gi[2 * k] = (c[2 * k] * det[0] + c[2 * k + 1] * det[1]) / dd;
                Gi[2 * k + 1] = (c[2 * k + 1] * det[0] - c[2 * k] * det[1]) / dd;
            }
        }
        for (l = 0; l < dl; l++)   /* L[l][a][:] <- L[l][a][:] G */
            for (a = 0; a < 2; a++) {
                double *row = L + 2 * ((l * 2 + a) * 2);
                for (r = 0; r < 2; r++) {
                    T[2 * r] = row[0] * G[2 * r] - row[1] * G[2 * r + 1] + row[2] * G[2 * (2 + r)] - row[3] * G[2 * (2 + r) + 1];
                    T[2 * r + 1] = row[0] * G[2 * r + 1] + row[1] * G[2 * r] + row[2] * G[2 * (2 + r) + 1] + row[3] * G[2 * (2 + r)];
                }
                memcpy(row, T, sizeof(double) * 4);
            }
        for (a = 0; a < 2; a++)   /* R[:][a][r] <- Gi R[:][a][r] */
            for (r = 0; r < dr; r++) {
                double x0r = R[2 * ((0 * 2 + a) * dr + r)], x0i = R[2 * ((0 * 2 + a) * dr + r) + 1];
                double x1r = R[2 * ((1 * 2 + a) * dr + r)], x1i = R[2 * ((1 * 2 + a) * dr + r) + 1];
                for (l = 0; l < 2; l++) {
                    R[2 * ((l * 2 + a) * dr + r)] = Gi[4 * l] * x0r - Gi[4 * l + 1] * x0i + Gi[4 * l + 2] * x1r - Gi[4 * l + 3] * x1i;
                    R[2 * ((l * 2 + a) * dr + r) + 1] = Gi[4 * l] * x0i + Gi[4 * l + 1] * x0r + Gi[4 * l + 2] * x1i + Gi[4 * l + 3] * x1r;
                }
            }
    }
}

static void wide(qk_ctx *ctx)
{
    const int q = 165;
    const int64_t n = 12;
    tmps t;
    double *u = (double *)xmalloc(sizeof(double) * 4 * (size_t)(q * n)), *K, *Kb;
    qk_mps_states_desc d;
    qk_result r;
    int64_t i, j;
    int s;
    double worst = 0;
    t.q = q;
    t.n = n;
    t.bond = (int *)xmalloc(sizeof(int) * (size_t)(n * (q + 1)));
    for (i = 0; i < n; i++)
        for (s = 0; s <= q; s++) t.bond[i * (q + 1) + s] = s == 0 || s == q ? 1 : 2;
    tmps_alloc_sites(&t);
    for (i = 0; i < n; i++) {
        for (s = 0; s < q; s++) {   /* a one-qubit state near |0> (so that K is not 0) */
            double th = qk_test_uniform(0, 0.35), ph = qk_test_uniform(-3, 3);
            u[4 * (i * q + s)] = cos(th); u[4 * (i * q + s) + 1] = 0;
            u[4 * (i * q + s) + 2] = sin(th) * cos(ph); u[4 * (i * q + s) + 3] = sin(th) * sin(ph);
        }
        gauge_product(&t, i, u + 4 * i * q);
    }
    desc_of(&d, &t, NULL);
    d.normalize = 1;   /* the gauge keeps the norm 1 only up to rounding */
    d.norm_tol = 1e-6;
    K = gram_mps(ctx, &d, QK_F64, &r);
    CHECK(r == QK_OK, "wide: %s", qk_last_error());
    for (i = 0; i < n; i++)
        for (j = 0; j < n; j++) {
            long double k = 1;
            for (s = 0; s < q; s++) {
                const double *a = u + 4 * (i * q + s), *b = u + 4 * (j * q + s);
                long double re = (long double)a[0] * b[0] + (long double)a[1] * b[1] + (long double)a[2] * b[2] + (long double)a[3] * b[3];
                long double im = (long double)a[0] * b[1] - (long double)a[1] * b[0] + (long double)a[2] * b[3] - (long double)a[3] * b[2];
                k *= re * re + im * im;
            }
            if (fabs(K[i * n + j] - (double)k) > worst || K[i * n + j] != K[i * n + j]) worst = fabs(K[i * n + j] - (double)k);
        }
    CHECK(worst <= 1e-12, "wide: 165-qubit gauged products vs the closed form %.3g", worst);
    printf("wide: 165 qubits, bond 2, |K - closed form| %.3g\n", worst);
    desc_of(&d, &t, &t);   /* K(A,B) with B = A: the same K */
    d.normalize = 1;
    d.norm_tol = 1e-6;
    Kb = gram_mps(ctx, &d, QK_F64, &r);
    CHECK(r == QK_OK && qk_test_max_diff(K, Kb, n * n) <= 1e-14, "wide: K(A,A) vs K(A,A as B) %.3g", qk_test_max_diff(K, Kb, n * n));
    free(Kb);
    /* every tensor times 10: the squared norm 10^330 overflows a double; normalize still gives K */
    for (i = 0; i < n * q; i++) {
        const int64_t si = i % q, ii = i / q, cnt = 2 * (int64_t)t.bond[ii * (q + 1) + si] * 2 * t.bond[ii * (q + 1) + si + 1];
        int64_t k;
        for (k = 0; k < cnt; k++) t.t[i][k] *= 10.0;
    }
    desc_of(&d, &t, NULL);
    d.normalize = 1;
    Kb = gram_mps(ctx, &d, QK_F64, &r);
    CHECK(r == QK_OK && qk_test_max_diff(K, Kb, n * n) <= 1e-12, "wide: tensors x10 (norm^2 1e330) normalised: %.3g (%s)", qk_test_max_diff(K, Kb, n * n),
          r == QK_OK ? "" : qk_last_error());
    d.normalize = 0;
    free(Kb);
    Kb = gram_mps(ctx, &d, QK_F64, &r);
    CHECK(r == QK_ERROR_BAD_DATA && strstr(qk_last_error(), "A[0]: the MPS's squared norm is beyond 1e308"), "wide: x10 unnormalised: %s", qk_last_error());
    free(K); free(Kb); free(u);
    tmps_free(&t);
}

/* ---- errors and the plan ---- */
static int all_nan(const double *K, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++) if (K[i] == K[i]) return 0;
    return 1;
}

#define EXPECT(d_, code_, sub_)                                                                                                   \
    do {                                                                                                                          \
        qk_result r_;                                                                                                             \
        double *K_ = gram_mps(ctx, (d_), QK_F64, &r_);                                                                            \
        CHECK(r_ == (code_) && strstr(qk_last_error(), (sub_)) && all_nan(K_, (d_)->n_a * ((d_)->b ? (d_)->n_b : (d_)->n_a)),     \
              "expected %d '%s', got %d '%s'", (int)(code_), (sub_), (int)r_, qk_last_error());                                    \
        free(K_);                                                                                                                 \
    } while (0)

static void errors(qk_ctx *ctx)
{
    tmps a = tmps_random(6, 5, 4, 0), b = tmps_random(6, 3, 4, 0);
    qk_mps_states_desc d;
    qk_gram_desc g;
    qk_plan plan;
    char text[2048];
    double keep, *K;
    int kb;
    desc_of(&d, &a, &b);
    d.normalize = 1;
    keep = a.t[2 * 6 + 3][1];
    a.t[2 * 6 + 3][1] = NAN;
    EXPECT(&d, QK_ERROR_NON_FINITE, "A[2] site 3: entry (0, 0, 0)");
    a.t[2 * 6 + 3][1] = keep;
    keep = b.t[1 * 6 + 0][2 * b.bond[1 * 7 + 1]];   /* (l, a, r) = (0, 1, 0) */
    b.t[1 * 6 + 0][2 * b.bond[1 * 7 + 1]] = INFINITY;
    EXPECT(&d, QK_ERROR_NON_FINITE, "B[1] site 0: entry (0, 1, 0) (left, physical, right) is Inf");
    b.t[1 * 6 + 0][2 * b.bond[1 * 7 + 1]] = keep;
    d.normalize = 0;   /* random tensors: norms far from 1 */
    EXPECT(&d, QK_ERROR_BAD_DATA, "A[0]: the MPS's squared norm is");
    d.normalize = 1;
    memset(a.t[4 * 6 + 5], 0, sizeof(double) * 2 * (size_t)(a.bond[4 * 7 + 5] * 2));
    EXPECT(&d, QK_ERROR_ZERO_NORM, "A[4]: the MPS's squared norm is 0");
    a.t[4 * 6 + 5][0] = 1;
    kb = a.bond[1 * 7 + 0];
    a.bond[1 * 7 + 0] = 2;
    EXPECT(&d, QK_ERROR_INVALID_ARGUMENT, "A[1]: the first (left of site 0) bond is 2");
    a.bond[1 * 7 + 0] = kb;
    kb = b.bond[2 * 7 + 3];
    b.bond[2 * 7 + 3] = 0;
    EXPECT(&d, QK_ERROR_INVALID_ARGUMENT, "B[2]: bond 3 (left of site 3) is 0");
    b.bond[2 * 7 + 3] = 65;
    EXPECT(&d, QK_ERROR_UNSUPPORTED, "B[2]: bond 3 (left of site 3) is 65");
    b.bond[2 * 7 + 3] = kb;
    a.ptr[3 * 6 + 1] = NULL;
    EXPECT(&d, QK_ERROR_INVALID_ARGUMENT, "A[3] site 1: the tensor is NULL");
    a.ptr[3 * 6 + 1] = a.t[3 * 6 + 1];
    d.layout = (qk_mps_layout)7;
    EXPECT(&d, QK_ERROR_INVALID_ARGUMENT, "unknown layout 7");
    d.layout = QK_MPS_LPR;
    d.type = (qk_state_type)9;
    EXPECT(&d, QK_ERROR_INVALID_ARGUMENT, "unknown state type 9");
    d.type = QK_STATE_DEFAULT;
    d.norm_tol = 2;
    EXPECT(&d, QK_ERROR_INVALID_ARGUMENT, "norm_tol must be in (0, 1)");
    d.norm_tol = 0;
    K = nan_k(5 * 3);
    memset(&g, 0, sizeof g);
    g.out = K;
    g.out_dtype = QK_F64;
    g.mps_max_bond = 2;
    CHECK(qk_gram_mps_states(ctx, &d, &g) == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "contracted as they are") && all_nan(K, 15), "mps_max_bond: %s", qk_last_error());
    g.mps_max_bond = 0;
    g.path = QK_PATH_COMPLEX;
    CHECK(qk_gram_mps_states(ctx, &d, &g) == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "MPS path") && all_nan(K, 15), "path: %s", qk_last_error());
    g.path = QK_PATH_DEFAULT;
    g.x = K;
    CHECK(qk_gram_mps_states(ctx, &d, &g) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "must be NULL"), "x: %s", qk_last_error());
    g.x = NULL;
    CHECK(qk_gram_mps_states(ctx, &d, &g) == QK_OK && !all_nan(K, 15), "the good call after the errors: %s", qk_last_error());
    /* the plan */
    CHECK(qk_plan_mps_states(ctx, &d, &g, &plan) == QK_OK && plan.path == QK_PATH_MPS && plan.mps_given == 1 && plan.n_qubits == 6, "plan: %s", qk_last_error());
    {
        int s, mx = 1;
        int64_t i;
        for (i = 0; i < 5 * 7; i++) if (a.bond[i] > mx) mx = a.bond[i];
        for (i = 0; i < 3 * 7; i++) if (b.bond[i] > mx) mx = b.bond[i];
        (void)s;
        CHECK(plan.mps_bond == mx, "plan.mps_bond %d, the largest given bond %d", plan.mps_bond, mx);
    }
    qk_plan_describe(&plan, text, sizeof text);
    CHECK(strstr(text, "mps: given tensors") != NULL, "describe: %s", text);
    free(K);
    tmps_free(&a); tmps_free(&b);
}

int main(void)
{
    qk_ctx *ctx, *ctx1;
    qk_test_seed();
    ctx = qk_test_cpu_ctx(2);
    ctx1 = qk_test_cpu_ctx(1);
    own(ctx, ctx1);
    dense(ctx);
    outputs(ctx);
    wide(ctx);
    errors(ctx);
    qk_ctx_destroy(ctx);
    qk_ctx_destroy(ctx1);
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
