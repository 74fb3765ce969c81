/* bench/cpu_state_bench.c: the CPU state builder (qk__state1) per state, one thread, best of 3,
   zz / iqp / hea maps at 10-18 qubits; prints a checksum of the last state so that two builds can
   be compared (docs/benchmarks.md, CPU state builder). Build against any qk.h:
       cc -O2 -std=gnu99 -I<dir of qk.h> bench/cpu_state_bench.c -lm -lpthread
       ./a.out "zz(reps=2)" */
#define QK_IMPLEMENTATION
#include "qk.h"
#include <time.h>
#include "bench_clock.h"
int main(int argc, char **argv)
{
    int qs[] = {10, 12, 14, 16, 18};
    const char *spec = argc > 1 ? argv[1] : "zz(reps=2)";
    for (int qi = 0; qi < 5; ++qi) {
        int q = qs[qi];
        qk_map *m;
        if (qk_map_parse(spec, q, &m) != QK_OK) { printf("%s\n", qk_last_error()); return 1; }
        int64_t D = (int64_t)1 << q;
        double *re = malloc(sizeof(double) * D), *im = malloc(sizeof(double) * D);
        double *theta = malloc(sizeof(double) * (m->n_ops + 1 + qk__diag_scratch(q)));
        double x[32];
        for (int i = 0; i < q; ++i) x[i] = 0.1 + 0.37 * i;
        int reps = q <= 12 ? 200 : q <= 16 ? 20 : 4;
        double best = 1e30, cs = 0;
        for (int r = 0; r < 3; ++r) {
            double t0 = bench_now();
            for (int k = 0; k < reps; ++k) {
#ifdef QK__POLL_WORK /* qk.h from 2026-11-23 on: a poll argument */
                qk__state1(m, x, re, im, theta, NULL);
#else
                qk__state1(m, x, re, im, theta);
#endif
            }
            double t = (bench_now() - t0) / reps;
            if (t < best) best = t;
        }
        for (int64_t i = 0; i < D; ++i) cs += re[i] * (i % 7) - im[i] * (i % 5);
        printf("%-12s q=%2d %8.3f ms/state  checksum %.15e\n", spec, q, best * 1e3, cs);
        free(re); free(im); free(theta); qk_map_free(m);
    }
    return 0;
}
