/* qk_prof with QK_PROF_MPI under mpirun (tests/prof_mpi.py runs it on 3 ranks and checks the
   files): each rank does different work (rank r: "work" 3 (r + 1) times, "only_rank1" on rank 1
   alone, "common" everywhere, a step loop), starts its profiler r x 400 ms after rank 0 (so
   unaligned clocks would be far apart), writes its own report (qk_prof_write_file_local) and
   then the collective reports, whose rank-0 files hold every rank. A collective write that fails
   on rank 0 fails on every rank with rank 0's message. Usage: mpirun -n R prof_mpi DIR */
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#define QK_PROF_MPI
#include "qk_prof.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int fails;
#define EXPECT(c) do { if (!(c)) { fprintf(stderr, "rank %d: FAIL %s:%d: %s (%s)\n", rank, __FILE__, __LINE__, #c, qk_prof_last_error()); fails++; } } while (0)

static void spin_ms(double ms)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do clock_gettime(CLOCK_MONOTONIC, &b);
    while ((double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6 < ms);
}

int main(int argc, char **argv)
{
    int rank, size, i, all;
    char path[1024];
    const char *dir = argc > 1 ? argv[1] : ".";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    {   /* profiler origins r x 400 ms apart */
        struct timespec ts = { (time_t)((400 * rank) / 1000), 400000000L * rank % 1000000000L };
        nanosleep(&ts, NULL);
    }
    EXPECT(qk_prof_init(NULL) == 0); /* collective: the first clock offsets */
    for (i = 0; i < 10; i++) {
        int k;
        QK_PROF_STEP(i);
        QK_PROF_BEGIN("common");
        spin_ms(0.5);
        QK_PROF_END("common");
        if (i < 3 * (rank + 1)) { QK_PROF_BEGIN("work"); spin_ms(1.0 + rank); QK_PROF_END("work"); }
        if (rank == 1) { QK_PROF_BEGIN("only_rank1"); spin_ms(0.3); QK_PROF_END("only_rank1"); }
        for (k = 0; k < rank; k++) { QK_PROF_BEGIN("inner"); spin_ms(0.1); QK_PROF_END("inner"); }
    }
    QK_PROF_STEP_END();
    MPI_Barrier(MPI_COMM_WORLD);
    QK_PROF_BEGIN("after_barrier");
    spin_ms(0.2);
    QK_PROF_END("after_barrier");

    snprintf(path, sizeof path, "%s/rank%d.json", dir, rank);
    EXPECT(qk_prof_write_file_local(QK_PROF_JSON, path) == 0);
    snprintf(path, sizeof path, "%s/rank%d_trace.json", dir, rank);
    EXPECT(qk_prof_write_file_local(QK_PROF_TRACE, path) == 0);

    snprintf(path, sizeof path, "%s/merged.json", dir);
    EXPECT(QK_PROF_WRITE_JSON(path) == 0);
    snprintf(path, sizeof path, "%s/merged_trace.json", dir);
    EXPECT(QK_PROF_WRITE_TRACE(path) == 0);
    snprintf(path, sizeof path, "%s/merged.html", dir);
    EXPECT(QK_PROF_WRITE_HTML(path) == 0);
    snprintf(path, sizeof path, "%s/merged.txt", dir);
    EXPECT(QK_PROF_REPORT(path) == 0);
    /* rank 0 cannot write: every rank gets -1 and rank 0's message */
    EXPECT(QK_PROF_WRITE_JSON("/nonexistent-dir/x/merged.json") == -1);
    if (rank != 0) EXPECT(strncmp(qk_prof_last_error(), "rank 0: ", 8) == 0);
    qk_prof_shutdown();
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) fprintf(stderr, "prof_mpi: %s\n", all ? "FAIL" : "ok");
    MPI_Finalize();
    return all ? 1 : 0;
}
