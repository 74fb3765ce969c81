#include "qk_internal.h"
/* >>cpu_stream ---- CPU engine, streamed output ---- */
/* The symmetric slab's lower part, written by the writer: for rows c >= the slab's end, the
   strip K[c][rb .. rb + m) = U[0 .. m)[c]^T, transposed through a small buffer (columns in
   blocks of 64, one write per row of K). */
static qk_result qk__cpu_write_strips(qk__npyw *w, const char *U, int64_t ld, int64_t rb, int64_t m, char *tb,
                                       qk__gram_job *job)
{
    const size_t es = w->es;
    int64_t c0, c, a;
    for (c0 = rb + m; c0 < w->cols; c0 += 64) {
        qk__job_poll(job);
        int64_t nc = w->cols - c0 < 64 ? w->cols - c0 : 64;
        for (a = 0; a < m; a++)
            for (c = 0; c < nc; c++) memcpy(tb + (size_t)(c * m + a) * es, U + (size_t)(a * ld + c0 + c) * es, es);
        for (c = 0; c < nc; c++) {
            qk_result r = qk__npyw_at(w, ((uint64_t)(c0 + c) * (uint64_t)w->cols + (uint64_t)rb) * es, tb + (size_t)(c * m) * es, (size_t)m * es);
            if (r != QK_OK) return r;
        }
    }
    return QK_OK;
}

/* One slab of streamed output: rows [rb, rb + m) of K in U (ld = columns). Symmetric: each
   row from column rb on (the part left of rb came with earlier slabs' strips), then the strips
   below the slab. */
typedef struct qk__slab_write {
    qk__npyw *w;
    qk__gram_job *job;
    const char *U;
    int64_t rb, m;
    int symmetric;
    char *tb;
    qk_result r;
    char err[512];
} qk__slab_write;

static void *qk__slab_write_main(void *p)
{
    qk__slab_write *s = (qk__slab_write *)p;
    qk__npyw *w = s->w;
    if (!s->symmetric) s->r = qk__npyw_rows(w, s->rb, 0, s->m, w->cols, s->U, w->cols);
    else {
        s->r = qk__npyw_rows(w, s->rb, s->rb, s->m, w->cols - s->rb, s->U + (size_t)s->rb * w->es, w->cols);
        if (s->r == QK_OK) s->r = qk__cpu_write_strips(w, s->U, w->cols, s->rb, s->m, s->tb, s->job);
    }
    if (s->r != QK_OK) snprintf(s->err, sizeof s->err, "%s", qk__errbuf); /* the detail is thread-local */
    return NULL;
}

/* Streamed output (QK_OUTPUT_NPY): slabs of plan->slab_rows rows computed into one of two slab
   buffers while a writer thread writes the previous slab. Symmetric K computes each unordered
   pair once; its mirror is written as strips (qk__cpu_write_strips). Host memory: the two slab
   buffers, not K. w: the sink's open .npy (qk_gram commits or discards it). */
QK__PRIV qk_result qk__cpu_gram_npy(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, int nt,
                                    const qk__cpu_tiles *tl, qk__npyw *w)
{
    qk__slab_write sw[2];
    char *U[2] = {NULL, NULL}, *tb = NULL;
    const size_t es = plan->out_dtype == QK_F32 ? 4 : 8;
    /* state tiles: a slab is one row block (its tiles move j's fields: keep K's shape here) */
    const int64_t SR = tl ? tl->R : plan->slab_rows > 0 ? plan->slab_rows : QK__T, nb = j->nb, na = j->na;
    const int sym = j->symmetric;
    int64_t rb, s;
    int pending = -1;   /* index of the slab buffer being written, or -1 */
    qk_result r;
    qk__thread wt;
    w->cancel = &j->cancel;  /* the writer of the slab in flight stops with the job */
    U[0] = (char *)qk__malloc((size_t)SR * (size_t)nb * es);
    U[1] = (char *)qk__malloc((size_t)SR * (size_t)nb * es);
    tb = (char *)qk__malloc((size_t)SR * 64 * es);
    if (!U[0] || !U[1] || !tb) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "gram: cannot allocate two slabs of %lld x %lld for the streamed output", (long long)SR, (long long)nb);
        goto done;
    }
    for (s = 0, rb = 0; rb < na; rb += SR, s++) {
        int b = (int)(s & 1);
        qk__slab_write *cur = &sw[b];
        const int64_t m = na - rb < SR ? na - rb : SR;
        qk_result rr = QK_OK;
        if (tl) {
            j->ld = nb;
            rr = qk__cpu_row_block(tl, j, rb, m, U[b], NULL, nt);
        } else {
            j->out = U[b];
            j->ld = nb;
            j->row_base = rb;
            j->mirror_end = rb + m;
            j->ti_begin = rb / QK__T;
            j->ti_end = (rb + m + QK__T - 1) / QK__T;
            j->n_tiles = 0;
            {
                int64_t t;
                for (t = j->ti_begin; t < j->ti_end; t++) j->n_tiles += j->symmetric ? j->tiles_j - t : j->tiles_j;
            }
            j->next = 0;
            QK_PROF_BEGIN("gram slab");
            qk__cpu_run_tiles(j, nt);
            QK_PROF_END("gram slab");
        }
        if (pending >= 0) { /* the previous slab's writer */
            qk__thread_join(wt);
            if (sw[pending].r != QK_OK && sw[pending].r != QK_ERROR_CANCELLED) { r = qk__fail(sw[pending].r, "%s", sw[pending].err); pending = -1; goto done; }
            pending = -1;
        }
        if (rr != QK_OK) { r = rr; goto done; }
        if (j->oom || j->cancel) break;
        memset(cur, 0, sizeof *cur);
        cur->w = w; cur->job = j; cur->U = U[b]; cur->rb = rb; cur->m = m; cur->symmetric = sym; cur->tb = tb;
        if (qk__thread_start(&wt, qk__slab_write_main, cur)) { pending = b; continue; }
        qk__slab_write_main(cur);
        if (cur->r != QK_OK) { r = qk__fail(cur->r, "%s", cur->err); goto done; }
    }
    if (pending >= 0) {
        qk__thread_join(wt);
        if (sw[pending].r != QK_OK && sw[pending].r != QK_ERROR_CANCELLED) { r = qk__fail(sw[pending].r, "%s", sw[pending].err); pending = -1; goto done; }
        pending = -1;
    }
    /* a last word from the progress callback before the file replaces the old one (the polls
       during the job are try-locks and may have missed the last tiles) */
    if (!j->oom && !j->cancel && j->progress && j->progress(j->pairs_done, j->pairs_total, j->progress_user)) j->cancel = 1;
    if (j->oom) { r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "gram: out of host memory for tile buffers"); goto done; }
    if (j->cancel) { r = qk__fail(QK_ERROR_CANCELLED, "gram: cancelled by a callback after %lld of %lld pairs; '%s' was not written", (long long)j->pairs_done, (long long)j->pairs_total, desc->out_path); goto done; }
    r = QK_OK;
done:
    w->cancel = NULL;
    QK_FREE(U[0]);
    QK_FREE(U[1]);
    QK_FREE(tb);
    return r;
}


