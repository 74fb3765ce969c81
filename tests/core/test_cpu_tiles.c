/* State tiles on the CPU engine: when the states do not fit the host budget
   (qk_ctx_desc.host_memory here, injected so the test is deterministic), the engine builds them
   in blocks of R samples, two blocks resident, and K goes block by block. K must equal the
   all-resident K bitwise (the same tile arithmetic per pair: see qk__cpu_tiles in qk.h) for
   K(X,X) and K(X,Y), sizes and blocks that are not multiples of each other or of the 64-wide
   tiles, every output mode (host buffer with a padded leading dimension, tile callback, .npy
   stream), float32 and float64, complex, real and product maps; and an independent reference
   (|<psi_i|psi_j>|^2 from qk_states, summed here) to 1e-12. A budget too small for two states is
   a clear error naming the bytes; the plan text names the tiling; qk_max_samples answers for
   the CPU. The seed is printed; QK_TEST_SEED=... reproduces a run. */
#define _POSIX_C_SOURCE 200809L  /* mkdtemp under strict -std=c11 */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../qk_test.h"

static char g_dir[512];

static int64_t ndiff(const void *a, const void *b, int64_t n, size_t es)
{
    int64_t i, d = 0;
    for (i = 0; i < n; i++) d += memcmp((const char *)a + i * es, (const char *)b + i * es, es) != 0;
    return d;
}

/* The host budget that plans blocks of R samples for desc on a context of nt threads: the
   plan's scratch and two blocks of states (and, streamed, two slabs of R rows and the strips'
   buffer), plus a little. */
static size_t budget_for(const qk_map *m, const qk_gram_desc *g, int nt, int64_t R)
{
    qk_ctx *c = NULL;
    qk_ctx_desc cd;
    qk_plan p;
    double row, per;
    const int64_t cols = g->y ? g->n_y : g->n_x;
    const double es = g->out_dtype == QK_F32 ? 4.0 : 8.0;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = nt;
    cd.host_memory = (size_t)1 << 40;
    if (qk_ctx_create(&cd, &c) != QK_OK || qk_plan_make(c, m, g, &p) != QK_OK) { qk_ctx_destroy(c); return 0; }
    qk_ctx_destroy(c);
    row = (double)p.bytes_states / (double)(g->n_x + (g->y ? g->n_y : 0));
    per = 2.0 * row + (g->output == QK_OUTPUT_NPY ? 2.0 * (double)cols * es + 64.0 * es : 0.0);
    return (size_t)((double)p.bytes_workspace + per * (double)R + 0.5 * per);
}

/* One case: K from an all-resident context and from a context whose budget plans blocks of R,
   in every output mode. */
static void one_case(const char *spec, int d, int64_t nx, int64_t ny, int64_t R, qk_dtype dt, int nt)
{
    qk_map *m = NULL;
    qk_ctx *all = NULL, *til = NULL;
    qk_ctx_desc cd;
    qk_gram_desc g;
    qk_plan p;
    double *x, *y = NULL;
    void *ref, *out;
    const int sym = ny == 0;
    const int64_t cols = sym ? nx : ny, ld = cols + 3;
    const size_t es = dt == QK_F32 ? 4 : 8;
    int64_t i, r0, c0, diff;
    char what[160], desc[1024], path[700];
    qk_result r;
    snprintf(what, sizeof what, "%s %s %lldx%lld R=%lld %s nt=%d", spec, sym ? "K(X,X)" : "K(X,Y)", (long long)nx, (long long)cols,
             (long long)R, dt == QK_F32 ? "f32" : "f64", nt);
    if (qk_map_parse(spec, d, &m) != QK_OK) { CHECK(0, "parse %s: %s", spec, qk_last_error()); return; }
    x = (double *)malloc(sizeof(double) * (size_t)(nx * d));
    for (i = 0; i < nx * d; i++) x[i] = 2.0 * 3.14159 * qk_test_urand() - 1.0;
    if (!sym) {
        y = (double *)malloc(sizeof(double) * (size_t)(ny * d));
        for (i = 0; i < ny * d; i++) y[i] = 2.0 * 3.14159 * qk_test_urand() - 1.0;
    }
    ref = malloc(es * (size_t)(nx * cols));
    out = malloc(es * (size_t)(nx * ld));
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = nt;
    cd.host_memory = (size_t)1 << 40;   /* everything resident */
    CHECK(qk_ctx_create(&cd, &all) == QK_OK, "ctx: %s", qk_last_error());
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = nx; g.y = y; g.n_y = ny; g.out_dtype = dt;
    g.out = ref;
    CHECK(qk_plan_make(all, m, &g, &p) == QK_OK && p.bulk_states, "%s: the reference plan keeps all states", what);
    CHECK(qk_gram(all, m, &g) == QK_OK, "%s: all resident: %s", what, qk_last_error());

    /* host buffer, leading dimension cols + 3 (the padding untouched) */
    cd.host_memory = budget_for(m, &g, nt, R);
    CHECK(qk_ctx_create(&cd, &til) == QK_OK, "ctx: %s", qk_last_error());
    memset(out, 0x5a, es * (size_t)(nx * ld));
    g.out = out;
    g.ld_out = ld;
    CHECK(qk_plan_make(til, m, &g, &p) == QK_OK && !p.bulk_states && p.state_tile == R, "%s: plan blocks of %lld (bulk %d, %lld: %s)",
          what, (long long)R, p.bulk_states, (long long)p.state_tile, qk_last_error());
    qk_plan_describe(&p, desc, sizeof desc);
    snprintf(path, sizeof path, "states: tiled, blocks of %lld samples", (long long)R);
    CHECK(strstr(desc, path) != NULL && strstr(desc, "host memory:") != NULL && strstr(desc, "(given)") != NULL,
          "%s: the plan text shows the tiling and the budget:\n%s", what, desc);
    r = qk_gram(til, m, &g);
    CHECK(r == QK_OK, "%s: tiled host: %s", what, qk_last_error());
    for (diff = 0, r0 = 0; r0 < nx; r0++) {
        diff += ndiff((char *)out + (size_t)(r0 * ld) * es, (char *)ref + (size_t)(r0 * cols) * es, cols, es);
        for (c0 = cols; c0 < ld; c0++) diff += ((unsigned char *)out)[(size_t)(r0 * ld + c0) * es] != 0x5a;
    }
    CHECK(diff == 0, "%s: tiled host K differs from the all-resident K in %lld entries (or padding)", what, (long long)diff);
    g.ld_out = 0;

    /* tile callback (float64 tiles only: the callback gets the output dtype) */
    if (dt == QK_F64) {
        qk_test_tiles s;
        memset(&s, 0, sizeof s);
        s.K = (double *)malloc(sizeof(double) * (size_t)(nx * cols));
        for (i = 0; i < nx * cols; i++) s.K[i] = NAN;
        s.rows = nx; s.cols = cols; s.sym = sym;
        g.out = NULL; g.output = QK_OUTPUT_CALLBACK; g.tile_fn = qk_test_on_tile; g.tile_user = &s;
        CHECK(qk_plan_make(til, m, &g, &p) == QK_OK && !p.bulk_states && p.state_tile == R, "%s: callback plan", what);
        s.side = p.tile_m;
        r = qk_gram(til, m, &g);
        CHECK(r == QK_OK, "%s: tiled callback: %s", what, qk_last_error());
        diff = ndiff(s.K, ref, nx * cols, 8);
        CHECK(s.bad == 0 && diff == 0 && s.calls >= 1, "%s: callback: %d calls, %d bad tiles (side %lld), %lld entries differ", what,
              s.calls, s.bad, (long long)s.side, (long long)diff);
        free(s.K);
        g.output = QK_OUTPUT_HOST; g.tile_fn = NULL; g.tile_user = NULL;
    }

    /* .npy stream: the budget counts two slabs of R rows too */
    {
        qk_ctx *tn = NULL;
        qk_array a;
        g.out = NULL; g.output = QK_OUTPUT_NPY; g.out_path = path;
        snprintf(path, sizeof path, "%s/K.npy", g_dir);
        cd.host_memory = budget_for(m, &g, nt, R);
        CHECK(qk_ctx_create(&cd, &tn) == QK_OK, "ctx: %s", qk_last_error());
        CHECK(qk_plan_make(tn, m, &g, &p) == QK_OK && !p.bulk_states && p.state_tile == R && p.slab_rows == R,
              "%s: npy plan blocks of %lld (bulk %d, %lld, slab %lld)", what, (long long)R, p.bulk_states, (long long)p.state_tile,
              (long long)p.slab_rows);
        r = qk_gram(tn, m, &g);
        CHECK(r == QK_OK, "%s: tiled npy: %s", what, qk_last_error());
        memset(&a, 0, sizeof a);
        if (r == QK_OK && qk_npy_read(path, &a) == QK_OK && a.rows == nx && a.cols == cols) {
            for (diff = 0, i = 0; i < nx * cols; i++) {
                double v = dt == QK_F32 ? (double)((float *)ref)[i] : ((double *)ref)[i];
                diff += memcmp(&v, &a.data[i], sizeof v) != 0;
            }
            CHECK(diff == 0, "%s: the streamed K differs from the all-resident K in %lld entries", what, (long long)diff);
        } else CHECK(0, "%s: streamed file read back: %s", what, qk_last_error());
        qk_array_free(&a);
        remove(path);
        qk_ctx_destroy(tn);
        g.output = QK_OUTPUT_HOST; g.out_path = NULL;
    }

    /* an independent reference, fp64: |<psi_i|psi_j>|^2 from qk_states */
    if (dt == QK_F64) {
        const int64_t D = (int64_t)1 << m->n_qubits;
        double *sa = (double *)malloc(sizeof(double) * (size_t)(2 * D * nx)), *sb = sym ? sa : (double *)malloc(sizeof(double) * (size_t)(2 * D * ny));
        double worst = 0;
        if (qk_states(all, m, x, nx, sa) == QK_OK && (sym || qk_states(all, m, y, ny, sb) == QK_OK)) {
            for (r0 = 0; r0 < nx; r0++)
                for (c0 = 0; c0 < cols; c0++) {
                    double re = 0, im = 0, k, e;
                    const double *u = sa + 2 * D * r0, *v = sb + 2 * D * c0;
                    int64_t t;
                    for (t = 0; t < D; t++) {
                        re += u[2 * t] * v[2 * t] + u[2 * t + 1] * v[2 * t + 1];
                        im += u[2 * t] * v[2 * t + 1] - u[2 * t + 1] * v[2 * t];
                    }
                    k = re * re + im * im;
                    e = fabs(k - ((double *)ref)[r0 * cols + c0]);
                    if (e > worst) worst = e;
                }
            CHECK(worst <= 1e-12, "%s: K against the reference from qk_states: %.3g > 1e-12", what, worst);
        } else CHECK(0, "%s: qk_states: %s", what, qk_last_error());
        free(sa);
        if (!sym) free(sb);
    }
    qk_ctx_destroy(til);
    qk_ctx_destroy(all);
    free(x); free(y); free(ref); free(out);
    qk_map_free(m);
}

static int cancel_at(int64_t done, int64_t total, void *user)
{
    (void)total;
    return done >= *(int64_t *)user;
}

/* A cancel while a block of states is built: K(X,Y) of 48 samples of 17 qubits against one, in
   row blocks of 20 (20 + 1, 20 + 1 and 8 + 1 states built: nearly all the work). The engine polls
   the progress callback while it builds, so a callback that cancels at its first call stops the
   job in a small fraction of the uncancelled time (before, the first call came after the first
   block: 39% of the builds). Bounds: a fifth of the uncancelled run's wall time and of its CPU
   time (all threads; the latency is a poll interval, a few ms of work, plus the unwind). The CPU
   time holds on a loaded machine; the wall time is compared with an uncancelled run just before,
   best of three pairs. The streamed output leaves no file, not even a temporary one. */
/* a context whose budget plans blocks of R for g */
static qk_ctx *tiled_ctx(const qk_map *m, const qk_gram_desc *g, int nt, int64_t R)
{
    qk_ctx *c = NULL;
    qk_ctx_desc cd;
    qk_plan p;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU; cd.n_threads = nt; cd.host_memory = budget_for(m, g, nt, R);
    CHECK(qk_ctx_create(&cd, &c) == QK_OK && qk_plan_make(c, m, g, &p) == QK_OK && !p.bulk_states && p.state_tile == R,
          "cancel case: blocks of %lld (bulk %d, tile %lld): %s", (long long)R, p.bulk_states, (long long)p.state_tile, qk_last_error());
    return c;
}

static void cancel_while_building(void)
{
    const int q = 17, nt = 2;
    const int64_t n = 48, R = 20;
    qk_map *m = NULL;
    qk_ctx *c, *cn;
    qk_gram_desc g, gn;
    double *x = (double *)malloc(sizeof(double) * (size_t)((n + 1) * q)), K[48];
    double full[2], cut[2], best[2] = {1e30, 1e30}, bestn[2] = {1e30, 1e30};
    char sub[600], path[700];
    int i, calls = 0;
    for (i = 0; i < (n + 1) * q; i++) x[i] = 3.0 * qk_test_urand();
    CHECK(qk_map_parse("zz(reps=2)", q, &m) == QK_OK, "parse");
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = n; g.y = x + n * q; g.n_y = 1; g.out = K; g.progress_user = &calls;
    /* the streamed output, in a directory of its own */
    snprintf(sub, sizeof sub, "%s/cancel", g_dir);
    snprintf(path, sizeof path, "%s/K.npy", sub);
    CHECK(mkdir(sub, 0700) == 0, "mkdir %s", sub);
    gn = g;
    gn.out = NULL; gn.output = QK_OUTPUT_NPY; gn.out_path = path; gn.progress = qk_test_cancel_first;
    c = tiled_ctx(m, &g, nt, R);
    cn = tiled_ctx(m, &gn, nt, R);
    qk_test_perturb(0);
    for (i = 0; i < 3 && (best[0] >= 0.2 || best[1] >= 0.2 || bestn[0] >= 0.2 || bestn[1] >= 0.2); i++) {
        qk_result r;
        g.progress = NULL;
        CHECK(qk_test_timed_gram(c, m, &g, full) == QK_OK, "tiled zz %d qubits: %s", q, qk_last_error());
        g.progress = qk_test_cancel_first;
        calls = 0;
        r = qk_test_timed_gram(c, m, &g, cut);
        CHECK(r == QK_ERROR_CANCELLED && calls == 1 && strstr(qk_last_error(), "cancelled by a callback") != NULL,
              "tiled: cancel while building: %d, %d calls, %s", (int)r, calls, qk_last_error());
        printf("tiled states: cancel while building %.1f ms, %.1f ms CPU (uncancelled %.1f ms, %.1f ms CPU)\n",
               cut[0] * 1e3, cut[1] * 1e3, full[0] * 1e3, full[1] * 1e3);
        if (cut[0] / full[0] < best[0]) best[0] = cut[0] / full[0];
        if (cut[1] / full[1] < best[1]) best[1] = cut[1] / full[1];
        calls = 0;
        r = qk_test_timed_gram(cn, m, &gn, cut);
        CHECK(r == QK_ERROR_CANCELLED && calls == 1, "tiled npy: cancel while building: %d, %d calls, %s", (int)r, calls, qk_last_error());
        if (cut[0] / full[0] < bestn[0]) bestn[0] = cut[0] / full[0];
        if (cut[1] / full[1] < bestn[1]) bestn[1] = cut[1] / full[1];
    }
    CHECK(best[0] < 0.2 && best[1] < 0.2, "tiled: cancelled after %.0f%% of the uncancelled wall time, %.0f%% of its CPU time: the state build does not poll",
          100 * best[0], 100 * best[1]);
    CHECK(bestn[0] < 0.2 && bestn[1] < 0.2, "tiled npy: cancelled after %.0f%% of the uncancelled wall time, %.0f%% of its CPU time", 100 * bestn[0], 100 * bestn[1]);
    CHECK(rmdir(sub) == 0, "tiled npy: files left after a cancel in %s", sub);
    qk_ctx_destroy(c);
    qk_ctx_destroy(cn);
    qk_test_perturb(1);
    qk_map_free(m);
    free(x);
}

/* Errors and plans: a budget below two states, the 26-qubit job of issue 14, qk_max_samples. */
static void plans(void)
{
    qk_map *m = NULL, *z26 = NULL;
    qk_ctx *c = NULL;
    qk_ctx_desc cd;
    qk_gram_desc g;
    qk_plan p;
    qk_device_info info;
    double x[10 * 6];
    int i;
    char want[64], desc[1024];
    for (i = 0; i < 60; i++) x[i] = qk_test_urand();
    CHECK(qk_map_parse("zz(reps=2)", 6, &m) == QK_OK, "parse");
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = 10;
    {   /* two 6-qubit states are 2 x 1024 bytes: a budget of one thread's scratch and one state
           fails (with two threads the plan takes one: below) */
        double K[100];
        size_t sc;
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CPU; cd.n_threads = 1; cd.host_memory = (size_t)1 << 40;
        CHECK(qk_ctx_create(&cd, &c) == QK_OK && qk_plan_make(c, m, &g, &p) == QK_OK, "plan");
        sc = p.bytes_workspace;
        qk_ctx_destroy(c);
        cd.host_memory = sc + 1500;
        CHECK(qk_ctx_create(&cd, &c) == QK_OK, "ctx");
        CHECK(qk_plan_make(c, m, &g, &p) == QK_ERROR_OUT_OF_MEMORY, "budget below two states: plan refused");
        snprintf(want, sizeof want, "need %.0f bytes", (double)sc + 2048.0);
        CHECK(strstr(qk_last_error(), want) != NULL && strstr(qk_last_error(), "host budget") != NULL,
              "the error names the bytes needed (%s): %s", want, qk_last_error());
        for (i = 0; i < 100; i++) K[i] = -7.0;
        g.out = K;
        CHECK(qk_gram(c, m, &g) == QK_ERROR_OUT_OF_MEMORY && K[0] == -7.0 && K[99] == -7.0, "qk_gram refuses, K untouched");
        qk_ctx_destroy(c);
        cd.host_memory = sc + 2048 + 100;
        CHECK(qk_ctx_create(&cd, &c) == QK_OK && qk_plan_make(c, m, &g, &p) == QK_OK && !p.bulk_states && p.state_tile == 1,
              "a budget of two states: blocks of one sample (%s)", qk_last_error());
        qk_ctx_destroy(c);
        /* two threads in the budget of one thread's scratch and two states: the plan takes one
           thread (a thread's scratch is its own) rather than failing */
        cd.n_threads = 2;
        CHECK(qk_ctx_create(&cd, &c) == QK_OK && qk_plan_make(c, m, &g, &p) == QK_OK && p.n_threads == 1 && !p.bulk_states &&
              p.bytes_total <= cd.host_memory, "two threads, one thread's budget: %d threads, bulk %d, %.0f of %.0f bytes (%s)", p.n_threads,
              p.bulk_states, (double)p.bytes_total, (double)cd.host_memory, qk_last_error());
        qk_ctx_destroy(c);
    }
    {   /* cancel while tiled: the progress callback stops it, no temporary .npy left */
        int64_t stop = 30;
        char path[700];
        double K[100];
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CPU; cd.n_threads = 2; cd.host_memory = (size_t)1 << 40;
        CHECK(qk_ctx_create(&cd, &c) == QK_OK && qk_plan_make(c, m, &g, &p) == QK_OK, "plan");
        cd.host_memory = p.bytes_workspace + 3 * 2048;
        qk_ctx_destroy(c);
        CHECK(qk_ctx_create(&cd, &c) == QK_OK, "ctx");
        g.out = K; g.progress = cancel_at; g.progress_user = &stop;
        CHECK(qk_gram(c, m, &g) == QK_ERROR_CANCELLED, "tiled host: cancel");
        snprintf(path, sizeof path, "%s/C.npy", g_dir);
        g.out = NULL; g.output = QK_OUTPUT_NPY; g.out_path = path;
        CHECK(qk_gram(c, m, &g) == QK_ERROR_CANCELLED && access(path, F_OK) != 0, "tiled npy: cancel, no file");
        g.output = QK_OUTPUT_HOST; g.out_path = NULL; g.progress = NULL;
        qk_ctx_destroy(c);
    }
    /* issue 14: 40 samples of 26 features, zz, on a 24 GB machine (budget 85%): blocks of 9 */
    CHECK(qk_map_parse("zz(reps=2)", 26, &z26) == QK_OK, "parse zz 26");
    memset(&info, 0, sizeof info);
    info.host_budget_bytes = (size_t)(0.85 * 24e9);
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = 40;
    CHECK(qk_plan_for_device(&info, 0.85, z26, &g, &p) == QK_OK && p.backend == QK_BACKEND_CPU && !p.bulk_states &&
              p.state_tile == 9 && p.path == QK_PATH_COMPLEX && p.bytes_total <= p.bytes_budget,
          "zz 26 qubits, 40 samples, 20.4 GB: blocks of 9 (bulk %d, tile %lld, %s)", p.bulk_states, (long long)p.state_tile, qk_last_error());
    qk_plan_describe(&p, desc, sizeof desc);
    CHECK(strstr(desc, "states: tiled, blocks of 9 samples (two resident), 19.327 GB") != NULL, "plan text:\n%s", desc);
    /* qk_max_samples for the CPU agrees with the bulk decision */
    {
        qk_map *z10 = NULL;
        int64_t n;
        memset(&info, 0, sizeof info);
        info.host_budget_bytes = (size_t)100 << 20;
        n = qk_max_samples(&info, 0.85, 10, QK_PRECISION_FP64);
        CHECK(n > 5000 && n < 7000, "max_samples CPU 100 MB, 10 qubits: %lld", (long long)n);
        CHECK(qk_map_parse("zz(reps=2)", 10, &z10) == QK_OK, "parse zz 10");
        g.n_x = n;
        CHECK(qk_plan_for_device(&info, 0.85, z10, &g, &p) == QK_OK && p.bulk_states, "n = max_samples: all resident");
        g.n_x = n + n / 50;
        CHECK(qk_plan_for_device(&info, 0.85, z10, &g, &p) == QK_OK && !p.bulk_states, "n = 1.02 max_samples: tiled");
        info.host_budget_bytes = 0;   /* the machine's own memory: some answer */
        CHECK(qk_max_samples(&info, 0.85, 10, QK_PRECISION_FP64) > 0, "max_samples CPU, this machine");
        qk_map_free(z10);
    }
    qk_map_free(z26);
    qk_map_free(m);
}

/* Issue 27, item 11: the host budget is bounded by RLIMIT_AS (ulimit -v) and RLIMIT_DATA. In a
   child process (the limit is per process) the address space is limited to what it maps now
   (RLIMIT_DATA: its data now) plus room for about 6 of the 8 states of an amplitude map of 20 qubits (8 MB each): the
   plan, on the machine's real budget (no host_memory given), must tile the states, and K must
   equal the parent's all-resident K bitwise. It used to plan all 8 resident and fail. */
/* /proc/self/statm in bytes: field 0 the virtual size (RLIMIT_AS), 5 the data and stack (RLIMIT_DATA). */
static double statm_bytes(int field)
{
    unsigned long long v[6] = {0, 0, 0, 0, 0, 0};
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) v[field] = 0;
        fclose(f);
    }
    return (double)v[field] * (double)sysconf(_SC_PAGESIZE);
}

static void rlimit_as(void)
{
    const int q = 20, n = 8;
    const int64_t d = (int64_t)1 << q;
    qk_map *m = NULL;
    qk_ctx *c = NULL;
    qk_ctx_desc cd;
    qk_gram_desc g;
    qk_plan p;
    double *x, *K0, *K1;
    int64_t i;
    int res;
    FILE *statm;
#if defined(__SANITIZE_ADDRESS__)
#define QK_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QK_TEST_ASAN 1
#endif
#endif
#ifdef QK_TEST_ASAN
    /* AddressSanitizer's allocator maps its own regions and shadow memory: under an address-space
       or data limit near the process's size it fails before qk is asked (the plain build tests it) */
    printf("rlimit_as: skipped under AddressSanitizer\n");
    return;
#endif
    statm = fopen("/proc/self/statm", "r");
    if (!statm) { printf("rlimit_as: no /proc/self/statm, skipped\n"); return; }
    fclose(statm);
    x = (double *)malloc((size_t)(n * d) * sizeof *x);
    K0 = (double *)malloc((size_t)n * n * sizeof *K0);
    K1 = (double *)malloc((size_t)n * n * sizeof *K1);
    for (i = 0; i < n * d; i++) x[i] = qk_test_urand() - 0.25;
    CHECK(qk_map_parse("amplitude(qubits=20)", (int)d, &m) == QK_OK, "parse amplitude: %s", qk_last_error());
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU; cd.n_threads = 2;
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = n; g.out = K0;
    CHECK(qk_ctx_create(&cd, &c) == QK_OK && qk_plan_make(c, m, &g, &p) == QK_OK && p.bulk_states,
          "no limit: all 8 states resident (%s)", qk_last_error());
    CHECK(qk_gram(c, m, &g) == QK_OK, "no limit: K (%s)", qk_last_error());
    qk_ctx_destroy(c);
    c = NULL;
    for (res = 0; res < 2; res++) {
        const char *rn = res ? "RLIMIT_DATA" : "RLIMIT_AS";
        pid_t pid;
        int status = 0;
        fflush(stdout);
        pid = fork();
        if (pid == 0) {
            struct rlimit rl;
            int bad = 0, which = res ? RLIMIT_DATA : RLIMIT_AS;
            char text[2048];
            CHECK(qk_ctx_create(&cd, &c) == QK_OK, "ctx");   /* its threads first: their stacks are mapped now */
            getrlimit(which, &rl);
            rl.rlim_cur = (rlim_t)(statm_bytes(res ? 5 : 0) + 6.0 * 8.0 * (1 << 20) / 0.85);
            if (setrlimit(which, &rl) != 0) { perror("setrlimit"); _exit(3); }
            g.out = K1;
            for (i = 0; i < n * n; i++) K1[i] = -1.0;
            CHECK(qk_plan_make(c, m, &g, &p) == QK_OK && !p.bulk_states && p.state_tile >= 1 && p.state_tile < n,
                  "%s: states tiled (bulk %d, tile %lld, budget %.1f MB; %s)", rn, p.bulk_states, (long long)p.state_tile,
                  p.bytes_budget / 1e6, qk_last_error());
            qk_plan_describe(&p, text, sizeof text);
            CHECK(strstr(text, "states: tiled") != NULL, "%s: plan text:\n%s", rn, text);
            CHECK(qk_gram(c, m, &g) == QK_OK, "%s: qk_gram (%s)", rn, qk_last_error());
            CHECK(ndiff(K0, K1, n * n, 8) == 0, "%s: tiled K equals the all-resident K", rn);
            qk_ctx_destroy(c);
            fflush(stdout);
            bad = qk_test_fails;
            _exit(bad ? 1 : 0);
        }
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "%s child: status %d", rn, status);
    }
    qk_map_free(m);
    free(x); free(K0); free(K1);
}

int main(void)
{
    qk_test_seed();
    snprintf(g_dir, sizeof g_dir, "/tmp/qk_tiles_XXXXXX");
    if (!mkdtemp(g_dir)) { printf("mkdtemp failed\n"); return 1; }

    one_case("zz(reps=2)", 5, 37, 0, 1, QK_F64, 2);
    one_case("zz(reps=2)", 5, 37, 0, 3, QK_F64, 2);
    one_case("zz(reps=2)", 5, 37, 23, 7, QK_F64, 3);
    one_case("zz(reps=2)", 5, 29, 41, 5, QK_F32, 2);
    one_case("zz(reps=2)", 6, 150, 0, 64, QK_F64, 2);
    one_case("zz(reps=2)", 6, 300, 0, 128, QK_F32, 2);
    one_case("zz(reps=2)", 4, 131, 70, 64, QK_F64, 1);
    one_case("hea(layers=2,rot=y)", 6, 45, 0, 4, QK_F64, 2);    /* real path */
    one_case("hea(layers=2,rot=y)", 6, 31, 17, 6, QK_F32, 2);
    one_case("angle(rot=y)", 7, 53, 0, 2, QK_F64, 2);           /* analytic path */
    one_case("iqp(reps=2)", 5, 33, 19, 11, QK_F64, 2);
    cancel_while_building();
    plans();
    rlimit_as();
    rmdir(g_dir);
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
