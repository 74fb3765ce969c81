#include "qk_internal.h"
/* >>ctx ---- the context (qk_ctx), qk_plan_make, qk_plan_describe ---- */
/* struct qk_ctx: in qk_internal.h (the runners read it) */

static void qk__log(const qk_ctx *ctx, qk_log_level lvl, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    if (!ctx || !ctx->desc.log) return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ctx->desc.log(lvl, msg, ctx->desc.log_user);
}

QKDEF qk_result qk_ctx_create(const qk_ctx_desc *desc_in, qk_ctx **out)
{
    qk_ctx_desc d;
    qk_ctx *ctx;
    if (!out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: out is NULL");
    *out = NULL;
    if (desc_in) d = *desc_in; else memset(&d, 0, sizeof d);
    if (d.device < QK_DEVICE_AUTO || d.device > QK_DEVICE_CUDA) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: unknown device %d", (int)d.device);
    if (d.n_threads < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: n_threads must be >= 0 (got %d)", d.n_threads);
    if (d.cuda_device < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: cuda_device must be >= 0");
    if (d.vram_fraction < 0.0 || d.vram_fraction > 1.0 || d.vram_fraction != d.vram_fraction)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: vram_fraction must be in (0, 1] (got %g)", d.vram_fraction);
    if ((d.allocator.alloc == NULL) != (d.allocator.free == NULL))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: allocator needs both alloc and free");
    d.n_threads = qk__def_i(d.n_threads, qk__ncores());
    d.vram_fraction = qk__def_d(d.vram_fraction, 0.85);
    if (d.autotune < -1 || d.autotune > 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: autotune must be -1, 0 or 1 (got %d)", d.autotune);
    if (d.n_cuda_devices < 0 || d.n_cuda_devices > QK_MAX_DEVICES)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: n_cuda_devices must be in [0, %d] (got %d)", QK_MAX_DEVICES, d.n_cuda_devices);
    if (d.cuda_devices && d.n_cuda_devices > 0) {
        int i, j;
        for (i = 0; i < d.n_cuda_devices; i++) {
            if (d.cuda_devices[i] < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: cuda_devices[%d] = %d (ordinals are >= 0)", i, d.cuda_devices[i]);
            for (j = 0; j < i; j++)
                if (d.cuda_devices[j] == d.cuda_devices[i])
                    return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: CUDA device %d is listed twice in cuda_devices", d.cuda_devices[i]);
        }
    }
    if (d.cache_dir && strlen(d.cache_dir) >= sizeof ctx->cache_dir - 16)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: cache_dir longer than %d characters", (int)sizeof ctx->cache_dir - 16);
    ctx = (qk_ctx *)qk__alloc_with(&d.allocator, sizeof *ctx);
    if (!ctx) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_ctx_create: out of memory");
    memset(ctx, 0, sizeof *ctx);
    ctx->desc = d;
    if (d.cache_dir) {
        snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", d.cache_dir);
        ctx->desc.cache_dir = ctx->cache_dir;
    }
    ctx->desc.cuda_devices = NULL;
    ctx->desc.n_cuda_devices = 0;
    if (d.device != QK_DEVICE_CPU) {
#if defined(QK_CUDA) && QK_CUDA
        int n = qk_cuda_device_count(), nl, i, bad = -1;
        char err[256] = "";
        /* the device list (qk_ctx_desc.n_cuda_devices) */
        if (d.n_cuda_devices > 0) {
            nl = d.n_cuda_devices;
            for (i = 0; i < nl; i++) ctx->dev_ord[i] = d.cuda_devices ? d.cuda_devices[i] : nl == 1 ? d.cuda_device : i;
        } else if (d.cuda_device != 0 || n <= 1) {
            nl = 1;
            ctx->dev_ord[0] = d.cuda_device;
        } else {
            nl = n < QK_MAX_DEVICES ? n : QK_MAX_DEVICES;
            for (i = 0; i < nl; i++) ctx->dev_ord[i] = i;
        }
        for (i = 0; i < nl && bad < 0; i++)
            if (ctx->dev_ord[i] >= n || qk_cuda_device_query(ctx->dev_ord[i], &ctx->dev_info[i], err, sizeof err) != QK_OK) bad = ctx->dev_ord[i];
        if (bad < 0 && nl > 1 && qk_cuda_set_device(ctx->dev_ord[0], err, sizeof err) != QK_OK) bad = ctx->dev_ord[0];
        if (bad < 0) {
            ctx->n_dev = nl;
            ctx->dev = ctx->dev_info[0];
            ctx->desc.device = QK_DEVICE_CUDA;
            ctx->desc.cuda_device = ctx->dev_ord[0];
            ctx->desc.cuda_devices = ctx->dev_ord;
            ctx->desc.n_cuda_devices = nl;
        } else if (d.device == QK_DEVICE_CUDA) {
            qk_ctx_destroy(ctx);
            if (n <= 0) return qk__fail(QK_ERROR_NO_DEVICE, "device cuda requested but no CUDA device is present");
            return qk__fail(QK_ERROR_NO_DEVICE, "CUDA device %d unavailable (%d present)%s%s", bad, n, err[0] ? ": " : "", err);
        } else {
            memset(&ctx->dev, 0, sizeof ctx->dev);
            ctx->desc.device = QK_DEVICE_CPU;
            qk__log(ctx, QK_LOG_INFO, "no CUDA device found; using the CPU engine");
        }
#else
        if (d.device == QK_DEVICE_CUDA) {
            qk_ctx_destroy(ctx);
            return qk__fail(QK_ERROR_NO_DEVICE, "device cuda requested but this build has no CUDA engine (compile qk_cuda.cu and define QK_CUDA=1)");
        }
        ctx->desc.device = QK_DEVICE_CPU;
        qk__log(ctx, QK_LOG_INFO, "built without the CUDA engine; using the CPU engine");
#endif
    }
    ctx->dev.host_budget_bytes = d.host_memory;   /* the CPU engine's plans (0: read at plan time) */
    *out = ctx;
    return QK_OK;
}

/* A pool of the context (*slot: qk_ctx.pool, or gpool of several GPUs) of n threads, the
   caller one of them, started by the first call that needs it; NULL where n < 2 or its threads
   cannot start (every step then starts its own, or runs on the caller). spin: qk__tpool.spin. */
QK__PRIV qk__tpool *qk__ctx_pool_of(qk_ctx *ctx, qk__tpool **slot, int n, int spin)
{
    if (*slot && qk__tpool_forked(*slot)) {   /* a forked child: the workers are the parent's; start its own */
        qk__free_with(&ctx->desc.allocator, *slot);
        *slot = NULL;
    }
    if (!*slot && n > 1) {
        qk__tpool *t = (qk__tpool *)qk__alloc_with(&ctx->desc.allocator, sizeof *t);
        if (t && qk__tpool_start(t, n) == QK_OK) {
            t->spin = spin;
            *slot = t;
        } else qk__free_with(&ctx->desc.allocator, t);
    }
    return *slot;
}

/* The context's pool of CPU threads: every parallel step of its calls runs on it */
QK__PRIV qk__tpool *qk__ctx_pool(qk_ctx *ctx)
{
    return qk__ctx_pool_of(ctx, &ctx->pool, ctx->desc.n_threads, 0);
}

QKDEF void qk_ctx_destroy(qk_ctx *ctx)
{
    if (!ctx) return;
    if (ctx->pool) {
        if (!qk__tpool_forked(ctx->pool)) qk__tpool_stop(ctx->pool);
        qk__free_with(&ctx->desc.allocator, ctx->pool);
    }
    if (ctx->gpool) {
        if (!qk__tpool_forked(ctx->gpool)) qk__tpool_stop(ctx->gpool);
        qk__free_with(&ctx->desc.allocator, ctx->gpool);
    }
#if defined(QK_CUDA) && QK_CUDA
    {
        int k;
        qk_cuda_host_free(ctx->stage[0]);
        qk_cuda_host_free(ctx->stage[1]);
        for (k = 0; k < QK_MAX_DEVICES; k++) {
            qk_cuda_host_free(ctx->dstage[k][0]);
            qk_cuda_host_free(ctx->dstage[k][1]);
            qk_cuda_pool_destroy(ctx->spool[k]);
        }
    }
#endif
    qk__free_with(&ctx->desc.allocator, ctx);
}

QKDEF qk_cuda_stats qk_ctx_cuda_stats(const qk_ctx *ctx)
{
    qk_cuda_stats st;
    if (ctx) return ctx->cuda_stats;
    memset(&st, 0, sizeof st);
    return st;
}

QKDEF int qk_ctx_device_seconds(const qk_ctx *ctx, double *seconds, int max)
{
    int k;
    if (!ctx) return 0;
    for (k = 0; seconds && k < ctx->n_dev_last && k < max; k++) seconds[k] = ctx->dev_seconds[k];
    return ctx->n_dev_last;
}

QKDEF int qk_ctx_device_stats(const qk_ctx *ctx, qk_cuda_stats *stats, int max)
{
    int k;
    if (!ctx) return 0;
    for (k = 0; stats && k < ctx->n_dev_last && k < max; k++) stats[k] = ctx->n_dev_last == 1 ? ctx->cuda_stats : ctx->dev_stats[k];
    return ctx->n_dev_last;
}

QKDEF qk_ctx_desc qk_ctx_query(const qk_ctx *ctx)
{
    qk_ctx_desc d;
    if (ctx) return ctx->desc;
    memset(&d, 0, sizeof d);
    return d;
}

/* Given host states (qk_gram_states: the data are the states themselves, gigabytes maybe): every
   row checked as qk_map_check_data checks it, on the context's threads in blocks of rows. Where a
   block fails, the rows are checked again in order on the calling thread, which names the first
   bad row (the detail message is per thread). */
typedef struct qk__scheck {
    const qk__smap *sm;
    const double *x;
    int64_t n, next;
    int any, side;          /* any: a block failed (the workers stop claiming more) */
} qk__scheck;
#define QK__SCHECK_ROWS 256
static void qk__scheck_work(void *arg, int thread)
{
    qk__scheck *j = (qk__scheck *)arg;
    const int64_t rowb = (int64_t)j->sm->map.n_features * 8;
    int64_t i0;
    QK__UNUSED(thread);
    while (!QK__LOAD(&j->any) && (i0 = QK__FETCH_ADD(&j->next, QK__SCHECK_ROWS)) < j->n) {
        const int64_t k = j->n - i0 < QK__SCHECK_ROWS ? j->n - i0 : QK__SCHECK_ROWS;
        if (qk__states_check(j->sm, (const char *)(const void *)j->x + (size_t)(i0 * rowb), k, rowb, j->side, i0) != QK_OK) {
            QK__STORE(&j->any, 1);
        }
    }
}
static qk_result qk__check_data(const qk_ctx *ctx, const qk_map *map, const double *x, int64_t n, const char *name)
{
    qk__scheck j;
    int nt;
    if (!x || n < 4 * QK__SCHECK_ROWS || !qk__map_is_states(map) || (map->ops[0].q1 & (QK__STATE_PROVIDER | QK__STATE_DEVICE)))
        return qk_map_check_data(map, x, n, name);
    memset(&j, 0, sizeof j);
    j.sm = (const qk__smap *)(const void *)map;
    j.x = x;
    j.n = n;
    j.side = strcmp(name, "Y") == 0;
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
    if ((int64_t)nt > n / QK__SCHECK_ROWS) nt = (int)(n / QK__SCHECK_ROWS);
    qk__parallel(nt, qk__scheck_work, &j);
    if (!j.any) return QK_OK;
    /* a block failed; blocks before it may be unchecked (the workers stop claiming): the rows
       are checked again in order on this thread, whose message names the first bad row */
    return qk_map_check_data(map, x, n, name);
}

/* Checks everything about a Gram request that does not depend on the engine. */
QK__PRIV qk_result qk__check_gram(const qk_ctx *ctx, const qk_map *map, const qk_gram_desc *d)
{
    int64_t cols;
    qk_result r;
    if (!ctx) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: ctx is NULL");
    if (!map) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: map is NULL");
    if (!d) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: desc is NULL");
    if (!d->x) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: x is NULL");
    if (d->n_x <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: n_x must be > 0 (got %lld)", (long long)d->n_x);
    if (d->y && d->n_y <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: n_y must be > 0 (got %lld)", (long long)d->n_y);
    if (d->output < QK_OUTPUT_HOST || d->output > QK_OUTPUT_NPY) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: unknown output mode %d", (int)d->output);
    if (d->output == QK_OUTPUT_CALLBACK && !d->tile_fn) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: output CALLBACK needs tile_fn");
    r = qk__mps_check_trunc(d);
    if (r != QK_OK) return r;
    if (d->output == QK_OUTPUT_NPY && (!d->out_path || !d->out_path[0])) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: output NPY needs out_path");
    if ((d->output == QK_OUTPUT_HOST || d->output == QK_OUTPUT_DEVICE) && !d->out && !(d->output == QK_OUTPUT_DEVICE && d->out_devices))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: out is NULL");
    if (d->output == QK_OUTPUT_DEVICE && ctx->desc.device != QK_DEVICE_CUDA) return qk__fail(QK_ERROR_NO_DEVICE, "qk_gram: output DEVICE needs the CUDA engine (context runs on the CPU)");
    if (d->out_dtype < QK_DTYPE_DEFAULT || d->out_dtype > QK_F64) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: unknown out_dtype %d", (int)d->out_dtype);
    if ((int)d->precision < (int)QK_PRECISION_DEFAULT || (int)d->precision >= QK_PRECISION_COUNT) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: unknown precision %d", (int)d->precision);
    if (!(d->tol >= 0.0 && d->tol <= 1e300)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: tol must be finite and >= 0 (got %g)", d->tol);
    if (d->mgpu_min_pairs < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: mgpu_min_pairs must be >= 0 (0: QK_MGPU_MIN_PAIRS; got %lld)", (long long)d->mgpu_min_pairs);
    if (d->mgpu_host_bound_split < -1 || d->mgpu_host_bound_split > 1)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: mgpu_host_bound_split must be -1 (no), 0 (QK_MGPU_HOST_BOUND_SPLIT) or 1 (yes), got %d", d->mgpu_host_bound_split);
    cols = d->y ? d->n_y : d->n_x;
    if (d->output == QK_OUTPUT_NPY && d->ld_out != 0 && d->ld_out != cols) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: ld_out has no meaning for output NPY (got %lld)", (long long)d->ld_out);
    if (d->ld_out != 0 && d->ld_out < cols) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: ld_out %lld < columns %lld", (long long)d->ld_out, (long long)cols);
    r = qk__check_data(ctx, map, d->x, d->n_x, "X");
    if (r != QK_OK) return r;
    if (d->y) {
        r = qk__check_data(ctx, map, d->y, d->n_y, "Y");
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

#if defined(QK_CUDA) && QK_CUDA
/* A plan of several GPUs: each part's configuration from the autotune (the cache, the whole
   plan's entry when the GPUs are alike; a miss measures on that GPU, made current for it), with
   autotune off (-1) or cache (0) whatever the context's mode (the whole plan's own autotune
   measures when it asks to), and, for a HOST output, whether the part's rows of the caller's
   buffer are page-locked. The first GPU is current afterwards. */
static qk_result qk__plan_parts_tune(qk_ctx *ctx, const qk_device_info *infos, const qk_gram_desc *desc, qk_plan *out)
{
    const int64_t ld = desc->ld_out ? desc->ld_out : out->n_y;
    const size_t es = out->out_dtype == QK_F32 ? 4 : 8;
    char err[256] = "";
    int k, i;
    qk_result r = QK_OK;
    for (k = out->n_devices - 1; k >= 0 && r == QK_OK; k--) {   /* the first GPU last: current afterwards */
        qk_plan sp;
        r = qk_cuda_set_device(out->devices[k], err, sizeof err);
        if (r != QK_OK) return qk__fail(r, "CUDA device %d: %s", out->devices[k], err);
        for (i = 0; i < out->n_parts && r == QK_OK; i++) {
            const qk_plan_part *pp = &out->parts[i];
            if (pp->device != k) continue;
            qk__plan_part_plan(out, i, infos[k].name, &sp);
            qk__plan_autotune(&infos[k], ctx->desc.autotune < 0 ? -1 : 0, ctx->desc.cache_dir, NULL, NULL, &sp);
            if (desc->output == QK_OUTPUT_HOST && desc->out)
                sp.host_pinned = qk_cuda_host_pinned((const char *)desc->out + (size_t)(pp->row0 * ld + pp->col0) * es);
            r = qk__plan_part_set(out, i, &sp, infos[k].name);
        }
    }
    return r;
}
#endif

/* qk_plan_make; keep (may be NULL, else zeroed by the caller): an MPS plan's program, handed to
   the engine by qk_gram (the caller frees it). */
QK__PRIV qk_result qk__plan_make(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep)
{
    qk_result r;
    if (!out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_make: out is NULL");
    if (!ctx || !map || !desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_make: NULL %s", !ctx ? "ctx" : !map ? "map" : "desc");
    if (ctx->desc.device == QK_DEVICE_CUDA) {
#if defined(QK_CUDA) && QK_CUDA
        char err[256] = "";
        qk_device_info info, infos[QK_MAX_DEVICES];
        int k;
        /* every GPU's free memory now; the first queried last (the query makes it current) */
        for (k = ctx->n_dev - 1; k >= 0; k--) {
            r = qk_cuda_device_query(ctx->dev_ord[k], &infos[k], err, sizeof err);
            if (r != QK_OK) return qk__fail(r, "CUDA device %d: %s", ctx->dev_ord[k], err);
            infos[k].free_bytes += qk_cuda_pool_bytes(ctx->spool[k]);  /* the pool's buffers serve the next job */
        }
        for (k = 0; k < (ctx->n_dev > 0 ? ctx->n_dev : 1); k++) infos[k].host_budget_bytes = ctx->desc.host_memory; /* the MPS path's CPU plan */
        info = infos[0];
        r = qk__plan_for_devices(infos, ctx->dev_ord, ctx->n_dev > 0 ? ctx->n_dev : 1, ctx->desc.vram_fraction, map, desc, out, keep);
        if (r == QK_OK && out->path == QK_PATH_MPS) {   /* the MPS path: its own kernels, no autotune */
            out->n_threads = ctx->desc.n_threads;
            qk__log(ctx, QK_LOG_INFO, "the MPS path runs on the GPU (%s; bond %d; the MPS are built on %d host threads)",
                    out->config, out->mps_bond, out->n_threads);
            return QK_OK;
        }
        if (r == QK_OK) qk__plan_autotune(&info, ctx->desc.autotune, ctx->desc.cache_dir, ctx->desc.log, ctx->desc.log_user, out);
        if (r == QK_OK && desc->output == QK_OUTPUT_HOST && desc->out) out->host_pinned = qk_cuda_host_pinned(desc->out);
        if (r == QK_OK && out->n_parts > 0) r = qk__plan_parts_tune(ctx, infos, desc, out);
#else
        r = qk__fail(QK_ERROR_NO_DEVICE, "no CUDA engine in this build");
#endif
    } else {
        r = qk__plan_cpu_nt(&ctx->dev, map, desc, ctx->desc.n_threads, out, keep);
    }
    return r;
}

QKDEF qk_result qk_plan_make(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, qk_plan *out)
{
    return qk__plan_make(ctx, map, desc, out, NULL);
}

static const char *qk__path_name(qk_path p)
{
    return p == QK_PATH_ANALYTIC ? "analytic (product map)" : p == QK_PATH_REAL ? "real statevector" :
           p == QK_PATH_MPS ? "mps (matrix product states)" : "complex statevector";
}

/* bytes as GB with three decimals and a '.' whatever the C locale (integer arithmetic: a host
   program's setlocale cannot turn it into "0,433"). */
static const char *qk__gb3(size_t bytes, char *buf, size_t n)
{
    unsigned long long mb = ((unsigned long long)bytes + 500000ull) / 1000000ull;
    snprintf(buf, n, "%llu.%03llu", mb / 1000ull, mb % 1000ull);
    return buf;
}

QKDEF int qk_plan_describe(const qk_plan *p, char *buf, size_t size)
{
    char g1[32], g2[32], g3[32], g4[32];
    size_t len = 0;
    if (buf && size) buf[0] = 0;
    if (!buf) size = 0;
    if (!p) return 0;
    qk__cat(buf, size, &len, "plan: %s on %s, path %s, %d qubits\n",
            p->backend == QK_BACKEND_CUDA ? "CUDA engine" : "CPU engine", p->device_name,
            qk__path_name(p->path), p->n_qubits);
    qk__cat(buf, size, &len, "  K(%s): %lld x %lld%s, output %s %s, precision %s\n",
            p->symmetric ? "X,X" : "X,Y", (long long)p->n_x, (long long)p->n_y,
            p->symmetric ? " (upper triangle computed, mirrored)" : "",
            p->output == QK_OUTPUT_DEVICE ? "device buffer" : p->output == QK_OUTPUT_CALLBACK ? "tile callback" :
            p->output == QK_OUTPUT_NPY ? "streamed to a .npy file" : p->host_pinned ? "pinned host buffer" : "host buffer",
            p->out_dtype == QK_F32 ? "float32" : "float64", qk_precision_name(p->precision));
    if (p->precision_note[0]) qk__cat(buf, size, &len, "  precision: %s\n", p->precision_note);
    if (p->path == QK_PATH_MPS && p->mps_given)
        qk__cat(buf, size, &len, "  mps: given tensors, bond dimension <= %d (the largest given bond), %lld flops per pair\n",
                p->mps_bond, (long long)p->mps_pair_flops);
    else if (p->path == QK_PATH_MPS && !p->mps_truncate)   /* integers only: the description is locale-free */
        qk__cat(buf, size, &len, "  mps: bond dimension <= %d (exact bound from the circuit), gates span <= %d sites, %lld flops per pair\n",
                p->mps_bond, p->mps_span, (long long)p->mps_pair_flops);
    else if (p->path == QK_PATH_MPS)
        qk__cat(buf, size, &len, "  mps: bond dimension <= %d (truncated; exact bound %d), gates span <= %d sites, %lld flops per pair; "
                "|K - K_exact| <= sqrt(eps_i) + sqrt(eps_j), eps per sample in mps_discarded\n",
                p->mps_bond, p->mps_exact_bond, p->mps_span, (long long)p->mps_pair_flops);
    if (p->backend == QK_BACKEND_CPU && !p->bulk_states)
        qk__cat(buf, size, &len, "  states: tiled, blocks of %lld samples (two resident), %s GB; K: %s GB; tiles %lld x %lld",
                (long long)p->state_tile, qk__gb3(p->bytes_states, g1, sizeof g1), qk__gb3(p->bytes_out, g2, sizeof g2),
                (long long)p->tile_m, (long long)p->tile_n);
    else
        qk__cat(buf, size, &len, "  states: %s, %s GB; K: %s GB; tiles %lld x %lld",
                p->bulk_states ? "all resident" : "state tiles", qk__gb3(p->bytes_states, g1, sizeof g1),
                qk__gb3(p->bytes_out, g2, sizeof g2), (long long)p->tile_m, (long long)p->tile_n);
    if (p->slab_rows > 0 && p->output != QK_OUTPUT_DEVICE)
        qk__cat(buf, size, &len, ", slabs of %lld rows (%s GB of host staging)", (long long)p->slab_rows,
                qk__gb3(p->bytes_staging, g1, sizeof g1));
    if (p->backend == QK_BACKEND_CPU) {
        qk__cat(buf, size, &len, ", %d threads", p->n_threads);
        if (p->bytes_budget && p->path != QK_PATH_MPS) {
            qk__cat(buf, size, &len, "\n  host memory: %s GB planned (states, slabs, scratch; K %s) of %s GB budget",
                    qk__gb3(p->bytes_total, g1, sizeof g1), p->output == QK_OUTPUT_HOST ? "in the caller's buffer" : "not held",
                    qk__gb3(p->bytes_budget, g2, sizeof g2));
            if (p->bytes_host_avail) qk__cat(buf, size, &len, " (85%% of %s GB available)", qk__gb3(p->bytes_host_avail, g3, sizeof g3));
            else qk__cat(buf, size, &len, " (given)");
        }
    } else {
        if (!p->bulk_states) qk__cat(buf, size, &len, ", state tile %lld", (long long)p->state_tile);
        qk__cat(buf, size, &len, ", %d streams\n  device memory: %s GB planned of %s GB budget (staging %s GB, workspace %s GB)",
                p->n_streams, qk__gb3(p->bytes_total, g1, sizeof g1), qk__gb3(p->bytes_budget, g2, sizeof g2),
                qk__gb3(p->bytes_staging, g3, sizeof g3), qk__gb3(p->bytes_workspace, g4, sizeof g4));
    }
    if (p->backend == QK_BACKEND_CUDA && (p->path == QK_PATH_REAL || p->path == QK_PATH_COMPLEX))
        qk__cat(buf, size, &len, "\n  engine: %s, kernel_cfg %d%s%s%s", qk__engine_name(p->engine) ? qk__engine_name(p->engine) : "?", p->kernel_cfg,
                p->engine == QK_GPU_FUSED ? " (" : "", p->engine == QK_GPU_FUSED ? qk__fused_cfg_name(p->kernel_cfg) : "",
                p->engine == QK_GPU_FUSED ? ")" : "");
    qk__cat(buf, size, &len, "\n  config: %s\n", p->config);
    if (p->n_devices > 1) {   /* integers only (locale-free) */
        int k, i;
        int64_t tot = 0, worst;
        for (k = 0; k < p->n_devices; k++) tot += p->dev_pairs[k];
        worst = (int64_t)(p->dev_imbalance * 10000.0 + 0.5);
        qk__cat(buf, size, &len, "  devices: %d GPUs, one host thread each, rows dealt by pair count (slowest share %lld.%04lld x the mean)%s\n",
                p->n_devices, (long long)(worst / 10000), (long long)(worst % 10000),
                !p->symmetric ? "" : p->dev_full_rows ? "; each: whole rows (the host's bytes bind: no mirror on the host)"
                : p->output == QK_OUTPUT_DEVICE || p->output == QK_OUTPUT_CALLBACK
                    ? "; each: its rows from the diagonal on, one call (the diagonal block mirrored, the rectangle right of it not)"
                    : "; each: its diagonal block (symmetric) + the rectangle right of it, mirrored");
        for (k = 0; k < p->n_devices; k++) {
            int64_t pc = tot > 0 ? (int64_t)((double)p->dev_pairs[k] * 10000.0 / (double)tot + 0.5) : 0, part[2][3];
            int np = qk__mgpu_parts(p, k, part);
            qk__cat(buf, size, &len, "    GPU %d: rows [%lld, %lld), %lld pairs (%lld.%02lld %%), %d part%s\n", p->devices[k],
                    (long long)p->dev_row0[k], (long long)p->dev_row0[k + 1], (long long)p->dev_pairs[k],
                    (long long)(pc / 100), (long long)(pc % 100), np, np == 1 ? "" : "s");
            for (i = 0; i < p->n_parts && i < QK_MAX_PARTS; i++) {   /* its parts' plans (what runs) */
                const qk_plan_part *pp = &p->parts[i];
                const char *en = qk__engine_name(pp->engine);
                if (pp->device != k) continue;
                qk__cat(buf, size, &len, "      [%lld, %lld) x [%lld, %lld) %s: %s, %s, kernel_cfg %d%s%s%s; states %s",
                        (long long)pp->row0, (long long)(pp->row0 + pp->n_rows), (long long)pp->col0, (long long)(pp->col0 + pp->n_cols),
                        pp->symmetric ? (pp->n_cols > pp->n_rows ? "band from the diagonal" : "diagonal block")
                                      : pp->mirror ? "rectangle + mirror" : "rows",
                        en ? en : "?", qk_precision_name(p->precision), pp->kernel_cfg,
                        pp->engine == QK_GPU_FUSED ? " (" : "", pp->engine == QK_GPU_FUSED ? qk__fused_cfg_name(pp->kernel_cfg) : "",
                        pp->engine == QK_GPU_FUSED ? ")" : "", pp->bulk_states ? "all resident" : "in tiles");
                if (!pp->bulk_states) qk__cat(buf, size, &len, " of %lld", (long long)pp->state_tile);
                if (pp->slab_rows > 0 && p->output != QK_OUTPUT_DEVICE) qk__cat(buf, size, &len, ", slabs of %lld rows", (long long)pp->slab_rows);
                if (pp->k_resident) qk__cat(buf, size, &len, ", K resident");
                qk__cat(buf, size, &len, ", %s of %s GB\n        config: %s\n", qk__gb3(pp->bytes_total, g1, sizeof g1),
                        qk__gb3(pp->bytes_budget, g2, sizeof g2), pp->config);
            }
        }
    }
    return (int)len;
}

