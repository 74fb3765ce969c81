/* The CUPTI record prefixes qk_prof.h declares (it reads CUPTI's buffers without its headers)
   against the installed cupti_activity.h: every field the profiler reads sits at the same offset
   in the toolkit's current record versions. A compile-time check; the program only says so. */
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#define QK_PROF_CUDA
#include "qk_prof.h"
#include <cupti_activity.h>
#include <cupti_version.h>
#include <stddef.h>

#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 K;
typedef CUpti_ActivityMemcpy6 C;
typedef CUpti_ActivitySynchronization2 S;
#else
typedef CUpti_ActivityKernel9 K;
typedef CUpti_ActivityMemcpy5 C;
typedef CUpti_ActivitySynchronization S;
#endif
typedef CUpti_ActivityMemset4 M;

#define SAME(T, f, Q, g) _Static_assert(offsetof(T, f) == offsetof(Q, g) && sizeof(((T *)0)->f) == sizeof(((Q *)0)->g), #T "." #f)
SAME(K, kind, qk__cupti_kernel, kind);
SAME(K, registersPerThread, qk__cupti_kernel, registers_per_thread);
SAME(K, start, qk__cupti_kernel, start);
SAME(K, end, qk__cupti_kernel, end);
SAME(K, deviceId, qk__cupti_kernel, device_id);
SAME(K, contextId, qk__cupti_kernel, context_id);
SAME(K, streamId, qk__cupti_kernel, stream_id);
SAME(K, gridX, qk__cupti_kernel, grid_x);
SAME(K, gridZ, qk__cupti_kernel, grid_z);
SAME(K, blockX, qk__cupti_kernel, block_x);
SAME(K, blockZ, qk__cupti_kernel, block_z);
SAME(K, staticSharedMemory, qk__cupti_kernel, static_shared_memory);
SAME(K, dynamicSharedMemory, qk__cupti_kernel, dynamic_shared_memory);
SAME(K, correlationId, qk__cupti_kernel, correlation_id);
SAME(K, name, qk__cupti_kernel, name);
SAME(C, copyKind, qk__cupti_memcpy, copy_kind);
SAME(C, srcKind, qk__cupti_memcpy, src_kind);
SAME(C, dstKind, qk__cupti_memcpy, dst_kind);
SAME(C, flags, qk__cupti_memcpy, flags);
SAME(C, bytes, qk__cupti_memcpy, bytes);
SAME(C, start, qk__cupti_memcpy, start);
SAME(C, end, qk__cupti_memcpy, end);
SAME(C, deviceId, qk__cupti_memcpy, device_id);
SAME(C, contextId, qk__cupti_memcpy, context_id);
SAME(C, streamId, qk__cupti_memcpy, stream_id);
SAME(C, correlationId, qk__cupti_memcpy, correlation_id);
SAME(M, bytes, qk__cupti_memset, bytes);
SAME(M, start, qk__cupti_memset, start);
SAME(M, end, qk__cupti_memset, end);
SAME(M, deviceId, qk__cupti_memset, device_id);
SAME(M, contextId, qk__cupti_memset, context_id);
SAME(M, streamId, qk__cupti_memset, stream_id);
SAME(M, correlationId, qk__cupti_memset, correlation_id);
SAME(M, flags, qk__cupti_memset, flags);
SAME(M, memoryKind, qk__cupti_memset, memory_kind);
SAME(S, type, qk__cupti_sync, type);
SAME(S, start, qk__cupti_sync, start);
SAME(S, end, qk__cupti_sync, end);
SAME(S, correlationId, qk__cupti_sync, correlation_id);
SAME(S, contextId, qk__cupti_sync, context_id);
SAME(S, streamId, qk__cupti_sync, stream_id);
SAME(CUpti_ActivityExternalCorrelation, externalKind, qk__cupti_extcorr, external_kind);
SAME(CUpti_ActivityExternalCorrelation, externalId, qk__cupti_extcorr, external_id);
SAME(CUpti_ActivityExternalCorrelation, correlationId, qk__cupti_extcorr, correlation_id);
SAME(CUpti_ActivityAPI, cbid, qk__cupti_api, cbid);
SAME(CUpti_ActivityAPI, start, qk__cupti_api, start);
SAME(CUpti_ActivityAPI, end, qk__cupti_api, end);
SAME(CUpti_ActivityAPI, threadId, qk__cupti_api, thread_id);
SAME(CUpti_ActivityAPI, correlationId, qk__cupti_api, correlation_id);
#define EQ(a, b) ((int)(a) == (int)(b))
_Static_assert(EQ(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, QK__CUPTI_CONCURRENT_KERNEL) && EQ(CUPTI_ACTIVITY_KIND_MEMCPY, QK__CUPTI_MEMCPY) &&
               EQ(CUPTI_ACTIVITY_KIND_MEMSET, QK__CUPTI_MEMSET) && EQ(CUPTI_ACTIVITY_KIND_RUNTIME, QK__CUPTI_RUNTIME) &&
               EQ(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, QK__CUPTI_SYNCHRONIZATION) &&
               EQ(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, QK__CUPTI_EXTERNAL_CORRELATION) &&
               EQ(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, QK__CUPTI_EXT_CUSTOM0) &&
               EQ(CUPTI_ERROR_MAX_LIMIT_REACHED, QK__CUPTI_MAX_LIMIT_REACHED) &&
               EQ(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED, QK__CUPTI_FLUSH_FORCED) && EQ(CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC, 1) &&
               EQ(CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC, 1) && EQ(CUPTI_CB_DOMAIN_RUNTIME_API, QK__CUPTI_CB_DOMAIN_RUNTIME) &&
               EQ(CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE, QK_PROF_MEMK_PAGEABLE) && EQ(CUPTI_ACTIVITY_MEMORY_KIND_PINNED, QK_PROF_MEMK_PINNED) &&
               EQ(CUPTI_ACTIVITY_MEMORY_KIND_MANAGED, QK_PROF_MEMK_MANAGED) &&
               EQ(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE, QK_PROF_SYNC_DEVICE) &&
               EQ(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT, QK_PROF_SYNC_STREAM_WAIT), "CUPTI's constants");

int main(void)
{
    printf("prof_cupti_layout: qk_prof.h's CUPTI records match cupti_activity.h (CUPTI API %d)\n", CUPTI_API_VERSION);
    return 0;
}
