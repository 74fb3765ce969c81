/* >>results ---- qk_result, error strings, the detail message ---- */
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

/* >>maps ---- feature maps: ops, angles, built-ins, the spec parser's entry points ---- */
/* clang-format off: the kinds in groups, one comment a group */
typedef enum qk_op_kind {
    QK_OP_H = 1, QK_OP_X, QK_OP_Y, QK_OP_Z,
    QK_OP_RX, QK_OP_RY, QK_OP_RZ, QK_OP_P,     /* one qubit (q0), angle */
    QK_OP_CNOT, QK_OP_CZ,                       /* control q0, target q1 */
    QK_OP_RZZ,                                  /* exp(-i t/2 Z_q0 Z_q1) (PennyLane MultiRZ on 2 wires) */
    QK_OP_AMPLITUDE,                            /* state := x / ||x||, zero-padded (first op only) */
    QK_OP_BASIS,                                /* X on q0 when feature angle.x0 is 1 (must be 0 or 1) */
    QK_OP_KIND_COUNT_,
    QK__OP_STATE_ = 64,                         /* private: qk_gram_states' op (no map a user builds holds it) */
    QK__OP_MPS_ = 65                            /* private: qk_gram_mps_states' op */
} qk_op_kind;
/* clang-format on */

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

/* Resource bounds of a map, checked by qk_map_make (and qk_map_parse) before anything is
   allocated, so that a typo such as reps=100000000 is an error, not minutes of allocation.
   An entangling built-in map (zz, iqp, hea of 2 or more qubits, amplitude) is also refused
   beyond QK_MAX_STATE_QUBITS before its op list is built. Define them before including qk.h,
   the same in every translation unit, to change them. */
#ifndef QK_MAX_REPS
#define QK_MAX_REPS 1024            /* reps / layers / n_repeats of a built-in map */
#endif
#ifndef QK_MAX_OPS
#define QK_MAX_OPS (1 << 20)        /* ops of any map (zz of 30 qubits, full: 768 reps) */
#endif
#ifndef QK_MAX_WEIGHTS
#define QK_MAX_WEIGHTS (1 << 20)    /* trainable weights of any map */
#endif
/* Largest |angle| (radians) qk_map_check_data lets through; beyond it (or at a non-finite
   angle) the data is refused: a phase of 1e300 rad has no meaningful value mod 2 pi, and sums
   of such angles in the GPU engine's folded phases could overflow. */
#define QK_MAX_ABS_ANGLE 1e300

QKDEF qk_result qk_map_make(const qk_map_desc *desc, qk_map **out);
/* Spec string (the CLI's --map): "zz(reps=2,ent=linear)", "iqp", "angle(rot=y)", "amplitude",
   "basis", "hea(layers=2,rot=y,ent=cz)", "circuit(qubits=2: h(0) rz(0, 2*x0) cx(0,1) ...)".
   docs/maps.md has the grammar. n_features comes from the data. Errors name the column (and,
   for an unknown parameter, list the map's parameters). Numbers are read in C syntax ('.' is
   the decimal point) whatever the program's locale. */
QKDEF qk_result qk_map_parse(const char *spec, int n_features, qk_map **out);
QKDEF void qk_map_free(qk_map *map);
/* Copies n weights (n must equal map->n_weights; all finite). */
QKDEF qk_result qk_map_set_weights(qk_map *map, const double *w, int n);
/* Writes a spec string that qk_map_parse() turns back into the same map (including custom
   circuits), numbers in C syntax whatever the locale. Returns the length it needs (like
   snprintf). */
QKDEF int qk_map_spec(const qk_map *map, char *buf, size_t size);
QKDEF const char *qk_map_class_string(qk_map_class c);

/* Evaluate every op's angle for one sample (n_ops values; ops with no angle get 0). */
QKDEF void qk_map_angles(const qk_map *map, const double *x, double *theta);
/* Checks x (n rows of map->n_features) for the map: every value finite; basis features 0 or 1;
   every op's angle (theta = scale * f(x, w) + offset, with the map's current weights) finite
   and at most QK_MAX_ABS_ANGLE in magnitude (finite but huge features can overflow it);
   amplitude rows with a sum of squares that neither overflows nor underflows (below DBL_MIN it
   loses precision) nor is zero. The detail message names the first bad row, column and op. */
QKDEF qk_result qk_map_check_data(const qk_map *map, const double *x, int64_t n, const char *name);

/* >>context ---- qk_ctx and its desc (device, threads, allocator, log) ---- */
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
   operand rounding of a tensor-core mode in Gauss's form of the complex product (the cuBLAS
   engines): 2 sqrt(10) e + 10 e^2, e = e_p + 2^-23, e_p = 2u + u^2 (u = 2^-11 TF32 and FP16)
   or 3 * 2^-22 (FP32X3); FP64 1e-10. DEFAULT, AUTO or a bad value: -1. */
QKDEF double qk_precision_error_bound(qk_precision p, int n_qubits);
/* A precision's name: "default", "fp32", "fp64", "tf32", "fp32x3", "fp16", "auto"; "?" out of
   range. The one table of names: the CLIs, the Python package, plan descriptions and the autotune
   cache use it. */
QKDEF const char *qk_precision_name(qk_precision p);
/* The precision named s (one of qk_precision_name's names, exactly). QK_ERROR_INVALID_ARGUMENT
   (detail: the valid names) for any other string or NULL; *out is left untouched then. */
QKDEF qk_result qk_precision_parse(const char *s, qk_precision *out);

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
       ordinals 0 .. n-1). A qk_gram of at least qk_gram_desc.mgpu_min_pairs pairs per GPU goes to the
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
    qk_allocator allocator; /* default: QK_MALLOC / QK_FREE, the library's one allocator. Where
                               set, it serves the context's own blocks only (the qk_ctx, its thread
                               pool); every other allocation is QK_MALLOC's (docs/api.md) */
    size_t host_memory;     /* CPU engine: host bytes its plans may use (states, streamed-output
                               slabs, per-thread scratch; not K in the caller's buffer); when all
                               states do not fit, they are built in blocks (state tiles). Default
                               0: 85% of the available memory at each plan (Linux: MemAvailable,
                               bounded by a cgroup v2 memory.max; elsewhere sysconf; and by the
                               room RLIMIT_AS and RLIMIT_DATA leave, where finite) */
} qk_ctx_desc;

typedef struct qk_ctx qk_ctx;

QKDEF qk_result qk_ctx_create(const qk_ctx_desc *desc, qk_ctx **out);
QKDEF void qk_ctx_destroy(qk_ctx *ctx);
/* The resolved desc (defaults filled in, device resolved to CPU or CUDA). */
QKDEF qk_ctx_desc qk_ctx_query(const qk_ctx *ctx);

/* The instruction set of the CPU engine's kernels (the Gram micro-kernels, the MPS transfer
   matrices, the gradient's products), process-wide: "generic", "avx2" (AVX2 + FMA) or "avx512"
   (AVX-512F). A portable x86-64 build (no -march; a wheel) has all three and takes the best the
   CPU has, or the environment variable QK_CPU_ISA (generic, avx2, avx512, auto) where the CPU has
   it, read once, at the first call that asks; a build without runtime dispatch (-march=native,
   other architectures) has only its target's and names it. qk_cpu_isa_set chooses (NULL or
   "auto": the best) for the calls started afterwards: QK_ERROR_UNSUPPORTED where the CPU or the
   build lacks it, the choice unchanged. qk_cpu_isa_note: "" or why QK_CPU_ISA was not taken (an
   unknown name, an instruction set this CPU lacks: the best it has is used). docs/api.md, "CPU
   instruction sets". */
QKDEF const char *qk_cpu_isa(void);
QKDEF qk_result qk_cpu_isa_set(const char *isa);
QKDEF const char *qk_cpu_isa_note(void);

/* >>gram ---- qk_gram and its desc (outputs, precision, path, progress) ---- */
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
       the same directory (out_path.tmp.<pid>.<k>.<host>), synced and renamed over out_path when K
       is complete; on any error or cancel the temporary file is removed and out_path is
       untouched. Temporaries of out_path that dead processes of this host left are removed
       first (Linux; never a live process's). */
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
    /* Tunables (docs/api.md, "Tunables"): 0 = the default, which is the macro of the same name in
       capitals (define it before the implementation include to change the default everywhere). */
    size_t cpu_slab_bytes;      /* QK_CPU_SLAB_BYTES (128 MB): host bytes of one of the CPU engine's
                                   two slabs of streamed K (output NPY; plan.slab_rows) */
    int64_t mgpu_min_pairs;     /* QK_MGPU_MIN_PAIRS (2^25): a context of several GPUs deals K to
                                   as many GPUs as get at least this many pairs each (>= 0) */
    int mgpu_host_bound_split;  /* QK_MGPU_HOST_BOUND_SPLIT (0): 1 deals a host-bound K(X,X) to
                                   several GPUs too (whole rows), -1 keeps it on the first GPU;
                                   0 deals it out where the HOST buffer is page-locked */
    size_t mpi_block_bytes;     /* QK_MPI_BLOCK_BYTES (512 MB): qk_gram_mpi, host bytes of one of
                                   a rank's two block buffers (the size of its sub-jobs) */
    size_t mpi_sync_bytes;      /* QK_MPI_SYNC_BYTES (256 MB): qk_gram_mpi's writer thread syncs
                                   the file after this many bytes (none with no_sync) */
} qk_gram_desc;

QKDEF qk_result qk_gram(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc);

/* States of n samples: out holds n * 2^q complex values, interleaved (re, im) doubles, the layout
   of numpy complex128. Product maps work too (up to QK_MAX_STATE_QUBITS). */
QKDEF qk_result qk_states(qk_ctx *ctx, const qk_map *map, const double *x, int64_t n, double *out);

/* >>vjp ---- the gradient of a loss of K for every weight (qk_gram_vjp) ---- */
/* For a loss L(K) and G = dL/dK (n_x x n_y, row-major, ld_g), dL/dw for every trainable weight of
   the map at once: the states, S = <psi_i|phi_j>, one more product and one adjoint sweep per
   sample through its circuit (docs/gradients.md), about the cost of two to four Gram
   evaluations whatever the number of weights. fp64, the statevector paths, all states resident:
   on the CPU engine, or on the context's first GPU where the context runs on the CUDA engine
   (cuBLAS products, one adjoint-sweep block per sample; device memory bounded first). */
typedef struct qk_vjp_desc {
    const double *x;        /* n_x rows of map->n_features */
    int64_t n_x;
    const double *y;        /* NULL: K(X,X) (G need not be symmetric) */
    int64_t n_y;
    const double *g;        /* dL/dK, n_x x n_y (n_x x n_x) */
    int64_t ld_g;           /* default: columns of K */
    double *grad_w;         /* out: map->n_weights values (NULL only for a map without weights) */
    double *k_out;          /* NULL, or K (n_x x n_y, fp64, row-major) from the same pass */
    qk_progress_fn progress;    /* may be NULL: called between the phases and during the sweeps,
                                   from the calling thread (done, total: samples swept of n_x + n_y);
                                   non-zero cancels (QK_ERROR_CANCELLED, grad_w and k_out untouched) */
    void *progress_user;
    double *grad_x;         /* NULL, or out: dL/dX, n_x rows of map->n_features (row-major): the
                               gradient for the data (feature learning); K(X,X): X's both roles.
                               Angle encodings only (x in gate angles: x, x*x', (pi-x)(pi-x'),
                               w*x); amplitude and basis maps are QK_ERROR_UNSUPPORTED */
    double *grad_y;         /* NULL, or out: dL/dY, n_y rows (K(X,Y) only) */
} qk_vjp_desc;
QKDEF qk_result qk_gram_vjp(qk_ctx *ctx, const qk_map *map, const qk_vjp_desc *desc);

/* The projected quantum kernel (Huang et al. 2021): K(x, x') = exp(-gamma sum_k ||rho_k(x) -
   rho_k(x')||_F^2) over the one-qubit reduced density matrices of the map's states; into a host
   buffer (desc: x, y, out, ld_out, out_dtype, path, mps_max_bond; other outputs
   QK_ERROR_UNSUPPORTED). fp64: entangling maps on the statevector path (up to
   QK_MAX_STATE_QUBITS) or on the MPS path (any qubit count for MPS-able maps; chosen as qk_gram
   chooses it, or forced with path = QK_PATH_MPS), product maps at any qubit count. gamma > 0.
   CPU engine, or the CUDA engine's first GPU for a context on it (the MPS path's MPS built on
   the host, their environment sweeps and the pairwise kernel on the device). */
QKDEF qk_result qk_gram_projected(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, double gamma);

/* >>states_in ---- K from given states: a simulator's own statevectors (qk_gram_states) ---- */
/* K[i][j] = |<a_i|b_j>|^2 of states the caller simulated (any gate set, any noise trajectory),
   with qk's planner, tiling, outputs and precision modes (docs/states.md). */
typedef enum qk_state_type {
    QK_STATE_DEFAULT = 0,   /* = C128 */
    QK_STATE_C128,          /* complex double, interleaved (re, im): numpy complex128, C99 double complex */
    QK_STATE_C64,           /* complex float, interleaved: numpy complex64, cuComplex */
    QK_STATE_F64,           /* real double amplitudes */
    QK_STATE_F32            /* real float amplitudes */
} qk_state_type;
/* The state provider: writes the states of samples [i0, i1) of side (0: A, 1: B) into buf, a
   buffer qk owns, (i1 - i0) rows of ld elements of the states' type (the first dim of each
   row are read), on the host. Called from one thread at a time, when the plan needs those rows;
   the same rows may be asked for more than once (qk_plan.state_tile: K(X,X) of n states in
   state tiles of R rows asks for about n^2 / 2R rows). Return 0, or non-zero to fail the job
   (QK_ERROR_CANCELLED, nothing written). */
typedef int (*qk_state_fn)(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user);
typedef struct qk_states_desc {
    qk_state_type type;     /* default C128 */
    int64_t dim;            /* amplitudes per state (required, >= 2); a dim that is no power of two
                               is zero-padded to the next one (the engines' 2^q) */
    const void *a;          /* n_a states, row-major, lda elements apart (default dim) */
    int64_t n_a, lda;
    const void *b;          /* NULL: K(A,A), symmetric (computed once per pair, mirrored) */
    int64_t n_b, ldb;
    int on_device;          /* 1: a and b are CUDA device pointers (a context on the GPU engine)
                               on its first GPU: read in place there, never copied to the host;
                               its other GPUs copy their parts' rows in from it (docs/states.md) */
    int normalize;          /* 0 (default): each state's norm is checked, |<a|a> - 1| <= norm_tol,
                               an error naming the row otherwise; 1: each state is scaled to norm 1
                               (a zero state is an error) */
    double norm_tol;        /* default (0): 1e-9 for C128 / F64, 1e-5 for C64 / F32 */
    qk_state_fn provider;   /* instead of a and b (both NULL): qk asks for rows as it needs them and
                               never holds all states (host rows; CPU engine, and one GPU) */
    void *provider_user;
    /* Mixed states (CPU and GPU engines): 1 where a side holds density matrices, dim x dim row-major per
       sample (lda, ldb: elements from one matrix to the next, default dim * dim); K[i][j] =
       Tr(rho_i rho_j), the Hilbert-Schmidt kernel (purity on the diagonal of K(A,A)); a pure
       side against a mixed one gives <psi|rho|psi>, and two pure sides |<a|b>|^2 as without
       these (a pure side against a mixed one is expanded to |psi><psi| on the host: dim^2
       values per state). Each matrix is checked: finite, Hermitian within norm_tol, trace within
       norm_tol of 1 (normalize = 1 divides by the trace); positivity is not checked. dim^2 (2
       dim^2 for complex types) must fit QK_MAX_STATE_QUBITS. The GPU engine runs them on its
       cuBLAS fp64 / fp32 engine (the tensor-core modes run fp32 there), host or device matrices
       (device ones checked on the device); a pure side against a mixed one takes host states. */
    int a_mixed, b_mixed;
} qk_states_desc;
/* K from the states of states->a (and states->b) into desc's output: desc as for qk_gram, with
   x and y NULL (n_x and n_y are ignored: n_a and n_b count the rows). Every output (HOST, DEVICE,
   CALLBACK, NPY), precision (with its bound; qk_precision_error_bound at the states' qubit
   count), the state tiles where the states do not fit, several GPUs. Errors: a non-finite
   amplitude or a norm off 1 names the side and the row ("A[12]: ..."). */
QKDEF qk_result qk_gram_states(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc);

/* >>mps_in ---- K from given matrix product states (qk_gram_mps_states) ---- */
/* K[i][j] = |<a_i|b_j>|^2 of states the caller holds as open-boundary matrix product states (a
   tensor-network simulator's, quimb's, ITensor's, TeNPy's), contracted by qk's MPS engine (CPU;
   the GPU engine's MPS kernels on a CUDA context) with every output of qk_gram (docs/states.md,
   "MPS input"). Sample i's site s is a rank-3 tensor of bond[s] x 2 x bond[s+1] entries (layout
   LPR: [left][physical][right] row-major, the order of ITensor's (link, site, link), TeNPy's
   (vL, p, vR) and qk's own MPS; LRP: [left][right][physical], quimb's default 'lrp'), with
   bond[0] = bond[n_sites] = 1 (open boundary). Site s carries qubit s, bit s of qk's amplitude
   index (qk_states, Qiskit's little-endian order): a quimb / ITensor MPS contracted to a dense
   vector puts site 0 in the most significant bit instead (the same state, the bits reversed;
   K does not depend on the order as long as both sides use the same). */
typedef enum qk_mps_layout {
    QK_MPS_LPR = 0,         /* [left][physical][right] (default) */
    QK_MPS_LRP = 1          /* [left][right][physical] (quimb's 'lrp') */
} qk_mps_layout;
typedef struct qk_mps_states_desc {
    qk_state_type type;     /* the tensors' entries: default C128, also C64, F64, F32 */
    qk_mps_layout layout;
    int n_sites;            /* qubits, 1 .. QK_MAX_PRODUCT_QUBITS */
    const void *const *a;   /* n_a * n_sites pointers: a[i * n_sites + s] is sample i's site s,
                               a_bonds[i * (n_sites + 1) + s] x 2 x a_bonds[i * (n_sites + 1) + s + 1]
                               contiguous entries in the layout */
    const int *a_bonds;     /* n_a * (n_sites + 1) bond dimensions, 1 .. QK_MPS_MAX_BOND; the first
                               and last of each sample 1 */
    int64_t n_a;
    const void *const *b;   /* NULL: K(A,A), symmetric (computed once per pair, mirrored) */
    const int *b_bonds;
    int64_t n_b;
    int normalize;          /* 0 (default): each state's norm <psi|psi> (contracted from its
                               tensors) must be within norm_tol of 1; 1: each state is scaled to
                               norm 1 (a zero state is an error) */
    double norm_tol;        /* default (0): 1e-9 for C128 / F64, 1e-5 for C64 / F32 */
} qk_mps_states_desc;
/* K from the MPS of mps->a (and mps->b) into desc's output: desc as for qk_gram (x and y NULL,
   n_x and n_y ignored, path DEFAULT or MPS, no mps_max_bond / mps_cutoff: the tensors are
   contracted as they are; qk_plan_mps_states gives the plan). The tensors are read while the
   call runs (packed into the engine's layout, every bond padded to the largest of its samples)
   and not kept. Errors name the side, the sample and the site ("A[3] site 17: entry (0, 1, 2)
   is NaN"); nothing is written then. */
QKDEF qk_result qk_gram_mps_states(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc);

/* >>plan ---- device info, qk_plan, the planner and the VRAM estimator ---- */
typedef struct qk_device_info {
    int present;                /* 0: no CUDA device (CPU engine) */
    char name[128];
    int cc_major, cc_minor;
    int sm_count;
    int driver_version;         /* cudaDriverGetVersion(), e.g. 13000 */
    size_t total_bytes, free_bytes;
    size_t smem_per_block_optin;
    size_t l2_bytes;
    size_t host_budget_bytes;   /* CPU engine (present == 0, and the MPS path): host memory its
                                   plan may use; 0: 85% of the host's available memory, read at
                                   plan time (qk_ctx_desc.host_memory sets it for a context) */
    int wgmma;                  /* 1: this device runs the CUDA engine's warpgroup-MMA kernels
                                   (compute capability 9.0 and a build for sm_90a): the fused
                                   tensor-core kernel's configuration 4 (docs/precision.md) */
} qk_device_info;

typedef enum qk_backend { QK_BACKEND_CPU = 1, QK_BACKEND_CUDA } qk_backend;

/* The GPU engine's Gram engine (qk_plan.engine; docs/gpu.md, docs/precision.md). The values are
   those the older int qk_plan.use_blas had, so that plans and autotune cache entries written
   before the enum read the same (docs/autotune.md).
     FUSED       the fused SIMT kernel: <a|b>, |.|^2 and the store in one kernel (kernel_cfg picks
                 its tile configuration)
     CUBLAS      cuBLAS (HERK/SYRK + GEMM) into a slab workspace + the fused |.|^2 epilogue
     CUBLAS_3M   the same with CGEMM3M (complex fp32)
     TC_*        the tensor-core engines: real form of the complex product, blocks of the upper
                 triangle, GEMMs of cuBLAS, the same epilogue: TF32, FP32X3 (hi/lo fp16 split),
                 FP16, BF16 (measurement only: no precision selects it), FP64 (DGEMM real form)
     TCF_*       the fused tensor-core kernel (mma.sync, |.|^2 and the mirror in its epilogue, the
                 triangular tile grid): TF32, FP32X3, FP16 */
typedef enum qk_gpu_engine {
    QK_GPU_FUSED = 0,
    QK_GPU_CUBLAS = 1,
    QK_GPU_CUBLAS_3M = 2,
    QK_GPU_TC_TF32 = 3,
    QK_GPU_TC_FP32X3 = 4,
    QK_GPU_TC_FP16 = 5,
    QK_GPU_TC_BF16 = 6,
    QK_GPU_TC_FP64 = 7,
    QK_GPU_TCF_TF32 = 8,
    QK_GPU_TCF_FP32X3 = 9,
    QK_GPU_TCF_FP16 = 10,
    QK_GPU_ENGINE_COUNT
} qk_gpu_engine;

/* One part of K that one GPU of a plan of several computes (qk_plan.parts), and the plan it
   runs: made with the whole plan (qk_plan_for_devices: for that GPU's device info, as
   qk_plan_for_device plans the part's job; qk_plan_make: for its free memory at plan time, and
   autotuned), so that the multi-GPU engine only executes it. The part's job: rows [row0, row0 +
   n_rows) of X against columns [col0, col0 + n_cols) of Y (K(X,X): of X), in the whole plan's
   precision and out_dtype; a diagonal block (symmetric) is K(X_band, X_band) itself, its upper
   triangle computed and mirrored. The fields from bulk_states on mean what qk_plan's of the same
   name mean, for the part's job on its GPU; the part's plan takes the rest from the whole plan
   (backend, path, precision, out_dtype, output, n_qubits, error_bound; tol 0, no precision note:
   the part runs the precision the whole plan resolved). */
#define QK_MAX_PARTS (2 * QK_MAX_DEVICES)
typedef struct qk_plan_part {
    int device;                 /* index into qk_plan.devices (not the CUDA ordinal) */
    int symmetric;              /* 1: the band's diagonal block (K(X_band, X_band)), or where n_cols > n_rows its
                                   rows from the diagonal to n (the first n_rows rows of K(X[row0:], X[row0:]));
                                   0: a rectangle */
    int mirror;                 /* 1: the GPU writes the rectangle's mirror below the diagonal too */
    int64_t row0, n_rows;       /* rows of K */
    int64_t col0, n_cols;       /* columns of K */
    int bulk_states;
    int64_t state_tile;
    int64_t tile_m, tile_n;
    int n_streams;
    int64_t slab_rows;
    int host_pinned;            /* HOST output: the part's rows of the caller's buffer are page-locked */
    size_t bytes_states, bytes_out, bytes_staging, bytes_workspace, bytes_total;
    size_t bytes_budget;        /* vram_fraction * that GPU's free memory */
    int k_resident;
    qk_gpu_engine engine;
    int kernel_cfg;
    char config[96];            /* the kernel configuration and where it came from (the autotune) */
} qk_plan_part;

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
    int64_t state_tile;         /* states per tile when not bulk (GPU: a power of two; CPU: rows
                                   of K per block, two blocks of states resident) */
    int64_t tile_m, tile_n;     /* K tile shape */
    int n_streams;
    int64_t slab_rows;          /* host-side delivery (host copy, tile callback, NPY stream): rows
                                   of K per step; the tile callback's tiles are slab_rows square
                                   on the GPU engine, tile_m square on the CPU engine */
    int host_pinned;            /* GPU, HOST output: the caller's buffer is page-locked, so slabs
                                   go D2H straight into it; else through pinned staging */
    size_t bytes_states, bytes_out, bytes_staging, bytes_workspace, bytes_total;
    size_t bytes_budget;        /* vram_fraction * free (GPU); the host budget (CPU) */
    size_t bytes_host_avail;    /* CPU: the host's available memory read at plan time (0: the
                                   budget was given: qk_device_info.host_budget_bytes) */
    int k_resident;             /* GPU, host/callback output: all of K kept on the device (slabs
                                   mirror into later rows; K(X,X) then computes half the pairs) */
    qk_gpu_engine engine;       /* GPU: the Gram engine (qk_gpu_engine; FUSED also for the
                                   analytic path and the CPU engine) */
    int use_blas;               /* deprecated, kept for source compatibility: a copy of (int)engine
                                   that the planner writes for code that reads it; no engine reads
                                   it (set engine to change the engine of a plan) */
    int kernel_cfg;             /* GPU fused kernel tile configuration: 0 the fixed table, 1..8
                                   64x64, 128x64, 64x128, 128x128 tiles, 64x64 with register
                                   stores, 64x64 with k-steps of 16, the persistent few-qubit
                                   kernel (complex fp32, q <= 5), its tensor-core form (fp16
                                   hi/lo splits at fp32 accuracy, complex fp32, 2 <= q <= 6)
                                   (qk_cuda_tune_gram); with a TCF engine: 1 128x128 (warps
                                   64x32), 2 64x64 (32x32), 3 128x128 (32x64). The planner writes
                                   the configuration that runs (the fixed table's, or the
                                   autotune's where the kernel serves the shape: else the one it
                                   falls back to, 8 -> 7 -> 1; plan.config then says "runs cfg");
                                   the cuBLAS engines have none (0) */
    char config[96];            /* kernel configuration used and where it came from */
    double error_bound;         /* qk_precision_error_bound of the precision computed (the CPU
                                   engine: fp64's) */
    double tol;                 /* the tolerance AUTO chose by (0: not AUTO) */
    char precision_note[128];   /* which precision was computed and why (AUTO, CPU engine) */
    char device_name[128];
    int mps_bond;               /* MPS: the largest bond dimension kept (the exact bound from the
                                   circuit, or mps_max_bond where that is lower) */
    int mps_span;               /* MPS: the most sites a two-qubit gate spans in the chosen order */
    double mps_pair_flops;      /* MPS: real flops per overlap <psi(x)|psi(y)> */
    /* Devices (GPU engine): the job is dealt to n_devices GPUs (1: a single-GPU plan, the
       fields above describe it; > 1: they describe the whole job planned for devices[0], and
       parts[] holds the plan of every GPU's parts, which is what runs). Device k computes rows [dev_row0[k],
       dev_row0[k + 1]) of K (qk_schedule_make, balanced by pair count, weighted by SM count):
       for K(X,Y) rows x all columns; for K(X,X) the band's diagonal block (symmetric) and the
       rectangle right of it, whose mirror below the diagonal it writes too. */
    int n_devices;
    int devices[QK_MAX_DEVICES];        /* CUDA ordinals */
    int64_t dev_row0[QK_MAX_DEVICES + 1];
    int64_t dev_pairs[QK_MAX_DEVICES];  /* pairs each computes (<x_i|x_j> evaluations) */
    double dev_imbalance;               /* slowest share over the mean (qk_schedule.imbalance) */
    int dev_full_rows;          /* K(X,X) to HOST or NPY where the host's bytes bind, not the
                                   flops (fewer than QK__MGPU_FULL_ROWS_FLOPS flops per byte of
                                   K: complex maps up to 12 qubits, real up to 14, in fp32):
                                   each GPU computes whole rows K(X[a:b], X) (its band's part
                                   below the diagonal again, ~2x its flops) instead of mirroring
                                   a rectangle on the host (a transposition and short writes) */
    int mps_exact_bond;         /* MPS: the exact bound from the circuit */
    int mps_truncate;           /* MPS: 1 when mps_max_bond or mps_cutoff asks for truncation (K then
                                   within sqrt(eps_i) + sqrt(eps_j) of the exact K, docs/mps.md) */
    int linear;                 /* 1: K is the inner product itself, not its |.|^2 (density
                                   matrices: Tr(rho_i rho_j), qk_gram_states; the CPU engine, and
                                   the GPU's cuBLAS engines, whose epilogue then writes C, not |C|^2) */
    int mps_given;              /* MPS: 1 when the MPS are given (qk_gram_mps_states): mps_bond is
                                   the largest given bond */
    /* Several GPUs (n_devices > 1; else n_parts is 0): the parts of K each GPU computes and the
       plan of each (qk_plan_part), device by device in order, each device's diagonal block before
       its rectangle; the engine runs exactly these (nothing is planned or tuned while it runs). */
    int n_parts;
    qk_plan_part parts[QK_MAX_PARTS];
} qk_plan;

/* Three of the planner's rules that the GPU engine applies while it runs, defined once here (the
   GPU engine reads them, tests/gpu/test_planner.c checks them; the engine decides nothing else):
   qk__plan_mirror   K(X,X) computes the upper triangle and writes the mirror from the same tile
                     when K lives on the device (device output, or K resident); a ring of slabs
                     computes whole rows instead (twice the flops, K never has to fit)
   qk__plan_shrink   out of device memory: the next smaller plan (K residency given up for a host
                     output, then the slab halved down to 64 rows, then state tiles from 8192 rows
                     halved down to 64); 0 when there is none. The engine retries with it from
                     scratch (nothing reaches the caller before a slab completes).
   qk__plan_stream_amp  a map that is only an amplitude encoding (real path), all states at
                     once: the states are x / ||x|| padded, written straight into the state
                     buffer by the streaming encoder (pinned double-buffered H2D overlapped with
                     the normalize kernel); X itself never has to be whole on the device */
static inline int qk__plan_stream_amp(const qk_plan *p, const qk_map *m)
{
    const int64_t most = p->n_x > p->n_y ? p->n_x : p->n_y;
    return p->path == QK_PATH_REAL && m->n_ops == 1 && m->ops[0].kind == QK_OP_AMPLITUDE &&
           (p->bulk_states || p->state_tile <= 0 || p->state_tile >= most);
}
static inline int qk__plan_mirror(const qk_plan *p)
{
    return p->symmetric && (p->output == QK_OUTPUT_DEVICE || p->k_resident);
}
static inline int qk__plan_shrink(qk_plan *p)
{
    const int64_t slab = p->tile_m > 0 ? p->tile_m : 1024;
    int64_t tile = p->bulk_states || p->state_tile <= 0 ? ((int64_t)1 << 14) : p->state_tile;
    if (p->k_resident && p->output != QK_OUTPUT_DEVICE) {
        p->k_resident = 0;
        return 1;
    }
    if (slab > 64) {
        p->tile_m = slab / 2;
        return 1;
    }
    if (tile <= 64) return 0;
    tile /= 2;
    p->bulk_states = 0;
    p->state_tile = tile;
    p->tile_m = slab < tile ? slab : tile;
    return 1;
}

QKDEF qk_result qk_plan_make(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, qk_plan *out);
/* The plan qk_gram_states would run (qk_plan_make's for given states): with a provider and
   plan.state_tile R > 0 (state tiles), K(A,A) of n states asks for A's rows about n + n^2 / 2R
   times, K(A,B) for each of A's rows once and B's rows ceil(n_a / R) times; R == 0: each row once. */
QKDEF qk_result qk_plan_states(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, qk_plan *out);
/* The plan qk_gram_mps_states would run (docs/states.md; the MPS path; mps_bond the largest given bond). */
QKDEF qk_result qk_plan_mps_states(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc, qk_plan *out);
/* The planner with an injected device (tests without a GPU; info->present == 0 plans the CPU). */
QKDEF qk_result qk_plan_for_device(const qk_device_info *info, double vram_fraction,
                                   const qk_map *map, const qk_gram_desc *desc, qk_plan *out);
/* The planner for a list of n devices (infos[k] is CUDA ordinal ordinals[k]; NULL ordinals:
   0 .. n-1), as qk_plan_make plans a context of several GPUs: the whole job planned for infos[0],
   then, when every device gets at least desc->mgpu_min_pairs (default QK_MGPU_MIN_PAIRS) pairs,
   its rows dealt to as many of the devices (fewer when the job is smaller: n_devices = 1 below
   twice that many pairs; desc->mgpu_host_bound_split: whether a host-bound K(X,X) is dealt).
   On several devices every part is planned for its device too (plan.parts: each the plan
   qk_plan_for_device makes for the part's job on infos[k]; qk_plan_make also autotunes them).
   Injected infos test the split without a GPU. */
QKDEF qk_result qk_plan_for_devices(const qk_device_info *infos, const int *ordinals, int n, double vram_fraction,
                                    const qk_map *map, const qk_gram_desc *desc, qk_plan *out);
/* Human-readable plan, snprintf-like. */
QKDEF int qk_plan_describe(const qk_plan *plan, char *buf, size_t size);
/* Largest n such that K(X,X) of n samples keeps all states resident on the device, or, for
   info->present == 0, in the CPU engine's host budget (info->host_budget_bytes, or 85% of the
   available host memory; vram_fraction and precision are ignored: the CPU computes in fp64).
   Beyond it the engines build the states in tiles. */
QKDEF int64_t qk_max_samples(const qk_device_info *info, double vram_fraction, int n_qubits,
                             qk_precision precision);
/* The same for the MPS path on the GPU (any qubit count): the largest n whose MPS of `map` (bond
   capped at max_bond when > 0) take at most half the budget; 0 when the map has no MPS. */
QKDEF int64_t qk_max_samples_mps(const qk_device_info *info, double vram_fraction, const qk_map *map,
                                 qk_precision precision, int max_bond);

/* >>npy ---- arrays, .npy and .csv ---- */
typedef struct qk_array {
    double *data;       /* row-major, converted to double */
    int64_t rows, cols; /* a 1-D array is rows x 1 */
    int ndim;
} qk_array;

/* The readers (qk_npy_read, qk_csv_read) read regular files only: a FIFO, a device or a
   directory is refused before it is read (a FIFO would block, /dev/zero never ends). Nothing is
   allocated beyond what the file holds: a .npy header is checked against the file size first.
   On error *out is left untouched and the message quotes file content escaped and truncated. */
#ifndef QK_CSV_MAX_BYTES
#define QK_CSV_MAX_BYTES ((int64_t)1 << 34)     /* largest .csv file read (16 GiB; it is read whole) */
#endif
#ifndef QK_CSV_MAX_LINE
#define QK_CSV_MAX_LINE ((int64_t)1 << 24)      /* longest .csv line (16 MiB) */
#endif

/* Reads .npy version 1-3, 1-D or 2-D, in C or Fortran order (a Fortran-order array is
   transposed into row-major as it is read, in 16 KiB chunks: no second copy), of any dtype numpy
   writes for a real array: float16/32/64, signed and unsigned integers of 1-8 bytes, bool, either
   byte order; all converted to double. Object, structured, complex and long-double arrays are
   refused. */
QKDEF qk_result qk_npy_read(const char *path, qk_array *out);
/* Writes a 2-D (cols > 0) or 1-D (cols == 0) .npy of float32 or float64 atomically: a temporary
   file in the same directory, then rename. No partial file on any error. */
QKDEF qk_result qk_npy_write(const char *path, const void *data, qk_dtype dtype, int64_t rows,
                             int64_t cols);
/* Reads numeric CSV: comma-separated numbers in C syntax ('.' decimals, in any locale), one row
   per line; '#' comment and blank lines skipped; an optional header line, which is a line with
   no field that starts like a number, names every column (an unnamed first column, pandas'
   index, is refused). Any control byte (NUL included) is an error naming its line, as is a
   field that is not a number (line and column). The full rules: docs/cli.md. */
QKDEF qk_result qk_csv_read(const char *path, qk_array *out);
QKDEF void qk_array_free(qk_array *a);

/* States from a .npy for qk_gram_states (qk-gram --states): (n, dim) statevectors or (n, dim,
   dim) density matrices, kept in their type: complex128, complex64, float64, float32 as they are
   (C order little-endian: read straight into the array), float16 as float32, integers and bool
   as float64; either byte order, C or Fortran order (transposed in 16 KiB chunks). The regular-
   file, header and size checks of qk_npy_read: the shape is checked against the file size before
   anything is allocated. data is QK_MALLOC'ed; qk_states_array_free releases it. */
typedef struct qk_states_array {
    void *data;             /* n * dim (mixed: n * dim * dim) elements of type, row-major */
    qk_state_type type;
    int64_t n, dim;         /* states; amplitudes per state (mixed: the matrices' side) */
    int mixed;              /* 1: a 3-D file, density matrices */
} qk_states_array;
QKDEF qk_result qk_npy_read_states(const char *path, qk_states_array *out);
QKDEF void qk_states_array_free(qk_states_array *a);

/* >>tune ---- the autotune cache ---- */
/* The measured best kernel configuration per (device, driver, qk version, kernel, path,
   precision, qubits), kept in one small JSON file shared by every process of a user
   (docs/autotune.md). The cache never makes its caller fail: a missing file or key is a miss; a
   corrupt, truncated, foreign or future-schema file is ignored with a warning and rewritten by
   the next store; an unreadable file or an unwritable directory means "no cache" with a warning.
   Warnings go to the log callback when one is given (nothing is printed otherwise) and to the
   detail message (qk_last_error). The calls are thread-safe and process-safe: a store holds an
   advisory lock (flock on <path>.lock) around read-merge-write and replaces the file atomically
   (temporary file, fsync, rename), so readers take no lock and never see a torn file.
   POSIX only; elsewhere the calls return QK_ERROR_UNSUPPORTED (no cache). The cache is compiled
   only where something can be tuned: with QK_CUDA (the engine) or QK_TUNE_CACHE; in a CPU-only
   build qk_tune_key_init works and the other calls return QK_ERROR_UNSUPPORTED. */

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

/* >>schedule ---- the work schedule (K dealt to MPI ranks x GPUs) ---- */
/* A static split of K's pairs over n_workers workers, balanced by pair count (optionally
   weighted by each worker's speed). Each worker owns a band of whole rows [row0[w], row0[w+1]):
   for K(X,Y) one item, rows x all columns; for symmetric K(X,X) the band's part of the upper
   triangle as two items, the diagonal block (a symmetric sub-job: only j >= i computed, then
   mirrored) and the rectangle right of it (whose mirror, below the diagonal, the worker writes
   too). Pure arithmetic, no device and no MPI: qk_gram_mpi deals the ranks with it, and a caller
   with several GPUs per rank deals ranks x GPUs workers (worker = rank * gpus + gpu).
   Balance: the cuts are the aligned rows closest to the weighted share of the pairs; each of a
   worker's two cuts is off by at most align / 2 rows, so with equal weights the imbalance
   (slowest worker's pairs over the mean) is at most 1 + align * n_cols * n_workers / pairs_total
   (1 + 2 align n_workers / n_x for K(X,X)): <= 1.03 with the auto alignment whenever it is > 1;
   1.006 for n = 10^6 on 64 workers (tests/mpi/test_mpi_schedule.c checks <= 1.05). */
typedef struct qk_work_item {
    int worker;
    int64_t i0, i1;         /* rows [i0, i1) of K */
    int64_t j0, j1;         /* columns [j0, j1) of K */
    int symmetric;          /* 1: the diagonal block K(X[i0:i1], X[i0:i1]) (j0 == i0, j1 == i1) */
    int64_t pairs;          /* pairs it computes: h (h + 1) / 2 for a symmetric block of h rows,
                               rows x columns otherwise */
} qk_work_item;

typedef struct qk_schedule_desc {
    int64_t n_x;            /* rows of K (required, > 0) */
    int64_t n_y;            /* columns of K(X,Y); 0: symmetric K(X,X) */
    int n_workers;          /* required, > 0 */
    const double *weights;  /* n_workers relative speeds (finite, > 0; e.g. SM counts); NULL: equal */
    int64_t align;          /* cuts at multiples of align rows (n_x is always a cut); default 0 =
                               auto: the largest power of two <= 64 with n_x >= 64 align n_workers */
} qk_schedule_desc;

typedef struct qk_schedule {
    int n_workers;
    int n_items;
    qk_work_item *items;    /* grouped by worker, in worker order (a worker with no rows has none) */
    int *first;             /* n_workers + 1: worker w's items are items[first[w] .. first[w + 1]) */
    int64_t *row0;          /* n_workers + 1 cuts: worker w owns rows [row0[w], row0[w + 1]) */
    int64_t *pairs;         /* n_workers: pairs each worker computes */
    int64_t pairs_total;    /* pairs computed in all (n_x (n_x + 1) / 2 symmetric, n_x n_y else) */
    int64_t align;          /* resolved */
    double imbalance;       /* max over workers of (pairs / normalised weight) / (pairs_total /
                               n_workers): 1 is perfect */
} qk_schedule;

/* Fills *out (its arrays in one allocation: free with qk_schedule_free). */
QKDEF qk_result qk_schedule_make(const qk_schedule_desc *desc, qk_schedule *out);
QKDEF void qk_schedule_free(qk_schedule *s);
/* ---- end work schedule ---- */

