/* tests/qk_test_timing.h — timing a qk_gram call for the cancel-latency tests (test_core,
   test_cpu_tiles, test_mps). Include after qk.h.

   qk_test_timed_gram(ctx, map, desc, t): runs qk_gram; t[0] wall seconds, t[1] CPU seconds of
   the whole process (all threads). qk_test_perturb(on): Meson runs the tests with
   MALLOC_PERTURB_ set, and glibc then fills every allocation byte by byte (tens to hundreds of
   MB of states here, a cost of the harness as large as the latency measured); the timed calls
   turn it off and back on. qk_test_cancel_first: a progress callback that counts its calls in
   *(int *)user and cancels at the first. */
#ifndef QK_TEST_TIMING_H
#define QK_TEST_TIMING_H
#include <stdlib.h>
#include <time.h>
#if defined(__GLIBC__)
#include <malloc.h> /* mallopt (M_PERTURB) */
#endif

static inline double qk_test_now(clockid_t clk)
{
    struct timespec t;
    clock_gettime(clk, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static inline void qk_test_perturb(int on)
{
#if defined(__GLIBC__) && defined(M_PERTURB)
    const char *e = getenv("MALLOC_PERTURB_");
    mallopt(M_PERTURB, on && e ? atoi(e) : 0);
#else
    (void)on;
#endif
}
static inline int qk_test_cancel_first(int64_t done, int64_t total, void *user)
{
    (void)done; (void)total;
    ++*(int *)user;
    return 1;
}
static inline qk_result qk_test_timed_gram(qk_ctx *ctx, const qk_map *m, const qk_gram_desc *d, double t[2])
{
    double w = qk_test_now(CLOCK_MONOTONIC), c = qk_test_now(CLOCK_PROCESS_CPUTIME_ID);
    qk_result r = qk_gram(ctx, m, d);
    t[0] = qk_test_now(CLOCK_MONOTONIC) - w;
    t[1] = qk_test_now(CLOCK_PROCESS_CPUTIME_ID) - c;
    return r;
}
#endif /* QK_TEST_TIMING_H */
