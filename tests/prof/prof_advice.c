/* qk_prof advice rules on the CPU (no GPU): each rule fires on a run of records with its problem
   planted, the clean twin fires none, a negative threshold turns a rule off, a threshold beyond
   the plant keeps it quiet, QK_PROF_ADVICE overrides the thresholds. Then the live path: CPU
   zones "step" under an injected clock and injected GPU activities (qk_prof_activity_add), whose
   advice, activity counts and per-kernel-name table the reports give. With a directory argument
   it writes report.json, trace.json, report.txt, report.html and expect.json (what it injected:
   counts, per stream, names and zones) there for tests/prof_advice.py to check independently,
   and tests/prof_html.py renders report.html (the timeline's GPU activity lanes). */
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../qk_test.h"

#define US 1000.0
#define MAXA 8192

static qk_prof_activity acts[MAXA];
static int n_acts;
static qk_prof_span steps[64];
static qk_prof_mem_sample mem[256];
static int n_mem;
static qk_prof_zone_part thr[8], rnk[8];

static qk_prof_activity *act(int kind, double t0, double t1, uint32_t stream)
{
    qk_prof_activity *a = &acts[n_acts++];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    a->start_ns = t0;
    a->end_ns = t1;
    a->stream = stream;
    a->zone = "step";
    if (kind == QK_PROF_ACT_KERNEL) a->name = "transport_kernel";
    return a;
}

static qk_prof_activity *copy(double t0, double t1, uint32_t stream, int dir, int host_kind, uint64_t bytes)
{
    qk_prof_activity *a = act(QK_PROF_ACT_MEMCPY, t0, t1, stream);
    a->dir = dir;
    a->bytes = bytes;
    a->src_kind = dir == QK_PROF_H2D ? host_kind : QK_PROF_MEMK_DEVICE;
    a->dst_kind = dir == QK_PROF_D2H ? host_kind : QK_PROF_MEMK_DEVICE;
    return a;
}

enum { CLEAN, PAGEABLE, SYNC, IDLE, LAUNCH, SERIAL, LEAK, OUTLIER, DRIFT, THREADS, RANKS, NPLANT };
static const char *const rule_of[NPLANT] = { NULL, "pageable-copy", "sync-in-loop", "gpu-idle", "launch-bound",
                                             "serialized-copy", "memory-growth", "step-outliers", "step-drift",
                                             "thread-imbalance", "rank-imbalance" };

/* 20 steps of 1 ms (LAUNCH: 350 us; OUTLIER: every 5th step 4 ms; DRIFT: 1 ms growing to 2 ms).
   Clean: four 200 us kernels back to back on stream 1 per step, a 50 us pinned D2H copy of 4 MiB
   on stream 2 while the second kernel runs, flat memory, a zone "worker" of 4 ms on each of 4
   threads (THREADS: 12 ms on thread 3), a zone "solve" of 10 ms on each of 4 ranks (RANKS: 16 ms
   on rank 2). The first step of OUTLIER is slow too: the warm-up the rules leave out. */
static qk_prof_facts build(int plant)
{
    qk_prof_facts f;
    int s, k;
    double step = plant == LAUNCH ? 350 * US : 1000 * US, t0 = 0;
    n_acts = n_mem = 0;
    for (s = 0; s < 20; s++, t0 = steps[s - 1].t1_ns) {
        double len = step;
        if (plant == OUTLIER && s % 5 == 4) len = 4 * step;
        if (plant == OUTLIER && s == 0) len = 2 * step;
        if (plant == DRIFT) len = step * (1 + s / 19.0);
        steps[s].t0_ns = t0;
        steps[s].t1_ns = t0 + len;
        if (plant == LAUNCH) {              /* 50 kernels of 5 us, 2 us apart */
            for (k = 0; k < 50; k++) act(QK_PROF_ACT_KERNEL, t0 + k * 7 * US, t0 + k * 7 * US + 5 * US, 1)->name = "tiny";
            continue;
        }
        if (plant == IDLE) {                /* 300 us of kernels per 1 ms step */
            act(QK_PROF_ACT_KERNEL, t0, t0 + 300 * US, 1);
        } else if (plant == SYNC) {         /* the work ends at 800 us, the host waits, relaunches at 1000 */
            for (k = 0; k < 4; k++) act(QK_PROF_ACT_KERNEL, t0 + k * 200 * US, t0 + (k + 1) * 200 * US, 1);
            act(QK_PROF_ACT_SYNC, t0 + 100 * US, t0 + 810 * US, 0)->sync = QK_PROF_SYNC_DEVICE;
        } else if (plant == SERIAL) {       /* kernels, then the copy, on the one stream */
            act(QK_PROF_ACT_KERNEL, t0, t0 + 600 * US, 1);
            copy(t0 + 600 * US, t0 + 800 * US, 1, QK_PROF_D2H, QK_PROF_MEMK_PINNED, 4u << 20);
            act(QK_PROF_ACT_KERNEL, t0 + 800 * US, t0 + 1000 * US, 1);
        } else {
            for (k = 0; k < 4; k++) act(QK_PROF_ACT_KERNEL, t0 + k * 250 * US, t0 + (k + 1) * 250 * US, 1);
        }
        if (plant != SERIAL && plant != IDLE)
            copy(t0 + 300 * US, t0 + 350 * US, 2, QK_PROF_D2H, plant == PAGEABLE ? QK_PROF_MEMK_PAGEABLE : QK_PROF_MEMK_PINNED,
                 plant == PAGEABLE ? 1u << 20 : 4u << 20);
        mem[n_mem].t_ns = t0 + 500 * US;
        mem[n_mem].host = 1e6;
        mem[n_mem].device = 64e6 + (plant == LEAK ? s * 2e6 : 0);
        mem[n_mem++].device_used = -1;
    }
    if (plant == PAGEABLE) /* one pinned copy to compare: 4 MiB in 200 us */
        copy(100 * US, 300 * US, 3, QK_PROF_D2H, QK_PROF_MEMK_PINNED, 4u << 20);
    memset(&f, 0, sizeof f);
    f.acts = acts;
    f.n_acts = (size_t)n_acts;
    f.steps = steps;
    f.n_steps = 20;
    f.step_zone = "step";
    f.mem = mem;
    f.n_mem = (size_t)n_mem;
    f.wall_ns = steps[19].t1_ns;
    for (k = 0; k < 4; k++) {
        memset(&thr[k], 0, sizeof thr[k]);
        thr[k].zone = "worker";
        thr[k].index = k + 1;
        thr[k].total_ns = (plant == THREADS && k == 3 ? 12 : 4) * 1000 * US;
        thr[k].calls = 20;
        rnk[k] = thr[k];
        rnk[k].zone = "solve";
        rnk[k].index = k;
        rnk[k].total_ns = (plant == RANKS && k == 2 ? 16 : 10) * 1000 * US;
    }
    thr[4] = thr[0]; /* the main thread's "step": one thread, never imbalanced */
    thr[4].zone = "step";
    thr[4].index = 0;
    thr[4].total_ns = f.wall_ns;
    f.threads = thr;
    f.n_threads = 5;
    f.ranks = rnk;
    f.n_ranks_rows = 4;
    f.n_ranks = 4;
    return f;
}

static int fired(const qk_prof_advice *a, int n, const char *rule)
{
    int i;
    for (i = 0; i < n; i++) if (strcmp(a[i].rule, rule) == 0) return 1;
    return 0;
}

static void rules(void)
{
    qk_prof_advice adv[16];
    qk_prof_advice_cfg cfg;
    int p, n, i;
    qk_prof_facts f = build(CLEAN);
    n = qk_prof_advise(&f, NULL, adv, 16);
    CHECK(n == 0, "the clean twin fired %d (first: %s: %s)", n, n > 0 ? adv[0].rule : "", n > 0 ? adv[0].evidence : "");
    for (p = 1; p < NPLANT; p++) {
        f = build(p);
        n = qk_prof_advise(&f, NULL, adv, 16);
        CHECK(n == 1 && fired(adv, n, rule_of[p]), "plant %s: %d items, first %s", rule_of[p], n, n > 0 ? adv[0].rule : "-");
        for (i = 0; i < n && i < 16; i++) {
            CHECK(adv[i].evidence[0] && adv[i].fix[0] && adv[i].where[0], "%s has evidence, a fix, a place", adv[i].rule);
            printf("  [%s] %s: %s\n", adv[i].rule, adv[i].where, adv[i].evidence);
        }
        /* the rule's own threshold, negative: off */
        memset(&cfg, 0, sizeof cfg);
        switch (p) {
        case PAGEABLE: cfg.pageable_min_bytes = -1; break;
        case SYNC: cfg.sync_min_step_share = -1; break;
        case IDLE: cfg.idle_max_busy = -1; break;
        case LAUNCH: cfg.short_kernel_ns = -1; break;
        case SERIAL: cfg.serial_min_copy_share = -1; break;
        case LEAK: cfg.leak_min_bytes = -1; break;
        case OUTLIER: cfg.tail_ratio = -1; break;
        case DRIFT: cfg.drift_min_growth = -1; break;
        case THREADS: cfg.thread_imbalance = -1; break;
        case RANKS: cfg.rank_imbalance = -1; break;
        }
        n = qk_prof_advise(&f, &cfg, adv, 16);
        CHECK(!fired(adv, n < 16 ? n : 16, rule_of[p]), "plant %s with its rule off still fired", rule_of[p]);
        /* a threshold beyond the plant: quiet */
        memset(&cfg, 0, sizeof cfg);
        switch (p) {
        case PAGEABLE: cfg.pageable_min_bytes = 64.0 * (1 << 20); break;  /* the plant copies 20 MiB */
        case SYNC: cfg.sync_min_idle_ns = 500 * US; break;                  /* its waits leave 190 us idle */
        case IDLE: cfg.idle_max_busy = 0.25; break;                         /* it is busy 30 % */
        case LAUNCH: cfg.short_kernel_ns = 4 * US; break;                   /* its kernels take 5 us */
        case SERIAL: cfg.serial_min_copy_share = 0.5; break;                /* copies: 20 % of the stream */
        case LEAK: cfg.leak_min_bytes = 64e6; break;                        /* it grows 38 MB */
        case OUTLIER: cfg.tail_ratio = 4.5; break;                          /* p99 / p50 = 4 */
        case DRIFT: cfg.drift_min_growth = 0.8; break;                      /* the last third's median: +58 % */
        case THREADS: cfg.thread_imbalance = 2.5; break;                    /* max / mean = 2 */
        case RANKS: cfg.imbalance_min_share = 0.25; break;                  /* max - mean: 4.5 ms of 20 ms */
        }
        n = qk_prof_advise(&f, &cfg, adv, 16);
        CHECK(!fired(adv, n < 16 ? n : 16, rule_of[p]), "plant %s beyond its threshold still fired", rule_of[p]);
    }
    /* near misses: a copy on a kernel stream that kernels elsewhere overlap; memory that grows
       once (an allocation in the first step), not step after step */
    f = build(SERIAL);
    for (i = 0; i < 20; i++) act(QK_PROF_ACT_KERNEL, i * 1000 * US + 550 * US, i * 1000 * US + 850 * US, 3);
    f.n_acts = (size_t)n_acts;
    n = qk_prof_advise(&f, NULL, adv, 16);
    CHECK(!fired(adv, n, "serialized-copy"), "an overlapped copy on a kernel stream fired serialized-copy");
    f = build(CLEAN);
    for (i = 1; i < n_mem; i++) mem[i].device += 40e6;
    n = qk_prof_advise(&f, NULL, adv, 16);
    CHECK(n == 0, "one allocation fired %d (%s)", n, n > 0 ? adv[0].rule : "");
    /* too few steps: the loop rules stay quiet */
    f = build(SYNC);
    f.n_steps = 2;
    n = qk_prof_advise(&f, NULL, adv, 16);
    CHECK(!fired(adv, n, "sync-in-loop"), "sync-in-loop with 2 steps");
    /* the list is sorted by impact, and max bounds what is written */
    f = build(PAGEABLE);
    for (i = 0; i < n_acts; i++) if (acts[i].kind == QK_PROF_ACT_KERNEL) acts[i].end_ns = acts[i].start_ns + 4 * US;
    n = qk_prof_advise(&f, NULL, adv, 1);
    CHECK(n >= 2, "pageable + short kernels + idle: %d items", n);
    CHECK(qk_prof_advise(NULL, NULL, adv, 16) == -1, "no facts is an error");
}

/* ---- the live path: zones under an injected clock, injected activities ---- */
static uint64_t fake_now;
static uint64_t fake_clock(void *user) { (void)user; return fake_now; }

static int count_kernels_injected, count_copies_injected, count_stream7, count_stream9;

static void inject(qk_prof_activity *a)
{
    CHECK(qk_prof_activity_add(a) == 0, "qk_prof_activity_add: %s", qk_prof_last_error());
    if (a->kind == QK_PROF_ACT_KERNEL) count_kernels_injected++;
    if (a->stream == 7) count_stream7++;
    if (a->stream == 9) count_stream9++;
    if (a->kind == QK_PROF_ACT_MEMCPY) count_copies_injected++;
}

static int live(const char *dir)
{
    qk_prof_desc d;
    qk_prof_advice adv[16];
    qk_prof_act_summary sum;
    qk_prof_activity a;
    int s, k, n, rc = 0;
    memset(&d, 0, sizeof d);
    d.clock = fake_clock;
    fake_now = 0;
    CHECK(qk_prof_init(&d) == 0);
    for (s = 0; s < 30; s++) {
        double t0 = s * 1000 * US;
        fake_now = (uint64_t)t0;
        QK_PROF_BEGIN("step");
        fake_now = (uint64_t)(t0 + 100 * US);
        QK_PROF_BEGIN("launch");
        fake_now = (uint64_t)(t0 + 150 * US);
        QK_PROF_END("launch");
        fake_now = (uint64_t)(t0 + 990 * US);
        QK_PROF_END("step");
        for (k = 0; k < 40; k++) { /* 40 kernels of 6 us: launch-bound (and idle) */
            memset(&a, 0, sizeof a);
            a.kind = QK_PROF_ACT_KERNEL;
            a.name = k % 2 ? "void scatter<float>(float*, int)" : "energy_loss(float*)";
            a.zone = k % 2 ? "launch" : "step";
            a.start_ns = t0 + 100 * US + k * 8 * US;
            a.end_ns = a.start_ns + 6 * US;
            a.stream = 7;
            a.grid[0] = 128; a.grid[1] = a.grid[2] = 1;
            a.block[0] = 256; a.block[1] = a.block[2] = 1;
            a.registers = 32;
            inject(&a);
        }
        memset(&a, 0, sizeof a); /* a pageable D2H copy of 1 MiB */
        a.kind = QK_PROF_ACT_MEMCPY;
        a.zone = "step";
        a.start_ns = t0 + 500 * US;
        a.end_ns = t0 + 700 * US;
        a.stream = 9;
        a.dir = QK_PROF_D2H;
        a.src_kind = QK_PROF_MEMK_DEVICE;
        a.dst_kind = QK_PROF_MEMK_PAGEABLE;
        a.bytes = 1u << 20;
        inject(&a);
    }
    memset(&a, 0, sizeof a);
    a.kind = 99;
    CHECK(qk_prof_activity_add(&a) == -1, "an unknown kind is refused");
    qk_prof_activity_summary(&sum);
    CHECK(sum.kernels == (uint64_t)count_kernels_injected && sum.memcpys == (uint64_t)count_copies_injected,
          "summary %llu kernels %llu copies", (unsigned long long)sum.kernels, (unsigned long long)sum.memcpys);
    CHECK(sum.cupti == 0, "CUPTI not asked: %d", sum.cupti);
    n = qk_prof_get_advice(adv, 16);
    CHECK(fired(adv, n, "launch-bound") && fired(adv, n, "pageable-copy") && fired(adv, n, "gpu-idle"),
          "live: %d items", n);
    CHECK(!fired(adv, n, "sync-in-loop") && !fired(adv, n, "memory-growth") && !fired(adv, n, "serialized-copy"),
          "live: nothing planted fires");
    setenv("QK_PROF_ADVICE", "short_kernel_ns=5000,pageable_min_bytes=-1,step_zone=step", 1);
    n = qk_prof_get_advice(adv, 16);
    CHECK(!fired(adv, n, "launch-bound") && !fired(adv, n, "pageable-copy") && fired(adv, n, "gpu-idle"),
          "QK_PROF_ADVICE: %d items", n);
    unsetenv("QK_PROF_ADVICE");
    if (dir) {
        char p[4096];
        FILE *e;
        snprintf(p, sizeof p, "%s/report.json", dir); rc |= QK_PROF_WRITE_JSON(p);
        snprintf(p, sizeof p, "%s/trace.json", dir); rc |= QK_PROF_WRITE_TRACE(p);
        snprintf(p, sizeof p, "%s/report.txt", dir); rc |= QK_PROF_REPORT(p);
        snprintf(p, sizeof p, "%s/report.html", dir); rc |= QK_PROF_WRITE_HTML(p);
        snprintf(p, sizeof p, "%s/expect.json", dir);
        e = fopen(p, "w");
        if (e) {
            fprintf(e, "{\"kernels\":%d,\"memcpys\":%d,\"steps\":30,\"per_step\":{\"energy_loss(float*)\":20,"
                       "\"void scatter<float>(float*, int)\":20},\"zones\":{\"energy_loss(float*)\":\"step\","
                       "\"void scatter<float>(float*, int)\":\"launch\"},\"rules\":[\"gpu-idle\",\"launch-bound\",\"pageable-copy\"],"
                       "\"streams\":{\"7\":{\"kernels\":%d},\"9\":{\"copies\":%d}},\"copy_zone\":\"step\"}\n",
                    count_kernels_injected, count_copies_injected, count_stream7, count_stream9);
            fclose(e);
        }
        CHECK(rc == 0, "writing the reports: %s", qk_prof_last_error());
    }
    QK_PROF_SHUTDOWN();
    qk_prof_activity_summary(&sum);
    CHECK(sum.kernels == 0 && sum.kept == 0, "shutdown empties the store");
    return rc;
}

/* ---- the live path of thread-imbalance: a clock of each thread's own (thread-local), so the
   threads' zones have exact lengths while they run at once ---- */
static __thread uint64_t thread_now;
static uint64_t thread_clock(void *user) { (void)user; return thread_now; }
static pthread_barrier_t bar;
static uint64_t work_ms[3];

static void *worker(void *arg)
{
    int k = (int)(intptr_t)arg;
    char name[16];
    snprintf(name, sizeof name, "worker %d", k);
    QK_PROF_THREAD_NAME(name);
    thread_now = 0;
    QK_PROF_BEGIN("work");
    thread_now = work_ms[k] * 1000000u;
    QK_PROF_END("work");
    pthread_barrier_wait(&bar); /* all alive until all have recorded: no thread record is reused */
    return NULL;
}

static void live_threads(uint64_t a, uint64_t b, uint64_t c, int expect)
{
    qk_prof_desc d;
    qk_prof_advice adv[16];
    pthread_t th[3];
    int k, n;
    memset(&d, 0, sizeof d);
    d.clock = thread_clock;
    thread_now = 0;
    work_ms[0] = a; work_ms[1] = b; work_ms[2] = c;
    CHECK(qk_prof_init(&d) == 0);
    pthread_barrier_init(&bar, NULL, 3);
    for (k = 0; k < 3; k++) pthread_create(&th[k], NULL, worker, (void *)(intptr_t)k);
    for (k = 0; k < 3; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&bar);
    n = qk_prof_get_advice(adv, 16);
    CHECK(fired(adv, n, "thread-imbalance") == expect, "work of %llu, %llu, %llu ms: thread-imbalance %s", (unsigned long long)a,
          (unsigned long long)b, (unsigned long long)c, expect ? "should fire" : "fired");
    if (expect && n > 0)
        CHECK(strstr(adv[0].where, "\"work\"") && strstr(adv[0].where, "worker 2"), "thread-imbalance where: %s", adv[0].where);
    QK_PROF_SHUTDOWN();
}

int main(int argc, char **argv)
{
    rules();
    live_threads(10, 10, 30, 1);
    live_threads(10, 10, 10, 0);
    live(argc > 1 ? argv[1] : NULL);
    printf("prof_advice: %d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
