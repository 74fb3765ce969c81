/* Fuzz target for the map spec parser (qk_map_parse) with a round-trip oracle.
   Input: the first byte picks the feature count (1..8), the rest, up to a NUL, is the spec.
   Property checked on every input: the parser never crashes, reads out of bounds or leaks
   (ASan/UBSan/LeakSanitizer); a refused spec gets a parse/shape/argument error with a message of
   printable ASCII (user text is quoted escaped) and *out NULL; an accepted one gives a map within
   the resource bounds whose spec (qk_map_spec) parses back to the same map (every op, angle and
   resolved parameter) and writes the same spec again (a fixed point). It runs in the de_DE.UTF-8
   locale when the machine has it (',' is then the locale's decimal point: the spec must not care).

   libFuzzer (clang), from the repository root (docs/api.md, "Fuzzing"):
     clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
           tests/fuzz/fuzz_map_parse.c -lm -pthread -o /tmp/fuzz_map_parse
     /tmp/fuzz_map_parse -runs=1000000 -dict=tests/fuzz/fuzz_map_parse.dict /tmp/corpus-map
   With -DQK_FUZZ_STANDALONE: the seeds below and a fixed count of mutations (tests/fuzz/fuzz_common.h). */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <locale.h>
#include "fuzz_common.h"
static const char *fz_token(int i) {
    static const char *const t[] = {
    "zz", "iqp", "angle", "amplitude", "basis", "hea", "circuit", "(", ")", ",", "=", ":", ";", " ",
    "reps=", "alpha=", "ent=", "rot=", "qubits=", "features=", "weights=", "layers=", "n_repeats=",
    "full", "linear", "reverse_linear", "circular", "pairwise", "sca", "cz", "cnot", "yz",
    "h(0)", "rx(", "ry(1,", "rz(0,", "p(", "rzz(0,1,", "cx(0,1)", "pi", "-", "+", "*", "x0", "x1", "w0", "w1",
    "(pi-x0)*(pi-x1)", "1e308", "1e-320", "0.5", "2147483647", "2147483648", "1024", "1025", "0", ".",
    "1e", "\xc3\xa9", "\x01", "", NULL};
    return i < (int)(sizeof t / sizeof t[0]) ? t[i] : NULL;
}

static size_t fz_seed(int i, unsigned char *buf, size_t cap) {
    static const char *const seeds[] = {
        "zz", "zz(reps=2,ent=linear)", "zz(reps=3,alpha=0.5,ent=sca)", "zz(alpha=-1.25e-3,ent=circular)",
        "iqp", "iqp(n_repeats=2)", "angle(rot=y)", "angle(rot=z)", "amplitude", "amplitude(qubits=4)", "basis",
        "hea(layers=2,rot=yz,ent=cnot)", "hea(qubits=3,layers=1)",
        "circuit(qubits=2,weights=1: h(0) ry(1, -0.5*w0*x1+pi) cx(0,1) rz(0, 2*x0) rzz(0,1, x0*x1-1) "
        "p(1, 2*(pi-x0)*(pi-x1)); x(0); cz(1,0) y(1) z(0) rx(0, 3.5))",
        "circuit(qubits=3,features=3: rx(2, x2) cnot(2, 0))",
    };
    size_t n;
    if (i >= (int)(sizeof seeds / sizeof seeds[0])) return 0;
    n = strlen(seeds[i]);
    if (n + 1 > cap) return 0;
    buf[0] = (unsigned char)(i % 4 + 1);
    memcpy(buf + 1, seeds[i], n);
    return n + 1;
}

static void same_maps(const qk_map *a, const qk_map *b) {
    int i;
    FZ_CHECK(a->type == b->type && a->cls == b->cls);
    FZ_CHECK(a->n_qubits == b->n_qubits && a->n_features == b->n_features && a->n_weights == b->n_weights);
    FZ_CHECK(a->n_ops == b->n_ops);
    FZ_CHECK(a->desc.reps == b->desc.reps && a->desc.alpha == b->desc.alpha && a->desc.ent == b->desc.ent);
    FZ_CHECK(a->desc.rot == b->desc.rot && a->desc.cnot == b->desc.cnot);
    for (i = 0; i < a->n_ops; i++) {
        const qk_op *p = &a->ops[i], *q = &b->ops[i];
        FZ_CHECK(p->kind == q->kind && p->q0 == q->q0);
        if (qk__op_arity(p->kind) == 2) FZ_CHECK(p->q1 == q->q1);
        if (qk__op_has_angle(p->kind)) {
            const qk_angle *x = &p->angle, *y = &q->angle;
            FZ_CHECK(x->kind == y->kind && x->offset == y->offset);
            if (x->kind != QK_ARG_CONST) FZ_CHECK(x->scale == y->scale);
            if (x->kind == QK_ARG_X || x->kind == QK_ARG_XX || x->kind == QK_ARG_PIXX || x->kind == QK_ARG_WX) FZ_CHECK(x->x0 == y->x0);
            if (x->kind == QK_ARG_XX || x->kind == QK_ARG_PIXX) FZ_CHECK(x->x1 == y->x1);
            if (x->kind == QK_ARG_W || x->kind == QK_ARG_WX) FZ_CHECK(x->w == y->w);
        }
    }
}

static char *spec_of(const qk_map *m) {
    int n = qk_map_spec(m, NULL, 0);
    char *s;
    FZ_CHECK(n > 0);
    s = (char *)malloc((size_t)n + 1);
    FZ_CHECK(s != NULL);
    FZ_CHECK(qk_map_spec(m, s, (size_t)n + 1) == n && (int)strlen(s) == n);
    return s;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static int init = 0;
    char *spec, *s1, *s2;
    qk_map *m = NULL, *m2 = NULL;
    qk_result r;
    int nf;
    if (!init) {
        init = 1;
        setlocale(LC_ALL, "de_DE.UTF-8");   /* stays "C" where the locale is missing */
    }
    if (size < 1) return 0;
    nf = 1 + data[0] % 8;
    spec = (char *)malloc(size);
    FZ_CHECK(spec != NULL);
    memcpy(spec, data + 1, size - 1);
    spec[size - 1] = 0;
    m = (qk_map *)(uintptr_t)1;
    r = qk_map_parse(spec, nf, &m);
    if (r != QK_OK) {
        FZ_CHECK(m == NULL);
        FZ_CHECK(r == QK_ERROR_PARSE || r == QK_ERROR_SHAPE || r == QK_ERROR_INVALID_ARGUMENT ||
                 r == QK_ERROR_TOO_MANY_QUBITS || r == QK_ERROR_NON_FINITE);
        FZ_CHECK(qk_last_error()[0] != 0 && fz_printable(qk_last_error()));
        free(spec);
        return 0;
    }
    FZ_CHECK(m != NULL && m->n_features == nf);
    FZ_CHECK(m->n_ops <= QK_MAX_OPS && m->n_weights <= QK_MAX_WEIGHTS && m->n_qubits <= QK_MAX_PRODUCT_QUBITS);
    /* entangled maps beyond the statevector only where the MPS path takes them (docs/mps.md) */
    FZ_CHECK(m->cls == QK_CLASS_PRODUCT || m->n_qubits <= QK_MAX_STATE_QUBITS || qk__mps_bond_of(m) <= QK_MPS_MAX_BOND);
    s1 = spec_of(m);
    r = qk_map_parse(s1, nf, &m2);
    if (r != QK_OK) fprintf(stderr, "spec \"%s\" -> \"%s\" refused: %s\n", spec, s1, qk_last_error());
    FZ_CHECK(r == QK_OK);
    same_maps(m, m2);
    s2 = spec_of(m2);
    if (strcmp(s1, s2) != 0) fprintf(stderr, "\"%s\" then \"%s\"\n", s1, s2);
    FZ_CHECK(strcmp(s1, s2) == 0);
    free(s1);
    free(s2);
    qk_map_free(m);
    qk_map_free(m2);
    free(spec);
    return 0;
}
