/* qk_prof step-loop statistics (QK_PROF_STEP) under an injected clock, every number against an
   independent computation: per-step totals per zone name (several sites, a zone that skips
   steps counts 0, one that starts late, zones of worker threads started per step, zones between
   steps that count in none), warm-up, the window (a ring: only the last steps), percentiles
   (sorted, linear interpolation), the trend of a planted drift, per-step totals that stay exact
   when the event buffer is full, and the step section of the text / JSON / HTML reports. */
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../qk_test.h"

static uint64_t fake_now;
static uint64_t fake_clock(void *user) { (void)user; return fake_now; }
static uint64_t rng = 0;
static uint64_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Independent statistics: a sorted copy, the percentile by interpolation (written out again
   here), the slope by the normal equations in long double. */
static void expect(const char *name, const double *v, int n, int64_t first, int64_t last)
{
    qk_prof_step_stats st;
    double *s = (double *)malloc((size_t)n * sizeof *s), q[3] = { 50, 95, 99 }, want[3];
    long double sx = 0, sy = 0, sxy = 0, sxx = 0, mean, slope;
    int i, k;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, dcmp);
    for (k = 0; k < 3; k++) {
        double h = (n - 1) * q[k] / 100.0;
        int lo = (int)h;
        want[k] = lo + 1 < n ? s[lo] + (h - lo) * (s[lo + 1] - s[lo]) : s[n - 1];
    }
    for (i = 0; i < n; i++) { sx += i; sy += v[i]; sxy += (long double)i * v[i]; sxx += (long double)i * i; }
    mean = sy / n;
    slope = n > 1 ? (n * sxy - sx * sy) / (n * sxx - sx * sx) : 0;
    memset(&st, 0xff, sizeof st);
    CHECK(qk_prof_zone_step_stats(name, 0, &st) == 0, "%s: %s", name ? name : "(step)", qk_prof_last_error());
    CHECK(st.steps == n, "%s: steps %lld, want %d", name ? name : "(step)", (long long)st.steps, n);
    CHECK(st.first == first && st.last == last, "%s: first %lld last %lld", name ? name : "(step)", (long long)st.first, (long long)st.last);
    CHECK(fabs(st.mean_ns - (double)mean) <= 1e-9 * (double)mean, "%s: mean %.6f want %.6f", name ? name : "(step)", st.mean_ns, (double)mean);
    CHECK(st.min_ns == s[0] && st.max_ns == s[n - 1], "%s: min/max", name ? name : "(step)");
    CHECK(fabs(st.p50_ns - want[0]) <= 1e-9 * want[0] + 1e-9, "%s: p50 %.4f want %.4f", name ? name : "(step)", st.p50_ns, want[0]);
    CHECK(fabs(st.p95_ns - want[1]) <= 1e-9 * want[1] + 1e-9, "%s: p95 %.4f want %.4f", name ? name : "(step)", st.p95_ns, want[1]);
    CHECK(fabs(st.p99_ns - want[2]) <= 1e-9 * want[2] + 1e-9, "%s: p99 %.4f want %.4f", name ? name : "(step)", st.p99_ns, want[2]);
    CHECK(fabs(st.trend_ns - (double)slope) <= 1e-6 * fabs((double)mean) / (n > 1 ? n : 1) + 1e-9,
          "%s: trend %.9g want %.9g", name ? name : "(step)", st.trend_ns, (double)slope);
    fprintf(stderr, "%-10s steps %d mean %.2f p50 %.2f p99 %.2f trend %.4f\n", name ? name : "(step)", n, st.mean_ns,
            st.p50_ns, st.p99_ns, st.trend_ns);
    free(s);
}

static uint64_t worker_ticks;
static void *worker(void *arg)
{
    (void)arg;
    QK_PROF_BEGIN("worker");
    fake_now += worker_ticks; /* the main thread waits in join: no race on the clock */
    QK_PROF_END("worker");
    return NULL;
}

#define NMAX 400

int main(int argc, char **argv)
{
    const double npt = 2.5;
    qk_prof_desc desc;
    qk_prof_step_stats st;
    static double stepv[NMAX], av[NMAX], bv[NMAX], latev[NMAX], wv[NMAX];
    int i, n, nb = 0, nlate = 0;
    char path[1024];

    rng = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)clock();
    if (!rng) rng = 1;
    memset(&desc, 0, sizeof desc);
    desc.clock = fake_clock;
    desc.clock_ns_per_tick = npt;
    fake_now = 5000;
    CHECK(qk_prof_init(&desc) == 0);
    CHECK(qk_prof_zone_step_stats(NULL, 0, &st) == -1); /* no step yet */

    /* 1. Default warm-up (1) and window (4096 > steps): every step after the first. */
    QK_PROF_BEGIN("before"); fake_now += 11; QK_PROF_END("before"); /* before any step: in none */
    n = 60 + (int)(rnd() % 200);
    for (i = 0; i < n; i++) {
        uint64_t t0 = fake_now, a = 1 + rnd() % 1000, b = 0, late = 0;
        QK_PROF_STEP(100 + i);
        fake_now += rnd() % 30;
        QK_PROF_BEGIN("a");
        fake_now += a;
        if (i % 2 == 0) { /* b: in "a" (nested) on even steps only, two sites of one name */
            uint64_t b1 = 1 + rnd() % 100, b2 = 1 + rnd() % 100;
            QK_PROF_BEGIN("b"); fake_now += b1; QK_PROF_END("b");
            QK_PROF_BEGIN("b"); fake_now += b2; QK_PROF_END("b");
            b = b1 + b2;
            a += b;
        }
        QK_PROF_END("a");
        if (i >= 25) { late = 1 + rnd() % 50; QK_PROF_BEGIN("late"); fake_now += late; QK_PROF_END("late"); }
        {
            pthread_t th;
            worker_ticks = 1 + rnd() % 300;
            CHECK(pthread_create(&th, NULL, worker, NULL) == 0);
            pthread_join(th, NULL);
        }
        fake_now += rnd() % 40;
        if (i >= 1) { /* warm-up: step 0 left out */
            stepv[i - 1] = (double)(fake_now - t0) * npt;
            av[i - 1] = (double)a * npt;
            if (i >= 2) bv[nb++] = (double)b * npt; /* from its first counted step (2) on */
            wv[i - 1] = (double)worker_ticks * npt;
        }
        if (i >= 25) latev[nlate++] = (double)late * npt;
    }
    QK_PROF_STEP_END();
    QK_PROF_BEGIN("after"); fake_now += 13; QK_PROF_END("after"); /* after the last step: in none */
    expect(NULL, stepv, n - 1, 101, 100 + n - 1);
    expect("a", av, n - 1, 101, 100 + n - 1);
    expect("b", bv, nb, 102, 100 + n - 1);       /* 0 on odd steps */
    expect("late", latev, nlate, 125, 100 + n - 1); /* from its first step on */
    expect("worker", wv, n - 1, 101, 100 + n - 1);  /* other threads, started per step */
    CHECK(qk_prof_zone_step_stats("before", 0, &st) == -1);
    CHECK(qk_prof_zone_step_stats("after", 0, &st) == -1);
    CHECK(qk_prof_zone_step_stats("a", 1, &st) == -1); /* no GPU zone of that name */
    CHECK(qk_prof_zone_step_stats(NULL, 0, &st) == 0 && st.marked == n);
    if (argc > 1) {
        FILE *f;
        snprintf(path, sizeof path, "%s/steps.txt", argv[1]);
        CHECK(QK_PROF_REPORT(path) == 0);
        snprintf(path, sizeof path, "%s/steps.json", argv[1]);
        CHECK(QK_PROF_WRITE_JSON(path) == 0);
        snprintf(path, sizeof path, "%s/steps.html", argv[1]);
        CHECK(QK_PROF_WRITE_HTML(path) == 0);
        snprintf(path, sizeof path, "%s/steps_expected.json", argv[1]);
        f = fopen(path, "w");
        if (f) {
            fprintf(f, "{\"step\":[");
            for (i = 0; i < n - 1; i++) fprintf(f, "%s%.17g", i ? "," : "", stepv[i]);
            fprintf(f, "],\"a\":[");
            for (i = 0; i < n - 1; i++) fprintf(f, "%s%.17g", i ? "," : "", av[i]);
            fprintf(f, "],\"b\":[");
            for (i = 0; i < nb; i++) fprintf(f, "%s%.17g", i ? "," : "", bv[i]);
            fprintf(f, "],\"late\":[");
            for (i = 0; i < nlate; i++) fprintf(f, "%s%.17g", i ? "," : "", latev[i]);
            fprintf(f, "]}\n");
            fclose(f);
        }
    } else {
        CHECK(qk_prof_write(QK_PROF_TEXT, stdout) == 0);
    }
    qk_prof_shutdown();

    /* 2. The window (a ring of 8) and no warm-up: a planted linear drift, 10 + 3k ticks at step k:
       the last 8 steps, trend exactly 3 ticks per step. */
    desc.step_window = 8;
    desc.step_warmup = -1;
    CHECK(qk_prof_init(&desc) == 0);
    for (i = 0; i < 20; i++) {
        QK_PROF_STEP(i);
        QK_PROF_BEGIN("drift");
        fake_now += 10 + 3 * (uint64_t)i;
        QK_PROF_END("drift");
    }
    QK_PROF_STEP_END();
    for (i = 0; i < 8; i++) stepv[i] = (10.0 + 3.0 * (12 + i)) * npt;
    expect(NULL, stepv, 8, 12, 19);
    expect("drift", stepv, 8, 12, 19);
    CHECK(qk_prof_zone_step_stats("drift", 0, &st) == 0 && st.trend_ns == 3 * npt && st.marked == 20);
    CHECK(fabs(st.trend_rel - 3 * npt / st.mean_ns) < 1e-15);
    qk_prof_shutdown();

    /* 3. A full event buffer (one chunk): per-step totals still exact from the dropped zones'
       running totals; an explicit warm-up of 3. */
    desc.step_window = 0;
    desc.step_warmup = 3;
    desc.events_per_thread = 4096;
    CHECK(qk_prof_init(&desc) == 0);
    for (i = 0; i < 12; i++) {
        int j;
        uint64_t sum = 0;
        QK_PROF_STEP(i);
        for (j = 0; j < 1000; j++) {
            uint64_t d = 1 + rnd() % 9;
            QK_PROF_BEGIN("many"); fake_now += d; QK_PROF_END("many");
            sum += d;
        }
        if (i >= 3) av[i - 3] = (double)sum * npt;
    }
    QK_PROF_STEP_END();
    {
        qk_prof_summary sum;
        qk_prof_get_summary(&sum);
        CHECK(sum.dropped_events > 0);
    }
    expect("many", av, 9, 3, 11);
    qk_prof_shutdown();

    if (qk_test_fails) { fprintf(stderr, "%d failure(s)\n", qk_test_fails); return 1; }
    fprintf(stderr, "prof_steps: ok (%d checks)\n", qk_test_checks);
    return 0;
}
