/* Compile test: every header with its implementation, as C (c99 and c11; C++ through
   compile_cpp.cpp), -Wall -Wextra -Werror -Wpedantic. */
#define QK_IMPLEMENTATION
#include "qk.h"
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"
#include "qk.h" /* a second include must be harmless */

int main(void)
{
    qk_map *m = NULL;
    qk_result r = qk_map_parse("zz(reps=1)", 2, &m);
    qk_map_free(m);
    return r == QK_OK ? 0 : 1;
}
