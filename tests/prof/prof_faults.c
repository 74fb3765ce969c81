/* Allocation failures in the profiler's activity store (qk_prof_activity_add: the record array,
   the name table and its hash, the interned names) and in the reports that read it. The
   profiler's allocator (QK_PROF_MALLOC / QK_PROF_REALLOC / QK_PROF_FREE, "all or none") is a
   counting one here that fails the n-th allocation after it is armed, or every one from the
   n-th on; every n up to the run's count (from an unfailed run) is tried. Each run must end
   cleanly: no crash; the store's counts exact whatever failed (kernels, copies, syncs counted,
   kept + dropped = every record added, a record whose name could not be stored counted in
   dropped_names, which the reports give); a report either written or -1 with a message;
   after qk_prof_shutdown no block left (no leak on a failure path). */
#include "prof_fault_alloc.h"
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"

#include <stdio.h>
#include <string.h>

#include "../qk_test.h"

enum { N_ADD = 150, STORE = 48, N_NAMES = 40 };
static const char *knames[N_NAMES], *znames[5];
static char kbuf[N_NAMES][32], zbuf[5][32];

/* The records added: kernels of N_NAMES names (each a new name table entry, the hash grown
   twice), a copy every 3rd, a sync every 7th, zones of 5 names; STORE records kept. */
static void add_all(uint64_t *kernels, uint64_t *copies, uint64_t *syncs)
{
    int i;
    *kernels = *copies = *syncs = 0;
    for (i = 0; i < N_ADD; i++) {
        qk_prof_activity a;
        memset(&a, 0, sizeof a);
        a.start_ns = 1000.0 * i + 10;
        a.end_ns = a.start_ns + 500;
        a.stream = 1 + i % 3;
        a.zone = znames[i % 5];
        if (i % 7 == 6) { a.kind = QK_PROF_ACT_SYNC; a.zone = NULL; (*syncs)++; }
        else if (i % 3 == 2) { a.kind = QK_PROF_ACT_MEMCPY; a.dir = QK_PROF_H2D; a.bytes = 4096; (*copies)++; }
        else { a.kind = QK_PROF_ACT_KERNEL; a.name = knames[i % N_NAMES]; a.grid[0] = a.block[0] = 32; (*kernels)++; }
        CHECK(qk_prof_activity_add(&a) == 0, "n %ld: record %d refused: %s", fz_fail_at, i, qk_prof_last_error());
    }
}

static int write_report(qk_prof_format fmt, char **text)
{
    FILE *f = tmpfile();
    long n;
    int rc;
    *text = NULL;
    if (!f) return -2;
    rc = qk_prof_write(fmt, f);
    n = ftell(f);
    if (rc == 0 && n > 0 && (*text = (char *)malloc((size_t)n + 1)) != NULL) {
        rewind(f);
        (*text)[fread(*text, 1, (size_t)n, f)] = 0;
    }
    fclose(f);
    return rc;
}

/* One run: records added with the allocator armed in phase 0 (the store) or 1 (the reports). */
static long run(int phase, long fail_at, int from, int *lost_names)
{
    qk_prof_desc d;
    qk_prof_act_summary s;
    uint64_t kernels, copies, syncs;
    int k, rc;
    long count;
    char *text;
    memset(&d, 0, sizeof d);
    d.cupti_records = STORE;
    fz_count = 0;
    fz_fail_at = fail_at;
    fz_from = from;
    CHECK(qk_prof_init(&d) == 0);
    QK_PROF_BEGIN("outer");
    QK_PROF_BEGIN("inner");
    QK_PROF_END("inner");
    fz_armed = phase == 0;
    add_all(&kernels, &copies, &syncs);
    fz_armed = 0;
    QK_PROF_END("outer");
    qk_prof_activity_summary(&s);
    /* the counts are exact whatever failed */
    CHECK(s.kernels == kernels && s.memcpys == copies && s.syncs == syncs, "n %ld%s: counts %llu %llu %llu, added %llu %llu %llu",
          fail_at, from ? "+" : "", (unsigned long long)s.kernels, (unsigned long long)s.memcpys, (unsigned long long)s.syncs,
          (unsigned long long)kernels, (unsigned long long)copies, (unsigned long long)syncs);
    CHECK(s.kept + s.dropped == (uint64_t)N_ADD && s.kept <= STORE, "n %ld%s: kept %llu + dropped %llu != %d (store %d)", fail_at,
          from ? "+" : "", (unsigned long long)s.kept, (unsigned long long)s.dropped, N_ADD, STORE);
    CHECK(fail_at > 0 || (s.kept == STORE && s.dropped_names == 0), "unfailed: the store full (%llu), no name lost",
          (unsigned long long)s.kept);
    *lost_names = (int)s.dropped_names;
    fz_armed = phase == 1;
    for (k = QK_PROF_TEXT; k <= QK_PROF_HTML; k++) {
        rc = write_report((qk_prof_format)k, &text);
        CHECK(rc == 0 || (rc == -1 && qk_prof_last_error()[0]), "n %ld%s: report %d: rc %d, message '%s'", fail_at, from ? "+" : "", k,
              rc, qk_prof_last_error());
        CHECK(fail_at > 0 || rc == 0, "unfailed: report %d written", k);
        if (k == QK_PROF_TEXT && text && phase == 0) {
            /* records whose name was lost: the report says how many */
            char note[96];
            snprintf(note, sizeof note, "names not stored (out of memory) %llu", (unsigned long long)s.dropped_names);
            CHECK(!s.dropped_names || strstr(text, note), "n %ld%s: %llu names lost, the report says so", fail_at,
                  from ? "+" : "", (unsigned long long)s.dropped_names);
            CHECK(strstr(text, knames[0]) || s.dropped_names, "n %ld: the report names the kernels", fail_at);
        }
        free(text);
    }
    fz_armed = 0;
    count = fz_count;
    qk_prof_shutdown();
    CHECK(fz_live == 0, "n %ld%s (phase %d): %ld blocks left after qk_prof_shutdown", fail_at, from ? "+" : "", phase, fz_live);
    fz_live = 0;
    return count;
}

int main(void)
{
    int phase, from, i, lost, any_lost = 0;
    for (i = 0; i < N_NAMES; i++) {
        snprintf(kbuf[i], sizeof kbuf[i], "kernel_%02d", i);
        knames[i] = kbuf[i];
    }
    for (i = 0; i < 5; i++) {
        snprintf(zbuf[i], sizeof zbuf[i], "zone_%d", i);
        znames[i] = zbuf[i];
    }
    for (phase = 0; phase < 2; phase++) {
        long total = run(phase, 0, 0, &lost), n;
        CHECK(total > (phase == 0 ? N_NAMES : 10), "phase %d: %ld allocations armed (a test of nothing otherwise)", phase, total);
        for (from = 0; from < 2; from++)
            for (n = 1; n <= total + 1; n++) {
                run(phase, n, from, &lost);
                any_lost |= lost > 0;
            }
        printf("prof_faults: phase %d (%s): %ld allocations, each failed once and from there on\n", phase,
               phase == 0 ? "qk_prof_activity_add" : "the reports", total);
    }
    CHECK(any_lost, "some failure lost a name (the name path was exercised)");
    if (qk_test_fails) { fprintf(stderr, "%d failure(s)\n", qk_test_fails); return 1; }
    printf("prof_faults: all checks passed\n");
    return 0;
}
