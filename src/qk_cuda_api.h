/* >>cuda ---- CUDA engine surface (qk_cuda.cu, extern "C") ---- */
/* Implemented in qk_cuda.cu; qk.h calls them only when QK_CUDA is defined. Declared with
   QK_CUDA_DEF, always extern (qk_cuda.cu defines them in its own translation unit), so that
   QK_STATIC, which makes qk.h's own functions static, still links with the engine. */
#ifndef QK_CUDA_DEF
#define QK_CUDA_DEF extern
#endif
QK_CUDA_DEF int qk_cuda_device_count(void);
QK_CUDA_DEF qk_result qk_cuda_device_query(int device, qk_device_info *info, char *err, size_t err_size);
/* Where the GPU engine hands finished rows of K on the host (every output but DEVICE and a
   pinned HOST buffer): rows [i0, i0 + m) x all columns, row-major with leading dimension ld, in
   the output dtype, in row order, from the thread that called qk_cuda_gram; the pointer is
   valid during the call. Returns QK_OK, or a qk_result that stops the job (with the detail set
   by the callee: qk_cuda_gram then leaves err empty and returns that result). */
typedef qk_result (*qk_rows_fn)(int64_t i0, int64_t m, const void *rows, int64_t ld, void *user);
/* Stream-pool figures of one qk_cuda_gram: per-stream busy time (sum of the intervals its
   operations ran, from events) and the wall time from the first to the last event. Stream 0
   computes (states, Gram), stream 1 copies K to the host. */
typedef struct qk_cuda_stats {
    int n_streams;
    int n_slabs;
    double busy_ms[4];
    double wall_ms;             /* first event (after the x upload was queued) to the last */
    double states_ms;           /* bulk state construction (0 when states are built in tiles) */
    double gram_ms;             /* first slab's start to the last slab's end (compute stream) */
    double output_ms;           /* first slab's start to the last D2H's end (= gram_ms on device) */
    double deliver_ms;          /* host time in the rows callback (copy-out, file writes) */
} qk_cuda_stats;
/* The host side of a GPU Gram: where staged slabs go, the pinned staging to use, the figures. */
typedef struct qk_cuda_io {
    qk_rows_fn rows;            /* host-side slabs (NULL only for DEVICE or pinned HOST output) */
    void *rows_user;
    void *stage[2];             /* two pinned slabs of stage_bytes owned by the caller (a context
                                   keeps them across calls); NULL or too small: the engine
                                   allocates its own for the call (cudaMallocHost pins ~5 GB/s) */
    size_t stage_bytes;
    qk_cuda_stats *stats;       /* may be NULL */
} qk_cuda_io;
/* Runs a planned Gram on the device (plan->backend == QK_BACKEND_CUDA, data already validated by
   qk_gram). On failure writes a detail ("cudaMalloc(...) at qk_cuda.cu:123: out of memory") to
   err. */
QK_CUDA_DEF qk_result qk_cuda_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc,
                                   const qk_cuda_io *io, char *err, size_t err_size);
/* The MPS path on the GPU (docs/mps.md): qk.h builds every sample's MPS on the host and hands
   over the site tensors padded to bond chi on both sides, as interleaved (re, im) doubles in the
   layout [site][entry][sample], entry (l * 2 + a) * chi + r of A[l][a][r]; b NULL for K(X,X).
   K goes out as qk_cuda_gram's does (io->rows for host outputs, desc->out for DEVICE), computed
   in plan->precision (FP64 and FP32X3: double, else float) and written in plan->out_dtype. */
typedef struct qk_cuda_mps {
    int n_sites, chi;
    const double *a;            /* n_a samples */
    int64_t n_a;
    const double *b;            /* n_b samples, or NULL */
    int64_t n_b;
} qk_cuda_mps;
QK_CUDA_DEF qk_result qk_cuda_mps_gram(const qk_plan *plan, const qk_gram_desc *desc, const qk_cuda_mps *mps,
                                       const qk_cuda_io *io, char *err, size_t err_size);
/* Page-locked host memory (cudaMallocHost), for staging kept by a context. */
QK_CUDA_DEF qk_result qk_cuda_host_alloc(size_t bytes, void **p, char *err, size_t err_size);
QK_CUDA_DEF void qk_cuda_host_free(void *p);
/* 1 when p is page-locked host memory (cudaMallocHost / cudaHostRegister), else 0. */
QK_CUDA_DEF int qk_cuda_host_pinned(const void *p);
/* Tests: the k-th resource acquisition of the GPU engine from now on fails as if out of memory
   (k < 0: the -k-th and every later one; 0: off); the count of acquisitions so far. Not for
   concurrent use. */
QK_CUDA_DEF void qk_cuda_test_fail_alloc(int k);
QK_CUDA_DEF int qk_cuda_test_alloc_count(void);
/* The GPU engine's figures of the last qk_gram on ctx (zeros when it ran on the CPU engine; on
   several GPUs those of the first). */
QKDEF qk_cuda_stats qk_ctx_cuda_stats(const qk_ctx *ctx);
/* Per GPU of the last qk_gram on ctx: seconds[k] from the job's start to the moment GPU k
   (plan.devices[k]) finished its share, k < the returned count (plan.n_devices; 0 when it ran
   on the CPU engine); at most max values are written. The load balance is max / mean. */
QKDEF int qk_ctx_device_seconds(const qk_ctx *ctx, double *seconds, int max);
/* Makes ordinal the calling thread's current CUDA device (cudaSetDevice); the GPU engine runs
   on the current device. */
QK_CUDA_DEF qk_result qk_cuda_set_device(int ordinal, char *err, size_t err_size);
/* A monotonic clock, seconds (std::chrono::steady_clock). */
QK_CUDA_DEF double qk_cuda_wtime(void);
/* States of n samples built on the device, copied back as interleaved complex doubles (tests). */
QK_CUDA_DEF qk_result qk_cuda_states(const qk_map *map, const double *x, int64_t n, qk_precision precision,
                                     double *out, char *err, size_t err_size);
/* Amplitude encoding of host data into device states: row i of x (n x d doubles, host) becomes
   x_i / ||x_i||, zero-padded to 2^n_qubits, cast to the precision (real float or double),
   written to out_dev (n x 2^n_qubits, device). Batches of `batch` rows (default 64) go H2D
   double-buffered on one stream while the normalize/pad/cast kernel runs on another; x is
   read in place when it is pinned, else staged through pinned buffers. Rows must have a
   non-zero finite norm (qk_map_check_data); seconds, when not NULL, gets the wall time of the
   pipeline (first H2D to last kernel, events). */
QK_CUDA_DEF qk_result qk_cuda_amplitude_encode(const double *x, int64_t n, int d, int n_qubits, qk_precision precision,
                                               void *out_dev, int64_t batch, double *seconds, char *err, size_t err_size);
/* Autotune of the Gram kernel for a plan's shape (path, precision, qubits, output dtype): times
   every candidate (fused tile configurations 1..6, cuBLAS, CGEMM3M for complex fp32, and the
   tensor-core engine of the plan's precision: TF32, FP32X3, FP16, FP64 real form) on n
   random states of the plan's size, K(X,X) to a device buffer, with CUDA events (one warm-up,
   the median of reps). best is the index of the fastest candidate; apply it to a plan with
   use_blas = blas[best], kernel_cfg = cfg[best]. */
typedef struct qk_cuda_tune_result {
    int n;                      /* candidates timed */
    int blas[12], cfg[12];
    double ms[12];              /* median milliseconds per K(X,X) of n_samples */
    int best;
    int64_t n_samples;
} qk_cuda_tune_result;
QK_CUDA_DEF qk_result qk_cuda_tune_gram(const qk_plan *plan, int64_t n_samples, int reps, qk_cuda_tune_result *res,
                                        char *err, size_t err_size);

