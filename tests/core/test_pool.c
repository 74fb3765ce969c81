/* The context's thread pool (qk__tpool; the CPU engine's steps, and the host threads of several
   GPUs): every index below min(n, workers + 1) runs once a step and no other; the call returns
   only when all of them have returned, whether the caller blocks at once (spin 0, the CPU pool),
   after a few yields (spin 3), or after many (spin 4096, the GPU pool); the workers take the
   slow parts here (a few ms each, longer than the yields), so a caller that stopped waiting when
   its yields ran out would read a count short. One pool serves many steps; stop joins every
   worker. A build without threads (QK_NO_THREADS) has no workers: the caller runs index 0. */
#define _POSIX_C_SOURCE 200809L  /* nanosleep under strict -std=c11 */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../qk_test.h"

typedef struct step {
    int ran[8];      /* times index t ran, this step */
    int ms;          /* a worker's sleep: index t sleeps t * ms */
} step;

static void work(void *p, int t)
{
    step *s = (step *)p;
    if (t > 0 && s->ms > 0) {
        struct timespec d;
        d.tv_sec = 0;
        d.tv_nsec = (long)t * s->ms * 1000000L;
        nanosleep(&d, NULL);
    }
    QK__FETCH_ADD(&s->ran[t], 1);
}

int main(void)
{
    const int spins[3] = {0, 3, 4096};
    int si;
    for (si = 0; si < 3; si++) {
        qk__tpool t;
        int steps, n;
        CHECK(qk__tpool_start(&t, 4) == QK_OK);
        CHECK(t.n_workers == (QK__THREADS ? 3 : 0), "workers %d", t.n_workers);
        t.spin = spins[si];
        for (steps = 0; steps < 12; steps++) {
            for (n = 1; n <= 5; n++) {   /* 5: more than the pool has */
                step s;
                const int want = n < t.n_workers + 1 ? n : t.n_workers + 1;
                int k, bad = 0;
                memset(&s, 0, sizeof s);
                s.ms = steps % 3 == 0 ? 0 : 2;
                qk__tpool_run(&t, n, work, &s);
                for (k = 0; k < 8; k++) bad += QK__LOAD(&s.ran[k]) != (k < want);
                CHECK(bad == 0, "spin %d, step %d, n %d: ran %d %d %d %d %d", t.spin, steps, n, s.ran[0], s.ran[1], s.ran[2],
                      s.ran[3], s.ran[4]);
            }
        }
        qk__tpool_stop(&t);
    }
    printf("test_pool: %d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
