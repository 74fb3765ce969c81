/* tests/qk_test.h — what the C and C++ test programs share (include it after qk.h, if any, as
   "../qk_test.h"; the parts that use qk.h are there only when qk.h is included first).

   CHECK(cond) or CHECK(cond, fmt, ...) counts a check (qk_test_checks); where cond is false it
   prints "FAIL file:line: cond" and, when given, ": " and the formatted detail, on stdout, and
   counts a failure (qk_test_fails). Define before the include, to change every failure line:
   QK_TEST_DETAIL(), an expression giving a string appended to it (test_tune_cache:
   qk_last_error()); QK_TEST_PREFIX(), one giving a string printed before it (test_mpi: the rank).

   Random inputs: one generator (splitmix64). qk_test_seed() seeds it from QK_TEST_SEED (which
   reproduces a run) or the clock and prints the seed; qk_test_rand64() 64 bits, qk_test_urand()
   uniform in [0, 1) (53 bits), qk_test_uniform(lo, hi); qk_test_seed_set(s) restarts the stream
   (the same data on every MPI rank).

   Files: qk_test_read_file (the whole file, NUL-terminated, malloc'd; NULL where it cannot be
   read), qk_test_write_file and qk_test_write_text (exit 2 where they cannot write),
   qk_test_count_files (names in a directory that contain a string: temporary files left).

   Memory: qk_test_guarded(bytes, &h) (POSIX) gives bytes that end where an inaccessible page
   begins, so a read past their end faults (a start 8-byte aligned where bytes is a multiple of
   8); qk_test_guarded_free(h) releases them.

   With qk.h: qk_test_cpu_ctx, qk_test_ctx (a device's, the autotuner off), qk_test_read_k (K
   read back from a .npy qk wrote, the file removed), qk_test_op and qk_test_custom (a custom
   map's op, the map of n ops), qk_test_weighted_gates (a circuit of every weighted gate kind),
   qk_test_parse (exit 2 on failure: the harness, not the check),
   qk_test_rand_data (n x d uniform in [lo, hi), malloc'd), qk_test_max_diff (the largest
   |a - b|; infinity where either holds a NaN: a poisoned entry qk did not write), the tile
   collector qk_test_tiles / qk_test_on_tile, and, where the POSIX clocks are declared, the
   cancel-latency timing: qk_test_timed_gram(ctx, map, desc, t) runs qk_gram with t[0] wall and
   t[1] process CPU seconds; qk_test_perturb(on) turns glibc's MALLOC_PERTURB_ (set by Meson,
   a fill of every allocation, as costly as the latency measured) off and back on around timed
   calls; qk_test_cancel_first, a progress callback that counts its calls in *(int *)user and
   cancels at the first. */
#ifndef QK_TEST_H
#define QK_TEST_H
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef _WIN32
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

/* the counters live in a function, so that a program that includes this and uses no CHECK
   compiles warning-free (no unused static variable or function) */
typedef struct qk_test_counts { int checks, fails; } qk_test_counts;
static inline qk_test_counts *qk_test_counts_(void)
{
    static qk_test_counts c;
    return &c;
}
#define qk_test_checks (qk_test_counts_()->checks)
#define qk_test_fails (qk_test_counts_()->fails)

static inline void qk_test_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    ++qk_test_fails;
#ifdef QK_TEST_PREFIX
    printf("%s", QK_TEST_PREFIX());
#endif
    printf("FAIL %s:%d: %s", file, line, cond);
    if (fmt) {
        printf(": ");
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
    }
#ifdef QK_TEST_DETAIL
    printf(" (%s)", QK_TEST_DETAIL());
#endif
    printf("\n");
    fflush(stdout);
}

#define QK_TEST_CHECK_(c, ...)                                       \
    do {                                                             \
        ++qk_test_checks;                                            \
        if (!(c)) qk_test_fail(__FILE__, __LINE__, #c, __VA_ARGS__); \
    } while (0)
#define CHECK(...) QK_TEST_CHECK_(__VA_ARGS__, (const char *)0)

/* ---- random inputs ---- */
static inline unsigned long long *qk_test_rng_(void)
{
    static unsigned long long state = 0x853c49e6748fea9bull;
    return &state;
}
static inline void qk_test_seed_set(unsigned long long s) { *qk_test_rng_() = s; }
static inline unsigned long long qk_test_rand64(void)
{
    unsigned long long z = (*qk_test_rng_() += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double qk_test_urand(void) { return (double)(qk_test_rand64() >> 11) * (1.0 / 9007199254740992.0); }
static inline double qk_test_uniform(double lo, double hi) { return lo + (hi - lo) * qk_test_urand(); }
static inline unsigned long long qk_test_seed(void)
{
    const char *e = getenv("QK_TEST_SEED");
    unsigned long long s = e ? strtoull(e, NULL, 0) : (unsigned long long)time(NULL) * 2654435761ull ^ (unsigned long long)clock();
    qk_test_seed_set(s);
    printf("seed %llu (QK_TEST_SEED=%llu reproduces this run)\n", s, s);
    fflush(stdout);
    return s;
}

/* ---- files ---- */
static inline char *qk_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = (char *)malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
            buf[n] = 0;
            if (len) *len = (size_t)n;
        } else {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}
static inline void qk_test_write_file(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(bytes, 1, n, f) != n) || fclose(f) != 0) {
        printf("cannot write %s\n", path);
        exit(2);
    }
}
static inline void qk_test_write_text(const char *path, const char *text) { qk_test_write_file(path, text, strlen(text)); }
#ifndef _WIN32
static inline int qk_test_count_files(const char *dir, const char *sub)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, sub)) n++;
    closedir(d);
    return n;
}
#endif

#if !defined(_WIN32) && defined(MAP_ANONYMOUS)
/* ---- memory (a C file defines _DEFAULT_SOURCE first: MAP_ANONYMOUS is not ISO C's) ---- */
typedef struct qk_test_guard { void *base; size_t len; } qk_test_guard;
static inline void *qk_test_guarded(size_t bytes, qk_test_guard *h)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), data = (bytes + page - 1) / page * page;
    char *base = (char *)mmap(NULL, data + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == (char *)MAP_FAILED || mprotect(base + data, page, PROT_NONE) != 0) {
        printf("qk_test_guarded: cannot map %zu bytes\n", bytes);
        exit(2);
    }
    h->base = base;
    h->len = data + page;
    return base + data - bytes;
}
static inline void qk_test_guarded_free(qk_test_guard *h)
{
    if (h->base) munmap(h->base, h->len);
    h->base = NULL;
}
#endif

/* ---- with qk.h ---- */
#ifdef QK_H
/* The plan of a rectangle of K(X,X) on several GPUs whose GPU delivers its transpose (the
   mirror) to HOST or NPY, from the plan of its job alone (qk_plan_for_device), as the planner's
   rule states it: one transposed slab more on the device, K no longer resident where that slab
   does not fit beside it, a slab and its transpose in each of the two staging slots. */
static inline void qk_test_mirror_slab(qk_plan *p)
{
    const size_t slab = (size_t)p->slab_rows * (size_t)p->n_y * (p->out_dtype == QK_F64 ? 8 : 4);
    if (p->k_resident && p->bytes_total + slab > p->bytes_budget) {
        p->bytes_total += 2 * slab - p->bytes_out;
        p->bytes_out = 2 * slab;
        p->k_resident = 0;
    }
    p->bytes_out += slab;
    p->bytes_total += slab;
    p->bytes_staging = 4 * slab;
}

static inline qk_ctx *qk_test_cpu_ctx(int threads)
{
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = threads;
    if (qk_ctx_create(&cd, &ctx) != QK_OK) { printf("ctx: %s\n", qk_last_error()); exit(2); }
    return ctx;
}
/* A context on device with the autotuner off (qk's fixed table: nothing measured, no cache
   written); threads 0: qk's default */
static inline qk_ctx *qk_test_ctx(qk_device device, int threads)
{
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    cd.device = device;
    cd.autotune = -1;
    cd.n_threads = threads;
    if (qk_ctx_create(&cd, &ctx) != QK_OK) { printf("ctx: %s\n", qk_last_error()); exit(2); }
    return ctx;
}
/* K (rows x cols) read back from the .npy at path into K (float64), and the file removed; 0 with
   a line printed where it cannot be read or has another shape */
static inline int qk_test_read_k(const char *path, int64_t rows, int64_t cols, double *K)
{
    qk_array a;
    int ok;
    memset(&a, 0, sizeof a);
    ok = qk_npy_read(path, &a) == QK_OK;
    if (!ok) printf("  npy read %s: %s\n", path, qk_last_error());
    else if (a.rows != rows || a.cols != cols) {
        printf("  npy read %s: shape (%lld, %lld), expected (%lld, %lld)\n", path, (long long)a.rows, (long long)a.cols, (long long)rows,
               (long long)cols);
        ok = 0;
    }
    if (ok) memcpy(K, a.data, sizeof(double) * (size_t)(rows * cols));
    qk_array_free(&a);
    remove(path);
    return ok;
}
/* One op of a custom map: gate k on q0 (q1), angle kind ak of features x0, x1 and weight w,
   scale * (argument) + offset */
static inline qk_op qk_test_op(qk_op_kind k, int q0, int q1, qk_arg_kind ak, int x0, int x1, int w, double scale, double offset)
{
    qk_op o;
    memset(&o, 0, sizeof o);
    o.kind = k; o.q0 = q0; o.q1 = q1;
    o.angle.kind = ak; o.angle.x0 = x0; o.angle.x1 = x1; o.angle.w = w; o.angle.scale = scale; o.angle.offset = offset;
    return o;
}
/* The custom map of n_ops ops on q qubits, d features and nw weights (exit 2 where qk refuses it) */
static inline qk_map *qk_test_custom(int q, int d, const qk_op *ops, int n_ops, int nw)
{
    qk_map_desc md;
    qk_map *m = NULL;
    memset(&md, 0, sizeof md);
    md.type = QK_MAP_CUSTOM; md.n_features = d; md.n_qubits = q; md.ops = ops; md.n_ops = n_ops; md.n_weights = nw;
    if (qk_map_make(&md, &m) != QK_OK) { printf("map: %s\n", qk_last_error()); exit(2); }
    return m;
}
/* Every gate kind that can carry a weight (RX, RY, RZ, P, RZZ), each weight once, angle
   scale * w + offset (the parameter-shift rule applies), among fixed and x-driven gates: 3
   qubits, 3 features, 6 weights (test_vjp and test_vjp_gpu) */
static inline qk_map *qk_test_weighted_gates(void)
{
    const qk_op ops[] = {
        qk_test_op(QK_OP_H, 0, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),    qk_test_op(QK_OP_H, 1, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),
        qk_test_op(QK_OP_RZ, 0, 0, QK_ARG_X, 0, 0, 0, 1.0, 0),     qk_test_op(QK_OP_RX, 2, 0, QK_ARG_W, 0, 0, 0, 0.7, 0.3),
        qk_test_op(QK_OP_CNOT, 0, 1, QK_ARG_CONST, 0, 0, 0, 1, 0), qk_test_op(QK_OP_RY, 1, 0, QK_ARG_W, 0, 0, 1, 1.3, 0),
        qk_test_op(QK_OP_RZZ, 1, 2, QK_ARG_W, 0, 0, 2, 0.9, -0.2), qk_test_op(QK_OP_P, 0, 0, QK_ARG_W, 0, 0, 3, 1.1, 0),
        qk_test_op(QK_OP_RY, 2, 0, QK_ARG_XX, 1, 2, 0, 1.0, 0),    qk_test_op(QK_OP_CZ, 0, 2, QK_ARG_CONST, 0, 0, 0, 1, 0),
        qk_test_op(QK_OP_RZ, 2, 0, QK_ARG_W, 0, 0, 4, 0.5, 0.1),   qk_test_op(QK_OP_Y, 1, 0, QK_ARG_CONST, 0, 0, 0, 1, 0),
        qk_test_op(QK_OP_RX, 1, 0, QK_ARG_X, 2, 0, 0, 1.0, 0),     qk_test_op(QK_OP_RY, 0, 0, QK_ARG_W, 0, 0, 5, 2.0, 0),
    };
    return qk_test_custom(3, 3, ops, (int)(sizeof ops / sizeof ops[0]), 6);
}
static inline qk_map *qk_test_parse(const char *spec, int d)
{
    qk_map *m = NULL;
    if (qk_map_parse(spec, d, &m) != QK_OK) { printf("parse %s (%d): %s\n", spec, d, qk_last_error()); exit(2); }
    return m;
}
static inline double *qk_test_rand_data(int64_t n, int d, double lo, double hi)
{
    double *x = (double *)malloc(sizeof(double) * (size_t)(n * d));
    int64_t i;
    if (!x) { printf("out of memory\n"); exit(2); }
    for (i = 0; i < n * d; i++) x[i] = qk_test_uniform(lo, hi);
    return x;
}
static inline double qk_test_max_diff(const double *a, const double *b, int64_t n)
{
    double worst = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (e != e) return INFINITY;
        if (e > worst) worst = e;
    }
    return worst;
}

/* Tiles through the callback into K (rows x cols, NaN first): every entry once (bad counts one
   delivered twice), tiles side x side but at the right and bottom edges, for K(X,X) (sym) the
   upper block triangle only, mirrored here. */
typedef struct qk_test_tiles { double *K; int64_t rows, cols, side; int sym, bad, calls; } qk_test_tiles;
static inline int qk_test_on_tile(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *t, int64_t ld, void *user)
{
    qk_test_tiles *s = (qk_test_tiles *)user;
    int64_t a, b;
    s->calls++;
    if (s->sym && j0 < i0) s->bad++;
    if ((m != s->side && i0 + m != s->rows) || (n != s->side && j0 + n != s->cols) || m > s->side || n > s->side) s->bad++;
    for (a = 0; a < m; a++)
        for (b = 0; b < n; b++) {
            double v = ((const double *)t)[a * ld + b];
            if (!isnan(s->K[(i0 + a) * s->cols + j0 + b])) s->bad++; /* delivered twice */
            s->K[(i0 + a) * s->cols + j0 + b] = v;
            if (s->sym && j0 != i0) s->K[(j0 + b) * s->cols + i0 + a] = v;
        }
    return 0;
}

#if defined(CLOCK_MONOTONIC) && defined(CLOCK_PROCESS_CPUTIME_ID)
#if defined(__GLIBC__)
#include <malloc.h> /* mallopt (M_PERTURB) */
#endif
static inline double qk_test_now(clockid_t clk)
{
    struct timespec t;
    clock_gettime(clk, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static inline void qk_test_perturb(int on)
{
#if defined(__GLIBC__) && defined(M_PERTURB)
    const char *e = getenv("MALLOC_PERTURB_");
    mallopt(M_PERTURB, on && e ? atoi(e) : 0);
#else
    (void)on;
#endif
}
static inline int qk_test_cancel_first(int64_t done, int64_t total, void *user)
{
    (void)done; (void)total;
    ++*(int *)user;
    return 1;
}
static inline qk_result qk_test_timed_gram(qk_ctx *ctx, const qk_map *m, const qk_gram_desc *d, double t[2])
{
    double w = qk_test_now(CLOCK_MONOTONIC), c = qk_test_now(CLOCK_PROCESS_CPUTIME_ID);
    qk_result r = qk_gram(ctx, m, d);
    t[0] = qk_test_now(CLOCK_MONOTONIC) - w;
    t[1] = qk_test_now(CLOCK_PROCESS_CPUTIME_ID) - c;
    return r;
}
#endif /* the POSIX clocks */
#endif /* QK_H */

#endif /* QK_TEST_H */
