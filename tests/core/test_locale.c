/* Every number qk reads, and the spec it writes, in C syntax whatever the host program's locale
   (issue 16): under setlocale(LC_ALL, "de_DE.UTF-8"), where strtod wants "0,5" and printf writes
   it, the spec parser, qk_map_spec, the .csv and .npy readers, qk-gram's weights (a .csv through
   the same reader) and the messages that quote numbers must all still use '.'. Exits 77 (a skip)
   where the locale is not installed (.ci/run installs it: apt-get install locales, locale-gen). */
#define _POSIX_C_SOURCE 200809L
#define QK_IMPLEMENTATION
#include "qk.h"

#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../qk_test.h"

static char g_dir[256];
static const char *tpath(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

static void test_parser(void) {
    qk_map *m = NULL, *m2 = NULL;
    char spec[512];
    qk_result r = qk_map_parse("zz(alpha=0.5)", 2, &m);
    CHECK(r == QK_OK && m && m->desc.alpha == 0.5, "zz(alpha=0.5): %s", qk_last_error());
    if (m) {
        qk_map_spec(m, spec, sizeof spec);
        CHECK(strstr(spec, "alpha=0.5,") != NULL, "qk_map_spec writes '.': %s", spec);
        qk_map_free(m);
        m = NULL;
    }
    /* "0,5" is not a number in qk's syntax: the ',' ends the parameter */
    r = qk_map_parse("zz(alpha=0,5)", 2, &m);
    CHECK(r == QK_ERROR_PARSE && m == NULL, "zz(alpha=0,5) must not read as 0.5: %s", qk_result_string(r));
    r = qk_map_parse("circuit(qubits=2: ry(0, 0.25*x0+1.5) rzz(0,1, -2.5e-1*x0*x1) p(1, 0.125))", 2, &m);
    CHECK(r == QK_OK, "circuit with decimals: %s", qk_last_error());
    if (r == QK_OK) {
        CHECK(m->ops[0].angle.scale == 0.25 && m->ops[0].angle.offset == 1.5, "ry angle %g %g", m->ops[0].angle.scale,
              m->ops[0].angle.offset);
        CHECK(m->ops[1].angle.scale == -0.25 && m->ops[2].angle.offset == 0.125, "rzz / p angles");
        qk_map_spec(m, spec, sizeof spec);
        CHECK(strstr(spec, "0.25*x0+1.5") != NULL && strstr(spec, "0.125") != NULL, "circuit spec: %s", spec);
        r = qk_map_parse(spec, 2, &m2);
        CHECK(r == QK_OK && m2->n_ops == 3 && m2->ops[0].angle.scale == 0.25 && m2->ops[0].angle.offset == 1.5 &&
              m2->ops[2].angle.offset == 0.125, "round trip of '%s': %s", spec, qk_last_error());
        qk_map_free(m2);
        qk_map_free(m);
        m = NULL;
    }
    /* a message that quotes a number */
    if (qk_map_parse("basis", 2, &m) == QK_OK) {
        double x[2] = {1, 0.5};
        CHECK(qk_map_check_data(m, x, 1, "X") == QK_ERROR_BAD_DATA && strstr(qk_last_error(), "= 0.5:"),
              "message number: %s", qk_last_error());
        qk_map_free(m);
    }
}

static void test_readers(void) {
    qk_array a;
    qk_result r;
    qk_test_write_text(tpath("iris.csv"), "sepal_length,sepal_width\n5.1,3.5\n4.9,3.0e0\n");
    r = qk_csv_read(tpath("iris.csv"), &a);
    CHECK(r == QK_OK && a.rows == 2 && a.cols == 2 && a.data[0] == 5.1 && a.data[1] == 3.5 && a.data[2] == 4.9 &&
          a.data[3] == 3.0, "5.1,3.5 in de_DE: %s", qk_last_error());
    if (r == QK_OK) qk_array_free(&a);
    /* a German Excel file (decimal commas, ';' between fields) is an error, not numbers */
    qk_test_write_text(tpath("de.csv"), "5,1;3,5\n4,9;3,0\n");
    r = qk_csv_read(tpath("de.csv"), &a);
    CHECK(r == QK_ERROR_FORMAT && strstr(qk_last_error(), "';'"), "German CSV: %s", qk_last_error());
    /* weights (qk-gram --weights reads them with the same reader) */
    qk_test_write_text(tpath("w.csv"), "0.5\n-1.25\n");
    r = qk_csv_read(tpath("w.csv"), &a);
    CHECK(r == QK_OK && a.rows == 2 && a.data[0] == 0.5 && a.data[1] == -1.25, "weights csv: %s", qk_last_error());
    if (r == QK_OK) qk_array_free(&a);
    /* .npy: the header holds only integers, but read it here too */
    {
        double v[4] = {0.5, 1.5, -2.5, 3.25};
        r = qk_npy_write(tpath("v.npy"), v, QK_F64, 2, 2);
        CHECK(r == QK_OK, "npy write: %s", qk_last_error());
        r = qk_npy_read(tpath("v.npy"), &a);
        CHECK(r == QK_OK && a.rows == 2 && a.cols == 2 && memcmp(a.data, v, sizeof v) == 0, "npy read: %s", qk_last_error());
        if (r == QK_OK) qk_array_free(&a);
    }
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    char cmd[600];
    double probe;
    if (!setlocale(LC_ALL, "de_DE.UTF-8") && !setlocale(LC_ALL, "de_DE.utf8")) {
        printf("test_locale: the de_DE.UTF-8 locale is not installed: skipped\n");
        return 77;
    }
    /* the locale must really use ',' (else this test proves nothing) */
    probe = strtod("0,5", NULL);
    if (probe != 0.5) {
        printf("test_locale: de_DE.UTF-8 does not use ',' here (strtod(\"0,5\") = %g): skipped\n", probe);
        return 77;
    }
    snprintf(g_dir, sizeof g_dir, "%s/qk-test-locale-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    test_parser();
    test_readers();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("could not remove %s\n", g_dir);
    printf("test_locale: %s\n", qk_test_fails ? "FAILED" : "all checks passed");
    return qk_test_fails ? 1 : 0;
}
