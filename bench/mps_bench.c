/* qk MPS path benchmark (CPU engine, docs/mps.md): K(X,X) on the MPS path against the statevector
   path where both run (zz reps=2 linear, q = 12, 16, 20), and the MPS path alone at 100, 165 and 784
   qubits. Prints JSON. Each case: wall and CPU seconds (median of reps; CPU time = user + system
   of the process, less sensitive to other jobs on a shared machine), the MPS build time, overlaps
   computed (n(n+1)/2 for K(X,X)), overlaps/s, flops per overlap and the planner's choice for the
   case. The load average at the start and end is recorded: on a shared 2-core machine the wall
   figures move with it.

   usage: mps_bench [--threads N] [--quick] [--device cuda] [--case SPEC QUBITS N]
   --device cuda: the GPU cases instead (one_gpu below; bench/run.sh mps-gpu).
   --case: that one case alone on the MPS path (3 reps), for a profiler or paired timings of
   builds (docs/benchmarks.md, "Portable wheels"). */
#define _POSIX_C_SOURCE 200809L
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include "bench_clock.h"

static void cpu_model(char *buf, size_t size)
{
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    snprintf(buf, size, "unknown");
    if (!f) return;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            char *v = strchr(line, ':') + 2, *e = strchr(v, '\n');
            if (e) *e = 0;
            snprintf(buf, size, "%s", v);
            break;
        }
    fclose(f);
}

static int g_threads = 0, g_first = 1;
static const char *g_label;   /* printed instead of a long spec */
static unsigned long long g_s = 12345;

/* count angles uniform in [0, pi) from the benchmark's one stream (g_s, LCG) */
static void rand_angles(double *x, int64_t count)
{
    int64_t i;
    for (i = 0; i < count; i++) { g_s = g_s * 6364136223846793005ULL + 1442695040888963407ULL; x[i] = (double)(g_s >> 11) * (3.141592653589793 / 9007199254740992.0); }
}

static void one(const char *spec, int q, int64_t n, qk_path path, int reps)
{
    double *x = (double *)malloc(sizeof(double) * (size_t)(n * q)), *K = (double *)malloc(sizeof(double) * (size_t)(n * n));
    double tw[16], tc[16], tb = 0, disc = 0;
    qk_map *m = NULL;
    qk_ctx *ctx = NULL;
    qk_ctx_desc cd;
    qk_gram_desc d;
    qk_plan plan, autoplan;
    qk_path chosen;
    int64_t ov = n * (n + 1) / 2;
    int r;
    if (!x || !K) { fprintf(stderr, "out of memory\n"); exit(1); }
    rand_angles(x, n * q);
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = g_threads;
    if (qk_map_parse(spec, q, &m) || qk_ctx_create(&cd, &ctx)) { fprintf(stderr, "%s\n", qk_last_error()); exit(1); }
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = n; d.out = K; d.out_dtype = QK_F64;
    if (qk_plan_make(ctx, m, &d, &autoplan) != QK_OK) { fprintf(stderr, "plan: %s\n", qk_last_error()); exit(1); }
    chosen = autoplan.path;
    d.path = path;
    if (qk_plan_make(ctx, m, &d, &plan) != QK_OK) { fprintf(stderr, "plan: %s\n", qk_last_error()); exit(1); }
    if (plan.path == QK_PATH_MPS) {   /* the build alone (the Gram includes it) */
        qk__mps_prog p;
        double *S, t0 = bench_now();
        if (qk__mps_prog_make(m, &p) != QK_OK) exit(1);
        S = qk__mps_states(&p, m, x, n, plan.n_threads, &disc, NULL, NULL);
        tb = bench_now() - t0;
        free(S);
        qk__mps_prog_free(&p);
    }
    for (r = 0; r < reps; r++) {
        double t0 = bench_now(), c0 = bench_cpu_now();
        if (qk_gram(ctx, m, &d) != QK_OK) { fprintf(stderr, "gram: %s\n", qk_last_error()); exit(1); }
        tw[r] = bench_now() - t0;
        tc[r] = bench_cpu_now() - c0;
    }
    qsort(tw, (size_t)reps, sizeof(double), bench_cmp);
    qsort(tc, (size_t)reps, sizeof(double), bench_cmp);
    printf("%s    {\"map\": \"%s\", \"qubits\": %d, \"n\": %lld, \"path\": \"%s\", \"auto_path\": \"%s\", \"threads\": %d, \"reps\": %d,\n"
           "     \"wall_s\": %.4f, \"cpu_s\": %.4f, \"mps_build_s\": %.4f, \"overlaps\": %lld, \"overlaps_per_s\": %.1f, \"overlaps_per_cpu_s\": %.1f,\n"
           "     \"flops_per_overlap\": %.4g, \"bond\": %d, \"discarded_norm\": %.3g}",
           g_first ? "" : ",\n", g_label ? g_label : spec, q, (long long)n, plan.path == QK_PATH_MPS ? "mps" : "statevector",
           chosen == QK_PATH_MPS ? "mps" : "statevector", plan.n_threads, reps, tw[reps / 2], tc[reps / 2], tb, (long long)ov,
           (double)ov / tw[reps / 2], (double)ov / tc[reps / 2],
           plan.path == QK_PATH_MPS ? plan.mps_pair_flops : (plan.path == QK_PATH_REAL ? 2.0 : 8.0) * ldexp(1.0, q),
           plan.mps_bond, disc);
    fflush(stdout);
    g_first = 0;
    qk_ctx_destroy(ctx);
    qk_map_free(m);
    free(x);
    free(K);
}

/* cuTN-QSVM's circuit (Tim-Li/cuTN-QSVM benchmark/banchmark_qsvm_tnsm-mpi_mgpu.py, make_bsp): H,
   RZ(x_q) RY(x_q) on every qubit, a CX ladder, RZ(x_q). malloc'd spec. */
static char *bsp_spec(int q)
{
    size_t cap = 64 * (size_t)q + 64, len = 0;
    char *spec = (char *)malloc(cap);
    int k;
    len += (size_t)snprintf(spec + len, cap - len, "circuit(qubits=%d:", q);
    for (k = 0; k < q; k++) len += (size_t)snprintf(spec + len, cap - len, " h(%d)", k);
    for (k = 0; k < q; k++) len += (size_t)snprintf(spec + len, cap - len, " rz(%d,x%d) ry(%d,x%d)", k, k, k, k);
    for (k = 0; k + 1 < q; k++) len += (size_t)snprintf(spec + len, cap - len, " cx(%d,%d)", k, k + 1);
    for (k = 0; k < q; k++) len += (size_t)snprintf(spec + len, cap - len, " rz(%d,x%d)", k, k);
    snprintf(spec + len, cap - len, ")");
    return spec;
}

#if defined(QK_CUDA) && QK_CUDA
/* One GPU case: K(X,X) of n samples on a CUDA context (host output in the precision's dtype),
   wall seconds of qk_gram (median of reps after one warm-up run), the host MPS build alone (the
   Gram includes it), the GPU contraction time (events, qk_ctx_cuda_stats gram_ms) and the plan. */
static void one_gpu(const char *spec, int q, int64_t n, qk_path path, qk_precision prec, int reps)
{
    double *x = (double *)malloc(sizeof(double) * (size_t)(n * q));
    void *K = malloc((size_t)(n * n) * (prec == QK_PRECISION_FP64 ? 8 : 4));
    double tw[16], tb = 0, gms = 0;
    qk_map *m = NULL;
    qk_ctx *ctx = NULL;
    qk_ctx_desc cd;
    qk_gram_desc d;
    qk_plan plan, autoplan;
    int64_t ov = n * (n + 1) / 2;
    int r;
    if (!x || !K) { fprintf(stderr, "out of memory\n"); exit(1); }
    rand_angles(x, n * q);
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CUDA;
    cd.autotune = -1;
    if (qk_map_parse(spec, q, &m) || qk_ctx_create(&cd, &ctx)) { fprintf(stderr, "%s\n", qk_last_error()); exit(1); }
    memset(&d, 0, sizeof d);
    d.x = x; d.n_x = n; d.out = K; d.precision = prec;
    if (qk_plan_make(ctx, m, &d, &autoplan) != QK_OK) { fprintf(stderr, "plan: %s\n", qk_last_error()); exit(1); }
    d.path = path;
    if (qk_plan_make(ctx, m, &d, &plan) != QK_OK) { fprintf(stderr, "plan (%s, %d q): %s\n", spec, q, qk_last_error()); exit(1); }
    if (plan.path == QK_PATH_MPS) {
        qk__mps_prog p;
        double *S, t0 = bench_now();
        if (qk__mps_prog_make(m, &p) != QK_OK) exit(1);
        S = qk__mps_states(&p, m, x, n, qk__ncores(), NULL, NULL, NULL);
        tb = bench_now() - t0;
        free(S);
        qk__mps_prog_free(&p);
    }
    if (reps > 15) reps = 15;
    for (r = -1; r < reps; r++) {
        double t0 = bench_now();
        if (qk_gram(ctx, m, &d) != QK_OK) { fprintf(stderr, "gram (%s, %d q): %s\n", spec, q, qk_last_error()); exit(1); }
        if (r >= 0) { tw[r] = bench_now() - t0; gms = qk_ctx_cuda_stats(ctx).gram_ms; }
    }
    qsort(tw, (size_t)reps, sizeof(double), bench_cmp);
    printf("%s    {\"map\": \"%s\", \"qubits\": %d, \"n\": %lld, \"device\": \"%s\", \"path\": \"%s\", \"auto_path\": \"%s\", \"precision\": \"%s\", \"reps\": %d,\n"
           "     \"wall_s\": %.4f, \"mps_build_s\": %.4f, \"gpu_gram_ms\": %.2f, \"overlaps\": %lld, \"overlaps_per_s\": %.1f,\n"
           "     \"flops_per_overlap\": %.4g, \"bond\": %d, \"config\": \"%s\"}",
           g_first ? "" : ",\n", g_label ? g_label : spec, q, (long long)n, plan.device_name, plan.path == QK_PATH_MPS ? "mps" : "statevector",
           autoplan.path == QK_PATH_MPS ? "mps" : "statevector", prec == QK_PRECISION_FP64 ? "fp64" : "fp32", reps, tw[reps / 2], tb,
           plan.path == QK_PATH_MPS ? gms : -1.0, (long long)ov, (double)ov / tw[reps / 2],
           plan.path == QK_PATH_MPS ? plan.mps_pair_flops : (plan.path == QK_PATH_REAL ? 2.0 : 8.0) * ldexp(1.0, q),
           plan.mps_bond, plan.config);
    fflush(stdout);
    g_first = 0;
    qk_ctx_destroy(ctx);
    qk_map_free(m);
    free(x);
    free(K);
}

/* The GPU cases of issue 13 (bench/run.sh mps-gpu): the targets, the crossover against the
   statevector path, fp64 and the warp kernel. */
static int gpu_main(int quick)
{
    const qk_precision f32 = QK_PRECISION_FP32, f64 = QK_PRECISION_FP64;
    int q;
    char *spec;
    printf("{\"bench\": \"mps_gpu\", \"host_cores\": %d, \"cases\": [\n", qk__ncores());
    one_gpu("zz(reps=2,ent=linear)", 100, 4096, QK_PATH_MPS, f32, 3);    /* target <= 2 s (H200) */
    one_gpu("zz(reps=2,ent=linear)", 165, 6400, QK_PATH_MPS, f32, 3);    /* target <= 60 s */
    one_gpu("zz(reps=2,ent=linear)", 784, 1000, QK_PATH_MPS, f32, 3);    /* target <= 10 s */
    one_gpu("zz(reps=2,ent=linear)", 1000, 1024, QK_PATH_MPS, f32, 3);   /* runs, time recorded */
    spec = bsp_spec(784);
    g_label = "cutn-qsvm make_bsp";
    one_gpu(spec, 784, 1000, QK_PATH_MPS, f32, 3);                       /* their 9089 s on 8 H100 */
    g_label = NULL;
    free(spec);
    one_gpu("zz(reps=2,ent=linear)", 100, 4096, QK_PATH_MPS, f64, 3);
    one_gpu("zz(reps=3,ent=linear)", 100, 1024, QK_PATH_MPS, f32, 3);    /* bond 8: warp kernel */
    if (!quick) one_gpu("zz(reps=2,ent=circular)", 100, 1024, QK_PATH_MPS, f32, 1);   /* bond 16 */
    /* crossover: both paths on the GPU, n = 2048, fp32 (the planner's QK__MPS_GPU_FLOP_RATIO) */
    for (q = 8; q <= (quick ? 16 : 20); q += 2) {
        one_gpu("zz(reps=2,ent=linear)", q, 2048, QK_PATH_MPS, f32, 3);
        one_gpu("zz(reps=2,ent=linear)", q, 2048, QK_PATH_COMPLEX, f32, 3);
    }
    printf("\n]}\n");
    return 0;
}
#endif

int main(int argc, char **argv)
{
    int i, quick = 0, gpu = 0;
    char cpu[128];
    const char *cs = NULL;
    int cq = 0;
    long long cn = 0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) g_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cuda")) { gpu = 1; i++; }
        else if (!strcmp(argv[i], "--case") && i + 3 < argc) { cs = argv[i + 1]; cq = atoi(argv[i + 2]); cn = atoll(argv[i + 3]); i += 3; }
        else { fprintf(stderr, "usage: mps_bench [--threads N] [--quick] [--device cuda] [--case SPEC QUBITS N]\n"); return 2; }
    }
    if (gpu) {
#if defined(QK_CUDA) && QK_CUDA
        return gpu_main(quick);
#else
        fprintf(stderr, "mps_bench: built without the CUDA engine\n");
        return 2;
#endif
    }
    cpu_model(cpu, sizeof cpu);
    if (cs) {
        if (cq < 1 || cn < 1) { fprintf(stderr, "mps_bench: --case needs qubits >= 1 and n >= 1\n"); return 2; }
        printf("{\"bench\": \"mps_cpu\", \"cpu\": \"%s\", \"isa\": \"%s\", \"isa_note\": \"%s\", \"cases\": [\n", cpu, qk_cpu_isa(),
               qk_cpu_isa_note());
        one(cs, cq, (int64_t)cn, QK_PATH_MPS, 3);
        printf("\n]}\n");
        return 0;
    }
    printf("{\"bench\": \"mps_cpu\", \"cpu\": \"%s\", \"cores\": %d, \"load_avg_start\": %.2f, \"cases\": [\n", cpu, qk__ncores(), bench_loadavg());
    /* both paths: zz reps=2 linear (bond 4) */
    one("zz(reps=2,ent=linear)", 12, 512, QK_PATH_MPS, 3);
    one("zz(reps=2,ent=linear)", 12, 512, QK_PATH_COMPLEX, 3);
    one("zz(reps=2,ent=linear)", 16, 256, QK_PATH_MPS, 3);
    one("zz(reps=2,ent=linear)", 16, 256, QK_PATH_COMPLEX, 3);
    one("zz(reps=2,ent=linear)", 20, 96, QK_PATH_MPS, 3);
    if (!quick) one("zz(reps=2,ent=linear)", 20, 96, QK_PATH_COMPLEX, 1);
    /* the crossover region (one thread: CPU seconds; QK__MPS_FLOP_RATIO in qk.h) */
    {
        int q, t = g_threads;
        g_threads = 1;
        for (q = 9; q <= 12; q++) {
            one("zz(reps=2,ent=linear)", q, 512, QK_PATH_MPS, 5);
            one("zz(reps=2,ent=linear)", q, 512, QK_PATH_COMPLEX, 5);
        }
        g_threads = t;
    }
    /* MPS only */
    one("zz(reps=2,ent=linear)", 100, 512, QK_PATH_MPS, 3);    /* issue 13's CPU target: <= 3 s */
    one("zz(reps=2,ent=linear)", 165, 400, QK_PATH_MPS, 3);    /* the SC'24 feature count */
    one("zz(reps=1,ent=linear)", 784, 200, QK_PATH_MPS, 1);    /* cuTN-QSVM's size, bond 2 */
    one("zz(reps=2,ent=linear)", 784, 200, QK_PATH_MPS, 1);    /* bond 4 */
    if (!quick) one("zz(reps=2,ent=circular)", 100, 256, QK_PATH_MPS, 1);   /* bond 16 */
    {   /* cuTN-QSVM's circuit; their 8-GPU run: 784 qubits, 1000 samples, every unordered pair */
        char *spec = bsp_spec(784);
        g_label = "cutn-qsvm make_bsp";
        one(spec, 784, quick ? 200 : 1000, QK_PATH_MPS, 1);
        g_label = NULL;
        free(spec);
    }
    printf("\n], \"load_avg_end\": %.2f}\n", bench_loadavg());
    return 0;
}
