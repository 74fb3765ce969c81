/* The parent project's program: K(X,X) of two samples through the subproject's qk_dep. */
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <string.h>

int main(void)
{
    static const double X[2 * 2] = {0.1, 0.2, 0.3, -0.4};
    double K[4];
    qk_ctx *ctx = NULL;
    qk_map *map = NULL;
    qk_ctx_desc cd;
    qk_gram_desc g;
    memset(&cd, 0, sizeof cd);
    memset(&g, 0, sizeof g);
    if (qk_ctx_create(&cd, &ctx) != QK_OK || qk_map_parse("zz(reps=2)", 2, &map) != QK_OK) return 1;
    g.x = X;
    g.n_x = 2;
    g.out = K;
    if (qk_gram(ctx, map, &g) != QK_OK) return 1;
    printf("K = [%.6f %.6f; %.6f %.6f]\n", K[0], K[1], K[2], K[3]);
    qk_map_free(map);
    qk_ctx_destroy(ctx);
    return K[0] > 0.999999 && K[3] > 0.999999 && K[1] == K[2] ? 0 : 1;
}
