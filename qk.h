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
/* .npy (numpy.lib.format): the magic "\x93NUMPY", a major and a minor version byte, the header
   length (little-endian uint16 in 1.0, uint32 in 2.0 and 3.0), the header (a Python dict literal,
   ASCII; UTF-8 in 3.0, padded with spaces and ended by '\n'), then the raw array. Only the
   stdio and POSIX (or Win32) calls below are used: fdopen/fileno would need _POSIX_C_SOURCE under
   strict -std=c11, open/write/fsync from <unistd.h> do not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#ifdef _WIN32
#include <io.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <process.h>
#include <windows.h>
#else
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

/* Headers longer than this are not numpy's (it writes ~128 bytes); refusing them keeps a corrupt
   length field from turning into a huge allocation. */
#define QK__NPY_MAX_HEADER (1u << 20)

static int qk__host_little(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

typedef struct qk__npy_header {
    char descr[32];
    int fortran;
    int ndim;
    int64_t shape[4];   /* first 4 dims; ndim counts them all */
    int have_descr, have_fortran, have_shape;
} qk__npy_header;

static const char *qk__npy_ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* A Python string literal in single or double quotes (no escapes: numpy never writes any). */
static const char *qk__npy_str(const char *p, const char *e, char *buf, size_t size) {
    char q;
    size_t n = 0;
    if (p >= e || (*p != '\'' && *p != '"')) return NULL;
    q = *p++;
    while (p < e && *p != q) {
        if (n + 1 < size) buf[n++] = *p;
        p++;
    }
    if (p >= e) return NULL;
    buf[n] = 0;
    return p + 1;
}

static qk_result qk__npy_parse_header(const char *path, const char *h, size_t len, qk__npy_header *o) {
    const char *p = h, *e = h + len;
    memset(o, 0, sizeof(*o));
    p = qk__npy_ws(p, e);
    if (p >= e || *p != '{')
        return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (no '{'): %.60s", path, h);
    p++;
    for (;;) {
        char key[32];
        p = qk__npy_ws(p, e);
        if (p < e && *p == '}') break;
        p = qk__npy_str(p, e, key, sizeof(key));
        if (!p) return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (expected a quoted key): %.80s", path, h);
        p = qk__npy_ws(p, e);
        if (p >= e || *p != ':')
            return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (no ':' after '%s')", path, key);
        p = qk__npy_ws(p + 1, e);
        if (strcmp(key, "descr") == 0) {
            if (p < e && *p == '[')
                return qk__fail(QK_ERROR_FORMAT, "%s: structured dtypes are not supported (qk reads plain float/int arrays)", path);
            p = qk__npy_str(p, e, o->descr, sizeof(o->descr));
            if (!p) return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header ('descr' is not a string)", path);
            o->have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (e - p >= 4 && memcmp(p, "True", 4) == 0) { o->fortran = 1; p += 4; }
            else if (e - p >= 5 && memcmp(p, "False", 5) == 0) { o->fortran = 0; p += 5; }
            else return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header ('fortran_order' is not True or False)", path);
            o->have_fortran = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (p >= e || *p != '(')
                return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header ('shape' is not a tuple)", path);
            p++;
            for (;;) {
                int64_t v = 0;
                p = qk__npy_ws(p, e);
                if (p < e && *p == ')') { p++; break; }
                if (p >= e || *p < '0' || *p > '9')
                    return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (bad 'shape' entry)", path);
                while (p < e && *p >= '0' && *p <= '9') {
                    if (v > (INT64_MAX - 9) / 10)
                        return qk__fail(QK_ERROR_FORMAT, "%s: .npy shape entry overflows 64 bits", path);
                    v = v * 10 + (*p++ - '0');
                }
                if (p < e && *p == 'L') p++;   /* Python 2 long literal */
                if (o->ndim < 4) o->shape[o->ndim] = v;
                o->ndim++;
                p = qk__npy_ws(p, e);
                if (p < e && *p == ',') p++;
                else if (p >= e || *p != ')')
                    return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (bad 'shape' tuple)", path);
            }
            o->have_shape = 1;
        } else {
            return qk__fail(QK_ERROR_FORMAT, "%s: unexpected key '%s' in .npy header", path, key);
        }
        p = qk__npy_ws(p, e);
        if (p < e && *p == ',') { p++; continue; }
        if (p < e && *p == '}') break;
        return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (expected ',' or '}')", path);
    }
    if (!o->have_descr || !o->have_fortran || !o->have_shape)
        return qk__fail(QK_ERROR_FORMAT, "%s: .npy header lacks '%s'", path,
                        !o->have_descr ? "descr" : !o->have_fortran ? "fortran_order" : "shape");
    return QK_OK;
}

/* Converts n items of the file's dtype, already in buf, to doubles in place. 4-byte items are
   widened from the last to the first so that no item is overwritten before it is read. */
static void qk__npy_to_double(unsigned char *buf, int64_t n, char kind, int size, int swap) {
    int64_t i;
    int k;
    if (size == 8) {
        for (i = 0; i < n; i++) {
            unsigned char t[8];
            double d;
            memcpy(t, buf + 8 * i, 8);
            if (swap) for (k = 0; k < 4; k++) { unsigned char c = t[k]; t[k] = t[7 - k]; t[7 - k] = c; }
            if (kind == 'f') memcpy(&d, t, 8);
            else { int64_t v; memcpy(&v, t, 8); d = (double)v; }
            memcpy(buf + 8 * i, &d, 8);
        }
    } else {
        for (i = n; i-- > 0;) {
            unsigned char t[4];
            double d;
            memcpy(t, buf + 4 * i, 4);
            if (swap) { unsigned char c = t[0]; t[0] = t[3]; t[3] = c; c = t[1]; t[1] = t[2]; t[2] = c; }
            if (kind == 'f') { float v; memcpy(&v, t, 4); d = (double)v; }
            else { int32_t v; memcpy(&v, t, 4); d = (double)v; }
            memcpy(buf + 8 * i, &d, 8);
        }
    }
}

QKDEF qk_result qk_npy_read(const char *path, qk_array *out) {
    unsigned char pre[12];
    unsigned char *data = NULL;
    char *hdr = NULL;
    FILE *f;
    size_t got, hlen, nbytes;
    qk__npy_header h;
    qk_result r;
    int major, minor, size, swap;
    char order, kind;
    int64_t rows, cols, count;

    if (!path || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_read: path and out must not be NULL");
    f = fopen(path, "rb");
    if (!f) return qk__fail(QK_ERROR_IO, "cannot open '%s': %s", path, strerror(errno));
    got = fread(pre, 1, 10, f);
    if (got < 6 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: not a .npy file (no \\x93NUMPY magic)", path);
        goto fail;
    }
    if (got < 10) { r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy preamble", path); goto fail; }
    major = pre[6];
    minor = pre[7];
    if (major == 1) {
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if (major == 2 || major == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) { r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy preamble", path); goto fail; }
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
    } else {
        r = qk__fail(QK_ERROR_FORMAT, "%s: .npy version %d.%d is not supported (qk reads 1.0, 2.0, 3.0)", path, major, minor);
        goto fail;
    }
    if (hlen == 0 || hlen > QK__NPY_MAX_HEADER) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: implausible .npy header length %lu", path, (unsigned long)hlen);
        goto fail;
    }
    hdr = (char *)QK_MALLOC(hlen + 1);
    if (!hdr) { r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for the .npy header", path); goto fail; }
    got = fread(hdr, 1, hlen, f);
    if (got < hlen) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy header (%lu of %lu bytes)", path, (unsigned long)got, (unsigned long)hlen);
        goto fail;
    }
    hdr[hlen] = 0;
    r = qk__npy_parse_header(path, hdr, hlen, &h);
    if (r != QK_OK) goto fail;

    order = h.descr[0];
    kind = h.descr[1];
    size = h.descr[2] - '0';
    if (strchr(h.descr, 'O')) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: object arrays (dtype '%s', pickled Python objects) are not supported", path, h.descr);
        goto fail;
    }
    if (strlen(h.descr) != 3 || !strchr("<>=", order) || (kind != 'f' && kind != 'i') || (size != 4 && size != 8)) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: dtype '%s' is not supported (qk reads <f4 <f8 >f4 >f8 <i4 <i8 >i4 >i8)", path, h.descr);
        goto fail;
    }
    if (h.fortran) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: the array is in Fortran order; qk reads C-order arrays only "
                     "(save np.ascontiguousarray(a) instead)", path);
        goto fail;
    }
    if (h.ndim < 1 || h.ndim > 2) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: the array has %d dimensions; qk reads 1-D or 2-D arrays", path, h.ndim);
        goto fail;
    }
    rows = h.shape[0];
    cols = h.ndim == 2 ? h.shape[1] : 1;
    if (cols > 0 && rows > INT64_MAX / 8 / cols) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: shape (%lld, %lld) is too large", path, (long long)rows, (long long)cols);
        goto fail;
    }
    count = rows * cols;
    if ((uint64_t)count > (uint64_t)(SIZE_MAX / 8)) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: %lld elements do not fit in memory", path, (long long)count);
        goto fail;
    }
    /* One element at least, so that an empty array still has a non-NULL data pointer. */
    data = (unsigned char *)QK_MALLOC((size_t)(count > 0 ? count : 1) * 8);
    if (!data) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for %lld elements", path, (long long)count);
        goto fail;
    }
    nbytes = (size_t)count * (size_t)size;
    got = fread(data, 1, nbytes, f);
    if (ferror(f)) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
    if (got < nbytes) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated data: %lu of %lu bytes for shape (%lld, %lld) of %s", path,
                     (unsigned long)got, (unsigned long)nbytes, (long long)rows, (long long)cols, h.descr);
        goto fail;
    }
    if (fgetc(f) != EOF) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: the file holds more data than shape (%lld, %lld) of %s needs", path,
                     (long long)rows, (long long)cols, h.descr);
        goto fail;
    }
    fclose(f);
    swap = order == '=' ? 0 : ((order == '<') != qk__host_little());
    qk__npy_to_double(data, count, kind, size, swap);
    QK_FREE(hdr);
    out->data = (double *)(void *)data;
    out->rows = rows;
    out->cols = cols;
    out->ndim = h.ndim;
    return QK_OK;
fail:
    fclose(f);
    if (hdr) QK_FREE(hdr);
    if (data) QK_FREE(data);
    return r;
}

#ifdef _WIN32
#define QK__OPEN_TMP(p) _open((p), _O_WRONLY | _O_CREAT | _O_EXCL | _O_BINARY, _S_IREAD | _S_IWRITE)
#define QK__WRITE(fd, b, n) _write((fd), (b), (unsigned)(n))
#define QK__FSYNC(fd) _commit(fd)
#define QK__CLOSE(fd) _close(fd)
#define QK__GETPID() ((long)_getpid())
#define QK__RENAME(a, b) (MoveFileExA((a), (b), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH) ? 0 : (errno = EACCES, -1))
#else
#define QK__OPEN_TMP(p) open((p), O_WRONLY | O_CREAT | O_EXCL, 0666)
#define QK__WRITE(fd, b, n) write((fd), (b), (n))
#define QK__FSYNC(fd) fsync(fd)
#define QK__CLOSE(fd) close(fd)
#define QK__GETPID() ((long)getpid())
#define QK__RENAME(a, b) rename((a), (b))
#endif

/* Writes all n bytes; retries short writes and EINTR. */
static int qk__write_all(int fd, const void *buf, size_t n) {
    const unsigned char *p = (const unsigned char *)buf;
    while (n > 0) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        long w = (long)QK__WRITE(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) { errno = EIO; return -1; }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

QKDEF qk_result qk_npy_write(const char *path, const void *data, qk_dtype dtype, int64_t rows,
                             int64_t cols) {
    char hdr[192];
    char *tmp;
    size_t plen, itemsize, nbytes, total;
    int len, fd = -1, i, err;
    int64_t count;
    const char *what;

    if (!path) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: path is NULL");
    if (dtype == QK_DTYPE_DEFAULT) dtype = QK_F64;
    if (dtype != QK_F32 && dtype != QK_F64)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: dtype %d is neither QK_F32 nor QK_F64", (int)dtype);
    if (rows < 0 || cols < 0)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: negative shape (%lld, %lld)", (long long)rows, (long long)cols);
    itemsize = dtype == QK_F32 ? 4 : 8;
    if (cols > 0 && rows > INT64_MAX / 8 / cols)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: shape (%lld, %lld) is too large", (long long)rows, (long long)cols);
    count = cols > 0 ? rows * cols : rows;
    if ((uint64_t)count > (uint64_t)(SIZE_MAX / itemsize))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: %lld elements do not fit in memory", (long long)count);
    if (!data && count > 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: data is NULL");
    nbytes = (size_t)count * itemsize;

    /* Native byte order: the data is written as it lies in memory. */
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    if (cols > 0)
        len = snprintf(hdr + 10, sizeof(hdr) - 10, "{'descr': '%cf%d', 'fortran_order': False, 'shape': (%lld, %lld), }",
                       qk__host_little() ? '<' : '>', (int)itemsize, (long long)rows, (long long)cols);
    else
        len = snprintf(hdr + 10, sizeof(hdr) - 10, "{'descr': '%cf%d', 'fortran_order': False, 'shape': (%lld,), }",
                       qk__host_little() ? '<' : '>', (int)itemsize, (long long)rows);
    /* numpy pads the header with spaces and a final '\n' so that the data starts on a 64-byte
       boundary (memory-mapped readers rely on the alignment). */
    total = ((size_t)(10 + len + 1) + 63) / 64 * 64;
    memset(hdr + 10 + len, ' ', total - (size_t)(10 + len) - 1);
    hdr[total - 1] = '\n';
    hdr[8] = (char)((total - 10) & 0xff);
    hdr[9] = (char)((total - 10) >> 8);

    plen = strlen(path);
    tmp = (char *)QK_MALLOC(plen + 48);
    if (!tmp) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_npy_write: out of memory");
    /* O_EXCL makes the temporary name ours even when another thread or process writes the same
       path: a taken name is skipped, never shared. */
    for (i = 0; i < 1000; i++) {
        snprintf(tmp, plen + 48, "%s.tmp.%ld.%d", path, QK__GETPID(), i);
        fd = QK__OPEN_TMP(tmp);
        if (fd >= 0 || errno != EEXIST) break;
    }
    if (fd < 0) {
        qk_result r = qk__fail(QK_ERROR_IO, "cannot write '%s': creating '%s' failed: %s", path, tmp, strerror(errno));
        QK_FREE(tmp);
        return r;
    }
    what = "write";
    if (qk__write_all(fd, hdr, total) != 0 || qk__write_all(fd, data, nbytes) != 0) goto fail;
    what = "fsync";
    if (QK__FSYNC(fd) != 0) goto fail;
    what = "close";
    err = QK__CLOSE(fd);
    fd = -1;
    if (err != 0) goto fail;
    what = "rename";
    if (QK__RENAME(tmp, path) != 0) goto fail;
#ifndef _WIN32
    {
        /* The rename is durable once the directory entry is on disk; best effort (some file
           systems refuse fsync on a directory). */
        const char *slash = strrchr(path, '/');
        int dfd;
        if (slash) {
            size_t dl = slash == path ? 1 : (size_t)(slash - path);
            memcpy(tmp, path, dl);
            tmp[dl] = 0;
            dfd = open(tmp, O_RDONLY);
        } else {
            dfd = open(".", O_RDONLY);
        }
        if (dfd >= 0) { (void)fsync(dfd); (void)close(dfd); }
    }
#endif
    QK_FREE(tmp);
    return QK_OK;
fail:
    {
        int e = errno;
        qk_result r;
        if (fd >= 0) (void)QK__CLOSE(fd);
        (void)remove(tmp);
        r = qk__fail(QK_ERROR_IO, "cannot write '%s': %s failed: %s", path, what, strerror(e));
        QK_FREE(tmp);
        return r;
    }
}

/* Reads a whole file into a NUL-terminated buffer. */
static qk_result qk__read_file(const char *path, char **out, size_t *out_len) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (!f) return qk__fail(QK_ERROR_IO, "cannot open '%s': %s", path, strerror(errno));
    for (;;) {
        size_t got;
        if (cap - len < 4096 + 1) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = (char *)QK_MALLOC(ncap);
            if (!nb) {
                fclose(f);
                if (buf) QK_FREE(buf);
                return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory reading the file", path);
            }
            if (buf) { memcpy(nb, buf, len); QK_FREE(buf); }
            buf = nb;
            cap = ncap;
        }
        got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        int e = errno;
        fclose(f);
        QK_FREE(buf);
        return qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(e));
    }
    fclose(f);
    buf[len] = 0;
    *out = buf;
    *out_len = len;
    return QK_OK;
}

/* One CSV field as a number: surrounding blanks allowed, nothing else. */
static int qk__csv_number(const char *s, const char *e, double *v) {
    char tmp[80];
    char *end;
    size_t n;
    while (s < e && (*s == ' ' || *s == '\t')) s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t')) e--;
    n = (size_t)(e - s);
    if (n == 0 || n >= sizeof(tmp)) return 0;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    *v = strtod(tmp, &end);
    return end == tmp + n;
}

/* Walks the text once; counts rows and columns when data is NULL, fills data otherwise. */
static qk_result qk__csv_scan(const char *path, const char *text, size_t len, double *data,
                              int64_t *rows_out, int64_t *cols_out) {
    const char *p = text, *end = text + len;
    int64_t line = 0, rows = 0, cols = -1, cols_line = 0, k = 0;
    int first = 1;
    if (len >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0) p += 3;   /* UTF-8 byte order mark */
    while (p < end) {
        const char *s = p, *e = (const char *)memchr(p, '\n', (size_t)(end - p)), *q;
        int64_t c = 0;
        int numeric = 1;
        if (!e) e = end;
        p = e + 1;
        line++;
        if (e > s && e[-1] == '\r') e--;
        for (q = s; q < e && (*q == ' ' || *q == '\t'); q++) {}
        if (q == e || *q == '#') continue;   /* blank or comment line */
        if (first) {
            /* The first line is a header when any of its fields is not a number. */
            const char *f = s;
            for (;;) {
                const char *fe = (const char *)memchr(f, ',', (size_t)(e - f));
                double v;
                if (!fe) fe = e;
                if (!qk__csv_number(f, fe, &v)) { numeric = 0; break; }
                if (fe == e) break;
                f = fe + 1;
            }
            first = 0;
            if (!numeric) continue;
        }
        {
            const char *f = s;
            for (;;) {
                const char *fe = (const char *)memchr(f, ',', (size_t)(e - f));
                double v;
                if (!fe) fe = e;
                c++;
                if (!qk__csv_number(f, fe, &v)) {
                    const char *a = f, *b = fe;
                    while (a < b && (*a == ' ' || *a == '\t')) a++;
                    if (a == b)
                        return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, column %lld: empty field", path,
                                        (long long)line, (long long)c);
                    return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, column %lld: '%.*s' is not a number", path,
                                    (long long)line, (long long)c, (int)(b - a > 40 ? 40 : b - a), a);
                }
                /* The counting pass has checked every row's length, so the fill pass fits. */
                if (data) data[k++] = v;
                if (fe == e) break;
                f = fe + 1;
            }
        }
        if (cols < 0) { cols = c; cols_line = line; }
        else if (c != cols)
            return qk__fail(QK_ERROR_FORMAT, "%s: line %lld has %lld columns, line %lld has %lld", path,
                            (long long)line, (long long)c, (long long)cols_line, (long long)cols);
        rows++;
    }
    if (rows == 0) return qk__fail(QK_ERROR_FORMAT, "%s: no numeric rows", path);
    *rows_out = rows;
    *cols_out = cols;
    return QK_OK;
}

QKDEF qk_result qk_csv_read(const char *path, qk_array *out) {
    char *text;
    size_t len;
    int64_t rows = 0, cols = 0;
    double *data;
    qk_result r;
    if (!path || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_csv_read: path and out must not be NULL");
    r = qk__read_file(path, &text, &len);
    if (r != QK_OK) return r;
    r = qk__csv_scan(path, text, len, NULL, &rows, &cols);
    if (r != QK_OK) { QK_FREE(text); return r; }
    if ((uint64_t)rows > (uint64_t)(SIZE_MAX / 8) / (uint64_t)cols) {
        QK_FREE(text);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: %lld x %lld values do not fit in memory", path, (long long)rows, (long long)cols);
    }
    data = (double *)QK_MALLOC((size_t)rows * (size_t)cols * sizeof(double));
    if (!data) {
        QK_FREE(text);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for %lld x %lld values", path, (long long)rows, (long long)cols);
    }
    r = qk__csv_scan(path, text, len, data, &rows, &cols);
    QK_FREE(text);
    if (r != QK_OK) { QK_FREE(data); return r; }
    out->data = data;
    out->rows = rows;
    out->cols = cols;
    out->ndim = 2;
    return QK_OK;
}

QKDEF void qk_array_free(qk_array *a) {
    if (!a) return;
    if (a->data) QK_FREE(a->data);
    a->data = NULL;
    a->rows = a->cols = 0;
    a->ndim = 0;
}
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
