// transport_loop.cu — a small 2D particle-transport step loop instrumented with qk_prof.
//
// psi[E][theta][x][z] is the angular flux of a beam entering at x = 0. Each step runs
//   angular scattering  (a small Gaussian kernel over theta, per energy group),
//   spatial streaming   (first-order upwind in x and z along (cos theta, sin theta)),
//   energy loss         (continuous slowing down: flux moves to the next lower group; the
//                        energy lost is tallied as dose[x][z]),
// with the energy groups split over two streams for scattering and streaming and a third stream
// copying the dose back to pinned host memory every few steps. The CPU zone "step" and GPU zones
// around every kernel and copy show the per-stream lanes, the overlap and the utilization.
//
//   transport_loop [steps=300] [trace.json] [report.html] [report.txt]
//
// Build (no Meson): nvcc -O2 -std=c++17 -arch=sm_90 -I.. transport_loop.cu
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#define QK_PROF_CUDA
#define QK_PROF_NVTX /* the same names in Nsight Systems; costs about 2 ns with no tool attached */
#include "qk_prof.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define LAUNCHED() CU(cudaGetLastError())

enum { NE = 48, NT = 32, NX = 128, NZ = 128, KW = 3 };
#define IDX(e, t, x, z) ((((size_t)(e) * NT + (t)) * NX + (x)) * NZ + (z))

__constant__ float c_kernel[2 * KW + 1];
__constant__ float c_cos[NT], c_sin[NT];

// Scattering: psi'(theta) = (1 - s) psi(theta) + s * sum_k w_k psi(theta + k), per group.
__global__ void scatter(const float *__restrict__ in, float *__restrict__ out, int e0, int e1, float s)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t n = (size_t)(e1 - e0) * NT * NX * NZ;
    if (i >= n) return;
    int z = (int)(i % NZ), x = (int)(i / NZ % NX), t = (int)(i / ((size_t)NZ * NX) % NT), e = e0 + (int)(i / ((size_t)NZ * NX * NT));
    float acc = 0;
    for (int k = -KW; k <= KW; k++) acc += c_kernel[k + KW] * in[IDX(e, (t + k + NT) % NT, x, z)];
    out[IDX(e, t, x, z)] = (1 - s) * in[IDX(e, t, x, z)] + s * acc;
}

// Streaming: upwind differences along the direction of theta; the beam enters at x = 0 in the
// highest group, forward angles only.
__global__ void stream_step(const float *__restrict__ in, float *__restrict__ out, int e0, int e1, float c, float beam)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t n = (size_t)(e1 - e0) * NT * NX * NZ;
    if (i >= n) return;
    int z = (int)(i % NZ), x = (int)(i / NZ % NX), t = (int)(i / ((size_t)NZ * NX) % NT), e = e0 + (int)(i / ((size_t)NZ * NX * NT));
    float vx = c_cos[t], vz = c_sin[t], p = in[IDX(e, t, x, z)];
    float ux = vx > 0 ? (x > 0 ? in[IDX(e, t, x - 1, z)] : (e == NE - 1 && vx > 0.9f && abs(z - NZ / 2) < 8 ? beam : 0.f))
                      : (x < NX - 1 ? in[IDX(e, t, x + 1, z)] : 0.f);
    float uz = vz > 0 ? (z > 0 ? in[IDX(e, t, x, z - 1)] : 0.f) : (z < NZ - 1 ? in[IDX(e, t, x, z + 1)] : 0.f);
    out[IDX(e, t, x, z)] = p - c * fabsf(vx) * (p - ux) - c * fabsf(vz) * (p - uz);
}

// Energy loss: a fraction f of each group slows into the group below; what leaves group 0 and
// the energy step of every transfer are deposited as dose.
__global__ void energy_loss(const float *__restrict__ in, float *__restrict__ out, float *__restrict__ dose, float f)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t per = (size_t)NT * NX * NZ;
    if (i >= per) return;
    int z = (int)(i % NZ), x = (int)(i / NZ % NX);
    float dep = 0, from_above = 0;
    for (int e = NE - 1; e >= 0; e--) {
        float p = in[(size_t)e * per + i];
        float moved = f * p;
        out[(size_t)e * per + i] = p - moved + from_above;
        dep += moved * (e == 0 ? (float)1 : 1.0f / NE);
        from_above = moved * (e == 0 ? 0.f : 1.f);
    }
    atomicAdd(&dose[x * NZ + z], dep);
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 300;
    const char *trace = argc > 2 ? argv[2] : "transport_trace.json";
    const char *html = argc > 3 ? argv[3] : "transport_report.html";
    const char *report = argc > 4 ? argv[4] : "-";
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) { fprintf(stderr, "transport_loop: no CUDA device\n"); return 77; }

    const size_t cells = (size_t)NE * NT * NX * NZ, bytes = cells * sizeof(float), dose_bytes = (size_t)NX * NZ * sizeof(float);
    cudaStream_t sa, sb, sc;
    CU(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&sc, cudaStreamNonBlocking));
    QK_PROF_THREAD_NAME("host loop");
    QK_PROF_STREAM_NAME(sa, "groups hi + energy loss");
    QK_PROF_STREAM_NAME(sb, "groups lo");
    QK_PROF_STREAM_NAME(sc, "dose copy");
    QK_PROF_MEM_SNAPSHOT("start");

    float *psi[2], *dose, *h_dose, *h_psi;
    int64_t shape[4] = { NE, NT, NX, NZ };
    CU(cudaMalloc(&psi[0], bytes));
    CU(cudaMalloc(&psi[1], bytes));
    CU(cudaMalloc(&dose, dose_bytes));
    CU(cudaMallocHost(&h_dose, dose_bytes));
    h_psi = (float *)malloc(bytes); // pageable, on purpose: the report shows the difference
    QK_PROF_TRACK_SHAPE("psi A", psi[0], bytes, "f32", 4, shape);
    QK_PROF_TRACK_SHAPE("psi B", psi[1], bytes, "f32", 4, shape);
    QK_PROF_TRACK("dose", dose, dose_bytes);
    QK_PROF_TRACK("dose (pinned host)", h_dose, dose_bytes);
    QK_PROF_TRACK("psi (pageable host)", h_psi, bytes);

    {   // angular kernel and directions
        float k[2 * KW + 1], sum = 0, cs[NT], sn[NT];
        for (int i = -KW; i <= KW; i++) sum += k[i + KW] = expf(-0.5f * i * i);
        for (int i = 0; i < 2 * KW + 1; i++) k[i] /= sum;
        for (int t = 0; t < NT; t++) { cs[t] = cosf(6.2831853f * t / NT); sn[t] = sinf(6.2831853f * t / NT); }
        CU(cudaMemcpyToSymbol(c_kernel, k, sizeof k));
        CU(cudaMemcpyToSymbol(c_cos, cs, sizeof cs));
        CU(cudaMemcpyToSymbol(c_sin, sn, sizeof sn));
    }
    memset(h_psi, 0, bytes);
    QK_PROF_BEGIN("upload");
    CU(QK_PROF_MEMCPY(psi[0], h_psi, bytes, cudaMemcpyHostToDevice, sa)); // pageable H2D
    CU(cudaMemsetAsync(dose, 0, dose_bytes, sa));
    CU(cudaStreamSynchronize(sa));
    QK_PROF_END("upload");
    QK_PROF_MEM_SNAPSHOT("allocated");

    cudaEvent_t b_done, a_done, dose_ready;
    CU(cudaEventCreateWithFlags(&b_done, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&a_done, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&dose_ready, cudaEventDisableTiming));
    const int eh = NE / 2, threads = 256;
    const size_t half = (size_t)eh * NT * NX * NZ, per = (size_t)NT * NX * NZ;
    const unsigned gh = (unsigned)((half + threads - 1) / threads), gp = (unsigned)((per + threads - 1) / threads);
    int cur = 0;
    for (int s = 0; s < steps; s++) {
        QK_PROF_BEGIN("step");
        float *in = psi[cur], *out = psi[1 - cur];
        // groups [eh, NE) on stream a, [0, eh) on stream b: scatter into out, stream back into in
        QK_PROF_GPU_BEGIN("scatter", sa);
        scatter<<<gh, threads, 0, sa>>>(in, out, eh, NE, 0.3f);
        LAUNCHED();
        QK_PROF_GPU_END("scatter", sa);
        QK_PROF_GPU_BEGIN("scatter", sb);
        scatter<<<gh, threads, 0, sb>>>(in, out, 0, eh, 0.3f);
        LAUNCHED();
        QK_PROF_GPU_END("scatter", sb);
        QK_PROF_GPU_BEGIN("streaming", sa);
        stream_step<<<gh, threads, 0, sa>>>(out, in, eh, NE, 0.4f, 1.0f);
        LAUNCHED();
        QK_PROF_GPU_END("streaming", sa);
        QK_PROF_GPU_BEGIN("streaming", sb);
        stream_step<<<gh, threads, 0, sb>>>(out, in, 0, eh, 0.4f, 1.0f);
        LAUNCHED();
        QK_PROF_GPU_END("streaming", sb);
        CU(cudaEventRecord(b_done, sb));
        CU(cudaStreamWaitEvent(sa, b_done, 0));
        // the copy of the last dose must finish before energy loss adds to it again
        if (s > 0 && s % 10 == 0) CU(cudaStreamWaitEvent(sa, dose_ready, 0));
        QK_PROF_GPU_BEGIN("energy loss", sa);
        energy_loss<<<gp, threads, 0, sa>>>(in, out, dose, 0.05f);
        LAUNCHED();
        QK_PROF_GPU_END("energy loss", sa);
        CU(cudaEventRecord(a_done, sa));
        CU(cudaStreamWaitEvent(sb, a_done, 0)); // next step reads out on stream b too
        cur = 1 - cur;
        if (s % 10 == 9) {
            CU(cudaStreamWaitEvent(sc, a_done, 0));
            CU(QK_PROF_MEMCPY(h_dose, dose, dose_bytes, cudaMemcpyDeviceToHost, sc)); // pinned D2H
            CU(cudaEventRecord(dose_ready, sc));
            QK_PROF_COUNT("dose copies", 1);
        }
        QK_PROF_COUNT("steps", 1);
        QK_PROF_END("step");
    }
    QK_PROF_BEGIN("drain");
    CU(cudaDeviceSynchronize());
    QK_PROF_END("drain");
    QK_PROF_BEGIN("download");
    CU(QK_PROF_MEMCPY(h_psi, psi[cur], bytes, cudaMemcpyDeviceToHost, sa)); // pageable D2H
    CU(QK_PROF_MEMCPY(h_dose, dose, dose_bytes, cudaMemcpyDeviceToHost, sa));
    CU(cudaStreamSynchronize(sa));
    QK_PROF_END("download");
    QK_PROF_MEM_SNAPSHOT("end");
    {
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) QK_PROF_MEMPOOL("default pool", pool);
    }

    double total = 0, dsum = 0, dmax = 0;
    int bad = 0;
    for (size_t i = 0; i < cells; i++) { if (!isfinite(h_psi[i])) bad++; total += h_psi[i]; }
    for (int i = 0; i < NX * NZ; i++) { if (!isfinite(h_dose[i])) bad++; dsum += h_dose[i]; if (h_dose[i] > dmax) dmax = h_dose[i]; }
    printf("transport_loop: %d steps, flux in grid %.4g, dose total %.4g (max %.4g)%s\n", steps, total, dsum, dmax,
           bad ? ", NON-FINITE VALUES" : "");

    int rc = 0;
    rc |= QK_PROF_REPORT(report);
    rc |= QK_PROF_WRITE_TRACE(trace);
    rc |= QK_PROF_WRITE_HTML(html);
    if (rc) fprintf(stderr, "transport_loop: %s\n", qk_prof_last_error());
    else printf("wrote %s, %s\n", trace, html);

    QK_PROF_UNTRACK(psi[0]); QK_PROF_UNTRACK(psi[1]); QK_PROF_UNTRACK(dose); QK_PROF_UNTRACK(h_dose); QK_PROF_UNTRACK(h_psi);
    cudaFree(psi[0]); cudaFree(psi[1]); cudaFree(dose); cudaFreeHost(h_dose); free(h_psi);
    cudaEventDestroy(b_done); cudaEventDestroy(a_done); cudaEventDestroy(dose_ready);
    cudaStreamDestroy(sa); cudaStreamDestroy(sb); cudaStreamDestroy(sc);
    QK_PROF_SHUTDOWN();
    return (rc || bad || !(dsum > 0)) ? 1 : 0;
}
