#include "qk_internal.h"
/* >>parser ---- the map spec parser ---- */
/* Grammar (docs/maps.md):
     spec   := name [ '(' [param {',' param}] [':' ops] ')' ]
     param  := key '=' value
     ops    := { gate '(' int [',' int] [',' angle] ')' [';'] }
     angle  := number | [number '*'] factor [('+'|'-') number]
     factor := xI | wI | xI '*' xJ | wK '*' xI | '(' 'pi' '-' xI ')' '*' '(' 'pi' '-' xJ ')'
     number := [-] (decimal | 'pi')
   Errors name the column (1-based) of the offending token. */
typedef struct qk__parser {
    const char *s;
    const char *p;
    qk__radix rx;       /* the locale's decimal point (numbers are read in C syntax) */
    int oom;            /* a long number could not be copied: the error is out of memory */
} qk__parser;

static void qk__ws(qk__parser *ps) { while (*ps->p && isspace((unsigned char)*ps->p)) ps->p++; }
static int qk__col(const qk__parser *ps) { return (int)(ps->p - ps->s) + 1; }

/* The spec as a message quotes it: escaped, at most 120 bytes, then "... (N bytes)". */
static const char *qk__spec_esc(const qk__parser *ps, char *buf, size_t size)
{
    size_t n = strlen(ps->s), k;
    qk__esc(buf, size > 24 ? size - 24 : size, ps->s, n, 120);
    k = strlen(buf);
    if (n > 120 && size > 24) snprintf(buf + k, size - k, " (%lu bytes)", (unsigned long)n);
    return buf;
}

static qk_result qk__perr(qk__parser *ps, const char *fmt, const char *arg)
{
    char msg[256], es[200];
    if (ps->oom) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "map spec: out of memory reading a number");
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");   /* arg: an identifier or a message of ours */
    return qk__fail(QK_ERROR_PARSE, "map spec \"%s\", column %d: %s", qk__spec_esc(ps, es, sizeof es), qk__col(ps), msg);
}

static int qk__accept(qk__parser *ps, char c)
{
    qk__ws(ps);
    if (*ps->p == c) { ps->p++; return 1; }
    return 0;
}

/* identifier [a-z_][a-z0-9_]* (lower-cased into buf) */
static int qk__ident(qk__parser *ps, char *buf, size_t size)
{
    size_t n = 0;
    qk__ws(ps);
    if (!isalpha((unsigned char)*ps->p) && *ps->p != '_') return 0;
    while (isalnum((unsigned char)*ps->p) || *ps->p == '_') {
        if (n + 1 < size) buf[n++] = (char)tolower((unsigned char)*ps->p);
        ps->p++;
    }
    buf[n] = 0;
    return 1;
}

static int qk__number(qk__parser *ps, double *v)
{
    const char *start;
    size_t n;
    int neg = 0;
    qk__ws(ps);
    start = ps->p;
    if (*ps->p == '-' || *ps->p == '+') { neg = *ps->p == '-'; ps->p++; qk__ws(ps); }
    if ((ps->p[0] == 'p' || ps->p[0] == 'P') && (ps->p[1] == 'i' || ps->p[1] == 'I') && !isalnum((unsigned char)ps->p[2])) {
        ps->p += 2;
        *v = neg ? -QK__PI : QK__PI;
        return 1;
    }
    if (*ps->p == '+' || *ps->p == '-') { ps->p = start; return 0; }   /* one sign only */
    n = qk__num_len(ps->p, (size_t)-1, 0);   /* no bound needed: the scan stops at the NUL */
    if (!n) { ps->p = start; return 0; }
    if (!qk__strtod_c(ps->p, n, &ps->rx, v)) { ps->oom = 1; ps->p = start; return 0; }
    if (isinf(*v)) { ps->p = start; return 0; }   /* out of range */
    ps->p += n;
    if (neg) *v = -*v;
    return 1;
}

/* A non-negative decimal integer: 1 read (into *v), 0 none (nothing consumed), -1 larger than
   INT_MAX (nothing consumed). Locale-free by construction. */
static int qk__int(qk__parser *ps, int *v)
{
    const char *p;
    int64_t x = 0;
    qk__ws(ps);
    p = ps->p;
    if (!isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) {
        x = x * 10 + (*p++ - '0');
        if (x > 0x7fffffff) return -1;
    }
    ps->p = p;
    *v = (int)x;
    return 1;
}

/* 'x' or 'w' followed by an index */
static int qk__var(qk__parser *ps, char which, int *idx)
{
    const char *start;
    qk__ws(ps);
    start = ps->p;
    if (tolower((unsigned char)*ps->p) != which) return 0;
    ps->p++;
    if (!isdigit((unsigned char)*ps->p)) { ps->p = start; return 0; }
    if (qk__int(ps, idx) != 1) { ps->p = start; return 0; }
    return 1;
}

/* '(' 'pi' '-' xI ')' */
static int qk__pi_minus(qk__parser *ps, int *idx)
{
    const char *start = ps->p;
    char id[8];
    if (!qk__accept(ps, '(')) return 0;
    if (!qk__ident(ps, id, sizeof id) || strcmp(id, "pi") != 0) { ps->p = start; return 0; }
    if (!qk__accept(ps, '-') || !qk__var(ps, 'x', idx) || !qk__accept(ps, ')')) { ps->p = start; return 0; }
    return 1;
}

static qk_result qk__angle_expr(qk__parser *ps, qk_angle *a)
{
    double num = 0.0;
    int have_num, i0, i1;
    const char *save;
    *a = qk__ang(QK_ARG_CONST, 0, 0, 0, 1.0, 0.0);
    qk__ws(ps);
    save = ps->p;
    /* leading "-x0" means scale -1 */
    if (*ps->p == '-' && (tolower((unsigned char)ps->p[1]) == 'x' || tolower((unsigned char)ps->p[1]) == 'w' || ps->p[1] == '(')) {
        ps->p++;
        a->scale = -1.0;
        have_num = 0;
    } else {
        have_num = qk__number(ps, &num);
    }
    if (have_num) {
        if (!qk__accept(ps, '*')) {           /* a plain number */
            a->offset = num;
            return QK_OK;
        }
        a->scale = num;
    }
    save = ps->p;
    qk__ws(ps);
    if (qk__var(ps, 'x', &i0)) {
        if (qk__accept(ps, '*')) {
            if (!qk__var(ps, 'x', &i1)) return qk__perr(ps, "expected a feature xJ after '*'", NULL);
            a->kind = QK_ARG_XX; a->x0 = i0; a->x1 = i1;
        } else {
            a->kind = QK_ARG_X; a->x0 = i0;
        }
    } else if (qk__var(ps, 'w', &i0)) {
        if (qk__accept(ps, '*')) {
            if (!qk__var(ps, 'x', &i1)) return qk__perr(ps, "expected a feature xI after 'wK*'", NULL);
            a->kind = QK_ARG_WX; a->w = i0; a->x0 = i1;
        } else {
            a->kind = QK_ARG_W; a->w = i0;
        }
    } else if (qk__pi_minus(ps, &i0)) {
        if (!qk__accept(ps, '*') || !qk__pi_minus(ps, &i1)) return qk__perr(ps, "expected '*(pi-xJ)' after '(pi-xI)'", NULL);
        a->kind = QK_ARG_PIXX; a->x0 = i0; a->x1 = i1;
    } else {
        ps->p = save;
        qk__ws(ps);
        return qk__perr(ps, "expected an angle: a number, xI, wI, xI*xJ, wK*xI or (pi-xI)*(pi-xJ)", NULL);
    }
    qk__ws(ps);
    if (*ps->p == '+' || *ps->p == '-') {
        int neg = *ps->p == '-';
        ps->p++;
        if (!qk__number(ps, &num)) return qk__perr(ps, "expected a number after '+' or '-'", NULL);
        a->offset = neg ? -num : num;
    }
    return QK_OK;
}

typedef struct qk__gate_name { const char *name; qk_op_kind kind; } qk__gate_name;
static const qk__gate_name qk__gates[] = {
    {"h", QK_OP_H}, {"x", QK_OP_X}, {"y", QK_OP_Y}, {"z", QK_OP_Z},
    {"rx", QK_OP_RX}, {"ry", QK_OP_RY}, {"rz", QK_OP_RZ}, {"p", QK_OP_P},
    {"cx", QK_OP_CNOT}, {"cnot", QK_OP_CNOT}, {"cz", QK_OP_CZ}, {"rzz", QK_OP_RZZ},
};

static qk_result qk__parse_ops(qk__parser *ps, qk__ops *l)
{
    for (;;) {
        char name[16];
        const char *at;
        size_t g;
        qk_op_kind kind = (qk_op_kind)0;
        int q0 = 0, q1 = 0, ar;
        qk_angle a = qk__noang();
        qk_result r;
        while (qk__accept(ps, ';')) {}
        qk__ws(ps);
        if (*ps->p == ')' || *ps->p == 0) return QK_OK;
        at = ps->p;
        if (!qk__ident(ps, name, sizeof name)) return qk__perr(ps, "expected a gate name", NULL);
        for (g = 0; g < sizeof qk__gates / sizeof qk__gates[0]; g++)
            if (strcmp(name, qk__gates[g].name) == 0) kind = qk__gates[g].kind;
        if (!kind) { ps->p = at; return qk__perr(ps, "unknown gate '%s' (h x y z rx ry rz p cx cnot cz rzz)", name); }
        ar = qk__op_arity(kind);
        if (!qk__accept(ps, '(')) return qk__perr(ps, "expected '(' after gate '%s'", name);
        if (qk__int(ps, &q0) != 1) return qk__perr(ps, "expected a qubit index", NULL);
        if (ar == 2) {
            if (!qk__accept(ps, ',') || qk__int(ps, &q1) != 1) return qk__perr(ps, "expected ', qubit' (gate '%s' takes two qubits)", name);
        }
        if (qk__op_has_angle(kind)) {
            if (!qk__accept(ps, ',')) return qk__perr(ps, "expected ', angle' (gate '%s' takes an angle)", name);
            r = qk__angle_expr(ps, &a);
            if (r != QK_OK) return r;
        }
        if (!qk__accept(ps, ')')) return qk__perr(ps, "expected ')' to close gate '%s'", name);
        if (l->n >= QK_MAX_OPS) {
            char lim[16];
            snprintf(lim, sizeof lim, "%d", (int)QK_MAX_OPS);
            ps->p = at;
            return qk__perr(ps, "more than QK_MAX_OPS (%s) gates", lim);
        }
        qk__push(l, kind, q0, q1, a);
        if (l->oom) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "map spec: out of memory");
    }
}

/* After a parameter's number: letters, digits, '.', '_' right after it (0x10, 2.0, 1e3, 5abc)
   are stray characters of a value that is no number of the kind asked for. Reports them (at
   their column, the whole value quoted) and returns 1; 0 when the value ends cleanly. */
static int qk__stray(qk__parser *ps, const char *key, const char *vat)
{
    const char *q = ps->p, *e = ps->p;
    char m[256], v[80], st[80];
    if (!isalnum((unsigned char)*q) && *q != '.' && *q != '_') return 0;
    while (isalnum((unsigned char)*e) || *e == '.' || *e == '_' || *e == '+' || *e == '-') e++;
    snprintf(m, sizeof m, "stray characters '%s' after the number in '%s=%s'", qk__esc(st, sizeof st, q, (size_t)(e - q), 24),
             key, qk__esc(v, sizeof v, vat, (size_t)(e - vat), 24));
    (void)qk__perr(ps, "%s", m);
    return 1;
}

/* The parameters a map's spec takes (for the message about an unknown one). */
static const char *qk__map_params(qk_map_type t)
{
    switch (t) {
    case QK_MAP_ZZ: return "reps, alpha, ent, qubits";
    case QK_MAP_IQP: return "reps (or n_repeats), qubits";
    case QK_MAP_ANGLE: return "rot, qubits";
    case QK_MAP_AMPLITUDE: return "qubits";
    case QK_MAP_BASIS: return "qubits";
    case QK_MAP_HEA: return "layers (or reps), rot, ent, qubits";
    case QK_MAP_CUSTOM: return "qubits, features, weights, then ':' and the gates";
    default: return "?";
    }
}

QKDEF qk_result qk_map_parse(const char *spec, int n_features, qk_map **out)
{
    qk__parser ps;
    qk_map_desc d;
    qk__ops l;
    char name[32], key[32], val[32];
    char given[8][32];   /* the key that set each parameter (reps, layers and n_repeats are one), "" none yet */
    qk_result r;
    int has_ops = 0;
    memset(given, 0, sizeof given);
    if (!out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_parse: out is NULL");
    *out = NULL;
    if (!spec) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_parse: spec is NULL");
    memset(&d, 0, sizeof d);
    memset(&l, 0, sizeof l);
    ps.s = ps.p = spec;
    ps.oom = 0;
    qk__radix_init(&ps.rx);
    d.n_features = n_features;
    if (!qk__ident(&ps, name, sizeof name)) return qk__perr(&ps, "expected a map name (zz, iqp, angle, amplitude, basis, hea, circuit)", NULL);
    if (!strcmp(name, "zz")) d.type = QK_MAP_ZZ;
    else if (!strcmp(name, "iqp")) d.type = QK_MAP_IQP;
    else if (!strcmp(name, "angle")) d.type = QK_MAP_ANGLE;
    else if (!strcmp(name, "amplitude") || !strcmp(name, "amp")) d.type = QK_MAP_AMPLITUDE;
    else if (!strcmp(name, "basis")) d.type = QK_MAP_BASIS;
    else if (!strcmp(name, "hea")) d.type = QK_MAP_HEA;
    else if (!strcmp(name, "circuit")) d.type = QK_MAP_CUSTOM;
    else { ps.p = spec; qk__ws(&ps); return qk__perr(&ps, "unknown map '%s' (zz, iqp, angle, amplitude, basis, hea, circuit)", name); }
    if (qk__accept(&ps, '(')) {
        if (!qk__accept(&ps, ')')) {
            for (;;) {
                const char *kat, *vat;
                double num;
                int iv;
                qk__ws(&ps);
                if (d.type == QK_MAP_CUSTOM && *ps.p == ':') { ps.p++; has_ops = 1; break; }
                kat = ps.p;
                if (!qk__ident(&ps, key, sizeof key)) return qk__perr(&ps, "expected a parameter name", NULL);
                if (!qk__accept(&ps, '=')) return qk__perr(&ps, "expected '=' after '%s'", key);
                qk__ws(&ps);
                vat = ps.p;
#define QK__BADKEY() do { char m_[160]; ps.p = kat; \
                snprintf(m_, sizeof m_, "unknown parameter '%s' for %s (its parameters: %s)", key, name, qk__map_params(d.type)); \
                return qk__perr(&ps, "%s", m_); } while (0)
#define QK__INTVAL(dst, max) do { char m_[128]; int g_ = qk__int(&ps, &iv); ps.p = g_ == 1 ? ps.p : vat; \
                if (g_ == 1 && qk__stray(&ps, key, vat)) return QK_ERROR_PARSE; \
                if (g_ == 0) return qk__perr(&ps, "'%s' needs a non-negative integer", key); \
                if (g_ < 0 || iv > (max)) { snprintf(m_, sizeof m_, "'%s' is larger than its maximum, %s (%d)", key, #max, (int)(max)); \
                    ps.p = vat; return qk__perr(&ps, "%s", m_); } \
                dst = iv; } while (0)
                if (!strcmp(key, "qubits")) {
                    QK__INTVAL(d.n_qubits, QK_MAX_PRODUCT_QUBITS);
                    if (d.n_qubits <= 0) { ps.p = vat; return qk__perr(&ps, "qubits must be > 0", NULL); }
                } else if (!strcmp(key, "reps") || !strcmp(key, "layers") || !strcmp(key, "n_repeats")) {
                    if (d.type != QK_MAP_ZZ && d.type != QK_MAP_IQP && d.type != QK_MAP_HEA) QK__BADKEY();
                    QK__INTVAL(d.reps, QK_MAX_REPS);
                    if (d.reps <= 0) { ps.p = vat; return qk__perr(&ps, "'%s' must be > 0", key); }
                } else if (!strcmp(key, "alpha")) {
                    if (d.type != QK_MAP_ZZ) QK__BADKEY();
                    iv = qk__number(&ps, &num);
                    if (iv && qk__stray(&ps, key, vat)) return QK_ERROR_PARSE;
                    if (!iv || num == 0.0) { ps.p = vat; return qk__perr(&ps, "alpha needs a non-zero number", NULL); }
                    d.alpha = num;
                } else if (!strcmp(key, "features")) {
                    if (d.type != QK_MAP_CUSTOM) QK__BADKEY();
                    QK__INTVAL(iv, 0x7fffffff);
                    if (iv != n_features) { char es_[200]; ps.p = vat; return qk__fail(QK_ERROR_SHAPE, "map spec \"%s\", column %d: circuit declares %d features, the data has %d", qk__spec_esc(&ps, es_, sizeof es_), qk__col(&ps), iv, n_features); }
                } else if (!strcmp(key, "weights")) {
                    if (d.type != QK_MAP_CUSTOM) QK__BADKEY();
                    QK__INTVAL(d.n_weights, QK_MAX_WEIGHTS);
                } else if (!strcmp(key, "ent")) {
                    if (!qk__ident(&ps, val, sizeof val)) { ps.p = vat; return qk__perr(&ps, "ent needs a name", NULL); }
                    if (d.type == QK_MAP_ZZ) {
                        if (!strcmp(val, "full")) d.ent = QK_ENT_FULL;
                        else if (!strcmp(val, "linear")) d.ent = QK_ENT_LINEAR;
                        else if (!strcmp(val, "reverse_linear")) d.ent = QK_ENT_REVERSE_LINEAR;
                        else if (!strcmp(val, "circular")) d.ent = QK_ENT_CIRCULAR;
                        else if (!strcmp(val, "pairwise")) d.ent = QK_ENT_PAIRWISE;
                        else if (!strcmp(val, "sca")) d.ent = QK_ENT_SCA;
                        else { ps.p = vat; return qk__perr(&ps, "unknown entanglement '%s' (full, linear, reverse_linear, circular, pairwise, sca)", val); }
                    } else if (d.type == QK_MAP_HEA) {
                        if (!strcmp(val, "cz")) d.cnot = 0;
                        else if (!strcmp(val, "cnot") || !strcmp(val, "cx")) d.cnot = 1;
                        else { ps.p = vat; return qk__perr(&ps, "unknown hea ring '%s' (cz, cnot)", val); }
                    } else QK__BADKEY();
                } else if (!strcmp(key, "rot")) {
                    if (!qk__ident(&ps, val, sizeof val)) { ps.p = vat; return qk__perr(&ps, "rot needs a name", NULL); }
                    if (d.type == QK_MAP_ANGLE && (!strcmp(val, "x") || !strcmp(val, "y") || !strcmp(val, "z"))) d.rot = val[0];
                    else if (d.type == QK_MAP_HEA && !strcmp(val, "y")) d.rot = 'y';
                    else if (d.type == QK_MAP_HEA && !strcmp(val, "yz")) d.rot = 'z';
                    else if (d.type == QK_MAP_ANGLE || d.type == QK_MAP_HEA) { ps.p = vat; return qk__perr(&ps, d.type == QK_MAP_ANGLE ? "rot must be x, y or z (got '%s')" : "rot must be y or yz (got '%s')", val); }
                    else QK__BADKEY();
                } else {
                    QK__BADKEY();
                }
#undef QK__BADKEY
#undef QK__INTVAL
                {   /* each parameter once: zz(reps=2,reps=3) is an error, as a repeated CLI option is */
                    static const char *const slots[] = {"qubits", "reps", "alpha", "features", "weights", "ent", "rot"};
                    const char *k_ = !strcmp(key, "layers") || !strcmp(key, "n_repeats") ? "reps" : key;
                    int sl_;
                    for (sl_ = 0; sl_ < (int)(sizeof slots / sizeof slots[0]) && strcmp(slots[sl_], k_); sl_++) {}
                    if (given[sl_][0]) {
                        char m_[160];
                        ps.p = kat;
                        if (!strcmp(given[sl_], key))
                            snprintf(m_, sizeof m_, "'%.64s' is given twice (each parameter may be given once)", key);
                        else
                            snprintf(m_, sizeof m_, "'%.48s' repeats '%.48s' (the same parameter; each may be given once)", key,
                                     given[sl_]);
                        return qk__perr(&ps, "%s", m_);
                    }
                    snprintf(given[sl_], sizeof given[sl_], "%s", key);
                }
                if (qk__accept(&ps, ',')) continue;
                qk__ws(&ps);
                if (d.type == QK_MAP_CUSTOM && *ps.p == ':') { ps.p++; has_ops = 1; break; }
                if (*ps.p == ')') break;
                return qk__perr(&ps, "expected ',' or ')'", NULL);
            }
            if (has_ops) {
                r = qk__parse_ops(&ps, &l);
                if (r != QK_OK) { QK_FREE(l.ops); return r; }
            }
            if (!qk__accept(&ps, ')')) { QK_FREE(l.ops); return qk__perr(&ps, "expected ')'", NULL); }
        }
    }
    qk__ws(&ps);
    if (*ps.p) { QK_FREE(l.ops); return qk__perr(&ps, "unexpected text after the map", NULL); }
    if (d.type == QK_MAP_CUSTOM) {
        if (!d.n_qubits) { char es_[200]; QK_FREE(l.ops); return qk__fail(QK_ERROR_PARSE, "map spec \"%s\": circuit needs qubits=N", qk__spec_esc(&ps, es_, sizeof es_)); }
        d.ops = l.ops;
        d.n_ops = l.n;
    }
    r = qk_map_make(&d, out);
    QK_FREE(l.ops);
    return r;
}

/* snprintf-like appender that keeps counting past the end of the buffer */
QK__PRIV void qk__cat(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(*len < size ? buf + *len : NULL, *len < size ? size - *len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) *len += (size_t)n;
}

QKDEF int qk_map_spec(const qk_map *m, char *buf, size_t size)
{
    static const char *ents[] = {"full", "full", "linear", "reverse_linear", "circular", "pairwise", "sca"};
    size_t len = 0;
    const qk_map_desc *d;
    int i;
    if (size && buf) buf[0] = 0;
    if (!m) return 0;
    if (!buf) size = 0;
    d = &m->desc;
    switch (m->type) {
    case QK_MAP_ZZ: {
        char al[40];
        qk__cat(buf, size, &len, "zz(reps=%d,alpha=%s,ent=%s)", d->reps, qk__fmt_g(al, sizeof al, d->alpha, 17), ents[d->ent]);
        break;
    }
    case QK_MAP_IQP: qk__cat(buf, size, &len, "iqp(reps=%d)", d->reps); break;
    case QK_MAP_ANGLE: qk__cat(buf, size, &len, "angle(rot=%c)", d->rot); break;
    case QK_MAP_AMPLITUDE: qk__cat(buf, size, &len, "amplitude(qubits=%d)", m->n_qubits); break;
    case QK_MAP_BASIS: qk__cat(buf, size, &len, "basis"); break;
    case QK_MAP_HEA: qk__cat(buf, size, &len, "hea(qubits=%d,layers=%d,rot=%s,ent=%s)", m->n_qubits, d->reps, d->rot == 'z' ? "yz" : "y", d->cnot ? "cnot" : "cz"); break;
    default:
        qk__cat(buf, size, &len, "circuit(qubits=%d,weights=%d:", m->n_qubits, m->n_weights);
        for (i = 0; i < m->n_ops; i++) {
            const qk_op *o = &m->ops[i];
            size_t g;
            const char *nm = "?";
            char ang[160];
            for (g = 0; g < sizeof qk__gates / sizeof qk__gates[0]; g++)
                if (qk__gates[g].kind == o->kind) { nm = qk__gates[g].name; break; }
            if (o->kind == QK_OP_AMPLITUDE || o->kind == QK_OP_BASIS) nm = "?"; /* not expressible */
            qk__cat(buf, size, &len, " %s(%d", nm, o->q0);
            if (qk__op_arity(o->kind) == 2) qk__cat(buf, size, &len, ",%d", o->q1);
            if (qk__op_has_angle(o->kind)) { qk__fmt_angle(&o->angle, ang, sizeof ang); qk__cat(buf, size, &len, ",%s", ang); }
            qk__cat(buf, size, &len, ")");
        }
        qk__cat(buf, size, &len, ")");
        break;
    }
    return (int)len;
}


