/* The CPU kernels on every instruction set this CPU has (runtime dispatch, docs/api.md "CPU
   instruction sets"): this program is compiled without -march (tests/core/meson.build), as a
   wheel is, so qk.h holds the generic (baseline x86-64: SSE2, no FMA), AVX2 + FMA and AVX-512F
   kernels. It prints the CPU's flags (from /proc/cpuinfo, not from qk) and, for each of generic,
   avx2 and avx512:
   - the CPU has it (cpuinfo: avx2 and fma; avx512f): qk_cpu_isa_set takes it, qk_cpu_isa names
     it, and every case below, on fresh random inputs, matches the generic kernels' result within
     the rounding bound (|K - K_generic| <= 1e-12 in fp64, K in [0, 1]; 2.5e-7, two float ulps
     at 1, for fp32 output; the gradient within 1e-10 of its largest entry): FMA against separate
     multiply and add, nothing else differs (the same terms in the same order);
   - the CPU lacks it: qk_cpu_isa_set refuses it (QK_ERROR_UNSUPPORTED, the choice unchanged) and
     the cases are skipped (a skip, not a failure; never a SIGILL);
   generic against generic always runs (bit for bit: the same kernels twice). Cases: the complex
   and real statevector paths (zz, hea), K(X,X) and K(X,Y), fp64 and fp32 output, the MPS path
   (zz linear: bond 4; hea: bond 16; both on the transfer-matrix kernels), the gradient
   (qk_gram_vjp: its products). Also QK_CPU_ISA (read once, at the first call): an unknown value
   falls back to the best with a note, qk_cpu_isa_set's errors. A build without runtime dispatch
   (a -march with AVX2 given to every compile) checks only its own kernels, and says so. */
#define _POSIX_C_SOURCE 200809L
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"

#define TOL64 1e-12
#define TOL32 2.5e-7
#define TOLVJP 1e-10

/* isa_names[0]: the reference, "generic" (a build without dispatch: its own kernels) */
static const char *isa_names[3] = {"generic", "avx2", "avx512"};
static qk_ctx *g_ctx;

/* does /proc/cpuinfo's first flags line hold word w? -1: cannot tell (no such file or line) */
static int cpuinfo_has(const char *w)
{
    char line[8192], *p;
    const size_t n = strlen(w);
    int found = -1;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) || !(p = strchr(line, ':'))) continue;
        found = 0;
        for (p++; *p; p++)
            if (p[-1] == ' ' && !strncmp(p, w, n) && (p[n] == ' ' || p[n] == '\n' || p[n] == 0)) { found = 1; break; }
    }
    fclose(f);
    return found;
}

typedef struct kcase {
    const char *spec;
    int q;
    int64_t nx, ny;     /* ny 0: K(X,X) */
    qk_path path;       /* the path asked for (DEFAULT: the map's own) and checked */
    qk_dtype dt;
} kcase;

/* K of case c on the data x, y into K (fp64 values, also for fp32 output) */
static void gram(const kcase *c, qk_map *m, const double *x, const double *y, double *K)
{
    const int64_t cols = c->ny ? c->ny : c->nx, n = c->nx * cols;
    float *K32 = (float *)malloc(sizeof(float) * (size_t)n);
    qk_gram_desc g;
    qk_plan plan;
    int64_t i;
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = c->nx; g.y = y; g.n_y = c->ny; g.out_dtype = c->dt; g.path = c->path;
    g.out = c->dt == QK_F32 ? (void *)K32 : (void *)K;
    for (i = 0; i < n; i++) K[i] = NAN;
    if (qk_plan_make(g_ctx, m, &g, &plan) != QK_OK || qk_gram(g_ctx, m, &g) != QK_OK) {
        printf("%s: %s\n", c->spec, qk_last_error());
        exit(2);
    }
    if (c->path != QK_PATH_DEFAULT && plan.path != c->path) { printf("%s: planned path %d, not %d\n", c->spec, (int)plan.path, (int)c->path); exit(2); }
    if (plan.path == QK_PATH_MPS && plan.mps_bond < 4) { printf("%s: MPS bond %d (want >= 4: the dispatched kernel)\n", c->spec, plan.mps_bond); exit(2); }
    if (c->dt == QK_F32) for (i = 0; i < n; i++) K[i] = K32[i];
    free(K32);
}

/* every case on fresh data, for each instruction set in avail (bit l: isa_names[l]) against generic */
static void check_cases(int avail)
{
    static const kcase cases[] = {
        {"zz(reps=2)", 6, 37, 0, QK_PATH_COMPLEX, QK_F64},                 /* tile edges: 37 rows */
        {"zz(reps=2)", 7, 21, 30, QK_PATH_COMPLEX, QK_F64},
        {"zz(reps=2)", 6, 25, 18, QK_PATH_COMPLEX, QK_F32},
        {"hea(layers=2)", 7, 33, 0, QK_PATH_REAL, QK_F64},
        {"hea(layers=2)", 6, 19, 26, QK_PATH_REAL, QK_F32},
        {"hea(layers=2,rot=yz)", 6, 17, 0, QK_PATH_COMPLEX, QK_F64},
        {"zz(reps=2,ent=linear)", 24, 19, 0, QK_PATH_MPS, QK_F64},      /* bond 4 */
        {"zz(reps=2,ent=linear)", 20, 11, 14, QK_PATH_MPS, QK_F32},
        {"hea(layers=2)", 12, 10, 9, QK_PATH_MPS, QK_F64},              /* bond 16 */
    };
    size_t c;
    int l;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const kcase *k = &cases[c];
        const int64_t cols = k->ny ? k->ny : k->nx, n = k->nx * cols;
        qk_map *m = qk_test_parse(k->spec, k->q);
        double *x = qk_test_rand_data(k->nx, m->n_features, -1.5, 1.5), *y = k->ny ? qk_test_rand_data(k->ny, m->n_features, -1.5, 1.5) : NULL;
        double *ref = (double *)malloc(sizeof(double) * (size_t)n), *K = (double *)malloc(sizeof(double) * (size_t)n);
        const double tol = k->dt == QK_F32 ? TOL32 : TOL64;
        if (m->n_weights > 0) {   /* weights other than the default 1.0 */
            double *w = qk_test_rand_data(1, m->n_weights, -2.0, 2.0);
            qk_map_set_weights(m, w, m->n_weights);
            free(w);
        }
        CHECK(qk_cpu_isa_set(isa_names[0]) == QK_OK, "%s", qk_last_error());
        gram(k, m, x, y, ref);
        for (l = 0; l < 3; l++) {
            double d;
            if (!(avail >> l & 1)) continue;
            CHECK(qk_cpu_isa_set(isa_names[l]) == QK_OK && !strcmp(qk_cpu_isa(), isa_names[l]), "set %s: %s", isa_names[l], qk_last_error());
            gram(k, m, x, y, K);
            d = qk_test_max_diff(K, ref, n);
            if (l == 0) CHECK(d == 0, "%s q=%d generic twice: %.3g apart (want bit for bit)", k->spec, k->q, d);
            else CHECK(d <= tol, "%s q=%d %s %s: %s vs generic %.3g (bound %.3g)", k->spec, k->q, k->ny ? "K(X,Y)" : "K(X,X)",
                       k->dt == QK_F32 ? "fp32" : "fp64", isa_names[l], d, tol);
            if (l > 0) printf("  %-22s q=%-2d %-6s %s %-6s: max |K - K_generic| = %.3g\n", k->spec, k->q, k->ny ? "K(X,Y)" : "K(X,X)",
                              k->dt == QK_F32 ? "fp32" : "fp64", isa_names[l], d);
        }
        qk_map_free(m);
        free(x); free(y); free(ref); free(K);
    }
}

/* the gradient (qk_gram_vjp: its products are dispatched) and its K, against generic */
static void check_vjp(int avail)
{
    static const struct { const char *spec; int q; int64_t nx, ny; } cases[] = {
        {"hea(layers=2)", 5, 23, 0}, {"hea(layers=2,rot=yz)", 4, 20, 13}, {"hea(layers=3)", 6, 31, 9}};
    size_t c;
    int l;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        qk_map *m = qk_test_parse(cases[c].spec, cases[c].q);
        const int64_t nx = cases[c].nx, ny = cases[c].ny, cols = ny ? ny : nx, P = m->n_weights;
        double *x = qk_test_rand_data(nx, m->n_features, -1.2, 1.2), *y = ny ? qk_test_rand_data(ny, m->n_features, -1.2, 1.2) : NULL;
        double *G = qk_test_rand_data(nx, (int)cols, -1.0, 1.0), *w = qk_test_rand_data(1, (int)P, -2.0, 2.0);
        double *gref = (double *)malloc(sizeof(double) * (size_t)P), *gr = (double *)malloc(sizeof(double) * (size_t)P);
        double *kref = (double *)malloc(sizeof(double) * (size_t)(nx * cols)), *K = (double *)malloc(sizeof(double) * (size_t)(nx * cols));
        qk_vjp_desc v;
        qk_map_set_weights(m, w, (int)P);
        memset(&v, 0, sizeof v);
        v.x = x; v.n_x = nx; v.y = y; v.n_y = ny; v.g = G;
        CHECK(qk_cpu_isa_set(isa_names[0]) == QK_OK, "%s", qk_last_error());
        v.grad_w = gref; v.k_out = kref;
        if (qk_gram_vjp(g_ctx, m, &v) != QK_OK) { printf("vjp %s: %s\n", cases[c].spec, qk_last_error()); exit(2); }
        for (l = 0; l < 3; l++) {
            double big = 0, dg, dk;
            int64_t k;
            if (!(avail >> l & 1)) continue;
            CHECK(qk_cpu_isa_set(isa_names[l]) == QK_OK, "set %s: %s", isa_names[l], qk_last_error());
            v.grad_w = gr; v.k_out = K;
            if (qk_gram_vjp(g_ctx, m, &v) != QK_OK) { printf("vjp %s: %s\n", cases[c].spec, qk_last_error()); exit(2); }
            for (k = 0; k < P; k++) if (fabs(gref[k]) > big) big = fabs(gref[k]);
            dg = qk_test_max_diff(gr, gref, P);
            dk = qk_test_max_diff(K, kref, nx * cols);
            if (l == 0) CHECK(dg == 0 && dk == 0, "vjp %s generic twice: grad %.3g, K %.3g apart", cases[c].spec, dg, dk);
            else {
                CHECK(dg <= TOLVJP * big, "vjp %s %s: grad %.3g from generic (bound %.3g)", cases[c].spec, isa_names[l], dg, TOLVJP * big);
                CHECK(dk <= TOL64, "vjp %s %s: K %.3g from generic", cases[c].spec, isa_names[l], dk);
                printf("  vjp %-18s q=%d %s: max |grad - grad_generic| = %.3g (largest entry %.3g), K %.3g\n", cases[c].spec, cases[c].q,
                       isa_names[l], dg, big, dk);
            }
        }
        qk_map_free(m);
        free(x); free(y); free(G); free(w); free(gref); free(gr); free(kref); free(K);
    }
}

int main(void)
{
    int cpu_avx2 = cpuinfo_has("avx2"), cpu_fma = cpuinfo_has("fma"), cpu_512 = cpuinfo_has("avx512f"), avail = 1, l, dispatch = 0;
    const char *first, *note;
    qk_test_seed();
    /* QK_CPU_ISA is read once, at the first call that asks: an unknown value, the best and a note */
    setenv("QK_CPU_ISA", "sse9", 1);
    first = qk_cpu_isa();
    note = qk_cpu_isa_note();
    printf("QK_CPU_ISA=sse9: the kernels use %s; note: %s\n", first, note);
    CHECK(strstr(note, "sse9") != NULL, "the note names the unknown value: \"%s\"", note);
    unsetenv("QK_CPU_ISA");
#if defined(QK__DISPATCH)
    dispatch = 1;
#endif
    printf("cpu flags (/proc/cpuinfo): avx2 %d, fma %d, avx512f %d (-1: unknown); runtime dispatch in this build: %s\n", cpu_avx2, cpu_fma,
           cpu_512, dispatch ? "yes" : "no (compiled for its target only)");
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    printf("cpu flags (__builtin_cpu_supports): avx2 %d, fma %d, avx512f %d\n", !!__builtin_cpu_supports("avx2"),
           !!__builtin_cpu_supports("fma"), !!__builtin_cpu_supports("avx512f"));
#endif
    CHECK(qk_cpu_isa_set("avx3") == QK_ERROR_INVALID_ARGUMENT && !strcmp(qk_cpu_isa(), first), "an unknown name is refused, the choice unchanged");
    CHECK(qk_cpu_isa_set(NULL) == QK_OK && !strcmp(qk_cpu_isa(), first) && !*qk_cpu_isa_note(), "NULL: the best again (%s), no note",
          qk_cpu_isa());
    if (dispatch) {
        const int want[3] = {1, cpu_avx2 == 1 && cpu_fma == 1, cpu_avx2 == 1 && cpu_fma == 1 && cpu_512 == 1};
        for (l = 0; l < 3; l++) {
            qk_result r = qk_cpu_isa_set(isa_names[l]);
            if (r == QK_OK) {
                avail |= 1 << l;
                CHECK(!strcmp(qk_cpu_isa(), isa_names[l]), "set %s: qk_cpu_isa says %s", isa_names[l], qk_cpu_isa());
                printf("%-7s: runs\n", isa_names[l]);
            } else {
                CHECK(r == QK_ERROR_UNSUPPORTED && strstr(qk_last_error(), "lacks"), "set %s: %s (%s)", isa_names[l], qk_result_string(r),
                      qk_last_error());
                printf("%-7s: skipped: %s\n", isa_names[l], qk_last_error());
            }
            /* qk and the kernel's own word agree: an instruction set the CPU has is never skipped */
            if (cpu_avx2 >= 0 && cpu_fma >= 0 && (l < 2 || cpu_512 >= 0))
                CHECK((r == QK_OK) == want[l], "%s: qk %s it, /proc/cpuinfo says the CPU %s it", isa_names[l], r == QK_OK ? "runs" : "refuses",
                      want[l] ? "has" : "lacks");
        }
        CHECK(!strcmp(first, isa_names[avail & 4 ? 2 : avail & 2 ? 1 : 0]), "the default %s is the best the CPU has", first);
    } else {
        CHECK(qk_cpu_isa_set(first) == QK_OK, "the build's own %s: %s", first, qk_last_error());
        CHECK(qk_cpu_isa_set(!strcmp(first, "generic") ? "avx2" : "generic") == QK_ERROR_UNSUPPORTED, "another instruction set is refused");
        printf("no runtime dispatch: only the build's own kernels (%s), against themselves\n", first);
        isa_names[0] = first;
    }
    printf("instruction sets run:%s%s%s (the reference: %s)\n", avail & 1 ? " generic" : "", avail & 2 ? " avx2" : "", avail & 4 ? " avx512" : "",
           dispatch ? "generic" : first);
    g_ctx = qk_test_cpu_ctx(2);
    check_cases(avail);
    check_vjp(avail);
    CHECK(qk_cpu_isa_set("auto") == QK_OK && !strcmp(qk_cpu_isa(), first), "auto: %s", qk_cpu_isa());
    qk_ctx_destroy(g_ctx);
    printf("%s (%d checks, %d failures)\n", qk_test_fails ? "FAIL" : "ok", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
