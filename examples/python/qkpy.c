/* qkpy — a small C shim over qk.h for Python's ctypes (examples/python/qk_sklearn.py).
   One flat function per job keeps the Python side free of struct layouts. */
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <string.h>

#if defined(_WIN32)
#define QKPY_EXPORT __declspec(dllexport)
#else
#define QKPY_EXPORT __attribute__((visibility("default")))
#endif

/* K(X,Y) (y == NULL: K(X,X)) into out (n_x x n_y doubles). device: 0 auto, 1 cpu, 2 cuda.
   Returns a qk_result; err receives the detail message. */
QKPY_EXPORT int qkpy_gram(const char *spec, const double *x, long long n_x, int n_features,
                          const double *y, long long n_y, const double *weights, int n_weights,
                          int device, double *out, char *err, size_t err_size)
{
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_map *map = NULL;
    qk_gram_desc g;
    qk_result r;
    memset(&cd, 0, sizeof cd);
    cd.device = (qk_device)device;
    r = qk_map_parse(spec, n_features, &map);
    if (r == QK_OK && weights) r = qk_map_set_weights(map, weights, n_weights);
    if (r == QK_OK) r = qk_ctx_create(&cd, &ctx);
    if (r == QK_OK) {
        memset(&g, 0, sizeof g);
        g.x = x; g.n_x = n_x; g.y = y; g.n_y = y ? n_y : 0; g.out = out; g.out_dtype = QK_F64;
        r = qk_gram(ctx, map, &g);
    }
    if (r != QK_OK && err && err_size) snprintf(err, err_size, "%s: %s", qk_result_string(r), qk_last_error());
    qk_ctx_destroy(ctx);
    qk_map_free(map);
    return (int)r;
}
