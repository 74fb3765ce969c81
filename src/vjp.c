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
   dt/dw; and (desc.grad_x, grad_y) dt/dx the sample's dL/dx: the same sweep, the angle's
   derivative taken at every op whose angle reads x (x, x x', (pi - x)(pi - x'), w x), each
   sample's row written by the one thread that sweeps it. Cost: the states, S (half of it for K(X,X)), lam (and mu), and a sweep of two vectors
   back through the circuit per sample, whatever the number of weights. CPU engine, fp64, all
   states resident; real maps (qk__vjp_is_real) on one plane throughout. */

/* ---- the products of the VJP (S and the adjoint vectors) as real GEMMs on packed operands ----
   C (m x n) = or += Ap Bp, each operand packed once (in parallel) before the product: A in
   panels of QK__VMR rows ([p][r], the whole k), B in panels of QK__VNR columns ([p][c]); a
   micro-kernel holds a QK__VMR x QK__VNR block of C in registers over QK__VKC values of p
   (12 accumulators of 4 doubles: AVX2's 16 registers), its B panel in L1 and the item's A panels
   in L2. Work items are blocks of QK__VMC x QK__VNC entries of C taken by whichever thread is
   free; each entry is summed by one thread in a fixed order (p chunks in order, p in order in a
   chunk), so C does not depend on the thread count. upper: only the micro-blocks that hold an
   entry with column >= row (the upper triangle of a symmetric product; the rest is not written).
   Runtime dispatch as in cpu_gram.c: a portable x86-64 build also compiles the micro-kernel for
   AVX2 + FMA and uses it where qk__cpu_isa chose AVX2 or AVX-512 (cpu_pool.c). */
#define QK__VMR 6
#define QK__VNR 8
#define QK__VKC 256
#define QK__VMC 48
#define QK__VNC 128

/* m rows of X packed into panels of w rows (zero past m): element (i, p) is X[i ld + p] (trans 0)
   or X[p ld + i] (trans 1) */
typedef struct qk__vpack_job {
    const double *X;
    int64_t ld, m, k, next;
    int trans, w;
    double *P;
} qk__vpack_job;

static void qk__vpack_work(void *p, int thread)
{
    qk__vpack_job *j = (qk__vpack_job *)p;
    const int64_t panels = (j->m + j->w - 1) / j->w;
    int64_t b;
    QK__UNUSED(thread);
    while ((b = QK__FETCH_ADD(&j->next, 1)) * 4 < panels) {
        int64_t ip, q, r;
        for (ip = 4 * b; ip < panels && ip < 4 * b + 4; ip++) {
            double *P = j->P + ip * j->k * j->w;
            const int64_t i0 = ip * j->w, w = j->m - i0 < j->w ? j->m - i0 : j->w;
            if (j->trans)   /* row q of X: w contiguous values */
                for (q = 0; q < j->k; q++) {
                    const double *x = j->X + q * j->ld + i0;
                    for (r = 0; r < j->w; r++) P[q * j->w + r] = r < w ? x[r] : 0.0;
                }
            else
                for (r = 0; r < j->w; r++) {
                    const double *x = j->X + (i0 + r) * j->ld;
                    if (r >= w) for (q = 0; q < j->k; q++) P[q * j->w + r] = 0.0;
                    else for (q = 0; q < j->k; q++) P[q * j->w + r] = x[q];
                }
        }
    }
}

static void qk__vpack(int nt, const double *X, int64_t ld, int trans, int64_t m, int64_t k, int w, double *P)
{
    qk__vpack_job j;
    const int64_t items = ((m + w - 1) / w + 3) / 4;
    j.X = X; j.ld = ld; j.m = m; j.k = k; j.trans = trans; j.w = w; j.P = P; j.next = 0;
    qk__parallel(nt < items ? nt : (int)items, qk__vpack_work, &j);
}

#if defined(QK__VEC)
typedef double qk__gv4 __attribute__((vector_size(4 * sizeof(double))));
/* C[0..mr) x [0..nr) (entry (r, e) at c[r rs + e cs]) = (acc 0) or += (acc 1) the kc-long
   product of an A panel (a) and a B panel (b) */
#define QK__VMK_DEFINE(NAME, ATTR)                                                                  \
    QK__CONTRACT ATTR static void NAME(int64_t kc, const double *a, const double *b, double *c, int64_t rs, \
                                       int64_t cs, int mr, int nr, int acc)                                     \
    {                                                                                               \
        qk__gv4 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, b0, b1;                 \
        double t[QK__VMR][QK__VNR];                                                                 \
        int64_t p;                                                                                  \
        int r, e;                                                                                   \
        memset(&c00, 0, sizeof c00);                                                                \
        c01 = c00; c10 = c00; c11 = c00; c20 = c00; c21 = c00;                                      \
        c30 = c00; c31 = c00; c40 = c00; c41 = c00; c50 = c00; c51 = c00;                           \
        for (p = 0; p < kc; p++, a += QK__VMR, b += QK__VNR) {                                      \
            memcpy(&b0, b, sizeof b0);                                                              \
            memcpy(&b1, b + 4, sizeof b1);                                                          \
            c00 += a[0] * b0; c01 += a[0] * b1;                                                     \
            c10 += a[1] * b0; c11 += a[1] * b1;                                                     \
            c20 += a[2] * b0; c21 += a[2] * b1;                                                     \
            c30 += a[3] * b0; c31 += a[3] * b1;                                                     \
            c40 += a[4] * b0; c41 += a[4] * b1;                                                     \
            c50 += a[5] * b0; c51 += a[5] * b1;                                                     \
        }                                                                                           \
        memcpy(t[0], &c00, sizeof c00); memcpy(t[0] + 4, &c01, sizeof c01);                        \
        memcpy(t[1], &c10, sizeof c10); memcpy(t[1] + 4, &c11, sizeof c11);                        \
        memcpy(t[2], &c20, sizeof c20); memcpy(t[2] + 4, &c21, sizeof c21);                        \
        memcpy(t[3], &c30, sizeof c30); memcpy(t[3] + 4, &c31, sizeof c31);                        \
        memcpy(t[4], &c40, sizeof c40); memcpy(t[4] + 4, &c41, sizeof c41);                        \
        memcpy(t[5], &c50, sizeof c50); memcpy(t[5] + 4, &c51, sizeof c51);                        \
        for (r = 0; r < mr; r++, c += rs)                                                           \
            for (e = 0; e < nr; e++) c[e * cs] = acc ? c[e * cs] + t[r][e] : t[r][e];               \
    }
QK__VMK_DEFINE(qk__vmk, )
#if defined(QK__DISPATCH)
#define QK__VMK_DISPATCH 1
QK__VMK_DEFINE(qk__vmk_avx2, __attribute__((target("avx2,fma"))))
#endif
#undef QK__VMK_DEFINE
#else
static void qk__vmk(int64_t kc, const double *a, const double *b, double *c, int64_t rs, int64_t cs, int mr, int nr, int acc)
{
    double t[QK__VMR][QK__VNR];
    int64_t p;
    int r, e;
    memset(t, 0, sizeof t);
    for (p = 0; p < kc; p++, a += QK__VMR, b += QK__VNR)
        for (r = 0; r < QK__VMR; r++)
            for (e = 0; e < QK__VNR; e++) t[r][e] += a[r] * b[e];
    for (r = 0; r < mr; r++, c += rs)
        for (e = 0; e < nr; e++) c[e * cs] = acc ? c[e * cs] + t[r][e] : t[r][e];
}
#endif

typedef struct qk__vgemm_job {
    int64_t m, n, k, ldc, items_j, n_items, next;
    int upper, acc, isa, packed;
    const double *Ap, *Bp;
    double *C;
} qk__vgemm_job;

static void qk__vgemm_work(void *p, int thread)
{
    qk__vgemm_job *g = (qk__vgemm_job *)p;
    int64_t t;
    QK__UNUSED(thread);
    while ((t = QK__FETCH_ADD(&g->next, 1)) < g->n_items) {
        const int64_t i0 = t / g->items_j * QK__VMC, j0 = t % g->items_j * QK__VNC;
        const int64_t i1 = i0 + QK__VMC < g->m ? i0 + QK__VMC : g->m, j1 = j0 + QK__VNC < g->n ? j0 + QK__VNC : g->n;
        int64_t pc, i, j;
        if (g->upper && j1 <= i0) continue;   /* all below the diagonal */
        for (pc = 0; pc < g->k; pc += QK__VKC) {
            const int64_t kc = g->k - pc < QK__VKC ? g->k - pc : QK__VKC;
            for (j = j0; j < j1; j += QK__VNR)
                for (i = i0; i < i1; i += QK__VMR) {
                    const double *a = g->Ap + i * g->k + pc * QK__VMR, *b = g->Bp + j * g->k + pc * QK__VNR;
                    const int mr = (int)(i1 - i < QK__VMR ? i1 - i : QK__VMR), nr = (int)(j1 - j < QK__VNR ? j1 - j : QK__VNR);
                    const int acc = g->acc || pc > 0;
                    /* row-major, or packed: C in qk__vpack's panels of QK__VMR rows (i is a multiple) */
                    double *c = g->C + i * g->ldc + (g->packed ? j * QK__VMR : j);
                    const int64_t rs = g->packed ? 1 : g->ldc, cs = g->packed ? QK__VMR : 1;
                    if (g->upper && j + QK__VNR <= i) continue;
#if defined(QK__VMK_DISPATCH)
                    if (g->isa) { qk__vmk_avx2(kc, a, b, c, rs, cs, mr, nr, acc); continue; }
#endif
                    qk__vmk(kc, a, b, c, rs, cs, mr, nr, acc);
                }
        }
    }
}

/* C (m x n) = Ap Bp (acc 0) or C + Ap Bp (acc 1); Ap, Bp: qk__vpack's panels of k. C row-major
   (leading dimension ldc), or packed (1) as qk__vpack packs m rows of n values (ldc = n): the
   next product's A operand. */
static void qk__vgemm(int nt, int upper, int acc, int64_t m, int64_t n, int64_t k, const double *Ap, const double *Bp, double *C, int64_t ldc,
                      int packed)
{
    qk__vgemm_job g;
    g.m = m; g.n = n; g.k = k; g.ldc = ldc; g.upper = upper; g.acc = acc; g.Ap = Ap; g.Bp = Bp; g.C = C; g.next = 0; g.packed = packed;
    g.items_j = (n + QK__VNC - 1) / QK__VNC;
    g.n_items = (m + QK__VMC - 1) / QK__VMC * g.items_j;
#if defined(QK__VMK_DISPATCH)
    g.isa = qk__cpu_isa() >= QK__ISA_AVX2;   /* an AVX-512 CPU takes the AVX2 kernel */
#else
    g.isa = 0;
#endif
    qk__parallel(nt < g.n_items ? nt : (int)g.n_items, qk__vgemm_work, &g);
}

typedef struct qk__vjp_job {
    const qk_map *map;
    const double *x, *y;        /* data of the samples (X, then Y) */
    int64_t nx, ny, D, R;       /* R: doubles a state row (D real, 2D complex: re | im) */
    int sym, real;
    const double *A, *B;        /* states; B == A for K(X,X) */
    const double *g;            /* G, ld_g */
    int64_t ld_g;
    double *Wp[4];              /* S = conj(A) B^T (Sr, Si: nx x ny packed as lam's A operand), then
                                   W = G' o conj(S) in place, and W^T (K(X,Y)) (qk__vjp_w_work) */
    double *L, *M;              /* lam (nx rows of R), mu (ny rows; K(X,Y)) */
    double *K;                  /* NULL, or K = |S|^2 (nx x ny) from the W pass */
    int weights;                /* form W, lam (and mu) and sweep: the map has weights or grad_x / grad_y is asked */
    int sweep_x, sweep_y;       /* sweep X's samples (lam), Y's (mu; K(X,Y)) */
    int dx;                     /* dL/dx asked: the sweeps also write gx */
    double *gx;                 /* dL/dx of the swept samples: (nx + ny) rows of n_features */
    double *grad;               /* QK__VJP_CHUNKS x n_weights partial sums */
    double *signs;              /* the sweeps' runs of Z / CZ ops (qk__vjp_diag_runs) */
    int *run, *run_start;
    int oom, cancel;
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

/* W from S and G in blocks of QK__VWB rows, in place of S (both in qk__vpack's layout, panels of
   QK__VMR rows: lam's A operand), and K = |S|^2 (j->K, row-major) on the way:
     K(X,X): W = (G + G^T) o conj(S), Hermitian, from the upper triangle of S (the only part the
       product computed; the lower one is written over): Wp[0] = Wr, Wp[1] = -Wi (lam = Wr B -
       Wi B~, B~ = [Bi | -Br])
     K(X,Y): W = G o conj(S): Wp[0] = Wr, Wp[1] = -Wi (lam), Wp[2] = Wr^T, Wp[3] = Wi^T packed
       as mu's A operand (mu = V^T A with V = G o S = conj(W): mu = Wr^T A + Wi^T A~)
   Each entry (each unordered pair for K(X,X)) is read and written by one thread. */
#define QK__VWB 24
#define QK__VPK(P, i, c, k) ((P)[((i) / QK__VMR) * (k) * QK__VMR + (c) * QK__VMR + (i) % QK__VMR])
static void qk__vjp_w_work(void *p, int thread)
{
    qk__vjp_job *j = (qk__vjp_job *)p;
    const int64_t nx = j->nx, ny = j->ny, ld = j->ld_g;
    double *Wr = j->Wp[0], *Wi = j->Wp[1];
    int64_t b;
    QK__UNUSED(thread);
    while ((b = QK__FETCH_ADD(&j->next, 1)) * QK__VWB < nx) {
        const int64_t i0 = b * QK__VWB, i1 = i0 + QK__VWB < nx ? i0 + QK__VWB : nx;
        int64_t i, c, c0;
        if (j->sym) {
            for (c0 = i0; c0 < ny; c0 += QK__VWB)   /* blocks right of the diagonal: the pairs c >= i */
                for (i = i0; i < i1; i++)
                    for (c = c0 > i ? c0 : i; c < c0 + QK__VWB && c < ny; c++) {
                        const double gv = j->g[i * ld + c] + j->g[c * ld + i], sr = QK__VPK(Wr, i, c, ny);
                        const double si = j->real || c == i ? 0.0 : QK__VPK(Wi, i, c, ny);   /* S_ii is real */
                        if (j->K) j->K[i * ny + c] = j->K[c * ny + i] = sr * sr + si * si;
                        if (!j->weights) continue;
                        QK__VPK(Wr, i, c, ny) = gv * sr;
                        QK__VPK(Wr, c, i, ny) = gv * sr;
                        if (!j->real) {
                            QK__VPK(Wi, i, c, ny) = gv * si;                /* -Wi_ic */
                            if (c != i) QK__VPK(Wi, c, i, ny) = -gv * si;   /* -Wi_ci = Wi_ic */
                        }
                    }
        } else
            for (i = i0; i < i1; i++)
                for (c = 0; c < ny; c++) {
                    const double gv = j->g[i * ld + c], sr = QK__VPK(Wr, i, c, ny), si = j->real ? 0.0 : QK__VPK(Wi, i, c, ny);
                    if (j->K) j->K[i * ny + c] = sr * sr + si * si;
                    if (!j->weights) continue;
                    QK__VPK(Wr, i, c, ny) = gv * sr;
                    if (j->sweep_y) QK__VPK(j->Wp[2], c, i, nx) = gv * sr;
                    if (!j->real) {
                        QK__VPK(Wi, i, c, ny) = gv * si;
                        if (j->sweep_y) QK__VPK(j->Wp[3], c, i, nx) = -gv * si;
                    }
                }
    }
}

/* <Gen s|l> of an angled op (the generator applied to s where it acts), complex states */
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

/* An RY at angle t on the bit b in a real sweep, one pass over the pairs (i, i + b) (bit b of i
   clear): dot: returns Im <Y s|l> (its real part is 0); back: then s and l go back through it
   (RY(-t), as qk__apply would). From b = 4 on the sum runs in 4 lanes (i mod 4) added in a fixed
   order at the end: vectors, not one chain of dependent adds. */
QK__CONTRACT static double qk__vjp_ry_real(double *s, double *l, int64_t D, int64_t b, double t, int dot, int back)
{
    double m = 0, u[8];
    int64_t i0, i;
    (void)qk__u1(QK_OP_RY, -t, 0, u);
    if (b >= 4) {
#if defined(QK__VEC)
        qk__gv4 acc, s0, s1, l0, l1, v;
        memset(&acc, 0, sizeof acc);
        for (i0 = 0; i0 < D; i0 += 2 * b)
            for (i = i0; i < i0 + b; i += 4) {
                memcpy(&s0, s + i, sizeof s0); memcpy(&s1, s + i + b, sizeof s1);
                memcpy(&l0, l + i, sizeof l0); memcpy(&l1, l + i + b, sizeof l1);
                if (dot) acc += s1 * l0 - s0 * l1;
                if (back) {
                    v = u[0] * s0 + u[2] * s1; memcpy(s + i, &v, sizeof v);
                    v = u[4] * s0 + u[6] * s1; memcpy(s + i + b, &v, sizeof v);
                    v = u[0] * l0 + u[2] * l1; memcpy(l + i, &v, sizeof v);
                    v = u[4] * l0 + u[6] * l1; memcpy(l + i + b, &v, sizeof v);
                }
            }
        return (acc[0] + acc[1]) + (acc[2] + acc[3]);
#else
        double a4[4] = {0, 0, 0, 0};
        int e;
        for (i0 = 0; i0 < D; i0 += 2 * b)
            for (i = i0; i < i0 + b; i += 4)
                for (e = 0; e < 4; e++) {
                    const double s0 = s[i + e], s1 = s[i + e + b], l0 = l[i + e], l1 = l[i + e + b];
                    if (dot) a4[e] += s1 * l0 - s0 * l1;
                    if (back) {
                        s[i + e] = u[0] * s0 + u[2] * s1; s[i + e + b] = u[4] * s0 + u[6] * s1;
                        l[i + e] = u[0] * l0 + u[2] * l1; l[i + e + b] = u[4] * l0 + u[6] * l1;
                    }
                }
        return (a4[0] + a4[1]) + (a4[2] + a4[3]);
#endif
    }
    for (i0 = 0; i0 < D; i0 += 2 * b)
        for (i = i0; i < i0 + b; i++) {
            const double s0 = s[i], s1 = s[i + b], l0 = l[i], l1 = l[i + b];
            if (dot) m += s1 * l0 - s0 * l1;
            if (back) {
                s[i] = u[0] * s0 + u[2] * s1;
                s[i + b] = u[4] * s0 + u[6] * s1;
                l[i] = u[0] * l0 + u[2] * l1;
                l[i + b] = u[4] * l0 + u[6] * l1;
            }
        }
    return m;
}

/* An RZ at angle t on the bit b in a complex sweep (s, l: [re | im]), one pass: dot: returns
   Im <Z s|l>; back: then s and l go back through it (RZ(-t): e^{+-it/2} by the bit, as qk__apply
   would, without its call per run of indices). The sum in 4 lanes (i mod 4), added in a fixed
   order. */
static double qk__vjp_rz(double *s, double *l, int64_t D, int64_t b, double t, int dot, int back)
{
    double m[4] = {0, 0, 0, 0}, u[8];
    double *si = s + D, *li = l + D;
    int64_t i;
    (void)qk__u1(QK_OP_RZ, -t, 0, u);
    for (i = 0; i < D; i++) {
        const int set = (i & b) != 0;
        const double sr = s[i], sm = si[i], lr = l[i], lm = li[i];
        const double pr = set ? u[6] : u[0], pi = set ? u[7] : u[1];
        if (dot) m[i & 3] += set ? -(sr * lm - sm * lr) : sr * lm - sm * lr;
        if (back) {
            s[i] = pr * sr - pi * sm; si[i] = pr * sm + pi * sr;
            l[i] = pr * lr - pi * lm; li[i] = pr * lm + pi * lr;
        }
    }
    return (m[0] + m[1]) + (m[2] + m[3]);
}

/* Runs of consecutive Z and CZ ops (a CZ ring): diagonal, +-1, the same for every sample, each
   its own inverse. The sweeps take a run in one pass, times its table of signs (j->signs: one
   table of D per run; j->run[k]: the run's table where op k is a run's last op, else -1;
   j->run_start[k]: the run's first op). Returns the number of runs, or -1 (out of memory). */
static int qk__vjp_diag_runs(qk__vjp_job *j)
{
    const qk_map *m = j->map;
    int k, k0, n = 0;
    int64_t i;
    for (k = 0; k < m->n_ops; k++) {
        const int diag = m->ops[k].kind == QK_OP_Z || m->ops[k].kind == QK_OP_CZ;
        const int next = k + 1 < m->n_ops && (m->ops[k + 1].kind == QK_OP_Z || m->ops[k + 1].kind == QK_OP_CZ);
        j->run[k] = diag && !next ? n++ : -1;
    }
    if (n == 0) return 0;
    j->signs = (double *)qk__malloc(sizeof(double) * (size_t)n * (size_t)j->D);
    if (!j->signs) return -1;
    for (k = 0; k < m->n_ops; k++) {
        double *t;
        if (j->run[k] < 0) continue;
        t = j->signs + (size_t)j->run[k] * (size_t)j->D;
        for (i = 0; i < j->D; i++) t[i] = 1.0;
        for (k0 = k; k0 >= 0 && (m->ops[k0].kind == QK_OP_Z || m->ops[k0].kind == QK_OP_CZ); k0--) {
            const qk_op *o = &m->ops[k0];
            const int64_t mask = ((int64_t)1 << o->q0) | (o->kind == QK_OP_CZ ? (int64_t)1 << o->q1 : 0);
            for (i = 0; i < j->D; i++) t[i] = (i & mask) == mask ? -t[i] : t[i];
        }
        j->run_start[k] = k0 + 1;
    }
    return n;
}

/* 1 when the angle reads a feature */
static int qk__vjp_reads_x(const qk_angle *a)
{
    return a->kind == QK_ARG_X || a->kind == QK_ARG_XX || a->kind == QK_ARG_PIXX || a->kind == QK_ARG_WX;
}

/* dL/dt of an angle t(x) into the sample's dL/dx (gx, n_features values): dt/dx by the angle's form */
static void qk__vjp_dx(const qk_angle *a, const double *x, const double *w, double dt, double *gx)
{
    const double pi = 3.14159265358979323846;
    switch (a->kind) {
    case QK_ARG_X: gx[a->x0] += dt * a->scale; break;
    case QK_ARG_XX: gx[a->x0] += dt * a->scale * x[a->x1]; gx[a->x1] += dt * a->scale * x[a->x0]; break;
    case QK_ARG_PIXX: gx[a->x0] -= dt * a->scale * (pi - x[a->x1]); gx[a->x1] -= dt * a->scale * (pi - x[a->x0]); break;
    case QK_ARG_WX: gx[a->x0] += dt * a->scale * w[a->w]; break;
    default: break;
    }
}

/* The adjoint sweeps, in QK__VJP_CHUNKS chunks of samples taken by whichever thread is free,
   each chunk's sums in its own row of grad: the total (summed in chunk order) does not depend
   on the threads. Real maps (j->real): s and l are real (one plane), every weighted op an RY. */
#define QK__VJP_CHUNKS 64
static void qk__vjp_sweep_work(void *p, int thread)
{
    qk__vjp_job *j = (qk__vjp_job *)p;
    const qk_map *m = j->map;
    const int64_t D = j->D, R = j->R, total = j->nx + (j->sym ? 0 : j->ny);
    double *s = (double *)qk__malloc(sizeof(double) * (size_t)(2 * R + m->n_ops + 1));
    double *l = s ? s + R : NULL, *theta = s ? s + 2 * R : NULL;
    int64_t ch;
    if (!s) { QK__STORE(&j->oom, 1); return; }
    /* thread 0 polls before each chunk it takes (the first included: the others may take them all) */
    while ((qk__vjp_poll(j, thread), (ch = QK__FETCH_ADD(&j->next, 1)) < QK__VJP_CHUNKS) && !QK__LOAD(&j->oom) && !QK__LOAD(&j->cancel)) {
        const int64_t r0 = total * ch / QK__VJP_CHUNKS, r1 = total * (ch + 1) / QK__VJP_CHUNKS;
        double *grad = j->grad + (size_t)ch * (size_t)m->n_weights;
        int64_t r;
        for (r = r0; r < r1; r++) {
            const int from_y = r >= j->nx;
            const int64_t i = from_y ? r - j->nx : r;
            const double *x = (from_y ? j->y : j->x) + i * m->n_features;
            double *gx = j->dx ? j->gx + r * m->n_features : NULL;
            int k;
            if (from_y ? !j->sweep_y : !j->sweep_x) continue;
            memcpy(s, (from_y ? j->B : j->A) + i * R, sizeof(double) * (size_t)R);
            memcpy(l, (from_y ? j->M : j->L) + i * R, sizeof(double) * (size_t)R);
            qk_map_angles(m, x, theta);
            for (k = m->n_ops - 1; k >= 0; k--) {
                const qk_op *o = &m->ops[k];
                const int weighted = qk__op_has_angle(o->kind) && (o->angle.kind == QK_ARG_W || o->angle.kind == QK_ARG_WX);
                const double dw = weighted ? o->angle.scale * (o->angle.kind == QK_ARG_WX ? x[o->angle.x0] : 1.0) : 0.0;
                const int xd = gx && qk__op_has_angle(o->kind) && qk__vjp_reads_x(&o->angle);
                if (o->kind == QK_OP_AMPLITUDE) break;   /* the first op; nothing before it has a weight */
                if (o->kind == QK_OP_RY || o->kind == QK_OP_RZ) {   /* the derivative and the step back in one pass */
                    /* RY is real: Im <Y s|l> of complex s, l is the real one of each plane, summed */
                    const int64_t b = (int64_t)1 << o->q0;
                    double im;
                    if (o->kind == QK_OP_RZ) im = qk__vjp_rz(s, l, D, b, theta[k], weighted || xd, k > 0);
                    else {
                        im = qk__vjp_ry_real(s, l, D, b, theta[k], weighted || xd, k > 0);
                        if (!j->real) im += qk__vjp_ry_real(s + D, l + D, D, b, theta[k], weighted || xd, k > 0);
                    }
                    if (weighted) grad[o->angle.w] += -im * dw;
                    if (xd) qk__vjp_dx(&o->angle, x, m->weights, -im, gx);
                    if (k == 0) break;
                    continue;
                }
                if (weighted || xd) {   /* (real maps: only RY has an angle) */
                    double re, im, dt;
                    qk__vjp_gen_dot(o, s, l, D, &re, &im);
                    dt = o->kind == QK_OP_P ? 2.0 * im : -im;
                    if (weighted) grad[o->angle.w] += dt * dw;
                    if (xd) qk__vjp_dx(&o->angle, x, m->weights, dt, gx);
                }
                if (k == 0) break;
                if (j->run[k] >= 0) {   /* a run of Z / CZ ops (ending here): one pass with its signs */
                    const double *sg = j->signs + (size_t)j->run[k] * (size_t)D;
                    int64_t a;
                    for (a = 0; a < D; a++) { s[a] *= sg[a]; l[a] *= sg[a]; }
                    if (!j->real)
                        for (a = 0; a < D; a++) { s[D + a] *= sg[a]; l[D + a] *= sg[a]; }
                    k = j->run_start[k];
                    if (k == 0) break;
                    continue;
                }
                /* back through op k: U^dagger is the op at -t (angled), itself otherwise */
                qk__apply(o, -theta[k], x, s, j->real ? NULL : s + D, m->n_qubits);
                qk__apply(o, -theta[k], x, l, j->real ? NULL : l + D, m->n_qubits);
            }
        }
        (void)QK__FETCH_ADD(&j->swept, r1 - r0);
    }
    QK_FREE(s);
}

/* A map whose states are real and whose weighted ops are all RY: the real path (one plane) */
static int qk__vjp_is_real(const qk_map *m)
{
    int k;
    for (k = 0; k < m->n_ops; k++) {
        const qk_op *o = &m->ops[k];
        switch (o->kind) {
        case QK_OP_H: case QK_OP_X: case QK_OP_Z: case QK_OP_RY: case QK_OP_CNOT: case QK_OP_CZ: case QK_OP_AMPLITUDE: case QK_OP_BASIS: break;
        default: return 0;
        }
        if (qk__op_has_angle(o->kind) && (o->angle.kind == QK_ARG_W || o->angle.kind == QK_ARG_WX) && o->kind != QK_OP_RY) return 0;
    }
    return 1;
}

/* One side's adjoint vectors (lam or mu), rows x R: out = W0 S + W1 S~ (real states: W0 S), with
   S, S~ the other side's states (inner rows of R; S~ as qk__vjp_tilde makes it), packed in Pb. */
static void qk__vjp_adjoint(int nt, int real, int64_t rows, int64_t inner, int64_t R, const double *W0, const double *W1,
                            const double *S, const double *St, double *Pb, double *out)
{
    qk__vpack(nt, S, R, 1, R, inner, QK__VNR, Pb);
    qk__vgemm(nt, 0, 0, rows, R, inner, W0, Pb, out, R, 0);
    if (!real) {
        qk__vpack(nt, St, R, 1, R, inner, QK__VNR, Pb);
        qk__vgemm(nt, 0, 1, rows, R, inner, W1, Pb, out, R, 0);
    }
}

/* rows of [re | im] (D each) into rows of [im | -re] */
static double *qk__vjp_tilde(const double *S, int64_t n, int64_t D)
{
    double *T = (double *)qk__malloc(sizeof(double) * (size_t)(2 * n * D));
    int64_t i, d;
    if (!T) return NULL;
    for (i = 0; i < n; i++)
        for (d = 0; d < D; d++) { T[i * 2 * D + d] = S[i * 2 * D + D + d]; T[i * 2 * D + D + d] = -S[i * 2 * D + d]; }
    return T;
}

QKDEF qk_result qk_gram_vjp(qk_ctx *ctx, const qk_map *map, const qk_vjp_desc *d)
{
    qk__vjp_job j;
    qk_result r;
    qk__tpool *outer = qk__cur_pool;
    int64_t i, c, cols, D, R, nx, npa, npb, nw, nwt;
    int t, nt, k;
    double bytes, *Pa = NULL, *Pb = NULL, *At = NULL, *Bt = NULL;
    if (!ctx || !map || !d) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: NULL %s", !ctx ? "ctx" : !map ? "map" : "desc");
    if (!d->g) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: g (dL/dK) is NULL");
    if (map->n_weights > 0 && !d->grad_w && !d->grad_x && !d->grad_y)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: grad_w is NULL (the map has %d weights)", map->n_weights);
    if (qk__map_is_states(map)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: a map of given states has no weights");
    if (d->grad_y && !d->y) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: grad_y is for K(X,Y) (y is NULL; grad_x holds X's both roles)");
    if (d->grad_x || d->grad_y)
        for (k = 0; k < map->n_ops; k++)
            if (map->ops[k].kind == QK_OP_AMPLITUDE || map->ops[k].kind == QK_OP_BASIS)
                return qk__fail(QK_ERROR_UNSUPPORTED, "qk_gram_vjp: grad_x / grad_y: the map's %s encoding does not enter a gate angle "
                                "(dL/dx for angle encodings only)", map->ops[k].kind == QK_OP_AMPLITUDE ? "amplitude" : "basis");
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
#if defined(QK_CUDA) && QK_CUDA
    /* the GPU engine (src/cuda/vjp.cuh), the context's first GPU: dL/dw and K; dL/dX (grad_x,
       grad_y) runs on the CPU engine below (docs/gradients.md). G is checked there, on the host
       threads that copy it into the context's page-locked staging (grown to 32 MB a buffer). */
    if (ctx->desc.device == QK_DEVICE_CUDA && !d->grad_x && !d->grad_y) {
        char err[512] = "";
        void *none[2] = {NULL, NULL};
        const size_t need = (size_t)cols * 8 > ((size_t)32 << 20) ? (size_t)cols * 8 : ((size_t)32 << 20);
        r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
        if (r == QK_OK)
            r = qk_cuda_gram_vjp(map, d, qk__vjp_is_real(map), qk__cuda_pool(ctx, 0), qk__ctx_stage(ctx, need) ? ctx->stage : none,
                                 ctx->stage_bytes, err, sizeof err);
        return r == QK_OK ? QK_OK : qk__fail(r, "%s", err[0] ? err : "qk_gram_vjp: the GPU engine failed");
    }
#endif
    for (i = 0; i < nx; i++)
        for (c = 0; c < cols; c++)
            if (!isfinite(d->g[i * j.ld_g + c])) return qk__fail(QK_ERROR_NON_FINITE, "qk_gram_vjp: g[%lld][%lld] is not finite", (long long)i, (long long)c);
    D = (int64_t)1 << map->n_qubits;
    j.real = qk__vjp_is_real(map);   /* real states, S, W, lam: one plane, half the products */
    R = j.real ? D : 2 * D;
    j.sym = d->y == NULL;
    j.dx = d->grad_x || d->grad_y;
    j.sweep_x = (map->n_weights > 0 && d->grad_w) || d->grad_x;
    j.sweep_y = !j.sym && ((map->n_weights > 0 && d->grad_w) || d->grad_y);
    /* packed panels: S's operands (A by QK__VMR rows in Pa, B by QK__VNR in Pb), then lam's and
       mu's B operands (the states by QK__VNR columns) in Pb again; lam in Pa (free by then);
       S and W in the same planes (1 real, 2 complex; K(X,Y): W^T too) */
    npa = ((nx + QK__VMR - 1) / QK__VMR * QK__VMR) * R;
    npb = ((cols + QK__VNR - 1) / QK__VNR * QK__VNR) * R;
    c = ((R + QK__VNR - 1) / QK__VNR * QK__VNR) * (nx > cols ? nx : cols);
    if (c > npb) npb = c;
    nw = (nx + QK__VMR - 1) / QK__VMR * QK__VMR * cols;
    nwt = (cols + QK__VMR - 1) / QK__VMR * QK__VMR * nx;
    /* states (and their [im | -re] rows), S / W, the packed operands, mu, K */
    bytes = 8.0 * ((j.real ? 1.0 : 2.0) * (double)R * (double)(nx + (d->y ? cols : 0)) +
                   (j.real ? 1.0 : 2.0) * ((double)nw + (j.sym ? 0.0 : (double)nwt)) + (double)npa + (double)npb +
                   (j.sym ? 0.0 : (double)cols * (double)R) + (d->k_out ? (double)nx * (double)cols : 0.0) +
                   (j.dx ? (double)(nx + (j.sym ? 0 : cols)) * (double)map->n_features : 0.0));
    if (ctx->desc.host_memory && bytes > (double)ctx->desc.host_memory)
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: the states, S and the adjoint vectors need %.3g GB, the host budget is %.3g GB "
                        "(the gradient keeps every state resident)", bytes * 1e-9, (double)ctx->desc.host_memory * 1e-9);
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
    qk__cur_pool = qk__ctx_pool(ctx);   /* as qk_gram: every parallel step below runs on it */
    j.map = map; j.x = d->x; j.y = d->y; j.nx = nx; j.ny = cols; j.D = D; j.R = R; j.g = d->g;
    j.progress = d->progress;
    j.progress_user = d->progress_user;
    QK_PROF_BEGIN("vjp states");
    j.A = qk__cpu_states(map, d->x, 0, nx, j.real ? QK_PATH_REAL : QK_PATH_COMPLEX, nt, NULL);
    if (j.A && d->y) j.B = qk__cpu_states(map, d->y, 0, cols, j.real ? QK_PATH_REAL : QK_PATH_COMPLEX, nt, NULL);
    else j.B = j.A;
    if (!j.real && j.A && j.B) {
        At = qk__vjp_tilde(j.A, nx, D);
        Bt = j.sym ? At : qk__vjp_tilde(j.B, cols, D);
    }
    QK_PROF_END("vjp states");
    Pa = (double *)qk__malloc(sizeof(double) * (size_t)npa);
    Pb = (double *)qk__malloc(sizeof(double) * (size_t)npb);
    j.weights = j.sweep_x || j.sweep_y;
    for (k = 0; k < 4; k++)
        if ((k < 2 || j.sweep_y) && (k % 2 == 0 || !j.real)) {
            j.Wp[k] = (double *)qk__malloc(sizeof(double) * (size_t)(k < 2 ? nw : nwt));
            if (!j.Wp[k]) break;
        }
    j.L = Pa;
    if (j.sweep_y) j.M = (double *)qk__malloc(sizeof(double) * (size_t)(cols * R));
    if (j.dx) j.gx = (double *)qk__calloc((size_t)(nx + (j.sym ? 0 : cols)) * (size_t)map->n_features, sizeof(double));
    if (d->k_out) j.K = (double *)qk__malloc(sizeof(double) * (size_t)(nx * cols));
    j.grad = (double *)qk__calloc((size_t)QK__VJP_CHUNKS * (size_t)(map->n_weights > 0 ? map->n_weights : 1), sizeof(double));
    j.run = (int *)qk__malloc(sizeof(int) * (size_t)(2 * map->n_ops + 2));
    j.run_start = j.run ? j.run + map->n_ops + 1 : NULL;
    if (j.run && qk__vjp_diag_runs(&j) < 0) { QK_FREE(j.run); j.run = NULL; }
    if (!j.A || !j.B || (!j.real && (!At || !Bt)) || !Pa || !Pb || !j.Wp[0] || (!j.real && !j.Wp[1]) ||
        (j.sweep_y && (!j.Wp[2] || (!j.real && !j.Wp[3]) || !j.M)) || (d->k_out && !j.K) || (j.dx && !j.gx) || !j.grad || !j.run) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: cannot allocate %.3g GB of host memory (states, S, adjoint vectors)", bytes * 1e-9);
        goto done;
    }
    qk__vjp_poll(&j, 0);
    if (j.cancel) goto cancelled;
    /* S = conj(A) B^T: Sr = A . B (rows of R), Si = A . B~ with B~ = [Bi | -Br]; K(X,X): the
       upper triangle */
    QK_PROF_BEGIN("vjp S");
    qk__vpack(nt, j.A, R, 0, nx, R, QK__VMR, Pa);
    qk__vpack(nt, j.B, R, 0, cols, R, QK__VNR, Pb);
    qk__vgemm(nt, j.sym, 0, nx, cols, R, Pa, Pb, j.Wp[0], cols, 1);
    if (!j.real) {
        qk__vpack(nt, Bt, R, 0, cols, R, QK__VNR, Pb);
        qk__vgemm(nt, j.sym, 0, nx, cols, R, Pa, Pb, j.Wp[1], cols, 1);
    }
    QK_PROF_END("vjp S");
    qk__vjp_poll(&j, 0);
    if (j.cancel) goto cancelled;
    QK_PROF_BEGIN("vjp W");   /* W in place of S, and K */
    j.next = 0;
    qk__parallel(nt, qk__vjp_w_work, &j);
    QK_PROF_END("vjp W");
    if (j.weights) {
        QK_PROF_BEGIN("vjp adjoint vectors");
        /* lam = Wr B - Wi B~ (real: W B); mu = Wr^T A + Wi^T A~ (real: W^T A) */
        if (j.sweep_x) qk__vjp_adjoint(nt, j.real, nx, cols, R, j.Wp[0], j.Wp[1], j.B, Bt, Pb, j.L);
        if (j.sweep_y) qk__vjp_adjoint(nt, j.real, cols, nx, R, j.Wp[2], j.Wp[3], j.A, At, Pb, j.M);
        QK_PROF_END("vjp adjoint vectors");
        qk__vjp_poll(&j, 0);
        if (j.cancel) goto cancelled;
        QK_PROF_BEGIN("vjp sweeps");
        j.next = 0;
        qk__parallel(nt, qk__vjp_sweep_work, &j);
        QK_PROF_END("vjp sweeps");
        if (j.oom) { r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: out of host memory for the sweeps' scratch"); goto done; }
        if (j.cancel) goto cancelled;
        for (i = 0; d->grad_w && i < map->n_weights; i++) {
            double sum = 0.0;
            for (t = 0; t < QK__VJP_CHUNKS; t++) sum += j.grad[(size_t)t * (size_t)map->n_weights + (size_t)i];
            d->grad_w[i] = sum;
        }
        if (d->grad_x) memcpy(d->grad_x, j.gx, sizeof(double) * (size_t)(nx * map->n_features));
        if (d->grad_y) memcpy(d->grad_y, j.gx + nx * map->n_features, sizeof(double) * (size_t)(cols * map->n_features));
    }
    if (d->k_out) memcpy(d->k_out, j.K, sizeof(double) * (size_t)(nx * cols));   /* once nothing can fail */
    r = QK_OK;
    goto done;
cancelled:
    r = qk__fail(QK_ERROR_CANCELLED, "qk_gram_vjp: cancelled by the progress callback (nothing was written)");
done:
    qk__cur_pool = outer;
    QK_FREE(j.grad);
    QK_FREE(j.gx);
    QK_FREE(j.run);
    QK_FREE(j.signs);
    QK_FREE(j.M);
    QK_FREE(j.K);
    for (k = 0; k < 4; k++) QK_FREE(j.Wp[k]);
    QK_FREE(Pb);
    QK_FREE(Pa);
    if (Bt != At) QK_FREE(Bt);
    QK_FREE(At);
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

/* The features of an MPS (the MPS path: entangling maps beyond the statevector, 100-784 qubits):
   each sample's MPS (the exact builder, or truncated as qk_gram_desc asks) in the engine's lane
   layout, then per sample two sweeps of environments: left, L_{s+1} = sum_a A_a^H L_s A_a stored
   for every site (with A_a the site's matrix at physical value a: L_s[l][l'] is the left part's
   <l'|l>), and right, R_s from R_{s+1} likewise, with at each site
     rho_s[a][a'] = sum L_s[l][l'] A[l][a][r] conj(A[l'][a'][r']) R_{s+1}[r][r'],
   divided by its trace (the norm, 1 but for rounding). O(q chi^3) per sample; site s is qubit
   order[s]. Samples in chunks of at most 512, so memory stays O(chunk) in the MPS. */
typedef struct qk__pq_mps_job {
    const qk__mps_prog *p;
    const double *lanes;        /* the chunk's MPS (lane layout) */
    int64_t n, next;
    double *f;                  /* the chunk's rows: n x 3q */
    int oom;
} qk__pq_mps_job;

/* Complex sums over arrays of interleaved (re, im) values, element k at p[2k], p[2k + 1], the terms
   added in the order given, into out[0], out[1]. qk__cdot: sum_{k<n} p[k sp] q[k sq], strides in
   elements. qk__cdot_conj: sum_{u<nu, v<nv} p[e] conj(q[e]), e = u su + v (u outer). */
static void qk__cdot(const double *p, int64_t sp, const double *q, int64_t sq, int n, double *out)
{
    double re = 0, im = 0;
    int k;
    for (k = 0; k < n; k++) {
        const double pr = p[2 * k * sp], pi = p[2 * k * sp + 1], qr = q[2 * k * sq], qi = q[2 * k * sq + 1];
        re += pr * qr - pi * qi;
        im += pr * qi + pi * qr;
    }
    out[0] = re;
    out[1] = im;
}

static void qk__cdot_conj(const double *p, const double *q, int nu, int64_t su, int nv, double *out)
{
    double re = 0, im = 0;
    int u, v;
    for (u = 0; u < nu; u++)
        for (v = 0; v < nv; v++) {
            const int64_t e = 2 * (u * su + v);
            re += p[e] * q[e] + p[e + 1] * q[e + 1];
            im += p[e + 1] * q[e] - p[e] * q[e + 1];
        }
    out[0] = re;
    out[1] = im;
}

/* Site s's tensor A[l][a][r] of the sample at g (the lane layout: entry e = (l * 2 + a) * D[s+1] + r
   at g[off[s] + e * 2NJ], its imaginary part NJ further) into A, interleaved. */
static void qk__pq_site(const qk__mps_prog *p, const double *g, int s, double *A)
{
    const int64_t ne = 2 * (int64_t)p->D[s] * p->D[s + 1];
    const double *t = g + p->off[s];
    int64_t e;
    for (e = 0; e < ne; e++) {
        A[2 * e] = t[e * 2 * QK__NJ];
        A[2 * e + 1] = t[e * 2 * QK__NJ + QK__NJ];
    }
}

static void qk__pq_mps_work(void *arg, int thread)
{
    qk__pq_mps_job *j = (qk__pq_mps_job *)arg;
    const qk__mps_prog *p = j->p;
    const int q = p->q;
    int dmax = 1, s;
    int64_t i, *loff, tot = 0;
    double *L, *R, *Rn, *X, *W, *A;
    QK__UNUSED(thread);
    for (s = 0; s <= q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    loff = (int64_t *)qk__malloc(sizeof(int64_t) * (size_t)(q + 1));
    if (!loff) { QK__STORE(&j->oom, 1); return; }
    for (s = 0; s <= q; s++) { loff[s] = tot; tot += 2 * (int64_t)p->D[s] * p->D[s]; }
    /* the left environments, then R and Rn (dmax^2 complex each), X, W and A (2 dmax^2 each) */
    L = (double *)qk__malloc(sizeof(double) * (size_t)(tot + 16 * dmax * dmax));
    if (!L) { QK_FREE(loff); QK__STORE(&j->oom, 1); return; }
    R = L + tot;
    Rn = R + 2 * dmax * dmax;
    X = Rn + 2 * dmax * dmax;
    W = X + 4 * dmax * dmax;
    A = W + 4 * dmax * dmax;
    while ((i = QK__FETCH_ADD(&j->next, 1)) < j->n) {
        const double *g = j->lanes + (i / QK__NJ) * p->group + (i % QK__NJ);
        double *f = j->f + i * 3 * q, *sw;
        int l, lp, a, ap, r, rp, c;
        L[0] = 1; L[1] = 0;
        for (s = 0; s < q; s++) {   /* L_{s+1}[r][r'] = sum_{l,l',a} L_s[l][l'] A[l][a][r] conj(A[l'][a][r']) */
            const int dl = p->D[s], dr = p->D[s + 1];
            const double *Ls = L + loff[s];
            double *Ln = L + loff[s + 1];
            qk__pq_site(p, g, s, A);
            /* X[l'][a][r] = sum_l L_s[l][l'] A[l][a][r] (c = a * dr + r) */
            for (lp = 0; lp < dl; lp++)
                for (c = 0; c < 2 * dr; c++) qk__cdot(Ls + 2 * lp, dl, A + 2 * c, 2 * dr, dl, X + 2 * (lp * 2 * dr + c));
            /* X[l'][a][r] conj(A[l'][a][r']) over (l', a) */
            for (r = 0; r < dr; r++)
                for (rp = 0; rp < dr; rp++) qk__cdot_conj(X + 2 * r, A + 2 * rp, 2 * dl, dr, 1, Ln + 2 * (r * dr + rp));
        }
        R[0] = 1; R[1] = 0;
        for (s = q - 1; s >= 0; s--) {
            const int dl = p->D[s], dr = p->D[s + 1], k = p->order[s];
            const double *Ls = L + loff[s];
            double rho[8], tr;
            qk__pq_site(p, g, s, A);
            /* X[l][a][r'] = sum_r A[l][a][r] R[r][r'] (c = l * 2 + a) */
            for (c = 0; c < 2 * dl; c++)
                for (rp = 0; rp < dr; rp++) qk__cdot(A + 2 * c * dr, 1, R + 2 * rp, dr, dr, X + 2 * (c * dr + rp));
            /* W[l'][a][r'] = sum_l L_s[l][l'] X[l][a][r'] (c = a * dr + r') */
            for (lp = 0; lp < dl; lp++)
                for (c = 0; c < 2 * dr; c++) qk__cdot(Ls + 2 * lp, dl, X + 2 * c, 2 * dr, dl, W + 2 * (lp * 2 * dr + c));
            /* rho[a][a'] = sum_{l',r'} W[l'][a][r'] conj(A[l'][a'][r']) */
            for (a = 0; a < 2; a++)
                for (ap = 0; ap < 2; ap++) qk__cdot_conj(W + 2 * a * dr, A + 2 * ap * dr, dl, 2 * dr, dr, rho + 2 * (a * 2 + ap));
            tr = rho[0] + rho[6];
            if (!(tr > 0)) tr = 1.0;
            f[3 * k] = rho[0] / tr;
            f[3 * k + 1] = rho[2] / tr;
            f[3 * k + 2] = rho[3] / tr;
            /* R_s[l][l'] = sum_{a,r'} X[l][a][r'] conj(A[l'][a][r']) */
            for (l = 0; l < dl; l++)
                for (lp = 0; lp < dl; lp++) qk__cdot_conj(X + 4 * l * dr, A + 4 * lp * dr, 1, 0, 2 * dr, Rn + 2 * (l * dl + lp));
            sw = R; R = Rn; Rn = sw;
        }
    }
    QK_FREE(L);
    QK_FREE(loff);
}

/* The MPS path's features of n samples into f (n x 3q); QK_OK or the error set. */
static qk_result qk__pq_mps_features(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int nt, double *f)
{
    const int64_t chunk = 512;
    int64_t i0;
    for (i0 = 0; i0 < n; i0 += chunk) {
        const int64_t c = n - i0 < chunk ? n - i0 : chunk;
        qk__pq_mps_job j;
        double *lanes = qk__mps_states(p, m, x + i0 * m->n_features, c, nt, NULL, NULL, NULL);
        if (!lanes) return QK_ERROR_OUT_OF_MEMORY;   /* the error set */
        memset(&j, 0, sizeof j);
        j.p = p; j.lanes = lanes; j.n = c; j.f = f + i0 * 3 * p->q;
        qk__parallel(nt < c ? nt : (int)c, qk__pq_mps_work, &j);
        QK_FREE(lanes);
        if (j.oom) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_projected: cannot allocate the environments of %d sites", p->q);
    }
    return QK_OK;
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

#if defined(QK_CUDA) && QK_CUDA
/* The GPU engine's projected kernel (src/cuda/projected.cuh), the context's first GPU: the MPS
   path's MPS built here (the provider below: the CPU path's builder, chunk by chunk, on the
   context's threads), its sweeps on the device; the statevector path wholly on the device; product
   maps' features here (cheap: 3q numbers a sample off q 2-vectors), their RBF on the device. */
typedef struct qk__pq_prov {
    const qk__mps_prog *p;
    const qk_map *m;
    const qk_gram_desc *desc;
    int nt;
    double *cur;                /* the last chunk's MPS (lane layout) */
} qk__pq_prov;

static qk_result qk__pq_build(int side, int64_t r0, int64_t r1, const double **lanes, void *user)
{
    qk__pq_prov *v = (qk__pq_prov *)user;
    const double *x = (side ? v->desc->y : v->desc->x) + r0 * v->m->n_features;
    QK_FREE(v->cur);
    v->cur = qk__mps_states(v->p, v->m, x, r1 - r0, v->nt, NULL, NULL, NULL);
    if (!v->cur) return QK_ERROR_OUT_OF_MEMORY;   /* the error set */
    *lanes = v->cur;
    return QK_OK;
}

static qk_result qk__pq_cuda(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, double gamma, const qk__mps_prog *prog, int nt)
{
    char err[512] = "";
    qk_cuda_pq src;
    qk__pq_prov pv;
    qk_result r;
    double *fx = NULL, *fy = NULL;
    memset(&src, 0, sizeof src);
    memset(&pv, 0, sizeof pv);
    if (map->cls == QK_CLASS_PRODUCT) {
        fx = qk__pq_features(map, desc->x, desc->n_x, nt);
        if (fx && desc->y) fy = qk__pq_features(map, desc->y, desc->n_y, nt);
        if (!fx || (desc->y && !fy)) {
            QK_FREE(fx);
            return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_projected: cannot allocate the reduced density matrices (%lld samples x %d qubits)",
                            (long long)(desc->n_x + (desc->y ? desc->n_y : 0)), map->n_qubits);
        }
        src.fx = fx;
        src.fy = fy;
    } else if (prog) {
        pv.p = prog; pv.m = map; pv.desc = desc; pv.nt = nt;
        src.mps = 1;
        src.n_sites = prog->q;
        src.nj = QK__NJ;
        src.D = prog->D;
        src.order = prog->order;
        src.off = prog->off;
        src.group = prog->group;
        src.chunk = 512;   /* as the CPU path: host memory O(chunk) in the MPS */
        src.build = qk__pq_build;
        src.user = &pv;
    } else
        src.real = qk__vjp_is_real(map);
    r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
    if (r == QK_OK) r = qk_cuda_gram_projected(map, desc, gamma, &src, qk__cuda_pool(ctx, 0), err, sizeof err);
    QK_FREE(pv.cur);
    QK_FREE(fx);
    QK_FREE(fy);
    if (r == QK_OK) return QK_OK;
    return err[0] ? qk__fail(r, "%s", err) : r;   /* empty: the provider's error, already set */
}
#endif

QKDEF qk_result qk_gram_projected(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, double gamma)
{
    qk_result r;
    double *fx = NULL, *fy = NULL;
    int64_t i, c, cols, ld;
    int q, nt, k, use_mps = 0;
    qk__mps_prog prog;
    if (!ctx || !map || !desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_projected: NULL %s", !ctx ? "ctx" : !map ? "map" : "desc");
    if (!(gamma > 0.0 && gamma < 1e300)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_projected: gamma must be finite and > 0 (got %g)", gamma);
    if (desc->output != QK_OUTPUT_HOST || !desc->out)
        return qk__fail(desc->output != QK_OUTPUT_HOST ? QK_ERROR_UNSUPPORTED : QK_ERROR_INVALID_ARGUMENT,
                        "qk_gram_projected: %s", desc->output != QK_OUTPUT_HOST ? "K goes to a host buffer (output HOST)" : "out is NULL");
    if (qk__map_is_states(map)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_projected: takes a feature map");
    q = map->n_qubits;
    r = qk__check_gram(ctx, map, desc);
    if (r != QK_OK) return r;
    /* the path: product maps analytic; entangling maps the MPS path where qk_gram would take it
       (beyond QK_MAX_STATE_QUBITS, or cheaper, or asked for: qk__mps_decide), else the statevector */
    memset(&prog, 0, sizeof prog);
    if (map->cls != QK_CLASS_PRODUCT) {
        r = qk__mps_decide_cpu(map, desc, &prog, &use_mps);
        if (r != QK_OK) return r;
    }
    cols = desc->y ? desc->n_y : desc->n_x;
    ld = desc->ld_out ? desc->ld_out : cols;
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
#if defined(QK_CUDA) && QK_CUDA
    if (ctx->desc.device == QK_DEVICE_CUDA) {
        r = qk__pq_cuda(ctx, map, desc, gamma, use_mps ? &prog : NULL, nt);
        qk__mps_prog_free(&prog);
        return r;
    }
#endif
    if (use_mps) {
        fx = (double *)qk__malloc(sizeof(double) * (size_t)(desc->n_x * 3 * q));
        fy = desc->y ? (double *)qk__malloc(sizeof(double) * (size_t)(desc->n_y * 3 * q)) : NULL;
        r = !fx || (desc->y && !fy) ? QK_ERROR_OUT_OF_MEMORY : qk__pq_mps_features(&prog, map, desc->x, desc->n_x, nt, fx);
        if (r == QK_OK && desc->y) r = qk__pq_mps_features(&prog, map, desc->y, desc->n_y, nt, fy);
        qk__mps_prog_free(&prog);
        if (r != QK_OK) {
            QK_FREE(fx);
            QK_FREE(fy);
            if (r == QK_ERROR_OUT_OF_MEMORY && (!fx || (desc->y && !fy)))
                return qk__fail(r, "qk_gram_projected: cannot allocate the reduced density matrices (%lld samples x %d qubits)",
                                (long long)(desc->n_x + (desc->y ? desc->n_y : 0)), q);
            return r;
        }
    } else {
        fx = qk__pq_features(map, desc->x, desc->n_x, nt);
        if (fx && desc->y) fy = qk__pq_features(map, desc->y, desc->n_y, nt);
    }
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
