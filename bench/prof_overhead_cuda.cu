// prof_overhead_cuda.cu — host cost of qk_prof's GPU side, in one run (medians of 101
// interleaved batches): the clock reads, a CPU zone, the two cudaEventRecord calls a GPU zone
// needs (timing events, and for reference events without timing), a GPU zone (begin + end on
// the host, including its share of the deferred resolution), an empty kernel launch and an
// NVTX push + pop with no tool attached. Target (issue 4): a GPU zone costs at most 20% more
// than its event records, with zero synchronizations (shown: zones recorded behind a running
// kernel leave it running).
//
//   prof_overhead_cuda [result.json] [commit] [driver]
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#define QK_PROF_CUDA
#include "qk_prof.h"
#include "prof_overhead.h"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static volatile uint64_t sink;
static cudaStream_t st;
static cudaEvent_t ev_t[2], ev_n[2];

__global__ void empty_kernel() {}
__global__ void spin(long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}

static void run_cgt(int n) { for (int i = 0; i < n; i++) sink += (uint64_t)qk__prof_mono_ns(); }
#if defined(__x86_64__)
static void run_rdtsc(int n) { for (int i = 0; i < n; i++) sink += __rdtsc(); }
#endif
static void run_pair(int n)
{
    for (int i = 0; i < n; i++) {
        uint64_t a, b;
#if defined(__x86_64__)
        if (qk__prof_g.clock_mode == 0) { a = __rdtsc(); b = __rdtsc(); } else
#endif
        { a = qk__prof_mono_ns(); b = qk__prof_mono_ns(); }
        sink += b - a;
    }
}
static void run_zone(int n) { for (int i = 0; i < n; i++) { QK_PROF_BEGIN("cpu zone"); QK_PROF_END("cpu zone"); } }
static void run_rec_t(int n) { for (int i = 0; i < n; i++) { cudaEventRecord(ev_t[0], st); cudaEventRecord(ev_t[1], st); } }
static void run_rec_n(int n) { for (int i = 0; i < n; i++) { cudaEventRecord(ev_n[0], st); cudaEventRecord(ev_n[1], st); } }
static void run_gzone(int n) { for (int i = 0; i < n; i++) { QK_PROF_GPU_BEGIN("gpu zone", st); QK_PROF_GPU_END("gpu zone", st); } }
static void run_launch(int n) { for (int i = 0; i < n; i++) empty_kernel<<<1, 1, 0, st>>>(); }
static void run_nvtx(int n) { for (int i = 0; i < n; i++) { nvtxRangePushA("nvtx"); nvtxRangePop(); } }

int main(int argc, char **argv)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) { fprintf(stderr, "no CUDA device\n"); return 77; }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CU(cudaEventCreate(&ev_t[0]));
    CU(cudaEventCreate(&ev_t[1]));
    CU(cudaEventCreateWithFlags(&ev_n[0], cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&ev_n[1], cudaEventDisableTiming));
    qk_prof_desc d;
    memset(&d, 0, sizeof d);
    d.events_per_thread = 1u << 18;
    d.preallocate = 1;
    qk_prof_init(&d);
    empty_kernel<<<1, 1, 0, st>>>();
    CU(cudaStreamSynchronize(st));

    pb_case c[PB_MAX];
    int n = 0;
    memset(c, 0, sizeof c);
    c[n].name = "clock_gettime(CLOCK_MONOTONIC)"; c[n].run = run_cgt; c[n++].batch = 1000;
#if defined(__x86_64__)
    c[n].name = "rdtsc"; c[n].run = run_rdtsc; c[n++].batch = 1000;
#endif
    c[n].name = "two reads of the profiler clock"; c[n].run = run_pair; c[n++].batch = 1000;
    c[n].name = "CPU zone (begin + end)"; c[n].run = run_zone; c[n++].batch = 1000;
    c[n].name = "cudaEventRecord x2 (timing events)"; c[n].run = run_rec_t; c[n++].batch = 200;
    c[n].name = "cudaEventRecord x2 (no timing)"; c[n].run = run_rec_n; c[n++].batch = 200;
    c[n].name = "GPU zone (begin + end, host side)"; c[n].run = run_gzone; c[n++].batch = 200;
    c[n].name = "empty kernel launch"; c[n].run = run_launch; c[n++].batch = 200;
    c[n].name = "NVTX push + pop (no tool)"; c[n].run = run_nvtx; c[n++].batch = 1000;
    pb_run(c, n);
    CU(cudaStreamSynchronize(st));
    CU(cudaGetLastError());

    // zero synchronizations: 1000 zones recorded behind a 100 ms kernel leave it running
    cudaEvent_t after;
    CU(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
    spin<<<1, 1, 0, st>>>(100000000LL);
    double t0 = pb_now_ns();
    run_gzone(1000);
    QK_PROF_GPU_COLLECT();
    double t1 = pb_now_ns();
    CU(cudaEventRecord(after, st));
    int still_running = cudaEventQuery(after) == cudaErrorNotReady;
    CU(cudaStreamSynchronize(st));

    qk_prof_summary s;
    qk_prof_get_summary(&s);
    qk_prof_stats zs;
    qk_prof_zone_stats("gpu zone", 1, &zs);
    pb_print(c, n);
    const pb_case *zone = pb_find(c, n, "CPU zone (begin + end)"), *pair = pb_find(c, n, "two reads of the profiler clock");
    const pb_case *gz = pb_find(c, n, "GPU zone (begin + end, host side)"), *rec = pb_find(c, n, "cudaEventRecord x2 (timing events)");
    double cpu_extra = zone->median - pair->median, gpu_ratio = gz->median / rec->median;
    printf("\n%s, driver %s (%d), runtime %d, profiler clock %s\n", prop.name, argc > 3 ? argv[3] : "?", drv, rt, s.clock);
    printf("CPU zone - two clock reads = %.2f ns (target <= 10 ns): %s\n", cpu_extra, cpu_extra <= 10 ? "met" : "MISSED");
    printf("GPU zone / its two event records = %.3f (target <= 1.20): %s\n", gpu_ratio, gpu_ratio <= 1.2 ? "met" : "MISSED");
    printf("1000 GPU zones behind a 100 ms kernel: %.3f ms of host time, kernel still running afterwards: %s\n",
           (t1 - t0) * 1e-6, still_running ? "yes (no synchronization)" : "NO");
    printf("GPU zones resolved %llu, dropped %llu, pending %llu\n", (unsigned long long)zs.calls,
           (unsigned long long)s.dropped_gpu, (unsigned long long)s.gpu_pending);
    if (argc > 1) {
        FILE *f = fopen(argv[1], "w");
        if (!f) { perror(argv[1]); return 1; }
        fprintf(f, "{\"bench\":\"prof_overhead_cuda\",\"gpu\":\"%s\",\"driver\":\"%s\",\"driver_api\":%d,\"cuda_runtime\":%d,"
                   "\"commit\":\"%s\",\"profiler_clock\":\"%s\",\n",
                prop.name, argc > 3 ? argv[3] : "", drv, rt, argc > 2 ? argv[2] : "", s.clock);
        pb_json_cases(f, c, n);
        fprintf(f, ",\n\"cpu_zone_minus_clock_pair_ns\":%.3f,\"cpu_target_ns\":10,\"cpu_met\":%s,"
                   "\n\"gpu_zone_over_event_records\":%.4f,\"gpu_target_ratio\":1.2,\"gpu_met\":%s,"
                   "\n\"zones_behind_running_kernel\":{\"zones\":1000,\"host_ms\":%.4f,\"kernel_still_running\":%s},"
                   "\n\"gpu_zones_resolved\":%llu,\"gpu_zones_dropped\":%llu}\n",
                cpu_extra, cpu_extra <= 10 ? "true" : "false", gpu_ratio, gpu_ratio <= 1.2 ? "true" : "false",
                (t1 - t0) * 1e-6, still_running ? "true" : "false", (unsigned long long)zs.calls,
                (unsigned long long)s.dropped_gpu);
        fclose(f);
    }
    qk_prof_shutdown();
    return 0;
}
