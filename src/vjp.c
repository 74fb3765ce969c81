#include "qk_internal.h"
/* >>vjp ---- qk_gram_vjp: the gradient of a loss of K for every weight (adjoint sweeps) ---- */
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

/* <a|b> of split complex vectors (re D | im D), D values */
QK__CONTRACT
static void qk__vjp_dot(const double *a, const double *b, int64_t D, double *re, double *im)
{
    double r0 = 0, r1 = 0, i0 = 0, i1 = 0;
    const double *ai = a + D, *bi = b + D;
    int64_t d = 0;
    for (; d + 1 < D; d += 2) {
        r0 += a[d] * b[d] + ai[d] * bi[d];
        i0 += a[d] * bi[d] - ai[d] * b[d];
        r1 += a[d + 1] * b[d + 1] + ai[d + 1] * bi[d + 1];
        i1 += a[d + 1] * bi[d + 1] - ai[d + 1] * b[d + 1];
    }
    for (; d < D; d++) {
        r0 += a[d] * b[d] + ai[d] * bi[d];
        i0 += a[d] * bi[d] - ai[d] * b[d];
    }
    *re = r0 + r1;
    *im = i0 + i1;
}

/* y += (wr + i wi) x, split complex vectors of D values */
QK__CONTRACT
static void qk__vjp_axpy(double wr, double wi, const double *x, double *y, int64_t D)
{
    const double *xi = x + D;
    double *yi = y + D;
    int64_t d;
    for (d = 0; d < D; d++) {
        y[d] += wr * x[d] - wi * xi[d];
        yi[d] += wr * xi[d] + wi * x[d];
    }
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
    double *grad;               /* n_threads x n_weights partial sums */
    int n_threads, oom;
    int64_t next;
} qk__vjp_job;

/* rows i of S (K(X,X): j >= i, mirrored below) */
static void qk__vjp_s_work(void *p, int thread)
{
    qk__vjp_job *j = (qk__vjp_job *)p;
    int64_t i;
    QK__UNUSED(thread);
    while ((i = QK__FETCH_ADD(&j->next, 1)) < j->nx) {
        int64_t c;
        for (c = j->sym ? i : 0; c < j->ny; c++) {
            double re, im;
            qk__vjp_dot(j->A + 2 * i * j->D, j->B + 2 * c * j->D, j->D, &re, &im);
            j->S[2 * (i * j->ny + c)] = re;
            j->S[2 * (i * j->ny + c) + 1] = im;
        }
    }
}

/* lam_i (and, K(X,Y), mu_j: rows nx .. nx + ny of the work) */
static void qk__vjp_l_work(void *p, int thread)
{
    qk__vjp_job *j = (qk__vjp_job *)p;
    const int64_t D = j->D, total = j->nx + (j->sym ? 0 : j->ny);
    int64_t r;
    QK__UNUSED(thread);
    while ((r = QK__FETCH_ADD(&j->next, 1)) < total) {
        if (r < j->nx) {
            double *l = j->L + 2 * r * D;
            int64_t c;
            memset(l, 0, sizeof(double) * (size_t)(2 * D));
            for (c = 0; c < j->ny; c++) {
                /* conj(S_rc) times G_rc (+ G_cr for K(X,X)) */
                double g = j->g[r * j->ld_g + c] + (j->sym ? j->g[c * j->ld_g + r] : 0.0);
                double sr = j->S[2 * (r * j->ny + c)], si = j->S[2 * (r * j->ny + c) + 1];
                if (g == 0.0) continue;
                qk__vjp_axpy(g * sr, -g * si, j->B + 2 * c * D, l, D);
            }
        } else {
            const int64_t c = r - j->nx;
            double *m = j->M + 2 * c * D;
            int64_t i;
            memset(m, 0, sizeof(double) * (size_t)(2 * D));
            for (i = 0; i < j->nx; i++) {
                double g = j->g[i * j->ld_g + c], sr = j->S[2 * (i * j->ny + c)], si = j->S[2 * (i * j->ny + c) + 1];
                if (g == 0.0) continue;
                qk__vjp_axpy(g * sr, g * si, j->A + 2 * i * D, m, D);
            }
        }
    }
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
    QK__UNUSED(thread);
    if (!s) { QK__STORE(&j->oom, 1); return; }
    while ((ch = QK__FETCH_ADD(&j->next, 1)) < QK__VJP_CHUNKS && !QK__LOAD(&j->oom)) {
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
    }
    QK_FREE(s);
}

QKDEF qk_result qk_gram_vjp(qk_ctx *ctx, const qk_map *map, const qk_vjp_desc *d)
{
    qk__vjp_job j;
    qk_result r;
    int64_t i, c, cols, D;
    int t, nt;
    double bytes;
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
    if (d->ld_g != 0 && d->ld_g < cols) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: ld_g %lld < columns %lld", (long long)d->ld_g, (long long)cols);
    memset(&j, 0, sizeof j);
    j.ld_g = d->ld_g ? d->ld_g : cols;
    for (i = 0; i < d->n_x; i++)
        for (c = 0; c < cols; c++)
            if (!isfinite(d->g[i * j.ld_g + c])) return qk__fail(QK_ERROR_NON_FINITE, "qk_gram_vjp: g[%lld][%lld] is not finite", (long long)i, (long long)c);
    D = (int64_t)1 << map->n_qubits;
    bytes = 8.0 * (2.0 * (double)D * (2.0 * (double)(d->n_x + (d->y ? d->n_y : 0))) + 2.0 * (double)d->n_x * (double)cols);
    if (ctx->desc.host_memory && bytes > (double)ctx->desc.host_memory)
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: the states, S and the adjoint vectors need %.3g GB, the host budget is %.3g GB "
                        "(the gradient keeps every state resident)", bytes * 1e-9, (double)ctx->desc.host_memory * 1e-9);
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : 1;
    j.map = map; j.x = d->x; j.y = d->y; j.nx = d->n_x; j.ny = cols; j.D = D; j.sym = d->y == NULL; j.g = d->g;
    j.n_threads = nt;
    j.A = qk__cpu_states(map, d->x, 0, d->n_x, QK_PATH_COMPLEX, nt, NULL);
    if (j.A && d->y) j.B = qk__cpu_states(map, d->y, 0, d->n_y, QK_PATH_COMPLEX, nt, NULL);
    else j.B = j.A;
    j.S = (double *)qk__malloc(sizeof(double) * (size_t)(2 * j.nx * j.ny));
    j.L = (double *)qk__malloc(sizeof(double) * (size_t)(2 * j.nx * D));
    if (!j.sym) j.M = (double *)qk__malloc(sizeof(double) * (size_t)(2 * j.ny * D));
    j.grad = (double *)qk__calloc((size_t)QK__VJP_CHUNKS * (size_t)(map->n_weights > 0 ? map->n_weights : 1), sizeof(double));
    if (!j.A || !j.B || !j.S || !j.L || (!j.sym && !j.M) || !j.grad) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: cannot allocate %.3g GB of host memory (states, S, adjoint vectors)", bytes * 1e-9);
        goto done;
    }
    QK_PROF_BEGIN("vjp S");
    j.next = 0;
    qk__parallel(nt < j.nx ? nt : (int)j.nx, qk__vjp_s_work, &j);
    QK_PROF_END("vjp S");
    if (j.sym)
        for (i = 0; i < j.nx; i++)
            for (c = 0; c < i; c++) {
                j.S[2 * (i * j.ny + c)] = j.S[2 * (c * j.ny + i)];
                j.S[2 * (i * j.ny + c) + 1] = -j.S[2 * (c * j.ny + i) + 1];
            }
    if (map->n_weights > 0) {
        QK_PROF_BEGIN("vjp adjoint vectors");
        j.next = 0;
        qk__parallel(nt, qk__vjp_l_work, &j);
        QK_PROF_END("vjp adjoint vectors");
        QK_PROF_BEGIN("vjp sweeps");
        j.next = 0;
        qk__parallel(nt, qk__vjp_sweep_work, &j);
        QK_PROF_END("vjp sweeps");
        if (j.oom) { r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: out of host memory for the sweeps' scratch"); goto done; }
        for (i = 0; i < map->n_weights; i++) {
            double s = 0.0;
            for (t = 0; t < QK__VJP_CHUNKS; t++) s += j.grad[(size_t)t * (size_t)map->n_weights + (size_t)i];
            d->grad_w[i] = s;
        }
    }
    if (d->k_out)   /* K from the same S, once nothing can fail */
        for (i = 0; i < j.nx; i++)
            for (c = 0; c < j.ny; c++) {
                double sr = j.S[2 * (i * j.ny + c)], si = j.S[2 * (i * j.ny + c) + 1];
                d->k_out[i * j.ny + c] = sr * sr + si * si;
            }
    r = QK_OK;
done:
    QK_FREE(j.grad);
    QK_FREE(j.M);
    QK_FREE(j.L);
    QK_FREE(j.S);
    if (j.B != j.A) QK_FREE((void *)(uintptr_t)j.B);
    QK_FREE((void *)(uintptr_t)j.A);
    return r;
}
