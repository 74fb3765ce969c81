/* qk CPU engine benchmark: K(X,X) for zz reps=2 (default 8 qubits, n=4096), fp64, all threads.
   Prints JSON: states time, Gram time (total minus states), pairs/s. The numpy peer is
   bench/cpu_numpy.py, run beside it by bench/run.sh cpu-bench. Timing: wall clock, median of reps. */
#define _POSIX_C_SOURCE 200809L
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_clock.h"


int main(int argc, char **argv)
{
    int q = argc > 1 ? atoi(argv[1]) : 8, reps = 5, r;
    int64_t n = argc > 2 ? atoll(argv[2]) : 4096, i;
    const char *spec = argc > 3 ? argv[3] : "zz(reps=2)";
    int threads = argc > 4 ? atoi(argv[4]) : 0;
    double *x = (double *)malloc(sizeof(double) * (size_t)(n * q)), *K = (double *)malloc(sizeof(double) * (size_t)(n * n));
    double *S = (double *)malloc(sizeof(double) * (size_t)(n * 2) << q);
    double tg[16], ts[16];
    qk_map *m;
    qk_ctx *ctx;
    qk_ctx_desc cd;
    qk_gram_desc d;
    unsigned long long s = 12345;
    if (!x || !K || !S) { fprintf(stderr, "out of memory\n"); return 1; }
    for (i = 0; i < n * q; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; x[i] = (double)(s >> 11) * (6.283185307179586 / 9007199254740992.0); }
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = threads;
    if (qk_map_parse(spec, q, &m) || qk_ctx_create(&cd, &ctx)) { fprintf(stderr, "%s\n", qk_last_error()); return 1; }
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = n; d.out = K;
    for (r = 0; r < reps + 1; r++) {
        double t0 = bench_now(), t1, t2;
        if (qk_states(ctx, m, x, n, S)) { fprintf(stderr, "%s\n", qk_last_error()); return 1; }
        t1 = bench_now();
        if (qk_gram(ctx, m, &d)) { fprintf(stderr, "%s\n", qk_last_error()); return 1; }
        t2 = bench_now();
        if (r > 0) { ts[r - 1] = t1 - t0; tg[r - 1] = t2 - t1; }  /* run 0 is warm-up */
    }
    qsort(ts, (size_t)reps, sizeof(double), bench_cmp);
    qsort(tg, (size_t)reps, sizeof(double), bench_cmp);
    printf("{\"impl\": \"qk-cpu\", \"spec\": \"%s\", \"qubits\": %d, \"n\": %lld, \"threads\": %d, \"total_s\": %.6f, "
           "\"states_s\": %.6f, \"gram_only_s\": %.6f, \"total_Mpairs_s\": %.3f, \"gram_only_Mpairs_s\": %.3f, \"K01\": %.15f}\n",
           spec, q, (long long)n, qk_ctx_query(ctx).n_threads, tg[reps / 2], ts[reps / 2], tg[reps / 2] - ts[reps / 2],
           (double)n * (double)n / tg[reps / 2] * 1e-6, (double)n * (double)n / (tg[reps / 2] - ts[reps / 2]) * 1e-6, K[1]);
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    free(x); free(K); free(S);
    return 0;
}
