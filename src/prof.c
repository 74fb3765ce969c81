/* >>prof_impl ---- qk's own profiler zones (qk_prof.h; nothing without QK_PROF_ENABLE) ---- */
/* qk instruments its own pipeline (zones "qk_gram", "validate", "plan", "states", "gram tile",
   counters "tiles"); build with -DQK_PROF_ENABLE to record them (docs/profiler.md). The rule
   for the two implementation defines is in the documentation block at the top. */
#if defined(QK_PROF_ENABLE)
#if !defined(QK_PROF_IMPLEMENTATION)
#error "qk.h: QK_PROF_ENABLE with QK_IMPLEMENTATION: define QK_PROF_IMPLEMENTATION in this file too, before including qk.h, and in no other file (qk.h, 'The profiler and the two implementation defines')"
#endif
#if defined(QK_CUDA) && QK_CUDA && !defined(QK_PROF_CUDA)
#define QK_PROF_CUDA
#endif
#include "qk_prof.h"
#elif defined(QK_PROF_H)
/* qk_prof.h already included: its disabled macros serve */
#elif defined(__has_include)
#if __has_include("qk_prof.h")
#include "qk_prof.h"
#endif
#endif
#if !defined(QK_PROF_ENABLE) && !defined(QK_PROF_H)
/* qk.h alone (no qk_prof.h): the zone macros qk uses compile to nothing. The replacement lists
   are qk_prof.h's disabled ones, token for token, so a later include of qk_prof.h redefines them
   identically (no warning). */
#define QK_PROF_ENABLED 0
#define QK_PROF_U_(x) ((void)sizeof(x))
#define QK_PROF_BEGIN(name) QK_PROF_U_(name)
#define QK_PROF_END(name) QK_PROF_U_(name)
#define QK_PROF_THREAD_NAME(name) QK_PROF_U_(name)
#define QK_PROF_COUNTER(name, value) (QK_PROF_U_(name), QK_PROF_U_(value))
#define QK_PROF_COUNT(name, delta) (QK_PROF_U_(name), QK_PROF_U_(delta))
#define QK_PROF_TRACK(name, ptr, bytes) (QK_PROF_U_(name), QK_PROF_U_(ptr), QK_PROF_U_(bytes))
#define QK_PROF_UNTRACK(ptr) QK_PROF_U_(ptr)
#endif
/* The CUDA engine's GPU zones go to the profiler through this table (qk_cuda_io.prof), set only
   where the profiler is on: the one libqk_cuda serves programs with and without it. */
#if defined(QK_CUDA) && QK_CUDA && defined(QK_PROF_ENABLE)
static const qk_cuda_prof_hooks qk__prof_cuda_hooks = {qk_prof_gpu_begin, qk_prof_gpu_end, qk_prof_stream_name,
                                                       qk_prof_track, qk_prof_untrack, qk_prof_counter};
#define QK__PROF_CUDA_HOOKS (&qk__prof_cuda_hooks)
#else
#define QK__PROF_CUDA_HOOKS NULL
#endif

