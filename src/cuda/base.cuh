#pragma once
#include "prelude.cuh"
/* ---- cuBLAS, opened on first use ---- */
/* cuBLAS is opened with dlopen when the engine first creates a cuBLAS handle, not linked: a
   program linked with -lcublas maps and relocates libcublas and libcublasLt (about 600 MB of
   libraries) at start, so `qk-gram --version` took 200 MB of RSS and every CPU-only run paid it
   (issue 16); now they take a few MB. The table holds the functions this file calls; the macros
   after it send every call through the table (cublasCreate_v2 opens the library first). The
   library is the toolkit's SONAME (libcublas.so.<CUBLAS_VER_MAJOR>, which brings libcublasLt),
   found the way the dynamic loader finds libraries (LD_LIBRARY_PATH, ld.so.cache, the program's
   RUNPATH), then in QK_CUBLAS_DIR when that is defined. Define QK_CUBLAS_LINKED to call cuBLAS
   directly instead (and link -lcublas, or cuBLAS's static library). docs/vendoring.md. */
#ifndef QK_CUBLAS_LINKED
#include <dlfcn.h>
#include <mutex>
#define QK__CUBLAS_STR2(x) #x
#define QK__CUBLAS_STR(x) QK__CUBLAS_STR2(x)
#define QK__CUBLAS_SONAME "libcublas.so." QK__CUBLAS_STR(CUBLAS_VER_MAJOR)
/* cublasGemmEx has a C++ overload in cublas_api.h (cudaDataType compute type): name the type */
typedef cublasStatus_t (*qk__cublas_gemmex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                               const void *, const void *, cudaDataType, int, const void *, cudaDataType,
                                               int, const void *, void *, cudaDataType, int, cublasComputeType_t,
                                               cublasGemmAlgo_t);
#define QK__CUBLAS_FNS(X)                                                                                    \
    X(cublasCreate_v2, decltype(&::cublasCreate_v2)) X(cublasDestroy_v2, decltype(&::cublasDestroy_v2))     \
    X(cublasSetStream_v2, decltype(&::cublasSetStream_v2)) X(cublasGemmEx, qk__cublas_gemmex_fn)            \
    X(cublasCgemm_v2, decltype(&::cublasCgemm_v2)) X(cublasCgemm3m, decltype(&::cublasCgemm3m))             \
    X(cublasZgemm_v2, decltype(&::cublasZgemm_v2)) X(cublasSgemm_v2, decltype(&::cublasSgemm_v2))           \
    X(cublasDgemm_v2, decltype(&::cublasDgemm_v2)) X(cublasCherk_v2, decltype(&::cublasCherk_v2))           \
    X(cublasZherk_v2, decltype(&::cublasZherk_v2)) X(cublasSsyrk_v2, decltype(&::cublasSsyrk_v2))           \
    X(cublasDsyrk_v2, decltype(&::cublasDsyrk_v2))
struct qk__cublas_table {
#define QK__CUBLAS_FIELD(f, T) T f;
    QK__CUBLAS_FNS(QK__CUBLAS_FIELD)
#undef QK__CUBLAS_FIELD
};
static qk__cublas_table qk__cublas;
static char qk__cublas_err[512];
static bool qk__cublas_ok = false;
static std::once_flag qk__cublas_once;

static void qk__cublas_open()
{
    const char *e;
    void *h = dlopen(QK__CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(qk__cublas_err, sizeof qk__cublas_err, "%s", (e = dlerror()) ? e : "dlopen failed");
#ifdef QK_CUBLAS_DIR
        h = dlopen(QK_CUBLAS_DIR "/" QK__CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
    }
    if (!h) {
        char why[300];   /* the loader's reason, cut to leave room for the rest of the message */
        snprintf(why, sizeof why, "%.299s", qk__cublas_err);
        snprintf(qk__cublas_err, sizeof qk__cublas_err,
                 "cannot load cuBLAS (%s, CUDA %d) for the GPU engine: %s; install it or add its directory to LD_LIBRARY_PATH",
                 QK__CUBLAS_SONAME, CUBLAS_VER_MAJOR, why);
        return;
    }
#define QK__CUBLAS_SYM(f, T)                                                                                  \
    if (!(qk__cublas.f = (T)dlsym(h, #f))) {                                                                 \
        snprintf(qk__cublas_err, sizeof qk__cublas_err, "cuBLAS (%s) has no %s: an older cuBLAS than the headers", \
                 QK__CUBLAS_SONAME, #f);                                                                     \
        return;                                                                                               \
    }
    QK__CUBLAS_FNS(QK__CUBLAS_SYM)
#undef QK__CUBLAS_SYM
    qk__cublas_err[0] = 0;
    qk__cublas_ok = true;   /* the handle stays open for the process */
}

/* cublasCreate through the table, opening the library once (thread-safe); a library that does
   not open is CUBLAS_STATUS_NOT_INITIALIZED, with qk__cublas_err saying why. */
static cublasStatus_t qk__cublas_create(cublasHandle_t *h)
{
    std::call_once(qk__cublas_once, qk__cublas_open);
    if (!qk__cublas_ok) return CUBLAS_STATUS_NOT_INITIALIZED;
    return qk__cublas.cublasCreate_v2(h);
}
static const char *qk__cublas_detail(void) { return qk__cublas_err; }
#define cublasCreate_v2 qk__cublas_create
#define cublasDestroy_v2 qk__cublas.cublasDestroy_v2
#define cublasSetStream_v2 qk__cublas.cublasSetStream_v2
#define cublasGemmEx qk__cublas.cublasGemmEx
#define cublasCgemm_v2 qk__cublas.cublasCgemm_v2
#define cublasCgemm3m qk__cublas.cublasCgemm3m
#define cublasZgemm_v2 qk__cublas.cublasZgemm_v2
#define cublasSgemm_v2 qk__cublas.cublasSgemm_v2
#define cublasDgemm_v2 qk__cublas.cublasDgemm_v2
#define cublasCherk_v2 qk__cublas.cublasCherk_v2
#define cublasZherk_v2 qk__cublas.cublasZherk_v2
#define cublasSsyrk_v2 qk__cublas.cublasSsyrk_v2
#define cublasDsyrk_v2 qk__cublas.cublasDsyrk_v2
#else
static const char *qk__cublas_detail(void) { return ""; }
#endif /* QK_CUBLAS_LINKED */
/* ---- end cuBLAS ---- */

/* ---- fault injection (tests) ---- */
/* Compiled only under QK_TEST_FAULTS (the GPU test programs' build of this file: tests/meson.build);
   the product build calls the CUDA runtime directly and has none of these hooks.
   qk_cuda_test_fail_alloc(k): the k-th resource acquisition from now on (cudaMalloc,
   cudaMallocHost, cudaStreamCreateWithFlags, cudaEventCreate[WithFlags], cublasCreate) fails as
   if out of memory (k < 0: the -k-th and every later one, so retries fail too); 0 turns it off. qk_cuda_test_alloc_count() counts the acquisitions so far,
   so that a test can fail each one of a job in turn (tests/gpu/test_gpu_engine.cpp). A test
   hook: not for concurrent use. The macros below route this file's calls through it. */
#ifdef QK_TEST_FAULTS
static int qk__fault_at = 0, qk__fault_seen = 0;
static bool qk__fault_persist = false;
static bool qk__fault_hit(void)
{
    ++qk__fault_seen;
    if (qk__fault_at > 0 && --qk__fault_at == 0) {
        if (qk__fault_persist) qk__fault_at = 1; /* and every later one */
        return true;
    }
    return false;
}
/* The engine's live device allocations (cudaMalloc less cudaFree), for leak checks that other
   processes on the GPU cannot disturb (cudaMemGetInfo's free memory is the whole device's). */
static std::mutex qk__live_mu;
static std::unordered_map<void *, size_t> *qk__live_map = nullptr;
static size_t qk__live_bytes = 0;
template <typename P> static cudaError_t qk__t_malloc(P **p, size_t n)
{
    if (qk__fault_hit()) return cudaErrorMemoryAllocation;
    const cudaError_t e = cudaMalloc((void **)p, n);
    if (e == cudaSuccess && *p) {
        std::lock_guard<std::mutex> g(qk__live_mu);
        if (!qk__live_map) qk__live_map = new std::unordered_map<void *, size_t>();
        (*qk__live_map)[(void *)*p] = n;
        qk__live_bytes += n;
    }
    return e;
}
static cudaError_t qk__t_free(void *p)
{
    if (p) {
        std::lock_guard<std::mutex> g(qk__live_mu);
        if (qk__live_map) {
            auto it = qk__live_map->find(p);
            if (it != qk__live_map->end()) { qk__live_bytes -= it->second; qk__live_map->erase(it); }
        }
    }
    return cudaFree(p);
}
template <typename P> static cudaError_t qk__t_malloc_host(P **p, size_t n)
{
    if (qk__fault_hit()) return cudaErrorMemoryAllocation;
    return cudaMallocHost((void **)p, n);
}
static cudaError_t qk__t_stream(cudaStream_t *s, unsigned f)
{
    if (qk__fault_hit()) return cudaErrorMemoryAllocation;
    return cudaStreamCreateWithFlags(s, f);
}
static cudaError_t qk__t_event(cudaEvent_t *e) { return qk__fault_hit() ? cudaErrorMemoryAllocation : cudaEventCreate(e); }
static cudaError_t qk__t_event_flags(cudaEvent_t *e, unsigned f)
{
    return qk__fault_hit() ? cudaErrorMemoryAllocation : cudaEventCreateWithFlags(e, f);
}
static cublasStatus_t qk__t_blas(cublasHandle_t *h) { return qk__fault_hit() ? CUBLAS_STATUS_ALLOC_FAILED : cublasCreate_v2(h); }
#define cudaMalloc(p, n) qk__t_malloc((p), (n))
#define cudaFree(p) qk__t_free((void *)(p))
#define cudaMallocHost(p, n) qk__t_malloc_host((p), (n))
#define cudaStreamCreateWithFlags(s, f) qk__t_stream((s), (f))
#define cudaEventCreate(e) qk__t_event((e))
#define cudaEventCreateWithFlags(e, f) qk__t_event_flags((e), (f))
#undef cublasCreate /* cublas_v2.h: cublasCreate_v2 */
#define cublasCreate(h) qk__t_blas((h))
extern "C" void qk_cuda_test_fail_alloc(int k)
{
    qk__fault_persist = k < 0;
    qk__fault_at = k < 0 ? -k : k;
}
extern "C" int qk_cuda_test_alloc_count(void) { return qk__fault_seen; }
extern "C" size_t qk_cuda_test_live_bytes(void)
{
    std::lock_guard<std::mutex> g(qk__live_mu);
    return qk__live_bytes;
}
/* qk_cuda_test_poison_gemm: the cuBLAS paths' C filled with NaN bytes before the products */
static int qk__poison_gemm = 0;
extern "C" void qk_cuda_test_poison_gemm(int on) { qk__poison_gemm = on != 0; }
/* qk_cuda_test_rows_in_bytes: the bytes of X / Y rows (features or given states) copied into the
   engine's own device buffers so far (QK__TEST_ROWS_IN at each such copy) */
static std::atomic<long long> qk__rows_in{0};
extern "C" long long qk_cuda_test_rows_in_bytes(void) { return qk__rows_in.load(); }
#define QK__TEST_ROWS_IN(bytes) (qk__rows_in += (long long)(bytes))
#else
enum { qk__poison_gemm = 0 };   /* the product build: no poisoning (the branch folds away) */
#define QK__TEST_ROWS_IN(bytes) ((void)0)
#endif /* QK_TEST_FAULTS */

/* ---- errors ---- */
struct qk__err {
    char *buf;
    size_t size;
};

static qk_result qk__cuda_fail(qk__err *e, cudaError_t c, const char *expr, int line)
{
    qk_result r = (c == cudaErrorMemoryAllocation) ? QK_ERROR_DEVICE_OUT_OF_MEMORY : QK_ERROR_CUDA;
    if (e && e->buf && e->size)
        snprintf(e->buf, e->size, "%s at qk_cuda.cu:%d: %s", expr, line, cudaGetErrorString(c));
    cudaGetLastError(); /* clear a sticky-free error so the next call starts clean */
    return r;
}

static qk_result qk__blas_fail(qk__err *e, cublasStatus_t s, const char *expr, int line)
{
    qk_result r = (s == CUBLAS_STATUS_ALLOC_FAILED) ? QK_ERROR_DEVICE_OUT_OF_MEMORY : QK_ERROR_CUDA;
    if (e && e->buf && e->size)
        snprintf(e->buf, e->size, "%s at qk_cuda.cu:%d: cublas status %d%s%s", expr, line, (int)s, qk__cublas_detail()[0] ? ": " : "", qk__cublas_detail());
    return r;
}

static qk_result qk__fail_msg(qk__err *e, qk_result r, const char *msg)
{
    if (e && e->buf && e->size) snprintf(e->buf, e->size, "%s", msg);
    return r;
}

#define QK_CK(expr) do { cudaError_t c_ = (expr); if (c_ != cudaSuccess) return qk__cuda_fail(E, c_, #expr, __LINE__); } while (0)
#define QK_BLAS_CK(expr) do { cublasStatus_t s_ = (expr); if (s_ != CUBLAS_STATUS_SUCCESS) return qk__blas_fail(E, s_, #expr, __LINE__); } while (0)
/* After every launch, in the kernel's named launcher: the kernel's name goes into the message. */
#define QK_LAUNCH_CK(kernel) do { cudaError_t c_ = cudaGetLastError(); if (c_ != cudaSuccess) return qk__cuda_fail(E, c_, "launch of " kernel, __LINE__); } while (0)
#define QK_TRY(expr) do { qk_result r_ = (expr); if (r_ != QK_OK) return r_; } while (0)

/* Lets the current GPU read p's GPU directly (cudaDeviceEnablePeerAccess) where the two can, so
   that copies from p (cudaMemcpyDefault) go peer to peer; enabled once per pair and process
   (cudaErrorPeerAccessAlreadyEnabled after that). Never fails: without peer access the same
   copies go through host memory. */
static void qk__peer_access(const void *p)
{
    /* asked once per pair of devices (a repeated enable is an API error, which sanitizers report);
       where the caller later disables it, the copies still run, through host memory */
    static std::atomic<int> asked[64][64];
    cudaPointerAttributes at;
    int cur = -1, can = 0;
    if (cudaGetDevice(&cur) == cudaSuccess && cudaPointerGetAttributes(&at, p) == cudaSuccess && at.type == cudaMemoryTypeDevice &&
        at.device != cur && cur >= 0 && cur < 64 && at.device >= 0 && at.device < 64 && !asked[cur][at.device].exchange(1) &&
        cudaDeviceCanAccessPeer(&can, cur, at.device) == cudaSuccess && can)
        (void)cudaDeviceEnablePeerAccess(at.device, 0);
    cudaGetLastError();   /* AlreadyEnabled (by the caller), or any other refusal: cleared */
}

