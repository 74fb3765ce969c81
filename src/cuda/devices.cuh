#pragma once
#include "base.cuh"
/* >>devices ---- device selection and a clock for qk.h's several-GPU driver ---- */
/* qk.h drives one host thread per GPU of a context (docs/api.md, "Several GPUs"); each thread
   makes its GPU current with this, then runs qk_cuda_gram on its parts of K. */
extern "C" qk_result qk_cuda_set_device(int ordinal, char *err, size_t err_size)
{
    cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess) {
        if (err && err_size) snprintf(err, err_size, "cudaSetDevice(%d): %s", ordinal, cudaGetErrorString(e));
        cudaGetLastError();
        return QK_ERROR_NO_DEVICE;
    }
    return QK_OK;
}

/* A monotonic clock in seconds (qk.h compiles as strict C99, where clock_gettime is hidden): when
   each GPU's thread finished its share (qk_ctx_device_seconds). */
extern "C" double qk_cuda_wtime(void)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

