#include "qk_internal.h"
/* >>vjp ---- qk_gram_vjp: the gradient of a loss of K for every weight (adjoint sweeps); qk_gram_projected ---- */
/* For L(K) with G = dL/dK, S = <psi_i|phi_j> and K = |S|^2:
     dL = sum_ij G_ij 2 Re(conj(S_ij) dS_ij),  dS_ij = <d psi_i|phi_j> + <psi_i|d phi_j>
   so dL = sum_i 2 Re <d psi_i|lam_i> + sum_j 2 Re <d phi_j|mu_j> with
     lam_i = sum_j G_ij conj(S_ij) phi_j,   mu_j = sum_i G_ij S_ij psi_i
   (K(X,X): one set of states, lam_i = sum_j (G_ij + G_ji) conj(S_ij) psi_j). Each sample's
   2 Re <d psi|lam> for every weight at once comes from one adjoint sweep through its circuit:
   s = psi, l = lam; for ops k from last to first, the op's angle derivative is read from s (the
   state after op k) and l, then both go back through op k (U_k^dagger). An op
   exp(-i t Gen / 2) (RX, RY, RZ: Gen the Pauli; RZZ: Z x Z) gives dL/dt = -Im <Gen s|l>; P(t)
   (i Pi_1) gives 2 Im <Pi_1 s|l>; t = scale * w + offset (QK_ARG_W) or scale * w * x (WX) gives
   dt/dw. Cost: the states, S (half of it for K(X,X)), lam (and mu), and two circuit sweeps per
   sample, whatever the number of weights. CPU engine, fp64, all states resident. */

/* ---- C (m x n) += alpha A (m x k) B (k x n), row-major, on the engine's threads: the products
   of the VJP (S and the adjoint vectors) as real GEMMs; micro-tiles of QK__GR rows x 8 columns held
   in registers over the k loop (12 accumulators of 4 doubles: AVX2's 16 registers); upper: C only
   from column (row block start) on, for a symmetric product whose lower part is mirrored ---- */
#define QK__GR 6
typedef struct qk__gemm_job {
    int64_t m, n, k, lda, ldb, ldc, next;
    int upper;
    double alpha;
    const double *A, *B;
    double *C;
} qk__gemm_job;

#if defined(QK__VEC)
typedef double qk__gv4 __attribute__((vector_size(4 * sizeof(double))));
#endif

QK__CONTRACT
static void qk__gemm_rows(const qk__gemm_job *g, int64_t i0, int64_t i1)
{
    const int64_t j0 = g->upper ? i0 / 8 * 8 : 0;
    int64_t i, j, p;
    for (i = i0; i + QK__GR <= i1; i += QK__GR) {
        for (j = j0; j + 8 <= g->n; j += 8) {
#if defined(QK__VEC)
            qk__gv4 c[QK__GR][2], b0, b1, z;
            int r;
            memset(&z, 0, sizeof z);
            for (r = 0; r < QK__GR; r++) { c[r][0] = z; c[r][1] = z; }
            for (p = 0; p < g->k; p++) {
                const double *bp = g->B + p * g->ldb + j;
                memcpy(&b0, bp, sizeof b0);
                memcpy(&b1, bp + 4, sizeof b1);
                for (r = 0; r < QK__GR; r++) {
                    const double a = g->A[(i + r) * g->lda + p];
                    c[r][0] += a * b0;
                    c[r][1] += a * b1;
                }
            }
            for (r = 0; r < QK__GR; r++) {
                double *cp = g->C + (i + r) * g->ldc + j;
                int e;
                for (e = 0; e < 4; e++) { cp[e] += g->alpha * c[r][0][e]; cp[4 + e] += g->alpha * c[r][1][e]; }
            }
#else
            double c[QK__GR][8];
            int r, e;
            memset(c, 0, sizeof c);
            for (p = 0; p < g->k; p++)
                for (r = 0; r < QK__GR; r++)
                    for (e = 0; e < 8; e++) c[r][e] += g->A[(i + r) * g->lda + p] * g->B[p * g->ldb + j + e];
            for (r = 0; r < QK__GR; r++)
                for (e = 0; e < 8; e++) g->C[(i + r) * g->ldc + j + e] += g->alpha * c[r][e];
#endif
        }
        for (; j < g->n; j++) {   /* the last columns */
            int r;
            for (r = 0; r < QK__GR; r++) {
                double acc = 0;
                for (p = 0; p < g->k; p++) acc += g->A[(i + r) * g->lda + p] * g->B[p * g->ldb + j];
                g->C[(i + r) * g->ldc + j] += g->alpha * acc;
            }
        }
    }
    for (; i < i1; i++)   /* the last rows */
        for (j = j0; j < g->n; j++) {
            double acc = 0;
            for (p = 0; p < g->k; p++) acc += g->A[i * g->lda + p] * g->B[p * g->ldb + j];
            g->C[i * g->ldc + j] += g->alpha * acc;
        }
}

static void qk__gemm_work(void *p, int thread)
{
    qk__gemm_job *g = (qk__gemm_job *)p;
    int64_t b;
    QK__UNUSED(thread);
    while ((b = QK__FETCH_ADD(&g->next, 1)) * 36 < g->m) {
        const int64_t i0 = b * 36, i1 = i0 + 36 < g->m ? i0 + 36 : g->m;
        qk__gemm_rows(g, i0, i1);
    }
}

static void qk__gemm(int nt, int upper, int64_t m, int64_t n, int64_t k, double alpha, const double *A, int64_t lda, const double *B,
                     int64_t ldb, double *C, int64_t ldc)
{
    qk__gemm_job g;
    const int64_t blocks = (m + 35) / 36;
    g.m = m; g.n = n; g.k = k; g.alpha = alpha; g.A = A; g.lda = lda; g.B = B; g.ldb = ldb; g.C = C; g.ldc = ldc; g.next = 0;
    g.upper = upper;
    qk__parallel(nt < blocks ? nt : (int)blocks, qk__gemm_work, &g);
}

typedef struct qk__vjp_job {
    const qk_map *map;
    const double *x, *y;        /* data of the samples (X, then Y) */
    int64_t nx, ny, D;
    int sym;
    const double *A, *B;        /* states, rows of 2D (re | im); B == A for K(X,X) */
    const double *g;            /* G, ld_g */
    int64_t ld_g;
    double *S;                  /* S, nx x ny complex (re, im) */
    double *L, *M;              /* lam (nx rows of 2D), mu (ny rows; K(X,Y)) */
    double *grad;               /* QK__VJP_CHUNKS x n_weights partial sums */
    int n_threads, oom, cancel;
    int64_t next, swept;
    qk_progress_fn progress;
    void *progress_user;
} qk__vjp_job;

/* the caller's progress (thread 0 is the calling thread): non-zero cancels */
static void qk__vjp_poll(qk__vjp_job *j, int thread)
{
    const int64_t total = j->nx + (j->sym ? 0 : j->ny);
    if (thread != 0 || !j->progress || QK__LOAD(&j->cancel)) return;
    if (j->progress(QK__LOAD(&j->swept), total, j->progress_user)) QK__STORE(&j->cancel, 1);
}

/* <Gen s|l> of an angled op (the generator applied to s where it acts) */
static void qk__vjp_gen_dot(const qk_op *o, const double *s, const double *l, int64_t D, double *re, double *im)
{
    const double *si = s + D, *li = l + D;
    const int64_t b0 = (int64_t)1 << o->q0, b1 = qk__op_arity(o->kind) == 2 ? (int64_t)1 << o->q1 : 0;
    double r = 0, m = 0;
    int64_t i;
    for (i = 0; i < D; i++) {
        double gr, gi;   /* (Gen s)[i] */
        switch (o->kind) {
        case QK_OP_RX: gr = s[i ^ b0]; gi = si[i ^ b0]; break;
        case QK_OP_RY:   /* Y: (Ys)[i] = -i s[i^b] where bit clear, +i s[i^b] where set */
            if (i & b0) { gr = -si[i ^ b0]; gi = s[i ^ b0]; } else { gr = si[i ^ b0]; gi = -s[i ^ b0]; }
            break;
        case QK_OP_RZ: gr = (i & b0) ? -s[i] : s[i]; gi = (i & b0) ? -si[i] : si[i]; break;
        case QK_OP_RZZ: {
            const int odd = ((i & b0) != 0) != ((i & b1) != 0);
            gr = odd ? -s[i] : s[i];
            gi = odd ? -si[i] : si[i];
            break;
        }
        default: /* P: the projector on the qubit's |1> */
            gr = (i & b0) ? s[i] : 0.0;
            gi = (i & b0) ? si[i] : 0.0;
            break;
        }
        r += gr * l[i] + gi * li[i];
        m += gr * li[i] - gi * l[i];
    }
    *re = r;
    *im = m;
}

/* The adjoint sweeps, in QK__VJP_CHUNKS chunks of samples taken by whichever thread is free,
   each chunk's sums in its own row of grad: the total (summed in chunk order) does not depend
   on the threads. */
#define QK__VJP_CHUNKS 64
static void qk__vjp_sweep_work(void *p, int thread)
{
    qk__vjp_job *j = (qk__vjp_job *)p;
    const qk_map *m = j->map;
    const int64_t D = j->D, total = j->nx + (j->sym ? 0 : j->ny);
    double *s = (double *)qk__malloc(sizeof(double) * (size_t)(4 * D + m->n_ops + 1));
    double *l = s ? s + 2 * D : NULL, *theta = s ? s + 4 * D : NULL;
    int64_t ch;
    if (!s) { QK__STORE(&j->oom, 1); return; }
    while ((ch = QK__FETCH_ADD(&j->next, 1)) < QK__VJP_CHUNKS && !QK__LOAD(&j->oom) && !QK__LOAD(&j->cancel)) {
        const int64_t r0 = total * ch / QK__VJP_CHUNKS, r1 = total * (ch + 1) / QK__VJP_CHUNKS;
        double *grad = j->grad + (size_t)ch * (size_t)m->n_weights;
        int64_t r;
        for (r = r0; r < r1; r++) {
            const int from_y = r >= j->nx;
            const int64_t i = from_y ? r - j->nx : r;
            const double *x = (from_y ? j->y : j->x) + i * m->n_features;
            int k;
            memcpy(s, (from_y ? j->B : j->A) + 2 * i * D, sizeof(double) * (size_t)(2 * D));
            memcpy(l, (from_y ? j->M : j->L) + 2 * i * D, sizeof(double) * (size_t)(2 * D));
            qk_map_angles(m, x, theta);
            for (k = m->n_ops - 1; k >= 0; k--) {
                const qk_op *o = &m->ops[k];
                if (o->kind == QK_OP_AMPLITUDE) break;   /* the first op; nothing before it has a weight */
                if (qk__op_has_angle(o->kind) && (o->angle.kind == QK_ARG_W || o->angle.kind == QK_ARG_WX)) {
                    double re, im, dt, dw = o->angle.scale * (o->angle.kind == QK_ARG_WX ? x[o->angle.x0] : 1.0);
                    qk__vjp_gen_dot(o, s, l, D, &re, &im);
                    dt = o->kind == QK_OP_P ? 2.0 * im : -im;
                    grad[o->angle.w] += dt * dw;
                }
                if (k == 0) break;
                /* back through op k: U^dagger is the op at -t (angled), itself otherwise */
                qk__apply(o, -theta[k], x, s, s + D, m->n_qubits);
                qk__apply(o, -theta[k], x, l, l + D, m->n_qubits);
            }
        }
        (void)QK__FETCH_ADD(&j->swept, r1 - r0);
        qk__vjp_poll(j, thread);
    }
    QK_FREE(s);
}

/* B (rows x cols, ld) transposed into T (cols x rows) */
static void qk__transpose(const double *B, int64_t rows, int64_t cols, int64_t ld, double *T)
{
    int64_t i, j;
    for (i = 0; i < rows; i++)
        for (j = 0; j < cols; j++) T[j * rows + i] = B[i * ld + j];
}

QKDEF qk_result qk_gram_vjp(qk_ctx *ctx, const qk_map *map, const qk_vjp_desc *d)
{
    qk__vjp_job j;
    qk_result r;
    int64_t i, c, cols, D, nx;
    int t, nt, cplx;
    double bytes, *Sr = NULL, *Si = NULL, *Wr = NULL, *Wi = NULL, *T1 = NULL, *T2 = NULL;
    if (!ctx || !map || !d) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: NULL %s", !ctx ? "ctx" : !map ? "map" : "desc");
    if (!d->g) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: g (dL/dK) is NULL");
    if (map->n_weights > 0 && !d->grad_w) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: grad_w is NULL (the map has %d weights)", map->n_weights);
    if (qk__map_is_states(map)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: a map of given states has no weights");
    if (map->n_qubits > QK_MAX_STATE_QUBITS)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "qk_gram_vjp: %d qubits: the gradient runs on statevectors (at most %d qubits)", map->n_qubits,
                        QK_MAX_STATE_QUBITS);
    if (!d->x || d->n_x <= 0 || (d->y && d->n_y <= 0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: %s", !d->x ? "x is NULL" : d->n_x <= 0 ? "n_x must be > 0" : "n_y must be > 0");
    r = qk_map_check_data(map, d->x, d->n_x, "X");
    if (r == QK_OK && d->y) r = qk_map_check_data(map, d->y, d->n_y, "Y");
    if (r != QK_OK) return r;
    cols = d->y ? d->n_y : d->n_x;
    nx = d->n_x;
    if (d->ld_g != 0 && d->ld_g < cols) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: ld_g %lld < columns %lld", (long long)d->ld_g, (long long)cols);
    memset(&j, 0, sizeof j);
    j.ld_g = d->ld_g ? d->ld_g : cols;
    for (i = 0; i < nx; i++)
        for (c = 0; c < cols; c++)
            if (!isfinite(d->g[i * j.ld_g + c])) return qk__fail(QK_ERROR_NON_FINITE, "qk_gram_vjp: g[%lld][%lld] is not finite", (long long)i, (long long)c);
    D = (int64_t)1 << map->n_qubits;
    cplx = map->cls == QK_CLASS_COMPLEX;   /* real maps: real states, real S (half the products) */
    /* states (2D a row), their transposes, S and W (two planes each), the adjoint vectors */
    bytes = 8.0 * (4.0 * (double)D * (double)(nx + (d->y ? cols : 0)) + 2.0 * (double)D * (double)(nx > cols ? nx : cols) +
                   4.0 * (double)nx * (double)cols + 2.0 * (double)nx * (double)cols);
    if (ctx->desc.host_memory && bytes > (double)ctx->desc.host_memory)
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: the states, S and the adjoint vectors need %.3g GB, the host budget is %.3g GB "
                        "(the gradient keeps every state resident)", bytes * 1e-9, (double)ctx->desc.host_memory * 1e-9);
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
    j.map = map; j.x = d->x; j.y = d->y; j.nx = nx; j.ny = cols; j.D = D; j.sym = d->y == NULL; j.g = d->g;
    j.n_threads = nt;
    j.progress = d->progress;
    j.progress_user = d->progress_user;
    QK_PROF_BEGIN("vjp states");
    j.A = qk__cpu_states(map, d->x, 0, nx, QK_PATH_COMPLEX, nt, NULL);
    if (j.A && d->y) j.B = qk__cpu_states(map, d->y, 0, cols, QK_PATH_COMPLEX, nt, NULL);
    else j.B = j.A;
    QK_PROF_END("vjp states");
    Sr = (double *)qk__calloc((size_t)(nx * cols), sizeof(double));
    Si = (double *)qk__calloc((size_t)(nx * cols), sizeof(double));
    Wr = (double *)qk__calloc((size_t)(nx * cols), sizeof(double));
    Wi = (double *)qk__calloc((size_t)(nx * cols), sizeof(double));
    T1 = (double *)qk__malloc(sizeof(double) * (size_t)((nx > cols ? nx : cols) * D));
    T2 = (double *)qk__malloc(sizeof(double) * (size_t)((nx > cols ? nx : cols) * D));
    j.L = (double *)qk__calloc((size_t)(2 * nx * D), sizeof(double));
    if (!j.sym) j.M = (double *)qk__calloc((size_t)(2 * cols * D), sizeof(double));
    j.grad = (double *)qk__calloc((size_t)QK__VJP_CHUNKS * (size_t)(map->n_weights > 0 ? map->n_weights : 1), sizeof(double));
    if (!j.A || !j.B || !Sr || !Si || !Wr || !Wi || !T1 || !T2 || !j.L || (!j.sym && !j.M) || !j.grad) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: cannot allocate %.3g GB of host memory (states, S, adjoint vectors)", bytes * 1e-9);
        goto done;
    }
    qk__vjp_poll(&j, 0);
    if (j.cancel) goto cancelled;
    /* S = conj(A) B^T: Sr = Ar Br^T + Ai Bi^T, Si = Ar Bi^T - Ai Br^T (real maps: Sr = Ar Br^T) */
    QK_PROF_BEGIN("vjp S");
    qk__transpose(j.B, cols, D, 2 * D, T1);   /* Br^T */
    qk__gemm(nt, j.sym, nx, cols, D, 1.0, j.A, 2 * D, T1, cols, Sr, cols);
    if (cplx) {
        qk__transpose(j.B + D, cols, D, 2 * D, T2);   /* Bi^T */
        qk__gemm(nt, j.sym, nx, cols, D, 1.0, j.A + D, 2 * D, T2, cols, Sr, cols);
        qk__gemm(nt, j.sym, nx, cols, D, 1.0, j.A, 2 * D, T2, cols, Si, cols);
        qk__gemm(nt, j.sym, nx, cols, D, -1.0, j.A + D, 2 * D, T1, cols, Si, cols);
    }
    if (j.sym)   /* S is Hermitian: the part left of each row block's diagonal mirrored */
        for (i = 0; i < nx; i++)
            for (c = 0; c < (i / 36 * 36) / 8 * 8; c++) {
                Sr[i * cols + c] = Sr[c * cols + i];
                Si[i * cols + c] = -Si[c * cols + i];
            }
    QK_PROF_END("vjp S");
    qk__vjp_poll(&j, 0);
    if (j.cancel) goto cancelled;
    if (map->n_weights > 0) {
        QK_PROF_BEGIN("vjp adjoint vectors");
        /* lam = W B with W = G' o conj(S) (G' = G + G^T for K(X,X)): Lr = Wr Br - Wi Bi,
           Li = Wr Bi + Wi Br */
        for (i = 0; i < nx; i++)
            for (c = 0; c < cols; c++) {
                const double gv = d->g[i * j.ld_g + c] + (j.sym ? d->g[c * j.ld_g + i] : 0.0);
                Wr[i * cols + c] = gv * Sr[i * cols + c];
                Wi[i * cols + c] = -gv * Si[i * cols + c];
            }
        qk__gemm(nt, 0, nx, D, cols, 1.0, Wr, cols, j.B, 2 * D, j.L, 2 * D);
        if (cplx) {
            qk__gemm(nt, 0, nx, D, cols, -1.0, Wi, cols, j.B + D, 2 * D, j.L, 2 * D);
            qk__gemm(nt, 0, nx, D, cols, 1.0, Wr, cols, j.B + D, 2 * D, j.L + D, 2 * D);
            qk__gemm(nt, 0, nx, D, cols, 1.0, Wi, cols, j.B, 2 * D, j.L + D, 2 * D);
        }
        if (!j.sym) {
            /* mu = V^T A with V = G o S: Mr = Vr^T Ar - Vi^T Ai, Mi = Vr^T Ai + Vi^T Ar (the
               transposes of V in Wr / Wi, free now) */
            for (i = 0; i < nx; i++)
                for (c = 0; c < cols; c++) {
                    const double gv = d->g[i * j.ld_g + c];
                    Wr[c * nx + i] = gv * Sr[i * cols + c];
                    Wi[c * nx + i] = gv * Si[i * cols + c];
                }
            qk__gemm(nt, 0, cols, D, nx, 1.0, Wr, nx, j.A, 2 * D, j.M, 2 * D);
            if (cplx) {
                qk__gemm(nt, 0, cols, D, nx, -1.0, Wi, nx, j.A + D, 2 * D, j.M, 2 * D);
                qk__gemm(nt, 0, cols, D, nx, 1.0, Wr, nx, j.A + D, 2 * D, j.M + D, 2 * D);
                qk__gemm(nt, 0, cols, D, nx, 1.0, Wi, nx, j.A, 2 * D, j.M + D, 2 * D);
            }
        }
        QK_PROF_END("vjp adjoint vectors");
        qk__vjp_poll(&j, 0);
        if (j.cancel) goto cancelled;
        QK_PROF_BEGIN("vjp sweeps");
        j.next = 0;
        qk__parallel(nt, qk__vjp_sweep_work, &j);
        QK_PROF_END("vjp sweeps");
        if (j.oom) { r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: out of host memory for the sweeps' scratch"); goto done; }
        if (j.cancel) goto cancelled;
        for (i = 0; i < map->n_weights; i++) {
            double sum = 0.0;
            for (t = 0; t < QK__VJP_CHUNKS; t++) sum += j.grad[(size_t)t * (size_t)map->n_weights + (size_t)i];
            d->grad_w[i] = sum;
        }
    }
    if (d->k_out)   /* K from the same S, once nothing can fail */
        for (i = 0; i < nx; i++)
            for (c = 0; c < cols; c++) d->k_out[i * cols + c] = Sr[i * cols + c] * Sr[i * cols + c] + Si[i * cols + c] * Si[i * cols + c];
    r = QK_OK;
    goto done;
cancelled:
    r = qk__fail(QK_ERROR_CANCELLED, "qk_gram_vjp: cancelled by the progress callback (nothing was written)");
done:
    QK_FREE(j.grad);
    QK_FREE(j.M);
    QK_FREE(j.L);
    QK_FREE(T2);
    QK_FREE(T1);
    QK_FREE(Wi);
    QK_FREE(Wr);
    QK_FREE(Si);
    QK_FREE(Sr);
    if (j.B != j.A) QK_FREE((void *)(uintptr_t)j.B);
    QK_FREE((void *)(uintptr_t)j.A);
    return r;
}

/* ---- the projected quantum kernel (Huang et al., Nat. Commun. 12, 2631 (2021)) ---- */
/* K(x, x') = exp(-gamma sum_k ||rho_k(x) - rho_k(x')||_F^2) over the one-qubit reduced density
   matrices rho_k. A 2x2 density matrix is (rho00, rho01) (rho11 = 1 - rho00, rho10 =
   conj(rho01)), so ||rho - sigma||_F^2 = 2 (d00^2 + |d01|^2): each sample's 3q features f =
   (rho00, Re rho01, Im rho01) per qubit make K = exp(-2 gamma |f - f'|^2). Statevector maps read
   the features off the state (bit k of an amplitude's index is qubit k); product maps off the
   qubits' 2-vectors, at any qubit count. */
typedef struct qk__pq_job {
    const qk_map *map;
    const double *x;
    int64_t n, next;
    int product, oom;
    double *f;                  /* n x 3q */
} qk__pq_job;

static void qk__pq_work(void *p, int thread)
{
    qk__pq_job *j = (qk__pq_job *)p;
    const qk_map *m = j->map;
    const int q = m->n_qubits;
    const int64_t D = j->product ? 0 : (int64_t)1 << q;
    double *buf = (double *)qk__malloc(sizeof(double) * (size_t)((j->product ? 4 * q : 2 * D) + m->n_ops + 1 + qk__diag_scratch(j->product ? 0 : q)));
    double *theta = buf ? buf + (j->product ? 4 * q : 2 * D) : NULL;
    int64_t s;
    QK__UNUSED(thread);
    if (!buf) { QK__STORE(&j->oom, 1); return; }
    while ((s = QK__FETCH_ADD(&j->next, 1)) < j->n) {
        const double *x = j->x + s * m->n_features;
        double *f = j->f + s * 3 * q;
        int k;
        if (j->product) {
            qk__product1(m, x, buf, theta);
            for (k = 0; k < q; k++) {   /* |u><u|: rho00 = |u0|^2, rho01 = u0 conj(u1) */
                const double *u = buf + 4 * k;
                f[3 * k] = u[QK__QV_RE0] * u[QK__QV_RE0] + u[QK__QV_IM0] * u[QK__QV_IM0];
                f[3 * k + 1] = u[QK__QV_RE0] * u[QK__QV_RE1] + u[QK__QV_IM0] * u[QK__QV_IM1];
                f[3 * k + 2] = u[QK__QV_IM0] * u[QK__QV_RE1] - u[QK__QV_RE0] * u[QK__QV_IM1];
            }
        } else {
            const double *re = buf, *im = buf + D;
            qk__state1(m, x, buf, buf + D, theta, NULL);
            for (k = 0; k < q; k++) {
                const int64_t b = (int64_t)1 << k;
                double r00 = 0, r01r = 0, r01i = 0;
                int64_t i;
                for (i = 0; i < D; i++) {
                    if (i & b) continue;
                    r00 += re[i] * re[i] + im[i] * im[i];
                    /* psi_i conj(psi_{i|b}) */
                    r01r += re[i] * re[i | b] + im[i] * im[i | b];
                    r01i += im[i] * re[i | b] - re[i] * im[i | b];
                }
                f[3 * k] = r00; f[3 * k + 1] = r01r; f[3 * k + 2] = r01i;
            }
        }
    }
    QK_FREE(buf);
}

static double *qk__pq_features(const qk_map *m, const double *x, int64_t n, int nt)
{
    qk__pq_job j;
    memset(&j, 0, sizeof j);
    j.map = m; j.x = x; j.n = n; j.product = m->cls == QK_CLASS_PRODUCT;
    j.f = (double *)qk__malloc(sizeof(double) * (size_t)(n * 3 * m->n_qubits));
    if (!j.f) return NULL;
    qk__parallel(nt < n ? nt : (int)n, qk__pq_work, &j);
    if (j.oom) { QK_FREE(j.f); return NULL; }
    return j.f;
}

QKDEF qk_result qk_gram_projected(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, double gamma)
{
    qk_result r;
    double *fx = NULL, *fy = NULL;
    int64_t i, c, cols, ld;
    int q, nt, k;
    if (!ctx || !map || !desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_projected: NULL %s", !ctx ? "ctx" : !map ? "map" : "desc");
    if (!(gamma > 0.0 && gamma < 1e300)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_projected: gamma must be finite and > 0 (got %g)", gamma);
    if (desc->output != QK_OUTPUT_HOST || !desc->out)
        return qk__fail(desc->output != QK_OUTPUT_HOST ? QK_ERROR_UNSUPPORTED : QK_ERROR_INVALID_ARGUMENT,
                        "qk_gram_projected: %s", desc->output != QK_OUTPUT_HOST ? "K goes to a host buffer (output HOST)" : "out is NULL");
    if (qk__map_is_states(map)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_projected: takes a feature map");
    q = map->n_qubits;
    if (map->cls != QK_CLASS_PRODUCT && q > QK_MAX_STATE_QUBITS)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "qk_gram_projected: an entangling map of %d qubits: the reduced density matrices come "
                        "from statevectors (at most %d qubits; product maps: any)", q, QK_MAX_STATE_QUBITS);
    r = qk__check_gram(ctx, map, desc);
    if (r != QK_OK) return r;
    cols = desc->y ? desc->n_y : desc->n_x;
    ld = desc->ld_out ? desc->ld_out : cols;
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
    fx = qk__pq_features(map, desc->x, desc->n_x, nt);
    if (fx && desc->y) fy = qk__pq_features(map, desc->y, desc->n_y, nt);
    if (!fx || (desc->y && !fy)) {
        QK_FREE(fx);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_projected: cannot allocate the reduced density matrices (%lld samples x %d qubits)",
                        (long long)(desc->n_x + (desc->y ? desc->n_y : 0)), q);
    }
    for (i = 0; i < desc->n_x; i++) {
        const double *a = fx + i * 3 * q;
        for (c = desc->y ? 0 : i; c < cols; c++) {
            const double *b = (desc->y ? fy : fx) + c * 3 * q;
            double d2 = 0, v;
            for (k = 0; k < 3 * q; k++) d2 += (a[k] - b[k]) * (a[k] - b[k]);
            v = exp(-2.0 * gamma * d2);
            if (desc->out_dtype == QK_F32) {
                ((float *)desc->out)[i * ld + c] = (float)v;
                if (!desc->y) ((float *)desc->out)[c * ld + i] = (float)v;
            } else {
                ((double *)desc->out)[i * ld + c] = v;
                if (!desc->y) ((double *)desc->out)[c * ld + i] = v;
            }
        }
    }
    QK_FREE(fx);
    QK_FREE(fy);
    return QK_OK;
}
