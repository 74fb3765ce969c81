/* >>cpu_gram ---- CPU engine: thread pool, blocked Gram ---- */
/* ---- thread pool: a parallel-for over work items taken from an atomic counter ---- */
typedef void (*qk__work_fn)(void *ctx, int thread);
typedef struct qk__pool_arg { qk__work_fn fn; void *ctx; int thread; } qk__pool_arg;

#ifndef QK_NO_THREADS
static void *qk__pool_main(void *p)
{
    qk__pool_arg *a = (qk__pool_arg *)p;
    a->fn(a->ctx, a->thread);
    return NULL;
}
#define QK__FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
#define QK__LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define QK__STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#else
#define QK__FETCH_ADD(p, v) ((*(p) += (v)) - (v))
#define QK__LOAD(p) (*(p))
#define QK__STORE(p, v) (*(p) = (v))
#endif

static int qk__ncores(void)
{
#ifndef QK_NO_THREADS
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n > 256 ? 256 : n) : 1;
#else
    return 1;
#endif
}

/* A context's pool of worker threads, started once (on its first qk_gram) and reused by every
   parallel step of its calls: the CPU engine's states and tiles, the GPU engine's host copy-out
   (a 1.6 GB K is 24 slabs; starting 15 threads per slab cost more than a tenth of the copy).
   qk_gram makes it the calling thread's current pool for the call; qk__parallel uses the current
   pool when there is one, else starts threads for the step. */
#ifndef QK_NO_THREADS
typedef struct qk__tpool qk__tpool;
typedef struct qk__tpool_worker { qk__tpool *pool; int index; } qk__tpool_worker;
struct qk__tpool {
    int n_workers, quit, want, busy;
    unsigned gen;
    qk__work_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t th[255];
    qk__tpool_worker w[255];
};

static void *qk__tpool_main(void *p)
{
    qk__tpool_worker *w = (qk__tpool_worker *)p;
    qk__tpool *t = w->pool;
    unsigned seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->quit && t->gen == seen) pthread_cond_wait(&t->go, &t->mu);
        if (t->quit) break;
        seen = t->gen;
        if (w->index < t->want) {
            qk__work_fn fn = t->fn;
            void *arg = t->arg;
            pthread_mutex_unlock(&t->mu);
            fn(arg, w->index);
            pthread_mutex_lock(&t->mu);
            if (--t->busy == 0) pthread_cond_signal(&t->done);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Starts up to n - 1 workers (the caller is thread 0); fewer when threads cannot be started. */
static qk_result qk__tpool_start(qk__tpool *t, int n)
{
    int i;
    memset(t, 0, sizeof *t);
    if (pthread_mutex_init(&t->mu, NULL) != 0) return QK_ERROR_OUT_OF_MEMORY;
    if (pthread_cond_init(&t->go, NULL) != 0) { pthread_mutex_destroy(&t->mu); return QK_ERROR_OUT_OF_MEMORY; }
    if (pthread_cond_init(&t->done, NULL) != 0) {
        pthread_cond_destroy(&t->go);
        pthread_mutex_destroy(&t->mu);
        return QK_ERROR_OUT_OF_MEMORY;
    }
    if (n > 256) n = 256;
    for (i = 1; i < n; i++) {
        t->w[i - 1].pool = t;
        t->w[i - 1].index = i;
        if (pthread_create(&t->th[i - 1], NULL, qk__tpool_main, &t->w[i - 1]) != 0) break;
        t->n_workers = i;
    }
    return QK_OK;
}

static void qk__tpool_stop(qk__tpool *t)
{
    int i;
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (i = 0; i < t->n_workers; i++) pthread_join(t->th[i], NULL);
    pthread_cond_destroy(&t->done);
    pthread_cond_destroy(&t->go);
    pthread_mutex_destroy(&t->mu);
}

static void qk__tpool_run(qk__tpool *t, int n_threads, qk__work_fn fn, void *arg)
{
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->want = n_threads < t->n_workers + 1 ? n_threads : t->n_workers + 1;
    t->busy = t->want - 1;
    t->gen++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    fn(arg, 0);
    pthread_mutex_lock(&t->mu);
    while (t->busy > 0) pthread_cond_wait(&t->done, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

static QK__TLS qk__tpool *qk__cur_pool;
#endif

/* Runs fn(ctx, t) for t = 0..n_threads-1; thread 0 is the caller: on the current context's pool
   when there is one, else on threads started for the step. If a thread cannot be started, the
   threads that did start (and the caller) still drain the shared work. */
static void qk__parallel(int n_threads, qk__work_fn fn, void *ctx)
{
#ifndef QK_NO_THREADS
    pthread_t th[256];
    qk__pool_arg args[256];
    int i, started = 0;
    if (qk__cur_pool && n_threads > 1) { qk__tpool_run(qk__cur_pool, n_threads, fn, ctx); return; }
    if (n_threads > 256) n_threads = 256;
    for (i = 1; i < n_threads; i++) {
        args[i].fn = fn; args[i].ctx = ctx; args[i].thread = i;
        if (pthread_create(&th[i], NULL, qk__pool_main, &args[i]) != 0) break;
        started = i;
    }
    fn(ctx, 0);
    for (i = 1; i <= started; i++) pthread_join(th[i], NULL);
#else
    QK__UNUSED(n_threads);
    fn(ctx, 0);
#endif
}

/* ---- states for many samples, in the CPU engine's layout ---- */
/* complex: row r = [re(D) | im(D)]; real: row r = [re(D)]; product: row r = q * 4 doubles */
typedef struct qk__states_job {
    const qk_map *map;
    const double *x;
    int64_t n;
    qk_path path;
    double *out;
    int64_t stride;
    int64_t next;
    int oom;
    struct qk__gram_job *job;   /* NULL, or the job whose progress and cancel to poll */
} qk__states_job;

static void qk__states_work(void *p, int thread)
{
    qk__states_job *j = (qk__states_job *)p;
    const qk_map *m = j->map;
    int q = m->n_qubits;
    int64_t D = (j->path == QK_PATH_ANALYTIC) ? 0 : ((int64_t)1 << q), r;
    double *theta = (double *)qk__malloc(sizeof(double) * ((size_t)m->n_ops + 1 + qk__diag_scratch(q)));
    double *im = NULL;
    qk__poll poll;
    qk__poll_init(&poll, j->job, thread);
    if (j->path == QK_PATH_REAL) im = (double *)qk__malloc(sizeof(double) * (size_t)D);
    if (!theta || (j->path == QK_PATH_REAL && !im)) { QK__STORE(&j->oom, 1); QK_FREE(theta); QK_FREE(im); return; }
    while ((r = QK__FETCH_ADD(&j->next, 1)) < j->n) {
        const double *x = j->x + r * m->n_features;
        double *row = j->out + r * j->stride;
        if (QK__LOAD(&j->oom)) break;
        if (j->path == QK_PATH_ANALYTIC) {
            qk__product1(m, x, row, theta);
            if (qk__poll_tick(&poll, 16 * ((int64_t)m->n_ops + 1))) break;   /* ~1 ns per unit, as amplitudes */
        } else {
            /* a tick per op from 2^14 amplitudes (a pass: ~10 us and up); below, one per sample
               (per-op ticks cost 30% at 10 qubits, 2-core dev machine, zz reps=2) */
            qk__poll *pp = q >= QK__POLL_OP_QUBITS ? &poll : NULL;
            if (j->path == QK_PATH_REAL) qk__state1(m, x, row, im, theta, pp);   /* im stays 0 */
            else qk__state1(m, x, row, row + D, theta, pp);
            if (qk__poll_tick(&poll, pp ? D : D * ((int64_t)m->n_ops + 1))) break;
        }
    }
    QK_FREE(theta);
    QK_FREE(im);
}

static qk_path qk__path_of(const qk_map *m)
{
    return m->cls == QK_CLASS_PRODUCT ? QK_PATH_ANALYTIC : m->cls == QK_CLASS_REAL ? QK_PATH_REAL : QK_PATH_COMPLEX;
}

static int64_t qk__row_len(const qk_map *m, qk_path path)
{
    int64_t D = (int64_t)1 << (m->n_qubits > 62 ? 0 : m->n_qubits);
    return path == QK_PATH_ANALYTIC ? 4 * (int64_t)m->n_qubits : path == QK_PATH_REAL ? D : 2 * D;
}

/* Builds n rows into out (n x qk__row_len doubles); 0, or -1 (error set) when the builders'
   scratch cannot be allocated. job (may be NULL): the job whose progress callback is polled
   meanwhile; where it cancels, the builders stop and out is left half built (the caller sees
   job->cancel and discards it). */
static int qk__cpu_states_into(const qk_map *m, const double *x, int64_t n, qk_path path, int n_threads, double *out,
                               struct qk__gram_job *job)
{
    qk__states_job j;
    memset(&j, 0, sizeof j);
    j.map = m; j.x = x; j.n = n; j.path = path; j.out = out; j.stride = qk__row_len(m, path); j.job = job;
    QK_PROF_BEGIN("states");
    qk__parallel(n_threads < n ? n_threads : (int)n, qk__states_work, &j);
    QK_PROF_END("states");
    if (j.oom) { qk__set_error("states: out of host memory"); return -1; }
    return 0;
}

/* Builds n rows; returns NULL (and sets the error) when memory runs out. job: as for
   qk__cpu_states_into (a cancelled job's rows are half built). */
static double *qk__cpu_states(const qk_map *m, const double *x, int64_t n, qk_path path, int n_threads,
                              struct qk__gram_job *job)
{
    int64_t stride = qk__row_len(m, path);
    double *out;
    if ((double)n * (double)stride * 8.0 > 9.0e18) { qk__set_error("states: %lld x %lld doubles overflow", (long long)n, (long long)stride); return NULL; }
    out = (double *)qk__malloc(sizeof(double) * (size_t)(n * stride));
    if (!out) { qk__set_error("states: cannot allocate %.3g GB of host memory for %lld states", (double)n * (double)stride * 8e-9, (long long)n); return NULL; }
    if (qk__cpu_states_into(m, x, n, path, n_threads, out, job) != 0) { QK_FREE(out); return NULL; }
    return out;
}

/* ---- blocked Gram ---- */
/* Tiles of QK__T x QK__T pairs; inside a tile, micro-kernels of QK__NI rows x QK__NJ columns with
   the column panel packed [d][re NJ | im NJ] so the inner loop is NJ-wide FMAs (one zmm with
   AVX-512, two ymm with AVX2), the row values broadcast. The d range is split into chunks of
   QK__DC so a packed panel (QK__DC * 2 * QK__NJ doubles = 32 KiB) stays in L1/L2 for 16+ qubits.
   Measured on the 2-core dev machine (docs/benchmarks.md). */
#define QK__T 64
#define QK__NI 6
#define QK__NJ 8
#define QK__DC 256
#define QK__TR (((QK__T + QK__NI - 1) / QK__NI) * QK__NI)   /* tile rows padded to NI */

typedef struct qk__gram_job {
    qk_path path;
    const double *A, *B;        /* states (B == A when symmetric) */
    int64_t na, nb, stride, D;  /* D: complex/real dimension, analytic: qubits */
    int symmetric;
    qk_dtype dt;
    void *out;
    int64_t ld;
    qk_output output;
    qk_tile_fn tile_fn;
    void *tile_user;
    qk_progress_fn progress;
    void *progress_user;
    int64_t tiles_i, tiles_j, n_tiles;
    /* slab mode (streamed output): only tile rows [ti_begin, ti_end) are computed, into out
       with row_base subtracted from the row index; symmetric tiles are mirrored into out only
       where the mirror lands inside the slab (rows < mirror_end), the writer does the rest */
    int64_t ti_begin, ti_end, row_base, mirror_end;
    /* state tiles (plan->bulk_states == 0): one block of K at a time, A and B the blocks'
       states; i_base, j_base: the block's first row and column in K (the callback's
       coordinates); mirror_out: where an off-diagonal block of symmetric K also goes,
       transposed (same ld), or NULL; twice: the block's pairs count twice (its mirror) */
    int64_t i_base, j_base;
    void *mirror_out;
    int twice;
    int64_t next;
    int64_t pairs_done, pairs_total;
    int cancel;                 /* 1: cancelled by a callback */
    int oom;
    const void *mps;            /* QK_PATH_MPS: the MPS program (qk__mps_prog, MPS engine) */
    size_t scratch;             /* QK_PATH_MPS: per-thread scratch doubles of qk__mps_tile */
#ifndef QK_NO_THREADS
    pthread_mutex_t cb_lock;
#endif
} qk__gram_job;

static void qk__mps_tile(const qk__gram_job *j, int64_t i0, int64_t j0, int64_t m, int64_t n, double *scratch, double *kt);

/* tile t -> (ti, tj); symmetric: only tj >= ti, row by row */
static void qk__tile_of(const qk__gram_job *j, int64_t t, int64_t *ti, int64_t *tj)
{
    if (!j->symmetric) { *ti = j->ti_begin + t / j->tiles_j; *tj = t % j->tiles_j; return; }
    if (j->ti_begin > 0 || j->ti_end < j->tiles_i) {
        /* a slab: a few tile rows, walked */
        int64_t i = j->ti_begin;
        while (t >= j->tiles_j - i) { t -= j->tiles_j - i; i++; }
        *ti = i;
        *tj = i + t;
        return;
    }
    {
        int64_t T = j->tiles_i, i = 0, rowlen = T;
        /* rows have T, T-1, ... tiles; the count is small enough for a closed form */
        double a = (double)(2 * T + 1), disc = a * a - 8.0 * (double)t;
        i = (int64_t)floor((a - sqrt(disc > 0 ? disc : 0)) / 2.0);
        if (i < 0) i = 0;
        while (i > 0 && i * T - i * (i - 1) / 2 > t) i--;
        while ((i + 1) * T - (i + 1) * i / 2 <= t) i++;
        rowlen = i * T - i * (i - 1) / 2;
        *ti = i;
        *tj = i + (t - rowlen);
    }
}

/* The micro-kernels use GCC/Clang vector extensions (QK__NJ doubles = one zmm / two ymm); other
   compilers get the plain loops. GCC in ISO C mode (-std=c11) does not contract a*b+c into an FMA;
   the attribute turns contraction on for these two functions only (2x on the dev machine). */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(QK_NO_VECTOR_EXT)
#define QK__VEC 1
typedef double qk__v8 __attribute__((vector_size(QK__NJ * sizeof(double))));
#if defined(__GNUC__) && !defined(__clang__)
#define QK__CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define QK__CONTRACT
#endif
#define QK__LD8(v, p) memcpy(&(v), (p), sizeof(qk__v8))
#define QK__ADD8(p, v) do { qk__v8 t_; memcpy(&t_, (p), sizeof t_); t_ += (v); memcpy((p), &t_, sizeof t_); } while (0)

QK__CONTRACT
static void qk__mk_complex(const double *ap, const double *bp, int64_t dc, double *accr, double *acci)
{
    qk__v8 r[QK__NI], im[QK__NI];
    int a;
    int64_t d;
    qk__v8 z;
    memset(&z, 0, sizeof z);
    for (a = 0; a < QK__NI; a++) { r[a] = z; im[a] = z; }
    for (d = 0; d < dc; d++) {
        qk__v8 br, bi;
        const double *x = ap + d * 2 * QK__NI;
        QK__LD8(br, bp + d * 2 * QK__NJ);
        QK__LD8(bi, bp + d * 2 * QK__NJ + QK__NJ);
        for (a = 0; a < QK__NI; a++) {
            r[a] += x[a] * br; im[a] += x[a] * bi;
            r[a] += x[QK__NI + a] * bi; im[a] -= x[QK__NI + a] * br;
        }
    }
    for (a = 0; a < QK__NI; a++) { QK__ADD8(accr + a * QK__T, r[a]); QK__ADD8(acci + a * QK__T, im[a]); }
}

QK__CONTRACT
static void qk__mk_real(const double *ap, const double *bp, int64_t dc, double *accr)
{
    qk__v8 r[QK__NI];
    int a;
    int64_t d;
    qk__v8 z;
    memset(&z, 0, sizeof z);
    for (a = 0; a < QK__NI; a++) r[a] = z;
    for (d = 0; d < dc; d++) {
        qk__v8 b;
        const double *x = ap + d * QK__NI;
        QK__LD8(b, bp + d * QK__NJ);
        for (a = 0; a < QK__NI; a++) r[a] += x[a] * b;
    }
    for (a = 0; a < QK__NI; a++) QK__ADD8(accr + a * QK__T, r[a]);
}
#else
static void qk__mk_complex(const double *ap, const double *bp, int64_t dc, double *accr, double *acci)
{
    double r[QK__NI][QK__NJ], im[QK__NI][QK__NJ];
    int a, b;
    int64_t d;
    for (a = 0; a < QK__NI; a++)
        for (b = 0; b < QK__NJ; b++) { r[a][b] = 0; im[a][b] = 0; }
    for (d = 0; d < dc; d++) {
        const double *br = bp + d * 2 * QK__NJ, *bi = br + QK__NJ, *x = ap + d * 2 * QK__NI;
        for (a = 0; a < QK__NI; a++) {
            double xr = x[a], xi = x[QK__NI + a];
            for (b = 0; b < QK__NJ; b++) {
                r[a][b] += xr * br[b] + xi * bi[b];
                im[a][b] += xr * bi[b] - xi * br[b];
            }
        }
    }
    for (a = 0; a < QK__NI; a++)
        for (b = 0; b < QK__NJ; b++) { accr[a * QK__T + b] += r[a][b]; acci[a * QK__T + b] += im[a][b]; }
}

static void qk__mk_real(const double *ap, const double *bp, int64_t dc, double *accr)
{
    double r[QK__NI][QK__NJ];
    int a, b;
    int64_t d;
    for (a = 0; a < QK__NI; a++)
        for (b = 0; b < QK__NJ; b++) r[a][b] = 0;
    for (d = 0; d < dc; d++) {
        const double *br = bp + d * QK__NJ, *x = ap + d * QK__NI;
        for (a = 0; a < QK__NI; a++)
            for (b = 0; b < QK__NJ; b++) r[a][b] += x[a] * br[b];
    }
    for (a = 0; a < QK__NI; a++)
        for (b = 0; b < QK__NJ; b++) accr[a * QK__T + b] += r[a][b];
}
#endif

/* K of the tile rows [i0, i0+m) x cols [j0, j0+n) into kt (m x n, ld QK__T), values |<a|b>|^2 */
static void qk__tile_values(const qk__gram_job *j, int64_t i0, int64_t j0, int64_t m, int64_t n,
                            double *accr, double *acci, double *panel, double *apack, double *kt)
{
    if (j->path == QK_PATH_MPS) { qk__mps_tile(j, i0, j0, m, n, apack + (size_t)QK__TR * QK__DC * 2, kt); return; }
    int64_t a, b;
    if (j->path == QK_PATH_ANALYTIC) {
        int64_t q = j->D, k;
        for (a = 0; a < m; a++) {
            const double *u = j->A + (i0 + a) * j->stride;
            for (b = 0; b < n; b++) {
                const double *v = j->B + (j0 + b) * j->stride;
                double prod = 1.0;
                for (k = 0; k < q; k++) {
                    const double *x = u + 4 * k, *y = v + 4 * k;
                    /* conj(x) . y (layout QK__QV_*) */
                    double re = x[QK__QV_RE0] * y[QK__QV_RE0] + x[QK__QV_RE1] * y[QK__QV_RE1] +
                                x[QK__QV_IM0] * y[QK__QV_IM0] + x[QK__QV_IM1] * y[QK__QV_IM1];
                    double im = x[QK__QV_RE0] * y[QK__QV_IM0] + x[QK__QV_RE1] * y[QK__QV_IM1] -
                                x[QK__QV_IM0] * y[QK__QV_RE0] - x[QK__QV_IM1] * y[QK__QV_RE1];
                    prod *= re * re + im * im;
                }
                kt[a * QK__T + b] = prod;
            }
        }
        return;
    }
    {
        int cplx = j->path == QK_PATH_COMPLEX;
        int64_t D = j->D, d0, jp, ip, c;
        for (a = 0; a < QK__TR; a++)
            for (b = 0; b < QK__T; b++) { accr[a * QK__T + b] = 0; acci[a * QK__T + b] = 0; }
        for (d0 = 0; d0 < D; d0 += QK__DC) {
            int64_t dc = D - d0 < QK__DC ? D - d0 : QK__DC;
            int w = cplx ? 2 : 1;
            /* pack the tile's rows: groups of NI rows, [d][re NI | im NI]; rows past m are zero */
            for (ip = 0; ip < m; ip += QK__NI) {
                double *dst = apack + ip * dc * w;
                for (c = 0; c < QK__NI; c++) {
                    int64_t d;
                    if (ip + c < m) {
                        const double *sr = j->A + (i0 + ip + c) * j->stride + d0, *si = sr + D;
                        for (d = 0; d < dc; d++) dst[d * w * QK__NI + c] = sr[d];
                        if (cplx) for (d = 0; d < dc; d++) dst[d * 2 * QK__NI + QK__NI + c] = si[d];
                    } else {
                        for (d = 0; d < dc; d++) dst[d * w * QK__NI + c] = 0;
                        if (cplx) for (d = 0; d < dc; d++) dst[d * 2 * QK__NI + QK__NI + c] = 0;
                    }
                }
            }
            for (jp = 0; jp < n; jp += QK__NJ) {
                /* pack columns jp..jp+NJ (zero past n) */
                for (c = 0; c < QK__NJ; c++) {
                    int64_t col = jp + c, d;
                    if (col < n) {
                        const double *br = j->B + (j0 + col) * j->stride + d0;
                        const double *bi = br + D;
                        if (cplx) for (d = 0; d < dc; d++) { panel[d * 2 * QK__NJ + c] = br[d]; panel[d * 2 * QK__NJ + QK__NJ + c] = bi[d]; }
                        else for (d = 0; d < dc; d++) panel[d * QK__NJ + c] = br[d];
                    } else {
                        if (cplx) for (d = 0; d < dc; d++) { panel[d * 2 * QK__NJ + c] = 0; panel[d * 2 * QK__NJ + QK__NJ + c] = 0; }
                        else for (d = 0; d < dc; d++) panel[d * QK__NJ + c] = 0;
                    }
                }
                for (ip = 0; ip < m; ip += QK__NI) {
                    const double *ap = apack + ip * dc * w;
                    if (cplx) qk__mk_complex(ap, panel, dc, accr + ip * QK__T + jp, acci + ip * QK__T + jp);
                    else qk__mk_real(ap, panel, dc, accr + ip * QK__T + jp);
                }
            }
        }
        for (a = 0; a < m; a++)
            for (b = 0; b < n; b++) {
                double re = accr[a * QK__T + b], im = cplx ? acci[a * QK__T + b] : 0.0;
                kt[a * QK__T + b] = re * re + im * im;
            }
    }
}

static void qk__store(void *out, qk_dtype dt, int64_t idx, double v)
{
    if (dt == QK_F32) ((float *)out)[idx] = (float)v;
    else ((double *)out)[idx] = v;
}

/* The progress callback (cancel when it says so), from one thread at a time: compute thread 0
   after each tile, the state builders every few ms of work (qk__poll), and the streamed output's
   writer thread while it writes (qk.h's CPU streaming), so that a cancel is seen while the states
   are built or the writer is the bottleneck too. */
static void qk__job_poll(qk__gram_job *j)
{
    if (!j->progress) return;
#ifndef QK_NO_THREADS
    if (pthread_mutex_trylock(&j->cb_lock) != 0) return;
#endif
    /* once cancelled, no more calls (another thread may have polled since this one looked) */
    if (!QK__LOAD(&j->cancel) && j->progress(QK__LOAD(&j->pairs_done), j->pairs_total, j->progress_user)) QK__STORE(&j->cancel, 1);
#ifndef QK_NO_THREADS
    pthread_mutex_unlock(&j->cb_lock);
#endif
}

/* The state builders' polls (qk__poll above): thread 0 every QK__POLL_WORK, the others 8x. */
static void qk__poll_init(qk__poll *p, qk__gram_job *job, int thread)
{
    p->job = job;
    p->work = 0;
    p->every = thread == 0 ? QK__POLL_WORK : 8 * QK__POLL_WORK;
}

/* Counts work; polls when enough has been done since the last poll. 1: the job is cancelled. */
static int qk__poll_tick(qk__poll *p, int64_t work)
{
    if (!p->job) return 0;
    p->work += work;
    if (p->work >= p->every) {
        p->work = 0;
        qk__job_poll(p->job);
    }
    return QK__LOAD(&p->job->cancel) != 0;
}

static void qk__gram_work(void *p, int thread)
{
    qk__gram_job *j = (qk__gram_job *)p;
    size_t esz = j->dt == QK_F32 ? 4 : 8;
    /* accr, acci: QK__TR x QK__T (rows padded to a multiple of QK__NI); kt: QK__T x QK__T;
       panel: QK__DC x 2 x QK__NJ; apack: QK__TR x QK__DC x 2 */
    double *accr = (double *)qk__malloc(sizeof(double) * ((size_t)QK__TR * QK__T * 2 + QK__T * QK__T +
                                                          QK__DC * 2 * QK__NJ + (size_t)QK__TR * QK__DC * 2 + j->scratch));
    void *cb = j->output == QK_OUTPUT_CALLBACK ? qk__malloc(esz * QK__T * QK__T) : NULL;
    double *acci, *kt, *panel, *apack;
    int64_t t;
    unsigned polls = 0;
    if (!accr || (j->output == QK_OUTPUT_CALLBACK && !cb)) { QK__STORE(&j->oom, 1); QK_FREE(accr); QK_FREE(cb); return; }
    acci = accr + QK__TR * QK__T;
    kt = acci + QK__TR * QK__T;
    panel = kt + QK__T * QK__T;
    apack = panel + QK__DC * 2 * QK__NJ;
    if (thread > 0) QK_PROF_THREAD_NAME("qk cpu worker");
    while ((t = QK__FETCH_ADD(&j->next, 1)) < j->n_tiles) {
        int64_t ti, tj, i0, j0, m, n, a, b;
        int diag;
        if (QK__LOAD(&j->cancel) || QK__LOAD(&j->oom)) break;
        QK_PROF_BEGIN("gram tile");
        qk__tile_of(j, t, &ti, &tj);
        i0 = ti * QK__T; j0 = tj * QK__T;
        m = j->na - i0 < QK__T ? j->na - i0 : QK__T;
        n = j->nb - j0 < QK__T ? j->nb - j0 : QK__T;
        diag = j->symmetric && ti == tj;
        qk__tile_values(j, i0, j0, m, n, accr, acci, panel, apack, kt);
        if (diag) /* one value per unordered pair: K is exactly symmetric */
            for (a = 0; a < m; a++)
                for (b = 0; b < a; b++) kt[a * QK__T + b] = kt[b * QK__T + a];
        if (j->output == QK_OUTPUT_CALLBACK) {
            int stop;
            for (a = 0; a < m; a++)
                for (b = 0; b < n; b++) qk__store(cb, j->dt, a * n + b, kt[a * QK__T + b]);
#ifndef QK_NO_THREADS
            pthread_mutex_lock(&j->cb_lock);
#endif
            stop = QK__LOAD(&j->cancel) ? 1 : j->tile_fn(i0 + j->i_base, j0 + j->j_base, m, n, cb, n, j->tile_user);
#ifndef QK_NO_THREADS
            pthread_mutex_unlock(&j->cb_lock);
#endif
            if (stop) QK__STORE(&j->cancel, 1);
        } else {
            int mirror = j->symmetric && !diag && j0 < j->mirror_end;
            int64_t r0 = i0 - j->row_base;
            for (a = 0; a < m; a++)
                for (b = 0; b < n; b++) {
                    double v = kt[a * QK__T + b];
                    qk__store(j->out, j->dt, (r0 + a) * j->ld + j0 + b, v);
                    if (mirror) qk__store(j->out, j->dt, (j0 - j->row_base + b) * j->ld + i0 + a, v);
                }
            if (j->mirror_out)
                for (b = 0; b < n; b++)
                    for (a = 0; a < m; a++) qk__store(j->mirror_out, j->dt, (j0 + b) * j->ld + i0 + a, kt[a * QK__T + b]);
        }
        QK_PROF_END("gram tile");
        QK_PROF_COUNT("tiles", 1);
        (void)QK__FETCH_ADD(&j->pairs_done, (diag || !j->symmetric) && !j->twice ? m * n : 2 * m * n);
        /* thread 0 after each tile, the others after every 8th (with a warm pool thread 0 may
           run few tiles): about one poll per tile time, as many as one thread would make */
        if (thread == 0 || (++polls & 7) == 0) qk__job_poll(j);
    }
    QK_FREE(accr);
    QK_FREE(cb);
}

/* The tiles of the job (all of K, or one slab) on the engine's threads. */
static void qk__cpu_run_tiles(qk__gram_job *j, int nt)
{
    qk__parallel((int64_t)nt < j->n_tiles ? nt : (int)j->n_tiles, qk__gram_work, j);
}

/* State tiles (plan->bulk_states == 0): the states of R samples at a time (R =
   plan->state_tile), two blocks resident: A holds the block of X rows [i0, i0 + R), B one block
   of columns (X's for K(X,X), Y's for K(X,Y)); K goes block by block. Each pair is computed by
   the same tile arithmetic as with all states resident (the row's state conjugated, the same
   d-chunk order), so K is bitwise the all-resident K. Cost: the column blocks' states are built
   again for every row block (n^2 / 2R state builds for K(X,X)). */
typedef struct qk__cpu_tiles {
    const qk_map *map;
    const qk_gram_desc *desc;
    qk_path path;
    int64_t R;
    double *A, *B;
} qk__cpu_tiles;

/* Row block [i0, i0 + m) of K with state tiles. out: where K[i0][0] goes (leading dimension
   j->ld), or NULL (tile callback); kbase: K itself (the off-diagonal blocks of K(X,X) are
   mirrored into it), or NULL when out is a slab of these rows only (the streamed output's
   writer writes the mirror). */
static qk_result qk__cpu_row_block(const qk__cpu_tiles *t, qk__gram_job *j, int64_t i0, int64_t m, char *out,
                                   char *kbase, int nt)
{
    const qk_gram_desc *desc = t->desc;
    const int sym = desc->y == NULL, nf = t->map->n_features;
    const int64_t nb = sym ? desc->n_x : desc->n_y;
    const size_t es = j->dt == QK_F32 ? 4 : 8;
    int64_t c0;
    if (qk__cpu_states_into(t->map, desc->x + i0 * nf, m, t->path, nt, t->A, j) != 0) return QK_ERROR_OUT_OF_MEMORY;
    qk__job_poll(j);
    for (c0 = sym ? i0 : 0; c0 < nb && !QK__LOAD(&j->cancel) && !QK__LOAD(&j->oom); c0 += t->R) {
        const int64_t n = nb - c0 < t->R ? nb - c0 : t->R;
        const int diag = sym && c0 == i0;
        if (!diag) {
            if (qk__cpu_states_into(t->map, (sym ? desc->x : desc->y) + c0 * nf, n, t->path, nt, t->B, j) != 0)
                return QK_ERROR_OUT_OF_MEMORY;
            qk__job_poll(j);
            if (QK__LOAD(&j->cancel)) break;
        }
        j->A = t->A;
        j->B = diag ? t->A : t->B;
        j->na = m;
        j->nb = n;
        j->symmetric = diag;
        j->twice = sym && !diag;
        j->tiles_i = (m + QK__T - 1) / QK__T;
        j->tiles_j = (n + QK__T - 1) / QK__T;
        j->n_tiles = diag ? j->tiles_i * (j->tiles_i + 1) / 2 : j->tiles_i * j->tiles_j;
        j->ti_begin = 0;
        j->ti_end = j->tiles_i;
        j->row_base = 0;
        j->mirror_end = INT64_MAX;
        j->i_base = i0;
        j->j_base = c0;
        j->out = out ? out + (size_t)c0 * es : NULL;
        j->mirror_out = out && kbase && sym && !diag ? kbase + ((size_t)c0 * (size_t)j->ld + (size_t)i0) * es : NULL;
        j->next = 0;
        QK_PROF_BEGIN("gram block");
        qk__cpu_run_tiles(j, nt);
        QK_PROF_END("gram block");
    }
    return QK_OK;
}

static qk_result qk__cpu_gram_npy(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, int nt,
                                  const qk__cpu_tiles *tl);

/* Runs a job set up by qk__cpu_job_init: all of K, streamed (NPY), or (tl) by state tiles. */
static qk_result qk__cpu_gram_exec(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, const qk__cpu_tiles *tl)
{
    int nt = plan->n_threads > 0 ? plan->n_threads : 1;
    qk_result r = QK_OK;
    if (desc->output == QK_OUTPUT_NPY) r = qk__cpu_gram_npy(plan, desc, j, nt, tl);
    else if (tl) {
        const size_t es = j->dt == QK_F32 ? 4 : 8;
        char *K = desc->output == QK_OUTPUT_HOST ? (char *)desc->out : NULL;
        int64_t i0;
        for (i0 = 0; i0 < desc->n_x && r == QK_OK && !j->cancel && !j->oom; i0 += tl->R)
            r = qk__cpu_row_block(tl, j, i0, desc->n_x - i0 < tl->R ? desc->n_x - i0 : tl->R,
                                  K ? K + (size_t)i0 * (size_t)j->ld * es : NULL, K, nt);
    } else qk__cpu_run_tiles(j, nt);
    if (r != QK_OK) return r;
    if (j->oom) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "gram: out of host memory for tile buffers");
    if (j->cancel) return qk__fail(QK_ERROR_CANCELLED, "gram: cancelled by a callback after %lld of %lld pairs (output partly written)", (long long)j->pairs_done, (long long)j->pairs_total);
    if (desc->progress) desc->progress(j->pairs_total, j->pairs_total, desc->progress_user);
    return QK_OK;
}

/* The job for all of K from the states A and B (B == A for K(X,X)), or NULL and NULL (set
   after the states are built, with the job polled meanwhile); qk__cpu_job_free ends it. */
static void qk__cpu_job_init(qk__gram_job *j, const qk_plan *plan, const qk_gram_desc *desc, const double *A, const double *B,
                             int64_t stride, int64_t D, const void *mps, size_t scratch)
{
    int64_t nb = desc->y ? desc->n_y : desc->n_x;
    memset(j, 0, sizeof *j);
    j->path = plan->path;
    j->A = A;
    j->B = B;
    j->na = desc->n_x;
    j->nb = nb;
    j->stride = stride;
    j->D = D;
    j->mps = mps;
    j->scratch = scratch;
    j->symmetric = desc->y == NULL;
    j->dt = plan->out_dtype;
    j->out = desc->out;
    j->ld = desc->ld_out ? desc->ld_out : nb;
    j->output = desc->output;
    j->tile_fn = desc->tile_fn;
    j->tile_user = desc->tile_user;
    j->progress = desc->progress;
    j->progress_user = desc->progress_user;
    j->tiles_i = (j->na + QK__T - 1) / QK__T;
    j->tiles_j = (j->nb + QK__T - 1) / QK__T;
    j->n_tiles = j->symmetric ? j->tiles_i * (j->tiles_i + 1) / 2 : j->tiles_i * j->tiles_j;
    j->ti_begin = 0;
    j->ti_end = j->tiles_i;
    j->row_base = 0;
    j->mirror_end = INT64_MAX;
    j->pairs_total = j->na * j->nb;
#ifndef QK_NO_THREADS
    pthread_mutex_init(&j->cb_lock, NULL);
#endif
}

static void qk__cpu_job_free(qk__gram_job *j)
{
#ifndef QK_NO_THREADS
    pthread_mutex_destroy(&j->cb_lock);
#else
    QK__UNUSED(j);
#endif
}

/* A job cancelled while its states were built, before any of K (bulk states, MPS). */
static qk_result qk__cpu_states_cancelled(const qk__gram_job *j)
{
    return qk__fail(QK_ERROR_CANCELLED, "gram: cancelled by a callback while the states were built (0 of %lld pairs; the output was not written)",
                    (long long)j->pairs_total);
}

/* K from the states A and B (B == A for K(X,X)) in the engine's layout for plan->path, built with
   j (qk__cpu_job_init with no states) polled: the tiles, all of K or streamed (NPY), with
   callbacks, progress and cancel; or the cancel that came while the states were built. A, B:
   NULL where memory ran out (the error is set); B NULL for K(X,X) or where the cancel came
   before Y's states. */
static qk_result qk__cpu_gram_run(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, const double *A, const double *B)
{
    if (!A) return QK_ERROR_OUT_OF_MEMORY;
    if (j->cancel) return qk__cpu_states_cancelled(j);
    if (desc->y && !B) return QK_ERROR_OUT_OF_MEMORY;
    j->A = A;
    j->B = B ? B : A;
    return qk__cpu_gram_exec(plan, desc, j, NULL);
}

/* K with state tiles (plan->bulk_states == 0): two blocks of plan->state_tile states. */
static qk_result qk__cpu_gram_tiled(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc)
{
    qk__cpu_tiles t;
    qk__gram_job j;
    const qk_path path = plan->path;
    const int64_t stride = qk__row_len(map, path), nb = desc->y ? desc->n_y : desc->n_x;
    const int64_t R = plan->state_tile;
    qk_result r;
    if (R < 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "gram: a plan with state tiles of %lld samples", (long long)R);
    memset(&t, 0, sizeof t);
    t.map = map;
    t.desc = desc;
    t.path = path;
    t.R = R;
    if ((double)R * (double)stride * 8.0 > 9.0e18) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "states: %lld x %lld doubles overflow", (long long)R, (long long)stride);
    t.A = (double *)qk__malloc(sizeof(double) * (size_t)(R * stride));
    if (t.A && (desc->y || R < nb)) t.B = (double *)qk__malloc(sizeof(double) * (size_t)(R * stride));
    if (!t.A || ((desc->y || R < nb) && !t.B)) {
        QK_FREE(t.A);
        QK_FREE(t.B);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "states: cannot allocate two tiles of %lld states (%.3g GB of host memory)",
                        (long long)R, 2.0 * (double)R * (double)stride * 8e-9);
    }
    qk__cpu_job_init(&j, plan, desc, NULL, NULL, stride, path == QK_PATH_ANALYTIC ? map->n_qubits : ((int64_t)1 << map->n_qubits), NULL, 0);
    r = qk__cpu_gram_exec(plan, desc, &j, &t);
    qk__cpu_job_free(&j);
    QK_FREE(t.A);
    QK_FREE(t.B);
    return r;
}

/* The CPU engine's Gram; desc validated, plan made. */
static qk_result qk__cpu_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc)
{
    qk_path path = plan->path;
    double *A = NULL, *B = NULL;
    int nt = plan->n_threads > 0 ? plan->n_threads : 1;
    qk__gram_job j;
    qk_result r;
    if (!plan->bulk_states) return qk__cpu_gram_tiled(plan, map, desc);
    qk__cpu_job_init(&j, plan, desc, NULL, NULL, qk__row_len(map, path),
                     path == QK_PATH_ANALYTIC ? map->n_qubits : ((int64_t)1 << map->n_qubits), NULL, 0);
    A = qk__cpu_states(map, desc->x, desc->n_x, path, nt, &j);
    if (A && desc->y && !j.cancel) B = qk__cpu_states(map, desc->y, desc->n_y, path, nt, &j);
    r = qk__cpu_gram_run(plan, desc, &j, A, B);
    qk__cpu_job_free(&j);
    QK_FREE(A);
    QK_FREE(B);
    return r;
}

/* CPU plan: all states in host memory when they fit the host budget, else state tiles. */
#ifndef QK_CPU_SLAB_BYTES
#define QK_CPU_SLAB_BYTES ((size_t)128 << 20)   /* host bytes per streamed slab (two are used) */
#endif
#define QK__CPU_SLAB_BYTES ((size_t)(QK_CPU_SLAB_BYTES))
#define QK__HOST_SHARE 0.85     /* share of the available host memory the CPU engine plans with */
static qk_result qk__mps_plan(const qk_map *map, const qk_gram_desc *desc, qk_plan *p);

/* Available host memory in bytes, 0 when unknown: Linux's MemAvailable (free memory and the
   page cache the kernel can drop), bounded by the cgroup v2 limit (memory.max - memory.current)
   where the process runs in one (containers, batch jobs); elsewhere sysconf's available pages. */
static double qk__host_avail(void)
{
    double avail = 0.0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { avail = (double)kb * 1024.0; break; }
        fclose(f);
    }
    if (avail > 0) {
        unsigned long long mx = 0, cur = 0;
        int ok = 0;
        f = fopen("/sys/fs/cgroup/memory.max", "r");   /* "max" (no limit) does not scan */
        if (f) { ok = fscanf(f, "%llu", &mx) == 1; fclose(f); }
        f = ok ? fopen("/sys/fs/cgroup/memory.current", "r") : NULL;
        if (f) {
            if (fscanf(f, "%llu", &cur) == 1 && mx > cur && (double)(mx - cur) < avail) avail = (double)(mx - cur);
            fclose(f);
        }
        return avail;
    }
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
    {
        long pages = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
        if (pages > 0 && ps > 0) return (double)pages * (double)ps;
    }
#endif
    return 0.0;
}

/* Host bytes of the CPU engine's per-thread scratch: the Gram tile buffers of qk__gram_work
   (and a callback tile) and the state builders' angles and, real path, imaginary half. */
static double qk__cpu_scratch(const qk_map *map, qk_path path, double es, int nt)
{
    double tile = 8.0 * ((double)QK__TR * QK__T * 2 + QK__T * QK__T + QK__DC * 2 * QK__NJ + (double)QK__TR * QK__DC * 2) + es * QK__T * QK__T;
    double build = 8.0 * (map->n_ops + 1) + (path == QK_PATH_REAL ? 8.0 * ldexp(1.0, map->n_qubits) : 0.0);
    return (double)(nt > 0 ? nt : 1) * (tile + build);
}

/* The same for qk_max_samples: a complex map of q qubits and a few hundred ops, float64 K. */
static double qk__cpu_scratch_q(int q, int nt)
{
    double tile = 8.0 * ((double)QK__TR * QK__T * 2 + QK__T * QK__T + QK__DC * 2 * QK__NJ + (double)QK__TR * QK__DC * 2) + 8.0 * QK__T * QK__T;
    return (double)(nt > 0 ? nt : 1) * (tile + 8.0 * (20.0 * q + 2.0 * (1 + q + q * q) + 1));
}

/* The host budget of a CPU plan (bytes), and the available memory it came from (0: given). */
static double qk__host_budget(const qk_device_info *info, double *avail)
{
    *avail = 0.0;
    if (info && info->host_budget_bytes) return (double)info->host_budget_bytes;
    *avail = qk__host_avail();
    return QK__HOST_SHARE * *avail;
}

/* nt: the engine's threads (their scratch is counted). */
static qk_result qk__plan_cpu_nt(const qk_device_info *info, const qk_map *map, const qk_gram_desc *desc, int nt, qk_plan *p)
{
    qk_path path = qk__path_of(map);
    const int64_t nb = desc->y ? desc->n_y : desc->n_x;
    double avail, budget, row, es, all, scratch, staging = 0.0;
    qk_result r;
    memset(p, 0, sizeof *p);
    p->backend = QK_BACKEND_CPU;
    p->path = path;
    p->precision = QK_PRECISION_FP64;
    p->out_dtype = desc->out_dtype ? desc->out_dtype : (qk__prec_f32(desc->precision) ? QK_F32 : QK_F64);
    p->output = desc->output;
    p->n_qubits = map->n_qubits;
    p->n_x = desc->n_x;
    p->n_y = nb;
    p->symmetric = desc->y == NULL;
    p->n_threads = nt > 0 ? nt : 1;
    p->bulk_states = 1;
    p->state_tile = 0;
    p->tile_m = p->tile_n = QK__T;
    p->n_streams = 0;
    es = p->out_dtype == QK_F32 ? 4.0 : 8.0;
    p->bytes_states = map->n_qubits > QK_MAX_STATE_QUBITS && path != QK_PATH_ANALYTIC ? (size_t)-1 /* no statevector */
                      : (size_t)((double)(desc->n_x + (desc->y ? desc->n_y : 0)) * (double)qk__row_len(map, path) * 8.0);
    p->bytes_out = (size_t)((double)desc->n_x * (double)nb * es);
    p->bytes_total = p->bytes_states;
    if (desc->output == QK_OUTPUT_NPY) {
        /* two slab buffers of at most QK__CPU_SLAB_BYTES each, whole tiles of rows: host memory
           O(slab), not O(n^2); the symmetric mirror goes out as one write per row and slab, so
           taller slabs mean fewer, larger writes */
        double rb = (double)nb * es;
        int64_t sr = (int64_t)((double)QK__CPU_SLAB_BYTES / rb) / QK__T * QK__T;
        if (sr < QK__T) sr = QK__T;
        if (sr > desc->n_x) sr = (desc->n_x + QK__T - 1) / QK__T * QK__T;
        p->slab_rows = sr;
        p->bytes_staging = (size_t)(2.0 * (double)sr * rb);
        staging = (double)p->bytes_staging + (double)sr * 64.0 * es; /* and the strips' buffer */
    }
    if (desc->precision && desc->precision != QK_PRECISION_FP64)
        snprintf(p->config, sizeof p->config, "cpu tile %dx%d micro %dx%d; fp64 arithmetic (asked %s: the CPU engine computes in fp64)",
                 QK__T, QK__T, QK__NI, QK__NJ, qk__prec_name(desc->precision));
    else snprintf(p->config, sizeof p->config, "cpu tile %dx%d micro %dx%d", QK__T, QK__T, QK__NI, QK__NJ);
    p->error_bound = qk_precision_error_bound(QK_PRECISION_FP64, map->n_qubits);
    p->tol = desc->precision == QK_PRECISION_AUTO ? desc->tol : 0.0;
    if (desc->precision && desc->precision != QK_PRECISION_FP64)
        snprintf(p->precision_note, sizeof p->precision_note, "fp64 (asked %s: the CPU engine accepts every mode and computes in fp64%s)",
                 qk__prec_name(desc->precision), desc->precision == QK_PRECISION_AUTO ? ", which meets any tolerance" : "");
    snprintf(p->device_name, sizeof p->device_name, "CPU");
    budget = qk__host_budget(info, &avail);
    p->bytes_budget = (size_t)budget;
    p->bytes_host_avail = (size_t)avail;
    r = qk__mps_plan(map, desc, p);   /* MPS engine: statevector or MPS */
    if (r != QK_OK || p->path == QK_PATH_MPS) return r;

    /* statevector and analytic paths: all states resident when they fit the host budget with
       the scratch and the streamed output's slabs; else state tiles, two blocks of R samples
       (R a multiple of the tile side from QK__T on), and the streamed output's slabs one row
       block each. An unknown budget (no /proc/meminfo, no sysconf) plans all resident. */
    row = (double)qk__row_len(map, path) * 8.0;
    all = (double)p->bytes_states;
    scratch = qk__cpu_scratch(map, path, es, p->n_threads);
    p->bytes_workspace = (size_t)scratch;
    p->bytes_total = (size_t)(all + scratch + (double)p->bytes_staging);
    if (budget <= 0 || all + scratch + staging <= budget) return QK_OK;
    {
        const double per = 2.0 * row + (desc->output == QK_OUTPUT_NPY ? 2.0 * (double)nb * es + 64.0 * es : 0.0);
        const int64_t most = desc->n_x > nb ? desc->n_x : nb;
        double fit = (budget - scratch) / per;
        int64_t R = fit >= (double)most ? most : fit >= 1.0 ? (int64_t)fit : 0;
        if (R < 1)
            return qk__fail(QK_ERROR_OUT_OF_MEMORY, "plan: two %d-qubit states need %.0f bytes of host memory (%.3g GB, with %.0f bytes "
                            "of scratch for %d threads), the host budget is %.0f bytes (%.3g GB%s)", map->n_qubits,
                            per + scratch, (per + scratch) * 1e-9, scratch, p->n_threads, budget, budget * 1e-9,
                            avail > 0 ? ": 85% of the available memory" : ": qk_ctx_desc.host_memory");
        if (R > QK__T) R = R / QK__T * QK__T;
        p->bulk_states = 0;
        p->state_tile = R;
        p->tile_m = p->tile_n = R < QK__T ? R : QK__T;
        p->bytes_states = (size_t)(2.0 * (double)R * row);
        if (desc->output == QK_OUTPUT_NPY) {
            p->slab_rows = R;
            p->bytes_staging = (size_t)(2.0 * (double)R * (double)nb * es);
        }
        p->bytes_total = (size_t)((double)p->bytes_states + scratch + (double)p->bytes_staging);
    }
    return QK_OK;
}

static qk_result qk__plan_cpu(const qk_device_info *info, const qk_map *map, const qk_gram_desc *desc, qk_plan *p)
{
    return qk__plan_cpu_nt(info, map, desc, qk__ncores(), p);
}


