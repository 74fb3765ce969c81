/* qk.h — quantum-kernel Gram matrices, K[i][j] = |<psi(x_i)|psi(y_j)>|^2, on CPU and GPU.

   A single-file (stb-style) C library. In ONE C or C++ file of your program write

       #define QK_IMPLEMENTATION
       #include "qk.h"

   and include "qk.h" plainly everywhere else. The CUDA engine lives in qk_cuda.cu: compile it
   with nvcc, link it, and define QK_CUDA=1 where you define QK_IMPLEMENTATION. Without QK_CUDA
   the library runs on the CPU engine only (device AUTO falls back to it; device CUDA is an error).

   What it does
   ------------
   Classical data X (n x d, double, row-major) is encoded by a feature map (a small circuit IR:
   qk_map) into states psi(x) of q qubits. qk_gram() computes K(X,X) (symmetric: only i <= j is
   computed, then mirrored) or K(X,Y). Maps are classified when built:
     PRODUCT  no entangling op: K is a product of per-qubit overlaps, no state vectors at all,
              any number of qubits (QK_MAX_PRODUCT_QUBITS).
     REAL     every op keeps amplitudes real (H, X, Z, RY, CZ, CNOT, amplitude, basis): a real
              Gram, a quarter of the complex arithmetic.
     COMPLEX  everything else: complex Gram.

   Conventions (docs/maps.md): qubit 0 is the least significant bit of the basis index (Qiskit's
   order); feature i drives qubit i. Gate matrices are Qiskit's / PennyLane's:
     RX(t) = [[c, -is], [-is, c]], RY(t) = [[c, -s], [s, c]], c = cos(t/2), s = sin(t/2)
     RZ(t) = diag(e^{-it/2}, e^{it/2}), P(t) = diag(1, e^{it}), RZZ(t) = exp(-i t/2 Z(x)Z)

   Configuration macros (define before the implementation include)
   ---------------------------------------------------------------
     QK_IMPLEMENTATION    expand the implementation in this translation unit
     QK_STATIC            make every function static (private to that translation unit)
     QK_CUDA              1: the CUDA engine (qk_cuda.cu) is linked
     QK_ASSERT(c)         internal assertions (default: assert from <assert.h>)
     QK_MALLOC(sz) / QK_REALLOC(p, sz) / QK_FREE(p)
                          allocator for host memory (all three or none); a runtime allocator
                          can also be set in qk_ctx_desc
     QK_NO_THREADS        build the CPU engine without pthreads (single threaded)

   Thread safety
   -------------
   A qk_ctx may be used by one thread at a time. Maps are immutable after construction (except
   qk_map_set_weights) and may be shared by threads for reading. The detail message
   (qk_last_error) is thread-local. The npy/csv helpers are reentrant.

   Errors
   ------
   Every fallible call returns qk_result (QK_OK = 0). qk_result_string() names it and
   qk_last_error() gives a detail message for the calling thread ("X[17][3] is NaN"). The library
   never exits, aborts or prints unless a log callback is set. On error the caller's output is
   left untouched, unless a function documents otherwise.

   License: MIT (end of file).
*/
#ifndef QK_H
#define QK_H

#include <stddef.h>
#include <stdint.h>

#define QK_VERSION_MAJOR 0
#define QK_VERSION_MINOR 1
#define QK_VERSION_PATCH 0
#define QK_VERSION_STRING "0.1.0"

/* Largest state (in qubits) the statevector engines build; product maps have no such limit. */
#define QK_MAX_STATE_QUBITS 30
/* Largest qubit count of any map (product maps evaluated analytically). */
#define QK_MAX_PRODUCT_QUBITS 4096

#ifndef QKDEF
#ifdef QK_STATIC
#define QKDEF static
#else
#define QKDEF extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- results ---- */
typedef enum qk_result {
    QK_OK = 0,
    QK_ERROR_INVALID_ARGUMENT,   /* NULL pointer, bad size, bad option value */
    QK_ERROR_NON_FINITE,         /* NaN or Inf in input data */
    QK_ERROR_SHAPE,              /* feature count / shape mismatch */
    QK_ERROR_PARSE,              /* malformed map spec */
    QK_ERROR_TOO_MANY_QUBITS,    /* state would exceed QK_MAX_STATE_QUBITS */
    QK_ERROR_ZERO_NORM,          /* amplitude encoding of a zero (or non-finite) norm row */
    QK_ERROR_BAD_DATA,           /* data out of a map's domain (basis encoding of 0.5) */
    QK_ERROR_OUT_OF_MEMORY,      /* host allocation failed */
    QK_ERROR_IO,                 /* file cannot be read or written */
    QK_ERROR_FORMAT,             /* malformed .npy / .csv / cache file */
    QK_ERROR_NO_DEVICE,          /* CUDA requested but no device or no CUDA engine linked */
    QK_ERROR_CUDA,               /* a CUDA / cuBLAS call failed (detail names the call) */
    QK_ERROR_DEVICE_OUT_OF_MEMORY, /* device memory exhausted even at the smallest tiles */
    QK_ERROR_CANCELLED,          /* a callback asked to stop */
    QK_ERROR_UNSUPPORTED,        /* valid request this build cannot serve */
    QK_RESULT_COUNT_
} qk_result;

QKDEF const char *qk_result_string(qk_result r);
/* Detail message of the last error on this thread ("" when none). */
QKDEF const char *qk_last_error(void);

/* ---- feature maps ---- */
typedef enum qk_op_kind {
    QK_OP_H = 1, QK_OP_X, QK_OP_Y, QK_OP_Z,
    QK_OP_RX, QK_OP_RY, QK_OP_RZ, QK_OP_P,     /* one qubit (q0), angle */
    QK_OP_CNOT, QK_OP_CZ,                       /* control q0, target q1 */
    QK_OP_RZZ,                                  /* exp(-i t/2 Z_q0 Z_q1) (PennyLane MultiRZ on 2 wires) */
    QK_OP_AMPLITUDE,                            /* state := x / ||x||, zero-padded (first op only) */
    QK_OP_BASIS,                                /* X on q0 when feature angle.x0 is 1 (must be 0 or 1) */
    QK_OP_KIND_COUNT_
} qk_op_kind;

/* An op's angle: theta = scale * f + offset, with f chosen by kind. */
typedef enum qk_arg_kind {
    QK_ARG_CONST = 0,   /* f = 0: theta = offset */
    QK_ARG_X,           /* f = x[x0] */
    QK_ARG_XX,          /* f = x[x0] * x[x1] */
    QK_ARG_PIXX,        /* f = (pi - x[x0]) * (pi - x[x1]) */
    QK_ARG_W,           /* f = w[w] */
    QK_ARG_WX,          /* f = w[w] * x[x0] */
    QK_ARG_KIND_COUNT_
} qk_arg_kind;

typedef struct qk_angle {
    qk_arg_kind kind;
    int x0, x1;         /* feature indices */
    int w;              /* weight index */
    double scale;       /* 0 is a real zero here (not "default"): constructors set 1 */
    double offset;
} qk_angle;

typedef struct qk_op {
    qk_op_kind kind;
    int q0, q1;
    qk_angle angle;
} qk_op;

typedef enum qk_map_class {
    QK_CLASS_PRODUCT = 1,   /* no entangling op: analytic kernel */
    QK_CLASS_REAL,          /* real amplitudes: real Gram */
    QK_CLASS_COMPLEX        /* general */
} qk_map_class;

typedef enum qk_map_type {
    QK_MAP_DEFAULT = 0,     /* = QK_MAP_ZZ */
    QK_MAP_ZZ,              /* Qiskit ZZFeatureMap */
    QK_MAP_IQP,             /* PennyLane IQPEmbedding */
    QK_MAP_ANGLE,           /* PennyLane AngleEmbedding */
    QK_MAP_AMPLITUDE,       /* PennyLane AmplitudeEmbedding (normalize, zero pad) */
    QK_MAP_BASIS,           /* PennyLane BasisEmbedding (features 0/1) */
    QK_MAP_HEA,             /* trainable hardware-efficient ansatz, data re-uploading */
    QK_MAP_CUSTOM           /* ops given by the caller or parsed from circuit(...) */
} qk_map_type;

typedef enum qk_entanglement {
    QK_ENT_DEFAULT = 0,     /* = FULL */
    QK_ENT_FULL,            /* all pairs (i, j), i < j, lexicographic */
    QK_ENT_LINEAR,          /* (0,1), (1,2), ... */
    QK_ENT_REVERSE_LINEAR,  /* (q-2,q-1), ..., (0,1) */
    QK_ENT_CIRCULAR,        /* (q-1,0) then linear (Qiskit's order; no wrap pair when q <= 2) */
    QK_ENT_PAIRWISE,        /* (0,1),(2,3),... then (1,2),(3,4),... */
    QK_ENT_SCA              /* shifted circular alternating (Qiskit), depends on the rep */
} qk_entanglement;

typedef struct qk_map_desc {
    qk_map_type type;       /* default ZZ */
    int n_features;         /* required (> 0) */
    int n_qubits;           /* default: n_features (amplitude: ceil(log2(n_features))) */
    int reps;               /* zz, iqp (n_repeats), hea (layers); default 2 for zz/hea, 1 for iqp */
    double alpha;           /* zz scale; default 2.0 */
    qk_entanglement ent;    /* zz pattern; default FULL */
    char rot;               /* angle: 'x' (default), 'y', 'z'; hea: 'y' (default, real) or 'z' (RY then RZ) */
    int cnot;               /* hea ring: 0 = CZ (default), 1 = CNOT */
    const qk_op *ops;       /* custom: the op list (copied) */
    int n_ops;              /* custom */
    int n_weights;          /* custom: number of trainable weights */
} qk_map_desc;

typedef struct qk_map {
    qk_map_type type;
    qk_map_class cls;
    int n_qubits, n_features, n_weights;
    int n_ops;
    qk_op *ops;             /* owned */
    double *weights;        /* owned; n_weights values, default 1.0 */
    qk_map_desc desc;       /* resolved desc (ops pointer cleared) */
} qk_map;

QKDEF qk_result qk_map_make(const qk_map_desc *desc, qk_map **out);
/* Spec string (the CLI's --map): "zz(reps=2,ent=linear)", "iqp", "angle(rot=y)", "amplitude",
   "basis", "hea(layers=2,rot=y,ent=cz)", "circuit(qubits=2: h(0) rz(0, 2*x0) cx(0,1) ...)".
   docs/maps.md has the grammar. n_features comes from the data. Errors name the column. */
QKDEF qk_result qk_map_parse(const char *spec, int n_features, qk_map **out);
QKDEF void qk_map_free(qk_map *map);
/* Copies n weights (n must equal map->n_weights; all finite). */
QKDEF qk_result qk_map_set_weights(qk_map *map, const double *w, int n);
/* Writes a spec string that qk_map_parse() turns back into the same map (including custom
   circuits). Returns the length it needs (like snprintf). */
QKDEF int qk_map_spec(const qk_map *map, char *buf, size_t size);
QKDEF const char *qk_map_class_string(qk_map_class c);

/* Evaluate every op's angle for one sample (n_ops values; ops with no angle get 0). */
QKDEF void qk_map_angles(const qk_map *map, const double *x, double *theta);
/* Checks x (n rows of map->n_features) for the map: finite, basis 0/1, amplitude non-zero norm.
   The detail message names the first bad row and column. */
QKDEF qk_result qk_map_check_data(const qk_map *map, const double *x, int64_t n, const char *name);

/* ---- context ---- */
typedef enum qk_device {
    QK_DEVICE_AUTO = 0,     /* CUDA when a device and the engine exist, else CPU (logged) */
    QK_DEVICE_CPU,
    QK_DEVICE_CUDA
} qk_device;

typedef enum qk_precision {
    QK_PRECISION_DEFAULT = 0,   /* = FP64 on the CPU engine, FP32 on the GPU engine */
    QK_PRECISION_FP32,          /* float states and accumulation (GPU); CPU computes in fp64 */
    QK_PRECISION_FP64
} qk_precision;

typedef enum qk_log_level { QK_LOG_INFO = 1, QK_LOG_WARN, QK_LOG_ERROR } qk_log_level;
typedef void (*qk_log_fn)(qk_log_level level, const char *msg, void *user);

typedef struct qk_allocator {
    void *(*alloc)(size_t size, void *user);    /* all or none */
    void (*free)(void *ptr, void *user);
    void *user;
} qk_allocator;

typedef struct qk_ctx_desc {
    qk_device device;       /* default AUTO */
    int n_threads;          /* CPU engine threads; default: all online cores */
    int cuda_device;        /* CUDA device ordinal; default 0 */
    double vram_fraction;   /* share of free device memory the planner may use; default 0.85 */
    int autotune;           /* 0 default (on), 1 on, -1 off (fixed per-architecture table) */
    const char *cache_dir;  /* autotune cache directory; default $QK_CACHE_DIR, $XDG_CACHE_HOME/qk, ~/.cache/qk */
    qk_log_fn log;          /* default: none (the library prints nothing) */
    void *log_user;
    qk_allocator allocator; /* default: QK_MALLOC / QK_FREE */
} qk_ctx_desc;

typedef struct qk_ctx qk_ctx;

QKDEF qk_result qk_ctx_create(const qk_ctx_desc *desc, qk_ctx **out);
QKDEF void qk_ctx_destroy(qk_ctx *ctx);
/* The resolved desc (defaults filled in, device resolved to CPU or CUDA). */
QKDEF qk_ctx_desc qk_ctx_query(const qk_ctx *ctx);

/* ---- Gram ---- */
typedef enum qk_dtype { QK_DTYPE_DEFAULT = 0, QK_F32, QK_F64 } qk_dtype;

typedef enum qk_output {
    QK_OUTPUT_HOST = 0,     /* out is a host buffer (default) */
    QK_OUTPUT_DEVICE,       /* out is a CUDA device pointer (GPU engine only) */
    QK_OUTPUT_CALLBACK      /* tiles are handed to tile_fn; out unused */
} qk_output;

/* A finished tile: rows [i0, i0+m) x cols [j0, j0+n) of K, row-major with leading dimension ld,
   on the host, in the output dtype. For symmetric K(X,X) only tiles with j0 >= i0 are delivered
   (the caller mirrors). Return non-zero to cancel (qk_gram then returns QK_ERROR_CANCELLED). */
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
    qk_dtype out_dtype;     /* default F64 (CPU) / F32 when precision is FP32 */
    qk_output output;       /* default HOST */
    qk_tile_fn tile_fn;     /* for QK_OUTPUT_CALLBACK */
    void *tile_user;
    qk_precision precision; /* default per engine (see qk_precision) */
    qk_progress_fn progress;
    void *progress_user;
} qk_gram_desc;

QKDEF qk_result qk_gram(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc);

/* States of n samples: out holds n * 2^q complex values, interleaved (re, im) doubles, the layout
   of numpy complex128. Product maps work too (up to QK_MAX_STATE_QUBITS). */
QKDEF qk_result qk_states(qk_ctx *ctx, const qk_map *map, const double *x, int64_t n, double *out);

/* ---- device info, planner, VRAM estimator ---- */
typedef struct qk_device_info {
    int present;                /* 0: no CUDA device (CPU engine) */
    char name[128];
    int cc_major, cc_minor;
    int sm_count;
    size_t total_bytes, free_bytes;
    size_t smem_per_block_optin;
    size_t l2_bytes;
} qk_device_info;

typedef enum qk_backend { QK_BACKEND_CPU = 1, QK_BACKEND_CUDA } qk_backend;
typedef enum qk_path { QK_PATH_ANALYTIC = 1, QK_PATH_REAL, QK_PATH_COMPLEX } qk_path;

typedef struct qk_plan {
    qk_backend backend;
    qk_path path;
    qk_precision precision;
    qk_dtype out_dtype;
    qk_output output;
    int n_qubits;
    int64_t n_x, n_y;
    int symmetric;
    int n_threads;              /* CPU engine */
    int bulk_states;            /* 1: all states resident at once; 0: state tiles */
    int64_t state_tile;         /* states per tile when not bulk (power of two) */
    int64_t tile_m, tile_n;     /* K tile shape */
    int n_streams;
    size_t bytes_states, bytes_out, bytes_staging, bytes_workspace, bytes_total;
    size_t bytes_budget;        /* vram_fraction * free (GPU) */
    char config[64];            /* kernel configuration used and where it came from */
    char device_name[128];
} qk_plan;

QKDEF qk_result qk_plan_make(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, qk_plan *out);
/* The planner with an injected device (tests without a GPU; info->present == 0 plans the CPU). */
QKDEF qk_result qk_plan_for_device(const qk_device_info *info, double vram_fraction,
                                   const qk_map *map, const qk_gram_desc *desc, qk_plan *out);
/* Human-readable plan, snprintf-like. */
QKDEF int qk_plan_describe(const qk_plan *plan, char *buf, size_t size);
/* Largest n such that K(X,X) of n samples keeps all states resident on the device. */
QKDEF int64_t qk_max_samples(const qk_device_info *info, double vram_fraction, int n_qubits,
                             qk_precision precision);

/* ---- arrays, .npy and .csv ---- */
typedef struct qk_array {
    double *data;       /* row-major, converted to double */
    int64_t rows, cols; /* a 1-D array is rows x 1 */
    int ndim;
} qk_array;

/* Reads .npy version 1-3, dtype <f4/<f8 (and >f4/>f8, <i4/<i8), C order, 1-D or 2-D. */
QKDEF qk_result qk_npy_read(const char *path, qk_array *out);
/* Writes a 2-D (cols > 0) or 1-D (cols == 0) .npy of float32 or float64 atomically: a temporary
   file in the same directory, then rename. No partial file on any error. */
QKDEF qk_result qk_npy_write(const char *path, const void *data, qk_dtype dtype, int64_t rows,
                             int64_t cols);
/* Reads numeric CSV (comma, optional header line skipped when not numeric). */
QKDEF qk_result qk_csv_read(const char *path, qk_array *out);
QKDEF void qk_array_free(qk_array *a);

/* ---- autotune cache (public) ---- */
/* The measured best kernel configuration per (device, driver, qk version, kernel, path,
   precision, qubits), kept in one small JSON file shared by every process of a user
   (docs/autotune.md). The cache never makes its caller fail: a missing file or key is a miss; a
   corrupt, truncated, foreign or future-schema file is ignored with a warning and rewritten by
   the next store; an unreadable file or an unwritable directory means "no cache" with a warning.
   Warnings go to the log callback when one is given (nothing is printed otherwise) and to the
   detail message (qk_last_error). The calls are thread-safe and process-safe: a store holds an
   advisory lock (flock on <path>.lock) around read-merge-write and replaces the file atomically
   (temporary file, fsync, rename), so readers take no lock and never see a torn file.
   POSIX only; elsewhere the calls return QK_ERROR_UNSUPPORTED (no cache). */

#define QK_TUNE_SCHEMA 1    /* the "schema" value written and read by this version */

typedef struct qk_tune_key {
    char device[128];       /* device name (qk_device_info.name) */
    int cc_major, cc_minor; /* compute capability */
    int driver_version;     /* cudaDriverGetVersion(), e.g. 12080 */
    char qk_version[16];    /* "" = QK_VERSION_STRING */
    char kernel[24];        /* which kernel family was tuned: "" = "gram"; e.g. "states" */
    qk_path path;           /* ANALYTIC, REAL or COMPLEX */
    qk_precision precision; /* the resolved precision (DEFAULT is allowed and kept as such) */
    int n_qubits;           /* 1 .. QK_MAX_PRODUCT_QUBITS */
} qk_tune_key;

typedef struct qk_tune_entry {
    qk_tune_key key;
    char config[64];        /* the chosen configuration, opaque to the cache (non-empty),
                               e.g. "tm=128,tn=64,tk=16,w=8" */
    double metric;          /* its measured figure of merit, e.g. Gpairs/s (finite; kept, not used) */
    int64_t timestamp;      /* when it was measured, seconds since 1970; 0 on store = now */
} qk_tune_entry;

/* Fills a key (zeroing it first). device_name may be NULL (""), kernel NULL ("gram"). Longer
   strings are truncated to their fields. */
QKDEF void qk_tune_key_init(qk_tune_key *key, const char *device_name, int cc_major, int cc_minor,
                            int driver_version, const char *kernel, qk_path path,
                            qk_precision precision, int n_qubits);

/* Writes the cache file's path, <dir>/autotune.json, to buf. dir is the first that is set and
   non-empty of: dir_override (qk_ctx_desc.cache_dir), $QK_CACHE_DIR, $XDG_CACHE_HOME/qk
   (absolute paths only, as the XDG spec says), $HOME/.cache/qk. Creates nothing.
   QK_ERROR_IO: none is set (no cache). QK_ERROR_INVALID_ARGUMENT: buf NULL or too small. */
QKDEF qk_result qk_tune_cache_path(const char *dir_override, char *buf, size_t size);

/* Looks key up in the cache file at path (NULL: qk_tune_cache_path(NULL)). Takes no lock and
   creates nothing. Returns
     QK_OK                      found: *out holds the entry (its key normalised: "" defaults filled)
     QK_ERROR_IO                not cached: the file does not exist or has no entry for the key
                                (no warning), or it cannot be read (warning)
     QK_ERROR_FORMAT            the file is corrupt, truncated, foreign or of a future schema:
                                ignored with a warning; the next store rewrites it
     QK_ERROR_INVALID_ARGUMENT  key or out NULL, a key string not terminated, a bad enum value
   *out is written only on QK_OK. Any result other than QK_OK means: tune, or use the fixed
   table. log (may be NULL) receives the warnings. */
QKDEF qk_result qk_tune_cache_lookup(const char *path, const qk_tune_key *key, qk_tune_entry *out,
                                     qk_log_fn log, void *log_user);

/* Adds entry to the cache file at path (NULL: qk_tune_cache_path(NULL)), replacing the entry
   with the same key; creates the directory (mkdir -p) when missing. Under the lock: read, merge,
   write a temporary file in the same directory, fsync, rename over path. A file that cannot be
   parsed is replaced (warning). Beyond QK_TUNE_CACHE_MAX_ENTRIES entries the oldest (by
   timestamp) are dropped. Returns QK_OK, QK_ERROR_INVALID_ARGUMENT (entry NULL, bad key, empty or
   unterminated config, non-finite metric), QK_ERROR_IO (directory or file not writable: warned,
   nothing changed) or QK_ERROR_OUT_OF_MEMORY. A caller goes on whatever it returns. */
QKDEF qk_result qk_tune_cache_store(const char *path, const qk_tune_entry *entry, qk_log_fn log,
                                    void *log_user);
/* Times the candidate configurations for key (the GPU engine's tuning loop) and writes the
   fastest to config (size bytes, non-empty) and its figure of merit, higher is better, to
   *metric. Any result other than QK_OK makes qk_tune_choose fall back to the fixed table. */
typedef qk_result (*qk_tune_measure_fn)(const qk_tune_key *key, char *config, size_t size,
                                        double *metric, void *user);

typedef struct qk_tune_request {
    qk_tune_key key;
    int mode;                   /* qk_ctx_desc.autotune: 0 cache, else measure and store; 1 measure
                                   now and store (qk-gram --autotune); -1 fixed table (--no-autotune) */
    const char *cache_dir;      /* qk_ctx_desc.cache_dir; NULL: qk_tune_cache_path's default */
    const char *fixed_config;   /* the fixed per-architecture table's choice (required) */
    qk_tune_measure_fn measure; /* NULL: no tuner in this build: the fixed table */
    void *measure_user;
    qk_log_fn log;              /* warnings (may be NULL) */
    void *log_user;
} qk_tune_request;

/* The autotune policy in one place: picks the configuration for req->key, writes it to config
   (config_size bytes; 64 hold any) and a label for qk_plan.config to label (may be NULL), the
   source first so that truncation cuts the configuration, not where it came from:
     "tuned (cache): <c>"  "tuned (measured): <c>"  "fixed (autotune off): <c>"
     "fixed (autotune failed): <c>"  "fixed (no tuner): <c>"
   Cache and tuning problems never fail it (they fall back with a warning); it returns
   QK_ERROR_INVALID_ARGUMENT only for bad arguments (NULL req/config/fixed_config, bad key). */
QKDEF qk_result qk_tune_choose(const qk_tune_request *req, char *config, size_t config_size,
                               char *label, size_t label_size);
/* ---- end autotune cache (public) ---- */

/* ---- CUDA engine surface (qk_cuda.cu, extern "C") ---- */
/* Implemented in qk_cuda.cu; qk.h calls them only when QK_CUDA is defined. */
QKDEF int qk_cuda_device_count(void);
QKDEF qk_result qk_cuda_device_query(int device, qk_device_info *info, char *err, size_t err_size);
/* Runs a planned Gram on the device (plan->backend == QK_BACKEND_CUDA, data already validated by
   qk_gram). On failure writes a detail ("cudaMalloc(...) at qk_cuda.cu:123: out of memory") to err. */
QKDEF qk_result qk_cuda_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc,
                             char *err, size_t err_size);
/* States of n samples built on the device, copied back as interleaved complex doubles (tests). */
QKDEF qk_result qk_cuda_states(const qk_map *map, const double *x, int64_t n, qk_precision precision,
                               double *out, char *err, size_t err_size);

#ifdef __cplusplus
}
#endif
#endif /* QK_H */

/* ======================================================================================== */
/*                                    IMPLEMENTATION                                        */
/* ======================================================================================== */
#if defined(QK_IMPLEMENTATION) && !defined(QK_IMPLEMENTATION_DONE)
#define QK_IMPLEMENTATION_DONE

/* ---- implementation: includes and config ---- */

/* ---- implementation: errors ---- */

/* ---- implementation: feature maps ---- */

/* ---- implementation: map spec parser ---- */

/* ---- implementation: CPU engine (states) ---- */

/* ---- implementation: CPU engine (Gram) ---- */

/* ---- implementation: npy / csv ---- */
/* (owned by the npy/csv + CLI work) */
/* ---- end npy / csv ---- */

/* ---- implementation: device info, planner, VRAM estimator ---- */
/* (owned by the GPU engine work) */
/* ---- end planner ---- */

/* ---- implementation: autotune cache ---- */
/* The file (docs/autotune.md):
     {"schema": 1, "qk": "0.1.0", "entries": [{"device": "...", "cc_major": 9, ...}, ...]}
   It is shared by processes and users' tools and may be damaged, truncated or written by someone
   else, so the reader is strict and bounded: the whole text must be valid JSON (grammar, UTF-8,
   escapes), at most QK_TUNE_CACHE_MAX_BYTES, nested at most QK__TJ_MAX_DEPTH deep, with the
   schema and every entry valid, before any entry is used. Unknown keys are skipped so that a
   later schema-1 writer may add fields. Numbers are written and read with '.' whatever the C
   locale says (a host program may have called setlocale). */
#ifndef QK_TUNE_CACHE_MAX_ENTRIES
#define QK_TUNE_CACHE_MAX_ENTRIES 4096  /* ~300 bytes each: about 1 MiB of typical file */
#endif
#ifndef QK_TUNE_CACHE_MAX_BYTES
#define QK_TUNE_CACHE_MAX_BYTES (8 << 20) /* above the largest file the writer can produce */
#endif
#define QK__TJ_MAX_DEPTH 32
#define QK__TUNE_PATH_MAX 4096

#include <errno.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if !defined(_WIN32)
#define QK__TUNE_POSIX 1
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef O_CLOEXEC
#define QK__O_CLOEXEC O_CLOEXEC
#else
#define QK__O_CLOEXEC 0
#endif
#endif

static const char *const qk__tune_path_names[] = {"?", "analytic", "real", "complex"};
static const char *const qk__tune_prec_names[] = {"default", "fp32", "fp64"};

/* A warning: to the log callback (if any) and to the detail message; returns r. */
static qk_result qk__tune_warn(qk_log_fn log, void *user, qk_result r, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log) log(QK_LOG_WARN, msg, user);
    return qk__fail(r, "%s", msg);
}

/* Length of the valid UTF-8 sequence at s (n bytes available), 0 when invalid (overlong forms,
   surrogates and code points above U+10FFFF are invalid, as RFC 3629 says). */
static size_t qk__utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0], cp, min;
    size_t len, i;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1Fu; min = 0x80; }
    else if ((c & 0xF0u) == 0xE0) { len = 3; cp = c & 0x0Fu; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07u; min = 0x10000; }
    else return 0;
    if (n < len) return 0;
    for (i = 1; i < len; i++) {
        if ((s[i] & 0xC0u) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* Copies src into dst[cap] (truncating), then replaces bytes that are not valid UTF-8 by '?',
   so that every string the cache writes is valid JSON and compares the same after a reload. */
static void qk__tune_copy(char *dst, size_t cap, const char *src) {
    size_t n = 0, i = 0;
    if (src) {
        /* byte by byte: src may be shorter than cap (a literal), so no memcpy of cap - 1 */
        for (; n + 1 < cap && src[n]; n++) dst[n] = src[n];
    }
    memset(dst + n, 0, cap - n);
    while (i < n) {
        size_t k = qk__utf8_seq((const unsigned char *)dst + i, n - i);
        if (k == 0) { dst[i] = '?'; k = 1; }
        i += k;
    }
}

static int qk__tune_key_eq(const qk_tune_key *a, const qk_tune_key *b) {
    return a->cc_major == b->cc_major && a->cc_minor == b->cc_minor &&
           a->driver_version == b->driver_version && a->path == b->path &&
           a->precision == b->precision && a->n_qubits == b->n_qubits &&
           strcmp(a->device, b->device) == 0 && strcmp(a->qk_version, b->qk_version) == 0 &&
           strcmp(a->kernel, b->kernel) == 0;
}

/* Validates a caller's key and writes its normal form to *k: defaults filled, strings made
   valid UTF-8, unused bytes zeroed. */
static qk_result qk__tune_key_norm(const qk_tune_key *in, qk_tune_key *k) {
    if (!memchr(in->device, 0, sizeof in->device))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.device is not NUL-terminated");
    if (!memchr(in->qk_version, 0, sizeof in->qk_version))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.qk_version is not NUL-terminated");
    if (!memchr(in->kernel, 0, sizeof in->kernel))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.kernel is not NUL-terminated");
    if ((int)in->path < (int)QK_PATH_ANALYTIC || (int)in->path > (int)QK_PATH_COMPLEX)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.path is %d", (int)in->path);
    if ((int)in->precision < (int)QK_PRECISION_DEFAULT || (int)in->precision > (int)QK_PRECISION_FP64)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.precision is %d", (int)in->precision);
    if (in->n_qubits < 1 || in->n_qubits > QK_MAX_PRODUCT_QUBITS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.n_qubits is %d", in->n_qubits);
    memset(k, 0, sizeof *k);
    qk__tune_copy(k->device, sizeof k->device, in->device);
    qk__tune_copy(k->qk_version, sizeof k->qk_version, in->qk_version[0] ? in->qk_version : QK_VERSION_STRING);
    qk__tune_copy(k->kernel, sizeof k->kernel, in->kernel[0] ? in->kernel : "gram");
    k->cc_major = in->cc_major;
    k->cc_minor = in->cc_minor;
    k->driver_version = in->driver_version;
    k->path = in->path;
    k->precision = in->precision;
    k->n_qubits = in->n_qubits;
    return QK_OK;
}

QKDEF void qk_tune_key_init(qk_tune_key *key, const char *device_name, int cc_major, int cc_minor,
                            int driver_version, const char *kernel, qk_path path,
                            qk_precision precision, int n_qubits) {
    if (!key) return;
    memset(key, 0, sizeof *key);
    qk__tune_copy(key->device, sizeof key->device, device_name);
    qk__tune_copy(key->qk_version, sizeof key->qk_version, QK_VERSION_STRING);
    qk__tune_copy(key->kernel, sizeof key->kernel, kernel && kernel[0] ? kernel : "gram");
    key->cc_major = cc_major;
    key->cc_minor = cc_minor;
    key->driver_version = driver_version;
    key->path = path;
    key->precision = precision;
    key->n_qubits = n_qubits;
}

/* -- JSON reader. Syntax errors stop it (bad, why); schema problems (sem, sem_why) are noted
   and parsing goes on, so that a syntactically fine file of a future schema is reported as such
   rather than as corrupt. -- */
typedef struct qk__tj {
    const unsigned char *s, *p, *end;
    int depth;
    int bad;
    char why[160];
    int sem;
    char sem_why[200];
} qk__tj;

static int qk__tj_err(qk__tj *j, const char *what) {
    if (!j->bad) {
        j->bad = 1;
        snprintf(j->why, sizeof j->why, "%s at byte %ld", what, (long)(j->p - j->s));
    }
    return 0;
}

static void qk__tj_sem(qk__tj *j, int entry, const char *what, const char *name) {
    if (j->sem) return;
    j->sem = 1;
    if (entry >= 0)
        snprintf(j->sem_why, sizeof j->sem_why, "entry %d: %s \"%.40s\"", entry, what, name);
    else
        snprintf(j->sem_why, sizeof j->sem_why, "%s \"%.40s\"", what, name);
}

static void qk__tj_ws(qk__tj *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

/* Consumes c (after white space) or fails with what. */
static int qk__tj_expect(qk__tj *j, unsigned char c, const char *what) {
    qk__tj_ws(j);
    if (j->p >= j->end || *j->p != c) return qk__tj_err(j, what);
    j->p++;
    return 1;
}

static int qk__tj_hex4(qk__tj *j, unsigned *out) {
    unsigned v = 0;
    int i;
    if (j->end - j->p < 4) return qk__tj_err(j, "truncated \\u escape");
    for (i = 0; i < 4; i++) {
        unsigned c = j->p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return qk__tj_err(j, "bad \\u escape");
        v = v * 16 + d;
    }
    j->p += 4;
    *out = v;
    return 1;
}

/* A string into out[cap] (NUL-terminated; out NULL: skipped). *fits = 0 when the decoded
   string does not fit or holds U+0000 (a C string cannot); out then holds a prefix. */
static int qk__tj_str(qk__tj *j, char *out, size_t cap, int *fits) {
    size_t n = 0;
    int ok = 1;
    qk__tj_ws(j);
    if (j->p >= j->end || *j->p != '"') return qk__tj_err(j, "expected a string");
    j->p++;
    for (;;) {
        unsigned char tmp[4];
        size_t tn = 1;
        unsigned c;
        if (j->p >= j->end) return qk__tj_err(j, "unterminated string");
        c = *j->p;
        if (c == '"') { j->p++; break; }
        if (c < 0x20) return qk__tj_err(j, "control character in a string");
        if (c == '\\') {
            if (j->end - j->p < 2) return qk__tj_err(j, "unterminated string");
            c = j->p[1];
            j->p += 2;
            switch (c) {
            case '"': case '\\': case '/': tmp[0] = (unsigned char)c; break;
            case 'b': tmp[0] = '\b'; break;
            case 'f': tmp[0] = '\f'; break;
            case 'n': tmp[0] = '\n'; break;
            case 'r': tmp[0] = '\r'; break;
            case 't': tmp[0] = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (!qk__tj_hex4(j, &cp)) return 0;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return qk__tj_err(j, "lone low surrogate");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
                        return qk__tj_err(j, "lone high surrogate");
                    j->p += 2;
                    if (!qk__tj_hex4(j, &lo)) return 0;
                    if (lo < 0xDC00 || lo > 0xDFFF) return qk__tj_err(j, "bad surrogate pair");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0) ok = 0;
                if (cp < 0x80) { tmp[0] = (unsigned char)cp; }
                else if (cp < 0x800) {
                    tmp[0] = (unsigned char)(0xC0 | (cp >> 6));
                    tmp[1] = (unsigned char)(0x80 | (cp & 0x3F)); tn = 2;
                } else if (cp < 0x10000) {
                    tmp[0] = (unsigned char)(0xE0 | (cp >> 12));
                    tmp[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                    tmp[2] = (unsigned char)(0x80 | (cp & 0x3F)); tn = 3;
                } else {
                    tmp[0] = (unsigned char)(0xF0 | (cp >> 18));
                    tmp[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
                    tmp[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                    tmp[3] = (unsigned char)(0x80 | (cp & 0x3F)); tn = 4;
                }
                break;
            }
            default: j->p--; return qk__tj_err(j, "bad escape");
            }
        } else if (c < 0x80) {
            tmp[0] = (unsigned char)c;
            j->p++;
        } else {
            tn = qk__utf8_seq(j->p, (size_t)(j->end - j->p));
            if (tn == 0) return qk__tj_err(j, "invalid UTF-8");
            memcpy(tmp, j->p, tn);
            j->p += tn;
        }
        if (out) {
            if (ok && n + tn < cap) { memcpy(out + n, tmp, tn); n += tn; }
            else ok = 0;
        }
    }
    if (out && cap) out[n] = 0;
    if (fits) *fits = ok;
    return 1;
}

/* A number (JSON grammar, at most 40 characters). *is_int: no fraction or exponent and it fits
   an int64 (*iv). */
static int qk__tj_num(qk__tj *j, double *d, int64_t *iv, int *is_int) {
    const unsigned char *b, *q;
    char buf[80], *endp;
    const char *dp;
    size_t n, dpl, i, k = 0;
    int integer = 1, neg = 0;
    uint64_t u = 0;
    qk__tj_ws(j);
    b = q = j->p;
    if (q < j->end && *q == '-') { q++; neg = 1; }
    if (q >= j->end) return qk__tj_err(j, "truncated number");
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9') { while (q < j->end && *q >= '0' && *q <= '9') q++; }
    else return qk__tj_err(j, "unexpected character");
    if (q < j->end && *q == '.') {
        q++;
        integer = 0;
        if (q >= j->end || *q < '0' || *q > '9') return qk__tj_err(j, "bad number");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        q++;
        integer = 0;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        if (q >= j->end || *q < '0' || *q > '9') return qk__tj_err(j, "bad number");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    n = (size_t)(q - b);
    if (n > 40) return qk__tj_err(j, "number too long");
    /* strtod reads the locale's decimal point, so '.' becomes that. */
    dp = localeconv()->decimal_point;
    dpl = dp ? strlen(dp) : 0;
    if (dpl == 0 || dpl > 8) { dp = "."; dpl = 1; }
    for (i = 0; i < n; i++) {
        if (b[i] == '.') { memcpy(buf + k, dp, dpl); k += dpl; }
        else buf[k++] = (char)b[i];
    }
    buf[k] = 0;
    *d = strtod(buf, &endp);
    if (*endp) return qk__tj_err(j, "bad number");
    if (integer) {
        for (i = (size_t)neg; i < n && integer; i++) {
            unsigned dig = (unsigned)(b[i] - '0');
            if (u > (UINT64_MAX - dig) / 10) integer = 0;
            else u = u * 10 + dig;
        }
        if (u > (uint64_t)INT64_MAX + (uint64_t)neg) integer = 0;
        if (integer) *iv = neg ? (u == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)u) : (int64_t)u;
    }
    *is_int = integer;
    j->p = q;
    return 1;
}

static int qk__tj_lit(qk__tj *j, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) return qk__tj_err(j, "unexpected character");
    j->p += n;
    return 1;
}

/* Skips any value (validating it). */
static int qk__tj_skip(qk__tj *j) {
    double d;
    int64_t iv;
    int isi;
    qk__tj_ws(j);
    if (j->p >= j->end) return qk__tj_err(j, "unexpected end");
    switch (*j->p) {
    case '{': case '[': {
        unsigned char close = *j->p == '{' ? '}' : ']';
        int obj = close == '}';
        if (++j->depth > QK__TJ_MAX_DEPTH) return qk__tj_err(j, "nested too deeply");
        j->p++;
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == close) { j->p++; j->depth--; return 1; }
        for (;;) {
            if (obj && (!qk__tj_str(j, NULL, 0, NULL) || !qk__tj_expect(j, ':', "expected ':'"))) return 0;
            if (!qk__tj_skip(j)) return 0;
            qk__tj_ws(j);
            if (j->p < j->end && *j->p == ',') { j->p++; continue; }
            if (j->p < j->end && *j->p == close) { j->p++; break; }
            return qk__tj_err(j, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        }
        j->depth--;
        return 1;
    }
    case '"': return qk__tj_str(j, NULL, 0, NULL);
    case 't': return qk__tj_lit(j, "true");
    case 'f': return qk__tj_lit(j, "false");
    case 'n': return qk__tj_lit(j, "null");
    default: return qk__tj_num(j, &d, &iv, &isi);
    }
}

/* Field names of an entry, in the order the writer writes them. */
static const char *const qk__tune_fields[] = {
    "device", "cc_major", "cc_minor", "driver", "qk", "kernel", "path", "precision", "qubits",
    "config", "metric", "timestamp"};
#define QK__TUNE_NFIELDS 12

/* One entry object into *e; *valid = 0 when it breaks the schema (noted in j->sem_why). */
static int qk__tj_entry(qk__tj *j, int index, qk_tune_entry *e, int *valid) {
    unsigned seen = 0;
    int f, ok = 1;
    memset(e, 0, sizeof *e);
    *valid = 0;
    if (++j->depth > QK__TJ_MAX_DEPTH) return qk__tj_err(j, "nested too deeply");
    j->p++; /* '{' */
    qk__tj_ws(j);
    if (j->p < j->end && *j->p == '}') j->p++;
    else for (;;) {
        char name[16], sval[128];
        int fits, isi = 0;
        double d = 0;
        int64_t iv = 0;
        if (!qk__tj_str(j, name, sizeof name, &fits) || !qk__tj_expect(j, ':', "expected ':'")) return 0;
        for (f = 0; fits && f < QK__TUNE_NFIELDS; f++)
            if (strcmp(name, qk__tune_fields[f]) == 0) break;
        qk__tj_ws(j);
        if (!fits || f == QK__TUNE_NFIELDS) {
            if (!qk__tj_skip(j)) return 0;       /* a field of a later writer: ignored */
        } else {
            int is_str = f == 0 || f == 4 || f == 5 || f == 6 || f == 7 || f == 9;
            if (seen & (1u << f)) { qk__tj_sem(j, index, "duplicate field", name); ok = 0; }
            seen |= 1u << f;
            if (j->p < j->end && (is_str ? *j->p != '"' : !(*j->p == '-' || (*j->p >= '0' && *j->p <= '9')))) {
                qk__tj_sem(j, index, is_str ? "not a string:" : "not a number:", name);
                ok = 0;
                if (!qk__tj_skip(j)) return 0;
            } else if (is_str) {
                if (!qk__tj_str(j, sval, sizeof sval, &fits)) return 0;
                if (!fits) { qk__tj_sem(j, index, "string too long or holding NUL:", name); ok = 0; }
                else if (f == 0) qk__tune_copy(e->key.device, sizeof e->key.device, sval);
                else if (f == 9) {
                    if (strlen(sval) >= sizeof e->config || !sval[0]) { qk__tj_sem(j, index, "bad length:", name); ok = 0; }
                    else qk__tune_copy(e->config, sizeof e->config, sval);
                } else if (f == 4 || f == 5) {
                    size_t cap = f == 4 ? sizeof e->key.qk_version : sizeof e->key.kernel;
                    if (strlen(sval) >= cap) { qk__tj_sem(j, index, "too long:", name); ok = 0; }
                    else qk__tune_copy(f == 4 ? e->key.qk_version : e->key.kernel, cap, sval);
                } else if (f == 6) {
                    int k;
                    for (k = 1; k <= 3 && strcmp(sval, qk__tune_path_names[k]) != 0; k++) {}
                    if (k > 3) { qk__tj_sem(j, index, "unknown path", sval); ok = 0; }
                    else e->key.path = (qk_path)k;
                } else {
                    int k;
                    for (k = 0; k <= 2 && strcmp(sval, qk__tune_prec_names[k]) != 0; k++) {}
                    if (k > 2) { qk__tj_sem(j, index, "unknown precision", sval); ok = 0; }
                    else e->key.precision = (qk_precision)k;
                }
            } else {
                if (!qk__tj_num(j, &d, &iv, &isi)) return 0;
                if (f == 10) {
                    if (!(d - d == 0.0)) { qk__tj_sem(j, index, "not finite:", name); ok = 0; }
                    e->metric = d;
                } else if (!isi) {
                    qk__tj_sem(j, index, "not an integer:", name); ok = 0;
                } else if (f == 11) {
                    e->timestamp = iv;
                } else if (iv < -2147483647 - 1 || iv > 2147483647 ||
                           (f == 8 && (iv < 1 || iv > QK_MAX_PRODUCT_QUBITS))) {
                    qk__tj_sem(j, index, "out of range:", name); ok = 0;
                } else {
                    int v = (int)iv;
                    if (f == 1) e->key.cc_major = v;
                    else if (f == 2) e->key.cc_minor = v;
                    else if (f == 3) e->key.driver_version = v;
                    else e->key.n_qubits = v;
                }
            }
        }
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == '}') { j->p++; break; }
        return qk__tj_err(j, "expected ',' or '}'");
    }
    j->depth--;
    for (f = 0; f < QK__TUNE_NFIELDS; f++)
        if (!(seen & (1u << f))) { qk__tj_sem(j, index, "missing field", qk__tune_fields[f]); ok = 0; break; }
    if (ok) {
        if (!e->key.qk_version[0]) qk__tune_copy(e->key.qk_version, sizeof e->key.qk_version, QK_VERSION_STRING);
        if (!e->key.kernel[0]) qk__tune_copy(e->key.kernel, sizeof e->key.kernel, "gram");
    }
    *valid = ok;
    return 1;
}

/* Parses a cache file's text (len bytes, no terminator needed). QK_OK: *out (QK_MALLOC'ed, NULL
   when *n_out is 0) holds the entries, at most QK_TUNE_CACHE_MAX_ENTRIES (later ones are
   validated and dropped). QK_ERROR_FORMAT: why says what is wrong (corrupt / not a qk cache /
   future schema). QK_ERROR_OUT_OF_MEMORY. */
static qk_result qk__tune_parse(const char *text, size_t len, qk_tune_entry **out, int *n_out,
                                char *why, size_t why_size) {
    qk__tj j;
    qk_tune_entry *v = NULL, e;
    int n = 0, cap = 0, have_schema = 0, have_entries = 0, schema_int = 0, not_object = 0;
    int64_t schema = 0;
    *out = NULL;
    *n_out = 0;
    memset(&j, 0, sizeof j);
    j.s = j.p = (const unsigned char *)text;
    j.end = j.s + len;
    if (len > (size_t)QK_TUNE_CACHE_MAX_BYTES) {
        snprintf(why, why_size, "corrupt (larger than %ld bytes)", (long)QK_TUNE_CACHE_MAX_BYTES);
        return QK_ERROR_FORMAT;
    }
    qk__tj_ws(&j);
    if (j.p >= j.end) {
        snprintf(why, why_size, "corrupt (empty)");
        return QK_ERROR_FORMAT;
    }
    if (*j.p != '{') {
        not_object = 1;
        qk__tj_skip(&j);
    } else {
        j.depth = 1;
        j.p++;
        qk__tj_ws(&j);
        if (j.p < j.end && *j.p == '}') j.p++;
        else for (;;) {
            char name[16];
            int fits;
            if (!qk__tj_str(&j, name, sizeof name, &fits) || !qk__tj_expect(&j, ':', "expected ':'")) break;
            qk__tj_ws(&j);
            if (fits && strcmp(name, "schema") == 0) {
                double d;
                if (have_schema) qk__tj_sem(&j, -1, "duplicate key", name);
                have_schema = 1;
                if (j.p < j.end && (*j.p == '-' || (*j.p >= '0' && *j.p <= '9'))) {
                    if (!qk__tj_num(&j, &d, &schema, &schema_int)) break;
                } else if (!qk__tj_skip(&j)) break;
            } else if (fits && strcmp(name, "entries") == 0) {
                if (have_entries) qk__tj_sem(&j, -1, "duplicate key", name);
                have_entries = 1;
                if (j.p >= j.end || *j.p != '[') {
                    qk__tj_sem(&j, -1, "not an array:", name);
                    if (!qk__tj_skip(&j)) break;
                } else {
                    int index = 0, valid;
                    j.depth++;
                    j.p++;
                    qk__tj_ws(&j);
                    if (j.p < j.end && *j.p == ']') j.p++;
                    else for (;;) {
                        qk__tj_ws(&j);
                        if (j.p < j.end && *j.p == '{') {
                            if (!qk__tj_entry(&j, index, &e, &valid)) break;
                            if (valid && n < QK_TUNE_CACHE_MAX_ENTRIES) {
                                if (n == cap) {
                                    int nc = cap ? cap * 2 : 16;
                                    qk_tune_entry *nv;
                                    if (nc > QK_TUNE_CACHE_MAX_ENTRIES) nc = QK_TUNE_CACHE_MAX_ENTRIES;
                                    nv = (qk_tune_entry *)QK_MALLOC((size_t)nc * sizeof *nv);
                                    if (!nv) { QK_FREE(v); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "autotune cache: out of memory"); }
                                    if (n) memcpy(nv, v, (size_t)n * sizeof *nv);
                                    QK_FREE(v);
                                    v = nv;
                                    cap = nc;
                                }
                                v[n++] = e;
                            }
                        } else {
                            qk__tj_sem(&j, -1, "not an object:", "entries[]");
                            if (!qk__tj_skip(&j)) break;
                        }
                        index++;
                        qk__tj_ws(&j);
                        if (j.p < j.end && *j.p == ',') { j.p++; continue; }
                        if (j.p < j.end && *j.p == ']') { j.p++; break; }
                        qk__tj_err(&j, "expected ',' or ']'");
                        break;
                    }
                    if (j.bad) break;
                    j.depth--;
                }
            } else {
                if (fits && strcmp(name, "qk") == 0 && (j.p >= j.end || *j.p != '"'))
                    qk__tj_sem(&j, -1, "not a string:", name);
                if (!qk__tj_skip(&j)) break;
            }
            qk__tj_ws(&j);
            if (j.p < j.end && *j.p == ',') { j.p++; continue; }
            if (j.p < j.end && *j.p == '}') { j.p++; break; }
            qk__tj_err(&j, "expected ',' or '}'");
            break;
        }
    }
    if (!j.bad) {
        qk__tj_ws(&j);
        if (j.p != j.end) qk__tj_err(&j, "trailing characters");
    }
    if (j.bad) snprintf(why, why_size, "corrupt or truncated (%s)", j.why);
    else if (not_object) snprintf(why, why_size, "not a qk autotune cache (not a JSON object)");
    else if (!have_schema) snprintf(why, why_size, "not a qk autotune cache (no \"schema\")");
    else if (!schema_int) snprintf(why, why_size, "not a qk autotune cache (\"schema\" is not an integer)");
    else if (schema > QK_TUNE_SCHEMA)
        snprintf(why, why_size, "written by a newer qk (schema %lld; this qk reads %d)", (long long)schema, QK_TUNE_SCHEMA);
    else if (schema != QK_TUNE_SCHEMA)
        snprintf(why, why_size, "unknown schema %lld (this qk reads %d)", (long long)schema, QK_TUNE_SCHEMA);
    else if (!have_entries) snprintf(why, why_size, "not a qk autotune cache (no \"entries\")");
    else if (j.sem) snprintf(why, why_size, "corrupt (%s)", j.sem_why);
    else {
        *out = v;
        *n_out = n;
        return QK_OK;
    }
    QK_FREE(v);
    return QK_ERROR_FORMAT;
}

/* -- JSON writer -- */
typedef struct qk__tbuf {
    char *p;
    size_t len, cap;
    int oom;
} qk__tbuf;

static void qk__tb_put(qk__tbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        char *np;
        while (nc < b->len + n + 1) nc *= 2;
        np = (char *)QK_MALLOC(nc);
        if (!np) { b->oom = 1; return; }
        if (b->len) memcpy(np, b->p, b->len);
        QK_FREE(b->p);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void qk__tb_s(qk__tbuf *b, const char *s) { qk__tb_put(b, s, strlen(s)); }

static void qk__tb_int(qk__tbuf *b, long long v) {
    char t[32];
    snprintf(t, sizeof t, "%lld", v);
    qk__tb_s(b, t);
}

/* A JSON string; s is valid UTF-8 (qk__tune_copy made it so). */
static void qk__tb_str(qk__tbuf *b, const char *s) {
    qk__tb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char t[8];
        if (c == '"') qk__tb_put(b, "\\\"", 2);
        else if (c == '\\') qk__tb_put(b, "\\\\", 2);
        else if (c == '\n') qk__tb_put(b, "\\n", 2);
        else if (c == '\t') qk__tb_put(b, "\\t", 2);
        else if (c < 0x20) { snprintf(t, sizeof t, "\\u%04x", c); qk__tb_put(b, t, 6); }
        else qk__tb_put(b, s, 1);
    }
    qk__tb_put(b, "\"", 1);
}

/* The shortest of %.15g..%.17g that reads back exactly, with '.' as the decimal point. */
static void qk__tb_double(qk__tbuf *b, double v) {
    char t[64], *hit;
    const char *dp = localeconv()->decimal_point;
    size_t dpl = dp ? strlen(dp) : 0;
    int prec;
    for (prec = 15; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*g", prec, v);
        if (strtod(t, NULL) == v) break;
    }
    if (dpl && !(dpl == 1 && dp[0] == '.') && (hit = strstr(t, dp)) != NULL) {
        *hit = '.';
        memmove(hit + 1, hit + dpl, strlen(hit + dpl) + 1);
    }
    qk__tb_s(b, t);
}

/* The whole file for n entries; 0 when out of memory. */
static int qk__tune_format(const qk_tune_entry *v, int n, qk__tbuf *b) {
    int i;
    qk__tb_s(b, "{\n  \"schema\": ");
    qk__tb_int(b, QK_TUNE_SCHEMA);
    qk__tb_s(b, ",\n  \"qk\": \"" QK_VERSION_STRING "\",\n  \"entries\": [");
    for (i = 0; i < n; i++) {
        const qk_tune_entry *e = &v[i];
        qk__tb_s(b, i ? ",\n    {\"device\": " : "\n    {\"device\": ");
        qk__tb_str(b, e->key.device);
        qk__tb_s(b, ", \"cc_major\": "); qk__tb_int(b, e->key.cc_major);
        qk__tb_s(b, ", \"cc_minor\": "); qk__tb_int(b, e->key.cc_minor);
        qk__tb_s(b, ", \"driver\": "); qk__tb_int(b, e->key.driver_version);
        qk__tb_s(b, ", \"qk\": "); qk__tb_str(b, e->key.qk_version);
        qk__tb_s(b, ", \"kernel\": "); qk__tb_str(b, e->key.kernel);
        qk__tb_s(b, ", \"path\": "); qk__tb_str(b, qk__tune_path_names[e->key.path]);
        qk__tb_s(b, ", \"precision\": "); qk__tb_str(b, qk__tune_prec_names[e->key.precision]);
        qk__tb_s(b, ", \"qubits\": "); qk__tb_int(b, e->key.n_qubits);
        qk__tb_s(b, ", \"config\": "); qk__tb_str(b, e->config);
        qk__tb_s(b, ", \"metric\": "); qk__tb_double(b, e->metric);
        qk__tb_s(b, ", \"timestamp\": "); qk__tb_int(b, (long long)e->timestamp);
        qk__tb_s(b, "}");
    }
    qk__tb_s(b, n ? "\n  ]\n}\n" : "]\n}\n");
    return !b->oom;
}

QKDEF qk_result qk_tune_cache_path(const char *dir_override, char *buf, size_t size) {
    const char *d = NULL, *sub = "", *e;
    size_t dl;
    int n;
    if (!buf || size == 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: no buffer");
    buf[0] = 0;
    if (dir_override && dir_override[0]) d = dir_override;
    else if ((e = getenv("QK_CACHE_DIR")) != NULL && e[0]) d = e;
    else if ((e = getenv("XDG_CACHE_HOME")) != NULL && e[0] == '/') { d = e; sub = "/qk"; }
    else if ((e = getenv("HOME")) != NULL && e[0]) { d = e; sub = "/.cache/qk"; }
    else return qk__fail(QK_ERROR_IO, "autotune cache: no directory (set QK_CACHE_DIR, XDG_CACHE_HOME or HOME)");
    dl = strlen(d);
    while (dl > 1 && d[dl - 1] == '/') dl--;  /* "dir/" gives "dir/autotune.json", not "dir//..." */
    if (dl == 1 && d[0] == '/' && !sub[0]) dl = 0;
    n = snprintf(buf, size, "%.*s%s/autotune.json", (int)dl, d, sub);
    if (n < 0 || (size_t)n >= size) {
        buf[0] = 0;
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: path needs %d bytes, buffer has %lu",
                        n + 1, (unsigned long)size);
    }
    return QK_OK;
}

#if defined(QK__TUNE_POSIX)
/* Reads the file at path. QK_OK: *text (QK_MALLOC'ed, *len bytes); QK_ERROR_IO with *err_no;
   QK_ERROR_FORMAT (too large: why). */
static qk_result qk__tune_slurp(const char *path, char **text, size_t *len, int *err_no, char *why,
                                size_t why_size) {
    struct stat st;
    char *buf;
    size_t cap, n = 0;
    int fd = open(path, O_RDONLY | QK__O_CLOEXEC);
    *text = NULL;
    *len = 0;
    *err_no = 0;
    if (fd < 0) { *err_no = errno; return QK_ERROR_IO; }
    if (fstat(fd, &st) != 0) { *err_no = errno; close(fd); return QK_ERROR_IO; }
    if (!S_ISREG(st.st_mode)) { *err_no = EISDIR; close(fd); return QK_ERROR_IO; }
    if (st.st_size > (off_t)QK_TUNE_CACHE_MAX_BYTES) {
        close(fd);
        snprintf(why, why_size, "corrupt (larger than %ld bytes)", (long)QK_TUNE_CACHE_MAX_BYTES);
        return QK_ERROR_FORMAT;
    }
    /* One byte more than the size: a file that grew is seen as too large, not cut short. */
    cap = (size_t)st.st_size + 2;
    buf = (char *)QK_MALLOC(cap);
    if (!buf) { close(fd); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "autotune cache: out of memory"); }
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { *err_no = errno; close(fd); QK_FREE(buf); return QK_ERROR_IO; }
        if (r == 0) break;
        n += (size_t)r;
        if (n == cap) {
            close(fd);
            QK_FREE(buf);
            snprintf(why, why_size, "changed while being read (not written by qk?)");
            return QK_ERROR_FORMAT;
        }
    }
    close(fd);
    *text = buf;
    *len = n;
    return QK_OK;
}

/* Reads and parses the file. QK_OK; QK_ERROR_IO (*err_no; ENOENT: no file yet);
   QK_ERROR_FORMAT (why); QK_ERROR_OUT_OF_MEMORY. */
static qk_result qk__tune_load(const char *path, qk_tune_entry **v, int *n, int *err_no, char *why,
                               size_t why_size) {
    char *text;
    size_t len;
    qk_result r = qk__tune_slurp(path, &text, &len, err_no, why, why_size);
    *v = NULL;
    *n = 0;
    if (r != QK_OK) return r;
    r = qk__tune_parse(text, len, v, n, why, why_size);
    QK_FREE(text);
    return r;
}

QKDEF qk_result qk_tune_cache_lookup(const char *path, const qk_tune_key *key, qk_tune_entry *out,
                                     qk_log_fn log, void *log_user) {
    char pbuf[QK__TUNE_PATH_MAX], why[256];
    qk_tune_key k;
    qk_tune_entry *v;
    int n, i, err_no;
    qk_result r;
    if (!key || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key or out is NULL");
    if ((r = qk__tune_key_norm(key, &k)) != QK_OK) return r;
    if (!path) {
        if (qk_tune_cache_path(NULL, pbuf, sizeof pbuf) != QK_OK)
            return qk__tune_warn(log, log_user, QK_ERROR_IO, "%s; no autotune cache", qk_last_error());
        path = pbuf;
    }
    why[0] = 0;
    r = qk__tune_load(path, &v, &n, &err_no, why, sizeof why);
    if (r == QK_ERROR_IO && err_no == ENOENT)
        return qk__fail(QK_ERROR_IO, "autotune cache: %s does not exist yet", path);
    if (r == QK_ERROR_IO)
        return qk__tune_warn(log, log_user, r, "autotune cache: cannot read %s: %s; not using it", path,
                             strerror(err_no));
    if (r == QK_ERROR_FORMAT)
        return qk__tune_warn(log, log_user, r, "autotune cache: ignoring %s: %s; the next store rewrites it",
                             path, why);
    if (r != QK_OK) return r;
    for (i = n - 1; i >= 0; i--)
        if (qk__tune_key_eq(&v[i].key, &k)) break;
    if (i >= 0) *out = v[i];
    QK_FREE(v);
    if (i < 0)
        return qk__fail(QK_ERROR_IO, "autotune cache: no entry for %s %s %s q=%d on \"%s\" (cc %d.%d, driver %d, qk %s) in %s",
                        k.kernel, qk__tune_path_names[k.path], qk__tune_prec_names[k.precision], k.n_qubits,
                        k.device, k.cc_major, k.cc_minor, k.driver_version, k.qk_version, path);
    return QK_OK;
}

/* mkdir -p; 0 or an errno. */
static int qk__tune_mkdirs(char *dir) {
    struct stat st;
    char *q;
    if (stat(dir, &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    for (q = dir + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) { int e = errno; *q = '/'; return e; }
        *q = '/';
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) return errno;
    if (stat(dir, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

static int qk__tune_write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return 0;
        p += w;
        n -= (size_t)w;
    }
    return 1;
}

QKDEF qk_result qk_tune_cache_store(const char *path, const qk_tune_entry *entry, qk_log_fn log,
                                    void *log_user) {
    char pbuf[QK__TUNE_PATH_MAX], dir[QK__TUNE_PATH_MAX], lockp[QK__TUNE_PATH_MAX + 8];
    char tmp[QK__TUNE_PATH_MAX + 32], why[256];
    qk_tune_entry e, *v = NULL;
    qk__tbuf b;
    const char *slash;
    int n = 0, i, err_no, lfd, fd, newest;
    size_t pl;
    qk_result r;
    if (!entry) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: entry is NULL");
    memset(&e, 0, sizeof e);
    if ((r = qk__tune_key_norm(&entry->key, &e.key)) != QK_OK) return r;
    if (!memchr(entry->config, 0, sizeof entry->config) || !entry->config[0])
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: config is empty or not NUL-terminated");
    if (!(entry->metric - entry->metric == 0.0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: metric is not finite");
    qk__tune_copy(e.config, sizeof e.config, entry->config);
    e.metric = entry->metric;
    e.timestamp = entry->timestamp ? entry->timestamp : (int64_t)time(NULL);
    if (!path) {
        if (qk_tune_cache_path(NULL, pbuf, sizeof pbuf) != QK_OK)
            return qk__tune_warn(log, log_user, QK_ERROR_IO, "%s; no autotune cache", qk_last_error());
        path = pbuf;
    }
    pl = strlen(path);
    if (pl == 0 || pl >= QK__TUNE_PATH_MAX)
        return qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: path is empty or too long; no cache");
    slash = strrchr(path, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == path) strcpy(dir, "/");
    else { memcpy(dir, path, (size_t)(slash - path)); dir[slash - path] = 0; }
    if ((err_no = qk__tune_mkdirs(dir)) != 0)
        return qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot create directory %s: %s; no cache",
                             dir, strerror(err_no));

    /* Other processes (and threads: flock locks belong to this open file description) wait
       here, so no update is lost; readers do not lock: they see the old or the new file. */
    snprintf(lockp, sizeof lockp, "%s.lock", path);
    lfd = open(lockp, O_RDWR | O_CREAT | QK__O_CLOEXEC, 0666);
    if (lfd < 0)
        return qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot write %s: %s; no cache", lockp,
                             strerror(errno));
    while (flock(lfd, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        /* A file system without locks: the rename below still keeps the file whole. */
        qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot lock %s: %s; writing without the lock",
                      lockp, strerror(errno));
        break;
    }

    why[0] = 0;
    r = qk__tune_load(path, &v, &n, &err_no, why, sizeof why);
    if (r == QK_ERROR_OUT_OF_MEMORY) { close(lfd); return r; }
    if (r == QK_ERROR_FORMAT)
        qk__tune_warn(log, log_user, r, "autotune cache: ignoring %s: %s; rewriting it", path, why);
    else if (r == QK_ERROR_IO && err_no != ENOENT)
        qk__tune_warn(log, log_user, r, "autotune cache: cannot read %s: %s; rewriting it", path, strerror(err_no));

    /* Merge: replace the entry of the same key (and drop duplicates a hand edit left), or add. */
    newest = -1;
    for (i = 0; i < n; i++) {
        if (!qk__tune_key_eq(&v[i].key, &e.key)) continue;
        if (newest < 0) { v[i] = e; newest = i; }
        else { memmove(v + i, v + i + 1, (size_t)(n - i - 1) * sizeof *v); n--; i--; }
    }
    if (newest < 0) {
        qk_tune_entry *nv = (qk_tune_entry *)QK_MALLOC((size_t)(n + 1) * sizeof *nv);
        if (!nv) { QK_FREE(v); close(lfd); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "autotune cache: out of memory"); }
        if (n) memcpy(nv, v, (size_t)n * sizeof *nv);
        QK_FREE(v);
        v = nv;
        v[n] = e;
        newest = n++;
    }
    while (n > QK_TUNE_CACHE_MAX_ENTRIES) {  /* evict the oldest, never the one just stored */
        int old = newest == 0 ? 1 : 0;
        for (i = 0; i < n; i++)
            if (i != newest && v[i].timestamp < v[old].timestamp) old = i;
        memmove(v + old, v + old + 1, (size_t)(n - old - 1) * sizeof *v);
        if (old < newest) newest--;
        n--;
    }
    memset(&b, 0, sizeof b);
    if (!qk__tune_format(v, n, &b)) {
        QK_FREE(v);
        QK_FREE(b.p);
        close(lfd);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "autotune cache: out of memory");
    }
    QK_FREE(v);

    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | QK__O_CLOEXEC, 0666);
    r = QK_OK;
    if (fd < 0) {
        r = qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot write %s: %s; no cache", tmp,
                          strerror(errno));
    } else {
        int ok = qk__tune_write_all(fd, b.p, b.len) && fsync(fd) == 0;
        int e1 = errno;
        if (close(fd) != 0 && ok) { ok = 0; e1 = errno; }
        if (ok && rename(tmp, path) != 0) { ok = 0; e1 = errno; }
        if (!ok) {
            unlink(tmp);
            r = qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot write %s: %s; not updated", path,
                              strerror(e1));
        } else {
            /* Make the rename itself durable; best effort (some file systems refuse). */
            int dfd = open(dir, O_RDONLY | QK__O_CLOEXEC);
            if (dfd >= 0) { (void)fsync(dfd); close(dfd); }
        }
    }
    QK_FREE(b.p);
    close(lfd);  /* releases the lock */
    return r;
}
#else
QKDEF qk_result qk_tune_cache_lookup(const char *path, const qk_tune_key *key, qk_tune_entry *out,
                                     qk_log_fn log, void *log_user) {
    (void)path; (void)key; (void)out; (void)log; (void)log_user;
    return qk__fail(QK_ERROR_UNSUPPORTED, "autotune cache: not implemented on this platform");
}
QKDEF qk_result qk_tune_cache_store(const char *path, const qk_tune_entry *entry, qk_log_fn log,
                                    void *log_user) {
    (void)path; (void)entry;
    return qk__tune_warn(log, log_user, QK_ERROR_UNSUPPORTED, "autotune cache: not implemented on this platform; no cache");
}
#endif
/* -- policy: cache, measure, fixed table -- */
static void qk__tune_pick(char *config, size_t config_size, char *label, size_t label_size,
                          const char *source, const char *chosen) {
    snprintf(config, config_size, "%s", chosen);
    if (label && label_size) snprintf(label, label_size, "%s: %s", source, chosen);
}

QKDEF qk_result qk_tune_choose(const qk_tune_request *req, char *config, size_t config_size,
                               char *label, size_t label_size) {
    char path[QK__TUNE_PATH_MAX];
    qk_tune_entry e;
    qk_result r;
    int have_path;
    if (!req || !config || config_size == 0 || !req->fixed_config)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune: req, config or fixed_config is NULL");
    memset(&e, 0, sizeof e);
    if ((r = qk__tune_key_norm(&req->key, &e.key)) != QK_OK) return r;
    if (req->mode < 0) {
        qk__tune_pick(config, config_size, label, label_size, "fixed (autotune off)", req->fixed_config);
        return QK_OK;
    }
    if (!req->measure) {
        qk__tune_pick(config, config_size, label, label_size, "fixed (no tuner)", req->fixed_config);
        return QK_OK;
    }
    have_path = qk_tune_cache_path(req->cache_dir, path, sizeof path) == QK_OK;
    if (!have_path)
        qk__tune_warn(req->log, req->log_user, QK_ERROR_IO, "%s; tuning without a cache", qk_last_error());
    if (have_path && req->mode == 0 &&
        qk_tune_cache_lookup(path, &e.key, &e, req->log, req->log_user) == QK_OK) {
        qk__tune_pick(config, config_size, label, label_size, "tuned (cache)", e.config);
        return QK_OK;
    }
    memset(e.config, 0, sizeof e.config);
    e.metric = 0;
    r = req->measure(&e.key, e.config, sizeof e.config, &e.metric, req->measure_user);
    if (r != QK_OK || !memchr(e.config, 0, sizeof e.config) || !e.config[0] || !(e.metric - e.metric == 0.0)) {
        if (r == QK_OK) qk__fail(QK_ERROR_INVALID_ARGUMENT, "the tuner returned an empty configuration or a non-finite metric");
        qk__tune_warn(req->log, req->log_user, QK_ERROR_IO, "autotune failed (%s); using the fixed table: %s",
                      qk_last_error(), req->fixed_config);
        qk__tune_pick(config, config_size, label, label_size, "fixed (autotune failed)", req->fixed_config);
        return QK_OK;
    }
    e.timestamp = 0;
    if (have_path) (void)qk_tune_cache_store(path, &e, req->log, req->log_user);  /* warns itself */
    qk__tune_pick(config, config_size, label, label_size, "tuned (measured)", e.config);
    return QK_OK;
}
/* ---- end autotune cache ---- */

/* ---- implementation: context and orchestration ---- */

#endif /* QK_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the qk authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
