/* A GPU simulator that embeds qk: its own CUDA kernels, gates and noise, qk's Gram of its states.

   The circuit is sim_states.c's, simulated on the device for a batch of samples at once:
   data-dependent arbitrary one-qubit unitaries U(x) = RZ(x_k (l + 1)) RY(a) RZ(b) on every qubit,
   a controlled-U (an arbitrary 2x2 block) on neighbouring qubits, and depolarising noise as
   quantum trajectories (after each layer, with probability p per qubit, a random Pauli, drawn on
   the host from a generator seeded by the sample's index, so a row asked for twice comes out the
   same). One thread updates one amplitude pair of one sample's statevector per gate.

   qk takes the states two ways, and the program checks that they give the same K:
     1. device states: all n statevectors simulated into one device array, handed to
        qk_gram_states with on_device = 1 (read in place, never copied);
     2. the state provider: qk asks for rows [i0, i1) when its plan needs them; the provider
        simulates them on the device and copies them into qk's host buffer (a simulator that
        cannot hold every state on the GPU at once).
   K is then checked against |<a|b>|^2 of the device states copied back, on 64 random pairs and
   the diagonal (unit norms: the gates are unitary).

     sim_states_gpu [n] [qubits]      (defaults: 2000 12); exit 77 without a CUDA device

   docs/vendoring.md, "Inside a simulator"; docs/states.md. */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                         \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); exit(1); } \
    } while (0)

struct sim {
    int q, layers, n_features;
    double p_noise;
    const double *dx;       /* n x n_features data, on the device */
    const double *x;        /* the same on the host (the noise draws) */
    int64_t rows_made;      /* states simulated (the provider counts rows) */
    double2 *work;          /* device scratch for the provider's rows */
    int64_t work_rows;
};

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unif(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* U = RZ(g) RY(a) RZ(b) as a 2x2 complex matrix m[row][col] */
__device__ static void u3(double g, double a, double b, double2 m[4])
{
    const double c = cos(a / 2), s = sin(a / 2), p = (g + b) / 2, d = (g - b) / 2;
    m[0] = make_double2(c * cos(p), -c * sin(p));
    m[1] = make_double2(-s * cos(d), -s * sin(d));
    m[2] = make_double2(s * cos(d), -s * sin(d));
    m[3] = make_double2(c * cos(p), c * sin(p));
}
__device__ static double2 cmul(double2 a, double2 b) { return make_double2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }
__device__ static double2 cadd(double2 a, double2 b) { return make_double2(a.x + b.x, a.y + b.y); }

/* |0...0> for n samples of D amplitudes */
__global__ void k_zero(double2 *psi, int64_t n, int64_t D)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n * D) psi[t] = make_double2(t % D == 0 ? 1.0 : 0.0, 0.0);
}

/* kind 0: U(x) of layer l on qubit k; kind 1: the controlled-U on (control k, target k + 1);
   kind 2: the Pauli pauli[i] (0 none, 1 X, 2 Y, 3 Z) on qubit k. One thread per pair of
   amplitudes (i, i | bit) of one sample; samples r0 .. r0 + n of the data. */
__global__ void k_gate(double2 *psi, int64_t n, int q, const double *x, int nf, int64_t r0, int kind, int l, int k,
                       const unsigned char *pauli)
{
    const int64_t D = (int64_t)1 << q, half = D / 2, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * half) return;
    const int64_t s = t / half, j = t % half;
    const int tq = kind == 1 ? k + 1 : k;
    const int64_t bit = (int64_t)1 << tq, i0 = ((j >> tq) << (tq + 1)) | (j & (bit - 1)), i1 = i0 | bit;
    const double *xs = x + (r0 + s) * nf;
    double2 m[4];
    if (kind == 0) u3(xs[k % nf] * (l + 1), 0.7 + 0.3 * k, 1.1 * l + 0.2, m);
    else if (kind == 1) {
        if (!(i0 & ((int64_t)1 << k))) return;   /* the control is 0: identity */
        u3(0.5 * xs[(k + l) % nf], 0.9, -0.4 * k, m);
    } else {
        const int p = pauli[s];
        if (p == 0) return;
        const double2 z = make_double2(0, 0), one = make_double2(1, 0);
        if (p == 1) { m[0] = z; m[1] = one; m[2] = one; m[3] = z; }
        else if (p == 2) { m[0] = z; m[1] = make_double2(0, -1); m[2] = make_double2(0, 1); m[3] = z; }
        else { m[0] = one; m[1] = z; m[2] = z; m[3] = make_double2(-1, 0); }
    }
    double2 *v = psi + s * D;
    const double2 a = v[i0], b = v[i1];
    v[i0] = cadd(cmul(m[0], a), cmul(m[1], b));
    v[i1] = cadd(cmul(m[2], a), cmul(m[3], b));
}

/* the states of samples [r0, r0 + n) into psi (device, n x 2^q) */
static void simulate(const sim *S, int64_t r0, int64_t n, double2 *psi)
{
    const int64_t D = (int64_t)1 << S->q;
    const int threads = 256;
    const unsigned blocks_all = (unsigned)((n * D + threads - 1) / threads), blocks_half = (unsigned)((n * D / 2 + threads - 1) / threads);
    /* the noise draws of every sample, layer and qubit, in sim_states.c's order */
    unsigned char *h_pauli = (unsigned char *)malloc((size_t)(n * S->layers * S->q)), *d_pauli = NULL;
    if (!h_pauli) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (int64_t s = 0; s < n; s++) {
        uint64_t seed = 0x5eed0000ull + (uint64_t)(r0 + s);
        for (int l = 0; l < S->layers; l++)
            for (int k = 0; k < S->q; k++) {
                unsigned char p = 0;
                if (rng_unif(&seed) < S->p_noise) {
                    const double r = rng_unif(&seed);
                    p = r < 1.0 / 3 ? 1 : r < 2.0 / 3 ? 2 : 3;
                }
                h_pauli[((size_t)l * S->q + k) * n + s] = p;
            }
    }
    CK(cudaMalloc((void **)&d_pauli, (size_t)(n * S->layers * S->q)));
    CK(cudaMemcpy(d_pauli, h_pauli, (size_t)(n * S->layers * S->q), cudaMemcpyHostToDevice));
    k_zero<<<blocks_all, threads>>>(psi, n, D);
    for (int l = 0; l < S->layers; l++) {
        for (int k = 0; k < S->q; k++) k_gate<<<blocks_half, threads>>>(psi, n, S->q, S->dx, S->n_features, r0, 0, l, k, NULL);
        for (int k = 0; k + 1 < S->q; k++) k_gate<<<blocks_half, threads>>>(psi, n, S->q, S->dx, S->n_features, r0, 1, l, k, NULL);
        for (int k = 0; k < S->q; k++)
            k_gate<<<blocks_half, threads>>>(psi, n, S->q, S->dx, S->n_features, r0, 2, l, k, d_pauli + ((size_t)l * S->q + k) * n);
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaFree(d_pauli));
    free(h_pauli);
}

/* qk's provider: the states of rows [i0, i1), simulated on the device, into qk's host buffer
   (ld complex values apart) */
static int provide(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user)
{
    sim *S = (sim *)user;
    const int64_t D = (int64_t)1 << S->q;
    (void)side;   /* K(X,X): side 0 only */
    for (int64_t c = i0; c < i1; c += S->work_rows) {
        const int64_t k = i1 - c < S->work_rows ? i1 - c : S->work_rows;
        simulate(S, c, k, S->work);
        if (cudaMemcpy2D((double2 *)buf + (c - i0) * ld, (size_t)ld * sizeof(double2), S->work, (size_t)D * sizeof(double2),
                         (size_t)D * sizeof(double2), (size_t)k, cudaMemcpyDeviceToHost) != cudaSuccess)
            return 1;
    }
    S->rows_made += i1 - i0;
    return 0;
}

int main(int argc, char **argv)
{
    const int64_t n = argc > 1 ? atoll(argv[1]) : 2000;
    const int q = argc > 2 ? atoi(argv[2]) : 12;
    int n_dev = 0;
    if (n < 2 || q < 2 || q > 24) { fprintf(stderr, "usage: sim_states_gpu [n >= 2] [qubits 2..24]\n"); return 2; }
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) { printf("no CUDA device: skipped\n"); return 77; }
    const int64_t D = (int64_t)1 << q;
    sim S;
    memset(&S, 0, sizeof S);
    S.q = q; S.layers = 3; S.n_features = 4; S.p_noise = 0.05;
    double *x = (double *)malloc(sizeof(double) * (size_t)(n * S.n_features)), *dx = NULL;
    double *K1 = (double *)malloc(sizeof(double) * (size_t)(n * n)), *K2 = (double *)malloc(sizeof(double) * (size_t)(n * n));
    double2 *states = NULL, *host = (double2 *)malloc(sizeof(double2) * (size_t)(n * D));
    uint64_t seed = 7;
    if (!x || !K1 || !K2 || !host) { fprintf(stderr, "out of memory\n"); return 1; }
    for (int64_t i = 0; i < n * S.n_features; i++) x[i] = 6.283185307179586 * rng_unif(&seed);
    CK(cudaMalloc((void **)&dx, sizeof(double) * (size_t)(n * S.n_features)));
    CK(cudaMemcpy(dx, x, sizeof(double) * (size_t)(n * S.n_features), cudaMemcpyHostToDevice));
    S.x = x;
    S.dx = dx;

    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CUDA;
    if (qk_ctx_create(&cd, &ctx) != QK_OK) { fprintf(stderr, "qk_ctx_create: %s\n", qk_last_error()); return 1; }
    qk_states_desc st;
    qk_gram_desc g;
    memset(&st, 0, sizeof st);
    memset(&g, 0, sizeof g);
    st.type = QK_STATE_C128;
    st.dim = D;
    st.n_a = n;
    g.out = K1;
    g.out_dtype = QK_F64;
    g.precision = QK_PRECISION_FP64;

    /* 1. every state on the device, read in place */
    CK(cudaMalloc((void **)&states, sizeof(double2) * (size_t)(n * D)));
    simulate(&S, 0, n, states);
    st.a = states;
    st.on_device = 1;
    double t0 = qk_cuda_wtime();
    if (qk_gram_states(ctx, &st, &g) != QK_OK) { fprintf(stderr, "qk_gram_states (device states): %s\n", qk_last_error()); return 1; }
    const double t_dev = qk_cuda_wtime() - t0;

    /* 2. the provider: rows simulated when qk's plan asks for them */
    S.work_rows = n < 256 ? n : 256;
    CK(cudaMalloc((void **)&S.work, sizeof(double2) * (size_t)(S.work_rows * D)));
    st.a = NULL;
    st.on_device = 0;
    st.provider = provide;
    st.provider_user = &S;
    g.out = K2;
    qk_plan plan;
    if (qk_plan_states(ctx, &st, &g, &plan) != QK_OK) { fprintf(stderr, "qk_plan_states: %s\n", qk_last_error()); return 1; }
    t0 = qk_cuda_wtime();
    if (qk_gram_states(ctx, &st, &g) != QK_OK) { fprintf(stderr, "qk_gram_states (provider): %s\n", qk_last_error()); return 1; }
    const double t_prov = qk_cuda_wtime() - t0;

    /* the checks: the two K alike; K against |<a|b>|^2 of the states themselves */
    double worst12 = 0, worst = 0;
    int64_t bitwise = 0;
    for (int64_t i = 0; i < n * n; i++) {
        worst12 = fmax(worst12, fabs(K1[i] - K2[i]));
        bitwise += memcmp(&K1[i], &K2[i], sizeof(double)) == 0;
    }
    CK(cudaMemcpy(host, states, sizeof(double2) * (size_t)(n * D), cudaMemcpyDeviceToHost));
    for (int t = 0; t < 64 + (int)n; t++) {
        const int64_t i = t < (int)n ? t : (int64_t)(rng_unif(&seed) * n), j = t < (int)n ? t : (int64_t)(rng_unif(&seed) * n);
        double re = 0, im = 0;
        for (int64_t k = 0; k < D; k++) {
            const double2 a = host[i * D + k], b = host[j * D + k];
            re += a.x * b.x + a.y * b.y;
            im += a.x * b.y - a.y * b.x;
        }
        worst = fmax(worst, fabs(K1[i * n + j] - (re * re + im * im)));
    }
    printf("%lld samples, %d qubits, %d layers, noise p = %.2f, simulated on the GPU\n", (long long)n, q, S.layers, S.p_noise);
    printf("  device states, read in place: %.3f s for K (fp64; the context's first call: its streams, cuBLAS handle and buffers "
           "made here)\n", t_dev);
    printf("  the provider: %.3f s, plan %s (%s), %lld states simulated (%.2f per sample)\n", t_prov,
           plan.bulk_states ? "all states resident" : "state tiles", plan.config, (long long)S.rows_made, (double)S.rows_made / (double)n);
    printf("  the two K: max difference %.3g (%lld of %lld entries bit for bit); K against |<a|b>|^2 of the states on the diagonal and "
           "64 random pairs: %.3g\n", worst12, (long long)bitwise, (long long)(n * n), worst);
    const int ok = worst12 <= 1e-12 && worst <= 1e-12;
    printf("%s\n", ok ? "ok" : "FAILED");
    qk_ctx_destroy(ctx);
    cudaFree(states); cudaFree(S.work); cudaFree(dx);
    free(x); free(K1); free(K2); free(host);
    return ok ? 0 : 1;
}
