#include "qk_internal.h"
/* >>gram_impl ---- qk_gram and qk_states: validate, plan, open the sink, hand plan + sink to the executor ---- */
/* Runs a made plan: opens the sink of its output (qk__sink_open: the caller's buffer or callback,
   or the .npy's temporary file), hands plan and sink to the executor the plan names (the CPU
   engine, the MPS engine, the GPU engine on one GPU or several), and closes the sink with the
   executor's result (commit, or the temporary removed). The one place a Gram's output is opened
   and committed. qk_gram after validating and planning; tests and qk-bench with injected plans
   (ctx may be NULL there: no context staging, no figures kept). mps: the planner's MPS program
   of an MPS plan (qk__plan_make's keep), which the engines then do not build again; NULL: they
   build it from the map. */
static qk_result qk__plan_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc,
                              const qk__mps_prog *mps)
{
    qk__sink sink;
    qk_result r;
#if defined(QK_CUDA) && QK_CUDA
    qk_gram_desc d1;
    if (plan->backend == QK_BACKEND_CUDA && plan->n_devices <= 1 && desc->output == QK_OUTPUT_DEVICE && !desc->out && desc->out_devices) {
        d1 = *desc;   /* one GPU: out_devices[0] is the buffer */
        d1.out = desc->out_devices[0];
        desc = &d1;
    }
#endif
    if (plan->backend == QK_BACKEND_CUDA) {
#if !(defined(QK_CUDA) && QK_CUDA)
        QK__UNUSED(ctx);
        return qk__fail(QK_ERROR_NO_DEVICE, "no CUDA engine in this build");
#endif
    }
    if (desc->mps_discarded && plan->path != QK_PATH_MPS)
        memset(desc->mps_discarded, 0, sizeof(double) * (size_t)(desc->n_x + (desc->y ? desc->n_y : 0)));
    r = qk__sink_open(&sink, plan, desc);
    if (r != QK_OK) return r;
#if defined(QK_CUDA) && QK_CUDA
    if (plan->backend == QK_BACKEND_CUDA) {
        qk_cuda_stats st;
        if (ctx) {
            memset(&ctx->cuda_stats, 0, sizeof ctx->cuda_stats);
            ctx->n_dev_last = 0;
        }
        if (plan->n_devices > 1) r = ctx ? qk__mgpu_run(ctx, plan, map, desc, &sink)
                                         : qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: a plan of several GPUs needs a context");
        else {
            double t0 = qk_cuda_wtime();
            r = qk__cuda_run(ctx, plan, map, desc, &sink, mps, ctx ? &ctx->cuda_stats : &st);
            if (ctx) {
                ctx->n_dev_last = 1;
                ctx->dev_seconds[0] = qk_cuda_wtime() - t0;
            }
        }
        return qk__sink_close(&sink, r);
    }
#endif
    if (plan->path == QK_PATH_MPS) r = qk__mps_gram(plan, map, desc, &sink, mps);
    else r = qk__cpu_gram(plan, map, desc, &sink);
    return qk__sink_close(&sink, r);
}

static qk_result qk__gram(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc)
{
    qk_plan plan;
    qk__mps_prog prog;   /* the planner's MPS program (MPS plans), handed to the engine */
    qk_result r;
    QK_PROF_BEGIN("validate");
    r = qk__check_gram(ctx, map, desc);
    QK_PROF_END("validate");
    if (r != QK_OK) return r;
    memset(&prog, 0, sizeof prog);
    QK_PROF_BEGIN("plan");
    r = qk__plan_make(ctx, map, desc, &plan, &prog);
    QK_PROF_END("plan");
    if (r == QK_OK) r = qk__plan_run(ctx, &plan, map, desc, &prog);
    qk__mps_prog_free(&prog);
    return r;
}

QKDEF qk_result qk_gram(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc)
{
    qk_result r;
    qk__tpool *outer = qk__cur_pool;
    if (ctx && !ctx->pool && ctx->desc.n_threads > 1) {
        /* the context's pool, started once; without it every step starts its own threads */
        qk__tpool *t = (qk__tpool *)qk__alloc_with(&ctx->desc.allocator, sizeof *t);
        if (t && qk__tpool_start(t, ctx->desc.n_threads) == QK_OK) ctx->pool = t;
        else qk__free_with(&ctx->desc.allocator, t);
    }
    if (ctx) qk__cur_pool = ctx->pool;
    QK_PROF_BEGIN("qk_gram");
    r = qk__gram(ctx, map, desc);
    QK_PROF_END("qk_gram");
    qk__cur_pool = outer;
    return r;
}

QKDEF qk_result qk_states(qk_ctx *ctx, const qk_map *map, const double *x, int64_t n, double *out)
{
    qk_result r;
    double *s;
    int64_t D, i, k;
    qk_path path;
    if (!ctx || !map || !x || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_states: NULL %s", !ctx ? "ctx" : !map ? "map" : !x ? "x" : "out");
    if (map->n_qubits > QK_MAX_STATE_QUBITS) return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "qk_states: %d qubits exceed the state limit %d", map->n_qubits, QK_MAX_STATE_QUBITS);
    r = qk_map_check_data(map, x, n, "X");
    if (r != QK_OK) return r;
    path = map->cls == QK_CLASS_REAL ? QK_PATH_REAL : QK_PATH_COMPLEX;
    s = qk__cpu_states(map, x, n, path, ctx->desc.n_threads, NULL);
    if (!s) return QK_ERROR_OUT_OF_MEMORY;
    D = (int64_t)1 << map->n_qubits;
    for (i = 0; i < n; i++) {
        const double *row = s + i * qk__row_len(map, path);
        for (k = 0; k < D; k++) {
            out[2 * (i * D + k)] = row[k];
            out[2 * (i * D + k) + 1] = path == QK_PATH_REAL ? 0.0 : row[D + k];
        }
    }
    QK_FREE(s);
    return QK_OK;
}


