/* qk-mgpu-bench: one qk_gram on 1 or several GPUs of this process (issue 9), timed.

   usage: qk-mgpu-bench --features F --n N [--map SPEC] [--gpus 0,1] [--output device|npy|host]
                        [--split yes|no] (qk_gram_desc.mgpu_host_bound_split: 1 / -1; default 0)
                        [--pinned] (host: K in page-locked memory, cudaMallocHost)
                        [--out K.npy] [--reps R] [--precision P: fp32 (default), fp64, fp32x3, fp16, auto, ...] [--label L]
                        [--trace T.json] (qk-mgpu-bench-prof, built with the profiler: qk's zones of the
                        timed calls as a Chrome trace, and the text report on standard output)

   X: N x F uniform in [0, pi] (seed 1). After one warm-up call (autotune cache, CUDA contexts,
   pinned staging), R timed calls of qk_gram on a context of the listed GPUs (wall clock around
   the call, qk_cuda_wtime); prints the median, Gpairs/s (N * cols / seconds, every entry of K),
   each GPU's finish time in the median run (qk_ctx_device_seconds) and the slowest over the
   mean, and one JSON line ("json: {...}") for bench/run.sh mgpu. device: K stays on the
   GPUs (out_devices, rows per plan); npy: K streamed to --out (no_sync unless --sync); host: a
   pageable host buffer. */
#define QK_IMPLEMENTATION
#define QK_PROF_IMPLEMENTATION    /* qk-mgpu-bench-prof (-DQK_PROF_ENABLE): the profiler's implementation, here (qk.h's rule) */
#include "qk.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *spec = "zz(reps=2)", *outp = "/tmp/qk_mgpu_K.npy", *output = "device", *label = "", *trace = NULL;
    int F = 8, reps = 3, i, k, gpus[QK_MAX_DEVICES], ng = 0, sync = 0, split = 0, pinned = 0;
    long long N = 65536;
    qk_precision prec = QK_PRECISION_FP32;
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *map = NULL;
    qk_gram_desc g;
    qk_plan plan;
    double *x, t[64], sec[QK_MAX_DEVICES] = {0}, best_sec[QK_MAX_DEVICES], med, mean = 0, mx = 0;
    void *dev[QK_MAX_DEVICES];
    void *host = NULL;
    char buf[4096];
    qk_result r;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--features")) F = atoi(v), i++;
        else if (!strcmp(a, "--n")) N = atoll(v), i++;
        else if (!strcmp(a, "--map")) spec = v, i++;
        else if (!strcmp(a, "--out")) outp = v, i++;
        else if (!strcmp(a, "--output")) output = v, i++;
        else if (!strcmp(a, "--reps")) reps = atoi(v), i++;
        else if (!strcmp(a, "--label")) label = v, i++;
        else if (!strcmp(a, "--trace")) trace = v, i++;
        else if (!strcmp(a, "--sync")) sync = 1;
        else if (!strcmp(a, "--pinned")) pinned = 1;
        else if (!strcmp(a, "--split")) { split = !strcmp(v, "yes") ? 1 : !strcmp(v, "no") ? -1 : 0; i++; }
        else if (!strcmp(a, "--precision")) {
            if (qk_precision_parse(v, &prec) != QK_OK) { fprintf(stderr, "qk-mgpu-bench: %s\n", qk_last_error()); return 2; }
            i++;
        }
        else if (!strcmp(a, "--gpus")) {
            const char *c = v;
            i++;
            while (*c && ng < QK_MAX_DEVICES) { gpus[ng++] = atoi(c); while (*c && *c != ',') c++; if (*c) c++; }
        } else { fprintf(stderr, "qk-mgpu-bench: unknown option %s\n", a); return 2; }
    }
    if (reps < 1) reps = 1;
    if (reps > 64) reps = 64;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CUDA;
    if (ng > 0) { cd.cuda_devices = gpus; cd.n_cuda_devices = ng; }
    if ((r = qk_ctx_create(&cd, &ctx)) != QK_OK) { fprintf(stderr, "qk-mgpu-bench: %s: %s\n", qk_result_string(r), qk_last_error()); return 77; }
    if ((r = qk_map_parse(spec, F, &map)) != QK_OK) { fprintf(stderr, "qk-mgpu-bench: map: %s\n", qk_last_error()); return 1; }
    x = (double *)malloc(sizeof(double) * (size_t)N * (size_t)F);
    {
        unsigned long long s = 1;
        for (i = 0; i < N * F; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (double)(s >> 11) * (1.0 / 9007199254740992.0) * 3.14159265358979;
        }
    }
    memset(&g, 0, sizeof g);
    g.x = x;
    g.n_x = N;
    g.precision = prec;
    g.output = !strcmp(output, "npy") ? QK_OUTPUT_NPY : !strcmp(output, "host") ? QK_OUTPUT_HOST : QK_OUTPUT_DEVICE;
    g.out_path = outp;
    g.no_sync = !sync;
    g.mgpu_host_bound_split = split;
    if (g.output == QK_OUTPUT_HOST) {   /* before planning: the plan reads whether K is page-locked */
        const size_t kb = (size_t)N * (size_t)N * (prec == QK_PRECISION_FP64 ? 8 : 4);
        if (pinned) { if (cudaMallocHost(&host, kb) != cudaSuccess) host = NULL; }
        else host = malloc(kb);
        g.out = host;
        if (!host) { fprintf(stderr, "qk-mgpu-bench: out of host memory\n"); return 1; }
    }
    if ((r = qk_plan_make(ctx, map, &g, &plan)) != QK_OK) { fprintf(stderr, "qk-mgpu-bench: plan: %s\n", qk_last_error()); return 1; }
    qk_plan_describe(&plan, buf, sizeof buf);
    printf("%s", buf);
    {   /* what planning alone costs (qk_gram plans every call): qk_plan_make, median of 9 */
        double tp[9], t0;
        qk_plan p2;
        for (i = 0; i < 9; i++) {
            t0 = qk_cuda_wtime();
            if (qk_plan_make(ctx, map, &g, &p2) != QK_OK) { fprintf(stderr, "qk-mgpu-bench: plan: %s\n", qk_last_error()); return 1; }
            tp[i] = qk_cuda_wtime() - t0;
        }
        qsort(tp, 9, sizeof(double), cmp_d);
        printf("qk_plan_make: median %.3f ms (min %.3f, max %.3f) of 9\n", tp[4] * 1e3, tp[0] * 1e3, tp[8] * 1e3);
    }
    memset(dev, 0, sizeof dev);
    if (g.output == QK_OUTPUT_DEVICE) {
        for (k = 0; k < plan.n_devices; k++) {
            size_t rows = (size_t)(plan.dev_row0[k + 1] - plan.dev_row0[k]);
            cudaSetDevice(plan.devices[k]);
            if (cudaMalloc(&dev[k], rows * (size_t)N * (plan.out_dtype == QK_F64 ? 8 : 4)) != cudaSuccess) {
                fprintf(stderr, "qk-mgpu-bench: cudaMalloc of K's rows on GPU %d failed\n", plan.devices[k]);
                return 1;
            }
        }
        g.out_devices = dev;
    }
#ifndef QK_PROF_ENABLE
    if (trace) { fprintf(stderr, "qk-mgpu-bench: --trace needs the profiler build (qk-mgpu-bench-prof)\n"); return 2; }
#endif
    for (i = -1; i < reps; i++) {
        double t0;
        t0 = qk_cuda_wtime();
        r = qk_gram(ctx, map, &g);
        if (r != QK_OK) { fprintf(stderr, "qk-mgpu-bench: qk_gram: %s: %s\n", qk_result_string(r), qk_last_error()); return 1; }
        if (i >= 0) {
            t[i] = qk_cuda_wtime() - t0;
            printf("run %d: %.4f s\n", i, t[i]);
        }
    }
    {   /* the median run's per-GPU times: rerun the sort with indices */
        double s2[64];
        memcpy(s2, t, sizeof(double) * (size_t)reps);
        qsort(s2, (size_t)reps, sizeof(double), cmp_d);
        med = s2[reps / 2];
    }
    k = qk_ctx_device_seconds(ctx, sec, QK_MAX_DEVICES);   /* the last run's */
    memcpy(best_sec, sec, sizeof sec);
    for (i = 0; i < k; i++) { mean += sec[i] / k; if (sec[i] > mx) mx = sec[i]; }
    printf("%s: %d GPU(s), %s, median %.4f s of %d, %.2f Gpairs/s; last run's GPU finish times:", label, plan.n_devices, output, med, reps,
           (double)N * (double)N / med * 1e-9);
    for (i = 0; i < k; i++) printf(" GPU %d %.4f s", plan.devices[i], best_sec[i]);
    printf("; slowest / mean %.4f\n", k ? mx / mean : 1.0);
    {   /* where the last run's time went on the first GPU (its last engine call): the GPU's own
           figures against the wall clock around qk_gram (the rest is host set-up) */
        qk_cuda_stats cs = qk_ctx_cuda_stats(ctx);
        printf("first GPU, last engine call: events %.2f ms (states %.2f, Gram %.2f); finish %.2f ms of the call\n", cs.wall_ms,
               cs.states_ms, cs.gram_ms, k ? best_sec[0] * 1e3 : 0.0);
    }
    printf("json: {\"label\": \"%s\", \"map\": \"%s\", \"features\": %d, \"n\": %lld, \"output\": \"%s\", \"n_gpus\": %d, \"full_rows\": %d, "
           "\"median_s\": %.6f, \"runs_s\": [", label, spec, F, N, output, plan.n_devices, plan.dev_full_rows, med);
    for (i = 0; i < reps; i++) printf("%s%.6f", i ? ", " : "", t[i]);
    printf("], \"gpu_finish_s\": [");
    for (i = 0; i < k; i++) printf("%s%.6f", i ? ", " : "", best_sec[i]);
    printf("], \"slowest_over_mean\": %.5f, \"device\": \"%s\"}\n", k ? mx / mean : 1.0, plan.device_name);
    if (trace) {
        QK_PROF_GPU_COLLECT();
        if (QK_PROF_WRITE_TRACE(trace) != 0) fprintf(stderr, "qk-mgpu-bench: cannot write %s\n", trace);
        (void)QK_PROF_REPORT("-");
    }
    for (k = 0; k < QK_MAX_DEVICES; k++) if (dev[k]) cudaFree(dev[k]);
    if (g.output == QK_OUTPUT_NPY) remove(outp);
    if (pinned) cudaFreeHost(host);
    else free(host);
    free(x);
    qk_map_free(map);
    qk_ctx_destroy(ctx);
    return 0;
}
