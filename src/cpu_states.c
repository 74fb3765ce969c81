#include "qk_internal.h"
/* >>cpu_states ---- CPU engine: states ---- */
/* The CPU engine builds each state gate by gate in two double arrays (re, im) of 2^q values: it
   is the oracle for the GPU engine, so it stays plain and obviously right; state construction is
   O(n * ops * 2^q), small next to the O(n^2 * 2^q) Gram. */
static void qk__g1(double *re, double *im, int64_t D, int q,
                   double ur0, double ui0, double ur1, double ui1,
                   double ur2, double ui2, double ur3, double ui3)
{
    /* [a0'; a1'] = [[u0 u1]; [u2 u3]] [a0; a1] on qubit q; im NULL: a real state and a real
       matrix (H, X, RY, BASIS; the imaginary parts are 0 and stay 0) */
    int64_t bit = (int64_t)1 << q, i0, i;
    if (!im) {
        for (i0 = 0; i0 < D; i0 += 2 * bit)
            for (i = i0; i < i0 + bit; i++) {
                double ar = re[i], br = re[i + bit];
                re[i] = ur0 * ar + ur1 * br;
                re[i + bit] = ur2 * ar + ur3 * br;
            }
        return;
    }
    for (i0 = 0; i0 < D; i0 += 2 * bit)
        for (i = i0; i < i0 + bit; i++) {
            int64_t j = i + bit;
            double ar = re[i], ai = im[i], br = re[j], bi = im[j];
            re[i] = ur0 * ar - ui0 * ai + ur1 * br - ui1 * bi;
            im[i] = ur0 * ai + ui0 * ar + ur1 * bi + ui1 * br;
            re[j] = ur2 * ar - ui2 * ai + ur3 * br - ui3 * bi;
            im[j] = ur2 * ai + ui2 * ar + ur3 * bi + ui3 * br;
        }
}

/* The j-th index (of D >> popcount(mask)) whose mask bits equal want: j with a zero inserted
   at each mask bit (ascending), then want. Ops on one or two qubits visit only their quarter or
   half of the state this way, without a test per amplitude. */
static int64_t qk__masked_index(int64_t j, int64_t mask, int64_t want)
{
    int64_t m = mask;
    while (m) {
        const int64_t low = m & -m;
        j = ((j & ~(low - 1)) << 1) | (j & (low - 1));
        m &= m - 1;
    }
    return j | want;
}
static int qk__popcount64(int64_t m)
{
    int n = 0;
    for (; m; m &= m - 1) n++;
    return n;
}

/* multiply amplitude i by (cr + i ci) when (i & mask) == want; im NULL: a real state, ci 0.
   The matching indices come in contiguous runs as long as the lowest mask bit's value. */
static void qk__phase(double *re, double *im, int64_t D, int64_t mask, int64_t want, double cr, double ci)
{
    const int64_t n = D >> qk__popcount64(mask), run = mask ? mask & -mask : D; /* mask 0: every amplitude */
    int64_t j, i;
    for (j = 0; j < n; j += run) {
        const int64_t i0 = qk__masked_index(j, mask, want);
        if (!im) {
            for (i = i0; i < i0 + run; i++) re[i] *= cr;
            continue;
        }
        for (i = i0; i < i0 + run; i++) {
            double ar = re[i], ai = im[i];
            re[i] = cr * ar - ci * ai;
            im[i] = cr * ai + ci * ar;
        }
    }
}

/* Ops with real matrices (a real state stays real): the CPU builder skips the imaginary parts
   until the first other op (hea(rot=y) never has one: half the flops of its states). */
static int qk__real_op(qk_op_kind k)
{
    return k == QK_OP_H || k == QK_OP_X || k == QK_OP_RY || k == QK_OP_Z || k == QK_OP_CZ || k == QK_OP_CNOT || k == QK_OP_BASIS;
}

/* Applies op o with angle t to the state (re, im) of q qubits; x is the sample (for BASIS).
   im NULL: the state is real and o one of the real ops (qk__real_op), which leave it real. */
QK__PRIV void qk__apply(const qk_op *o, double t, const double *x, double *re, double *im, int q)
{
    int64_t D = (int64_t)1 << q, i;
    double c = cos(0.5 * t), s = sin(0.5 * t), m[8];
    switch (o->kind) {
    case QK_OP_H: case QK_OP_X: case QK_OP_Y: case QK_OP_RX: case QK_OP_RY:
        qk__u1(o->kind, t, 0, m);
        qk__g1(re, im, D, o->q0, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]);
        break;
    case QK_OP_Z: qk__phase(re, im, D, (int64_t)1 << o->q0, (int64_t)1 << o->q0, -1, 0); break;
    case QK_OP_RZ:
        qk__phase(re, im, D, (int64_t)1 << o->q0, 0, c, -s);
        qk__phase(re, im, D, (int64_t)1 << o->q0, (int64_t)1 << o->q0, c, s);
        break;
    case QK_OP_P: qk__phase(re, im, D, (int64_t)1 << o->q0, (int64_t)1 << o->q0, cos(t), sin(t)); break;
    case QK_OP_CZ: {
        int64_t m = ((int64_t)1 << o->q0) | ((int64_t)1 << o->q1);
        qk__phase(re, im, D, m, m, -1, 0);
        break;
    }
    case QK_OP_RZZ: {
        /* e^{-it/2} where the two bits agree, e^{+it/2} where they differ */
        int64_t b0 = (int64_t)1 << o->q0, b1 = (int64_t)1 << o->q1;
        for (i = 0; i < D; i++) {
            int odd = ((i & b0) != 0) != ((i & b1) != 0);
            double ci = odd ? s : -s, ar = re[i], ai = im[i];
            re[i] = c * ar - ci * ai;
            im[i] = c * ai + ci * ar;
        }
        break;
    }
    case QK_OP_CNOT: {
        /* swap the amplitudes with the control set: target clear <-> target set, in runs of
           contiguous indices (qk__phase) */
        int64_t bc = (int64_t)1 << o->q0, bt = (int64_t)1 << o->q1, n = D >> 2, run = bc < bt ? bc : bt, j;
        for (j = 0; j < n; j += run) {
            const int64_t a0 = qk__masked_index(j, bc | bt, bc);
            for (i = a0; i < a0 + run; i++) {
                double tr = re[i];
                re[i] = re[i | bt];
                re[i | bt] = tr;
                if (im) { tr = im[i]; im[i] = im[i | bt]; im[i | bt] = tr; }
            }
        }
        break;
    }
    case QK_OP_BASIS:
        if (qk__u1(o->kind, t, qk__basis_one(x[o->angle.x0]), m))
            qk__g1(re, im, D, o->q0, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]);
        break;
    default: break; /* AMPLITUDE handled by the caller */
    }
}

/* ---- Hadamard runs: H on a set M of distinct qubits as one Walsh-Hadamard transform ----
   H^(x)M = 2^(-|M|/2) times add/subtract butterflies over the bits of M: 2 flops per amplitude
   and bit on the split (re, im) arrays, where the gate-by-gate path takes a general 2x2 complex
   matrix (14); the bits below QK__WHT_BLOCK go block by block in cache, with the scale, the
   others one pass each. A fresh |0> (the map's first ops, zz's and iqp's first layer) becomes
   the uniform superposition over M directly. */
#define QK__WHT_BLOCK 10
/* The run of H ops on distinct qubits at op k: its length, the qubits in *mask. */
static int qk__hrun(const qk_map *m, int k, int64_t *mask)
{
    int n = 0;
    int64_t M = 0;
    while (k + n < m->n_ops && m->ops[k + n].kind == QK_OP_H && !((M >> m->ops[k + n].q0) & 1)) {
        M |= (int64_t)1 << m->ops[k + n].q0;
        n++;
    }
    *mask = M;
    return n;
}
static double qk__wht_scale(int64_t M)
{
    int m = 0;
    for (; M; M &= M - 1) m++;
    return ldexp(m & 1 ? 0.70710678118654752440 : 1.0, -(m >> 1));
}
/* unnormalised butterflies on bit `bit` over amplitudes [lo, hi); im NULL: a real state */
/* the butterflies (i, i + bit) for i in [a, a + len), a range of one half-block */
static void qk__wht_pairs(double *re, double *im, int64_t a, int64_t len, int64_t bit)
{
    int64_t i;
    if (!im) {
        for (i = a; i < a + len; i++) {
            double ar = re[i], br = re[i + bit];
            re[i] = ar + br; re[i + bit] = ar - br;
        }
        return;
    }
    for (i = a; i < a + len; i++) {
        double ar = re[i], br = re[i + bit], ai = im[i], bi = im[i + bit];
        re[i] = ar + br; re[i + bit] = ar - br;
        im[i] = ai + bi; im[i + bit] = ai - bi;
    }
}
static void qk__wht_bit(double *re, double *im, int64_t lo, int64_t hi, int64_t bit)
{
    int64_t i0;
    for (i0 = lo; i0 < hi; i0 += 2 * bit) qk__wht_pairs(re, im, i0, bit, bit);
}
/* butterflies between polls in a pass of a high bit (a pass over a large state is tens of ms) */
#define QK__WHT_CHUNK ((int64_t)1 << 16)
/* poll (may be NULL): ticked per block and per pass over the state, so that a cancel stops a
   large transform part way (1: cancelled, the state half transformed) */
static int qk__wht(double *re, double *im, int q, int64_t M, qk__poll *poll)
{
    const int64_t D = (int64_t)1 << q, bs = (int64_t)1 << (q < QK__WHT_BLOCK ? q : QK__WHT_BLOCK);
    const double sc = qk__wht_scale(M);
    int64_t b0, i, bit, low = 0;
    for (bit = 1; bit < bs; bit <<= 1) low += (M & bit) != 0;
    if (M & (bs - 1)) {
        for (b0 = 0; b0 < D; b0 += bs) {
            for (bit = 1; bit < bs; bit <<= 1)
                if (M & bit) qk__wht_bit(re, im, b0, b0 + bs, bit);
            for (i = b0; i < b0 + bs; i++) { re[i] *= sc; if (im) im[i] *= sc; }
            if (poll && qk__poll_tick(poll, (low + 1) * bs)) return 1;
        }
    } else {
        for (i = 0; i < D; i++) { re[i] *= sc; if (im) im[i] *= sc; }
    }
    for (bit = bs; bit < D; bit <<= 1)
        if (M & bit) {
            int64_t s, len;
            for (b0 = 0; b0 < D; b0 += 2 * bit)
                for (s = 0; s < bit; s += QK__WHT_CHUNK) {
                    len = bit - s < QK__WHT_CHUNK ? bit - s : QK__WHT_CHUNK;
                    qk__wht_pairs(re, im, b0 + s, len, bit);
                    if (poll && qk__poll_tick(poll, 2 * len)) return 1;
                }
        }
    return 0;
}
/* H on the qubits of M applied to |0>: 2^(-|M|/2) at every index inside M */
static void qk__wht_fresh(double *re, int64_t M)
{
    const double sc = qk__wht_scale(M);
    int64_t s = M;
    for (;;) {
        re[s] = sc;
        if (!s) break;
        s = (s - 1) & M;
    }
}

/* ---- diagonal runs: a run of diagonal ops as one quadratic phase, applied by tables ----
   Z, RZ, P, CZ, RZZ and the zz pair CNOT(a,b) P(t)_b CNOT(a,b) are diagonal; a run of them is
   the phase e^{i f(b)} of the basis index b with
       f(b) = c0 + sum_i c_i b_i + sum_{i<j} d_ij b_i b_j
   (Z: pi b; RZ(t): -t/2 + t b; P(t): t b; CZ: pi b_a b_b; RZZ(t): -t/2 + t (b_a xor b_b); the
   pair: t (b_a xor b_b), and a xor b = a + b - 2ab). The index splits into g low bits l and
   q - g high bits h: f = T(l) + C_h(l) with T the low bits' own part (a table of 2^g phases
   built once per run) and C_h(l) = P_h + sum_{i<g} (sum_{j>=g} d_ij h_j) l_i, linear in l, so
   e^{i C_h} is a table of 2^g built by doubling (one complex product per entry) for each h.
   Each amplitude then takes two complex products, against one pass over the state per op
   before (a zz layer on q qubits: q (q + 1) / 2 passes). Scratch: qk__diag_scratch(q) doubles. */
#define QK__DIAG_LOW 10
/* QK__DIAG_MIN_QUBITS: in qk_internal.h */
QK__PRIV size_t qk__diag_scratch(int q)
{
    return 2 * ((size_t)q + (size_t)q * (size_t)q) + ((size_t)4 << QK__DIAG_LOW);
}

/* Length (in ops) of the diagonal op at k: 3 for a CNOT-D-CNOT parity op (qk__parity_at, the
   rule of every engine), 1 for a diagonal op, 0 otherwise. */
static int qk__diag_len(const qk_map *m, int k)
{
    const qk_op *o = &m->ops[k];
    if (qk__op_diag1(o->kind) || o->kind == QK_OP_CZ || o->kind == QK_OP_RZZ) return 1;
    if (qk__parity_at(m->ops, m->n_ops, k)) return 3;
    return 0;
}

/* Phases are summed without rounding error (two-sum: hi + lo) and reduced mod 2 pi before one
   cos/sin, so a phase summed from many angles (a zz layer on 14 qubits: |f| up to ~10^3) is as
   accurate as one angle: op by op, every op's rotation rounds once. */
static void qk__dd_add(double *hi, double *lo, double b)
{
    double s = *hi + b, bb = s - *hi;
    *lo += (*hi - (s - bb)) + (b - bb);
    *hi = s;
}

static double qk__dd_mod2pi(double hi, double lo)
{
    const double P2H = 6.283185307179586232, P2L = 2.4492935982947064e-16;
    double k = floor(hi / P2H + 0.5);
    return fma(-k, P2H, hi) + (lo - k * P2L);
}

/* Applies the diagonal ops [k0, k1) (whole ops of qk__diag_len) to the state. */
/* poll (may be NULL): ticked per block of 2^g amplitudes (1: cancelled, the phase half applied) */
static int qk__diag_run(const qk_map *m, int k0, int k1, const double *theta, double *re, double *im, int q, double *w, qk__poll *poll)
{
    const double PI = 3.14159265358979323846;
    const int g = q < QK__DIAG_LOW ? q : QK__DIAG_LOW;
    const int64_t G = (int64_t)1 << g, H = (int64_t)1 << (q - g);
    /* coefficients as hi/lo pairs while they are summed, then reduced into c[i], d[i * q + j] */
    double *c = w, *d = w + q, *cl = d + q * q, *dl = cl + q;
    double *tr = dl + q * q, *ti = tr + G;   /* e^{i T(l)} */
    double *hr = ti + G, *hi = hr + G;       /* e^{i C_h(l)} */
    double c0 = 0.0, c0l = 0.0;
    int64_t h, l;
    int k, i, j;
    memset(w, 0, sizeof(double) * 2 * (size_t)(q + q * q));
    for (k = k0; k < k1; k += qk__diag_len(m, k)) {
        const qk_op *o = &m->ops[k];
        const int a = o->q0, b = o->q1, ij = (a < b ? a : b) * q + (a < b ? b : a);
        double t = theta[k];
        switch (o->kind) {
        case QK_OP_Z: qk__dd_add(&c[a], &cl[a], PI); break;
        case QK_OP_RZ: qk__dd_add(&c0, &c0l, -0.5 * t); qk__dd_add(&c[a], &cl[a], t); break;
        case QK_OP_P: qk__dd_add(&c[a], &cl[a], t); break;
        case QK_OP_CZ: qk__dd_add(&d[ij], &dl[ij], PI); break;
        default: /* RZZ(t): -t/2 + t (a xor b); CNOT D CNOT: D's phases on the bit a xor b, Z: pi
                    (a xor b), RZ(t): -t/2 + t (a xor b), P(t): t (a xor b); a xor b = a + b - 2ab */
            if (o->kind == QK_OP_RZZ) qk__dd_add(&c0, &c0l, -0.5 * t);
            else {
                t = o[1].kind == QK_OP_Z ? PI : theta[k + 1];
                if (o[1].kind == QK_OP_RZ) qk__dd_add(&c0, &c0l, -0.5 * t);
            }
            qk__dd_add(&c[a], &cl[a], t);
            qk__dd_add(&c[b], &cl[b], t);
            qk__dd_add(&d[ij], &dl[ij], -2.0 * t);
            break;
        }
    }
    for (i = 0; i < q; i++) {
        c[i] = qk__dd_mod2pi(c[i], cl[i]);
        for (j = i + 1; j < q; j++) d[i * q + j] = qk__dd_mod2pi(d[i * q + j], dl[i * q + j]);
    }
    c0 = qk__dd_mod2pi(c0, c0l);
    for (l = 0; l < G; l++) {
        double f = c0, fl = 0.0;
        for (i = 0; i < g; i++) {
            if (!((l >> i) & 1)) continue;
            qk__dd_add(&f, &fl, c[i]);
            for (j = i + 1; j < g; j++) if ((l >> j) & 1) qk__dd_add(&f, &fl, d[i * q + j]);
        }
        f = qk__dd_mod2pi(f, fl);
        tr[l] = cos(f);
        ti[l] = sin(f);
    }
    for (h = 0; h < H; h++) {
        double ph = 0.0, phl = 0.0;
        int64_t span;
        double *ar = re + h * G, *ai = im + h * G;
        for (j = g; j < q; j++) {
            if (!((h >> (j - g)) & 1)) continue;
            qk__dd_add(&ph, &phl, c[j]);
            for (k = j + 1; k < q; k++) if ((h >> (k - g)) & 1) qk__dd_add(&ph, &phl, d[j * q + k]);
        }
        ph = qk__dd_mod2pi(ph, phl);
        hr[0] = cos(ph);
        hi[0] = sin(ph);
        for (i = 0, span = 1; i < g; i++, span <<= 1) {
            double lin = 0.0, linl = 0.0, er, ei;
            for (j = g; j < q; j++) if ((h >> (j - g)) & 1) qk__dd_add(&lin, &linl, d[i * q + j]);
            lin = qk__dd_mod2pi(lin, linl);
            er = cos(lin); ei = sin(lin);
            for (l = 0; l < span; l++) {
                hr[span + l] = hr[l] * er - hi[l] * ei;
                hi[span + l] = hr[l] * ei + hi[l] * er;
            }
        }
        for (l = 0; l < G; l++) {
            double fr = tr[l] * hr[l] - ti[l] * hi[l], fi = tr[l] * hi[l] + ti[l] * hr[l];
            double xr = ar[l], xi = ai[l];
            ar[l] = fr * xr - fi * xi;
            ai[l] = fr * xi + fi * xr;
        }
        if (poll && qk__poll_tick(poll, 2 * G)) return 1;
    }
    return 0;
}

/* A given state's row (qk_gram_states' map, op o) into re / im (zero-padded past dim by the
   caller), unchanged (the bits of the caller's amplitudes), or scaled to norm 1 where the op's
   flags ask for it. */
static void qk__state_row(const qk_op *o, const double *x, double *re, double *im)
{
    const int type = o->q0;
    const int64_t dim = o->angle.x0;
    int64_t k;
    double ss = 0.0, inv;
    if (o->q1 & QK__STATE_MIXED) {   /* a density matrix: [Re rho | Im rho] (real types: Re rho) */
        const int64_t d2 = dim * dim;
        double tr = 0.0;
        for (k = 0; k < d2; k++) qk__state_amp(x, type, k, &re[k], qk__state_complex(type) ? &re[d2 + k] : &ss);
        if (!(o->q1 & QK__STATE_NORMALIZE)) return;
        for (k = 0; k < dim; k++) tr += re[k * dim + k];
        inv = 1.0 / tr;
        for (k = 0; k < (qk__state_complex(type) ? 2 * d2 : d2); k++) re[k] *= inv;
        QK__UNUSED(im);
        return;
    }
    switch (type) {
    case QK_STATE_C128: for (k = 0; k < dim; k++) { re[k] = x[2 * k]; im[k] = x[2 * k + 1]; } break;
    case QK_STATE_C64: {
        const float *f = (const float *)(const void *)x;
        for (k = 0; k < dim; k++) { re[k] = f[2 * k]; im[k] = f[2 * k + 1]; }
        break;
    }
    case QK_STATE_F64: memcpy(re, x, sizeof(double) * (size_t)dim); break;
    default: {
        const float *f = (const float *)(const void *)x;
        for (k = 0; k < dim; k++) re[k] = f[k];
        break;
    }
    }
    if (!(o->q1 & QK__STATE_NORMALIZE)) return;
    for (k = 0; k < dim; k++) ss += re[k] * re[k] + im[k] * im[k];
    inv = 1.0 / sqrt(ss);
    for (k = 0; k < dim; k++) { re[k] *= inv; im[k] *= inv; }
}

/* ---- cancel while states are built ---- */

/* One state into re/im (2^q each). theta: scratch of n_ops + 1 + qk__diag_scratch(q) doubles.
   Data already validated. poll (may be NULL): a tick per op; on a cancel the state is left
   half built (the caller discards it). */
QK__PRIV void qk__state1(const qk_map *m, const double *x, double *re, double *im, double *theta, qk__poll *poll)
{
    int q = m->n_qubits, k;
    int64_t D = (int64_t)1 << q, i;
    int first = 0, cplx = 0; /* cplx: some op made the state complex (before: im is all 0) */
    memset(re, 0, sizeof(double) * (size_t)D);
    memset(im, 0, sizeof(double) * (size_t)D);
    if (m->n_ops > 0 && m->ops[0].kind == QK__OP_STATE) {   /* given states: as they are, or scaled */
        qk__state_row(&m->ops[0], x, re, im);
        return;
    }
    if (m->n_ops > 0 && m->ops[0].kind == QK_OP_AMPLITUDE) {
        double ss = 0.0, inv;
        for (k = 0; k < m->n_features; k++) ss += x[k] * x[k];
        inv = 1.0 / sqrt(ss);
        for (k = 0; k < m->n_features; k++) re[k] = x[k] * inv;
        first = 1;
    } else {
        re[0] = 1.0;
    }
    qk_map_angles(m, x, theta);
    for (k = first; k < m->n_ops; k++) {
        const qk_op *o = &m->ops[k];
        int k1 = k, nd = 0;
        int64_t hm;
        double *imc = cplx ? im : NULL; /* the imaginary parts, where they are not all 0 */
        /* a run of diagonal ops with at least three passes' worth: one table pass (above) */
        int angled = 0;
        /* a run of Hadamards on distinct qubits: one transform (above); on the fresh |0> (op 0,
           re[0] = 1, the rest 0) the superposition it makes */
        int nh = qk__hrun(m, k, &hm);
        if (nh >= 2) {
            if (k == 0) {
                qk__wht_fresh(re, hm);
                if (poll && qk__poll_tick(poll, (int64_t)nh * D / 4)) return;
            } else if (qk__wht(re, imc, q, hm, poll)) {
                return;
            }
            k += nh - 1;
            continue;
        }
        while (q >= QK__DIAG_MIN_QUBITS && k1 < m->n_ops && qk__diag_len(m, k1)) {
            const int dl = qk__diag_len(m, k1);
            const qk_op_kind dk = m->ops[k1 + (dl == 3)].kind;   /* a parity op's D */
            angled |= dk != QK_OP_Z && dk != QK_OP_CZ; /* Z, CZ (and CX Z CX) alone: exact -1 op by op */
            k1 += dl;
            nd++;
        }
        if (nd >= 3 && q >= QK__DIAG_MIN_QUBITS && angled) {
            cplx = 1;
            if (qk__diag_run(m, k, k1, theta, re, im, q, theta + m->n_ops + 1, poll)) return;
            k = k1 - 1;
            continue;
        }
        /* CNOT(a,b) D_b CNOT(a,b) (qk__parity_at; every zz pair is CX P CX) is D's diagonal
           taken on the bit a xor b: D's m00 where bits a and b agree, m11 where they differ (P:
           1 and e^{it}, the agreeing half left as it is): one pass instead of three */
        if (qk__parity_at(m->ops, m->n_ops, k)) {
            int64_t ba = (int64_t)1 << o->q0, bb = (int64_t)1 << o->q1;
            double u[8];
            int same, p;
            (void)qk__u1(o[1].kind, theta[k + 1], 0, u);
            same = u[0] == 1.0 && u[1] == 0.0;   /* m00 = 1 (P): the agreeing half stays */
            cplx = 1;
            for (i = 0; i < D; i++) {
                p = ((i & ba) != 0) != ((i & bb) != 0);
                if (p || !same) {
                    const double c = u[p ? 6 : 0], s = u[p ? 7 : 1], ar = re[i], ai = im[i];
                    re[i] = c * ar - s * ai;
                    im[i] = c * ai + s * ar;
                }
            }
            k += 2;
            if (poll && qk__poll_tick(poll, D)) return;
            continue;
        }
        if (!qk__real_op(o->kind)) cplx = 1;
        qk__apply(o, theta[k], x, re, cplx ? im : NULL, q);
        if (poll && qk__poll_tick(poll, D)) return;
    }
}

/* Product maps: the 2-vector of each qubit (u0, u1 complex) after its one-qubit ops, applied to
   |0>. out: q * 4 doubles per qubit in the shared layout (QK__QV_*). */
QK__PRIV void qk__product1(const qk_map *m, const double *x, double *out, double *theta)
{
    int q = m->n_qubits, k;
    for (k = 0; k < q; k++) {
        double *v = out + 4 * k;
        v[QK__QV_RE0] = 1; v[QK__QV_IM0] = 0; v[QK__QV_RE1] = 0; v[QK__QV_IM1] = 0;
    }
    qk_map_angles(m, x, theta);
    for (k = 0; k < m->n_ops; k++) {
        const qk_op *o = &m->ops[k];
        double *v = out + 4 * o->q0, re[2], im[2];
        qk_op local = *o;
        local.q0 = 0;
        re[0] = v[QK__QV_RE0]; re[1] = v[QK__QV_RE1]; im[0] = v[QK__QV_IM0]; im[1] = v[QK__QV_IM1];
        qk__apply(&local, theta[k], x, re, im, 1);
        v[QK__QV_RE0] = re[0]; v[QK__QV_RE1] = re[1]; v[QK__QV_IM0] = im[0]; v[QK__QV_IM1] = im[1];
    }
}


