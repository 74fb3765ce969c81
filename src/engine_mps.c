#include "qk_internal.h"
/* >>mps ---- the MPS engine ---- */
#ifndef QK_NO_MPS   /* the engine (QK_NO_MPS compiles it out: the planner keeps the statevector) */

/* ---- dense linear algebra for the sweeps (column-major complex, interleaved re/im) ---- */
#define QK__RE(X, ld, i, j) (X)[2 * ((size_t)(i) + (size_t)(j) * (size_t)(ld))]
#define QK__IM(X, ld, i, j) (X)[2 * ((size_t)(i) + (size_t)(j) * (size_t)(ld)) + 1]

/* Column c of A (m rows, column-major) times H = I - beta v v^H, v zero above row j: rows j..m-1
   of the column change (the QR's reflectors applied to X, and to Q to form it). */
static void qk__mps_reflect(double *A, int m, const double *v, double beta, int j, int c)
{
    double wr = 0, wi = 0;
    int i;
    for (i = j; i < m; i++) { /* w = v^H a_c */
        wr += v[2 * i] * QK__RE(A, m, i, c) + v[2 * i + 1] * QK__IM(A, m, i, c);
        wi += v[2 * i] * QK__IM(A, m, i, c) - v[2 * i + 1] * QK__RE(A, m, i, c);
    }
    wr *= beta; wi *= beta;
    for (i = j; i < m; i++) {
        QK__RE(A, m, i, c) -= wr * v[2 * i] - wi * v[2 * i + 1];
        QK__IM(A, m, i, c) -= wr * v[2 * i + 1] + wi * v[2 * i];
    }
}

/* Householder QR of X (m x n), k <= min(m, n) steps. pivot: each step first swaps in the column of
   largest remaining norm (perm[j] = the original column now at j). On return R is X's upper k rows
   (zero below the diagonal), Q (m x k) has orthonormal columns, X P = Q R + (trailing block).
   Returns the trailing block's Frobenius norm: what keeping k columns drops. V: m x k scratch. */
static double qk__mps_qr(double *X, int m, int n, int k, int pivot, int *perm, double *Q, double *V, double *beta)
{
    int i, j, c;
    double tail = 0;
    for (j = 0; j < n; j++) perm[j] = j;
    for (j = 0; j < k; j++) {
        double nrm2 = 0, nrm, xr, xi, ax, pr, pim, *v = V + 2 * (size_t)j * (size_t)m;
        if (pivot) {
            int best = j;
            double bn = -1;
            for (c = j; c < n; c++) {
                double s2 = 0;
                for (i = j; i < m; i++) s2 += QK__RE(X, m, i, c) * QK__RE(X, m, i, c) + QK__IM(X, m, i, c) * QK__IM(X, m, i, c);
                if (s2 > bn) { bn = s2; best = c; }
            }
            if (best != j) {
                int t = perm[j]; perm[j] = perm[best]; perm[best] = t;
                for (i = 0; i < m; i++) {
                    double tr = QK__RE(X, m, i, j), ti = QK__IM(X, m, i, j);
                    QK__RE(X, m, i, j) = QK__RE(X, m, i, best); QK__IM(X, m, i, j) = QK__IM(X, m, i, best);
                    QK__RE(X, m, i, best) = tr; QK__IM(X, m, i, best) = ti;
                }
            }
        }
        for (i = j; i < m; i++) nrm2 += QK__RE(X, m, i, j) * QK__RE(X, m, i, j) + QK__IM(X, m, i, j) * QK__IM(X, m, i, j);
        memset(v, 0, sizeof(double) * 2 * (size_t)m);
        /* a column of norm below 1e-140 is zero to the state (a unit vector): no reflection. Its
           beta, 1 / (nrm (nrm + |x_j|)), would overflow to inf from nrm ~ 1e-154 on, and inf x 0
           made NaN MPS (silently NaN rows of K: zz(reps=1) at 12 qubits, bond 64) */
        if (nrm2 < 1e-280) { beta[j] = 0; continue; }
        nrm = sqrt(nrm2);
        xr = QK__RE(X, m, j, j); xi = QK__IM(X, m, j, j);
        ax = sqrt(xr * xr + xi * xi);
        pr = ax > 0 ? xr / ax : 1.0; pim = ax > 0 ? xi / ax : 0.0;
        /* H = I - beta v v^H maps x to alpha e_j, alpha = -phase(x_j) ||x|| */
        v[2 * j] = xr + pr * nrm; v[2 * j + 1] = xi + pim * nrm;
        for (i = j + 1; i < m; i++) { v[2 * i] = QK__RE(X, m, i, j); v[2 * i + 1] = QK__IM(X, m, i, j); }
        beta[j] = 1.0 / (nrm * (nrm + ax));
        for (c = j + 1; c < n; c++) qk__mps_reflect(X, m, v, beta[j], j, c);
        QK__RE(X, m, j, j) = -pr * nrm; QK__IM(X, m, j, j) = -pim * nrm;
        for (i = j + 1; i < m; i++) { QK__RE(X, m, i, j) = 0; QK__IM(X, m, i, j) = 0; }
    }
    for (c = k; c < n; c++)
        for (i = k; i < m; i++) tail += QK__RE(X, m, i, c) * QK__RE(X, m, i, c) + QK__IM(X, m, i, c) * QK__IM(X, m, i, c);
    /* Q = H_0 ... H_{k-1} [I_k; 0] */
    memset(Q, 0, sizeof(double) * 2 * (size_t)m * (size_t)k);
    for (j = 0; j < k; j++) QK__RE(Q, m, j, j) = 1;
    for (j = k - 1; j >= 0; j--) {
        const double *v = V + 2 * (size_t)j * (size_t)m;
        if (beta[j] == 0) continue;
        for (c = j; c < k; c++) qk__mps_reflect(Q, m, v, beta[j], j, c);   /* columns < j of H_{j+1..} e are zero in rows >= j */
    }
    return sqrt(tail);
}

/* ---- building one sample's MPS ---- */
/* Work space of one thread: site s holds [dim[s]][2][dim[s+1]] complex, row-major, in a slot of
   capacity 2D[s] x 2 x 2D[s+1] (a bond at most doubles before it is compressed back to its bound). */
typedef struct qk__mps_work {
    double *buf, *tmp, *X, *Q, *V, *beta, *theta;
    int64_t *slot;      /* q: offset of site s in buf */
    int *dim, *bound, *perm;
    int lo, hi;         /* sites not known orthonormal since the last compression (lo < 0: none) */
    double discarded;   /* largest norm dropped by a compression (rounding) */
    int trunc;          /* truncation (prog max_bond / cutoff): SVD steps instead of exact ones */
    double cutoff;
    double angle;       /* this sample: sum over truncations of asin(sqrt(w_k)), w_k the share of
                           the weight dropped (the Fubini-Study distance it moved, at most) */
    double norm2;       /* this sample: the norm^2 left, prod (1 - w_k) */
} qk__mps_work;

static void qk__mps_work_free(qk__mps_work *w)
{
    if (!w) return;
    QK_FREE(w->buf); QK_FREE(w->tmp); QK_FREE(w->X); QK_FREE(w->Q); QK_FREE(w->V); QK_FREE(w->beta);
    QK_FREE(w->theta); QK_FREE(w->slot); QK_FREE(w->dim); QK_FREE(w->bound); QK_FREE(w->perm);
    memset(w, 0, sizeof *w);
}

static int qk__mps_work_init(qk__mps_work *w, const qk__mps_prog *p, const qk_map *m)
{
    int q = p->q, s, dmax = 1;
    int64_t tot = 0, smax = 0;
    size_t mn;
    memset(w, 0, sizeof *w);
    w->slot = (int64_t *)qk__malloc(sizeof(int64_t) * (size_t)q);
    w->dim = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    w->bound = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    w->theta = (double *)qk__malloc(sizeof(double) * (size_t)(m->n_ops + 1));
    if (!w->slot || !w->dim || !w->bound || !w->theta) return 0;
    for (s = 0; s < q; s++) {
        int64_t c = (int64_t)2 * p->D[s] * 2 * 2 * p->D[s + 1] * 2;   /* doubles */
        w->slot[s] = tot;
        tot += c;
        if (c > smax) smax = c;
    }
    for (s = 0; s <= q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    /* QR operands: at most (2 * 2dmax) x (2dmax) complex */
    mn = (size_t)4 * dmax * 2 * dmax;
    w->buf = (double *)qk__malloc(sizeof(double) * (size_t)tot);
    w->tmp = (double *)qk__malloc(sizeof(double) * (size_t)smax);
    w->X = (double *)qk__malloc(sizeof(double) * 2 * mn);
    w->Q = (double *)qk__malloc(sizeof(double) * 2 * mn);
    w->V = (double *)qk__malloc(sizeof(double) * 2 * mn);
    w->beta = (double *)qk__malloc(sizeof(double) * (size_t)(4 * dmax + 1));
    w->perm = (int *)qk__malloc(sizeof(int) * (size_t)(4 * dmax + 1));
    w->trunc = p->max_bond > 0 || p->cutoff > 0;
    w->cutoff = p->cutoff;
    return w->buf && w->tmp && w->X && w->Q && w->V && w->beta && w->perm;
}

#define QK__SITE(w, s) ((w)->buf + (w)->slot[s])

/* A[l][a][r] <- sum_b U[a][b] A[l][b][r]; U row-major complex (8 doubles) */
static void qk__mps_apply1(double *A, int dl, int dr, const double *U)
{
    int l, r;
    for (l = 0; l < dl; l++)
        for (r = 0; r < dr; r++) {
            double *a0 = A + 2 * ((size_t)(l * 2) * dr + r), *a1 = A + 2 * ((size_t)(l * 2 + 1) * dr + r);
            double r0 = a0[0], i0 = a0[1], r1 = a1[0], i1 = a1[1];
            a0[0] = U[0] * r0 - U[1] * i0 + U[2] * r1 - U[3] * i1;
            a0[1] = U[0] * i0 + U[1] * r0 + U[2] * i1 + U[3] * r1;
            a1[0] = U[4] * r0 - U[5] * i0 + U[6] * r1 - U[7] * i1;
            a1[1] = U[4] * i0 + U[5] * r0 + U[6] * i1 + U[7] * r1;
        }
}

/* The one-qubit matrix of op o at angle t (qk__u1); 0: identity (skip). */
static int qk__mps_u1(const qk_op *o, double t, const double *x, double *U)
{
    return qk__u1(o->kind, t, o->kind == QK_OP_BASIS && qk__basis_one(x[o->angle.x0]), U);
}

/* The two-qubit step as sum_t P_t (x) G_t (P_t on the op's q0): G[t] row-major complex 2x2. */
static void qk__mps_g2(const qk__mps_prog *p, const qk_map *m, const qk__mps_step *st, const double *theta, double G[2][8])
{
    double d0r = 1, d0i = 0, d1r = 1, d1i = 0;
    QK__UNUSED(p);
    memset(G, 0, sizeof(double) * 16);
    switch (st->gate) {
    case QK__MPS_CNOT:  /* I, X */
        G[0][0] = 1; G[0][6] = 1; G[1][2] = 1; G[1][4] = 1;
        return;
    case QK__MPS_CZ:    /* I, Z */
        G[0][0] = 1; G[0][6] = 1; G[1][0] = 1; G[1][6] = -1;
        return;
    case QK__MPS_RZZ: { /* e^{-it/2} where the bits agree, e^{it/2} where they differ */
        double c = cos(0.5 * theta[st->op]), s = sin(0.5 * theta[st->op]);
        G[0][0] = c; G[0][1] = -s; G[0][6] = c; G[0][7] = s;
        G[1][0] = c; G[1][1] = s; G[1][6] = c; G[1][7] = -s;
        return;
    }
    case QK__MPS_PARITY: default: {
        /* CX(a,b) D(b) CX(a,b), D = diag(d0, d1): diag(d0, d1) on b where a = 0, diag(d1, d0) where a = 1 */
        const qk_op *o = &m->ops[st->op];
        double t = theta[st->op], c = cos(0.5 * t), s = sin(0.5 * t);
        if (o->kind == QK_OP_P) { d1r = cos(t); d1i = sin(t); }
        else if (o->kind == QK_OP_RZ) { d0r = c; d0i = -s; d1r = c; d1i = s; }
        else { d1r = -1; } /* Z */
        G[0][0] = d0r; G[0][1] = d0i; G[0][6] = d1r; G[0][7] = d1i;
        G[1][0] = d1r; G[1][1] = d1i; G[1][6] = d0r; G[1][7] = d0i;
        return;
    }
    }
}

/* Applies sum_t P_t (x) G_t to sites s0 < s1 as an MPO of bond 2 (bonds s0+1 .. s1 double). */
static void qk__mps_apply2(qk__mps_work *w, const qk__mps_step *st, double G[2][8])
{
    int s, l, a, b, r, t;
    for (s = st->s0; s <= st->s1; s++) {
        int dl = w->dim[s], dr = w->dim[s + 1];
        double *A = QK__SITE(w, s), *T = w->tmp;
        int nl = s == st->s0 ? dl : 2 * dl, nr = s == st->s1 ? dr : 2 * dr;
        memset(T, 0, sizeof(double) * 2 * (size_t)nl * 2 * (size_t)nr);
        for (t = 0; t < 2; t++) {
            const int end = s == st->s0 || s == st->s1;
            const int proj = end && ((s == st->s0) == (st->proj_left != 0));
            const int lo = s == st->s0 ? 0 : t * dl, ro = s == st->s1 ? 0 : t * dr;
            for (l = 0; l < dl; l++)
                for (a = 0; a < 2; a++)
                    for (r = 0; r < dr; r++) {
                        double *o = T + 2 * (((size_t)(lo + l) * 2 + a) * nr + ro + r), vr = 0, vi = 0;
                        if (!end || proj) {
                            if (end && a != t) continue;
                            vr = A[2 * (((size_t)l * 2 + a) * dr + r)];
                            vi = A[2 * (((size_t)l * 2 + a) * dr + r) + 1];
                        } else {
                            for (b = 0; b < 2; b++) {
                                double gr = G[t][2 * (a * 2 + b)], gi = G[t][2 * (a * 2 + b) + 1];
                                double xr = A[2 * (((size_t)l * 2 + b) * dr + r)], xi = A[2 * (((size_t)l * 2 + b) * dr + r) + 1];
                                vr += gr * xr - gi * xi;
                                vi += gr * xi + gi * xr;
                            }
                        }
                        o[0] = vr; o[1] = vi;
                    }
        }
        memcpy(A, T, sizeof(double) * 2 * (size_t)nl * 2 * (size_t)nr);
    }
    for (b = st->s0 + 1; b <= st->s1; b++) w->dim[b] *= 2;
}

/* Site s left-orthonormal by QR; R moves into site s+1 (the bond may shrink to min(2 dl, dr)). */
static void qk__mps_qr_right(qk__mps_work *w, int s)
{
    int dl = w->dim[s], dr = w->dim[s + 1], d2 = w->dim[s + 2], m = 2 * dl, n = dr, k = m < n ? m : n;
    int i, c, t, a, r;
    double *A = QK__SITE(w, s), *B = QK__SITE(w, s + 1), *X = w->X, *Q = w->Q;
    for (i = 0; i < m; i++)
        for (c = 0; c < n; c++) { QK__RE(X, m, i, c) = A[2 * ((size_t)i * n + c)]; QK__IM(X, m, i, c) = A[2 * ((size_t)i * n + c) + 1]; }
    qk__mps_qr(X, m, n, k, 0, w->perm, Q, w->V, w->beta);
    for (i = 0; i < m; i++)
        for (t = 0; t < k; t++) { A[2 * ((size_t)i * k + t)] = QK__RE(Q, m, i, t); A[2 * ((size_t)i * k + t) + 1] = QK__IM(Q, m, i, t); }
    /* B'[t][a][r] = sum_{c >= t} R[t][c] B[c][a][r] */
    memset(w->tmp, 0, sizeof(double) * 2 * (size_t)k * 2 * (size_t)d2);
    for (t = 0; t < k; t++)
        for (c = t; c < n; c++) {
            double rr = QK__RE(X, m, t, c), ri = QK__IM(X, m, t, c);
            const double *src = B + 2 * (size_t)c * 2 * d2;
            double *dst = w->tmp + 2 * (size_t)t * 2 * d2;
            if (rr == 0 && ri == 0) continue;
            for (a = 0; a < 2; a++)
                for (r = 0; r < d2; r++) {
                    size_t e = 2 * ((size_t)a * d2 + r);
                    dst[e] += rr * src[e] - ri * src[e + 1];
                    dst[e + 1] += rr * src[e + 1] + ri * src[e];
                }
        }
    memcpy(B, w->tmp, sizeof(double) * 2 * (size_t)k * 2 * (size_t)d2);
    w->dim[s + 1] = k;
}

/* Site s right-orthonormal by a pivoted QR of its conjugate transpose, keeping at most kmax rows;
   the factor moves into site s-1. Returns the norm dropped (zero but for rounding when kmax is
   at least the bond's Schmidt rank and the sites right of s are right-orthonormal). */
static double qk__mps_trunc_left(qk__mps_work *w, int s, int kmax)
{
    int dl = w->dim[s], dr = w->dim[s + 1], d0 = w->dim[s - 1], m = 2 * dr, n = dl, k, i, j, t, l;
    double *A = QK__SITE(w, s), *P = QK__SITE(w, s - 1), *X = w->X, *Q = w->Q, disc;
    k = m < n ? m : n;
    if (kmax < k) k = kmax;
    /* X = M^H, M = A as dl x 2dr row-major: X column-major is A's storage, conjugated */
    for (i = 0; i < 2 * m * n; i += 2) { X[i] = A[i]; X[i + 1] = -A[i + 1]; }
    disc = qk__mps_qr(X, m, n, k, 1, w->perm, Q, w->V, w->beta);
    /* A'[t][c] = conj(Q[c][t]) */
    for (t = 0; t < k; t++)
        for (i = 0; i < m; i++) { A[2 * ((size_t)t * m + i)] = QK__RE(Q, m, i, t); A[2 * ((size_t)t * m + i) + 1] = -QK__IM(Q, m, i, t); }
    /* W[perm[j]][t] = conj(R[t][j]); P'[(l', a)][t] = sum_l P[(l', a)][l] W[l][t] */
    memset(w->tmp, 0, sizeof(double) * 2 * (size_t)d0 * 2 * (size_t)k);
    for (j = 0; j < n; j++) {
        int pl = w->perm[j];
        for (t = 0; t < k && t <= j; t++) {
            double wr = QK__RE(X, m, t, j), wi = -QK__IM(X, m, t, j);
            if (wr == 0 && wi == 0) continue;
            for (l = 0; l < 2 * d0; l++) {
                const double *src = P + 2 * ((size_t)l * n + pl);
                double *dst = w->tmp + 2 * ((size_t)l * k + t);
                dst[0] += src[0] * wr - src[1] * wi;
                dst[1] += src[0] * wi + src[1] * wr;
            }
        }
    }
    memcpy(P, w->tmp, sizeof(double) * 2 * (size_t)d0 * 2 * (size_t)k);
    w->dim[s] = k;
    return disc;
}

/* ---- truncation (qk_gram_desc.mps_max_bond / mps_cutoff) ---- */
/* Eigen-decomposition of the Hermitian n x n matrix G (row-major complex, destroyed) by cyclic
   Jacobi rotations: G's diagonal ends as the eigenvalues, V (row-major) holds the eigenvectors as
   columns. A rotation on (p, q) is J = diag(1, e^{-i phi}) [[c, s], [-s, c]], phi the phase of
   G[p][q]: J^H G J has a zero (p, q) entry (the real Jacobi rotation of the phase-rotated block). */
static void qk__mps_jacobi(double *G, double *V, int n)
{
    int sweep, p, q, k;
    memset(V, 0, sizeof(double) * 2 * (size_t)n * (size_t)n);
    for (p = 0; p < n; p++) V[2 * ((size_t)p * n + p)] = 1;
    for (sweep = 0; sweep < 64; sweep++) {
        double off = 0, dg = 0;
        for (p = 0; p < n; p++) {
            dg += G[2 * ((size_t)p * n + p)] * G[2 * ((size_t)p * n + p)];
            for (q = p + 1; q < n; q++) off += G[2 * ((size_t)p * n + q)] * G[2 * ((size_t)p * n + q)] + G[2 * ((size_t)p * n + q) + 1] * G[2 * ((size_t)p * n + q) + 1];
        }
        if (off == 0 || off <= 1e-32 * dg) break;
        for (p = 0; p < n; p++)
            for (q = p + 1; q < n; q++) {
                double hr = G[2 * ((size_t)p * n + q)], hi = G[2 * ((size_t)p * n + q) + 1], h = sqrt(hr * hr + hi * hi);
                double app, aqq, zeta, t, c, sn, er, ei;
                if (h == 0) continue;
                app = G[2 * ((size_t)p * n + p)]; aqq = G[2 * ((size_t)q * n + q)];
                zeta = (aqq - app) / (2 * h);
                t = (zeta >= 0 ? 1.0 : -1.0) / (fabs(zeta) + sqrt(1 + zeta * zeta));
                c = 1 / sqrt(1 + t * t); sn = t * c;
                er = hr / h; ei = hi / h;   /* e^{i phi} */
                for (k = 0; k < n; k++) {   /* G <- G J, V <- V J: col p = c p - s e^{-i phi} q, col q = s p + c e^{-i phi} q */
                    double *gp = G + 2 * ((size_t)k * n + p), *gq = G + 2 * ((size_t)k * n + q);
                    double *vp = V + 2 * ((size_t)k * n + p), *vq = V + 2 * ((size_t)k * n + q);
                    double xr = er * gq[0] + ei * gq[1], xi = er * gq[1] - ei * gq[0];   /* e^{-i phi} gq */
                    double yr = er * vq[0] + ei * vq[1], yi = er * vq[1] - ei * vq[0];
                    double pr = gp[0], pi = gp[1], ur = vp[0], ui = vp[1];
                    gp[0] = c * pr - sn * xr; gp[1] = c * pi - sn * xi;
                    gq[0] = sn * pr + c * xr; gq[1] = sn * pi + c * xi;
                    vp[0] = c * ur - sn * yr; vp[1] = c * ui - sn * yi;
                    vq[0] = sn * ur + c * yr; vq[1] = sn * ui + c * yi;
                }
                for (k = 0; k < n; k++) {   /* G <- J^H G: row p = c p - s e^{i phi} q, row q = s p + c e^{i phi} q */
                    double *gp = G + 2 * ((size_t)p * n + k), *gq = G + 2 * ((size_t)q * n + k);
                    double xr = er * gq[0] - ei * gq[1], xi = er * gq[1] + ei * gq[0];   /* e^{i phi} gq */
                    double pr = gp[0], pi = gp[1];
                    gp[0] = c * pr - sn * xr; gp[1] = c * pi - sn * xi;
                    gq[0] = sn * pr + c * xr; gq[1] = sn * pi + c * xi;
                }
                G[2 * ((size_t)p * n + q)] = G[2 * ((size_t)p * n + q) + 1] = 0;
                G[2 * ((size_t)q * n + p)] = G[2 * ((size_t)q * n + p) + 1] = 0;
                G[2 * ((size_t)p * n + p) + 1] = G[2 * ((size_t)q * n + q) + 1] = 0;
            }
    }
}

/* A truncating step at the bond between sites s-1 and s, site s the orthogonality center (sites
   left of it left-orthonormal, right of it right-orthonormal): with M = site s (dl x 2dr), the
   Schmidt values squared are the eigenvalues of M M^H; the bond keeps the eigenvectors U_k of the
   k largest (k <= kmax, and fewer while the dropped share stays <= cutoff): M <- U_k^H M, site
   s-1 <- site s-1 U_k, the orthogonal projection of the state on the kept Schmidt vectors (the
   best rank-k approximation). Then site s is made right-orthonormal (qk__mps_trunc_left, which
   drops nothing more). Returns the dropped share of the weight, sum of dropped / sum of all. */
static double qk__mps_trunc_svd(qk__mps_work *w, int s, int kmax)
{
    const int dl = w->dim[s], dr = w->dim[s + 1], d0 = w->dim[s - 1], n2 = 2 * dr;
    double *A = QK__SITE(w, s), *P = QK__SITE(w, s - 1), *G = w->X, *V = w->Q, *ev = w->beta, *M2 = w->V;
    int *idx = w->perm, p, q, c, k, t, l;
    double tot = 0, drop = 0;
    for (p = 0; p < dl; p++)   /* G = M M^H */
        for (q = p; q < dl; q++) {
            double gr = 0, gi = 0;
            for (c = 0; c < n2; c++) {
                double ar = A[2 * ((size_t)p * n2 + c)], ai = A[2 * ((size_t)p * n2 + c) + 1];
                double br = A[2 * ((size_t)q * n2 + c)], bi = A[2 * ((size_t)q * n2 + c) + 1];
                gr += ar * br + ai * bi;
                gi += ai * br - ar * bi;
            }
            G[2 * ((size_t)p * dl + q)] = gr; G[2 * ((size_t)p * dl + q) + 1] = gi;
            G[2 * ((size_t)q * dl + p)] = gr; G[2 * ((size_t)q * dl + p) + 1] = -gi;
        }
    qk__mps_jacobi(G, V, dl);
    for (p = 0; p < dl; p++) {   /* eigenvalues, largest first (insertion sort: dl <= 2 QK_MPS_MAX_BOND) */
        double v = G[2 * ((size_t)p * dl + p)];
        ev[p] = v > 0 ? v : 0;
        tot += ev[p];
        for (q = p; q > 0 && ev[idx[q - 1]] < v; q--) idx[q] = idx[q - 1];
        idx[q] = p;
    }
    k = dl < n2 ? dl : n2;
    if (kmax > 0 && kmax < k) k = kmax;
    for (t = k; t < dl; t++) drop += ev[idx[t]];
    while (k > 1 && w->cutoff > 0 && drop + ev[idx[k - 1]] <= w->cutoff * tot) drop += ev[idx[--k]];
    /* M2 = U_k^H M (k x 2dr), then site s <- M2 */
    for (t = 0; t < k; t++)
        for (c = 0; c < n2; c++) {
            double xr = 0, xi = 0;
            for (l = 0; l < dl; l++) {
                double ur = V[2 * ((size_t)l * dl + idx[t])], ui = V[2 * ((size_t)l * dl + idx[t]) + 1];
                double ar = A[2 * ((size_t)l * n2 + c)], ai = A[2 * ((size_t)l * n2 + c) + 1];
                xr += ur * ar + ui * ai;
                xi += ur * ai - ui * ar;
            }
            M2[2 * ((size_t)t * n2 + c)] = xr; M2[2 * ((size_t)t * n2 + c) + 1] = xi;
        }
    memcpy(A, M2, sizeof(double) * 2 * (size_t)k * (size_t)n2);
    /* site s-1 [(l', a)][l] <- sum_l P[(l', a)][l] U[l][t] */
    for (p = 0; p < 2 * d0; p++)
        for (t = 0; t < k; t++) {
            double xr = 0, xi = 0;
            for (l = 0; l < dl; l++) {
                double ur = V[2 * ((size_t)l * dl + idx[t])], ui = V[2 * ((size_t)l * dl + idx[t]) + 1];
                double ar = P[2 * ((size_t)p * dl + l)], ai = P[2 * ((size_t)p * dl + l) + 1];
                xr += ar * ur - ai * ui;
                xi += ar * ui + ai * ur;
            }
            w->tmp[2 * ((size_t)p * k + t)] = xr; w->tmp[2 * ((size_t)p * k + t) + 1] = xi;
        }
    memcpy(P, w->tmp, sizeof(double) * 2 * (size_t)(2 * d0) * (size_t)k);
    w->dim[s] = k;
    (void)qk__mps_trunc_left(w, s, k);
    return tot > 0 ? drop / tot : 0.0;
}

/* The sites lo..hi back to canonical form with every bond within its running bound: left-
   orthonormal up to hi by QR, then right to left by truncating pivoted QR (exact) or by the SVD
   step (truncation: each drop is a projection, recorded in angle and norm2); the center ends at lo.
   poll (may be NULL): a tick per site (a sweep may span the whole chain); on a cancel it stops
   half way (the build is discarded). */
static void qk__mps_compress(qk__mps_work *w, qk__poll *poll)
{
    int s;
    for (s = w->lo; s < w->hi; s++) {
        qk__mps_qr_right(w, s);
        if (poll && qk__poll_tick(poll, 8 * (int64_t)w->dim[s] * w->dim[s] * w->dim[s + 1])) return;
    }
    for (s = w->hi; s > w->lo; s--) {
        if (poll && qk__poll_tick(poll, 8 * (int64_t)w->dim[s] * w->dim[s + 1] * w->dim[s + 1])) return;
        if (w->trunc) {
            double wk = qk__mps_trunc_svd(w, s, w->bound[s]);
            if (wk > 0) {
                w->angle += asin(sqrt(wk < 1 ? wk : 1.0));
                w->norm2 *= 1 - wk;
            }
        } else {
            double d = qk__mps_trunc_left(w, s, w->bound[s]);
            if (d > w->discarded) w->discarded = d;
        }
    }
    w->hi = w->lo;
}

/* One sample's MPS into lane `lane` of group `out` (zero-filled beforehand). Returns eps, the
   bound on the infidelity 1 - |<psi|psi~>|^2 of the truncated (renormalised) state: the
   truncations are projections, each moving the state by the angle asin(sqrt(w_k)) at most, and
   the gates are unitary, so the angle to the exact state is at most theta = sum_k asin(sqrt(w_k))
   (the triangle inequality of the Fubini-Study distance) and eps = sin^2(min(theta, pi/2)).
   Exact builds return 0. poll (may be NULL): a tick per step, counting (2c)^3 flops per site a
   two-site gate or a compression sweeps (c: the largest bond it meets); on a cancel the build
   stops half way (the caller discards it). */
static double qk__mps_build1(const qk__mps_prog *p, const qk_map *m, const double *x, qk__mps_work *w, double *out, int lane,
                             qk__poll *poll)
{
    int q = p->q, s, k, b, l, a, r;
    double scale = 1.0;
    w->angle = 0;
    w->norm2 = 1;
    for (s = 0; s <= q; s++) { w->dim[s] = 1; w->bound[s] = 1; }
    for (s = 0; s < q; s++) { double *A = QK__SITE(w, s); A[0] = 1; A[1] = 0; A[2] = 0; A[3] = 0; }
    w->lo = w->hi = -1;
    qk_map_angles(m, x, w->theta);
    for (k = 0; k < p->n_steps; k++) {
        const qk__mps_step *st = &p->steps[k];
        int64_t work;
        if (st->kind == 1) {
            double U[8];
            if (qk__mps_u1(&m->ops[st->op], w->theta[st->op], x, U))
                qk__mps_apply1(QK__SITE(w, st->s0), w->dim[st->s0], w->dim[st->s0 + 1], U);
            work = 8 * (int64_t)w->dim[st->s0] * w->dim[st->s0 + 1];
        } else {
            double G[2][8];
            int over = 0, c = 1, sites = st->s1 - st->s0 + 1;
            qk__mps_g2(p, m, st, w->theta, G);
            qk__mps_apply2(w, st, G);
            if (w->lo < 0) { w->lo = st->s0; w->hi = st->s1; }
            else { if (st->s0 < w->lo) w->lo = st->s0; if (st->s1 > w->hi) w->hi = st->s1; }
            for (b = st->s0 + 1; b <= st->s1; b++) {
                w->bound[b] = p->bounds[st->b + (b - st->s0 - 1)];
                if (w->dim[b] > w->bound[b]) over = 1;
            }
            if (poll) {
                for (b = st->s0; b <= st->s1 + 1; b++) if (w->dim[b] > c) c = w->dim[b];
                if (over) sites += w->hi - w->lo + 1;
            }
            if (over) qk__mps_compress(w, poll);
            work = 8 * (int64_t)sites * c * c * c;
        }
        if (poll && qk__poll_tick(poll, work)) return 0.0;
    }
    if (w->trunc && w->norm2 > 0 && w->norm2 < 1) scale = 1.0 / sqrt(w->norm2);   /* renormalise (site 0) */
    for (s = 0; s < q; s++) {
        const double *A = QK__SITE(w, s);
        const double f = s == 0 ? scale : 1.0;
        int dl = w->dim[s], dr = w->dim[s + 1], Dr = p->D[s + 1];
        double *o = out + p->off[s] + lane;
        QK_ASSERT(dl <= p->D[s] && dr <= Dr);
        for (l = 0; l < dl; l++)
            for (a = 0; a < 2; a++)
                for (r = 0; r < dr; r++) {
                    size_t e = ((size_t)l * 2 + a) * Dr + r;
                    o[e * 2 * QK__NJ] = f * A[2 * (((size_t)l * 2 + a) * dr + r)];
                    o[e * 2 * QK__NJ + QK__NJ] = f * A[2 * (((size_t)l * 2 + a) * dr + r) + 1];
                }
    }
    if (w->angle <= 0) return 0.0;
    return w->angle >= 1.5707963267948966 ? 1.0 : sin(w->angle) * sin(w->angle);
}

/* Given MPS (qk_gram_mps_states): sample i of side (0: A, 1: B) into lane `lane` of group `out`
   (zero-filled beforehand), its bonds padded to the program's (the largest of every sample), every
   site times the sample's scale (1, or ||psi||^(-1/q) with normalize). The tensors were checked
   when the map was made (gram.c). */
static void qk__mps_given1(const qk__mps_prog *p, const qk__mpsmap *mm, int side, int64_t i, double *out, int lane)
{
    const qk_mps_states_desc *in = &mm->in;
    const int q = p->q, type = (int)in->type;
    const void *const *sites = (side ? in->b : in->a) + (size_t)i * (size_t)q;
    const int *bond = (side ? in->b_bonds : in->a_bonds) + (size_t)i * (size_t)(q + 1);
    const double f = mm->scale[(side ? in->n_a : 0) + i];
    int s, l, a, r;
    for (s = 0; s < q; s++) {
        const int dl = bond[s], dr = bond[s + 1], Dr = p->D[s + 1];
        double *o = out + p->off[s] + lane;
        for (l = 0; l < dl; l++)
            for (a = 0; a < 2; a++)
                for (r = 0; r < dr; r++) {
                    const int64_t k = in->layout == QK_MPS_LRP ? ((int64_t)l * dr + r) * 2 + a : ((int64_t)l * 2 + a) * dr + r;
                    const size_t e = ((size_t)l * 2 + a) * Dr + r;
                    double re, im;
                    qk__state_amp(sites[s], type, k, &re, &im);
                    o[e * 2 * QK__NJ] = f * re;
                    o[e * 2 * QK__NJ + QK__NJ] = f * im;
                }
    }
}

/* ---- states of many samples (lane layout), on the engine's threads ---- */
typedef struct qk__mps_build_job {
    const qk__mps_prog *p;
    const qk_map *m;
    const double *x;
    int64_t n, groups, next;
    double *out;
    double *eps;        /* NULL or n: per sample, qk__mps_build1's eps */
    int oom;
    double discarded[256];
    struct qk__gram_job *job;   /* NULL, or the job whose progress and cancel to poll */
} qk__mps_build_job;

static void qk__mps_build_work(void *arg, int thread)
{
    qk__mps_build_job *j = (qk__mps_build_job *)arg;
    qk__mps_work w;
    qk__poll poll;
    int64_t g;
    qk__poll_init(&poll, j->job, thread);
    if (j->p->given) memset(&w, 0, sizeof w);   /* packing needs no work space */
    else if (!qk__mps_work_init(&w, j->p, j->m)) { qk__mps_work_free(&w); QK__STORE(&j->oom, 1); return; }
    while ((g = QK__FETCH_ADD(&j->next, 1)) < j->groups) {
        int lane;
        size_t z;
        if (QK__LOAD(&j->oom)) break;
        /* its padding stays zero; zeroed in pieces, polled between (a group of a wide map of
           large bond is a GB) */
        for (z = 0; z < (size_t)j->p->group; z += (size_t)QK__POLL_WORK) {
            size_t c = (size_t)j->p->group - z < (size_t)QK__POLL_WORK ? (size_t)j->p->group - z : (size_t)QK__POLL_WORK;
            if (qk__poll_tick(&poll, (int64_t)c)) break;
            memset(j->out + g * j->p->group + z, 0, sizeof(double) * c);
        }
        if (z < (size_t)j->p->group) break;
        for (lane = 0; lane < QK__NJ && g * QK__NJ + lane < j->n; lane++) {
            double e;
            if (j->p->given) {   /* given MPS: packed; x says the side (qk__mpsmap.side) */
                const qk__mpsmap *mm = (const qk__mpsmap *)(const void *)j->m;
                qk__mps_given1(j->p, mm, j->x == (const double *)(const void *)&mm->side[1], g * QK__NJ + lane, j->out + g * j->p->group, lane);
                if (j->eps) j->eps[g * QK__NJ + lane] = 0.0;
                continue;
            }
            e = qk__mps_build1(j->p, j->m, j->x + (g * QK__NJ + lane) * j->m->n_features, &w, j->out + g * j->p->group, lane,
                                      j->job ? &poll : NULL);
            if (j->eps) j->eps[g * QK__NJ + lane] = e;
        }
    }
    if (thread < 256) j->discarded[thread] = w.discarded;
    qk__mps_work_free(&w);
}

/* The MPS of n samples in the lane layout (groups of QK__NJ, the last zero-padded); NULL with the
   error set when memory runs out. discarded (may be NULL): the largest norm a compression dropped;
   eps (may be NULL): n values, each sample's truncation bound (qk__mps_build1). job (may be
   NULL): the job polled meanwhile; where it cancels, the MPS are left half built. */
QK__PRIV double *qk__mps_states(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int n_threads,
                                double *discarded, double *eps, struct qk__gram_job *job)
{
    qk__mps_build_job j;
    double *out;
    int t;
    memset(&j, 0, sizeof j);
    j.groups = (n + QK__NJ - 1) / QK__NJ;
    if ((double)j.groups * (double)p->group * 8.0 > 9.0e18) { qk__set_error("mps: %lld states overflow", (long long)n); return NULL; }
    /* each group is zeroed by its builder (not here: ~0.5 s per GB on one thread, and no poll) */
    out = (double *)qk__malloc(sizeof(double) * (size_t)(j.groups * p->group));
    if (!out) {
        qk__set_error("mps: cannot allocate %.3g GB of host memory for %lld MPS", (double)j.groups * (double)p->group * 8e-9, (long long)n);
        return NULL;
    }
    j.p = p; j.m = m; j.x = x; j.n = n; j.out = out; j.eps = eps; j.job = job;
    if (n_threads > 256) n_threads = 256;
    QK_PROF_BEGIN("mps states");
    qk__parallel((int64_t)n_threads < j.groups ? n_threads : (int)j.groups, qk__mps_build_work, &j);
    QK_PROF_END("mps states");
    if (j.oom) { QK_FREE(out); qk__set_error("mps: out of host memory for the build work space"); return NULL; }
    if (discarded) {
        *discarded = 0;
        for (t = 0; t < 256; t++) if (j.discarded[t] > *discarded) *discarded = j.discarded[t];
    }
    return out;
}

/* ---- overlaps: a tile of K by transfer matrices ---- */
/* Per site, for one row sample (scalars A at stride 2 * QK__NJ, lane `lane`) against a group of
   QK__NJ column samples (vectors B): T = E B (vector x vector), E' = A^H T (scalar x vector).
   E: dl x dl, T: dl x 2dr, E': dr x dr vectors of [QK__NJ re | QK__NJ im]. */
#if defined(QK__VEC)
/* dr a multiple of 4 (every inner site of bond >= 4): the accumulators stay in registers, KB
   complex vectors of T over l', 4 of E' over (l, a). The 8 lanes go in slices of one hardware
   vector (W doubles: 8 with AVX-512, 4 with AVX2, 2 with SSE2), each slice over the whole sum, so
   2 KB + 4 vectors fit the registers (KB = 8 with AVX-512's 32, 4 with 16); each lane sums its
   terms in the same order whatever the slice, so the result depends only on FMA contraction (the
   instruction set: generic SSE2 has none). Where QK__DISPATCH, also compiled for AVX2 + FMA and
   AVX-512F, the job's qk__cpu_isa chooses (cpu_gram.c). Measured against the generic loop
   (qk__mps_site) and across builds: docs/benchmarks.md ("The MPS path's site kernel"). */
#define QK__MPS_SITE4_DEFINE(NAME, ATTR, VT, W, KB)                                                 \
    QK__CONTRACT ATTR static void NAME(const double *A, const double *B, int dl, int dr, const double *E, double *T, \
                                       double *En)                                                  \
    {                                                                                               \
        const int n2 = 2 * dr;                                                                      \
        int l, lp, k0, kk, la, r, r0, h;                                                            \
        VT z;                                                                                       \
        memset(&z, 0, sizeof z);                                                                    \
        for (l = 0; l < dl; l++)                                                                    \
            for (k0 = 0; k0 < n2; k0 += (KB))                                                       \
                for (h = 0; h < QK__NJ; h += (W)) {                                                 \
                    VT tr[KB], ti[KB];                                                              \
                    for (kk = 0; kk < (KB); kk++) { tr[kk] = z; ti[kk] = z; }                       \
                    for (lp = 0; lp < dl; lp++) {                                                   \
                        VT er, ei;                                                                  \
                        const double *bb = B + ((size_t)lp * n2 + k0) * 2 * QK__NJ + h;             \
                        const double *e = E + ((size_t)l * dl + lp) * 2 * QK__NJ + h;               \
                        memcpy(&er, e, sizeof er); memcpy(&ei, e + QK__NJ, sizeof ei);              \
                        for (kk = 0; kk < (KB); kk++) {                                             \
                            VT br, bi;                                                              \
                            memcpy(&br, bb + kk * 2 * QK__NJ, sizeof br);                           \
                            memcpy(&bi, bb + kk * 2 * QK__NJ + QK__NJ, sizeof bi);                  \
                            tr[kk] += er * br; tr[kk] -= ei * bi;                                   \
                            ti[kk] += er * bi; ti[kk] += ei * br;                                   \
                        }                                                                           \
                    }                                                                               \
                    for (kk = 0; kk < (KB); kk++) {   /* through whole vectors (QK__ST8 says why) */ \
                        double *t = T + ((size_t)l * n2 + k0 + kk) * 2 * QK__NJ + h;                \
                        VT sr = tr[kk], si = ti[kk];                                                \
                        memcpy(t, &sr, sizeof sr); memcpy(t + QK__NJ, &si, sizeof si);              \
                    }                                                                               \
                }                                                                                   \
        for (r = 0; r < dr; r++)                                                                    \
            for (r0 = 0; r0 < dr; r0 += 4)                                                          \
                for (h = 0; h < QK__NJ; h += (W)) {                                                 \
                    VT xr[4], xi[4];                                                                \
                    for (kk = 0; kk < 4; kk++) { xr[kk] = z; xi[kk] = z; }                          \
                    for (la = 0; la < 2 * dl; la++) {                                               \
                        const double cr = A[((size_t)la * dr + r) * 2 * QK__NJ];                    \
                        const double ci = A[((size_t)la * dr + r) * 2 * QK__NJ + QK__NJ];           \
                        const double *t = T + ((size_t)la * dr + r0) * 2 * QK__NJ + h;              \
                        for (kk = 0; kk < 4; kk++) {   /* += conj(c) t */                           \
                            VT vr, vi;                                                              \
                            memcpy(&vr, t + kk * 2 * QK__NJ, sizeof vr);                            \
                            memcpy(&vi, t + kk * 2 * QK__NJ + QK__NJ, sizeof vi);                   \
                            xr[kk] += cr * vr; xr[kk] += ci * vi;                                   \
                            xi[kk] += cr * vi; xi[kk] -= ci * vr;                                   \
                        }                                                                           \
                    }                                                                               \
                    for (kk = 0; kk < 4; kk++) {                                                    \
                        double *e = En + ((size_t)r * dr + r0 + kk) * 2 * QK__NJ + h;               \
                        VT sr = xr[kk], si = xi[kk];                                                \
                        memcpy(e, &sr, sizeof sr); memcpy(e + QK__NJ, &si, sizeof si);              \
                    }                                                                               \
                }                                                                                   \
    }

/* the build's own (qk__v4 / qk__v2: qk_internal.h), and where QK__DISPATCH, AVX2 + FMA and AVX-512F */
#if defined(__AVX512F__)
QK__MPS_SITE4_DEFINE(qk__mps_site4_own, , qk__v8, 8, 8)
#elif defined(__AVX__) || defined(__aarch64__)
QK__MPS_SITE4_DEFINE(qk__mps_site4_own, , qk__v4, 4, 4)
#else
QK__MPS_SITE4_DEFINE(qk__mps_site4_own, , qk__v2, 2, 4)
#endif
#if defined(QK__DISPATCH)
QK__MPS_SITE4_DEFINE(qk__mps_site4_avx2, __attribute__((target("avx2,fma"))), qk__v4, 4, 4)
QK__MPS_SITE4_DEFINE(qk__mps_site4_avx512, __attribute__((target("avx512f,fma"))), qk__v8, 8, 8)
#endif
#undef QK__MPS_SITE4_DEFINE

static void qk__mps_site4(int isa, const double *A, const double *B, int dl, int dr, const double *E, double *T, double *En)
{
#if defined(QK__DISPATCH)
    if (isa == QK__ISA_AVX512) { qk__mps_site4_avx512(A, B, dl, dr, E, T, En); return; }
    if (isa == QK__ISA_AVX2) { qk__mps_site4_avx2(A, B, dl, dr, E, T, En); return; }
#endif
    (void)isa;
    qk__mps_site4_own(A, B, dl, dr, E, T, En);
}

QK__CONTRACT
static void qk__mps_site(int isa, const double *A, const double *B, int dl, int dr, const double *E, double *T, double *En)
{
    const int n2 = 2 * dr;
    int l, lp, k, la, r, rp;
    qk__v8 z;
    if (dr % 4 == 0) { qk__mps_site4(isa, A, B, dl, dr, E, T, En); return; }
    memset(&z, 0, sizeof z);
    for (l = 0; l < dl; l++) {
        double *t = T + (size_t)l * n2 * 2 * QK__NJ;
        for (k = 0; k < n2; k++) { memcpy(t + k * 2 * QK__NJ, &z, sizeof z); memcpy(t + k * 2 * QK__NJ + QK__NJ, &z, sizeof z); }
        for (lp = 0; lp < dl; lp++) {
            qk__v8 er, ei;
            const double *bb = B + (size_t)lp * n2 * 2 * QK__NJ;
            QK__LD8(er, E + ((size_t)l * dl + lp) * 2 * QK__NJ);
            QK__LD8(ei, E + ((size_t)l * dl + lp) * 2 * QK__NJ + QK__NJ);
            for (k = 0; k < n2; k++) {
                qk__v8 br, bi, tr, ti;
                QK__LD8(br, bb + k * 2 * QK__NJ); QK__LD8(bi, bb + k * 2 * QK__NJ + QK__NJ);
                QK__LD8(tr, t + k * 2 * QK__NJ); QK__LD8(ti, t + k * 2 * QK__NJ + QK__NJ);
                tr += er * br; tr -= ei * bi;
                ti += er * bi; ti += ei * br;
                memcpy(t + k * 2 * QK__NJ, &tr, sizeof tr); memcpy(t + k * 2 * QK__NJ + QK__NJ, &ti, sizeof ti);
            }
        }
    }
    for (k = 0; k < dr * dr; k++) { memcpy(En + k * 2 * QK__NJ, &z, sizeof z); memcpy(En + k * 2 * QK__NJ + QK__NJ, &z, sizeof z); }
    for (la = 0; la < 2 * dl; la++)
        for (r = 0; r < dr; r++) {
            const double cr = A[((size_t)la * dr + r) * 2 * QK__NJ], ci = A[((size_t)la * dr + r) * 2 * QK__NJ + QK__NJ];
            const double *t = T + (size_t)la * dr * 2 * QK__NJ;
            double *e = En + (size_t)r * dr * 2 * QK__NJ;
            if (cr == 0 && ci == 0) continue;   /* padding */
            for (rp = 0; rp < dr; rp++) {  /* e += conj(c) t */
                qk__v8 tr, ti, xr, xi;
                QK__LD8(tr, t + rp * 2 * QK__NJ); QK__LD8(ti, t + rp * 2 * QK__NJ + QK__NJ);
                QK__LD8(xr, e + rp * 2 * QK__NJ); QK__LD8(xi, e + rp * 2 * QK__NJ + QK__NJ);
                xr += cr * tr; xr += ci * ti;
                xi += cr * ti; xi -= ci * tr;
                memcpy(e + rp * 2 * QK__NJ, &xr, sizeof xr); memcpy(e + rp * 2 * QK__NJ + QK__NJ, &xi, sizeof xi);
            }
        }
}
#else
static void qk__mps_site(int isa, const double *A, const double *B, int dl, int dr, const double *E, double *T, double *En)
{
    const int n2 = 2 * dr;
    int l, lp, k, la, r, rp, v;
    (void)isa;
    memset(T, 0, sizeof(double) * (size_t)dl * n2 * 2 * QK__NJ);
    for (l = 0; l < dl; l++)
        for (lp = 0; lp < dl; lp++) {
            const double *e = E + ((size_t)l * dl + lp) * 2 * QK__NJ, *bb = B + (size_t)lp * n2 * 2 * QK__NJ;
            double *t = T + (size_t)l * n2 * 2 * QK__NJ;
            for (k = 0; k < n2; k++)
                for (v = 0; v < QK__NJ; v++) {
                    double er = e[v], ei = e[QK__NJ + v], br = bb[k * 2 * QK__NJ + v], bi = bb[k * 2 * QK__NJ + QK__NJ + v];
                    t[k * 2 * QK__NJ + v] += er * br - ei * bi;
                    t[k * 2 * QK__NJ + QK__NJ + v] += er * bi + ei * br;
                }
        }
    memset(En, 0, sizeof(double) * (size_t)dr * dr * 2 * QK__NJ);
    for (la = 0; la < 2 * dl; la++)
        for (r = 0; r < dr; r++) {
            const double cr = A[((size_t)la * dr + r) * 2 * QK__NJ], ci = A[((size_t)la * dr + r) * 2 * QK__NJ + QK__NJ];
            const double *t = T + (size_t)la * dr * 2 * QK__NJ;
            double *e = En + (size_t)r * dr * 2 * QK__NJ;
            if (cr == 0 && ci == 0) continue;
            for (rp = 0; rp < dr; rp++)
                for (v = 0; v < QK__NJ; v++) {
                    double tr = t[rp * 2 * QK__NJ + v], ti = t[rp * 2 * QK__NJ + QK__NJ + v];
                    e[rp * 2 * QK__NJ + v] += cr * tr + ci * ti;
                    e[rp * 2 * QK__NJ + QK__NJ + v] += cr * ti - ci * tr;
                }
        }
}
#endif

/* Rows of a tile sharing each column group's site block (kept in L1 while they pass it). */
static int qk__mps_rows(const qk__mps_prog *p)
{
    int s, dmax = 1;
    for (s = 0; s <= p->q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    return dmax <= 8 ? 8 : dmax <= 16 ? 4 : 1;
}

/* Per-thread scratch (doubles) of qk__mps_tile. */
static size_t qk__mps_scratch(const qk__mps_prog *p)
{
    int s, dmax = 1;
    for (s = 0; s <= p->q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    return ((size_t)2 * qk__mps_rows(p) * dmax * dmax + (size_t)2 * dmax * dmax) * 2 * QK__NJ;
}

/* Work between two polls of the job's progress and cancel inside qk__mps_tile, counted per row
   as the sum over sites of dl dr (dl + dr) (1/128 of the flops of a row against a column group):
   a poll every site from bond 64 up, every few sites at small bonds. */
#define QK__MPS_POLL_WORK ((int64_t)1 << 18)

/* K of the tile rows [i0, i0+m) x cols [j0, j0+n) into kt (ld QK__T); j->A, j->B in the lane layout
   (j0 is a multiple of QK__T, so column groups are whole). Symmetric diagonal tiles skip the
   column groups wholly below the diagonal (qk__gram_work mirrors them). */
static void qk__mps_tile(const qk__gram_job *j, int64_t i0, int64_t j0, int64_t m, int64_t n, double *scratch, double *kt)
{
    const qk__mps_prog *p = (const qk__mps_prog *)j->mps;
    const int R = qk__mps_rows(p), q = p->q;
    const int diag = j->symmetric && i0 == j0;
    int dmax = 1, s, rr, v;
    int64_t cb, rb, work = 0;
    double *E0, *E1, *T;
    for (s = 0; s <= q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    E0 = scratch;
    E1 = E0 + (size_t)R * dmax * dmax * 2 * QK__NJ;
    T = E1 + (size_t)R * dmax * dmax * 2 * QK__NJ;
    for (cb = 0; cb < n; cb += QK__NJ) {
        const double *Bg = j->B + ((j0 + cb) / QK__NJ) * p->group;
        for (rb = 0; rb < m; rb += R) {
            const int nr = m - rb < R ? (int)(m - rb) : R;
            const size_t es = (size_t)dmax * dmax * 2 * QK__NJ;
            double *Ec = E0, *En = E1, *sw;
            if (diag && cb + QK__NJ - 1 < rb) continue;
            for (rr = 0; rr < nr; rr++) {   /* E = 1 */
                memset(Ec + rr * es, 0, sizeof(double) * 2 * QK__NJ);
                for (v = 0; v < QK__NJ; v++) Ec[rr * es + v] = 1.0;
            }
            for (s = 0; s < q; s++) {
                for (rr = 0; rr < nr; rr++) {
                    const int64_t i = i0 + rb + rr;
                    const double *A = j->A + (i / QK__NJ) * p->group + p->off[s] + (i % QK__NJ);
                    qk__mps_site(j->isa, A, Bg + p->off[s], p->D[s], p->D[s + 1], Ec + rr * es, T, En + rr * es);
                    if (rr == nr - 1) { sw = Ec; Ec = En; En = sw; }
                }
                /* a cancel inside the chain: a pair costs about 128 sum_s D_s D_s+1 (D_s + D_s+1)
                   flops, long for a wide map of a large bond (the tile is then left unfinished;
                   the job reports the cancel) */
                work += (int64_t)nr * p->D[s] * p->D[s + 1] * (p->D[s] + p->D[s + 1]);
                if (work >= QK__MPS_POLL_WORK) {
                    work = 0;
                    qk__job_poll((qk__gram_job *)j);
                    if (QK__LOAD(&j->cancel)) return;
                }
            }
            for (rr = 0; rr < nr; rr++)
                for (v = 0; v < QK__NJ && cb + v < n; v++) {
                    double re = Ec[rr * es + v], im = Ec[rr * es + QK__NJ + v];
                    kt[(rb + rr) * QK__T + cb + v] = re * re + im * im;
                }
        }
    }
}
#else /* QK_NO_MPS: the program analysis (mps_prog.c) stays; nothing builds or contracts an MPS */
static int qk__mps_rows(const qk__mps_prog *p) { (void)p; return 1; }
/* the GPU engine's MPS path (run_cuda.c) calls it, never planned here */
QK__PRIV double *qk__mps_states(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int n_threads,
                                double *discarded, double *eps, struct qk__gram_job *job)
{
    (void)p; (void)m; (void)x; (void)n; (void)n_threads; (void)discarded; (void)eps; (void)job;
    qk__set_error("mps: the MPS engine is compiled out (QK_NO_MPS)");
    return NULL;
}
#endif /* QK_NO_MPS */

/* ---- planning and running ---- */
/* Host memory (bytes) where the system says, else 0 (unknown). */
static double qk__host_ram(void)
{
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_PHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
    if (pages > 0 && ps > 0) return (double)pages * (double)ps;
#endif
    return 0.0;
}

/* The MPS path's cost against the statevector's, per pair, in the CPU engine's measured time per
   flop: the blocked statevector Gram runs nearer the FMA peak than the transfer-matrix chain
   (short vectors, more loads per flop); 1.7 puts the switch between 10 and 11 qubits, where it was
   measured (docs/benchmarks.md, 'Figures behind the code's constants'). */
#ifndef QK__MPS_FLOP_RATIO
#define QK__MPS_FLOP_RATIO 1.7
#endif

/* QK__MPS_GPU_FLOP_RATIO: in qk_internal.h (the GPU planner uses it) */

/* The path choice for an entangled map, shared by the CPU and GPU planners: MPS when asked for,
   or (default) when the map is entangled, MPS-able and the statevector is impossible
   (q > QK_MAX_STATE_QUBITS, or sv_ok == 0: it does not fit), would not fit in half the memory
   (sv_big), or costs more per pair:
     statevector  8 * 2^q flops per pair (complex; real maps 2 * 2^q)
     MPS          ratio * sum_s 8 D_s D_{s+1} (D_s + D_{s+1})  (bonds capped at mps_max_bond)
   *use = 1: the MPS path, prog filled (the caller frees it); 0: the statevector, prog empty.
   Errors: a forced MPS on a product, dense or too-entangled map; a statevector beyond 30 qubits. */
QK__PRIV qk_result qk__mps_check_trunc(const qk_gram_desc *d)
{
    if (d->mps_max_bond < 0 || d->mps_max_bond > QK_MPS_MAX_BOND)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: mps_max_bond must be 0 (exact) or 1..%d (QK_MPS_MAX_BOND), got %d",
                        QK_MPS_MAX_BOND, d->mps_max_bond);
    if (!(d->mps_cutoff >= 0.0 && d->mps_cutoff < 1.0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: mps_cutoff must be 0 (none) or in (0, 1), got %g", d->mps_cutoff);
    return QK_OK;
}

QK__PRIV qk_result qk__mps_decide(const qk_map *map, const qk_gram_desc *desc, double ratio, int sv_ok, int sv_big,
                                  qk__mps_prog *prog, int *use)
{
    const qk_path req = desc->path;
    const int q = map->n_qubits;
    qk_result r;
    int ok;
    *use = 0;
    memset(prog, 0, sizeof *prog);
    r = qk__mps_check_trunc(desc);
    if (r != QK_OK) return r;
    if ((int)req < (int)QK_PATH_DEFAULT || (int)req > (int)QK_PATH_MPS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: unknown path %d", (int)req);
    if (map->cls == QK_CLASS_PRODUCT) {
        if (req == QK_PATH_MPS)
            return qk__fail(QK_ERROR_UNSUPPORTED, "path mps: the map is a product state (no entangling op): it takes the analytic path");
        return QK_OK;
    }
    if (req != QK_PATH_DEFAULT && req != QK_PATH_MPS) {
        if (q > QK_MAX_STATE_QUBITS)
            return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "path statevector: %d qubits exceed the state limit %d (the MPS path takes local maps beyond it)", q, QK_MAX_STATE_QUBITS);
        return QK_OK;
    }
#ifdef QK_NO_MPS
    QK__UNUSED(ratio); QK__UNUSED(sv_ok); QK__UNUSED(sv_big); QK__UNUSED(ok);
    if (req == QK_PATH_MPS) return qk__fail(QK_ERROR_UNSUPPORTED, "path mps: the MPS path is compiled out (QK_NO_MPS)");
    if (q > QK_MAX_STATE_QUBITS)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%d qubits exceed the statevector limit %d, and the MPS path, which takes local maps "
                        "beyond it, is compiled out (QK_NO_MPS)", q, QK_MAX_STATE_QUBITS);
    return QK_OK;
#else
    r = qk__mps_prog_make_t(map, desc->mps_max_bond, desc->mps_cutoff, prog);
    if (r != QK_OK) return r;
    ok = !prog->dense && prog->chi <= QK_MPS_MAX_BOND;
    if (!ok) {
        char why[224];
        if (prog->dense) snprintf(why, sizeof why, "amplitude encoding makes a dense state (no MPS)");
        else snprintf(why, sizeof why, "its bond dimension bound reaches %s%d at bond %d (qubit order %s), beyond QK_MPS_MAX_BOND = %d: "
                      "the gates are not local enough (mps_max_bond truncates)", prog->chi >= QK__MPS_SAT ? ">= " : "", prog->chi, prog->chi_bond,
                      prog->folded ? "folded" : "natural", QK_MPS_MAX_BOND);
        qk__mps_prog_free(prog);
        if (req == QK_PATH_MPS) return qk__fail(QK_ERROR_UNSUPPORTED, "path mps: %s", why);
        if (q > QK_MAX_STATE_QUBITS)
            return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "%d qubits exceed the statevector limit %d, and the MPS path cannot take this map: %s",
                            q, QK_MAX_STATE_QUBITS, why);
        return QK_OK;
    }
    if (req == QK_PATH_MPS || q > QK_MAX_STATE_QUBITS || !sv_ok || sv_big) *use = 1;
    else {
        const double sv = (map->cls == QK_CLASS_REAL ? 2.0 : 8.0) * ldexp(1.0, q);
        *use = ratio * prog->pair_flops < sv;
    }
    if (!*use) qk__mps_prog_free(prog);
    return QK_OK;
#endif /* QK_NO_MPS */
}

/* qk__mps_decide with the CPU engine's ratio (the statevector always possible, up to its limit):
   the path qk_gram's CPU plan takes, for the callers that build states themselves
   (qk_gram_projected). */
QK__PRIV qk_result qk__mps_decide_cpu(const qk_map *map, const qk_gram_desc *desc, qk__mps_prog *prog, int *use)
{
    return qk__mps_decide(map, desc, QK__MPS_FLOP_RATIO, 1, 0, prog, use);
}

/* The plan's MPS fields from a program. */
static void qk__mps_plan_fields(const qk__mps_prog *prog, qk_plan *p)
{
    p->path = QK_PATH_MPS;
    p->mps_bond = prog->chi;
    p->mps_exact_bond = prog->exact_chi;
    p->mps_truncate = prog->max_bond > 0 || prog->cutoff > 0;
    p->mps_span = prog->span;
    p->mps_pair_flops = prog->pair_flops;
    p->mps_given = prog->given;
}

/* The CPU planner's path choice (qk__plan_cpu filled p for the map's own path): qk__mps_decide
   with the CPU's measured ratio, the statevector too big beyond half of the host memory. keep
   (may be NULL): an MPS plan's program is handed over there (the caller frees it) for the
   engine, which then does not build it again; untouched otherwise. */
QK__PRIV qk_result qk__mps_plan(const qk_map *map, const qk_gram_desc *desc, qk_plan *p, qk__mps_prog *keep)
{
    qk__mps_prog prog;
    const double ram = qk__host_ram();
    int use = 0;
    qk_result r = qk__mps_decide(map, desc, QK__MPS_FLOP_RATIO, 1, ram > 0 && (double)p->bytes_states > 0.5 * ram, &prog, &use);
    if (r != QK_OK || !use) return r;
    {
        const int64_t gx = (desc->n_x + QK__NJ - 1) / QK__NJ, gy = desc->y ? (desc->n_y + QK__NJ - 1) / QK__NJ : 0;
        qk__mps_plan_fields(&prog, p);
        p->bytes_states = (size_t)((double)(gx + gy) * (double)prog.group * 8.0);
        p->bytes_total = p->bytes_states;
        snprintf(p->config, sizeof p->config, "mps %s, transfer matrices %d rows x %d lanes",
                 prog.given ? "given tensors (site s = qubit s)" : prog.folded ? "folded qubit order" : "natural qubit order", qk__mps_rows(&prog), QK__NJ);
    }
    if (keep) *keep = prog;
    else qk__mps_prog_free(&prog);
    return QK_OK;
}

/* The bond the GPU engine stores and contracts (qk_cuda.cu): 2 or 4 for its register kernel,
   else the bond itself (its warp kernel). */
QK__PRIV int qk__mps_gpu_chi(int chi) { return chi <= 2 ? 2 : chi <= 4 ? 4 : chi; }

/* Device bytes of one sample's MPS on the GPU engine: q sites of 2 chi^2 complex values. */
static double qk__mps_gpu_sample_bytes(int q, int chi, int d64)
{
    const int c = qk__mps_gpu_chi(chi);
    return (double)q * 2.0 * c * c * 2.0 * (d64 ? 8.0 : 4.0);
}


/* The job's fields of a GPU plan (both paths): output, sizes, symmetry, two streams. */
QK__PRIV void qk__plan_job_fields(qk_plan *p, const qk_map *map, const qk_gram_desc *desc, qk_dtype od, int64_t nx, int64_t ny, int sym)
{
    p->out_dtype = od;
    p->output = desc->output;
    p->n_qubits = map->n_qubits;
    p->n_x = nx;
    p->n_y = ny;
    p->symmetric = sym;
    p->n_streams = 2;
}
/* A zeroed CUDA plan with the job's fields. */
static void qk__plan_job(qk_plan *p, const qk_map *map, const qk_gram_desc *desc, qk_precision prec, qk_dtype od, int64_t nx,
                         int64_t ny, int sym)
{
    memset(p, 0, sizeof *p);
    p->backend = QK_BACKEND_CUDA;
    p->precision = prec;
    qk__plan_job_fields(p, map, desc, od, nx, ny, sym);
}

/* The GPU plan of the MPS path (prog from qk__mps_decide). Device memory, all counted:
     MPS      (n_x + n_y) samples x q sites x 2 chi^2 complex, in the compute precision
     K        DEVICE output: the caller's; host outputs: all of K resident when K(X,X) fits beside
              the MPS (the pairs j >= i, mirrored), else a ring of two slabs of full rows
   Pinned host staging: one slab. Host memory while planning a run: the packed MPS in doubles
   (twice the fp32 device bytes) and the builder's lane layout. */
QK__PRIV qk_result qk__plan_cuda_mps(const qk_device_info *info, double vram_fraction, const qk_map *map,
                                     const qk_gram_desc *desc, const qk__mps_prog *prog, qk_plan *p)
{
    const int sym = desc->y == NULL;
    const int64_t nx = desc->n_x, ny = sym ? desc->n_x : desc->n_y;
    /* the default and auto: fp32 (the MPS kernels have no tensor-core mode), fp64 where tol asks
       for less than fp32's MPS bound; the stated bound is the one the MPS GPU suite holds:
       2e-6 + 5e-7 q chi in float, 1e-10 in double (plus float K's rounding) */
    const int autom = desc->precision == QK_PRECISION_DEFAULT || desc->precision == QK_PRECISION_AUTO;
    const double b32 = 2e-6 + 5e-7 * (double)prog->q * (double)prog->chi;
    const qk_precision prec = autom ? (desc->tol > 0.0 && desc->tol < b32 ? QK_PRECISION_FP64 : QK_PRECISION_FP32) : desc->precision;
    const int d64 = prec == QK_PRECISION_FP64 || prec == QK_PRECISION_FP32X3;
    const qk_dtype od = desc->out_dtype ? desc->out_dtype : (prec == QK_PRECISION_FP64 ? QK_F64 : QK_F32);
    const double ob = od == QK_F64 ? 8.0 : 4.0;
    const double budget = (vram_fraction > 0 ? vram_fraction : 0.85) * (double)info->free_bytes;
    const int chi = qk__mps_gpu_chi(prog->chi);
    const double st = (double)(nx + (sym ? 0 : ny)) * qk__mps_gpu_sample_bytes(prog->q, prog->chi, d64);
    double kb = 0;
    int64_t slab, cap;
    qk__plan_job(p, map, desc, prec, od, nx, ny, sym);
    p->error_bound = d64 ? 1e-10 + (od == QK_F32 ? 1e-7 : 0.0) : b32;
    if (autom) {
        char g1[32], g2[32];
        p->tol = desc->tol > 0.0 ? desc->tol : b32;
        snprintf(p->precision_note, sizeof p->precision_note, "auto: %s, the MPS path's %s (bound %s, tol %s%s)",
                 qk_precision_name(prec), d64 ? "double kernels" : "float kernels", qk__fmt_g(g1, sizeof g1, p->error_bound, 2),
                 qk__fmt_g(g2, sizeof g2, p->tol, 2), desc->tol > 0.0 ? "" : ": default, fp32's MPS bound");
    }
    p->bulk_states = 1;
    p->tile_m = 8;
    p->tile_n = 32;
    p->bytes_budget = (size_t)budget;
    snprintf(p->device_name, sizeof p->device_name, "%s", info->name);
    qk__mps_plan_fields(prog, p);
    if (chi > 4) {
        const double smem = 3.0 * chi * chi * 2.0 * (d64 ? 8.0 : 4.0);
        if (info->smem_per_block_optin && smem > (double)info->smem_per_block_optin)
            return qk__fail(QK_ERROR_UNSUPPORTED, "path mps on the GPU: bond %d in %s needs %.0f bytes of shared memory per pair, the device allows %zu per block "
                            "(ask fp32, or mps_max_bond to truncate)", chi, d64 ? "fp64" : "fp32", smem, info->smem_per_block_optin);
    }
    /* slabs: ~64 MB of K, and at most ~25 ms of work (the register kernel at an estimated 10 T
       counted flops/s) so that progress and cancel come often; whole blocks of 32 rows */
    slab = (int64_t)(64.0 * 1048576.0 / ((double)ny * ob));
    cap = (int64_t)(25e-3 * 1e13 / (prog->pair_flops * (double)ny));
    if (slab > cap) slab = cap;
    slab = slab / 32 * 32;
    if (slab < 32) slab = 32;
    if (slab > nx) slab = nx;
    p->slab_rows = slab;
    if (desc->output == QK_OUTPUT_DEVICE) kb = 0;
    else {
        const double whole = (double)nx * (double)ny * ob;
        p->k_resident = sym && st + whole <= budget;
        kb = p->k_resident ? whole : 2.0 * (double)slab * (double)ny * ob;
        p->bytes_staging = (size_t)((double)slab * (double)ny * ob);
    }
    p->bytes_states = (size_t)st;
    p->bytes_out = (size_t)kb;
    p->bytes_total = (size_t)(st + kb);
    if (st + kb > budget)
        return qk__fail(QK_ERROR_DEVICE_OUT_OF_MEMORY, "plan: the MPS path needs %.3g GB of device memory (MPS %.3g GB, K %.3g GB), budget %.3g GB",
                        (st + kb) * 1e-9, st * 1e-9, kb * 1e-9, budget * 1e-9);
    if (chi <= 4)
        snprintf(p->config, sizeof p->config, "mps gpu %s order, register kernel chi %d, 8x32 pairs/block, %s%s",
                 prog->folded ? "folded" : "natural", chi, d64 ? "fp64" : "fp32",
                 prec != QK_PRECISION_FP64 && prec != QK_PRECISION_FP32 ? " (closest)" : "");
    else
        snprintf(p->config, sizeof p->config, "mps gpu %s order, warp per pair, chi %d, %s%s",
                 prog->folded ? "folded" : "natural", chi, d64 ? "fp64" : "fp32",
                 prec != QK_PRECISION_FP64 && prec != QK_PRECISION_FP32 ? " (closest)" : "");
    return QK_OK;
}

/* VRAM estimator of the MPS path: the largest n such that K(X,X) of n samples of `map` keeps its
   MPS resident on the device within half the budget (as qk_max_samples for statevectors), at the
   bond the map needs (max_bond > 0: capped). 0 when the map has no MPS. */
QKDEF int64_t qk_max_samples_mps(const qk_device_info *info, double vram_fraction, const qk_map *map,
                                 qk_precision precision, int max_bond)
{
    qk__mps_prog prog;
    double budget, per;
    int chi;
    if (!info || !info->present || !map || max_bond < 0 || max_bond > QK_MPS_MAX_BOND) return 0;
#ifdef QK_NO_MPS
    return 0;   /* no MPS path in this build */
#endif
    if (qk__mps_prog_make_t(map, max_bond, 0.0, &prog) != QK_OK) return 0;
    chi = prog.dense ? QK__MPS_SAT : prog.chi;
    qk__mps_prog_free(&prog);
    if (chi > QK_MPS_MAX_BOND) return 0;
    budget = (vram_fraction > 0 && vram_fraction <= 1 ? vram_fraction : 0.85) * (double)info->free_bytes;
    per = qk__mps_gpu_sample_bytes(map->n_qubits, chi, precision == QK_PRECISION_FP64 || precision == QK_PRECISION_FP32X3);
    return (int64_t)floor(0.5 * budget / per);
}

/* The MPS program of a plan on the MPS path: the planner's (planned, not NULL: qk_gram hands
   over the one it decided with) or, for a plan made elsewhere (tests, qk_plan_make's plan run
   later), built again from the map into *own (freed by the caller, zeroed when unused); *out
   points at the one to use. */
QK__PRIV qk_result qk__mps_prog_of(const qk__mps_prog *planned, const qk_map *map, const qk_gram_desc *desc, qk__mps_prog *own,
                                 const qk__mps_prog **out)
{
    qk_result r;
    memset(own, 0, sizeof *own);
    *out = planned;
    if (planned && planned->q > 0) return QK_OK;
    r = qk__mps_prog_make_t(map, desc->mps_max_bond, desc->mps_cutoff, own);
    if (r != QK_OK) return r;
    if (own->dense || own->chi > QK_MPS_MAX_BOND) {
        qk__mps_prog_free(own);
        return qk__fail(QK_ERROR_UNSUPPORTED, "mps: the map is not MPS-able (plan made for another map?)");
    }
    *out = own;
    return QK_OK;
}

/* K on the MPS path (plan->path == QK_PATH_MPS, CPU engine) into the sink: the MPS of X (and Y),
   then the CPU engine's tiles with qk__mps_tile. planned: the planner's program (or NULL). */
QK__PRIV qk_result qk__mps_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink,
                                const qk__mps_prog *planned)
{
#ifdef QK_NO_MPS
    QK__UNUSED(plan); QK__UNUSED(map); QK__UNUSED(desc); QK__UNUSED(sink); QK__UNUSED(planned);
    (void)qk__mps_prog_of; (void)qk__mps_states;   /* the GPU engine's (run_cuda.c) */
    return qk__fail(QK_ERROR_UNSUPPORTED, "mps: the MPS path is compiled out (QK_NO_MPS)");
#else
    qk__mps_prog own;
    qk__gram_job j;
    double *A = NULL, *B = NULL;
    int nt = plan->n_threads > 0 ? plan->n_threads : 1;
    const qk__mps_prog *prog = NULL;
    qk_result r = qk__mps_prog_of(planned, map, desc, &own, &prog);
    if (r != QK_OK) return r;
    qk__cpu_job_init(&j, plan, desc, sink, NULL, NULL, prog->group, 0, prog, qk__mps_scratch(prog));
    j.mps_tile = qk__mps_tile;
    A = qk__mps_states(prog, map, desc->x, desc->n_x, nt, NULL, desc->mps_discarded, &j);
    if (A && desc->y && !j.cancel)
        B = qk__mps_states(prog, map, desc->y, desc->n_y, nt, NULL, desc->mps_discarded ? desc->mps_discarded + desc->n_x : NULL, &j);
    r = qk__cpu_gram_run(plan, desc, &j, A, B, sink);
    qk__cpu_job_free(&j);
    qk__free(A);
    qk__free(B);
    qk__mps_prog_free(&own);
    return r;
#endif
}
/* ---- end MPS engine ---- */

