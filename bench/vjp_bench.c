/* qk_gram_vjp against qk_gram on the CPU engine (issue 24): a map (hea(layers=2) by default) on q
   features and qubits, n samples, K(X,X), the same context; the loss L = sum G_ij K_ij with a
   random G. Prints min / median of reps alternating runs of each and the ratio of medians:
     vjp_bench [q] [n] [reps] [map]        (defaults 8 1000 5 "hea(layers=2)")
   Built with -DQK_PROF_ENABLE (qk_prof.h found), it also prints where the VJP's time goes: the
   mean per call of qk_gram_vjp's zones (warm-up included), e.g.
     cc -O2 -march=native -DQK_PROF_ENABLE -I. bench/vjp_bench.c -o vjp_prof -lm -lpthread */
#if defined(QK_PROF_ENABLE)
#define QK_PROF_IMPLEMENTATION
#endif
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "bench_clock.h"


int main(int argc, char **argv)
{
    const int q = argc > 1 ? atoi(argv[1]) : 8, reps = argc > 3 ? atoi(argv[3]) : 5;
    const int64_t n = argc > 2 ? atoll(argv[2]) : 1000;
    const char *spec = argc > 4 ? argv[4] : "hea(layers=2)";
    qk_map *m = NULL;
    qk_ctx *ctx = NULL;
    qk_ctx_desc cd;
    double *x = malloc(sizeof(double) * (size_t)(n * q)), *G = malloc(sizeof(double) * (size_t)(n * n)), *K = malloc(sizeof(double) * (size_t)(n * n));
    double *grad, tg[64], tv[64];
    int64_t i;
    int r;
    if (reps < 1 || reps > 64 || !x || !G || !K) return 2;
    srand(1);
    for (i = 0; i < n * q; i++) x[i] = 2.0 * rand() / RAND_MAX - 1.0;
    for (i = 0; i < n * n; i++) G[i] = 2.0 * rand() / RAND_MAX - 1.0;
    if (qk_map_parse(spec, q, &m) != QK_OK) return 2;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    if (qk_ctx_create(&cd, &ctx) != QK_OK) return 2;
    grad = malloc(sizeof(double) * (size_t)m->n_weights);
    for (r = 0; r <= reps; r++) {
        qk_gram_desc g;
        qk_vjp_desc v;
        double t0, t1, t2;
        memset(&g, 0, sizeof g);
        g.x = x; g.n_x = n; g.out = K; g.out_dtype = QK_F64;
        memset(&v, 0, sizeof v);
        v.x = x; v.n_x = n; v.g = G; v.grad_w = grad;
        t0 = bench_now();
        if (qk_gram(ctx, m, &g) != QK_OK) { printf("gram: %s\n", qk_last_error()); return 1; }
        t1 = bench_now();
        if (qk_gram_vjp(ctx, m, &v) != QK_OK) { printf("vjp: %s\n", qk_last_error()); return 1; }
        t2 = bench_now();
        if (r > 0) { tg[r - 1] = t1 - t0; tv[r - 1] = t2 - t1; }   /* run 0: warm-up */
    }
    qsort(tg, (size_t)reps, sizeof(double), bench_cmp);
    qsort(tv, (size_t)reps, sizeof(double), bench_cmp);
    printf("%s q=%d n=%lld P=%d threads=%d: qk_gram min %.4f median %.4f s; qk_gram_vjp min %.4f median %.4f s; "
           "vjp / gram (medians) %.2f; parameter shift would be 2P = %d Gram evaluations\n",
           spec, q, (long long)n, m->n_weights, qk_ctx_query(ctx).n_threads, tg[0], tg[reps / 2], tv[0], tv[reps / 2], tv[reps / 2] / tg[reps / 2],
           2 * m->n_weights);
#if defined(QK_PROF_ENABLE)
    {
        static const char *zones[] = {"vjp states", "vjp S", "vjp W", "vjp adjoint vectors", "vjp sweeps", "vjp K", "states", "gram block"};
        size_t z;
        for (z = 0; z < sizeof zones / sizeof zones[0]; z++) {
            qk_prof_stats st;
            if (qk_prof_zone_stats(zones[z], 0, &st) == 0)
                printf("  zone %-20s calls %4llu  mean %8.3f ms  min %8.3f ms\n", zones[z], (unsigned long long)st.calls, st.mean_ns * 1e-6,
                       st.min_ns * 1e-6);
        }
    }
#endif
    qk_map_free(m);
    qk_ctx_destroy(ctx);
    free(x); free(G); free(K); free(grad);
    return 0;
}
