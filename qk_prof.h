/* qk_prof.h — placeholder; the profiler lands with its issue. */
#ifndef QK_PROF_H
#define QK_PROF_H
#endif
