// mc_transport.cu — a Monte Carlo proton-transport step loop profiled with qk_prof, in the CUPTI
// mode or with the macros only: the example of docs/profiler.md, the GPU advice test and the
// overhead benchmark.
//
// Particles (position, direction, energy; structure of arrays) are split in two halves on two
// streams. Each step runs, per half,
//   streaming    move each particle a step along its direction,
//   scattering   turn its direction by a multiple-Coulomb-scattering angle (hashed random numbers),
//   energy loss  slow it down (continuous slowing down) and deposit the energy lost in a dose grid
//                (atomicAdd); a particle below the cutoff starts again at the source,
// then, on a third stream, a cuBLAS SGEMM projects the dose grid onto detector channels
// (signal = response x dose), and a fourth stream copies the signal to pinned host memory (the
// response matrix went up from pageable memory before the loop). qk_prof zones mark the step,
// the launches and the copies; in the CUPTI mode every kernel (cuBLAS's included), copy and
// memset is recorded and attributed to its zone.
//
// The program counts what it launches from the point the profiler starts: its own kernels,
// copies and memsets, and the kernels and memsets of one SGEMM (a graph captured once, never
// launched, gives the count per call). --counts writes those numbers for tests/prof_gpu_advice.py.
//
//   mc_transport [--steps N] [--particles N] [--cupti] [--plant P]... [--json F] [--trace F]
//                [--html F] [--text F] [--counts F]
//     --plant pageable  the signal copy goes to pageable memory, and a 4 MiB source refill goes
//                       up from pageable memory every step
//     --plant sync      cudaDeviceSynchronize and host work on the signal at the end of every step
//     --plant serial    every kernel and copy on one stream, the particle energies (np floats,
//                       16 MiB by default) copied to pinned memory each step: a fifth or more of
//                       the stream's time, with nothing on other streams to overlap it
//     --plant leak      a 256 KiB device buffer allocated (and tracked) every step, never freed
//     --plant launch    the kernels split into 64 small launches each
//     --plant idle      at the end of every step the host waits for the step's work to finish
//                       (polling an event: no synchronization call) and then sleeps 3 ms, so the
//                       GPU sits idle 3 ms a step whatever its speed
//   mc_transport --bench [kernels_per_step] [steps]
//     the overhead benchmark: a loop of ~10 us kernels with no profiler, with the macros only
//     (a CPU zone per step and per launch) and in the CUPTI mode, three rounds each in this
//     process, the best of each; prints the time added per kernel.
//
// Build (no Meson): nvcc -O2 -std=c++17 -arch=sm_90 -I.. mc_transport.cu -lcublas
// Exit 77: no CUDA device.
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#define QK_PROF_CUDA
#include "qk_prof.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CB(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, (int)s_); exit(1); } } while (0)

enum { NG = 64, NXY = NG * NG, NDET = 256 };   // dose grid NG^3 (z slowest), detector channels
static const float E0 = 150.0f, ECUT = 1.0f;  // MeV

struct Particles { float *x, *y, *z, *u, *v, *w, *e; };

// counted launches, copies, memsets (from the profiler's start)
static long n_kernels, n_memcpy, n_memset;
static long c_stream, c_scatter, c_eloss; // per kernel
#define LAUNCH(counter, ...) do { __VA_ARGS__; CU(cudaGetLastError()); n_kernels++; counter++; } while (0)

__device__ __forceinline__ float hash01(unsigned i, unsigned s)
{
    unsigned h = i * 0x9E3779B1u ^ (s + 0x7F4A7C15u) * 0x85EBCA77u;
    h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
    return (h >> 8) * (1.0f / 16777216.0f);
}

__global__ void k_stream(Particles p, int off, int n, float ds)
{
    int i = off + blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= off + n) return;
    p.x[i] += ds * p.u[i]; p.y[i] += ds * p.v[i]; p.z[i] += ds * p.w[i];
}

__global__ void k_scatter(Particles p, int off, int n, unsigned step)
{
    int i = off + blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= off + n) return;
    float e = fmaxf(p.e[i], ECUT), th0 = 0.02f * sqrtf(E0 / e);      // Highland-like width
    float th = th0 * sqrtf(-2.0f * __logf(fmaxf(hash01(i, 2 * step), 1e-7f)));
    float ph = 6.2831853f * hash01(i, 2 * step + 1), st = __sinf(th), ct = __cosf(th);
    float u = p.u[i], v = p.v[i], w = p.w[i];
    float a = fabsf(w) < 0.99f ? 1.0f : 0.0f;                        // a vector not along d
    float px = a ? -v : 0.0f, py = a ? u : -w, pz = a ? 0.0f : v;   // d x (0,0,1) or d x (1,0,0)
    float pn = rsqrtf(px * px + py * py + pz * pz);
    px *= pn; py *= pn; pz *= pn;
    float qx = v * pz - w * py, qy = w * px - u * pz, qz = u * py - v * px;
    float cp = __cosf(ph), sp = __sinf(ph);
    u = ct * u + st * (cp * px + sp * qx); v = ct * v + st * (cp * py + sp * qy); w = ct * w + st * (cp * pz + sp * qz);
    float r = rsqrtf(u * u + v * v + w * w);
    p.u[i] = u * r; p.v[i] = v * r; p.w[i] = w * r;
}

__global__ void k_eloss(Particles p, int off, int n, float ds, float *dose, unsigned step)
{
    int i = off + blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= off + n) return;
    float e = p.e[i], de = ds * 8.0f / fmaxf(sqrtf(e), 0.5f);        // stopping power ~ 1/sqrt(E)
    de = fminf(de, e);
    int gx = (int)p.x[i], gy = (int)p.y[i], gz = (int)p.z[i];
    if (gx >= 0 && gx < NG && gy >= 0 && gy < NG && gz >= 0 && gz < NG) atomicAdd(&dose[(gz * NG + gy) * NG + gx], de);
    e -= de;
    if (e < ECUT || gz >= NG || gx < 0 || gx >= NG || gy < 0 || gy >= NG) { // restart at the source
        p.x[i] = NG / 2 + 4.0f * (hash01(i, step + 77) - 0.5f); p.y[i] = NG / 2 + 4.0f * (hash01(i, step + 78) - 0.5f);
        p.z[i] = 0.0f; p.u[i] = 0.0f; p.v[i] = 0.0f; p.w[i] = 1.0f; e = E0;
    }
    p.e[i] = e;
}

__global__ void k_spin(long long ns) // the benchmark's ~10 us kernel
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}

// one half's streaming, scattering and energy-loss launches (chunks of them: the launch plant)
static void launch_half(Particles p, int h, size_t half, int chunks, int chunk, int threads, float ds, float *dose,
                        unsigned step, cudaStream_t st)
{
    for (int c = 0; c < chunks; c++) {
        int off = (int)(h * half) + c * chunk, n = (int)((size_t)(c + 1) * chunk <= half ? chunk : half - (size_t)c * chunk);
        unsigned g = (unsigned)((n + threads - 1) / threads);
        if (n <= 0) continue;
        LAUNCH(c_stream, k_stream<<<g, threads, 0, st>>>(p, off, n, ds));
        LAUNCH(c_scatter, k_scatter<<<g, threads, 0, st>>>(p, off, n, step));
        LAUNCH(c_eloss, k_eloss<<<g, threads, 0, st>>>(p, off, n, ds, dose, step));
    }
}

static double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// kernels + memsets one SGEMM launches: a capture of one call, never launched
static int gemm_nodes(cublasHandle_t h, cudaStream_t s, const float *R, const float *dose, float *sig, int *memsets)
{
    const float one = 1.0f, zero = 0.0f;
    cudaGraph_t g;
    size_t n = 0;
    int k = 0;
    *memsets = 0;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) { cudaGetLastError(); return -1; }
    cublasStatus_t st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, NDET, NG, NXY, &one, R, NDET, dose, NXY, &zero, sig, NDET);
    if (cudaStreamEndCapture(s, &g) != cudaSuccess || st != CUBLAS_STATUS_SUCCESS) { cudaGetLastError(); return -1; }
    cudaGraphGetNodes(g, NULL, &n);
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc((n + 1) * sizeof *nodes);
    cudaGraphGetNodes(g, nodes, &n);
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType t;
        cudaGraphNodeGetType(nodes[i], &t);
        if (t == cudaGraphNodeTypeKernel) k++;
        if (t == cudaGraphNodeTypeMemset) (*memsets)++;
    }
    free(nodes);
    cudaGraphDestroy(g);
    return k;
}

static int bench(int kps, int steps)
{
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const long long ns = 10000;
    double best[3] = { 1e30, 1e30, 1e30 };
    const char *names[3] = { "no profiler", "macros only", "CUPTI mode" };
    k_spin<<<1, 32, 0, s>>>(ns);
    CU(cudaStreamSynchronize(s));
    for (int round = 0; round < 3; round++)
        for (int cfg = 0; cfg < 3; cfg++) {
            qk_prof_desc d;
            memset(&d, 0, sizeof d);
            d.cupti = cfg == 2 ? 1 : 0;
            if (cfg) QK_PROF_INIT(&d);
            for (int w = 0; w < 2; w++) { // warm-up, then the timed loop
                int n = w ? steps : 10;
                CU(cudaStreamSynchronize(s));
                double t0 = now_s();
                for (int i = 0; i < n; i++) {
                    if (cfg) QK_PROF_BEGIN("step");
                    for (int k = 0; k < kps; k++) {
                        if (cfg) QK_PROF_BEGIN("launch");
                        k_spin<<<1, 32, 0, s>>>(ns);
                        if (cfg) QK_PROF_END("launch");
                    }
                    if (cfg) QK_PROF_END("step");
                }
                CU(cudaStreamSynchronize(s));
                double t = now_s() - t0;
                if (w && t < best[cfg]) best[cfg] = t;
            }
            if (cfg == 2 && round == 0) {
                qk_prof_act_summary a;
                qk_prof_activity_summary(&a);
                printf("bench: CUPTI %s; recorded %llu kernels\n", qk_prof_cupti_status(), (unsigned long long)a.kernels);
            }
            if (cfg) QK_PROF_SHUTDOWN();
        }
    double per = (double)kps * steps;
    printf("bench: %d steps x %d kernels of %.0f us, best of 3 rounds\n", steps, kps, ns * 1e-3);
    for (int c = 0; c < 3; c++)
        printf("bench: %-12s %9.3f ms  %7.3f us/kernel  %+7.3f us/kernel vs none  %+6.2f %%\n", names[c], best[c] * 1e3,
               best[c] / per * 1e6, (best[c] - best[0]) / per * 1e6, 100.0 * (best[c] / best[0] - 1));
    printf("{\"bench\":\"mc_transport\",\"steps\":%d,\"kernels_per_step\":%d,\"kernel_ns\":%lld,\"none_s\":%.6f,"
           "\"macros_s\":%.6f,\"cupti_s\":%.6f,\"cupti_added_us_per_kernel\":%.4f,\"macros_added_us_per_kernel\":%.4f,"
           "\"cupti_pct\":%.3f,\"cupti_vs_macros_pct\":%.3f}\n", steps, kps, ns, best[0], best[1], best[2],
           (best[2] - best[0]) / per * 1e6, (best[1] - best[0]) / per * 1e6, 100.0 * (best[2] / best[0] - 1),
           100.0 * (best[2] / best[1] - 1));
    cudaStreamDestroy(s);
    return 0;
}

int main(int argc, char **argv)
{
    int steps = 100, np = 1 << 22, cupti = 0;
    int p_pageable = 0, p_sync = 0, p_serial = 0, p_leak = 0, p_launch = 0, p_idle = 0;
    const char *json = NULL, *trace = NULL, *html = NULL, *text = "-", *counts = NULL;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) { fprintf(stderr, "mc_transport: no CUDA device\n"); return 77; }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--bench")) {
            int kps = v && v[0] != '-' ? atoi(argv[++i]) : 100;
            int st = i + 1 < argc ? atoi(argv[i + 1]) : 200;
            return bench(kps > 0 ? kps : 100, st > 0 ? st : 200);
        }
        if (!strcmp(a, "--cupti")) { cupti = 1; continue; }
        if (!v) { fprintf(stderr, "mc_transport: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--particles")) np = atoi(v) & ~1;
        else if (!strcmp(a, "--json")) json = v;
        else if (!strcmp(a, "--trace")) trace = v;
        else if (!strcmp(a, "--html")) html = v;
        else if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--counts")) counts = v;
        else if (!strcmp(a, "--plant")) {
            if (!strcmp(v, "pageable")) p_pageable = 1;
            else if (!strcmp(v, "sync")) p_sync = 1;
            else if (!strcmp(v, "serial")) p_serial = 1;
            else if (!strcmp(v, "leak")) p_leak = 1;
            else if (!strcmp(v, "launch")) p_launch = 1;
            else if (!strcmp(v, "idle")) p_idle = 1;
            else { fprintf(stderr, "mc_transport: unknown plant %s\n", v); return 2; }
        } else { fprintf(stderr, "mc_transport: unknown option %s\n", a); return 2; }
    }
    if (steps < 4 || np < 1024) { fprintf(stderr, "mc_transport: --steps >= 4, --particles >= 1024\n"); return 2; }

    // ---- setup before the profiler starts: context, streams, cuBLAS and its warm-up (not counted)
    cudaStream_t sa, sb, sblas, scopy;
    CU(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&sblas, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&scopy, cudaStreamNonBlocking));
    if (p_serial) sb = sblas = scopy = sa;
    const size_t half = (size_t)np / 2, pbytes = (size_t)np * sizeof(float), dose_bytes = (size_t)NXY * NG * sizeof(float);
    const size_t sig_bytes = (size_t)NDET * NG * sizeof(float), refill = 4u << 20;
    Particles p;
    float **f[7] = { &p.x, &p.y, &p.z, &p.u, &p.v, &p.w, &p.e };
    for (int k = 0; k < 7; k++) CU(cudaMalloc(f[k], pbytes));
    float *dose, *R, *sig, *d_refill, *workspace;
    CU(cudaMalloc(&dose, dose_bytes));
    CU(cudaMalloc(&R, (size_t)NDET * NXY * sizeof(float)));
    CU(cudaMalloc(&sig, sig_bytes));
    CU(cudaMalloc(&d_refill, refill));
    CU(cudaMalloc(&workspace, 32u << 20));
    float *h_part, *h_sig, *h_dose, *h_resp, *h_refill, *h_sig_pageable;
    const size_t resp_bytes = (size_t)NDET * NXY / NG * sizeof(float); /* the response's nonzero band: 64 KiB */
    CU(cudaMallocHost(&h_part, pbytes));
    CU(cudaMallocHost(&h_sig, sig_bytes));
    CU(cudaMallocHost(&h_dose, dose_bytes));
    h_resp = (float *)malloc(resp_bytes);            // pageable on purpose: a small copy before the loop
    h_refill = (float *)calloc(1, refill);           // pageable: the pageable plant's refill
    h_sig_pageable = (float *)malloc(sig_bytes);     // pageable: the pageable plant's signal copy
    cublasHandle_t blas;
    CB(cublasCreate(&blas));
    CB(cublasSetStream(blas, sblas));
    CB(cublasSetWorkspace(blas, workspace, 32u << 20)); // the same kernels in and out of graph capture
    CU(cudaMemset(R, 0, (size_t)NDET * NXY * sizeof(float)));
    {   // warm-up: one SGEMM, then count one call's kernels and memsets from a captured graph
        const float one = 1.0f, zero = 0.0f;
        CB(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, NDET, NG, NXY, &one, R, NDET, dose, NXY, &zero, sig, NDET));
        k_stream<<<1, 32, 0, sa>>>(p, 0, 0, 0.f); k_scatter<<<1, 32, 0, sa>>>(p, 0, 0, 0); // module loads
        k_eloss<<<1, 32, 0, sa>>>(p, 0, 0, 0.f, dose, 0);
        CU(cudaDeviceSynchronize());
    }
    int gemm_memsets = 0, gemm_kernels = gemm_nodes(blas, sblas, R, dose, sig, &gemm_memsets);
    CB(cublasSetStream(blas, sblas));
    CU(cudaDeviceSynchronize());

    // ---- the profiler starts here; from now on every launch, copy and memset is counted
    qk_prof_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.cupti = cupti;
    if (QK_PROF_INIT(&desc) != 0) { fprintf(stderr, "mc_transport: %s\n", qk_prof_last_error()); return 1; }
    QK_PROF_THREAD_NAME("transport loop");
    QK_PROF_STREAM_NAME(sa, "particles A");
    if (!p_serial) {
        QK_PROF_STREAM_NAME(sb, "particles B");
        QK_PROF_STREAM_NAME(sblas, "detector (cuBLAS)");
        QK_PROF_STREAM_NAME(scopy, "signal copy");
    }
    int64_t pshape[1] = { np };
    QK_PROF_TRACK_SHAPE("particle energy", p.e, pbytes, "f32", 1, pshape);
    QK_PROF_TRACK("dose", dose, dose_bytes);
    QK_PROF_TRACK("response", R, (size_t)NDET * NXY * sizeof(float));
    QK_PROF_TRACK("signal (pinned)", h_sig, sig_bytes);
    QK_PROF_MEM_SNAPSHOT("start");

    QK_PROF_BEGIN("setup");
    for (size_t i = 0; i < (size_t)np; i++) h_part[i] = NG / 2;
    CU(QK_PROF_MEMCPY(p.x, h_part, pbytes, cudaMemcpyHostToDevice, sa)); n_memcpy++;   // pinned H2D
    CU(QK_PROF_MEMCPY(p.y, h_part, pbytes, cudaMemcpyHostToDevice, sa)); n_memcpy++;
    CU(cudaStreamSynchronize(sa)); // h_part is rewritten below
    CU(cudaMemsetAsync(p.z, 0, pbytes, sa)); n_memset++;
    CU(cudaMemsetAsync(p.u, 0, pbytes, sa)); n_memset++;
    CU(cudaMemsetAsync(p.v, 0, pbytes, sa)); n_memset++;
    for (size_t i = 0; i < (size_t)np; i++) h_part[i] = 1.0f;
    CU(QK_PROF_MEMCPY(p.w, h_part, pbytes, cudaMemcpyHostToDevice, sa)); n_memcpy++;
    CU(cudaStreamSynchronize(sa));
    for (size_t i = 0; i < (size_t)np; i++) h_part[i] = E0 * (0.2f + 0.8f * (float)((i * 2654435761u) % 1000) / 1000.0f);
    CU(QK_PROF_MEMCPY(p.e, h_part, pbytes, cudaMemcpyHostToDevice, sa)); n_memcpy++;
    CU(cudaMemsetAsync(dose, 0, dose_bytes, sa)); n_memset++;
    for (int i = 0; i < NDET * NXY / NG; i++) h_resp[i] = (float)(i % 97 == 0) * 0.01f;
    CU(QK_PROF_MEMCPY(R, h_resp, resp_bytes, cudaMemcpyHostToDevice, sa)); n_memcpy++; // pageable H2D, small
    CU(cudaStreamSynchronize(sa));
    QK_PROF_END("setup");

    cudaEvent_t ev_a, ev_b, ev_gemm, ev_done;
    CU(cudaEventCreateWithFlags(&ev_a, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&ev_b, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&ev_gemm, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&ev_done, cudaEventDisableTiming));
    const int threads = 256, chunks = p_launch ? 64 : 1;
    const int chunk = (int)((half + chunks - 1) / chunks);
    const float ds = 0.5f, one = 1.0f, zero = 0.0f;
    long gemm_calls = 0;
    double host_sum = 0;
    float *leaks[4096];
    int n_leaks = 0;
    // a warm-up step under CUPTI (its first launches of each kernel cost more), outside the steps
    QK_PROF_BEGIN("warm-up");
    for (int h = 0; h < 2; h++) {
        cudaStream_t st = h ? sb : sa;
        LAUNCH(c_stream, k_stream<<<1, 32, 0, st>>>(p, 0, 0, ds));
        LAUNCH(c_scatter, k_scatter<<<1, 32, 0, st>>>(p, 0, 0, 0));
        LAUNCH(c_eloss, k_eloss<<<1, 32, 0, st>>>(p, 0, 0, ds, dose, 0));
    }
    QK_PROF_BEGIN("detector");
    CB(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, NDET, NG, NXY, &one, R, NDET, dose, NXY, &zero, sig, NDET));
    gemm_calls++;
    QK_PROF_END("detector");
    CU(cudaDeviceSynchronize());
    QK_PROF_END("warm-up");
    double t_loop = now_s();
    for (int s = 0; s < steps; s++) {
        QK_PROF_BEGIN("step");
        if (p_pageable) {
            QK_PROF_BEGIN("refill");
            CU(QK_PROF_MEMCPY(d_refill, h_refill, refill, cudaMemcpyHostToDevice, scopy)); n_memcpy++; // pageable
            QK_PROF_END("refill");
        }
        if (s > 0) { CU(cudaStreamWaitEvent(sa, ev_gemm, 0)); CU(cudaStreamWaitEvent(sb, ev_gemm, 0)); }
        // one zone per half, each with its literal name: a zone's name is fixed at its site
        QK_PROF_BEGIN("transport A");
        launch_half(p, 0, half, chunks, chunk, threads, ds, dose, (unsigned)s, sa);
        QK_PROF_END("transport A");
        QK_PROF_BEGIN("transport B");
        launch_half(p, 1, half, chunks, chunk, threads, ds, dose, (unsigned)s, sb);
        QK_PROF_END("transport B");
        CU(cudaEventRecord(ev_a, sa));
        CU(cudaEventRecord(ev_b, sb));
        QK_PROF_BEGIN("detector");
        CU(cudaStreamWaitEvent(sblas, ev_a, 0));
        CU(cudaStreamWaitEvent(sblas, ev_b, 0));
        CB(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, NDET, NG, NXY, &one, R, NDET, dose, NXY, &zero, sig, NDET));
        gemm_calls++;
        CU(cudaEventRecord(ev_gemm, sblas));
        QK_PROF_END("detector");
        QK_PROF_BEGIN("readout");
        CU(cudaStreamWaitEvent(scopy, ev_gemm, 0));
        if (p_serial) { CU(QK_PROF_MEMCPY(h_part, p.e, pbytes, cudaMemcpyDeviceToHost, sa)); n_memcpy++; }
        else { CU(QK_PROF_MEMCPY(p_pageable ? h_sig_pageable : h_sig, sig, sig_bytes, cudaMemcpyDeviceToHost, scopy)); n_memcpy++; }
        if (p_leak && n_leaks < 4096) {
            CU(cudaMalloc(&leaks[n_leaks], 256u << 10));
            QK_PROF_TRACK("per-step scratch", leaks[n_leaks], 256u << 10);
            n_leaks++;
        }
        if (p_sync) {
            CU(cudaDeviceSynchronize());
            for (int r = 0; r < 20; r++)
                for (int i = 0; i < NDET * NG; i++) host_sum += h_sig[i] * 1e-9 + (double)i * 1e-12; // host analysis
        }
        if (p_idle) { // the GPU drains (the signal copy is the step's last work), then 3 ms of host work
            struct timespec poll = { 0, 20000 }, ts = { 0, 3000000 };
            CU(cudaEventRecord(ev_done, scopy));
            while (cudaEventQuery(ev_done) == cudaErrorNotReady) nanosleep(&poll, NULL);
            nanosleep(&ts, NULL);
        }
        QK_PROF_END("readout");
        QK_PROF_COUNT("steps", 1);
        QK_PROF_END("step");
    }
    QK_PROF_BEGIN("drain");
    CU(cudaDeviceSynchronize());
    QK_PROF_END("drain");
    double t_loop_s = now_s() - t_loop;
    QK_PROF_BEGIN("download");
    CU(QK_PROF_MEMCPY(h_dose, dose, dose_bytes, cudaMemcpyDeviceToHost, sa)); n_memcpy++;
    CU(cudaStreamSynchronize(sa));
    QK_PROF_END("download");
    QK_PROF_MEM_SNAPSHOT("end");

    double dsum = 0;
    for (int i = 0; i < NXY * NG; i++) dsum += h_dose[i];
    long lib_kernels = gemm_kernels >= 0 ? gemm_calls * gemm_kernels : -1;
    long lib_memsets = gemm_kernels >= 0 ? gemm_calls * gemm_memsets : -1;
    printf("mc_transport: %d steps of %d particles in %.3f s (%.1f us/step), dose %.4g MeV%s\n", steps, np, t_loop_s,
           t_loop_s / steps * 1e6, dsum, host_sum < 0 ? "" : "");
    printf("launched: %ld own kernels, %ld SGEMM calls x %d kernels, %ld copies, %ld memsets (+ %ld by cuBLAS)\n", n_kernels,
           gemm_calls, gemm_kernels, n_memcpy, n_memset, lib_memsets);
    if (counts) {
        FILE *c = fopen(counts, "w");
        if (!c) { perror(counts); return 1; }
        fprintf(c, "{\"own_kernels\":%ld,\"gemm_calls\":%ld,\"gemm_kernels_per_call\":%d,\"library_kernels\":%ld,"
                   "\"kernels\":%ld,\"memcpys\":%ld,\"memsets\":%ld,\"library_memsets\":%ld,\"steps\":%d,"
                   "\"calls\":{\"k_stream\":%ld,\"k_scatter\":%ld,\"k_eloss\":%ld},"
                   "\"plants\":[%s%s%s%s%s%s\"\"]}\n",
                n_kernels, gemm_calls, gemm_kernels, lib_kernels, lib_kernels >= 0 ? n_kernels + lib_kernels : -1, n_memcpy,
                n_memset, lib_memsets, steps, c_stream, c_scatter, c_eloss,
                p_pageable ? "\"pageable\"," : "", p_sync ? "\"sync\"," : "", p_serial ? "\"serial\"," : "",
                p_leak ? "\"leak\"," : "", p_launch ? "\"launch\"," : "", p_idle ? "\"idle\"," : "");
        fclose(c);
    }
    int rc = 0;
    if (text) rc |= QK_PROF_REPORT(text);
    if (json) rc |= QK_PROF_WRITE_JSON(json);
    if (trace) rc |= QK_PROF_WRITE_TRACE(trace);
    if (html) rc |= QK_PROF_WRITE_HTML(html);
    if (rc) fprintf(stderr, "mc_transport: %s\n", qk_prof_last_error());

    for (int i = 0; i < n_leaks; i++) { QK_PROF_UNTRACK(leaks[i]); cudaFree(leaks[i]); }
    QK_PROF_UNTRACK(p.e); QK_PROF_UNTRACK(dose); QK_PROF_UNTRACK(R); QK_PROF_UNTRACK(h_sig);
    QK_PROF_SHUTDOWN();
    cublasDestroy(blas);
    for (int k = 0; k < 7; k++) cudaFree(*f[k]);
    cudaFree(dose); cudaFree(R); cudaFree(sig); cudaFree(d_refill); cudaFree(workspace);
    cudaFreeHost(h_part); cudaFreeHost(h_sig); cudaFreeHost(h_dose);
    free(h_resp); free(h_refill); free(h_sig_pageable);
    cudaEventDestroy(ev_a); cudaEventDestroy(ev_b); cudaEventDestroy(ev_gemm); cudaEventDestroy(ev_done);
    return rc || !(dsum > 0) ? 1 : 0;
}
