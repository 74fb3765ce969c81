/* qk_prof CPU tests under an injected clock: exact statistics, nesting, names at several sites,
   END mismatches, counters, memory tracking, transfers, buffer-full drops, escaping. With a
   directory argument it also writes report.txt/json, trace.json, report.html and schedule.json
   (the durations it drew) for tests/prof/prof_export.py to check independently. */
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t fake_now;
static uint64_t fake_clock(void *user) { (void)user; return fake_now; }

#include "../qk_test.h"

static uint64_t rng = 0;
static uint64_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

#define WEIRD "quote \" back \\ slash <tag> & 'apos'\ttab\nnewline"

typedef struct { double *d; int n, cap; } series;
static void push(series *s, double v)
{
    if (s->n == s->cap) { s->cap = s->cap ? s->cap * 2 : 64; s->d = (double *)realloc(s->d, (size_t)s->cap * sizeof *s->d); }
    s->d[s->n++] = v;
}

/* Independent two-pass statistics in long double. */
static void expect_stats(const char *name, const series *s, double npt)
{
    qk_prof_stats st;
    long double sum = 0, mean, var = 0;
    double mn = 1e300, mx = -1e300;
    int i;
    memset(&st, 0xff, sizeof st);
    CHECK(qk_prof_zone_stats(name, 0, &st) == 0);
    for (i = 0; i < s->n; i++) {
        sum += (long double)s->d[i] * npt;
        if (s->d[i] * npt < mn) mn = s->d[i] * npt;
        if (s->d[i] * npt > mx) mx = s->d[i] * npt;
    }
    mean = sum / s->n;
    for (i = 0; i < s->n; i++) var += (s->d[i] * npt - mean) * (s->d[i] * npt - mean);
    var /= s->n;
    CHECK(st.calls == (uint64_t)s->n);
    CHECK(st.total_ns == (double)sum);
    CHECK(st.min_ns == mn);
    CHECK(st.max_ns == mx);
    CHECK(fabs(st.mean_ns - (double)mean) <= 1e-12 * (double)mean);
    CHECK(fabs(st.std_ns - (double)sqrtl(var)) <= 1e-9 * (double)mean + 1e-9);
    fprintf(stderr, "%-8s calls %llu total %.1f mean %.4f std %.6f (expected std %.6f)\n", name,
            (unsigned long long)st.calls, st.total_ns, st.mean_ns, st.std_ns, (double)sqrtl(var));
}

static void write_series(FILE *f, const char *key, const series *s)
{
    int i;
    qk__prof_json_str(f, key); /* the header's own escaper; prof_export.py checks it decodes */
    fputs(":[", f);
    for (i = 0; i < s->n; i++) fprintf(f, "%s%.0f", i ? "," : "", s->d[i]);
    fputs("]", f);
}

int main(int argc, char **argv)
{
    const double npt = 2.5; /* ns per fake tick: checks the conversion too */
    qk_prof_desc desc;
    qk_prof_summary sum;
    series outer = { 0, 0, 0 }, inner = { 0, 0, 0 }, weird = { 0, 0, 0 };
    double tiles = 0, temp_last = 0;
    double outer_self = 0; /* ticks: each outer's time less its inner and weird children */
    int i, j, n_outer;
    char path[1024];
    int a[3];

    rng = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)clock();
    if (!rng) rng = 1;
    fprintf(stderr, "seed-derived state %llu\n", (unsigned long long)rng);
    memset(&desc, 0, sizeof desc);
    desc.clock = fake_clock;
    desc.clock_ns_per_tick = npt;
    fake_now = 1000000 + rnd() % 1000;
    CHECK(qk_prof_init(&desc) == 0);
    QK_PROF_THREAD_NAME("main \"thread\"");

    n_outer = 200 + (int)(rnd() % 300);
    for (i = 0; i < n_outer; i++) {
        uint64_t t0 = fake_now, kids = 0;
        int k = (int)(rnd() % 4);
        QK_PROF_STEP(i); /* >>steps: a step per outer zone (prof_export.py, prof_html.py) */
        QK_PROF_BEGIN("outer");
        fake_now += rnd() % 50;
        for (j = 0; j < k; j++) {
            uint64_t d = 1 + rnd() % 1000;
            if (j % 2 == 0) { QK_PROF_BEGIN("inner"); fake_now += d; QK_PROF_END("inner"); }
            else { QK_PROF_BEGIN("inner"); fake_now += d; QK_PROF_END("inner"); } /* a second site */
            push(&inner, (double)d);
            kids += d;
            fake_now += rnd() % 20;
            QK_PROF_COUNT("tiles", 1 + j);
            tiles += 1 + j;
        }
        if (i % 7 == 0) {
            uint64_t d = rnd() % 100000;
            QK_PROF_BEGIN(WEIRD);
            fake_now += d;
            QK_PROF_END(WEIRD);
            push(&weird, (double)d);
            kids += d;
        }
        temp_last = (double)(rnd() % 1000) / 8.0;
        QK_PROF_COUNTER("temp", temp_last);
        QK_PROF_END("outer");
        push(&outer, (double)(fake_now - t0));
        outer_self += (double)(fake_now - t0 - kids);
        fake_now += rnd() % 100;
    }
    QK_PROF_STEP_END();
    expect_stats("outer", &outer, npt);
    expect_stats("inner", &inner, npt);
    expect_stats(WEIRD, &weird, npt);
    /* Self time: outer less its nested zones, exactly (integer ticks times 2.5); the leaves' self
       time is their total. */
    {
        qk_prof_stats st;
        CHECK(qk_prof_zone_stats("outer", 0, &st) == 0 && st.self_ns == outer_self * npt);
        CHECK(st.self_ns < st.total_ns);
        CHECK(qk_prof_zone_stats("inner", 0, &st) == 0 && st.self_ns == st.total_ns);
        CHECK(qk_prof_zone_stats(WEIRD, 0, &st) == 0 && st.self_ns == st.total_ns);
    }
    {
        qk_prof_stats st;
        CHECK(qk_prof_zone_stats("no such zone", 0, &st) == -1);
        CHECK(qk_prof_zone_stats("outer", 1, &st) == -1); /* no GPU zone of that name */
    }

    /* Scope zone (GCC cleanup attribute in C) and END mismatches. */
    {
        QK_PROF_SCOPE("scoped");
        fake_now += 77;
    }
    {
        qk_prof_stats st;
        CHECK(qk_prof_zone_stats("scoped", 0, &st) == 0 && st.calls == 1 && st.total_ns == 77 * npt);
    }
    QK_PROF_BEGIN("x");
    fake_now += 5;
    QK_PROF_END("y");        /* mismatched: closes x anyway */
    QK_PROF_END("z");        /* unbalanced */
    QK_PROF_GPU_BEGIN("g", (void *)0); /* no QK_PROF_CUDA: ignored, counted */
    QK_PROF_GPU_END("g", (void *)0);
    qk_prof_get_summary(&sum);
    CHECK(sum.mismatched == 1);
    CHECK(sum.unbalanced >= 1);
    CHECK(sum.gpu_ignored == 1);
    CHECK(sum.dropped_events == 0);
    CHECK(sum.threads == 1);
    CHECK(strcmp(sum.clock, "injected") == 0);

    /* Self time of a zone nested in zones of its own name (only direct children count, each call
       once), and of zones around a report written while one is open (its children wait for it). */
    {
        qk_prof_stats st;
        QK_PROF_BEGIN("rec"); fake_now += 10;           /* 85 ticks, self 10 + 3 */
        QK_PROF_BEGIN("rec"); fake_now += 20;           /* 65 ticks, self 20 + 5 */
        QK_PROF_BEGIN("rec"); fake_now += 40; QK_PROF_END("rec");
        fake_now += 5;
        QK_PROF_END("rec");
        QK_PROF_BEGIN("leaf"); fake_now += 7; QK_PROF_END("leaf");
        fake_now += 3;
        QK_PROF_END("rec");
        CHECK(qk_prof_zone_stats("rec", 0, &st) == 0 && st.calls == 3 && st.total_ns == 190 * npt && st.self_ns == 78 * npt);
        CHECK(qk_prof_zone_stats("leaf", 0, &st) == 0 && st.self_ns == 7 * npt);
        QK_PROF_BEGIN("open"); fake_now += 4;
        QK_PROF_BEGIN("kid"); fake_now += 6; QK_PROF_END("kid");
        CHECK(qk_prof_zone_stats("open", 0, &st) == -1);             /* not ended: not reported */
        CHECK(qk_prof_zone_stats("kid", 0, &st) == 0 && st.self_ns == 6 * npt);
        CHECK(qk_prof_zone_stats("rec", 0, &st) == 0 && st.self_ns == 78 * npt); /* kid is nobody's yet */
        QK_PROF_BEGIN("kid"); fake_now += 9; QK_PROF_END("kid");
        fake_now += 2;
        QK_PROF_END("open");
        CHECK(qk_prof_zone_stats("open", 0, &st) == 0 && st.total_ns == 21 * npt && st.self_ns == 6 * npt);
        CHECK(qk_prof_zone_stats("rec", 0, &st) == 0 && st.self_ns == 78 * npt);
    }

    /* Memory: current and peak per kind. */
    QK_PROF_TRACK("a", &a[0], 100);
    fake_now += 10;
    QK_PROF_TRACK_SHAPE("b", &a[1], 200, "f64", 2, ((const int64_t[]){ 5, 5 }));
    fake_now += 10;
    QK_PROF_UNTRACK(&a[0]);
    QK_PROF_TRACK("c", &a[2], 50);
    QK_PROF_UNTRACK(&a[0]); /* second untrack of the same pointer: no effect */
    QK_PROF_MEM_SNAPSHOT("after c");
    qk_prof_get_summary(&sum);
    CHECK(sum.host_current == 250);
    CHECK(sum.host_peak == 300);
    CHECK(sum.device_peak == 0);
    /* Many allocations: the table grows and shrinks without losing any. */
    {
        static char big[5000];
        for (i = 0; i < 5000; i++) QK_PROF_TRACK("many", &big[i], 3);
        qk_prof_get_summary(&sum);
        CHECK(sum.host_current == 250 + 15000);
        for (i = 0; i < 5000; i += 2) QK_PROF_UNTRACK(&big[i]);
        qk_prof_get_summary(&sum);
        CHECK(sum.host_current == 250 + 7500);
        CHECK(sum.host_peak == 250 + 15000);
        for (i = 1; i < 5000; i += 2) QK_PROF_UNTRACK(&big[i]);
    }
    QK_PROF_TRANSFER("upload", QK_PROF_H2D, 1000000000u, 1, 0.1);
    QK_PROF_TRANSFER("upload", QK_PROF_H2D, 500000000u, 1, 0.1);
    QK_PROF_TRANSFER("download", QK_PROF_D2H, 100000000u, 0, 0.05);

    if (argc > 1) {
        FILE *f;
        snprintf(path, sizeof path, "%s/report.txt", argv[1]);
        CHECK(QK_PROF_REPORT(path) == 0);
        snprintf(path, sizeof path, "%s/report.json", argv[1]);
        CHECK(QK_PROF_WRITE_JSON(path) == 0);
        snprintf(path, sizeof path, "%s/trace.json", argv[1]);
        CHECK(QK_PROF_WRITE_TRACE(path) == 0);
        snprintf(path, sizeof path, "%s/report.html", argv[1]);
        CHECK(QK_PROF_WRITE_HTML(path) == 0);
        snprintf(path, sizeof path, "%s/schedule.json", argv[1]);
        f = fopen(path, "w");
        CHECK(f != NULL);
        if (f) {
            fprintf(f, "{\"ns_per_tick\":%.17g,\"weird\":", npt);
            qk__prof_json_str(f, WEIRD);
            fputc(',', f);
            write_series(f, "outer", &outer); fputc(',', f);
            write_series(f, "inner", &inner); fputc(',', f);
            write_series(f, WEIRD, &weird);
            fprintf(f, ",\"tiles\":%.17g,\"temp_last\":%.17g,\"host_current\":250,\"host_peak\":%d,\"outer_self\":%.17g}\n",
                    tiles, temp_last, 250 + 15000, outer_self);
            fclose(f);
        }
        CHECK(QK_PROF_WRITE_TRACE("/nonexistent-dir/x/trace.json") == -1);
        CHECK(strstr(qk_prof_last_error(), "nonexistent") != NULL);
    } else {
        CHECK(qk_prof_write(QK_PROF_TEXT, stdout) == 0);
    }

    /* init after recording is refused; shutdown + init starts afresh. */
    CHECK(qk_prof_init(&desc) == -1);
    qk_prof_shutdown();

    /* Buffer full: 2 chunks of events kept, the rest dropped and counted, statistics exact, self
       times too: "span" is open across the first drop (kept and dropped children), one "pfill"
       ends just after it (its "fill" kept: the one event before span shifts the pairs), the
       rest are dropped with their children. */
    desc.events_per_thread = 2 * 4096;
    CHECK(qk_prof_init(&desc) == 0);
    {
        int n = 5000 + (int)(rnd() % 1000);
        qk_prof_stats st;
        QK_PROF_BEGIN("pre"); fake_now += 1; QK_PROF_END("pre");
        QK_PROF_BEGIN("span");
        fake_now += 11;
        for (i = 0; i < n; i++) {
            QK_PROF_BEGIN("pfill");
            fake_now += 2;
            QK_PROF_BEGIN("fill"); fake_now += 3; QK_PROF_END("fill");
            fake_now += 1;
            QK_PROF_END("pfill");
        }
        fake_now += 13;
        QK_PROF_END("span");
        qk_prof_get_summary(&sum);
        CHECK(sum.events == 8192);
        CHECK(sum.dropped_events == (uint64_t)(2 * n + 2 - 8192));
        CHECK(qk_prof_zone_stats("fill", 0, &st) == 0 && st.calls == (uint64_t)n && st.total_ns == 3.0 * npt * n &&
              st.self_ns == st.total_ns);
        CHECK(qk_prof_zone_stats("pfill", 0, &st) == 0 && st.calls == (uint64_t)n && st.total_ns == 6.0 * npt * n &&
              st.self_ns == 3.0 * npt * n);
        CHECK(qk_prof_zone_stats("span", 0, &st) == 0 && st.total_ns == (24.0 + 6.0 * n) * npt && st.self_ns == 24.0 * npt);
        if (argc > 1) {
            snprintf(path, sizeof path, "%s/full.json", argv[1]);
            CHECK(QK_PROF_WRITE_TRACE(path) == 0);
        }
    }
    /* Depth beyond QK_PROF_MAX_DEPTH: counted, the stack stays consistent. */
    {
        qk_prof_stats st;
        for (i = 0; i < QK_PROF_MAX_DEPTH + 10; i++) QK_PROF_BEGIN("deep");
        for (i = 0; i < QK_PROF_MAX_DEPTH + 10; i++) QK_PROF_END("deep");
        qk_prof_get_summary(&sum);
        CHECK(sum.too_deep == 10);
        CHECK(qk_prof_zone_stats("deep", 0, &st) == 0 && st.calls == QK_PROF_MAX_DEPTH);
        QK_PROF_BEGIN("after deep");
        fake_now += 1;
        QK_PROF_END("after deep");
        CHECK(qk_prof_zone_stats("after deep", 0, &st) == 0 && st.calls == 1 && st.total_ns == npt);
    }
    qk_prof_shutdown();
    free(outer.d); free(inner.d); free(weird.d);
    if (qk_test_fails) { fprintf(stderr, "%d failure(s)\n", qk_test_fails); return 1; }
    fprintf(stderr, "prof_stats: ok\n");
    return 0;
}
