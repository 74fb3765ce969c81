/* The projected quantum kernel on the MPS path (qk_gram_projected, docs/gradients.md; CPU
   engine): K(X,X) of zz(reps=2, ent=linear) at 165 and 784 qubits, beside the fidelity kernel
   (qk_gram, the same MPS path) on the same data. Prints one JSON object per case: wall and CPU
   seconds (median of reps; CPU = user + system of the process), the load average before and
   after (on a shared 2-core machine the wall figures move with it).

   usage: projected_bench [--threads N] [--quick] */
#define _POSIX_C_SOURCE 200809L
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include "bench_clock.h"


static void one(qk_ctx *ctx, const char *spec, int q, int64_t n, int reps)
{
    qk_map *m = NULL;
    double *x, *K, w[2][8], c[2][8], l0 = bench_loadavg();
    qk_gram_desc g;
    int r, kind;
    int64_t i;
    if (qk_map_parse(spec, q, &m) != QK_OK) { fprintf(stderr, "%s\n", qk_last_error()); exit(2); }
    x = (double *)malloc(sizeof(double) * (size_t)(n * m->n_features));
    K = (double *)malloc(sizeof(double) * (size_t)(n * n));
    srand(7);
    for (i = 0; i < n * m->n_features; i++) x[i] = 6.283 * rand() / (double)RAND_MAX;
    for (kind = 0; kind < 2; kind++)   /* 0: projected, 1: fidelity */
        for (r = 0; r < reps; r++) {
            double t0 = bench_now(), c0 = bench_cpu_now();
            qk_result res;
            memset(&g, 0, sizeof g);
            g.x = x; g.n_x = n; g.out = K; g.out_dtype = QK_F64;
            res = kind ? qk_gram(ctx, m, &g) : qk_gram_projected(ctx, m, &g, 0.1);
            if (res != QK_OK) { fprintf(stderr, "%s\n", qk_last_error()); exit(1); }
            w[kind][r] = bench_now() - t0;
            c[kind][r] = bench_cpu_now() - c0;
        }
    for (kind = 0; kind < 2; kind++) { qsort(w[kind], (size_t)reps, sizeof(double), bench_cmp); qsort(c[kind], (size_t)reps, sizeof(double), bench_cmp); }
    printf("{\"map\": \"%s\", \"qubits\": %d, \"n\": %lld, \"reps\": %d, \"projected_wall_s\": %.4f, \"projected_cpu_s\": %.4f, "
           "\"fidelity_wall_s\": %.4f, \"fidelity_cpu_s\": %.4f, \"threads\": %d, \"load_before\": %.2f, \"load_after\": %.2f}\n",
           spec, q, (long long)n, reps, w[0][reps / 2], c[0][reps / 2], w[1][reps / 2], c[1][reps / 2], qk_ctx_query(ctx).n_threads, l0,
           bench_loadavg());
    fflush(stdout);
    free(x); free(K);
    qk_map_free(m);
}

int main(int argc, char **argv)
{
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    int i, threads = 0, quick = 0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else { fprintf(stderr, "usage: projected_bench [--threads N] [--quick]\n"); return 2; }
    }
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = threads;
    if (qk_ctx_create(&cd, &ctx) != QK_OK) { fprintf(stderr, "%s\n", qk_last_error()); return 2; }
    one(ctx, "zz(reps=2,ent=linear)", 165, quick ? 200 : 1000, 3);
    one(ctx, "zz(reps=2,ent=linear)", 784, quick ? 50 : 200, 3);
    one(ctx, "zz(reps=2,ent=circular)", 165, quick ? 50 : 200, 3);   /* bond 16 */
    qk_ctx_destroy(ctx);
    return 0;
}
