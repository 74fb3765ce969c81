/* Shared by bench/prof_overhead.c and bench/prof_overhead_cuda.cu: a tiny harness that times
   batches of an operation with CLOCK_MONOTONIC, interleaving all measured operations batch by
   batch (so drift hits all alike), and reports per-operation medians and spreads. */
#ifndef PROF_OVERHEAD_H
#define PROF_OVERHEAD_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PB_MAX 16
#define PB_REPS 101

typedef struct pb_case {
    const char *name;
    void (*run)(int n);   /* performs n operations */
    int batch;            /* operations per timed batch */
    double per_op[PB_REPS];
    double median, p10, p90;
} pb_case;

static double pb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int pb_dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void pb_run(pb_case *c, int n)
{
    int r, i;
    for (i = 0; i < n; i++) c[i].run(c[i].batch); /* warm-up */
    for (r = 0; r < PB_REPS; r++)
        for (i = 0; i < n; i++) {
            double t0 = pb_now_ns();
            c[i].run(c[i].batch);
            c[i].per_op[r] = (pb_now_ns() - t0) / c[i].batch;
        }
    for (i = 0; i < n; i++) {
        double s[PB_REPS];
        memcpy(s, c[i].per_op, sizeof s);
        qsort(s, PB_REPS, sizeof s[0], pb_dcmp);
        c[i].median = s[PB_REPS / 2];
        c[i].p10 = s[PB_REPS / 10];
        c[i].p90 = s[PB_REPS - 1 - PB_REPS / 10];
    }
}

static void pb_print(const pb_case *c, int n)
{
    int i;
    printf("%-44s %12s %12s %12s\n", "operation", "median ns", "p10 ns", "p90 ns");
    for (i = 0; i < n; i++) printf("%-44s %12.2f %12.2f %12.2f\n", c[i].name, c[i].median, c[i].p10, c[i].p90);
}

static void pb_json_cases(FILE *f, const pb_case *c, int n)
{
    int i;
    fputs("\"results\":{", f);
    for (i = 0; i < n; i++)
        fprintf(f, "%s\n  \"%s\":{\"median_ns\":%.3f,\"p10_ns\":%.3f,\"p90_ns\":%.3f,\"batch\":%d,\"reps\":%d}", i ? "," : "",
                c[i].name, c[i].median, c[i].p10, c[i].p90, c[i].batch, PB_REPS);
    fputs("}", f);
}

static const pb_case *pb_find(const pb_case *c, int n, const char *name)
{
    int i;
    for (i = 0; i < n; i++) if (strcmp(c[i].name, name) == 0) return &c[i];
    return NULL;
}
#endif
