/* ======================================================================================== */
/* >>widen ---- states widened to interleaved doubles (qk_cuda_states) ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"

/* complex double state -> interleaved doubles (qk_cuda_states) */
template <typename T>
__global__ void qk__k_widen(const qk__cx<T> *__restrict__ in, double *__restrict__ out, int64_t count)
{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= count) return;
    out[2 * i] = (double)in[i].x;
    out[2 * i + 1] = (double)in[i].y;
}

template <typename T>
static qk_result qk__launch_widen(const qk__cx<T> *in, double *out, int64_t count, cudaStream_t st, qk__err *E)
{
    qk__k_widen<T><<<(unsigned)((count + 255) / 256), 256, 0, st>>>(in, out, count);
    QK_LAUNCH_CK("qk__k_widen");
    return QK_OK;
}

