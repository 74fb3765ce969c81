// prof_overhead_cuda.cu — host cost of qk_prof's GPU side, in one run (medians of 101
// interleaved batches): the clock reads, a CPU zone, the two cudaEventRecord calls a GPU zone
// needs (timing events, and for reference events without timing), a GPU zone (begin + end on
// the host, including its share of the deferred resolution), an empty kernel launch and an
// NVTX push + pop with no tool attached. Target (issue 4): a GPU zone costs at most 20% more
// than its event records, with zero synchronizations (shown: zones recorded behind a running
// kernel leave it running, compared with the same count of raw event records). The GPU zone's
// cost includes its share of the deferred resolution (each batch ends with a non-waiting
// collect); the resolution alone is measured apart too.
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
// With the resolution of whatever has finished: over the batches every zone is resolved once.
static void run_gzone_all(int n) { run_gzone(n); qk_prof_gpu_collect(0); }
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
    c[n].name = "GPU zone (begin + end + resolution)"; c[n].run = run_gzone_all; c[n++].batch = 200;
    c[n].name = "empty kernel launch"; c[n].run = run_launch; c[n++].batch = 200;
    c[n].name = "NVTX push + pop (no tool)"; c[n].run = run_nvtx; c[n++].batch = 1000;
    pb_run(c, n);
    CU(cudaStreamSynchronize(st));
    CU(cudaGetLastError());

    // The deferred resolution, per zone: 200 zones recorded, the stream drained (not timed),
    // then one qk_prof_gpu_collect(0) timed; median of 101.
    double res[PB_REPS];
    for (int r = 0; r < PB_REPS; r++) {
        run_gzone(200);
        CU(cudaStreamSynchronize(st));
        double a = pb_now_ns();
        qk_prof_gpu_collect(0);
        res[r] = (pb_now_ns() - a) / 200;
    }
    qsort(res, PB_REPS, sizeof res[0], pb_dcmp);
    double resolve_ns = res[PB_REPS / 2];

    // Zero synchronizations: zones recorded behind a 100 ms kernel leave it running. The same
    // count of raw cudaEventRecord pairs is the control: the device's command queue blocks the
    // host by itself beyond about a thousand commands.
    cudaEvent_t after;
    CU(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
    const int behind_n[2] = { 200, 1000 };
    double behind_ms[2][2];
    int behind_running[2][2];
    for (int k = 0; k < 2; k++)
        for (int prof = 0; prof < 2; prof++) {
            spin<<<1, 1, 0, st>>>(100000000LL);
            double t0 = pb_now_ns();
            if (prof) { run_gzone(behind_n[k]); QK_PROF_GPU_COLLECT(); }
            else run_rec_t(behind_n[k]);
            double t1 = pb_now_ns();
            CU(cudaEventRecord(after, st));
            behind_running[k][prof] = cudaEventQuery(after) == cudaErrorNotReady;
            behind_ms[k][prof] = (t1 - t0) * 1e-6;
            CU(cudaStreamSynchronize(st));
        }

    qk_prof_summary s;
    qk_prof_get_summary(&s);
    qk_prof_stats zs;
    qk_prof_zone_stats("gpu zone", 1, &zs);
    pb_print(c, n);
    const pb_case *zone = pb_find(c, n, "CPU zone (begin + end)"), *pair = pb_find(c, n, "two reads of the profiler clock");
    const pb_case *gz = pb_find(c, n, "GPU zone (begin + end + resolution)"), *rec = pb_find(c, n, "cudaEventRecord x2 (timing events)");
    double cpu_extra = zone->median - pair->median, gpu_ratio = gz->median / rec->median;
    printf("\n%s, driver %s (%d), runtime %d, profiler clock %s\n", prop.name, argc > 3 ? argv[3] : "?", drv, rt, s.clock);
    printf("CPU zone - two clock reads = %.2f ns (target <= 10 ns): %s\n", cpu_extra, cpu_extra <= 10 ? "met" : "MISSED");
    printf("deferred resolution: %.2f ns per zone (median of 101 collects of 200 zones)\n", resolve_ns);
    printf("GPU zone with its resolution (%.1f) / two event records (%.1f) = %.3f (target <= 1.20): %s\n", gz->median,
           rec->median, gpu_ratio, gpu_ratio <= 1.2 ? "met" : "MISSED");
    for (int k = 0; k < 2; k++)
        printf("%4d behind a 100 ms kernel: GPU zones %.3f ms (kernel still running: %s), raw event pairs %.3f ms (%s)\n",
               behind_n[k], behind_ms[k][1], behind_running[k][1] ? "yes" : "no", behind_ms[k][0],
               behind_running[k][0] ? "yes" : "no");
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
                   "\n\"gpu_resolution_ns_per_zone\":%.3f,"
                   "\n\"gpu_zone_over_event_records\":%.4f,\"gpu_target_ratio\":1.2,\"gpu_met\":%s,"
                   "\n\"behind_running_kernel\":[{\"n\":%d,\"zones_host_ms\":%.4f,\"zones_kernel_still_running\":%s,"
                   "\"raw_pairs_host_ms\":%.4f,\"raw_kernel_still_running\":%s},"
                   "{\"n\":%d,\"zones_host_ms\":%.4f,\"zones_kernel_still_running\":%s,"
                   "\"raw_pairs_host_ms\":%.4f,\"raw_kernel_still_running\":%s}],"
                   "\n\"gpu_zones_resolved\":%llu,\"gpu_zones_dropped\":%llu}\n",
                cpu_extra, cpu_extra <= 10 ? "true" : "false", resolve_ns, gpu_ratio, gpu_ratio <= 1.2 ? "true" : "false",
                behind_n[0], behind_ms[0][1], behind_running[0][1] ? "true" : "false", behind_ms[0][0],
                behind_running[0][0] ? "true" : "false", behind_n[1], behind_ms[1][1], behind_running[1][1] ? "true" : "false",
                behind_ms[1][0], behind_running[1][0] ? "true" : "false", (unsigned long long)zs.calls,
                (unsigned long long)s.dropped_gpu);
        fclose(f);
    }
    qk_prof_shutdown();
    return 0;
}
