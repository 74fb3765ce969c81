/* Compile-and-run test of qk.h's switches (the header's "Configuration macros"): built once per
   switch by tests/meson.build (-DQK_NO_THREADS, -DQK_NO_MPS, -DQK_NO_CSV, -DQK_NO_TUNE, all of
   them, none), -Wall -Wextra -Werror -Wpedantic, C99. Whatever is compiled out, the CPU engine
   still computes K: a 4-thread context's K of an entangling map, to a host buffer, through tiles
   (the callback lock) and streamed to a .npy (the writer thread and the syncer), equals
   |<psi_i|psi_j>|^2 from qk_states; what a switch removes answers QK_ERROR_UNSUPPORTED with a
   message naming the define, and where it is compiled in it works. The autotune cache is
   compiled in (QK_TUNE_CACHE) so that QK_NO_TUNE is what removes it. */
#define QK_TUNE_CACHE
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define N 24
#define Q 3

static double kt[N * N];
static int on_tile(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *tile, int64_t ld, void *user)
{
    const double *t = (const double *)tile;
    int64_t a, b;
    (void)user;
    for (a = 0; a < m; a++)
        for (b = 0; b < n; b++) kt[(i0 + a) * N + j0 + b] = t[a * ld + b];
    return 0;
}

static int names(const char *msg, const char *define) { return strstr(msg, define) != NULL; }

int main(void)
{
    static double x[N * Q], st[N * 16], ref[N * N], k[N * N];
    qk_map *m = NULL;
    qk_ctx *ctx = NULL;
    qk_ctx_desc cd;
    qk_gram_desc g;
    qk_array a;
    char path[64];
    int i, j, l;
    double err = 0;
    for (i = 0; i < N * Q; i++) x[i] = 0.05 + 0.13 * (double)((i * 7) % 23);
    memset(&cd, 0, sizeof cd);
    cd.n_threads = 4;
    cd.device = QK_DEVICE_CPU;
    CHECK(qk_map_parse("zz(reps=2)", Q, &m) == QK_OK, "%s", qk_last_error());
    CHECK(qk_ctx_create(&cd, &ctx) == QK_OK, "%s", qk_last_error());
    if (!m || !ctx) return 1;
    CHECK(qk_states(ctx, m, x, N, st) == QK_OK, "%s", qk_last_error());
    for (i = 0; i < N; i++)
        for (j = 0; j < N; j++) {
            double re = 0, im = 0;
            for (l = 0; l < 8; l++) {
                const double *u = st + 16 * i + 2 * l, *v = st + 16 * j + 2 * l;
                re += u[0] * v[0] + u[1] * v[1];
                im += u[0] * v[1] - u[1] * v[0];
            }
            ref[i * N + j] = re * re + im * im;
        }
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = N; g.out = k; g.out_dtype = QK_F64;
    CHECK(qk_gram(ctx, m, &g) == QK_OK, "%s", qk_last_error());
    for (i = 0; i < N * N; i++) err = fabs(k[i] - ref[i]) > err ? fabs(k[i] - ref[i]) : err;
    CHECK(err < 1e-12, "host K off by %g", err);
    g.out = NULL; g.output = QK_OUTPUT_CALLBACK; g.tile_fn = on_tile;
    CHECK(qk_gram(ctx, m, &g) == QK_OK, "%s", qk_last_error());
    CHECK(memcmp(kt, k, sizeof k) == 0, "tiles differ from the host K");
    snprintf(path, sizeof path, "compile_switches_%ld.npy", (long)getpid());
    g.output = QK_OUTPUT_NPY; g.out_path = path; g.tile_fn = NULL;
    CHECK(qk_gram(ctx, m, &g) == QK_OK, "%s", qk_last_error());
    memset(&a, 0, sizeof a);
    CHECK(qk_npy_read(path, &a) == QK_OK, "%s", qk_last_error());
    CHECK(a.data && a.rows == N && a.cols == N && memcmp(a.data, k, sizeof k) == 0, "the .npy differs from the host K");
    qk_array_free(&a);
    remove(path);

    /* the MPS path: forced, and the only path of a 40-qubit local map */
    g.output = QK_OUTPUT_HOST; g.out = kt; g.out_path = NULL; g.path = QK_PATH_MPS;
    {
        qk_map *wide = NULL;
        qk_device_info info;
        qk_result r = qk_gram(ctx, m, &g), rw;
        double w[N * 40];
        err = 0;
        for (i = 0; r == QK_OK && i < N * N; i++) err = fabs(kt[i] - ref[i]) > err ? fabs(kt[i] - ref[i]) : err;
        for (i = 0; i < N * 40; i++) w[i] = x[i % (N * Q)];
        CHECK(qk_map_parse("zz(reps=1,ent=linear)", 40, &wide) == QK_OK, "%s", qk_last_error());
        g.path = QK_PATH_DEFAULT; g.x = w; g.n_x = 4;
        rw = qk_gram(ctx, wide, &g);
        memset(&info, 0, sizeof info);
        info.present = 1; info.free_bytes = (size_t)1 << 34;
#ifdef QK_NO_MPS
        CHECK(r == QK_ERROR_UNSUPPORTED, "path MPS without the MPS engine: %d", (int)r);
        CHECK(rw == QK_ERROR_UNSUPPORTED && names(qk_last_error(), "QK_NO_MPS"), "40 qubits without MPS: %s", qk_last_error());
        CHECK(qk_max_samples_mps(&info, 0.85, wide, QK_PRECISION_FP32, 0) == 0, "qk_max_samples_mps without MPS");
#else
        CHECK(r == QK_OK && err < 1e-12, "path MPS: %s, K off by %g", qk_last_error(), err);
        CHECK(rw == QK_OK, "40 qubits on the MPS path: %s", qk_last_error());
        CHECK(qk_max_samples_mps(&info, 0.85, wide, QK_PRECISION_FP32, 0) > 0, "qk_max_samples_mps");
#endif
        qk_map_free(wide);
    }

    /* the CSV reader */
    {
        FILE *f;
        qk_result r;
        snprintf(path, sizeof path, "compile_switches_%ld.csv", (long)getpid());
        f = fopen(path, "w");
        if (f) { fputs("a,b\n1,2\n3,4\n", f); fclose(f); }
        memset(&a, 0, sizeof a);
        r = qk_csv_read(path, &a);
#ifdef QK_NO_CSV
        CHECK(r == QK_ERROR_UNSUPPORTED && names(qk_last_error(), "QK_NO_CSV"), "qk_csv_read without CSV: %s", qk_last_error());
#else
        CHECK(r == QK_OK && a.rows == 2 && a.cols == 2 && a.data[3] == 4.0, "qk_csv_read: %s", qk_last_error());
        qk_array_free(&a);
#endif
        remove(path);
    }

    /* the autotune cache */
    {
        qk_tune_key key;
        qk_tune_entry e;
        qk_result r;
        qk_tune_key_init(&key, "dev", 9, 0, 12080, NULL, QK_PATH_COMPLEX, QK_PRECISION_FP32, 8);
        snprintf(path, sizeof path, "compile_switches_%ld_none/autotune.json", (long)getpid());
        r = qk_tune_cache_lookup(path, &key, &e, NULL, NULL);
#ifdef QK_NO_TUNE
        CHECK(r == QK_ERROR_UNSUPPORTED && names(qk_last_error(), "QK_NO_TUNE"), "tune cache without the cache: %s", qk_last_error());
#else
        CHECK(r == QK_ERROR_IO, "tune cache: a missing file is a miss (got %d: %s)", (int)r, qk_last_error());
#endif
    }
    qk_ctx_destroy(ctx);
    qk_map_free(m);
    (void)names;
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
