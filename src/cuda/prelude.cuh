/* The engine's includes and the profiler's GPU-zone macros: the first thing every operation's file (src/cuda/, .cuh)
   includes, so each operation's file compiles alone (tests/tu_compile.py --cuda), and the top of
   the generated qk_cuda.cu. */
#pragma once
#include <cuda.h> /* types only (CUtensorMap); the driver's functions are reached through cudaGetDriverEntryPointByVersion */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <chrono>
#include <new>
#include <thread>
#include <vector>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include "qk.h"
/* Profiler zones (qk_prof.h's types): this file is compiled once, without the profiler. The
   pipeline's GPU zones, tracked buffers and stream names go through the table qk.h hands over in
   qk_cuda_io.prof (its implementation sets it where it is built with QK_PROF_ENABLE; NULL: no
   zones), so the one libqk_cuda serves programs with and without the profiler, and a program
   without it links no profiler symbols. J: the job (qk__job_state), whose prof is that table. */
#include "qk_prof.h"
#define QK__GZ_SITE_(var, name, kind) static qk_prof_site var = {name, __FILE__, __LINE__, kind, 0}
#define QK__GZ_GPU_BEGIN(J, name, stream) \
    do { if ((J)->prof) { QK__GZ_SITE_(qk__gz_site_, name, QK_PROF_SITE_GPU); \
                          (J)->prof->gpu_begin(&qk__gz_site_, (void *)(stream)); } } while (0)
#define QK__GZ_GPU_END(J, name, stream) do { if ((J)->prof) (J)->prof->gpu_end(name, (void *)(stream)); } while (0)
#define QK__GZ_STREAM_NAME(J, stream, name) \
    do { if ((J)->prof) (J)->prof->stream_name((void *)(stream), name); } while (0)
#define QK__GZ_TRACK(J, name, ptr, bytes) \
    do { if ((J)->prof) (J)->prof->track(name, (const void *)(ptr), bytes, NULL, 0, NULL); } while (0)
#define QK__GZ_UNTRACK(J, ptr) do { if ((J)->prof) (J)->prof->untrack((const void *)(ptr)); } while (0)
#define QK__GZ_COUNT(J, name, delta) \
    do { if ((J)->prof) { QK__GZ_SITE_(qk__gz_site_, name, QK_PROF_SITE_COUNTER); \
                          (J)->prof->counter(&qk__gz_site_, (double)(delta), 1); } } while (0)

