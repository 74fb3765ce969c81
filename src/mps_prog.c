#include "qk_internal.h"
/* >>mps_prog ---- the MPS program: sites, bond bounds, steps (is a wide map MPS-able?) ---- */
/* Matrix product states for entangled maps whose gates are local (docs/mps.md). A sample's state
   is built exactly as an MPS over the qubits in a chosen order (sites), and K = |<psi(x)|psi(y)>|^2
   is a chain of transfer-matrix products, O(q chi^3) per pair instead of O(2^q).

   Bond bound. Across the bond between sites b-1 and b, the Schmidt rank of the state is at most
     - 2^min(b, q-b) (the smaller side's dimension), and
     - the product, over the circuit, of the operator Schmidt ranks of the gates crossing the bond:
       every two-qubit op of qk (CNOT, CZ, RZZ, and zz's CX-P-CX) has rank 2, and a run of
       consecutive diagonal ops (Z, RZ, P, CZ, RZZ, CX-D-CX) is one diagonal operator whose rank
       across the bond is at most 2^min(|L|, |R|), L and R the distinct qubits of its crossing pairs
       on each side. Any other op (H, X, Y, RX, RY, basis, a lone CNOT) ends the run.
   qk__mps_analyze walks the ops once and records, after every two-qubit step, this bound for each
   bond the step crosses (the "running" bound); the last values are the bond dimensions the MPS
   keeps. zz(reps=r, ent=linear) gets 2^r, circular 4^r, hea rings 4^layers (capped at the ends).
   Orders: the qubits in their own order ("natural") or folded, 0, q-1, 1, q-2, ... , which puts
   every ring pair at most two sites apart; the cheaper (sum of chi^3 over sites) is used.

   Building (exact). Every two-qubit op is a sum of two products, sum_t P_t (x) G_t, with P_t the
   projector on |t> of its first qubit: CNOT (G = I, X), CZ (I, Z), RZZ and CX-D-CX (diagonal). It
   is applied as an MPO of bond 2: the projector site, the sites between (identity on a doubled
   bond) and the other site; no factorization. Where a bond then exceeds its running bound (never
   for zz linear reps 1, at the chain's ends for reps 2), the sites touched since the last
   compression are swept: Householder QR left to right (left-orthonormal sites), then column-
   pivoted Householder QR of each site's conjugate transpose right to left, keeping the running
   bound's number of columns. With the sites outside the swept range orthonormal, the part dropped
   is the trailing block of the pivoted QR, zero in exact arithmetic because the bound is a
   theorem: what is dropped is rounding (its norm is measured, qk__mps_build's *discarded: about
   1e-15). Nothing else is ever truncated. Precision: fp64 throughout.

   Storage. The tensors of QK__NJ (8) samples are interleaved by lane: site s of group g is
   [l][a][r] entries of 8 real parts then 8 imaginary parts, with the bond dimensions of the bound
   (zero-padded where a sample's own rank is lower), so one pass of the contraction computes 8
   overlaps with vector FMAs. Overlap of row sample i with a column group: E = 1;
   per site T[l][a][r'] = sum_l' E[l][l'] B[l'][a][r'], E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a][r'];
   K = |E|^2 at the end. The Gram tiles, symmetric mirroring, callback / .npy output, threads,
   progress and cancel are the CPU engine's (qk__gram_job with path MPS). */
/* QK__MPS_SAT, the step kinds, qk__mps_step, qk__mps_prog: in qk_internal.h (later sources use them) */

QK__PRIV void qk__mps_prog_free(qk__mps_prog *p)
{
    if (!p) return;
    QK_FREE(p->order); QK_FREE(p->D); QK_FREE(p->off); QK_FREE(p->steps); QK_FREE(p->bounds);
    memset(p, 0, sizeof *p);
}

/* Op k and the two after it are CX(a,b) D(b) CX(a,b) with D diagonal: one diagonal two-qubit op
   (the parity rule of every engine, qk__parity_at). */
static int qk__mps_parity_at(const qk_map *m, int k) { return qk__parity_at(m->ops, m->n_ops, k); }

static int qk__mps_add_set(int *set, int *n, int qb)
{
    int i;
    if (*n > QK__MPS_SET) return 0;                 /* already "many" */
    for (i = 0; i < *n; i++) if (set[i] == qb) return 0;
    if (*n < QK__MPS_SET) set[*n] = qb;
    (*n)++;
    return 1;
}

/* The program and bounds of map m in the natural (folded = 0) or folded order. The walk stops as
   soon as a bound exceeds limit (p->chi then says by how much). QK_OK or QK_ERROR_OUT_OF_MEMORY. */
/* The lane layout and the cost of bonds D[0..q]: each site's offset in a sample's group
   (QK__NJ lanes of D[s] x 2 x D[s+1] complex), the group's size, and pair_flops. */
static void qk__mps_prog_layout(qk__mps_prog *p, int q)
{
    int64_t e = 0;
    int s;
    p->pair_flops = 0;
    for (s = 0; s < q; s++) {
        p->off[s] = e;
        e += (int64_t)p->D[s] * 2 * p->D[s + 1] * 2 * QK__NJ;
        p->pair_flops += 4.0 * 2.0 * p->D[s] * p->D[s + 1] * (double)(p->D[s] + p->D[s + 1]);
    }
    p->off[q] = e;
    p->group = e;
}

static qk_result qk__mps_analyze(const qk_map *m, int folded, int limit, qk__mps_prog *p)
{
    const int q = m->n_qubits;
    int *pos = NULL, *base = NULL, *runid = NULL, *sets = NULL, *cap = NULL, *cur;
    int64_t nb = 0, nb_cap = 0;
    int k, s, b, run = 0, stopped = 0;
    memset(p, 0, sizeof *p);
    p->q = q;
    p->folded = folded;
    p->chi = 1;
    p->order = (int *)qk__malloc(sizeof(int) * (size_t)q);
    p->D = (int *)qk__calloc((size_t)q + 1, sizeof(int));
    p->off = (int64_t *)qk__calloc((size_t)q + 1, sizeof(int64_t));
    p->steps = (qk__mps_step *)qk__malloc(sizeof(qk__mps_step) * (size_t)(m->n_ops > 0 ? m->n_ops : 1));
    pos = (int *)qk__malloc(sizeof(int) * (size_t)q);
    base = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    runid = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    cap = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    sets = (int *)qk__calloc((size_t)(q + 1) * (2 * QK__MPS_SET + 2), sizeof(int));
    if (!p->order || !p->D || !p->off || !p->steps || !pos || !base || !runid || !cap || !sets) goto oom;
    cur = p->D;
    for (s = 0; s < q; s++) {
        p->order[s] = !folded ? s : (s % 2 == 0 ? s / 2 : q - 1 - s / 2);
        pos[p->order[s]] = s;
    }
    for (b = 0; b <= q; b++) {
        int small = b < q - b ? b : q - b;
        cur[b] = 1; base[b] = 1; runid[b] = -1;
        cap[b] = small >= 30 ? QK__MPS_SAT : 1 << small;
    }
    for (k = 0; k < m->n_ops && !stopped; k++) {
        const qk_op *o = &m->ops[k];
        qk__mps_step *st = &p->steps[p->n_steps];
        int diag;
        if (o->kind == QK_OP_AMPLITUDE || o->kind == QK__OP_STATE) { p->dense = 1; p->chi = QK__MPS_SAT; break; }
        if (qk__op_arity(o->kind) == 1) {
            st->kind = 1; st->op = k; st->s0 = st->s1 = pos[o->q0];
            if (!qk__op_diag1(o->kind)) run++;
            p->n_steps++;
            continue;
        }
        st->kind = 2;
        st->op = k;
        if (qk__mps_parity_at(m, k)) { st->gate = QK__MPS_PARITY; st->op = k + 1; k += 2; }
        else st->gate = o->kind == QK_OP_CNOT ? QK__MPS_CNOT : o->kind == QK_OP_CZ ? QK__MPS_CZ : QK__MPS_RZZ;
        st->s0 = pos[o->q0] < pos[o->q1] ? pos[o->q0] : pos[o->q1];
        st->s1 = pos[o->q0] < pos[o->q1] ? pos[o->q1] : pos[o->q0];
        st->proj_left = pos[o->q0] == st->s0;
        if (st->s1 - st->s0 > p->span) p->span = st->s1 - st->s0;
        diag = st->gate != QK__MPS_CNOT;
        if (!diag) run++;
        if (nb + (st->s1 - st->s0) > nb_cap) {
            int64_t nc = nb_cap ? 2 * nb_cap : 1024;
            int *nbp;
            while (nc < nb + (st->s1 - st->s0)) nc *= 2;
            nbp = (int *)qk__realloc(p->bounds, sizeof(int) * (size_t)nc);
            if (!nbp) goto oom;
            p->bounds = nbp;
            nb_cap = nc;
        }
        st->b = nb;
        for (b = st->s0 + 1; b <= st->s1; b++) {
            if (diag) {
                int *sl = sets + (size_t)b * (2 * QK__MPS_SET + 2), *nl = sl + 2 * QK__MPS_SET, *nr = nl + 1;
                int sh;
                if (runid[b] != run) { base[b] = cur[b]; *nl = 0; *nr = 0; runid[b] = run; }
                qk__mps_add_set(sl, nl, p->order[st->s0]);
                qk__mps_add_set(sl + QK__MPS_SET, nr, p->order[st->s1]);
                sh = *nl < *nr ? *nl : *nr;
                cur[b] = (sh >= 30 || (int64_t)base[b] << sh >= cap[b]) ? cap[b] : base[b] << sh;
            } else {
                cur[b] = (int64_t)cur[b] * 2 >= cap[b] ? cap[b] : cur[b] * 2;
                runid[b] = -1;
            }
            p->bounds[nb++] = cur[b];
            if (cur[b] > p->chi) { p->chi = cur[b]; p->chi_bond = b; }
            if (cur[b] > limit) stopped = 1;
        }
        if (!diag) run++;
        p->n_steps++;
    }
    p->n_bounds = nb;
    /* lane layout and cost (meaningful when the walk finished) */
    p->D[0] = p->D[q] = 1;
    qk__mps_prog_layout(p, q);
    QK_FREE(pos); QK_FREE(base); QK_FREE(runid); QK_FREE(cap); QK_FREE(sets);
    return QK_OK;
oom:
    QK_FREE(pos); QK_FREE(base); QK_FREE(runid); QK_FREE(cap); QK_FREE(sets);
    qk__mps_prog_free(p);
    return qk__fail(QK_ERROR_OUT_OF_MEMORY, "mps: out of host memory analysing the map");
}

/* Truncation: every bound capped at max_bond (the exact bound stays in exact_chi); the lane
   layout and the cost follow the capped bonds. */
static void qk__mps_cap(qk__mps_prog *p, int max_bond, double cutoff)
{
    int s;
    int64_t k;
    p->exact_chi = p->chi;
    if (max_bond >= p->chi) max_bond = 0;   /* nothing to cap: exact (the bound is a theorem) */
    p->max_bond = max_bond;
    p->cutoff = cutoff;
    if (max_bond <= 0 || p->dense) return;
    for (k = 0; k < p->n_bounds; k++) if (p->bounds[k] > max_bond) p->bounds[k] = max_bond;
    for (s = 0; s <= p->q; s++) if (p->D[s] > max_bond) p->D[s] = max_bond;
    if (p->chi > max_bond) p->chi = max_bond;
    qk__mps_prog_layout(p, p->q);
}

/* The program of given MPS (qk_gram_mps_states): natural order, the bonds qk__mpsmap holds (the
   largest of every sample), no steps. */
static QK__NOINLINE qk_result qk__mps_given_prog(const qk_map *m, qk__mps_prog *p)
{
    const qk__mpsmap *mm = (const qk__mpsmap *)(const void *)m;
    const int q = m->n_qubits;
    int s;
    memset(p, 0, sizeof *p);
    p->q = q;
    p->given = 1;
    p->chi = 1;
    p->order = (int *)qk__malloc(sizeof(int) * (size_t)q);
    p->D = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    p->off = (int64_t *)qk__malloc(sizeof(int64_t) * (size_t)(q + 1));
    p->steps = (qk__mps_step *)qk__malloc(sizeof(qk__mps_step));
    if (!p->order || !p->D || !p->off || !p->steps) {
        qk__mps_prog_free(p);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "mps: out of host memory for the program of %d sites", q);
    }
    for (s = 0; s <= q; s++) {
        if (s < q) p->order[s] = s;
        p->D[s] = mm->D[s];
        if (p->D[s] > p->chi) { p->chi = p->D[s]; p->chi_bond = s; }
    }
    p->exact_chi = p->chi;
    qk__mps_prog_layout(p, q);
    return QK_OK;
}

/* The MPS program of an entangled map: the cheaper of the two orders (ties: the smaller span,
   then natural). p->chi > QK_MPS_MAX_BOND or p->dense: not MPS-able. max_bond > 0 caps every
   bond (truncation), cutoff > 0 drops small Schmidt values (both: qk_gram_desc). */
QK__PRIV qk_result qk__mps_prog_make_t(const qk_map *m, int max_bond, double cutoff, qk__mps_prog *p)
{
    qk__mps_prog f;
    const int limit = max_bond > 0 ? QK__MPS_SAT : QK_MPS_MAX_BOND;
    qk_result r;
    if (qk__map_is_mps(m)) return qk__mps_given_prog(m, p);   /* given MPS: no truncation (gram.c refuses it) */
    r = qk__mps_analyze(m, 0, limit, p);
    if (r != QK_OK) return r;
    qk__mps_cap(p, max_bond, cutoff);
    if (p->dense || m->n_qubits < 3) return r;
    r = qk__mps_analyze(m, 1, limit, &f);
    if (r != QK_OK) { qk__mps_prog_free(p); return r; }
    qk__mps_cap(&f, max_bond, cutoff);
    if (f.chi <= QK_MPS_MAX_BOND &&
        (p->chi > QK_MPS_MAX_BOND || f.pair_flops < p->pair_flops || (f.pair_flops == p->pair_flops && f.span < p->span))) {
        qk__mps_prog_free(p);
        *p = f;
    } else {
        qk__mps_prog_free(&f);
    }
    return QK_OK;
}

QK__PRIV qk_result qk__mps_prog_make(const qk_map *m, qk__mps_prog *p) { return qk__mps_prog_make_t(m, 0, 0.0, p); }

/* For qk_map_make: an entangled map beyond QK_MAX_STATE_QUBITS is kept when it is MPS-able.
   Returns its bond bound (> QK_MPS_MAX_BOND: not MPS-able). */
QK__PRIV int qk__mps_bond_of(const qk_map *m)
{
    qk__mps_prog p;
    int chi;
    if (qk__mps_prog_make(m, &p) != QK_OK) return QK__MPS_SAT;
    chi = p.dense ? QK__MPS_SAT : p.chi;
    qk__mps_prog_free(&p);
    return chi;
}
