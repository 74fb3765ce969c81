/* A simulator that embeds qk: its own gate set and noise, qk's Gram of its states.

   The simulator here is deliberately not a qk feature map: data-dependent arbitrary one-qubit
   unitaries U(x) = RZ(x_k) RY(a) RZ(b) on every qubit, a controlled-U (an arbitrary 2x2 block) on
   neighbouring qubits, and depolarising noise as quantum trajectories (after each layer, with
   probability p per qubit, a random Pauli). Each sample's trajectory is seeded by its index, so a
   row asked for twice comes out the same.

   qk never sees the circuit: it asks for the states of rows [i0, i1) through the provider when
   its plan needs them (qk_states_desc.provider), so the simulator never holds all states, and
   qk's planner decides the state tiles from the host budget. The program then checks that K from
   the provider equals K from all states held at once, bit for bit, and prints the plan.

     sim_states [n] [qubits] [host_memory_MB]      (defaults: 400 10 0 = qk's own budget)

   docs/vendoring.md, "Inside a simulator"; docs/states.md. */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sim {
    int q, layers, n_features;
    double p_noise;
    const double *x;        /* n x n_features data */
    int64_t rows_made;      /* states simulated (provider calls count rows) */
} sim;

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unif(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* a 2x2 complex matrix m (row-major, interleaved) on qubit t of psi (2^q interleaved complex) */
static void apply1(double *psi, int q, int t, const double *m)
{
    const int64_t D = (int64_t)1 << q, bit = (int64_t)1 << t;
    int64_t i;
    for (i = 0; i < D; i++) {
        if (i & bit) continue;
        double *a = psi + 2 * i, *b = psi + 2 * (i | bit);
        double ar = a[0], ai = a[1], br = b[0], bi = b[1];
        a[0] = m[0] * ar - m[1] * ai + m[2] * br - m[3] * bi;
        a[1] = m[0] * ai + m[1] * ar + m[2] * bi + m[3] * br;
        b[0] = m[4] * ar - m[5] * ai + m[6] * br - m[7] * bi;
        b[1] = m[4] * ai + m[5] * ar + m[6] * bi + m[7] * br;
    }
}

/* m applied to target t where control c is 1 */
static void apply_cu(double *psi, int q, int c, int t, const double *m)
{
    const int64_t D = (int64_t)1 << q, bt = (int64_t)1 << t, bc = (int64_t)1 << c;
    int64_t i;
    for (i = 0; i < D; i++) {
        if ((i & bt) || !(i & bc)) continue;
        double *a = psi + 2 * i, *b = psi + 2 * (i | bt);
        double ar = a[0], ai = a[1], br = b[0], bi = b[1];
        a[0] = m[0] * ar - m[1] * ai + m[2] * br - m[3] * bi;
        a[1] = m[0] * ai + m[1] * ar + m[2] * bi + m[3] * br;
        b[0] = m[4] * ar - m[5] * ai + m[6] * br - m[7] * bi;
        b[1] = m[4] * ai + m[5] * ar + m[6] * bi + m[7] * br;
    }
}

/* U = RZ(g) RY(a) RZ(b), interleaved 2x2 */
static void u3(double g, double a, double b, double *m)
{
    const double c = cos(a / 2), s = sin(a / 2), p = (g + b) / 2, d = (g - b) / 2;
    m[0] = c * cos(p); m[1] = -c * sin(p);
    m[2] = -s * cos(d); m[3] = -s * sin(d);
    m[4] = s * cos(d); m[5] = -s * sin(d);
    m[6] = c * cos(p); m[7] = c * sin(p);
}

/* sample i's state (one noise trajectory, seeded by i) into psi */
static void simulate(const sim *s, int64_t i, double *psi)
{
    const int64_t D = (int64_t)1 << s->q;
    const double *x = s->x + i * s->n_features;
    uint64_t seed = 0x5eed0000ull + (uint64_t)i;
    double m[8];
    int l, k;
    memset(psi, 0, sizeof(double) * (size_t)(2 * D));
    psi[0] = 1.0;
    for (l = 0; l < s->layers; l++) {
        for (k = 0; k < s->q; k++) {
            u3(x[k % s->n_features] * (l + 1), 0.7 + 0.3 * k, 1.1 * l + 0.2, m);
            apply1(psi, s->q, k, m);
        }
        for (k = 0; k + 1 < s->q; k++) {
            u3(0.5 * x[(k + l) % s->n_features], 0.9, -0.4 * k, m);
            apply_cu(psi, s->q, k, k + 1, m);
        }
        for (k = 0; k < s->q; k++) {   /* depolarising: a random Pauli with probability p */
            static const double X[8] = {0, 0, 1, 0, 1, 0, 0, 0}, Y[8] = {0, 0, 0, -1, 0, 1, 0, 0}, Z[8] = {1, 0, 0, 0, 0, 0, -1, 0};
            if (rng_unif(&seed) < s->p_noise) {
                double r = rng_unif(&seed);
                apply1(psi, s->q, k, r < 1.0 / 3 ? X : r < 2.0 / 3 ? Y : Z);
            }
        }
    }
}

/* qk's provider: the states of rows [i0, i1) into qk's buffer (ld complex values apart) */
static int provide(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user)
{
    sim *s = (sim *)user;
    int64_t i;
    (void)side;   /* K(X,X): side 0 only */
    for (i = i0; i < i1; i++) simulate(s, i, (double *)buf + 2 * (i - i0) * ld);
    s->rows_made += i1 - i0;
    return 0;
}

int main(int argc, char **argv)
{
    const int64_t n = argc > 1 ? atoll(argv[1]) : 400;
    const int q = argc > 2 ? atoi(argv[2]) : 10;
    const double mb = argc > 3 ? atof(argv[3]) : 0;
    const int64_t D = (int64_t)1 << q;
    sim s = {q, 3, 4, 0.05, NULL, 0};
    double *x, *all, *K1, *K2;
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_states_desc st;
    qk_gram_desc g;
    qk_plan plan;
    qk_result r;
    int64_t i, diff = 0;
    uint64_t seed = 7;
    if (n < 1 || q < 1 || q > 20) { fprintf(stderr, "usage: sim_states [n >= 1] [qubits 1..20] [host_memory_MB]\n"); return 2; }
    x = (double *)malloc(sizeof(double) * (size_t)(n * s.n_features));
    all = (double *)malloc(sizeof(double) * (size_t)(2 * n * D));
    K1 = (double *)malloc(sizeof(double) * (size_t)(n * n));
    K2 = (double *)malloc(sizeof(double) * (size_t)(n * n));
    if (!x || !all || !K1 || !K2) { fprintf(stderr, "out of memory\n"); return 2; }
    for (i = 0; i < n * s.n_features; i++) x[i] = 6.283185307179586 * rng_unif(&seed);
    s.x = x;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.host_memory = (size_t)(mb * 1048576.0);
    if ((r = qk_ctx_create(&cd, &ctx)) != QK_OK) { fprintf(stderr, "qk_ctx_create: %s\n", qk_last_error()); return 1; }

    /* qk asks the simulator for rows as its plan needs them */
    memset(&st, 0, sizeof st);
    st.type = QK_STATE_C128;
    st.dim = D;
    st.n_a = n;
    st.provider = provide;
    st.provider_user = &s;
    memset(&g, 0, sizeof g);
    g.out = K1;
    g.out_dtype = QK_F64;
    if ((r = qk_plan_states(ctx, &st, &g, &plan)) != QK_OK) { fprintf(stderr, "qk_plan_states: %s\n", qk_last_error()); return 1; }
    if ((r = qk_gram_states(ctx, &st, &g)) != QK_OK) { fprintf(stderr, "qk_gram_states: %s\n", qk_last_error()); return 1; }
    printf("%lld samples, %d qubits, %d layers, noise p = %.2f: K from the provider, plan %s (%s), %lld states simulated "
           "(%.2f per sample)\n", (long long)n, q, s.layers, s.p_noise, plan.bulk_states ? "all states resident" : "state tiles",
           plan.config, (long long)s.rows_made, (double)s.rows_made / (double)n);
    if (!plan.bulk_states) printf("  state tiles of %lld rows: the host budget (%.3g MB) holds two\n", (long long)plan.state_tile, (double)plan.bytes_budget / 1048576.0);

    /* the same K from all states held at once */
    for (i = 0; i < n; i++) simulate(&s, i, all + 2 * i * D);
    st.provider = NULL;
    st.provider_user = NULL;
    st.a = all;
    g.out = K2;
    if ((r = qk_gram_states(ctx, &st, &g)) != QK_OK) { fprintf(stderr, "qk_gram_states: %s\n", qk_last_error()); return 1; }
    for (i = 0; i < n * n; i++) diff += memcmp(&K1[i], &K2[i], sizeof(double)) != 0;
    printf("K from all states held at once: %lld of %lld entries differ (bit for bit: %s); K[0][1] = %.6f, purity-free "
           "diagonal K[0][0] = %.15f\n", (long long)diff, (long long)(n * n), diff ? "NO" : "yes", n > 1 ? K1[1] : 0.0, K1[0]);
    qk_ctx_destroy(ctx);
    free(x); free(all); free(K1); free(K2);
    return diff ? 1 : 0;
}
