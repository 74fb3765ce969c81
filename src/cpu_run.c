#include "qk_internal.h"
/* >>cpu_run ---- CPU engine: a job run (all of K, state tiles, streamed), qk__cpu_gram ---- */

/* Runs a job set up by qk__cpu_job_init: all of K, streamed (NPY, into the sink's file), or (tl)
   by state tiles. */
static qk_result qk__cpu_gram_exec(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, const qk__cpu_tiles *tl,
                                   qk__sink *sink)
{
    int nt = plan->n_threads > 0 ? plan->n_threads : 1;
    qk_result r = QK_OK;
    if (sink->kind == QK_OUTPUT_NPY) r = qk__cpu_gram_npy(plan, desc, j, nt, tl, &sink->npy);
    else if (tl) {
        const size_t es = j->dt == QK_F32 ? 4 : 8;
        char *K = sink->kind == QK_OUTPUT_HOST ? (char *)sink->out : NULL;
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
   after the states are built, with the job polled meanwhile), into the sink's output;
   qk__cpu_job_free ends it. */
QK__PRIV void qk__cpu_job_init(qk__gram_job *j, const qk_plan *plan, const qk_gram_desc *desc, const qk__sink *sink, const double *A,
                               const double *B, int64_t stride, int64_t D, const void *mps, size_t scratch)
{
    int64_t nb = desc->y ? desc->n_y : desc->n_x;
    memset(j, 0, sizeof *j);
    j->path = plan->path;
    j->linear = plan->linear;
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
    j->out = sink->out;
    j->ld = sink->ld;
    j->output = sink->kind;
    j->tile_fn = sink->tile_fn;
    j->tile_user = sink->tile_user;
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
    j->isa = qk__cpu_isa();   /* the kernels of the whole job (cpu_pool.c) */
    (void)qk__mutex_init(&j->cb_lock);
}

QK__PRIV void qk__cpu_job_free(qk__gram_job *j)
{
    qk__mutex_destroy(&j->cb_lock);
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
QK__PRIV qk_result qk__cpu_gram_run(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, const double *A, const double *B,
                                    qk__sink *sink)
{
    if (j->provider_failed) return j->provider_failed;
    if (!A) return QK_ERROR_OUT_OF_MEMORY;
    if (j->cancel) return qk__cpu_states_cancelled(j);
    if (desc->y && !B) return QK_ERROR_OUT_OF_MEMORY;
    j->A = A;
    j->B = B ? B : A;
    return qk__cpu_gram_exec(plan, desc, j, NULL, sink);
}

/* K with state tiles (plan->bulk_states == 0): two blocks of plan->state_tile states. */
static qk_result qk__cpu_gram_tiled(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink)
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
    qk__cpu_job_init(&j, plan, desc, sink, NULL, NULL, stride, path == QK_PATH_ANALYTIC ? map->n_qubits : ((int64_t)1 << map->n_qubits), NULL, 0);
    r = qk__cpu_gram_exec(plan, desc, &j, &t, sink);
    qk__cpu_job_free(&j);
    QK_FREE(t.A);
    QK_FREE(t.B);
    return r;
}

/* The CPU engine's Gram into the sink; desc validated, plan made, sink opened (qk_gram). */
QK__PRIV qk_result qk__cpu_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink)
{
    qk_path path = plan->path;
    double *A = NULL, *B = NULL;
    int nt = plan->n_threads > 0 ? plan->n_threads : 1;
    qk__gram_job j;
    qk_result r;
    if (!plan->bulk_states) return qk__cpu_gram_tiled(plan, map, desc, sink);
    qk__cpu_job_init(&j, plan, desc, sink, NULL, NULL, qk__row_len(map, path),
                     path == QK_PATH_ANALYTIC ? map->n_qubits : ((int64_t)1 << map->n_qubits), NULL, 0);
    A = qk__cpu_states(map, desc->x, 0, desc->n_x, path, nt, &j);
    if (A && desc->y && !j.cancel) B = qk__cpu_states(map, desc->y, 0, desc->n_y, path, nt, &j);
    r = qk__cpu_gram_run(plan, desc, &j, A, B, sink);
    qk__cpu_job_free(&j);
    QK_FREE(A);
    QK_FREE(B);
    return r;
}
