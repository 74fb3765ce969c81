// qk_prof GPU zones on a real device (exit 77 where there is none):
//  - zone durations agree with independent event pairs recorded inside each zone;
//  - streams are separate lanes; busy time = union of the zones (checked against the test's
//    own events); nested zones on one stream;
//  - no synchronization per zone: 100 zones (each around an empty kernel) are recorded behind a
//    300 ms kernel that is still running afterwards (an independent event after them is not
//    ready). 100, not 1000: the device's command queue itself blocks the host at about a
//    thousand commands (seen on an H200: 1000 zones + kernels took the kernel's 300 ms);
//  - transfers: direction, pinned vs pageable, bytes; memory tracking of device and pinned
//    buffers; device snapshot and memory-pool statistics;
//  - a full zone queue drops zones and counts them, and never corrupts the rest.
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#define QK_PROF_CUDA
#define QK_PROF_NVTX /* the same names in Nsight Systems; costs about 2 ns with no tool attached */
#include "qk_prof.h"

#include <cuda_runtime.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <vector>

static int failures;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)
#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void spin(long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}

__global__ void empty() {}

static double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) { fprintf(stderr, "no CUDA device: skipped\n"); return 77; }
    cudaStream_t s1, s2;
    CU(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    QK_PROF_STREAM_NAME(s1, "compute");
    QK_PROF_STREAM_NAME(s2, "side \"stream\"");
    spin<<<1, 1, 0, s1>>>(1000); // warm-up: module load
    CU(cudaStreamSynchronize(s1));

    // 1. durations against independent events inside each zone
    const int N = 40;
    std::vector<cudaEvent_t> a(2 * N), b(2 * N);
    for (int i = 0; i < 2 * N; i++) { CU(cudaEventCreate(&a[i])); CU(cudaEventCreate(&b[i])); }
    srand((unsigned)time(NULL));
    std::vector<long long> want(N);
    for (int i = 0; i < N; i++) {
        want[i] = 50000 + rand() % 150000; // 50..200 us, fresh each run
        QK_PROF_GPU_BEGIN("k1", s1);
        cudaEventRecord(a[i], s1);
        spin<<<1, 1, 0, s1>>>(want[i]);
        cudaEventRecord(b[i], s1);
        QK_PROF_GPU_END("k1", s1);
        QK_PROF_GPU_BEGIN("k2", s2);
        cudaEventRecord(a[N + i], s2);
        spin<<<1, 1, 0, s2>>>(want[i] / 2);
        cudaEventRecord(b[N + i], s2);
        QK_PROF_GPU_END("k2", s2);
    }
    CU(cudaDeviceSynchronize());
    double ind[2] = { 0, 0 }, ind_min[2] = { 1e30, 1e30 };
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N; i++) {
            float ms = 0;
            CU(cudaEventElapsedTime(&ms, a[k * N + i], b[k * N + i]));
            ind[k] += ms * 1e6;
            if (ms * 1e6 < ind_min[k]) ind_min[k] = ms * 1e6;
        }
    qk_prof_stats st;
    for (int k = 0; k < 2; k++) {
        CHECK(qk_prof_zone_stats(k ? "k2" : "k1", 1, &st) == 0);
        CHECK(st.calls == (uint64_t)N);
        // the zone holds the inner pair plus two event records: a few us at most per zone
        double per = (st.total_ns - ind[k]) / N;
        fprintf(stderr, "%s: zone total %.1f us, independent %.1f us, %.2f us per zone more; min %.1f vs %.1f us\n",
                k ? "k2" : "k1", st.total_ns * 1e-3, ind[k] * 1e-3, per * 1e-3, st.min_ns * 1e-3, ind_min[k] * 1e-3);
        CHECK(per >= -1000 && per < 10000);
        CHECK(st.min_ns >= ind_min[k] - 1000);
    }
    // utilization of s1 = union of its zones; the test's own busy estimate is the sum of the
    // inner pairs (back to back on one stream, no overlap)
    {
        uint64_t z = 0;
        double busy = 0, wall = 0;
        CHECK(qk_prof_stream_stats(s1, &z, &busy, &wall) == 0);
        CHECK(z == (uint64_t)N);
        fprintf(stderr, "s1: %llu zones, busy %.1f us (independent %.1f us), wall %.1f us\n", (unsigned long long)z,
                busy * 1e-3, ind[0] * 1e-3, wall * 1e-3);
        CHECK(busy >= ind[0] - 1000 && busy <= ind[0] + N * 10000.0);
        CHECK(wall >= busy);
        CHECK(qk_prof_stream_stats((void *)0x1234, &z, &busy, &wall) == -1);
    }

    // 2. nested zones on one stream
    QK_PROF_GPU_BEGIN("outer", s2);
    for (int i = 0; i < 5; i++) {
        QK_PROF_GPU_BEGIN("inner", s2);
        spin<<<1, 1, 0, s2>>>(20000);
        QK_PROF_GPU_END("inner", s2);
    }
    QK_PROF_GPU_END("outer", s2);
    {
        qk_prof_stats o, in;
        CHECK(qk_prof_zone_stats("outer", 1, &o) == 0 && qk_prof_zone_stats("inner", 1, &in) == 0);
        CHECK(in.calls == 5 && o.calls == 1);
        CHECK(o.total_ns >= in.total_ns - 100 && in.min_ns >= 19000);
    }

    // 3. no synchronization per zone
    {
        cudaEvent_t after;
        CU(cudaEventCreate(&after));
        QK_PROF_GPU_BEGIN("long", s1);
        spin<<<1, 1, 0, s1>>>(300000000LL);
        QK_PROF_GPU_END("long", s1);
        double t0 = now_s();
        for (int i = 0; i < 100; i++) {
            QK_PROF_GPU_BEGIN("behind", s1);
            empty<<<1, 1, 0, s1>>>();
            QK_PROF_GPU_END("behind", s1);
        }
        QK_PROF_GPU_COLLECT(); // must not wait either
        double t1 = now_s();
        CU(cudaEventRecord(after, s1));
        cudaError_t q = cudaEventQuery(after);
        fprintf(stderr, "100 zones behind a 300 ms kernel: %.2f ms host time, kernel still running: %s\n",
                (t1 - t0) * 1e3, q == cudaErrorNotReady ? "yes" : "no");
        CHECK(q == cudaErrorNotReady);
        CHECK(t1 - t0 < 0.05);
        qk_prof_summary s;
        CU(cudaEventSynchronize(after));
        CHECK(qk_prof_zone_stats("behind", 1, &st) == 0 && st.calls == 100);
        CHECK(qk_prof_zone_stats("long", 1, &st) == 0 && st.min_ns >= 299e6);
        qk_prof_get_summary(&s);
        CHECK(s.dropped_gpu == 0 && s.gpu_pending == 0 && s.lanes == 2);
        cudaEventDestroy(after);
    }

    // 4. transfers and memory
    {
        const size_t bytes = 64u << 20;
        void *d = NULL, *h = NULL, *p = NULL;
        CU(cudaMalloc(&d, bytes));
        CU(cudaMallocHost(&p, bytes));
        h = malloc(bytes);
        memset(h, 1, bytes);
        memset(p, 2, bytes);
        QK_PROF_TRACK("dev buffer", d, bytes);
        QK_PROF_TRACK("pinned buffer", p, bytes);
        QK_PROF_MEM_SNAPSHOT("buffers allocated");
        CU(QK_PROF_MEMCPY(d, p, bytes, cudaMemcpyHostToDevice, s1));
        CU(QK_PROF_MEMCPY(d, h, bytes, cudaMemcpyHostToDevice, s1));
        CU(QK_PROF_MEMCPY(p, d, bytes, cudaMemcpyDeviceToHost, s1));
        CU(QK_PROF_MEMCPY(p, d, bytes, cudaMemcpyDefault, s1));
        CU(cudaStreamSynchronize(s1));
        CHECK(((unsigned char *)p)[bytes - 1] == 1);
        qk_prof_summary s;
        qk_prof_get_summary(&s);
        CHECK(s.device_current == (double)bytes && s.host_current == (double)bytes);
        QK_PROF_UNTRACK(d);
        QK_PROF_UNTRACK(p);
        qk_prof_get_summary(&s);
        CHECK(s.device_current == 0 && s.device_peak == (double)bytes);
        CHECK(qk_prof_zone_stats("memcpy", 1, &st) == 0 && st.calls == 4);
        cudaMemPool_t pool;
        void *pa = NULL;
        CU(cudaDeviceGetDefaultMemPool(&pool, 0));
        CU(cudaMallocAsync(&pa, 32u << 20, s2));
        CU(cudaStreamSynchronize(s2));
        QK_PROF_MEMPOOL("default pool", pool);
        CU(cudaFreeAsync(pa, s2));
        CU(cudaStreamSynchronize(s2));
        cudaFree(d);
        cudaFreeHost(p);
        free(h);
    }
    const char *dir = argc > 1 ? argv[1] : NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/gpu_prof.json", dir ? dir : "/tmp");
    CHECK(QK_PROF_WRITE_JSON(path) == 0);
    {
        FILE *f = fopen(path, "r");
        static char buf[1 << 20];
        size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        buf[len] = 0;
        if (f) fclose(f);
        CHECK(strstr(buf, "{\"dir\":\"H2D\",\"pinned\":true,\"count\":1,\"bytes\":67108864") != NULL);
        CHECK(strstr(buf, "{\"dir\":\"H2D\",\"pinned\":false,\"count\":1,\"bytes\":67108864") != NULL);
        CHECK(strstr(buf, "{\"dir\":\"D2H\",\"pinned\":true,\"count\":2,\"bytes\":134217728") != NULL);
        CHECK(strstr(buf, "\"pool_reserved\"") != NULL && strstr(buf, "\"device_total\"") != NULL);
        CHECK(strstr(buf, "side \\\"stream\\\"") != NULL);
    }
    if (dir) {
        snprintf(path, sizeof path, "%s/gpu_prof_trace.json", dir);
        CHECK(QK_PROF_WRITE_TRACE(path) == 0);
        snprintf(path, sizeof path, "%s/gpu_prof_report.txt", dir);
        CHECK(QK_PROF_REPORT(path) == 0);
    }
    QK_PROF_REPORT("-");
    qk_prof_shutdown();

    // 5. a full queue: zones beyond it are dropped and counted
    {
        qk_prof_desc dsc;
        memset(&dsc, 0, sizeof dsc);
        dsc.gpu_queue = 64;
        CHECK(qk_prof_init(&dsc) == 0);
        spin<<<1, 1, 0, s1>>>(200000000LL); // keeps every zone below unresolved
        for (int i = 0; i < 200; i++) {
            QK_PROF_GPU_BEGIN("q", s1);
            empty<<<1, 1, 0, s1>>>();
            QK_PROF_GPU_END("q", s1);
        }
        CU(cudaDeviceSynchronize());
        qk_prof_summary s;
        qk_prof_get_summary(&s);
        fprintf(stderr, "queue of 64: %llu zones dropped\n", (unsigned long long)s.dropped_gpu);
        CHECK(s.dropped_gpu == 200 - 64);
        CHECK(qk_prof_zone_stats("q", 1, &st) == 0 && st.calls == 64);
        // after the queue drained, zones record again
        QK_PROF_GPU_BEGIN("q", s1);
        empty<<<1, 1, 0, s1>>>();
        QK_PROF_GPU_END("q", s1);
        CHECK(qk_prof_zone_stats("q", 1, &st) == 0 && st.calls == 65);
        qk_prof_shutdown();
    }
    for (int i = 0; i < 2 * N; i++) { cudaEventDestroy(a[i]); cudaEventDestroy(b[i]); }
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    if (failures) { fprintf(stderr, "%d failure(s)\n", failures); return 1; }
    fprintf(stderr, "gpu_prof: ok\n");
    return 0;
}
