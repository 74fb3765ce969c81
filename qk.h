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
    int k_resident;             /* GPU, host/callback output: all of K kept on the device (slabs
                                   mirror into later rows; K(X,X) then computes half the pairs) */
    int use_blas;               /* GPU: cuBLAS GEMM + fused |.|^2 epilogue instead of the fused kernel */
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
/* (owned by the autotune work) */
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
/* Stream-pool figures of the last qk_cuda_gram on this process: per-stream busy time (sum of the
   intervals its operations ran, from events) and the wall time from the first to the last event.
   Stream 0 computes (states, Gram), stream 1 copies K to the host. */
typedef struct qk_cuda_stats {
    int n_streams;
    int n_slabs;
    double busy_ms[4];
    double wall_ms;             /* first event (after the x upload was queued) to the last */
    double states_ms;           /* bulk state construction (0 when states are built in tiles) */
    double gram_ms;             /* first slab's start to the last slab's end (compute stream) */
    double output_ms;           /* first slab's start to the last D2H's end (= gram_ms on device) */
} qk_cuda_stats;
QKDEF qk_cuda_stats qk_cuda_last_stats(void);

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
/* (owned by the autotune work) */
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
