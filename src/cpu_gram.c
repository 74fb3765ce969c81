#include "qk_internal.h"
/* >>cpu_gram ---- CPU engine: states for many samples, the blocked Gram tiles ---- */
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

QK__PRIV qk_path qk__path_of(const qk_map *m)
{
    return m->cls == QK_CLASS_PRODUCT ? QK_PATH_ANALYTIC : m->cls == QK_CLASS_REAL ? QK_PATH_REAL : QK_PATH_COMPLEX;
}

QK__PRIV int64_t qk__row_len(const qk_map *m, qk_path path)
{
    int64_t D = (int64_t)1 << (m->n_qubits > 62 ? 0 : m->n_qubits);
    return path == QK_PATH_ANALYTIC ? 4 * (int64_t)m->n_qubits : path == QK_PATH_REAL ? D : 2 * D;
}

/* Builds n rows into out (n x qk__row_len doubles); 0, or -1 (error set) when the builders'
   scratch cannot be allocated. job (may be NULL): the job whose progress callback is polled
   meanwhile; where it cancels, the builders stop and out is left half built (the caller sees
   job->cancel and discards it). */
static int qk__cpu_states_rows(const qk_map *m, const double *x, int64_t n, qk_path path, int n_threads, double *out,
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

/* Rows [row0, row0 + n) of the data X (desc->x or desc->y, n_features doubles a row) into out.
   Given states with a provider (qk_gram_states): X is a tag (qk__smap: its side and first row),
   and the rows come from the provider in chunks into the map's buffer, checked, then built as
   stored rows. */
static int qk__cpu_states_into(const qk_map *m, const double *X, int64_t row0, int64_t n, qk_path path, int n_threads,
                               double *out, struct qk__gram_job *job)
{
    qk__smap *sm;
    int tag, side;
    int64_t c, stride;
    if (!qk__map_is_states(m) || !(m->ops[0].q1 & QK__STATE_PROVIDER))
        return qk__cpu_states_rows(m, X + row0 * m->n_features, n, path, n_threads, out, job);
    sm = (qk__smap *)(void *)(uintptr_t)(const void *)m;
    tag = (const char *)(const void *)X == &sm->side[1];
    side = sm->tag_side[tag];
    row0 += sm->tag_row0[tag];   /* the tag's first row (a block of K under qk_gram_mpi_states) */
    stride = qk__row_len(m, path);
    for (c = 0; c < n; c += sm->chunk) {
        const int64_t k = n - c < sm->chunk ? n - c : sm->chunk;
        const qk_result r = qk__smap_fetch(sm, side, row0 + c, k, sm->buf);
        if (r != QK_OK) {
            if (job) { job->provider_failed = r; QK__STORE(&job->cancel, 1); }
            return -1;
        }
        if (qk__cpu_states_rows(m, (const double *)sm->buf, k, path, n_threads, out + c * stride, job) != 0) return -1;
    }
    return 0;
}

/* The result of a failed qk__cpu_states_into: the provider's error (set), or out of memory. */
static qk_result qk__states_failed(const qk__gram_job *j)
{
    return j && j->provider_failed ? j->provider_failed : QK_ERROR_OUT_OF_MEMORY;
}

/* Builds n rows; returns NULL (and sets the error) when memory runs out. job: as for
   qk__cpu_states_into (a cancelled job's rows are half built). */
QK__PRIV double *qk__cpu_states(const qk_map *m, const double *x, int64_t row0, int64_t n, qk_path path, int n_threads,
                                struct qk__gram_job *job)
{
    int64_t stride = qk__row_len(m, path);
    double *out;
    if ((double)n * (double)stride * 8.0 > 9.0e18) { qk__set_error("states: %lld x %lld doubles overflow", (long long)n, (long long)stride); return NULL; }
    out = (double *)qk__malloc(sizeof(double) * (size_t)(n * stride));
    if (!out) { qk__set_error("states: cannot allocate %.3g GB of host memory for %lld states", (double)n * (double)stride * 8e-9, (long long)n); return NULL; }
    if (qk__cpu_states_into(m, x, row0, n, path, n_threads, out, job) != 0) { QK_FREE(out); return NULL; }
    return out;
}

/* ---- blocked Gram ---- */
/* Tiles of QK__T x QK__T pairs; inside a tile, micro-kernels of QK__NI rows x QK__NJ columns with
   the column panel packed [d][re NJ | im NJ] so the inner loop is NJ-wide FMAs (one zmm with
   AVX-512, two ymm with AVX2), the row values broadcast. The d range is split into chunks of
   QK__DC so a packed panel (QK__DC * 2 * QK__NJ doubles = 32 KiB) stays in L1/L2 for 16+ qubits.
   Measured on the 2-core dev machine (docs/benchmarks.md). */
/* QK__T, QK__NI, QK__DC, QK__TR: in qk_internal.h (the planner sizes with them) */

/* the Gram job (qk__gram_job) and its polls are in cpu_pool.c (the types in qk_internal.h) */

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

/* The micro-kernels use GCC/Clang vector extensions; other compilers get the plain loops below.
   A micro-kernel's 2 x QK__NI accumulators (QK__NJ = 8 columns each) must stay in registers:
   12 zmm with AVX-512 (32 registers), but 8 doubles are two ymm with AVX2 and four xmm with SSE2
   (16 registers), and 24 or 48 of them spill on every FMA. So a kernel walks the 8 columns in
   slices of one hardware vector (QK__MK_W doubles: 8 with AVX-512, 4 with AVX or on AArch64, 2
   otherwise), each slice over the whole chunk of d; an entry sums its d terms in the same order
   whatever the slice width, so K does not depend on it (FMA contraction, which the instruction
   set decides, does change the last bits). GCC in ISO C mode (-std=c11) does not contract a*b+c
   into an FMA; QK__CONTRACT turns contraction on for these functions only (2x on the dev machine).

   Runtime dispatch (QK__DISPATCH, qk_internal.h: x86-64, GCC or Clang, a target without AVX2,
   and no QK_NO_DISPATCH): a portable build (a Python wheel, a distribution's package: plain
   x86-64, SSE2) also compiles the kernels for AVX2 + FMA and for AVX-512F (target attributes) and
   each Gram job uses the instruction set qk__cpu_isa chose (the best the CPU has, QK_CPU_ISA,
   qk_cpu_isa_set; cpu_pool.c). Builds for a target with AVX2 (-march=native, -Dnative=true) use
   the one their target gives, without dispatch. */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(QK_NO_VECTOR_EXT)
/* QK__VEC, qk__v8, qk__v4, qk__v2, QK__CONTRACT, QK__LD8, QK__ST8, QK__ADD8: in qk_internal.h (the MPS engine uses them) */

/* Defines NAME##_complex and NAME##_real for slices of W doubles (vector type VT), with the
   function attributes ATTR. */
#define QK__MK_DEFINE(NAME, ATTR, VT, W)                                                            \
    QK__CONTRACT ATTR static void NAME##_complex(const double *ap, const double *bp, int64_t dc,     \
                                                 double *accr, double *acci)                        \
    {                                                                                               \
        int a, h;                                                                                   \
        int64_t d;                                                                                  \
        for (h = 0; h < QK__NJ; h += (W)) {                                                         \
            VT r[QK__NI], im[QK__NI], z, t;                                                         \
            memset(&z, 0, sizeof z);                                                                \
            for (a = 0; a < QK__NI; a++) { r[a] = z; im[a] = z; }                                   \
            for (d = 0; d < dc; d++) {                                                              \
                VT br, bi;                                                                          \
                const double *x = ap + d * 2 * QK__NI;                                              \
                memcpy(&br, bp + d * 2 * QK__NJ + h, sizeof br);                                    \
                memcpy(&bi, bp + d * 2 * QK__NJ + QK__NJ + h, sizeof bi);                           \
                for (a = 0; a < QK__NI; a++) {                                                      \
                    r[a] += x[a] * br; im[a] += x[a] * bi;                                          \
                    r[a] += x[QK__NI + a] * bi; im[a] -= x[QK__NI + a] * br;                        \
                }                                                                                   \
            }                                                                                       \
            for (a = 0; a < QK__NI; a++) {                                                          \
                memcpy(&t, accr + a * QK__T + h, sizeof t); t += r[a];                              \
                memcpy(accr + a * QK__T + h, &t, sizeof t);                                         \
                memcpy(&t, acci + a * QK__T + h, sizeof t); t += im[a];                             \
                memcpy(acci + a * QK__T + h, &t, sizeof t);                                         \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
    QK__CONTRACT ATTR static void NAME##_real(const double *ap, const double *bp, int64_t dc, double *accr) \
    {                                                                                               \
        int a, h;                                                                                   \
        int64_t d;                                                                                  \
        for (h = 0; h < QK__NJ; h += (W)) {                                                         \
            VT r[QK__NI], z, t;                                                                     \
            memset(&z, 0, sizeof z);                                                                \
            for (a = 0; a < QK__NI; a++) r[a] = z;                                                  \
            for (d = 0; d < dc; d++) {                                                              \
                VT b;                                                                               \
                const double *x = ap + d * QK__NI;                                                  \
                memcpy(&b, bp + d * QK__NJ + h, sizeof b);                                          \
                for (a = 0; a < QK__NI; a++) r[a] += x[a] * b;                                      \
            }                                                                                       \
            for (a = 0; a < QK__NI; a++) {                                                          \
                memcpy(&t, accr + a * QK__T + h, sizeof t); t += r[a];                              \
                memcpy(accr + a * QK__T + h, &t, sizeof t);                                         \
            }                                                                                       \
        }                                                                                           \
    }

#if defined(__AVX512F__)
QK__MK_DEFINE(qk__mk, , qk__v8, 8)
#elif defined(__AVX__) || defined(__aarch64__)
QK__MK_DEFINE(qk__mk, , qk__v4, 4)
#else
QK__MK_DEFINE(qk__mk, , qk__v2, 2)
#endif

#if defined(QK__DISPATCH)
QK__MK_DEFINE(qk__mk_avx2, __attribute__((target("avx2,fma"))), qk__v4, 4)
QK__MK_DEFINE(qk__mk_avx512, __attribute__((target("avx512f,fma"))), qk__v8, 8)
#endif
#undef QK__MK_DEFINE

static void qk__mk_complex_isa(int isa, const double *ap, const double *bp, int64_t dc, double *accr, double *acci)
{
#if defined(QK__DISPATCH)
    if (isa == QK__ISA_AVX512) { qk__mk_avx512_complex(ap, bp, dc, accr, acci); return; }
    if (isa == QK__ISA_AVX2) { qk__mk_avx2_complex(ap, bp, dc, accr, acci); return; }
#endif
    (void)isa;
    qk__mk_complex(ap, bp, dc, accr, acci);
}

static void qk__mk_real_isa(int isa, const double *ap, const double *bp, int64_t dc, double *accr)
{
#if defined(QK__DISPATCH)
    if (isa == QK__ISA_AVX512) { qk__mk_avx512_real(ap, bp, dc, accr); return; }
    if (isa == QK__ISA_AVX2) { qk__mk_avx2_real(ap, bp, dc, accr); return; }
#endif
    (void)isa;
    qk__mk_real(ap, bp, dc, accr);
}
#else
static void qk__mk_complex_isa(int isa, const double *ap, const double *bp, int64_t dc, double *accr, double *acci)
{
    double r[QK__NI][QK__NJ], im[QK__NI][QK__NJ];
    int a, b;
    int64_t d;
    (void)isa;
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

static void qk__mk_real_isa(int isa, const double *ap, const double *bp, int64_t dc, double *accr)
{
    double r[QK__NI][QK__NJ];
    int a, b;
    int64_t d;
    (void)isa;
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
                            double *accr, double *acci, double *panel, double *apack, double *kt, int isa)
{
    if (j->path == QK_PATH_MPS) { j->mps_tile(j, i0, j0, m, n, apack + (size_t)QK__TR * QK__DC * 2, kt); return; }
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
                    if (cplx) qk__mk_complex_isa(isa, ap, panel, dc, accr + ip * QK__T + jp, acci + ip * QK__T + jp);
                    else qk__mk_real_isa(isa, ap, panel, dc, accr + ip * QK__T + jp);
                }
            }
        }
        for (a = 0; a < m; a++)
            for (b = 0; b < n; b++) {
                double re = accr[a * QK__T + b], im = cplx ? acci[a * QK__T + b] : 0.0;
                kt[a * QK__T + b] = j->linear ? re : re * re + im * im;
            }
    }
}

static void qk__store(void *out, qk_dtype dt, int64_t idx, double v)
{
    if (dt == QK_F32) ((float *)out)[idx] = (float)v;
    else ((double *)out)[idx] = v;
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
    const int isa = j->isa;   /* the micro-kernels' instruction set (dispatch: above) */
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
        qk__tile_values(j, i0, j0, m, n, accr, acci, panel, apack, kt, isa);
        /* cancelled meanwhile: the MPS chain may have stopped half way; no unfinished tile is stored */
        if (QK__LOAD(&j->cancel)) { QK_PROF_END("gram tile"); break; }
        if (diag) /* one value per unordered pair: K is exactly symmetric */
            for (a = 0; a < m; a++)
                for (b = 0; b < a; b++) kt[a * QK__T + b] = kt[b * QK__T + a];
        if (j->output == QK_OUTPUT_CALLBACK) {
            int stop;
            for (a = 0; a < m; a++)
                for (b = 0; b < n; b++) qk__store(cb, j->dt, a * n + b, kt[a * QK__T + b]);
            qk__mutex_lock(&j->cb_lock);
            stop = QK__LOAD(&j->cancel) ? 1 : j->tile_fn(i0 + j->i_base, j0 + j->j_base, m, n, cb, n, j->tile_user);
            qk__mutex_unlock(&j->cb_lock);
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
QK__PRIV void qk__cpu_run_tiles(qk__gram_job *j, int nt)
{
    qk__parallel((int64_t)nt < j->n_tiles ? nt : (int)j->n_tiles, qk__gram_work, j);
}

/* State tiles (plan->bulk_states == 0): the states of R samples at a time (R =
   plan->state_tile), two blocks resident: A holds the block of X rows [i0, i0 + R), B one block
   of columns (X's for K(X,X), Y's for K(X,Y)); K goes block by block. Each pair is computed by
   the same tile arithmetic as with all states resident (the row's state conjugated, the same
   d-chunk order), so K is bitwise the all-resident K. Cost: the column blocks' states are built
   again for every row block (n^2 / 2R state builds for K(X,X)). */
/* qk__cpu_tiles: in qk_internal.h */

/* Row block [i0, i0 + m) of K with state tiles. out: where K[i0][0] goes (leading dimension
   j->ld), or NULL (tile callback); kbase: K itself (the off-diagonal blocks of K(X,X) are
   mirrored into it), or NULL when out is a slab of these rows only (the streamed output's
   writer writes the mirror). */
QK__PRIV qk_result qk__cpu_row_block(const qk__cpu_tiles *t, qk__gram_job *j, int64_t i0, int64_t m, char *out,
                                     char *kbase, int nt)
{
    const qk_gram_desc *desc = t->desc;
    const int sym = desc->y == NULL;
    const int64_t nb = sym ? desc->n_x : desc->n_y;
    const size_t es = j->dt == QK_F32 ? 4 : 8;
    int64_t c0;
    if (qk__cpu_states_into(t->map, desc->x, i0, m, t->path, nt, t->A, j) != 0) return qk__states_failed(j);
    qk__job_poll(j);
    for (c0 = sym ? i0 : 0; c0 < nb && !QK__LOAD(&j->cancel) && !QK__LOAD(&j->oom); c0 += t->R) {
        const int64_t n = nb - c0 < t->R ? nb - c0 : t->R;
        const int diag = sym && c0 == i0;
        if (!diag) {
            if (qk__cpu_states_into(t->map, sym ? desc->x : desc->y, c0, n, t->path, nt, t->B, j) != 0)
                return qk__states_failed(j);
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
