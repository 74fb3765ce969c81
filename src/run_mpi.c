#include "qk_internal.h"
/* >>mpi_impl ---- qk_gram_mpi: K over the ranks of an MPI communicator ---- */
#if defined(QK_MPI)
/* qk_gram_mpi: every rank checks the request, the ranks agree (sizes, dtype, a checksum of the
   data), the rows are dealt by qk_schedule_make, and each rank runs its band in blocks: for
   slab rows [a, b) of K(X,X) the symmetric sub-job K(X[a:b]) and the rectangles
   K(X[a:b], X[c:c+w]) for c >= b (the same orientation as qk_gram's upper-triangle tiles, so the
   same bits), each into a host buffer that goes to the file as row pieces and, transposed, as
   the mirror below the diagonal. Between blocks a rank looks (MPI_Iprobe) for a failure notice
   from another rank and stops; failures are announced with non-blocking sends and every phase
   ends in qk__mpi_decide, a collective that hands every rank the first failing rank's result. */
#ifndef QK_MPI_BLOCK_BYTES
#define QK_MPI_BLOCK_BYTES ((size_t)512 << 20)
#endif
#define QK__MPI_TAG_FAIL 7117
/* The writer thread syncs the file every QK_MPI_SYNC_BYTES it wrote, as the streaming .npy
   writer's syncer does (and for the same reason: the kernel starts writing back only at
   dirty_background_ratio, so without it a K smaller than a tenth of RAM reaches the disk only
   in the final sync, after the compute); the compute goes on meanwhile. */
#ifndef QK_MPI_SYNC_BYTES
#define QK_MPI_SYNC_BYTES ((uint64_t)256 << 20)
#endif
#define QK__MPI_SYNC_BYTES ((uint64_t)(QK_MPI_SYNC_BYTES))


typedef struct qk__mpi {
    MPI_Comm comm;          /* a duplicate of the caller's: our messages never meet theirs */
    int rank, size;
    int announced;          /* this rank sent its failure notice */
    int fail_code;          /* the notice's payload (alive until the sends complete) */
    int n_reqs;
    MPI_Request *reqs;      /* size - 1 sends */
} qk__mpi;

/* Tells every other rank that this one failed (non-blocking; qk__mpi_decide completes it). */
static void qk__mpi_announce(qk__mpi *m, qk_result r)
{
    int k;
    if (m->announced || !m->reqs) return;
    m->fail_code = (int)r;
    m->n_reqs = 0;
    for (k = 0; k < m->size; k++)
        if (k != m->rank) MPI_Isend(&m->fail_code, 1, MPI_INT, k, QK__MPI_TAG_FAIL, m->comm, &m->reqs[m->n_reqs++]);
    m->announced = 1;
}

static int qk__mpi_remote_failed(qk__mpi *m)
{
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, QK__MPI_TAG_FAIL, m->comm, &flag, MPI_STATUS_IGNORE);
    return flag;
}

/* Collective. r is this rank's result (its detail in qk_last_error). Returns QK_OK when every
   rank succeeded, else on every rank the lowest failing rank's result and detail. Receives the
   failure notices sent so far, so that none is left pending. */
static qk_result qk__mpi_decide(qk__mpi *m, qk_result r)
{
    int key = r != QK_OK ? m->rank : m->size, first = m->size, ann = 0, k;
    struct { int code; char msg[sizeof qk__errbuf]; } e;
    MPI_Allreduce(&key, &first, 1, MPI_INT, MPI_MIN, m->comm);
    MPI_Allreduce(&m->announced, &ann, 1, MPI_INT, MPI_SUM, m->comm);
    for (k = 0; k < ann - m->announced; k++) {
        int c;
        MPI_Recv(&c, 1, MPI_INT, MPI_ANY_SOURCE, QK__MPI_TAG_FAIL, m->comm, MPI_STATUS_IGNORE);
    }
    if (m->announced) MPI_Waitall(m->n_reqs, m->reqs, MPI_STATUSES_IGNORE);
    m->announced = 0;
    m->n_reqs = 0;
    if (first >= m->size) return QK_OK;
    memset(&e, 0, sizeof e);
    if (m->rank == first) {
        e.code = (int)r;
        snprintf(e.msg, sizeof e.msg, "%s", qk__errbuf);
    }
    MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, first, m->comm);
    if (m->size == 1) return qk__fail((qk_result)e.code, "%s", e.msg);
    return qk__fail((qk_result)e.code, "rank %d of %d: %s", first, m->size, e.msg);
}

/* 64-bit FNV-1a over 8-byte words (the ranks compare their inputs with it) */
static uint64_t qk__hash(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = (const unsigned char *)p;
    size_t i;
    for (i = 0; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, c + i, 8);
        h = (h ^ v) * 0x100000001b3ull;
    }
    for (; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t qk__hash_map(const qk_map *m)
{
    uint64_t h = 0xcbf29ce484222325ull;
    int v[4], i;
    v[0] = (int)m->type; v[1] = m->n_qubits; v[2] = m->n_features; v[3] = m->n_ops;
    h = qk__hash(h, v, sizeof v);
    for (i = 0; i < m->n_ops; i++) {   /* field by field: struct padding is not data */
        const qk_op *o = &m->ops[i];
        int f[7];
        double g[2];
        f[0] = (int)o->kind; f[1] = o->q0; f[2] = o->q1; f[3] = (int)o->angle.kind;
        f[4] = o->angle.x0; f[5] = o->angle.x1; f[6] = o->angle.w;
        g[0] = o->angle.scale; g[1] = o->angle.offset;
        h = qk__hash(h, f, sizeof f);
        h = qk__hash(h, g, sizeof g);
    }
    if (m->n_weights > 0 && m->weights) h = qk__hash(h, m->weights, sizeof(double) * (size_t)m->n_weights);
    return h;
}

/* n rows of row_bytes bytes, stride bytes apart (given states: a row's padding is not data) */
static uint64_t qk__hash_rows(const void *x, int64_t n, size_t stride, size_t row_bytes)
{
    uint64_t h = 0xcbf29ce484222325ull;
    int64_t i;
    if (row_bytes == stride) return qk__hash(h, x, stride * (size_t)n);
    for (i = 0; i < n; i++) h = qk__hash(h, (const char *)x + (size_t)i * stride, row_bytes);
    return h;
}

/* A provider's rows on this rank (qk_gram_mpi_states): the hash of each row the provider gave
   (0: never asked for), A's n_a rows then B's. A row asked for again (another block) must hash
   the same; after the bands the ranks compare the rows more than one of them asked for. */
typedef struct qk__mpi_rows {
    uint64_t *h, *tmp;      /* n hashes; tmp: a piece of them for the comparison */
    int64_t n_a, n, piece;
    size_t row_bytes;       /* a row's elements, not its padding */
} qk__mpi_rows;

/* sm->rows_fn: each chunk the provider gave (checked), hashed row by row */
static qk_result qk__mpi_rows_seen(void *user, int side, int64_t row0, int64_t n, const void *rows, int64_t ld_bytes)
{
    qk__mpi_rows *t = (qk__mpi_rows *)user;
    int64_t i;
    for (i = 0; i < n; i++) {
        const int64_t k = (side ? t->n_a : 0) + row0 + i;
        uint64_t v = qk__hash(0xcbf29ce484222325ull, (const char *)rows + i * ld_bytes, t->row_bytes);
        if (v == 0) v = 1;
        if (t->h[k] == 0) t->h[k] = v;
        else if (t->h[k] != v)
            return qk__fail(QK_ERROR_BAD_DATA, "qk_gram_mpi_states: the state provider gave %s[%lld] twice, different each time (it "
                            "must give the same row for an index, to every request on every rank)", side ? "B" : "A", (long long)(row0 + i));
    }
    return QK_OK;
}

/* Collective, after every rank's band succeeded: the rows that several ranks asked for must be
   the same on each (the lowest and highest hash of each row over the ranks that asked for it).
   The same result on every rank (the reductions give every rank the same arrays). */
static qk_result qk__mpi_rows_agree(MPI_Comm comm, qk__mpi_rows *t)
{
    int64_t o, k;
    for (o = 0; o < t->n; o += t->piece) {
        const int64_t c = t->n - o < t->piece ? t->n - o : t->piece;
        for (k = 0; k < c; k++) t->tmp[k] = t->h[o + k] ? t->h[o + k] : UINT64_MAX;
        MPI_Allreduce(MPI_IN_PLACE, t->tmp, (int)c, MPI_UINT64_T, MPI_MIN, comm);
        MPI_Allreduce(MPI_IN_PLACE, t->h + o, (int)c, MPI_UINT64_T, MPI_MAX, comm);
        for (k = 0; k < c; k++)
            if (t->h[o + k] != 0 && t->tmp[k] != t->h[o + k]) {
                const int64_t row = o + k;
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_mpi_states: the ranks' state providers gave different rows for %s[%lld] "
                                "(a provider must give the same row for an index on every rank); nothing was written",
                                row >= t->n_a ? "B" : "A", (long long)(row >= t->n_a ? row - t->n_a : row));
            }
    }
    return QK_OK;
}

/* One rank's band of rows. */
typedef struct qk__mpi_band {
    qk__mpi *m;
    qk_ctx *ctx;
    const qk_map *map;
    qk__smap *sm;           /* given states (qk_gram_mpi_states), else NULL */
    const qk_gram_desc *desc;
    qk_dtype dt;
    size_t es;
    int64_t n, cols;        /* K is n x cols */
    int symmetric;
    MPI_File fh;            /* NPY: this rank's handle on the temporary file */
    const char *path;
    uint64_t hdr, written;
    uint64_t synced;        /* written bytes at the last periodic sync */
    int sync_often;         /* the writer thread syncs every mpi_sync_bytes (see above) */
    int64_t done, total;    /* this rank's entries of K, for the progress callback */
    int64_t scale;          /* entries per pair of the running sub-job (2: its mirror too) */
    int64_t di, dj;         /* the running sub-job's origin in K */
    int remote_stop;        /* another rank's failure notice, seen during a sub-job (qk__mpi_poll) */
    qk__thread caller;      /* the thread that called qk_gram_mpi (qk_gram's thread 0) */
    qk__mutex mpi_lock;     /* held by the writer thread while it is inside MPI */
} qk__mpi_band;

/* Inside a sub-job (from its progress polls): has another rank failed? Then the sub-job is
   cancelled, so that one rank's stop (a signal, an error) reaches every rank within a poll, not
   at the end of its block. Only the calling thread asks MPI, and only while the writer thread is
   outside MPI (MPI_THREAD_SERIALIZED: one thread in MPI at a time; FUNNELED / SINGLE: the main
   thread). */
static int qk__mpi_poll(qk__mpi_band *b)
{
    if (!qk__thread_is_self(b->caller)) return 0;
    if (b->remote_stop) return 1;
    if (!qk__mutex_trylock(&b->mpi_lock)) return 0;
    if (qk__mpi_remote_failed(b->m)) b->remote_stop = 1;
    qk__mutex_unlock(&b->mpi_lock);
    return b->remote_stop;
}

static int qk__mpi_progress(int64_t done, int64_t total, void *user)
{
    qk__mpi_band *b = (qk__mpi_band *)user;
    QK__UNUSED(total);
    if (qk__mpi_poll(b)) return 1;
    return b->desc->progress ? b->desc->progress(b->done + b->scale * done, b->total, b->desc->progress_user) : 0;
}

static int qk__mpi_tile(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *tile, int64_t ld, void *user)
{
    qk__mpi_band *b = (qk__mpi_band *)user;
    return b->desc->tile_fn(i0 + b->di, j0 + b->dj, m, n, tile, ld, b->desc->tile_user);
}

/* n bytes at offset off of the file (MPI counts are int: pieces of at most 1 GB). A short write
   (some bytes, not all: a write that straddles RLIMIT_FSIZE or fills the disk) is continued, as
   write(2) is; the next write then fails with the reason (EFBIG and SIGXFSZ, ENOSPC). */
static qk_result qk__mpi_write(qk__mpi_band *b, uint64_t off, const char *p, size_t n)
{
    while (n > 0) {
        int c = n > ((size_t)1 << 30) ? (1 << 30) : (int)n, got = 0, e, len = 0;
        char msg[MPI_MAX_ERROR_STRING + 1];
        MPI_Status st;
        e = MPI_File_write_at(b->fh, (MPI_Offset)off, p, c, MPI_BYTE, &st);
        if (e == MPI_SUCCESS) MPI_Get_count(&st, MPI_BYTE, &got);
        if (e == MPI_SUCCESS && got > 0 && got < c) c = got;   /* short: the rest on the next pass */
        else if (e != MPI_SUCCESS || got != c) {
            if (e != MPI_SUCCESS) MPI_Error_string(e, msg, &len);
            else len = snprintf(msg, sizeof msg, "%d of %d bytes written", got, c);
            msg[len < 0 ? 0 : len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len] = 0;
            return qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_write_at of %.3g MB at byte %llu failed: %s",
                            b->path, (double)c * 1e-6, (unsigned long long)off, msg);
        }
        off += (uint64_t)c;
        p += c;
        n -= (size_t)c;
        b->written += (uint64_t)c;
    }
    return QK_OK;
}

/* K[di .. di + nx) x [dj .. dj + ny) with qk_gram, of rows X[di ..] and Y[dj ..] (Y is X for
   symmetric K); ny 0: the symmetric K(X[di .. di + nx)); into out (ld) for NPY, else through the
   caller's tile callback. scale: entries of K per computed pair. A provider's tags are pointed
   at the two blocks of rows (qk__smap: side and first row); device states are offset in place. */
static qk_result qk__mpi_sub(qk__mpi_band *b, int64_t di, int64_t nx, int64_t dj, int64_t ny, void *out, int64_t ld, int64_t scale)
{
    const double *X = b->desc->x, *Y = b->desc->y ? b->desc->y : b->desc->x;
    const int64_t d = b->map->n_features;
    qk__smap *sm = b->sm;
    qk_gram_desc g;
    qk_result r;
    memset(&g, 0, sizeof g);
    if (sm && (sm->op.q1 & QK__STATE_PROVIDER)) {
        sm->tag_side[0] = 0;
        sm->tag_row0[0] = di;
        sm->tag_side[1] = b->symmetric ? 0 : 1;
        sm->tag_row0[1] = dj;
        g.x = (const double *)(const void *)&sm->side[0];
        g.y = ny ? (const double *)(const void *)&sm->side[1] : NULL;
    } else {
        g.x = X + di * d;
        g.y = ny ? Y + dj * d : NULL;
    }
    /* the caller's split over the rank's GPUs (a provider's desc keeps one GPU: qk__smap_make) */
    g.mgpu_min_pairs = b->desc->mgpu_min_pairs;
    g.mgpu_host_bound_split = b->desc->mgpu_host_bound_split;
    g.n_x = nx;
    g.n_y = ny;
    g.precision = b->desc->precision;
    g.path = b->desc->path;
    g.out_dtype = b->dt;
    if (b->desc->output == QK_OUTPUT_NPY) {
        g.output = QK_OUTPUT_HOST;
        g.out = out;
        g.ld_out = ld;
    } else {
        g.output = QK_OUTPUT_CALLBACK;
        g.tile_fn = qk__mpi_tile;
        g.tile_user = b;
    }
    g.progress = qk__mpi_progress;   /* the caller's, and the look for another rank's failure */
    g.progress_user = b;
    b->scale = scale;
    b->di = di;
    b->dj = ny ? dj : di;
    r = qk_gram(b->ctx, b->map, &g);
    b->done += scale * nx * (ny ? ny : nx);
    if (r != QK_OK && sm && sm->provider_failed) return r;   /* the provider's failure, or its bad rows (detail set) */
    if (r == QK_ERROR_CANCELLED && b->remote_stop) return r;   /* not this rank's failure */
    if (r == QK_ERROR_CANCELLED)   /* qk_gram's detail speaks of its own output, a block here */
        return qk__fail(r, "qk_gram_mpi: cancelled by a %s callback after %lld of this rank's %lld entries of K%s%s%s",
                        b->desc->output == QK_OUTPUT_NPY ? "progress" : "progress or tile", (long long)b->done, (long long)b->total,
                        b->desc->output == QK_OUTPUT_NPY ? "; '" : "", b->desc->output == QK_OUTPUT_NPY ? b->path : "",
                        b->desc->output == QK_OUTPUT_NPY ? "' was not written" : "");
    return r;
}

/* One computed block, K[a .. a + h)[c0 .. c0 + w) in U (ld w), to the file: its rows, and for
   symmetric K off the diagonal its mirror K[c][a .. a + h) for c in [c0, c0 + w), transposed
   through tb 64 rows of K at a time. */
typedef struct qk__mpi_block {
    qk__mpi_band *b;
    const char *U;
    char *tb;
    int64_t a, h, c0, w;
    int mirror;
    qk_result r;
    char err[sizeof qk__errbuf];
} qk__mpi_block;

static void *qk__mpi_block_write(void *p)
{
    qk__mpi_block *s = (qk__mpi_block *)p;
    qk__mpi_band *b = s->b;
    const int64_t n = b->cols, a = s->a, h = s->h, c0 = s->c0, w = s->w;
    const size_t es = b->es;
    int64_t i, c, k;
    qk_result r = QK_OK;
    qk__mutex_lock(&b->mpi_lock);
    QK_PROF_BEGIN("mpi write");
    if (c0 == 0 && w == n) r = qk__mpi_write(b, b->hdr + (uint64_t)a * (uint64_t)n * es, s->U, (size_t)(h * w) * es);
    else
        for (i = 0; i < h && r == QK_OK; i++)
            r = qk__mpi_write(b, b->hdr + ((uint64_t)(a + i) * (uint64_t)n + (uint64_t)c0) * es, s->U + (size_t)(i * w) * es, (size_t)w * es);
    for (k = 0; s->mirror && k < w && r == QK_OK; k += 64) {
        int64_t nc = w - k < 64 ? w - k : 64;
        for (i = 0; i < h; i++)
            for (c = 0; c < nc; c++)
                memcpy(s->tb + (size_t)(c * h + i) * es, s->U + (size_t)(i * w + k + c) * es, es);
        for (c = 0; c < nc && r == QK_OK; c++)
            r = qk__mpi_write(b, b->hdr + ((uint64_t)(c0 + k + c) * (uint64_t)n + (uint64_t)a) * es, s->tb + (size_t)(c * h) * es, (size_t)h * es);
    }
    if (r == QK_OK && b->sync_often && b->written - b->synced >= (b->desc->mpi_sync_bytes ? (uint64_t)b->desc->mpi_sync_bytes : QK__MPI_SYNC_BYTES)) {
        if (MPI_File_sync(b->fh) != MPI_SUCCESS) r = qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_sync failed", b->path);
        b->synced = b->written;
    }
    QK_PROF_END("mpi write");
    qk__mutex_unlock(&b->mpi_lock);
    s->r = r;
    if (r != QK_OK) snprintf(s->err, sizeof s->err, "%s", qk__errbuf);   /* the detail is thread-local */
    return NULL;
}

/* Rows [r0, r1) of K in blocks of at most mpi_block_bytes (QK_MPI_BLOCK_BYTES): rows in slabs of S, each slab's
   columns (from its diagonal for symmetric K) in chunks of C, S and C about the square root of
   the budget so that the file writes of a block's rows (C elements) and of its mirror (S
   elements) are both long, and each block builds only S + C states. The diagonal block of a
   slab is a symmetric sub-job. NPY: two block buffers; a writer thread writes block k while the
   engine computes block k + 1, when MPI allows MPI-IO from a second thread (the library provides
   MPI_THREAD_SERIALIZED or more: only one of the two threads is ever inside MPI, as the failure
   check between blocks runs after the writer is joined); else each block is written before the
   next is computed. Another rank's failure notice stops it (returning QK_OK: that rank's result
   is the job's). A provider's rows (qk_gram_mpi_states): each slab's rows are asked for once, at
   the slab's start, and kept for its blocks (sm->cache), where a slab's rows fit the same budget
   (S rows of the states' stored row, at most mpi_block_bytes more per rank); else, and for the
   blocks' column rows, each block asks for its rows. */
static qk_result qk__mpi_run_band(qk__mpi_band *b, int64_t r0, int64_t r1)
{
    const int npy = b->desc->output == QK_OUTPUT_NPY;
    const int64_t cols = b->cols;
    const size_t es = b->es, budget = b->desc->mpi_block_bytes ? b->desc->mpi_block_bytes : (size_t)(QK_MPI_BLOCK_BYTES);
    qk__smap *sm = b->sm && (b->sm->op.q1 & QK__STATE_PROVIDER) ? b->sm : NULL;
    int64_t S, C, a, bnd, c0, k = 0;
    char *U[2] = {NULL, NULL}, *tb = NULL, *cache = NULL;
    qk__mpi_block sw;
    qk_result r = QK_OK;
    int threaded = 0, pending = 0, level = MPI_THREAD_SINGLE, stop = 0;
    qk__thread wt;
    MPI_Query_thread(&level);
    threaded = QK__THREADS && level >= MPI_THREAD_SERIALIZED;
    b->sync_often = threaded && npy && !b->desc->no_sync;
    memset(&sw, 0, sizeof sw);
    if (r1 <= r0) return QK_OK;
    S = (int64_t)sqrt((double)(budget / es));
    if (S >= 64) S = S / 64 * 64;        /* whole tiles of the CPU engine */
    if (S < 1) S = 1;
    if (S > r1 - r0) S = r1 - r0;
    C = (int64_t)(budget / es) / S;
    if (C >= 64) C = C / 64 * 64;
    if (C < S) C = S;                    /* the symmetric diagonal block fits */
    if (C > cols) C = cols;
    for (b->total = 0, a = r0; a < r1; a = bnd) {
        int64_t h;
        bnd = r1 - a < S ? r1 : a + S;
        h = bnd - a;
        b->total += b->symmetric ? h * h + 2 * h * (cols - bnd) : h * cols;
    }
    if (npy) {
        U[0] = (char *)qk__malloc((size_t)S * (size_t)C * es);
        U[1] = threaded ? (char *)qk__malloc((size_t)S * (size_t)C * es) : U[0];
        tb = b->symmetric ? (char *)qk__malloc((size_t)S * 64 * es) : NULL;
        if (!U[0] || !U[1] || (b->symmetric && !tb)) {
            r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_mpi: cannot allocate %d blocks of %lld x %lld (mpi_block_bytes, QK_MPI_BLOCK_BYTES)", threaded ? 2 : 1, (long long)S, (long long)C);
            goto done;
        }
    }
    /* a slab's provider rows, kept for its blocks where they fit the budget (an allocation that
       fails only means that each block asks for its rows) */
    if (sm && (double)S * (double)sm->map.n_features * 8.0 <= (double)budget)
        cache = (char *)qk__malloc((size_t)S * (size_t)sm->map.n_features * 8);
    for (a = r0; a < r1 && !stop; a = bnd) {
        int64_t h, i;
        bnd = r1 - a < S ? r1 : a + S;
        h = bnd - a;
        if (cache) {   /* the slab's rows, asked for once (in the provider's chunks) */
            sm->cache = NULL;
            if (!pending && qk__mpi_remote_failed(b->m)) { stop = 1; break; }
            for (i = 0; i < h && r == QK_OK; i += sm->chunk)
                r = qk__smap_fetch(sm, 0, a + i, h - i < sm->chunk ? h - i : sm->chunk, cache + (size_t)i * (size_t)sm->map.n_features * 8);
            if (r != QK_OK) { stop = 1; break; }
            sm->cache = cache;
            sm->cache_side = 0;
            sm->cache_row0 = a;
            sm->cache_n = h;
        }
        /* the slab's blocks: the diagonal one (symmetric K), then column chunks */
        for (c0 = b->symmetric ? a : 0; c0 < cols && !stop; k++) {
            char *u = U[k & 1];
            const int diag = b->symmetric && c0 == a;
            const int64_t w = diag ? h : (cols - c0 < C ? cols - c0 : C);
            if (!pending && qk__mpi_remote_failed(b->m)) { stop = 1; break; }
            QK_PROF_BEGIN("mpi block");
            if (diag) r = qk__mpi_sub(b, a, h, a, 0, u, w, 1);
            else r = qk__mpi_sub(b, a, h, c0, w, u, w, b->symmetric ? 2 : 1);
            QK_PROF_END("mpi block");
            if (pending) {   /* the previous block's writer */
                qk__thread_join(wt);
                pending = 0;
                if (sw.r != QK_OK) { r = qk__fail(sw.r, "%s", sw.err); stop = 1; break; }
            }
            if (r == QK_ERROR_CANCELLED && b->remote_stop) { r = QK_OK; stop = 1; break; }   /* that rank's result is the job's */
            if (r != QK_OK) { stop = 1; break; }
            if (npy) {
                if (qk__mpi_remote_failed(b->m)) { stop = 1; break; }
                sw.b = b; sw.U = u; sw.tb = tb; sw.a = a; sw.h = h; sw.c0 = c0; sw.w = w;
                sw.mirror = b->symmetric && !diag;
                sw.r = QK_OK;
                if (threaded && qk__thread_start(&wt, qk__mpi_block_write, &sw)) pending = 1;
                else {
                    qk__mpi_block_write(&sw);
                    if (sw.r != QK_OK) { r = qk__fail(sw.r, "%s", sw.err); stop = 1; break; }
                }
            }
            c0 += w;
        }
    }
    if (pending) {
        qk__thread_join(wt);
        if (sw.r != QK_OK && r == QK_OK) r = qk__fail(sw.r, "%s", sw.err);
    }
done:
    if (sm) sm->cache = NULL;
    QK_FREE(cache);
    if (U[1] != U[0]) QK_FREE(U[1]);
    QK_FREE(U[0]);
    QK_FREE(tb);
    return r;
}

/* qk_gram_mpi's sink, the .npy written with MPI-IO: the temporary file, its rename and its
   removal are qk_gram's (qk__open_tmp, qk__tmp_commit, qk__tmp_discard), on rank 0; every rank
   writes through its own MPI handle. Collective: every rank calls open and close. */
typedef struct qk__mpi_sink {
    char *tmp;              /* the temporary's name (every rank) */
    MPI_File fh;            /* this rank's handle */
    int opened;
} qk__mpi_sink;

/* Rank 0 creates the temporary file, every rank opens it, rank 0 writes the header. Returns the
   ranks' agreed result (qk__mpi_decide). */
static qk_result qk__mpi_sink_open(qk__mpi *m, qk__mpi_band *b, qk__mpi_sink *s)
{
    const qk_gram_desc *desc = b->desc;
    size_t nbytes = 0;
    int len = 0;
    char hdr[192];
    qk_result r = QK_OK, rc;
    if (m->rank == 0) {
        int fd = -1;
        r = qk__npy_shape_bytes("qk_gram_mpi", b->dt, b->n, b->cols, &nbytes);
        if (r == QK_OK && sizeof(MPI_Offset) < 8) r = qk__fail(QK_ERROR_UNSUPPORTED, "qk_gram_mpi: MPI_Offset is narrower than 64 bits");
        if (r == QK_OK) r = qk__open_tmp(desc->out_path, &s->tmp, &fd);
        if (fd >= 0) (void)QK__CLOSE(fd);
        if (s->tmp) len = (int)strlen(s->tmp);
    }
    rc = qk__mpi_decide(m, r);
    if (rc != QK_OK) return rc;
    MPI_Bcast(&len, 1, MPI_INT, 0, m->comm);
    if (m->rank != 0) {
        s->tmp = (char *)qk__malloc((size_t)len + 1);
        r = s->tmp ? QK_OK : qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_mpi: out of memory");
    }
    rc = qk__mpi_decide(m, r);
    if (rc != QK_OK) return rc;
    MPI_Bcast(s->tmp, len + 1, MPI_CHAR, 0, m->comm);
    {
        int e = MPI_File_open(MPI_COMM_SELF, s->tmp, MPI_MODE_WRONLY, MPI_INFO_NULL, &s->fh), elen = 0;
        char msg[MPI_MAX_ERROR_STRING + 1];
        if (e == MPI_SUCCESS) s->opened = 1;
        else {
            MPI_Error_string(e, msg, &elen);
            msg[elen < 0 ? 0 : elen > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : elen] = 0;
            r = qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_open of '%s' failed: %s (is the directory on a file system all ranks see?)",
                         desc->out_path, s->tmp, msg);
        }
    }
    b->fh = s->fh;
    b->hdr = (uint64_t)qk__npy_make_header(hdr, b->dt, b->n, b->cols);
    if (r == QK_OK && m->rank == 0) r = qk__mpi_write(b, 0, hdr, (size_t)b->hdr);
    return qk__mpi_decide(m, r);
}

/* After the bands (rc: the ranks' agreed result): sync (unless no_sync), close, check that every
   byte came, rename on rank 0. The temporary is removed by the caller when the result is not
   QK_OK. Returns the ranks' agreed result. */
static qk_result qk__mpi_sink_close(qk__mpi *m, qk__mpi_band *b, qk__mpi_sink *s, qk_result rc)
{
    const qk_gram_desc *desc = b->desc;
    uint64_t all = 0;
    qk_result r = QK_OK;
    if (rc == QK_OK && !desc->no_sync && MPI_File_sync(s->fh) != MPI_SUCCESS)
        r = qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_sync failed", desc->out_path);
    if (MPI_File_close(&s->fh) != MPI_SUCCESS && r == QK_OK)
        r = qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_close failed", desc->out_path);
    s->opened = 0;
    if (rc == QK_OK) {
        MPI_Allreduce(&b->written, &all, 1, MPI_UINT64_T, MPI_SUM, m->comm);
        if (r == QK_OK && m->rank == 0 && all != b->hdr + (uint64_t)b->n * (uint64_t)b->cols * b->es)
            r = qk__fail(QK_ERROR_IO, "cannot write '%s': %llu of %llu bytes were written (internal error)", desc->out_path,
                         (unsigned long long)all, (unsigned long long)(b->hdr + (uint64_t)b->n * (uint64_t)b->cols * b->es));
        rc = qk__mpi_decide(m, r);
    }
    if (rc == QK_OK) {
        r = m->rank == 0 ? qk__tmp_commit(s->tmp, desc->out_path, desc->no_sync) : QK_OK;
        rc = qk__mpi_decide(m, r);
    }
    return rc;
}

/* qk_gram_mpi and qk_gram_mpi_states. fn: the entry point's name for its messages. pre: the
   result of what the entry point did alone before (qk_gram_mpi_states: its states' map made and
   checked), decided with the ranks' first check, so that a failure there is every rank's (when
   pre is not QK_OK, map and desc are not read). sm: given states (NULL for a map): host rows
   are compared across ranks without their padding; a provider's rows as they come (each rank
   hashes the rows it was given, and the ranks compare the rows several asked for before the
   file is committed); device rows by dev_hash (their checksums on each rank's device). */
static qk_result qk__gram_mpi(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, MPI_Comm comm, const char *fn, qk_result pre,
                              qk__smap *sm, const uint64_t *dev_hash)
{
    static const char *sig_names[2][11] = {{"n_x", "n_y (K(X,X) or K(X,Y))", "the map's feature count", "output",
                                            "out_dtype", "precision", "no_sync", "the map", "the data X",
                                            "the data Y", "out_path"},
                                           {"n_a", "n_b (K(A,A) or K(A,B))", "the states' dim and type", "output",
                                            "out_dtype", "precision", "no_sync", "the states' type, dim, kind or normalize",
                                            "the states A", "the states B", "out_path"}};
    qk__mpi m;
    qk__mpi_band b;
    qk_schedule sch;
    qk_schedule_desc sd;
    qk_result r = QK_OK, rc;
    qk__mpi_sink snk;
    qk__mpi_rows rows;
    const int provider = sm && (sm->op.q1 & QK__STATE_PROVIDER);
    int inited = 0, finalized = 0, k, npy;
    int64_t sig[11], lo[11], hi[11];

    if (comm == MPI_COMM_NULL) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: comm is MPI_COMM_NULL", fn);
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: MPI is %s", fn, finalized ? "finalized" : "not initialized (call MPI_Init first)");
    memset(&m, 0, sizeof m);
    memset(&b, 0, sizeof b);
    memset(&sch, 0, sizeof sch);
    memset(&snk, 0, sizeof snk);
    memset(&rows, 0, sizeof rows);
    snk.fh = MPI_FILE_NULL;
    MPI_Comm_dup(comm, &m.comm);
    MPI_Comm_rank(m.comm, &m.rank);
    MPI_Comm_size(m.comm, &m.size);
    m.reqs = (MPI_Request *)qk__malloc(sizeof(MPI_Request) * (size_t)m.size);

    /* 1. every rank checks the request (data included) */
    if (pre != QK_OK) r = pre;   /* its detail is still the one set */
    else if (!m.reqs) r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory", fn);
    else if (provider) {   /* a hash of each row the provider gives (qk__mpi_rows) */
        rows.n_a = sm->in.n_a;
        rows.n = sm->in.n_a + (desc->y ? sm->in.n_b : 0);
        rows.piece = rows.n < ((int64_t)1 << 22) ? rows.n : ((int64_t)1 << 22);
        rows.row_bytes = qk__state_row_bytes(&sm->op);
        rows.h = (uint64_t *)qk__calloc((size_t)rows.n, sizeof(uint64_t));
        rows.tmp = (uint64_t *)qk__malloc(sizeof(uint64_t) * (size_t)rows.piece);
        if (!rows.h || !rows.tmp) r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: cannot allocate the hashes of %lld provider rows", fn, (long long)rows.n);
        sm->rows_fn = qk__mpi_rows_seen;
        sm->rows_user = &rows;
    }
    if (r == QK_OK) r = qk__check_gram(ctx, map, desc);
    if (r == QK_OK && desc->output != QK_OUTPUT_NPY && desc->output != QK_OUTPUT_CALLBACK)
        r = qk__fail(QK_ERROR_UNSUPPORTED, "%s: output %s is not supported across ranks (use QK_OUTPUT_NPY or QK_OUTPUT_CALLBACK)",
                     fn, desc->output == QK_OUTPUT_DEVICE ? "DEVICE" : "HOST");
    rc = qk__mpi_decide(&m, r);
    if (rc != QK_OK) goto done;

    /* 2. the ranks agree on the job (else every rank fails the same way: no collective needed) */
    npy = desc->output == QK_OUTPUT_NPY;
    b.dt = desc->out_dtype ? desc->out_dtype
         : (qk__prec_f32(desc->precision) ||
            ((desc->precision == QK_PRECISION_DEFAULT || desc->precision == QK_PRECISION_AUTO) && qk_ctx_query(ctx).device == QK_DEVICE_CUDA &&
             qk__auto_precision(map, qk__path_of(map), desc->tol, 0, NULL, 0) != QK_PRECISION_FP64)) ? QK_F32 : QK_F64;
    sig[0] = desc->n_x;
    sig[1] = desc->y ? desc->n_y : -1;
    sig[2] = map->n_features;
    sig[3] = (int64_t)desc->output;
    sig[4] = (int64_t)b.dt;
    sig[5] = (int64_t)desc->precision;
    sig[6] = npy ? desc->no_sync != 0 : 0;
    {
        uint64_t h[4];
        h[0] = qk__hash_map(map);
        const size_t stride = sizeof(double) * (size_t)map->n_features;
        /* a given state's row: its elements (dim, or dim^2 for density matrices), not the padding */
        const size_t row = sm ? qk__state_row_bytes(&sm->op) : stride;
        if (provider) h[1] = h[2] = 0;   /* rows not yet given: compared as they come (qk__mpi_rows_agree) */
        else if (dev_hash) {
            h[1] = dev_hash[0];
            h[2] = desc->y ? dev_hash[1] : 0;
        } else {
            h[1] = qk__hash_rows(desc->x, desc->n_x, stride, row);
            h[2] = desc->y ? qk__hash_rows(desc->y, desc->n_y, stride, row) : 0;
        }
        h[3] = npy ? qk__hash(0xcbf29ce484222325ull, desc->out_path, strlen(desc->out_path)) : 0;
        for (k = 0; k < 4; k++) sig[7 + k] = (int64_t)(h[k] >> 1);   /* non-negative, 63 bits */
    }
    MPI_Allreduce(sig, lo, 11, MPI_INT64_T, MPI_MIN, m.comm);
    MPI_Allreduce(sig, hi, 11, MPI_INT64_T, MPI_MAX, m.comm);
    for (k = 0; k < 11; k++)
        if (lo[k] != hi[k]) {
            rc = qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: the ranks disagree on %s (every rank passes the same %s and desc%s)", fn,
                          sig_names[sm != NULL][k], sm ? "states" : "map, X, Y", k == 4 ? "; set out_dtype when the ranks run different engines" : "");
            goto done;
        }

    /* 3. the rows of this rank */
    memset(&sd, 0, sizeof sd);
    sd.n_x = desc->n_x;
    sd.n_y = desc->y ? desc->n_y : 0;
    sd.n_workers = m.size;
    r = qk_schedule_make(&sd, &sch);
    rc = qk__mpi_decide(&m, r);
    if (rc != QK_OK) goto done;
    b.m = &m;
    b.ctx = ctx;
    b.map = map;
    b.sm = sm;
    b.desc = desc;
    b.es = b.dt == QK_F32 ? 4 : 8;
    b.n = desc->n_x;
    b.cols = desc->y ? desc->n_y : desc->n_x;
    b.symmetric = desc->y == NULL;
    b.path = npy ? desc->out_path : NULL;

    /* 4. NPY: the sink (rank 0 creates the temporary file; every rank opens it on its own handle) */
    if (npy) {
        rc = qk__mpi_sink_open(&m, &b, &snk);
        if (rc != QK_OK) goto done;
    }

    /* 5. compute and write this rank's band */
    b.caller = qk__thread_self();
    (void)qk__mutex_init(&b.mpi_lock);
    r = qk__mpi_run_band(&b, sch.row0[m.rank], sch.row0[m.rank + 1]);
    qk__mutex_destroy(&b.mpi_lock);
    if (r != QK_OK) qk__mpi_announce(&m, r);
    /* this rank failed (a cancel, an error): the job fails, so the temporary file goes now, not
       after the collective below, which never ends where another rank was killed (mpirun then
       terminates this process too: SIGTERM, the caller's progress callback cancels, and here) */
    if (r != QK_OK && snk.tmp) qk__tmp_discard(snk.tmp);
    rc = qk__mpi_decide(&m, r);
    /* a provider: the rows several ranks (or blocks) were given are the same everywhere, before
       the file is committed (the same result on every rank) */
    if (rc == QK_OK && provider) rc = qk__mpi_rows_agree(m.comm, &rows);

    /* 6. NPY: sync, close, check that every byte came, rename on rank 0 */
    if (npy) rc = qk__mpi_sink_close(&m, &b, &snk, rc);
done:
    if (snk.opened) MPI_File_close(&snk.fh);
    if (rc != QK_OK && snk.tmp && m.rank == 0) qk__tmp_discard(snk.tmp);
    QK_FREE(snk.tmp);
    QK_FREE(rows.h);
    QK_FREE(rows.tmp);
    if (sm) {
        sm->rows_fn = NULL;
        sm->rows_user = NULL;
    }
    qk_schedule_free(&sch);
    if (m.comm != MPI_COMM_NULL) MPI_Comm_free(&m.comm);
    QK_FREE(m.reqs);
    return rc;
}

QKDEF qk_result qk_gram_mpi(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, MPI_Comm comm)
{
    return qk__gram_mpi(ctx, map, desc, comm, "qk_gram_mpi", QK_OK, NULL, NULL);
}

#if defined(QK_CUDA) && QK_CUDA
/* Device states: a checksum of each side's rows (their elements, not the padding) on this rank's
   device, which the ranks compare as they compare host rows; the states are not copied. */
static qk_result qk__mpi_device_hash(qk_ctx *ctx, const qk__smap *sm, uint64_t h[2])
{
    const int64_t row_bytes = (int64_t)qk__state_row_bytes(&sm->op);
    char err[256] = "";
    qk_result r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
    h[0] = h[1] = 0;
    if (r == QK_OK) r = qk_cuda_state_hash(sm->in.a, sm->in.n_a, sm->map.n_features, row_bytes, &h[0], err, sizeof err);
    if (r == QK_OK && sm->in.b) r = qk_cuda_state_hash(sm->in.b, sm->in.n_b, sm->map.n_features, row_bytes, &h[1], err, sizeof err);
    return r == QK_OK ? QK_OK : qk__fail(r, "%s: the device states' checksum: %s", sm->fn, err);
}
#endif

/* Given states: their map (qk__smap_make, as qk_gram_states makes it), run as a map's Gram is.
   Host rows are read in place or packed, and checked on every rank in the first phase; a
   provider's rows are asked for block by block (the tags of qk__smap point at each sub-job's
   rows) and checked as they come; device rows are read in place by each rank's GPU engine,
   checked on the device (qk__smap_make) and compared across ranks by a checksum computed there. */
QKDEF qk_result qk_gram_mpi_states(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, MPI_Comm comm)
{
    qk__smap sm;
    qk_gram_desc g;
    qk_result r;
    uint64_t dh[2] = {0, 0};
    int dev = 0;
    memset(&sm, 0, sizeof sm);
    memset(&g, 0, sizeof g);
    r = qk__smap_make(ctx, states, desc, "qk_gram_mpi_states", &sm, &g);
#if defined(QK_CUDA) && QK_CUDA
    if (r == QK_OK && sm.in.on_device) {
        /* a rank's blocks run on its context's GPUs as one process's job does: the first reads
           the states in place, the others copy their rows from it (qk__map_for_device) */
        dev = 1;
        r = qk__mpi_device_hash(ctx, &sm, dh);
    }
#endif
    r = qk__gram_mpi(ctx, &sm.map, &g, comm, "qk_gram_mpi_states", r, &sm, dev ? dh : NULL);
    qk__smap_free(&sm);
    return r;
}
#endif /* QK_MPI */
/* ---- end work schedule and MPI ---- */

