/* test_fixtures.c — qk's maps against conformance fixtures from independent implementations.

   Usage: test_fixtures DIR     (DIR holds tests/fixtures/data/<case>.txt)

   Each fixture (written by tests/fixtures/make_fixtures.py from Qiskit, PennyLane or numpy; see
   tests/fixtures/README.md) gives a map spec, inputs X and Y, optional weights, the states of X
   (qubit 0 = least significant bit) and K(X,X), K(X,Y). For every file this program builds the
   map with qk_map_parse(), compares qk_states() with the reference states up to a global phase
   and qk_gram() (CPU engine, fp64) with the reference kernels. Tolerance: 1e-10 absolute on
   every amplitude and every kernel entry. Outputs are poisoned with NaN first, so an entry qk
   leaves unwritten fails. Exit status 1 names every failing case; 0 when all pass. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* opendir / readdir under -std=c11 */
#endif
#define QK_IMPLEMENTATION
#include "qk.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-10

typedef struct fixture {
    char *spec, *source;
    int q, d, nx, ny, nw;
    double *x, *y, *w, *sre, *sim, *kxx, *kxy;
    int64_t n_sre, n_sim, n_x, n_y, n_kxx, n_kxy;
} fixture;

static void fixture_free(fixture *f)
{
    free(f->spec); free(f->source);
    free(f->x); free(f->y); free(f->w); free(f->sre); free(f->sim); free(f->kxx); free(f->kxy);
    memset(f, 0, sizeof *f);
}

/* Parses the space-separated numbers of s into a new array; *n gets the count. */
static double *parse_numbers(const char *s, int64_t *n)
{
    int64_t cap = 16, k = 0;
    double *v = (double *)malloc((size_t)cap * sizeof *v);
    char *end;
    if (!v) return NULL;
    for (;;) {
        double t;
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        if (!*s) break;
        t = strtod(s, &end);
        if (end == s) { free(v); return NULL; }
        if (k == cap) {
            double *nv = (double *)realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) { free(v); return NULL; }
            v = nv;
        }
        v[k++] = t;
        s = end;
    }
    *n = k;
    return v;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s);
    char *r = (char *)malloc(n + 1);
    if (r) memcpy(r, s, n + 1);
    return r;
}

static char *read_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    long sz;
    char *buf = NULL;
    if (!fp) return NULL;
    if (fseek(fp, 0, SEEK_END) == 0 && (sz = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0) {
        buf = (char *)malloc((size_t)sz + 1);
        if (buf && fread(buf, 1, (size_t)sz, fp) == (size_t)sz) buf[sz] = 0;
        else { free(buf); buf = NULL; }
    }
    fclose(fp);
    return buf;
}

/* Reads one fixture; returns 0 and fills *f, or -1 with a message in err. */
static int fixture_load(const char *path, fixture *f, char *err, size_t errsz)
{
    char *buf = read_file(path), *line, *next;
    memset(f, 0, sizeof *f);
    f->q = f->d = f->nx = f->ny = -1;
    if (!buf) { snprintf(err, errsz, "cannot read %s", path); return -1; }
    for (line = buf; line && *line; line = next) {
        char *sp, *val;
        int64_t n = 0;
        double **arr = NULL;
        int64_t *cnt = NULL;
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!*line) continue;
        sp = strchr(line, ' ');
        if (!sp) { snprintf(err, errsz, "line without a value: '%.40s'", line); goto bad; }
        *sp = 0;
        val = sp + 1;
        if (!strcmp(line, "spec")) { f->spec = dup_str(val); continue; }
        if (!strcmp(line, "source")) { f->source = dup_str(val); continue; }
        if (!strcmp(line, "qubits")) { f->q = atoi(val); continue; }
        if (!strcmp(line, "features")) { f->d = atoi(val); continue; }
        if (!strcmp(line, "nx")) { f->nx = atoi(val); continue; }
        if (!strcmp(line, "ny")) { f->ny = atoi(val); continue; }
        if (!strcmp(line, "x")) { arr = &f->x; cnt = &f->n_x; }
        else if (!strcmp(line, "y")) { arr = &f->y; cnt = &f->n_y; }
        else if (!strcmp(line, "w")) { arr = &f->w; cnt = &n; }
        else if (!strcmp(line, "state_re")) { arr = &f->sre; cnt = &f->n_sre; }
        else if (!strcmp(line, "state_im")) { arr = &f->sim; cnt = &f->n_sim; }
        else if (!strcmp(line, "kxx")) { arr = &f->kxx; cnt = &f->n_kxx; }
        else if (!strcmp(line, "kxy")) { arr = &f->kxy; cnt = &f->n_kxy; }
        else { snprintf(err, errsz, "unknown key '%s'", line); goto bad; }
        if (*arr) { snprintf(err, errsz, "key '%s' twice", line); goto bad; }
        *arr = parse_numbers(val, cnt);
        if (!*arr) { snprintf(err, errsz, "bad number in '%s'", line); goto bad; }
        if (arr == &f->w) f->nw = (int)n;
    }
    free(buf);
    buf = NULL;
    if (!f->spec || f->q < 1 || f->d < 1 || f->nx < 1 || f->ny < 1 || !f->x || !f->y || !f->kxx ||
        !f->kxy) {
        snprintf(err, errsz, "missing key (spec, qubits, features, nx, ny, x, y, kxx, kxy)");
        goto bad;
    }
    if (f->n_x != (int64_t)f->nx * f->d || f->n_y != (int64_t)f->ny * f->d ||
        f->n_kxx != (int64_t)f->nx * f->nx || f->n_kxy != (int64_t)f->nx * f->ny) {
        snprintf(err, errsz, "array sizes do not match nx, ny, features");
        goto bad;
    }
    if (!f->sre != !f->sim || (f->sre && (f->q > 30 || f->n_sre != ((int64_t)f->nx << f->q) ||
                                          f->n_sim != f->n_sre))) {
        snprintf(err, errsz, "state_re / state_im missing or of the wrong size");
        goto bad;
    }
    return 0;
bad:
    free(buf);
    fixture_free(f);
    return -1;
}

/* Max over samples and amplitudes of |psi - e^{i phi} ref|, phi taken per sample from the
   largest reference amplitude (states are defined up to a global phase). */
static double state_error(const fixture *f, const double *psi)
{
    int64_t dim = (int64_t)1 << f->q, s, k;
    double worst = 0.0;
    for (s = 0; s < f->nx; s++) {
        const double *re = f->sre + s * dim, *im = f->sim + s * dim, *p = psi + 2 * s * dim;
        int64_t m = 0;
        double best = -1.0, pr, pi_, a, b, nrm, cr, ci;
        for (k = 0; k < dim; k++) {
            double mag = re[k] * re[k] + im[k] * im[k];
            if (mag > best) { best = mag; m = k; }
        }
        /* phase = psi[m] * conj(ref[m]) / |psi[m] ref[m]| */
        a = p[2 * m]; b = p[2 * m + 1];
        pr = a * re[m] + b * im[m];
        pi_ = b * re[m] - a * im[m];
        nrm = sqrt(pr * pr + pi_ * pi_);
        if (!(nrm > 0.0)) return INFINITY;   /* qk has ~0 (or NaN) where the reference peaks */
        cr = pr / nrm; ci = pi_ / nrm;
        for (k = 0; k < dim; k++) {
            double er = p[2 * k] - (cr * re[k] - ci * im[k]);
            double ei = p[2 * k + 1] - (cr * im[k] + ci * re[k]);
            double e = sqrt(er * er + ei * ei);
            if (isnan(e)) return INFINITY;   /* an amplitude qk left unwritten (poison) */
            if (e > worst) worst = e;
        }
    }
    return worst;
}

static double max_abs_diff(const double *a, const double *b, int64_t n)
{
    double worst = 0.0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (isnan(e)) return INFINITY;   /* an entry qk left unwritten (poison) */
        if (e > worst) worst = e;
    }
    return worst;
}

static double *poisoned(int64_t n)
{
    double *p = (double *)malloc((size_t)n * sizeof *p);
    int64_t i;
    if (p) for (i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static int gram_error(qk_ctx *ctx, const qk_map *map, const fixture *f, int cross, double *err)
{
    int64_t ncol = cross ? f->ny : f->nx;
    double *k = poisoned((int64_t)f->nx * ncol);
    qk_gram_desc gd;
    qk_result r;
    if (!k) return -1;
    memset(&gd, 0, sizeof gd);
    gd.x = f->x;
    gd.n_x = f->nx;
    gd.y = cross ? f->y : NULL;
    gd.n_y = cross ? f->ny : 0;
    gd.out = k;
    gd.out_dtype = QK_F64;
    gd.precision = QK_PRECISION_FP64;
    r = qk_gram(ctx, map, &gd);
    if (r != QK_OK) {
        printf("    qk_gram(%s): %s: %s\n", cross ? "X,Y" : "X,X", qk_result_string(r),
               qk_last_error());
        free(k);
        return -1;
    }
    *err = max_abs_diff(k, cross ? f->kxy : f->kxx, (int64_t)f->nx * ncol);
    free(k);
    return 0;
}

/* Runs one case; returns 1 when it passes. */
static int run_case(qk_ctx *ctx, const char *name, const fixture *f)
{
    qk_map *map = NULL;
    qk_result r = qk_map_parse(f->spec, f->d, &map);
    double es = -1.0, exx = INFINITY, exy = INFINITY;
    int ok = 1;
    if (r != QK_OK) {
        printf("FAIL %s: qk_map_parse(\"%s\", %d): %s: %s\n", name, f->spec, f->d,
               qk_result_string(r), qk_last_error());
        return 0;
    }
    if (map->n_qubits != f->q || map->n_features != f->d || map->n_weights != f->nw) {
        printf("FAIL %s: map has %d qubits, %d features, %d weights; fixture %d, %d, %d\n", name,
               map->n_qubits, map->n_features, map->n_weights, f->q, f->d, f->nw);
        qk_map_free(map);
        return 0;
    }
    if (f->nw > 0 && (r = qk_map_set_weights(map, f->w, f->nw)) != QK_OK) {
        printf("FAIL %s: qk_map_set_weights: %s: %s\n", name, qk_result_string(r), qk_last_error());
        qk_map_free(map);
        return 0;
    }
    if (f->sre) {
        double *psi = poisoned(((int64_t)f->nx << f->q) * 2);
        if (!psi) ok = 0;
        else if ((r = qk_states(ctx, map, f->x, f->nx, psi)) != QK_OK) {
            printf("    qk_states: %s: %s\n", qk_result_string(r), qk_last_error());
            ok = 0;
        } else {
            es = state_error(f, psi);
            if (!(es <= TOL)) ok = 0;
        }
        free(psi);
    }
    if (gram_error(ctx, map, f, 0, &exx) != 0 || !(exx <= TOL)) ok = 0;
    if (gram_error(ctx, map, f, 1, &exy) != 0 || !(exy <= TOL)) ok = 0;
    {
        char st[32];
        if (!f->sre) snprintf(st, sizeof st, "-");
        else if (es < 0.0) snprintf(st, sizeof st, "error");
        else snprintf(st, sizeof st, "%.2e", es);
        printf("%s %-30s q=%-2d %-18s states %-8s K(X,X) %.2e  K(X,Y) %.2e\n", ok ? "ok  " : "FAIL",
               name, f->q, qk_map_class_string(map->cls), st, exx, exy);
    }
    if (!ok && f->source) printf("     spec: %s\n     source: %s\n", f->spec, f->source);
    qk_map_free(map);
    return ok;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    DIR *dir;
    struct dirent *de;
    char **names = NULL, **failed = NULL;
    size_t n = 0, cap = 0, nfail = 0, i;
    qk_ctx *ctx = NULL;
    qk_ctx_desc cd;
    qk_result r;

    if (argc != 2) { fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]); return 2; }
    if (!(dir = opendir(argv[1]))) { fprintf(stderr, "cannot open %s\n", argv[1]); return 1; }
    while ((de = readdir(dir)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".txt")) continue;
        if (n == cap) {
            char **nn = (char **)realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
            if (!nn) { closedir(dir); return 1; }
            names = nn;
        }
        names[n++] = dup_str(de->d_name);
    }
    closedir(dir);
    if (n == 0) { fprintf(stderr, "no fixtures (*.txt) in %s\n", argv[1]); return 1; }
    qsort(names, n, sizeof *names, cmp_str);
    failed = (char **)calloc(n, sizeof *failed);

    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    if ((r = qk_ctx_create(&cd, &ctx)) != QK_OK) {
        fprintf(stderr, "qk_ctx_create: %s: %s\n", qk_result_string(r), qk_last_error());
        return 1;
    }
    printf("%zu fixtures in %s, tolerance %.0e absolute (fp64, CPU engine)\n", n, argv[1], TOL);
    for (i = 0; i < n; i++) {
        size_t plen = strlen(argv[1]) + strlen(names[i]) + 2;
        char *path = (char *)malloc(plen), err[256];
        char *name = names[i];
        fixture f;
        int ok;
        snprintf(path, plen, "%s/%s", argv[1], name);
        name[strlen(name) - 4] = 0;
        if (fixture_load(path, &f, err, sizeof err) != 0) {
            printf("FAIL %s: malformed fixture: %s\n", name, err);
            ok = 0;
        } else {
            ok = run_case(ctx, name, &f);
            fixture_free(&f);
        }
        if (!ok) failed[nfail++] = name;
        free(path);
    }
    qk_ctx_destroy(ctx);
    if (nfail) {
        printf("\n%zu of %zu fixtures FAILED:", nfail, n);
        for (i = 0; i < nfail; i++) printf(" %s", failed[i]);
        printf("\n");
    } else {
        printf("\nall %zu fixtures pass\n", n);
    }
    for (i = 0; i < n; i++) free(names[i]);
    free(names);
    free(failed);
    return nfail ? 1 : 0;
}
