#include "qk_internal.h"
/* >>gram_impl ---- qk_gram and qk_states: validate, plan, open the sink, hand plan + sink to the executor ---- */
#include <float.h>
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
    if (ctx) qk__cur_pool = qk__ctx_pool(ctx);   /* started once; without it every step starts its own threads */
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
    s = qk__cpu_states(map, x, 0, n, path, ctx->desc.n_threads, NULL);
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



/* ---- qk_gram_states: K from given states ---- */
#if defined(QK_CUDA) && QK_CUDA
/* Device states (on_device): their norms computed on the device, checked as host rows are. */
static qk_result qk__states_check_device(const qk__smap *sm, const void *x, int64_t n, int64_t ld_doubles, int side)
{
    double *nrm = (double *)qk__malloc(sizeof(double) * (size_t)n * ((sm->op.q1 & QK__STATE_MIXED) ? 3 : 1));
    char err[256] = "";
    qk_result r;
    int64_t i;
    if (!nrm) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %lld norms", sm->fn, (long long)n);
    if (sm->op.q1 & QK__STATE_MIXED) {
        /* density matrices: trace, Hermiticity and largest entry per matrix on the device, checked
           as host ones are */
        const char *nm = side ? "B" : "A";
        r = qk_cuda_state_dm_check(x, n, ld_doubles, (int)sm->in.type, sm->in.dim, nrm, err, sizeof err);
        if (r != QK_OK) qk__fail(r, "%s: %s: %s", sm->fn, side ? "b" : "a", err);
        for (i = 0; i < n && r == QK_OK; i++) {
            const double tr = nrm[3 * i], dev = nrm[3 * i + 1], mx = nrm[3 * i + 2];
            char v0[40], v1[40];
            if (isnan(tr)) r = qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: an entry of the density matrix is NaN or Inf", nm, (long long)i);
            else if (!(dev <= sm->in.norm_tol))
                r = qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the density matrix is not Hermitian: an entry differs from the conjugate of "
                             "its transpose's by %s, more than norm_tol %s", nm, (long long)i, qk__fmt_g(v0, sizeof v0, dev, 3),
                             qk__fmt_g(v1, sizeof v1, sm->in.norm_tol, 3));
            else if (!(tr > DBL_MIN))
                r = qk__fail(QK_ERROR_ZERO_NORM, "%s[%lld]: the density matrix's trace is %s (not positive)", nm, (long long)i,
                             qk__fmt_g(v0, sizeof v0, tr, 17));
            else if (!(mx <= tr * (1.0 + sm->in.norm_tol)))
                r = qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: an entry of the density matrix has magnitude %s, more than its trace %s: "
                             "not a density matrix (a positive matrix's entries are at most its trace)", nm, (long long)i,
                             qk__fmt_g(v0, sizeof v0, mx, 6), qk__fmt_g(v1, sizeof v1, tr, 6));
            else if ((sm->op.q1 & QK__STATE_NORMALIZE) == 0 && !(fabs(tr - 1.0) <= sm->in.norm_tol))
                r = qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the density matrix's trace is %s, off 1 by more than norm_tol %s "
                             "(normalize = 1 divides by it)", nm, (long long)i, qk__fmt_g(v0, sizeof v0, tr, 17),
                             qk__fmt_g(v1, sizeof v1, sm->in.norm_tol, 3));
        }
        QK_FREE(nrm);
        return r;
    }
    r = qk_cuda_state_norms(x, n, ld_doubles, (int)sm->in.type, sm->in.dim, nrm, err, sizeof err);
    if (r != QK_OK) qk__fail(r, "%s: %s: %s", sm->fn, side ? "b" : "a", err);
    for (i = 0; i < n && r == QK_OK; i++) r = qk__state_norm_check(sm, nrm[i], side, i);
    QK_FREE(nrm);
    return r;
}
#endif
/* Rows of n elements of esize bytes, ld apart, packed into a fresh buffer whose rows are a
   multiple of 8 bytes (ld_out elements): the engines move rows of whole doubles. */
static void *qk__states_pack(const void *src, int64_t n, int64_t dim, int64_t ld, int esize, int64_t ld_out)
{
    char *p;
    int64_t i;
    if ((double)n * (double)ld_out * esize > 9.0e18) return NULL;
    p = (char *)qk__calloc((size_t)(n * ld_out), (size_t)esize);
    if (!p) return NULL;
    for (i = 0; i < n; i++) memcpy(p + (size_t)(i * ld_out) * (size_t)esize, (const char *)src + (size_t)(i * ld) * (size_t)esize, (size_t)(dim * esize));
    return p;
}

/* n pure states (rows ld elements apart, dim amplitudes of type) as density matrices
   |psi><psi|, dim^2 elements of the same type, rows ld_out elements apart. */
static void *qk__states_outer(const void *src, int64_t n, int64_t dim, int64_t ld, qk_state_type type, int64_t ld_out)
{
    const int es = qk__state_esize(type);
    char *p;
    int64_t i, a, b;
    if ((double)n * (double)ld_out * es > 9.0e18) return NULL;
    p = (char *)qk__calloc((size_t)(n * ld_out), (size_t)es);
    if (!p) return NULL;
    for (i = 0; i < n; i++) {
        const char *row = (const char *)src + (size_t)(i * ld) * (size_t)es;
        char *o = p + (size_t)(i * ld_out) * (size_t)es;
        for (a = 0; a < dim; a++)
            for (b = 0; b < dim; b++) {
                double ar, ai, br, bi, re, im;
                qk__state_amp(row, (int)type, a, &ar, &ai);
                qk__state_amp(row, (int)type, b, &br, &bi);
                re = ar * br + ai * bi;   /* psi_a conj(psi_b) */
                im = ai * br - ar * bi;
                switch (type) {
                case QK_STATE_C128: { double v[2] = {re, im}; memcpy(o + (size_t)(a * dim + b) * 16, v, 16); break; }
                case QK_STATE_C64: { float v[2] = {(float)re, (float)im}; memcpy(o + (size_t)(a * dim + b) * 8, v, 8); break; }
                case QK_STATE_F64: memcpy(o + (size_t)(a * dim + b) * 8, &re, 8); break;
                default: { float v = (float)re; memcpy(o + (size_t)(a * dim + b) * 4, &v, 4); break; }
                }
            }
    }
    return p;
}

/* qk_gram_states' map and Gram desc (sm, *g) from the caller's; sm's packed copies and buffer
   to free (qk__smap_free, also after a failure: what is left is NULL). qk_gram_mpi_states too.
   fn: the entry point's name, which begins its messages (kept in sm->fn). */
QK__PRIV qk_result qk__smap_make(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, const char *fn, qk__smap *sm_out,
                                 qk_gram_desc *g_out)
{
#define sm (*sm_out)
#define g (*g_out)
    void *pa = NULL, *pb = NULL;
    int esize, q = 1;
    int64_t row_elems;   /* elements of a stored row: a multiple of 8 bytes */
    int64_t nel, nel_a, nel_b, vlen;
    int mixed;
    const char *what = NULL;
    memset(&sm, 0, sizeof sm);
    memset(&g, 0, sizeof g);
    sm.fn = fn;
    sm.tag_side[1] = 1;
    if (!ctx || !states || !desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: NULL %s", fn, !ctx ? "ctx" : !states ? "states" : "desc");
    sm.in = *states;
    if (sm.in.type == QK_STATE_DEFAULT) sm.in.type = QK_STATE_C128;
    if ((int)sm.in.type < (int)QK_STATE_C128 || (int)sm.in.type > (int)QK_STATE_F32)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: unknown state type %d", fn, (int)states->type);
    esize = qk__state_esize(sm.in.type);
    if (sm.in.dim < 2) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: dim must be >= 2 (got %lld)", fn, (long long)sm.in.dim);
    if ((sm.in.a_mixed != 0 && sm.in.a_mixed != 1) || (sm.in.b_mixed != 0 && sm.in.b_mixed != 1))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: a_mixed and b_mixed must be 0 or 1", fn);
    mixed = sm.in.a_mixed || (sm.in.b_mixed && (sm.in.b || (sm.in.provider && sm.in.n_b > 0)));
    if (mixed && sm.in.dim > ((int64_t)1 << 16))
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "%s: density matrices of dim %lld are too large", fn, (long long)sm.in.dim);
    nel = mixed ? sm.in.dim * sm.in.dim : sm.in.dim;   /* elements of a sample (a matrix: dim^2) */
    nel_a = sm.in.a_mixed || !mixed ? nel : sm.in.dim;
    /* K(A,A) has no B side: its rows are A's (a side of one kind: no expansion below) */
    nel_b = sm.in.b_mixed || !mixed || !(sm.in.b || (sm.in.provider && sm.in.n_b > 0)) ? nel : sm.in.dim;
    vlen = mixed ? nel * (qk__state_complex(sm.in.type) ? 2 : 1) : nel;   /* the engines' vector */
    while (q < 62 && ((int64_t)1 << q) < vlen) q++;
    if (q > QK_MAX_STATE_QUBITS)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "%s: %s of dim %lld need%s %d qubits, beyond the state limit %d", fn,
                        mixed ? "density matrices" : "states", (long long)sm.in.dim, mixed ? "" : "s", q, QK_MAX_STATE_QUBITS);
    if (mixed && sm.in.provider && sm.in.a_mixed != sm.in.b_mixed && sm.in.n_b > 0)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%s: a provider gives rows of one kind (a_mixed == b_mixed)", fn);
    if (desc->x || desc->y) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: desc->x and desc->y must be NULL (the states are states->a and states->b)", fn);
    if (sm.in.n_a <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_a must be > 0 (got %lld)", fn, (long long)sm.in.n_a);
    if ((sm.in.b || (sm.in.provider && sm.in.n_b)) && sm.in.n_b <= 0)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_b must be > 0 with b (got %lld)", fn, (long long)sm.in.n_b);
    if (sm.in.provider && (sm.in.a || sm.in.b)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: a provider, or a and b, not both", fn);
    if (!sm.in.provider && !sm.in.a) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: a is NULL (and no provider)", fn);
    if (sm.in.provider && sm.in.on_device) return qk__fail(QK_ERROR_UNSUPPORTED, "%s: the provider writes host rows (on_device with a provider)", fn);
    if (sm.in.lda == 0) sm.in.lda = nel_a;
    if (sm.in.ldb == 0) sm.in.ldb = nel_b;
    if (sm.in.lda < nel_a || (sm.in.b && sm.in.ldb < nel_b))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: ld%s %lld < %lld, the elements of a sample", fn, sm.in.lda < nel_a ? "a" : "b",
                        (long long)(sm.in.lda < nel_a ? sm.in.lda : sm.in.ldb), (long long)(sm.in.lda < nel_a ? nel_a : nel_b));
    if (sm.in.normalize != 0 && sm.in.normalize != 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: normalize must be 0 or 1 (got %d)", fn, sm.in.normalize);
    if (sm.in.norm_tol == 0.0) sm.in.norm_tol = esize == 16 || sm.in.type == QK_STATE_F64 ? 1e-9 : 1e-5;
    if (!(sm.in.norm_tol > 0.0 && sm.in.norm_tol < 1.0)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: norm_tol must be in (0, 1) (got %g)", fn, states->norm_tol);
    if (desc->path == QK_PATH_MPS || desc->path == QK_PATH_ANALYTIC)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%s: given statevectors take the statevector path (path %s)", fn, desc->path == QK_PATH_MPS ? "MPS" : "ANALYTIC");
    if (sm.in.on_device) {
#if defined(QK_CUDA) && QK_CUDA
        if (ctx->desc.device != QK_DEVICE_CUDA) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: device states need a context on the GPU engine", fn);
#else
        return qk__fail(QK_ERROR_NO_DEVICE, "%s: device states need the CUDA engine (not in this build)", fn);
#endif
    }
    /* a stored row: the caller's ld when its rows are whole doubles apart and a, b are aligned
       (read in place), else packed rows of dim elements rounded up to whole doubles */
    row_elems = (nel * esize + 7) / 8 * 8 / esize;
    if (!sm.in.provider && nel_a != nel_b && sm.in.on_device) {
#if defined(QK_CUDA) && QK_CUDA
        /* a pure device side against device matrices: the pure side expanded to |psi><psi| on
           the device (rows as the matrices' ld), then both sides read as device matrices */
        const int pure_b = nel_b != nel;
        const void *mat = pure_b ? sm.in.a : sm.in.b, *pure = pure_b ? sm.in.b : sm.in.a;
        const int64_t ldm = pure_b ? sm.in.lda : sm.in.ldb, ldp = pure_b ? sm.in.ldb : sm.in.lda, np = pure_b ? sm.in.n_b : sm.in.n_a;
        const int comp = sm.in.type == QK_STATE_C128 || sm.in.type == QK_STATE_F64 ? 8 : 4;   /* bytes of a real or imaginary part */
        char err[256] = "";
        qk_result r;
        if ((ldm * esize) % 8 != 0 || (uintptr_t)mat % 8 != 0)
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: device density matrices need 8-byte aligned rows (ld%s * %d bytes)", fn,
                            pure_b ? "a" : "b", esize);
        if ((uintptr_t)pure % (uintptr_t)comp != 0)
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: %s: device states must be aligned to their elements' %d-byte parts", fn,
                            pure_b ? "b" : "a", comp);
        r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
        if (r == QK_OK) r = qk_cuda_state_outer(pure, np, ldp * esize, (int)sm.in.type, sm.in.dim, ldm, &sm.dev_pure, err, sizeof err);
        if (r != QK_OK) return qk__fail(r, "%s: %s: %s", fn, pure_b ? "b" : "a", err);
        if (pure_b) { sm.in.b = sm.dev_pure; sm.in.ldb = ldm; sm.in.b_mixed = 1; }
        else { sm.in.a = sm.dev_pure; sm.in.lda = ldm; sm.in.a_mixed = 1; }
        row_elems = ldm;
#endif
    } else if (!sm.in.provider && nel_a != nel_b) {
        /* a pure side against a mixed one: the pure side expanded to |psi><psi| (both packed) */
        const int pure_b = nel_b != nel;
        pa = pure_b ? qk__states_pack(sm.in.a, sm.in.n_a, nel, sm.in.lda, esize, row_elems)
                    : qk__states_outer(sm.in.a, sm.in.n_a, sm.in.dim, sm.in.lda, sm.in.type, row_elems);
        if (pa) pb = pure_b ? qk__states_outer(sm.in.b, sm.in.n_b, sm.in.dim, sm.in.ldb, sm.in.type, row_elems)
                            : qk__states_pack(sm.in.b, sm.in.n_b, nel, sm.in.ldb, esize, row_elems);
        if (!pa || !pb) { what = "the pure states expanded to density matrices"; goto oom; }
    } else if (!sm.in.provider) {
        const int fit_a = (sm.in.lda * esize) % 8 == 0 && ((uintptr_t)sm.in.a % 8) == 0;
        const int fit_b = !sm.in.b || ((sm.in.ldb * esize) % 8 == 0 && ((uintptr_t)sm.in.b % 8) == 0 && sm.in.ldb == sm.in.lda);
        if (fit_a && fit_b) row_elems = sm.in.lda;
        else if (sm.in.on_device) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: device states need 8-byte aligned rows, and lda == ldb", fn);
        else {
            pa = qk__states_pack(sm.in.a, sm.in.n_a, nel, sm.in.lda, esize, row_elems);
            if (pa && sm.in.b) pb = qk__states_pack(sm.in.b, sm.in.n_b, nel, sm.in.ldb, esize, row_elems);
            if (!pa || (sm.in.b && !pb)) { what = "a packed copy of the states"; goto oom; }
        }
    }
    sm.pa = pa;   /* from here a failure leaves them to qk__smap_free */
    sm.pb = pb;
    if ((double)row_elems * esize / 8.0 > 2147483647.0)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: rows of %lld elements are too long", fn, (long long)row_elems);
    sm.q = q;
    sm.op.kind = QK__OP_STATE;
    sm.op.q0 = (int)sm.in.type;
    sm.op.q1 = (sm.in.normalize ? QK__STATE_NORMALIZE : 0) | (sm.in.provider ? QK__STATE_PROVIDER : 0) | (sm.in.on_device ? QK__STATE_DEVICE : 0) |
               (mixed ? QK__STATE_MIXED : 0);
    sm.op.angle.kind = QK_ARG_CONST;
    sm.op.angle.x0 = (int)sm.in.dim;
    sm.op.angle.scale = 1.0;
    sm.map.type = QK_MAP_CUSTOM;
    sm.map.cls = qk__state_complex(sm.in.type) && !mixed ? QK_CLASS_COMPLEX : QK_CLASS_REAL;
    sm.map.n_qubits = q;
    sm.map.n_features = (int)(row_elems * esize / 8);
    sm.map.n_ops = 1;
    sm.map.ops = &sm.op;
    sm.map.desc.type = QK_MAP_CUSTOM;
    sm.map.desc.n_features = sm.map.n_features;
    sm.map.desc.n_qubits = q;
    g = *desc;
    g.n_x = sm.in.n_a;
    g.n_y = sm.in.n_b;
    if (sm.in.provider) {
        /* chunks of provider rows of at most 64 MB (at least one row) */
        sm.ld = row_elems;
        sm.chunk = (int64_t)(((size_t)64 << 20) / (size_t)(row_elems * esize));
        if (sm.chunk < 1) sm.chunk = 1;
        if (sm.chunk > (sm.in.n_a > sm.in.n_b ? sm.in.n_a : sm.in.n_b)) sm.chunk = sm.in.n_a > sm.in.n_b ? sm.in.n_a : sm.in.n_b;
        sm.buf = qk__calloc((size_t)(sm.chunk * row_elems), (size_t)esize);
        if (!sm.buf) { what = "the provider's row buffer"; goto oom; }
        g.x = (const double *)(const void *)&sm.side[0];
        g.y = sm.in.n_b > 0 ? (const double *)(const void *)&sm.side[1] : NULL;
        /* one GPU: the provider is called from one thread at a time (qk_state_fn) */
        g.mgpu_min_pairs = INT64_MAX;
        g.mgpu_host_bound_split = -1;
    } else {
        g.x = (const double *)(pa ? pa : sm.in.a);
        g.y = sm.in.b ? (const double *)(pb ? pb : sm.in.b) : NULL;
    }
#if defined(QK_CUDA) && QK_CUDA
    if (sm.in.on_device) {
        /* checked on the device, once: on the context's first GPU, where the states must live.
           Several GPUs split the job as for host states (the first reads the rows in place, the
           others copy them in from it: qk__map_for_device), except for device output into one
           buffer (desc->out without out_devices), which one GPU fills as before. */
        char err[256] = "";
        qk_result r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
        if (r != QK_OK) return qk__fail(r, "%s: %s", fn, err);
        r = qk__states_check_device(&sm, sm.in.a, sm.in.n_a, sm.map.n_features, 0);
        if (r == QK_OK && sm.in.b) r = qk__states_check_device(&sm, sm.in.b, sm.in.n_b, sm.map.n_features, 1);
        if (r != QK_OK) return r;
        if (desc->output == QK_OUTPUT_DEVICE && !desc->out_devices) {
            g.mgpu_min_pairs = INT64_MAX;
            g.mgpu_host_bound_split = -1;
        }
    }
#endif
    if (!g.y) g.n_y = 0;
    return QK_OK;
oom:
    QK_FREE(pa);
    QK_FREE(pb);
    QK_FREE(sm.buf);
    sm.pa = sm.pb = sm.buf = NULL;
    return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %s", fn, what);
#undef sm
#undef g
}

QK__PRIV void qk__smap_free(qk__smap *sm)
{
    QK_FREE(sm->pa);
    QK_FREE(sm->pb);
    QK_FREE(sm->buf);
#if defined(QK_CUDA) && QK_CUDA
    qk_cuda_dev_free(sm->dev_pure);
    sm->dev_pure = NULL;
#endif
}

/* The Gram of given states' map (plan NULL), or its plan: qk_gram_states, qk_plan_states; and
   for given MPS (qk__mps_states_run) */
static qk_result qk__gram_or_plan(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *g, qk_plan *plan)
{
    return plan ? qk_plan_make(ctx, map, g, plan) : qk_gram(ctx, map, g);
}

static qk_result qk__states_run(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, qk_plan *plan)
{
    qk__smap sm;
    qk_gram_desc g;
    qk_result r = qk__smap_make(ctx, states, desc, "qk_gram_states", &sm, &g);
#if defined(QK_CUDA) && QK_CUDA
    /* host states on the GPU engine: page-locked for the job, so that they cross PCIe at the
       pinned rate (qk_cuda_host_lock: at worst left pageable) */
    int lock[2] = {0, 0};
    const void *lp[2] = {NULL, NULL};
    if (r == QK_OK && !plan && ctx->desc.device == QK_DEVICE_CUDA && !sm.in.on_device && !sm.in.provider) {
        char err[256];
        if (qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err) == QK_OK) {
            /* the rows' span: the last row ends at its elements (an ld may pad the others) */
            const size_t rowb = (size_t)sm.map.n_features * 8;
            const size_t used = qk__state_row_bytes(&sm.op);
            const size_t last = used < rowb ? used : rowb;
            lp[0] = g.x;
            lp[1] = g.y;
            qk_cuda_host_lock(lp[0], (size_t)(g.n_x - 1) * rowb + last, &lock[0]);
            if (lp[1]) qk_cuda_host_lock(lp[1], (size_t)(g.n_y - 1) * rowb + last, &lock[1]);
        }
    }
#endif
    if (r == QK_OK) r = qk__gram_or_plan(ctx, &sm.map, &g, plan);
#if defined(QK_CUDA) && QK_CUDA
    if (lock[0]) qk_cuda_host_unlock(lp[0]);
    if (lock[1]) qk_cuda_host_unlock(lp[1]);
#endif
    qk__smap_free(&sm);
    return r;
}

QKDEF qk_result qk_gram_states(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc)
{
    return qk__states_run(ctx, states, desc, NULL);
}

QKDEF qk_result qk_plan_states(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, qk_plan *out)
{
    return qk__states_run(ctx, states, desc, out);
}

/* ---- qk_gram_mps_states: K from given matrix product states ---- */
/* Entry (l, a, r) of a site tensor of bonds dl x dr in the layout (docs/states.md, "MPS input"). */
static int64_t qk__mps_in_index(int layout, int dr, int l, int a, int r)
{
    return layout == QK_MPS_LRP ? ((int64_t)l * dr + r) * 2 + a : ((int64_t)l * 2 + a) * dr + r;
}

/* The squared norm of given MPS, per sample, on the context's threads: <psi|psi> by transfer
   matrices, E' = sum_a A_a^H E A_a (O(q chi^3) per sample), as nrm[i] 2^expo[i]: E is scaled by a
   power of two at every site (exact), so that a norm far from 1 at hundreds of sites neither
   overflows nor underflows. nrm[i] NaN where an entry is not finite, 0 for a zero state. */
typedef struct qk__mps_norm_job {
    const qk_mps_states_desc *in;
    int side;
    int64_t n, next;
    double *nrm;
    int64_t *expo;
    int oom;
} qk__mps_norm_job;

static void qk__mps_norm_work(void *arg, int thread)
{
    qk__mps_norm_job *j = (qk__mps_norm_job *)arg;
    const qk_mps_states_desc *in = j->in;
    const int q = in->n_sites, type = (int)in->type, B = QK_MPS_MAX_BOND;
    double *E = (double *)qk__malloc(sizeof(double) * (size_t)(2 * B * B * 2 + 2 * B * 2 * B)), *En, *T;
    int64_t i;
    QK__UNUSED(thread);
    if (!E) { QK__STORE(&j->oom, 1); return; }
    En = E + 2 * B * B;
    T = En + 2 * B * B;
    while ((i = QK__FETCH_ADD(&j->next, 1)) < j->n) {
        const void *const *sites = (j->side ? in->b : in->a) + (size_t)i * (size_t)q;
        const int *bond = (j->side ? in->b_bonds : in->a_bonds) + (size_t)i * (size_t)(q + 1);
        int s, l, lp, a, r, rp, bad = 0;
        int64_t ex = 0;
        E[0] = 1; E[1] = 0;
        for (s = 0; s < q && !bad; s++) {
            const int dl = bond[s], dr = bond[s + 1];
            double *sw;
            /* T[l][a][r'] = sum_l' E[l][l'] A[l'][a][r'] */
            for (l = 0; l < dl; l++)
                for (a = 0; a < 2; a++)
                    for (rp = 0; rp < dr; rp++) {
                        double tr = 0, ti = 0, xr, xi;
                        for (lp = 0; lp < dl; lp++) {
                            const double er = E[2 * (l * dl + lp)], ei = E[2 * (l * dl + lp) + 1];
                            qk__state_amp(sites[s], type, qk__mps_in_index(in->layout, dr, lp, a, rp), &xr, &xi);
                            tr += er * xr - ei * xi;
                            ti += er * xi + ei * xr;
                        }
                        T[2 * ((l * 2 + a) * dr + rp)] = tr;
                        T[2 * ((l * 2 + a) * dr + rp) + 1] = ti;
                    }
            /* E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a][r'], then scaled by a power of two */
            for (r = 0; r < dr; r++)
                for (rp = 0; rp < dr; rp++) {
                    double er = 0, ei = 0, xr, xi;
                    for (l = 0; l < dl; l++)
                        for (a = 0; a < 2; a++) {
                            const double tr = T[2 * ((l * 2 + a) * dr + rp)], ti = T[2 * ((l * 2 + a) * dr + rp) + 1];
                            qk__state_amp(sites[s], type, qk__mps_in_index(in->layout, dr, l, a, r), &xr, &xi);
                            if (!isfinite(xr) || !isfinite(xi)) bad = 1;
                            er += xr * tr + xi * ti;
                            ei += xr * ti - xi * tr;
                        }
                    En[2 * (r * dr + rp)] = er;
                    En[2 * (r * dr + rp) + 1] = ei;
                }
            {
                double c = 0.0;
                for (r = 0; r < 2 * dr * dr; r++) if (fabs(En[r]) > c) c = fabs(En[r]);
                if (c > 0.0 && isfinite(c)) {
                    int e;
                    (void)frexp(c, &e);
                    for (r = 0; r < 2 * dr * dr; r++) En[r] = ldexp(En[r], -e);
                    ex += e;
                }
            }
            sw = E; E = En; En = sw;
        }
        j->nrm[i] = bad || !isfinite(E[0]) ? NAN : E[0] > 0.0 ? E[0] : 0.0;
        j->expo[i] = ex;
    }
    /* E and En may have swapped: free the block's start */
    QK_FREE(E < En ? E : En);
}

/* One side's MPS checked (shapes, finite entries, norms) into mm->D (the largest bonds) and
   mm->scale[off..]; errors name the side, the sample and the site. */
static qk_result qk__mps_in_check(qk__mpsmap *mm, int side, int nt)
{
    const qk_mps_states_desc *in = &mm->in;
    const int q = in->n_sites, type = (int)in->type;
    const char *nm = side ? "B" : "A";
    const void *const *ptr = side ? in->b : in->a;
    const int *bonds = side ? in->b_bonds : in->a_bonds;
    const int64_t n = side ? in->n_b : in->n_a, off = side ? in->n_a : 0;
    qk__mps_norm_job j;
    int64_t i;
    int s;
    if (!bonds) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_mps_states: %s_bonds is NULL", side ? "b" : "a");
    for (i = 0; i < n; i++) {
        const int *bond = bonds + (size_t)i * (size_t)(q + 1);
        for (s = 0; s <= q; s++) {
            if (bond[s] < 1 || bond[s] > QK_MPS_MAX_BOND)
                return qk__fail(bond[s] < 1 ? QK_ERROR_INVALID_ARGUMENT : QK_ERROR_UNSUPPORTED,
                                "%s[%lld]: bond %d (left of site %d) is %d: bonds are 1 .. QK_MPS_MAX_BOND = %d", nm, (long long)i, s, s,
                                bond[s], QK_MPS_MAX_BOND);
            if ((s == 0 || s == q) && bond[s] != 1)
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s[%lld]: the %s bond is %d: an open-boundary MPS has 1 there", nm, (long long)i,
                                s == 0 ? "first (left of site 0)" : "last (right of the last site)", bond[s]);
            if (bond[s] > mm->D[s]) mm->D[s] = bond[s];
        }
        for (s = 0; s < q; s++)
            if (!ptr[(size_t)i * (size_t)q + (size_t)s]) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s[%lld] site %d: the tensor is NULL", nm, (long long)i, s);
    }
    memset(&j, 0, sizeof j);
    j.in = in; j.side = side; j.n = n;
    j.nrm = mm->scale + off;
    j.expo = (int64_t *)qk__malloc(sizeof(int64_t) * (size_t)n);
    if (j.expo) qk__parallel(nt < n ? nt : (int)n, qk__mps_norm_work, &j);
    if (!j.expo || j.oom) {
        QK_FREE(j.expo);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_mps_states: cannot allocate the norm's work space");
    }
    for (i = 0; i < n; i++) {
        const double m0 = j.nrm[i], ss = j.expo[i] > 4096 ? INFINITY : j.expo[i] < -4096 ? 0.0 : ldexp(m0, (int)j.expo[i]);
        char v0[40], v1[40];
        qk_result r = QK_OK;
        if (isnan(m0)) {   /* the first entry that is not finite, for the message */
            const int *bond = bonds + (size_t)i * (size_t)(q + 1);
            int l, a, c;
            for (s = 0; s < q && r == QK_OK; s++)
                for (l = 0; l < bond[s] && r == QK_OK; l++)
                    for (a = 0; a < 2 && r == QK_OK; a++)
                        for (c = 0; c < bond[s + 1] && r == QK_OK; c++) {
                            double re, im;
                            qk__state_amp(ptr[(size_t)i * (size_t)q + (size_t)s], type, qk__mps_in_index(in->layout, bond[s + 1], l, a, c), &re, &im);
                            if (!isfinite(re) || !isfinite(im))
                                r = qk__fail(QK_ERROR_NON_FINITE, "%s[%lld] site %d: entry (%d, %d, %d) (left, physical, right) is %s", nm,
                                             (long long)i, s, l, a, c, isnan(re) || isnan(im) ? "NaN" : "Inf");
                        }
            if (r == QK_OK) r = qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: the squared norm is not finite", nm, (long long)i);
        } else if (m0 == 0.0) r = qk__fail(QK_ERROR_ZERO_NORM, "%s[%lld]: the MPS's squared norm is 0 (a zero state)", nm, (long long)i);
        else if (!in->normalize && !(fabs(ss - 1.0) <= in->norm_tol))
            r = qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the MPS's squared norm is %s, off 1 by more than norm_tol %s "
                         "(normalize = 1 scales each state to norm 1)", nm, (long long)i,
                         isfinite(ss) ? qk__fmt_g(v0, sizeof v0, ss, 17) : "beyond 1e308", qk__fmt_g(v1, sizeof v1, in->norm_tol, 3));
        if (r != QK_OK) {
            QK_FREE(j.expo);
            return r;
        }
        /* normalize: every site scaled by ss^(-1/2q) = 2^(-expo/2q) m0^(-1/2q) (one factor on one
           site would leave the float tensors of the GPU engine out of range at hundreds of sites;
           the power of two's exponent is exact) */
        j.nrm[i] = in->normalize ? exp2(-0.5 * (double)j.expo[i] / (double)q) * pow(m0, -0.5 / (double)q) : 1.0;
    }
    QK_FREE(j.expo);
    return QK_OK;
}

static void qk__mpsmap_free(qk__mpsmap *mm)
{
    QK_FREE(mm->D);
    QK_FREE(mm->scale);
}

/* qk_gram_mps_states' map (mm) and Gram desc (*g) from the caller's, every tensor checked. */
static qk_result qk__mpsmap_make(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc, qk__mpsmap *mm, qk_gram_desc *g)
{
    const char *fn = "qk_gram_mps_states";
    qk_mps_states_desc *in = &mm->in;
    qk_result r;
    int nt;
    memset(mm, 0, sizeof *mm);
    memset(g, 0, sizeof *g);
    if (!ctx || !mps || !desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: NULL %s", fn, !ctx ? "ctx" : !mps ? "mps" : "desc");
    *in = *mps;
    if (in->type == QK_STATE_DEFAULT) in->type = QK_STATE_C128;
    if ((int)in->type < (int)QK_STATE_C128 || (int)in->type > (int)QK_STATE_F32)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: unknown state type %d", fn, (int)mps->type);
    if ((int)in->layout != QK_MPS_LPR && (int)in->layout != QK_MPS_LRP)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: unknown layout %d (QK_MPS_LPR or QK_MPS_LRP)", fn, (int)mps->layout);
    if (in->n_sites < 1 || in->n_sites > QK_MAX_PRODUCT_QUBITS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_sites must be 1 .. %d (got %d)", fn, QK_MAX_PRODUCT_QUBITS, in->n_sites);
    if (!in->a) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: a is NULL", fn);
    if (in->n_a <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_a must be > 0 (got %lld)", fn, (long long)in->n_a);
    if (in->b && in->n_b <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_b must be > 0 with b (got %lld)", fn, (long long)in->n_b);
    if (!in->b) in->n_b = 0;
    if (in->normalize != 0 && in->normalize != 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: normalize must be 0 or 1 (got %d)", fn, in->normalize);
    if (in->norm_tol == 0.0) in->norm_tol = in->type == QK_STATE_C128 || in->type == QK_STATE_F64 ? 1e-9 : 1e-5;
    if (!(in->norm_tol > 0.0 && in->norm_tol < 1.0)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: norm_tol must be in (0, 1) (got %g)", fn, mps->norm_tol);
    if (desc->x || desc->y) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: desc->x and desc->y must be NULL (the states are mps->a and mps->b)", fn);
    if (desc->path != QK_PATH_DEFAULT && desc->path != QK_PATH_MPS)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%s: given MPS take the MPS path (path %d)", fn, (int)desc->path);
    if (desc->mps_max_bond != 0 || desc->mps_cutoff != 0.0)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%s: given MPS are contracted as they are (mps_max_bond and mps_cutoff must be 0)", fn);
    if ((double)(in->n_a + in->n_b) * (double)in->n_sites > 9.0e18) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: too many tensors", fn);
    mm->D = (int *)qk__calloc((size_t)in->n_sites + 1, sizeof(int));
    mm->scale = (double *)qk__malloc(sizeof(double) * (size_t)(in->n_a + in->n_b));
    if (!mm->D || !mm->scale) {
        qk__mpsmap_free(mm);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: cannot allocate the bonds and scales of %lld samples", fn, (long long)(in->n_a + in->n_b));
    }
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
    r = qk__mps_in_check(mm, 0, nt);
    if (r == QK_OK && in->b) r = qk__mps_in_check(mm, 1, nt);
    if (r != QK_OK) { qk__mpsmap_free(mm); return r; }
    mm->op.kind = QK__OP_MPS;
    mm->op.angle.kind = QK_ARG_CONST;
    mm->op.angle.scale = 1.0;
    mm->map.type = QK_MAP_CUSTOM;
    mm->map.cls = QK_CLASS_COMPLEX;
    mm->map.n_qubits = in->n_sites;
    mm->map.n_features = 0;
    mm->map.n_ops = 1;
    mm->map.ops = &mm->op;
    mm->map.desc.type = QK_MAP_CUSTOM;
    mm->map.desc.n_qubits = in->n_sites;
    *g = *desc;
    g->path = QK_PATH_MPS;
    g->x = (const double *)(const void *)&mm->side[0];
    g->n_x = in->n_a;
    g->y = in->b ? (const double *)(const void *)&mm->side[1] : NULL;
    g->n_y = in->n_b;
    return QK_OK;
}

static qk_result qk__mps_states_run(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc, qk_plan *plan)
{
    qk__mpsmap mm;
    qk_gram_desc g;
    qk_result r = qk__mpsmap_make(ctx, mps, desc, &mm, &g);
    if (r != QK_OK) return r;
    r = qk__gram_or_plan(ctx, &mm.map, &g, plan);
    qk__mpsmap_free(&mm);
    return r;
}

QKDEF qk_result qk_gram_mps_states(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc)
{
    return qk__mps_states_run(ctx, mps, desc, NULL);
}

QKDEF qk_result qk_plan_mps_states(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc, qk_plan *out)
{
    return qk__mps_states_run(ctx, mps, desc, out);
}
