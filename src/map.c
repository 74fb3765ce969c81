#include "qk_internal.h"
/* >>maps_impl ---- maps, angles, data checks ---- */
#include <float.h>

/* Numbers in C syntax whatever the locale. A program that calls setlocale(LC_ALL, "de_DE.UTF-8")
   makes strtod expect "0,5" and printf write it: qk reads and writes '.' all the same. Reading:
   qk__num_len scans a C-syntax number ([+-] digits [. digits] [(e|E) [+-] digits], or inf /
   infinity / nan where allowed), whose '.' is then replaced by the locale's decimal point and
   handed to strtod, which rounds correctly (any length: long numbers go through the heap).
   Writing: qk__fmt_g prints with %g and puts '.' back. The locale's decimal point is found by
   printing 1.5 (snprintf is reentrant where localeconv is not). */
/* qk__radix: in qk_internal.h */

QK__PRIV void qk__radix_init(qk__radix *r)
{
    char b[32];
    int n = snprintf(b, sizeof b, "%.1f", 1.5);
    r->s[0] = '.';
    r->s[1] = 0;
    r->n = 1;
    /* "1" + decimal point + "5" */
    if (n >= 3 && b[0] == '1' && b[n - 1] == '5' && (size_t)(n - 2) < sizeof r->s) {
        memcpy(r->s, b + 1, (size_t)(n - 2));
        r->n = (size_t)(n - 2);
        r->s[r->n] = 0;
    }
}

/* %.*g of v with '.' as the decimal point, into buf; returns buf. */
QK__PRIV const char *qk__fmt_g(char *buf, size_t size, double v, int prec)
{
    qk__radix rx;
    char tmp[64], *dp;
    size_t n;
    qk__radix_init(&rx);
    snprintf(tmp, sizeof tmp, "%.*g", prec, v);
    if (!(rx.n == 1 && rx.s[0] == '.') && (dp = strstr(tmp, rx.s)) != NULL) {
        *dp = '.';
        memmove(dp + 1, dp + rx.n, strlen(dp + rx.n) + 1);
    }
    n = strlen(tmp);
    if (size) {
        if (n >= size) n = size - 1;
        memcpy(buf, tmp, n);
        buf[n] = 0;
    }
    return buf;
}

/* An angle as the spec parser reads it back (qk_map_spec, error messages). */
QK__PRIV int qk__fmt_angle(const qk_angle *a, char *buf, size_t size)
{
    char off[40] = "", sc[40];
    if (a->kind == QK_ARG_CONST) return snprintf(buf, size, "%s", qk__fmt_g(sc, sizeof sc, a->offset, 17));
    if (a->offset != 0.0) {
        off[0] = '+';
        qk__fmt_g(off + (a->offset < 0 ? 0 : 1), sizeof off - 1, a->offset, 17);
    }
    qk__fmt_g(sc, sizeof sc, a->scale, 17);
    switch (a->kind) {
    case QK_ARG_X: return snprintf(buf, size, "%s*x%d%s", sc, a->x0, off);
    case QK_ARG_XX: return snprintf(buf, size, "%s*x%d*x%d%s", sc, a->x0, a->x1, off);
    case QK_ARG_PIXX: return snprintf(buf, size, "%s*(pi-x%d)*(pi-x%d)%s", sc, a->x0, a->x1, off);
    case QK_ARG_W: return snprintf(buf, size, "%s*w%d%s", sc, a->w, off);
    case QK_ARG_WX: return snprintf(buf, size, "%s*w%d*x%d%s", sc, a->w, a->x0, off);
    default: return snprintf(buf, size, "0");
    }
}

QK__PRIV int qk__ci_eq(const char *s, size_t n, const char *word)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (!word[i] || tolower((unsigned char)s[i]) != word[i]) return 0;
    return word[n] == 0;
}

/* Length of the C-syntax number at the start of s (n bytes), 0 when there is none. special:
   also inf, infinity, nan (any case, after an optional sign). */
QK__PRIV size_t qk__num_len(const char *s, size_t n, int special)
{
    size_t i = 0, digits = 0, k;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    if (special) {
        static const char *words[] = {"infinity", "inf", "nan"};
        for (k = 0; k < 3; k++) {
            size_t wl = strlen(words[k]);
            if (n - i >= wl && qk__ci_eq(s + i, wl, words[k]) && (n - i == wl || !isalnum((unsigned char)s[i + wl])))
                return i + wl;
        }
    }
    while (i < n && isdigit((unsigned char)s[i])) { i++; digits++; }
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && isdigit((unsigned char)s[i])) { i++; digits++; }
    }
    if (!digits) return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        if (j < n && isdigit((unsigned char)s[j])) {
            while (j < n && isdigit((unsigned char)s[j])) j++;
            i = j;
        }
    }
    return i;
}

/* Converts the n bytes at s, a whole qk__num_len token, to *v (an out-of-range value becomes
   +-Inf, as strtod makes it). Returns 1, or 0 when out of memory (a token over 255 bytes). */
QK__PRIV int qk__strtod_c(const char *s, size_t n, const qk__radix *rx, double *v)
{
    char small[256], *buf = small, *end;
    size_t i, k = 0, need = n + (rx->n - 1) + 1;
    if (need > sizeof small) {
        buf = (char *)QK_MALLOC(need);
        if (!buf) return 0;
    }
    for (i = 0; i < n; i++) {
        if (s[i] == '.') { memcpy(buf + k, rx->s, rx->n); k += rx->n; }
        else buf[k++] = s[i];
    }
    buf[k] = 0;
    *v = strtod(buf, &end);
    if (buf != small) QK_FREE(buf);
    return 1;
}



/* qk__ops: in qk_internal.h */

QK__PRIV void qk__push(qk__ops *l, qk_op_kind kind, int q0, int q1, qk_angle a)
{
    if (l->oom) return;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        qk_op *p = (qk_op *)qk__realloc(l->ops, (size_t)cap * sizeof(qk_op));
        if (!p) { l->oom = 1; return; }
        l->ops = p;
        l->cap = cap;
    }
    l->ops[l->n].kind = kind;
    l->ops[l->n].q0 = q0;
    l->ops[l->n].q1 = q1;
    l->ops[l->n].angle = a;
    l->n++;
}

QK__PRIV qk_angle qk__ang(qk_arg_kind kind, int x0, int x1, int w, double scale, double offset)
{
    qk_angle a;
    a.kind = kind; a.x0 = x0; a.x1 = x1; a.w = w; a.scale = scale; a.offset = offset;
    return a;
}
QK__PRIV qk_angle qk__noang(void) { return qk__ang(QK_ARG_CONST, 0, 0, 0, 1.0, 0.0); }


/* Entangling pairs of rep r for a pattern (Qiskit's get_entangler_map for 2-qubit blocks). */
static int qk__pairs(qk_entanglement ent, int q, int rep, int (*pairs)[2], int max)
{
    int n = 0, i, j;
#define QK__PAIR(a, b) do { if (n < max) { pairs[n][0] = (a); pairs[n][1] = (b); } n++; } while (0)
    if (q < 2) return 0;
    switch (ent) {
    case QK_ENT_LINEAR:
        for (i = 0; i + 1 < q; i++) QK__PAIR(i, i + 1);
        break;
    case QK_ENT_REVERSE_LINEAR:
        for (i = q - 2; i >= 0; i--) QK__PAIR(i, i + 1);
        break;
    case QK_ENT_CIRCULAR:
        if (q > 2) QK__PAIR(q - 1, 0);
        for (i = 0; i + 1 < q; i++) QK__PAIR(i, i + 1);
        break;
    case QK_ENT_PAIRWISE:
        for (i = 0; i + 1 < q; i += 2) QK__PAIR(i, i + 1);
        for (i = 1; i + 1 < q; i += 2) QK__PAIR(i, i + 1);
        break;
    case QK_ENT_SCA: {
        /* shifted circular alternating: the circular list rotated by rep, pairs flipped on odd
           reps. The zz blocks are diagonal and commute, so only the set of pairs changes states. */
        int c = (q > 2) ? q : q - 1, k;
        for (k = 0; k < c; k++) {
            int idx = ((k - rep) % c + c) % c, a, b;
            if (q > 2) { a = idx == 0 ? q - 1 : idx - 1; b = idx == 0 ? 0 : idx; }
            else { a = idx; b = idx + 1; }
            if (rep % 2 == 1) QK__PAIR(b, a); else QK__PAIR(a, b);
        }
        break;
    }
    case QK_ENT_FULL:
    case QK_ENT_DEFAULT:
    default:
        for (i = 0; i < q; i++)
            for (j = i + 1; j < q; j++) QK__PAIR(i, j);
        break;
    }
#undef QK__PAIR
    return n;
}

static qk_map_class qk__classify(const qk_op *ops, int n)
{
    int i, entangled = 0, real = 1;
    for (i = 0; i < n; i++) {
        switch (ops[i].kind) {
        case QK_OP_CNOT: case QK_OP_CZ: case QK_OP_RZZ: case QK_OP_AMPLITUDE: entangled = 1; break;
        default: break;
        }
        switch (ops[i].kind) {
        case QK_OP_H: case QK_OP_X: case QK_OP_Z: case QK_OP_RY: case QK_OP_CNOT: case QK_OP_CZ:
        case QK_OP_AMPLITUDE: case QK_OP_BASIS: break;
        default: real = 0; break;
        }
    }
    if (!entangled) return QK_CLASS_PRODUCT;
    return real ? QK_CLASS_REAL : QK_CLASS_COMPLEX;
}

QKDEF const char *qk_map_class_string(qk_map_class c)
{
    switch (c) {
    case QK_CLASS_PRODUCT: return "product (analytic)";
    case QK_CLASS_REAL: return "real";
    case QK_CLASS_COMPLEX: return "complex";
    default: return "?";
    }
}

static qk_result qk__validate_ops(const qk_op *ops, int n_ops, int q, int d, int nw)
{
    int i;
    for (i = 0; i < n_ops; i++) {
        const qk_op *o = &ops[i];
        int ar;
        if (o->kind < QK_OP_H || o->kind >= QK_OP_KIND_COUNT_)
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: unknown op kind %d", i, (int)o->kind);
        ar = qk__op_arity(o->kind);
        if (o->kind == QK_OP_AMPLITUDE) {
            if (i != 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: amplitude encoding must be the first op", i);
            if (q < 31 && (int64_t)d > ((int64_t)1 << q))
                return qk__fail(QK_ERROR_SHAPE, "amplitude encoding of %d features needs at least %d qubits, map has %d", d, (int)ceil(log2((double)d)), q);
            continue;
        }
        if (ar >= 1 && (o->q0 < 0 || o->q0 >= q))
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: qubit %d out of range [0, %d)", i, o->q0, q);
        if (ar == 2 && (o->q1 < 0 || o->q1 >= q || o->q1 == o->q0))
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: second qubit %d invalid (range [0, %d), distinct from %d)", i, o->q1, q, o->q0);
        if (o->kind == QK_OP_BASIS) {
            if (o->angle.x0 < 0 || o->angle.x0 >= d)
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: basis feature x%d out of range [0, %d)", i, o->angle.x0, d);
            continue;
        }
        if (!qk__op_has_angle(o->kind)) continue;
        if (!isfinite(o->angle.scale) || !isfinite(o->angle.offset))
            return qk__fail(QK_ERROR_NON_FINITE, "op %d: angle scale/offset not finite", i);
        switch (o->angle.kind) {
        case QK_ARG_CONST: break;
        case QK_ARG_X:
            if (o->angle.x0 < 0 || o->angle.x0 >= d) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: feature x%d out of range [0, %d)", i, o->angle.x0, d);
            break;
        case QK_ARG_XX: case QK_ARG_PIXX:
            if (o->angle.x0 < 0 || o->angle.x0 >= d || o->angle.x1 < 0 || o->angle.x1 >= d)
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: feature x%d or x%d out of range [0, %d)", i, o->angle.x0, o->angle.x1, d);
            break;
        case QK_ARG_WX: case QK_ARG_W:   /* (no fall-through: a comment that says so is gone where nvcc compiles qk.h) */
            if (o->angle.kind == QK_ARG_WX && (o->angle.x0 < 0 || o->angle.x0 >= d))
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: feature x%d out of range [0, %d)", i, o->angle.x0, d);
            if (o->angle.w < 0 || o->angle.w >= nw) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: weight w%d out of range [0, %d)", i, o->angle.w, nw);
            break;
        default:
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: unknown angle kind %d", i, (int)o->angle.kind);
        }
    }
    return QK_OK;
}

/* The resource bounds (QK_MAX_REPS, QK_MAX_OPS, QK_MAX_WEIGHTS, the state-qubit limit of
   entangling built-ins), checked on the resolved desc before anything is allocated. The op
   count is computed the way the builders below push ops (q <= QK_MAX_STATE_QUBITS keeps the
   pair counting cheap). */
static qk_result qk__map_bounds(const qk_map_desc *d)
{
    static const char *names[] = {"?", "zz", "iqp", "angle", "amplitude", "basis", "hea", "circuit"};
    const char *nm = names[(int)d->type >= 0 && (int)d->type <= QK_MAP_CUSTOM ? (int)d->type : 0];
    int q = d->n_qubits, rep;
    int64_t ops = 0, nw = 0;
    int reps = d->reps ? d->reps : (d->type == QK_MAP_IQP ? 1 : 2);
    int entangling = d->type == QK_MAP_AMPLITUDE ||
                     (q >= 2 && (d->type == QK_MAP_ZZ || d->type == QK_MAP_IQP || d->type == QK_MAP_HEA));
    /* zz with a local pattern and hea rings may take the MPS path beyond the statevector (their
       bound is checked once the ops are built); all-to-all and dense maps never can */
    int local = (d->type == QK_MAP_ZZ && d->ent != QK_ENT_FULL) || d->type == QK_MAP_HEA;
    if (entangling && q > QK_MAX_STATE_QUBITS && !local)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "map: %s of %d qubits exceeds the state limit of %d qubits "
                        "(QK_MAX_STATE_QUBITS; beyond, only product maps and local maps on the MPS path: docs/mps.md)", nm, q, QK_MAX_STATE_QUBITS);
    if ((d->type == QK_MAP_ZZ || d->type == QK_MAP_IQP || d->type == QK_MAP_HEA) && reps > QK_MAX_REPS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: %s with %s=%d exceeds QK_MAX_REPS (%d)", nm,
                        d->type == QK_MAP_HEA ? "layers" : "reps", reps, QK_MAX_REPS);
    switch (d->type) {
    case QK_MAP_ZZ:
        for (rep = 0; rep < reps; rep++) ops += 2 * (int64_t)q + 3 * (int64_t)qk__pairs(d->ent, q, rep, NULL, 0);
        break;
    case QK_MAP_IQP: ops = (int64_t)reps * (2 * (int64_t)q + (int64_t)q * (q - 1) / 2); break;
    case QK_MAP_ANGLE: case QK_MAP_BASIS: ops = q; break;
    case QK_MAP_AMPLITUDE: ops = 1; break;
    case QK_MAP_HEA: {
        int per = (d->rot == 'z' || d->rot == 'Z') ? 2 : 1;
        ops = (int64_t)reps * ((int64_t)per * q + (q == 2 ? 1 : q >= 3 ? q : 0));
        nw = (int64_t)reps * q * per;
        break;
    }
    case QK_MAP_CUSTOM: ops = d->n_ops; nw = d->n_weights; break;
    default: break;
    }
    if (ops > QK_MAX_OPS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: %s of %d qubits would have %lld ops, more than QK_MAX_OPS (%d)",
                        nm, q, (long long)ops, (int)QK_MAX_OPS);
    if (nw > QK_MAX_WEIGHTS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: %s would have %lld weights, more than QK_MAX_WEIGHTS (%d)",
                        nm, (long long)nw, (int)QK_MAX_WEIGHTS);
    return QK_OK;
}


/* Fills the desc's defaults (type, qubits, alpha, entanglement) and checks its shape and
   resource bounds: everything a builder may rely on. */
static qk_result qk__map_resolve(qk_map_desc *d)
{
    d->type = d->type ? d->type : QK_MAP_ZZ;
    if (d->n_features <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: n_features must be > 0 (got %d)", d->n_features);
    if (d->n_qubits < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: n_qubits must be >= 0 (got %d)", d->n_qubits);
    if (d->reps < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: reps must be >= 0 (got %d)", d->reps);
    if (d->type == QK_MAP_AMPLITUDE) {
        int need = 0;
        while (need < 62 && ((int64_t)1 << need) < (int64_t)d->n_features) need++;
        if (need == 0) need = 1;
        d->n_qubits = qk__def_i(d->n_qubits, need);
        if (d->n_qubits < need) return qk__fail(QK_ERROR_SHAPE, "amplitude: %d features need at least %d qubits (qubits=%d)", d->n_features, need, d->n_qubits);
    } else if (d->type == QK_MAP_CUSTOM) {
        if (d->n_qubits <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "custom map: n_qubits must be > 0");
    } else {
        d->n_qubits = qk__def_i(d->n_qubits, d->n_features);
        if (d->type != QK_MAP_HEA && d->n_qubits != d->n_features)
            return qk__fail(QK_ERROR_SHAPE, "map: this map uses one qubit per feature (qubits=%d, features=%d)", d->n_qubits, d->n_features);
    }
    if (d->n_qubits > QK_MAX_PRODUCT_QUBITS)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "map: %d qubits exceed QK_MAX_PRODUCT_QUBITS (%d)", d->n_qubits, QK_MAX_PRODUCT_QUBITS);
    d->alpha = qk__def_d(d->alpha, 2.0);
    if (!isfinite(d->alpha)) return qk__fail(QK_ERROR_NON_FINITE, "zz: alpha is not finite");
    d->ent = d->ent ? d->ent : QK_ENT_FULL;
    if (d->ent < QK_ENT_FULL || d->ent > QK_ENT_SCA) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: unknown entanglement %d", (int)d->ent);
    return qk__map_bounds(d);
}

/* The builders, one per map type: each takes the resolved desc (and fills the defaults that are
   its own: reps, rot), pushes the op list into *l (l->oom on a failed allocation) and sets *nw,
   the number of weights. */

/* Qiskit ZZFeatureMap: per rep, H and P(alpha x_i) on every qubit, then CNOT,
   P(alpha (pi - x_a)(pi - x_b)), CNOT on each pair of the entanglement pattern. */
static qk_result qk__map_zz(qk_map_desc *d, qk__ops *l, int *nw)
{
    int q = d->n_qubits, rep, i, k;
    d->reps = qk__def_i(d->reps, 2);
    *nw = 0;
    for (rep = 0; rep < d->reps; rep++) {
        int np = qk__pairs(d->ent, q, rep, NULL, 0);
        int (*pairs)[2] = (int (*)[2])qk__malloc(sizeof(int[2]) * (size_t)(np > 0 ? np : 1));
        if (!pairs) { l->oom = 1; break; }
        qk__pairs(d->ent, q, rep, pairs, np);
        for (i = 0; i < q; i++) qk__push(l, QK_OP_H, i, 0, qk__noang());
        for (i = 0; i < q; i++) qk__push(l, QK_OP_P, i, 0, qk__ang(QK_ARG_X, i, 0, 0, d->alpha, 0.0));
        for (k = 0; k < np; k++) {
            int a = pairs[k][0], b = pairs[k][1];
            qk__push(l, QK_OP_CNOT, a, b, qk__noang());
            qk__push(l, QK_OP_P, b, 0, qk__ang(QK_ARG_PIXX, a, b, 0, d->alpha, 0.0));
            qk__push(l, QK_OP_CNOT, a, b, qk__noang());
        }
        QK_FREE(pairs);
    }
    return QK_OK;
}

/* PennyLane IQPEmbedding: per rep, H and RZ(x_i) on every qubit, RZZ(x_i x_j) on every pair. */
static qk_result qk__map_iqp(qk_map_desc *d, qk__ops *l, int *nw)
{
    int q = d->n_qubits, rep, i, j;
    d->reps = qk__def_i(d->reps, 1);
    *nw = 0;
    for (rep = 0; rep < d->reps; rep++) {
        for (i = 0; i < q; i++) qk__push(l, QK_OP_H, i, 0, qk__noang());
        for (i = 0; i < q; i++) qk__push(l, QK_OP_RZ, i, 0, qk__ang(QK_ARG_X, i, 0, 0, 1.0, 0.0));
        for (i = 0; i < q; i++)
            for (j = i + 1; j < q; j++) qk__push(l, QK_OP_RZZ, i, j, qk__ang(QK_ARG_XX, i, j, 0, 1.0, 0.0));
    }
    return QK_OK;
}

/* PennyLane AngleEmbedding: R_rot(x_i) on qubit i. */
static qk_result qk__map_angle(qk_map_desc *d, qk__ops *l, int *nw)
{
    qk_op_kind k;
    char rot = d->rot ? (char)tolower((unsigned char)d->rot) : 'x';
    int i;
    if (rot != 'x' && rot != 'y' && rot != 'z') return qk__fail(QK_ERROR_INVALID_ARGUMENT, "angle: rotation must be x, y or z (got '%c')", d->rot);
    d->rot = rot;
    *nw = 0;
    k = rot == 'x' ? QK_OP_RX : rot == 'y' ? QK_OP_RY : QK_OP_RZ;
    for (i = 0; i < d->n_qubits; i++) qk__push(l, k, i, 0, qk__ang(QK_ARG_X, i, 0, 0, 1.0, 0.0));
    return QK_OK;
}

/* PennyLane AmplitudeEmbedding: one op that loads the normalised, zero-padded features. */
static qk_result qk__map_amplitude(qk_map_desc *d, qk__ops *l, int *nw)
{
    (void)d;
    *nw = 0;
    qk__push(l, QK_OP_AMPLITUDE, 0, 0, qk__noang());
    return QK_OK;
}

/* PennyLane BasisEmbedding: qubit i flipped where feature i is 1. */
static qk_result qk__map_basis(qk_map_desc *d, qk__ops *l, int *nw)
{
    int i;
    *nw = 0;
    for (i = 0; i < d->n_qubits; i++) qk__push(l, QK_OP_BASIS, i, 0, qk__ang(QK_ARG_X, i, 0, 0, 1.0, 0.0));
    return QK_OK;
}

/* Hardware-efficient ansatz with data re-uploading: per layer, RY(w x) (then RZ(w x) for rot z)
   on every qubit, then a CZ (or CNOT) ring. */
static qk_result qk__map_hea(qk_map_desc *d, qk__ops *l, int *nw)
{
    char rot = d->rot ? (char)tolower((unsigned char)d->rot) : 'y';
    int q = d->n_qubits, per, rep, i;
    if (rot != 'y' && rot != 'z') return qk__fail(QK_ERROR_INVALID_ARGUMENT, "hea: rot must be y or yz (got '%c')", d->rot);
    d->rot = rot;
    d->reps = qk__def_i(d->reps, 2);
    if (d->cnot != 0 && d->cnot != 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "hea: cnot must be 0 (CZ ring) or 1 (CNOT ring)");
    per = rot == 'y' ? 1 : 2;
    *nw = d->reps * q * per;
    for (rep = 0; rep < d->reps; rep++) {
        for (i = 0; i < q; i++) {
            int w0 = per * (rep * q + i);
            qk__push(l, QK_OP_RY, i, 0, qk__ang(QK_ARG_WX, i % d->n_features, 0, w0, 1.0, 0.0));
            if (per == 2) qk__push(l, QK_OP_RZ, i, 0, qk__ang(QK_ARG_WX, i % d->n_features, 0, w0 + 1, 1.0, 0.0));
        }
        if (q == 2) qk__push(l, d->cnot ? QK_OP_CNOT : QK_OP_CZ, 0, 1, qk__noang());
        if (q >= 3)
            for (i = 0; i < q; i++) qk__push(l, d->cnot ? QK_OP_CNOT : QK_OP_CZ, i, (i + 1) % q, qk__noang());
    }
    return QK_OK;
}

/* The caller's op list, copied (qk__validate_ops checks it afterwards). */
static qk_result qk__map_custom(qk_map_desc *d, qk__ops *l, int *nw)
{
    int i;
    if (d->n_ops < 0 || (d->n_ops > 0 && !d->ops)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "custom map: ops is NULL or n_ops < 0");
    if (d->n_weights < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "custom map: n_weights < 0");
    *nw = d->n_weights;
    for (i = 0; i < d->n_ops; i++) qk__push(l, d->ops[i].kind, d->ops[i].q0, d->ops[i].q1, d->ops[i].angle);
    return QK_OK;
}

/* The map that takes over the validated op list l->ops (freed here on failure): its class, the
   MPS bound of an entangled map beyond the statevector, nw weights of 1, the resolved desc. */
static qk_result qk__map_new(qk_map_desc *d, qk__ops *l, int nw, qk_map **out)
{
    int q = d->n_qubits, i;
    qk_map *m = (qk_map *)qk__calloc(1, sizeof *m);
    if (!m) { QK_FREE(l->ops); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "map: out of memory"); }
    m->type = d->type;
    m->n_qubits = q;
    m->n_features = d->n_features;
    m->n_weights = nw;
    m->n_ops = l->n;
    m->ops = l->ops;
    m->cls = qk__classify(l->ops, l->n);
    if (m->cls != QK_CLASS_PRODUCT && q > QK_MAX_STATE_QUBITS) {
        int chi = qk__mps_bond_of(m);   /* beyond the statevector: MPS-able maps only */
        if (chi > QK_MPS_MAX_BOND) {
            qk_map_free(m);
            return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "map: %d qubits with entangling ops exceed the state limit of %d qubits, and the "
                            "map's bond dimension bound (%s%d) exceeds QK_MPS_MAX_BOND = %d for the MPS path (docs/mps.md)",
                            q, QK_MAX_STATE_QUBITS, chi >= (1 << 30) ? ">= " : "", chi, QK_MPS_MAX_BOND);
        }
    }
    m->weights = (double *)qk__malloc(sizeof(double) * (size_t)(nw > 0 ? nw : 1));
    if (!m->weights) { qk_map_free(m); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "map: out of memory"); }
    for (i = 0; i < nw; i++) m->weights[i] = 1.0;
    d->ops = NULL;
    d->n_ops = l->n;
    d->n_weights = nw;
    m->desc = *d;
    *out = m;
    return QK_OK;
}

/* Resolves and checks the desc, builds the op list with the type's builder, validates it, then
   makes the map (class, MPS bound, weights). */
QKDEF qk_result qk_map_make(const qk_map_desc *desc_in, qk_map **out)
{
    qk_map_desc d;
    qk__ops l;
    qk_result r;
    int nw = 0;
    if (!desc_in || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_make: NULL %s", desc_in ? "out" : "desc");
    *out = NULL;
    d = *desc_in;
    memset(&l, 0, sizeof l);
    if ((r = qk__map_resolve(&d)) != QK_OK) return r;
    switch (d.type) {
    case QK_MAP_ZZ: r = qk__map_zz(&d, &l, &nw); break;
    case QK_MAP_IQP: r = qk__map_iqp(&d, &l, &nw); break;
    case QK_MAP_ANGLE: r = qk__map_angle(&d, &l, &nw); break;
    case QK_MAP_AMPLITUDE: r = qk__map_amplitude(&d, &l, &nw); break;
    case QK_MAP_BASIS: r = qk__map_basis(&d, &l, &nw); break;
    case QK_MAP_HEA: r = qk__map_hea(&d, &l, &nw); break;
    case QK_MAP_CUSTOM: r = qk__map_custom(&d, &l, &nw); break;
    default: return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: unknown type %d", (int)d.type);
    }
    if (r == QK_OK && l.oom) r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "map: out of memory building the op list");
    if (r == QK_OK) r = qk__validate_ops(l.ops, l.n, d.n_qubits, d.n_features, nw);
    if (r != QK_OK) { QK_FREE(l.ops); return r; }
    return qk__map_new(&d, &l, nw, out);
}

QKDEF void qk_map_free(qk_map *map)
{
    if (!map) return;
    QK_FREE(map->ops);
    QK_FREE(map->weights);
    QK_FREE(map);
}

QKDEF qk_result qk_map_set_weights(qk_map *map, const double *w, int n)
{
    int i;
    if (!map) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_set_weights: map is NULL");
    if (n != map->n_weights) return qk__fail(QK_ERROR_SHAPE, "map takes %d weights, got %d", map->n_weights, n);
    if (n > 0 && !w) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_set_weights: w is NULL");
    for (i = 0; i < n; i++)
        if (!isfinite(w[i])) return qk__fail(QK_ERROR_NON_FINITE, "weight w%d is %s", i, isnan(w[i]) ? "NaN" : "Inf");
    if (n > 0) memcpy(map->weights, w, sizeof(double) * (size_t)n);
    return QK_OK;
}

QKDEF void qk_map_angles(const qk_map *map, const double *x, double *theta)
{
    int i;
    for (i = 0; i < map->n_ops; i++)
        theta[i] = qk__op_has_angle(map->ops[i].kind) ? qk__angle_value(&map->ops[i].angle, x, map->weights) : 0.0;
}

static const char *qk__op_name(qk_op_kind k)
{
    static const char *names[] = {"?", "h", "x", "y", "z", "rx", "ry", "rz", "p", "cx", "cz", "rzz", "amplitude", "basis"};
    return (int)k > 0 && (int)k < QK_OP_KIND_COUNT_ ? names[k] : "?";
}

/* "x3 = X[17][3] = 1e+300" for each feature (and weight) an angle reads, into buf. */
static void qk__angle_inputs(const qk_angle *a, const double *row, const double *w, const char *name, int64_t i,
                             char *buf, size_t size)
{
    char v0[40], v1[40];
    buf[0] = 0;
    switch (a->kind) {
    case QK_ARG_X:
        snprintf(buf, size, "x%d = %s[%lld][%d] = %s", a->x0, name, (long long)i, a->x0, qk__fmt_g(v0, sizeof v0, row[a->x0], 6));
        break;
    case QK_ARG_XX: case QK_ARG_PIXX:
        snprintf(buf, size, "x%d = %s[%lld][%d] = %s, x%d = %s[%lld][%d] = %s", a->x0, name, (long long)i, a->x0,
                 qk__fmt_g(v0, sizeof v0, row[a->x0], 6), a->x1, name, (long long)i, a->x1, qk__fmt_g(v1, sizeof v1, row[a->x1], 6));
        break;
    case QK_ARG_WX:
        snprintf(buf, size, "w%d = %s, x%d = %s[%lld][%d] = %s", a->w, qk__fmt_g(v1, sizeof v1, w[a->w], 6), a->x0, name,
                 (long long)i, a->x0, qk__fmt_g(v0, sizeof v0, row[a->x0], 6));
        break;
    case QK_ARG_W:
        snprintf(buf, size, "w%d = %s", a->w, qk__fmt_g(v1, sizeof v1, w[a->w], 6));
        break;
    default:
        snprintf(buf, size, "constants only");
        break;
    }
}

/* 1 when no op's angle can exceed QK_MAX_ABS_ANGLE for features of magnitude at most xmax
   (a bound: |scale| |f| + |offset| with |f| bounded per kind; weights are the map's). */
static int qk__angles_bounded(const qk_map *map, double xmax)
{
    int k;
    for (k = 0; k < map->n_ops; k++) {
        const qk_angle *a = &map->ops[k].angle;
        double f, w;
        if (!qk__op_has_angle(map->ops[k].kind)) continue;
        w = (a->kind == QK_ARG_W || a->kind == QK_ARG_WX) ? fabs(map->weights[a->w]) : 0.0;
        switch (a->kind) {
        case QK_ARG_X: f = xmax; break;
        case QK_ARG_XX: f = xmax * xmax; break;
        case QK_ARG_PIXX: f = (QK__PI + xmax) * (QK__PI + xmax); break;
        case QK_ARG_W: f = w; break;
        case QK_ARG_WX: f = w * xmax; break;
        default: f = 0.0; break;
        }
        if (!(fabs(a->scale) * f + fabs(a->offset) <= 0.5 * QK_MAX_ABS_ANGLE)) return 0;
    }
    return 1;
}

/* A given state's squared norm ss (NaN: a non-finite amplitude): finite, non-zero, and within
   norm_tol of 1 unless the states are to be scaled. */
QK__PRIV qk_result qk__state_norm_check(const qk__smap *sm, double ss, int side, int64_t row)
{
    const char *nm = side ? "B" : "A";
    if (isnan(ss)) return qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: an amplitude is NaN or Inf", nm, (long long)row);
    if (!isfinite(ss) || ss < DBL_MIN)
        return qk__fail(QK_ERROR_ZERO_NORM, "%s[%lld]: the state's squared norm is %s%s", nm, (long long)row,
                        ss == 0.0 ? "0" : isfinite(ss) ? "below DBL_MIN" : "not finite", ss == 0.0 ? " (a zero state)" : "");
    if (!(sm->op.q1 & QK__STATE_NORMALIZE) && !(fabs(ss - 1.0) <= sm->in.norm_tol)) {
        char v0[40], v1[40];
        return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the state's squared norm is %s, off 1 by more than norm_tol %s "
                        "(normalize = 1 scales each state to norm 1)", nm, (long long)row,
                        qk__fmt_g(v0, sizeof v0, ss, 17), qk__fmt_g(v1, sizeof v1, sm->in.norm_tol, 3));
    }
    return QK_OK;
}

/* Given states (qk_gram_states): rows [row0, row0 + n) of side (0: A, 1: B), ld_bytes apart:
   every amplitude finite, and the norm within norm_tol of 1 (or, to be scaled, non-zero). */
QK__PRIV qk_result qk__states_check(const qk__smap *sm, const void *rows, int64_t n, int64_t ld_bytes, int side, int64_t row0)
{
    const int type = sm->in.type;
    const int64_t dim = sm->in.dim;
    const char *nm = side ? "B" : "A";
    int64_t i, k;
    if (sm->op.q1 & QK__STATE_MIXED) {   /* density matrices: finite, Hermitian, positive trace, entries at most it, unit trace */
        for (i = 0; i < n; i++) {
            const void *row = (const char *)rows + i * ld_bytes;
            double tr = 0.0, re, im, re2, im2, mx = 0.0;
            int64_t a, b, kmx = 0;
            for (k = 0; k < dim * dim; k++) {
                qk__state_amp(row, type, k, &re, &im);
                if (!isfinite(re) || !isfinite(im))
                    return qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: entry (%lld, %lld) of the density matrix is %s", nm, (long long)(row0 + i),
                                    (long long)(k / dim), (long long)(k % dim), isnan(re) || isnan(im) ? "NaN" : "Inf");
                if (re * re + im * im > mx) { mx = re * re + im * im; kmx = k; }
            }
            for (a = 0; a < dim; a++) {
                for (b = a; b < dim; b++) {
                    qk__state_amp(row, type, a * dim + b, &re, &im);
                    qk__state_amp(row, type, b * dim + a, &re2, &im2);
                    if (fabs(re - re2) > sm->in.norm_tol || fabs(im + im2) > sm->in.norm_tol) {
                        char v0[40];
                        return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the density matrix is not Hermitian: entries (%lld, %lld) and "
                                        "(%lld, %lld) differ from conjugates by more than norm_tol %s", nm, (long long)(row0 + i),
                                        (long long)a, (long long)b, (long long)b, (long long)a, qk__fmt_g(v0, sizeof v0, sm->in.norm_tol, 3));
                    }
                }
                qk__state_amp(row, type, a * dim + a, &re, &im);
                tr += re;
            }
            if (!(tr > DBL_MIN)) {
                char v0[40];
                return qk__fail(QK_ERROR_ZERO_NORM, "%s[%lld]: the density matrix's trace is %s (not positive)", nm, (long long)(row0 + i),
                                qk__fmt_g(v0, sizeof v0, tr, 17));
            }
            if (!(sqrt(mx) <= tr * (1.0 + sm->in.norm_tol))) {
                char v0[40], v1[40];
                return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: entry (%lld, %lld) of the density matrix has magnitude %s, more than its "
                                "trace %s: not a density matrix (a positive matrix's entries are at most its trace)", nm,
                                (long long)(row0 + i), (long long)(kmx / dim), (long long)(kmx % dim), qk__fmt_g(v0, sizeof v0, sqrt(mx), 6),
                                qk__fmt_g(v1, sizeof v1, tr, 6));
            }
            if ((sm->op.q1 & QK__STATE_NORMALIZE) == 0 && !(fabs(tr - 1.0) <= sm->in.norm_tol)) {
                char v0[40], v1[40];
                return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the density matrix's trace is %s, off 1 by more than norm_tol %s "
                                "(normalize = 1 divides by it)", nm, (long long)(row0 + i), qk__fmt_g(v0, sizeof v0, tr, 17),
                                qk__fmt_g(v1, sizeof v1, sm->in.norm_tol, 3));
            }
        }
        return QK_OK;
    }
    for (i = 0; i < n; i++) {
        const void *row = (const char *)rows + i * ld_bytes;
        double ss = 0.0, re, im;
        for (k = 0; k < dim; k++) {
            qk__state_amp(row, type, k, &re, &im);
            if (!isfinite(re) || !isfinite(im))
                return qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: amplitude %lld is %s", nm, (long long)(row0 + i), (long long)k,
                                isnan(re) || isnan(im) ? "NaN" : "Inf");
            ss += re * re + im * im;
        }
        {
            qk_result r = qk__state_norm_check(sm, ss, side, row0 + i);
            if (r != QK_OK) return r;
        }
    }
    return QK_OK;
}

/* A provider's rows [row0, row0 + n) of side into buf (n rows of the map's n_features doubles):
   copied from sm->cache where it holds them all, else asked of the provider (one call: n is at
   most sm->chunk), checked (qk__states_check) and shown to rows_fn. On failure the error is set
   and sm->provider_failed holds it. */
QK__PRIV qk_result qk__smap_fetch(qk__smap *sm, int side, int64_t row0, int64_t n, void *buf)
{
    const int64_t rowb = (int64_t)sm->map.n_features * 8;
    qk_result r;
    if (sm->cache && side == sm->cache_side && row0 >= sm->cache_row0 && row0 + n <= sm->cache_row0 + sm->cache_n) {
        memcpy(buf, sm->cache + (size_t)((row0 - sm->cache_row0) * rowb), (size_t)(n * rowb));
        return QK_OK;
    }
    QK_PROF_BEGIN("state provider");
    r = sm->in.provider(side, row0, row0 + n, buf, sm->ld, sm->in.provider_user) ? QK_ERROR_CANCELLED : QK_OK;
    QK_PROF_END("state provider");
    if (r != QK_OK)
        qk__fail(QK_ERROR_CANCELLED, "%s: the state provider failed for %s rows [%lld, %lld) (nothing was written)", sm->fn,
                 side ? "B" : "A", (long long)row0, (long long)(row0 + n));
    else r = qk__states_check(sm, buf, n, rowb, side, row0);
    if (r == QK_OK && sm->rows_fn) r = sm->rows_fn(sm->rows_user, side, row0, n, buf, rowb);
    if (r != QK_OK) sm->provider_failed = r;
    return r;
}

/* The largest |v| of cnt doubles by their bit patterns (sign cleared, an IEEE double's order is
   its bits' order, and Inf / NaN lie above every finite value), in four independent maxima so
   that no comparison waits on the one before. Returns 1 when every value is finite (*xmax set),
   0 when one is not. qk_map_check_data's fast path: a Gram call checks all of X before planning,
   and the row loop's dependent sums held every call up (docs/benchmarks.md, "Per-call costs"). */
static int qk__finite_absmax(const double *x, size_t cnt, double *xmax)
{
    const uint64_t mask = 0x7fffffffffffffffull;
    uint64_t m[4] = {0, 0, 0, 0}, b, top;
    size_t i, k;
    for (i = 0; i + 4 <= cnt; i += 4) {
        for (k = 0; k < 4; k++) {
            memcpy(&b, x + i + k, sizeof b);
            b &= mask;
            m[k] = b > m[k] ? b : m[k];
        }
    }
    for (; i < cnt; i++) {
        memcpy(&b, x + i, sizeof b);
        b &= mask;
        m[0] = b > m[0] ? b : m[0];
    }
    top = m[0];
    for (k = 1; k < 4; k++) top = m[k] > top ? m[k] : top;
    if (top >= 0x7ff0000000000000ull) return 0;   /* Inf or NaN somewhere */
    memcpy(xmax, &top, sizeof top);
    return 1;
}

QKDEF qk_result qk_map_check_data(const qk_map *map, const double *x, int64_t n, const char *name)
{
    int64_t i;
    int j, d, basis = 0, amp = 0, angles = 0, k, fast;
    double xmax = 0.0;
    if (!name) name = "X";
    if (!map || !x) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: NULL %s", name, map ? "data" : "map");
    if (n <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: number of rows must be > 0 (got %lld)", name, (long long)n);
    d = map->n_features;
    if (qk__map_is_mps(map)) return QK_OK;   /* given MPS: checked when their map was made (gram.c) */
    if (qk__map_is_states(map)) {   /* given states: a provider's rows and device rows are checked where they are read */
        const qk__smap *sm = (const qk__smap *)(const void *)map;
        if (map->ops[0].q1 & (QK__STATE_PROVIDER | QK__STATE_DEVICE)) return QK_OK;
        return qk__states_check(sm, x, n, (int64_t)d * 8, strcmp(name, "Y") == 0, 0);
    }
    for (k = 0; k < map->n_ops; k++) {
        if (map->ops[k].kind == QK_OP_BASIS) basis = 1;
        if (map->ops[k].kind == QK_OP_AMPLITUDE) amp = 1;
        if (qk__op_has_angle(map->ops[k].kind)) angles = 1;
    }
    /* ordinary data (every value finite, no basis or amplitude rule): one flat scan; otherwise,
       or to name the first bad value, the rows one by one */
    fast = !basis && !amp && qk__finite_absmax(x, (size_t)n * (size_t)d, &xmax);
    for (i = fast ? n : 0; i < n; i++) {
        const double *row = x + i * d;
        double ss = 0.0;
        char v0[40];
        for (j = 0; j < d; j++) {
            double v = row[j];
            if (!isfinite(v))
                return qk__fail(QK_ERROR_NON_FINITE, "%s[%lld][%d] is %s", name, (long long)i, j, isnan(v) ? "NaN" : "Inf");
            ss += v * v;
            if (fabs(v) > xmax) xmax = fabs(v);
        }
        if (basis) {
            for (k = 0; k < map->n_ops; k++) {
                if (map->ops[k].kind != QK_OP_BASIS) continue;
                j = map->ops[k].angle.x0;
                if (row[j] != 0.0 && row[j] != 1.0)
                    return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld][%d] = %s: basis encoding needs 0 or 1", name, (long long)i, j,
                                    qk__fmt_g(v0, sizeof v0, row[j], 6));
            }
        }
        if (amp) {
            /* The engines normalise with 1/sqrt(sum of squares): it must be a normal, finite
               double, or the amplitudes come out Inf, NaN or imprecise. */
            if (!isfinite(ss)) {
                for (j = 1, k = 0; j < d; j++) if (fabs(row[j]) > fabs(row[k])) k = j;
                return qk__fail(QK_ERROR_ZERO_NORM, "%s row %lld: amplitude encoding: the sum of squares overflows (%s[%lld][%d] = %s); "
                                "scale the row (the state is the same)", name, (long long)i, name, (long long)i, k,
                                qk__fmt_g(v0, sizeof v0, row[k], 6));
            }
            if (ss == 0.0) {
                for (j = 0; j < d && row[j] == 0.0; j++) {}
                if (j == d)
                    return qk__fail(QK_ERROR_ZERO_NORM, "%s row %lld: amplitude encoding needs a finite non-zero norm (sum of squares 0)",
                                    name, (long long)i);
            }
            if (ss < DBL_MIN)
                return qk__fail(QK_ERROR_ZERO_NORM, "%s row %lld: amplitude encoding: the sum of squares underflows (%s, below "
                                "DBL_MIN: the normalised amplitudes would be wrong); scale the row (the state is the same)",
                                name, (long long)i, qk__fmt_g(v0, sizeof v0, ss, 6));
        }
    }
    /* Finite features can still make an angle overflow ((pi - 1e300)^2 is Inf): the state
       would be NaN and so would K. A bound from the largest |x| clears ordinary data with
       O(ops) work; only when it does not are the angles evaluated row by row. */
    if (angles && !qk__angles_bounded(map, xmax)) {
        for (i = 0; i < n; i++) {
            const double *row = x + i * d;
            char v0[40];
            for (k = 0; k < map->n_ops; k++) {
                const qk_op *o = &map->ops[k];
                double t;
                if (!qk__op_has_angle(o->kind)) continue;
                t = qk__angle_value(&o->angle, row, map->weights);
                if (!(fabs(t) <= QK_MAX_ABS_ANGLE)) {
                    char in[200], ex[160], q1[16] = "";
                    qk__angle_inputs(&o->angle, row, map->weights, name, i, in, sizeof in);
                    qk__fmt_angle(&o->angle, ex, sizeof ex);
                    if (qk__op_arity(o->kind) == 2) snprintf(q1, sizeof q1, ",%d", o->q1);
                    return qk__fail(QK_ERROR_BAD_DATA, "%s row %lld: op %d, %s(%d%s, %s), has angle %s with %s: angles must be "
                                    "finite and at most %g rad; scale the features", name, (long long)i, k,
                                    qk__op_name(o->kind), o->q0, q1, ex, qk__fmt_g(v0, sizeof v0, t, 6), in, QK_MAX_ABS_ANGLE);
                }
            }
        }
    }
    return QK_OK;
}


