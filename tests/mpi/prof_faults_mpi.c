/* Allocation failures in qk_prof's MPI-wide reports (QK_PROF_MPI) under mpirun -n 2: on one
   rank (each in turn) the profiler's allocator fails the n-th allocation of the collective
   report calls, or every one from the n-th on, for every n up to that rank's count. Every run
   must end on every rank (no rank left in a collective the others skipped: a hang is caught by
   alarm), with the same result on every rank (0, or -1 and a message), 0 when nothing failed;
   a report written holds every rank (a rank that could not build its part fails the report,
   it is not left out); no block is left after qk_prof_shutdown. tests/mpi/prof_faults_mpi.py runs it. */
#include "../prof/prof_fault_alloc.h"
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#define QK_PROF_MPI
#include "qk_prof.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int rank, fails;
#define EXPECT(c, ...) do { if (!(c)) { fprintf(stderr, "rank %d: FAIL %s:%d: %s: ", rank, __FILE__, __LINE__, #c); \
                                         fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); fails++; } } while (0)

/* One run: the victim rank's allocator armed around the collective reports (text, trace). */
static long run(int victim, long fail_at, int from)
{
    int fmt, rc, lo, hi;
    long count;
    qk_prof_activity a;
    fz_count = 0;
    fz_fail_at = fail_at;
    fz_from = from;
    EXPECT(qk_prof_init(NULL) == 0, "%s", qk_prof_last_error());
    QK_PROF_BEGIN("work");
    QK_PROF_BEGIN("inner");
    QK_PROF_END("inner");
    QK_PROF_END("work");
    memset(&a, 0, sizeof a);
    a.kind = QK_PROF_ACT_KERNEL;
    a.name = "kernel";
    a.start_ns = 100;
    a.end_ns = 900;
    qk_prof_activity_add(&a);
    fz_armed = rank == victim;
    for (fmt = QK_PROF_TEXT; fmt <= QK_PROF_TRACE; fmt += QK_PROF_TRACE - QK_PROF_TEXT) {
        FILE *f = tmpfile();
        rc = qk_prof_write((qk_prof_format)fmt, f);
        if (f && rc == 0 && rank == 0 && fmt == QK_PROF_TEXT) {
            /* a report written holds every rank: the zone "work" on all of them */
            static char text[1 << 16];
            const char *w;
            int ranks = -1;
            size_t got;
            rewind(f);
            got = fread(text, 1, sizeof text - 1, f);
            text[got] = 0;
            w = strstr(text, "\nwork ");
            if (w) sscanf(w + 1, "%*s %*s %d", &ranks);
            EXPECT(ranks == 2, "victim %d, n %ld%s: a text report written without every rank (zone work on %d ranks)", victim,
                   fail_at, from ? "+" : "", ranks);
        }
        if (f) fclose(f);
        lo = hi = rc;
        MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        EXPECT(rc == 0 || (rc == -1 && qk_prof_last_error()[0]), "victim %d, n %ld%s, format %d: rc %d '%s'", victim, fail_at,
               from ? "+" : "", fmt, rc, qk_prof_last_error());
        EXPECT(lo == hi, "victim %d, n %ld%s, format %d: the ranks disagree (%d, %d)", victim, fail_at, from ? "+" : "", fmt, lo, hi);
        EXPECT(fail_at > 0 || rc == 0, "unfailed, format %d: rc %d '%s'", fmt, rc, qk_prof_last_error());
    }
    fz_armed = 0;
    count = fz_count;
    qk_prof_shutdown();
    EXPECT(fz_live == 0, "victim %d, n %ld%s: %ld blocks left after qk_prof_shutdown", victim, fail_at, from ? "+" : "", fz_live);
    fz_live = 0;
    return count;
}

int main(int argc, char **argv)
{
    int size, victim, from, all;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    alarm(240); /* a rank stuck in a collective: SIGALRM ends the job */
    for (victim = 0; victim < size; victim++) {
        long total = run(victim, 0, 0), n;
        MPI_Bcast(&total, 1, MPI_LONG, victim, MPI_COMM_WORLD);
        EXPECT(total > 10, "victim %d: %ld allocations armed", victim, total);
        for (from = 0; from < 2; from++)
            for (n = 1; n <= total + 1; n++) run(victim, n, from);
        if (rank == 0) printf("prof_faults_mpi: rank %d: %ld allocations, each failed once and from there on\n", victim, total);
    }
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf(all ? "prof_faults_mpi: %d failure(s)\n" : "prof_faults_mpi: all checks passed\n", all);
    MPI_Finalize();
    return all ? 1 : 0;
}
