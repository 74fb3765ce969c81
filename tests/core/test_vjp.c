/* qk_gram_vjp (issue 24): dL/dw for L = sum_ij G_ij K_ij with a random (non-symmetric) G, against
   - central finite differences of L through qk_gram (fp64), relative 1e-7 of the gradient's
     largest entry, on every gate kind that can carry a weight (RX, RY, RZ, P, RZZ with w and
     w * x angles, a weight shared by two gates), hea (real and complex), K(X,X) and K(X,Y);
   - the parameter-shift rule (each weight in one gate, angle scale * w: dK/dw = scale (K(w +
     pi / 2 scale) - K(w - pi / 2 scale)) / 2), the exact derivative of these gates;
   - K from the same pass (k_out) equal to qk_gram's within 1e-14;
   - sizes past the products' blocks (several work items, partial micro-blocks at the edges,
     more than one chunk of the inner dimension) on the real and complex paths, and a complex
     product map (no entangler; its states are complex);
   - the same gradient and K, bit for bit, on 1, 2 and 3 threads;
   - dL/dX (and dL/dY: grad_x, grad_y) against central finite differences of L in each feature of
     each sample, relative 1e-7, on every angle form that reads x (x, x x', x x, (pi - x)(pi - x'),
     w x) on RX, RY, RZ, P, RZZ, and on zz, iqp, angle and hea (real and complex), K(X,X) and K(X,Y);
   and the errors (NaN in G, grad_w NULL, ld_g too small, grad_y without Y, grad_x of an
   amplitude map). Fresh random data each run (seed). */
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"

static qk_ctx *g_ctx;

/* L = sum G_ij K_ij of map m at its weights */
static double loss(const qk_map *m, const double *x, int64_t nx, const double *y, int64_t ny, const double *G)
{
    const int64_t cols = y ? ny : nx;
    double *K = (double *)malloc(sizeof(double) * (size_t)(nx * cols)), L = 0;
    qk_gram_desc g;
    int64_t i;
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = nx; g.y = y; g.n_y = ny; g.out = K; g.out_dtype = QK_F64;
    if (qk_gram(g_ctx, m, &g) != QK_OK) { printf("qk_gram: %s\n", qk_last_error()); exit(2); }
    for (i = 0; i < nx * cols; i++) L += G[i] * K[i];
    free(K);
    return L;
}

/* L = sum G_ij K(psi_i(wa), phi_j(wb)): the X side's states at weights wa, Y's (X's again for
   K(X,X)) at wb, through qk_states and qk_gram_states */
static double loss2(qk_map *m, const double *wa, const double *wb, const double *x, int64_t nx, const double *y, int64_t ny, const double *G)
{
    const int64_t cols = y ? ny : nx, D = (int64_t)1 << m->n_qubits;
    double *sa = (double *)malloc(sizeof(double) * (size_t)(2 * nx * D)), *sb = (double *)malloc(sizeof(double) * (size_t)(2 * cols * D));
    double *K = (double *)malloc(sizeof(double) * (size_t)(nx * cols)), L = 0;
    qk_states_desc st;
    qk_gram_desc g;
    int64_t i;
    qk_map_set_weights(m, wa, m->n_weights);
    if (qk_states(g_ctx, m, x, nx, sa) != QK_OK) { printf("states: %s\n", qk_last_error()); exit(2); }
    qk_map_set_weights(m, wb, m->n_weights);
    if (qk_states(g_ctx, m, y ? y : x, cols, sb) != QK_OK) { printf("states: %s\n", qk_last_error()); exit(2); }
    memset(&st, 0, sizeof st);
    st.dim = D; st.a = sa; st.n_a = nx; st.b = sb; st.n_b = cols;
    memset(&g, 0, sizeof g);
    g.out = K; g.out_dtype = QK_F64;
    if (qk_gram_states(g_ctx, &st, &g) != QK_OK) { printf("gram_states: %s\n", qk_last_error()); exit(2); }
    for (i = 0; i < nx * cols; i++) L += G[i] * K[i];
    free(sa); free(sb); free(K);
    return L;
}

/* the rounding of a central difference of L = sum G_ij K_ij (K_ij <= 1) at step h: 4 eps sum |G| / h.
   The check is relative 1e-7 of the gradient's largest entry or this floor, whichever is larger: a
   draw whose gradient is small (1e-3) would otherwise fail on the differences' own rounding. */
static double fd_floor(const double *G, int64_t n, double h)
{
    double s = 0;
    int64_t i;
    for (i = 0; i < n; i++) s += fabs(G[i]);
    return 4.0 * DBL_EPSILON * s / h;
}

/* the VJP of map m against finite differences (and, shift = 1, the parameter-shift rule) */
static void check_map(const char *name, qk_map *m, int d, int64_t nx, int64_t ny, int shift)
{
    const int64_t cols = ny ? ny : nx, P = m->n_weights;
    double *x = qk_test_rand_data(nx, d, -1.2, 1.2), *y = ny ? qk_test_rand_data(ny, d, -1.2, 1.2) : NULL;
    double *G = qk_test_rand_data(nx, (int)cols, -1.0, 1.0), *grad = (double *)malloc(sizeof(double) * (size_t)P);
    double *w0 = (double *)malloc(sizeof(double) * (size_t)P), *w = (double *)malloc(sizeof(double) * (size_t)P);
    double *K = (double *)malloc(sizeof(double) * (size_t)(nx * cols)), *Kr = (double *)malloc(sizeof(double) * (size_t)(nx * cols));
    double fd_max = 0, err = 0, ps_err = 0;
    const double h = 1e-5;
    qk_vjp_desc v;
    qk_gram_desc g;
    int64_t k, i;
    for (k = 0; k < P; k++) w0[k] = qk_test_uniform(-2.0, 2.0);
    CHECK(qk_map_set_weights(m, w0, (int)P) == QK_OK, "%s: set weights: %s", name, qk_last_error());
    memset(&v, 0, sizeof v);
    v.x = x; v.n_x = nx; v.y = y; v.n_y = ny; v.g = G; v.grad_w = grad; v.k_out = K;
    CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_OK, "%s: qk_gram_vjp: %s", name, qk_last_error());
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = nx; g.y = y; g.n_y = ny; g.out = Kr; g.out_dtype = QK_F64;
    CHECK(qk_gram(g_ctx, m, &g) == QK_OK && qk_test_max_diff(K, Kr, nx * cols) <= 1e-14, "%s: k_out vs qk_gram: %.3g", name,
          qk_test_max_diff(K, Kr, nx * cols));
    for (k = 0; k < P; k++) {
        double lp, lm, fd;
        memcpy(w, w0, sizeof(double) * (size_t)P);
        w[k] = w0[k] + h; qk_map_set_weights(m, w, (int)P); lp = loss(m, x, nx, y, ny, G);
        w[k] = w0[k] - h; qk_map_set_weights(m, w, (int)P); lm = loss(m, x, nx, y, ny, G);
        fd = (lp - lm) / (2 * h);
        if (fabs(fd) > fd_max) fd_max = fabs(fd);
        if (fabs(grad[k] - fd) > err) err = fabs(grad[k] - fd);
        if (shift) {
            /* every weight of these maps sits in one gate with angle scale * w; K_ij has it twice
               (in psi_i and in phi_j): the two-term rule per side, summed (product rule) */
            double s = 0, ps = 0, wp[64];
            int side;
            for (i = 0; i < m->n_ops; i++)
                if (m->ops[i].angle.kind == QK_ARG_W && m->ops[i].angle.w == k) s = m->ops[i].angle.scale;
            for (side = 0; side < 2; side++) {
                memcpy(wp, w0, sizeof(double) * (size_t)P);
                wp[k] = w0[k] + 3.14159265358979323846 / (2 * s);
                lp = side ? loss2(m, w0, wp, x, nx, y, ny, G) : loss2(m, wp, w0, x, nx, y, ny, G);
                wp[k] = w0[k] - 3.14159265358979323846 / (2 * s);
                lm = side ? loss2(m, w0, wp, x, nx, y, ny, G) : loss2(m, wp, w0, x, nx, y, ny, G);
                ps += s * (lp - lm) / 2;
            }
            if (fabs(grad[k] - ps) > ps_err) ps_err = fabs(grad[k] - ps);
        }
    }
    qk_map_set_weights(m, w0, (int)P);
    CHECK(fd_max > 1e-3, "%s: the gradient is ~0 (%.3g): the test would not see an error", name, fd_max);
    CHECK(err <= fmax(1e-7 * fd_max, fd_floor(G, nx * cols, h)), "%s %s: |vjp - finite differences| = %.3g (relative %.3g)", name, ny ? "K(X,Y)" : "K(X,X)", err, err / fd_max);
    if (shift) CHECK(ps_err <= 1e-10 * fd_max, "%s: |vjp - parameter shift| = %.3g (relative %.3g)", name, ps_err, ps_err / fd_max);
    printf("%-40s %s P=%-3lld |grad|max %.3g  fd rel %.2g%s", name, ny ? "K(X,Y)" : "K(X,X)", (long long)P, fd_max, err / fd_max,
           shift ? "" : "\n");
    if (shift) printf("  shift rel %.2g\n", ps_err / fd_max);
    free(x); free(y); free(G); free(grad); free(w0); free(w); free(K); free(Kr);
}

/* dL/dX (and dL/dY) of map m against central finite differences of L in every feature of every
   sample; grad_w NULL (only the data's gradient asked) */
static void check_dx(const char *name, const qk_map *m, int d, int64_t nx, int64_t ny)
{
    const int64_t cols = ny ? ny : nx;
    double *x = qk_test_rand_data(nx, d, -1.2, 1.2), *y = ny ? qk_test_rand_data(ny, d, -1.2, 1.2) : NULL;
    double *G = qk_test_rand_data(nx, (int)cols, -1.0, 1.0);
    double *gx = (double *)malloc(sizeof(double) * (size_t)(nx * d)), *gy = ny ? (double *)malloc(sizeof(double) * (size_t)(ny * d)) : NULL;
    double fd_max = 0, err = 0;
    const double h = 1e-5;
    qk_vjp_desc v;
    int side;
    int64_t e;
    memset(&v, 0, sizeof v);
    v.x = x; v.n_x = nx; v.y = y; v.n_y = ny; v.g = G; v.grad_x = gx; v.grad_y = gy;
    CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_OK, "%s: qk_gram_vjp (grad_x): %s", name, qk_last_error());
    for (side = 0; side < (ny ? 2 : 1); side++) {
        double *a = side ? y : x, *ga = side ? gy : gx;
        for (e = 0; e < (side ? ny : nx) * d; e++) {
            const double a0 = a[e];
            double lp, lm, fd;
            a[e] = a0 + h; lp = loss(m, x, nx, y, ny, G);
            a[e] = a0 - h; lm = loss(m, x, nx, y, ny, G);
            a[e] = a0;
            fd = (lp - lm) / (2 * h);
            if (fabs(fd) > fd_max) fd_max = fabs(fd);
            if (fabs(ga[e] - fd) > err) err = fabs(ga[e] - fd);
        }
    }
    CHECK(fd_max > 1e-3, "%s: dL/dX is ~0 (%.3g): the test would not see an error", name, fd_max);
    CHECK(err <= fmax(1e-7 * fd_max, fd_floor(G, nx * cols, h)), "%s %s: |dL/dX - finite differences| = %.3g (relative %.3g)", name, ny ? "K(X,Y)" : "K(X,X)", err, err / fd_max);
    printf("%-40s %s dL/dX |grad|max %.3g  fd rel %.2g\n", name, ny ? "K(X,Y)" : "K(X,X)", fd_max, err / fd_max);
    free(x); free(y); free(G); free(gx); free(gy);
}

static int count_calls(int64_t done, int64_t total, void *user)
{
    (void)done; (void)total;
    ++*(int *)user;
    return 0;
}
static int cancel_at(int64_t done, int64_t total, void *user)
{
    (void)done; (void)total;
    return --*(int *)user == 0;
}

int main(void)
{
    qk_ctx_desc cd;
    qk_test_seed();
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 2;
    if (qk_ctx_create(&cd, &g_ctx) != QK_OK) return 2;
    {   /* every weighted gate kind, each weight once, angle scale * w + offset (parameter shift applies) */
        qk_map *m = qk_test_weighted_gates();
        check_map("custom: RX RY RZ P RZZ (w)", m, 3, 30, 0, 1);
        check_map("custom: RX RY RZ P RZZ (w)", m, 3, 25, 17, 1);
        qk_map_free(m);
    }
    {   /* w * x angles, a weight in two gates (no parameter shift: finite differences) */
        const qk_op ops[] = {
            qk_test_op(QK_OP_H, 0, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),       qk_test_op(QK_OP_H, 1, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),
            qk_test_op(QK_OP_RX, 0, 0, QK_ARG_WX, 0, 0, 0, 1.0, 0.2),     qk_test_op(QK_OP_RY, 1, 0, QK_ARG_WX, 1, 0, 1, 0.8, 0),
            qk_test_op(QK_OP_RZZ, 0, 1, QK_ARG_WX, 2, 0, 2, 1.0, 0),      qk_test_op(QK_OP_P, 1, 0, QK_ARG_WX, 0, 0, 0, 1.5, 0),
            qk_test_op(QK_OP_CNOT, 1, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),    qk_test_op(QK_OP_RZ, 0, 0, QK_ARG_W, 0, 0, 2, 0.6, 0),
            qk_test_op(QK_OP_RY, 0, 0, QK_ARG_PIXX, 0, 1, 0, 0.3, 0),
        };
        qk_map *m = qk_test_custom(2, 3, ops, (int)(sizeof ops / sizeof ops[0]), 3);
        check_map("custom: w*x angles, shared weights", m, 3, 28, 0, 0);
        check_map("custom: w*x angles, shared weights", m, 3, 20, 11, 0);
        qk_map_free(m);
    }
    {
        qk_map *m = qk_test_parse("hea(layers=2)", 5);
        check_map("hea(layers=2) (real)", m, 5, 24, 0, 0);
        check_map("hea(layers=2) (real)", m, 5, 19, 22, 0);
        qk_map_free(m);
        m = qk_test_parse("hea(layers=2,rot=yz)", 4);
        check_map("hea(layers=2,rot=yz) (complex)", m, 4, 20, 13, 0);
        check_map("hea(layers=2,rot=yz) (complex)", m, 4, 21, 0, 0);
        qk_map_free(m);
    }
    {   /* past the products' blocks: n and the columns not multiples of the 6 x 8 micro-blocks,
           several 48 x 128 work items, 2^9 (real) and 2 x 2^8 (complex) amplitudes: two chunks
           of 256 of the inner dimension */
        qk_map *m = qk_test_parse("hea(layers=2)", 9);
        check_map("hea(layers=2) q=9 (real, blocks)", m, 9, 140, 0, 0);
        check_map("hea(layers=2) q=9 (real, blocks)", m, 9, 131, 77, 0);
        qk_map_free(m);
        m = qk_test_parse("hea(layers=2,rot=yz)", 8);
        check_map("hea(rot=yz) q=8 (complex, blocks)", m, 8, 103, 0, 0);
        check_map("hea(rot=yz) q=8 (complex, blocks)", m, 8, 97, 53, 0);
        qk_map_free(m);
    }
    {   /* a product map with complex states (no entangler: the map's class is product) */
        const qk_op ops[] = {
            qk_test_op(QK_OP_H, 0, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),       qk_test_op(QK_OP_RX, 1, 0, QK_ARG_W, 0, 0, 0, 0.9, 0.1),
            qk_test_op(QK_OP_RZ, 0, 0, QK_ARG_W, 0, 0, 1, 1.0, 0),        qk_test_op(QK_OP_RY, 1, 0, QK_ARG_X, 1, 0, 0, 1.0, 0),
            qk_test_op(QK_OP_P, 0, 0, QK_ARG_W, 0, 0, 2, 1.2, 0),
        };
        qk_map *m = qk_test_custom(2, 2, ops, (int)(sizeof ops / sizeof ops[0]), 3);
        CHECK(m->cls == QK_CLASS_PRODUCT, "the map's class is %d, not product", (int)m->cls);
        check_map("custom product map (complex states)", m, 2, 26, 0, 1);
        check_map("custom product map (complex states)", m, 2, 22, 15, 1);
        qk_map_free(m);
    }
    {   /* dL/dX: every angle form that reads x, on each angled gate kind */
        const qk_op ops[] = {
            qk_test_op(QK_OP_H, 0, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),       qk_test_op(QK_OP_H, 1, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),
            qk_test_op(QK_OP_RZ, 0, 0, QK_ARG_X, 0, 0, 0, 1.3, 0.2),      qk_test_op(QK_OP_RX, 2, 0, QK_ARG_XX, 1, 2, 0, 0.7, 0),
            qk_test_op(QK_OP_CNOT, 0, 1, QK_ARG_CONST, 0, 0, 0, 1, 0),    qk_test_op(QK_OP_RY, 1, 0, QK_ARG_WX, 2, 0, 1, 1.1, 0),
            qk_test_op(QK_OP_RZZ, 1, 2, QK_ARG_PIXX, 0, 2, 0, 0.4, -0.2), qk_test_op(QK_OP_P, 0, 0, QK_ARG_XX, 1, 1, 0, 0.9, 0),
            qk_test_op(QK_OP_RY, 2, 0, QK_ARG_X, 1, 0, 0, -0.8, 0),       qk_test_op(QK_OP_CZ, 0, 2, QK_ARG_CONST, 0, 0, 0, 1, 0),
            qk_test_op(QK_OP_P, 2, 0, QK_ARG_PIXX, 1, 0, 0, 0.3, 0.1),    qk_test_op(QK_OP_RX, 1, 0, QK_ARG_WX, 0, 0, 0, 0.6, 0),
            qk_test_op(QK_OP_RZZ, 0, 2, QK_ARG_X, 2, 0, 0, 1.0, 0),       qk_test_op(QK_OP_RZ, 1, 0, QK_ARG_WX, 1, 0, 1, -1.2, 0),
            qk_test_op(QK_OP_RY, 0, 0, QK_ARG_W, 0, 0, 0, 2.0, 0),
        };
        const double w[2] = {0.8, -1.3};
        static const char *specs[] = {"zz(reps=2)", "iqp", "angle(rot=x)", "angle(rot=y)", "hea(layers=2)", "hea(layers=2,rot=yz)"};
        int sp;
        qk_map *m = qk_test_custom(3, 3, ops, (int)(sizeof ops / sizeof ops[0]), 2);
        qk_map_set_weights(m, w, 2);
        check_dx("custom: x, xx', xx, (pi-x)(pi-x'), wx", m, 3, 14, 0);
        check_dx("custom: x, xx', xx, (pi-x)(pi-x'), wx", m, 3, 11, 9);
        qk_map_free(m);
        for (sp = 0; sp < (int)(sizeof specs / sizeof specs[0]); sp++) {
            m = qk_test_parse(specs[sp], 4);
            if (m->n_weights > 0) {
                double wr[16];
                int k;
                for (k = 0; k < m->n_weights; k++) wr[k] = qk_test_uniform(-1.5, 1.5);
                qk_map_set_weights(m, wr, m->n_weights);
            }
            check_dx(specs[sp], m, 4, 12, 0);
            check_dx(specs[sp], m, 4, 10, 7);
            qk_map_free(m);
        }
    }
    {   /* the thread count changes nothing: every entry of each product and each sweep chunk is
           summed in a fixed order */
        static const char *specs[] = {"hea(layers=2)", "hea(layers=2,rot=yz)"};
        int sp, yy;
        for (sp = 0; sp < 2; sp++)
            for (yy = 0; yy < 2; yy++) {
                const int q = 8;
                const int64_t nx = 117, ny = yy ? 61 : 0, cols = ny ? ny : nx;
                qk_map *m = qk_test_parse(specs[sp], q);
                double *x = qk_test_rand_data(nx, q, -1.2, 1.2), *y = ny ? qk_test_rand_data(ny, q, -1.2, 1.2) : NULL;
                double *G = qk_test_rand_data(nx, (int)cols, -1, 1), *g[3], *K[3], *gx[3];
                int nt, same = 1;
                for (nt = 0; nt < 3; nt++) {
                    qk_ctx_desc cd1;
                    qk_ctx *c1 = NULL;
                    qk_vjp_desc v;
                    g[nt] = (double *)malloc(sizeof(double) * (size_t)m->n_weights);
                    K[nt] = (double *)malloc(sizeof(double) * (size_t)(nx * cols));
                    gx[nt] = (double *)malloc(sizeof(double) * (size_t)(nx * q));
                    memset(&cd1, 0, sizeof cd1);
                    cd1.device = QK_DEVICE_CPU;
                    cd1.n_threads = nt + 1;
                    CHECK(qk_ctx_create(&cd1, &c1) == QK_OK, "ctx: %s", qk_last_error());
                    memset(&v, 0, sizeof v);
                    v.x = x; v.n_x = nx; v.y = y; v.n_y = ny; v.g = G; v.grad_w = g[nt]; v.k_out = K[nt]; v.grad_x = gx[nt];
                    CHECK(qk_gram_vjp(c1, m, &v) == QK_OK, "%s on %d threads: %s", specs[sp], nt + 1, qk_last_error());
                    qk_ctx_destroy(c1);
                    if (nt > 0)
                        same &= memcmp(g[0], g[nt], sizeof(double) * (size_t)m->n_weights) == 0 &&
                                memcmp(K[0], K[nt], sizeof(double) * (size_t)(nx * cols)) == 0 &&
                                memcmp(gx[0], gx[nt], sizeof(double) * (size_t)(nx * q)) == 0;
                }
                CHECK(same, "%s %s: the gradient, dL/dX or K differs between 1, 2 and 3 threads", specs[sp], ny ? "K(X,Y)" : "K(X,X)");
                for (nt = 0; nt < 3; nt++) { free(g[nt]); free(K[nt]); free(gx[nt]); }
                free(x); free(y); free(G);
                qk_map_free(m);
            }
    }
    {   /* the progress callback: polled, and a cancel leaves grad_w and k_out untouched */
        qk_map *m = qk_test_parse("hea(layers=2)", 4);
        double *x = qk_test_rand_data(40, 4, -1, 1), *G = qk_test_rand_data(40, 40, -1, 1), g0[8], g1[8], K[1600];
        qk_vjp_desc v;
        int calls = 0, k;
        memset(&v, 0, sizeof v);
        v.x = x; v.n_x = 40; v.g = G; v.grad_w = g0;
        CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_OK, "no callback: %s", qk_last_error());
        v.progress = count_calls; v.progress_user = &calls; v.grad_w = g1;
        CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_OK && calls >= 3 && memcmp(g0, g1, sizeof g0) == 0, "progress: %d calls, %s", calls, qk_last_error());
        for (k = 0; k < 8; k++) g1[k] = -7.0;
        for (k = 0; k < 1600; k++) K[k] = -7.0;
        v.k_out = K;
        for (k = 0; k < 4; k++) {   /* a cancel at the k-th poll (states, S, adjoint vectors, a sweep chunk) */
            int at = k + 1, i, clean = 1;
            v.progress = cancel_at; v.progress_user = &at;
            CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_ERROR_CANCELLED, "cancel at poll %d: %s", k + 1, qk_last_error());
            for (i = 0; i < 8; i++) clean &= g1[i] == -7.0;
            for (i = 0; i < 1600; i++) clean &= K[i] == -7.0;
            CHECK(clean, "cancel at poll %d: the outputs were written", k + 1);
        }
        free(x); free(G);
        qk_map_free(m);
    }
    {   /* errors */
        qk_map *m = qk_test_parse("hea(layers=1)", 3);
        double x[6] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, G[4] = {1, 0, 0, 1}, grad[3];
        qk_vjp_desc v;
        memset(&v, 0, sizeof v);
        v.x = x; v.n_x = 2; v.g = G; v.grad_w = grad;
        G[1] = NAN;
        CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_ERROR_NON_FINITE && strstr(qk_last_error(), "g[0][1]"), "NaN in G: %s", qk_last_error());
        G[1] = 0;
        v.grad_w = NULL;
        CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_ERROR_INVALID_ARGUMENT, "grad_w NULL accepted");
        v.grad_w = grad;
        v.ld_g = 1;
        CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "ld_g"), "ld_g: %s", qk_last_error());
        v.ld_g = 0;
        v.grad_y = grad;
        CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "grad_y"), "grad_y of K(X,X): %s", qk_last_error());
        v.grad_y = NULL;
        x[3] = NAN;
        CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_ERROR_NON_FINITE, "NaN in X: %s", qk_last_error());
        x[3] = 0.4;
        qk_map_free(m);
        m = qk_test_parse("amplitude", 3);
        v.grad_w = NULL; v.grad_x = grad;
        CHECK(qk_gram_vjp(g_ctx, m, &v) == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "amplitude"), "grad_x of an amplitude map: %s",
              qk_last_error());
        qk_map_free(m);
    }
    qk_ctx_destroy(g_ctx);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
