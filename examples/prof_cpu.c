/* prof_cpu.c — qk_prof without CUDA: a 2D heat-diffusion loop on two threads, instrumented with
   zones, counters and memory tracking. Prints the report and writes a Chrome trace and an HTML
   report.

     prof_cpu [steps] [trace.json] [report.html]

   Build (no Meson): cc -O2 -I.. prof_cpu.c -lpthread -lm */
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define N 256

typedef struct {
    const double *in;
    double *out;
    int r0, r1;
    double change;
} band;

static void *relax(void *arg)
{
    band *b = (band *)arg;
    int i, j;
    double ch = 0;
    QK_PROF_BEGIN("stencil");
    for (i = b->r0; i < b->r1; i++) {
        if (i == 0 || i == N - 1) continue;
        for (j = 1; j < N - 1; j++) {
            double v = 0.25 * (b->in[(i - 1) * N + j] + b->in[(i + 1) * N + j] + b->in[i * N + j - 1] + b->in[i * N + j + 1]);
            ch += fabs(v - b->in[i * N + j]);
            b->out[i * N + j] = v;
        }
    }
    b->change = ch;
    QK_PROF_END("stencil");
    return NULL;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 200, s, i;
    const char *trace = argc > 2 ? argv[2] : "prof_cpu_trace.json";
    const char *html = argc > 3 ? argv[3] : "prof_cpu.html";
    double *a = (double *)calloc((size_t)N * N, sizeof *a), *b = (double *)calloc((size_t)N * N, sizeof *b);
    int64_t shape[2] = { N, N };
    if (!a || !b) return 1;
    QK_PROF_THREAD_NAME("main");
    QK_PROF_TRACK_SHAPE("grid a", a, (size_t)N * N * sizeof *a, "f64", 2, shape);
    QK_PROF_TRACK_SHAPE("grid b", b, (size_t)N * N * sizeof *b, "f64", 2, shape);
    for (i = 0; i < N; i++) a[i] = b[i] = 100.0; /* hot top edge */
    for (s = 0; s < steps; s++) {
        pthread_t th[2];
        band bd[2];
        QK_PROF_BEGIN("step");
        for (i = 0; i < 2; i++) {
            bd[i].in = a; bd[i].out = b; bd[i].r0 = i * N / 2; bd[i].r1 = (i + 1) * N / 2;
        }
        QK_PROF_BEGIN("spawn");
        pthread_create(&th[0], NULL, relax, &bd[0]);
        QK_PROF_END("spawn");
        relax(&bd[1]);
        pthread_join(th[0], NULL);
        QK_PROF_BEGIN("swap");
        { double *t = a; a = b; b = t; }
        QK_PROF_END("swap");
        QK_PROF_COUNTER("change", bd[0].change + bd[1].change);
        QK_PROF_COUNT("steps", 1);
        if (s % 50 == 49) {
            /* a scratch buffer now and then, to show memory over time */
            double *scratch = (double *)malloc((size_t)N * N * sizeof *scratch);
            QK_PROF_TRACK("scratch", scratch, (size_t)N * N * sizeof *scratch);
            QK_PROF_BEGIN("checkpoint");
            if (scratch) memcpy(scratch, a, (size_t)N * N * sizeof *a);
            QK_PROF_END("checkpoint");
            QK_PROF_UNTRACK(scratch);
            free(scratch);
        }
        QK_PROF_END("step");
    }
    { double heat = 0; for (i = 0; i < N * N; i++) heat += a[i]; printf("total heat after %d steps: %.6f\n", steps, heat); }
    QK_PROF_REPORT("-");
    if (QK_PROF_WRITE_TRACE(trace) != 0 || QK_PROF_WRITE_HTML(html) != 0) {
        fprintf(stderr, "prof_cpu: %s\n", qk_prof_last_error());
        return 1;
    }
    printf("\nwrote %s and %s\n", trace, html);
    QK_PROF_UNTRACK(a);
    QK_PROF_UNTRACK(b);
    free(a);
    free(b);
    QK_PROF_SHUTDOWN();
    return 0;
}
