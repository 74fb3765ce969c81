/* The consumer program of the packaging tests (tests/packaging: vendoring.py "alone",
   pkgconfig_install.py, cmake_install.py, and subproject.py's parent project, which builds it
   as use_qk): what a program that vendors or installs qk writes. K(X,X) of three samples on the
   default device; prints its 9 entries, then "cuda=C prof=P" (C: QK_CUDA_BUILD, what the build
   system says the program was built with, 0 where it says nothing; P: QK_PROF_ENABLED), and
   exits 1 unless K has a unit diagonal (1e-5: the GPU engine computes in fp32) and is symmetric
   with entries in (0, 1). Compiles as C99 and C++11 with -Wall -Wextra -Werror -Wpedantic. */
#define QK_IMPLEMENTATION
#include "qk.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#ifndef QK_CUDA_BUILD
#define QK_CUDA_BUILD 0
#endif

int main(void)
{
    static const double X[3 * 2] = {0.1, 0.2, 0.3, -0.4, 1.1, 0.7};
    double K[9];
    qk_ctx *ctx = NULL;
    qk_map *map = NULL;
    qk_ctx_desc cd;
    qk_gram_desc g;
    int i, j, ok = 1;
    memset(&cd, 0, sizeof cd);
    memset(&g, 0, sizeof g);
    if (qk_ctx_create(&cd, &ctx) != QK_OK || qk_map_parse("zz(reps=2)", 2, &map) != QK_OK) {
        printf("setup: %s\n", qk_last_error());
        return 1;
    }
    g.x = X; g.n_x = 3; g.out = K; g.out_dtype = QK_F64; /* the GPU engine's default is float32 */
    if (qk_gram(ctx, map, &g) != QK_OK) { printf("qk_gram: %s\n", qk_last_error()); return 1; }
    for (i = 0; i < 9; i++) printf("%.17g ", K[i]);
    printf("cuda=%d prof=%d\n", (int)QK_CUDA_BUILD, (int)QK_PROF_ENABLED);
    for (i = 0; i < 3; i++)
        for (j = 0; j < 3; j++)
            if (i == j ? !(fabs(K[i * 3 + i] - 1) < 1e-5) : !(K[i * 3 + j] == K[j * 3 + i] && K[i * 3 + j] > 0 && K[i * 3 + j] < 1)) ok = 0;
    qk_map_free(map);
    qk_ctx_destroy(ctx);
    return ok ? 0 : 1;
}
