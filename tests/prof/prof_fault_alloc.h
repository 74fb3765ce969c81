/* The counting allocator the profiler's fault tests give qk_prof.h (tests/prof/prof_faults.c,
   tests/mpi/prof_faults_mpi.c): included before qk_prof.h, it routes QK_PROF_MALLOC / REALLOC /
   FREE through fz_*. While fz_armed, allocation number fz_fail_at fails (and every later one
   when fz_from); fz_count counts the allocations, fz_live the blocks not yet freed. */
#ifndef PROF_FAULT_ALLOC_H
#define PROF_FAULT_ALLOC_H
#include <stddef.h>
#include <stdlib.h>

static long fz_count, fz_fail_at, fz_live;
static int fz_armed, fz_from; /* fz_from: fail every allocation from fz_fail_at on */

static int fz_fail(void)
{
    if (!fz_armed) return 0;
    fz_count++;
    return fz_fail_at > 0 && (fz_count == fz_fail_at || (fz_from && fz_count > fz_fail_at));
}
static void *fz_malloc(size_t n)
{
    void *p = fz_fail() ? NULL : malloc(n);
    if (p) fz_live++;
    return p;
}
static void *fz_realloc(void *q, size_t n)
{
    void *p = fz_fail() ? NULL : realloc(q, n);
    if (p && !q) fz_live++;
    return p;
}
static void fz_free(void *p)
{
    if (p) fz_live--;
    free(p);
}

#define QK_PROF_MALLOC(sz) fz_malloc(sz)
#define QK_PROF_REALLOC(p, sz) fz_realloc(p, sz)
#define QK_PROF_FREE(p) fz_free(p)
#endif
