/* The context's thread pool (qk__tpool; the CPU engine's steps, and the host threads of several
   GPUs): every index below min(n, workers + 1) runs once a step and no other; the call returns
   only when all of them have returned, whether the caller blocks at once (spin 0, the CPU pool),
   after a few yields (spin 3), or after many (spin 4096, the GPU pool); the workers take the
   slow parts here (a few ms each, longer than the yields), so a caller that stopped waiting when
   its yields ran out would read a count short. One pool serves many steps; stop joins every
   worker. A build without threads (QK_NO_THREADS) has no workers: the caller runs index 0.
   A forked child of a process whose context has started its pool (Python's multiprocessing,
   a server that forks workers) has none of its threads: qk_gram there gives the parent's K and
   qk_ctx_destroy returns, both within an alarm's 30 s (a pool that waited on the parent's
   threads would hang). */
#define _POSIX_C_SOURCE 200809L  /* nanosleep under strict -std=c11 */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

static int gram(qk_ctx *ctx, const qk_map *m, const double *x, int64_t n, double *K)
{
    qk_gram_desc d;
    memset(&d, 0, sizeof d);
    d.x = x;
    d.n_x = n;
    d.out = K;
    d.out_dtype = QK_F64;
    return qk_gram(ctx, m, &d) == QK_OK;
}

/* qk_gram in a forked child on the parent's context (its pool started), then qk_ctx_destroy */
static void forked(void)
{
    enum { N = 300, F = 6 };
    qk_ctx *ctx = qk_test_cpu_ctx(3);
    qk_map *m = qk_test_parse("zz(reps=2)", F);
    double *x = qk_test_rand_data(N, F, 0.0, 3.0);
    double *K1 = (double *)calloc((size_t)N * N, sizeof(double)), *K2 = (double *)calloc((size_t)N * N, sizeof(double));
    pid_t pid;
    int st = 0;
    CHECK(K1 && K2 && gram(ctx, m, x, N, K1), "the parent's K: %s", qk_last_error());
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        int ok;
        alarm(30);
        ok = gram(ctx, m, x, N, K2) && memcmp(K1, K2, sizeof(double) * N * N) == 0;
        ok = ok && gram(ctx, m, x, N, K2) && memcmp(K1, K2, sizeof(double) * N * N) == 0;   /* the child's own pool, again */
        qk_ctx_destroy(ctx);
        _exit(ok ? 0 : 1);
    }
    CHECK(pid > 0, "fork failed");
    if (pid > 0) {
        CHECK(waitpid(pid, &st, 0) == pid);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the forked child: %s %d (SIGALRM %d: it hung)",
              WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? WTERMSIG(st) : -1, SIGALRM);
    }
    CHECK(gram(ctx, m, x, N, K2) && memcmp(K1, K2, sizeof(double) * N * N) == 0, "the parent after the fork");
    free(K1);
    free(K2);
    free(x);
    qk_map_free(m);
    qk_ctx_destroy(ctx);
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
    qk_test_seed();
    forked();
    printf("test_pool: %d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
