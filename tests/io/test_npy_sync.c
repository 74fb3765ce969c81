/* The streaming .npy writer's sync and close failures (src/sink_npy.c), which no file system at
   hand fails on demand. This program defines fsync and close itself: an executable's own
   definitions bind its calls, qk's included, so they can fail on request with EIO, as a failing
   disk or a network file system reports a lost write back. Each failure must come back as
   QK_ERROR_IO naming the step ("fsync failed", "close failed"), leave no temporary file and the
   previous output as it was. With the syncer thread (the GPU engine's writer: a background fsync
   every 16 MB, writers held while 64 MB are unsynced) a failed background fsync must end the job
   at its commit, not hang the writers' wait; without a failure the syncer must have kept the
   writers within 64 MB of its last sync and the file must hold what was written. Then the same through qk_gram (the CPU
   engine's NPY output). Linux only (the real calls go through syscall(2)); elsewhere it skips. */
#define _GNU_SOURCE
#define QK_IMPLEMENTATION
#include "qk.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../qk_test.h"

#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>

static int g_fail_fsync;            /* 1: every fsync fails with EIO */
static int g_fail_close_fd = -1;    /* close of this descriptor closes it, then reports EIO (once) */
static int g_fsync_calls;

int fsync(int fd)
{
    __atomic_add_fetch(&g_fsync_calls, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g_fail_fsync, __ATOMIC_SEQ_CST)) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fsync, fd);
}

int close(int fd)
{
    const int r = (int)syscall(SYS_close, fd);
    if (r == 0 && fd >= 0 && __atomic_compare_exchange_n(&g_fail_close_fd, &fd, -1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        errno = EIO;
        return -1;
    }
    return r;
}

static char g_dir[512], g_path[600];

static void write_sentinel(void) { qk_test_write_text(g_path, "previous output"); }
static int sentinel_intact(void)
{
    char *s = qk_test_read_file(g_path, NULL);
    const int ok = s && strcmp(s, "previous output") == 0;
    free(s);
    return ok;
}
static int leftovers(void) { return qk_test_count_files(g_dir, "K.npy.tmp"); }

/* rows x cols float32 of K through the writer in blocks of 64 rows, value i * cols + j */
static qk_result write_all(qk__npyw *w, int64_t rows, int64_t cols)
{
    float *blk = (float *)malloc((size_t)64 * (size_t)cols * sizeof(float));
    qk_result r = QK_OK;
    int64_t i0, a, j;
    if (!blk) return QK_ERROR_OUT_OF_MEMORY;
    for (i0 = 0; i0 < rows && r == QK_OK; i0 += 64) {
        const int64_t m = rows - i0 < 64 ? rows - i0 : 64;
        for (a = 0; a < m; a++)
            for (j = 0; j < cols; j++) blk[a * cols + j] = (float)((i0 + a) * cols + j);
        r = qk__npyw_rows(w, i0, 0, m, cols, blk, cols);
    }
    free(blk);
    return r;
}

/* a failure at commit: the error names the step; no temporary file; the old output intact */
static void commit_fails(const char *what, int syncer, int fail_close)
{
    qk__npyw w;
    qk_result r;
    write_sentinel();
    r = qk__npyw_open(&w, g_path, QK_F32, 200, 70, 0, syncer);
    CHECK(r == QK_OK, "%s: open: %s", what, qk_last_error());
    if (r != QK_OK) return;
    CHECK(write_all(&w, 200, 70) == QK_OK, "%s: writes: %s", what, qk_last_error());
    if (fail_close) g_fail_close_fd = w.fd;
    else __atomic_store_n(&g_fail_fsync, 1, __ATOMIC_SEQ_CST);
    r = qk__npyw_commit(&w);
    __atomic_store_n(&g_fail_fsync, 0, __ATOMIC_SEQ_CST);
    g_fail_close_fd = -1;
    CHECK(r == QK_ERROR_IO && strstr(qk_last_error(), fail_close ? "close failed" : "fsync failed") &&
              strstr(qk_last_error(), strerror(EIO)),
          "%s: commit -> %d: %s", what, (int)r, qk_last_error());
    CHECK(leftovers() == 0, "%s: %d temporary files left", what, leftovers());
    CHECK(sentinel_intact(), "%s: the previous output was touched", what);
}

/* The syncer: 100 MB through it, the background fsyncs failing from the first. The writers must
   not wait forever for a sync that will not come, and the commit must report the failure although
   its own fsync succeeds (the pages a failed fsync dropped are lost). Then the same with working fsyncs: several background syncs during
   the writes, and the file holds what was written. */
static void syncer_cases(void)
{
    const int64_t rows = 6400, cols = 4096;   /* 100 MB of float32: past the 64 MB the writers may run ahead */
    qk__npyw w;
    qk_result r;
    int calls;
    write_sentinel();
    __atomic_store_n(&g_fail_fsync, 1, __ATOMIC_SEQ_CST);
    g_fsync_calls = 0;
    r = qk__npyw_open(&w, g_path, QK_F32, rows, cols, 0, 1);
    CHECK(r == QK_OK && w.syncer_on, "syncer, fsync failing: open: %s (syncer %d)", qk_last_error(), w.syncer_on);
    if (r == QK_OK) {
        const qk_result rw = write_all(&w, rows, cols);
        calls = __atomic_load_n(&g_fsync_calls, __ATOMIC_SEQ_CST);
        /* the commit's own fsync succeeds: the background failure (pages lost) must still count */
        __atomic_store_n(&g_fail_fsync, 0, __ATOMIC_SEQ_CST);
        r = qk__npyw_commit(&w);
        CHECK(rw == QK_OK, "syncer, fsync failing: the writes: %s", qk_last_error());
        CHECK(calls >= 1, "syncer, fsync failing: no background fsync ran during 100 MB of writes");
        CHECK(r == QK_ERROR_IO && strstr(qk_last_error(), "fsync failed"), "syncer, fsync failing: commit -> %d: %s", (int)r,
              qk_last_error());
        CHECK(leftovers() == 0, "syncer, fsync failing: %d temporary files left", leftovers());
        CHECK(sentinel_intact(), "syncer, fsync failing: the previous output was touched");
    }
    __atomic_store_n(&g_fail_fsync, 0, __ATOMIC_SEQ_CST);
    g_fsync_calls = 0;
    r = qk__npyw_open(&w, g_path, QK_F32, rows, cols, 0, 1);
    CHECK(r == QK_OK && w.syncer_on, "syncer: open: %s", qk_last_error());
    if (r == QK_OK) {
        uint64_t synced;
        CHECK(write_all(&w, rows, cols) == QK_OK, "syncer: the writes: %s", qk_last_error());
        calls = __atomic_load_n(&g_fsync_calls, __ATOMIC_SEQ_CST);
        qk__mutex_lock(&w.mu);
        synced = w.synced;
        qk__mutex_unlock(&w.mu);
        /* the writers never ran more than 64 MB ahead of the last finished sync (how many syncs
           that took depends on when the syncer thread ran) */
        CHECK(calls >= 1 && synced + ((uint64_t)64 << 20) >= (uint64_t)(rows * cols * 4),
              "syncer: %d background fsyncs, %.1f MB of %.1f synced before the commit", calls, (double)synced / 1048576.0,
              (double)(rows * cols * 4) / 1048576.0);
        r = qk__npyw_commit(&w);
        CHECK(r == QK_OK, "syncer: commit: %s", qk_last_error());
        if (r == QK_OK) {
            qk_array k;
            int bad = 0;
            memset(&k, 0, sizeof k);
            CHECK(qk_npy_read(g_path, &k) == QK_OK && k.rows == rows && k.cols == cols, "syncer: read back: %s", qk_last_error());
            if (k.data && k.rows == rows && k.cols == cols) {
                int64_t i;
                for (i = 0; i < rows * cols; i += 4099) bad += k.data[i] != (double)(float)i;
                bad += k.data[rows * cols - 1] != (double)(float)(rows * cols - 1);
            }
            CHECK(k.data && bad == 0, "syncer: %d sampled entries differ from what was written", bad);
            qk_array_free(&k);
        }
        CHECK(leftovers() == 0, "syncer: %d temporary files left", leftovers());
    }
}

/* qk_gram into a .npy on the CPU engine, its final fsync failing */
static void gram_case(void)
{
    qk_ctx *cpu = qk_test_cpu_ctx(1);
    qk_map *m = qk_test_parse("zz(reps=2)", 3);
    double *x = qk_test_rand_data(50, 3, 0.0, 3.0);
    qk_gram_desc g;
    qk_result r;
    memset(&g, 0, sizeof g);
    g.x = x;
    g.n_x = 50;
    g.output = QK_OUTPUT_NPY;
    g.out_path = g_path;
    write_sentinel();
    __atomic_store_n(&g_fail_fsync, 1, __ATOMIC_SEQ_CST);
    r = qk_gram(cpu, m, &g);
    __atomic_store_n(&g_fail_fsync, 0, __ATOMIC_SEQ_CST);
    CHECK(r == QK_ERROR_IO && strstr(qk_last_error(), "fsync failed"), "qk_gram NPY, fsync failing -> %d: %s", (int)r, qk_last_error());
    CHECK(leftovers() == 0 && sentinel_intact(), "qk_gram NPY, fsync failing: %d temporary files left, previous output %s", leftovers(),
          sentinel_intact() ? "intact" : "touched");
    r = qk_gram(cpu, m, &g);
    CHECK(r == QK_OK && !sentinel_intact(), "qk_gram NPY: %s", qk_last_error());
    free(x);
    qk_map_free(m);
    qk_ctx_destroy(cpu);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/qk_npy_sync_XXXXXX", getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) { printf("mkdtemp failed\n"); return 2; }
    snprintf(g_path, sizeof g_path, "%s/K.npy", g_dir);
    commit_fails("fsync at commit", 0, 0);
    commit_fails("close at commit", 0, 1);
    commit_fails("fsync at commit, syncer on", 1, 0);
    syncer_cases();
    gram_case();
    remove(g_path);
    rmdir(g_dir);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
#else
int main(void)
{
    printf("skipped: fsync and close are interposed through syscall(2) on Linux only\n");
    return 77;
}
#endif
