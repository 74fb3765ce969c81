/* qk_gram_states on the CPU engine (issue 28): K from given statevectors.
   - qk's own states (qk_states) given back: K bit for bit the map path's K, complex and real,
     K(X,X) and K(X,Y), every output (HOST with ld, CALLBACK, NPY), all resident and in state
     tiles (a small host budget, the plan checked to tile);
   - random states no feature map makes (a Haar-like complex vector, a dim that is no power of
     two, complex64 / float32 / float64 rows, an ld past dim, unaligned rows) against K computed
     here from the definition;
   - the provider: the same K bit for bit, the rows asked for counted against the plan, a
     failing provider and bad rows from it (errors, the output file untouched);
   - validation: NaN, a norm off 1 (named row), normalize = 1, a zero state, bad arguments;
   - rows whose ld pads them, in an array that ends at the last row's elements (a guard page
     after it): nothing reads past the end. */
#define _DEFAULT_SOURCE 1   /* MAP_ANONYMOUS (qk_test_guarded) */
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"

#include <stdint.h>
#include <unistd.h>

/* K[i][j] = |sum_k conj(a_ik) b_jk|^2 in long double, from interleaved complex rows */
static void ref_gram(const double *a, int64_t na, const double *b, int64_t nb, int64_t dim, double *K)
{
    int64_t i, j, k;
    for (i = 0; i < na; i++)
        for (j = 0; j < nb; j++) {
            long double re = 0, im = 0;
            for (k = 0; k < dim; k++) {
                long double ar = a[2 * (i * dim + k)], ai = a[2 * (i * dim + k) + 1];
                long double br = b[2 * (j * dim + k)], bi = b[2 * (j * dim + k) + 1];
                re += ar * br + ai * bi;
                im += ar * bi - ai * br;
            }
            K[i * nb + j] = (double)(re * re + im * im);
        }
}

/* n random normalised complex states of dim amplitudes (Gaussian entries), interleaved */
static double *rand_states(int64_t n, int64_t dim, int real)
{
    double *s = (double *)malloc(sizeof(double) * (size_t)(2 * n * dim));
    int64_t i, k;
    for (i = 0; i < n; i++) {
        long double ss = 0;
        for (k = 0; k < dim; k++) {
            double u1 = qk_test_urand() + 1e-300, u2 = qk_test_urand();
            double r = sqrt(-2.0 * log(u1));
            s[2 * (i * dim + k)] = r * cos(6.283185307179586 * u2);
            s[2 * (i * dim + k) + 1] = real ? 0.0 : r * sin(6.283185307179586 * u2);
            ss += (long double)s[2 * (i * dim + k)] * s[2 * (i * dim + k)] + (long double)s[2 * (i * dim + k) + 1] * s[2 * (i * dim + k) + 1];
        }
        for (k = 0; k < 2 * dim; k++) s[2 * i * dim + k] = (double)(s[2 * i * dim + k] / sqrtl(ss));
    }
    return s;
}

static qk_gram_desc host_desc(void *out, int64_t ld)
{
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.output = QK_OUTPUT_HOST;
    g.out = out;
    g.ld_out = ld;
    g.out_dtype = QK_F64;
    return g;
}

/* A CPU context whose host budget holds half of the states the plan of (st, g) keeps resident,
   with its scratch: the engine must tile (the scratch depends on the build's vector width). */
static qk_ctx *tiny_ctx(qk_ctx *ctx, const qk_states_desc *st, const qk_gram_desc *g)
{
    qk_plan p;
    qk_ctx_desc cd;
    qk_ctx *t = NULL;
    if (qk_plan_states(ctx, st, g, &p) != QK_OK) { printf("plan: %s\n", qk_last_error()); exit(2); }
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 2;
    cd.host_memory = p.bytes_workspace + p.bytes_staging + p.bytes_states / 2;
    if (qk_ctx_create(&cd, &t) != QK_OK) { printf("ctx: %s\n", qk_last_error()); exit(2); }
    return t;
}

static int equal_bits(const double *a, const double *b, int64_t rows, int64_t cols, int64_t lda, int64_t ldb)
{
    int64_t i;
    for (i = 0; i < rows; i++)
        if (memcmp(a + i * lda, b + i * ldb, sizeof(double) * (size_t)cols) != 0) return 0;
    return 1;
}

/* ---- qk's own states: bit for bit the map path ---- */
static void own_states(qk_ctx *ctx, const char *spec, int d, int64_t nx, int64_t ny)
{
    qk_map *m = qk_test_parse(spec, d);
    const int64_t D = (int64_t)1 << m->n_qubits, cols = ny ? ny : nx, ld = cols + 3;
    const int real = m->cls == QK_CLASS_REAL;
    double *x = qk_test_rand_data(nx, d, -1.5, 1.5), *y = ny ? qk_test_rand_data(ny, d, -1.5, 1.5) : NULL;
    double *sx = (double *)malloc(sizeof(double) * (size_t)(2 * nx * D)), *sy = ny ? (double *)malloc(sizeof(double) * (size_t)(2 * ny * D)) : NULL;
    double *rx = NULL, *ry = NULL;   /* the real parts, for a real map */
    double *Km = (double *)malloc(sizeof(double) * (size_t)(nx * ld)), *Ks = (double *)malloc(sizeof(double) * (size_t)(nx * ld));
    qk_gram_desc g = host_desc(Km, ld);
    qk_states_desc st;
    qk_plan plan;
    int64_t i, k;
    int tiled;
    char path[256];
    g.x = x; g.n_x = nx; g.y = y; g.n_y = ny;
    CHECK(qk_states(ctx, m, x, nx, sx) == QK_OK, "%s: qk_states: %s", spec, qk_last_error());
    if (ny) CHECK(qk_states(ctx, m, y, ny, sy) == QK_OK, "%s: qk_states: %s", spec, qk_last_error());
    CHECK(qk_gram(ctx, m, &g) == QK_OK, "%s: qk_gram: %s", spec, qk_last_error());
    memset(&st, 0, sizeof st);
    st.dim = D;
    if (real) {   /* a real map's states as float64 rows: the real path, as the map takes */
        rx = (double *)malloc(sizeof(double) * (size_t)(nx * D));
        for (i = 0; i < nx; i++) for (k = 0; k < D; k++) rx[i * D + k] = sx[2 * (i * D + k)];
        if (ny) {
            ry = (double *)malloc(sizeof(double) * (size_t)(ny * D));
            for (i = 0; i < ny; i++) for (k = 0; k < D; k++) ry[i * D + k] = sy[2 * (i * D + k)];
        }
        st.type = QK_STATE_F64; st.a = rx; st.b = ry;
    } else {
        st.type = QK_STATE_C128; st.a = sx; st.b = sy;
    }
    st.n_a = nx; st.n_b = ny;
    for (tiled = 0; tiled < 2; tiled++) {
        qk_gram_desc h = host_desc(Ks, ld);
        qk_ctx *c = tiled ? tiny_ctx(ctx, &st, &h) : ctx;
        for (i = 0; i < nx * ld; i++) Ks[i] = NAN;
        CHECK(qk_plan_states(c, &st, &h, &plan) == QK_OK, "%s: qk_plan_states: %s", spec, qk_last_error());
        CHECK(plan.path == (real ? QK_PATH_REAL : QK_PATH_COMPLEX) && plan.n_qubits == m->n_qubits, "%s: plan path %d qubits %d", spec,
              (int)plan.path, plan.n_qubits);
        CHECK(tiled ? (plan.bulk_states == 0 && plan.state_tile > 0 && plan.state_tile < (nx > cols ? nx : cols)) : plan.bulk_states == 1,
              "%s tiled=%d: plan bulk %d tile %lld", spec, tiled, plan.bulk_states, (long long)plan.state_tile);
        CHECK(qk_gram_states(c, &st, &h) == QK_OK, "%s: qk_gram_states: %s", spec, qk_last_error());
        CHECK(equal_bits(Km, Ks, nx, cols, ld, ld), "%s %s tiled=%d: K from the states differs from the map's K (max %.3g)", spec,
              ny ? "K(X,Y)" : "K(X,X)", tiled, qk_test_max_diff(Km, Ks, nx * ld));
        /* the tile callback */
        {
            qk_test_tiles tt;
            qk_gram_desc t;
            double *Kt = (double *)malloc(sizeof(double) * (size_t)(nx * cols));
            for (i = 0; i < nx * cols; i++) Kt[i] = NAN;
            memset(&tt, 0, sizeof tt);
            tt.K = Kt; tt.rows = nx; tt.cols = cols; tt.side = plan.tile_m; tt.sym = ny == 0;
            memset(&t, 0, sizeof t);
            t.output = QK_OUTPUT_CALLBACK; t.tile_fn = qk_test_on_tile; t.tile_user = &tt; t.out_dtype = QK_F64;
            CHECK(qk_gram_states(c, &st, &t) == QK_OK, "%s: callback: %s", spec, qk_last_error());
            CHECK(tt.bad == 0 && equal_bits(Km, Kt, nx, cols, ld, cols), "%s tiled=%d: callback K differs (bad %d)", spec, tiled, tt.bad);
            free(Kt);
        }
        /* the streamed .npy */
        {
            qk_gram_desc f;
            qk_array arr;
            snprintf(path, sizeof path, "states_in_%d_%d.npy", (int)getpid(), tiled);
            memset(&f, 0, sizeof f);
            f.output = QK_OUTPUT_NPY; f.out_path = path; f.out_dtype = QK_F64; f.no_sync = 1;
            CHECK(qk_gram_states(c, &st, &f) == QK_OK, "%s: npy: %s", spec, qk_last_error());
            memset(&arr, 0, sizeof arr);
            CHECK(qk_npy_read(path, &arr) == QK_OK && arr.rows == nx && arr.cols == cols, "%s: npy read back: %s", spec, qk_last_error());
            if (arr.data && arr.rows == nx && arr.cols == cols)
                CHECK(equal_bits(Km, arr.data, nx, cols, ld, cols), "%s tiled=%d: npy K differs", spec, tiled);
            qk_array_free(&arr);
            remove(path);
        }
        if (tiled) qk_ctx_destroy(c);
    }
    free(x); free(y); free(sx); free(sy); free(rx); free(ry); free(Km); free(Ks);
    qk_map_free(m);
}

/* v rounded to float (through a volatile: gcc -O3 -march=native kept the double here) */
static double to_f32(double v)
{
    volatile float f = (float)v;
    return f;
}

/* ---- random states of every type against the definition ---- */
static void typed_states(qk_ctx *ctx, qk_state_type type, int64_t dim, int64_t na, int64_t nb, int64_t pad, int unaligned)
{
    const int real = type == QK_STATE_F64 || type == QK_STATE_F32, f32 = type == QK_STATE_C64 || type == QK_STATE_F32;
    const int es = type == QK_STATE_C128 ? 16 : type == QK_STATE_F32 ? 4 : 8;
    const int64_t ld = dim + pad, cols = nb ? nb : na;
    double *a = rand_states(na, dim, real), *b = nb ? rand_states(nb, dim, real) : NULL;
    double *Kr = (double *)malloc(sizeof(double) * (size_t)(na * cols)), *K = (double *)malloc(sizeof(double) * (size_t)(na * cols));
    char *ba = (char *)calloc((size_t)(na * ld * es + 8), 1), *bb = nb ? (char *)calloc((size_t)(nb * ld * es + 8), 1) : NULL;
    char *pa = ba + (unaligned ? 4 : 0), *pb = bb ? bb + (unaligned ? 4 : 0) : NULL;
    qk_states_desc st;
    qk_gram_desc g = host_desc(K, cols);
    int64_t i, k, side;
    double err, bound;
    /* the typed rows (rounded to float where the type is), and the reference from them */
    for (side = 0; side < (nb ? 2 : 1); side++) {
        double *s = side ? b : a;
        char *p = side ? pb : pa;
        const int64_t n = side ? nb : na;
        for (i = 0; i < n; i++)
            for (k = 0; k < dim; k++) {
                double re = s[2 * (i * dim + k)], im = s[2 * (i * dim + k) + 1];
                char *e = p + (size_t)(i * ld + k) * (size_t)es;
                if (f32) { re = to_f32(re); im = to_f32(im); }
                s[2 * (i * dim + k)] = re; s[2 * (i * dim + k) + 1] = im;
                switch (type) {
                case QK_STATE_C128: memcpy(e, &re, 8); memcpy(e + 8, &im, 8); break;
                case QK_STATE_C64: { float v[2] = {(float)re, (float)im}; memcpy(e, v, 8); break; }
                case QK_STATE_F64: memcpy(e, &re, 8); break;
                default: { float v = (float)re; memcpy(e, &v, 4); break; }
                }
            }
    }
    ref_gram(a, na, nb ? b : a, cols, dim, Kr);
    memset(&st, 0, sizeof st);
    st.type = type; st.dim = dim; st.a = pa; st.n_a = na; st.lda = ld; st.b = pb; st.n_b = nb; st.ldb = ld;
    for (i = 0; i < na * cols; i++) K[i] = NAN;
    CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "type %d dim %lld: %s", (int)type, (long long)dim, qk_last_error());
    err = qk_test_max_diff(Kr, K, na * cols);
    bound = 1e-13 * (double)dim;
    CHECK(err <= bound, "type %d dim %lld ld %lld%s %s: |K - K_ref| = %.3g > %.3g", (int)type, (long long)dim, (long long)ld,
          unaligned ? " unaligned" : "", nb ? "K(A,B)" : "K(A,A)", err, bound);
    if (!nb && !f32)
        for (i = 0; i < na; i++) CHECK(fabs(K[i * cols + i] - 1.0) <= 1e-12, "type %d: K[%lld][%lld] = %.17g", (int)type, (long long)i, (long long)i, K[i * cols + i]);
    free(a); free(b); free(Kr); free(K); free(ba); free(bb);
}

/* ---- the provider ---- */
typedef struct prov {
    const double *s[2];     /* interleaved complex states of A and B */
    int64_t dim, rows_asked[2], calls, fail_at, nan_at;
} prov;

static int provide(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user)
{
    prov *p = (prov *)user;
    int64_t i;
    p->calls++;
    if (p->fail_at >= 0 && p->calls > p->fail_at) return 1;
    p->rows_asked[side] += i1 - i0;
    for (i = i0; i < i1; i++) {
        memcpy((double *)buf + 2 * (i - i0) * ld, p->s[side] + 2 * i * p->dim, sizeof(double) * (size_t)(2 * p->dim));
        if (i == p->nan_at) ((double *)buf)[2 * (i - i0) * ld + 3] = NAN;
    }
    return 0;
}

static void provider_cases(qk_ctx *ctx)
{
    qk_ctx *tiny;
    const int64_t dim = 256, na = 300, nb = 140;
    double *a = rand_states(na, dim, 0), *b = rand_states(nb, dim, 0);
    double *K0 = (double *)malloc(sizeof(double) * (size_t)(na * na)), *K = (double *)malloc(sizeof(double) * (size_t)(na * na));
    qk_states_desc st, sp;
    qk_gram_desc g;
    qk_plan plan;
    prov p;
    int tiled, sym;
    int64_t i;
    char path[256];
    for (sym = 0; sym <= 1; sym++) {
        const int64_t cols = sym ? na : nb;
        memset(&st, 0, sizeof st);
        st.dim = dim; st.a = a; st.n_a = na; st.b = sym ? NULL : b; st.n_b = sym ? 0 : nb;
        g = host_desc(K0, cols);
        CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "resident: %s", qk_last_error());
        tiny = tiny_ctx(ctx, &st, &g);
        for (tiled = 0; tiled < 2; tiled++) {
            qk_ctx *c = tiled ? tiny : ctx;
            int64_t R, blocks, want_a, want_b;
            memset(&p, 0, sizeof p);
            p.s[0] = a; p.s[1] = b; p.dim = dim; p.fail_at = -1; p.nan_at = -1;
            memset(&sp, 0, sizeof sp);
            sp.dim = dim; sp.n_a = na; sp.n_b = sym ? 0 : nb; sp.provider = provide; sp.provider_user = &p;
            g = host_desc(K, cols);
            for (i = 0; i < na * cols; i++) K[i] = NAN;
            CHECK(qk_plan_states(c, &sp, &g, &plan) == QK_OK, "provider plan: %s", qk_last_error());
            CHECK(qk_gram_states(c, &sp, &g) == QK_OK, "provider: %s", qk_last_error());
            CHECK(equal_bits(K0, K, na, cols, cols, cols), "provider sym=%d tiled=%d: K differs from the resident states' K", sym, tiled);
            /* the rows asked for, as qk_plan_states documents */
            R = plan.bulk_states ? 0 : plan.state_tile;
            CHECK(tiled ? R > 0 && R < na : R == 0, "provider tiled=%d: state_tile %lld", tiled, (long long)R);
            blocks = R ? (na + R - 1) / R : 1;
            if (!R) { want_a = na; want_b = sym ? 0 : nb; }
            else if (sym) {
                int64_t i0, c0;
                want_a = 0;
                for (i0 = 0; i0 < na; i0 += R) {
                    want_a += na - i0 < R ? na - i0 : R;
                    for (c0 = i0 + R; c0 < na; c0 += R) want_a += na - c0 < R ? na - c0 : R;
                }
                want_b = 0;
            } else { want_a = na; want_b = nb * blocks; }
            CHECK(p.rows_asked[0] == want_a && p.rows_asked[1] == want_b, "provider sym=%d tiled=%d R=%lld: rows asked A %lld B %lld, want %lld %lld",
                  sym, tiled, (long long)R, (long long)p.rows_asked[0], (long long)p.rows_asked[1], (long long)want_a, (long long)want_b);
        }
        if (sym) break;   /* tiny stays, for the failure cases below (K(A,A)) */
        qk_ctx_destroy(tiny);
    }
    /* a failing provider: an error, the .npy not written, no temporary left */
    snprintf(path, sizeof path, "states_prov_%d.npy", (int)getpid());
    qk_test_write_text(path, "old");
    for (tiled = 0; tiled < 2; tiled++) {
        qk_gram_desc f;
        qk_result r;
        size_t len = 0;
        char *old;
        memset(&p, 0, sizeof p);
        p.s[0] = a; p.s[1] = b; p.dim = dim; p.fail_at = 1; p.nan_at = -1;
        memset(&sp, 0, sizeof sp);
        sp.dim = dim; sp.n_a = na; sp.provider = provide; sp.provider_user = &p;
        memset(&f, 0, sizeof f);
        f.output = QK_OUTPUT_NPY; f.out_path = path; f.out_dtype = QK_F64; f.no_sync = 1;
        r = qk_gram_states(tiled ? tiny : ctx, &sp, &f);
        if (!tiled) CHECK(r == QK_OK, "one provider call for resident states: %s", qk_last_error()); /* one chunk: no second call */
        else {
            CHECK(r == QK_ERROR_CANCELLED && strstr(qk_last_error(), "provider failed"), "failing provider: %d %s", (int)r, qk_last_error());
            old = qk_test_read_file(path, &len);
            CHECK(old && len == 3 && !memcmp(old, "old", 3), "failing provider: the old file changed");
            free(old);
        }
        qk_test_write_text(path, "old");
    }
    /* a NaN from the provider: the row named */
    memset(&p, 0, sizeof p);
    p.s[0] = a; p.s[1] = b; p.dim = dim; p.fail_at = -1; p.nan_at = 77;
    memset(&sp, 0, sizeof sp);
    sp.dim = dim; sp.n_a = na; sp.provider = provide; sp.provider_user = &p;
    g = host_desc(K, na);
    CHECK(qk_gram_states(tiny, &sp, &g) == QK_ERROR_NON_FINITE && strstr(qk_last_error(), "A[77]"), "provider NaN: %s", qk_last_error());
    CHECK(qk_gram_states(ctx, &sp, &g) == QK_ERROR_NON_FINITE && strstr(qk_last_error(), "A[77]"), "provider NaN (resident): %s", qk_last_error());
    remove(path);
    qk_ctx_destroy(tiny);
    free(a); free(b); free(K0); free(K);
}


/* ---- mixed states: density matrices, K = Tr(rho_i rho_j) ---- */
/* n random density matrices dim x dim (interleaved complex128): mixtures of 3 random states with
   random weights summing to 1 */
static double *rand_rho(int64_t n, int64_t dim)
{
    double *r = (double *)calloc((size_t)(2 * n * dim * dim), sizeof(double));
    int64_t i, k, a, b;
    for (i = 0; i < n; i++) {
        double *psi = rand_states(3, dim, 0), w[3], ws = 0;
        for (k = 0; k < 3; k++) { w[k] = qk_test_urand() + 0.05; ws += w[k]; }
        for (k = 0; k < 3; k++)
            for (a = 0; a < dim; a++)
                for (b = 0; b < dim; b++) {
                    double ar = psi[2 * (k * dim + a)], ai = psi[2 * (k * dim + a) + 1], br = psi[2 * (k * dim + b)], bi = psi[2 * (k * dim + b) + 1];
                    r[2 * ((i * dim + a) * dim + b)] += w[k] / ws * (ar * br + ai * bi);
                    r[2 * ((i * dim + a) * dim + b) + 1] += w[k] / ws * (ai * br - ar * bi);
                }
        free(psi);
    }
    return r;
}

/* Tr(rho sigma) = sum_ab rho[a][b] sigma[b][a], long double */
static double tr_prod(const double *r, const double *s, int64_t dim)
{
    long double t = 0;
    int64_t a, b;
    for (a = 0; a < dim; a++)
        for (b = 0; b < dim; b++) {
            long double xr = r[2 * (a * dim + b)], xi = r[2 * (a * dim + b) + 1], yr = s[2 * (b * dim + a)], yi = s[2 * (b * dim + a) + 1];
            t += xr * yr - xi * yi;
        }
    return (double)t;
}

/* <psi|rho|psi>, long double */
static double expect(const double *psi, const double *r, int64_t dim)
{
    long double re = 0;
    int64_t a, b;
    for (a = 0; a < dim; a++)
        for (b = 0; b < dim; b++) {
            long double pr = psi[2 * a], pi = -psi[2 * a + 1], rr = r[2 * (a * dim + b)], ri = r[2 * (a * dim + b) + 1];
            long double qr = psi[2 * b], qi = psi[2 * b + 1];
            long double tr = pr * rr - pi * ri, ti = pr * ri + pi * rr;
            re += tr * qr - ti * qi;
        }
    return (double)re;
}

static void mixed_cases(qk_ctx *ctx)
{
    const int64_t dims[2] = {8, 6};
    int di;
    for (di = 0; di < 2; di++) {
        const int64_t dim = dims[di], na = 40, nb = 25;
        double *ra = rand_rho(na, dim), *rb = rand_rho(nb, dim), *pa = rand_states(na, dim, 0);
        double *K = (double *)malloc(sizeof(double) * (size_t)(na * na)), err = 0;
        qk_states_desc st;
        qk_gram_desc g;
        int64_t i, j;
        /* K(rho, rho): Tr(rho_i rho_j), purity on the diagonal */
        memset(&st, 0, sizeof st);
        st.dim = dim; st.a = ra; st.n_a = na; st.a_mixed = 1;
        g = host_desc(K, na);
        CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "mixed K(A,A) dim %lld: %s", (long long)dim, qk_last_error());
        for (i = 0; i < na; i++)
            for (j = 0; j < na; j++) err = fmax(err, fabs(K[i * na + j] - tr_prod(ra + 2 * i * dim * dim, ra + 2 * j * dim * dim, dim)));
        CHECK(err <= 1e-13, "mixed K(A,A) dim %lld: |K - Tr(rho rho)| = %.3g", (long long)dim, err);
        CHECK(K[0] < 0.999 && K[0] > 1.0 / (double)dim - 1e-12, "mixed: purity %.17g of a mixture", K[0]);
        /* K(rho_A, rho_B) */
        st.b = rb; st.n_b = nb; st.b_mixed = 1;
        g = host_desc(K, nb);
        err = 0;
        CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "mixed K(A,B): %s", qk_last_error());
        for (i = 0; i < na; i++)
            for (j = 0; j < nb; j++) err = fmax(err, fabs(K[i * nb + j] - tr_prod(ra + 2 * i * dim * dim, rb + 2 * j * dim * dim, dim)));
        CHECK(err <= 1e-13, "mixed K(A,B) dim %lld: %.3g", (long long)dim, err);
        /* pure A against mixed B: <psi|rho|psi> */
        st.a = pa; st.a_mixed = 0;
        err = 0;
        CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "pure vs mixed: %s", qk_last_error());
        for (i = 0; i < na; i++)
            for (j = 0; j < nb; j++) err = fmax(err, fabs(K[i * nb + j] - expect(pa + 2 * i * dim, rb + 2 * j * dim * dim, dim)));
        CHECK(err <= 1e-13, "pure vs mixed dim %lld: |K - <psi|rho|psi>| = %.3g", (long long)dim, err);
        /* mixed A against pure B: the transpose's values */
        {
            double *K2 = (double *)malloc(sizeof(double) * (size_t)(na * nb));
            qk_states_desc s2;
            memset(&s2, 0, sizeof s2);
            s2.dim = dim; s2.a = rb; s2.n_a = nb; s2.a_mixed = 1; s2.b = pa; s2.n_b = na;
            g = host_desc(K2, na);
            CHECK(qk_gram_states(ctx, &s2, &g) == QK_OK, "mixed vs pure: %s", qk_last_error());
            err = 0;
            for (i = 0; i < na; i++)
                for (j = 0; j < nb; j++) err = fmax(err, fabs(K[i * nb + j] - K2[j * na + i]));
            CHECK(err <= 1e-15, "mixed vs pure is the transpose of pure vs mixed: %.3g", err);
            free(K2);
        }
        /* pure states given as |psi><psi| give the pure path's |<a|b>|^2 */
        {
            double *K1 = (double *)malloc(sizeof(double) * (size_t)(na * na)), *pp = (double *)calloc((size_t)(2 * na * dim * dim), sizeof(double));
            int64_t a, b;
            for (i = 0; i < na; i++)
                for (a = 0; a < dim; a++)
                    for (b = 0; b < dim; b++) {
                        const double *p = pa + 2 * i * dim;
                        pp[2 * ((i * dim + a) * dim + b)] = p[2 * a] * p[2 * b] + p[2 * a + 1] * p[2 * b + 1];
                        pp[2 * ((i * dim + a) * dim + b) + 1] = p[2 * a + 1] * p[2 * b] - p[2 * a] * p[2 * b + 1];
                    }
            memset(&st, 0, sizeof st);
            st.dim = dim; st.a = pa; st.n_a = na;
            g = host_desc(K1, na);
            CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "pure: %s", qk_last_error());
            st.a = pp; st.a_mixed = 1;
            g = host_desc(K, na);
            CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "pure as matrices: %s", qk_last_error());
            CHECK(qk_test_max_diff(K, K1, na * na) <= 1e-13, "|psi><psi| as density matrices vs the pure path: %.3g", qk_test_max_diff(K, K1, na * na));
            free(K1);
            free(pp);
        }
        /* validation: a non-Hermitian matrix, a trace off 1, normalize */
        memset(&st, 0, sizeof st);
        st.dim = dim; st.a = ra; st.n_a = na; st.a_mixed = 1;
        g = host_desc(K, na);
        ra[2 * ((2 * dim + 0) * dim + 1) + 1] += 1e-3;
        CHECK(qk_gram_states(ctx, &st, &g) == QK_ERROR_BAD_DATA && strstr(qk_last_error(), "A[2]") && strstr(qk_last_error(), "Hermitian"),
              "non-Hermitian: %s", qk_last_error());
        ra[2 * ((2 * dim + 0) * dim + 1) + 1] -= 1e-3;
        for (i = 0; i < 2 * dim * dim; i++) ra[2 * 5 * dim * dim + i] *= 2.0;
        CHECK(qk_gram_states(ctx, &st, &g) == QK_ERROR_BAD_DATA && strstr(qk_last_error(), "A[5]") && strstr(qk_last_error(), "trace"),
              "trace 2: %s", qk_last_error());
        st.normalize = 1;
        CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "normalize by the trace: %s", qk_last_error());
        for (i = 0; i < 2 * dim * dim; i++) ra[2 * 5 * dim * dim + i] *= 0.5;
        CHECK(fabs(K[5 * na + 7] - tr_prod(ra + 2 * 5 * dim * dim, ra + 2 * 7 * dim * dim, dim)) <= 1e-13, "normalize: K[5][7] = %.17g",
              K[5 * na + 7]);
        /* Hermitian, trace 1, but not positive: an off-diagonal entry of magnitude past the trace
           (which no density matrix has, and which would overflow the tensor cores' fp16 operands) */
        st.normalize = 0;
        ra[2 * ((3 * dim + 0) * dim + 1)] += 2.0;
        ra[2 * ((3 * dim + 1) * dim + 0)] += 2.0;
        CHECK(qk_gram_states(ctx, &st, &g) == QK_ERROR_BAD_DATA && strstr(qk_last_error(), "A[3]: entry (") &&
              strstr(qk_last_error(), "more than its trace"), "an entry past the trace: %s", qk_last_error());
        ra[2 * ((3 * dim + 0) * dim + 1)] -= 2.0;
        ra[2 * ((3 * dim + 1) * dim + 0)] -= 2.0;
        CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "restored: %s", qk_last_error());
        free(ra); free(rb); free(pa); free(K);
    }
}

/* ---- validation ---- */
static void validation(qk_ctx *ctx)
{
    const int64_t dim = 16, n = 20;
    double *a = rand_states(n, dim, 0), *K = (double *)malloc(sizeof(double) * (size_t)(n * n)), *Kn = (double *)malloc(sizeof(double) * (size_t)(n * n));
    double x1 = 1.0;
    qk_states_desc st;
    qk_gram_desc g = host_desc(K, n);
    qk_result r;
    int64_t i;
    memset(&st, 0, sizeof st);
    st.dim = dim; st.a = a; st.n_a = n;
    a[2 * (5 * dim + 3) + 1] = NAN;
    r = qk_gram_states(ctx, &st, &g);
    CHECK(r == QK_ERROR_NON_FINITE && strstr(qk_last_error(), "A[5]") && strstr(qk_last_error(), "amplitude 3"), "NaN: %d %s", (int)r, qk_last_error());
    a[2 * (5 * dim + 3) + 1] = 0.25;   /* now the norm is off */
    r = qk_gram_states(ctx, &st, &g);
    CHECK(r == QK_ERROR_BAD_DATA && strstr(qk_last_error(), "A[5]") && strstr(qk_last_error(), "norm"), "norm: %d %s", (int)r, qk_last_error());
    /* normalize = 1: K of the scaled states, unit diagonal */
    st.normalize = 1;
    CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "normalize: %s", qk_last_error());
    for (i = 0; i < n; i++) CHECK(fabs(K[i * n + i] - 1.0) < 1e-14, "normalize: K[%lld][%lld] = %.17g", (long long)i, (long long)i, K[i * n + i]);
    {   /* K of row 5 scaled by hand equals what normalize gives */
        long double ss = 0;
        int64_t k;
        for (k = 0; k < 2 * dim; k++) ss += (long double)a[10 * dim + k] * a[10 * dim + k];
        for (k = 0; k < 2 * dim; k++) a[10 * dim + k] = (double)(a[10 * dim + k] / sqrtl(ss));
        st.normalize = 0;
        g.out = Kn;
        CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "scaled by hand: %s", qk_last_error());
        CHECK(qk_test_max_diff(K, Kn, n * n) < 1e-14, "normalize vs by hand: %.3g", qk_test_max_diff(K, Kn, n * n));
        g.out = K;
    }
    memset(a + 2 * 7 * dim, 0, sizeof(double) * (size_t)(2 * dim));
    st.normalize = 1;
    r = qk_gram_states(ctx, &st, &g);
    CHECK(r == QK_ERROR_ZERO_NORM && strstr(qk_last_error(), "A[7]"), "zero state: %d %s", (int)r, qk_last_error());
    st.normalize = 0;
    /* bad arguments */
    st.dim = 1;
    CHECK(qk_gram_states(ctx, &st, &g) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "dim"), "dim 1: %s", qk_last_error());
    st.dim = dim;
    st.lda = dim - 1;
    CHECK(qk_gram_states(ctx, &st, &g) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "lda"), "lda < dim: %s", qk_last_error());
    st.lda = 0;
    st.type = (qk_state_type)9;
    CHECK(qk_gram_states(ctx, &st, &g) == QK_ERROR_INVALID_ARGUMENT, "bad type: %s", qk_last_error());
    st.type = QK_STATE_C128;
    g.x = &x1; g.n_x = 1;
    CHECK(qk_gram_states(ctx, &st, &g) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "desc->x"), "x set: %s", qk_last_error());
    g.x = NULL;
    st.on_device = 1;
    CHECK(qk_gram_states(ctx, &st, &g) != QK_OK, "device states on a CPU context: accepted");
    st.on_device = 0;
    g.path = QK_PATH_MPS;
    CHECK(qk_gram_states(ctx, &st, &g) == QK_ERROR_UNSUPPORTED, "MPS path: %s", qk_last_error());
    g.path = QK_PATH_DEFAULT;
    st.dim = (int64_t)1 << (QK_MAX_STATE_QUBITS + 1);
    CHECK(qk_gram_states(ctx, &st, &g) == QK_ERROR_TOO_MANY_QUBITS, "too large: %s", qk_last_error());
    CHECK(qk_gram_states(ctx, NULL, &g) == QK_ERROR_INVALID_ARGUMENT, "NULL states");
    free(a); free(K); free(Kn);
}

/* Many rows (the check runs on the context's threads in blocks of 256 rows): the first bad row
   is named, whichever block a thread reached first; A and B alike. */
static void validation_many(qk_ctx *ctx)
{
    const int64_t dim = 8, n = 3000, nb = 1500;
    double *a = rand_states(n, dim, 0), *b = rand_states(nb, dim, 0), *K = (double *)malloc(sizeof(double) * (size_t)(n * nb));
    qk_states_desc st;
    qk_gram_desc g = host_desc(K, nb);
    qk_result r;
    memset(&st, 0, sizeof st);
    st.dim = dim; st.a = a; st.n_a = n; st.b = b; st.n_b = nb;
    CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "3000 x 1500 good states: %s", qk_last_error());
    a[2 * (2900 * dim + 1)] *= 1.5;
    a[2 * (700 * dim + 6)] *= 1.5;
    r = qk_gram_states(ctx, &st, &g);
    CHECK(r == QK_ERROR_BAD_DATA && strstr(qk_last_error(), "A[700]"), "bad norms at A[700] and A[2900]: the first named: %d %s", (int)r,
          qk_last_error());
    a[2 * (700 * dim + 6)] /= 1.5;
    r = qk_gram_states(ctx, &st, &g);
    CHECK(r == QK_ERROR_BAD_DATA && strstr(qk_last_error(), "A[2900]"), "bad norm at A[2900] (the last block): %d %s", (int)r, qk_last_error());
    a[2 * (2900 * dim + 1)] /= 1.5;
    b[2 * (1200 * dim + 2) + 1] = NAN;
    r = qk_gram_states(ctx, &st, &g);
    CHECK(r == QK_ERROR_NON_FINITE && strstr(qk_last_error(), "B[1200]"), "NaN at B[1200]: %d %s", (int)r, qk_last_error());
    free(a); free(b); free(K);
}

/* Rows ld = dim + pad apart in an array that ends where its last row's dim elements do, an
   inaccessible page right after: K read in place (aligned rows) equals K from the same states
   packed, and nothing reads the missing padding (a fault otherwise). */
static void guarded_states(qk_ctx *ctx, qk_state_type type, int64_t dim, int64_t pad, int64_t na, int64_t nb)
{
    const int es = type == QK_STATE_C128 ? 16 : type == QK_STATE_F32 ? 4 : 8, real = type == QK_STATE_F64 || type == QK_STATE_F32;
    const int64_t ld = dim + pad, cols = nb ? nb : na;
    const size_t bytes_a = (size_t)((na - 1) * ld + dim) * (size_t)es, bytes_b = nb ? (size_t)((nb - 1) * ld + dim) * (size_t)es : 0;
    qk_test_guard ha = {NULL, 0}, hb = {NULL, 0};
    char *ga = (char *)qk_test_guarded(bytes_a, &ha), *gb = nb ? (char *)qk_test_guarded(bytes_b, &hb) : NULL;
    double *a = rand_states(na, dim, real), *b = nb ? rand_states(nb, dim, real) : NULL;
    double *K = (double *)malloc(sizeof(double) * (size_t)(na * cols)), *Kp = (double *)malloc(sizeof(double) * (size_t)(na * cols));
    qk_states_desc st;
    qk_gram_desc g = host_desc(K, cols), gp = host_desc(Kp, cols);
    int64_t i, k;
    for (i = 0; i < na + nb; i++)
        for (k = 0; k < dim; k++) {
            const double *v = i < na ? a + 2 * (i * dim + k) : b + 2 * ((i - na) * dim + k);
            char *e = i < na ? ga + (size_t)(i * ld + k) * (size_t)es : gb + (size_t)((i - na) * ld + k) * (size_t)es;
            const float f[2] = {(float)v[0], (float)v[1]};
            memcpy(e, type == QK_STATE_C64 || type == QK_STATE_F32 ? (const void *)f : (const void *)v, (size_t)es);
        }
    memset(&st, 0, sizeof st);
    st.type = type; st.dim = dim; st.a = ga; st.n_a = na; st.lda = ld; st.b = gb; st.n_b = nb; st.ldb = ld;
    for (i = 0; i < na * cols; i++) K[i] = Kp[i] = NAN;
    CHECK(qk_gram_states(ctx, &st, &g) == QK_OK, "guarded type %d dim %lld: %s", (int)type, (long long)dim, qk_last_error());
    /* the same rows packed (ld = dim): the reference */
    st.lda = st.ldb = dim;
    {
        char *pa = (char *)malloc((size_t)(na * dim) * (size_t)es), *pb = nb ? (char *)malloc((size_t)(nb * dim) * (size_t)es) : NULL;
        for (i = 0; i < na; i++) memcpy(pa + (size_t)(i * dim) * (size_t)es, ga + (size_t)(i * ld) * (size_t)es, (size_t)(dim * es));
        for (i = 0; i < nb; i++) memcpy(pb + (size_t)(i * dim) * (size_t)es, gb + (size_t)(i * ld) * (size_t)es, (size_t)(dim * es));
        st.a = pa; st.b = pb;
        CHECK(qk_gram_states(ctx, &st, &gp) == QK_OK, "packed type %d dim %lld: %s", (int)type, (long long)dim, qk_last_error());
        free(pa); free(pb);
    }
    CHECK(qk_test_max_diff(K, Kp, na * cols) == 0.0, "guarded type %d dim %lld ld %lld: |K - K_packed| = %.3g", (int)type, (long long)dim,
          (long long)ld, qk_test_max_diff(K, Kp, na * cols));
    free(a); free(b); free(K); free(Kp);
    qk_test_guarded_free(&ha);
    qk_test_guarded_free(&hb);
}

int main(void)
{
    qk_ctx *ctx = qk_test_cpu_ctx(2);
    qk_test_seed();
    own_states(ctx, "zz(reps=2)", 8, 300, 0);
    own_states(ctx, "zz(reps=2,ent=linear)", 8, 230, 170);
    own_states(ctx, "iqp", 8, 260, 0);
    own_states(ctx, "hea(layers=2)", 9, 300, 0);     /* real: float64 rows, the real path */
    own_states(ctx, "hea(layers=1)", 9, 200, 140);
    typed_states(ctx, QK_STATE_C128, 64, 90, 0, 0, 0);
    typed_states(ctx, QK_STATE_C128, 37, 70, 50, 5, 0);    /* dim no power of two, ld past dim */
    typed_states(ctx, QK_STATE_C64, 100, 60, 0, 3, 0);
    typed_states(ctx, QK_STATE_C64, 32, 40, 33, 0, 1);     /* unaligned rows: a packed copy */
    typed_states(ctx, QK_STATE_F64, 200, 50, 0, 0, 0);
    typed_states(ctx, QK_STATE_F32, 7, 64, 0, 0, 0);       /* 28-byte rows: packed to whole doubles */
    typed_states(ctx, QK_STATE_F32, 128, 30, 20, 1, 1);
    guarded_states(ctx, QK_STATE_C128, 37, 5, 70, 0);
    guarded_states(ctx, QK_STATE_F64, 100, 28, 40, 33);
    guarded_states(ctx, QK_STATE_C64, 64, 6, 50, 0);
    provider_cases(ctx);
    mixed_cases(ctx);
    validation(ctx);
    validation_many(ctx);
    qk_ctx_destroy(ctx);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
