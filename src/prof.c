#include "qk_internal.h"
/* >>prof_impl ---- qk's own profiler zones (qk_prof.h; nothing without QK_PROF_ENABLE; the zone macros: qk_internal.h) ---- */
/* qk instruments its own pipeline (zones "qk_gram", "validate", "plan", "states", "gram tile",
   counters "tiles"); build with -DQK_PROF_ENABLE to record them (docs/profiler.md). The rule
   for the two implementation defines is in the documentation block at the top. */
/* The CUDA engine's GPU zones go to the profiler through this table (qk_cuda_io.prof), set only
   where the profiler is on: the one libqk_cuda serves programs with and without it. */
#if defined(QK_CUDA) && QK_CUDA && defined(QK_PROF_ENABLE)
QK__PRIV const qk_cuda_prof_hooks qk__prof_cuda_hooks = {qk_prof_gpu_begin, qk_prof_gpu_end, qk_prof_stream_name,
                                                       qk_prof_track, qk_prof_untrack, qk_prof_counter};
#endif

