#include "qk_internal.h"
/* >>delivery ---- the GPU engine's host-side slabs to the caller's output; several GPUs ---- */
/* A pageable host buffer gets each slab from pinned staging by several threads: one core copies
   about 10 GB/s into touched memory and far less into fresh memory (each first touch faults a
   page), PCIe delivers about 50 GB/s; the page faults of fresh memory run in parallel too. The
   copy of slab s runs while the GPU computes and copies slab s + 1. */
#if defined(QK_CUDA) && QK_CUDA
typedef struct qk__deliver {
    const qk_gram_desc *desc;
    qk__sink *sink;
    int64_t cols;
    size_t es;
    int n_threads;
    /* the slab being copied */
    char *dst;
    const char *src;
    int64_t rows, ld_dst, ld_src, chunk, next;
} qk__deliver;

/* A copy into memory that will not be read soon (the caller's K): non-temporal stores where
   SSE2 exists, so the destination's lines are not read first (a plain copy moves 3 bytes per
   byte: read source, read destination line, write it back). */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__SSE2__)
#include <emmintrin.h>
static void qk__copy_stream(void *dst, const void *src, size_t n)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head; s += head; n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
    _mm_sfence();
}
#else
#define qk__copy_stream(d, s, n) memcpy((d), (s), (n))
#endif

static void qk__deliver_copy_work(void *p, int thread)
{
    qk__deliver *d = (qk__deliver *)p;
    int64_t c, r;
    QK__UNUSED(thread);
    while ((c = QK__FETCH_ADD(&d->next, 1)) * d->chunk < d->rows) {
        int64_t r1 = (c + 1) * d->chunk < d->rows ? (c + 1) * d->chunk : d->rows;
        if (d->ld_dst == d->cols && d->ld_src == d->cols)
            qk__copy_stream(d->dst + (size_t)(c * d->chunk * d->ld_dst) * d->es, d->src + (size_t)(c * d->chunk * d->ld_src) * d->es,
                            (size_t)((r1 - c * d->chunk) * d->cols) * d->es);
        else
            for (r = c * d->chunk; r < r1; r++)
                qk__copy_stream(d->dst + (size_t)(r * d->ld_dst) * d->es, d->src + (size_t)(r * d->ld_src) * d->es, (size_t)d->cols * d->es);
    }
}

/* m rows of d->cols elements (ld apart) from pinned staging to dst (d->ld_dst apart) on up to
   d->n_threads threads, one per 8 MB at most. */
static void qk__deliver_host(qk__deliver *d, char *dst, int64_t m, const void *rows, int64_t ld)
{
    const int64_t bytes = m * d->cols * (int64_t)d->es;
    int nt = d->n_threads;
    d->dst = dst;
    d->src = (const char *)rows;
    d->rows = m;
    d->ld_src = ld;
    d->chunk = (int64_t)((4u << 20) / ((size_t)d->cols * d->es)) + 1;   /* ~4 MB per work item */
    d->next = 0;
    if ((int64_t)nt > bytes / (8 << 20) + 1) nt = (int)(bytes / (8 << 20) + 1);
    QK_PROF_BEGIN("host copy-out");
    qk__parallel(nt, qk__deliver_copy_work, d);
    QK_PROF_END("host copy-out");
}

static qk_result qk__deliver_rows(int64_t i0, int64_t m, const void *rows, int64_t ld, void *user)
{
    qk__deliver *d = (qk__deliver *)user;
    const qk_gram_desc *g = d->desc;
    qk__sink *s = d->sink;
    if (s->kind == QK_OUTPUT_NPY) return qk__npyw_rows(&s->npy, i0, 0, m, d->cols, rows, ld);
    if (s->kind == QK_OUTPUT_CALLBACK) {
        /* square tiles of the slab's height; symmetric: the diagonal tile and those right of it */
        int64_t j0;
        for (j0 = g->y ? 0 : i0; j0 < d->cols; j0 += m) {
            int64_t n = d->cols - j0 < m ? d->cols - j0 : m;
            if (s->tile_fn(i0, j0, m, n, (const char *)rows + (size_t)j0 * d->es, ld, s->tile_user))
                return qk__fail(QK_ERROR_CANCELLED, "tile callback cancelled the Gram");
        }
        return QK_OK;
    }
    qk__deliver_host(d, (char *)s->out + (size_t)(i0 * d->ld_dst) * d->es, m, rows, ld);
    return QK_OK;
}

/* The MPS path on the GPU: the MPS of X (and Y) built on the host (qk__mps_states, the engine's
   threads), repacked for qk_cuda_mps_gram: [site][entry][sample] complex, each site padded to
   chi x 2 x chi (qk__mps_gpu_chi), one site per work item. */
typedef struct qk__mps_pack_job {
    const qk__mps_prog *p;
    const double *src;      /* lane layout (qk__mps_states) */
    double *dst;
    int64_t n, next;
    int chi;
} qk__mps_pack_job;

static void qk__mps_pack_work(void *arg, int thread)
{
    qk__mps_pack_job *j = (qk__mps_pack_job *)arg;
    const int c = j->chi, E = 2 * c * c;
    int64_t s;
    QK__UNUSED(thread);
    while ((s = QK__FETCH_ADD(&j->next, 1)) < j->p->q) {
        const int dl = j->p->D[s], dr = j->p->D[s + 1];
        double *site = j->dst + (size_t)s * (size_t)E * (size_t)j->n * 2;
        int64_t i;
        int l, a, r;
        for (l = 0; l < dl; l++)
            for (a = 0; a < 2; a++)
                for (r = 0; r < dr; r++) {
                    const size_t se = ((size_t)l * 2 + a) * (size_t)dr + (size_t)r;   /* lane layout entry */
                    double *o = site + (((size_t)l * 2 + a) * (size_t)c + (size_t)r) * (size_t)j->n * 2;
                    for (i = 0; i < j->n; i++) {
                        const double *g = j->src + (i / QK__NJ) * j->p->group + j->p->off[s] + se * 2 * QK__NJ + (i % QK__NJ);
                        o[2 * i] = g[0];
                        o[2 * i + 1] = g[QK__NJ];
                    }
                }
    }
}

/* n samples' MPS packed for the GPU (NULL with the error set when memory runs out); eps: n
   per-sample truncation bounds, or NULL. */
static double *qk__mps_gpu_states(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int nt, int chi, double *eps)
{
    qk__mps_pack_job j;
    double *lanes = qk__mps_states(p, m, x, n, nt, NULL, eps, NULL), *out;
    const double vals = (double)p->q * 2.0 * chi * chi * (double)n * 2.0;
    if (!lanes) return NULL;
    out = vals * 8.0 < 9.0e18 ? (double *)qk__calloc((size_t)vals, sizeof(double)) : NULL;
    if (!out) {
        QK_FREE(lanes);
        qk__set_error("mps: cannot allocate %.3g GB of host memory to pack %lld MPS for the GPU", vals * 8e-9, (long long)n);
        return NULL;
    }
    memset(&j, 0, sizeof j);
    j.p = p; j.src = lanes; j.dst = out; j.n = n; j.chi = chi;
    qk__parallel(nt < p->q ? nt : p->q, qk__mps_pack_work, &j);
    QK_FREE(lanes);
    return out;
}

/* planned: the planner's program (qk_gram hands it over) or NULL (built here). */
static qk_result qk__mps_cuda(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, const qk_cuda_io *io,
                              int nt, const qk__mps_prog *planned, char *err, size_t err_size)
{
    qk__mps_prog own;
    const qk__mps_prog *prog = NULL;
    qk_cuda_mps m;
    double *A = NULL, *B = NULL;
    int chi;
    qk_result r = qk__mps_prog_of(planned, map, desc, &own, &prog);
    if (r != QK_OK) return r;
    chi = qk__mps_gpu_chi(prog->chi);
    QK_PROF_BEGIN("mps states");
    A = qk__mps_gpu_states(prog, map, desc->x, desc->n_x, nt, chi, desc->mps_discarded);
    if (A && desc->y) B = qk__mps_gpu_states(prog, map, desc->y, desc->n_y, nt, chi, desc->mps_discarded ? desc->mps_discarded + desc->n_x : NULL);
    QK_PROF_END("mps states");
    if (!A || (desc->y && !B)) r = QK_ERROR_OUT_OF_MEMORY;
    else {
        memset(&m, 0, sizeof m);
        m.n_sites = prog->q;
        m.chi = chi;
        m.a = A;
        m.n_a = desc->n_x;
        m.b = B;
        m.n_b = desc->y ? desc->n_y : 0;
        r = qk_cuda_mps_gram(plan, desc, &m, io, err, err_size);
    }
    QK_FREE(A);
    QK_FREE(B);
    qk__mps_prog_free(&own);
    return r;
}

/* The context's two page-locked staging buffers (ctx->stage), grown to at least need bytes each:
   1 when they hold that much; a failure to grow leaves none (0: the caller copies without them). */
QK__PRIV int qk__ctx_stage(qk_ctx *ctx, size_t need)
{
    char err[256];
    if (ctx->stage_bytes >= need) return 1;
    qk_cuda_host_free(ctx->stage[0]);
    qk_cuda_host_free(ctx->stage[1]);
    ctx->stage[0] = ctx->stage[1] = NULL;
    ctx->stage_bytes = 0;
    if (qk_cuda_host_alloc(need, &ctx->stage[0], err, sizeof err) == QK_OK && qk_cuda_host_alloc(need, &ctx->stage[1], err, sizeof err) == QK_OK)
        ctx->stage_bytes = need;
    else {
        qk_cuda_host_free(ctx->stage[0]);
        qk_cuda_host_free(ctx->stage[1]);
        ctx->stage[0] = ctx->stage[1] = NULL;
    }
    return ctx->stage_bytes >= need;
}

/* The context's stream pool of its k-th GPU (the current one), made on the first job there; NULL
   when it cannot be made (the job then makes its own streams, as the pool's absence means). */
QK__PRIV qk_cuda_pool *qk__cuda_pool(qk_ctx *ctx, int k)
{
    char err[256];
    if (!ctx->spool[k] && qk_cuda_pool_create(&ctx->spool[k], err, sizeof err) != QK_OK) ctx->spool[k] = NULL;
    return ctx->spool[k];
}

/* A provider's rows for the GPU engine (qk_cuda_io.fetch): rows [r0, r1) of the Gram's x (tag 0)
   or y (tag 1) from qk_gram_states' provider (user: its map, a qk__smap, whose tags give the
   side and first row: qk_gram_mpi_states points them at a block of K), written into dst in
   chunks of at most the map's chunk rows, and checked as the CPU engine checks them. */
static qk_result qk__states_fetch(int tag, int64_t r0, int64_t r1, double *dst, void *user)
{
    qk__smap *sm = (qk__smap *)user;
    const int64_t rowb = (int64_t)sm->map.n_features * 8;
    const int side = sm->tag_side[tag];
    int64_t c;
    r0 += sm->tag_row0[tag];
    r1 += sm->tag_row0[tag];
    for (c = r0; c < r1; c += sm->chunk) {
        const int64_t k = r1 - c < sm->chunk ? r1 - c : sm->chunk;
        const qk_result r = qk__smap_fetch(sm, side, c, k, (char *)dst + (size_t)((c - r0) * rowb));
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

/* A planned Gram on the GPU engine (one GPU) into the sink, with qk.h's delivery (pageable host
   copy-out, square tiles for the callback, the .npy stream). mps: the planner's MPS program
   (MPS path; NULL: built here). */
QK__PRIV qk_result qk__cuda_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink,
                                const qk__mps_prog *mps, qk_cuda_stats *stats)
{
    char err[512] = "";
    qk__deliver d;
    qk_cuda_io io;
    qk_result r;
    const int n_threads = ctx ? ctx->desc.n_threads : 0;
    memset(&d, 0, sizeof d);
    d.desc = desc;
    d.sink = sink;
    d.cols = plan->n_y;
    d.es = sink->es;
    d.ld_dst = sink->ld;
    d.n_threads = n_threads > 0 ? n_threads : qk__ncores();
    memset(&io, 0, sizeof io);
    io.rows = qk__deliver_rows;
    io.rows_user = &d;
    io.stats = stats;
    io.prof = QK__PROF_CUDA_HOOKS;
    io.pool = ctx ? qk__cuda_pool(ctx, 0) : NULL;
    if (qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_PROVIDER)) {
        io.fetch = qk__states_fetch;
        io.fetch_user = (void *)(uintptr_t)(const void *)map;   /* the map is its qk__smap's first member */
    }
    if (ctx && desc->output != QK_OUTPUT_DEVICE && !(desc->output == QK_OUTPUT_HOST && plan->host_pinned)) {
        /* the context's pinned staging, grown to this plan's slab (a failure here only means the
           engine allocates its own) */
        size_t need = (size_t)(plan->slab_rows > 0 ? plan->slab_rows : plan->n_x) * (size_t)plan->n_y * d.es;
        if (qk__ctx_stage(ctx, need)) {
            io.stage[0] = ctx->stage[0];
            io.stage[1] = ctx->stage[1];
            io.stage_bytes = ctx->stage_bytes;
        }
    }
    if (plan->path == QK_PATH_MPS) {   /* the MPS path: MPS built on the host, contracted on the GPU */
        r = qk__mps_cuda(plan, map, desc, &io, d.n_threads, mps, err, sizeof err);
    } else {
        r = qk_cuda_gram(plan, map, desc, &io, err, sizeof err);
    }
    if (r != QK_OK && err[0]) qk__fail(r, "%s", err);
    return r;
}
#endif

/* ---- several GPUs in one process ---- */
/* A plan with n_devices > 1 (qk_plan_for_devices) runs here: one host thread per GPU (the
   calling thread for the first, the context's GPU pool for the others) makes its GPU current
   and runs qk_cuda_gram on its parts of K (qk_plan.dev_row0: for K(X,Y) its rows x
   all columns; for K(X,X) the band's diagonal block, a symmetric job, then the rectangle right
   of it), each part with the plan qk_plan.parts carries for it (planned for that GPU's free
   memory and autotuned by qk_plan_make: nothing is planned or tuned here). Parts go to the output at their offsets
   in K, and no element is written by two threads (a band's rows from its first row on, and the
   mirror of its rectangle: rows below the band, the band's columns):
     HOST      the engine writes into the caller's buffer at the part's offset (D2H straight
               into it when it is pinned, else slab rows copied from pinned staging by the
               GPU's share of the host threads); the rectangle's mirror comes from the engine
               too, each slab's transpose made on the GPU (qk_cuda_io.mirror_out: D2H into
               its place; staged: qk_cuda_io.mrows, rows of it copied into their place)
     DEVICE    out_devices[k] on GPU k, rows of its band (qk_gram_desc.out_devices)
     CALLBACK  the caller's tiles in K's coordinates, one call at a time (a mutex)
     NPY       the sink's temporary file; each thread writes through its own descriptor the
               row pieces of its slabs and of their transposes (mrows, as for HOST); the
               writer's syncer is the one-GPU path's, commit and removal qk_gram's
   The first failure (a GPU error, a write error, a cancel) sets a flag that every other thread
   reads before each slab and each write; the job then returns that failure, naming the GPU, and
   NPY leaves no file. Times: qk_ctx_device_seconds. */
#if defined(QK_CUDA) && QK_CUDA
static int qk__mgpu_test_fail = -1;  /* tests: this ordinal's thread fails before its last part */
#ifdef QK_TEST_FAULTS
static int64_t qk__mgpu_test_slab = 0;   /* tests: > 0, every part runs in slabs of this many rows (K not resident) */
static qk_plan qk__mgpu_test_ran[QK_MAX_PARTS];   /* tests: the plan each part of the last job ran */
#endif

typedef struct qk__mgpu {
    qk_ctx *ctx;
    const qk_plan *plan;
    const qk_map *map;
    const qk_gram_desc *desc;
    qk__sink *sink;
    qk__npyw *w;                /* NPY: the sink's writer */
    int64_t cols, ld;
    size_t es;
    int cancel;                 /* the first failure sets it; every thread stops */
    int64_t done, total;        /* entries of K delivered (progress), under mu */
    double t0;
    qk__mutex mu;               /* the caller's callbacks one at a time; the first failure */
    qk_result r;                /* the first failure and its detail */
    char err[sizeof qk__errbuf];
    struct qk__mgpu_dev *v;     /* the GPUs' shares, n_dev of them */
    int n_dev, serial;          /* shares [serial, n_dev) run on the calling thread after the first */
} qk__mgpu;

typedef struct qk__mgpu_dev {
    qk__mgpu *g;
    int k, ord;
    int caller;                 /* its share runs on the calling thread (not named, qk gpu <ordinal>) */
    int fd;                     /* NPY: this thread's descriptor of the temporary file */
    int64_t di, dj, h, w;       /* the running part: origin in K, rows, columns */
    int diag, mirror;
    int64_t last;               /* the part's progress reported so far */
    qk__deliver copy;           /* HOST: slab rows into the caller's buffer on this GPU's share of the host threads */
    qk_cuda_stats stats;        /* its last part's, copyin_bytes summed over its parts */
    double seconds;
} qk__mgpu_dev;

static void qk__mgpu_lock(qk__mgpu *g)
{
    qk__mutex_lock(&g->mu);
}

static void qk__mgpu_unlock(qk__mgpu *g)
{
    qk__mutex_unlock(&g->mu);
}

/* Records a failure (the first one wins; a thread stopped by the flag does not count) and stops
   every thread. user: the caller's callback cancelled (no device named). */
static void qk__mgpu_fail(qk__mgpu *g, int ord, qk_result r, const char *detail, int user)
{
    qk__mgpu_lock(g);
    if (g->r == QK_OK && !(r == QK_ERROR_CANCELLED && !user && QK__LOAD(&g->cancel))) {
        g->r = r;
        if (user) snprintf(g->err, sizeof g->err, "%s", detail);
        else snprintf(g->err, sizeof g->err, "CUDA device %d: %s", ord, detail);
    }
    QK__STORE(&g->cancel, 1);
    qk__mgpu_unlock(g);
}

static int qk__mgpu_progress(int64_t done, int64_t total, void *user)
{
    qk__mgpu_dev *v = (qk__mgpu_dev *)user;
    qk__mgpu *g = v->g;
    int stop = 0;
    QK__UNUSED(total);
    if (QK__LOAD(&g->cancel)) return 1;
    if (g->desc->progress) {
        /* entries of K the part stands for: a rectangle's twice (its mirror); a band's rows of w
           (done counts whole rows) its h x h block and twice the rectangle right of it */
        int64_t add = (done - v->last) * (v->mirror ? 2 : 1);
        if (v->diag && v->w > v->h) add = (done / v->w - v->last / v->w) * (2 * v->w - v->h);
        v->last = done;
        qk__mgpu_lock(g);
        g->done += add;
        stop = g->desc->progress(g->done, g->total, g->desc->progress_user);
        qk__mgpu_unlock(g);
        if (stop) {
            qk__mgpu_fail(g, v->ord, QK_ERROR_CANCELLED, "progress callback cancelled the Gram", 1);
            return 1;
        }
    }
    return 0;
}

/* The engine's host-side slab rows [i0, i0 + m) of the running part to the caller's output. */
static qk_result qk__mgpu_rows(int64_t i0, int64_t m, const void *rows, int64_t ld, void *user)
{
    qk__mgpu_dev *v = (qk__mgpu_dev *)user;
    qk__mgpu *g = v->g;
    const qk__sink *sink = g->sink;
    const size_t es = g->es;
    const char *src = (const char *)rows;
    const int64_t gi = v->di + i0;
    int64_t a;
    if (QK__LOAD(&g->cancel)) return qk__fail(QK_ERROR_CANCELLED, "cancelled");
    if (sink->kind == QK_OUTPUT_HOST) {
        v->copy.cols = v->w;
        qk__deliver_host(&v->copy, (char *)sink->out + (size_t)(gi * g->ld + v->dj) * es, m, src, ld);
        return QK_OK;
    }
    if (sink->kind == QK_OUTPUT_CALLBACK) {
        int64_t j0;
        int stop = 0;
        qk__mgpu_lock(g);
        for (j0 = v->diag ? i0 : 0; j0 < v->w && !stop; j0 += m) {
            const int64_t n = v->w - j0 < m ? v->w - j0 : m;
            stop = sink->tile_fn(gi, v->dj + j0, m, n, src + (size_t)j0 * es, ld, sink->tile_user);
        }
        qk__mgpu_unlock(g);
        if (stop) {
            qk__mgpu_fail(g, v->ord, QK_ERROR_CANCELLED, "tile callback cancelled the Gram", 1);
            return qk__fail(QK_ERROR_CANCELLED, "tile callback cancelled the Gram");
        }
        return QK_OK;
    }
    for (a = 0; a < m; a++) {
        qk_result r = qk__npyw_at_fd(g->w, v->fd, ((uint64_t)(gi + a) * (uint64_t)g->cols + (uint64_t)v->dj) * es,
                                     src + (size_t)(a * ld) * es, (size_t)v->w * es);
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

/* The engine's transpose of the running rectangle's slab rows [i0, i0 + m) (qk_cuda_io.mrows:
   w rows of m entries, ld apart): the mirror below the diagonal, K[dj + c][di + i0 + a], copied
   into its place as rows (HOST: on the GPU's share of the host threads; NPY: a write a row). */
static qk_result qk__mgpu_mrows(int64_t i0, int64_t m, const void *t, int64_t ld, void *user)
{
    qk__mgpu_dev *v = (qk__mgpu_dev *)user;
    qk__mgpu *g = v->g;
    const size_t es = g->es;
    const int64_t gi = v->di + i0;
    int64_t c;
    if (QK__LOAD(&g->cancel)) return qk__fail(QK_ERROR_CANCELLED, "cancelled");
    if (g->sink->kind == QK_OUTPUT_HOST) {
        v->copy.cols = m;
        qk__deliver_host(&v->copy, (char *)g->sink->out + (size_t)(v->dj * g->ld + gi) * es, v->w, t, ld);
        return QK_OK;
    }
    for (c = 0; c < v->w; c++) {
        qk_result r = qk__npyw_at_fd(g->w, v->fd, ((uint64_t)(v->dj + c) * (uint64_t)g->cols + (uint64_t)gi) * es,
                                     (const char *)t + (size_t)(c * ld) * es, (size_t)m * es);
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

/* One GPU's share: its parts in order, each with the plan the plan carries for it. */
static void *qk__mgpu_main(void *p)
{
    qk__mgpu_dev *v = (qk__mgpu_dev *)p;
    qk__mgpu *g = v->g;
    qk_ctx *ctx = g->ctx;
    const qk_plan *plan = g->plan;
    const qk_gram_desc *desc = g->desc;
    int i, n_parts = 0, done = 0;
    char err[512] = "", nm[32];
    qk_result r;
    qk_map pm;
    qk_op pop;
    /* device states: read in place on the first GPU, copied in from it on the others */
    const qk_map *map = qk__map_for_device(g->map, v->k, &pm, &pop);
    double copyin = 0.0;
    for (i = 0; i < plan->n_parts; i++) n_parts += plan->parts[i].device == v->k;
    snprintf(nm, sizeof nm, "qk gpu %d", v->ord);
    if (!v->caller) QK_PROF_THREAD_NAME(nm);
    QK__UNUSED(nm);
    QK_PROF_BEGIN("qk gpu share");
    r = qk_cuda_set_device(v->ord, err, sizeof err);
    if (r != QK_OK) qk__mgpu_fail(g, v->ord, r, err, 0);
    for (i = 0; i < plan->n_parts && r == QK_OK && !QK__LOAD(&g->cancel); i++) {
        const qk_plan_part *pp = &plan->parts[i];
        const int64_t j0 = pp->col0;
        qk_gram_desc sd;
        qk_plan sp;
        qk_cuda_io io;
        if (pp->device != v->k) continue;
        err[0] = 0;
        if (qk__mgpu_test_fail == v->ord && done == n_parts - 1) {
            r = QK_ERROR_CUDA;
            qk__mgpu_fail(g, v->ord, r, "an injected failure (test) before its last part", 0);
            break;
        }
        done++;
        /* the part's job and plan, both as the planner made them (qk__mgpu_part_desc, plan.parts) */
        qk__mgpu_part_desc(plan, pp, g->map->n_features, desc, &sd);
        qk__plan_part_plan(plan, i, ctx->dev_ord[v->k] == v->ord ? ctx->dev_info[v->k].name : NULL, &sp);
        sd.tile_fn = desc->tile_fn;
        sd.tile_user = desc->tile_user;
        sd.out_path = desc->out_path;
        sd.no_sync = 1;
        sd.progress = qk__mgpu_progress;
        sd.progress_user = v;
        if (desc->output == QK_OUTPUT_HOST) {
            sd.out = (char *)desc->out + (size_t)(pp->row0 * g->ld + j0) * g->es;
            sd.ld_out = g->ld;
        } else if (desc->output == QK_OUTPUT_DEVICE) {
            sd.out = (char *)desc->out_devices[v->k] + (size_t)j0 * g->es;
            sd.ld_out = g->ld;
        }
#ifdef QK_TEST_FAULTS
        memcpy(&qk__mgpu_test_ran[i], &sp, sizeof sp);   /* byte for byte: tests compare with memcmp */
#endif
#ifdef QK_TEST_FAULTS
        if (qk__mgpu_test_slab > 0 && sp.n_x > qk__mgpu_test_slab) {
            sp.tile_m = sp.slab_rows = qk__mgpu_test_slab;
            sp.k_resident = 0;
        }
#endif
        memset(&io, 0, sizeof io);
        io.rows = qk__mgpu_rows;
        io.rows_user = v;
        io.stats = &v->stats;
        io.prof = QK__PROF_CUDA_HOOKS;
        io.pool = qk__cuda_pool(ctx, v->k);
        if (pp->symmetric && pp->n_cols > pp->n_rows) io.band_rows = pp->n_rows;   /* a band: one call from the diagonal to n */
        if (pp->mirror && desc->output == QK_OUTPUT_HOST && sp.host_pinned) {   /* the mirror: D2H into its place */
            io.mirror_out = (char *)desc->out + (size_t)(j0 * g->ld + pp->row0) * g->es;
            io.mirror_ld = g->ld;
        } else if (pp->mirror && (desc->output == QK_OUTPUT_HOST || desc->output == QK_OUTPUT_NPY)) {
            io.mrows = qk__mgpu_mrows;   /* staged: a slab and its transpose per staging slot */
            io.mrows_user = v;
        }
        if (desc->output != QK_OUTPUT_DEVICE && !(desc->output == QK_OUTPUT_HOST && sp.host_pinned)) {
            size_t need = (size_t)(sp.slab_rows > 0 ? sp.slab_rows : sp.n_x) * (size_t)sp.n_y * g->es * (io.mrows ? 2 : 1);
            if (ctx->dstage_bytes[v->k] < need) {
                char e2[256];
                qk_cuda_host_free(ctx->dstage[v->k][0]);
                qk_cuda_host_free(ctx->dstage[v->k][1]);
                ctx->dstage[v->k][0] = ctx->dstage[v->k][1] = NULL;
                ctx->dstage_bytes[v->k] = 0;
                if (qk_cuda_host_alloc(need, &ctx->dstage[v->k][0], e2, sizeof e2) == QK_OK &&
                    qk_cuda_host_alloc(need, &ctx->dstage[v->k][1], e2, sizeof e2) == QK_OK)
                    ctx->dstage_bytes[v->k] = need;
            }
            if (ctx->dstage_bytes[v->k] >= need) {
                io.stage[0] = ctx->dstage[v->k][0];
                io.stage[1] = ctx->dstage[v->k][1];
                io.stage_bytes = ctx->dstage_bytes[v->k];
            }
        }
        v->di = pp->row0;
        v->dj = j0;
        v->h = pp->n_rows;
        v->w = pp->n_cols;
        v->diag = pp->symmetric;
        v->mirror = pp->mirror;
        v->last = 0;
        err[0] = 0;
        r = qk_cuda_gram(&sp, map, &sd, &io, err, sizeof err);
        if (r == QK_OK) {
            copyin += v->stats.copyin_bytes;
            v->stats.copyin_bytes = copyin;
        }
        if (r != QK_OK) {
            if (!err[0]) snprintf(err, sizeof err, "%s", qk__errbuf);
            qk__mgpu_fail(g, v->ord, r, err, 0);
        }
    }
    v->seconds = qk_cuda_wtime() - g->t0;
    QK_PROF_END("qk gpu share");
    return NULL;
}

/* Share t of the context's GPU pool (qk__tpool_run): the calling thread (t = 0) runs the first
   GPU's share, then those no worker took; worker t the share of GPU t. */
static void qk__mgpu_work(void *p, int t)
{
    qk__mgpu *g = (qk__mgpu *)p;
    int k;
    if (t > 0) {
        if (t < g->serial) (void)qk__mgpu_main(&g->v[t]);
        return;
    }
    g->v[0].caller = 1;
    (void)qk__mgpu_main(&g->v[0]);
    for (k = g->serial; k < g->n_dev; k++) {
        g->v[k].caller = 1;
        (void)qk__mgpu_main(&g->v[k]);
    }
}

QK__PRIV qk_result qk__mgpu_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink)
{
    qk__mgpu g;
    qk__mgpu_dev v[QK_MAX_DEVICES];
    const int n = plan->n_devices;
    int k;
    qk_result r = QK_OK;
    if (n < 2 || n > QK_MAX_DEVICES) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: a plan of %d devices (internal error)", n);
    r = qk__mgpu_check_parts(plan);   /* the plan carries every part's plan: nothing is planned here */
    if (r != QK_OK) return r;
    if (desc->output == QK_OUTPUT_DEVICE) {
        if (!desc->out_devices)
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: output DEVICE on %d GPUs needs desc->out_devices (one buffer per GPU, "
                            "rows plan.dev_row0[k] .. dev_row0[k+1] from qk_plan_make), or a context of one GPU (n_cuda_devices = 1)", n);
        for (k = 0; k < n; k++)
            if (!desc->out_devices[k]) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: out_devices[%d] (CUDA device %d) is NULL", k, plan->devices[k]);
    }
    memset(&g, 0, sizeof g);
    memset(v, 0, sizeof v);
    g.ctx = ctx;
    g.plan = plan;
    g.map = map;
    g.desc = desc;
    g.sink = sink;
    g.w = &sink->npy;
    g.cols = plan->n_y;
    g.ld = desc->output == QK_OUTPUT_HOST || desc->output == QK_OUTPUT_DEVICE ? (desc->ld_out ? desc->ld_out : plan->n_y) : plan->n_y;
    g.es = plan->out_dtype == QK_F32 ? 4 : 8;
    g.total = plan->n_x * plan->n_y;
    if (qk__mutex_init(&g.mu) != 0) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram: cannot create a mutex");
    if (sink->kind == QK_OUTPUT_NPY) sink->npy.cancel = &g.cancel;
    for (k = 0; k < n; k++) {
        const int nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
        v[k].g = &g;
        v[k].k = k;
        v[k].ord = plan->devices[k];
        v[k].fd = -1;
        v[k].copy.es = g.es;
        v[k].copy.ld_dst = g.ld;
        v[k].copy.n_threads = nt / n > 1 ? nt / n : 1;   /* the host's threads shared between the GPUs */
        if (r == QK_OK && sink->kind == QK_OUTPUT_NPY) r = qk__npyw_fd(&sink->npy, &v[k].fd);
    }
    /* The GPUs' host threads: the calling thread runs the first GPU's share, the context's GPU
       pool (started once, one worker a further GPU) the others'. A thread started per GPU and
       call, and joined, slowed the short 2-GPU calls (docs/benchmarks.md, "The GPUs' host
       threads"). A share no worker takes (threads that could not start, or none: QK_NO_THREADS)
       runs on the calling thread after the first. The pool's spin: the first GPU's thread
       yields a few ms for the others before it sleeps. */
    if (r == QK_OK) (void)qk__ctx_pool_of(ctx, &ctx->gpool, ctx->n_dev, 4096);
    g.v = v;
    g.n_dev = n;
    g.serial = ctx->gpool ? (ctx->gpool->n_workers + 1 < n ? ctx->gpool->n_workers + 1 : n) : 1;
    g.t0 = qk_cuda_wtime();
    if (r == QK_OK) {
        if (ctx->gpool) qk__tpool_run(ctx->gpool, g.serial, qk__mgpu_work, &g);
        else qk__mgpu_work(&g, 0);
    }
    if (r == QK_OK && g.r != QK_OK) r = qk__fail(g.r, "%s", g.err);
    for (k = 0; k < n; k++) {
        if (v[k].fd >= 0) (void)QK__CLOSE(v[k].fd);
    }
    if (sink->kind == QK_OUTPUT_NPY) sink->npy.cancel = NULL;   /* g ends here; qk_gram commits or discards */
    qk__mutex_destroy(&g.mu);
    ctx->cuda_stats = v[0].stats;
    ctx->n_dev_last = n;
    for (k = 0; k < n; k++) {
        ctx->dev_seconds[k] = v[k].seconds;
        ctx->dev_stats[k] = v[k].stats;
    }
    {   /* later calls on this thread run on the context's first GPU, as with one */
        char e2[64];
        (void)qk_cuda_set_device(plan->devices[0], e2, sizeof e2);
    }
    return r;
}
#endif /* QK_CUDA */
/* ---- end several GPUs ---- */

