/* store_pattern_probe.cu: design probe for the 4-qubit Gram (issue 26 item 3). Not part of the
   library. How fast can a kernel write K (n x n float32, K(X,X): both halves) in the store patterns
   of the few-qubit kernels, with no loads and no products? Each candidate writes values made from
   its indices; the time is against a cudaMemset of the same K (the write floor of
   docs/benchmarks.md) and a linear streaming writer. Sets (docs/benchmarks.md, "The 4-qubit Gram:
   what the write of both halves allows", runs 83-85 and 87):
     walk   qk__k_gram_stw's old walk (every tile of a patch-ordered square, those under the
            diagonal skipped): blocks an SM, store kinds, patch sizes, the halves alone
     shape  the same walk with the store instructions' shapes exchanged (8 rows x 64 bytes or
            4 rows x 128 bytes an instruction, for the tile and for its mirror)
     list   the triangle's tiles from a list made on the host (no tile without work), in 8 orders
   A final check fills K with NaN and counts the entries each tile + mirror pattern leaves unwritten.
   Build: nvcc -O3 -arch=sm_90 -std=c++17 -o store_pattern_probe bench/store_pattern_probe.cu
   Run: ./store_pattern_probe [n (32768)] [walk,shape,list (all)] */
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <string>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

template <bool CS>
__device__ __forceinline__ void st4(float *p, float4 v) { if (CS) __stcs((float4 *)p, v); else *(float4 *)p = v; }

template <bool CS>
__global__ void k_lin(float *out, long long n4)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        const float f = (float)(i & 1023);
        st4<CS>(out + 4 * i, make_float4(f, f + 1, f + 2, f + 3));
    }
}

// qk__k_gram_stw's old walk: tile L of a square of T x T tiles in patches of PATCH x PATCH (row by
// row inside a patch), this warp's 32 x 32 quarter of it; false past K's edge
template <int PATCH>
__device__ __forceinline__ bool patch_quarter(int L, int T, int warp, int &row0, int &col0)
{
    const int PX = (T + PATCH - 1) / PATCH, pt = L / (PATCH * PATCH), in = L % (PATCH * PATCH);
    const int a = (pt / PX) * PATCH + in / PATCH, b = (pt % PX) * PATCH + in % PATCH;
    row0 = 64 * a + 32 * (warp >> 1);
    col0 = 64 * b + 32 * (warp & 1);
    return a < T && b < T;
}

// MODE 0: triangle tiles, row stores + mirror stores (qk__k_gram_stw's pattern: its store
// addressing, copied on purpose)
// MODE 1: every tile, row stores only (the full square, no mirror)
// MODE 2: triangle tiles, row stores only (half of K)
// MODE 3: triangle tiles, mirror stores only
template <int MODE, bool CS, int PATCH>
__global__ void __launch_bounds__(128) k_stw(float *out, int n, int salt)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int T = n / 64, PX = (T + PATCH - 1) / PATCH, total = PX * PX * PATCH * PATCH;
    for (int L = blockIdx.x; L < total; L += gridDim.x) {
        int row0, col0;
        if (!patch_quarter<PATCH>(L, T, warp, row0, col0) || (MODE != 1 && col0 + 31 < row0)) continue;
        float kv[4][2][4];
#pragma unroll
        for (int x = 0; x < 4; ++x)
#pragma unroll
            for (int v = 0; v < 2; ++v)
#pragma unroll
                for (int y = 0; y < 4; ++y) kv[x][v][y] = (float)((row0 + x) ^ (col0 + y + 16 * v + salt)) * 1e-6f;
        if (MODE != 3)
#pragma unroll
            for (int x = 0; x < 4; ++x)
#pragma unroll
                for (int v = 0; v < 2; ++v)
                    st4<CS>(out + (long long)(row0 + 4 * g + x) * n + col0 + 16 * v + 4 * t,
                            make_float4(kv[x][v][0], kv[x][v][1], kv[x][v][2], kv[x][v][3]));
        if (MODE == 0 || MODE == 3)
#pragma unroll
            for (int v = 0; v < 2; ++v)
#pragma unroll
                for (int y = 0; y < 4; ++y)
                    st4<CS>(out + (long long)(col0 + 16 * v + 4 * t + y) * n + row0 + 4 * g,
                            make_float4(kv[0][v][y], kv[1][v][y], kv[2][v][y], kv[3][v][y]));
    }
}


// A warp's 32 x 32 region of K at (R0, C0), 8 store instructions of float4 a lane:
// SH = 0: 8 rows x 64 bytes an instruction (half lines: qk__k_gram_stw's row stores)
// SH = 1: 4 rows x 128 bytes an instruction (whole lines: its mirror stores)
template <int SH, bool CS>
__device__ __forceinline__ void region(float *out, int n, int R0, int C0, int lane, float base)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int it = 0; it < 8; ++it) {
        const int r = SH ? R0 + 4 * it + (lane >> 3) : R0 + 4 * g + (it >> 1);
        const int c = SH ? C0 + 4 * (lane & 7) : C0 + 16 * (it & 1) + 4 * t;
        const float f = base + it;
        st4<CS>(out + (long long)r * n + c, make_float4(f, f + 1, f + 2, f + 3));
    }
}

// WHAT: 0 tile + mirror, 1 tile only, 2 mirror only; RS / MS the shapes of the tile's and the
// mirror's stores; PATCH the patch order; triangle tiles only
template <int WHAT, int RS, int MS, int PATCH>
__global__ void __launch_bounds__(128) k_shape(float *out, int n, int salt)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int T = n / 64, PX = (T + PATCH - 1) / PATCH, total = PX * PX * PATCH * PATCH;
    for (int L = blockIdx.x; L < total; L += gridDim.x) {
        int row0, col0;
        if (!patch_quarter<PATCH>(L, T, warp, row0, col0) || col0 + 31 < row0) continue;
        const float base = (float)((row0 ^ col0) + salt + lane) * 1e-6f;
        if (WHAT != 2) region<RS, true>(out, n, row0, col0, lane, base);
        if (WHAT != 1) region<MS, true>(out, n, col0, row0, lane, base);
    }
}


// tiles from a list (host-made order): WHAT 0 tile + mirror (rows H, mirror F), 1 tile only
template <int WHAT>
__global__ void __launch_bounds__(128) k_list(float *out, int n, const int2 *tiles, int nt, int salt)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int L = blockIdx.x; L < nt; L += gridDim.x) {
        const int2 ab = tiles[L];
        const int row0 = 64 * ab.x + 32 * (warp >> 1), col0 = 64 * ab.y + 32 * (warp & 1);
        if (col0 + 31 < row0) continue; /* the lower quarter of a diagonal tile */
        const float base = (float)((row0 ^ col0) + salt + lane) * 1e-6f;
        region<0, true>(out, n, row0, col0, lane, base);
        if (WHAT == 0) region<1, true>(out, n, col0, row0, lane, base);
    }
}
static std::vector<int2> order(int T, int kind, int P)
{
    std::vector<int2> v;
    if (kind == 0) { /* patches of P x P in row-major patch order, rows inside a patch; a <= b only */
        for (int pa = 0; pa < (T + P - 1) / P; ++pa)
            for (int pb = pa; pb < (T + P - 1) / P; ++pb)
                for (int i = 0; i < P; ++i)
                    for (int j = 0; j < P; ++j) {
                        const int a = pa * P + i, b = pb * P + j;
                        if (a < T && b < T && a <= b) v.push_back(make_int2(a, b));
                    }
    } else if (kind == 1) { /* Morton order of the square, a <= b kept */
        for (int z = 0; z < T * T; ++z) {
            int a = 0, b = 0;
            for (int k = 0; k < 16; ++k) { b |= ((z >> (2 * k)) & 1) << k; a |= ((z >> (2 * k + 1)) & 1) << k; }
            if (a < T && b < T && a <= b) v.push_back(make_int2(a, b));
        }
    } else if (kind == 2) { /* the whole square, patch order (for comparison: every tile, row stores only) */
        for (int pa = 0; pa < (T + P - 1) / P; ++pa)
            for (int pb = 0; pb < (T + P - 1) / P; ++pb)
                for (int i = 0; i < P; ++i)
                    for (int j = 0; j < P; ++j) v.push_back(make_int2(pa * P + i, pb * P + j));
    } else { /* pairs: patch (pa, pb) and then its mirror patch's row (interleaved columns of patches) */
        for (int pb = 0; pb < (T + P - 1) / P; ++pb)
            for (int pa = 0; pa <= pb; ++pa)
                for (int i = 0; i < P; ++i)
                    for (int j = 0; j < P; ++j) {
                        const int a = pa * P + i, b = pb * P + j;
                        if (a < T && b < T && a <= b) v.push_back(make_int2(a, b));
                    }
    }
    return v;
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 32768, reps = 7;
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    const int sms = p.multiProcessorCount;
    float *K;
    const size_t bytes = (size_t)n * n * 4;
    CK(cudaMalloc(&K, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("device %s, %d SMs, n = %d, K %.2f GB\n", p.name, sms, n, bytes / 1e9);
    auto time = [&](const char *name, auto launch) {
        launch();
        CK(cudaDeviceSynchronize());
        std::vector<float> ms;
        for (int r = 0; r < reps; ++r) {
            CK(cudaEventRecord(e0));
            launch();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float x;
            CK(cudaEventElapsedTime(&x, e0, e1));
            ms.push_back(x);
        }
        CK(cudaGetLastError());
        std::sort(ms.begin(), ms.end());
        printf("%-48s min %.3f  med %.3f  max %.3f ms  (%.0f Gpairs/s at the median)\n", name, ms[0], ms[reps / 2], ms[reps - 1],
               (double)n * n / (ms[reps / 2] * 1e-3) / 1e9);
    };
    const std::string sets = "," + std::string(argc > 2 ? argv[2] : "walk,shape,list") + ",";
    auto has = [&](const char *x) { return sets.find(std::string(",") + x + ",") != std::string::npos; };
    const long long n4 = (long long)n * n / 4;
    const int T = n / 64;
    int2 *dl[8];
    int nl[8];
    const char *lname[8] = {"patch 16 triangle", "patch 4 triangle", "Morton triangle", "square patch 16 (skips under the diagonal)", "column-of-patches 16",
                            "patch 64 triangle", "rows (patch = 1 row of tiles)", "patch 2 triangle"};
    const int kinds[8] = {0, 0, 1, 2, 3, 0, 0, 0}, Ps[8] = {16, 4, 0, 16, 16, 64, 1, 2};
    for (int k = 0; k < 8; ++k) {
        std::vector<int2> v = order(T, kinds[k], Ps[k]);
        if (k == 6) { v.clear(); for (int a = 0; a < T; ++a) for (int b = a; b < T; ++b) v.push_back(make_int2(a, b)); }
        nl[k] = (int)v.size();
        CK(cudaMalloc(&dl[k], v.size() * sizeof(int2)));
        CK(cudaMemcpy(dl[k], v.data(), v.size() * sizeof(int2), cudaMemcpyHostToDevice));
    }
    for (int round = 0; round < 2; ++round) {
        printf("-- round %d\n", round + 1);
        time("memset", [&] { CK(cudaMemsetAsync(K, 0, bytes)); });
        time("linear float4, st.cs, 8 x SMs x 256", [&] { k_lin<true><<<8 * sms, 256>>>(K, n4); });
        if (has("walk")) {
            time("linear float4, plain st, 8 x SMs x 256", [&] { k_lin<false><<<8 * sms, 256>>>(K, n4); });
            for (int per : {1, 2, 3, 4, 8, 16}) {
                char nm[96];
                snprintf(nm, sizeof nm, "stw tile+mirror, st.cs, patch 16, %d blocks/SM", per);
                time(nm, [&] { k_stw<0, true, 16><<<per * sms, 128>>>(K, n, round); });
            }
            time("stw tile+mirror, plain st, patch 16, 3 blocks/SM", [&] { k_stw<0, false, 16><<<3 * sms, 128>>>(K, n, round); });
            time("stw tile+mirror, st.cs, patch 4, 3 blocks/SM", [&] { k_stw<0, true, 4><<<3 * sms, 128>>>(K, n, round); });
            time("stw tile+mirror, st.cs, patch 64, 3 blocks/SM", [&] { k_stw<0, true, 64><<<3 * sms, 128>>>(K, n, round); });
            time("square, row stores only, st.cs, 3 blocks/SM", [&] { k_stw<1, true, 16><<<3 * sms, 128>>>(K, n, round); });
            time("triangle, row stores only (half K), 3 blocks/SM", [&] { k_stw<2, true, 16><<<3 * sms, 128>>>(K, n, round); });
            time("triangle, mirror stores only (half K), 3 blocks/SM", [&] { k_stw<3, true, 16><<<3 * sms, 128>>>(K, n, round); });
        }
        if (has("shape")) {
            time("shape: tile+mirror, rows H, mirror F (= stw)", [&] { k_shape<0, 0, 1, 16><<<3 * sms, 128>>>(K, n, round); });
            time("shape: tile+mirror, rows F, mirror F", [&] { k_shape<0, 1, 1, 16><<<3 * sms, 128>>>(K, n, round); });
            time("shape: tile+mirror, rows H, mirror H", [&] { k_shape<0, 0, 0, 16><<<3 * sms, 128>>>(K, n, round); });
            time("shape: tile+mirror, rows F, mirror H", [&] { k_shape<0, 1, 0, 16><<<3 * sms, 128>>>(K, n, round); });
            time("shape: tile only, H (half K)", [&] { k_shape<1, 0, 0, 16><<<3 * sms, 128>>>(K, n, round); });
            time("shape: tile only, F (half K)", [&] { k_shape<1, 1, 0, 16><<<3 * sms, 128>>>(K, n, round); });
            time("shape: mirror only, F (half K)", [&] { k_shape<2, 0, 1, 16><<<3 * sms, 128>>>(K, n, round); });
            time("shape: mirror only, H (half K)", [&] { k_shape<2, 0, 0, 16><<<3 * sms, 128>>>(K, n, round); });
            time("shape: tile+mirror, H / F, patch 2", [&] { k_shape<0, 0, 1, 2><<<3 * sms, 128>>>(K, n, round); });
            time("shape: tile+mirror, H / F, patch 8", [&] { k_shape<0, 0, 1, 8><<<3 * sms, 128>>>(K, n, round); });
            time("shape: tile only then mirror only (two launches)", [&] {
                k_shape<1, 0, 0, 16><<<3 * sms, 128>>>(K, n, round);
                k_shape<2, 0, 1, 16><<<3 * sms, 128>>>(K, n, round);
            });
        }
        if (has("list"))
            for (int k = 0; k < 8; ++k) {
                char nm[96];
                snprintf(nm, sizeof nm, "list %s: tile only", lname[k]);
                time(nm, [&] { k_list<1><<<3 * sms, 128>>>(K, n, dl[k], nl[k], round); });
                if (k == 3) continue; /* the square's list: its tiles under the diagonal skip (tile only is the triangle) */
                snprintf(nm, sizeof nm, "list %s: tile+mirror", lname[k]);
                time(nm, [&] { k_list<0><<<3 * sms, 128>>>(K, n, dl[k], nl[k], round); });
            }
    }
    // check: each tile+mirror pattern writes every entry (fill with NaN first, count NaN after)
    std::vector<float> h((size_t)n * n);
    for (int v = 0; v < 4; ++v) {
        CK(cudaMemset(K, 0xFF, bytes));
        if (v == 0) k_stw<0, true, 16><<<3 * sms, 128>>>(K, n, 0);
        if (v == 1) k_shape<0, 1, 1, 16><<<3 * sms, 128>>>(K, n, 0);
        if (v == 2) k_shape<0, 0, 0, 16><<<3 * sms, 128>>>(K, n, 0);
        if (v == 3) k_list<0><<<3 * sms, 128>>>(K, n, dl[2], nl[2], 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), K, bytes, cudaMemcpyDeviceToHost));
        size_t nan = 0;
        for (float x : h) nan += x != x;
        printf("check %d: %zu of %zu entries unwritten\n", v, nan, h.size());
    }
    return 0;
}
