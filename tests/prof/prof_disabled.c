/* Every macro with QK_PROF_ENABLE undefined: compiles warning-free (C and C++, -Werror), runs,
   reports QK_PROF_ENABLED == 0 and the output macros evaluate to 0. */
#include "qk_prof.h"

#include <stdio.h>
#include <string.h>

int main(void)
{
    double a[4] = { 1, 2, 3, 4 }, s = 0;
    void *stream = NULL;
    const char *path = "/nonexistent/never-written.json";
    qk_prof_desc d; /* the types stay in the disabled build */
    int i, rc = 0;
    memset(&d, 0, sizeof d);
    rc |= QK_PROF_INIT(&d);
    QK_PROF_THREAD_NAME("main");
    QK_PROF_BEGIN("all");
    QK_PROF_TRACK("a", a, sizeof a);
    QK_PROF_GPU_BEGIN("gpu", stream);
    for (i = 0; i < 4; i++) {
        QK_PROF_STEP(i);
        QK_PROF_SCOPE("iter");
        s += a[i];
        QK_PROF_COUNT("n", 1);
    }
    QK_PROF_STEP_END();
    QK_PROF_GPU_END("gpu", stream);
    QK_PROF_COUNTER("s", s);
    QK_PROF_UNTRACK(a);
    QK_PROF_END("all");
    rc |= QK_PROF_REPORT(path);
    rc |= QK_PROF_WRITE_JSON(path);
    rc |= QK_PROF_WRITE_TRACE(path);
    rc |= QK_PROF_WRITE_HTML(path);
    QK_PROF_SHUTDOWN();
    if (rc != 0 || QK_PROF_ENABLED != 0 || s != 10) { fprintf(stderr, "prof_disabled: FAIL\n"); return 1; }
    fprintf(stderr, "prof_disabled: ok\n");
    return 0;
}
