/* qk_cuda.cu — the CUDA engine of qk: state construction, fused Gram kernels, the pipeline.

   Design
   ------
   A feature map (qk_map) is compiled on the host into a small device program:

     GATE  a 2x2 matrix on one qubit (H, X, Y, RX, RY, basis-X); the matrix of every GATE is
           evaluated once per sample by a prep kernel (in double, then rounded to the precision)
     CNOT  a permutation on two qubits
     DIAG  a run of diagonal ops (Z, RZ, P, CZ, RZZ, and CNOT(c,t) P(t) CNOT(c,t) which is the
           diagonal e^{i theta (b_c xor b_t)}) folded into one quadratic phase form
              phase(b) = c0 + sum_i c_i b_i + sum_{i<j} d_ij b_i b_j
           whose coefficients the prep kernel sums per sample in double and reduces mod 2 pi
           (so the float32 phase sum stays small: its ulp, not the angles, sets the error).
           A zz layer of q(q-1)/2 CNOT-P-CNOT triples is thus one pass over the amplitudes.

   States are built in shared memory: a pass loads 2^L amplitudes of a state (the amplitudes
   whose indices vary over L chosen qubits, the others fixed per block), applies every op of
   the program that touches only those qubits, and stores once. For q <= L (L = 13: 64 KB of
   complex64 or 128 KB of complex128, inside Hopper's 227 KB opt-in) the whole circuit is one
   pass that starts from |0> in shared memory: one global write per state. Larger states (up to
   30 qubits) take several passes; the scheduler packs ops greedily into passes and always keeps
   the low qubits in the set so that global accesses stay coalesced. Small states (2^q < 512)
   share a block, so a 4-qubit state does not leave a block of 8 threads alone on an SM.

   Gram: K[i][j] = |<a_i|b_j>|^2 (real maps: <a_i|b_j>^2 over real amplitudes). Two engines:
     fused   a register-tiled SIMT kernel: <a|b> accumulated in registers, |.|^2 and the store
             in its epilogue; tiles staged through shared memory so that both the tile and its
             mirror (symmetric K) are written with coalesced rows. No complex matrix in memory.
             At 2..6 qubits (complex fp32, float K) its persistent tensor-core form (>>smalltc):
             the same epilogue, the inner products on mma.sync with fp16 hi/lo splits.
     blas    cuBLAS GEMM (C/Z/S/D) into a slab workspace, then a fused |.|^2 + mirror epilogue;
             for the tensor-core precision modes (TF32, FP32X3, FP16) real-form GEMMs of
             converted operands into Re and Im planes, the same epilogue (qk__tc_products).
   The planner picks one by qubit count (see qk__plan_cuda in qk.h for the measured reason).
   Symmetric K(X,X) computes only tiles with j >= i and writes both halves: each entry of K is
   written exactly once (the mirror writes only j > i).

   Product maps (no entangling op) never build states: per sample and qubit a 2-vector, and
   K[i][j] = prod_k |<u_k(x_i)|u_k(y_j)>|^2 (the analytic kernel).

   Output: K is produced in slabs of rows. K to the caller's device buffer: slabs straight into
   it. K to the host: when all of K fits the device budget it is kept resident (symmetric slabs
   mirror into later rows, so slab s is complete once slabs 0..s have run); each slab is copied
   D2H on a second stream while the next slab computes: straight into the caller's buffer when
   it is pinned, else into double-buffered pinned staging that qk.h's delivery hands on (a
   parallel copy into a pageable buffer, square tiles to the callback, the .npy stream). One synchronization per slab on the host side, none on the
   compute stream. When device memory runs out, the job is retried with smaller slabs and state
   tiles before it fails.

   Errors: every CUDA call goes through QK_CK, which records the expression, file and line in
   the caller's err buffer and returns a qk_result; every kernel is launched by its named
   launcher (qk__launch_<kernel>, in the kernel's section), which checks the launch with
   QK_LAUNCH_CK("<kernel>"): the detail message names the kernel.

   Layout: one section per operation (llm.c's layout): its kernels, then their launchers (grid
   and shared-memory math, stream, launch check), then its host driver; the pipeline that
   strings them into a Gram job, then the extern "C" surface. Contents below. */

/* Contents (grep for the tag; generated from the sources' tags by src/amalgamate.py; [file] is
   the source in src/cuda/ to edit; each operation's kernels, launchers and launch checks are
   one section, as in llm.c)
   >>common     the device program's structs, complex helpers, the float/double dispatcher, triangular grid, tile store [cuda/common.cuh]
   >>compile    qk__compile: a qk_map -> GATE/CNOT/DIAG instructions, param jobs, passes; qk__dprog on the device [cuda/compile.cuh]
   >>states     prep, pass and qubit-vector kernels; qk__build_states [cuda/states.cuh]
   >>widen      states widened to interleaved doubles (qk_cuda_states) [cuda/widen.cuh]
   >>product    the analytic Gram of product maps [cuda/product.cuh]
   >>gram       the fused SIMT Gram kernel, its tile configurations [cuda/gram.cuh]
   >>small      the persistent few-qubit Gram kernel (fused configuration 7) [cuda/small.cuh]
   >>smalltc    its tensor-core form, fp16 hi/lo splits (fused configuration 8) [cuda/smalltc.cuh]
   >>blas       cuBLAS and the tensor-core engines, the |.|^2 epilogue [cuda/blas.cuh]
   >>amp        amplitude encoding from host data (qk_cuda_amplitude_encode) [cuda/amp.cuh]
   >>wgmma      the fused tensor-core Gram on Hopper's warpgroup MMA (sm_90a; configuration 4 of the TCF engines) [cuda/wgmma.cuh]
   >>tcf        the fused tensor-core Gram kernel (mma.sync; plan.engine QK_GPU_TCF_*) [cuda/tcf.cuh]
   >>pipeline   the Gram job: streams and events, job state, qk__pipe's steps [cuda/pipeline.cuh]
   >>api        the extern "C" surface qk.h calls (qk_cuda_gram, qk_cuda_states, ...) [cuda/api.cuh]
   >>tune       the autotuner (qk_cuda_tune_gram) [cuda/tune.cuh]
   >>devices    device selection and a clock for qk.h's several-GPU driver [cuda/devices.cuh]
   >>mps        the MPS path: batched transfer-matrix contraction of padded site tensors [cuda/mps.cuh]
   >>vjp        qk_cuda_gram_vjp: the gradient of a loss of K for every weight on the GPU [cuda/vjp.cuh]
   >>projected  qk_cuda_gram_projected: the projected quantum kernel on the GPU [cuda/projected.cuh]
   Above the sections: includes, fault injection (tests), errors (QK_CK, QK_LAUNCH_CK). */
/* The engine's includes and the profiler's GPU-zone macros: the first thing every operation's file (src/cuda/, .cuh)
   includes, so each operation's file compiles alone (tests/tu_compile.py --cuda), and the top of
   the generated qk_cuda.cu. */
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

/* ======================================================================================== */
/* >>common ---- the device program's structs, complex helpers, the float/double dispatcher, triangular grid, tile store ---- */
/* ======================================================================================== */

enum { QK__I_GATE = 1, QK__I_CNOT, QK__I_DIAG };

struct qk__instr {
    int kind;
    int q0, q1;         /* global qubits (GATE: q0; CNOT: control q0, target q1) */
    int b0, b1;         /* the same as bits of the in-chunk index (filled per pass) */
    int off;            /* GATE: offset of its 8 values (2x2 complex) in the sample's params;
                           DIAG: offset of its 1 + q + q*q coefficients */
    int h;              /* GATE: 1 where it is a Hadamard (the structured pass needs no matrix) */
};

/* A param job: one GATE matrix or one phase coefficient of a sample. */
struct qk__job {
    int kind;           /* 0: gate matrix, 1: phase coefficient, 2: a folded qubit's 2-vector */
    int op;             /* gate: op index */
    int out;            /* offset in the sample's params */
    int c0, c1;         /* coefficient, folded qubit: contributions [c0, c1) */
};

struct qk__contrib {
    int op;             /* -1: constant */
    double m, k;        /* value (m * theta(op) + k) */
};

static const int QK__LMAX = QK__PASS_QUBITS; /* qk.h's >>engine: the planner counts with it */
#define QK__MAXQ 30

struct qk__pass {
    int L;              /* qubits in the chunk */
    int pos[QK__MAXQ];  /* in-chunk bit r -> global qubit (ascending) */
    int npos[QK__MAXQ]; /* the q - L qubits fixed per block (ascending) */
    int a;              /* pos[i] == i for i < a */
    int i0, i1;         /* instructions [i0, i1) */
    int first;          /* 1: start from |0> (or the amplitude data) instead of loading */
    int fold;           /* first pass: offset of the q folded qubit 2-vectors in the params, or -1 */
};

/* ---- small complex helpers ---- */
template <typename T> struct qk__cx { T x, y; };
template <typename T> struct qk__vec2;
template <> struct qk__vec2<float> { typedef float2 t; typedef float4 t4; };
template <> struct qk__vec2<double> { typedef double2 t; typedef double2 t4; };

/* float: reduce to [-pi, pi] (the phase sum is up to ~10^3 rad), then the hardware sincos
   (|error| < 1e-6 there, under the float state's own rounding) */
__device__ __forceinline__ void qk__sincos(float a, float *s, float *c)
{
    a -= 6.28318530717958647692f * rintf(a * 0.15915494309189533577f);
    __sincosf(a, s, c);
}
__device__ __forceinline__ void qk__sincos(double a, double *s, double *c) { sincos(a, s, c); }

/* ---- tensor-core and cp.async helpers (sm_80+) ---- */
/* Tensor-core operands (qk__tc_products, the few-qubit tensor-core kernel): x rounded to TF32
   (10 stored mantissa bits) to nearest, ties away from zero, as cvt.rna.tf32.f32 does (finite x:
   a carry into the exponent is the right result). */
/* The sum of v over a block of 256 threads, in a fixed order (red: the block's __shared__
   double[256]); every thread gets it. */
__device__ __forceinline__ double qk__block_sum256(double *red, double v)
{
    red[threadIdx.x] = v;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
        __syncthreads();
    }
    return red[0];
}

/* The block's largest v (256 threads); red is shared, free again after the call's last barrier. */
__device__ __forceinline__ double qk__block_max256(double *red, double v)
{
    __syncthreads();   /* red's previous use is over */
    red[threadIdx.x] = v;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h) red[threadIdx.x] = fmax(red[threadIdx.x], red[threadIdx.x + h]);
        __syncthreads();
    }
    const double r = red[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float qk__tf32_rna(float x)
{
    return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}
/* The tensor-core engines' roundings of an operand value (TF32 round-to-nearest-away, fp16 and
   bfloat16 to nearest even; double kept) and fp16 back to float. */
__device__ __forceinline__ float qk__cvt(float v, float *) { return qk__tf32_rna(v); }
__device__ __forceinline__ __half qk__cvt(float v, __half *) { return __float2half_rn(v); }
__device__ __forceinline__ __nv_bfloat16 qk__cvt(float v, __nv_bfloat16 *) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ double qk__cvt(double v, double *) { return v; }
__device__ __forceinline__ float qk__f(__half h) { return __half2float(h); }
/* Gauss's operand planes (qk__tc_gauss_products) of one complex amplitude z: plane p of the set
   bits of sel (0 re, 1 im, 2 re - im, 3 re + im) as scale * value rounded to O, the j-th set
   bit's at o + j * pstride; SPLIT (FP32X3): the four blocks [hi lo hi hi], D apart, of
   qk__k_tc_operand. The operand pass (qk__k_tc_operand3) and the state builder that writes the
   planes itself (qk__k_states_fz) both store through here, so that both round alike. */
template <typename O, bool SPLIT>
__device__ __forceinline__ void qk__gauss_store(float2 z, unsigned sel, float scale, O *o, int64_t D, int64_t pstride)
{
    const float v[4] = {z.x, z.y, z.x - z.y, z.x + z.y};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        if (!((sel >> p) & 1u)) continue;
        const float sv = v[p] * scale;
        if constexpr (SPLIT) {
            const O hi = qk__cvt(sv, (O *)nullptr), lo = qk__cvt(sv - qk__f(hi), (O *)nullptr);
            o[0] = hi; o[D] = lo; o[2 * D] = hi; o[3 * D] = hi;
        } else *o = qk__cvt(sv, (O *)nullptr);
        o += pstride;
    }
}
__device__ __forceinline__ void qk__mma_tf32(float *c, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void qk__mma_f16(float *c, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* 16 bytes global -> shared without registers; bytes < 16 zero-fills the rest (past a last row) */
__device__ __forceinline__ void qk__cp16(void *smem, const void *g, int bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qk__cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void qk__cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Angle of op `op` of a sample (qk__angle_value, shared with the CPU engine); -1: none, 0. */
__device__ double qk__theta(const qk_angle *ang, int op, const double *x, const double *w)
{
    if (op < 0) return 0.0;
    return qk__angle_value(&ang[op], x, w);
}

/* The one float/double dispatcher: f(qk__types<T, CPLX, OutT>()) with T = double where f64
   (else float), CPLX = cplx and OutT = double where out64 (else float). The plan's precision,
   path and output dtype select one instance of a templated step this way. */
template <typename T_, bool CPLX_, typename OutT_> struct qk__types {
    typedef T_ T;
    typedef OutT_ OutT;
    static const bool CPLX = CPLX_;
};
template <typename F> static qk_result qk__dispatch(bool f64, bool cplx, bool out64, F &&f)
{
    if (f64) {
        if (cplx) return out64 ? f(qk__types<double, true, double>()) : f(qk__types<double, true, float>());
        return out64 ? f(qk__types<double, false, double>()) : f(qk__types<double, false, float>());
    }
    if (cplx) return out64 ? f(qk__types<float, true, double>()) : f(qk__types<float, true, float>());
    return out64 ? f(qk__types<float, false, double>()) : f(qk__types<float, false, float>());
}

/* The triangular grid of a diagonal block of K(X,X) in square tiles: grid (Tx, Ty) becomes a
   1-D grid over the tiles on or above the diagonal (row r of the tile grid holds Tx - r of
   them); returns Tx, the kernels' tgrid, which qk__tile_of inverts on the device. */
static int qk__tri_grid(dim3 *grid)
{
    const int64_t Tx = grid->x, Ty = grid->y;
    *grid = dim3((unsigned)(Ty * Tx - Ty * (Ty - 1) / 2), 1);
    return (int)Tx;
}

/* Block -> tile. tgrid > 0 (square tiles, a diagonal block of K(X,X)): a 1-D grid over the
   tiles with column >= row of a tile grid with tgrid columns, row r holding tgrid - r tiles,
   so no block is launched for a tile under the diagonal (half the grid; each empty block
   still cost a launch slot: zz 4 qubits, qk-bench). */
/* Tile L of the triangle (row r of a grid with T tile columns holding T - r tiles) -> (ty, tx). */
__device__ __forceinline__ void qk__tri_tile(int64_t L, int64_t T, int &ty, int &tx)
{
    const double b = 2.0 * (double)T + 1.0;
    int64_t i = (int64_t)floor((b - sqrt(b * b - 8.0 * (double)L)) * 0.5);
    if (i < 0) i = 0;
    while (i > 0 && i * T - i * (i - 1) / 2 > L) --i;
    while ((i + 1) * T - (i + 1) * i / 2 <= L) ++i;
    ty = (int)i;
    tx = (int)(i + (L - (i * T - i * (i - 1) / 2)));
}
__device__ __forceinline__ void qk__tile_of(int tgrid, int &ty, int &tx)
{
    if (tgrid == 0) { ty = blockIdx.y; tx = blockIdx.x; return; }
    qk__tri_tile(blockIdx.x, tgrid, ty, tx);
}

/* Writes a BM x BN tile staged in shared memory (Cs, row stride BN + 1) to K and, for a
   symmetric or off-diagonal block, its mirror. Rows r of the tile are rows row0 + r of the
   block, columns c are col0 + c; doff = (global column of block col 0) - (global row of block
   row 0). tri: write direct only where col >= row and mirror only where col > row (globally),
   so every entry of K is written once. Rows of both the tile and the mirror are stored by
   consecutive threads (coalesced). */
template <typename OutT, int BM, int BN, int NT>
__device__ __forceinline__ void qk__store_tile(const OutT *Cs, int row0, int col0, int m, int nn,
                                               OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout,
                                               int64_t doff, int tri, int vec)
{
    /* 16-byte stores where the whole tile is inside K and off the diagonal, and the caller
       checked alignment (ld a multiple of the vector, 16-byte aligned bases): the 4-qubit
       Gram is bound by these writes. */
    const int VW = 16 / sizeof(OutT);
    if (vec && row0 + BM <= m && col0 + BN <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM)) {
        typedef typename qk__vec2<OutT>::t4 V;
        for (int idx = threadIdx.x; idx < BM * BN / VW; idx += NT) {
            int r = idx / (BN / VW), c = (idx % (BN / VW)) * VW;
            V v;
            OutT *pv = (OutT *)&v;
#pragma unroll
            for (int k = 0; k < VW; ++k) pv[k] = Cs[r * (BN + 1) + c + k];
            *(V *)(out + (int64_t)(row0 + r) * ld + col0 + c) = v;
        }
        if (mout) {
            for (int idx = threadIdx.x; idx < BM * BN / VW; idx += NT) {
                int c = idx / (BM / VW), r = (idx % (BM / VW)) * VW;
                V v;
                OutT *pv = (OutT *)&v;
#pragma unroll
                for (int k = 0; k < VW; ++k) pv[k] = Cs[(r + k) * (BN + 1) + c];
                *(V *)(mout + (int64_t)(col0 + c) * ld + row0 + r) = v;
            }
        }
        return;
    }
    for (int idx = threadIdx.x; idx < BM * BN; idx += NT) {
        int r = idx / BN, c = idx % BN;
        int gi = row0 + r, gj = col0 + c;
        if (gi < m && gj < nn && (!tri || gj + doff >= gi)) out[(int64_t)gi * ld + gj] = Cs[r * (BN + 1) + c];
    }
    if (mout) {
        for (int idx = threadIdx.x; idx < BM * BN; idx += NT) {
            int c = idx / BM, r = idx % BM;
            int gi = row0 + r, gj = col0 + c;
            if (gi < m && gj < nn && (!tri || gj + doff > gi)) mout[(int64_t)gj * ld + gi] = Cs[r * (BN + 1) + c];
        }
    }
}

/* 16-byte stores are legal when both bases are 16-byte aligned and ld keeps rows aligned. */
template <typename OutT>
static int qk__vec_ok(const OutT *out, const OutT *mout, int64_t ld)
{
    const int VW = 16 / sizeof(OutT);
    return ld % VW == 0 && ((uintptr_t)out % 16) == 0 && (!mout || ((uintptr_t)mout % 16) == 0);
}

/* ======================================================================================== */
/* >>compile ---- qk__compile: a qk_map -> GATE/CNOT/DIAG instructions, param jobs, passes; qk__dprog on the device ---- */
/* ======================================================================================== */

struct qk__prog {
    int q = 0, d = 0;
    int has_amp = 0;
    int states = 0; /* given states (qk_gram_states): a load kernel, no program; the op's fields */
    int st_type = 0, st_flags = 0;
    int64_t st_dim = 0;
    std::vector<qk_angle> ang;
    std::vector<int> op_kind;
    std::vector<qk__instr> instr;
    std::vector<qk__job> jobs;
    std::vector<qk__contrib> con;
    std::vector<qk__pass> passes;
    int P = 0; /* params per sample (0: none, an analytic-only map of more than QK__MAXQ qubits) */
    /* product maps */
    std::vector<int> qops, qoff;
};

/* Adds one quadratic-form contribution: value (m*theta(op)+k) * f(b) with f by type. */
struct qk__diag_builder {
    int q;
    /* slot -> contributions; slot 0 = c0, 1+i = c_i, 1+q+i*q+j = d_ij (i<j) */
    std::vector<std::vector<qk__contrib>> slot;
    void init(int q_) { q = q_; slot.assign(1 + q + q * q, std::vector<qk__contrib>()); }
    void add(int s, int op, double m, double k) { qk__contrib c = {op, m, k}; slot[s].push_back(c); }
    void bit(int a, int op, double m, double k) { add(1 + a, op, m, k); }
    void cnst(int op, double m, double k) { add(0, op, m, k); }
    void pair(int a, int b, int op, double m, double k) { if (a > b) std::swap(a, b); add(1 + q + a * q + b, op, m, k); }
    void xr(int a, int b, int op, double m, double k) { bit(a, op, m, k); bit(b, op, m, k); pair(a, b, op, -2 * m, -2 * k); }
};

static void qk__diag_op1(qk__diag_builder &db, const qk_op &o, int oi, int qbit_xor_with)
{
    const double PI = 3.14159265358979323846;
    /* qbit_xor_with >= 0: the op sits between CNOT(c, t) pairs: its bit becomes b_c xor b_t */
    int t = o.q0;
    switch (o.kind) {
    case QK_OP_Z:
        if (qbit_xor_with >= 0) db.xr(qbit_xor_with, t, -1, 0, PI); else db.bit(t, -1, 0, PI);
        break;
    case QK_OP_P:
        if (qbit_xor_with >= 0) db.xr(qbit_xor_with, t, oi, 1, 0); else db.bit(t, oi, 1, 0);
        break;
    case QK_OP_RZ:
        if (qbit_xor_with >= 0) db.xr(qbit_xor_with, t, oi, 1, 0); else db.bit(t, oi, 1, 0);
        db.cnst(oi, -0.5, 0);
        break;
    default: break;
    }
}

/* qk__compile's steps, in order: the product path's per-qubit op lists, the folded start, the
   instructions (GATE / CNOT / DIAG runs with their param jobs), the passes. */

/* Product maps: per-qubit op lists (qops, qoff) for the analytic kernel. */
static qk_result qk__compile_product(const qk_map *map, qk__prog *pg, qk__err *E)
{
    const int q = map->n_qubits;
    pg->qoff.assign(q + 1, 0);
    if (map->cls != QK_CLASS_PRODUCT) return QK_OK;
    std::vector<std::vector<int>> per(q);
    for (int i = 0; i < map->n_ops; ++i) {
        int k = map->ops[i].kind;
        if (k == QK_OP_CNOT || k == QK_OP_CZ || k == QK_OP_RZZ || k == QK_OP_AMPLITUDE)
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "product map with an entangling or amplitude op");
        per[map->ops[i].q0].push_back(i);
    }
    pg->qops.clear();
    for (int k = 0; k < q; ++k) {
        pg->qoff[k] = (int)pg->qops.size();
        pg->qops.insert(pg->qops.end(), per[k].begin(), per[k].end());
    }
    pg->qoff[q] = (int)pg->qops.size();
    if (pg->qops.empty()) pg->qops.push_back(0);
    return QK_OK;
}

/* Leading one-qubit gates on qubits nothing else has touched yet act on |0> alone: fold them
   into a per-sample product start state (a 2-vector per qubit, built by the prep kernel). zz's
   first H layer disappears this way: 16 qubits take 2 passes instead of 3. Marks the folded ops;
   returns the offset of the q 2-vectors in the params (*P grows by 4q), or -1. */
static int qk__compile_fold(const qk_map *map, qk__prog *pg, std::vector<char> &folded, int *P)
{
    const int q = map->n_qubits;
    std::vector<std::vector<int>> fold_ops(q);
    bool any_fold = false;
    std::vector<char> touched(q, 0);
    bool amp = map->n_ops > 0 && map->ops[0].kind == QK_OP_AMPLITUDE;
    for (int i = 0; i < map->n_ops && !amp; ++i) {
        const qk_op &o = map->ops[i];
        int k = o.kind;
        bool one = k == QK_OP_H || k == QK_OP_X || k == QK_OP_Y || k == QK_OP_RX || k == QK_OP_RY || k == QK_OP_BASIS;
        if (one && !touched[o.q0]) { folded[i] = 1; fold_ops[o.q0].push_back(i); any_fold = true; continue; }
        if (o.q0 >= 0 && o.q0 < q) touched[o.q0] = 1;
        if ((k == QK_OP_CNOT || k == QK_OP_CZ || k == QK_OP_RZZ) && o.q1 >= 0 && o.q1 < q) touched[o.q1] = 1;
    }
    if (!any_fold) return -1;
    const int fold_off = *P;
    for (int b = 0; b < q; ++b) {
        qk__job j = {2, -1, *P + 4 * b, (int)pg->con.size(), 0};
        for (int op : fold_ops[b]) { qk__contrib c = {op, 0, 0}; pg->con.push_back(c); }
        j.c1 = (int)pg->con.size();
        pg->jobs.push_back(j);
    }
    *P += 4 * q;
    return fold_off;
}

/* The instructions: every run of diagonal ops (and CX P CX parity patterns) becomes one DIAG
   with its 1 + q + q*q coefficient jobs; other one-qubit gates a GATE with its matrix job; CNOT
   stays. *P counts the params per sample. */
static qk_result qk__compile_instr(const qk_map *map, qk__prog *pg, const std::vector<char> &folded, int *P, qk__err *E)
{
    const int q = map->n_qubits;
    qk__diag_builder db;
    bool in_diag = false;
    auto flush_diag = [&]() {
        if (!in_diag) return;
        qk__instr ins = {QK__I_DIAG, -1, -1, 0, 0, *P, 0};
        pg->instr.push_back(ins);
        for (size_t s = 0; s < db.slot.size(); ++s) {
            qk__job j;
            j.kind = 1;
            j.op = -1;
            j.out = *P + (int)s;
            j.c0 = (int)pg->con.size();
            for (auto &c : db.slot[s]) pg->con.push_back(c);
            j.c1 = (int)pg->con.size();
            pg->jobs.push_back(j);
        }
        *P += (int)db.slot.size();
        in_diag = false;
    };
    for (int i = 0; i < map->n_ops; ++i) {
        const qk_op &o = map->ops[i];
        int k = o.kind;
        if (folded[i]) continue;
        if (k == QK_OP_AMPLITUDE) {
            if (i != 0) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "amplitude op must come first");
            pg->has_amp = 1;
            continue;
        }
        /* CNOT(c,t) D(t) CNOT(c,t) with D one diagonal one-qubit op: a parity phase */
        if (qk__parity_at(map->ops, map->n_ops, i)) {   /* the parity rule (qk_engine.h) */
            if (!in_diag) { db.init(q); in_diag = true; }
            qk__diag_op1(db, map->ops[i + 1], i + 1, o.q0);
            i += 2;
            continue;
        }
        if (qk__op_diag1(k) || k == QK_OP_CZ || k == QK_OP_RZZ) {
            if (!in_diag) { db.init(q); in_diag = true; }
            if (k == QK_OP_CZ) db.pair(o.q0, o.q1, -1, 0, 3.14159265358979323846);
            else if (k == QK_OP_RZZ) { db.xr(o.q0, o.q1, i, 1, 0); db.cnst(i, -0.5, 0); }
            else qk__diag_op1(db, o, i, -1);
            continue;
        }
        flush_diag();
        if (k == QK_OP_CNOT) {
            qk__instr ins = {QK__I_CNOT, o.q0, o.q1, 0, 0, 0, 0};
            pg->instr.push_back(ins);
        } else {
            qk__instr ins = {QK__I_GATE, o.q0, -1, 0, 0, *P, k == QK_OP_H};
            pg->instr.push_back(ins);
            qk__job j = {0, i, *P, 0, 0};
            pg->jobs.push_back(j);
            *P += 8;
        }
    }
    flush_diag();
    return QK_OK;
}

/* The passes: instructions packed greedily into passes of at most QK__LMAX qubits, each filled
   with the lowest qubits (coalesced global accesses); the first starts from the folded state. */
static void qk__compile_passes(qk__prog *pg, int q, int fold_off)
{
    pg->passes.clear();
    const int L = std::min(q, QK__LMAX);
    uint32_t S = 0;
    qk__pass cur;
    memset(&cur, 0, sizeof cur);
    cur.i0 = 0;
    cur.first = 1;
    cur.fold = fold_off;
    auto close = [&](int i1) {
        for (int b = 0; b < q && __builtin_popcount(S) < L; ++b) S |= 1u << b;
        cur.L = L;
        int np = 0, nn = 0;
        for (int b = 0; b < q; ++b) {
            if (S >> b & 1) cur.pos[np++] = b; else cur.npos[nn++] = b;
        }
        cur.a = 0;
        while (cur.a < L && cur.pos[cur.a] == cur.a) cur.a++;
        cur.i1 = i1;
        for (int ii = cur.i0; ii < i1; ++ii) {
            qk__instr &in_ = pg->instr[ii];
            for (int r = 0; r < L; ++r) {
                if (cur.pos[r] == in_.q0) in_.b0 = r;
                if (cur.pos[r] == in_.q1) in_.b1 = r;
            }
        }
        pg->passes.push_back(cur);
    };
    for (int ii = 0; ii < (int)pg->instr.size(); ++ii) {
        const qk__instr &in_ = pg->instr[ii];
        uint32_t need = 0;
        if (in_.kind == QK__I_GATE) need = 1u << in_.q0;
        else if (in_.kind == QK__I_CNOT) need = (1u << in_.q0) | (1u << in_.q1);
        if ((S | need) == S) continue;
        if (__builtin_popcount(S | need) <= L) { S |= need; continue; }
        close(ii);
        memset(&cur, 0, sizeof cur);
        cur.i0 = ii;
        cur.first = 0;
        cur.fold = -1;
        S = need;
    }
    close((int)pg->instr.size());
}

static qk_result qk__compile(const qk_map *map, qk__prog *pg, qk__err *E)
{
    const int q = map->n_qubits;
    pg->q = q;
    pg->d = map->n_features;
    pg->has_amp = 0;
    pg->ang.resize(std::max(1, map->n_ops));
    pg->op_kind.resize(std::max(1, map->n_ops));
    for (int i = 0; i < map->n_ops; ++i) {
        pg->ang[i] = map->ops[i].angle;
        pg->op_kind[i] = (int)map->ops[i].kind;
    }
    pg->states = 0;
    if (qk__map_is_states(map)) {   /* the states are loaded, not built (qk__launch_load_states) */
        pg->states = 1;
        pg->st_type = map->ops[0].q0;
        pg->st_flags = map->ops[0].q1;
        pg->st_dim = map->ops[0].angle.x0;
        pg->instr.clear(); pg->jobs.clear(); pg->con.clear(); pg->passes.clear();
        pg->qoff.assign(q + 1, 0);
        pg->qops.assign(1, 0);
        pg->P = 1;
        return QK_OK;
    }
    QK_TRY(qk__compile_product(map, pg, E));
    if (q > QK__MAXQ) { pg->P = 0; return QK_OK; } /* analytic only: no state program, no params */
    pg->instr.clear();
    pg->jobs.clear();
    pg->con.clear();
    int P = 0;
    std::vector<char> folded(std::max(1, map->n_ops), 0);
    const int fold_off = qk__compile_fold(map, pg, folded, &P);
    QK_TRY(qk__compile_instr(map, pg, folded, &P, E));
    pg->P = std::max(P, 1);
    qk__compile_passes(pg, q, fold_off);
    return QK_OK;
}

/* The compiled program on the device: its eight arrays packed into one buffer (each at a
   16-byte boundary), uploaded with one copy. base: that buffer; owned: allocated here (else a
   stream pool's, qk__dprog_make's buf). */
struct qk__dprog {
    qk_angle *ang = nullptr;
    int *op_kind = nullptr;
    qk__instr *instr = nullptr;
    qk__job *jobs = nullptr;
    qk__contrib *con = nullptr;
    double *w = nullptr;
    int *qops = nullptr, *qoff = nullptr;
    void *base = nullptr;
    bool owned = false;
};

/* The packed layout: each array's offset in the buffer, and the buffer's size (at least 16). */
struct qk__dprog_layout {
    size_t off[8], sz[8], bytes;
};
static qk__dprog_layout qk__dprog_plan(const qk__prog &pg, const qk_map *map)
{
    const size_t sz[8] = {pg.ang.size() * sizeof(qk_angle), pg.op_kind.size() * sizeof(int), pg.instr.size() * sizeof(qk__instr),
                          pg.jobs.size() * sizeof(qk__job), pg.con.size() * sizeof(qk__contrib), (size_t)map->n_weights * sizeof(double),
                          pg.qops.size() * sizeof(int), pg.qoff.size() * sizeof(int)};
    qk__dprog_layout L;
    size_t at = 0;
    for (int i = 0; i < 8; ++i) {
        L.off[i] = at;
        L.sz[i] = sz[i];
        at += (sz[i] + 15) & ~(size_t)15;
    }
    L.bytes = std::max<size_t>(16, at);
    return L;
}
/* Its size: what a stream pool's buffer for it must hold. */
static size_t qk__dprog_bytes(const qk__prog &pg, const qk_map *map) { return qk__dprog_plan(pg, map).bytes; }

static void qk__dprog_free(qk__dprog *d)
{
    if (d->owned) cudaFree(d->base);
    *d = qk__dprog();
}

/* Uploads the program. buf: a device buffer of at least qk__dprog_bytes to use (NULL: one is
   allocated, and qk__dprog_free frees it). st: the stream the copy is ordered on; the copy comes
   from pageable memory, which cudaMemcpyAsync has staged when it returns, so the host vector may
   go; with the legacy stream 0 (the default) it is also waited for, since the engine's other
   (non-blocking) streams are not ordered after stream 0. */
static qk_result qk__dprog_make(const qk__prog &pg, const qk_map *map, qk__dprog *d, qk__err *E, void *buf = nullptr,
                                cudaStream_t st = 0)
{
    const qk__dprog_layout L = qk__dprog_plan(pg, map);
    std::vector<unsigned char> h(L.bytes, 0);
    const void *src[8] = {pg.ang.data(), pg.op_kind.data(), pg.instr.data(), pg.jobs.data(), pg.con.data(), map->weights,
                          pg.qops.data(), pg.qoff.data()};
    for (int i = 0; i < 8; ++i)
        if (L.sz[i] > 0 && src[i]) memcpy(h.data() + L.off[i], src[i], L.sz[i]);
    *d = qk__dprog();
    if (buf) d->base = buf;
    else {
        QK_CK(cudaMalloc(&d->base, L.bytes));
        d->owned = true;
    }
    unsigned char *b = (unsigned char *)d->base;
    d->ang = (qk_angle *)(b + L.off[0]);
    d->op_kind = (int *)(b + L.off[1]);
    d->instr = (qk__instr *)(b + L.off[2]);
    d->jobs = (qk__job *)(b + L.off[3]);
    d->con = (qk__contrib *)(b + L.off[4]);
    d->w = (double *)(b + L.off[5]);
    d->qops = (int *)(b + L.off[6]);
    d->qoff = (int *)(b + L.off[7]);
    QK_CK(cudaMemcpyAsync(d->base, h.data(), L.bytes, cudaMemcpyHostToDevice, st));
    if (st == 0) QK_CK(cudaStreamSynchronize(0));
    return QK_OK;
}

/* ======================================================================================== */
/* >>states ---- prep, pass and qubit-vector kernels; qk__build_states ---- */
/* ======================================================================================== */

/* What a state builder writes: complex states (mode 0: rows of D float2), or Gauss's operand
   planes of the fp16 (mode 1), bfloat16 (mode 2) or fp32x3 (mode 3) tensor-core engine, as the
   operand pass (qk__launch_tc_operand3) makes them from complex states: planes re, im, re - im,
   re + im of scale * amplitude (scale: the engine's 2^floor(q/2)), ps values apart, row s of
   plane p at p * ps + s * R values from the start, R = D (modes 1, 2) or 4D (mode 3: the blocks
   [hi lo hi hi]) (qk__gauss_store). */
struct qk__planes_out {
    int mode;
    float scale;
    int64_t ps;
};
/* amplitude g = (x, y) of state s (D amplitudes) into po's planes (mode 1..3) */
__device__ __forceinline__ void qk__planes_put(const qk__planes_out &po, void *out, int64_t s, int64_t D, int64_t g, float x, float y)
{
    const float2 z = make_float2(x, y);
    if (po.mode == 1) qk__gauss_store<__half, false>(z, 0xFu, po.scale, (__half *)out + s * D + g, D, po.ps);
    else if (po.mode == 2) qk__gauss_store<__nv_bfloat16, false>(z, 0xFu, po.scale, (__nv_bfloat16 *)out + s * D + g, D, po.ps);
    else qk__gauss_store<__half, true>(z, 0xFu, po.scale, (__half *)out + s * 4 * D + g, D, po.ps);
}

/* 2x2 matrix of a one-qubit gate (qk__u1, shared with the CPU engine): m00 re, im, m01 re, im,
   m10 re, im, m11 re, im; the identity for BASIS on a 0. */
__device__ void qk__gate_matrix(int kind, double t, const double *xs, const qk_angle *ang, int op, double *m)
{
    qk__u1(kind, t, kind == QK_OP_BASIS && qk__basis_one(xs[ang[op].x0]), m);
}

/* Per-sample parameters: gate matrices and phase coefficients (double math, stored as T). */
template <typename T>
__global__ void qk__k_prep(const qk__job *__restrict__ jobs, int n_jobs, const qk__contrib *__restrict__ con,
                           const qk_angle *__restrict__ ang, const int *__restrict__ op_kind,
                           const double *__restrict__ x, int64_t n, int d, const double *__restrict__ w,
                           T *__restrict__ params, int P)
{
    int64_t s = blockIdx.x;
    if (s >= n) return;
    const double *xs = x + s * d;
    T *ps = params + s * (int64_t)P;
    const double TWO_PI = 6.283185307179586476925;
    for (int j = threadIdx.x; j < n_jobs; j += blockDim.x) {
        qk__job jb = jobs[j];
        if (jb.kind == 1) {
            double v = 0.0;
            for (int c = jb.c0; c < jb.c1; ++c) v += con[c].m * qk__theta(ang, con[c].op, xs, w) + con[c].k;
            v -= TWO_PI * floor(v / TWO_PI);
            ps[jb.out] = (T)v;
        } else if (jb.kind == 2) {
            /* a folded qubit: its leading one-qubit gates applied to |0> */
            double u0r = 1, u0i = 0, u1r = 0, u1i = 0, m[8];
            for (int c = jb.c0; c < jb.c1; ++c) {
                qk__gate_matrix(op_kind[con[c].op], qk__theta(ang, con[c].op, xs, w), xs, ang, con[c].op, m);
                double a0r = m[0] * u0r - m[1] * u0i + m[2] * u1r - m[3] * u1i;
                double a0i = m[0] * u0i + m[1] * u0r + m[2] * u1i + m[3] * u1r;
                double a1r = m[4] * u0r - m[5] * u0i + m[6] * u1r - m[7] * u1i;
                double a1i = m[4] * u0i + m[5] * u0r + m[6] * u1i + m[7] * u1r;
                u0r = a0r; u0i = a0i; u1r = a1r; u1i = a1i;
            }
            ps[jb.out + QK__QV_RE0] = (T)u0r; ps[jb.out + QK__QV_IM0] = (T)u0i;
            ps[jb.out + QK__QV_RE1] = (T)u1r; ps[jb.out + QK__QV_IM1] = (T)u1i;
        } else {
            double m[8];
            qk__gate_matrix(op_kind[jb.op], qk__theta(ang, jb.op, xs, w), xs, ang, jb.op, m);
            for (int i = 0; i < 8; ++i) ps[jb.out + i] = (T)m[i];
        }
    }
}

/* 1 / ||x||_2 per sample for amplitude encoding (the host validated non-zero norms). */
__global__ void qk__k_invnorm(const double *__restrict__ x, int64_t n, int d, double *__restrict__ inv)
{
    int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (s >= n) return;
    double acc = 0.0;
    for (int k = 0; k < d; ++k) acc += x[s * d + k] * x[s * d + k];
    inv[s] = 1.0 / sqrt(acc);
}

/* Shared table space per state (T values): the DIAG phase tables, or the folded start's two
   complex tables. */
__host__ __device__ inline int qk__tbl_size(int L)
{
    const int bl = L < 7 ? L : 7, bh = L - bl;
    const int ph = (1 << bl) + (1 << bh) + (bh << bl), fo = 2 * ((1 << bl) + (1 << bh));
    return ph > fo ? ph : fo;
}

/* In-chunk index -> amplitude index (q <= 30: 32-bit arithmetic throughout). */
__device__ __forceinline__ uint32_t qk__pdep(uint32_t r, const qk__pass &p)
{
    uint32_t g = r & ((1u << p.a) - 1);
    for (int i = p.a; i < p.L; ++i) if ((r >> i) & 1) g |= 1u << p.pos[i];
    return g;
}

template <typename T>
__device__ __forceinline__ T qk__phase(uint32_t g, const T *__restrict__ cf, int q)
{
    T ph = cf[0];
    uint32_t m = g;
    while (m) {
        int j = __ffs(m) - 1;
        m &= m - 1;
        ph += cf[1 + j];
        uint32_t lo = g & ((1u << j) - 1);
        const T *dj = cf + 1 + q + j;
        while (lo) {
            int i = __ffs(lo) - 1;
            lo &= lo - 1;
            ph += dj[i * q];
        }
    }
    return ph;
}

/* G one-qubit gates on distinct in-chunk bits applied in one sweep: each thread takes the 2^G
   amplitudes that differ in those bits into registers, applies the gates in program order and
   stores them back: one sweep and one barrier instead of G (zz: 13 H sweeps become 5). */
template <typename T, int G>
__device__ __forceinline__ void qk__gate_group(qk__cx<T> *a, int N, int lt, int tps, const int *bits,
                                               const T *const *ms)
{
    typedef qk__cx<T> C;
    T m[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < 8; ++i) m[g][i] = ms[g][i];
    int srt[G];
#pragma unroll
    for (int g = 0; g < G; ++g) srt[g] = bits[g];
#pragma unroll
    for (int i = 0; i < G; ++i)
#pragma unroll
        for (int j = 0; j + 1 < G - i; ++j)
            if (srt[j] > srt[j + 1]) { int tmp = srt[j]; srt[j] = srt[j + 1]; srt[j + 1] = tmp; }
    for (int t = lt; t < (N >> G); t += tps) {
        int base = t;
#pragma unroll
        for (int g = 0; g < G; ++g) base = ((base >> srt[g]) << (srt[g] + 1)) | (base & ((1 << srt[g]) - 1));
        C v[1 << G];
        int idx[1 << G];
#pragma unroll
        for (int k = 0; k < (1 << G); ++k) {
            int i = base;
#pragma unroll
            for (int g = 0; g < G; ++g) if ((k >> g) & 1) i |= 1 << bits[g];
            idx[k] = i;
            v[k] = a[i];
        }
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int k = 0; k < (1 << G); ++k) {
                if ((k >> g) & 1) continue;
                C x0 = v[k], x1 = v[k | (1 << g)], y0, y1;
                y0.x = m[g][0] * x0.x - m[g][1] * x0.y + m[g][2] * x1.x - m[g][3] * x1.y;
                y0.y = m[g][0] * x0.y + m[g][1] * x0.x + m[g][2] * x1.y + m[g][3] * x1.x;
                y1.x = m[g][4] * x0.x - m[g][5] * x0.y + m[g][6] * x1.x - m[g][7] * x1.y;
                y1.y = m[g][4] * x0.y + m[g][5] * x0.x + m[g][6] * x1.y + m[g][7] * x1.x;
                v[k] = y0;
                v[k | (1 << g)] = y1;
            }
#pragma unroll
        for (int k = 0; k < (1 << G); ++k) a[idx[k]] = v[k];
    }
}

/* The pass descriptor is a __grid_constant__ parameter: its pos / npos arrays are indexed with
   run-time values (qk__pdep, the phase tables), which on a by-value parameter compiles to a
   compare-and-select over every element (~60 instructions per access; Nsight Compute's source
   counters on the structured pass: 35% of its instructions). As a grid constant they are one
   constant-bank load. */
/* One pass of the state program over chunks of 2^L amplitudes (see the design comment).
   Block: spb states x tps threads each; grid: (states / spb) * chunks. OUT_REAL writes the real
   part only (real maps); po (float complex states, mode 1..3) the operand planes instead. */
template <typename T, bool OUT_REAL>
__global__ void qk__k_pass(const __grid_constant__ qk__pass p, const qk__instr *__restrict__ prog, int q,
                           const T *__restrict__ params, int P, int64_t n,
                           const double *__restrict__ amp_x, const double *__restrict__ amp_inv, int amp_d,
                           const qk__cx<T> *__restrict__ in, void *__restrict__ out, int spb, int tps, int stage,
                           const qk__planes_out po)
{
    extern __shared__ __align__(16) unsigned char qk__smem[];
    typedef qk__cx<T> C;
    const int N = 1 << p.L;
    const int64_t nchunks = (int64_t)1 << (q - p.L);
    const int ls = threadIdx.x / tps, lt = threadIdx.x % tps;
    const int64_t blk = blockIdx.x;
    const int64_t chunk = blk % nchunks;
    const int64_t s = (blk / nchunks) * spb + ls;
    const bool active = s < n;
    C *a = (C *)qk__smem + (size_t)ls * N;
    /* phase tables of a DIAG, per state: bits of the in-chunk index r split into lo (bl bits)
       and hi (bh bits); phase(r) = TL[lo] + TH[hi] + sum_{j in hi} E[j][lo] (see qk__diag) */
    const int bl = p.L < 7 ? p.L : 7, bh = p.L - bl;
    const int TBL = qk__tbl_size(p.L);
    T *tb = (T *)((C *)qk__smem + (size_t)spb * N) + (size_t)ls * TBL;
    const int64_t D = (int64_t)1 << q;
    uint32_t fixed = 0;
    for (int i = 0; i < q - p.L; ++i) if ((chunk >> i) & 1) fixed |= 1u << p.npos[i];
    const T *ps = params + (active ? s : 0) * (int64_t)P;
    if (stage) {
        /* the state's parameters in shared memory (after the tables): the DIAG tables' phase sums
           and the gates read them with data-dependent indices, each a dependent load, which from
           global memory waited for L1 / L2 every time */
        T *sp = (T *)((C *)qk__smem + (size_t)spb * N) + (size_t)spb * TBL + (size_t)ls * P;
        if (active)
            for (int k = lt; k < P; k += tps) sp[k] = ps[k];
        ps = sp;
        __syncthreads();
    }

    if (p.first && p.fold >= 0) {
        /* The folded leading gates make the start a product state: amplitude(g) =
           prod_k u_k[bit k of g] = TL[lo] * TH[hi] * F (F over the block's fixed bits). */
        if (active) {
            const T *u = ps + p.fold;
            C *TL = (C *)tb, *TH = TL + (1 << bl);
            for (int e = lt; e < (1 << bl) + (1 << bh); e += tps) {
                const bool lo = e < (1 << bl);
                const int v = lo ? e : e - (1 << bl), i0 = lo ? 0 : bl, nb = lo ? bl : bh;
                T ar = 1, ai = 0;
                for (int i = 0; i < nb; ++i) {
                    const T *uk = u + 4 * p.pos[i0 + i] + ((v >> i) & 1) * 2; /* QK__QV_RE0 or _RE1 */
                    T br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                    ar = br; ai = bi;
                }
                if (!lo)
                    for (int i = 0; i < q - p.L; ++i) {
                        const T *uk = u + 4 * p.npos[i] + ((fixed >> p.npos[i]) & 1) * 2;
                        T br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                        ar = br; ai = bi;
                    }
                C z; z.x = ar; z.y = ai;
                if (lo) TL[v] = z; else TH[v] = z;
            }
        }
        __syncthreads();
    }
    if (active) {
        for (int r = lt; r < N; r += tps) {
            uint32_t g = fixed | qk__pdep(r, p);
            C v;
            if (p.first && p.fold >= 0) {
                const C *TL = (const C *)tb, *TH = TL + (1 << bl);
                C l = TL[r & ((1 << bl) - 1)], h = TH[r >> bl];
                v.x = l.x * h.x - l.y * h.y;
                v.y = l.x * h.y + l.y * h.x;
            } else if (p.first) {
                if (amp_x) {
                    v.x = (g < amp_d) ? (T)(amp_x[s * amp_d + g] * amp_inv[s]) : (T)0;
                    v.y = 0;
                } else {
                    v.x = (g == 0) ? (T)1 : (T)0;
                    v.y = 0;
                }
            } else {
                v = in[s * D + g];
            }
            a[r] = v;
        }
    }
    __syncthreads();
    for (int ii = p.i0; ii < p.i1; ++ii) {
        qk__instr in_ = prog[ii];
        if (in_.kind == QK__I_DIAG) {
            /* Tables first: the quadratic phase of 2^L amplitudes costs 2^bl + 2^bh full
               evaluations plus bh * 2^bl pair sums, then ~bh/2 shared loads per amplitude with
               no divergence (a warp shares hi). The direct sum per amplitude diverged on the
               popcount and cost ~5x more at 16 qubits (qk-bench zz16 states). */
            if (active) {
                const T *cf = ps + in_.off;
                T *TL = tb, *TH = tb + (1 << bl), *Et = TH + (1 << bh);
                const T qf = qk__phase<T>(fixed, cf, q);
                if (fixed == 0) {
                    /* no fixed qubits (a one-pass state): TL[e] = cf0 + the linear terms of e's
                       bits + the pair terms of its bit pairs, the 7 + 21 coefficients read once
                       into registers and every entry an unrolled sum over the bl <= 7 bits (pos
                       ascends, so bit k2 > k1 is the higher qubit); qk__phase walks the set bits
                       with a dependent load a term (docs/benchmarks.md, "Per-call costs") */
                    T lin[7], pr[21];
#pragma unroll
                    for (int k2 = 0; k2 < 7; ++k2) {
                        const int u2 = k2 < bl ? p.pos[k2] : 0;   /* in range whatever the compiler hoists */
                        lin[k2] = k2 < bl ? cf[1 + u2] : (T)0;
#pragma unroll
                        for (int k1 = 0; k1 < k2; ++k1)
                            pr[k2 * (k2 - 1) / 2 + k1] = k2 < bl ? cf[1 + q + u2 + (k2 < bl ? p.pos[k1] : 0) * q] : (T)0;
                    }
                    for (int e = lt; e < (1 << bl); e += tps) {
                        T ph = qf;
#pragma unroll
                        for (int k2 = 0; k2 < 7; ++k2) {
                            T t = lin[k2];
#pragma unroll
                            for (int k1 = 0; k1 < k2; ++k1) t += ((e >> k1) & 1) ? pr[k2 * (k2 - 1) / 2 + k1] : (T)0;
                            ph += ((e >> k2) & 1) ? t : (T)0;
                        }
                        TL[e] = ph;
                    }
                } else {
                    for (int e = lt; e < (1 << bl); e += tps) TL[e] = qk__phase<T>(fixed | qk__pdep(e, p), cf, q);
                }
                for (int e = lt; e < (1 << bh); e += tps) TH[e] = qk__phase<T>(fixed | qk__pdep((uint32_t)e << bl, p), cf, q) - qf;
                for (int e = lt; e < (bh << bl); e += tps) {
                    /* E[j][lo]: lo's pair terms with hi bit j, an unrolled sum of independent loads */
                    const int j = e >> bl, lo = e & ((1 << bl) - 1);
                    const T *dj = cf + 1 + q + p.pos[bl + j];
                    T acc = 0;
#pragma unroll
                    for (int i = 0; i < 7; ++i)
                        if (i < bl && ((lo >> i) & 1)) acc += dj[(i < bl ? p.pos[i] : 0) * q];
                    Et[e] = acc;
                }
            }
            __syncthreads();
        }
        int G = 1;
        qk__instr g2 = in_, g3 = in_;
        if (in_.kind == QK__I_GATE && ii + 1 < p.i1) {
            g2 = prog[ii + 1];
            if (g2.kind == QK__I_GATE && g2.b0 != in_.b0) {
                G = 2;
                if (ii + 2 < p.i1) {
                    g3 = prog[ii + 2];
                    if (g3.kind == QK__I_GATE && g3.b0 != in_.b0 && g3.b0 != g2.b0) G = 3;
                }
            }
        }
        if (active && G > 1) {
            const int bits[3] = {in_.b0, g2.b0, g3.b0};
            const T *ms[3] = {ps + in_.off, ps + g2.off, ps + g3.off};
            if (G == 3) qk__gate_group<T, 3>(a, N, lt, tps, bits, ms);
            else qk__gate_group<T, 2>(a, N, lt, tps, bits, ms);
        } else if (active) {
            if (in_.kind == QK__I_GATE) {
                const T *m = ps + in_.off;
                T m00r = m[0], m00i = m[1], m01r = m[2], m01i = m[3], m10r = m[4], m10i = m[5], m11r = m[6], m11i = m[7];
                int b = in_.b0;
                for (int t = lt; t < N / 2; t += tps) {
                    int i0 = ((t >> b) << (b + 1)) | (t & ((1 << b) - 1));
                    int i1 = i0 | (1 << b);
                    C x0 = a[i0], x1 = a[i1], y0, y1;
                    y0.x = m00r * x0.x - m00i * x0.y + m01r * x1.x - m01i * x1.y;
                    y0.y = m00r * x0.y + m00i * x0.x + m01r * x1.y + m01i * x1.x;
                    y1.x = m10r * x0.x - m10i * x0.y + m11r * x1.x - m11i * x1.y;
                    y1.y = m10r * x0.y + m10i * x0.x + m11r * x1.y + m11i * x1.x;
                    a[i0] = y0;
                    a[i1] = y1;
                }
            } else if (in_.kind == QK__I_CNOT) {
                int bc = in_.b0, bt = in_.b1;
                for (int t = lt; t < N / 2; t += tps) {
                    int i0 = ((t >> bt) << (bt + 1)) | (t & ((1 << bt) - 1));
                    if ((i0 >> bc) & 1) {
                        int i1 = i0 | (1 << bt);
                        C tmp = a[i0];
                        a[i0] = a[i1];
                        a[i1] = tmp;
                    }
                }
            } else { /* DIAG */
                const T *TL = tb, *TH = tb + (1 << bl), *Et = TH + (1 << bh);
                for (int r = lt; r < N; r += tps) {
                    const int lo = r & ((1 << bl) - 1), hi = r >> bl;
                    T ph = TL[lo] + TH[hi], sn, cs;
                    for (int j = 0; j < bh; ++j)
                        if ((hi >> j) & 1) ph += Et[(j << bl) | lo];
                    qk__sincos(ph, &sn, &cs);
                    C v = a[r], y;
                    y.x = v.x * cs - v.y * sn;
                    y.y = v.x * sn + v.y * cs;
                    a[r] = y;
                }
            }
        }
        __syncthreads();
        ii += G - 1;
    }
    if (active) {
        for (int r = lt; r < N; r += tps) {
            uint32_t g = fixed | qk__pdep(r, p);
            if (OUT_REAL) ((T *)out)[s * D + g] = a[r].x;
            else if (sizeof(T) == 4 && po.mode) qk__planes_put(po, out, s, D, g, (float)a[r].x, (float)a[r].y);
            else ((C *)out)[s * D + g] = a[r];
        }
    }
}

/* The structured pass: a pass of QK__PASS_QUBITS in-chunk qubits whose program is DIAG phases
   and Hadamards only (zz, iqp and their entanglement variants: every pass of them). The generic
   pass above spends ~360 instructions per amplitude there (16 qubits, Nsight Compute: issue
   bound, a 2x2 complex matrix per gate, sweeps through shared memory); this one keeps each
   thread's R = 2^RB amplitudes in registers:
   - the runs of Hadamards between phases are a Walsh-Hadamard transform over their bits: add /
     subtract butterflies on the register bits, one scale (1/sqrt 2)^m, and a transpose through
     shared memory (swizzled: no bank conflicts) to bring the next bits into registers; the
     chunk's 13 bits take 3 register layouts, 2 transposes;
   - a phase is base(thread) + sum_{j in k} e_j + sum_{j<j' in k} d_jj' over the set register
     bits j of register slot k: base and e_j once per thread from the quadratic form's
     coefficients, then a handful of adds per amplitude (k is a compile-time index).
   Layout rb0: register bit j of thread t is in-chunk bit rb0 + j; the thread's bits fill the
   others in order. Layouts rb0 >= 5 put in-chunk bits 0..4 on the lanes of a warp (coalesced
   global loads and stores when those are global bits 0..4, as the compiler's fill makes them).
   One state chunk per block, 2^(L - RB) threads; the host sends other passes to qk__k_pass. */
template <int RB> struct qk__wht_layouts;
template <> struct qk__wht_layouts<5> { static constexpr int n = 3; __device__ static int at(int i) { return i == 0 ? 8 : i == 1 ? 0 : 5; } };
template <> struct qk__wht_layouts<4> { static constexpr int n = 4; __device__ static int at(int i) { return i == 0 ? 9 : (i - 1) * 4; } };

__device__ __forceinline__ uint32_t qk__wht_tpart(uint32_t t, int rb0, int RB)
{
    return (t & ((1u << rb0) - 1)) | ((t >> rb0) << (rb0 + RB));
}
__device__ __forceinline__ uint32_t qk__wht_swz(uint32_t r) { return r ^ ((r >> 5) & 31); }
/* The global amplitude index of register slot k of thread t in layout cur: the thread's part
   (fixed bits and its in-chunk bits) or the qubits of the set register bits (k is a
   compile-time index at every use: the selection folds away). */
template <int RB> struct qk__wht_gidx {
    uint32_t gt, gb[RB];
    __device__ __forceinline__ qk__wht_gidx(const qk__pass &p, uint32_t fixed, uint32_t t, int cur)
    {
        gt = fixed | qk__pdep(qk__wht_tpart(t, cur, RB), p);
#pragma unroll
        for (int j = 0; j < RB; ++j) gb[j] = 1u << p.pos[cur + j];
    }
    __device__ __forceinline__ uint32_t operator()(int k) const
    {
        uint32_t g = gt;
#pragma unroll
        for (int j = 0; j < RB; ++j) if ((k >> j) & 1) g |= gb[j];
        return g;
    }
};
/* A DIAG's phase on a thread's 2^RB register amplitudes: slot k gets base + sum of e_j over its set
   register bits j + sum of dd[j'][j] over its pairs of them (k is a compile-time index: a handful
   of adds per amplitude); the structured passes' shared last step (qk__k_pass_wht, qk__k_states_fz). */
template <typename T, int RB, typename V>
__device__ __forceinline__ void qk__wht_phase(T base, const T (&e)[RB], const T (&dd)[RB][RB], V (&v)[1 << RB])
{
#pragma unroll
    for (int k = 0; k < (1 << RB); ++k) {
        T ph = base, sn, cs;
#pragma unroll
        for (int j = 0; j < RB; ++j) {
            if (!((k >> j) & 1)) continue;
            ph += e[j];
#pragma unroll
            for (int jj = 0; jj < RB; ++jj) if (jj < j && ((k >> jj) & 1)) ph += dd[jj][j];
        }
        qk__sincos(ph, &sn, &cs);
        const V a = v[k];
        v[k].x = a.x * cs - a.y * sn;
        v[k].y = a.x * sn + a.y * cs;
    }
}

/* T values of the structured pass's tables: the phase tables (at most 13 + 1 + 16 + 32 + 5 * 16
   + 5 * 16 + 5 * 32 for RB 4 or 5), then the fold's 16 + 32 + 1 complex */
#define QK__WHT_TBL 448

template <typename T, int RB, bool OUT_REAL>
__global__ void __launch_bounds__(1 << (QK__PASS_QUBITS - RB))
qk__k_pass_wht(const __grid_constant__ qk__pass p, const qk__instr *__restrict__ prog, int q, const T *__restrict__ params, int P,
               const qk__cx<T> *__restrict__ in, void *__restrict__ out, const qk__planes_out po)
{
    constexpr int L = QK__PASS_QUBITS, R = 1 << RB;
    typedef qk__cx<T> C;
    typedef typename qk__vec2<T>::t V2;
    typedef qk__wht_layouts<RB> LY;
    extern __shared__ __align__(16) unsigned char qk__smem[];
    C *sh = (C *)qk__smem;
    T *tb = (T *)(sh + (1 << L)); /* the phase tables, then the fold's */
    constexpr int NHI = L - RB - 4; /* thread bits 0..3 index the "lo" tables, the others "hi" */
    const uint32_t t = threadIdx.x;
    const int64_t nchunks = (int64_t)1 << (q - L);
    const int64_t s = blockIdx.x / nchunks, chunk = blockIdx.x % nchunks;
    const int64_t D = (int64_t)1 << q;
    uint32_t fixed = 0;
    for (int i = 0; i < q - L; ++i) if ((chunk >> i) & 1) fixed |= 1u << p.npos[i];
    const T *ps = params + s * (int64_t)P;
    int cur = LY::at(0);
    C v[R];

    /* start: the folded product state, |0>, or the previous pass's amplitudes */
    {
        if (p.first && p.fold >= 0) {
            /* prod over qubits of u_Q[bit]: the thread's factor from block tables (fixed bits,
               thread bits 0..3, thread bits 4..), then a product tree over the register bits
               (2 complex products per amplitude) */
            const T *u = ps + p.fold;
            C *UL = (C *)(tb + QK__WHT_TBL), *UH = UL + 16, *UF = UH + (1 << NHI);
            if (t < 16 + (1u << NHI) + 1) {
                const bool lo = t < 16, hi = !lo && t < 16 + (1u << NHI);
                const uint32_t e = lo ? t : t - 16;
                T ar = 1, ai = 0;
                if (lo || hi)
                    for (int i = 0; i < (lo ? 4 : NHI); ++i) {
                        const int b = lo ? i : 4 + i, ib = b < cur ? b : b + RB;
                        const T *uk = u + 4 * p.pos[ib] + ((e >> i) & 1) * 2;
                        T br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                        ar = br; ai = bi;
                    }
                else
                    for (int i = 0; i < q - L; ++i) {
                        const T *uk = u + 4 * p.npos[i] + ((fixed >> p.npos[i]) & 1) * 2;
                        T br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                        ar = br; ai = bi;
                    }
                C z; z.x = ar; z.y = ai;
                if (lo) UL[e] = z; else if (hi) UH[e] = z; else UF[0] = z;
            }
            __syncthreads();
            C a = UF[0], l = UL[t & 15], h = UH[t >> 4], m;
            m.x = a.x * l.x - a.y * l.y; m.y = a.x * l.y + a.y * l.x;
            v[0].x = m.x * h.x - m.y * h.y; v[0].y = m.x * h.y + m.y * h.x;
            /* constant trip counts throughout: an inner bound of 1 << j kept the loops rolled
               and made v[] dynamically indexed (a compare-and-select over all 32 registers per
               access: 35% of the pass's instructions, Nsight Compute source counters) */
#pragma unroll
            for (int j = 0; j < RB; ++j) {
                const T *u0 = u + 4 * p.pos[cur + j], *u1 = u0 + 2;
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    if (k >= (1 << j)) continue;
                    C a = v[k], b, c;
                    b.x = a.x * u1[0] - a.y * u1[1]; b.y = a.x * u1[1] + a.y * u1[0];
                    c.x = a.x * u0[0] - a.y * u0[1]; c.y = a.x * u0[1] + a.y * u0[0];
                    v[k | (1 << j)] = b;
                    v[k] = c;
                }
            }
        } else {
            const qk__wht_gidx<RB> gi(p, fixed, t, cur);
#pragma unroll
            for (int k = 0; k < R; ++k) {
                const uint32_t g = gi(k);
                if (p.first) { v[k].x = g == 0 ? (T)1 : (T)0; v[k].y = 0; }
                else { const V2 w = ((const V2 *)in)[s * D + g]; v[k].x = w.x; v[k].y = w.y; }
            }
        }
    }

    /* moves the amplitudes to layout nw through shared memory */
    auto transpose = [&](int nw) {
        const uint32_t to = qk__wht_tpart(t, cur, RB), tn = qk__wht_tpart(t, nw, RB);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < R; ++k) sh[qk__wht_swz(to | ((uint32_t)k << cur))] = v[k];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < R; ++k) v[k] = sh[qk__wht_swz(tn | ((uint32_t)k << nw))];
        cur = nw;
    };
    /* the pending Hadamards (a mask of in-chunk bits; H H = I) as one transform */
    auto flush = [&](uint32_t pend) {
        const int m = __popc(pend);
        while (pend) {
            uint32_t rm = ((1u << RB) - 1) << cur;
            if (!(pend & rm)) {
                int best = cur, bc = 0;
                for (int i = 0; i < LY::n; ++i) {
                    int c = __popc(pend & (((1u << RB) - 1) << LY::at(i)));
                    if (c > bc) { bc = c; best = LY::at(i); }
                }
                transpose(best);
                rm = ((1u << RB) - 1) << cur;
            }
#pragma unroll
            for (int j = 0; j < RB; ++j) {
                if (!((pend >> (cur + j)) & 1)) continue;
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    if ((k >> j) & 1) continue;
                    C a = v[k], b = v[k | (1 << j)];
                    v[k].x = a.x + b.x; v[k].y = a.y + b.y;
                    v[k | (1 << j)].x = a.x - b.x; v[k | (1 << j)].y = a.y - b.y;
                }
            }
            pend &= ~rm;
        }
        if (m) {
            const T sc = (T)ldexp((m & 1) ? 0.70710678118654752440 : 1.0, -(m >> 1));
#pragma unroll
            for (int k = 0; k < R; ++k) { v[k].x *= sc; v[k].y *= sc; }
        }
    };

    uint32_t pend = 0;
    for (int ii = p.i0; ii < p.i1; ++ii) {
        const qk__instr in_ = prog[ii];
        if (in_.kind == QK__I_GATE) { pend ^= 1u << in_.b0; continue; }
        flush(pend);
        pend = 0;
        /* DIAG: phase(g) = cf[0] + sum_{i set} cf[1+i] + sum_{i<j set} cf[1+q+i*q+j] */
        const T *cf = ps + in_.off;
        /* base and e_j from block tables, no per-thread loops over set bits (they diverged and
           cost ~40% of the pass). Thread bit b is in-chunk bit ib(b) (b < cur ? b : b + RB),
           global qubit pos[ib(b)]; W[r]: in-chunk bit r's linear coefficient plus its pairs with
           the fixed bits; TLo / THi: the phase of thread bits 0..3 / 4.. (W and their pairs);
           Y[i][lo]: pairs of thread bit 4+i with bits 0..3; G[j][lo] / H[j][hi]: pairs of
           register bit j with thread bits 0..3 / 4... */
        T *W = tb, *Pf = W + L, *TLo = Pf + 1, *THi = TLo + 16, *Y = THi + (1 << NHI), *G = Y + NHI * 16,
          *H = G + RB * 16;
        auto dq = [&](int a, int b) { return cf[1 + q + (a < b ? a * q + b : b * q + a)]; };
        auto tq = [&](int b) { return p.pos[b < cur ? b : b + RB]; }; /* thread bit -> qubit */
        __syncthreads(); /* the previous DIAG's readers are done */
        if (t < L) {
            const int Q = p.pos[t];
            T acc = cf[1 + Q];
            for (int i = 0; i < q - L; ++i) if ((fixed >> p.npos[i]) & 1) acc += dq(p.npos[i], Q);
            W[t] = acc;
        } else if (t == L) Pf[0] = qk__phase<T>(fixed, cf, q);
        __syncthreads();
        {
            int e = (int)t;
            T acc = 0;
            if (e < 16) {
                for (int b = 0; b < 4; ++b) {
                    if (!((e >> b) & 1)) continue;
                    acc += W[b < cur ? b : b + RB];
                    for (int b2 = 0; b2 < b; ++b2) if ((e >> b2) & 1) acc += dq(tq(b2), tq(b));
                }
                TLo[e] = acc;
            } else if ((e -= 16) < (1 << NHI)) {
                for (int i = 0; i < NHI; ++i) {
                    if (!((e >> i) & 1)) continue;
                    acc += W[4 + i < cur ? 4 + i : 4 + i + RB];
                    for (int i2 = 0; i2 < i; ++i2) if ((e >> i2) & 1) acc += dq(tq(4 + i2), tq(4 + i));
                }
                THi[e] = acc;
            } else if ((e -= 1 << NHI) < NHI * 16) {
                const int i = e >> 4, lo = e & 15;
                for (int b = 0; b < 4; ++b) if ((lo >> b) & 1) acc += dq(tq(b), tq(4 + i));
                Y[e] = acc;
            } else if ((e -= NHI * 16) < RB * 16) {
                const int j = e >> 4, lo = e & 15;
                for (int b = 0; b < 4; ++b) if ((lo >> b) & 1) acc += dq(tq(b), p.pos[cur + j]);
                G[e] = acc;
            } else if ((e -= RB * 16) < RB << NHI) {
                const int j = e >> NHI, hi = e & ((1 << NHI) - 1);
                for (int i = 0; i < NHI; ++i) if ((hi >> i) & 1) acc += dq(tq(4 + i), p.pos[cur + j]);
                H[e] = acc;
            }
        }
        __syncthreads();
        const uint32_t tl = t & 15, th = t >> 4;
        T base = Pf[0] + TLo[tl] + THi[th];
#pragma unroll
        for (int i = 0; i < NHI; ++i) base += ((th >> i) & 1) ? Y[i * 16 + tl] : (T)0;
        T e[RB], dd[RB][RB];
#pragma unroll
        for (int j = 0; j < RB; ++j) {
            e[j] = W[cur + j] + G[j * 16 + tl] + H[(j << NHI) + th];
#pragma unroll
            for (int jj = 0; jj < RB; ++jj) if (jj < j) dd[jj][j] = cf[1 + q + p.pos[cur + jj] * q + p.pos[cur + j]];
        }
        qk__wht_phase<T, RB>(base, e, dd, v);
    }
    flush(pend);

    /* store from a layout with in-chunk bits 0..4 on the lanes */
    if (cur < 5) transpose(LY::at(0));
    const qk__wht_gidx<RB> gi(p, fixed, t, cur);
    /* one loop a format, as the fused kernel's store (docs/benchmarks.md, "Every state builder
       writes the planes") */
    if (OUT_REAL || sizeof(T) != 4 || !po.mode) {
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const uint32_t g = gi(k);
            if (OUT_REAL) ((T *)out)[s * D + g] = v[k].x;
            else { V2 w; w.x = v[k].x; w.y = v[k].y; ((V2 *)out)[s * D + g] = w; } /* one 8/16-byte store */
        }
    } else if (po.mode == 1) {
#pragma unroll
        for (int k = 0; k < R; ++k)
            qk__gauss_store<__half, false>(make_float2((float)v[k].x, (float)v[k].y), 0xFu, po.scale, (__half *)out + s * D + gi(k), D, po.ps);
    } else if (po.mode == 3) {
#pragma unroll
        for (int k = 0; k < R; ++k)
            qk__gauss_store<__half, true>(make_float2((float)v[k].x, (float)v[k].y), 0xFu, po.scale, (__half *)out + s * 4 * D + gi(k), D, po.ps);
    } else {
#pragma unroll
        for (int k = 0; k < R; ++k)
            qk__gauss_store<__nv_bfloat16, false>(make_float2((float)v[k].x, (float)v[k].y), 0xFu, po.scale,
                                                  (__nv_bfloat16 *)out + s * D + gi(k), D, po.ps);
    }
}

/* Product maps: per sample and qubit the 2-vector u_k = (ops on qubit k) |0>. */
template <typename T>
__global__ void qk__k_qubit_vectors(const int *__restrict__ qops, const int *__restrict__ qoff, int q,
                                    const qk_angle *__restrict__ ang, const int *__restrict__ op_kind,
                                    const double *__restrict__ x, int64_t n, int d, const double *__restrict__ w,
                                    T *__restrict__ u)
{
    int64_t id = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (id >= n * q) return;
    int64_t s = id / q;
    int k = (int)(id % q);
    const double *xs = x + s * d;
    double a0r = 1, a0i = 0, a1r = 0, a1i = 0;
    const double R = 0.70710678118654752440, PI = 3.14159265358979323846;
    for (int o = qoff[k]; o < qoff[k + 1]; ++o) {
        int op = qops[o];
        double t = qk__theta(ang, op, xs, w);
        double c = cos(0.5 * t), sn = sin(0.5 * t);
        double b0r = a0r, b0i = a0i, b1r = a1r, b1i = a1i;
        switch (op_kind[op]) {
        case QK_OP_H: a0r = R * (b0r + b1r); a0i = R * (b0i + b1i); a1r = R * (b0r - b1r); a1i = R * (b0i - b1i); break;
        case QK_OP_X: a0r = b1r; a0i = b1i; a1r = b0r; a1i = b0i; break;
        case QK_OP_Y: a0r = b1i; a0i = -b1r; a1r = -b0i; a1i = b0r; break; /* (-i b1, i b0) */
        case QK_OP_Z: a1r = -b1r; a1i = -b1i; break;
        case QK_OP_RX: /* (c b0 - i s b1, -i s b0 + c b1) */
            a0r = c * b0r + sn * b1i; a0i = c * b0i - sn * b1r;
            a1r = sn * b0i + c * b1r; a1i = -sn * b0r + c * b1i; break;
        case QK_OP_RY: a0r = c * b0r - sn * b1r; a0i = c * b0i - sn * b1i; a1r = sn * b0r + c * b1r; a1i = sn * b0i + c * b1i; break;
        case QK_OP_RZ: /* e^{-it/2} b0, e^{it/2} b1 */
            a0r = c * b0r + sn * b0i; a0i = c * b0i - sn * b0r;
            a1r = c * b1r - sn * b1i; a1i = c * b1i + sn * b1r; break;
        case QK_OP_P: { double cp = cos(t), sp = sin(t); a1r = cp * b1r - sp * b1i; a1i = cp * b1i + sp * b1r; } break;
        case QK_OP_BASIS:
            if (xs[ang[op].x0] > 0.5) { a0r = b1r; a0i = b1i; a1r = b0r; a1i = b0i; }
            break;
        default: break;
        }
        (void)PI;
    }
    T *o = u + (s * q + k) * 4; /* the shared layout (QK__QV_*) */
    o[QK__QV_RE0] = (T)a0r; o[QK__QV_IM0] = (T)a0i; o[QK__QV_RE1] = (T)a1r; o[QK__QV_IM1] = (T)a1i;
}

/* Build scratch of qk__build_states: params (n * P), a state buffer for multi-pass programs
   (n * 2^q complex), inverse norms. All from the caller's workspace. */
struct qk__build_ws {
    void *params = nullptr;
    void *tmp = nullptr;       /* multi-pass: complex states */
    double *inv = nullptr;
};

/* qk__k_prep: one block of 128 threads per sample. */
template <typename T>
static qk_result qk__launch_prep(const qk__prog &pg, const qk__dprog &dp, const double *dx, int64_t n, T *params,
                                 cudaStream_t st, qk__err *E)
{
    qk__k_prep<T><<<(unsigned)n, 128, 0, st>>>(dp.jobs, (int)pg.jobs.size(), dp.con, dp.ang, dp.op_kind, dx, n,
                                                pg.d, dp.w, params, pg.P);
    QK_LAUNCH_CK("qk__k_prep");
    return QK_OK;
}

/* qk__k_invnorm: one thread per sample. */
static qk_result qk__launch_invnorm(const double *dx, int64_t n, int d, double *inv, cudaStream_t st, qk__err *E)
{
    qk__k_invnorm<<<(unsigned)((n + 127) / 128), 128, 0, st>>>(dx, n, d, inv);
    QK_LAUNCH_CK("qk__k_invnorm");
    return QK_OK;
}

/* qk__k_pass: spb states of tps threads per block, one block per (state group, chunk); shared
   memory holds the spb chunks of 2^L amplitudes, their phase tables and, where they fit in
   QK__PASS_STAGE_BYTES, their parameters. */
#define QK__PASS_STAGE_BYTES ((size_t)16 << 10)
template <typename T>
static qk_result qk__launch_pass(const qk__pass &p, const qk__prog &pg, const qk__dprog &dp, int64_t n, const double *ampx,
                                 const qk__build_ws &ws, const qk__cx<T> *in, void *out, bool out_real, int spb, int tps,
                                 const qk__planes_out &po, cudaStream_t st, qk__err *E)
{
    const int q = pg.q, N = 1 << p.L;
    const int64_t nchunks = (int64_t)1 << (q - p.L);
    const int64_t groups = (n + spb - 1) / spb;
    size_t smem = (size_t)spb * N * sizeof(qk__cx<T>) + (size_t)spb * qk__tbl_size(p.L) * sizeof(T);
    /* the parameters staged in shared memory where they take at most QK__PASS_STAGE_BYTES a block */
    const size_t pbytes = (size_t)spb * pg.P * sizeof(T);
    const int stage = pbytes <= QK__PASS_STAGE_BYTES ? 1 : 0;
    if (stage) smem += pbytes;
    auto kf = out_real ? qk__k_pass<T, true> : qk__k_pass<T, false>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kf<<<(unsigned)(groups * nchunks), spb * tps, smem, st>>>(p, dp.instr, q, (const T *)ws.params, pg.P, n, ampx, ws.inv,
                                                             pg.has_amp ? pg.d : 0, in, out, spb, tps, stage, po);
    QK_LAUNCH_CK("qk__k_pass");
    return QK_OK;
}

/* A pass qk__k_pass_wht runs: a full chunk (L = QK__PASS_QUBITS) whose instructions are DIAG
   phases and Hadamards only, starting from the folded product, |0> or the previous pass (not
   from amplitude data). */
static bool qk__pass_is_wht(const qk__pass &p, const qk__prog &pg)
{
    if (p.L != QK__LMAX || (p.first && pg.has_amp)) return false;
    for (int ii = p.i0; ii < p.i1; ++ii) {
        const qk__instr &in_ = pg.instr[ii];
        if (in_.kind == QK__I_CNOT || (in_.kind == QK__I_GATE && !in_.h)) return false;
    }
    return true;
}

/* qk__k_pass_wht: one block of 2^(L - RB) threads per (state, chunk); RB = 5 register bits for
   float, 4 for double (the same 64 registers of amplitudes); shared memory holds one chunk. */
template <typename T>
static qk_result qk__launch_pass_wht(const qk__pass &p, const qk__prog &pg, const qk__dprog &dp, int64_t n,
                                     const qk__build_ws &ws, const qk__cx<T> *in, void *out, bool out_real,
                                     const qk__planes_out &po, cudaStream_t st, qk__err *E)
{
    constexpr int RB = sizeof(T) == 4 ? 5 : 4;
    const int q = pg.q;
    const int64_t nchunks = (int64_t)1 << (q - p.L);
    const size_t smem = ((size_t)1 << p.L) * sizeof(qk__cx<T>) + (QK__WHT_TBL + 2 * 64) * sizeof(T);
    auto kf = out_real ? qk__k_pass_wht<T, RB, true> : qk__k_pass_wht<T, RB, false>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kf<<<(unsigned)(n * nchunks), 1u << (p.L - RB), smem, st>>>(p, dp.instr, q, (const T *)ws.params, pg.P, in, out, po);
    QK_LAUNCH_CK("qk__k_pass_wht");
    return QK_OK;
}

/* The fused structured pass (q = 14, 15, 16; complex or real fp32): the two structured passes of
   a zz-like program in one kernel. A thread-block cluster of C = 2^(q - 13) blocks holds one state,
   a chunk of 2^13 amplitudes per block in shared memory. Each block runs the first pass's program
   on its chunk (the first pass's fixed qubits 13.. = its cluster rank), then writes the chunk
   straight into the shared memory of the blocks that own it in the second pass (the second pass
   fixes qubits 13 - c..12, c = q - 13: distributed shared memory, one 256-byte row per warp and
   register), and after the cluster barrier runs the second pass's program and stores the state
   once. Against the two launches of qk__k_pass_wht: one global write per amplitude instead of
   write, read, write; and every shared-memory transpose and the store have compile-time offsets:
   - the chunk buffer is padded (element r at r + (r >> 5)) instead of XOR-swizzled: padding is
     additive over disjoint bits, so an access is a per-thread base plus an immediate (the
     swizzled transposes cost ~6 address instructions per access with the layout a run-time
     value); every access pattern below is free of bank conflicts (lanes step 1 or 33 elements);
   - the layouts are the same three (register bits at 8, 0 or 5), the transposes dispatched over
     the six (from, to) pairs;
   - the Hadamards' (1/sqrt 2)^m scales are one factor (the host's count over both passes) put on
     the start (the program is linear), not a multiply per amplitude and transform.
   The host sends only the canonical pass pair (pass 1: qubits 0..12, starting from the folded
   product or |0>; pass 2: qubits 0..12-c and 13..q-1) here; QK_STATES_OLD=1 in the environment
   keeps the two-launch path (A/B). Compute capability 9.0 or later, with a build for it. */
#define QK__FZ_SH 8448 /* elements of the padded chunk: 8191 + (8191 >> 5) + 1, rounded up */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ int qk__fz_built = 1;
#else
__device__ int qk__fz_built = 0;
#endif

__device__ __forceinline__ uint32_t qk__fz_pad(uint32_t r) { return r + (r >> 5); }
/* the padded offset of register slot k in layout LAY (k << LAY's pad; a constant after unrolling) */
__host__ __device__ constexpr uint32_t qk__fz_k(int lay, int k) { return (uint32_t)((k << lay) + ((k << lay) >> 5)); }
/* the global qubit of register bit j in the second pass's layout 8 (in-chunk bit 8 + j) */
__host__ __device__ constexpr uint32_t qk__fz_g2(int cb, int k)
{
    uint32_t g = 0;
    for (int j = 0; j < 5; ++j)
        if ((k >> j) & 1) g |= 1u << (8 + j < 13 - cb ? 8 + j : 8 + j + cb);
    return g;
}

template <int FROM, int TO>
__device__ __forceinline__ void qk__fz_tr(float2 *sh, float2 (&v)[32], uint32_t t)
{
    const uint32_t bf = qk__fz_pad(qk__wht_tpart(t, FROM, 5)), bt = qk__fz_pad(qk__wht_tpart(t, TO, 5));
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 32; ++k) sh[bf + qk__fz_k(FROM, k)] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 32; ++k) v[k] = sh[bt + qk__fz_k(TO, k)];
}

/* to layout nw (8, 0 or 5) */
__device__ __forceinline__ void qk__fz_move(float2 *sh, float2 (&v)[32], uint32_t t, int &cur, int nw)
{
    if (cur == nw) return;
    if (cur == 8) { if (nw == 0) qk__fz_tr<8, 0>(sh, v, t); else qk__fz_tr<8, 5>(sh, v, t); }
    else if (cur == 0) { if (nw == 8) qk__fz_tr<0, 8>(sh, v, t); else qk__fz_tr<0, 5>(sh, v, t); }
    else { if (nw == 8) qk__fz_tr<5, 8>(sh, v, t); else qk__fz_tr<5, 0>(sh, v, t); }
    cur = nw;
}

/* butterflies on the register bits of MASK (a constant: straight-line code whose results the
   compiler renames; a run-time test per bit costs a move per value and bit at its merge) */
template <uint32_t MASK>
__device__ __forceinline__ void qk__fz_bf(float2 (&v)[32])
{
#pragma unroll
    for (int j = 0; j < 5; ++j) {
        if (!((MASK >> j) & 1)) continue;
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            if ((k >> j) & 1) continue;
            const float2 a = v[k], b = v[k | (1 << j)];
            v[k].x = a.x + b.x; v[k].y = a.y + b.y;
            v[k | (1 << j)].x = a.x - b.x; v[k | (1 << j)].y = a.y - b.y;
        }
    }
}

/* the layout a flush of pend runs its next butterflies in: cur while it holds pending bits, else
   the one of 8, 0, 5 (in that order) that holds the most (the host's qk__fz_plan follows it too) */
__host__ __device__ __forceinline__ int qk__fz_pick(uint32_t pend, int cur)
{
    if (pend & (31u << cur)) return cur;
    int best = cur, bc = 0;
    for (int i = 0; i < 3; ++i) {
        const int lay = i == 0 ? 8 : i == 1 ? 0 : 5;
        const int c = __builtin_popcount(pend & (31u << lay));
        if (c > bc) { bc = c; best = lay; }
    }
    return best;
}

/* the pending Hadamards (a mask of in-chunk bits) as one unscaled transform; the register masks
   of zz and iqp (all five bits; three low or three high) take straight-line code */
__device__ __forceinline__ void qk__fz_flush(float2 *sh, float2 (&v)[32], uint32_t t, int &cur, uint32_t pend)
{
    while (pend) {
        qk__fz_move(sh, v, t, cur, qk__fz_pick(pend, cur));
        const uint32_t msk = (pend >> cur) & 31;
        if (msk == 31) qk__fz_bf<31>(v);
        else if (msk == 7) qk__fz_bf<7>(v);
        else if (msk == 28) qk__fz_bf<28>(v);
        else {
            if (msk & 1) qk__fz_bf<1>(v);
            if (msk & 2) qk__fz_bf<2>(v);
            if (msk & 4) qk__fz_bf<4>(v);
            if (msk & 8) qk__fz_bf<8>(v);
            if (msk & 16) qk__fz_bf<16>(v);
        }
        pend &= ~(31u << cur);
    }
}

/* The fused kernel's program, made on the host (qk__fz_plan): per pass, the steps (the Hadamards
   pending before each DIAG, as a mask of in-chunk bits, then the DIAG's index, -1 at the pass's
   end) and per DIAG its pass, its coefficients' offset in the params and the register layout it
   runs in (the host follows qk__fz_flush's choice of layouts). A grid constant: the kernel reads
   it from the constant bank instead of walking the instruction list in global memory (a dependent
   load per instruction: 9 % of the kernel's stall samples at 16 qubits, Nsight Compute). */
#define QK__FZ_MAXS 8
#define QK__FZ_MAXD 4
#define QK__FZ_MAXP 2048 /* params per state the kernel stages in shared memory at most (8 KB: two blocks per SM stay) */
#define QK__FZ_TBL 272 /* floats of one DIAG's tables: W 13, Pf 1, TLo 16, THi 16, Y 64, G 80, H 80 */
struct qk__fz_steps {
    int n[2];
    uint32_t pend[2][QK__FZ_MAXS];
    int dg[2][QK__FZ_MAXS];
    int nd;
    int d_pass[QK__FZ_MAXD], d_off[QK__FZ_MAXD], d_lay[QK__FZ_MAXD];
    int fold; /* pass 1 starts from the folded product at this offset of the params, or -1: |0> */
};

/* The global qubit of in-chunk bit r in pass pi (pass 1: r; pass 2: r below 13 - cb, r + cb
   above) and of the pass's fixed bit i (13 + i; 13 - cb + i): the pass pair qk__fz_fits takes. */
__host__ __device__ __forceinline__ int qk__fz_pos(int pi, int cb, int r) { return pi == 0 || r < 13 - cb ? r : r + cb; }
__host__ __device__ __forceinline__ int qk__fz_npos(int pi, int cb, int i) { return (pi == 0 ? 13 : 13 - cb) + i; }

/* Every DIAG's tables at once, before the passes (qk__k_pass_wht builds them per DIAG, three
   block barriers each): W[r], in-chunk bit r's linear coefficient plus its pairs with the fixed
   bits; Pf, the fixed bits' phase; TLo / THi, the phase of thread bits 0..3 / 4..7; Y[i][lo], pairs
   of thread bit 4 + i with bits 0..3; G[j][lo] / H[j][hi], pairs of register bit j with thread
   bits 0..3 / 4..7. Thread bit b is in-chunk bit b (b < lay) or b + 5 in the DIAG's layout lay.
   The sums are unrolled with every coefficient loaded and the unset terms selected away: loops
   over the set bits made each entry a chain of dependent shared-memory loads, and the block
   waited for its slowest entry (38 % of the kernel's stall samples at 16 qubits). */
template <int CB>
__device__ __forceinline__ void qk__fz_tables(const qk__fz_steps &st, uint32_t rank, const float *pv, int q, float *tb, uint32_t t)
{
    constexpr int L = 13, RB = 5;
    if ((int)t < 14 * st.nd) {
        const int d = (int)t / 14, e = (int)t % 14, pi = st.d_pass[d];
        const float *cf = pv + st.d_off[d];
        float acc;
        if (e < L) { /* W[e] */
            const int Q = qk__fz_pos(pi, CB, e);
            acc = cf[1 + Q];
#pragma unroll
            for (int i = 0; i < CB; ++i) {
                const int nq = qk__fz_npos(pi, CB, i); /* fixed and in-chunk qubits differ */
                const float x = cf[1 + q + (nq < Q ? nq * q + Q : Q * q + nq)];
                acc += ((rank >> i) & 1) ? x : 0.f;
            }
        } else { /* Pf: the phase of the fixed bits alone (ascending qubits) */
            acc = cf[0];
#pragma unroll
            for (int i = 0; i < CB; ++i) {
                const int nq = qk__fz_npos(pi, CB, i);
                float x = cf[1 + nq];
#pragma unroll
                for (int i2 = 0; i2 < i; ++i2) {
                    const float y = cf[1 + q + qk__fz_npos(pi, CB, i2) * q + nq];
                    x += ((rank >> i2) & 1) ? y : 0.f;
                }
                acc += ((rank >> i) & 1) ? x : 0.f;
            }
        }
        tb[d * QK__FZ_TBL + e] = acc;
    }
    __syncthreads();
    /* entry e = t of each DIAG's TLo (0..15), THi (16..31), Y (32..95), G (96..175), H (176..255),
       stored at 14 + e */
    const int e = (int)t;
#pragma unroll
    for (int d = 0; d < QK__FZ_MAXD; ++d) {
        if (d >= st.nd) break;
        const int pi = st.d_pass[d], cur = st.d_lay[d];
        const float *cf = pv + st.d_off[d];
        const float *W = tb + d * QK__FZ_TBL;
        auto dq = [&](int a, int b) { return cf[1 + q + (a < b ? a * q + b : b * q + a)]; };
        auto ib = [&](int b) { return b < cur ? b : b + RB; }; /* thread bit -> in-chunk bit */
        float acc = 0;
        if (e < 32) {
            const int b0 = (e >> 4) * 4, m = e & 15; /* TLo: thread bits 0..3; THi: 4..7 */
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                float x = W[ib(b0 + b)];
#pragma unroll
                for (int b2 = 0; b2 < b; ++b2) {
                    const float y = dq(qk__fz_pos(pi, CB, ib(b0 + b2)), qk__fz_pos(pi, CB, ib(b0 + b)));
                    x += ((m >> b2) & 1) ? y : 0.f;
                }
                acc += ((m >> b) & 1) ? x : 0.f;
            }
        } else {
            /* pairs of four source bits (the set bits of m) with one partner qubit */
            int b0, m, partner;
            if (e < 96) { const int f = e - 32; b0 = 0; m = f & 15; partner = qk__fz_pos(pi, CB, ib(4 + (f >> 4))); }
            else if (e < 176) { const int f = e - 96; b0 = 0; m = f & 15; partner = qk__fz_pos(pi, CB, cur + (f >> 4)); }
            else { const int f = e - 176; b0 = 4; m = f & 15; partner = qk__fz_pos(pi, CB, cur + (f >> 4)); }
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const float y = dq(qk__fz_pos(pi, CB, ib(b0 + b)), partner);
                acc += ((m >> b) & 1) ? y : 0.f;
            }
        }
        tb[d * QK__FZ_TBL + 14 + e] = acc;
    }
    __syncthreads();
}

/* DIAG d on the registers (layout st.d_lay[d], which the flush before it brought): qk__k_pass_wht's
   phase, from the tables qk__fz_tables built; no barrier. */
template <int CB>
__device__ __forceinline__ void qk__fz_diag(const qk__fz_steps &st, int d, uint32_t t, const float *pv, int q, const float *tb,
                                            float2 (&v)[32])
{
    constexpr int L = 13, RB = 5, NHI = L - RB - 4;
    const int pi = st.d_pass[d], cur = st.d_lay[d];
    const float *cf = pv + st.d_off[d];
    const float *W = tb + d * QK__FZ_TBL, *TLo = W + L + 1, *THi = TLo + 16, *Y = THi + (1 << NHI), *G = Y + NHI * 16, *H = G + RB * 16;
    const uint32_t tl = t & 15, th = t >> 4;
    float base = W[L] + TLo[tl] + THi[th];
#pragma unroll
    for (int i = 0; i < NHI; ++i) base += ((th >> i) & 1) ? Y[i * 16 + tl] : 0.f;
    float e[RB], dd[RB][RB];
#pragma unroll
    for (int j = 0; j < RB; ++j) {
        e[j] = W[cur + j] + G[j * 16 + tl] + H[(j << NHI) + th];
#pragma unroll
        for (int jj = 0; jj < RB; ++jj)
            if (jj < j) dd[jj][j] = cf[1 + q + qk__fz_pos(pi, CB, cur + jj) * q + qk__fz_pos(pi, CB, cur + j)];
    }
    qk__wht_phase<float, RB>(base, e, dd, v);
}

/* One pass's steps on the registers; pv: the state's params in shared memory */
template <int CB>
__device__ __forceinline__ void qk__fz_run(const qk__fz_steps &st, int pi, int &cur, uint32_t t, const float *pv, int q, float2 *sh,
                                           const float *tb, float2 (&v)[32])
{
    for (int si = 0; si < st.n[pi]; ++si) { /* one flush site (each is a copy of the transposes) */
        qk__fz_flush(sh, v, t, cur, st.pend[pi][si]);
        const int d = st.dg[pi][si];
        if (d >= 0) qk__fz_diag<CB>(st, d, t, pv, q, tb, v);
    }
}

__device__ __forceinline__ void qk__cluster_sync()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/* CB = q - 13 cross qubits (cluster of 2^CB blocks); sc: the transforms' total scale. Complex
   output only: the programs it takes (Hadamards and phases) make complex states, written as
   po says. Shared memory: the padded chunk, the DIAGs' tables, the fold's, the state's P params
   (qk__fz_smem). */
template <int CB>
__global__ void __launch_bounds__(256, 2)
qk__k_states_fz(const __grid_constant__ qk__fz_steps st, int q, const float *__restrict__ params, int P, float sc,
                const qk__planes_out po, void *__restrict__ out)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int L = 13, RB = 5, R = 32, NHI = L - RB - 4, LO = L - CB;
    extern __shared__ __align__(16) unsigned char qk__smem[];
    float2 *sh = (float2 *)qk__smem;
    float *tb = (float *)(sh + QK__FZ_SH);                 /* the DIAGs' tables */
    float2 *UL = (float2 *)(tb + QK__FZ_MAXD * QK__FZ_TBL), *UH = UL + 16, *UF = UH + (1 << NHI); /* the fold's */
    float *pv = tb + QK__FZ_MAXD * QK__FZ_TBL + 2 * 64;     /* the state's P params: every table reads them from here */
    const uint32_t t = threadIdx.x;
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const int64_t s = blockIdx.x >> CB;
    const int64_t D = (int64_t)1 << q;
    const float *ps = params + s * (int64_t)P;
    { /* P <= QK__FZ_MAXP = 8 x 256: every load in flight before the first store */
        float r[QK__FZ_MAXP / 256];
#pragma unroll
        for (int j = 0; j < QK__FZ_MAXP / 256; ++j) r[j] = (int)t + j * 256 < P ? ps[t + j * 256] : 0.f;
#pragma unroll
        for (int j = 0; j < QK__FZ_MAXP / 256; ++j) if ((int)t + j * 256 < P) pv[t + j * 256] = r[j];
    }
    __syncthreads();
    const uint32_t fixed = rank << L; /* pass 1: qubits 0..12 in the chunk, 13.. = the rank */
    const float *u = pv + st.fold;
    /* the fold's block factors (threads 128..160: beside the tables' first jobs), read after the
       tables' barriers: prod over qubits of u_Q[bit] for thread bits 0..3, 4..7 and the fixed bits */
    if (st.fold >= 0 && t >= 128 && t < 128 + 16 + (1u << NHI) + 1) {
        const uint32_t f = t - 128;
        const bool lo = f < 16, hi = !lo && f < 16 + (1u << NHI);
        const uint32_t e = lo ? f : f - 16;
        float ar = 1, ai = 0;
        if (lo || hi)
            for (int i = 0; i < (lo ? 4 : NHI); ++i) {
                const float *uk = u + 4 * (lo ? i : 4 + i) + ((e >> i) & 1) * 2; /* thread bit b = qubit b in layout 8 */
                float br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                ar = br; ai = bi;
            }
        else {
            for (int i = 0; i < CB; ++i) {
                const float *uk = u + 4 * (L + i) + ((rank >> i) & 1) * 2;
                float br = ar * uk[0] - ai * uk[1], bi = ar * uk[1] + ai * uk[0];
                ar = br; ai = bi;
            }
            ar *= sc; ai *= sc;
        }
        float2 z; z.x = ar; z.y = ai;
        if (lo) UL[e] = z; else if (hi) UH[e] = z; else UF[0] = z;
    }
    qk__fz_tables<CB>(st, rank, pv, q, tb, t);

    /* start in layout 8: the folded product or |0>, times sc */
    float2 v[R];
    int cur = 8;
    if (st.fold >= 0) {
        const float2 a = UF[0], l = UL[t & 15], h = UH[t >> 4];
        float2 m;
        m.x = a.x * l.x - a.y * l.y; m.y = a.x * l.y + a.y * l.x;
        v[0].x = m.x * h.x - m.y * h.y; v[0].y = m.x * h.y + m.y * h.x;
        /* the register qubits' (8..12) vectors: where each has u0 == u1 (zz: H|0>) every slot is
           v0 * prod u0 (a uniform branch), else the product tree */
        bool same = true;
#pragma unroll
        for (int j = 0; j < RB; ++j) {
            const float *u0 = u + 4 * (8 + j);
            same = same && u0[0] == u0[2] && u0[1] == u0[3];
        }
        if (same) {
#pragma unroll
            for (int j = 0; j < RB; ++j) {
                const float *u0 = u + 4 * (8 + j);
                const float2 a0 = v[0];
                v[0].x = a0.x * u0[0] - a0.y * u0[1]; v[0].y = a0.x * u0[1] + a0.y * u0[0];
            }
#pragma unroll
            for (int k = 1; k < R; ++k) v[k] = v[0];
        } else {
#pragma unroll
            for (int j = 0; j < RB; ++j) {
                const float *u0 = u + 4 * (8 + j), *u1 = u0 + 2;
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    if (k >= (1 << j)) continue;
                    const float2 a0 = v[k];
                    float2 b, c;
                    b.x = a0.x * u1[0] - a0.y * u1[1]; b.y = a0.x * u1[1] + a0.y * u1[0];
                    c.x = a0.x * u0[0] - a0.y * u0[1]; c.y = a0.x * u0[1] + a0.y * u0[0];
                    v[k | (1 << j)] = b;
                    v[k] = c;
                }
            }
        }
    } else {
        /* pass 1's chunk is qubits 0..12 in order: in-chunk index = global bits */
        const uint32_t g0 = fixed | qk__wht_tpart(t, cur, RB);
#pragma unroll
        for (int k = 0; k < R; ++k) { v[k].x = (g0 | ((uint32_t)k << 8)) == 0 ? sc : 0.f; v[k].y = 0.f; }
    }

    qk__fz_run<CB>(st, 0, cur, t, pv, q, sh, tb, v);
    qk__fz_move(sh, v, t, cur, 5);

    /* the exchange, from layout 5: r1 = lane | k << 5 | w << 10 (w = warp) goes to block
       r1 >> LO at r2 = (r1 & (2^LO - 1)) | rank << LO. The first barrier: every block of the
       cluster runs and is done reading its chunk buffer; the second: every write has landed. */
    qk__cluster_sync();
    {
        const uint32_t w = t >> 5, lane = t & 31;
        const uint32_t dst = w >> (3 - CB);
        const uint32_t r2 = ((w & ((1u << (3 - CB)) - 1)) << 10) | (rank << LO);
        uint32_t ra;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"((uint32_t)__cvta_generic_to_shared(sh)), "r"(dst));
        ra += 8u * (lane + qk__fz_pad(r2));
#pragma unroll
        for (int k = 0; k < R; ++k)
            asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(ra + 8u * qk__fz_k(5, k)), "f"(v[k].x), "f"(v[k].y)
                         : "memory");
    }
    qk__cluster_sync();

    /* pass 2 on this block's chunk (its fixed qubits LO..12 = rank), from layout 8 */
    const uint32_t fixed2 = rank << LO;
    cur = 8;
    {
        const uint32_t b = qk__fz_pad(t); /* layout 8: in-chunk bits 0..7 = t */
#pragma unroll
        for (int k = 0; k < R; ++k) v[k] = sh[b + qk__fz_k(8, k)];
    }
    qk__fz_run<CB>(st, 1, cur, t, pv, q, sh, tb, v);
    qk__fz_move(sh, v, t, cur, 8);

    /* store from layout 8: thread bits are qubits 0..7 (lanes 0..4: 256 bytes per warp and
       register), register bit j is in-chunk bit 8 + j */
    /* one loop a format: qk__planes_put's switch inside this unrolled loop made the fp32x3 planes
       slower than the operand pass they replace (docs/benchmarks.md, "Every state builder writes
       the planes") */
    const int64_t gb = s * (po.mode == 3 ? 4 * D : D) + (fixed2 | t);
    if (po.mode == 0) {
#pragma unroll
        for (int k = 0; k < R; ++k) __stwb((float2 *)out + gb + qk__fz_g2(CB, k), v[k]); /* st.global: out is device memory */
    } else if (po.mode == 1) {
#pragma unroll
        for (int k = 0; k < R; ++k) qk__gauss_store<__half, false>(v[k], 0xFu, po.scale, (__half *)out + gb + qk__fz_g2(CB, k), D, po.ps);
    } else if (po.mode == 3) {
#pragma unroll
        for (int k = 0; k < R; ++k) qk__gauss_store<__half, true>(v[k], 0xFu, po.scale, (__half *)out + gb + qk__fz_g2(CB, k), D, po.ps);
    } else {
#pragma unroll
        for (int k = 0; k < R; ++k)
            qk__gauss_store<__nv_bfloat16, false>(v[k], 0xFu, po.scale, (__nv_bfloat16 *)out + gb + qk__fz_g2(CB, k), D, po.ps);
    }
#endif
}

/* The pass pair qk__k_states_fz takes: float states of 14..16 qubits in exactly two structured
   passes, the first over qubits 0..12 from the folded product or |0>, the second over qubits
   0..12-c and 13..q-1 (c = q - 13), as qk__compile_passes makes them for zz and iqp. */
/* The fused kernel's program (qk__fz_steps) of a pass pair that qk__fz_fits; false when a pass
   has more than QK__FZ_MAXS steps or the passes more than QK__FZ_MAXD DIAGs. Each DIAG's layout
   is the one qk__fz_flush leaves before it (qk__fz_pick, the same choice on both sides). */
static bool qk__fz_plan(const qk__prog &pg, qk__fz_steps *st)
{
    memset(st, 0, sizeof *st);
    st->fold = pg.passes[0].fold;
    for (int pi = 0; pi < 2; ++pi) {
        const qk__pass &p = pg.passes[pi];
        uint32_t pend = 0;
        int n = 0, cur = 8; /* each pass starts in layout 8 */
        for (int ii = p.i0; ii <= p.i1; ++ii) {
            const bool end = ii == p.i1;
            if (!end && pg.instr[ii].kind == QK__I_GATE) { pend ^= 1u << pg.instr[ii].b0; continue; }
            if (n == QK__FZ_MAXS) return false;
            st->pend[pi][n] = pend;
            while (pend) { cur = qk__fz_pick(pend, cur); pend &= ~(31u << cur); }
            st->dg[pi][n] = -1;
            if (!end) {
                if (st->nd == QK__FZ_MAXD) return false;
                st->d_pass[st->nd] = pi;
                st->d_off[st->nd] = pg.instr[ii].off;
                st->d_lay[st->nd] = cur;
                st->dg[pi][n] = st->nd++;
            }
            ++n;
        }
        st->n[pi] = n;
    }
    return true;
}

static size_t qk__fz_smem(int P)
{
    return (size_t)QK__FZ_SH * sizeof(float2) + ((size_t)QK__FZ_MAXD * QK__FZ_TBL + 2 * 64 + (size_t)P) * sizeof(float);
}

static bool qk__fz_fits(const qk__prog &pg)
{
    const int q = pg.q;
    if (q < 14 || q > 16 || pg.passes.size() != 2 || pg.has_amp || pg.P > QK__FZ_MAXP) return false;
    const qk__pass &a = pg.passes[0], &b = pg.passes[1];
    if (!qk__pass_is_wht(a, pg) || !qk__pass_is_wht(b, pg) || !a.first || b.first || a.L != 13 || b.L != 13) return false;
    const int c = q - 13;
    for (int i = 0; i < 13; ++i) {
        if (a.pos[i] != i) return false;
        if (b.pos[i] != (i < 13 - c ? i : i + c)) return false;
    }
    for (int i = 0; i < c; ++i)
        if (a.npos[i] != 13 + i || b.npos[i] != 13 - c + i) return false;
    qk__fz_steps st;
    return qk__fz_plan(pg, &st);
}

template <int CB>
static qk_result qk__launch_fz1(const qk__prog &pg, int64_t n, const qk__build_ws &ws, const qk__planes_out &po, void *out,
                                cudaStream_t st, qk__err *E)
{
    const size_t smem = qk__fz_smem(pg.P);
    auto kf = qk__k_states_fz<CB>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1u << CB;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)(n << CB), 1, 1);
    cfg.blockDim = dim3(256, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    qk__fz_steps fs;
    qk__fz_plan(pg, &fs); /* qk__fz_fits checked it */
    /* the Hadamards' scale (1/sqrt 2)^m: m their count over every flush, put on the start */
    int m = 0;
    for (int pi = 0; pi < 2; ++pi)
        for (int i = 0; i < fs.n[pi]; ++i) m += __builtin_popcount(fs.pend[pi][i]);
    const float sc = (float)pow(0.5, 0.5 * m);
    QK_CK(cudaLaunchKernelEx(&cfg, kf, fs, pg.q, (const float *)ws.params, pg.P, sc, po, out));
    QK_LAUNCH_CK("qk__k_states_fz");
    return QK_OK;
}

/* 1 when the current device runs qk__k_states_fz: compute capability 9.0 or later, a build with its code
   (qk__fz_built) and room for a cluster of 8 of its blocks (cudaOccupancyMaxActiveClusters).
   Cached per device. */
static int qk__fz_device_ok()
{
    static std::atomic<int> cache[64]; /* 0 unknown, 1 no, 2 yes */
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) { cudaGetLastError(); return 0; }
    const int known = cache[dev].load(std::memory_order_acquire);
    if (known) return known == 2;
    int ok = 0, flag = 0, major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 &&
        cudaMemcpyFromSymbol(&flag, qk__fz_built, sizeof flag) == cudaSuccess && flag == 1) {
        const size_t smem = qk__fz_smem(QK__FZ_MAXP);
        auto kf = qk__k_states_fz<3>;
        int nc = 0;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 8;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(8, 1, 1);
        cfg.blockDim = dim3(256, 1, 1);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        ok = cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess &&
             cudaOccupancyMaxActiveClusters(&nc, kf, &cfg) == cudaSuccess && nc > 0;
    }
    cudaGetLastError();
    cache[dev].store(ok ? 2 : 1, std::memory_order_release);
    return ok;
}

/* qk__k_states_fz: one cluster of 2^(q - 13) blocks of 256 threads per state (complex float
   states, or the operand planes po asks). Under QK_TEST_FAULTS, qk_cuda_test_states_fused()
   counts its launches, qk_cuda_test_planes() the state builds that wrote operand planes. */
#ifdef QK_TEST_FAULTS
static std::atomic<int> qk__fz_launches{0}, qk__plane_builds{0};
extern "C" int qk_cuda_test_states_fused(void) { return qk__fz_launches.load(); }
extern "C" int qk_cuda_test_planes(void) { return qk__plane_builds.load(); }
#endif
static qk_result qk__launch_fz(const qk__prog &pg, int64_t n, const qk__build_ws &ws, const qk__planes_out &po, void *out,
                               cudaStream_t st, qk__err *E)
{
#ifdef QK_TEST_FAULTS
    ++qk__fz_launches;
#endif
    switch (pg.q - 13) {
    case 1: return qk__launch_fz1<1>(pg, n, ws, po, out, st, E);
    case 2: return qk__launch_fz1<2>(pg, n, ws, po, out, st, E);
    default: return qk__launch_fz1<3>(pg, n, ws, po, out, st, E);
    }
}

/* 1 when qk__build_states builds n states of pg with qk__k_states_fz: float complex states of a
   program it fits, on a device that runs it (QK_STATES_OLD=1, measurement: never) */
static bool qk__fz_takes(const qk__prog &pg, int64_t n, bool fp32, bool out_real)
{
    return fp32 && !out_real && !pg.states && n <= (int64_t)(INT32_MAX >> 3) && qk__fz_fits(pg) && !getenv("QK_STATES_OLD") &&
           qk__fz_device_ok();
}

/* Given states (qk_gram_states): row s of x (ld doubles apart, dim amplitudes of the state type)
   into the engine's layout, zero-padded to D, scaled to norm 1 where the flags ask (the norm in
   double, one block per row). */
template <typename T>
__global__ void __launch_bounds__(256) qk__k_load_states(const double *__restrict__ x, int64_t n, int ld, int type, int flags,
                                                        int64_t dim, int64_t D, void *__restrict__ out, int out_real)
{
    __shared__ double red[256];
    const int64_t s = blockIdx.x;
    if (s >= n) return;
    const double *row = x + s * (int64_t)ld;
    double inv = 1.0;
    if (flags & QK__STATE_MIXED) {
        /* a density matrix (dim x dim): the real vector [Re rho | Im rho] (real types: Re rho),
           divided by the trace where the flags ask, as the CPU engine's qk__state_row */
        const int64_t d2 = dim * dim;
        const bool cplx = type == QK_STATE_C128 || type == QK_STATE_C64;
        if (flags & QK__STATE_NORMALIZE) {
            double acc = 0, re, im;
            for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) {
                qk__state_amp(row, type, k * dim + k, &re, &im);
                acc += re;
            }
            inv = 1.0 / qk__block_sum256(red, acc);
        }
        for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
            double re = 0, im = 0, v = 0;
            if (k < d2) { qk__state_amp(row, type, k, &re, &im); v = re; }
            else if (cplx && k < 2 * d2) { qk__state_amp(row, type, k - d2, &re, &im); v = im; }
            ((T *)out)[s * D + k] = (T)(v * inv);
        }
        return;
    }
    if (flags & QK__STATE_NORMALIZE) {
        double acc = 0, re, im;
        for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) {
            qk__state_amp(row, type, k, &re, &im);
            acc += re * re + im * im;
        }
        inv = 1.0 / sqrt(qk__block_sum256(red, acc));
    }
    for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
        double re = 0, im = 0;
        if (k < dim) qk__state_amp(row, type, k, &re, &im);
        if (out_real) ((T *)out)[s * D + k] = (T)(re * inv);
        else {
            qk__cx<T> v;
            v.x = (T)(re * inv);
            v.y = (T)(im * inv);
            ((qk__cx<T> *)out)[s * D + k] = v;
        }
    }
}

/* Builds n states (x already on the device) into out: complex T or, out_real, T. */
/* po (mode 1..3): out receives Gauss's operand planes (qk__planes_out) in place of complex float
   states: the fused kernel's store or the last pass's writes them. */
template <typename T>
static qk_result qk__build_states(const qk__prog &pg, const qk__dprog &dp, const double *dx, int64_t n,
                                  qk__build_ws &ws, void *out, bool out_real, cudaStream_t st, qk__err *E,
                                  const qk__planes_out *po = nullptr)
{
    const qk__planes_out cx = {0, 1.0f, 0};
    const bool planes = po && po->mode;
    if (planes && (sizeof(T) != 4 || out_real || pg.states))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: internal error: operand planes asked of a state "
                                                          "builder that cannot write them (please report the map)");
    if (n <= 0) return QK_OK;
#ifdef QK_TEST_FAULTS
    if (planes) ++qk__plane_builds;
#endif
    if (pg.states) {
        qk__k_load_states<T><<<(unsigned)n, 256, 0, st>>>(dx, n, pg.d, pg.st_type, pg.st_flags, pg.st_dim, (int64_t)1 << pg.q, out,
                                                           out_real ? 1 : 0);
        QK_LAUNCH_CK("qk__k_load_states");
        return QK_OK;
    }
    QK_TRY(qk__launch_prep<T>(pg, dp, dx, n, (T *)ws.params, st, E));
    if (pg.has_amp) QK_TRY(qk__launch_invnorm(dx, n, pg.d, ws.inv, st, E));
    const int np = (int)pg.passes.size();
    const double *ampx = pg.has_amp ? dx : nullptr;
    /* 14..16 qubits in two structured passes: one fused launch (QK_STATES_OLD=1: the two) */
    if (qk__fz_takes(pg, n, sizeof(T) == 4, out_real)) return qk__launch_fz(pg, n, ws, planes ? *po : cx, out, st, E);
    for (int pi = 0; pi < np; ++pi) {
        const qk__pass &p = pg.passes[pi];
        const int N = 1 << p.L;
        /* threads per state: half the amplitudes (one pair per thread per gate), at most 256;
           small states share a block so that blocks have at least 128 threads. A one-pass
           program of up to 10 qubits runs a warp per state, four states a block: its DIAG
           tables and gates are chains of dependent loads a block waits on, and four states in
           flight per block hide them (the figures: docs/benchmarks.md, "Per-call costs"). */
        int tps = std::max(1, std::min(256, N / 2));
        if (np == 1 && N <= 1024) tps = std::min(tps, 32);
        int spb = (pi == 0 && np == 1) ? std::max(1, 128 / tps) : 1;
        if (np > 1) spb = 1;
        /* multi-pass programs run in place on tmp (the chunks of one pass are disjoint: no block
           reads amplitudes another block of the same pass writes); the last pass writes out */
        const bool last = pi == np - 1;
        const qk__cx<T> *in = (const qk__cx<T> *)ws.tmp;
        void *o = last ? out : ws.tmp;
        const qk__planes_out &lpo = last && planes ? *po : cx;
        if (qk__pass_is_wht(p, pg)) QK_TRY(qk__launch_pass_wht<T>(p, pg, dp, n, ws, in, o, last && out_real, lpo, st, E));
        else QK_TRY(qk__launch_pass<T>(p, pg, dp, n, ampx, ws, in, o, last && out_real, spb, tps, lpo, st, E));
    }
    return QK_OK;
}

/* qk__k_qubit_vectors: per-qubit 2-vectors of product-map samples (the analytic path's
   "states"), one thread per (sample, qubit). */
template <typename T>
static qk_result qk__launch_qubit_vectors(const qk__dprog &dp, int q, const double *x, int64_t n, int d, T *out,
                                          cudaStream_t st, qk__err *E)
{
    const int64_t tot = n * q;
    if (tot <= 0) return QK_OK;
    qk__k_qubit_vectors<T><<<(unsigned)((tot + 255) / 256), 256, 0, st>>>(dp.qops, dp.qoff, q, dp.ang, dp.op_kind, x, n, d,
                                                                          dp.w, out);
    QK_LAUNCH_CK("qk__k_qubit_vectors");
    return QK_OK;
}

/* ======================================================================================== */
/* >>widen ---- states widened to interleaved doubles (qk_cuda_states) ---- */
/* ======================================================================================== */

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

/* ======================================================================================== */
/* >>product ---- the analytic Gram of product maps ---- */
/* ======================================================================================== */

/* Analytic Gram for product maps: K = prod_k |<u_k(a)|u_k(b)>|^2 over the q qubit 2-vectors. */
template <typename T, typename OutT, int BM, int BN, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
qk__k_gram_product(const T *__restrict__ UA, const T *__restrict__ UB, int m, int nn, int q,
                   OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid)
{
    const int NT = (BM / TM) * (BN / TN);
    const int BK = 8;
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return;
    extern __shared__ __align__(16) unsigned char qk__smem[];
    T *As = (T *)qk__smem;          /* [BK][BM][4] */
    T *Bs = As + BK * BM * 4;
    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 1;
    for (int k0 = 0; k0 < q; k0 += BK) {
        for (int e = threadIdx.x; e < BM * BK * 4; e += NT) {
            int r = e / (BK * 4), k = (e / 4) % BK, c = e % 4;
            int gr = row0 + r, gk = k0 + k;
            /* padding qubits are |0>: overlap 1, a neutral factor */
            T v = (gr < m && gk < q) ? UA[((int64_t)gr * q + gk) * 4 + c] : (T)(c == 0);
            As[(k * BM + r) * 4 + c] = v;
        }
        for (int e = threadIdx.x; e < BN * BK * 4; e += NT) {
            int r = e / (BK * 4), k = (e / 4) % BK, c = e % 4;
            int gr = col0 + r, gk = k0 + k;
            T v = (gr < nn && gk < q) ? UB[((int64_t)gr * q + gk) * 4 + c] : (T)(c == 0);
            Bs[(k * BN + r) * 4 + c] = v;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                const T *a = As + (k * BM + ty * TM + i) * 4;
                T a0r = a[QK__QV_RE0], a0i = a[QK__QV_IM0], a1r = a[QK__QV_RE1], a1i = a[QK__QV_IM1];
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const T *b = Bs + (k * BN + tx * TN + j) * 4;
                    T re = a0r * b[QK__QV_RE0] + a0i * b[QK__QV_IM0] + a1r * b[QK__QV_RE1] + a1i * b[QK__QV_IM1];
                    T im = a0r * b[QK__QV_IM0] - a0i * b[QK__QV_RE0] + a1r * b[QK__QV_IM1] - a1i * b[QK__QV_RE1];
                    acc[i][j] *= re * re + im * im;
                }
            }
        }
        __syncthreads();
    }
    OutT *Cs = (OutT *)qk__smem;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) Cs[(ty * TM + i) * (BN + 1) + tx * TN + j] = (OutT)acc[i][j];
    __syncthreads();
    qk__store_tile<OutT, BM, BN, NT>(Cs, row0, col0, m, nn, out, ld, mout, doff, tri, vec);
}

/* qk__k_gram_product: 64 x 64 tiles of 4 x 4 per thread, in bands of at most 65535 tile rows
   (grid.y); a diagonal block of K(X,X) gets the triangular grid. */
template <typename T, typename OutT>
static qk_result qk__launch_product(const T *UA, const T *UB, int64_t m, int64_t nn, int q, OutT *out, int64_t ld,
                                    OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    const int BM = 64, BN = 64, TM = 4, TN = 4, NT = 256;
    size_t op = (size_t)8 * (BM + BN) * 4 * sizeof(T);
    size_t ep = (size_t)BM * (BN + 1) * sizeof(OutT);
    size_t smem = std::max(op, ep);
    auto kf = qk__k_gram_product<T, OutT, BM, BN, TM, TN>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t r0 = 0; r0 < m; r0 += (int64_t)65535 * BM) {
        int64_t mm = std::min<int64_t>(m - r0, (int64_t)65535 * BM);
        dim3 grid((unsigned)((nn + BN - 1) / BN), (unsigned)((mm + BM - 1) / BM));
        const int tg = (tri && doff == 0 && r0 == 0 && mm == m && nn >= mm) ? qk__tri_grid(&grid) : 0;
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        kf<<<grid, NT, smem, st>>>(UA + r0 * q * 4, UB, (int)mm, (int)nn, q, o, ld, mo, doff - r0, tri, qk__vec_ok(o, mo, ld), tg);
        QK_LAUNCH_CK("qk__k_gram_product");
    }
    return QK_OK;
}

/* ======================================================================================== */
/* >>gram ---- the fused SIMT Gram kernel, its tile configurations ---- */
/* ======================================================================================== */

/* One k-step of a fused Gram operand into shared memory: R states from row r0 (of rows) and BK
   amplitudes from k0, element (row, k) read with k fastest (a row's BK amplitudes are
   contiguous), stored k-major as S[(k * R + row) * W (+1 for Im)]; zeros past the ends. */
template <typename T, bool CPLX, int R, int BK, int NT>
__device__ __forceinline__ void qk__gram_stage(const T *__restrict__ X, int rows, int r0, int k0, int D, T *S)
{
    const int W = CPLX ? 2 : 1;
    for (int e = threadIdx.x; e < R * BK; e += NT) {
        int r = e / BK, k = e % BK;
        int gr = r0 + r, gk = k0 + k;
        T vr = 0, vi = 0;
        if (gr < rows && gk < D) {
            if (CPLX) { typename qk__vec2<T>::t v = ((const typename qk__vec2<T>::t *)X)[(int64_t)gr * D + gk]; vr = v.x; vi = v.y; }
            else vr = X[(int64_t)gr * D + gk];
        }
        S[(k * R + r) * W] = vr;
        if (CPLX) S[(k * R + r) * W + 1] = vi;
    }
}

/* Fused Gram tile: acc[i][j] = <a_i|b_j> over D amplitudes in registers, then |.|^2 (complex)
   or .^2 (real), staged and stored. A: m states, B: nn states, row-major with stride D. */
template <typename T, bool CPLX, typename OutT, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
qk__k_gram(const T *__restrict__ A, const T *__restrict__ B, int m, int nn, int D,
           OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid)
{
    const int NT = (BM / TM) * (BN / TN);
    const int W = CPLX ? 2 : 1; /* T values per amplitude */
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return; /* whole tile below the diagonal */
    extern __shared__ __align__(16) unsigned char qk__smem[];
    T *As = (T *)qk__smem;               /* [BK][BM][W] */
    T *Bs = As + BK * BM * W;            /* [BK][BN][W] */
    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    T accr[TM][TN], acci[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) { accr[i][j] = 0; acci[i][j] = 0; }

    for (int k0 = 0; k0 < D; k0 += BK) {
        /* load: element e = (row, k) with k fastest: a row's BK amplitudes are contiguous */
        qk__gram_stage<T, CPLX, BM, BK, NT>(A, m, row0, k0, D, As);
        qk__gram_stage<T, CPLX, BN, BK, NT>(B, nn, col0, k0, D, Bs);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            T ar[TM], ai[TM], br[TN], bi[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                ar[i] = As[(k * BM + ty * TM + i) * W];
                ai[i] = CPLX ? As[(k * BM + ty * TM + i) * W + 1] : (T)0;
            }
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                br[j] = Bs[(k * BN + tx * TN + j) * W];
                bi[j] = CPLX ? Bs[(k * BN + tx * TN + j) * W + 1] : (T)0;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    accr[i][j] = fma(ar[i], br[j], accr[i][j]);
                    if (CPLX) {
                        accr[i][j] = fma(ai[i], bi[j], accr[i][j]);
                        acci[i][j] = fma(ar[i], bi[j], acci[i][j]);
                        acci[i][j] = fma(-ai[i], br[j], acci[i][j]);
                    }
                }
        }
        __syncthreads();
    }
    OutT *Cs = (OutT *)qk__smem; /* [BM][BN + 1], reuses the operand buffers */
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            T v = CPLX ? accr[i][j] * accr[i][j] + acci[i][j] * acci[i][j] : accr[i][j] * accr[i][j];
            Cs[(ty * TM + i) * (BN + 1) + tx * TN + j] = (OutT)v;
        }
    __syncthreads();
    qk__store_tile<OutT, BM, BN, NT>(Cs, row0, col0, m, nn, out, ld, mout, doff, tri, vec);
}

/* Tile shapes of the fused kernel, 256 threads each.
   complex fp32: 128 x 64 tile, 8 x 4 complex per thread (64 accumulators, ~120 registers:
   2 blocks / SM); real fp32: 128 x 128, 8 x 8; fp64: 64 x 64, 4 x 4 (accumulators twice the
   size). Small states (2^q <= 32) are write-bound (4 bytes of K per 8*2^q flops), so they get
   64 x 64 tiles with 4 x 4 per thread: fewer registers, more blocks in flight per SM to keep
   the stores streaming (zz 4 qubits, n = 32768, qk-bench). */
template <int BM_, int BN_, int BK_, int TM_, int TN_> struct qk__tiles {
    enum { BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_ };
};
template <typename T, bool CPLX, typename OutT, typename C>
static qk_result qk__launch_gram_cfg(const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                     OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    const int NT = (C::BM / C::TM) * (C::BN / C::TN);
    size_t op = (size_t)C::BK * (C::BM + C::BN) * (CPLX ? 2 : 1) * sizeof(T);
    size_t ep = (size_t)C::BM * (C::BN + 1) * sizeof(OutT);
    size_t smem = std::max(op, ep);
    auto kf = qk__k_gram<T, CPLX, OutT, C::BM, C::BN, C::BK, C::TM, C::TN>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t r0 = 0; r0 < m; r0 += (int64_t)65535 * C::BM) { /* grid.y limit */
        int64_t mm = std::min<int64_t>(m - r0, (int64_t)65535 * C::BM);
        dim3 grid((unsigned)((nn + C::BN - 1) / C::BN), (unsigned)((mm + C::BM - 1) / C::BM));
        const int tg = (tri && doff == 0 && r0 == 0 && mm == m && C::BM == C::BN && nn >= mm) ? qk__tri_grid(&grid) : 0;
        const T *Ar = (const T *)A + r0 * (int64_t)D * (CPLX ? 2 : 1);
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        kf<<<grid, NT, smem, st>>>(Ar, (const T *)B, (int)mm, (int)nn, D, o, ld, mo, doff - r0, tri, qk__vec_ok(o, mo, ld), tg);
        QK_LAUNCH_CK("qk__k_gram");
    }
    return QK_OK;
}

/* >>small ---- the persistent few-qubit Gram kernel (fused configuration 7) ---- */
/* K of states of D <= 32 complex64 amplitudes (q <= 5) is bound by the issue rate of the FP32
   pipe and by the 4 bytes a pair written, not by loads: one tile's operands are D * 128 * 8
   bytes. This kernel keeps one 512-thread block per SM alive over many tiles (persistent, grid-
   stride over the tile list, the triangle's tiles only for a symmetric block), holds the whole
   inner dimension in shared memory, prefetches the next tile's operands into registers while it
   computes this one, and writes each tile and its mirror as full 16-byte rows / 32-byte sectors
   from a staged copy. Thread (tx, ty) owns rows ty + 16 i and columns tx + 32 j (strided: B reads
   are consecutive per lane, A reads a broadcast). Faster than the 64 x 64 fused tile where K's write
   binds (bench/small_gram_probe.cu times the candidates against the write floor; docs/benchmarks.md,
   'Few-qubit Gram: the persistent kernel'). Semantics of out / mout /
   doff / tri are those of qk__k_gram. */
#define QK__SMALL_BM 128
#define QK__SMALL_TM 8
#define QK__SMALL_TN 4
#define QK__SMALL_NT ((QK__SMALL_BM / QK__SMALL_TM) * (QK__SMALL_BM / QK__SMALL_TN))
#define QK__SMALL_CS (QK__SMALL_BM + 4) /* staged tile row stride (floats): 16-byte rows, mirror reads conflict-free */

template <int D>
__global__ void __launch_bounds__(QK__SMALL_NT, 1)
qk__k_gram_small(const float2 *__restrict__ A, const float2 *__restrict__ B, int m, int nn, float *__restrict__ out,
                 int64_t ld, float *__restrict__ mout, int64_t doff, int tri, int vec, int tx_tiles, int tgrid, int64_t ntiles)
{
    constexpr int BM = QK__SMALL_BM, BN = QK__SMALL_BM, TM = QK__SMALL_TM, TN = QK__SMALL_TN, NT = QK__SMALL_NT;
    constexpr int TX = BN / TN, TY = BM / TM, CS = QK__SMALL_CS;
    constexpr int EA = (BM * D + NT - 1) / NT, EB = (BN * D + NT - 1) / NT;
    extern __shared__ __align__(16) unsigned char qk__smem[];
    float2 (*As)[BM + 1] = (float2 (*)[BM + 1])qk__smem;
    float2 (*Bs)[BN + 1] = (float2 (*)[BN + 1])(qk__smem + sizeof(float2) * D * (BM + 1));
    float (*Cs)[CS] = (float (*)[CS])(qk__smem + sizeof(float2) * D * (BM + 1 + BN + 1));
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    float2 ra[EA], rb[EB];
    auto tile = [&](int64_t L, int &r0, int &c0) {
        int a, b;
        if (tgrid > 0) qk__tri_tile(L, tgrid, a, b);
        else {
            a = (int)(L / tx_tiles);
            b = (int)(L % tx_tiles);
        }
        r0 = a * BM;
        c0 = b * BN;
    };
    auto fetch = [&](int64_t L) {
        int r0, c0;
        tile(L, r0, c0);
#pragma unroll
        for (int u = 0; u < EA; ++u) {
            const int e = threadIdx.x + u * NT, r = e / D, k = e % D;
            ra[u] = (e < BM * D && r0 + r < m) ? A[(int64_t)(r0 + r) * D + k] : make_float2(0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < EB; ++u) {
            const int e = threadIdx.x + u * NT, r = e / D, k = e % D;
            rb[u] = (e < BN * D && c0 + r < nn) ? B[(int64_t)(c0 + r) * D + k] : make_float2(0.f, 0.f);
        }
    };
    int64_t L = blockIdx.x;
    if (L >= ntiles) return;
    fetch(L);
    for (; L < ntiles; L += gridDim.x) {
        int row0, col0;
        tile(L, row0, col0);
#pragma unroll
        for (int u = 0; u < EA; ++u) {
            const int e = threadIdx.x + u * NT;
            if (e < BM * D) As[e % D][e / D] = ra[u];
        }
#pragma unroll
        for (int u = 0; u < EB; ++u) {
            const int e = threadIdx.x + u * NT;
            if (e < BN * D) Bs[e % D][e / D] = rb[u];
        }
        __syncthreads();
        const bool below = tri && (int64_t)col0 + BN - 1 + doff < row0; /* whole tile under the diagonal */
        if (L + gridDim.x < ntiles) fetch(L + gridDim.x);
        if (!below) {
            float cr[TM][TN], ci[TM][TN];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) { cr[i][j] = 0.f; ci[i][j] = 0.f; }
#pragma unroll
            for (int k = 0; k < D; ++k) {
                float2 av[TM], bv[TN];
#pragma unroll
                for (int i = 0; i < TM; ++i) av[i] = As[k][ty + TY * i];
#pragma unroll
                for (int j = 0; j < TN; ++j) bv[j] = Bs[k][tx + TX * j];
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) {
                        cr[i][j] = fmaf(av[i].x, bv[j].x, cr[i][j]);
                        cr[i][j] = fmaf(av[i].y, bv[j].y, cr[i][j]);
                        ci[i][j] = fmaf(av[i].x, bv[j].y, ci[i][j]);
                        ci[i][j] = fmaf(-av[i].y, bv[j].x, ci[i][j]);
                    }
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) Cs[ty + TY * i][tx + TX * j] = cr[i][j] * cr[i][j] + ci[i][j] * ci[i][j];
        }
        __syncthreads();
        if (below) continue; /* block-uniform */
        if (vec && row0 + BM <= m && col0 + BN <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM)) {
            for (int idx = threadIdx.x; idx < BM * BN / 4; idx += NT) {
                const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
                __stcs((float4 *)(out + (int64_t)(row0 + r) * ld + col0 + c), *(const float4 *)&Cs[r][c]);
            }
            if (mout) {
                /* lane pairs fill 32-byte sectors of the mirror: rows r and r + 4 of one column; a
                   warp's 16 columns and the pair's 4-row offset (4 * CS = 16 banks) meet each bank once */
                for (int idx = threadIdx.x; idx < BM * BN / 4; idx += NT) {
                    const int p = idx >> 1, c = p % BN, r = (p / BN) * 8 + (idx & 1) * 4;
                    __stcs((float4 *)(mout + (int64_t)(col0 + c) * ld + row0 + r),
                           make_float4(Cs[r][c], Cs[r + 1][c], Cs[r + 2][c], Cs[r + 3][c]));
                }
            }
        } else {
            for (int idx = threadIdx.x; idx < BM * BN; idx += NT) {
                const int r = idx / BN, c = idx % BN, gi = row0 + r, gj = col0 + c;
                if (gi < m && gj < nn && (!tri || gj + doff >= gi)) out[(int64_t)gi * ld + gj] = Cs[r][c];
            }
            if (mout) {
                for (int idx = threadIdx.x; idx < BM * BN; idx += NT) {
                    const int c = idx / BM, r = idx % BM, gi = row0 + r, gj = col0 + c;
                    if (gi < m && gj < nn && (!tri || gj + doff > gi)) mout[(int64_t)gj * ld + gi] = Cs[r][c];
                }
            }
        }
    }
}

/* The persistent-grid launch of the few-qubit kernels (this one and the tensor-core one,
   smalltc.cuh): kf's dynamic shared memory (smem bytes) opted in, as many blocks of nt threads
   as stay resident on every SM, at most one per BM x BM tile of the m x nn Gram (the triangle's
   tiles for a symmetric diagonal block, qk__tri_grid, or the rectangle's); each block loops over
   tiles. what: "launch of <kernel>" for the error message. */
template <typename K>
static qk_result qk__launch_persistent(K kf, int nt, size_t smem, int BM, const float2 *A, const float2 *B, int64_t m, int64_t nn,
                                       float *out, int64_t ld, float *mout, int64_t doff, int tri, cudaStream_t st,
                                       const char *what, qk__err *E)
{
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int dev = 0, sms = 0, per = 0;
    QK_CK(cudaGetDevice(&dev));
    QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    QK_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kf, nt, smem));
    if (per < 1) per = 1;
    const int64_t Tx = (nn + BM - 1) / BM;
    dim3 tiles((unsigned)Tx, (unsigned)((m + BM - 1) / BM));
    const int tg = (tri && doff == 0 && nn >= m) ? qk__tri_grid(&tiles) : 0;
    const int64_t ntiles = (int64_t)tiles.x * tiles.y;   /* the triangle's tiles, or the rectangle's */
    if (ntiles <= 0) return QK_OK;
    const int64_t grid = std::min<int64_t>(ntiles, (int64_t)sms * per);
    kf<<<(unsigned)grid, nt, smem, st>>>(A, B, (int)m, (int)nn, out, ld, mout, doff, tri, qk__vec_ok(out, mout, ld), (int)Tx, tg, ntiles);
    cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess) return qk__cuda_fail(E, c, what, __LINE__);
    return QK_OK;
}

template <int D>
static qk_result qk__launch_small_d(const float2 *A, const float2 *B, int64_t m, int64_t nn, float *out, int64_t ld,
                                    float *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    const int BM = QK__SMALL_BM;
    const size_t smem = sizeof(float2) * D * (2 * BM + 2) + sizeof(float) * BM * QK__SMALL_CS;
    return qk__launch_persistent(qk__k_gram_small<D>, QK__SMALL_NT, smem, BM, A, B, m, nn, out, ld, mout, doff, tri, st,
                                 "launch of qk__k_gram_small", E);
}

/* The few-qubit kernel for complex fp32 states with float K and D <= 32; anything else is
   QK_ERROR_UNSUPPORTED (qk__launch_gram falls back to the tiled kernel). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_small(const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                  OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    if (sizeof(T) != 4 || !CPLX || sizeof(OutT) != 4) return QK_ERROR_UNSUPPORTED;
    const float2 *a = (const float2 *)A, *b = (const float2 *)B;
    float *o = (float *)(void *)out, *mo = (float *)(void *)mout;
    switch (D) {
    case 2: return qk__launch_small_d<2>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 4: return qk__launch_small_d<4>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 8: return qk__launch_small_d<8>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 16: return qk__launch_small_d<16>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 32: return qk__launch_small_d<32>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    default: return QK_ERROR_UNSUPPORTED;
    }
}

/* >>smalltc ---- its tensor-core form, fp16 hi/lo splits (fused configuration 8) ---- */
/* The persistent few-qubit kernel above is bound by the FP32 pipe's issue rate at 4 and more
   qubits (4 * 2^q FMAs a pair). Here the inner products run on the tensor cores (mma.sync
   m16n8k16, fp16 operands, fp32 accumulators) at fp32 accuracy: each amplitude, scaled by
   s = 2^floor(q/2) (as >>tcf's FP16, so that small amplitudes stay normal), is split into
   hi = fp16(s x) and lo = fp16(s x - hi), 22 significant bits, and a product is
   lo*hi + hi*lo + hi*hi (lo*lo, 2^-22 relative, is dropped); the accumulators are scaled back by
   1/s^2, exactly. The complex product takes no planes: one register holds the (re, im) of one
   amplitude as the two k slots of a lane, so one MMA gives Re <a|b> and, with B's halves turned
   to (im, -re), a second gives Im <a|b> (as in >>tcf). No conversion pass: the split happens on
   the fragment, from the fp32 states in shared memory. (A first version split into TF32 halves
   on m16n8k8: the same error, half the k per MMA, 0.8x to 0.75x the speed at 5 and 6 qubits.)

   Layout: 64 x 64 tiles of 4 warps (2 x 2 warps of 32 x 32 pairs), persistent over the tile
   list, with up to 4 blocks per SM (128 registers a thread) so that one block's MMAs run while
   another's stores issue (one 512-thread block of 128 x 128 tiles per SM ran its phases in lock
   step). Tiles in the triangle's order, as >>small (bands of 16 tile rows, column by column,
   for DRAM locality, ran at 0.95x). Both operands' rows (the whole inner dimension) reach
   shared memory by cp.async, double-buffered where two buffers fit in 80 KB (D <= 32): the next
   tile's rows load while this tile computes (D = 64: one buffer). Rows are S words apart, S = 8 or 24 mod 32, so
   the 8-byte fragment loads of a half-warp (rows g = 0..3, amplitudes t = 0..3) hit distinct
   banks. The epilogue takes |.|^2 in registers, stages a tile inside K and off the diagonal in
   the operand buffer just read, and writes it and its mirror as 16-byte pieces (tiles cut by
   the diagonal or K's edge store from the fragments, with guards). Accumulation: at most
   3 * D / 8 = 24 MMA steps into one set of fp32 accumulators (the truncating adds of >>tcf's
   note cost less than an fp32 ulp per step here; the suite and qk-bench measure the error
   against the CPU engine and fp64). Semantics of out / mout / doff / tri are those of qk__k_gram. */
#define QK__STC_BM 64   /* tile side: 4 warps, up to 4 blocks per SM whose phases (MMA, stores) interleave */

/* shared-memory row stride (words) of D amplitudes; buffers (2: double-buffered) and bytes of
   a BM-row tile's operands; threads of a block (4 warps at BM = 64) */
__host__ __device__ constexpr int qk__stc_stride(int D) { return 2 * D + ((2 * D) % 32 == 8 || (2 * D) % 32 == 24 ? 0 : 8); }
__host__ __device__ constexpr int qk__stc_stages(int D, int BM) { return 2 * 2 * BM * qk__stc_stride(D) * 4 <= 80 * 1024 ? 2 : 1; }
__host__ __device__ constexpr int qk__stc_buf(int D, int BM) /* words: the operands, or the staged tile (BM + 4 a row) */
{
    return 2 * BM * qk__stc_stride(D) > BM * (BM + 4) ? 2 * BM * qk__stc_stride(D) : BM * (BM + 4);
}
__host__ __device__ constexpr size_t qk__stc_smem(int D, int BM) { return (size_t)qk__stc_stages(D, BM) * qk__stc_buf(D, BM) * 4; }
__host__ __device__ constexpr int qk__stc_threads(int BM) { return (BM / 32) * (BM / 32) * 32; }

/* v * s -> (hi, lo) as half2 words: hi = fp16(v s), lo = fp16(v s - hi) */
__device__ __forceinline__ void qk__f16_split(float2 v, float s, uint32_t &hi, uint32_t &lo)
{
    const float x = v.x * s, y = v.y * s;
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    hi = *(const uint32_t *)&h;
    lo = *(const uint32_t *)&l;
}

/* a B amplitude (re, im) -> its hi and lo words (qk__f16_split) and their turns (im, -re), the
   operands of Im <a|b> */
__device__ __forceinline__ void qk__f16_split_b(float2 v, float s, uint32_t &hi, uint32_t &lo, uint32_t &rhi, uint32_t &rlo)
{
    qk__f16_split(v, s, hi, lo);
    rhi = __byte_perm(hi, 0, 0x1032) ^ 0x80000000u;
    rlo = __byte_perm(lo, 0, 0x1032) ^ 0x80000000u;
}
/* one 16 x 8 piece: (cr, ci) += (Re, Im) <a|b> from the split operands, lo*hi + hi*lo + hi*hi */
__device__ __forceinline__ void qk__mma_c3(float *cr, float *ci, const uint32_t *ah, const uint32_t *al, const uint32_t *bh,
                                           const uint32_t *bl, const uint32_t *rh, const uint32_t *rl)
{
    qk__mma_f16(cr, al, bh);
    qk__mma_f16(ci, al, rh);
    qk__mma_f16(cr, ah, bl);
    qk__mma_f16(ci, ah, rl);
    qk__mma_f16(cr, ah, bh);
    qk__mma_f16(ci, ah, rh);
}

template <int D, int BM>
__global__ void __launch_bounds__(qk__stc_threads(BM), 65536 / (qk__stc_threads(BM) * 128))
qk__k_gram_small_tc(const float2 *__restrict__ A, const float2 *__restrict__ B, int m, int nn, float *__restrict__ out,
                    int64_t ld, float *__restrict__ mout, int64_t doff, int tri, int vec, int tx_tiles, int tgrid, int64_t ntiles)
{
    constexpr int NT = qk__stc_threads(BM), WPR = BM / 32, S = qk__stc_stride(D), ST = qk__stc_stages(D, BM);
    constexpr int CH = D / 2, BUF = qk__stc_buf(D, BM), CS = BM + 4; /* 16-byte chunks a row, words a buffer, staged row */
    constexpr float sc = (float)(D >= 64 ? 8 : D >= 16 ? 4 : D >= 4 ? 2 : 1), isc2 = 1.0f / (sc * sc); /* 2^floor(q/2) */
    static_assert(D >= 4 && D <= 64, "the few-qubit tensor-core kernel: 2 to 6 qubits");
    extern __shared__ __align__(16) float qk__stc_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wr = (warp / WPR) * 32, wc = (warp % WPR) * 32;
    auto tile = [&](int64_t L, int &a, int &b) {
        if (tgrid > 0) qk__tri_tile(L, tgrid, a, b);
        else {
            a = (int)(L / tx_tiles);
            b = (int)(L % tx_tiles);
        }
    };
    /* the rows of tile (r0, c0) into buffer buf: A rows, then B rows (zero past m / nn) */
    auto issue = [&](int r0, int c0, int buf) {
        float *s = qk__stc_sm + buf * BUF;
        for (int e = threadIdx.x; e < 2 * BM * CH; e += NT) {
            const int op = e / (BM * CH), r = (e / CH) % BM, c = e % CH;
            const int gr = (op ? c0 : r0) + r, lim = op ? nn : m;
            const float2 *src = (op ? B : A) + (int64_t)(gr < lim ? gr : lim - 1) * D + 2 * c;
            qk__cp16(s + (op * BM + r) * S + 4 * c, src, gr < lim ? 16 : 0);
        }
        qk__cp_commit();
    };
    int64_t L = blockIdx.x;
    if (L >= ntiles) return;
    int a, b;
    if (ST == 2) {
        tile(L, a, b);
        issue(a * BM, b * BM, 0);
    }
    for (int buf = 0; L < ntiles; L += gridDim.x, buf ^= (ST - 1)) {
        if (ST == 2) {
            if (L + gridDim.x < ntiles) {
                tile(L + gridDim.x, a, b);
                issue(a * BM, b * BM, buf ^ 1);
            } else qk__cp_commit(); /* an empty group: wait_group 1 below then means this tile's */
            qk__cp_wait<1>();
        }
        tile(L, a, b);
        const int row0 = a * BM, col0 = b * BM;
        if (ST == 1) {
            issue(row0, col0, 0);
            qk__cp_wait<0>();
        }
        __syncthreads();
        if (!(tri && (int64_t)col0 + BM - 1 + doff < row0)) { /* block-uniform: a tile under the diagonal is skipped */
            const float *sa = qk__stc_sm + buf * BUF + wr * S, *sb = qk__stc_sm + buf * BUF + (BM + wc) * S;
            float cr[2][4][4] = {}, ci[2][4][4] = {};
            /* m16n8k16: k slots 2t, 2t + 1 (one register) = (re, im) of amplitude 8 ks + t, slots
               2t + 8, 2t + 9 = amplitude 8 ks + t + 4 (zero past D) */
#pragma unroll
            for (int ks = 0; ks < (D + 7) / 8; ++ks) {
                const int c0 = 8 * ks + t, c1 = c0 + 4;
                uint32_t ah[2][4], al[2][4];
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int r = 0; r < 4; ++r) { /* a0 (g, c0) a1 (g + 8, c0) a2 (g, c1) a3 (g + 8, c1) */
                        const int c = r < 2 ? c0 : c1;
                        const float2 u = c < D ? *(const float2 *)(sa + (16 * i + g + 8 * (r & 1)) * S + 2 * c) : make_float2(0.f, 0.f);
                        qk__f16_split(u, sc, ah[i][r], al[i][r]);
                    }
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    uint32_t bh[2], bl[2], rh[2], rl[2];
#pragma unroll
                    for (int r = 0; r < 2; ++r) { /* b0 (c0, g) b1 (c1, g) */
                        const int c = r ? c1 : c0;
                        const float2 v = c < D ? *(const float2 *)(sb + (8 * j + g) * S + 2 * c) : make_float2(0.f, 0.f);
                        qk__f16_split_b(v, sc, bh[r], bl[r], rh[r], rl[r]);
                    }
#pragma unroll
                    for (int i = 0; i < 2; ++i) qk__mma_c3(cr[i][j], ci[i][j], ah[i], al[i], bh, bl, rh, rl);
                }
            }
            /* a tile inside K and off the diagonal (block-uniform) is staged in this buffer
               (its operands are read) and written as 16-byte rows, its mirror as 16-byte column
               pieces, two lanes a 32-byte sector (as >>small); other tiles store from the
               fragments with guards */
            const bool full = vec && row0 + BM <= m && col0 + BM <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM);
            float *cs = qk__stc_sm + buf * BUF;
            if (full) __syncthreads();
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int li = wr + 16 * i + 8 * h + g, lj = wc + 8 * j + 2 * t, gi = row0 + li, gj = col0 + lj;
                        const float r0 = cr[i][j][2 * h] * isc2, i0 = ci[i][j][2 * h] * isc2;
                        const float r1 = cr[i][j][2 * h + 1] * isc2, i1 = ci[i][j][2 * h + 1] * isc2;
                        const float k0 = r0 * r0 + i0 * i0, k1 = r1 * r1 + i1 * i1;
                        if (full) {
                            *(float2 *)(cs + li * CS + lj) = make_float2(k0, k1);
                            continue;
                        }
                        float *o = out + (int64_t)gi * ld + gj;
                        const bool in0 = gi < m && gj < nn, in1 = gi < m && gj + 1 < nn;
                        const bool ok0 = in0 && (!tri || gj + doff >= gi), ok1 = in1 && (!tri || gj + 1 + doff >= gi);
                        if (vec && ok0 && ok1) __stcs((float2 *)o, make_float2(k0, k1));
                        else {
                            if (ok0) o[0] = k0;
                            if (ok1) o[1] = k1;
                        }
                        if (mout) {
                            if (in0 && (!tri || gj + doff > gi)) __stcs(mout + (int64_t)gj * ld + gi, k0);
                            if (in1 && (!tri || gj + 1 + doff > gi)) __stcs(mout + (int64_t)(gj + 1) * ld + gi, k1);
                        }
                    }
            if (full) {
                __syncthreads();
                for (int idx = threadIdx.x; idx < BM * BM / 4; idx += NT) {
                    const int r = idx / (BM / 4), c = (idx % (BM / 4)) * 4;
                    __stcs((float4 *)(out + (int64_t)(row0 + r) * ld + col0 + c), *(const float4 *)(cs + r * CS + c));
                }
                if (mout)
                    for (int idx = threadIdx.x; idx < BM * BM / 4; idx += NT) {
                        /* lanes 2p, 2p + 1: rows r, r + 4 of column c (CS = 4 mod 32: a warp's 16
                           columns and the two row offsets meet each bank once) */
                        const int p = idx >> 1, c = p % BM, r = (p / BM) * 8 + (idx & 1) * 4;
                        __stcs((float4 *)(mout + (int64_t)(col0 + c) * ld + row0 + r),
                               make_float4(cs[r * CS + c], cs[(r + 1) * CS + c], cs[(r + 2) * CS + c], cs[(r + 3) * CS + c]));
                    }
            }
        }
        __syncthreads(); /* this buffer is refilled by the issue two tiles on (one, single-buffered) */
    }
}

/* ---- the warp-pipelined form for 4 qubits (fused configuration 8 at D = 16) ---- */
/* At 4 qubits K(X,X) is bound by the write of K (every entry written once), and on GPUs with the
   fastest memory the block form above runs well under that write: its four warps meet at three
   barriers a tile and stage every tile in shared memory. Warps that never wait for each other but load their
   operands only when they need them wait on those loads instead (docs/benchmarks.md, "The
   4-qubit Gram in warp-private pipelines"). Here each warp runs its own pipeline. It has two private shared-memory stages
   (8 KB each: 32 A rows and 32 B rows of 128 bytes), and while it computes and stores one tile,
   cp.async fills the other with its next tile's rows. Warps synchronise only with themselves
   (__syncwarp); there is no block barrier.

   A block of 4 warps takes a 64 x 64 tile and each warp a 32 x 32 quarter of it. The tiles go in
   patches of QK__STW_PATCH x QK__STW_PATCH, row by row inside a patch, and the blocks take them in
   turn. Tiles wholly under the diagonal (tri), and those past K's edge, are skipped. The operands
   are split as in the block form (hi and lo in fp16, with the scale s) from the fragments read
   out of the stage.

   The rows and columns are permuted inside a quarter so that each lane ends with a 4 x 8 block of
   K:
   - m16 piece i, fragment row g + 8h, is row 4g + 2i + h;
   - n8 piece j, fragment column nu, is column 16 (j >> 1) + 4 (nu >> 1) + 2 (j & 1) + (nu & 1).
   Lane (g, t) then holds rows 4g .. 4g + 3 and columns 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3.
   A row store is a 16-byte piece: one warp instruction writes 8 rows x 64 contiguous bytes. A
   mirror store is the 4 rows of one column: 8 lanes write 128 contiguous bytes. Both are whole
   32-byte sectors, straight from the accumulators.

   In a stage, 16-byte chunk k of row r sits at chunk k ^ f(r), with f(r) = 2 ((r >> 2) & 3) for
   the A rows and 2 ((r & 1) | ((r >> 1) & 2)) for the B rows. Each half-warp's fragment reads then
   meet every bank once: four rows, each a 32-byte pair of chunks.

   Semantics of out / mout / doff / tri are those of qk__k_gram. */
#define QK__STW_WARPS 4  /* warps a block: a 64 x 64 tile in quarters; warps share no data */
#define QK__STW_PATCH 16 /* tiles a side of the patch order */
#define QK__STW_STAGE (64 * 32) /* words of a stage: 32 A and 32 B rows of 16 amplitudes */

__global__ void __launch_bounds__(32 * QK__STW_WARPS, 3)
qk__k_gram_stw(const float2 *__restrict__ A, const float2 *__restrict__ B, int m, int nn, float *__restrict__ out, int64_t ld,
               float *__restrict__ mout, int64_t doff, int tri, int vec)
{
    constexpr int D = 16;
    constexpr float sc = 4.0f, isc4 = 1.0f / (sc * sc * sc * sc); /* as qk__k_gram_small_tc at D = 16 */
    extern __shared__ __align__(16) float qk__stw_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float *const stage0 = qk__stw_sm + warp * 2 * QK__STW_STAGE;
    const int Tx = (nn + 63) / 64, Ty = (m + 63) / 64; /* the launcher keeps the patch grid's tiles under 2^31 */
    const int PX = (Tx + QK__STW_PATCH - 1) / QK__STW_PATCH, PY = (Ty + QK__STW_PATCH - 1) / QK__STW_PATCH;
    const int total = PX * PY * QK__STW_PATCH * QK__STW_PATCH;
    /* this warp's quarter of tile L: its first row and column, false where it has nothing to write */
    auto quarter = [&](int L, int &row0, int &col0) {
        const int pt = L / (QK__STW_PATCH * QK__STW_PATCH), in = L % (QK__STW_PATCH * QK__STW_PATCH);
        const int a = (pt / PX) * QK__STW_PATCH + in / QK__STW_PATCH, b = (pt % PX) * QK__STW_PATCH + in % QK__STW_PATCH;
        row0 = 64 * a + 32 * (warp >> 1);
        col0 = 64 * b + 32 * (warp & 1);
        return a < Ty && b < Tx && row0 < m && col0 < nn && !(tri && (int64_t)col0 + 31 + doff < row0);
    };
    /* the next tile from L on with work for this warp (total: none) */
    auto next = [&](int L, int &row0, int &col0) {
        while (L < total && !quarter(L, row0, col0)) L += gridDim.x;
        return L;
    };
    /* rows of a quarter into stage s: A rows row0 .. row0 + 31, then B rows col0 .. col0 + 31
       (zeros past m / nn), chunk k of stage row r at chunk k ^ f(r) */
    auto issue = [&](int row0, int col0, float *s) {
#pragma unroll
        for (int e = lane; e < 64 * 8; e += 32) {
            const int r = e >> 3, k = e & 7, isb = r >> 5, rr = r & 31;
            const int gr = (isb ? col0 : row0) + rr, lim = isb ? nn : m;
            const int f = isb ? 2 * ((rr & 1) | ((rr >> 1) & 2)) : 2 * ((rr >> 2) & 3);
            const float2 *src = (isb ? B : A) + (int64_t)(gr < lim ? gr : lim - 1) * D + 2 * k;
            qk__cp16(s + r * 32 + 4 * (k ^ f), src, gr < lim ? 16 : 0);
        }
    };
    int row0, col0, nrow0, ncol0;
    int L = next(blockIdx.x, row0, col0);
    if (L >= total) return;
    issue(row0, col0, stage0);
    qk__cp_commit();
    for (int buf = 0; L < total; buf ^= 1) {
        const int Ln = next(L + gridDim.x, nrow0, ncol0);
        if (Ln < total) issue(nrow0, ncol0, stage0 + (buf ^ 1) * QK__STW_STAGE);
        qk__cp_commit(); /* (empty past the last tile: wait_group 1 below then means this tile's) */
        qk__cp_wait<1>();
        __syncwarp();    /* every lane's chunks of this stage have landed */
        const float *sa = stage0 + buf * QK__STW_STAGE, *sb = sa + 32 * 32;
        float cr[2][4][4] = {}, ci[2][4][4] = {};
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            uint32_t ah[2][4], al[2][4]; /* A fragments: rows 4g + 2i + (r & 1), amplitudes 8 ks + t + 4 (r >> 1) */
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int rr = 4 * g + 2 * i + (r & 1), c = 8 * ks + t + 4 * (r >> 1);
                    const float2 u = *(const float2 *)(sa + rr * 32 + 4 * ((c >> 1) ^ (2 * ((rr >> 2) & 3))) + 2 * (c & 1));
                    qk__f16_split(u, sc, ah[i][r], al[i][r]);
                }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                /* B fragment of column nu = g: quarter column 16 (j >> 1) + 4 (g >> 1) + 2 (j & 1) + (g & 1) */
                const int rr = 16 * (j >> 1) + 4 * (g >> 1) + 2 * (j & 1) + (g & 1), f = 2 * ((rr & 1) | ((rr >> 1) & 2));
                uint32_t bh[2], bl[2], rh[2], rl[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int c = 8 * ks + t + 4 * r;
                    const float2 v = *(const float2 *)(sb + rr * 32 + 4 * ((c >> 1) ^ f) + 2 * (c & 1));
                    qk__f16_split_b(v, sc, bh[r], bl[r], rh[r], rl[r]);
                }
#pragma unroll
                for (int i = 0; i < 2; ++i) qk__mma_c3(cr[i][j], ci[i][j], ah[i], al[i], bh, bl, rh, rl);
            }
        }
        __syncwarp(); /* every lane has read this stage: the next tile but one may fill it */
        /* kv[x][v][y] = K[row0 + 4g + x][col0 + 16 v + 4t + y] */
        float kv[4][2][4];
#pragma unroll
        for (int x = 0; x < 4; ++x)
#pragma unroll
            for (int v = 0; v < 2; ++v)
#pragma unroll
                for (int y = 0; y < 4; ++y) {
                    const int i = x >> 1, j = 2 * v + (y >> 1), e = 2 * (x & 1) + (y & 1);
                    kv[x][v][y] = (cr[i][j][e] * cr[i][j][e] + ci[i][j][e] * ci[i][j][e]) * isc4;
                }
        const bool full = vec && row0 + 32 <= m && col0 + 32 <= nn && (!tri || (int64_t)col0 + doff >= row0 + 32);
        if (full) {
#pragma unroll
            for (int x = 0; x < 4; ++x)
#pragma unroll
                for (int v = 0; v < 2; ++v)
                    __stcs((float4 *)(out + (int64_t)(row0 + 4 * g + x) * ld + col0 + 16 * v + 4 * t),
                           make_float4(kv[x][v][0], kv[x][v][1], kv[x][v][2], kv[x][v][3]));
            if (mout)
#pragma unroll
                for (int v = 0; v < 2; ++v)
#pragma unroll
                    for (int y = 0; y < 4; ++y)
                        __stcs((float4 *)(mout + (int64_t)(col0 + 16 * v + 4 * t + y) * ld + row0 + 4 * g),
                               make_float4(kv[0][v][y], kv[1][v][y], kv[2][v][y], kv[3][v][y]));
        } else {
#pragma unroll
            for (int x = 0; x < 4; ++x)
#pragma unroll
                for (int v = 0; v < 2; ++v)
#pragma unroll
                    for (int y = 0; y < 4; ++y) {
                        const int gi = row0 + 4 * g + x, gj = col0 + 16 * v + 4 * t + y;
                        if (gi >= m || gj >= nn) continue;
                        if (!tri || gj + doff >= gi) out[(int64_t)gi * ld + gj] = kv[x][v][y];
                        if (mout && (!tri || gj + doff > gi)) mout[(int64_t)gj * ld + gi] = kv[x][v][y];
                    }
        }
        L = Ln;
        row0 = nrow0;
        col0 = ncol0;
    }
    qk__cp_wait<0>();
}

/* Under QK_TEST_FAULTS, qk_cuda_test_small_warp() counts qk__k_gram_stw's launches. */
#ifdef QK_TEST_FAULTS
static std::atomic<int> qk__stw_launches{0};
extern "C" int qk_cuda_test_small_warp(void) { return qk__stw_launches.load(); }
#endif
/* Where the warp-pipelined form runs by default: devices with 3 of its blocks resident per SM (12
   warps) and at least QK__STW_MIN_BW bytes/s of peak DRAM bandwidth (2 x memory clock x bus
   width); below that bandwidth the block form already runs close to the write of K and keeps the
   job (which devices pass, and the figures: docs/benchmarks.md, "The 4-qubit Gram in
   warp-private pipelines"). Cached per device.
   QK_STC_WARP=1 takes it wherever it launches, QK_STC_OLD=1 nowhere. */
#define QK__STW_MIN_BW 4.4e12
static bool qk__stw_device_ok()
{
    static std::atomic<int> cache[64];
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) { cudaGetLastError(); return false; }
    const int known = cache[dev].load(std::memory_order_acquire);
    if (known) return known == 2;
    int clk = 0, bus = 0, per = 0;
    const size_t smem = (size_t)QK__STW_WARPS * 2 * QK__STW_STAGE * sizeof(float);
    bool ok = cudaDeviceGetAttribute(&clk, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess &&
              2.0 * clk * 1e3 * (bus / 8.0) >= QK__STW_MIN_BW &&
              cudaFuncSetAttribute(qk__k_gram_stw, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess &&
              cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, qk__k_gram_stw, 32 * QK__STW_WARPS, smem) == cudaSuccess && per >= 3;
    cudaGetLastError();
    cache[dev].store(ok ? 2 : 1, std::memory_order_release);
    return ok;
}
#ifdef QK_TEST_FAULTS
extern "C" int qk_cuda_test_small_warp_default(void) { return qk__stw_device_ok() ? 1 : 0; }
#endif

/* qk__k_gram_stw over an m x nn block; QK_ERROR_UNSUPPORTED where its tile numbers would pass
   2^31 (the block form takes it) */
static qk_result qk__launch_stw(const float2 *A, const float2 *B, int64_t m, int64_t nn, float *out, int64_t ld, float *mout,
                                int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    const int64_t tiles = ((m + 63) / 64) * ((nn + 63) / 64); /* a bound on the blocks with work */
    if (tiles <= 0) return QK_OK;
    const int64_t P = 64 * QK__STW_PATCH, patched = ((m + P - 1) / P) * ((nn + P - 1) / P) * QK__STW_PATCH * QK__STW_PATCH;
    if (patched >= INT32_MAX) return QK_ERROR_UNSUPPORTED;
    const size_t smem = (size_t)QK__STW_WARPS * 2 * QK__STW_STAGE * sizeof(float);
    QK_CK(cudaFuncSetAttribute(qk__k_gram_stw, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int dev = 0, sms = 0, per = 0;
    QK_CK(cudaGetDevice(&dev));
    QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    QK_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, qk__k_gram_stw, 32 * QK__STW_WARPS, smem));
    if (per < 1) per = 1;
    const int64_t grid = std::min<int64_t>(tiles, (int64_t)sms * per);
#ifdef QK_TEST_FAULTS
    ++qk__stw_launches;
#endif
    qk__k_gram_stw<<<(unsigned)grid, 32 * QK__STW_WARPS, smem, st>>>(A, B, (int)m, (int)nn, out, ld, mout, doff, tri, qk__vec_ok(out, mout, ld));
    const cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess) return qk__cuda_fail(E, c, "launch of qk__k_gram_stw", __LINE__);
    return QK_OK;
}

template <int D, int BM>
static qk_result qk__launch_small_tc_d(const float2 *A, const float2 *B, int64_t m, int64_t nn, float *out, int64_t ld,
                                       float *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    return qk__launch_persistent(qk__k_gram_small_tc<D, BM>, qk__stc_threads(BM), qk__stc_smem(D, BM), BM, A, B, m, nn, out,
                                 ld, mout, doff, tri, st, "launch of qk__k_gram_small_tc", E);
}

/* The few-qubit tensor-core kernel for complex fp32 states with float K, 4 <= D <= 64 and
   16-byte aligned operands (cp.async); anything else is QK_ERROR_UNSUPPORTED (the caller falls
   back to the persistent SIMT kernel, then the tiled one). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_small_tc(const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                     OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    if (sizeof(T) != 4 || !CPLX || sizeof(OutT) != 4 || ((uintptr_t)A | (uintptr_t)B) % 16 != 0) return QK_ERROR_UNSUPPORTED;
    const float2 *a = (const float2 *)A, *b = (const float2 *)B;
    float *o = (float *)(void *)out, *mo = (float *)(void *)mout;
    if (D == 16 && !getenv("QK_STC_OLD") && (getenv("QK_STC_WARP") || qk__stw_device_ok())) { /* 4 qubits: the warp-pipelined form */
        const qk_result r = qk__launch_stw(a, b, m, nn, o, ld, mo, doff, tri, st, E);
        if (r != QK_ERROR_UNSUPPORTED) return r;
    }
    switch (D) {
    case 4: return qk__launch_small_tc_d<4, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 8: return qk__launch_small_tc_d<8, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 16: return qk__launch_small_tc_d<16, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 32: return qk__launch_small_tc_d<32, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    case 64: return qk__launch_small_tc_d<64, QK__STC_BM>(a, b, m, nn, o, ld, mo, doff, tri, st, E);
    default: return QK_ERROR_UNSUPPORTED;
    }
}

/* Fused-kernel configurations by index (qk_plan.kernel_cfg 1..QK__N_FUSED_CFG, named by qk.h's
   qk__fused_cfg_name; 0: the fixed table, qk__fused_cfg_fixed, which the planner names too). The
   autotuner (qk_cuda_tune_gram) times these on the real shape. 7 is the persistent few-qubit
   kernel (>>small: complex fp32 states with float K and D <= 32; elsewhere it runs as 1); 8 its
   tensor-core form (>>smalltc: the same states with 4 <= D <= 64; elsewhere it runs as 7). Which
   one runs is qk.h's qk__fused_cfg_runs, the rule the planner writes into the plan; the launch
   fallbacks below remain only for operands that are not 16-byte aligned (never qk's own
   buffers: a state is a multiple of 32 bytes from D = 4 on). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_gram(int cfg, const void *A, const void *B, int64_t m, int64_t nn, int D, OutT *out, int64_t ld,
                                 OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    {
        int q = 0;
        while ((1 << q) < D) ++q;
        cfg = qk__fused_cfg_runs(cfg, q, sizeof(T) == 8, CPLX, sizeof(OutT) == 4);
    }
    if (cfg == 8) {
        const qk_result r = qk__launch_small_tc<T, CPLX, OutT>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
        if (r != QK_ERROR_UNSUPPORTED) return r;
        cfg = 7;
    }
    if (cfg == 7) {
        if (sizeof(T) == 4 && CPLX && sizeof(OutT) == 4 && D <= 32) return qk__launch_small<T, CPLX, OutT>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
        cfg = 1;
    }
    switch (cfg) {
    case 2: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<128, 64, 8, 8, 4>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    case 4: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<128, 128, 8, 8, 8>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    default: return qk__launch_gram_cfg<T, CPLX, OutT, qk__tiles<64, 64, 8, 4, 4>>(A, B, m, nn, D, out, ld, mout, doff, tri, st, E);
    }
}

/* ======================================================================================== */
/* >>blas ---- cuBLAS and the tensor-core engines, the |.|^2 epilogue ---- */
/* ======================================================================================== */

/* cuBLAS path epilogue: C (m x nn, row-major, ldc) -> |C|^2 into K and its mirror. Complex C is
   interleaved (re, im), or (plane > 0, the tensor-core engines) a real plane followed, plane
   values later, by an imaginary plane. linear (plan.linear, density matrices): K = Re C itself,
   not squared (for real C, the real Gram Tr(rho_i rho_j) of the vectorised matrices). */
template <typename T, bool CPLX, typename OutT>
__global__ void __launch_bounds__(256)
qk__k_epilogue(const T *__restrict__ Cm, int64_t ldc, int m, int nn, OutT *__restrict__ out, int64_t ld,
               OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid, int64_t plane, int linear, int g3)
{
    const int BM = 32, BN = 32;
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return;
    __shared__ OutT Cs[BM * (BN + 1)];
    for (int idx = threadIdx.x; idx < BM * BN; idx += 256) {
        int r = idx / BN, c = idx % BN;
        int gi = row0 + r, gj = col0 + c;
        T v = 0;
        if (gi < m && gj < nn && (!tri || gj + doff >= gi)) {
            if (CPLX && plane && g3) {   /* Gauss's three planes (qk__tc_products): T1, T2, T3 */
                const int64_t o = (int64_t)gi * ldc + gj;
                const T t1 = Cm[o], t2 = Cm[plane + o], zr = t1 + t2;
                if (linear) v = zr;   /* T3 is not computed */
                else { const T zi = Cm[2 * plane + o] - t1 + t2; v = zr * zr + zi * zi; }
            } else if (CPLX && plane) {
                const T zr = Cm[(int64_t)gi * ldc + gj], zi = Cm[plane + (int64_t)gi * ldc + gj];
                v = linear ? zr : zr * zr + zi * zi;
            } else if (CPLX) {
                typename qk__vec2<T>::t z = ((const typename qk__vec2<T>::t *)Cm)[(int64_t)gi * ldc + gj];
                v = linear ? z.x : z.x * z.x + z.y * z.y;
            } else {
                T z = Cm[(int64_t)gi * ldc + gj];
                v = linear ? z : z * z;
            }
        }
        Cs[r * (BN + 1) + c] = (OutT)v;
    }
    __syncthreads();
    qk__store_tile<OutT, 32, 32, 256>(Cs, row0, col0, m, nn, out, ld, mout, doff, tri, vec);
}

/* qk__k_epilogue: 32 x 32 tiles, 256 threads; a diagonal block of K(X,X) gets the triangular
   grid. plane > 0: C is a Re plane then an Im plane (the tensor-core engines), or with g3 the
   three planes of Gauss's products, Re = T1 + T2 and Im = T3 - T1 + T2. linear: K = Re C. */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_epilogue(const void *Cw, int64_t m, int64_t nn, OutT *out, int64_t ld, OutT *mout, int64_t doff,
                                     int tri, int64_t plane, int linear, int g3, cudaStream_t st, qk__err *E, int64_t ldc = -1)
{
    dim3 grid((unsigned)((nn + 31) / 32), (unsigned)((m + 31) / 32));
    const int tg = (tri && doff == 0 && nn >= m) ? qk__tri_grid(&grid) : 0;
    qk__k_epilogue<T, CPLX, OutT><<<grid, 256, 0, st>>>((const T *)Cw, ldc < 0 ? nn : ldc, (int)m, (int)nn, out, ld, mout, doff, tri,
                                                        qk__vec_ok(out, mout, ld), tg, plane, linear, g3);
    QK_LAUNCH_CK("qk__k_epilogue");
    return QK_OK;
}

/* ---- tensor-core engines (plan.engine QK_GPU_TC_*) ----
   The complex product in real form: a state row of D complex amplitudes is a real row of
   W = 2D values (interleaved re, im), and
       Re <a|b> = a . b,    Im <a|b> = a . rot(b),   rot(b) = (im, -re) pairs,
   so two real GEMMs (K = W) give the Re and Im planes of the slab and the epilogue takes
   Re^2 + Im^2 (real states: one GEMM, K = D). cuBLAS's complex routines on the tensor cores fall
   short of this (CGEMM with TF32 reached 2.8x FP32 at 12 qubits, SGEMM-TF32 7.8x:
   shared/PERFORMANCE.md), and HERK/SYRK have no tensor-core compute type, so the upper
   triangle of a diagonal block is covered by GEMMs over blocks of rows, each from its diagonal
   to the right (16 blocks: 53% of the square instead of HERK's 50%). Complex states take
   Gauss's three products instead (qk__tc_gauss_products) on every engine but TC_FP64.
     TC_TF32   operands rounded to TF32 (nearest), fp32 accumulation on the tensor cores
     TC_FP32X3 operands scaled as FP16 (below), split hi + lo (both fp16: 11 + 11 bits) and laid
               out [hi lo hi hi]: GEMMs over rows of A (blocks 0..2) and rows of B (blocks 1..3)
               sum hi*lo + lo*hi + hi*hi; the dropped lo*lo and the remainder of lo are 2^-22
               relative (lo of amplitudes below 2^-3 s is subnormal: 2^-25 s absolute, 1e-7 of
               K at most). Accuracy is set by the accumulation, not the split: the tensor cores'
               fp32 accumulation is not round-to-nearest, and the measured error fits up to an
               ulp of the partial sum lost per MMA step, which grows with the length of the sum
               (on the diagonal, a sum of positive terms, it does not cancel). So (i) the small
               products go first, while the sum is small (cuBLAS's k loop runs in order), and
               (ii) hi*hi is summed in chunks of K (2, or 4 from W = 2048 on), each chunk's GEMM
               adding the previous chunks' C through its beta = 1 epilogue (round to nearest).
               Each step lowered the measured error to fp32's own level (docs/benchmarks.md, 'Figures behind the code's constants'). fp16 halves rather than TF32: twice
               the rate, half the operand bytes, MMAs of k = 16 (half the steps of TF32's k = 8)
     TC_FP16   operands scaled by s = 2^floor(q/2) (amplitudes ~2^-q/2 become ~1: nothing
               underflows fp16's 2^-14) and rounded to fp16 (11 bits, as TF32, at twice its
               rate); alpha = 1/s^2 (exact) undoes the scale
     TC_BF16   as TC_FP16 with bfloat16 (8 bits): measurement only, no precision selects it
     TC_FP64   the real form with DGEMM (T double): operands kept, rot(b) copied
   Operands live in the workspace slot after the C planes (qk__blas_ws_bytes). When A and B are
   the same rows (a diagonal block of K(X,X)) they are converted once. */

/* n values of rows of W (interleaved complex or real states) into an operand of the real-form
   products: v = in[e], or with rot its pair partner rotated, (re, im) -> (im, -re), so that
   a . rot(b) = Im <a|b>; out[e] = scale * v rounded to O (TF32, FP16, BF16; double: kept).
   SPLIT (FP32X3, O = fp16): row r becomes four blocks [hi lo hi hi] of W, hi = fp16(scale * v)
   and lo = fp16(scale * v - hi) (the difference exact in fp32), so that the first three blocks
   of a row of A (hi lo hi) against the last three of a row of B (lo hi hi) sum, in this order,
   hi*lo + lo*hi + hi*hi (why this order: qk__tc_products). */
template <typename T, typename O, bool SPLIT>
__global__ void __launch_bounds__(256)
qk__k_tc_operand(const T *__restrict__ in, int64_t n, int64_t W, int rot, T scale, O *__restrict__ out)
{
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const T v = rot ? ((e & 1) ? -in[e - 1] : in[e + 1]) : in[e];
        if constexpr (SPLIT) {
            const float sv = (float)(v * scale);
            const O hi = qk__cvt(sv, (O *)nullptr), lo = qk__cvt(sv - qk__f(hi), (O *)nullptr);
            const int64_t r = e / W, k = e - r * W;
            O *o = out + r * 4 * W + k;
            o[0] = hi; o[W] = lo; o[2 * W] = hi; o[3 * W] = hi;
        } else out[e] = qk__cvt(v * scale, (O *)nullptr);
    }
}

/* Gauss's form of the complex product (qk__tc_products, complex states, every tensor-core mode
   but FP64): rows of D interleaved complex values into planes of D real values, plane p of the
   set bits of sel (0 re, 1 im, 2 re - im, 3 re + im) written as the j-th plane out (j counts the
   set bits below p), each pstride values apart; a plane's row is ld values, one row of
   scale * v rounded to O, or with SPLIT (FP32X3) the four blocks [hi lo hi hi] of qk__k_tc_operand. */
template <typename O, bool SPLIT>
__global__ void __launch_bounds__(256)
qk__k_tc_operand3(const float *__restrict__ in, int64_t n, int64_t D, unsigned sel, float scale, O *__restrict__ out,
                  int64_t pstride)
{
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / D, k = e - r * D;
        qk__gauss_store<O, SPLIT>(((const float2 *)in)[e], sel, scale, out + r * (SPLIT ? 4 * D : D) + k, D, pstride);
    }
}

static qk_result qk__launch_tc_operand3(qk_gpu_engine mode, const void *src, int64_t rows, int64_t D, unsigned sel, float s16,
                                        void *dst, int64_t pstride, cudaStream_t st, qk__err *E)
{
    const int64_t n = rows * D;
    const unsigned g = (unsigned)std::min<int64_t>((n + 255) / 256, (int64_t)1 << 20);
    const float *in = (const float *)src;
    if (n <= 0) return QK_OK;
    switch (mode) {
    case QK_GPU_TC_TF32: qk__k_tc_operand3<float, false><<<g, 256, 0, st>>>(in, n, D, sel, 1.0f, (float *)dst, pstride); break;
    case QK_GPU_TC_FP32X3: qk__k_tc_operand3<__half, true><<<g, 256, 0, st>>>(in, n, D, sel, s16, (__half *)dst, pstride); break;
    case QK_GPU_TC_FP16: qk__k_tc_operand3<__half, false><<<g, 256, 0, st>>>(in, n, D, sel, s16, (__half *)dst, pstride); break;
    case QK_GPU_TC_BF16: qk__k_tc_operand3<__nv_bfloat16, false><<<g, 256, 0, st>>>(in, n, D, sel, s16, (__nv_bfloat16 *)dst, pstride); break;
    default: return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: Gauss's planes take an fp32 tensor-core engine");
    }
    QK_LAUNCH_CK("qk__k_tc_operand3");
    return QK_OK;
}

/* qk__k_tc_operand for tensor-core engine mode (QK_GPU_TC_*): rows x W values of src into dst, a grid-stride loop
   of at most 2^20 blocks. */
static qk_result qk__launch_tc_operand(qk_gpu_engine mode, const void *src, int64_t rows, int64_t W, int rot, float s16, void *dst,
                                       cudaStream_t st, qk__err *E)
{
    const int64_t n = rows * W;
    const unsigned g = (unsigned)std::min<int64_t>((n + 255) / 256, (int64_t)1 << 20);
    if (n <= 0) return QK_OK;
    switch (mode) {
    case QK_GPU_TC_TF32: qk__k_tc_operand<float, float, false><<<g, 256, 0, st>>>((const float *)src, n, W, rot, 1.0f, (float *)dst); break;
    case QK_GPU_TC_FP32X3: qk__k_tc_operand<float, __half, true><<<g, 256, 0, st>>>((const float *)src, n, W, rot, s16, (__half *)dst); break;
    case QK_GPU_TC_FP16: qk__k_tc_operand<float, __half, false><<<g, 256, 0, st>>>((const float *)src, n, W, rot, s16, (__half *)dst); break;
    case QK_GPU_TC_BF16: qk__k_tc_operand<float, __nv_bfloat16, false><<<g, 256, 0, st>>>((const float *)src, n, W, rot, s16, (__nv_bfloat16 *)dst); break;
    default: qk__k_tc_operand<double, double, false><<<g, 256, 0, st>>>((const double *)src, n, W, rot, 1.0, (double *)dst); break;
    }
    QK_LAUNCH_CK("qk__k_tc_operand");
    return QK_OK;
}

/* Complex states on a tensor-core engine other than FP64 take Gauss's three products (below);
   QK_TC_4M=1 (measurement) keeps the four-product real form. */
static bool qk__tc_gauss(qk_gpu_engine mode, bool cplx)
{
    const char *e = getenv("QK_TC_4M");
    return cplx && qk__engine_tc(mode) && mode != QK_GPU_TC_FP64 && !(e && e[0] == '1');
}

/* planes: the rows are Gauss's operand planes already (qk__op_planes): the three planes of C only */
template <typename T, bool CPLX>
static size_t qk__blas_ws_bytes(qk_gpu_engine mode, int64_t rows, int64_t cols, int64_t D, bool planes = false)
{
    /* keep in step with qk.h's qk__blas_ws (the planner counts these bytes): the larger of the
       real form's (two planes of C; operands for the rows, the columns and the rotated columns)
       and Gauss's (three planes; three operand planes of D values each for the rows and for the
       columns, or four for rows that are also the columns) */
    const size_t c = (size_t)rows * (size_t)cols * (CPLX ? 2 : 1) * sizeof(T);
    const size_t W = (size_t)D * (CPLX ? 2 : 1);
    if (!qk__engine_tc(mode)) return c;
    if (planes && CPLX) return c / 2 * 3 + 512;
    if (mode == QK_GPU_TC_FP64) return c + 512 + (CPLX ? (size_t)cols * W * 8 : 0);
    const size_t per = mode == QK_GPU_TC_FP32X3 ? 8 * W : mode == QK_GPU_TC_TF32 ? 4 * W : 2 * W;
    const size_t four = c + 512 + per * ((size_t)rows + (size_t)cols * (CPLX ? 2 : 1));
    if (!CPLX) return four;
    const size_t r = (size_t)rows, cl = (size_t)cols, mx = std::max(r, cl);
    const size_t gauss = c / 2 * 3 + 512 + per / 2 * std::max(4 * mx, 3 * (r + cl));
    return std::max(four, gauss);
}


/* Gauss's form (qk__tc_gauss): with a = ar + i ai and b = br + i bi (D real values each),
       T1 = ar . br,   T2 = ai . bi,   T3 = (ar - ai) . (br + bi),
       Re <a|b> = T1 + T2,   Im <a|b> = T3 - T1 + T2,
   three real products of length D where the real form takes two of length 2D: 3/4 of the
   multiply-adds, one more plane of C for the epilogue to read. Each product is laid out, split,
   ordered and chunked as the real form's (FP32X3: [hi lo hi hi] rows, the small products first,
   hi*hi in chunks of the real form's length). Operands: planes re, im, re - im of the rows of A and
   re, im, re + im of the rows of B (four planes once when A and B are the same rows); C: the
   planes T1, T2, T3 (T3 not computed for linear, where K = Re). */
/* Called by the tensor-core products after each block of rows of a diagonal block (trap): rows
   [r0, r1), columns [r0, nn) of C are final (qk__launch_blas starts their epilogue). */
struct qk__blk_done {
    qk_result (*fn)(void *ctx, int64_t r0, int64_t r1);
    void *ctx;
};

/* Rows that are Gauss's operand planes already (the fp16, bf16 and fp32x3 engines; the state
   builder wrote them, qk__planes_out): A and B point at their rows in plane 0 (re), a row of the
   operand's length (D, fp32x3 4D); the planes im, re - im, re + im follow psa (A's) and psb (B's)
   values apart. */
struct qk__op_planes {
    int64_t psa, psb;
};

/* Under QK_TEST_FAULTS, qk_cuda_test_gauss() counts qk__tc_gauss_products' calls. */
#ifdef QK_TEST_FAULTS
static std::atomic<int> qk__gauss_calls{0};
extern "C" int qk_cuda_test_gauss(void) { return qk__gauss_calls.load(); }
#define QK__TEST_GAUSS() (++qk__gauss_calls)
#else
#define QK__TEST_GAUSS() ((void)0)
#endif
template <typename T, bool CPLX>
static qk_result qk__tc_gauss_products(cublasHandle_t h, qk_gpu_engine mode, const void *A, const void *B, int64_t m, int64_t nn,
                                       int D, int q, void *Cw, bool trap, int linear, qk__blk_done bd, cudaStream_t st,
                                       qk__err *E, const qk__op_planes *pp)
{
    const bool same = A == B, x3 = mode == QK_GPU_TC_FP32X3;
    if (pp && mode == QK_GPU_TC_TF32)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: internal error: operand planes given to the tf32 engine");
    const int64_t ld = x3 ? 4 * (int64_t)D : D, offb = x3 ? D : 0;
    QK__TEST_GAUSS();
    const size_t vb = mode == QK_GPU_TC_TF32 ? 4 : 2;
    /* the hi*hi chunks of the real form's length: W / 2 below W = 2048, W / 4 from it on */
    const int nck = x3 ? (2 * D >= 2048 ? 2 : 1) : 1;
    const int64_t Dc = (int64_t)D / nck, K0 = x3 ? 2 * (int64_t)D + Dc : D;
    const float s16 = mode == QK_GPU_TC_TF32 ? 1.0f : ldexpf(1.0f, q / 2);
    const cudaDataType_t ty = mode == QK_GPU_TC_BF16 ? CUDA_R_16BF : mode == QK_GPU_TC_TF32 ? CUDA_R_32F : CUDA_R_16F;
    const cublasComputeType_t ct = mode == QK_GPU_TC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float a32 = 1.0f / (s16 * s16), b32 = 0.0f, one32 = 1.0f;
    T *C = (T *)Cw;
    char *ops = (char *)Cw + ((size_t)m * nn * 3 * sizeof(T) + 255) / 256 * 256;
    const char *pa[3], *pb[3];
    if (pp) {     /* A: re, im, re - im; B: re, im, re + im, where the state builder wrote them */
        for (int t = 0; t < 3; ++t) pa[t] = (const char *)A + (size_t)(t * pp->psa) * vb;
        pb[0] = (const char *)B; pb[1] = (const char *)B + (size_t)pp->psb * vb; pb[2] = (const char *)B + (size_t)(3 * pp->psb) * vb;
    } else if (same) {   /* re, im, re - im, re + im of max(m, nn) rows */
        const int64_t rb = std::max(m, nn), ps = rb * ld;
        QK_TRY(qk__launch_tc_operand3(mode, A, rb, D, 0xFu, s16, ops, ps, st, E));
        for (int t = 0; t < 3; ++t) pa[t] = ops + (size_t)(t * ps) * vb;
        pb[0] = pa[0]; pb[1] = pa[1]; pb[2] = ops + (size_t)(3 * ps) * vb;
    } else {      /* B: re, im, re + im; A: re, im, re - im */
        const int64_t psb = nn * ld, psa = m * ld;
        char *oa = ops + (size_t)(3 * psb) * vb;
        QK_TRY(qk__launch_tc_operand3(mode, B, nn, D, 0xBu, s16, ops, psb, st, E));
        QK_TRY(qk__launch_tc_operand3(mode, A, m, D, 0x7u, s16, oa, psa, st, E));
        for (int t = 0; t < 3; ++t) { pb[t] = ops + (size_t)(t * psb) * vb; pa[t] = oa + (size_t)(t * psa) * vb; }
    }
    auto gemm = [&](int t, int64_t r0, int64_t r1, int64_t c0, int64_t k0, int64_t kk, bool acc) -> qk_result {
        const void *bp = pb[t] + (size_t)(c0 * ld + offb + k0) * vb;
        const void *ap = pa[t] + (size_t)(r0 * ld + k0) * vb;
        QK_BLAS_CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)(nn - c0), (int)(r1 - r0), (int)kk, &a32, bp, ty, (int)ld, ap, ty,
                                (int)ld, acc ? &one32 : &b32, C + (size_t)t * m * nn + r0 * nn + c0, CUDA_R_32F, (int)nn, ct,
                                CUBLAS_GEMM_DEFAULT));
        return QK_OK;
    };
    /* blocks of rows from the diagonal, as the real form's */
    const int64_t bs = trap ? std::max<int64_t>(512, ((m + 15) / 16 + 255) / 256 * 256) : m;
    for (int64_t r0 = 0; r0 < m; r0 += bs) {
        const int64_t r1 = std::min(m, r0 + bs), c0 = trap ? r0 : 0;
        for (int t = 0; t < (linear ? 2 : 3); ++t) {
            QK_TRY(gemm(t, r0, r1, c0, 0, K0, false));
            for (int j = 1; j < nck; ++j) QK_TRY(gemm(t, r0, r1, c0, 2 * (int64_t)D + j * Dc, Dc, true));
        }
        if (trap && bd.fn) QK_TRY(bd.fn(bd.ctx, r0, r1));
    }
    return QK_OK;
}

/* g3: Gauss's form (qk__tc_gauss, read once by the caller, whose epilogue reads the planes these
   products write) */
template <typename T, bool CPLX>
static qk_result qk__tc_products(cublasHandle_t h, qk_gpu_engine mode, const void *A, const void *B, int64_t m, int64_t nn, int D,
                                 void *Cw, bool trap, int linear, int g3, qk__blk_done bd, cudaStream_t st, qk__err *E,
                                 const qk__op_planes *pp = nullptr)
{
    const bool f64 = sizeof(T) == 8;
    if (f64 != (mode == QK_GPU_TC_FP64) || !qk__engine_tc(mode))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: tensor-core engine (plan.engine) does not match the precision");
    int q = 0;
    while (((int64_t)1 << q) < D) ++q;
    if (q > QK__TC_MAX_QUBITS) return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "qk_cuda_gram: tensor-core engines take at most 24 qubits");
    if constexpr (CPLX && sizeof(T) == 4)
        if (g3) return qk__tc_gauss_products<T, CPLX>(h, mode, A, B, m, nn, D, q, Cw, trap, linear, bd, st, E, pp);
    if (pp) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: internal error: operand planes outside Gauss's form");
    const int64_t W = CPLX ? 2 * (int64_t)D : D;
    const bool same = A == B;
    const int64_t rb = same ? std::max(m, nn) : nn; /* rows of B converted (the rows of A too when same) */
    T *Cre = (T *)Cw, *Cim = Cre + m * nn;
    char *ops = (char *)Cw + ((size_t)m * nn * (CPLX ? 2 : 1) * sizeof(T) + 255) / 256 * 256;
    const size_t vb = mode == QK_GPU_TC_TF32 ? 4 : mode == QK_GPU_TC_FP64 ? 8 : 2; /* bytes per operand value */
    const int64_t ld = mode == QK_GPU_TC_FP32X3 ? 4 * W : W, offb = mode == QK_GPU_TC_FP32X3 ? W : 0;
    /* FP32X3: the hi*hi block (the last W of K) in nck chunks, the first chunk with the small products */
    const bool x3 = mode == QK_GPU_TC_FP32X3;
    const int nck = x3 ? (W >= 2048 ? 4 : 2) : 1;
    const int64_t Wc = x3 ? W / nck : W, K0 = x3 ? 2 * W + Wc : W;
    const float s16 = x3 || mode == QK_GPU_TC_FP16 || mode == QK_GPU_TC_BF16 ? ldexpf(1.0f, q / 2) : 1.0f;
    const cudaDataType_t ty = mode == QK_GPU_TC_FP64 ? CUDA_R_64F : x3 || mode == QK_GPU_TC_FP16 ? CUDA_R_16F
                            : mode == QK_GPU_TC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t cty = mode == QK_GPU_TC_FP64 ? CUDA_R_64F : CUDA_R_32F;
    const cublasComputeType_t ct = mode == QK_GPU_TC_FP64 ? CUBLAS_COMPUTE_64F : mode == QK_GPU_TC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float a32 = 1.0f / (s16 * s16), b32 = 0.0f, one32 = 1.0f;
    const double a64 = 1.0, b64 = 0.0;

    /* operands: rows of B (xb), rotated rows of B (xr), rows of A (xa) */
    auto conv = [&](const void *src, int64_t rows, int rot, void *dst) -> qk_result {
        return qk__launch_tc_operand(mode, src, rows, W, rot, s16, dst, st, E);
    };
    const void *xa, *xb, *xr = nullptr;
    char *p = ops;
    if (mode == QK_GPU_TC_FP64) {
        xa = A; xb = B;
        if (CPLX) { QK_TRY(conv(B, nn, 1, p)); xr = p; }
    } else {
        QK_TRY(conv(B, rb, 0, p)); xb = p; p += (size_t)rb * ld * vb;
        if (CPLX) { QK_TRY(conv(B, nn, 1, p)); xr = p; p += (size_t)nn * ld * vb; }
        if (same) xa = xb;
        else { QK_TRY(conv(A, m, 0, p)); xa = p; }
    }
    /* C rows [r0, r1) x columns [c0, nn) of one plane: column-major (nn x m) = op^T A, over
       k in [k0, k0 + kk) of the operand windows; acc adds C (beta = 1) */
    auto gemm = [&](const void *bop, int64_t r0, int64_t r1, int64_t c0, T *C, int64_t k0, int64_t kk, bool acc) -> qk_result {
        const void *bp = (const char *)bop + (size_t)(c0 * ld + offb + k0) * vb;
        const void *ap = (const char *)xa + (size_t)(r0 * ld + k0) * vb;
        const void *al = f64 ? (const void *)&a64 : (const void *)&a32;
        const void *be = f64 ? (const void *)&b64 : acc ? (const void *)&one32 : (const void *)&b32;
        QK_BLAS_CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)(nn - c0), (int)(r1 - r0), (int)kk, al, bp, ty, (int)ld, ap, ty,
                                (int)ld, be, C + r0 * nn + c0, cty, (int)nn, ct, CUBLAS_GEMM_DEFAULT));
        return QK_OK;
    };
    /* blocks of rows from the diagonal: 8 of them (256-aligned, at least 512 rows) */
    const int64_t bs = trap ? std::max<int64_t>(512, ((m + 15) / 16 + 255) / 256 * 256) : m;
    for (int64_t r0 = 0; r0 < m; r0 += bs) {
        const int64_t r1 = std::min(m, r0 + bs), c0 = trap ? r0 : 0;
        for (int pl = 0; pl < (CPLX ? 2 : 1); ++pl) {
            const void *bop = pl ? xr : xb;
            T *C = pl ? Cim : Cre;
            QK_TRY(gemm(bop, r0, r1, c0, C, 0, K0, false));
            for (int j = 1; j < nck; ++j) QK_TRY(gemm(bop, r0, r1, c0, C, 2 * W + j * Wc, Wc, true));
        }
        if (trap && bd.fn) QK_TRY(bd.fn(bd.ctx, r0, r1));
    }
    return QK_OK;
}

/* cuBLAS: C (m x nn row-major, ldc = nn) holds <b_j|a_i> (the conjugate of <a_i|b_j>; |.|^2
   does not care): column-major nn x m = B^H A. For a diagonal block of K(X,X) (tri, doff == 0)
   the m x m square is one HERK/SYRK (lower triangle in column-major = j >= i, half the flops)
   and the rest a GEMM; then the fused epilogue. CUBLAS_3M: CGEMM3M (Gauss: 3 real products instead
   of 4) for complex fp32. Modes 3..7: the tensor-core engines above (Re and Im planes). linear
   (plan.linear): the epilogue writes C itself, not |C|^2 (density matrices). pp: A and B are
   Gauss's operand planes already (qk__op_planes; the caller chose Gauss's form). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__launch_blas(cublasHandle_t h, qk_gpu_engine mode, const void *A, const void *B, int64_t m, int64_t nn, int D,
                                 void *Cw, OutT *out, int64_t ld, OutT *mout, int64_t doff, int tri,
                                 cudaStream_t st, qk__err *E, cudaStream_t est = nullptr, cudaEvent_t gemm_done = nullptr,
                                 int linear = 0, const qk__op_planes *pp = nullptr)
{
    QK_BLAS_CK(cublasSetStream(h, st));
    const size_t es = CPLX ? 2 * sizeof(T) : sizeof(T);
    const bool tc = qk__engine_tc(mode);
    const int g3 = tc && (pp || qk__tc_gauss(mode, CPLX));   /* three planes of C (qk__tc_gauss_products) */
    if (pp && !tc) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: internal error: operand planes outside the tensor-core engines");
    if (qk__poison_gemm) /* tests: every entry the epilogue reads must come from a GEMM (NaN otherwise) */
        QK_CK(cudaMemsetAsync(Cw, 0xFF, (size_t)m * (size_t)nn * (g3 ? 3 * sizeof(T) : es), st));
    /* With an epilogue stream (est), a diagonal block's epilogue runs per block of rows as the
       tensor-core products finish them, under the next block's GEMMs */
    const bool trap = tri && doff == 0 && m <= nn, blocked = tc && trap && est && gemm_done;
    struct Blk {
        const void *Cw; int64_t m, nn, ld, plane; OutT *out, *mout; int tri, linear, g3;
        cudaStream_t st, est; cudaEvent_t ev; qk__err *E;
    } bk = {Cw, m, nn, ld, tc && CPLX ? m * nn : 0, out, mout, tri, linear, g3, st, est, gemm_done, E};
    qk__blk_done bd = {nullptr, &bk};
    if (blocked)
        bd.fn = [](void *c, int64_t r0, int64_t r1) -> qk_result {
            Blk &b = *(Blk *)c;
            qk__err *E = b.E;
            QK_CK(cudaEventRecord(b.ev, b.st));
            QK_CK(cudaStreamWaitEvent(b.est, b.ev, 0));
            /* rows [r0, r1), columns [r0, nn): the square from (r0, r0), doff 0, C's rows nn apart */
            return qk__launch_epilogue<T, CPLX, OutT>((const T *)b.Cw + r0 * b.nn + r0, r1 - r0, b.nn - r0, b.out + r0 * b.ld + r0, b.ld,
                                                      b.mout ? b.mout + r0 * b.ld + r0 : nullptr, 0, b.tri, b.plane, b.linear, b.g3,
                                                      b.est, E, b.nn);
        };
    if (tc) QK_TRY((qk__tc_products<T, CPLX>(h, mode, A, B, m, nn, D, Cw, trap, linear, g3, bd, st, E, pp)));
    if (blocked) return QK_OK;
    int64_t c0 = tc ? nn : 0; /* first column done by GEMM */
    if (!tc && tri && doff == 0 && m <= nn) {
        if (CPLX) {
            if (sizeof(T) == 4) {
                float one = 1, zero = 0;
                QK_BLAS_CK(cublasCherk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_C, (int)m, D, &one, (const cuComplex *)A, D, &zero,
                                       (cuComplex *)Cw, (int)nn));
            } else {
                double one = 1, zero = 0;
                QK_BLAS_CK(cublasZherk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_C, (int)m, D, &one, (const cuDoubleComplex *)A, D,
                                       &zero, (cuDoubleComplex *)Cw, (int)nn));
            }
        } else {
            if (sizeof(T) == 4) {
                float one = 1, zero = 0;
                QK_BLAS_CK(cublasSsyrk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, (int)m, D, &one, (const float *)A, D, &zero,
                                       (float *)Cw, (int)nn));
            } else {
                double one = 1, zero = 0;
                QK_BLAS_CK(cublasDsyrk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, (int)m, D, &one, (const double *)A, D, &zero,
                                       (double *)Cw, (int)nn));
            }
        }
        c0 = m;
    }
    const int64_t gn = nn - c0;
    const void *Bg = (const char *)B + c0 * D * es;
    void *Cg = (char *)Cw + c0 * es;
    if (gn > 0) {
        if (CPLX) {
            if (sizeof(T) == 4) {
                cuComplex one = make_cuComplex(1, 0), zero = make_cuComplex(0, 0);
                if (mode == QK_GPU_CUBLAS_3M)
                    QK_BLAS_CK(cublasCgemm3m(h, CUBLAS_OP_C, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const cuComplex *)Bg, D,
                                             (const cuComplex *)A, D, &zero, (cuComplex *)Cg, (int)nn));
                else
                    QK_BLAS_CK(cublasCgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const cuComplex *)Bg, D,
                                           (const cuComplex *)A, D, &zero, (cuComplex *)Cg, (int)nn));
            } else {
                cuDoubleComplex one = make_cuDoubleComplex(1, 0), zero = make_cuDoubleComplex(0, 0);
                QK_BLAS_CK(cublasZgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const cuDoubleComplex *)Bg, D,
                                       (const cuDoubleComplex *)A, D, &zero, (cuDoubleComplex *)Cg, (int)nn));
            }
        } else {
            if (sizeof(T) == 4) {
                float one = 1, zero = 0;
                QK_BLAS_CK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const float *)Bg, D,
                                       (const float *)A, D, &zero, (float *)Cg, (int)nn));
            } else {
                double one = 1, zero = 0;
                QK_BLAS_CK(cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)gn, (int)m, D, &one, (const double *)Bg, D,
                                       (const double *)A, D, &zero, (double *)Cg, (int)nn));
            }
        }
    }
    /* the epilogue (memory-bound) may run on its own stream, under the next slab's GEMM
       (compute-bound): zz 8 qubits spends ~10% of its time here */
    if (est && gemm_done) {
        QK_CK(cudaEventRecord(gemm_done, st));
        QK_CK(cudaStreamWaitEvent(est, gemm_done, 0));
        st = est;
    }
    return qk__launch_epilogue<T, CPLX, OutT>(Cw, m, nn, out, ld, mout, doff, tri, tc && CPLX ? m * nn : 0, linear, g3, st, E);
}

/* ======================================================================================== */
/* >>amp ---- amplitude encoding from host data (qk_cuda_amplitude_encode) ---- */
/* ======================================================================================== */

/* Amplitude encoding: one block per row, the norm in double, then x/||x|| padded and cast. */
template <typename T>
__global__ void __launch_bounds__(256) qk__k_amp_encode(const double *__restrict__ x, int64_t rows, int d, int64_t D,
                                                       T *__restrict__ out)
{
    __shared__ double red[256];
    const int64_t r = blockIdx.x;
    if (r >= rows) return;
    const double *xr = x + r * d;
    double acc = 0;
    for (int k = threadIdx.x; k < d; k += blockDim.x) acc += xr[k] * xr[k];
    const double inv = 1.0 / sqrt(qk__block_sum256(red, acc));
    T *o = out + r * D;
    for (int64_t k = threadIdx.x; k < D; k += blockDim.x) o[k] = k < d ? (T)(xr[k] * inv) : (T)0;
}

/* qk__k_amp_encode: one block of 256 threads per row. */
template <typename T>
static qk_result qk__launch_amp_encode(const double *x, int64_t rows, int d, int64_t D, T *out, cudaStream_t st, qk__err *E)
{
    qk__k_amp_encode<T><<<(unsigned)rows, 256, 0, st>>>(x, rows, d, D, out);
    QK_LAUNCH_CK("qk__k_amp_encode");
    return QK_OK;
}

/* A large host copy on several threads (pageable source into pinned staging): one core copies
   a tenth of what the H2D copy behind it moves (docs/benchmarks.md, 'Figures behind the code's constants'). */
static void qk__par_memcpy(void *dst, const void *src, size_t n)
{
    const size_t part = (size_t)8 << 20;
    int nt = (int)std::min<size_t>(8, (n + part - 1) / part);
    if (nt <= 1) { memcpy(dst, src, n); return; }
    std::vector<std::thread> th;
    for (int t = 1; t < nt; ++t)
        th.emplace_back([=] {
            size_t a = n * t / nt, b = n * (t + 1) / nt;
            memcpy((char *)dst + a, (const char *)src + a, b - a);
        });
    memcpy(dst, src, n / nt);
    for (auto &x : th) x.join();
}

/* Encodes n host rows into out_dev on two streams: cp copies (H2D, through pinned staging when x
   is pageable), ks runs the kernel; synchronous (returns when out_dev is complete). The Gram
   job passes its pool's streams; qk_cuda_amplitude_encode, called without a context, its own. */
static qk_result qk__amp_encode(const double *x, int64_t n, int d, int n_qubits, qk_precision precision, void *out_dev,
                                int64_t batch, double *seconds, cudaStream_t cp, cudaStream_t ks, qk__err *E)
{
    if (batch <= 0) batch = 64;
    if (batch > n) batch = n > 0 ? n : 1;
    const int64_t D = (int64_t)1 << n_qubits;
    const size_t rowb = (size_t)d * sizeof(double);
    struct R {
        cudaStream_t cp = nullptr, ks = nullptr;
        double *dbuf[2] = {nullptr, nullptr};
        double *stage[2] = {nullptr, nullptr};
        cudaEvent_t h2d[2] = {nullptr, nullptr}, kdone[2] = {nullptr, nullptr}, t0 = nullptr, t1 = nullptr;
        ~R() {
            if (cp) cudaStreamSynchronize(cp);
            if (ks) cudaStreamSynchronize(ks);
            for (int i = 0; i < 2; ++i) {
                cudaFree(dbuf[i]);
                if (stage[i]) cudaFreeHost(stage[i]);
                if (h2d[i]) cudaEventDestroy(h2d[i]);
                if (kdone[i]) cudaEventDestroy(kdone[i]);
            }
            if (t0) cudaEventDestroy(t0);
            if (t1) cudaEventDestroy(t1);
            cudaGetLastError();
        }
    } R;
    R.cp = cp;
    R.ks = ks;
    cudaPointerAttributes at;
    bool pinned = cudaPointerGetAttributes(&at, x) == cudaSuccess && at.type == cudaMemoryTypeHost;
    cudaGetLastError();
    for (int i = 0; i < 2; ++i) {
        QK_CK(cudaMalloc((void **)&R.dbuf[i], (size_t)batch * rowb));
        if (!pinned) QK_CK(cudaMallocHost((void **)&R.stage[i], (size_t)batch * rowb));
        QK_CK(cudaEventCreateWithFlags(&R.h2d[i], cudaEventDisableTiming));
        QK_CK(cudaEventCreateWithFlags(&R.kdone[i], cudaEventDisableTiming));
    }
    QK_CK(cudaEventCreate(&R.t0));
    QK_CK(cudaEventCreate(&R.t1));
    QK_CK(cudaEventRecord(R.t0, R.cp));
    const int64_t nb = (n + batch - 1) / batch;
    for (int64_t b = 0; b < nb; ++b) {
        const int i = (int)(b & 1);
        const int64_t r0 = b * batch, rows = std::min(batch, n - r0);
        /* buffer i is free once the kernel of batch b-2 is done */
        if (b >= 2) QK_CK(cudaStreamWaitEvent(R.cp, R.kdone[i], 0));
        const double *src = x + r0 * d;
        if (!pinned) {
            if (b >= 2) QK_CK(cudaEventSynchronize(R.h2d[i])); /* staging i was read by batch b-2's copy */
            qk__par_memcpy(R.stage[i], src, rows * rowb);
            src = R.stage[i];
        }
        QK_CK(cudaMemcpyAsync(R.dbuf[i], src, rows * rowb, cudaMemcpyHostToDevice, R.cp));
        QK_CK(cudaEventRecord(R.h2d[i], R.cp));
        QK_CK(cudaStreamWaitEvent(R.ks, R.h2d[i], 0));
        QK_TRY(qk__dispatch(precision == QK_PRECISION_FP64, false, false, [&](auto ty) {
            typedef typename decltype(ty)::T T;
            return qk__launch_amp_encode<T>(R.dbuf[i], rows, d, D, (T *)out_dev + r0 * D, R.ks, E);
        }));
        QK_CK(cudaEventRecord(R.kdone[i], R.ks));
    }
    QK_CK(cudaEventRecord(R.t1, R.ks));
    QK_CK(cudaEventSynchronize(R.t1));
    if (seconds) {
        float ms = 0;
        QK_CK(cudaEventElapsedTime(&ms, R.t0, R.t1));
        *seconds = ms * 1e-3;
    }
    return QK_OK;
}

extern "C" qk_result qk_cuda_amplitude_encode(const double *x, int64_t n, int d, int n_qubits, qk_precision precision,
                                              void *out_dev, int64_t batch, double *seconds, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!x || !out_dev || n < 0 || d < 1 || n_qubits < 0 || n_qubits > QK_MAX_STATE_QUBITS || ((int64_t)1 << n_qubits) < d)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_amplitude_encode: bad argument");
    struct S {
        cudaStream_t s[2] = {nullptr, nullptr};
        ~S() { for (int i = 0; i < 2; ++i) if (s[i]) { cudaStreamSynchronize(s[i]); cudaStreamDestroy(s[i]); } cudaGetLastError(); }
    } st;
    for (int i = 0; i < 2; ++i) QK_CK(cudaStreamCreateWithFlags(&st.s[i], cudaStreamNonBlocking));
    return qk__amp_encode(x, n, d, n_qubits, precision, out_dev, batch, seconds, st.s[0], st.s[1], E);
}
/* >>wgmma ---- the fused tensor-core Gram on Hopper's warpgroup MMA (sm_90a; configuration 4 of the TCF engines) ---- */
/* The same job as the mma.sync kernel of >>tcf (one kernel: <a|b> on the tensor cores, |.|^2 in
   the epilogue, K written once, the triangular tile grid of K(X,X) with its mirror), on wgmma:
   one instruction is a 64 x N x 16 product of a warpgroup (four warps), issued asynchronously
   and fed from shared memory, so the issue slots that mma.sync spends on fragment loads and
   shuffles are free and the tensor cores run from a deeper pipeline.

   Operands: the FP16 and FP32X3 words of >>tcf's conversion pass (qk__k_tcf_operand: one 32-bit
   word is one complex amplitude, (re, im) fp16 of s x; FP32X3 a row of hi words, then a row of
   lo words), rows a whole number of 32-word stages (128 bytes: one swizzle row).

   Shared memory: per stage the block's A rows and B rows, 128 bytes each, in the 128-byte
   swizzle wgmma reads (16-byte chunk c of row r at chunk c ^ (r % 8); 8-row groups 1024 bytes
   apart), filled with cp.async. B is read by the instruction through a matrix descriptor; A is
   loaded into registers with ldmatrix (the m16n8k16 A layout wgmma takes for A in registers),
   so that the Im product needs no second copy of A: Re <a|b> = A . B, and with each amplitude
   of A rotated in registers ((re, im) -> (im, -re): a swap of halves and a sign bit)
   A' . B = -Im <a|b>, whose square is the same. Real maps take the Re product only.

   Pipeline: NS stages in flight ahead of the one computed (cp.async groups); each stage
   waits for the warpgroup's previous products (wgmma.wait_group 0: ptxas serializes register-A
   products whose registers are written while earlier ones run, so each stage's A registers are
   written after its predecessor completed), then one barrier covers both the landed stage and
   the buffer the next load reuses.

   FP16: 128 x 128 tiles of K, two warpgroups of 64 rows, m64n128k16 (accumulators 64 + 64 per
   thread). FP32X3: 128 x 64 tiles, m64n64k16, the products lo*hi + hi*lo + hi*hi per k-step
   (small first), and after every stage (32 amplitudes) the stage's sums are added into a second
   set of accumulators with round-to-nearest fp32 adds (the tensor cores' accumulation truncates:
   >>tcf), so no tensor-core partial sum runs longer than one stage.

   Epilogue from the accumulators (thread holds rows g and g + 8 of its warp's 16, two adjacent
   columns per 8): the tile's entries as pair stores (where qk__vec_ok: ld and the bases keep
   them aligned; else scalars), 32 bytes per row and quad (float), and
   the mirror's as scalars, 8 consecutive rows per column: every 32-byte sector written whole.
   No shared-memory staging. Only for compute capability 9.0 and a build for sm_90a
   (-Dgpu_arch=90 builds it; qk__wgmma_ok says whether this device runs it); elsewhere the kernels
   are empty and the planner never names configuration 4. */
#define QK__WG_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
/* column tiles per work item of the persistent FP16 kernel (qk__k_wg16t), chosen by measurement
   (docs/benchmarks.md, 'Figures behind the code's constants') */
#define QK__WG_ITEM 8

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ int qk__wgmma_built = 1;
#else
__device__ int qk__wgmma_built = 0;
#endif
/* 1 when device `device` runs the wgmma kernels: compute capability 9.0 and this build holds
   their sm_90a code (the device image's qk__wgmma_built). Cached per device (atomics: the
   several-GPU workers ask at once; a race only repeats the query). */
static int qk__wgmma_ok(int device)
{
    static std::atomic<int> cache[64];   /* 0 unknown, 1 no, 2 yes */
    if (device < 0 || device >= 64) return 0;
    const int known = cache[device].load(std::memory_order_acquire);
    if (known) return known == 2;
    int cur = -1, ok = 0, flag = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&cur) == cudaSuccess && cudaGetDeviceProperties(&p, device) == cudaSuccess && p.major == 9 && p.minor == 0 &&
        cudaSetDevice(device) == cudaSuccess) {
        ok = cudaMemcpyFromSymbol(&flag, qk__wgmma_built, sizeof flag) == cudaSuccess && flag == 1;
        cudaSetDevice(cur);
    }
    cudaGetLastError();
    cache[device].store(ok ? 2 : 1, std::memory_order_release);
    return ok;
}

__device__ __forceinline__ uint32_t qk__smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void qk__cp16s(uint32_t dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qk__ldsm4(uint32_t addr, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
/* The warpgroup's ordering instructions: the asm on sm_90a, nothing in other builds (where the
   wgmma kernels are never launched). */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QK__SM90A_ASM(text) asm volatile(text ::: "memory")
#else
#define QK__SM90A_ASM(text) ((void)0)
#endif
__device__ __forceinline__ void qk__wg_fence() { QK__SM90A_ASM("wgmma.fence.sync.aligned;\n"); }
__device__ __forceinline__ void qk__wg_commit() { QK__SM90A_ASM("wgmma.commit_group.sync.aligned;\n"); }
__device__ __forceinline__ void qk__wg_wait0() { QK__SM90A_ASM("wgmma.wait_group.sync.aligned 0;\n"); }
__device__ __forceinline__ void qk__fence_async_smem() { QK__SM90A_ASM("fence.proxy.async.shared::cta;\n"); }
/* keeps the compiler from moving accumulator reads or writes across the asynchronous products */
template <int N> __device__ __forceinline__ void qk__wg_pin(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void qk__wg_zero(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = 0.0f;
}
/* The byte offset of 16-byte chunk c of row r in 128-byte-swizzled rows (the layout the
   descriptors name: the chunk index xor the row's low 3 bits). */
__device__ __forceinline__ uint32_t qk__sw128(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }
/* The dynamic shared memory's first 1024-byte boundary (the 128-byte swizzle's alignment). */
__device__ __forceinline__ uint32_t qk__wg_smem1024()
{
    extern __shared__ __align__(16) unsigned char qk__smem[];
    return (qk__smem_u32(qk__smem) + 1023u) & ~1023u;
}
/* f(r, cc) for the 16-byte chunks tid, tid + 256, ... (ITEMS of them) of rows of 8 chunks: the
   block's share of one stage's loads. */
template <int ITEMS, typename F> __device__ __forceinline__ void qk__wg_each_chunk(int tid, const F &f)
{
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int c = tid + i * 256;
        f(c >> 3, c & 7);
    }
}
/* The kernels' cp.async pipeline over stages 0 .. tot - 1 (P = NS - 1 in flight): prime issues
   the first P stages' loads; advance, before stage s is used, waits for its loads, makes them
   visible to the wgmma (async) proxy, waits for every warpgroup to be done with stage s - 1 and
   issues stage s + P's loads. load(s): one stage's loads (cp.async, into slot s % NS). */
template <int P, typename L> __device__ __forceinline__ void qk__wg_prime(const L &load, int tot)
{
#pragma unroll
    for (int s = 0; s < P; ++s) {
        if (s < tot) load(s);
        qk__cp_commit();
    }
}
template <int P, typename L> __device__ __forceinline__ void qk__wg_advance(const L &load, int s, int tot)
{
    qk__cp_wait<P - 1>();
    qk__fence_async_smem();
    __syncthreads();
    if (s + P < tot) load(s + P);
    qk__cp_commit();
}
/* shared-memory matrix descriptor: start address, leading byte offset 16 (unused by the
   swizzled K-major layout), 8-row groups 1024 bytes apart, 128-byte swizzle */
__device__ __forceinline__ uint64_t qk__wg_desc(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
/* (re, im) fp16 halves -> (im, -re) */
__device__ __forceinline__ uint32_t qk__rot16(uint32_t w) { return __byte_perm(w, 0, 0x1032) ^ 0x80000000u; }

/* d (m64 x N fp32 accumulators, the wgmma D layout) += A (registers: four f16x2, the mma.sync
   m16n8k16 A layout of the warp's 16 rows) x B (shared memory, descriptor bdesc, K-major): one
   definition for both shapes, NACC = N / 2 accumulators (32 or 64: QK__WG_D<NACC> their operands,
   QK__WG_OUT<NACC> their constraints), AB the operands of A and bdesc, PRED the scale-d
   predicate's. */
#define QK__WG_D32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
                   "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define QK__WG_D64 QK__WG_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
                   "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define QK__WG_OUT32 QK__WG_F4(0), QK__WG_F4(4), QK__WG_F4(8), QK__WG_F4(12), QK__WG_F4(16), QK__WG_F4(20), QK__WG_F4(24), QK__WG_F4(28)
#define QK__WG_OUT64 QK__WG_OUT32, QK__WG_F4(32), QK__WG_F4(36), QK__WG_F4(40), QK__WG_F4(44), QK__WG_F4(48), QK__WG_F4(52), \
                     QK__WG_F4(56), QK__WG_F4(60)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QK__WG_MMA_BODY(SHAPE, NACC, AB, PRED)                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32.f16.f16 {" QK__WG_D##NACC "}, " AB ", p, 1, 1, 0;\n}\n"     \
                 : QK__WG_OUT##NACC                                                                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "n"(1))
#else
#define QK__WG_MMA_BODY(SHAPE, NACC, AB, PRED) ((void)d, (void)a, (void)bdesc)
#endif
#define QK__WG_MMA_F16(NAME, SHAPE, NACC, AB, PRED)                                                                      \
    __device__ __forceinline__ void NAME(float(&d)[NACC], const uint32_t(&a)[4], uint64_t bdesc)                        \
    {                                                                                                                    \
        QK__WG_MMA_BODY(SHAPE, NACC, AB, PRED);                                                                          \
    }
QK__WG_MMA_F16(qk__wg_m64n128k16, "m64n128k16", 64, "{%64, %65, %66, %67}, %68", "%69")
QK__WG_MMA_F16(qk__wg_m64n64k16, "m64n64k16", 32, "{%32, %33, %34, %35}, %36", "%37")

/* The epilogue of a 64-row warpgroup slice, in two steps. qk__wg_put stores two adjacent entries
   (row gi, columns gj, gj + 1) of K and their mirror (>>common's qk__store_tile rules: tri writes
   direct where col + doff >= row and mirrors where col + doff > row; inner: the whole tile inside
   K, off the diagonal, rows aligned for pair stores). qk__wg_value is one entry's (re^2 + im^2)
   from the accumulators (element x of the thread's fragment: column group x / 4, row half
   (x / 2) % 2, column x % 2). */
template <typename OutT>
__device__ __forceinline__ void qk__wg_put(float v0, float v1, int gi, int gj, bool inner, int m, int nn, OutT *__restrict__ out, int64_t ld,
                                           OutT *__restrict__ mout, int64_t doff, int tri, int mc = INT_MAX)
{
    if (inner) {
        typedef typename qk__vec2<OutT>::t V2;
        V2 w;
        w.x = (OutT)v0;
        w.y = (OutT)v1;
        *(V2 *)(out + (int64_t)gi * ld + gj) = w;
        if (mout) {
            mout[(int64_t)gj * ld + gi] = (OutT)v0;
            mout[(int64_t)(gj + 1) * ld + gi] = (OutT)v1;
        }
        return;
    }
    const float v[2] = {v0, v1};
#pragma unroll
    for (int e = 0; e < 2; ++e)
        if (gi < m && gj + e < nn) {
            if (!tri || gj + e + doff >= gi) out[(int64_t)gi * ld + gj + e] = (OutT)v[e];
            if (mout && (!tri || gj + e + doff > gi) && gj + e < mc) mout[(int64_t)(gj + e) * ld + gi] = (OutT)v[e];
        }
}
template <bool CPLX, bool TOT>
__device__ __forceinline__ float qk__wg_value(const float *ar, const float *ai, const float *tr, const float *ti, float inv_s2, int x)
{
    const float re = (TOT ? tr[x] + ar[x] : ar[x]) * inv_s2, im = CPLX ? (TOT ? ti[x] + ai[x] : ai[x]) * inv_s2 : 0.0f;
    return re * re + im * im;
}
/* The whole slice at once (NJ: 8-column groups of the slice; rl, t: the thread's row and column
   pair in its warp's 16 rows). */
template <typename OutT, int NJ, bool CPLX, bool TOT>
__device__ __forceinline__ void qk__wg_store(const float *ar, const float *ai, const float *tr, const float *ti, float inv_s2, int row0,
                                             int col0, int rl, int t, bool inner, int m, int nn, OutT *__restrict__ out, int64_t ld,
                                             OutT *__restrict__ mout, int64_t doff, int tri, int mc = INT_MAX)
{
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int x = j * 4 + h * 2;
            qk__wg_put<OutT>(qk__wg_value<CPLX, TOT>(ar, ai, tr, ti, inv_s2, x), qk__wg_value<CPLX, TOT>(ar, ai, tr, ti, inv_s2, x + 1),
                             row0 + rl + h * 8, col0 + j * 8 + 2 * t, inner, m, nn, out, ld, mout, doff, tri, mc);
        }
}
/* Column groups [j0, j1) of a slice whose values were taken earlier (v: qk__wg_value of every
   element), tri with doff 0: the persistent kernel's deferred epilogue. */
template <typename OutT>
__device__ __forceinline__ void qk__wg_store_held(const float (&v)[64], int j0, int j1, int row0, int col0, int rl, int t, bool inner,
                                                  int m, int nn, OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout)
{
#pragma unroll
    for (int j = 0; j < 16; ++j)
        if (j >= j0 && j < j1)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                qk__wg_put<OutT>(v[j * 4 + h * 2], v[j * 4 + h * 2 + 1], row0 + rl + h * 8, col0 + j * 8 + 2 * t, inner, m, nn, out, ld, mout, 0, 1);
}

/* One FP16 stage of a warpgroup's products, committed as one group: its warps' A rows (arow: this
   lane's ldmatrix row, ahi: its 16-byte half) from the swizzled stage at As, rotated in
   registers for the Im product (complex), times the 128 B rows at Bs through descriptors. */
template <bool CPLX>
__device__ __forceinline__ void qk__wg16_stage(uint32_t As, uint32_t Bs, int arow, int ahi, float (&ar)[64], float (&ai)[CPLX ? 64 : 1])
{
    uint32_t fa[4][4], fr[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const int ch = 2 * kk + ahi;
        qk__ldsm4(As + qk__sw128(arow, ch), fa[kk]);
        if constexpr (CPLX) {
#pragma unroll
            for (int q = 0; q < 4; ++q) fr[kk][q] = qk__rot16(fa[kk][q]);
        }
    }
    qk__wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const uint64_t bd = qk__wg_desc(Bs + kk * 32);
        qk__wg_m64n128k16(ar, fa[kk], bd);
        if constexpr (CPLX) qk__wg_m64n128k16(ai, fr[kk], bd);
    }
    qk__wg_commit();
}

/* FP16: a 128 x 128 tile of K per block (two warpgroups), NS stages of 32 KB. A, B: operand
   words, ldw per row, nkt 32-word stages; the other arguments as qk__k_tcgram's. */
template <bool CPLX, typename OutT, int NS>
__global__ void __launch_bounds__(256, 1)
qk__k_wg16(const uint32_t *__restrict__ A, const uint32_t *__restrict__ B, int64_t ldw, int nkt, int m, int nn, float inv_s2,
           OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 128, BN = 128, TA = BM * 128, ST = TA + BN * 128, P = NS - 1;
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return;
    const uint32_t sbase = qk__wg_smem1024();
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    auto load = [&](int kt) {   /* A's 128 rows, then B's */
        const uint32_t st = sbase + (kt % NS) * ST;
        qk__wg_each_chunk<8>(tid, [&](int r, int cc) {
            const bool isb = r >= BM;
            const int lr = isb ? r - BM : r, grow = (isb ? col0 : row0) + lr;
            const bool ok = grow < (isb ? nn : m);
            const uint32_t *gp = (isb ? B : A) + (ok ? (int64_t)grow * ldw : 0) + (int64_t)kt * 32 + cc * 4;
            qk__cp16s(st + (isb ? TA : 0) + qk__sw128(lr, cc), gp, ok ? 16 : 0);
        });
    };
    float ar[64], ai[CPLX ? 64 : 1];
    qk__wg_zero(ar);
    qk__wg_zero(ai);
    qk__wg_prime<P>(load, nkt);
    const int arow = wg * 64 + warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), ahi = lane >> 4;
    for (int kt = 0; kt < nkt; ++kt) {
        qk__wg_wait0();
        qk__wg_advance<P>(load, kt, nkt);
        const uint32_t As = sbase + (kt % NS) * ST, Bs = As + TA;
        qk__wg16_stage<CPLX>(As, Bs, arow, ahi, ar, ai);
    }
    qk__wg_wait0();
    qk__wg_pin(ar);
    if constexpr (CPLX) qk__wg_pin(ai);
    const bool inner = vec && row0 + BM <= m && col0 + BN <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM);
    qk__wg_store<OutT, 16, CPLX, false>(ar, ai, nullptr, nullptr, inv_s2, row0, col0, wg * 64 + warp * 16 + (lane >> 2), lane & 3, inner, m, nn,
                                        out, ld, mout, doff, tri);
#endif
}

/* FP32X3: a 128 x 64 tile of K per block (two warpgroups), NS stages of 48 KB (A hi, A lo, B hi,
   B lo). lo_off: words from a row's hi part to its lo part. */
template <bool CPLX, typename OutT, int NS>
__global__ void __launch_bounds__(256, 1)
qk__k_wg3(const uint32_t *__restrict__ A, const uint32_t *__restrict__ B, int64_t ldw, int64_t lo_off, int nkt, int m, int nn,
          float inv_s2, OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 128, BN = 64, TA = BM * 128, TB = BN * 128, ST = 2 * TA + 2 * TB, P = NS - 1, NA = CPLX ? 32 : 1;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return;
    const uint32_t sbase = qk__wg_smem1024();
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    auto load = [&](int kt) {   /* A hi, A lo (128 rows each), B hi, B lo (64) */
        const uint32_t st = sbase + (kt % NS) * ST;
        qk__wg_each_chunk<12>(tid, [&](int r, int cc) {
            const bool isb = r >= 2 * BM;
            const int rr = isb ? r - 2 * BM : r, part = isb ? rr / BN : rr / BM, lr = isb ? rr % BN : rr % BM;
            const int grow = (isb ? col0 : row0) + lr;
            const bool ok = grow < (isb ? nn : m);
            const uint32_t *gp = (isb ? B : A) + (ok ? (int64_t)grow * ldw : 0) + part * lo_off + (int64_t)kt * 32 + cc * 4;
            qk__cp16s(st + (isb ? 2 * TA + part * TB : part * TA) + qk__sw128(lr, cc), gp, ok ? 16 : 0);
        });
    };
    float ar[32], ai[NA], tr[32], ti[NA];
    qk__wg_zero(ar);
    qk__wg_zero(tr);
    qk__wg_zero(ai);
    qk__wg_zero(ti);
    qk__wg_prime<P>(load, nkt);
    const int arow = wg * 64 + warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), ahi = lane >> 4;
    for (int kt = 0; kt < nkt; ++kt) {
        qk__wg_wait0();
        if (kt > 0) {   /* the last stage's sums into the round-to-nearest totals */
            qk__wg_pin(ar);
            if constexpr (CPLX) qk__wg_pin(ai);
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                tr[i] += ar[i];
                ar[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < NA; ++i) {
                ti[i] += ai[i];
                ai[i] = 0.0f;
            }
        }
        qk__wg_advance<P>(load, kt, nkt);
        const uint32_t As = sbase + (kt % NS) * ST, Bs = As + 2 * TA;
        uint32_t fh[4][4], fl[4][4], rh[4][4], rl[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const int ch = 2 * kk + ahi;
            const uint32_t off = qk__sw128(arow, ch);
            qk__ldsm4(As + off, fh[kk]);
            qk__ldsm4(As + TA + off, fl[kk]);
            if constexpr (CPLX) {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    rh[kk][q] = qk__rot16(fh[kk][q]);
                    rl[kk][q] = qk__rot16(fl[kk][q]);
                }
            }
        }
        qk__wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint64_t bh = qk__wg_desc(Bs + kk * 32), bl = qk__wg_desc(Bs + TB + kk * 32);
            qk__wg_m64n64k16(ar, fl[kk], bh);
            qk__wg_m64n64k16(ar, fh[kk], bl);
            qk__wg_m64n64k16(ar, fh[kk], bh);
            if constexpr (CPLX) {
                qk__wg_m64n64k16(ai, rl[kk], bh);
                qk__wg_m64n64k16(ai, rh[kk], bl);
                qk__wg_m64n64k16(ai, rh[kk], bh);
            }
        }
        qk__wg_commit();
    }
    qk__wg_wait0();
    qk__wg_pin(ar);
    if constexpr (CPLX) qk__wg_pin(ai);
    const bool inner = vec && row0 + BM <= m && col0 + BN <= nn && (!tri || (int64_t)col0 + doff >= row0 + BM);
    qk__wg_store<OutT, 8, CPLX, true>(ar, ai, tr, ti, inv_s2, row0, col0, wg * 64 + warp * 16 + (lane >> 2), lane & 3, inner, m, nn, out, ld,
                                      mout, doff, tri);
#endif
}

/* FP16, persistent, for the triangle of K(X,X) with short states (nkt <= 8 stages: at most 256
   complex amplitudes, 8 qubits): a block takes work items, a panel of 128 rows p and up to C
   column tiles j >= p of it, keeps the panel's A rows (every stage) resident in shared memory and
   streams the B tiles through an NS-slot ring that runs ahead across the item's tiles, so the
   next tile's first stages load under the current tile's epilogue and the A rows are read once
   per item instead of once per tile. Tm x Tn: tiles of K's rows and columns (m, nn as
   qk__k_wg16's, tri and doff 0).
   Loads go through the tensor memory accelerator: one thread issues each stage's load as one
   128-row x 32-word box (cp.async.bulk.tensor, the 128-byte swizzle, which is qk__sw128's
   layout; rows past the last read as zeros) completing on the slot's "full" mbarrier, and each
   warpgroup, once its products on a slot are done, arrives on the slot's "empty" mbarrier, which
   the loading thread waits for before it refills the slot. No stage needs the whole block at a
   barrier; the block meets only when an item's panel is replaced. It replaced the same kernel fed
   by cp.async with a block barrier per stage, whose first stall the barriers were; K is bit for
   bit the same (docs/benchmarks.md, "The fp16 kernel fed by TMA"). mp: maps of A (m rows of ldw
   words) and B (nn rows). */
struct qk__wg_maps {
    CUtensorMap a, b;
};
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void qk__mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void qk__mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qk__mbar_arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
__device__ __forceinline__ void qk__mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nQK_MBAR_WAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra QK_MBAR_WAIT_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void qk__tma_load2d(uint32_t dst, const CUtensorMap *map, int x, int y, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(map), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}
#endif
template <bool CPLX, typename OutT, int NS>
__global__ void __launch_bounds__(256, 1)
qk__k_wg16t(const __grid_constant__ qk__wg_maps mp, int nkt, int m, int nn, float inv_s2, OutT *__restrict__ out, int64_t ld,
            OutT *__restrict__ mout, int vec, int C, int mc)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 128, TS = BM * 128, P = NS - 2;   /* loads run P stages ahead: a refill waits for the stage two back */
    const uint32_t sbase = qk__wg_smem1024(), ring = sbase + nkt * TS, bars = ring + NS * TS;
    const uint32_t afull = bars + 2 * NS * 8;   /* full[s] at bars + 8 s, empty[s] at bars + 8 (NS + s) */
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int arow = wg * 64 + warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), ahi = lane >> 4;
    const int Tm = (m + BM - 1) / BM, Tn = (nn + BM - 1) / BM;
    if (tid == 0) {
        for (int s = 0; s < NS; ++s) {
            qk__mbar_init(bars + 8 * s, 1);
            qk__mbar_init(bars + 8 * (NS + s), 2);   /* one arrival per warpgroup */
        }
        qk__mbar_init(afull, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   /* the inits, visible to the copy engine */
    }
    __syncthreads();
    float ar[64], ai[CPLX ? 64 : 1];
    qk__wg_zero(ar);
    qk__wg_zero(ai);
    uint32_t u_load = 0, u_use = 0, n_items = 0;   /* loads issued (thread 0), stages consumed, panels loaded */
    int64_t items = 0;
    for (int p = 0; p < Tm; ++p) items += (Tn - p + C - 1) / C;
    for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
        int p = 0;
        int64_t rem = it;
        while (rem >= (Tn - p + C - 1) / C) {
            rem -= (Tn - p + C - 1) / C;
            ++p;
        }
        const int j0 = p + (int)rem * C, nt = min(C, Tn - j0), row0 = p * BM, tot = nt * nkt;
        __syncthreads();   /* every warpgroup is done with the last item's panel */
        auto produce = [&](int gs) {   /* thread 0: stage gs's B box into its ring slot */
            const uint32_t slot = u_load % NS, full = bars + 8 * slot, empty = bars + 8 * (NS + slot);
            if (u_load >= (uint32_t)NS) qk__mbar_wait(empty, (u_load / NS - 1) & 1);
            qk__mbar_expect_tx(full, TS);
            qk__tma_load2d(ring + slot * TS, &mp.b, (gs % nkt) * 32, (j0 + gs / nkt) * BM, full);
            ++u_load;
        };
        if (tid == 0) {
            qk__fence_async_smem();   /* the panel's generic-proxy reads (ldmatrix) before the async-proxy writes */
            qk__mbar_expect_tx(afull, (uint32_t)(nkt * TS));
            for (int kt = 0; kt < nkt; ++kt) qk__tma_load2d(sbase + kt * TS, &mp.a, kt * 32, row0, afull);
            for (int gs = 0; gs < P && gs < tot; ++gs) produce(gs);
        }
        __syncwarp();   /* warp 0 converged again before the warpgroup's aligned instructions */
        qk__mbar_wait(afull, n_items & 1);
        ++n_items;
        for (int gs = 0; gs < tot; ++gs) {
            const int kt = gs % nkt;
            if (tid == 0 && gs + P < tot) produce(gs + P);
            __syncwarp();
            const uint32_t slot = u_use % NS;
            qk__mbar_wait(bars + 8 * slot, (u_use / NS) & 1);
            qk__wg16_stage<CPLX>(sbase + kt * TS, ring + slot * TS, arow, ahi, ar, ai);
            qk__wg_wait0();
            if ((tid & 127) == 0) qk__mbar_arrive(bars + 8 * (NS + slot));   /* this warpgroup is done with the slot */
            __syncwarp();
            ++u_use;
            if (kt == nkt - 1) {
                qk__wg_pin(ar);
                if constexpr (CPLX) qk__wg_pin(ai);
                const int col0 = (j0 + gs / nkt) * BM;
                /* mirror of columns < mc only (a band's rows: qk_cuda_io.band_rows); a tile across mc stores entry by entry */
                const bool inner = vec && row0 + BM <= m && col0 + BM <= nn && col0 >= row0 + BM && (col0 + BM <= mc || col0 >= mc);
                qk__wg_store<OutT, 16, CPLX, false>(ar, ai, nullptr, nullptr, inv_s2, row0, col0, wg * 64 + warp * 16 + (lane >> 2), lane & 3,
                                                    inner, m, nn, out, ld, col0 < mc ? mout : nullptr, 0, 1, mc);
                qk__wg_zero(ar);
                qk__wg_zero(ai);
            }
        }
    }
#endif
}

/* FP32X3, persistent and fed by the tensor memory accelerator (docs/benchmarks.md, 'fp32x3 through
   TMA, measured'), for
   the triangle of K(X,X) (tri) or a rectangle (K(X,Y), tri 0) with short states (1 <= nkt <= 8
   stages: from 2 qubits, the words past a state's end zeros). A work item is a panel of 64 rows (rows 64 p ..) and up to QK__WG_ITEM column tiles
   of 128, the first starting at column 64 p (the diagonal) in a triangle, at 0 in a rectangle
   (qk__wg3t_col0); a band's mirror stops at column mc (qk_cuda_io.band_rows); a tile's 128 columns are two 64 x 64 halves, one per warpgroup, each the
   m64n64k16 products of qk__k_wg3's warpgroups in the same order (per stage lo*hi + hi*lo + hi*hi
   per k-step, the stage's sums into the round-to-nearest totals), so every entry of K is
   qk__k_wg3's bit for bit; the block's tile is 64 x 128 instead of 128 x 64. Shared memory: the
   panel's A rows (hi and lo, every stage: nkt x 16 KB) stay resident for the item, and the tiles'
   B rows (hi and lo, 128 rows: 32 KB a stage) run through an NS-slot ring.

   Two consumer warpgroups and a producer warpgroup (setmaxnreg: 232 registers a consumer thread,
   40 a producer's; a ninth warp alone would cap every thread at 168). setmaxnreg.inc takes its
   registers from the CTA's pool, which holds only what the block was launched with (384 x 168)
   and what .dec released: the producer's 128 x (168 - 40) = 16384 are exactly the consumers'
   256 x (232 - 168). (240 / 32 asked for 18432 of 17408: the consumers waited forever.)
   Thread 256 issues every load, as tensor-map boxes: A 64 rows x 32 words, B 128 x 32, the 128-byte swizzle, which is qk__sw128's
   layout). Each load completes on an mbarrier: full[slot] for the ring, afull[k] for the panel's
   stage k. Each consumer warp, once its warpgroup's products on a stage are done
   (wgmma.wait_group 0), fences its ldmatrix reads against the async proxy and arrives on the
   slot's empty mbarrier (8 arrivals), and in an item's last tile also on pempty[k]. The producer
   refills a slot once all 8 warps released it, so the ring runs NS stages ahead across tiles and
   items, and loads the next item's panel stage k as soon as the current item's last tile is done
   with it (just before the ring load that waits for the same release). No stage, tile or item
   needs the block at a barrier; the two warpgroups may drift apart by up to the ring's depth
   (one's epilogue under the other's products). The producer waits only for releases, which the
   consumers give after loads it has already issued: no deadlock. mp: maps of A (m rows, 64-row
   boxes) and B (nn rows, 128-row boxes) over ldw words a row; ldp: words from a row's hi part to
   its lo part; items: the number of work items (qk__wg3t_items). */
#define QK__WG3T_BM 64
#define QK__WG3T_BN 128
/* the first column of panel p: its diagonal (64 p) in a triangle, 0 in a rectangle */
__host__ __device__ __forceinline__ int64_t qk__wg3t_col0(int64_t p, int tri) { return tri ? QK__WG3T_BM * p : 0; }
/* column tiles of panel p: from its first column to nn */
__host__ __device__ __forceinline__ int64_t qk__wg3t_tiles(int64_t p, int64_t nn, int tri)
{
    return (nn - qk__wg3t_col0(p, tri) + QK__WG3T_BN - 1) / QK__WG3T_BN;
}
static int64_t qk__wg3t_items(int64_t m, int64_t nn, int tri)
{
    int64_t items = 0;
    for (int64_t p = 0; p * QK__WG3T_BM < m; ++p) items += (qk__wg3t_tiles(p, nn, tri) + QK__WG_ITEM - 1) / QK__WG_ITEM;
    return items;
}
/* A walk over the work items in increasing order: item it's panel p, first tile j0 and tile
   count nt (base: the first item of panel p; tri: a triangle's panels, else a rectangle's). */
struct qk__wg3t_walk {
    int base, p, tri;
};
__device__ __forceinline__ void qk__wg3t_seek(qk__wg3t_walk &w, int it, int nn, int &j0, int &nt)
{
    for (;;) {
        const int tl = (int)qk__wg3t_tiles(w.p, nn, w.tri), k = (tl + QK__WG_ITEM - 1) / QK__WG_ITEM;
        if (it < w.base + k) {
            j0 = (it - w.base) * QK__WG_ITEM;
            nt = min(QK__WG_ITEM, tl - j0);
            return;
        }
        w.base += k;
        ++w.p;
    }
}
/* A position in the block's sequence of stages: item it (the block's ik-th), tile t of nt from
   j0, k-stage kt; next() steps to the following stage (it >= items: past the last). */
struct qk__wg3t_pos {
    qk__wg3t_walk w;
    int it, ik, j0, nt, t, kt;
    __device__ __forceinline__ void start(int it0, int nn, int tri)
    {
        w.base = w.p = 0;
        w.tri = tri;
        it = it0;
        ik = t = kt = 0;
        qk__wg3t_seek(w, it, nn, j0, nt);
    }
    __device__ __forceinline__ void next(int nkt, int G, int items, int nn)
    {
        if (++kt < nkt) return;
        kt = 0;
        if (++t < nt) return;
        t = 0;
        it += G;
        ++ik;
        if (it < items) qk__wg3t_seek(w, it, nn, j0, nt);
    }
};
template <bool CPLX, typename OutT, int NS>
__global__ void __launch_bounds__(384, 1)
qk__k_wg3t(const __grid_constant__ qk__wg_maps mp, int ldp, int nkt, int m, int nn, int items, float inv_s2, OutT *__restrict__ out,
           int64_t ld, OutT *__restrict__ mout, int vec, int mc, int tri)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = QK__WG3T_BM, BN = QK__WG3T_BN, TP = BM * 128, TR = BN * 128, NA = CPLX ? 32 : 1;
    const uint32_t sbase = qk__wg_smem1024(), ring = sbase + nkt * 2 * TP, bars = ring + NS * 2 * TR;
    /* full[s] at bars + 8 s, empty[s] at bars + 8 (NS + s), afull[k] at bars + 8 (2 NS + k), pempty[k] at bars + 8 (2 NS + 8 + k) */
    const uint32_t b_full = bars, b_empty = bars + 8 * NS, b_afull = bars + 16 * NS, b_pempty = bars + 16 * NS + 64;
    const int tid = threadIdx.x, G = gridDim.x;
    if (tid == 0) {
        for (int s = 0; s < NS; ++s) {
            qk__mbar_init(b_full + 8 * s, 1);
            qk__mbar_init(b_empty + 8 * s, 8);   /* one arrival per consumer warp */
        }
        for (int k = 0; k < nkt; ++k) {
            qk__mbar_init(b_afull + 8 * k, 1);
            qk__mbar_init(b_pempty + 8 * k, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   /* the inits, visible to the copy engine */
    }
    __syncthreads();   /* the block's only barrier */
    if (tid >= 256) {   /* the producer warpgroup: its registers to the consumers, one thread loads */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid != 256) return;
        auto load_panel = [&](int kt, int p) {   /* panel p's stage kt (hi, lo) into its place, on afull[kt] */
            const uint32_t dst = sbase + kt * 2 * TP, bar = b_afull + 8 * kt;
            qk__mbar_expect_tx(bar, 2 * TP);   /* whole boxes: rows past m count too (zeros) */
            qk__tma_load2d(dst, &mp.a, kt * 32, p * BM, bar);
            qk__tma_load2d(dst + TP, &mp.a, ldp + kt * 32, p * BM, bar);
        };
        qk__wg3t_pos lp, rl;   /* the stage to load (s) and the stage whose release it waits for (s - NS) */
        lp.start(blockIdx.x, nn, tri);
        rl = lp;
        qk__wg3t_walk nw = lp.w;   /* the next item's panel */
        for (int kt = 0; kt < nkt; ++kt) load_panel(kt, lp.w.p);
        for (uint32_t s = 0;; ++s) {
            if (s >= (uint32_t)NS) {
                if (rl.it >= items) break;   /* every load issued, every panel too */
                if (rl.t == rl.nt - 1 && rl.it + G < items) {   /* the item's last tile is done with panel stage kt: the next item's */
                    int j0, nt;
                    qk__wg3t_seek(nw, rl.it + G, nn, j0, nt);
                    qk__mbar_wait(b_pempty + 8 * rl.kt, rl.ik & 1);
                    load_panel(rl.kt, nw.p);
                }
                rl.next(nkt, G, items, nn);
            }
            if (lp.it < items) {
                const uint32_t slot = s % NS, full = b_full + 8 * slot;
                if (s >= (uint32_t)NS) qk__mbar_wait(b_empty + 8 * slot, (s / NS - 1) & 1);
                const int y = (int)qk__wg3t_col0(lp.w.p, tri) + (lp.j0 + lp.t) * BN, x = lp.kt * 32;
                qk__mbar_expect_tx(full, 2 * TR);
                qk__tma_load2d(ring + slot * 2 * TR, &mp.b, x, y, full);
                qk__tma_load2d(ring + slot * 2 * TR + TR, &mp.b, ldp + x, y, full);
                lp.next(nkt, G, items, nn);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");   /* the producer's released 16384: see above */
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int arow = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), ahi = lane >> 4;
    float ar[32], ai[NA], tr[32], ti[NA];
    qk__wg_zero(ar);
    qk__wg_zero(ai);
    qk__wg_zero(tr);
    qk__wg_zero(ti);
    qk__wg3t_walk w = {0, 0, tri};
    uint32_t u = 0, ik = 0;   /* stages consumed, items begun */
    for (int it = blockIdx.x; it < items; it += G, ++ik) {
        int j0, nt;
        qk__wg3t_seek(w, it, nn, j0, nt);
        const int row0 = w.p * BM;
        for (int t = 0; t < nt; ++t) {
            const int c0 = (int)qk__wg3t_col0(w.p, tri) + (j0 + t) * BN + wg * 64;   /* this warpgroup's 64 columns (past nn: zeros, nothing stored) */
            for (int kt = 0; kt < nkt; ++kt) {
                const uint32_t slot = u % NS;
                if (t == 0) qk__mbar_wait(b_afull + 8 * kt, ik & 1);
                qk__mbar_wait(b_full + 8 * slot, (u / NS) & 1);
                __syncwarp();   /* converged before the aligned instructions */
                {
                    const uint32_t As = sbase + kt * 2 * TP, Bs = ring + slot * 2 * TR + wg * 64 * 128;
                    uint32_t fh[4][4], fl[4][4], rh[4][4], rl[4][4];
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) {
                        const uint32_t off = qk__sw128(arow, 2 * kk + ahi);
                        qk__ldsm4(As + off, fh[kk]);
                        qk__ldsm4(As + TP + off, fl[kk]);
                        if constexpr (CPLX) {
#pragma unroll
                            for (int q = 0; q < 4; ++q) {
                                rh[kk][q] = qk__rot16(fh[kk][q]);
                                rl[kk][q] = qk__rot16(fl[kk][q]);
                            }
                        }
                    }
                    qk__wg_pin(ar);   /* the zeroed sums as registers before the fence (not constants moved in between the products) */
                    if constexpr (CPLX) qk__wg_pin(ai);
                    qk__wg_fence();
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) {
                        const uint64_t bh = qk__wg_desc(Bs + kk * 32), bl = qk__wg_desc(Bs + TR + kk * 32);
                        qk__wg_m64n64k16(ar, fl[kk], bh);
                        qk__wg_m64n64k16(ar, fh[kk], bl);
                        qk__wg_m64n64k16(ar, fh[kk], bh);
                        if constexpr (CPLX) {
                            qk__wg_m64n64k16(ai, rl[kk], bh);
                            qk__wg_m64n64k16(ai, rh[kk], bl);
                            qk__wg_m64n64k16(ai, rh[kk], bh);
                        }
                    }
                    qk__wg_commit();
                    qk__wg_wait0();
                }
                qk__wg_pin(ar);
                if constexpr (CPLX) qk__wg_pin(ai);
                /* release the stage: this warp's ldmatrix reads ordered before the copy engine's next writes */
                qk__fence_async_smem();
                __syncwarp();
                if (lane == 0) {
                    qk__mbar_arrive(b_empty + 8 * slot);
                    if (t == nt - 1) qk__mbar_arrive(b_pempty + 8 * kt);
                }
                __syncwarp();
                ++u;
                if (kt == nkt - 1) {   /* the tile's epilogue: the totals and the last stage's sums */
                    int r0e = row0, c0e = c0;
                    asm volatile("" : "+r"(r0e), "+r"(c0e));   /* the stores' addresses computed here, not hoisted and kept over the stages */
                    /* mirror of columns < mc only (a band's rows); a half across mc stores entry by entry */
                    const bool inner = vec && r0e + BM <= m && c0e + 64 <= nn && (!tri || c0e >= r0e + BM) && (c0e + 64 <= mc || c0e >= mc);
                    qk__wg_store<OutT, 8, CPLX, true>(ar, ai, tr, ti, inv_s2, r0e, c0e, warp * 16 + (lane >> 2), lane & 3, inner, m, nn, out, ld,
                                                      c0e < mc ? mout : nullptr, 0, tri, mc);
                    qk__wg_zero(tr);
                    qk__wg_zero(ti);
                    qk__wg_zero(ar);
                    qk__wg_zero(ai);
                } else {   /* the stage's sums into the round-to-nearest totals */
#pragma unroll
                    for (int i = 0; i < 32; ++i) {
                        tr[i] += ar[i];
                        ar[i] = 0.0f;
                    }
#pragma unroll
                    for (int i = 0; i < NA; ++i) {
                        ti[i] += ai[i];
                        ai[i] = 0.0f;
                    }
                }
            }
        }
    }
#endif
}

/* cuTensorMapEncodeTiled from the driver the runtime uses (no link to libcuda); null where the
   driver has none. Looked up once. */
typedef CUresult (*qk__pfn_encode_tiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *, const cuuint64_t *,
                                         const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                         CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static qk__pfn_encode_tiled qk__tma_encoder()
{
    static std::once_flag once;
    static qk__pfn_encode_tiled fn = nullptr;
    std::call_once(once, [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (qk__pfn_encode_tiled)p;
        cudaGetLastError();
    });
    return fn;
}
/* The map of rows x ldw 32-bit operand words at base: 32-word x box_rows-row boxes (128: a stage
   of qk__k_wg16t) in the 128-byte swizzle, rows past the last read as zeros. */
static bool qk__wg_map(qk__pfn_encode_tiled enc, CUtensorMap *map, const uint32_t *base, int64_t rows, int64_t ldw, int box_rows = 128)
{
    const cuuint64_t dims[2] = {(cuuint64_t)ldw, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ldw * 4};
    const cuuint32_t box[2] = {32, (cuuint32_t)box_rows}, step[2] = {1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, (void *)base, dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Launchers (the arguments of qk__launch_tcf_cfg; ldp: words per row and part, a multiple of 32).
   FP16: the persistent kernel for a triangle of short states (qk__k_wg16t), else the triangular
   grid of K(X,X) (qk__tri_grid) where the whole block is one triangle; FP32X3's tiles are not
   square and skip the ones below the diagonal. */
template <bool SPLIT, bool CPLX, typename OutT>
static qk_result qk__launch_wg(const uint32_t *A, const uint32_t *B, int64_t ldw, int64_t ldp, int64_t m, int64_t nn, float inv_s2, OutT *out,
                               int64_t ld, OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E, int64_t mcols = INT64_MAX)
{
    int dev = 0;
    QK_CK(cudaGetDevice(&dev));
    if (!qk__wgmma_ok(dev))
        return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "fused tensor-core configuration 4 (wgmma) needs a compute capability 9.0 device "
                            "and a build for sm_90a (-Dgpu_arch=90); this plan named it where it cannot run");
    if (ldp % 32) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "fused tensor-core configuration 4: operand rows must be whole 32-word stages");
    constexpr int BM = 128, BN = SPLIT ? 64 : 128, NS = SPLIT ? 3 : 4;
    const size_t smem = (size_t)NS * (SPLIT ? 49152 : 32768) + 1024;
    const int nkt = (int)(ldp / 32);
    if constexpr (!SPLIT) {
        /* the triangle of K(X,X) in one launch with short states: the persistent kernel, work items
           of QK__WG_ITEM column tiles, one block per SM */
        if (tri && doff == 0 && m <= (int64_t)65535 * BM && nn >= m && nkt <= 8) {
            constexpr int C = QK__WG_ITEM;
            int dev = 0, sms = 0;
            QK_CK(cudaGetDevice(&dev));
            QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
            const int64_t Tm = (m + BM - 1) / BM, Tn = (nn + BM - 1) / BM;
            int64_t items = 0;
            for (int64_t p = 0; p < Tm; ++p) items += (Tn - p + C - 1) / C;
            const qk__pfn_encode_tiled enc = qk__tma_encoder();
            qk__wg_maps mp;
            if (enc && qk__wg_map(enc, &mp.a, A, m, ldw) && qk__wg_map(enc, &mp.b, B, nn, ldw)) {
                const size_t tsmem = (size_t)(nkt + 5) * 16384 + 1024 + 128;   /* panel, 5 ring slots, alignment, mbarriers */
                QK_CK(cudaFuncSetAttribute(qk__k_wg16t<CPLX, OutT, 5>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tsmem));
                qk__k_wg16t<CPLX, OutT, 5><<<(unsigned)std::min<int64_t>(items, sms), 256, tsmem, st>>>(mp, nkt, (int)m, (int)nn, inv_s2, out, ld,
                                                                                                     mout, qk__vec_ok(out, mout, ld), C,
                                                                                                     (int)std::min(mcols, nn));
                QK_LAUNCH_CK("qk__k_wg16t");
                return QK_OK;
            }
            /* no tensor map (a driver without the encoder): the triangular grid below */
        }
    }
    if constexpr (SPLIT) {
        /* the persistent TMA-fed FP32X3 kernel for short states (1 to 8 stages): the triangle of
           K(X,X) (from its diagonal: doff 0) or a rectangle (tri 0: every entry); qk__k_wg3
           elsewhere and where the maps cannot be encoded */
        const int wt = tri ? 1 : 0;
        if ((!tri || (doff == 0 && nn >= m)) && m < ((int64_t)1 << 30) && nn < ((int64_t)1 << 30) && nkt >= 1 && nkt <= 8 &&
            ldp <= 65536 && qk__wg3t_items(m, nn, wt) <= INT_MAX / 2) {
            const qk__pfn_encode_tiled enc = qk__tma_encoder();
            qk__wg_maps mp;
            if (enc && qk__wg_map(enc, &mp.a, A, m, ldw, QK__WG3T_BM) && qk__wg_map(enc, &mp.b, B, nn, ldw, QK__WG3T_BN)) {
                constexpr int TNS = 3;   /* 8 stages: 128 KB of panel + 3 x 32 KB of ring */
                int sms = 0;
                QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
                const int64_t items = qk__wg3t_items(m, nn, wt);
                const size_t tsmem = (size_t)nkt * 16384 + (size_t)TNS * 32768 + 1024 + 256;
                QK_CK(cudaFuncSetAttribute(qk__k_wg3t<CPLX, OutT, TNS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tsmem));
                qk__k_wg3t<CPLX, OutT, TNS><<<(unsigned)std::min<int64_t>(items, sms), 384, tsmem, st>>>(mp, (int)ldp, nkt, (int)m, (int)nn, (int)items, inv_s2,
                                                                                                     out, ld, mout, qk__vec_ok(out, mout, ld),
                                                                                                     (int)std::min(mcols, nn), wt);
                QK_LAUNCH_CK("qk__k_wg3t");
                return QK_OK;
            }
        }
    }
    if (mout && mcols < nn) {
        /* the grid kernels mirror every column: the columns from mcols on as a second call without one */
        const int64_t c = std::max<int64_t>(0, mcols);
        if (c > 0) QK_TRY((qk__launch_wg<SPLIT, CPLX, OutT>(A, B, ldw, ldp, m, c, inv_s2, out, ld, mout, doff, tri, st, E)));
        return qk__launch_wg<SPLIT, CPLX, OutT>(A, B + c * ldw, ldw, ldp, m, nn - c, inv_s2, out + c, ld, nullptr, doff + c, tri, st, E);
    }
    if constexpr (SPLIT) {
        QK_CK(cudaFuncSetAttribute(qk__k_wg3<CPLX, OutT, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    else QK_CK(cudaFuncSetAttribute(qk__k_wg16<CPLX, OutT, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t r0 = 0; r0 < m; r0 += (int64_t)65535 * BM) { /* grid.y limit */
        const int64_t mm = std::min<int64_t>(m - r0, (int64_t)65535 * BM);
        dim3 grid((unsigned)((nn + BN - 1) / BN), (unsigned)((mm + BM - 1) / BM));
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        if constexpr (SPLIT) {
            qk__k_wg3<CPLX, OutT, NS><<<grid, 256, smem, st>>>(A + r0 * ldw, B, ldw, ldp, nkt, (int)mm, (int)nn, inv_s2, o, ld, mo, doff - r0, tri,
                                                                qk__vec_ok(o, mo, ld));
            QK_LAUNCH_CK("qk__k_wg3");
        } else {
            int tg = 0;
            if (tri && doff == 0 && r0 == 0 && mm == m && nn >= mm) {
                const int64_t Tx = grid.x, Ty = grid.y;
                tg = (int)Tx;
                grid = dim3((unsigned)(Ty * Tx - Ty * (Ty - 1) / 2), 1);
            }
            qk__k_wg16<CPLX, OutT, NS><<<grid, 256, smem, st>>>(A + r0 * ldw, B, ldw, nkt, (int)mm, (int)nn, inv_s2, o, ld, mo, doff - r0, tri,
                                                                 qk__vec_ok(o, mo, ld), tg);
            QK_LAUNCH_CK("qk__k_wg16");
        }
    }
    return QK_OK;
}
/* >>tcf ---- the fused tensor-core Gram kernel (mma.sync; plan.engine QK_GPU_TCF_*) ---- */
/* The tensor-core precisions without cuBLAS: one kernel computes a square tile of K with
   mma.sync (m16n8k8 TF32, m16n8k16 FP16, fp32 accumulators in registers), takes |.|^2 in its
   epilogue and writes the tile and its mirror (qk__store_tile), over the triangular tile grid of
   the fp32 fused kernel (qk__tile_of): no Re/Im planes in memory, 4 bytes of K per pair written
   once, half the tiles of K(X,X). At 8 qubits the cuBLAS engines spend most of their time
   writing and re-reading the planes (docs/precision.md: 162 Gpairs/s TF32 at zz 8 q, n=32768,
   against ~350 for a kernel that writes K only).

   Operands. A conversion pass (qk__k_tcf_operand) writes every state once as 32-bit words:
   TF32 the float rounded to TF32 (nearest, as the cuBLAS engine); FP16 two halves of s * x
   (s = 2^floor(q/2), as the cuBLAS engine, undone exactly in the epilogue); FP32X3 a row of hi
   words then a row of lo words (hi = fp16(s x), lo = fp16(s x - hi)). Rows are zero-padded to
   a whole number of k-stages (KW words), so the kernel has no k tail.

   The complex product without planes. States stay interleaved (re, im). The k index of an MMA
   is free to be any permutation of the physical words as long as A and B agree, and the one
   used here gives each thread the (re, im) of one amplitude in a pair of registers: TF32, the
   two k's t and t+4 of thread t are words 2i and 2i+1; FP16, one register is one amplitude
   (re low half, im high half). So with B the same fragment, one MMA gives
   Re <a|b> = sum a_re b_re + a_im b_im, and with B's pair rotated in registers, (re, im) ->
   (im, -re) (a swap and a sign bit), a second MMA gives Im <a|b> = sum a_re b_im - a_im b_re.
   Real maps take one MMA.

   Fragment layout (PTX ISA, mma.m16n8k8 .tf32 and m16n8k16 .f16; g = lane / 4, t = lane % 4):
     A (16 x k, row-major) a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4)  [k in 32-bit words]
     B (k x 8, column)     b0 (t, g) b1 (t+4, g)
     C (16 x 8)            c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1)
   Shared memory holds rows of KW words per stage (row stride S = KW + 16 words, 16 mod 32: the
   16-byte fragment loads of 8 lanes, rows g and g+1 at 4t words, hit 32 distinct banks). A
   thread's 16-byte load at word 16 * grp + 4t of a row holds k-words (t, t+4) of two k-steps:
   logical k-word t + 4h of step ks is physical word 16 grp + 4t + 2ks + h. qk__tcf_kword()
   states this map; tests/gpu checks it on the host against the layout above (an emulated warp).

   Operands reach shared memory with cp.async (16 bytes, zero-fill past the last row) in a
   three-stage pipeline, one barrier per stage.

   FP32X3: three products lo*hi + hi*lo + hi*hi per k-step into the same accumulators. The
   tensor cores' fp32 accumulation is not round-to-nearest and loses up to an ulp of the partial
   sum per step (docs/precision.md), so every QK__TCF_FLUSH stages the accumulators are added
   into a second set with ordinary (round-to-nearest) fp32 adds and cleared: a partial sum never
   runs longer than a few dozen MMA steps (FP32X3 always runs 64 x 64 tiles: two sets of
   accumulators). */
#define QK__TCF_FLUSH 4
#define QK__TCF_STR2(x) #x
#define QK__TCF_STR(x) QK__TCF_STR2(x)

/* logical k-word (0..7 of k-step ks) -> physical word of a 16-word group, for lane t = lane % 4:
   k-word t + 4h of step ks is word 4t + 2ks + h (see above) */
__host__ __device__ inline int qk__tcf_kword(int t, int ks, int h) { return 4 * t + 2 * ks + h; }

template <int MODE> __device__ __forceinline__ void qk__mma(float *c, const uint32_t *a, const uint32_t *b)
{
    if constexpr (MODE == QK_GPU_TC_TF32) qk__mma_tf32(c, a, b);
    else qk__mma_f16(c, a, b);
}
/* B fragment of Im <a|b>: each amplitude (re, im) -> (im, -re). TF32: the pair is the two
   registers; FP16: the two halves of one register. */
template <int MODE> __device__ __forceinline__ void qk__rot(const uint32_t *b, uint32_t *r)
{
    if constexpr (MODE == QK_GPU_TC_TF32) {
        r[0] = b[1];
        r[1] = b[0] ^ 0x80000000u;
    } else {
        r[0] = __byte_perm(b[0], 0, 0x1032) ^ 0x80000000u;
        r[1] = __byte_perm(b[1], 0, 0x1032) ^ 0x80000000u;
    }
}
__device__ __forceinline__ uint32_t qk__u4(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
/* f(i, j, e) over a warp's MI x NI fragments of 4 accumulators each, unrolled (the accumulator
   arrays' indices stay compile-time constants, so they stay in registers) */
template <int MI, int NI, typename F> __device__ __forceinline__ void qk__each_frag(F &&f)
{
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(i, j, e);
}


/* Operand words of rows of W floats (interleaved complex or real states): ldp words per row and
   part (zero-padded); FP32X3 writes two parts per row (hi, then lo). */
template <int MODE>
__global__ void __launch_bounds__(256)
qk__k_tcf_operand(const float *__restrict__ in, int64_t rows, int64_t W, int64_t ldp, float scale, uint32_t *__restrict__ out)
{
    const int64_t n = rows * ldp;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / ldp, k = e - r * ldp;
        const float *x = in + r * W;
        if constexpr (MODE == QK_GPU_TC_TF32) {
            out[e] = k < W ? __float_as_uint(qk__tf32_rna(x[k])) : 0u;
        } else {
            const float v0 = 2 * k < W ? x[2 * k] * scale : 0.0f, v1 = 2 * k + 1 < W ? x[2 * k + 1] * scale : 0.0f;
            const __half h0 = __float2half_rn(v0), h1 = __float2half_rn(v1);
            const uint32_t hw = (uint32_t)__half_as_ushort(h0) | ((uint32_t)__half_as_ushort(h1) << 16);
            if constexpr (MODE == QK_GPU_TC_FP16) out[e] = hw;
            else {
                const __half l0 = __float2half_rn(v0 - __half2float(h0)), l1 = __float2half_rn(v1 - __half2float(h1));
                out[r * 2 * ldp + k] = hw;
                out[r * 2 * ldp + ldp + k] = (uint32_t)__half_as_ushort(l0) | ((uint32_t)__half_as_ushort(l1) << 16);
            }
        }
    }
}

/* One BM x BM tile of K per block; WGM x WGN warps, each a (BM/WGM) x (BM/WGN) warp tile of
   16 x 8 MMA tiles. A, B: operand words, ldw words per row (FP32X3: hi part, lo part at ldw/2),
   nkt k-stages of KW words (FP32X3: 16 hi + 16 lo). inv_s2 undoes the FP16 scale of <a|b>. */
template <int MODE, bool CPLX, typename OutT, int BM, int WGM, int WGN, int NS>
__global__ void __launch_bounds__(WGM * WGN * 32)
qk__k_tcgram(const uint32_t *__restrict__ A, const uint32_t *__restrict__ B, int64_t ldw, int nkt, int m, int nn,
             float inv_s2, OutT *__restrict__ out, int64_t ld, OutT *__restrict__ mout, int64_t doff, int tri, int vec, int tgrid)
{
    constexpr bool SPLIT = MODE == QK_GPU_TC_FP32X3, FLUSH = SPLIT;
    constexpr int NT = WGM * WGN * 32, BN = BM;
    constexpr int WM = BM / WGM, WN = BN / WGN, MI = WM / 16, NI = WN / 8;
    constexpr int KW = 32, S = KW + 16, CH = KW / 4; /* words per row and stage, row stride, 16-byte chunks */
    constexpr int NG = SPLIT ? 1 : KW / 16;          /* 16-word groups per stage and part */
    constexpr int CI = CPLX ? MI : 1, CJ = CPLX ? NI : 1, FI = FLUSH ? MI : 1, FJ = FLUSH ? NI : 1;
    constexpr int FCI = FLUSH && CPLX ? MI : 1, FCJ = FLUSH && CPLX ? NI : 1;
    static_assert(MI >= 1 && NI >= 1 && WM % 16 == 0 && WN % 8 == 0, "warp tile");
    int tyi, txi;
    qk__tile_of(tgrid, tyi, txi);
    const int row0 = tyi * BM, col0 = txi * BN;
    if (tri && (int64_t)col0 + BN - 1 + doff < row0) return; /* whole tile below the diagonal */
    extern __shared__ __align__(16) unsigned char qk__smem[];
    uint32_t *sm = (uint32_t *)qk__smem; /* [NS][BM + BN][S] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp / WGN, wn = warp % WGN;

    auto load = [&](int kt, int buf) {
        uint32_t *st = sm + buf * (BM + BN) * S;
        for (int c = threadIdx.x; c < (BM + BN) * CH; c += NT) {
            const int r = c / CH, cc = c % CH;
            const bool isb = r >= BM;
            const int grow = (isb ? col0 + r - BM : row0 + r);
            const bool ok = grow < (isb ? nn : m);
            const int64_t off = SPLIT ? (int64_t)(cc / 4) * (ldw / 2) + (int64_t)kt * 16 + (cc % 4) * 4 : (int64_t)kt * KW + cc * 4;
            const uint32_t *gp = (isb ? B : A) + (ok ? (int64_t)grow * ldw : 0) + off;
            qk__cp16(st + r * S + cc * 4, gp, ok ? 16 : 0);
        }
    };

    float accr[MI][NI][4], acci[CI][CJ][4], totr[FI][FJ][4], toti[FCI][FCJ][4];
    qk__each_frag<MI, NI>([&](int i, int j, int e) {
        accr[i][j][e] = 0.0f;
        if constexpr (CPLX) acci[i][j][e] = 0.0f;
        if constexpr (FLUSH) totr[i][j][e] = 0.0f;
        if constexpr (FLUSH && CPLX) toti[i][j][e] = 0.0f;
    });

#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        if (s < nkt) load(s, s);
        qk__cp_commit();
    }
    for (int kt = 0; kt < nkt; ++kt) {
        qk__cp_wait<NS - 2>();
        __syncthreads(); /* stage kt landed for every thread; stage kt-1's buffer is free */
        if (kt + NS - 1 < nkt) load(kt + NS - 1, (kt + NS - 1) % NS);
        qk__cp_commit();
        const uint32_t *As = sm + (kt % NS) * (BM + BN) * S, *Bs = As + BM * S;
#pragma unroll
        for (int gq = 0; gq < NG; ++gq) {
            /* 16-byte loads: [part][row g / g+8] of A, [part] of B; part 1 is FP32X3's lo */
            uint4 af[SPLIT ? 2 : 1][MI][2], bf[SPLIT ? 2 : 1][NI];
#pragma unroll
            for (int p = 0; p < (SPLIT ? 2 : 1); ++p) {
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    const uint32_t *ra = As + (wm * WM + i * 16 + g) * S + p * 16 + gq * 16 + 4 * t;
                    af[p][i][0] = *(const uint4 *)ra;
                    af[p][i][1] = *(const uint4 *)(ra + 8 * S);
                }
#pragma unroll
                for (int j = 0; j < NI; ++j) bf[p][j] = *(const uint4 *)(Bs + (wn * WN + j * 8 + g) * S + p * 16 + gq * 16 + 4 * t);
            }
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                /* products (A part, B part): FP32X3 lo*hi, hi*lo, hi*hi (small first); else hi*hi */
#pragma unroll
                for (int pr = SPLIT ? 0 : 2; pr < 3; ++pr) {
                    const int pa = pr == 0 ? 1 : 0, pb = pr == 1 ? 1 : 0;
                    uint32_t a[MI][4];
#pragma unroll
                    for (int i = 0; i < MI; ++i) {
                        a[i][0] = qk__u4(af[pa][i][0], 2 * ks);     /* (g,   k-word t)   */
                        a[i][1] = qk__u4(af[pa][i][1], 2 * ks);     /* (g+8, k-word t)   */
                        a[i][2] = qk__u4(af[pa][i][0], 2 * ks + 1); /* (g,   k-word t+4) */
                        a[i][3] = qk__u4(af[pa][i][1], 2 * ks + 1); /* (g+8, k-word t+4) */
                    }
#pragma unroll
                    for (int j = 0; j < NI; ++j) {
                        uint32_t b[2] = {qk__u4(bf[pb][j], 2 * ks), qk__u4(bf[pb][j], 2 * ks + 1)};
#pragma unroll
                        for (int i = 0; i < MI; ++i) qk__mma<MODE>(accr[i][j], a[i], b);
                        if constexpr (CPLX) {
                            uint32_t br[2];
                            qk__rot<MODE>(b, br);
#pragma unroll
                            for (int i = 0; i < MI; ++i) qk__mma<MODE>(acci[i][j], a[i], br);
                        }
                    }
                }
            }
        }
        if constexpr (FLUSH) {
            if ((kt + 1) % QK__TCF_FLUSH == 0 || kt + 1 == nkt)
                qk__each_frag<MI, NI>([&](int i, int j, int e) {
                    totr[i % FI][j % FJ][e] += accr[i][j][e];
                    accr[i][j][e] = 0.0f;
                    if constexpr (CPLX) {
                        toti[i % FCI][j % FCJ][e] += acci[i % CI][j % CJ][e];
                        acci[i % CI][j % CJ][e] = 0.0f;
                    }
                });
        }
    }
    qk__cp_wait<0>();
    __syncthreads(); /* every warp is done with the operand buffers */
    OutT *Cs = (OutT *)qk__smem; /* [BM][BN + 1] */
    qk__each_frag<MI, NI>([&](int i, int j, int e) {
        const int r = wm * WM + i * 16 + g + (e >> 1) * 8, c = wn * WN + j * 8 + 2 * t + (e & 1);
        float re, im = 0.0f;
        if constexpr (FLUSH) re = totr[i % FI][j % FJ][e] * inv_s2;
        else re = accr[i][j][e] * inv_s2;
        if constexpr (CPLX) {
            if constexpr (FLUSH) im = toti[i % FCI][j % FCJ][e] * inv_s2;
            else im = acci[i % CI][j % CJ][e] * inv_s2;
        }
        Cs[r * (BN + 1) + c] = (OutT)(re * re + im * im);
    });
    __syncthreads();
    qk__store_tile<OutT, BM, BN, NT>(Cs, row0, col0, m, nn, out, ld, mout, doff, tri, vec);
}

/* Fused tensor-core configurations (qk_plan.kernel_cfg with a TCF engine; 0 runs 1):
     1  128 x 128 tiles, 8 warps of 64 x 32 (the fixed table's at 8 qubits)
     2   64 x  64 tiles, 4 warps of 32 x 32 (the fixed table's up to 7 qubits; FP32X3 always:
        two accumulator sets, 128 registers)
   FP32X3 takes 2 whatever the configuration: its second accumulator set (the flush) and its hi
   and lo fragments would not fit the registers at 64 x 32 per warp (complex: 256 accumulators).
   A third configuration (128 x 128, 8 warps of 32 x 64) was never the fastest at 6 to 16 qubits
   in any mode (docs/benchmarks.md, QK__TCF_MAX_QUBITS) and was removed: each configuration costs
   nvcc a kernel per mode x CPLX x OutT x architecture. */
template <int MODE, bool CPLX, typename OutT, int BM, int WGM, int WGN>
static qk_result qk__launch_tcf_cfg(const uint32_t *A, const uint32_t *B, int64_t ldw, int nkt, int64_t m, int64_t nn, float inv_s2,
                                    OutT *out, int64_t ld, OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E)
{
    constexpr int NS = 3, S = 48, NT = WGM * WGN * 32;
    const size_t smem = std::max((size_t)NS * 2 * BM * S * 4, (size_t)BM * (BM + 1) * sizeof(OutT));
    auto kf = qk__k_tcgram<MODE, CPLX, OutT, BM, WGM, WGN, NS>;
    QK_CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t r0 = 0; r0 < m; r0 += (int64_t)65535 * BM) { /* grid.y limit */
        const int64_t mm = std::min<int64_t>(m - r0, (int64_t)65535 * BM);
        dim3 grid((unsigned)((nn + BM - 1) / BM), (unsigned)((mm + BM - 1) / BM));
        int tg = 0;
        if (tri && doff == 0 && r0 == 0 && mm == m && nn >= mm) {
            const int64_t Tx = grid.x, Ty = grid.y;
            tg = (int)Tx;
            grid = dim3((unsigned)(Ty * Tx - Ty * (Ty - 1) / 2), 1);
        }
        OutT *o = out + r0 * ld, *mo = mout ? mout + r0 : nullptr;
        kf<<<grid, NT, smem, st>>>(A + r0 * ldw, B, ldw, nkt, (int)mm, (int)nn, inv_s2, o, ld, mo, doff - r0, tri,
                                   qk__vec_ok(o, mo, ld), tg);
        QK_LAUNCH_CK("qk__k_tcgram");
    }
    return QK_OK;
}

template <int MODE, bool CPLX, typename OutT>
static qk_result qk__launch_tcf_mode(int cfg, const uint32_t *A, const uint32_t *B, int64_t ldw, int nkt, int64_t m, int64_t nn,
                                     float inv_s2, OutT *out, int64_t ld, OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E,
                                     int64_t mcols = INT64_MAX)
{
    /* mcols: the mirror of the first mcols columns only (a band of K(X,X)'s rows); the wgmma
       launcher keeps it in one launch where its persistent kernels run, the others run the
       columns from mcols on as a second call without a mirror */
    if (mout && mcols < nn && qk__tcf_cfg_runs(MODE == QK_GPU_TC_FP32X3 ? QK_GPU_TCF_FP32X3 : MODE == QK_GPU_TC_FP16 ? QK_GPU_TCF_FP16 : QK_GPU_TCF_TF32, cfg) != 4) {
        const int64_t c = std::max<int64_t>(0, mcols);
        if (c > 0) QK_TRY((qk__launch_tcf_mode<MODE, CPLX, OutT>(cfg, A, B, ldw, nkt, m, c, inv_s2, out, ld, mout, doff, tri, st, E)));
        return qk__launch_tcf_mode<MODE, CPLX, OutT>(cfg, A, B + c * ldw, ldw, nkt, m, nn - c, inv_s2, out + c, ld, nullptr, doff + c, tri, st, E);
    }
    /* FP32X3 (MODE QK_GPU_TC_FP32X3) runs configuration 2 whatever cfg says (two accumulator sets,
       32 x 32 per warp keeps them in registers), or 4, the wgmma kernel. Its other mma.sync
       configurations are not instantiated (if constexpr: they were unreachable, and each cost
       nvcc a kernel per CPLX x OutT x architecture). */
    if constexpr (MODE == QK_GPU_TC_FP32X3) {
        if (qk__tcf_cfg_runs(QK_GPU_TCF_FP32X3, cfg) == 4)   /* wgmma (>>wgmma) */
            return qk__launch_wg<true, CPLX, OutT>(A, B, ldw, ldw / 2, m, nn, inv_s2, out, ld, mout, doff, tri, st, E, mcols);
        return qk__launch_tcf_cfg<MODE, CPLX, OutT, 64, 2, 2>(A, B, ldw, nkt, m, nn, inv_s2, out, ld, mout, doff, tri, st, E);
    } else {
        cfg = qk__tcf_cfg_runs(MODE == QK_GPU_TC_FP16 ? QK_GPU_TCF_FP16 : QK_GPU_TCF_TF32, cfg);   /* the planner's rule */
        switch (cfg) {
        case 4:
            if constexpr (MODE == QK_GPU_TC_FP16) return qk__launch_wg<false, CPLX, OutT>(A, B, ldw, ldw, m, nn, inv_s2, out, ld, mout, doff, tri, st, E, mcols);
            else return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "fused tensor-core configuration 4 (wgmma) serves fp16 and fp32x3 only");
        case 2: return qk__launch_tcf_cfg<MODE, CPLX, OutT, 64, 2, 2>(A, B, ldw, nkt, m, nn, inv_s2, out, ld, mout, doff, tri, st, E);
        default: return qk__launch_tcf_cfg<MODE, CPLX, OutT, 128, 2, 4>(A, B, ldw, nkt, m, nn, inv_s2, out, ld, mout, doff, tri, st, E);
        }
    }
}

/* Operand geometry of engine `eng` (QK_GPU_TCF_*; MODE and mode below: the cuBLAS tensor-core
   engine of the same operand format, QK_GPU_TC_TF32, TC_FP32X3, TC_FP16) for states of D amplitudes: words per row and part
   (ldp, a whole number of k-stages), words per row (ldw), k-stages (nkt), the FP16 scale. Keep in
   step with qk.h's qk__tcf_ws (the planner counts these bytes). */
struct qk__tcf_geom {
    int mode;
    int64_t W, ldp, ldw;
    int nkt;
    float scale, inv_s2;
};
static qk__tcf_geom qk__tcf_geometry(qk_gpu_engine eng, int64_t D, bool cplx)
{
    qk__tcf_geom G;
    G.mode = (int)qk__engine_tc_of(eng);   /* the operand format: that of the cuBLAS engine of the mode */
    G.W = cplx ? 2 * D : D;
    const int64_t words = G.mode == QK_GPU_TC_TF32 ? G.W : (G.W + 1) / 2, kw = 32;   /* whole 32-word stages: the wgmma kernels' too */
    G.ldp = (words + kw - 1) / kw * kw;
    G.ldw = G.mode == QK_GPU_TC_FP32X3 ? 2 * G.ldp : G.ldp;
    G.nkt = (int)(G.ldp / (G.mode == QK_GPU_TC_FP32X3 ? 16 : 32));   /* the mma.sync kernel's stages: FP32X3 16 words a part */
    int q = 0;
    while (((int64_t)1 << q) < D) ++q;
    G.scale = G.mode == QK_GPU_TC_TF32 ? 1.0f : ldexpf(1.0f, q / 2);
    G.inv_s2 = 1.0f / (G.scale * G.scale);
    return G;
}

static qk_result qk__tcf_convert(const qk__tcf_geom &G, const void *src, int64_t rows, uint32_t *dst, cudaStream_t st, qk__err *E)
{
    const int64_t n = rows * G.ldp;
    if (n <= 0) return QK_OK;
    const unsigned blocks = (unsigned)std::min<int64_t>((n + 255) / 256, (int64_t)1 << 20);
    switch (G.mode) {
    case QK_GPU_TC_TF32: qk__k_tcf_operand<QK_GPU_TC_TF32><<<blocks, 256, 0, st>>>((const float *)src, rows, G.W, G.ldp, G.scale, dst); break;
    case QK_GPU_TC_FP32X3: qk__k_tcf_operand<QK_GPU_TC_FP32X3><<<blocks, 256, 0, st>>>((const float *)src, rows, G.W, G.ldp, G.scale, dst); break;
    default: qk__k_tcf_operand<QK_GPU_TC_FP16><<<blocks, 256, 0, st>>>((const float *)src, rows, G.W, G.ldp, G.scale, dst); break;
    }
    QK_LAUNCH_CK("qk__k_tcf_operand");
    return QK_OK;
}

template <bool CPLX, typename OutT>
static qk_result qk__launch_tcf(const qk__tcf_geom &G, int cfg, const uint32_t *A, const uint32_t *B, int64_t m, int64_t nn, OutT *out,
                                int64_t ld, OutT *mout, int64_t doff, int tri, cudaStream_t st, qk__err *E, int64_t mcols = INT64_MAX)
{
    if (G.mode != QK_GPU_TC_FP32X3 && G.W > (CPLX ? 2 : 1) * ((int64_t)1 << QK__TCF_NOFLUSH_MAX_QUBITS))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "fused tensor-core kernel: tf32 and fp16 serve at most "
                            QK__TCF_STR(QK__TCF_NOFLUSH_MAX_QUBITS) " qubits (their accumulation error grows with the state; "
                            "use the cuBLAS engine or fp32x3)");
    switch (G.mode) {
    case QK_GPU_TC_TF32: return qk__launch_tcf_mode<QK_GPU_TC_TF32, CPLX, OutT>(cfg, A, B, G.ldw, G.nkt, m, nn, G.inv_s2, out, ld, mout, doff, tri, st, E, mcols);
    case QK_GPU_TC_FP32X3: return qk__launch_tcf_mode<QK_GPU_TC_FP32X3, CPLX, OutT>(cfg, A, B, G.ldw, G.nkt, m, nn, G.inv_s2, out, ld, mout, doff, tri, st, E, mcols);
    default: return qk__launch_tcf_mode<QK_GPU_TC_FP16, CPLX, OutT>(cfg, A, B, G.ldw, G.nkt, m, nn, G.inv_s2, out, ld, mout, doff, tri, st, E, mcols);
    }
}

/* Autotune of the fused engine (qk__tune): converts the n states into ws (bytes) and runs K(X,X). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__tune_tcf(qk_gpu_engine eng, int cfg, const void *S, int64_t n, int D, void *ws, size_t ws_bytes, OutT *K, qk__err *E)
{
    if (sizeof(T) != 4) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_tune_gram: fused tensor-core engine takes float states");
    const qk__tcf_geom G = qk__tcf_geometry(eng, D, CPLX);
    if ((size_t)n * G.ldw * 4 > ws_bytes) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_tune_gram: workspace too small for the fused tensor-core engine");
    QK_TRY(qk__tcf_convert(G, S, n, (uint32_t *)ws, 0, E));
    return qk__launch_tcf<CPLX, OutT>(G, cfg, (const uint32_t *)ws, (const uint32_t *)ws, n, n, K, n, K, 0, 1, 0, E);
}

/* ======================================================================================== */
/* >>pipeline ---- the Gram job: streams and events, job state, qk__pipe's steps ---- */
/* ======================================================================================== */

/* Stream pool: a compute and a copy stream; events around each operation give the per-stream
   busy intervals (summed after the final synchronization). */
enum qk__ev_tag { QK__EV_STATES, QK__EV_SLAB, QK__EV_COPY };
static double qk__host_ms(void)
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
struct qk__pool {
    cudaStream_t st[2] = {nullptr, nullptr};
    cudaEvent_t t0 = nullptr;
    std::vector<cudaEvent_t> ev;   /* pairs (begin, end) */
    std::vector<int> ev_stream;
    std::vector<qk__ev_tag> ev_tag;
    std::vector<cudaEvent_t> ev_in;   /* the copy-in stream's (begin, end) pairs, kept apart: its
                                         intervals nest in the compute stream's slabs */
};

/* The stream pool a context keeps per GPU (qk_engine.h): st[0] compute, st[1] copy, st[2] the
   cuBLAS epilogue; the cuBLAS handle made on the first job that needs it. */
enum { QK__PB_SA, QK__PB_SB, QK__PB_PARAMS, QK__PB_TMP, QK__PB_CW0, QK__PB_CW1, QK__PB_KD, QK__PB_KT, QK__PB_X, QK__PB_Y, QK__PB_PROG, QK__PB_COUNT };
struct qk_cuda_pool {
    int device = -1;
    bool lent = false;
    cudaStream_t st[3] = {nullptr, nullptr, nullptr};
    cublasHandle_t blas = nullptr;
    void *buf[QK__PB_COUNT] = {};        /* the jobs' device buffers by role (states, build scratch, the
                                            cuBLAS workspace ring, K's slab ring or resident K, the
                                            features X and Y, the compiled program), kept across
                                            calls and grown when a job needs more */
    size_t bytes[QK__PB_COUNT] = {};
};

extern "C" size_t qk_cuda_pool_bytes(const qk_cuda_pool *p)
{
    size_t b = 0;
    if (p) for (int i = 0; i < QK__PB_COUNT; ++i) b += p->bytes[i];
    return b;
}

extern "C" void qk_cuda_pool_destroy(qk_cuda_pool *p)
{
    if (!p) return;
    int cur = -1;
    const bool back = cudaGetDevice(&cur) == cudaSuccess && cur != p->device && p->device >= 0;
    if (back) cudaSetDevice(p->device);
    for (int i = 0; i < 3; ++i)
        if (p->st[i]) { cudaStreamSynchronize(p->st[i]); cudaStreamDestroy(p->st[i]); }
    if (p->blas) cublasDestroy(p->blas);
    for (int i = 0; i < QK__PB_COUNT; ++i) cudaFree(p->buf[i]);
    if (back) cudaSetDevice(cur);
    cudaGetLastError();
    delete p;
}

extern "C" qk_result qk_cuda_pool_create(qk_cuda_pool **out, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!out) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_pool_create: NULL argument");
    *out = nullptr;
    qk_cuda_pool *p = new (std::nothrow) qk_cuda_pool;
    if (!p) return qk__fail_msg(E, QK_ERROR_OUT_OF_MEMORY, "qk_cuda_pool_create: out of memory");
    auto make = [&]() -> qk_result {
        QK_CK(cudaGetDevice(&p->device));
        for (int i = 0; i < 3; ++i) QK_CK(cudaStreamCreateWithFlags(&p->st[i], cudaStreamNonBlocking));
        return QK_OK;
    };
    const qk_result r = make();
    if (r != QK_OK) { qk_cuda_pool_destroy(p); return r; }
    *out = p;
    return QK_OK;
}

/* A provider's rows (qk_cuda_io.fetch) cross in page-locked chunks of about this many bytes (at
   least one row), two of them, so that the provider fills one while the other is copied. */
#define QK__FETCH_BYTES ((size_t)32 << 20)

struct qk__job_state {
    qk__err *E;
    const qk_plan *plan;
    const qk_map *map;
    const qk_gram_desc *desc;
    qk_rows_fn rows;                     /* host-side slabs (staged outputs) */
    void *rows_user;
    void *io_stage[2];                   /* the caller's pinned staging (may be NULL) */
    size_t io_stage_bytes;
    qk_cuda_stats *stats;
    const qk_cuda_prof_hooks *prof = nullptr; /* the profiler's GPU zones (qk_cuda_io.prof; NULL: none) */
    int64_t *delivered;                  /* slabs handed to rows (a retry after one would
                                            deliver rows twice) */
    qk__prog pg;
    qk__dprog dp;
    qk__pool pool;
    qk_cuda_pool *cpool = nullptr;       /* the GPU's stream pool offered (qk_cuda_io.pool) */
    qk_cuda_pool *lent = nullptr;        /* ... and borrowed for this job: its streams and handle */
    unsigned pooled = 0;                 /* the roles (QK__PB_*) whose buffer is the pool's */
    cublasHandle_t blas = nullptr;
    double *dx = nullptr, *dy = nullptr;
    bool x_in_place = false;             /* dx, dy are the caller's device states (qk_gram_states) */
    void *SA = nullptr, *SB = nullptr;   /* states (or qubit vectors) */
    qk__build_ws ws;
    void *Kd = nullptr;                  /* device K (resident) or slab ring */
    void *Cw[2] = {nullptr, nullptr};    /* cuBLAS workspace ring (slab s uses Cw[s & 1]) */
    cudaStream_t est = nullptr;          /* epilogue stream (cuBLAS path) */
    cudaEvent_t gemm_done = nullptr, ep_done[2] = {nullptr, nullptr};
    int64_t n_blas = 0;
    /* given host states streamed (qk__pipe::fetch): the copy-in stream, the raw rows' events,
       and the provider's pinned chunks (io->fetch) */
    qk_result (*fetch)(int side, int64_t r0, int64_t r1, double *dst, void *user) = nullptr;
    void *fetch_user = nullptr;
    cudaStream_t hs = nullptr;
    cudaEvent_t raw_ready = nullptr, raw_free = nullptr;
    bool raw_used = false;               /* raw_free recorded: the next copy-in waits for it */
    double *fb[2] = {nullptr, nullptr};  /* provider chunks of fb_rows rows (page-locked) */
    cudaEvent_t fb_done[2] = {nullptr, nullptr};
    int64_t fb_rows = 0, n_fb = 0;
    void *stage[2] = {nullptr, nullptr}; /* pinned staging */
    bool own_stage = false;              /* allocated for this job (else the caller's) */
    /* the transpose as well (qk_cuda_io.mirror_out / mrows): a slab's transpose on the device
       (Kt, made after the slab on its stream), and in the second half of each staging slot when staged */
    void *mirror_out = nullptr;
    int64_t mirror_ld = 0;
    int64_t band_rows = 0;               /* qk_cuda_io.band_rows: a symmetric job's first rows alone (0: all) */
    qk_rows_fn mrows = nullptr;
    void *mrows_user = nullptr;
    void *Kt = nullptr;
    void *mstage[2] = {nullptr, nullptr};
    cudaEvent_t kt_free = nullptr;       /* Kt's last transpose went down (the next one may overwrite it) */
    cudaEvent_t slab_done[2] = {nullptr, nullptr}, copy_done[2] = {nullptr, nullptr};
};

/* A pool's buffer of role r for one job: grown when too small (the pool's buffers not in this
   job's *pooled mask are given back first when the device is full); the role is then marked in
   *pooled (the job must not free it). Without a pool: the job's own cudaMalloc. */
static cudaError_t qk__pool_buf(qk_cuda_pool *P, unsigned *pooled, int r, void **out, size_t bytes)
{
    if (!P) return cudaMalloc(out, bytes);
    if (P->bytes[r] < bytes) {
        cudaFree(P->buf[r]);
        P->buf[r] = nullptr;
        P->bytes[r] = 0;
        cudaError_t e = cudaMalloc(&P->buf[r], bytes);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            for (int i = 0; i < QK__PB_COUNT; ++i)
                if (i != r && !(*pooled & (1u << i)) && P->buf[i]) { cudaFree(P->buf[i]); P->buf[i] = nullptr; P->bytes[i] = 0; }
            e = cudaMalloc(&P->buf[r], bytes);
        }
        if (e != cudaSuccess) { P->buf[r] = nullptr; return e; }
        P->bytes[r] = bytes;
    }
    *out = P->buf[r];
    *pooled |= 1u << r;
    return cudaSuccess;
}

/* Borrows the pool offered to a job (qk_cuda_io.pool) when it is idle and belongs to the current
   GPU: its streams, handle and buffers serve the job until qk__pool_return. NULL: the job makes
   its own. */
static qk_cuda_pool *qk__pool_borrow(qk_cuda_pool *P)
{
    int dev = -1;
    if (!P || P->lent) return nullptr;
    if (cudaGetDevice(&dev) != cudaSuccess) { cudaGetLastError(); return nullptr; }
    if (dev != P->device) return nullptr;
    P->lent = true;
    return P;
}
static void qk__pool_return(qk_cuda_pool *P)
{
    if (P) P->lent = false;
}

/* The job's device buffer of role r (qk__pool_buf on the pool it borrowed, if any). */
static cudaError_t qk__job_buf(qk__job_state *J, int r, void **out, size_t bytes)
{
    return qk__pool_buf(J->lent, &J->pooled, r, out, bytes);
}
#define QK__OWN(J, r) (!((J)->pooled & (1u << (r))))

static void qk__job_free(qk__job_state *J)
{
    if (J->hs) cudaStreamSynchronize(J->hs);
    if (J->pool.st[0]) cudaStreamSynchronize(J->pool.st[0]);
    if (J->pool.st[1]) cudaStreamSynchronize(J->pool.st[1]);
    qk__dprog_free(&J->dp);
    if (!J->x_in_place) {
        if (QK__OWN(J, QK__PB_X)) cudaFree(J->dx);
        if (QK__OWN(J, QK__PB_Y)) cudaFree(J->dy);
    }
    if (J->SA) QK__GZ_UNTRACK(J, J->SA);
    if (J->SB && J->SB != J->SA) QK__GZ_UNTRACK(J, J->SB);
    if (J->Kd && (J->desc->output != QK_OUTPUT_DEVICE || J->Kd != J->desc->out)) QK__GZ_UNTRACK(J, J->Kd);
    if (QK__OWN(J, QK__PB_SA)) cudaFree(J->SA);
    if (J->SB != J->SA && QK__OWN(J, QK__PB_SB)) cudaFree(J->SB);
    if (QK__OWN(J, QK__PB_PARAMS)) cudaFree(J->ws.params);
    if (QK__OWN(J, QK__PB_TMP)) cudaFree(J->ws.tmp);
    cudaFree(J->ws.inv);
    if ((J->desc->output != QK_OUTPUT_DEVICE || J->Kd != J->desc->out) && QK__OWN(J, QK__PB_KD)) cudaFree(J->Kd);
    if (J->est) cudaStreamSynchronize(J->est);
    if (QK__OWN(J, QK__PB_CW0)) cudaFree(J->Cw[0]);
    if (QK__OWN(J, QK__PB_CW1)) cudaFree(J->Cw[1]);
    if (QK__OWN(J, QK__PB_KT)) cudaFree(J->Kt);
    if (J->gemm_done) cudaEventDestroy(J->gemm_done);
    for (int i = 0; i < 2; ++i) if (J->ep_done[i]) cudaEventDestroy(J->ep_done[i]);
    if (J->est && !J->lent) cudaStreamDestroy(J->est);
    for (int i = 0; i < 2; ++i) {
        if (J->stage[i] && J->own_stage) cudaFreeHost(J->stage[i]);
        if (J->slab_done[i]) cudaEventDestroy(J->slab_done[i]);
        if (J->copy_done[i]) cudaEventDestroy(J->copy_done[i]);
        if (J->pool.st[i] && !J->lent) cudaStreamDestroy(J->pool.st[i]);
    }
    for (int i = 0; i < 2; ++i) {
        if (J->fb[i]) cudaFreeHost(J->fb[i]);
        if (J->fb_done[i]) cudaEventDestroy(J->fb_done[i]);
    }
    if (J->kt_free) cudaEventDestroy(J->kt_free);
    if (J->raw_ready) cudaEventDestroy(J->raw_ready);
    if (J->raw_free) cudaEventDestroy(J->raw_free);
    if (J->hs) cudaStreamDestroy(J->hs);
    for (auto e : J->pool.ev) cudaEventDestroy(e);
    for (auto e : J->pool.ev_in) cudaEventDestroy(e);
    if (J->pool.t0) cudaEventDestroy(J->pool.t0);
    if (J->blas && !J->lent) cublasDestroy(J->blas);
    qk__pool_return(J->lent);             /* handed back, its streams synchronised above */
    cudaGetLastError();
}

static qk_result qk__mark(qk__job_state *J, int s, qk__ev_tag tag)
{
    qk__err *E = J->E;
    cudaEvent_t e;
    QK_CK(cudaEventCreate(&e));
    J->pool.ev.push_back(e);
    J->pool.ev_stream.push_back(s);
    J->pool.ev_tag.push_back(tag);
    QK_CK(cudaEventRecord(e, J->pool.st[s]));
    return QK_OK;
}

/* The transpose of m x n entries (src, rows lds apart) into dst (n rows of m, ldd apart): 32 x 32
   tiles through shared memory (a padded row: no bank conflicts), coalesced reads and writes, a
   grid of at most `blocks` blocks striding over the tiles. A rectangle's mirror (qk_cuda_io.
   mirror_out / mrows): two passes over the slab in device memory, against one over PCIe. */
template <typename OutT>
__global__ void __launch_bounds__(256) qk__k_transpose(const OutT *__restrict__ src, int64_t lds, int64_t m, int64_t n, OutT *__restrict__ dst,
                                                       int64_t ldd)
{
    __shared__ OutT t[32][33];
    const int64_t tn = (n + 31) / 32, tiles = (m + 31) / 32 * tn;
    for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
        const int64_t r0 = b / tn * 32, c0 = b % tn * 32;
        for (int y = threadIdx.y; y < 32; y += 8) {
            const int64_t r = r0 + y, c = c0 + threadIdx.x;
            if (r < m && c < n) t[y][threadIdx.x] = src[r * lds + c];
        }
        __syncthreads();
        for (int y = threadIdx.y; y < 32; y += 8) {
            const int64_t c = c0 + y, r = r0 + threadIdx.x;
            if (r < m && c < n) dst[c * ldd + r] = t[threadIdx.x][y];
        }
        __syncthreads();
    }
}
template <typename OutT>
static qk_result qk__launch_transpose(const OutT *src, int64_t lds, int64_t m, int64_t n, OutT *dst, int64_t ldd, cudaStream_t st, qk__err *E)
{
    if (m <= 0 || n <= 0) return QK_OK;
    const int64_t tiles = (m + 31) / 32 * ((n + 31) / 32);
    qk__k_transpose<OutT><<<(unsigned)std::min<int64_t>(tiles, 4096), dim3(32, 8), 0, st>>>(src, lds, m, n, dst, ldd);
    QK_LAUNCH_CK("qk__k_transpose");
    return QK_OK;
}

/* One Gram job on the device, read top to bottom (qk__pipe::run):
     alloc     streams, the compiled program, X (and Y) on the device, state buffers and their
               build scratch, the cuBLAS handle and workspace ring
     output    where K's rows live on the device (the caller's buffer, K resident, or a ring of
               two slabs) and on the host (the caller's pinned buffer, or pinned staging)
     states    bulk state construction (else each slab builds its state tiles)
     slab      slab s of K on the compute stream (upper triangle + mirror where K is whole on
               the device, full rows in the slab ring)
     ship      its D2H on the copy stream (host outputs); with the transpose as well
               (qk_cuda_io.mirror_out / mrows) the slab's transpose, made where the slab
               finishes and copied down after it
     deliver   on the host: wait for a shipped slab, hand it to io->rows, report progress; slab
               s-1 is delivered while slab s computes and ships
     stats     per-stream busy time and phase times from the events
   Two leading dimensions only: ld_out, the caller's, and ldk, that of the device buffer the
   slab's rows are in. Every decision comes from the plan and the retry parameters (slab rows,
   state tile, K residency) that qk_cuda_gram passes; the steps derive nothing else. */
/* The pipeline's Gram call for the fused tensor-core engines (qk__pipe::gram). Operands live in
   J->Cw[0] (the pool's workspace role), allocated on first use: with all states resident (bulk) every state is converted
   once per job (J->n_blas marks it) and slabs index into them; with state tiles, the call's A
   and B rows are converted (once when they are the same rows). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__gram_tcf(qk__job_state *J, qk_gpu_engine eng, int cfg, bool bulk, int64_t tA, int64_t tB, const void *A, const void *B,
                              int64_t m, int64_t nn, int64_t D, OutT *o, int64_t ldo, OutT *mo, int64_t doff, int tri, cudaStream_t st,
                              int64_t mcols)
{
    qk__err *E = J->E;
    if (sizeof(T) != 4 || !qk__engine_tcf(eng))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: the fused tensor-core engine takes float states (plan.engine TCF_*)");
    if (m <= 0 || nn <= 0) return QK_OK;
    const qk__tcf_geom G = qk__tcf_geometry(eng, D, CPLX);
    const size_t per_state = (size_t)G.W * sizeof(float);
    const bool shared_ab = bulk && J->SB == J->SA;
    const int64_t rows = bulk ? tA + (shared_ab ? 0 : tB) : tA + tB;
    if (!J->Cw[0]) QK_CK(qk__job_buf(J, QK__PB_CW0, &J->Cw[0], std::max<size_t>(16, (size_t)rows * G.ldw * 4)));
    uint32_t *ws = (uint32_t *)J->Cw[0];
    const uint32_t *opA, *opB;
    if (bulk) {
        if (J->n_blas == 0) {
            QK_TRY(qk__tcf_convert(G, J->SA, tA, ws, st, E));
            if (!shared_ab) QK_TRY(qk__tcf_convert(G, J->SB, tB, ws + tA * G.ldw, st, E));
            J->n_blas = 1;
        }
        const int64_t ia = (int64_t)(((const char *)A - (const char *)J->SA) / per_state);
        const int64_t ib = (int64_t)(((const char *)B - (const char *)J->SB) / per_state);
        opA = ws + ia * G.ldw;
        opB = ws + ((shared_ab ? 0 : tA) + ib) * G.ldw;
    } else {
        QK_TRY(qk__tcf_convert(G, A, m, ws, st, E));
        opA = ws;
        if (A == B) opB = ws;
        else {
            QK_TRY(qk__tcf_convert(G, B, nn, ws + tA * G.ldw, st, E));
            opB = ws + tA * G.ldw;
        }
    }
    return qk__launch_tcf<CPLX, OutT>(G, cfg, opA, opB, m, nn, o, ldo, mo, doff, tri, st, E, mcols);
}

template <typename T, bool CPLX, typename OutT> struct qk__pipe {
    qk__job_state *J;
    qk__err *E;
    const qk_plan *pl;
    const qk_gram_desc *ds;
    const qk_map *map;
    bool sym, analytic, use_blas, bulk, dev_out, pinned_out, mirror;
    bool tmirror;                        /* the transpose as well (J->mirror_out or J->mrows) */
    int linear;                          /* plan.linear: K = <a|b> itself (density matrices), not squared */
    qk_gpu_engine engine;                /* the plan's (qk__plan_engine) */
    int q, d;
    int64_t nx, ny, D, ld_out, slab_rows, state_tile, tA, tB, n_slabs, ldk;
    int64_t rows_out;                    /* rows of K this job delivers: nx, or a symmetric job's band (J->band_rows) */
    size_t es, per_state;
    size_t srow;                         /* bytes from one state's row to the next in SA / SB */
    size_t sslot;                        /* bytes a state takes in SA / SB (planes: its rows of the four planes) */
    int planes = 0;                      /* SA / SB hold Gauss's operand planes (qk__planes_out's mode) */
    int k_resident;
    cudaStream_t cs = nullptr, xs = nullptr;
    OutT *Kdev = nullptr;                /* the caller's device buffer or the resident K */
    int64_t done_pairs = 0;
    double deliver_ms = 0;
    bool stream_amp = false;             /* pure amplitude map, bulk states: the H2D encoder */
    bool streamed = false;               /* given host states copied in as needed (qk__pipe::upload) */
    bool peer = false;                   /* ... or device states of another GPU (QK__STATE_PEER) */
    double copyin = 0;                   /* bytes upload copied in */
    size_t rowu = 0;                     /* bytes of a host row the engine reads (span) */
    double enc_ms = 0;

    explicit qk__pipe(qk__job_state *job) : J(job), E(job->E), pl(job->plan), ds(job->desc), map(job->map)
    {
        /* the job as the plan describes it (qk_cuda_gram checked it against the desc) */
        sym = pl->symmetric != 0;
        nx = pl->n_x;
        ny = pl->n_y;
        const int64_t slab = pl->tile_m > 0 ? pl->tile_m : 1024;
        q = map->n_qubits;
        d = map->n_features;
        analytic = pl->path == QK_PATH_ANALYTIC;
        D = analytic ? 0 : ((int64_t)1 << q);
        es = CPLX ? 2 * sizeof(T) : sizeof(T);
        per_state = analytic ? (size_t)q * 4 * sizeof(T) : (size_t)D * es;
        srow = sslot = per_state;
        engine = qk__plan_engine(pl);
        use_blas = qk__engine_blas(engine) && !analytic;
        linear = pl->linear ? 1 : 0;
        ld_out = ds->ld_out > 0 ? ds->ld_out : ny;
        state_tile = pl->bulk_states || pl->state_tile <= 0 ? INT64_MAX : pl->state_tile;
        bulk = state_tile >= std::max(nx, ny); /* a tile of every sample is all of them */
        slab_rows = bulk ? slab : std::min(slab, state_tile); /* a slab's states are one tile */
        tA = bulk ? nx : state_tile;
        tB = bulk ? ny : state_tile;
        rows_out = sym && J->band_rows > 0 ? J->band_rows : nx;
        n_slabs = (rows_out + slab_rows - 1) / slab_rows;
        k_resident = pl->k_resident;
        dev_out = pl->output == QK_OUTPUT_DEVICE;
        /* given states read dim (a matrix: dim^2) elements of each row: a caller's ld may pad
           rows, and the array may end where its last row's elements do */
        rowu = (size_t)d * sizeof(double);
        if (qk__map_is_states(map)) rowu = std::min(rowu, qk__state_row_bytes(&map->ops[0]));
        pinned_out = pl->output == QK_OUTPUT_HOST && pl->host_pinned;
        mirror = qk__plan_mirror(pl) != 0;
        tmirror = !dev_out && (J->mirror_out || J->mrows);
        ldk = dev_out ? ld_out : ny;
        /* the planner's rule (qk.h): a pure amplitude map's states come from the streaming
           encoder (qk_cuda_amplitude_encode, at the PCIe bound) */
        stream_amp = !CPLX && qk__plan_stream_amp(pl, map);
        /* given host states (the data are the states, not a map's few features): copied in by
           state tile, never all of them at once unless the plan holds them all (bulk); a
           provider's rows (J->fetch) always through upload */
        streamed = J->fetch || (qk__map_is_states(map) && !(map->ops[0].q1 & QK__STATE_DEVICE) && !bulk);
        /* another GPU's device states (QK__STATE_PEER): copied in by upload, bulk or tiles */
        peer = qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_PEER);
        streamed = streamed || peer;
    }

    qk_result alloc()
    {
        if ((J->lent = qk__pool_borrow(J->cpool))) {   /* the context's streams, kept across calls */
            J->pool.st[0] = J->lent->st[0];
            J->pool.st[1] = J->lent->st[1];
        } else {
            for (int i = 0; i < 2; ++i) QK_CK(cudaStreamCreateWithFlags(&J->pool.st[i], cudaStreamNonBlocking));
        }
        QK_CK(cudaEventCreate(&J->pool.t0));
        cs = J->pool.st[0];
        xs = J->pool.st[1];
        QK__GZ_STREAM_NAME(J, cs, "qk compute");
        QK__GZ_STREAM_NAME(J, xs, "qk copy");
        QK_CK(cudaEventRecord(J->pool.t0, cs));
        QK_TRY(qk__compile(map, &J->pg, E));
        if (J->pg.P > qk__cuda_params(map)) /* the planner counted the states' scratch with this budget */
            return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "qk_cuda_gram: internal error: the compiled program needs more "
                                                         "parameters than qk__cuda_params budgets (please report the map)");
        {   /* the program: one copy on the compute stream, into the pool's buffer when there is one */
            void *pb = nullptr;
            if (J->lent) QK_CK(qk__job_buf(J, QK__PB_PROG, &pb, qk__dprog_bytes(J->pg, map)));
            QK_TRY(qk__dprog_make(J->pg, map, &J->dp, E, pb, cs));
        }
        if (qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_DEVICE)) {
            /* the caller's device states, read in place: never copied, never freed here */
            J->x_in_place = true;
            J->dx = (double *)ds->x;
            J->dy = sym ? nullptr : (double *)ds->y;
        } else if (streamed) {
            /* bulk: every row on the device, filled by states(); tiles: one tile of raw rows,
               refilled on the copy-in stream while the previous tile's Gram runs */
            QK_CK(cudaStreamCreateWithFlags(&J->hs, cudaStreamNonBlocking));
            QK__GZ_STREAM_NAME(J, J->hs, "qk copy-in");
            QK_CK(cudaEventCreateWithFlags(&J->raw_ready, cudaEventDisableTiming));
            QK_CK(cudaEventCreateWithFlags(&J->raw_free, cudaEventDisableTiming));
            if (peer) qk__peer_access(ds->x);
            QK_CK(qk__job_buf(J, QK__PB_X, (void **)&J->dx, std::max<size_t>(1, (size_t)(bulk ? nx : tA) * d * sizeof(double))));
            if (bulk && !sym) QK_CK(qk__job_buf(J, QK__PB_Y, (void **)&J->dy, std::max<size_t>(1, (size_t)ny * d * sizeof(double))));
            if (J->fetch) {
                J->fb_rows = std::max<int64_t>(1, std::min<int64_t>((int64_t)(QK__FETCH_BYTES / ((size_t)d * sizeof(double))), std::max(nx, ny)));
                for (int i = 0; i < 2; ++i) {
                    QK_CK(cudaMallocHost((void **)&J->fb[i], (size_t)J->fb_rows * d * sizeof(double)));
                    QK_CK(cudaEventCreateWithFlags(&J->fb_done[i], cudaEventDisableTiming));
                }
            }
        } else if (!stream_amp) {
            QK_CK(qk__job_buf(J, QK__PB_X, (void **)&J->dx, std::max<size_t>(1, (size_t)nx * d * sizeof(double))));
            QK_CK(cudaMemcpyAsync(J->dx, ds->x, span(nx), cudaMemcpyHostToDevice, cs));
            QK__TEST_ROWS_IN(span(nx));
        }
        if (!sym && !stream_amp && !J->x_in_place && !streamed) {
            QK_CK(qk__job_buf(J, QK__PB_Y, (void **)&J->dy, std::max<size_t>(1, (size_t)ny * d * sizeof(double))));
            QK_CK(cudaMemcpyAsync(J->dy, ds->y, span(ny), cudaMemcpyHostToDevice, cs));
            QK__TEST_ROWS_IN(span(ny));
        }
        /* The fp16, bf16 and fp32x3 engines in Gauss's form on bulk states that a map's program
           builds (not given states): the state builder writes the operand planes itself (re, im,
           re - im, re + im), so no Gram call runs the operand pass (QK_TC_PLANES=0, measurement:
           they do). fp16 and bf16 planes take the bytes of the complex fp32 states; fp32x3's,
           rows [hi lo hi hi] of 4D values, four times those, taken only where the workspace's
           operand room it saves is at least as large (the memory the planner counted bounds the
           job's still). Decided once here: the Gram calls and the workspace follow it. */
        if (CPLX && sizeof(T) == 4 && bulk && use_blas && !analytic && !stream_amp && !streamed &&
            (engine == QK_GPU_TC_FP16 || engine == QK_GPU_TC_BF16 || engine == QK_GPU_TC_FP32X3) && qk__tc_gauss(engine, true)) {
            const char *pe = getenv("QK_TC_PLANES");
            const size_t row = (size_t)D * 2 * (engine == QK_GPU_TC_FP32X3 ? 4 : 1), extra = 4 * row - per_state;
            const size_t slots = n_slabs > 1 ? 2 : 1;
            const size_t saved = slots * (qk__blas_ws_bytes<T, CPLX>(engine, slab_rows, tB, D, false) -
                                          qk__blas_ws_bytes<T, CPLX>(engine, slab_rows, tB, D, true));
            if (!(pe && pe[0] == '0') && extra * (size_t)(tA + (sym ? 0 : tB)) <= saved && !J->pg.states) {
                planes = engine == QK_GPU_TC_FP16 ? 1 : engine == QK_GPU_TC_BF16 ? 2 : 3;
                srow = row;
                sslot = 4 * row;
            }
        }
        QK_CK(qk__job_buf(J, QK__PB_SA, &J->SA, std::max<size_t>(1, (size_t)tA * sslot)));
        QK__GZ_TRACK(J, "qk states", J->SA, (size_t)tA * sslot);
        if (sym && bulk) J->SB = J->SA;
        else {
            QK_CK(qk__job_buf(J, QK__PB_SB, &J->SB, std::max<size_t>(1, (size_t)tB * sslot)));
            QK__GZ_TRACK(J, "qk states", J->SB, (size_t)tB * sslot);
        }
        if (!analytic && !stream_amp) {
            int64_t tmax = std::max(tA, tB);
            QK_CK(qk__job_buf(J, QK__PB_PARAMS, &J->ws.params, (size_t)tmax * J->pg.P * sizeof(T)));
            if (J->pg.passes.size() > 1) QK_CK(qk__job_buf(J, QK__PB_TMP, &J->ws.tmp, (size_t)tmax * D * 2 * sizeof(T)));
            if (J->pg.has_amp) QK_CK(cudaMalloc((void **)&J->ws.inv, (size_t)tmax * sizeof(double)));
        }
        if (use_blas) {
            if (J->lent) {               /* the pool's handle, made by the first job that needs one */
                if (!J->lent->blas) QK_BLAS_CK(cublasCreate(&J->lent->blas));
                J->blas = J->lent->blas;
            } else {
                QK_BLAS_CK(cublasCreate(&J->blas));
            }
            QK_CK(qk__job_buf(J, QK__PB_CW0, &J->Cw[0], (qk__blas_ws_bytes<T, CPLX>(engine, slab_rows, tB, D, planes != 0))));
            if (n_slabs > 1)
                QK_CK(qk__job_buf(J, QK__PB_CW1, &J->Cw[1], (qk__blas_ws_bytes<T, CPLX>(engine, slab_rows, tB, D, planes != 0))));
            /* the epilogue stream: the epilogue of one slab under the next slab's GEMMs (two
               workspace slots), and on the tensor-core engines a diagonal block's epilogue per
               block of rows under the next block's GEMMs (qk__launch_blas), one slab too */
            if (n_slabs > 1 || qk__engine_tc(engine)) {
                if (J->lent) J->est = J->lent->st[2];
                else QK_CK(cudaStreamCreateWithFlags(&J->est, cudaStreamNonBlocking));
                QK__GZ_STREAM_NAME(J, J->est, "qk epilogue");
                QK_CK(cudaEventCreateWithFlags(&J->gemm_done, cudaEventDisableTiming));
                for (int i = 0; i < 2; ++i) QK_CK(cudaEventCreateWithFlags(&J->ep_done[i], cudaEventDisableTiming));
            }
        }
        return QK_OK;
    }

    /* Pageable buffers are not page-locked for the job: registering fresh memory faults in every
       page on one thread, slower than the copy-out it saves; qk.h's delivery copies on all cores. */
    qk_result output()
    {
        if (!dev_out && !pinned_out && !J->rows)
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: staged output without a rows callback");
        if (dev_out) Kdev = (OutT *)ds->out;
        else if (k_resident) {
            QK_CK(qk__job_buf(J, QK__PB_KD, &J->Kd, (size_t)rows_out * ny * sizeof(OutT)));
            QK__GZ_TRACK(J, "qk K (resident)", J->Kd, (size_t)rows_out * ny * sizeof(OutT));
            Kdev = (OutT *)J->Kd;
        } else {
            QK_CK(qk__job_buf(J, QK__PB_KD, &J->Kd, (size_t)2 * slab_rows * ny * sizeof(OutT)));
            QK__GZ_TRACK(J, "qk K slab ring", J->Kd, (size_t)2 * slab_rows * ny * sizeof(OutT));
        }
        if (tmirror) {
            QK_CK(qk__job_buf(J, QK__PB_KT, &J->Kt, (size_t)slab_rows * ny * sizeof(OutT)));
            QK_CK(cudaEventCreateWithFlags(&J->kt_free, cudaEventDisableTiming));
        }
        if (!dev_out && !pinned_out) {
            /* a slab per slot, and its transpose after it when staged */
            const size_t sb = (size_t)slab_rows * ny * sizeof(OutT), slot = tmirror ? 2 * sb : sb;
            if (J->io_stage[0] && J->io_stage[1] && J->io_stage_bytes >= slot) {
                J->stage[0] = J->io_stage[0];
                J->stage[1] = J->io_stage[1];
            } else {
                J->own_stage = true;
                for (int i = 0; i < 2; ++i) QK_CK(cudaMallocHost(&J->stage[i], slot));
            }
            if (tmirror)
                for (int i = 0; i < 2; ++i) J->mstage[i] = (char *)J->stage[i] + sb;
        }
        for (int i = 0; i < 2; ++i) {
            QK_CK(cudaEventCreateWithFlags(&J->slab_done[i], cudaEventDisableTiming));
            QK_CK(cudaEventCreateWithFlags(&J->copy_done[i], cudaEventDisableTiming));
        }
        return QK_OK;
    }

    /* states (or per-qubit vectors) of rows [r0, r0 + cnt) of src into dst; with planes (bulk:
       every row of a side, r0 = 0) dst's cnt rows as operand planes */
    qk_result build(const double *src, int64_t r0, int64_t cnt, void *dst)
    {
        if (analytic) return qk__launch_qubit_vectors<T>(J->dp, q, src + r0 * d, cnt, d, (T *)dst, cs, E);
        /* the scale of qk__tc_gauss_products (2^floor(q/2), q = log2 D) */
        const qk__planes_out po = {planes, ldexpf(1.0f, q / 2), cnt * (int64_t)(srow / 2)};
        return qk__build_states<T>(J->pg, J->dp, src + r0 * d, cnt, J->ws, dst, !CPLX, cs, E, planes ? &po : nullptr);
    }

    /* an event on the copy-in stream (stats: its busy time) */
    qk_result mark_in()
    {
        cudaEvent_t e;
        QK_CK(cudaEventCreate(&e));
        J->pool.ev_in.push_back(e);
        QK_CK(cudaEventRecord(e, J->hs));
        return QK_OK;
    }

    /* the bytes of cnt consecutive host rows the engine reads: whole rows, then the last one's
       used part (never past the end of a caller's array whose ld pads its rows) */
    size_t span(int64_t cnt) const { return cnt > 0 ? (size_t)(cnt - 1) * (size_t)d * sizeof(double) + rowu : 0; }

    /* Given host states: rows [r0, r0 + cnt) of side (0: x, 1: y) into dev on the copy-in
       stream, from the caller's rows (page-locked by qk.h for the job where it could, so at the
       PCIe rate) or the provider's pinned chunks; the compute stream waits for them. The copy
       waits for the kernel that last read the raw rows (raw_free), so the next tile crosses PCIe
       while the current tile's Gram runs. */
    qk_result upload(int side, int64_t r0, int64_t cnt, double *dev)
    {
        const size_t rowb = (size_t)d * sizeof(double);
        if (J->raw_used) QK_CK(cudaStreamWaitEvent(J->hs, J->raw_free, 0));
        QK_TRY(mark_in());
        QK__GZ_GPU_BEGIN(J, "qk H2D states", J->hs);
        const double bytes = J->fetch ? (double)rowb * (double)cnt : (double)span(cnt);
        QK__GZ_COUNT(J, "qk H2D state bytes", bytes);
        copyin += bytes;
        if (!J->fetch) {
            const double *src = (side ? ds->y : ds->x) + r0 * d;
            QK_CK(cudaMemcpyAsync(dev, src, span(cnt), peer ? cudaMemcpyDefault : cudaMemcpyHostToDevice, J->hs));
            QK__TEST_ROWS_IN(span(cnt));
        } else {
            for (int64_t c = 0; c < cnt; c += J->fb_rows) {
                const int64_t k = std::min(J->fb_rows, cnt - c);
                const int b = (int)(J->n_fb & 1);
                if (J->n_fb >= 2) QK_CK(cudaEventSynchronize(J->fb_done[b])); /* its last chunk crossed */
                J->n_fb++;
                QK_TRY(J->fetch(side, r0 + c, r0 + c + k, J->fb[b], J->fetch_user));
                QK_CK(cudaMemcpyAsync(dev + c * d, J->fb[b], (size_t)k * rowb, cudaMemcpyHostToDevice, J->hs));
                QK__TEST_ROWS_IN((size_t)k * rowb);
                QK_CK(cudaEventRecord(J->fb_done[b], J->hs));
            }
        }
        QK__GZ_GPU_END(J, "qk H2D states", J->hs);
        QK_TRY(mark_in());
        QK_CK(cudaEventRecord(J->raw_ready, J->hs));
        QK_CK(cudaStreamWaitEvent(cs, J->raw_ready, 0));
        return QK_OK;
    }

    /* the states of rows [r0, r0 + cnt) of side into dst (a state tile) */
    qk_result tile(int side, int64_t r0, int64_t cnt, void *dst)
    {
        if (!streamed) return build(side ? J->dy : J->dx, r0, cnt, dst);
        QK_TRY(upload(side, r0, cnt, J->dx));
        QK_TRY(build(J->dx, 0, cnt, dst));
        QK_CK(cudaEventRecord(J->raw_free, cs));
        J->raw_used = true;
        return QK_OK;
    }

    /* K[A x B] (m x nn) into o (ld ldo), mirror into mo when given: of the first mcols columns
       only (a band of K(X,X)'s rows, qk_cuda_io.band_rows). The fused tensor-core engine takes
       mcols into its launch (its persistent wgmma kernels in one); the others run the columns
       from mcols on as a second call without a mirror. */
    qk_result gram(const void *A, const void *B, int64_t m, int64_t nn, OutT *o, int64_t ldo, OutT *mo, int64_t doff, int tri,
                   int64_t mcols = INT64_MAX)
    {
        if (m <= 0 || nn <= 0) return QK_OK;
        if (mo && mcols < nn && !(qk__engine_tcf(engine) && !analytic)) {
            const int64_t c = std::max<int64_t>(0, mcols);
            QK_TRY(gram(A, B, m, c, o, ldo, mo, doff, tri));
            return gram(A, (const char *)B + c * srow, m, nn - c, o + c, ldo, nullptr, doff + c, tri);
        }
        if (linear && (analytic || !use_blas))   /* qk_cuda_gram checks it first; the one epilogue with the flag */
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: plan.linear runs on the cuBLAS engines only");
        if (analytic) return qk__launch_product<T, OutT>((const T *)A, (const T *)B, m, nn, q, o, ldo, mo, doff, tri, cs, E);
        if (qk__engine_tcf(engine))
            return qk__gram_tcf<T, CPLX, OutT>(J, engine, pl->kernel_cfg, bulk, tA, tB, A, B, m, nn, D, o, ldo, mo, doff, tri, cs, mcols);
        if (!use_blas) return qk__launch_gram<T, CPLX, OutT>(pl->kernel_cfg, A, B, m, nn, (int)D, o, ldo, mo, doff, tri, cs, E);
        /* the workspace holds slab_rows x tB */
        const int64_t pv = (int64_t)(srow / 2);   /* values a plane's row */
        const qk__op_planes pp = {tA * pv, (sym ? tA : tB) * pv};
        for (int64_t c0 = 0; c0 < nn; c0 += tB) {
            int64_t cn = std::min(tB, nn - c0);
            const int two = J->Cw[1] != nullptr, k = two ? (int)(J->n_blas & 1) : 0;
            void *cw = J->Cw[k];
            if (J->est && J->n_blas >= (two ? 2 : 1)) QK_CK(cudaStreamWaitEvent(cs, J->ep_done[k], 0)); /* ring slot free */
            QK_TRY((qk__launch_blas<T, CPLX, OutT>(J->blas, engine, A, (const char *)B + c0 * srow, m, cn, (int)D, cw,
                                                    o + c0, ldo, mo ? mo + c0 * ldo : nullptr, doff + c0, tri, cs, E, J->est,
                                                    J->gemm_done, linear, planes ? &pp : nullptr)));
            if (J->est) QK_CK(cudaEventRecord(J->ep_done[k], J->est));
            J->n_blas++;
        }
        return QK_OK;
    }

    qk_result states()
    {
        if (!bulk) return QK_OK;
        if (stream_amp) { /* synchronous, on the job's streams: the compute stream's kernels come after it */
            double sec = 0, sec2 = 0;
            const qk_precision pr = sizeof(T) == 8 ? QK_PRECISION_FP64 : QK_PRECISION_FP32;
            QK_TRY(qk__amp_encode(ds->x, nx, d, q, pr, J->SA, 64, &sec, xs, cs, E));
            if (!sym) QK_TRY(qk__amp_encode(ds->y, ny, d, q, pr, J->SB, 64, &sec2, xs, cs, E));
            enc_ms = (sec + sec2) * 1e3;
            return QK_OK;
        }
        QK_TRY(qk__mark(J, 0, QK__EV_STATES));
        QK__GZ_GPU_BEGIN(J, "qk states", cs);
        if (streamed) QK_TRY(upload(0, 0, nx, J->dx));
        QK_TRY(build(J->dx, 0, nx, J->SA));
        if (!sym && streamed) QK_TRY(upload(1, 0, ny, J->dy));
        if (!sym) QK_TRY(build(J->dy, 0, ny, J->SB));
        QK__GZ_GPU_END(J, "qk states", cs);
        QK_TRY(qk__mark(J, 0, QK__EV_STATES));
        return QK_OK;
    }

    /* where row i0 of slab s lives on the device */
    OutT *rows_of(int64_t s)
    {
        const int64_t i0 = s * slab_rows;
        if (Kdev) return Kdev + i0 * ldk;
        return (OutT *)J->Kd + (s & 1) * slab_rows * ny;
    }

    qk_result slab(int64_t s)
    {
        const int64_t i0 = s * slab_rows, m = std::min(slab_rows, rows_out - i0);
        if (!Kdev && s >= 2) QK_CK(cudaStreamWaitEvent(cs, J->copy_done[s & 1], 0)); /* ring slot shipped */
        OutT *base = rows_of(s);
        QK_TRY(qk__mark(J, 0, QK__EV_SLAB));
        QK__GZ_GPU_BEGIN(J, "qk gram slab", cs);
        QK__GZ_COUNT(J, "qk slabs", 1);
        const void *A;
        if (bulk) A = (const char *)J->SA + i0 * srow;
        else { QK_TRY(tile(0, i0, m, J->SA)); A = J->SA; }
        const int64_t jstart = mirror ? i0 : 0;
        /* the mirror stays in the rows this job delivers: a band's columns right of its end go
           without one (a rectangle, as a K(X,Y) job of those columns would compute it) */
        const int64_t cut = mirror ? std::min(ny, rows_out) : ny;
        if (bulk) {
            const void *B = (const char *)J->SB + jstart * srow;
            OutT *mo = mirror ? Kdev + jstart * ldk + i0 : nullptr;
            QK_TRY(gram(A, B, m, ny - jstart, base + jstart, ldk, mo, jstart - i0, mirror, cut - jstart));
        } else {
            for (int64_t j0 = jstart; j0 < ny; j0 += state_tile) {
                int64_t nn = std::min(state_tile, ny - j0);
                const void *B;
                if (sym && j0 == i0 && nn <= m) B = A; /* A holds only the slab's m rows */
                else { QK_TRY(tile(sym ? 0 : 1, j0, nn, J->SB)); B = J->SB; }
                QK_TRY(gram(A, B, m, nn, base + j0, ldk, mirror && j0 < cut ? Kdev + j0 * ldk + i0 : nullptr, j0 - i0, mirror && j0 == i0, cut - j0));
            }
        }
        if (J->est && s == n_slabs - 1) { /* the last epilogue ends the compute */
            QK_CK(cudaEventRecord(J->ep_done[0], J->est));
            QK_CK(cudaStreamWaitEvent(cs, J->ep_done[0], 0));
        }
        QK__GZ_GPU_END(J, "qk gram slab", cs);
        QK_TRY(qk__mark(J, 0, QK__EV_SLAB));
        return QK_OK;
    }

    qk_result ship(int64_t s)
    {
        const int64_t i0 = s * slab_rows, m = std::min(slab_rows, rows_out - i0);
        const int b = (int)(s & 1);
        const size_t rowb = (size_t)ny * sizeof(OutT);
        cudaStream_t ks = J->est ? J->est : cs;   /* the stream that finishes the slab's entries */
        if (tmirror) {   /* its transpose, there, once Kt's last one went down */
            if (s >= 1) QK_CK(cudaStreamWaitEvent(ks, J->kt_free, 0));
            QK_TRY(qk__launch_transpose<OutT>(rows_of(s), ldk, m, ny, (OutT *)J->Kt, m, ks, E));
        }
        QK_CK(cudaEventRecord(J->slab_done[b], ks));
        /* staging[b]'s previous slab (s-2) was delivered on the host before slab s was queued */
        QK_CK(cudaStreamWaitEvent(xs, J->slab_done[b], 0));
        QK_TRY(qk__mark(J, 1, QK__EV_COPY));
        QK__GZ_GPU_BEGIN(J, "qk D2H slab", xs);
        QK__GZ_COUNT(J, "qk D2H bytes", (double)rowb * (double)m);
        if (pinned_out)
            QK_CK(cudaMemcpy2DAsync((OutT *)ds->out + i0 * ld_out, (size_t)ld_out * sizeof(OutT), rows_of(s),
                                    (size_t)ldk * sizeof(OutT), rowb, (size_t)m, cudaMemcpyDeviceToHost, xs));
        else
            QK_CK(cudaMemcpy2DAsync(J->stage[b], rowb, rows_of(s), (size_t)ldk * sizeof(OutT), rowb, (size_t)m,
                                    cudaMemcpyDeviceToHost, xs));
        if (tmirror) {   /* the slab's transpose (ny rows of m) into K's mirror or the slot's second half */
            QK__GZ_COUNT(J, "qk D2H bytes", (double)rowb * (double)m);
            if (J->mirror_out)
                QK_CK(cudaMemcpy2DAsync((OutT *)J->mirror_out + i0, (size_t)J->mirror_ld * sizeof(OutT), J->Kt, (size_t)m * sizeof(OutT),
                                        (size_t)m * sizeof(OutT), (size_t)ny, cudaMemcpyDeviceToHost, xs));
            else
                QK_CK(cudaMemcpyAsync(J->mstage[b], J->Kt, (size_t)m * rowb, cudaMemcpyDeviceToHost, xs));
            QK_CK(cudaEventRecord(J->kt_free, xs));
        }
        QK__GZ_GPU_END(J, "qk D2H slab", xs);
        QK_TRY(qk__mark(J, 1, QK__EV_COPY));
        QK_CK(cudaEventRecord(J->copy_done[b], xs));
        return QK_OK;
    }

    qk_result progress(int64_t m)
    {
        done_pairs += m * ny;
        if (ds->progress && ds->progress(done_pairs, rows_out * ny, ds->progress_user))
            return qk__fail_msg(E, QK_ERROR_CANCELLED, "progress callback cancelled the Gram");
        return QK_OK;
    }

    qk_result deliver(int64_t s)
    {
        const int64_t i0 = s * slab_rows, m = std::min(slab_rows, rows_out - i0);
        const int b = (int)(s & 1);
        QK_CK(cudaEventSynchronize(J->copy_done[b]));
        if (!pinned_out) {
            /* the callee sets qk's detail message; err stays empty */
            const double h0 = qk__host_ms();
            qk_result r = J->rows(i0, m, J->stage[b], ny, J->rows_user);
            if (r == QK_OK && J->mrows) r = J->mrows(i0, m, J->mstage[b], m, J->mrows_user);
            deliver_ms += qk__host_ms() - h0;
            ++*J->delivered;
            if (r != QK_OK) return r;
        }
        return progress(m);
    }

    qk_result stats()
    {
        qk_cuda_stats st;
        memset(&st, 0, sizeof st);
        st.n_streams = streamed ? 3 : 2;
        st.copyin_bytes = copyin;
        st.n_slabs = (int)n_slabs;
        int first_slab = -1, last_slab = -1, last_any = -1;
        float last_any_ms = -1;
        for (size_t i = 0; i + 1 < J->pool.ev.size(); i += 2) {
            float ms = 0, e1 = 0;
            QK_CK(cudaEventElapsedTime(&ms, J->pool.ev[i], J->pool.ev[i + 1]));
            st.busy_ms[J->pool.ev_stream[i]] += ms;
            if (J->pool.ev_tag[i] == QK__EV_STATES) st.states_ms += ms;
            if (J->pool.ev_tag[i] == QK__EV_SLAB) { if (first_slab < 0) first_slab = (int)i; last_slab = (int)i + 1; }
            QK_CK(cudaEventElapsedTime(&e1, J->pool.t0, J->pool.ev[i + 1]));
            if (e1 > last_any_ms) { last_any_ms = e1; last_any = (int)i + 1; }
        }
        st.wall_ms = last_any_ms;
        if (first_slab >= 0) {
            float g = 0, o = 0;
            QK_CK(cudaEventElapsedTime(&g, J->pool.ev[first_slab], J->pool.ev[last_slab]));
            QK_CK(cudaEventElapsedTime(&o, J->pool.ev[first_slab], J->pool.ev[last_any]));
            st.gram_ms = g;
            st.output_ms = std::max(g, o);
        }
        for (size_t i = 0; i + 1 < J->pool.ev_in.size(); i += 2) {
            float ms = 0;
            QK_CK(cudaEventElapsedTime(&ms, J->pool.ev_in[i], J->pool.ev_in[i + 1]));
            st.busy_ms[2] += ms;
        }
        st.deliver_ms = deliver_ms;
        st.states_ms += enc_ms;
        if (J->stats) *J->stats = st;
        return QK_OK;
    }

    qk_result run()
    {
        QK_TRY(alloc());
        QK_TRY(output());
        QK_TRY(states());
        for (int64_t s = 0; s < n_slabs; ++s) {
            QK_TRY(slab(s));
            if (dev_out) { QK_TRY(progress(std::min(slab_rows, rows_out - s * slab_rows))); continue; }
            QK_TRY(ship(s));
            if (s >= 1) QK_TRY(deliver(s - 1)); /* while slab s computes and ships */
        }
        if (!dev_out) QK_TRY(deliver(n_slabs - 1));
        if (J->est) QK_CK(cudaStreamSynchronize(J->est));
        QK_CK(cudaStreamSynchronize(cs));
        QK_CK(cudaStreamSynchronize(xs));
        return stats();
    }
};

/* ======================================================================================== */
/* >>api ---- the extern "C" surface qk.h calls (qk_cuda_gram, qk_cuda_states, ...) ---- */
/* ======================================================================================== */

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
        cudaGetLastError();
        return QK_ERROR_NO_DEVICE;
    }
    memset(info, 0, sizeof *info);
    info->present = 1;
    memcpy(info->name, p.name, std::min(sizeof info->name, sizeof p.name) - 1);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->smem_per_block_optin = p.sharedMemPerBlockOptin;
    info->l2_bytes = (size_t)p.l2CacheSize;
    if (cudaDriverGetVersion(&info->driver_version) != cudaSuccess) { cudaGetLastError(); info->driver_version = 0; }
    info->wgmma = qk__wgmma_ok(device);
    e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMemGetInfo(&info->free_bytes, &info->total_bytes);
    if (e != cudaSuccess) {
        if (err) snprintf(err, err_size, "cudaMemGetInfo on device %d: %s", device, cudaGetErrorString(e));
        cudaGetLastError();
        return QK_ERROR_CUDA;
    }
    return QK_OK;
}

extern "C" int qk_cuda_host_pinned(const void *p)
{
    cudaPointerAttributes at;
    int pinned = p && cudaPointerGetAttributes(&at, p) == cudaSuccess && at.type == cudaMemoryTypeHost;
    cudaGetLastError();
    return pinned;
}

extern "C" void qk_cuda_host_lock(const void *p, size_t bytes, int *locked)
{
    int dev = 0, ro = 0;
    *locked = 0;
    if (!p || bytes == 0 || qk_cuda_host_pinned(p)) return;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, dev);
    cudaGetLastError();
    unsigned flags = cudaHostRegisterPortable | (ro ? cudaHostRegisterReadOnly : 0u);
    /* const: read-only registration only reads the pages (cudaHostRegister's pointer is not const) */
    cudaError_t e = cudaHostRegister(const_cast<void *>(p), bytes, flags);
    if (e != cudaSuccess && ro) { cudaGetLastError(); e = cudaHostRegister(const_cast<void *>(p), bytes, cudaHostRegisterPortable); }
    if (e == cudaSuccess) *locked = 1;
    cudaGetLastError();
}

extern "C" void qk_cuda_host_unlock(const void *p)
{
    if (p) cudaHostUnregister(const_cast<void *>(p));
    cudaGetLastError();
}

/* The checks of given device states (qk_gram_states, on_device), one block per row; the rows
   must be device memory of the current device. Pure states (DM false): out[s] the squared norm of
   row s, NaN for a row with a non-finite amplitude. Density matrices (DM true): out[3 s] the trace
   (NaN for a matrix with a non-finite entry), out[3 s + 1] the largest max(|Re rho_ab - Re
   rho_ba|, |Im rho_ab + Im rho_ba|), out[3 s + 2] the largest |rho_ab|. */
template <bool DM>
__global__ void __launch_bounds__(256) qk__k_state_check(const double *__restrict__ x, int64_t n, int64_t ld, int type, int64_t dim,
                                                        double *__restrict__ out)
{
    __shared__ double red[256];
    __shared__ int bad;
    const int64_t s = blockIdx.x;
    if (s >= n) return;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    const double *row = x + s * ld;
    const double nan = __longlong_as_double(0x7ff8000000000000LL);
    double acc = 0, dev = 0, mx = 0, re, im, re2, im2;
    for (int64_t k = threadIdx.x; k < (DM ? dim * dim : dim); k += blockDim.x) {
        qk__state_amp(row, type, k, &re, &im);
        if (!isfinite(re) || !isfinite(im)) bad = 1;
        if constexpr (!DM) {
            acc += re * re + im * im;
        } else {
            const int64_t a = k / dim, b = k - a * dim;
            mx = fmax(mx, re * re + im * im);
            if (a == b) acc += re;   /* the trace */
            if (b > a) {
                qk__state_amp(row, type, b * dim + a, &re2, &im2);
                dev = fmax(dev, fmax(fabs(re - re2), fabs(im + im2)));
            } else if (a == b) dev = fmax(dev, fabs(im + im));   /* the diagonal: real */
        }
    }
    const double sum = qk__block_sum256(red, acc);   /* its barriers also publish bad */
    if constexpr (!DM) {
        if (threadIdx.x == 0) out[s] = bad ? nan : sum;
    } else {
        const double hd = qk__block_max256(red, dev), m2 = qk__block_max256(red, mx);
        if (threadIdx.x == 0) {
            out[3 * s] = bad ? nan : sum;
            out[3 * s + 1] = hd;
            out[3 * s + 2] = sqrt(m2);
        }
    }
}

/* The device pointer checks of qk_cuda_state_norms, qk_cuda_state_dm_check and qk_cuda_state_hash:
   x is device (or managed) memory of the current device. */
static qk_result qk__states_on_this_device(const void *x, qk__err *E)
{
    cudaPointerAttributes at;
    int cur = -1;
    char msg[160];
    cudaGetDevice(&cur);
    if (cudaPointerGetAttributes(&at, x) != cudaSuccess || (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)) {
        cudaGetLastError();
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "the states are not CUDA device memory (on_device = 1)");
    }
    if (at.device != cur) {
        snprintf(msg, sizeof msg, "the states are on device %d, the engine runs on device %d", at.device, cur);
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, msg);
    }
    return QK_OK;
}

/* Runs qk__k_state_check<DM> over n rows of x into the host array out (1 or 3 doubles a row). */
static qk_result qk__state_check_run(bool dm, const void *x, int64_t n, int64_t ld, int type, int64_t dim, double *out, qk__err *E)
{
    const size_t bytes = (size_t)n * (dm ? 3 : 1) * sizeof(double);
    double *d = nullptr;
    char msg[160];
    QK_TRY(qk__states_on_this_device(x, E));
    QK_CK(cudaMalloc((void **)&d, bytes));
    if (dm) qk__k_state_check<true><<<(unsigned)n, 256>>>((const double *)x, n, ld, type, dim, d);
    else qk__k_state_check<false><<<(unsigned)n, 256>>>((const double *)x, n, ld, type, dim, d);
    cudaError_t ce = cudaGetLastError();
    if (ce == cudaSuccess) ce = cudaMemcpy(out, d, bytes, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (ce != cudaSuccess) {
        snprintf(msg, sizeof msg, "%s: %s", dm ? "qk__k_state_dm_check" : "qk__k_state_norms", cudaGetErrorString(ce));
        return qk__fail_msg(E, QK_ERROR_CUDA, msg);
    }
    return QK_OK;
}

extern "C" qk_result qk_cuda_state_dm_check(const void *x, int64_t n, int64_t ld, int type, int64_t dim, double *out, char *err,
                                            size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!x || n <= 0 || !out || dim < 1) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_state_dm_check: bad argument");
    return qk__state_check_run(true, x, n, ld, type, dim, out, E);
}

/* Pure device states as density matrices (qk_gram_states: a pure device side against device
   matrices): row i of x (ldx_bytes apart, dim amplitudes of type) into row i of out (ld_out
   elements of type apart) as |psi><psi|, entry (a, b) = psi_a conj(psi_b), the products in double
   without contraction, then rounded to type, as the host's qk__states_outer. */
__global__ void __launch_bounds__(256) qk__k_state_outer(const char *__restrict__ x, int64_t n, int64_t ldx_bytes, int type, int64_t dim,
                                                         char *__restrict__ out, int64_t ld_out)
{
    const int es = qk__state_esize(type);
    const int64_t d2 = dim * dim, total = n * d2;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t / d2, k = t - i * d2, a = k / dim, b = k - a * dim;
        const char *row = x + i * ldx_bytes;
        double ar, ai, br, bi;
        qk__state_amp(row, type, a, &ar, &ai);
        qk__state_amp(row, type, b, &br, &bi);
        const double re = __dadd_rn(__dmul_rn(ar, br), __dmul_rn(ai, bi)), im = __dsub_rn(__dmul_rn(ai, br), __dmul_rn(ar, bi));
        char *o = out + (i * ld_out + k) * es;
        switch (type) {
        case QK_STATE_C128: ((double *)o)[0] = re; ((double *)o)[1] = im; break;
        case QK_STATE_C64: ((float *)o)[0] = (float)re; ((float *)o)[1] = (float)im; break;
        case QK_STATE_F64: *(double *)o = re; break;
        default: *(float *)o = (float)re; break;
        }
    }
}

extern "C" qk_result qk_cuda_state_outer(const void *x, int64_t n, int64_t ldx_bytes, int type, int64_t dim, int64_t ld_out, void **out,
                                         char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    char msg[200];
    void *d = nullptr;
    if (!x || n <= 0 || dim < 1 || ld_out < dim * dim || !out) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_state_outer: bad argument");
    *out = nullptr;
    QK_TRY(qk__states_on_this_device(x, E));
    const size_t bytes = (size_t)n * (size_t)ld_out * (size_t)qk__state_esize(type);
    cudaError_t ce = cudaMalloc(&d, bytes);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        snprintf(msg, sizeof msg, "cannot allocate %.3g GB of device memory for the pure states as density matrices (%s)", (double)bytes * 1e-9,
                 cudaGetErrorString(ce));
        return qk__fail_msg(E, ce == cudaErrorMemoryAllocation ? QK_ERROR_DEVICE_OUT_OF_MEMORY : QK_ERROR_CUDA, msg);
    }
    const int64_t total = n * dim * dim;
    const unsigned g = (unsigned)std::min<int64_t>((total + 255) / 256, (int64_t)1 << 20);
    ce = cudaMemset(d, 0, bytes);   /* the rows' padding past dim^2 */
    if (ce == cudaSuccess) {
        qk__k_state_outer<<<g, 256>>>((const char *)x, n, ldx_bytes, type, dim, (char *)d, ld_out);
        ce = cudaGetLastError();
    }
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(0);   /* done before the engine's streams read it */
    if (ce != cudaSuccess) {
        cudaFree(d);
        snprintf(msg, sizeof msg, "qk__k_state_outer: %s", cudaGetErrorString(ce));
        return qk__fail_msg(E, QK_ERROR_CUDA, msg);
    }
    *out = d;
    return QK_OK;
}

extern "C" void qk_cuda_dev_free(void *p)
{
    if (p) cudaFree(p);
}

extern "C" qk_result qk_cuda_state_norms(const void *x, int64_t n, int64_t ld, int type, int64_t dim, double *norms, char *err,
                                         size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!x || n <= 0 || !norms) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_state_norms: bad argument");
    return qk__state_check_run(false, x, n, ld, type, dim, norms, E);
}

/* qk_cuda_state_hash: each thread adds mixes of its words (splitmix64's finaliser of (word,
   index in the row) xor a mix of the row), each warp's sum is added to *out: integer sums, so
   the result does not depend on the order. */
__device__ __forceinline__ unsigned long long qk__mix64(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void __launch_bounds__(256) qk__k_state_hash(const unsigned int *__restrict__ x, int64_t n, int64_t ld_words,
                                                        int64_t row_words, unsigned long long *out)
{
    unsigned long long acc = 0;
    const int64_t total = n * row_words;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t / row_words, k = t - i * row_words;
        const unsigned long long w = ((unsigned long long)x[i * ld_words + k] << 32) | (unsigned long long)(k & 0xffffffff);
        acc += qk__mix64(w ^ qk__mix64((unsigned long long)i + 0x9e3779b97f4a7c15ull));
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

extern "C" qk_result qk_cuda_state_hash(const void *x, int64_t n, int64_t ld, int64_t row_bytes, uint64_t *hash, char *err,
                                        size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    unsigned long long *d = nullptr, h = 0;
    char msg[160];
    if (!x || n <= 0 || !hash || row_bytes <= 0 || row_bytes % 4 != 0 || row_bytes > ld * 8)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_state_hash: bad argument");
    QK_TRY(qk__states_on_this_device(x, E));
    const int64_t words = n * (row_bytes / 4);
    const unsigned blocks = (unsigned)std::min<int64_t>((words + 255) / 256, 4096);
    QK_CK(cudaMalloc((void **)&d, sizeof *d));
    cudaError_t ce = cudaMemset(d, 0, sizeof *d);
    if (ce == cudaSuccess) {
        qk__k_state_hash<<<blocks, 256>>>((const unsigned int *)x, n, ld * 2, row_bytes / 4, d);
        ce = cudaGetLastError();
    }
    if (ce == cudaSuccess) ce = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (ce != cudaSuccess) {
        snprintf(msg, sizeof msg, "qk__k_state_hash: %s", cudaGetErrorString(ce));
        return qk__fail_msg(E, QK_ERROR_CUDA, msg);
    }
    *hash = (uint64_t)h;
    return QK_OK;
}

extern "C" qk_result qk_cuda_host_alloc(size_t bytes, void **p, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    *p = nullptr;
    QK_CK(cudaMallocHost(p, bytes ? bytes : 1));
    return QK_OK;
}

extern "C" void qk_cuda_host_free(void *p)
{
    if (p) cudaFreeHost(p);
    cudaGetLastError();
}

extern "C" qk_result qk_cuda_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, const qk_cuda_io *io,
                                  char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!plan || !map || !desc || !desc->x) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: NULL argument");
    if ((desc->output == QK_OUTPUT_DEVICE || desc->output == QK_OUTPUT_HOST) && !desc->out)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: out is NULL");
    if (plan->path != QK_PATH_ANALYTIC && map->n_qubits > QK_MAX_STATE_QUBITS)
        return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_gram: too many qubits for a state vector");
    /* the engine runs the job the plan was made for; a plan of another job is refused, not
       re-derived from the desc */
    if (plan->symmetric != (desc->y == nullptr) || plan->n_x != desc->n_x || plan->n_y != (desc->y ? desc->n_y : desc->n_x) ||
        plan->output != desc->output) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "qk_cuda_gram: the plan was made for another job (plan: %lld x %lld%s, output %d; desc: %lld x %lld%s, output %d)",
                 (long long)plan->n_x, (long long)plan->n_y, plan->symmetric ? " symmetric" : "", (int)plan->output,
                 (long long)desc->n_x, (long long)(desc->y ? desc->n_y : desc->n_x), desc->y ? "" : " symmetric", (int)desc->output);
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, msg);
    }
    if (io && (io->mirror_out || io->mrows)) {   /* the transpose as well: a rectangle to the host */
        const bool pinned = plan->output == QK_OUTPUT_HOST && plan->host_pinned;
        const char *bad = plan->output == QK_OUTPUT_DEVICE ? "a DEVICE output"
                          : plan->symmetric                 ? "a symmetric plan (K(X,X) mirrors itself)"
                          : io->mirror_out && !pinned       ? "mirror_out without a page-locked HOST output (plan.host_pinned)"
                          : !io->mirror_out && pinned       ? "mrows with a page-locked HOST output (mirror_out takes it)"
                          : io->mirror_out && io->mirror_ld < plan->n_x ? "mirror_ld below the job's rows"
                                                                        : nullptr;
        if (bad) {
            char msg[200];
            snprintf(msg, sizeof msg, "qk_cuda_gram: the transposed output (qk_cuda_io.mirror_out / mrows) with %s", bad);
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, msg);
        }
    }
    if (io && io->band_rows != 0) {   /* a symmetric job's first rows alone */
        const char *bad = !plan->symmetric                               ? "a plan of K(X,Y) (the band is K(X,X)'s)"
                          : io->band_rows < 0 || io->band_rows > plan->n_x ? "band_rows outside [0, n_x]"
                          : io->mirror_out || io->mrows                  ? "the transposed output (mirror_out / mrows)"
                                                                         : nullptr;
        if (bad) {
            char msg[200];
            snprintf(msg, sizeof msg, "qk_cuda_gram: the band of rows (qk_cuda_io.band_rows = %lld) with %s", (long long)io->band_rows, bad);
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, msg);
        }
    }
    qk_plan P = *plan; /* the plan this attempt runs: qk__plan_shrink makes the next one */
    if (qk__plan_engine(&P) == QK_GPU_ENGINE_COUNT)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: plan.engine is no qk_gpu_engine");
    if (P.linear && (P.path == QK_PATH_ANALYTIC || !qk__engine_blas(qk__plan_engine(&P))))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: plan.linear (density matrices) runs on the cuBLAS engines "
                                                          "(plan.engine CUBLAS or TC_*), whose epilogue keeps the inner product unsquared");
    int64_t delivered = 0;
    int shrinks = 0;
    char why[160] = "";
    const bool real = P.path == QK_PATH_REAL;
    const bool p64 = P.precision == QK_PRECISION_FP64;
    /* Out of device memory: retry from scratch with the planner's next smaller plan (nothing has
       reached the caller's output before a slab completes; a host output may be partly written,
       which the result code says). */
    for (;;) {
        qk__job_state J;
        J.E = E;
        J.plan = &P;
        J.map = map;
        J.desc = desc;
        J.rows = io ? io->rows : nullptr;
        J.rows_user = io ? io->rows_user : nullptr;
        J.stats = io ? io->stats : nullptr;
        J.prof = io ? io->prof : nullptr;
        J.cpool = io ? io->pool : nullptr;
        for (int i = 0; i < 2; ++i) J.io_stage[i] = io ? io->stage[i] : nullptr;
        J.io_stage_bytes = io ? io->stage_bytes : 0;
        J.fetch = io ? io->fetch : nullptr;
        J.fetch_user = io ? io->fetch_user : nullptr;
        J.mirror_out = io ? io->mirror_out : nullptr;
        J.mirror_ld = io ? io->mirror_ld : 0;
        J.mrows = io ? io->mrows : nullptr;
        J.mrows_user = io ? io->mrows_user : nullptr;
        J.band_rows = io ? io->band_rows : 0;
        J.delivered = &delivered;
        qk_result r;
        r = qk__dispatch(p64, !real, P.out_dtype == QK_F64, [&](auto ty) {
            typedef decltype(ty) Ty;
            return qk__pipe<typename Ty::T, Ty::CPLX, typename Ty::OutT>(&J).run();
        });
        qk__job_free(&J);
        if (r == QK_OK && io && io->stats) {
            io->stats->n_shrinks = shrinks;
            memcpy(io->stats->shrink_why, why, sizeof why);
        }
        if (r != QK_ERROR_DEVICE_OUT_OF_MEMORY || delivered > 0 || !qk__plan_shrink(&P)) return r;
        if (shrinks++ == 0) snprintf(why, sizeof why, "%s", err ? err : "");
    }
}

extern "C" qk_result qk_cuda_states(const qk_map *map, const double *x, int64_t n, qk_precision precision, double *out,
                                    char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!map || (!x && n > 0) || (!out && n > 0)) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_states: NULL argument");
    if (map->n_qubits > QK_MAX_STATE_QUBITS) return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_states: too many qubits");
    if (n == 0) return QK_OK;
    qk__prog pg;
    qk_map m2 = *map;
    if (m2.cls == QK_CLASS_PRODUCT) m2.cls = QK_CLASS_COMPLEX; /* build the state vector anyway */
    QK_TRY(qk__compile(&m2, &pg, E));
    qk__dprog dp;
    qk__build_ws ws;
    double *dx = nullptr, *dout = nullptr;
    void *st = nullptr;
    const int64_t D = (int64_t)1 << map->n_qubits;
    const bool p64 = precision == QK_PRECISION_FP64;
    const size_t cx = p64 ? 16 : 8, T = p64 ? 8 : 4;
    auto run = [&]() -> qk_result {
        QK_TRY(qk__dprog_make(pg, map, &dp, E));
        QK_CK(cudaMalloc((void **)&dx, std::max<size_t>(1, (size_t)n * map->n_features * sizeof(double))));
        QK_CK(cudaMemcpy(dx, x, (size_t)n * map->n_features * sizeof(double), cudaMemcpyHostToDevice));
        QK_CK(cudaMalloc(&ws.params, (size_t)n * pg.P * T));
        if (pg.passes.size() > 1) QK_CK(cudaMalloc(&ws.tmp, (size_t)n * D * cx));
        if (pg.has_amp) QK_CK(cudaMalloc((void **)&ws.inv, (size_t)n * sizeof(double)));
        QK_CK(cudaMalloc(&st, (size_t)n * D * cx));
        QK_CK(cudaMalloc((void **)&dout, (size_t)n * D * 2 * sizeof(double)));
        QK_TRY(qk__dispatch(p64, false, false, [&](auto ty) {
            typedef typename decltype(ty)::T Tv;
            QK_TRY(qk__build_states<Tv>(pg, dp, dx, n, ws, st, false, 0, E));
            return qk__launch_widen<Tv>((const qk__cx<Tv> *)st, dout, n * D, 0, E);
        }));
        QK_CK(cudaMemcpy(out, dout, (size_t)n * D * 2 * sizeof(double), cudaMemcpyDeviceToHost));
        return QK_OK;
    };
    qk_result r = run();
    qk__dprog_free(&dp);
    cudaFree(dx); cudaFree(dout); cudaFree(st);
    cudaFree(ws.params); cudaFree(ws.tmp); cudaFree(ws.inv);
    return r;
}
/* ======================================================================================== */
/* >>tune ---- the autotuner (qk_cuda_tune_gram) ---- */
/* ======================================================================================== */

/* Tuning operands: uniform in [-1, 1) from a hash of the index (no state, reproducible). */
template <typename T>
__global__ void qk__k_fill_random(T *p, int64_t count, uint32_t seed)
{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= count) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 16; h *= 0x7feb352dU; h ^= h >> 15; h *= 0x846ca68bU; h ^= h >> 16;
    p[i] = (T)h * ((T)2 / (T)4294967296.0) - (T)1;
}

template <typename T>
static qk_result qk__launch_fill_random(T *p, int64_t count, uint32_t seed, cudaStream_t st, qk__err *E)
{
    qk__k_fill_random<T><<<(unsigned)((count + 255) / 256), 256, 0, st>>>(p, count, seed);
    QK_LAUNCH_CK("qk__k_fill_random");
    return QK_OK;
}

struct qk__tune_ws {
    void *S = nullptr, *K = nullptr, *Cw = nullptr;
    cublasHandle_t h = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    ~qk__tune_ws() {
        cudaFree(S); cudaFree(K); cudaFree(Cw);
        if (h) cublasDestroy(h);
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
        cudaGetLastError();
    }
};


template <typename T, bool CPLX, typename OutT>
static qk_result qk__tune(const qk_plan *pl, int64_t n, int reps, qk_cuda_tune_result *res, qk__err *E)
{
    const int D = 1 << pl->n_qubits;
    const size_t es = CPLX ? 2 * sizeof(T) : sizeof(T);
    const qk_gpu_engine tcm = pl->n_qubits <= QK__TC_MAX_QUBITS ? qk__tc_engine(pl->precision, 1) : QK_GPU_FUSED;
    /* the fused tensor-core kernel (configurations 1 and 2; FP32X3: 2) beside its cuBLAS engine:
       float states, and TF32 / FP16 (unflushed) only up to QK__TCF_NOFLUSH_MAX_QUBITS */
    const qk_gpu_engine tcf = sizeof(T) == 4 && (tcm == QK_GPU_TC_FP32X3 || pl->n_qubits <= QK__TCF_NOFLUSH_MAX_QUBITS)
                              ? qk__engine_tcf_of(tcm) : QK_GPU_FUSED;
    const size_t tcf_bytes = tcf != QK_GPU_FUSED ? (size_t)n * (size_t)qk__tcf_geometry(tcf, D, CPLX).ldw * 4 : 0;
    const size_t ws_bytes = std::max(qk__blas_ws_bytes<T, CPLX>(tcm != QK_GPU_FUSED ? tcm : QK_GPU_CUBLAS, n, n, D), tcf_bytes);
    qk__tune_ws w;
    QK_CK(cudaMalloc(&w.S, (size_t)n * D * es));
    QK_CK(cudaMalloc(&w.K, (size_t)n * n * sizeof(OutT)));
    QK_CK(cudaMalloc(&w.Cw, ws_bytes));
    QK_BLAS_CK(cublasCreate(&w.h));
    QK_CK(cudaEventCreate(&w.e0));
    QK_CK(cudaEventCreate(&w.e1));
    const int64_t cnt = (int64_t)n * D * (CPLX ? 2 : 1);
    QK_TRY(qk__launch_fill_random<T>((T *)w.S, cnt, 12345u, 0, E));
    res->n = 0;
    for (int c = 1; c <= QK__N_FUSED_CFG; ++c)
        if (qk__fused_cfg_kept(c)) { res->blas[res->n] = QK_GPU_FUSED; res->cfg[res->n] = c; res->n++; }
    res->blas[res->n] = QK_GPU_CUBLAS; res->cfg[res->n] = 0; res->n++;
    if (CPLX && sizeof(T) == 4) { res->blas[res->n] = QK_GPU_CUBLAS_3M; res->cfg[res->n] = 0; res->n++; }
    if (tcm != QK_GPU_FUSED) { res->blas[res->n] = tcm; res->cfg[res->n] = 0; res->n++; }
    for (int c = 1; tcf != QK_GPU_FUSED && c <= (tcf == QK_GPU_TCF_FP32X3 ? 1 : 2); ++c) {
        res->blas[res->n] = tcf; res->cfg[res->n] = tcf == QK_GPU_TCF_FP32X3 ? 2 : c; res->n++;
    }
    int dev = 0;
    if (tcf != QK_GPU_FUSED && tcf != QK_GPU_TCF_TF32 && cudaGetDevice(&dev) == cudaSuccess && qk__wgmma_ok(dev)) {
        res->blas[res->n] = tcf; res->cfg[res->n] = 4; res->n++;   /* the wgmma kernel (>>wgmma) */
    }
    OutT *K = (OutT *)w.K;
    for (int c = 0; c < res->n; ++c) {
        std::vector<double> t;
        for (int r = 0; r < reps + 1; ++r) {
            QK_CK(cudaEventRecord(w.e0, 0));
            if (qk__engine_tcf((qk_gpu_engine)res->blas[c]))
                QK_TRY((qk__tune_tcf<T, CPLX, OutT>((qk_gpu_engine)res->blas[c], res->cfg[c], w.S, n, D, w.Cw, ws_bytes, K, E)));
            else if (res->blas[c] != QK_GPU_FUSED) QK_TRY((qk__launch_blas<T, CPLX, OutT>(w.h, (qk_gpu_engine)res->blas[c], w.S, w.S, n, n, D, w.Cw, K, n, K, 0, 1, 0, E)));
            else QK_TRY((qk__launch_gram<T, CPLX, OutT>(res->cfg[c], w.S, w.S, n, n, D, K, n, K, 0, 1, 0, E)));
            QK_CK(cudaEventRecord(w.e1, 0));
            QK_CK(cudaEventSynchronize(w.e1));
            float ms = 0;
            QK_CK(cudaEventElapsedTime(&ms, w.e0, w.e1));
            if (r > 0) t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        res->ms[c] = t[t.size() / 2];
    }
    res->best = 0;
    for (int c = 1; c < res->n; ++c) if (res->ms[c] < res->ms[res->best]) res->best = c;
    return QK_OK;
}

extern "C" qk_result qk_cuda_tune_gram(const qk_plan *plan, int64_t n_samples, int reps, qk_cuda_tune_result *res,
                                       char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!plan || !res) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_tune_gram: NULL argument");
    memset(res, 0, sizeof *res);
    if (plan->path == QK_PATH_ANALYTIC || plan->n_qubits > 20)
        return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "qk_cuda_tune_gram: nothing to tune for this path/size");
    int64_t n = n_samples > 0 ? n_samples : 4096;
    if (plan->n_x > 0 && n > plan->n_x) n = plan->n_x;
    if (reps < 1) reps = 3;
    res->n_samples = n;
    return qk__dispatch(plan->precision == QK_PRECISION_FP64, plan->path != QK_PATH_REAL, plan->out_dtype == QK_F64,
                        [&](auto ty) {
                            typedef decltype(ty) Ty;
                            return qk__tune<typename Ty::T, Ty::CPLX, typename Ty::OutT>(plan, n, reps, res, E);
                        });
}

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

/* >>mps ---- the MPS path: batched transfer-matrix contraction of padded site tensors ---- */
/* K on the MPS path. qk.h builds every sample's MPS on the host (its exact builder, or the
   truncating one) and hands the site tensors over, padded to a bond of chi on both sides:
   site s of sample i is A[l][a][r] (l, r < chi, a < 2), entry e = (l * 2 + a) * chi + r, and the
   device layout is [site][entry][sample] (complex T2), so a block that needs entry e of 32
   consecutive samples reads 32 consecutive values. Zero padding is exact: padded entries add
   nothing to any product, and E starts as the 1 x 1 identity in its [0][0] corner.

   One overlap <a|b> is E = 1; per site T[l][a][r'] = sum_l' E[l][l'] B[l'][a][r'],
   E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a][r']; K = |E[0][0]|^2 after the last site:
   4 chi^3 complex multiply-adds per site and pair.

   Two kernels:
     qk__mps_reg<T, CHI>   chi <= 4 (padded to CHI = 2 or 4): one thread per pair, E and E' in
                           registers (2 x CHI^2 complex: 64 floats at CHI = 4), a block of 8 x 32
                           pairs (rows x columns of K); per site the block stages the 8 row and
                           32 column tensors in shared memory ([entry][sample]: a warp is one row
                           and 32 columns, so A is a broadcast and B 32 consecutive values, no bank
                           conflicts), the next site's tensors are loaded into registers while
                           this one is contracted. Per site and block: (8 + 32) x 2 CHI^2 complex
                           from L2 for 256 pairs x 4 CHI^3 multiply-adds.
     qk__mps_warp<T>       any chi up to QK_MPS_MAX_BOND: one warp per pair, E and T in shared
                           memory (3 chi^2 complex per warp), lanes split the entries of T and E';
                           the tensors are read from global memory (L1/L2).
   Both compute the pairs of a slab of rows; K(X,X) with K resident computes the pairs j >= i only
   and writes the mirror K[j][i] too. Precision: T = float (fp32) or double (fp64), K written in
   the output dtype. */
template <typename T> struct qk__mps_t2;
template <> struct qk__mps_t2<float> { typedef float2 t; };
template <> struct qk__mps_t2<double> { typedef double2 t; };

#define QK__MPS_TM 8    /* rows of K per block of the register kernel (blockDim.y) */
#define QK__MPS_TN 32   /* columns (blockDim.x: one warp) */

/* Arguments of one slab launch. */
template <typename T, typename OutT> struct qk__mps_args {
    const typename qk__mps_t2<T>::t *A, *B;   /* [site][entry][sample] */
    int64_t na, nb;                          /* samples in A and B (their leading dimension) */
    int q, chi;
    int64_t row0, rows;                      /* the slab: rows [row0, row0 + rows) of K */
    OutT *K;                                 /* row i of K at K + (i - krow0) * ldk */
    int64_t ldk, krow0;
    int sym;                                 /* 1: pairs j >= i only, mirror written (K resident) */
};

template <typename T, typename OutT>
__device__ __forceinline__ void qk__mps_store(const qk__mps_args<T, OutT> &g, int64_t i, int64_t j, T re, T im)
{
    const double v = (double)re * (double)re + (double)im * (double)im;
    if (g.sym) {
        if (j < i) return;
        g.K[(i - g.krow0) * g.ldk + j] = (OutT)v;
        if (j > i) g.K[(j - g.krow0) * g.ldk + i] = (OutT)v;
    } else {
        g.K[(i - g.krow0) * g.ldk + j] = (OutT)v;
    }
}

template <typename T, int CHI, typename OutT>
__global__ void __launch_bounds__(QK__MPS_TM * QK__MPS_TN)
qk__mps_reg(qk__mps_args<T, OutT> g)
{
    typedef typename qk__mps_t2<T>::t C;
    constexpr int E = 2 * CHI * CHI;                      /* entries per site */
    constexpr int NT = QK__MPS_TM * QK__MPS_TN;
    constexpr int LA = (E * QK__MPS_TM + NT - 1) / NT;    /* per-thread loads of A, B per site */
    constexpr int LB = (E * QK__MPS_TN + NT - 1) / NT;
    __shared__ C sA[E][QK__MPS_TM];
    __shared__ C sB[E][QK__MPS_TN];
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * QK__MPS_TN + tx;
    const int64_t i0 = g.row0 + (int64_t)blockIdx.y * QK__MPS_TM, j0 = (int64_t)blockIdx.x * QK__MPS_TN;
    const int64_t rend = g.row0 + g.rows;
    if (g.sym && j0 + QK__MPS_TN - 1 < i0) return;        /* wholly below the diagonal (block-uniform) */
    const int64_t i = i0 + ty, j = j0 + tx;
    C ra[LA], rb[LB];
    auto load = [&](int s) {
#pragma unroll
        for (int k = 0; k < LA; ++k) {
            const int x = tid + k * NT, e = x / QK__MPS_TM, r = x % QK__MPS_TM;
            C v; v.x = 0; v.y = 0;
            if (x < E * QK__MPS_TM && i0 + r < rend) v = g.A[((int64_t)s * E + e) * g.na + i0 + r];
            ra[k] = v;
        }
#pragma unroll
        for (int k = 0; k < LB; ++k) {
            const int x = tid + k * NT, e = x / QK__MPS_TN, c = x % QK__MPS_TN;
            C v; v.x = 0; v.y = 0;
            if (x < E * QK__MPS_TN && j0 + c < g.nb) v = g.B[((int64_t)s * E + e) * g.nb + j0 + c];
            rb[k] = v;
        }
    };
    auto stage = [&]() {
#pragma unroll
        for (int k = 0; k < LA; ++k) {
            const int x = tid + k * NT;
            if (x < E * QK__MPS_TM) sA[x / QK__MPS_TM][x % QK__MPS_TM] = ra[k];
        }
#pragma unroll
        for (int k = 0; k < LB; ++k) {
            const int x = tid + k * NT;
            if (x < E * QK__MPS_TN) sB[x / QK__MPS_TN][x % QK__MPS_TN] = rb[k];
        }
    };
    T er[CHI][CHI], ei[CHI][CHI];   /* E[l][l'] */
#pragma unroll
    for (int l = 0; l < CHI; ++l)
#pragma unroll
        for (int m = 0; m < CHI; ++m) { er[l][m] = (l == 0 && m == 0) ? (T)1 : (T)0; ei[l][m] = 0; }
    load(0);
    stage();
    __syncthreads();
    for (int s = 0; s < g.q; ++s) {
        if (s + 1 < g.q) load(s + 1);   /* in flight during this site's arithmetic */
        T nr[CHI][CHI], ni[CHI][CHI];   /* E'[r][r'] */
#pragma unroll
        for (int r = 0; r < CHI; ++r)
#pragma unroll
            for (int m = 0; m < CHI; ++m) { nr[r][m] = 0; ni[r][m] = 0; }
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int rp = 0; rp < CHI; ++rp) {
                T tr[CHI], ti[CHI];
                C b[CHI];
#pragma unroll
                for (int lp = 0; lp < CHI; ++lp) b[lp] = sB[(lp * 2 + a) * CHI + rp][tx];
#pragma unroll
                for (int l = 0; l < CHI; ++l) {   /* t = E b */
                    T xr = 0, xi = 0;
#pragma unroll
                    for (int lp = 0; lp < CHI; ++lp) {
                        xr = fma(er[l][lp], b[lp].x, xr); xr = fma(-ei[l][lp], b[lp].y, xr);
                        xi = fma(er[l][lp], b[lp].y, xi); xi = fma(ei[l][lp], b[lp].x, xi);
                    }
                    tr[l] = xr; ti[l] = xi;
                }
#pragma unroll
                for (int r = 0; r < CHI; ++r)
#pragma unroll
                    for (int l = 0; l < CHI; ++l) {   /* E'[r][rp] += conj(A[l][a][r]) t[l] */
                        const C av = sA[(l * 2 + a) * CHI + r][ty];
                        nr[r][rp] = fma(av.x, tr[l], nr[r][rp]); nr[r][rp] = fma(av.y, ti[l], nr[r][rp]);
                        ni[r][rp] = fma(av.x, ti[l], ni[r][rp]); ni[r][rp] = fma(-av.y, tr[l], ni[r][rp]);
                    }
            }
#pragma unroll
        for (int r = 0; r < CHI; ++r)
#pragma unroll
            for (int m = 0; m < CHI; ++m) { er[r][m] = nr[r][m]; ei[r][m] = ni[r][m]; }
        __syncthreads();                 /* every thread is done with this site's tiles */
        if (s + 1 < g.q) {
            stage();
            __syncthreads();
        }
    }
    if (i < rend && j < g.nb) qk__mps_store(g, i, j, er[0][0], ei[0][0]);
}

/* One warp per pair; blockDim.x = 32 * warps per block; dynamic shared memory 3 chi^2 complex per
   warp (E, then T of 2 chi^2). Pairs of the slab in row-major order, a grid-stride loop. */
template <typename T, typename OutT>
__global__ void qk__mps_warp(qk__mps_args<T, OutT> g)
{
    typedef typename qk__mps_t2<T>::t C;
    extern __shared__ unsigned char qk__mps_smem[];
    const int chi = g.chi, E = 2 * chi * chi, lane = threadIdx.x & 31, w = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    C *Em = (C *)qk__mps_smem + (size_t)w * 3 * chi * chi, *Tm = Em + chi * chi;
    const int64_t npairs = g.rows * g.nb;
    for (int64_t p = (int64_t)blockIdx.x * wpb + w; p < npairs; p += (int64_t)gridDim.x * wpb) {
        const int64_t i = g.row0 + p / g.nb, j = p % g.nb;
        if (g.sym && j < i) continue;   /* warp-uniform */
        for (int e = lane; e < chi * chi; e += 32) { Em[e].x = e == 0 ? (T)1 : (T)0; Em[e].y = 0; }
        __syncwarp();
        for (int s = 0; s < g.q; ++s) {
            const C *As = g.A + (int64_t)s * E * g.na + i, *Bs = g.B + (int64_t)s * E * g.nb + j;
            for (int o = lane; o < 2 * chi * chi; o += 32) {   /* T[l][c] = sum_l' E[l][l'] B[l'][c], c = a chi + r' */
                const int l = o / (2 * chi), c = o % (2 * chi);
                T xr = 0, xi = 0;
                for (int lp = 0; lp < chi; ++lp) {
                    const C ev = Em[l * chi + lp], bv = Bs[(int64_t)(lp * 2 * chi + c) * g.nb];
                    xr = fma(ev.x, bv.x, xr); xr = fma(-ev.y, bv.y, xr);
                    xi = fma(ev.x, bv.y, xi); xi = fma(ev.y, bv.x, xi);
                }
                Tm[o].x = xr; Tm[o].y = xi;
            }
            __syncwarp();
            for (int o = lane; o < chi * chi; o += 32) {   /* E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a chi + r'] */
                const int r = o / chi, rp = o % chi;
                T xr = 0, xi = 0;
                for (int la = 0; la < 2 * chi; ++la) {
                    const C av = As[(int64_t)(la * chi + r) * g.na], tv = Tm[la * chi + rp];
                    xr = fma(av.x, tv.x, xr); xr = fma(av.y, tv.y, xr);
                    xi = fma(av.x, tv.y, xi); xi = fma(-av.y, tv.x, xi);
                }
                Em[o].x = xr; Em[o].y = xi;
            }
            __syncwarp();
        }
        if (lane == 0) qk__mps_store(g, i, j, Em[0].x, Em[0].y);
        __syncwarp();
    }
}

/* Launches one slab. */
template <typename T, typename OutT>
static qk_result qk__mps_launch(const qk__mps_args<T, OutT> &g, int chi_pad, int sm_count, cudaStream_t st, qk__err *E)
{
    if (chi_pad <= 4) {
        dim3 blk(QK__MPS_TN, QK__MPS_TM), grd((unsigned)((g.nb + QK__MPS_TN - 1) / QK__MPS_TN), (unsigned)((g.rows + QK__MPS_TM - 1) / QK__MPS_TM));
        if (chi_pad <= 2) qk__mps_reg<T, 2, OutT><<<grd, blk, 0, st>>>(g);
        else qk__mps_reg<T, 4, OutT><<<grd, blk, 0, st>>>(g);
        QK_LAUNCH_CK("qk__mps_reg");
        return QK_OK;
    }
    const size_t per = (size_t)3 * chi_pad * chi_pad * sizeof(typename qk__mps_t2<T>::t);
    int wpb = (int)std::min<size_t>(8, (size_t)(96 << 10) / per);
    if (wpb < 1) wpb = 1;
    if (per * wpb > (48 << 10)) QK_CK(cudaFuncSetAttribute(qk__mps_warp<T, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(per * wpb)));
    int64_t blocks = (g.rows * g.nb + wpb - 1) / wpb, cap = (int64_t)(sm_count > 0 ? sm_count : 132) * 64;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    qk__mps_warp<T, OutT><<<(unsigned)blocks, 32 * wpb, per * wpb, st>>>(g);
    QK_LAUNCH_CK("qk__mps_warp");
    return QK_OK;
}

/* Device buffers and streams of one MPS Gram, released in every case: the context's pool's
   (qk_cuda_io.pool, borrowed when idle on this GPU: its streams, and its buffers by role: the
   MPS of A and B in the states' roles, K or its slab ring in K's and the workspace ring's) are
   kept for later calls, the others freed. */
struct qk__mps_res {
    void *A = nullptr, *B = nullptr, *K = nullptr, *Kr[2] = {nullptr, nullptr}, *stage = nullptr;
    cudaStream_t cs = nullptr, ds = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr}, t0 = nullptr, t1 = nullptr;
    qk_cuda_pool *lent = nullptr;
    unsigned pooled = 0;
    cudaError_t buf(int role, void **p, size_t bytes) { return qk__pool_buf(lent, &pooled, role, p, bytes); }
    void drop(int role, void *p) { if (!(pooled & (1u << role))) cudaFree(p); }
    ~qk__mps_res()
    {
        if (cs) cudaStreamSynchronize(cs);
        if (ds) cudaStreamSynchronize(ds);
        drop(QK__PB_SA, A); drop(QK__PB_SB, B); drop(QK__PB_KD, K); drop(QK__PB_CW0, Kr[0]); drop(QK__PB_CW1, Kr[1]);
        if (stage) cudaFreeHost(stage);
        if (!lent) {
            if (cs) cudaStreamDestroy(cs);
            if (ds) cudaStreamDestroy(ds);
        }
        for (int k = 0; k < 2; ++k) if (ev[k]) cudaEventDestroy(ev[k]);
        if (t0) cudaEventDestroy(t0);
        if (t1) cudaEventDestroy(t1);
        qk__pool_return(lent);
        cudaGetLastError();
    }
};

/* Uploads n samples of packed doubles as T2 (fp32: converted on the host in chunks), on st, the
   stream whose kernels read them, and waited for: a plain cudaMemcpy runs on the legacy stream,
   which does not order the job's non-blocking streams, and from pageable memory it may return
   before its DMA has landed (the kernels then read a half-written slab). */
template <typename T>
static qk_result qk__mps_upload(qk__mps_res &R, int role, const double *src, size_t values, void **dst, cudaStream_t st, qk__err *E)
{
    QK_CK(R.buf(role, dst, values * sizeof(T)));
    if (sizeof(T) == sizeof(double)) {
        QK_CK(cudaMemcpyAsync(*dst, src, values * sizeof(double), cudaMemcpyHostToDevice, st));
        QK_CK(cudaStreamSynchronize(st));
        return QK_OK;
    }
    const size_t chunk = (size_t)8 << 20;   /* values per step: 32 MB of floats */
    std::vector<float> buf(std::min(chunk, values));
    for (size_t o = 0; o < values; o += chunk) {
        const size_t m = std::min(chunk, values - o);
        for (size_t k = 0; k < m; ++k) buf[k] = (float)src[o + k];
        QK_CK(cudaMemcpyAsync((float *)*dst + o, buf.data(), m * sizeof(float), cudaMemcpyHostToDevice, st));
        QK_CK(cudaStreamSynchronize(st));   /* buf is refilled next */
    }
    return QK_OK;
}

template <typename T, typename OutT>
static qk_result qk__mps_gram_t(const qk_plan *plan, const qk_gram_desc *desc, const qk_cuda_mps *m, const qk_cuda_io *io, qk__err *E)
{
    typedef typename qk__mps_t2<T>::t C;
    qk__mps_res R;
    const int64_t nx = m->n_a, ny = m->b ? m->n_b : m->n_a;
    const bool sym = m->b == nullptr, dev_out = desc->output == QK_OUTPUT_DEVICE;
    const size_t per = (size_t)m->n_sites * 2 * m->chi * m->chi;   /* complex values per sample */
    int dev = 0, sms = 0;
    QK_CK(cudaGetDevice(&dev));
    QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if ((R.lent = qk__pool_borrow(io ? io->pool : nullptr))) {   /* the context's streams, kept across calls */
        R.cs = R.lent->st[0];
        R.ds = R.lent->st[1];
    } else {
        QK_CK(cudaStreamCreateWithFlags(&R.cs, cudaStreamNonBlocking));
        QK_CK(cudaStreamCreateWithFlags(&R.ds, cudaStreamNonBlocking));
    }
    QK_CK(cudaEventCreate(&R.ev[0]));
    QK_CK(cudaEventCreate(&R.ev[1]));
    QK_CK(cudaEventCreate(&R.t0));
    QK_CK(cudaEventCreate(&R.t1));
    QK_TRY(qk__mps_upload<T>(R, QK__PB_SA, m->a, per * 2 * (size_t)nx, &R.A, R.cs, E));
    if (!sym) QK_TRY(qk__mps_upload<T>(R, QK__PB_SB, m->b, per * 2 * (size_t)ny, &R.B, R.cs, E));
    qk__mps_args<T, OutT> g;
    g.A = (const C *)R.A;
    g.B = (const C *)(sym ? R.A : R.B);
    g.na = nx;
    g.nb = ny;
    g.q = m->n_sites;
    g.chi = m->chi;
    QK_CK(cudaEventRecord(R.t0, R.cs));
    int64_t done = 0;
    auto progress = [&](int64_t rows) -> qk_result {
        done += rows * ny;
        if (desc->progress && desc->progress(done, nx * ny, desc->progress_user))
            return qk__fail_msg(E, QK_ERROR_CANCELLED, "progress callback cancelled the Gram");
        return QK_OK;
    };
    if (dev_out) {
        /* K straight into the caller's buffer, one slab per plan->slab_rows rows (progress) */
        const int64_t S = plan->slab_rows > 0 ? plan->slab_rows : nx;
        g.K = (OutT *)desc->out;
        g.ldk = desc->ld_out ? desc->ld_out : ny;
        g.krow0 = 0;
        g.sym = sym;
        for (int64_t r0 = 0; r0 < nx; r0 += S) {
            g.row0 = r0;
            g.rows = std::min(S, nx - r0);
            QK_TRY((qk__mps_launch<T, OutT>(g, m->chi, sms, R.cs, E)));
            QK_CK(cudaStreamSynchronize(R.cs));
            QK_TRY(progress(g.rows));
        }
    } else {
        /* host outputs: slabs of full rows to io->rows through pinned staging; K resident when
           the plan says so (K(X,X): the pairs j >= i, mirrored, so slab s is whole once slabs
           0..s ran), else a ring of two device slabs of full rows */
        const int64_t S = plan->slab_rows > 0 ? std::min(plan->slab_rows, nx) : nx;
        const size_t slab_bytes = (size_t)S * (size_t)ny * sizeof(OutT);
        const bool resident = plan->k_resident != 0;
        if (!io || !io->rows) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: no rows callback for a host output");
        if (resident) QK_CK(R.buf(QK__PB_KD, &R.K, (size_t)nx * (size_t)ny * sizeof(OutT)));
        else {
            QK_CK(R.buf(QK__PB_CW0, &R.Kr[0], slab_bytes));
            QK_CK(R.buf(QK__PB_CW1, &R.Kr[1], slab_bytes));
        }
        void *stage = io->stage[0] && io->stage_bytes >= slab_bytes ? io->stage[0] : nullptr;
        if (!stage) { QK_CK(cudaMallocHost(&R.stage, slab_bytes)); stage = R.stage; }
        const int64_t ns = (nx + S - 1) / S;
        auto launch = [&](int64_t s) -> qk_result {
            g.row0 = s * S;
            g.rows = std::min(S, nx - g.row0);
            if (resident) { g.K = (OutT *)R.K; g.krow0 = 0; g.sym = sym; }
            else { g.K = (OutT *)R.Kr[s & 1]; g.krow0 = g.row0; g.sym = 0; }
            g.ldk = ny;
            QK_TRY((qk__mps_launch<T, OutT>(g, m->chi, sms, R.cs, E)));
            QK_CK(cudaEventRecord(R.ev[s & 1], R.cs));
            return QK_OK;
        };
        QK_TRY(launch(0));
        for (int64_t s = 0; s < ns; ++s) {
            const int64_t r0 = s * S, rows = std::min(S, nx - r0);
            if (s + 1 < ns) QK_TRY(launch(s + 1));   /* computes while slab s goes out */
            QK_CK(cudaStreamWaitEvent(R.ds, R.ev[s & 1], 0));
            const OutT *src = resident ? (const OutT *)R.K + (size_t)r0 * (size_t)ny : (const OutT *)R.Kr[s & 1];
            QK_CK(cudaMemcpyAsync(stage, src, (size_t)rows * (size_t)ny * sizeof(OutT), cudaMemcpyDeviceToHost, R.ds));
            QK_CK(cudaStreamSynchronize(R.ds));
            qk_result r = io->rows(r0, rows, stage, ny, io->rows_user);
            if (r != QK_OK) { cudaStreamSynchronize(R.cs); if (E->buf && E->size) E->buf[0] = 0; return r; }
            r = progress(rows);
            if (r != QK_OK) { cudaStreamSynchronize(R.cs); return r; }
        }
    }
    QK_CK(cudaEventRecord(R.t1, R.cs));
    QK_CK(cudaEventSynchronize(R.t1));
    if (io && io->stats) {
        float ms = 0;
        QK_CK(cudaEventElapsedTime(&ms, R.t0, R.t1));
        io->stats->gram_ms = ms;
        io->stats->n_streams = 2;
        io->stats->n_slabs = (int)((nx + (plan->slab_rows > 0 ? plan->slab_rows : nx) - 1) / (plan->slab_rows > 0 ? plan->slab_rows : nx));
    }
    return QK_OK;
}

extern "C" qk_result qk_cuda_mps_gram(const qk_plan *plan, const qk_gram_desc *desc, const qk_cuda_mps *mps,
                                      const qk_cuda_io *io, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!plan || !desc || !mps || !mps->a) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: NULL argument");
    if (mps->n_sites < 1 || mps->chi < 1 || mps->chi > 64 || mps->n_a < 1 || (mps->b && mps->n_b < 1))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: bad MPS shape");
    if (io && (io->mirror_out || io->mrows))   /* the MPS path runs on one GPU: no rectangle parts */
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: the transposed output (qk_cuda_io.mirror_out / mrows) is "
                                                          "qk_cuda_gram's only");
    if (io && io->band_rows)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_mps_gram: a band of rows (qk_cuda_io.band_rows) is qk_cuda_gram's only");
    const bool p64 = plan->precision == QK_PRECISION_FP64 || plan->precision == QK_PRECISION_FP32X3;
    const bool o64 = plan->out_dtype == QK_F64;
    if (p64) return o64 ? qk__mps_gram_t<double, double>(plan, desc, mps, io, E) : qk__mps_gram_t<double, float>(plan, desc, mps, io, E);
    return o64 ? qk__mps_gram_t<float, double>(plan, desc, mps, io, E) : qk__mps_gram_t<float, float>(plan, desc, mps, io, E);
}
/* ---- end MPS engine ---- */
/* ======================================================================================== */
/* >>vjp ---- qk_cuda_gram_vjp: the gradient of a loss of K for every weight on the GPU ---- */
/* ======================================================================================== */
/* The CPU's qk_gram_vjp (vjp.c, docs/gradients.md) on one GPU, fp64:
   1. the states A (and B) on the device (qk__build_states: rows of D amplitudes, complex
      interleaved or, for real maps, real);
   2. conj(S) = B^H A with cuBLAS (K(X,X): ZHERK / DSYRK, one triangle), read as row-major
      nx x ny: entry (i, j) = conj(S_ij) = <b_j|a_i>;
   3. one elementwise kernel: K = |S|^2 and W = G' o conj(S) (G' = G + G^T for K(X,X)), W in
      place of S for K(X,Y);
   4. the adjoint vectors with cuBLAS: lam = W B (rows), mu = W^H A (rows; K(X,Y));
   5. the adjoint sweeps: one block per sample walks the map's ops from the last to the first on
      its state s and adjoint vector l (in shared memory where both fit, else in place in global
      memory), each weighted op's angle derivative -Im <Gen s|l> (P: 2 Im <Pi_1 s|l>) summed by
      the block in a fixed order, times dt/dw, added to the sample's row of an n x P buffer by
      one thread in op order; then each weight's column summed over the samples in a fixed order.
   Every sum has a fixed order (cuBLAS's fp64 products are deterministic on one device, the block
   reductions' shapes depend on D only), so the gradient and K are the same bits run to run. */

#define QK__VJP_TPB 256 /* threads of a sweep block (the reduction's shape: fixed) */

/* K and W from conj(S) (row-major nx x ny, K(X,X): entries (r, c) with c <= r valid) and G
   (row-major, ld ny). W may be Sb (K(X,Y)). */
template <bool CPLX>
__global__ void qk__k_vjp_w(const double *Sb, double *W, double *K, const double *__restrict__ G, int64_t nx, int64_t ny, int sym)
{
    const int64_t tot = nx * ny;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < tot; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / ny, c = e % ny;
        double vr, vi = 0.0, g;
        if (sym) {
            const bool low = c <= i;
            const int64_t at = low ? e : c * ny + i;
            if (CPLX) { vr = Sb[2 * at]; vi = low ? Sb[2 * at + 1] : -Sb[2 * at + 1]; }
            else vr = Sb[at];
            if (c == i) vi = 0.0; /* S_ii is real */
            g = G[e] + G[c * ny + i];
        } else {
            if (CPLX) { vr = Sb[2 * e]; vi = Sb[2 * e + 1]; }
            else vr = Sb[e];
            g = G[e];
        }
        if (K) K[e] = vr * vr + vi * vi;
        if (W) {
            if (CPLX) { W[2 * e] = g * vr; W[2 * e + 1] = g * vi; }
            else W[e] = g * vr;
        }
    }
}

/* the block's sum of v, in a fixed order (warp shuffles, then warp 0 over the warps in order);
   red: QK__VJP_TPB / 32 doubles; the result on thread 0 */
__device__ __forceinline__ double qk__vjp_block_sum(double v, double *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x == 0)
        for (int k = 0; k < QK__VJP_TPB / 32; ++k) s += red[k];
    return s;
}

/* Im(conj(g) l) */
__device__ __forceinline__ double qk__vjp_imdot(double gr, double gi, double lr, double li) { return gr * li - gi * lr; }

/* The adjoint sweeps of samples [r0, r1) (rows r < nx: X's, state A and lam L; r >= nx: Y's, B
   and M). A row is R doubles (CPLX: D complex interleaved; else D real). gbuf: n_w doubles a row,
   zero before. in_smem: s and l copied into dynamic shared memory (2R doubles) first. */
template <bool CPLX>
__global__ void __launch_bounds__(QK__VJP_TPB)
qk__k_vjp_sweep(const qk_op *__restrict__ ops, int n_ops, int q, const double *__restrict__ w, int n_w,
                const double *__restrict__ x, const double *__restrict__ y, int64_t nx, int d, double *A, double *B, double *L,
                double *M, int64_t r0, int in_smem, double *__restrict__ gbuf)
{
    extern __shared__ __align__(16) unsigned char qk__smem[];
    __shared__ double red[2][QK__VJP_TPB / 32];
    const int64_t r = r0 + blockIdx.x, D = (int64_t)1 << q, R = CPLX ? 2 * D : D;
    const bool from_y = r >= nx;
    const int64_t i = from_y ? r - nx : r;
    const double *xs = (from_y ? y : x) + i * d;
    double *s = (from_y ? B : A) + i * R, *l = (from_y ? M : L) + i * R;
    if (in_smem) {
        double *ss = (double *)qk__smem, *sl = ss + R;
        for (int64_t a = threadIdx.x; a < R; a += blockDim.x) { ss[a] = s[a]; sl[a] = l[a]; }
        s = ss;
        l = sl;
        __syncthreads();
    }
    double *grow = gbuf + r * n_w;
    int par = 0;
    for (int k = n_ops - 1; k >= 0; --k) {
        const qk_op o = ops[k];
        if (o.kind == QK_OP_AMPLITUDE) break; /* the first op; nothing before it has a weight */
        const bool angled = qk__op_has_angle(o.kind);
        const bool weighted = angled && (o.angle.kind == QK_ARG_W || o.angle.kind == QK_ARG_WX);
        const double t = angled ? qk__angle_value(&o.angle, xs, w) : 0.0;
        const bool back = k > 0;
        const int64_t b0 = (int64_t)1 << o.q0;
        double part = 0.0;
        if (o.kind == QK_OP_CNOT || o.kind == QK_OP_CZ || o.kind == QK_OP_RZZ) {
            const int64_t b1 = (int64_t)1 << o.q1;
            if (o.kind == QK_OP_CNOT) {
                if (back)
                    for (int64_t u = threadIdx.x; u < D / 2; u += blockDim.x) {
                        const int64_t i0 = ((u >> o.q1) << (o.q1 + 1)) | (u & (b1 - 1));
                        if (!(i0 & b0)) continue;
                        const int64_t i1 = i0 | b1;
                        if (CPLX) {
                            double2 *s2 = (double2 *)s, *l2 = (double2 *)l, v;
                            v = s2[i0]; s2[i0] = s2[i1]; s2[i1] = v;
                            v = l2[i0]; l2[i0] = l2[i1]; l2[i1] = v;
                        } else {
                            double v;
                            v = s[i0]; s[i0] = s[i1]; s[i1] = v;
                            v = l[i0]; l[i0] = l[i1]; l[i1] = v;
                        }
                    }
            } else if (o.kind == QK_OP_CZ) {
                if (back)
                    for (int64_t a = threadIdx.x; a < D; a += blockDim.x) {
                        if ((a & (b0 | b1)) != (b0 | b1)) continue;
                        if (CPLX) { s[2 * a] = -s[2 * a]; s[2 * a + 1] = -s[2 * a + 1]; l[2 * a] = -l[2 * a]; l[2 * a + 1] = -l[2 * a + 1]; }
                        else { s[a] = -s[a]; l[a] = -l[a]; }
                    }
            } else { /* RZZ: exp(-i t/2 Z Z); back: the phase e^{+i t/2 z}, z = +-1 by the parity */
                double sn, cs;
                sincos(0.5 * t, &sn, &cs);
                for (int64_t a = threadIdx.x; a < D; a += blockDim.x) {
                    const bool odd = ((a & b0) != 0) != ((a & b1) != 0);
                    const double sr = s[CPLX ? 2 * a : a], si = CPLX ? s[2 * a + 1] : 0.0;
                    const double lr = l[CPLX ? 2 * a : a], li = CPLX ? l[2 * a + 1] : 0.0;
                    if (weighted) part += odd ? -qk__vjp_imdot(sr, si, lr, li) : qk__vjp_imdot(sr, si, lr, li);
                    if (back && CPLX) {
                        const double pi = odd ? -sn : sn;
                        s[2 * a] = cs * sr - pi * si; s[2 * a + 1] = cs * si + pi * sr;
                        l[2 * a] = cs * lr - pi * li; l[2 * a + 1] = cs * li + pi * lr;
                    }
                }
            }
        } else { /* one qubit: the derivative from the pair (i0, i1), then both back through U^dagger */
            double m[8];
            (void)qk__u1(o.kind, -t, o.kind == QK_OP_BASIS && qk__basis_one(xs[o.angle.x0]), m);
            if (weighted || back)
                for (int64_t u = threadIdx.x; u < D / 2; u += blockDim.x) {
                    const int64_t i0 = ((u >> o.q0) << (o.q0 + 1)) | (u & (b0 - 1)), i1 = i0 | b0;
                    double s0r, s0i = 0.0, s1r, s1i = 0.0, l0r, l0i = 0.0, l1r, l1i = 0.0;
                    if (CPLX) {
                        const double2 a0 = ((const double2 *)s)[i0], a1 = ((const double2 *)s)[i1];
                        const double2 c0 = ((const double2 *)l)[i0], c1 = ((const double2 *)l)[i1];
                        s0r = a0.x; s0i = a0.y; s1r = a1.x; s1i = a1.y; l0r = c0.x; l0i = c0.y; l1r = c1.x; l1i = c1.y;
                    } else {
                        s0r = s[i0]; s1r = s[i1]; l0r = l[i0]; l1r = l[i1];
                    }
                    if (weighted) {
                        switch (o.kind) { /* (Gen s) at i0 and i1 against l */
                        case QK_OP_RX: part += qk__vjp_imdot(s1r, s1i, l0r, l0i) + qk__vjp_imdot(s0r, s0i, l1r, l1i); break;
                        case QK_OP_RY: part += qk__vjp_imdot(s1i, -s1r, l0r, l0i) + qk__vjp_imdot(-s0i, s0r, l1r, l1i); break;
                        case QK_OP_RZ: part += qk__vjp_imdot(s0r, s0i, l0r, l0i) - qk__vjp_imdot(s1r, s1i, l1r, l1i); break;
                        default: part += qk__vjp_imdot(s1r, s1i, l1r, l1i); break; /* P: Pi_1 */
                        }
                    }
                    if (back) {
                        if (CPLX) {
                            double2 y0, y1;
                            y0.x = m[0] * s0r - m[1] * s0i + m[2] * s1r - m[3] * s1i;
                            y0.y = m[0] * s0i + m[1] * s0r + m[2] * s1i + m[3] * s1r;
                            y1.x = m[4] * s0r - m[5] * s0i + m[6] * s1r - m[7] * s1i;
                            y1.y = m[4] * s0i + m[5] * s0r + m[6] * s1i + m[7] * s1r;
                            ((double2 *)s)[i0] = y0; ((double2 *)s)[i1] = y1;
                            y0.x = m[0] * l0r - m[1] * l0i + m[2] * l1r - m[3] * l1i;
                            y0.y = m[0] * l0i + m[1] * l0r + m[2] * l1i + m[3] * l1r;
                            y1.x = m[4] * l0r - m[5] * l0i + m[6] * l1r - m[7] * l1i;
                            y1.y = m[4] * l0i + m[5] * l0r + m[6] * l1i + m[7] * l1r;
                            ((double2 *)l)[i0] = y0; ((double2 *)l)[i1] = y1;
                        } else { /* real maps: every op's matrix is real */
                            s[i0] = m[0] * s0r + m[2] * s1r; s[i1] = m[4] * s0r + m[6] * s1r;
                            l[i0] = m[0] * l0r + m[2] * l1r; l[i1] = m[4] * l0r + m[6] * l1r;
                        }
                    }
                }
        }
        if (weighted) {
            const double dt = qk__vjp_block_sum(part, red[par]); /* includes a barrier */
            par ^= 1;
            if (threadIdx.x == 0) {
                const double dw = o.angle.scale * (o.angle.kind == QK_ARG_WX ? xs[o.angle.x0] : 1.0);
                grow[o.angle.w] += (o.kind == QK_OP_P ? 2.0 * dt : -dt) * dw;
            }
        } else
            __syncthreads();
        if (!back) break;
    }
}

/* grad[w] = sum over the n rows of gbuf[r][w], one block per weight, in a fixed order */
__global__ void __launch_bounds__(256) qk__k_vjp_sum(const double *__restrict__ gbuf, int64_t n, int n_w, double *__restrict__ grad)
{
    __shared__ double red[256];
    const int wi = blockIdx.x;
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < n; r += 256) acc += gbuf[r * n_w + wi];
    const double sum = qk__block_sum256(red, acc);
    if (threadIdx.x == 0) grad[wi] = sum;
}

/* qk__k_vjp_w: grid-stride, 256 threads a block */
static qk_result qk__launch_vjp_w(bool real, const double *Sb, double *W, double *K, const double *G, int64_t nx, int64_t ny, int sym,
                                  cudaStream_t st, qk__err *E)
{
    const unsigned grid = (unsigned)std::min<int64_t>((nx * ny + 255) / 256, 65535);
    if (real) qk__k_vjp_w<false><<<grid, 256, 0, st>>>(Sb, W, K, G, nx, ny, sym);
    else qk__k_vjp_w<true><<<grid, 256, 0, st>>>(Sb, W, K, G, nx, ny, sym);
    QK_LAUNCH_CK("qk__k_vjp_w");
    return QK_OK;
}

/* qk__k_vjp_sweep: one block of QK__VJP_TPB threads per sample of [r0, r0 + n), 2R doubles of
   dynamic shared memory where in_smem (the attribute set by the caller) */
static qk_result qk__launch_vjp_sweep(bool real, const qk_op *ops, int n_ops, int q, const double *w, int n_w, const double *x,
                                      const double *y, int64_t nx, int d, double *A, double *B, double *L, double *M, int64_t r0,
                                      int64_t n, int in_smem, size_t smem, double *gbuf, cudaStream_t st, qk__err *E)
{
    for (int64_t g0 = 0; g0 < n; g0 += 65535) {
        const unsigned nblk = (unsigned)std::min<int64_t>(65535, n - g0);
        if (real)
            qk__k_vjp_sweep<false><<<nblk, QK__VJP_TPB, in_smem ? smem : 0, st>>>(ops, n_ops, q, w, n_w, x, y, nx, d, A, B, L, M, r0 + g0,
                                                                               in_smem, gbuf);
        else
            qk__k_vjp_sweep<true><<<nblk, QK__VJP_TPB, in_smem ? smem : 0, st>>>(ops, n_ops, q, w, n_w, x, y, nx, d, A, B, L, M, r0 + g0,
                                                                              in_smem, gbuf);
        QK_LAUNCH_CK("qk__k_vjp_sweep");
    }
    return QK_OK;
}

/* qk__k_vjp_sum: one block of 256 threads per weight */
static qk_result qk__launch_vjp_sum(const double *gbuf, int64_t n, int n_w, double *grad, cudaStream_t st, qk__err *E)
{
    qk__k_vjp_sum<<<(unsigned)n_w, 256, 0, st>>>(gbuf, n, n_w, grad);
    QK_LAUNCH_CK("qk__k_vjp_sum");
    return QK_OK;
}

/* The device bytes of a VJP (what qk_cuda_gram_vjp allocates, the build scratch included). */
static double qk__vjp_bytes(const qk_map *map, const qk__prog &pg, int64_t nx, int64_t ny, int sym, int real, int k_out)
{
    const double D = (double)((int64_t)1 << map->n_qubits), es = real ? 8.0 : 16.0, nmax = (double)std::max(nx, ny);
    const double n = (double)nx + (sym ? 0.0 : (double)ny);
    double b = 8.0 * n * map->n_features;                                          /* x, y */
    b += nmax * pg.P * 8.0 + (pg.passes.size() > 1 ? nmax * D * 16.0 : 0.0) + nmax * 8.0; /* build scratch */
    b += n * D * es * 2.0;                                                         /* states, adjoint vectors */
    b += (double)nx * ny * (es * (sym ? 2.0 : 1.0) + 8.0 + (k_out ? 8.0 : 0.0));   /* conj(S) (and W), G, K */
    b += n * std::max(1, map->n_weights) * 8.0 + 4096.0 * 8 + map->n_ops * sizeof(qk_op);
    return b;
}

struct qk__vjp_bufs {
    double *dx = nullptr, *dy = nullptr, *A = nullptr, *B = nullptr, *L = nullptr, *M = nullptr;
    double *S = nullptr, *W = nullptr, *G = nullptr, *K = nullptr, *gbuf = nullptr, *grad = nullptr;
    qk_op *ops = nullptr;
    qk__build_ws ws;
    qk__dprog dp;
    cudaStream_t st = nullptr, st2 = nullptr; /* the products and kernels; G's upload beside them */
    cudaEvent_t ev = nullptr, sev[2] = {nullptr, nullptr};   /* staging buffers' DMAs */
    cublasHandle_t blas = nullptr;
    qk_cuda_pool *lent = nullptr;
    bool own_st = false, own_blas = false;
};

static void qk__vjp_free(qk__vjp_bufs &b)
{
    if (b.st) cudaStreamSynchronize(b.st);
    if (b.st2) cudaStreamSynchronize(b.st2);
    cudaFree(b.dx); cudaFree(b.dy); cudaFree(b.A); cudaFree(b.B); cudaFree(b.L); cudaFree(b.M);
    if (b.W != b.S) cudaFree(b.W);   /* K(X,Y): W is S, overwritten in place */
    cudaFree(b.S); cudaFree(b.G); cudaFree(b.K); cudaFree(b.gbuf); cudaFree(b.grad); cudaFree(b.ops);
    cudaFree(b.ws.params); cudaFree(b.ws.tmp); cudaFree(b.ws.inv);
    qk__dprog_free(&b.dp);
    if (b.own_blas && b.blas) cublasDestroy(b.blas);
    if (b.ev) cudaEventDestroy(b.ev);
    for (cudaEvent_t e : b.sev) if (e) cudaEventDestroy(e);
    if (b.own_st && b.st) cudaStreamDestroy(b.st);
    if (b.own_st && b.st2) cudaStreamDestroy(b.st2);
    qk__pool_return(b.lent);
    cudaGetLastError();
    b = qk__vjp_bufs();
}

/* Host rows on up to 8 threads (the copies between pageable memory and pinned staging: one core
   copies a fraction of what PCIe moves). Each thread runs f(r0, r1) on its share of rows
   [0, rows), at least 2^20 bytes (min_rows_per rows) a thread. */
template <typename F>
static void qk__vjp_par_rows(int64_t rows, int64_t min_rows, F f)
{
    const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(8, rows / std::max<int64_t>(1, min_rows)));
    if (nt <= 1) { f((int64_t)0, rows); return; }
    std::vector<std::thread> th;
    for (int64_t t = 1; t < nt; ++t) th.emplace_back([=] { f(rows * t / nt, rows * (t + 1) / nt); });
    f((int64_t)0, rows / nt);
    for (auto &x : th) x.join();
}

/* G (nx x ny doubles, rows ldg apart, the caller's host memory) into dG (rows of ny) on stream
   st, checking every entry is finite on the way: *bad is the row-major index (row * ny + column)
   of the first that is not, or -1. Pageable G crosses through the two pinned staging buffers (a
   chunk of rows copied and checked by up to 8 threads into one while the other's DMA runs: the
   driver's own pageable path runs at a fraction of the pinned rate, docs/benchmarks.md,
   "Gradients on the GPU"); page-locked G (or no staging) is copied as it is and checked by the
   same threads, read-only, while its DMA runs. Returns once the copies are queued and the check
   is done (the staging's last DMA may still run: its event is ev[0..1]). */
static qk_result qk__vjp_upload_g(double *dG, const double *g, int64_t nx, int64_t ny, int64_t ldg, void *const stage[2], size_t stage_bytes,
                                  cudaStream_t st, cudaEvent_t ev[2], int64_t *bad, qk__err *E)
{
    const size_t rowb = (size_t)ny * sizeof(double);
    const int64_t min_rows = std::max<int64_t>(1, (int64_t)(((size_t)1 << 20) / rowb));
    std::atomic<int64_t> first(INT64_MAX);
    auto check = [&](const double *src, int64_t ld, int64_t row0, int64_t r0, int64_t r1, double *dst) {
        int64_t f = INT64_MAX;
        for (int64_t r = r0; r < r1 && f == INT64_MAX; ++r) {
            const double *a = src + r * ld;
            if (dst) memcpy(dst + r * ny, a, rowb);
            bool ok = true;
            for (int64_t c = 0; c < ny; ++c) ok &= std::isfinite(a[c]);   /* no branch a column: vectorised */
            if (!ok)
                for (int64_t c = 0; c < ny; ++c)
                    if (!std::isfinite(a[c])) { f = (row0 + r) * ny + c; break; }
        }
        int64_t cur = first.load();
        while (f < cur && !first.compare_exchange_weak(cur, f)) {}
    };
    const bool staged = !qk_cuda_host_pinned(g) && stage[0] && stage[1] && stage_bytes >= rowb;
    if (!staged) {
        QK_CK(cudaMemcpy2DAsync(dG, rowb, g, (size_t)ldg * sizeof(double), rowb, (size_t)nx, cudaMemcpyHostToDevice, st));
        qk__vjp_par_rows(nx, min_rows, [&](int64_t r0, int64_t r1) { check(g, ldg, 0, r0, r1, nullptr); });
    } else {
        const int64_t chunk = std::min<int64_t>(nx, (int64_t)(stage_bytes / rowb));
        for (int64_t r0 = 0, k = 0; r0 < nx; r0 += chunk, ++k) {
            const int64_t rows = std::min(chunk, nx - r0);
            const int i = (int)(k & 1);
            if (k >= 2) QK_CK(cudaEventSynchronize(ev[i]));   /* staging i was read by chunk k - 2's DMA */
            double *sb = (double *)stage[i];
            qk__vjp_par_rows(rows, min_rows, [&](int64_t a, int64_t b) { check(g + r0 * ldg, ldg, r0, a, b, sb); });
            if (first.load() != INT64_MAX) break;
            QK_CK(cudaMemcpyAsync(dG + r0 * ny, sb, (size_t)rows * rowb, cudaMemcpyHostToDevice, st));
            QK_CK(cudaEventRecord(ev[i], st));
        }
    }
    *bad = first.load() == INT64_MAX ? -1 : first.load();
    return QK_OK;
}

/* dK (nx x ny doubles, dense) into the caller's k (same shape), through the pinned staging where
   k is pageable (each chunk's DMA, then its copy out on up to 8 threads while the next chunk's
   DMA runs), else straight. Synchronous. */
static qk_result qk__vjp_download_k(double *k, const double *dK, int64_t nx, int64_t ny, void *const stage[2], size_t stage_bytes,
                                    cudaStream_t st, cudaEvent_t ev[2], qk__err *E)
{
    const size_t rowb = (size_t)ny * sizeof(double);
    if (qk_cuda_host_pinned(k) || !stage[0] || !stage[1] || stage_bytes < rowb) {
        QK_CK(cudaMemcpyAsync(k, dK, (size_t)nx * rowb, cudaMemcpyDeviceToHost, st));
        QK_CK(cudaStreamSynchronize(st));
        return QK_OK;
    }
    const int64_t chunk = std::min<int64_t>(nx, (int64_t)(stage_bytes / rowb)), nck = (nx + chunk - 1) / chunk;
    const int64_t min_rows = std::max<int64_t>(1, (int64_t)(((size_t)1 << 20) / rowb));
    for (int64_t k0 = 0; k0 < std::min<int64_t>(2, nck); ++k0) {   /* the first two chunks' DMA */
        const int64_t r0 = k0 * chunk, rows = std::min(chunk, nx - r0);
        QK_CK(cudaMemcpyAsync(stage[k0], dK + r0 * ny, (size_t)rows * rowb, cudaMemcpyDeviceToHost, st));
        QK_CK(cudaEventRecord(ev[k0], st));
    }
    for (int64_t c = 0; c < nck; ++c) {
        const int i = (int)(c & 1);
        const int64_t r0 = c * chunk, rows = std::min(chunk, nx - r0);
        QK_CK(cudaEventSynchronize(ev[i]));
        const double *sb = (const double *)stage[i];
        qk__vjp_par_rows(rows, min_rows, [&](int64_t a, int64_t b) { memcpy(k + (r0 + a) * ny, sb + a * ny, (size_t)(b - a) * rowb); });
        if (c + 2 < nck) {   /* staging i is free again: chunk c + 2's DMA */
            const int64_t r2 = (c + 2) * chunk, rows2 = std::min(chunk, nx - r2);
            QK_CK(cudaMemcpyAsync(stage[i], dK + r2 * ny, (size_t)rows2 * rowb, cudaMemcpyDeviceToHost, st));
            QK_CK(cudaEventRecord(ev[i], st));
        }
    }
    return QK_OK;
}

/* A build's states into out (rows of D: real where real, else complex double). */
static qk_result qk__vjp_states(const qk__prog &pg, qk__vjp_bufs &b, const double *dx, int64_t n, double *out, bool real, qk__err *E)
{
    return qk__build_states<double>(pg, b.dp, dx, n, b.ws, out, real, b.st, E);
}

static qk_result qk__vjp_run(const qk_map *map, const qk_vjp_desc *d, int real, qk_cuda_pool *pool, void *const stage[2], size_t stage_bytes,
                             qk__vjp_bufs &b, qk__err *E)
{
    const int64_t nx = d->n_x, ny = d->y ? d->n_y : d->n_x, D = (int64_t)1 << map->n_qubits, R = real ? D : 2 * D;
    const int sym = d->y == nullptr, nw = map->n_weights;
    const int64_t total = nx + (sym ? 0 : ny), ldg = d->ld_g ? d->ld_g : ny;
    const size_t es = real ? 8 : 16;
    char msg[300];
    qk__prog pg;
    qk_map m2 = *map;
    if (m2.cls == QK_CLASS_PRODUCT) m2.cls = QK_CLASS_COMPLEX; /* build the state vector anyway */
    QK_TRY(qk__compile(&m2, &pg, E));
    /* the device memory first: a clear error before anything is allocated */
    {
        size_t fr = 0, tot = 0;
        QK_CK(cudaMemGetInfo(&fr, &tot));
        const double need = qk__vjp_bytes(map, pg, nx, ny, sym, real, d->k_out != nullptr);
        if (need > 0.95 * (double)fr) {
            snprintf(msg, sizeof msg,
                     "qk_gram_vjp: the states, S, W and the adjoint vectors need %.3g GB of device memory, %.3g GB are free "
                     "(the gradient keeps every state resident: fewer samples per call)", need * 1e-9, (double)fr * 1e-9);
            return qk__fail_msg(E, QK_ERROR_DEVICE_OUT_OF_MEMORY, msg);
        }
    }
    if ((b.lent = qk__pool_borrow(pool))) { /* the context's stream and cuBLAS handle */
        b.st = pool->st[0];
        b.st2 = pool->st[1];
        if (!pool->blas) QK_BLAS_CK(cublasCreate(&pool->blas));
        b.blas = pool->blas;
    } else {
        b.own_st = true;
        QK_CK(cudaStreamCreateWithFlags(&b.st, cudaStreamNonBlocking));
        QK_CK(cudaStreamCreateWithFlags(&b.st2, cudaStreamNonBlocking));
        QK_BLAS_CK(cublasCreate(&b.blas));
        b.own_blas = true;
    }
    QK_BLAS_CK(cublasSetStream(b.blas, b.st));
    QK_CK(cudaEventCreateWithFlags(&b.ev, cudaEventDisableTiming));
    auto poll = [&](int64_t done) -> qk_result {
        if (!d->progress) return QK_OK;
        QK_CK(cudaStreamSynchronize(b.st));
        if (d->progress(done, total, d->progress_user))
            return qk__fail_msg(E, QK_ERROR_CANCELLED, "qk_gram_vjp: cancelled by the progress callback (nothing was written)");
        return QK_OK;
    };
    /* 1. states */
    QK_TRY(qk__dprog_make(pg, map, &b.dp, E));
    const int64_t nmax = std::max(nx, ny);
    QK_CK(cudaMalloc((void **)&b.dx, std::max<size_t>(1, (size_t)nx * map->n_features * sizeof(double))));
    QK_CK(cudaMemcpyAsync(b.dx, d->x, (size_t)nx * map->n_features * sizeof(double), cudaMemcpyHostToDevice, b.st));
    if (!sym) {
        QK_CK(cudaMalloc((void **)&b.dy, std::max<size_t>(1, (size_t)ny * map->n_features * sizeof(double))));
        QK_CK(cudaMemcpyAsync(b.dy, d->y, (size_t)ny * map->n_features * sizeof(double), cudaMemcpyHostToDevice, b.st));
    }
    QK_CK(cudaMalloc(&b.ws.params, (size_t)nmax * pg.P * sizeof(double)));
    if (pg.passes.size() > 1) QK_CK(cudaMalloc(&b.ws.tmp, (size_t)nmax * D * 16));
    if (pg.has_amp) QK_CK(cudaMalloc((void **)&b.ws.inv, (size_t)nmax * sizeof(double)));
    QK_CK(cudaMalloc((void **)&b.A, (size_t)nx * D * es));
    QK_TRY(qk__vjp_states(pg, b, b.dx, nx, b.A, real, E));
    if (!sym) {
        QK_CK(cudaMalloc((void **)&b.B, (size_t)ny * D * es));
        QK_TRY(qk__vjp_states(pg, b, b.dy, ny, b.B, real, E));
    } else
        b.B = nullptr;
    double *Bs = sym ? b.A : b.B;
    /* 2. conj(S), row-major nx x ny: column-major ny x nx = B^H A */
    QK_CK(cudaMalloc((void **)&b.S, (size_t)nx * ny * es));
    {
        const double one = 1.0, zero = 0.0;
        const cuDoubleComplex c1 = make_cuDoubleComplex(1, 0), c0 = make_cuDoubleComplex(0, 0);
        if (sym) {
            if (real) QK_BLAS_CK(cublasDsyrk(b.blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T, (int)nx, (int)D, &one, b.A, (int)D, &zero, b.S, (int)nx));
            else QK_BLAS_CK(cublasZherk(b.blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_C, (int)nx, (int)D, &one, (const cuDoubleComplex *)b.A, (int)D,
                                        &zero, (cuDoubleComplex *)b.S, (int)nx));
        } else {
            if (real) QK_BLAS_CK(cublasDgemm(b.blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)ny, (int)nx, (int)D, &one, Bs, (int)D, b.A, (int)D, &zero, b.S, (int)ny));
            else QK_BLAS_CK(cublasZgemm(b.blas, CUBLAS_OP_C, CUBLAS_OP_N, (int)ny, (int)nx, (int)D, &c1, (const cuDoubleComplex *)Bs, (int)D,
                                        (const cuDoubleComplex *)b.A, (int)D, &c0, (cuDoubleComplex *)b.S, (int)ny));
        }
    }
    /* G's upload on the second stream, checked on the way, while the states and S are computed
       (the host copies hold the calling thread; the work queued before them runs meanwhile) */
    QK_CK(cudaMalloc((void **)&b.G, (size_t)nx * ny * sizeof(double)));
    QK_CK(cudaEventCreateWithFlags(&b.sev[0], cudaEventDisableTiming));
    QK_CK(cudaEventCreateWithFlags(&b.sev[1], cudaEventDisableTiming));
    {
        int64_t bad = -1;
        QK_TRY(qk__vjp_upload_g(b.G, d->g, nx, ny, ldg, stage, stage_bytes, b.st2, b.sev, &bad, E));
        if (bad >= 0) {
            snprintf(msg, sizeof msg, "qk_gram_vjp: g[%lld][%lld] is not finite", (long long)(bad / ny), (long long)(bad % ny));
            return qk__fail_msg(E, QK_ERROR_NON_FINITE, msg);
        }
    }
    QK_CK(cudaEventRecord(b.ev, b.st2));
    QK_CK(cudaStreamWaitEvent(b.st, b.ev, 0));
    QK_CK(cudaStreamSynchronize(b.st)); /* the build scratch goes back (cudaFree would wait anyway) */
    cudaFree(b.ws.params); cudaFree(b.ws.tmp); cudaFree(b.ws.inv);
    b.ws.params = nullptr; b.ws.tmp = nullptr; b.ws.inv = nullptr;   /* freed once (qk__vjp_free) */
    b.ws = qk__build_ws();
    QK_TRY(poll(0));
    /* 3. K and W */
    if (d->k_out) QK_CK(cudaMalloc((void **)&b.K, (size_t)nx * ny * sizeof(double)));
    if (nw > 0) {
        if (sym) QK_CK(cudaMalloc((void **)&b.W, (size_t)nx * ny * es));
        else b.W = b.S;
    }
    QK_TRY(qk__launch_vjp_w(real, b.S, b.W, b.K, b.G, nx, ny, sym, b.st, E));
    std::vector<double> grad_h((size_t)std::max(1, nw));
    if (nw > 0) {
        QK_TRY(poll(0));
        /* 4. lam = W B (column-major D x nx: B (D x ny) times W (ny x nx)); mu = A W^H */
        QK_CK(cudaMalloc((void **)&b.L, (size_t)nx * D * es));
        if (!sym) QK_CK(cudaMalloc((void **)&b.M, (size_t)ny * D * es));
        const double one = 1.0, zero = 0.0;
        const cuDoubleComplex c1 = make_cuDoubleComplex(1, 0), c0 = make_cuDoubleComplex(0, 0);
        if (real) {
            QK_BLAS_CK(cublasDgemm(b.blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)D, (int)nx, (int)ny, &one, Bs, (int)D, b.W, (int)ny, &zero, b.L, (int)D));
            if (!sym)
                QK_BLAS_CK(cublasDgemm(b.blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)D, (int)ny, (int)nx, &one, b.A, (int)D, b.W, (int)ny, &zero, b.M, (int)D));
        } else {
            QK_BLAS_CK(cublasZgemm(b.blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)D, (int)nx, (int)ny, &c1, (const cuDoubleComplex *)Bs, (int)D,
                                   (const cuDoubleComplex *)b.W, (int)ny, &c0, (cuDoubleComplex *)b.L, (int)D));
            if (!sym)
                QK_BLAS_CK(cublasZgemm(b.blas, CUBLAS_OP_N, CUBLAS_OP_C, (int)D, (int)ny, (int)nx, &c1, (const cuDoubleComplex *)b.A, (int)D,
                                       (const cuDoubleComplex *)b.W, (int)ny, &c0, (cuDoubleComplex *)b.M, (int)D));
        }
        /* W, S and G are done with: give them back before the sweeps */
        QK_CK(cudaStreamSynchronize(b.st));
        if (b.W != b.S) cudaFree(b.W);
        cudaFree(b.S); cudaFree(b.G);
        b.W = b.S = b.G = nullptr;
        QK_TRY(poll(0));
        /* 5. the sweeps, in chunks of samples where a progress callback polls between them */
        QK_CK(cudaMalloc((void **)&b.ops, (size_t)std::max(1, map->n_ops) * sizeof(qk_op)));
        QK_CK(cudaMemcpyAsync(b.ops, map->ops, (size_t)map->n_ops * sizeof(qk_op), cudaMemcpyHostToDevice, b.st));
        QK_CK(cudaMalloc((void **)&b.gbuf, (size_t)total * nw * sizeof(double)));
        QK_CK(cudaMemsetAsync(b.gbuf, 0, (size_t)total * nw * sizeof(double), b.st));
        QK_CK(cudaMalloc((void **)&b.grad, (size_t)nw * sizeof(double)));
        int optin = 0, dev = -1;
        QK_CK(cudaGetDevice(&dev));
        QK_CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        const size_t smem = (size_t)2 * R * sizeof(double);
        const int in_smem = smem + 1024 <= (size_t)optin;
        if (in_smem) {
            if (real) QK_CK(cudaFuncSetAttribute(qk__k_vjp_sweep<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            else QK_CK(cudaFuncSetAttribute(qk__k_vjp_sweep<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        }
        const int64_t chunk = d->progress ? std::max<int64_t>(1, (total + 15) / 16) : total;
        for (int64_t r0 = 0; r0 < total; r0 += chunk) {
            const int64_t nb = std::min(chunk, total - r0);
            QK_TRY(qk__launch_vjp_sweep(real, b.ops, map->n_ops, map->n_qubits, b.dp.w, nw, b.dx, b.dy, nx, map->n_features, b.A, Bs, b.L, b.M,
                                        r0, nb, in_smem, smem, b.gbuf, b.st, E));
            QK_TRY(poll(r0 + nb));
        }
        QK_TRY(qk__launch_vjp_sum(b.gbuf, total, nw, b.grad, b.st, E));
        QK_CK(cudaMemcpyAsync(grad_h.data(), b.grad, (size_t)nw * sizeof(double), cudaMemcpyDeviceToHost, b.st));
    }
    QK_CK(cudaStreamSynchronize(b.st));
    /* the outputs once nothing can fail: K straight into k_out (the last call), the gradient */
    if (d->k_out) QK_TRY(qk__vjp_download_k(d->k_out, b.K, nx, ny, stage, stage_bytes, b.st, b.sev, E));
    if (nw > 0) memcpy(d->grad_w, grad_h.data(), (size_t)nw * sizeof(double));
    return QK_OK;
}

extern "C" qk_result qk_cuda_gram_vjp(const qk_map *map, const qk_vjp_desc *desc, int real, qk_cuda_pool *pool, void *const stage[2],
                                      size_t stage_bytes, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!map || !desc || !desc->x || !desc->g || (map->n_weights > 0 && !desc->grad_w))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram_vjp: NULL argument");
    if (map->n_qubits > QK_MAX_STATE_QUBITS) return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_gram_vjp: too many qubits");
    const int64_t ny = desc->y ? desc->n_y : desc->n_x;
    if (desc->n_x > INT32_MAX || ny > INT32_MAX)
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram_vjp: more than 2^31 - 1 samples a side");
    qk__vjp_bufs b;
    qk_result r;
    try {
        void *const none[2] = {nullptr, nullptr};
        r = qk__vjp_run(map, desc, real, pool, stage ? stage : none, stage ? stage_bytes : 0, b, E);
    } catch (const std::bad_alloc &) {
        r = qk__fail_msg(E, QK_ERROR_OUT_OF_MEMORY, "qk_cuda_gram_vjp: out of host memory");
    }
    qk__vjp_free(b);
    return r;
}
/* ======================================================================================== */
/* >>projected ---- qk_cuda_gram_projected: the projected quantum kernel on the GPU ---- */
/* ======================================================================================== */
/* The CPU's qk_gram_projected (vjp.c, docs/gradients.md) on one GPU, fp64. Each sample gives 3q
   features f = (rho00, Re rho01, Im rho01) per qubit, K(x, x') = exp(-2 gamma |f - f'|^2):
   1. the features, by path:
      statevector  the states built on the device (qk__build_states) in chunks of samples, then
                   one block per (sample, qubit) sums rho00 = sum |psi_i|^2 and rho01 = sum
                   psi_i conj(psi_{i|b}) over the indices i without bit b (a strided loop, then a
                   tree over the block: a fixed order);
      MPS          each chunk's MPS built on the host (qk.h's provider: the MPS engine's builder,
                   as the CPU path does), uploaded in the engine's lane layout as it is, then one
                   block per sample (a grid of at most a few blocks per SM, each looping over
                   samples) runs the CPU's two sweeps: the left environments L_s stored for every
                   site (the block's global scratch), then right to left R_{s+1}, X = A R,
                   W = L_s X, rho_s = W A^H and R_s = X A^H, the site tensor and the working
                   matrices in shared memory where they fit (else the block's global scratch);
                   every entry is summed by one thread in the CPU's order (rho: per l' by one
                   thread, then the l' in order), so the features are the same bits run to run;
                   the host builds the next chunk while the device sweeps this one;
      product      the features computed on the host (qk.h), uploaded;
   2. K: a tiled kernel over pairs (64 x 64 a block, the features staged through shared memory
      16 at a time), |f - f'|^2 summed in feature order as on the CPU, then exp, written in the
      output dtype; K(X,X) resident on the device computes the tiles on and above the diagonal
      and writes both halves, else slabs of rows (every column);
   3. K to the caller's buffer (ld_out), slab by slab, once every device buffer is held (a slab
      copy is the only thing after the first host write that can fail: a CUDA error). */

#define QK__PQ_TPB 128  /* threads of an MPS sweep block */
#define QK__PQ_BM 64    /* rows (and columns) of K per RBF block */
#define QK__PQ_BK 16    /* features per shared-memory stage */

/* rho00 and rho01 of qubit blockIdx.y of sample blockIdx.x (rows of D: complex interleaved, or
   real): F[sample][3k .. 3k + 2] */
template <bool CPLX>
__global__ void __launch_bounds__(256) qk__k_pq_sv(const double *__restrict__ S, int q, double *__restrict__ F)
{
    __shared__ double red[3][256];
    const int64_t i = blockIdx.x, D = (int64_t)1 << q;
    const int k = blockIdx.y;
    const int64_t b = (int64_t)1 << k;
    const double *s = S + i * (CPLX ? 2 * D : D);
    double r00 = 0.0, rr = 0.0, ri = 0.0;
    for (int64_t u = threadIdx.x; u < D / 2; u += 256) {
        const int64_t i0 = ((u >> k) << (k + 1)) | (u & (b - 1)), i1 = i0 | b;
        if (CPLX) {
            const double2 a0 = ((const double2 *)s)[i0], a1 = ((const double2 *)s)[i1];
            r00 += a0.x * a0.x + a0.y * a0.y;
            rr += a0.x * a1.x + a0.y * a1.y;   /* psi_i0 conj(psi_i1) */
            ri += a0.y * a1.x - a0.x * a1.y;
        } else {
            const double a0 = s[i0], a1 = s[i1];
            r00 += a0 * a0;
            rr += a0 * a1;
        }
    }
    const double s0 = qk__block_sum256(red[0], r00), s1 = qk__block_sum256(red[1], rr), s2 = qk__block_sum256(red[2], ri);
    if (threadIdx.x == 0) {
        double *f = F + i * 3 * q + 3 * k;
        f[0] = s0; f[1] = s1; f[2] = s2;
    }
}

/* The MPS sweeps' pieces (complex numbers as (re, im) pairs of doubles):
   qk__pq_dot  out = sum_k x[k xs] y[k ys] (CONJ: x[k xs] conj(y[k ys])) over len terms, in order;
   qk__pq_site the site tensor of one sample from the lane layout (entry e at p + e 2 nj, its
               imaginary part nj later) into sA, by the block's threads;
   qk__pq_lmul out[l'][a][r] = sum_l Ls[l][l'] M[l][a][r] (Ls dl x dl, M dl x 2 x dr), by the block. */
template <bool CONJ>
__device__ __forceinline__ void qk__pq_dot(const double *x, int xs, const double *y, int ys, int len, double *out)
{
    double re = 0.0, im = 0.0;
    for (int k = 0; k < len; ++k) {
        const double xr = x[2 * k * xs], xi = x[2 * k * xs + 1], yr = y[2 * k * ys], yi = y[2 * k * ys + 1];
        if (CONJ) {
            re += xr * yr + xi * yi;
            im += xi * yr - xr * yi;
        } else {
            re += xr * yr - xi * yi;
            im += xr * yi + xi * yr;
        }
    }
    out[0] = re;
    out[1] = im;
}
__device__ __forceinline__ void qk__pq_site(double *sA, const double *p, int na, int nj)
{
    for (int e = threadIdx.x; e < na; e += QK__PQ_TPB) {
        sA[2 * e] = p[(int64_t)e * 2 * nj];
        sA[2 * e + 1] = p[(int64_t)e * 2 * nj + nj];
    }
}
__device__ __forceinline__ void qk__pq_lmul(const double *Ls, const double *M, int dl, int dr, double *out)
{
    for (int e = threadIdx.x; e < dl * 2 * dr; e += QK__PQ_TPB) {
        const int lp = e / (2 * dr), ar = e % (2 * dr);   /* ar = a dr + r */
        qk__pq_dot<false>(Ls + 2 * lp, dl, M + 2 * ar, 2 * dr, dl, out + 2 * e);
    }
}

/* The features of n samples of an MPS chunk (lane layout: sample i in group i / nj at lane
   i % nj; entry e of site s at off[s] + e * 2 nj, its imaginary part nj later) into F (row i).
   Block b takes samples b, b + gridDim.x, ...; its scratch is per_block doubles at
   scratch + b * per_block: the left environments (L_s at loff[s], 2 D[s]^2 doubles), then, where
   !in_smem, the working matrices (from loff[q] + 2 D[q]^2), which are else in dynamic shared
   memory: the site tensor sA and X, W (4 dmax^2 each), R, Rn (2 dmax^2 each), rho's partial sums
   (8 dmax). */
__global__ void __launch_bounds__(QK__PQ_TPB)
qk__k_pq_mps(const double *__restrict__ lanes, int64_t n, int q, const int *__restrict__ Dd, const int *__restrict__ ord,
             const int64_t *__restrict__ off, int64_t group, int nj, const int64_t *__restrict__ loff, int dmax, double *scratch,
             int64_t per_block, int in_smem, double *__restrict__ F)
{
    extern __shared__ __align__(16) unsigned char qk__smem[];
    const int tid = threadIdx.x;
    const int64_t dm2 = (int64_t)dmax * dmax;
    double *L = scratch + (int64_t)blockIdx.x * per_block;
    double *sA = in_smem ? (double *)qk__smem : L + loff[q] + 2 * Dd[q] * Dd[q];
    double *X = sA + 4 * dm2, *W = X + 4 * dm2, *R = W + 4 * dm2, *Rn = R + 2 * dm2, *part = Rn + 2 * dm2;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const double *g = lanes + (i / nj) * group + (i % nj);
        double *f = F + i * 3 * q;
        if (tid == 0) { L[0] = 1.0; L[1] = 0.0; }
        /* left: L_{s+1}[r][r'] = sum_{l', a} X[l'][a][r] conj(A[l'][a][r']), X[l'][a][r] = sum_l L_s[l][l'] A[l][a][r] */
        for (int s = 0; s < q; ++s) {
            const int dl = Dd[s], dr = Dd[s + 1], na = dl * 2 * dr;
            qk__pq_site(sA, g + off[s], na, nj);
            __syncthreads(); /* sA, and L_s of the last site */
            const double *Ls = L + loff[s];
            double *Ln = L + loff[s + 1];
            qk__pq_lmul(Ls, sA, dl, dr, X);
            __syncthreads();
            /* (l', a) as one index j = 2 l' + a, X[j][r] conj(A[j][r']) summed over j */
            for (int e = tid; e < dr * dr; e += QK__PQ_TPB) {
                const int r = e / dr, rp = e % dr;
                qk__pq_dot<true>(X + 2 * r, dr, sA + 2 * rp, dr, 2 * dl, Ln + 2 * e);
            }
            __syncthreads(); /* sA and X are read: the next site may overwrite them */
        }
        /* right to left */
        if (tid == 0) { R[0] = 1.0; R[1] = 0.0; }
        for (int s = q - 1; s >= 0; --s) {
            const int dl = Dd[s], dr = Dd[s + 1], na = dl * 2 * dr;
            const double *Ls = L + loff[s];
            qk__pq_site(sA, g + off[s], na, nj);
            __syncthreads(); /* sA, R */
            /* X[l][a][r'] = sum_r A[l][a][r] R[r][r'] */
            for (int e = tid; e < na; e += QK__PQ_TPB) {
                const int rp = e % dr;
                qk__pq_dot<false>(sA + 2 * (e - rp), 1, R + 2 * rp, dr, dr, X + 2 * e);
            }
            __syncthreads();
            /* W[l'][a][r'] = sum_l L_s[l][l'] X[l][a][r'] */
            qk__pq_lmul(Ls, X, dl, dr, W);
            /* R_s[l][l'] = sum_{a, r'} X[l][a][r'] conj(A[l'][a][r']) (into Rn: R is read no more) */
            for (int e = tid; e < dl * dl; e += QK__PQ_TPB) {
                const int l = e / dl, lp = e % dl;   /* (a, r') as one index a dr + r' */
                qk__pq_dot<true>(X + 4 * l * dr, 1, sA + 4 * lp * dr, 1, 2 * dr, Rn + 2 * e);
            }
            __syncthreads();
            /* rho[a][a'] = sum_{l'} sum_{r'} W[l'][a][r'] conj(A[l'][a'][r']): per (a, a', l') here */
            for (int e = tid; e < 4 * dl; e += QK__PQ_TPB) {
                const int c = e / dl, lp = e % dl, a = c >> 1, ap = c & 1;
                qk__pq_dot<true>(W + 2 * (lp * 2 + a) * dr, 1, sA + 2 * (lp * 2 + ap) * dr, 1, dr, part + 2 * e);
            }
            __syncthreads();
            if (tid == 0) {
                double rho[8];
                for (int c = 0; c < 4; ++c) {
                    double vr = 0.0, vi = 0.0;
                    for (int lp = 0; lp < dl; ++lp) { vr += part[2 * (c * dl + lp)]; vi += part[2 * (c * dl + lp) + 1]; }
                    rho[2 * c] = vr;
                    rho[2 * c + 1] = vi;
                }
                double tr = rho[0] + rho[6];
                if (!(tr > 0)) tr = 1.0;
                const int k = ord[s];
                f[3 * k] = rho[0] / tr;
                f[3 * k + 1] = rho[2] / tr;
                f[3 * k + 2] = rho[3] / tr;
            }
            double *sw = R;
            R = Rn;
            Rn = sw;
            /* the next site's loads (sA) and R come after a barrier; part is written again only
               after two more */
        }
        __syncthreads(); /* the last site's reads of sA, part and L_0 before the next sample */
    }
}

/* K over the pairs of rows [r0, r0 + rows) of Fa against the ncols rows of Fb (nf features a
   row): K[i - r0][j] (ld ldk) = exp(coef |fa_i - fb_j|^2), the sum in feature order. sym (K(X,X),
   the whole of K: r0 = 0): only tiles with a column >= a row, and the mirror written. */
template <typename OutT>
__global__ void __launch_bounds__(256) qk__k_pq_rbf(const double *__restrict__ Fa, const double *__restrict__ Fb, int64_t r0, int64_t rows,
                                                    int64_t ncols, int nf, double coef, OutT *__restrict__ K, int64_t ldk, int sym)
{
    __shared__ double sa[QK__PQ_BK][QK__PQ_BM + 1], sb[QK__PQ_BK][QK__PQ_BM + 1];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t i0 = r0 + (int64_t)blockIdx.y * QK__PQ_BM, j0 = (int64_t)blockIdx.x * QK__PQ_BM;
    if (sym && j0 + QK__PQ_BM - 1 < i0) return; /* wholly below the diagonal (block-uniform) */
    const int64_t rend = r0 + rows;
    double d2[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) d2[a][c] = 0.0;
    for (int k0 = 0; k0 < nf; k0 += QK__PQ_BK) {
        for (int e = threadIdx.x; e < QK__PQ_BM * QK__PQ_BK; e += 256) {
            const int rr = e / QK__PQ_BK, kk = e % QK__PQ_BK, k = k0 + kk;
            const int64_t ia = i0 + rr, jb = j0 + rr;
            sa[kk][rr] = (ia < rend && k < nf) ? Fa[ia * nf + k] : 0.0;
            sb[kk][rr] = (jb < ncols && k < nf) ? Fb[jb * nf + k] : 0.0;
        }
        __syncthreads();
        const int kn = min(QK__PQ_BK, nf - k0);
        for (int kk = 0; kk < kn; ++kk) {
            double av[4], bv[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) av[a] = sa[kk][ty + 16 * a];
#pragma unroll
            for (int c = 0; c < 4; ++c) bv[c] = sb[kk][tx + 16 * c];
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const double t = av[a] - bv[c];
                    d2[a][c] += t * t;
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int64_t i = i0 + ty + 16 * a, j = j0 + tx + 16 * c;
            if (i >= rend || j >= ncols) continue;
            const OutT v = (OutT)exp(coef * d2[a][c]);
            if (sym) {
                if (j < i) continue;
                K[i * ldk + j] = v;
                if (j > i) K[j * ldk + i] = v;
            } else
                K[(i - r0) * ldk + j] = v;
        }
}

/* qk__k_pq_sv: a block of 256 threads per (sample, qubit) of n samples */
static qk_result qk__launch_pq_sv(bool real, const double *S, int64_t n, int q, double *F, cudaStream_t st, qk__err *E)
{
    for (int64_t g0 = 0; g0 < n; g0 += 65535) {   /* grid.x within 65535 on every device */
        const dim3 grid((unsigned)std::min<int64_t>(65535, n - g0), (unsigned)q);
        const int64_t R = real ? ((int64_t)1 << q) : ((int64_t)2 << q);
        if (real) qk__k_pq_sv<false><<<grid, 256, 0, st>>>(S + g0 * R, q, F + g0 * 3 * q);
        else qk__k_pq_sv<true><<<grid, 256, 0, st>>>(S + g0 * R, q, F + g0 * 3 * q);
        QK_LAUNCH_CK("qk__k_pq_sv");
    }
    return QK_OK;
}

/* qk__k_pq_mps: nblk blocks of QK__PQ_TPB threads, smem bytes of dynamic shared memory where
   in_smem (the attribute set by the caller) */
static qk_result qk__launch_pq_mps(const double *lanes, int64_t n, int q, const int *Dd, const int *ord, const int64_t *off, int64_t group,
                                   int nj, const int64_t *loff, int dmax, double *scratch, int64_t per_block, int in_smem, size_t smem,
                                   int nblk, double *F, cudaStream_t st, qk__err *E)
{
    qk__k_pq_mps<<<(unsigned)nblk, QK__PQ_TPB, in_smem ? smem : 0, st>>>(lanes, n, q, Dd, ord, off, group, nj, loff, dmax, scratch, per_block,
                                                                         in_smem, F);
    QK_LAUNCH_CK("qk__k_pq_mps");
    return QK_OK;
}

/* qk__k_pq_rbf: 64 x 64 pairs a block of 256 threads over rows [r0, r0 + rows) and ncols columns */
static qk_result qk__launch_pq_rbf(bool f32, const double *Fa, const double *Fb, int64_t r0, int64_t rows, int64_t ncols, int nf, double coef,
                                   void *K, int64_t ldk, int sym, cudaStream_t st, qk__err *E)
{
    const int64_t gy = (rows + QK__PQ_BM - 1) / QK__PQ_BM, gx = (ncols + QK__PQ_BM - 1) / QK__PQ_BM;
    for (int64_t y0 = 0; y0 < gy; y0 += 65535) {   /* grid.y within 65535 */
        const dim3 grid((unsigned)gx, (unsigned)std::min<int64_t>(65535, gy - y0));
        const int64_t rr0 = r0 + y0 * QK__PQ_BM, rrows = std::min<int64_t>(rows - y0 * QK__PQ_BM, (int64_t)65535 * QK__PQ_BM);
        /* K's row rr0 sits at (rr0 - r0) rows into the slab (sym: r0 = 0, rows from 0) */
        if (f32) {
            float *Kp = (float *)K + (sym ? 0 : (rr0 - r0) * ldk);
            qk__k_pq_rbf<float><<<grid, 256, 0, st>>>(Fa, Fb, rr0, rrows, ncols, nf, coef, Kp, ldk, sym);
        } else {
            double *Kp = (double *)K + (sym ? 0 : (rr0 - r0) * ldk);
            qk__k_pq_rbf<double><<<grid, 256, 0, st>>>(Fa, Fb, rr0, rrows, ncols, nf, coef, Kp, ldk, sym);
        }
        QK_LAUNCH_CK("qk__k_pq_rbf");
    }
    return QK_OK;
}

struct qk__pq_bufs {
    double *dx = nullptr, *S = nullptr, *F = nullptr, *lanes = nullptr, *scr = nullptr;
    void *K = nullptr;
    int *Dd = nullptr, *ord = nullptr;
    int64_t *off = nullptr, *loff = nullptr;
    qk__build_ws ws;
    qk__dprog dp;
    cudaStream_t st = nullptr;
    qk_cuda_pool *lent = nullptr;
    bool own_st = false;
};

static void qk__pq_free(qk__pq_bufs &b)
{
    if (b.st) cudaStreamSynchronize(b.st);
    cudaFree(b.dx); cudaFree(b.S); cudaFree(b.F); cudaFree(b.lanes); cudaFree(b.scr); cudaFree(b.K);
    cudaFree(b.Dd); cudaFree(b.ord); cudaFree(b.off); cudaFree(b.loff);
    cudaFree(b.ws.params); cudaFree(b.ws.tmp); cudaFree(b.ws.inv);
    qk__dprog_free(&b.dp);
    if (b.own_st && b.st) cudaStreamDestroy(b.st);
    qk__pool_return(b.lent);
    cudaGetLastError();
    b = qk__pq_bufs();
}

template <typename V>
static qk_result qk__pq_upload(const V *h, size_t n, V **d, cudaStream_t st, qk__err *E)
{
    QK_CK(cudaMalloc((void **)d, std::max<size_t>(1, n * sizeof(V))));
    QK_CK(cudaMemcpyAsync(*d, h, n * sizeof(V), cudaMemcpyHostToDevice, st));
    return QK_OK;
}

static qk_result qk__pq_run(const qk_map *map, const qk_gram_desc *d, double gamma, const qk_cuda_pq *src, qk_cuda_pool *pool, qk__pq_bufs &b,
                            qk__err *E)
{
    const int q = map->n_qubits, nf = 3 * q, nfeat = map->n_features;
    const int64_t nx = d->n_x, ny = d->y ? d->n_y : 0, cols = d->y ? d->n_y : d->n_x, ntot = nx + ny;
    const int64_t ld = d->ld_out ? d->ld_out : cols;
    const bool f32 = d->out_dtype == QK_F32;
    const size_t es = f32 ? 4 : 8;
    const int path = src->fx ? 0 : src->mps ? 2 : 1; /* 0 host features, 1 statevector, 2 MPS */
    char msg[320];
    size_t fr = 0, tot = 0;
    QK_CK(cudaMemGetInfo(&fr, &tot));
    const double avail = 0.9 * (double)fr;
    /* the features of both sides (resident), then K (all of it where it fits a third of what is
       left, else slabs of rows), then the path's work space in the rest */
    const double fbytes = 8.0 * (double)ntot * nf;
    if (fbytes + (double)cols * es > avail) {
        snprintf(msg, sizeof msg, "qk_gram_projected: the reduced density matrices of %lld samples x %d qubits need %.3g GB of device memory, "
                 "%.3g GB are free", (long long)ntot, q, fbytes * 1e-9, (double)fr * 1e-9);
        return qk__fail_msg(E, QK_ERROR_DEVICE_OUT_OF_MEMORY, msg);
    }
    const double kall = (double)nx * cols * es;
    int64_t slab = nx;
    if (kall > (avail - fbytes) / 3) slab = std::max<int64_t>(1, (int64_t)((avail - fbytes) / 3 / ((double)cols * es)));
    const bool sym = !d->y && slab == nx;
    const double kbytes = (double)slab * cols * es;
    const double wbudget = avail - fbytes - kbytes;
    /* the path's work space: a chunk of samples */
    qk__prog pg;
    int64_t chunk = 0, D = (int64_t)1 << (path == 1 ? q : 0);
    const int64_t R = path == 1 ? (src->real ? D : 2 * D) : 0;
    int dmax = 1, nblk = 0, in_smem = 0;
    size_t smem = 0;
    int64_t per_block = 0;
    std::vector<int64_t> loff;
    if (path == 1) {
        QK_TRY(qk__compile(map, &pg, E));
        const double per = 8.0 * R + 8.0 * pg.P + (pg.passes.size() > 1 ? 16.0 * D : 0.0) + 8.0;
        const double xbytes = 8.0 * (double)ntot * nfeat;
        chunk = (int64_t)std::min<double>((double)std::max(nx, ny), std::floor((wbudget - xbytes) / per));
        if (chunk < 1) {
            snprintf(msg, sizeof msg, "qk_gram_projected: a %d-qubit state needs %.3g GB of device memory beside the features and K "
                     "(%.3g GB), %.3g GB are free", q, (per + xbytes) * 1e-9, (fbytes + kbytes) * 1e-9, (double)fr * 1e-9);
            return qk__fail_msg(E, QK_ERROR_DEVICE_OUT_OF_MEMORY, msg);
        }
    } else if (path == 2) {
        const int ns = src->n_sites;
        loff.resize((size_t)ns + 1);
        int64_t lt = 0;
        for (int s = 0; s <= ns; ++s) {
            dmax = std::max(dmax, src->D[s]);
            loff[(size_t)s] = lt;
            lt += 2 * (int64_t)src->D[s] * src->D[s];
        }
        const int64_t wk = 16 * (int64_t)dmax * dmax + 8 * (int64_t)dmax;
        int optin = 0, dev = -1, sms = 1;
        QK_CK(cudaGetDevice(&dev));
        QK_CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        QK_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        smem = (size_t)wk * sizeof(double);
        in_smem = smem + 1024 <= (size_t)optin;
        per_block = lt + (in_smem ? 0 : wk);
        chunk = std::min<int64_t>(src->chunk, std::max(nx, ny));
        const double lanes_b = 8.0 * (double)((chunk + src->nj - 1) / src->nj) * src->group;
        const int want = (int)std::min<int64_t>(chunk, (int64_t)sms * 8);
        nblk = (int)std::min<double>(want, std::floor((wbudget - lanes_b) / (8.0 * per_block)));
        if (nblk < 1) {
            snprintf(msg, sizeof msg, "qk_gram_projected: the MPS of %lld samples and the environments of %d sites (bond %d) need %.3g GB of "
                     "device memory beside the features and K (%.3g GB), %.3g GB are free", (long long)chunk, ns, dmax,
                     (lanes_b + 8.0 * per_block) * 1e-9, (fbytes + kbytes) * 1e-9, (double)fr * 1e-9);
            return qk__fail_msg(E, QK_ERROR_DEVICE_OUT_OF_MEMORY, msg);
        }
    }
    /* streams */
    if ((b.lent = qk__pool_borrow(pool))) b.st = pool->st[0];
    else {
        b.own_st = true;
        QK_CK(cudaStreamCreateWithFlags(&b.st, cudaStreamNonBlocking));
    }
    /* every device buffer, before the first host write */
    QK_CK(cudaMalloc((void **)&b.F, std::max<size_t>(1, (size_t)fbytes)));
    QK_CK(cudaMalloc(&b.K, (size_t)kbytes));
    double *Fx = b.F, *Fy = d->y ? b.F + nx * nf : b.F;
    if (path == 0) {
        QK_CK(cudaMemcpyAsync(Fx, src->fx, (size_t)nx * nf * 8, cudaMemcpyHostToDevice, b.st));
        if (d->y) QK_CK(cudaMemcpyAsync(Fy, src->fy, (size_t)ny * nf * 8, cudaMemcpyHostToDevice, b.st));
    } else if (path == 1) {
        QK_TRY(qk__dprog_make(pg, map, &b.dp, E));
        /* both sides in one buffer: x's rows, then y's */
        QK_CK(cudaMalloc((void **)&b.dx, std::max<size_t>(1, (size_t)ntot * nfeat * 8)));
        QK_CK(cudaMemcpyAsync(b.dx, d->x, (size_t)nx * nfeat * 8, cudaMemcpyHostToDevice, b.st));
        if (d->y) QK_CK(cudaMemcpyAsync(b.dx + nx * nfeat, d->y, (size_t)ny * nfeat * 8, cudaMemcpyHostToDevice, b.st));
        const double *dy = b.dx + nx * nfeat;
        QK_CK(cudaMalloc(&b.ws.params, std::max<size_t>(1, (size_t)chunk * pg.P * sizeof(double))));
        if (pg.passes.size() > 1) QK_CK(cudaMalloc(&b.ws.tmp, (size_t)chunk * D * 16));
        if (pg.has_amp) QK_CK(cudaMalloc((void **)&b.ws.inv, (size_t)chunk * sizeof(double)));
        QK_CK(cudaMalloc((void **)&b.S, (size_t)chunk * R * 8));
        for (int side = 0; side < (d->y ? 2 : 1); ++side) {
            const int64_t n = side ? ny : nx;
            const double *xs = side ? dy : b.dx;
            double *F = side ? Fy : Fx;
            for (int64_t r0 = 0; r0 < n; r0 += chunk) {
                const int64_t c = std::min(chunk, n - r0);
                QK_TRY(qk__build_states<double>(pg, b.dp, xs + r0 * nfeat, c, b.ws, b.S, src->real != 0, b.st, E));
                QK_TRY(qk__launch_pq_sv(src->real != 0, b.S, c, q, F + r0 * nf, b.st, E));
            }
        }
    } else {
        const int ns = src->n_sites;
        QK_TRY(qk__pq_upload(src->D, (size_t)ns + 1, &b.Dd, b.st, E));
        QK_TRY(qk__pq_upload(src->order, (size_t)ns, &b.ord, b.st, E));
        QK_TRY(qk__pq_upload(src->off, (size_t)ns + 1, &b.off, b.st, E));
        QK_TRY(qk__pq_upload(loff.data(), loff.size(), &b.loff, b.st, E));
        const size_t lanes_b = (size_t)8 * (size_t)((chunk + src->nj - 1) / src->nj) * (size_t)src->group;
        QK_CK(cudaMalloc((void **)&b.lanes, lanes_b));
        QK_CK(cudaMalloc((void **)&b.scr, (size_t)nblk * (size_t)per_block * 8));
        if (in_smem) QK_CK(cudaFuncSetAttribute(qk__k_pq_mps, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        for (int side = 0; side < (d->y ? 2 : 1); ++side) {
            const int64_t n = side ? ny : nx;
            double *F = side ? Fy : Fx;
            for (int64_t r0 = 0; r0 < n; r0 += chunk) {
                const int64_t c = std::min(chunk, n - r0);
                const double *h = nullptr;
                /* the host builds this chunk while the device sweeps the last one */
                const qk_result r = src->build(side, r0, r0 + c, &h, src->user);
                if (r != QK_OK) {
                    if (E->buf && E->size) E->buf[0] = 0;   /* the provider's message stands */
                    return r;
                }
                /* pageable: the copy waits for the last sweep (which reads the buffer), returns
                   once h is staged */
                QK_CK(cudaMemcpyAsync(b.lanes, h, (size_t)8 * (size_t)((c + src->nj - 1) / src->nj) * (size_t)src->group,
                                      cudaMemcpyHostToDevice, b.st));
                QK_TRY(qk__launch_pq_mps(b.lanes, c, ns, b.Dd, b.ord, b.off, src->group, src->nj, b.loff, dmax, b.scr, per_block, in_smem, smem,
                                         (int)std::min<int64_t>(nblk, c), F + r0 * nf, b.st, E));
            }
        }
    }
    /* K, slab by slab, into the caller's buffer */
    const double coef = -2.0 * gamma;
    for (int64_t r0 = 0; r0 < nx; r0 += slab) {
        const int64_t rows = std::min(slab, nx - r0);
        QK_TRY(qk__launch_pq_rbf(f32, Fx, Fy, r0, rows, cols, nf, coef, b.K, cols, sym ? 1 : 0, b.st, E));
        QK_CK(cudaMemcpy2DAsync((char *)d->out + (size_t)r0 * ld * es, (size_t)ld * es, b.K, (size_t)cols * es, (size_t)cols * es, (size_t)rows,
                                cudaMemcpyDeviceToHost, b.st));
        QK_CK(cudaStreamSynchronize(b.st));
    }
    return QK_OK;
}

extern "C" qk_result qk_cuda_gram_projected(const qk_map *map, const qk_gram_desc *desc, double gamma, const qk_cuda_pq *src,
                                            qk_cuda_pool *pool, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!map || !desc || !desc->x || !desc->out || !src || (src->fx && desc->y && !src->fy) || (src->mps && !src->build))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram_projected: NULL argument");
    if (!src->fx && !src->mps && map->n_qubits > QK_MAX_STATE_QUBITS)
        return qk__fail_msg(E, QK_ERROR_TOO_MANY_QUBITS, "qk_cuda_gram_projected: too many qubits for the statevector path");
    if (src->mps && (src->n_sites != map->n_qubits || src->nj < 1 || src->chunk < 1))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram_projected: the MPS description does not fit the map");
    qk__pq_bufs b;
    qk_result r;
    try {
        r = qk__pq_run(map, desc, gamma, src, pool, b, E);
    } catch (const std::bad_alloc &) {
        r = qk__fail_msg(E, QK_ERROR_OUT_OF_MEMORY, "qk_cuda_gram_projected: out of host memory");
    }
    qk__pq_free(b);
    return r;
}
