/* prof_write_cost.c — time to write the Chrome trace (3 times) and the HTML report of 250 000 CPU
   zones on one thread: the cost of the writers, compared before and after a change to them.
   cc -O2 -I. bench/prof_write_cost.c -o /tmp/prof_write_cost -lm -lpthread && /tmp/prof_write_cost */
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"
#include <time.h>
int main(void) {
    int i; struct timespec a, b;
    for (i = 0; i < 250000; i++) { QK_PROF_BEGIN("z"); QK_PROF_END("z"); }
    for (i = 0; i < 3; i++) {
    clock_gettime(CLOCK_MONOTONIC, &a);
    QK_PROF_WRITE_TRACE("/tmp/prof_write_cost.json");
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("trace %.1f ms\n", (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6);
    }
    clock_gettime(CLOCK_MONOTONIC, &a);
    QK_PROF_WRITE_HTML("/tmp/prof_write_cost.html");
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("html %.1f ms\n", (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6);
    return 0;
}
