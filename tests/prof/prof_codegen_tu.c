/* One translation unit, compiled by tests/prof/prof_codegen.py with and without the profiler macros
   (USE_MACROS) and with and without QK_PROF_ENABLE: without QK_PROF_ENABLE the macros must
   generate no code or data at all. */
#include "qk_prof.h"

#ifdef USE_MACROS
#define M(x) x
#else
#define M(x)
#endif

typedef struct { const char *n; } qk_codegen_unused; /* types stay usable in every build */

double qk_codegen_work(double *a, int n, void *stream, const char *path)
{
    double s = 0;
    int i;
    qk_prof_site site_type_check = { "t", "f", 1, 0, 0 };
    qk_prof_stats stats_type_check;
    (void)site_type_check;
    (void)stats_type_check;
    (void)stream;
    (void)path;
    M(QK_PROF_THREAD_NAME("worker");)
    M(QK_PROF_BEGIN("work");)
    M(QK_PROF_TRACK("a", a, (size_t)n * sizeof *a);)
    M(QK_PROF_TRACK_SHAPE("a2", a, (size_t)n * sizeof *a, "f64", 1, NULL);)
    M(QK_PROF_STREAM_NAME(stream, "compute");)
    M(QK_PROF_GPU_BEGIN("gpu", stream);)
    for (i = 0; i < n; i++) {
        M(QK_PROF_STEP(i);)
        M(QK_PROF_SCOPE("iter");)
        s += a[i] * a[i];
        M(QK_PROF_COUNT("iters", 1);)
    }
    M(QK_PROF_STEP_END();)
    M(QK_PROF_GPU_END("gpu", stream);)
    M(QK_PROF_GPU_COLLECT();)
    M(QK_PROF_COUNTER("sum", s);)
    M(QK_PROF_TRANSFER("copy", QK_PROF_H2D, (size_t)n, 1, 0.5);)
    M(QK_PROF_MEM_SNAPSHOT("snap");)
    M(QK_PROF_MEMPOOL("pool", stream);)
    M(QK_PROF_UNTRACK(a);)
    M(QK_PROF_END("work");)
    M(QK_PROF_REPORT(path);)
#ifdef __OPTIMIZE__ /* at -O0 a branch on the constant 0 is still a branch: the user's code */
    M(if (QK_PROF_REPORT(path) != 0) s = -s;)
#endif
    M(QK_PROF_WRITE_JSON(path);)
    M(QK_PROF_WRITE_TRACE(path);)
    M(QK_PROF_WRITE_HTML(path);)
    return s;
}

int qk_codegen_main(void)
{
    M(QK_PROF_INIT(NULL);)
    M(QK_PROF_FUNC();)
    M(QK_PROF_SHUTDOWN();)
    return QK_PROF_ENABLED;
}
