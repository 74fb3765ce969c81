/* Hardening of the map layer (issue 14): resource bounds checked before anything is allocated
   (the allocator here records every request), finite inputs that make a non-finite or absurd
   angle, phase or amplitude refused with the row, column and op named (never a K full of NaN),
   and parser messages that quote the spec escaped and list a map's parameters. */
#include <stdlib.h>
#include <stddef.h>

/* Every host allocation of qk goes through these: the tests check that nothing big (or nothing
   at all) was requested before an error. */
static size_t g_alloc_max = 0, g_alloc_count = 0;
static void *t_malloc(size_t n) { g_alloc_count++; if (n > g_alloc_max) g_alloc_max = n; return malloc(n); }
static void *t_realloc(void *p, size_t n) { g_alloc_count++; if (n > g_alloc_max) g_alloc_max = n; return realloc(p, n); }
#define QK_MALLOC(sz) t_malloc(sz)
#define QK_REALLOC(p, sz) t_realloc(p, sz)
#define QK_FREE(p) free(p)
#define QK_IMPLEMENTATION
#include "qk.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../qk_test.h"

static void alloc_reset(void) { g_alloc_max = 0; g_alloc_count = 0; }
static int has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }
static int printable(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f) return 0;
    return 1;
}
static double now(void) { return (double)clock() / CLOCKS_PER_SEC; }

/* A spec that must fail fast, without a big allocation, naming want in the message. */
static void spec_refused(const char *spec, int d, qk_result want, const char *want1, const char *want2) {
    qk_map *m = (qk_map *)(uintptr_t)8;
    qk_result r;
    double t0 = now();
    alloc_reset();
    r = qk_map_parse(spec, d, &m);
    CHECK(r == want, "%s: %s (%s), want %s", spec, qk_result_string(r), qk_last_error(), qk_result_string(want));
    CHECK(m == NULL, "%s: out set to NULL", spec);
    CHECK(g_alloc_max < (1u << 16), "%s: %lu bytes requested before the error", spec, (unsigned long)g_alloc_max);
    CHECK(now() - t0 < 1.0, "%s: %.2f s of CPU before the error", spec, now() - t0);
    CHECK(has(qk_last_error(), want1), "%s: message '%s' lacks '%s'", spec, qk_last_error(), want1);
    if (want2) CHECK(has(qk_last_error(), want2), "%s: message '%s' lacks '%s'", spec, qk_last_error(), want2);
    CHECK(printable(qk_last_error()), "%s: message not printable ASCII", spec);
}

static void test_bounds(void) {
    qk_map_desc d;
    qk_map *m = NULL;
    qk_result r;
    /* the specs: found by fuzzing qk_map_parse (a 6 GB allocation), and minutes of allocation */
    spec_refused("iqp(reps=75555550)", 4, QK_ERROR_PARSE, "QK_MAX_REPS", "column 10");
    spec_refused("zz(reps=100000000)", 4, QK_ERROR_PARSE, "QK_MAX_REPS", NULL);
    /* a valid integer above the bound: not "needs a non-negative integer" */
    spec_refused("iqp(reps=2000000000)", 4, QK_ERROR_PARSE, "maximum", "QK_MAX_REPS");
    CHECK(!has(qk_last_error(), "non-negative"), "2e9 is an integer: %s", qk_last_error());
    spec_refused("iqp(reps=99999999999999999999)", 4, QK_ERROR_PARSE, "maximum", NULL);
    spec_refused("hea(layers=1025)", 4, QK_ERROR_PARSE, "QK_MAX_REPS", NULL);
    spec_refused("circuit(qubits=1,weights=2000000: ry(0, w0))", 1, QK_ERROR_PARSE, "QK_MAX_WEIGHTS", NULL);
    spec_refused("angle(qubits=5000)", 5000, QK_ERROR_PARSE, "QK_MAX_PRODUCT_QUBITS", NULL);
    /* entangling maps beyond the state limit: refused before their op list is built (zz of 4096
       features has 25 million ops per rep) */
    spec_refused("zz", 4096, QK_ERROR_TOO_MANY_QUBITS, "4096 qubits", "QK_MAX_STATE_QUBITS");
    spec_refused("iqp(reps=3)", 2000, QK_ERROR_TOO_MANY_QUBITS, "state limit", NULL);
    /* the op bound: zz of 30 qubits, full entanglement, 1000 reps = 1.365 million ops */
    spec_refused("zz(reps=1000)", 30, QK_ERROR_INVALID_ARGUMENT, "QK_MAX_OPS", "1365000");

    /* the same bounds through qk_map_make, nothing allocated at all */
    memset(&d, 0, sizeof d);
    d.type = QK_MAP_ZZ;
    d.n_features = 4;
    d.reps = 100000000;
    alloc_reset();
    r = qk_map_make(&d, &m);
    CHECK(r == QK_ERROR_INVALID_ARGUMENT && m == NULL && has(qk_last_error(), "QK_MAX_REPS"), "make reps 1e8: %s", qk_last_error());
    CHECK(g_alloc_count == 0, "make reps 1e8: %lu allocations", (unsigned long)g_alloc_count);
    memset(&d, 0, sizeof d);
    d.type = QK_MAP_CUSTOM;
    d.n_features = 1;
    d.n_qubits = 1;
    d.n_weights = QK_MAX_WEIGHTS + 1;
    alloc_reset();
    r = qk_map_make(&d, &m);
    CHECK(r == QK_ERROR_INVALID_ARGUMENT && has(qk_last_error(), "QK_MAX_WEIGHTS") && g_alloc_count == 0,
          "custom weights: %s, %lu allocations", qk_last_error(), (unsigned long)g_alloc_count);
    /* at the bounds: fine */
    r = qk_map_parse("iqp(reps=1024)", 3, &m);
    CHECK(r == QK_OK && m && m->n_ops == 1024 * 9, "iqp reps=1024: %s", qk_last_error());
    qk_map_free(m);
}

static void test_messages(void) {
    qk_map *m = NULL;
    qk_result r = qk_map_parse("zz(rep=2)", 3, &m);
    CHECK(r == QK_ERROR_PARSE && has(qk_last_error(), "'rep'") && has(qk_last_error(), "reps, alpha, ent, qubits"),
          "zz(rep=2) lists the parameters: %s", qk_last_error());
    r = qk_map_parse("angle(reps=2)", 3, &m);
    CHECK(r == QK_ERROR_PARSE && has(qk_last_error(), "rot, qubits"), "angle(reps=2): %s", qk_last_error());
    /* user text in a message is escaped and truncated */
    r = qk_map_parse("zz(\x1b[31m\xff=1)", 3, &m);
    CHECK(r == QK_ERROR_PARSE && printable(qk_last_error()) && has(qk_last_error(), "\\x1b[31m\\xff"),
          "control bytes escaped: %s", qk_last_error());
    {
        char spec[600];
        memset(spec, 'a', sizeof spec - 1);
        spec[sizeof spec - 1] = 0;
        memcpy(spec, "zz(", 3);
        r = qk_map_parse(spec, 3, &m);
        CHECK(r == QK_ERROR_PARSE && has(qk_last_error(), "...") && strlen(qk_last_error()) < 400,
              "long spec truncated: %s", qk_last_error());
    }
}

/* X (3 rows of d) with row 1 set to v: check_data and qk_gram refuse it with want and the parts,
   and qk_gram leaves K as it was. */
static void data_refused(qk_ctx *ctx, const char *spec, int d, const double *row1, qk_result want, const char *p1,
                         const char *p2, const char *p3) {
    qk_map *m = NULL;
    double x[3 * 8], K[9];
    qk_gram_desc gd;
    qk_result r;
    int j;
    if (qk_map_parse(spec, d, &m) != QK_OK) { printf("parse %s: %s\n", spec, qk_last_error()); exit(2); }
    for (j = 0; j < 3 * d; j++) x[j] = 0.1 + 0.05 * j;
    memcpy(x + d, row1, sizeof(double) * (size_t)d);
    r = qk_map_check_data(m, x, 3, "X");
    CHECK(r == want, "%s: check_data %s (%s), want %s", spec, qk_result_string(r), qk_last_error(), qk_result_string(want));
    CHECK(has(qk_last_error(), p1) && has(qk_last_error(), p2) && (!p3 || has(qk_last_error(), p3)),
          "%s: message '%s' lacks '%s' / '%s' / '%s'", spec, qk_last_error(), p1, p2, p3 ? p3 : "");
    for (j = 0; j < 9; j++) K[j] = -7.0;
    memset(&gd, 0, sizeof gd);
    gd.x = x;
    gd.n_x = 3;
    gd.out = K;
    r = qk_gram(ctx, m, &gd);
    CHECK(r == want, "%s: qk_gram %s (%s)", spec, qk_result_string(r), qk_last_error());
    for (j = 0; j < 9; j++) CHECK(K[j] == -7.0, "%s: K[%d] = %g written on error", spec, j, K[j]);
    qk_map_free(m);
}

static void test_angles(void) {
    qk_ctx *ctx = qk_test_cpu_ctx(1);
    qk_map *m = NULL;
    double big[4] = {1e300, 1e300, 0.5, 0.25}, mid[4] = {1e200, 1e200, 0.5, 0.25}, huge_amp[4] = {1e200, 1, 2, 3};
    double tiny_amp[4] = {1e-160, 0, 1e-160, 0}, zero[4] = {0, 0, 0, 0}, ten[4] = {10, 10, 10, 10};
    double x[4] = {1, 2, 3, 4}, w1[4];
    int j;
    /* the row: 1e300 features with zz gave exit 0 and a K full of NaN */
    data_refused(ctx, "zz(reps=2)", 4, big, QK_ERROR_BAD_DATA, "X row 1", "op", "1e+300");
    /* 1e200: alpha * x is finite, (pi - x0)(pi - x1) overflows: the p gate on qubit 1 is named */
    data_refused(ctx, "zz(reps=1)", 4, mid, QK_ERROR_BAD_DATA, "X row 1", "(pi-x0)*(pi-x1)", "X[1][1] = 1e+200");
    /* iqp's x0 * x1 overflows */
    data_refused(ctx, "iqp", 4, mid, QK_ERROR_BAD_DATA, "rzz(0,1", "x0*x1", NULL);
    /* amplitude: a sum of squares that overflows, one that underflows (2e-320, subnormal: the
       normalised amplitudes would be off), and zero */
    data_refused(ctx, "amplitude", 4, huge_amp, QK_ERROR_ZERO_NORM, "X row 1", "overflows", "X[1][0] = 1e+200");
    data_refused(ctx, "amplitude", 4, tiny_amp, QK_ERROR_ZERO_NORM, "X row 1", "underflows", NULL);
    data_refused(ctx, "amplitude", 4, zero, QK_ERROR_ZERO_NORM, "X row 1", "non-zero norm", NULL);
    /* a trainable weight times a feature: the weight is named */
    if (qk_map_parse("hea(layers=1)", 4, &m) == QK_OK) {
        for (j = 0; j < 4; j++) w1[j] = j == 2 ? 1e300 : 0.5;
        CHECK(qk_map_set_weights(m, w1, 4) == QK_OK, "weights");
        CHECK(qk_map_check_data(m, ten, 1, "X") == QK_ERROR_BAD_DATA && has(qk_last_error(), "w2 = 1e+300") &&
              has(qk_last_error(), "X[0][2] = 10"), "hea weight overflow: %s", qk_last_error());
        CHECK(qk_map_check_data(m, x, 1, "X") == QK_ERROR_BAD_DATA, "w * x = 3e300 is beyond QK_MAX_ABS_ANGLE");
        qk_map_free(m);
    }
    /* a huge feature that no angle reads is fine (the cheap bound fails, the exact check passes) */
    if (qk_map_parse("circuit(qubits=2: h(0) rz(0, x0) cx(0,1))", 2, &m) == QK_OK) {
        double unused[2] = {0.5, 1e308};
        CHECK(qk_map_check_data(m, unused, 1, "X") == QK_OK, "unused huge feature: %s", qk_last_error());
        qk_map_free(m);
    }
    /* ordinary data still passes, and large but sane features too */
    if (qk_map_parse("zz", 4, &m) == QK_OK) {
        double ok[4] = {1e100, -3, 0, 7};
        CHECK(qk_map_check_data(m, x, 1, "X") == QK_OK, "ordinary data: %s", qk_last_error());
        CHECK(qk_map_check_data(m, ok, 1, "X") == QK_OK, "1e100 features: %s", qk_last_error());
        qk_map_free(m);
    }
    qk_ctx_destroy(ctx);
}

int main(void) {
    test_bounds();
    test_messages();
    test_angles();
    printf("test_hardening: %d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
