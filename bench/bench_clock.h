/* bench/bench_clock.h — what the C benchmarks share of their timing: the monotonic clock
   (bench_now, seconds), the process's CPU time (bench_cpu_now: user + system, less sensitive to
   other jobs on a shared machine), the 1-minute load average (bench_loadavg, -1 where
   /proc/loadavg cannot be read) and qsort's ascending order of doubles (bench_cmp). POSIX:
   include it after qk.h and the C headers, with _POSIX_C_SOURCE defined where the build is strict C. */
#ifndef QK_BENCH_CLOCK_H
#define QK_BENCH_CLOCK_H
#include <stdio.h>
#include <time.h>
#include <sys/resource.h>

static inline double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static inline double bench_cpu_now(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}
static inline double bench_loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) { if (fscanf(f, "%lf", &l) != 1) l = -1; fclose(f); }
    return l;
}
static inline int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
#endif
