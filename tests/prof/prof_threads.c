/* qk_prof under 8 threads x 100k zones (plus nested zones and counters): exact counts, no
   drops with the default buffers; then, with small buffers, exactly the overflow is dropped
   while the statistics stay exact. Real clock. */
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"

#include <pthread.h>
#include <string.h>

#define NT 8
#define NZ 100000

#include "../qk_test.h"



static pthread_barrier_t all_started;

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg, i;
    volatile unsigned sink = 0; /* per thread: the zones, not this, are under test */
    char name[32];
    snprintf(name, sizeof name, "worker %d", id);
    QK_PROF_THREAD_NAME(name);
    /* all eight alive at once: an exited thread's lane is reused by the next new thread */
    pthread_barrier_wait(&all_started);
    for (i = 0; i < NZ; i++) {
        QK_PROF_BEGIN("work");
        sink += (unsigned)i;
        if (i % 10 == 0) {
            QK_PROF_BEGIN("inner");
            sink ^= (unsigned)id;
            QK_PROF_END("inner");
        }
        if (i % 1000 == 0) QK_PROF_COUNT("batches", 1);
        QK_PROF_END("work");
    }
    (void)sink;
    return NULL;
}

static void run(void)
{
    pthread_t th[NT];
    int i;
    pthread_barrier_init(&all_started, NULL, NT);
    for (i = 0; i < NT; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    for (i = 0; i < NT; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&all_started);
}

static void *short_lived(void *arg)
{
    int i;
    (void)arg;
    for (i = 0; i < 10; i++) { QK_PROF_BEGIN("short"); QK_PROF_END("short"); }
    QK_PROF_BEGIN("left open at exit"); /* counted as unbalanced when the lane is reused */
    return NULL;
}

int main(void)
{
    qk_prof_stats st;
    qk_prof_summary s;
    qk_prof_desc d;
    const uint64_t per_thread = NZ + NZ / 10 + NZ / 1000; /* zones + inner zones + counter events */
    uint64_t kept;
    int i;

    run();
    CHECK(qk_prof_zone_stats("work", 0, &st) == 0 && st.calls == (uint64_t)NT * NZ);
    CHECK(qk_prof_zone_stats("inner", 0, &st) == 0 && st.calls == (uint64_t)NT * NZ / 10);
    qk_prof_get_summary(&s);
    CHECK(s.threads == NT);
    CHECK(s.events == NT * per_thread);
    CHECK(s.dropped_events == 0 && s.unbalanced == 0 && s.mismatched == 0);
    fprintf(stderr, "default buffers: %llu events, %llu dropped, clock %s\n", (unsigned long long)s.events,
            (unsigned long long)s.dropped_events, s.clock);
    qk_prof_shutdown();

    memset(&d, 0, sizeof d);
    d.events_per_thread = 50000; /* rounded up to whole 4096-event chunks: 13 chunks */
    CHECK(qk_prof_init(&d) == 0);
    run();
    kept = ((50000 + 4095) / 4096) * 4096;
    CHECK(qk_prof_zone_stats("work", 0, &st) == 0 && st.calls == (uint64_t)NT * NZ);
    CHECK(st.min_ns >= 0 && st.max_ns >= st.mean_ns && st.mean_ns >= st.min_ns);
    qk_prof_get_summary(&s);
    CHECK(s.events == NT * kept);
    CHECK(s.dropped_events == NT * (per_thread - kept));
    fprintf(stderr, "small buffers: %llu events kept, %llu dropped\n", (unsigned long long)s.events,
            (unsigned long long)s.dropped_events);
    qk_prof_shutdown();

    /* 500 threads one after another (more than QK_PROF_MAX_THREADS): one lane, reused. */
    for (i = 0; i < 500; i++) {
        pthread_t th;
        pthread_create(&th, NULL, short_lived, NULL);
        pthread_join(th, NULL);
    }
    CHECK(qk_prof_zone_stats("short", 0, &st) == 0 && st.calls == 5000);
    qk_prof_get_summary(&s);
    CHECK(s.threads <= 2 && s.dropped_threads == 0);
    CHECK(s.unbalanced == 499); /* every reuse finds the previous thread's open zone */
    fprintf(stderr, "500 sequential threads: %d lane(s)\n", s.threads);
    qk_prof_shutdown();
    if (qk_test_fails) { fprintf(stderr, "%d failure(s)\n", qk_test_fails); return 1; }
    fprintf(stderr, "prof_threads: ok\n");
    return 0;
}
