/* Link test: QK_STATIC (qk.h's functions private to this translation unit) with the CUDA engine
   (QK_CUDA=1 where Meson built qk_cuda.cu): the engine's entry points are declared QK_CUDA_DEF,
   always extern, so they resolve against libqk_cuda. Taking every entry point's address makes
   the linker resolve each one; no GPU is needed (a K(X,X) on device AUTO runs on the CPU engine
   where none is present, on the GPU otherwise, and is checked against the CPU engine). */
#define QK_STATIC
#define QK_IMPLEMENTATION
#include "qk.h"
#include <math.h>
#include <stdio.h>

#if defined(QK_CUDA) && QK_CUDA
typedef void (*qk_test_fn)(void);
static const qk_test_fn engine[] = {
    (qk_test_fn)qk_cuda_device_count,     (qk_test_fn)qk_cuda_device_query,     (qk_test_fn)qk_cuda_gram,
    (qk_test_fn)qk_cuda_host_alloc,       (qk_test_fn)qk_cuda_host_free,        (qk_test_fn)qk_cuda_host_pinned,
    (qk_test_fn)qk_cuda_states,           (qk_test_fn)qk_cuda_amplitude_encode, (qk_test_fn)qk_cuda_tune_gram};
/* the product engine has no test seams (qk_cuda_test_*: QK_TEST_FAULTS builds only) */
#endif

static double gram_of(qk_device device, const qk_map *m, const double *x, int n, double *k)
{
    qk_ctx_desc cd = {0};
    qk_ctx *ctx = NULL;
    qk_gram_desc gd = {0};
    cd.device = device;
    if (qk_ctx_create(&cd, &ctx) != QK_OK) return -1;
    gd.x = x;
    gd.n_x = n;
    gd.out = k;
    gd.out_dtype = QK_F64;
    qk_result r = qk_gram(ctx, m, &gd);
    qk_ctx_destroy(ctx);
    return r == QK_OK ? 0 : -1;
}

int main(void)
{
    enum { N = 13 };
    qk_map *m = NULL;
    double x[N * 3], ka[N * N], kc[N * N];
    unsigned s = 12345u;
    int i, bad = 0;
#if defined(QK_CUDA) && QK_CUDA
    for (i = 0; i < (int)(sizeof engine / sizeof engine[0]); ++i) bad += engine[i] == NULL;
#endif
    for (i = 0; i < N * 3; ++i) {
        s = s * 1664525u + 1013904223u;
        x[i] = (double)(s >> 8) / 16777216.0 * 3.0;
    }
    if (qk_map_parse("zz(reps=2)", 3, &m) != QK_OK) {
        printf("parse: %s\n", qk_last_error());
        return 1;
    }
    if (gram_of(QK_DEVICE_AUTO, m, x, N, ka) != 0 || gram_of(QK_DEVICE_CPU, m, x, N, kc) != 0) {
        printf("qk_gram: %s\n", qk_last_error());
        qk_map_free(m);
        return 1;
    }
    for (i = 0; i < N * N; ++i) bad += !(fabs(ka[i] - kc[i]) <= 1e-5 + 1e-5 * fabs(kc[i])) || !(kc[i] > 0 || i % (N + 1));
    qk_map_free(m);
#if defined(QK_CUDA) && QK_CUDA
    printf("QK_STATIC + QK_CUDA=1 (%d engine entry points linked): %s\n", (int)(sizeof engine / sizeof engine[0]),
           bad ? "FAIL" : "ok");
#else
    printf("QK_STATIC: %s\n", bad ? "FAIL" : "ok");
#endif
    return bad ? 1 : 0;
}
