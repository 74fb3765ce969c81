/* gemm_algo_probe.cu: design probe for the cuBLAS tensor-core engines at 12 and 16 qubits (issue 26
   item 2). Not part of the library. qk's Gauss's form runs, per block of rows of the triangle, one
   cublasGemmEx (CUBLAS_GEMM_DEFAULT) per product on shapes of M = 512 or 1024 rows, N up to n
   columns and K up to 163840; this probe times each of those shapes with cublasGemmEx and with
   every algorithm cublasLt's heuristics return (up to 32, 32 MiB of workspace), and reports the
   sum over the trapezoid's blocks for the default and for the best algorithm of each shape. The
   best algorithm's C is compared with the default's (max |difference| / max |C|).
   Build: nvcc -O3 -arch=sm_90 -std=c++17 -o gemm_algo_probe gemm_algo_probe.cu -lcublas -lcublasLt
   Run: ./gemm_algo_probe */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
#define BK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { printf("cuBLAS %d at %d\n", (int)s_, __LINE__); exit(1); } } while (0)

__global__ void k_fill(__half *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        p[i] = __float2half(((h & 0xFFFF) / 65536.0f - 0.5f) * 0.01f);
    }
}

struct Shape { long long M, N, K, ld; bool acc; };

int main()
{
    cublasHandle_t h;
    cublasLtHandle_t lt;
    BK(cublasCreate(&h));
    BK(cublasLtCreate(&lt));
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("device %s\n", p.name);
    const size_t wsb = 32u << 20;
    void *ws;
    CK(cudaMalloc(&ws, wsb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct Case { const char *name; int q; long long n; bool x3; };
    const Case cases[] = {{"12 q fp16", 12, 16384, false}, {"12 q fp32x3", 12, 16384, true}, {"16 q fp16", 16, 4096, false}, {"16 q fp32x3", 16, 4096, true}};
    for (const Case &c : cases) {
        const long long D = 1ll << c.q, n = c.n, ld = c.x3 ? 4 * D : D;
        /* as qk__tc_gauss_products: blocks of rows from the diagonal, hi*hi in chunks */
        const long long bs = std::max<long long>(512, ((n + 15) / 16 + 255) / 256 * 256);
        const int nck = c.x3 ? (2 * D >= 2048 ? 2 : 1) : 1;
        const long long Dc = D / nck, K0 = c.x3 ? 2 * D + Dc : D;
        std::vector<Shape> sh;
        for (long long r0 = 0; r0 < n; r0 += bs) {
            const long long M = std::min(n, r0 + bs) - r0, N = n - r0;
            sh.push_back({M, N, K0, ld, false});
            for (int j = 1; j < nck; ++j) sh.push_back({M, N, Dc, ld, true});
        }
        __half *X;
        float *C, *C2;
        const size_t xe = (size_t)n * ld;
        CK(cudaMalloc(&X, xe * sizeof(__half)));
        CK(cudaMalloc(&C, (size_t)n * n * sizeof(float)));
        CK(cudaMalloc(&C2, (size_t)n * n * sizeof(float)));
        k_fill<<<1024, 256>>>(X, xe, 7u);
        CK(cudaDeviceSynchronize());
        const float al = 1.0f, b0 = 0.0f, b1 = 1.0f;
        double tdef = 0, tbest = 0, flops = 0, worst_diff = 0;
        int improved = 0;
        for (const Shape &s : sh) {
            const float *be = s.acc ? &b1 : &b0;
            auto gemm = [&] {
                BK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)s.N, (int)s.M, (int)s.K, &al, X, CUDA_R_16F, (int)s.ld, X, CUDA_R_16F,
                                (int)s.ld, be, C, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            };
            auto med = [&](auto f, int reps) {
                f();
                std::vector<float> t;
                for (int r = 0; r < reps; ++r) {
                    CK(cudaEventRecord(e0));
                    f();
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float x;
                    CK(cudaEventElapsedTime(&x, e0, e1));
                    t.push_back(x);
                }
                std::sort(t.begin(), t.end());
                return (double)t[reps / 2];
            };
            const double td = med(gemm, 5);
            /* cublasLt: the same product (A = X^T rows of the columns, B = X rows of the rows) */
            cublasLtMatmulDesc_t md;
            BK(cublasLtMatmulDescCreate(&md, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
            BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
            BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
            cublasLtMatrixLayout_t la, lb, lc;
            BK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, s.K, s.N, s.ld));
            BK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, s.K, s.M, s.ld));
            BK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.N, s.M, n));
            cublasLtMatmulPreference_t pr;
            BK(cublasLtMatmulPreferenceCreate(&pr));
            BK(cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
            cublasLtMatmulHeuristicResult_t res[32];
            int nres = 0;
            BK(cublasLtMatmulAlgoGetHeuristic(lt, md, la, lb, lc, lc, pr, 32, res, &nres));
            double tb = td;
            int bi = -1;
            for (int i = 0; i < nres; ++i) {
                if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
                auto run = [&] {
                    BK(cublasLtMatmul(lt, md, &al, X, la, X, lb, be, C2, lc, C2, lc, &res[i].algo, ws, wsb, 0));
                };
                const double t = med(run, 3);
                if (t < tb) { tb = t; bi = i; }
            }
            if (bi >= 0) {
                ++improved;
                /* the best algorithm's C against the default's (both with beta 0: C's first state does not matter) */
                const float *bz = &b0;
                BK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)s.N, (int)s.M, (int)s.K, &al, X, CUDA_R_16F, (int)s.ld, X, CUDA_R_16F,
                                (int)s.ld, bz, C, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                BK(cublasLtMatmul(lt, md, &al, X, la, X, lb, bz, C2, lc, C2, lc, &res[bi].algo, ws, wsb, 0));
                CK(cudaDeviceSynchronize());
                std::vector<float> a((size_t)s.M * n), b((size_t)s.M * n);
                CK(cudaMemcpy(a.data(), C, a.size() * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(b.data(), C2, b.size() * 4, cudaMemcpyDeviceToHost));
                double md_ = 0, mx = 0;
                for (long long r = 0; r < s.M; ++r)
                    for (long long j = 0; j < s.N; ++j) {
                        const size_t k = (size_t)r * n + j;
                        md_ = std::max(md_, (double)std::fabs(a[k] - b[k]));
                        mx = std::max(mx, (double)std::fabs(a[k]));
                    }
                worst_diff = std::max(worst_diff, mx > 0 ? md_ / mx : md_);
            }
            printf("  %-12s M %5lld N %6lld K %6lld%s: GemmEx %.3f ms (%.0f TFLOP/s), %d Lt algorithms, best %.3f ms%s\n", c.name, s.M, s.N,
                   s.K, s.acc ? " (beta 1)" : "", td, 2.0 * s.M * s.N * s.K / (td * 1e-3) / 1e12, nres, tb, bi >= 0 ? "" : " (the default)");
            tdef += td;
            tbest += tb;
            flops += 2.0 * s.M * s.N * s.K;
            cublasLtMatmulPreferenceDestroy(pr);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(md);
        }
        printf("%s, n = %lld: one product over the trapezoid: GemmEx %.3f ms (%.0f TFLOP/s), best of each shape %.3f ms (%.0f TFLOP/s), x%.3f; "
               "%d of %zu shapes faster off the default; their C against the default's: %.2e\n",
               c.name, n, tdef, flops / (tdef * 1e-3) / 1e12, tbest, flops / (tbest * 1e-3) / 1e12, tdef / tbest, improved, sh.size(), worst_diff);
        CK(cudaFree(X));
        CK(cudaFree(C));
        CK(cudaFree(C2));
    }
    return 0;
}
