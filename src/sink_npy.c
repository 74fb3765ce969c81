#include "qk_internal.h"
/* >>npy_stream ---- the streaming .npy writer ---- */
/* K goes into its .npy file while it is computed (QK_OUTPUT_NPY): the file is created as a
   temporary next to the target (qk__open_tmp), rows and row segments are written at their
   offsets as the engines deliver them, and qk__npyw_commit syncs and renames. A syncer thread
   runs fsync whenever QK__NPYW_SYNC_BYTES more have been written, so that the disk writes back
   while the engines compute (the kernel's own writeback starts only at dirty_background_ratio,
   10% of RAM: on a 128 GB machine a 6 GB K would otherwise be written back only by the final
   sync, after the compute). qk__npyw_abort removes the temporary file; the target is never
   touched before the rename. The writer waits while more than QK__NPYW_MAX_DIRTY bytes are
   written but not yet synced: the page cache then never holds more than that of K, a sync in
   flight is short (a cancel stops within a fraction of a second: the abort truncates the file,
   which waits for pages under writeback), and the final sync has little left. One thread
   writes (lseek + write: POSIX.1, declared under strict -std=c99 too). */
#define QK__NPYW_SYNC_BYTES ((uint64_t)16 << 20)
#define QK__NPYW_MAX_DIRTY ((uint64_t)64 << 20)

/* qk__npyw: in qk_internal.h (the engines stream into it) */

static void *qk__npyw_syncer(void *p)
{
    qk__npyw *w = (qk__npyw *)p;
    qk__mutex_lock(&w->mu);
    for (;;) {
        uint64_t upto;
        while (!w->stop && w->dirty < QK__NPYW_SYNC_BYTES) qk__cond_wait(&w->cv, &w->mu);
        if (w->stop) break;
        w->dirty = 0;
        upto = w->written_mt;
        qk__mutex_unlock(&w->mu);
        if (QK__FSYNC(w->fd) != 0 && !w->sync_errno) w->sync_errno = errno;
        qk__mutex_lock(&w->mu);
        w->synced = upto;
        qk__cond_broadcast(&w->cv);
    }
    qk__mutex_unlock(&w->mu);
    return NULL;
}

static void qk__npyw_stop_syncer(qk__npyw *w)
{
    if (!w->syncer_on) return;
    qk__mutex_lock(&w->mu);
    w->stop = 1;
    qk__cond_signal(&w->cv);
    qk__mutex_unlock(&w->mu);
    qk__thread_join(w->syncer);
    qk__cond_destroy(&w->cv);
    qk__mutex_destroy(&w->mu);
    w->syncer_on = 0;
}

/* Removes the temporary file; the target stays as it was. Safe on a zeroed or failed writer.
   The file is first truncated (its dirty pages dropped), so that a sync in flight, and the
   abort, take milliseconds rather than the time to write back what was written. */
QK__PRIV void qk__npyw_abort(qk__npyw *w)
{
    if (w->tmp) {
        int t = open(w->tmp, O_WRONLY | O_TRUNC);
        if (t >= 0) (void)QK__CLOSE(t);
    }
    qk__npyw_stop_syncer(w);
    if (w->fd >= 0) (void)QK__CLOSE(w->fd);
    w->fd = -1;
    if (w->tmp) { qk__tmp_discard(w->tmp); QK_FREE(w->tmp); w->tmp = NULL; }
}

/* syncer: 1 runs the syncer thread (sequential writes: the GPU engine's row slabs); 0 syncs at
   commit only (the CPU engine's symmetric mirror is scattered strips: written back while the
   job runs they would be random I/O in flight, which a cancel must wait for). */
QK__PRIV qk_result qk__npyw_open(qk__npyw *w, const char *path, qk_dtype dt, int64_t rows, int64_t cols, int no_sync,
                                 int syncer)
{
    char hdr[192];
    size_t nbytes = 0;
    qk_result r;
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (!path || !path[0]) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: output NPY needs out_path");
#ifdef _WIN32
    return qk__fail(QK_ERROR_UNSUPPORTED, "qk_gram: output NPY is POSIX only in this version");
#else
    r = qk__npy_shape_bytes("qk_gram", dt, rows, cols, &nbytes);
    if (r != QK_OK) return r;
    if (sizeof(off_t) < 8 && nbytes > ((size_t)1 << 30))
        return qk__fail(QK_ERROR_UNSUPPORTED, "qk_gram: K of %.3g GB needs 64-bit file offsets (build with -D_FILE_OFFSET_BITS=64)", (double)nbytes * 1e-9);
    w->path = path;
    w->es = dt == QK_F32 ? 4 : 8;
    w->rows = rows;
    w->cols = cols;
    w->no_sync = no_sync;
    w->hdr = qk__npy_make_header(hdr, dt, rows, cols);
    QK__UNUSED(syncer);
    r = qk__open_tmp(path, &w->tmp, &w->fd);
    if (r != QK_OK) return r;
    if (qk__write_all(w->fd, hdr, w->hdr) != 0) {
        r = qk__fail(QK_ERROR_IO, "cannot write '%s': %s", path, strerror(errno));
        qk__npyw_abort(w);
        return r;
    }
    if (!no_sync && syncer && qk__mutex_init(&w->mu) == 0) {
        if (qk__cond_init(&w->cv) == 0) {
            if (qk__thread_start(&w->syncer, qk__npyw_syncer, w)) w->syncer_on = 1;
            else qk__cond_destroy(&w->cv);
        }
        if (!w->syncer_on) qk__mutex_destroy(&w->mu);
    }
    return QK_OK;
#endif
}

/* n bytes of K's data at byte offset off (from the start of the data), through fd: w->fd, or
   (several GPUs) a thread's own descriptor of the temporary file (its own file offset); the
   byte counts are then shared: w->written is added atomically, the syncer's under w->mu. */
QK__PRIV qk_result qk__npyw_at_fd(qk__npyw *w, int fd, uint64_t off, const void *buf, size_t n)
{
    if (w->cancel && QK__LOAD(w->cancel)) return qk__fail(QK_ERROR_CANCELLED, "cancelled");
    if (lseek(fd, (off_t)(w->hdr + off), SEEK_SET) < 0 || qk__write_all(fd, buf, n) != 0) {
        int e = errno;
        return qk__fail(QK_ERROR_IO, "cannot write '%s': writing %.3g MB at byte %llu failed: %s%s", w->path,
                        (double)n * 1e-6, (unsigned long long)(w->hdr + off), strerror(e),
                        e == ENOSPC ? " (the file system is full; nothing was left behind)" : "");
    }
    (void)QK__FETCH_ADD(&w->written, (uint64_t)n);
    if (w->syncer_on) {
        qk__mutex_lock(&w->mu);
        w->dirty += n;
        w->written_mt += n;
        if (w->dirty >= QK__NPYW_SYNC_BYTES) qk__cond_broadcast(&w->cv);
        /* backpressure: at most QK__NPYW_MAX_DIRTY unsynced (woken after each fsync) */
        while (w->written_mt - w->synced > QK__NPYW_MAX_DIRTY && !w->sync_errno && !(w->cancel && QK__LOAD(w->cancel)))
            qk__cond_wait(&w->cv, &w->mu);
        qk__mutex_unlock(&w->mu);
    }
    return QK_OK;
}

QK__PRIV qk_result qk__npyw_at(qk__npyw *w, uint64_t off, const void *buf, size_t n)
{
    return qk__npyw_at_fd(w, w->fd, off, buf, n);
}

/* K[i0 + a][j0 .. j0 + n) = src[a * ld ..] for a < m (elements of the output dtype). */
QK__PRIV qk_result qk__npyw_rows(qk__npyw *w, int64_t i0, int64_t j0, int64_t m, int64_t n, const void *src, int64_t ld)
{
    const char *p = (const char *)src;
    int64_t a;
    QK_ASSERT(i0 >= 0 && j0 >= 0 && i0 + m <= w->rows && j0 + n <= w->cols && ld >= n); /* inside K */
    if (j0 == 0 && n == w->cols && ld == w->cols)
        return qk__npyw_at(w, (uint64_t)i0 * (uint64_t)w->cols * w->es, p, (size_t)(m * n) * w->es);
    for (a = 0; a < m; a++) {
        qk_result r = qk__npyw_at(w, ((uint64_t)(i0 + a) * (uint64_t)w->cols + (uint64_t)j0) * w->es,
                                  p + (size_t)(a * ld) * w->es, (size_t)n * w->es);
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

/* Every byte of K written: sync (unless no_sync), rename over the target, sync the directory. */
QK__PRIV qk_result qk__npyw_commit(qk__npyw *w)
{
    const char *what = "fsync";
    int e = 0;
    qk__npyw_stop_syncer(w);
    e = w->sync_errno;
    if (w->written != (uint64_t)w->rows * (uint64_t)w->cols * w->es) {
        qk_result r = qk__fail(QK_ERROR_IO, "cannot write '%s': %llu of %llu bytes of K were written (internal error)", w->path,
                               (unsigned long long)w->written, (unsigned long long)((uint64_t)w->rows * (uint64_t)w->cols * w->es));
        qk__npyw_abort(w);
        return r;
    }
    if (!e && !w->no_sync && QK__FSYNC(w->fd) != 0) e = errno;
    if (!e) {
        what = "close";
        if (QK__CLOSE(w->fd) != 0) e = errno;
        w->fd = -1;
    }
    if (e) {
        qk_result r = qk__fail(QK_ERROR_IO, "cannot write '%s': %s failed: %s", w->path, what, strerror(e));
        qk__npyw_abort(w);
        return r;
    }
    {
        qk_result r = qk__tmp_commit(w->tmp, w->path, w->no_sync);
        QK_FREE(w->tmp);
        w->tmp = NULL;
        return r;
    }
}

#if defined(QK_CUDA) && QK_CUDA
/* Another descriptor of the open temporary file (several GPUs: one per host thread, each with
   its own file offset, for qk__npyw_at_fd); the caller closes it. */
QK__PRIV qk_result qk__npyw_fd(const qk__npyw *w, int *fd)
{
    *fd = w->tmp ? open(w->tmp, O_WRONLY) : -1;
    if (*fd < 0) return qk__fail(QK_ERROR_IO, "cannot write '%s': cannot open '%s' again: %s", w->path, w->tmp ? w->tmp : "?", strerror(errno));
    return QK_OK;
}
#endif
/* ---- end streaming .npy writer ---- */

/* >>sink ---- the output of a Gram: opened once, written by the executor, committed once ---- */
/* qk_gram validates, plans, opens ONE sink for the plan's output and hands plan and sink to the
   executor the plan names (the CPU engine, the MPS engine, the GPU engine on one or several
   GPUs). Executors write into it (the caller's host or device buffer, the tile callback, the
   .npy file's temporary through its writer) and never open, commit or remove a file; qk_gram
   closes the sink: on success the .npy is synced and renamed over out_path (qk__npyw_commit), on
   any failure or cancel its temporary is removed and out_path is untouched (qk__npyw_abort).
   qk_gram_mpi's MPI-IO file takes the same temporary, rename and removal steps (qk__open_tmp,
   qk__tmp_commit, qk__tmp_discard). */
/* qk__sink: in qk_internal.h (the executors write into it) */

/* Opens the sink of plan's output (desc: the caller's buffer, callback or path). NPY creates the
   temporary file; its writer syncs in the background (a syncer thread) unless the writes are the
   CPU engine's symmetric mirror strips (scattered: written back while the job runs they would be
   random I/O a cancel must wait for; the final sync then does it). */
QK__PRIV qk_result qk__sink_open(qk__sink *s, const qk_plan *plan, const qk_gram_desc *desc)
{
    memset(s, 0, sizeof *s);
    s->npy.fd = -1;
    s->kind = plan->output;
    s->dtype = plan->out_dtype;
    s->es = plan->out_dtype == QK_F32 ? 4 : 8;
    s->rows = plan->n_x;
    s->cols = plan->n_y;
    s->out = desc->out;
    s->ld = desc->ld_out ? desc->ld_out : plan->n_y;
    s->tile_fn = desc->tile_fn;
    s->tile_user = desc->tile_user;
    if (s->kind != QK_OUTPUT_NPY) return QK_OK;
    return qk__npyw_open(&s->npy, desc->out_path, s->dtype, s->rows, s->cols, desc->no_sync,
                         !(plan->backend == QK_BACKEND_CPU && plan->symmetric));
}

/* Closes the sink after the executor returned r: QK_OK commits (NPY: every byte written, sync,
   rename), anything else discards (NPY: the temporary removed). Returns the job's result. */
QK__PRIV qk_result qk__sink_close(qk__sink *s, qk_result r)
{
    if (s->kind != QK_OUTPUT_NPY) return r;
    if (r == QK_OK) {
        QK_PROF_BEGIN("npy commit");
        r = qk__npyw_commit(&s->npy);
        QK_PROF_END("npy commit");
    } else qk__npyw_abort(&s->npy);
    return r;
}
/* ---- end sink ---- */

