/* qk_gram_projected (issue 24 item 4): the projected quantum kernel against a reference built
   here from qk_states by explicit partial traces (all four entries of each 2x2 reduced density
   matrix, the Frobenius norm summed entry by entry, long double), for complex and real
   entangling maps, K(X,X) and K(X,Y), float64 and float32 outputs with a leading dimension; a
   product map at 40 qubits (beyond any statevector) against the per-qubit closed form of the
   angle embedding; the errors. */
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"

/* the 2x2 reduced density matrix of qubit k of an interleaved complex state (bit k of the index) */
static void rdm(const double *s, int q, int k, long double r[2][2][2])
{
    const int64_t D = (int64_t)1 << q, b = (int64_t)1 << k;
    int64_t i;
    int a, c;
    for (a = 0; a < 2; a++) for (c = 0; c < 2; c++) r[a][c][0] = r[a][c][1] = 0;
    for (i = 0; i < D; i++) {
        if (i & b) continue;
        for (a = 0; a < 2; a++)
            for (c = 0; c < 2; c++) {   /* rho[a][c] += psi(i with bit a) conj(psi(i with bit c)) */
                const double *pa = s + 2 * (i | (a ? b : 0)), *pc = s + 2 * (i | (c ? b : 0));
                r[a][c][0] += (long double)pa[0] * pc[0] + (long double)pa[1] * pc[1];
                r[a][c][1] += (long double)pa[1] * pc[0] - (long double)pa[0] * pc[1];
            }
    }
}

static double ref_entry(const double *sa, const double *sb, int q, double gamma)
{
    long double d = 0, ra[2][2][2], rb[2][2][2];
    int k, a, c, t;
    for (k = 0; k < q; k++) {
        rdm(sa, q, k, ra);
        rdm(sb, q, k, rb);
        for (a = 0; a < 2; a++)
            for (c = 0; c < 2; c++)
                for (t = 0; t < 2; t++) d += (ra[a][c][t] - rb[a][c][t]) * (ra[a][c][t] - rb[a][c][t]);
    }
    return (double)expl(-(long double)gamma * d);
}

static void case_map(qk_ctx *ctx, const char *spec, int d, int64_t nx, int64_t ny, double gamma, qk_dtype dt)
{
    qk_map *m = qk_test_parse(spec, d);
    const int q = m->n_qubits;
    const int64_t D = (int64_t)1 << q, cols = ny ? ny : nx, ld = cols + 2;
    double *x = qk_test_rand_data(nx, d, -2, 2), *y = ny ? qk_test_rand_data(ny, d, -2, 2) : NULL;
    double *sx = malloc(sizeof(double) * (size_t)(2 * nx * D)), *sy = ny ? malloc(sizeof(double) * (size_t)(2 * ny * D)) : NULL;
    void *K = malloc(8 * (size_t)(nx * ld));
    double err = 0;
    qk_gram_desc g;
    int64_t i, c;
    CHECK(qk_states(ctx, m, x, nx, sx) == QK_OK && (!ny || qk_states(ctx, m, y, ny, sy) == QK_OK), "states: %s", qk_last_error());
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = nx; g.y = y; g.n_y = ny; g.out = K; g.ld_out = ld; g.out_dtype = dt;
    CHECK(qk_gram_projected(ctx, m, &g, gamma) == QK_OK, "%s: %s", spec, qk_last_error());
    for (i = 0; i < nx; i++)
        for (c = 0; c < cols; c++) {
            double v = dt == QK_F32 ? (double)((float *)K)[i * ld + c] : ((double *)K)[i * ld + c];
            double e = fabs(v - ref_entry(sx + 2 * i * D, (ny ? sy : sx) + 2 * c * D, q, gamma));
            if (!(e <= err)) err = e;
        }
    CHECK(err <= (dt == QK_F32 ? 1e-7 : 1e-13), "%s %s %s: |K - reference| = %.3g", spec, ny ? "K(X,Y)" : "K(X,X)", dt == QK_F32 ? "f32" : "f64", err);
    printf("%-28s %s %s gamma %.2f: max |K - ref| %.2g\n", spec, ny ? "K(X,Y)" : "K(X,X)", dt == QK_F32 ? "f32" : "f64", gamma, err);
    free(x); free(y); free(sx); free(sy); free(K);
    qk_map_free(m);
}

/* the statevector path (forced) against the MPS path (forced) on the same map: 1e-12 */
static void case_paths(qk_ctx *ctx, const char *spec, int d, int64_t nx, int64_t ny, double gamma)
{
    qk_map *m = qk_test_parse(spec, d);
    const int64_t cols = ny ? ny : nx;
    double *x = qk_test_rand_data(nx, m->n_features, -2, 2), *y = ny ? qk_test_rand_data(ny, m->n_features, -2, 2) : NULL;
    double *Ks = malloc(sizeof(double) * (size_t)(nx * cols)), *Km = malloc(sizeof(double) * (size_t)(nx * cols)), err;
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = nx; g.y = y; g.n_y = ny; g.out = Ks; g.out_dtype = QK_F64;
    g.path = m->cls == QK_CLASS_REAL ? QK_PATH_REAL : QK_PATH_COMPLEX;
    CHECK(qk_gram_projected(ctx, m, &g, gamma) == QK_OK, "%s statevector: %s", spec, qk_last_error());
    g.path = QK_PATH_MPS;
    g.out = Km;
    CHECK(qk_gram_projected(ctx, m, &g, gamma) == QK_OK, "%s mps: %s", spec, qk_last_error());
    err = qk_test_max_diff(Ks, Km, nx * cols);
    CHECK(err <= 1e-12, "%s q=%d %s: |K_mps - K_statevector| = %.3g", spec, m->n_qubits, ny ? "K(X,Y)" : "K(X,X)", err);
    printf("%-28s q=%2d %s: max |K_mps - K_sv| %.2g\n", spec, m->n_qubits, ny ? "K(X,Y)" : "K(X,X)", err);
    free(x); free(y); free(Ks); free(Km);
    qk_map_free(m);
}

/* 100 qubits on the MPS path: ten independent blocks of ten qubits (a brickwork circuit on each,
   block b reading features 10b..10b+9), so every qubit's reduced state is its block's and K is
   the product of the ten blocks' projected kernels, each on the statevector path. */
static void blocks(qk_ctx *ctx)
{
    enum { B = 10, W = 10, Q = B * W };
    const int64_t n = 9;
    const double gamma = 0.02;
    char *spec = malloc(65536), *bspec = malloc(8192), t[128];
    double *x = qk_test_rand_data(n, Q, -1.5, 1.5), *xb = malloc(sizeof(double) * n * W), K[81], Kb[81], ref[81], err = 0;
    qk_map *m, *mb;
    qk_gram_desc g;
    qk_plan plan;
    int b, k, l;
    int64_t i;
    size_t len;
    for (b = 0; b <= B; b++) {   /* b == B: the one block's spec (features x0..x9) */
        const int base = b == B ? 0 : b * W;
        char *o = b == B ? bspec : spec;
        if (b == 0 || b == B) { snprintf(o, 64, "circuit(qubits=%d:", b == B ? W : Q); }
        len = strlen(o);
        for (l = 0; l < 2; l++) {
            for (k = 0; k < W; k++) {
                snprintf(t, sizeof t, " ry(%d, x%d) rz(%d, 0.5*x%d+0.1)", base + k, base + k, base + k, base + (k + 1) % W);
                memcpy(o + len, t, strlen(t) + 1); len += strlen(t);
            }
            for (k = l % 2; k + 1 < W; k += 2) {
                if (k % 4 < 2) snprintf(t, sizeof t, " cx(%d,%d)", base + k, base + k + 1);
                else snprintf(t, sizeof t, " rzz(%d,%d, x%d*x%d)", base + k, base + k + 1, base + k, base + k + 1);
                memcpy(o + len, t, strlen(t) + 1); len += strlen(t);
            }
        }
        if (b == B - 1 || b == B) memcpy(o + len, ")", 2);
    }
    m = qk_test_parse(spec, Q);
    mb = qk_test_parse(bspec, W);
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = n; g.out = K; g.out_dtype = QK_F64;
    CHECK(qk_plan_make(ctx, m, &g, &plan) == QK_OK && plan.path == QK_PATH_MPS, "blocks: the 100-qubit map's path %d (%s)", (int)plan.path, qk_last_error());
    CHECK(qk_gram_projected(ctx, m, &g, gamma) == QK_OK, "blocks: %s", qk_last_error());
    for (i = 0; i < n * n; i++) ref[i] = 1.0;
    for (b = 0; b < B; b++) {
        for (i = 0; i < n; i++) memcpy(xb + i * W, x + i * Q + b * W, sizeof(double) * W);
        memset(&g, 0, sizeof g);
        g.x = xb; g.n_x = n; g.out = Kb; g.out_dtype = QK_F64; g.path = QK_PATH_COMPLEX;
        CHECK(qk_gram_projected(ctx, mb, &g, gamma) == QK_OK, "block %d: %s", b, qk_last_error());
        for (i = 0; i < n * n; i++) ref[i] *= Kb[i];
    }
    err = qk_test_max_diff(K, ref, n * n);
    CHECK(err <= 1e-12, "blocks: 100 qubits on the MPS path vs the product of ten 10-qubit statevector kernels: %.3g", err);
    printf("100 qubits (10 blocks), MPS path: max |K - product of blocks| %.2g (K from %.3g to 1)\n", err, ref[1]);
    free(x); free(xb); free(spec); free(bspec);
    qk_map_free(m);
    qk_map_free(mb);
}

int main(void)
{
    qk_ctx *ctx = qk_test_cpu_ctx(2);
    qk_test_seed();
    case_map(ctx, "zz(reps=2)", 6, 40, 0, 0.7, QK_F64);
    case_map(ctx, "iqp", 5, 30, 21, 1.3, QK_F64);
    case_map(ctx, "hea(layers=2)", 7, 25, 0, 0.4, QK_F32);
    case_map(ctx, "zz(reps=1,ent=linear)", 9, 17, 12, 2.0, QK_F64);
    /* the MPS path (issue 24 item 4): against the statevector path at the same sizes */
    case_paths(ctx, "zz(reps=2,ent=linear)", 10, 23, 0, 0.3);
    case_paths(ctx, "zz(reps=2,ent=linear)", 12, 11, 9, 0.3);
    case_paths(ctx, "zz(reps=2,ent=circular)", 8, 17, 0, 0.5);    /* folded qubit order */
    case_paths(ctx, "hea(layers=2)", 9, 13, 7, 0.5);               /* real states, folded */
    case_paths(ctx, "hea(layers=1,rot=yz,ent=cnot)", 11, 10, 0, 0.5);
    case_paths(ctx, "iqp", 5, 12, 5, 1.0);
    case_paths(ctx, "zz(reps=1,ent=linear)", 2, 6, 0, 1.0);
    blocks(ctx);
    {   /* a product map at 40 qubits: angle(rot=x), u_k = (cos(x_k/2), -i sin(x_k/2)) */
        const int d = 40;
        const int64_t n = 12;
        const double gamma = 0.05;
        qk_map *m = qk_test_parse("angle(rot=x)", d);
        double *x = qk_test_rand_data(n, d, -3, 3), K[144], err = 0;
        qk_gram_desc g;
        int64_t i, c;
        memset(&g, 0, sizeof g);
        g.x = x; g.n_x = n; g.out = K; g.out_dtype = QK_F64;
        CHECK(qk_gram_projected(ctx, m, &g, gamma) == QK_OK, "angle 40: %s", qk_last_error());
        for (i = 0; i < n; i++)
            for (c = 0; c < n; c++) {
                long double dsum = 0;
                int k;
                for (k = 0; k < d; k++) {
                    long double ca = cosl(x[i * d + k] / 2), sa = sinl(x[i * d + k] / 2), cb = cosl(x[c * d + k] / 2), sb = sinl(x[c * d + k] / 2);
                    /* rho = [[c^2, i c s], [-i c s, s^2]] */
                    long double d00 = ca * ca - cb * cb, d11 = sa * sa - sb * sb, d01 = ca * sa - cb * sb;
                    dsum += d00 * d00 + d11 * d11 + 2 * d01 * d01;
                }
                err = fmax(err, fabs(K[i * n + c] - (double)expl(-gamma * dsum)));
            }
        CHECK(err <= 1e-13, "angle(rot=x) at 40 qubits: |K - closed form| = %.3g", err);
        printf("angle(rot=x) 40 qubits         K(X,X) f64 gamma 0.05: max |K - ref| %.2g\n", err);
        g.output = QK_OUTPUT_NPY;
        CHECK(qk_gram_projected(ctx, m, &g, gamma) == QK_ERROR_UNSUPPORTED, "NPY output accepted");
        g.output = QK_OUTPUT_HOST;
        CHECK(qk_gram_projected(ctx, m, &g, 0.0) == QK_ERROR_INVALID_ARGUMENT, "gamma 0 accepted");
        x[5] = NAN;
        CHECK(qk_gram_projected(ctx, m, &g, gamma) == QK_ERROR_NON_FINITE, "NaN accepted: %s", qk_last_error());
        free(x);
        qk_map_free(m);
    }
    qk_ctx_destroy(ctx);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
