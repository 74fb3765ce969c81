/* >>context ---- context ---- */
typedef enum qk_device {
    QK_DEVICE_AUTO = 0,     /* CUDA when a device and the engine exist, else CPU (logged) */
    QK_DEVICE_CPU,
    QK_DEVICE_CUDA
} qk_device;

/* Precision of the GPU Gram. Every mode builds the states in float (FP64: double); the modes
   after FP64 run the inner products on the tensor cores from 6 qubits on (FP32X3 from 7; below,
   the FP32 kernel, at least as accurate, is faster: plan.config says so) up to 24. Each mode's
   error against float64 and its tested bound are in docs/precision.md. The CPU engine accepts
   every mode and computes in fp64; the output dtype defaults to float32 for every mode but FP64. */
typedef enum qk_precision {
    QK_PRECISION_DEFAULT = 0,   /* = FP64 on the CPU engine, AUTO on the GPU engine (FP32 with
                                   the default tol: results as before) */
    QK_PRECISION_FP32,          /* float states and accumulation (GPU); CPU computes in fp64 */
    QK_PRECISION_FP64,          /* double throughout */
    QK_PRECISION_TF32,          /* GPU: one TF32 tensor-core product (operands rounded to 11
                                   significant bits, fp32 accumulation): K error ~1e-3 */
    QK_PRECISION_FP32X3,        /* GPU: fp32-level accuracy on the tensor cores: every amplitude
                                   (scaled) split into an fp16 high part and an fp16 remainder,
                                   three products lo*hi + hi*lo + hi*hi, fp32 accumulation */
    QK_PRECISION_FP16,          /* GPU: fp16 operands (scaled by a power of two, so no amplitude
                                   underflows), fp32 accumulation: K error ~1e-3, the fastest */
    QK_PRECISION_AUTO           /* the fastest mode whose stated error bound
                                   (qk_precision_error_bound) meets qk_gram_desc.tol (default:
                                   fp32's bound, so the GPU picks fp32). DEFAULT on the GPU engine
                                   is AUTO; the CPU engine computes in fp64 (meets any tol) */
} qk_precision;
#define QK_PRECISION_COUNT 7    /* number of qk_precision values (DEFAULT included) */

/* The stated bound of max |K - K_exact| over the entries of K (0 <= K <= 1) of the GPU engine in
   mode p at n_qubits (docs/precision.md; the GPU suite holds every mode to it):
       1e-4 (1 + q/4) + 2^(q-24) / 4 + 1e-4 + op(p)
   the fp32 tolerance (float states, the drift of a float sum of 2^q products) plus op, the
   operand rounding of a tensor-core mode: 2 sqrt(2) e_p + e_p^2, e_p = 2u + u^2 (u = 2^-11
   TF32 and FP16) or 3 * 2^-22 (FP32X3); FP64 1e-10. DEFAULT, AUTO or a bad value: -1. */
QKDEF double qk_precision_error_bound(qk_precision p, int n_qubits);

typedef enum qk_log_level { QK_LOG_INFO = 1, QK_LOG_WARN, QK_LOG_ERROR } qk_log_level;
typedef void (*qk_log_fn)(qk_log_level level, const char *msg, void *user);

typedef struct qk_allocator {
    void *(*alloc)(size_t size, void *user);    /* all or none */
    void (*free)(void *ptr, void *user);
    void *user;
} qk_allocator;

/* The most CUDA devices one context drives (qk_ctx_desc.n_cuda_devices, qk_plan.devices). */
#define QK_MAX_DEVICES 16

typedef struct qk_ctx_desc {
    qk_device device;       /* default AUTO */
    int n_threads;          /* CPU engine threads; default: all online cores */
    int cuda_device;        /* one CUDA device ordinal, used alone when non-zero and n_cuda_devices
                               is 0, or when n_cuda_devices is 1 and cuda_devices is NULL */
    /* The GPUs of the context (docs/api.md, "Several GPUs"). n_cuda_devices = 0 (default): every
       visible device (at most QK_MAX_DEVICES) when cuda_device is 0, else cuda_device alone;
       n > 0: cuda_devices[0 .. n) (distinct ordinals; NULL: cuda_device alone when n is 1, else
       ordinals 0 .. n-1). A qk_gram of at least QK_MGPU_MIN_PAIRS pairs per GPU is dealt to the
       GPUs (rows balanced by pair count, one host thread per GPU); smaller ones run on the first.
       qk_ctx_query gives the resolved list (cuda_devices points into the context). */
    const int *cuda_devices;
    int n_cuda_devices;
    double vram_fraction;   /* share of free device memory the planner may use; default 0.85 */
    int autotune;           /* 0 default: cached configuration, tuned and stored on a miss; 1: tune
                               now and store (qk-gram --autotune); -1 off: the fixed
                               per-architecture table (docs/autotune.md) */
    const char *cache_dir;  /* autotune cache directory (copied); default $QK_CACHE_DIR, $XDG_CACHE_HOME/qk, ~/.cache/qk */
    qk_log_fn log;          /* default: none (the library prints nothing) */
    void *log_user;
    qk_allocator allocator; /* default: QK_MALLOC / QK_FREE. The context and its thread pool only;
                               maps, readers, writers and the CPU engine's per-call scratch (its
                               worker threads) use QK_MALLOC / QK_FREE (docs/api.md) */
    size_t host_memory;     /* CPU engine: host bytes its plans may use (states, streamed-output
                               slabs, per-thread scratch; not K in the caller's buffer); when all
                               states do not fit, they are built in blocks (state tiles). Default
                               0: 85% of the available memory at each plan (Linux: MemAvailable,
                               bounded by a cgroup v2 memory.max; elsewhere sysconf) */
} qk_ctx_desc;

typedef struct qk_ctx qk_ctx;

QKDEF qk_result qk_ctx_create(const qk_ctx_desc *desc, qk_ctx **out);
QKDEF void qk_ctx_destroy(qk_ctx *ctx);
/* The resolved desc (defaults filled in, device resolved to CPU or CUDA). */
QKDEF qk_ctx_desc qk_ctx_query(const qk_ctx *ctx);

/* >>gram ---- Gram ---- */
/* How K is computed (qk_plan.path; qk_gram_desc.path requests one):
     ANALYTIC  product maps: per-qubit overlaps, no states
     REAL      real statevectors (2^q doubles per sample), real Gram
     COMPLEX   complex statevectors, complex Gram
     MPS       matrix product states of the exact bond bound, transfer-matrix overlaps (CPU
               engine; docs/mps.md): entangled maps with local gates, any qubit count */
typedef enum qk_path { QK_PATH_DEFAULT = 0, QK_PATH_ANALYTIC = 1, QK_PATH_REAL, QK_PATH_COMPLEX, QK_PATH_MPS } qk_path;

typedef enum qk_dtype { QK_DTYPE_DEFAULT = 0, QK_F32, QK_F64 } qk_dtype;

typedef enum qk_output {
    QK_OUTPUT_HOST = 0,     /* out is a host buffer (default): pinned or pageable, fresh or reused */
    QK_OUTPUT_DEVICE,       /* out is a CUDA device pointer (GPU engine only) */
    QK_OUTPUT_CALLBACK,     /* square tiles are handed to tile_fn; out unused */
    QK_OUTPUT_NPY           /* K is streamed into the .npy file out_path; out unused */
} qk_output;

/* A finished tile: rows [i0, i0+m) x cols [j0, j0+n) of K, row-major with leading dimension ld,
   on the host, in the output dtype. Tiles are square (plan.tile_m on a side, smaller at the
   right and bottom edges) and every tile is delivered once; for symmetric K(X,X) only tiles
   with j0 >= i0 are delivered (diagonal tiles whole; the caller mirrors the others). The pointer
   is valid during the call only. Calls come from one thread at a time, in no promised order.
   Return non-zero to cancel (qk_gram then returns QK_ERROR_CANCELLED). */
typedef int (*qk_tile_fn)(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *tile,
                          int64_t ld, void *user);
/* Progress: done of total pairs; return non-zero to cancel. */
typedef int (*qk_progress_fn)(int64_t done, int64_t total, void *user);

typedef struct qk_gram_desc {
    const double *x;        /* n_x rows of map->n_features, row-major, host */
    int64_t n_x;
    const double *y;        /* NULL: K(X,X), symmetric */
    int64_t n_y;
    void *out;              /* n_x x n_y (n_x x n_x) row-major, leading dimension ld_out */
    int64_t ld_out;         /* default: number of columns */
    qk_dtype out_dtype;     /* default F64 (CPU) / F32 when precision is FP32, TF32, FP32X3 or FP16 */
    qk_output output;       /* default HOST */
    qk_tile_fn tile_fn;     /* for QK_OUTPUT_CALLBACK */
    void *tile_user;
    qk_precision precision; /* default per engine (see qk_precision) */
    qk_progress_fn progress;
    void *progress_user;
    /* QK_OUTPUT_NPY: K goes to the .npy file out_path (float32 or float64 as out_dtype) while it
       is computed; K is never whole in host memory. The file is written as a temporary file in
       the same directory (out_path.tmp.<pid>.<k>), synced and renamed over out_path when K is
       complete; on any error or cancel the temporary file is removed and out_path is untouched. */
    const char *out_path;
    int no_sync;            /* QK_OUTPUT_NPY: 1 skips the final fdatasync (not durable); default 0 */
    double tol;             /* precision AUTO (and DEFAULT on the GPU engine): largest acceptable
                               error bound of K (qk_precision_error_bound); default (0): fp32's
                               bound at the map's qubit count, so the GPU keeps fp32 */
    qk_path path;           /* default (0): the planner picks statevector or MPS (docs/mps.md);
                               QK_PATH_MPS forces MPS (an error where the map is a product or its bond
                               bound exceeds QK_MPS_MAX_BOND); REAL or COMPLEX forces the statevector
                               (the map's class decides real or complex). Product maps always take
                               ANALYTIC. */
    /* QK_OUTPUT_DEVICE with a plan on several GPUs (qk_plan.n_devices > 1): one device buffer
       per GPU, out_devices[k] on plan.devices[k], holding rows [plan.dev_row0[k],
       plan.dev_row0[k + 1]) of K with leading dimension ld_out (default: columns of K); for
       K(X,Y) whole rows; for K(X,X) the columns from the band's first row on (its diagonal
       block whole, and the part right of it: K[i][j] for j >= dev_row0[k]); the columns left of
       the band are the mirror of other GPUs' parts (K[i][j] = K[j][i]) and are not written.
       Plan first (qk_plan_make) to size them. NULL with several GPUs is an error; with one,
       out_devices[0] (when set) is used as out. Default NULL. */
    void *const *out_devices;
    /* MPS path, truncation on request (docs/mps.md; exact when both are 0, the default): */
    int mps_max_bond;       /* 0: exact; 1..QK_MPS_MAX_BOND: keep at most this many Schmidt values
                               per bond (SVD truncation; the planner's bond and cost use it) */
    double mps_cutoff;      /* 0: none; in (0, 1): at each truncation also drop the smallest Schmidt
                               values while their share of the weight stays <= mps_cutoff */
    double *mps_discarded;  /* NULL, or n_x (+ n_y for K(X,Y)) doubles: per sample (X then Y) eps_i,
                               a bound on the infidelity 1 - |<psi_i|psi~_i>|^2 of its truncated
                               state (0 when nothing was dropped or the path is not MPS); then
                               |K_ij - K~_ij| <= sqrt(eps_i) + sqrt(eps_j) */
} qk_gram_desc;

QKDEF qk_result qk_gram(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc);

/* States of n samples: out holds n * 2^q complex values, interleaved (re, im) doubles, the layout
   of numpy complex128. Product maps work too (up to QK_MAX_STATE_QUBITS). */
QKDEF qk_result qk_states(qk_ctx *ctx, const qk_map *map, const double *x, int64_t n, double *out);

