/* qk_cuda.cu — the CUDA engine of qk (placeholder: device query only; kernels follow). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include "qk.h"

extern "C" int qk_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}

extern "C" qk_result qk_cuda_device_query(int device, qk_device_info *info, char *err, size_t err_size)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        if (err) snprintf(err, err_size, "cudaGetDeviceProperties(%d): %s", device, cudaGetErrorString(e));
        return QK_ERROR_NO_DEVICE;
    }
    memset(info, 0, sizeof *info);
    info->present = 1;
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->smem_per_block_optin = p.sharedMemPerBlockOptin;
    info->l2_bytes = (size_t)p.l2CacheSize;
    cudaSetDevice(device);
    cudaMemGetInfo(&info->free_bytes, &info->total_bytes);
    return QK_OK;
}

extern "C" qk_result qk_cuda_gram(const qk_plan *, const qk_map *, const qk_gram_desc *, char *err, size_t err_size)
{
    if (err) snprintf(err, err_size, "the CUDA Gram engine is not built yet");
    return QK_ERROR_UNSUPPORTED;
}

extern "C" qk_result qk_cuda_states(const qk_map *, const double *, int64_t, qk_precision, double *, char *err, size_t err_size)
{
    if (err) snprintf(err, err_size, "the CUDA state engine is not built yet");
    return QK_ERROR_UNSUPPORTED;
}
