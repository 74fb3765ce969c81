/* Every number qk writes, under a host program's setlocale(LC_ALL, "de_DE.UTF-8") (a ','
   decimal point): the profiler's JSON, trace, HTML and text report, the autotune cache file and
   its reader, qk_plan_describe. This program writes them into DIR and checks what C can check
   (the cache round trip, plan text); tests/prof/prof_locale.py parses the rest. Exit 77 (skip) where
   the locale is not installed. Usage: prof_locale DIR */
#define QK_PROF_ENABLE
#define QK_IMPLEMENTATION
#define QK_PROF_IMPLEMENTATION
#define QK_TUNE_CACHE
#include "qk.h"

#include <locale.h>
#include <stdio.h>
#include <string.h>

#include "../qk_test.h"

static uint64_t fake_now = 1000;
static uint64_t fake_clock(void *user) { (void)user; return fake_now; }

/* A digit, a ',' and a digit: how a number looks with the German decimal point. */
static int has_decimal_comma(const char *s)
{
    for (; s[0] && s[1] && s[2]; s++)
        if (s[0] >= '0' && s[0] <= '9' && s[1] == ',' && s[2] >= '0' && s[2] <= '9') return 1;
    return 0;
}

int main(int argc, char **argv)
{
    char probe[16], path[1024], text[4096];
    qk_prof_desc desc;
    int i;
    if (argc < 2) return 2;
    if (!setlocale(LC_ALL, "de_DE.UTF-8")) {
        printf("de_DE.UTF-8 is not installed: skipped\n");
        return 77;
    }
    snprintf(probe, sizeof probe, "%.1f", 0.5);
    if (strcmp(probe, "0,5") != 0) {
        printf("de_DE.UTF-8 prints 0.5 as %s: skipped\n", probe);
        return 77;
    }

    /* ---- profiler: fractional ns per tick, so every time is a fraction ---- */
    memset(&desc, 0, sizeof desc);
    desc.clock = fake_clock;
    desc.clock_ns_per_tick = 0.43478;
    CHECK(qk_prof_init(&desc) == 0);
    QK_PROF_THREAD_NAME("main");
    for (i = 0; i < 3; i++) {
        QK_PROF_BEGIN("outer");
        fake_now += 1001;
        QK_PROF_BEGIN("inner");
        fake_now += 777;
        QK_PROF_END("inner");
        QK_PROF_COUNTER("temperature", 21.5 + i);
        QK_PROF_END("outer");
        fake_now += 333;
    }
    QK_PROF_TRANSFER("h2d", QK_PROF_H2D, 1500000, 1, 0.000125);
    {
        static char blob[3000];
        int64_t shape[2] = { 30, 100 };
        QK_PROF_TRACK_SHAPE("blob", blob, sizeof blob, "f8", 2, shape);
    }
    snprintf(path, sizeof path, "%s/report.json", argv[1]);
    CHECK(QK_PROF_WRITE_JSON(path) == 0);
    snprintf(path, sizeof path, "%s/trace.json", argv[1]);
    CHECK(QK_PROF_WRITE_TRACE(path) == 0);
    snprintf(path, sizeof path, "%s/report.html", argv[1]);
    CHECK(QK_PROF_WRITE_HTML(path) == 0);
    snprintf(path, sizeof path, "%s/report.txt", argv[1]);
    CHECK(QK_PROF_REPORT(path) == 0);

    /* ---- autotune cache: the writer and the reader ---- */
    {
        qk_tune_entry e, got;
        FILE *f;
        size_t n;
        memset(&e, 0, sizeof e);
        qk_tune_key_init(&e.key, "Gerät", 9, 0, 12080, "gram", QK_PATH_REAL, QK_PRECISION_FP32, 8);
        snprintf(e.config, sizeof e.config, "blas=0,cfg=2");
        e.metric = 0.43478;
        e.timestamp = 1700000000;
        snprintf(path, sizeof path, "%s/autotune.json", argv[1]);
        CHECK(qk_tune_cache_store(path, &e, NULL, NULL) == QK_OK);
        f = fopen(path, "rb");
        CHECK(f != NULL);
        n = f ? fread(text, 1, sizeof text - 1, f) : 0;
        if (f) fclose(f);
        text[n] = 0;
        CHECK(strstr(text, "\"metric\": 0.43478") != NULL);
        memset(&got, 0, sizeof got);
        CHECK(qk_tune_cache_lookup(path, &e.key, &got, NULL, NULL) == QK_OK);
        CHECK(got.metric == 0.43478);
        CHECK(strcmp(got.config, "blas=0,cfg=2") == 0);
    }

    /* ---- qk_plan_describe: GB figures ---- */
    {
        qk_device_info d;
        qk_gram_desc g;
        qk_map *map = NULL;
        qk_plan plan;
        static double dummy;
        memset(&d, 0, sizeof d);
        d.present = 1;
        snprintf(d.name, sizeof d.name, "test card");
        d.cc_major = 9;
        d.sm_count = 132;
        d.total_bytes = (size_t)80e9;
        d.free_bytes = (size_t)77.7e9;
        d.smem_per_block_optin = 227 * 1024;
        d.l2_bytes = 50u << 20;
        memset(&g, 0, sizeof g);
        g.x = &dummy;
        g.n_x = 12345;
        g.out = &dummy;
        CHECK(qk_map_parse("zz(reps=2)", 12, &map) == QK_OK);
        CHECK(map && qk_plan_for_device(&d, 0.85, map, &g, &plan) == QK_OK);
        if (map) {
            qk_plan_describe(&plan, text, sizeof text);
            printf("%s", text);
            CHECK(strstr(text, " GB") != NULL && strchr(text, '.') != NULL);
            CHECK(!has_decimal_comma(text));
        }
        qk_map_free(map);
    }
    QK_PROF_SHUTDOWN();
    if (qk_test_fails) fprintf(stderr, "prof_locale: %d failure(s)\n", qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
