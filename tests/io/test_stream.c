/* Streamed output (QK_OUTPUT_NPY) on the CPU engine: K written into its .npy file slab by slab
   must equal the in-memory K bitwise (K(X,X) and K(X,Y), sizes that are not multiples of the
   64-row tiles or of the slabs, float32 and float64, complex / real / product maps); a cancel or
   a failing write leaves no temporary file and the previous file as it was; bad requests are
   refused before anything is created. Built with a small QK_CPU_SLAB_BYTES so that every case
   runs many slabs (and the symmetric mirror goes out as strips). The seed is printed;
   QK_TEST_SEED=... reproduces a run. */
#define _POSIX_C_SOURCE 200809L  /* mkdtemp, setrlimit under strict -std=c11 */
#define QK_CPU_SLAB_BYTES (64 * 1024)
#define QK_IMPLEMENTATION
#include "qk.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <dirent.h>

#include "../qk_test.h"

static char g_dir[512];

static void write_sentinel(const char *path)
{
    FILE *f = fopen(path, "wb");
    if (f) { fputs("previous output", f); fclose(f); }
}

static int sentinel_intact(const char *path)
{
    char buf[64] = "";
    FILE *f = fopen(path, "rb");
    size_t n;
    if (!f) return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strcmp(buf, "previous output") == 0;
}

static int cancel_at(int64_t done, int64_t total, void *user)
{
    (void)total;
    return done >= *(int64_t *)user;
}

static void one_case(qk_ctx *ctx, const char *spec, int d, int64_t nx, int64_t ny, qk_dtype dt)
{
    qk_map *m = NULL;
    double *x, *y = NULL;
    void *ref;
    qk_gram_desc g;
    qk_plan plan;
    qk_array a;
    char path[700];
    const int sym = ny == 0;
    const int64_t cols = sym ? nx : ny;
    const size_t es = dt == QK_F32 ? 4 : 8;
    int64_t i, diff = 0, stop;
    qk_result r;
    if (qk_map_parse(spec, d, &m) != QK_OK) { CHECK(0, "parse %s: %s", spec, qk_last_error()); return; }
    x = (double *)malloc(sizeof(double) * (size_t)(nx * d));
    for (i = 0; i < nx * d; i++) x[i] = 2.0 * 3.14159 * qk_test_urand();
    if (!sym) {
        y = (double *)malloc(sizeof(double) * (size_t)(ny * d));
        for (i = 0; i < ny * d; i++) y[i] = 2.0 * 3.14159 * qk_test_urand();
    }
    ref = malloc(es * (size_t)(nx * cols));
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = nx; g.y = y; g.n_y = ny; g.out_dtype = dt;
    g.out = ref;
    r = qk_gram(ctx, m, &g);
    CHECK(r == QK_OK, "%s in memory: %s", spec, qk_last_error());

    snprintf(path, sizeof path, "%s/K.npy", g_dir);
    g.out = NULL;
    g.output = QK_OUTPUT_NPY;
    g.out_path = path;
    CHECK(qk_plan_make(ctx, m, &g, &plan) == QK_OK && plan.slab_rows >= 64 &&
              (plan.slab_rows < nx || nx <= QK__T || (size_t)(nx * cols) * es <= 2 * QK_CPU_SLAB_BYTES),
          "%s: the plan streams several slabs (slab_rows %lld of %lld rows)", spec, (long long)plan.slab_rows, (long long)nx);
    r = qk_gram(ctx, m, &g);
    CHECK(r == QK_OK, "%s streamed: %s", spec, qk_last_error());
    memset(&a, 0, sizeof a);
    r = qk_npy_read(path, &a);
    CHECK(r == QK_OK && a.rows == nx && a.cols == cols, "%s: streamed file read back: %s", spec, qk_last_error());
    if (r == QK_OK && a.rows == nx && a.cols == cols) {
        for (i = 0; i < nx * cols; i++) {
            double v = dt == QK_F32 ? (double)((float *)ref)[i] : ((double *)ref)[i];
            if (memcmp(&v, &a.data[i], sizeof v) != 0) diff++;
        }
        CHECK(diff == 0, "%s %s %s %lld x %lld: the streamed K differs from the in-memory K in %lld entries", spec,
              sym ? "K(X,X)" : "K(X,Y)", dt == QK_F32 ? "f32" : "f64", (long long)nx, (long long)cols, (long long)diff);
    }
    qk_array_free(&a);
    CHECK(qk_test_count_files(g_dir, "K.npy.tmp") == 0, "%s: temporary file left after a streamed write", spec);

    /* cancel half way: no temporary file, the previous file untouched */
    write_sentinel(path);
    stop = nx * cols / 2;
    g.progress = cancel_at;
    g.progress_user = &stop;
    r = qk_gram(ctx, m, &g);
    CHECK(r == QK_ERROR_CANCELLED, "%s: cancel -> %d", spec, (int)r);
    CHECK(qk_test_count_files(g_dir, "K.npy.tmp") == 0, "%s: temporary file left after a cancel", spec);
    CHECK(sentinel_intact(path), "%s: a cancelled run touched the previous output", spec);
    g.progress = NULL;

    /* a write that fails (the file-size limit, as a full disk would): a clear I/O error, no
       temporary file, the previous output untouched */
    {
        struct rlimit old, lim;
        getrlimit(RLIMIT_FSIZE, &old);
        lim = old;
        lim.rlim_cur = 4096 + (rlim_t)(es * (size_t)cols * 3);   /* a few rows fit */
        setrlimit(RLIMIT_FSIZE, &lim);
        r = qk_gram(ctx, m, &g);
        setrlimit(RLIMIT_FSIZE, &old);
        CHECK(r == QK_ERROR_IO && strstr(qk_last_error(), "K.npy") != NULL, "%s: failing write -> %d (%s)", spec, (int)r, qk_last_error());
        CHECK(qk_test_count_files(g_dir, "K.npy.tmp") == 0, "%s: temporary file left after a failed write", spec);
        CHECK(sentinel_intact(path), "%s: a failed run touched the previous output", spec);
    }
    remove(path);
    free(x);
    free(y);
    free(ref);
    qk_map_free(m);
}

static void tile_case(qk_ctx *ctx, int sym)
{
    qk_map *m = NULL;
    const int64_t nx = 150, ny = sym ? 150 : 97;
    double *x = (double *)malloc(sizeof(double) * (size_t)(nx * 4)), *ref = (double *)malloc(sizeof(double) * (size_t)(nx * ny));
    qk_gram_desc g;
    qk_test_tiles s;
    int64_t i, diff = 0;
    qk_map_parse("zz(reps=2)", 4, &m);
    for (i = 0; i < nx * 4; i++) x[i] = 3.0 * qk_test_urand();
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = nx; g.out = ref;
    if (!sym) { g.y = x + 4 * 7; g.n_y = ny; }
    CHECK(qk_gram(ctx, m, &g) == QK_OK, "tiles: in memory");
    memset(&s, 0, sizeof s);
    s.K = (double *)malloc(sizeof(double) * (size_t)(nx * ny));
    for (i = 0; i < nx * ny; i++) s.K[i] = NAN;
    s.cols = ny; s.sym = sym; s.side = 64; s.rows = nx;
    g.out = NULL; g.output = QK_OUTPUT_CALLBACK; g.tile_fn = qk_test_on_tile; g.tile_user = &s;
    CHECK(qk_gram(ctx, m, &g) == QK_OK, "tiles: callback");
    for (i = 0; i < nx * ny; i++) diff += memcmp(&s.K[i], &ref[i], sizeof(double)) != 0;
    CHECK(s.bad == 0 && diff == 0 && s.calls > 1, "tiles %s: %d calls, %d bad tiles, %lld entries differ", sym ? "K(X,X)" : "K(X,Y)",
          s.calls, s.bad, (long long)diff);
    free(s.K); free(x); free(ref);
    qk_map_free(m);
}

static void bad_requests(qk_ctx *ctx)
{
    qk_map *m = NULL;
    double x[8] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
    qk_gram_desc g;
    char path[700];
    qk_map_parse("zz", 2, &m);
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = 4; g.output = QK_OUTPUT_NPY;
    CHECK(qk_gram(ctx, m, &g) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "out_path"), "NPY without out_path: %s", qk_last_error());
    snprintf(path, sizeof path, "%s/no/such/dir/K.npy", g_dir);
    g.out_path = path;
    CHECK(qk_gram(ctx, m, &g) == QK_ERROR_IO && strstr(qk_last_error(), "no/such/dir"), "NPY into a missing directory: %s", qk_last_error());
    snprintf(path, sizeof path, "%s/K.npy", g_dir);
    g.ld_out = 7;
    CHECK(qk_gram(ctx, m, &g) == QK_ERROR_INVALID_ARGUMENT, "NPY with ld_out: %s", qk_last_error());
    qk_map_free(m);
}

/* The tunable qk_gram_desc.cpu_slab_bytes (0: QK_CPU_SLAB_BYTES, 64 KB here, less than a 64-row
   tile of 700 columns): 200 rows' bytes make slabs of 192 rows (the plan's slab_rows and its
   text say so), and the file is the same bytes. */
static void slab_tunable(qk_ctx *ctx)
{
    qk_map *m = NULL;
    const int64_t n = 700;
    double *x = (double *)malloc(sizeof(double) * (size_t)(n * 3));
    qk_gram_desc g;
    qk_plan p0, p1;
    qk_array a0, a1;
    char path[700], t0[1024], t1[1024], want[64];
    int64_t i;
    for (i = 0; i < n * 3; i++) x[i] = 2.0 * 3.14159 * qk_test_urand();
    qk_map_parse("zz(reps=2)", 3, &m);
    memset(&g, 0, sizeof g);
    snprintf(path, sizeof path, "%s/K.npy", g_dir);
    g.x = x; g.n_x = n; g.output = QK_OUTPUT_NPY; g.out_path = path; g.out_dtype = QK_F64;
    CHECK(qk_plan_make(ctx, m, &g, &p0) == QK_OK, "%s", qk_last_error());
    g.cpu_slab_bytes = (size_t)(n * 8) * 200;   /* 200 rows of 700 doubles: 3 whole 64-row tiles */
    CHECK(qk_plan_make(ctx, m, &g, &p1) == QK_OK, "%s", qk_last_error());
    CHECK(p0.slab_rows == 64 && p1.slab_rows == 192, "slab rows %lld and %lld (64 KB: one tile; 200 rows: three)",
          (long long)p0.slab_rows, (long long)p1.slab_rows);
    qk_plan_describe(&p0, t0, sizeof t0);
    qk_plan_describe(&p1, t1, sizeof t1);
    snprintf(want, sizeof want, "slabs of %lld rows", (long long)p1.slab_rows);
    CHECK(strstr(t1, want) != NULL && strstr(t0, want) == NULL, "the plan text names the slab: %s", t1);
    memset(&a0, 0, sizeof a0); memset(&a1, 0, sizeof a1);
    g.cpu_slab_bytes = 0;
    CHECK(qk_gram(ctx, m, &g) == QK_OK && qk_npy_read(path, &a0) == QK_OK, "%s", qk_last_error());
    g.cpu_slab_bytes = (size_t)(n * 8) * 200;
    CHECK(qk_gram(ctx, m, &g) == QK_OK && qk_npy_read(path, &a1) == QK_OK, "%s", qk_last_error());
    CHECK(a0.data && a1.data && a0.rows == n && a1.rows == n && memcmp(a0.data, a1.data, sizeof(double) * (size_t)(n * n)) == 0,
          "K differs with the slab size");
    g.mgpu_min_pairs = -1;
    CHECK(qk_gram(ctx, m, &g) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "mgpu_min_pairs"), "%s", qk_last_error());
    g.mgpu_min_pairs = 0; g.mgpu_host_bound_split = 2;
    CHECK(qk_gram(ctx, m, &g) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "mgpu_host_bound_split"), "%s", qk_last_error());
    qk_array_free(&a0); qk_array_free(&a1);
    remove(path);
    free(x);
    qk_map_free(m);
}

/* Every CPU executor writes into the one sink qk_gram opens and commits (item 2 of issue 22): the
   MPS engine (40 qubits: no statevector) and the engine with state tiles (a host budget of a
   few row blocks) stream the same bits as in memory, and a cancel or a failing write leaves no
   temporary file and the previous output as it was (one_case). */
static void executor_cases(void)
{
    qk_ctx *c = NULL;
    qk_ctx_desc cd;
    qk_map *m = NULL;
    qk_gram_desc g;
    qk_plan p;
    double *x;
    int64_t i;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 2;
    CHECK(qk_ctx_create(&cd, &c) == QK_OK, "ctx: %s", qk_last_error());
    /* the MPS engine */
    CHECK(qk_map_parse("zz(reps=1,ent=linear)", 40, &m) == QK_OK, "parse zz40: %s", qk_last_error());
    x = (double *)calloc(150 * 40, sizeof(double));
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = 150; g.output = QK_OUTPUT_NPY; g.out_path = "K.npy";
    CHECK(c && m && qk_plan_make(c, m, &g, &p) == QK_OK && p.path == QK_PATH_MPS, "zz40: the plan takes the MPS engine (path %d: %s)",
          (int)p.path, qk_last_error());
    {   /* qk_gram hands the planner's MPS program to the engine; a plan run without it (a plan made
           by qk_plan_make, run later) builds the same program again: the same K */
        double *k1 = (double *)malloc(sizeof(double) * 150 * 150), *k2 = (double *)malloc(sizeof(double) * 150 * 150);
        for (i = 0; i < 150 * 40; i++) x[i] = 2.0 * 3.14159 * qk_test_urand();
        g.output = QK_OUTPUT_HOST; g.out_path = NULL; g.out = k1;
        CHECK(c && qk_gram(c, m, &g) == QK_OK, "zz40 mps gram: %s", qk_last_error());
        g.out = k2;
        CHECK(c && qk_plan_make(c, m, &g, &p) == QK_OK && p.path == QK_PATH_MPS && qk__plan_run(c, &p, m, &g, NULL) == QK_OK &&
                  memcmp(k1, k2, sizeof(double) * 150 * 150) == 0,
              "zz40: K from the plan's program and from a program built by the engine differ (%s)", qk_last_error());
        free(k1);
        free(k2);
    }
    qk_map_free(m);
    one_case(c, "zz(reps=1,ent=linear)", 40, 150, 0, QK_F64);
    one_case(c, "zz(reps=1,ent=linear)", 40, 100, 37, QK_F32);
    qk_ctx_destroy(c);
    c = NULL;
    /* state tiles: the resident plan's scratch and blocks of about 64 rows of states */
    m = NULL;
    CHECK(qk_map_parse("zz(reps=2)", 6, &m) == QK_OK, "parse zz6: %s", qk_last_error());
    for (i = 0; i < 150 * 6; i++) x[i] = 2.0 * 3.14159 * qk_test_urand();
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = 150; g.output = QK_OUTPUT_NPY; g.out_path = "K.npy";
    cd.host_memory = (size_t)1 << 40;
    CHECK(qk_ctx_create(&cd, &c) == QK_OK && qk_plan_make(c, m, &g, &p) == QK_OK && p.bulk_states, "zz6 resident plan: %s", qk_last_error());
    qk_ctx_destroy(c);
    c = NULL;
    {
        const double row = (double)p.bytes_states / 150.0, per = 2.0 * row + 2.0 * 150.0 * 8.0 + 64.0 * 8.0;
        cd.host_memory = (size_t)((double)p.bytes_workspace + per * 64.5);
    }
    CHECK(qk_ctx_create(&cd, &c) == QK_OK && qk_plan_make(c, m, &g, &p) == QK_OK && !p.bulk_states && p.state_tile < 150,
          "zz6: the plan tiles the states (bulk %d, tile %lld: %s)", p.bulk_states, (long long)p.state_tile, qk_last_error());
    one_case(c, "zz(reps=2)", 6, 150, 0, QK_F64);
    qk_ctx_destroy(c);
    qk_map_free(m);
    free(x);
}

int main(void)
{
    qk_ctx *ctx = NULL;
    qk_ctx_desc cd;
    const char *tmp = getenv("TMPDIR");
    qk_test_seed();
    signal(SIGXFSZ, SIG_IGN); /* the file-size limit then fails the write with EFBIG */
    snprintf(g_dir, sizeof g_dir, "%s/qk_stream_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) { printf("mkdtemp failed\n"); return 1; }
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 2;
    if (qk_ctx_create(&cd, &ctx) != QK_OK) { printf("ctx: %s\n", qk_last_error()); return 1; }
    one_case(ctx, "zz(reps=2)", 3, 203, 0, QK_F64);      /* complex, symmetric */
    one_case(ctx, "zz(reps=2)", 3, 203, 0, QK_F32);
    one_case(ctx, "zz(reps=2)", 3, 190, 77, QK_F32);     /* complex, K(X,Y) */
    one_case(ctx, "hea(layers=2)", 4, 261, 0, QK_F64);   /* real */
    one_case(ctx, "hea(layers=2)", 4, 129, 65, QK_F64);
    one_case(ctx, "angle(rot=y)", 5, 300, 0, QK_F32);    /* product (analytic) */
    one_case(ctx, "angle(rot=y)", 5, 64, 300, QK_F64);
    tile_case(ctx, 1);
    tile_case(ctx, 0);
    bad_requests(ctx);
    slab_tunable(ctx);
    qk_ctx_destroy(ctx);
    executor_cases();
    rmdir(g_dir);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
